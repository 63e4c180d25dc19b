// SPDX-License-Identifier: Apache-2.0
//
// The synchronous data-parallel baseline in the training service (issue 17
// Deliver 4), selected by `"aggregation_strategy": "ddp"`: what DiLoCo's
// modes are measured against (bench/diloco_comm, bench/slow_link). At every
// inner step each worker computes the gradient of its own batch, the
// gateway averages the gradients (f32, pcp_diloco_gradient_average) and
// every worker applies the same averaged gradient with the same AdamW step,
// so all hold bit-identical parameters.
//
// What moves per worker and inner step: its batch (ids and targets) and
// nothing else down with @compute_gradients, whose outputs are the loss and
// the gradient (4 P bytes up); the averaged gradient (4 P down) with
// @apply_optimizer. Parameters and AdamW moments stay resident in one
// fabric session per worker (p<i>, m<i>, v<i>), put there once by @init of a
// small state module emitted here (@init, @read, @hash). Programs: the
// model's `pcp compile --program train` (@compute_gradients, or
// @compute_gradients_accumulated with effective_batch_size, and
// @apply_optimizer, as src/workloads/rl/trainer.c runs them).
//
// Every tau inner steps one "outer step" is reported, so history and events
// have classic DiLoCo's shape and equal tokens compare directly: losses, lr,
// tokens, the bytes measured by the fabric's counters over those tau steps,
// and the parameter hashes (@hash with TASK_ASSIGN hash_inputs: every worker
// returns the SHA-256 of its resident parameters, 32 bytes, no tensor).
//
// The gateway keeps no running copy of the parameters: it would have to
// repeat AdamW on the host and match IREE's compiled arithmetic bit for bit,
// and keep m and v too (12 P bytes, and 3 P reads and writes per step).
// Instead the masters (job->parameters) are pulled from the reference
// worker (ddp_hash_check's) with @read only when something needs
// them: an evaluation, a checkpoint, the export. That costs 4 P bytes from
// one worker every eval_every or checkpoint_every outer steps and is left
// out of the measured step (as classic's evaluation is); the pulled bytes
// are checked against that worker's hash.
//
// Workers: those connected at the start (at least one; the job waits for
// one). A worker whose task fails (lost, or an error) is dropped for good:
// its resident state missed a step. The step goes on with the gradients of
// the others (a gradient phase that lost a worker averages the rest; an
// optimizer phase that lost one leaves the others consistent), and the job
// fails only when none is left. A worker that joins mid-run is not used
// (docs/training.md says so): adding one would need a copy of p, m and v.
// Checkpoints hold the parameters only; a resumed ddp job starts its AdamW
// moments fresh (documented).

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/train/service_impl.h"

typedef struct ddp_worker_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[PCP_STORE_ID_MAX_LENGTH + 48];
  bool alive;
  pcp_data_sampler_t* sampler;
  int32_t* tokens;  // ids then targets, A x B x T each
  int64_t* tokens64;
  pcp_fabric_task_t* task;
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
  bool hashed;
} ddp_worker_t;

typedef struct ddp_t {
  job_t* job;
  ddp_worker_t workers[MAX_ROUND_WORKERS];
  uint32_t count;
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint8_t train_hash[PCP_SHA256_BYTE_LENGTH];
  uint8_t state_hash[PCP_SHA256_BYTE_LENGTH];
  char (*names)[24];  // p<i>, m<i>, v<i> per tensor
  pcp_proto_tensor_ref_t* refs;
  pcp_proto_keep_resident_t* keep;
  pcp_proto_section_t* sections;
  const float** inputs;  // the workers' gradients of one tensor
  float* grad;           // the averaged gradient (parameter vector)
  float step_value;      // AdamW's step (1-based), borrowed by tasks
  float lr;
  uint64_t adam_step;  // completed AdamW steps in this run
  // The last inner step's duration (0: none yet); the phases' waits scale
  // with it, not with the reported step of tau inner steps.
  int64_t inner_step_ns;
  size_t rows;  // token ids per batch (A x B x T)
} ddp_t;

static const char* ddp_name(const ddp_t* d, char kind, size_t tensor) {
  return d->names[3 * tensor + (kind == 'p' ? 0 : kind == 'm' ? 1 : 2)];
}

static uint32_t ddp_alive(const ddp_t* d) {
  uint32_t alive = 0;
  for (uint32_t k = 0; k < d->count; ++k) {
    alive += d->workers[k].alive;
  }
  return alive;
}

static void ddp_drop(ddp_t* d, ddp_worker_t* w, const char* what,
                     const char* why) {
  job_t* job = d->job;
  w->alive = false;
  if (job->options->metrics) {
    pcp_obs_family_add(job->options->metrics->lost_tasks, NULL, 1);
  }
  PCP_LOG(PCP_LOG_WARN, &job->log,
          "ddp: worker %s dropped at inner step %" PRIu64 " (%s): %s",
          w->worker_id, job->outer_step * (uint64_t)job->config.tau, what, why);
}

//===----------------------------------------------------------------------===//
// The state module (@init, @read, @hash)
//===----------------------------------------------------------------------===//

static void ddp_type(const pcp_models_parameter_t* p, char* out,
                     size_t capacity) {
  int used = snprintf(out, capacity, "tensor<");
  for (int32_t r = 0; r < p->rank && used > 0 && (size_t)used < capacity; ++r) {
    used += snprintf(out + used, capacity - (size_t)used, "%lldx",
                     (long long)p->dims[r]);
  }
  if (used > 0 && (size_t)used < capacity) {
    snprintf(out + used, capacity - (size_t)used, "f32>");
  }
}

// "%<prefix><i>: T, ..." (|args|) or "T, ..." over every tensor, |groups|
// times.
static pcp_status_t ddp_list(pcp_string_builder_t* b,
                             const pcp_models_parameter_table_t* table,
                             const char* const* prefix, int groups, bool args,
                             bool types) {
  char t[160];
  bool first = true;
  for (int g = 0; g < groups; ++g) {
    for (size_t i = 0; i < table->count; ++i) {
      ddp_type(&table->parameters[i], t, sizeof(t));
      const char* sep = first ? "" : ", ";
      first = false;
      pcp_status_t status;
      if (args) {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu: %s", sep, prefix[g],
                                             i, t);
      } else if (types) {
        status = pcp_string_builder_append_f(b, "%s%s", sep, t);
      } else {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu", sep, prefix[g], i);
      }
      PCP_RETURN_IF_ERROR_BARE(status);
    }
  }
  return pcp_ok_status();
}

// @init(p...) -> (p..., m = 0..., v = 0...): the resident state of a worker;
// @read(p...) -> (p...): the parameters back; @hash(p...) -> f32 0: nothing
// back but the hash_inputs SHA-256 the worker appends.
static pcp_status_t ddp_state_module_emit(
    const pcp_models_parameter_table_t* table, pcp_string_builder_t* b) {
  static const char* const p1[] = {"p"};
  static const char* const pzz[] = {"p", "z", "z"};
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b, "module @ddp_state {\n  func.func @init("));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, true, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, pzz, 3, false, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") {\n"));
  char t[160];
  for (size_t i = 0; i < table->count; ++i) {
    ddp_type(&table->parameters[i], t, sizeof(t));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%z%zu = stablehlo.constant dense<0.000000e+00> : %s\n", i, t));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "    return "));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, pzz, 3, false, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, pzz, 3, false, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "\n  }\n  func.func @read("));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, true, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, false, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") {\n"));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "    return "));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, false, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, false, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "\n  }\n  func.func @hash("));
  PCP_RETURN_IF_ERROR_BARE(ddp_list(b, table, p1, 1, true, false));
  return pcp_string_builder_append_cstring(
      b,
      ") -> tensor<f32> {\n"
      "    %c = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n"
      "    return %c : tensor<f32>\n  }\n}\n");
}

static pcp_status_t ddp_programs(ddp_t* d) {
  job_t* job = d->job;
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_job_child_compile(job, model, job->model_hash, "train", 1,
                                   d->backend, d->target, d->train_hash));
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20, &b);
  pcp_status_t status = ddp_state_module_emit(&job->table, &b);
  if (!status) {
    status =
        pcp_diloco_job_module_compile(job, "ddp-state.mlir", b.data, b.size,
                                      d->backend, d->target, d->state_hash);
  }
  pcp_string_builder_deinitialize(&b);
  return status;
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

// Submits one task to |w|'s session (one attempt: a re-run elsewhere would
// find no resident state). A submit failure drops the worker.
static void ddp_submit(ddp_t* d, ddp_worker_t* w, const uint8_t* program,
                       const char* function, const pcp_proto_section_t* inputs,
                       uint32_t input_count, uint32_t ref_count,
                       uint32_t keep_count, uint32_t hash_inputs) {
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, program, sizeof(params.program));
  params.function = function;
  params.inputs = inputs;
  params.input_count = input_count;
  params.input_refs = ref_count ? d->refs : NULL;
  params.input_ref_count = ref_count;
  params.keep_resident = keep_count ? d->keep : NULL;
  params.keep_resident_count = keep_count;
  params.hash_inputs = hash_inputs;
  params.worker_id = w->worker_id;
  params.session_id = w->session;
  params.max_attempts = 1;
  pcp_status_t status = pcp_diloco_job_task_submit(d->job, &params, &w->task);
  if (status) {
    ddp_drop(d, w, function, pcp_status_message(status));
    pcp_status_ignore(status);
    w->task = NULL;
  }
}

int64_t pcp_diloco_ddp_phase_timeout_ms(int64_t inner_step_ns) {
  if (inner_step_ns <= 0) {
    return SHORT_WAIT_MIN_MS;
  }
  int64_t scaled = inner_step_ns / 1000000 * WAIT_STEP_MULTIPLE;
  return scaled > DDP_PHASE_WAIT_MIN_MS ? scaled : DDP_PHASE_WAIT_MIN_MS;
}

// Waits for every worker's task; true when stopped. Tasks stay held (their
// outputs are read after) until ddp_release. A worker hung behind a link
// the fabric has not declared lost yet holds a phase up for
// pcp_diloco_ddp_phase_timeout_ms, then is dropped.
static bool ddp_wait(ddp_t* d, const char* what) {
  pcp_fabric_task_t* tasks[MAX_ROUND_WORKERS];
  for (uint32_t k = 0; k < d->count; ++k) {
    tasks[k] = d->workers[k].task;
  }
  return pcp_diloco_job_tasks_wait(
      d->job, tasks, d->count,
      pcp_diloco_ddp_phase_timeout_ms(d->inner_step_ns), what);
}

static void ddp_release(ddp_t* d) {
  for (uint32_t k = 0; k < d->count; ++k) {
    pcp_fabric_task_release(d->workers[k].task);
    d->workers[k].task = NULL;
  }
}

// |w|'s outputs when its task succeeded with |want| of them; else drops it
// (NULL).
static const pcp_proto_section_t* ddp_outputs(ddp_t* d, ddp_worker_t* w,
                                              const char* what, size_t want) {
  if (!w->task) {
    return NULL;
  }
  pcp_status_t task_status = pcp_fabric_task_status(w->task);
  if (task_status) {
    ddp_drop(d, w, what, pcp_status_message(task_status));
    return NULL;
  }
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  pcp_status_t status = pcp_fabric_task_outputs(w->task, &outputs, &count);
  if (status) {
    ddp_drop(d, w, what, pcp_status_message(status));
    pcp_status_ignore(status);
    return NULL;
  }
  if (count != want) {
    char why[96];
    snprintf(why, sizeof(why), "%zu outputs, expected %zu", count, want);
    ddp_drop(d, w, what, why);
    return NULL;
  }
  return outputs;
}

static void ddp_tensor_section(const job_t* job, size_t i, const float* data,
                               pcp_proto_section_t* s) {
  const pcp_models_parameter_t* p = &job->table.parameters[i];
  memset(s, 0, sizeof(*s));
  s->name = p->name;
  s->element_type = PCP_ELEMENT_TYPE_F32;
  s->rank = (uint32_t)p->rank;
  for (int32_t r = 0; r < p->rank; ++r) {
    s->shape[r] = p->dims[r];
  }
  s->byte_length = (uint64_t)p->element_count * sizeof(float);
  s->data = data;
}

static pcp_status_t ddp_stopped(const job_t* job) {
  return pcp_make_status(PCP_STATUS_CANCELLED,
                         "training stopped at outer step %" PRIu64,
                         job->outer_step);
}

static pcp_status_t ddp_none_left(const job_t* job, const char* what) {
  return pcp_make_status(PCP_STATUS_ABORTED,
                         "ddp: every worker was lost (%s, inner step %" PRIu64
                         ")",
                         what, job->outer_step * (uint64_t)job->config.tau);
}

// Every worker's resident state from the masters: p = the masters, m = v =
// 0 (@init; the n tensors go down once).
static pcp_status_t ddp_init(ddp_t* d) {
  job_t* job = d->job;
  size_t n = job->table.count;
  for (size_t i = 0; i < n; ++i) {
    ddp_tensor_section(job, i,
                       job->parameters + pcp_diloco_job_tensor_offset(job, i),
                       &d->sections[i]);
  }
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      d->keep[g * n + i] = (pcp_proto_keep_resident_t){
          .output = (uint32_t)(g * n + i), .as = ddp_name(d, "pmv"[g], i)};
    }
  }
  for (uint32_t k = 0; k < d->count; ++k) {
    ddp_submit(d, &d->workers[k], d->state_hash, "init", d->sections,
               (uint32_t)n, 0, (uint32_t)(3 * n), 0);
  }
  bool stopped = ddp_wait(d, "ddp state upload");
  for (uint32_t k = 0; k < d->count && !stopped; ++k) {
    // Kept outputs come back as names, no data.
    (void)ddp_outputs(d, &d->workers[k], "init", 3 * n);
  }
  ddp_release(d);
  if (stopped) {
    return ddp_stopped(job);
  }
  return ddp_alive(d) ? pcp_ok_status() : ddp_none_left(job, "state upload");
}

// Phase 1 of an inner step: every live worker's gradient of its batch.
// Outputs (loss, grads...) stay held in the tasks until ddp_release.
static void ddp_gradients_submit(ddp_t* d) {
  job_t* job = d->job;
  size_t n = job->table.count;
  size_t A = (size_t)job->accumulation;
  size_t BT = (size_t)(job->spec.batch * job->spec.block_size);
  size_t id_size = pcp_element_type_byte_size(job->data_type);
  bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
  for (size_t i = 0; i < n; ++i) {
    d->refs[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                          .name = ddp_name(d, 'p', i)};
  }
  for (uint32_t j = 0; j < 2; ++j) {
    d->refs[n + j] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = j};
  }
  for (uint32_t k = 0; k < d->count; ++k) {
    ddp_worker_t* w = &d->workers[k];
    if (!w->alive) {
      continue;
    }
    for (size_t a = 0; a < A; ++a) {
      pcp_data_sampler_next(w->sampler, w->tokens + a * BT,
                            w->tokens + d->rows + a * BT, NULL);
    }
    if (wide) {
      for (size_t e = 0; e < 2 * d->rows; ++e) {
        w->tokens64[e] = w->tokens[e];
      }
    }
    pcp_proto_section_t sections[2];
    for (int j = 0; j < 2; ++j) {
      pcp_proto_section_t* s = &sections[j];
      *s = (pcp_proto_section_t){
          .name = j ? "targets" : "input_ids",
          .element_type = job->data_type,
          .byte_length = (uint64_t)(d->rows * id_size),
          .data = wide ? (const void*)(w->tokens64 + (size_t)j * d->rows)
                       : (const void*)(w->tokens + (size_t)j * d->rows)};
      uint32_t r = 0;
      if (A > 1) {
        s->shape[r++] = (int64_t)A;
      }
      s->shape[r++] = job->spec.batch;
      s->shape[r++] = job->spec.block_size;
      s->rank = r;
    }
    // The sections' array is copied at submit; the token data is borrowed
    // from the worker's buffers until the task ends.
    ddp_submit(d, w, d->train_hash,
               A > 1 ? "compute_gradients_accumulated" : "compute_gradients",
               sections, 2, (uint32_t)(n + 2), 0, 0);
  }
}

// <job dir>/ddp_first_batches.npy: the batches of a fresh run's first inner
// step, int32 [W, 2, A x B, T] (per worker in id order: ids, then targets),
// so the first averaged step can be recomputed outside PCP (tests/
// integration/training_ddp_test.py). Written once; a failure is logged.
static void ddp_first_batches_save(ddp_t* d) {
  job_t* job = d->job;
  uint32_t live = ddp_alive(d);
  size_t per_worker = 2 * d->rows;
  int32_t* all = pcp_diloco_job_calloc(job, (size_t)live * per_worker + 1,
                                       sizeof(int32_t));
  pcp_status_t status = pcp_ok_status();
  if (!all) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "first batches");
  } else {
    uint32_t at = 0;
    for (uint32_t k = 0; k < d->count; ++k) {
      if (d->workers[k].alive) {
        memcpy(all + (size_t)at++ * per_worker, d->workers[k].tokens,
               per_worker * sizeof(int32_t));
      }
    }
    int64_t shape[4] = {live, 2, job->accumulation * job->spec.batch,
                        job->spec.block_size};
    status = pcp_diloco_job_npy_i32_write(job, "ddp_first_batches.npy", shape,
                                          4, all);
  }
  pcp_diloco_job_free(job, all);
  if (status) {
    PCP_LOG(PCP_LOG_WARN, &job->log, "ddp: first batches not saved: %s",
            pcp_status_message(status));
    pcp_status_ignore(status);
  }
}

// Averages the gradients of the workers whose task succeeded into d->grad
// (in worker order); their mean loss out. Drops the others.
static pcp_status_t ddp_gradients_average(ddp_t* d, uint32_t* out_reporters,
                                          double* out_loss) {
  job_t* job = d->job;
  size_t n = job->table.count;
  const pcp_proto_section_t* outs[MAX_ROUND_WORKERS];
  uint32_t reporters = 0;
  double loss = 0;
  for (uint32_t k = 0; k < d->count; ++k) {
    ddp_worker_t* w = &d->workers[k];
    const pcp_proto_section_t* o = ddp_outputs(d, w, "gradients", n + 1);
    if (!o) {
      continue;
    }
    bool sizes_ok = o[0].byte_length == sizeof(float);
    for (size_t i = 0; i < n && sizes_ok; ++i) {
      sizes_ok = o[1 + i].element_type == PCP_ELEMENT_TYPE_F32 &&
                 o[1 + i].byte_length ==
                     (uint64_t)job->table.parameters[i].element_count * 4;
    }
    if (!sizes_ok) {
      ddp_drop(d, w, "gradients", "an output of the wrong size");
      continue;
    }
    loss += *(const float*)o[0].data;
    outs[reporters++] = o;
  }
  *out_reporters = reporters;
  *out_loss = reporters ? loss / reporters : NAN;
  if (!reporters) {
    return ddp_none_left(job, "gradients");
  }
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t r = 0; r < reporters; ++r) {
      // Sections are 64-byte aligned in the received frame.
      d->inputs[r] = outs[r][1 + i].data;
    }
    pcp_status_t status = pcp_diloco_gradient_average(
        d->inputs, reporters, (size_t)job->table.parameters[i].element_count,
        d->grad + pcp_diloco_job_tensor_offset(job, i));
    if (status) {
      return pcp_status_annotate_f(status, "tensor %s",
                                   job->table.parameters[i].name);
    }
  }
  return pcp_ok_status();
}

// Phase 2: the averaged gradient down to every live worker, which applies
// AdamW to its resident state (p, m, v kept under the same names).
static void ddp_optimizer_submit(ddp_t* d) {
  job_t* job = d->job;
  size_t n = job->table.count;
  for (size_t i = 0; i < n; ++i) {
    ddp_tensor_section(job, i, d->grad + pcp_diloco_job_tensor_offset(job, i),
                       &d->sections[i]);
  }
  d->sections[n] = (pcp_proto_section_t){.name = "step",
                                         .element_type = PCP_ELEMENT_TYPE_F32,
                                         .byte_length = sizeof(float),
                                         .data = &d->step_value};
  d->sections[n + 1] =
      (pcp_proto_section_t){.name = "lr",
                            .element_type = PCP_ELEMENT_TYPE_F32,
                            .byte_length = sizeof(float),
                            .data = &d->lr};
  // (p..., g..., m..., v..., step, lr) -> (p', m', v').
  for (size_t i = 0; i < n; ++i) {
    d->refs[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                          .name = ddp_name(d, 'p', i)};
    d->refs[n + i] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (uint32_t)i};
    d->refs[2 * n + i] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = ddp_name(d, 'm', i)};
    d->refs[3 * n + i] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = ddp_name(d, 'v', i)};
  }
  for (uint32_t j = 0; j < 2; ++j) {
    d->refs[4 * n + j] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (uint32_t)n + j};
  }
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      d->keep[g * n + i] = (pcp_proto_keep_resident_t){
          .output = (uint32_t)(g * n + i), .as = ddp_name(d, "pmv"[g], i)};
    }
  }
  for (uint32_t k = 0; k < d->count; ++k) {
    if (d->workers[k].alive) {
      ddp_submit(d, &d->workers[k], d->train_hash, "apply_optimizer",
                 d->sections, (uint32_t)(n + 2), (uint32_t)(4 * n + 2),
                 (uint32_t)(3 * n), 0);
    }
  }
}

// One inner step over the live workers. *out_stopped on stop.
static pcp_status_t ddp_inner_step(ddp_t* d, uint32_t* out_reporters,
                                   double* out_loss, bool* out_stopped) {
  job_t* job = d->job;
  size_t n = job->table.count;
  uint64_t global_step = job->outer_step * (uint64_t)job->config.tau +
                         (d->adam_step % (uint64_t)job->config.tau);
  int64_t start = pcp_clock_now_ns(job->options->clock);
  // Goodput (docs/training.md "Goodput"): every worker given a batch
  // computes its tokens (counted as assigned, as classic counts a lost
  // task); the tokens of the gradients averaged and applied are merged.
  uint64_t submitted = ddp_alive(d);
  ddp_gradients_submit(d);
  if (job->outer_step == 0 && d->adam_step == 0) {
    ddp_first_batches_save(d);
  }
  *out_stopped = ddp_wait(d, "ddp gradients");
  if (!*out_stopped) {
    job->tokens_computed += submitted * d->rows;
  }
  pcp_status_t status = pcp_ok_status();
  if (!*out_stopped) {
    status = ddp_gradients_average(d, out_reporters, out_loss);
  }
  ddp_release(d);
  if (*out_stopped || status) {
    return status;
  }
  d->step_value = (float)(d->adam_step + 1);
  d->lr = pcp_diloco_lr_schedule_at(&job->schedule, global_step);
  job->last_lr = d->lr;
  ddp_optimizer_submit(d);
  *out_stopped = ddp_wait(d, "ddp optimizer");
  for (uint32_t k = 0; k < d->count && !*out_stopped; ++k) {
    (void)ddp_outputs(d, &d->workers[k], "apply_optimizer", 3 * n);
  }
  ddp_release(d);
  if (*out_stopped) {
    return pcp_ok_status();
  }
  ++d->adam_step;
  job->tokens_merged += (double)*out_reporters * (double)d->rows;
  d->inner_step_ns = pcp_clock_now_ns(job->options->clock) - start;
  return ddp_alive(d) ? pcp_ok_status() : ddp_none_left(job, "optimizer");
}

uint32_t pcp_diloco_ddp_hash_vote(const uint8_t* hashes, const bool* present,
                                  uint32_t count, bool* out_tied) {
  uint32_t reference = UINT32_MAX;
  uint32_t best = 0;
  *out_tied = false;
  for (uint32_t k = 0; k < count; ++k) {
    if (!present[k]) {
      continue;
    }
    uint32_t same = 0;
    bool seen = false;  // an earlier worker holds it: counted already
    for (uint32_t j = 0; j < count; ++j) {
      bool equal =
          present[j] && memcmp(hashes + (size_t)j * PCP_SHA256_BYTE_LENGTH,
                               hashes + (size_t)k * PCP_SHA256_BYTE_LENGTH,
                               PCP_SHA256_BYTE_LENGTH) == 0;
      same += equal;
      seen = seen || (equal && j < k);
    }
    if (seen) {
      continue;
    }
    if (same > best) {
      best = same;
      reference = k;
      *out_tied = false;
    } else if (same == best) {
      *out_tied = true;
    }
  }
  return reference;
}

uint32_t pcp_diloco_ddp_read_order(const uint8_t* hashes, const bool* present,
                                   uint32_t count, uint32_t reference,
                                   uint32_t* out_order) {
  if (reference >= count || !present[reference]) {
    return 0;
  }
  uint32_t used = 0;
  out_order[used++] = reference;
  for (uint32_t k = 0; k < count; ++k) {
    if (k != reference && present[k] &&
        memcmp(hashes + (size_t)k * PCP_SHA256_BYTE_LENGTH,
               hashes + (size_t)reference * PCP_SHA256_BYTE_LENGTH,
               PCP_SHA256_BYTE_LENGTH) == 0) {
      out_order[used++] = k;
    }
  }
  return used;
}

// The live workers' last reported hashes, for the two functions above.
static void ddp_hash_table(const ddp_t* d,
                           uint8_t (*hashes)[PCP_SHA256_BYTE_LENGTH],
                           bool* present) {
  for (uint32_t k = 0; k < d->count; ++k) {
    present[k] = d->workers[k].alive && d->workers[k].hashed;
    memcpy(hashes[k], d->workers[k].hash, PCP_SHA256_BYTE_LENGTH);
  }
}

// DATA_LOSS naming every live worker's hash: no hash is held by more
// workers than every other one.
static pcp_status_t ddp_no_majority(ddp_t* d) {
  job_t* job = d->job;
  char list[512] = "";
  size_t used = 0;
  for (uint32_t k = 0; k < d->count && used < sizeof(list); ++k) {
    const ddp_worker_t* w = &d->workers[k];
    if (!w->alive || !w->hashed) {
      continue;
    }
    pcp_sha256_t h;
    memcpy(h.bytes, w->hash, PCP_SHA256_BYTE_LENGTH);
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_sha256_to_hex(&h, hex);
    int wrote = snprintf(list + used, sizeof(list) - used, "%s%s %.16s",
                         used ? ", " : "", w->worker_id, hex);
    if (wrote < 0) {
      break;
    }
    used += (size_t)wrote;
  }
  ++job->param_hash_mismatches;
  PCP_LOG(PCP_LOG_WARN, &job->log,
          "ddp: no majority among the parameter hashes at step %" PRIu64 ": %s",
          job->outer_step + 1, list);
  return pcp_make_status(
      PCP_STATUS_DATA_LOSS,
      "ddp: the workers' parameters differ with no majority at step %" PRIu64
      " (%s); on_param_mismatch cannot tell which worker is wrong",
      job->outer_step + 1, list);
}

// Every live worker's SHA-256 of its resident parameters (@hash with
// hash_inputs), compared with the reference worker's (the first by id of
// those holding the most common hash; no majority fails the job):
// on_param_mismatch fail fails the job, resync drops the worker.
// *out_reference: the reference worker's index (UINT32_MAX: none).
static pcp_status_t ddp_hash_check(ddp_t* d, uint32_t* out_mismatches,
                                   uint32_t* out_reference, bool* out_stopped) {
  job_t* job = d->job;
  size_t n = job->table.count;
  *out_mismatches = 0;
  *out_reference = UINT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    d->refs[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                          .name = ddp_name(d, 'p', i)};
  }
  for (uint32_t k = 0; k < d->count; ++k) {
    d->workers[k].hashed = false;
    if (d->workers[k].alive) {
      ddp_submit(d, &d->workers[k], d->state_hash, "hash", NULL, 0, (uint32_t)n,
                 0, (uint32_t)n);
    }
  }
  *out_stopped = ddp_wait(d, "ddp parameter hashes");
  for (uint32_t k = 0; k < d->count && !*out_stopped; ++k) {
    ddp_worker_t* w = &d->workers[k];
    const pcp_proto_section_t* o = ddp_outputs(d, w, "hash", 2);
    if (!o) {
      continue;
    }
    if (o[1].byte_length != PCP_SHA256_BYTE_LENGTH) {
      ddp_drop(d, w, "hash", "no 32-byte parameter hash");
      continue;
    }
    memcpy(w->hash, o[1].data, PCP_SHA256_BYTE_LENGTH);
    w->hashed = true;
  }
  ddp_release(d);
  if (*out_stopped) {
    return pcp_ok_status();
  }
  // The reference: the hash most workers hold, so with resync one
  // corrupted worker is dropped, not the others (whatever its id). No
  // majority (2 workers that differ) fails the job under either policy:
  // nothing tells which one is wrong.
  uint8_t hashes[MAX_ROUND_WORKERS][PCP_SHA256_BYTE_LENGTH];
  bool present[MAX_ROUND_WORKERS];
  ddp_hash_table(d, hashes, present);
  bool tied = false;
  *out_reference =
      pcp_diloco_ddp_hash_vote(&hashes[0][0], present, d->count, &tied);
  if (*out_reference == UINT32_MAX) {
    return ddp_none_left(job, "parameter hashes");
  }
  if (tied) {
    return ddp_no_majority(d);
  }
  const ddp_worker_t* reference = &d->workers[*out_reference];
  for (uint32_t k = 0; k < d->count; ++k) {
    ddp_worker_t* w = &d->workers[k];
    if (!w->alive || !w->hashed) {
      continue;
    }
    bool match = true;
    // The parameters after the step being completed (outer_step + 1).
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_param_hash_check_against(
        job, w->worker_id, job->outer_step + 1, reference->worker_id,
        reference->hash, w->hash, &match));
    if (!match) {
      ++*out_mismatches;
      char why[PCP_SCHED_WORKER_ID_MAX_LENGTH + 64];
      snprintf(why, sizeof(why),
               "its parameters differ from reference worker %s's",
               reference->worker_id);
      ddp_drop(d, w, "hash", why);
    }
  }
  return pcp_ok_status();
}

// The masters (job->parameters) from worker |w| (@read), checked against
// the hash it reported for them. A failed read or bytes that do not match
// drop |w| (*out_read false; the caller tries another holder).
static pcp_status_t ddp_pull_from(ddp_t* d, ddp_worker_t* w, bool* out_read,
                                  bool* out_stopped) {
  job_t* job = d->job;
  size_t n = job->table.count;
  *out_read = false;
  for (size_t i = 0; i < n; ++i) {
    d->refs[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                          .name = ddp_name(d, 'p', i)};
  }
  ddp_submit(d, w, d->state_hash, "read", NULL, 0, (uint32_t)n, 0, 0);
  *out_stopped = ddp_wait(d, "ddp parameter read");
  const pcp_proto_section_t* o =
      *out_stopped ? NULL : ddp_outputs(d, w, "read", n);
  bool sizes_ok = o != NULL;
  for (size_t i = 0; o && i < n; ++i) {
    const pcp_models_parameter_t* p = &job->table.parameters[i];
    if (o[i].byte_length != (uint64_t)p->element_count * sizeof(float)) {
      char why[160];
      snprintf(why, sizeof(why), "%" PRIu64 " bytes for %s", o[i].byte_length,
               p->name);
      ddp_drop(d, w, "read", why);
      sizes_ok = false;
      break;
    }
  }
  for (size_t i = 0; sizes_ok && i < n; ++i) {
    memcpy(job->parameters + pcp_diloco_job_tensor_offset(job, i), o[i].data,
           (size_t)o[i].byte_length);
  }
  ddp_release(d);
  if (!sizes_ok) {
    return pcp_ok_status();
  }
  for (size_t i = 0; i < n; ++i) {
    pcp_diloco_job_master_section(job, i, &d->sections[i]);
  }
  uint8_t got[PCP_SHA256_BYTE_LENGTH];
  pcp_diloco_param_hash(d->sections, n, got);
  if (memcmp(got, w->hash, sizeof(got)) != 0) {
    ddp_drop(d, w, "read",
             "the parameters it returned do not hash to what it reported");
    return pcp_ok_status();
  }
  *out_read = true;
  return pcp_ok_status();
}

// The masters from the reference worker (*reference) or, when that read
// fails (the worker lost mid-@read, say), from the next live worker that
// reported the same hash; *reference becomes the one read. Fails only when
// none is left.
static pcp_status_t ddp_pull(ddp_t* d, uint32_t* reference, bool* out_stopped) {
  job_t* job = d->job;
  uint8_t hashes[MAX_ROUND_WORKERS][PCP_SHA256_BYTE_LENGTH];
  bool present[MAX_ROUND_WORKERS];
  uint32_t order[MAX_ROUND_WORKERS];
  ddp_hash_table(d, hashes, present);
  uint32_t count = pcp_diloco_ddp_read_order(&hashes[0][0], present, d->count,
                                             *reference, order);
  *out_stopped = false;
  for (uint32_t c = 0; c < count; ++c) {
    bool read = false;
    PCP_RETURN_IF_ERROR_BARE(
        ddp_pull_from(d, &d->workers[order[c]], &read, out_stopped));
    if (*out_stopped) {
      return pcp_ok_status();
    }
    if (read) {
      if (c > 0) {
        PCP_LOG(PCP_LOG_INFO, &job->log,
                "ddp: parameters read from worker %s (same hash as the "
                "reference, which failed)",
                d->workers[order[c]].worker_id);
      }
      *reference = order[c];
      return pcp_ok_status();
    }
  }
  return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                         "ddp: reading the parameters failed on every worker "
                         "holding them (%u tried, inner step %" PRIu64 ")",
                         count, job->outer_step * (uint64_t)job->config.tau);
}

//===----------------------------------------------------------------------===//
// Set-up
//===----------------------------------------------------------------------===//

// The workers: every connected one of the first one's kind and the job's
// class (waits for one).
static pcp_status_t ddp_workers_gather(ddp_t* d) {
  job_t* job = d->job;
  const pcp_diloco_job_options_t* o = job->options;
  pcp_fabric_worker_info_t* infos =
      pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS, sizeof(*infos));
  if (!infos) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  uint64_t nonce = (uint64_t)pcp_clock_now_ns(o->clock) & 0xffffffffffull;
  pcp_status_t status = pcp_ok_status();
  const char* worker_class = job->config.worker_class;
  while (!status && !d->count) {
    if (pcp_diloco_job_should_stop(job)) {
      status = ddp_stopped(job);
      break;
    }
    uint32_t count =
        pcp_fabric_worker_list(o->fabric, infos, MAX_ROUND_WORKERS, NULL);
    for (uint32_t i = 0; i < count; ++i) {
      if (infos[i].state != PCP_FABRIC_WORKER_CONNECTED ||
          (worker_class && strcmp(infos[i].worker_class, worker_class))) {
        continue;
      }
      if (!d->backend[0]) {
        snprintf(d->backend, sizeof(d->backend), "%s", infos[i].backend);
        snprintf(d->target, sizeof(d->target), "%s", infos[i].target);
      }
      if (strcmp(infos[i].backend, d->backend) ||
          strcmp(infos[i].target, d->target)) {
        continue;
      }
      ddp_worker_t* w = &d->workers[d->count++];
      snprintf(w->worker_id, sizeof(w->worker_id), "%s", infos[i].worker_id);
      snprintf(w->session, sizeof(w->session), "%s-ddp-%u-%" PRIx64, o->job_id,
               d->count - 1, nonce);
      w->alive = true;
    }
    if (!d->count) {
      pcp_status_t waited = pcp_fabric_workers_wait_class(
          o->fabric, NULL, NULL, worker_class, 1,
          pcp_fabric_endpoint_now_ns(o->fabric) +
              (int64_t)NOBODY_WAIT_MS * 1000000,
          job->waker ? pcp_diloco_job_stop_fn : NULL, job->waker ? job : NULL,
          NULL);
      if (pcp_status_code(waited) == PCP_STATUS_FAILED_PRECONDITION) {
        status = waited;
      } else {
        pcp_status_ignore(waited);
      }
    }
  }
  pcp_diloco_job_free(job, infos);
  // Worker-id order: the average's summation order, and the reference.
  for (uint32_t a = 1; a < d->count; ++a) {
    for (uint32_t b = a; b > 0 && strcmp(d->workers[b - 1].worker_id,
                                         d->workers[b].worker_id) > 0;
         --b) {
      ddp_worker_t t = d->workers[b];
      d->workers[b] = d->workers[b - 1];
      d->workers[b - 1] = t;
    }
  }
  return status;
}

// Per worker: a sampler over shard k of the train split (seeded from the
// job's seed; a resumed job starts its shards over) and token buffers.
static pcp_status_t ddp_workers_setup(ddp_t* d) {
  job_t* job = d->job;
  const char* names[MAX_ROUND_WORKERS];
  char storage[MAX_ROUND_WORKERS][24];
  for (uint32_t k = 0; k < d->count; ++k) {
    snprintf(storage[k], sizeof(storage[k]), "shard-%04u", k);
    names[k] = storage[k];
  }
  pcp_data_assignment_t* plan =
      pcp_diloco_job_calloc(job, d->count, sizeof(*plan));
  if (!plan) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "shard plan");
  }
  pcp_status_t status = pcp_data_shard_plan(
      job->dataset, job->train_range, (uint32_t)job->spec.block_size, names,
      d->count, job->outer_step, job->seed, plan);
  for (uint32_t k = 0; k < d->count && !status; ++k) {
    ddp_worker_t* w = &d->workers[k];
    pcp_data_sampler_options_t so = {
        .sampling = job->config.sampling == PCP_DILOCO_SAMPLING_FIFO
                        ? PCP_DATA_SAMPLING_SEQUENTIAL
                        : PCP_DATA_SAMPLING_RANDOM,
        .batch_size = (uint32_t)job->spec.batch,
        .block_size = (uint32_t)job->spec.block_size,
        .seed = plan[k].seed};
    status = pcp_data_sampler_create(job->dataset, plan[k].range, &so,
                                     pcp_allocator_system(), &w->sampler);
    if (status) {
      break;
    }
    w->tokens = pcp_diloco_job_malloc(job, 2 * d->rows * sizeof(int32_t));
    w->tokens64 = job->data_type == PCP_ELEMENT_TYPE_I64
                      ? pcp_diloco_job_malloc(job, 2 * d->rows * 8)
                      : NULL;
    if (!w->tokens ||
        (job->data_type == PCP_ELEMENT_TYPE_I64 && !w->tokens64)) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "token buffers");
    }
  }
  pcp_diloco_job_free(job, plan);
  return status;
}

static pcp_status_t ddp_buffers(ddp_t* d) {
  job_t* job = d->job;
  size_t n = job->table.count;
  // One task frame carries the averaged gradient (n sections) plus step and
  // lr.
  uint32_t max_sections = pcp_proto_limits_default().max_sections;
  if (n + 2 > max_sections) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "key 'model': ddp sends %zu gradient tensors plus "
                           "step and lr in one task frame; the fabric carries "
                           "at most %u sections (use fewer layers)",
                           n, max_sections);
  }
  d->names = pcp_diloco_job_calloc(job, 3 * n + 1, sizeof(*d->names));
  d->refs = pcp_diloco_job_calloc(job, 4 * n + 2, sizeof(*d->refs));
  d->keep = pcp_diloco_job_calloc(job, 3 * n + 1, sizeof(*d->keep));
  d->sections = pcp_diloco_job_calloc(job, n + 2, sizeof(*d->sections));
  d->inputs = pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS, sizeof(float*));
  d->grad = pcp_diloco_job_calloc(job, job->parameter_count + 1, sizeof(float));
  if (!d->names || !d->refs || !d->keep || !d->sections || !d->inputs ||
      !d->grad) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "ddp buffers");
  }
  for (size_t i = 0; i < n; ++i) {
    snprintf(d->names[3 * i + 0], 24, "p%zu", i);
    snprintf(d->names[3 * i + 1], 24, "m%zu", i);
    snprintf(d->names[3 * i + 2], 24, "v%zu", i);
  }
  d->rows = (size_t)job->accumulation *
            (size_t)(job->spec.batch * job->spec.block_size);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// The run
//===----------------------------------------------------------------------===//

bool pcp_diloco_ddp_selected(const job_t* job) {
  const char* strategy = json_string_value(
      json_object_get(job->experiment, "aggregation_strategy"));
  return strategy && strcmp(strategy, "ddp") == 0;
}

// One reported step: tau inner steps, the hashes, then evaluation,
// progress and checkpoint as classic's outer step does.
static pcp_status_t ddp_outer_step(ddp_t* d, bool* out_stopped) {
  job_t* job = d->job;
  const pcp_diloco_job_options_t* o = job->options;
  uint64_t tau = (uint64_t)job->config.tau;
  int64_t start = pcp_clock_now_ns(o->clock);
  size_t id_size = pcp_element_type_byte_size(job->data_type);
  pcp_diloco_job_bytes_mark(job);
  round_outcome_t outcome;
  memset(&outcome, 0, sizeof(outcome));
  double loss_sum = 0;
  uint64_t worker_steps = 0;
  for (uint64_t s = 0; s < tau; ++s) {
    uint32_t reporters = 0;
    double loss = NAN;
    PCP_RETURN_IF_ERROR_BARE(ddp_inner_step(d, &reporters, &loss, out_stopped));
    if (*out_stopped) {
      return pcp_ok_status();
    }
    loss_sum += loss;
    outcome.loss_last = loss;
    worker_steps += reporters;
    uint64_t grad_bytes = (uint64_t)job->parameter_count * sizeof(float);
    outcome.delta_bytes += reporters * grad_bytes;
    outcome.parameter_bytes += ddp_alive(d) * grad_bytes;
    outcome.token_bytes += reporters * 2 * d->rows * id_size;
  }
  uint32_t reference = UINT32_MAX;
  PCP_RETURN_IF_ERROR_BARE(
      ddp_hash_check(d, &outcome.param_mismatches, &reference, out_stopped));
  if (*out_stopped) {
    return pcp_ok_status();
  }
  pcp_diloco_job_bytes_stop(job);
  ++job->outer_step;
  outcome.reporters = ddp_alive(d);
  outcome.loss_mean = loss_sum / (double)tau;
  job->last_step_ns = pcp_clock_now_ns(o->clock) - start;
  job->expected_workers = outcome.reporters;
  job->last_loss = outcome.loss_last;
  job->last_loss_mean = outcome.loss_mean;
  job->wire_bytes += outcome.parameter_bytes + outcome.delta_bytes;
  job->token_bytes += outcome.token_bytes;
  double seconds = (double)job->last_step_ns / 1e9;
  double tokens = (double)worker_steps * (double)d->rows;
  double tokens_per_second = seconds > 0 ? tokens / seconds : 0;
  pcp_diloco_job_step_metrics(job, &outcome, seconds, tokens_per_second);
  if (o->metrics && o->metrics->learning_rate) {
    const char* job_label[] = {o->job_id};
    pcp_obs_family_set(o->metrics->learning_rate, job_label, job->last_lr);
  }
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "ddp outer_step=%" PRIu64 "/%" PRId64 " (inner %" PRIu64
          ") loss=%.4f loss_mean=%.4f workers=%u seconds=%.2f "
          "tokens_per_s=%.0f",
          job->outer_step, job->config.outer_loop_steps, job->outer_step * tau,
          job->last_loss, job->last_loss_mean, outcome.reporters, seconds,
          tokens_per_second);
  // Passes over the train split, as classic counts them.
  double epoch = pcp_diloco_job_epochs_trained(job);
  job->epochs_done = epoch >= (double)job->config.max_epochs;
  bool last = (int64_t)job->outer_step >= job->config.outer_loop_steps ||
              job->epochs_done;
  bool eval_due =
      job->eval_enabled && pcp_diloco_job_eval_due(job, job->outer_step, last);
  bool checkpoint_due =
      last || (job->config.checkpoint_every > 0 &&
               job->outer_step % (uint64_t)job->config.checkpoint_every == 0);
  if (eval_due || checkpoint_due) {
    PCP_RETURN_IF_ERROR_BARE(ddp_pull(d, &reference, out_stopped));
    if (*out_stopped) {
      return pcp_ok_status();
    }
  }
  bool evaluated = false;
  if (eval_due) {
    pcp_status_t status = pcp_diloco_job_evaluate(
        job, d->workers[reference].worker_id, d->backend, d->target);
    if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
      pcp_status_ignore(status);
      *out_stopped = true;
      return pcp_ok_status();
    }
    PCP_RETURN_IF_ERROR_BARE(status);
    evaluated = job->val_loss_step == job->outer_step;
  }
  json_t* progress =
      pcp_diloco_job_progress_json(job, &outcome, seconds, tokens_per_second);
  if (progress) {
    json_object_set_new(progress, "aggregation_strategy", json_string("ddp"));
    json_object_set_new(progress, "inner_steps",
                        json_integer((json_int_t)(job->outer_step * tau)));
    json_object_set_new(progress, "epoch", json_real(epoch));
    json_object_set_new(progress, "evaluated", json_boolean(evaluated));
    json_object_set_new(progress, "param_mismatches",
                        json_integer(outcome.param_mismatches));
    pcp_diloco_job_goodput_json(job, progress);
    json_t* bytes = pcp_diloco_job_bytes_json(job);
    if (bytes) {
      json_object_set_new(progress, "bytes", bytes);
    }
    json_t* totals = pcp_diloco_job_bytes_total_json(job);
    if (totals) {
      json_object_set_new(progress, "bytes_total", totals);
    }
    pcp_diloco_param_hash_json(job, progress);
    pcp_status_ignore(pcp_store_job_event_append(
        o->store, o->job_id, "training.step", progress, NULL));
  }
  pcp_diloco_job_progress_report(job, progress);
  json_decref(progress);
  if (checkpoint_due) {
    // Parameters only: the workers' moments are not saved (a resume starts
    // them fresh; docs/training.md).
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_job_checkpoint_write(job));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_ddp_run(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  if (job->param_type != PCP_ELEMENT_TYPE_F32) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "aggregation_strategy 'ddp' trains f32 models only "
                           "(key 'dtype')");
  }
  if (job->config.streaming.present ||
      json_object_get(job->experiment, "decoupled_diloco")) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "aggregation_strategy 'ddp' takes no 'streaming' "
                           "or 'decoupled_diloco' block");
  }
  ddp_t* d = pcp_diloco_job_calloc(job, 1, sizeof(*d));
  if (!d) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "ddp state");
  }
  d->job = job;
  pcp_status_t status = ddp_buffers(d);
  if (!status && job->expected_workers > 1) {
    // A resumed job: wait (bounded, woken by joins) for as many workers as
    // its checkpoint's step had, so a restarted gateway does not run on
    // whichever worker reconnected first (the rest would be ignored).
    pcp_status_ignore(pcp_diloco_job_workers_wait(job, job->expected_workers,
                                                  WORKER_GRACE_MS));
  }
  if (!status) {
    status = ddp_workers_gather(d);
  }
  if (!status) {
    status = ddp_workers_setup(d);
  }
  if (!status) {
    status = ddp_programs(d);
  }
  if (!status && o->hooks.phase) {
    status = o->hooks.phase(o->hooks.user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  if (!status) {
    json_t* progress = pcp_diloco_job_progress_json(job, NULL, 0, 0);
    pcp_diloco_job_progress_report(job, progress);
    json_decref(progress);
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "ddp: %u workers, %zu parameters, tau=%" PRId64
            " inner steps per reported step, from outer step %" PRIu64,
            d->count, job->parameter_count, job->config.tau, job->outer_step);
    status = ddp_init(d);
  }
  while (!status && (int64_t)job->outer_step < job->config.outer_loop_steps &&
         !job->epochs_done) {
    if (pcp_diloco_job_should_stop(job)) {
      status = ddp_stopped(job);
      break;
    }
    bool stopped = false;
    status = ddp_outer_step(d, &stopped);
    if (!status && stopped) {
      status = ddp_stopped(job);
    }
  }
  if (!status && job->outer_step == 0) {
    status = pcp_diloco_job_model_export(job);
  }
  // Tasks still out (a failure or a stop mid-step) are cancelled and
  // waited for: they borrow this run's buffers.
  for (uint32_t k = 0; k < d->count; ++k) {
    if (d->workers[k].task) {
      pcp_fabric_task_cancel(d->workers[k].task);
    }
  }
  if (d->count) {
    (void)ddp_wait(d, "ddp tasks");
  }
  ddp_release(d);
  for (uint32_t k = 0; k < d->count; ++k) {
    pcp_data_sampler_release(d->workers[k].sampler);
    pcp_diloco_job_free(job, d->workers[k].tokens);
    pcp_diloco_job_free(job, d->workers[k].tokens64);
  }
  pcp_diloco_job_free(job, d->names);
  pcp_diloco_job_free(job, d->refs);
  pcp_diloco_job_free(job, d->keep);
  pcp_diloco_job_free(job, d->sections);
  pcp_diloco_job_free(job, (void*)d->inputs);
  pcp_diloco_job_free(job, d->grad);
  pcp_diloco_job_free(job, d);
  return status;
}
