// SPDX-License-Identifier: Apache-2.0
// OOM sweeps for src/store, SQLite style: fail the Nth allocation and check
// that the call fails with a status (never a crash or an assert), that the
// database stays consistent, and that the same store keeps working once
// memory is back.
//
// SQLite's allocator cannot be set per connection (sqlite3_config is
// process-wide and only before sqlite3_initialize), so this test is its own
// process: it installs one failing counter behind SQLite's allocator,
// jansson's and the store's pcp_allocator_t together. The other store tests
// run on the real allocators.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sqlite3.h>

#include "store/store.h"

//===----------------------------------------------------------------------===//
// One failure counter behind every allocator
//===----------------------------------------------------------------------===//

static int64_t g_fail_at = -1;  // -1: never
static int64_t g_count = 0;
static int64_t g_failed = 0;
static sqlite3_mem_methods g_sqlite_default;

static bool should_fail(void) {
  int64_t index = g_count++;
  if (g_fail_at >= 0 && index == g_fail_at) {
    ++g_failed;
    return true;
  }
  return false;
}

static void arm(int64_t fail_at) {
  g_count = 0;
  g_failed = 0;
  g_fail_at = fail_at;
}

static void* sqlite_malloc(int size) {
  return should_fail() ? NULL : g_sqlite_default.xMalloc(size);
}
static void* sqlite_realloc(void* ptr, int size) {
  return should_fail() ? NULL : g_sqlite_default.xRealloc(ptr, size);
}
static void sqlite_free(void* ptr) {
  g_sqlite_default.xFree(ptr);
}
static int sqlite_size(void* ptr) {
  return g_sqlite_default.xSize(ptr);
}
static int sqlite_roundup(int size) {
  return g_sqlite_default.xRoundup(size);
}
static int sqlite_init(void* data) {
  return g_sqlite_default.xInit(data);
}
static void sqlite_shutdown(void* data) {
  g_sqlite_default.xShutdown(data);
}

static void* json_malloc(size_t size) {
  return should_fail() ? NULL : malloc(size);
}

static pcp_status_t store_allocator_ctl(void* self,
                                        pcp_allocator_command_t command,
                                        const pcp_allocator_alloc_params_t* p,
                                        void** inout_ptr) {
  (void)self;
  if (command != PCP_ALLOCATOR_COMMAND_FREE && should_fail()) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "injected");
  }
  pcp_allocator_t system = pcp_allocator_system();
  return system.ctl(system.self, command, p, inout_ptr);
}

static void install_allocators(void) {
  assert_int_equal(sqlite3_shutdown(), SQLITE_OK);
  assert_int_equal(sqlite3_config(SQLITE_CONFIG_GETMALLOC, &g_sqlite_default),
                   SQLITE_OK);
  static sqlite3_mem_methods methods;
  methods = (sqlite3_mem_methods){
      .xMalloc = sqlite_malloc,
      .xFree = sqlite_free,
      .xRealloc = sqlite_realloc,
      .xSize = sqlite_size,
      .xRoundup = sqlite_roundup,
      .xInit = sqlite_init,
      .xShutdown = sqlite_shutdown,
  };
  assert_int_equal(sqlite3_config(SQLITE_CONFIG_MALLOC, &methods), SQLITE_OK);
  // Lookaside slots would hide most small allocations from the counter.
  assert_int_equal(sqlite3_config(SQLITE_CONFIG_LOOKASIDE, 0, 0), SQLITE_OK);
  assert_int_equal(sqlite3_initialize(), SQLITE_OK);
  json_set_alloc_funcs(json_malloc, free);
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static void expect_ok_at(pcp_status_t status, const char* expr,
                         const char* file, int line) {
  if (status) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    print_error("%s:%d: %s: %s\n", file, line, expr, text);
  }
  pcp_status_ignore(status);
  _assert_true(status == NULL, expr, file, line);
}
#define EXPECT_OK(expr) expect_ok_at((expr), #expr, __FILE__, __LINE__)

static pcp_allocator_t store_allocator(void) {
  return (pcp_allocator_t){.self = NULL, .ctl = store_allocator_ctl};
}

// The sweeps are about allocation failures, not durability: on tmpfs
// (/dev/shm) their thousands of fsyncs cost nothing, where on a busy disk
// they made the test take half a minute. TMPDIR, then /tmp, otherwise.
static void make_dir(char* dir, size_t capacity) {
  const char* candidates[] = {"/dev/shm", getenv("TMPDIR"), "/tmp"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(candidates); ++i) {
    if (!candidates[i] || !candidates[i][0]) {
      continue;
    }
    snprintf(dir, capacity, "%s/pcp-store-oom-XXXXXX", candidates[i]);
    if (mkdtemp(dir)) {
      return;
    }
  }
  fail_msg("cannot create a temporary directory");
}

static void remove_dir(const char* dir) {
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  assert_int_equal(system(command), 0);
}

static pcp_status_t open_store(const char* dir, pcp_store_t** out_store) {
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = dir;
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  return pcp_store_create(&options, store_allocator(), out_store);
}

// The job's state events form a legal chain ending at its state.
static void check_job(pcp_store_t* store, const char* id) {
  pcp_store_job_t job;
  pcp_status_t status = pcp_store_job_get(store, id, &job);
  if (pcp_status_code(status) == PCP_STATUS_NOT_FOUND) {
    pcp_status_ignore(status);
    return;
  }
  assert_null(status);
  pcp_store_job_event_list_t events;
  EXPECT_OK(pcp_store_job_event_list(store, 0, id, 0, &events));
  pcp_store_job_state_t state = PCP_STORE_JOB_STATE_QUEUED;
  size_t state_events = 0;
  for (size_t i = 0; i < events.count; ++i) {
    if (!events.items[i].has_states)
      continue;
    if (state_events++ > 0) {
      assert_int_equal(events.items[i].from_state, state);
    }
    state = events.items[i].to_state;
  }
  assert_true(state_events > 0);
  assert_int_equal(state, job.state);
  pcp_store_job_event_list_deinitialize(&events);
  pcp_store_job_deinitialize(&job);
}

// One pass of work touching every write path that allocates; stops at the
// first error and returns it.
static pcp_status_t scenario(pcp_store_t* store, int iteration) {
  char id[32];
  snprintf(id, sizeof(id), "job-%d", iteration);
  json_t* spec = json_pack("{s:s, s:[i,i]}", "program", "add", "shape", 2, 3);
  if (!spec) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "spec");
  }
  pcp_status_t status = pcp_store_job_create(store, id, "generic", spec, NULL);
  json_decref(spec);
  static const pcp_store_job_state_t kPath[] = {PCP_STORE_JOB_STATE_PLACING,
                                                PCP_STORE_JOB_STATE_COMPILING,
                                                PCP_STORE_JOB_STATE_RUNNING};
  for (size_t i = 0; !status && i < PCP_ARRAYSIZE(kPath); ++i) {
    status = pcp_store_job_transition(store, id, kPath[i], NULL, NULL);
  }
  if (!status) {
    status = pcp_store_checkpoint_write(store, id, 1, "weights", 7, NULL);
  }
  if (!status) {
    pcp_store_job_list_t list;
    status = pcp_store_job_list(store, NULL, &list);
    if (!status)
      pcp_store_job_list_deinitialize(&list);
  }
  if (!status) {
    pcp_store_mutation_t m = {
        .namespace_id = "ns",
        .mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY};
    snprintf(m.target_id, sizeof(m.target_id), "%s", id);
    m.payload = json_pack("{s:s}", "entity_type", "job");
    status = m.payload ? pcp_store_graph_mutation_apply(store, &m, NULL, NULL)
                       : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "m");
    json_decref(m.payload);
  }
  if (!status) {
    pcp_store_graph_query_t query = {.entity_id = id};
    pcp_store_graph_result_t result;
    status = pcp_store_graph_query(store, &query, &result);
    if (!status)
      pcp_store_graph_result_deinitialize(&result);
  }
  if (!status) {
    status = pcp_store_job_transition(store, id, PCP_STORE_JOB_STATE_SUCCEEDED,
                                      NULL, NULL);
  }
  return status;
}

static void expect_oom_code(pcp_status_t status, int64_t fail_at) {
  pcp_status_code_t code = pcp_status_code(status);
  // An allocation failure reaches the caller as RESOURCE_EXHAUSTED; SQLite
  // reports a few of its own OOMs through an I/O path (UNAVAILABLE).
  if (code != PCP_STATUS_RESOURCE_EXHAUSTED && code != PCP_STATUS_UNAVAILABLE) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    print_error("allocation %lld failed as: %s\n", (long long)fail_at, text);
    fail();
  }
  pcp_status_ignore(status);
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

// Fails each allocation of the scenario in turn on an open store; after each
// failure the same store must keep working and stay consistent.
static void test_oom_sweep_on_open_store(void** state) {
  (void)state;
  char dir[256];
  make_dir(dir, sizeof(dir));
  pcp_store_t* store = NULL;
  arm(-1);
  EXPECT_OK(open_store(dir, &store));
  // Count the scenario's allocations once.
  arm(-1);
  EXPECT_OK(scenario(store, -1));
  int64_t total = g_count;
  assert_true(total > 50);
  int64_t failures_seen = 0;
  // Every allocation of the first 300, then every 6th (the checkpoint's
  // fsyncs make each pass cost milliseconds, more on a busy disk).
  for (int64_t fail_at = 0; fail_at < total; fail_at += fail_at < 300 ? 1 : 6) {
    arm(fail_at);
    pcp_status_t status = scenario(store, (int)fail_at);
    bool injected = g_failed > 0;
    arm(-1);
    if (status) {
      assert_true(injected);
      expect_oom_code(status, fail_at);
      ++failures_seen;
    }
    char id[32];
    snprintf(id, sizeof(id), "job-%d", (int)fail_at);
    check_job(store, id);
    // Still usable: a fresh job runs its whole course.
    if (fail_at % 16 == 0) {
      EXPECT_OK(pcp_store_integrity_check(store));
    }
  }
  arm(-1);
  EXPECT_OK(scenario(store, 1000000));
  EXPECT_OK(pcp_store_integrity_check(store));
  print_message("scenario: %lld allocations, %lld surfaced as errors\n",
                (long long)total, (long long)failures_seen);
  // Many allocations are retried or absorbed by SQLite (benign failures);
  // a good share must still surface as errors, or the counter is not wired.
  assert_true(failures_seen > total / 10);
  pcp_store_release(store);
  remove_dir(dir);
}

// Fails allocations while opening (and migrating) a fresh state dir; the
// next open without failures must succeed and find a consistent database.
static void test_oom_sweep_on_open(void** state) {
  (void)state;
  char dir[256];
  make_dir(dir, sizeof(dir));
  arm(-1);
  pcp_store_t* store = NULL;
  EXPECT_OK(open_store(dir, &store));
  int64_t total = g_count;
  pcp_store_release(store);
  remove_dir(dir);
  // Every allocation up to 40 (opening the file, pragmas), then about 60
  // points spread over the migrations, so the test stays in seconds (each
  // point creates a database from scratch).
  int64_t stride = total / 60 > 1 ? total / 60 : 1;
  for (int64_t fail_at = 0; fail_at < total;
       fail_at += fail_at < 40 ? 1 : stride) {
    make_dir(dir, sizeof(dir));
    arm(fail_at);
    store = NULL;
    pcp_status_t status = open_store(dir, &store);
    arm(-1);
    if (status) {
      assert_null(store);
      expect_oom_code(status, fail_at);
      EXPECT_OK(open_store(dir, &store));
    }
    EXPECT_OK(pcp_store_integrity_check(store));
    int32_t version = 0;
    EXPECT_OK(pcp_store_schema_version_query(store, &version));
    assert_int_equal(version, PCP_STORE_SCHEMA_VERSION);
    EXPECT_OK(scenario(store, 0));
    pcp_store_release(store);
    remove_dir(dir);
  }
  print_message("open: %lld allocations\n", (long long)total);
}

int main(void) {
  install_allocators();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oom_sweep_on_open_store),
      cmocka_unit_test(test_oom_sweep_on_open),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
