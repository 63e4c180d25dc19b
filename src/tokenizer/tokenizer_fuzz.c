// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target for the tokenizer. The first input byte picks the mode:
//   0: the input is a tokenizer.json; if it loads, encode and decode a fixed
//      text with it (any status is fine; crashes, leaks and UB are not);
//   1: the input is text for a fixed Qwen2-style tokenizer without a
//      normalizer: decode(encode(x)) must give x back byte for byte;
//   2: the input is text for NFC: normalizing twice must equal once, and
//      the same tokenizer with NFC must encode it deterministically.
// Built with libFuzzer under clang and -DPCP_FUZZ=ON; otherwise a replay
// tool that ctest runs over tests/fuzz/tokenizer.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(  // NOLINT(readability-identifier-naming)
    int* argc, char*** argv);
int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size);

// Made once, before any input, so libFuzzer's per-input leak check does not
// see them.
static pcp_tokenizer_t* g_plain = NULL;
static pcp_tokenizer_t* g_nfc = NULL;
// The fuzz entry points have no caller to take an allocator from; set by
// LLVMFuzzerInitialize, before any input.
static pcp_allocator_t g_allocator;

static const char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
    "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
    "\\\\s+(?!\\\\S)|\\\\s+";

static void append_char(pcp_string_builder_t* b, int byte) {
  // GPT-2's byte -> code point, spelled in UTF-8 (JSON-escaped where needed).
  bool printable = (byte >= '!' && byte <= '~') ||
                   (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
  uint32_t cp = (uint32_t)byte;
  if (!printable) {
    uint32_t n = 0;
    for (int i = 0; i < byte; ++i) {
      if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) ||
            (i >= 0xAE))) {
        ++n;
      }
    }
    cp = 256 + n;
  }
  if (cp == '"' || cp == '\\') {
    PCP_CHECK_OK(pcp_string_builder_append_f(b, "\\%c", (char)cp));
  } else if (cp < 0x80) {
    PCP_CHECK_OK(pcp_string_builder_append_f(b, "%c", (char)cp));
  } else {
    PCP_CHECK_OK(pcp_string_builder_append_f(
        b, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F))));
  }
}

static pcp_tokenizer_t* fixed_tokenizer(bool nfc) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(g_allocator, 0, &b);
  PCP_CHECK_OK(pcp_string_builder_append_f(
      &b,
      "{\"normalizer\":%s,\"pre_tokenizer\":{\"type\":\"Sequence\","
      "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},"
      "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
      "\"add_prefix_space\":false,\"use_regex\":false}]},"
      "\"added_tokens\":[{\"id\":300,\"content\":\"<|im_start|>\","
      "\"special\":true},{\"id\":301,\"content\":\"<|im_end|>\","
      "\"special\":true}],\"model\":{\"type\":\"BPE\",\"vocab\":{",
      nfc ? "{\"type\":\"NFC\"}" : "null", kQwen2Pattern));
  for (int i = 0; i < 256; ++i) {
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, i ? ",\"" : "\""));
    append_char(&b, i);
    PCP_CHECK_OK(pcp_string_builder_append_f(&b, "\":%d", i));
  }
  // " t", " th", "he", "in", "中" (E4 B8 AD) built from two merges.
  static const char* const kExtra[] = {" t", " th",      "he",
                                       "in", "\xe4\xb8", "\xe4\xb8\xad"};
  static const char* const kMerges[][2] = {
      {" ", "t"}, {" t", "h"},      {"h", "e"},
      {"i", "n"}, {"\xe4", "\xb8"}, {"\xe4\xb8", "\xad"}};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kExtra); ++i) {
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, ",\""));
    for (const char* p = kExtra[i]; *p; ++p) append_char(&b, (uint8_t)*p);
    PCP_CHECK_OK(pcp_string_builder_append_f(&b, "\":%zu", 256 + i));
  }
  PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "},\"merges\":["));
  for (size_t i = 0; i < PCP_ARRAYSIZE(kMerges); ++i) {
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, i ? ",[\"" : "[\""));
    for (const char* p = kMerges[i][0]; *p; ++p) append_char(&b, (uint8_t)*p);
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "\",\""));
    for (const char* p = kMerges[i][1]; *p; ++p) append_char(&b, (uint8_t)*p);
    PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "\"]"));
  }
  PCP_CHECK_OK(pcp_string_builder_append_cstring(&b, "]}}"));
  pcp_tokenizer_t* t = NULL;
  PCP_CHECK_OK(
      pcp_tokenizer_create_from_json(b.data, b.size, NULL, g_allocator, &t));
  pcp_string_builder_deinitialize(&b);
  return t;
}

static void fuzz_loader(const uint8_t* data, size_t size) {
  pcp_tokenizer_limits_t limits;
  pcp_tokenizer_limits_initialize(&limits);
  limits.max_vocab_size = 1u << 16;  // keep each run small
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status = pcp_tokenizer_create_from_json(
      (const char*)data, size, &limits, g_allocator, &t);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(g_allocator, &ids);
  status = pcp_tokenizer_encode(
      t, pcp_make_cstring_view("Hello <|im_start|> wörld 123 \xff 中文"), &ids);
  if (!status) {
    pcp_string_builder_t out;
    pcp_string_builder_initialize(g_allocator, 0, &out);
    pcp_status_ignore(
        pcp_tokenizer_decode(t, ids.values, ids.count,
                             PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL, &out));
    pcp_string_builder_deinitialize(&out);
  }
  pcp_status_ignore(status);
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_release(t);
}

static void fuzz_roundtrip(pcp_tokenizer_t* t, const uint8_t* data,
                           size_t size) {
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(g_allocator, &ids);
  PCP_CHECK_OK(pcp_tokenizer_encode(
      t, pcp_make_string_view((const char*)data, size), &ids));
  pcp_string_builder_t out;
  pcp_string_builder_initialize(g_allocator, 0, &out);
  PCP_CHECK_OK(pcp_tokenizer_decode(t, ids.values, ids.count,
                                    PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, &out));
  PCP_ASSERT(out.size == size);
  PCP_ASSERT(size == 0 || memcmp(out.data, data, size) == 0);
  pcp_string_builder_deinitialize(&out);
  pcp_tokenizer_id_list_deinitialize(&ids);
}

static void fuzz_nfc(pcp_tokenizer_t* t, const uint8_t* data, size_t size) {
  pcp_string_builder_t once, twice;
  pcp_string_builder_initialize(g_allocator, 0, &once);
  pcp_string_builder_initialize(g_allocator, 0, &twice);
  PCP_CHECK_OK(pcp_tokenizer_nfc_append(
      pcp_make_string_view((const char*)data, size), &once));
  PCP_CHECK_OK(pcp_tokenizer_nfc_append(
      pcp_make_string_view(once.data ? once.data : "", once.size), &twice));
  PCP_ASSERT(once.size == twice.size);
  PCP_ASSERT(once.size == 0 || memcmp(once.data, twice.data, once.size) == 0);
  pcp_tokenizer_id_list_t a, b;
  pcp_tokenizer_id_list_initialize(g_allocator, &a);
  pcp_tokenizer_id_list_initialize(g_allocator, &b);
  pcp_string_view_t text = pcp_make_string_view((const char*)data, size);
  PCP_CHECK_OK(pcp_tokenizer_encode(t, text, &a));
  PCP_CHECK_OK(pcp_tokenizer_encode(t, text, &b));
  PCP_ASSERT(a.count == b.count);
  PCP_ASSERT(a.count == 0 ||
             memcmp(a.values, b.values, a.count * sizeof(int32_t)) == 0);
  pcp_tokenizer_id_list_deinitialize(&a);
  pcp_tokenizer_id_list_deinitialize(&b);
  pcp_string_builder_deinitialize(&once);
  pcp_string_builder_deinitialize(&twice);
}

int LLVMFuzzerInitialize(  // NOLINT(readability-identifier-naming)
    int* argc, char*** argv) {
  PCP_UNUSED(argc);
  PCP_UNUSED(argv);
  g_allocator = pcp_allocator_system();
  g_plain = fixed_tokenizer(false);
  g_nfc = fixed_tokenizer(true);
  return 0;
}

int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  switch (data[0] % 3) {
    case 0:
      fuzz_loader(data + 1, size - 1);
      break;
    case 1:
      fuzz_roundtrip(g_plain, data + 1, size - 1);
      break;
    default:
      fuzz_nfc(g_nfc, data + 1, size - 1);
      break;
  }
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 24, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "tokenizer_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);  // pcp_file_read_all's buffer
  }
  printf("tokenizer_fuzz: replayed %d input(s)\n", argc - 1);
  pcp_tokenizer_release(g_plain);
  pcp_tokenizer_release(g_nfc);
  return 0;
}
#endif
