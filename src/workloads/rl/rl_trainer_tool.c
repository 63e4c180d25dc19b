// SPDX-License-Identifier: Apache-2.0
// Test driver for the GRPO trainer (trainer.h), used by
// tests/workloads/rl_trainer_test.py, which starts real `pcp --worker`
// processes and recomputes everything with JAX:
//
//   rl_trainer_tool DIR
//
// reads DIR/config.json (the spec, the trainer's options, the step's
// scalars, how many workers to wait for) and raw little-endian tensors:
// params.f32, ref_params.f32, m.f32, v.f32 (every parameter in table order,
// concatenated), input_ids.i32, targets.i32, mask.f32, old_logp.f32 (R x T)
// and advantages.f32 (R). It makes a fabric endpoint on 127.0.0.1 (port 0;
// token from $PCP_WORKER_JOIN_TOKEN) and a compile queue (DIR/artifacts),
// prints "port N" and flushes, waits for the workers, then runs create,
// prepare, reference_set, ref_logp and update, and writes ref_logp.f32,
// params_out.f32, m_out.f32, v_out.f32 and result.json (the metrics, or
// the update's status with "stop_after_ms" set: the stop hook turns true
// that long after the update starts, and the update's wall time is
// reported; or with "capture_status"). "updates": 2 runs a second update
// (step + 1, same batch) and writes params_out2.f32, m_out2.f32,
// v_out2.f32; "report_update" prints "update" just before the first;
// "capture_ref_logp_status" writes ref_logp's failure to result.json.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// workloads.h first: rollout.h (through trainer.h) uses the sampling types
// that infer.h expects workloads.h to have declared.
// clang-format off
#include "workloads/workloads.h"
#include "workloads/rl/trainer.h"
// clang-format on

#include <jansson.h>

typedef struct stop_state_t {
  int64_t at_ns;  // 0: never
} stop_state_t;

static bool stop_now(void* user_data) {
  stop_state_t* s = user_data;
  return s->at_ns && pcp_clock_now_ns(pcp_clock_system()) >= s->at_ns;
}

static double number(json_t* config, const char* key, double fallback) {
  json_t* v = json_object_get(config, key);
  return v && json_is_number(v) ? json_number_value(v) : fallback;
}

static const char* text(json_t* config, const char* key, const char* fallback) {
  json_t* v = json_object_get(config, key);
  return v && json_is_string(v) ? json_string_value(v) : fallback;
}

// Reads DIR/NAME, which must hold exactly |bytes| bytes.
static pcp_status_t read_exact(const char* dir, const char* name, size_t bytes,
                               void** out) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  size_t length = 0;
  PCP_RETURN_IF_ERROR(pcp_file_read_all(path, (size_t)1 << 31, out, &length),
                      "%s", path);
  if (length != bytes) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: %zu bytes, expected %zu", path, length, bytes);
  }
  return pcp_ok_status();
}

static pcp_status_t write_file(const char* dir, const char* name,
                               const void* data, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return pcp_file_write_atomic(path, data, bytes);
}

static int fail(pcp_status_t status) {
  char message[4096];
  pcp_status_format(status, message, sizeof(message));
  fprintf(stderr, "rl_trainer_tool: %s\n", message);
  pcp_status_ignore(status);
  return 1;
}

typedef struct tool_t {
  const char* dir;
  json_t* config;
  pcp_fabric_endpoint_t* fabric;
  pcp_workloads_compile_queue_t* queue;
  pcp_workloads_rl_trainer_t* trainer;
  void* files[9];
  stop_state_t stop;
} tool_t;

// Pointers into a concatenated parameter file, table order.
static void tensors_split(const pcp_models_parameter_table_t* table,
                          float* base, float** out) {
  size_t offset = 0;
  for (size_t i = 0; i < table->count; ++i) {
    out[i] = base + offset;
    offset += (size_t)table->parameters[i].element_count;
  }
}

static pcp_status_t run(tool_t* tool) {
  json_t* c = tool->config;
  pcp_models_architecture_t arch;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_architecture_parse(text(c, "arch", "gpt"), &arch));
  pcp_workloads_rl_trainer_options_t options;
  memset(&options, 0, sizeof(options));
  pcp_models_spec_initialize(arch, &options.spec);
  options.spec.layers = (int64_t)number(c, "layers", 2);
  options.spec.heads = (int64_t)number(c, "heads", 4);
  options.spec.kv_heads = (int64_t)number(c, "kv_heads", 0);
  options.spec.width = (int64_t)number(c, "width", 32);
  options.spec.vocab = (int64_t)number(c, "vocab", 64);
  options.spec.block_size = (int64_t)number(c, "block_size", 16);
  options.spec.batch = (int64_t)number(c, "batch", 4);
  options.accumulation_steps = (int64_t)number(c, "accumulate", 1);
  options.worker_class = text(c, "worker_class", "");
  options.max_workers = (uint32_t)number(c, "max_workers", 1);
  options.beta1 = number(c, "beta1", 0.9);
  options.beta2 = number(c, "beta2", 0.999);
  options.eps = number(c, "eps", 1e-8);
  options.weight_decay = number(c, "weight_decay", 0.0);
  options.grad_clip = number(c, "grad_clip", 1.0);
  options.session_prefix = text(c, "session_prefix", "rl-trainer-tool");
  options.task_timeout_ms = (int64_t)number(c, "task_timeout_ms", 0);
  options.stop = stop_now;
  options.stop_user_data = &tool->stop;
  options.log = (pcp_log_context_t){.role = "rl_trainer_tool"};

  // The gateway side: endpoint and compile queue.
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.heartbeat_interval_ms = 500;
  PCP_RETURN_IF_ERROR_BARE(pcp_fabric_endpoint_create(
      &fabric_options, pcp_allocator_system(), &tool->fabric));
  // "artifacts" shares compiled programs between runs (the queue's cache).
  char artifacts[1024];
  snprintf(artifacts, sizeof(artifacts), "%s/artifacts", tool->dir);
  if (text(c, "artifacts", NULL)) {
    snprintf(artifacts, sizeof(artifacts), "%s", text(c, "artifacts", ""));
  }
  pcp_workloads_compile_queue_options_t queue_options = {
      .pcp_path = text(c, "pcp", "pcp"),
      .artifact_dir = artifacts,
      .slot_count = 2,
  };
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_compile_queue_create(
      &queue_options, pcp_allocator_system(), &tool->queue));
  printf("port %u\n", pcp_fabric_endpoint_port(tool->fabric));
  fflush(stdout);
  uint32_t workers = (uint32_t)number(c, "workers", 1);
  int64_t deadline =
      pcp_fabric_endpoint_now_ns(tool->fabric) + (int64_t)120 * 1000 * 1000000;
  PCP_RETURN_IF_ERROR(pcp_fabric_workers_wait(tool->fabric, NULL, NULL, workers,
                                              deadline, NULL, NULL, NULL),
                      "waiting for %u workers", workers);

  options.fabric = tool->fabric;
  options.compile_queue = tool->queue;
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_rl_trainer_create(
      &options, pcp_allocator_system(), &tool->trainer));
  const pcp_models_parameter_table_t* table =
      pcp_workloads_rl_trainer_table(tool->trainer);
  int64_t rows = (int64_t)number(c, "rows", 0);
  int64_t T = options.spec.block_size;
  size_t params_bytes = (size_t)table->total_elements * sizeof(float);
  size_t bt = (size_t)(rows * T) * 4;
  static const char* const kNames[9] = {
      "params.f32", "ref_params.f32", "m.f32",
      "v.f32",      "input_ids.i32",  "targets.i32",
      "mask.f32",   "old_logp.f32",   "advantages.f32"};
  size_t sizes[9] = {params_bytes, params_bytes, params_bytes,
                     params_bytes, bt,           bt,
                     bt,           bt,           (size_t)rows * 4};
  for (int i = 0; i < 9; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        read_exact(tool->dir, kNames[i], sizes[i], &tool->files[i]));
  }
  float* params[256];
  float* ref[256];
  float* m[256];
  float* v[256];
  if (table->count > 256) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "too many tensors");
  }
  tensors_split(table, tool->files[0], params);
  tensors_split(table, tool->files[1], ref);
  tensors_split(table, tool->files[2], m);
  tensors_split(table, tool->files[3], v);

  PCP_RETURN_IF_ERROR(pcp_workloads_rl_trainer_prepare(tool->trainer),
                      "prepare");
  PCP_RETURN_IF_ERROR(pcp_workloads_rl_trainer_reference_set(
                          tool->trainer, (const float* const*)ref),
                      "reference_set");
  float* ref_logp = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(pcp_allocator_system(), bt + 4, (void**)&ref_logp));
  pcp_workloads_rl_batch_t batch = {
      .allocator = pcp_allocator_system(),
      .rows = rows,
      .length = T,
      .input_ids = tool->files[4],
      .targets = tool->files[5],
      .mask = tool->files[6],
      .old_logp = tool->files[7],
      .ref_logp = ref_logp,
      .advantages = tool->files[8],
  };
  pcp_workloads_rl_step_params_t step = {
      .learning_rate = number(c, "lr", 1e-3),
      .step = (int64_t)number(c, "step", 1),
      .clip_low = number(c, "clip_low", 0.2),
      .clip_high = number(c, "clip_high", 0.28),
      .beta = number(c, "beta", 0.04),
      .temperature = number(c, "temperature", 1.0),
  };
  int64_t ref_started = pcp_clock_now_ns(pcp_clock_system());
  pcp_status_t status = pcp_workloads_rl_trainer_ref_logp(
      tool->trainer, step.temperature, &batch);
  if (status && number(c, "capture_ref_logp_status", 0) != 0) {
    // The caller checks how ref_logp failed (a task past its timeout).
    json_t* failed = json_object();
    json_object_set_new(
        failed, "status",
        json_string(pcp_status_code_string(pcp_status_code(status))));
    json_object_set_new(failed, "message",
                        json_string(pcp_status_message(status)));
    json_object_set_new(
        failed, "ref_logp_wall_s",
        json_real((double)(pcp_clock_now_ns(pcp_clock_system()) - ref_started) /
                  1e9));
    pcp_status_ignore(status);
    // The batch's ref_logp as the failed call left it (zeros: untouched).
    status = write_file(tool->dir, "ref_logp_after_failure.f32", ref_logp, bt);
    char path[1024];
    snprintf(path, sizeof(path), "%s/result.json", tool->dir);
    if (!status && json_dump_file(failed, path, 0) != 0) {
      status = pcp_make_status(PCP_STATUS_INTERNAL, "writing %s", path);
    }
    json_decref(failed);
    pcp_allocator_free(pcp_allocator_system(), ref_logp);
    return status;
  }
  if (!status) {
    status = write_file(tool->dir, "ref_logp.f32", ref_logp, bt);
  }
  // A second call reuses the resident reference (one upload per worker).
  if (!status && number(c, "ref_logp_twice", 0) != 0) {
    status = pcp_workloads_rl_trainer_ref_logp(tool->trainer, step.temperature,
                                               &batch);
  }
  pcp_workloads_rl_update_metrics_t metrics;
  memset(&metrics, 0, sizeof(metrics));
  json_t* result = json_object();
  int64_t stop_after_ms = (int64_t)number(c, "stop_after_ms", -1);
  // With a stop or "capture_status" the update's status is the result (the
  // caller checks the code and that nothing was written).
  bool capture = stop_after_ms >= 0 || number(c, "capture_status", 0) != 0;
  if (!status && number(c, "report_update", 0) != 0) {
    printf("update\n");  // the test acts on the workers now
    fflush(stdout);
  }
  if (!status) {
    int64_t started = pcp_clock_now_ns(pcp_clock_system());
    if (stop_after_ms >= 0) {
      tool->stop.at_ns = started + stop_after_ms * 1000000;
    }
    pcp_status_t updated = pcp_workloads_rl_trainer_update(
        tool->trainer, &step, &batch, params, m, v, &metrics);
    double wall =
        (double)(pcp_clock_now_ns(pcp_clock_system()) - started) / 1e9;
    if (capture) {
      json_object_set_new(
          result, "status",
          json_string(pcp_status_code_string(pcp_status_code(updated))));
      json_object_set_new(result, "message",
                          json_string(pcp_status_message(updated)));
      json_object_set_new(result, "update_wall_s", json_real(wall));
      pcp_status_ignore(updated);
    } else {
      status = updated;
    }
  }
  static const char* const kOut[2][3] = {
      {"params_out.f32", "m_out.f32", "v_out.f32"},
      {"params_out2.f32", "m_out2.f32", "v_out2.f32"}};
  int updates = capture ? 1 : (int)number(c, "updates", 1);
  for (int u = 0; u < updates && u < 2 && !status; ++u) {
    if (u == 1) {
      // The next step from the first one's results, on the same batch:
      // the sessions' resident tensors are overwritten, not reused stale.
      ++step.step;
      pcp_workloads_rl_update_metrics_t second;
      status = pcp_workloads_rl_trainer_update(tool->trainer, &step, &batch,
                                               params, m, v, &second);
      if (!status) {
        json_object_set_new(result, "second_loss", json_real(second.loss));
        json_object_set_new(result, "second_grad_norm",
                            json_real(second.grad_norm));
      }
    }
    for (int k = 0; k < 3 && !status; ++k) {
      status = write_file(tool->dir, kOut[u][k], tool->files[k ? k + 1 : 0],
                          params_bytes);
    }
  }
  if (!status) {
    json_object_set_new(result, "loss", json_real(metrics.loss));
    json_object_set_new(result, "mean_kl", json_real(metrics.mean_kl));
    json_object_set_new(result, "clip_low_fraction",
                        json_real(metrics.clip_low_fraction));
    json_object_set_new(result, "clip_high_fraction",
                        json_real(metrics.clip_high_fraction));
    json_object_set_new(result, "mean_ratio", json_real(metrics.mean_ratio));
    json_object_set_new(result, "grad_norm", json_real(metrics.grad_norm));
    json_object_set_new(result, "completion_tokens",
                        json_integer(metrics.completion_tokens));
    json_object_set_new(result, "workers", json_integer(metrics.workers));
    json_object_set_new(result, "seconds", json_real(metrics.seconds));
    char path[1024];
    snprintf(path, sizeof(path), "%s/result.json", tool->dir);
    if (json_dump_file(result, path, JSON_INDENT(1)) != 0) {
      status = pcp_make_status(PCP_STATUS_INTERNAL, "writing %s", path);
    }
  }
  json_decref(result);
  pcp_allocator_free(pcp_allocator_system(), ref_logp);
  return status;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: rl_trainer_tool DIR\n");
    return 2;
  }
  tool_t tool;
  memset(&tool, 0, sizeof(tool));
  tool.dir = argv[1];
  char path[1024];
  snprintf(path, sizeof(path), "%s/config.json", tool.dir);
  json_error_t error;
  tool.config = json_load_file(path, 0, &error);
  if (!tool.config) {
    fprintf(stderr, "rl_trainer_tool: %s: %s\n", path, error.text);
    return 1;
  }
  pcp_status_t status = run(&tool);
  pcp_workloads_rl_trainer_release(tool.trainer);
  pcp_workloads_compile_queue_destroy(tool.queue);
  pcp_fabric_endpoint_release(tool.fabric);
  for (int i = 0; i < 9; ++i) {
    pcp_libc_free(tool.files[i]);  // pcp_file_read_all's buffers
  }
  json_decref(tool.config);
  return status ? fail(status) : 0;
}
