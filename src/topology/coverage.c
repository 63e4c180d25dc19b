// SPDX-License-Identifier: Apache-2.0
//
// Coverage metadata (reference s.5.1): which protocol surfaces each task's
// carrier stands for, so that CI can say which implemented paths have a
// topology model and which do not. The sources name the definitions the
// models run today (protocol_stubs.c); they move to src/proto and src/sched
// when those modules replace the stubs.

#include <string.h>

#include "topology/protocols_impl.h"

#define STUBS "src/topology/protocol_stubs.c"
// The decoupled window runs the library state machine there.
#define DECOUPLED "src/topology/decoupled_model.c"
#define T(x) PCP_TOPOLOGY_TASK_##x
#define NO_TASK (-1)

static const pcp_topology_coverage_path_t kDefaultPaths[] = {
    {"message_registry.protocol_messages", T(MESSAGE_DISPATCH),
     STUBS "#message_catalogue", false},
    {"message_registry.worker_handler_registry", T(MESSAGE_DISPATCH),
     STUBS "#worker_handlers", false},
    {"message_registry.family_capabilities", T(MESSAGE_DISPATCH),
     STUBS "#message_families", false},
    {"workload.request_kind", T(WORKLOAD_NORMALIZATION),
     STUBS "#training_kind_from_request_body", false},
    {"workload.route", T(WORKLOAD_NORMALIZATION), STUBS "#workload_route",
     false},
    {"workload.status", T(WORKLOAD_NORMALIZATION), STUBS "#workload_route",
     false},
    {"workload.resume_label", T(WORKLOAD_NORMALIZATION),
     "src/topology/models.c#extract_workload", false},
    {"scheduling.lease_owner", T(GATEWAY_LEASE_SCHEDULING),
     STUBS "#sched_policies", false},
    {"scheduling.worker_state", T(GATEWAY_LEASE_SCHEDULING),
     STUBS "#sched_worker_state", false},
    {"scheduling.decision.admission", T(GATEWAY_LEASE_SCHEDULING),
     STUBS "#sched_reserve", false},
    {"scheduling.violation.admission", T(GATEWAY_LEASE_SCHEDULING),
     STUBS "#sched_reserve", false},
    {"reservation.decision.lifecycle", T(RESERVATION_LIFECYCLE),
     STUBS "#sched_commit_release_expire", false},
    {"reservation.violation.lifecycle", T(RESERVATION_LIFECYCLE),
     STUBS "#sched_commit_release_expire", false},
    {"reservation.queue_state", T(RESERVATION_LIFECYCLE), STUBS "#sched_queue",
     false},
    {"federation.operations.gateway_connect", T(FEDERATION_PLACEMENT),
     STUBS "#federation_register", false},
    {"federation.operations.mutation_batch", T(FEDERATION_PLACEMENT),
     STUBS "#federation_mark_stale", false},
    {"federation.gateway_status", T(FEDERATION_PLACEMENT),
     STUBS "#federation_gateway", false},
    {"federation.service_health", T(FEDERATION_PLACEMENT),
     STUBS "#federation_service", false},
    {"federation.placement_decision", T(FEDERATION_PLACEMENT),
     STUBS "#federation_place", false},
    {"federation.placement_violation", T(FEDERATION_PLACEMENT),
     STUBS "#federation_place", false},
    {"decoupled.worker_status", T(DECOUPLED_FRAGMENT),
     DECOUPLED "#decoupled_window", false},
    {"decoupled.action_tag", T(DECOUPLED_FRAGMENT),
     DECOUPLED "#decoupled_apply", false},
    {"decoupled.decision", T(DECOUPLED_FRAGMENT), DECOUPLED "#decoupled_apply",
     false},
    {"decoupled.violation", T(DECOUPLED_FRAGMENT), DECOUPLED "#decoupled_apply",
     false},
    {"decoupled.crash_restart_resume", T(DECOUPLED_FRAGMENT),
     DECOUPLED "#decoupled_apply", false},
    {"rda.merge_kind", T(RDA_MERGE), DECOUPLED "#rda_merge_real", false},
    {"rda.violation", T(RDA_MERGE), STUBS "#rda_merge", false},
    {"rda.local_view_compatibility", T(RDA_MERGE),
     "src/topology/maps.c#shared_view_check", false},
    {"federation.operations.global_job", T(MULTI_GATEWAY_GLOBAL_JOB),
     "design: hub global-job operations", true},
    {"global_job.design_state", T(MULTI_GATEWAY_GLOBAL_JOB),
     "design: global job state machine", true},
    {"global_job.partial_loss", T(MULTI_GATEWAY_GLOBAL_JOB),
     "design: partial gateway loss", true},
};

const pcp_topology_coverage_path_t* pcp_topology_coverage_default_paths(
    size_t* out_count) {
  *out_count = PCP_ARRAYSIZE(kDefaultPaths);
  return kDefaultPaths;
}

// The path ids each task's definition claims (kept apart from the path
// table so a stale claim or a mismatch between the two is caught).
static const char* const kTaskPaths[PCP_TOPOLOGY_TASK_KIND_COUNT_][8] = {
    {"message_registry.protocol_messages",
     "message_registry.worker_handler_registry",
     "message_registry.family_capabilities"},
    {"workload.request_kind", "workload.route", "workload.status",
     "workload.resume_label"},
    {"scheduling.lease_owner", "scheduling.worker_state",
     "scheduling.decision.admission", "scheduling.violation.admission"},
    {"reservation.decision.lifecycle", "reservation.violation.lifecycle",
     "reservation.queue_state"},
    {"federation.operations.gateway_connect",
     "federation.operations.mutation_batch", "federation.gateway_status",
     "federation.service_health", "federation.placement_decision",
     "federation.placement_violation"},
    {"decoupled.worker_status", "decoupled.action_tag", "decoupled.decision",
     "decoupled.violation", "decoupled.crash_restart_resume"},
    {"rda.merge_kind", "rda.violation", "rda.local_view_compatibility"},
    {"federation.operations.global_job", "global_job.design_state",
     "global_job.partial_loss"},
};

size_t pcp_topology_task_coverage_paths(pcp_topology_task_kind_t kind,
                                        const char* const** out_ids) {
  if ((unsigned)kind >= PCP_TOPOLOGY_TASK_KIND_COUNT_) {
    *out_ids = NULL;
    return 0;
  }
  *out_ids = kTaskPaths[kind];
  size_t count = 0;
  while (count < PCP_ARRAYSIZE(kTaskPaths[kind]) && kTaskPaths[kind][count]) {
    ++count;
  }
  return count;
}

void pcp_topology_coverage_summarize(const pcp_topology_coverage_path_t* paths,
                                     size_t count,
                                     pcp_topology_coverage_summary_t* out) {
  memset(out, 0, sizeof(*out));
  out->total = count;
  for (size_t i = 0; i < count; ++i) {
    if (paths[i].design_only) {
      out->design_only++;
      continue;
    }
    out->implemented++;
    if (paths[i].task >= 0) {
      out->covered++;
    } else {
      out->uncovered++;
    }
  }
}

static const pcp_topology_coverage_path_t* find_path(
    const pcp_topology_coverage_path_t* paths, size_t count, const char* id) {
  for (size_t i = 0; i < count; ++i) {
    if (strcmp(paths[i].id, id) == 0)
      return &paths[i];
  }
  return NULL;
}

pcp_status_t pcp_topology_coverage_validate(
    const pcp_topology_coverage_path_t* paths, size_t count, bool strict) {
  // 1. Task metadata against the path list.
  size_t task_count = 0;
  const pcp_topology_task_definition_t* tasks =
      pcp_topology_task_catalog(&task_count);
  for (size_t t = 0; t < task_count; ++t) {
    const char* const* ids = NULL;
    size_t id_count = pcp_topology_task_coverage_paths(tasks[t].kind, &ids);
    if (id_count == 0) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_TASK_COVERAGE_PATHS,
          "task %s lists no coverage paths", tasks[t].name);
    }
    if (tasks[t].design_only &&
        tasks[t].kind != PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_UNEXPECTED_DESIGN_ONLY_TASK,
          "task %s is design-only", tasks[t].name);
    }
    for (size_t i = 0; i < id_count; ++i) {
      const pcp_topology_coverage_path_t* path =
          find_path(paths, count, ids[i]);
      if (!path) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_STALE_TASK_COVERAGE_PATH,
            "task %s claims unknown path %s", tasks[t].name, ids[i]);
      }
      if (path->task < 0) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_TASK_COVERAGE_PATH_UNMAPPED,
            "path %s claimed by %s has no task", ids[i], tasks[t].name);
      }
      if (path->task != (int32_t)tasks[t].kind) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_TASK_COVERAGE_PATH_MISMATCH,
            "path %s is claimed by %s but maps to another task", ids[i],
            tasks[t].name);
      }
      if (path->design_only != tasks[t].design_only) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_TASK_COVERAGE_DESIGN_ONLY_MISMATCH,
            "path %s and task %s disagree on design_only", ids[i],
            tasks[t].name);
      }
    }
  }
  // 2. The path list itself.
  for (size_t i = 0; i < count; ++i) {
    if (!paths[i].id || !*paths[i].id || !paths[i].source ||
        !*paths[i].source) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "coverage path %zu has an empty id or source", i);
    }
    for (size_t j = 0; j < i; ++j) {
      if (strcmp(paths[i].id, paths[j].id) == 0) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DUPLICATE_COVERAGE_PATH,
            "coverage path %s appears twice", paths[i].id);
      }
    }
    if (paths[i].task >= 0) {
      const pcp_topology_task_definition_t* def =
          pcp_topology_task_definition((pcp_topology_task_kind_t)paths[i].task);
      if (!def || def->design_only != paths[i].design_only) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_TASK_COVERAGE_DESIGN_ONLY_MISMATCH,
            "path %s and its task disagree on design_only", paths[i].id);
      }
    }
  }
  // 3. Strict: every implemented path has a topology task.
  for (size_t i = 0; strict && i < count; ++i) {
    if (!paths[i].design_only && paths[i].task < 0) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_UNCOVERED_IMPLEMENTED_PRODUCTION_PATH,
          "implemented path %s (%s) has no topology task", paths[i].id,
          paths[i].source);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_coverage_summary_format(
    const pcp_topology_coverage_path_t* paths, size_t count,
    pcp_string_builder_t* b) {
  pcp_topology_coverage_summary_t summary;
  pcp_topology_coverage_summarize(paths, count, &summary);
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      "pcp topology coverage summary: total=%zu implemented=%zu covered=%zu "
      "design_only=%zu uncovered=%zu\n",
      summary.total, summary.implemented, summary.covered, summary.design_only,
      summary.uncovered));
  size_t task_count = 0;
  const pcp_topology_task_definition_t* tasks =
      pcp_topology_task_catalog(&task_count);
  for (size_t t = 0; t < task_count; ++t) {
    size_t path_count = 0;
    for (size_t i = 0; i < count; ++i) {
      path_count += paths[i].task == (int32_t)tasks[t].kind;
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "- %s: paths=%zu evidence=%s%s\n", tasks[t].name, path_count,
        pcp_topology_evidence_name(tasks[t].evidence),
        tasks[t].design_only ? " design_only=true" : ""));
  }
  for (size_t i = 0; i < count; ++i) {
    if (!paths[i].design_only && paths[i].task < 0) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "- uncovered: %s source=%s\n", paths[i].id, paths[i].source));
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Mapping protocol values to coverage paths
//===----------------------------------------------------------------------===//

const char* pcp_topology_coverage_path_for_message(
    const pcp_topology_message_entry_t* entry,
    pcp_topology_message_aspect_t aspect) {
  if (!entry)
    return NULL;  // unknown messages map nowhere
  switch (aspect) {
    case PCP_TOPOLOGY_MESSAGE_ASPECT_ENTRY:
      return "message_registry.protocol_messages";
    case PCP_TOPOLOGY_MESSAGE_ASPECT_FAMILY:
      return "message_registry.family_capabilities";
    case PCP_TOPOLOGY_MESSAGE_ASPECT_HANDLER:
      return entry->handler == PCP_TOPOLOGY_HANDLER_NONE
                 ? NULL
                 : "message_registry.worker_handler_registry";
  }
  return NULL;
}

const char* pcp_topology_coverage_path_for_federation_operation(
    const char* name) {
  if (!name)
    return NULL;
  if (strcmp(name, "gateway_connect") == 0) {
    return "federation.operations.gateway_connect";
  }
  if (strcmp(name, "mutation_batch") == 0) {
    return "federation.operations.mutation_batch";
  }
  if (strcmp(name, "reservation_commit") == 0 ||
      strcmp(name, "reservation_release") == 0) {
    return "reservation.decision.lifecycle";
  }
  if (strncmp(name, "global_", 7) == 0) {
    return "federation.operations.global_job";
  }
  return NULL;
}

const char* pcp_topology_coverage_path_for_sched_decision(
    pcp_topology_sched_decision_t decision) {
  switch (decision) {
    case PCP_TOPOLOGY_SCHED_IDLE:
    case PCP_TOPOLOGY_SCHED_RESERVED:
    case PCP_TOPOLOGY_SCHED_QUEUED:
    case PCP_TOPOLOGY_SCHED_REJECTED:
      return "scheduling.decision.admission";
    default:
      return "reservation.decision.lifecycle";
  }
}

const char* pcp_topology_coverage_path_for_sched_violation(
    pcp_topology_sched_violation_t violation) {
  switch (violation) {
    case PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_JOB_RESERVATION:
    case PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_WORKER_RESERVATION:
    case PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_QUEUED_JOB:
    case PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_NOT_FOUND:
    case PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND:
    case PCP_TOPOLOGY_SCHED_VIOLATION_ACTIVE_JOB_NOT_FOUND:
      return "reservation.violation.lifecycle";
    default:
      return "scheduling.violation.admission";
  }
}

const char* pcp_topology_coverage_path_for_decoupled_action(
    pcp_topology_decoupled_action_kind_t action) {
  switch (action) {
    case PCP_TOPOLOGY_DECOUPLED_CRASH:
    case PCP_TOPOLOGY_DECOUPLED_RESTART:
      return "decoupled.crash_restart_resume";
    default:
      return "decoupled.action_tag";
  }
}

const char* pcp_topology_coverage_path_for_global_job_state(
    pcp_topology_global_job_state_t state) {
  (void)state;
  return "global_job.design_state";
}

const char* pcp_topology_coverage_path_for_rda_violation(const char* name) {
  if (!name)
    return NULL;
  return strcmp(name, "incompatible_local_views") == 0
             ? "rda.local_view_compatibility"
             : "rda.violation";
}
