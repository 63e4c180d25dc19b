// SPDX-License-Identifier: Apache-2.0
//
// The emitters' scratch (the parameter table, the value slots) comes from
// the output builder's allocator, the caller's: a counting allocator sees it
// and an OOM sweep reaches it. Every failure is RESOURCE_EXHAUSTED, never a
// crash; under ASan nothing leaks. The text is the same whatever allocator
// the builder has.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "models/models.h"

typedef enum emit_kind_e { EMIT_TRAINING, EMIT_GENERATION } emit_kind_t;

static pcp_models_spec_t small_spec(pcp_models_architecture_t arch) {
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  spec.layers = 1;
  spec.heads = 2;
  spec.kv_heads = arch == PCP_MODELS_ARCHITECTURE_GPT ? 0 : 1;
  spec.width = 16;
  spec.vocab = 11;
  spec.block_size = 4;
  spec.batch = 1;
  return spec;
}

static pcp_status_t emit(emit_kind_t kind, const pcp_models_spec_t* spec,
                         pcp_string_builder_t* builder) {
  if (kind == EMIT_TRAINING)
    return pcp_models_module_emit(spec, builder);
  pcp_models_generation_t gen = {
      .slots = 1, .max_length = 4, .prefill_length = 2};
  return pcp_models_generation_module_emit(spec, &gen, builder);
}

static void check_emitter(emit_kind_t kind, pcp_models_architecture_t arch) {
  pcp_models_spec_t spec = small_spec(arch);
  pcp_string_builder_t expected;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &expected);
  PCP_CHECK_OK(emit(kind, &spec, &expected));

  // A builder already large enough: any allocation the emitter makes
  // through the builder's allocator is its scratch, freed before it returns.
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_string_builder_t out;
  pcp_string_builder_initialize(pcp_allocator_counting(&counting), 0, &out);
  PCP_CHECK_OK(pcp_string_builder_append(
      &out, pcp_make_string_view(expected.data, expected.size)));
  pcp_string_builder_reset(&out);
  int64_t allocations = counting.allocation_count;
  int64_t live = counting.live_bytes;
  PCP_CHECK_OK(emit(kind, &spec, &out));
  assert_true(counting.allocation_count > allocations);
  assert_int_equal(counting.live_bytes, live);
  assert_int_equal(out.size, expected.size);
  assert_memory_equal(out.data, expected.data, expected.size);
  pcp_string_builder_deinitialize(&out);
  assert_int_equal(counting.live_bytes, 0);

  // Fail allocation n (and every later one) for every n until it succeeds.
  bool succeeded = false;
  int64_t failures = 0;
  for (int64_t n = 0; n < 10000 && !succeeded; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_string_builder_initialize(pcp_allocator_failing(&failing), 0, &out);
    pcp_status_t status = emit(kind, &spec, &out);
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
      ++failures;
    } else {
      assert_int_equal(out.size, expected.size);
      assert_memory_equal(out.data, expected.data, expected.size);
      succeeded = true;
    }
    pcp_string_builder_deinitialize(&out);
  }
  assert_true(succeeded);
  assert_true(failures > 0);
  pcp_string_builder_deinitialize(&expected);
}

static void test_training_module_scratch(void** state) {
  (void)state;
  check_emitter(EMIT_TRAINING, PCP_MODELS_ARCHITECTURE_GPT);
  check_emitter(EMIT_TRAINING, PCP_MODELS_ARCHITECTURE_QWEN3);
}

static void test_generation_module_scratch(void** state) {
  (void)state;
  check_emitter(EMIT_GENERATION, PCP_MODELS_ARCHITECTURE_GPT);
  check_emitter(EMIT_GENERATION, PCP_MODELS_ARCHITECTURE_QWEN3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_training_module_scratch),
      cmocka_unit_test(test_generation_module_scratch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
