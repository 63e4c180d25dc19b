// SPDX-License-Identifier: Apache-2.0
// Unit tests for src/store: every table's API, the transition table, event
// ids across reopen, service TTLs on a manual clock, graph queries, the
// mutation log, checkpoints (with corruption), migrations, limits and the
// SQLite error mapping. The SIGKILL crash test is store_crash_test.c.
//
// OOM: SQLite's allocator is process-global (sqlite3_config before
// initialize), not per connection, so the failing pcp allocator cannot be
// injected under one store; that sweep is left out (docs/decisions.md).

#include "store/store.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* expr, const char* file, int line) {
  pcp_status_code_t actual = pcp_status_code(status);
  if (actual != code) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    print_error("%s:%d: %s: want %s, got %s\n", file, line, expr,
                pcp_status_code_string(code), text);
  }
  pcp_status_ignore(status);
  _assert_int_equal(actual, code, file, line);
}
#define EXPECT_CODE(expr, code) \
  expect_code_at((expr), (code), #expr, __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK)

typedef struct fixture_t {
  char dir[256];
  pcp_clock_manual_t clock;
  pcp_store_t* store;
} fixture_t;

static pcp_store_t* open_store_at(fixture_t* f, int32_t version_limit) {
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  // NORMAL keeps the unit tests fast; FULL is exercised in its own test and
  // in the crash test.
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  options.schema_version_limit = version_limit;
  pcp_store_t* store = NULL;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &store));
  return store;
}

static void reopen(fixture_t* f) {
  pcp_store_release(f->store);
  f->store = open_store_at(f, 0);
}

static int setup(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  const char* tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/pcp-store-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  f->clock.now_ns = 1;
  f->clock.wall_ns = 1700000000000000000;
  f->store = open_store_at(f, 0);
  *state = f;
  return 0;
}

static int teardown(void** state) {
  fixture_t* f = *state;
  if (f->store) {
    EXPECT_OK(pcp_store_integrity_check(f->store));
  }
  pcp_store_release(f->store);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", f->dir);
  if (system(command) != 0) {
    return -1;
  }
  free(f);
  return 0;
}

static void create_job(pcp_store_t* store, const char* id, const char* kind) {
  json_t* spec = json_pack("{s:s}", "program", "main");
  EXPECT_OK(pcp_store_job_create(store, id, kind, spec, NULL));
  json_decref(spec);
}

static void move(pcp_store_t* store, const char* id, pcp_store_job_state_t to) {
  EXPECT_OK(pcp_store_job_transition(store, id, to, NULL, NULL));
}

static pcp_store_job_state_t job_state(pcp_store_t* store, const char* id) {
  pcp_store_job_t job;
  EXPECT_OK(pcp_store_job_get(store, id, &job));
  pcp_store_job_state_t state = job.state;
  pcp_store_job_deinitialize(&job);
  return state;
}

// Runs raw SQL against the database file with a second connection (to
// corrupt, inspect or fake a newer schema).
static int raw_sql(const char* dir, const char* sql) {
  char path[512];
  snprintf(path, sizeof(path), "%s/pcp.db", dir);
  sqlite3* db = NULL;
  int rc = sqlite3_open(path, &db);
  if (rc == SQLITE_OK) {
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  }
  sqlite3_close(db);
  return rc;
}

//===----------------------------------------------------------------------===//
// Opening and migrations
//===----------------------------------------------------------------------===//

static void test_open_creates_wal_database(void** state) {
  fixture_t* f = *state;
  int32_t version = 0;
  EXPECT_OK(pcp_store_schema_version_query(f->store, &version));
  assert_int_equal(version, PCP_STORE_SCHEMA_VERSION);
  create_job(f->store, "j1", "generic");
  char path[512];
  snprintf(path, sizeof(path), "%s/pcp.db-wal", f->dir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);  // WAL mode: the -wal file exists
  // FULL (the default) opens and writes too.
  pcp_store_release(f->store);
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  assert_int_equal(options.sync_mode, PCP_STORE_SYNC_FULL);
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &f->store));
  create_job(f->store, "j2", "generic");
  assert_int_equal(job_state(f->store, "j1"), PCP_STORE_JOB_STATE_QUEUED);
}

static void test_bad_options(void** state) {
  (void)state;
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  pcp_store_t* store = NULL;
  EXPECT_CODE(pcp_store_create(&options, pcp_allocator_system(), &store),
              PCP_STATUS_INVALID_ARGUMENT);
  options.state_dir = "/tmp/x";
  options.schema_version_limit = PCP_STORE_SCHEMA_VERSION + 1;
  EXPECT_CODE(pcp_store_create(&options, pcp_allocator_system(), &store),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_null(store);
}

static void test_migrations_from_empty_step_by_step(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  f->store = NULL;
  char command[512];
  snprintf(command, sizeof(command), "rm -f '%s'/pcp.db*", f->dir);
  assert_int_equal(system(command), 0);
  for (int32_t v = 1; v <= PCP_STORE_SCHEMA_VERSION; ++v) {
    pcp_store_t* store = open_store_at(f, v);
    int32_t version = 0;
    EXPECT_OK(pcp_store_schema_version_query(store, &version));
    assert_int_equal(version, v);
    EXPECT_OK(pcp_store_integrity_check(store));
    pcp_store_release(store);
  }
  f->store = open_store_at(f, 0);
}

static void test_migration_from_previous_version_keeps_data(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  char command[512];
  snprintf(command, sizeof(command), "rm -f '%s'/pcp.db*", f->dir);
  assert_int_equal(system(command), 0);
  // Version 3 (the checkpoint table came in 4): a fixed number, so later
  // migrations do not move what this test exercises.
  f->store = open_store_at(f, 3);
  create_job(f->store, "old-job", "generic");
  move(f->store, "old-job", PCP_STORE_JOB_STATE_PLACING);
  move(f->store, "old-job", PCP_STORE_JOB_STATE_COMPILING);
  move(f->store, "old-job", PCP_STORE_JOB_STATE_RUNNING);
  EXPECT_CODE(pcp_store_checkpoint_write(f->store, "old-job", 0, "x", 1, NULL),
              PCP_STATUS_INTERNAL);
  reopen(f);
  int32_t version = 0;
  EXPECT_OK(pcp_store_schema_version_query(f->store, &version));
  assert_int_equal(version, PCP_STORE_SCHEMA_VERSION);
  assert_int_equal(job_state(f->store, "old-job"), PCP_STORE_JOB_STATE_RUNNING);
  EXPECT_OK(pcp_store_checkpoint_write(f->store, "old-job", 0, "x", 1, NULL));
}

static void test_newer_schema_is_refused(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  f->store = NULL;
  char sql[256];
  snprintf(sql, sizeof(sql),
           "INSERT INTO schema_version(version, applied_at_ns) VALUES (%d, 0)",
           PCP_STORE_SCHEMA_VERSION + 1);
  assert_int_equal(raw_sql(f->dir, sql), SQLITE_OK);
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  pcp_store_t* store = NULL;
  pcp_status_t status =
      pcp_store_create(&options, pcp_allocator_system(), &store);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_FAILED_PRECONDITION);
  assert_non_null(strstr(pcp_status_message(status), "newer than this"));
  pcp_status_ignore(status);
  assert_null(store);
  snprintf(sql, sizeof(sql), "DELETE FROM schema_version WHERE version = %d",
           PCP_STORE_SCHEMA_VERSION + 1);
  assert_int_equal(raw_sql(f->dir, sql), SQLITE_OK);
  f->store = open_store_at(f, 0);
}

static void test_not_a_database_is_data_loss(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  f->store = NULL;
  char command[1024];
  snprintf(command, sizeof(command),
           "rm -f '%s'/pcp.db* && head -c 8192 /dev/urandom > '%s'/pcp.db",
           f->dir, f->dir);
  assert_int_equal(system(command), 0);
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  pcp_store_t* store = NULL;
  EXPECT_CODE(pcp_store_create(&options, pcp_allocator_system(), &store),
              PCP_STATUS_DATA_LOSS);
  snprintf(command, sizeof(command), "rm -f '%s'/pcp.db*", f->dir);
  assert_int_equal(system(command), 0);
  f->store = open_store_at(f, 0);
}

static void test_sqlite_error_mapping(void** state) {
  (void)state;
  struct {
    int rc;
    pcp_status_code_t code;
  } cases[] = {
      {SQLITE_OK, PCP_STATUS_OK},
      {SQLITE_BUSY, PCP_STATUS_UNAVAILABLE},
      {SQLITE_BUSY_SNAPSHOT, PCP_STATUS_UNAVAILABLE},
      {SQLITE_LOCKED, PCP_STATUS_UNAVAILABLE},
      {SQLITE_FULL, PCP_STATUS_RESOURCE_EXHAUSTED},
      {SQLITE_NOMEM, PCP_STATUS_RESOURCE_EXHAUSTED},
      {SQLITE_CONSTRAINT_PRIMARYKEY, PCP_STATUS_ALREADY_EXISTS},
      {SQLITE_CONSTRAINT_UNIQUE, PCP_STATUS_ALREADY_EXISTS},
      {SQLITE_CONSTRAINT_FOREIGNKEY, PCP_STATUS_FAILED_PRECONDITION},
      {SQLITE_CONSTRAINT_CHECK, PCP_STATUS_FAILED_PRECONDITION},
      {SQLITE_CONSTRAINT_TRIGGER, PCP_STATUS_FAILED_PRECONDITION},
      {SQLITE_CORRUPT, PCP_STATUS_DATA_LOSS},
      {SQLITE_NOTADB, PCP_STATUS_DATA_LOSS},
      {SQLITE_IOERR_FSYNC, PCP_STATUS_UNAVAILABLE},
      {SQLITE_READONLY, PCP_STATUS_PERMISSION_DENIED},
      {SQLITE_ERROR, PCP_STATUS_INTERNAL},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(cases); ++i) {
    pcp_status_t status =
        pcp_store_status_from_sqlite(cases[i].rc, "the sqlite message", "op");
    assert_int_equal(pcp_status_code(status), cases[i].code);
    if (status) {
      assert_non_null(strstr(pcp_status_message(status), "the sqlite message"));
    }
    pcp_status_ignore(status);
  }
}

//===----------------------------------------------------------------------===//
// Jobs and the transition table
//===----------------------------------------------------------------------===//

// The table as issue 4 and store.h state it, written out independently of
// jobs.c so that a change to either shows up here.
static const char* const kExpectedAllowed[] = {
    "queued>placing",     "queued>failed",     "queued>cancelled",
    "placing>compiling",  "placing>queued",    "placing>failed",
    "placing>cancelling", "compiling>running", "compiling>placing",
    "compiling>queued",   "compiling>failed",  "compiling>cancelling",
    "running>succeeded",  "running>failed",    "running>cancelling",
    "running>placing",    "running>queued",    "cancelling>cancelled",
    "cancelling>failed",
};

static bool expected_allowed(pcp_store_job_state_t from,
                             pcp_store_job_state_t to) {
  char key[64];
  snprintf(key, sizeof(key), "%s>%s", pcp_store_job_state_name(from),
           pcp_store_job_state_name(to));
  for (size_t i = 0; i < PCP_ARRAYSIZE(kExpectedAllowed); ++i) {
    if (strcmp(kExpectedAllowed[i], key) == 0) {
      return true;
    }
  }
  return false;
}

// A path of legal transitions from queued to |target|.
static void drive_to(pcp_store_t* store, const char* id,
                     pcp_store_job_state_t target) {
  static const pcp_store_job_state_t kPath[] = {PCP_STORE_JOB_STATE_PLACING,
                                                PCP_STORE_JOB_STATE_COMPILING,
                                                PCP_STORE_JOB_STATE_RUNNING};
  switch (target) {
    case PCP_STORE_JOB_STATE_QUEUED:
      return;
    case PCP_STORE_JOB_STATE_CANCELLED:
      move(store, id, PCP_STORE_JOB_STATE_CANCELLED);
      return;
    case PCP_STORE_JOB_STATE_FAILED:
      move(store, id, PCP_STORE_JOB_STATE_FAILED);
      return;
    default:
      break;
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kPath); ++i) {
    move(store, id, kPath[i]);
    if (kPath[i] == target) {
      return;
    }
  }
  move(store, id,
       target == PCP_STORE_JOB_STATE_SUCCEEDED
           ? PCP_STORE_JOB_STATE_SUCCEEDED
           : PCP_STORE_JOB_STATE_CANCELLING);
}

static void test_transition_table_every_pair(void** state) {
  fixture_t* f = *state;
  int allowed_count = 0;
  for (int from = 0; from < PCP_STORE_JOB_STATE_COUNT_; ++from) {
    for (int to = 0; to < PCP_STORE_JOB_STATE_COUNT_; ++to) {
      bool want = expected_allowed((pcp_store_job_state_t)from,
                                   (pcp_store_job_state_t)to);
      assert_int_equal(
          pcp_store_job_transition_is_allowed((pcp_store_job_state_t)from,
                                              (pcp_store_job_state_t)to),
          want);
      char id[64];
      snprintf(id, sizeof(id), "pair-%d-%d", from, to);
      create_job(f->store, id, "generic");
      drive_to(f->store, id, (pcp_store_job_state_t)from);
      assert_int_equal(job_state(f->store, id), from);
      int64_t before = 0;
      EXPECT_OK(pcp_store_job_event_last_id(f->store, &before));
      int64_t event_id = 0;
      pcp_status_t status = pcp_store_job_transition(
          f->store, id, (pcp_store_job_state_t)to, NULL, &event_id);
      int64_t after = 0;
      EXPECT_OK(pcp_store_job_event_last_id(f->store, &after));
      if (want) {
        ++allowed_count;
        EXPECT_OK(status);
        assert_int_equal(job_state(f->store, id), to);
        assert_int_equal(event_id, before + 1);
        assert_int_equal(after, before + 1);
        pcp_store_job_event_list_t events;
        EXPECT_OK(pcp_store_job_event_list(f->store, before, id, 0, &events));
        assert_int_equal(events.count, 1);
        assert_true(events.items[0].has_states);
        assert_int_equal(events.items[0].from_state, from);
        assert_int_equal(events.items[0].to_state, to);
        pcp_store_job_event_list_deinitialize(&events);
      } else {
        // Illegal: FAILED_PRECONDITION, no state change, no event.
        EXPECT_CODE(status, PCP_STATUS_FAILED_PRECONDITION);
        assert_int_equal(job_state(f->store, id), from);
        assert_int_equal(after, before);
      }
    }
  }
  assert_int_equal(allowed_count, (int)PCP_ARRAYSIZE(kExpectedAllowed));
  for (int s = 0; s < PCP_STORE_JOB_STATE_COUNT_; ++s) {
    pcp_store_job_state_t parsed;
    assert_true(pcp_store_job_state_parse(
        pcp_make_cstring_view(pcp_store_job_state_name(s)), &parsed));
    assert_int_equal(parsed, s);
  }
  EXPECT_CODE(pcp_store_job_transition(f->store, "missing",
                                       PCP_STORE_JOB_STATE_PLACING, NULL, NULL),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_store_job_transition(f->store, "pair-0-0",
                                       PCP_STORE_JOB_STATE_COUNT_, NULL, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
}

static void test_job_lifecycle_fields(void** state) {
  fixture_t* f = *state;
  json_t* spec = json_pack("{s:s, s:i}", "program", "add", "workers", 2);
  int64_t first_event = 0;
  EXPECT_OK(
      pcp_store_job_create(f->store, "job-1", "generic", spec, &first_event));
  EXPECT_CODE(pcp_store_job_create(f->store, "job-1", "generic", spec, NULL),
              PCP_STATUS_ALREADY_EXISTS);
  json_decref(spec);
  assert_true(first_event > 0);

  pcp_store_job_t job;
  EXPECT_OK(pcp_store_job_get(f->store, "job-1", &job));
  assert_string_equal(job.kind, "generic");
  assert_int_equal(job.state, PCP_STORE_JOB_STATE_QUEUED);
  assert_int_equal(json_integer_value(json_object_get(job.spec, "workers")), 2);
  assert_null(job.placement);
  assert_int_equal(job.attempt, 0);
  assert_int_equal(job.last_committed_step, -1);
  assert_int_equal(job.created_at_ns, f->clock.wall_ns);
  pcp_store_job_deinitialize(&job);

  pcp_clock_manual_advance(&f->clock, 1000);
  json_t* placement = json_pack("{s:[s,s]}", "workers", "w1", "w2");
  pcp_store_job_transition_params_t params = {.placement = placement};
  EXPECT_OK(pcp_store_job_transition(
      f->store, "job-1", PCP_STORE_JOB_STATE_PLACING, &params, NULL));
  json_decref(placement);
  move(f->store, "job-1", PCP_STORE_JOB_STATE_COMPILING);
  // Steps commit only while running.
  EXPECT_CODE(pcp_store_job_step_commit(f->store, "job-1", 0, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  move(f->store, "job-1", PCP_STORE_JOB_STATE_RUNNING);
  EXPECT_OK(pcp_store_job_step_commit(f->store, "job-1", 0, NULL));
  EXPECT_OK(pcp_store_job_step_commit(f->store, "job-1", 5, NULL));
  EXPECT_CODE(pcp_store_job_step_commit(f->store, "job-1", 5, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_store_job_step_commit(f->store, "job-1", -1, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  // Worker lost: back to placing (attempt 2), keeping the committed step.
  move(f->store, "job-1", PCP_STORE_JOB_STATE_PLACING);
  pcp_store_job_transition_params_t failure = {.error = "worker w2 lost"};
  EXPECT_OK(pcp_store_job_transition(
      f->store, "job-1", PCP_STORE_JOB_STATE_FAILED, &failure, NULL));
  EXPECT_OK(pcp_store_job_get(f->store, "job-1", &job));
  assert_int_equal(job.state, PCP_STORE_JOB_STATE_FAILED);
  assert_int_equal(job.attempt, 2);
  assert_int_equal(job.last_committed_step, 5);
  assert_string_equal(job.error, "worker w2 lost");
  assert_string_equal(json_string_value(json_array_get(
                          json_object_get(job.placement, "workers"), 1)),
                      "w2");
  assert_int_equal(job.updated_at_ns, f->clock.wall_ns);
  assert_true(pcp_store_job_state_is_terminal(job.state));
  pcp_store_job_deinitialize(&job);

  // Events of the job, in order: queued, placing, compiling, running, step 0,
  // step 5, placing, failed.
  pcp_store_job_event_list_t events;
  EXPECT_OK(pcp_store_job_event_list(f->store, 0, "job-1", 0, &events));
  assert_int_equal(events.count, 8);
  assert_string_equal(events.items[0].type, "state");
  assert_false(events.items[0].has_from_state);
  assert_int_equal(events.items[0].to_state, PCP_STORE_JOB_STATE_QUEUED);
  assert_string_equal(events.items[4].type, "step");
  assert_int_equal(
      json_integer_value(json_object_get(events.items[5].payload, "step")), 5);
  assert_string_equal(
      json_string_value(json_object_get(events.items[7].payload, "error")),
      "worker w2 lost");
  for (size_t i = 1; i < events.count; ++i) {
    assert_true(events.items[i].event_id > events.items[i - 1].event_id);
  }
  pcp_store_job_event_list_deinitialize(&events);

  // Custom events.
  json_t* progress = json_pack("{s:f}", "loss", 0.5);
  int64_t custom = 0;
  EXPECT_OK(pcp_store_job_event_append(f->store, "job-1", "progress", progress,
                                       &custom));
  EXPECT_CODE(
      pcp_store_job_event_append(f->store, "job-1", "state", progress, NULL),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(
      pcp_store_job_event_append(f->store, "nope", "progress", progress, NULL),
      PCP_STATUS_NOT_FOUND);
  json_decref(progress);
  int64_t last = 0;
  EXPECT_OK(pcp_store_job_event_last_id(f->store, &last));
  assert_int_equal(last, custom);
}

static void test_job_list_filters(void** state) {
  fixture_t* f = *state;
  for (int i = 0; i < 12; ++i) {
    char id[32];
    snprintf(id, sizeof(id), "j%02d", i);
    create_job(f->store, id, i % 2 ? "train" : "generic");
    if (i % 3 == 1) {
      move(f->store, id, PCP_STORE_JOB_STATE_PLACING);
    } else if (i % 3 == 2) {
      move(f->store, id, PCP_STORE_JOB_STATE_CANCELLED);
    }
  }
  pcp_store_job_list_t list;
  EXPECT_OK(pcp_store_job_list(f->store, NULL, &list));
  assert_int_equal(list.count, 12);
  assert_string_equal(list.items[0].id, "j00");
  assert_string_equal(list.items[11].id, "j11");
  pcp_store_job_list_deinitialize(&list);

  pcp_store_job_filter_t filter = {
      .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_PLACING)};
  EXPECT_OK(pcp_store_job_list(f->store, &filter, &list));
  assert_int_equal(list.count, 4);  // 1, 4, 7, 10
  for (size_t i = 0; i < list.count; ++i) {
    assert_int_equal(list.items[i].state, PCP_STORE_JOB_STATE_PLACING);
  }
  pcp_store_job_list_deinitialize(&list);

  filter.kind = "train";
  EXPECT_OK(pcp_store_job_list(f->store, &filter, &list));
  assert_int_equal(list.count, 2);  // 1, 7
  assert_string_equal(list.items[1].id, "j07");
  pcp_store_job_list_deinitialize(&list);

  // Paging: after j03, two at a time.
  pcp_store_job_filter_t page = {.after_id = "j03", .limit = 2};
  EXPECT_OK(pcp_store_job_list(f->store, &page, &list));
  assert_int_equal(list.count, 2);
  assert_string_equal(list.items[0].id, "j04");
  assert_string_equal(list.items[1].id, "j05");
  pcp_store_job_list_deinitialize(&list);
  page.after_id = "nope";
  EXPECT_CODE(pcp_store_job_list(f->store, &page, &list), PCP_STATUS_NOT_FOUND);
  pcp_store_job_filter_t bad = {.states = 1u << 9};
  EXPECT_CODE(pcp_store_job_list(f->store, &bad, &list),
              PCP_STATUS_INVALID_ARGUMENT);

  // Resume: placing/compiling/running/cancelling only.
  move(f->store, "j01", PCP_STORE_JOB_STATE_COMPILING);
  move(f->store, "j01", PCP_STORE_JOB_STATE_RUNNING);
  move(f->store, "j04", PCP_STORE_JOB_STATE_CANCELLING);
  reopen(f);
  EXPECT_OK(pcp_store_job_resume_list(f->store, NULL, 0, &list));
  assert_int_equal(list.count, 4);
  assert_string_equal(list.items[0].id, "j01");
  assert_int_equal(list.items[0].state, PCP_STORE_JOB_STATE_RUNNING);
  assert_int_equal(list.items[1].state, PCP_STORE_JOB_STATE_CANCELLING);
  pcp_store_job_list_deinitialize(&list);
}

static void test_event_ids_monotonic_across_reopen(void** state) {
  fixture_t* f = *state;
  create_job(f->store, "a", "generic");
  create_job(f->store, "b", "generic");
  int64_t ids[6];
  EXPECT_OK(pcp_store_job_event_append(f->store, "a", "log", NULL, &ids[0]));
  EXPECT_OK(pcp_store_job_event_append(f->store, "b", "log", NULL, &ids[1]));
  EXPECT_OK(pcp_store_job_transition(f->store, "a", PCP_STORE_JOB_STATE_PLACING,
                                     NULL, &ids[2]));
  reopen(f);
  EXPECT_OK(pcp_store_job_event_append(f->store, "a", "log", NULL, &ids[3]));
  reopen(f);
  EXPECT_OK(pcp_store_job_transition(
      f->store, "b", PCP_STORE_JOB_STATE_CANCELLED, NULL, &ids[4]));
  EXPECT_OK(pcp_store_job_event_append(f->store, "b", "log", NULL, &ids[5]));
  for (int i = 1; i < 6; ++i) {
    assert_true(ids[i] > ids[i - 1]);
  }
  // Resuming from an id (SSE Last-Event-ID) returns exactly the later ones.
  pcp_store_job_event_list_t events;
  EXPECT_OK(pcp_store_job_event_list(f->store, ids[2], NULL, 0, &events));
  assert_int_equal(events.count, 3);
  assert_int_equal(events.items[0].event_id, ids[3]);
  assert_int_equal(events.items[2].event_id, ids[5]);
  pcp_store_job_event_list_deinitialize(&events);
  int64_t last = 0;
  EXPECT_OK(pcp_store_job_event_last_id(f->store, &last));
  assert_int_equal(last, ids[5]);
  // The table is append-only even for a second connection.
  assert_int_not_equal(raw_sql(f->dir, "DELETE FROM job_events"), SQLITE_OK);
  assert_int_not_equal(raw_sql(f->dir, "UPDATE job_events SET type = 'x'"),
                       SQLITE_OK);
}

static void test_job_results(void** state) {
  fixture_t* f = *state;
  create_job(f->store, "r1", "generic");
  pcp_store_job_result_t result = {
      .job_id = "r1",
      .name = "out0",
      .dtype = PCP_ELEMENT_TYPE_F32,
      .rank = 2,
      .shape = {2, 3},
      .byte_length = 24,
      .path = "/var/pcp/results/r1/out0.bin",
  };
  pcp_sha256_compute("abc", 3, &result.sha256);
  EXPECT_OK(pcp_store_job_result_put(f->store, &result));
  EXPECT_CODE(pcp_store_job_result_put(f->store, &result),
              PCP_STATUS_ALREADY_EXISTS);
  pcp_store_job_result_t other = result;
  snprintf(other.name, sizeof(other.name), "a_scalar");
  other.dtype = PCP_ELEMENT_TYPE_I64;
  other.rank = 0;
  other.byte_length = 8;
  EXPECT_OK(pcp_store_job_result_put(f->store, &other));
  // Disagreeing shape and length, unknown dtype, unknown job.
  other.byte_length = 9;
  snprintf(other.name, sizeof(other.name), "bad");
  EXPECT_CODE(pcp_store_job_result_put(f->store, &other),
              PCP_STATUS_INVALID_ARGUMENT);
  other.byte_length = 8;
  other.dtype = PCP_ELEMENT_TYPE_UNKNOWN;
  EXPECT_CODE(pcp_store_job_result_put(f->store, &other),
              PCP_STATUS_INVALID_ARGUMENT);
  other.dtype = PCP_ELEMENT_TYPE_I64;
  other.rank = PCP_MAX_TENSOR_RANK + 1;
  EXPECT_CODE(pcp_store_job_result_put(f->store, &other),
              PCP_STATUS_INVALID_ARGUMENT);
  other.rank = 0;
  snprintf(other.job_id, sizeof(other.job_id), "no-such-job");
  EXPECT_CODE(pcp_store_job_result_put(f->store, &other), PCP_STATUS_NOT_FOUND);

  pcp_store_job_result_t read;
  EXPECT_OK(pcp_store_job_result_get(f->store, "r1", "out0", &read));
  assert_int_equal(read.dtype, PCP_ELEMENT_TYPE_F32);
  assert_int_equal(read.rank, 2);
  assert_int_equal(read.shape[1], 3);
  assert_int_equal(read.byte_length, 24);
  assert_memory_equal(read.sha256.bytes, result.sha256.bytes, 32);
  assert_string_equal(read.path, result.path);
  EXPECT_CODE(pcp_store_job_result_get(f->store, "r1", "zzz", &read),
              PCP_STATUS_NOT_FOUND);
  pcp_store_job_result_list_t list;
  EXPECT_OK(pcp_store_job_result_list(f->store, "r1", &list));
  assert_int_equal(list.count, 2);
  assert_string_equal(list.items[0].name, "a_scalar");
  assert_int_equal(list.items[0].rank, 0);
  pcp_store_job_result_list_deinitialize(&list);
}

//===----------------------------------------------------------------------===//
// Services
//===----------------------------------------------------------------------===//

static void test_service_ttl_and_sweep(void** state) {
  fixture_t* f = *state;
  const int64_t kSecond = 1000000000;
  pcp_store_service_t service = {
      .executor_id = "gw:training:t1",
      .service_id = "t1",
      .service_type = "training",
      .base_url = "http://127.0.0.1:9001",
      .ttl_ns = 10 * kSecond,
  };
  service.attributes = json_pack("{s:i, s:[s]}", "workers_available", 2,
                                 "capabilities", "job.cancel");
  EXPECT_OK(pcp_store_service_register(f->store, &service));
  json_decref(service.attributes);
  service.attributes = NULL;
  pcp_store_service_t other = service;
  snprintf(other.executor_id, sizeof(other.executor_id), "gw:rl:r1");
  other.ttl_ns = 30 * kSecond;
  EXPECT_OK(pcp_store_service_register(f->store, &other));
  int64_t registered_at = f->clock.wall_ns;

  pcp_clock_manual_advance(&f->clock, 6 * kSecond);
  EXPECT_OK(pcp_store_service_heartbeat(f->store, "gw:training:t1"));
  EXPECT_CODE(pcp_store_service_heartbeat(f->store, "gw:nope"),
              PCP_STATUS_NOT_FOUND);
  // Re-registration keeps registered_at and restarts the TTL.
  pcp_clock_manual_advance(&f->clock, 1 * kSecond);
  EXPECT_OK(pcp_store_service_register(f->store, &service));
  pcp_store_service_t read;
  EXPECT_OK(pcp_store_service_get(f->store, "gw:training:t1", &read));
  assert_int_equal(read.registered_at_ns, registered_at);
  assert_int_equal(read.updated_at_ns, f->clock.wall_ns);
  assert_int_equal(read.expires_at_ns, f->clock.wall_ns + 10 * kSecond);
  assert_false(read.expired);
  assert_true(json_is_object(read.attributes));
  pcp_store_service_deinitialize(&read);

  // Nothing has expired yet.
  pcp_store_service_list_t swept;
  EXPECT_OK(pcp_store_service_expired_sweep(f->store, &swept));
  assert_int_equal(swept.count, 0);
  pcp_store_service_list_deinitialize(&swept);

  // 10 s after the last registration: expired, reported as such, refused a
  // heartbeat, then swept (and only that one).
  pcp_clock_manual_advance(&f->clock, 10 * kSecond);
  EXPECT_OK(pcp_store_service_get(f->store, "gw:training:t1", &read));
  assert_true(read.expired);
  pcp_store_service_deinitialize(&read);
  EXPECT_CODE(pcp_store_service_heartbeat(f->store, "gw:training:t1"),
              PCP_STATUS_FAILED_PRECONDITION);
  reopen(f);  // expiry is wall-clock based and survives a restart
  EXPECT_OK(pcp_store_service_expired_sweep(f->store, &swept));
  assert_int_equal(swept.count, 1);
  assert_string_equal(swept.items[0].executor_id, "gw:training:t1");
  assert_true(swept.items[0].expired);
  pcp_store_service_list_deinitialize(&swept);
  EXPECT_CODE(pcp_store_service_get(f->store, "gw:training:t1", &read),
              PCP_STATUS_NOT_FOUND);

  pcp_store_service_list_t list;
  EXPECT_OK(pcp_store_service_list(f->store, NULL, 0, &list));
  assert_int_equal(list.count, 1);
  assert_string_equal(list.items[0].executor_id, "gw:rl:r1");
  pcp_store_service_list_deinitialize(&list);
  EXPECT_OK(pcp_store_service_delete(f->store, "gw:rl:r1"));
  EXPECT_CODE(pcp_store_service_delete(f->store, "gw:rl:r1"),
              PCP_STATUS_NOT_FOUND);
  other.ttl_ns = 0;
  EXPECT_CODE(pcp_store_service_register(f->store, &other),
              PCP_STATUS_INVALID_ARGUMENT);
}

//===----------------------------------------------------------------------===//
// Leases and reservations
//===----------------------------------------------------------------------===//

static void test_leases_and_reservations(void** state) {
  fixture_t* f = *state;
  pcp_store_lease_t lease = {.lease_id = 7,
                             .owner = "jobs",
                             .worker_id = "w-1",
                             .tag = 42,
                             .job_id = "job-9"};
  EXPECT_OK(pcp_store_lease_put(f->store, &lease));
  lease.lease_id = 3;
  snprintf(lease.worker_id, sizeof(lease.worker_id), "w-2");
  EXPECT_OK(pcp_store_lease_put(f->store, &lease));
  // Detach lease 3 (no worker, a deadline): an upsert.
  lease.worker_id[0] = '\0';
  lease.deadline_ns = 123;
  EXPECT_OK(pcp_store_lease_put(f->store, &lease));
  lease.lease_id = 0;
  EXPECT_CODE(pcp_store_lease_put(f->store, &lease),
              PCP_STATUS_INVALID_ARGUMENT);
  lease.lease_id = UINT64_MAX;
  EXPECT_CODE(pcp_store_lease_put(f->store, &lease),
              PCP_STATUS_INVALID_ARGUMENT);

  pcp_store_worker_id_t workers[3] = {{"w-3"}, {"w-4"}, {"w-5"}};
  pcp_store_reservation_t reservation = {.reservation_id = 11,
                                         .owner = "training",
                                         .tag = 5,
                                         .deadline_ns = 999,
                                         .worker_ids = workers,
                                         .worker_count = 3};
  EXPECT_OK(pcp_store_reservation_put(f->store, &reservation));
  EXPECT_CODE(pcp_store_reservation_put(f->store, &reservation),
              PCP_STATUS_ALREADY_EXISTS);
  pcp_store_worker_id_t twice[2] = {{"w-6"}, {"w-6"}};
  pcp_store_reservation_t bad = {.reservation_id = 12,
                                 .owner = "training",
                                 .worker_ids = twice,
                                 .worker_count = 2};
  EXPECT_CODE(pcp_store_reservation_put(f->store, &bad),
              PCP_STATUS_INVALID_ARGUMENT);
  bad.worker_count = 0;
  EXPECT_CODE(pcp_store_reservation_put(f->store, &bad),
              PCP_STATUS_INVALID_ARGUMENT);

  reopen(f);  // the point of the mirror: a restart can rebuild
  pcp_store_lease_list_t leases;
  EXPECT_OK(pcp_store_lease_list(f->store, 0, 0, &leases));
  assert_int_equal(leases.count, 2);
  assert_int_equal(leases.items[0].lease_id, 3);
  assert_string_equal(leases.items[0].worker_id, "");
  assert_int_equal(leases.items[0].deadline_ns, 123);
  assert_int_equal(leases.items[1].lease_id, 7);
  assert_int_equal(leases.items[1].tag, 42);
  assert_string_equal(leases.items[1].job_id, "job-9");
  pcp_store_lease_list_deinitialize(&leases);
  pcp_store_lease_t read;
  EXPECT_OK(pcp_store_lease_get(f->store, 7, &read));
  assert_string_equal(read.worker_id, "w-1");
  EXPECT_OK(pcp_store_lease_delete(f->store, 7));
  EXPECT_CODE(pcp_store_lease_delete(f->store, 7), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_store_lease_get(f->store, 7, &read), PCP_STATUS_NOT_FOUND);
  uint64_t high_water = 0;
  EXPECT_OK(pcp_store_lease_id_high_water_query(f->store, &high_water));
  assert_int_equal(high_water, 7);  // deleted ids still count

  pcp_store_reservation_list_t reservations;
  EXPECT_OK(pcp_store_reservation_list(f->store, 0, 0, &reservations));
  assert_int_equal(reservations.count, 1);
  assert_int_equal(reservations.items[0].worker_count, 3);
  assert_string_equal(reservations.items[0].worker_ids[2].value, "w-5");
  assert_string_equal(reservations.items[0].owner, "training");
  assert_int_equal(reservations.items[0].deadline_ns, 999);
  pcp_store_reservation_list_deinitialize(&reservations);
  EXPECT_OK(pcp_store_reservation_delete(f->store, 11));
  EXPECT_CODE(pcp_store_reservation_delete(f->store, 11), PCP_STATUS_NOT_FOUND);
  EXPECT_OK(pcp_store_reservation_list(f->store, 0, 0, &reservations));
  assert_int_equal(reservations.count, 0);
  pcp_store_reservation_list_deinitialize(&reservations);
}

//===----------------------------------------------------------------------===//
// Graph
//===----------------------------------------------------------------------===//

static void put_entity(fixture_t* f, const char* id, const char* type,
                       const char* name) {
  pcp_store_graph_entity_t e = {.namespace_id = "lab/shared"};
  snprintf(e.entity_id, sizeof(e.entity_id), "%s", id);
  snprintf(e.entity_type, sizeof(e.entity_type), "%s", type);
  snprintf(e.display_name, sizeof(e.display_name), "%s", name);
  e.properties = json_pack("{s:s}", "note", name);
  EXPECT_OK(pcp_store_graph_entity_upsert(f->store, &e));
  json_decref(e.properties);
  pcp_clock_manual_advance(&f->clock, 10);
}

static void put_relation(fixture_t* f, const char* id, const char* type,
                         const char* from, const char* to) {
  pcp_store_graph_relation_t r = {.namespace_id = "lab/shared"};
  snprintf(r.relation_id, sizeof(r.relation_id), "%s", id);
  snprintf(r.relation_type, sizeof(r.relation_type), "%s", type);
  snprintf(r.from_entity_id, sizeof(r.from_entity_id), "%s", from);
  snprintf(r.to_entity_id, sizeof(r.to_entity_id), "%s", to);
  EXPECT_OK(pcp_store_graph_relation_upsert(f->store, &r));
  pcp_clock_manual_advance(&f->clock, 10);
}

static void test_graph_queries(void** state) {
  fixture_t* f = *state;
  put_entity(f, "model:gpt", "model", "GPT small");
  put_entity(f, "data:shakespeare", "dataset", "Tiny Shakespeare");
  put_entity(f, "job:1", "training_job", "first run");
  put_entity(f, "job:2", "training_job", "second run");
  put_relation(f, "r1", "trains", "job:1", "model:gpt");
  put_relation(f, "r2", "reads", "job:1", "data:shakespeare");
  put_relation(f, "r3", "trains", "job:2", "model:gpt");
  put_relation(f, "r4", "reads", "job:2", "data:missing");  // dangling end
  pcp_store_graph_observation_t o = {.observation_id = "obs1",
                                     .namespace_id = "lab/shared",
                                     .subject_entity_id = "job:1",
                                     .observation_type = "loss"};
  o.payload = json_pack("{s:f}", "loss", 1.25);
  EXPECT_OK(pcp_store_graph_observation_append(f->store, &o));
  json_decref(o.payload);

  // By entity: the entity, its relations, its observations.
  pcp_store_graph_query_t by_entity = {.entity_id = "job:1"};
  pcp_store_graph_result_t result;
  EXPECT_OK(pcp_store_graph_query(f->store, &by_entity, &result));
  assert_int_equal(result.entity_count, 1);
  assert_string_equal(result.entities[0].display_name, "first run");
  assert_int_equal(result.relation_count, 2);
  assert_string_equal(result.relations[0].relation_id, "r2");  // newest first
  assert_int_equal(result.observation_count, 1);
  assert_true(json_real_value(json_object_get(result.observations[0].payload,
                                              "loss")) == 1.25);
  pcp_store_graph_result_deinitialize(&result);

  // By relation type: edges only.
  pcp_store_graph_query_t by_type = {.relation_type = "trains"};
  EXPECT_OK(pcp_store_graph_query(f->store, &by_type, &result));
  assert_int_equal(result.entity_count, 0);
  assert_int_equal(result.relation_count, 2);
  assert_int_equal(result.observation_count, 0);
  pcp_store_graph_result_deinitialize(&result);

  // By entity type, with a limit; and a text search.
  pcp_store_graph_query_t by_entity_type = {.entity_type = "training_job",
                                            .limit = 1};
  EXPECT_OK(pcp_store_graph_query(f->store, &by_entity_type, &result));
  assert_int_equal(result.entity_count, 1);
  assert_string_equal(result.entities[0].entity_id, "job:2");
  assert_int_equal(result.relation_count, 0);
  pcp_store_graph_result_deinitialize(&result);
  pcp_store_graph_query_t by_text = {.text = "Shakespeare"};
  EXPECT_OK(pcp_store_graph_query(f->store, &by_text, &result));
  assert_int_equal(result.entity_count, 1);
  assert_string_equal(result.entities[0].entity_id, "data:shakespeare");
  pcp_store_graph_result_deinitialize(&result);
  pcp_store_graph_query_t wildcard = {.text = "%"};  // literal, no wildcard
  EXPECT_OK(pcp_store_graph_query(f->store, &wildcard, &result));
  assert_int_equal(result.entity_count, 0);
  pcp_store_graph_result_deinitialize(&result);

  // Neighbours.
  EXPECT_OK(pcp_store_graph_neighbors_list(
      f->store, "model:gpt", NULL, PCP_STORE_GRAPH_DIRECTION_IN, 0, &result));
  assert_int_equal(result.entity_count, 2);
  assert_int_equal(result.relation_count, 2);
  pcp_store_graph_result_deinitialize(&result);
  EXPECT_OK(pcp_store_graph_neighbors_list(
      f->store, "model:gpt", NULL, PCP_STORE_GRAPH_DIRECTION_OUT, 0, &result));
  assert_int_equal(result.entity_count, 0);
  pcp_store_graph_result_deinitialize(&result);
  EXPECT_OK(pcp_store_graph_neighbors_list(
      f->store, "job:2", "reads", PCP_STORE_GRAPH_DIRECTION_BOTH, 0, &result));
  assert_int_equal(result.relation_count, 1);
  assert_int_equal(result.entity_count, 0);  // data:missing does not exist
  pcp_store_graph_result_deinitialize(&result);

  // Upsert keeps created_at; delete cascades to relations and observations.
  pcp_store_graph_entity_t before;
  EXPECT_OK(pcp_store_graph_entity_get(f->store, "job:1", &before));
  put_entity(f, "job:1", "training_job", "renamed");
  pcp_store_graph_entity_t after;
  EXPECT_OK(pcp_store_graph_entity_get(f->store, "job:1", &after));
  assert_int_equal(after.created_at_ns, before.created_at_ns);
  assert_true(after.updated_at_ns > before.updated_at_ns);
  assert_string_equal(after.display_name, "renamed");
  pcp_store_graph_entity_deinitialize(&before);
  pcp_store_graph_entity_deinitialize(&after);
  EXPECT_OK(pcp_store_graph_entity_delete(f->store, "job:1"));
  EXPECT_CODE(pcp_store_graph_entity_delete(f->store, "job:1"),
              PCP_STATUS_NOT_FOUND);
  EXPECT_OK(pcp_store_graph_query(f->store, &by_entity, &result));
  assert_int_equal(
      result.entity_count + result.relation_count + result.observation_count,
      0);
  pcp_store_graph_result_deinitialize(&result);
  EXPECT_OK(pcp_store_graph_relation_delete(f->store, "r3"));
  EXPECT_CODE(pcp_store_graph_relation_delete(f->store, "r3"),
              PCP_STATUS_NOT_FOUND);
  // Properties must be an object.
  pcp_store_graph_entity_t e = {
      .entity_id = "x", .namespace_id = "n", .entity_type = "t"};
  e.properties = json_integer(3);
  EXPECT_CODE(pcp_store_graph_entity_upsert(f->store, &e),
              PCP_STATUS_INVALID_ARGUMENT);
  json_decref(e.properties);
}

static void test_mutation_log_order_and_apply(void** state) {
  fixture_t* f = *state;
  pcp_store_mutation_t m = {.namespace_id = "lab/shared",
                            .mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY,
                            .target_id = "job:7",
                            .visibility = PCP_STORE_VISIBILITY_SHARED};
  m.payload = json_pack("{s:s, s:{s:i}}", "entity_type", "training_job",
                        "properties", "steps", 10);
  int64_t seq = 0;
  bool duplicate = true;
  EXPECT_OK(pcp_store_graph_mutation_apply(f->store, &m, &seq, &duplicate));
  json_decref(m.payload);
  assert_int_equal(seq, 1);
  assert_false(duplicate);

  pcp_store_mutation_t rel = {
      .mutation_id = "ev1:rel",
      .namespace_id = "lab/shared",
      .mutation_type = PCP_STORE_MUTATION_UPSERT_RELATION,
      .target_id = "rel:1"};
  rel.payload = json_pack("{s:s, s:s, s:s}", "relation_type", "uses",
                          "from_entity_id", "job:7", "to_entity_id", "gpu:0");
  EXPECT_OK(pcp_store_graph_mutation_apply(f->store, &rel, &seq, &duplicate));
  assert_int_equal(seq, 2);
  // Idempotent by mutation_id: same sequence number, nothing new.
  EXPECT_OK(pcp_store_graph_mutation_apply(f->store, &rel, &seq, &duplicate));
  assert_int_equal(seq, 2);
  assert_true(duplicate);
  json_decref(rel.payload);

  pcp_store_mutation_t obs = {
      .mutation_id = "ev1:obs",
      .namespace_id = "lab/shared",
      .mutation_type = PCP_STORE_MUTATION_APPEND_OBSERVATION,
      .target_id = "ev1",
      .timestamp_ns = 5};
  obs.payload =
      json_pack("{s:s, s:s, s:{s:i}}", "observation_type", "training.step",
                "subject_entity_id", "job:7", "payload", "step", 3);
  EXPECT_OK(pcp_store_graph_mutation_apply(f->store, &obs, &seq, NULL));
  json_decref(obs.payload);
  assert_int_equal(seq, 3);

  // A bad payload applies nothing and logs nothing.
  pcp_store_mutation_t bad = {
      .namespace_id = "lab/shared",
      .mutation_type = PCP_STORE_MUTATION_UPSERT_RELATION,
      .target_id = "rel:2"};
  bad.payload = json_pack("{s:s}", "relation_type", "uses");
  EXPECT_CODE(pcp_store_graph_mutation_apply(f->store, &bad, &seq, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  json_decref(bad.payload);
  pcp_store_mutation_t del = {.namespace_id = "lab/shared",
                              .mutation_type = PCP_STORE_MUTATION_DELETE_ENTITY,
                              .target_id = "job:none"};
  EXPECT_CODE(pcp_store_graph_mutation_apply(f->store, &del, &seq, NULL),
              PCP_STATUS_NOT_FOUND);
  // Log-only append (replicated record applied elsewhere).
  pcp_store_mutation_t policy = {
      .namespace_id = "lab/shared",
      .mutation_type = PCP_STORE_MUTATION_POLICY_UPDATE,
      .target_id = "lab/shared"};
  EXPECT_OK(pcp_store_mutation_append(f->store, &policy, &seq, NULL));
  assert_int_equal(seq, 4);

  reopen(f);
  pcp_store_mutation_list_t log;
  EXPECT_OK(pcp_store_mutation_list(f->store, 0, 0, &log));
  assert_int_equal(log.count, 4);
  for (size_t i = 0; i < log.count; ++i) {
    assert_int_equal(log.items[i].sequence_no, (int64_t)i + 1);
  }
  assert_string_equal(log.items[0].mutation_id, "mut_1");
  assert_string_equal(log.items[1].mutation_id, "ev1:rel");
  assert_int_equal(log.items[2].mutation_type,
                   PCP_STORE_MUTATION_APPEND_OBSERVATION);
  assert_int_equal(log.items[2].timestamp_ns, 5);
  assert_int_equal(log.items[0].visibility, PCP_STORE_VISIBILITY_SHARED);
  assert_string_equal(log.items[3].mutation_id, "mut_4");
  pcp_store_mutation_list_deinitialize(&log);
  EXPECT_OK(pcp_store_mutation_list(f->store, 2, 1, &log));
  assert_int_equal(log.count, 1);
  assert_int_equal(log.items[0].sequence_no, 3);
  pcp_store_mutation_list_deinitialize(&log);

  // The graph holds what the log says was applied.
  pcp_store_graph_entity_t entity;
  EXPECT_OK(pcp_store_graph_entity_get(f->store, "job:7", &entity));
  assert_string_equal(entity.display_name, "job:7");  // default: target id
  assert_int_equal(
      json_integer_value(json_object_get(entity.properties, "steps")), 10);
  pcp_store_graph_entity_deinitialize(&entity);
  pcp_store_graph_query_t q = {.entity_id = "job:7"};
  pcp_store_graph_result_t result;
  EXPECT_OK(pcp_store_graph_query(f->store, &q, &result));
  assert_int_equal(result.relation_count, 1);
  assert_int_equal(result.observation_count, 1);
  assert_int_equal(json_integer_value(
                       json_object_get(result.observations[0].payload, "step")),
                   3);
  pcp_store_graph_result_deinitialize(&result);

  // Replication marks.
  pcp_store_mutation_log_stats_t stats;
  EXPECT_OK(pcp_store_mutation_log_stats_query(f->store, &stats));
  assert_int_equal(stats.last_sequence_no, 4);
  assert_int_equal(stats.last_replicated_sequence, 0);
  assert_int_equal(stats.pending_count, 4);
  EXPECT_OK(pcp_store_mutation_replicated_mark(f->store, 3));
  EXPECT_OK(pcp_store_mutation_replicated_mark(f->store, 1));  // no lowering
  EXPECT_CODE(pcp_store_mutation_replicated_mark(f->store, 5),
              PCP_STATUS_OUT_OF_RANGE);
  EXPECT_OK(pcp_store_mutation_log_stats_query(f->store, &stats));
  assert_int_equal(stats.last_replicated_sequence, 3);
  assert_int_equal(stats.pending_count, 1);
  // Append-only against a second connection too.
  assert_int_not_equal(raw_sql(f->dir, "DELETE FROM mutation_log"), SQLITE_OK);
  assert_int_not_equal(
      raw_sql(f->dir, "UPDATE mutation_log SET target_id = 'x'"), SQLITE_OK);
}

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

static void test_checkpoint_write_index_verify(void** state) {
  fixture_t* f = *state;
  create_job(f->store, "ck", "train");
  EXPECT_CODE(pcp_store_checkpoint_write(f->store, "ck", 0, "x", 1, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_store_checkpoint_write(f->store, "none", 0, "x", 1, NULL),
              PCP_STATUS_NOT_FOUND);
  move(f->store, "ck", PCP_STORE_JOB_STATE_PLACING);
  move(f->store, "ck", PCP_STORE_JOB_STATE_COMPILING);
  move(f->store, "ck", PCP_STORE_JOB_STATE_RUNNING);
  uint8_t weights[4096];
  for (size_t i = 0; i < sizeof(weights); ++i) {
    weights[i] = (uint8_t)(i * 7);
  }
  pcp_store_checkpoint_t written;
  EXPECT_OK(pcp_store_checkpoint_write(f->store, "ck", 10, weights,
                                       sizeof(weights), &written));
  EXPECT_OK(pcp_store_checkpoint_verify(&written));
  weights[0] ^= 1;
  EXPECT_OK(pcp_store_checkpoint_write(f->store, "ck", 20, weights,
                                       sizeof(weights), NULL));
  EXPECT_OK(pcp_store_checkpoint_write(f->store, "ck", 15, "", 0, NULL));
  // A step that already has a checkpoint is refused and its file untouched.
  EXPECT_CODE(pcp_store_checkpoint_write(f->store, "ck", 10, "other", 5, NULL),
              PCP_STATUS_ALREADY_EXISTS);
  EXPECT_OK(pcp_store_checkpoint_verify(&written));

  pcp_store_job_t job;
  EXPECT_OK(pcp_store_job_get(f->store, "ck", &job));
  assert_int_equal(job.last_committed_step, 20);
  pcp_store_job_deinitialize(&job);

  reopen(f);
  pcp_store_checkpoint_t latest;
  EXPECT_OK(pcp_store_checkpoint_get(f->store, "ck", -1, &latest));
  assert_int_equal(latest.step, 20);
  assert_int_equal(latest.byte_length, sizeof(weights));
  pcp_sha256_t digest;
  pcp_sha256_compute(weights, sizeof(weights), &digest);
  assert_memory_equal(latest.sha256.bytes, digest.bytes, 32);
  EXPECT_OK(pcp_store_checkpoint_verify(&latest));
  pcp_store_checkpoint_list_t list;
  EXPECT_OK(pcp_store_checkpoint_list(f->store, "ck", &list));
  assert_int_equal(list.count, 3);
  assert_int_equal(list.items[0].step, 10);
  assert_int_equal(list.items[1].step, 15);
  EXPECT_OK(pcp_store_checkpoint_verify(&list.items[1]));  // empty file
  pcp_store_checkpoint_list_deinitialize(&list);
  pcp_store_checkpoint_t missing;
  EXPECT_CODE(pcp_store_checkpoint_get(f->store, "ck", 11, &missing),
              PCP_STATUS_NOT_FOUND);

  // One flipped byte, a truncation, an extension, a missing file: all
  // DATA_LOSS.
  FILE* file = fopen(written.path, "r+b");
  assert_non_null(file);
  fseek(file, 100, SEEK_SET);
  fputc(weights[100] ^ 0x55, file);
  fclose(file);
  EXPECT_CODE(pcp_store_checkpoint_verify(&written), PCP_STATUS_DATA_LOSS);
  assert_int_equal(truncate(written.path, 100), 0);
  EXPECT_CODE(pcp_store_checkpoint_verify(&written), PCP_STATUS_DATA_LOSS);
  file = fopen(latest.path, "ab");
  assert_non_null(file);
  fputc(0, file);
  fclose(file);
  EXPECT_CODE(pcp_store_checkpoint_verify(&latest), PCP_STATUS_DATA_LOSS);
  assert_int_equal(unlink(written.path), 0);
  EXPECT_CODE(pcp_store_checkpoint_verify(&written), PCP_STATUS_DATA_LOSS);

  // A temp file left by a crash is removed at the next open and never
  // indexed.
  char temp[1100];
  snprintf(temp, sizeof(temp), "%s/checkpoints/ck/step-99.bin.tmp", f->dir);
  file = fopen(temp, "wb");
  assert_non_null(file);
  fputs("half", file);
  fclose(file);
  // So is a whole file that was renamed into place but never indexed (the
  // writer died before its commit); indexed files stay.
  char orphan[1100];
  snprintf(orphan, sizeof(orphan),
           "%s/checkpoints/ck/step-00000000000000000099.bin", f->dir);
  file = fopen(orphan, "wb");
  assert_non_null(file);
  fputs("whole but unindexed", file);
  fclose(file);
  reopen(f);
  assert_int_not_equal(access(temp, F_OK), 0);
  assert_int_not_equal(access(orphan, F_OK), 0);
  assert_int_equal(access(latest.path, F_OK), 0);
  EXPECT_CODE(pcp_store_checkpoint_get(f->store, "ck", 99, &missing),
              PCP_STATUS_NOT_FOUND);
}

//===----------------------------------------------------------------------===//
// Limits and bad input
//===----------------------------------------------------------------------===//

static void test_limits_and_bad_input(void** state) {
  fixture_t* f = *state;
  char long_id[PCP_STORE_ID_MAX_LENGTH + 2];
  memset(long_id, 'a', sizeof(long_id) - 1);
  long_id[sizeof(long_id) - 1] = '\0';
  json_t* spec = json_object();
  EXPECT_CODE(pcp_store_job_create(f->store, long_id, "k", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  long_id[PCP_STORE_ID_MAX_LENGTH] = '\0';  // exactly the max is fine
  EXPECT_OK(pcp_store_job_create(f->store, long_id, "k", spec, NULL));
  EXPECT_CODE(pcp_store_job_create(f->store, "", "k", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_store_job_create(f->store, "a/b", "k", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_store_job_create(f->store, "..", "k", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_store_job_create(f->store, "a b", "k", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_store_job_create(f->store, "x", "k\n", spec, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_store_job_create(f->store, "x", "k", NULL, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  json_t* array = json_array();
  EXPECT_CODE(pcp_store_job_create(f->store, "x", "k", array, NULL),
              PCP_STATUS_INVALID_ARGUMENT);  // spec must be an object
  json_decref(array);
  json_decref(spec);

  // JSON depth: 32 levels pass, 33 do not.
  json_t* deep = json_object();
  for (int i = 1; i < PCP_STORE_JSON_MAX_DEPTH; ++i) {
    json_t* outer = json_object();
    json_object_set_new(outer, "a", deep);
    deep = outer;
  }
  EXPECT_OK(pcp_store_job_create(f->store, "deep-ok", "k", deep, NULL));
  json_t* deeper = json_pack("{s:O}", "a", deep);
  EXPECT_CODE(pcp_store_job_create(f->store, "deep-bad", "k", deeper, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  json_decref(deeper);
  json_decref(deep);
  // JSON size.
  char* big = malloc(PCP_STORE_JSON_MAX_BYTE_LENGTH + 1);
  memset(big, 'x', PCP_STORE_JSON_MAX_BYTE_LENGTH);
  big[PCP_STORE_JSON_MAX_BYTE_LENGTH] = '\0';
  json_t* huge = json_pack("{s:s}", "blob", big);
  free(big);
  EXPECT_CODE(pcp_store_job_create(f->store, "huge", "k", huge, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  json_decref(huge);
  // Error text bound.
  create_job(f->store, "err", "k");
  char* long_error = malloc(PCP_STORE_ERROR_MAX_LENGTH + 2);
  memset(long_error, 'e', PCP_STORE_ERROR_MAX_LENGTH + 1);
  long_error[PCP_STORE_ERROR_MAX_LENGTH + 1] = '\0';
  pcp_store_job_transition_params_t params = {.error = long_error};
  EXPECT_CODE(pcp_store_job_transition(
                  f->store, "err", PCP_STORE_JOB_STATE_FAILED, &params, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  free(long_error);
  assert_int_equal(job_state(f->store, "err"), PCP_STORE_JOB_STATE_QUEUED);

  // List limits are capped.
  create_job(f->store, "many", "k");
  for (int i = 0; i < (int)PCP_STORE_LIST_LIMIT_MAX + 5; ++i) {
    EXPECT_OK(pcp_store_job_event_append(f->store, "many", "log", NULL, NULL));
  }
  pcp_store_job_event_list_t events;
  EXPECT_OK(pcp_store_job_event_list(f->store, 0, "many", 100000, &events));
  assert_int_equal(events.count, PCP_STORE_LIST_LIMIT_MAX);
  pcp_store_job_event_list_deinitialize(&events);
  EXPECT_OK(pcp_store_job_event_list(f->store, 0, "many", 0, &events));
  assert_int_equal(events.count, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_job_event_list_deinitialize(&events);
}

//===----------------------------------------------------------------------===//
// Threads
//===----------------------------------------------------------------------===//

typedef struct thread_arg_t {
  pcp_store_t* store;
  int index;
  int failures;
} thread_arg_t;

static void* thread_main(void* opaque) {
  thread_arg_t* arg = opaque;
  for (int i = 0; i < 25; ++i) {
    char id[64];
    snprintf(id, sizeof(id), "t%d-%d", arg->index, i);
    json_t* spec = json_object();
    pcp_status_t status =
        pcp_store_job_create(arg->store, id, "generic", spec, NULL);
    json_decref(spec);
    static const pcp_store_job_state_t kPath[] = {
        PCP_STORE_JOB_STATE_PLACING, PCP_STORE_JOB_STATE_COMPILING,
        PCP_STORE_JOB_STATE_RUNNING, PCP_STORE_JOB_STATE_SUCCEEDED};
    for (size_t s = 0; !status && s < PCP_ARRAYSIZE(kPath); ++s) {
      status = pcp_store_job_transition(arg->store, id, kPath[s], NULL, NULL);
    }
    if (status) {
      ++arg->failures;
      pcp_status_ignore(status);
    }
  }
  return NULL;
}

static void test_threads_share_one_store(void** state) {
  fixture_t* f = *state;
  pthread_t threads[4];
  thread_arg_t args[4];
  for (int i = 0; i < 4; ++i) {
    args[i] = (thread_arg_t){.store = f->store, .index = i};
    assert_int_equal(pthread_create(&threads[i], NULL, thread_main, &args[i]),
                     0);
  }
  for (int i = 0; i < 4; ++i) {
    pthread_join(threads[i], NULL);
    assert_int_equal(args[i].failures, 0);
  }
  pcp_store_job_filter_t filter = {
      .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_SUCCEEDED),
      .limit = 1000};
  pcp_store_job_list_t list;
  EXPECT_OK(pcp_store_job_list(f->store, &filter, &list));
  assert_int_equal(list.count, 100);
  pcp_store_job_list_deinitialize(&list);
  int64_t last = 0;
  EXPECT_OK(pcp_store_job_event_last_id(f->store, &last));
  assert_int_equal(last, 500);  // 100 jobs x (queued + 4 transitions)
}

static void test_busy_database_is_unavailable(void** state) {
  fixture_t* f = *state;
  create_job(f->store, "b1", "generic");
  pcp_store_release(f->store);
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  options.busy_timeout_ms = 20;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &f->store));
  // Another connection holds the write lock.
  char path[512];
  snprintf(path, sizeof(path), "%s/pcp.db", f->dir);
  sqlite3* other = NULL;
  assert_int_equal(sqlite3_open(path, &other), SQLITE_OK);
  assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL),
                   SQLITE_OK);
  pcp_status_t status = pcp_store_job_transition(
      f->store, "b1", PCP_STORE_JOB_STATE_PLACING, NULL, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_UNAVAILABLE);
  assert_non_null(strstr(pcp_status_message(status), "locked"));
  pcp_status_ignore(status);
  // Reads still work in WAL mode while another connection writes.
  assert_int_equal(job_state(f->store, "b1"), PCP_STORE_JOB_STATE_QUEUED);
  // Multi-table reads use a deferred (read) transaction, not the write lock.
  pcp_store_graph_result_t result;
  EXPECT_OK(pcp_store_graph_query(f->store, NULL, &result));
  pcp_store_graph_result_deinitialize(&result);
  pcp_store_reservation_list_t reservations;
  EXPECT_OK(pcp_store_reservation_list(f->store, 0, 0, &reservations));
  pcp_store_reservation_list_deinitialize(&reservations);
  assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(other);
  move(f->store, "b1", PCP_STORE_JOB_STATE_PLACING);
}

static void test_corrupt_pages_are_data_loss(void** state) {
  fixture_t* f = *state;
  for (int i = 0; i < 200; ++i) {
    char id[32];
    snprintf(id, sizeof(id), "c%03d", i);
    create_job(f->store, id, "generic");
  }
  // Closing the last connection checkpoints the WAL into pcp.db.
  pcp_store_release(f->store);
  f->store = NULL;
  char path[512];
  snprintf(path, sizeof(path), "%s/pcp.db", f->dir);
  FILE* file = fopen(path, "r+b");
  assert_non_null(file);
  fseek(file, 0, SEEK_END);
  long length = ftell(file);
  assert_true(length > 16 * 4096);
  // Garbage over the pages in the second half of the file (table and index
  // b-tree pages), leaving the header page alone so the file still opens.
  for (long offset = length / 2; offset < length; offset += 4096) {
    fseek(file, offset + 100, SEEK_SET);
    for (int b = 0; b < 64; ++b) {
      fputc(0xA5, file);
    }
  }
  fclose(file);
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  pcp_store_t* store = NULL;
  pcp_status_t status =
      pcp_store_create(&options, pcp_allocator_system(), &store);
  if (pcp_status_is_ok(status)) {
    EXPECT_CODE(pcp_store_integrity_check(store), PCP_STATUS_DATA_LOSS);
    pcp_store_release(store);
  } else {
    EXPECT_CODE(status, PCP_STATUS_DATA_LOSS);
  }
  char command[1024];
  snprintf(command, sizeof(command), "rm -f '%s'/pcp.db*", f->dir);
  assert_int_equal(system(command), 0);
  f->store = open_store_at(f, 0);
}

typedef struct event_recorder_t {
  int64_t ids[64];
  int count;
} event_recorder_t;

static void record_event(void* user_data, int64_t event_id) {
  event_recorder_t* recorder = user_data;
  if (recorder->count < 64) {
    recorder->ids[recorder->count++] = event_id;
  }
}

static void test_event_callback_after_commit(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  event_recorder_t recorder = {0};
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  options.event_callback.fn = record_event;
  options.event_callback.user_data = &recorder;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &f->store));
  create_job(f->store, "cb", "train");
  move(f->store, "cb", PCP_STORE_JOB_STATE_PLACING);
  move(f->store, "cb", PCP_STORE_JOB_STATE_COMPILING);
  move(f->store, "cb", PCP_STORE_JOB_STATE_RUNNING);
  EXPECT_OK(pcp_store_job_step_commit(f->store, "cb", 0, NULL));
  EXPECT_OK(pcp_store_checkpoint_write(f->store, "cb", 1, "w", 1, NULL));
  EXPECT_OK(pcp_store_job_event_append(f->store, "cb", "log", NULL, NULL));
  // Failures tell nobody.
  EXPECT_CODE(pcp_store_job_transition(
                  f->store, "cb", PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_store_job_event_append(f->store, "nope", "log", NULL, NULL),
              PCP_STATUS_NOT_FOUND);
  pcp_store_job_event_list_t events;
  EXPECT_OK(pcp_store_job_event_list(f->store, 0, "cb", 0, &events));
  assert_int_equal(recorder.count, (int)events.count);
  assert_int_equal(recorder.count, 7);
  for (size_t i = 0; i < events.count; ++i) {
    assert_int_equal(recorder.ids[i], events.items[i].event_id);
  }
  pcp_store_job_event_list_deinitialize(&events);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_open_creates_wal_database, setup,
                                      teardown),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test_setup_teardown(test_migrations_from_empty_step_by_step,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_migration_from_previous_version_keeps_data, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_schema_is_refused, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_not_a_database_is_data_loss, setup,
                                      teardown),
      cmocka_unit_test(test_sqlite_error_mapping),
      cmocka_unit_test_setup_teardown(test_busy_database_is_unavailable, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_pages_are_data_loss, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_transition_table_every_pair, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_job_lifecycle_fields, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_job_list_filters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_ids_monotonic_across_reopen,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_job_results, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_callback_after_commit, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_service_ttl_and_sweep, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_leases_and_reservations, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_graph_queries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mutation_log_order_and_apply, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_write_index_verify, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_limits_and_bad_input, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_threads_share_one_store, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
