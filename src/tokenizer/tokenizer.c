// SPDX-License-Identifier: Apache-2.0
//
// Byte-level BPE: loading a tokenizer.json, encoding and decoding.
//
// Layout: every token id has a spelling (as written in tokenizer.json) and a
// byte form (what it decodes to). Model vocab entries are looked up by their
// byte form in an open-addressing table, merges by the id pair in another,
// so the encoder never builds the byte-to-unicode alphabet for its input.

#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <pcre2.h>

#include "tokenizer/tokenizer_impl.h"

//===----------------------------------------------------------------------===//
// Limits and id lists
//===----------------------------------------------------------------------===//

void pcp_tokenizer_limits_initialize(pcp_tokenizer_limits_t* out_limits) {
  out_limits->max_file_byte_length = (size_t)64 << 20;
  out_limits->max_json_depth = 64;
  out_limits->max_vocab_size = 1u << 20;
  out_limits->max_merge_count = 1u << 20;
  out_limits->max_token_byte_length = 1024;
  out_limits->max_added_token_count = 1u << 16;
  out_limits->max_text_byte_length = (size_t)64 << 20;
  out_limits->word_cache_slots = 1u << 14;
}

void pcp_tokenizer_id_list_initialize(pcp_allocator_t allocator,
                                      pcp_tokenizer_id_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = allocator;
}

void pcp_tokenizer_id_list_deinitialize(pcp_tokenizer_id_list_t* list) {
  pcp_allocator_free(list->allocator, list->values);
  list->values = NULL;
  list->count = list->capacity = 0;
}

static pcp_status_t id_list_reserve(pcp_tokenizer_id_list_t* list,
                                    size_t extra) {
  if (list->count + extra <= list->capacity)
    return pcp_ok_status();
  size_t capacity = list->capacity ? list->capacity * 2 : 64;
  while (capacity < list->count + extra) capacity *= 2;
  void* values = list->values;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
      list->allocator, capacity * sizeof(int32_t), &values));
  list->values = values;
  list->capacity = capacity;
  return pcp_ok_status();
}

pcp_status_t pcp_tokenizer_id_list_append(pcp_tokenizer_id_list_t* list,
                                          int32_t id) {
  if (list->count == list->capacity) {
    PCP_RETURN_IF_ERROR_BARE(id_list_reserve(list, 1));
  }
  list->values[list->count++] = id;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

enum {
  kTokenInVocab = 1u << 0,   // a model vocab entry (BPE can produce it)
  kTokenAdded = 1u << 1,     // an added token
  kTokenSpecial = 1u << 2,   // an added token marked special
  kTokenByteForm = 1u << 3,  // spelling maps fully to bytes
};

typedef struct token_entry_t {
  uint32_t spelling_offset;  // into the tokenizer's string pool
  uint32_t spelling_length;
  uint32_t bytes_offset;  // decoded form, also into the pool
  uint32_t bytes_length;
  uint32_t flags;
} token_entry_t;

typedef struct added_token_t {
  int32_t id;
  uint32_t offset;  // content in the pool
  uint32_t length;
  bool lstrip, rstrip, single_word;
} added_token_t;

typedef struct merge_slot_t {
  uint64_t key;   // left << 32 | right
  uint32_t rank;  // UINT32_MAX: empty
  int32_t merged_id;
} merge_slot_t;

typedef enum split_behavior_e {
  SPLIT_REMOVED = 0,
  SPLIT_ISOLATED = 1,
  SPLIT_MERGED_WITH_PREVIOUS = 2,
  SPLIT_MERGED_WITH_NEXT = 3,
  SPLIT_CONTIGUOUS = 4,
} split_behavior_t;

typedef enum stage_kind_e {
  STAGE_SPLIT = 0,
  STAGE_PREFIX_SPACE = 1,  // ByteLevel's add_prefix_space
} stage_kind_t;

typedef struct stage_t {
  stage_kind_t kind;
  pcre2_code* code;
  bool jit;
  split_behavior_t behavior;
  bool invert;
} stage_t;

#define MAX_STAGES 8

struct pcp_tokenizer_t {
  pcp_allocator_t allocator;
  pcp_tokenizer_limits_t limits;
  char* pool;
  size_t pool_size, pool_capacity;
  token_entry_t* tokens;  // [vocab_size]
  uint32_t vocab_size;
  // Model vocab by byte form: ids, -1 empty.
  int32_t* byte_table;
  size_t byte_table_mask;
  int32_t single_byte_id[256];  // id of each one-byte token, -1 if none
  merge_slot_t* merges;
  size_t merge_mask;
  uint32_t merge_count;
  added_token_t* added;
  uint32_t added_count;
  // Added tokens that start with byte b: added_first[b]..added_first[b+1]
  // into added_by_first, longest first.
  uint32_t added_first[257];
  uint32_t* added_by_first;
  bool nfc;
  bool ignore_merges;
  int32_t unk_id;
  stage_t stages[MAX_STAGES];
  uint32_t stage_count;
  uint8_t byte_of_char[324];  // byte-level alphabet: code point -> byte
  bool char_mapped[324];
  uint32_t char_of_byte[256];  // byte -> code point
};

//===----------------------------------------------------------------------===//
// Hashing
//===----------------------------------------------------------------------===//

static inline uint64_t hash_bytes(const uint8_t* data, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, data, 8);
    h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    data += 8;
    n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, data, n);
  h = (h ^ v) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

static inline uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static size_t table_capacity_for(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity <<= 1;  // load factor <= 0.5
  return capacity;
}

static inline const char* token_bytes(const pcp_tokenizer_t* t, int32_t id,
                                      size_t* out_length) {
  const token_entry_t* e = &t->tokens[id];
  *out_length = e->bytes_length;
  return t->pool + e->bytes_offset;
}

static int32_t byte_table_find(const pcp_tokenizer_t* t, const uint8_t* data,
                               size_t n) {
  size_t i = hash_bytes(data, n) & t->byte_table_mask;
  for (;;) {
    int32_t id = t->byte_table[i];
    if (id < 0)
      return -1;
    size_t length;
    const char* bytes = token_bytes(t, id, &length);
    if (length == n && memcmp(bytes, data, n) == 0)
      return id;
    i = (i + 1) & t->byte_table_mask;
  }
}

static inline const merge_slot_t* merge_find(const pcp_tokenizer_t* t,
                                             int32_t left, int32_t right) {
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  size_t i = hash_u64(key) & t->merge_mask;
  for (;;) {
    const merge_slot_t* s = &t->merges[i];
    if (s->rank == UINT32_MAX)
      return NULL;
    if (s->key == key)
      return s;
    i = (i + 1) & t->merge_mask;
  }
}

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

// GPT-2's pre-tokenization pattern, which ByteLevel applies when use_regex is
// true (the default).
static const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

static void byte_level_alphabet_build(pcp_tokenizer_t* t) {
  // Printable bytes stand for themselves; the others get code points from
  // 256 up, in byte order (GPT-2's bytes_to_unicode).
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                     (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? (uint32_t)b : next++;
    t->char_of_byte[b] = cp;
    t->byte_of_char[cp] = (uint8_t)b;
    t->char_mapped[cp] = true;
  }
}

static pcp_status_t pool_append(pcp_tokenizer_t* t, const void* data, size_t n,
                                uint32_t* out_offset) {
  if (t->pool_size + n > t->pool_capacity) {
    size_t capacity = t->pool_capacity ? t->pool_capacity * 2 : 1 << 16;
    while (capacity < t->pool_size + n) capacity *= 2;
    if (capacity > UINT32_MAX) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "token strings exceed 4 GiB");
    }
    void* pool = t->pool;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_allocator_realloc(t->allocator, capacity, &pool));
    t->pool = pool;
    t->pool_capacity = capacity;
  }
  memcpy(t->pool + t->pool_size, data, n);
  *out_offset = (uint32_t)t->pool_size;
  t->pool_size += n;
  return pcp_ok_status();
}

// Checks the nesting depth before jansson builds anything, so a deeply
// nested file costs a linear scan, not a deep tree.
static pcp_status_t json_check_depth(const char* data, size_t n,
                                     uint32_t max_depth) {
  uint32_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = data[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "tokenizer.json nests deeper than %u levels",
                               max_depth);
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return pcp_ok_status();
}

static const char* json_type_name(const json_t* value) {
  if (!value)
    return "missing";
  switch (json_typeof(value)) {
    case JSON_OBJECT:
      return "object";
    case JSON_ARRAY:
      return "array";
    case JSON_STRING:
      return "string";
    case JSON_INTEGER:
      return "integer";
    case JSON_REAL:
      return "number";
    case JSON_TRUE:
    case JSON_FALSE:
      return "boolean";
    default:
      return "null";
  }
}

static bool json_flag(const json_t* object, const char* key, bool fallback) {
  const json_t* v = json_object_get(object, key);
  return json_is_boolean(v) ? json_is_true(v) : fallback;
}

// Maps a spelling in the byte-level alphabet to bytes. Returns false if any
// character is outside it (the decoder then uses the spelling's UTF-8).
static bool spelling_to_bytes(const pcp_tokenizer_t* t, const char* s, size_t n,
                              uint8_t* out, size_t* out_length) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t length = 1;
    int32_t cp =
        pcp_tokenizer_utf8_decode((const uint8_t*)s + i, n - i, &length);
    if (cp < 0 || cp >= 324 || !t->char_mapped[cp])
      return false;
    out[o++] = t->byte_of_char[cp];
    i += length;
  }
  *out_length = o;
  return true;
}

// Records |spelling| for |id| (vocab or added) and its decoded byte form.
static pcp_status_t token_set(pcp_tokenizer_t* t, int32_t id,
                              const char* spelling, size_t n, uint32_t flags) {
  if (n > t->limits.max_token_byte_length) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "token %d is %zu bytes, over the %u-byte limit", id,
                           n, t->limits.max_token_byte_length);
  }
  token_entry_t* e = &t->tokens[id];
  uint8_t bytes[4096];
  size_t bytes_length = 0;
  bool byte_form = n <= sizeof(bytes) &&
                   spelling_to_bytes(t, spelling, n, bytes, &bytes_length);
  PCP_RETURN_IF_ERROR_BARE(pool_append(t, spelling, n, &e->spelling_offset));
  e->spelling_length = (uint32_t)n;
  if (byte_form) {
    PCP_RETURN_IF_ERROR_BARE(
        pool_append(t, bytes, bytes_length, &e->bytes_offset));
    e->bytes_length = (uint32_t)bytes_length;
    flags |= kTokenByteForm;
  } else {
    e->bytes_offset = e->spelling_offset;
    e->bytes_length = e->spelling_length;
  }
  e->flags |= flags;
  return pcp_ok_status();
}

static pcp_status_t parse_id(const json_t* value, const char* what,
                             uint32_t max_vocab, int32_t* out_id) {
  if (!json_is_integer(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: id must be an integer, not %s", what,
                           json_type_name(value));
  }
  json_int_t id = json_integer_value(value);
  if (id < 0 || id >= (json_int_t)max_vocab) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%s: id %lld is outside [0, %u) (max_vocab_size)",
                           what, (long long)id, max_vocab);
  }
  *out_id = (int32_t)id;
  return pcp_ok_status();
}

static pcp_status_t compile_regex(const char* pattern, size_t length,
                                  bool literal, stage_t* stage) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UTF + UCP: \s, \p{L}, \w are Unicode-aware, as in `tokenizers` (Oniguruma).
  // MATCH_INVALID_UTF: invalid bytes never match instead of failing the call.
  // PCRE2_LITERAL (a {"String": s} pattern) refuses UCP; it has no classes.
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF |
                     (literal ? PCRE2_LITERAL : PCRE2_UCP);
  stage->code = pcre2_compile((PCRE2_SPTR)pattern, length, options, &error_code,
                              &error_offset, NULL);
  if (!stage->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pre_tokenizer regex does not compile at offset "
                           "%zu: %s",
                           (size_t)error_offset, (const char*)message);
  }
  // JIT where the platform has it; the interpreter gives the same matches.
  stage->jit = pcre2_jit_compile(stage->code, PCRE2_JIT_COMPLETE) == 0;
  return pcp_ok_status();
}

static pcp_status_t stage_push(pcp_tokenizer_t* t, stage_t** out_stage) {
  if (t->stage_count == MAX_STAGES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "more than %d pre-tokenizer steps", MAX_STAGES);
  }
  *out_stage = &t->stages[t->stage_count++];
  memset(*out_stage, 0, sizeof(**out_stage));
  return pcp_ok_status();
}

static pcp_status_t parse_split(pcp_tokenizer_t* t, const json_t* pt) {
  const json_t* pattern = json_object_get(pt, "pattern");
  const json_t* regex = json_object_get(pattern, "Regex");
  const json_t* literal = json_object_get(pattern, "String");
  if (!json_is_string(regex) && !json_is_string(literal)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "pre_tokenizer Split: pattern must be {\"Regex\": s} or "
        "{\"String\": s}");
  }
  const char* behavior = json_string_value(json_object_get(pt, "behavior"));
  static const char* const kBehaviors[] = {"Removed", "Isolated",
                                           "MergedWithPrevious",
                                           "MergedWithNext", "Contiguous"};
  int found = -1;
  for (int i = 0; behavior && i < (int)PCP_ARRAYSIZE(kBehaviors); ++i) {
    if (strcmp(behavior, kBehaviors[i]) == 0)
      found = i;
  }
  if (found < 0) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "pre_tokenizer Split: behavior '%s' not supported",
                           behavior ? behavior : "(missing)");
  }
  stage_t* stage = NULL;
  PCP_RETURN_IF_ERROR_BARE(stage_push(t, &stage));
  stage->kind = STAGE_SPLIT;
  stage->behavior = (split_behavior_t)found;
  stage->invert = json_flag(pt, "invert", false);
  const json_t* p = regex ? regex : literal;
  return compile_regex(json_string_value(p), json_string_length(p), !regex,
                       stage);
}

static pcp_status_t parse_byte_level(pcp_tokenizer_t* t, const json_t* pt) {
  if (json_flag(pt, "add_prefix_space", true)) {
    stage_t* stage = NULL;
    PCP_RETURN_IF_ERROR_BARE(stage_push(t, &stage));
    stage->kind = STAGE_PREFIX_SPACE;
  }
  if (json_flag(pt, "use_regex", true)) {
    stage_t* stage = NULL;
    PCP_RETURN_IF_ERROR_BARE(stage_push(t, &stage));
    stage->kind = STAGE_SPLIT;
    stage->behavior = SPLIT_ISOLATED;
    PCP_RETURN_IF_ERROR_BARE(
        compile_regex(kGpt2Pattern, sizeof(kGpt2Pattern) - 1, false, stage));
  }
  return pcp_ok_status();
}

static pcp_status_t parse_pre_tokenizer(pcp_tokenizer_t* t, const json_t* pt) {
  if (!json_is_object(pt)) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "pre_tokenizer %s: a byte-level BPE needs a "
                           "ByteLevel pre-tokenizer",
                           json_type_name(pt));
  }
  const char* type = json_string_value(json_object_get(pt, "type"));
  const json_t* list = NULL;
  size_t count = 1;
  if (type && strcmp(type, "Sequence") == 0) {
    list = json_object_get(pt, "pretokenizers");
    if (!json_is_array(list)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "pre_tokenizer Sequence: pretokenizers must be "
                             "an array");
    }
    count = json_array_size(list);
  }
  bool byte_level_seen = false;
  for (size_t i = 0; i < count; ++i) {
    const json_t* item = list ? json_array_get(list, i) : pt;
    const char* item_type = json_string_value(json_object_get(item, "type"));
    if (byte_level_seen) {
      return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "pre_tokenizer: a step after ByteLevel ('%s')",
                             item_type ? item_type : "?");
    }
    if (item_type && strcmp(item_type, "Split") == 0) {
      PCP_RETURN_IF_ERROR_BARE(parse_split(t, item));
    } else if (item_type && strcmp(item_type, "ByteLevel") == 0) {
      PCP_RETURN_IF_ERROR_BARE(parse_byte_level(t, item));
      byte_level_seen = true;
    } else {
      return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "pre_tokenizer type '%s' not supported (Split, "
                             "ByteLevel and Sequence are)",
                             item_type ? item_type : "(missing)");
    }
  }
  if (!byte_level_seen) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "pre_tokenizer without ByteLevel: only byte-level "
                           "BPE is supported");
  }
  return pcp_ok_status();
}

static pcp_status_t parse_normalizer(pcp_tokenizer_t* t, const json_t* n) {
  if (!n || json_is_null(n))
    return pcp_ok_status();
  const char* type = json_string_value(json_object_get(n, "type"));
  if (type && strcmp(type, "Sequence") == 0) {
    const json_t* list = json_object_get(n, "normalizers");
    size_t i;
    const json_t* item;
    json_array_foreach(list, i, item) {
      PCP_RETURN_IF_ERROR_BARE(parse_normalizer(t, item));
    }
    return pcp_ok_status();
  }
  if (type && strcmp(type, "NFC") == 0) {
    t->nfc = true;
    return pcp_ok_status();
  }
  return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                         "normalizer type '%s' not supported (NFC is)",
                         type ? type : "(missing)");
}

static pcp_status_t parse_decoder(const json_t* d) {
  if (!d || json_is_null(d))
    return pcp_ok_status();
  const char* type = json_string_value(json_object_get(d, "type"));
  if (type && strcmp(type, "ByteLevel") == 0)
    return pcp_ok_status();
  return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                         "decoder type '%s' not supported (ByteLevel is)",
                         type ? type : "(missing)");
}

static pcp_status_t merge_insert(pcp_tokenizer_t* t, int32_t left,
                                 int32_t right, uint32_t rank, int32_t merged) {
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  size_t i = hash_u64(key) & t->merge_mask;
  for (;;) {
    merge_slot_t* s = &t->merges[i];
    if (s->rank == UINT32_MAX) {
      s->key = key;
      s->rank = rank;
      s->merged_id = merged;
      return pcp_ok_status();
    }
    // A repeated pair keeps its first (lowest) rank.
    if (s->key == key)
      return pcp_ok_status();
    i = (i + 1) & t->merge_mask;
  }
}

static pcp_status_t vocab_lookup_spelling(const pcp_tokenizer_t* t,
                                          const char* s, size_t n,
                                          uint32_t rank, int32_t* out_id) {
  uint8_t bytes[4096];
  size_t length = 0;
  int32_t id = -1;
  if (n <= sizeof(bytes) && spelling_to_bytes(t, s, n, bytes, &length)) {
    id = byte_table_find(t, bytes, length);
  }
  if (id < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "merge %u: token '%.*s' is not in the vocab", rank,
                           (int)(n > 64 ? 64 : n), s);
  }
  *out_id = id;
  return pcp_ok_status();
}

static pcp_status_t parse_merges(pcp_tokenizer_t* t, const json_t* merges) {
  if (!json_is_array(merges)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "model.merges must be an array, not %s",
                           json_type_name(merges));
  }
  size_t count = json_array_size(merges);
  if (count > t->limits.max_merge_count) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu merges, over the limit of %u", count,
                           t->limits.max_merge_count);
  }
  size_t capacity = table_capacity_for(count);
  void* table = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      t->allocator, capacity * sizeof(merge_slot_t), &table));
  t->merges = table;
  t->merge_mask = capacity - 1;
  for (size_t i = 0; i < capacity; ++i) t->merges[i].rank = UINT32_MAX;
  t->merge_count = (uint32_t)count;
  for (size_t rank = 0; rank < count; ++rank) {
    const json_t* m = json_array_get(merges, rank);
    const char *a, *b;
    size_t a_length, b_length;
    if (json_is_string(m)) {
      // "a b": both halves are in the byte-level alphabet, so neither has a
      // space; split at the one space.
      const char* s = json_string_value(m);
      size_t n = json_string_length(m);
      const char* space = memchr(s, ' ', n);
      if (!space || memchr(space + 1, ' ', n - (size_t)(space + 1 - s))) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "merge %zu: '%.*s' is not two tokens separated "
                               "by one space",
                               rank, (int)(n > 64 ? 64 : n), s);
      }
      a = s;
      a_length = (size_t)(space - s);
      b = space + 1;
      b_length = n - a_length - 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0));
      a_length = json_string_length(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1));
      b_length = json_string_length(json_array_get(m, 1));
    } else {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "merge %zu: expected \"a b\" or [\"a\", \"b\"], "
                             "got %s",
                             rank, json_type_name(m));
    }
    int32_t left, right;
    PCP_RETURN_IF_ERROR_BARE(
        vocab_lookup_spelling(t, a, a_length, (uint32_t)rank, &left));
    PCP_RETURN_IF_ERROR_BARE(
        vocab_lookup_spelling(t, b, b_length, (uint32_t)rank, &right));
    size_t la, lb;
    const char* ba = token_bytes(t, left, &la);
    const char* bb = token_bytes(t, right, &lb);
    uint8_t joined[8192];
    memcpy(joined, ba, la);
    memcpy(joined + la, bb, lb);
    int32_t merged = byte_table_find(t, joined, la + lb);
    if (merged < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "merge %zu: the merged token '%.*s%.*s' is not "
                             "in the vocab",
                             rank, (int)(a_length > 32 ? 32 : a_length), a,
                             (int)(b_length > 32 ? 32 : b_length), b);
    }
    PCP_RETURN_IF_ERROR_BARE(
        merge_insert(t, left, right, (uint32_t)rank, merged));
  }
  return pcp_ok_status();
}

static pcp_status_t parse_model(pcp_tokenizer_t* t, const json_t* model,
                                const json_t* added_list) {
  if (!json_is_object(model)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "model must be an object, not %s",
                           json_type_name(model));
  }
  const char* type = json_string_value(json_object_get(model, "type"));
  if (type && strcmp(type, "BPE") != 0) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "model type '%s' not supported (BPE is)", type);
  }
  const json_t* dropout = json_object_get(model, "dropout");
  if (json_is_number(dropout) && json_number_value(dropout) > 0) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "BPE dropout");
  }
  static const char* const kEmptyStrings[] = {"continuing_subword_prefix",
                                              "end_of_word_suffix"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kEmptyStrings); ++i) {
    const json_t* v = json_object_get(model, kEmptyStrings[i]);
    if (json_is_string(v) && json_string_length(v) > 0) {
      return pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "BPE %s",
                             kEmptyStrings[i]);
    }
  }
  if (json_flag(model, "byte_fallback", false)) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "BPE byte_fallback");
  }
  t->ignore_merges = json_flag(model, "ignore_merges", false);
  const json_t* vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "model.vocab must be an object, not %s",
                           json_type_name(vocab));
  }
  // The vocab size is the largest id + 1 over the vocab and added tokens.
  uint32_t size = 0;
  const char* key;
  const json_t* value;
  json_object_foreach((json_t*)vocab, key, value) {
    int32_t id;
    PCP_RETURN_IF_ERROR(
        parse_id(value, "model.vocab", t->limits.max_vocab_size, &id),
        "token '%.32s'", key);
    if ((uint32_t)id + 1 > size)
      size = (uint32_t)id + 1;
  }
  size_t i;
  json_array_foreach(added_list, i, value) {
    int32_t id;
    PCP_RETURN_IF_ERROR(parse_id(json_object_get(value, "id"), "added_tokens",
                                 t->limits.max_vocab_size, &id),
                        "added token %zu", i);
    if ((uint32_t)id + 1 > size)
      size = (uint32_t)id + 1;
  }
  t->vocab_size = size;
  void* tokens = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      t->allocator, (size_t)(size ? size : 1) * sizeof(token_entry_t),
      &tokens));
  t->tokens = tokens;
  size_t capacity = table_capacity_for(json_object_size(vocab));
  void* table = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(t->allocator, capacity * sizeof(int32_t), &table));
  t->byte_table = table;
  t->byte_table_mask = capacity - 1;
  memset(t->byte_table, 0xFF, capacity * sizeof(int32_t));
  json_object_foreach((json_t*)vocab, key, value) {
    int32_t id = (int32_t)json_integer_value(value);
    if (t->tokens[id].flags & kTokenInVocab) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "model.vocab: id %d is used twice", id);
    }
    PCP_RETURN_IF_ERROR_BARE(token_set(t, id, key, strlen(key), kTokenInVocab));
    if (!(t->tokens[id].flags & kTokenByteForm))
      continue;  // unreachable
    size_t length;
    const uint8_t* bytes = (const uint8_t*)token_bytes(t, id, &length);
    size_t slot = hash_bytes(bytes, length) & t->byte_table_mask;
    while (t->byte_table[slot] >= 0) slot = (slot + 1) & t->byte_table_mask;
    t->byte_table[slot] = id;
    if (length == 1)
      t->single_byte_id[bytes[0]] = id;
  }
  t->unk_id = -1;
  const json_t* unk = json_object_get(model, "unk_token");
  if (json_is_string(unk)) {
    const json_t* unk_id = json_object_get(vocab, json_string_value(unk));
    if (!json_is_integer(unk_id)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "model.unk_token '%.32s' is not in the vocab",
                             json_string_value(unk));
    }
    t->unk_id = (int32_t)json_integer_value(unk_id);
  }
  return parse_merges(t, json_object_get(model, "merges"));
}

static int compare_added_by_length(const void* a, const void* b,
                                   void* context) {
  const pcp_tokenizer_t* t = context;
  const added_token_t* x = &t->added[*(const uint32_t*)a];
  const added_token_t* y = &t->added[*(const uint32_t*)b];
  uint8_t fx = (uint8_t)t->pool[x->offset], fy = (uint8_t)t->pool[y->offset];
  if (fx != fy)
    return fx < fy ? -1 : 1;
  if (x->length != y->length)
    return x->length > y->length ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

// qsort has no context argument in C17; the index arrays are small, so an
// insertion sort keeps it simple.
static void sort_added(pcp_tokenizer_t* t, uint32_t* order, uint32_t n) {
  for (uint32_t i = 1; i < n; ++i) {
    uint32_t v = order[i];
    uint32_t j = i;
    while (j > 0 && compare_added_by_length(&order[j - 1], &v, t) > 0) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = v;
  }
}

static pcp_status_t parse_added_tokens(pcp_tokenizer_t* t, const json_t* list) {
  size_t count = json_array_size(list);
  if (count > t->limits.max_added_token_count) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu added tokens, over the limit of %u", count,
                           t->limits.max_added_token_count);
  }
  void* added = NULL;
  void* order = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      t->allocator, (count ? count : 1) * sizeof(added_token_t), &added));
  t->added = added;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      t->allocator, (count ? count : 1) * sizeof(uint32_t), &order));
  t->added_by_first = order;
  uint32_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    const json_t* item = json_array_get(list, i);
    const json_t* content = json_object_get(item, "content");
    if (!json_is_string(content) || json_string_length(content) == 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "added_tokens[%zu].content must be a non-empty "
                             "string",
                             i);
    }
    int32_t id = (int32_t)json_integer_value(json_object_get(item, "id"));
    bool special = json_flag(item, "special", false);
    PCP_RETURN_IF_ERROR_BARE(token_set(
        t, id, json_string_value(content), json_string_length(content),
        kTokenAdded | (special ? kTokenSpecial : 0u)));
    added_token_t* a = &t->added[n];
    a->id = id;
    a->offset = t->tokens[id].spelling_offset;
    a->length = t->tokens[id].spelling_length;
    a->lstrip = json_flag(item, "lstrip", false);
    a->rstrip = json_flag(item, "rstrip", false);
    a->single_word = json_flag(item, "single_word", false);
    // The spelling of an added token wins over a vocab entry with the same
    // id, as `tokenizers`' id_to_token does.
    t->added_by_first[n] = n;
    ++n;
  }
  t->added_count = n;
  sort_added(t, t->added_by_first, n);
  uint32_t k = 0;
  for (int b = 0; b < 256; ++b) {
    t->added_first[b] = k;
    while (k < n && (uint8_t)t->pool[t->added[t->added_by_first[k]].offset] ==
                        (uint8_t)b) {
      ++k;
    }
  }
  t->added_first[256] = n;
  return pcp_ok_status();
}

static pcp_status_t tokenizer_parse(pcp_tokenizer_t* t, const json_t* root) {
  if (!json_is_object(root)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "tokenizer.json must be an object, not %s",
                           json_type_name(root));
  }
  const json_t* added = json_object_get(root, "added_tokens");
  if (added && !json_is_array(added) && !json_is_null(added)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "added_tokens must be an array, not %s",
                           json_type_name(added));
  }
  if (json_is_null(added))
    added = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      parse_normalizer(t, json_object_get(root, "normalizer")));
  PCP_RETURN_IF_ERROR_BARE(
      parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer")));
  PCP_RETURN_IF_ERROR_BARE(parse_decoder(json_object_get(root, "decoder")));
  PCP_RETURN_IF_ERROR_BARE(
      parse_model(t, json_object_get(root, "model"), added));
  return parse_added_tokens(t, added);
}

pcp_status_t pcp_tokenizer_create_from_json(
    const char* data, size_t byte_length, const pcp_tokenizer_limits_t* limits,
    pcp_allocator_t allocator, pcp_tokenizer_t** out_tokenizer) {
  *out_tokenizer = NULL;
  pcp_tokenizer_limits_t defaults;
  pcp_tokenizer_limits_initialize(&defaults);
  if (!limits)
    limits = &defaults;
  if (byte_length > limits->max_file_byte_length) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "tokenizer.json is %zu bytes, over the limit of %zu",
                           byte_length, limits->max_file_byte_length);
  }
  PCP_RETURN_IF_ERROR_BARE(
      json_check_depth(data, byte_length, limits->max_json_depth));
  json_error_t error;
  json_t* root = json_loadb(data, byte_length, JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "tokenizer.json: %s (line %d, column %d)",
                           error.text, error.line, error.column);
  }
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, sizeof(*t), (void**)&t);
  if (!status) {
    t->allocator = allocator;
    t->limits = *limits;
    memset(t->single_byte_id, 0xFF, sizeof(t->single_byte_id));
    byte_level_alphabet_build(t);
    status = tokenizer_parse(t, root);
  }
  json_decref(root);
  if (status) {
    pcp_tokenizer_release(t);
    return status;
  }
  *out_tokenizer = t;
  return pcp_ok_status();
}

pcp_status_t pcp_tokenizer_create_from_file(
    const char* path, const pcp_tokenizer_limits_t* limits,
    pcp_allocator_t allocator, pcp_tokenizer_t** out_tokenizer) {
  *out_tokenizer = NULL;
  pcp_tokenizer_limits_t defaults;
  pcp_tokenizer_limits_initialize(&defaults);
  if (!limits)
    limits = &defaults;
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR(
      pcp_file_read_all(path, limits->max_file_byte_length, &data, &length),
      "reading tokenizer %s", path);
  pcp_status_t status = pcp_tokenizer_create_from_json(
      data, length, limits, allocator, out_tokenizer);
  pcp_allocator_free(pcp_allocator_system(), data);
  return pcp_status_annotate_f(status, "loading %s", path);
}

void pcp_tokenizer_release(pcp_tokenizer_t* t) {
  if (!t)
    return;
  for (uint32_t i = 0; i < t->stage_count; ++i) {
    pcre2_code_free(t->stages[i].code);
  }
  pcp_allocator_free(t->allocator, t->pool);
  pcp_allocator_free(t->allocator, t->tokens);
  pcp_allocator_free(t->allocator, t->byte_table);
  pcp_allocator_free(t->allocator, t->merges);
  pcp_allocator_free(t->allocator, t->added);
  pcp_allocator_free(t->allocator, t->added_by_first);
  pcp_allocator_free(t->allocator, t);
}

//===----------------------------------------------------------------------===//
// Vocabulary
//===----------------------------------------------------------------------===//

uint32_t pcp_tokenizer_vocab_size(const pcp_tokenizer_t* t) {
  return t->vocab_size;
}

bool pcp_tokenizer_token_to_id(const pcp_tokenizer_t* t,
                               pcp_string_view_t token, int32_t* out_id) {
  for (uint32_t i = 0; i < t->added_count; ++i) {
    const added_token_t* a = &t->added[i];
    if (a->length == token.size &&
        memcmp(t->pool + a->offset, token.data, token.size) == 0) {
      *out_id = a->id;
      return true;
    }
  }
  uint8_t bytes[4096];
  size_t length = 0;
  if (token.size > sizeof(bytes) ||
      !spelling_to_bytes(t, token.data, token.size, bytes, &length)) {
    return false;
  }
  int32_t id = byte_table_find(t, bytes, length);
  if (id < 0)
    return false;
  *out_id = id;
  return true;
}

pcp_string_view_t pcp_tokenizer_id_to_token(const pcp_tokenizer_t* t,
                                            int32_t id) {
  if (id < 0 || (uint32_t)id >= t->vocab_size || !t->tokens[id].flags) {
    return pcp_make_string_view("", 0);
  }
  const token_entry_t* e = &t->tokens[id];
  return pcp_make_string_view(t->pool + e->spelling_offset, e->spelling_length);
}

bool pcp_tokenizer_id_is_special(const pcp_tokenizer_t* t, int32_t id) {
  return id >= 0 && (uint32_t)id < t->vocab_size &&
         (t->tokens[id].flags & kTokenSpecial);
}

//===----------------------------------------------------------------------===//
// Encoder
//===----------------------------------------------------------------------===//

// Word cache: direct-mapped, fixed-size slots, so it is bounded by
// construction and a lookup is one hash and one compare. Words over
// kCacheKeyMax bytes or kCacheIdMax tokens are not cached (rare and long).
#define CACHE_KEY_MAX 46
#define CACHE_ID_MAX 16

typedef struct cache_slot_t {
  uint64_t hash;
  uint8_t key_length;  // 0: empty
  uint8_t id_count;
  uint8_t key[CACHE_KEY_MAX];
  int32_t ids[CACHE_ID_MAX];
} cache_slot_t;

typedef struct heap_entry_t {
  uint32_t rank;
  uint32_t left;   // symbol index
  uint32_t right;  // symbol index at push time
} heap_entry_t;

typedef struct symbol_t {
  int32_t id;
  int32_t prev, next;  // -1 at the ends
} symbol_t;

typedef struct byte_buffer_t {
  uint8_t* data;
  size_t capacity;
} byte_buffer_t;

struct pcp_tokenizer_encoder_t {
  pcp_allocator_t allocator;
  const pcp_tokenizer_t* tokenizer;
  pcre2_match_data* match_data[MAX_STAGES];
  pcre2_match_context* match_context;
  pcre2_jit_stack* jit_stack;
  byte_buffer_t prefix_buffer[MAX_STAGES];  // STAGE_PREFIX_SPACE copies
  pcp_string_builder_t normalized;
  cache_slot_t* cache;
  uint32_t cache_mask;
  // BPE scratch, grown on demand.
  int32_t* ids;
  uint32_t* ranks;
  symbol_t* symbols;
  heap_entry_t* heap;
  size_t scratch_capacity;
  pcp_tokenizer_id_list_t* out;
};

pcp_status_t pcp_tokenizer_encoder_create(const pcp_tokenizer_t* tokenizer,
                                          pcp_allocator_t allocator,
                                          pcp_tokenizer_encoder_t** out) {
  *out = NULL;
  pcp_tokenizer_encoder_t* e = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*e), (void**)&e));
  e->allocator = allocator;
  e->tokenizer = tokenizer;
  pcp_string_builder_initialize(allocator,
                                tokenizer->limits.max_text_byte_length * 4 + 16,
                                &e->normalized);
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < tokenizer->stage_count && !status; ++i) {
    if (!tokenizer->stages[i].code)
      continue;
    e->match_data[i] =
        pcre2_match_data_create_from_pattern(tokenizer->stages[i].code, NULL);
    if (!e->match_data[i]) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "match data");
    }
  }
  if (!status) {
    // Long runs (a megabyte of spaces against \s+(?!\S)) backtrack deeply;
    // 1 MiB of JIT stack covers them where the 32 KiB default would not.
    e->match_context = pcre2_match_context_create(NULL);
    e->jit_stack = pcre2_jit_stack_create(32 << 10, 1 << 20, NULL);
    if (!e->match_context || !e->jit_stack) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "match context");
    } else {
      pcre2_jit_stack_assign(e->match_context, NULL, e->jit_stack);
    }
  }
  uint32_t slots = tokenizer->limits.word_cache_slots;
  if (!status && slots) {
    uint32_t capacity = 1;
    while (capacity < slots) capacity <<= 1;
    status = pcp_allocator_calloc(allocator, capacity * sizeof(cache_slot_t),
                                  (void**)&e->cache);
    e->cache_mask = capacity - 1;
  }
  if (status) {
    pcp_tokenizer_encoder_release(e);
    return status;
  }
  *out = e;
  return pcp_ok_status();
}

void pcp_tokenizer_encoder_release(pcp_tokenizer_encoder_t* e) {
  if (!e)
    return;
  for (int i = 0; i < MAX_STAGES; ++i) {
    pcre2_match_data_free(e->match_data[i]);
    pcp_allocator_free(e->allocator, e->prefix_buffer[i].data);
  }
  pcre2_match_context_free(e->match_context);
  pcre2_jit_stack_free(e->jit_stack);
  pcp_string_builder_deinitialize(&e->normalized);
  pcp_allocator_free(e->allocator, e->cache);
  pcp_allocator_free(e->allocator, e->ids);
  pcp_allocator_free(e->allocator, e->ranks);
  pcp_allocator_free(e->allocator, e->symbols);
  pcp_allocator_free(e->allocator, e->heap);
  pcp_allocator_free(e->allocator, e);
}

static pcp_status_t scratch_reserve(pcp_tokenizer_encoder_t* e, size_t n) {
  if (n <= e->scratch_capacity)
    return pcp_ok_status();
  size_t capacity = e->scratch_capacity ? e->scratch_capacity : 256;
  while (capacity < n) capacity *= 2;
  void* p = e->ids;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(e->allocator, capacity * sizeof(int32_t), &p));
  e->ids = p;
  p = e->ranks;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(e->allocator, capacity * sizeof(uint32_t), &p));
  e->ranks = p;
  p = e->symbols;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(e->allocator, capacity * sizeof(symbol_t), &p));
  e->symbols = p;
  // Each merge pushes at most two entries on top of the n - 1 initial ones.
  p = e->heap;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
      e->allocator, capacity * 3 * sizeof(heap_entry_t), &p));
  e->heap = p;
  e->scratch_capacity = capacity;
  return pcp_ok_status();
}

static inline uint32_t pair_rank(const pcp_tokenizer_t* t, int32_t a, int32_t b,
                                 int32_t* out_merged) {
  const merge_slot_t* s = merge_find(t, a, b);
  if (!s)
    return UINT32_MAX;
  *out_merged = s->merged_id;
  return s->rank;
}

// Short words: an array of symbols with the rank of each adjacent pair; each
// step merges the leftmost pair of lowest rank, which is the order the
// `tokenizers` priority queue produces. O(n^2) but n is small.
static size_t bpe_merge_linear(const pcp_tokenizer_t* t, int32_t* ids,
                               uint32_t* ranks, size_t n) {
  int32_t merged_ids[16];
  for (size_t i = 0; i + 1 < n; ++i) {
    ranks[i] = pair_rank(t, ids[i], ids[i + 1], &merged_ids[i]);
  }
  while (n > 1) {
    uint32_t best = UINT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best) {
        best = ranks[i];
        at = i;
      }
    }
    if (best == UINT32_MAX)
      break;
    ids[at] = merged_ids[at];
    memmove(ids + at + 1, ids + at + 2, (n - at - 2) * sizeof(int32_t));
    memmove(ranks + at + 1, ranks + at + 2, (n - at - 2) * sizeof(uint32_t));
    memmove(merged_ids + at + 1, merged_ids + at + 2,
            (n - at - 2) * sizeof(int32_t));
    --n;
    if (at > 0) {
      ranks[at - 1] = pair_rank(t, ids[at - 1], ids[at], &merged_ids[at - 1]);
    }
    if (at + 1 < n) {
      ranks[at] = pair_rank(t, ids[at], ids[at + 1], &merged_ids[at]);
    }
  }
  return n;
}

static inline bool heap_less(const heap_entry_t* a, const heap_entry_t* b) {
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(heap_entry_t* heap, size_t* size, heap_entry_t v) {
  size_t i = (*size)++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!heap_less(&v, &heap[parent]))
      break;
    heap[i] = heap[parent];
    i = parent;
  }
  heap[i] = v;
}

static heap_entry_t heap_pop(heap_entry_t* heap, size_t* size) {
  heap_entry_t top = heap[0];
  heap_entry_t last = heap[--(*size)];
  size_t i = 0, n = *size;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n)
      break;
    if (child + 1 < n && heap_less(&heap[child + 1], &heap[child]))
      ++child;
    if (!heap_less(&heap[child], &last))
      break;
    heap[i] = heap[child];
    i = child;
  }
  if (n)
    heap[i] = last;
  return top;
}

// Long words: a linked list of symbols and a min-heap of (rank, position),
// O(n log n). A popped entry is stale when either side has changed since it
// was pushed; it is then skipped.
static size_t bpe_merge_heap(pcp_tokenizer_encoder_t* e, int32_t* ids,
                             size_t n) {
  const pcp_tokenizer_t* t = e->tokenizer;
  symbol_t* sym = e->symbols;
  heap_entry_t* heap = e->heap;
  size_t heap_size = 0;
  for (size_t i = 0; i < n; ++i) {
    sym[i].id = ids[i];
    sym[i].prev = (int32_t)i - 1;
    sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  int32_t merged;
  for (size_t i = 0; i + 1 < n; ++i) {
    uint32_t r = pair_rank(t, ids[i], ids[i + 1], &merged);
    if (r != UINT32_MAX) {
      heap_push(heap, &heap_size,
                (heap_entry_t){r, (uint32_t)i, (uint32_t)i + 1});
    }
  }
  while (heap_size) {
    heap_entry_t top = heap_pop(heap, &heap_size);
    symbol_t* left = &sym[top.left];
    if (left->id < 0 || left->next != (int32_t)top.right)
      continue;
    symbol_t* right = &sym[top.right];
    const merge_slot_t* s = merge_find(t, left->id, right->id);
    if (!s || s->rank != top.rank)
      continue;
    left->id = s->merged_id;
    left->next = right->next;
    if (right->next >= 0)
      sym[right->next].prev = (int32_t)top.left;
    right->id = -1;
    if (left->prev >= 0) {
      uint32_t r = pair_rank(t, sym[left->prev].id, left->id, &merged);
      if (r != UINT32_MAX) {
        heap_push(heap, &heap_size,
                  (heap_entry_t){r, (uint32_t)left->prev, top.left});
      }
    }
    if (left->next >= 0) {
      uint32_t r = pair_rank(t, left->id, sym[left->next].id, &merged);
      if (r != UINT32_MAX) {
        heap_push(heap, &heap_size,
                  (heap_entry_t){r, top.left, (uint32_t)left->next});
      }
    }
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids[out++] = sym[i].id;
  return out;
}

static pcp_status_t emit_ids(pcp_tokenizer_encoder_t* e, const int32_t* ids,
                             size_t n) {
  pcp_tokenizer_id_list_t* out = e->out;
  PCP_RETURN_IF_ERROR_BARE(id_list_reserve(out, n));
  memcpy(out->values + out->count, ids, n * sizeof(int32_t));
  out->count += n;
  return pcp_ok_status();
}

static pcp_status_t bpe_word(pcp_tokenizer_encoder_t* e, const uint8_t* w,
                             size_t n) {
  if (n == 0)
    return pcp_ok_status();
  const pcp_tokenizer_t* t = e->tokenizer;
  cache_slot_t* slot = NULL;
  uint64_t hash = 0;
  if (e->cache && n <= CACHE_KEY_MAX) {
    hash = hash_bytes(w, n);
    slot = &e->cache[hash & e->cache_mask];
    if (slot->hash == hash && slot->key_length == n &&
        memcmp(slot->key, w, n) == 0) {
      return emit_ids(e, slot->ids, slot->id_count);
    }
  }
  if (t->ignore_merges) {
    int32_t id = byte_table_find(t, w, n);
    if (id >= 0)
      return emit_ids(e, &id, 1);
  }
  PCP_RETURN_IF_ERROR_BARE(scratch_reserve(e, n));
  int32_t* ids = e->ids;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    int32_t id = t->single_byte_id[w[i]];
    if (id < 0)
      id = t->unk_id;
    // A byte with no token and no unk_token is dropped, as `tokenizers`
    // drops characters it cannot represent.
    if (id >= 0)
      ids[count++] = id;
  }
  if (count > 1) {
    count = count <= 16 ? bpe_merge_linear(t, ids, e->ranks, count)
                        : bpe_merge_heap(e, ids, count);
  }
  if (slot && count <= CACHE_ID_MAX) {
    slot->hash = hash;
    slot->key_length = (uint8_t)n;
    slot->id_count = (uint8_t)count;
    memcpy(slot->key, w, n);
    memcpy(slot->ids, ids, count * sizeof(int32_t));
  }
  return emit_ids(e, ids, count);
}

static pcp_status_t process_piece(pcp_tokenizer_encoder_t* e, uint32_t stage,
                                  const uint8_t* p, size_t n);

typedef struct pending_t {
  size_t start, end;
  int kind;  // 0 none, 1 non-match, 2 match, 3 merged
} pending_t;

static pcp_status_t pending_flush(pcp_tokenizer_encoder_t* e, uint32_t stage,
                                  const uint8_t* p, pending_t* pending) {
  pcp_status_t status = pcp_ok_status();
  if (pending->kind && pending->end > pending->start) {
    status = process_piece(e, stage + 1, p + pending->start,
                           pending->end - pending->start);
  }
  pending->kind = 0;
  return status;
}

static pcp_status_t split_span(pcp_tokenizer_encoder_t* e, uint32_t stage,
                               const uint8_t* p, size_t start, size_t end,
                               bool is_match, pending_t* pending) {
  if (end == start)
    return pcp_ok_status();
  const stage_t* s = &e->tokenizer->stages[stage];
  if (s->invert)
    is_match = !is_match;
  int kind = is_match ? 2 : 1;
  switch (s->behavior) {
    case SPLIT_REMOVED:
      if (is_match)
        return pcp_ok_status();
      return process_piece(e, stage + 1, p + start, end - start);
    case SPLIT_ISOLATED:
      return process_piece(e, stage + 1, p + start, end - start);
    case SPLIT_CONTIGUOUS:
      if (is_match && pending->kind == 2) {
        pending->end = end;
        return pcp_ok_status();
      }
      break;
    case SPLIT_MERGED_WITH_PREVIOUS:
      if (is_match && pending->kind == 1) {
        pending->end = end;
        pending->kind = 3;
        return pcp_ok_status();
      }
      break;
    case SPLIT_MERGED_WITH_NEXT:
      if (!is_match && pending->kind == 2) {
        pending->end = end;
        pending->kind = 3;
        return pcp_ok_status();
      }
      break;
  }
  PCP_RETURN_IF_ERROR_BARE(pending_flush(e, stage, p, pending));
  *pending = (pending_t){start, end, kind};
  return pcp_ok_status();
}

static pcp_status_t run_split(pcp_tokenizer_encoder_t* e, uint32_t stage,
                              const uint8_t* p, size_t n) {
  const stage_t* s = &e->tokenizer->stages[stage];
  pcre2_match_data* md = e->match_data[stage];
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  pending_t pending = {0, 0, 0};
  size_t offset = 0, gap_start = 0;
  while (offset < n) {
    int rc =
        s->jit ? pcre2_jit_match(s->code, p, n, offset, 0, md, e->match_context)
               : pcre2_match(s->code, p, n, offset, 0, md, e->match_context);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      PCRE2_UCHAR message[128];
      pcre2_get_error_message(rc, message, sizeof(message));
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "pre-tokenizer regex failed: %s",
                             (const char*)message);
    }
    size_t ms = ov[0], me = ov[1];
    if (me == ms) {
      // An empty match splits nothing; step over one character.
      size_t length = 1;
      (void)pcp_tokenizer_utf8_decode(p + ms, n - ms, &length);
      offset = ms + length;
      continue;
    }
    PCP_RETURN_IF_ERROR_BARE(
        split_span(e, stage, p, gap_start, ms, false, &pending));
    PCP_RETURN_IF_ERROR_BARE(split_span(e, stage, p, ms, me, true, &pending));
    gap_start = offset = me;
  }
  PCP_RETURN_IF_ERROR_BARE(
      split_span(e, stage, p, gap_start, n, false, &pending));
  return pending_flush(e, stage, p, &pending);
}

static pcp_status_t process_piece(pcp_tokenizer_encoder_t* e, uint32_t stage,
                                  const uint8_t* p, size_t n) {
  if (n == 0)
    return pcp_ok_status();
  const pcp_tokenizer_t* t = e->tokenizer;
  if (stage == t->stage_count)
    return bpe_word(e, p, n);
  if (t->stages[stage].kind == STAGE_SPLIT)
    return run_split(e, stage, p, n);
  // ByteLevel add_prefix_space: every piece that reaches it and does not
  // start with a space gets one.
  if (p[0] == ' ')
    return process_piece(e, stage + 1, p, n);
  byte_buffer_t* b = &e->prefix_buffer[stage];
  if (b->capacity < n + 1) {
    void* data = b->data;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(e->allocator, n + 1, &data));
    b->data = data;
    b->capacity = n + 1;
  }
  b->data[0] = ' ';
  memcpy(b->data + 1, p, n);
  return process_piece(e, stage + 1, b->data, n + 1);
}

// Text between added tokens: normalize, then pre-tokenize and BPE.
static pcp_status_t encode_ordinary(pcp_tokenizer_encoder_t* e,
                                    const uint8_t* p, size_t n) {
  if (n == 0)
    return pcp_ok_status();
  pcp_string_view_t text = pcp_make_string_view((const char*)p, n);
  if (e->tokenizer->nfc && pcp_tokenizer_nfc_maybe_changes(text)) {
    pcp_string_builder_reset(&e->normalized);
    PCP_RETURN_IF_ERROR_BARE(pcp_tokenizer_nfc_append(text, &e->normalized));
    return process_piece(e, 0, (const uint8_t*)e->normalized.data,
                         e->normalized.size);
  }
  return process_piece(e, 0, p, n);
}

// Unicode White_Space (Rust's char::is_whitespace, which `tokenizers` uses
// for lstrip/rstrip).
static bool is_unicode_space(int32_t cp) {
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Length of the whitespace character ending at |end| (> |floor|), or 0.
static size_t space_before(const uint8_t* p, size_t floor, size_t end) {
  size_t start = end - 1;
  while (start > floor && end - start < 4 && (p[start] & 0xC0) == 0x80) {
    --start;
  }
  size_t length = 0;
  int32_t cp = pcp_tokenizer_utf8_decode(p + start, end - start, &length);
  return start + length == end && is_unicode_space(cp) ? length : 0;
}

// Length of the whitespace character starting at |start| (< |n|), or 0.
static size_t space_after(const uint8_t* p, size_t start, size_t n) {
  size_t length = 0;
  int32_t cp = pcp_tokenizer_utf8_decode(p + start, n - start, &length);
  return is_unicode_space(cp) ? length : 0;
}

static inline bool is_word_byte(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

pcp_status_t pcp_tokenizer_encoder_encode(pcp_tokenizer_encoder_t* e,
                                          pcp_string_view_t text,
                                          pcp_tokenizer_id_list_t* inout_ids) {
  const pcp_tokenizer_t* t = e->tokenizer;
  if (text.size > t->limits.max_text_byte_length) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "text is %zu bytes, over the limit of %zu",
                           text.size, t->limits.max_text_byte_length);
  }
  e->out = inout_ids;
  const uint8_t* p = (const uint8_t*)text.data;
  size_t n = text.size;
  size_t segment_start = 0, pos = 0;
  // Added tokens first: at the leftmost position where one matches, the
  // longest one (`tokenizers`' leftmost-longest Aho-Corasick order).
  while (t->added_count && pos < n) {
    uint8_t first = p[pos];
    uint32_t lo = t->added_first[first], hi = t->added_first[first + 1];
    const added_token_t* hit = NULL;
    for (uint32_t k = lo; k < hi; ++k) {
      const added_token_t* a = &t->added[t->added_by_first[k]];
      if (a->length > n - pos ||
          memcmp(t->pool + a->offset, p + pos, a->length) != 0) {
        continue;
      }
      if (a->single_word &&
          ((pos > 0 && is_word_byte(p[pos - 1])) ||
           (pos + a->length < n && is_word_byte(p[pos + a->length])))) {
        continue;
      }
      hit = a;
      break;
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t start = pos, end = pos + hit->length;
    size_t length;
    while (hit->lstrip && start > segment_start &&
           (length = space_before(p, segment_start, start)) > 0) {
      start -= length;
    }
    while (hit->rstrip && end < n && (length = space_after(p, end, n)) > 0) {
      end += length;
    }
    PCP_RETURN_IF_ERROR_BARE(
        encode_ordinary(e, p + segment_start, start - segment_start));
    PCP_RETURN_IF_ERROR_BARE(pcp_tokenizer_id_list_append(inout_ids, hit->id));
    segment_start = pos = end;
  }
  return encode_ordinary(e, p + segment_start, n - segment_start);
}

pcp_status_t pcp_tokenizer_encode(const pcp_tokenizer_t* tokenizer,
                                  pcp_string_view_t text,
                                  pcp_tokenizer_id_list_t* inout_ids) {
  // The temporary encoder uses the caller's allocator (the id list's).
  pcp_tokenizer_encoder_t* e = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_tokenizer_encoder_create(tokenizer, inout_ids->allocator, &e));
  pcp_status_t status = pcp_tokenizer_encoder_encode(e, text, inout_ids);
  pcp_tokenizer_encoder_release(e);
  return status;
}

//===----------------------------------------------------------------------===//
// Decoding
//===----------------------------------------------------------------------===//

pcp_status_t pcp_tokenizer_decode(const pcp_tokenizer_t* t, const int32_t* ids,
                                  size_t id_count,
                                  pcp_tokenizer_decode_flags_t flags,
                                  pcp_string_builder_t* out_text) {
  bool skip_special = flags & PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL;
  bool raw = flags & PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES;
  // Bytes are gathered first because a character may span tokens; the lossy
  // UTF-8 pass runs over the whole result.
  pcp_string_builder_t bytes;
  pcp_string_builder_initialize(out_text->allocator, out_text->max_size,
                                &bytes);
  pcp_string_builder_t* target = raw ? out_text : &bytes;
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < id_count && !status; ++i) {
    int32_t id = ids[i];
    if (id < 0 || (uint32_t)id >= t->vocab_size || !t->tokens[id].flags) {
      status = pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                               "token id %d at position %zu is not in the "
                               "vocabulary (size %u)",
                               id, i, t->vocab_size);
      break;
    }
    if (skip_special && (t->tokens[id].flags & kTokenSpecial))
      continue;
    size_t length;
    const char* b = token_bytes(t, id, &length);
    status = pcp_string_builder_append(target, pcp_make_string_view(b, length));
  }
  if (!status && !raw) {
    status = pcp_tokenizer_utf8_append_lossy(
        out_text, (const uint8_t*)bytes.data, bytes.size);
  }
  pcp_string_builder_deinitialize(&bytes);
  return status;
}

void pcp_tokenizer_decode_stream_initialize(
    const pcp_tokenizer_t* tokenizer, pcp_tokenizer_decode_flags_t flags,
    pcp_tokenizer_decode_stream_t* out_stream) {
  memset(out_stream, 0, sizeof(*out_stream));
  out_stream->tokenizer = tokenizer;
  out_stream->flags =
      flags &
      ~(pcp_tokenizer_decode_flags_t)PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES;
}

pcp_status_t pcp_tokenizer_decode_stream_push(
    pcp_tokenizer_decode_stream_t* stream, const int32_t* ids, size_t id_count,
    pcp_string_builder_t* out_text) {
  // The held-back bytes, then the new tokens' bytes; emit the complete
  // prefix through the lossy pass. Splitting there cannot change the lossy
  // result: the cut is never inside a sequence that is valid so far.
  pcp_string_builder_t bytes;
  pcp_string_builder_initialize(out_text->allocator, out_text->max_size,
                                &bytes);
  pcp_status_t status = pcp_string_builder_append(
      &bytes,
      pcp_make_string_view((const char*)stream->pending, stream->pending_size));
  if (!status) {
    status = pcp_tokenizer_decode(
        stream->tokenizer, ids, id_count,
        stream->flags | PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, &bytes);
  }
  if (!status) {
    size_t complete =
        pcp_tokenizer_utf8_complete_length(bytes.data, bytes.size);
    status = pcp_tokenizer_utf8_append_lossy(
        out_text, (const uint8_t*)bytes.data, complete);
    if (!status) {
      stream->pending_size = (uint32_t)(bytes.size - complete);
      memcpy(stream->pending, bytes.data + complete, stream->pending_size);
    }
  }
  pcp_string_builder_deinitialize(&bytes);
  return status;
}

pcp_status_t pcp_tokenizer_decode_stream_finish(
    pcp_tokenizer_decode_stream_t* stream, pcp_string_builder_t* out_text) {
  pcp_status_t status = pcp_tokenizer_utf8_append_lossy(
      out_text, stream->pending, stream->pending_size);
  stream->pending_size = 0;
  return status;
}

//===----------------------------------------------------------------------===//
// Chat
//===----------------------------------------------------------------------===//

pcp_status_t pcp_tokenizer_chat_encode(
    pcp_tokenizer_encoder_t* e, const pcp_tokenizer_chat_message_t* messages,
    size_t message_count, const pcp_tokenizer_chat_options_t* options,
    pcp_tokenizer_id_list_t* inout_ids) {
  int32_t id;
  static const char* const kMarkers[] = {"<|im_start|>", "<|im_end|>"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kMarkers); ++i) {
    if (!pcp_tokenizer_token_to_id(e->tokenizer,
                                   pcp_make_cstring_view(kMarkers[i]), &id) ||
        !(e->tokenizer->tokens[id].flags & kTokenAdded)) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "the tokenizer has no added token %s (not a "
                             "ChatML tokenizer)",
                             kMarkers[i]);
    }
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(
      e->allocator, e->tokenizer->limits.max_text_byte_length, &text);
  pcp_status_t status =
      pcp_tokenizer_chat_render(messages, message_count, options, &text);
  if (!status) {
    status = pcp_tokenizer_encoder_encode(
        e, pcp_make_string_view(text.data ? text.data : "", text.size),
        inout_ids);
  }
  pcp_string_builder_deinitialize(&text);
  return status;
}
