// SPDX-License-Identifier: Apache-2.0
//
// mlir: the MLIR C API, loaded at run time from the IREE compiler wheel, and
// the module introspection the rest of PCP needs (parse, verify, print, list
// functions, read a function's argument and result types).
//
// Where the symbols come from. Every mlir* and ireeCompiler* function is
// resolved with dlsym from libIREECompiler.so in the project's .venv
// (<site-packages>/iree/compiler/_mlir_libs/libIREECompiler.so), or from the
// path in $PCP_IREE_COMPILER_LIB. Debian's libMLIR is never linked: its
// dialects would not include StableHLO and two copies of LLVM in a process
// do not mix. The declarations come from Debian's LLVM 22 mlir-c headers
// while the library bundles LLVM 24, so this module calls only long-stable C
// API functions and no function that passes a struct by value whose layout
// has changed (docs/decisions.md). The library is loaded once per process and
// never unloaded.
//
// Contexts. A pcp_mlir_context_t owns one MLIRContext that knows every
// dialect libIREECompiler.so registers (builtin, func, stablehlo, chlo,
// shape, tensor, arith, ...). Diagnostics emitted while parsing or verifying
// are captured and become the message of the returned status, formatted as
// "<buffer>:<line>:<col>: error: <text>".
//
// Threading: loading the library is thread-safe. A context and every module
// parsed in it are thread-compatible: use them from one thread at a time.
// Different contexts may be used from different threads concurrently.
//
// Ownership: *_create / *_parse return objects the caller releases;
// accessors borrow (valid while the object lives). A module must be released
// before the context it was parsed in.

#ifndef PCP_MLIR_MLIR_H_
#define PCP_MLIR_MLIR_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits and names
//===----------------------------------------------------------------------===//

// Largest MLIR text or bytecode accepted by default (ARCHITECTURE.md s.6:
// every input has a limit). Larger inputs are RESOURCE_EXHAUSTED before any
// parsing starts.
#define PCP_MLIR_MAX_MODULE_BYTES ((size_t)512 << 20)

// Environment variable overriding the path of libIREECompiler.so.
#define PCP_MLIR_COMPILER_LIB_ENV "PCP_IREE_COMPILER_LIB"

// The value of a dynamic ("?") dimension in pcp_mlir_type_t.dims.
#define PCP_MLIR_DYNAMIC_DIM ((int64_t)-1)

//===----------------------------------------------------------------------===//
// The compiler library
//===----------------------------------------------------------------------===//

// Loads libIREECompiler.so (once per process; later calls return the first
// result again), checks its embedding API version, resolves every symbol this
// module uses and initializes the compiler globally. Thread-safe.
// Returns NOT_FOUND when the file is missing, FAILED_PRECONDITION when dlopen
// fails, INCOMPATIBLE for an unsupported API version or a missing symbol;
// every message names the path and PCP_IREE_COMPILER_LIB.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_library_load(void);

// Path of the loaded library; NULL when loading failed. These three load the
// library first if needed. Borrowed static strings. Thread-safe.
const char* pcp_mlir_library_path(void);

// The embedding API version ((major << 16) | minor); 0 when loading failed.
int32_t pcp_mlir_library_api_version(void);

// The compiler's revision string (IREE's release tag or git revision; part
// of artifact cache keys); "" when loading failed or the library has none.
const char* pcp_mlir_library_revision(void);

//===----------------------------------------------------------------------===//
// pcp_mlir_context_t
//===----------------------------------------------------------------------===//

typedef struct pcp_mlir_context_t pcp_mlir_context_t;

typedef struct pcp_mlir_context_options_t {
  // Inputs larger than this are RESOURCE_EXHAUSTED. 0 means
  // PCP_MLIR_MAX_MODULE_BYTES.
  size_t max_module_byte_length;
  // Lets MLIR verify large modules on a thread pool. Off by default: PCP
  // parses in CLI tools and compile children where a pool is wasted start-up.
  bool enable_multithreading;
} pcp_mlir_context_options_t;

// Fills |out_options| with the defaults.
void pcp_mlir_context_options_initialize(
    pcp_mlir_context_options_t* out_options);

// Creates a context with every dialect of libIREECompiler.so registered.
// |options| may be NULL (defaults). Loads the library if needed and returns
// its status on failure. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_context_create(
    const pcp_mlir_context_options_t* options, pcp_allocator_t allocator,
    pcp_mlir_context_t** out_context);

// Destroys |context| (NULL is fine). Every module parsed in it must have been
// released.
void pcp_mlir_context_release(pcp_mlir_context_t* context);

//===----------------------------------------------------------------------===//
// pcp_mlir_module_t
//===----------------------------------------------------------------------===//

typedef struct pcp_mlir_module_t pcp_mlir_module_t;

// Parses |byte_length| bytes of MLIR text named
// |buffer_name| (used in diagnostics; NULL means "<input>"). The text needs
// no NUL terminator. A text without a top-level `module` gets an implicit one.
// The parser verifies the module, so a module that parses is also valid.
// Returns RESOURCE_EXHAUSTED over the context's size limit (nothing parsed),
// INVALID_ARGUMENT with the diagnostics ("model.mlir:3:7: error: ...") for
// malformed or invalid IR.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_module_parse(
    pcp_mlir_context_t* context, const char* text, size_t byte_length,
    const char* buffer_name, pcp_mlir_module_t** out_module);

// Destroys |module| (NULL is fine).
void pcp_mlir_module_release(pcp_mlir_module_t* module);

// Runs the MLIR verifier again (useful after a module was changed in place).
// INVALID_ARGUMENT with the diagnostics when it fails.
PCP_MUST_USE_RESULT pcp_status_t
pcp_mlir_module_verify(pcp_mlir_module_t* module);

// The module's symbol name (`module @jit_f` -> "jit_f"), "" when it has none.
// Borrowed.
const char* pcp_mlir_module_name(const pcp_mlir_module_t* module);

// The buffer name given to pcp_mlir_module_parse. Borrowed.
const char* pcp_mlir_module_buffer_name(const pcp_mlir_module_t* module);

typedef uint32_t pcp_mlir_print_flags_t;
enum pcp_mlir_print_flag_bits_e {
  PCP_MLIR_PRINT_FLAG_NONE = 0,
  // The generic form ("stablehlo.add"(%a, %b) : (...) -> ...), which any
  // MLIR parser reads back even without the dialect's custom syntax.
  PCP_MLIR_PRINT_FLAG_GENERIC = 1u << 0,
};

// Appends the module's text (pretty, or generic with
// PCP_MLIR_PRINT_FLAG_GENERIC) to |builder|. RESOURCE_EXHAUSTED when the
// builder's cap is reached (the builder then holds a prefix).
PCP_MUST_USE_RESULT pcp_status_t
pcp_mlir_module_print(pcp_mlir_module_t* module, pcp_mlir_print_flags_t flags,
                      pcp_string_builder_t* builder);

// Appends the module's file-metadata section as MLIR prints it after the
// top-level op ("{-# dialect_resources: {builtin: {name: "0x..."}} #-}"):
// the blobs that `dense_resource<name>` attributes refer to. A module text
// built from this module's ops needs it appended, or the compiler fails
// with "resource does not exist". Appends nothing when the module holds no
// resources. Prints the module once (the ops themselves are not kept).
// RESOURCE_EXHAUSTED when the builder's cap is reached.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_module_print_resources(
    pcp_mlir_module_t* module, pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Functions and signatures
//===----------------------------------------------------------------------===//

// The function looked up when no name is given.
#define PCP_MLIR_DEFAULT_FUNCTION "main"

// One `func.func` at the top level of a module. Borrowed from the module.
typedef struct pcp_mlir_function_info_t {
  const char* name;  // without '@'
  bool is_public;    // no sym_visibility, or "public"
  size_t argument_count;
  size_t result_count;
} pcp_mlir_function_info_t;

// Number of top-level func.func operations, public and private, in the
// order they appear.
size_t pcp_mlir_module_function_count(const pcp_mlir_module_t* module);

// Describes the |index|-th function (index < count).
void pcp_mlir_module_function_at(const pcp_mlir_module_t* module, size_t index,
                                 pcp_mlir_function_info_t* out_info);

typedef enum pcp_mlir_type_kind_e {
  // Anything else (tuple, !stablehlo.token, memref, ...): see |spelling|.
  PCP_MLIR_TYPE_KIND_OTHER = 0,
  PCP_MLIR_TYPE_KIND_RANKED_TENSOR = 1,
  PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR = 2,
  // A bare integer, float or index value (not a tensor).
  PCP_MLIR_TYPE_KIND_SCALAR = 3,
} pcp_mlir_type_kind_t;

// One argument or result type. Strings are owned by the signature.
typedef struct pcp_mlir_type_t {
  pcp_mlir_type_kind_t kind;
  // The element type (tensors) or the type itself (scalars); UNKNOWN when
  // PCP has no number for it (index, f8 variants, complex, OTHER).
  pcp_element_type_t element_type;
  // RANKED_TENSOR: 0..PCP_MAX_TENSOR_RANK; otherwise 0 for SCALAR and -1.
  int32_t rank;
  // Sizes of the first |rank| dimensions; PCP_MLIR_DYNAMIC_DIM for "?".
  int64_t dims[PCP_MAX_TENSOR_RANK];
  // The full MLIR spelling: "tensor<2x?xbf16>", "i32", "!stablehlo.token".
  const char* spelling;
  // The element's MLIR spelling ("bf16", "f8E4M3FN", "index"); "" for OTHER.
  const char* element_spelling;
} pcp_mlir_type_t;

// A function's arguments and results. Caller-embedded: fill it with one of
// the *_signature functions below, release with
// pcp_mlir_function_signature_deinitialize.
typedef struct pcp_mlir_function_signature_t {
  pcp_allocator_t allocator;
  char* function_name;  // without '@'
  bool is_public;
  size_t argument_count;
  pcp_mlir_type_t* arguments;
  size_t result_count;
  pcp_mlir_type_t* results;
  char* strings_;  // one block holding every spelling
} pcp_mlir_function_signature_t;

// Reads the signature of @|function_name| (NULL means "main") into
// |out_signature| (cleared first; allocated with |allocator|). Returns
// NOT_FOUND listing the module's functions when there is no such function,
// OUT_OF_RANGE for a tensor of rank above PCP_MAX_TENSOR_RANK.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_module_function_signature(
    pcp_mlir_module_t* module, const char* function_name,
    pcp_allocator_t allocator, pcp_mlir_function_signature_t* out_signature);

// Convenience for modules that only need to check inputs against a program:
// creates a context, parses |text|, reads @|function_name| (NULL: "main") and
// releases everything but the signature. Same status codes as the three
// calls it makes. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_text_function_signature(
    const char* text, size_t byte_length, const char* buffer_name,
    const char* function_name, pcp_allocator_t allocator,
    pcp_mlir_function_signature_t* out_signature);

// Frees what the signature owns; it may be filled again afterwards.
void pcp_mlir_function_signature_deinitialize(
    pcp_mlir_function_signature_t* signature);

// Appends the compact spelling of |type|: "2x3xf32", "?x4xbf16", "*xf32",
// "tensor<f32>" (rank 0), "i64" (scalar), the MLIR spelling otherwise.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_type_format(
    const pcp_mlir_type_t* type, pcp_string_builder_t* builder);

// Appends "@main(arg0: 2x3xf32, arg1: 3xf32) -> (2x3xf32)".
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_function_signature_format(
    const pcp_mlir_function_signature_t* signature,
    pcp_string_builder_t* builder);

// Checks a tensor described by (|element_type|, |rank|, |dims|; |dims| holds
// |rank| sizes and may be NULL only when |rank| is 0) against
// |expected|: a ranked tensor must match element type, rank and every static
// dimension (dynamic ones match any size); an unranked tensor matches any
// shape with its element type. |what| names the value in the message
// ("argument 1"). INVALID_ARGUMENT ("argument 1: expected 2x3xf32, got
// 2x4xf32") on a mismatch, also when |expected| is not a tensor.
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_type_check_tensor(
    const pcp_mlir_type_t* expected, pcp_element_type_t element_type,
    int32_t rank, const int64_t* dims, const char* what);

//===----------------------------------------------------------------------===//
// Function bodies (read-only IR walk)
//===----------------------------------------------------------------------===//

// One operation of a function body, as program builders (autodiff) need it.
// Values are numbered 0..value_count-1 over the whole function: the entry
// block's arguments first, then block arguments and results in the order the
// walk meets them. Strings are owned by the body.
typedef struct pcp_mlir_op_t {
  const char* name;  // "stablehlo.add"
  // Innermost "file:line:col" of the op's location (JAX and torch-mlir wrap
  // them), or the printed location when it has none.
  const char* location;
  // The op's inherent attributes in generic syntax ("<{dimensions = ...}>")
  // and its discardable ones ("{mhlo.sharding = ...}"); "" when absent. Both
  // are printed by MLIR and can be pasted back into a generic op.
  const char* properties;
  const char* attributes;
  uint32_t operand_count;
  uint32_t first_operand;  // index into pcp_mlir_function_body_t.operands
  uint32_t result_count;
  uint32_t first_result;  // value id of result 0; the others follow
  uint32_t region_count;  // one block per region
  uint32_t first_block;   // index of region 0's block; the others follow
} pcp_mlir_op_t;

typedef struct pcp_mlir_block_t {
  uint32_t argument_count;
  uint32_t first_argument;  // value id of argument 0
  uint32_t op_count;
  uint32_t first_op;  // ops of one block are contiguous
} pcp_mlir_block_t;

// A function's body flattened. Block 0 is the entry block; its arguments are
// the function's arguments (value ids 0..argument_count-1). Caller-embedded;
// release with pcp_mlir_function_body_deinitialize.
typedef struct pcp_mlir_function_body_t {
  pcp_allocator_t allocator;
  size_t value_count;
  pcp_mlir_type_t* values;  // type of each value
  size_t op_count;
  pcp_mlir_op_t* ops;
  size_t block_count;
  pcp_mlir_block_t* blocks;
  size_t operand_count;
  uint32_t* operands;  // value ids
  char* strings_;
} pcp_mlir_function_body_t;

// Walks @|function_name| (NULL: "main") of |module| into |out_body| (cleared
// first). NOT_FOUND when there is no such function, UNIMPLEMENTED for a
// region with more than one block (StableHLO functions have one),
// OUT_OF_RANGE for a tensor of rank above PCP_MAX_TENSOR_RANK,
// RESOURCE_EXHAUSTED when out of memory. Thread-compatible (the module).
PCP_MUST_USE_RESULT pcp_status_t pcp_mlir_module_function_body(
    pcp_mlir_module_t* module, const char* function_name,
    pcp_allocator_t allocator, pcp_mlir_function_body_t* out_body);

// Frees what the body owns.
void pcp_mlir_function_body_deinitialize(pcp_mlir_function_body_t* body);

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

// `pcp inspect model.mlir [--function NAME] [--print] [--generic] [--json]`
// (argv[0] = "inspect"). Prints the module's functions and the signature of
// @main (or NAME); --print prints the module back. Returns 0, 1 when the
// module cannot be read, parsed or has no such function, 2 on usage errors.
int pcp_mlir_inspect_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_MLIR_MLIR_H_
