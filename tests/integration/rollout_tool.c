// SPDX-License-Identifier: Apache-2.0
//
// rollout_tool: the gateway's side of RL rollouts in one process, for
// tests/integration/rollout_test.py. It listens as a fabric endpoint (real
// `pcp --worker`s connect to it), serves one model directory with the real
// inference service (its programs compiled by `<pcp> compile` children),
// and runs the rollout library (src/workloads/rl/rollout.h) on commands
// read from stdin, one JSON object per line, answering one JSON line each:
//
//   {"cmd": "models"}   the served versions (name, state, version,
//                       outer_step, workers)
//   {"cmd": "notify", "dir": D}   pcp_infer_service_dir_notify
//   {"cmd": "generate", "prompts": PATH, "indices": [...], "group_size",
//    "temperature", "top_p", "max_tokens", "seed", "max_in_flight",
//    "timeout_ms", "stop_after_ms"}   pcp_workloads_rl_rollouts_generate;
//                       the set is kept for "score". With stop_after_ms,
//                       stop() turns true that long after the call began;
//                       the answer says how long the call took to return
//                       after it and how many requests the service ended
//                       by the return and 1 s later (a callback after the
//                       return would be a request ending late).
//   {"cmd": "score", "reward": {...}, "max_batch": N}   scores the kept
//                       set with a built-in reward or, for {"type":
//                       "verifier"}, the external verifier
//   {"cmd": "quit"}
//
// usage: rollout_tool PCP MODEL_DIR WORK_DIR   (join token: env
// PCP_ROLLOUT_TOOL_JOIN); the first line out is {"port": N}.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
// clang-format on

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "fabric/fabric.h"
#include "services/services.h"
#include "workloads/workloads.h"

typedef struct tool_t {
  pcp_infer_service_t* service;
  pcp_workloads_rl_prompts_t prompts;
  bool has_prompts;
  pcp_workloads_rl_rollout_set_t set;
  pcp_clock_t clock;
} tool_t;

static void answer(json_t* reply) {
  char* text = json_dumps(reply, JSON_COMPACT);
  fprintf(stdout, "%s\n", text ? text : "{\"error\": \"dump\"}");
  fflush(stdout);
  pcp_libc_free(text);
  json_decref(reply);
}

static json_t* status_json(pcp_status_t status) {
  char text[2048];
  text[0] = 0;
  if (status) {
    pcp_status_format(status, text, sizeof(text));
  }
  return json_pack("{s:s, s:s}", "status",
                   pcp_status_code_string(pcp_status_code(status)), "message",
                   text);
}

static json_t* models_json(tool_t* t) {
  pcp_infer_model_info_t infos[4];
  size_t n = pcp_infer_service_model_list(t->service, infos, 4, NULL);
  json_t* out = json_array();
  for (size_t i = 0; i < n; ++i) {
    json_array_append_new(
        out, json_pack("{s:s, s:i, s:i, s:I, s:i, s:i, s:s, s:I}", "name",
                       infos[i].name, "state", (int)infos[i].state, "version",
                       (int)infos[i].version, "outer_step",
                       (json_int_t)infos[i].outer_step, "workers",
                       (int)infos[i].workers, "pending_version",
                       (int)infos[i].pending_version, "error", infos[i].error,
                       "requests", (json_int_t)infos[i].stats.requests));
  }
  return out;
}

static uint64_t requests_ended(tool_t* t) {
  pcp_infer_model_info_t infos[4];
  size_t n = pcp_infer_service_model_list(t->service, infos, 4, NULL);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    total += infos[i].stats.requests;
  }
  return total;
}

typedef struct stopper_t {
  pcp_clock_t clock;
  int64_t start_ns;
  int64_t after_ms;
  int64_t first_true_ns;  // 0: not yet
} stopper_t;

static bool stopper_poll(void* user_data) {
  stopper_t* s = user_data;
  int64_t now = pcp_clock_now_ns(s->clock);
  if (now - s->start_ns < s->after_ms * 1000000) {
    return false;
  }
  if (!s->first_true_ns) {
    s->first_true_ns = now;
  }
  return true;
}

static json_t* ids_json(const int32_t* ids, int64_t count) {
  json_t* out = json_array();
  for (int64_t i = 0; i < count; ++i) {
    json_array_append_new(out, json_integer(ids[i]));
  }
  return out;
}

static json_t* set_json(const pcp_workloads_rl_rollout_set_t* set) {
  json_t* out = json_array();
  for (size_t i = 0; i < set->count; ++i) {
    const pcp_workloads_rl_rollout_t* r = &set->items[i];
    json_t* logp = json_array();
    for (int64_t j = 0; j < r->completion_count; ++j) {
      json_array_append_new(logp, json_real(r->completion_logp[j]));
    }
    // The text as bytes: a completion cut by max_tokens may end inside a
    // character, and JSON strings must be UTF-8.
    json_t* text = json_array();
    for (size_t j = 0; j < r->completion_length; ++j) {
      json_array_append_new(text,
                            json_integer((unsigned char)r->completion_text[j]));
    }
    json_array_append_new(
        out,
        json_pack("{s:i, s:i, s:I, s:o, s:o, s:o, s:o, s:s, s:f}",
                  "prompt_index", (int)r->prompt_index, "sample_index",
                  (int)r->sample_index, "policy_version",
                  (json_int_t)r->policy_version, "prompt_ids",
                  ids_json(r->prompt_ids, r->prompt_count), "completion_ids",
                  ids_json(r->completion_ids, r->completion_count),
                  "completion_logp", logp, "text_bytes", text, "finish_reason",
                  r->finish_reason == PCP_FINISH_REASON_STOP     ? "stop"
                  : r->finish_reason == PCP_FINISH_REASON_LENGTH ? "length"
                                                                 : "none",
                  "reward", (double)r->reward));
  }
  return out;
}

static json_t* generate(tool_t* t, const json_t* cmd) {
  const char* path = json_string_value(json_object_get(cmd, "prompts"));
  if (path) {
    if (t->has_prompts) {
      pcp_workloads_rl_prompts_deinitialize(&t->prompts);
      t->has_prompts = false;
    }
    pcp_status_t status = pcp_workloads_rl_prompts_load(
        path, pcp_allocator_system(), &t->prompts);
    if (status) {
      return status_json(status);
    }
    t->has_prompts = true;
  }
  const json_t* indices = json_object_get(cmd, "indices");
  size_t count = json_array_size(indices);
  uint32_t* idx = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      pcp_allocator_system(), (count + 1) * sizeof(uint32_t), (void**)&idx);
  if (status) {
    return status_json(status);
  }
  for (size_t i = 0; i < count; ++i) {
    idx[i] = (uint32_t)json_integer_value(json_array_get(indices, i));
  }
  stopper_t stopper = {
      .clock = t->clock,
      .start_ns = pcp_clock_now_ns(t->clock),
      .after_ms = json_integer_value(json_object_get(cmd, "stop_after_ms")),
  };
  bool stops = json_object_get(cmd, "stop_after_ms") != NULL;
  pcp_workloads_rl_rollout_request_t rq = {
      .model = json_string_value(json_object_get(cmd, "model")),
      .prompts = t->has_prompts ? &t->prompts : NULL,
      .prompt_indices = idx,
      .prompt_count = count,
      .group_size = json_integer_value(json_object_get(cmd, "group_size")),
      .temperature = json_number_value(json_object_get(cmd, "temperature")),
      .top_p = json_number_value(json_object_get(cmd, "top_p")),
      .max_tokens = json_integer_value(json_object_get(cmd, "max_tokens")),
      .seed = (uint64_t)json_integer_value(json_object_get(cmd, "seed")),
      .max_in_flight =
          (uint32_t)json_integer_value(json_object_get(cmd, "max_in_flight")),
      .stop = stops ? stopper_poll : NULL,
      .stop_user_data = &stopper,
      .timeout_ms = json_integer_value(json_object_get(cmd, "timeout_ms")),
  };
  pcp_workloads_rl_rollout_set_deinitialize(&t->set);
  status = pcp_workloads_rl_rollouts_generate(t->service, &rq,
                                              pcp_allocator_system(), &t->set);
  int64_t returned_ns = pcp_clock_now_ns(t->clock);
  uint64_t at_return = requests_ended(t);
  pcp_allocator_free(pcp_allocator_system(), idx);
  json_t* reply = status_json(status);
  pcp_status_ignore(status);
  json_object_set_new(reply, "seconds", json_real(t->set.seconds));
  json_object_set_new(reply, "completion_tokens",
                      json_integer(t->set.completion_tokens));
  json_object_set_new(reply, "group_size", json_integer(t->set.group_size));
  json_object_set_new(
      reply, "call_seconds",
      json_real((double)(returned_ns - stopper.start_ns) / 1e9));
  json_object_set_new(reply, "rollouts", set_json(&t->set));
  if (stops) {
    json_object_set_new(
        reply, "return_after_stop_ms",
        json_real(stopper.first_true_ns
                      ? (double)(returned_ns - stopper.first_true_ns) / 1e6
                      : -1.0));
    pcp_sleep_ms(1000);
    json_object_set_new(reply, "requests_at_return", json_integer(at_return));
    json_object_set_new(reply, "requests_later",
                        json_integer(requests_ended(t)));
  }
  return reply;
}

static json_t* score(tool_t* t, const json_t* cmd) {
  const json_t* config = json_object_get(cmd, "reward");
  pcp_workloads_rl_verifier_t verifier = {0};
  pcp_workloads_rl_reward_t* reward = NULL;
  pcp_status_t status = pcp_ok_status();
  const char* type = json_string_value(json_object_get(config, "type"));
  if (type && strcmp(type, "verifier") == 0) {
    status = pcp_services_verifier_create(config, "reward",
                                          pcp_allocator_system(), &verifier);
  } else {
    status = pcp_workloads_rl_reward_create(config, "reward",
                                            pcp_allocator_system(), &reward);
    if (!status) {
      verifier = pcp_workloads_rl_reward_verifier(reward);
    }
  }
  if (!status) {
    status = pcp_workloads_rl_rollouts_score(
        &verifier, &t->prompts,
        (size_t)json_integer_value(json_object_get(cmd, "max_batch")), &t->set);
  }
  pcp_workloads_rl_verifier_release(&verifier);
  pcp_workloads_rl_reward_release(reward);
  json_t* reply = status_json(status);
  pcp_status_ignore(status);
  json_t* rewards = json_array();
  for (size_t i = 0; i < t->set.count; ++i) {
    json_array_append_new(rewards, json_real(t->set.items[i].reward));
  }
  json_object_set_new(reply, "rewards", rewards);
  return reply;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: rollout_tool PCP MODEL_DIR WORK_DIR\n");
    return 2;
  }
  char artifacts[4096];
  snprintf(artifacts, sizeof(artifacts), "%s/artifacts", argv[3]);
  mkdir(artifacts, 0755);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_ROLLOUT_TOOL_JOIN";
  fabric_options.heartbeat_interval_ms = 200;
  pcp_fabric_endpoint_t* fabric = NULL;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&fabric_options,
                                          pcp_allocator_system(), &fabric));
  pcp_workloads_compile_queue_options_t queue_options = {
      .pcp_path = argv[1],
      .artifact_dir = artifacts,
      .slot_count = 1,
  };
  pcp_workloads_compile_queue_t* queue = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_create(
      &queue_options, pcp_allocator_system(), &queue));
  const char* dirs[] = {argv[2]};
  pcp_infer_service_options_t options = {
      .fabric = fabric,
      .artifact_dir = artifacts,
      .compile_queue = queue,
      .model_dirs = dirs,
      .model_dir_count = 1,
      .probe_interval_ms = 500,
  };
  tool_t t = {.clock = pcp_clock_system()};
  PCP_CHECK_OK(
      pcp_infer_service_create(&options, pcp_allocator_system(), &t.service));
  json_t* hello = json_pack("{s:i}", "port", pcp_fabric_endpoint_port(fabric));
  answer(hello);

  char line[1 << 16];
  while (fgets(line, sizeof(line), stdin)) {
    json_error_t error;
    json_t* cmd = json_loads(line, 0, &error);
    const char* name = json_string_value(json_object_get(cmd, "cmd"));
    if (!name || strcmp(name, "quit") == 0) {
      json_decref(cmd);
      break;
    }
    if (strcmp(name, "models") == 0) {
      answer(json_pack("{s:o}", "models", models_json(&t)));
    } else if (strcmp(name, "notify") == 0) {
      pcp_infer_service_dir_notify(
          t.service, json_string_value(json_object_get(cmd, "dir")));
      answer(json_pack("{s:s}", "status", "OK"));
    } else if (strcmp(name, "generate") == 0) {
      answer(generate(&t, cmd));
    } else if (strcmp(name, "score") == 0) {
      answer(score(&t, cmd));
    } else {
      answer(json_pack("{s:s}", "status", "unknown command"));
    }
    json_decref(cmd);
  }
  pcp_workloads_rl_rollout_set_deinitialize(&t.set);
  if (t.has_prompts) {
    pcp_workloads_rl_prompts_deinitialize(&t.prompts);
  }
  pcp_infer_service_shutdown(t.service, 2000);
  pcp_infer_service_release(t.service);
  pcp_workloads_compile_queue_destroy(queue);
  pcp_fabric_endpoint_release(fabric);
  return 0;
}
