// SPDX-License-Identifier: Apache-2.0
//
// Placement: where a task runs (sched leases, pinned workers, sessions,
// gangs), the scheduling pass, sched events, and the assignment itself.

#include "fabric/fabric_impl.h"

// |task| was answered by |w| (a result or, |failed|, an error of its own):
// counted, and no longer its current task. ep->mu held.
void pcp_fabric_worker_task_answered(fabric_worker_t* w,
                                     const pcp_fabric_task_t* task,
                                     bool failed) {
  if (!w)
    return;
  w->info.tasks_done++;
  if (failed)
    w->info.tasks_failed++;
  if (w->info.current_task_id == task->id) {
    w->info.current_task_id = 0;
    w->info.current_function[0] = '\0';
  }
}

pcp_status_t pcp_fabric_task_class_check(const pcp_fabric_task_t* task,
                                         const fabric_worker_t* w) {
  if (!task->class_name || strcmp(task->class_name, w->info.worker_class) == 0)
    return pcp_ok_status();
  return pcp_make_status(
      PCP_STATUS_FAILED_PRECONDITION,
      "task %llu: worker '%s' is of class '%s', the task runs only on class "
      "'%s'",
      (unsigned long long)task->id, w->info.worker_id,
      w->info.worker_class[0] ? w->info.worker_class : "(none)",
      task->class_name);
}

void pcp_fabric_task_assign(pcp_fabric_endpoint_t* ep,
                            pcp_fabric_task_t* task) {
  fabric_worker_t* w = task->worker;
  pcp_proto_task_assign_t assign = {
      .task_id = task->id,
      .session_id = task->session_id ? task->session_id : "",
      .function = task->function,
      .inputs = task->refs,
      .input_count = task->ref_count,
      .keep_resident = task->keep,
      .keep_resident_count = task->keep_count,
      .return_resident = task->return_resident,
      .hash_inputs = task->hash_inputs,
      .hash_outputs = task->hash_outputs,
  };
  memcpy(assign.program, task->program, sizeof(assign.program));
  uint64_t request_id = 0;
  pcp_status_t status = pcp_proto_gateway_conn_assign_task(
      w->conn->proto, &assign, task->inputs, task->input_count, now_ns(ep),
      &request_id);
  if (pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED &&
      pcp_proto_gateway_conn_in_flight_count(w->conn->proto) >=
          ep->options.limits.max_in_flight) {
    // The connection's in-flight limit: wait for a slot (a pinned task stays
    // pinned; a leased one gives its lease back and is placed again). Any
    // other RESOURCE_EXHAUSTED is the frame itself (more sections than a
    // frame carries): no slot would ever fit it, so it fails below instead
    // of waiting forever.
    pcp_status_ignore(status);
    task->state = TASK_PENDING;
    if (task->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
      task->lease_id = 0;
      task->worker = NULL;
    }
    return;
  }
  if (status) {
    pcp_fabric_task_finish(
        ep, task,
        pcp_status_annotate_f(status, "task %llu on '%s'",
                              (unsigned long long)task->id, w->info.worker_id));
    return;
  }
  task->state = TASK_RUNNING;
  task->request_id = request_id;
  task->attempts++;
  task->cancel_sent = false;
  copy_text(task->last_worker_id.value, sizeof(task->last_worker_id.value),
            w->info.worker_id);
  w->info.current_task_id = task->id;
  copy_text(w->info.current_function, sizeof(w->info.current_function),
            task->function ? task->function : "");
  pcp_fabric_conn_process_actions(w->conn);
}

// Runs |task| on |w| (connected): program first if the worker lacks it.
static void task_dispatch(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                          fabric_worker_t* w) {
  if (task->cancel_requested) {
    pcp_fabric_task_finish(
        ep, task,
        pcp_make_status(PCP_STATUS_CANCELLED, "task %llu cancelled",
                        (unsigned long long)task->id));
    return;
  }
  if (task->attempts >= task->max_attempts) {
    pcp_fabric_task_finish(
        ep, task,
        pcp_make_status(PCP_STATUS_ABORTED,
                        "task %llu: ran %u times and lost its worker "
                        "each time (limit %u)",
                        (unsigned long long)task->id, task->attempts,
                        task->max_attempts));
    return;
  }
  if (!pcp_fabric_worker_connected(w)) {
    // sched handed us a worker whose connection is already gone; wait.
    task->state = TASK_PENDING;
    task->worker = task->pin_worker_id ? w : NULL;
    if (task->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
      task->lease_id = 0;
    }
    ep->schedule_wanted = true;
    return;
  }
  task->worker = w;
  if (task->session_id && !pcp_fabric_session_find(ep, task->session_id)) {
    pcp_fabric_session_bind(ep, task->session_id, w);
  }
  if (pcp_fabric_hash_set_contains(&w->acked, task->program)) {
    pcp_fabric_task_assign(ep, task);
    return;
  }
  task->state = TASK_AWAIT_PROGRAM;
  if (pcp_fabric_hash_set_contains(&w->offered, task->program))
    return;
  program_t* p = pcp_fabric_program_find(ep, task->program);
  if (!p) {  // programs are never removed; submit checked it
    pcp_fabric_task_finish(
        ep, task, pcp_make_status(PCP_STATUS_INTERNAL, "program vanished"));
    return;
  }
  pcp_proto_program_offer_t offer = {
      .byte_length = p->byte_length,
      .backend = p->backend,
      .target = p->target,
  };
  memcpy(offer.program, p->hash, sizeof(offer.program));
  uint64_t request_id = 0;
  pcp_status_t status =
      pcp_fabric_hash_set_add(ep->allocator, &w->offered, p->hash);
  if (!status) {
    status = pcp_proto_gateway_conn_offer_program(w->conn->proto, &offer,
                                                  now_ns(ep), &request_id);
    if (status)
      pcp_fabric_hash_set_remove(&w->offered, p->hash);
  }
  if (status) {
    pcp_fabric_task_finish(ep, task, status);
    return;
  }
  pcp_fabric_conn_process_actions(w->conn);
}

static void task_place(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task) {
  int64_t now = now_ns(ep);
  const char* pin = task->pin_worker_id;
  if (!pin && task->session_id) {
    session_t* s = pcp_fabric_session_find(ep, task->session_id);
    if (s)
      pin = s->worker->info.worker_id;
  }
  if (pin) {
    fabric_worker_t* w = pcp_fabric_worker_find(ep, pin);
    if (w && pcp_fabric_worker_connected(w) &&
        w->info.state == PCP_FABRIC_WORKER_CONNECTED) {
      // A named (or session) worker that joined with another class: the
      // task would never run anywhere else, so it fails now, not at the
      // end of a resume window.
      pcp_status_t mismatch = pcp_fabric_task_class_check(task, w);
      if (mismatch) {
        pcp_fabric_task_finish(ep, task, mismatch);
        return;
      }
      task->pin_deadline_ns = 0;
      task_dispatch(ep, task, w);
      return;
    }
    // The worker is away: wait for it for one resume window.
    if (task->pin_deadline_ns == 0) {
      task->pin_deadline_ns = now + ep->timeouts.resume_window_ns;
    } else if (now >= task->pin_deadline_ns) {
      pcp_fabric_task_finish(
          ep, task,
          pcp_make_status(
              PCP_STATUS_UNAVAILABLE,
              "task %llu: worker '%s' not connected "
              "within %lld ms",
              (unsigned long long)task->id, pin,
              (long long)(ep->timeouts.resume_window_ns / 1000000)));
    }
    return;
  }
  pcp_sched_constraint_t constraint = {
      .worker_class = task->worker_class,
      .target = task->target,
      .min_device_memory_bytes = task->min_device_memory_bytes,
      .worker_count = 1,
  };
  uint64_t lease_id = 0;
  pcp_status_t status = pcp_sched_lease_acquire_class(
      ep->sched, PCP_SCHED_OWNER_JOBS, &constraint, task->class_name, task->id,
      &lease_id, 1);
  if (status) {
    pcp_status_code_t code = pcp_status_code(status);
    if (code == PCP_STATUS_UNAVAILABLE ||
        code == PCP_STATUS_RESOURCE_EXHAUSTED) {
      pcp_status_ignore(status);  // no eligible worker yet: stay queued
      return;
    }
    pcp_fabric_task_finish(ep, task, status);
    return;
  }
  pcp_sched_lease_status_t lease;
  status = pcp_sched_lease_query(ep->sched, lease_id, &lease);
  if (status) {
    pcp_status_ignore(pcp_sched_lease_release(ep->sched, lease_id));
    pcp_fabric_task_finish(ep, task, status);
    return;
  }
  task->lease_id = lease_id;
  fabric_worker_t* w = pcp_fabric_worker_find(ep, lease.worker_id.value);
  if (!w) {
    pcp_fabric_task_finish(
        ep, task,
        pcp_make_status(PCP_STATUS_INTERNAL, "sched leased unknown worker '%s'",
                        lease.worker_id.value));
    return;
  }
  task_dispatch(ep, task, w);
}

void pcp_fabric_sched_event_handle(pcp_fabric_endpoint_t* ep,
                                   const pcp_sched_event_t* event) {
  if (event->kind == PCP_SCHED_EVENT_NONE ||
      event->kind == PCP_SCHED_EVENT_WORKER_LOST ||
      event->owner != PCP_SCHED_OWNER_JOBS) {
    return;
  }
  // By lease id, not tag: the leases of a gang share one tag.
  pcp_fabric_task_t* task = NULL;
  for (pcp_fabric_task_t* t = ep->tasks_head; t && event->lease_id;
       t = t->next) {
    if (t->lease_id == event->lease_id) {
      task = t;
      break;
    }
  }
  if (!task) {
    if (event->kind != PCP_SCHED_EVENT_LEASE_EXPIRED && event->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, event->lease_id));
    }
    return;
  }
  switch (event->kind) {
    case PCP_SCHED_EVENT_LEASE_REASSIGNED:
    case PCP_SCHED_EVENT_LEASE_RESUMED: {
      fabric_worker_t* w =
          pcp_fabric_worker_find(ep, event->new_worker_id.value);
      if (!w)
        break;
      if (event->kind == PCP_SCHED_EVENT_LEASE_REASSIGNED) {
        counter_add(ep->m_reassigned, 1);
      }
      PCP_LOG(PCP_LOG_INFO, &ep->log,
              "fabric task %llu %s from worker=%s to worker=%s attempt=%u",
              (unsigned long long)task->id,
              pcp_sched_event_kind_name(event->kind), event->worker_id.value,
              event->new_worker_id.value, task->attempts + 1);
      task_dispatch(ep, task, w);
      break;
    }
    case PCP_SCHED_EVENT_LEASE_DETACHED:
      task->state = TASK_DETACHED;
      task->worker = NULL;
      break;
    case PCP_SCHED_EVENT_LEASE_EXPIRED:
      task->lease_id = 0;
      pcp_fabric_task_finish(
          ep, task,
          pcp_make_status(
              PCP_STATUS_UNAVAILABLE,
              "task %llu: no eligible worker within the "
              "rejoin grace (%lld ms)",
              (unsigned long long)task->id,
              (long long)(ep->timeouts.resume_window_ns / 1000000)));
      break;
    default:
      break;
  }
}

// Places the copies of a gang all at once on distinct workers (sched's
// all-or-nothing acquire), or leaves them all queued.
static void group_place(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* first) {
  // The whole gang, wherever the pass met it first.
  uint32_t count = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->group_id == first->group_id && t->group_unplaced)
      ++count;
  }
  void* p = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      ep->allocator, count * (sizeof(uint64_t) + sizeof(void*)), &p);
  if (status) {
    pcp_status_ignore(status);  // retried on the next pass
    return;
  }
  uint64_t* lease_ids = p;
  pcp_fabric_task_t** members = (pcp_fabric_task_t**)(lease_ids + count);
  uint32_t n = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t && n < count; t = t->next) {
    if (t->group_id == first->group_id && t->group_unplaced)
      members[n++] = t;
  }
  pcp_sched_constraint_t constraint = {
      .worker_class = first->worker_class,
      .target = first->target,
      .min_device_memory_bytes = first->min_device_memory_bytes,
      .worker_count = count,
  };
  status = pcp_sched_lease_acquire_class(ep->sched, PCP_SCHED_OWNER_JOBS,
                                         &constraint, first->class_name,
                                         first->group_id, lease_ids, count);
  pcp_status_code_t code = pcp_status_code(status);
  if (code == PCP_STATUS_UNAVAILABLE || code == PCP_STATUS_RESOURCE_EXHAUSTED) {
    pcp_status_ignore(status);  // not enough free workers yet
  } else if (status) {
    for (uint32_t i = 0; i < n; ++i) {
      members[i]->group_unplaced = false;
      pcp_fabric_task_finish(ep, members[i], pcp_status_clone(status));
    }
    pcp_status_ignore(status);
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      members[i]->group_unplaced = false;
      members[i]->lease_id = lease_ids[i];
    }
    for (uint32_t i = 0; i < n; ++i) {
      pcp_fabric_task_t* task = members[i];
      if (task->state != TASK_PENDING)
        continue;  // finished meanwhile
      pcp_sched_lease_status_t lease;
      fabric_worker_t* w = NULL;
      pcp_status_t query =
          pcp_sched_lease_query(ep->sched, task->lease_id, &lease);
      if (!query)
        w = pcp_fabric_worker_find(ep, lease.worker_id.value);
      pcp_status_ignore(query);
      if (!w) {
        pcp_fabric_task_finish(
            ep, task,
            pcp_make_status(PCP_STATUS_INTERNAL, "gang lease without worker"));
        continue;
      }
      task_dispatch(ep, task, w);
    }
  }
  pcp_allocator_free(ep->allocator, p);
}

void pcp_fabric_schedule_pass(pcp_fabric_endpoint_t* ep) {
  // Placement can finish any task (a failed program offer ends every task
  // waiting for it), so hold a reference on the successor while working.
  pcp_fabric_task_t* task = ep->tasks_head;
  if (task)
    pcp_fabric_task_retain(task);
  uint64_t group_tried = 0;  // a gang is tried once per pass, as a whole
  while (task) {
    pcp_fabric_task_t* next = task->next;
    if (next)
      pcp_fabric_task_retain(next);
    if (task->state == TASK_DONE) {
      // Finished by an earlier step of this pass.
    } else if (task->cancel_requested) {
      if (task->state == TASK_RUNNING) {
        fabric_conn_t* conn = task->worker ? task->worker->conn : NULL;
        if (!task->cancel_sent && conn) {
          task->cancel_sent = true;
          pcp_status_t status = pcp_proto_gateway_conn_cancel_task(
              conn->proto, task->id, "cancelled by the gateway", now_ns(ep));
          pcp_status_ignore(status);
          pcp_fabric_conn_process_actions(conn);
          task->cancel_sent_ns = now_ns(ep);
          task->cancel_conn_id = conn->id;
          task->cancel_write_mark = conn->frames_queued;
        } else if (task->cancel_sent && conn &&
                   conn->id == task->cancel_conn_id &&
                   conn->frames_released >= task->cancel_write_mark &&
                   now_ns(ep) - task->cancel_sent_ns >=
                       ep->cancel_answer_timeout_ns) {
          // The worker is connected but has not answered the cancel within
          // the cancel-answer timeout (a wedged compute thread): the caller
          // must not wait forever. Its inputs are no longer being written, so
          // the borrowed buffers can go; a late answer is dropped (the task is
          // gone), and it frees the connection's in-flight slot then.
          pcp_fabric_task_finish(
              ep, task,
              pcp_make_status(
                  PCP_STATUS_DEADLINE_EXCEEDED,
                  "task %llu: worker '%s' did not answer the cancel "
                  "within %lld ms",
                  (unsigned long long)task->id, task->worker->info.worker_id,
                  (long long)(ep->cancel_answer_timeout_ns / 1000000)));
        }
      } else {
        pcp_fabric_task_finish(
            ep, task,
            pcp_make_status(PCP_STATUS_CANCELLED, "task %llu cancelled",
                            (unsigned long long)task->id));
      }
    } else if (task->state == TASK_PENDING) {
      if (task->group_unplaced) {
        if (task->group_id != group_tried) {
          group_tried = task->group_id;
          group_place(ep, task);
        }
      } else {
        task_place(ep, task);
      }
    }
    pcp_fabric_task_release(task);
    if (next && next->state == TASK_DONE) {
      // The list changed under us; start over on the next pass.
      pcp_fabric_task_release(next);
      ep->schedule_wanted = true;
      return;
    }
    task = next;
  }
}
