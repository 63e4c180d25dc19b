// SPDX-License-Identifier: Apache-2.0
//
// models: built-in transformer architectures emitted as StableHLO MLIR text.
//
// Three architectures (docs/models.md has the full description):
//   GPT       nanoGPT style: learned token and position embeddings, pre-
//             LayerNorm blocks (weight and bias), fused qkv projection with
//             bias, causal multi-head attention, GELU (tanh approximation)
//             MLP, final LayerNorm, LM head tied to the token embedding.
//   NANOCHAT  nanochat style: no biases and no learned norm weights
//             (parameter-free RMSNorm), RoPE, parameter-free q/k RMSNorm,
//             ReLU^2 MLP, untied LM head, logits soft-capped at 15.
//   QWEN3     Hugging Face Qwen3: RMSNorm with weights, RoPE (theta
//             configurable), grouped-query attention, per-head q/k RMSNorm,
//             SwiGLU MLP, untied or tied LM head.
//
// An emitted module holds two public functions with the same parameters:
//   @main(params..., %input_ids: tensor<BxTxi32>, %targets: tensor<BxTxi32>)
//       -> tensor<f32>                  mean next-token cross-entropy
//   @logits(params..., %input_ids: tensor<BxTxi32>) -> tensor<BxTxVxf32>
// Parameters come first, in the order of the parameter table (the PyTorch
// named_parameters() order of the reference implementation, upstream's
// exporter contract), named like the reference checkpoints so safetensors
// files map onto them by name. Each function body is self-contained (no
// func.call), because autodiff works on one function at a time.
//
// dtype: F32 or BF16. In BF16 the parameters and activations are bf16;
// norms, softmax, RoPE and the loss are computed in f32 and the logits are
// returned in f32 (docs/models.md, "Precision").
//
// Threading: every function is thread-safe (no global state).
// Ownership: tables and builders are caller-owned; nothing is retained.

#ifndef PCP_MODELS_MODELS_H_
#define PCP_MODELS_MODELS_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Model specification
//===----------------------------------------------------------------------===//

// Numbers are stable: they may be stored in job specs and checkpoints.
typedef enum pcp_models_architecture_e {
  PCP_MODELS_ARCHITECTURE_GPT = 0,
  PCP_MODELS_ARCHITECTURE_NANOCHAT = 1,
  PCP_MODELS_ARCHITECTURE_QWEN3 = 2,
  PCP_MODELS_ARCHITECTURE_COUNT_ = 3,
} pcp_models_architecture_t;

// "gpt", "nanochat", "qwen3".
const char* pcp_models_architecture_name(pcp_models_architecture_t arch);
// INVALID_ARGUMENT listing the names when |name| is none of them.
PCP_MUST_USE_RESULT pcp_status_t pcp_models_architecture_parse(
    const char* name, pcp_models_architecture_t* out_arch);

// Bounds checked by pcp_models_spec_validate. They keep every element count
// and byte size far inside int64 and the emitted text small; none is a
// limit of the architectures.
#define PCP_MODELS_MAX_LAYERS 512
#define PCP_MODELS_MAX_HEADS 1024
#define PCP_MODELS_MAX_WIDTH 65536
#define PCP_MODELS_MAX_HEAD_DIM 1024
#define PCP_MODELS_MAX_MLP_HIDDEN 262144
#define PCP_MODELS_MAX_VOCAB 1048576
#define PCP_MODELS_MAX_BLOCK_SIZE 131072
#define PCP_MODELS_MAX_BATCH 65536
// Largest single activation tensor (elements) a module may need, e.g. the
// B x T x V logits or the B x H x T x T attention scores.
#define PCP_MODELS_MAX_TENSOR_ELEMENTS ((int64_t)1 << 40)

typedef struct pcp_models_spec_t {
  pcp_models_architecture_t architecture;
  int64_t layers;
  int64_t heads;
  // Key/value heads (grouped-query attention: heads % kv_heads == 0).
  // 0 means |heads|. GPT has no separate k/v heads: must equal |heads|.
  int64_t kv_heads;
  int64_t width;  // d_model
  // Per-head size. 0 means width / heads (width % heads == 0 then). Only
  // QWEN3 and NANOCHAT accept another value (Qwen3-0.6B uses 128 with width
  // 1024 and 16 heads); GPT's fused qkv needs heads * head_dim == width.
  int64_t head_dim;
  // MLP hidden size. 0 means 4 * width (GPT, NANOCHAT) or 3 * width (QWEN3,
  // the ratio of Qwen3-8B: 12288 / 4096).
  int64_t mlp_hidden;
  int64_t vocab;
  int64_t block_size;        // T: sequence length of input_ids and targets
  int64_t batch;             // B
  pcp_element_type_t dtype;  // F32 or BF16
  // QWEN3 only: logits = h @ embed_tokens^T, no lm_head.weight. GPT is
  // always tied and NANOCHAT never (as their references).
  bool tie_embeddings;
  // RoPE base. 0 means the reference default: 10000 (NANOCHAT), 1000000
  // (QWEN3). Ignored by GPT.
  double rope_theta;
} pcp_models_spec_t;

// Fills |out_spec| with a small default model of |arch| (2 layers, 4 heads,
// width 128, vocab 65, block 64, batch 8, f32; QWEN3 with 2 kv heads).
void pcp_models_spec_initialize(pcp_models_architecture_t arch,
                                pcp_models_spec_t* out_spec);

// Checks bounds and divisibility; INVALID_ARGUMENT with one line naming the
// field and the rule ("width 130 is not a multiple of heads 4").
PCP_MUST_USE_RESULT pcp_status_t
pcp_models_spec_validate(const pcp_models_spec_t* spec);

// Resolved sizes (defaults applied). Valid only for a validated spec.
int64_t pcp_models_spec_kv_heads(const pcp_models_spec_t* spec);
int64_t pcp_models_spec_head_dim(const pcp_models_spec_t* spec);
int64_t pcp_models_spec_mlp_hidden(const pcp_models_spec_t* spec);
double pcp_models_spec_rope_theta(const pcp_models_spec_t* spec);

//===----------------------------------------------------------------------===//
// Parameter table
//===----------------------------------------------------------------------===//

// How pcp_models_parameters_initialize fills a parameter.
typedef enum pcp_models_init_e {
  PCP_MODELS_INIT_NORMAL = 0,  // N(0, 0.02^2): weights and embeddings
  PCP_MODELS_INIT_ONES = 1,    // norm weights
  PCP_MODELS_INIT_ZEROS = 2,   // biases
} pcp_models_init_t;

#define PCP_MODELS_MAX_NAME_LENGTH 96
#define PCP_MODELS_INIT_STDDEV 0.02

typedef struct pcp_models_parameter_t {
  // Hugging Face / reference checkpoint name, e.g.
  // "model.layers.0.self_attn.q_proj.weight".
  char name[PCP_MODELS_MAX_NAME_LENGTH];
  // 1 or 2 for the built-ins; a table the training service builds from a
  // foreign module's signature (model_path) may hold any rank up to
  // PCP_MAX_TENSOR_RANK.
  int32_t rank;
  // Linear weights are [out_features, in_features] (torch nn.Linear).
  int64_t dims[PCP_MAX_TENSOR_RANK];
  pcp_element_type_t element_type;  // the spec's dtype
  pcp_models_init_t init;
  int64_t element_count;
  size_t byte_length;
} pcp_models_parameter_t;

// The parameters of one spec, in @main / @logits argument order.
typedef struct pcp_models_parameter_table_t {
  pcp_allocator_t allocator;
  size_t count;
  pcp_models_parameter_t* parameters;
  int64_t total_elements;
  uint64_t total_byte_length;
} pcp_models_parameter_table_t;

// Builds the table of |spec| (validated first: its status on failure).
// Release with pcp_models_parameter_table_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_models_parameter_table_initialize(
    const pcp_models_spec_t* spec, pcp_allocator_t allocator,
    pcp_models_parameter_table_t* out_table);
void pcp_models_parameter_table_deinitialize(
    pcp_models_parameter_table_t* table);

// Index of the parameter named |name|, or -1.
int64_t pcp_models_parameter_table_find(
    const pcp_models_parameter_table_t* table, const char* name);

// Appends the table as JSON:
//   {"architecture": "qwen3", "dtype": "f32", "parameter_count": N,
//    "spec": {...}, "parameters": [{"index": 0, "name": "...",
//    "shape": [V, D], "dtype": "f32", "init": "normal"}, ...],
//    "data_inputs": [{"name": "input_ids", "shape": [B, T], "dtype": "i32"},
//                    {"name": "targets", ...}]}
PCP_MUST_USE_RESULT pcp_status_t pcp_models_parameter_table_format_json(
    const pcp_models_spec_t* spec, const pcp_models_parameter_table_t* table,
    pcp_string_builder_t* builder);

// Fills |buffers[i]| (|table->parameters[i].byte_length| bytes each, in the
// parameter's dtype; bf16 rounded to nearest even from f32) with the
// deterministic initial values for |seed|. Each parameter draws from its own
// generator seeded from (|seed|, index), so a parameter's values do not
// depend on the sizes of the others. Thread-safe.
void pcp_models_parameters_initialize(const pcp_models_parameter_table_t* table,
                                      uint64_t seed, void* const* buffers);

// Fills |buffer| (|element_count| elements of |element_type|: bf16, else
// f32) with the initial values of parameter |index| under |seed| and
// |init|, exactly as pcp_models_parameters_initialize does for that
// parameter (it calls this). A worker materializes a seeded @init input
// with it (tensor ref "init", docs/protocol.md). Thread-safe.
void pcp_models_parameter_fill(pcp_models_init_t init, uint64_t seed,
                               uint64_t index, pcp_element_type_t element_type,
                               int64_t element_count, void* buffer);

//===----------------------------------------------------------------------===//
// Emitting
//===----------------------------------------------------------------------===//

// Appends the MLIR text of the module for |spec| (validated first) to
// |builder|: `module @pcp_<arch> { func.func @main ... func.func @logits }`.
// The text is deterministic: the same spec gives the same bytes (artifact
// cache keys depend on it), whichever compiler built pcp (every op is
// emitted in statement order, never from unordered argument evaluation).
// RESOURCE_EXHAUSTED when the builder's cap is reached or its allocator
// fails (scratch memory comes from the builder's allocator too).
PCP_MUST_USE_RESULT pcp_status_t pcp_models_module_emit(
    const pcp_models_spec_t* spec, pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// safetensors
//===----------------------------------------------------------------------===//
//
// The Hugging Face safetensors format: an 8-byte little-endian header length
// N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [b, e]},
// "__metadata__": {str: str}}, padded with spaces), then the data region.
// Offsets are relative to the data region; the tensors must tile it exactly
// (sorted by offset: no gap, no overlap, the last one ends at the file end),
// as the reference reader requires. Files are memory-mapped read-only and
// tensors are zero-copy views into the mapping.
//
// Files must not be truncated or rewritten in place while open (a mapped
// page that no longer exists is SIGBUS); PCP's writer replaces files by
// rename, which leaves an open mapping intact.
//
// Threading: a file or checkpoint is immutable after open: its accessors are
// thread-safe; open/release are thread-compatible.
// Ownership: names, metadata and views are borrowed from the file and live
// until it is released.

// Header cap (the reference reader's limit is also 100 MB): checked against
// the file size and this cap before anything is allocated.
#define PCP_SAFETENSORS_MAX_HEADER_BYTES ((uint64_t)100 << 20)
#define PCP_SAFETENSORS_MAX_SHARDS 4096

typedef struct pcp_safetensors_tensor_t {
  const char* name;  // NUL-terminated, borrowed
  pcp_element_type_t element_type;
  int32_t rank;
  int64_t dims[PCP_MAX_TENSOR_RANK];
  int64_t element_count;
  // Zero-copy view into the mapping. Not aligned beyond what the file gives
  // (offsets need not be multiples of the element size): copy with memcpy.
  const void* data;
  size_t byte_length;
} pcp_safetensors_tensor_t;

typedef struct pcp_safetensors_file_t pcp_safetensors_file_t;

// Maps and validates |path|. INVALID_ARGUMENT naming the file and the
// problem for any malformed header (truncated, length beyond the file, bad
// JSON, bad dtype/shape/offsets, size mismatch, overlap or gap);
// UNIMPLEMENTED for dtypes of the format we do not support (F8_*, ...);
// RESOURCE_EXHAUSTED for a header over the cap; NOT_FOUND / errno statuses
// when the file cannot be opened. Release with pcp_safetensors_file_release.
PCP_MUST_USE_RESULT pcp_status_t
pcp_safetensors_file_open(const char* path, pcp_allocator_t allocator,
                          pcp_safetensors_file_t** out_file);
// Same validation over bytes in memory (fuzzing, tests). |data| is borrowed
// and must outlive the file.
PCP_MUST_USE_RESULT pcp_status_t pcp_safetensors_file_parse(
    const void* data, size_t byte_length, pcp_allocator_t allocator,
    pcp_safetensors_file_t** out_file);
void pcp_safetensors_file_release(pcp_safetensors_file_t* file);

// Tensors in header order (the JSON object's key order).
size_t pcp_safetensors_file_tensor_count(const pcp_safetensors_file_t* file);
const pcp_safetensors_tensor_t* pcp_safetensors_file_tensor(
    const pcp_safetensors_file_t* file, size_t index);
// NULL when absent.
const pcp_safetensors_tensor_t* pcp_safetensors_file_find(
    const pcp_safetensors_file_t* file, const char* name);
// Value of |key| in "__metadata__", or NULL.
const char* pcp_safetensors_file_metadata(const pcp_safetensors_file_t* file,
                                          const char* key);

// One tensor to write: the view's bytes are copied to the file as they are.
// Writes |path| atomically (temp file, fsync, rename): header JSON with
// sorted keys padded with spaces to a multiple of 8 bytes (so the data
// region is 8-byte aligned), then the tensors back to back in |tensors|
// order. |metadata| holds |metadata_count| key/value pairs (2 * count
// strings). INVALID_ARGUMENT for duplicate or empty names, a size that does
// not match dtype x shape, or a dtype the format cannot express.
PCP_MUST_USE_RESULT pcp_status_t pcp_safetensors_write(
    const char* path, const pcp_safetensors_tensor_t* tensors,
    size_t tensor_count, const char* const* metadata, size_t metadata_count);

// A checkpoint: one .safetensors file, a sharded checkpoint's
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}, shard
// paths relative to the index), or a directory holding either (the index
// wins). Every weight_map entry must exist in its shard, and a tensor name
// may appear in one shard only.
typedef struct pcp_safetensors_checkpoint_t pcp_safetensors_checkpoint_t;

PCP_MUST_USE_RESULT pcp_status_t
pcp_safetensors_checkpoint_open(const char* path, pcp_allocator_t allocator,
                                pcp_safetensors_checkpoint_t** out_checkpoint);
void pcp_safetensors_checkpoint_release(
    pcp_safetensors_checkpoint_t* checkpoint);
// All tensors over all shards (shard order, then header order).
size_t pcp_safetensors_checkpoint_tensor_count(
    const pcp_safetensors_checkpoint_t* checkpoint);
const pcp_safetensors_tensor_t* pcp_safetensors_checkpoint_tensor(
    const pcp_safetensors_checkpoint_t* checkpoint, size_t index);
const pcp_safetensors_tensor_t* pcp_safetensors_checkpoint_find(
    const pcp_safetensors_checkpoint_t* checkpoint, const char* name);

// Loads |checkpoint| into the parameters of |table| (names as the Hugging
// Face checkpoints spell them, e.g. Qwen3's model.layers.N.mlp.up_proj.weight):
// each |buffers[i]| receives |table->parameters[i].byte_length| bytes in the
// parameter's dtype, converted from F32, BF16 or F16 (bf16 rounded to nearest
// even). Errors name the tensor: NOT_FOUND when a parameter is missing,
// INVALID_ARGUMENT for a wrong shape, an unconvertible dtype or an unexpected
// tensor. Tied embeddings: a checkpoint's lm_head.weight is accepted (and
// ignored) when the table has none, and when the table has lm_head.weight
// and the checkpoint does not, |tie_word_embeddings| (config.json's flag)
// fills it from model.embed_tokens.weight. Buffers of rotary_emb.inv_freq
// (older exports) are ignored. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_models_safetensors_load(const pcp_models_parameter_table_t* table,
                            const pcp_safetensors_checkpoint_t* checkpoint,
                            bool tie_word_embeddings, void* const* buffers);

// Writes the parameters of |table| (|buffers[i]| in the parameter's dtype)
// as one .safetensors file with the table's names.
PCP_MUST_USE_RESULT pcp_status_t
pcp_models_safetensors_save(const pcp_models_parameter_table_t* table,
                            const void* const* buffers, const char* path);

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

// `pcp model gpt|nanochat|qwen3 --layers N --heads N [--kv-heads N]
//  --width N [--mlp-hidden N] --vocab N --block-size T --batch B
//  [--dtype f32|bf16] -o m.mlir [--params-json p.json] [--init-dir DIR
//  [--seed N]]` (argv[0] = "model"). Prints the parameter count; --init-dir
// writes pcp_models_parameters_initialize's values, one file per tensor.
// Returns 0, 1 when a file cannot be written, 2 on usage errors (bounds,
// divisibility).
int pcp_models_cli_main(int argc, char** argv);

//===----------------------------------------------------------------------===//
// Generation (KV-cache prefill and decode)
//===----------------------------------------------------------------------===//
//
// A generation module holds three functions over the same parameters as
// @main (the table of the spec; the spec's batch is ignored): @load(params)
// -> (params..., k_cache, v_cache) returns the parameters as they came and
// two zeroed caches (a server keeps them resident on a worker), and
//   @prefill(params..., %input_ids: tensor<SLOTSxPxi32>,
//            %positions: tensor<SLOTSxi32>, %lengths: tensor<SLOTSxi32>,
//            %k_cache, %v_cache) -> (tensor<SLOTSxVxf32>, k_cache', v_cache')
//   @decode(params..., %input_ids: tensor<SLOTSx1xi32>,
//           %positions: tensor<SLOTSxi32>, %k_cache, %v_cache)
//       -> (tensor<SLOTSxVxf32>, k_cache', v_cache')
// Caches are tensor<LAYERS x SLOTS x KV_HEADS x MAX_LENGTH x HEAD_DIM> in
// the spec's dtype, one for keys and one for values; a session owns one slot
// (the batch index). |positions[b]| is the number of tokens already in slot
// b's cache: token s of this call sits at position positions[b] + s, is
// written to cache row positions[b] + s and attends to rows <= that
// position, so slots at different lengths run in one call. @prefill writes
// only the first |lengths[b]| tokens of each row (0 leaves a slot's cache
// untouched) and returns the logits of token lengths[b] - 1 (zeros for
// length 0); @decode writes one token per slot and returns its logits. Rows
// past a slot's position are masked, never read. Tokens beyond MAX_LENGTH
// are the caller's error (they are not written and not seen).

typedef struct pcp_models_generation_t {
  int64_t slots;           // cache batch dimension (concurrent sessions)
  int64_t max_length;      // cache rows per slot (prompt + generated)
  int64_t prefill_length;  // P: tokens per @prefill call (<= max_length)
} pcp_models_generation_t;

// INVALID_ARGUMENT naming the field: bounds, prefill_length <= max_length,
// GPT's max_length <= block_size (its learned position table).
PCP_MUST_USE_RESULT pcp_status_t pcp_models_generation_validate(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen);

// Bytes of one slot's k and v caches: 2 x layers x kv_heads x max_length x
// head_dim x dtype size. Valid only after validation.
uint64_t pcp_models_generation_cache_byte_length(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen);

// Appends `module @pcp_<arch>_generate { @prefill @decode @load }`
// (deterministic text, as pcp_models_module_emit). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_models_generation_module_emit(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen,
    pcp_string_builder_t* builder);

// Greedy selection: the first index of the largest logit. Thread-safe.
int32_t pcp_models_logits_argmax(const float* logits, int64_t vocab);

#ifdef __cplusplus
}
#endif

#endif  // PCP_MODELS_MODELS_H_
