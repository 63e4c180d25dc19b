// SPDX-License-Identifier: Apache-2.0
// The GRPO trainer's host-only paths (trainer.h): create's validation of
// every option (INVALID_ARGUMENT naming the field), the copies it makes,
// the parameter table, reference_set, and the refusals of ref_logp and
// update before anything reaches a worker (no reference yet, a bad
// temperature or step parameter, a batch of the wrong shape, a stop before
// the call); an out-of-memory sweep over create. None of these touch the
// fabric or the compile queue, so stand-in pointers are enough; the calls
// on real workers are tests/workloads/rl_trainer_test.py's.

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

// clang-format off
#include "workloads/workloads.h"
#include "workloads/rl/trainer.h"
// clang-format on

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* file, int line) {
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (pcp_status_code(status) != code || (needle && !strstr(text, needle))) {
    print_error("%s:%d: want %s naming '%s', got %s\n", file, line,
                pcp_status_code_string(code), needle ? needle : "", text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code, needle) \
  expect_code_at((expr), (code), (needle), __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK, NULL)

// Never dereferenced by the paths under test.
static char g_fabric_stand_in, g_queue_stand_in;
static bool g_stop;

static bool stop_hook(void* user_data) {
  (void)user_data;
  return g_stop;
}

static pcp_workloads_rl_trainer_options_t valid_options(void) {
  pcp_workloads_rl_trainer_options_t o;
  memset(&o, 0, sizeof(o));
  o.fabric = (pcp_fabric_endpoint_t*)&g_fabric_stand_in;
  o.compile_queue = (pcp_workloads_compile_queue_t*)&g_queue_stand_in;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, &o.spec);
  o.spec.layers = 1;
  o.spec.width = 32;
  o.spec.vocab = 17;
  o.spec.block_size = 8;
  o.spec.batch = 2;
  o.accumulation_steps = 2;
  o.worker_class = "trainers";
  o.max_workers = 2;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = 0.01;
  o.grad_clip = 1.0;
  o.session_prefix = "rl-job-1";
  o.stop = stop_hook;
  return o;
}

static void create_refuses(pcp_workloads_rl_trainer_options_t o,
                           const char* needle) {
  pcp_workloads_rl_trainer_t* trainer = (pcp_workloads_rl_trainer_t*)&o;
  EXPECT_CODE(
      pcp_workloads_rl_trainer_create(&o, pcp_allocator_system(), &trainer),
      PCP_STATUS_INVALID_ARGUMENT, needle);
  assert_null(trainer);
}

static void create_validates_every_option(void** state) {
  (void)state;
  pcp_workloads_rl_trainer_t* trainer = NULL;
  EXPECT_CODE(
      pcp_workloads_rl_trainer_create(NULL, pcp_allocator_system(), &trainer),
      PCP_STATUS_INVALID_ARGUMENT, "options");
  pcp_workloads_rl_trainer_options_t o = valid_options();
  o.fabric = NULL;
  create_refuses(o, "fabric");
  o = valid_options();
  o.compile_queue = NULL;
  create_refuses(o, "compile_queue");
  o = valid_options();
  o.spec.width = 30;  // not a multiple of heads
  create_refuses(o, "spec");
  o = valid_options();
  o.spec.dtype = PCP_ELEMENT_TYPE_BF16;
  create_refuses(o, "spec.dtype");
  o = valid_options();
  o.accumulation_steps = 0;
  create_refuses(o, "accumulation_steps");
  o.accumulation_steps = PCP_COMPILE_MAX_ACCUMULATION_STEPS + 1;
  create_refuses(o, "accumulation_steps");
  o = valid_options();
  o.max_workers = 0;
  create_refuses(o, "max_workers");
  o.max_workers = 257;
  create_refuses(o, "max_workers");
  o = valid_options();
  char long_class[80];
  memset(long_class, 'c', sizeof(long_class) - 1);
  long_class[sizeof(long_class) - 1] = '\0';
  o.worker_class = long_class;
  create_refuses(o, "worker_class");
  o.worker_class = "rl trainers";  // not a class name
  create_refuses(o, "worker_class");
  o = valid_options();
  o.beta1 = 1.0;
  create_refuses(o, "beta1");
  o = valid_options();
  o.beta2 = -0.1;
  create_refuses(o, "beta2");
  o = valid_options();
  o.eps = 0.0;
  create_refuses(o, "eps");
  o.eps = NAN;
  create_refuses(o, "eps");
  o = valid_options();
  o.weight_decay = INFINITY;
  create_refuses(o, "weight_decay");
  o = valid_options();
  o.grad_clip = -1.0;
  create_refuses(o, "grad_clip");
  o = valid_options();
  o.session_prefix = NULL;
  create_refuses(o, "session_prefix");
  o.session_prefix = "";
  create_refuses(o, "session_prefix");
  o.session_prefix = "job 1";  // a space
  create_refuses(o, "session_prefix");
  char long_prefix[200];
  memset(long_prefix, 'p', sizeof(long_prefix) - 1);
  long_prefix[sizeof(long_prefix) - 1] = '\0';
  o.session_prefix = long_prefix;
  create_refuses(o, "session_prefix");
  o = valid_options();
  o.task_timeout_ms = -1;
  create_refuses(o, "task_timeout_ms");
  // Boundaries that are accepted.
  o = valid_options();
  o.accumulation_steps = 1;
  o.max_workers = 256;
  o.beta1 = 0.0;
  o.grad_clip = 0.0;
  o.worker_class = NULL;
  EXPECT_OK(
      pcp_workloads_rl_trainer_create(&o, pcp_allocator_system(), &trainer));
  pcp_workloads_rl_trainer_release(trainer);
  pcp_workloads_rl_trainer_release(NULL);
}

static void create_copies_and_tables(void** state) {
  (void)state;
  char prefix[32] = "rl-job-2";
  pcp_workloads_rl_trainer_options_t o = valid_options();
  o.session_prefix = prefix;
  pcp_workloads_rl_trainer_t* trainer = NULL;
  EXPECT_OK(
      pcp_workloads_rl_trainer_create(&o, pcp_allocator_system(), &trainer));
  memset(prefix, 0, sizeof(prefix));  // the trainer holds its own copy
  const pcp_models_parameter_table_t* table =
      pcp_workloads_rl_trainer_table(trainer);
  pcp_models_parameter_table_t want;
  EXPECT_OK(pcp_models_parameter_table_initialize(
      &o.spec, pcp_allocator_system(), &want));
  assert_int_equal(table->count, want.count);
  assert_int_equal(table->total_elements, want.total_elements);
  for (size_t i = 0; i < want.count; ++i) {
    assert_string_equal(table->parameters[i].name, want.parameters[i].name);
  }

  // reference_set: NULL refused naming the tensor; a full set is copied.
  EXPECT_CODE(pcp_workloads_rl_trainer_reference_set(trainer, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "parameters");
  float* storage = NULL;
  EXPECT_OK(pcp_allocator_calloc(pcp_allocator_system(),
                                 (size_t)want.total_elements * sizeof(float),
                                 (void**)&storage));
  const float* tensors[64] = {0};
  assert_true(want.count <= 64);
  size_t at = 0;
  for (size_t i = 0; i < want.count; ++i) {
    tensors[i] = storage + at;
    at += (size_t)want.parameters[i].element_count;
  }
  const float* missing = tensors[1];
  tensors[1] = NULL;
  EXPECT_CODE(pcp_workloads_rl_trainer_reference_set(trainer, tensors),
              PCP_STATUS_INVALID_ARGUMENT, want.parameters[1].name);
  tensors[1] = missing;
  EXPECT_OK(pcp_workloads_rl_trainer_reference_set(trainer, tensors));
  EXPECT_OK(pcp_workloads_rl_trainer_reference_set(trainer, tensors));
  pcp_allocator_free(pcp_allocator_system(), storage);
  pcp_models_parameter_table_deinitialize(&want);
  pcp_workloads_rl_trainer_release(trainer);
}

typedef struct batch_storage_t {
  int32_t ids[8 * 8];
  int32_t targets[8 * 8];
  float mask[8 * 8];
  float old_logp[8 * 8];
  float ref_logp[8 * 8];
  float advantages[8];
} batch_storage_t;

static pcp_workloads_rl_batch_t batch_of(batch_storage_t* s, int64_t rows,
                                         int64_t length) {
  memset(s, 0, sizeof(*s));
  for (int i = 0; i < 64; ++i) {
    s->ref_logp[i] = 7.0f;  // a write would show
  }
  return (pcp_workloads_rl_batch_t){
      .allocator = pcp_allocator_system(),
      .rows = rows,
      .length = length,
      .input_ids = s->ids,
      .targets = s->targets,
      .mask = s->mask,
      .old_logp = s->old_logp,
      .ref_logp = s->ref_logp,
      .advantages = s->advantages,
  };
}

static void calls_refused_before_any_worker(void** state) {
  (void)state;
  pcp_workloads_rl_trainer_options_t o = valid_options();
  pcp_workloads_rl_trainer_t* trainer = NULL;
  EXPECT_OK(
      pcp_workloads_rl_trainer_create(&o, pcp_allocator_system(), &trainer));
  const pcp_models_parameter_table_t* table =
      pcp_workloads_rl_trainer_table(trainer);
  batch_storage_t s;
  pcp_workloads_rl_batch_t batch = batch_of(&s, 4, 8);

  // ref_logp: no reference yet, then bad temperatures and batches.
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_FAILED_PRECONDITION, "reference_set");
  float* storage = NULL;
  EXPECT_OK(pcp_allocator_calloc(
      pcp_allocator_system(), 3 * (size_t)table->total_elements * sizeof(float),
      (void**)&storage));
  float* params[64];
  float* m[64];
  float* v[64];
  size_t at = 0;
  for (size_t i = 0; i < table->count; ++i) {
    params[i] = storage + at;
    m[i] = storage + (size_t)table->total_elements + at;
    v[i] = storage + 2 * (size_t)table->total_elements + at;
    at += (size_t)table->parameters[i].element_count;
  }
  EXPECT_OK(pcp_workloads_rl_trainer_reference_set(
      trainer, (const float* const*)params));
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 0.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "temperature");
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, NAN, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "temperature");
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "batch");
  batch.rows = 3;  // not a multiple of B = 2
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "batch.rows");
  batch.rows = 0;
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "batch.rows");
  batch.rows = 4 * 32769;  // 65538 micro-batches of 2: over the cap
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "micro-batches");
  batch = batch_of(&s, 4, 7);
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "batch.length");
  batch = batch_of(&s, 4, 8);
  batch.mask = NULL;
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_INVALID_ARGUMENT, "batch");
  batch = batch_of(&s, 4, 8);
  g_stop = true;
  EXPECT_CODE(pcp_workloads_rl_trainer_ref_logp(trainer, 1.0, &batch),
              PCP_STATUS_CANCELLED, NULL);
  g_stop = false;
  for (int i = 0; i < 32; ++i) {
    assert_true(s.ref_logp[i] == 7.0f);  // nothing written
  }

  // update: each step parameter, then the batch (B x A = 4 rows).
  pcp_workloads_rl_step_params_t step = {.learning_rate = 1e-3,
                                         .step = 1,
                                         .clip_low = 0.2,
                                         .clip_high = 0.28,
                                         .beta = 0.04,
                                         .temperature = 1.0};
  pcp_workloads_rl_update_metrics_t metrics;
  struct {
    pcp_workloads_rl_step_params_t p;
    const char* needle;
  } bad[] = {
      {step, "learning_rate"}, {step, "learning_rate"}, {step, "step"},
      {step, "step"},          {step, "clip_low"},      {step, "clip_high"},
      {step, "beta"},          {step, "temperature"},
  };
  bad[0].p.learning_rate = -1e-3;
  bad[1].p.learning_rate = NAN;
  bad[2].p.step = 0;
  bad[3].p.step = ((int64_t)1 << 24) + 1;
  bad[4].p.clip_low = 0.0;
  bad[5].p.clip_high = 11.0;
  bad[6].p.beta = -0.5;
  bad[7].p.temperature = 0.0;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, &bad[i].p, &batch,
                                                params, m, v, &metrics),
                PCP_STATUS_INVALID_ARGUMENT, bad[i].needle);
  }
  EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, NULL, &batch, params, m,
                                              v, &metrics),
              PCP_STATUS_INVALID_ARGUMENT, "step_params");
  batch = batch_of(&s, 2, 8);  // one micro-batch, A = 2 needs 4 rows
  EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, &step, &batch, params, m,
                                              v, &metrics),
              PCP_STATUS_INVALID_ARGUMENT, "batch.rows");
  batch = batch_of(&s, 4, 8);
  EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, &step, &batch, NULL, m,
                                              v, &metrics),
              PCP_STATUS_INVALID_ARGUMENT, "parameters");
  float* saved = m[2];
  m[2] = NULL;
  EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, &step, &batch, params, m,
                                              v, &metrics),
              PCP_STATUS_INVALID_ARGUMENT, table->parameters[2].name);
  m[2] = saved;
  g_stop = true;
  EXPECT_CODE(pcp_workloads_rl_trainer_update(trainer, &step, &batch, params, m,
                                              v, &metrics),
              PCP_STATUS_CANCELLED, NULL);
  EXPECT_CODE(pcp_workloads_rl_trainer_prepare(trainer), PCP_STATUS_CANCELLED,
              NULL);
  g_stop = false;
  for (size_t e = 0; e < 3 * (size_t)table->total_elements; ++e) {
    assert_true(storage[e] == 0.0f);  // nothing written
  }
  pcp_allocator_free(pcp_allocator_system(), storage);
  pcp_workloads_rl_trainer_release(trainer);
}

// Every allocation of create failing in turn: RESOURCE_EXHAUSTED, nothing
// leaked (the failing allocator wraps a counting one).
static void create_out_of_memory(void** state) {
  (void)state;
  pcp_workloads_rl_trainer_options_t o = valid_options();
  for (int64_t fail_at = 0;; ++fail_at) {
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), fail_at,
                                     true, &failing);
    pcp_workloads_rl_trainer_t* trainer = NULL;
    pcp_status_t status = pcp_workloads_rl_trainer_create(
        &o, pcp_allocator_failing(&failing), &trainer);
    if (!status) {
      assert_true(failing.failure_count == 0);
      pcp_workloads_rl_trainer_release(trainer);
      assert_int_equal(counter.live_bytes, 0);
      assert_true(fail_at > 2);
      break;
    }
    assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
    pcp_status_ignore(status);
    assert_null(trainer);
    assert_int_equal(counter.live_bytes, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(create_validates_every_option),
      cmocka_unit_test(create_copies_and_tables),
      cmocka_unit_test(calls_refused_before_any_worker),
      cmocka_unit_test(create_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
