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
  int32_t rank;  // 1 or 2
  // Linear weights are [out_features, in_features] (torch nn.Linear).
  int64_t dims[2];
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

//===----------------------------------------------------------------------===//
// Emitting
//===----------------------------------------------------------------------===//

// Appends the MLIR text of the module for |spec| (validated first) to
// |builder|: `module @pcp_<arch> { func.func @main ... func.func @logits }`.
// The text is deterministic: the same spec gives the same bytes (artifact
// cache keys depend on it), whichever compiler built pcp (every op is
// emitted in statement order, never from unordered argument evaluation).
// RESOURCE_EXHAUSTED when the builder's cap is reached.
PCP_MUST_USE_RESULT pcp_status_t pcp_models_module_emit(
    const pcp_models_spec_t* spec, pcp_string_builder_t* builder);

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

#ifdef __cplusplus
}
#endif

#endif  // PCP_MODELS_MODELS_H_
