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
// applied by the hub against the same inserts written straight into its
// store; filled in by the replication work. Until then the last line is
// "federation ratio=<in-process p99 / HTTP p99>" (the cost of the HTTP,
// durable path relative to the decision itself).

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_util.h"
#include "http/http.h"
#include "sched/sched.h"

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

// Replication half: false until the replication work measures it (it then
// sets |*out_ratio| to hub-applied mutations/s over direct inserts/s).
static bool replication_half(double* out_ratio) {
  *out_ratio = 0;
  return false;
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
  double replication = 0;
  if (replication_half(&replication)) {
    printf("federation ratio=%.4f\n", replication);
  } else {
    printf(
        "federation placement ratio (in-process p99 / HTTP p99; the "
        "replication half is not measured yet)\n");
    printf("federation ratio=%.6f\n", in_process / http);
  }
  return pcp_bench_exit_code(met);
}
