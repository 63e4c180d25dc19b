// SPDX-License-Identifier: Apache-2.0
// Model specs, parameter tables and deterministic initial values.

#include "models/models.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/models_impl.h"

static const char* const kArchitectureNames[PCP_MODELS_ARCHITECTURE_COUNT_] = {
    "gpt", "nanochat", "qwen3"};

const char* pcp_models_architecture_name(pcp_models_architecture_t arch) {
  if ((int)arch < 0 || arch >= PCP_MODELS_ARCHITECTURE_COUNT_) {
    return "unknown";
  }
  return kArchitectureNames[arch];
}

pcp_status_t pcp_models_architecture_parse(
    const char* name, pcp_models_architecture_t* out_arch) {
  for (int i = 0; i < PCP_MODELS_ARCHITECTURE_COUNT_; ++i) {
    if (name && strcmp(name, kArchitectureNames[i]) == 0) {
      *out_arch = (pcp_models_architecture_t)i;
      return pcp_ok_status();
    }
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "unknown model '%s' (expected gpt, nanochat or qwen3)",
                         name ? name : "");
}

void pcp_models_spec_initialize(pcp_models_architecture_t arch,
                                pcp_models_spec_t* out_spec) {
  memset(out_spec, 0, sizeof(*out_spec));
  out_spec->architecture = arch;
  out_spec->layers = 2;
  out_spec->heads = 4;
  out_spec->kv_heads = arch == PCP_MODELS_ARCHITECTURE_QWEN3 ? 2 : 0;
  out_spec->width = 128;
  out_spec->vocab = 65;
  out_spec->block_size = 64;
  out_spec->batch = 8;
  out_spec->dtype = PCP_ELEMENT_TYPE_F32;
  out_spec->tie_embeddings = arch == PCP_MODELS_ARCHITECTURE_GPT;
}

int64_t pcp_models_spec_kv_heads(const pcp_models_spec_t* spec) {
  return spec->kv_heads ? spec->kv_heads : spec->heads;
}

int64_t pcp_models_spec_head_dim(const pcp_models_spec_t* spec) {
  return spec->head_dim ? spec->head_dim : spec->width / spec->heads;
}

int64_t pcp_models_spec_mlp_hidden(const pcp_models_spec_t* spec) {
  if (spec->mlp_hidden) {
    return spec->mlp_hidden;
  }
  return spec->architecture == PCP_MODELS_ARCHITECTURE_QWEN3 ? 3 * spec->width
                                                             : 4 * spec->width;
}

double pcp_models_spec_rope_theta(const pcp_models_spec_t* spec) {
  if (spec->rope_theta > 0) {
    return spec->rope_theta;
  }
  return spec->architecture == PCP_MODELS_ARCHITECTURE_QWEN3 ? 1000000.0
                                                             : 10000.0;
}

static pcp_status_t check_range(const char* what, int64_t value, int64_t min,
                                int64_t max) {
  if (value < min || value > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s %lld is out of range [%lld, %lld]", what,
                           (long long)value, (long long)min, (long long)max);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_models_spec_validate(const pcp_models_spec_t* spec) {
  if ((int)spec->architecture < 0 ||
      spec->architecture >= PCP_MODELS_ARCHITECTURE_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unknown architecture %d", (int)spec->architecture);
  }
  const char* arch = pcp_models_architecture_name(spec->architecture);
  PCP_RETURN_IF_ERROR_BARE(
      check_range("layers", spec->layers, 1, PCP_MODELS_MAX_LAYERS));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("heads", spec->heads, 1, PCP_MODELS_MAX_HEADS));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("kv-heads", spec->kv_heads, 0, PCP_MODELS_MAX_HEADS));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("width", spec->width, 1, PCP_MODELS_MAX_WIDTH));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("head-dim", spec->head_dim, 0, PCP_MODELS_MAX_HEAD_DIM));
  PCP_RETURN_IF_ERROR_BARE(check_range("mlp-hidden", spec->mlp_hidden, 0,
                                       PCP_MODELS_MAX_MLP_HIDDEN));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("vocab", spec->vocab, 1, PCP_MODELS_MAX_VOCAB));
  PCP_RETURN_IF_ERROR_BARE(check_range("block-size", spec->block_size, 1,
                                       PCP_MODELS_MAX_BLOCK_SIZE));
  PCP_RETURN_IF_ERROR_BARE(
      check_range("batch", spec->batch, 1, PCP_MODELS_MAX_BATCH));
  if (spec->dtype != PCP_ELEMENT_TYPE_F32 &&
      spec->dtype != PCP_ELEMENT_TYPE_BF16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "dtype %s is not supported (f32 or bf16)",
                           pcp_element_type_name(spec->dtype));
  }
  int64_t kv_heads = pcp_models_spec_kv_heads(spec);
  if (kv_heads > spec->heads || spec->heads % kv_heads != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "heads %lld is not a multiple of kv-heads %lld",
                           (long long)spec->heads, (long long)kv_heads);
  }
  if (spec->head_dim == 0 && spec->width % spec->heads != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "width %lld is not a multiple of heads %lld",
                           (long long)spec->width, (long long)spec->heads);
  }
  int64_t head_dim = pcp_models_spec_head_dim(spec);
  if (head_dim > PCP_MODELS_MAX_HEAD_DIM) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "head size width/heads = %lld is over %d",
                           (long long)head_dim, PCP_MODELS_MAX_HEAD_DIM);
  }
  if (spec->architecture == PCP_MODELS_ARCHITECTURE_GPT) {
    // nanoGPT splits one fused c_attn output into three width-sized parts.
    if (kv_heads != spec->heads) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gpt has no grouped-query attention: kv-heads "
                             "%lld must equal heads %lld",
                             (long long)kv_heads, (long long)spec->heads);
    }
    if (head_dim * spec->heads != spec->width) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gpt needs heads * head-dim == width (%lld * "
                             "%lld != %lld)",
                             (long long)spec->heads, (long long)head_dim,
                             (long long)spec->width);
    }
  } else if (head_dim % 2 != 0) {
    // RoPE rotates the two halves of each head against each other.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s uses RoPE, which needs an even head size "
                           "(got %lld)",
                           arch, (long long)head_dim);
  }
  if (spec->architecture == PCP_MODELS_ARCHITECTURE_NANOCHAT &&
      spec->tie_embeddings) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "nanochat has an untied lm_head; tied embeddings "
                           "are for qwen3 (gpt is always tied)");
  }
  if (!(spec->rope_theta == 0 ||
        (isfinite(spec->rope_theta) && spec->rope_theta > 1))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rope-theta %g must be above 1 (0: default)",
                           spec->rope_theta);
  }
  // Largest activations: B*T*V logits, B*H*T*T scores, B*T*F MLP hidden.
  // Every factor is bounded above, so these products cannot overflow.
  int64_t tokens = spec->batch * spec->block_size;
  int64_t biggest[3] = {
      tokens * spec->vocab,
      spec->batch * spec->heads * spec->block_size * spec->block_size,
      tokens * pcp_models_spec_mlp_hidden(spec)};
  for (int i = 0; i < 3; ++i) {
    if (biggest[i] > PCP_MODELS_MAX_TENSOR_ELEMENTS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "an activation of %lld elements is over the "
                             "limit of %lld (reduce batch or block-size)",
                             (long long)biggest[i],
                             (long long)PCP_MODELS_MAX_TENSOR_ELEMENTS);
    }
  }
  if (pcp_models_spec_mlp_hidden(spec) > PCP_MODELS_MAX_MLP_HIDDEN) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mlp-hidden %lld (default from width) is over %d",
                           (long long)pcp_models_spec_mlp_hidden(spec),
                           PCP_MODELS_MAX_MLP_HIDDEN);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Parameter tables
//===----------------------------------------------------------------------===//

size_t pcp_models_parameter_count_of(const pcp_models_spec_t* spec) {
  size_t layers = (size_t)spec->layers;
  switch (spec->architecture) {
    case PCP_MODELS_ARCHITECTURE_GPT:
      return 2 + 12 * layers + 2;
    case PCP_MODELS_ARCHITECTURE_NANOCHAT:
      return 1 + 6 * layers + 1;
    case PCP_MODELS_ARCHITECTURE_QWEN3:
      return 1 + 11 * layers + 1 + (spec->tie_embeddings ? 0 : 1);
    default:
      return 0;
  }
}

typedef struct table_writer_t {
  pcp_models_parameter_table_t* table;
  pcp_element_type_t dtype;
} table_writer_t;

// Appends "<prefix><suffix>" with its shape; |d1| is ignored for rank 1.
static void add_param(table_writer_t* w, pcp_models_init_t init, int32_t rank,
                      int64_t d0, int64_t d1, const char* prefix,
                      const char* suffix) {
  pcp_models_parameter_table_t* t = w->table;
  pcp_models_parameter_t* p = &t->parameters[t->count++];
  int n = snprintf(p->name, sizeof(p->name), "%s%s", prefix, suffix);
  PCP_ASSERT(n > 0 && (size_t)n < sizeof(p->name));
  p->rank = rank;
  p->dims[0] = d0;
  p->dims[1] = rank == 2 ? d1 : 0;
  p->element_type = w->dtype;
  p->init = init;
  p->element_count = rank == 2 ? d0 * d1 : d0;
  p->byte_length =
      (size_t)p->element_count * pcp_element_type_byte_size(w->dtype);
  t->total_elements += p->element_count;
  t->total_byte_length += p->byte_length;
}

pcp_status_t pcp_models_parameter_table_initialize(
    const pcp_models_spec_t* spec, pcp_allocator_t allocator,
    pcp_models_parameter_table_t* out_table) {
  memset(out_table, 0, sizeof(*out_table));
  PCP_RETURN_IF_ERROR_BARE(pcp_models_spec_validate(spec));
  size_t capacity = pcp_models_parameter_count_of(spec);
  void* memory = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, capacity * sizeof(pcp_models_parameter_t),
                           &memory),
      "allocating the parameter table");
  out_table->allocator = allocator;
  out_table->parameters = memory;
  table_writer_t w = {.table = out_table, .dtype = spec->dtype};
  const int64_t d = spec->width, v = spec->vocab;
  const int64_t hd = pcp_models_spec_head_dim(spec);
  const int64_t q_out = spec->heads * hd;
  const int64_t kv_out = pcp_models_spec_kv_heads(spec) * hd;
  const int64_t f = pcp_models_spec_mlp_hidden(spec);
  const pcp_models_init_t kN = PCP_MODELS_INIT_NORMAL;
  const pcp_models_init_t k1 = PCP_MODELS_INIT_ONES;
  const pcp_models_init_t k0 = PCP_MODELS_INIT_ZEROS;
  switch (spec->architecture) {
    case PCP_MODELS_ARCHITECTURE_GPT:
      // nanoGPT's GPT.named_parameters() order; lm_head.weight is the same
      // tensor as wte and is not listed (weight tying).
      add_param(&w, kN, 2, v, d, "", "transformer.wte.weight");
      add_param(&w, kN, 2, spec->block_size, d, "", "transformer.wpe.weight");
      for (int64_t i = 0; i < spec->layers; ++i) {
        char layer[48];
        snprintf(layer, sizeof(layer), "%s.%lld.", "transformer.h",
                 (long long)i);
        add_param(&w, k1, 1, d, 0, layer, "ln_1.weight");
        add_param(&w, k0, 1, d, 0, layer, "ln_1.bias");
        add_param(&w, kN, 2, 3 * d, d, layer, "attn.c_attn.weight");
        add_param(&w, k0, 1, 3 * d, 0, layer, "attn.c_attn.bias");
        add_param(&w, kN, 2, d, d, layer, "attn.c_proj.weight");
        add_param(&w, k0, 1, d, 0, layer, "attn.c_proj.bias");
        add_param(&w, k1, 1, d, 0, layer, "ln_2.weight");
        add_param(&w, k0, 1, d, 0, layer, "ln_2.bias");
        add_param(&w, kN, 2, f, d, layer, "mlp.c_fc.weight");
        add_param(&w, k0, 1, f, 0, layer, "mlp.c_fc.bias");
        add_param(&w, kN, 2, d, f, layer, "mlp.c_proj.weight");
        add_param(&w, k0, 1, d, 0, layer, "mlp.c_proj.bias");
      }
      add_param(&w, k1, 1, d, 0, "", "transformer.ln_f.weight");
      add_param(&w, k0, 1, d, 0, "", "transformer.ln_f.bias");
      break;
    case PCP_MODELS_ARCHITECTURE_NANOCHAT:
      // nanochat's order (upstream-workloads.md s.7): wte, six tensors per
      // layer, lm_head. Its norms carry no weights.
      add_param(&w, kN, 2, v, d, "", "transformer.wte.weight");
      for (int64_t i = 0; i < spec->layers; ++i) {
        char layer[48];
        snprintf(layer, sizeof(layer), "%s.%lld.", "transformer.h",
                 (long long)i);
        add_param(&w, kN, 2, q_out, d, layer, "attn.c_q.weight");
        add_param(&w, kN, 2, kv_out, d, layer, "attn.c_k.weight");
        add_param(&w, kN, 2, kv_out, d, layer, "attn.c_v.weight");
        add_param(&w, kN, 2, d, q_out, layer, "attn.c_proj.weight");
        add_param(&w, kN, 2, f, d, layer, "mlp.c_fc.weight");
        add_param(&w, kN, 2, d, f, layer, "mlp.c_proj.weight");
      }
      add_param(&w, kN, 2, v, d, "", "lm_head.weight");
      break;
    case PCP_MODELS_ARCHITECTURE_QWEN3:
      // Qwen3ForCausalLM.named_parameters(): attention (q, k, v, o, q_norm,
      // k_norm), MLP (gate, up, down), then the two layer norms.
      add_param(&w, kN, 2, v, d, "", "model.embed_tokens.weight");
      for (int64_t i = 0; i < spec->layers; ++i) {
        char layer[48];
        snprintf(layer, sizeof(layer), "%s.%lld.", "model.layers",
                 (long long)i);
        add_param(&w, kN, 2, q_out, d, layer, "self_attn.q_proj.weight");
        add_param(&w, kN, 2, kv_out, d, layer, "self_attn.k_proj.weight");
        add_param(&w, kN, 2, kv_out, d, layer, "self_attn.v_proj.weight");
        add_param(&w, kN, 2, d, q_out, layer, "self_attn.o_proj.weight");
        add_param(&w, k1, 1, hd, 0, layer, "self_attn.q_norm.weight");
        add_param(&w, k1, 1, hd, 0, layer, "self_attn.k_norm.weight");
        add_param(&w, kN, 2, f, d, layer, "mlp.gate_proj.weight");
        add_param(&w, kN, 2, f, d, layer, "mlp.up_proj.weight");
        add_param(&w, kN, 2, d, f, layer, "mlp.down_proj.weight");
        add_param(&w, k1, 1, d, 0, layer, "input_layernorm.weight");
        add_param(&w, k1, 1, d, 0, layer, "post_attention_layernorm.weight");
      }
      add_param(&w, k1, 1, d, 0, "", "model.norm.weight");
      if (!spec->tie_embeddings) {
        add_param(&w, kN, 2, v, d, "", "lm_head.weight");
      }
      break;
    default:
      break;
  }
  PCP_ASSERT(out_table->count == capacity);
  return pcp_ok_status();
}

void pcp_models_parameter_table_deinitialize(
    pcp_models_parameter_table_t* table) {
  if (table->parameters) {
    pcp_allocator_free(table->allocator, table->parameters);
  }
  memset(table, 0, sizeof(*table));
}

int64_t pcp_models_parameter_table_find(
    const pcp_models_parameter_table_t* table, const char* name) {
  for (size_t i = 0; i < table->count; ++i) {
    if (strcmp(table->parameters[i].name, name) == 0) {
      return (int64_t)i;
    }
  }
  return -1;
}

static const char* init_name(pcp_models_init_t init) {
  switch (init) {
    case PCP_MODELS_INIT_ONES:
      return "ones";
    case PCP_MODELS_INIT_ZEROS:
      return "zeros";
    default:
      return "normal";
  }
}

pcp_status_t pcp_models_parameter_table_format_json(
    const pcp_models_spec_t* spec, const pcp_models_parameter_table_t* table,
    pcp_string_builder_t* builder) {
  const char* dtype = pcp_element_type_name(spec->dtype);
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      builder,
      "{\n  \"architecture\": \"%s\",\n  \"dtype\": \"%s\",\n"
      "  \"parameter_count\": %lld,\n  \"tensor_count\": %zu,\n"
      "  \"spec\": {\"layers\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
      "\"width\": %lld, \"head_dim\": %lld, \"mlp_hidden\": %lld, "
      "\"vocab\": %lld, \"block_size\": %lld, \"batch\": %lld, "
      "\"tie_embeddings\": %s, \"rope_theta\": %.17g},\n"
      "  \"functions\": [\"main\", \"logits\"],\n  \"parameters\": [\n",
      pcp_models_architecture_name(spec->architecture), dtype,
      (long long)table->total_elements, table->count, (long long)spec->layers,
      (long long)spec->heads, (long long)pcp_models_spec_kv_heads(spec),
      (long long)spec->width, (long long)pcp_models_spec_head_dim(spec),
      (long long)pcp_models_spec_mlp_hidden(spec), (long long)spec->vocab,
      (long long)spec->block_size, (long long)spec->batch,
      (spec->architecture == PCP_MODELS_ARCHITECTURE_GPT ||
       spec->tie_embeddings)
          ? "true"
          : "false",
      pcp_models_spec_rope_theta(spec)));
  for (size_t i = 0; i < table->count; ++i) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    char shape[64];
    if (p->rank == 2) {
      snprintf(shape, sizeof(shape), "[%lld, %lld]", (long long)p->dims[0],
               (long long)p->dims[1]);
    } else {
      snprintf(shape, sizeof(shape), "[%lld]", (long long)p->dims[0]);
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        builder,
        "    {\"index\": %zu, \"name\": \"%s\", \"shape\": %s, \"dtype\": "
        "\"%s\", \"init\": \"%s\"}%s\n",
        i, p->name, shape, dtype, init_name(p->init),
        i + 1 < table->count ? "," : ""));
  }
  return pcp_string_builder_append_f(
      builder,
      "  ],\n  \"data_inputs\": [\n"
      "    {\"name\": \"input_ids\", \"shape\": [%lld, %lld], \"dtype\": "
      "\"i32\"},\n"
      "    {\"name\": \"targets\", \"shape\": [%lld, %lld], \"dtype\": "
      "\"i32\"}\n  ]\n}\n",
      (long long)spec->batch, (long long)spec->block_size,
      (long long)spec->batch, (long long)spec->block_size);
}

//===----------------------------------------------------------------------===//
// Initial values
//===----------------------------------------------------------------------===//

uint16_t pcp_models_f32_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) {
    return (uint16_t)((bits >> 16) | 0x0040u);  // quiet NaN stays NaN
  }
  // Round to nearest even on the 16 dropped bits.
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

void pcp_models_parameter_fill(pcp_models_init_t init, uint64_t seed,
                               uint64_t index, pcp_element_type_t element_type,
                               int64_t element_count, void* buffer) {
  // One generator per parameter: (seed, index) through splitmix64 inside
  // pcp_rng_initialize. The odd multiplier spreads neighbouring indices.
  pcp_rng_t rng;
  pcp_rng_initialize(seed ^ ((index + 1) * 0x9E3779B97F4A7C15ull), &rng);
  for (int64_t j = 0; j < element_count; ++j) {
    float value = 0.0f;
    if (init == PCP_MODELS_INIT_NORMAL) {
      value = (float)(PCP_MODELS_INIT_STDDEV * pcp_rng_next_normal(&rng));
    } else if (init == PCP_MODELS_INIT_ONES) {
      value = 1.0f;
    }
    if (element_type == PCP_ELEMENT_TYPE_BF16) {
      ((uint16_t*)buffer)[j] = pcp_models_f32_to_bf16(value);
    } else {
      ((float*)buffer)[j] = value;
    }
  }
}

void pcp_models_parameters_initialize(const pcp_models_parameter_table_t* table,
                                      uint64_t seed, void* const* buffers) {
  // One code path with the workers' seeded @init inputs (a tensor ref
  // "init"): both call pcp_models_parameter_fill, so they cannot drift.
  for (size_t i = 0; i < table->count; ++i) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    pcp_models_parameter_fill(p->init, seed, (uint64_t)i, p->element_type,
                              p->element_count, buffers[i]);
  }
}

int32_t pcp_models_logits_argmax(const float* logits, int64_t vocab) {
  // TODO(sampling): greedy only; temperature / top-k / top-p come from the
  // sampling module (src/workloads/.../sampling) once it has landed.
  int32_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) {
      best = (int32_t)i;
    }
  }
  return best;
}
