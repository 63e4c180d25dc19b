// SPDX-License-Identifier: Apache-2.0
//
// fabric_scale: 1000 simulated workers heartbeating at 1 Hz against one
// fabric endpoint.
//
// The gateway (a pcp_fabric endpoint, H = 1 s) runs in this process; the
// load generator is a forked process with one thread that opens every
// connection over a real loopback socket, completes the whole handshake
// (HELLO, CHALLENGE, JOIN, HMAC proof, ACCEPT) for each, then drives all of
// them from one poll loop: each sends a HEARTBEAT every second (staggered
// over the second) and drains what the gateway sends.
//
// Measured on the gateway, over the steady window only:
//   - CPU per heartbeat: process user + system time / heartbeats received
//     (the gateway's own 1 Hz heartbeats out and its ticks are included);
//   - memory per connected worker: bytes the endpoint allocated (counting
//     allocator) and RSS growth, each divided by the workers connected;
//   - handling latency: loop-thread time per read event, p50/p99/max.
// Ratio printed last: p99 / 10 ms (goal: <= 1).
//
// Usage: fabric_scale [workers] [seconds] (default 1000 10).

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fabric/fabric.h"
#include "fabric/fake_worker.h"

#define TOKEN_ENV "PCP_BENCH_FABRIC_TOKEN"
#define TOKEN "bench-token"

static int64_t now_ns(void) { return pcp_clock_now_ns(pcp_clock_system()); }

static void raise_nofile(rlim_t wanted) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = wanted < limit.rlim_max ? wanted : limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

static int64_t rss_bytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  char line[128] = {0};
  long resident = 0;
  if (fgets(line, sizeof(line), f)) {
    char* end = NULL;
    (void)strtol(line, &end, 10);  // total pages
    resident = strtol(end, NULL, 10);
  }
  fclose(f);
  return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

static double cpu_seconds(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec / 1e6 +
         (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec / 1e6;
}

//===----------------------------------------------------------------------===//
// Load generator (child process)
//===----------------------------------------------------------------------===//

typedef struct client_t {
  int fd;
  int64_t next_beat_ns;
  uint64_t seq;
} client_t;

static int load_generator_main(uint16_t port, int workers, int seconds,
                               int ready_fd, int go_fd) {
  raise_nofile((rlim_t)workers + 64);
  client_t* clients = calloc((size_t)workers, sizeof(client_t));
  struct pollfd* fds = calloc((size_t)workers, sizeof(struct pollfd));
  fake_worker_t* fw = malloc(sizeof(fake_worker_t));
  pcp_proto_limits_t limits = pcp_proto_limits_default();
  for (int i = 0; i < workers; ++i) {
    if (!fake_worker_connect(port, &limits, fw)) {
      fprintf(stderr, "connect %d failed: %s\n", i, strerror(errno));
      return 1;
    }
    char id[64];
    snprintf(id, sizeof(id), "sim-%04d", i);
    pcp_proto_join_t join;
    fake_default_join(id, &join);
    join.device_id = i;
    if (!fake_handshake(fw, &join, TOKEN)) {
      fprintf(stderr, "handshake %d failed (reject %u)\n", i,
              fw->reject_reason);
      return 1;
    }
    clients[i].fd = fw->fd;
    fw->fd = -1;
    fake_worker_close(fw);
  }
  free(fw);
  char byte = 1;
  ssize_t w = write(ready_fd, &byte, 1);
  (void)w;
  ssize_t r = read(go_fd, &byte, 1);  // the gateway took its baseline
  (void)r;
  // Pre-encode one heartbeat per seq on the fly (cheap: 32 + ~30 bytes).
  int64_t start = now_ns();
  for (int i = 0; i < workers; ++i) {
    clients[i].next_beat_ns =
        start + (int64_t)i * 1000000000 / workers;  // staggered
    fds[i].fd = clients[i].fd;
    fds[i].events = POLLIN;
  }
  int64_t end = start + (int64_t)seconds * 1000000000;
  static uint8_t sink[1 << 16];
  uint64_t sent = 0;
  while (now_ns() < end) {
    int64_t now = now_ns();
    for (int i = 0; i < workers; ++i) {
      if (now < clients[i].next_beat_ns) continue;
      clients[i].next_beat_ns += 1000000000;
      pcp_proto_heartbeat_t hb = {.seq = ++clients[i].seq, .ack = 0};
      pcp_proto_encoded_frame_t frame;
      PCP_CHECK_OK(pcp_proto_heartbeat_encode(
          1, 0, &hb, &limits, pcp_allocator_system(), &frame));
      uint8_t* flat = NULL;
      size_t length = 0;
      PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(
          &frame, pcp_allocator_system(), &flat, &length));
      pcp_proto_encoded_frame_deinitialize(&frame);
      if (!fake_send_all(clients[i].fd, flat, length)) {
        fprintf(stderr, "worker %d: send failed\n", i);
      }
      pcp_allocator_free(pcp_allocator_system(), flat);
      ++sent;
    }
    int ready = poll(fds, (nfds_t)workers, 2);
    for (int i = 0; ready > 0 && i < workers; ++i) {
      if (fds[i].revents & POLLIN) {
        ssize_t n = recv(fds[i].fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n == 0) fds[i].fd = -1;  // evicted: stop polling it
      }
    }
  }
  w = write(ready_fd, &sent, sizeof(sent));
  (void)w;
  // Stay connected until the gateway has taken its closing figures.
  if (read(go_fd, &byte, 1) < 0) fprintf(stderr, "go pipe: %s\n", strerror(errno));
  for (int i = 0; i < workers; ++i) close(clients[i].fd);
  free(clients);
  free(fds);
  return 0;
}

//===----------------------------------------------------------------------===//
// Gateway (this process)
//===----------------------------------------------------------------------===//

int main(int argc, char** argv) {
  int workers = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 1000;
  int seconds = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 10;
  if (workers <= 0) workers = 1000;
  if (seconds <= 0) seconds = 10;
  raise_nofile((rlim_t)workers + 256);
  setenv(TOKEN_ENV, TOKEN, 1);
  pcp_log_set_level(PCP_LOG_WARN);

  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_fabric_options_t options;
  pcp_fabric_options_initialize(&options);
  options.join_token_env = TOKEN_ENV;
  options.heartbeat_interval_ms = 1000;
  options.max_workers = (uint32_t)workers + 16;
  options.max_connections = (uint32_t)workers + 64;
  pcp_fabric_endpoint_t* endpoint = NULL;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(
      &options, pcp_allocator_counting(&counting), &endpoint));
  uint16_t port = pcp_fabric_endpoint_port(endpoint);
  pcp_sleep_ms(100);
  int64_t idle_rss = rss_bytes();
  int64_t idle_live = counting.live_bytes;

  int ready_pipe[2], go_pipe[2];
  PCP_ASSERT(pipe(ready_pipe) == 0 && pipe(go_pipe) == 0);
  fflush(stdout);
  pid_t child = fork();
  PCP_ASSERT(child >= 0);
  if (child == 0) {
    close(ready_pipe[0]);
    close(go_pipe[1]);
    _exit(load_generator_main(port, workers, seconds, ready_pipe[1],
                              go_pipe[0]));
  }
  close(ready_pipe[1]);
  close(go_pipe[0]);
  int64_t join_start = now_ns();
  char byte = 0;
  if (read(ready_pipe[0], &byte, 1) != 1) {
    fprintf(stderr, "load generator failed during the handshakes\n");
    return 1;
  }
  double join_seconds = (double)(now_ns() - join_start) / 1e9;
  uint32_t connected =
      pcp_fabric_worker_count(endpoint, PCP_FABRIC_WORKER_CONNECTED);
  int64_t joined_rss = rss_bytes();
  int64_t joined_live = counting.live_bytes;

  // Steady window: baseline CPU, frames and latency now.
  pcp_fabric_endpoint_stats_reset_latency(endpoint);
  pcp_fabric_endpoint_stats_t before;
  pcp_fabric_endpoint_stats_query(endpoint, &before);
  double cpu_before = cpu_seconds();
  int64_t wall_before = now_ns();
  PCP_ASSERT(write(go_pipe[1], &byte, 1) == 1);
  uint64_t sent = 0;
  if (read(ready_pipe[0], &sent, sizeof(sent)) != (ssize_t)sizeof(sent)) {
    fprintf(stderr, "load generator failed\n");
    return 1;
  }
  double cpu = cpu_seconds() - cpu_before;
  double wall = (double)(now_ns() - wall_before) / 1e9;
  pcp_fabric_endpoint_stats_t after;
  pcp_fabric_endpoint_stats_query(endpoint, &after);
  uint32_t still_connected = after.workers_connected;
  PCP_ASSERT(write(go_pipe[1], &byte, 1) == 1);
  waitpid(child, NULL, 0);

  uint64_t frames_in = after.frames_in - before.frames_in;
  double per_worker_alloc =
      (double)(joined_live - idle_live) / (connected ? connected : 1);
  double per_worker_rss =
      (double)(joined_rss - idle_rss) / (connected ? connected : 1);
  double p99_ms = (double)after.handling_p99_ns / 1e6;
  printf("workers: %u connected after the handshakes (%.2f s to join all), "
         "%u still connected after %.1f s\n",
         connected, join_seconds, still_connected, wall);
  printf("heartbeats: %llu sent by the workers, %llu frames received by the "
         "gateway in the window, evictions %llu\n",
         (unsigned long long)sent, (unsigned long long)frames_in,
         (unsigned long long)after.evictions);
  printf("gateway CPU: %.3f s over %.1f s = %.1f%% of a core; %.2f us per "
         "heartbeat received\n",
         cpu, wall, 100.0 * cpu / wall,
         frames_in ? cpu * 1e6 / (double)frames_in : 0.0);
  printf("memory per connected worker: %.1f KiB allocated by the endpoint, "
         "%.1f KiB RSS growth (goal <= 64 KiB)\n",
         per_worker_alloc / 1024.0, per_worker_rss / 1024.0);
  printf("handling latency per read event: p50 %.1f us, p99 %.1f us, max "
         "%.1f us (%llu events)\n",
         (double)after.handling_p50_ns / 1e3,
         (double)after.handling_p99_ns / 1e3,
         (double)after.handling_max_ns / 1e3,
         (unsigned long long)(after.events_handled - before.events_handled));
  pcp_fabric_endpoint_release(endpoint);
  printf("fabric_scale ratio=%.4f\n", p99_ms / 10.0);
  return 0;
}
