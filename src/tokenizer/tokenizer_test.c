// SPDX-License-Identifier: Apache-2.0
//
// Unit tests for the tokenizer: the byte-level alphabet, merges (both
// forms, short and long words), added tokens, decoding partial UTF-8, NFC,
// limits, malformed tokenizer.json files, the chat template and an OOM sweep.
// Equivalence with the `tokenizers` package is tests/tokenizer/.

#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

// GPT-2's byte -> code point table, written out here independently of the
// implementation.
static uint32_t byte_char(int b) {
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
      (b >= 0xAE && b <= 0xFF)) {
    return (uint32_t)b;
  }
  uint32_t n = 0;
  for (int i = 0; i < b; ++i) {
    if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) ||
          (i >= 0xAE && i <= 0xFF))) {
      ++n;
    }
  }
  return 256 + n;
}

static void append_utf8(pcp_string_builder_t* b, uint32_t cp) {
  char s[4];
  size_t n;
  if (cp < 0x80) {
    s[0] = (char)cp;
    n = 1;
  } else {
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  }
  PCP_CHECK_OK(pcp_string_builder_append(b, pcp_make_string_view(s, n)));
}

// Appends the JSON string of a byte-level spelling of |bytes|.
static void append_spelling(pcp_string_builder_t* b, const char* bytes) {
  PCP_CHECK_OK(pcp_string_builder_append_cstring(b, "\""));
  for (const unsigned char* p = (const unsigned char*)bytes; *p; ++p) {
    uint32_t cp = byte_char(*p);
    if (cp == '"' || cp == '\\') {
      PCP_CHECK_OK(pcp_string_builder_append_cstring(b, "\\"));
    }
    append_utf8(b, cp);
  }
  PCP_CHECK_OK(pcp_string_builder_append_cstring(b, "\""));
}

// A tokenizer.json: ids 0..255 are the single bytes, then |extra| tokens
// (raw bytes) from 256; |merges| are pairs of raw-byte strings; |added| and
// |pre| are JSON spliced in as they are. Caller frees.
static char* make_json(const char* const* extra, size_t extra_count,
                       const char* const (*merges)[2], size_t merge_count,
                       bool pair_form, const char* added, const char* pre,
                       const char* normalizer) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_string_builder_append_f(
      &b,
      "{\"version\":\"1.0\",\"normalizer\":%s,\"pre_tokenizer\":%s,"
      "\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":%s,"
      "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"vocab\":{",
      normalizer ? normalizer : "null",
      pre ? pre
          : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
            "\"use_regex\":true}",
      added ? added : "[]"));
  for (int i = 0; i < 256; ++i) {
    char s[2] = {(char)i, 0};
    if (i)
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, ","));
    if (i == 0) {
      // The NUL byte's spelling, written directly.
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "\""));
      append_utf8(&b, byte_char(0));
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "\""));
    } else {
      append_spelling(&b, s);
    }
    PCP_CHECK_OK(pcp_string_builder_append_f(&b, ":%d", i));
  }
  for (size_t i = 0; i < extra_count; ++i) {
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, ","));
    append_spelling(&b, extra[i]);
    PCP_CHECK_OK(pcp_string_builder_append_f(&b, ":%zu", 256 + i));
  }
  PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "},\"merges\":["));
  for (size_t i = 0; i < merge_count; ++i) {
    if (i)
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, ","));
    if (pair_form) {
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "["));
      append_spelling(&b, merges[i][0]);
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, ","));
      append_spelling(&b, merges[i][1]);
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "]"));
    } else {
      // "a b": splice the two spellings into one string.
      pcp_string_builder_t one;
      pcp_string_builder_initialize(pcp_allocator_system(), 0, &one);
      append_spelling(&one, merges[i][0]);
      append_spelling(&one, merges[i][1]);
      // one = "\"A\"\"B\"" -> "\"A B\""
      const char* s = one.data;
      size_t n = one.size;
      size_t split = 1;
      while (!(s[split] == '"' && s[split - 1] != '\\')) ++split;
      PCP_CHECK_OK(
          pcp_string_builder_append(&b, pcp_make_string_view(s, split)));
      PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, " "));
      PCP_CHECK_OK(pcp_string_builder_append(
          &b, pcp_make_string_view(s + split + 2, n - split - 2)));
      pcp_string_builder_deinitialize(&one);
    }
  }
  PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "]}}"));
  char* out = NULL;
  PCP_CHECK_OK(pcp_string_builder_take(&b, &out));
  return out;
}

static const char* const kExtra[] = {"ab",   "abc",      " a",          "aa",
                                     "aaaa", "\xe4\xb8", "\xe4\xb8\xad"};
static const char* const kMerges[][2] = {
    {"a", "b"},   {"ab", "c"},      {" ", "a"},          {"a", "a"},
    {"aa", "aa"}, {"\xe4", "\xb8"}, {"\xe4\xb8", "\xad"}};
static const char kAdded[] =
    "[{\"id\":263,\"content\":\"<|im_start|>\",\"special\":true},"
    "{\"id\":264,\"content\":\"<|im_end|>\",\"special\":true},"
    "{\"id\":265,\"content\":\"<|im\",\"special\":false},"
    "{\"id\":266,\"content\":\"[R]\",\"special\":false,\"rstrip\":true,"
    "\"lstrip\":true}]";

static pcp_tokenizer_t* load(const char* json,
                             const pcp_tokenizer_limits_t* limits) {
  pcp_tokenizer_t* t = NULL;
  PCP_CHECK_OK(pcp_tokenizer_create_from_json(json, strlen(json), limits,
                                              pcp_allocator_system(), &t));
  return t;
}

static pcp_tokenizer_t* load_default(bool pair_form) {
  char* json = make_json(kExtra, PCP_ARRAYSIZE(kExtra), kMerges,
                         PCP_ARRAYSIZE(kMerges), pair_form, kAdded, NULL, NULL);
  pcp_tokenizer_t* t = load(json, NULL);
  free(json);
  return t;
}

static size_t encode(const pcp_tokenizer_t* t, const char* text, size_t n,
                     int32_t* out, size_t capacity) {
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  PCP_CHECK_OK(pcp_tokenizer_encode(t, pcp_make_string_view(text, n), &ids));
  assert_true(ids.count <= capacity);
  memcpy(out, ids.values, ids.count * sizeof(int32_t));
  size_t count = ids.count;
  pcp_tokenizer_id_list_deinitialize(&ids);
  return count;
}

static char* decode(const pcp_tokenizer_t* t, const int32_t* ids, size_t n,
                    pcp_tokenizer_decode_flags_t flags, size_t* out_size) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_tokenizer_decode(t, ids, n, flags, &b));
  *out_size = b.size;
  char* out = NULL;
  PCP_CHECK_OK(pcp_string_builder_take(&b, &out));
  return out;
}

static pcp_status_code_t load_code(const char* json,
                                   const pcp_tokenizer_limits_t* limits,
                                   const char* expect_in_message) {
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status = pcp_tokenizer_create_from_json(
      json, strlen(json), limits, pcp_allocator_system(), &t);
  assert_null(t);
  assert_non_null(status);
  if (expect_in_message) {
    char buffer[1024];
    pcp_status_format(status, buffer, sizeof(buffer));
    if (!strstr(buffer, expect_in_message)) {
      fail_msg("'%s' not in '%s'", expect_in_message, buffer);
    }
  }
  return pcp_status_consume_code(status);
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

static void test_byte_alphabet(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  assert_int_equal(pcp_tokenizer_vocab_size(t), 267);
  int32_t id = -1;
  // Space is "Ġ" (U+0120), newline "Ċ" (U+010A), 'A' itself.
  assert_true(
      pcp_tokenizer_token_to_id(t, pcp_make_cstring_view("\xc4\xa0"), &id));
  assert_int_equal(id, ' ');
  assert_true(
      pcp_tokenizer_token_to_id(t, pcp_make_cstring_view("\xc4\x8a"), &id));
  assert_int_equal(id, '\n');
  assert_true(pcp_tokenizer_token_to_id(t, pcp_make_cstring_view("A"), &id));
  assert_int_equal(id, 'A');
  assert_false(pcp_tokenizer_token_to_id(t, pcp_make_cstring_view(" "), &id));
  pcp_string_view_t spelling = pcp_tokenizer_id_to_token(t, ' ');
  assert_int_equal(spelling.size, 2);
  assert_memory_equal(spelling.data, "\xc4\xa0", 2);
  assert_int_equal(pcp_tokenizer_id_to_token(t, 9999).size, 0);
  // Every byte decodes to itself and encodes to its own id.
  for (int b = 0; b < 256; ++b) {
    int32_t one = b;
    size_t n = 0;
    char* text = decode(t, &one, 1, PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, &n);
    assert_int_equal(n, 1);
    assert_int_equal((unsigned char)text[0], b);
    free(text);
  }
  pcp_tokenizer_release(t);
}

static void test_merges_both_forms(void** state) {
  (void)state;
  for (int form = 0; form < 2; ++form) {
    pcp_tokenizer_t* t = load_default(form == 1);
    int32_t ids[256];
    // "abc": a+b (rank 0) then ab+c (rank 1).
    assert_int_equal(encode(t, "abc", 3, ids, 256), 1);
    assert_int_equal(ids[0], 257);
    // " abc" is split by the GPT-2 regex into one piece " abc": " a" has
    // rank 2, "ab" rank 0, so a+b wins first and " " stays alone.
    size_t n = encode(t, " abc", 4, ids, 256);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], ' ');
    assert_int_equal(ids[1], 257);
    // "aaa": leftmost a+a first -> "aa" "a".
    n = encode(t, "aaa", 3, ids, 256);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 259);
    assert_int_equal(ids[1], 'a');
    pcp_tokenizer_release(t);
  }
}

static void test_long_word_heap_path(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  // 4k + r 'a's merge into k "aaaa" then leftovers, whether the word takes
  // the linear path (<= 16 symbols) or the heap path.
  for (size_t length = 1; length <= 70; ++length) {
    char text[80];
    memset(text, 'a', length);
    int32_t ids[80];
    size_t n = encode(t, text, length, ids, 80);
    size_t expect = length / 4 + (length % 4 == 3 ? 2 : length % 4 ? 1 : 0);
    assert_int_equal(n, expect);
    for (size_t i = 0; i < length / 4; ++i) assert_int_equal(ids[i], 260);
    if (length % 4 >= 2)
      assert_int_equal(ids[length / 4], 259);
    if (length % 4 == 1)
      assert_int_equal(ids[length / 4], 'a');
  }
  pcp_tokenizer_release(t);
}

static void test_added_tokens(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  int32_t ids[64];
  const char* text = "<|im_start|>ab<|im_end|><|imx";
  size_t n = encode(t, text, strlen(text), ids, 64);
  // Longest first: "<|im_start|>" not "<|im"; "<|im" where nothing longer
  // matches.
  assert_int_equal(n, 5);
  assert_int_equal(ids[0], 263);
  assert_int_equal(ids[1], 256);
  assert_int_equal(ids[2], 264);
  assert_int_equal(ids[3], 265);
  assert_int_equal(ids[4], 'x');
  size_t size = 0;
  char* out = decode(t, ids, n, PCP_TOKENIZER_DECODE_FLAG_NONE, &size);
  assert_string_equal(out, text);
  free(out);
  out = decode(t, ids, n, PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL, &size);
  assert_string_equal(out, "ab<|imx");  // <|im is not special
  free(out);
  assert_true(pcp_tokenizer_id_is_special(t, 263));
  assert_false(pcp_tokenizer_id_is_special(t, 265));
  int32_t id;
  assert_true(
      pcp_tokenizer_token_to_id(t, pcp_make_cstring_view("<|im_end|>"), &id));
  assert_int_equal(id, 264);
  // lstrip/rstrip eat the whitespace around "[R]".
  n = encode(t, "ab  [R]  ab", 11, ids, 64);
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 256);
  assert_int_equal(ids[1], 266);
  assert_int_equal(ids[2], 256);
  pcp_tokenizer_release(t);
}

static void test_decode_partial_utf8(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  int32_t ids[8];
  // "中" (E4 B8 AD) is one token; its first two bytes another.
  size_t n = encode(t, "\xe4\xb8\xad", 3, ids, 8);
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], 262);
  int32_t partial[2] = {261, 'x'};
  size_t size = 0;
  char* out = decode(t, partial, 2, PCP_TOKENIZER_DECODE_FLAG_NONE, &size);
  // One U+FFFD for the truncated sequence, then 'x'.
  assert_string_equal(out, "\xef\xbf\xbdx");
  free(out);
  out = decode(t, partial, 1, PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, &size);
  assert_int_equal(size, 2);
  assert_int_equal(pcp_tokenizer_utf8_complete_length(out, size), 0);
  free(out);
  assert_int_equal(pcp_tokenizer_utf8_complete_length("a\xe4\xb8\xad", 4), 4);
  assert_int_equal(pcp_tokenizer_utf8_complete_length("a\xe4", 2), 1);
  assert_int_equal(pcp_tokenizer_utf8_complete_length("a\xf0\x9f\x98", 4), 1);
  assert_int_equal(pcp_tokenizer_utf8_complete_length("a\xff", 2), 2);
  assert_int_equal(pcp_tokenizer_utf8_complete_length("a\x80", 2), 2);
  // Lossy: each maximal invalid subsequence is one U+FFFD.
  int32_t bad[4] = {0xF0, 0x9F, 'a', 0xFF};
  out = decode(t, bad, 4, PCP_TOKENIZER_DECODE_FLAG_NONE, &size);
  assert_string_equal(out,
                      "\xef\xbf\xbd"
                      "a\xef\xbf\xbd");
  free(out);
  // Out-of-range ids are an error, not silently dropped.
  int32_t wrong = 5000;
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  assert_int_equal(pcp_status_consume_code(pcp_tokenizer_decode(
                       t, &wrong, 1, PCP_TOKENIZER_DECODE_FLAG_NONE, &b)),
                   PCP_STATUS_OUT_OF_RANGE);
  pcp_string_builder_deinitialize(&b);
  pcp_tokenizer_release(t);
}

static void test_invalid_utf8_input(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  const char text[] = "ab\xff\xfe cd\xe4\xb8 \xc3(";
  size_t length = sizeof(text) - 1;
  int32_t ids[64], again[64];
  size_t n = encode(t, text, length, ids, 64);
  // Deterministic, and the bytes come back exactly.
  assert_int_equal(encode(t, text, length, again, 64), n);
  assert_memory_equal(ids, again, n * sizeof(int32_t));
  size_t size = 0;
  char* out = decode(t, ids, n, PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, &size);
  assert_int_equal(size, length);
  assert_memory_equal(out, text, length);
  free(out);
  pcp_tokenizer_release(t);
}

static void check_nfc(const char* input, const char* expect) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_tokenizer_nfc_append(pcp_make_cstring_view(input), &b));
  assert_string_equal(pcp_string_builder_cstring(&b), expect);
  pcp_string_builder_deinitialize(&b);
}

static void test_nfc(void** state) {
  (void)state;
  check_nfc("plain ascii", "plain ascii");
  check_nfc("e\xcc\x81", "\xc3\xa9");                // e + acute -> é
  check_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8",  // jamo -> 각
            "\xea\xb0\x81");
  check_nfc("\xe2\x84\xab", "\xc3\x85");  // Angstrom -> Å
  check_nfc("\xe2\x84\xa6", "\xce\xa9");  // Ohm -> Omega
  // Canonical order: dot below (220) before acute (230), then compose.
  check_nfc("a\xcc\x81\xcc\xa3", "\xe1\xba\xa1\xcc\x81");
  // Invalid bytes pass through and block composition.
  check_nfc("e\xff\xcc\x81", "e\xff\xcc\x81");
  check_nfc("\xef\xac\x81", "\xef\xac\x81");  // fi ligature: NFKC only
  check_nfc("x\xcc\x81y e\xcc\x81", "x\xcc\x81y \xc3\xa9");
}

static void test_limits(void** state) {
  (void)state;
  char* json = make_json(kExtra, PCP_ARRAYSIZE(kExtra), kMerges,
                         PCP_ARRAYSIZE(kMerges), true, kAdded, NULL, NULL);
  pcp_tokenizer_limits_t limits;
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_file_byte_length = 100;
  assert_int_equal(load_code(json, &limits, "over the limit"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_vocab_size = 100;
  assert_int_equal(load_code(json, &limits, "max_vocab_size"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_merge_count = 3;
  assert_int_equal(load_code(json, &limits, "merges"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_token_byte_length = 8;
  assert_int_equal(load_code(json, &limits, "12 bytes"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_added_token_count = 2;
  assert_int_equal(load_code(json, &limits, "added tokens"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_json_depth = 3;
  assert_int_equal(load_code(json, &limits, "deeper"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  // Text length.
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_text_byte_length = 4;
  pcp_tokenizer_t* t = load(json, &limits);
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  assert_int_equal(pcp_status_consume_code(pcp_tokenizer_encode(
                       t, pcp_make_cstring_view("abcde"), &ids)),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  PCP_CHECK_OK(pcp_tokenizer_encode(t, pcp_make_cstring_view("abcd"), &ids));
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_release(t);
  free(json);
  // A deeply nested document is refused before jansson sees it.
  char deep[4096];
  memset(deep, '[', 2000);
  memset(deep + 2000, ']', 2000);
  deep[4000] = 0;
  assert_int_equal(load_code(deep, NULL, "nests deeper than 64"),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
}

static void test_malformed(void** state) {
  (void)state;
  assert_int_equal(load_code("{\"model\": ", NULL, "tokenizer.json"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(load_code("[]", NULL, "must be an object"),
                   PCP_STATUS_INVALID_ARGUMENT);
  const char* byte_level = "{\"type\":\"ByteLevel\"}";
  char buffer[512];
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"type\":\"WordPiece\","
           "\"vocab\":{}}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "WordPiece"),
                   PCP_STATUS_UNIMPLEMENTED);
  assert_int_equal(
      load_code("{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{}}",
                NULL, "Whitespace"),
      PCP_STATUS_UNIMPLEMENTED);
  assert_int_equal(
      load_code("{\"pre_tokenizer\":null,\"model\":{}}", NULL, "ByteLevel"),
      PCP_STATUS_UNIMPLEMENTED);
  snprintf(buffer, sizeof(buffer),
           "{\"normalizer\":{\"type\":\"Lowercase\"},\"pre_tokenizer\":%s,"
           "\"model\":{\"vocab\":{},\"merges\":[]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "Lowercase"),
                   PCP_STATUS_UNIMPLEMENTED);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"decoder\":{\"type\":\"WordPiece\"},"
           "\"model\":{\"vocab\":{},\"merges\":[]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "decoder type 'WordPiece'"),
                   PCP_STATUS_UNIMPLEMENTED);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{},\"merges\":[],"
           "\"dropout\":0.1}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "dropout"),
                   PCP_STATUS_UNIMPLEMENTED);
  assert_int_equal(
      load_code("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                "{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},\"model\":{}}",
                NULL, "does not compile"),
      PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":0,\"b\":1},"
           "\"merges\":[\"a c\"]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "'c' is not in the vocab"),
                   PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":0,\"b\":1},"
           "\"merges\":[\"a b\"]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "merged token"),
                   PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":0,\"b\":1},"
           "\"merges\":[\"ab\"]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "one space"),
                   PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":\"x\"},"
           "\"merges\":[]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "integer"),
                   PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":0,\"b\":0},"
           "\"merges\":[]}}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "used twice"),
                   PCP_STATUS_INVALID_ARGUMENT);
  snprintf(buffer, sizeof(buffer),
           "{\"pre_tokenizer\":%s,\"model\":{\"vocab\":{\"a\":0},"
           "\"merges\":[]},\"added_tokens\":[{\"id\":1,\"content\":\"\"}]}",
           byte_level);
  assert_int_equal(load_code(buffer, NULL, "non-empty"),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status = pcp_tokenizer_create_from_file(
      "/nonexistent/tokenizer.json", NULL, pcp_allocator_system(), &t);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_NOT_FOUND);
}

static void test_split_behaviors(void** state) {
  (void)state;
  // Split on "-" with each behavior (the examples of the `tokenizers`
  // documentation), then ByteLevel without its regex.
  static const struct {
    const char* behavior;
    const char* expect;  // pieces joined by '|'
  } kCases[] = {
      {"Removed", "the|final|countdown"},
      {"Isolated", "the|-|final|-|-|countdown"},
      {"MergedWithPrevious", "the-|final-|-|countdown"},
      {"MergedWithNext", "the|-final|-|-countdown"},
      {"Contiguous", "the|-|final|--|countdown"},
  };
  for (size_t c = 0; c < PCP_ARRAYSIZE(kCases); ++c) {
    // No merges, and add_prefix_space after the split: decoding shows each
    // piece as " piece".
    char pre[512];
    snprintf(pre, sizeof(pre),
             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
             "\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\","
             "\"invert\":false},{\"type\":\"ByteLevel\","
             "\"add_prefix_space\":true,\"use_regex\":false}]}",
             kCases[c].behavior);
    char* json = make_json(NULL, 0, NULL, 0, true, "[]", pre, NULL);
    pcp_tokenizer_t* t = load(json, NULL);
    int32_t ids[64];
    size_t n = encode(t, "the-final--countdown", 20, ids, 64);
    size_t size = 0;
    char* out = decode(t, ids, n, PCP_TOKENIZER_DECODE_FLAG_NONE, &size);
    char want[64] = "";
    char expect[64];
    snprintf(expect, sizeof(expect), "%s", kCases[c].expect);
    for (char* piece = strtok(expect, "|"); piece; piece = strtok(NULL, "|")) {
      strcat(want, " ");
      strcat(want, piece);
    }
    assert_string_equal(out, want);
    free(out);
    pcp_tokenizer_release(t);
    free(json);
  }
}

static void test_chat_template(void** state) {
  (void)state;
  pcp_tokenizer_chat_message_t messages[] = {
      {PCP_TOKENIZER_CHAT_ROLE_USER, pcp_make_cstring_view("Hi")},
      {PCP_TOKENIZER_CHAT_ROLE_ASSISTANT, pcp_make_cstring_view("Hello")},
      {PCP_TOKENIZER_CHAT_ROLE_USER, pcp_make_cstring_view("Bye")},
  };
  pcp_tokenizer_chat_options_t options = {
      .default_system_prompt =
          pcp_make_cstring_view(PCP_TOKENIZER_QWEN_DEFAULT_SYSTEM_PROMPT),
      .add_generation_prompt = true,
  };
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_tokenizer_chat_render(messages, 3, &options, &b));
  assert_string_equal(
      pcp_string_builder_cstring(&b),
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
      "helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye"
      "<|im_end|>\n<|im_start|>assistant\n");
  pcp_string_builder_reset(&b);
  pcp_tokenizer_chat_options_t plain = {0};
  PCP_CHECK_OK(pcp_tokenizer_chat_render(messages, 1, &plain, &b));
  assert_string_equal(pcp_string_builder_cstring(&b),
                      "<|im_start|>user\nHi<|im_end|>\n");
  pcp_tokenizer_chat_message_t bad = {(pcp_tokenizer_chat_role_t)7,
                                      pcp_make_cstring_view("x")};
  assert_int_equal(
      pcp_status_consume_code(pcp_tokenizer_chat_render(&bad, 1, &plain, &b)),
      PCP_STATUS_INVALID_ARGUMENT);
  pcp_string_builder_deinitialize(&b);
  pcp_tokenizer_chat_role_t role;
  assert_true(
      pcp_tokenizer_chat_role_parse(pcp_make_cstring_view("assistant"), &role));
  assert_int_equal(role, PCP_TOKENIZER_CHAT_ROLE_ASSISTANT);
  assert_false(
      pcp_tokenizer_chat_role_parse(pcp_make_cstring_view("tool"), &role));
  // Encoding: the markers are added tokens, the rest byte-level BPE.
  pcp_tokenizer_t* t = load_default(true);
  pcp_tokenizer_encoder_t* e = NULL;
  PCP_CHECK_OK(pcp_tokenizer_encoder_create(t, pcp_allocator_system(), &e));
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  PCP_CHECK_OK(pcp_tokenizer_chat_encode(e, messages, 1, &plain, &ids));
  assert_int_equal(ids.count, 1 + 5 + 2 + 1 + 1);  // start user\nHi end \n
  assert_int_equal(ids.values[0], 263);
  assert_int_equal(ids.values[8], 264);
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_encoder_release(e);
  pcp_tokenizer_release(t);
}

// SQLite-style: fail every allocation in turn; each failure is a clean
// status and nothing leaks (ASan checks the leaks).
static void test_oom_sweep(void** state) {
  (void)state;
  char* json = make_json(kExtra, PCP_ARRAYSIZE(kExtra), kMerges,
                         PCP_ARRAYSIZE(kMerges), true, kAdded, NULL, NULL);
  bool completed = false;
  for (int64_t fail_at = 0; !completed && fail_at < 1000; ++fail_at) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), fail_at, true,
                                     &failing);
    pcp_allocator_t allocator = pcp_allocator_failing(&failing);
    pcp_tokenizer_t* t = NULL;
    pcp_status_t status =
        pcp_tokenizer_create_from_json(json, strlen(json), NULL, allocator, &t);
    pcp_tokenizer_encoder_t* e = NULL;
    if (!status)
      status = pcp_tokenizer_encoder_create(t, allocator, &e);
    pcp_tokenizer_id_list_t ids;
    pcp_tokenizer_id_list_initialize(allocator, &ids);
    if (!status) {
      status = pcp_tokenizer_encoder_encode(
          e, pcp_make_cstring_view("<|im_start|>abc aaaaaaaaaaaaaaaaaaaaaaaa"),
          &ids);
    }
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
    } else {
      completed = true;
    }
    pcp_tokenizer_id_list_deinitialize(&ids);
    pcp_tokenizer_encoder_release(e);
    pcp_tokenizer_release(t);
  }
  assert_true(completed);
  free(json);
}

// Streaming: any split of the ids gives the text of one decode.
static void test_decode_stream(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  // Bytes of "中" (one token and its two-byte prefix token), an emoji as
  // four single-byte tokens, a truncated sequence before 'x', a special
  // token, and a lone continuation byte.
  const int32_t ids[] = {262,  'a', 261, 0xAD, 0xF0, 0x9F, 0x98, 0x80,
                         0xE4, 'x', 263, 0x80, 'b',  0xF0, 0x9F};
  const size_t n = PCP_ARRAYSIZE(ids);
  for (int skip = 0; skip < 2; ++skip) {
    pcp_tokenizer_decode_flags_t flags =
        skip ? PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL
             : PCP_TOKENIZER_DECODE_FLAG_NONE;
    size_t size = 0;
    char* whole = decode(t, ids, n, flags, &size);
    // Every way to cut the list into pushes of 1..3 ids, by a fixed stride
    // pattern per start offset.
    for (size_t pattern = 0; pattern < 27; ++pattern) {
      pcp_tokenizer_decode_stream_t stream;
      pcp_tokenizer_decode_stream_initialize(t, flags, &stream);
      pcp_string_builder_t out;
      pcp_string_builder_initialize(pcp_allocator_system(), 0, &out);
      size_t i = 0, p = pattern;
      while (i < n) {
        size_t step = 1 + p % 3;
        p = p / 3 + 7 * (p % 3);
        if (step > n - i)
          step = n - i;
        PCP_CHECK_OK(
            pcp_tokenizer_decode_stream_push(&stream, ids + i, step, &out));
        // Nothing emitted so far ends inside a character.
        assert_int_equal(pcp_tokenizer_utf8_complete_length(
                             out.data ? out.data : "", out.size),
                         out.size);
        i += step;
      }
      PCP_CHECK_OK(pcp_tokenizer_decode_stream_finish(&stream, &out));
      assert_string_equal(pcp_string_builder_cstring(&out), whole);
      pcp_string_builder_deinitialize(&out);
    }
    free(whole);
  }
  // An unknown id leaves the stream as it was.
  pcp_tokenizer_decode_stream_t stream;
  pcp_tokenizer_decode_stream_initialize(t, 0, &stream);
  pcp_string_builder_t out;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &out);
  int32_t first = 0xE4, wrong = 9999, rest[2] = {0xB8, 0xAD};
  PCP_CHECK_OK(pcp_tokenizer_decode_stream_push(&stream, &first, 1, &out));
  assert_int_equal(out.size, 0);
  assert_int_equal(pcp_status_consume_code(pcp_tokenizer_decode_stream_push(
                       &stream, &wrong, 1, &out)),
                   PCP_STATUS_OUT_OF_RANGE);
  PCP_CHECK_OK(pcp_tokenizer_decode_stream_push(&stream, rest, 2, &out));
  assert_string_equal(pcp_string_builder_cstring(&out), "\xe4\xb8\xad");
  pcp_string_builder_deinitialize(&out);
  pcp_tokenizer_release(t);
}

// One tokenizer, several threads, an encoder each: the tokenizer is
// read-only, so every thread gets the ids a single thread gets.
typedef struct thread_case_t {
  const pcp_tokenizer_t* tokenizer;
  const char* text;
  const int32_t* expect;
  size_t expect_count;
  int mismatches;
} thread_case_t;

static void* encode_thread(void* arg) {
  thread_case_t* c = arg;
  pcp_tokenizer_encoder_t* e = NULL;
  PCP_CHECK_OK(
      pcp_tokenizer_encoder_create(c->tokenizer, pcp_allocator_system(), &e));
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  for (int i = 0; i < 200; ++i) {
    ids.count = 0;
    PCP_CHECK_OK(
        pcp_tokenizer_encoder_encode(e, pcp_make_cstring_view(c->text), &ids));
    if (ids.count != c->expect_count ||
        memcmp(ids.values, c->expect, ids.count * sizeof(int32_t)) != 0) {
      ++c->mismatches;
    }
  }
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_encoder_release(e);
  return NULL;
}

static void test_threads(void** state) {
  (void)state;
  pcp_tokenizer_t* t = load_default(true);
  const char* text =
      "<|im_start|>user\nabc aaaaaaaaaaaaaaaaaaaaaaaaaaaaa abcabc \xe4\xb8\xad"
      "\xe4\xb8\xad [R] the end<|im_end|>";
  int32_t expect[256];
  size_t count = encode(t, text, strlen(text), expect, 256);
  thread_case_t cases[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) {
    cases[i] = (thread_case_t){t, text, expect, count, 0};
    assert_int_equal(
        pthread_create(&threads[i], NULL, encode_thread, &cases[i]), 0);
  }
  for (int i = 0; i < 4; ++i) {
    assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(cases[i].mismatches, 0);
  }
  pcp_tokenizer_release(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_alphabet),
      cmocka_unit_test(test_merges_both_forms),
      cmocka_unit_test(test_long_word_heap_path),
      cmocka_unit_test(test_added_tokens),
      cmocka_unit_test(test_decode_partial_utf8),
      cmocka_unit_test(test_invalid_utf8_input),
      cmocka_unit_test(test_nfc),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_split_behaviors),
      cmocka_unit_test(test_chat_template),
      cmocka_unit_test(test_oom_sweep),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_decode_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
