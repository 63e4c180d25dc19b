// SPDX-License-Identifier: Apache-2.0
//
// The real worker process (`pcp --worker`) against a scripted fake gateway
// (worker_fabric_fake_gateway.h: proto's codec over real TCP on 127.0.0.1).
// In order, with one worker process and one cache directory:
//   1. the worker joins with a valid HMAC proof and every JOIN field;
//   2. an offered program is fetched (the cache is empty), stored and
//      acknowledged; offered again, it is acknowledged from the cache;
//   3. tasks run a real VMFB (matmul + add, compiled here) and return
//      results equal to the values computed in C; resident session tensors
//      are reused across tasks; a missing resident is NOT_FOUND;
//   4. a queued task that is cancelled is answered with ERROR CANCELLED
//      while the one before it completes; so is a started one, before its
//      IREE call;
//   5. SIGSTOP/SIGCONT for half the silence timeout: still connected;
//   6. the gateway closes the socket: the worker reconnects with backoff,
//      the same id and its resume token; a resumed lease keeps the resident
//      tensors, a fresh one drops them;
//   7. SIGTERM: DRAIN, close, exit 0.
// Then a second worker on the same cache directory is first rejected (it
// retries), then offered the program and acknowledges it as cached (no
// fetch), runs a task from the cached file, and stops on a gateway SHUTDOWN
// with exit 0. A third finds the cached file corrupted and fetches it
// again. A fourth, without a join token, idles with an error line and
// stops on SIGTERM.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <signal.h>
#include <sys/wait.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "integration/worker_fabric_fake_gateway.h"

#define TOKEN "worker-fabric-test-token"
#define HEARTBEAT_MS 200
#define WORKER_ID "fake-gw-worker-7"

static const char kProgramMlir[] =
    "func.func @main(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>,"
    " %b: tensor<2x2xf32>) -> tensor<2x2xf32> {\n"
    "  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] :"
    " (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "  %1 = stablehlo.add %0, %b : tensor<2x2xf32>\n"
    "  return %1 : tensor<2x2xf32>\n}\n"
    "func.func @accumulate(%acc: tensor<2x2xf32>, %x: tensor<2x2xf32>)"
    " -> tensor<2x2xf32> {\n"
    "  %0 = stablehlo.add %acc, %x : tensor<2x2xf32>\n"
    "  return %0 : tensor<2x2xf32>\n}\n";

static struct {
  char dir[512];
  char cache_dir[600];
  uint8_t* vmfb;
  size_t vmfb_length;
  pcp_sha256_t program;
  fake_gateway_t gw;
  pid_t worker;
  char log_path[600];
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  // RUNNING reports seen while waiting for another frame (a DRAIN).
  int early_progress;
} g;

static const float kX[6] = {1, 2, 3, 4, 5, 6};
static const float kW[6] = {0.5f, -1, 2, 0.25f, -3, 1};
static const float kB[4] = {10, 20, 30, 40};
static const float kZ[4] = {1, -2, 3, -4};

// y = x @ w + b, in C.
static void expected_main(float out[4]) {
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      float sum = 0;
      for (int k = 0; k < 3; ++k) sum += kX[i * 3 + k] * kW[k * 2 + j];
      out[i * 2 + j] = sum + kB[i * 2 + j];
    }
  }
}

static void print_worker_log(void) {
  FILE* f = fopen(g.log_path, "r");
  if (!f)
    return;
  char line[4096];
  fprintf(stderr, "---- worker log %s ----\n", g.log_path);
  while (fgets(line, sizeof(line), f)) fputs(line, stderr);
  fclose(f);
}

static int count_in_log(const char* needle) {
  FILE* f = fopen(g.log_path, "r");
  if (!f)
    return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof(line), f)) n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      print_worker_log();                                             \
      fail_msg("%s:%d: check failed: %s", __FILE__, __LINE__, #cond); \
    }                                                                 \
  } while (0)

// With |with_token| false the token variable is left unset.
static pid_t spawn_worker_token(const char* log_name, bool with_token);

static pid_t spawn_worker(const char* log_name) {
  return spawn_worker_token(log_name, true);
}

static pid_t spawn_worker_token(const char* log_name, bool with_token) {
  snprintf(g.log_path, sizeof(g.log_path), "%s/%s", g.dir, log_name);
  const char* pcp = getenv("PCP_BINARY");
  CHECK(pcp != NULL);
  char connect[64];
  snprintf(connect, sizeof(connect), "127.0.0.1:%u", g.gw.port);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (with_token) {
      setenv("PCP_TEST_JOIN_TOKEN", TOKEN, 1);
    } else {
      unsetenv("PCP_TEST_JOIN_TOKEN");
    }
    setenv("PCP_WORKER_ID", WORKER_ID, 1);
    FILE* log = freopen(g.log_path, "w", stderr);
    (void)log;
    const char* args[] = {pcp, "--worker", "--connect", connect, "--backend",
                          "cpu", "--device-id", "0", "--cache-dir", g.cache_dir,
                          "--join-token-env", "PCP_TEST_JOIN_TOKEN",
                          "--node-manager-id", "nm-test", "--supervisor-id",
                          "7", "--worker-class", "test-class", "--cpu-threads",
                          "2",
                          // Long enough that a task queued behind another
                          // is still waiting when its cancel arrives.
                          "--test-task-delay-ms", "250", NULL};
    execv(pcp, (char* const*)args);
    _exit(127);
  }
  return pid;
}

// Waits (bounded) for |pid| to exit; returns its wait status or -1.
static int wait_exit(pid_t pid, int timeout_ms) {
  int64_t deadline = fake_gateway_now_ns() + (int64_t)timeout_ms * 1000000;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return status;
    if (fake_gateway_now_ns() > deadline)
      return -1;
    // Keep the connection alive while the worker drains.
    if (g.gw.fd >= 0 && !g.gw.eof) {
      fake_gateway_idle(&g.gw, 20);
    } else {
      pcp_sleep_ms(20);
    }
  }
}

static void accept_params(pcp_proto_accept_t* accept, uint64_t epoch,
                          bool resumed) {
  memset(accept, 0, sizeof(*accept));
  accept->lease_epoch = epoch;
  PCP_CHECK_OK(pcp_proto_random_bytes(accept->resume_token,
                                      sizeof(accept->resume_token)));
  accept->resumed = resumed;
  accept->heartbeat_interval_ms = HEARTBEAT_MS;
  accept->max_frame_bytes = g.gw.limits.max_frame_bytes;
  accept->max_chunk_bytes = g.gw.limits.max_chunk_bytes;
  accept->max_in_flight = 16;
}

// Next frame that is not TASK_PROGRESS (counted in |progress|).
static bool recv_skipping_progress(pcp_proto_frame_t* frame, int* progress) {
  for (;;) {
    if (!fake_gateway_recv(&g.gw, 20000, frame))
      return false;
    if (frame->header.type != PCP_PROTO_MESSAGE_TASK_PROGRESS)
      return true;
    pcp_proto_task_progress_t p;
    PCP_CHECK_OK(pcp_proto_task_progress_parse(frame, &p));
    if (p.state == PCP_PROTO_TASK_RUNNING && progress)
      (*progress)++;
    pcp_proto_frame_deinitialize(frame);
  }
}

// Offers the program; true when the worker fetched it (then it is sent and
// the stored ACK checked), false when it answered "cached".
static bool offer_program(void) {
  pcp_proto_program_offer_t offer = {
      .byte_length = g.vmfb_length, .backend = "cpu", .target = "host"};
  memcpy(offer.program, g.program.bytes, sizeof(offer.program));
  uint64_t request_id = g.gw.next_request_id++;
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(
      &g.gw,
      pcp_proto_program_offer_encode(g.gw.version, request_id, &offer,
                                     &g.gw.limits, pcp_allocator_system(), &f),
      &f);
  pcp_proto_frame_t frame;
  CHECK(fake_gateway_recv(&g.gw, 20000, &frame));
  CHECK(frame.header.request_id == request_id);
  bool fetched = frame.header.type == PCP_PROTO_MESSAGE_PROGRAM_FETCH;
  if (fetched) {
    pcp_proto_program_fetch_t fetch;
    PCP_CHECK_OK(pcp_proto_program_fetch_parse(&frame, &fetch));
    CHECK(memcmp(fetch.program, g.program.bytes, 32) == 0);
    pcp_proto_frame_deinitialize(&frame);
    // Small chunks, so the worker reassembles several.
    pcp_proto_limits_t limits = g.gw.limits;
    limits.chunk_bytes = 4096;
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_sha256_to_hex(&g.program, hex);
    chunk_sender_t sender = {.gw = &g.gw};
    PCP_CHECK_OK(pcp_proto_blob_encode_chunks(
        g.gw.version, request_id, hex, PCP_PROTO_BLOB_PROGRAM, g.vmfb,
        g.vmfb_length, &limits, pcp_allocator_system(), fake_gateway_emit_chunk,
        &sender));
    CHECK(sender.chunks > 1);
    CHECK(fake_gateway_recv(&g.gw, 20000, &frame));
    CHECK(frame.header.request_id == request_id);
  }
  CHECK(frame.header.type == PCP_PROTO_MESSAGE_PROGRAM_ACK);
  pcp_proto_program_ack_t ack;
  PCP_CHECK_OK(pcp_proto_program_ack_parse(&frame, &ack));
  CHECK(memcmp(ack.program, g.program.bytes, 32) == 0);
  CHECK(ack.status ==
        (fetched ? PCP_PROTO_PROGRAM_STORED : PCP_PROTO_PROGRAM_CACHED));
  pcp_proto_frame_deinitialize(&frame);
  return fetched;
}

static pcp_proto_section_t section_f32(const char* name, const float* data,
                                       int64_t rows, int64_t cols) {
  pcp_proto_section_t s;
  memset(&s, 0, sizeof(s));
  s.name = name;
  s.element_type = PCP_ELEMENT_TYPE_F32;
  s.rank = 2;
  s.shape[0] = rows;
  s.shape[1] = cols;
  s.data = data;
  return s;
}

// TASK_ASSIGN main(x, w, b) in |session| (keeping the output as |keep_as|
// when given).
static void assign_main(uint64_t task_id, const char* session,
                        const char* keep_as, bool return_resident) {
  pcp_proto_section_t sections[3] = {section_f32("x", kX, 2, 3),
                                     section_f32("w", kW, 3, 2),
                                     section_f32("b", kB, 2, 2)};
  pcp_proto_tensor_ref_t inputs[3];
  memset(inputs, 0, sizeof(inputs));
  for (uint32_t i = 0; i < 3; ++i) {
    inputs[i].kind = PCP_PROTO_TENSOR_REF_SECTION;
    inputs[i].section = i;
  }
  pcp_proto_keep_resident_t keep = {.output = 0, .as = keep_as};
  pcp_proto_task_assign_t assign = {.task_id = task_id,
                                    .session_id = session,
                                    .function = "main",
                                    .inputs = inputs,
                                    .input_count = 3,
                                    .keep_resident = keep_as ? &keep : NULL,
                                    .keep_resident_count = keep_as ? 1 : 0,
                                    .return_resident = return_resident};
  memcpy(assign.program, g.program.bytes, 32);
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(&g.gw,
                    pcp_proto_task_assign_encode(
                        g.gw.version, g.gw.next_request_id++, &assign, sections,
                        3, &g.gw.limits, pcp_allocator_system(), &f),
                    &f);
}

// TASK_ASSIGN accumulate(resident |acc|, z) in |session|.
static void assign_accumulate(uint64_t task_id, const char* session,
                              const char* acc, const char* keep_as) {
  pcp_proto_section_t sections[1] = {section_f32("z", kZ, 2, 2)};
  pcp_proto_tensor_ref_t inputs[2];
  memset(inputs, 0, sizeof(inputs));
  inputs[0].kind = PCP_PROTO_TENSOR_REF_RESIDENT;
  inputs[0].name = acc;
  inputs[1].kind = PCP_PROTO_TENSOR_REF_SECTION;
  inputs[1].section = 0;
  pcp_proto_keep_resident_t keep = {.output = 0, .as = keep_as};
  pcp_proto_task_assign_t assign = {.task_id = task_id,
                                    .session_id = session,
                                    .function = "accumulate",
                                    .inputs = inputs,
                                    .input_count = 2,
                                    .keep_resident = keep_as ? &keep : NULL,
                                    .keep_resident_count = keep_as ? 1 : 0};
  memcpy(assign.program, g.program.bytes, 32);
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(&g.gw,
                    pcp_proto_task_assign_encode(
                        g.gw.version, g.gw.next_request_id++, &assign, sections,
                        1, &g.gw.limits, pcp_allocator_system(), &f),
                    &f);
}

// Expects TASK_RESULT for |task_id| with one output: a 2x2 f32 section
// equal to |expected| (or, with |resident_name|, a resident reference).
static void expect_result(uint64_t task_id, const float expected[4],
                          const char* resident_name) {
  pcp_proto_frame_t frame;
  int progress = 0;
  CHECK(recv_skipping_progress(&frame, &progress));
  if (frame.header.type == PCP_PROTO_MESSAGE_ERROR) {
    pcp_status_t peer = pcp_ok_status();
    uint64_t failed_task = 0;
    PCP_CHECK_OK(pcp_proto_error_parse(&frame, &peer, &failed_task));
    char text[1024];
    pcp_status_format(peer, text, sizeof(text));
    pcp_status_ignore(peer);
    print_worker_log();
    fail_msg("task %llu failed: %s", (unsigned long long)failed_task, text);
  }
  CHECK(frame.header.type == PCP_PROTO_MESSAGE_TASK_RESULT);
  // Exactly one "running" report per task, before its result.
  CHECK(progress + g.early_progress == 1);
  g.early_progress = 0;
  pcp_proto_task_result_t result;
  PCP_CHECK_OK(pcp_proto_task_result_parse(&frame, &result));
  CHECK(result.task_id == task_id);
  CHECK(result.output_count == 1);
  if (resident_name) {
    CHECK(result.outputs[0].kind == PCP_PROTO_TENSOR_REF_RESIDENT);
    CHECK(strcmp(result.outputs[0].name, resident_name) == 0);
    CHECK(frame.section_count == 0);
  } else {
    CHECK(result.outputs[0].kind == PCP_PROTO_TENSOR_REF_SECTION);
    const pcp_proto_section_t* s = &frame.sections[result.outputs[0].section];
    CHECK(s->element_type == PCP_ELEMENT_TYPE_F32);
    CHECK(s->rank == 2 && s->shape[0] == 2 && s->shape[1] == 2);
    CHECK(s->byte_length == 16);
    const float* got = s->data;
    for (int i = 0; i < 4; ++i) {
      if (got[i] < expected[i] - 1e-4f || got[i] > expected[i] + 1e-4f) {
        print_worker_log();
        fail_msg("task %llu output[%d] = %g, expected %g",
                 (unsigned long long)task_id, i, got[i], expected[i]);
      }
    }
  }
  pcp_proto_frame_deinitialize(&frame);
}

static void expect_task_error(uint64_t task_id, pcp_status_code_t code) {
  pcp_proto_frame_t frame;
  CHECK(recv_skipping_progress(&frame, NULL));
  CHECK(frame.header.type == PCP_PROTO_MESSAGE_ERROR);
  pcp_status_t peer = pcp_ok_status();
  uint64_t failed_task = 0;
  PCP_CHECK_OK(pcp_proto_error_parse(&frame, &peer, &failed_task));
  CHECK(failed_task == task_id);
  pcp_status_code_t got = pcp_status_consume_code(peer);
  if (got != code) {
    print_worker_log();
    fail_msg("task %llu: %s, expected %s", (unsigned long long)task_id,
             pcp_status_code_string(got), pcp_status_code_string(code));
  }
  pcp_proto_frame_deinitialize(&frame);
}

//===----------------------------------------------------------------------===//
// Setup
//===----------------------------------------------------------------------===//

// Temporary directories live under the build tree ($PCP_CACHE_DIR, set by
// ctest), not directly in /tmp, where other jobs clean up by pattern.
static bool make_test_dir(const char* name, char* out, size_t capacity) {
  const char* base = getenv("PCP_CACHE_DIR");
  char parent[512];
  snprintf(parent, sizeof(parent), "%s/tmp", base && base[0] ? base : "/tmp");
  pcp_status_t status = pcp_file_make_directories(parent);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  int n = snprintf(out, capacity, "%s/%s-XXXXXX", parent, name);
  return n > 0 && (size_t)n < capacity && mkdtemp(out) != NULL;
}

static int setup(void** state) {
  (void)state;
  // A worker that closes first makes a write fail with EPIPE, which the
  // checks then report, instead of killing the test process.
  signal(SIGPIPE, SIG_IGN);
  if (!make_test_dir("worker-fabric", g.dir, sizeof(g.dir))) {
    return -1;
  }
  snprintf(g.cache_dir, sizeof(g.cache_dir), "%s/programs", g.dir);
  pcp_compile_request_t request = {.mlir_text = kProgramMlir,
                                   .mlir_byte_length = strlen(kProgramMlir),
                                   .source_name = "worker_fabric_test.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t compiled;
  pcp_status_t status = pcp_compile_module(&request, &compiled);
  if (status) {
    char text[4096];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    fprintf(stderr, "compile: %s\n", text);
    return -1;
  }
  g.vmfb = compiled.vmfb;
  g.vmfb_length = compiled.vmfb_byte_length;
  compiled.vmfb = NULL;
  pcp_compile_result_deinitialize(&compiled);
  pcp_sha256_compute(g.vmfb, g.vmfb_length, &g.program);
  if (!fake_gateway_listen(&g.gw))
    return -1;
  g.worker = -1;
  return 0;
}

static int teardown(void** state) {
  (void)state;
  if (g.worker > 0 && waitpid(g.worker, NULL, WNOHANG) == 0) {
    kill(g.worker, SIGKILL);
    waitpid(g.worker, NULL, 0);
  }
  fake_gateway_release(&g.gw);
  free(g.vmfb);
  char command[600];
  snprintf(command, sizeof(command), "rm -rf '%s'", g.dir);
  int ignored = system(command);
  (void)ignored;
  return 0;
}

//===----------------------------------------------------------------------===//
// The scenario
//===----------------------------------------------------------------------===//

static void joins_with_proof_and_every_field(void** state) {
  (void)state;
  g.worker = spawn_worker("worker1.log");
  CHECK(fake_gateway_accept(&g.gw, 20000));
  pcp_proto_accept_t accept;
  accept_params(&accept, 1, false);
  g.lease_epoch = 1;
  memcpy(g.resume_token, accept.resume_token, sizeof(g.resume_token));
  fake_join_t join;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  CHECK(join.proof_valid);
  CHECK(!join.proof_valid_with_wrong_token);
  CHECK(strcmp(join.worker_id, WORKER_ID) == 0);
  CHECK(strcmp(join.backend, "cpu") == 0);
  CHECK(strcmp(join.target, "") == 0);
  CHECK(join.device_id == 0);
  CHECK(join.device_memory_bytes > ((uint64_t)64 << 20));
  CHECK(join.driver_count == 1);
  CHECK(strcmp(join.drivers[0], "local-task") == 0);
  CHECK(join.runtime_version[0] != 0);
  char compiler[256];
  PCP_CHECK_OK(pcp_compile_compiler_version(compiler, sizeof(compiler)));
  CHECK(strcmp(join.compiler_version, compiler) == 0);
  char runtime[64];
  PCP_CHECK_OK(pcp_compute_runtime_version(runtime, sizeof(runtime)));
  CHECK(strcmp(join.runtime_version, runtime) == 0);
  CHECK(strcmp(join.node_manager_id, "nm-test") == 0);
  CHECK(join.supervisor_id == 7);
  CHECK(strcmp(join.worker_class, "test-class") == 0);
  CHECK(!join.has_resume);
  // Joined: the worker heartbeats on its own.
  CHECK(fake_gateway_idle(&g.gw, 3 * HEARTBEAT_MS) == 0);
  CHECK(g.gw.worker_heartbeats >= 2);
  CHECK(count_in_log("msg=\"joined\"") == 1);
}

static void fetches_a_missing_program_once(void** state) {
  (void)state;
  CHECK(offer_program());   // empty cache: fetched
  CHECK(!offer_program());  // now on disk: "cached"
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&g.program, hex);
  char path[800];
  snprintf(path, sizeof(path), "%s/%s.vmfb", g.cache_dir, hex);
  CHECK(pcp_file_exists(path));
}

static void runs_tasks_and_reuses_resident_tensors(void** state) {
  (void)state;
  float y[4];
  expected_main(y);
  // 1: y = x@w + b, kept as "y" and also returned.
  assign_main(1, "s1", "y", true);
  expect_result(1, y, NULL);
  // 2: y <- y + z, kept (not returned: a resident reference comes back).
  assign_accumulate(2, "s1", "y", "y");
  expect_result(2, NULL, "y");
  // 3: returns y + z with y = x@w + b + z: both earlier tasks' residents.
  assign_accumulate(3, "s1", "y", NULL);
  float expected[4];
  for (int i = 0; i < 4; ++i) expected[i] = y[i] + 2 * kZ[i];
  expect_result(3, expected, NULL);
  // Sessions are separate namespaces.
  assign_accumulate(4, "other-session", "y", NULL);
  expect_task_error(4, PCP_STATUS_NOT_FOUND);
}

static void honours_a_cancel(void** state) {
  (void)state;
  float y[4];
  expected_main(y);
  assign_main(10, "", NULL, false);
  uint64_t assign10 = g.gw.next_request_id - 1;
  assign_main(11, "", NULL, false);
  pcp_proto_task_cancel_t cancel = {.task_id = 11, .reason = "test"};
  pcp_proto_encoded_frame_t f;
  // TASK_CANCEL carries the assign's request id (the last one sent).
  fake_gateway_send(&g.gw,
                    pcp_proto_task_cancel_encode(
                        g.gw.version, g.gw.next_request_id - 1, &cancel,
                        &g.gw.limits, pcp_allocator_system(), &f),
                    &f);
  expect_result(10, y, NULL);
  expect_task_error(11, PCP_STATUS_CANCELLED);
  // A task that has started (RUNNING reported) but not yet reached its
  // IREE call is stopped before the call.
  assign_main(12, "", NULL, false);
  uint64_t assign12 = g.gw.next_request_id - 1;
  pcp_proto_frame_t frame;
  CHECK(fake_gateway_recv(&g.gw, 20000, &frame));
  CHECK(frame.header.type == PCP_PROTO_MESSAGE_TASK_PROGRESS);
  pcp_proto_frame_deinitialize(&frame);
  cancel.task_id = 12;
  fake_gateway_send(
      &g.gw,
      pcp_proto_task_cancel_encode(g.gw.version, assign12, &cancel,
                                   &g.gw.limits, pcp_allocator_system(), &f),
      &f);
  expect_task_error(12, PCP_STATUS_CANCELLED);
  // A cancel for a task that already finished changes nothing.
  cancel.task_id = 10;
  fake_gateway_send(
      &g.gw,
      pcp_proto_task_cancel_encode(g.gw.version, assign10, &cancel,
                                   &g.gw.limits, pcp_allocator_system(), &f),
      &f);
  CHECK(fake_gateway_idle(&g.gw, 300) == 0);
}

static void survives_a_short_sigstop(void** state) {
  (void)state;
  uint64_t before = g.gw.worker_heartbeats;
  // Half the silence timeout (3H), while the gateway keeps heartbeating.
  CHECK(kill(g.worker, SIGSTOP) == 0);
  CHECK(fake_gateway_idle(&g.gw, 3 * HEARTBEAT_MS / 2) == 0);
  CHECK(kill(g.worker, SIGCONT) == 0);
  CHECK(fake_gateway_idle(&g.gw, 4 * HEARTBEAT_MS) == 0);
  CHECK(!g.gw.eof);
  CHECK(g.gw.worker_heartbeats >= before + 2);
  CHECK(!fake_gateway_pending(&g.gw, 0));  // no reconnect
  float y[4];
  expected_main(y);
  assign_main(20, "", NULL, false);
  expect_result(20, y, NULL);
  CHECK(count_in_log("msg=\"connecting\"") == 1);
}

static void reconnects_with_the_same_id(void** state) {
  (void)state;
  // The gateway drops the connection; the worker comes back on its own.
  int64_t closed_at = fake_gateway_now_ns();
  fake_gateway_disconnect(&g.gw);
  CHECK(fake_gateway_accept(&g.gw, 10000));
  int64_t back_after_ms = (fake_gateway_now_ns() - closed_at) / 1000000;
  // Backoff from H/10 with jitter in [d/2, d]: at least H/20 later, and
  // well within the cap of 5H.
  CHECK(back_after_ms >= HEARTBEAT_MS / 20 - 1);
  CHECK(back_after_ms < 5 * HEARTBEAT_MS + 1000);
  pcp_proto_accept_t accept;
  accept_params(&accept, 1, true);  // the same lease continues
  fake_join_t join;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  CHECK(join.proof_valid);
  CHECK(strcmp(join.worker_id, WORKER_ID) == 0);
  CHECK(join.has_resume);
  CHECK(join.lease_epoch == g.lease_epoch);
  CHECK(memcmp(join.resume_token, g.resume_token, sizeof(g.resume_token)) == 0);
  memcpy(g.resume_token, accept.resume_token, sizeof(g.resume_token));
  CHECK(count_in_log("msg=\"connecting\"") == 2);
  CHECK(count_in_log("attempt=1") >= 2);

  // Resumed: the session's resident "y" is still there.
  float y[4];
  expected_main(y);
  float expected[4];
  for (int i = 0; i < 4; ++i) expected[i] = y[i] + 2 * kZ[i];
  assign_accumulate(30, "s1", "y", NULL);
  expect_result(30, expected, NULL);

  // Once more, and this time the gateway starts a fresh lease: the worker
  // drops its resident tensors.
  fake_gateway_disconnect(&g.gw);
  CHECK(fake_gateway_accept(&g.gw, 10000));
  accept_params(&accept, 2, false);
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  CHECK(strcmp(join.worker_id, WORKER_ID) == 0);
  CHECK(join.has_resume && join.lease_epoch == 1);
  assign_accumulate(31, "s1", "y", NULL);
  expect_task_error(31, PCP_STATUS_NOT_FOUND);
  CHECK(count_in_log("sessions dropped") == 1);
}

// A task still running when a new gateway session starts (the lease not
// resumed: a restarted gateway, whose task ids start again at 1) must not
// answer the new session's task that reuses its id.
static void old_session_answers_are_dropped(void** state) {
  (void)state;
  float y[4];
  expected_main(y);
  assign_main(60, "", NULL, false);
  pcp_proto_frame_t running;
  CHECK(fake_gateway_recv(&g.gw, 20000, &running));
  CHECK(running.header.type == PCP_PROTO_MESSAGE_TASK_PROGRESS);
  pcp_proto_frame_deinitialize(&running);
  // The old task has 250 ms of test delay left; the new session is up and
  // assigns its own task 60 well within that.
  fake_gateway_disconnect(&g.gw);
  CHECK(fake_gateway_accept(&g.gw, 10000));
  pcp_proto_accept_t accept;
  accept_params(&accept, 3, false);
  fake_join_t join;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  assign_main(60, "", NULL, false);
  // The first answer about task 60 is the new task's result (before the
  // fix: the old task's CANCELLED error), and nothing else follows.
  expect_result(60, y, NULL);
  CHECK(fake_gateway_idle(&g.gw, 600) == 0);
}

static void drains_and_exits_on_sigterm(void** state) {
  (void)state;
  float y[4];
  expected_main(y);
  // A task in flight when SIGTERM arrives still completes and reports. In
  // flight means the worker said so: its "running" report comes first (the
  // test task delay keeps it running for 250 ms after that).
  assign_main(40, "", NULL, false);
  pcp_proto_frame_t running;
  CHECK(fake_gateway_recv(&g.gw, 20000, &running));
  CHECK(running.header.type == PCP_PROTO_MESSAGE_TASK_PROGRESS);
  pcp_proto_task_progress_t report;
  PCP_CHECK_OK(pcp_proto_task_progress_parse(&running, &report));
  CHECK(report.task_id == 40 && report.state == PCP_PROTO_TASK_RUNNING);
  pcp_proto_frame_deinitialize(&running);
  g.early_progress = 1;
  CHECK(kill(g.worker, SIGTERM) == 0);
  pcp_proto_frame_t frame;
  CHECK(recv_skipping_progress(&frame, &g.early_progress));
  CHECK(frame.header.type == PCP_PROTO_MESSAGE_DRAIN);
  pcp_proto_frame_deinitialize(&frame);
  expect_result(40, y, NULL);
  // Then the worker closes and exits 0.
  CHECK(!fake_gateway_recv(&g.gw, 10000, &frame));
  CHECK(g.gw.eof);
  int status = wait_exit(g.worker, 10000);
  CHECK(status != -1);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g.worker = -1;
  CHECK(count_in_log("msg=\"drained\"") == 1);
}

static void restarted_worker_uses_its_cache(void** state) {
  (void)state;
  fake_gateway_disconnect(&g.gw);
  g.worker = spawn_worker("worker2.log");
  // First the gateway refuses the join (say, a token being rotated): the
  // worker backs off and tries again instead of exiting.
  CHECK(fake_gateway_accept(&g.gw, 20000));
  fake_join_t rejected;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, NULL, &rejected));
  pcp_proto_reject_t reject = {.reason = PCP_PROTO_REJECT_AUTH_FAILED,
                               .message = "token rotated"};
  pcp_proto_encoded_frame_t rf;
  fake_gateway_send(
      &g.gw,
      pcp_proto_reject_encode(g.gw.version, 1, &reject, &g.gw.limits,
                              pcp_allocator_system(), &rf),
      &rf);
  pcp_proto_frame_t closed;
  CHECK(!fake_gateway_recv(&g.gw, 5000, &closed));
  CHECK(g.gw.eof);  // the worker closed after the REJECT
  CHECK(fake_gateway_accept(&g.gw, 10000));
  CHECK(count_in_log("msg=\"join rejected\" ") == 1);
  CHECK(count_in_log("reason=AUTH_FAILED") == 1);
  pcp_proto_accept_t accept;
  accept_params(&accept, 3, false);
  fake_join_t join;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  CHECK(strcmp(join.worker_id, WORKER_ID) == 0);
  CHECK(!join.has_resume);  // a new process has no resume token
  CHECK(!offer_program());  // no fetch: the file from the first run
  float y[4];
  expected_main(y);
  assign_main(50, "", NULL, false);
  expect_result(50, y, NULL);
  // A gateway SHUTDOWN stops it for good, exit 0, no reconnect.
  pcp_proto_shutdown_t shutdown = {.reason = "test over"};
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(
      &g.gw,
      pcp_proto_shutdown_encode(g.gw.version, 0, &shutdown, &g.gw.limits,
                                pcp_allocator_system(), &f),
      &f);
  int status = wait_exit(g.worker, 10000);
  CHECK(status != -1);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g.worker = -1;
  CHECK(!fake_gateway_pending(&g.gw, 300));
  CHECK(count_in_log("program fetch") == 0);
  CHECK(count_in_log("msg=\"program cached\"") == 1);
}

static void corrupt_cached_program_is_fetched_again(void** state) {
  (void)state;
  // Flip a byte of the cached file: the next worker must not trust it.
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&g.program, hex);
  char path[800];
  snprintf(path, sizeof(path), "%s/%s.vmfb", g.cache_dir, hex);
  FILE* f = fopen(path, "r+b");
  CHECK(f != NULL);
  CHECK(fseek(f, 100, SEEK_SET) == 0);
  int c = fgetc(f);
  CHECK(fseek(f, 100, SEEK_SET) == 0);
  fputc(c ^ 0xFF, f);
  fclose(f);

  fake_gateway_disconnect(&g.gw);
  g.worker = spawn_worker("worker3.log");
  CHECK(fake_gateway_accept(&g.gw, 20000));
  pcp_proto_accept_t accept;
  accept_params(&accept, 4, false);
  fake_join_t join;
  CHECK(fake_gateway_handshake(&g.gw, TOKEN, &accept, &join));
  CHECK(offer_program());  // fetched again: the copy on disk was bad
  float y[4];
  expected_main(y);
  assign_main(60, "", NULL, false);
  expect_result(60, y, NULL);
  CHECK(kill(g.worker, SIGTERM) == 0);
  int status = wait_exit(g.worker, 10000);
  CHECK(status != -1);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g.worker = -1;
  CHECK(count_in_log("does not match its hash") == 1);
}

static void without_a_token_idles_and_says_so(void** state) {
  (void)state;
  fake_gateway_disconnect(&g.gw);
  g.worker = spawn_worker_token("worker4.log", false);
  // It never connects (it could not prove anything), and it does not exit.
  CHECK(!fake_gateway_pending(&g.gw, 1500));
  CHECK(waitpid(g.worker, NULL, WNOHANG) == 0);
  CHECK(count_in_log("no join token: environment variable "
                     "PCP_TEST_JOIN_TOKEN is unset or empty") == 1);
  CHECK(kill(g.worker, SIGTERM) == 0);
  int status = wait_exit(g.worker, 10000);
  CHECK(status != -1);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g.worker = -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(joins_with_proof_and_every_field),
      cmocka_unit_test(fetches_a_missing_program_once),
      cmocka_unit_test(runs_tasks_and_reuses_resident_tensors),
      cmocka_unit_test(honours_a_cancel),
      cmocka_unit_test(survives_a_short_sigstop),
      cmocka_unit_test(reconnects_with_the_same_id),
      cmocka_unit_test(old_session_answers_are_dropped),
      cmocka_unit_test(drains_and_exits_on_sigterm),
      cmocka_unit_test(restarted_worker_uses_its_cache),
      cmocka_unit_test(corrupt_cached_program_is_fetched_again),
      cmocka_unit_test(without_a_token_idles_and_says_so),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
