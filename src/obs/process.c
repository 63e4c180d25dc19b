// SPDX-License-Identifier: Apache-2.0
// process_* metrics read from /proc at each render, and pcp_build_info.
//
// Names, types and units follow the Prometheus client libraries' process
// collector, so dashboards built for any exporter read ours unchanged.

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "obs/obs.h"
#include "obs/obs_impl.h"

static const char* const kBuildInfoLabels[] = {"version", "iree_compiler",
                                               "iree_runtime", "role", NULL};

enum {
  P_CPU = 0,
  P_RESIDENT,
  P_VIRTUAL,
  P_OPEN_FDS,
  P_MAX_FDS,
  P_START_TIME,
  P_BUILD_INFO,
  P_COUNT_,
};

static const pcp_obs_metric_def_t kProcessDefs[P_COUNT_] = {
    [P_CPU] = {.name = "process_cpu_seconds_total",
               .type = PCP_OBS_METRIC_TYPE_COUNTER,
               .help = "User and system CPU time spent by the process"},
    [P_RESIDENT] = {.name = "process_resident_memory_bytes",
                    .type = PCP_OBS_METRIC_TYPE_GAUGE,
                    .help = "Resident memory size of the process"},
    [P_VIRTUAL] = {.name = "process_virtual_memory_bytes",
                   .type = PCP_OBS_METRIC_TYPE_GAUGE,
                   .help = "Virtual memory size of the process"},
    [P_OPEN_FDS] = {.name = "process_open_fds",
                    .type = PCP_OBS_METRIC_TYPE_GAUGE,
                    .help = "Open file descriptors of the process"},
    [P_MAX_FDS] = {.name = "process_max_fds",
                   .type = PCP_OBS_METRIC_TYPE_GAUGE,
                   .help = "Limit on open file descriptors (RLIMIT_NOFILE)"},
    [P_START_TIME] = {.name = "process_start_time_seconds",
                      .type = PCP_OBS_METRIC_TYPE_GAUGE,
                      .help = "Start time of the process since the Unix "
                              "epoch"},
    [P_BUILD_INFO] = {.name = "pcp_build_info",
                      .type = PCP_OBS_METRIC_TYPE_GAUGE,
                      .help = "Always 1; the labels say which pcp and IREE "
                              "versions this process runs",
                      .label_names = kBuildInfoLabels,
                      .max_series = 4},
};

// One per registry that registered the families; lives as long as the
// process (registries are few: one per server).
typedef struct process_collector_t {
  pcp_obs_series_t* series[P_BUILD_INFO];
} process_collector_t;

// Reads up to |capacity| - 1 bytes of |path|; false when it cannot.
static bool read_small_file(const char* path, char* buffer, size_t capacity) {
  FILE* f = fopen(path, "r");
  if (!f) {
    return false;
  }
  size_t n = fread(buffer, 1, capacity - 1, f);
  fclose(f);
  buffer[n] = 0;
  return n > 0;
}

// Seconds since the epoch at which the machine booted (/proc/stat btime).
static double boot_time_seconds(void) {
  // Long lines (intr) come in pieces; no piece of them starts "btime ".
  char text[4096];
  FILE* f = fopen("/proc/stat", "r");
  if (!f) {
    return 0;
  }
  double boot = 0;
  while (fgets(text, sizeof(text), f)) {
    if (strncmp(text, "btime ", 6) == 0) {
      boot = strtod(text + 6, NULL);
      break;
    }
  }
  fclose(f);
  return boot;
}

static void process_collect(void* user_data, pcp_obs_registry_t* registry) {
  (void)registry;
  process_collector_t* c = user_data;
  char stat[2048];
  long ticks = sysconf(_SC_CLK_TCK);
  long page = sysconf(_SC_PAGESIZE);
  if (read_small_file("/proc/self/stat", stat, sizeof(stat)) && ticks > 0) {
    // Fields after the command name, which is in parentheses and may hold
    // spaces: the last ')' ends it. Field 3 (state) comes first.
    const char* p = strrchr(stat, ')');
    if (p) {
      p += 2;
      unsigned long long fields[24] = {0};
      // Fields 3..25 of proc(5): skip the state character, then numbers.
      const char* at = strchr(p, ' ');
      for (int i = 4; at && i <= 24; ++i) {
        char* end = NULL;
        fields[i - 1] = strtoull(at + 1, &end, 10);
        at = end && *end == ' ' ? end : NULL;
      }
      // utime 14, stime 15, starttime 22, vsize 23, rss 24 (1-based).
      double cpu = (double)(fields[13] + fields[14]) / (double)ticks;
      double delta = cpu - pcp_obs_series_value(c->series[P_CPU]);
      if (delta > 0) {
        pcp_obs_counter_add(c->series[P_CPU], delta);
      }
      pcp_obs_gauge_set(c->series[P_VIRTUAL], (double)fields[22]);
      pcp_obs_gauge_set(c->series[P_RESIDENT],
                        (double)fields[23] * (double)(page > 0 ? page : 4096));
      if (pcp_obs_series_value(c->series[P_START_TIME]) == 0) {
        pcp_obs_gauge_set(
            c->series[P_START_TIME],
            boot_time_seconds() + (double)fields[21] / (double)ticks);
      }
    }
  }
  DIR* dir = opendir("/proc/self/fd");
  if (dir) {
    double open_fds = 0;
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL) {
      if (entry->d_name[0] != '.') {
        open_fds += 1;
      }
    }
    closedir(dir);
    // The directory's own descriptor was open while it was listed.
    pcp_obs_gauge_set(c->series[P_OPEN_FDS], open_fds - 1);
  }
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    pcp_obs_gauge_set(c->series[P_MAX_FDS], limit.rlim_cur == RLIM_INFINITY
                                                ? 0
                                                : (double)limit.rlim_cur);
  }
}

static const char* or_unknown(const char* value) {
  return value && value[0] ? value : "unknown";
}

pcp_status_t pcp_obs_process_metrics_register(
    pcp_obs_registry_t* registry, const pcp_obs_build_info_t* info) {
  if (pcp_obs_registry_find(registry, kProcessDefs[P_CPU].name)) {
    return pcp_ok_status();
  }
  pcp_obs_family_t* families[P_COUNT_];
  pcp_status_t status =
      pcp_obs_registry_register(registry, kProcessDefs, P_COUNT_, families);
  if (pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
    // Another server sharing the registry registered them first.
    pcp_status_ignore(status);
    return pcp_ok_status();
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  const char* labels[] = {or_unknown(info ? info->version : NULL),
                          or_unknown(info ? info->iree_compiler : NULL),
                          or_unknown(info ? info->iree_runtime : NULL),
                          or_unknown(info ? info->role : NULL)};
  pcp_obs_family_set(families[P_BUILD_INFO], labels, 1);
  pcp_allocator_t allocator = pcp_obs_registry_allocator(registry);
  process_collector_t* c = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*c), (void**)&c));
  for (int i = 0; i < P_BUILD_INFO && !status; ++i) {
    status = pcp_obs_family_series_get(families[i], NULL, &c->series[i]);
  }
  if (!status) {
    // The registry frees |c| when it is released.
    status = pcp_obs_registry_collector_add_owned(registry, process_collect, c);
  }
  if (status) {
    pcp_allocator_free(allocator, c);
  }
  return status;
}
