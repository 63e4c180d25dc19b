// SPDX-License-Identifier: Apache-2.0
// bench/dashboard: how long the dashboard's job page of a 1,000-step
// training job takes to render in headless Chromium (navigation start to
// the charts drawn, the page's own performance mark) against an empty page
// served by the same gateway, and the gateway's CPU per SSE subscriber per
// second. The orchestration (gateway, Chromium over the DevTools protocol,
// the subscribers, /proc) is Python: bench/dashboard.py, which this binary
// runs with the project's venv, the pcp binary and itself.
//
// `dashboard --seed STATE_DIR STEPS` is the part in C: it writes a
// succeeded training job with STEPS "training.step" events into the store
// under STATE_DIR through the store API the gateway's training service
// uses (pcp_store_job_create, pcp_store_job_transition,
// pcp_store_job_event_append), so the gateway then serves that history as
// it would a real one.
//
// Last line: `dashboard ratio=<x>`, x = empty page ms / job page ms.

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"
#include "store/store.h"

#define MAX_STEPS 100000

static pcp_status_t seed(pcp_store_t* store, const char* id, int64_t steps) {
  json_t* spec = json_pack(
      "{s:{s:s, s:{s:s, s:i, s:i, s:i}, s:I, s:i, s:f}, s:[], "
      "s:{s:i, s:I, s:i, s:I}}",
      "experiment", "name", "bench-1000", "model", "kind", "gpt", "layers", 2,
      "heads", 4, "width", 192, "outer_loop_steps", (json_int_t)steps, "tau",
      10, "learning_rate", 0.003, "unknown_keys", "training", "outer_step", 0,
      "outer_loop_steps", (json_int_t)steps, "tau", 10, "parameter_count",
      (json_int_t)910000);
  if (!spec) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "spec");
  }
  pcp_status_t status = pcp_store_job_create(store, id, "training", spec, NULL);
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  const pcp_store_job_state_t path[] = {PCP_STORE_JOB_STATE_PLACING,
                                        PCP_STORE_JOB_STATE_COMPILING,
                                        PCP_STORE_JOB_STATE_RUNNING};
  for (size_t i = 0; i < PCP_ARRAYSIZE(path); ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_job_transition(store, id, path[i], NULL, NULL));
  }
  // A loss curve shaped like a real run's (exponential decay to ~1.5 with
  // a little deterministic noise), an evaluation every 10 steps.
  uint64_t wire = 0;
  for (int64_t s = 1; s <= steps && !status; ++s) {
    double loss =
        1.5 + 2.7 * exp(-(double)s / 150.0) + 0.05 * sin((double)s * 1.7);
    bool evaluated = s % 10 == 0;
    uint64_t step_bytes = 14560000;
    wire += step_bytes;
    json_t* p = json_pack(
        "{s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:i, s:f, s:f, s:b}", "outer_step",
        (json_int_t)s, "outer_loop_steps", (json_int_t)steps, "loss", loss,
        "loss_mean", loss + 0.02, "tokens_per_second",
        9000.0 + 500.0 * sin((double)s / 7.0), "wire_bytes", (json_int_t)wire,
        "step_wire_bytes", (json_int_t)step_bytes, "workers", 2, "seconds", 1.4,
        "lr", 0.003, "evaluated", evaluated);
    if (p && evaluated) {
      json_object_set_new(p, "val_loss", json_real(loss + 0.08));
    }
    status = p ? pcp_store_job_event_append(store, id, "training.step", p, NULL)
               : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "event");
    json_decref(p);
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  return pcp_store_job_transition(store, id, PCP_STORE_JOB_STATE_SUCCEEDED,
                                  NULL, NULL);
}

static int seed_main(const char* state_dir, const char* steps_text) {
  char* end = NULL;
  long long steps = strtoll(steps_text, &end, 10);
  if (!end || *end || steps < 1 || steps > MAX_STEPS) {
    fprintf(stderr, "dashboard --seed: STEPS must be in [1, %d]\n", MAX_STEPS);
    return 2;
  }
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = state_dir;
  // A bench fixture: no fsync per event.
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  pcp_store_t* store = NULL;
  pcp_status_t status =
      pcp_store_create(&options, pcp_allocator_system(), &store);
  if (!status) {
    status = seed(store, "train-bench-dashboard", steps);
  }
  pcp_store_release(store);
  if (status) {
    char message[512];
    pcp_status_format(status, message, sizeof(message));
    fprintf(stderr, "dashboard --seed: %s\n", message);
    pcp_status_ignore(status);
    return 1;
  }
  printf("train-bench-dashboard\n");
  return 0;
}

// `dashboard --append STATE_DIR RATE SECONDS`: appends RATE small job
// events per second for SECONDS to the seeded job, from this process's own
// store connection while the gateway runs (SQLite WAL: the gateway's event
// pump reads them as it reads its own), so the SSE subscribers have
// events to receive.
static int append_main(const char* state_dir, const char* rate_text,
                       const char* seconds_text) {
  long rate = strtol(rate_text, NULL, 10);
  long seconds = strtol(seconds_text, NULL, 10);
  if (rate < 1 || rate > 1000 || seconds < 1 || seconds > 600) {
    fprintf(stderr,
            "dashboard --append: RATE in [1, 1000], SECONDS in "
            "[1, 600]\n");
    return 2;
  }
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = state_dir;
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  pcp_store_t* store = NULL;
  pcp_status_t status =
      pcp_store_create(&options, pcp_allocator_system(), &store);
  pcp_clock_t clock = pcp_clock_system();
  int64_t start = pcp_clock_now_ns(clock);
  for (long i = 0; !status && i < rate * seconds; ++i) {
    int64_t due = start + (int64_t)i * INT64_C(1000000000) / rate;
    int64_t now = pcp_clock_now_ns(clock);
    if (due > now) {
      struct timespec wait = {.tv_sec = (due - now) / 1000000000,
                              .tv_nsec = (due - now) % 1000000000};
      nanosleep(&wait, NULL);
    }
    json_t* p = json_pack("{s:I, s:f}", "tick", (json_int_t)i, "loss", 2.0);
    status = p ? pcp_store_job_event_append(store, "train-bench-dashboard",
                                            "bench.tick", p, NULL)
               : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "event");
    json_decref(p);
  }
  pcp_store_release(store);
  if (status) {
    char message[512];
    pcp_status_format(status, message, sizeof(message));
    fprintf(stderr, "dashboard --append: %s\n", message);
    pcp_status_ignore(status);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "--seed") == 0) {
    return seed_main(argv[2], argv[3]);
  }
  if (argc == 5 && strcmp(argv[1], "--append") == 0) {
    return append_main(argv[2], argv[3], argv[4]);
  }
  // Anything else is a usage error (never handed to the script, which
  // calls this binary back with --seed / --append).
  if (argc != 1) {
    fprintf(stderr,
            "usage: dashboard  (the benchmark)\n"
            "       dashboard --seed STATE_DIR STEPS\n"
            "       dashboard --append STATE_DIR RATE SECONDS\n");
    return 2;
  }
  char* args[] = {(char*)PCP_VENV_PYTHON,
                  (char*)PCP_SOURCE_DIR "/bench/dashboard.py",
                  (char*)PCP_BINARY_PATH, argv[0], NULL};
  execv(args[0], args);
  perror("dashboard: running " PCP_VENV_PYTHON);
  return 1;
}
