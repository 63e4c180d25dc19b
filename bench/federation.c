// SPDX-License-Identifier: Apache-2.0
// bench/federation (issue 15): the federation hub's graph replication.
//
// Replication half (replication_measure): replicated mutations per second
// applied by a real `pcp --federation-hub` through its HTTP route
// (POST /v1/federation/mutations, batches of 64 upsert_entity items, one
// keep-alive client, as a gateway's push sends them) against the same
// inserts written straight into a hub store in-process
// (pcp_store_graph_mutation_batch_apply, batches of 64, the call the route
// ends in). Both stores run with the hub's durability (synchronous=FULL:
// one fsync per batch). The ratio replicated/direct is what HTTP, JSON and
// the route's checks (registration, policies, parse) cost.
//
// The placement half (p99 placement latency with 100 registered gateways)
// belongs to the hub's part of the bench: it adds its measurement here and
// the last line stays `federation ratio=<replicated/direct>`.
//
// Usage: federation [PCP_BINARY] [BATCHES]   (default 100 batches = 6,400)
// Goal: ratio >= 0.5 (the route must not cost more than the apply itself).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_util.h"
#include "http/http.h"
#include "store/store.h"

#ifndef PCP_BINARY_PATH
#define PCP_BINARY_PATH "pcp"
#endif

#define BENCH "federation"
#define BATCH_ITEMS 64
#define API_TOKEN "bench-hub-api"
#define FED_TOKEN "bench-hub-federation"
#define GATEWAY_ID "bench-gw"
#define NAMESPACE "bench-lab/shared"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &length) != 0) {
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

static void remove_dir(const char* dir) {
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  if (system(command) != 0) {
    fprintf(stderr, "%s: could not remove %s\n", BENCH, dir);
  }
}

// Entity |index| of the run, as the gateway's log would hold it.
static void mutation_fill(int64_t index, pcp_store_mutation_t* m) {
  memset(m, 0, sizeof(*m));
  m->sequence_no = index + 1;
  snprintf(m->mutation_id, sizeof(m->mutation_id), GATEWAY_ID ":mut_%lld",
           (long long)(index + 1));
  snprintf(m->namespace_id, sizeof(m->namespace_id), NAMESPACE);
  m->mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY;
  snprintf(m->target_id, sizeof(m->target_id), "paper-%lld", (long long)index);
  m->visibility = PCP_STORE_VISIBILITY_GLOBAL;
  m->payload = json_pack("{s:s, s:s, s:{s:I, s:s}}", "entity_type", "paper",
                         "display_name", m->target_id, "properties", "index",
                         (json_int_t)index, "venue", "bench");
  m->provenance = json_pack("{s:s}", "gateway_id", GATEWAY_ID);
  m->timestamp_ns = 1700000000000000000 + index;
}

static void mutation_release(pcp_store_mutation_t* m) {
  json_decref(m->payload);
  json_decref(m->provenance);
}

// Mutations per second through pcp_store_graph_mutation_batch_apply.
static double direct_rate(int batches) {
  char dir[] = "/tmp/pcp-bench-federation-direct-XXXXXX";
  if (!mkdtemp(dir)) {
    return 0;
  }
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = dir;
  pcp_store_t* store = NULL;
  pcp_bench_check(BENCH,
                  pcp_store_create(&options, pcp_allocator_system(), &store),
                  "store");
  pcp_store_mutation_t items[BATCH_ITEMS];
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < BATCH_ITEMS; ++i) {
      mutation_fill((int64_t)b * BATCH_ITEMS + i, &items[i]);
    }
    size_t applied = 0, duplicates = 0;
    double start = now_s();
    pcp_bench_check(BENCH,
                    pcp_store_graph_mutation_batch_apply(
                        store, GATEWAY_ID, items, BATCH_ITEMS,
                        (int64_t)(b + 1) * BATCH_ITEMS,
                        (int64_t)batches * BATCH_ITEMS, &applied, &duplicates),
                    "batch apply");
    total += now_s() - start;
    for (int i = 0; i < BATCH_ITEMS; ++i) {
      mutation_release(&items[i]);
    }
    if (applied != BATCH_ITEMS) {
      fprintf(stderr, "%s: direct batch %d applied %zu\n", BENCH, b, applied);
      exit(1);
    }
  }
  pcp_store_release(store);
  remove_dir(dir);
  return total > 0 ? (double)batches * BATCH_ITEMS / total : 0;
}

// The body of batch |b| as a gateway's push sends it.
static char* batch_body(int b, int batches) {
  json_t* items = json_array();
  for (int i = 0; i < BATCH_ITEMS; ++i) {
    pcp_store_mutation_t m;
    mutation_fill((int64_t)b * BATCH_ITEMS + i, &m);
    // The gateway's own id; the hub prefixes the gateway id.
    snprintf(m.mutation_id, sizeof(m.mutation_id), "mut_%lld",
             (long long)m.sequence_no);
    char* payload = json_dumps(m.payload, JSON_COMPACT);
    char* provenance = json_dumps(m.provenance, JSON_COMPACT);
    json_array_append_new(
        items, json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I}",
                         "sequence_no", (json_int_t)m.sequence_no,
                         "mutation_id", m.mutation_id, "namespace_id",
                         m.namespace_id, "mutation_type", "upsert_entity",
                         "target_id", m.target_id, "payload_json", payload,
                         "visibility", "global", "provenance_json", provenance,
                         "timestamp_ns", (json_int_t)m.timestamp_ns));
    free(payload);
    free(provenance);
    mutation_release(&m);
  }
  json_t* body = json_pack(
      "{s:s, s:s, s:I, s:I, s:I, s:[{s:s, s:s, s:b, s:b, s:I}], s:o}",
      "gateway_id", GATEWAY_ID, "lab_id", "bench-lab", "last_sequence_no",
      (json_int_t)batches * BATCH_ITEMS, "last_replicated_sequence",
      (json_int_t)b * BATCH_ITEMS, "through_sequence_no",
      (json_int_t)(b + 1) * BATCH_ITEMS, "namespace_policies", "namespace_id",
      NAMESPACE, "default_visibility", "global", "allow_global_replication", 1,
      "allow_raw_payload_export", 1, "updated_at_ms", (json_int_t)1000,
      "mutations", items);
  char* text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  return text;
}

static int post(pcp_http_client_t* client, const char* url, const char* body,
                const char* token, char** out_body) {
  const char* headers[] = {"Content-Type: application/json", NULL};
  pcp_http_client_request_t request = {.method = "POST",
                                       .url = url,
                                       .headers = headers,
                                       .bearer_token = token,
                                       .body = body,
                                       .body_length = strlen(body)};
  pcp_http_client_response_t response;
  pcp_bench_check(BENCH, pcp_http_client_send(client, &request, &response),
                  url);
  int status = response.http_status;
  if (out_body) {
    *out_body = strdup(response.body ? response.body : "");
  }
  pcp_http_client_response_deinitialize(&response);
  return status;
}

// Mutations per second applied by a hub process through its HTTP route.
static double replicated_rate(const char* pcp, int batches,
                              int64_t* out_hub_entities) {
  *out_hub_entities = -1;
  char dir[] = "/tmp/pcp-bench-federation-hub-XXXXXX";
  if (!mkdtemp(dir)) {
    return 0;
  }
  int port = free_port();
  char port_text[16];
  snprintf(port_text, sizeof(port_text), "%d", port);
  pid_t child = fork();
  if (child == 0) {
    setenv("BENCH_HUB_API_TOKEN", API_TOKEN, 1);
    setenv("BENCH_HUB_FED_TOKEN", FED_TOKEN, 1);
    setenv("PCP_LOG_LEVEL", "warn", 1);
    execl(pcp, pcp, "--federation-hub", "--api-host", "127.0.0.1", "--api-port",
          port_text, "--state-dir", dir, "--api-token-env",
          "BENCH_HUB_API_TOKEN", "--federation-token-env",
          "BENCH_HUB_FED_TOKEN", (char*)NULL);
    _exit(127);
  }
  pcp_http_client_options_t options = {.timeout_ms = 30000};
  pcp_http_client_t* client = NULL;
  pcp_bench_check(
      BENCH, pcp_http_client_create(&options, pcp_allocator_system(), &client),
      "client");
  char base[64], url[128];
  snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
  // Registration (the route refuses unknown gateways).
  snprintf(url, sizeof(url), "%s/v1/federation/connect", base);
  char connect_body[256];
  snprintf(connect_body, sizeof(connect_body),
           "{\"gateway_id\":\"" GATEWAY_ID
           "\",\"lab_id\":\"bench-lab\",\"base_url\":\"http://127.0.0.1:1\","
           "\"graph_backend\":\"sqlite\",\"status\":\"connected\","
           "\"services\":[]}");
  int status = 0;
  for (int i = 0; i < 400 && status != 200; ++i) {
    nanosleep(&(struct timespec){0, 25000000}, NULL);
    const char* headers[] = {"Content-Type: application/json", NULL};
    pcp_http_client_request_t request = {.method = "POST",
                                         .url = url,
                                         .headers = headers,
                                         .bearer_token = FED_TOKEN,
                                         .body = connect_body,
                                         .body_length = strlen(connect_body)};
    pcp_http_client_response_t response;
    pcp_status_t sent = pcp_http_client_send(client, &request, &response);
    if (!sent) {
      status = response.http_status;
      pcp_http_client_response_deinitialize(&response);
    }
    pcp_status_ignore(sent);
  }
  if (status != 200) {
    fprintf(stderr, "%s: the hub did not accept the connect (%d)\n", BENCH,
            status);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    exit(1);
  }
  // Bodies are built before the clock starts: a gateway's JSON is its cost.
  char** bodies = calloc((size_t)batches, sizeof(char*));
  for (int b = 0; b < batches; ++b) {
    bodies[b] = batch_body(b, batches);
  }
  snprintf(url, sizeof(url), "%s/v1/federation/mutations", base);
  double start = now_s();
  for (int b = 0; b < batches; ++b) {
    char* answer = NULL;
    status = post(client, url, bodies[b], FED_TOKEN, &answer);
    if (status != 200 || !strstr(answer, "\"applied_count\":64")) {
      fprintf(stderr, "%s: batch %d: HTTP %d %s\n", BENCH, b, status, answer);
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
      exit(1);
    }
    free(answer);
  }
  double elapsed = now_s() - start;
  for (int b = 0; b < batches; ++b) {
    free(bodies[b]);
  }
  free(bodies);
  // The hub holds every entity once.
  char status_url[128];
  snprintf(status_url, sizeof(status_url), "%s/v1/global-graph/status", base);
  pcp_http_client_request_t request = {.url = status_url,
                                       .bearer_token = API_TOKEN};
  pcp_http_client_response_t response;
  if (!pcp_http_client_send(client, &request, &response)) {
    json_t* body = json_loads(response.body ? response.body : "", 0, NULL);
    *out_hub_entities = json_integer_value(
        json_object_get(json_object_get(body, "global_graph"), "entities"));
    json_decref(body);
    pcp_http_client_response_deinitialize(&response);
  }
  pcp_http_client_release(client);
  kill(child, SIGTERM);
  waitpid(child, NULL, 0);
  remove_dir(dir);
  return elapsed > 0 ? (double)batches * BATCH_ITEMS / elapsed : 0;
}

static double median3(double v[3]) {
  double a = v[0], b = v[1], c = v[2];
  if (a > b) {
    double t = a;
    a = b;
    b = t;
  }
  if (b > c) {
    b = c;
  }
  return a > b ? a : b;
}

// Prints the replication figures; returns replicated/direct. Other work on
// the machine moves fsync-bound rates a lot, so the two are measured in
// three interleaved rounds and each one's median counts.
static double replication_measure(const char* pcp, int batches, bool* met) {
  enum { ROUNDS = 3 };
  double directs[ROUNDS], replicateds[ROUNDS];
  int64_t entities = 0;
  bool all_applied = true;
  for (int r = 0; r < ROUNDS; ++r) {
    directs[r] = direct_rate(batches);
    replicateds[r] = replicated_rate(pcp, batches, &entities);
    all_applied &= entities == (int64_t)batches * BATCH_ITEMS;
    printf("round %d: direct %.0f, replicated %.0f mutations/s\n", r + 1,
           directs[r], replicateds[r]);
  }
  double direct = median3(directs), replicated = median3(replicateds);
  double ratio = direct > 0 ? replicated / direct : 0;
  printf(
      "direct store apply (batches of %d, synchronous=FULL): %.0f "
      "mutations/s\n",
      BATCH_ITEMS, direct);
  printf(
      "hub POST /v1/federation/mutations (batches of %d): %.0f "
      "mutations/s\n",
      BATCH_ITEMS, replicated);
  printf("hub entities after %d batches: %lld (expected %d)\n", batches,
         (long long)entities, batches * BATCH_ITEMS);
  printf("replication replicated/direct: %.3f\n", ratio);
  *met &= pcp_bench_goal(BENCH, all_applied,
                         "every replicated mutation applied once");
  *met &= pcp_bench_goal(BENCH, ratio >= 0.5, "replicated/direct >= 0.5");
  return ratio;
}

int main(int argc, char** argv) {
  const char* pcp = argc > 1 ? argv[1] : PCP_BINARY_PATH;
  int batches = argc > 2 ? atoi(argv[2]) : 100;
  if (batches < 1 || batches > 10000) {
    fprintf(stderr, "usage: federation [PCP_BINARY] [BATCHES 1..10000]\n");
    return 2;
  }
  bool met = true;
  double ratio = replication_measure(pcp, batches, &met);
  printf("federation ratio=%.3f\n", ratio);
  return pcp_bench_exit_code(met);
}
