// SPDX-License-Identifier: Apache-2.0
// Test driver for the generation driver (tests/models/generate_jax_test.py):
//
//   infer_generate_tool VMFB ARCH[:bf16] LAYERS HEADS KV_HEADS WIDTH VOCAB
//   BLOCK
//       SLOTS MAX_LENGTH PREFILL_LENGTH PARAM_DIR OUT_DIR NEW_TOKENS
//       PROMPT.npy...
//
// Parameters are PARAM_DIR/NNN.npy (f32, table order; rounded to bf16 for
// ARCH:bf16). Prompt i goes to
// slot i. Writes to OUT_DIR:
//   prefill_logits.npy  [n, V]   logits after each prompt
//   decode_logits.npy   [NEW-1, n, V] logits of each batched decode step
//   tokens.npy          [n, NEW] greedy tokens, all slots decoded together
//   tokens_alone.npy    [n, NEW] the same, each prompt alone in its slot
// and prints the KV-cache bytes per session, measured and analytic.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "models/models.h"
#include "workloads/workloads.h"

#define MAX_PROMPTS 8

static pcp_status_t write_npy(const char* dir, const char* name,
                              pcp_element_type_t et, int rank,
                              const int64_t* dims, void* data, size_t bytes) {
  pcp_tensor_shape_t shape = {.element_type = et, .rank = rank};
  for (int i = 0; i < rank; ++i) shape.dims[i] = dims[i];
  pcp_host_tensor_t host;
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(&shape, data, bytes, &host));
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  pcp_status_t status = pcp_host_tensor_write_npy(&host, path, false);
  pcp_host_tensor_deinitialize(&host);
  return status;
}

typedef struct run_t {
  pcp_infer_generator_t* gen;
  int64_t vocab;
  int64_t slots;
  int n;
  int64_t new_tokens;
  pcp_host_tensor_t* prompts;
  float* logits;   // slots x V
  float* scratch;  // slots x V
} run_t;

// Prefills the prompts in |which| (all when -1), then decodes greedily.
static pcp_status_t generate(run_t* r, int which, int32_t* tokens,
                             float* prefill_logits, float* decode_logits) {
  bool active[MAX_PROMPTS] = {false};
  int32_t step[MAX_PROMPTS] = {0};
  for (int i = 0; i < r->n; ++i) {
    if (which >= 0 && i != which)
      continue;
    pcp_infer_generator_slot_reset(r->gen, i);
    const pcp_host_tensor_t* p = &r->prompts[i];
    float* out = r->logits + (size_t)i * (size_t)r->vocab;
    PCP_RETURN_IF_ERROR_BARE(pcp_infer_generator_prefill(
        r->gen, i, (const int32_t*)p->data, p->shape.dims[0], out, r->scratch));
    if (prefill_logits) {
      memcpy(prefill_logits + (size_t)i * (size_t)r->vocab, out,
             (size_t)r->vocab * sizeof(float));
    }
    active[i] = true;
    step[i] = pcp_models_logits_argmax(out, r->vocab);
    tokens[(size_t)i * (size_t)r->new_tokens] = step[i];
  }
  for (int64_t t = 1; t < r->new_tokens; ++t) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_infer_generator_decode(r->gen, step, active, r->logits));
    for (int i = 0; i < r->n; ++i) {
      if (!active[i])
        continue;
      const float* row = r->logits + (size_t)i * (size_t)r->vocab;
      step[i] = pcp_models_logits_argmax(row, r->vocab);
      tokens[(size_t)i * (size_t)r->new_tokens + (size_t)t] = step[i];
      if (decode_logits) {
        memcpy(decode_logits + ((size_t)(t - 1) * (size_t)r->n + (size_t)i) *
                                   (size_t)r->vocab,
               row, (size_t)r->vocab * sizeof(float));
      }
    }
  }
  return pcp_ok_status();
}

// Zeroed memory for |count| elements of |size| bytes, or NULL (the caller
// reports RESOURCE_EXHAUSTED).
static void* zalloc(pcp_allocator_t allocator, size_t count, size_t size) {
  size_t bytes = 0;
  void* p = NULL;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    return NULL;
  }
  pcp_status_t status = pcp_allocator_calloc(allocator, bytes, &p);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  return p;
}

// A whole decimal argument, or exit 2 (a test driver: no status to return).
static int64_t arg_int(const char* text) {
  char* end = NULL;
  long long value = strtoll(text, &end, 10);
  if (!end || end == text || *end) {
    fprintf(stderr, "infer_generate_tool: '%s' is not an integer\n", text);
    exit(2);
  }
  return (int64_t)value;
}

int main(int argc, char** argv) {
  if (argc < 16 || argc - 15 > MAX_PROMPTS) {
    fprintf(stderr, "usage: see the header of generate_tool.c\n");
    return 2;
  }
  // The one allocator of this process, passed to everything below.
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_models_spec_t spec;
  char arch[32];
  snprintf(arch, sizeof(arch), "%s", argv[2]);
  char* suffix = strchr(arch, ':');
  bool bf16 = suffix && strcmp(suffix, ":bf16") == 0;
  if (suffix)
    *suffix = 0;
  pcp_status_t status = pcp_models_architecture_parse(arch, &spec.architecture);
  if (status) {
    pcp_status_ignore(status);
    return 2;
  }
  pcp_models_spec_initialize(spec.architecture, &spec);
  spec.layers = arg_int(argv[3]);
  spec.heads = arg_int(argv[4]);
  spec.kv_heads = arg_int(argv[5]);
  spec.width = arg_int(argv[6]);
  spec.vocab = arg_int(argv[7]);
  spec.block_size = arg_int(argv[8]);
  spec.tie_embeddings = spec.architecture == PCP_MODELS_ARCHITECTURE_GPT;
  spec.dtype = bf16 ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
  pcp_models_generation_t g = {.slots = arg_int(argv[9]),
                               .max_length = arg_int(argv[10]),
                               .prefill_length = arg_int(argv[11])};
  const char* param_dir = argv[12];
  const char* out_dir = argv[13];
  run_t r = {.vocab = spec.vocab,
             .slots = g.slots,
             .n = argc - 15,
             .new_tokens = arg_int(argv[14])};
  pcp_models_parameter_table_t table = {0};
  pcp_host_tensor_t params[1024];
  pcp_host_tensor_t prompts[MAX_PROMPTS];
  memset(params, 0, sizeof(params));
  memset(prompts, 0, sizeof(prompts));
  const void* param_data[1024];
  uint16_t* bf16_data[1024] = {NULL};
  void* vmfb = NULL;
  size_t vmfb_length = 0;
  pcp_backend_t* backend = NULL;
  pcp_program_t* program = NULL;
  status = pcp_models_parameter_table_initialize(&spec, allocator, &table);
  if (!status && table.count > 1024) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "too many params");
  }
  for (size_t i = 0; !status && i < table.count; ++i) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%03zu.npy", param_dir, i);
    status = pcp_host_tensor_read_npy(path, PCP_ELEMENT_TYPE_F32, &params[i]);
    param_data[i] = params[i].data;
    if (!status && bf16) {
      size_t count = params[i].byte_length / sizeof(float);
      uint16_t* to = zalloc(allocator, count ? count : 1, sizeof(uint16_t));
      if (!to) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "bf16");
        break;
      }
      const float* from = params[i].data;
      for (size_t k = 0; k < count; ++k) to[k] = pcp_f32_to_bf16(from[k]);
      bf16_data[i] = to;
      param_data[i] = to;
    }
  }
  for (int i = 0; !status && i < r.n; ++i) {
    status = pcp_host_tensor_read_npy(argv[15 + i], PCP_ELEMENT_TYPE_I32,
                                      &prompts[i]);
  }
  r.prompts = prompts;
  if (!status) {
    status =
        pcp_file_read_all(argv[1], PCP_MAX_PROGRAM_BYTES, &vmfb, &vmfb_length);
  }
  if (!status) {
    pcp_backend_options_t options = {.driver = "cpu"};
    status = pcp_backend_create(&options, &backend);
  }
  if (!status)
    status = pcp_program_load(backend, vmfb, vmfb_length, &program);
  if (!status) {
    status = pcp_infer_generator_create(backend, program, &spec, &g, param_data,
                                        allocator, &r.gen);
  }
  size_t row = (size_t)g.slots * (size_t)spec.vocab;
  size_t nv = (size_t)r.n * (size_t)spec.vocab;
  size_t steps = (size_t)(r.new_tokens > 1 ? r.new_tokens - 1 : 1);
  r.logits = zalloc(allocator, row, sizeof(float));
  r.scratch = zalloc(allocator, row, sizeof(float));
  float* prefill_logits = zalloc(allocator, nv, sizeof(float));
  float* decode_logits = zalloc(allocator, steps * nv, sizeof(float));
  int32_t* tokens =
      zalloc(allocator, (size_t)r.n * (size_t)r.new_tokens, sizeof(int32_t));
  int32_t* alone =
      zalloc(allocator, (size_t)r.n * (size_t)r.new_tokens, sizeof(int32_t));
  if (!status && (!r.logits || !r.scratch || !prefill_logits ||
                  !decode_logits || !tokens || !alone)) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "buffers");
  }
  if (!status)
    status = generate(&r, -1, tokens, prefill_logits, decode_logits);
  for (int i = 0; !status && i < r.n; ++i) {
    status = generate(&r, i, alone, NULL, NULL);
  }
  if (!status) {
    int64_t dims[3] = {r.n, spec.vocab, 0};
    status = write_npy(out_dir, "prefill_logits.npy", PCP_ELEMENT_TYPE_F32, 2,
                       dims, prefill_logits, nv * sizeof(float));
  }
  if (!status) {
    int64_t dims[3] = {(int64_t)steps, r.n, spec.vocab};
    status = write_npy(out_dir, "decode_logits.npy", PCP_ELEMENT_TYPE_F32, 3,
                       dims, decode_logits, steps * nv * sizeof(float));
  }
  size_t token_bytes = (size_t)r.n * (size_t)r.new_tokens * sizeof(int32_t);
  int64_t tdims[2] = {r.n, r.new_tokens};
  if (!status) {
    status = write_npy(out_dir, "tokens.npy", PCP_ELEMENT_TYPE_I32, 2, tdims,
                       tokens, token_bytes);
  }
  if (!status) {
    status = write_npy(out_dir, "tokens_alone.npy", PCP_ELEMENT_TYPE_I32, 2,
                       tdims, alone, token_bytes);
  }
  if (!status) {
    printf(
        "kv_cache_bytes_per_session measured=%llu analytic=%llu\n",
        (unsigned long long)pcp_infer_generator_session_cache_byte_length(
            r.gen),
        (unsigned long long)pcp_models_generation_cache_byte_length(&spec, &g));
  }
  pcp_allocator_free(allocator, r.logits);
  pcp_allocator_free(allocator, r.scratch);
  pcp_allocator_free(allocator, prefill_logits);
  pcp_allocator_free(allocator, decode_logits);
  pcp_allocator_free(allocator, tokens);
  pcp_allocator_free(allocator, alone);
  pcp_infer_generator_release(r.gen);
  pcp_program_release(program);
  pcp_backend_release(backend);
  pcp_libc_free(vmfb);  // pcp_file_read_all: libc memory
  for (size_t i = 0; i < table.count; ++i) {
    pcp_host_tensor_deinitialize(&params[i]);
    pcp_allocator_free(allocator, bf16_data[i]);
  }
  for (int i = 0; i < r.n; ++i) pcp_host_tensor_deinitialize(&prompts[i]);
  pcp_models_parameter_table_deinitialize(&table);
  if (status) {
    char* message = pcp_status_to_string(status);
    fprintf(stderr, "infer_generate_tool: %s\n", message ? message : "error");
    pcp_libc_free(message);  // pcp_status_to_string: libc memory
    pcp_status_ignore(status);
    return 1;
  }
  return 0;
}
