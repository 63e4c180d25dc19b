// SPDX-License-Identifier: Apache-2.0
//
// compile: StableHLO MLIR -> IREE VMFB.
//
// The compiler always runs in a child process (the wheel's `iree-compile`):
// it maps a ~320 MB library and can crash on bad input, and neither may take
// down a gateway or worker. Each (backend, target) has one row in a flag
// table (reference/iree.md s.5). Artifacts are cached on disk under a key
// made of the SHA-256 of the MLIR text, the backend, the target, the
// effective flags and the compiler's version line, so a cache hit never runs
// the compiler and a compiler upgrade never serves a stale artifact.
//
// Later issues add the program builders (autodiff, optimizers, generation)
// to this module; the driver below is what they all end in.
//
// Thread-safety: all functions are thread-safe (the version probe runs once;
// cache writes are atomic renames, so two processes compiling the same key
// both succeed and one file wins).

#ifndef PCP_COMPILE_COMPILE_H_
#define PCP_COMPILE_COMPILE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Backends and targets
//===----------------------------------------------------------------------===//

// Device kinds a program can be compiled for. Numbers are stable (they
// appear in cache metadata and, later, on the wire).
typedef enum pcp_compile_backend_e {
  PCP_COMPILE_BACKEND_CPU = 0,
  PCP_COMPILE_BACKEND_CUDA = 1,
  PCP_COMPILE_BACKEND_ROCM = 2,
  PCP_COMPILE_BACKEND_VULKAN = 3,
  PCP_COMPILE_BACKEND_METAL = 4,
  PCP_COMPILE_BACKEND_COUNT_ = 5,
} pcp_compile_backend_t;

// "cpu", "cuda", "rocm", "vulkan", "metal".
const char* pcp_compile_backend_name(pcp_compile_backend_t backend);
// INVALID_ARGUMENT listing the valid names when |name| is not one.
PCP_MUST_USE_RESULT pcp_status_t
pcp_compile_backend_parse(const char* name, pcp_compile_backend_t* out_backend);

// The default target of |backend| ("host", "sm_80", "gfx942", "" for
// vulkan's IREE default, "macos" for metal).
const char* pcp_compile_backend_default_target(pcp_compile_backend_t backend);

// The resolved flags for one (backend, target), then the user's extra
// flags (pcp_compile_flags_add_extra).
#define PCP_COMPILE_MAX_FLAGS 48
#define PCP_COMPILE_MAX_FLAG_LENGTH 256
// At most this many extra flags from one source (--iree-flag, the
// experiment's iree_flags, $PCP_IREE_FLAGS).
#define PCP_COMPILE_MAX_EXTRA_FLAGS 16
// Extra iree-compile flags, space-separated, for every compile of the
// process (pcp_compile_module) and of the children it starts.
#define PCP_COMPILE_FLAGS_ENV "PCP_IREE_FLAGS"
// The CPU backend's default stack-allocation limit (IREE's own is 32 KiB;
// docs/decisions.md says why this one and how it was measured).
#define PCP_COMPILE_CPU_STACK_ALLOCATION_LIMIT \
  "--iree-llvmcpu-stack-allocation-limit=4194304"
typedef struct pcp_compile_flags_t {
  pcp_compile_backend_t backend;
  char requested_target[64];  // as asked ("" = default)
  char effective_target[64];  // what the compiler is told
  // Set when the target was substituted (e.g. sm_90a -> sm_80 PTX); a
  // human-readable reason for logs and `pcp compile --print-flags`.
  char note[192];
  int count;
  char flags[PCP_COMPILE_MAX_FLAGS][PCP_COMPILE_MAX_FLAG_LENGTH];
} pcp_compile_flags_t;

// Resolves |target| (NULL or "" = the backend default) into compiler flags.
// Unknown CUDA and ROCm targets are INVALID_ARGUMENT listing the known ones;
// CPU and Vulkan targets are checked for a sane spelling and otherwise passed
// through (LLVM and IREE know more names than we could list).
PCP_MUST_USE_RESULT pcp_status_t
pcp_compile_flags_resolve(pcp_compile_backend_t backend, const char* target,
                          pcp_compile_flags_t* out_flags);

// Checks one extra flag as a user gives it: "--name" or "--name=value",
// at most PCP_COMPILE_MAX_FLAG_LENGTH - 1 bytes, no whitespace or control
// characters, and not one of the options that decide what PCP gets back or
// where files go (-o, --output-format, --compile-to/--compile-from, the HAL
// target device and backends, --help/--version, anything that dumps or
// writes files: a name containing "dump", "file", "-path" or ending in
// "-to" or "-dir"). |origin| names the source in the message ("--iree-flag",
// "PCP_IREE_FLAGS", "iree_flags[2]"). INVALID_ARGUMENT otherwise.
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_flag_check(const char* flag,
                                                        const char* origin);

// Appends |count| extra flags to |flags| after checking each
// (pcp_compile_flag_check); a flag naming the same option as one already
// there (the part before '=') replaces it, so a user's
// --iree-llvmcpu-stack-allocation-limit=... overrides the table's default.
// INVALID_ARGUMENT for a bad flag or more than PCP_COMPILE_MAX_EXTRA_FLAGS.
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_flags_add_extra(
    pcp_compile_flags_t* flags, const char* const* extra, size_t count,
    const char* origin);

// Splits $PCP_IREE_FLAGS at spaces and tabs and adds the flags
// (pcp_compile_flags_add_extra; the messages name the variable). OK and
// nothing added when it is unset or blank.
PCP_MUST_USE_RESULT pcp_status_t
pcp_compile_flags_add_environment(pcp_compile_flags_t* flags);

//===----------------------------------------------------------------------===//
// The compiler
//===----------------------------------------------------------------------===//

// Path of the wheel's iree-compile: $PCP_IREE_COMPILE, else
// <venv>/lib/python3.11/site-packages/iree/compiler/_mlir_libs/iree-compile.
// NOT_FOUND (naming the path and `make setup`) when it is absent.
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_compiler_path(char* buffer,
                                                           size_t capacity);

// The compiler's version line, e.g. "3.13.0rc20261016 @ 89ece87b...". Probed
// once per process by running `iree-compile --version`. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_compiler_version(char* buffer,
                                                              size_t capacity);

// Upper bound on MLIR input (RESOURCE_EXHAUSTED beyond it).
#define PCP_COMPILE_MAX_MLIR_BYTES ((size_t)512 << 20)
// Compiler diagnostics kept for the error message (the tail is dropped).
#define PCP_COMPILE_MAX_DIAGNOSTIC_BYTES ((size_t)16 << 10)

typedef struct pcp_compile_request_t {
  const char* mlir_text;  // borrowed
  size_t mlir_byte_length;
  const char* source_name;  // for messages ("model.mlir"); may be NULL
  pcp_compile_backend_t backend;
  const char* target;  // NULL or "" = backend default
  // Cache directory: NULL = default ($PCP_CACHE_DIR, else
  // $XDG_CACHE_HOME/pcp/artifacts, else ~/.cache/pcp/artifacts).
  const char* cache_dir;
  bool disable_cache;  // always compile, never read or write the cache
  int64_t timeout_ms;  // 0 = 30 minutes
  // Extra iree-compile flags (borrowed), added after the table's flags and
  // $PCP_IREE_FLAGS (pcp_compile_flags_add_extra); part of the cache key.
  const char* const* iree_flags;
  size_t iree_flag_count;
  // Non-NULL when |mlir_text| was derived by
  // pcp_compile_training_module_build for this program ("grad", "train",
  // "diloco"). The text is then saved as
  // <cache_dir>/derived/<key>.<program>.mlir and compiled from that file, so
  // iree-compile's diagnostics name a file the user can open at the line
  // they cite; an error also says which user op each cited line came from
  // (the derived ops' "// from model.mlir:L:C (op)" comments).
  const char* derived_program;
} pcp_compile_request_t;

// Where a request's derived module is saved (see derived_program); valid
// after pcp_compile_module returned, also on failure ("" when nothing was
// saved).
#define PCP_COMPILE_DERIVED_DIRECTORY "derived"

typedef struct pcp_compile_result_t {
  uint8_t* vmfb;  // owned, 64-byte aligned; free() it
  size_t vmfb_byte_length;
  bool cache_hit;
  char cache_key[PCP_SHA256_HEX_LENGTH + 1];
  pcp_compile_flags_t flags;
  double compile_seconds;  // 0 on a cache hit
  // The saved derived module (request.derived_program), "" when none.
  char derived_path[1024];
} pcp_compile_result_t;

// Compiles (or fetches from the cache) one module. Errors:
//   INVALID_ARGUMENT  the compiler rejected the module; the message carries
//                     its diagnostics (file:line:col: error: ...)
//   INTERNAL          the compiler crashed (signal named) or wrote no output
//   DEADLINE_EXCEEDED the compiler ran past |timeout_ms| and was killed
//   NOT_FOUND         no compiler (venv missing)
//   RESOURCE_EXHAUSTED the input is over PCP_COMPILE_MAX_MLIR_BYTES
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_module(
    const pcp_compile_request_t* request, pcp_compile_result_t* out_result);

void pcp_compile_result_deinitialize(pcp_compile_result_t* result);

// The default cache directory as described above (borrowed static buffer
// filled once). Thread-safe.
const char* pcp_compile_default_cache_dir(void);

//===----------------------------------------------------------------------===//
// Training programs (autodiff and optimizer injection; docs/autodiff.md)
//===----------------------------------------------------------------------===//

// Which functions a derived training module holds besides the forward @main.
typedef enum pcp_compile_program_e {
  // @compute_gradients only.
  PCP_COMPILE_PROGRAM_GRAD = 0,
  // @compute_gradients, @apply_optimizer and (inner_steps > 0) @train_steps.
  PCP_COMPILE_PROGRAM_TRAIN = 1,
  // TRAIN (inner_steps >= 1) plus @diloco_round: one DiLoCo worker round
  // (src/compile/diloco_program.c); deltas in |delta_element|, the inner
  // AdamW state as |inner_state| says.
  PCP_COMPILE_PROGRAM_DILOCO = 2,
} pcp_compile_program_t;

// What @diloco_round does with the inner optimizer's state between rounds.
// Numbers are stable (0 is the default a zeroed options struct gets).
typedef enum pcp_compile_inner_state_e {
  // Fresh AdamW moments and step 1 every round, inside the function:
  // @diloco_round(params..., lr[K], data...) -> (deltas..., losses[K]).
  PCP_COMPILE_INNER_STATE_RESET = 0,
  // The moments and the step number are arguments and results, so a worker
  // can keep them across rounds (the DiLoCo paper's inner optimizer):
  // @diloco_round(params..., m..., v..., step, lr[K], data...)
  //     -> (deltas..., m'..., v'..., step + K, losses[K]).
  PCP_COMPILE_INNER_STATE_KEEP = 1,
} pcp_compile_inner_state_t;

// "reset" or "keep"; INVALID_ARGUMENT naming both for anything else
// (including NULL).
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_inner_state_parse(
    const char* name, pcp_compile_inner_state_t* out_state);

typedef struct pcp_compile_training_options_t {
  pcp_compile_program_t program;
  // The forward-loss function (NULL: "main").
  const char* function_name;
  // How many trailing arguments of the forward function are data (no
  // gradient). -1: the trailing arguments whose element type is not a float
  // (token ids, targets).
  int32_t data_argument_count;
  // @train_steps runs this many fused steps (0: no @train_steps) in one
  // stablehlo.while calling @compute_gradients and @apply_optimizer.
  int32_t inner_steps;
  // AdamW: beta1, beta2, epsilon, decoupled weight decay (scaled by lr) and
  // the global gradient norm above which gradients are scaled down (<= 0:
  // no clipping). lr and the step number are run-time arguments.
  double beta1;
  double beta2;
  double epsilon;
  double weight_decay;
  double max_grad_norm;
  // DILOCO: element type of the returned deltas, "f32" or "bf16" (NULL:
  // f32).
  const char* delta_element;
  // DILOCO: whether @diloco_round starts the inner AdamW afresh every round
  // or takes and returns its moments and step (default RESET). It changes
  // the derived text, so the artifact key (a hash of that text) too.
  pcp_compile_inner_state_t inner_state;
  // Gradient accumulation: A micro-batches per optimizer step (0 or 1: none,
  // the module is byte-for-byte what it is without this field; at most
  // PCP_COMPILE_MAX_ACCUMULATION_STEPS). With A > 1 the module also holds
  // @compute_gradients_accumulated(params..., data [A, ...]...) -> (loss,
  // grads...), the mean over the A micro-batches (sums in f32, f64 for f64),
  // and @train_steps / @diloco_round take data [K, A, ...] and call it once
  // per step; their losses are the per-step means.
  int64_t accumulation_steps;
} pcp_compile_training_options_t;

#define PCP_COMPILE_MAX_ACCUMULATION_STEPS 4096

// Defaults: GRAD, "main", data_argument_count -1, inner_steps 0, AdamW
// 0.9 / 0.999 / 1e-8 / 0.01, max_grad_norm 1.0, accumulation_steps 0.
void pcp_compile_training_options_initialize(
    pcp_compile_training_options_t* out_options);

// Derives a training module from a forward-loss module |mlir_text|
// (`@main(params..., data...) -> loss`, loss a rank-0 float tensor) and
// writes its StableHLO text (generic op form) to |out_text| (allocated with
// |allocator|; NUL-terminated; |out_byte_length| excludes the NUL). The
// module holds:
//   @main(params..., data...) -> loss                        (the forward)
//   @compute_gradients(params..., data...) -> (loss, dparams...)
//   A > 1: @compute_gradients_accumulated(params..., data [A, ...]...)
//            -> (loss, dparams...)    (means over A micro-batches)
//   TRAIN: @apply_optimizer(params..., grads..., m..., v..., step: f32,
//            lr: f32) -> (params'..., m'..., v'...)
//   TRAIN, k > 0: @train_steps(params..., m..., v..., step: f32,
//            lr: k x f32, data (each with a leading dimension k; [k, A, ...]
//            for A > 1)...) -> (params'..., m'..., v'..., step + k: f32,
//            losses: k x loss type); fused step i uses step + i and lr[i]
//   DILOCO, inner_state RESET: the TRAIN functions and
//            @diloco_round(params..., lr: k x f32, data [k, ...] or
//            [k, A, ...]...) -> (deltas..., losses: k x loss type)
//   DILOCO, inner_state KEEP: the TRAIN functions and
//            @diloco_round(params..., m..., v..., step: f32, lr: k x f32,
//            data...) -> (deltas..., m'..., v'..., step + k: f32, losses)
//            (m and v in the moment type: f32 for bf16 parameters)
// Reverse mode with one VJP rule per op. Errors: INVALID_ARGUMENT for a
// module that does not parse or a function that is not a forward loss;
// UNIMPLEMENTED naming the op and its location when gradient flows through
// an op without a rule (never silently dropped); NOT_FOUND for a missing
// function. Thread-safe (one MLIR context per call).
PCP_MUST_USE_RESULT pcp_status_t pcp_compile_training_module_build(
    const char* mlir_text, size_t mlir_byte_length, const char* source_name,
    const pcp_compile_training_options_t* options, pcp_allocator_t allocator,
    char** out_text, size_t* out_byte_length);

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

// `pcp compile model.mlir --backend B [--target T] -o out.vmfb`;
// `--program grad|train|diloco [--inner-steps K] [--accumulate A]
// [--inner-state reset|keep] [--emit-mlir out.mlir]` derives a training
// module first
// (pcp_compile_training_module_build).
int pcp_compile_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_COMPILE_COMPILE_H_
