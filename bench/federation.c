// SPDX-License-Identifier: Apache-2.0
//
// bench/federation: the federation hub (issue 15).
//
// Placement half (this file, placement_half): p99 latency of a placement
// decision with 100 registered gateways, measured two ways in the same run:
//   - in process: pcp_sched_federation_place on the hub's registry (the pure
//     state machine, no lock, no I/O);
//   - through the real hub: POST /v1/training/jobs on a `pcp
//     --federation-hub` child process, which places, records the global job
//     in SQLite (synchronous=FULL: fsync), forwards it to the chosen
//     gateway and records the answer. The 100 gateways are one in-process
//     HTTP server answering the internal federation route (202 + job_id).
// Replication half (replication_half): replicated mutations per second
// applied by a real `pcp --federation-hub` through its HTTP route
// (POST /v1/federation/mutations, batches of 64 upsert_entity items, one
// keep-alive client, as a gateway's push sends them) against the same
// inserts written straight into a hub store in-process
// (pcp_store_graph_mutation_batch_apply, batches of 64, the call the route
// ends in). Both stores run with the hub's durability (synchronous=FULL:
// one fsync per batch), in three interleaved rounds (medians). The last
// line is "federation ratio=<replicated/direct>" (goal >= 0.5: the route
// must not cost more than the apply itself).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
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
#include "sched/sched.h"
#include "store/store.h"

#define BENCH "federation"
#define GATEWAYS 100
#define IN_PROCESS_PLACEMENTS 20000
#define HTTP_PLACEMENTS 400

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double percentile(double* values, size_t count, double p) {
  qsort(values, count, sizeof(double), compare_double);
  size_t index = (size_t)(p * (double)(count - 1) + 0.5);
  return values[index];
}

// Gateway g advertises a training service with 1 + g % 8 workers (so
// workers_required filters a varying share of them) and an rl service.
static const char* const kCaps[] = {"training.regular"};

static void advert(int g, char* gateway_id, size_t capacity,
                   pcp_sched_federation_service_t services[2]) {
  snprintf(gateway_id, capacity, "gw-%03d", g);
  pcp_sched_federation_service_initialize(&services[0]);
  services[0].service_id = "training-main";
  services[0].service_type = "training";
  services[0].health_status = g % 10 == 0 ? "degraded" : "ok";
  services[0].capabilities = kCaps;
  services[0].capability_count = 1;
  services[0].workers_available = 1 + g % 8;
  pcp_sched_federation_service_initialize(&services[1]);
  services[1].service_id = "rl-main";
  services[1].service_type = "rl";
  services[1].workers_available = 1;
}

//===----------------------------------------------------------------------===//
// In process
//===----------------------------------------------------------------------===//

static double in_process_p99_us(void) {
  pcp_sched_federation_options_t options;
  pcp_sched_federation_options_initialize(&options);
  pcp_sched_federation_t* registry = NULL;
  pcp_bench_check(
      BENCH,
      pcp_sched_federation_create(&options, pcp_allocator_system(), &registry),
      "registry");
  for (int g = 0; g < GATEWAYS; ++g) {
    char id[32];
    pcp_sched_federation_service_t services[2];
    advert(g, id, sizeof(id), services);
    pcp_sched_federation_connect_t request = {
        .gateway_id = id,
        .lab_id = "lab",
        .base_url = "http://127.0.0.1:1",
        .graph_backend = "sqlite",
        .services = services,
        .service_count = 2,
        .registered_services = PCP_SCHED_FEDERATION_COUNT_ABSENT,
    };
    pcp_bench_check(
        BENCH, pcp_sched_federation_connect(registry, &request, 0, 0, NULL),
        "connect");
  }
  pcp_clock_t clock = pcp_clock_system();
  double* samples = calloc(IN_PROCESS_PLACEMENTS, sizeof(double));
  uint64_t checksum = 0;
  for (int i = 0; i < IN_PROCESS_PLACEMENTS; ++i) {
    pcp_sched_federation_selector_t selector = {
        .capability = "training.regular",
        .workers_required = i % 9,
    };
    pcp_sched_federation_placement_t placement;
    int64_t t0 = pcp_clock_now_ns(clock);
    pcp_bench_check(
        BENCH, pcp_sched_federation_place(registry, &selector, 1, &placement),
        "place");
    samples[i] = (double)(pcp_clock_now_ns(clock) - t0) / 1000.0;
    checksum += placement.candidate_count;
  }
  double p99 = percentile(samples, IN_PROCESS_PLACEMENTS, 0.99);
  double p50 = percentile(samples, IN_PROCESS_PLACEMENTS, 0.50);
  printf(
      "federation in-process placement: %d gateways, %d decisions, "
      "p50=%.2f us p99=%.2f us (candidates seen %llu)\n",
      GATEWAYS, IN_PROCESS_PLACEMENTS, p50, p99, (unsigned long long)checksum);
  free(samples);
  pcp_sched_federation_release(registry);
  return p99;
}

//===----------------------------------------------------------------------===//
// Through the hub
//===----------------------------------------------------------------------===//

static _Atomic int64_t g_child_jobs;

static pcp_status_t fake_gateway_submit(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response) {
  (void)user_data;
  (void)request;
  char body[64];
  snprintf(body, sizeof(body), "{\"accepted\":true,\"job_id\":\"job-%lld\"}",
           (long long)atomic_fetch_add(&g_child_jobs, 1));
  return pcp_http_response_body_set(response, 202, "application/json", body,
                                    strlen(body));
}

static pid_t hub_start(const char* state_dir, const char* log_path,
                       int* out_port) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* log = freopen(log_path, "w", stderr);
    (void)log;
    execl(PCP_BINARY_PATH, PCP_BINARY_PATH, "--federation-hub", "--state-dir",
          state_dir, "--api-port", "0", "--heartbeat-interval-ms", "60000",
          (char*)NULL);
    _exit(127);
  }
  *out_port = 0;
  for (int i = 0; i < 400 && !*out_port; ++i) {
    pcp_sleep_ms(25);
    FILE* f = fopen(log_path, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
      const char* at = strstr(line, "msg=\"started\"");
      const char* port = at ? strstr(line, "api_port=") : NULL;
      if (port) {
        *out_port = atoi(port + 9);
      }
    }
    if (f) {
      fclose(f);
    }
  }
  if (!*out_port) {
    fprintf(stderr, "federation: the hub did not start (see %s)\n", log_path);
    kill(pid, SIGKILL);
    exit(1);
  }
  return pid;
}

static int http_post(pcp_http_client_t* client, int port, const char* path,
                     const char* body) {
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
  static const char* const kHeaders[] = {"Content-Type: application/json",
                                         NULL};
  pcp_http_client_request_t request = {.method = "POST",
                                       .url = url,
                                       .headers = kHeaders,
                                       .body = body,
                                       .body_length = strlen(body)};
  pcp_http_client_response_t response;
  pcp_bench_check(BENCH, pcp_http_client_send(client, &request, &response),
                  path);
  int status = response.http_status;
  if (status >= 300) {
    fprintf(stderr, "federation: %s -> %d %s\n", path, status, response.body);
  }
  pcp_http_client_response_deinitialize(&response);
  return status;
}

static double http_p99_us(void) {
  // The 100 gateways' side: one server, every registration points at it.
  pcp_http_server_options_t options = {.name = "fake-gateways",
                                       .thread_count = 4};
  pcp_http_server_t* gateways = NULL;
  pcp_bench_check(
      BENCH,
      pcp_http_server_create(&options, pcp_allocator_system(), &gateways),
      "fake gateways");
  const pcp_http_route_t routes[] = {
      {"POST", "/v1/internal/federation/training/jobs", NULL,
       fake_gateway_submit, NULL, 0, 0},
  };
  pcp_bench_check(BENCH, pcp_http_server_routes_add(gateways, routes, 1),
                  "routes");
  pcp_bench_check(BENCH, pcp_http_server_start(gateways), "start");
  int gateway_port = pcp_http_server_port(gateways);

  char dir[] = "/tmp/pcp-bench-federation-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  char state[256], log[256];
  snprintf(state, sizeof(state), "%s/state", dir);
  snprintf(log, sizeof(log), "%s/hub.err", dir);
  int port = 0;
  pid_t hub = hub_start(state, log, &port);

  pcp_http_client_options_t client_options = {.timeout_ms = 30000};
  pcp_http_client_t* client = NULL;
  pcp_bench_check(
      BENCH,
      pcp_http_client_create(&client_options, pcp_allocator_system(), &client),
      "client");
  for (int g = 0; g < GATEWAYS; ++g) {
    char id[32];
    pcp_sched_federation_service_t services[2];
    advert(g, id, sizeof(id), services);
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"gateway_id\":\"%s\",\"lab_id\":\"lab\",\"base_url\":"
             "\"http://127.0.0.1:%d\",\"graph_backend\":\"sqlite\","
             "\"services\":[{\"service_id\":\"training-main\","
             "\"service_type\":\"training\",\"health_status\":\"%s\","
             "\"capabilities\":[\"training.regular\"],"
             "\"workers_available\":%lld},{\"service_id\":\"rl-main\","
             "\"service_type\":\"rl\",\"workers_available\":1}]}",
             id, gateway_port, services[0].health_status,
             (long long)services[0].workers_available);
    if (http_post(client, port, "/v1/federation/connect", body) != 200) {
      exit(1);
    }
  }
  pcp_clock_t clock = pcp_clock_system();
  double* samples = calloc(HTTP_PLACEMENTS, sizeof(double));
  for (int i = 0; i < HTTP_PLACEMENTS; ++i) {
    char body[128];
    snprintf(body, sizeof(body), "{\"placement\":{\"workers_required\":%d}}",
             i % 9);
    int64_t t0 = pcp_clock_now_ns(clock);
    if (http_post(client, port, "/v1/training/jobs", body) != 202) {
      exit(1);
    }
    samples[i] = (double)(pcp_clock_now_ns(clock) - t0) / 1000.0;
  }
  double p99 = percentile(samples, HTTP_PLACEMENTS, 0.99);
  double p50 = percentile(samples, HTTP_PLACEMENTS, 0.50);
  printf(
      "federation HTTP placement (POST /v1/training/jobs: place, 2 "
      "durable writes, gateway round trip): %d gateways, %d jobs, "
      "p50=%.0f us p99=%.0f us\n",
      GATEWAYS, HTTP_PLACEMENTS, p50, p99);
  free(samples);
  pcp_http_client_release(client);
  kill(hub, SIGTERM);
  waitpid(hub, NULL, 0);
  pcp_status_ignore(pcp_http_server_stop(gateways, 1000));
  pcp_http_server_release(gateways);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", dir);
  if (system(command) != 0) {
    fprintf(stderr, "federation: could not remove %s\n", dir);
  }
  return p99;
}

// Placement half: p99 in process and through the hub, in microseconds.
static void placement_half(double* out_in_process_p99_us,
                           double* out_http_p99_us) {
  *out_in_process_p99_us = in_process_p99_us();
  *out_http_p99_us = http_p99_us();
}

//===----------------------------------------------------------------------===//
// Replication half
//===----------------------------------------------------------------------===//

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

// Replication half: hub-applied mutations/s over direct inserts/s
// (100 batches of 64).
static double replication_half(bool* met) {
  return replication_measure(PCP_BINARY_PATH, 100, met);
}

int main(void) {
  // Line-buffered: the hub's and the fake gateways' log lines (stderr)
  // stay before the ratio line, which must come last.
  setvbuf(stdout, NULL, _IOLBF, 0);
  double in_process = 0, http = 0;
  placement_half(&in_process, &http);
  char goal[160];
  snprintf(goal, sizeof(goal),
           "in-process p99 < 100 us with %d gateways (%.2f us)", GATEWAYS,
           in_process);
  bool met = pcp_bench_goal(BENCH, in_process < 100.0, goal);
  snprintf(goal, sizeof(goal),
           "HTTP placement p99 < 100 ms with %d gateways (%.1f ms)", GATEWAYS,
           http / 1000.0);
  met &= pcp_bench_goal(BENCH, http < 100000.0, goal);
  double replication = replication_half(&met);
  printf("federation ratio=%.4f\n", replication);
  return pcp_bench_exit_code(met);
}
