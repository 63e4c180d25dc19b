// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the safetensors reader: any bytes as a file image; every
// view of an accepted file is read in full, so ASan catches a view that
// leaves the image.
//
// Built two ways, like config_fuzz: with -DPCP_FUZZ=ON under clang it is a
// libFuzzer binary (`safetensors_fuzz tests/fuzz/safetensors`); otherwise a
// replay tool that ctest runs over the seed corpus.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The fuzz entry point has no caller to take an allocator from.
static pcp_allocator_t fuzz_allocator(void) {
  return pcp_allocator_system();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pcp_safetensors_file_t* file = NULL;
  pcp_status_t status =
      pcp_safetensors_file_parse(data, size, fuzz_allocator(), &file);
  if (status) {
    // Every failure is a status with a message, never a crash.
    PCP_ASSERT(pcp_status_message(status)[0] != 0);
    PCP_ASSERT(file == NULL);
    pcp_status_ignore(status);
    return 0;
  }
  uint64_t sum = 0;
  size_t count = pcp_safetensors_file_tensor_count(file);
  for (size_t i = 0; i < count; ++i) {
    const pcp_safetensors_tensor_t* t = pcp_safetensors_file_tensor(file, i);
    PCP_ASSERT(pcp_safetensors_file_find(file, t->name) != NULL);
    PCP_ASSERT((const uint8_t*)t->data >= data &&
               (const uint8_t*)t->data + t->byte_length <= data + size);
    for (size_t b = 0; b < t->byte_length; ++b) {
      sum += ((const uint8_t*)t->data)[b];
    }
  }
  (void)pcp_safetensors_file_metadata(file, "format");
  pcp_safetensors_file_release(file);
  return (int)(sum & 0);
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "safetensors_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);  // pcp_file_read_all's buffer
  }
  printf("safetensors_fuzz: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
