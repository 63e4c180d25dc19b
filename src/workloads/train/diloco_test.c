// SPDX-License-Identifier: Apache-2.0
// Unit tests of the DiLoCo core: config, bf16, averaging with a lost worker,
// Nesterov by hand, streaming schedule, checkpoint round trip/corruption and
// store indexing, wire accounting. NumPy comparisons: diloco_numpy_test.

#include <math.h>
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

#include "workloads/workloads.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* expr, const char* file, int line) {
  pcp_status_code_t actual = pcp_status_code(status);
  if (actual != code) {
    char text[512];
    pcp_status_format(status, text, sizeof(text));
    print_error("%s:%d: %s: want %s, got %s\n", file, line, expr,
                pcp_status_code_string(code), text);
  }
  pcp_status_ignore(status);
  _assert_int_equal(actual, code, file, line);
}
#define EXPECT_CODE(expr, code) \
  expect_code_at((expr), (code), #expr, __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK)

// DDP's average: f32 sum in input order then one division (odd counts
// included, where 1/count is inexact), no aliasing of a NaN or Inf into a
// zero, and no inputs refused.
static void test_gradient_average(void** state) {
  (void)state;
  const float a[4] = {1.0f, -2.0f, 0.1f, 3.0e38f};
  const float b[4] = {2.0f, 2.0f, 0.2f, -3.0e38f};
  const float c[4] = {4.0f, 0.5f, 0.3f, 1.0f};
  const float* three[3] = {a, b, c};
  float out[4] = {0};
  EXPECT_OK(pcp_diloco_gradient_average(three, 3, 4, out));
  // (1 + 2 + 4) / 3 rounded once, not 7 * (1/3).
  float sum0 = 1.0f + 2.0f;
  sum0 += 4.0f;
  assert_true(out[0] == sum0 / 3.0f);
  assert_true(out[1] == 0.5f / 3.0f);
  float sum2 = 0.1f + 0.2f;
  sum2 += 0.3f;
  assert_true(out[2] == sum2 / 3.0f);
  // 3e38 - 3e38 + 1: finite in this order.
  assert_true(out[3] == 1.0f / 3.0f);
  // One worker: the average is its gradient.
  EXPECT_OK(pcp_diloco_gradient_average(three, 1, 4, out));
  assert_memory_equal(out, a, sizeof(a));
  // A NaN from one worker is refused, naming the element and worker.
  const float bad[4] = {1.0f, NAN, 0.0f, 0.0f};
  const float* with_nan[3] = {a, bad, c};
  pcp_status_t status = pcp_diloco_gradient_average(with_nan, 3, 4, out);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_OUT_OF_RANGE);
  assert_non_null(strstr(pcp_status_message(status), "element 1 of worker 1"));
  pcp_status_ignore(status);
  // Finite inputs whose sum overflows are refused too.
  const float big[1] = {3.0e38f};
  const float* overflow[2] = {big, big};
  EXPECT_CODE(pcp_diloco_gradient_average(overflow, 2, 1, out),
              PCP_STATUS_OUT_OF_RANGE);
  EXPECT_CODE(pcp_diloco_gradient_average(three, 0, 4, out),
              PCP_STATUS_INVALID_ARGUMENT);
}

static pcp_status_t parse(const char* json, pcp_diloco_config_t* config,
                          pcp_string_list_t* unknown) {
  return pcp_diloco_config_parse_json(json, strlen(json), config, unknown);
}

static void test_config_defaults_and_keys(void** state) {
  (void)state;
  pcp_diloco_config_t c;
  pcp_string_list_t unknown = {0};
  EXPECT_OK(
      parse("{\"model_path\":\"m.mlir\",\"data_path\":\"d.txt\","
            "\"wandb_project\":\"x\",\"seed\":3}",
            &c, &unknown));
  assert_int_equal(c.tau, 10);
  assert_true(fabs(c.outer_learning_rate - 0.7) < 1e-12);
  assert_true(fabs(c.nesterov_momentum - 0.9) < 1e-12);
  assert_int_equal(c.tokenizer, PCP_DILOCO_TOKENIZER_CHAR);
  assert_int_equal(c.checkpoint_every, 10);
  assert_int_equal(c.deltas_dtype, PCP_DILOCO_WIRE_F32);
  assert_false(c.streaming.present);
  assert_false(c.resume);
  assert_int_equal(c.lr_schedule, PCP_DILOCO_LR_CONSTANT);
  assert_int_equal(c.warmup_steps, 0);
  assert_true(c.min_lr == 0);
  assert_int_equal(c.inner_state, PCP_DILOCO_INNER_STATE_KEEP);
  assert_true(fabs(c.eval_fraction - 0.1) < 1e-12);
  assert_int_equal(c.eval_every, 10);
  assert_int_equal(c.eval_batches, 16);
  // name and seed are keys of ours (issue 13: they were reported as
  // unknown although the service uses them).
  assert_int_equal(unknown.count, 1);
  assert_string_equal(unknown.items[0], "wandb_project");
  assert_int_equal(c.seed, 3);
  assert_null(c.name);
  pcp_string_list_deinitialize(&unknown);
  pcp_diloco_config_deinitialize(&c);

  EXPECT_OK(
      parse("{\"model\":{\"kind\":\"nanochat\",\"layers\":3,"
            "\"batch\":4},\"data_path\":\"d\",\"tokenizer\":\"u16\","
            "\"outer_learning_rate\":0.5,\"deltas_dtype\":\"bf16\","
            "\"effective_batch_size\":16,\"should_resume\":true,"
            "\"streaming\":{\"num_fragments\":3,\"inner_steps\":8}}",
            &c, NULL));
  assert_true(c.model.present);
  assert_int_equal(c.model.kind, PCP_DILOCO_MODEL_NANOCHAT);
  assert_int_equal(c.model.layers, 3);
  assert_int_equal(c.tokenizer, PCP_DILOCO_TOKENIZER_U16);
  assert_int_equal(c.deltas_dtype, PCP_DILOCO_WIRE_BF16);
  assert_true(c.resume);
  assert_true(c.streaming.present);
  assert_int_equal(c.streaming.num_fragments, 3);
  assert_int_equal(c.streaming.inner_steps, 8);
  assert_int_equal(c.streaming.overlap_tau, 1);
  assert_true(fabs(c.streaming.alpha - 0.5) < 1e-12);
  pcp_diloco_config_deinitialize(&c);

  EXPECT_OK(
      parse("{\"model_path\":\"m\",\"data_path\":\"d\","
            "\"learning_rate\":0.003,\"lr_schedule\":\"cosine\","
            "\"warmup_steps\":100,\"min_lr\":0.0003,"
            "\"inner_state\":\"reset\",\"eval_fraction\":0,"
            "\"eval_every\":5,\"eval_batches\":3}",
            &c, NULL));
  assert_int_equal(c.lr_schedule, PCP_DILOCO_LR_COSINE);
  assert_int_equal(c.warmup_steps, 100);
  assert_true(fabs(c.min_lr - 3e-4) < 1e-12);
  assert_int_equal(c.inner_state, PCP_DILOCO_INNER_STATE_RESET);
  assert_true(c.eval_fraction == 0);
  assert_int_equal(c.eval_every, 5);
  assert_int_equal(c.eval_batches, 3);
  pcp_diloco_config_deinitialize(&c);
}

static void expect_error_naming(const char* json, const char* key) {
  pcp_diloco_config_t c;
  pcp_status_t status = parse(json, &c, NULL);
  char text[512];
  pcp_status_format(status, text, sizeof(text));
  if (strstr(text, key) == NULL) {
    print_error("%s: error '%s' does not name '%s'\n", json, text, key);
    fail();
  }
  EXPECT_CODE(status, PCP_STATUS_INVALID_ARGUMENT);
}

static void test_config_errors_name_the_key(void** state) {
  (void)state;
  expect_error_naming("{\"model_path\":\"m\",\"data_path\":\"d\",\"tau\":0}",
                      "tau");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"tokenizer\":\"qwen\"}",
      "tokenizer");
  expect_error_naming("{\"model_path\":\"m\"}", "data_path");
  expect_error_naming("{\"data_path\":\"d\"}", "model_path");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"deltas_dtype\":\"int4\"}",
      "deltas_dtype");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"streaming\":{\"alpha\":1.5}}",
      "alpha");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"streaming\":{\"inner_steps\":2,\"overlap_tau\":2}}",
      "overlap_tau");
  expect_error_naming(
      "{\"model\":{\"kind\":\"gpt\",\"batch\":4},"
      "\"data_path\":\"d\",\"effective_batch_size\":6}",
      "effective_batch_size");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"outer_learning_rate\":\"x\"}",
      "outer_learning_rate");
  // iree_flags: refused, malformed and too many flags, a non-string item.
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":[\"-o\"]}",
      "iree_flags[0]");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":"
      "[\"--iree-opt-level=O1\",\"--compile-to=flow\"]}",
      "iree_flags[1]");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":[1]}",
      "iree_flags");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":"
      "[\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\","
      "\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\",\"--a=1\","
      "\"--a=1\",\"--a=1\",\"--a=1\"]}",
      "iree_flags");
  pcp_diloco_config_t config;
  pcp_status_t status = pcp_diloco_config_parse_json(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":"
      "[\"--iree-opt-level=O1\"]}",
      strlen("{\"model_path\":\"m\",\"data_path\":\"d\",\"iree_flags\":"
             "[\"--iree-opt-level=O1\"]}"),
      &config, NULL);
  assert_null(status);
  assert_int_equal(config.iree_flags.count, 1);
  assert_string_equal(config.iree_flags.items[0], "--iree-opt-level=O1");
  pcp_diloco_config_deinitialize(&config);
  // The schedule, inner-state and validation keys: ranges and cross-field
  // rules, each error naming its key.
  const char* base = "{\"model_path\":\"m\",\"data_path\":\"d\",";
  const struct {
    const char* tail;
    const char* key;
  } cases[] = {
      {"\"lr_schedule\":\"step\"}", "lr_schedule"},
      {"\"lr_schedule\":\"cosine\",\"warmup_steps\":-1}", "warmup_steps"},
      {"\"warmup_steps\":10}", "warmup_steps"},  // constant schedule
      {"\"lr_schedule\":\"cosine\",\"min_lr\":-0.1}", "min_lr"},
      {"\"lr_schedule\":\"warmup_constant\",\"min_lr\":0.0001}", "min_lr"},
      {"\"lr_schedule\":\"cosine\",\"learning_rate\":0.001,"
       "\"min_lr\":0.01}",
       "min_lr"},
      {"\"inner_state\":\"persist\"}", "inner_state"},
      {"\"eval_fraction\":0.9}", "eval_fraction"},
      {"\"eval_fraction\":-0.1}", "eval_fraction"},
      {"\"eval_every\":0}", "eval_every"},
      {"\"eval_batches\":0}", "eval_batches"},
      {"\"eval_batches\":100000}", "eval_batches"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    char json[512];
    snprintf(json, sizeof(json), "%s%s", base, cases[i].tail);
    expect_error_naming(json, cases[i].key);
  }
}

static float from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static void test_bf16_round_to_nearest_even(void** state) {
  (void)state;
  float in[] = {1.0f,
                from_bits(0x3F808000u),  // tie, even below: stays 0x3F80
                from_bits(0x3F818000u),  // tie, odd below: up to 0x3F82
                from_bits(0x3F808001u),  // above tie: up
                from_bits(0x7F7FFFFFu),  // FLT_MAX rounds to +Inf
                -2.5f,
                NAN};
  uint16_t out[7];
  pcp_diloco_bf16_quantize(in, 7, out);
  assert_int_equal(out[0], 0x3F80);
  assert_int_equal(out[1], 0x3F80);
  assert_int_equal(out[2], 0x3F82);
  assert_int_equal(out[3], 0x3F81);
  assert_int_equal(out[4], 0x7F80);
  assert_int_equal(out[5], 0xC020);
  float back[7];
  pcp_diloco_bf16_dequantize(out, 7, back);
  assert_true(isnan(back[6]));
  assert_true(back[5] == -2.5f);
}

static void test_average_with_lost_worker(void** state) {
  (void)state;
  pcp_diloco_accumulator_t acc;
  EXPECT_OK(pcp_diloco_accumulator_initialize(pcp_allocator_system(), 3, &acc));
  float avg[3];
  EXPECT_CODE(pcp_diloco_accumulator_average(&acc, avg, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  float w0[3] = {1, 2, 3}, w1[3] = {3, 4, NAN};
  EXPECT_OK(pcp_diloco_accumulator_add_f32(&acc, w0, 3));
  EXPECT_CODE(pcp_diloco_accumulator_add_f32(&acc, w0, 2),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(pcp_diloco_accumulator_add_f32(&acc, w1, 3));
  // Worker 2 was lost mid-round: the average is over the two reporters.
  size_t nonfinite = 99;
  EXPECT_OK(pcp_diloco_accumulator_average(&acc, avg, &nonfinite));
  assert_true(avg[0] == 2.0f && avg[1] == 3.0f && avg[2] == 0.0f);
  assert_int_equal(nonfinite, 1);
  pcp_diloco_accumulator_reset(&acc);
  uint16_t b[3] = {0x3F80, 0x4000, 0xBF80};  // 1, 2, -1
  EXPECT_OK(pcp_diloco_accumulator_add_bf16(&acc, b, 3));
  EXPECT_OK(pcp_diloco_accumulator_average(&acc, avg, NULL));
  assert_true(avg[0] == 1.0f && avg[1] == 2.0f && avg[2] == -1.0f);
  pcp_diloco_accumulator_deinitialize(&acc);
}

static void test_nesterov_by_hand(void** state) {
  (void)state;
  pcp_diloco_nesterov_t n;
  EXPECT_OK(pcp_diloco_nesterov_initialize(pcp_allocator_system(), 2, 0.5f,
                                           0.5f, &n));
  float theta[2] = {1.0f, -1.0f};
  float g[2] = {1.0f, 2.0f};
  // v = g = (1, 2); theta -= 0.5*(g + 0.5 v) = (1-0.75, -1-1.5)
  EXPECT_OK(pcp_diloco_nesterov_step(&n, 0, 2, g, theta));
  assert_true(theta[0] == 0.25f && theta[1] == -2.5f);
  // v = 0.5*1+1 = 1.5; theta -= 0.5*(1 + 0.75) = 0.25 - 0.875
  EXPECT_OK(pcp_diloco_nesterov_step(&n, 0, 1, g, theta));
  assert_true(theta[0] == -0.625f && n.velocity[0] == 1.5f);
  assert_true(n.velocity[1] == 2.0f);
  EXPECT_CODE(pcp_diloco_nesterov_step(&n, 1, 2, g, theta),
              PCP_STATUS_OUT_OF_RANGE);
  pcp_diloco_nesterov_deinitialize(&n);
}

static void test_streaming_schedule(void** state) {
  (void)state;
  // P=4, H=100, tau=1 (upstream defaults): phases 0, 25, 50, 75.
  pcp_streaming_diloco_schedule_t s = {4, 100, 1, 2};
  assert_int_equal(pcp_streaming_diloco_phase(&s, 3), 75);
  assert_int_equal(pcp_streaming_diloco_max_steps(&s), 2 * 100 + 75 + 1);
  uint32_t r = 99;
  assert_true(pcp_streaming_diloco_sends_at(&s, 0, 100, &r) && r == 0);
  assert_true(pcp_streaming_diloco_receives_at(&s, 0, 101, &r) && r == 0);
  assert_true(pcp_streaming_diloco_sends_at(&s, 1, 125, &r) && r == 0);
  assert_true(pcp_streaming_diloco_sends_at(&s, 3, 275, &r) && r == 1);
  assert_false(pcp_streaming_diloco_sends_at(&s, 0, 300, &r));  // r=2
  assert_false(pcp_streaming_diloco_sends_at(&s, 1, 25, &r));   // t == phase
  assert_false(pcp_streaming_diloco_receives_at(&s, 1, 125, &r));
  assert_true(pcp_streaming_diloco_receives_at(&s, 3, 276, &r) && r == 1);
  // Each fragment sends exactly max_rounds times within max_steps.
  for (uint32_t p = 0; p < 4; ++p) {
    int sends = 0, receives = 0;
    for (uint64_t t = 1; t <= pcp_streaming_diloco_max_steps(&s); ++t) {
      sends += pcp_streaming_diloco_sends_at(&s, p, t, NULL);
      receives += pcp_streaming_diloco_receives_at(&s, p, t, NULL);
    }
    assert_int_equal(sends, 2);
    assert_int_equal(receives, 2);
  }
  assert_int_equal(pcp_streaming_diloco_fragment_of(5, 4), 1);
  float snap[2] = {1, 2}, cur[2] = {0.5f, 3}, d[2];
  pcp_streaming_diloco_fragment_delta(snap, cur, 2, d);
  assert_true(d[0] == 0.5f && d[1] == -1.0f && snap[0] == 0.5f);
  float global[2] = {1, 1}, local[2] = {3, 5}, out_snap[2];
  pcp_streaming_diloco_mix(0.5f, global, local, out_snap, 2);
  assert_true(local[0] == 2.0f && local[1] == 3.0f && out_snap[1] == 3.0f);
}

static void fill_checkpoint(pcp_diloco_checkpoint_t* c, uint64_t* elements,
                            float* params, float* velocity, uint8_t* cursor) {
  pcp_rng_t rng;
  pcp_rng_initialize(7, &rng);
  elements[0] = 3;
  elements[1] = 5;
  for (int i = 0; i < 8; ++i) {
    params[i] = (float)pcp_rng_next_normal(&rng);
    velocity[i] = (float)pcp_rng_next_normal(&rng);
  }
  params[2] = -0.0f;
  params[3] = from_bits(0x00000001u);  // denormal survives bit-exactly
  for (int i = 0; i < 5; ++i) cursor[i] = (uint8_t)(0xA0 + i);
  memset(c, 0, sizeof(*c));
  c->outer_step = 42;
  c->rng = rng;
  c->tensor_count = 2;
  c->tensor_elements = elements;
  c->parameter_count = 8;
  c->parameters = params;
  c->velocity = velocity;
  c->cursor = cursor;
  c->cursor_byte_length = 5;
}

static void test_checkpoint_round_trip_and_corruption(void** state) {
  (void)state;
  uint64_t elements[2];
  float params[8], velocity[8];
  uint8_t cursor[5];
  pcp_diloco_checkpoint_t c;
  fill_checkpoint(&c, elements, params, velocity, cursor);
  char dir[] = "/tmp/pcp_diloco_test_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof(path), "%s/ck.bin", dir);
  EXPECT_OK(pcp_diloco_checkpoint_save(&c, path));
  pcp_diloco_checkpoint_t back;
  EXPECT_OK(pcp_diloco_checkpoint_load(path, &back));
  assert_int_equal(back.outer_step, 42);
  assert_memory_equal(&back.rng, &c.rng, sizeof(c.rng));
  assert_int_equal(back.tensor_count, 2);
  assert_memory_equal(back.tensor_elements, elements, sizeof(elements));
  assert_int_equal(back.parameter_count, 8);
  assert_memory_equal(back.parameters, params, sizeof(params));
  assert_memory_equal(back.velocity, velocity, sizeof(velocity));
  assert_int_equal(back.cursor_byte_length, 5);
  assert_memory_equal(back.cursor, cursor, 5);
  // The restored RNG continues the same stream.
  pcp_rng_t a = c.rng, b = back.rng;
  assert_true(pcp_rng_next_u64(&a) == pcp_rng_next_u64(&b));
  pcp_diloco_checkpoint_deinitialize(&back);

  void* data = NULL;
  size_t length = 0;
  EXPECT_OK(pcp_diloco_checkpoint_serialize(&c, &data, &length));
  uint8_t* bytes = data;
  // Flip every byte in turn (header, lengths, payload, digest): each is
  // detected as DATA_LOSS (or an unknown version).
  for (size_t i = 0; i < length; ++i) {
    bytes[i] ^= 0x5A;
    pcp_status_t status =
        pcp_diloco_checkpoint_deserialize(data, length, &back);
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    assert_true(code == PCP_STATUS_DATA_LOSS);
    bytes[i] ^= 0x5A;
  }
  for (size_t cut = 0; cut < length; cut += 7) {
    EXPECT_CODE(pcp_diloco_checkpoint_deserialize(data, cut, &back),
                PCP_STATUS_DATA_LOSS);
  }
  // A corrupted file on disk.
  bytes[length / 2] ^= 1;
  EXPECT_OK(pcp_file_write_atomic(path, data, length));
  EXPECT_CODE(pcp_diloco_checkpoint_load(path, &back), PCP_STATUS_DATA_LOSS);
  free(data);
  // Inconsistent element counts are refused on save.
  c.parameter_count = 7;
  EXPECT_CODE(pcp_diloco_checkpoint_serialize(&c, &data, &length),
              PCP_STATUS_INVALID_ARGUMENT);
  unlink(path);
  rmdir(dir);
}

static void test_checkpoint_store_index(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp_diloco_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = dir;
  pcp_store_t* store = NULL;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &store));
  json_t* spec = json_pack("{s:s}", "kind", "diloco");
  EXPECT_OK(pcp_store_job_create(store, "train-1", "train", spec, NULL));
  json_decref(spec);
  EXPECT_OK(pcp_store_job_transition(store, "train-1",
                                     PCP_STORE_JOB_STATE_PLACING, NULL, NULL));
  EXPECT_OK(pcp_store_job_transition(
      store, "train-1", PCP_STORE_JOB_STATE_COMPILING, NULL, NULL));
  EXPECT_OK(pcp_store_job_transition(store, "train-1",
                                     PCP_STORE_JOB_STATE_RUNNING, NULL, NULL));
  uint64_t elements[2];
  float params[8], velocity[8];
  uint8_t cursor[5];
  pcp_diloco_checkpoint_t c;
  fill_checkpoint(&c, elements, params, velocity, cursor);
  pcp_store_checkpoint_t row;
  EXPECT_OK(pcp_diloco_checkpoint_store_write(&c, store, "train-1", &row));
  assert_int_equal(row.step, 42);
  pcp_store_checkpoint_t got;
  EXPECT_OK(pcp_store_checkpoint_get(store, "train-1", -1, &got));
  EXPECT_OK(pcp_store_checkpoint_verify(&got));
  pcp_diloco_checkpoint_t back;
  EXPECT_OK(pcp_diloco_checkpoint_load(got.path, &back));
  assert_memory_equal(back.parameters, params, sizeof(params));
  pcp_diloco_checkpoint_deinitialize(&back);
  pcp_store_release(store);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  assert_int_equal(system(command), 0);
}

static void test_wire_accounting(void** state) {
  (void)state;
  // 1000 params, 4 workers: f32 up+down = 4*1000*8.
  assert_int_equal(pcp_diloco_outer_step_wire_bytes(
                       1000, 4, PCP_DILOCO_WIRE_F32, PCP_DILOCO_WIRE_F32),
                   32000);
  assert_int_equal(pcp_diloco_outer_step_wire_bytes(
                       1000, 4, PCP_DILOCO_WIRE_BF16, PCP_DILOCO_WIRE_F32),
                   24000);
  assert_int_equal(
      pcp_streaming_diloco_fragment_wire_bytes(250, 4, PCP_DILOCO_WIRE_F32),
      8000);
  // Ring: 2(W-1) * 4000 bytes per step * 10 steps.
  assert_int_equal(pcp_diloco_ring_allreduce_wire_bytes(1000, 4, 10),
                   2 * 3 * 4000 * 10);
  assert_int_equal(pcp_diloco_ring_allreduce_wire_bytes(1000, 1, 10), 0);
}

static void test_config_worker_class(void** state) {
  (void)state;
  pcp_diloco_config_t c;
  EXPECT_CODE(parse("{\"model_path\":\"m\",\"data_path\":\"d\","
                    "\"worker_class\":\"train.v2\"}",
                    &c, NULL),
              PCP_STATUS_OK);
  assert_string_equal(c.worker_class, "train.v2");
  pcp_diloco_config_deinitialize(&c);
  EXPECT_CODE(parse("{\"model_path\":\"m\",\"data_path\":\"d\"}", &c, NULL),
              PCP_STATUS_OK);
  assert_null(c.worker_class);  // every worker
  pcp_diloco_config_deinitialize(&c);
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"worker_class\":\"\"}",
      "worker_class");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"worker_class\":\"a b\"}",
      "worker_class");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"worker_class\":3}",
      "worker_class");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"serve_worker_class\":\"x y\"}",
      "serve_worker_class");
  EXPECT_CODE(parse("{\"model_path\":\"m\",\"data_path\":\"d\","
                    "\"serve_worker_class\":\"gen\"}",
                    &c, NULL),
              PCP_STATUS_OK);
  assert_string_equal(c.serve_worker_class, "gen");
  assert_null(c.worker_class);
  pcp_diloco_config_deinitialize(&c);
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"worker_class\":"
      "\"0123456789012345678901234567890123456789012345678901234567890123\"}",
      "worker_class");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_defaults_and_keys),
      cmocka_unit_test(test_config_errors_name_the_key),
      cmocka_unit_test(test_config_worker_class),
      cmocka_unit_test(test_bf16_round_to_nearest_even),
      cmocka_unit_test(test_average_with_lost_worker),
      cmocka_unit_test(test_nesterov_by_hand),
      cmocka_unit_test(test_streaming_schedule),
      cmocka_unit_test(test_checkpoint_round_trip_and_corruption),
      cmocka_unit_test(test_checkpoint_store_index),
      cmocka_unit_test(test_wire_accounting),
      cmocka_unit_test(test_gradient_average),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
