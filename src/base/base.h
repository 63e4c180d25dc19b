// SPDX-License-Identifier: Apache-2.0
//
// base: the vocabulary every other PCP module speaks.
//
// Status objects (pcp_status_t, shaped like iree_status_t), allocators with a
// {self, ctl} interface, bump arenas over a shared block pool, string views
// and builders, key=value logging, an injectable clock and a seeded RNG, and
// SHA-256. Nothing here knows about networking, HTTP, MLIR or devices.
//
// Ownership rules (written once, here, for the whole project):
//   - A function named *_create or *_copy returns an object the caller owns
//     and must release (*_release) or deinitialize.
//   - Accessors (*_get, *_name, views) borrow: the result is valid only while
//     the object it came from is alive and unchanged.
//   - A callee that keeps a pointer beyond the call retains (or copies) it.
//   - A pcp_status_t that is not OK owns a heap payload: it must be returned,
//     consumed (pcp_status_consume_code), joined or ignored
//     (pcp_status_ignore).
//
// Thread-safety: status values, string views and the system allocator are
// thread-safe. Arenas are thread-compatible (one owner at a time); the block
// pool behind them is thread-safe. Logging is thread-safe (one write(2) per
// line).

#ifndef PCP_BASE_BASE_H_
#define PCP_BASE_BASE_H_

#include <assert.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Attributes and invariants
//===----------------------------------------------------------------------===//

#define PCP_MUST_USE_RESULT __attribute__((warn_unused_result))
#define PCP_PRINTF_ATTR(fmt_index, args_index) \
  __attribute__((format(printf, fmt_index, args_index)))
#define PCP_NORETURN __attribute__((noreturn))
#define PCP_ARRAYSIZE(a) (sizeof(a) / sizeof((a)[0]))
#define PCP_UNUSED(x) ((void)(x))

// Aborts with file:line and a message. Used for invariants only: input from a
// user, a peer or a file never reaches an assert (it gets a status).
PCP_NORETURN void pcp_abort_at(const char* file, int line, const char* fmt, ...)
    PCP_PRINTF_ATTR(3, 4);

// Always on, in every build type (release included).
#define PCP_ASSERT(cond)                                               \
  do {                                                                 \
    if (__builtin_expect(!(cond), 0)) {                                \
      pcp_abort_at(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    }                                                                  \
  } while (0)

// Expensive checks compiled only into debug builds.
#ifndef NDEBUG
#define PCP_DASSERT(cond) PCP_ASSERT(cond)
#else
#define PCP_DASSERT(cond) ((void)0)
#endif

//===----------------------------------------------------------------------===//
// pcp_status_t
//===----------------------------------------------------------------------===//

// Canonical codes. The numbers are IREE's (and absl's), which makes the
// conversion at the compute boundary lossless; they are also the code byte of
// the fabric's error frame, so they can never change.
typedef enum pcp_status_code_e {
  PCP_STATUS_OK = 0,
  PCP_STATUS_CANCELLED = 1,
  PCP_STATUS_UNKNOWN = 2,
  PCP_STATUS_INVALID_ARGUMENT = 3,
  PCP_STATUS_DEADLINE_EXCEEDED = 4,
  PCP_STATUS_NOT_FOUND = 5,
  PCP_STATUS_ALREADY_EXISTS = 6,
  PCP_STATUS_PERMISSION_DENIED = 7,
  PCP_STATUS_RESOURCE_EXHAUSTED = 8,
  PCP_STATUS_FAILED_PRECONDITION = 9,
  PCP_STATUS_ABORTED = 10,
  PCP_STATUS_OUT_OF_RANGE = 11,
  PCP_STATUS_UNIMPLEMENTED = 12,
  PCP_STATUS_INTERNAL = 13,
  PCP_STATUS_UNAVAILABLE = 14,
  PCP_STATUS_DATA_LOSS = 15,
  PCP_STATUS_UNAUTHENTICATED = 16,
  PCP_STATUS_DEFERRED = 17,
  PCP_STATUS_INCOMPATIBLE = 18,
  PCP_STATUS_CODE_COUNT_ = 19,
} pcp_status_code_t;

// Low bits hold the code; a non-OK status with a payload points at a heap
// block aligned to 32 bytes, so the two share one pointer-sized value. OK is
// 0, so `if (status)` is the error check.
#define PCP_STATUS_CODE_MASK 0x1Fu
#define PCP_STATUS_PAYLOAD_ALIGNMENT 32u

typedef struct pcp_status_handle_t* pcp_status_t;

#define pcp_ok_status() ((pcp_status_t)0)
#define pcp_status_is_ok(s) ((s) == NULL)

// Compile-time detail level, as IREE_STATUS_MODE: 0 = bare codes (no
// allocation, no messages), 1 = codes + messages, 2 = messages + file:line +
// annotations. Default 2.
#ifndef PCP_STATUS_MODE
#define PCP_STATUS_MODE 2
#endif

// Returns the canonical code of |status| without consuming it.
static inline pcp_status_code_t pcp_status_code(pcp_status_t status) {
  return (pcp_status_code_t)((uintptr_t)status & PCP_STATUS_CODE_MASK);
}

// Returns a stable upper-case name ("NOT_FOUND") for |code|.
const char* pcp_status_code_string(pcp_status_code_t code);

// Parses a name produced by pcp_status_code_string. Returns false if unknown.
bool pcp_status_code_from_string(const char* name, pcp_status_code_t* out_code);

// Allocates a status with |code| (must not be OK) and a printf message. Never
// fails: if the payload cannot be allocated the bare code is returned.
PCP_MUST_USE_RESULT pcp_status_t pcp_status_allocate_f(pcp_status_code_t code,
                                                       const char* file,
                                                       int line,
                                                       const char* fmt, ...)
    PCP_PRINTF_ATTR(4, 5);
PCP_MUST_USE_RESULT pcp_status_t
pcp_status_allocate_v(pcp_status_code_t code, const char* file, int line,
                      const char* fmt, va_list args) PCP_PRINTF_ATTR(4, 0);

#define pcp_make_status(code, ...) \
  pcp_status_allocate_f((code), __FILE__, __LINE__, __VA_ARGS__)

// Adds a line of context to |base| and returns it (takes ownership). OK stays
// OK. Annotations print innermost first, like a stack.
PCP_MUST_USE_RESULT pcp_status_t pcp_status_annotate_f(pcp_status_t base,
                                                       const char* fmt, ...)
    PCP_PRINTF_ATTR(2, 3);

// Frees the payload of |status| (if any). Use it to drop an error on purpose.
void pcp_status_ignore(pcp_status_t status);

// Frees the payload and returns the code.
pcp_status_code_t pcp_status_consume_code(pcp_status_t status);

// Returns the first error of |a| and |b|, annotated with the message of the
// other when both failed; consumes both.
PCP_MUST_USE_RESULT pcp_status_t pcp_status_join(pcp_status_t a,
                                                 pcp_status_t b);

// Returns a deep copy of |status| (same code, message and annotations).
PCP_MUST_USE_RESULT pcp_status_t pcp_status_clone(pcp_status_t status);

// Returns the message without code, location or annotations ("" if none).
// Borrowed: valid while |status| lives.
const char* pcp_status_message(pcp_status_t status);

// Formats "CODE: message; annotation; ..." (with file:line in mode 2) into
// |buffer| of |capacity| bytes (always NUL-terminated when capacity > 0).
// Returns the length the full text would need, like snprintf.
size_t pcp_status_format(pcp_status_t status, char* buffer, size_t capacity);

// Same text as pcp_status_format, but heap-allocated. Caller frees with free().
// Returns NULL only when out of memory.
char* pcp_status_to_string(pcp_status_t status);

// The text a user sees (CLI errors, log lines): "message; annotation; ..."
// without the code name and the source location, which are internal. At
// PCP_LOG_LEVEL=debug it is pcp_status_format's full text instead. A status
// without a message reads as its code in words ("not found"). Same return
// and truncation contract as pcp_status_format.
size_t pcp_status_format_for_user(pcp_status_t status, char* buffer,
                                  size_t capacity);

// Maps an errno value to the closest canonical code and formats a message
// that includes strerror(|error_number|). errno is passed in explicitly so
// that nothing between the failing call and this one can overwrite it.
PCP_MUST_USE_RESULT pcp_status_t pcp_status_from_errno_f(int error_number,
                                                         const char* file,
                                                         int line,
                                                         const char* fmt, ...)
    PCP_PRINTF_ATTR(4, 5);
#define pcp_status_from_errno(err, ...) \
  pcp_status_from_errno_f((err), __FILE__, __LINE__, __VA_ARGS__)

// Returns |expr| from the enclosing function if it failed, annotated with a
// printf-style context message.
#define PCP_RETURN_IF_ERROR(expr, ...)                            \
  do {                                                            \
    pcp_status_t pcp_status_tmp_ = (expr);                        \
    if (__builtin_expect(pcp_status_tmp_ != NULL, 0)) {           \
      return pcp_status_annotate_f(pcp_status_tmp_, __VA_ARGS__); \
    }                                                             \
  } while (0)

// Returns |expr| unannotated if it failed.
#define PCP_RETURN_IF_ERROR_BARE(expr)                  \
  do {                                                  \
    pcp_status_t pcp_status_tmp_ = (expr);              \
    if (__builtin_expect(pcp_status_tmp_ != NULL, 0)) { \
      return pcp_status_tmp_;                           \
    }                                                   \
  } while (0)

// Aborts with the formatted status if |expr| failed. For tests and for main()
// paths where failure means a programming error.
#define PCP_CHECK_OK(expr)                                                \
  do {                                                                    \
    pcp_status_t pcp_status_tmp_ = (expr);                                \
    if (pcp_status_tmp_) {                                                \
      char pcp_buf_[1024];                                                \
      pcp_status_format(pcp_status_tmp_, pcp_buf_, sizeof(pcp_buf_));     \
      pcp_abort_at(__FILE__, __LINE__, "%s failed: %s", #expr, pcp_buf_); \
    }                                                                     \
  } while (0)

//===----------------------------------------------------------------------===//
// pcp_allocator_t
//===----------------------------------------------------------------------===//

typedef enum pcp_allocator_command_e {
  PCP_ALLOCATOR_COMMAND_MALLOC = 0,
  PCP_ALLOCATOR_COMMAND_CALLOC = 1,
  PCP_ALLOCATOR_COMMAND_REALLOC = 2,
  PCP_ALLOCATOR_COMMAND_FREE = 3,
} pcp_allocator_command_t;

typedef struct pcp_allocator_alloc_params_t {
  size_t byte_length;  // requested size for MALLOC/CALLOC/REALLOC
} pcp_allocator_alloc_params_t;

// One entry point per allocator, IREE style: |inout_ptr| holds the old
// pointer for REALLOC/FREE and receives the new one.
typedef pcp_status_t (*pcp_allocator_ctl_fn_t)(
    void* self, pcp_allocator_command_t command,
    const pcp_allocator_alloc_params_t* params, void** inout_ptr);

// Passed by value into every _create. {NULL, NULL} is the null allocator
// (all allocations fail).
typedef struct pcp_allocator_t {
  void* self;
  pcp_allocator_ctl_fn_t ctl;
} pcp_allocator_t;

// malloc/free. Thread-safe.
pcp_allocator_t pcp_allocator_system(void);

// An allocator that fails every request (RESOURCE_EXHAUSTED).
pcp_allocator_t pcp_allocator_null(void);

PCP_MUST_USE_RESULT pcp_status_t pcp_allocator_malloc(pcp_allocator_t allocator,
                                                      size_t byte_length,
                                                      void** out_ptr);
PCP_MUST_USE_RESULT pcp_status_t pcp_allocator_calloc(pcp_allocator_t allocator,
                                                      size_t byte_length,
                                                      void** out_ptr);
// On failure *inout_ptr is unchanged and still owned by the caller.
PCP_MUST_USE_RESULT pcp_status_t pcp_allocator_realloc(
    pcp_allocator_t allocator, size_t byte_length, void** inout_ptr);
void pcp_allocator_free(pcp_allocator_t allocator, void* ptr);
// Frees memory that a C library returned from its own malloc (jansson's
// json_dumps, getline, realpath), named so that the raw-malloc lint
// (tools/lint/no_raw_malloc.py) can tell it from PCP's own allocations. Never
// for memory from a pcp_allocator_t.
void pcp_libc_free(void* ptr);

// Copies the NUL-terminated |text| into memory from |allocator|; the caller
// frees it with pcp_allocator_free. RESOURCE_EXHAUSTED when that fails.
PCP_MUST_USE_RESULT pcp_status_t pcp_allocator_strdup(pcp_allocator_t allocator,
                                                      const char* text,
                                                      char** out_text);

// Counts live and peak bytes of everything allocated through it (Redis
// zmalloc accounting). Embed it; wrap any base allocator. Thread-safe.
typedef struct pcp_allocator_counting_t {
  pcp_allocator_t base;
  _Atomic int64_t live_bytes;
  _Atomic int64_t peak_bytes;
  _Atomic int64_t allocation_count;
} pcp_allocator_counting_t;

void pcp_allocator_counting_initialize(pcp_allocator_t base,
                                       pcp_allocator_counting_t* out_counter);
pcp_allocator_t pcp_allocator_counting(pcp_allocator_counting_t* counter);

// Fails the Nth (0-based) allocation request and every one after it when
// |fail_forever|, else only that one. For SQLite-style OOM sweeps. Not
// thread-safe (tests drive it from one thread).
typedef struct pcp_allocator_failing_t {
  pcp_allocator_t base;
  int64_t fail_at_index;  // -1: never fail
  bool fail_forever;
  int64_t request_count;  // requests seen so far
  int64_t failure_count;  // requests failed so far
} pcp_allocator_failing_t;

void pcp_allocator_failing_initialize(pcp_allocator_t base,
                                      int64_t fail_at_index, bool fail_forever,
                                      pcp_allocator_failing_t* out_failing);
pcp_allocator_t pcp_allocator_failing(pcp_allocator_failing_t* failing);

//===----------------------------------------------------------------------===//
// Arenas
//===----------------------------------------------------------------------===//

// A thread-safe pool of fixed-size blocks shared by many arenas, so that a
// request's arena reuses memory instead of calling malloc per request.
typedef struct pcp_arena_block_pool_t pcp_arena_block_pool_t;

// |block_byte_length| is the usable size of each block (min 256).
PCP_MUST_USE_RESULT pcp_status_t
pcp_arena_block_pool_create(size_t block_byte_length, pcp_allocator_t allocator,
                            pcp_arena_block_pool_t** out_pool);
// All arenas using |pool| must be deinitialized first.
void pcp_arena_block_pool_release(pcp_arena_block_pool_t* pool);
// Number of blocks held in the free list (tests, metrics).
size_t pcp_arena_block_pool_free_count(pcp_arena_block_pool_t* pool);

typedef void (*pcp_arena_cleanup_fn_t)(void* user_data);

typedef struct pcp_arena_block_t pcp_arena_block_t;
typedef struct pcp_arena_cleanup_t pcp_arena_cleanup_t;

// Bump allocator over blocks from a pool. Allocations larger than a block go
// straight to the pool's allocator and are freed at reset. Thread-compatible.
typedef struct pcp_arena_t {
  pcp_arena_block_pool_t* pool;
  pcp_arena_block_t* blocks;      // used pool blocks, newest first
  pcp_arena_block_t* oversized;   // large allocations, freed on reset
  pcp_arena_cleanup_t* cleanups;  // run in reverse order on reset
  size_t block_offset;            // bytes used in the newest block
  size_t total_byte_length;       // bytes handed out since the last reset
} pcp_arena_t;

void pcp_arena_initialize(pcp_arena_block_pool_t* pool, pcp_arena_t* out_arena);
// Runs cleanups, returns blocks to the pool.
void pcp_arena_deinitialize(pcp_arena_t* arena);
// Same as deinitialize, but the arena stays usable.
void pcp_arena_reset(pcp_arena_t* arena);
// Returns 16-byte aligned memory valid until the next reset.
PCP_MUST_USE_RESULT pcp_status_t pcp_arena_allocate(pcp_arena_t* arena,
                                                    size_t byte_length,
                                                    void** out_ptr);
// Registers |fn(user_data)| to run at reset (nginx pool cleanups: close fds,
// unlink temp files). Cleanups run newest first.
PCP_MUST_USE_RESULT pcp_status_t pcp_arena_cleanup_add(
    pcp_arena_t* arena, pcp_arena_cleanup_fn_t fn, void* user_data);
// Copies a NUL-terminated string into the arena.
PCP_MUST_USE_RESULT pcp_status_t pcp_arena_strdup(pcp_arena_t* arena,
                                                  const char* value,
                                                  char** out_value);

//===----------------------------------------------------------------------===//
// Strings
//===----------------------------------------------------------------------===//

// A borrowed, not necessarily NUL-terminated, byte range.
typedef struct pcp_string_view_t {
  const char* data;
  size_t size;
} pcp_string_view_t;

pcp_string_view_t pcp_make_string_view(const char* data, size_t size);
pcp_string_view_t pcp_make_cstring_view(const char* value);
bool pcp_string_view_equal(pcp_string_view_t a, pcp_string_view_t b);
bool pcp_string_view_starts_with(pcp_string_view_t value,
                                 pcp_string_view_t prefix);
pcp_string_view_t pcp_string_view_trim(pcp_string_view_t value);
// Splits at the first |separator|: returns false (and the whole value in
// |out_head|) if absent.
bool pcp_string_view_split(pcp_string_view_t value, char separator,
                           pcp_string_view_t* out_head,
                           pcp_string_view_t* out_tail);

// Strict decimal parsers: the whole view must be a number in range.
bool pcp_string_view_parse_int64(pcp_string_view_t value, int64_t* out_value);
bool pcp_string_view_parse_uint64(pcp_string_view_t value, uint64_t* out_value);
bool pcp_string_view_parse_double(pcp_string_view_t value, double* out_value);

// A growable NUL-terminated buffer with a hard cap, so that no input can
// make it grow without bound.
typedef struct pcp_string_builder_t {
  pcp_allocator_t allocator;
  char* data;
  size_t size;
  size_t capacity;
  size_t max_size;
} pcp_string_builder_t;

// |max_size| 0 means SIZE_MAX/2.
void pcp_string_builder_initialize(pcp_allocator_t allocator, size_t max_size,
                                   pcp_string_builder_t* out_builder);
void pcp_string_builder_deinitialize(pcp_string_builder_t* builder);
void pcp_string_builder_reset(pcp_string_builder_t* builder);
PCP_MUST_USE_RESULT pcp_status_t pcp_string_builder_append(
    pcp_string_builder_t* builder, pcp_string_view_t value);
PCP_MUST_USE_RESULT pcp_status_t pcp_string_builder_append_cstring(
    pcp_string_builder_t* builder, const char* value);
PCP_MUST_USE_RESULT pcp_status_t pcp_string_builder_append_f(
    pcp_string_builder_t* builder, const char* fmt, ...) PCP_PRINTF_ATTR(2, 3);
// Returns the buffer (caller frees with the builder's allocator) and resets
// the builder to empty. Never NULL: an empty builder yields "".
PCP_MUST_USE_RESULT pcp_status_t
pcp_string_builder_take(pcp_string_builder_t* builder, char** out_value);
// Borrowed NUL-terminated contents ("" when empty).
const char* pcp_string_builder_cstring(const pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

// Reads a whole file, refusing files over |max_byte_length|
// (RESOURCE_EXHAUSTED) before reading any of it. The buffer is NUL-terminated
// (not counted in |out_byte_length|) and 64-byte aligned (IREE needs that for
// VMFBs); the caller frees it with free().
PCP_MUST_USE_RESULT pcp_status_t pcp_file_read_all(const char* path,
                                                   size_t max_byte_length,
                                                   void** out_data,
                                                   size_t* out_byte_length);

// Writes |data| to |path| atomically: a temp file beside it, fsync, rename.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_write_atomic(const char* path,
                                                       const void* data,
                                                       size_t byte_length);

// Appends |data| to the existing file |path| (not created: NOT_FOUND when
// absent) without fsync: it survives the process, not the machine. A
// failed append may leave part of |data| written.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_append(const char* path,
                                                 const void* data,
                                                 size_t byte_length);

// Creates |path| and its parents (mode 0755). Existing directories are fine.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_make_directories(const char* path);

// Returns true when |path| exists and is a regular file.
bool pcp_file_exists(const char* path);

// Resolves |path| to an absolute path without symbolic links or `.`/`..`
// components, as realpath(3) does, except that the path need not exist: the
// longest existing prefix is resolved and the missing rest appended (a
// missing component may not be `..`, and one that exists only as a dangling
// link is refused, so nothing can later be created through a link). A
// relative |path| is taken from the working directory. Writes a
// NUL-terminated string of at most |out_capacity| bytes to |out_path|.
// PERMISSION_DENIED when the path cannot be resolved that way (the message
// says nothing about the file: callers show it to clients);
// INVALID_ARGUMENT for an empty path; RESOURCE_EXHAUSTED when the result does
// not fit. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_path_resolve(const char* path,
                                                       char* out_path,
                                                       size_t out_capacity);

// Resolves |path| (pcp_file_path_resolve) and checks that it is one of the
// |root_count| directories |roots| or lies below one; each root is resolved
// the same way first (a root need not exist yet). The resolved path goes to
// |out_path| on success. PERMISSION_DENIED, with a message that names
// neither the file nor whether it exists, when it lies outside every root or
// cannot be resolved; INVALID_ARGUMENT for an empty path. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_path_confine(const char* path,
                                                       const char* const* roots,
                                                       size_t root_count,
                                                       char* out_path,
                                                       size_t out_capacity);

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

// Tensor element types shared by MLIR introspection, compute backends and the
// wire. The numbers travel in files and frames: never renumber.
typedef enum pcp_element_type_e {
  PCP_ELEMENT_TYPE_UNKNOWN = 0,
  PCP_ELEMENT_TYPE_F32 = 1,
  PCP_ELEMENT_TYPE_F16 = 2,
  PCP_ELEMENT_TYPE_BF16 = 3,
  PCP_ELEMENT_TYPE_F64 = 4,
  PCP_ELEMENT_TYPE_I1 = 5,  // bool, one byte per element in memory
  PCP_ELEMENT_TYPE_I8 = 6,
  PCP_ELEMENT_TYPE_I16 = 7,
  PCP_ELEMENT_TYPE_I32 = 8,
  PCP_ELEMENT_TYPE_I64 = 9,
  PCP_ELEMENT_TYPE_U8 = 10,
  PCP_ELEMENT_TYPE_U16 = 11,
  PCP_ELEMENT_TYPE_U32 = 12,
  PCP_ELEMENT_TYPE_U64 = 13,
  PCP_ELEMENT_TYPE_COUNT_ = 14,
} pcp_element_type_t;

// MLIR spelling: "f32", "bf16", "i1", "ui8" ... ("unknown" for UNKNOWN).
const char* pcp_element_type_name(pcp_element_type_t type);
// Parses MLIR spellings (also "u8"..."u64" and "bool"). False if unknown.
bool pcp_element_type_parse(pcp_string_view_t name,
                            pcp_element_type_t* out_type);
// Bytes per element in host memory (i1 is 1); 0 for UNKNOWN.
size_t pcp_element_type_byte_size(pcp_element_type_t type);

// Scalar conversions (round to nearest even; NaN stays NaN). float16.c.
uint16_t pcp_f32_to_f16(float value);
float pcp_f16_to_f32(uint16_t value);
uint16_t pcp_f32_to_bf16(float value);
float pcp_bf16_to_f32(uint16_t value);

// Maximum tensor rank accepted anywhere (inputs, files, frames).
#define PCP_MAX_TENSOR_RANK 16

//===----------------------------------------------------------------------===//
// Backends: the one table of device kinds
//===----------------------------------------------------------------------===//

// The device kinds PCP compiles for and runs on, in the one canonical order
// (the scheduler's and the compiler's enums are these numbers). The names
// travel in configs, JSON, metrics labels and on the wire; every module that
// reads or writes one goes through this table (src/base/backend.c), so an
// alias or a new kind is added in one place. Modules whose own enums predate
// this order (topology's worker classes, the worker's --backend list, whose
// order `--help` shows) map through the names, never through the numbers.
typedef enum pcp_backend_kind_e {
  PCP_BACKEND_KIND_CPU = 0,
  PCP_BACKEND_KIND_CUDA = 1,
  PCP_BACKEND_KIND_ROCM = 2,
  PCP_BACKEND_KIND_VULKAN = 3,
  PCP_BACKEND_KIND_METAL = 4,
  PCP_BACKEND_KIND_COUNT_ = 5,
  // Pseudo kinds, accepted only where the parse flags allow them.
  PCP_BACKEND_KIND_ANY = 6,   // "any": a placement that matches every kind
  PCP_BACKEND_KIND_AUTO = 7,  // "auto": detect at start (the host default)
} pcp_backend_kind_t;

// What a parse accepts beyond the five canonical names.
typedef uint32_t pcp_backend_parse_flags_t;
enum pcp_backend_parse_flag_bits_e {
  PCP_BACKEND_PARSE_FLAG_NONE = 0u,
  PCP_BACKEND_PARSE_FLAG_ANY = 1u << 0,   // "any" -> PCP_BACKEND_KIND_ANY
  PCP_BACKEND_PARSE_FLAG_AUTO = 1u << 1,  // "auto" -> PCP_BACKEND_KIND_AUTO
  // Vendor API names: "hip" -> rocm (ROCm's runtime is HIP; IREE's driver is
  // named after it, so users write either).
  PCP_BACKEND_PARSE_FLAG_ALIASES = 1u << 2,
  // IREE HAL driver names: "local-task" and "local-sync" -> cpu, "hip" ->
  // rocm (`pcp run --device`).
  PCP_BACKEND_PARSE_FLAG_DRIVERS = 1u << 3,
};

// One row of the table. Static storage; borrowed forever. Thread-safe.
typedef struct pcp_backend_kind_info_t {
  pcp_backend_kind_t kind;
  const char* name;                // canonical: "cpu", "cuda", "rocm", ...
  const char* iree_driver;         // runtime HAL driver: "local-task", "hip"...
  const char* iree_target_device;  // --iree-hal-target-device: "local", ...
  const char* default_target;      // "host", "sm_80", "gfx942", "", "macos"
  // Environment variables that restrict the visible devices, in the order
  // the vendor runtime reads them (the first one set wins); NULL-terminated.
  const char* const* visible_devices_env;
} pcp_backend_kind_info_t;

// The row of a concrete |kind|; NULL for pseudo kinds and out of range.
const pcp_backend_kind_info_t* pcp_backend_kind_info(pcp_backend_kind_t kind);

// Canonical name of |kind| ("any" and "auto" for the pseudo kinds); "unknown"
// out of range. Static string. Thread-safe.
const char* pcp_backend_kind_name(pcp_backend_kind_t kind);

// Parses |name| (exact, case-sensitive) into |out_kind|, accepting what
// |flags| allows. False if the name is not accepted; |out_kind| unchanged.
bool pcp_backend_kind_parse(pcp_string_view_t name,
                            pcp_backend_parse_flags_t flags,
                            pcp_backend_kind_t* out_kind);

// As pcp_backend_kind_parse, with an INVALID_ARGUMENT status on failure:
// "unknown backend 'x' (expected cpu, cuda, rocm, vulkan or metal)", the
// list written from the table (pcp_backend_kind_list_format).
PCP_MUST_USE_RESULT pcp_status_t pcp_backend_kind_parse_or_status(
    const char* name, pcp_backend_parse_flags_t flags,
    pcp_backend_kind_t* out_kind);

// Writes the canonical names in table order into |buffer| as "cpu, cuda,
// rocm, vulkan or metal" (preceded by "any, " / "auto, " when |flags| allow
// them). Truncates to |capacity|; always NUL-terminated.
void pcp_backend_kind_list_format(pcp_backend_parse_flags_t flags, char* buffer,
                                  size_t capacity);

// The IREE HAL driver that a canonical or driver name selects: "cpu" and
// "local-task" -> "local-task", "local-sync" -> "local-sync", "rocm" and
// "hip" -> "hip", the others their own name. NULL if |name| is neither.
const char* pcp_backend_iree_driver_for_name(pcp_string_view_t name);

// The kind "auto" resolves to on this machine: metal on Apple, else cpu.
pcp_backend_kind_t pcp_backend_kind_host(void);

//===----------------------------------------------------------------------===//
// The project's Python environment
//===----------------------------------------------------------------------===//

// Directory of the virtual environment holding the pinned IREE wheels:
// $PCP_VENV if set, else the path configured at build time (<source>/.venv).
// Borrowed static string. Thread-safe.
const char* pcp_venv_directory(void);

// Writes "<venv>/lib/python3.11/site-packages" into |buffer|. Returns
// NOT_FOUND naming the path (and how to fix it) when it does not exist.
PCP_MUST_USE_RESULT pcp_status_t pcp_venv_site_packages(char* buffer,
                                                        size_t capacity);

//===----------------------------------------------------------------------===//
// Time
//===----------------------------------------------------------------------===//

// Injected time source. Nothing outside base/ calls clock_gettime: the
// deterministic simulator replaces the clock.
typedef struct pcp_clock_t {
  void* self;
  int64_t (*now_ns)(void* self);   // monotonic nanoseconds
  int64_t (*wall_ns)(void* self);  // Unix epoch nanoseconds
} pcp_clock_t;

// CLOCK_MONOTONIC / CLOCK_REALTIME. Thread-safe.
pcp_clock_t pcp_clock_system(void);

// A clock that moves only when told (tests, simulation). Thread-compatible.
typedef struct pcp_clock_manual_t {
  int64_t now_ns;
  int64_t wall_ns;
} pcp_clock_manual_t;
pcp_clock_t pcp_clock_manual(pcp_clock_manual_t* state);
void pcp_clock_manual_advance(pcp_clock_manual_t* state, int64_t delta_ns);

static inline int64_t pcp_clock_now_ns(pcp_clock_t clock) {
  return clock.now_ns(clock.self);
}
static inline int64_t pcp_clock_wall_ns(pcp_clock_t clock) {
  return clock.wall_ns(clock.self);
}

// Sleeps the calling thread (real time; not for simulated code paths).
void pcp_sleep_ms(int64_t duration_ms);

// CLOCK_REALTIME now plus |duration_ms| (>= 0), normalised: the absolute
// deadline pthread_cond_timedwait takes on a default condition variable.
struct timespec pcp_realtime_deadline_ms(int64_t duration_ms);

//===----------------------------------------------------------------------===//
// Random numbers
//===----------------------------------------------------------------------===//

// xoshiro256** seeded through splitmix64: fast, small state, reproducible
// from one 64-bit seed (the simulator prints seeds for replay).
typedef struct pcp_rng_t {
  uint64_t state[4];
} pcp_rng_t;

void pcp_rng_initialize(uint64_t seed, pcp_rng_t* out_rng);
uint64_t pcp_rng_next_u64(pcp_rng_t* rng);
// Uniform in [0, 1).
double pcp_rng_next_double(pcp_rng_t* rng);
// Uniform in [0, bound) without modulo bias; |bound| > 0.
uint64_t pcp_rng_next_below(pcp_rng_t* rng, uint64_t bound);
// Standard normal (Box-Muller).
double pcp_rng_next_normal(pcp_rng_t* rng);

//===----------------------------------------------------------------------===//
// SHA-256
//===----------------------------------------------------------------------===//

#define PCP_SHA256_BYTE_LENGTH 32
#define PCP_SHA256_HEX_LENGTH 64

typedef struct pcp_sha256_t {
  uint8_t bytes[PCP_SHA256_BYTE_LENGTH];
} pcp_sha256_t;

void pcp_sha256_compute(const void* data, size_t byte_length,
                        pcp_sha256_t* out_digest);
// Writes 64 lowercase hex characters and a NUL into |out_hex| (65 bytes).
void pcp_sha256_to_hex(const pcp_sha256_t* digest,
                       char out_hex[PCP_SHA256_HEX_LENGTH + 1]);

// Incremental form for data that arrives in pieces.
typedef struct pcp_sha256_stream_t pcp_sha256_stream_t;
PCP_MUST_USE_RESULT pcp_status_t
pcp_sha256_stream_create(pcp_sha256_stream_t** out_stream);
void pcp_sha256_stream_update(pcp_sha256_stream_t* stream, const void* data,
                              size_t byte_length);
// Writes the digest and releases |stream|.
void pcp_sha256_stream_finish(pcp_sha256_stream_t* stream,
                              pcp_sha256_t* out_digest);

// SHA-256 of the bytes readable from the open file |fd| (from its current
// offset to the end, read in 1 MiB pieces) and their count. The caller keeps
// the descriptor: hashing an fd pins the inode, so a file replaced by
// rename meanwhile cannot mix two versions. Errors: errno statuses.
PCP_MUST_USE_RESULT pcp_status_t pcp_file_sha256_fd(int fd,
                                                    pcp_sha256_t* out_digest,
                                                    uint64_t* out_byte_length);
// The same for the file at |path| (opened and closed here).
PCP_MUST_USE_RESULT pcp_status_t pcp_file_sha256(const char* path,
                                                 pcp_sha256_t* out_digest,
                                                 uint64_t* out_byte_length);

//===----------------------------------------------------------------------===//
// Base64 (RFC 4648)
//===----------------------------------------------------------------------===//

// Decodes |length| characters of |text| (padding optional) into
// |*out_data| (allocated from |allocator|, at least one byte; caller frees)
// and |*out_length|. INVALID_ARGUMENT naming the offset of a bad character
// or a truncated input; RESOURCE_EXHAUSTED. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_base64_decode(pcp_allocator_t allocator,
                                                   const char* text,
                                                   size_t length,
                                                   uint8_t** out_data,
                                                   size_t* out_length);
// Encodes |length| bytes with padding into |*out_text| (NUL-terminated,
// from |allocator|; caller frees) and |*out_text_length|. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_base64_encode(pcp_allocator_t allocator,
                                                   const void* data,
                                                   size_t length,
                                                   char** out_text,
                                                   size_t* out_text_length);

//===----------------------------------------------------------------------===//
// Libraries loaded at first use
//===----------------------------------------------------------------------===//

// Heavy libraries that only some subcommands need (libz3 for the topology
// solver, libcurl for the HTTP client) are opened with dlopen when first
// used, so `pcp run` maps only what it uses (docs/decisions.md, "Lazy
// loading"). A module keeps a table of typed function pointers and one
// pcp_dynlib_symbol_t per entry.
typedef struct pcp_dynlib_symbol_t {
  const char* name;  // exported symbol name
  size_t offset;     // byte offset of its function pointer in the table
} pcp_dynlib_symbol_t;

// Opens the first of the NULL-terminated |sonames| that the dynamic loader
// finds (RTLD_NOW | RTLD_LOCAL; never closed) and stores the address of every
// entry of |symbols| at its offset in |inout_table|. |what| says what needs
// the library and |package| which Debian package provides it; both appear in
// the error. Returns NOT_FOUND when no soname loads, INCOMPATIBLE when a
// symbol is missing (|inout_table| is then partly written and must not be
// used). Thread-compatible: callers serialise (pthread_once).
PCP_MUST_USE_RESULT pcp_status_t pcp_dynlib_load(
    const char* const* sonames, const char* what, const char* package,
    const pcp_dynlib_symbol_t* symbols, size_t symbol_count, void* inout_table);

//===----------------------------------------------------------------------===//
// Logging
//===----------------------------------------------------------------------===//

// Four levels (Redis LL_*). Lines go to stderr as one write each:
//   ts=2026-12-02T09:00:00.123Z level=info role=worker node=n1 msg="joined"
typedef enum pcp_log_level_e {
  PCP_LOG_DEBUG = 0,
  PCP_LOG_INFO = 1,
  PCP_LOG_WARN = 2,
  PCP_LOG_ERROR = 3,
} pcp_log_level_t;

// Who is speaking. Fields may be NULL (omitted from the line). Borrowed.
typedef struct pcp_log_context_t {
  const char* role;
  const char* node_id;
  const char* connection_id;
  const char* job_id;
} pcp_log_context_t;

// Debug lines below this level are compiled out.
#ifndef PCP_LOG_COMPILED_LEVEL
#define PCP_LOG_COMPILED_LEVEL PCP_LOG_DEBUG
#endif

// Process-wide minimum level (default INFO, or PCP_LOG_LEVEL=debug|info|
// warn|error from the environment at first use). Thread-safe.
void pcp_log_set_level(pcp_log_level_t level);
pcp_log_level_t pcp_log_level(void);
bool pcp_log_level_parse(const char* name, pcp_log_level_t* out_level);
const char* pcp_log_level_name(pcp_log_level_t level);

// Redirects output (tests). NULL restores stderr. Not thread-safe against
// concurrent logging.
void pcp_log_set_sink(FILE* sink);

void pcp_log_write(pcp_log_level_t level, const pcp_log_context_t* context,
                   const char* file, int line, const char* fmt, ...)
    PCP_PRINTF_ATTR(5, 6);

#define PCP_LOG(level, context, ...)                                       \
  do {                                                                     \
    if ((level) >= PCP_LOG_COMPILED_LEVEL && (level) >= pcp_log_level()) { \
      pcp_log_write((level), (context), __FILE__, __LINE__, __VA_ARGS__);  \
    }                                                                      \
  } while (0)

// Logs a status at |level| with a message prefix; does not consume it.
void pcp_log_status(pcp_log_level_t level, const pcp_log_context_t* context,
                    pcp_status_t status, const char* what);

//===----------------------------------------------------------------------===//
// Fault injection (BUGGIFY, for the deterministic simulation)
//===----------------------------------------------------------------------===//

// PCP_BUGGIFY("site") marks a place where a real fault can happen (a store
// write, a frame send, a task completion). It is false unless a simulation
// installed a hook (src/sim), which decides from its seeded RNG whether the
// site fires; the code under it then takes the error path a real fault
// would take. Without a hook the cost is one load and a predicted branch; a
// build with -DPCP_BUGGIFY_DISABLED compiles every site to `false`. Sites are
// named by string literals "module.what" (docs/simulation.md lists them).
// The hook is process-wide: install it before other threads start and
// remove it (NULL) after they stop; the simulation is single-threaded.
typedef bool (*pcp_buggify_fn_t)(void* user_data, const char* site);

// Installs |fn| (NULL removes the hook). Not thread-safe (see above).
void pcp_buggify_install(pcp_buggify_fn_t fn, void* user_data);

// The installed hook, NULL when none. Read by PCP_BUGGIFY only.
extern pcp_buggify_fn_t pcp_buggify_hook_;
bool pcp_buggify_fire_(const char* site);

#if defined(PCP_BUGGIFY_DISABLED)
#define PCP_BUGGIFY(site) false
#else
#define PCP_BUGGIFY(site) \
  (__builtin_expect(pcp_buggify_hook_ != NULL, 0) && pcp_buggify_fire_(site))
#endif

#ifdef __cplusplus
}
#endif

#endif  // PCP_BASE_BASE_H_
