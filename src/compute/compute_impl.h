// SPDX-License-Identifier: Apache-2.0
// Private to src/compute: the backend vtable and the base structs that
// every backend embeds as its first member.

#ifndef PCP_COMPUTE_COMPUTE_IMPL_H_
#define PCP_COMPUTE_COMPUTE_IMPL_H_

#include "compute/compute.h"

// A looked-up function, cached on the program by name.
typedef struct pcp_program_function_t {
  char* name;
  void* handle;
  pcp_function_signature_t signature;
} pcp_program_function_t;

typedef struct pcp_backend_vtable_t {
  void (*destroy)(pcp_backend_t* backend);
  pcp_status_t (*program_load)(pcp_backend_t* backend, const void* vmfb,
                               size_t byte_length, pcp_program_t** out_program);
  void (*program_destroy)(pcp_program_t* program);
  // Resolves |name| to a backend handle (owned by the program) and fills the
  // signature. NOT_FOUND when absent.
  pcp_status_t (*function_resolve)(pcp_program_t* program, const char* name,
                                   pcp_function_signature_t* out_signature,
                                   void** out_handle);
  pcp_status_t (*tensor_upload)(pcp_backend_t* backend,
                                const pcp_host_tensor_t* host,
                                pcp_tensor_t** out_tensor);
  pcp_status_t (*tensor_download)(pcp_tensor_t* tensor, void* buffer,
                                  size_t byte_length);
  void (*tensor_destroy)(pcp_tensor_t* tensor);
  // Inputs are already checked against |function|'s signature. Writes
  // exactly signature.result_count results.
  pcp_status_t (*invoke)(pcp_program_t* program,
                         const pcp_program_function_t* function,
                         const pcp_value_t* inputs, size_t input_count,
                         pcp_tensor_t** out_results);
  // Optional (NULL: UNIMPLEMENTED): the device allocator's statistics.
  pcp_status_t (*memory_query)(pcp_backend_t* backend,
                               pcp_backend_memory_t* out_memory);
} pcp_backend_vtable_t;

struct pcp_backend_t {
  const pcp_backend_vtable_t* vtable;
  pcp_backend_info_t info;
  // PCP's host memory for the backend and what it creates (the options'
  // allocator, or the system allocator when unset).
  pcp_allocator_t allocator;
};

struct pcp_program_t {
  pcp_backend_t* backend;
  size_t function_count;
  char** function_names;             // exported names, owned
  pcp_program_function_t* resolved;  // cache, owned
  // Everything above from backend->allocator.
  size_t resolved_count;
  size_t resolved_capacity;
};

// Reference count first (offset 0), as IREE's HAL resources do.
struct pcp_tensor_t {
  _Atomic int32_t ref_count;
  pcp_backend_t* backend;
  pcp_tensor_shape_t shape;
  size_t byte_length;
};

// Parses an IREE ABI declaration ("sync func @f(%input0: tensor<4xf32>, ...)
// -> (%output0: tensor<f32>)") into types. Entries that are not tensors get
// rank -1. Used by the IREE backend; exposed here for its unit test.
pcp_status_t pcp_compute_parse_abi_declaration(
    const char* declaration, pcp_function_signature_t* inout_signature);

// Creates the IREE backend (backends/iree/).
pcp_status_t pcp_iree_backend_create(const pcp_backend_options_t* options,
                                     pcp_backend_t** out_backend);

#endif  // PCP_COMPUTE_COMPUTE_IMPL_H_
