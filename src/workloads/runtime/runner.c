// SPDX-License-Identifier: Apache-2.0
// The workload runner (runtime.h): the shared lifecycle of every workload
// kind. What used to be written once per kind (roles/gateway/training.c had
// its own scheduler thread, one thread per job, its own transition helper
// and a stop hook that re-read the store on every poll) is here once.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "workloads/runtime/runtime_impl.h"

// Bounds a wake-up the scheduler could miss (a job queued by a process
// that does not call _wake); every submit, cancel and job end wakes it at
// once. Today's training scheduler polled at this interval.
#define SCHEDULER_MAX_SLEEP_MS 200

static void log_status(pcp_workloads_runner_t* r, const char* id,
                       const char* what, pcp_status_t status) {
  pcp_log_context_t log = r->log;
  log.job_id = id;
  pcp_log_status(PCP_LOG_WARN, &log, status, what);
}

static int kind_find(const pcp_workloads_runner_t* r, const char* name) {
  for (uint32_t i = 0; i < r->kind_count; ++i) {
    if (name && strcmp(r->kind_names[i], name) == 0) {
      return (int)i;
    }
  }
  return -1;
}

// |mu| held.
static pcp_workloads_job_t* job_find_locked(pcp_workloads_runner_t* r,
                                            const char* id) {
  for (pcp_workloads_job_t* j = r->jobs; j; j = j->next) {
    if (strcmp(j->id, id) == 0) {
      return j;
    }
  }
  return NULL;
}

// |mu| held: wakes the scheduler and every idle waiter.
static void scheduler_wake_locked(pcp_workloads_runner_t* r) {
  ++r->wake_count;
  pthread_cond_broadcast(&r->cv);
}

static void changed(pcp_workloads_runner_t* r, const char* id) {
  if (r->hooks.changed) {
    r->hooks.changed(r->hooks.user_data, id);
  }
}

static void outcome(pcp_workloads_runner_t* r, uint32_t kind_index,
                    const char* what) {
  if (r->hooks.outcome) {
    r->hooks.outcome(r->hooks.user_data, r->kind_names[kind_index], what);
  }
}

static void job_free(pcp_workloads_runner_t* r, pcp_workloads_job_t* j) {
  json_decref(j->progress);
  json_decref(j->placement);
  pthread_cond_destroy(&j->cv);
  pcp_allocator_free(r->allocator, j);
}

// Drops a reference taken under |mu|; the last one frees a job that ended
// and was unlinked meanwhile.
static void job_unref(pcp_workloads_runner_t* r, pcp_workloads_job_t* j) {
  pthread_mutex_lock(&r->mu);
  bool free_it = --j->refs == 0 && j->dropped;
  pthread_mutex_unlock(&r->mu);
  if (free_it) {
    job_free(r, j);
  }
}

// |mu| held: sets a running job's stop flags and wakes its waits. True
// when the kind's cancel must be called (first request, the kind has one):
// a reference is taken for it; call job_cancel_call after unlocking (the
// kind's cancel may block on the fabric).
static bool job_stop_locked(pcp_workloads_runner_t* r, pcp_workloads_job_t* j,
                            bool is_cancel) {
  if (!j || !j->running) {
    return false;
  }
  bool first = !atomic_load(&j->stop);
  if (is_cancel) {
    atomic_store(&j->cancel, true);
  }
  atomic_store(&j->stop, true);
  pthread_cond_broadcast(&j->cv);
  bool call = first && r->kinds[j->kind_index].cancel;
  j->refs += call;
  return call;
}

static void job_cancel_call(pcp_workloads_runner_t* r, pcp_workloads_job_t* j) {
  const pcp_workloads_kind_t* kind = &r->kinds[j->kind_index];
  kind->cancel(kind->self, j);
  job_unref(r, j);
}

// A cancel reached job |id|: if it runs here, it is asked to stop.
static void job_cancel_request(pcp_workloads_runner_t* r, const char* id) {
  pthread_mutex_lock(&r->mu);
  pcp_workloads_job_t* j = job_find_locked(r, id);
  bool call = job_stop_locked(r, j, true);
  pthread_mutex_unlock(&r->mu);
  if (call) {
    job_cancel_call(r, j);
  }
}

//===----------------------------------------------------------------------===//
// The own pool
//===----------------------------------------------------------------------===//

static void* pool_main(void* opaque);

// |mu| held: one more pool thread when the queued items outnumber the idle
// threads. False when none could be made and none exists (nothing would
// run the items).
static bool pool_grow_locked(pcp_workloads_runner_t* r) {
  while (r->pool_started && r->pool_idle < r->pool_count &&
         r->pool_thread_count < r->pool_capacity) {
    if (pthread_create(&r->pool_threads[r->pool_thread_count], NULL, pool_main,
                       r) != 0) {
      return r->pool_thread_count > 0;
    }
    // Counted idle until it takes an item, so one item makes one thread.
    ++r->pool_thread_count;
    ++r->pool_idle;
  }
  return true;
}

static pcp_status_t pool_submit(void* self, void (*fn)(void* arg), void* arg) {
  pcp_workloads_runner_t* r = self;
  pthread_mutex_lock(&r->mu);
  if (r->pool_count == r->pool_capacity || atomic_load(&r->stopping)) {
    pthread_mutex_unlock(&r->mu);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "the job pool is full");
  }
  uint32_t tail = (r->pool_head + r->pool_count) % r->pool_capacity;
  r->pool_items[tail] = (pcp_workloads_pool_item_t){fn, arg};
  ++r->pool_count;
  if (!pool_grow_locked(r)) {
    --r->pool_count;
    pthread_mutex_unlock(&r->mu);
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "job pool thread");
  }
  pthread_cond_signal(&r->pool_cv);
  pthread_mutex_unlock(&r->mu);
  return pcp_ok_status();
}

static void* pool_main(void* opaque) {
  pcp_workloads_runner_t* r = opaque;
  pthread_mutex_lock(&r->mu);
  --r->pool_idle;  // pool_grow_locked counted it idle
  for (;;) {
    // Items queued before a stop still run: each is a job marked running,
    // and its run returns at once (should_stop), leaving its state as is.
    while (r->pool_count == 0 && !atomic_load(&r->stopping)) {
      ++r->pool_idle;
      pthread_cond_wait(&r->pool_cv, &r->mu);
      --r->pool_idle;
    }
    if (r->pool_count == 0) {
      break;
    }
    pcp_workloads_pool_item_t item = r->pool_items[r->pool_head];
    r->pool_head = (r->pool_head + 1) % r->pool_capacity;
    --r->pool_count;
    pthread_mutex_unlock(&r->mu);
    item.fn(item.arg);
    pthread_mutex_lock(&r->mu);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

//===----------------------------------------------------------------------===//
// Create / release
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_runner_create(
    const pcp_workloads_runner_options_t* options, pcp_allocator_t allocator,
    pcp_workloads_runner_t** out_runner) {
  *out_runner = NULL;
  if (!options->store) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "runner options: 'store' is required");
  }
  if (options->kind_count > PCP_WORKLOADS_MAX_KINDS ||
      (options->kind_count && !options->kinds)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "runner options: 'kinds': at most %d",
                           PCP_WORKLOADS_MAX_KINDS);
  }
  uint32_t capacity = 0;
  for (size_t i = 0; i < options->kind_count; ++i) {
    const pcp_workloads_kind_t* k = &options->kinds[i];
    if (!k->name || !k->name[0] ||
        strlen(k->name) > PCP_STORE_NAME_MAX_LENGTH || !k->run) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "runner options: 'kinds[%zu]' needs a name of "
                             "1..%d bytes and a run function",
                             i, PCP_STORE_NAME_MAX_LENGTH);
    }
    if (k->max_running < 1 ||
        k->max_running > PCP_WORKLOADS_MAX_RUNNING_PER_KIND) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "runner options: 'kinds[%zu].max_running' must "
                             "be in [1, %d]",
                             i, PCP_WORKLOADS_MAX_RUNNING_PER_KIND);
    }
    for (size_t j = 0; j < i; ++j) {
      if (strcmp(options->kinds[j].name, k->name) == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "runner options: kind '%s' given twice",
                               k->name);
      }
    }
    capacity += k->max_running;
  }
  pcp_workloads_runner_t* r = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*r), (void**)&r));
  r->allocator = allocator;
  r->store = options->store;
  r->clock = options->clock.now_ns ? options->clock : pcp_clock_system();
  r->log = options->log;
  r->hooks = options->hooks;
  r->kind_count = (uint32_t)options->kind_count;
  for (uint32_t i = 0; i < r->kind_count; ++i) {
    r->kinds[i] = options->kinds[i];
    snprintf(r->kind_names[i], sizeof(r->kind_names[i]), "%s",
             options->kinds[i].name);
    r->kinds[i].name = r->kind_names[i];
  }
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  pthread_cond_init(&r->pool_cv, NULL);
  if (options->executor.submit) {
    r->executor = options->executor;
  } else {
    r->own_pool = true;
    r->executor = (pcp_workloads_executor_t){.self = r, .submit = pool_submit};
    r->pool_capacity = capacity ? capacity : 1;
    pcp_status_t status = pcp_allocator_calloc(
        allocator, r->pool_capacity * sizeof(*r->pool_items),
        (void**)&r->pool_items);
    if (!status) {
      status =
          pcp_allocator_calloc(allocator, r->pool_capacity * sizeof(pthread_t),
                               (void**)&r->pool_threads);
    }
    if (status) {
      pcp_workloads_runner_release(r);
      return status;
    }
  }
  *out_runner = r;
  return pcp_ok_status();
}

void pcp_workloads_runner_release(pcp_workloads_runner_t* r) {
  if (!r) {
    return;
  }
  pcp_workloads_runner_stop(r);
  while (r->jobs) {
    pcp_workloads_job_t* j = r->jobs;
    r->jobs = j->next;
    job_free(r, j);
  }
  pcp_allocator_free(r->allocator, r->pool_items);
  pcp_allocator_free(r->allocator, r->pool_threads);
  pthread_cond_destroy(&r->pool_cv);
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
  pcp_allocator_free(r->allocator, r);
}

//===----------------------------------------------------------------------===//
// The transition function
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_runner_transition(
    pcp_workloads_runner_t* r, const char* id, pcp_store_job_state_t to,
    const pcp_store_job_transition_params_t* params) {
  pcp_status_t status =
      pcp_store_job_transition(r->store, id, to, params, NULL);
  // Even a refused move may mean the caller's view was stale: the hook
  // invalidates, it does not claim a change.
  changed(r, id);
  // A running job's own terminal move is not a request to stop; a cancel
  // (to cancelling) is.
  if (!status && to == PCP_STORE_JOB_STATE_CANCELLING) {
    job_cancel_request(r, id);
  }
  pthread_mutex_lock(&r->mu);
  scheduler_wake_locked(r);
  pthread_mutex_unlock(&r->mu);
  return status;
}

pcp_status_t pcp_workloads_runner_job_submit(pcp_workloads_runner_t* r,
                                             const char* id, const char* kind,
                                             const json_t* spec,
                                             const char* event_type,
                                             const json_t* event_payload,
                                             int64_t* out_event_id) {
  int k = kind_find(r, kind);
  if (k < 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "unknown job kind '%s'",
                           kind ? kind : "");
  }
  if (r->kinds[k].validate) {
    PCP_RETURN_IF_ERROR_BARE(r->kinds[k].validate(r->kinds[k].self, spec));
  }
  pcp_status_t status =
      pcp_store_job_create(r->store, id, kind, spec, out_event_id);
  changed(r, id);
  if (!status && event_type) {
    status = pcp_store_job_event_append(r->store, id, event_type, event_payload,
                                        NULL);
  }
  return status;
}

pcp_status_t pcp_workloads_runner_job_cancel(pcp_workloads_runner_t* r,
                                             const char* id,
                                             pcp_store_job_state_t* out_state,
                                             bool* out_changed) {
  *out_changed = false;
  // The store is the arbiter: racing the job's own moves, exactly one
  // transition wins and the other side sees FAILED_PRECONDITION and
  // re-reads.
  for (int attempt = 0; attempt < 4; ++attempt) {
    pcp_store_job_t job;
    PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(r->store, id, &job));
    pcp_store_job_state_t state = job.state;
    char kind[PCP_STORE_NAME_MAX_LENGTH + 1];
    snprintf(kind, sizeof(kind), "%s", job.kind);
    pcp_store_job_deinitialize(&job);
    *out_state = state;
    if (pcp_store_job_state_is_terminal(state) ||
        state == PCP_STORE_JOB_STATE_CANCELLING) {
      return pcp_ok_status();
    }
    pcp_store_job_state_t to = state == PCP_STORE_JOB_STATE_QUEUED
                                   ? PCP_STORE_JOB_STATE_CANCELLED
                                   : PCP_STORE_JOB_STATE_CANCELLING;
    pcp_status_t status = pcp_workloads_runner_transition(r, id, to, NULL);
    if (!status) {
      *out_state = to;
      *out_changed = true;
      if (to == PCP_STORE_JOB_STATE_CANCELLED) {
        // Started by a scheduling round but not yet out of queued: its run
        // ends now.
        job_cancel_request(r, id);
        int k = kind_find(r, kind);
        if (k >= 0 && r->kinds[k].cancel_queued) {
          r->kinds[k].cancel_queued(r->kinds[k].self, id);
        }
      }
      return pcp_ok_status();
    }
    if (pcp_status_code(status) != PCP_STATUS_FAILED_PRECONDITION) {
      return status;
    }
    pcp_status_ignore(status);
  }
  return pcp_make_status(PCP_STATUS_ABORTED, "job %s kept changing state", id);
}

void pcp_workloads_runner_job_json_merge(pcp_workloads_runner_t* r,
                                         json_t* job_json) {
  json_t* id = json_object_get(job_json, "job_id");
  int k = kind_find(r, json_string_value(json_object_get(job_json, "kind")));
  if (!json_is_string(id) || k < 0 || !r->kinds[k].progress) {
    return;
  }
  json_t* progress = NULL;
  pthread_mutex_lock(&r->mu);
  pcp_workloads_job_t* j = job_find_locked(r, json_string_value(id));
  if (j && j->progress) {
    progress = json_deep_copy(j->progress);
  }
  pthread_mutex_unlock(&r->mu);
  if (progress) {
    r->kinds[k].progress(r->kinds[k].self, progress, job_json);
    json_decref(progress);
  }
}

//===----------------------------------------------------------------------===//
// Recovery
//===----------------------------------------------------------------------===//

// One recovery pass over the jobs caught mid-flight. A job a run holds
// here is skipped (a later pass runs while jobs run). |*out_failed|: a
// transition the store failed to write (not a refused one): that job is
// still where the crash left it, with nobody to run it, so the scheduling
// rounds run the pass again (found by the deterministic simulation, seed
// 854).
static pcp_status_t recover_pass(pcp_workloads_runner_t* r, bool* out_failed) {
  *out_failed = false;
  const char* after = NULL;
  char after_buffer[PCP_STORE_ID_MAX_LENGTH + 1];
  for (;;) {
    pcp_store_job_list_t list = {0};
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_job_resume_list(r->store, after, 0, &list));
    for (size_t i = 0; i < list.count; ++i) {
      pcp_store_job_t* job = &list.items[i];
      pthread_mutex_lock(&r->mu);
      pcp_workloads_job_t* held = job_find_locked(r, job->id);
      bool skip = held && (held->running || held->end_pending);
      pthread_mutex_unlock(&r->mu);
      if (skip) {
        continue;
      }
      pcp_store_job_state_t to = job->state == PCP_STORE_JOB_STATE_CANCELLING
                                     ? PCP_STORE_JOB_STATE_CANCELLED
                                     : PCP_STORE_JOB_STATE_QUEUED;
      const char* error = to == PCP_STORE_JOB_STATE_QUEUED
                              ? "re-run after a gateway restart"
                              : NULL;
      int k = kind_find(r, job->kind);
      if (k >= 0 && r->kinds[k].recover) {
        error = NULL;
        to = r->kinds[k].recover(r->kinds[k].self, job, &error);
      }
      pcp_store_job_transition_params_t params = {.error = error};
      pcp_status_t status =
          pcp_workloads_runner_transition(r, job->id, to, &params);
      pcp_log_context_t log = r->log;
      log.job_id = job->id;
      PCP_LOG(PCP_LOG_INFO, &log, "recovered job from=%s to=%s",
              pcp_store_job_state_name(job->state),
              pcp_store_job_state_name(to));
      if (status && pcp_status_code(status) != PCP_STATUS_FAILED_PRECONDITION) {
        log_status(r, job->id, "recovering a job (retried)", status);
        *out_failed = true;
      }
      pcp_status_ignore(status);
    }
    size_t count = list.count;
    if (count) {
      snprintf(after_buffer, sizeof(after_buffer), "%s",
               list.items[count - 1].id);
      after = after_buffer;
    }
    pcp_store_job_list_deinitialize(&list);
    if (count < PCP_STORE_LIST_LIMIT_DEFAULT) {
      return pcp_ok_status();
    }
  }
}

bool pcp_workloads_runner_recovery_pending(pcp_workloads_runner_t* r) {
  return atomic_load(&r->recover_pending);
}

pcp_status_t pcp_workloads_runner_recover(pcp_workloads_runner_t* r) {
  // Jobs caught mid-flight by a crash or a stop: re-run or finish cancel.
  bool failed = false;
  PCP_RETURN_IF_ERROR_BARE(recover_pass(r, &failed));
  atomic_store(&r->recover_pending, failed);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Running one job
//===----------------------------------------------------------------------===//

// A final transition the store refused because a cancel won the race
// (the job is cancelling now): it ends cancelled. Returns the outcome;
// |*out_written| false when the store failed the write (the job is still
// where it was: job_end_retry writes it again).
static const char* final_transition(pcp_workloads_runner_t* r,
                                    pcp_workloads_job_t* j,
                                    pcp_store_job_state_t to,
                                    const pcp_store_job_transition_params_t* p,
                                    const char* what, bool* out_written) {
  pcp_status_t status = pcp_workloads_runner_transition(r, j->id, to, p);
  if (status && pcp_status_code(status) == PCP_STATUS_FAILED_PRECONDITION) {
    pcp_status_ignore(status);
    status = pcp_workloads_runner_transition(
        r, j->id, PCP_STORE_JOB_STATE_CANCELLED, NULL);
    what = status ? what : "cancelled";
  }
  *out_written =
      !status || pcp_status_code(status) == PCP_STATUS_FAILED_PRECONDITION;
  if (!*out_written) {
    log_status(r, j->id, "recording the job's end (retried)", status);
  }
  pcp_status_ignore(status);
  return what;
}

// The store failed the write of a job's end: without this the job would
// stay placing/compiling/running in the store with no run holding it until
// the next restart (found by the deterministic simulation, seed 921).
static void job_end_pending_set(pcp_workloads_runner_t* r,
                                pcp_workloads_job_t* j,
                                pcp_store_job_state_t to, const char* error) {
  pthread_mutex_lock(&r->mu);
  j->end_pending = true;
  j->end_to = to;
  snprintf(j->end_error, sizeof(j->end_error), "%s", error ? error : "");
  pthread_mutex_unlock(&r->mu);
}

// One more try at a pending end (a scheduling round, no run holds |j|).
static void job_end_retry(pcp_workloads_runner_t* r, pcp_workloads_job_t* j) {
  pcp_store_job_t now;
  pcp_status_t got = pcp_store_job_get(r->store, j->id, &now);
  if (got) {
    pcp_status_ignore(got);
    return;
  }
  pcp_store_job_state_t state = now.state;
  pcp_store_job_deinitialize(&now);
  bool written = true;
  const char* what = NULL;
  if (state == PCP_STORE_JOB_STATE_CANCELLING) {
    // Cancelled meanwhile: the round's cancelling sweep ends it.
    what = NULL;
  } else if (!pcp_store_job_state_is_terminal(state) &&
             state != PCP_STORE_JOB_STATE_QUEUED) {
    pcp_store_job_transition_params_t params = {.error = j->end_error};
    if (j->end_to == PCP_STORE_JOB_STATE_SUCCEEDED) {
      params.placement = j->placement;
    }
    what = final_transition(
        r, j, j->end_to, &params,
        j->end_to == PCP_STORE_JOB_STATE_SUCCEEDED ? "succeeded" : "failed",
        &written);
  }
  if (!written) {
    return;
  }
  if (what) {
    outcome(r, j->kind_index, what);
  }
  // Recorded: a job with no live progress is forgotten now, as after a run
  // (the caller's reference frees it).
  pthread_mutex_lock(&r->mu);
  j->end_pending = false;
  if (!j->progress && !j->running && !j->dropped) {
    for (pcp_workloads_job_t** link = &r->jobs; *link; link = &(*link)->next) {
      if (*link == j) {
        *link = j->next;
        break;
      }
    }
    j->dropped = true;
  }
  pthread_mutex_unlock(&r->mu);
}

// After the kind's run: the one place a job's end is recorded.
static void job_finish(pcp_workloads_runner_t* r, pcp_workloads_job_t* j,
                       pcp_status_t status) {
  const char* kind = r->kind_names[j->kind_index];
  pcp_log_context_t log = r->log;
  log.job_id = j->id;
  pcp_store_job_t now;
  pcp_status_t got = pcp_store_job_get(r->store, j->id, &now);
  pcp_store_job_state_t state = got ? PCP_STORE_JOB_STATE_FAILED : now.state;
  if (!got) {
    pcp_store_job_deinitialize(&now);
  }
  pcp_status_ignore(got);
  pcp_store_job_transition_params_t params = {0};
  if (state == PCP_STORE_JOB_STATE_CANCELLING) {
    // The user asked for a cancel: it ends cancelled, whatever the run
    // returned (a failure it caused, or work that finished anyway).
    pcp_status_ignore(status);
    pcp_status_ignore(pcp_workloads_runner_transition(
        r, j->id, PCP_STORE_JOB_STATE_CANCELLED, NULL));
    outcome(r, j->kind_index, "cancelled");
    PCP_LOG(PCP_LOG_INFO, &log, "%s job cancelled", kind);
  } else if (!status) {
    params.error = "";
    params.placement = j->placement;
    bool written = true;
    const char* what = final_transition(r, j, PCP_STORE_JOB_STATE_SUCCEEDED,
                                        &params, "succeeded", &written);
    if (!written) {
      job_end_pending_set(r, j, PCP_STORE_JOB_STATE_SUCCEEDED, "");
      return;
    }
    outcome(r, j->kind_index, what);
    PCP_LOG(PCP_LOG_INFO, &log, "%s job %s", kind, what);
  } else if (atomic_load(&r->stopping) &&
             pcp_status_code(status) == PCP_STATUS_CANCELLED) {
    // Stopping: the job stays where it is; the next start resumes it.
    pcp_status_ignore(status);
  } else if (!pcp_store_job_state_is_terminal(state)) {
    char message[PCP_STORE_ERROR_MAX_LENGTH + 1];
    snprintf(message, sizeof(message), "%s: %s",
             pcp_status_code_string(pcp_status_code(status)),
             pcp_status_message(status));
    pcp_status_ignore(status);
    PCP_LOG(PCP_LOG_WARN, &log, "%s job failed: %s", kind, message);
    params.error = message;
    bool written = true;
    const char* what = final_transition(r, j, PCP_STORE_JOB_STATE_FAILED,
                                        &params, "failed", &written);
    if (!written) {
      job_end_pending_set(r, j, PCP_STORE_JOB_STATE_FAILED, message);
      return;
    }
    outcome(r, j->kind_index, what);
  } else {
    pcp_status_ignore(status);
  }
}

static void job_execute(void* arg) {
  pcp_workloads_job_t* j = arg;
  pcp_workloads_runner_t* r = j->runner;
  const pcp_workloads_kind_t* kind = &r->kinds[j->kind_index];
  // Started just before a stop: not begun at all (the job stays queued).
  pcp_status_t status =
      atomic_load(&r->stopping)
          ? pcp_make_status(PCP_STATUS_CANCELLED, "the runner stops")
          : kind->run(kind->self, j);
  job_finish(r, j, status);
  pthread_mutex_lock(&r->mu);
  j->running = false;
  // A job with no live progress to show is forgotten (a kind like generic
  // would otherwise grow the list by every job); one with progress stays,
  // so its API JSON keeps the last progress, as the training runs did.
  bool free_it = false;
  if (!j->progress && !j->end_pending) {
    for (pcp_workloads_job_t** link = &r->jobs; *link; link = &(*link)->next) {
      if (*link == j) {
        *link = j->next;
        break;
      }
    }
    j->dropped = true;
    free_it = j->refs == 0;
  }
  scheduler_wake_locked(r);
  pthread_mutex_unlock(&r->mu);
  if (free_it) {
    job_free(r, j);
  }
}

// Ends the store refused to record (job_end_pending_set), oldest first.
static void job_ends_retry(pcp_workloads_runner_t* r) {
  for (;;) {
    pcp_workloads_job_t* target = NULL;
    pthread_mutex_lock(&r->mu);
    for (pcp_workloads_job_t* j = r->jobs; j; j = j->next) {
      if (j->end_pending && !j->running && !j->end_tried) {
        target = j;
      }
    }
    if (target) {
      target->end_tried = true;
      ++target->refs;
    }
    pthread_mutex_unlock(&r->mu);
    if (!target) {
      break;
    }
    job_end_retry(r, target);
    job_unref(r, target);
  }
  pthread_mutex_lock(&r->mu);
  for (pcp_workloads_job_t* j = r->jobs; j; j = j->next) {
    j->end_tried = false;
  }
  pthread_mutex_unlock(&r->mu);
}

pcp_status_t pcp_workloads_runner_step(pcp_workloads_runner_t* r,
                                       uint32_t* out_started) {
  uint32_t started = 0;
  if (out_started) {
    *out_started = 0;
  }
  job_ends_retry(r);
  if (atomic_load(&r->recover_pending)) {
    bool failed = false;
    PCP_RETURN_IF_ERROR_BARE(recover_pass(r, &failed));
    atomic_store(&r->recover_pending, failed);
  }
  for (uint32_t k = 0; k < r->kind_count; ++k) {
    if (atomic_load(&r->draining) || atomic_load(&r->stopping) ||
        (r->hooks.draining && r->hooks.draining(r->hooks.user_data))) {
      break;
    }
    uint32_t running = 0;
    pthread_mutex_lock(&r->mu);
    for (pcp_workloads_job_t* j = r->jobs; j; j = j->next) {
      running += j->kind_index == k && j->running;
    }
    pthread_mutex_unlock(&r->mu);
    if (running >= r->kinds[k].max_running) {
      continue;
    }
    pcp_store_job_filter_t filter = {
        .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_QUEUED),
        .kind = r->kind_names[k],
        .limit = r->kinds[k].max_running - running,
    };
    pcp_store_job_list_t list = {0};
    PCP_RETURN_IF_ERROR_BARE(pcp_store_job_list(r->store, &filter, &list));
    pcp_status_t status = pcp_ok_status();
    for (size_t i = 0; i < list.count && !status; ++i) {
      const char* id = list.items[i].id;
      pthread_mutex_lock(&r->mu);
      pcp_workloads_job_t* j = job_find_locked(r, id);
      if (j && j->running) {
        pthread_mutex_unlock(&r->mu);
        continue;
      }
      if (r->kinds[k].admit &&
          !r->kinds[k].admit(r->kinds[k].self, &list.items[i])) {
        pthread_mutex_unlock(&r->mu);
        break;  // oldest first: the younger ones wait too
      }
      if (!j) {
        // Kept after the run ends (its progress stays readable), as the
        // training run list did.
        status = pcp_allocator_calloc(r->allocator, sizeof(*j), (void**)&j);
        if (status) {
          pthread_mutex_unlock(&r->mu);
          break;
        }
        j->runner = r;
        j->kind_index = k;
        snprintf(j->id, sizeof(j->id), "%s", id);
        pthread_cond_init(&j->cv, NULL);
        j->next = r->jobs;
        r->jobs = j;
      }
      j->running = true;
      j->end_pending = false;
      atomic_store(&j->cancel, false);
      atomic_store(&j->stop, false);
      atomic_store(&j->user_data, NULL);
      json_decref(j->placement);
      j->placement = NULL;
      pthread_mutex_unlock(&r->mu);
      status = r->executor.submit(r->executor.self, job_execute, j);
      if (status) {
        pthread_mutex_lock(&r->mu);
        j->running = false;
        pthread_mutex_unlock(&r->mu);
      } else {
        ++started;
      }
    }
    pcp_store_job_list_deinitialize(&list);
    if (status) {
      log_status(r, NULL, "starting a job", status);
      pcp_status_ignore(status);
      break;
    }
  }
  // Cancelling jobs of a kind here that no run holds (its run ended just
  // as the cancel came, or a stop interrupted it): nothing is left to
  // stop, so they end cancelled.
  for (uint32_t k = 0; k < r->kind_count; ++k) {
    pcp_store_job_filter_t filter = {
        .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_CANCELLING),
        .kind = r->kind_names[k]};
    pcp_store_job_list_t list = {0};
    PCP_RETURN_IF_ERROR_BARE(pcp_store_job_list(r->store, &filter, &list));
    for (size_t i = 0; i < list.count; ++i) {
      pthread_mutex_lock(&r->mu);
      pcp_workloads_job_t* j = job_find_locked(r, list.items[i].id);
      bool running = j && j->running;
      pthread_mutex_unlock(&r->mu);
      if (!running) {
        pcp_status_ignore(pcp_workloads_runner_transition(
            r, list.items[i].id, PCP_STORE_JOB_STATE_CANCELLED, NULL));
      }
    }
    pcp_store_job_list_deinitialize(&list);
  }
  if (out_started) {
    *out_started = started;
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Threads
//===----------------------------------------------------------------------===//

static void* scheduler_main(void* opaque) {
  pcp_workloads_runner_t* r = opaque;
  while (!atomic_load(&r->stopping)) {
    pthread_mutex_lock(&r->mu);
    uint64_t seen = r->wake_count;
    pthread_mutex_unlock(&r->mu);
    pcp_status_t status = pcp_workloads_runner_step(r, NULL);
    if (status) {
      log_status(r, NULL, "job scheduling", status);
      pcp_status_ignore(status);
    }
    pthread_mutex_lock(&r->mu);
    // A wake during the round (a submit after its store read) is not
    // waited out: the next round starts at once.
    if (!atomic_load(&r->stopping) && r->wake_count == seen) {
      struct timespec deadline =
          pcp_realtime_deadline_ms(SCHEDULER_MAX_SLEEP_MS);
      pthread_cond_timedwait(&r->cv, &r->mu, &deadline);
    }
    pthread_mutex_unlock(&r->mu);
  }
  return NULL;
}

pcp_status_t pcp_workloads_runner_start(pcp_workloads_runner_t* r) {
  if (r->started) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "the runner was started already");
  }
  r->started = true;
  if (r->own_pool) {
    // Threads come with the items (pool_submit); these were queued before.
    pthread_mutex_lock(&r->mu);
    r->pool_started = true;
    bool grown = pool_grow_locked(r);
    pthread_mutex_unlock(&r->mu);
    if (!grown) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE, "job pool thread");
    }
  }
  if (pthread_create(&r->scheduler_thread, NULL, scheduler_main, r) != 0) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "job scheduler thread");
  }
  r->scheduler_started = true;
  return pcp_ok_status();
}

void pcp_workloads_runner_stop(pcp_workloads_runner_t* r) {
  atomic_store(&r->stopping, true);
  // Every job this runner runs sees should_stop and returns.
  for (;;) {
    pcp_workloads_job_t* target = NULL;
    bool call = false;
    pthread_mutex_lock(&r->mu);
    for (pcp_workloads_job_t* j = r->jobs; j && !target; j = j->next) {
      if (j->running && !atomic_load(&j->stop)) {
        target = j;
        call = job_stop_locked(r, j, false);
      }
    }
    pthread_mutex_unlock(&r->mu);
    if (!target) {
      break;
    }
    if (call) {
      job_cancel_call(r, target);
    }
  }
  pthread_mutex_lock(&r->mu);
  scheduler_wake_locked(r);
  pthread_cond_broadcast(&r->pool_cv);
  pthread_mutex_unlock(&r->mu);
  if (r->scheduler_started) {
    pthread_join(r->scheduler_thread, NULL);
    r->scheduler_started = false;
  }
  pthread_mutex_lock(&r->mu);
  uint32_t threads = r->pool_thread_count;
  pthread_mutex_unlock(&r->mu);
  for (uint32_t i = 0; i < threads; ++i) {
    pthread_join(r->pool_threads[i], NULL);
  }
  pthread_mutex_lock(&r->mu);
  r->pool_thread_count = 0;
  r->pool_idle = 0;
  pthread_mutex_unlock(&r->mu);
}

void pcp_workloads_runner_draining_set(pcp_workloads_runner_t* r,
                                       bool draining) {
  atomic_store(&r->draining, draining);
}

void pcp_workloads_runner_wake(pcp_workloads_runner_t* r) {
  pthread_mutex_lock(&r->mu);
  scheduler_wake_locked(r);
  pthread_mutex_unlock(&r->mu);
}

bool pcp_workloads_runner_idle_wait(pcp_workloads_runner_t* r,
                                    int64_t timeout_ms) {
  struct timespec deadline = pcp_realtime_deadline_ms(timeout_ms);
  pthread_mutex_lock(&r->mu);
  for (;;) {
    bool busy = false;
    for (pcp_workloads_job_t* j = r->jobs; j && !busy; j = j->next) {
      busy = j->running;
    }
    if (!busy) {
      pthread_mutex_unlock(&r->mu);
      return true;
    }
    if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) != 0) {
      break;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return false;
}

//===----------------------------------------------------------------------===//
// The job context
//===----------------------------------------------------------------------===//

const char* pcp_workloads_job_id(const pcp_workloads_job_t* job) {
  return job->id;
}

pcp_workloads_runner_t* pcp_workloads_job_runner(
    const pcp_workloads_job_t* job) {
  return job->runner;
}

pcp_clock_t pcp_workloads_job_clock(const pcp_workloads_job_t* job) {
  return job->runner->clock;
}

pcp_status_t pcp_workloads_job_transition(pcp_workloads_job_t* job,
                                          pcp_store_job_state_t to,
                                          const char* error) {
  pcp_store_job_transition_params_t params = {.error = error};
  return pcp_workloads_runner_transition(job->runner, job->id, to, &params);
}

bool pcp_workloads_job_should_stop(const pcp_workloads_job_t* job) {
  return atomic_load(&job->stop) || atomic_load(&job->runner->stopping);
}

bool pcp_workloads_job_cancel_requested(const pcp_workloads_job_t* job) {
  return atomic_load(&job->cancel);
}

bool pcp_workloads_job_wait(pcp_workloads_job_t* job, int64_t timeout_ms) {
  pcp_workloads_runner_t* r = job->runner;
  struct timespec deadline = pcp_realtime_deadline_ms(timeout_ms);
  pthread_mutex_lock(&r->mu);
  while (!pcp_workloads_job_should_stop(job)) {
    if (pthread_cond_timedwait(&job->cv, &r->mu, &deadline) != 0) {
      break;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return pcp_workloads_job_should_stop(job);
}

void pcp_workloads_job_progress_publish(pcp_workloads_job_t* job,
                                        const json_t* progress) {
  pcp_workloads_runner_t* r = job->runner;
  json_t* copy = json_deep_copy(progress);
  pthread_mutex_lock(&r->mu);
  json_decref(job->progress);
  job->progress = copy;
  pthread_mutex_unlock(&r->mu);
  changed(r, job->id);
}

void pcp_workloads_runner_job_signal(pcp_workloads_runner_t* r,
                                     const char* id) {
  pthread_mutex_lock(&r->mu);
  pcp_workloads_job_t* j = job_find_locked(r, id);
  if (j) {
    pthread_cond_broadcast(&j->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

void pcp_workloads_job_signal(pcp_workloads_job_t* job) {
  pcp_workloads_runner_t* r = job->runner;
  pthread_mutex_lock(&r->mu);
  pthread_cond_broadcast(&job->cv);
  pthread_mutex_unlock(&r->mu);
}

bool pcp_workloads_job_wait_for(pcp_workloads_job_t* job,
                                bool (*ready)(void* arg), void* arg,
                                bool stop_wakes, int64_t timeout_ms) {
  pcp_workloads_runner_t* r = job->runner;
  struct timespec deadline =
      pcp_realtime_deadline_ms(timeout_ms < 0 ? 0 : timeout_ms);
  pthread_mutex_lock(&r->mu);
  bool done = ready(arg);
  while (!done && !(stop_wakes && pcp_workloads_job_should_stop(job))) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&job->cv, &r->mu);
    } else if (pthread_cond_timedwait(&job->cv, &r->mu, &deadline) != 0) {
      done = ready(arg);
      break;
    }
    done = ready(arg);
  }
  pthread_mutex_unlock(&r->mu);
  return done;
}

void pcp_workloads_job_placement_set(pcp_workloads_job_t* job,
                                     const json_t* placement) {
  json_decref(job->placement);
  job->placement = placement ? json_deep_copy(placement) : NULL;
}

void pcp_workloads_job_user_data_set(pcp_workloads_job_t* job,
                                     void* user_data) {
  atomic_store(&job->user_data, user_data);
}

void* pcp_workloads_job_user_data(const pcp_workloads_job_t* job) {
  return atomic_load(&((pcp_workloads_job_t*)job)->user_data);
}

bool pcp_workloads_job_runner_stopping(const pcp_workloads_job_t* job) {
  return atomic_load(&job->runner->stopping);
}
