// SPDX-License-Identifier: Apache-2.0
//
// tokenizer: byte-level BPE from a Hugging Face tokenizer.json, and the Qwen
// chat template.
//
// A pcp_tokenizer_t is loaded once from a tokenizer.json (GPT-2, Qwen2/2.5/3
// and Llama-3 style files: model type BPE, a ByteLevel pre-tokenizer, optional
// Split pre-tokenizers with a regex run by PCRE2, an optional NFC normalizer,
// added and special tokens, a ByteLevel decoder). Anything else in the file
// that changes the ids (another model type, normalizer or pre-tokenizer,
// dropout, a subword prefix) is an UNIMPLEMENTED error naming the feature; the
// post-processor is ignored because encoding never adds special tokens (the
// `add_special_tokens=False` behaviour that serving uses).
//
// Encoding works in bytes: vocab entries are stored as the raw bytes they
// stand for, so text is never converted to the byte-to-unicode alphabet and
// back. Any byte string encodes, valid UTF-8 or not (byte-level BPE covers
// all 256 bytes): invalid UTF-8 never takes part in a regex match, so it ends
// up in pieces of its own and is encoded byte by byte plus whatever merges
// apply; NFC leaves it untouched. The result is deterministic. (The
// `tokenizers` package accepts only valid Unicode text; for valid UTF-8 the
// ids are the same.)
//
// Ownership: a tokenizer is immutable after creation and owned by its single
// creator; encoders borrow it and must be released first.
//
// Thread-safety: a pcp_tokenizer_t is thread-safe (read-only). A
// pcp_tokenizer_encoder_t (regex match state, scratch buffers and a bounded
// word cache) is thread-compatible: one per thread. The convenience
// pcp_tokenizer_encode makes a temporary encoder per call and is thread-safe.

#ifndef PCP_TOKENIZER_TOKENIZER_H_
#define PCP_TOKENIZER_TOKENIZER_H_

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

// Every input has a declared maximum, checked before work or allocation;
// exceeding one is RESOURCE_EXHAUSTED naming the limit.
typedef struct pcp_tokenizer_limits_t {
  size_t max_file_byte_length;     // tokenizer.json size (default 64 MiB)
  uint32_t max_json_depth;         // nesting of the JSON (default 64)
  uint32_t max_vocab_size;         // largest id + 1 (default 1 Mi)
  uint32_t max_merge_count;        // merges (default 1 Mi)
  uint32_t max_token_byte_length;  // one vocab or added token (default 1 KiB)
  uint32_t max_added_token_count;  // added tokens (default 64 Ki)
  size_t max_text_byte_length;     // one encode input (default 64 MiB)
  uint32_t word_cache_slots;       // per encoder, 0 disables (default 16 Ki)
} pcp_tokenizer_limits_t;

// Fills |out_limits| with the defaults above. Thread-safe.
void pcp_tokenizer_limits_initialize(pcp_tokenizer_limits_t* out_limits);

//===----------------------------------------------------------------------===//
// Token id lists
//===----------------------------------------------------------------------===//

// A growable list of token ids, embedded by the caller. The functions below
// are thread-compatible: one thread per list.
typedef struct pcp_tokenizer_id_list_t {
  pcp_allocator_t allocator;
  int32_t* values;
  size_t count;
  size_t capacity;
} pcp_tokenizer_id_list_t;

void pcp_tokenizer_id_list_initialize(pcp_allocator_t allocator,
                                      pcp_tokenizer_id_list_t* out_list);
void pcp_tokenizer_id_list_deinitialize(pcp_tokenizer_id_list_t* list);
// Appends one id. RESOURCE_EXHAUSTED when out of memory.
PCP_MUST_USE_RESULT pcp_status_t
pcp_tokenizer_id_list_append(pcp_tokenizer_id_list_t* list, int32_t id);

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

typedef struct pcp_tokenizer_t pcp_tokenizer_t;

// Parses a tokenizer.json held in memory (|data| need not be NUL-terminated;
// it is not retained). |limits| NULL means the defaults.
// Returns INVALID_ARGUMENT for malformed JSON or a malformed field (naming
// it), UNIMPLEMENTED for a feature this loader does not support (naming it),
// RESOURCE_EXHAUSTED past a limit. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_create_from_json(
    const char* data, size_t byte_length, const pcp_tokenizer_limits_t* limits,
    pcp_allocator_t allocator, pcp_tokenizer_t** out_tokenizer);

// Reads |path| (refusing files over limits->max_file_byte_length) and parses
// it as above; NOT_FOUND etc. from the file system. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_create_from_file(
    const char* path, const pcp_tokenizer_limits_t* limits,
    pcp_allocator_t allocator, pcp_tokenizer_t** out_tokenizer);

// Frees |tokenizer| (NULL is fine). Its encoders must be released first.
void pcp_tokenizer_release(pcp_tokenizer_t* tokenizer);

//===----------------------------------------------------------------------===//
// Vocabulary
//===----------------------------------------------------------------------===//

// Largest id + 1 over the vocab and the added tokens. Thread-safe.
uint32_t pcp_tokenizer_vocab_size(const pcp_tokenizer_t* tokenizer);

// Looks up a token in its tokenizer.json spelling (byte-level alphabet for
// vocab entries: "Ġthe"; added tokens as written: "<|im_end|>"). Added tokens
// win, as in `tokenizers`. Returns false if absent. Thread-safe.
bool pcp_tokenizer_token_to_id(const pcp_tokenizer_t* tokenizer,
                               pcp_string_view_t token, int32_t* out_id);

// The tokenizer.json spelling of |id| (borrowed, valid while the tokenizer
// lives); an empty view for an id that is out of range or unused.
// Thread-safe.
pcp_string_view_t pcp_tokenizer_id_to_token(const pcp_tokenizer_t* tokenizer,
                                            int32_t id);

// True when |id| is an added token marked special. Thread-safe.
bool pcp_tokenizer_id_is_special(const pcp_tokenizer_t* tokenizer, int32_t id);

//===----------------------------------------------------------------------===//
// Encoding
//===----------------------------------------------------------------------===//

typedef struct pcp_tokenizer_encoder_t pcp_tokenizer_encoder_t;

// Creates per-thread encoding state for |tokenizer| (borrowed; must outlive
// the encoder). RESOURCE_EXHAUSTED when out of memory. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_encoder_create(
    const pcp_tokenizer_t* tokenizer, pcp_allocator_t allocator,
    pcp_tokenizer_encoder_t** out_encoder);
void pcp_tokenizer_encoder_release(pcp_tokenizer_encoder_t* encoder);

// Appends the ids of |text| to |inout_ids| (added/special tokens in the text
// are matched first, longest first; then normalization, pre-tokenization and
// BPE per piece). No BOS/EOS is added. RESOURCE_EXHAUSTED past
// max_text_byte_length or out of memory (the list may then hold a prefix).
// Thread-compatible (one thread per encoder).
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_encoder_encode(
    pcp_tokenizer_encoder_t* encoder, pcp_string_view_t text,
    pcp_tokenizer_id_list_t* inout_ids);

// Same, with a temporary encoder (no cache kept between calls) from
// |inout_ids|'s allocator. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_tokenizer_encode(const pcp_tokenizer_t* tokenizer, pcp_string_view_t text,
                     pcp_tokenizer_id_list_t* inout_ids);

//===----------------------------------------------------------------------===//
// Decoding
//===----------------------------------------------------------------------===//

typedef uint32_t pcp_tokenizer_decode_flags_t;
enum pcp_tokenizer_decode_flag_bits_e {
  PCP_TOKENIZER_DECODE_FLAG_NONE = 0u,
  // Drops added tokens marked special (`skip_special_tokens=True`).
  PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL = 1u << 0,
  // Appends the raw bytes, even when they end inside a UTF-8 sequence
  // (streaming: see pcp_tokenizer_utf8_complete_length). Without it, invalid
  // or truncated UTF-8 becomes U+FFFD, one per maximal invalid subsequence,
  // as `tokenizers` (Rust's from_utf8_lossy) does.
  PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES = 1u << 1,
};

// Appends the text of |ids| to |out_text| (the ByteLevel decoder: each
// token's characters mapped back to bytes; a token with characters outside
// that alphabet, e.g. an added token with a space, contributes its UTF-8
// as written). OUT_OF_RANGE for an id that is not in the vocabulary (the
// `tokenizers` package silently drops those; a server wants to know).
// RESOURCE_EXHAUSTED when the builder is full. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_decode(
    const pcp_tokenizer_t* tokenizer, const int32_t* ids, size_t id_count,
    pcp_tokenizer_decode_flags_t flags, pcp_string_builder_t* out_text);

// Length of the longest prefix of |data| that does not end inside a UTF-8
// sequence that could still be completed by more bytes: a streaming decoder
// emits that prefix and keeps the rest for the next token. Thread-safe.
size_t pcp_tokenizer_utf8_complete_length(const char* data, size_t byte_length);

// Incremental decoding for streamed generation: ids arrive a few at a time
// and a character may span tokens. Each push appends only text that is
// complete (holding back at most 3 bytes of a character still being built);
// finish flushes what is left (U+FFFD for a truncated character). The
// concatenated output equals pcp_tokenizer_decode of all the ids (without
// RAW_BYTES). The caller embeds it; no heap state. Thread-compatible.
typedef struct pcp_tokenizer_decode_stream_t {
  const pcp_tokenizer_t* tokenizer;  // borrowed
  pcp_tokenizer_decode_flags_t flags;
  uint8_t pending[4];
  uint32_t pending_size;
} pcp_tokenizer_decode_stream_t;

// |flags|: SKIP_SPECIAL is honoured; RAW_BYTES is ignored.
void pcp_tokenizer_decode_stream_initialize(
    const pcp_tokenizer_t* tokenizer, pcp_tokenizer_decode_flags_t flags,
    pcp_tokenizer_decode_stream_t* out_stream);

// Appends the complete text so far of |ids| to |out_text|. OUT_OF_RANGE for
// an unknown id (nothing appended, the stream unchanged); RESOURCE_EXHAUSTED
// when the builder is full.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_decode_stream_push(
    pcp_tokenizer_decode_stream_t* stream, const int32_t* ids, size_t id_count,
    pcp_string_builder_t* out_text);

// Appends what is still held back (as U+FFFD) and resets the stream.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_decode_stream_finish(
    pcp_tokenizer_decode_stream_t* stream, pcp_string_builder_t* out_text);

//===----------------------------------------------------------------------===//
// Normalization
//===----------------------------------------------------------------------===//

// Appends the Unicode NFC form of |text| to |out_text| (no ICU: tables
// generated from Python's unicodedata restricted to the characters of Unicode
// 9.0, the data `tokenizers` normalizes with, so that ids match; characters
// assigned later pass through unchanged, as there). Bytes that are not valid
// UTF-8 are copied unchanged and break composition. RESOURCE_EXHAUSTED when
// the builder is full. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_nfc_append(
    pcp_string_view_t text, pcp_string_builder_t* out_text);

//===----------------------------------------------------------------------===//
// Chat template (Qwen)
//===----------------------------------------------------------------------===//

typedef enum pcp_tokenizer_chat_role_e {
  PCP_TOKENIZER_CHAT_ROLE_SYSTEM = 0,
  PCP_TOKENIZER_CHAT_ROLE_USER = 1,
  PCP_TOKENIZER_CHAT_ROLE_ASSISTANT = 2,
} pcp_tokenizer_chat_role_t;

typedef struct pcp_tokenizer_chat_message_t {
  pcp_tokenizer_chat_role_t role;
  pcp_string_view_t content;
} pcp_tokenizer_chat_message_t;

// Qwen2.5's default system prompt (used when the first message is not a
// system message and the options ask for it).
#define PCP_TOKENIZER_QWEN_DEFAULT_SYSTEM_PROMPT \
  "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

typedef struct pcp_tokenizer_chat_options_t {
  // Rendered as a leading system message when the conversation has none;
  // empty view (data NULL) for none (Qwen3's template adds none).
  pcp_string_view_t default_system_prompt;
  // Ends with "<|im_start|>assistant\n" so the model writes the reply.
  bool add_generation_prompt;
  // Qwen3's reasoning rules: an assistant message keeps only the text after
  // its last "</think>" (leading newlines dropped); one after the last user
  // message that is the final message, or that had reasoning, is written
  // "<think>\nREASONING\n</think>\n\n" + content.
  bool qwen3_reasoning;
  // Qwen3's enable_thinking=False: "<think>\n\n</think>\n\n" after the
  // generation prompt.
  bool disable_thinking;
} pcp_tokenizer_chat_options_t;

// Parses "system" | "user" | "assistant". Returns false otherwise.
// Thread-safe.
bool pcp_tokenizer_chat_role_parse(pcp_string_view_t name,
                                   pcp_tokenizer_chat_role_t* out_role);

// Appends the Qwen ChatML rendering of |messages| to |out_text|:
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message (after the default
// system prompt when set and the first message is not a system one), then
// "<|im_start|>assistant\n" when asked. The same text as the official Jinja
// templates of Qwen2.5 (default system prompt set) and Qwen3
// (qwen3_reasoning) for text-only system/user/assistant conversations
// (tests/tokenizer/equivalence_test.py renders both with jinja2). Content is
// copied verbatim; special token text inside content is matched as special
// tokens when encoded (as `apply_chat_template` + encode does).
// INVALID_ARGUMENT for an unknown role; RESOURCE_EXHAUSTED when the builder is
// full. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_chat_render(
    const pcp_tokenizer_chat_message_t* messages, size_t message_count,
    const pcp_tokenizer_chat_options_t* options,
    pcp_string_builder_t* out_text);

// Renders as above and appends the ids to |inout_ids|. Needs the tokenizer
// to know <|im_start|> and <|im_end|> as added tokens (FAILED_PRECONDITION
// otherwise). Thread-compatible (uses |encoder|).
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_chat_encode(
    pcp_tokenizer_encoder_t* encoder,
    const pcp_tokenizer_chat_message_t* messages, size_t message_count,
    const pcp_tokenizer_chat_options_t* options,
    pcp_tokenizer_id_list_t* inout_ids);

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

// `pcp tokenize --tokenizer tokenizer.json [--decode] [--skip-special]
// TEXT|@FILE` (argv[0] = "tokenize"): prints the ids of TEXT on one line, or
// with --decode the text of the ids in TEXT. Returns 0, 1 on a load, read,
// encode or decode error (message on stderr), 2 on usage errors.
// Thread-safe.
int pcp_tokenizer_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_TOKENIZER_TOKENIZER_H_
