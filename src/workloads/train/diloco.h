// SPDX-License-Identifier: Apache-2.0
//
// DiLoCo / streaming DiLoCo host core. Part of the workloads module's public
// surface: include "workloads/workloads.h", which includes this file under
// its DiLoCo banner (the module shares one header between two owners; see
// docs/decisions.md).
//
// The part of DiLoCo that is pure arithmetic on flat f32 parameter vectors,
// kept apart from the service that drives workers over the fabric so it can
// be tested against NumPy and replayed bit-exactly:
//   * the experiment config table (upstream keys, reference s.1.6);
//   * outer step: worker delta, bf16 wire quantization, averaging over the
//     workers that reported, host Nesterov (reference s.1.1);
//   * streaming DiLoCo: strided fragments, the sync schedule with overlap
//     tau and alpha mixing (reference s.1.2);
//   * checkpoint state (params, outer momentum, data cursor, RNG, outer
//     step) with a SHA-256 trailer, written atomically, indexed in store;
//   * wire accounting (bytes per outer step) for tests and bench/diloco_comm.
// Conventions: a "parameter vector" is every tensor's f32 elements
// concatenated in tensor order; tensors are described by element counts.
// Ownership: objects with _initialize own heap memory released by
// _deinitialize; other functions borrow their arguments. Thread-safety:
// every function is thread-compatible (no globals; one owner per object).

#ifndef PCP_WORKLOADS_TRAIN_DILOCO_H_
#define PCP_WORKLOADS_TRAIN_DILOCO_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "config/config.h"
#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// DiLoCo experiment config
//===----------------------------------------------------------------------===//

typedef enum pcp_diloco_tokenizer_e {
  PCP_DILOCO_TOKENIZER_CHAR = 0,
  PCP_DILOCO_TOKENIZER_BYTE = 1,
  PCP_DILOCO_TOKENIZER_U16 = 2,
} pcp_diloco_tokenizer_t;

typedef enum pcp_diloco_sampling_e {
  PCP_DILOCO_SAMPLING_RANDOM = 0,
  PCP_DILOCO_SAMPLING_FIFO = 1,
} pcp_diloco_sampling_t;

typedef enum pcp_diloco_dtype_e {
  PCP_DILOCO_DTYPE_F32 = 0,
  PCP_DILOCO_DTYPE_BF16 = 1,
  PCP_DILOCO_DTYPE_F16 = 2,
} pcp_diloco_dtype_t;

// Payload dtype of worker deltas on the wire.
typedef enum pcp_diloco_wire_dtype_e {
  PCP_DILOCO_WIRE_F32 = 0,
  PCP_DILOCO_WIRE_BF16 = 1,
} pcp_diloco_wire_dtype_t;

// Inner learning-rate schedule (experiment key lr_schedule).
typedef enum pcp_diloco_lr_schedule_kind_e {
  PCP_DILOCO_LR_CONSTANT = 0,         // learning_rate every step
  PCP_DILOCO_LR_COSINE = 1,           // linear warmup, cosine to min_lr
  PCP_DILOCO_LR_WARMUP_CONSTANT = 2,  // linear warmup, then constant
} pcp_diloco_lr_schedule_kind_t;

// What happens to a worker's inner AdamW state between classic rounds
// (experiment key inner_state).
typedef enum pcp_diloco_inner_state_e {
  PCP_DILOCO_INNER_STATE_KEEP = 0,   // moments and step resident, continued
  PCP_DILOCO_INNER_STATE_RESET = 1,  // fresh moments every round
} pcp_diloco_inner_state_t;

// What a worker whose hash of the global parameters differs from the
// gateway's costs (experiment key on_param_mismatch).
typedef enum pcp_diloco_on_param_mismatch_e {
  // Its work on the wrong copy is dropped and it gets the gateway's copy
  // again; the mismatch is counted.
  PCP_DILOCO_ON_PARAM_MISMATCH_RESYNC = 0,
  PCP_DILOCO_ON_PARAM_MISMATCH_FAIL = 1,  // the job fails naming both hashes
} pcp_diloco_on_param_mismatch_t;

typedef enum pcp_diloco_model_kind_e {
  PCP_DILOCO_MODEL_NONE = 0,  // not a built-in (invalid in a spec)
  PCP_DILOCO_MODEL_GPT = 1,
  PCP_DILOCO_MODEL_NANOCHAT = 2,
  PCP_DILOCO_MODEL_QWEN3 = 3,
} pcp_diloco_model_kind_t;

// Built-in model spec (JSON object "model"); the alternative to model_path.
typedef struct pcp_diloco_model_spec_t {
  bool present;  // config OBJECT convention: first member
  int32_t kind;  // pcp_diloco_model_kind_t
  int64_t layers;
  int64_t heads;
  int64_t kv_heads;
  int64_t width;
  int64_t vocab;
  int64_t block_size;
  int64_t batch;
} pcp_diloco_model_spec_t;

// Streaming DiLoCo options (JSON object "streaming"; defaults reference
// s.1.2). |present| selects streaming DiLoCo.
typedef struct pcp_diloco_streaming_config_t {
  bool present;
  int64_t num_fragments;  // P, default 4
  int64_t inner_steps;    // H, default 100
  int64_t overlap_tau;    // default 1
  double alpha;           // default 0.5
} pcp_diloco_streaming_config_t;

// One experiment. Keys are upstream's flat keys (reference s.1.6), plus the
// built-in model spec, outer_learning_rate (default 0.7; upstream hardcodes
// it), checkpoint_every (upstream: 10), deltas_dtype and streaming.
typedef struct pcp_diloco_config_t {
  char* model_path;
  pcp_diloco_model_spec_t model;
  char* data_path;
  int32_t tokenizer;  // pcp_diloco_tokenizer_t
  int32_t sampling;   // pcp_diloco_sampling_t
  double learning_rate;
  int64_t tau;
  int64_t outer_loop_steps;
  double nesterov_momentum;
  double outer_learning_rate;
  int64_t max_epochs;
  int32_t dtype;  // pcp_diloco_dtype_t
  char* checkpoint_dir;
  int64_t checkpoint_every;
  bool resume;
  int64_t effective_batch_size;  // 0: unset (micro batch)
  int32_t deltas_dtype;          // pcp_diloco_wire_dtype_t
  pcp_diloco_streaming_config_t streaming;
  // Extra iree-compile flags for this job's programs (--iree-flag each;
  // pcp_compile_flag_check rules, at most PCP_COMPILE_MAX_EXTRA_FLAGS).
  pcp_string_list_t iree_flags;
  int32_t lr_schedule;   // pcp_diloco_lr_schedule_kind_t
  int64_t warmup_steps;  // inner steps of linear warmup
  double min_lr;         // cosine's final rate
  int32_t inner_state;   // pcp_diloco_inner_state_t
  double eval_fraction;  // held-out tail of the data (0: no validation)
  int64_t eval_every;    // outer steps (streaming: syncs) between evals
  int64_t eval_batches;  // fixed held-out batches per evaluation
  // pcp_diloco_on_param_mismatch_t
  int32_t on_param_mismatch;
  // Ours beside upstream's keys: the job's display and served-model name
  // (NULL: the job id) and the seed of every random draw (init, batches,
  // the held-out set).
  char* name;
  int64_t seed;
  // The worker class the job runs on (NULL: every worker): its rounds,
  // evaluations and worker waits use only workers started with that
  // --worker-class (pcp_sched_class_name_is_valid).
  char* worker_class;
  // The worker class that serves the job's exports (their model.json's
  // "worker_class"; NULL: every worker), so a checkpoint being served does
  // not put decode steps on the training workers.
  char* serve_worker_class;
} pcp_diloco_config_t;

// The table (defaults, bounds, help). Cross-field rules: exactly one of
// model_path and model; effective_batch_size a multiple of model.batch;
// streaming.overlap_tau < streaming.inner_steps; warmup_steps only with a
// warmup schedule; min_lr only with cosine and at most learning_rate.
const pcp_config_table_t* pcp_diloco_config_table(void);

// Initializes |out_config| with defaults, applies the JSON text and
// validates. Unknown keys go to |out_unknown_keys| (optional; not an error).
// INVALID_ARGUMENT names the offending key. On failure the config is left
// deinitialized. Thread-compatible.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_config_parse_json(
    const char* text, size_t byte_length, pcp_diloco_config_t* out_config,
    pcp_string_list_t* out_unknown_keys);
void pcp_diloco_config_deinitialize(pcp_diloco_config_t* config);

//===----------------------------------------------------------------------===//
// Inner learning-rate schedule
//===----------------------------------------------------------------------===//

// The rate of inner step |t| (0-based over a worker's inner steps; classic:
// outer_step * tau + i, streaming: local step - 1) of |total_steps|:
//   warmup (cosine, warmup_constant): t < W: base * (t + 1) / W, so the
//     rate climbs linearly from near 0 and step W-1 runs at |base|;
//   cosine, t >= W: min + (base - min) * (1 + cos(pi * p)) / 2 with
//     p = (t - W) / (total - 1 - W) clamped to [0, 1] (p = 1 at the last
//     step, which runs at |min_lr|);
//   constant (and warmup_constant after W): base.
// Computed in double, returned as f32 (the program's type).
typedef struct pcp_diloco_lr_schedule_t {
  pcp_diloco_lr_schedule_kind_t kind;
  double base;  // learning_rate
  double min_lr;
  uint64_t warmup_steps;
  uint64_t total_steps;
} pcp_diloco_lr_schedule_t;

// The schedule of |config| over |total_steps| inner steps.
void pcp_diloco_lr_schedule_initialize(const pcp_diloco_config_t* config,
                                       uint64_t total_steps,
                                       pcp_diloco_lr_schedule_t* out_schedule);
float pcp_diloco_lr_schedule_at(const pcp_diloco_lr_schedule_t* schedule,
                                uint64_t t);
// out_rates[i] = the rate of step first_step + i, i < count.
void pcp_diloco_lr_schedule_fill(const pcp_diloco_lr_schedule_t* schedule,
                                 uint64_t first_step, size_t count,
                                 float* out_rates);

//===----------------------------------------------------------------------===//
// Outer step (classic DiLoCo)
//===----------------------------------------------------------------------===//

// Worker pseudo-gradient, upstream sign: delta = theta_initial - theta_final
// (the global params the round started from minus the worker's params after
// tau inner steps; a positive delta means "move down").
void pcp_diloco_delta_compute(const float* theta_global,
                              const float* theta_local, size_t count,
                              float* out_delta);

// bf16 wire format, round to nearest even (upstream truncates; see
// docs/decisions.md). NaN stays NaN. |out| must not alias |values|.
void pcp_diloco_bf16_quantize(const float* values, size_t count, uint16_t* out);
void pcp_diloco_bf16_dequantize(const uint16_t* values, size_t count,
                                float* out);

// Sum of the deltas that arrived this round; a worker that never reports is
// simply not added, so the average weighs the |contributor_count| reporters.
typedef struct pcp_diloco_accumulator_t {
  pcp_allocator_t allocator;
  float* sum;  // f32 accumulator, as upstream
  size_t count;
  uint32_t contributor_count;
} pcp_diloco_accumulator_t;

// RESOURCE_EXHAUSTED when the allocation fails.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_accumulator_initialize(pcp_allocator_t allocator, size_t count,
                                  pcp_diloco_accumulator_t* out_accumulator);
void pcp_diloco_accumulator_deinitialize(pcp_diloco_accumulator_t* accumulator);
// Zeroes the sum and the contributor count (start of a round).
void pcp_diloco_accumulator_reset(pcp_diloco_accumulator_t* accumulator);
// Adds one worker's delta (f32, or bf16 widened exactly).
// INVALID_ARGUMENT when |count| differs from the accumulator's.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_accumulator_add_f32(
    pcp_diloco_accumulator_t* accumulator, const float* delta, size_t count);
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_accumulator_add_bf16(
    pcp_diloco_accumulator_t* accumulator, const uint16_t* delta, size_t count);
// out_average = sum / contributor_count; a NaN/Inf element becomes 0 (as
// upstream) and is counted in |out_nonfinite_count| (optional).
// FAILED_PRECONDITION when no worker reported (the caller skips the step).
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_accumulator_average(const pcp_diloco_accumulator_t* accumulator,
                               float* out_average, size_t* out_nonfinite_count);

// DDP's gradient average (aggregation_strategy "ddp"): out[e] = (in[0][e]
// + ... + in[count-1][e]) / count, summed in f32 in the order given (the
// workers' id order, so NumPy repeats it bit for bit) and divided, not
// multiplied by 1/count. |out| may not alias an input. Unlike the DiLoCo
// accumulator a non-finite element is not zeroed: a NaN or Inf gradient
// means training diverged, and every worker applying a silently zeroed
// step would hide it; OUT_OF_RANGE names the first such element and the
// input holding it (|out| is then partly written). INVALID_ARGUMENT for
// no inputs.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_gradient_average(
    const float* const* inputs, uint32_t count, size_t length, float* out);

// Host Nesterov outer optimizer (reference s.1.1), velocity starts at zero:
//   v <- mu*v + g ;  theta <- theta - lr*(g + mu*v)
typedef struct pcp_diloco_nesterov_t {
  pcp_allocator_t allocator;
  float learning_rate;
  float momentum;
  float* velocity;  // count elements; serialized in checkpoints
  size_t count;
} pcp_diloco_nesterov_t;

// RESOURCE_EXHAUSTED when the allocation fails.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_nesterov_initialize(
    pcp_allocator_t allocator, size_t count, float learning_rate,
    float momentum, pcp_diloco_nesterov_t* out_nesterov);
void pcp_diloco_nesterov_deinitialize(pcp_diloco_nesterov_t* nesterov);
// Updates elements [offset, offset+count) of the velocity and |theta| (that
// range of the parameter vector, e.g. one named tensor) with the averaged
// delta |g|. OUT_OF_RANGE when the range passes the end.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_nesterov_step(pcp_diloco_nesterov_t* nesterov, size_t offset,
                         size_t count, const float* g, float* theta);

//===----------------------------------------------------------------------===//
// Streaming DiLoCo
//===----------------------------------------------------------------------===//

// Strided fragments: tensor i belongs to fragment i mod P.
static inline uint32_t pcp_streaming_diloco_fragment_of(uint32_t tensor_index,
                                                        uint32_t fragments) {
  return tensor_index % fragments;
}

typedef struct pcp_streaming_diloco_schedule_t {
  uint32_t fragments;    // P >= 1
  uint32_t inner_steps;  // H >= 1
  uint32_t overlap_tau;  // steps between a send and its receive
  uint32_t max_rounds;   // rounds per fragment (upstream: max_epochs)
} pcp_streaming_diloco_schedule_t;

// phase(p) = floor(p*H/P): fragment p's offset inside the H-step period.
uint64_t pcp_streaming_diloco_phase(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment);
// Local steps a worker runs: max_rounds*H + phase(P-1) + overlap_tau.
uint64_t pcp_streaming_diloco_max_steps(
    const pcp_streaming_diloco_schedule_t* schedule);
// After the compute of local step |step| (1-based): does |fragment| send its
// delta? t > phase, (t - phase) mod H == 0 and round
// r = (t - phase)/H - 1 < max_rounds; |out_round| (optional) receives r.
bool pcp_streaming_diloco_sends_at(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment,
    uint64_t step, uint32_t* out_round);
// Before the compute of step |step|: does |fragment| receive (and mix) its
// synced values? The send rule shifted by overlap_tau.
bool pcp_streaming_diloco_receives_at(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment,
    uint64_t step, uint32_t* out_round);

// Worker send: delta = snapshot - current, then snapshot = current.
void pcp_streaming_diloco_fragment_delta(float* inout_snapshot,
                                         const float* current, size_t count,
                                         float* out_delta);
// Worker receive: theta = alpha*theta_local + (1-alpha)*theta_global, and
// snapshot = the mixed value.
void pcp_streaming_diloco_mix(float alpha, const float* theta_global,
                              float* inout_theta_local, float* out_snapshot,
                              size_t count);

//===----------------------------------------------------------------------===//
// Checkpoint state
//===----------------------------------------------------------------------===//

// Format (little-endian; docs/training.md):
//   "PCPDLCK1" | u32 version=1 | u32 tensor_count | u64 outer_step |
//   u64 rng[4] | u64 cursor_bytes | tensor_count x u64 elements |
//   params f32[N] | velocity f32[N] | cursor bytes | SHA-256 of all before.
#define PCP_DILOCO_CHECKPOINT_VERSION 1u
#define PCP_DILOCO_CHECKPOINT_MAX_TENSORS 65536u
#define PCP_DILOCO_CHECKPOINT_MAX_BYTES ((size_t)16 << 30)

// Borrowed arrays when saving; owned (one allocation each) after a load.
typedef struct pcp_diloco_checkpoint_t {
  uint64_t outer_step;
  pcp_rng_t rng;
  uint32_t tensor_count;
  uint64_t* tensor_elements;  // tensor_count element counts
  size_t parameter_count;     // sum of tensor_elements
  float* parameters;
  float* velocity;  // outer momentum, parameter_count
  uint8_t* cursor;  // opaque data cursor (src/data)
  size_t cursor_byte_length;
} pcp_diloco_checkpoint_t;

// Serializes |checkpoint| into a malloc'd buffer (caller frees).
// INVALID_ARGUMENT when the element counts do not sum to parameter_count.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_checkpoint_serialize(const pcp_diloco_checkpoint_t* checkpoint,
                                void** out_data, size_t* out_byte_length);
// Parses and verifies (SHA-256 first, then magic, version, lengths).
// DATA_LOSS on a corrupted or truncated image. |out_checkpoint| owns its
// arrays; release with pcp_diloco_checkpoint_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_checkpoint_deserialize(const void* data, size_t byte_length,
                                  pcp_diloco_checkpoint_t* out_checkpoint);
// Frees what deserialize/load allocated (not for borrowed views).
void pcp_diloco_checkpoint_deinitialize(pcp_diloco_checkpoint_t* checkpoint);
// Serialize + pcp_file_write_atomic (temp file, fsync, rename).
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_checkpoint_save(
    const pcp_diloco_checkpoint_t* checkpoint, const char* path);
// Read + deserialize; NOT_FOUND / DATA_LOSS / errno codes.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_checkpoint_load(
    const char* path, pcp_diloco_checkpoint_t* out_checkpoint);
// Serialize + pcp_store_checkpoint_write at step = outer_step (atomic file,
// index row with its SHA-256). Thread-safe as the store is.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_checkpoint_store_write(
    const pcp_diloco_checkpoint_t* checkpoint, pcp_store_t* store,
    const char* job_id, pcp_store_checkpoint_t* out_row);

//===----------------------------------------------------------------------===//
// Wire accounting
//===----------------------------------------------------------------------===//

// Bytes per element of a wire dtype (4 or 2).
size_t pcp_diloco_wire_dtype_size(pcp_diloco_wire_dtype_t dtype);
// Classic DiLoCo, one outer step: every worker sends its delta up and gets
// the params down: workers * parameter_count * (up_size + down_size).
uint64_t pcp_diloco_outer_step_wire_bytes(uint64_t parameter_count,
                                          uint32_t workers,
                                          pcp_diloco_wire_dtype_t up_dtype,
                                          pcp_diloco_wire_dtype_t down_dtype);
// Streaming DiLoCo, one sync of a fragment of |fragment_elements|:
// workers * fragment_elements * (up_size + 4) (masters go down as f32).
uint64_t pcp_streaming_diloco_fragment_wire_bytes(
    uint64_t fragment_elements, uint32_t workers,
    pcp_diloco_wire_dtype_t up_dtype);
// Data-parallel baseline over |steps| inner steps: a ring all-reduce moves
// 2(W-1)/W of the f32 parameter bytes per worker per step; the total over
// the W workers, 2(W-1) * 4 * parameter_count * steps, is returned.
uint64_t pcp_diloco_ring_allreduce_wire_bytes(uint64_t parameter_count,
                                              uint32_t workers, uint64_t steps);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_TRAIN_DILOCO_H_
