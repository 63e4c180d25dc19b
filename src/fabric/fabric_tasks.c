// SPDX-License-Identifier: Apache-2.0
//
// Tasks: handles, outcomes and callbacks, results, and the public task API
// (submit, cancel, wait, query).

#include "fabric/fabric_impl.h"

static void task_free(pcp_fabric_task_t* task) {
  pcp_allocator_t a = task->allocator;
  pcp_allocator_free(a, task->function);
  pcp_allocator_free(a, task->inputs);
  if (task->refs) {
    for (uint32_t i = 0; i < task->ref_count; ++i) {
      pcp_allocator_free(a, (void*)task->refs[i].name);
    }
  }
  pcp_allocator_free(a, task->refs);
  if (task->keep) {
    for (uint32_t i = 0; i < task->keep_count; ++i) {
      pcp_allocator_free(a, (void*)task->keep[i].as);
    }
  }
  pcp_allocator_free(a, task->keep);
  pcp_allocator_free(a, task->target);
  pcp_allocator_free(a, task->pin_worker_id);
  pcp_allocator_free(a, task->class_name);
  pcp_allocator_free(a, task->session_id);
  pcp_allocator_free(a, task->outputs);
  for (size_t i = 0; i < task->blob_count; ++i) {
    pcp_proto_blob_free(a, task->blobs[i].data);
  }
  pcp_allocator_free(a, task->blobs);
  pcp_proto_frame_deinitialize(&task->result_frame);
  pcp_status_ignore(task->status);
  pcp_allocator_free(a, task);
}

void pcp_fabric_task_retain(pcp_fabric_task_t* task) {
  if (task)
    atomic_fetch_add(&task->references, 1);
}

void pcp_fabric_task_release(pcp_fabric_task_t* task) {
  if (task && atomic_fetch_sub(&task->references, 1) == 1)
    task_free(task);
}

void pcp_fabric_task_notify(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                            pcp_fabric_task_event_t event) {
  if (event == PCP_FABRIC_TASK_EVENT_DONE) {
    task->notify_done = true;
  } else {
    task->notify_progress = true;
  }
  if (!task->callback || task->in_notify_list)
    return;
  task->in_notify_list = true;
  pcp_fabric_task_retain(task);
  task->notify_next = NULL;
  if (ep->notify_tail) {
    ep->notify_tail->notify_next = task;
  } else {
    ep->notify_head = task;
  }
  ep->notify_tail = task;
}

// Ends a locked loop-thread section: runs the scheduling pass if something
// asked for it, then unlocks and runs the collected callbacks.
void pcp_fabric_unlock_and_notify(pcp_fabric_endpoint_t* ep) {
  int guard = 0;
  while (ep->schedule_wanted && guard++ < 16) {
    ep->schedule_wanted = false;
    pcp_fabric_schedule_pass(ep);
  }
  pcp_fabric_task_t* list = ep->notify_head;
  ep->notify_head = ep->notify_tail = NULL;
  typedef struct {
    bool progress;
    bool done;
  } flags_t;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next) {
    t->in_notify_list = false;
  }
  // Take the flags while still locked: once unlocked, the loop thread (or
  // this callback) may queue the task again.
  size_t count = 0;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next) ++count;
  flags_t small[64];
  flags_t* flags = small;
  void* heap = NULL;
  if (count > PCP_ARRAYSIZE(small)) {
    pcp_status_t status =
        pcp_allocator_malloc(ep->allocator, count * sizeof(flags_t), &heap);
    if (status) {
      // Out of memory: deliver DONE only (it is also visible through wait).
      pcp_status_ignore(status);
      flags = NULL;
    } else {
      flags = heap;
    }
  }
  size_t i = 0;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next, ++i) {
    if (flags) {
      flags[i].progress = t->notify_progress;
      flags[i].done = t->notify_done;
    }
    t->notify_progress = false;
    t->notify_done = false;
  }
  pthread_mutex_unlock(&ep->mu);
  i = 0;
  pcp_fabric_task_t* t = list;
  while (t) {
    pcp_fabric_task_t* next = t->notify_next;
    bool progress = flags ? flags[i].progress : false;
    bool done = flags ? flags[i].done : atomic_load(&t->done);
    if (progress) {
      t->callback(t->user_data, t, PCP_FABRIC_TASK_EVENT_PROGRESS);
    }
    if (done)
      t->callback(t->user_data, t, PCP_FABRIC_TASK_EVENT_DONE);
    pcp_fabric_task_release(t);
    t = next;
    ++i;
  }
  pcp_allocator_free(ep->allocator, heap);
}

static void task_unlink(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task) {
  if (task->prev) {
    task->prev->next = task->next;
  } else {
    ep->tasks_head = task->next;
  }
  if (task->next) {
    task->next->prev = task->prev;
  } else {
    ep->tasks_tail = task->prev;
  }
  task->next = task->prev = NULL;
}

// Final outcome. |status| is consumed (OK for a result).
void pcp_fabric_task_finish(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                            pcp_status_t status) {
  if (task->state == TASK_DONE) {
    pcp_status_ignore(status);
    return;
  }
  if (task->lease_id) {
    pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
    task->lease_id = 0;
  }
  task->state = TASK_DONE;
  task->worker = NULL;
  task->status = status;
  int outcome = 0;
  switch (pcp_status_code(status)) {
    case PCP_STATUS_OK:
      outcome = 0;
      break;
    case PCP_STATUS_CANCELLED:
      outcome = 2;
      break;
    case PCP_STATUS_ABORTED:
      outcome = 3;
      break;
    default:
      outcome = 1;
      break;
  }
  counter_add(ep->m_tasks[outcome], 1);
  task_unlink(ep, task);
  pcp_fabric_task_notify(ep, task, PCP_FABRIC_TASK_EVENT_DONE);
  atomic_store(&task->done, true);
  pthread_cond_broadcast(&ep->cv);
  pcp_fabric_task_release(task);  // the live list's reference
}

pcp_fabric_task_t* pcp_fabric_task_find(pcp_fabric_endpoint_t* ep,
                                        uint64_t task_id) {
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->id == task_id)
      return t;
  }
  return NULL;
}

void pcp_fabric_task_result_receive(fabric_conn_t* conn,
                                    pcp_proto_action_t* action) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_fabric_task_t* task = pcp_fabric_task_find(ep, action->task_id);
  if (!task || task->state != TASK_RUNNING || task->worker != conn->worker) {
    return;  // reassigned meanwhile: never double-complete
  }
  pcp_fabric_worker_task_answered(conn->worker, task, false);
  pcp_proto_task_result_t result;
  pcp_status_t status = pcp_proto_task_result_parse(&action->received, &result);
  if (status) {
    pcp_fabric_task_finish(ep, task, status);
    return;
  }
  void* p = NULL;
  if (result.output_count) {
    status = pcp_allocator_calloc(
        ep->allocator, result.output_count * sizeof(pcp_proto_section_t), &p);
    if (status) {
      pcp_fabric_task_finish(ep, task, status);
      return;
    }
  }
  pcp_proto_section_t* outputs = p;
  for (uint32_t i = 0; i < result.output_count; ++i) {
    const pcp_proto_tensor_ref_t* ref = &result.outputs[i];
    if (ref->kind == PCP_PROTO_TENSOR_REF_SECTION) {
      outputs[i] = action->received.sections[ref->section];
    } else if (ref->kind == PCP_PROTO_TENSOR_REF_BLOB) {
      // proto checked that the blob exists and matches dtype and shape.
      const pcp_proto_tensor_blob_t* blob =
          pcp_proto_action_tensor_blob(action, ref->name);
      outputs[i].name = ref->name;
      outputs[i].element_type = ref->element_type;
      outputs[i].rank = ref->rank;
      memcpy(outputs[i].shape, ref->shape, sizeof(outputs[i].shape));
      outputs[i].data = blob ? blob->data : NULL;
      outputs[i].byte_length = blob ? blob->byte_length : 0;
    } else {
      outputs[i].name = ref->name;
      outputs[i].element_type = ref->element_type;
      outputs[i].rank = ref->rank;
      memcpy(outputs[i].shape, ref->shape, sizeof(outputs[i].shape));
    }
  }
  task->outputs = outputs;
  task->output_count = result.output_count;
  task->elapsed_us = result.elapsed_us;
  // The sections point into the frame's payload and JSON, and the blobs'
  // bytes into their own buffers: both move to the task without a copy.
  pcp_proto_frame_move(&action->received, &task->result_frame);
  task->blobs = action->tensor_blobs;
  task->blob_count = action->tensor_blob_count;
  action->tensor_blobs = NULL;
  action->tensor_blob_count = 0;
  pcp_fabric_task_finish(ep, task, pcp_ok_status());
}

static pcp_status_t task_copy_params(pcp_fabric_task_t* task,
                                     const pcp_fabric_task_params_t* params) {
  pcp_allocator_t a = task->allocator;
  memcpy(task->program, params->program, sizeof(task->program));
  PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->function, &task->function));
  void* p = NULL;
  if (params->input_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
        a, params->input_count * sizeof(pcp_proto_section_t), &p));
    memcpy(p, params->inputs,
           params->input_count * sizeof(pcp_proto_section_t));
    task->inputs = p;
    task->input_count = params->input_count;
  }
  uint32_t ref_count =
      params->input_refs ? params->input_ref_count : params->input_count;
  if (ref_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, ref_count * sizeof(pcp_proto_tensor_ref_t), &p));
    task->refs = p;
    task->ref_count = ref_count;
    for (uint32_t i = 0; i < ref_count; ++i) {
      if (params->input_refs) {
        task->refs[i] = params->input_refs[i];
        task->refs[i].name = NULL;
        PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->input_refs[i].name,
                                            (char**)&task->refs[i].name));
      } else {
        task->refs[i].kind = PCP_PROTO_TENSOR_REF_SECTION;
        task->refs[i].section = i;
      }
    }
  }
  if (params->keep_resident_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, params->keep_resident_count * sizeof(pcp_proto_keep_resident_t),
        &p));
    task->keep = p;
    task->keep_count = params->keep_resident_count;
    for (uint32_t i = 0; i < task->keep_count; ++i) {
      task->keep[i].output = params->keep_resident[i].output;
      PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->keep_resident[i].as,
                                          (char**)&task->keep[i].as));
    }
  }
  task->return_resident = params->return_resident;
  task->hash_inputs = params->hash_inputs;
  task->hash_outputs = params->hash_outputs;
  task->worker_class = params->worker_class;
  if (params->target && params->target[0]) {
    PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->target, &task->target));
  }
  task->min_device_memory_bytes = params->min_device_memory_bytes;
  if (params->worker_id && params->worker_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        dup_string(a, params->worker_id, &task->pin_worker_id));
  }
  if (params->session_id && params->session_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        dup_string(a, params->session_id, &task->session_id));
  }
  if (params->worker_class_name && params->worker_class_name[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        dup_string(a, params->worker_class_name, &task->class_name));
  }
  task->callback = params->callback;
  task->user_data = params->user_data;
  return pcp_ok_status();
}

static pcp_status_t task_params_validate(
    const pcp_fabric_task_params_t* params) {
  if (!params->function || !params->function[0] ||
      strlen(params->function) > PCP_PROTO_MAX_STRING_BYTES ||
      (params->input_count && !params->inputs) ||
      params->input_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->input_ref_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->keep_resident_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->max_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS ||
      params->worker_class >= PCP_SCHED_WORKER_CLASS_COUNT_ ||
      (params->session_id &&
       strlen(params->session_id) > PCP_PROTO_MAX_STRING_BYTES) ||
      (params->target &&
       strlen(params->target) > PCP_SCHED_TARGET_MAX_LENGTH)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task: missing function, or a count, "
                           "string or class out of range");
  }
  if (params->worker_class_name && params->worker_class_name[0] &&
      !pcp_sched_class_name_is_valid(params->worker_class_name)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task: worker class name must be 1..%d "
                           "bytes of [A-Za-z0-9._-]",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  for (uint32_t i = 0; params->input_refs && i < params->input_ref_count; ++i) {
    const pcp_proto_tensor_ref_t* ref = &params->input_refs[i];
    if ((ref->kind == PCP_PROTO_TENSOR_REF_SECTION &&
         ref->section >= params->input_count) ||
        (ref->kind == PCP_PROTO_TENSOR_REF_RESIDENT && !ref->name) ||
        ref->kind == PCP_PROTO_TENSOR_REF_BLOB) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric task: input ref %u is not a valid "
                             "section or resident reference",
                             i);
    }
  }
  if (params->input_refs) {
    // A seeded-init ref carries no bytes (no blob, no section): it passes
    // through as its fields, checked here (each one, and what they ask a
    // worker to allocate in all) so a bad one fails at submit.
    PCP_RETURN_IF_ERROR(pcp_proto_init_refs_validate(params->input_refs,
                                                     params->input_ref_count),
                        "fabric task");
  }
  uint32_t arguments =
      params->input_refs ? params->input_ref_count : params->input_count;
  if (params->hash_inputs > arguments) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task: hash_inputs %u of %u inputs",
                           params->hash_inputs, arguments);
  }
  if (params->hash_outputs > PCP_PROTO_MAX_TASK_TENSORS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task: hash_outputs %u over %u",
                           params->hash_outputs, PCP_PROTO_MAX_TASK_TENSORS);
  }
  return pcp_ok_status();
}

static pcp_status_t task_create(pcp_fabric_endpoint_t* ep,
                                const pcp_fabric_task_params_t* params,
                                pcp_fabric_task_t** out_task) {
  *out_task = NULL;
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(ep->allocator, sizeof(pcp_fabric_task_t), &p));
  pcp_fabric_task_t* task = p;
  task->allocator = ep->allocator;
  task->endpoint = ep;
  atomic_init(&task->references, 1);
  pcp_status_t status = task_copy_params(task, params);
  if (status) {
    task_free(task);
    return status;
  }
  task->max_attempts = params->max_attempts ? params->max_attempts
                                            : ep->options.max_task_attempts;
  task->state = TASK_PENDING;
  *out_task = task;
  return pcp_ok_status();
}

// Checks the endpoint and the program under the lock. Caller holds it.
static pcp_status_t submit_check_locked(pcp_fabric_endpoint_t* ep,
                                        const uint8_t* program) {
  if (ep->stopping) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "fabric endpoint is shutting down");
  }
  if (!pcp_fabric_program_find(ep, program)) {
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_proto_hex_encode(program, PCP_SHA256_BYTE_LENGTH, hex);
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "fabric task: program %s is not registered", hex);
  }
  return pcp_ok_status();
}

static void task_link_locked(pcp_fabric_endpoint_t* ep,
                             pcp_fabric_task_t* task) {
  task->id = ep->next_task_id++;
  task->prev = ep->tasks_tail;
  if (ep->tasks_tail) {
    ep->tasks_tail->next = task;
  } else {
    ep->tasks_head = task;
  }
  ep->tasks_tail = task;
}

pcp_status_t pcp_fabric_task_submit(pcp_fabric_endpoint_t* ep,
                                    const pcp_fabric_task_params_t* params,
                                    pcp_fabric_task_t** out_task) {
  if (out_task)
    *out_task = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_params_validate(params));
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_create(ep, params, &task));
  pthread_mutex_lock(&ep->mu);
  pcp_status_t status = submit_check_locked(ep, params->program);
  if (!status && task->pin_worker_id) {
    fabric_worker_t* w = pcp_fabric_worker_find(ep, task->pin_worker_id);
    if (w)
      status = pcp_fabric_task_class_check(task, w);
  }
  if (status) {
    pthread_mutex_unlock(&ep->mu);
    task_free(task);
    return status;
  }
  task_link_locked(ep, task);
  if (out_task) {
    pcp_fabric_task_retain(task);
    *out_task = task;
  }
  pthread_mutex_unlock(&ep->mu);
  pcp_fabric_kick(ep);
  return pcp_ok_status();
}

pcp_status_t pcp_fabric_task_submit_group(
    pcp_fabric_endpoint_t* ep, const pcp_fabric_task_params_t* params,
    uint32_t worker_count, pcp_fabric_task_t** out_tasks) {
  if (worker_count == 0 || worker_count > PCP_SCHED_REQUEST_WORKER_COUNT_MAX ||
      (params->worker_id && params->worker_id[0]) ||
      (params->session_id && params->session_id[0]) || !out_tasks) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task group: 1..%u copies, no named worker "
                           "or session, and an output array",
                           PCP_SCHED_REQUEST_WORKER_COUNT_MAX);
  }
  for (uint32_t i = 0; i < worker_count; ++i) out_tasks[i] = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_params_validate(params));
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < worker_count && !status; ++i) {
    status = task_create(ep, params, &out_tasks[i]);
  }
  if (!status) {
    pthread_mutex_lock(&ep->mu);
    status = submit_check_locked(ep, params->program);
    if (!status) {
      uint64_t group_id = ep->next_task_id;
      for (uint32_t i = 0; i < worker_count; ++i) {
        task_link_locked(ep, out_tasks[i]);
        out_tasks[i]->group_id = group_id;
        out_tasks[i]->group_unplaced = true;
        pcp_fabric_task_retain(out_tasks[i]);
      }
    }
    pthread_mutex_unlock(&ep->mu);
  }
  if (status) {
    for (uint32_t i = 0; i < worker_count; ++i) {
      if (out_tasks[i])
        task_free(out_tasks[i]);
      out_tasks[i] = NULL;
    }
    return status;
  }
  pcp_fabric_kick(ep);
  return pcp_ok_status();
}

void pcp_fabric_task_cancel(pcp_fabric_task_t* task) {
  if (atomic_load(&task->done))
    return;
  pcp_fabric_endpoint_t* ep = task->endpoint;
  pthread_mutex_lock(&ep->mu);
  bool live = !atomic_load(&task->done);
  if (live)
    task->cancel_requested = true;
  pthread_mutex_unlock(&ep->mu);
  if (live)
    pcp_fabric_kick(ep);
}

bool pcp_fabric_task_wait(pcp_fabric_task_t* task, int64_t timeout_ms) {
  if (atomic_load(&task->done))
    return true;
  pcp_fabric_endpoint_t* ep = task->endpoint;
  int64_t deadline = timeout_ms < 0 ? 0
                                    : pcp_clock_now_ns(pcp_clock_system()) +
                                          timeout_ms * 1000000;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000),
                        .tv_nsec = (long)(deadline % 1000000000)};
  pthread_mutex_lock(&ep->mu);
  while (!atomic_load(&task->done)) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&ep->cv, &ep->mu);
    } else if (pthread_cond_timedwait(&ep->cv, &ep->mu, &ts) != 0) {
      break;
    }
  }
  bool done = atomic_load(&task->done);
  pthread_mutex_unlock(&ep->mu);
  return done;
}

uint64_t pcp_fabric_task_id(const pcp_fabric_task_t* task) {
  return task->id;
}

bool pcp_fabric_task_is_done(pcp_fabric_task_t* task) {
  return atomic_load(&task->done);
}

pcp_status_t pcp_fabric_task_status(pcp_fabric_task_t* task) {
  return atomic_load(&task->done) ? task->status : pcp_ok_status();
}

pcp_status_t pcp_fabric_task_outputs(pcp_fabric_task_t* task,
                                     const pcp_proto_section_t** out_outputs,
                                     size_t* out_count) {
  *out_outputs = NULL;
  *out_count = 0;
  if (!atomic_load(&task->done) || task->status) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "task %llu has no result",
                           (unsigned long long)task->id);
  }
  *out_outputs = task->outputs;
  *out_count = task->output_count;
  return pcp_ok_status();
}

void pcp_fabric_task_info_query(pcp_fabric_task_t* task,
                                pcp_fabric_task_info_t* out_info) {
  memset(out_info, 0, sizeof(*out_info));
  bool done = atomic_load(&task->done);
  pcp_fabric_endpoint_t* ep = task->endpoint;
  if (!done)
    pthread_mutex_lock(&ep->mu);
  out_info->task_id = task->id;
  out_info->attempts = task->attempts;
  out_info->done = task->state == TASK_DONE;
  out_info->worker_id = task->last_worker_id;
  out_info->progress_state = task->progress_state;
  out_info->progress_fraction = task->progress_fraction;
  out_info->elapsed_us = task->elapsed_us;
  if (!done)
    pthread_mutex_unlock(&ep->mu);
}
