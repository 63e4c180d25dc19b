// SPDX-License-Identifier: Apache-2.0
// Control flow of the training service (service.c) with a real store and a
// real fabric endpoint that no worker joins: the model spec mapping, the
// metric families, set-up errors naming the key, the stop hook while no
// worker is there, and the phase/progress hooks. Rounds with real workers:
// tests/integration/training_e2e_test.py.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "workloads/train/service_impl.h"
#include "workloads/workloads.h"

#ifndef PCP_TEST_DATA
#define PCP_TEST_DATA "data/tiny_shakespeare.txt"
#endif

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* file, int line) {
  pcp_status_code_t actual = pcp_status_code(status);
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (actual != code || (needle && !strstr(text, needle))) {
    print_error("%s:%d: want %s naming '%s', got %s\n", file, line,
                pcp_status_code_string(code), needle ? needle : "", text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code, needle) \
  expect_code_at((expr), (code), (needle), __FILE__, __LINE__)

static void spec_resolve(void** state) {
  (void)state;
  pcp_diloco_config_t config;
  const char* text =
      "{\"model\": {\"kind\": \"gpt\", \"layers\": 2, \"heads\": 4, "
      "\"width\": 64, \"vocab\": 65, \"block_size\": 16, \"batch\": 2}, "
      "\"data_path\": \"x\"}";
  EXPECT_CODE(pcp_diloco_config_parse_json(text, strlen(text), &config, NULL),
              PCP_STATUS_OK, NULL);
  pcp_models_spec_t spec;
  EXPECT_CODE(pcp_diloco_model_spec_resolve(&config, &spec), PCP_STATUS_OK,
              NULL);
  assert_int_equal(spec.architecture, PCP_MODELS_ARCHITECTURE_GPT);
  assert_int_equal(spec.kv_heads, 0);  // GPT: kv = heads
  assert_int_equal(spec.width, 64);
  assert_int_equal(spec.batch, 2);
  config.model.width = 66;  // not a multiple of heads: the models rule
  EXPECT_CODE(pcp_diloco_model_spec_resolve(&config, &spec),
              PCP_STATUS_INVALID_ARGUMENT, "key 'model'");
  config.model.present = false;
  EXPECT_CODE(pcp_diloco_model_spec_resolve(&config, &spec),
              PCP_STATUS_FAILED_PRECONDITION, "model_path");
  pcp_diloco_config_deinitialize(&config);
}

// Writes |text| as <tmp>/<name> and loads it as model_path with |extra|
// experiment keys.
static pcp_status_t module_try(const char* name, const char* text,
                               const char* extra,
                               pcp_diloco_module_t* out_module) {
  char path[256];
  snprintf(path, sizeof(path), "/tmp/pcp-service-test-%d-%s", (int)getpid(),
           name);
  if (text) {
    assert_true(
        pcp_status_is_ok(pcp_file_write_atomic(path, text, strlen(text))));
  }
  char json[1024];
  snprintf(json, sizeof(json),
           "{\"model_path\": \"%s\", \"data_path\": \"x\"%s}", path, extra);
  pcp_diloco_config_t config;
  EXPECT_CODE(pcp_diloco_config_parse_json(json, strlen(json), &config, NULL),
              PCP_STATUS_OK, NULL);
  pcp_status_t status = pcp_diloco_module_load(&config, out_module);
  pcp_diloco_config_deinitialize(&config);
  unlink(path);
  return status;
}

#define MODULE(params, data, result)                                \
  "module {\n  func.func @main(" params ", %x: " data ", %y: " data \
  ") -> " result                                                    \
  " {\n"                                                            \
  "    %c = stablehlo.constant dense<0.0> : tensor<f32>\n"          \
  "    return %c : tensor<f32>\n  }\n}\n"

static void module_load(void** state) {
  (void)state;
  pcp_diloco_module_t m;
  // Any rank, i64 ids (torch-mlir exports): the table, B and T.
  EXPECT_CODE(module_try("ok.mlir",
                         MODULE("%w: tensor<65x8xf32>, %k: tensor<2x3x4xf32>",
                                "tensor<2x16xi64>", "tensor<f32>"),
                         "", &m),
              PCP_STATUS_OK, NULL);
  assert_int_equal(m.table.count, 2);
  assert_string_equal(m.table.parameters[1].name, "param_1");
  assert_int_equal(m.table.parameters[1].rank, 3);
  assert_int_equal(m.table.parameters[1].dims[2], 4);
  assert_int_equal(m.table.parameters[1].byte_length, 24 * 4);
  assert_int_equal(m.table.total_elements, 65 * 8 + 24);
  assert_int_equal(m.batch, 2);
  assert_int_equal(m.block_size, 16);
  assert_int_equal(m.data_type, PCP_ELEMENT_TYPE_I64);
  assert_non_null(strstr(m.text, "@main"));
  pcp_diloco_module_deinitialize(&m);
  // The experiment's dtype must be the parameters'.
  EXPECT_CODE(module_try("dtype.mlir",
                         MODULE("%w: tensor<65x8xf32>", "tensor<2x16xi32>",
                                "tensor<f32>"),
                         ", \"dtype\": \"bf16\"", &m),
              PCP_STATUS_INVALID_ARGUMENT, "dtype");
  // Data that is not two BxT integer tensors.
  EXPECT_CODE(module_try("data.mlir",
                         MODULE("%w: tensor<65x8xf32>", "tensor<2x16xf32>",
                                "tensor<f32>"),
                         "", &m),
              PCP_STATUS_INVALID_ARGUMENT, "input_ids");
  // No parameters at all.
  EXPECT_CODE(
      module_try("none.mlir",
                 "module {\n  func.func @main(%x: tensor<2x4xi32>, %y: "
                 "tensor<2x4xi32>) -> tensor<f32> {\n    %c = "
                 "stablehlo.constant dense<0.0> : tensor<f32>\n    return %c "
                 ": tensor<f32>\n  }\n}\n",
                 "", &m),
      PCP_STATUS_INVALID_ARGUMENT, "model_path");
  // Not a scalar loss, not MLIR, not there.
  EXPECT_CODE(module_try("result.mlir",
                         "module {\n  func.func @main(%w: tensor<3xf32>, %x: "
                         "tensor<2x4xi32>, %y: tensor<2x4xi32>) -> "
                         "tensor<3xf32> {\n    return %w : tensor<3xf32>\n  "
                         "}\n}\n",
                         "", &m),
              PCP_STATUS_INVALID_ARGUMENT, "scalar");
  EXPECT_CODE(module_try("garbage.mlir", "this is not { MLIR", "", &m),
              PCP_STATUS_INVALID_ARGUMENT, "model_path");
  EXPECT_CODE(module_try("missing.mlir", NULL, "", &m),
              PCP_STATUS_INVALID_ARGUMENT, "model_path");
  pcp_diloco_module_deinitialize(&m);  // safe after a failure
}

static void experiment_check(void** state) {
  (void)state;
  const char* text =
      "{\"model_path\": \"m\", \"data_path\": \"x\", "
      "\"effective_batch_size\": 12}";
  pcp_diloco_config_t config;
  EXPECT_CODE(pcp_diloco_config_parse_json(text, strlen(text), &config, NULL),
              PCP_STATUS_OK, NULL);
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 8, 16, PCP_ELEMENT_TYPE_I32),
              PCP_STATUS_INVALID_ARGUMENT, "effective_batch_size");
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 4, 16, PCP_ELEMENT_TYPE_I32),
              PCP_STATUS_OK, NULL);
  config.effective_batch_size = 4 * 4097;  // more than 4096 micro batches
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 4, 16, PCP_ELEMENT_TYPE_I32),
              PCP_STATUS_INVALID_ARGUMENT, "effective_batch_size");
  config.effective_batch_size = 8;  // streaming takes accumulation too
  config.streaming.present = true;
  config.dtype = PCP_DILOCO_DTYPE_BF16;
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 4, 16, PCP_ELEMENT_TYPE_I32),
              PCP_STATUS_OK, NULL);
  // A round of token ids over 256 MiB (the bounds' product overflows 64
  // bits: checked in floating point).
  config.effective_batch_size = 0;
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 1 << 24, 1 << 24,
                                          PCP_ELEMENT_TYPE_I64),
              PCP_STATUS_INVALID_ARGUMENT, "tau");
  config.dtype = PCP_DILOCO_DTYPE_F16;
  EXPECT_CODE(pcp_diloco_experiment_check(&config, 4, 16, PCP_ELEMENT_TYPE_I32),
              PCP_STATUS_INVALID_ARGUMENT, "dtype");
  pcp_diloco_config_deinitialize(&config);
}

static void metrics_register(void** state) {
  (void)state;
  pcp_obs_registry_t* registry = NULL;
  EXPECT_CODE(pcp_obs_registry_create(pcp_allocator_system(), &registry),
              PCP_STATUS_OK, NULL);
  pcp_diloco_metrics_t metrics;
  EXPECT_CODE(pcp_diloco_metrics_register(registry, &metrics), PCP_STATUS_OK,
              NULL);
  assert_non_null(metrics.outer_step_seconds);
  assert_non_null(metrics.lost_tasks);
  pcp_diloco_metrics_t again;
  EXPECT_CODE(pcp_diloco_metrics_register(registry, &again),
              PCP_STATUS_ALREADY_EXISTS, NULL);
  // A job's {job} series go when it ends; another job's stay.
  const char* a[] = {"job-a"};
  const char* b[] = {"job-b"};
  pcp_obs_family_set(metrics.loss, a, 2.5);
  pcp_obs_family_set(metrics.val_loss, a, 2.7);
  pcp_obs_family_set(metrics.tokens_per_second, a, 100);
  pcp_obs_family_set(metrics.learning_rate, a, 1e-3);
  pcp_obs_family_set(metrics.loss, b, 3.0);
  pcp_diloco_metrics_job_remove(&metrics, "job-a");
  assert_int_equal(pcp_obs_family_series_count(metrics.loss), 1);
  assert_int_equal(pcp_obs_family_series_count(metrics.val_loss), 0);
  assert_int_equal(pcp_obs_family_series_count(metrics.tokens_per_second), 0);
  assert_int_equal(pcp_obs_family_series_count(metrics.learning_rate), 0);
  pcp_diloco_metrics_job_remove(NULL, "job-b");  // no metrics: no-op
  assert_int_equal(pcp_obs_family_series_count(metrics.loss), 1);
  pcp_obs_registry_release(registry);
}

typedef struct harness_t {
  char dir[256];
  pcp_store_t* store;
  pcp_fabric_endpoint_t* fabric;
  int stop_after_polls;  // should_stop answers true from this poll on
  int polls;
  int phases;
  int progress_reports;
} harness_t;

static pcp_status_t on_phase(void* user_data, pcp_diloco_job_phase_t phase) {
  harness_t* h = user_data;
  assert_int_equal(phase, PCP_DILOCO_JOB_PHASE_RUNNING);
  ++h->phases;
  return pcp_ok_status();
}

static void on_progress(void* user_data, const json_t* progress) {
  harness_t* h = user_data;
  assert_int_equal(json_integer_value(json_object_get(progress, "outer_step")),
                   0);
  assert_true(json_is_null(json_object_get(progress, "loss")));
  ++h->progress_reports;
}

static bool on_should_stop(void* user_data) {
  harness_t* h = user_data;
  return ++h->polls >= h->stop_after_polls;
}

static int harness_setup(void** state) {
  harness_t* h = calloc(1, sizeof(*h));
  snprintf(h->dir, sizeof(h->dir), "/tmp/pcp-service-test-XXXXXX");
  assert_non_null(mkdtemp(h->dir));
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = h->dir;
  EXPECT_CODE(
      pcp_store_create(&store_options, pcp_allocator_system(), &h->store),
      PCP_STATUS_OK, NULL);
  setenv("PCP_SERVICE_TEST_JOIN", "token", 1);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_SERVICE_TEST_JOIN";
  EXPECT_CODE(pcp_fabric_endpoint_create(&fabric_options,
                                         pcp_allocator_system(), &h->fabric),
              PCP_STATUS_OK, NULL);
  *state = h;
  return 0;
}

static int harness_teardown(void** state) {
  harness_t* h = *state;
  pcp_fabric_endpoint_release(h->fabric);
  pcp_store_release(h->store);
  char command[300];
  snprintf(command, sizeof(command), "rm -rf %s", h->dir);
  if (system(command) != 0) {
    print_error("could not remove %s\n", h->dir);
  }
  free(h);
  return 0;
}

static pcp_status_t run(harness_t* h, const char* job_id,
                        const char* experiment) {
  json_t* spec = json_object();
  pcp_status_t status =
      pcp_store_job_create(h->store, job_id, "training", spec, NULL);
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  pcp_diloco_job_options_t options = {
      .job_id = job_id,
      .experiment_json = experiment,
      .experiment_byte_length = strlen(experiment),
      .fabric = h->fabric,
      .store = h->store,
      .state_dir = h->dir,
      .pcp_path = "/nonexistent/pcp",  // never reached: no worker joins
      .clock = pcp_clock_system(),
      .hooks = {.phase = on_phase,
                .progress = on_progress,
                .should_stop = on_should_stop,
                .user_data = h},
  };
  return pcp_diloco_job_run(&options);
}

static char* experiment(const char* extra) {
  static char text[2048];
  snprintf(text, sizeof(text),
           "{\"model\": {\"kind\": \"gpt\", \"layers\": 1, \"heads\": 2, "
           "\"kv_heads\": 2, "
           "\"width\": 32, \"vocab\": 65, \"block_size\": 16, \"batch\": 2}, "
           "\"data_path\": \"%s\", \"tau\": 2, \"outer_loop_steps\": 3%s}",
           PCP_TEST_DATA, extra);
  return text;
}

static void setup_errors_name_the_key(void** state) {
  harness_t* h = *state;
  h->stop_after_polls = 1000000;
  char bad_vocab[2048];
  snprintf(bad_vocab, sizeof(bad_vocab), "%s", experiment(""));
  char* v = strstr(bad_vocab, "\"vocab\": 65");
  memcpy(v, "\"vocab\": 16", 11);
  EXPECT_CODE(run(h, "job-vocab", bad_vocab), PCP_STATUS_INVALID_ARGUMENT,
              "model.vocab");
  char missing[2048];
  snprintf(missing, sizeof(missing), "%s", experiment(""));
  char* path = strstr(missing, PCP_TEST_DATA);
  memcpy(path, "/nonexistent/", 13);
  EXPECT_CODE(run(h, "job-data", missing), PCP_STATUS_NOT_FOUND, "data_path");
  EXPECT_CODE(run(h, "job-dtype", experiment(", \"dtype\": \"f16\"")),
              PCP_STATUS_INVALID_ARGUMENT, "dtype");
  EXPECT_CODE(run(h, "job-tau", experiment(", \"tau\": 0")),
              PCP_STATUS_INVALID_ARGUMENT, "tau");
  assert_int_equal(h->phases, 0);  // no job got as far as running
}

static void stop_while_no_worker(void** state) {
  harness_t* h = *state;
  // No worker joins: every round waits; the hook stops the run on its
  // third poll, before any program is built.
  h->stop_after_polls = 3;
  EXPECT_CODE(run(h, "job-stop", experiment("")), PCP_STATUS_CANCELLED,
              "outer step 0");
  assert_int_equal(h->phases, 1);
  assert_int_equal(h->progress_reports, 1);
  assert_int_equal(h->polls, 3);
  // The module was written for the compile child.
  char path[512];
  snprintf(path, sizeof(path), "%s/training/job-stop/model.mlir", h->dir);
  assert_true(pcp_file_exists(path));
}

// experiment()'s parameter table.
static void model_table(pcp_models_parameter_table_t* out_table) {
  pcp_diloco_config_t config;
  const char* text = experiment("");
  EXPECT_CODE(pcp_diloco_config_parse_json(text, strlen(text), &config, NULL),
              PCP_STATUS_OK, NULL);
  pcp_models_spec_t spec;
  EXPECT_CODE(pcp_diloco_model_spec_resolve(&config, &spec), PCP_STATUS_OK,
              NULL);
  EXPECT_CODE(pcp_models_parameter_table_initialize(
                  &spec, pcp_allocator_system(), out_table),
              PCP_STATUS_OK, NULL);
  pcp_diloco_config_deinitialize(&config);
}

// A checkpoint for experiment()'s model at outer step |step| with |cursor|,
// as <dir>/ckpt/latest.ckpt (what "resume": true reads).
static void write_checkpoint(harness_t* h, uint64_t step, const char* cursor) {
  pcp_models_parameter_table_t table;
  model_table(&table);
  size_t n = (size_t)table.total_elements;
  uint64_t* elements = calloc(table.count, sizeof(uint64_t));
  float* zeros = calloc(n, sizeof(float));
  for (size_t i = 0; i < table.count; ++i) {
    elements[i] = (uint64_t)table.parameters[i].element_count;
  }
  pcp_diloco_checkpoint_t c = {
      .outer_step = step,
      .tensor_count = (uint32_t)table.count,
      .tensor_elements = elements,
      .parameter_count = n,
      .parameters = zeros,
      .velocity = zeros,
      .cursor = (uint8_t*)cursor,
      .cursor_byte_length = strlen(cursor),
  };
  char path[512];
  snprintf(path, sizeof(path), "%s/ckpt", h->dir);
  EXPECT_CODE(pcp_file_make_directories(path), PCP_STATUS_OK, NULL);
  snprintf(path, sizeof(path), "%s/ckpt/latest.ckpt", h->dir);
  EXPECT_CODE(pcp_diloco_checkpoint_save(&c, path), PCP_STATUS_OK, NULL);
  free(elements);
  free(zeros);
  pcp_models_parameter_table_deinitialize(&table);
}

// A streaming cursor naming stream-x.workers of |state_bytes| bytes with
// SHA-256 |hex|.
static const char* streaming_cursor(const char* hex, size_t state_bytes) {
  static char text[2048];
  snprintf(
      text, sizeof(text),
      "{\"kind\": \"pcp.diloco.streaming.v1\", \"seed\": 0, \"workers\": 1, "
      "\"wire_bytes\": 0, \"token_bytes\": 0, \"loss\": 3.5, "
      "\"loss_mean\": 3.5, \"streaming\": {\"fragments\": 2, "
      "\"inner_steps\": 4, \"overlap_tau\": 1, \"alpha\": 0.5, "
      "\"deltas_dtype\": \"f32\", \"step\": 9, \"syncs\": 2, "
      "\"last_event_step\": 8, \"backend\": \"cpu\", \"target\": "
      "\"default\", \"shards\": 1, \"pending_up\": [0, 0], "
      "\"pending_senders\": [1, 1], \"workers\": [{\"worker_id\": \"w\", "
      "\"shard\": 0, \"loss\": 3.5, \"sampler\": \"{}\"}], "
      "\"state_file\": \"stream-x.workers\", \"state_sha256\": \"%s\", "
      "\"state_bytes\": %zu}}",
      hex, state_bytes);
  return text;
}

#define STREAMING_RESUME                                                  \
  ", \"resume\": true, \"checkpoint_dir\": \"ckpt\", \"max_epochs\": 3, " \
  "\"streaming\": {\"num_fragments\": 2, \"inner_steps\": 4, "            \
  "\"overlap_tau\": 1, \"alpha\": 0.5}"

// A checkpoint of the other kind, another schedule, a worker state file
// missing, short or corrupted: clear errors before any worker is needed; a
// good one gets as far as waiting for the checkpoint's workers.
static void streaming_resume_checks(void** state) {
  harness_t* h = *state;
  h->stop_after_polls = 1000000;
  write_checkpoint(h, 2,
                   "{\"kind\": \"pcp.diloco.stateless.v1\", \"workers\": 2}");
  EXPECT_CODE(run(h, "job-classic-ckpt", experiment(STREAMING_RESUME)),
              PCP_STATUS_FAILED_PRECONDITION, "from a classic DiLoCo run");
  // The state file: one worker's p/m/v/s.
  pcp_models_parameter_table_t table;
  model_table(&table);
  size_t bytes = 4 * (size_t)table.total_elements * sizeof(float);
  pcp_models_parameter_table_deinitialize(&table);
  float* data = calloc(1, bytes);
  for (size_t i = 0; i < bytes / sizeof(float); ++i) {
    data[i] = (float)i * 0.25f;
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, bytes, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  write_checkpoint(h, 2, streaming_cursor(hex, bytes));
  EXPECT_CODE(run(h, "job-streaming-ckpt",
                  experiment(", \"resume\": true, "
                             "\"checkpoint_dir\": "
                             "\"ckpt\"")),
              PCP_STATUS_FAILED_PRECONDITION, "from a streaming DiLoCo run");
  char other_h[2048];
  snprintf(other_h, sizeof(other_h), "%s", experiment(STREAMING_RESUME));
  char* at = strstr(other_h, "\"inner_steps\": 4");
  memcpy(at, "\"inner_steps\": 5", 16);
  EXPECT_CODE(run(h, "job-other-h", other_h), PCP_STATUS_FAILED_PRECONDITION,
              "H=5");
  EXPECT_CODE(run(h, "job-no-state", experiment(STREAMING_RESUME)),
              PCP_STATUS_DATA_LOSS, "stream-x.workers");
  char path[512];
  snprintf(path, sizeof(path), "%s/ckpt/stream-x.workers", h->dir);
  EXPECT_CODE(pcp_file_write_atomic(path, data, bytes - 4), PCP_STATUS_OK,
              NULL);
  EXPECT_CODE(run(h, "job-short-state", experiment(STREAMING_RESUME)),
              PCP_STATUS_DATA_LOSS, "does not match its checkpoint");
  data[7] = 1e9f;
  EXPECT_CODE(pcp_file_write_atomic(path, data, bytes), PCP_STATUS_OK, NULL);
  EXPECT_CODE(run(h, "job-bad-state", experiment(STREAMING_RESUME)),
              PCP_STATUS_DATA_LOSS, "does not match its checkpoint");
  data[7] = 7 * 0.25f;
  EXPECT_CODE(pcp_file_write_atomic(path, data, bytes), PCP_STATUS_OK, NULL);
  // Verified: it waits for its worker (none joins) until the stop hook.
  h->polls = 0;
  h->stop_after_polls = 3;
  EXPECT_CODE(run(h, "job-good-state", experiment(STREAMING_RESUME)),
              PCP_STATUS_CANCELLED, "outer step 2");
  free(data);
}

// ddp's reference: the largest group of equal hashes wins whatever the
// ids (a corrupted lowest-id worker does not become the reference); no
// majority is reported as a tie, never settled by id.
static void ddp_hash_vote(void** state) {
  (void)state;
  uint8_t hashes[5][PCP_SHA256_BYTE_LENGTH];
  bool present[5] = {true, true, true, true, true};
  bool tied = true;
  // a (corrupted, first by id) against b, c, d.
  memset(hashes, 0xAB, sizeof(hashes));
  hashes[0][0] = 0x01;
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 4, &tied),
                   1);
  assert_false(tied);
  // Two workers that differ: no majority.
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 2, &tied),
                   0);
  assert_true(tied);
  // Two against two, and three that all differ: no majority.
  hashes[1][0] = 0x01;
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 4, &tied),
                   0);
  assert_true(tied);
  hashes[1][0] = 0x02;
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 3, &tied),
                   0);
  assert_true(tied);
  // A lost worker does not vote: a and b differ, c is lost, d and e agree.
  present[2] = false;
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 5, &tied),
                   3);
  assert_false(tied);
  // A tie below the top does not count: a and b differ; c, d, e agree.
  present[2] = true;
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 5, &tied),
                   2);
  assert_false(tied);
  // One worker: its own reference. None: UINT32_MAX.
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], present, 1, &tied),
                   0);
  assert_false(tied);
  bool none[5] = {false};
  assert_int_equal(pcp_diloco_ddp_hash_vote(&hashes[0][0], none, 5, &tied),
                   UINT32_MAX);
}

// ddp_pull's candidates: the reference, then the other live workers with
// its hash in id order (a reference lost during @read is replaced, not
// the job failed); a worker with another hash or lost is never read.
static void ddp_read_order(void** state) {
  (void)state;
  uint8_t hashes[5][PCP_SHA256_BYTE_LENGTH];
  memset(hashes, 0xAB, sizeof(hashes));
  hashes[1][0] = 0x01;                                // b differs
  bool present[5] = {true, true, false, true, true};  // c lost
  uint32_t order[5] = {0};
  assert_int_equal(
      pcp_diloco_ddp_read_order(&hashes[0][0], present, 5, 3, order), 3);
  assert_int_equal(order[0], 3);
  assert_int_equal(order[1], 0);
  assert_int_equal(order[2], 4);
  assert_int_equal(
      pcp_diloco_ddp_read_order(&hashes[0][0], present, 5, 1, order), 1);
  assert_int_equal(order[0], 1);
  assert_int_equal(
      pcp_diloco_ddp_read_order(&hashes[0][0], present, 5, 2, order), 0);
  assert_int_equal(
      pcp_diloco_ddp_read_order(&hashes[0][0], present, 5, UINT32_MAX, order),
      0);
}

// ddp's per-phase wait scales with one inner step, not a reported step of
// tau of them: tau = 100 inner steps of 1 s waited 10 x 100 s (about 17
// minutes) for a hung worker; now 10 x 1 s with a 60 s floor.
static void ddp_phase_timeout(void** state) {
  (void)state;
  assert_int_equal(pcp_diloco_ddp_phase_timeout_ms(0), 5 * 60 * 1000);
  assert_int_equal(pcp_diloco_ddp_phase_timeout_ms(1000000000), 60 * 1000);
  assert_int_equal(pcp_diloco_ddp_phase_timeout_ms(20000000000LL), 200 * 1000);
  assert_int_equal(pcp_diloco_ddp_phase_timeout_ms(-5), 5 * 60 * 1000);
}

#define RESUME ", \"resume\": true, \"checkpoint_dir\": \"ckpt\""

// ddp checkpoints have their own cursor kind: a ddp job refuses a classic
// checkpoint (its inner state would be ignored) and a classic job a ddp
// one, each naming both modes; a ddp job takes its own and gets as far as
// waiting for a worker.
static void ddp_resume_checks(void** state) {
  harness_t* h = *state;
  // A run that resumed waits for a worker until the stop hook (CANCELLED).
  h->stop_after_polls = 3;
  write_checkpoint(h, 2,
                   "{\"kind\": \"pcp.diloco.stateless.v1\", \"workers\": 1}");
  EXPECT_CODE(run(h, "job-ddp-classic-ckpt",
                  experiment(RESUME ", \"aggregation_strategy\": \"ddp\"")),
              PCP_STATUS_FAILED_PRECONDITION,
              "is from a classic DiLoCo run; this job is a ddp one");
  write_checkpoint(h, 2, "{\"kind\": \"pcp.diloco.ddp.v1\", \"workers\": 1}");
  h->polls = 0;
  EXPECT_CODE(run(h, "job-classic-ddp-ckpt", experiment(RESUME)),
              PCP_STATUS_FAILED_PRECONDITION,
              "is from a ddp run; this job is a classic DiLoCo one");
  h->polls = 0;
  EXPECT_CODE(run(h, "job-ddp-ddp-ckpt",
                  experiment(RESUME ", \"aggregation_strategy\": \"ddp\"")),
              PCP_STATUS_CANCELLED, "outer step 2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(spec_resolve),
      cmocka_unit_test(metrics_register),
      cmocka_unit_test(module_load),
      cmocka_unit_test(experiment_check),
      cmocka_unit_test_setup_teardown(setup_errors_name_the_key, harness_setup,
                                      harness_teardown),
      cmocka_unit_test_setup_teardown(stop_while_no_worker, harness_setup,
                                      harness_teardown),
      cmocka_unit_test_setup_teardown(streaming_resume_checks, harness_setup,
                                      harness_teardown),
      cmocka_unit_test_setup_teardown(ddp_resume_checks, harness_setup,
                                      harness_teardown),
      cmocka_unit_test(ddp_hash_vote),
      cmocka_unit_test(ddp_read_order),
      cmocka_unit_test(ddp_phase_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
