// SPDX-License-Identifier: Apache-2.0
//
// obs: metrics and progress reporting.
//
// Metrics. A module declares its metrics once, in a static table of
// pcp_obs_metric_def_t (name, type, help, label names, histogram buckets),
// and registers the table with a pcp_obs_registry_t, getting one
// pcp_obs_family_t handle per entry. A family holds one series per distinct
// tuple of label values. Hot paths look a series up once
// (pcp_obs_family_series_get) and keep the handle; updates on a handle are
// lock-free atomics. The registry renders every family in the Prometheus
// text exposition format 0.0.4 (what `/metrics` serves, checked by
// `promtool check metrics`).
//
// Label values come from peers and users, so a family never grows without
// bound: past its series cap (default 1000) new label tuples go to a sink
// that is not rendered, and each update that lands there is counted in
// `pcp_obs_series_dropped_total{metric="<family>"}`, which every registry
// carries.
//
// Names are checked at registration: metric names match
// [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (not
// starting with "__"; "le" is reserved for histograms), counters end in
// "_total" and nothing else does (promtool's lint rules), help is not empty.
//
// Progress. pcp_progress_t reports long work (compiles, training, artifact
// downloads): on a terminal one redrawn line with percentage, rate and ETA;
// otherwise a key=value line at most every N seconds, so logs collected by
// a supervisor stay readable.
//
// Series whose label values name something that ends (a job, a worker)
// are removed with pcp_obs_family_series_remove when it ends, so /metrics
// does not keep them forever. Collectors (pcp_obs_registry_collector_add)
// run before each render to refresh values read from elsewhere (/proc, an
// engine's slots); pcp_obs_process_metrics_register adds the process_* and
// pcp_build_info families every server exposes.
//
// Ownership: definition tables are borrowed and must outlive the registry
// (they are static in practice). Families and series are owned by the
// registry and stay valid until pcp_obs_registry_release (a removed series
// too: it is no longer rendered, but a handle to it stays safe to update).
//
// Thread-safety: registration and rendering are thread-safe; series updates
// are thread-safe and lock-free; series lookup takes the family's mutex.
// pcp_progress_t is thread-compatible.

#ifndef PCP_OBS_OBS_H_
#define PCP_OBS_OBS_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Metric definitions
//===----------------------------------------------------------------------===//

#define PCP_OBS_MAX_LABELS 16
#define PCP_OBS_MAX_BUCKETS 64
#define PCP_OBS_DEFAULT_MAX_SERIES 1000
#define PCP_OBS_MAX_LABEL_VALUE_BYTES 1024

// The family that counts updates dropped by series caps.
#define PCP_OBS_DROPPED_METRIC_NAME "pcp_obs_series_dropped_total"

typedef enum pcp_obs_metric_type_e {
  PCP_OBS_METRIC_TYPE_COUNTER = 0,
  PCP_OBS_METRIC_TYPE_GAUGE = 1,
  PCP_OBS_METRIC_TYPE_HISTOGRAM = 2,
} pcp_obs_metric_type_t;

typedef struct pcp_obs_metric_def_t {
  const char* name;  // "pcp_gateway_api_requests_total"
  pcp_obs_metric_type_t type;
  const char* help;                // one line; escaped when rendered
  const char* const* label_names;  // NULL-terminated; NULL: no labels
  // HISTOGRAM: finite, strictly increasing upper bounds without +Inf
  // (added when rendering). NULL: the default seconds buckets
  // (5 ms ... 10 s).
  const double* buckets;
  size_t bucket_count;
  size_t max_series;  // 0: PCP_OBS_DEFAULT_MAX_SERIES
} pcp_obs_metric_def_t;

typedef struct pcp_obs_registry_t pcp_obs_registry_t;
typedef struct pcp_obs_family_t pcp_obs_family_t;
typedef struct pcp_obs_series_t pcp_obs_series_t;

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

// Creates an empty registry (it already holds the dropped-series counter).
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_registry_create(
    pcp_allocator_t allocator, pcp_obs_registry_t** out_registry);

// Frees the registry, its families and series. No update may run
// concurrently.
void pcp_obs_registry_release(pcp_obs_registry_t* registry);

// Registers |def_count| definitions and writes one family handle per
// definition to |out_families| (may be NULL). All or nothing: on error no
// family is added. INVALID_ARGUMENT names the metric and the rule broken;
// ALREADY_EXISTS when a name (or a histogram's _bucket/_sum/_count name) is
// taken.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_registry_register(
    pcp_obs_registry_t* registry, const pcp_obs_metric_def_t* defs,
    size_t def_count, pcp_obs_family_t** out_families);

// Returns the family named |name| or NULL. Borrowed.
pcp_obs_family_t* pcp_obs_registry_find(pcp_obs_registry_t* registry,
                                        const char* name);

// Appends every family in registration order, series in creation order, in
// the text exposition format 0.0.4. Families without series still get their
// HELP and TYPE lines. Fails only when |builder| reaches its cap
// (RESOURCE_EXHAUSTED); the builder then holds a partial text.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_registry_render(
    pcp_obs_registry_t* registry, pcp_string_builder_t* builder);

// Refreshes values before a render. Runs on the rendering thread, one
// collector at a time per registry; must not render the registry.
typedef void (*pcp_obs_collect_fn_t)(void* user_data,
                                     pcp_obs_registry_t* registry);

#define PCP_OBS_MAX_COLLECTORS 16

// Adds a collector run at the start of every pcp_obs_registry_render.
// RESOURCE_EXHAUSTED past PCP_OBS_MAX_COLLECTORS. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_registry_collector_add(
    pcp_obs_registry_t* registry, pcp_obs_collect_fn_t fn, void* user_data);

// Removes the collector added with the same (fn, user_data); waits for a
// run in progress, so |user_data| may be freed after. No-op when absent.
// Thread-safe.
void pcp_obs_registry_collector_remove(pcp_obs_registry_t* registry,
                                       pcp_obs_collect_fn_t fn,
                                       void* user_data);

// What pcp_build_info reports; every string borrowed for the call only.
// NULL or "": "unknown".
typedef struct pcp_obs_build_info_t {
  const char* version;        // pcp's version
  const char* iree_compiler;  // iree-base-compiler wheel version
  const char* iree_runtime;   // iree-base-runtime wheel version
  const char* role;           // "gateway", "node-manager", "hub", "worker"
} pcp_obs_build_info_t;

// Registers process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds (the Prometheus client conventions, read from
// /proc at each render) and pcp_build_info{version, iree_compiler,
// iree_runtime, role} 1. A registry that already has them is left as it is
// (servers sharing one registry may all call this). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_process_metrics_register(
    pcp_obs_registry_t* registry, const pcp_obs_build_info_t* info);

// Content-Type of the rendered text.
#define PCP_OBS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

//===----------------------------------------------------------------------===//
// Families and series
//===----------------------------------------------------------------------===//

// Returns the series for |label_values| (one string per label name, in
// order; NULL when the family has no labels), creating it on first use.
// When the family is at its series cap the returned handle is the family's
// sink: updates on it are counted as dropped. INVALID_ARGUMENT when a value
// is NULL or longer than PCP_OBS_MAX_LABEL_VALUE_BYTES. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_family_series_get(
    pcp_obs_family_t* family, const char* const* label_values,
    pcp_obs_series_t** out_series);

// Removes the series for |label_values| from the rendered output (a job or
// worker that ended). Handles to it stay valid (updates on them are kept
// but never rendered); a later series_get with the same values starts a
// new series at zero. Returns false when there was no such series.
// Thread-safe, also against a concurrent render.
bool pcp_obs_family_series_remove(pcp_obs_family_t* family,
                                  const char* const* label_values);

// Number of series created (the sink not counted). Thread-safe.
size_t pcp_obs_family_series_count(pcp_obs_family_t* family);

// Updates counted as dropped for |family| so far. Thread-safe.
uint64_t pcp_obs_family_dropped_count(pcp_obs_family_t* family);

pcp_obs_metric_type_t pcp_obs_family_type(const pcp_obs_family_t* family);

// Counter updates. Negative or NaN deltas are ignored (a counter only
// goes up). Lock-free.
void pcp_obs_counter_add(pcp_obs_series_t* series, double delta);
void pcp_obs_counter_increment(pcp_obs_series_t* series);

// Gauge updates. Lock-free.
void pcp_obs_gauge_set(pcp_obs_series_t* series, double value);
void pcp_obs_gauge_add(pcp_obs_series_t* series, double delta);

// Histogram observation: one bucket count, the sum and the count. NaN is
// ignored. Lock-free.
void pcp_obs_histogram_observe(pcp_obs_series_t* series, double value);

// Current value of a counter or gauge series (tests, /readyz logic).
double pcp_obs_series_value(const pcp_obs_series_t* series);

// Convenience for cold paths: lookup and update in one call. A bad label
// value is counted as a dropped update rather than reported.
void pcp_obs_family_add(pcp_obs_family_t* family,
                        const char* const* label_values, double delta);
void pcp_obs_family_set(pcp_obs_family_t* family,
                        const char* const* label_values, double value);
void pcp_obs_family_observe(pcp_obs_family_t* family,
                            const char* const* label_values, double value);

//===----------------------------------------------------------------------===//
// Progress
//===----------------------------------------------------------------------===//

typedef enum pcp_progress_mode_e {
  PCP_PROGRESS_MODE_AUTO = 0,  // TTY when |out| is a terminal, else LOG
  PCP_PROGRESS_MODE_TTY = 1,   // one line redrawn with '\r'
  PCP_PROGRESS_MODE_LOG = 2,   // key=value lines, rate-limited
} pcp_progress_mode_t;

typedef struct pcp_progress_options_t {
  const char* task;   // "compile", "train", "download"; borrowed
  const char* units;  // "steps", "bytes", "files"; borrowed
  int64_t total;      // 0 or less: unknown (no percentage, no ETA)
  pcp_clock_t clock;  // injected; {0}: the system clock
  FILE* out;          // NULL: stderr
  pcp_progress_mode_t mode;
  int64_t log_interval_ms;  // LOG mode: at most one line per interval
                            // (0: 10 s)
  const pcp_log_context_t* log_context;  // role/node/job fields; borrowed
} pcp_progress_options_t;

typedef struct pcp_progress_t {
  pcp_progress_options_t options;
  bool is_tty;
  bool finished;
  int64_t done;
  int64_t start_ns;
  int64_t last_report_ns;   // -1: nothing reported yet
  size_t last_line_length;  // TTY: characters to blank on redraw
} pcp_progress_t;

// Starts reporting. Nothing is printed until the first update.
void pcp_progress_initialize(const pcp_progress_options_t* options,
                             pcp_progress_t* out_progress);

// Sets the amount done (absolute) or adds to it, and reports when due (TTY:
// at most every 100 ms; LOG: every |log_interval_ms|).
void pcp_progress_update(pcp_progress_t* progress, int64_t done);
void pcp_progress_advance(pcp_progress_t* progress, int64_t delta);

// Reports the final state once (TTY: ends the line) with the elapsed time.
void pcp_progress_finish(pcp_progress_t* progress);

// Formats the current state ("compile 45.0% 450/1000 steps 12.5 steps/s
// ETA 44s") into |buffer|. Used by both modes; exposed for tests.
void pcp_progress_format(const pcp_progress_t* progress, char* buffer,
                         size_t capacity);

#ifdef __cplusplus
}
#endif

#endif  // PCP_OBS_OBS_H_
