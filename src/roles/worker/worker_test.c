// SPDX-License-Identifier: Apache-2.0
// Unit tests of the worker's pieces: the program cache (hit, miss, corrupt
// file, bad store), the session store (replace, LRU eviction under a limit,
// drop) and the job queue (bounds, order, close).

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "roles/worker/worker_impl.h"

static void expect_ok(pcp_status_t status) {
  if (status) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    fail_msg("unexpected status: %s", text);
  }
}

static void expect_code(pcp_status_t status, pcp_status_code_t code) {
  assert_int_equal(pcp_status_consume_code(status), code);
}

static void make_temp_dir(char* buffer, size_t capacity) {
  snprintf(buffer, capacity, "/tmp/pcp-worker-test-XXXXXX");
  assert_non_null(mkdtemp(buffer));
}

static void remove_tree(const char* dir) {
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  assert_int_equal(system(command), 0);
}

//===----------------------------------------------------------------------===//
// Program cache
//===----------------------------------------------------------------------===//

static void program_cache_miss_store_hit(void** state) {
  (void)state;
  char dir[64];
  make_temp_dir(dir, sizeof(dir));
  char sub[128];
  snprintf(sub, sizeof(sub), "%s/a/b", dir);
  pcp_roles_worker_program_cache_t cache;
  expect_ok(pcp_roles_worker_program_cache_initialize(
      sub, pcp_allocator_system(), &cache));

  static const char kProgram[] = "not really a vmfb, but bytes all the same";
  pcp_sha256_t hash;
  pcp_sha256_compute(kProgram, sizeof(kProgram), &hash);
  bool found = true;
  expect_ok(pcp_roles_worker_program_cache_lookup(&cache, hash.bytes, &found));
  assert_false(found);
  void* data = NULL;
  size_t length = 0;
  expect_code(
      pcp_roles_worker_program_cache_load(&cache, hash.bytes, &data, &length),
      PCP_STATUS_NOT_FOUND);

  expect_ok(pcp_roles_worker_program_cache_store(&cache, hash.bytes, kProgram,
                                                 sizeof(kProgram)));
  expect_ok(pcp_roles_worker_program_cache_lookup(&cache, hash.bytes, &found));
  assert_true(found);
  expect_ok(
      pcp_roles_worker_program_cache_load(&cache, hash.bytes, &data, &length));
  assert_int_equal(length, sizeof(kProgram));
  assert_memory_equal(data, kProgram, length);
  assert_int_equal((uintptr_t)data % 64, 0);
  free(data);

  // The file is named by the hash.
  char path[512];
  expect_ok(pcp_roles_worker_program_cache_path(&cache, hash.bytes, path,
                                                sizeof(path)));
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&hash, hex);
  assert_non_null(strstr(path, hex));
  assert_true(pcp_file_exists(path));

  // A second cache over the same directory (a restarted worker) hits.
  pcp_roles_worker_program_cache_t again;
  expect_ok(pcp_roles_worker_program_cache_initialize(
      sub, pcp_allocator_system(), &again));
  expect_ok(pcp_roles_worker_program_cache_lookup(&again, hash.bytes, &found));
  assert_true(found);
  pcp_roles_worker_program_cache_deinitialize(&again);

  pcp_roles_worker_program_cache_deinitialize(&cache);
  remove_tree(dir);
}

static void program_cache_corrupt_file_is_a_miss(void** state) {
  (void)state;
  char dir[64];
  make_temp_dir(dir, sizeof(dir));
  pcp_roles_worker_program_cache_t cache;
  expect_ok(pcp_roles_worker_program_cache_initialize(
      dir, pcp_allocator_system(), &cache));
  static const char kProgram[] = "program bytes";
  pcp_sha256_t hash;
  pcp_sha256_compute(kProgram, sizeof(kProgram), &hash);
  expect_ok(pcp_roles_worker_program_cache_store(&cache, hash.bytes, kProgram,
                                                 sizeof(kProgram)));
  char path[512];
  expect_ok(pcp_roles_worker_program_cache_path(&cache, hash.bytes, path,
                                                sizeof(path)));
  // Flip one byte on disk, as a bad sector or a torn write would.
  FILE* f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, 3, SEEK_SET), 0);
  assert_int_equal(fputc('X', f), 'X');
  fclose(f);

  void* data = NULL;
  size_t length = 0;
  expect_code(
      pcp_roles_worker_program_cache_load(&cache, hash.bytes, &data, &length),
      PCP_STATUS_DATA_LOSS);
  assert_null(data);
  // The corrupt copy is gone, so the next offer fetches it again.
  assert_false(pcp_file_exists(path));
  bool found = true;
  expect_ok(pcp_roles_worker_program_cache_lookup(&cache, hash.bytes, &found));
  assert_false(found);

  // Corrupt again, this time seen through lookup: a miss, not an error.
  expect_ok(pcp_roles_worker_program_cache_store(&cache, hash.bytes, kProgram,
                                                 sizeof(kProgram)));
  f = fopen(path, "wb");
  assert_non_null(f);
  fputs("truncated", f);
  fclose(f);
  expect_ok(pcp_roles_worker_program_cache_lookup(&cache, hash.bytes, &found));
  assert_false(found);
  assert_false(pcp_file_exists(path));

  pcp_roles_worker_program_cache_deinitialize(&cache);
  remove_tree(dir);
}

static void program_cache_refuses_bytes_that_do_not_match(void** state) {
  (void)state;
  char dir[64];
  make_temp_dir(dir, sizeof(dir));
  pcp_roles_worker_program_cache_t cache;
  expect_ok(pcp_roles_worker_program_cache_initialize(
      dir, pcp_allocator_system(), &cache));
  pcp_sha256_t hash;
  pcp_sha256_compute("the real program", 16, &hash);
  expect_code(pcp_roles_worker_program_cache_store(&cache, hash.bytes,
                                                   "an impostor", 11),
              PCP_STATUS_DATA_LOSS);
  char path[512];
  expect_ok(pcp_roles_worker_program_cache_path(&cache, hash.bytes, path,
                                                sizeof(path)));
  assert_false(pcp_file_exists(path));
  pcp_roles_worker_program_cache_deinitialize(&cache);
  remove_tree(dir);
}

//===----------------------------------------------------------------------===//
// Session store
//===----------------------------------------------------------------------===//

// Values are counters: the store must release each exactly once.
typedef struct fake_value_t {
  int releases;
} fake_value_t;

static void release_fake(void* value) {
  ((fake_value_t*)value)->releases++;
}

static void session_store_put_get_replace_drop(void** state) {
  (void)state;
  pcp_roles_worker_session_store_t store;
  pcp_roles_worker_session_store_initialize(0, release_fake,
                                            pcp_allocator_system(), &store);
  fake_value_t a = {0}, b = {0}, c = {0};
  expect_ok(pcp_roles_worker_session_store_put(&store, "s1", "w", &a, 100));
  expect_ok(pcp_roles_worker_session_store_put(&store, "s1", "m", &b, 50));
  assert_ptr_equal(pcp_roles_worker_session_store_get(&store, "s1", "w"), &a);
  assert_null(pcp_roles_worker_session_store_get(&store, "s1", "nope"));
  assert_null(pcp_roles_worker_session_store_get(&store, "s2", "w"));
  assert_int_equal(store.byte_length, 150);

  // Replacing a name releases the old value and re-counts bytes.
  expect_ok(pcp_roles_worker_session_store_put(&store, "s1", "w", &c, 10));
  assert_int_equal(a.releases, 1);
  assert_ptr_equal(pcp_roles_worker_session_store_get(&store, "s1", "w"), &c);
  assert_int_equal(store.byte_length, 60);

  expect_code(pcp_roles_worker_session_store_put(&store, "", "x", &a, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  expect_code(pcp_roles_worker_session_store_put(&store, "s1", "", &a, 1),
              PCP_STATUS_INVALID_ARGUMENT);

  assert_true(pcp_roles_worker_session_store_drop(&store, "s1"));
  assert_false(pcp_roles_worker_session_store_drop(&store, "s1"));
  assert_int_equal(b.releases, 1);
  assert_int_equal(c.releases, 1);
  assert_int_equal(store.byte_length, 0);
  assert_int_equal(store.session_count, 0);
  pcp_roles_worker_session_store_deinitialize(&store);
}

static void session_store_evicts_least_recently_used(void** state) {
  (void)state;
  pcp_roles_worker_session_store_t store;
  pcp_roles_worker_session_store_initialize(250, release_fake,
                                            pcp_allocator_system(), &store);
  fake_value_t v[4] = {{0}};
  expect_ok(pcp_roles_worker_session_store_put(&store, "old", "x", &v[0], 100));
  expect_ok(pcp_roles_worker_session_store_put(&store, "mid", "x", &v[1], 100));
  size_t evicted = 99;
  expect_ok(
      pcp_roles_worker_session_store_enforce_limit(&store, "mid", &evicted));
  assert_int_equal(evicted, 0);
  // Touch "old": "mid" becomes the least recently used.
  assert_non_null(pcp_roles_worker_session_store_get(&store, "old", "x"));
  expect_ok(pcp_roles_worker_session_store_put(&store, "new", "x", &v[2], 100));
  expect_ok(
      pcp_roles_worker_session_store_enforce_limit(&store, "new", &evicted));
  assert_int_equal(evicted, 1);
  assert_int_equal(v[1].releases, 1);
  assert_int_equal(v[0].releases, 0);
  assert_null(pcp_roles_worker_session_store_get(&store, "mid", "x"));
  assert_int_equal(store.byte_length, 200);

  // A session that alone is over the limit cannot be kept: the others go
  // first, then the caller hears RESOURCE_EXHAUSTED.
  expect_ok(
      pcp_roles_worker_session_store_put(&store, "huge", "x", &v[3], 300));
  expect_code(
      pcp_roles_worker_session_store_enforce_limit(&store, "huge", &evicted),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(v[0].releases, 1);
  assert_int_equal(v[2].releases, 1);
  assert_int_equal(v[3].releases, 0);
  assert_int_equal(store.session_count, 1);

  pcp_roles_worker_session_store_drop_all(&store);
  assert_int_equal(v[3].releases, 1);
  assert_int_equal(store.byte_length, 0);
  pcp_roles_worker_session_store_deinitialize(&store);
}

static void session_store_unlimited_never_evicts(void** state) {
  (void)state;
  pcp_roles_worker_session_store_t store;
  pcp_roles_worker_session_store_initialize(0, release_fake,
                                            pcp_allocator_system(), &store);
  fake_value_t v[8] = {{0}};
  char id[16];
  for (int i = 0; i < 8; ++i) {
    snprintf(id, sizeof(id), "s%d", i);
    expect_ok(pcp_roles_worker_session_store_put(&store, id, "t", &v[i],
                                                 (size_t)1 << 40));
  }
  size_t evicted = 9;
  expect_ok(
      pcp_roles_worker_session_store_enforce_limit(&store, NULL, &evicted));
  assert_int_equal(evicted, 0);
  pcp_roles_worker_session_store_deinitialize(&store);
  for (int i = 0; i < 8; ++i) {
    assert_int_equal(v[i].releases, 1);
  }
}

//===----------------------------------------------------------------------===//
// Job queue
//===----------------------------------------------------------------------===//

static void job_queue_bounds_and_order(void** state) {
  (void)state;
  pcp_roles_worker_job_queue_t queue;
  expect_code(
      pcp_roles_worker_job_queue_initialize(0, pcp_allocator_system(), &queue),
      PCP_STATUS_INVALID_ARGUMENT);
  expect_ok(
      pcp_roles_worker_job_queue_initialize(3, pcp_allocator_system(), &queue));
  int items[5];
  for (int round = 0; round < 3; ++round) {  // wraps around the ring
    for (int i = 0; i < 3; ++i) {
      expect_ok(pcp_roles_worker_job_queue_push(&queue, &items[i]));
    }
    expect_code(pcp_roles_worker_job_queue_push(&queue, &items[3]),
                PCP_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(pcp_roles_worker_job_queue_count(&queue), 3);
    assert_ptr_equal(pcp_roles_worker_job_queue_pop(&queue), &items[0]);
    expect_ok(pcp_roles_worker_job_queue_push(&queue, &items[4]));
    assert_ptr_equal(pcp_roles_worker_job_queue_pop(&queue), &items[1]);
    assert_ptr_equal(pcp_roles_worker_job_queue_pop(&queue), &items[2]);
    assert_ptr_equal(pcp_roles_worker_job_queue_pop(&queue), &items[4]);
    assert_int_equal(pcp_roles_worker_job_queue_count(&queue), 0);
  }
  // After close: pushes fail, queued jobs still come out, then NULL.
  expect_ok(pcp_roles_worker_job_queue_push(&queue, &items[0]));
  pcp_roles_worker_job_queue_close(&queue);
  expect_code(pcp_roles_worker_job_queue_push(&queue, &items[1]),
              PCP_STATUS_FAILED_PRECONDITION);
  assert_ptr_equal(pcp_roles_worker_job_queue_pop(&queue), &items[0]);
  assert_null(pcp_roles_worker_job_queue_pop(&queue));
  pcp_roles_worker_job_queue_deinitialize(&queue);
}

typedef struct consumer_t {
  pcp_roles_worker_job_queue_t* queue;
  int seen;
  intptr_t last;
  bool in_order;
} consumer_t;

static void* consume(void* opaque) {
  consumer_t* c = opaque;
  for (void* job; (job = pcp_roles_worker_job_queue_pop(c->queue));) {
    intptr_t value = (intptr_t)job;
    if (value != c->last + 1) {
      c->in_order = false;
    }
    c->last = value;
    c->seen++;
  }
  return NULL;
}

static void job_queue_cross_thread(void** state) {
  (void)state;
  pcp_roles_worker_job_queue_t queue;
  expect_ok(
      pcp_roles_worker_job_queue_initialize(4, pcp_allocator_system(), &queue));
  consumer_t c = {.queue = &queue, .last = 0, .in_order = true};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, consume, &c), 0);
  // A blocked consumer wakes for each push; a full queue pushes back.
  for (intptr_t i = 1; i <= 1000;) {
    pcp_status_t status = pcp_roles_worker_job_queue_push(&queue, (void*)i);
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
      pcp_sleep_ms(1);
      continue;
    }
    ++i;
  }
  pcp_roles_worker_job_queue_close(&queue);
  assert_int_equal(pthread_join(thread, NULL), 0);
  assert_int_equal(c.seen, 1000);
  assert_true(c.in_order);
  pcp_roles_worker_job_queue_deinitialize(&queue);
}

//===----------------------------------------------------------------------===//
// Out of memory (SQLite-style sweep: fail the Nth allocation, every N)
//===----------------------------------------------------------------------===//

// Fills a store through an allocator that fails from allocation |n| on:
// every put either succeeds or returns RESOURCE_EXHAUSTED leaving the value
// with the caller, each value is released exactly once in the end, and no
// byte stays allocated. Returns true once no allocation failed (the sweep
// is complete).
static bool session_store_oom_round(int64_t n) {
  pcp_allocator_failing_t failing;
  pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_failing(&failing), &counting);
  pcp_roles_worker_session_store_t store;
  pcp_roles_worker_session_store_initialize(
      150, release_fake, pcp_allocator_counting(&counting), &store);
  fake_value_t values[12] = {{0}};
  bool stored[12] = {false};
  char session[16], name[16];
  for (int i = 0; i < 12; ++i) {
    snprintf(session, sizeof(session), "s%d", i % 5);
    snprintf(name, sizeof(name), "t%d", i % 4);
    pcp_status_t status = pcp_roles_worker_session_store_put(
        &store, session, name, &values[i], 10 + (size_t)i);
    if (status) {
      assert_int_equal(pcp_status_consume_code(status),
                       PCP_STATUS_RESOURCE_EXHAUSTED);
      release_fake(&values[i]);  // still ours
    } else {
      stored[i] = true;
    }
    size_t evicted = 0;
    pcp_status_ignore(pcp_roles_worker_session_store_enforce_limit(
        &store, session, &evicted));
  }
  pcp_roles_worker_session_store_deinitialize(&store);
  for (int i = 0; i < 12; ++i) {
    assert_int_equal(values[i].releases, 1);
  }
  (void)stored;
  assert_int_equal(counting.live_bytes, 0);
  return failing.failure_count == 0;
}

static void session_store_survives_every_allocation_failure(void** state) {
  (void)state;
  int64_t n = 0;
  while (!session_store_oom_round(n)) {
    ++n;
    assert_true(n < 10000);
  }
  assert_true(n > 5);  // the sweep did reach the later allocations
}

static void job_queue_and_cache_report_allocation_failure(void** state) {
  (void)state;
  pcp_roles_worker_job_queue_t queue;
  expect_code(
      pcp_roles_worker_job_queue_initialize(4, pcp_allocator_null(), &queue),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_roles_worker_job_queue_deinitialize(&queue);  // safe after failure
  char dir[64];
  make_temp_dir(dir, sizeof(dir));
  pcp_roles_worker_program_cache_t cache;
  expect_code(pcp_roles_worker_program_cache_initialize(
                  dir, pcp_allocator_null(), &cache),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_roles_worker_program_cache_deinitialize(&cache);  // safe too
  remove_tree(dir);
}

//===----------------------------------------------------------------------===//
// Metrics (--metrics-listen)
//===----------------------------------------------------------------------===//

static void metrics_listen_parse_checks_the_address(void** state) {
  (void)state;
  char host[64];
  uint16_t port = 0;
  expect_ok(pcp_roles_worker_metrics_listen_parse("127.0.0.1:9100", host,
                                                  sizeof(host), &port));
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 9100);
  expect_ok(pcp_roles_worker_metrics_listen_parse("[::1]:65535", host,
                                                  sizeof(host), &port));
  assert_string_equal(host, "::1");
  assert_int_equal(port, 65535);
  const char* bad[] = {"nonsense", ":80",  "[::1]", "[::1]9100", "h:0",
                       "h:65536",  "h:-1", "h:",    "h:80x",     "[]:80"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    pcp_status_t status = pcp_roles_worker_metrics_listen_parse(
        bad[i], host, sizeof(host), &port);
    if (!status || !strstr(pcp_status_message(status), "--metrics-listen")) {
      fail_msg("'%s' accepted or the message lacks the flag", bad[i]);
    }
    pcp_status_ignore(status);
  }
  char small[4];
  expect_code(pcp_roles_worker_metrics_listen_parse("localhost:80", small,
                                                    sizeof(small), &port),
              PCP_STATUS_INVALID_ARGUMENT);
}

// GET |path| from 127.0.0.1:|port| over a plain socket; the whole answer.
static char* http_get(uint16_t port, const char* path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr*)&address, sizeof(address)), 0);
  char request[128];
  int n =
      snprintf(request, sizeof(request),
               "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
  assert_int_equal(write(fd, request, (size_t)n), n);
  size_t capacity = 1 << 20, size = 0;
  char* text = calloc(1, capacity);
  ssize_t got;
  while ((got = read(fd, text + size, capacity - 1 - size)) > 0) {
    size += (size_t)got;
  }
  close(fd);
  return text;
}

static void metrics_served_with_worker_labels(void** state) {
  (void)state;
  pcp_roles_worker_metrics_t metrics;
  expect_ok(pcp_roles_worker_metrics_initialize("cpu", NULL, "w-0", &metrics));
  pcp_roles_worker_metrics_add(metrics.tasks_succeeded, 2);
  pcp_roles_worker_metrics_add(metrics.cache_misses, 1);
  pcp_roles_worker_metrics_set(metrics.device_memory, 4096);
  pcp_roles_worker_metrics_add(NULL, 1);  // no series: a no-op
  uint16_t port = 0;
  // Port 0 is refused by the flag; bind a free one the kernel picks first.
  int probe = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in address = {.sin_family = AF_INET};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(probe, (struct sockaddr*)&address, sizeof(address)), 0);
  socklen_t length = sizeof(address);
  assert_int_equal(getsockname(probe, (struct sockaddr*)&address, &length), 0);
  char listen_text[32];
  snprintf(listen_text, sizeof(listen_text), "127.0.0.1:%u",
           (unsigned)ntohs(address.sin_port));
  close(probe);
  expect_ok(pcp_roles_worker_metrics_listen(&metrics, listen_text, &port));
  assert_int_equal(port, ntohs(address.sin_port));
  char* text = http_get(port, "/metrics");
  const char* want[] = {
      "pcp_worker_tasks_total{backend=\"cpu\",target=\"default\","
      "worker=\"w-0\",outcome=\"succeeded\"} 2\n",
      "pcp_worker_program_cache_misses_total{backend=\"cpu\","
      "target=\"default\",worker=\"w-0\"} 1\n",
      "pcp_worker_device_memory_bytes{backend=\"cpu\",target=\"default\","
      "worker=\"w-0\"} 4096\n",
      "pcp_build_info{version=",
      "role=\"worker\"} 1\n",
      "\nprocess_open_fds ",
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(want); ++i) {
    if (!strstr(text, want[i])) {
      fail_msg("'%s' not in:\n%s", want[i], text);
    }
  }
  free(text);
  // The same port again: UNAVAILABLE, and the first server still answers.
  pcp_roles_worker_metrics_t second;
  expect_ok(
      pcp_roles_worker_metrics_initialize("cpu", "sm_80", "w-1", &second));
  uint16_t second_port = 0;
  pcp_status_t status =
      pcp_roles_worker_metrics_listen(&second, listen_text, &second_port);
  assert_non_null(status);
  pcp_status_ignore(status);
  pcp_roles_worker_metrics_deinitialize(&second);
  text = http_get(port, "/healthz");
  assert_non_null(strstr(text, "200 OK"));
  free(text);
  pcp_roles_worker_metrics_deinitialize(&metrics);
  pcp_roles_worker_metrics_deinitialize(&metrics);  // zeroed: a no-op
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(program_cache_miss_store_hit),
      cmocka_unit_test(program_cache_corrupt_file_is_a_miss),
      cmocka_unit_test(program_cache_refuses_bytes_that_do_not_match),
      cmocka_unit_test(session_store_put_get_replace_drop),
      cmocka_unit_test(session_store_evicts_least_recently_used),
      cmocka_unit_test(session_store_unlimited_never_evicts),
      cmocka_unit_test(job_queue_bounds_and_order),
      cmocka_unit_test(job_queue_cross_thread),
      cmocka_unit_test(session_store_survives_every_allocation_failure),
      cmocka_unit_test(job_queue_and_cache_report_allocation_failure),
      cmocka_unit_test(metrics_listen_parse_checks_the_address),
      cmocka_unit_test(metrics_served_with_worker_labels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
