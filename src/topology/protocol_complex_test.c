// SPDX-License-Identifier: Apache-2.0
//
// Protocol-complex generation (reference s.6, protocol_complex.zig tests,
// same expected numbers). The toy extractor labels every vertex of the
// face with protocol(number of local_step_complete events in the trace).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

#define P(i) pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, (i))

static const pcp_topology_process_t kProcesses[2] = {{0, {6, 0}}, {1, {6, 1}}};

static pcp_topology_event_t lsc(uint16_t actor) {
  pcp_topology_event_t e = {PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE, actor,
                            PCP_TOPOLOGY_NO_NODE, 0};
  return e;
}

static pcp_status_t toy_views(void* user_data, pcp_topology_simplex_t face,
                              uint64_t seed, const pcp_topology_event_t* events,
                              size_t count,
                              pcp_topology_vertex_list_t* out_view,
                              uint64_t* out_state_hash) {
  (void)user_data;
  int64_t steps = 0;
  for (size_t i = 0; i < count; ++i) {
    steps += events[i].tag == PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE;
  }
  for (uint32_t v = 0; v < face.count; ++v) {
    pcp_topology_vertex_t view = pcp_topology_make_vertex(
        face.vertices[v].color,
        pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, steps));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_list_append(out_view, &view));
  }
  *out_state_hash = seed * 31u + (uint64_t)steps;
  return pcp_ok_status();
}

static pcp_topology_complex_t* input_edge(void) {
  pcp_topology_complex_t* input = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &input));
  pcp_topology_vertex_t edge[2] = {
      pcp_topology_make_vertex(
          P(0), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, 0)),
      pcp_topology_make_vertex(
          P(1), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, 1)),
  };
  PCP_CHECK_OK(pcp_topology_complex_add(
      input, pcp_topology_make_simplex(edge, 2), NULL));
  return input;
}

// event alphabet covers milestone execution vocabulary
static void test_event_alphabet_covers_vocabulary(void** state) {
  (void)state;
  size_t count = 0;
  for (int t = 0; t < PCP_TOPOLOGY_EVENT_TAG_COUNT_; ++t) {
    count += pcp_topology_event_tag_is_execution_vocabulary(
        (pcp_topology_event_tag_t)t);
  }
  assert_int_equal(count, 16);
  pcp_topology_event_t bad = {PCP_TOPOLOGY_EVENT_SEND, 0, 7, 1};
  assert_int_equal(pcp_status_consume_code(pcp_topology_event_alphabet_validate(
                       kProcesses, 2, &bad, 1)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_topology_process_t twins[2] = {{0, {6, 0}}, {1, {6, 0}}};
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_process_set_validate(twins, 2)),
      PCP_STATUS_INVALID_ARGUMENT);
}

// exhaustive generation builds protocol complex execution carrier and
// witnesses
static void test_exhaustive_generation_builds_complex(void** state) {
  (void)state;
  pcp_topology_complex_t* input = input_edge();
  pcp_topology_event_t alphabet[2] = {lsc(0), lsc(1)};
  pcp_topology_generation_options_t options =
      pcp_topology_generation_options_default();
  options.depth = 1;
  pcp_topology_protocol_complex_t result;
  pcp_topology_protocol_complex_initialize(pcp_allocator_system(), &result);
  PCP_CHECK_OK(pcp_topology_protocol_complex_generate_exhaustive(
      input, kProcesses, 2, alphabet, 2, options, toy_views, NULL, &result));
  assert_int_equal(result.trace_count, 4);
  pcp_topology_vertex_t both[2] = {
      pcp_topology_make_vertex(
          P(0), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, 1)),
      pcp_topology_make_vertex(
          P(1), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, 1)),
  };
  assert_true(pcp_topology_complex_contains(
      result.protocol, pcp_topology_make_simplex(both, 2)));
  for (size_t i = 0; i < result.trace_count; ++i) {
    assert_true(result.witnesses[i].event_count == 1);
    assert_true(result.witnesses[i].protocol_index <
                pcp_topology_complex_count(result.protocol));
  }
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(
      result.execution, pcp_topology_carrier_checks_default()));
  pcp_topology_protocol_complex_deinitialize(&result);
  pcp_topology_complex_release(input);
}

// partial-order reduction skips swapped independent schedules
static void test_partial_order_reduction(void** state) {
  (void)state;
  assert_true(pcp_topology_events_independent(lsc(0), lsc(1)));
  pcp_topology_event_t prefix0 = lsc(0), prefix1 = lsc(1);
  assert_true(pcp_topology_partial_order_allows(&prefix0, 1, lsc(1)));
  assert_false(pcp_topology_partial_order_allows(&prefix1, 1, lsc(0)));
  pcp_topology_complex_t* input = input_edge();
  pcp_topology_event_t alphabet[2] = {lsc(0), lsc(1)};
  pcp_topology_generation_options_t options =
      pcp_topology_generation_options_default();
  options.depth = 2;
  pcp_topology_protocol_complex_t result;
  pcp_topology_protocol_complex_initialize(pcp_allocator_system(), &result);
  PCP_CHECK_OK(pcp_topology_protocol_complex_generate_exhaustive(
      input, kProcesses, 2, alphabet, 2, options, toy_views, NULL, &result));
  assert_int_equal(result.trace_count, 5);
  // Without the reduction the swapped schedule comes back: 1 + 1 + 4.
  options.partial_order_reduction = false;
  PCP_CHECK_OK(pcp_topology_protocol_complex_generate_exhaustive(
      input, kProcesses, 2, alphabet, 2, options, toy_views, NULL, &result));
  assert_int_equal(result.trace_count, 6);
  options.depth = PCP_TOPOLOGY_MAX_GENERATION_DEPTH + 1;
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_protocol_complex_generate_exhaustive(
          input, kProcesses, 2, alphabet, 2, options, toy_views, NULL,
          &result)),
      PCP_STATUS_INVALID_ARGUMENT);
  pcp_topology_protocol_complex_deinitialize(&result);
  pcp_topology_complex_release(input);
}

// seeded random generation is deterministic
static void test_seeded_random_generation_is_deterministic(void** state) {
  (void)state;
  pcp_topology_complex_t* input = input_edge();
  pcp_topology_event_t alphabet[3] = {
      lsc(0), lsc(1), {PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0}};
  pcp_topology_generation_options_t options =
      pcp_topology_generation_options_default();
  options.seed = 11;
  options.depth = 3;
  options.traces_per_face = 4;
  pcp_topology_protocol_complex_t a, b;
  pcp_topology_protocol_complex_initialize(pcp_allocator_system(), &a);
  pcp_topology_protocol_complex_initialize(pcp_allocator_system(), &b);
  PCP_CHECK_OK(pcp_topology_protocol_complex_generate_random(
      input, kProcesses, 2, alphabet, 3, options, toy_views, NULL, &a));
  PCP_CHECK_OK(pcp_topology_protocol_complex_generate_random(
      input, kProcesses, 2, alphabet, 3, options, toy_views, NULL, &b));
  // Four traces on each of the three non-empty faces (upstream's "4
  // traces": the per-trace seed mixes the face and k < 4).
  assert_int_equal(a.trace_count, 12);
  assert_int_equal(b.trace_count, 12);
  size_t per_face[8] = {0};
  for (size_t i = 0; i < a.trace_count; ++i) {
    assert_true(a.witnesses[i].input_index < 8);
    per_face[a.witnesses[i].input_index]++;
  }
  size_t faces_seen = 0;
  for (size_t f = 0; f < 8; ++f) {
    if (per_face[f] == 0) {
      continue;
    }
    assert_int_equal(per_face[f], 4);
    faces_seen++;
  }
  assert_int_equal(faces_seen, 3);
  for (size_t i = 0; i < a.trace_count; ++i) {
    assert_int_equal(a.traces[i].seed, b.traces[i].seed);
    assert_int_equal(a.witnesses[i].state_hash, b.witnesses[i].state_hash);
    assert_int_equal(a.witnesses[i].protocol_index,
                     b.witnesses[i].protocol_index);
    assert_int_equal(a.traces[i].event_count, 3);
    for (size_t e = 0; e < 3; ++e) {
      assert_int_equal(pcp_topology_event_hash(a.traces[i].events[e]),
                       pcp_topology_event_hash(b.traces[i].events[e]));
    }
  }
  pcp_topology_protocol_complex_deinitialize(&a);
  pcp_topology_protocol_complex_deinitialize(&b);
  pcp_topology_complex_release(input);
}

// trace shrinking preserves the same generated protocol simplex
static void test_trace_shrinking_preserves_protocol_simplex(void** state) {
  (void)state;
  pcp_topology_complex_t* input = input_edge();
  pcp_topology_simplex_t face = pcp_topology_complex_simplex(input, 0);
  pcp_topology_event_t events[2] = {{PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0},
                                    lsc(0)};
  pcp_topology_vertex_t target[2] = {
      pcp_topology_make_vertex(
          P(0), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, 1)),
      pcp_topology_make_vertex(
          P(1), pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, 1)),
  };
  pcp_topology_shrink_result_t result;
  PCP_CHECK_OK(pcp_topology_trace_shrink_to_protocol_simplex(
      toy_views, NULL, face, pcp_topology_make_simplex(target, 2), 5, events, 2,
      pcp_allocator_system(), &result));
  assert_int_equal(result.event_count, 1);
  assert_int_equal(result.events[0].tag,
                   PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE);
  assert_int_equal(result.deleted, 1);
  pcp_topology_shrink_result_deinitialize(pcp_allocator_system(), &result);
  // A trace that never reaches the target is refused.
  target[0].label.value = 7;
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_trace_shrink_to_protocol_simplex(
          toy_views, NULL, face, pcp_topology_make_simplex(target, 2), 5,
          events, 2, pcp_allocator_system(), &result)),
      PCP_STATUS_FAILED_PRECONDITION);
  pcp_topology_complex_release(input);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_alphabet_covers_vocabulary),
      cmocka_unit_test(test_exhaustive_generation_builds_complex),
      cmocka_unit_test(test_partial_order_reduction),
      cmocka_unit_test(test_seeded_random_generation_is_deterministic),
      cmocka_unit_test(test_trace_shrinking_preserves_protocol_simplex),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
