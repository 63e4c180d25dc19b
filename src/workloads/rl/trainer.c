// SPDX-License-Identifier: Apache-2.0
// The GRPO policy update on workers (trainer.h; docs/rl.md "The trainer").
//
// Two programs per (backend, target), compiled through the compile queue:
//   objective: the @grpo module of rl.h as emitted, plus @load(params...)
//              -> params... (the parameters as they came, so a task can keep
//              them resident in a session: the inference server's trick);
//              @grpo_metrics gives the metrics and the per-token logp;
//   training:  the module PCP's autodiff derives from @grpo (TRAIN, the
//              AdamW fields of the options, --accumulate A), derived here
//              with pcp_compile_training_module_build because the queue's
//              spec has no field for the function name, the data arguments
//              or the AdamW constants: @compute_gradients_accumulated (A > 1,
//              else @compute_gradients) and @apply_optimizer.
// Both are compiled as plain modules (no queue-side derivation), so their
// artifact keys are hashes of the exact text.
//
// Placement is by worker id: the trainer lists the connected workers whose
// JOIN named its worker class (pcp_fabric_worker_info_t.worker_class; ""
// takes every worker), in worker id order, and pins each task to one of
// them (naming the class too, which the fabric checks). That gives the
// data-parallel split the update needs (whole micro-batches per task) without a
// gang: a step never waits for W workers to be free at once, and the same split
// is reproducible.
//
// Every worker taking part holds one session "<prefix>:<k>" (k a counter,
// fresh after the worker was lost or failed, since a lost worker's sessions
// are gone): the reference parameters as "r<i>" (uploaded once per
// reference_set, not per call) and the current policy as "p<i>" (uploaded
// once per update, then read by every gradient and metrics task of that
// worker). Phases wait for each other (loads, then compute, then the
// optimizer) so a task never reads a tensor another task is still writing.
//
// Failures: a task that fails, a worker lost, a task past its timeout fail
// the call with that status; the other tasks are cancelled and waited for
// (their inputs are borrowed until they end), and nothing is written.

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// workloads.h first: rollout.h (through trainer.h) uses the sampling types
// that infer.h expects workloads.h to have declared.
// clang-format off
#include "workloads/workloads.h"
#include "workloads/rl/rl.h"
#include "workloads/rl/trainer.h"
// clang-format on

// Workers one step spreads over (and sessions kept).
#define MAX_WORKERS 256u
// Distinct (backend, target) pairs compiled for.
#define MAX_TARGETS 16u
// session_prefix and worker_class lengths.
#define MAX_PREFIX_LENGTH 128u
#define MAX_CLASS_LENGTH 63u
// Rows of one call (R x T per tensor; the gateway holds a few copies), and
// micro-batches of one call (a task each).
#define MAX_ROWS ((int64_t)1 << 20)
#define MAX_MICRO_BATCHES ((int64_t)1 << 16)
#define DEFAULT_TASK_TIMEOUT_MS 600000
#define MAX_TASK_TIMEOUT_MS ((int64_t)7 * 24 * 3600 * 1000)
// Tensors moved by one @load<g> task: a frame carries at most
// pcp_proto_limits_default().max_sections (64) inline sections, so every
// transfer of all n tensors is split into groups of this many.
#define GROUP 32u
// Where each kind of resident name starts in names (x n).
enum { NAME_REF = 0, NAME_POLICY = 1, NAME_M = 2, NAME_V = 3, NAME_GRAD = 4 };
// How often a wait looks at stop(), deadlines and lost workers.
#define POLL_MS 20
// A text module is at most this large (the builder's cap).
#define MAX_MODULE_BYTES ((size_t)256 << 20)
#define MAX_VMFB_BYTES ((size_t)1 << 30)

typedef struct target_programs_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint8_t objective[PCP_SHA256_BYTE_LENGTH];
  uint8_t training[PCP_SHA256_BYTE_LENGTH];
} target_programs_t;

typedef struct worker_slot_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[MAX_PREFIX_LENGTH + 32];
  // The worker's join count when the session was made: a different count
  // means it left and joined again (its sessions are gone).
  uint32_t join_count;
  // reference_generation whose "r<i>" the session holds (0: none).
  uint64_t reference_generation;
  bool live;
} worker_slot_t;

// What the tasks of one API call borrow: the memory their inputs point
// into (copies of the caller's tensors, scalars, the gradient to upload)
// and the handles of tasks not known to have ended. A call that ends early
// (stop, a failure, a lost worker) cancels its tasks and returns at once;
// when some have not ended yet, the call becomes an orphan of the trainer,
// freed once they have (looked at by the next call) or at release (which
// waits for them). So a stop returns within a poll, not after the running
// task, and the caller may free its tensors as soon as a call returns.
typedef struct call_t {
  struct call_t* next;
  pcp_fabric_task_t** pending;
  size_t pending_count;
  size_t pending_capacity;
  void** blocks;
  size_t block_count;
  size_t block_capacity;
} call_t;

// A worker chosen for one call: its slot and programs.
typedef struct chosen_t {
  worker_slot_t* slot;
  const target_programs_t* programs;
} chosen_t;

struct pcp_workloads_rl_trainer_t {
  pcp_allocator_t allocator;
  pcp_workloads_rl_trainer_options_t options;
  char worker_class[MAX_CLASS_LENGTH + 1];
  char session_prefix[MAX_PREFIX_LENGTH + 1];
  char log_role[64], log_node[128], log_connection[128], log_job[256];
  pcp_models_parameter_table_t table;
  size_t n;                // tensors
  size_t parameter_count;  // f32 elements of all of them
  size_t* offsets;         // n: element offset of tensor i
  size_t groups;           // @load<g> functions: GROUP tensors each
  // 5n + 1 resident names: "r<i>" (reference), "p<i>" (policy), "m<i>",
  // "v<i>" (moments) and "g<i>" (the summed gradient), at NAME_* x n.
  char (*names)[48];
  char dir[512];  // module texts for the compile queue ("": none)
  char objective_path[600];
  char training_path[600];
  char objective_hash[PCP_SHA256_HEX_LENGTH + 1];
  char training_hash[PCP_SHA256_HEX_LENGTH + 1];
  target_programs_t targets[MAX_TARGETS];
  uint32_t target_count;
  float* reference;  // parameter_count, NULL until reference_set
  uint64_t reference_generation;
  worker_slot_t slots[MAX_WORKERS];
  uint32_t slot_count;
  uint64_t session_counter;
  call_t* call;     // the running call (between call_begin and call_end)
  call_t* orphans;  // ended calls whose tasks have not all ended
};

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

static bool finite_in(double x, double lo, double hi) {
  return isfinite(x) && x >= lo && x <= hi;
}

// Session names travel as strings of at most PCP_PROTO_MAX_STRING_BYTES and
// end up in log lines: a plain alphabet keeps both safe.
static bool prefix_valid(const char* s) {
  size_t length = strlen(s);
  if (length == 0 || length > MAX_PREFIX_LENGTH) {
    return false;
  }
  for (size_t i = 0; i < length; ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
              c == ':';
    if (!ok) {
      return false;
    }
  }
  return true;
}

static pcp_status_t options_validate(
    const pcp_workloads_rl_trainer_options_t* o) {
  if (!o) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "options: required");
  }
  if (!o->fabric) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "fabric: required");
  }
  if (!o->compile_queue) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "compile_queue: required");
  }
  pcp_status_t status = pcp_models_spec_validate(&o->spec);
  if (status) {
    return pcp_status_annotate_f(status, "spec");
  }
  if (o->spec.dtype != PCP_ELEMENT_TYPE_F32) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "spec.dtype: the trainer takes f32 models only");
  }
  if (o->accumulation_steps < 1 ||
      o->accumulation_steps > PCP_COMPILE_MAX_ACCUMULATION_STEPS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "accumulation_steps: %lld not in [1, %d]",
        (long long)o->accumulation_steps, PCP_COMPILE_MAX_ACCUMULATION_STEPS);
  }
  if (o->worker_class && o->worker_class[0] &&
      !pcp_sched_class_name_is_valid(o->worker_class)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker_class: not 1..%u bytes of [A-Za-z0-9._-]",
                           MAX_CLASS_LENGTH);
  }
  if (o->max_workers < 1 || o->max_workers > MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "max_workers: %u not in [1, %u]", o->max_workers,
                           MAX_WORKERS);
  }
  if (!finite_in(o->beta1, 0.0, 0.999999)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "beta1: %g not in [0, 0.999999]", o->beta1);
  }
  if (!finite_in(o->beta2, 0.0, 0.999999)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "beta2: %g not in [0, 0.999999]", o->beta2);
  }
  if (!finite_in(o->eps, 0.0, 1.0) || o->eps <= 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "eps: %g not in (0, 1]",
                           o->eps);
  }
  if (!finite_in(o->weight_decay, 0.0, 10.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "weight_decay: %g not in [0, 10]", o->weight_decay);
  }
  if (!finite_in(o->grad_clip, 0.0, 1e6)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "grad_clip: %g not in [0, 1e6]", o->grad_clip);
  }
  if (!o->session_prefix || !prefix_valid(o->session_prefix)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "session_prefix: 1..%u bytes of [A-Za-z0-9._:-] required",
        MAX_PREFIX_LENGTH);
  }
  if (o->task_timeout_ms < 0 || o->task_timeout_ms > MAX_TASK_TIMEOUT_MS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "task_timeout_ms: %lld not in [0, %lld]",
        (long long)o->task_timeout_ms, (long long)MAX_TASK_TIMEOUT_MS);
  }
  return pcp_ok_status();
}

static void copy_text(char* out, size_t capacity, const char* text) {
  snprintf(out, capacity, "%s", text ? text : "");
}

static void orphans_reap(pcp_workloads_rl_trainer_t* t, bool wait);

static void dir_remove(pcp_workloads_rl_trainer_t* t) {
  if (!t->dir[0]) {
    return;
  }
  if (t->objective_path[0]) {
    unlink(t->objective_path);
  }
  if (t->training_path[0]) {
    unlink(t->training_path);
  }
  rmdir(t->dir);
  t->dir[0] = '\0';
}

pcp_status_t pcp_workloads_rl_trainer_create(
    const pcp_workloads_rl_trainer_options_t* options,
    pcp_allocator_t allocator, pcp_workloads_rl_trainer_t** out_trainer) {
  if (!out_trainer) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "out_trainer: NULL");
  }
  *out_trainer = NULL;
  PCP_RETURN_IF_ERROR_BARE(options_validate(options));
  pcp_workloads_rl_trainer_t* t = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, sizeof(*t), (void**)&t),
                      "trainer");
  t->allocator = allocator;
  t->options = *options;
  copy_text(t->worker_class, sizeof(t->worker_class), options->worker_class);
  copy_text(t->session_prefix, sizeof(t->session_prefix),
            options->session_prefix);
  t->options.worker_class = t->worker_class;
  t->options.session_prefix = t->session_prefix;
  if (!t->options.task_timeout_ms) {
    t->options.task_timeout_ms = DEFAULT_TASK_TIMEOUT_MS;
  }
  // The log context's strings are copied too (options are the caller's).
  const pcp_log_context_t* log = &options->log;
  copy_text(t->log_role, sizeof(t->log_role), log->role);
  copy_text(t->log_node, sizeof(t->log_node), log->node_id);
  copy_text(t->log_connection, sizeof(t->log_connection), log->connection_id);
  copy_text(t->log_job, sizeof(t->log_job), log->job_id);
  t->options.log = (pcp_log_context_t){
      .role = log->role ? t->log_role : NULL,
      .node_id = log->node_id ? t->log_node : NULL,
      .connection_id = log->connection_id ? t->log_connection : NULL,
      .job_id = log->job_id ? t->log_job : NULL,
  };
  pcp_status_t status = pcp_models_parameter_table_initialize(
      &options->spec, allocator, &t->table);
  if (status) {
    pcp_allocator_free(allocator, t);
    return pcp_status_annotate_f(status, "spec");
  }
  t->n = t->table.count;
  t->groups = (t->n + GROUP - 1) / GROUP;
  // @apply_optimizer takes 4n + 2 tensors in one task.
  if (4 * t->n + 2 > PCP_PROTO_MAX_TASK_TENSORS) {
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "spec: %zu parameter tensors; @apply_optimizer's 4n + 2 inputs exceed "
        "the %u tensors of a task",
        t->n, PCP_PROTO_MAX_TASK_TENSORS);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, (t->n + 1) * sizeof(*t->offsets),
                                  (void**)&t->offsets);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, (5 * t->n + 1) * sizeof(*t->names),
                                  (void**)&t->names);
  }
  if (status) {
    pcp_workloads_rl_trainer_release(t);
    return pcp_status_annotate_f(status, "trainer");
  }
  for (size_t i = 0; i < t->n; ++i) {
    t->offsets[i] = t->parameter_count;
    t->parameter_count += (size_t)t->table.parameters[i].element_count;
    static const char kKinds[5] = {'r', 'p', 'm', 'v', 'g'};
    for (size_t k = 0; k < 5; ++k) {
      snprintf(t->names[k * t->n + i], sizeof(t->names[0]), "%c%zu", kKinds[k],
               i);
    }
  }
  *out_trainer = t;
  return pcp_ok_status();
}

void pcp_workloads_rl_trainer_release(pcp_workloads_rl_trainer_t* trainer) {
  if (!trainer) {
    return;
  }
  // The workers' sessions: the fabric has no call that drops one, so they
  // stay until the worker's session store evicts them (least recently used
  // under its memory limit) or the worker leaves. Nothing is sent here.
  // Tasks of calls that ended early still read the trainer's memory.
  orphans_reap(trainer, true);
  dir_remove(trainer);
  pcp_allocator_t a = trainer->allocator;
  pcp_allocator_free(a, trainer->reference);
  pcp_allocator_free(a, trainer->offsets);
  pcp_allocator_free(a, trainer->names);
  if (trainer->table.parameters) {
    pcp_models_parameter_table_deinitialize(&trainer->table);
  }
  pcp_allocator_free(a, trainer);
}

const pcp_models_parameter_table_t* pcp_workloads_rl_trainer_table(
    const pcp_workloads_rl_trainer_t* trainer) {
  return &trainer->table;
}

static bool should_stop(const pcp_workloads_rl_trainer_t* t) {
  return t->options.stop && t->options.stop(t->options.stop_user_data);
}

static int64_t now_ns(const pcp_workloads_rl_trainer_t* t) {
  return pcp_fabric_endpoint_now_ns(t->options.fabric);
}

//===----------------------------------------------------------------------===//
// Calls and their orphans
//===----------------------------------------------------------------------===//

static void call_free(pcp_workloads_rl_trainer_t* t, call_t* call) {
  for (size_t i = 0; i < call->pending_count; ++i) {
    pcp_fabric_task_release(call->pending[i]);
  }
  for (size_t i = 0; i < call->block_count; ++i) {
    pcp_allocator_free(t->allocator, call->blocks[i]);
  }
  pcp_allocator_free(t->allocator, call->pending);
  pcp_allocator_free(t->allocator, call->blocks);
  pcp_allocator_free(t->allocator, call);
}

// Frees the orphans whose tasks have all ended; with |wait|, cancels and
// waits for every one first (their inputs are borrowed until they end;
// the fabric bounds a cancelled task's wait).
static void orphans_reap(pcp_workloads_rl_trainer_t* t, bool wait) {
  call_t** link = &t->orphans;
  while (*link) {
    call_t* call = *link;
    bool ended = true;
    for (size_t i = 0; i < call->pending_count; ++i) {
      if (wait) {
        pcp_fabric_task_cancel(call->pending[i]);
        pcp_fabric_task_wait(call->pending[i], -1);
      }
      ended = ended && pcp_fabric_task_is_done(call->pending[i]);
    }
    if (ended) {
      *link = call->next;
      call_free(t, call);
    } else {
      link = &call->next;
    }
  }
}

static pcp_status_t call_begin(pcp_workloads_rl_trainer_t* t) {
  orphans_reap(t, false);
  PCP_ASSERT(!t->call);
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(t->allocator, sizeof(*t->call), (void**)&t->call),
      "trainer call");
  return pcp_ok_status();
}

static void call_end(pcp_workloads_rl_trainer_t* t) {
  call_t* call = t->call;
  t->call = NULL;
  if (call && call->pending_count) {
    call->next = t->orphans;
    t->orphans = call;
  } else if (call) {
    call_free(t, call);
  }
}

// |bytes| of memory the call's tasks may borrow (freed with the call).
static pcp_status_t call_alloc(pcp_workloads_rl_trainer_t* t, size_t bytes,
                               void** out) {
  call_t* call = t->call;
  if (call->block_count == call->block_capacity) {
    size_t capacity = call->block_capacity ? 2 * call->block_capacity : 16;
    void* blocks = call->blocks;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_realloc(t->allocator, capacity * sizeof(void*), &blocks),
        "trainer call");
    call->blocks = blocks;
    call->block_capacity = capacity;
  }
  PCP_RETURN_IF_ERROR(
      pcp_allocator_malloc(t->allocator, bytes ? bytes : 1, out),
      "trainer call: %zu bytes", bytes);
  call->blocks[call->block_count++] = *out;
  return pcp_ok_status();
}

// Keeps the handle of a task that has not ended with the call. Out of
// memory, it waits for the task instead (its inputs are the call's).
static void call_keep(pcp_workloads_rl_trainer_t* t, pcp_fabric_task_t* task) {
  call_t* call = t->call;
  if (call->pending_count == call->pending_capacity) {
    size_t capacity = call->pending_capacity ? 2 * call->pending_capacity : 16;
    void* pending = call->pending;
    pcp_status_t status = pcp_allocator_realloc(
        t->allocator, capacity * sizeof(*call->pending), &pending);
    if (status) {
      pcp_status_ignore(status);
      pcp_fabric_task_cancel(task);
      pcp_fabric_task_wait(task, -1);
      pcp_fabric_task_release(task);
      return;
    }
    call->pending = pending;
    call->pending_capacity = capacity;
  }
  call->pending[call->pending_count++] = task;
}

//===----------------------------------------------------------------------===//
// Workers
//===----------------------------------------------------------------------===//

static bool class_matches(const pcp_workloads_rl_trainer_t* t,
                          const pcp_fabric_worker_info_t* info) {
  return !t->worker_class[0] || !strcmp(t->worker_class, info->worker_class);
}

static const target_programs_t* programs_find(
    const pcp_workloads_rl_trainer_t* t, const char* backend,
    const char* target) {
  for (uint32_t i = 0; i < t->target_count; ++i) {
    if (!strcmp(t->targets[i].backend, backend) &&
        !strcmp(t->targets[i].target, target)) {
      return &t->targets[i];
    }
  }
  return NULL;
}

static worker_slot_t* slot_get(pcp_workloads_rl_trainer_t* t,
                               const pcp_fabric_worker_info_t* info) {
  worker_slot_t* slot = NULL;
  for (uint32_t i = 0; i < t->slot_count && !slot; ++i) {
    if (!strcmp(t->slots[i].worker_id, info->worker_id)) {
      slot = &t->slots[i];
    }
  }
  if (!slot) {
    if (t->slot_count < MAX_WORKERS) {
      slot = &t->slots[t->slot_count++];
    } else {
      // Slots of workers long gone are reused: the first one not live.
      for (uint32_t i = 0; i < t->slot_count && !slot; ++i) {
        if (!t->slots[i].live) {
          slot = &t->slots[i];
        }
      }
      if (!slot) {
        return NULL;
      }
    }
    memset(slot, 0, sizeof(*slot));
    copy_text(slot->worker_id, sizeof(slot->worker_id), info->worker_id);
  }
  if (slot->live && slot->join_count != info->join_count) {
    slot->live = false;  // it joined again: its session is gone
  }
  if (!slot->live) {
    snprintf(slot->session, sizeof(slot->session), "%s:%" PRIu64,
             t->session_prefix, ++t->session_counter);
    slot->join_count = info->join_count;
    slot->reference_generation = 0;
    slot->live = true;
  }
  return slot;
}

// The connected workers of the class whose (backend, target) has programs
// (worker id order), at most |max| of them, each with its slot.
// UNAVAILABLE when there is none.
static pcp_status_t workers_choose(pcp_workloads_rl_trainer_t* t, uint32_t max,
                                   chosen_t* out, uint32_t* out_count) {
  *out_count = 0;
  pcp_fabric_worker_info_t* infos = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(t->allocator, MAX_WORKERS * sizeof(*infos),
                           (void**)&infos),
      "worker list");
  uint32_t count =
      pcp_fabric_worker_list(t->options.fabric, infos, MAX_WORKERS, NULL);
  uint32_t of_class = 0;
  for (uint32_t i = 0; i < count && *out_count < max; ++i) {
    const pcp_fabric_worker_info_t* w = &infos[i];
    if (w->state != PCP_FABRIC_WORKER_CONNECTED || !class_matches(t, w)) {
      continue;
    }
    ++of_class;
    const target_programs_t* programs = programs_find(t, w->backend, w->target);
    if (!programs) {
      continue;  // joined since prepare: prepare again to use it
    }
    worker_slot_t* slot = slot_get(t, w);
    if (!slot) {
      break;
    }
    out[*out_count] = (chosen_t){.slot = slot, .programs = programs};
    ++*out_count;
  }
  pcp_allocator_free(t->allocator, infos);
  if (!*out_count) {
    return pcp_make_status(
        PCP_STATUS_UNAVAILABLE,
        of_class ? "no connected worker of class '%s' has the trainer's "
                   "programs (prepare first)"
                 : "no connected worker of class '%s'",
        t->worker_class);
  }
  return pcp_ok_status();
}

static bool worker_connected(pcp_workloads_rl_trainer_t* t,
                             const worker_slot_t* slot) {
  pcp_fabric_worker_info_t info;
  pcp_status_t status =
      pcp_fabric_worker_query(t->options.fabric, slot->worker_id, &info);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return info.state == PCP_FABRIC_WORKER_CONNECTED &&
         info.join_count == slot->join_count;
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

// One phase's tasks: handles and the slot each is pinned to.
typedef struct batch_of_tasks_t {
  pcp_fabric_task_t** tasks;
  worker_slot_t** slots;
  size_t count;
  size_t capacity;
} batch_of_tasks_t;

static pcp_status_t tasks_initialize(pcp_workloads_rl_trainer_t* t,
                                     size_t capacity, batch_of_tasks_t* out) {
  memset(out, 0, sizeof(*out));
  pcp_status_t status = pcp_allocator_calloc(
      t->allocator, (capacity + 1) * sizeof(*out->tasks), (void**)&out->tasks);
  if (!status) {
    status =
        pcp_allocator_calloc(t->allocator, (capacity + 1) * sizeof(*out->slots),
                             (void**)&out->slots);
  }
  out->capacity = capacity;
  return status;
}

// Releases the handles of ended tasks; one still running stays with the
// call (its worker's session is not trusted again: the cancelled task may
// still write to it).
static void tasks_deinitialize(pcp_workloads_rl_trainer_t* t,
                               batch_of_tasks_t* b) {
  for (size_t i = 0; i < b->count; ++i) {
    if (pcp_fabric_task_is_done(b->tasks[i])) {
      pcp_fabric_task_release(b->tasks[i]);
    } else {
      b->slots[i]->live = false;
      call_keep(t, b->tasks[i]);
    }
  }
  pcp_allocator_free(t->allocator, b->tasks);
  pcp_allocator_free(t->allocator, b->slots);
  memset(b, 0, sizeof(*b));
}

// Submits |params| pinned to |slot|'s worker and session, one attempt: a
// re-run on another worker would not find the session's tensors.
static pcp_status_t task_submit(pcp_workloads_rl_trainer_t* t,
                                batch_of_tasks_t* b, worker_slot_t* slot,
                                pcp_fabric_task_params_t* params) {
  PCP_ASSERT(b->count < b->capacity);
  params->worker_id = slot->worker_id;
  // The fabric checks the class too: a worker that joined again with
  // another class fails the task instead of running it.
  params->worker_class_name = t->worker_class[0] ? t->worker_class : NULL;
  params->session_id = slot->session;
  params->max_attempts = 1;
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR(pcp_fabric_task_submit(t->options.fabric, params, &task),
                      "%s on worker %s", params->function, slot->worker_id);
  b->tasks[b->count] = task;
  b->slots[b->count] = slot;
  ++b->count;
  return pcp_ok_status();
}

static void tasks_cancel(batch_of_tasks_t* b) {
  for (size_t i = 0; i < b->count; ++i) {
    pcp_fabric_task_cancel(b->tasks[i]);
  }
}

// Waits for every task of |b|. A failed task, a lost worker, a task past
// its deadline or stop() cancels them all and is returned at once (tasks
// still running stay with the call: tasks_deinitialize); the workers of
// failed tasks lose their sessions. |per_worker| is the most tasks one
// worker runs in the phase: the deadline is that many task timeouts, since
// a worker runs its tasks one after another. A failed |status| (a submit
// that failed half-way) cancels the submitted tasks and is returned.
static pcp_status_t tasks_wait(pcp_workloads_rl_trainer_t* t,
                               batch_of_tasks_t* b, size_t per_worker,
                               const char* what, pcp_status_t status) {
  int64_t timeout_ms = t->options.task_timeout_ms * (int64_t)per_worker;
  int64_t deadline = now_ns(t) + timeout_ms * 1000000;
  size_t next = 0;  // tasks before it are done
  while (!status && next < b->count) {
    if (pcp_fabric_task_wait(b->tasks[next], POLL_MS)) {
      // The task waited on may be the one that failed: the call ends now,
      // not once the other workers' tasks have ended too.
      pcp_status_t failed = pcp_fabric_task_status(b->tasks[next]);
      if (failed) {
        b->slots[next]->live = false;
        status =
            pcp_status_annotate_f(pcp_status_clone(failed), "%s on worker %s",
                                  what, b->slots[next]->worker_id);
        break;
      }
      ++next;
      continue;
    }
    for (size_t i = next + 1; i < b->count && !status; ++i) {
      pcp_status_t failed = pcp_fabric_task_is_done(b->tasks[i])
                                ? pcp_fabric_task_status(b->tasks[i])
                                : pcp_ok_status();
      if (failed) {
        b->slots[i]->live = false;
        status =
            pcp_status_annotate_f(pcp_status_clone(failed), "%s on worker %s",
                                  what, b->slots[i]->worker_id);
      }
    }
    if (status) {
      break;
    }
    if (should_stop(t)) {
      status = pcp_make_status(PCP_STATUS_CANCELLED, "%s: stopped", what);
    } else if (now_ns(t) > deadline) {
      status = pcp_make_status(
          PCP_STATUS_DEADLINE_EXCEEDED,
          "%s: a task on worker %s did not finish in %lld ms", what,
          b->slots[next]->worker_id, (long long)timeout_ms);
    } else {
      // Each worker once per poll (a phase may hold thousands of tasks).
      worker_slot_t* seen[MAX_WORKERS];
      uint32_t seen_count = 0;
      for (size_t i = next; i < b->count && !status; ++i) {
        bool checked = false;
        for (uint32_t k = 0; k < seen_count && !checked; ++k) {
          checked = seen[k] == b->slots[i];
        }
        if (checked || pcp_fabric_task_is_done(b->tasks[i])) {
          continue;
        }
        if (seen_count < MAX_WORKERS) {
          seen[seen_count++] = b->slots[i];
        }
        if (!worker_connected(t, b->slots[i])) {
          status =
              pcp_make_status(PCP_STATUS_UNAVAILABLE, "%s: worker %s was lost",
                              what, b->slots[i]->worker_id);
          b->slots[i]->live = false;
        }
      }
    }
  }
  if (status) {
    tasks_cancel(b);
  }
  for (size_t i = 0; i < b->count; ++i) {
    pcp_status_t task_status = pcp_fabric_task_status(b->tasks[i]);
    if (task_status && pcp_status_code(task_status) != PCP_STATUS_CANCELLED) {
      // A task cancelled here changed nothing the next call relies on
      // (loads are checked by their own phase); any other failure may
      // have left the session half-written.
      b->slots[i]->live = false;
    }
    if (task_status) {
      if (!status) {
        status = pcp_status_annotate_f(pcp_status_clone(task_status),
                                       "%s on worker %s", what,
                                       b->slots[i]->worker_id);
      }
    }
  }
  return status;
}

// The outputs of a done task, checked: |count| sections, section i f32 of
// |sizes[i]| bytes (sizes NULL: not checked).
static pcp_status_t task_outputs(pcp_fabric_task_t* task, const char* what,
                                 size_t count, const size_t* sizes,
                                 const pcp_proto_section_t** out) {
  size_t got = 0;
  PCP_RETURN_IF_ERROR(pcp_fabric_task_outputs(task, out, &got), "%s", what);
  if (got != count) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "%s returned %zu tensors, expected %zu", what, got,
                           count);
  }
  for (size_t i = 0; sizes && i < count; ++i) {
    const pcp_proto_section_t* s = &(*out)[i];
    if (!s->data || s->element_type != PCP_ELEMENT_TYPE_F32 ||
        s->byte_length != sizes[i]) {
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "%s: output %zu is not %zu bytes of f32", what, i,
                             sizes[i]);
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Sections
//===----------------------------------------------------------------------===//

static void section_parameter(const pcp_workloads_rl_trainer_t* t, size_t i,
                              const float* data, pcp_proto_section_t* s) {
  const pcp_models_parameter_t* p = &t->table.parameters[i];
  memset(s, 0, sizeof(*s));
  s->name = t->table.parameters[i].name;
  s->element_type = PCP_ELEMENT_TYPE_F32;
  s->rank = (uint32_t)p->rank;
  for (int32_t d = 0; d < p->rank; ++d) {
    s->shape[d] = p->dims[d];
  }
  s->byte_length = (uint64_t)p->element_count * sizeof(float);
  s->data = data;
}

// A data section: |lead| leading dimensions (0..2: [A], [A, B] / [B]) then
// |inner| dims.
static pcp_proto_section_t section_data(const char* name,
                                        pcp_element_type_t type,
                                        const void* data, uint32_t rank,
                                        const int64_t* dims) {
  pcp_proto_section_t s;
  memset(&s, 0, sizeof(s));
  s.name = name;
  s.element_type = type;
  s.rank = rank;
  uint64_t elements = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    s.shape[d] = dims[d];
    elements *= (uint64_t)dims[d];
  }
  s.byte_length = elements * 4;  // i32 and f32 only
  s.data = data;
  return s;
}

// The 11 data sections of @grpo / @grpo_metrics for |micro| micro-batches
// starting at row |row| (micro = 0: one micro-batch without the leading
// dimension). |scalars| holds 5 arrays of max(micro, 1) floats: clip_low,
// clip_high, beta, token_normalizer, temperature. |ref_logp| NULL: the
// batch's old_logp stands in (ref_logp is not read for a logp).
static void sections_batch(const pcp_workloads_rl_trainer_t* t,
                           const pcp_workloads_rl_batch_t* batch, int64_t row,
                           int64_t micro, const float* ref_logp,
                           float* const scalars[5],
                           pcp_proto_section_t out[11]) {
  int64_t B = t->options.spec.batch;
  int64_t T = batch->length;
  size_t at = (size_t)(row * T);
  int64_t bt[3] = {micro, B, T};
  int64_t a[1] = {micro};
  const int64_t* dims_bt = micro ? bt : bt + 1;
  const int64_t* dims_b = micro ? bt : bt + 1;
  uint32_t lead = micro ? 1 : 0;
  out[0] = section_data("input_ids", PCP_ELEMENT_TYPE_I32,
                        batch->input_ids + at, lead + 2, dims_bt);
  out[1] = section_data("targets", PCP_ELEMENT_TYPE_I32, batch->targets + at,
                        lead + 2, dims_bt);
  out[2] = section_data("mask", PCP_ELEMENT_TYPE_F32, batch->mask + at,
                        lead + 2, dims_bt);
  out[3] = section_data("old_logp", PCP_ELEMENT_TYPE_F32, batch->old_logp + at,
                        lead + 2, dims_bt);
  out[4] = section_data("ref_logp", PCP_ELEMENT_TYPE_F32,
                        (ref_logp ? ref_logp : batch->old_logp) + at, lead + 2,
                        dims_bt);
  out[5] = section_data("advantages", PCP_ELEMENT_TYPE_F32,
                        batch->advantages + row, lead + 1, dims_b);
  static const char* const kNames[5] = {"clip_low", "clip_high", "beta",
                                        "token_normalizer", "temperature"};
  for (int k = 0; k < 5; ++k) {
    out[6 + k] =
        section_data(kNames[k], PCP_ELEMENT_TYPE_F32, scalars[k], lead, a);
  }
}

// Input refs: |n| residents named |names| then |sections| section refs.
static void refs_fill(char (*names)[48], size_t n, uint32_t sections,
                      pcp_proto_tensor_ref_t* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                      .name = names[i]};
  }
  for (uint32_t i = 0; i < sections; ++i) {
    out[n + i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                          .section = i};
  }
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

// @load<g>(tensors of group g...) -> the same: appended to the objective
// module, one per group of GROUP tensors. A task keeps its outputs
// resident (an upload) or gives resident inputs back (a download).
static pcp_status_t load_functions_append(const pcp_models_parameter_table_t* t,
                                          size_t groups,
                                          pcp_string_builder_t* b) {
  pcp_status_t status = pcp_string_builder_append_cstring(
      b,
      "  // Tensors as they came, to keep or read resident ones "
      "(trainer.c).\n");
  char type[PCP_MAX_TENSOR_RANK * 24 + 32];
  for (size_t g = 0; g < groups && !status; ++g) {
    size_t first = g * GROUP;
    size_t end = first + GROUP < t->count ? first + GROUP : t->count;
    status = pcp_string_builder_append_f(b, "  func.func @load%zu(", g);
    // Pass 0: arguments; 1: result types; 2: returned values; 3: types.
    for (int pass = 0; pass < 4 && !status; ++pass) {
      for (size_t i = first; i < end && !status; ++i) {
        const pcp_models_parameter_t* p = &t->parameters[i];
        size_t used = (size_t)snprintf(type, sizeof(type), "tensor<");
        for (int32_t d = 0; d < p->rank; ++d) {
          used += (size_t)snprintf(type + used, sizeof(type) - used, "%lldx",
                                   (long long)p->dims[d]);
        }
        snprintf(type + used, sizeof(type) - used, "f32>");
        const char* sep = i > first ? ", " : "";
        if (pass == 0) {
          status = pcp_string_builder_append_f(b, "%s%%p%zu: %s", sep, i, type);
        } else if (pass == 2) {
          status = pcp_string_builder_append_f(b, "%s%%p%zu", sep, i);
        } else {
          status = pcp_string_builder_append_f(b, "%s%s", sep, type);
        }
      }
      static const char* const kAfter[4] = {") -> (", ") {\n    return ", " : ",
                                            "\n  }\n"};
      if (!status) {
        status = pcp_string_builder_append_cstring(b, kAfter[pass]);
      }
    }
  }
  if (!status) {
    status = pcp_string_builder_append_cstring(b, "}\n");
  }
  return status;
}

static pcp_status_t text_write(pcp_workloads_rl_trainer_t* t, const char* name,
                               const char* text, size_t length, char* out_path,
                               size_t path_capacity,
                               char out_hash[PCP_SHA256_HEX_LENGTH + 1]) {
  snprintf(out_path, path_capacity, "%s/%s", t->dir, name);
  pcp_sha256_t digest;
  pcp_sha256_compute(text, length, &digest);
  pcp_sha256_to_hex(&digest, out_hash);
  return pcp_file_write_atomic(out_path, text, length);
}

// Emits both module texts into a private temporary directory (once).
static pcp_status_t texts_make(pcp_workloads_rl_trainer_t* t) {
  if (t->dir[0]) {
    return pcp_ok_status();
  }
  const char* base = getenv("TMPDIR");
  char dir[sizeof(t->dir)];
  snprintf(dir, sizeof(dir), "%s/pcp-rl-trainer-XXXXXX",
           base && base[0] && strlen(base) < 400 ? base : "/tmp");
  if (!mkdtemp(dir)) {
    return pcp_status_from_errno(errno, "trainer: temporary directory %s", dir);
  }
  copy_text(t->dir, sizeof(t->dir), dir);

  pcp_string_builder_t objective;
  pcp_string_builder_initialize(t->allocator, MAX_MODULE_BYTES, &objective);
  pcp_status_t status =
      pcp_workloads_rl_objective_module_emit(&t->options.spec, &objective);
  char* derived = NULL;
  size_t derived_length = 0;
  if (!status) {
    // The derivation reads the module as emitted (before @load).
    const pcp_workloads_rl_trainer_options_t* o = &t->options;
    pcp_compile_training_options_t training;
    pcp_workloads_rl_objective_training_options_initialize(&training);
    training.program = PCP_COMPILE_PROGRAM_TRAIN;
    training.beta1 = o->beta1;
    training.beta2 = o->beta2;
    training.epsilon = o->eps;
    training.weight_decay = o->weight_decay;
    training.max_grad_norm = o->grad_clip;
    training.accumulation_steps = o->accumulation_steps;
    const char* text = pcp_string_builder_cstring(&objective);
    status = pcp_compile_training_module_build(text, strlen(text), "grpo.mlir",
                                               &training, t->allocator,
                                               &derived, &derived_length);
    if (status) {
      status = pcp_status_annotate_f(status,
                                     "deriving the GRPO training "
                                     "module");
    }
  }
  if (!status) {
    // Drop the module's closing "}\n" and append @load inside it.
    const char* text = pcp_string_builder_cstring(&objective);
    size_t length = strlen(text);
    if (length < 2 || strcmp(text + length - 2, "}\n") != 0) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "objective module does not end with '}'");
    } else {
      objective.size = length - 2;
      objective.data[objective.size] = '\0';
      status = load_functions_append(&t->table, t->groups, &objective);
    }
  }
  if (!status) {
    status = text_write(t, "objective.mlir", objective.data, objective.size,
                        t->objective_path, sizeof(t->objective_path),
                        t->objective_hash);
  }
  if (!status) {
    status = text_write(t, "training.mlir", derived, derived_length,
                        t->training_path, sizeof(t->training_path),
                        t->training_hash);
  }
  pcp_allocator_free(t->allocator, derived);
  pcp_string_builder_deinitialize(&objective);
  if (status) {
    dir_remove(t);
  }
  return status;
}

// Waits for |requests| (|count|), polling stop(): a stop cancels them (the
// queue kills the children).
static pcp_status_t compiles_wait(pcp_workloads_rl_trainer_t* t,
                                  pcp_workloads_compile_request_t** requests,
                                  size_t count) {
  bool stopped = false;
  for (size_t i = 0; i < count; ++i) {
    while (!pcp_workloads_compile_request_wait_for(requests[i], POLL_MS)) {
      if (!stopped && should_stop(t)) {
        stopped = true;
        for (size_t k = 0; k < count; ++k) {
          pcp_workloads_compile_request_cancel(requests[k]);
        }
      }
    }
  }
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < count && !status; ++i) {
    status = pcp_workloads_compile_request_wait(requests[i]);
  }
  if (stopped) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_CANCELLED,
                           "trainer: stopped while compiling");
  }
  return status;
}

static pcp_status_t artifact_register(pcp_workloads_rl_trainer_t* t,
                                      pcp_workloads_compile_request_t* request,
                                      const char* backend, const char* target,
                                      uint8_t out_program[32]) {
  void* bytes = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(pcp_workloads_compile_request_vmfb_path(request),
                        MAX_VMFB_BYTES, &bytes, &length));
  pcp_status_t status = pcp_fabric_program_register(
      t->options.fabric, bytes, length, backend, target, out_program);
  pcp_libc_free(bytes);  // pcp_file_read_all's buffer is malloc()ed
  return status;
}

static pcp_status_t target_compile(pcp_workloads_rl_trainer_t* t,
                                   const char* backend, const char* target) {
  if (t->target_count >= MAX_TARGETS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "trainer: more than %u (backend, target) pairs",
                           MAX_TARGETS);
  }
  pcp_workloads_compile_spec_t specs[2] = {
      {.mlir_path = t->objective_path,
       .content_hash = t->objective_hash,
       .backend = backend,
       .target = target,
       .label = t->session_prefix},
      {.mlir_path = t->training_path,
       .content_hash = t->training_hash,
       .backend = backend,
       .target = target,
       .label = t->session_prefix},
  };
  pcp_workloads_compile_request_t* requests[2] = {NULL, NULL};
  pcp_status_t status = pcp_ok_status();
  for (int i = 0; i < 2 && !status; ++i) {
    status = pcp_workloads_compile_queue_submit(t->options.compile_queue,
                                                &specs[i], &requests[i]);
  }
  if (!status) {
    status = compiles_wait(t, requests, 2);
  }
  target_programs_t* p = &t->targets[t->target_count];
  memset(p, 0, sizeof(*p));
  copy_text(p->backend, sizeof(p->backend), backend);
  copy_text(p->target, sizeof(p->target), target);
  if (!status) {
    status = artifact_register(t, requests[0], backend, target, p->objective);
  }
  if (!status) {
    status = artifact_register(t, requests[1], backend, target, p->training);
  }
  for (int i = 0; i < 2; ++i) {
    pcp_workloads_compile_request_release(requests[i]);
  }
  if (!status) {
    ++t->target_count;
    PCP_LOG(PCP_LOG_INFO, &t->options.log,
            "rl trainer: programs ready for backend=%s target=%s", backend,
            target[0] ? target : "(default)");
  }
  return status;
}

pcp_status_t pcp_workloads_rl_trainer_prepare(
    pcp_workloads_rl_trainer_t* trainer) {
  pcp_workloads_rl_trainer_t* t = trainer;
  if (should_stop(t)) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "trainer: stopped");
  }
  pcp_fabric_worker_info_t* infos = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(t->allocator, MAX_WORKERS * sizeof(*infos),
                           (void**)&infos),
      "worker list");
  uint32_t count =
      pcp_fabric_worker_list(t->options.fabric, infos, MAX_WORKERS, NULL);
  uint32_t of_class = 0;
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < count && !status; ++i) {
    const pcp_fabric_worker_info_t* w = &infos[i];
    if (w->state != PCP_FABRIC_WORKER_CONNECTED || !class_matches(t, w)) {
      continue;
    }
    ++of_class;
    if (programs_find(t, w->backend, w->target)) {
      continue;
    }
    status = texts_make(t);
    if (!status) {
      status = target_compile(t, w->backend, w->target);
    }
  }
  pcp_allocator_free(t->allocator, infos);
  if (!status && !of_class) {
    status =
        pcp_make_status(PCP_STATUS_UNAVAILABLE,
                        "no connected worker of class '%s'", t->worker_class);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Reference log-probabilities
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_rl_trainer_reference_set(
    pcp_workloads_rl_trainer_t* trainer, const float* const* parameters) {
  pcp_workloads_rl_trainer_t* t = trainer;
  if (!parameters) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "parameters: NULL");
  }
  for (size_t i = 0; i < t->n; ++i) {
    if (!parameters[i]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "parameters[%zu] (%s): NULL", i,
                             t->table.parameters[i].name);
    }
  }
  // An orphaned upload may still read the old reference.
  orphans_reap(t, true);
  if (!t->reference) {
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(t->allocator,
                             (t->parameter_count + 1) * sizeof(float),
                             (void**)&t->reference),
        "reference parameters");
  }
  for (size_t i = 0; i < t->n; ++i) {
    memcpy(t->reference + t->offsets[i], parameters[i],
           (size_t)t->table.parameters[i].element_count * sizeof(float));
  }
  ++t->reference_generation;  // every session reloads
  return pcp_ok_status();
}

static pcp_status_t batch_validate(const pcp_workloads_rl_trainer_t* t,
                                   const pcp_workloads_rl_batch_t* batch,
                                   int64_t rows_multiple) {
  if (!batch) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "batch: NULL");
  }
  if (batch->rows <= 0 || batch->rows > MAX_ROWS ||
      batch->rows % rows_multiple) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "batch.rows: %lld is not a positive multiple of "
                           "%lld (at most %lld)",
                           (long long)batch->rows, (long long)rows_multiple,
                           (long long)MAX_ROWS);
  }
  if (batch->rows / t->options.spec.batch > MAX_MICRO_BATCHES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "batch.rows: %lld rows are more than %lld "
                           "micro-batches of %lld",
                           (long long)batch->rows, (long long)MAX_MICRO_BATCHES,
                           (long long)t->options.spec.batch);
  }
  if (batch->length != t->options.spec.block_size) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "batch.length: %lld, the model's block size is "
                           "%lld",
                           (long long)batch->length,
                           (long long)t->options.spec.block_size);
  }
  if (!batch->input_ids || !batch->targets || !batch->mask ||
      !batch->old_logp || !batch->ref_logp || !batch->advantages) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "batch: a tensor is NULL");
  }
  return pcp_ok_status();
}

// Submits the @load<g> tasks that move the n tensors of |slot|'s session
// named |names|: with |sources| an upload (the host tensors in, every
// output kept resident under its name), else a download (the resident
// tensors in, the outputs returned: transfer_read copies them). Arrays of
// task parameters are copied by the fabric at submit; names and data are
// borrowed until the tasks end.
static pcp_status_t transfer_submit(pcp_workloads_rl_trainer_t* t,
                                    batch_of_tasks_t* b, const chosen_t* c,
                                    char (*names)[48],
                                    const float* const* sources) {
  pcp_proto_section_t sections[GROUP];
  pcp_proto_tensor_ref_t refs[GROUP];
  pcp_proto_keep_resident_t keep[GROUP];
  pcp_status_t status = pcp_ok_status();
  for (size_t g = 0; g < t->groups && !status; ++g) {
    size_t first = g * GROUP;
    size_t count = first + GROUP < t->n ? GROUP : t->n - first;
    for (size_t j = 0; j < count; ++j) {
      size_t i = first + j;
      if (sources) {
        section_parameter(t, i, sources[i], &sections[j]);
        keep[j] =
            (pcp_proto_keep_resident_t){.output = (uint32_t)j, .as = names[i]};
      } else {
        refs[j] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = names[i]};
      }
    }
    char function[32];
    snprintf(function, sizeof(function), "load%zu", g);
    pcp_fabric_task_params_t params = {
        .function = function,
        .inputs = sources ? sections : NULL,
        .input_count = sources ? (uint32_t)count : 0,
        .input_refs = sources ? NULL : refs,
        .input_ref_count = sources ? 0 : (uint32_t)count,
        .keep_resident = sources ? keep : NULL,
        .keep_resident_count = sources ? (uint32_t)count : 0,
    };
    memcpy(params.program, c->programs->objective, sizeof(params.program));
    status = task_submit(t, b, c->slot, &params);
  }
  return status;
}

// Copies the outputs of the download tasks b->tasks[first..first + groups)
// into |dests| (n tensors).
static pcp_status_t transfer_read(pcp_workloads_rl_trainer_t* t,
                                  batch_of_tasks_t* b, size_t first,
                                  float* const* dests) {
  size_t sizes[GROUP];
  for (size_t g = 0; g < t->groups; ++g) {
    size_t begin = g * GROUP;
    size_t count = begin + GROUP < t->n ? GROUP : t->n - begin;
    for (size_t j = 0; j < count; ++j) {
      sizes[j] =
          (size_t)t->table.parameters[begin + j].element_count * sizeof(float);
    }
    const pcp_proto_section_t* outputs = NULL;
    PCP_RETURN_IF_ERROR_BARE(
        task_outputs(b->tasks[first + g], "@load", count, sizes, &outputs));
    for (size_t j = 0; j < count; ++j) {
      memcpy(dests[begin + j], outputs[j].data, sizes[j]);
    }
  }
  return pcp_ok_status();
}

// Uploads the reference into every chosen worker's session that lacks
// this generation of it.
static pcp_status_t reference_load(pcp_workloads_rl_trainer_t* t,
                                   chosen_t* chosen, uint32_t count) {
  const float** sources = NULL;
  batch_of_tasks_t b;
  pcp_status_t status = tasks_initialize(t, (size_t)count * t->groups, &b);
  if (!status) {
    status = pcp_allocator_calloc(t->allocator, (t->n + 1) * sizeof(*sources),
                                  (void**)&sources);
  }
  for (size_t i = 0; i < t->n && !status; ++i) {
    sources[i] = t->reference + t->offsets[i];
  }
  for (uint32_t k = 0; k < count && !status; ++k) {
    if (chosen[k].slot->reference_generation != t->reference_generation) {
      status = transfer_submit(t, &b, &chosen[k], t->names + NAME_REF * t->n,
                               sources);
    }
  }
  status = tasks_wait(t, &b, t->groups, "reference upload", status);
  for (size_t i = 0; i < b.count && !status; ++i) {
    b.slots[i]->reference_generation = t->reference_generation;
  }
  tasks_deinitialize(t, &b);
  pcp_allocator_free(t->allocator, sources);
  return status;
}

// A copy of |batch|'s tensors in the call's memory (the tasks read them
// after a stopped call has returned and its caller has freed the batch).
static pcp_status_t batch_copy(pcp_workloads_rl_trainer_t* t,
                               const pcp_workloads_rl_batch_t* batch,
                               pcp_workloads_rl_batch_t* out) {
  *out = *batch;
  size_t all = (size_t)(batch->rows * batch->length);
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, all * 4, &p));
  memcpy(p, batch->input_ids, all * 4);
  out->input_ids = p;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, all * 4, &p));
  memcpy(p, batch->targets, all * 4);
  out->targets = p;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, all * 4, &p));
  memcpy(p, batch->mask, all * 4);
  out->mask = p;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, all * 4, &p));
  memcpy(p, batch->old_logp, all * 4);
  out->old_logp = p;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, all * 4, &p));
  memcpy(p, batch->ref_logp, all * 4);
  out->ref_logp = p;
  PCP_RETURN_IF_ERROR_BARE(call_alloc(t, (size_t)batch->rows * 4, &p));
  memcpy(p, batch->advantages, (size_t)batch->rows * 4);
  out->advantages = p;
  return pcp_ok_status();
}

// Copies |count| tensors (table order) into one block of the call's memory
// and points |out| (n entries) at them.
static pcp_status_t tensors_copy(pcp_workloads_rl_trainer_t* t,
                                 float* const* tensors, float** out) {
  float* block = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      call_alloc(t, t->parameter_count * sizeof(float), (void**)&block));
  for (size_t i = 0; i < t->n; ++i) {
    out[i] = block + t->offsets[i];
    memcpy(out[i], tensors[i],
           (size_t)t->table.parameters[i].element_count * sizeof(float));
  }
  return pcp_ok_status();
}

// Scalars of @grpo / @grpo_metrics for |micro| micro-batches (0: rank 0):
// 5 arrays of max(micro, 1) floats in one allocation.
static pcp_status_t scalars_make(pcp_workloads_rl_trainer_t* t, int64_t micro,
                                 double clip_low, double clip_high, double beta,
                                 double normalizer, double temperature,
                                 float** out_storage, float* out_arrays[5]) {
  size_t m = micro ? (size_t)micro : 1;
  PCP_RETURN_IF_ERROR(call_alloc(t, 5 * m * sizeof(float), (void**)out_storage),
                      "scalars");
  double values[5] = {clip_low, clip_high, beta, normalizer, temperature};
  for (int k = 0; k < 5; ++k) {
    out_arrays[k] = *out_storage + (size_t)k * m;
    for (size_t i = 0; i < m; ++i) {
      out_arrays[k][i] = (float)values[k];
    }
  }
  return pcp_ok_status();
}

// Submits @grpo_metrics for micro-batch |j| on |c| with the resident
// parameters |names| (the reference or the policy) and |ref_logp| (NULL:
// old_logp stands in).
static pcp_status_t metrics_submit(
    pcp_workloads_rl_trainer_t* t, batch_of_tasks_t* b, const chosen_t* c,
    const pcp_workloads_rl_batch_t* batch, int64_t j, char (*names)[48],
    const float* ref_logp, float* const scalars[5],
    pcp_proto_section_t* sections, pcp_proto_tensor_ref_t* refs) {
  sections_batch(t, batch, j * t->options.spec.batch, 0, ref_logp, scalars,
                 sections);
  refs_fill(names, t->n, 11, refs);
  pcp_fabric_task_params_t params = {
      .function = PCP_RL_OBJECTIVE_METRICS_FUNCTION,
      .inputs = sections,
      .input_count = 11,
      .input_refs = refs,
      .input_ref_count = (uint32_t)t->n + 11,
  };
  memcpy(params.program, c->programs->objective, sizeof(params.program));
  return task_submit(t, b, c->slot, &params);
}

static pcp_status_t ref_logp_run(pcp_workloads_rl_trainer_t* t,
                                 double temperature,
                                 const pcp_workloads_rl_batch_t* caller,
                                 float* out_ref_logp);

pcp_status_t pcp_workloads_rl_trainer_ref_logp(
    pcp_workloads_rl_trainer_t* trainer, double temperature,
    pcp_workloads_rl_batch_t* batch) {
  pcp_workloads_rl_trainer_t* t = trainer;
  if (!t->reference) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "ref_logp: reference_set was not called");
  }
  if (!finite_in(temperature, 0.0, 1e6) || temperature <= 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "temperature: %g must be > 0", temperature);
  }
  PCP_RETURN_IF_ERROR_BARE(batch_validate(t, batch, t->options.spec.batch));
  if (should_stop(t)) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "ref_logp: stopped");
  }
  PCP_RETURN_IF_ERROR_BARE(call_begin(t));
  pcp_status_t status = ref_logp_run(t, temperature, batch, batch->ref_logp);
  call_end(t);
  return status;
}

static pcp_status_t ref_logp_run(pcp_workloads_rl_trainer_t* t,
                                 double temperature,
                                 const pcp_workloads_rl_batch_t* caller,
                                 float* out_ref_logp) {
  int64_t B = t->options.spec.batch;
  pcp_workloads_rl_batch_t copy;
  PCP_RETURN_IF_ERROR_BARE(batch_copy(t, caller, &copy));
  const pcp_workloads_rl_batch_t* batch = &copy;
  int64_t micro = batch->rows / B;
  chosen_t chosen[MAX_WORKERS];
  uint32_t w = 0;
  PCP_RETURN_IF_ERROR_BARE(
      workers_choose(t, t->options.max_workers, chosen, &w));
  if ((int64_t)w > micro) {
    w = (uint32_t)micro;
  }
  PCP_RETURN_IF_ERROR_BARE(reference_load(t, chosen, w));

  size_t n = t->n;
  size_t bt = (size_t)(B * batch->length);
  float* storage = NULL;
  float* scalars[5];
  pcp_proto_section_t* sections = NULL;
  pcp_proto_tensor_ref_t* refs = NULL;
  batch_of_tasks_t b;
  pcp_status_t status = tasks_initialize(t, (size_t)micro, &b);
  if (!status) {
    // The clip bounds and beta do not change logp; any valid values do.
    status =
        scalars_make(t, 0, 0.2, 0.2, 0.0, 0.0, temperature, &storage, scalars);
  }
  // One task's arrays, reused: the fabric copies them at submit (only the
  // data they point to is borrowed).
  if (!status) {
    status = pcp_allocator_calloc(t->allocator, 11 * sizeof(*sections),
                                  (void**)&sections);
  }
  if (!status) {
    status = pcp_allocator_calloc(t->allocator, (n + 11) * sizeof(*refs),
                                  (void**)&refs);
  }
  for (int64_t j = 0; j < micro && !status; ++j) {
    // ref_logp is the output here (not read for logp): old_logp stands in.
    status =
        metrics_submit(t, &b, &chosen[j % w], batch, j, t->names + NAME_REF * n,
                       NULL, scalars, sections, refs);
  }
  size_t per_worker = (size_t)((micro + w - 1) / w);
  status = tasks_wait(t, &b, per_worker, "ref_logp", status);
  // All outputs are checked before anything is written.
  size_t sizes[6] = {4, 4, 4, 4, 4, bt * sizeof(float)};
  const pcp_proto_section_t* outputs = NULL;
  for (size_t j = 0; j < b.count && !status; ++j) {
    status = task_outputs(b.tasks[j], "@grpo_metrics", 6, sizes, &outputs);
  }
  for (size_t j = 0; j < b.count && !status; ++j) {
    pcp_status_ignore(
        task_outputs(b.tasks[j], "@grpo_metrics", 6, sizes, &outputs));
    memcpy(out_ref_logp + j * bt, outputs[5].data, bt * sizeof(float));
  }
  tasks_deinitialize(t, &b);
  pcp_allocator_free(t->allocator, sections);
  pcp_allocator_free(t->allocator, refs);
  return status;
}

//===----------------------------------------------------------------------===//
// The update
//===----------------------------------------------------------------------===//

static pcp_status_t step_params_validate(
    const pcp_workloads_rl_step_params_t* p) {
  if (!p) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "step_params: NULL");
  }
  if (!finite_in(p->learning_rate, 0.0, 1.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "learning_rate: %g not in [0, 1]", p->learning_rate);
  }
  // The step is an f32 input: integers are exact up to 2^24.
  if (p->step < 1 || p->step > ((int64_t)1 << 24)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "step: %lld not in [1, 2^24]", (long long)p->step);
  }
  if (!finite_in(p->clip_low, 0.0, 10.0) || p->clip_low <= 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "clip_low: %g not in (0, 10]", p->clip_low);
  }
  if (!finite_in(p->clip_high, 0.0, 10.0) || p->clip_high <= 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "clip_high: %g not in (0, 10]", p->clip_high);
  }
  if (!finite_in(p->beta, 0.0, 10.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "beta: %g not in [0, 10]", p->beta);
  }
  if (!finite_in(p->temperature, 0.0, 1e6) || p->temperature <= 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "temperature: %g must be > 0", p->temperature);
  }
  return pcp_ok_status();
}

// Scratch of one update, freed together.
typedef struct update_scratch_t {
  float* grad_scalars;    // 5 x A (or 5 with A = 1)
  float* metric_scalars;  // 5
  pcp_proto_section_t* sections;
  pcp_proto_tensor_ref_t* refs;
  char (*task_grads)[48];  // n: one gradient task's resident names
  double* sum;             // parameter_count: the summed gradient
  float* staging;  // 4 x parameter_count (the call's): a gradient, p', m', v'
  float** views;   // 4 x n: tensor pointers into staging
  float* step_lr;  // 2 (the call's)
  // The caller's tensors copied into the call's memory, table order.
  float** inputs;  // 3 x n: parameters, m, v
} update_scratch_t;

static void scratch_free(pcp_workloads_rl_trainer_t* t, update_scratch_t* s) {
  pcp_allocator_free(t->allocator, s->sections);
  pcp_allocator_free(t->allocator, s->refs);
  pcp_allocator_free(t->allocator, s->task_grads);
  pcp_allocator_free(t->allocator, s->sum);
  pcp_allocator_free(t->allocator, s->views);
  pcp_allocator_free(t->allocator, s->inputs);
}

// Gradient task k's resident names, "q<k>_<i>", into s->task_grads.
static void task_grads_name(const pcp_workloads_rl_trainer_t* t, int64_t k,
                            update_scratch_t* s) {
  for (size_t i = 0; i < t->n; ++i) {
    snprintf(s->task_grads[i], sizeof(s->task_grads[0]), "q%lld_%zu",
             (long long)k, i);
  }
}

static pcp_status_t scratch_make(pcp_workloads_rl_trainer_t* t,
                                 float* const* parameters, float* const* m,
                                 float* const* v, update_scratch_t* s) {
  size_t n = t->n;
  pcp_allocator_t a = t->allocator;
  // One task's arrays, reused: the fabric copies them (and the names) at
  // submit; only the data they point to is borrowed.
  pcp_status_t status =
      pcp_allocator_calloc(a, 11 * sizeof(*s->sections), (void**)&s->sections);
  if (!status) {
    status =
        pcp_allocator_calloc(a, (n + 11) * sizeof(*s->refs), (void**)&s->refs);
  }
  if (!status) {
    status = pcp_allocator_calloc(a, (n + 1) * sizeof(*s->task_grads),
                                  (void**)&s->task_grads);
  }
  if (!status) {
    status = pcp_allocator_malloc(a, (t->parameter_count + 1) * sizeof(double),
                                  (void**)&s->sum);
  }
  if (!status) {
    status = call_alloc(t, (4 * t->parameter_count + 1) * sizeof(float),
                        (void**)&s->staging);
  }
  if (!status) {
    status = call_alloc(t, 2 * sizeof(float), (void**)&s->step_lr);
  }
  if (!status) {
    status = pcp_allocator_calloc(a, (4 * n + 1) * sizeof(*s->views),
                                  (void**)&s->views);
  }
  if (!status) {
    status = pcp_allocator_calloc(a, (3 * n + 1) * sizeof(*s->inputs),
                                  (void**)&s->inputs);
  }
  if (!status) {
    status = tensors_copy(t, parameters, s->inputs);
  }
  if (!status) {
    status = tensors_copy(t, m, s->inputs + n);
  }
  if (!status) {
    status = tensors_copy(t, v, s->inputs + 2 * n);
  }
  if (status) {
    return pcp_status_annotate_f(status, "update scratch");
  }
  for (size_t k = 0; k < 4; ++k) {
    for (size_t i = 0; i < n; ++i) {
      s->views[k * n + i] = s->staging + k * t->parameter_count + t->offsets[i];
    }
  }
  return pcp_ok_status();
}

// Phase 2: the gradient tasks (task k: micro-batches [kA, kA + A) on worker
// k mod W; the loss comes back, the gradient stays resident as "q<k>_<i>"),
// then one @grpo_metrics per micro-batch (micro-batch j on worker
// (j / A) mod W, beside its gradient), all with the resident policy, into
// |b| in that order.
static pcp_status_t gradients_submit(
    pcp_workloads_rl_trainer_t* t, const pcp_workloads_rl_batch_t* batch,
    const chosen_t* chosen, uint32_t w, int64_t tasks, int64_t micro,
    update_scratch_t* s, float* const grad_scalars[5],
    float* const metric_scalars[5], batch_of_tasks_t* b) {
  int64_t A = t->options.accumulation_steps;
  int64_t B = t->options.spec.batch;
  size_t n = t->n;
  char(*policy)[48] = t->names + NAME_POLICY * n;
  pcp_proto_keep_resident_t* keep = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      t->allocator, (n + 1) * sizeof(*keep), (void**)&keep);
  for (int64_t k = 0; k < tasks && !status; ++k) {
    const chosen_t* c = &chosen[k % w];
    pcp_proto_section_t* sections = s->sections;
    pcp_proto_tensor_ref_t* refs = s->refs;
    task_grads_name(t, k, s);
    // A = 1 derives no accumulated function: @compute_gradients on [B, T].
    sections_batch(t, batch, k * A * B, A > 1 ? A : 0, batch->ref_logp,
                   grad_scalars, sections);
    refs_fill(policy, n, 11, refs);
    for (size_t i = 0; i < n; ++i) {
      keep[i] = (pcp_proto_keep_resident_t){.output = (uint32_t)(1 + i),
                                            .as = s->task_grads[i]};
    }
    pcp_fabric_task_params_t params = {
        .function =
            A > 1 ? "compute_gradients_accumulated" : "compute_gradients",
        .inputs = sections,
        .input_count = 11,
        .input_refs = refs,
        .input_ref_count = (uint32_t)n + 11,
        .keep_resident = keep,
        .keep_resident_count = (uint32_t)n,
    };
    memcpy(params.program, c->programs->training, sizeof(params.program));
    status = task_submit(t, b, c->slot, &params);
  }
  pcp_allocator_free(t->allocator, keep);
  for (int64_t j = 0; j < micro && !status; ++j) {
    status =
        metrics_submit(t, b, &chosen[(j / A) % w], batch, j, policy,
                       batch->ref_logp, metric_scalars, s->sections, s->refs);
  }
  return status;
}

// The tasks' losses (their first output), summed.
static pcp_status_t losses_sum(pcp_workloads_rl_trainer_t* t,
                               batch_of_tasks_t* b, size_t tasks,
                               double* out_loss) {
  *out_loss = 0.0;
  for (size_t k = 0; k < tasks; ++k) {
    const pcp_proto_section_t* outputs = NULL;
    PCP_RETURN_IF_ERROR_BARE(task_outputs(b->tasks[k], "the gradient task",
                                          t->n + 1, NULL, &outputs));
    if (!outputs[0].data || outputs[0].element_type != PCP_ELEMENT_TYPE_F32 ||
        outputs[0].byte_length != sizeof(float)) {
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "the gradient task returned no f32 loss");
    }
    *out_loss += *(const float*)outputs[0].data;
  }
  return pcp_ok_status();
}

// Token-weighted means of the per-micro-batch metrics (each is a mean over
// its micro-batch's masked tokens).
static pcp_status_t metrics_combine(pcp_workloads_rl_trainer_t* t,
                                    const pcp_workloads_rl_batch_t* batch,
                                    batch_of_tasks_t* b, size_t first,
                                    double tokens,
                                    pcp_workloads_rl_update_metrics_t* out) {
  size_t bt = (size_t)(t->options.spec.batch * batch->length);
  size_t sizes[6] = {4, 4, 4, 4, 4, bt * sizeof(float)};
  double sums[4] = {0, 0, 0, 0};
  for (size_t j = 0; first + j < b->count; ++j) {
    const pcp_proto_section_t* outputs = NULL;
    PCP_RETURN_IF_ERROR_BARE(
        task_outputs(b->tasks[first + j], "@grpo_metrics", 6, sizes, &outputs));
    double weight = 0.0;
    const float* mask = batch->mask + j * bt;
    for (size_t e = 0; e < bt; ++e) {
      weight += mask[e];
    }
    for (int k = 0; k < 4; ++k) {
      sums[k] += weight * (double)*(const float*)outputs[1 + k].data;
    }
  }
  double d = tokens > 0 ? tokens : 1.0;
  out->mean_kl = sums[0] / d;
  out->clip_low_fraction = sums[1] / d;
  out->clip_high_fraction = sums[2] / d;
  out->mean_ratio = sums[3] / d;
  return pcp_ok_status();
}

// Phase 3: reads every task's resident gradient back and sums them in task
// order, in f64, so the sum (and the step) does not depend on how many
// workers computed them.
static pcp_status_t gradients_gather(pcp_workloads_rl_trainer_t* t,
                                     const chosen_t* chosen, uint32_t w,
                                     int64_t tasks, update_scratch_t* s) {
  batch_of_tasks_t b;
  pcp_status_t status = tasks_initialize(t, (size_t)tasks * t->groups, &b);
  for (int64_t k = 0; k < tasks && !status; ++k) {
    task_grads_name(t, k, s);
    status = transfer_submit(t, &b, &chosen[k % w], s->task_grads, NULL);
  }
  status = tasks_wait(t, &b, (size_t)((tasks + w - 1) / w) * t->groups,
                      "gradient download", status);
  memset(s->sum, 0, t->parameter_count * sizeof(double));
  for (int64_t k = 0; k < tasks && !status; ++k) {
    status = transfer_read(t, &b, (size_t)k * t->groups, s->views);
    for (size_t e = 0; e < t->parameter_count && !status; ++e) {
      s->sum[e] += (double)s->staging[e];
    }
  }
  tasks_deinitialize(t, &b);
  return status;
}

// Phase 4 on the first worker, whose session holds the policy: the summed
// gradient (f32), m and v up; @apply_optimizer with every tensor resident,
// its outputs kept as p, m, v; those read back into staging (views n..4n).
static pcp_status_t optimizer_run(pcp_workloads_rl_trainer_t* t,
                                  const chosen_t* c,
                                  const pcp_workloads_rl_step_params_t* p,
                                  update_scratch_t* s) {
  size_t n = t->n;
  float* const* m = s->inputs + n;
  float* const* v = s->inputs + 2 * n;
  for (size_t e = 0; e < t->parameter_count; ++e) {
    s->staging[e] = (float)s->sum[e];
  }
  batch_of_tasks_t up, run, down;
  memset(&up, 0, sizeof(up));
  memset(&run, 0, sizeof(run));
  memset(&down, 0, sizeof(down));
  pcp_proto_tensor_ref_t* refs = NULL;
  pcp_proto_keep_resident_t* keep = NULL;
  pcp_status_t status = tasks_initialize(t, 3 * t->groups, &up);
  if (!status) {
    status = tasks_initialize(t, 1, &run);
  }
  if (!status) {
    status = tasks_initialize(t, 3 * t->groups, &down);
  }
  if (!status) {
    status = pcp_allocator_calloc(t->allocator, (4 * n + 2) * sizeof(*refs),
                                  (void**)&refs);
  }
  if (!status) {
    status = pcp_allocator_calloc(t->allocator, (3 * n + 1) * sizeof(*keep),
                                  (void**)&keep);
  }
  if (!status) {
    status = transfer_submit(t, &up, c, t->names + NAME_GRAD * n,
                             (const float* const*)s->views);
  }
  if (!status) {
    status = transfer_submit(t, &up, c, t->names + NAME_M * n,
                             (const float* const*)m);
  }
  if (!status) {
    status = transfer_submit(t, &up, c, t->names + NAME_V * n,
                             (const float* const*)v);
  }
  status = tasks_wait(t, &up, 3 * t->groups, "optimizer state upload", status);
  if (!status) {
    // (params..., grads..., m..., v..., step, lr) -> (params', m', v').
    static const int kInputs[4] = {NAME_POLICY, NAME_GRAD, NAME_M, NAME_V};
    for (size_t k = 0; k < 4; ++k) {
      refs_fill(t->names + kInputs[k] * n, n, 0, refs + k * n);
    }
    refs[4 * n] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                           .section = 0};
    refs[4 * n + 1] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 1};
    static const int kOutputs[3] = {NAME_POLICY, NAME_M, NAME_V};
    for (size_t k = 0; k < 3; ++k) {
      for (size_t i = 0; i < n; ++i) {
        keep[k * n + i] =
            (pcp_proto_keep_resident_t){.output = (uint32_t)(k * n + i),
                                        .as = t->names[kOutputs[k] * n + i]};
      }
    }
    s->step_lr[0] = (float)p->step;
    s->step_lr[1] = (float)p->learning_rate;
    pcp_proto_section_t scalars[2] = {
        section_data("step", PCP_ELEMENT_TYPE_F32, &s->step_lr[0], 0, NULL),
        section_data("lr", PCP_ELEMENT_TYPE_F32, &s->step_lr[1], 0, NULL),
    };
    pcp_fabric_task_params_t params = {
        .function = "apply_optimizer",
        .inputs = scalars,
        .input_count = 2,
        .input_refs = refs,
        .input_ref_count = (uint32_t)(4 * n + 2),
        .keep_resident = keep,
        .keep_resident_count = (uint32_t)(3 * n),
    };
    memcpy(params.program, c->programs->training, sizeof(params.program));
    status = tasks_wait(t, &run, 1, "apply_optimizer",
                        task_submit(t, &run, c->slot, &params));
  }
  if (!status) {
    static const int kBack[3] = {NAME_POLICY, NAME_M, NAME_V};
    for (size_t k = 0; k < 3 && !status; ++k) {
      status = transfer_submit(t, &down, c, t->names + kBack[k] * n, NULL);
    }
    status =
        tasks_wait(t, &down, 3 * t->groups, "optimizer state download", status);
  }
  for (size_t k = 0; k < 3 && !status; ++k) {
    status = transfer_read(t, &down, k * t->groups, s->views + (1 + k) * n);
  }
  tasks_deinitialize(t, &up);
  tasks_deinitialize(t, &run);
  tasks_deinitialize(t, &down);
  pcp_allocator_free(t->allocator, refs);
  pcp_allocator_free(t->allocator, keep);
  return status;
}

static pcp_status_t update_run(pcp_workloads_rl_trainer_t* t,
                               const pcp_workloads_rl_step_params_t* p,
                               const pcp_workloads_rl_batch_t* caller,
                               float* const* parameters, float* const* m,
                               float* const* v,
                               pcp_workloads_rl_update_metrics_t* out_metrics);

pcp_status_t pcp_workloads_rl_trainer_update(
    pcp_workloads_rl_trainer_t* trainer,
    const pcp_workloads_rl_step_params_t* step_params,
    const pcp_workloads_rl_batch_t* batch, float* const* parameters,
    float* const* m, float* const* v,
    pcp_workloads_rl_update_metrics_t* out_metrics) {
  pcp_workloads_rl_trainer_t* t = trainer;
  PCP_RETURN_IF_ERROR_BARE(step_params_validate(step_params));
  int64_t A = t->options.accumulation_steps;
  int64_t B = t->options.spec.batch;
  PCP_RETURN_IF_ERROR_BARE(batch_validate(t, batch, A * B));
  if (!parameters || !m || !v) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "parameters, m, v: required");
  }
  size_t n = t->n;
  for (size_t i = 0; i < n; ++i) {
    if (!parameters[i] || !m[i] || !v[i]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "tensor %zu (%s): NULL", i,
                             t->table.parameters[i].name);
    }
  }
  if (should_stop(t)) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "update: stopped");
  }
  PCP_RETURN_IF_ERROR_BARE(call_begin(t));
  pcp_status_t status =
      update_run(t, step_params, batch, parameters, m, v, out_metrics);
  call_end(t);
  return status;
}

static pcp_status_t update_run(pcp_workloads_rl_trainer_t* t,
                               const pcp_workloads_rl_step_params_t* p,
                               const pcp_workloads_rl_batch_t* caller,
                               float* const* parameters, float* const* m,
                               float* const* v,
                               pcp_workloads_rl_update_metrics_t* out_metrics) {
  int64_t A = t->options.accumulation_steps;
  int64_t B = t->options.spec.batch;
  size_t n = t->n;
  int64_t started = now_ns(t);
  pcp_workloads_rl_batch_t copy;
  PCP_RETURN_IF_ERROR_BARE(batch_copy(t, caller, &copy));
  const pcp_workloads_rl_batch_t* batch = &copy;
  int64_t micro = batch->rows / B;
  int64_t tasks = micro / A;
  chosen_t chosen[MAX_WORKERS];
  uint32_t w = 0;
  PCP_RETURN_IF_ERROR_BARE(
      workers_choose(t, t->options.max_workers, chosen, &w));
  if ((int64_t)w > tasks) {
    w = (uint32_t)tasks;
  }

  // N: the whole batch's completion tokens. Each micro-batch's loss is its
  // masked sum over N / A; accumulation averages A of them, so a task's
  // gradient is its share of the token mean over N and the tasks' sum is
  // the step's gradient (docs/rl.md, "The trainer").
  double tokens = 0.0;
  size_t all = (size_t)(batch->rows * batch->length);
  for (size_t e = 0; e < all; ++e) {
    tokens += batch->mask[e];
  }
  update_scratch_t s;
  memset(&s, 0, sizeof(s));
  float* grad_scalars[5];
  float* metric_scalars[5];
  batch_of_tasks_t policy, compute;
  memset(&policy, 0, sizeof(policy));
  memset(&compute, 0, sizeof(compute));
  pcp_status_t status = scalars_make(
      t, A > 1 ? A : 0, p->clip_low, p->clip_high, p->beta, tokens / (double)A,
      p->temperature, &s.grad_scalars, grad_scalars);
  if (!status) {
    // The metrics' loss over N: the micro-batches' losses sum to the step's.
    status = scalars_make(t, 0, p->clip_low, p->clip_high, p->beta, tokens,
                          p->temperature, &s.metric_scalars, metric_scalars);
  }
  if (!status) {
    status = scratch_make(t, parameters, m, v, &s);
  }
  if (!status) {
    status = tasks_initialize(t, (size_t)w * t->groups, &policy);
  }
  if (!status) {
    status = tasks_initialize(t, (size_t)(tasks + micro), &compute);
  }
  // Phase 1: the policy into every chosen worker's session.
  for (uint32_t k = 0; k < w && !status; ++k) {
    status = transfer_submit(t, &policy, &chosen[k], t->names + NAME_POLICY * n,
                             (const float* const*)s.inputs);
  }
  if (policy.tasks) {
    status = tasks_wait(t, &policy, t->groups, "policy upload", status);
  }
  // Phase 2: gradients and metrics.
  if (!status) {
    status = gradients_submit(t, batch, chosen, w, tasks, micro, &s,
                              grad_scalars, metric_scalars, &compute);
    size_t per_worker = (size_t)((tasks + w - 1) / w) * (size_t)(1 + A);
    status = tasks_wait(t, &compute, per_worker, "gradients", status);
  }
  double loss = 0.0;
  pcp_workloads_rl_update_metrics_t result;
  memset(&result, 0, sizeof(result));
  if (!status) {
    status = losses_sum(t, &compute, (size_t)tasks, &loss);
  }
  if (!status) {
    status =
        metrics_combine(t, batch, &compute, (size_t)tasks, tokens, &result);
  }
  // Phase 3: the summed gradient.
  if (!status) {
    status = gradients_gather(t, chosen, w, tasks, &s);
  }
  // Phase 4: AdamW on the first worker.
  if (!status) {
    double norm = 0.0;
    for (size_t e = 0; e < t->parameter_count; ++e) {
      norm += s.sum[e] * s.sum[e];
    }
    result.grad_norm = sqrt(norm);
    status = optimizer_run(t, &chosen[0], p, &s);
  }
  if (!status) {
    // Everything arrived: only now are the caller's tensors overwritten.
    for (size_t i = 0; i < n; ++i) {
      size_t bytes =
          (size_t)t->table.parameters[i].element_count * sizeof(float);
      memcpy(parameters[i], s.views[n + i], bytes);
      memcpy(m[i], s.views[2 * n + i], bytes);
      memcpy(v[i], s.views[3 * n + i], bytes);
    }
    result.loss = loss;
    result.completion_tokens = (int64_t)llround(tokens);
    result.workers = w;
    result.seconds = (double)(now_ns(t) - started) / 1e9;
    if (out_metrics) {
      *out_metrics = result;
    }
    PCP_LOG(PCP_LOG_DEBUG, &t->options.log,
            "rl trainer: step %lld over %u workers, %lld tokens, loss %.6g, "
            "grad norm %.6g, %.3f s",
            (long long)p->step, w, (long long)result.completion_tokens,
            result.loss, result.grad_norm, result.seconds);
  }
  tasks_deinitialize(t, &policy);
  tasks_deinitialize(t, &compute);
  scratch_free(t, &s);
  return status;
}
