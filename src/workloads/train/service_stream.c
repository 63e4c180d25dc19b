// SPDX-License-Identifier: Apache-2.0
//
// Streaming DiLoCo in the training service (service.h), apart from the job
// and classic rounds of service.c: worker-resident state, the per-fragment
// @init/@delta/@mix/@copy programs, the lock-step loop, and its checkpoints
// and resume.

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workloads/train/service_impl.h"

//===----------------------------------------------------------------------===//
// Streaming DiLoCo (reference s.1.2)
//===----------------------------------------------------------------------===//
//
// Worker-resident state in one fabric session per worker: the local
// parameters "p<i>", AdamW moments "m<i>"/"v<i>" (kept across steps, as
// upstream) and the fragment snapshots "s<i>". The gateway drives every
// worker in lock step, one local step per task (@train_steps with K=1 of
// `pcp compile --program train`, state in and out as resident refs, only the
// batch and the loss on the wire), and per fragment two small element-wise
// programs emitted here as StableHLO text:
//   @delta(s..., c...) -> (s - c in the wire dtype..., c...)   send: the
//       delta comes back, the current values stay as the new snapshot;
//   @mix(alpha, g..., l...) -> (b..., b...)  receive: b = alpha*l +
//       (1-alpha)*g becomes both the local values and the snapshot.
// The master parameters and the outer Nesterov state stay on the gateway,
// updated per fragment when its deltas are in. The schedule is diloco.h's.
// Elastic: a lost worker is dropped (its state was on it) and its
// contributions to the rounds in flight are counted as dropped; a worker
// that joins mid-run (or a lost one back on a new connection) is admitted
// at the next step boundary: "Joins" below. Checkpoints and resume:
// "Streaming checkpoints" below.

#define MAX_FRAGMENTS 64
// (backend, target) kinds of one run: programs compiled per kind.
#define MAX_STREAM_KINDS 8

typedef struct stream_kind_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint8_t train_hash[PCP_SHA256_BYTE_LENGTH];
  uint8_t fragment_hash[MAX_FRAGMENTS][PCP_SHA256_BYTE_LENGTH];
} stream_kind_t;

typedef struct stream_worker_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[PCP_STORE_ID_MAX_LENGTH + 48];
  bool alive;
  pcp_data_sampler_t* sampler;
  int32_t* tokens;    // ids then targets, A*B*T each ([1, A, B, T])
  int64_t* tokens64;  // the same widened, for a module taking i64 ids
  pcp_fabric_task_t* task;
  float last_loss;
  uint32_t shard;  // its sampler's shard of the plan (kept by a resume)
  uint32_t kind;   // its stream_t.kinds entry
  // The fabric's join_count of the connection admitted: a lost worker is
  // admitted again only on a new connection.
  uint32_t join_count;
  // Fragments whose current round it is in and has not sent its delta for
  // yet (bit p): lost, each counts as a dropped contribution of p's round.
  uint64_t in_round;
  bool fresh;  // admitted, its state not made yet (@init pending)
  // Goodput: the step its state was made at (@init before that step's
  // compute; 1 for a state resumed from a checkpoint).
  uint64_t joined_step;
} stream_worker_t;

typedef struct stream_t {
  job_t* job;
  pcp_streaming_diloco_schedule_t schedule;
  stream_kind_t kinds[MAX_STREAM_KINDS];
  uint32_t kind_count;
  stream_worker_t workers[MAX_ROUND_WORKERS];
  uint32_t worker_count;
  uint32_t shard_count;  // the plan's shards: workers of the first start
  uint64_t plan_step;    // the plan's step: 0, or the step of a re-shard
  uint32_t joins;        // admissions so far (session ids)
  uint64_t nonce;        // this run's session id suffix
  pcp_fabric_worker_info_t* infos;  // MAX_ROUND_WORKERS, for join checks
  // Since the last sync event: ids joined and lost; per fragment, the
  // contributions dropped from its round in flight.
  json_t* joined;
  json_t* left;
  uint32_t dropped[MAX_FRAGMENTS];
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  char (*names)[24];  // "p0", "m0", "v0", "s0" ... per tensor: 4 each
  float* zeros;       // parameter_count zeros: the first moments
  float alpha;
  float lr;
  float step_value;
  uint64_t syncs;
  uint64_t sync_total;
  bool bf16;         // deltas on the wire in bf16 (deltas_dtype)
  bool bf16_params;  // the model's parameters (p, s, masters down) are bf16
  // The inputs whose SHA-256 the tasks stream_submit sends return (0: none):
  // set around a @mix, whose first inputs are alpha and the masters.
  uint32_t hash_inputs;
  // Goodput (stream_merged_add): the local step the loop is at, and per
  // fragment the step whose compute came right after its last @mix (1
  // before any): a worker's delta of fragment p holds its steps from the
  // later of that and its joined_step on. The steps between a send and its
  // @mix are blended away (alpha) and in no delta.
  uint64_t step;
  uint64_t mixed_step[MAX_FRAGMENTS];
} stream_t;

static const char* resident_name(stream_t* st, char kind, size_t tensor) {
  size_t slot = kind == 'p' ? 0 : kind == 'm' ? 1 : kind == 'v' ? 2 : 3;
  return st->names[4 * tensor + slot];
}

static void type_text(const pcp_models_parameter_t* p, const char* element,
                      char* out, size_t capacity) {
  int used = snprintf(out, capacity, "tensor<");
  for (int32_t d = 0; d < p->rank; ++d) {
    used += snprintf(out + used, capacity - (size_t)used, "%lldx",
                     (long long)p->dims[d]);
  }
  snprintf(out + used, capacity - (size_t)used, "%s>", element);
}

// What list_append writes per tensor of a fragment.
typedef enum list_mode_e {
  LIST_ARGS = 0,   // "%s3: tensor<...>"
  LIST_NAMES = 1,  // "%s3"
  LIST_TYPES = 2,  // "tensor<...>"
} list_mode_t;

// The tensors of one fragment: every |fragments|-th of |table| from
// |fragment| on (diloco.h's assignment).
typedef struct fragment_set_t {
  const pcp_models_parameter_table_t* table;
  uint32_t fragments;
} fragment_set_t;

// Appends, for each of |group_count| groups and each tensor of |fragment|,
// one comma-separated item: group g's names use prefix[g] and its types
// element[g]. |*first| says whether a separator is due.
static pcp_status_t list_append(pcp_string_builder_t* b,
                                const fragment_set_t* st, uint32_t fragment,
                                list_mode_t mode, const char* const* prefix,
                                const char* const* element, int group_count,
                                bool* first) {
  const pcp_models_parameter_table_t* table = st->table;
  pcp_status_t status = pcp_ok_status();
  char t[128];
  for (int g = 0; g < group_count && !status; ++g) {
    for (size_t i = fragment; i < table->count && !status; i += st->fragments) {
      type_text(&table->parameters[i], element[g], t, sizeof(t));
      const char* sep = *first ? "" : ", ";
      *first = false;
      if (mode == LIST_ARGS) {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu: %s", sep, prefix[g],
                                             i, t);
      } else if (mode == LIST_NAMES) {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu", sep, prefix[g], i);
      } else {
        status = pcp_string_builder_append_f(b, "%s%s", sep, t);
      }
    }
  }
  return status;
}

// "return NAMES : TYPES\n  }\n" of one function.
static pcp_status_t return_append(pcp_string_builder_t* b,
                                  const fragment_set_t* st, uint32_t fragment,
                                  const char* const* prefix,
                                  const char* const* element, int group_count) {
  bool first = true;
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "    return "));
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_NAMES, prefix,
                                       element, group_count, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_TYPES, prefix,
                                       element, group_count, &first));
  return pcp_string_builder_append_cstring(b, "\n  }\n");
}

// "  func.func @NAME(ARGS) -> (TYPES) {\n" of one function; |lead| is
// pasted before the tensor arguments ("" or "%alpha: tensor<f32>").
static pcp_status_t signature_append(
    pcp_string_builder_t* b, const fragment_set_t* st, uint32_t fragment,
    const char* name, const char* lead, const char* const* arg_prefix,
    const char* const* arg_element, int arg_groups,
    const char* const* result_element, int result_groups) {
  bool first = !lead[0];
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(b, "  func.func @%s(%s", name, lead));
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_ARGS, arg_prefix,
                                       arg_element, arg_groups, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_TYPES, arg_prefix,
                                       result_element, result_groups, &first));
  return pcp_string_builder_append_cstring(b, ") {\n");
}

// Appends "%<out><i> = stablehlo.convert %<in><i> : (A) -> B" for tensor
// |i| from element |from| to |to|.
static pcp_status_t convert_append(pcp_string_builder_t* b,
                                   const pcp_models_parameter_t* p, size_t i,
                                   const char* out, const char* in,
                                   const char* from, const char* to) {
  char a[128], c[128];
  type_text(p, from, a, sizeof(a));
  type_text(p, to, c, sizeof(c));
  return pcp_string_builder_append_f(
      b, "    %%%s%zu = stablehlo.convert %%%s%zu : (%s) -> %s\n", out, i, in,
      i, a, c);
}

// The local parameters p and snapshots s have the model's element type (f32
// or bf16), the moments m and v are f32 (the optimizer's master type), and
// the arithmetic of @delta and @mix runs in f32 whatever the model's type: a
// bf16 subtract of two nearby weights would lose most of the delta's bits.
pcp_status_t pcp_diloco_fragment_module_emit(
    const pcp_models_parameter_table_t* table, uint32_t fragment,
    uint32_t fragment_count, bool bf16_parameters, bool bf16_deltas,
    pcp_string_builder_t* b) {
  if (fragment_count == 0 || fragment >= fragment_count ||
      fragment >= table->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment %u of %u does not exist for %zu tensors",
                           fragment, fragment_count, table->count);
  }
  const fragment_set_t set = {.table = table, .fragments = fragment_count};
  const fragment_set_t* st = &set;
  uint32_t P = fragment_count;
  bool low = bf16_parameters;
  const char* pe = low ? "bf16" : "f32";  // p, s and the masters sent down
  const char* wire = bf16_deltas ? "bf16" : "f32";
  const char* const pe2[] = {pe, pe};
  const char* const f32x4[] = {"f32", "f32", "f32", "f32"};
  char t[128];
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "module {\n"));
  // @delta(s..., c...) -> (s - c in the wire dtype..., c...)
  const char* const delta_args[] = {"s", "c"};
  const char* const delta_results[] = {wire, pe};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "delta", "", delta_args, pe2, 2, delta_results, 2));
  for (size_t i = fragment; i < table->count; i += P) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    type_text(p, "f32", t, sizeof(t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "sf", "s", pe, "f32"));
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "cf", "c", pe, "f32"));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%d%zu = stablehlo.subtract %%%s%zu, %%%s%zu : %s\n", i,
        low ? "sf" : "s", i, low ? "cf" : "c", i, t));
    if (bf16_deltas) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "w", "d", "f32", wire));
    }
  }
  const char* const delta_out[] = {bf16_deltas ? "w" : "d", "c"};
  PCP_RETURN_IF_ERROR_BARE(
      return_append(b, st, fragment, delta_out, delta_results, 2));
  // @mix(alpha, g..., l...) -> (b..., b...), b = alpha*l + (1-alpha)*g.
  const char* const mix_args[] = {"g", "l"};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "mix", "%alpha: tensor<f32>", mix_args, pe2, 2, pe2, 2));
  for (size_t i = fragment; i < table->count; i += P) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    type_text(p, "f32", t, sizeof(t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "gf", "g", pe, "f32"));
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "lf", "l", pe, "f32"));
    }
    const char* g = low ? "gf" : "g";
    const char* l = low ? "lf" : "l";
    const char* out = low ? "bf" : "b";
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b,
        "    %%a%zu = stablehlo.broadcast_in_dim %%alpha, dims = [] : "
        "(tensor<f32>) -> %s\n"
        "    %%one%zu = stablehlo.constant dense<1.000000e+00> : %s\n"
        "    %%r%zu = stablehlo.subtract %%one%zu, %%a%zu : %s\n"
        "    %%x%zu = stablehlo.multiply %%a%zu, %%%s%zu : %s\n"
        "    %%y%zu = stablehlo.multiply %%r%zu, %%%s%zu : %s\n"
        "    %%%s%zu = stablehlo.add %%x%zu, %%y%zu : %s\n",
        i, t, i, t, i, i, i, t, i, i, l, i, t, i, i, g, i, t, out, i, i, i, t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "b", "bf", "f32", pe));
    }
  }
  const char* const mix_out[] = {"b", "b"};
  PCP_RETURN_IF_ERROR_BARE(return_append(b, st, fragment, mix_out, pe2, 2));
  // @init(p...) -> (p..., 0..., 0..., p...): the local parameters, zero
  // AdamW moments and the snapshot, made on the worker from the fragment's
  // masters (the frame carries only this fragment's tensors).
  const char* const init_args[] = {"p"};
  const char* const init_results[] = {pe, "f32", "f32", pe};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "init", "", init_args, pe2, 1, init_results, 4));
  for (size_t i = fragment; i < table->count; i += P) {
    type_text(&table->parameters[i], "f32", t, sizeof(t));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%z%zu = stablehlo.constant dense<0.000000e+00> : %s\n", i, t));
  }
  const char* const init_out[] = {"p", "z", "z", "p"};
  PCP_RETURN_IF_ERROR_BARE(
      return_append(b, st, fragment, init_out, init_results, 4));
  // @copy(x...) -> (x...): moves one kind (p, m, v or s) of the fragment's
  // resident tensors to the gateway for a checkpoint (resident refs in,
  // outputs returned) and back after a resume (sections in, outputs kept).
  // With bf16 parameters the f32 moments have their own, @copy_moments.
  const char* const copy_args[] = {"x"};
  PCP_RETURN_IF_ERROR_BARE(
      signature_append(b, st, fragment, "copy", "", copy_args, pe2, 1, pe2, 1));
  PCP_RETURN_IF_ERROR_BARE(return_append(b, st, fragment, copy_args, pe2, 1));
  if (low) {
    PCP_RETURN_IF_ERROR_BARE(signature_append(
        b, st, fragment, "copy_moments", "", copy_args, f32x4, 1, f32x4, 1));
    PCP_RETURN_IF_ERROR_BARE(
        return_append(b, st, fragment, copy_args, f32x4, 1));
  }
  return pcp_string_builder_append_cstring(b, "}\n");
}

static pcp_status_t stream_programs(stream_t* st, stream_kind_t* kind) {
  job_t* job = st->job;
  const char* backend = kind->backend;
  const char* target = kind->target;
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_job_child_compile(job, model, job->model_hash, "train", 1,
                                   backend, target, kind->train_hash));
  for (uint32_t p = 0; p < st->schedule.fragments; ++p) {
    pcp_string_builder_t b;
    pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20, &b);
    pcp_status_t status = pcp_diloco_fragment_module_emit(
        &job->table, p, st->schedule.fragments, st->bf16_params, st->bf16, &b);
    char name[64];
    snprintf(name, sizeof(name), "fragment-%u.mlir", p);
    if (!status) {
      status = pcp_diloco_job_module_compile(job, name, b.data, b.size, backend,
                                             target, kind->fragment_hash[p]);
    }
    pcp_string_builder_deinitialize(&b);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

// The index of the (backend, target) kind in st->kinds, its programs
// compiled when it is new. Mixed kinds train together as in classic
// rounds: each runs the same modules compiled for its target.
static pcp_status_t stream_kind_find(stream_t* st, const char* backend,
                                     const char* target, uint32_t* out_index) {
  for (uint32_t i = 0; i < st->kind_count; ++i) {
    if (!strcmp(st->kinds[i].backend, backend) &&
        !strcmp(st->kinds[i].target, target)) {
      *out_index = i;
      return pcp_ok_status();
    }
  }
  if (st->kind_count >= MAX_STREAM_KINDS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "more than %d (backend, target) kinds of streaming "
                           "workers",
                           MAX_STREAM_KINDS);
  }
  stream_kind_t* kind = &st->kinds[st->kind_count];
  memset(kind, 0, sizeof(*kind));
  snprintf(kind->backend, sizeof(kind->backend), "%s", backend);
  snprintf(kind->target, sizeof(kind->target), "%s", target);
  PCP_RETURN_IF_ERROR_BARE(stream_programs(st, kind));
  *out_index = st->kind_count++;
  return pcp_ok_status();
}

// Classic rounds with inner_state keep move a worker's resident AdamW
// moments with the same module, emitted for one fragment holding every
// tensor (P = 1): @copy / @copy_moments uploads fresh (zero) or resumed
// moments kept resident, and reads them back for a checkpoint.
pcp_status_t pcp_diloco_state_program_build(
    job_t* job, const char* backend, const char* target,
    uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20, &b);
  pcp_status_t status = pcp_diloco_fragment_module_emit(
      &job->table, 0, 1, job->param_type == PCP_ELEMENT_TYPE_BF16,
      job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16, &b);
  if (!status) {
    status = pcp_diloco_job_module_compile(job, "inner-state.mlir", b.data,
                                           b.size, backend, target, out_hash);
  }
  pcp_string_builder_deinitialize(&b);
  return status;
}

// Rounds fragment |fragment|'s masters into wire_parameters (bf16 models).
static void masters_round(stream_t* st, uint32_t fragment) {
  job_t* job = st->job;
  if (job->param_type != PCP_ELEMENT_TYPE_BF16) {
    return;
  }
  for (size_t i = fragment; i < job->table.count; i += st->schedule.fragments) {
    size_t offset = pcp_diloco_job_tensor_offset(job, i);
    pcp_diloco_bf16_quantize(job->parameters + offset,
                             (size_t)job->table.parameters[i].element_count,
                             job->wire_parameters + offset);
  }
}

// Marks |w| lost: it leaves the run (its state was on it); each fragment
// round it was in and had not sent its delta for yet closes without it,
// counted in st->dropped, and goes on with the others as the schedule says.
static void stream_worker_lost(stream_t* st, stream_worker_t* w,
                               const char* why) {
  PCP_LOG(PCP_LOG_WARN, &st->job->log,
          "streaming worker %s lost: %s; its contributions to %d fragment "
          "rounds in flight dropped",
          w->worker_id, why, __builtin_popcountll(w->in_round));
  w->alive = false;
  for (uint32_t p = 0; p < MAX_FRAGMENTS; ++p) {
    st->dropped[p] += (uint32_t)((w->in_round >> p) & 1u);
  }
  w->in_round = 0;
  if (st->left) {
    json_array_append_new(st->left, json_string(w->worker_id));
  }
  if (st->job->options->metrics) {
    pcp_obs_family_add(st->job->options->metrics->lost_tasks, NULL, 1);
  }
}

// Waits for the current task of every live worker; a failed one marks its
// worker lost. Returns true when the stop hook fired (tasks cancelled).
static bool stream_wait(stream_t* st) {
  pcp_fabric_task_t* tasks[MAX_ROUND_WORKERS];
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    tasks[k] = st->workers[k].task;
  }
  bool stopped = pcp_diloco_job_tasks_wait(
      st->job, tasks, st->worker_count,
      pcp_diloco_job_wait_timeout_ms(st->job, ROUND_WAIT_MIN_MS),
      "streaming tasks");
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->alive && w->task && pcp_fabric_task_status(w->task)) {
      stream_worker_lost(st, w,
                         pcp_status_message(pcp_fabric_task_status(w->task)));
    }
  }
  return stopped;
}

static void stream_tasks_release(stream_t* st) {
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    pcp_fabric_task_release(st->workers[k].task);
    st->workers[k].task = NULL;
  }
}

static void stream_submit(
    stream_t* st, stream_worker_t* w,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], const char* function,
    const pcp_proto_section_t* sections, uint32_t section_count,
    const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
    const pcp_proto_keep_resident_t* keep, uint32_t keep_count) {
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, program, sizeof(params.program));
  params.function = function;
  params.inputs = sections;
  params.input_count = section_count;
  params.input_refs = refs;
  params.input_ref_count = ref_count;
  params.keep_resident = keep;
  params.keep_resident_count = keep_count;
  params.worker_id = w->worker_id;
  params.session_id = w->session;
  params.max_attempts = 1;
  params.hash_inputs = st->hash_inputs;
  pcp_status_t status = pcp_diloco_job_task_submit(st->job, &params, &w->task);
  if (status) {
    w->task = NULL;
    stream_worker_lost(st, w, pcp_status_message(status));
    pcp_status_ignore(status);
  }
}

static uint32_t stream_alive(const stream_t* st) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    n += st->workers[k].alive;
  }
  return n;
}

// One local step on every live worker, all state resident.
static pcp_status_t stream_compute(stream_t* st, uint64_t step,
                                   bool* out_stopped) {
  job_t* job = st->job;
  size_t n = job->table.count;
  uint32_t B = (uint32_t)job->spec.batch, T = (uint32_t)job->spec.block_size;
  pcp_proto_tensor_ref_t* refs =
      pcp_diloco_job_calloc(job, 3 * n + 4, sizeof(*refs));
  pcp_proto_section_t* sections =
      pcp_diloco_job_calloc(job, 3 * n + 4, sizeof(*sections));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, 3 * n, sizeof(*keep));
  if (!refs || !sections || !keep) {
    pcp_diloco_job_free(job, refs);
    pcp_diloco_job_free(job, sections);
    pcp_diloco_job_free(job, keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "step refs");
  }
  st->step_value = (float)step;
  // The schedule over local steps (0-based: local step 1 is index 0).
  st->lr = pcp_diloco_lr_schedule_at(&job->schedule, step - 1);
  job->last_lr = st->lr;
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    // A micro batches (effective_batch_size), ids then targets:
    // [1, A, B, T] each.
    size_t A = (size_t)job->accumulation;
    size_t rows = A * B * T;
    for (size_t a = 0; a < A; ++a) {
      pcp_data_sampler_next(w->sampler, w->tokens + a * B * T,
                            w->tokens + rows + a * B * T, NULL);
    }
    bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
    if (wide) {
      for (size_t e = 0; e < 2 * rows; ++e) {
        w->tokens64[e] = w->tokens[e];
      }
    }
    uint32_t section_count = 0;
    for (int g = 0; g < 3; ++g) {
      for (size_t i = 0; i < n; ++i) {
        pcp_proto_tensor_ref_t* r = &refs[g * n + i];
        memset(r, 0, sizeof(*r));
        keep[g * n + i] =
            (pcp_proto_keep_resident_t){.output = (uint32_t)(g * n + i),
                                        .as = resident_name(st, "pmv"[g], i)};
        r->kind = PCP_PROTO_TENSOR_REF_RESIDENT;
        r->name = resident_name(st, "pmv"[g], i);
      }
    }
    pcp_proto_section_t* extra = &sections[section_count];
    extra[0] = (pcp_proto_section_t){.name = "step",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .byte_length = sizeof(float),
                                     .data = &st->step_value};
    // @train_steps takes one rate per fused step: [1] here (K = 1).
    extra[1] = (pcp_proto_section_t){.name = "lr",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .rank = 1,
                                     .shape = {1},
                                     .byte_length = sizeof(float),
                                     .data = &st->lr};
    size_t id_size = pcp_element_type_byte_size(job->data_type);
    for (int j = 0; j < 2; ++j) {
      pcp_proto_section_t* s = &extra[2 + j];
      *s = (pcp_proto_section_t){
          .name = j ? "targets" : "input_ids",
          .element_type = job->data_type,
          .byte_length = (uint64_t)(rows * id_size),
          .data = wide ? (const void*)(w->tokens64 + (size_t)j * rows)
                       : (const void*)(w->tokens + (size_t)j * rows)};
      uint32_t r = 0;
      s->shape[r++] = 1;
      if (A > 1) {
        s->shape[r++] = (int64_t)A;
      }
      s->shape[r++] = B;
      s->shape[r++] = T;
      s->rank = r;
    }
    for (int j = 0; j < 4; ++j) {
      refs[3 * n + j] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count + j};
    }
    job->token_bytes += 2ull * rows * id_size;
    stream_submit(st, w, st->kinds[w->kind].train_hash, "train_steps", sections,
                  section_count + 4, refs, (uint32_t)(3 * n + 4), keep,
                  (uint32_t)(3 * n));
    if (w->task) {
      // Goodput: the step as assigned (a worker lost with it in flight may
      // or may not have run it; the gateway cannot tell).
      job->tokens_computed += (uint64_t)rows;
    }
    // The struct arrays were copied by the submit; the data (the shared
    // parameters, zeros and scalars, this worker's tokens) stays borrowed
    // until stream_wait below.
  }
  *out_stopped = stream_wait(st);
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->alive && w->task && !pcp_fabric_task_status(w->task)) {
      const pcp_proto_section_t* outputs = NULL;
      size_t count = 0;
      pcp_status_t status = pcp_fabric_task_outputs(w->task, &outputs, &count);
      if (!status && count >= 1 && outputs[count - 1].byte_length == 4) {
        w->last_loss = *(const float*)outputs[count - 1].data;
      }
      pcp_status_ignore(status);
    }
  }
  stream_tasks_release(st);
  pcp_diloco_job_free(job, refs);
  pcp_diloco_job_free(job, sections);
  pcp_diloco_job_free(job, keep);
  return pcp_ok_status();
}

// The workers' state at start: @init(masters of the fragment) kept as the
// local parameters p<i>, zero moments m<i>/v<i> and the snapshot s<i>;
// only the fresh workers' (all at start, the admitted ones at a join).
static pcp_status_t stream_init_call(stream_t* st, uint32_t fragment,
                                     bool* out_stopped) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  masters_round(st, fragment);
  pcp_proto_section_t* sections =
      pcp_diloco_job_calloc(job, count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, 4 * count + 1, sizeof(*keep));
  if (!sections || !keep) {
    pcp_diloco_job_free(job, sections);
    pcp_diloco_job_free(job, keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "init refs");
  }
  size_t j = 0;
  for (size_t i = fragment; i < job->table.count; i += P, ++j) {
    pcp_proto_section_t* s = &sections[j];
    pcp_diloco_job_master_section(job, i, s);
    for (int g = 0; g < 4; ++g) {
      keep[g * count + j] =
          (pcp_proto_keep_resident_t){.output = (uint32_t)(g * count + j),
                                      .as = resident_name(st, "pmvs"[g], i)};
    }
  }
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->alive && w->fresh) {
      stream_submit(st, w, st->kinds[w->kind].fragment_hash[fragment], "init",
                    sections, (uint32_t)count, NULL, 0, keep,
                    (uint32_t)(4 * count));
    }
  }
  *out_stopped = stream_wait(st);
  stream_tasks_release(st);
  pcp_diloco_job_free(job, sections);
  pcp_diloco_job_free(job, keep);
  return pcp_ok_status();
}

// Checks every live worker's hash of a @mix's inputs (the last output)
// against |want|. on_param_mismatch "fail": the job fails; "resync": the
// mismatching workers run the @mix again with alpha 0 on the gateway's
// copy, so their local parameters and snapshot become the global ones
// (their own progress on the fragment is dropped: it was blended with the
// wrong copy), hashed again; one that still differs is dropped for the
// rest of the run.
static pcp_status_t mix_hashes_check(stream_t* st, uint32_t fragment,
                                     const uint8_t want[PCP_SHA256_BYTE_LENGTH],
                                     const pcp_proto_section_t* sections,
                                     uint32_t section_count,
                                     const pcp_proto_tensor_ref_t* refs,
                                     uint32_t ref_count,
                                     const pcp_proto_keep_resident_t* keep,
                                     uint32_t keep_count, bool* out_stopped) {
  job_t* job = st->job;
  // The resync's inputs: alpha 0, the same masters.
  static const float kZero = 0.0f;
  pcp_proto_section_t* resync =
      pcp_diloco_job_calloc(job, section_count, sizeof(*resync));
  if (!resync) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "resync inputs");
  }
  memcpy(resync, sections, section_count * sizeof(*resync));
  resync[0].data = &kZero;
  uint8_t resync_want[PCP_SHA256_BYTE_LENGTH];
  pcp_diloco_param_hash(resync, section_count, resync_want);
  pcp_status_t status = pcp_ok_status();
  bool resynced[MAX_ROUND_WORKERS] = {false};
  for (int attempt = 0; attempt < 2 && !*out_stopped && !status; ++attempt) {
    bool redo[MAX_ROUND_WORKERS] = {false};
    bool any = false;
    for (uint32_t k = 0; k < st->worker_count; ++k) {
      stream_worker_t* w = &st->workers[k];
      if (!w->alive || !w->task) {
        continue;
      }
      const pcp_proto_section_t* outputs = NULL;
      size_t n_out = 0;
      status = pcp_fabric_task_outputs(w->task, &outputs, &n_out);
      if (!status && (n_out == 0 || outputs[n_out - 1].byte_length !=
                                        PCP_SHA256_BYTE_LENGTH)) {
        status = pcp_make_status(PCP_STATUS_INTERNAL,
                                 "worker %s: @mix returned no parameter hash",
                                 w->worker_id);
      }
      bool match = true;
      if (!status) {
        status = pcp_diloco_param_hash_check(
            job, w->worker_id, st->syncs + 1,
            attempt > 0 && resynced[k] ? resync_want : want,
            outputs[n_out - 1].data, &match);
      }
      if (status) {
        break;
      }
      if (!match && attempt == 0) {
        redo[k] = any = true;
      } else if (!match) {
        PCP_LOG(PCP_LOG_WARN, &job->log,
                "streaming worker %s: parameters differ again after a "
                "resync; dropped for the rest of the run",
                w->worker_id);
        // Not admitted again on this connection (stream_join).
        stream_worker_lost(st, w, "parameters differ after a resync");
      }
    }
    if (status || !any) {
      break;
    }
    // resync: the @mix again, on the mismatching workers only (the others
    // keep their finished task: waited on at once, checked again).
    for (uint32_t k = 0; k < st->worker_count; ++k) {
      if (redo[k]) {
        resynced[k] = true;
        pcp_fabric_task_release(st->workers[k].task);
        st->workers[k].task = NULL;
        stream_submit(st, &st->workers[k],
                      st->kinds[st->workers[k].kind].fragment_hash[fragment],
                      "mix", resync, section_count, refs, ref_count, keep,
                      keep_count);
      }
    }
    *out_stopped = stream_wait(st);
  }
  pcp_diloco_job_free(job, resync);
  return status;
}

// Goodput: worker |w|'s delta of |fragment|, sent at step st->step, went
// into the masters: the tokens of its steps since the fragment's last @mix
// (or its @init), times the fragment's share of the parameters (a token
// trained every fragment; this delta carries one fragment's part of it).
static void stream_merged_add(stream_t* st, const stream_worker_t* w,
                              uint32_t fragment) {
  job_t* job = st->job;
  uint64_t first = st->mixed_step[fragment] > w->joined_step
                       ? st->mixed_step[fragment]
                       : w->joined_step;
  if (st->step < first || !job->parameter_count) {
    return;
  }
  uint64_t values = 0;
  for (size_t i = fragment; i < job->table.count; i += st->schedule.fragments) {
    values += (uint64_t)job->table.parameters[i].element_count;
  }
  double tokens = (double)(st->step - first + 1) * (double)job->accumulation *
                  (double)job->spec.batch * (double)job->spec.block_size;
  job->tokens_merged += tokens * (double)values / (double)job->parameter_count;
}

// A fragment's send (@delta) or receive (@mix) on every live worker.
static pcp_status_t stream_fragment_call(stream_t* st, uint32_t fragment,
                                         bool mix, bool init, bool* out_stopped,
                                         uint64_t* out_bytes) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  pcp_proto_tensor_ref_t* refs =
      pcp_diloco_job_calloc(job, 2 * count + 1, sizeof(*refs));
  pcp_proto_section_t* sections =
      pcp_diloco_job_calloc(job, 2 * count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, 2 * count, sizeof(*keep));
  if (!refs || !sections || !keep) {
    pcp_diloco_job_free(job, refs);
    pcp_diloco_job_free(job, sections);
    pcp_diloco_job_free(job, keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "fragment refs");
  }
  uint32_t section_count = 0;
  uint32_t ref_count = 0;
  uint32_t keep_count = 0;
  uint64_t master_bytes = 0;
  if (mix) {
    masters_round(st, fragment);
    sections[section_count] =
        (pcp_proto_section_t){.name = "alpha",
                              .element_type = PCP_ELEMENT_TYPE_F32,
                              .byte_length = sizeof(float),
                              .data = &st->alpha};
    refs[ref_count++] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count++};
  }
  // First group: mix -> the masters (sections); delta -> s<i> (resident, or
  // the params for the initial snapshot).
  for (int pass = 0; pass < 2; ++pass) {
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count; i += P, ++j) {
      bool section = mix && pass == 0;
      if (section) {
        pcp_proto_section_t* s = &sections[section_count];
        pcp_diloco_job_master_section(job, i, s);
        if (mix) {
          master_bytes += s->byte_length;
        }
        refs[ref_count++] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count++};
      } else {
        refs[ref_count++] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT,
            .name = resident_name(st, (mix || pass == 1) ? 'p' : 's', i)};
      }
      // Outputs: delta -> (deltas..., copies...): keep copies as s<i>;
      // mix -> (b..., b...): keep as p<i> and s<i>.
      if (pass == 0 && mix) {
        keep[keep_count++] = (pcp_proto_keep_resident_t){
            .output = (uint32_t)j, .as = resident_name(st, 'p', i)};
      }
      if (pass == 1) {
        keep[keep_count++] = (pcp_proto_keep_resident_t){
            .output = (uint32_t)(count + j), .as = resident_name(st, 's', i)};
      }
    }
  }
  uint64_t up_bytes = 0;
  uint32_t reporters = 0;
  // A @mix hashes what it received (alpha, then the fragment's masters):
  // every worker must hold the gateway's global parameters bit for bit.
  uint8_t param_sha256[PCP_SHA256_BYTE_LENGTH];
  if (mix) {
    pcp_diloco_param_hash(sections, section_count, param_sha256);
    st->hash_inputs = section_count;
  }
  for (uint32_t k = 0; k < st->worker_count && !*out_stopped; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    stream_submit(st, w, st->kinds[w->kind].fragment_hash[fragment],
                  mix ? "mix" : "delta", sections, section_count, refs,
                  ref_count, keep, keep_count);
  }
  *out_stopped = stream_wait(st);
  pcp_status_t status = pcp_ok_status();
  if (mix && !*out_stopped) {
    status =
        mix_hashes_check(st, fragment, param_sha256, sections, section_count,
                         refs, ref_count, keep, keep_count, out_stopped);
  }
  st->hash_inputs = 0;
  if (!mix && !init && !*out_stopped) {
    // Sum the deltas of the fragment's tensors over the reporters.
    float* sum = job->accumulator.sum;
    for (size_t i = fragment; i < job->table.count; i += P) {
      memset(sum + pcp_diloco_job_tensor_offset(job, i), 0,
             (size_t)job->table.parameters[i].element_count * sizeof(float));
    }
    for (uint32_t k = 0; k < st->worker_count && !status; ++k) {
      stream_worker_t* w = &st->workers[k];
      if (!w->alive || !w->task) {
        continue;
      }
      const pcp_proto_section_t* outputs = NULL;
      size_t n_out = 0;
      status = pcp_fabric_task_outputs(w->task, &outputs, &n_out);
      if (status) {
        break;
      }
      size_t j = 0;
      for (size_t i = fragment; i < job->table.count && j < n_out;
           i += P, ++j) {
        size_t elements = (size_t)job->table.parameters[i].element_count;
        float* dst = sum + pcp_diloco_job_tensor_offset(job, i);
        float* tmp = (float*)job->scratch;
        size_t want = elements * (st->bf16 ? 2 : 4);
        if (outputs[j].byte_length != want) {
          status = pcp_make_status(PCP_STATUS_INTERNAL,
                                   "fragment delta of %" PRIu64 " bytes",
                                   outputs[j].byte_length);
          break;
        }
        if (st->bf16) {
          pcp_diloco_bf16_dequantize(outputs[j].data, elements, tmp);
        } else {
          memcpy(tmp, outputs[j].data, elements * sizeof(float));
        }
        for (size_t e = 0; e < elements; ++e) {
          dst[e] += tmp[e];
        }
        up_bytes += outputs[j].byte_length;
      }
      ++reporters;
      w->in_round &= ~((uint64_t)1 << fragment);
      stream_merged_add(st, w, fragment);
    }
    for (size_t i = fragment; i < job->table.count && !status && reporters;
         i += P) {
      size_t elements = (size_t)job->table.parameters[i].element_count;
      float* g = job->accumulator.sum + pcp_diloco_job_tensor_offset(job, i);
      for (size_t e = 0; e < elements; ++e) {
        g[e] = isfinite(g[e]) ? g[e] / (float)reporters : 0.0f;
      }
      status = pcp_diloco_nesterov_step(
          &job->nesterov, pcp_diloco_job_tensor_offset(job, i), elements, g,
          job->parameters + pcp_diloco_job_tensor_offset(job, i));
    }
  }
  if (mix && !*out_stopped) {
    // Every live worker's fragment is the blend now: its next delta starts
    // with this step's compute.
    st->mixed_step[fragment] = st->step;
    for (uint32_t k = 0; k < st->worker_count; ++k) {
      if (st->workers[k].alive && st->workers[k].task) {
        ++reporters;
        // The fragment's next round starts: the worker is in it.
        st->workers[k].in_round |= (uint64_t)1 << fragment;
      }
    }
    up_bytes = master_bytes * reporters;
  }
  stream_tasks_release(st);
  pcp_diloco_job_free(job, refs);
  pcp_diloco_job_free(job, sections);
  pcp_diloco_job_free(job, keep);
  *out_bytes = init ? 0 : up_bytes;
  return status;
}

//===----------------------------------------------------------------------===//
// Streaming checkpoints
//===----------------------------------------------------------------------===//
//
// A streaming checkpoint is taken at a step boundary (after step t's sends)
// and holds, besides the masters and the outer velocity of every classic
// one, what lives on the workers and in the loop: the cursor's "streaming"
// object (schedule, t, syncs, per-fragment in-flight bytes and senders, per
// worker its shard, sampler cursor and last loss) and a side file
// stream-<sync>.workers beside the checkpoint with every live worker's
// resident p/m/v/s (4 f32 parameter vectors per worker, in the cursor's
// worker order), named in the cursor with its SHA-256. The side file is
// written before the checkpoint row, so an indexed checkpoint always has it.

// Moves kind |kind| (0..3: p, m, v, s) of |fragment|'s tensors between
// every live worker's session and |state| (per worker in |slots| order, 4
// parameter vectors p, m, v, s): |upload| false runs @copy on the resident
// tensors and reads the outputs; true sends the sections and keeps the
// outputs resident. One fragment's tensors of one kind per task keep the
// frame within the fabric's section limit, as for @delta / @mix.
static pcp_status_t stream_copy_call(stream_t* st, uint32_t fragment, int kind,
                                     bool upload, float* state,
                                     bool* out_stopped) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t N = job->parameter_count;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  pcp_proto_tensor_ref_t* refs =
      pcp_diloco_job_calloc(job, count + 1, sizeof(*refs));
  pcp_proto_section_t* sections =
      pcp_diloco_job_calloc(job, count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, count + 1, sizeof(*keep));
  uint32_t* slots =
      pcp_diloco_job_calloc(job, st->worker_count + 1, sizeof(*slots));
  if (!refs || !sections || !keep || !slots) {
    pcp_diloco_job_free(job, refs);
    pcp_diloco_job_free(job, sections);
    pcp_diloco_job_free(job, keep);
    pcp_diloco_job_free(job, slots);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "copy refs");
  }
  const char k = "pmvs"[kind];
  // A bf16 model's p and s are bf16 on the worker (widened here, exactly;
  // rounded back exactly on upload); the moments are f32 either way.
  bool low = st->bf16_params && (kind == 0 || kind == 3);
  const char* function = st->bf16_params && !low ? "copy_moments" : "copy";
  uint16_t* narrow = NULL;
  if (low && upload) {
    narrow = pcp_diloco_job_calloc(job, (size_t)st->worker_count * N + 1,
                                   sizeof(uint16_t));
    if (!narrow) {
      pcp_diloco_job_free(job, refs);
      pcp_diloco_job_free(job, sections);
      pcp_diloco_job_free(job, keep);
      pcp_diloco_job_free(job, slots);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "copy buffer");
    }
  }
  uint32_t slot = 0;
  for (uint32_t w = 0; w < st->worker_count; ++w) {
    stream_worker_t* worker = &st->workers[w];
    if (!worker->alive) {
      continue;
    }
    slots[w] = slot++;
    const float* base = state + ((size_t)slots[w] * 4 + (size_t)kind) * N;
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count; i += P, ++j) {
      const pcp_models_parameter_t* p = &job->table.parameters[i];
      if (upload) {
        pcp_proto_section_t* s = &sections[j];
        memset(s, 0, sizeof(*s));
        s->name = resident_name(st, k, i);
        s->element_type = low ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
        s->rank = (uint32_t)p->rank;
        for (int32_t d = 0; d < p->rank; ++d) {
          s->shape[d] = p->dims[d];
        }
        s->byte_length = (uint64_t)p->element_count * (low ? 2 : 4);
        s->data = base + pcp_diloco_job_tensor_offset(job, i);
        if (low) {
          uint16_t* out = narrow + (size_t)slots[w] * N +
                          pcp_diloco_job_tensor_offset(job, i);
          pcp_diloco_bf16_quantize(base + pcp_diloco_job_tensor_offset(job, i),
                                   (size_t)p->element_count, out);
          s->data = out;
        }
        keep[j] = (pcp_proto_keep_resident_t){.output = (uint32_t)j,
                                              .as = resident_name(st, k, i)};
      } else {
        refs[j] =
            (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                     .name = resident_name(st, k, i)};
      }
    }
    // The struct arrays are copied by the submit; the data stays borrowed
    // until stream_wait.
    if (upload) {
      stream_submit(st, worker, st->kinds[worker->kind].fragment_hash[fragment],
                    function, sections, (uint32_t)count, NULL, 0, keep,
                    (uint32_t)count);
    } else {
      stream_submit(st, worker, st->kinds[worker->kind].fragment_hash[fragment],
                    function, NULL, 0, refs, (uint32_t)count, NULL, 0);
    }
  }
  *out_stopped = stream_wait(st);
  pcp_status_t status = pcp_ok_status();
  for (uint32_t w = 0;
       w < st->worker_count && !upload && !*out_stopped && !status; ++w) {
    stream_worker_t* worker = &st->workers[w];
    if (!worker->alive || !worker->task) {
      continue;
    }
    const pcp_proto_section_t* outputs = NULL;
    size_t n_out = 0;
    status = pcp_fabric_task_outputs(worker->task, &outputs, &n_out);
    if (!status && n_out != count) {
      status =
          pcp_make_status(PCP_STATUS_INTERNAL,
                          "@copy returned %zu tensors, not %zu", n_out, count);
    }
    float* base = state + ((size_t)slots[w] * 4 + (size_t)kind) * N;
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count && !status; i += P, ++j) {
      size_t elements = (size_t)job->table.parameters[i].element_count;
      size_t bytes = elements * (low ? 2 : 4);
      if (outputs[j].byte_length != bytes) {
        status = pcp_make_status(PCP_STATUS_INTERNAL,
                                 "@copy returned %" PRIu64 " bytes, not %zu",
                                 outputs[j].byte_length, bytes);
        break;
      }
      if (low) {
        pcp_diloco_bf16_dequantize(outputs[j].data, elements,
                                   base + pcp_diloco_job_tensor_offset(job, i));
      } else {
        memcpy(base + pcp_diloco_job_tensor_offset(job, i), outputs[j].data,
               bytes);
      }
    }
  }
  stream_tasks_release(st);
  pcp_diloco_job_free(job, narrow);
  pcp_diloco_job_free(job, refs);
  pcp_diloco_job_free(job, sections);
  pcp_diloco_job_free(job, keep);
  pcp_diloco_job_free(job, slots);
  return status;
}

// The loop's own state beside stream_t, as a checkpoint holds it.
typedef struct stream_loop_t {
  uint64_t step;  // the last completed local step
  uint64_t pending_up[MAX_FRAGMENTS];
  uint32_t pending_senders[MAX_FRAGMENTS];
  uint64_t last_event_step;
} stream_loop_t;

// Writes a checkpoint at the boundary after step loop->step (see above).
// A checkpoint already indexed at this sync (a restarted run repeating
// what the dead gateway wrote) is the same state by construction: only the
// model is exported again. A worker lost while its state is read skips
// the checkpoint (the next one is complete).
static pcp_status_t stream_checkpoint(stream_t* st, const stream_loop_t* loop,
                                      bool* out_stopped) {
  job_t* job = st->job;
  const pcp_diloco_job_options_t* o = job->options;
  pcp_store_checkpoint_t row;
  pcp_status_t status = pcp_store_checkpoint_get(
      o->store, o->job_id, (int64_t)job->outer_step, &row);
  if (!status) {
    return pcp_diloco_job_model_export(job);
  }
  if (pcp_status_code(status) != PCP_STATUS_NOT_FOUND) {
    return status;
  }
  pcp_status_ignore(status);
  status = pcp_ok_status();
  uint32_t alive = stream_alive(st);
  size_t N = job->parameter_count;
  size_t bytes = (size_t)alive * 4 * N * sizeof(float);
  float* state = pcp_diloco_job_malloc(job, bytes ? bytes : 1);
  if (!state) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu bytes of worker state", bytes);
  }
  int64_t start_ns = pcp_clock_now_ns(o->clock);
  for (uint32_t p = 0; p < st->schedule.fragments && !status && !*out_stopped;
       ++p) {
    for (int kind = 0; kind < 4 && !status && !*out_stopped; ++kind) {
      status = stream_copy_call(st, p, kind, false, state, out_stopped);
    }
  }
  if (status || *out_stopped) {
    pcp_diloco_job_free(job, state);
    return status;
  }
  if (stream_alive(st) != alive) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "a worker was lost while the state was read: no checkpoint at "
            "sync %" PRIu64,
            job->outer_step);
    pcp_diloco_job_free(job, state);
    return pcp_ok_status();
  }
  char name[64];
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  status =
      pcp_diloco_job_state_file_write(job, "stream", state, bytes, name, hex);
  pcp_diloco_job_free(job, state);
  PCP_RETURN_IF_ERROR_BARE(status);
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "streaming worker state for sync %" PRIu64
          ": %zu bytes from %u workers read and written in %.2f s",
          job->outer_step, bytes, alive,
          (double)(pcp_clock_now_ns(o->clock) - start_ns) / 1e9);
  json_t* workers = json_array();
  char cursor_text[PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1];
  for (uint32_t k = 0; k < st->worker_count && workers; ++k) {
    const stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    pcp_data_cursor_t cursor;
    pcp_data_sampler_cursor(w->sampler, &cursor);
    pcp_data_cursor_format(&cursor, cursor_text, sizeof(cursor_text));
    json_array_append_new(
        workers, json_pack("{s:s, s:I, s:o, s:s}", "worker_id", w->worker_id,
                           "shard", (json_int_t)w->shard, "loss",
                           pcp_diloco_json_number_or_null(w->last_loss),
                           "sampler", cursor_text));
  }
  json_t* up = json_array();
  json_t* senders = json_array();
  for (uint32_t p = 0; p < st->schedule.fragments && up && senders; ++p) {
    json_array_append_new(up, json_integer((json_int_t)loop->pending_up[p]));
    json_array_append_new(senders,
                          json_integer((json_int_t)loop->pending_senders[p]));
  }
  job->stream_cursor = json_pack(
      "{s:I, s:I, s:I, s:f, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:o, "
      "s:o, s:o, s:s, s:s, s:I}",
      "fragments", (json_int_t)st->schedule.fragments, "inner_steps",
      (json_int_t)st->schedule.inner_steps, "overlap_tau",
      (json_int_t)st->schedule.overlap_tau, "alpha", (double)st->alpha,
      "deltas_dtype", st->bf16 ? "bf16" : "f32", "max_rounds",
      (json_int_t)st->schedule.max_rounds, "step", (json_int_t)loop->step,
      "syncs", (json_int_t)st->syncs, "last_event_step",
      (json_int_t)loop->last_event_step, "backend", st->backend, "target",
      st->target, "shards", (json_int_t)st->shard_count, "pending_up",
      up ? up : json_array(), "pending_senders",
      senders ? senders : json_array(), "workers",
      workers ? workers : json_array(), "state_file", name, "state_sha256", hex,
      "state_bytes", (json_int_t)bytes);
  if (!job->stream_cursor) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "streaming cursor");
  }
  json_object_set_new(job->stream_cursor, "dtype",
                      json_string(st->bf16_params ? "bf16" : "f32"));
  if (st->plan_step) {
    // A join re-sharded the data: the plan is the one of that step.
    json_object_set_new(job->stream_cursor, "plan_step",
                        json_integer((json_int_t)st->plan_step));
  }
  status = pcp_diloco_job_checkpoint_write(job);
  json_decref(job->stream_cursor);
  job->stream_cursor = NULL;
  if (!status && job->checkpoint_dir[0]) {
    // checkpoint_dir keeps latest.ckpt only: its older state files go.
    DIR* entries = opendir(job->checkpoint_dir);
    struct dirent* entry;
    while (entries && (entry = readdir(entries)) != NULL) {
      size_t length = strlen(entry->d_name);
      if (strncmp(entry->d_name, "stream-", 7) == 0 && length > 8 &&
          strcmp(entry->d_name + length - 8, ".workers") == 0 &&
          strcmp(entry->d_name, name) != 0) {
        char path[1600];
        snprintf(path, sizeof(path), "%s/%s", job->checkpoint_dir,
                 entry->d_name);
        unlink(path);
      }
    }
    if (entries) {
      closedir(entries);
    }
  }
  return status;
}

static pcp_status_t resume_error(const char* what) {
  return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                         "streaming checkpoint: %s", what);
}

// Checks the resumed cursor against this job and reads its worker state
// file (verified against the cursor's SHA-256): *out_state holds
// *out_workers workers' p/m/v/s (caller frees).
static pcp_status_t stream_resume_load(stream_t* st, stream_loop_t* loop,
                                       float** out_state,
                                       uint32_t* out_workers) {
  job_t* job = st->job;
  json_t* c = job->stream_resume;
  *out_state = NULL;
  *out_workers = 0;
  uint32_t P = st->schedule.fragments;
  json_int_t fragments = json_integer_value(json_object_get(c, "fragments"));
  json_int_t inner = json_integer_value(json_object_get(c, "inner_steps"));
  json_int_t tau = json_integer_value(json_object_get(c, "overlap_tau"));
  double alpha = json_number_value(json_object_get(c, "alpha"));
  const char* dtype = json_string_value(json_object_get(c, "deltas_dtype"));
  // Older streaming checkpoints (f32 models only) have no "dtype".
  const char* model_dtype = json_string_value(json_object_get(c, "dtype"));
  const char* want_dtype = st->bf16_params ? "bf16" : "f32";
  if (strcmp(model_dtype ? model_dtype : "f32", want_dtype) != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "streaming checkpoint of a %s model; this job "
                           "trains %s (key 'dtype')",
                           model_dtype, want_dtype);
  }
  if (fragments != (json_int_t)P ||
      inner != (json_int_t)st->schedule.inner_steps ||
      tau != (json_int_t)st->schedule.overlap_tau ||
      (float)alpha != st->alpha || !dtype ||
      strcmp(dtype, st->bf16 ? "bf16" : "f32") != 0) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "streaming checkpoint of P=%lld H=%lld overlap_tau=%lld alpha=%g "
        "deltas_dtype=%s; this job has P=%u H=%u overlap_tau=%u alpha=%g "
        "deltas_dtype=%s",
        (long long)fragments, (long long)inner, (long long)tau, alpha,
        dtype ? dtype : "?", P, st->schedule.inner_steps,
        st->schedule.overlap_tau, (double)st->alpha, st->bf16 ? "bf16" : "f32");
  }
  json_t* workers = json_object_get(c, "workers");
  json_t* up = json_object_get(c, "pending_up");
  json_t* senders = json_object_get(c, "pending_senders");
  const char* backend = json_string_value(json_object_get(c, "backend"));
  const char* target = json_string_value(json_object_get(c, "target"));
  const char* name = json_string_value(json_object_get(c, "state_file"));
  const char* hex = json_string_value(json_object_get(c, "state_sha256"));
  json_int_t shards = json_integer_value(json_object_get(c, "shards"));
  json_int_t syncs = json_integer_value(json_object_get(c, "syncs"));
  size_t count = json_array_size(workers);
  if (count < 1 || count > MAX_ROUND_WORKERS || shards < (json_int_t)count ||
      shards > MAX_ROUND_WORKERS || json_array_size(up) != P ||
      json_array_size(senders) != P || !backend || !target ||
      strlen(backend) >= sizeof(st->backend) ||
      strlen(target) >= sizeof(st->target) || !hex ||
      strlen(hex) != PCP_SHA256_HEX_LENGTH ||
      (uint64_t)syncs != job->outer_step) {
    return resume_error(
        "malformed cursor (workers, shards, pending, kind "
        "or syncs)");
  }
  // A plain file name beside the checkpoint, nothing else.
  if (!name || !name[0] || name[0] == '.' || strchr(name, '/') ||
      strlen(name) > 128) {
    return resume_error("bad worker state file name");
  }
  snprintf(st->backend, sizeof(st->backend), "%s", backend);
  snprintf(st->target, sizeof(st->target), "%s", target);
  st->shard_count = (uint32_t)shards;
  // Absent before elastic runs (and when no join re-sharded): step 0.
  json_int_t plan_step = json_integer_value(json_object_get(c, "plan_step"));
  st->plan_step = plan_step > 0 ? (uint64_t)plan_step : 0;
  loop->step = (uint64_t)json_integer_value(json_object_get(c, "step"));
  loop->last_event_step =
      (uint64_t)json_integer_value(json_object_get(c, "last_event_step"));
  for (uint32_t p = 0; p < P; ++p) {
    loop->pending_up[p] = (uint64_t)json_integer_value(json_array_get(up, p));
    loop->pending_senders[p] =
        (uint32_t)json_integer_value(json_array_get(senders, p));
  }
  st->syncs = (uint64_t)syncs;
  for (size_t k = 0; k < count; ++k) {
    json_t* w = json_array_get(workers, k);
    json_int_t shard = json_integer_value(json_object_get(w, "shard"));
    const char* sampler = json_string_value(json_object_get(w, "sampler"));
    if (shard < 0 || shard >= shards || !sampler) {
      return resume_error("malformed worker entry");
    }
  }
  size_t N = job->parameter_count;
  size_t want = count * 4 * N * sizeof(float);
  if (json_integer_value(json_object_get(c, "state_bytes")) !=
      (json_int_t)want) {
    return resume_error(
        "its worker state size is not workers x 4 x the "
        "model's parameters x 4 bytes");
  }
  char path[1500];
  snprintf(path, sizeof(path), "%s/%s", job->stream_resume_dir, name);
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status = pcp_file_read_all(path, want, &data, &length);
  if (status) {
    pcp_status_t wrapped = pcp_make_status(
        PCP_STATUS_DATA_LOSS, "streaming checkpoint's worker state %s: %s",
        path, pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  char got[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, got);
  if (length != want || strcmp(got, hex) != 0) {
    pcp_allocator_free(pcp_allocator_system(), data);
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "streaming checkpoint's worker state %s does not "
                           "match its checkpoint (%zu bytes, SHA-256 %s; "
                           "expected %zu bytes, %s)",
                           path, length, got, want, hex);
  }
  *out_state = data;
  *out_workers = (uint32_t)count;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Data shards and joins
//===----------------------------------------------------------------------===//
//
// The plan splits the train split into shard_count disjoint pieces
// (pcp_data_shard_plan over "shard-0000".. at plan_step), one per worker.
// A joining worker takes the slot of a lost one when its shard is still
// unheld: the lost worker's sampler goes on where it stopped, so no batch
// is drawn twice and no piece is sampled by two live workers. With no such
// slot every live worker is re-sharded: a new plan over the live workers at
// the join's step, each with a fresh sampler on its piece (the documented
// way to re-shard, data.h). Checkpoints keep shard_count and plan_step.

// The plan of shard_count shards at plan_step (caller frees).
static pcp_status_t stream_plan(stream_t* st, pcp_data_assignment_t** out) {
  job_t* job = st->job;
  const char* names[MAX_ROUND_WORKERS];
  char storage[MAX_ROUND_WORKERS][24];
  for (uint32_t k = 0; k < st->shard_count; ++k) {
    snprintf(storage[k], sizeof(storage[k]), "shard-%04u", k);
    names[k] = storage[k];
  }
  *out = pcp_diloco_job_calloc(job, st->shard_count + 1, sizeof(**out));
  if (!*out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "plan");
  }
  pcp_status_t status = pcp_data_shard_plan(
      job->dataset, job->train_range, (uint32_t)job->spec.block_size, names,
      st->shard_count, st->plan_step, job->seed, *out);
  if (status) {
    pcp_diloco_job_free(job, *out);
    *out = NULL;
  }
  return status;
}

// A sampler on plan[w->shard] (restored to |cursor_text| when given) and
// the worker's token buffers, made once.
static pcp_status_t stream_worker_data(stream_t* st,
                                       const pcp_data_assignment_t* plan,
                                       stream_worker_t* w,
                                       const char* cursor_text) {
  job_t* job = st->job;
  pcp_data_sampler_release(w->sampler);
  w->sampler = NULL;
  pcp_data_sampler_options_t so = {
      .sampling = job->config.sampling == PCP_DILOCO_SAMPLING_FIFO
                      ? PCP_DATA_SAMPLING_SEQUENTIAL
                      : PCP_DATA_SAMPLING_RANDOM,
      .batch_size = (uint32_t)job->spec.batch,
      .block_size = (uint32_t)job->spec.block_size,
      .seed = plan[w->shard].seed};
  PCP_RETURN_IF_ERROR_BARE(
      pcp_data_sampler_create(job->dataset, plan[w->shard].range, &so,
                              pcp_allocator_system(), &w->sampler));
  if (cursor_text) {
    pcp_data_cursor_t cursor;
    PCP_RETURN_IF_ERROR_BARE(pcp_data_cursor_parse(
        pcp_make_string_view(cursor_text, strlen(cursor_text)), &cursor));
    PCP_RETURN_IF_ERROR_BARE(pcp_data_sampler_restore(w->sampler, &cursor));
  }
  size_t rows = (size_t)job->accumulation *
                (size_t)(job->spec.batch * job->spec.block_size);
  if (!w->tokens) {
    w->tokens = pcp_diloco_job_malloc(job, 2 * rows * sizeof(int32_t));
  }
  if (w->tokens && !w->tokens64 && job->data_type == PCP_ELEMENT_TYPE_I64) {
    w->tokens64 = pcp_diloco_job_malloc(job, 2 * rows * sizeof(int64_t));
  }
  if (!w->tokens || (job->data_type == PCP_ELEMENT_TYPE_I64 && !w->tokens64)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "tokens");
  }
  return pcp_ok_status();
}

// Re-shards every live worker over a new plan at |step|; the lost
// workers' samplers go (their pieces belong to the old plan).
static pcp_status_t stream_reshard(stream_t* st, uint64_t step) {
  st->shard_count = stream_alive(st);
  st->plan_step = step;
  pcp_data_assignment_t* plan = NULL;
  PCP_RETURN_IF_ERROR_BARE(stream_plan(st, &plan));
  pcp_status_t status = pcp_ok_status();
  uint32_t shard = 0;
  for (uint32_t k = 0; k < st->worker_count && !status; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      pcp_data_sampler_release(w->sampler);
      w->sampler = NULL;
      continue;
    }
    w->shard = shard++;
    status = stream_worker_data(st, plan, w, NULL);
  }
  pcp_diloco_job_free(st->job, plan);
  PCP_LOG(PCP_LOG_INFO, &st->job->log,
          "streaming data re-sharded over %u workers at step %" PRIu64,
          st->shard_count, step);
  return status;
}

// Was worker |id| lost on connection |join_count| (a task failed without
// the connection ending: not admitted again until it joins anew)?
static bool stream_lost_on(const stream_t* st, const char* id,
                           uint32_t join_count) {
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    const stream_worker_t* w = &st->workers[k];
    if (!strcmp(w->worker_id, id) && w->join_count == join_count) {
      return !w->alive;
    }
  }
  return false;
}

// Before step |step|: admits every connected worker of the job's class not
// in the run (a new one, or a lost one on a new connection), up to
// MAX_ROUND_WORKERS live. Each gets the masters of every fragment as its
// parameters and snapshot and zero moments (@init: a reset inner
// optimizer), a data shard (above), and takes part from this step on: the
// step's receives, its local step, its sends.
static pcp_status_t stream_join(stream_t* st, uint64_t step,
                                bool* out_stopped) {
  job_t* job = st->job;
  uint32_t count = pcp_fabric_worker_list(job->options->fabric, st->infos,
                                          MAX_ROUND_WORKERS, NULL);
  const char* worker_class = job->config.worker_class;
  pcp_status_t status = pcp_ok_status();
  uint32_t admitted = 0;
  bool reshard = false;
  for (uint32_t i = 0; i < count && !status; ++i) {
    const pcp_fabric_worker_info_t* info = &st->infos[i];
    if (info->state != PCP_FABRIC_WORKER_CONNECTED ||
        (worker_class && strcmp(info->worker_class, worker_class))) {
      continue;
    }
    bool live = false;
    for (uint32_t k = 0; k < st->worker_count && !live; ++k) {
      live = st->workers[k].alive &&
             !strcmp(st->workers[k].worker_id, info->worker_id);
    }
    if (live || stream_lost_on(st, info->worker_id, info->join_count) ||
        stream_alive(st) >= MAX_ROUND_WORKERS) {
      continue;
    }
    // A lost worker's slot whose shard is still unheld; its own first.
    stream_worker_t* w = NULL;
    for (uint32_t k = 0; k < st->worker_count && !w; ++k) {
      stream_worker_t* c = &st->workers[k];
      w = !c->alive && c->sampler && !strcmp(c->worker_id, info->worker_id)
              ? c
              : NULL;
    }
    for (uint32_t k = 0; k < st->worker_count && !w; ++k) {
      stream_worker_t* c = &st->workers[k];
      // Not one still connected on the connection it was lost on: its
      // slot remembers not to admit it again on that connection.
      bool connected = false;
      for (uint32_t j = 0; j < count && !connected; ++j) {
        connected = st->infos[j].state == PCP_FABRIC_WORKER_CONNECTED &&
                    st->infos[j].join_count == c->join_count &&
                    !strcmp(st->infos[j].worker_id, c->worker_id);
      }
      w = !c->alive && c->sampler && !connected ? c : NULL;
    }
    if (!w && st->worker_count >= MAX_ROUND_WORKERS) {
      continue;
    }
    uint32_t kind = 0;
    status = stream_kind_find(st, info->backend, info->target, &kind);
    if (status) {
      break;
    }
    if (!w) {
      w = &st->workers[st->worker_count++];
      memset(w, 0, sizeof(*w));
      reshard = true;
    }
    snprintf(w->worker_id, sizeof(w->worker_id), "%s", info->worker_id);
    snprintf(w->session, sizeof(w->session), "%s-stream-%u-%" PRIx64,
             job->options->job_id, st->joins++, st->nonce);
    w->kind = kind;
    w->join_count = info->join_count;
    w->alive = true;
    w->fresh = true;
    w->joined_step = step;
    w->in_round = 0;
    w->last_loss = NAN;
    ++admitted;
    if (st->joined) {
      json_array_append_new(st->joined, json_string(w->worker_id));
    }
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "streaming worker %s (%s %s) joins at step %" PRIu64 "%s",
            w->worker_id, info->backend, info->target, step,
            w->sampler ? ": a lost worker's shard" : "");
  }
  if (!status && reshard) {
    status = stream_reshard(st, step);
  }
  for (uint32_t p = 0;
       p < st->schedule.fragments && admitted && !status && !*out_stopped;
       ++p) {
    status = stream_init_call(st, p, out_stopped);
  }
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->fresh && w->alive) {
      // In every fragment's current round from now on.
      w->in_round = st->schedule.fragments >= 64
                        ? ~(uint64_t)0
                        : ((uint64_t)1 << st->schedule.fragments) - 1;
    }
    w->fresh = false;
  }
  return status;
}

// A sync event's elastic fields: the live workers after it
// ("participants", each one's last local loss in "worker_losses"), the
// workers joined and lost since the previous sync event, and the
// contributions dropped from this fragment's round by workers lost before
// their delta was in ("fragment_replanned": its next round goes on with
// the live workers at the schedule's next send).
static void stream_progress_elastic(const stream_t* st, uint32_t fragment,
                                    json_t* progress) {
  json_t* ids = json_array();
  json_t* losses = json_object();
  for (uint32_t k = 0; k < st->worker_count && ids && losses; ++k) {
    const stream_worker_t* w = &st->workers[k];
    if (w->alive) {
      json_array_append_new(ids, json_string(w->worker_id));
      json_object_set_new(losses, w->worker_id,
                          pcp_diloco_json_number_or_null(w->last_loss));
    }
  }
  json_object_set_new(progress, "participants", ids ? ids : json_array());
  json_object_set_new(progress, "worker_losses",
                      losses ? losses : json_object());
  json_object_set_new(progress, "workers_joined",
                      st->joined ? json_copy(st->joined) : json_array());
  json_object_set_new(progress, "workers_left",
                      st->left ? json_copy(st->left) : json_array());
  json_object_set_new(progress, "contributions_dropped",
                      json_integer(st->dropped[fragment]));
  json_object_set_new(progress, "fragment_replanned",
                      json_boolean(st->dropped[fragment] > 0));
}

pcp_status_t pcp_diloco_stream_run(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  stream_t st;
  memset(&st, 0, sizeof(st));
  st.job = job;
  st.schedule.fragments = (uint32_t)job->config.streaming.num_fragments;
  st.schedule.inner_steps = (uint32_t)job->config.streaming.inner_steps;
  st.schedule.overlap_tau = (uint32_t)job->config.streaming.overlap_tau;
  st.schedule.max_rounds = (uint32_t)job->config.max_epochs;
  st.alpha = (float)job->config.streaming.alpha;
  st.bf16 = job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16;
  st.bf16_params = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (st.schedule.fragments > MAX_FRAGMENTS ||
      st.schedule.fragments > job->table.count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'streaming.num_fragments': %u fragments for "
                           "%zu tensors (at most %d, one tensor each)",
                           st.schedule.fragments, job->table.count,
                           MAX_FRAGMENTS);
  }
  if (st.schedule.overlap_tau < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'streaming.overlap_tau': the service needs "
                           "at least 1 (a receive after its send)");
  }
  // The loop's state: fresh, or the resumed checkpoint's (checked against
  // the job, its worker state file read and verified).
  stream_loop_t loop;
  memset(&loop, 0, sizeof(loop));
  float* resume_state = NULL;
  uint32_t resume_workers = 0;
  if (job->stream_resume) {
    PCP_RETURN_IF_ERROR_BARE(
        stream_resume_load(&st, &loop, &resume_state, &resume_workers));
  }
  st.sync_total = (uint64_t)st.schedule.fragments * st.schedule.max_rounds;
  st.names =
      pcp_diloco_job_calloc(job, 4 * job->table.count, sizeof(*st.names));
  st.zeros =
      pcp_diloco_job_calloc(job, job->parameter_count + 1, sizeof(float));
  if (!st.names || !st.zeros) {
    pcp_diloco_job_free(job, st.names);
    pcp_diloco_job_free(job, st.zeros);
    pcp_allocator_free(pcp_allocator_system(), resume_state);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "streaming state");
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    snprintf(st.names[4 * i + 0], 24, "p%u", (unsigned)i);
    snprintf(st.names[4 * i + 1], 24, "m%u", (unsigned)i);
    snprintf(st.names[4 * i + 2], 24, "v%u", (unsigned)i);
    snprintf(st.names[4 * i + 3], 24, "s%u", (unsigned)i);
  }
  pcp_status_t status = pcp_ok_status();
  // The workers: those connected at the start, of the first worker's kind
  // (one program set); the run waits for one. A resume waits up to
  // WORKER_GRACE_MS for the checkpoint's worker count of its kind, then
  // goes on with those there (the others' state is dropped, as a worker
  // lost mid-run).
  pcp_fabric_worker_info_t* infos =
      pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS, sizeof(*infos));
  int64_t wait_start = pcp_clock_now_ns(o->clock);
  // Session ids of this run only: a restarted gateway's must not meet what
  // a worker may still hold of the dead one's.
  uint64_t nonce = (uint64_t)pcp_clock_now_ns(o->clock) & 0xffffffffffull;
  st.nonce = nonce;
  st.infos = infos;
  st.joined = json_array();
  st.left = json_array();
  if (!infos || !st.joined || !st.left) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  while (!status && !st.worker_count) {
    if (pcp_diloco_job_should_stop(job)) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at outer step %" PRIu64,
                               job->outer_step);
      break;
    }
    uint32_t count = infos ? pcp_fabric_worker_list(o->fabric, infos,
                                                    MAX_ROUND_WORKERS, NULL)
                           : 0;
    uint32_t matching = 0;
    // Only the job's worker class (every worker when it names none).
    const char* worker_class = job->config.worker_class;
    for (uint32_t i = 0; i < count; ++i) {
      if (infos[i].state != PCP_FABRIC_WORKER_CONNECTED ||
          (worker_class && strcmp(infos[i].worker_class, worker_class))) {
        continue;
      }
      if (!st.backend[0]) {
        snprintf(st.backend, sizeof(st.backend), "%s", infos[i].backend);
        snprintf(st.target, sizeof(st.target), "%s", infos[i].target);
      }
      // A fresh start takes every kind (programs per kind); a resume the
      // checkpoint's.
      matching += !resume_workers || (!strcmp(infos[i].backend, st.backend) &&
                                      !strcmp(infos[i].target, st.target));
    }
    uint32_t seen = matching;
    bool graced =
        (pcp_clock_now_ns(o->clock) - wait_start) / 1000000 >= WORKER_GRACE_MS;
    if (resume_workers && matching < resume_workers && !graced) {
      matching = 0;  // wait for the rest
    }
    if (resume_workers && matching > resume_workers) {
      matching = resume_workers;
    }
    for (uint32_t i = 0; i < count && st.worker_count < matching; ++i) {
      if (infos[i].state != PCP_FABRIC_WORKER_CONNECTED ||
          (resume_workers && (strcmp(infos[i].backend, st.backend) ||
                              strcmp(infos[i].target, st.target))) ||
          (worker_class && strcmp(infos[i].worker_class, worker_class))) {
        continue;
      }
      uint32_t kind = 0;
      status = stream_kind_find(&st, infos[i].backend, infos[i].target, &kind);
      if (status) {
        break;
      }
      stream_worker_t* w = &st.workers[st.worker_count++];
      snprintf(w->worker_id, sizeof(w->worker_id), "%s", infos[i].worker_id);
      snprintf(w->session, sizeof(w->session), "%s-stream-%u-%" PRIx64,
               o->job_id, st.worker_count - 1, nonce);
      w->shard = st.worker_count - 1;
      w->kind = kind;
      w->join_count = infos[i].join_count;
      w->alive = true;
      w->fresh = true;
      st.joins = st.worker_count;
    }
    if (!st.worker_count) {
      // Until one more worker of the kind joins (a fabric event), for at
      // most NOBODY_WAIT_MS; the loop then looks at the stop hook (once per
      // pass, as before). With a waker a stop ends the wait at once (the
      // training kind's cancel wakes the fabric's waits).
      pcp_fabric_endpoint_t* fabric = o->fabric;
      pcp_status_t waited = pcp_fabric_workers_wait_class(
          fabric, st.backend[0] ? st.backend : NULL,
          st.backend[0] ? st.target : NULL, worker_class, seen + 1,
          pcp_fabric_endpoint_now_ns(fabric) +
              (int64_t)NOBODY_WAIT_MS * 1000000,
          job->waker ? pcp_diloco_job_stop_fn : NULL, job->waker ? job : NULL,
          NULL);
      if (pcp_status_code(waited) == PCP_STATUS_FAILED_PRECONDITION) {
        status = waited;  // the fabric is going away
      } else {
        pcp_status_ignore(waited);
      }
    }
  }
  if (!status && resume_workers && st.worker_count < resume_workers) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "resuming with %u of the checkpoint's %u streaming workers",
            st.worker_count, resume_workers);
  }
  if (!status && !resume_workers) {
    st.shard_count = st.worker_count;
  }
  // Samplers: shard k of the plan over the train split (at plan_step: 0, or
  // the re-shard's step); a resume rebuilds the checkpoint's plan and
  // continues each worker's cursor.
  if (!status) {
    pcp_data_assignment_t* plan = NULL;
    status = stream_plan(&st, &plan);
    for (uint32_t k = 0; k < st.worker_count && !status; ++k) {
      stream_worker_t* w = &st.workers[k];
      json_t* saved =
          resume_workers
              ? json_array_get(json_object_get(job->stream_resume, "workers"),
                               k)
              : NULL;
      if (saved) {
        w->shard =
            (uint32_t)json_integer_value(json_object_get(saved, "shard"));
        json_t* loss = json_object_get(saved, "loss");
        w->last_loss =
            json_is_number(loss) ? (float)json_number_value(loss) : NAN;
      }
      status = stream_worker_data(
          &st, plan, w,
          saved ? json_string_value(json_object_get(saved, "sampler")) : NULL);
    }
    pcp_diloco_job_free(job, plan);
  }
  const pcp_diloco_job_hooks_t* hooks = &o->hooks;
  if (!status && hooks->phase) {
    status = hooks->phase(hooks->user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  bool stopped = false;
  for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped; ++p) {
    if (!resume_state) {
      status = stream_init_call(&st, p, &stopped);
      continue;
    }
    for (int kind = 0; kind < 4 && !status && !stopped; ++kind) {
      status = stream_copy_call(&st, p, kind, true, resume_state, &stopped);
    }
  }
  // Goodput: a fresh state is made before step loop.step + 1; a resumed
  // one holds every step since its fragments' last @mix before the
  // checkpoint (the schedule's last receive at or before it).
  for (uint32_t p = 0; p < st.schedule.fragments; ++p) {
    st.mixed_step[p] = 1;
    for (uint64_t t = loop.step; resume_state && t >= 1; --t) {
      uint32_t round = 0;
      if (pcp_streaming_diloco_receives_at(&st.schedule, p, t, &round)) {
        st.mixed_step[p] = t;
        break;
      }
    }
  }
  for (uint32_t k = 0; k < st.worker_count; ++k) {
    st.workers[k].joined_step = resume_state ? 1 : loop.step + 1;
  }
  pcp_allocator_free(pcp_allocator_system(), resume_state);
  for (uint32_t k = 0; k < st.worker_count; ++k) {
    stream_worker_t* w = &st.workers[k];
    if (w->alive) {
      w->in_round = st.schedule.fragments >= 64
                        ? ~(uint64_t)0
                        : ((uint64_t)1 << st.schedule.fragments) - 1;
    }
    w->fresh = false;
  }
  if (!status && resume_workers) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "streaming resumed at step %" PRIu64 " sync %" PRIu64
            " on %u workers",
            loop.step + 1, st.syncs, st.worker_count);
  }
  uint64_t max_steps = pcp_streaming_diloco_max_steps(&st.schedule);
  // Per fragment: the send of the round in flight (its deltas' bytes and
  // senders, in loop), completed by its receive tau steps later, where the
  // sync's event is written (deltas up + masters down of the same round).
  int64_t pending_start[MAX_FRAGMENTS];
  for (uint32_t p = 0; p < MAX_FRAGMENTS; ++p) {
    pending_start[p] = pcp_clock_now_ns(o->clock);
  }
  // tokens_per_second: local steps and wall time since the previous event.
  int64_t last_event_ns = pcp_clock_now_ns(o->clock);
  uint64_t checkpointed = st.syncs;  // syncs at the last checkpoint
  // Measured bytes per sync: the fabric's counters from one sync's event
  // to the next (local steps, sends and the receive between them).
  pcp_diloco_job_bytes_mark(job);
  uint64_t every = job->config.checkpoint_every > 0
                       ? (uint64_t)job->config.checkpoint_every
                       : 0;
  for (uint64_t t = loop.step + 1; t <= max_steps && !status && !stopped; ++t) {
    st.step = t;
    // Joins (new workers, lost ones back) take part from this step on.
    status = stream_join(&st, t, &stopped);
    if (status || stopped) {
      break;
    }
    if (!stream_alive(&st)) {
      status = pcp_make_status(
          PCP_STATUS_ABORTED,
          "every streaming worker was lost by step %" PRIu64, t);
      break;
    }
    if (pcp_diloco_job_should_stop(job)) {
      stopped = true;
      break;
    }
    for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped;
         ++p) {
      uint32_t round = 0;
      if (!pcp_streaming_diloco_receives_at(&st.schedule, p, t, &round)) {
        continue;
      }
      uint64_t down = 0;
      status = stream_fragment_call(&st, p, true, false, &stopped, &down);
      if (status || stopped) {
        break;
      }
      if (o->metrics) {
        pcp_obs_family_add(o->metrics->wire_bytes,
                           (const char*[]){"parameters"}, (double)down);
      }
      uint64_t sync_bytes = loop.pending_up[p] + down;
      job->wire_bytes += sync_bytes;
      ++st.syncs;
      job->outer_step = st.syncs;
      double loss = 0;
      uint32_t alive = 0;
      for (uint32_t k = 0; k < st.worker_count; ++k) {
        if (st.workers[k].alive) {
          loss += st.workers[k].last_loss;
          ++alive;
        }
      }
      job->last_loss = alive ? loss / alive : NAN;
      job->last_loss_mean = job->last_loss;
      double seconds =
          (double)(pcp_clock_now_ns(o->clock) - pending_start[p]) / 1e9;
      round_outcome_t outcome = {.reporters = loop.pending_senders[p],
                                 .parameter_bytes = sync_bytes};
      int64_t now = pcp_clock_now_ns(o->clock);
      double window = (double)(now - last_event_ns) / 1e9;
      double tokens_per_second =
          window > 0 ? (double)alive * (double)job->spec.batch *
                           (double)job->spec.block_size *
                           (double)(t - 1 - loop.last_event_step) / window
                     : 0;
      last_event_ns = now;
      loop.last_event_step = t - 1;
      // Evaluation every eval_every syncs and at the last, on the first
      // live worker.
      bool evaluated = false;
      if (pcp_diloco_job_eval_due(job, st.syncs, st.syncs >= st.sync_total)) {
        const stream_worker_t* evaluator = NULL;
        for (uint32_t k = 0; k < st.worker_count && !evaluator; ++k) {
          evaluator = st.workers[k].alive ? &st.workers[k] : NULL;
        }
        status = evaluator ? pcp_diloco_job_evaluate(
                                 job, evaluator->worker_id,
                                 st.kinds[evaluator->kind].backend,
                                 st.kinds[evaluator->kind].target)
                           : pcp_ok_status();
        if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
          pcp_status_ignore(status);
          status = pcp_ok_status();
          stopped = true;
          break;
        }
        if (status) {
          break;
        }
        evaluated = job->val_loss_step == job->outer_step;
      }
      if (o->metrics && o->metrics->learning_rate) {
        const char* job_label[] = {o->job_id};
        pcp_obs_family_set(o->metrics->learning_rate, job_label, job->last_lr);
      }
      json_t* progress = pcp_diloco_job_progress_json(job, &outcome, seconds,
                                                      tokens_per_second);
      if (progress) {
        json_object_set_new(progress, "outer_loop_steps",
                            json_integer((json_int_t)st.sync_total));
        json_object_set_new(progress, "fragment", json_integer(p));
        json_object_set_new(progress, "fragment_round", json_integer(round));
        json_object_set_new(progress, "local_step",
                            json_integer((json_int_t)t));
        json_object_set_new(progress, "workers_received", json_integer(alive));
        json_object_set_new(progress, "streaming", json_true());
        json_object_set_new(progress, "evaluated", json_boolean(evaluated));
        stream_progress_elastic(&st, p, progress);
        pcp_diloco_job_bytes_stop(job);
        json_t* bytes = pcp_diloco_job_bytes_json(job);
        if (bytes) {
          json_object_set_new(progress, "bytes", bytes);
        }
        json_t* totals = pcp_diloco_job_bytes_total_json(job);
        if (totals) {
          json_object_set_new(progress, "bytes_total", totals);
        }
        pcp_diloco_job_bytes_mark(job);
        pcp_diloco_param_hash_json(job, progress);
        pcp_diloco_job_goodput_json(job, progress);
        pcp_status_ignore(pcp_store_job_event_append(
            o->store, o->job_id, "training.step", progress, NULL));
      }
      pcp_diloco_job_progress_report(job, progress);
      json_decref(progress);
      if (o->metrics) {
        const char* job_label[] = {o->job_id};
        pcp_obs_family_observe(o->metrics->outer_step_seconds, NULL, seconds);
        pcp_obs_family_set(o->metrics->loss, job_label, job->last_loss);
        pcp_obs_family_add(o->metrics->outer_steps, NULL, 1);
      }
      PCP_LOG(PCP_LOG_INFO, &job->log,
              "streaming sync=%" PRIu64 "/%" PRIu64
              " fragment=%u round=%u step=%" PRIu64
              " loss=%.4f workers=%u wire_bytes=%" PRIu64 " dropped=%u",
              st.syncs, st.sync_total, p, round, t, job->last_loss, alive,
              sync_bytes, st.dropped[p]);
      st.dropped[p] = 0;
      json_array_clear(st.joined);
      json_array_clear(st.left);
    }
    if (!status && !stopped) {
      status = stream_compute(&st, t, &stopped);
    }
    for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped;
         ++p) {
      if (!pcp_streaming_diloco_sends_at(&st.schedule, p, t, NULL)) {
        continue;
      }
      loop.pending_senders[p] = stream_alive(&st);
      pending_start[p] = pcp_clock_now_ns(o->clock);
      uint64_t up = 0;
      status = stream_fragment_call(&st, p, false, false, &stopped, &up);
      loop.pending_up[p] = up;
      if (o->metrics) {
        pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"deltas"},
                           (double)up);
      }
    }
    loop.step = t;
    // Every checkpoint_every syncs, at this step boundary (the end-of-run
    // one follows the loop).
    if (!status && !stopped && every && t < max_steps &&
        st.syncs / every > checkpointed / every) {
      status = stream_checkpoint(&st, &loop, &stopped);
      checkpointed = st.syncs;
    }
  }
  if (!status && stopped) {
    status = pcp_make_status(PCP_STATUS_CANCELLED,
                             "training stopped at sync %" PRIu64, st.syncs);
  }
  if (!status) {
    status = stream_checkpoint(&st, &loop, &stopped);
    if (!status && stopped) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at its last checkpoint");
    }
  }
  for (uint32_t k = 0; k < st.worker_count; ++k) {
    pcp_fabric_task_release(st.workers[k].task);
    pcp_data_sampler_release(st.workers[k].sampler);
    pcp_diloco_job_free(job, st.workers[k].tokens);
    pcp_diloco_job_free(job, st.workers[k].tokens64);
  }
  pcp_diloco_job_free(job, st.names);
  pcp_diloco_job_free(job, st.zeros);
  pcp_diloco_job_free(job, st.infos);
  json_decref(st.joined);
  json_decref(st.left);
  return status;
}
