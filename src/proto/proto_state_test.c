// SPDX-License-Identifier: Apache-2.0
//
// State-machine tests: scripted event sequences through the gateway and
// worker machines, bytes piped between them, time passed in by hand.

#include "proto/proto_test_impl.h"

#define MS 1000000LL
static const uint8_t kToken[] = "join-token-for-tests";

typedef struct recorded_t {
  pcp_proto_action_t items[256];
  size_t count;
} recorded_t;

static void recorded_clear(recorded_t* r) {
  for (size_t i = 0; i < r->count; ++i) {
    pcp_proto_action_deinitialize(&r->items[i]);
  }
  r->count = 0;
}

static size_t recorded_count(const recorded_t* r, pcp_proto_action_type_t t) {
  size_t n = 0;
  for (size_t i = 0; i < r->count; ++i) n += r->items[i].type == t;
  return n;
}

static pcp_proto_action_t* recorded_find(recorded_t* r,
                                         pcp_proto_action_type_t t) {
  for (size_t i = 0; i < r->count; ++i) {
    if (r->items[i].type == t)
      return &r->items[i];
  }
  return NULL;
}

typedef struct harness_t {
  pcp_proto_gateway_conn_t* gateway;
  pcp_proto_worker_t* worker;
  pcp_rng_t rng;
  recorded_t gw;         // gateway's non-SEND actions
  recorded_t wk;         // worker's non-SEND actions
  uint64_t gw_sent[64];  // types of frames the gateway sent, in order
  size_t gw_sent_count;
  uint64_t wk_sent[64];
  size_t wk_sent_count;
  bool drop_to_gateway;  // a partition: worker -> gateway bytes lost
  bool link_up;
  // A slow link: SENDs queue on |wire| (0: to the worker, 1: to the
  // gateway) and trickle() delivers a few bytes per call, in order.
  bool slow;
  uint8_t* wire[2];
  size_t wire_length[2];
  size_t wire_offset[2];
  bool stalled[2];  // nothing of that direction arrives any more
  int64_t now;
  uint8_t nonce_seed;
  pcp_proto_limits_t limits;
} harness_t;

static pcp_proto_worker_config_t worker_config(const pcp_proto_limits_t* l) {
  pcp_proto_worker_config_t c = {0};
  c.limits = *l;
  c.heartbeat_interval_ms = 1000;
  c.join.worker_id = "site-a-ns-node-pod-cpu-default-device-0";
  c.join.backend = "cpu";
  c.join.target = "host";
  c.join.device_id = 0;
  c.join.drivers[0] = "local-task";
  c.join.driver_count = 1;
  c.join.runtime_version = "3.13.0";
  c.join.compiler_version = "3.13.0";
  c.join.node_manager_id = "nm-1";
  c.join.supervisor_id = 0;
  c.join_token = kToken;
  c.join_token_length = sizeof(kToken) - 1;
  return c;
}

static void new_gateway(harness_t* h, const uint8_t* token, size_t length) {
  pcp_proto_gateway_config_t c = {0};
  c.limits = h->limits;
  c.heartbeat_interval_ms = 1000;
  c.join_token = token;
  c.join_token_length = length;
  memset(c.nonce, h->nonce_seed++, sizeof(c.nonce));
  if (h->gateway)
    pcp_proto_gateway_conn_release(h->gateway);
  ASSERT_OK(pcp_proto_gateway_conn_create(&c, h->now, pcp_allocator_system(),
                                          &h->gateway));
}

static void harness_init(harness_t* h, const pcp_proto_limits_t* limits) {
  memset(h, 0, sizeof(*h));
  h->limits = limits ? *limits : pcp_proto_limits_default();
  h->now = 1000 * MS;
  pcp_rng_initialize(42, &h->rng);
  pcp_proto_worker_config_t c = worker_config(&h->limits);
  ASSERT_OK(
      pcp_proto_worker_create(&c, &h->rng, pcp_allocator_system(), &h->worker));
}

static void harness_free(harness_t* h) {
  free(h->wire[0]);
  free(h->wire[1]);
  recorded_clear(&h->gw);
  recorded_clear(&h->wk);
  pcp_proto_gateway_conn_release(h->gateway);
  pcp_proto_worker_release(h->worker);
}

static void send_bytes(harness_t* h, bool to_gateway,
                       pcp_proto_encoded_frame_t* frame) {
  size_t n;
  uint8_t* bytes = test_flatten(frame, &n);
  if (h->slow) {
    int d = to_gateway ? 1 : 0;
    h->wire[d] = realloc(h->wire[d], h->wire_length[d] + n);
    assert_non_null(h->wire[d]);
    memcpy(h->wire[d] + h->wire_length[d], bytes, n);
    h->wire_length[d] += n;
    free(bytes);
    return;
  }
  if (to_gateway) {
    if (!h->drop_to_gateway && h->gateway) {
      ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h->gateway, bytes, n, h->now));
    }
  } else {
    ASSERT_OK(pcp_proto_worker_on_bytes(h->worker, bytes, n, h->now));
  }
  free(bytes);
}

// Moves actions until both machines are quiet: SENDs are delivered (while
// the link is up), everything else is recorded. CONNECT is answered by
// on_connected; CLOSE takes the link down.
static void pump(harness_t* h) {
  bool progress = true;
  while (progress) {
    progress = false;
    pcp_proto_action_t a;
    while (h->gateway && pcp_proto_gateway_conn_next_action(h->gateway, &a)) {
      progress = true;
      if (a.type == PCP_PROTO_ACTION_SEND) {
        h->gw_sent[h->gw_sent_count++ % 64] = a.frame.type;
        if (h->link_up)
          send_bytes(h, false, &a.frame);
        pcp_proto_action_deinitialize(&a);
        continue;
      }
      if (a.type == PCP_PROTO_ACTION_CLOSE && h->link_up) {
        h->link_up = false;
        ASSERT_OK(pcp_proto_worker_on_closed(h->worker, h->now));
      }
      h->gw.items[h->gw.count++] = a;
    }
    while (pcp_proto_worker_next_action(h->worker, &a)) {
      progress = true;
      if (a.type == PCP_PROTO_ACTION_SEND) {
        h->wk_sent[h->wk_sent_count++ % 64] = a.frame.type;
        if (h->link_up)
          send_bytes(h, true, &a.frame);
        pcp_proto_action_deinitialize(&a);
        continue;
      }
      if (a.type == PCP_PROTO_ACTION_CONNECT) {
        h->link_up = true;
        ASSERT_OK(pcp_proto_worker_on_connected(h->worker, h->now));
      } else if (a.type == PCP_PROTO_ACTION_CLOSE && h->link_up) {
        h->link_up = false;
        if (h->gateway) {
          ASSERT_OK(pcp_proto_gateway_conn_on_closed(h->gateway, h->now));
        }
      }
      h->wk.items[h->wk.count++] = a;
    }
  }
}

static void tick(harness_t* h, int64_t advance_ns) {
  h->now += advance_ns;
  if (h->gateway)
    ASSERT_OK(pcp_proto_gateway_conn_on_tick(h->gateway, h->now));
  ASSERT_OK(pcp_proto_worker_on_tick(h->worker, h->now));
  pump(h);
}

// Slow link: delivers at most |budget| queued bytes each way (none on a
// stalled direction), in one on_bytes call per direction, then pumps. A
// link that went down loses what was on it. Returns the bytes delivered.
static size_t trickle(harness_t* h, size_t budget) {
  size_t delivered = 0;
  for (int d = 0; d < 2; ++d) {
    if (!h->link_up) {
      h->wire_length[d] = h->wire_offset[d] = 0;
      continue;
    }
    size_t n = h->wire_length[d] - h->wire_offset[d];
    if (n > budget)
      n = budget;
    if (n == 0 || h->stalled[d])
      continue;
    const uint8_t* p = h->wire[d] + h->wire_offset[d];
    h->wire_offset[d] += n;
    delivered += n;
    if (d == 1) {
      ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h->gateway, p, n, h->now));
    } else {
      ASSERT_OK(pcp_proto_worker_on_bytes(h->worker, p, n, h->now));
    }
  }
  pump(h);
  return delivered;
}

// Runs the handshake up to JOIN_VERIFIED and accepts with |params|.
static void join(harness_t* h, const pcp_proto_gateway_accept_params_t* p) {
  pump(h);
  assert_int_equal(pcp_proto_gateway_conn_state(h->gateway),
                   PCP_PROTO_GATEWAY_VERIFIED);
  assert_non_null(recorded_find(&h->gw, PCP_PROTO_ACTION_JOIN_VERIFIED));
  ASSERT_OK(pcp_proto_gateway_conn_accept(h->gateway, p, h->now));
  pump(h);
  assert_int_equal(pcp_proto_worker_state(h->worker), PCP_PROTO_WORKER_READY);
}

static pcp_proto_gateway_accept_params_t lease(uint64_t epoch, uint8_t fill) {
  pcp_proto_gateway_accept_params_t p = {.lease_epoch = epoch};
  memset(p.resume_token, fill, sizeof(p.resume_token));
  return p;
}

//===----------------------------------------------------------------------===//

static void handshake_and_heartbeats(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 0xAB);
  join(&h, &p);
  // Frame order of the handshake.
  assert_int_equal(h.wk_sent[0], PCP_PROTO_MESSAGE_HELLO);
  assert_int_equal(h.gw_sent[0], PCP_PROTO_MESSAGE_HELLO);
  assert_int_equal(h.gw_sent[1], PCP_PROTO_MESSAGE_CHALLENGE);
  assert_int_equal(h.wk_sent[1], PCP_PROTO_MESSAGE_JOIN);
  assert_int_equal(h.wk_sent[2], PCP_PROTO_MESSAGE_JOIN_PROOF);
  assert_int_equal(h.gw_sent[2], PCP_PROTO_MESSAGE_ACCEPT);
  const pcp_proto_join_t* j = pcp_proto_gateway_conn_join(h.gateway);
  assert_string_equal(j->worker_id, "site-a-ns-node-pod-cpu-default-device-0");
  assert_string_equal(j->backend, "cpu");
  assert_string_equal(j->drivers[0], "local-task");
  assert_false(j->has_resume);
  pcp_proto_action_t* accepted =
      recorded_find(&h.wk, PCP_PROTO_ACTION_ACCEPTED);
  assert_non_null(accepted);
  assert_false(accepted->resumed);
  assert_int_equal(accepted->lease_epoch, 1);
  // Ten seconds of ticks every 250 ms: heartbeats both ways, no eviction.
  size_t gw_before = h.gw_sent_count, wk_before = h.wk_sent_count;
  for (int i = 0; i < 40; ++i) tick(&h, 250 * MS);
  assert_int_equal(h.gw_sent_count - gw_before, 10);
  assert_int_equal(h.wk_sent_count - wk_before, 10);
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_EVICT), 0);
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_ACCEPTED);
  assert_int_equal(pcp_proto_gateway_conn_dropped_count(h.gateway), 0);
  harness_free(&h);
}

static void wrong_token_is_rejected(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  static const uint8_t other[] = "a-different-token";
  new_gateway(&h, other, sizeof(other) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pump(&h);
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_CLOSED);
  assert_null(recorded_find(&h.gw, PCP_PROTO_ACTION_JOIN_VERIFIED));
  assert_int_equal(h.gw_sent[h.gw_sent_count - 1], PCP_PROTO_MESSAGE_REJECT);
  pcp_proto_action_t* close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_non_null(close);
  assert_int_equal(pcp_status_code(close->status), PCP_STATUS_UNAUTHENTICATED);
  // The worker saw REJECT AUTH_FAILED and backs off H/10 with jitter.
  pcp_proto_action_t* rejected =
      recorded_find(&h.wk, PCP_PROTO_ACTION_REJECTED);
  assert_non_null(rejected);
  assert_int_equal(rejected->reject_reason, PCP_PROTO_REJECT_AUTH_FAILED);
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_BACKOFF);
  int64_t delay = pcp_proto_worker_reconnect_at_ns(h.worker) - h.now;
  assert_true(delay >= 50 * MS && delay <= 100 * MS);
  harness_free(&h);
}

static void silent_worker_is_evicted(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                               .name = "x"};
  pcp_proto_task_assign_t task = {
      .task_id = 77, .function = "main", .inputs = &in, .input_count = 1};
  uint64_t request_id = 0;
  ASSERT_OK(pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now,
                                               &request_id));
  pump(&h);
  assert_non_null(recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK));
  // SIGSTOP the worker: its bytes stop reaching the gateway. Half the
  // timeout (1.5 s) passes: no eviction.
  h.drop_to_gateway = true;
  for (int i = 0; i < 6; ++i) tick(&h, 250 * MS);
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_EVICT), 0);
  // Past 3H since the last frame: evicted at the next tick, task lost.
  int64_t deadline = pcp_proto_gateway_conn_deadline_ns(h.gateway);
  while (h.now < deadline) tick(&h, 250 * MS);
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_EVICT), 1);
  assert_true(h.now - deadline < 250 * MS);
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_CLOSED);
  pcp_proto_action_t* lost = recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_LOST);
  assert_non_null(lost);
  assert_int_equal(lost->task_id, 77);
  assert_int_equal(pcp_proto_gateway_conn_in_flight_count(h.gateway), 0);
  pcp_proto_action_t* close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_int_equal(pcp_status_code(close->status),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  // The worker noticed the close and cancelled its task.
  assert_non_null(recorded_find(&h.wk, PCP_PROTO_ACTION_CANCEL_TASK));
  assert_int_equal(pcp_proto_worker_in_flight_count(h.worker), 0);
  harness_free(&h);
}

static void silent_gateway_makes_worker_reconnect(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  // The gateway stops ticking (hung): the worker gives up after 3H.
  pcp_proto_gateway_conn_release(h.gateway);
  h.gateway = NULL;
  int64_t joined_at = h.now;
  while (!recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE)) tick(&h, 250 * MS);
  assert_true(h.now - joined_at >= 3000 * MS);
  assert_true(h.now - joined_at < 3250 * MS);
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_BACKOFF);
  assert_int_equal(pcp_proto_worker_attempt_count(h.worker), 1);
  pcp_proto_action_t* close = recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE);
  assert_non_null(close);
  assert_int_equal(pcp_status_code(close->status),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  harness_free(&h);
}

static void reconnect_keeps_identity_and_resumes(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t first = lease(3, 0x5C);
  join(&h, &first);
  char id[300];
  snprintf(id, sizeof(id), "%s",
           pcp_proto_gateway_conn_join(h.gateway)->worker_id);
  // The TCP connection drops.
  h.link_up = false;
  ASSERT_OK(pcp_proto_gateway_conn_on_closed(h.gateway, h.now));
  ASSERT_OK(pcp_proto_worker_on_closed(h.worker, h.now));
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_BACKOFF);
  recorded_clear(&h.wk);
  recorded_clear(&h.gw);
  // A new connection on the gateway; the worker reconnects after backoff.
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  while (pcp_proto_worker_state(h.worker) == PCP_PROTO_WORKER_BACKOFF) {
    tick(&h, 10 * MS);
  }
  pump(&h);
  const pcp_proto_join_t* j = pcp_proto_gateway_conn_join(h.gateway);
  assert_non_null(j);
  assert_string_equal(j->worker_id, id);  // same identity
  assert_true(j->has_resume);
  // The registry (here: this test) checks the resume block.
  assert_true(pcp_proto_join_resume_matches(j, 3, first.resume_token));
  pcp_proto_gateway_accept_params_t resumed = first;
  resumed.resumed = true;
  ASSERT_OK(pcp_proto_gateway_conn_accept(h.gateway, &resumed, h.now));
  pump(&h);
  pcp_proto_action_t* a = recorded_find(&h.wk, PCP_PROTO_ACTION_ACCEPTED);
  assert_non_null(a);
  assert_true(a->resumed);
  assert_int_equal(a->lease_epoch, 3);
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_DROP_SESSIONS));
  assert_int_equal(pcp_proto_worker_attempt_count(h.worker), 0);

  // Third connection: the gateway lost the lease (e.g. restarted): a fresh
  // epoch, not resumed; the worker drops its resident tensors.
  h.link_up = false;
  ASSERT_OK(pcp_proto_gateway_conn_on_closed(h.gateway, h.now));
  ASSERT_OK(pcp_proto_worker_on_closed(h.worker, h.now));
  recorded_clear(&h.wk);
  recorded_clear(&h.gw);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  while (pcp_proto_worker_state(h.worker) == PCP_PROTO_WORKER_BACKOFF) {
    tick(&h, 10 * MS);
  }
  pump(&h);
  j = pcp_proto_gateway_conn_join(h.gateway);
  assert_string_equal(j->worker_id, id);
  assert_false(pcp_proto_join_resume_matches(j, 9, first.resume_token));
  pcp_proto_gateway_accept_params_t fresh = lease(9, 0x77);
  ASSERT_OK(pcp_proto_gateway_conn_accept(h.gateway, &fresh, h.now));
  pump(&h);
  a = recorded_find(&h.wk, PCP_PROTO_ACTION_ACCEPTED);
  assert_false(a->resumed);
  assert_non_null(recorded_find(&h.wk, PCP_PROTO_ACTION_DROP_SESSIONS));
  assert_int_equal(pcp_proto_worker_lease_epoch(h.worker), 9);
  harness_free(&h);
}

static void backoff_grows_with_jitter_and_cap(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_action_t a;
  assert_true(pcp_proto_worker_next_action(h.worker, &a));
  assert_int_equal(a.type, PCP_PROTO_ACTION_CONNECT);
  pcp_proto_action_deinitialize(&a);
  // Nobody listens: every attempt fails at once.
  int64_t expected_max[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000};
  for (size_t i = 0; i < PCP_ARRAYSIZE(expected_max); ++i) {
    ASSERT_OK(pcp_proto_worker_on_closed(h.worker, h.now));
    assert_int_equal(pcp_proto_worker_attempt_count(h.worker), i + 1);
    int64_t delay = pcp_proto_worker_reconnect_at_ns(h.worker) - h.now;
    assert_true(delay >= expected_max[i] * MS / 2);
    assert_true(delay <= expected_max[i] * MS);
    // Nothing before the deadline, CONNECT at it.
    ASSERT_OK(pcp_proto_worker_on_tick(h.worker, h.now + delay - 1));
    assert_false(pcp_proto_worker_next_action(h.worker, &a));
    h.now += delay;
    ASSERT_OK(pcp_proto_worker_on_tick(h.worker, h.now));
    assert_true(pcp_proto_worker_next_action(h.worker, &a));
    assert_int_equal(a.type, PCP_PROTO_ACTION_CONNECT);
    pcp_proto_action_deinitialize(&a);
  }
  // Same seed, same delays: the simulator can replay a run.
  pcp_rng_t r1, r2;
  pcp_rng_initialize(7, &r1);
  pcp_rng_initialize(7, &r2);
  assert_int_equal(pcp_rng_next_u64(&r1), pcp_rng_next_u64(&r2));
  harness_free(&h);
}

static void duplicate_and_out_of_order_frames(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  pcp_proto_limits_t l = h.limits;
  pcp_allocator_t alloc = pcp_allocator_system();
  pcp_proto_encoded_frame_t e;

  // A duplicate heartbeat (same seq) is dropped but counts as life.
  pcp_proto_heartbeat_t hb = {.seq = 100, .ack = 0};
  // At the version the two ends negotiated (the highest both speak).
  ASSERT_OK(
      pcp_proto_heartbeat_encode(PCP_PROTO_VERSION_MAX, 0, &hb, &l, alloc, &e));
  size_t n;
  uint8_t* bytes = test_flatten(&e, &n);
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  free(bytes);
  assert_int_equal(pcp_proto_gateway_conn_dropped_count(h.gateway), 1);

  // Assign a task; the worker gets it once even if the frame is repeated.
  float x[2] = {1.5f, 2.5f};
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 1,
                           .shape = {2},
                           .data = x};
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_assign_t task = {
      .task_id = 5, .function = "main", .inputs = &in, .input_count = 1};
  memset(task.program, 0x99, 32);
  uint64_t request_id = 0;
  // Capture the assign frame to replay it.
  ASSERT_OK(pcp_proto_gateway_conn_assign_task(h.gateway, &task, &s, 1, h.now,
                                               &request_id));
  pcp_proto_action_t send;
  assert_true(pcp_proto_gateway_conn_next_action(h.gateway, &send));
  bytes = test_flatten(&send.frame, &n);
  pcp_proto_action_deinitialize(&send);
  ASSERT_OK(pcp_proto_worker_on_bytes(h.worker, bytes, n, h.now));
  ASSERT_OK(pcp_proto_worker_on_bytes(h.worker, bytes, n, h.now));
  free(bytes);
  pump(&h);
  assert_int_equal(recorded_count(&h.wk, PCP_PROTO_ACTION_RUN_TASK), 1);
  pcp_proto_action_t* run = recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK);
  pcp_proto_task_assign_t parsed;
  ASSERT_OK(pcp_proto_task_assign_parse(&run->received, &parsed));
  assert_int_equal(parsed.task_id, 5);
  assert_memory_equal(run->received.sections[0].data, x, sizeof(x));

  // The worker answers; a replayed result is dropped by the gateway.
  float y[2] = {3.0f, 5.0f};
  pcp_proto_section_t ys = {.name = "y",
                            .element_type = PCP_ELEMENT_TYPE_F32,
                            .rank = 1,
                            .shape = {2},
                            .data = y};
  pcp_proto_tensor_ref_t out = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_result_t result = {
      .task_id = 5, .outputs = &out, .output_count = 1};
  ASSERT_OK(pcp_proto_worker_task_complete(h.worker, &result, &ys, 1, h.now));
  assert_true(pcp_proto_worker_next_action(h.worker, &send));
  bytes = test_flatten(&send.frame, &n);
  pcp_proto_action_deinitialize(&send);
  uint64_t dropped = pcp_proto_gateway_conn_dropped_count(h.gateway);
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  free(bytes);
  pump(&h);
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_TASK_RESULT), 1);
  assert_int_equal(pcp_proto_gateway_conn_dropped_count(h.gateway),
                   dropped + 1);
  pcp_proto_action_t* res = recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_RESULT);
  assert_int_equal(res->task_id, 5);
  assert_memory_equal(res->received.sections[0].data, y, sizeof(y));
  // Completing twice on the worker is NOT_FOUND (not sent again).
  ASSERT_CODE(pcp_proto_worker_task_complete(h.worker, &result, &ys, 1, h.now),
              PCP_STATUS_NOT_FOUND);

  // A known message in the wrong direction/state closes with an ERROR.
  pcp_proto_hello_t hello = {
      .min_version = 1, .max_version = 1, .role = "worker"};
  ASSERT_OK(pcp_proto_hello_encode(1, 0, &hello, &l, alloc, &e));
  bytes = test_flatten(&e, &n);
  recorded_clear(&h.gw);
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  free(bytes);
  pump(&h);
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_CLOSED);
  pcp_proto_action_t* close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_int_equal(pcp_status_code(close->status),
                   PCP_STATUS_FAILED_PRECONDITION);
  harness_free(&h);
}

// Two peers of this build negotiate the newest version, so a task's
// resident names travel as a run (s.3.9.1) and the worker sees them back
// one by one.
static void negotiated_task_frames_carry_runs(void** state) {
  (void)state;
  harness_t h;
  harness_init(&h, NULL);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  pcp_proto_tensor_ref_t in[3] = {
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "p0"},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "p1"},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "p2"}};
  pcp_proto_keep_resident_t keep[2] = {{.output = 0, .as = "p0"},
                                       {.output = 1, .as = "p1"}};
  pcp_proto_task_assign_t task = {.task_id = 8,
                                  .session_id = "s",
                                  .function = "main",
                                  .inputs = in,
                                  .input_count = 3,
                                  .keep_resident = keep,
                                  .keep_resident_count = 2};
  memset(task.program, 0x42, 32);
  uint64_t request_id = 0;
  ASSERT_OK(pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now,
                                               &request_id));
  pcp_proto_action_t send;
  assert_true(pcp_proto_gateway_conn_next_action(h.gateway, &send));
  size_t n;
  uint8_t* bytes = test_flatten(&send.frame, &n);
  pcp_proto_action_deinitialize(&send);
  pcp_proto_limits_t l = h.limits;
  pcp_proto_frame_t f;
  ASSERT_OK(pcp_proto_frame_decode(bytes, n, &l, PCP_PROTO_VERSION_MAX,
                                   pcp_allocator_system(), &f));
  assert_int_equal(f.header.version, PCP_PROTO_VERSION_MAX);
  const json_t* inputs = json_object_get(f.control, "inputs");
  assert_int_equal(json_array_size(inputs), 1);
  assert_string_equal(json_string_value(json_object_get(
                          json_array_get(inputs, 0), "resident_run")),
                      "p");
  pcp_proto_frame_deinitialize(&f);
  ASSERT_OK(pcp_proto_worker_on_bytes(h.worker, bytes, n, h.now));
  free(bytes);
  pump(&h);
  pcp_proto_action_t* run = recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK);
  assert_non_null(run);
  pcp_proto_task_assign_t parsed;
  ASSERT_OK(pcp_proto_task_assign_parse(&run->received, &parsed));
  assert_int_equal(parsed.input_count, 3);
  assert_string_equal(parsed.inputs[2].name, "p2");
  assert_int_equal(parsed.keep_resident_count, 2);
  assert_int_equal(parsed.keep_resident[1].output, 1);
  assert_string_equal(parsed.keep_resident[1].as, "p1");
  harness_free(&h);
}

static void handshake_out_of_order_and_garbage(void** state) {
  (void)state;
  pcp_proto_limits_t l = pcp_proto_limits_default();
  pcp_allocator_t alloc = pcp_allocator_system();
  harness_t h;
  harness_init(&h, NULL);
  // JOIN_PROOF as the first frame: REJECT PROTOCOL_VIOLATION + CLOSE.
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  pcp_proto_join_proof_t proof = {.worker_id = "w"};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_join_proof_encode(1, 1, &proof, &l, alloc, &e));
  size_t n;
  uint8_t* bytes = test_flatten(&e, &n);
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  free(bytes);
  pump(&h);
  assert_int_equal(h.gw_sent[h.gw_sent_count - 1], PCP_PROTO_MESSAGE_REJECT);
  assert_non_null(recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE));
  recorded_clear(&h.gw);

  // Garbage bytes (an HTTP request on the fabric port): ERROR + CLOSE,
  // and the rest of the bytes are ignored.
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  const char http[] =
      "GET / HTTP/1.1\r\nHost: x\r\n\r\nmore bytes that never get parsed";
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, http, sizeof(http) - 1,
                                            h.now));
  pump(&h);
  pcp_proto_action_t* close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_non_null(close);
  assert_int_equal(pcp_status_code(close->status), PCP_STATUS_INVALID_ARGUMENT);
  recorded_clear(&h.gw);

  // A worker that only speaks versions after ours: HELLO(selected 0),
  // REJECT 2.
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  pcp_proto_hello_t future = {.min_version = PCP_PROTO_VERSION_MAX + 1,
                              .max_version = PCP_PROTO_VERSION_MAX + 2,
                              .role = "worker"};
  ASSERT_OK(pcp_proto_hello_encode(PCP_PROTO_VERSION_MAX + 2, 0, &future, &l,
                                   alloc, &e));
  bytes = test_flatten(&e, &n);
  size_t sent_before = h.gw_sent_count;
  ASSERT_OK(pcp_proto_gateway_conn_on_bytes(h.gateway, bytes, n, h.now));
  free(bytes);
  pump(&h);
  assert_int_equal(h.gw_sent_count - sent_before, 2);
  assert_int_equal(h.gw_sent[sent_before], PCP_PROTO_MESSAGE_HELLO);
  assert_int_equal(h.gw_sent[sent_before + 1], PCP_PROTO_MESSAGE_REJECT);
  close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_int_equal(pcp_status_code(close->status), PCP_STATUS_INCOMPATIBLE);
  recorded_clear(&h.gw);

  // A peer that connects and says nothing: REJECT HANDSHAKE_TIMEOUT at 5H.
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  for (int i = 0; i < 19; ++i) tick(&h, 250 * MS);
  assert_null(recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE));
  tick(&h, 250 * MS);
  close = recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE);
  assert_non_null(close);
  assert_int_equal(pcp_status_code(close->status),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  harness_free(&h);
}

static void program_offer_cached_and_fetched(void** state) {
  (void)state;
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.chunk_bytes = 1000;  // several chunks for a small program
  harness_t h;
  harness_init(&h, &l);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  size_t size = 3500;
  uint8_t* program = malloc(size);
  for (size_t i = 0; i < size; ++i) program[i] = (uint8_t)(i ^ (i >> 3));
  pcp_sha256_t hash;
  pcp_sha256_compute(program, size, &hash);
  pcp_proto_program_offer_t offer = {
      .byte_length = size, .backend = "cpu", .target = "host"};
  memcpy(offer.program, hash.bytes, 32);

  // 1. Cached on the worker: ACK cached, no transfer.
  uint64_t r1 = 0;
  ASSERT_OK(
      pcp_proto_gateway_conn_offer_program(h.gateway, &offer, h.now, &r1));
  pump(&h);
  pcp_proto_action_t* lookup =
      recorded_find(&h.wk, PCP_PROTO_ACTION_PROGRAM_LOOKUP);
  assert_non_null(lookup);
  assert_memory_equal(lookup->program, hash.bytes, 32);
  ASSERT_OK(pcp_proto_worker_program_lookup_done(h.worker, lookup->request_id,
                                                 true, h.now));
  pump(&h);
  assert_non_null(recorded_find(&h.gw, PCP_PROTO_ACTION_PROGRAM_READY));
  assert_null(recorded_find(&h.gw, PCP_PROTO_ACTION_PROGRAM_FETCH));
  recorded_clear(&h.gw);
  recorded_clear(&h.wk);

  // 2. Not cached: FETCH, chunks, STORE with the exact bytes, ACK stored.
  uint64_t r2 = 0;
  ASSERT_OK(
      pcp_proto_gateway_conn_offer_program(h.gateway, &offer, h.now, &r2));
  pump(&h);
  lookup = recorded_find(&h.wk, PCP_PROTO_ACTION_PROGRAM_LOOKUP);
  ASSERT_OK(pcp_proto_worker_program_lookup_done(h.worker, lookup->request_id,
                                                 false, h.now));
  pump(&h);
  pcp_proto_action_t* fetch =
      recorded_find(&h.gw, PCP_PROTO_ACTION_PROGRAM_FETCH);
  assert_non_null(fetch);
  assert_int_equal(fetch->request_id, r2);
  ASSERT_OK(
      pcp_proto_gateway_conn_send_program(h.gateway, r2, program, size, h.now));
  pump(&h);
  pcp_proto_action_t* store =
      recorded_find(&h.wk, PCP_PROTO_ACTION_PROGRAM_STORE);
  assert_non_null(store);
  assert_int_equal(store->blob_length, size);
  assert_memory_equal(store->blob, program, size);
  ASSERT_OK(pcp_proto_worker_program_stored(h.worker, store->request_id,
                                            pcp_ok_status(), h.now));
  pump(&h);
  pcp_proto_action_t* ready =
      recorded_find(&h.gw, PCP_PROTO_ACTION_PROGRAM_READY);
  assert_non_null(ready);
  assert_int_equal(ready->request_id, r2);
  recorded_clear(&h.gw);
  recorded_clear(&h.wk);

  // 3. Bytes that do not hash to the offered id: DATA_LOSS, no store.
  program[10] ^= 1;
  uint64_t r3 = 0;
  ASSERT_OK(
      pcp_proto_gateway_conn_offer_program(h.gateway, &offer, h.now, &r3));
  pump(&h);
  lookup = recorded_find(&h.wk, PCP_PROTO_ACTION_PROGRAM_LOOKUP);
  ASSERT_OK(pcp_proto_worker_program_lookup_done(h.worker, lookup->request_id,
                                                 false, h.now));
  pump(&h);
  ASSERT_OK(
      pcp_proto_gateway_conn_send_program(h.gateway, r3, program, size, h.now));
  pump(&h);
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_PROGRAM_STORE));
  pcp_proto_action_t* failed =
      recorded_find(&h.gw, PCP_PROTO_ACTION_PROGRAM_FAILED);
  assert_non_null(failed);
  assert_int_equal(pcp_status_code(failed->status), PCP_STATUS_DATA_LOSS);
  // The connection survives a bad transfer.
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_ACCEPTED);
  free(program);
  harness_free(&h);
}

static void in_flight_limit_cancel_and_task_errors(void** state) {
  (void)state;
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.max_in_flight = 2;
  harness_t h;
  harness_init(&h, &l);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                               .name = "x"};
  pcp_proto_task_assign_t task = {
      .function = "main", .inputs = &in, .input_count = 1};
  uint64_t r;
  task.task_id = 1;
  ASSERT_OK(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now, &r));
  ASSERT_CODE(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now, &r),
      PCP_STATUS_ALREADY_EXISTS);
  task.task_id = 2;
  ASSERT_OK(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now, &r));
  task.task_id = 3;
  ASSERT_CODE(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now, &r),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  pump(&h);
  assert_int_equal(recorded_count(&h.wk, PCP_PROTO_ACTION_RUN_TASK), 2);
  // Cancel task 1: the worker is asked, answers CANCELLED for it.
  ASSERT_OK(pcp_proto_gateway_conn_cancel_task(h.gateway, 1, "user", h.now));
  pump(&h);
  pcp_proto_action_t* cancel =
      recorded_find(&h.wk, PCP_PROTO_ACTION_CANCEL_TASK);
  assert_non_null(cancel);
  assert_int_equal(cancel->task_id, 1);
  pcp_status_t cancelled = pcp_make_status(PCP_STATUS_CANCELLED, "by user");
  ASSERT_OK(pcp_proto_worker_task_fail(h.worker, 1, cancelled, h.now));
  pcp_status_ignore(cancelled);
  pump(&h);
  pcp_proto_action_t* failed =
      recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_FAILED);
  assert_non_null(failed);
  assert_int_equal(failed->task_id, 1);
  assert_int_equal(pcp_status_code(failed->status), PCP_STATUS_CANCELLED);
  assert_int_equal(pcp_proto_gateway_conn_in_flight_count(h.gateway), 1);
  // Progress reaches the gateway while the task runs.
  pcp_proto_task_progress_t progress = {.task_id = 2,
                                        .state = PCP_PROTO_TASK_RUNNING};
  ASSERT_OK(pcp_proto_worker_task_progress(h.worker, &progress, h.now));
  pump(&h);
  assert_non_null(recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_PROGRESS));
  // Drain from the gateway: the worker refuses new work, keeps the old.
  ASSERT_OK(pcp_proto_gateway_conn_drain(h.gateway, 1000, h.now));
  pump(&h);
  assert_non_null(recorded_find(&h.wk, PCP_PROTO_ACTION_DRAIN));
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_DRAINING);
  // Shutdown: the worker stops for good, no reconnect.
  ASSERT_OK(pcp_proto_gateway_conn_shutdown(h.gateway, "done", h.now));
  pump(&h);
  assert_non_null(recorded_find(&h.wk, PCP_PROTO_ACTION_SHUTDOWN));
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_SHUTDOWN);
  recorded_clear(&h.wk);
  for (int i = 0; i < 100; ++i) tick(&h, 250 * MS);
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_CONNECT));
  harness_free(&h);
}

static void large_tensors_travel_as_blobs(void** state) {
  (void)state;
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.chunk_bytes = 1024;  // anything over 1 KiB inline goes chunked
  harness_t h;
  harness_init(&h, &l);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  // Inputs: a small inline tensor, a 10 000-byte one (chunked), a resident.
  float small[4] = {1, 2, 3, 4};
  size_t big_count = 2500;
  float* big = malloc(big_count * sizeof(float));
  for (size_t i = 0; i < big_count; ++i) big[i] = (float)i * 0.25f;
  pcp_proto_section_t sections[2] = {
      {.name = "small",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 1,
       .shape = {4},
       .data = small},
      {.name = "big",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .shape = {50, 50},
       .data = big},
  };
  pcp_proto_tensor_ref_t inputs[3] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 1},
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "w"},
  };
  pcp_proto_task_assign_t task = {
      .task_id = 11, .function = "main", .inputs = inputs, .input_count = 3};
  uint64_t r = 0;
  size_t sent_before = h.gw_sent_count;
  ASSERT_OK(pcp_proto_gateway_conn_assign_task(h.gateway, &task, sections, 2,
                                               h.now, &r));
  pump(&h);
  // 10 chunks of at most 1 KiB, then the TASK_ASSIGN.
  assert_int_equal(h.gw_sent_count - sent_before, 11);
  assert_int_equal(h.gw_sent[sent_before], PCP_PROTO_MESSAGE_BLOB_CHUNK);
  assert_int_equal(h.gw_sent[sent_before + 10], PCP_PROTO_MESSAGE_TASK_ASSIGN);
  pcp_proto_action_t* run = recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK);
  assert_non_null(run);
  pcp_proto_task_assign_t parsed;
  ASSERT_OK(pcp_proto_task_assign_parse(&run->received, &parsed));
  assert_int_equal(parsed.input_count, 3);
  assert_int_equal(parsed.inputs[0].kind, PCP_PROTO_TENSOR_REF_BLOB);
  assert_int_equal(parsed.inputs[0].shape[0], 50);
  const pcp_proto_tensor_blob_t* blob =
      pcp_proto_action_tensor_blob(run, parsed.inputs[0].name);
  assert_non_null(blob);
  assert_int_equal(blob->byte_length, big_count * sizeof(float));
  assert_memory_equal(blob->data, big, big_count * sizeof(float));
  assert_int_equal((uintptr_t)blob->data % 64, 0);
  assert_int_equal(parsed.inputs[1].kind, PCP_PROTO_TENSOR_REF_SECTION);
  assert_memory_equal(run->received.sections[parsed.inputs[1].section].data,
                      small, sizeof(small));
  // The worker answers with a big output: chunked back to the gateway.
  pcp_proto_tensor_ref_t out = {.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                .section = 0};
  pcp_proto_task_result_t result = {
      .task_id = 11, .outputs = &out, .output_count = 1};
  ASSERT_OK(pcp_proto_worker_task_complete(h.worker, &result, &sections[1], 1,
                                           h.now));
  pump(&h);
  pcp_proto_action_t* res = recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_RESULT);
  assert_non_null(res);
  pcp_proto_task_result_t parsed_result;
  ASSERT_OK(pcp_proto_task_result_parse(&res->received, &parsed_result));
  assert_int_equal(parsed_result.outputs[0].kind, PCP_PROTO_TENSOR_REF_BLOB);
  blob = pcp_proto_action_tensor_blob(res, parsed_result.outputs[0].name);
  assert_non_null(blob);
  assert_memory_equal(blob->data, big, big_count * sizeof(float));
  assert_int_equal(pcp_proto_gateway_conn_in_flight_count(h.gateway), 0);

  // A TASK_ASSIGN naming a blob that never arrived: ERROR for the task.
  pcp_proto_tensor_ref_t missing = {.kind = PCP_PROTO_TENSOR_REF_BLOB,
                                    .name = "nope",
                                    .element_type = PCP_ELEMENT_TYPE_U8,
                                    .rank = 1,
                                    .shape = {3}};
  task.task_id = 12;
  task.inputs = &missing;
  task.input_count = 1;
  recorded_clear(&h.gw);
  ASSERT_OK(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, NULL, 0, h.now, &r));
  pump(&h);
  pcp_proto_action_t* failed =
      recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_FAILED);
  assert_non_null(failed);
  assert_int_equal(failed->task_id, 12);
  assert_int_equal(pcp_status_code(failed->status),
                   PCP_STATUS_INVALID_ARGUMENT);
  free(big);
  harness_free(&h);
}

// One scripted session (handshake, heartbeats, a task with an inline and a
// chunked input, its result) driven with a shared allocator; returns the
// first failure. Used by the OOM sweep below.
static pcp_status_t pump_lean(pcp_proto_gateway_conn_t* g,
                              pcp_proto_worker_t* w, int64_t now,
                              size_t* out_results) {
  bool progress = true;
  while (progress) {
    progress = false;
    pcp_proto_action_t a;
    while (pcp_proto_gateway_conn_next_action(g, &a)) {
      progress = true;
      pcp_status_t s = pcp_ok_status();
      if (a.type == PCP_PROTO_ACTION_SEND) {
        for (size_t i = 0; i < a.frame.segment_count && !s; ++i) {
          s = pcp_proto_worker_on_bytes(w, a.frame.segments[i].data,
                                        a.frame.segments[i].byte_length, now);
        }
      } else if (a.type == PCP_PROTO_ACTION_JOIN_VERIFIED) {
        pcp_proto_gateway_accept_params_t p = {.lease_epoch = 1};
        s = pcp_proto_gateway_conn_accept(g, &p, now);
      } else if (a.type == PCP_PROTO_ACTION_TASK_RESULT) {
        ++*out_results;
      } else if (a.type == PCP_PROTO_ACTION_CLOSE) {
        s = pcp_status_clone(a.status);
      }
      pcp_proto_action_deinitialize(&a);
      if (s)
        return s;
    }
    while (pcp_proto_worker_next_action(w, &a)) {
      progress = true;
      pcp_status_t s = pcp_ok_status();
      if (a.type == PCP_PROTO_ACTION_SEND) {
        for (size_t i = 0; i < a.frame.segment_count && !s; ++i) {
          s = pcp_proto_gateway_conn_on_bytes(g, a.frame.segments[i].data,
                                              a.frame.segments[i].byte_length,
                                              now);
        }
      } else if (a.type == PCP_PROTO_ACTION_CONNECT) {
        s = pcp_proto_worker_on_connected(w, now);
      } else if (a.type == PCP_PROTO_ACTION_RUN_TASK) {
        static const float y[3] = {1, 2, 3};
        pcp_proto_section_t out = {.name = "y",
                                   .element_type = PCP_ELEMENT_TYPE_F32,
                                   .rank = 1,
                                   .shape = {3},
                                   .data = y};
        pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
        pcp_proto_task_result_t r = {
            .task_id = a.task_id, .outputs = &ref, .output_count = 1};
        s = pcp_proto_worker_task_complete(w, &r, &out, 1, now);
      } else if (a.type == PCP_PROTO_ACTION_CLOSE) {
        s = pcp_status_clone(a.status);
      }
      pcp_proto_action_deinitialize(&a);
      if (s)
        return s;
    }
  }
  return pcp_ok_status();
}

static pcp_status_t scripted_session(pcp_allocator_t allocator,
                                     size_t* out_results) {
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.chunk_bytes = 256;
  pcp_proto_gateway_config_t gc = {.limits = l,
                                   .heartbeat_interval_ms = 1000,
                                   .join_token = kToken,
                                   .join_token_length = sizeof(kToken) - 1};
  pcp_rng_t rng;
  pcp_rng_initialize(1, &rng);
  pcp_proto_worker_config_t wc = worker_config(&l);
  pcp_proto_gateway_conn_t* g = NULL;
  pcp_proto_worker_t* w = NULL;
  int64_t now = 1000 * MS;
  pcp_status_t s = pcp_proto_gateway_conn_create(&gc, now, allocator, &g);
  if (!s)
    s = pcp_proto_worker_create(&wc, &rng, allocator, &w);
  if (!s)
    s = pcp_proto_worker_start(w, now);
  if (!s)
    s = pump_lean(g, w, now, out_results);
  float small[2] = {1, 2};
  float big[200];
  for (int i = 0; i < 200; ++i) big[i] = (float)i;
  pcp_proto_section_t sections[2] = {
      {.name = "a",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 1,
       .shape = {2},
       .data = small},
      {.name = "b",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 1,
       .shape = {200},
       .data = big},
  };
  pcp_proto_tensor_ref_t inputs[2] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 1},
  };
  pcp_proto_task_assign_t task = {
      .task_id = 1, .function = "main", .inputs = inputs, .input_count = 2};
  uint64_t request_id = 0;
  if (!s) {
    s = pcp_proto_gateway_conn_assign_task(g, &task, sections, 2, now,
                                           &request_id);
  }
  if (!s)
    s = pump_lean(g, w, now, out_results);
  for (int i = 0; i < 8 && !s; ++i) {
    now += 250 * MS;
    s = pcp_proto_gateway_conn_on_tick(g, now);
    if (!s)
      s = pcp_proto_worker_on_tick(w, now);
    if (!s)
      s = pump_lean(g, w, now, out_results);
  }
  pcp_proto_gateway_conn_release(g);
  pcp_proto_worker_release(w);
  return s;
}

// SQLite-style OOM sweep over a whole session: fail the Nth allocation for
// every N until the session completes. Every failure surfaces as a status
// from some call (never a crash), and nothing leaks.
static void oom_sweep_whole_session(void** state) {
  (void)state;
  bool completed = false;
  int64_t fail_at = 0;
  for (; fail_at < 5000 && !completed; ++fail_at) {
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), fail_at,
                                     false, &failing);
    size_t results = 0;
    pcp_status_t s =
        scripted_session(pcp_allocator_failing(&failing), &results);
    if (!s && failing.failure_count == 0) {
      completed = true;
      assert_int_equal(results, 1);
    }
    pcp_status_ignore(s);
    assert_int_equal(counter.live_bytes, 0);
  }
  assert_true(completed);
  assert_true(fail_at > 50);  // the sweep really went through the session
}

// Seeded random run (the simulator's shape, in miniature): one worker and a
// gateway connection per link, random task assignment, completion, ticks,
// link drops and reconnects. Invariants checked at the end of each seed:
// every assigned task is answered exactly once on the gateway side (result,
// failure or loss), the worker never reports a task it does not hold, and
// every join carries the same worker id.
typedef struct sim_t {
  pcp_rng_t rng;
  pcp_proto_gateway_conn_t* gateway;
  pcp_proto_worker_t* worker;
  bool link_up;
  int64_t now;
  uint8_t answered[400];  // per task id: times the gateway heard an answer
  uint8_t assigned[400];
  uint64_t pending[64];  // tasks the worker is running
  size_t pending_count;
  uint64_t joins;
  uint64_t next_epoch;
  uint64_t lost;
  uint64_t results;
} sim_t;

static void sim_new_gateway(sim_t* s) {
  pcp_proto_gateway_conn_release(s->gateway);
  pcp_proto_gateway_config_t c = {.limits = pcp_proto_limits_default(),
                                  .heartbeat_interval_ms = 1000,
                                  .join_token = kToken,
                                  .join_token_length = sizeof(kToken) - 1};
  c.limits.max_in_flight = 8;
  for (int i = 0; i < 32; ++i) {
    c.nonce[i] = (uint8_t)pcp_rng_next_u64(&s->rng);
  }
  ASSERT_OK(pcp_proto_gateway_conn_create(&c, s->now, pcp_allocator_system(),
                                          &s->gateway));
}

static void sim_drop_link(sim_t* s) {
  if (!s->link_up)
    return;
  s->link_up = false;
  ASSERT_OK(pcp_proto_gateway_conn_on_closed(s->gateway, s->now));
  ASSERT_OK(pcp_proto_worker_on_closed(s->worker, s->now));
}

static void sim_pump(sim_t* s) {
  bool progress = true;
  while (progress) {
    progress = false;
    pcp_proto_action_t a;
    while (s->gateway && pcp_proto_gateway_conn_next_action(s->gateway, &a)) {
      progress = true;
      switch (a.type) {
        case PCP_PROTO_ACTION_SEND:
          if (s->link_up) {
            size_t n;
            uint8_t* b = test_flatten(&a.frame, &n);
            ASSERT_OK(pcp_proto_worker_on_bytes(s->worker, b, n, s->now));
            free(b);
          }
          break;
        case PCP_PROTO_ACTION_JOIN_VERIFIED: {
          const pcp_proto_join_t* j = pcp_proto_gateway_conn_join(s->gateway);
          assert_string_equal(j->worker_id,
                              "site-a-ns-node-pod-cpu-default-device-0");
          s->joins++;
          pcp_proto_gateway_accept_params_t p = {.lease_epoch =
                                                     ++s->next_epoch};
          ASSERT_OK(pcp_proto_gateway_conn_accept(s->gateway, &p, s->now));
          break;
        }
        case PCP_PROTO_ACTION_TASK_RESULT:
        case PCP_PROTO_ACTION_TASK_FAILED:
        case PCP_PROTO_ACTION_TASK_LOST:
          assert_true(a.task_id < 400);
          s->answered[a.task_id]++;
          s->lost += a.type == PCP_PROTO_ACTION_TASK_LOST;
          s->results += a.type == PCP_PROTO_ACTION_TASK_RESULT;
          break;
        case PCP_PROTO_ACTION_CLOSE:
        case PCP_PROTO_ACTION_EVICT:
          if (s->link_up)
            sim_drop_link(s);
          break;
        default:
          break;
      }
      pcp_proto_action_deinitialize(&a);
    }
    while (pcp_proto_worker_next_action(s->worker, &a)) {
      progress = true;
      switch (a.type) {
        case PCP_PROTO_ACTION_SEND:
          if (s->link_up) {
            size_t n;
            uint8_t* b = test_flatten(&a.frame, &n);
            ASSERT_OK(
                pcp_proto_gateway_conn_on_bytes(s->gateway, b, n, s->now));
            free(b);
          }
          break;
        case PCP_PROTO_ACTION_CONNECT:
          sim_new_gateway(s);
          s->link_up = true;
          ASSERT_OK(pcp_proto_worker_on_connected(s->worker, s->now));
          break;
        case PCP_PROTO_ACTION_RUN_TASK:
          s->pending[s->pending_count++] = a.task_id;
          break;
        case PCP_PROTO_ACTION_CANCEL_TASK:
          for (size_t i = 0; i < s->pending_count; ++i) {
            if (s->pending[i] == a.task_id) {
              s->pending[i] = s->pending[--s->pending_count];
              break;
            }
          }
          break;
        case PCP_PROTO_ACTION_CLOSE:
          if (s->link_up)
            sim_drop_link(s);
          break;
        default:
          break;
      }
      pcp_proto_action_deinitialize(&a);
    }
  }
}

static void seeded_random_sessions(void** state) {
  (void)state;
  uint64_t total_joins = 0, total_lost = 0, total_results = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    sim_t s;
    memset(&s, 0, sizeof(s));
    pcp_rng_initialize(seed, &s.rng);
    s.now = 1000 * MS;
    pcp_rng_t worker_rng;
    pcp_rng_initialize(seed * 7919, &worker_rng);
    pcp_proto_limits_t l = pcp_proto_limits_default();
    l.max_in_flight = 8;
    pcp_proto_worker_config_t wc = worker_config(&l);
    ASSERT_OK(pcp_proto_worker_create(&wc, &worker_rng, pcp_allocator_system(),
                                      &s.worker));
    ASSERT_OK(pcp_proto_worker_start(s.worker, s.now));
    sim_pump(&s);
    uint64_t next_task = 1;
    for (int step = 0; step < 400; ++step) {
      uint64_t dice = pcp_rng_next_below(&s.rng, 100);
      if (dice < 30 && next_task < 400 &&
          pcp_proto_gateway_conn_state(s.gateway) ==
              PCP_PROTO_GATEWAY_ACCEPTED) {
        pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                     .name = "x"};
        pcp_proto_task_assign_t t = {.task_id = next_task,
                                     .function = "f",
                                     .inputs = &in,
                                     .input_count = 1};
        uint64_t r;
        pcp_status_t st = pcp_proto_gateway_conn_assign_task(
            s.gateway, &t, NULL, 0, s.now, &r);
        if (!st) {
          s.assigned[next_task] = 1;
          next_task++;
        } else {
          assert_int_equal(pcp_status_consume_code(st),
                           PCP_STATUS_RESOURCE_EXHAUSTED);
        }
      } else if (dice < 60 && s.pending_count > 0) {
        size_t i = (size_t)pcp_rng_next_below(&s.rng, s.pending_count);
        uint64_t task_id = s.pending[i];
        s.pending[i] = s.pending[--s.pending_count];
        pcp_proto_task_result_t r = {.task_id = task_id};
        if (pcp_rng_next_below(&s.rng, 4) == 0) {
          pcp_status_t why = pcp_make_status(PCP_STATUS_INTERNAL, "boom");
          ASSERT_OK(pcp_proto_worker_task_fail(s.worker, task_id, why, s.now));
          pcp_status_ignore(why);
        } else {
          ASSERT_OK(
              pcp_proto_worker_task_complete(s.worker, &r, NULL, 0, s.now));
        }
      } else if (dice < 63) {
        sim_drop_link(&s);
      } else {
        s.now += (int64_t)pcp_rng_next_below(&s.rng, 400) * MS;
        ASSERT_OK(pcp_proto_gateway_conn_on_tick(s.gateway, s.now));
        ASSERT_OK(pcp_proto_worker_on_tick(s.worker, s.now));
      }
      sim_pump(&s);
    }
    // Quiesce: finish what the worker holds, then close.
    while (s.pending_count > 0) {
      pcp_proto_task_result_t r = {.task_id = s.pending[--s.pending_count]};
      ASSERT_OK(pcp_proto_worker_task_complete(s.worker, &r, NULL, 0, s.now));
      sim_pump(&s);
    }
    sim_drop_link(&s);
    sim_pump(&s);
    for (uint64_t t = 1; t < next_task; ++t) {
      if (s.answered[t] != 1) {
        fail_msg("seed %llu: task %llu answered %u times",
                 (unsigned long long)seed, (unsigned long long)t,
                 s.answered[t]);
      }
    }
    assert_true(s.joins >= 1);
    total_joins += s.joins;
    total_lost += s.lost;
    total_results += s.results;
    pcp_proto_gateway_conn_release(s.gateway);
    pcp_proto_worker_release(s.worker);
  }
  // The runs really reconnected, lost tasks and completed others.
  assert_true(total_joins > 40);
  assert_true(total_lost > 10);
  assert_true(total_results > 100);
}

static pcp_status_t deliver_to_worker(void* user_data,
                                      pcp_proto_encoded_frame_t* frame) {
  harness_t* h = user_data;
  send_bytes(h, false, frame);
  return pcp_ok_status();
}

static void orphan_tensor_blobs_do_not_block(void** state) {
  (void)state;
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.chunk_bytes = 1024;
  l.max_blob_assemblies = 1;
  harness_t h;
  harness_init(&h, &l);
  new_gateway(&h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h.worker, h.now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(&h, &p);
  // A complete tensor blob whose TASK_ASSIGN never comes.
  uint8_t junk[100] = {7};
  ASSERT_OK(pcp_proto_blob_encode_chunks(
      PCP_PROTO_VERSION_MAX, 999, "t9.s0", PCP_PROTO_BLOB_TENSOR, junk,
      sizeof(junk), &l, pcp_allocator_system(), deliver_to_worker, &h));
  // A real chunked task still gets through with room for one blob.
  uint8_t big[3000];
  for (size_t i = 0; i < sizeof(big); ++i) big[i] = (uint8_t)i;
  pcp_proto_section_t sec = {.name = "b",
                             .element_type = PCP_ELEMENT_TYPE_U8,
                             .rank = 1,
                             .shape = {3000},
                             .data = big};
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_assign_t task = {
      .task_id = 1, .function = "f", .inputs = &in, .input_count = 1};
  uint64_t r;
  ASSERT_OK(
      pcp_proto_gateway_conn_assign_task(h.gateway, &task, &sec, 1, h.now, &r));
  pump(&h);
  pcp_proto_action_t* run = recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK);
  assert_non_null(run);
  assert_int_equal(run->tensor_blob_count, 1);
  assert_memory_equal(run->tensor_blobs[0].data, big, sizeof(big));
  harness_free(&h);
}

//===----------------------------------------------------------------------===//
// Liveness is progress (docs/protocol.md s.4): on a slow link one frame takes
// longer than 3H and the heartbeats wait behind it on the same stream; bytes
// of the frame arriving keep the connection, silence still ends it.

// 200 000 bytes of f32 inline in one frame (the default chunk is 16 MiB).
#define SLOW_FLOATS 50000
// 5 000 bytes per 250 ms tick (20 kB/s): the frame takes 10 s = 10 H.
#define SLOW_BUDGET 5000

static void slow_link_join(harness_t* h, float* data) {
  harness_init(h, NULL);
  new_gateway(h, kToken, sizeof(kToken) - 1);
  ASSERT_OK(pcp_proto_worker_start(h->worker, h->now));
  pcp_proto_gateway_accept_params_t p = lease(1, 1);
  join(h, &p);
  h->slow = true;
  for (size_t i = 0; i < SLOW_FLOATS; ++i) data[i] = (float)i * 0.5f;
}

static pcp_proto_section_t slow_section(const float* data) {
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 1,
                           .shape = {SLOW_FLOATS},
                           .data = data};
  return s;
}

static void slow_link_assign(harness_t* h, const float* data) {
  pcp_proto_section_t s = slow_section(data);
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_assign_t task = {
      .task_id = 9, .function = "main", .inputs = &in, .input_count = 1};
  uint64_t request_id = 0;
  ASSERT_OK(pcp_proto_gateway_conn_assign_task(h->gateway, &task, &s, 1, h->now,
                                               &request_id));
  pump(h);
}

static void slow_link_complete(harness_t* h, const float* data) {
  pcp_proto_section_t s = slow_section(data);
  pcp_proto_tensor_ref_t out = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_result_t result = {
      .task_id = 9, .outputs = &out, .output_count = 1};
  ASSERT_OK(pcp_proto_worker_task_complete(h->worker, &result, &s, 1, h->now));
  pump(h);
}

static void slow_bytes_keep_the_connection(void** state) {
  (void)state;
  harness_t h;
  float* data = malloc(SLOW_FLOATS * sizeof(float));
  slow_link_join(&h, data);
  // The task's inputs cross the link in about 10 s, one frame; the
  // gateway's heartbeats queue behind it. The worker stays.
  slow_link_assign(&h, data);
  int64_t start = h.now;
  while (!recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK)) {
    assert_true(h.now - start < 15000 * MS);
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
    assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_READY);
  }
  assert_true(h.now - start >= 9750 * MS);
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE));
  pcp_proto_action_t* run = recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK);
  assert_memory_equal(run->received.sections[0].data, data,
                      SLOW_FLOATS * sizeof(float));
  // The result goes back as slowly; the worker's heartbeats queue behind
  // it. The gateway keeps the worker.
  slow_link_complete(&h, data);
  start = h.now;
  while (!recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_RESULT)) {
    assert_true(h.now - start < 15000 * MS);
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  assert_true(h.now - start >= 9750 * MS);
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_EVICT), 0);
  assert_null(recorded_find(&h.gw, PCP_PROTO_ACTION_CLOSE));
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_ACCEPTED);
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_READY);
  // The queued heartbeats arrive after the frames and count as usual.
  for (int i = 0; i < 8; ++i) {
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE));
  assert_int_equal(recorded_count(&h.gw, PCP_PROTO_ACTION_EVICT), 0);
  free(data);
  harness_free(&h);
}

static void silence_without_bytes_evicts(void** state) {
  (void)state;
  harness_t h;
  float* data = malloc(SLOW_FLOATS * sizeof(float));
  slow_link_join(&h, data);
  // Nothing arrives either way from now on, not even heartbeats.
  h.stalled[0] = h.stalled[1] = true;
  int64_t last = h.now;
  assert_int_equal(pcp_proto_gateway_conn_deadline_ns(h.gateway),
                   last + 3000 * MS);
  assert_int_equal(pcp_proto_worker_deadline_ns(h.worker), last + 3000 * MS);
  while (!recorded_find(&h.gw, PCP_PROTO_ACTION_EVICT)) {
    assert_true(h.now - last < 4000 * MS);
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  assert_true(h.now - last >= 3000 * MS && h.now - last < 3250 * MS);
  assert_int_equal(pcp_proto_gateway_conn_state(h.gateway),
                   PCP_PROTO_GATEWAY_CLOSED);
  // The worker's own silence check fired at the same tick or its close
  // reached it: either way it left, DEADLINE_EXCEEDED or closed.
  assert_int_equal(pcp_proto_worker_state(h.worker), PCP_PROTO_WORKER_BACKOFF);
  free(data);
  harness_free(&h);
}

static void partial_frame_then_silence_evicts(void** state) {
  (void)state;
  harness_t h;
  float* data = malloc(SLOW_FLOATS * sizeof(float));
  // Worker side: a quarter of the inputs' frame arrives, then the gateway
  // stalls mid-frame (its heartbeats would come after the frame): the
  // worker leaves 3H after the last byte, not 3H after the last frame.
  slow_link_join(&h, data);
  slow_link_assign(&h, data);
  int64_t last = h.now;
  for (int i = 0; i < 10; ++i) {
    tick(&h, 250 * MS);
    if (trickle(&h, SLOW_BUDGET) > 0)
      last = h.now;
  }
  // Part of the frame arrived, not all of it.
  assert_true(h.wire_offset[0] > 0 && h.wire_offset[0] < h.wire_length[0]);
  h.stalled[0] = true;
  assert_int_equal(pcp_proto_worker_deadline_ns(h.worker), last + 3000 * MS);
  while (!recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE)) {
    assert_true(h.now - last < 4000 * MS);
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  assert_true(h.now - last >= 3000 * MS && h.now - last < 3250 * MS);
  assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK));
  pcp_proto_action_t* close = recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE);
  assert_int_equal(pcp_status_code(close->status),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  harness_free(&h);

  // Gateway side: the inputs arrive, the worker starts sending its result
  // and stalls mid-frame (SIGSTOP): evicted 3H after its last byte, while
  // the gateway's own bytes still reach the worker.
  slow_link_join(&h, data);
  slow_link_assign(&h, data);
  while (!recorded_find(&h.wk, PCP_PROTO_ACTION_RUN_TASK)) {
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  slow_link_complete(&h, data);
  size_t queued = h.wire_length[1] - h.wire_offset[1];
  for (int i = 0; i < 10; ++i) {
    tick(&h, 250 * MS);
    if (trickle(&h, SLOW_BUDGET) > 0)
      last = h.now;
  }
  assert_true(h.wire_length[1] - h.wire_offset[1] > queued / 2);
  h.stalled[1] = true;
  assert_int_equal(pcp_proto_gateway_conn_deadline_ns(h.gateway),
                   last + 3000 * MS);
  while (!recorded_find(&h.gw, PCP_PROTO_ACTION_EVICT)) {
    assert_true(h.now - last < 4000 * MS);
    assert_null(recorded_find(&h.wk, PCP_PROTO_ACTION_CLOSE));
    tick(&h, 250 * MS);
    trickle(&h, SLOW_BUDGET);
  }
  assert_true(h.now - last >= 3000 * MS && h.now - last < 3250 * MS);
  assert_null(recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_RESULT));
  pcp_proto_action_t* lost = recorded_find(&h.gw, PCP_PROTO_ACTION_TASK_LOST);
  assert_non_null(lost);
  assert_int_equal(lost->task_id, 9);
  free(data);
  harness_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(handshake_and_heartbeats),
      cmocka_unit_test(wrong_token_is_rejected),
      cmocka_unit_test(silent_worker_is_evicted),
      cmocka_unit_test(silent_gateway_makes_worker_reconnect),
      cmocka_unit_test(reconnect_keeps_identity_and_resumes),
      cmocka_unit_test(backoff_grows_with_jitter_and_cap),
      cmocka_unit_test(duplicate_and_out_of_order_frames),
      cmocka_unit_test(handshake_out_of_order_and_garbage),
      cmocka_unit_test(negotiated_task_frames_carry_runs),
      cmocka_unit_test(program_offer_cached_and_fetched),
      cmocka_unit_test(in_flight_limit_cancel_and_task_errors),
      cmocka_unit_test(large_tensors_travel_as_blobs),
      cmocka_unit_test(oom_sweep_whole_session),
      cmocka_unit_test(seeded_random_sessions),
      cmocka_unit_test(orphan_tensor_blobs_do_not_block),
      cmocka_unit_test(slow_bytes_keep_the_connection),
      cmocka_unit_test(silence_without_bytes_evicts),
      cmocka_unit_test(partial_frame_then_silence_evicts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
