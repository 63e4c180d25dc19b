// SPDX-License-Identifier: Apache-2.0
//
// The workload runner's insides (never included outside
// src/workloads/runtime/). See runtime.h for the model.
//
// Locking: one mutex |mu| guards the job list, every job's |running| and
// |progress|, the pool queue and the flags; |cv| wakes the scheduler and the
// idle waiters, |pool_cv| the pool threads, each job's |cv| the job's own
// waits. Flags a run reads without the lock are atomics.

#ifndef PCP_WORKLOADS_RUNTIME_RUNTIME_IMPL_H_
#define PCP_WORKLOADS_RUNTIME_RUNTIME_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>

#include "workloads/workloads.h"

struct pcp_workloads_job_t {
  pcp_workloads_job_t* next;
  pcp_workloads_runner_t* runner;
  uint32_t kind_index;
  char id[PCP_STORE_ID_MAX_LENGTH + 1];
  bool running;              // guarded by runner->mu
  json_t* progress;          // guarded by runner->mu; NULL: none published
  atomic_bool cancel;        // a cancel reached it
  atomic_bool stop;          // cancel or runner stop
  pthread_cond_t cv;         // with runner->mu: pcp_workloads_job_wait
  json_t* placement;         // for the succeeded transition; run's thread only
  _Atomic(void*) user_data;  // the kind's; NULL at every start
  uint32_t refs;  // users outside runner->mu (a kind's cancel); under it
  bool dropped;   // unlinked after its run ended; under runner->mu
  // The run ended but the store refused its end (a failed write): the
  // next scheduling rounds write it again. Guarded by runner->mu.
  bool end_pending;
  pcp_store_job_state_t end_to;  // succeeded or failed
  char end_error[PCP_STORE_ERROR_MAX_LENGTH + 1];
  bool end_tried;  // in this round's retries; under runner->mu
};

// One queued call of the runner's own pool.
typedef struct pcp_workloads_pool_item_t {
  void (*fn)(void* arg);
  void* arg;
} pcp_workloads_pool_item_t;

struct pcp_workloads_runner_t {
  pcp_allocator_t allocator;
  pcp_store_t* store;
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_workloads_kind_t kinds[PCP_WORKLOADS_MAX_KINDS];
  char kind_names[PCP_WORKLOADS_MAX_KINDS][PCP_STORE_NAME_MAX_LENGTH + 1];
  uint32_t kind_count;
  pcp_workloads_executor_t executor;  // the pool's own when not injected
  bool own_pool;
  pcp_workloads_runner_hooks_t hooks;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  // Bumped with every broadcast of |cv| (|mu| held): the scheduler sleeps
  // only when none came during its round, so a wake is never lost.
  uint64_t wake_count;
  pcp_workloads_job_t* jobs;  // every job run here; guarded by |mu|
  atomic_bool draining;
  atomic_bool stopping;
  // A recovery write failed: each scheduling round runs the pass again.
  atomic_bool recover_pending;
  bool started;  // main thread

  // The own pool: |pool_threads| threads take items from a ring of
  // |pool_capacity| (the sum of the kinds' limits: the scheduler never has
  // more jobs started than that).
  pthread_cond_t pool_cv;
  pthread_t* pool_threads;
  uint32_t pool_thread_count;
  uint32_t pool_capacity;
  pcp_workloads_pool_item_t* pool_items;
  uint32_t pool_head;
  uint32_t pool_count;
  // Lazy threads (the inference kind alone allows 128 runs): a thread is
  // made when an item finds none idle, up to |pool_capacity|; none before
  // _start. Guarded by |mu|.
  uint32_t pool_idle;
  bool pool_started;

  pthread_t scheduler_thread;
  bool scheduler_started;
};

#endif  // PCP_WORKLOADS_RUNTIME_RUNTIME_IMPL_H_
