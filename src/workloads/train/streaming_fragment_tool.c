// SPDX-License-Identifier: Apache-2.0
// Test driver: writes the streaming-DiLoCo fragment modules
// (@delta/@mix/@init/@copy, pcp_diloco_fragment_module_emit) of a built-in
// model, the same text the training service compiles, so they can be
// compiled outside the service (tests/compile/backend_matrix_test.py).
//
// usage: streaming_fragment_tool ARCH f32|bf16 LAYERS HEADS KV_HEADS WIDTH
//            VOCAB BLOCK BATCH FRAGMENTS f32|bf16(deltas) OUT_DIR
// Writes OUT_DIR/fragment-<p>.mlir for p = 0 .. FRAGMENTS-1.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static pcp_status_t parse_count(const char* text, const char* what, int64_t max,
                                int64_t* out) {
  char* end = NULL;
  errno = 0;
  long long value = strtoll(text, &end, 10);
  if (errno || !end || *end || value < 0 || value > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must be an integer in [0, %lld], got '%s'", what,
                           (long long)max, text);
  }
  *out = value;
  return pcp_ok_status();
}

static pcp_status_t parse_dtype(const char* text, const char* what,
                                bool* out_bf16) {
  if (strcmp(text, "f32") != 0 && strcmp(text, "bf16") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must be f32 or bf16, got '%s'", what, text);
  }
  *out_bf16 = strcmp(text, "bf16") == 0;
  return pcp_ok_status();
}

static pcp_status_t run(char** argv) {
  pcp_models_architecture_t arch;
  PCP_RETURN_IF_ERROR_BARE(pcp_models_architecture_parse(argv[1], &arch));
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  bool bf16_parameters = false, bf16_deltas = false;
  PCP_RETURN_IF_ERROR_BARE(parse_dtype(argv[2], "dtype", &bf16_parameters));
  spec.dtype = bf16_parameters ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
  int64_t* fields[] = {&spec.layers, &spec.heads, &spec.kv_heads,
                       &spec.width,  &spec.vocab, &spec.block_size,
                       &spec.batch};
  const char* names[] = {"LAYERS", "HEADS", "KV_HEADS", "WIDTH",
                         "VOCAB",  "BLOCK", "BATCH"};
  for (int i = 0; i < 7; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        parse_count(argv[3 + i], names[i], PCP_MODELS_MAX_VOCAB, fields[i]));
  }
  int64_t fragments = 0;
  PCP_RETURN_IF_ERROR_BARE(parse_count(argv[10], "FRAGMENTS", 64, &fragments));
  PCP_RETURN_IF_ERROR_BARE(parse_dtype(argv[11], "delta dtype", &bf16_deltas));
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  pcp_status_t status = pcp_ok_status();
  for (int64_t p = 0; p < fragments && !status; ++p) {
    pcp_string_builder_t b;
    pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20, &b);
    status = pcp_diloco_fragment_module_emit(&table, (uint32_t)p,
                                             (uint32_t)fragments,
                                             bf16_parameters, bf16_deltas, &b);
    char path[4096];
    snprintf(path, sizeof(path), "%s/fragment-%lld.mlir", argv[12],
             (long long)p);
    if (!status)
      status = pcp_file_write_atomic(path, b.data, b.size);
    pcp_string_builder_deinitialize(&b);
  }
  if (!status && fragments == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "FRAGMENTS must be at least 1");
  }
  pcp_models_parameter_table_deinitialize(&table);
  return status;
}

int main(int argc, char** argv) {
  if (argc != 13) {
    fprintf(stderr,
            "usage: %s ARCH f32|bf16 LAYERS HEADS KV_HEADS WIDTH VOCAB BLOCK "
            "BATCH FRAGMENTS f32|bf16 OUT_DIR\n",
            argv[0]);
    return 2;
  }
  pcp_status_t status = run(argv);
  if (status) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    fprintf(stderr, "streaming_fragment_tool: %s\n", text);
    pcp_status_ignore(status);
    return 1;
  }
  return 0;
}
