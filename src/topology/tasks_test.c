// SPDX-License-Identifier: Apache-2.0
//
// The task catalogue (reference s.6, tasks.zig tests).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

// Does the task carry |outputs| (labels in case colour order) from the
// input of case |case_index|?
static bool task_carries(const pcp_topology_task_t* task, size_t case_index,
                         const char* const* outputs) {
  const pcp_topology_task_case_t* c = &task->definition->cases[case_index];
  pcp_topology_vertex_t in[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_vertex_t out[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_task_case_vertices(c, -1, in);
  for (uint32_t i = 0; i < c->color_count; ++i) {
    out[i] = pcp_topology_make_vertex(c->colors[i],
                                      pcp_topology_make_symbol(outputs[i]));
  }
  return pcp_topology_carrier_map_carries(
      task->carrier, pcp_topology_make_simplex(in, c->color_count),
      pcp_topology_make_simplex(out, c->color_count));
}

static void build(pcp_topology_task_kind_t kind, pcp_topology_task_t* task) {
  PCP_CHECK_OK(pcp_topology_task_build(kind, pcp_allocator_system(), task));
}

// catalog exposes every milestone PCP task
static void test_catalog_exposes_every_task(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_task_definition_t* tasks =
      pcp_topology_task_catalog(&count);
  assert_int_equal(count, 8);
  size_t design_only = 0;
  for (size_t i = 0; i < count; ++i) {
    assert_int_equal(tasks[i].kind, (pcp_topology_task_kind_t)i);
    design_only += tasks[i].design_only;
    assert_ptr_equal(
        pcp_topology_task_find(pcp_make_cstring_view(tasks[i].name)),
        &tasks[i]);
  }
  assert_int_equal(design_only, 1);
  assert_true(tasks[PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB].design_only);
  assert_string_equal(
      pcp_topology_evidence_name(
          tasks[PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE].evidence),
      "generated_Xi");
  assert_null(pcp_topology_task_find(pcp_make_cstring_view("nope")));
}

// every PCP task builds as a chromatic monotone carrier
static void test_every_task_builds_chromatic_monotone(void** state) {
  (void)state;
  for (int k = 0; k < PCP_TOPOLOGY_TASK_KIND_COUNT_; ++k) {
    pcp_topology_task_t task;
    build((pcp_topology_task_kind_t)k, &task);
    pcp_topology_carrier_checks_t checks =
        pcp_topology_carrier_checks_default();
    checks.chromatic = true;
    PCP_CHECK_OK(pcp_topology_carrier_map_validate(task.carrier, checks));
    assert_int_equal(pcp_topology_complex_count(task.input),
                     task.definition->case_count);
    pcp_topology_task_deinitialize(&task);
  }
}

// message dispatch task fails closed for worker-result and unknown messages
static void test_message_dispatch_fails_closed(void** state) {
  (void)state;
  pcp_topology_task_t task;
  build(PCP_TOPOLOGY_TASK_MESSAGE_DISPATCH, &task);
  const char* queue_only[] = {"dispatch.gateway_queue_only",
                              "rejected.worker_result_to_worker"};
  const char* forwarded[] = {"dispatch.controller_to_worker",
                             "accepted.decoupled_training"};
  const char* fail_closed[] = {"dispatch.fail_closed",
                               "rejected.unknown_message"};
  assert_true(task_carries(&task, 2, queue_only));
  assert_false(task_carries(&task, 2, forwarded));
  assert_true(task_carries(&task, 3, fail_closed));
  assert_false(task_carries(&task, 3, forwarded));
  assert_true(task_carries(&task, 0, forwarded));
  pcp_topology_task_deinitialize(&task);
}

// reservation lifecycle task separates commit release expiry and
// cancellation cleanup
static void test_reservation_lifecycle_separates_outcomes(void** state) {
  (void)state;
  pcp_topology_task_t task;
  build(PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE, &task);
  const char* committed[] = {"reservation.committed", "job.queued_reserved",
                             "worker.leased.training"};
  const char* released[] = {"reservation.released", "job.not_queued",
                            "worker.idle"};
  const char* expired[] = {"reservation.expired", "job.not_queued",
                           "worker.idle"};
  const char* cleanup[] = {"reservation.canceled.cleanup_complete",
                           "job.canceled", "worker.idle"};
  assert_true(task_carries(&task, 0, committed));
  assert_true(task_carries(&task, 1, released));
  assert_true(task_carries(&task, 2, expired));
  assert_true(task_carries(&task, 3, cleanup));
  assert_false(task_carries(&task, 3, released));
  assert_false(task_carries(&task, 1, expired));
  pcp_topology_task_deinitialize(&task);
}

// federation placement task allows only compatible placement loss
// alternatives
static void test_federation_allows_loss_only_when_compatible(void** state) {
  (void)state;
  pcp_topology_task_t task;
  build(PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT, &task);
  const char* placed[] = {"placement.placed", "gateway.route.accepted",
                          "job.forwarded"};
  const char* lost[] = {"placement.failed_after_loss", "gateway.route_lost",
                        "job.failed_retryable"};
  const char* stale[] = {"placement.rejected.stale", "gateway.not_selected",
                         "job.rejected"};
  assert_true(task_carries(&task, 0, placed));
  assert_true(task_carries(&task, 0, lost));
  assert_false(task_carries(&task, 1, lost));
  assert_true(task_carries(&task, 1, stale));
  assert_false(task_carries(&task, 2, placed));
  pcp_topology_task_deinitialize(&task);
}

// RDA task carries direction norm and degenerate zero outputs separately
static void test_rda_separates_direction_and_zero(void** state) {
  (void)state;
  pcp_topology_task_t task;
  build(PCP_TOPOLOGY_TASK_RDA_MERGE, &task);
  const char* carried[] = {"rda.output.direction_norm_carried",
                           "merge.committed", "participants.used"};
  const char* zero[] = {"rda.output.zero", "merge.committed",
                        "participants.canceling_direction"};
  assert_true(task_carries(&task, 0, carried));
  assert_false(task_carries(&task, 0, zero));
  assert_true(task_carries(&task, 1, zero));
  assert_false(task_carries(&task, 1, carried));
  pcp_topology_task_deinitialize(&task);
}

// global job task includes rollback cancel and capacity states
static void test_global_job_states(void** state) {
  (void)state;
  pcp_topology_task_t task;
  build(PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB, &task);
  const char* rollback[] = {"global_job.rollback", "job.retryable",
                            "gateway_a.release", "gateway_b.failed"};
  const char* canceled[] = {"global_job.canceled", "job.canceled",
                            "gateway_a.cleanup", "gateway_b.cleanup"};
  const char* deferred[] = {"global_job.deferred", "job.queued",
                            "gateway_a.hold_or_release",
                            "gateway_b.await_capacity"};
  assert_true(task_carries(&task, 1, rollback));
  assert_true(task_carries(&task, 2, canceled));
  assert_true(task_carries(&task, 3, deferred));
  assert_int_equal(pcp_topology_complex_dimension(task.input), 3);
  pcp_topology_task_deinitialize(&task);
}

static void test_bad_cases_are_rejected(void** state) {
  (void)state;
  // Two cases share the whole input: the face has two owners.
  static const pcp_topology_task_case_t kAmbiguous[] = {
      {1, {{PCP_TOPOLOGY_COLOR_GATEWAY, 0}}, {"a"}, 1, {{"x"}}},
      {1, {{PCP_TOPOLOGY_COLOR_GATEWAY, 0}}, {"a"}, 1, {{"y"}}},
  };
  pcp_topology_task_t task;
  pcp_status_t status = pcp_topology_task_build_from_cases(
      kAmbiguous, 2, pcp_allocator_system(), &task);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_UNCOVERED_TASK_FACE);
  pcp_status_ignore(status);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_catalog_exposes_every_task),
      cmocka_unit_test(test_every_task_builds_chromatic_monotone),
      cmocka_unit_test(test_message_dispatch_fails_closed),
      cmocka_unit_test(test_reservation_lifecycle_separates_outcomes),
      cmocka_unit_test(test_federation_allows_loss_only_when_compatible),
      cmocka_unit_test(test_rda_separates_direction_and_zero),
      cmocka_unit_test(test_global_job_states),
      cmocka_unit_test(test_bad_cases_are_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
