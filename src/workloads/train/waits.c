// SPDX-License-Identifier: Apache-2.0
//
// The training service's waits on fabric tasks and workers
// (service_impl.h): with the hooks' wait/signal pair a wait sleeps on one
// condition variable (the runner's, for the training kind) that a task's
// end (its DONE callback, through the job's waker) and a stop signal;
// without it, the sliced loops that poll the stop hook. Split out of
// service.c (issue 14, Deliver 1).
//
// Threading: the waits run on the job's thread; the waker's callback on the
// fabric's loop thread (or the thread releasing the endpoint).

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "workloads/train/service_impl.h"

//===----------------------------------------------------------------------===//
// Waiting on the job's fabric tasks
//===----------------------------------------------------------------------===//

struct pcp_diloco_waker_t {
  _Atomic uint32_t references;  // the job's, plus one per task not DONE
  pthread_mutex_t mu;
  // The run's hooks (wait/signal set) while it runs; NULL once detached.
  const pcp_diloco_job_hooks_t* hooks;
  pcp_allocator_t allocator;
};

pcp_status_t pcp_diloco_job_waker_create(job_t* job) {
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  if (!hooks->wait || !hooks->signal) {
    return pcp_ok_status();
  }
  pcp_diloco_waker_t* waker = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(job->allocator, sizeof(*waker), (void**)&waker));
  atomic_init(&waker->references, 1);
  pthread_mutex_init(&waker->mu, NULL);
  waker->hooks = hooks;
  waker->allocator = job->allocator;
  job->waker = waker;
  return pcp_ok_status();
}

static void waker_release(pcp_diloco_waker_t* waker) {
  if (waker && atomic_fetch_sub(&waker->references, 1) == 1) {
    pthread_mutex_destroy(&waker->mu);
    pcp_allocator_free(waker->allocator, waker);
  }
}

void pcp_diloco_job_waker_detach(job_t* job) {
  pcp_diloco_waker_t* waker = job->waker;
  if (!waker) {
    return;
  }
  pthread_mutex_lock(&waker->mu);
  waker->hooks = NULL;
  pthread_mutex_unlock(&waker->mu);
  job->waker = NULL;
  waker_release(waker);
}

// A task's callback (the fabric's loop thread, or the thread releasing the
// endpoint). The task is marked done before DONE runs, so a waiter that
// evaluates its ready function after this signal sees it.
static void waker_task_event(void* user_data, pcp_fabric_task_t* task,
                             pcp_fabric_task_event_t event) {
  (void)task;
  if (event != PCP_FABRIC_TASK_EVENT_DONE) {
    return;
  }
  pcp_diloco_waker_t* waker = user_data;
  pthread_mutex_lock(&waker->mu);
  if (waker->hooks) {
    waker->hooks->signal(waker->hooks->user_data);
  }
  pthread_mutex_unlock(&waker->mu);
  waker_release(waker);
}

pcp_status_t pcp_diloco_job_task_submit(job_t* job,
                                        pcp_fabric_task_params_t* params,
                                        pcp_fabric_task_t** out_task) {
  pcp_diloco_waker_t* waker = job->waker;
  if (waker) {
    params->callback = waker_task_event;
    params->user_data = waker;
    atomic_fetch_add(&waker->references, 1);
  }
  // Every task of the job runs in its worker class (the fabric refuses a
  // worker of another one).
  params->worker_class_name = job->config.worker_class;
  pcp_status_t status =
      pcp_fabric_task_submit(job->options->fabric, params, out_task);
  if (status) {
    waker_release(waker);  // no callback runs after a failed submit
  }
  return status;
}

static void tasks_cancel(pcp_fabric_task_t* const* tasks, size_t count) {
  for (size_t j = 0; j < count; ++j) {
    if (tasks[j]) {
      pcp_fabric_task_cancel(tasks[j]);
    }
  }
}

static void tasks_late_log(job_t* job, pcp_fabric_task_t* const* tasks,
                           size_t count, int64_t timeout_ms, const char* what) {
  size_t left = 0;
  for (size_t j = 0; j < count; ++j) {
    left += tasks[j] && !pcp_fabric_task_is_done(tasks[j]);
  }
  PCP_LOG(PCP_LOG_WARN, &job->log,
          "%s: %zu of %zu tasks not done after %lld s: cancelled", what, left,
          count, (long long)(timeout_ms / 1000));
}

typedef struct tasks_ready_t {
  pcp_fabric_task_t* const* tasks;
  size_t count;
} tasks_ready_t;

// Under the waiter's lock: only atomic reads.
static bool tasks_all_done(void* arg) {
  const tasks_ready_t* ready = arg;
  for (size_t k = 0; k < ready->count; ++k) {
    if (ready->tasks[k] && !pcp_fabric_task_is_done(ready->tasks[k])) {
      return false;
    }
  }
  return true;
}

// Without a waker: each task in turn, in slices, polling the stop hook
// between them (a stop is seen within WAIT_SLICE_MS).
static bool tasks_wait_sliced(job_t* job, pcp_fabric_task_t* const* tasks,
                              size_t count, int64_t timeout_ms,
                              const char* what) {
  pcp_clock_t clock = job->options->clock;
  int64_t deadline = pcp_clock_now_ns(clock) + timeout_ms * 1000000;
  bool stopped = false;
  bool expired = false;
  for (size_t k = 0; k < count; ++k) {
    while (tasks[k] && !pcp_fabric_task_wait(tasks[k], WAIT_SLICE_MS)) {
      bool stop = !stopped && pcp_diloco_job_should_stop(job);
      bool late = !expired && pcp_clock_now_ns(clock) >= deadline;
      if (!stop && !late) {
        continue;
      }
      if (late) {
        tasks_late_log(job, tasks, count, timeout_ms, what);
      }
      stopped = stopped || stop;
      expired = expired || late;
      tasks_cancel(tasks, count);
    }
  }
  return stopped;
}

bool pcp_diloco_job_tasks_wait(job_t* job, pcp_fabric_task_t* const* tasks,
                               size_t count, int64_t timeout_ms,
                               const char* what) {
  if (!job->waker) {
    return tasks_wait_sliced(job, tasks, count, timeout_ms, what);
  }
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  pcp_clock_t clock = job->options->clock;
  int64_t deadline = pcp_clock_now_ns(clock) + timeout_ms * 1000000;
  tasks_ready_t ready = {.tasks = tasks, .count = count};
  bool stopped = false;
  bool expired = false;
  for (;;) {
    // The deadline is on the job's clock; the waiter's timeout is real
    // time, so an early wake-up only goes round again.
    int64_t left_ms = -1;
    if (!expired) {
      int64_t left_ns = deadline - pcp_clock_now_ns(clock);
      left_ms = left_ns <= 0 ? 0 : (left_ns + 999999) / 1000000;
    }
    // Once stopped, the flag stays set: it must not wake the wait again.
    if (hooks->wait(hooks->user_data, tasks_all_done, &ready, !stopped,
                    left_ms)) {
      break;
    }
    bool stop = !stopped && pcp_diloco_job_should_stop(job);
    bool late = !expired && pcp_clock_now_ns(clock) >= deadline;
    if (!stop && !late) {
      continue;
    }
    if (late) {
      tasks_late_log(job, tasks, count, timeout_ms, what);
    }
    stopped = stopped || stop;
    expired = expired || late;
    tasks_cancel(tasks, count);
  }
  return stopped;
}

bool pcp_diloco_job_stop_fn(void* user_data) {
  return pcp_diloco_job_should_stop(user_data);
}

pcp_status_t pcp_diloco_job_workers_wait(job_t* job, uint32_t count,
                                         int64_t timeout_ms) {
  pcp_fabric_endpoint_t* fabric = job->options->fabric;
  int64_t deadline = pcp_fabric_endpoint_now_ns(fabric) + timeout_ms * 1000000;
  return pcp_fabric_workers_wait_class(
      fabric, NULL, NULL, job->config.worker_class, count, deadline,
      pcp_diloco_job_stop_fn, job, NULL);
}
