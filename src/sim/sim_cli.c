// SPDX-License-Identifier: Apache-2.0
//
// pcp sim: runs the deterministic simulation over many seeds, replays one
// with its trace, shrinks a failing one (docs/simulation.md; tools/sim.sh).
//
//   pcp sim --seeds N [--first S]     N seeds from S (default 1)
//   pcp sim --seed S [--trace]        one seed, its trace on stdout
//   pcp sim --seed S --shrink         shrink a failing seed, print the
//                                     schedule and the trace of the
//                                     shrunk run
// Scenario: --workers W --jobs J --steps K --no-faults --no-buggify.
// Exit status: 0 when every seed passed, 1 when one failed, 2 for usage.

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

static void usage_print(FILE* out) {
  fprintf(out,
          "usage: pcp sim [--seeds N] [--first S] [--seed S] [--trace] "
          "[--shrink] [--workers W] [--jobs J] [--steps K] [--no-faults] "
          "[--no-buggify]\n"
          "  --seeds N      seeds to run, 1..100000000 (default 1000)\n"
          "  --first S      the first of them (default 1)\n"
          "  --seed S       one seed only; with --trace its trace on stdout,\n"
          "                 with --shrink the shortest failing schedule\n"
          "  --workers W    simulated workers, 1..16 (default 4)\n"
          "  --jobs J       jobs per seed, 1..64 (default 6)\n"
          "  --steps K      steps per job, 1..8 (default 3)\n"
          "  --no-faults    no crashes, resets, restarts or store failures\n"
          "  --no-buggify   no BUGGIFY sites\n"
          "exit status: 0 every seed passed, 1 one failed, 2 usage\n");
}

static int usage(void) {
  usage_print(stderr);
  return 2;
}

// A decimal integer, no sign (strtoull would wrap "-1" to 2^64 - 1).
static bool parse_u64(const char* text, uint64_t* out) {
  if (!(*text >= '0' && *text <= '9'))
    return false;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (*end || errno == ERANGE)
    return false;
  *out = v;
  return true;
}

int pcp_sim_cli_main(int argc, char** argv) {
  optind = 1;  // a subcommand of pcp: getopt starts fresh
  enum {
    OPT_SEEDS = 1,
    OPT_FIRST,
    OPT_SEED,
    OPT_TRACE,
    OPT_SHRINK,
    OPT_WORKERS,
    OPT_JOBS,
    OPT_STEPS,
    OPT_NO_FAULTS,
    OPT_NO_BUGGIFY,
    OPT_HELP
  };
  static const struct option long_options[] = {
      {"seeds", required_argument, NULL, OPT_SEEDS},
      {"first", required_argument, NULL, OPT_FIRST},
      {"seed", required_argument, NULL, OPT_SEED},
      {"trace", no_argument, NULL, OPT_TRACE},
      {"shrink", no_argument, NULL, OPT_SHRINK},
      {"workers", required_argument, NULL, OPT_WORKERS},
      {"jobs", required_argument, NULL, OPT_JOBS},
      {"steps", required_argument, NULL, OPT_STEPS},
      {"no-faults", no_argument, NULL, OPT_NO_FAULTS},
      {"no-buggify", no_argument, NULL, OPT_NO_BUGGIFY},
      {"help", no_argument, NULL, OPT_HELP},
      {NULL, 0, NULL, 0},
  };
  uint64_t seeds = 1000, first = 1, one_seed = 0, workers = 4, jobs = 6,
           steps = 3;
  bool have_seed = false, want_trace = false, want_shrink = false;
  bool faults = true, buggify = true;
  int opt;
  while ((opt = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = true;
    switch (opt) {
      case OPT_SEEDS:
        ok = parse_u64(optarg, &seeds);
        break;
      case OPT_FIRST:
        ok = parse_u64(optarg, &first);
        break;
      case OPT_SEED:
        ok = parse_u64(optarg, &one_seed);
        have_seed = true;
        break;
      case OPT_TRACE:
        want_trace = true;
        break;
      case OPT_SHRINK:
        want_shrink = true;
        break;
      case OPT_WORKERS:
        ok = parse_u64(optarg, &workers);
        break;
      case OPT_JOBS:
        ok = parse_u64(optarg, &jobs);
        break;
      case OPT_STEPS:
        ok = parse_u64(optarg, &steps);
        break;
      case OPT_NO_FAULTS:
        faults = false;
        break;
      case OPT_NO_BUGGIFY:
        buggify = false;
        break;
      case OPT_HELP:
        usage_print(stdout);
        return 0;
      default:
        return usage();
    }
    if (!ok) {
      fprintf(stderr, "pcp sim: --%s wants a non-negative integer, got '%s'\n",
              long_options[opt - 1].name, optarg);
      return usage();
    }
  }
  if (optind != argc) {
    fprintf(stderr, "pcp sim: unexpected argument '%s'\n", argv[optind]);
    return usage();
  }
  if (seeds == 0 || seeds > UINT64_C(100000000)) {
    fprintf(stderr, "pcp sim: --seeds must be in 1..100000000\n");
    return usage();
  }
  if (have_seed) {
    first = one_seed;
    seeds = 1;
  }
  uint64_t failed = 0, events = 0;
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    pcp_sim_options_t options;
    pcp_sim_options_initialize(seed, &options);
    options.worker_count = (uint32_t)workers;
    options.job_count = (uint32_t)jobs;
    options.max_steps_per_job = (uint32_t)steps;
    options.faults = faults;
    options.buggify = buggify;
    options.trace = want_trace && !want_shrink ? stdout : NULL;
    pcp_sim_result_t result;
    pcp_status_t status = pcp_sim_run(&options, &result);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      pcp_status_ignore(status);
      fprintf(stderr, "pcp sim: %s\n", text);
      return 2;
    }
    events += result.event_count;
    if (!result.failed) {
      if (have_seed) {
        printf("seed %llu passed: %llu events, trace hash %016llx\n",
               (unsigned long long)seed, (unsigned long long)result.event_count,
               (unsigned long long)result.trace_hash);
      }
      continue;
    }
    failed++;
    printf("seed %llu FAILED: %s (trace hash %016llx)\n",
           (unsigned long long)seed, result.failure,
           (unsigned long long)result.trace_hash);
    printf("fault schedule:\n");
    pcp_sim_faults_print(result.faults, result.fault_count, stdout);
    if (!have_seed) {
      printf(
          "replay: tools/sim.sh --seed %llu --trace; shrink: tools/sim.sh "
          "--seed %llu --shrink (with the same scenario flags)\n",
          (unsigned long long)seed, (unsigned long long)seed);
    } else if (!want_trace && !want_shrink) {
      // A failing seed prints its trace.
      pcp_sim_options_t replay = options;
      replay.trace = stdout;
      pcp_sim_result_t again;
      pcp_status_ignore(pcp_sim_run(&replay, &again));
    }
    if (want_shrink) {
      pcp_sim_result_t shrunk;
      bool shrunk_buggify = false;
      status = pcp_sim_shrink(&options, 200, &shrunk, &shrunk_buggify);
      if (status) {
        pcp_status_ignore(status);
        return 1;
      }
      printf("shrunk to %zu fault(s), buggify %d: %s\n", shrunk.fault_count,
             (int)shrunk_buggify, shrunk.failure);
      pcp_sim_faults_print(shrunk.faults, shrunk.fault_count, stdout);
      pcp_sim_options_t replay = options;
      replay.fault_schedule = shrunk.faults;
      replay.fault_schedule_count = shrunk.fault_count;
      replay.buggify = shrunk_buggify;
      replay.trace = stdout;
      pcp_sim_result_t again;
      pcp_status_ignore(pcp_sim_run(&replay, &again));
    }
  }
  if (!have_seed) {
    printf("%llu seeds from %llu: %llu failed, %llu events\n",
           (unsigned long long)seeds, (unsigned long long)first,
           (unsigned long long)failed, (unsigned long long)events);
  }
  return failed ? 1 : 0;
}
