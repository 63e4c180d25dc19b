// SPDX-License-Identifier: Apache-2.0
// The compile queue's request notification
// (pcp_workloads_compile_request_notify), with a fake `pcp` (a shell
// script): it runs exactly once per request, when the compile finishes, when
// the request is cancelled (also by its release), or at once for a request
// already finished; requests sharing one compile are each told once.

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "workloads/workloads.h"

static char g_dir[] = "/tmp/pcp-compile-notify-test-XXXXXX";
static char g_fake[512];

// `compile ... -o OUT INPUT`: the input's first line is "hang" (the child
// sleeps, killed by a cancel) or "sleep S" (then writes OUT).
static const char kFake[] =
    "#!/bin/sh\n"
    "out=''; prev=''; last=''\n"
    "for a in \"$@\"; do [ \"$prev\" = -o ] && out=$a; prev=$a; last=$a; "
    "done\n"
    "mode=$(head -n1 \"$last\")\n"
    "case \"$mode\" in\n"
    "  hang) exec sleep 30 ;;\n"
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

static pcp_workloads_compile_queue_t* queue_make(const char* name) {
  char artifacts[600];
  snprintf(artifacts, sizeof(artifacts), "%s/%s", g_dir, name);
  pcp_workloads_compile_queue_options_t options = {
      .pcp_path = g_fake,
      .artifact_dir = artifacts,
      .slot_count = 1,
      .compiler_version = "fake 1.0",
  };
  pcp_workloads_compile_queue_t* q = NULL;
  PCP_CHECK_OK(
      pcp_workloads_compile_queue_create(&options, pcp_allocator_system(), &q));
  return q;
}

static pcp_workloads_compile_spec_t spec_make(const char* name,
                                              const char* mode, char* path,
                                              size_t capacity) {
  snprintf(path, capacity, "%s/%s.mlir", g_dir, name);
  char text[256];
  snprintf(text, sizeof(text), "%s\n// %s\n", mode, name);
  write_file(path, text);
  return (pcp_workloads_compile_spec_t){.mlir_path = path, .backend = "cpu"};
}

static void count_notify(void* user_data) {
  atomic_fetch_add((atomic_int*)user_data, 1);
}

// The compile's end tells every request sharing it, once each; a request
// for an artifact that exists is told at once.
static void test_finish_notifies_each_request(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("finish");
  char path[600];
  pcp_workloads_compile_spec_t spec =
      spec_make("finish", "sleep 0.2", path, sizeof(path));
  pcp_workloads_compile_request_t* a = NULL;
  pcp_workloads_compile_request_t* b = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &a));
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &b));
  atomic_int told_a = 0;
  atomic_int told_b = 0;
  pcp_workloads_compile_request_notify(a, count_notify, &told_a);
  pcp_workloads_compile_request_notify(b, count_notify, &told_b);
  assert_int_equal(atomic_load(&told_a), 0);  // the child sleeps 0.2 s
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(a));
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(b));
  // The notification runs under the queue's lock with the finish, so a
  // wait that returned has seen it.
  assert_int_equal(atomic_load(&told_a), 1);
  assert_int_equal(atomic_load(&told_b), 1);
  pcp_workloads_compile_request_release(a);
  pcp_workloads_compile_request_release(b);
  assert_int_equal(atomic_load(&told_a), 1);
  assert_int_equal(atomic_load(&told_b), 1);
  // The artifact exists now: a new request is done at once, and so is its
  // notification.
  pcp_workloads_compile_request_t* hit = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &hit));
  atomic_int told_hit = 0;
  pcp_workloads_compile_request_notify(hit, count_notify, &told_hit);
  assert_int_equal(atomic_load(&told_hit), 1);
  PCP_CHECK_OK(pcp_workloads_compile_request_wait(hit));
  pcp_workloads_compile_request_release(hit);
  assert_int_equal(atomic_load(&told_hit), 1);
  pcp_workloads_compile_queue_destroy(q);
}

// A cancel tells its request at once (on the cancelling thread) and only
// it; the other request of the same compile is told when that ends (here:
// by its release, which cancels it).
static void test_cancel_notifies_that_request(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("cancel");
  char path[600];
  pcp_workloads_compile_spec_t spec =
      spec_make("hang", "hang", path, sizeof(path));
  pcp_workloads_compile_request_t* a = NULL;
  pcp_workloads_compile_request_t* b = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &a));
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &spec, &b));
  atomic_int told_a = 0;
  atomic_int told_b = 0;
  pcp_workloads_compile_request_notify(a, count_notify, &told_a);
  pcp_workloads_compile_request_notify(b, count_notify, &told_b);
  pcp_workloads_compile_request_cancel(a);
  assert_int_equal(atomic_load(&told_a), 1);
  assert_int_equal(atomic_load(&told_b), 0);
  assert_int_equal(
      pcp_status_consume_code(pcp_workloads_compile_request_wait(a)),
      PCP_STATUS_CANCELLED);
  pcp_workloads_compile_request_cancel(a);  // idempotent: not told again
  assert_int_equal(atomic_load(&told_a), 1);
  pcp_workloads_compile_request_release(a);
  assert_false(pcp_workloads_compile_request_wait_for(b, 20));
  pcp_workloads_compile_request_release(b);  // the last waiter: killed
  assert_int_equal(atomic_load(&told_a), 1);
  assert_int_equal(atomic_load(&told_b), 1);
  pcp_workloads_compile_queue_destroy(q);
}

// Shutting the queue down finishes every compile (CANCELLED): each waiting
// request is told once.
static void test_shutdown_notifies(void** state) {
  (void)state;
  pcp_workloads_compile_queue_t* q = queue_make("shutdown");
  char hang[600];
  char queued[600];
  pcp_workloads_compile_spec_t hang_spec =
      spec_make("hang2", "hang", hang, sizeof(hang));
  pcp_workloads_compile_spec_t queued_spec =
      spec_make("queued", "sleep 0", queued, sizeof(queued));
  pcp_workloads_compile_request_t* running = NULL;
  pcp_workloads_compile_request_t* behind = NULL;
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &hang_spec, &running));
  PCP_CHECK_OK(pcp_workloads_compile_queue_submit(q, &queued_spec, &behind));
  atomic_int told_running = 0;
  atomic_int told_behind = 0;
  pcp_workloads_compile_request_notify(running, count_notify, &told_running);
  pcp_workloads_compile_request_notify(behind, count_notify, &told_behind);
  pcp_workloads_compile_queue_shutdown(q);
  assert_int_equal(
      pcp_status_consume_code(pcp_workloads_compile_request_wait(running)),
      PCP_STATUS_CANCELLED);
  assert_int_equal(
      pcp_status_consume_code(pcp_workloads_compile_request_wait(behind)),
      PCP_STATUS_CANCELLED);
  assert_int_equal(atomic_load(&told_running), 1);
  assert_int_equal(atomic_load(&told_behind), 1);
  pcp_workloads_compile_request_release(running);
  pcp_workloads_compile_request_release(behind);
  assert_int_equal(atomic_load(&told_running), 1);
  assert_int_equal(atomic_load(&told_behind), 1);
  pcp_workloads_compile_queue_destroy(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_finish_notifies_each_request),
      cmocka_unit_test(test_cancel_notifies_that_request),
      cmocka_unit_test(test_shutdown_notifies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
