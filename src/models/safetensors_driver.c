// SPDX-License-Identifier: Apache-2.0
// Test driver for tests/models/safetensors_py_test.py (the safetensors PyPI
// package as the independent reference):
//   safetensors_driver dump PATH    one line per tensor of a file, index or
//                                   directory: name dtype shape sha256
//   safetensors_driver write PATH   writes the fixed tensors below with our
//                                   writer, for the package to read back
//   safetensors_driver qwen3-params TIED
//                                   name and shape of each parameter of the
//                                   tiny Qwen3 below (TIED 0|1)
//   safetensors_driver qwen3-load PATH f32|bf16 TIED TIE_WORD_EMBEDDINGS
//                                   loads PATH into that table: one line per
//                                   parameter, name and SHA-256 of its bytes

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

static int dump(const char* path, pcp_allocator_t allocator) {
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  pcp_status_t status =
      pcp_safetensors_checkpoint_open(path, allocator, &checkpoint);
  if (status) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    fprintf(stderr, "error: %s\n", text);
    pcp_status_ignore(status);
    return 1;
  }
  size_t count = pcp_safetensors_checkpoint_tensor_count(checkpoint);
  for (size_t i = 0; i < count; ++i) {
    const pcp_safetensors_tensor_t* t =
        pcp_safetensors_checkpoint_tensor(checkpoint, i);
    pcp_sha256_t digest;
    pcp_sha256_compute(t->data, t->byte_length, &digest);
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_sha256_to_hex(&digest, hex);
    printf("%s %s [", t->name, pcp_element_type_name(t->element_type));
    for (int32_t d = 0; d < t->rank; ++d) {
      printf("%s%lld", d ? "," : "", (long long)t->dims[d]);
    }
    printf("] %s\n", hex);
  }
  pcp_safetensors_checkpoint_release(checkpoint);
  return 0;
}

static int write_fixed(const char* path) {
  float f32[6];
  for (int i = 0; i < 6; ++i) {
    f32[i] = (float)i * 0.25f - 1.0f;
  }
  uint16_t bf16[4];
  for (int i = 0; i < 4; ++i) {
    bf16[i] = (uint16_t)(0x3F80 + i);
  }
  uint16_t f16[3];
  for (int i = 0; i < 3; ++i) {
    f16[i] = (uint16_t)(0x3C00 + 3 * i);
  }
  int64_t i64[5];
  for (int i = 0; i < 5; ++i) {
    i64[i] = (int64_t)i * 1000000007 - 5;
  }
  uint8_t flags[3] = {1, 0, 1};
  pcp_safetensors_tensor_t tensors[] = {
      {.name = "f32",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .dims = {2, 3},
       .data = f32,
       .byte_length = sizeof(f32)},
      {.name = "bf16",
       .element_type = PCP_ELEMENT_TYPE_BF16,
       .rank = 1,
       .dims = {4},
       .data = bf16,
       .byte_length = sizeof(bf16)},
      {.name = "f16",
       .element_type = PCP_ELEMENT_TYPE_F16,
       .rank = 1,
       .dims = {3},
       .data = f16,
       .byte_length = sizeof(f16)},
      {.name = "i64",
       .element_type = PCP_ELEMENT_TYPE_I64,
       .rank = 1,
       .dims = {5},
       .data = i64,
       .byte_length = sizeof(i64)},
      {.name = "flags",
       .element_type = PCP_ELEMENT_TYPE_I1,
       .rank = 1,
       .dims = {3},
       .data = flags,
       .byte_length = sizeof(flags)},
      {.name = "empty",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .dims = {0, 3},
       .data = NULL,
       .byte_length = 0},
      {.name = "scalar",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 0,
       .data = f32 + 5,
       .byte_length = 4},
  };
  static const char* const kMetadata[] = {"format", "pt", "producer", "pcp"};
  pcp_status_t status = pcp_safetensors_write(
      path, tensors, PCP_ARRAYSIZE(tensors), kMetadata, 2);
  if (status) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    fprintf(stderr, "error: %s\n", text);
    pcp_status_ignore(status);
    return 1;
  }
  return 0;
}

static void print_status(pcp_status_t status) {
  char text[1024];
  pcp_status_format(status, text, sizeof(text));
  fprintf(stderr, "error: %s\n", text);
  pcp_status_ignore(status);
}

// The tiny Qwen3 of the interop test: 2 layers, width 32, 4 heads, 2 kv
// heads, vocab 50.
static pcp_status_t qwen3_table(const char* dtype, bool tied,
                                pcp_allocator_t allocator,
                                pcp_models_parameter_table_t* out_table) {
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_QWEN3, &spec);
  spec.layers = 2;
  spec.width = 32;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.vocab = 50;
  spec.block_size = 8;
  spec.batch = 1;
  spec.dtype =
      strcmp(dtype, "bf16") == 0 ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
  spec.tie_embeddings = tied;
  return pcp_models_parameter_table_initialize(&spec, allocator, out_table);
}

static int qwen3_params(bool tied, pcp_allocator_t allocator) {
  pcp_models_parameter_table_t table;
  pcp_status_t status = qwen3_table("f32", tied, allocator, &table);
  if (status) {
    print_status(status);
    return 1;
  }
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    printf("%s %lld", p->name, (long long)p->dims[0]);
    if (p->rank == 2) {
      printf(",%lld", (long long)p->dims[1]);
    }
    printf("\n");
  }
  pcp_models_parameter_table_deinitialize(&table);
  return 0;
}

static int qwen3_load(const char* path, const char* dtype, bool tied,
                      bool tie_word_embeddings, pcp_allocator_t allocator) {
  pcp_models_parameter_table_t table;
  pcp_status_t status = qwen3_table(dtype, tied, allocator, &table);
  if (status) {
    print_status(status);
    return 1;
  }
  // The table of the tiny model above has a handful of entries: no overflow.
  void** buffers = NULL;
  status = pcp_allocator_calloc(allocator, table.count * sizeof(void*),
                                (void**)&buffers);
  for (size_t i = 0; i < table.count && !status; ++i) {
    status = pcp_allocator_calloc(allocator, table.parameters[i].byte_length,
                                  &buffers[i]);
  }
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  if (!status) {
    status = pcp_safetensors_checkpoint_open(path, allocator, &checkpoint);
  }
  if (!status) {
    status = pcp_models_safetensors_load(&table, checkpoint,
                                         tie_word_embeddings, buffers);
  }
  pcp_safetensors_checkpoint_release(checkpoint);
  int rc = 0;
  if (status) {
    print_status(status);
    rc = 1;
  } else {
    for (size_t i = 0; i < table.count; ++i) {
      pcp_sha256_t digest;
      pcp_sha256_compute(buffers[i], table.parameters[i].byte_length, &digest);
      char hex[PCP_SHA256_HEX_LENGTH + 1];
      pcp_sha256_to_hex(&digest, hex);
      printf("%s %s\n", table.parameters[i].name, hex);
    }
  }
  for (size_t i = 0; buffers && i < table.count; ++i) {
    pcp_allocator_free(allocator, buffers[i]);
  }
  pcp_allocator_free(allocator, buffers);
  pcp_models_parameter_table_deinitialize(&table);
  return rc;
}

int main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  if (argc == 3 && strcmp(argv[1], "qwen3-params") == 0) {
    return qwen3_params(strcmp(argv[2], "1") == 0, allocator);
  }
  if (argc == 6 && strcmp(argv[1], "qwen3-load") == 0) {
    return qwen3_load(argv[2], argv[3], strcmp(argv[4], "1") == 0,
                      strcmp(argv[5], "1") == 0, allocator);
  }
  if (argc == 3 && strcmp(argv[1], "dump") == 0) {
    return dump(argv[2], allocator);
  }
  if (argc == 3 && strcmp(argv[1], "write") == 0) {
    return write_fixed(argv[2]);
  }
  fprintf(stderr,
          "usage: safetensors_driver dump|write PATH | qwen3-params "
          "TIED | qwen3-load PATH f32|bf16 TIED TIE\n");
  return 2;
}
