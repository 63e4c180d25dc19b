// SPDX-License-Identifier: Apache-2.0
//
// The RL job's parts that need no worker (job_state.c): a checkpoint's
// round trip (params, m, v and state.json, the newest complete one found, a
// half-written one ignored, old ones pruned), state.json refusals, the
// progress JSON's keys, the history ring, stale-group accounting, batch
// rows, the block-size check, the served policy directory (model.json and
// its weights file, old files pruned) and the experiment's
// served_model_name key.

// realpath(3), mkdtemp(3) need XSI.
#define _XOPEN_SOURCE 700

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"
// After workloads.h.
#include "workloads/rl/job_impl.h"

static char g_dir[PATH_MAX];

static int setup(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-rl-job-test-XXXXXX";
  if (!mkdtemp(dir) || !realpath(dir, g_dir) || chdir(g_dir)) {
    return -1;
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  char command[PATH_MAX + 16];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_dir);
  return system(command) == 0 ? 0 : -1;
}

static void* alloc(size_t bytes) {
  void* out = NULL;
  assert_true(!pcp_allocator_calloc(pcp_allocator_system(), bytes, &out));
  return out;
}

static void release(void* p) {
  pcp_allocator_free(pcp_allocator_system(), p);
}

// A tiny GPT's table (f32) and three sets of buffers with distinct values.
typedef struct fixture_t {
  pcp_models_spec_t spec;
  pcp_models_parameter_table_t table;
  float* blocks[3];
  float** sets[3];
} fixture_t;

static void fixture_initialize(fixture_t* f) {
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, &f->spec);
  f->spec.layers = 1;
  f->spec.heads = 2;
  f->spec.width = 8;
  f->spec.vocab = 11;
  f->spec.block_size = 16;
  f->spec.batch = 2;
  assert_true(!pcp_models_parameter_table_initialize(
      &f->spec, pcp_allocator_system(), &f->table));
  for (int s = 0; s < 3; ++s) {
    f->blocks[s] = alloc((size_t)f->table.total_elements * sizeof(float));
    f->sets[s] = alloc(f->table.count * sizeof(float*));
    size_t offset = 0;
    for (size_t i = 0; i < f->table.count; ++i) {
      f->sets[s][i] = f->blocks[s] + offset;
      offset += (size_t)f->table.parameters[i].element_count;
    }
    for (int64_t e = 0; e < f->table.total_elements; ++e) {
      f->blocks[s][e] = (float)(s + 1) * 0.001f * (float)(e % 977) - 0.25f;
    }
  }
}

static void fixture_deinitialize(fixture_t* f) {
  for (int s = 0; s < 3; ++s) {
    release(f->blocks[s]);
    release(f->sets[s]);
  }
  pcp_models_parameter_table_deinitialize(&f->table);
}

static pcp_workloads_rl_state_t* state_new(void) {
  pcp_workloads_rl_state_t* s = alloc(sizeof(*s));
  pcp_workloads_rl_state_initialize(7, s);
  return s;
}

static void state_fill(pcp_workloads_rl_state_t* s, int64_t iteration) {
  s->iteration = iteration;
  s->step = iteration;
  s->version = iteration;
  s->rollout_tokens = 1000 * iteration;
  s->stale_dropped = 3;
  s->degenerate_groups = 2;
  s->truncated_tokens = 5;
  s->eval_reward_mean = 0.375;
  s->last.reward_mean = 0.5;
  s->last.reward_std = 0.25;
  s->last.kl = 0.0125;
  s->last.clip_fraction = 0.0625;
  s->last.loss = -0.03125;
  s->last.weight_refresh_bytes = 4096;
  for (int64_t i = 1; i <= iteration; ++i) {
    pcp_workloads_rl_point_t p = {.iteration = i,
                                  .reward_mean = 0.1 * (double)i,
                                  .reward_std = 0.2,
                                  .kl = 0.001 * (double)i,
                                  .clip_fraction = 0,
                                  .eval_reward_mean = i == 2 ? 0.75 : NAN};
    pcp_workloads_rl_state_history_append(s, &p);
  }
}

static void assert_state_equal(const pcp_workloads_rl_state_t* a,
                               const pcp_workloads_rl_state_t* b) {
  assert_int_equal(a->iteration, b->iteration);
  assert_int_equal(a->step, b->step);
  assert_int_equal(a->version, b->version);
  assert_int_equal(a->seed, b->seed);
  assert_int_equal(a->rollout_tokens, b->rollout_tokens);
  assert_int_equal(a->stale_dropped, b->stale_dropped);
  assert_int_equal(a->degenerate_groups, b->degenerate_groups);
  assert_int_equal(a->truncated_tokens, b->truncated_tokens);
  assert_int_equal(a->skipped_updates, b->skipped_updates);
  assert_true(a->eval_reward_mean == b->eval_reward_mean);
  assert_true(a->last.reward_mean == b->last.reward_mean);
  assert_true(a->last.kl == b->last.kl);
  assert_true(isnan(b->last.grad_norm) && isnan(a->last.grad_norm));
  assert_int_equal(a->last.weight_refresh_bytes, b->last.weight_refresh_bytes);
  assert_int_equal(a->history_count, b->history_count);
  for (size_t i = 0; i < a->history_count; ++i) {
    assert_int_equal(a->history[i].iteration, b->history[i].iteration);
    assert_true(a->history[i].reward_mean == b->history[i].reward_mean);
    assert_true(a->history[i].kl == b->history[i].kl);
    assert_true(isnan(a->history[i].eval_reward_mean) ==
                isnan(b->history[i].eval_reward_mean));
  }
}

static void test_state_json_round_trip(void** unused) {
  (void)unused;
  pcp_workloads_rl_state_t* a = state_new();
  pcp_workloads_rl_state_t* b = state_new();
  state_fill(a, 3);
  json_t* json = pcp_workloads_rl_state_json(a);
  assert_non_null(json);
  assert_true(!pcp_workloads_rl_state_from_json(json, b));
  assert_state_equal(a, b);
  assert_true(b->history[1].eval_reward_mean == 0.75);
  // A key of a wrong type is refused naming it.
  json_object_set_new(json, "step", json_string("3"));
  pcp_status_t status = pcp_workloads_rl_state_from_json(json, b);
  char message[256];
  pcp_status_format(status, message, sizeof(message));
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(message, "'step'"));
  json_decref(json);
  release(a);
  release(b);
}

static void test_history_ring(void** unused) {
  (void)unused;
  pcp_workloads_rl_state_t* s = state_new();
  for (int64_t i = 1; i <= PCP_WORKLOADS_RL_HISTORY_MAX_POINTS + 5; ++i) {
    pcp_workloads_rl_point_t p = {.iteration = i, .eval_reward_mean = NAN};
    pcp_workloads_rl_state_history_append(s, &p);
  }
  assert_int_equal(s->history_count, PCP_WORKLOADS_RL_HISTORY_MAX_POINTS);
  assert_int_equal(s->history[0].iteration, 6);
  assert_int_equal(
      s->history[PCP_WORKLOADS_RL_HISTORY_MAX_POINTS - 1].iteration,
      PCP_WORKLOADS_RL_HISTORY_MAX_POINTS + 5);
  // The same iteration again replaces the newest point (an evaluation).
  pcp_workloads_rl_point_t p = {
      .iteration = PCP_WORKLOADS_RL_HISTORY_MAX_POINTS + 5,
      .eval_reward_mean = 0.5};
  pcp_workloads_rl_state_history_append(s, &p);
  assert_int_equal(s->history_count, PCP_WORKLOADS_RL_HISTORY_MAX_POINTS);
  assert_true(
      s->history[PCP_WORKLOADS_RL_HISTORY_MAX_POINTS - 1].eval_reward_mean ==
      0.5);
  release(s);
}

// Every key the brief publishes (pcp submit rl, the dashboard and bench/rl
// read them), nulls before anything was measured.
static void test_progress_json(void** unused) {
  (void)unused;
  static const char* const kKeys[] = {"iteration",
                                      "num_iterations",
                                      "policy_version",
                                      "served_model",
                                      "reward_mean",
                                      "reward_std",
                                      "kl",
                                      "clip_fraction",
                                      "mean_ratio",
                                      "loss",
                                      "grad_norm",
                                      "tokens_per_second",
                                      "rollout_tokens",
                                      "stale_dropped",
                                      "degenerate_groups",
                                      "truncated_tokens",
                                      "weight_refresh_seconds",
                                      "weight_refresh_bytes",
                                      "eval_reward_mean",
                                      "checkpoint_iteration",
                                      "history"};
  pcp_workloads_rl_state_t* s = state_new();
  json_t* fresh = pcp_workloads_rl_progress_json(s, 20, "rl-abc");
  for (size_t i = 0; i < PCP_ARRAYSIZE(kKeys); ++i) {
    assert_non_null(json_object_get(fresh, kKeys[i]));
  }
  assert_true(json_is_null(json_object_get(fresh, "reward_mean")));
  assert_true(json_is_null(json_object_get(fresh, "eval_reward_mean")));
  assert_true(json_is_null(json_object_get(fresh, "checkpoint_iteration")));
  assert_int_equal(json_integer_value(json_object_get(fresh, "num_iterations")),
                   20);
  assert_string_equal(json_string_value(json_object_get(fresh, "served_model")),
                      "rl-abc");
  json_decref(fresh);
  state_fill(s, 2);
  s->checkpoint_iteration = 2;
  json_t* p = pcp_workloads_rl_progress_json(s, 20, "rl-abc");
  assert_true(json_real_value(json_object_get(p, "reward_mean")) == 0.5);
  assert_int_equal(json_integer_value(json_object_get(p, "policy_version")), 2);
  assert_int_equal(
      json_integer_value(json_object_get(p, "checkpoint_iteration")), 2);
  json_t* history = json_object_get(p, "history");
  assert_int_equal(json_array_size(history), 2);
  json_t* first = json_array_get(history, 0);
  assert_null(json_object_get(first, "eval_reward_mean"));
  assert_true(json_real_value(json_object_get(json_array_get(history, 1),
                                              "eval_reward_mean")) == 0.75);
  json_decref(p);
  release(s);
}

static void test_stale_groups(void** unused) {
  (void)unused;
  // 4 groups of 3 at version 5, max_off_policy_steps 1: versions 4 and 5
  // train; a group with one 3 goes whole; a 6 (exported before a restart
  // rolled back to 5) goes too.
  int64_t versions[12] = {5, 5, 5, 4, 5, 4, 5, 3, 5, 6, 5, 5};
  pcp_workloads_rl_rollout_t rollouts[12];
  memset(rollouts, 0, sizeof(rollouts));
  for (int i = 0; i < 12; ++i) {
    rollouts[i].policy_version = versions[i];
  }
  bool keep[4];
  assert_int_equal(
      pcp_workloads_rl_stale_groups_mark(rollouts, 12, 3, 5, 1, keep), 6);
  assert_true(keep[0] && keep[1] && !keep[2] && !keep[3]);
  // Fully on-policy: only version 5.
  assert_int_equal(
      pcp_workloads_rl_stale_groups_mark(rollouts, 12, 3, 5, 0, keep), 9);
  assert_true(keep[0] && !keep[1] && !keep[2] && !keep[3]);
  // Far off-policy allowed: only the future version is dropped.
  assert_int_equal(
      pcp_workloads_rl_stale_groups_mark(rollouts, 12, 3, 5, 1000, keep), 3);
  assert_true(keep[0] && keep[1] && keep[2] && !keep[3]);
}

static void test_batch_rows_and_lengths(void** unused) {
  (void)unused;
  assert_int_equal(pcp_workloads_rl_batch_rows(32, 8, 2, 2), 32);
  assert_int_equal(pcp_workloads_rl_batch_rows(30, 8, 2, 2), 32);
  assert_int_equal(pcp_workloads_rl_batch_rows(33, 8, 2, 2), 64);
  assert_int_equal(pcp_workloads_rl_batch_rows(0, 4, 1, 1), 4);
  assert_int_equal(pcp_workloads_rl_batch_rows(5, 0, 0, 0), 5);
  assert_true(!pcp_workloads_rl_length_check("p", 40, 3, 24, 64));
  pcp_status_t status = pcp_workloads_rl_length_check("prompts", 41, 3, 24, 64);
  char message[512];
  pcp_status_format(status, message, sizeof(message));
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_FAILED_PRECONDITION);
  assert_non_null(strstr(message, "prompts[3] is 41 tokens"));
  assert_non_null(strstr(message, "block_size 64"));
  char name[80];
  pcp_workloads_rl_served_name_default("rl-0123456789abcdef", name,
                                       sizeof(name));
  assert_string_equal(name, "rl-01234567");
  pcp_workloads_rl_served_name_default("job7", name, sizeof(name));
  assert_string_equal(name, "rl-job7");
}

static void assert_buffers_equal(const fixture_t* f, float* const* a,
                                 float* const* b) {
  for (size_t i = 0; i < f->table.count; ++i) {
    assert_memory_equal(
        a[i], b[i],
        (size_t)f->table.parameters[i].element_count * sizeof(float));
  }
}

static void test_checkpoint_round_trip(void** unused) {
  (void)unused;
  fixture_t f;
  fixture_initialize(&f);
  fixture_t g;
  fixture_initialize(&g);
  const char* root = "rl/job-1";
  int64_t newest = -1;
  assert_false(pcp_workloads_rl_checkpoint_newest(root, &newest));
  pcp_workloads_rl_state_t* s = state_new();
  for (int64_t it = 1; it <= 4; ++it) {
    state_fill(s, it);
    f.blocks[0][0] = (float)it;  // params differ per checkpoint
    assert_true(!pcp_workloads_rl_checkpoint_write(
        root, &f.table, (const float* const*)f.sets[0],
        (const float* const*)f.sets[1], (const float* const*)f.sets[2], s));
  }
  // A half-written later one (crash before the rename) is not complete.
  assert_int_equal(mkdir("rl/job-1/checkpoint-9.tmp", 0755), 0);
  assert_true(pcp_workloads_rl_checkpoint_newest(root, &newest));
  assert_int_equal(newest, 4);
  // Only the newest two are kept.
  struct stat st;
  assert_int_equal(stat("rl/job-1/checkpoint-3/state.json", &st), 0);
  assert_int_not_equal(stat("rl/job-1/checkpoint-2", &st), 0);
  assert_int_not_equal(stat("rl/job-1/checkpoint-1", &st), 0);
  pcp_workloads_rl_state_t* r = state_new();
  assert_true(!pcp_workloads_rl_checkpoint_read(root, 4, &g.table, g.sets[0],
                                                g.sets[1], g.sets[2], r));
  assert_buffers_equal(&f, f.sets[0], g.sets[0]);
  assert_buffers_equal(&f, f.sets[1], g.sets[1]);
  assert_buffers_equal(&f, f.sets[2], g.sets[2]);
  assert_true(g.blocks[0][0] == 4.0f);
  assert_state_equal(s, r);
  // The written state records itself as the checkpoint.
  assert_int_equal(r->checkpoint_iteration, 4);
  // A state.json of another iteration is refused.
  assert_int_equal(rename("rl/job-1/checkpoint-3", "rl/job-1/checkpoint-5"), 0);
  pcp_status_t status = pcp_workloads_rl_checkpoint_read(
      root, 5, &g.table, g.sets[0], g.sets[1], g.sets[2], r);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_DATA_LOSS);
  release(s);
  release(r);
  fixture_deinitialize(&f);
  fixture_deinitialize(&g);
}

static void test_policy_export(void** unused) {
  (void)unused;
  fixture_t f;
  fixture_initialize(&f);
  json_t* base = json_pack(
      "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:{s:s, s:s}, s:f, "
      "s:s, s:i}",
      "name", "base", "architecture", "gpt", "layers", 1, "heads", 2, "width",
      8, "vocab", 11, "block_size", 16, "dtype", "bf16", "weights",
      "model.safetensors", "tokenizer", "kind", "char", "vocab", "abcdefghijk",
      "loss", 1.5, "job_id", "train-1", "outer_step", 40);
  pcp_workloads_rl_export_t e = {.dir = "models/rl-x",
                                 .name = "rl-x",
                                 .job_id = "rl-job",
                                 .base_model_json = base,
                                 .max_length = 16,
                                 .worker_class = "rollout"};
  int64_t bytes = 0;
  for (int64_t v = 0; v <= 4; ++v) {
    e.version = v;
    assert_true(!pcp_workloads_rl_policy_export(
        &e, &f.table, (const float* const*)f.sets[0], &bytes));
  }
  assert_true(bytes > 0);
  json_error_t error;
  json_t* model = json_load_file("models/rl-x/model.json", 0, &error);
  assert_non_null(model);
  assert_string_equal(json_string_value(json_object_get(model, "name")),
                      "rl-x");
  assert_string_equal(json_string_value(json_object_get(model, "job_id")),
                      "rl-job");
  assert_int_equal(json_integer_value(json_object_get(model, "outer_step")), 4);
  assert_string_equal(json_string_value(json_object_get(model, "weights")),
                      "model-4.safetensors");
  assert_string_equal(json_string_value(json_object_get(model, "dtype")),
                      "f32");
  assert_int_equal(json_integer_value(json_object_get(model, "max_length")),
                   16);
  assert_int_equal(json_integer_value(json_object_get(model, "weights_bytes")),
                   bytes);
  assert_int_equal(
      strlen(json_string_value(json_object_get(model, "weights_sha256"))), 64);
  assert_string_equal(json_string_value(json_object_get(model, "worker_class")),
                      "rollout");
  assert_null(json_object_get(model, "loss"));
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(model, "tokenizer"), "vocab")),
                      "abcdefghijk");
  json_decref(model);
  // The newest 3 weight files stay; the file the json names loads back.
  struct stat st;
  assert_int_equal(stat("models/rl-x/model-4.safetensors", &st), 0);
  assert_int_equal((int64_t)st.st_size, bytes);
  assert_int_equal(stat("models/rl-x/model-2.safetensors", &st), 0);
  assert_int_not_equal(stat("models/rl-x/model-1.safetensors", &st), 0);
  fixture_t g;
  fixture_initialize(&g);
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  assert_true(!pcp_safetensors_checkpoint_open(
      "models/rl-x/model-4.safetensors", pcp_allocator_system(), &checkpoint));
  assert_true(!pcp_models_safetensors_load(&g.table, checkpoint, false,
                                           (void* const*)g.sets[1]));
  pcp_safetensors_checkpoint_release(checkpoint);
  assert_buffers_equal(&f, f.sets[0], g.sets[1]);
  // A re-export of an older version (a resume) removes newer files.
  e.version = 2;
  assert_true(!pcp_workloads_rl_policy_export(
      &e, &f.table, (const float* const*)f.sets[0], NULL));
  assert_int_not_equal(stat("models/rl-x/model-4.safetensors", &st), 0);
  assert_int_equal(stat("models/rl-x/model-2.safetensors", &st), 0);
  json_decref(base);
  fixture_deinitialize(&f);
  fixture_deinitialize(&g);
}

// A weights file whose save a SIGKILL cut short stays as
// model-<v>.safetensors.tmp.<pid> (pcp_safetensors_write's temp name), a
// whole weights file's size that no model.json names: the next export
// removes it.
static void test_policy_export_temp_leftover(void** unused) {
  (void)unused;
  fixture_t f;
  fixture_initialize(&f);
  json_t* base = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i}", "name",
                           "base", "architecture", "gpt", "layers", 1, "heads",
                           2, "width", 8, "vocab", 11, "block_size", 16);
  assert_true(!pcp_file_make_directories("models/rl-t"));
  const char* leftovers[] = {"models/rl-t/model-3.safetensors.tmp.4242",
                             "models/rl-t/model-9.safetensors.tmp.7"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(leftovers); ++i) {
    assert_true(!pcp_file_write_atomic(leftovers[i], "partial", 7));
  }
  // Not this job's temp files' pattern: kept.
  assert_true(!pcp_file_write_atomic("models/rl-t/notes.tmp.1", "x", 1));
  pcp_workloads_rl_export_t e = {.dir = "models/rl-t",
                                 .name = "rl-t",
                                 .job_id = "rl-job",
                                 .base_model_json = base,
                                 .max_length = 16,
                                 .version = 3};
  assert_true(!pcp_workloads_rl_policy_export(
      &e, &f.table, (const float* const*)f.sets[0], NULL));
  struct stat st;
  for (size_t i = 0; i < PCP_ARRAYSIZE(leftovers); ++i) {
    assert_int_not_equal(stat(leftovers[i], &st), 0);
  }
  assert_int_equal(stat("models/rl-t/notes.tmp.1", &st), 0);
  assert_int_equal(stat("models/rl-t/model-3.safetensors", &st), 0);
  json_decref(base);
  fixture_deinitialize(&f);
}

// served_model_name (experiment.c): absent NULL, kept, refused naming it.
static void test_served_model_name_key(void** unused) {
  (void)unused;
  assert_int_equal(mkdir("data", 0755), 0);
  assert_true(
      !pcp_file_write_atomic("data/p.jsonl", "{\"prompt\":\"a\"}\n", 15));
  pcp_workloads_train_policy_config_t config = {.state_dir = g_dir};
  pcp_workloads_train_policy_t policy;
  assert_true(!pcp_workloads_train_policy_initialize(
      &config, "/nonexistent", (int64_t)1 << 34, &policy));
  const char* base =
      "{\"prompts_path\": \"data/p.jsonl\", \"reward\": {\"type\": "
      "\"contains\", \"text\": \"a\"}, \"base_model\": {\"train_job\": \"t\", "
      "\"spec\": {\"kind\": \"gpt\"}}";
  char text[512];
  pcp_workloads_rl_experiment_t e;
  snprintf(text, sizeof(text), "%s}", base);
  assert_true(!pcp_workloads_rl_experiment_parse(&policy, text, strlen(text),
                                                 pcp_allocator_system(), &e));
  assert_null(e.served_model_name);
  pcp_workloads_rl_experiment_deinitialize(&e);
  snprintf(text, sizeof(text), "%s, \"served_model_name\": \"My.model-2_b\"}",
           base);
  assert_true(!pcp_workloads_rl_experiment_parse(&policy, text, strlen(text),
                                                 pcp_allocator_system(), &e));
  assert_string_equal(e.served_model_name, "My.model-2_b");
  pcp_workloads_rl_experiment_deinitialize(&e);
  const char* bad[] = {
      "\"a/b\"",
      "\"\"",
      "\"..\"",
      "7",
      "\"a b\"",
      "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "aaaaaaaaa\""};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    snprintf(text, sizeof(text), "%s, \"served_model_name\": %s}", base,
             bad[i]);
    pcp_status_t status = pcp_workloads_rl_experiment_parse(
        &policy, text, strlen(text), pcp_allocator_system(), &e);
    char message[256];
    pcp_status_format(status, message, sizeof(message));
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(message, "served_model_name:"));
  }
  pcp_workloads_train_policy_deinitialize(&policy);
}

// served_model_name may not replace a model that is not the job's: a
// training job's export (or a training job's future one: a store job of
// that id), the base model's own directory (the job would replace the
// weights a resumed run loads as its base and reference), or the policy of
// an RL job that has not ended. A finished RL job's name may be reused.
static void served_dir_write(const char* name, const char* job_id) {
  char dir[PATH_MAX + 64], path[PATH_MAX + 96], text[512];
  snprintf(dir, sizeof(dir), "%s/models/%s", g_dir, name);
  assert_true(!pcp_file_make_directories(dir));
  snprintf(path, sizeof(path), "%s/model.json", dir);
  int n = snprintf(text, sizeof(text),
                   "{\"architecture\": \"gpt\", \"layers\": 1, \"heads\": 1, "
                   "\"width\": 8, \"vocab\": 16, \"block_size\": 8, "
                   "\"name\": \"%s\"%s%s%s}",
                   name, job_id ? ", \"job_id\": \"" : "", job_id ? job_id : "",
                   job_id ? "\"" : "");
  assert_true(!pcp_file_write_atomic(path, text, (size_t)n));
}

static pcp_status_code_t spec_build_named(pcp_workloads_rl_t* rl,
                                          const char* name, char* message,
                                          size_t capacity) {
  char text[PATH_MAX + 512];
  snprintf(text, sizeof(text),
           "{\"prompts_path\": \"data/p2.jsonl\", \"reward\": {\"type\": "
           "\"contains\", \"text\": \"a\"}, \"base_model\": "
           "{\"served_model_dir\": \"%s/models/base-m\"}, "
           "\"served_model_name\": \"%s\"}",
           g_dir, name);
  json_t* spec = NULL;
  pcp_status_t status =
      pcp_workloads_rl_spec_build(rl, text, strlen(text), &spec);
  json_decref(spec);
  pcp_status_format(status, message, capacity);
  return pcp_status_consume_code(status);
}

static void test_served_model_name_collisions(void** unused) {
  (void)unused;
  assert_true(!pcp_file_make_directories("data"));
  assert_true(
      !pcp_file_write_atomic("data/p2.jsonl", "{\"prompt\":\"a\"}\n", 15));
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = g_dir;
  pcp_store_t* store = NULL;
  assert_true(
      !pcp_store_create(&store_options, pcp_allocator_system(), &store));
  pcp_workloads_train_policy_config_t config = {.state_dir = g_dir};
  pcp_workloads_train_policy_t policy;
  assert_true(!pcp_workloads_train_policy_initialize(
      &config, "/nonexistent", (int64_t)1 << 34, &policy));
  pcp_workloads_rl_t rl = {
      .options = {.store = store, .state_dir = g_dir, .policy = &policy}};
  json_t* spec = json_object();
  served_dir_write("base-m", NULL);
  served_dir_write("trained", "trained");
  assert_true(!pcp_store_job_create(store, "trained", "training", spec, NULL));
  assert_true(!pcp_store_job_create(store, "later", "training", spec, NULL));
  served_dir_write("rl-aaaaaaaa", "rl-aaaaaaaa00000000");
  assert_true(
      !pcp_store_job_create(store, "rl-aaaaaaaa00000000", "rl", spec, NULL));
  served_dir_write("by-hand", NULL);
  char message[512];
  assert_int_equal(spec_build_named(&rl, "fresh", message, sizeof(message)),
                   PCP_STATUS_OK);
  const char* refused[] = {"trained", "later", "base-m", "rl-aaaaaaaa",
                           "by-hand"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(refused); ++i) {
    assert_int_equal(
        spec_build_named(&rl, refused[i], message, sizeof(message)),
        PCP_STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(message, "served_model_name"));
    assert_non_null(strstr(message, refused[i]));
  }
  // The RL job ended: its name may be taken over.
  assert_true(!pcp_store_job_transition(
      store, "rl-aaaaaaaa00000000", PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL));
  assert_int_equal(
      spec_build_named(&rl, "rl-aaaaaaaa", message, sizeof(message)),
      PCP_STATUS_OK);
  json_decref(spec);
  pcp_workloads_train_policy_deinitialize(&policy);
  pcp_store_release(store);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_json_round_trip),
      cmocka_unit_test(test_history_ring),
      cmocka_unit_test(test_progress_json),
      cmocka_unit_test(test_stale_groups),
      cmocka_unit_test(test_batch_rows_and_lengths),
      cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_policy_export),
      cmocka_unit_test(test_policy_export_temp_leftover),
      cmocka_unit_test(test_served_model_name_key),
      cmocka_unit_test(test_served_model_name_collisions),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
