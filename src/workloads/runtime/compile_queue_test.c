// SPDX-License-Identifier: Apache-2.0
// The compile queue. Control flow with a fake `pcp` (a shell script that
// sleeps, fails or writes an output as its input file says): slots bound
// the children, waiters of one key share one child, a cancel kills the
// child, a failing child's status names its log, every key component
// counts. Then one real `pcp compile` of a tiny module through the queue.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

static char g_dir[] = "/tmp/pcp-compile-queue-test-XXXXXX";
static char g_fake[512];

// The fake `pcp`: `compile ... -o OUT INPUT`; the input's first line says
// what to do. "exec sleep" makes the sleep the child itself, so a kill
// reaches it.
static const char kFake[] =
    "#!/bin/sh\n"
    "out=''; prev=''; last=''\n"
    "for a in \"$@\"; do [ \"$prev\" = -o ] && out=$a; prev=$a; last=$a; "
    "done\n"
    "echo \"fake pcp $*\"\n"
    "mode=$(head -n1 \"$last\")\n"
    "case \"$mode\" in\n"
    "  hang) exec sleep 30 ;;\n"
    "  fail) echo 'error: the module is bad' >&2; exit 3 ;;\n"
    "  sleep*) sleep ${mode#sleep } ;;\n"
    "esac\n"
    "echo vmfb > \"$out.tmp\" && mv \"$out.tmp\" \"$out\"\n";

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void** state) {
  (void)state;
  if (!mkdtemp(g_dir)) {
    return -1;
  }
  snprintf(g_fake, sizeof(g_fake), "%s/fake-pcp", g_dir);
  write_file(g_fake, kFake);
  chmod(g_fake, 0755);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  char command[600];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_dir);
  return system(command) == 0 ? 0 : -1;
}

// A queue over the fake binary with its own artifact directory.
static pcp_workloads_compile_queue_t* queue_make(const char* name,
                                                 uint32_t slots) {
  char artifacts[600];
  snprintf(artifacts, sizeof(artifacts), "%s/%s", g_dir, name);
  pcp_workloads_compile_queue_options_t options = {
      .pcp_path = g_fake,
      .artifact_dir = artifacts,
      .slot_count = slots,
      .compiler_version = "fake 1.0",
  };
  pcp_workloads_compile_queue_t* q = NULL;
  PCP_CHECK_OK(
      pcp_workloads_compile_queue_create(&options, pcp_allocator_system(), &q));
  return q;
}

// An input file whose first line is |mode|; |name| makes it distinct.
static void input_make(const char* name, const char* mode, char* path,
                       size_t capacity) {
  snprintf(path, capacity, "%s/%s.mlir", g_dir, name);
  char text[256];
  snprintf(text, sizeof(text), "%s\n// %s\n", mode, name);
  write_file(path, text);
}

static pcp_workloads_compile_spec_t spec_make(const char* path) {
  pcp_workloads_compile_spec_t spec = {.mlir_path = path, .backend = "cpu"};
  return spec;
}

static int64_t now_ms(void) {
  pcp_clock_t clock = pcp_clock_system();
  return pcp_clock_now_ns(clock) / 1000000;
}

static void test_slots_bound_the_children(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("slots", 2);
  enum { N = 5 };
  pcp_workloads_compile_request_t* r[N];
  for (int i = 0; i < N; ++i) {
    char name[32];
    char path[600];
    snprintf(name, sizeof(name), "slots%d", i);
    input_make(name, "sleep 0.3", path, sizeof(path));
    pcp_workloads_compile_spec_t spec = spec_make(path);
    PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r[i]));
  }
  for (int i = 0; i < N; ++i) {
    PCP_CHECK_OK(pcp_workloads_compile_request_wait(r[i]));
    assert_true(pcp_file_exists(pcp_workloads_compile_request_vmfb_path(r[i])));
    assert_non_null(strstr(pcp_workloads_compile_request_vmfb_path(r[i]),
                           "/" PCP_WORKLOADS_COMPILE_ARTIFACT_PREFIX));
    pcp_workloads_compile_request_release(r[i]);
  }
  pcp_workloads_compile_queue_stats_t stats;
  pcp_workloads_compile_queue_stats(q, &stats);
  assert_int_equal(stats.children_started, N);
  assert_int_equal(stats.running_peak, 2);
  assert_int_equal(stats.running, 0);
  assert_int_equal(stats.queued, 0);
  assert_true(stats.last_compile_ns > 0);
  pcp_workloads_compile_queue_destroy(q);
}

static void test_same_key_shares_one_child(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("share", 2);
  char path[600];
  input_make("share", "sleep 0.3", path, sizeof(path));
  pcp_workloads_compile_spec_t spec = spec_make(path);
  pcp_workloads_compile_request_t* r[3];
  for (int i = 0; i < 3; ++i) {
    PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r[i]));
  }
  for (int i = 0; i < 3; ++i) {
    PCP_CHECK_OK(pcp_workloads_compile_request_wait(r[i]));
    assert_string_equal(pcp_workloads_compile_request_vmfb_path(r[i]),
                        pcp_workloads_compile_request_vmfb_path(r[0]));
    assert_false(pcp_workloads_compile_request_cache_hit(r[i]));
  }
  // One waiter cancelling after the others finished changes nothing.
  pcp_workloads_compile_request_cancel(r[1]);
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(r[1]));
  for (int i = 0; i < 3; ++i) {
    pcp_workloads_compile_request_release(r[i]);
  }
  // Later: the artifact is there, no child.
  pcp_workloads_compile_request_t* again = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &again));
  assert_true(pcp_workloads_compile_request_cache_hit(again));
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(again));
  pcp_workloads_compile_request_release(again);
  pcp_workloads_compile_queue_stats_t stats;
  pcp_workloads_compile_queue_stats(q, &stats);
  assert_int_equal(stats.children_started, 1);
  assert_int_equal(stats.joined, 2);
  assert_int_equal(stats.cache_hits, 1);
  pcp_workloads_compile_queue_destroy(q);
}

typedef struct waiter_t {
  pcp_workloads_compile_request_t* request;
  pcp_status_code_t code;
  int64_t woke_ms;
} waiter_t;

static void* waiter_main(void* opaque) {
  waiter_t* w = opaque;
  pcp_status_t status = pcp_workloads_compile_request_wait(w->request);
  w->woke_ms = now_ms();
  w->code = pcp_status_consume_code(status);
  return NULL;
}

// Waits (test only) until |q| runs |running| children.
static void running_wait(pcp_workloads_compile_queue_t* q, uint32_t running,
                         uint64_t started) {
  pcp_workloads_compile_queue_stats_t stats;
  for (int i = 0; i < 2000; ++i) {
    pcp_workloads_compile_queue_stats(q, &stats);
    if (stats.running == running && stats.children_started == started) {
      return;
    }
    pcp_sleep_ms(5);
  }
  fail_msg("running %u started %llu", stats.running,
           (unsigned long long)stats.children_started);
}

static void test_cancel_kills_the_child(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("cancel", 1);
  char hang[600];
  char queued[600];
  input_make("hang", "hang", hang, sizeof(hang));
  input_make("queued", "ok", queued, sizeof(queued));
  pcp_workloads_compile_spec_t spec = spec_make(hang);
  waiter_t w = {0};
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &w.request));
  // The same key twice: the child dies only when both have cancelled.
  pcp_workloads_compile_request_t* second = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &second));
  // One slot: this one stays queued behind the hanging child.
  pcp_workloads_compile_spec_t queued_spec = spec_make(queued);
  pcp_workloads_compile_request_t* behind = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &queued_spec, &behind));
  running_wait(q, 1, 1);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, waiter_main, &w), 0);
  // A queued compile cancelled never starts a child.
  pcp_workloads_compile_request_cancel(behind);
  assert_int_equal(
      pcp_status_consume_code(pcp_workloads_compile_request_wait(behind)),
      PCP_STATUS_CANCELLED);
  pcp_workloads_compile_request_cancel(second);
  assert_int_equal(
      pcp_status_consume_code(pcp_workloads_compile_request_wait(second)),
      PCP_STATUS_CANCELLED);
  // |w| still waits, so the child still runs.
  assert_false(pcp_workloads_compile_request_wait_for(w.request, 50));
  pcp_workloads_compile_queue_stats_t stats;
  pcp_workloads_compile_queue_stats(q, &stats);
  assert_int_equal(stats.running, 1);
  assert_int_equal(stats.children_killed, 0);
  int64_t cancelled_ms = now_ms();
  pcp_workloads_compile_request_cancel(w.request);
  running_wait(q, 0, 1);
  int64_t reaped_ms = now_ms();
  pthread_join(thread, NULL);
  assert_int_equal(w.code, PCP_STATUS_CANCELLED);
  pcp_workloads_compile_queue_stats(q, &stats);
  assert_int_equal(stats.children_killed, 1);
  assert_int_equal(stats.children_started, 1);
  print_message(
      "cancel: waiter woke after %lld ms, child reaped after %lld "
      "ms\n",
      (long long)(w.woke_ms - cancelled_ms),
      (long long)(reaped_ms - cancelled_ms));
  // ~100 ms is the goal; the bound is loose for a loaded machine.
  assert_true(reaped_ms - cancelled_ms < 1000);
  assert_false(
      pcp_file_exists(pcp_workloads_compile_request_vmfb_path(w.request)));
  pcp_workloads_compile_request_release(w.request);
  pcp_workloads_compile_request_release(second);
  pcp_workloads_compile_request_release(behind);
  pcp_workloads_compile_queue_destroy(q);
}

// A compile whose every waiter cancelled has its child killed; a new
// request for the same key arriving before the slot reaps that child must
// not join it (it would get "compile cancelled" without having cancelled).
// content_hash gives both specs one key while the second input succeeds.
static void test_new_request_skips_a_killed_compile(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("killed_join", 2);
  char hang[600];
  char ok[600];
  input_make("kj_hang", "hang", hang, sizeof(hang));
  input_make("kj_ok", "ok", ok, sizeof(ok));
  // Several rounds: the window (kill to reap) is short.
  for (int round = 0; round < 10; ++round) {
    char hash[PCP_SHA256_HEX_LENGTH + 1];
    snprintf(hash, sizeof(hash), "%064d", round);
    pcp_workloads_compile_spec_t first = spec_make(hang);
    first.content_hash = hash;
    pcp_workloads_compile_spec_t second = spec_make(ok);
    second.content_hash = hash;
    pcp_workloads_compile_request_t* a = NULL;
    PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &first, &a));
    running_wait(q, 1, (uint64_t)round * 2 + 1);
    pcp_workloads_compile_request_cancel(a);
    pcp_workloads_compile_request_t* b = NULL;
    PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &second, &b));
    PCP_CHECK_OK(pcp_workloads_compile_request_wait(b));
    assert_true(pcp_file_exists(pcp_workloads_compile_request_vmfb_path(b)));
    pcp_workloads_compile_request_release(a);
    pcp_workloads_compile_request_release(b);
    running_wait(q, 0, (uint64_t)round * 2 + 2);
  }
  pcp_workloads_compile_queue_destroy(q);
}

static void test_destroy_kills_and_wakes(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("destroy", 1);
  char hang[600];
  input_make("hang2", "hang", hang, sizeof(hang));
  pcp_workloads_compile_spec_t spec = spec_make(hang);
  waiter_t w = {0};
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &w.request));
  running_wait(q, 1, 1);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, waiter_main, &w), 0);
  int64_t start_ms = now_ms();
  pcp_workloads_compile_queue_destroy(q);
  pthread_join(thread, NULL);
  assert_int_equal(w.code, PCP_STATUS_CANCELLED);
  assert_true(now_ms() - start_ms < 5000);
  // The request outlives the queue's destroy; its release frees the rest.
  pcp_workloads_compile_request_release(w.request);
}

static void test_failure_names_the_log(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("fail", 1);
  char path[600];
  input_make("fail", "fail", path, sizeof(path));
  char logs[600];
  snprintf(logs, sizeof(logs), "%s/fail-logs", g_dir);
  PCP_CHECK_OK(pcp_file_make_directories(logs));
  pcp_workloads_compile_spec_t spec = spec_make(path);
  spec.log_dir = logs;
  spec.program = "diloco";
  spec.inner_steps = 4;
  const char* flags[] = {"--iree-no-such-flag=1"};
  spec.iree_flags = flags;
  spec.iree_flag_count = 1;
  pcp_workloads_compile_request_t* r = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r));
  pcp_status_t status = pcp_workloads_compile_request_wait(r);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  const char* log = pcp_workloads_compile_request_log_path(r);
  assert_non_null(strstr(log, logs));
  assert_non_null(strstr(log, "/compile-"));
  assert_non_null(strstr(pcp_status_message(status), log));
  assert_non_null(strstr(pcp_status_message(status), "exit 3"));
  // The log's tail, on one line (job errors are stored as one line).
  assert_non_null(strstr(pcp_status_message(status), "the module is bad"));
  assert_null(strchr(pcp_status_message(status), '\n'));
  pcp_status_ignore(status);
  void* text = NULL;
  size_t length = 0;
  PCP_CHECK_OK(pcp_file_read_all(log, 1 << 20, &text, &length));
  assert_non_null(strstr(text, "the module is bad"));
  // The child got the program's options and the flag.
  assert_non_null(strstr(text, "--program diloco --inner-steps 4"));
  assert_non_null(strstr(text, "--iree-flag=--iree-no-such-flag=1"));
  free(text);
  pcp_workloads_compile_request_release(r);
  pcp_workloads_compile_queue_destroy(q);
}

static void test_key_covers_every_component(void** state) {
  (void)state;
  char path[600];
  input_make("key", "ok", path, sizeof(path));
  const char* flag_a[] = {"--iree-opt-level=O2"};
  const char* flag_b[] = {"--iree-opt-level=O3"};
  enum { VARIANTS = 14 };
  char keys[VARIANTS][PCP_SHA256_HEX_LENGTH + 1];
  for (int v = 0; v < VARIANTS; ++v) {
    pcp_workloads_compile_spec_t s = spec_make(path);
    s.program = "diloco";
    s.inner_steps = 8;
    s.content_hash = "aaaa";
    const char* version = "v1";
    unsetenv("PCP_IREE_FLAGS");
    switch (v) {
      case 0:
        break;
      case 1:
        s.content_hash = "bbbb";
        break;
      case 2:
        s.program = "train";
        break;
      case 3:
        s.inner_steps = 9;
        break;
      case 4:
        s.delta_dtype = "bf16";
        break;
      case 5:
        s.accumulation = 2;
        break;
      case 6:
        s.inner_state_keep = true;
        break;
      case 7:
        s.iree_flags = flag_a;
        s.iree_flag_count = 1;
        break;
      case 8:
        s.iree_flags = flag_b;
        s.iree_flag_count = 1;
        break;
      case 9:
        setenv("PCP_IREE_FLAGS", "--iree-opt-level=O1", 1);
        break;
      case 10:
        s.backend = "cuda";
        break;
      case 11:
        s.target = "x86-64-v3";
        break;
      case 12:
        version = "v2";
        break;
      case 13:
        s.content_hash = NULL;
        break;  // the file's own hash
    }
    PCP_CHECK_OK(pcp_workloads_compile_key_compute(&s, version, keys[v]));
    for (int u = 0; u < v; ++u) {
      if (strcmp(keys[u], keys[v]) == 0) {
        fail_msg("variants %d and %d share a key", u, v);
      }
    }
  }
  unsetenv("PCP_IREE_FLAGS");
  // Deterministic, and the program options do not count without a program.
  char again[PCP_SHA256_HEX_LENGTH + 1];
  pcp_workloads_compile_spec_t s = spec_make(path);
  s.program = "diloco";
  s.inner_steps = 8;
  s.content_hash = "aaaa";
  PCP_CHECK_OK(pcp_workloads_compile_key_compute(&s, "v1", again));
  assert_string_equal(again, keys[0]);
  pcp_workloads_compile_spec_t plain = spec_make(path);
  plain.content_hash = "aaaa";
  char k1[PCP_SHA256_HEX_LENGTH + 1];
  char k2[PCP_SHA256_HEX_LENGTH + 1];
  PCP_CHECK_OK(pcp_workloads_compile_key_compute(&plain, "v1", k1));
  plain.inner_steps = 5;
  plain.delta_dtype = "bf16";
  PCP_CHECK_OK(pcp_workloads_compile_key_compute(&plain, "v1", k2));
  assert_string_equal(k1, k2);
  // Limits: a spec without a backend, too many flags.
  plain.backend = NULL;
  assert_int_equal(pcp_status_consume_code(
                       pcp_workloads_compile_key_compute(&plain, "v1", k1)),
                   PCP_STATUS_INVALID_ARGUMENT);
  plain.backend = "cpu";
  plain.iree_flag_count = PCP_WORKLOADS_COMPILE_MAX_IREE_FLAGS + 1;
  plain.iree_flags = flag_a;
  assert_int_equal(pcp_status_consume_code(
                       pcp_workloads_compile_key_compute(&plain, "v1", k1)),
                   PCP_STATUS_INVALID_ARGUMENT);
}

// The real binary: a tiny module through the queue, then a cache hit.
static void test_real_pcp_compile(void** state) {
  (void)state;
  char artifacts[600];
  snprintf(artifacts, sizeof(artifacts), "%s/real", g_dir);
  pcp_workloads_compile_queue_options_t options = {
      .pcp_path = PCP_BINARY,
      .artifact_dir = artifacts,
      .slot_count = 1,
  };
  pcp_workloads_compile_queue_t* q = NULL;
  PCP_CHECK_OK(
      pcp_workloads_compile_queue_create(&options, pcp_allocator_system(), &q));
  char path[600];
  snprintf(path, sizeof(path), "%s/add.mlir", g_dir);
  write_file(path,
             "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> "
             "tensor<4xf32> {\n"
             "  %0 = stablehlo.add %a, %b : tensor<4xf32>\n"
             "  return %0 : tensor<4xf32>\n}\n");
  pcp_workloads_compile_spec_t spec = spec_make(path);
  pcp_workloads_compile_request_t* r = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r));
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(r));
  void* vmfb = NULL;
  size_t length = 0;
  PCP_CHECK_OK(pcp_file_read_all(pcp_workloads_compile_request_vmfb_path(r),
                                 1 << 24, &vmfb, &length));
  // IREE's VMFB: a zip archive whose first entry is module.fb.
  assert_true(length > 64);
  assert_memory_equal(vmfb, "PK\x03\x04", 4);
  assert_memory_equal((char*)vmfb + 30, "module.fb", 9);
  free(vmfb);
  pcp_workloads_compile_request_release(r);
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r));
  assert_true(pcp_workloads_compile_request_cache_hit(r));
  pcp_workloads_compile_request_release(r);
  // A module the compiler rejects: the status names the log, which holds
  // the diagnostics.
  snprintf(path, sizeof(path), "%s/bad.mlir", g_dir);
  write_file(path, "func.func @main( {\n");
  spec = spec_make(path);
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &r));
  pcp_status_t status = pcp_workloads_compile_request_wait(r);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status),
                         pcp_workloads_compile_request_log_path(r)));
  pcp_status_ignore(status);
  pcp_workloads_compile_request_release(r);
  pcp_workloads_compile_queue_destroy(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_covers_every_component),
      cmocka_unit_test(test_slots_bound_the_children),
      cmocka_unit_test(test_same_key_shares_one_child),
      cmocka_unit_test(test_cancel_kills_the_child),
      cmocka_unit_test(test_destroy_kills_and_wakes),
      cmocka_unit_test(test_new_request_skips_a_killed_compile),
      cmocka_unit_test(test_failure_names_the_log),
      cmocka_unit_test(test_real_pcp_compile),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
