// SPDX-License-Identifier: Apache-2.0
//
// The connection glue's decisions, sans I/O (fabric.h, "Connection glue"):
// no sockets, no libuv, no threads, no clock. fabric_workers.c and
// fabric_conn.c act on them for real connections; src/sim runs the same
// code for its simulated ones, so a bug here shows up in the simulation.

#include <stdio.h>
#include <string.h>

#include "fabric/fabric.h"

#if defined(PCP_FABRIC_GLUE_SEEDED_BUGS)
// Test-only: src/sim's seeded-bug build compiles this file a second time
// with the flag (src/sim/CMakeLists.txt), so that a bug in the shared
// decision reaches the simulation through the shared code path. The fabric
// library is never built with it.
bool pcp_fabric_glue_seeded_epoch_kept = false;
#endif

static void join_reject(pcp_fabric_join_decision_t* d,
                        pcp_proto_reject_reason_t reason, const char* message) {
  d->verdict = PCP_FABRIC_JOIN_REJECT;
  d->reject_reason = reason;
  snprintf(d->message, sizeof(d->message), "%s", message);
}

void pcp_fabric_join_decide(const pcp_proto_join_t* join,
                            const pcp_fabric_join_record_t* record,
                            bool registry_has_room, int64_t now_ns,
                            const pcp_proto_timeouts_t* timeouts,
                            pcp_fabric_join_decision_t* out_decision) {
  pcp_fabric_join_decision_t* d = out_decision;
  memset(d, 0, sizeof(*d));
  if (!pcp_sched_backend_parse(pcp_make_cstring_view(join->backend),
                               &d->backend)) {
    join_reject(d, PCP_PROTO_REJECT_BAD_JOIN, "unknown backend");
    return;
  }
  if (strlen(join->worker_id) > PCP_SCHED_WORKER_ID_MAX_LENGTH ||
      strlen(join->target) > PCP_SCHED_TARGET_MAX_LENGTH ||
      strlen(join->node_manager_id) > PCP_SCHED_WORKER_ID_MAX_LENGTH ||
      join->device_id < 0) {
    join_reject(d, PCP_PROTO_REJECT_BAD_JOIN,
                "worker id, target, node manager id or device id out of "
                "range");
    return;
  }
  int64_t lost_at_ns = record->lost_at_ns;
  if (record->known && record->connected) {
    if (now_ns < record->connection_deadline_ns) {
      join_reject(d, PCP_PROTO_REJECT_DUPLICATE_WORKER,
                  "another live connection holds this worker id");
      return;
    }
    // The old connection is past its silence deadline: the worker lost it
    // without us noticing. It is evicted first (protocol s.5), which loses
    // the worker now, so the resume window counts from now.
    d->evict_old = true;
    lost_at_ns = now_ns;
  }
  if (!record->known && !registry_has_room) {
    join_reject(d, PCP_PROTO_REJECT_CAPACITY, "worker registry full");
    return;
  }
  d->verdict = PCP_FABRIC_JOIN_ACCEPT;
  d->new_slot = !record->known;
  uint64_t epoch = record->known ? record->lease_epoch : 0;
  d->resumed = epoch != 0 &&
               now_ns - lost_at_ns <= timeouts->resume_window_ns &&
               pcp_proto_join_resume_matches(join, epoch, record->resume_token);
  // A new session fences off everything the old one held: a higher epoch.
  d->lease_epoch = d->resumed ? epoch : epoch + 1;
#if defined(PCP_FABRIC_GLUE_SEEDED_BUGS)
  if (pcp_fabric_glue_seeded_epoch_kept && epoch != 0)
    d->lease_epoch = epoch;  // the seeded bug: no fencing on a new session
#endif
}

void pcp_fabric_join_evict(pcp_proto_gateway_conn_t* old, int64_t now_ns) {
  // conn_fail clones the reason, so the reason is ours to free (the
  // deterministic simulation's LeakSanitizer run found it leaking once per
  // replaced connection).
  pcp_status_t reason =
      pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                      "replaced by a new connection of the same worker");
  pcp_status_ignore(pcp_proto_gateway_conn_fail(old, reason, now_ns));
  pcp_status_ignore(reason);
}

bool pcp_fabric_join_sched_enter(pcp_sched_t* sched,
                                 const pcp_proto_join_t* join, int64_t now_ns,
                                 pcp_fabric_join_decision_t* decision) {
  pcp_sched_worker_info_t info = {
      .id = join->worker_id,
      .backend = decision->backend,
      .target = join->target,
      .device_id = join->device_id,
      .device_memory_bytes = join->device_memory_bytes,
      .node_manager_id = join->node_manager_id,
  };
  pcp_status_t status = pcp_ok_status();
  if (join->worker_class && join->worker_class[0] &&
      !pcp_sched_class_name_is_valid(join->worker_class)) {
    // Checked before the join so that a rejected worker leaves no trace.
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "worker '%s': worker class must be 1..%d bytes "
                             "of [A-Za-z0-9._-]",
                             join->worker_id, PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  } else {
    status = pcp_sched_worker_join(sched, &info, now_ns);
  }
  if (!status) {
    // Just joined (JOINING, holds nothing) with a valid name: cannot fail.
    PCP_CHECK_OK(pcp_sched_worker_class_name_set(sched, join->worker_id,
                                                 join->worker_class));
    return true;
  }
  decision->verdict = PCP_FABRIC_JOIN_REJECT;
  decision->reject_reason =
      pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED
          ? PCP_PROTO_REJECT_CAPACITY
          : PCP_PROTO_REJECT_BAD_JOIN;
  pcp_status_format(status, decision->message, sizeof(decision->message));
  pcp_status_ignore(status);
  return false;
}

void pcp_fabric_join_accept_params(const pcp_fabric_join_decision_t* decision,
                                   const uint8_t* resume_token,
                                   pcp_proto_gateway_accept_params_t* out) {
  memset(out, 0, sizeof(*out));
  out->lease_epoch = decision->lease_epoch;
  out->resumed = decision->resumed;
  memcpy(out->resume_token, resume_token, sizeof(out->resume_token));
}

static pcp_fabric_action_fn_t handler_of(const pcp_fabric_action_handlers_t* h,
                                         pcp_proto_action_type_t type) {
  switch (type) {
    case PCP_PROTO_ACTION_SEND:
      return h->send;
    case PCP_PROTO_ACTION_CLOSE:
      return h->close;
    case PCP_PROTO_ACTION_JOIN_VERIFIED:
      return h->join_verified;
    case PCP_PROTO_ACTION_EVICT:
      return h->evict;
    case PCP_PROTO_ACTION_PROGRAM_FETCH:
      return h->program_fetch;
    case PCP_PROTO_ACTION_PROGRAM_READY:
      return h->program_ready;
    case PCP_PROTO_ACTION_PROGRAM_FAILED:
      return h->program_failed;
    case PCP_PROTO_ACTION_TASK_PROGRESS:
      return h->task_progress;
    case PCP_PROTO_ACTION_TASK_RESULT:
      return h->task_result;
    case PCP_PROTO_ACTION_TASK_FAILED:
      return h->task_failed;
    case PCP_PROTO_ACTION_TASK_LOST:
      return h->task_lost;
    case PCP_PROTO_ACTION_PEER_DRAINING:
      return h->peer_draining;
    default:
      return NULL;  // a worker-side action: not ours
  }
}

bool pcp_fabric_conn_actions_drain(pcp_proto_gateway_conn_t* proto,
                                   bool* draining,
                                   const pcp_fabric_action_handlers_t* handlers,
                                   void* context) {
  if (*draining)
    return false;
  *draining = true;
  pcp_proto_action_t action;
  while (pcp_proto_gateway_conn_next_action(proto, &action)) {
    pcp_fabric_action_fn_t fn = handler_of(handlers, action.type);
    if (fn)
      fn(context, &action);
    pcp_proto_action_deinitialize(&action);
  }
  *draining = false;
  return pcp_proto_gateway_conn_state(proto) == PCP_PROTO_GATEWAY_CLOSED;
}
