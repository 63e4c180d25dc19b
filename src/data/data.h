// SPDX-License-Identifier: Apache-2.0
//
// data: training datasets, batch sampling, sharding into byte ranges.
//
// A pcp_data_dataset_t is one file mapped read-only (mmap), in one of three
// formats: `char` (UTF-8 text, one token per code point, the vocabulary being
// the file's distinct code points sorted ascending: nanoGPT's shakespeare_char
// mapping, 65 symbols for tiny_shakespeare), `byte` (one token per byte,
// vocabulary 256) or `u16` (little-endian uint16 token ids, vocabulary given or
// max id + 1). The vocabulary always comes from the whole file, so every
// worker that opens the same file gets the same mapping whatever range it
// samples (upstream built it from the first 2 MiB and capped it at 65).
//
// Ranges are byte ranges of the file (pcp_data_range_t) whose ends sit on
// token boundaries: even offsets for u16, UTF-8 lead bytes for char. A
// train/validation split, a shard and an assignment are all such ranges, so an
// assignment can travel in a task as {path, offset, length} and the worker maps
// the file itself (the control plane never ships data).
//
// A pcp_data_sampler_t draws batches of B rows of T+1 tokens inside one range:
// input_ids[b][t] = tok[s_b + t], targets[b][t] = tok[s_b + t + 1], i32. Random
// sampling draws s_b uniformly in [0, n - T - 1] from a seeded pcp_rng_t (the
// nanoGPT get_batch); sequential sampling walks the range in windows of B*T+1
// tokens, row b starting at position + b*T (nanochat's fifo), and wraps to the
// next epoch when the rest is too short. The sampler's whole state is a
// pcp_data_cursor_t {rng state, position, epoch}: saving it with a checkpoint
// and restoring it gives the same batches as a run that never stopped.
//
// Ownership: a dataset owns its mapping and vocabulary; samplers borrow the
// dataset, which must outlive them. Assignments and cursors are plain values.
//
// Thread-safety: a dataset is immutable after open and thread-safe. A sampler
// is thread-compatible (one owner at a time). The free functions are
// thread-safe.

#ifndef PCP_DATA_DATA_H_
#define PCP_DATA_DATA_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

// Default file size cap (64 GiB): the mapping costs address space, not memory,
// but a char dataset decodes its sampled range into 4 bytes per token.
#define PCP_DATA_DEFAULT_MAX_FILE_BYTE_LENGTH (UINT64_C(64) << 30)
// Longest path an assignment carries (bytes, without the NUL).
#define PCP_DATA_MAX_PATH_LENGTH 1023
// Most workers one sharding plan accepts.
#define PCP_DATA_MAX_WORKERS 65536
// Longest worker id a sharding plan accepts (bytes).
#define PCP_DATA_MAX_WORKER_ID_LENGTH 255
// Longest text form of an assignment (JSON bytes).
#define PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH 8192

//===----------------------------------------------------------------------===//
// Datasets
//===----------------------------------------------------------------------===//

// The numbers are not on any wire (the text names are): free to change.
typedef enum pcp_data_format_e {
  PCP_DATA_FORMAT_CHAR = 0,
  PCP_DATA_FORMAT_BYTE = 1,
  PCP_DATA_FORMAT_U16 = 2,
} pcp_data_format_t;

// "char", "byte", "u16" (the experiment's `tokenizer` values).
const char* pcp_data_format_name(pcp_data_format_t format);
// Parses those names. False if unknown.
bool pcp_data_format_parse(pcp_string_view_t name,
                           pcp_data_format_t* out_format);

typedef struct pcp_data_dataset_options_t {
  pcp_data_format_t format;
  // Files larger than this are RESOURCE_EXHAUSTED before mapping; 0 means
  // PCP_DATA_DEFAULT_MAX_FILE_BYTE_LENGTH.
  uint64_t max_file_byte_length;
  // u16 only: 0 means max id + 1; otherwise every id must be below it.
  uint32_t vocab_size;
} pcp_data_dataset_options_t;

// Fills |out_options| with the defaults for |format|.
void pcp_data_dataset_options_initialize(
    pcp_data_format_t format, pcp_data_dataset_options_t* out_options);

// A byte range of a dataset file, both ends on token boundaries.
typedef struct pcp_data_range_t {
  uint64_t byte_offset;
  uint64_t byte_length;
} pcp_data_range_t;

typedef struct pcp_data_dataset_t pcp_data_dataset_t;

// Maps |path| read-only and builds the vocabulary (one pass over the file for
// char and u16). Errors: NOT_FOUND / PERMISSION_DENIED (open), INVALID_ARGUMENT
// (empty file, odd-length u16 file, invalid UTF-8 in a char file with its byte
// offset, a u16 id not below the given vocab_size, path too long),
// RESOURCE_EXHAUSTED (over the size cap, out of memory).
PCP_MUST_USE_RESULT pcp_status_t pcp_data_dataset_open(
    const char* path, const pcp_data_dataset_options_t* options,
    pcp_allocator_t allocator, pcp_data_dataset_t** out_dataset);

// Unmaps and frees. Every sampler over it must be released first. NULL is ok.
void pcp_data_dataset_release(pcp_data_dataset_t* dataset);

pcp_data_format_t pcp_data_dataset_format(const pcp_data_dataset_t* dataset);
// Borrowed path as given to open.
const char* pcp_data_dataset_path(const pcp_data_dataset_t* dataset);
uint64_t pcp_data_dataset_byte_length(const pcp_data_dataset_t* dataset);
uint32_t pcp_data_dataset_vocab_size(const pcp_data_dataset_t* dataset);
// Borrowed file bytes (the mapping).
const uint8_t* pcp_data_dataset_bytes(const pcp_data_dataset_t* dataset);

// The whole file as a range.
pcp_data_range_t pcp_data_dataset_full_range(const pcp_data_dataset_t* dataset);

// char only: the sorted code points, id i standing for symbols[i]; NULL (and
// 0) for the other formats. Borrowed.
const uint32_t* pcp_data_dataset_symbols(const pcp_data_dataset_t* dataset,
                                         size_t* out_symbol_count);

// The largest token boundary <= |byte_offset| (clamped to the file length).
uint64_t pcp_data_dataset_align_down(const pcp_data_dataset_t* dataset,
                                     uint64_t byte_offset);

// Number of tokens in |range|. INVALID_ARGUMENT if the range is outside the
// file or its ends are not token boundaries.
PCP_MUST_USE_RESULT pcp_status_t
pcp_data_dataset_token_count(const pcp_data_dataset_t* dataset,
                             pcp_data_range_t range, uint64_t* out_token_count);

// Splits the file into train = [0, cut) and validation = [cut, end) with cut
// = align_down(floor(length * (1 - |validation_fraction|))): nanoGPT's first
// 90% / last 10%. |validation_fraction| in [0, 1), else INVALID_ARGUMENT.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_dataset_split(
    const pcp_data_dataset_t* dataset, double validation_fraction,
    pcp_data_range_t* out_train, pcp_data_range_t* out_validation);

// Text -> ids (char: code points through the vocabulary; byte: identity).
// Writes at most |capacity| ids; |out_count| gets the number the text needs
// (RESOURCE_EXHAUSTED when that exceeds capacity). Errors: NOT_FOUND (a code
// point outside the vocabulary, named), INVALID_ARGUMENT (invalid UTF-8),
// FAILED_PRECONDITION (u16 has no text form).
PCP_MUST_USE_RESULT pcp_status_t pcp_data_dataset_encode(
    const pcp_data_dataset_t* dataset, pcp_string_view_t text, int32_t* out_ids,
    size_t capacity, size_t* out_count);

// Ids -> text (UTF-8), NUL-terminated when it fits. |out_byte_length| gets the
// length the text needs (RESOURCE_EXHAUSTED when it plus the NUL exceeds
// |capacity|). OUT_OF_RANGE for an id outside the vocabulary;
// FAILED_PRECONDITION for u16.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_dataset_decode(
    const pcp_data_dataset_t* dataset, const int32_t* ids, size_t id_count,
    char* out_text, size_t capacity, size_t* out_byte_length);

//===----------------------------------------------------------------------===//
// Sampling
//===----------------------------------------------------------------------===//

typedef enum pcp_data_sampling_e {
  PCP_DATA_SAMPLING_RANDOM = 0,
  PCP_DATA_SAMPLING_SEQUENTIAL = 1,
} pcp_data_sampling_t;

// "random", "sequential" (also parses upstream's "fifo" as sequential).
const char* pcp_data_sampling_name(pcp_data_sampling_t sampling);
bool pcp_data_sampling_parse(pcp_string_view_t name,
                             pcp_data_sampling_t* out_sampling);

// Everything a sampler needs to continue exactly where it was.
//   rng_state: the xoshiro256** state (random sampling; sequential keeps it
//              untouched);
//   position:  tokens consumed in the current epoch (random) or the start of
//              the next window (sequential), relative to the range;
//   epoch:     completed passes over the range (0 in the first pass).
typedef struct pcp_data_cursor_t {
  uint64_t rng_state[4];
  uint64_t position;
  uint64_t epoch;
} pcp_data_cursor_t;

// Longest text form of a cursor (without the NUL).
#define PCP_DATA_MAX_CURSOR_JSON_LENGTH 192

// JSON text {"rng":"<64 hex>","position":N,"epoch":E} (u64 state as hex: JSON
// numbers above 2^53 do not survive every parser). |capacity| must be at
// least PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1.
void pcp_data_cursor_format(const pcp_data_cursor_t* cursor, char* out_text,
                            size_t capacity);
// INVALID_ARGUMENT naming the bad field.
PCP_MUST_USE_RESULT pcp_status_t
pcp_data_cursor_parse(pcp_string_view_t text, pcp_data_cursor_t* out_cursor);

typedef struct pcp_data_sampler_options_t {
  pcp_data_sampling_t sampling;
  uint32_t batch_size;  // B >= 1
  uint32_t block_size;  // T >= 1
  uint64_t seed;        // seeds the rng (random sampling)
} pcp_data_sampler_options_t;

typedef struct pcp_data_sampler_t pcp_data_sampler_t;

// A sampler over |range| of |dataset| (borrowed). A char range is decoded
// into an owned i32 buffer; byte and u16 ranges are read from the mapping.
// Errors: INVALID_ARGUMENT (B or T zero, range not on token boundaries,
// B*T overflows), OUT_OF_RANGE (the range holds fewer than T+1 tokens, or
// fewer than B*T+1 for sequential sampling: the message gives both counts),
// RESOURCE_EXHAUSTED.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_sampler_create(
    const pcp_data_dataset_t* dataset, pcp_data_range_t range,
    const pcp_data_sampler_options_t* options, pcp_allocator_t allocator,
    pcp_data_sampler_t** out_sampler);
void pcp_data_sampler_release(pcp_data_sampler_t* sampler);

// Tokens in the sampler's range.
uint64_t pcp_data_sampler_token_count(const pcp_data_sampler_t* sampler);

// Fills |out_input_ids| and |out_targets| (B*T i32 each, row-major [B, T]) and,
// when |out_row_offsets| is not NULL, the B token offsets (relative to the
// range) the rows start at. Advances the cursor. Never fails.
void pcp_data_sampler_next(pcp_data_sampler_t* sampler, int32_t* out_input_ids,
                           int32_t* out_targets, uint64_t* out_row_offsets);

// The current cursor (a copy).
void pcp_data_sampler_cursor(const pcp_data_sampler_t* sampler,
                             pcp_data_cursor_t* out_cursor);
// Continues from |cursor|. OUT_OF_RANGE when the position does not fit the
// range (a cursor of another range); the sampler is unchanged then.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_sampler_restore(
    pcp_data_sampler_t* sampler, const pcp_data_cursor_t* cursor);

//===----------------------------------------------------------------------===//
// Sharding and assignments
//===----------------------------------------------------------------------===//

// One worker's share of a dataset, as it travels in a task. |cursor| is
// meaningful when |has_cursor| (a resumed assignment); otherwise the worker
// starts a sampler seeded with |seed|.
typedef struct pcp_data_assignment_t {
  char path[PCP_DATA_MAX_PATH_LENGTH + 1];
  pcp_data_range_t range;
  uint64_t step;  // outer step from which the assignment holds
  uint64_t seed;
  pcp_data_cursor_t cursor;
  pcp_data_format_t format;
  uint32_t shard_index;  // 0-based position among the sorted worker ids
  uint32_t shard_count;
  bool has_cursor;
} pcp_data_assignment_t;

// Splits |range| of |dataset| among |worker_count| workers: the ids are sorted
// (bytewise) and worker k of that order gets the k-th of W contiguous,
// boundary-aligned pieces of near-equal token share; the pieces cover the
// range exactly and do not overlap. |out_assignments[i]| is the assignment of
// |worker_ids[i]| (any input order gives the same plan). seed =
// first 8 bytes (LE) of SHA-256("pcp.data.seed|<base_seed>|<worker
// id>|<step>"), so a plan is a deterministic function of (dataset, range,
// worker ids, step, base seed): re-sharding when a worker joins at outer step s
// is calling this again with the new id set and s, and every worker restarts
// its sampler with its new seed. Errors: INVALID_ARGUMENT (no workers, more
// than PCP_DATA_MAX_WORKERS, an empty, duplicate or too long id, block_size 0,
// a range off token boundaries),
// OUT_OF_RANGE (a piece would hold fewer than block_size+1 tokens: the
// message gives the counts), RESOURCE_EXHAUSTED.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_shard_plan(
    const pcp_data_dataset_t* dataset, pcp_data_range_t range,
    uint32_t block_size, const char* const* worker_ids, size_t worker_count,
    uint64_t step, uint64_t base_seed, pcp_data_assignment_t* out_assignments);

// JSON text of an assignment, in upstream's data_assignment shape plus ours:
// {"kind":"byte_range","provider":"local_path","path":...,"tokenizer":...,
//  "offset":N,"length":N,"chunk_id":k,"shard_index":k,"shard_count":W,
//  "step":s,"seed":"<16 hex>"[,"cursor":{...}]}. |capacity| must be at least
// PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1. RESOURCE_EXHAUSTED otherwise.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_assignment_format(
    const pcp_data_assignment_t* assignment, char* out_text, size_t capacity);
// Parses that text (unknown keys ignored; kind must be byte_range and provider
// local_path, or a "file://" uri in "uri"). INVALID_ARGUMENT naming the field.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_assignment_parse(
    pcp_string_view_t text, pcp_data_assignment_t* out_assignment);

//===----------------------------------------------------------------------===//
// Effective batch size
//===----------------------------------------------------------------------===//

// effective = micro_batch x worker_count x accumulation_steps. INVALID_ARGUMENT
// if any factor is zero, OUT_OF_RANGE on overflow.
PCP_MUST_USE_RESULT pcp_status_t pcp_data_effective_batch_size_compute(
    uint32_t micro_batch, uint32_t worker_count, uint32_t accumulation_steps,
    uint64_t* out_effective_batch_size);

// The accumulation steps that reach |effective_batch_size| with
// |micro_batch| rows on each of |worker_count| workers. INVALID_ARGUMENT
// (zero factor, or not an exact multiple of micro_batch x worker_count: the
// message names the nearest valid sizes).
PCP_MUST_USE_RESULT pcp_status_t pcp_data_accumulation_steps_resolve(
    uint64_t effective_batch_size, uint32_t micro_batch, uint32_t worker_count,
    uint32_t* out_accumulation_steps);

#ifdef __cplusplus
}
#endif

#endif  // PCP_DATA_DATA_H_
