// SPDX-License-Identifier: Apache-2.0
//
// fabric_scale: 1000 simulated workers heartbeating at 1 Hz against one
// fabric endpoint, and the end-to-end heartbeat round trip against a
// minimal epoll server doing the same round trips over TCP.
//
// The load generator is a forked process with one thread that opens every
// connection over a real loopback socket and drives all of them from one
// poll loop and reads what comes back. The round trip of a heartbeat is the
// protocol's (docs/protocol.md s.3.5): from the moment the worker sends seq
// n to the moment it receives the peer's heartbeat whose ack is >= n (each
// side sends one every H = 1 s, carrying the last seq it received). Each
// worker answers every peer heartbeat with its own at once (its first beat
// staggered over the first second, and on its own 1.5 H after the last if
// the peer is silent), so a round trip is one interval of the peer's
// heartbeat timer plus the work on both sides and the two transits, and
// does not depend on the phase of the two timers: its excess over H is how
// late the peer's heartbeats come under the load. Only answered beats are
// timed. After the window the workers stop beating and keep reading for
// 2.5 H, so every beat sent can be acked.
//
//   baseline: a minimal epoll server in this process (one thread, no
//             handshake, no state machine): per connection it decodes the
//             frames, keeps the last seq, and sends its own heartbeat every
//             H from the accept with that ack (same codec, same frames);
//   fabric:   a pcp_fabric endpoint (H = 1 s) in this process; each
//             connection first completes the whole handshake (HELLO,
//             CHALLENGE, JOIN, HMAC proof, ACCEPT).
//
// Also measured on the fabric side, over the steady window: gateway CPU per
// heartbeat, memory per connected worker (counting allocator and RSS
// growth), loop-thread handling time per read event.
// Goals: no eviction (the endpoint's count, and no worker connection
// closed), every worker still connected, every heartbeat acked, and the
// slowest round trip under 2 H (a peer is evicted after 3 H of silence).
// A miss fails under PCP_BENCH_CHECK=1. Last line: `fabric_scale
// ratio=<baseline p99 / fabric p99 round trip>` (1: the fabric keeps its
// heartbeats as promptly as the minimal server).
//
// Usage: fabric_scale [workers] [seconds] (default 1000 10; 1..20000 and
// 1..600).

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "fabric/fabric.h"
#include "fabric/fake_worker.h"

#define TOKEN_ENV "PCP_BENCH_FABRIC_TOKEN"
#define TOKEN "bench-token"
#define H_NS INT64_C(1000000000)
#define SENT_RING 8  // send times kept per worker (a beat older is lost)

static int64_t now_ns(void) {
  return pcp_clock_now_ns(pcp_clock_system());
}

static void raise_nofile(rlim_t wanted) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0)
    return;
  if (limit.rlim_cur >= wanted)
    return;
  limit.rlim_cur = wanted < limit.rlim_max ? wanted : limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

static int64_t rss_bytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f)
    return 0;
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

// What the load generator reports through the pipe.
typedef struct round_trips_t {
  uint64_t sent;     // heartbeats sent
  uint64_t acked;    // of them, acked by the peer
  uint64_t closed;   // worker connections the peer closed (evictions)
  uint64_t samples;  // round trips measured
  int64_t p50_ns;
  int64_t p99_ns;
  int64_t max_ns;
} round_trips_t;

typedef struct client_t {
  int fd;
  int64_t next_beat_ns;
  uint64_t seq;    // last seq sent
  uint64_t acked;  // highest ack received
  int64_t sent_ns[SENT_RING];
  bool answered[SENT_RING];  // sent right after a peer heartbeat
  bool peer_beat;            // a peer heartbeat arrived: answer it now
  pcp_proto_frame_decoder_t decoder;
} client_t;

static int compare_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return x < y ? -1 : x > y;
}

static void send_beat(client_t* c, const pcp_proto_limits_t* limits,
                      int64_t now, bool answer, round_trips_t* out) {
  pcp_proto_heartbeat_t hb = {.seq = ++c->seq, .ack = 0};
  pcp_proto_encoded_frame_t frame;
  PCP_CHECK_OK(pcp_proto_heartbeat_encode(1, 0, &hb, limits,
                                          pcp_allocator_system(), &frame));
  uint8_t* flat = NULL;
  size_t length = 0;
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(&frame, pcp_allocator_system(),
                                               &flat, &length));
  pcp_proto_encoded_frame_deinitialize(&frame);
  c->sent_ns[c->seq % SENT_RING] = now;
  c->answered[c->seq % SENT_RING] = answer;
  if (fake_send_all(c->fd, flat, length))
    ++out->sent;
  pcp_allocator_free(pcp_allocator_system(), flat);
}

// Reads what |c|'s peer sent; a heartbeat's ack ends the round trips of
// the beats it covers. False when the peer closed the connection.
static bool read_peer(client_t* c, int64_t* samples, uint64_t capacity,
                      round_trips_t* out) {
  static uint8_t buffer[1 << 16];
  for (;;) {
    ssize_t n = recv(c->fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0)
      return false;
    if (n < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    int64_t now = now_ns();
    size_t at = 0;
    while (at < (size_t)n) {
      size_t consumed = 0;
      pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
      PCP_CHECK_OK(pcp_proto_frame_decoder_feed(
          &c->decoder, buffer + at, (size_t)n - at, &consumed, &result));
      at += consumed;
      if (result != PCP_PROTO_PARSE_FRAME_READY)
        continue;
      pcp_proto_frame_t frame;
      memset(&frame, 0, sizeof(frame));
      pcp_proto_frame_decoder_take(&c->decoder, &frame);
      pcp_proto_heartbeat_t hb;
      if (frame.header.type == PCP_PROTO_MESSAGE_HEARTBEAT &&
          !pcp_proto_heartbeat_parse(&frame, &hb)) {
        uint64_t ack = hb.ack < c->seq ? hb.ack : c->seq;
        for (uint64_t k = c->acked + 1; k <= ack; ++k) {
          ++out->acked;
          if (k + SENT_RING > c->seq && c->answered[k % SENT_RING] &&
              out->samples < capacity) {
            samples[out->samples++] = now - c->sent_ns[k % SENT_RING];
          }
        }
        if (ack > c->acked)
          c->acked = ack;
        c->peer_beat = true;
      }
      pcp_proto_frame_deinitialize(&frame);
    }
  }
}

// |handshake|: each connection joins the fabric first; otherwise plain TCP
// (the baseline server).
static int load_generator_main(uint16_t port, int workers, int seconds,
                               bool handshake, int ready_fd, int go_fd) {
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
    if (handshake) {
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
    }
    clients[i].fd = fw->fd;
    fw->fd = -1;
    fake_worker_close(fw);
    pcp_proto_frame_decoder_initialize(&limits, pcp_allocator_system(),
                                       &clients[i].decoder);
    pcp_proto_frame_decoder_set_version(&clients[i].decoder, 1);
  }
  free(fw);
  char byte = 1;
  ssize_t w = write(ready_fd, &byte, 1);
  (void)w;
  ssize_t r = read(go_fd, &byte, 1);  // the gateway took its baseline
  (void)r;
  uint64_t capacity = (uint64_t)workers * ((uint64_t)seconds + 2);
  int64_t* samples = calloc(capacity, sizeof(int64_t));
  round_trips_t out = {0};
  int64_t start = now_ns();
  for (int i = 0; i < workers; ++i) {
    clients[i].next_beat_ns = start + (int64_t)i * H_NS / workers;
    fds[i].fd = clients[i].fd;
    fds[i].events = POLLIN;
  }
  // The window, then 2.5 H of reading only (the last beats' acks).
  int64_t end = start + (int64_t)seconds * H_NS;
  int64_t drain_end = end + 5 * H_NS / 2;
  for (int64_t now = now_ns(); now < drain_end; now = now_ns()) {
    if (now >= end && out.acked == out.sent)
      break;
    // A worker answers each peer heartbeat with its own at once (so the
    // round trip is one peer interval plus the work on both sides, whatever
    // the phase of the two timers), and beats on its own 1.5 H after its
    // last one if none came (the first beats, staggered).
    for (int i = 0; now < end && i < workers; ++i) {
      client_t* c = &clients[i];
      bool answer = c->peer_beat;
      if (fds[i].fd < 0 || (!answer && now < c->next_beat_ns))
        continue;
      c->peer_beat = false;
      c->next_beat_ns = now + 3 * H_NS / 2;
      send_beat(c, &limits, now, answer, &out);
    }
    int ready = poll(fds, (nfds_t)workers, 2);
    for (int i = 0; ready > 0 && i < workers; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        continue;
      }
      if (!read_peer(&clients[i], samples, capacity, &out)) {
        ++out.closed;
        fds[i].fd = -1;  // closed by the peer: stop polling it
      }
    }
  }
  qsort(samples, out.samples, sizeof(int64_t), compare_i64);
  if (out.samples > 0) {
    out.p50_ns = samples[(out.samples - 1) / 2];
    out.p99_ns = samples[(out.samples - 1) * 99 / 100];
    out.max_ns = samples[out.samples - 1];
  }
  w = write(ready_fd, &out, sizeof(out));
  (void)w;
  // Stay connected until the gateway has taken its closing figures.
  if (read(go_fd, &byte, 1) < 0)
    fprintf(stderr, "go pipe: %s\n", strerror(errno));
  for (int i = 0; i < workers; ++i) {
    close(clients[i].fd);
    pcp_proto_frame_decoder_deinitialize(&clients[i].decoder);
  }
  free(samples);
  free(clients);
  free(fds);
  return 0;
}

// Forks the load generator against |port|; returns its pid and the parent's
// pipe ends (ready/results in, go out).
static pid_t load_generator_start(uint16_t port, int workers, int seconds,
                                  bool handshake, int* out_ready, int* out_go) {
  int ready_pipe[2], go_pipe[2];
  PCP_ASSERT(pipe(ready_pipe) == 0 && pipe(go_pipe) == 0);
  fflush(stdout);
  pid_t child = fork();
  PCP_ASSERT(child >= 0);
  if (child == 0) {
    close(ready_pipe[0]);
    close(go_pipe[1]);
    _exit(load_generator_main(port, workers, seconds, handshake, ready_pipe[1],
                              go_pipe[0]));
  }
  close(ready_pipe[1]);
  close(go_pipe[0]);
  *out_ready = ready_pipe[0];
  *out_go = go_pipe[1];
  return child;
}

//===----------------------------------------------------------------------===//
// Baseline: a minimal epoll heartbeat server (this process, one thread)
//===----------------------------------------------------------------------===//

typedef struct echo_conn_t {
  int fd;
  uint64_t seq_tx;
  uint64_t seq_rx;
  int64_t next_beat_ns;
  pcp_proto_frame_decoder_t decoder;
} echo_conn_t;

typedef struct echo_server_t {
  int listen_fd;
  int epoll_fd;
  uint16_t port;
  _Atomic bool stop;
  echo_conn_t* conns;
  int count;
  int capacity;
  pcp_proto_limits_t limits;
} echo_server_t;

// Reads a connection's frames; a heartbeat's seq becomes the next ack.
static void echo_read(echo_conn_t* c) {
  static uint8_t buffer[1 << 16];
  for (;;) {
    ssize_t n = recv(c->fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n <= 0)
      return;
    size_t at = 0;
    while (at < (size_t)n) {
      size_t consumed = 0;
      pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
      pcp_status_t status = pcp_proto_frame_decoder_feed(
          &c->decoder, buffer + at, (size_t)n - at, &consumed, &result);
      pcp_bench_check("fabric_scale", status, "baseline frame");
      at += consumed;
      if (result != PCP_PROTO_PARSE_FRAME_READY)
        continue;
      pcp_proto_frame_t frame;
      memset(&frame, 0, sizeof(frame));
      pcp_proto_frame_decoder_take(&c->decoder, &frame);
      pcp_proto_heartbeat_t hb;
      if (frame.header.type == PCP_PROTO_MESSAGE_HEARTBEAT &&
          !pcp_proto_heartbeat_parse(&frame, &hb) && hb.seq > c->seq_rx) {
        c->seq_rx = hb.seq;
      }
      pcp_proto_frame_deinitialize(&frame);
    }
  }
}

static void echo_beat(echo_server_t* server, echo_conn_t* c) {
  pcp_proto_heartbeat_t hb = {.seq = ++c->seq_tx, .ack = c->seq_rx};
  pcp_proto_encoded_frame_t frame;
  PCP_CHECK_OK(pcp_proto_heartbeat_encode(1, 0, &hb, &server->limits,
                                          pcp_allocator_system(), &frame));
  uint8_t* flat = NULL;
  size_t length = 0;
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(&frame, pcp_allocator_system(),
                                               &flat, &length));
  pcp_proto_encoded_frame_deinitialize(&frame);
  if (send(c->fd, flat, length, MSG_DONTWAIT | MSG_NOSIGNAL) !=
      (ssize_t)length) {
    fprintf(stderr, "fabric_scale: baseline: short heartbeat write\n");
  }
  pcp_allocator_free(pcp_allocator_system(), flat);
}

// The server's loop: accept, read, and each connection's heartbeat every H
// from its accept (1 ms timer granularity).
static void* echo_main(void* arg) {
  echo_server_t* server = arg;
  struct epoll_event events[64];
  while (!atomic_load(&server->stop)) {
    int n = epoll_wait(server->epoll_fd, events, 64, 1);
    int64_t now = now_ns();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u32 != UINT32_MAX) {
        echo_read(&server->conns[events[i].data.u32]);
        continue;
      }
      for (;;) {
        int fd = accept(server->listen_fd, NULL, NULL);
        if (fd < 0)
          break;
        PCP_ASSERT(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
        if (server->count == server->capacity) {
          close(fd);
          continue;
        }
        echo_conn_t* c = &server->conns[server->count];
        c->fd = fd;
        c->next_beat_ns = now + H_NS;
        pcp_proto_frame_decoder_initialize(&server->limits,
                                           pcp_allocator_system(), &c->decoder);
        pcp_proto_frame_decoder_set_version(&c->decoder, 1);
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u32 = (uint32_t)server->count};
        PCP_ASSERT(epoll_ctl(server->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0);
        ++server->count;
      }
    }
    for (int i = 0; i < server->count; ++i) {
      echo_conn_t* c = &server->conns[i];
      if (now < c->next_beat_ns)
        continue;
      c->next_beat_ns += H_NS;
      echo_beat(server, c);
    }
  }
  return NULL;
}

static void echo_start(int capacity, echo_server_t* server,
                       pthread_t* out_thread) {
  memset(server, 0, sizeof(*server));
  server->limits = pcp_proto_limits_default();
  server->capacity = capacity;
  server->conns = calloc((size_t)capacity, sizeof(echo_conn_t));
  server->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  PCP_ASSERT(server->conns && server->listen_fd >= 0);
  PCP_ASSERT(
      bind(server->listen_fd, (struct sockaddr*)&addr, sizeof(addr)) == 0 &&
      listen(server->listen_fd, 4096) == 0 &&
      getsockname(server->listen_fd, (struct sockaddr*)&addr, &length) == 0);
  server->port = ntohs(addr.sin_port);
  server->epoll_fd = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
  PCP_ASSERT(server->epoll_fd >= 0 && epoll_ctl(server->epoll_fd, EPOLL_CTL_ADD,
                                                server->listen_fd, &ev) == 0);
  PCP_ASSERT(pthread_create(out_thread, NULL, echo_main, server) == 0);
}

static void echo_stop(echo_server_t* server, pthread_t thread) {
  atomic_store(&server->stop, true);
  pthread_join(thread, NULL);
  for (int i = 0; i < server->count; ++i) {
    close(server->conns[i].fd);
    pcp_proto_frame_decoder_deinitialize(&server->conns[i].decoder);
  }
  close(server->epoll_fd);
  close(server->listen_fd);
  free(server->conns);
}

// Runs the load generator against the baseline server.
static round_trips_t run_baseline(int workers, int seconds) {
  echo_server_t server;
  pthread_t thread;
  echo_start(workers + 16, &server, &thread);
  int ready = -1, go = -1;
  pid_t child =
      load_generator_start(server.port, workers, seconds, false, &ready, &go);
  char byte = 0;
  round_trips_t out = {0};
  if (read(ready, &byte, 1) != 1 || write(go, &byte, 1) != 1 ||
      read(ready, &out, sizeof(out)) != (ssize_t)sizeof(out)) {
    fprintf(stderr, "fabric_scale: baseline load generator failed\n");
    exit(1);
  }
  PCP_ASSERT(write(go, &byte, 1) == 1);
  waitpid(child, NULL, 0);
  close(ready);
  close(go);
  echo_stop(&server, thread);
  return out;
}

static void print_round_trips(const char* side, const round_trips_t* rt) {
  printf(
      "%s heartbeat round trip: p50 %.1f ms, p99 %.1f ms, max %.1f ms; "
      "over H: p50 %.1f ms, p99 %.1f ms (%llu timed, %llu sent, %llu "
      "acked, %llu connections closed by the peer)\n",
      side, (double)rt->p50_ns / 1e6, (double)rt->p99_ns / 1e6,
      (double)rt->max_ns / 1e6, (double)(rt->p50_ns - H_NS) / 1e6,
      (double)(rt->p99_ns - H_NS) / 1e6, (unsigned long long)rt->samples,
      (unsigned long long)rt->sent, (unsigned long long)rt->acked,
      (unsigned long long)rt->closed);
}

//===----------------------------------------------------------------------===//
// Gateway (this process)
//===----------------------------------------------------------------------===//

int main(int argc, char** argv) {
  long workers_arg = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
  long seconds_arg = argc > 2 ? strtol(argv[2], NULL, 10) : 10;
  if (argc > 3 || workers_arg < 1 || workers_arg > 20000 || seconds_arg < 1 ||
      seconds_arg > 600) {
    fprintf(stderr,
            "usage: fabric_scale [workers 1..20000] [seconds 1..600]\n");
    return 2;
  }
  int workers = (int)workers_arg, seconds = (int)seconds_arg;
  raise_nofile((rlim_t)workers + 256);
  setenv(TOKEN_ENV, TOKEN, 1);
  pcp_log_set_level(PCP_LOG_WARN);

  // The baseline first (its own server and load generator), then the fabric.
  round_trips_t baseline = run_baseline(workers, seconds);

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

  int ready = -1, go = -1;
  pid_t child = load_generator_start(port, workers, seconds, true, &ready, &go);
  int64_t join_start = now_ns();
  char byte = 0;
  if (read(ready, &byte, 1) != 1) {
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
  PCP_ASSERT(write(go, &byte, 1) == 1);
  round_trips_t fabric = {0};
  if (read(ready, &fabric, sizeof(fabric)) != (ssize_t)sizeof(fabric)) {
    fprintf(stderr, "load generator failed\n");
    return 1;
  }
  double cpu = cpu_seconds() - cpu_before;
  double wall = (double)(now_ns() - wall_before) / 1e9;
  pcp_fabric_endpoint_stats_t after;
  pcp_fabric_endpoint_stats_query(endpoint, &after);
  uint32_t still_connected = after.workers_connected;
  PCP_ASSERT(write(go, &byte, 1) == 1);
  waitpid(child, NULL, 0);
  close(ready);
  close(go);

  uint64_t frames_in = after.frames_in - before.frames_in;
  double per_worker_alloc =
      (double)(joined_live - idle_live) / (connected ? connected : 1);
  double per_worker_rss =
      (double)(joined_rss - idle_rss) / (connected ? connected : 1);
  printf(
      "workers: %u connected after the handshakes (%.2f s to join all), "
      "%u still connected after %.1f s\n",
      connected, join_seconds, still_connected, wall);
  printf(
      "heartbeats: %llu sent by the workers, %llu frames received by the "
      "gateway in the window, evictions %llu\n",
      (unsigned long long)fabric.sent, (unsigned long long)frames_in,
      (unsigned long long)after.evictions);
  printf(
      "gateway CPU: %.3f s over %.1f s = %.1f%% of a core; %.2f us per "
      "heartbeat received\n",
      cpu, wall, 100.0 * cpu / wall,
      frames_in ? cpu * 1e6 / (double)frames_in : 0.0);
  printf(
      "memory per connected worker: %.1f KiB allocated by the endpoint, "
      "%.1f KiB RSS growth (goal <= 64 KiB)\n",
      per_worker_alloc / 1024.0, per_worker_rss / 1024.0);
  printf(
      "handling latency per read event: p50 %.1f us, p99 %.1f us, max "
      "%.1f us (%llu events)\n",
      (double)after.handling_p50_ns / 1e3, (double)after.handling_p99_ns / 1e3,
      (double)after.handling_max_ns / 1e3,
      (unsigned long long)(after.events_handled - before.events_handled));
  pcp_fabric_endpoint_release(endpoint);
  print_round_trips("baseline (minimal epoll server)", &baseline);
  print_round_trips("fabric endpoint", &fabric);
  bool met =
      pcp_bench_goal("fabric_scale", after.evictions == 0 && fabric.closed == 0,
                     "no eviction");
  met &= pcp_bench_goal(
      "fabric_scale",
      still_connected == (uint32_t)workers && connected == (uint32_t)workers,
      "every worker joined and still connected");
  met &= pcp_bench_goal("fabric_scale",
                        fabric.sent > 0 && fabric.acked == fabric.sent,
                        "every heartbeat acked");
  met &= pcp_bench_goal("fabric_scale", fabric.max_ns < 2 * H_NS,
                        "slowest round trip under 2 H");
  met &= pcp_bench_goal("fabric_scale",
                        baseline.sent > 0 && baseline.acked == baseline.sent,
                        "the baseline acked every heartbeat (valid run)");
  double ratio =
      fabric.p99_ns > 0 ? (double)baseline.p99_ns / (double)fabric.p99_ns : 0.0;
  printf("fabric_scale ratio=%.3f\n", ratio);
  return pcp_bench_exit_code(met);
}
