// SPDX-License-Identifier: Apache-2.0
//
// compute: the device boundary.
//
// pcp_backend_t is a small vtable (ggml-backend style) over one device: load
// a compiled program once, keep tensors resident on the device between calls
// (parameters, optimizer moments, KV caches), invoke functions by name with
// any mix of resident and host tensors, and copy results out only when asked.
// The IREE backend (backends/iree/) is the only implementation that runs
// programs; it embeds CPython and drives `iree.runtime` from the project's
// .venv, because the PyPI wheels export no C runtime API
// (reference/iree.md s.3). It is the only code in PCP that includes Python.h.
//
// Host tensors (pcp_host_tensor_t) are plain memory plus a shape; this header
// also has their text and .npy forms, which `pcp run` and tests use.
//
// Ownership: pcp_tensor_t is reference counted (a tensor may be held by a
// session, a queue and an in-flight call at once); programs and backends are
// released by their single owner. A program and its tensors must be released
// before their backend.
//
// Thread-safety: a backend and everything made from it is thread-compatible:
// use it from one thread at a time (the worker's compute thread). Different
// backends may be used from different threads; the IREE backend serializes
// them on the Python GIL, which IREE releases while programs run.

#ifndef PCP_COMPUTE_COMPUTE_H_
#define PCP_COMPUTE_COMPUTE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Shapes and host tensors
//===----------------------------------------------------------------------===//

// A tensor type. dims[i] == -1 means dynamic (only in signatures).
typedef struct pcp_tensor_shape_t {
  pcp_element_type_t element_type;
  int32_t rank;
  int64_t dims[PCP_MAX_TENSOR_RANK];
} pcp_tensor_shape_t;

// Largest single tensor accepted from text, files or callers (16 GiB).
#define PCP_MAX_TENSOR_BYTES ((size_t)16 << 30)

// Bytes of a fully static shape. INVALID_ARGUMENT for dynamic or negative
// dims, unknown types or rank over PCP_MAX_TENSOR_RANK; RESOURCE_EXHAUSTED
// past PCP_MAX_TENSOR_BYTES or on overflow.
PCP_MUST_USE_RESULT pcp_status_t pcp_tensor_shape_byte_length(
    const pcp_tensor_shape_t* shape, size_t* out_byte_length);

// "2x3xf32", "f32" (rank 0), "?x4xbf16". Always NUL-terminates |buffer|.
void pcp_tensor_shape_format(const pcp_tensor_shape_t* shape, char* buffer,
                             size_t capacity);

// Parses "2x3xf32" / "f32" / "?x3xi64".
PCP_MUST_USE_RESULT pcp_status_t
pcp_tensor_shape_parse(pcp_string_view_t text, pcp_tensor_shape_t* out_shape);

bool pcp_tensor_shape_equal(const pcp_tensor_shape_t* a,
                            const pcp_tensor_shape_t* b);

// A tensor in host memory. |data| is 64-byte aligned when the tensor owns it.
typedef struct pcp_host_tensor_t {
  pcp_tensor_shape_t shape;
  void* data;
  size_t byte_length;
  bool owns_data;  // |allocation| goes back to |allocator| on deinitialize
  pcp_allocator_t allocator;  // owned storage only
  void* allocation;           // the block |data| lies in (aligned inside it)
} pcp_host_tensor_t;

// Allocates zeroed storage for |shape| from pcp_allocator_system().
PCP_MUST_USE_RESULT pcp_status_t pcp_host_tensor_allocate(
    const pcp_tensor_shape_t* shape, pcp_host_tensor_t* out_tensor);
// The same from |allocator| (RESOURCE_EXHAUSTED when it fails); the tensor
// remembers it for pcp_host_tensor_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_host_tensor_allocate_with_allocator(
    const pcp_tensor_shape_t* shape, pcp_allocator_t allocator,
    pcp_host_tensor_t* out_tensor);
// Wraps caller memory (not owned). |byte_length| must match the shape.
PCP_MUST_USE_RESULT pcp_status_t
pcp_host_tensor_wrap(const pcp_tensor_shape_t* shape, void* data,
                     size_t byte_length, pcp_host_tensor_t* out_tensor);
void pcp_host_tensor_deinitialize(pcp_host_tensor_t* tensor);

// Parses an iree-run-module style input:
//   "2x3xf32=1,2,3,4,5,6"   values separated by commas or spaces; [ ] ignored
//   "4xf32=0"               one value: splat
//   "f32=3.5"               rank 0
//   "2x3xbf16=@in.bin"      raw little-endian bytes from a file
//   "@x.npy"                a NumPy .npy file (v1-v3, C order)
// f16 and bf16 values are written as decimals and rounded to nearest even.
// Errors name the input and the problem (count mismatch, bad number, ...).
PCP_MUST_USE_RESULT pcp_status_t
pcp_host_tensor_parse(const char* text, pcp_host_tensor_t* out_tensor);
// The same with the tensor's storage (and scratch) from |allocator|.
PCP_MUST_USE_RESULT pcp_status_t pcp_host_tensor_parse_with_allocator(
    const char* text, pcp_allocator_t allocator, pcp_host_tensor_t* out_tensor);

// .npy files. Reading checks the header (size <= 64 KiB, C order, known
// dtype, rank) and that the data length matches before allocating.
// bf16 has no NumPy descr: it is written as '<V2' (as ml_dtypes does) and a
// '<V2' file is read only when |expected_type| says bf16 (else an error).
PCP_MUST_USE_RESULT pcp_status_t
pcp_host_tensor_read_npy(const char* path, pcp_element_type_t expected_type,
                         pcp_host_tensor_t* out_tensor);
// The same with the tensor's storage (and the header) from |allocator|.
PCP_MUST_USE_RESULT pcp_status_t pcp_host_tensor_read_npy_with_allocator(
    const char* path, pcp_element_type_t expected_type,
    pcp_allocator_t allocator, pcp_host_tensor_t* out_tensor);
// |append|: add to an existing file as iree-run-module's "+file.npy" does.
PCP_MUST_USE_RESULT pcp_status_t pcp_host_tensor_write_npy(
    const pcp_host_tensor_t* tensor, const char* path, bool append);

// Prints like iree-run-module: "2x3xf32=[1 2 3][4 5 6]", at most
// |max_elements| elements (then "...").
PCP_MUST_USE_RESULT pcp_status_t
pcp_host_tensor_format(const pcp_host_tensor_t* tensor, size_t max_elements,
                       pcp_string_builder_t* builder);

// Scalar f16/bf16 conversions: pcp_f32_to_f16 and friends (base/base.h).

//===----------------------------------------------------------------------===//
// Backends
//===----------------------------------------------------------------------===//

typedef struct pcp_backend_t pcp_backend_t;
typedef struct pcp_program_t pcp_program_t;
typedef struct pcp_tensor_t pcp_tensor_t;

typedef struct pcp_backend_options_t {
  // "cpu" (IREE local-task), "local-sync", "cuda", "rocm" (IREE hip),
  // "vulkan", "metal"; NULL = "cpu".
  const char* driver;
  int32_t device_ordinal;
  // CPU only: worker threads of local-task (0 = one per physical core the
  // process may run on). The workers are not pinned to cores.
  int32_t cpu_threads;
  // PCP's own host memory of the backend and everything it creates
  // (programs, function caches, tensor handles, downloaded host tensors);
  // IREE allocates its own. Unset ({NULL, NULL}): the system allocator.
  pcp_allocator_t allocator;
} pcp_backend_options_t;

typedef struct pcp_backend_info_t {
  char driver[32];  // the IREE driver in use ("local-task", "cuda", ...)
  int32_t device_ordinal;
  char device_name[128];
  char runtime_version[64];  // iree-base-runtime version
} pcp_backend_info_t;

// Creates the IREE backend for one device. Errors:
//   INVALID_ARGUMENT  unknown driver name
//   NOT_FOUND         no such device ordinal, or the .venv / wheel is missing
//   UNAVAILABLE       the driver cannot start here (no GPU, no libcuda)
PCP_MUST_USE_RESULT pcp_status_t pcp_backend_create(
    const pcp_backend_options_t* options, pcp_backend_t** out_backend);
void pcp_backend_release(pcp_backend_t* backend);
const pcp_backend_info_t* pcp_backend_info(const pcp_backend_t* backend);

// The device allocator's own statistics (IREE's HAL allocator counts every
// buffer it allocates and frees): what the device really holds, as opposed
// to a byte count derived from shapes.
typedef struct pcp_backend_memory_t {
  uint64_t device_bytes_live;       // allocated and not yet freed
  uint64_t device_bytes_peak;       // the most live at once so far
  uint64_t device_bytes_allocated;  // total ever allocated
} pcp_backend_memory_t;

// Fills |out_memory|. UNIMPLEMENTED when the backend (or its runtime build)
// keeps no allocator statistics. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_backend_memory_query(
    pcp_backend_t* backend, pcp_backend_memory_t* out_memory);

// The iree-base-runtime version from the .venv without starting Python
// (read from the wheel's metadata). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_compute_runtime_version(char* buffer,
                                                             size_t capacity);

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

// Upper bound on a VMFB (RESOURCE_EXHAUSTED beyond it).
#define PCP_MAX_PROGRAM_BYTES ((size_t)4 << 30)
#define PCP_MAX_FUNCTION_ARITY 1024

// A function's calling signature, from the program's ABI declaration.
typedef struct pcp_function_signature_t {
  int32_t input_count;
  int32_t result_count;
  // Types of the first PCP_SIGNATURE_MAX_TYPES inputs/results; rank -1 when
  // not a tensor or not declared (then only the count is checked).
#define PCP_SIGNATURE_MAX_TYPES 64
  pcp_tensor_shape_t inputs[PCP_SIGNATURE_MAX_TYPES];
  pcp_tensor_shape_t results[PCP_SIGNATURE_MAX_TYPES];
  char declaration[1024];  // "sync func @main(%input0: tensor<4xf32>) -> ..."
} pcp_function_signature_t;

// Loads a VMFB (copied once; |vmfb| may be freed after). INVALID_ARGUMENT
// when it is not a valid module for this device.
PCP_MUST_USE_RESULT pcp_status_t pcp_program_load(pcp_backend_t* backend,
                                                  const void* vmfb,
                                                  size_t byte_length,
                                                  pcp_program_t** out_program);
void pcp_program_release(pcp_program_t* program);

// Exported function names (borrowed until the program is released).
size_t pcp_program_function_count(const pcp_program_t* program);
const char* pcp_program_function_name(const pcp_program_t* program,
                                      size_t index);

// NOT_FOUND listing the exported functions when |name| is absent.
PCP_MUST_USE_RESULT pcp_status_t
pcp_program_function_signature(pcp_program_t* program, const char* name,
                               pcp_function_signature_t* out_signature);

//===----------------------------------------------------------------------===//
// Device-resident tensors
//===----------------------------------------------------------------------===//

// Copies |host| to the device. The result starts with one reference.
PCP_MUST_USE_RESULT pcp_status_t
pcp_tensor_upload(pcp_backend_t* backend, const pcp_host_tensor_t* host,
                  pcp_tensor_t** out_tensor);
void pcp_tensor_retain(pcp_tensor_t* tensor);
void pcp_tensor_release(pcp_tensor_t* tensor);
const pcp_tensor_shape_t* pcp_tensor_shape(const pcp_tensor_t* tensor);
size_t pcp_tensor_byte_length(const pcp_tensor_t* tensor);

// Copies the tensor into |buffer|, which must hold exactly its bytes.
PCP_MUST_USE_RESULT pcp_status_t pcp_tensor_download(pcp_tensor_t* tensor,
                                                     void* buffer,
                                                     size_t byte_length);
// Allocates a host tensor and downloads into it.
PCP_MUST_USE_RESULT pcp_status_t
pcp_tensor_download_host(pcp_tensor_t* tensor, pcp_host_tensor_t* out_host);

//===----------------------------------------------------------------------===//
// Invocation
//===----------------------------------------------------------------------===//

// One input: exactly one of |resident| (borrowed) or |host| (borrowed,
// copied to the device for this call only).
typedef struct pcp_value_t {
  pcp_tensor_t* resident;
  const pcp_host_tensor_t* host;
} pcp_value_t;

static inline pcp_value_t pcp_value_resident(pcp_tensor_t* tensor) {
  pcp_value_t v = {tensor, NULL};
  return v;
}
static inline pcp_value_t pcp_value_host(const pcp_host_tensor_t* tensor) {
  pcp_value_t v = {NULL, tensor};
  return v;
}

// Calls |function| with |inputs|. Results stay resident: |out_results|
// receives |*out_result_count| new references (at most |result_capacity|);
// download what you need and release them all. Inputs are checked against
// the signature first, so a wrong count, rank, dim or element type is an
// INVALID_ARGUMENT naming the input and both types, never a device fault.
PCP_MUST_USE_RESULT pcp_status_t pcp_program_invoke(
    pcp_program_t* program, const char* function, const pcp_value_t* inputs,
    size_t input_count, pcp_tensor_t** out_results, size_t result_capacity,
    size_t* out_result_count);

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

// `pcp run program.vmfb --function f --input ... [--device cpu] [--output]`.
int pcp_compute_run_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_COMPUTE_COMPUTE_H_
