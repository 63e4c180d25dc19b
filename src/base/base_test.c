// SPDX-License-Identifier: Apache-2.0

// realpath(3) is XSI: glibc declares it only with _XOPEN_SOURCE.
#define _XOPEN_SOURCE 700
#include "base/base.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static void status_ok_is_null(void** state) {
  (void)state;
  pcp_status_t ok = pcp_ok_status();
  assert_null(ok);
  assert_int_equal(pcp_status_code(ok), PCP_STATUS_OK);
}

static pcp_status_t fails_inner(void) {
  return pcp_make_status(PCP_STATUS_NOT_FOUND, "job %s", "j-1");
}

static pcp_status_t fails_outer(void) {
  PCP_RETURN_IF_ERROR(fails_inner(), "looking up job %d", 7);
  return pcp_ok_status();
}

static void status_carries_code_message_annotations(void** state) {
  (void)state;
  pcp_status_t s = fails_outer();
  assert_int_equal(pcp_status_code(s), PCP_STATUS_NOT_FOUND);
  assert_string_equal(pcp_status_message(s), "job j-1");
  char text[256];
  pcp_status_format(s, text, sizeof(text));
  assert_non_null(strstr(text, "NOT_FOUND: job j-1; looking up job 7"));
  assert_non_null(strstr(text, "base_test.c:"));
  // Truncated formatting still terminates and reports the full length.
  char small[8];
  size_t need = pcp_status_format(s, small, sizeof(small));
  assert_int_equal(need, strlen(text));
  assert_int_equal(strlen(small), 7);
  pcp_status_t copy = pcp_status_clone(s);
  char copy_text[256];
  pcp_status_format(copy, copy_text, sizeof(copy_text));
  assert_string_equal(text, copy_text);
  assert_int_equal(pcp_status_consume_code(copy), PCP_STATUS_NOT_FOUND);
  pcp_status_ignore(s);
}

static void status_join_keeps_first(void** state) {
  (void)state;
  pcp_status_t a = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "first");
  pcp_status_t b = pcp_make_status(PCP_STATUS_INTERNAL, "second");
  pcp_status_t joined = pcp_status_join(a, b);
  assert_int_equal(pcp_status_code(joined), PCP_STATUS_INVALID_ARGUMENT);
  char* text = pcp_status_to_string(joined);
  assert_non_null(strstr(text, "also: INTERNAL: second"));
  free(text);
  pcp_status_ignore(joined);
  assert_null(pcp_status_join(NULL, NULL));
}

static void status_code_names_round_trip(void** state) {
  (void)state;
  for (int i = 0; i < PCP_STATUS_CODE_COUNT_; ++i) {
    pcp_status_code_t code;
    assert_true(pcp_status_code_from_string(
        pcp_status_code_string((pcp_status_code_t)i), &code));
    assert_int_equal(code, i);
  }
  pcp_status_code_t code;
  assert_false(pcp_status_code_from_string("NOPE", &code));
}

static void status_from_errno_maps_codes(void** state) {
  (void)state;
  pcp_status_t s = pcp_status_from_errno(2 /*ENOENT*/, "opening %s", "x");
  assert_int_equal(pcp_status_code(s), PCP_STATUS_NOT_FOUND);
  assert_non_null(strstr(pcp_status_message(s), "opening x: "));
  pcp_status_ignore(s);
}

static void counting_allocator_tracks_live_and_peak(void** state) {
  (void)state;
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_t a = pcp_allocator_counting(&counter);
  void* p = NULL;
  assert_null(pcp_allocator_malloc(a, 100, &p));
  assert_null(pcp_allocator_realloc(a, 300, &p));
  assert_int_equal(counter.live_bytes, 300);
  pcp_allocator_free(a, p);
  assert_int_equal(counter.live_bytes, 0);
  assert_int_equal(counter.peak_bytes, 300);
}

static void failing_allocator_fails_nth(void** state) {
  (void)state;
  pcp_allocator_failing_t failing;
  pcp_allocator_failing_initialize(pcp_allocator_system(), 1, false, &failing);
  pcp_allocator_t a = pcp_allocator_failing(&failing);
  void* p0 = NULL;
  void* p1 = NULL;
  void* p2 = NULL;
  assert_null(pcp_allocator_malloc(a, 8, &p0));
  pcp_status_t s = pcp_allocator_malloc(a, 8, &p1);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_null(p1);
  assert_null(pcp_allocator_malloc(a, 8, &p2));
  pcp_allocator_free(a, p0);
  pcp_allocator_free(a, p2);
  assert_int_equal(failing.failure_count, 1);
}

static int g_cleanups;
static void count_cleanup(void* user_data) {
  (void)user_data;
  g_cleanups++;
}

static void arena_reuses_blocks_and_runs_cleanups(void** state) {
  (void)state;
  pcp_arena_block_pool_t* pool = NULL;
  assert_null(pcp_arena_block_pool_create(1024, pcp_allocator_system(), &pool));
  pcp_arena_t arena;
  pcp_arena_initialize(pool, &arena);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 100; ++i) {
      void* p = NULL;
      assert_null(pcp_arena_allocate(&arena, 24, &p));
      assert_int_equal((uintptr_t)p % 16, 0);
      memset(p, 0xAB, 24);
    }
    void* big = NULL;
    assert_null(pcp_arena_allocate(&arena, 100000, &big));
    memset(big, 1, 100000);
    assert_null(pcp_arena_cleanup_add(&arena, count_cleanup, NULL));
    pcp_arena_reset(&arena);
  }
  assert_int_equal(g_cleanups, 3);
  // 100 * 32 bytes in 1 KiB blocks: 4 blocks, recycled each round.
  assert_int_equal(pcp_arena_block_pool_free_count(pool), 4);
  pcp_arena_deinitialize(&arena);
  pcp_arena_block_pool_release(pool);
}

static void strings_parse_strictly(void** state) {
  (void)state;
  int64_t i;
  uint64_t u;
  double d;
  assert_true(pcp_string_view_parse_int64(pcp_make_cstring_view("-42"), &i));
  assert_int_equal(i, -42);
  assert_false(pcp_string_view_parse_int64(pcp_make_cstring_view("42x"), &i));
  assert_false(pcp_string_view_parse_int64(pcp_make_cstring_view(""), &i));
  assert_false(pcp_string_view_parse_int64(
      pcp_make_cstring_view("99999999999999999999"), &i));
  assert_false(pcp_string_view_parse_uint64(pcp_make_cstring_view("-1"), &u));
  assert_true(pcp_string_view_parse_double(pcp_make_cstring_view("1e-3"), &d));
  assert_true(d == 1e-3);
  pcp_string_view_t head, tail;
  assert_true(pcp_string_view_split(pcp_make_cstring_view("host:80"), ':',
                                    &head, &tail));
  assert_true(pcp_string_view_equal(head, pcp_make_cstring_view("host")));
  assert_true(pcp_string_view_equal(tail, pcp_make_cstring_view("80")));
}

static void string_builder_respects_cap(void** state) {
  (void)state;
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 10, &b);
  assert_null(pcp_string_builder_append_f(&b, "%d-%s", 12, "ab"));
  assert_string_equal(pcp_string_builder_cstring(&b), "12-ab");
  pcp_status_t s = pcp_string_builder_append_cstring(&b, "123456");
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_string_equal(pcp_string_builder_cstring(&b), "12-ab");
  pcp_string_builder_deinitialize(&b);
  // Taking from an untouched builder yields "" (regression: it returned an
  // unterminated buffer).
  pcp_string_builder_t empty;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &empty);
  char* taken = NULL;
  assert_null(pcp_string_builder_take(&empty, &taken));
  assert_string_equal(taken, "");
  free(taken);
}

static void rng_is_reproducible_and_uniform(void** state) {
  (void)state;
  pcp_rng_t a, b;
  pcp_rng_initialize(1234, &a);
  pcp_rng_initialize(1234, &b);
  for (int i = 0; i < 100; ++i) {
    assert_int_equal(pcp_rng_next_u64(&a), pcp_rng_next_u64(&b));
  }
  int counts[10] = {0};
  for (int i = 0; i < 100000; ++i) counts[pcp_rng_next_below(&a, 10)]++;
  for (int i = 0; i < 10; ++i) {
    assert_in_range(counts[i], 9500, 10500);
  }
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += pcp_rng_next_normal(&a);
  assert_true(sum / 100000 > -0.02 && sum / 100000 < 0.02);
}

static void sha256_matches_known_vector(void** state) {
  (void)state;
  pcp_sha256_t d;
  char hex[65];
  pcp_sha256_compute("abc", 3, &d);
  pcp_sha256_to_hex(&d, hex);
  assert_string_equal(
      hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  pcp_sha256_stream_t* stream = NULL;
  assert_null(pcp_sha256_stream_create(&stream));
  pcp_sha256_stream_update(stream, "a", 1);
  pcp_sha256_stream_update(stream, "bc", 2);
  pcp_sha256_t d2;
  pcp_sha256_stream_finish(stream, &d2);
  assert_memory_equal(d.bytes, d2.bytes, 32);
}

static void manual_clock_moves_only_when_told(void** state) {
  (void)state;
  pcp_clock_manual_t m = {.now_ns = 5, .wall_ns = 100};
  pcp_clock_t c = pcp_clock_manual(&m);
  assert_int_equal(pcp_clock_now_ns(c), 5);
  pcp_clock_manual_advance(&m, 10);
  assert_int_equal(pcp_clock_now_ns(c), 15);
  assert_int_equal(pcp_clock_wall_ns(c), 110);
  pcp_clock_t s = pcp_clock_system();
  int64_t t0 = pcp_clock_now_ns(s);
  assert_true(pcp_clock_now_ns(s) >= t0);
}

// The deadline is |ms| ahead of the real-time clock, with the nanoseconds
// carried into the seconds.
static void realtime_deadline_is_normalised(void** state) {
  (void)state;
  const int64_t cases[] = {0, 20, 999, 1500, 61001};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec d = pcp_realtime_deadline_ms(cases[i]);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    int64_t ahead_ns =
        ((int64_t)d.tv_sec - (int64_t)now.tv_sec) * 1000000000LL +
        ((int64_t)d.tv_nsec - (int64_t)now.tv_nsec);
    assert_true(ahead_ns >= cases[i] * 1000000LL);
    assert_true(ahead_ns < cases[i] * 1000000LL + 100000000LL);
  }
}

static void log_lines_are_key_value(void** state) {
  (void)state;
  char* buffer = NULL;
  size_t size = 0;
  FILE* sink = open_memstream(&buffer, &size);
  pcp_log_set_sink(sink);
  pcp_log_set_level(PCP_LOG_INFO);
  pcp_log_context_t ctx = {.role = "worker", .node_id = "n1"};
  PCP_LOG(PCP_LOG_DEBUG, &ctx, "hidden");
  PCP_LOG(PCP_LOG_INFO, &ctx, "joined %s", "gateway \"a\"");
  pcp_log_set_sink(NULL);
  fclose(sink);
  assert_non_null(strstr(buffer,
                         " level=info role=worker node=n1 "
                         "msg=\"joined gateway \\\"a\\\"\"\n"));
  assert_null(strstr(buffer, "hidden"));
  assert_non_null(strstr(buffer, "ts="));
  free(buffer);
}

static void file_write_atomic_and_bounded_read(void** state) {
  (void)state;
  char path[] = "/tmp/pcp_base_test_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_null(pcp_file_write_atomic(path, "hello", 5));
  void* data = NULL;
  size_t n = 0;
  assert_null(pcp_file_read_all(path, 100, &data, &n));
  assert_int_equal(n, 5);
  assert_string_equal(data, "hello");
  assert_int_equal((uintptr_t)data % 64, 0);
  free(data);
  pcp_status_t s = pcp_file_read_all(path, 4, &data, &n);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_RESOURCE_EXHAUSTED);
  // Appends land after what is there; no file, no append.
  assert_null(pcp_file_append(path, " world", 6));
  assert_null(pcp_file_append(path, "", 0));
  assert_null(pcp_file_read_all(path, 100, &data, &n));
  assert_int_equal(n, 11);
  assert_string_equal(data, "hello world");
  free(data);
  unlink(path);
  s = pcp_file_read_all(path, 100, &data, &n);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_NOT_FOUND);
  s = pcp_file_append(path, "x", 1);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_NOT_FOUND);
  assert_false(pcp_file_exists(path));
}

// A file's hash over more than one 1 MiB piece equals the one-shot hash of
// its bytes; a missing file is NOT_FOUND.
static void file_sha256_matches_compute(void** state) {
  (void)state;
  size_t n = (1u << 20) * 2 + 12345;
  uint8_t* bytes = malloc(n);
  assert_non_null(bytes);
  for (size_t i = 0; i < n; ++i) bytes[i] = (uint8_t)(i * 131u + (i >> 11));
  char path[] = "/tmp/pcp_base_test_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_null(pcp_file_write_atomic(path, bytes, n));
  pcp_sha256_t want, got;
  pcp_sha256_compute(bytes, n, &want);
  uint64_t length = 0;
  assert_null(pcp_file_sha256(path, &got, &length));
  assert_int_equal(length, n);
  assert_memory_equal(want.bytes, got.bytes, PCP_SHA256_BYTE_LENGTH);
  unlink(path);
  pcp_status_t s = pcp_file_sha256(path, &got, &length);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_NOT_FOUND);
  free(bytes);
}

// pcp_dynlib_load: a library that loads fills the table; a missing library
// and a missing symbol are clear errors naming the package, not a crash.
typedef struct math_api_t {
  double (*cos)(double);
} math_api_t;

static void dynlib_load_fills_table_or_names_package(void** state) {
  (void)state;
  const pcp_dynlib_symbol_t symbols[] = {{"cos", offsetof(math_api_t, cos)}};
  math_api_t api = {0};
  const char* const good[] = {"libpcp-no-such-library.so.9", "libm.so.6", NULL};
  assert_null(pcp_dynlib_load(good, "the test", "libc6", symbols, 1, &api));
  assert_non_null(api.cos);
  assert_true(api.cos(0.0) == 1.0);

  const char* const missing[] = {"libpcp-no-such-library.so.9", NULL};
  pcp_status_t status =
      pcp_dynlib_load(missing, "the test", "pcp-nothing", symbols, 1, &api);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_NOT_FOUND);
  const char* message = pcp_status_message(status);
  assert_non_null(strstr(message, "libpcp-no-such-library.so.9"));
  assert_non_null(strstr(message, "pcp-nothing"));
  assert_non_null(strstr(message, "the test"));
  pcp_status_ignore(status);

  const pcp_dynlib_symbol_t absent[] = {
      {"pcp_no_such_symbol", offsetof(math_api_t, cos)}};
  status = pcp_dynlib_load(good, "the test", "libc6", absent, 1, &api);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INCOMPATIBLE);
  assert_non_null(strstr(pcp_status_message(status), "pcp_no_such_symbol"));
  pcp_status_ignore(status);
}

// pcp_file_path_confine: inside a root (existing or not) resolves; outside,
// through a symlink, by `..` or by a missing-directory `..` is refused with
// a message that names no path; a sibling with the root as a string prefix
// is outside.
static void expect_refused(const char* path, const char* const* roots,
                           size_t count) {
  char out[PATH_MAX];
  pcp_status_t s = pcp_file_path_confine(path, roots, count, out, sizeof(out));
  assert_non_null(s);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_PERMISSION_DENIED);
  assert_null(strstr(pcp_status_message(s), "/"));
  assert_null(strstr(pcp_status_message(s), "exist"));
  pcp_status_ignore(s);
}

// snprintf that must fit (the return value checked also keeps gcc's
// -Wformat-truncation quiet).
#define JOIN(buffer, ...)                                     \
  assert_true(snprintf(buffer, sizeof(buffer), __VA_ARGS__) < \
              (int)sizeof(buffer))

static void file_path_confine_stays_under_roots(void** state) {
  (void)state;
  char top[] = "/tmp/pcp_confine_XXXXXX";
  assert_non_null(mkdtemp(top));
  char real_top[PATH_MAX];
  assert_non_null(realpath(top, real_top));
  char root[PATH_MAX], other[PATH_MAX], file[PATH_MAX], link[PATH_MAX],
      inner_link[PATH_MAX], dangling[PATH_MAX], sibling[PATH_MAX],
      path[PATH_MAX], out[PATH_MAX], expect[PATH_MAX];
  JOIN(root, "%s/root", top);
  JOIN(other, "%s/other", top);
  JOIN(sibling, "%s/rootx", top);
  assert_int_equal(mkdir(root, 0755), 0);
  assert_int_equal(mkdir(other, 0755), 0);
  assert_int_equal(mkdir(sibling, 0755), 0);
  JOIN(file, "%s/data.txt", root);
  assert_null(pcp_file_write_atomic(file, "x", 1));
  JOIN(path, "%s/secret.txt", other);
  assert_null(pcp_file_write_atomic(path, "s", 1));
  JOIN(link, "%s/escape.txt", root);
  assert_int_equal(symlink(path, link), 0);
  JOIN(inner_link, "%s/alias.txt", root);
  assert_int_equal(symlink(file, inner_link), 0);
  JOIN(dangling, "%s/dangling", root);
  JOIN(path, "%s/not-yet", other);
  assert_int_equal(symlink(path, dangling), 0);
  const char* roots[] = {"/nonexistent-pcp-root", root};

  // An existing file, a link that stays inside, a missing file, a missing
  // directory chain: all resolve under the root.
  JOIN(expect, "%s/root/data.txt", real_top);
  assert_null(pcp_file_path_confine(file, roots, 2, out, sizeof(out)));
  assert_string_equal(out, expect);
  assert_null(pcp_file_path_confine(inner_link, roots, 2, out, sizeof(out)));
  assert_string_equal(out, expect);
  JOIN(path, "%s/./sub/../data.txt", root);
  expect_refused(path, roots, 2);  // "sub" is missing: its ".." is refused
  JOIN(path, "%s/a/b/c.ckpt", root);
  JOIN(expect, "%s/root/a/b/c.ckpt", real_top);
  assert_null(pcp_file_path_confine(path, roots, 2, out, sizeof(out)));
  assert_string_equal(out, expect);
  assert_null(pcp_file_path_confine(root, roots, 2, out, sizeof(out)));

  // Outside: absolute, `..` through an existing directory, a link out, a
  // dangling link, a string-prefix sibling, a missing file outside.
  expect_refused("/etc/passwd", roots, 2);
  JOIN(path, "%s/../other/secret.txt", root);
  expect_refused(path, roots, 2);
  JOIN(path, "%s/../../../../etc/passwd", root);
  expect_refused(path, roots, 2);
  expect_refused(link, roots, 2);
  expect_refused(dangling, roots, 2);
  JOIN(path, "%s/x", dangling);
  expect_refused(path, roots, 2);
  JOIN(path, "%s/f.txt", sibling);
  expect_refused(path, roots, 2);
  expect_refused("/no/such/dir/file", roots, 2);
  expect_refused(file, NULL, 0);
  // "/" as a root admits every path that resolves.
  const char* everything[] = {"/"};
  assert_null(
      pcp_file_path_confine("/etc/passwd", everything, 1, out, sizeof(out)));
  assert_string_equal(out, "/etc/passwd");

  // A relative path is taken from the working directory.
  char cwd[PATH_MAX];
  assert_non_null(getcwd(cwd, sizeof(cwd)));
  assert_int_equal(chdir(root), 0);
  const char* dot[] = {"."};
  assert_null(pcp_file_path_confine("data.txt", dot, 1, out, sizeof(out)));
  JOIN(expect, "%s/root/data.txt", real_top);
  assert_string_equal(out, expect);
  expect_refused("../other/secret.txt", dot, 1);
  assert_int_equal(chdir(cwd), 0);

  // Empty path: INVALID_ARGUMENT; a result that does not fit: refused.
  pcp_status_t s = pcp_file_path_confine("", roots, 2, out, sizeof(out));
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_INVALID_ARGUMENT);
  s = pcp_file_path_confine(file, roots, 2, out, 4);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_RESOURCE_EXHAUSTED);

  char command[PATH_MAX + 16];
  JOIN(command, "rm -rf '%s'", top);
  assert_int_equal(system(command), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_ok_is_null),
      cmocka_unit_test(status_carries_code_message_annotations),
      cmocka_unit_test(status_join_keeps_first),
      cmocka_unit_test(status_code_names_round_trip),
      cmocka_unit_test(status_from_errno_maps_codes),
      cmocka_unit_test(counting_allocator_tracks_live_and_peak),
      cmocka_unit_test(failing_allocator_fails_nth),
      cmocka_unit_test(arena_reuses_blocks_and_runs_cleanups),
      cmocka_unit_test(strings_parse_strictly),
      cmocka_unit_test(string_builder_respects_cap),
      cmocka_unit_test(rng_is_reproducible_and_uniform),
      cmocka_unit_test(sha256_matches_known_vector),
      cmocka_unit_test(file_sha256_matches_compute),
      cmocka_unit_test(manual_clock_moves_only_when_told),
      cmocka_unit_test(realtime_deadline_is_normalised),
      cmocka_unit_test(log_lines_are_key_value),
      cmocka_unit_test(file_write_atomic_and_bounded_read),
      cmocka_unit_test(dynlib_load_fills_table_or_names_package),
      cmocka_unit_test(file_path_confine_stays_under_roots),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
