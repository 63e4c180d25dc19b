// SPDX-License-Identifier: Apache-2.0
//
// Memory the tokenizer takes for a call comes from the caller's allocator:
// NFC's heap buffer for a long region from the output builder's, and the
// temporary encoder of pcp_tokenizer_encode from the id list's. A counting
// allocator sees it and a failing allocator turns it into RESOURCE_EXHAUSTED
// (never a crash; under ASan nothing leaks).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "tokenizer/tokenizer.h"

// 'a' and then kMarks x U+0301 (COMBINING ACUTE ACCENT, 2 bytes each): one
// region of 1 + 2 * kMarks bytes, more than the stack buffer holds (64 input
// bytes), so it is normalized on the heap.
enum { kMarks = 40 };

static void make_input(char* buffer, size_t* out_length) {
  size_t n = 0;
  buffer[n++] = 'a';
  for (int i = 0; i < kMarks; ++i) {
    buffer[n++] = (char)0xCC;
    buffer[n++] = (char)0x81;
  }
  *out_length = n;
}

// NFC composes a + U+0301 into U+00E1; the other marks stay.
static void check_output(const pcp_string_builder_t* out) {
  assert_int_equal(out->size, 2 + 2 * (kMarks - 1));
  assert_memory_equal(out->data, "\xc3\xa1", 2);
  for (int i = 0; i < kMarks - 1; ++i) {
    assert_memory_equal(out->data + 2 + 2 * i, "\xcc\x81", 2);
  }
}

// The region buffer (4 code points per input byte) goes through the
// builder's allocator: its peak is far above what the output needs.
static void test_nfc_buffer_uses_builder_allocator(void** state) {
  (void)state;
  char input[1 + 2 * kMarks];
  size_t length = 0;
  make_input(input, &length);
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_string_builder_t out;
  pcp_string_builder_initialize(pcp_allocator_counting(&counting), 0, &out);
  PCP_CHECK_OK(
      pcp_tokenizer_nfc_append(pcp_make_string_view(input, length), &out));
  check_output(&out);
  assert_true(counting.peak_bytes >= (int64_t)(length * 4 * sizeof(uint32_t)));
  pcp_string_builder_deinitialize(&out);
  assert_int_equal(counting.live_bytes, 0);
}

// Fail allocation n for every n until the call succeeds: each failure is
// RESOURCE_EXHAUSTED and leaves the builder usable.
static void test_nfc_oom_sweep(void** state) {
  (void)state;
  char input[1 + 2 * kMarks];
  size_t length = 0;
  make_input(input, &length);
  bool succeeded = false;
  int64_t failures = 0;
  for (int64_t n = 0; n < 64 && !succeeded; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_string_builder_t out;
    pcp_string_builder_initialize(pcp_allocator_failing(&failing), 0, &out);
    pcp_status_t status =
        pcp_tokenizer_nfc_append(pcp_make_string_view(input, length), &out);
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
      ++failures;
    } else {
      check_output(&out);
      succeeded = true;
    }
    pcp_string_builder_deinitialize(&out);
  }
  assert_true(succeeded);
  // At least the region buffer and the builder's first growth can fail.
  assert_true(failures >= 2);
}

// The smallest byte-level BPE: "ab" is one merge.
static const char kTinyTokenizer[] =
    "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
    "\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";

static pcp_tokenizer_t* tiny_tokenizer(void) {
  pcp_tokenizer_t* t = NULL;
  PCP_CHECK_OK(pcp_tokenizer_create_from_json(kTinyTokenizer,
                                              strlen(kTinyTokenizer), NULL,
                                              pcp_allocator_system(), &t));
  return t;
}

static void check_ids(const pcp_tokenizer_id_list_t* ids) {
  assert_int_equal(ids->count, 2);
  assert_int_equal(ids->values[0], 2);
  assert_int_equal(ids->values[1], 2);
}

// With room for the ids already, every allocation the call makes through
// the list's allocator is the temporary encoder's, freed before it returns.
static void test_encode_uses_id_list_allocator(void** state) {
  (void)state;
  pcp_tokenizer_t* t = tiny_tokenizer();
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_counting(&counting), &ids);
  for (int i = 0; i < 16; ++i) {
    PCP_CHECK_OK(pcp_tokenizer_id_list_append(&ids, 0));
  }
  ids.count = 0;
  int64_t allocations = counting.allocation_count;
  int64_t live = counting.live_bytes;
  PCP_CHECK_OK(pcp_tokenizer_encode(t, pcp_make_cstring_view("abab"), &ids));
  check_ids(&ids);
  assert_true(counting.allocation_count > allocations);
  assert_int_equal(counting.live_bytes, live);
  pcp_tokenizer_id_list_deinitialize(&ids);
  assert_int_equal(counting.live_bytes, 0);
  pcp_tokenizer_release(t);
}

static void test_encode_oom_sweep(void** state) {
  (void)state;
  pcp_tokenizer_t* t = tiny_tokenizer();
  bool succeeded = false;
  int64_t failures = 0;
  for (int64_t n = 0; n < 1000 && !succeeded; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_tokenizer_id_list_t ids;
    pcp_tokenizer_id_list_initialize(pcp_allocator_failing(&failing), &ids);
    pcp_status_t status =
        pcp_tokenizer_encode(t, pcp_make_cstring_view("abab"), &ids);
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
      ++failures;
    } else {
      check_ids(&ids);
      succeeded = true;
    }
    pcp_tokenizer_id_list_deinitialize(&ids);
  }
  assert_true(succeeded);
  assert_true(failures >= 2);
  pcp_tokenizer_release(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nfc_buffer_uses_builder_allocator),
      cmocka_unit_test(test_nfc_oom_sweep),
      cmocka_unit_test(test_encode_uses_id_list_allocator),
      cmocka_unit_test(test_encode_oom_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
