// SPDX-License-Identifier: Apache-2.0
//
// Internal to the training service (service.c: the job, set-up,
// checkpoints, programs and classic DiLoCo rounds; service_stream.c:
// streaming DiLoCo; service_decoupled.c and service_ddp.c, the other
// modes). Not part of the workloads module's public surface: only those
// files include it. Thread-compatible like the job itself
// (one thread runs a job).

#ifndef PCP_WORKLOADS_TRAIN_SERVICE_IMPL_H_
#define PCP_WORKLOADS_TRAIN_SERVICE_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "data/data.h"
#include "workloads/workloads.h"

// Programs kept per job: one per (backend, target) seen.
#define MAX_PROGRAMS 16
// Workers one round uses at most.
#define MAX_ROUND_WORKERS 64
// Rounds in a row in which every task failed before the job fails.
#define MAX_EMPTY_ROUNDS 5
// Wait slice while polling tasks and the stop hook.
#define WAIT_SLICE_MS 100
// How long a round waits for the previous round's worker count.
#define WORKER_GRACE_MS 15000
// With no worker to train on, how long a round waits for one to join
// before it goes back to the job loop.
#define NOBODY_WAIT_MS 200
// Task-wait deadlines (pcp_diloco_job_tasks_wait): at least these, or a
// multiple of the last outer step's time when that is longer, so a task
// lost between the gateway and a worker fails its round or evaluation
// (logged; the job goes on) instead of hanging the job. Generous: a round
// includes a first program fetch and load on its worker.
#define ROUND_WAIT_MIN_MS (30 * 60 * 1000)
#define SHORT_WAIT_MIN_MS (5 * 60 * 1000)
#define WAIT_STEP_MULTIPLE 10

// Cursor kinds of the checkpoint image (its opaque cursor is JSON).
#define CURSOR_KIND_CLASSIC "pcp.diloco.stateless.v1"
#define CURSOR_KIND_STREAMING "pcp.diloco.streaming.v1"
// Decoupled DiLoCo: the cursor's "decoupled" object (service_decoupled.c)
// holds the syncer's counters, the learners and the tape's side file.
#define CURSOR_KIND_DECOUPLED "pcp.diloco.decoupled.v1"
// ddp: parameters only (no velocity use, no inner state; the workers'
// moments start fresh), so neither a classic checkpoint (its inner state
// would be ignored) nor the reverse resumes across modes.
#define CURSOR_KIND_DDP "pcp.diloco.ddp.v1"

typedef struct program_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  bool ready;
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
  // inner_state keep: the @copy module moving moments (built on first use).
  bool state_ready;
  uint8_t state_hash[PCP_SHA256_BYTE_LENGTH];
} program_t;

// inner_state keep: one worker's AdamW state, resident in |session| on it
// (m<i>, v<i>) while |live|; |step| (the next inner step's number, 1-based)
// is tracked here and sent with each round (the program returns the next).
typedef struct inner_slot_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[PCP_STORE_ID_MAX_LENGTH + 64];
  bool live;
  uint64_t step;
  // The worker's joins that did not resume its lease when the session was
  // made: another such join dropped its sessions (it returned: fresh).
  uint32_t lost_joins;
  uint64_t reported_step;     // outer step of its last delta (0: none)
  struct program_t* program;  // its kind's programs
} inner_slot_t;

// The forward program (@main: the loss) for one (backend, target), which
// evaluates the held-out batches.
typedef struct eval_program_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
} eval_program_t;

// Measured bytes: the fabric's byte counters of the workers (their links
// to the gateway, framing included) and of the whole endpoint at one
// moment; a step's figures are the differences between two of these.
#define BYTES_METER_WORKERS MAX_ROUND_WORKERS
typedef struct pcp_diloco_bytes_meter_t {
  uint32_t count;
  struct {
    char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
    uint64_t in;
    uint64_t out;
  } workers[BYTES_METER_WORKERS];
  uint64_t gateway_in;
  uint64_t gateway_out;
} pcp_diloco_bytes_meter_t;

// What wakes a job's task waits when one of its fabric tasks ends: each
// task submitted through pcp_diloco_job_task_submit holds a reference and
// signals the hooks' waiter from its DONE callback (the fabric's loop
// thread). Reference counted because a task may end after the job's run
// returned (a cancelled task answers late, or the endpoint is released
// later): the run detaches it first (|hooks| NULL under |mu|), so no
// signal reaches a run that is gone.
typedef struct pcp_diloco_waker_t pcp_diloco_waker_t;

typedef struct job_t {
  const pcp_diloco_job_options_t* options;
  // Set when the hooks have a wait/signal pair; NULL: sliced polling.
  pcp_diloco_waker_t* waker;
  // options->allocator, or the system allocator when that is unset: every
  // buffer of the job comes from it (pcp_diloco_job_malloc and friends).
  pcp_allocator_t allocator;
  pcp_log_context_t log;
  pcp_diloco_config_t config;
  json_t* experiment;
  char name[256];
  uint64_t seed;
  // The built-in model's spec; for a model_path module only batch,
  // block_size and dtype are meaningful (|foreign|).
  pcp_models_spec_t spec;
  pcp_models_parameter_table_t table;
  bool table_ready;
  bool foreign;  // model_path: the table comes from the module's signature
  // Parameter element type on the workers and the wire (F32 or BF16; the
  // masters here are f32 either way) and the token ids' type (I32 or I64).
  pcp_element_type_t param_type;
  pcp_element_type_t data_type;
  // Micro-batches per inner step (effective_batch_size / micro batch; 1
  // without accumulation): the program sums their gradients before one
  // AdamW step (`pcp compile --accumulate`).
  int64_t accumulation;
  char dir[1024];  // <state_dir>/training/<job_id>
  // checkpoint_dir, a relative one taken under the state dir (the gateway's
  // working directory is nobody's business).
  char checkpoint_dir[1200];
  char* model_text;
  size_t model_length;
  char model_hash[PCP_SHA256_HEX_LENGTH + 1];
  pcp_data_dataset_t* dataset;
  pcp_data_range_t train_range;
  uint64_t train_tokens;  // tokens in train_range: one epoch
  // The held-out tail (eval_fraction of the data; empty when 0).
  pcp_data_range_t eval_range;
  bool eval_enabled;
  // eval_batches fixed held-out batches, sampled once at set-up (ids then
  // targets, eval_batches x B x T each; |eval_tokens64| widened for a
  // module taking i64 ids), so every evaluation sees the same tokens.
  int32_t* eval_tokens;
  int64_t* eval_tokens64;
  eval_program_t eval_programs[MAX_PROGRAMS];
  uint32_t eval_program_count;
  // The inner learning-rate schedule over pcp_diloco_inner_step_total.
  pcp_diloco_lr_schedule_t schedule;
  // Classic DiLoCo ends when every worker together has trained max_epochs
  // x train_tokens tokens (upstream stops past max_epochs of its data
  // manager), or at outer_loop_steps, whichever comes first.
  bool epochs_done;
  // The global state.
  size_t parameter_count;
  float* parameters;  // one buffer; every task's sections point into it
  // bf16 models: the masters rounded to nearest even for the broadcast
  // (upstream keeps bf16 masters and truncates; f32 masters do not lose the
  // small outer updates bf16 rounds away).
  uint16_t* wire_parameters;
  uint64_t* tensor_elements;
  pcp_diloco_nesterov_t nesterov;
  bool nesterov_ready;
  pcp_diloco_accumulator_t accumulator;
  bool accumulator_ready;
  void* scratch;         // one worker's flat delta (f32 or bf16)
  uint64_t outer_step;   // completed outer steps
  int64_t last_step_ns;  // wall time of the last completed outer step
  pcp_rng_t rng;
  // Totals (also in checkpoints' cursor JSON so a resume continues them).
  uint64_t wire_bytes;
  uint64_t token_bytes;
  double last_loss;
  double last_loss_mean;
  // The rate of the last inner step run, and the last evaluation's loss
  // on the held-out batches (NAN before the first).
  double last_lr;
  double last_val_loss;
  uint64_t val_loss_step;  // outer step of last_val_loss
  // Workers whose delta the last outer step averaged (in the checkpoint's
  // cursor): a round waits up to WORKER_GRACE_MS for that many to be
  // connected, so a gateway restart does not run its first round on
  // whichever worker reconnected first (the batches and the average depend
  // on the worker count).
  uint32_t expected_workers;
  program_t programs[MAX_PROGRAMS];
  uint32_t program_count;
  // inner_state keep (classic): per worker seen, its resident state.
  inner_slot_t inner[MAX_ROUND_WORKERS * 4];
  uint32_t inner_count;
  uint64_t inner_generation;  // makes every session id new
  uint64_t inner_nonce;       // per run: ids never meet a dead gateway's
  // A resumed checkpoint's moments (per saved worker m then v, f32), handed
  // to the first round's workers in id order, with their steps.
  float* inner_resume;
  uint64_t* inner_resume_steps;
  uint32_t inner_resume_count;
  // The cursor's "inner" object the next checkpoint_write stores (the
  // workers' moments side file), as stream_cursor is for streaming.
  json_t* inner_cursor;
  uint32_t compiled_count;  // programs registered, for the log
  // Streaming: the cursor's "streaming" object the next checkpoint_write
  // stores (set by the streaming loop), and the one job_resume loaded with
  // the directory of its checkpoint file (the workers' state file is beside
  // it). Decoupled DiLoCo uses the same two fields for its "decoupled"
  // object (the tape's side file is beside the checkpoint).
  json_t* stream_cursor;
  json_t* stream_resume;
  char stream_resume_dir[1300];
  // Bit-identity (docs/training.md): the last outer step (streaming: sync)
  // whose global parameters every hashing worker held bit for bit, their
  // SHA-256 (hex), and the mismatches seen in this run.
  bool param_hash_verified;
  uint64_t param_hash_step;
  char param_hash_hex[PCP_SHA256_HEX_LENGTH + 1];
  uint64_t param_hash_mismatches;
  // Measured bytes: the counters at the start of the step being measured,
  // and the run's totals of the measured steps.
  pcp_diloco_bytes_meter_t bytes_start;
  pcp_diloco_bytes_meter_t bytes_end;
  uint64_t measured_gateway_in;
  uint64_t measured_gateway_out;
  uint64_t measured_workers_in;
  uint64_t measured_workers_out;
  // Goodput (docs/training.md "Goodput"), classic and streaming (decoupled
  // keeps its own in service_decoupled.c): every token a worker was given
  // to train on, discarded work included (a lost task or step counts what
  // was assigned: the gateway cannot know how far it got), and the tokens
  // whose delta entered the masters (streaming: weighted by the synced
  // fragment's share of the parameters, hence a double). In the
  // checkpoint's cursor, so a resume continues them.
  uint64_t tokens_computed;
  double tokens_merged;
} job_t;

// What one classic outer step (or one streaming sync) reports.
typedef struct round_outcome_t {
  uint32_t reporters;
  double loss_last;
  double loss_mean;
  uint64_t parameter_bytes;
  uint64_t delta_bytes;
  uint64_t token_bytes;
  // Workers whose inner AdamW state started fresh this step (one that
  // joined or returned; always 0 with inner_state reset, where every
  // round starts fresh by definition).
  uint32_t fresh_inner_state;
  // Workers whose parameter hash differed (resync: dropped this step).
  uint32_t param_mismatches;
  // Classic: tokens of the step's tasks (assigned) and of those averaged.
  uint64_t tokens_computed;
  uint64_t tokens_merged;
  char last_error[256];
} round_outcome_t;

// Passes over the train split so far (the token bytes sent / the split's
// tokens): what max_epochs bounds.
double pcp_diloco_job_epochs_trained(const job_t* job);

// One reported step's metrics (step seconds, loss, tokens/s, wire and
// token bytes, outer steps) when the job has a metrics registry.
void pcp_diloco_job_step_metrics(const job_t* job,
                                 const round_outcome_t* outcome, double seconds,
                                 double tokens_per_second);

// JSON has no NaN: a loss not known yet (or diverged) is null.
json_t* pcp_diloco_json_number_or_null(double value);

// The job's stop hook fired (cancel, or a stopping gateway).
bool pcp_diloco_job_should_stop(job_t* job);

// Waits for |count| tasks (NULL entries skipped) until they are all done.
// A stop request cancels every unfinished one (and the wait goes on until
// they end: they borrow the caller's buffers). Past |timeout_ms| the
// unfinished ones are cancelled too, with a warning naming |what|; their
// status then says CANCELLED (or DEADLINE_EXCEEDED), which the caller
// treats as any failed task. After a cancel the fabric bounds the rest:
// an unsent task ends at once, a running one when its worker answers, is
// lost, or stays silent on it for the resume window. Returns true when
// stopped. With a waker (the hooks' wait/signal pair) the wait sleeps on
// the hooks' waiter, woken by a task's end and by a stop; without one it
// polls should_stop every WAIT_SLICE_MS.
bool pcp_diloco_job_tasks_wait(job_t* job, pcp_fabric_task_t* const* tasks,
                               size_t count, int64_t timeout_ms,
                               const char* what);

// Gives |job| its waker when the hooks have a wait/signal pair (else
// leaves it NULL). RESOURCE_EXHAUSTED when it cannot be allocated.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_waker_create(job_t* job);
// The job's end: no signal reaches the hooks after this returns (their user
// data may die with the run); tasks still out keep the waker until their
// DONE. No-op without a waker.
void pcp_diloco_job_waker_detach(job_t* job);

// pcp_fabric_task_submit on the job's fabric, with the job's waker as the
// task's callback when it has one (|params|' callback and user_data are
// overwritten then). Use it for every task a pcp_diloco_job_tasks_wait
// waits on: with a waker, nothing else wakes that wait when a task ends.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_task_submit(
    job_t* job, pcp_fabric_task_params_t* params, pcp_fabric_task_t** out_task);

// pcp_diloco_job_should_stop for a pcp_fabric_stop_fn_t (|user_data| is
// the job).
bool pcp_diloco_job_stop_fn(void* user_data);

// Waits (pcp_fabric_workers_wait, any backend and target) until |count|
// workers are connected, for at most |timeout_ms|, or until the stop hook
// says stop: OK, DEADLINE_EXCEEDED, CANCELLED, or FAILED_PRECONDITION when
// the fabric is being released.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_job_workers_wait(job_t* job, uint32_t count, int64_t timeout_ms);

// The deadline for waiting on one batch of tasks: |floor_ms|, or
// WAIT_STEP_MULTIPLE times the last outer step when that is longer.
int64_t pcp_diloco_job_wait_timeout_ms(const job_t* job, int64_t floor_ms);

// Tensor |index|'s start in the parameter vector (elements).
size_t pcp_diloco_job_tensor_offset(const job_t* job, size_t index);

// Tensor |i| of the masters as it goes down to the workers: f32, or the
// bf16 rounding in wire_parameters for a bf16 model (refreshed by the
// caller after the last master update). |s| is overwritten; its data is
// borrowed from the job.
void pcp_diloco_job_master_section(job_t* job, size_t i,
                                   pcp_proto_section_t* s);

// Runs `pcp compile [--program KIND --inner-steps K --delta-dtype D
// [--accumulate A]] MLIR` for (backend, target) in a child process, cached
// by content hash under <state_dir>/artifacts, and registers the VMFB with
// the fabric (*out_hash). |kind| NULL compiles the module as it is.
// CANCELLED when the stop hook fires while compiling.
// The workers' state file of a checkpoint, written atomically in the state
// dir and beside checkpoint_dir (service.c); name and SHA-256 out.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_state_file_write(
    job_t* job, const char* prefix, const void* state, size_t bytes,
    char* out_name, char out_hex[PCP_SHA256_HEX_LENGTH + 1]);

// Writes an emitted module's |text| to <job dir>/|file_name| atomically
// (kept for inspection) and compiles it as it is, keyed by the text's
// SHA-256, through pcp_diloco_job_child_compile.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_module_compile(
    job_t* job, const char* file_name, const char* text, size_t length,
    const char* backend, const char* target,
    uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]);

PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_child_compile(
    job_t* job, const char* mlir_path, const char* content_hash,
    const char* kind, int64_t inner_steps, const char* backend,
    const char* target, uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]);

// Writes a checkpoint of the job's state (and, for streaming, the cursor
// in job->stream_cursor), indexed in the store, plus checkpoint_dir's
// latest.ckpt, then exports the model.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_checkpoint_write(job_t* job);

// Writes the trained model: <state_dir>/models/<job_id>/ for a built-in,
// the job's directory for a model_path module.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_model_export(job_t* job);

// The job's progress object (outer step, losses, tokens/s, bytes, ...);
// |outcome| may be NULL (before the first step). New reference or NULL.
json_t* pcp_diloco_job_progress_json(const job_t* job,
                                     const round_outcome_t* outcome,
                                     double seconds, double tokens_per_second);
// Evaluates the masters on worker |worker_id| of (|backend|, |target|):
// the forward program (compiled on first use, as the round programs are)
// over the fixed held-out batches, one task per batch; sets last_val_loss
// (the mean) and val_loss_step. A failed evaluation is logged and leaves
// last_val_loss as it was (training goes on); CANCELLED on stop; a compile
// failure is returned.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_evaluate(job_t* job,
                                                         const char* worker_id,
                                                         const char* backend,
                                                         const char* target);
// Whether outer step |step| (just completed) is due an evaluation: every
// eval_every steps and at |last|.
bool pcp_diloco_job_eval_due(const job_t* job, uint64_t step, bool last);

// Snapshots the fabric's byte counters into job->bytes_start (the step's
// start) or job->bytes_end (its end).
void pcp_diloco_job_bytes_mark(job_t* job);
void pcp_diloco_job_bytes_stop(job_t* job);
// The bytes on the wire from mark to stop, from the fabric's counters
// (not arithmetic): {"per_worker": {id: {"in", "out"}}, "gateway_in",
// "gateway_out", "per_worker_mean": {"in", "out"}}, "in" being what the
// gateway read from the worker; adds them to the run's totals. New
// reference or NULL.
json_t* pcp_diloco_job_bytes_json(job_t* job);
// The run's measured totals: {"gateway_in", "gateway_out", "workers_in",
// "workers_out"}. New reference or NULL.
json_t* pcp_diloco_job_bytes_total_json(const job_t* job);

// Sets progress's "tokens_computed", "tokens_merged" (rounded) and
// "goodput" (merged / computed; 0 before any token) from the job's totals:
// the field names decoupled DiLoCo reports.
void pcp_diloco_job_goodput_json(const job_t* job, json_t* progress);

// The gateway's SHA-256 of the global parameters as the workers receive
// them: |sections|' raw bytes in order.
void pcp_diloco_param_hash(const pcp_proto_section_t* sections, size_t count,
                           uint8_t out[PCP_SHA256_BYTE_LENGTH]);
// Compares worker |worker_id|'s hash |got| of the global parameters after
// step |step| with the gateway's |want|. A match records the step as
// verified. A mismatch is logged, appended to the job's events
// ("training.param_hash_mismatch") and counted
// (pcp_training_param_hash_mismatch_total{job}); *out_match false. With
// on_param_mismatch "fail" it returns DATA_LOSS naming the worker and both
// hashes (the job fails with it); "resync" returns OK (the caller drops
// the worker's work and sends it the gateway's copy again).
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_param_hash_check(
    job_t* job, const char* worker_id, uint64_t step,
    const uint8_t want[PCP_SHA256_BYTE_LENGTH],
    const uint8_t got[PCP_SHA256_BYTE_LENGTH], bool* out_match);
// The same against another worker's hash instead of the gateway's (ddp,
// where the gateway keeps no copy): |reference_worker| holds |want| (the
// workers' majority). The log, the event ("reference_worker",
// "reference_sha256", "policy": "fail" or "drop") and the DATA_LOSS
// message name that worker; with "resync" the caller drops the worker.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_param_hash_check_against(
    job_t* job, const char* worker_id, uint64_t step,
    const char* reference_worker, const uint8_t want[PCP_SHA256_BYTE_LENGTH],
    const uint8_t got[PCP_SHA256_BYTE_LENGTH], bool* out_match);
// Sets progress's "param_hash": {"verified_step", "sha256", "mismatches"}
// (verified_step and sha256 null before the first check).
void pcp_diloco_param_hash_json(const job_t* job, json_t* progress);

// Hands |progress| (may be NULL) to the progress hook.
void pcp_diloco_job_progress_report(job_t* job, json_t* progress);

// Compiles (cached like every program) the module whose @copy(x...) ->
// (x...) over every tensor moves a worker's AdamW moments in and out of its
// session (@copy_moments for a bf16 model, whose moments are f32): the
// streaming fragment module emitted for one fragment (service_stream.c).
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_state_program_build(
    job_t* job, const char* backend, const char* target,
    uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]);

// Streaming DiLoCo (service_stream.c): runs the set-up job to its end
// (OK), a stop (CANCELLED) or a failure; resumes from job->stream_resume.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_stream_run(job_t* job);

// Decoupled DiLoCo (service_decoupled.c): whether the experiment selects it
// (`"aggregation_strategy": "decoupled_diloco"`), and the run of the set-up
// job to its end (OK), a stop (CANCELLED) or a failure.
bool pcp_diloco_decoupled_selected(const job_t* job);
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_decoupled_run(job_t* job);
// The synchronous data-parallel baseline (service_ddp.c): whether the
// experiment selects it (`"aggregation_strategy": "ddp"`), and the run of
// the set-up job to its end (OK), a stop (CANCELLED) or a failure.
bool pcp_diloco_ddp_selected(const job_t* job);
// ddp's decisions, split out so unit tests reach them (service_test.c).
// The reference among |count| workers' parameter hashes (|hashes|: 32
// bytes each, in worker order; present[k]: worker k reported one): the first by
// id of the largest group of equal hashes; UINT32_MAX when none is present.
// *out_tied: another hash has as many holders (no majority: 2 workers that
// differ, 2 against 2), where picking one would drop or blame a healthy worker
// at random.
uint32_t pcp_diloco_ddp_hash_vote(const uint8_t* hashes, const bool* present,
                                  uint32_t count, bool* out_tied);
// The workers to @read the masters from, in order, into |out_order|
// (|count| entries): |reference| first, then every other present worker
// holding the same hash, by id. Returns how many.
uint32_t pcp_diloco_ddp_read_order(const uint8_t* hashes, const bool* present,
                                   uint32_t count, uint32_t reference,
                                   uint32_t* out_order);
// The wait for one phase of an inner step (gradients, optimizer, hash,
// read) given the last inner step's duration (0: none yet, when workers
// still load programs): SHORT_WAIT_MIN_MS until then, after it
// WAIT_STEP_MULTIPLE inner steps with a floor of DDP_PHASE_WAIT_MIN_MS.
#define DDP_PHASE_WAIT_MIN_MS (60 * 1000)
int64_t pcp_diloco_ddp_phase_timeout_ms(int64_t inner_step_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_ddp_run(job_t* job);
// The fragment module of decoupled DiLoCo (@init, @delta, @delta_int4 when
// |int4|, @mix, @mix_int4 when |int4_down|) for |fragment| of |plan| over
// |table|, as StableHLO text.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_fragment_module_emit(
    const pcp_models_parameter_table_t* table, const pcp_decoupled_plan_t* plan,
    uint32_t fragment, bool int4, bool int4_down, uint32_t block,
    pcp_string_builder_t* b);

// Writes <job dir>/|file_name|: |data| as an int32 NPY 1.0 array of
// |shape| (rank 1..8), atomically: token batches a test recomputes outside
// PCP (eval_batches.npy, ddp_first_batches.npy).
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_job_npy_i32_write(
    job_t* job, const char* file_name, const int64_t* shape, size_t rank,
    const int32_t* data);

// Memory of a job from job->allocator, NULL when it fails, like malloc and
// calloc (the callers check for NULL and say RESOURCE_EXHAUSTED with what
// they were allocating). calloc zeroes and refuses a product that overflows.
void* pcp_diloco_job_malloc(job_t* job, size_t byte_length);
void* pcp_diloco_job_calloc(job_t* job, size_t count, size_t size);
void pcp_diloco_job_free(job_t* job, void* ptr);

#endif  // PCP_WORKLOADS_TRAIN_SERVICE_IMPL_H_
