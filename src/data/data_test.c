// SPDX-License-Identifier: Apache-2.0
// src/data: datasets, sampling, cursors, sharding, assignments, batch sizes.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include "data/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static char g_temp_dir[256];

static int setup_temp_dir(void** state) {
  (void)state;
  snprintf(g_temp_dir, sizeof(g_temp_dir), "/tmp/pcp-data-test-XXXXXX");
  return mkdtemp(g_temp_dir) ? 0 : -1;
}

static int remove_temp_dir(void** state) {
  (void)state;
  // Only files this test wrote, by name.
  static const char* kNames[] = {"bytes.bin", "tokens.u16", "odd.u16",
                                 "empty.txt", "bad.txt",    "utf8.txt",
                                 "short.txt", "big.txt"};
  char path[512];
  for (size_t i = 0; i < PCP_ARRAYSIZE(kNames); ++i) {
    snprintf(path, sizeof(path), "%s/%s", g_temp_dir, kNames[i]);
    unlink(path);
  }
  rmdir(g_temp_dir);
  return 0;
}

static void write_temp(const char* name, const void* data, size_t length,
                       char* out_path, size_t capacity) {
  snprintf(out_path, capacity, "%s/%s", g_temp_dir, name);
  FILE* f = fopen(out_path, "wb");
  assert_non_null(f);
  if (length)
    assert_int_equal(fwrite(data, 1, length, f), length);
  assert_int_equal(fclose(f), 0);
}

static const char* shakespeare_path(void) {
  const char* path = getenv("PCP_DATA_SHAKESPEARE");
  return path ? path : "data/tiny_shakespeare.txt";
}

static pcp_data_dataset_t* open_dataset(const char* path,
                                        pcp_data_format_t format) {
  pcp_data_dataset_options_t options;
  pcp_data_dataset_options_initialize(format, &options);
  pcp_data_dataset_t* dataset = NULL;
  PCP_CHECK_OK(
      pcp_data_dataset_open(path, &options, pcp_allocator_system(), &dataset));
  return dataset;
}

static pcp_status_code_t open_code(const char* path, pcp_data_format_t format,
                                   uint64_t max_bytes, uint32_t vocab_size) {
  pcp_data_dataset_options_t options;
  pcp_data_dataset_options_initialize(format, &options);
  if (max_bytes)
    options.max_file_byte_length = max_bytes;
  options.vocab_size = vocab_size;
  pcp_data_dataset_t* dataset = NULL;
  pcp_status_t status =
      pcp_data_dataset_open(path, &options, pcp_allocator_system(), &dataset);
  if (status) {
    char buffer[512];
    pcp_status_format(status, buffer, sizeof(buffer));
    print_message("  expected error: %s\n", buffer);
  }
  pcp_data_dataset_release(dataset);
  return pcp_status_consume_code(status);
}

static pcp_data_sampler_t* make_sampler(const pcp_data_dataset_t* dataset,
                                        pcp_data_range_t range,
                                        pcp_data_sampling_t sampling,
                                        uint32_t batch, uint32_t block,
                                        uint64_t seed) {
  pcp_data_sampler_options_t options = {sampling, batch, block, seed};
  pcp_data_sampler_t* sampler = NULL;
  PCP_CHECK_OK(pcp_data_sampler_create(dataset, range, &options,
                                       pcp_allocator_system(), &sampler));
  return sampler;
}

static pcp_status_code_t sampler_code(const pcp_data_dataset_t* dataset,
                                      pcp_data_range_t range,
                                      pcp_data_sampling_t sampling,
                                      uint32_t batch, uint32_t block) {
  pcp_data_sampler_options_t options = {sampling, batch, block, 1};
  pcp_data_sampler_t* sampler = NULL;
  pcp_status_t status = pcp_data_sampler_create(
      dataset, range, &options, pcp_allocator_system(), &sampler);
  if (status) {
    char buffer[512];
    pcp_status_format(status, buffer, sizeof(buffer));
    print_message("  expected error: %s\n", buffer);
  }
  pcp_data_sampler_release(sampler);
  return pcp_status_consume_code(status);
}

// A small UTF-8 text of 1-, 2-, 3- and 4-byte code points.
static size_t make_utf8_text(char* out, size_t capacity, size_t symbols) {
  static const char* kPieces[] = {
      "a", "b", " ", "\n", "\xc3\xa9", "\xe2\x9c\x93", "\xf0\x9f\x99\x82", "z"};
  pcp_rng_t rng;
  pcp_rng_initialize(99, &rng);
  size_t length = 0;
  for (size_t i = 0; i < symbols; ++i) {
    const char* piece =
        kPieces[pcp_rng_next_below(&rng, PCP_ARRAYSIZE(kPieces))];
    size_t n = strlen(piece);
    assert_true(length + n < capacity);
    memcpy(out + length, piece, n);
    length += n;
  }
  return length;
}

//===----------------------------------------------------------------------===//
// Datasets
//===----------------------------------------------------------------------===//

static void test_shakespeare_char_vocab(void** state) {
  (void)state;
  pcp_data_dataset_t* dataset =
      open_dataset(shakespeare_path(), PCP_DATA_FORMAT_CHAR);
  // nanoGPT's data/shakespeare_char/prepare.py: "vocab size: 65", "length of
  // dataset in characters: 1,115,394".
  assert_int_equal(pcp_data_dataset_vocab_size(dataset), 65);
  assert_int_equal(pcp_data_dataset_byte_length(dataset), 1115394);
  size_t count = 0;
  const uint32_t* symbols = pcp_data_dataset_symbols(dataset, &count);
  assert_int_equal(count, 65);
  const char* expected =
      "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  for (size_t i = 0; i < count; ++i) {
    assert_int_equal(symbols[i], (uint32_t)(uint8_t)expected[i]);
  }
  // nanoGPT's char tutorial: encode("hii there") ==
  // [46,47,47,1,58,46,43,56,43].
  int32_t ids[16];
  size_t n = 0;
  PCP_CHECK_OK(pcp_data_dataset_encode(
      dataset, pcp_make_cstring_view("hii there"), ids, 16, &n));
  const int32_t want[] = {46, 47, 47, 1, 58, 46, 43, 56, 43};
  assert_int_equal(n, PCP_ARRAYSIZE(want));
  assert_memory_equal(ids, want, sizeof(want));
  char text[32];
  size_t length = 0;
  PCP_CHECK_OK(
      pcp_data_dataset_decode(dataset, ids, n, text, sizeof(text), &length));
  assert_string_equal(text, "hii there");

  // Round trip of the first 4 KiB of the file itself.
  const char* bytes = (const char*)pcp_data_dataset_bytes(dataset);
  int32_t* many = malloc(4096 * sizeof(int32_t));
  char* back = malloc(4097);
  PCP_CHECK_OK(pcp_data_dataset_encode(
      dataset, pcp_make_string_view(bytes, 4096), many, 4096, &n));
  assert_int_equal(n, 4096);
  PCP_CHECK_OK(pcp_data_dataset_decode(dataset, many, n, back, 4097, &length));
  assert_int_equal(length, 4096);
  assert_memory_equal(back, bytes, 4096);
  free(many);
  free(back);

  // Out of vocabulary and out of range are errors that say so.
  assert_int_equal(pcp_status_consume_code(pcp_data_dataset_encode(
                       dataset, pcp_make_cstring_view("#"), ids, 16, &n)),
                   PCP_STATUS_NOT_FOUND);
  int32_t bad = 65;
  assert_int_equal(pcp_status_consume_code(pcp_data_dataset_decode(
                       dataset, &bad, 1, text, sizeof(text), &length)),
                   PCP_STATUS_OUT_OF_RANGE);
  // Capacity too small: the needed count is reported.
  assert_int_equal(
      pcp_status_consume_code(pcp_data_dataset_encode(
          dataset, pcp_make_cstring_view("hii there"), ids, 4, &n)),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(n, 9);

  // nanoGPT's split: "train has 1,003,854 tokens", "val has 111,540 tokens".
  pcp_data_range_t train, validation;
  PCP_CHECK_OK(pcp_data_dataset_split(dataset, 0.1, &train, &validation));
  assert_int_equal(train.byte_offset, 0);
  assert_int_equal(train.byte_length, 1003854);
  assert_int_equal(validation.byte_offset, 1003854);
  assert_int_equal(validation.byte_length, 111540);
  assert_int_equal(pcp_status_consume_code(pcp_data_dataset_split(
                       dataset, 1.0, &train, &validation)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_data_dataset_release(dataset);
}

static void test_utf8_char_dataset(void** state) {
  (void)state;
  char text[8192];
  size_t length = make_utf8_text(text, sizeof(text), 1500);
  char path[512];
  write_temp("utf8.txt", text, length, path, sizeof(path));
  pcp_data_dataset_t* dataset = open_dataset(path, PCP_DATA_FORMAT_CHAR);
  assert_int_equal(pcp_data_dataset_vocab_size(dataset), 8);
  size_t count = 0;
  const uint32_t* symbols = pcp_data_dataset_symbols(dataset, &count);
  const uint32_t want[] = {'\n', ' ', 'a', 'b', 'z', 0xE9, 0x2713, 0x1F642};
  assert_int_equal(count, 8);
  assert_memory_equal(symbols, want, sizeof(want));
  int32_t* ids = malloc(1500 * sizeof(int32_t));
  size_t n = 0;
  PCP_CHECK_OK(pcp_data_dataset_encode(
      dataset, pcp_make_string_view(text, length), ids, 1500, &n));
  assert_int_equal(n, 1500);
  char* back = malloc(length + 1);
  size_t back_length = 0;
  PCP_CHECK_OK(
      pcp_data_dataset_decode(dataset, ids, n, back, length + 1, &back_length));
  assert_int_equal(back_length, length);
  assert_memory_equal(back, text, length);
  uint64_t tokens = 0;
  PCP_CHECK_OK(pcp_data_dataset_token_count(
      dataset, pcp_data_dataset_full_range(dataset), &tokens));
  assert_int_equal(tokens, 1500);
  // Splits land on code point boundaries.
  for (int percent = 1; percent < 100; percent += 7) {
    pcp_data_range_t train, validation;
    PCP_CHECK_OK(
        pcp_data_dataset_split(dataset, percent / 100.0, &train, &validation));
    assert_true(((uint8_t)text[validation.byte_offset] & 0xC0) != 0x80);
    assert_int_equal(train.byte_length + validation.byte_length, length);
  }
  free(ids);
  free(back);
  pcp_data_dataset_release(dataset);
}

static void test_byte_and_u16_datasets(void** state) {
  (void)state;
  uint8_t bytes[512];
  for (int i = 0; i < 512; ++i) bytes[i] = (uint8_t)(i * 7 + 3);
  char path[512];
  write_temp("bytes.bin", bytes, sizeof(bytes), path, sizeof(path));
  pcp_data_dataset_t* dataset = open_dataset(path, PCP_DATA_FORMAT_BYTE);
  assert_int_equal(pcp_data_dataset_vocab_size(dataset), 256);
  int32_t ids[512];
  size_t n = 0;
  // Any bytes, UTF-8 or not.
  PCP_CHECK_OK(pcp_data_dataset_encode(
      dataset, pcp_make_string_view((const char*)bytes, 512), ids, 512, &n));
  assert_int_equal(ids[1], bytes[1]);
  char back[513];
  size_t length = 0;
  PCP_CHECK_OK(
      pcp_data_dataset_decode(dataset, ids, n, back, sizeof(back), &length));
  assert_memory_equal(back, bytes, 512);
  pcp_data_sampler_t* sampler =
      make_sampler(dataset, pcp_data_dataset_full_range(dataset),
                   PCP_DATA_SAMPLING_RANDOM, 4, 16, 3);
  int32_t inputs[64], targets[64];
  uint64_t rows[4];
  pcp_data_sampler_next(sampler, inputs, targets, rows);
  for (int b = 0; b < 4; ++b) {
    assert_true(rows[b] <= 512 - 17);
    for (int t = 0; t < 16; ++t) {
      assert_int_equal(inputs[b * 16 + t], bytes[rows[b] + t]);
      assert_int_equal(targets[b * 16 + t], bytes[rows[b] + t + 1]);
    }
  }
  pcp_data_sampler_release(sampler);
  pcp_data_dataset_release(dataset);

  // u16: little-endian ids, vocab = max + 1 or given and checked.
  uint8_t tokens[2 * 300];
  for (int i = 0; i < 300; ++i) {
    uint16_t id = (uint16_t)((i * 211) % 50000);
    tokens[2 * i] = (uint8_t)(id & 0xFF);
    tokens[2 * i + 1] = (uint8_t)(id >> 8);
  }
  uint16_t max_id = 0;
  for (int i = 0; i < 300; ++i) {
    uint16_t id = (uint16_t)((i * 211) % 50000);
    if (id > max_id)
      max_id = id;
  }
  write_temp("tokens.u16", tokens, sizeof(tokens), path, sizeof(path));
  dataset = open_dataset(path, PCP_DATA_FORMAT_U16);
  assert_int_equal(pcp_data_dataset_vocab_size(dataset), max_id + 1u);
  assert_int_equal(pcp_status_consume_code(pcp_data_dataset_encode(
                       dataset, pcp_make_cstring_view("x"), ids, 4, &n)),
                   PCP_STATUS_FAILED_PRECONDITION);
  sampler = make_sampler(dataset, (pcp_data_range_t){100, 400},
                         PCP_DATA_SAMPLING_SEQUENTIAL, 2, 10, 0);
  assert_int_equal(pcp_data_sampler_token_count(sampler), 200);
  int32_t in2[20], tg2[20];
  pcp_data_sampler_next(sampler, in2, tg2, rows);
  assert_int_equal(rows[0], 0);
  assert_int_equal(rows[1], 10);
  assert_int_equal(in2[0], (50 * 211) % 50000);
  assert_int_equal(tg2[19], (70 * 211) % 50000);
  pcp_data_sampler_release(sampler);
  // An odd offset is not a token boundary.
  assert_int_equal(sampler_code(dataset, (pcp_data_range_t){101, 400},
                                PCP_DATA_SAMPLING_RANDOM, 1, 4),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_data_dataset_release(dataset);
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_U16, 0, 60000),
                   PCP_STATUS_OK);
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_U16, 0, max_id),
                   PCP_STATUS_INVALID_ARGUMENT);
}

static void test_bounds(void** state) {
  (void)state;
  char path[512];
  write_temp("empty.txt", "", 0, path, sizeof(path));
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_CHAR, 0, 0),
                   PCP_STATUS_INVALID_ARGUMENT);
  write_temp("odd.u16", "abc", 3, path, sizeof(path));
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_U16, 0, 0),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_BYTE, 0, 0), PCP_STATUS_OK);
  write_temp("bad.txt", "ok \xff\xfe bad", 10, path, sizeof(path));
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_CHAR, 0, 0),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(
      open_code("/nonexistent/pcp/data.txt", PCP_DATA_FORMAT_CHAR, 0, 0),
      PCP_STATUS_NOT_FOUND);
  char big[4096];
  memset(big, 'x', sizeof(big));
  write_temp("big.txt", big, sizeof(big), path, sizeof(path));
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_CHAR, 4095, 0),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(open_code(path, PCP_DATA_FORMAT_CHAR, 4096, 0),
                   PCP_STATUS_OK);

  // T larger than the data; sequential needs B*T+1.
  write_temp("short.txt", "hello world", 11, path, sizeof(path));
  pcp_data_dataset_t* dataset = open_dataset(path, PCP_DATA_FORMAT_CHAR);
  pcp_data_range_t all = pcp_data_dataset_full_range(dataset);
  assert_int_equal(sampler_code(dataset, all, PCP_DATA_SAMPLING_RANDOM, 1, 11),
                   PCP_STATUS_OUT_OF_RANGE);
  assert_int_equal(sampler_code(dataset, all, PCP_DATA_SAMPLING_RANDOM, 1, 10),
                   PCP_STATUS_OK);
  assert_int_equal(
      sampler_code(dataset, all, PCP_DATA_SAMPLING_SEQUENTIAL, 2, 5),
      PCP_STATUS_OK);
  assert_int_equal(
      sampler_code(dataset, all, PCP_DATA_SAMPLING_SEQUENTIAL, 2, 6),
      PCP_STATUS_OUT_OF_RANGE);
  assert_int_equal(sampler_code(dataset, all, PCP_DATA_SAMPLING_RANDOM, 0, 4),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(sampler_code(dataset, (pcp_data_range_t){5, 7},
                                PCP_DATA_SAMPLING_RANDOM, 1, 2),
                   PCP_STATUS_INVALID_ARGUMENT);
  // T = n - 1: the single possible row, every time.
  pcp_data_sampler_t* sampler =
      make_sampler(dataset, all, PCP_DATA_SAMPLING_RANDOM, 3, 10, 8);
  int32_t inputs[30], targets[30];
  uint64_t rows[3];
  pcp_data_sampler_next(sampler, inputs, targets, rows);
  assert_int_equal(rows[0] + rows[1] + rows[2], 0);
  pcp_data_sampler_release(sampler);
  pcp_data_dataset_release(dataset);
}

//===----------------------------------------------------------------------===//
// Sampling and cursors
//===----------------------------------------------------------------------===//

#define TEST_BATCH 4
#define TEST_BLOCK 32

static void test_sampling_determinism(void** state) {
  (void)state;
  pcp_data_dataset_t* dataset =
      open_dataset(shakespeare_path(), PCP_DATA_FORMAT_CHAR);
  pcp_data_range_t train, validation;
  PCP_CHECK_OK(pcp_data_dataset_split(dataset, 0.1, &train, &validation));
  pcp_data_sampler_t* a = make_sampler(dataset, train, PCP_DATA_SAMPLING_RANDOM,
                                       TEST_BATCH, TEST_BLOCK, 1337);
  pcp_data_sampler_t* b = make_sampler(dataset, train, PCP_DATA_SAMPLING_RANDOM,
                                       TEST_BATCH, TEST_BLOCK, 1337);
  pcp_data_sampler_t* c = make_sampler(dataset, train, PCP_DATA_SAMPLING_RANDOM,
                                       TEST_BATCH, TEST_BLOCK, 1338);
  int32_t xa[TEST_BATCH * TEST_BLOCK], ya[TEST_BATCH * TEST_BLOCK],
      xb[TEST_BATCH * TEST_BLOCK], yb[TEST_BATCH * TEST_BLOCK],
      xc[TEST_BATCH * TEST_BLOCK], yc[TEST_BATCH * TEST_BLOCK];
  uint64_t ra[TEST_BATCH], rc[TEST_BATCH];
  int differ = 0;
  for (int step = 0; step < 50; ++step) {
    pcp_data_sampler_next(a, xa, ya, ra);
    pcp_data_sampler_next(b, xb, yb, NULL);
    pcp_data_sampler_next(c, xc, yc, rc);
    assert_memory_equal(xa, xb, sizeof(xa));
    assert_memory_equal(ya, yb, sizeof(ya));
    differ += memcmp(ra, rc, sizeof(ra)) != 0;
    for (int r = 0; r < TEST_BATCH; ++r) {
      assert_true(ra[r] <= train.byte_length - TEST_BLOCK - 1);
      // Targets are the inputs shifted by one.
      for (int t = 0; t + 1 < TEST_BLOCK; ++t) {
        assert_int_equal(ya[r * TEST_BLOCK + t], xa[r * TEST_BLOCK + t + 1]);
      }
    }
  }
  assert_int_equal(differ, 50);
  pcp_data_sampler_release(a);
  pcp_data_sampler_release(b);
  pcp_data_sampler_release(c);
  pcp_data_dataset_release(dataset);
}

static void check_resume(const pcp_data_dataset_t* dataset,
                         pcp_data_range_t range, pcp_data_sampling_t sampling,
                         int save_at, int total) {
  pcp_data_sampler_t* run =
      make_sampler(dataset, range, sampling, TEST_BATCH, TEST_BLOCK, 77);
  int32_t x[TEST_BATCH * TEST_BLOCK], y[TEST_BATCH * TEST_BLOCK];
  int32_t* after_x =
      calloc((size_t)total * TEST_BATCH * TEST_BLOCK, sizeof(int32_t));
  int32_t* after_y =
      calloc((size_t)total * TEST_BATCH * TEST_BLOCK, sizeof(int32_t));
  char saved[PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1] = "";
  pcp_data_cursor_t end_cursor;
  for (int step = 0; step < total; ++step) {
    if (step == save_at) {
      pcp_data_cursor_t cursor;
      pcp_data_sampler_cursor(run, &cursor);
      pcp_data_cursor_format(&cursor, saved, sizeof(saved));
    }
    pcp_data_sampler_next(run, x, y, NULL);
    memcpy(after_x + (size_t)step * TEST_BATCH * TEST_BLOCK, x, sizeof(x));
    memcpy(after_y + (size_t)step * TEST_BATCH * TEST_BLOCK, y, sizeof(y));
  }
  pcp_data_sampler_cursor(run, &end_cursor);
  pcp_data_sampler_release(run);

  // A new process: a sampler with a different seed, then the saved cursor.
  pcp_data_sampler_t* resumed =
      make_sampler(dataset, range, sampling, TEST_BATCH, TEST_BLOCK, 12345);
  pcp_data_cursor_t cursor;
  PCP_CHECK_OK(pcp_data_cursor_parse(pcp_make_cstring_view(saved), &cursor));
  PCP_CHECK_OK(pcp_data_sampler_restore(resumed, &cursor));
  for (int step = save_at; step < total; ++step) {
    pcp_data_sampler_next(resumed, x, y, NULL);
    assert_memory_equal(x, after_x + (size_t)step * TEST_BATCH * TEST_BLOCK,
                        sizeof(x));
    assert_memory_equal(y, after_y + (size_t)step * TEST_BATCH * TEST_BLOCK,
                        sizeof(y));
  }
  pcp_data_cursor_t resumed_end;
  pcp_data_sampler_cursor(resumed, &resumed_end);
  assert_memory_equal(&resumed_end, &end_cursor, sizeof(end_cursor));
  pcp_data_sampler_release(resumed);
  free(after_x);
  free(after_y);
}

static void test_cursor_resume(void** state) {
  (void)state;
  pcp_data_dataset_t* dataset =
      open_dataset(shakespeare_path(), PCP_DATA_FORMAT_CHAR);
  pcp_data_range_t all = pcp_data_dataset_full_range(dataset);
  check_resume(dataset, all, PCP_DATA_SAMPLING_RANDOM, 7, 20);
  // A small range so that sequential sampling crosses epochs both before
  // and after the save point: 1000 tokens, 128 per batch.
  pcp_data_range_t small = {5000, 1000};
  check_resume(dataset, small, PCP_DATA_SAMPLING_SEQUENTIAL, 9, 30);
  check_resume(dataset, small, PCP_DATA_SAMPLING_RANDOM, 11, 30);

  // Epochs advance: 30 batches of 128 tokens over 1000 tokens, 7 windows
  // per epoch (7 * 128 + 1 <= 1000).
  pcp_data_sampler_t* sampler = make_sampler(
      dataset, small, PCP_DATA_SAMPLING_SEQUENTIAL, TEST_BATCH, TEST_BLOCK, 0);
  int32_t x[TEST_BATCH * TEST_BLOCK], y[TEST_BATCH * TEST_BLOCK];
  for (int i = 0; i < 30; ++i) pcp_data_sampler_next(sampler, x, y, NULL);
  pcp_data_cursor_t cursor;
  pcp_data_sampler_cursor(sampler, &cursor);
  assert_int_equal(cursor.epoch, 4);
  assert_int_equal(cursor.position, 2 * 128);
  // A cursor from another range does not fit.
  cursor.position = 1001;
  assert_int_equal(
      pcp_status_consume_code(pcp_data_sampler_restore(sampler, &cursor)),
      PCP_STATUS_OUT_OF_RANGE);
  pcp_data_sampler_release(sampler);

  // Text form errors.
  assert_int_equal(pcp_status_consume_code(pcp_data_cursor_parse(
                       pcp_make_cstring_view("{\"rng\":\"12\",\"position\":0,"
                                             "\"epoch\":0}"),
                       &cursor)),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(pcp_status_consume_code(pcp_data_cursor_parse(
                       pcp_make_cstring_view("[1"), &cursor)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_data_dataset_release(dataset);
}

//===----------------------------------------------------------------------===//
// Sharding and assignments
//===----------------------------------------------------------------------===//

static void check_plan(const pcp_data_dataset_t* dataset,
                       pcp_data_range_t range, uint32_t block,
                       const char* const* ids, size_t count,
                       const pcp_data_assignment_t* plan) {
  // Sorted by shard index the pieces tile the range.
  uint64_t expected_offset = range.byte_offset;
  for (uint32_t k = 0; k < count; ++k) {
    const pcp_data_assignment_t* a = NULL;
    for (size_t i = 0; i < count; ++i) {
      if (plan[i].shard_index == k) {
        assert_null(a);
        a = &plan[i];
      }
    }
    assert_non_null(a);
    if (a == NULL)
      return;  // for the analyzer: cmocka's assert returns no value
    assert_int_equal(a->shard_count, count);
    assert_int_equal(a->range.byte_offset, expected_offset);
    expected_offset += a->range.byte_length;
    uint64_t tokens = 0;
    // Both ends on token boundaries (token_count checks that).
    PCP_CHECK_OK(pcp_data_dataset_token_count(dataset, a->range, &tokens));
    assert_true(tokens >= block + 1u);
    assert_string_equal(a->path, pcp_data_dataset_path(dataset));
  }
  assert_int_equal(expected_offset, range.byte_offset + range.byte_length);
  (void)ids;
}

static void test_shards_cover_without_overlap(void** state) {
  (void)state;
  const char* ids[] = {"w-07", "w-01", "w-13", "w-02", "w-11", "w-05", "w-03"};
  pcp_data_assignment_t plan[7];
  pcp_data_assignment_t reversed_plan[7];

  pcp_data_dataset_t* dataset =
      open_dataset(shakespeare_path(), PCP_DATA_FORMAT_CHAR);
  pcp_data_range_t train, validation;
  PCP_CHECK_OK(pcp_data_dataset_split(dataset, 0.1, &train, &validation));
  for (size_t w = 1; w <= 7; ++w) {
    PCP_CHECK_OK(pcp_data_shard_plan(dataset, train, 256, ids, w, 0, 1, plan));
    check_plan(dataset, train, 256, ids, w, plan);
    // The plan depends on the id set, not on the order the ids come in.
    const char* reversed[7];
    for (size_t i = 0; i < w; ++i) reversed[i] = ids[w - 1 - i];
    PCP_CHECK_OK(pcp_data_shard_plan(dataset, train, 256, reversed, w, 0, 1,
                                     reversed_plan));
    for (size_t i = 0; i < w; ++i) {
      assert_memory_equal(&plan[i], &reversed_plan[w - 1 - i], sizeof(plan[i]));
    }
  }
  // Each worker samples only inside its range.
  PCP_CHECK_OK(
      pcp_data_shard_plan(dataset, train, TEST_BLOCK, ids, 3, 0, 1, plan));
  for (int i = 0; i < 3; ++i) {
    pcp_data_sampler_t* sampler =
        make_sampler(dataset, plan[i].range, PCP_DATA_SAMPLING_RANDOM,
                     TEST_BATCH, TEST_BLOCK, plan[i].seed);
    int32_t x[TEST_BATCH * TEST_BLOCK], y[TEST_BATCH * TEST_BLOCK];
    uint64_t rows[TEST_BATCH];
    for (int step = 0; step < 20; ++step) {
      pcp_data_sampler_next(sampler, x, y, rows);
      for (int r = 0; r < TEST_BATCH; ++r) {
        assert_true(rows[r] + TEST_BLOCK + 1 <= plan[i].range.byte_length);
        const uint8_t* p = pcp_data_dataset_bytes(dataset) +
                           plan[i].range.byte_offset + rows[r];
        int32_t id = 0;
        size_t n = 0;
        PCP_CHECK_OK(pcp_data_dataset_encode(
            dataset, pcp_make_string_view((const char*)p, 1), &id, 1, &n));
        assert_int_equal(x[r * TEST_BLOCK], id);
      }
    }
    pcp_data_sampler_release(sampler);
  }
  // Too many workers for the range; duplicate and empty ids.
  pcp_data_range_t tiny = {0, 1000};
  pcp_status_t status =
      pcp_data_shard_plan(dataset, tiny, 200, ids, 7, 0, 1, plan);
  char message[512];
  pcp_status_format(status, message, sizeof(message));
  print_message("  expected error: %s\n", message);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_OUT_OF_RANGE);
  const char* duplicate[] = {"a", "b", "a"};
  assert_int_equal(pcp_status_consume_code(pcp_data_shard_plan(
                       dataset, train, 8, duplicate, 3, 0, 1, plan)),
                   PCP_STATUS_INVALID_ARGUMENT);
  const char* empty[] = {"a", ""};
  assert_int_equal(pcp_status_consume_code(pcp_data_shard_plan(
                       dataset, train, 8, empty, 2, 0, 1, plan)),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(pcp_status_consume_code(pcp_data_shard_plan(
                       dataset, train, 8, ids, 0, 0, 1, plan)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_data_dataset_release(dataset);

  // u16: even offsets only, with an odd token count per worker.
  uint8_t tokens[2 * 1001];
  for (int i = 0; i < 2002; ++i) tokens[i] = (uint8_t)(i * 13);
  char path[512];
  write_temp("tokens.u16", tokens, sizeof(tokens), path, sizeof(path));
  dataset = open_dataset(path, PCP_DATA_FORMAT_U16);
  for (size_t w = 1; w <= 7; ++w) {
    PCP_CHECK_OK(pcp_data_shard_plan(
        dataset, pcp_data_dataset_full_range(dataset), 16, ids, w, 3, 1, plan));
    check_plan(dataset, pcp_data_dataset_full_range(dataset), 16, ids, w, plan);
    for (size_t i = 0; i < w; ++i) {
      assert_int_equal(plan[i].range.byte_offset % 2, 0);
      assert_int_equal(plan[i].range.byte_length % 2, 0);
    }
  }
  pcp_data_dataset_release(dataset);

  // UTF-8: ends on code point boundaries.
  char text[8192];
  size_t length = make_utf8_text(text, sizeof(text), 1500);
  write_temp("utf8.txt", text, length, path, sizeof(path));
  dataset = open_dataset(path, PCP_DATA_FORMAT_CHAR);
  for (size_t w = 1; w <= 7; ++w) {
    PCP_CHECK_OK(pcp_data_shard_plan(
        dataset, pcp_data_dataset_full_range(dataset), 16, ids, w, 0, 1, plan));
    check_plan(dataset, pcp_data_dataset_full_range(dataset), 16, ids, w, plan);
  }
  pcp_data_dataset_release(dataset);
}

static void test_reshard_on_join(void** state) {
  (void)state;
  pcp_data_dataset_t* dataset =
      open_dataset(shakespeare_path(), PCP_DATA_FORMAT_CHAR);
  pcp_data_range_t range = pcp_data_dataset_full_range(dataset);
  const char* before[] = {"worker-b", "worker-a"};
  const char* after[] = {"worker-b", "worker-a", "worker-c"};
  pcp_data_assignment_t plan0[2], plan5[3], again5[3];
  PCP_CHECK_OK(
      pcp_data_shard_plan(dataset, range, 64, before, 2, 0, 42, plan0));
  // worker-c joins during step 4; the gateway re-shards at outer step 5.
  PCP_CHECK_OK(pcp_data_shard_plan(dataset, range, 64, after, 3, 5, 42, plan5));
  check_plan(dataset, range, 64, after, 3, plan5);
  assert_int_equal(plan0[1].shard_index, 0);  // worker-a sorts first
  assert_int_equal(plan5[1].shard_index, 0);
  assert_int_equal(plan5[2].shard_index, 2);  // the joiner: the last piece
  assert_int_equal(plan5[2].step, 5);
  assert_true(plan5[2].range.byte_length > 0);
  // The first worker's piece shrinks from half to a third of the data.
  assert_int_equal(plan5[1].range.byte_offset, 0);
  assert_true(plan5[1].range.byte_length < plan0[1].range.byte_length);
  // New seeds at the new step: no worker replays the stream it had.
  assert_true(plan5[0].seed != plan0[0].seed);
  assert_true(plan5[1].seed != plan0[1].seed);
  assert_true(plan5[0].seed != plan5[1].seed);
  // A pure function of (dataset, ids, step, seed): recomputing agrees, so a
  // restarted gateway hands out the same assignments.
  PCP_CHECK_OK(
      pcp_data_shard_plan(dataset, range, 64, after, 3, 5, 42, again5));
  assert_memory_equal(plan5, again5, sizeof(plan5));

  // The joiner's side: the assignment travels as JSON, the worker opens the
  // file itself and samples the same batches the plan implies; after a few
  // batches its cursor goes back in the assignment (a checkpoint) and a
  // restarted worker continues with the same batches.
  char text[PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1];
  PCP_CHECK_OK(pcp_data_assignment_format(&plan5[2], text, sizeof(text)));
  pcp_data_assignment_t received;
  PCP_CHECK_OK(
      pcp_data_assignment_parse(pcp_make_cstring_view(text), &received));
  pcp_data_dataset_t* worker_dataset =
      open_dataset(received.path, received.format);
  pcp_data_sampler_t* expected =
      make_sampler(dataset, plan5[2].range, PCP_DATA_SAMPLING_RANDOM,
                   TEST_BATCH, TEST_BLOCK, plan5[2].seed);
  pcp_data_sampler_t* worker =
      make_sampler(worker_dataset, received.range, PCP_DATA_SAMPLING_RANDOM,
                   TEST_BATCH, TEST_BLOCK, received.seed);
  int32_t x[TEST_BATCH * TEST_BLOCK], y[TEST_BATCH * TEST_BLOCK];
  int32_t wx[TEST_BATCH * TEST_BLOCK], wy[TEST_BATCH * TEST_BLOCK];
  for (int i = 0; i < 5; ++i) {
    pcp_data_sampler_next(expected, x, y, NULL);
    pcp_data_sampler_next(worker, wx, wy, NULL);
    assert_memory_equal(x, wx, sizeof(x));
    assert_memory_equal(y, wy, sizeof(y));
  }
  received.has_cursor = true;
  pcp_data_sampler_cursor(worker, &received.cursor);
  PCP_CHECK_OK(pcp_data_assignment_format(&received, text, sizeof(text)));
  pcp_data_sampler_release(worker);
  PCP_CHECK_OK(
      pcp_data_assignment_parse(pcp_make_cstring_view(text), &received));
  assert_true(received.has_cursor);
  worker =
      make_sampler(worker_dataset, received.range, PCP_DATA_SAMPLING_RANDOM,
                   TEST_BATCH, TEST_BLOCK, received.seed);
  PCP_CHECK_OK(pcp_data_sampler_restore(worker, &received.cursor));
  for (int i = 0; i < 5; ++i) {
    pcp_data_sampler_next(expected, x, y, NULL);
    pcp_data_sampler_next(worker, wx, wy, NULL);
    assert_memory_equal(x, wx, sizeof(x));
  }
  pcp_data_sampler_release(worker);
  pcp_data_sampler_release(expected);
  pcp_data_dataset_release(worker_dataset);

  // A worker that leaves: the next plan spreads the range over the rest.
  const char* remaining[] = {"worker-c", "worker-a"};
  pcp_data_assignment_t plan9[2];
  PCP_CHECK_OK(
      pcp_data_shard_plan(dataset, range, 64, remaining, 2, 9, 42, plan9));
  check_plan(dataset, range, 64, remaining, 2, plan9);
  assert_int_equal(plan9[1].shard_index, 0);
  pcp_data_dataset_release(dataset);
}

static void test_assignment_json_round_trip(void** state) {
  (void)state;
  pcp_data_assignment_t a;
  memset(&a, 0, sizeof(a));
  snprintf(a.path, sizeof(a.path), "data/tiny \"shakespeare\".txt");
  a.format = PCP_DATA_FORMAT_U16;
  a.range = (pcp_data_range_t){UINT64_C(1) << 40, 123456};
  a.shard_index = 2;
  a.shard_count = 3;
  a.step = 17;
  a.seed = UINT64_C(0xFEDCBA9876543210);
  char text[PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1];
  PCP_CHECK_OK(pcp_data_assignment_format(&a, text, sizeof(text)));
  print_message("  %s\n", text);
  pcp_data_assignment_t b;
  PCP_CHECK_OK(pcp_data_assignment_parse(pcp_make_cstring_view(text), &b));
  assert_memory_equal(&a, &b, sizeof(a));

  a.has_cursor = true;
  a.cursor = (pcp_data_cursor_t){
      {UINT64_MAX, 1, UINT64_C(0x8000000000000000), 42}, 999, 3};
  PCP_CHECK_OK(pcp_data_assignment_format(&a, text, sizeof(text)));
  print_message("  %s\n", text);
  PCP_CHECK_OK(pcp_data_assignment_parse(pcp_make_cstring_view(text), &b));
  assert_memory_equal(&a, &b, sizeof(a));

  // Upstream's shape: a file:// uri, chunk_id, no shard fields, integer seed.
  PCP_CHECK_OK(pcp_data_assignment_parse(
      pcp_make_cstring_view(
          "{\"kind\":\"byte_range\",\"provider\":\"uri\",\"uri\":"
          "\"file:///data/x.txt\",\"offset\":64,\"length\":128,\"chunk_id\":0,"
          "\"tokenizer\":\"char\",\"seed\":7,\"extra\":true}"),
      &b));
  assert_string_equal(b.path, "/data/x.txt");
  assert_int_equal(b.range.byte_offset, 64);
  assert_int_equal(b.shard_count, 1);
  assert_int_equal(b.seed, 7);
  assert_false(b.has_cursor);

  // Errors name the field.
  static const struct {
    const char* text;
    pcp_status_code_t code;
  } kBad[] = {
      {"{\"kind\":\"record_range\",\"path\":\"x\",\"tokenizer\":\"char\","
       "\"offset\":0,\"length\":1}",
       PCP_STATUS_UNIMPLEMENTED},
      {"{\"path\":\"x\",\"tokenizer\":\"bpe\",\"offset\":0,\"length\":1}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"path\":\"x\",\"tokenizer\":\"char\",\"offset\":-1,\"length\":1}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"path\":\"x\",\"tokenizer\":\"char\",\"length\":1}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"tokenizer\":\"char\",\"offset\":0,\"length\":1}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"path\":\"x\",\"tokenizer\":\"char\",\"offset\":0,\"length\":1,"
       "\"seed\":\"-000000000000001\"}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"path\":\"x\",\"tokenizer\":\"char\",\"offset\":0,\"length\":1,"
       "\"shard_index\":3,\"shard_count\":3}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"{\"path\":\"x\",\"tokenizer\":\"char\",\"offset\":0,\"length\":1,"
       "\"cursor\":{\"rng\":1}}",
       PCP_STATUS_INVALID_ARGUMENT},
      {"not json", PCP_STATUS_INVALID_ARGUMENT},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    pcp_status_t status =
        pcp_data_assignment_parse(pcp_make_cstring_view(kBad[i].text), &b);
    char message[512];
    pcp_status_format(status, message, sizeof(message));
    print_message("  expected error: %s\n", message);
    assert_int_equal(pcp_status_consume_code(status), kBad[i].code);
  }
  // Too small a buffer.
  assert_int_equal(
      pcp_status_consume_code(pcp_data_assignment_format(&a, text, 16)),
      PCP_STATUS_RESOURCE_EXHAUSTED);
}

static void test_assignment_parse_mutations(void** state) {
  (void)state;
  // Assignments arrive from the network: every mutation of a valid text
  // (byte flips, truncations, insertions) parses or fails with a status,
  // never crashes (ASan build), and whatever parses formats again.
  pcp_data_assignment_t a;
  memset(&a, 0, sizeof(a));
  snprintf(a.path, sizeof(a.path), "data/tiny_shakespeare.txt");
  a.range = (pcp_data_range_t){1024, 4096};
  a.shard_count = 2;
  a.shard_index = 1;
  a.seed = 99;
  a.has_cursor = true;
  a.cursor = (pcp_data_cursor_t){{1, 2, 3, 4}, 5, 6};
  char original[PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1];
  PCP_CHECK_OK(pcp_data_assignment_format(&a, original, sizeof(original)));
  size_t length = strlen(original);
  static const char kAlphabet[] = "{}[]\":,0123456789-+.eE \\u\xff\x80tfn";
  pcp_rng_t rng;
  pcp_rng_initialize(2026, &rng);
  char text[PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1];
  int parsed = 0;
  for (int round = 0; round < 20000; ++round) {
    memcpy(text, original, length + 1);
    size_t n = length;
    int edits = 1 + (int)pcp_rng_next_below(&rng, 4);
    for (int e = 0; e < edits && n > 0; ++e) {
      size_t at = (size_t)pcp_rng_next_below(&rng, n);
      char c = kAlphabet[pcp_rng_next_below(&rng, sizeof(kAlphabet) - 1)];
      switch (pcp_rng_next_below(&rng, 3)) {
        case 0:
          text[at] = c;
          break;
        case 1:
          n = at;
          break;
        default:
          if (n + 1 < sizeof(text)) {
            memmove(text + at + 1, text + at, n - at);
            text[at] = c;
            ++n;
          }
          break;
      }
    }
    pcp_data_assignment_t b;
    pcp_status_t status =
        pcp_data_assignment_parse(pcp_make_string_view(text, n), &b);
    if (status) {
      pcp_status_ignore(status);
      continue;
    }
    ++parsed;
    char again[PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH + 1];
    pcp_status_ignore(pcp_data_assignment_format(&b, again, sizeof(again)));
    pcp_data_cursor_t cursor;
    pcp_status_ignore(
        pcp_data_cursor_parse(pcp_make_string_view(text, n), &cursor));
  }
  print_message("  %d of 20000 mutations still parsed\n", parsed);
}

//===----------------------------------------------------------------------===//
// Effective batch size
//===----------------------------------------------------------------------===//

static void test_effective_batch_size(void** state) {
  (void)state;
  uint64_t effective = 0;
  PCP_CHECK_OK(pcp_data_effective_batch_size_compute(8, 2, 4, &effective));
  assert_int_equal(effective, 64);
  uint32_t steps = 0;
  PCP_CHECK_OK(pcp_data_accumulation_steps_resolve(64, 8, 2, &steps));
  assert_int_equal(steps, 4);
  PCP_CHECK_OK(pcp_data_accumulation_steps_resolve(16, 8, 2, &steps));
  assert_int_equal(steps, 1);
  pcp_status_t status = pcp_data_accumulation_steps_resolve(60, 8, 2, &steps);
  char message[512];
  pcp_status_format(status, message, sizeof(message));
  print_message("  expected error: %s\n", message);
  assert_non_null(strstr(message, "48 or 64"));
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(pcp_status_consume_code(
                       pcp_data_accumulation_steps_resolve(8, 8, 2, &steps)),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(
      pcp_status_consume_code(
          pcp_data_effective_batch_size_compute(0, 2, 4, &effective)),
      PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(
      pcp_status_consume_code(pcp_data_effective_batch_size_compute(
          UINT32_MAX, UINT32_MAX, UINT32_MAX, &effective)),
      PCP_STATUS_OUT_OF_RANGE);
  assert_int_equal(pcp_status_consume_code(pcp_data_accumulation_steps_resolve(
                       UINT64_MAX - (UINT64_MAX % 1), 1, 1, &steps)),
                   PCP_STATUS_OUT_OF_RANGE);
}

//===----------------------------------------------------------------------===//
// Allocation failures
//===----------------------------------------------------------------------===//

static void test_allocation_failures(void** state) {
  (void)state;
  // Every allocation of open, sampler create and shard plan fails in turn;
  // each failure is a clean status and nothing leaks (checked under ASan and
  // by the counting allocator).
  char text[8192];
  size_t length = make_utf8_text(text, sizeof(text), 1500);
  char path[512];
  write_temp("utf8.txt", text, length, path, sizeof(path));
  const char* ids[] = {"b", "a", "c"};
  for (int64_t fail_at = 0;; ++fail_at) {
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), fail_at,
                                     false, &failing);
    pcp_allocator_t allocator = pcp_allocator_failing(&failing);
    pcp_data_dataset_options_t options;
    pcp_data_dataset_options_initialize(PCP_DATA_FORMAT_CHAR, &options);
    pcp_data_dataset_t* dataset = NULL;
    pcp_data_sampler_t* sampler = NULL;
    pcp_status_t status =
        pcp_data_dataset_open(path, &options, allocator, &dataset);
    if (!status) {
      pcp_data_sampler_options_t sampler_options = {PCP_DATA_SAMPLING_RANDOM, 2,
                                                    8, 1};
      status =
          pcp_data_sampler_create(dataset, pcp_data_dataset_full_range(dataset),
                                  &sampler_options, allocator, &sampler);
    }
    if (!status) {
      pcp_data_assignment_t plan[3];
      status = pcp_data_shard_plan(
          dataset, pcp_data_dataset_full_range(dataset), 8, ids, 3, 0, 1, plan);
    }
    bool failed_any = failing.failure_count > 0;
    if (status) {
      assert_true(failed_any);
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
    }
    pcp_data_sampler_release(sampler);
    pcp_data_dataset_release(dataset);
    assert_int_equal(counter.live_bytes, 0);
    if (!failed_any)
      break;
    assert_true(fail_at < 1000);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shakespeare_char_vocab),
      cmocka_unit_test(test_utf8_char_dataset),
      cmocka_unit_test(test_byte_and_u16_datasets),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_sampling_determinism),
      cmocka_unit_test(test_cursor_resume),
      cmocka_unit_test(test_shards_cover_without_overlap),
      cmocka_unit_test(test_reshard_on_join),
      cmocka_unit_test(test_assignment_json_round_trip),
      cmocka_unit_test(test_assignment_parse_mutations),
      cmocka_unit_test(test_effective_batch_size),
      cmocka_unit_test(test_allocation_failures),
  };
  return cmocka_run_group_tests(tests, setup_temp_dir, remove_temp_dir);
}
