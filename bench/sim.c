// SPDX-License-Identifier: Apache-2.0
//
// bench/sim: how much faster the deterministic simulation (src/sim) runs a
// scenario than the same scenario on real threads and sockets, and how many
// seeds of the default (faulty) scenario it checks per minute.
//
// The scenario, both ways: 4 workers (proto worker state machines, H = 100
// ms) and 6 jobs of 1..3 steps submitted over the first 600 ms; a step is a
// task whose fake compute takes 5..80 ms and returns 8 deterministic bytes;
// every job is created, moved through placing/compiling/running, its steps
// committed and its result put in a SQLite store, as the simulation's
// "sim" kind does on the real workload runner (src/workloads/runtime). No
// faults (a real run cannot replay them).
//   - sim: pcp_sim_run with faults and buggify off, seeds 1..R.
//   - real: the fabric endpoint (libuv loop thread, sched) on 127.0.0.1 and
//     4 worker threads, each a proto worker on a blocking TCP socket, with
//     the store written from the task callbacks; the same R seeds draw the
//     step counts, submit times and compute times from the same ranges.
// Events: a scenario has E events as the simulation counts them (frames
// delivered, ticks, task completions, submits, boots); both ways run the
// same scenarios, so events/s = E / wall time and
//   ratio = sim events/s / real events/s = real wall / sim wall.
// Then seeds/min of the default scenario (faults + buggify) over S seeds.
// Last line: "sim ratio=<x>" (wall times). Goal: ratio >= 5 (a simulated
// second must cost far less than a real one, or 1,000 seeds would not fit
// in a test); the CPU-time ratio is printed too, since on a busy machine
// the simulation's wall time is mostly waiting for a core.
// PCP_SIM_BENCH_SEEDS (default 3) and PCP_SIM_BENCH_MINUTE_SEEDS (default
// 200) size it.

#define _XOPEN_SOURCE 700  // mkdtemp, setenv

#include "sim/sim.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"
#include "fabric/fabric.h"
#include "proto/proto.h"
#include "sched/sched.h"
#include "store/store.h"

#define BENCH "sim"
#define WORKERS 4u
#define JOBS 6u
#define MAX_STEPS 3u
#define HEARTBEAT_MS 100u
#define MS INT64_C(1000000)
#define TOKEN_ENV "PCP_SIM_BENCH_JOIN_TOKEN"
static const char kToken[] = "pcp-sim-bench-token";

static int64_t now_ns(void) {
  return pcp_clock_now_ns(pcp_clock_system());
}

static void output_of(uint32_t job, int64_t step, uint8_t out[8]) {
  uint64_t z = ((uint64_t)job << 32) ^ (uint64_t)step ^ UINT64_C(0x5eed);
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  z ^= z >> 31;
  for (unsigned i = 0; i < 8; ++i) out[i] = (uint8_t)(z >> (8 * i));
}

//===----------------------------------------------------------------------===//
// Real workers: a proto worker on a blocking socket, one thread each
//===----------------------------------------------------------------------===//

typedef struct real_task_t {
  uint64_t task_id;
  int64_t due_ns;
  uint32_t job;
  int64_t step;
  bool live;
} real_task_t;

typedef struct real_worker_t {
  pthread_t thread;
  uint32_t index;
  uint16_t port;
  char id[16];
  pcp_rng_t rng;
  pcp_proto_worker_t* proto;
  pcp_proto_worker_config_t config;
  int fd;
  atomic_bool stop;
  real_task_t tasks[16];
} real_worker_t;

static bool write_all(int fd, const uint8_t* data, size_t length) {
  while (length) {
    ssize_t n = write(fd, data, length);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    length -= (size_t)n;
  }
  return true;
}

static void worker_close(real_worker_t* w) {
  if (w->fd >= 0)
    close(w->fd);
  w->fd = -1;
  pcp_status_ignore(pcp_proto_worker_on_closed(w->proto, now_ns()));
}

static void worker_actions(real_worker_t* w) {
  pcp_proto_action_t a;
  while (pcp_proto_worker_next_action(w->proto, &a)) {
    switch (a.type) {
      case PCP_PROTO_ACTION_SEND: {
        uint8_t* bytes = NULL;
        size_t length = 0;
        pcp_status_t status = pcp_proto_encoded_frame_flatten(
            &a.frame, pcp_allocator_system(), &bytes, &length);
        if (!status && w->fd >= 0 && !write_all(w->fd, bytes, length)) {
          worker_close(w);
        }
        pcp_status_ignore(status);
        pcp_allocator_free(pcp_allocator_system(), bytes);
        break;
      }
      case PCP_PROTO_ACTION_CLOSE:
        if (w->fd >= 0)
          close(w->fd);
        w->fd = -1;
        break;
      case PCP_PROTO_ACTION_CONNECT: {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in addr = {.sin_family = AF_INET,
                                   .sin_port = htons(w->port)};
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (fd >= 0 &&
            connect(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0) {
          w->fd = fd;
          pcp_status_ignore(pcp_proto_worker_on_connected(w->proto, now_ns()));
        } else {
          if (fd >= 0)
            close(fd);
          pcp_status_ignore(pcp_proto_worker_on_closed(w->proto, now_ns()));
        }
        break;
      }
      case PCP_PROTO_ACTION_PROGRAM_LOOKUP:
        pcp_status_ignore(pcp_proto_worker_program_lookup_done(
            w->proto, a.request_id, true, now_ns()));
        break;
      case PCP_PROTO_ACTION_PROGRAM_STORE:
        pcp_status_ignore(pcp_proto_worker_program_stored(
            w->proto, a.request_id, pcp_ok_status(), now_ns()));
        break;
      case PCP_PROTO_ACTION_RUN_TASK: {
        uint32_t job = 0;
        int64_t step = 0;
        if (a.received.section_count == 1 &&
            a.received.sections[0].byte_length == 16) {
          const uint8_t* d = a.received.sections[0].data;
          memcpy(&job, d, sizeof(job));
          memcpy(&step, d + 8, sizeof(step));
        }
        for (size_t i = 0; i < 16; ++i) {
          if (w->tasks[i].live)
            continue;
          w->tasks[i] = (real_task_t){
              .task_id = a.task_id,
              .due_ns = now_ns() + 5 * MS +
                        (int64_t)pcp_rng_next_below(&w->rng, 75 * MS + 1),
              .job = job,
              .step = step,
              .live = true};
          break;
        }
        break;
      }
      case PCP_PROTO_ACTION_CANCEL_TASK:
        for (size_t i = 0; i < 16; ++i) {
          if (w->tasks[i].live && w->tasks[i].task_id == a.task_id) {
            w->tasks[i].live = false;
          }
        }
        break;
      default:
        break;
    }
    pcp_proto_action_deinitialize(&a);
  }
}

static void* worker_main(void* arg) {
  real_worker_t* w = arg;
  pcp_status_ignore(pcp_proto_worker_start(w->proto, now_ns()));
  worker_actions(w);
  static _Thread_local uint8_t buffer[1 << 16];
  while (!atomic_load(&w->stop)) {
    int64_t now = now_ns();
    int64_t wait_ns = 25 * MS;
    for (size_t i = 0; i < 16; ++i) {
      if (w->tasks[i].live && w->tasks[i].due_ns - now < wait_ns) {
        wait_ns = w->tasks[i].due_ns - now;
      }
    }
    if (wait_ns < 0)
      wait_ns = 0;
    struct pollfd pfd = {.fd = w->fd, .events = POLLIN};
    int ready = poll(&pfd, w->fd >= 0 ? 1 : 0, (int)(wait_ns / MS));
    if (ready > 0 && w->fd >= 0) {
      ssize_t n = read(w->fd, buffer, sizeof(buffer));
      if (n <= 0) {
        worker_close(w);
      } else {
        pcp_status_t status =
            pcp_proto_worker_on_bytes(w->proto, buffer, (size_t)n, now_ns());
        pcp_status_ignore(status);
      }
      worker_actions(w);
    }
    now = now_ns();
    for (size_t i = 0; i < 16; ++i) {
      real_task_t* t = &w->tasks[i];
      if (!t->live || t->due_ns > now)
        continue;
      t->live = false;
      uint8_t out[8];
      output_of(t->job, t->step, out);
      pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
      pcp_proto_task_result_t result = {
          .task_id = t->task_id, .outputs = &ref, .output_count = 1};
      pcp_proto_section_t section = {.name = "out",
                                     .element_type = PCP_ELEMENT_TYPE_U8,
                                     .rank = 1,
                                     .data = out};
      section.shape[0] = 8;
      pcp_status_ignore(
          pcp_proto_worker_task_complete(w->proto, &result, &section, 1, now));
      worker_actions(w);  // the SEND borrows |out|: write it now
    }
    pcp_status_ignore(pcp_proto_worker_on_tick(w->proto, now_ns()));
    worker_actions(w);
  }
  if (w->fd >= 0)
    close(w->fd);
  return NULL;
}

//===----------------------------------------------------------------------===//
// Real gateway side: fabric endpoint + store, jobs as chains of tasks
//===----------------------------------------------------------------------===//

typedef struct real_job_t {
  struct real_run_t* run;
  uint32_t index;
  uint32_t steps;
  int64_t step;
  uint8_t input[16];
} real_job_t;

typedef struct real_run_t {
  pcp_fabric_endpoint_t* endpoint;
  pcp_store_t* store;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  real_job_t jobs[JOBS];
  atomic_uint done;
  atomic_uint errors;
} real_run_t;

static void job_submit_step(real_job_t* job);

static void on_task(void* user_data, pcp_fabric_task_t* task,
                    pcp_fabric_task_event_t event) {
  if (event != PCP_FABRIC_TASK_EVENT_DONE)
    return;
  real_job_t* job = user_data;
  real_run_t* run = job->run;
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  uint8_t expected[8];
  output_of(job->index, job->step, expected);
  pcp_status_t status = pcp_fabric_task_outputs(task, &outputs, &count);
  if (status || count != 1 || outputs[0].byte_length != 8 ||
      memcmp(outputs[0].data, expected, 8) != 0) {
    pcp_status_ignore(status);
    atomic_fetch_add(&run->errors, 1);
    atomic_fetch_add(&run->done, 1);
    return;
  }
  char id[32];
  snprintf(id, sizeof(id), "job-%u", job->index);
  bool last = job->step + 1 == (int64_t)job->steps;
  if (last) {
    pcp_store_job_result_t row = {
        .dtype = PCP_ELEMENT_TYPE_U8, .rank = 1, .byte_length = 8};
    row.shape[0] = 8;
    snprintf(row.job_id, sizeof(row.job_id), "%s", id);
    snprintf(row.name, sizeof(row.name), "out");
    snprintf(row.path, sizeof(row.path), "sim/%s/out.bin", id);
    pcp_sha256_compute(outputs[0].data, 8, &row.sha256);
    pcp_status_ignore(pcp_store_job_result_put(run->store, &row));
  }
  pcp_status_ignore(pcp_store_job_step_commit(run->store, id, job->step, NULL));
  if (last) {
    pcp_status_ignore(pcp_store_job_transition(
        run->store, id, PCP_STORE_JOB_STATE_SUCCEEDED, NULL, NULL));
    atomic_fetch_add(&run->done, 1);
    return;
  }
  job->step++;
  job_submit_step(job);
}

static void job_submit_step(real_job_t* job) {
  real_run_t* run = job->run;
  memcpy(job->input, &job->index, sizeof(job->index));
  memcpy(job->input + 8, &job->step, sizeof(job->step));
  pcp_proto_section_t input = {.name = "in",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .data = job->input};
  input.shape[0] = 16;
  pcp_fabric_task_params_t params = {
      .function = "sim_step",
      .inputs = &input,
      .input_count = 1,
      .worker_class = PCP_SCHED_WORKER_CLASS_ANY,
      .target = "",
      .callback = on_task,
      .user_data = job,
  };
  memcpy(params.program, run->program, sizeof(params.program));
  pcp_status_t status = pcp_fabric_task_submit(run->endpoint, &params, NULL);
  if (status) {
    pcp_status_ignore(status);
    atomic_fetch_add(&run->errors, 1);
    atomic_fetch_add(&run->done, 1);
  }
}

// One real run of seed |seed|; returns its wall time in ns.
static int64_t real_run(uint64_t seed) {
  char dir[] = "/tmp/pcp-sim-bench-XXXXXX";
  if (!mkdtemp(dir)) {
    fprintf(stderr, "%s: mkdtemp failed\n", BENCH);
    exit(1);
  }
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  static real_run_t run;
  memset(&run, 0, sizeof(run));
  int64_t start = now_ns();
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = dir;
  store_options.sync_mode = PCP_STORE_SYNC_NORMAL;
  pcp_bench_check(
      BENCH,
      pcp_store_create(&store_options, pcp_allocator_system(), &run.store),
      "store");
  pcp_fabric_options_t options;
  pcp_fabric_options_initialize(&options);
  options.heartbeat_interval_ms = HEARTBEAT_MS;
  options.join_token_env = TOKEN_ENV;
  pcp_bench_check(BENCH,
                  pcp_fabric_endpoint_create(&options, pcp_allocator_system(),
                                             &run.endpoint),
                  "endpoint");
  pcp_bench_check(BENCH,
                  pcp_fabric_program_register(run.endpoint, "sim-program", 11,
                                              "cpu", "host", run.program),
                  "program");
  static real_worker_t workers[WORKERS];
  for (uint32_t w = 0; w < WORKERS; ++w) {
    real_worker_t* worker = &workers[w];
    memset(worker, 0, sizeof(*worker));
    worker->index = w;
    worker->port = pcp_fabric_endpoint_port(run.endpoint);
    worker->fd = -1;
    snprintf(worker->id, sizeof(worker->id), "w%u", w);
    pcp_rng_initialize(pcp_rng_next_u64(&rng), &worker->rng);
    worker->config = (pcp_proto_worker_config_t){
        .limits = pcp_proto_limits_default(),
        .heartbeat_interval_ms = HEARTBEAT_MS,
        .join = {.worker_id = worker->id,
                 .backend = "cpu",
                 .target = "host",
                 .device_memory_bytes = UINT64_C(1) << 30,
                 .runtime_version = "sim",
                 .compiler_version = "sim",
                 .node_manager_id = "",
                 .supervisor_id = -1,
                 .worker_class = "cpu"},
        .join_token = (const uint8_t*)kToken,
        .join_token_length = sizeof(kToken) - 1,
    };
    pcp_bench_check(
        BENCH,
        pcp_proto_worker_create(&worker->config, &worker->rng,
                                pcp_allocator_system(), &worker->proto),
        "worker");
    pthread_create(&worker->thread, NULL, worker_main, worker);
  }
  // Submit times over the first 600 ms, in order.
  int64_t at[JOBS];
  for (uint32_t j = 0; j < JOBS; ++j) {
    run.jobs[j] = (real_job_t){
        .run = &run,
        .index = j,
        .steps = 1 + (uint32_t)pcp_rng_next_below(&rng, MAX_STEPS)};
    at[j] = (int64_t)pcp_rng_next_below(&rng, 600 * MS + 1);
  }
  for (uint32_t submitted = 0; submitted < JOBS;) {
    int64_t elapsed = now_ns() - start;
    for (uint32_t j = 0; j < JOBS; ++j) {
      if (at[j] < 0 || at[j] > elapsed)
        continue;
      at[j] = -1;
      submitted++;
      char id[32];
      snprintf(id, sizeof(id), "job-%u", j);
      json_t* spec = json_pack("{s:i}", "steps", (json_int_t)run.jobs[j].steps);
      pcp_bench_check(BENCH,
                      pcp_store_job_create(run.store, id, "sim", spec, NULL),
                      "job create");
      json_decref(spec);
      static const pcp_store_job_state_t path[] = {
          PCP_STORE_JOB_STATE_PLACING, PCP_STORE_JOB_STATE_COMPILING,
          PCP_STORE_JOB_STATE_RUNNING};
      for (size_t k = 0; k < 3; ++k) {
        pcp_bench_check(
            BENCH, pcp_store_job_transition(run.store, id, path[k], NULL, NULL),
            "transition");
      }
      job_submit_step(&run.jobs[j]);
    }
    pcp_sleep_ms(1);
  }
  int64_t deadline = now_ns() + 60000 * MS;
  while (atomic_load(&run.done) < JOBS && now_ns() < deadline) {
    pcp_sleep_ms(1);
  }
  int64_t elapsed = now_ns() - start;
  if (atomic_load(&run.done) < JOBS || atomic_load(&run.errors)) {
    fprintf(stderr, "%s: real run of seed %llu: %u of %u jobs, %u errors\n",
            BENCH, (unsigned long long)seed, atomic_load(&run.done), JOBS,
            atomic_load(&run.errors));
    exit(1);
  }
  for (uint32_t w = 0; w < WORKERS; ++w) atomic_store(&workers[w].stop, true);
  for (uint32_t w = 0; w < WORKERS; ++w) {
    pthread_join(workers[w].thread, NULL);
    pcp_proto_worker_release(workers[w].proto);
  }
  pcp_fabric_endpoint_release(run.endpoint);
  pcp_store_release(run.store);
  char command[128];
  snprintf(command, sizeof(command), "rm -rf %s", dir);
  if (system(command) != 0)
    fprintf(stderr, "%s: could not remove %s\n", BENCH, dir);
  return elapsed;
}

// CPU time of this process (user + system). During the simulated phases
// only the main thread runs, so it is the simulation's own cost, free of
// the waiting a busy machine adds to wall time.
static int64_t cpu_ns(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return ((int64_t)usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000 +
         ((int64_t)usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000;
}

static uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* value = getenv(name);
  return value && *value ? strtoull(value, NULL, 10) : fallback;
}

int main(void) {
  setenv(TOKEN_ENV, kToken, 1);
  pcp_log_set_level(PCP_LOG_ERROR);
  uint64_t seeds = env_u64("PCP_SIM_BENCH_SEEDS", 3);
  uint64_t minute_seeds = env_u64("PCP_SIM_BENCH_MINUTE_SEEDS", 200);
  if (seeds == 0 || minute_seeds == 0) {
    fprintf(stderr, "%s: seed counts must be positive\n", BENCH);
    return 2;
  }

  // The scenario without faults, simulated.
  uint64_t events = 0;
  int64_t virtual_ns = 0;
  int64_t start = now_ns();
  int64_t cpu_start = cpu_ns();
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    pcp_sim_options_t options;
    pcp_sim_options_initialize(seed, &options);
    options.faults = false;
    options.buggify = false;
    options.worker_count = WORKERS;
    options.job_count = JOBS;
    options.max_steps_per_job = MAX_STEPS;
    pcp_sim_result_t result;
    pcp_bench_check(BENCH, pcp_sim_run(&options, &result), "sim run");
    if (result.failed) {
      fprintf(stderr, "%s: seed %llu failed: %s\n", BENCH,
              (unsigned long long)seed, result.failure);
      return 1;
    }
    events += result.event_count;
    virtual_ns += result.end_ns;
  }
  int64_t sim_ns = now_ns() - start;
  int64_t sim_cpu_ns = cpu_ns() - cpu_start;

  // The same scenarios on real threads and sockets.
  int64_t real_ns = 0;
  for (uint64_t seed = 1; seed <= seeds; ++seed) real_ns += real_run(seed);

  // Seeds per minute of the default scenario (faults, buggify).
  start = now_ns();
  uint64_t minute_events = 0;
  for (uint64_t seed = 1; seed <= minute_seeds; ++seed) {
    pcp_sim_options_t options;
    pcp_sim_options_initialize(seed, &options);
    pcp_sim_result_t result;
    pcp_bench_check(BENCH, pcp_sim_run(&options, &result), "sim run");
    minute_events += result.event_count;
  }
  int64_t minute_ns = now_ns() - start;

  double sim_rate = (double)events / ((double)sim_ns / 1e9);
  double real_rate = (double)events / ((double)real_ns / 1e9);
  double ratio = sim_rate / real_rate;
  double seeds_per_minute = (double)minute_seeds / ((double)minute_ns / 60e9);
  printf(
      "%s scenario: %u workers, %u jobs of 1..%u steps, %llu seeds, "
      "%llu events, %.3f s simulated\n",
      BENCH, WORKERS, JOBS, MAX_STEPS, (unsigned long long)seeds,
      (unsigned long long)events, (double)virtual_ns / 1e9);
  printf(
      "%s sim: %.3f s wall, %.0f events/s (%.3f s CPU: %.0f events/s, "
      "%.1fx the real run)\n",
      BENCH, (double)sim_ns / 1e9, sim_rate, (double)sim_cpu_ns / 1e9,
      (double)events / ((double)sim_cpu_ns / 1e9),
      (double)real_ns / (double)sim_cpu_ns);
  printf(
      "%s real (fabric endpoint + %u worker threads on 127.0.0.1): %.3f s "
      "wall, %.0f events/s\n",
      BENCH, WORKERS, (double)real_ns / 1e9, real_rate);
  printf(
      "%s default scenario (faults, buggify): %llu seeds in %.3f s = "
      "%.0f seeds/min, %.0f events/s\n",
      BENCH, (unsigned long long)minute_seeds, (double)minute_ns / 1e9,
      seeds_per_minute, (double)minute_events / ((double)minute_ns / 1e9));
  bool met = pcp_bench_goal(BENCH, ratio >= 5.0,
                            "sim events/s >= 5x the real run's (wall)");
  printf("%s ratio=%.3f\n", BENCH, ratio);
  return pcp_bench_exit_code(met);
}
