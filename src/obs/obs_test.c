// SPDX-License-Identifier: Apache-2.0
#include "obs/obs.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static void assert_status(pcp_status_t status, pcp_status_code_t code,
                          const char* substring) {
  assert_non_null(status);
  assert_int_equal(pcp_status_code(status), code);
  if (!strstr(pcp_status_message(status), substring)) {
    fail_msg("message '%s' lacks '%s'", pcp_status_message(status), substring);
  }
  pcp_status_ignore(status);
}

static char* render(pcp_obs_registry_t* registry) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  PCP_CHECK_OK(pcp_obs_registry_render(registry, &builder));
  char* text = NULL;
  PCP_CHECK_OK(pcp_string_builder_take(&builder, &text));
  pcp_string_builder_deinitialize(&builder);
  return text;
}

static void assert_contains(const char* text, const char* needle) {
  if (!strstr(text, needle)) {
    fail_msg("'%s' not in:\n%s", needle, text);
  }
}

//===----------------------------------------------------------------------===//
// A module-style table with every type
//===----------------------------------------------------------------------===//

static const char* const kRequestLabels[] = {"method", "code", NULL};
static const char* const kPathLabels[] = {"path", NULL};
static const double kLatencyBuckets[] = {0.1, 0.5, 1};

enum {
  kRequests = 0,
  kInflight,
  kLatency,
  kPathHits,
  kDefaultHistogram,
  kMetricCount,
};

static const pcp_obs_metric_def_t kDefs[kMetricCount] = {
    [kRequests] = {.name = "pcp_test_requests_total",
                   .type = PCP_OBS_METRIC_TYPE_COUNTER,
                   .help = "Requests handled.",
                   .label_names = kRequestLabels},
    [kInflight] = {.name = "pcp_test_inflight",
                   .type = PCP_OBS_METRIC_TYPE_GAUGE,
                   .help = "Requests in flight\nnow, with a \\ in help."},
    [kLatency] = {.name = "pcp_test_latency_seconds",
                  .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
                  .help = "Request latency.",
                  .label_names = kPathLabels,
                  .buckets = kLatencyBuckets,
                  .bucket_count = 3},
    [kPathHits] = {.name = "pcp_test_path_hits_total",
                   .type = PCP_OBS_METRIC_TYPE_COUNTER,
                   .help = "Hits per path, capped.",
                   .label_names = kPathLabels,
                   .max_series = 2},
    [kDefaultHistogram] = {.name = "pcp_test_step_seconds",
                           .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
                           .help = "Step time."},
};

typedef struct fixture_t {
  pcp_obs_registry_t* registry;
  pcp_obs_family_t* families[kMetricCount];
} fixture_t;

static int setup(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  PCP_CHECK_OK(pcp_obs_registry_create(pcp_allocator_system(), &f->registry));
  PCP_CHECK_OK(
      pcp_obs_registry_register(f->registry, kDefs, kMetricCount, f->families));
  *state = f;
  return 0;
}

static int teardown(void** state) {
  fixture_t* f = *state;
  pcp_obs_registry_release(f->registry);
  free(f);
  return 0;
}

//===----------------------------------------------------------------------===//
// Registration
//===----------------------------------------------------------------------===//

static void registration_validates_names(void** state) {
  fixture_t* f = *state;
  pcp_obs_metric_def_t def = {
      .name = "9bad_total", .type = PCP_OBS_METRIC_TYPE_COUNTER, .help = "h"};
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "does not match");
  def.name = "has-dash_total";
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "does not match");
  def.name = "ns:ok_total";
  assert_null(pcp_obs_registry_register(f->registry, &def, 1, NULL));
  def.name = "no_suffix";
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "counter names end in _total");
  def.type = PCP_OBS_METRIC_TYPE_GAUGE;
  def.name = "gauge_total";
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "only counters end in _total");
  def.name = "gauge_ok";
  def.help = "";
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "help text is empty");
  def.help = "h";
  static const char* const kBadLabel[] = {"__reserved", NULL};
  def.label_names = kBadLabel;
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "label name '__reserved'");
  static const char* const kDupLabel[] = {"a", "a", NULL};
  def.label_names = kDupLabel;
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "appears twice");
  static const char* const kLe[] = {"le", NULL};
  def.label_names = kLe;
  def.type = PCP_OBS_METRIC_TYPE_HISTOGRAM;
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "'le' is reserved");
  def.label_names = NULL;
  static const double kUnsorted[] = {1, 0.5};
  def.buckets = kUnsorted;
  def.bucket_count = 2;
  assert_status(pcp_obs_registry_register(f->registry, &def, 1, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "strictly increasing");
  // Names already taken, directly or by a histogram's sample names.
  pcp_obs_metric_def_t dup = kDefs[kInflight];
  assert_status(pcp_obs_registry_register(f->registry, &dup, 1, NULL),
                PCP_STATUS_ALREADY_EXISTS, "already registered");
  dup.name = "pcp_test_latency_seconds_count";
  assert_status(pcp_obs_registry_register(f->registry, &dup, 1, NULL),
                PCP_STATUS_ALREADY_EXISTS, "already registered");
  pcp_obs_metric_def_t twice[2] = {
      {.name = "x_g", .type = PCP_OBS_METRIC_TYPE_GAUGE, .help = "h"},
      {.name = "x_g", .type = PCP_OBS_METRIC_TYPE_GAUGE, .help = "h"},
  };
  assert_status(pcp_obs_registry_register(f->registry, twice, 2, NULL),
                PCP_STATUS_ALREADY_EXISTS, "declared twice");
  // All or nothing: a batch with one bad entry adds nothing.
  twice[1].name = "x_total";
  assert_status(pcp_obs_registry_register(f->registry, twice, 2, NULL),
                PCP_STATUS_INVALID_ARGUMENT, "only counters");
  assert_null(pcp_obs_registry_find(f->registry, "x_g"));
  assert_non_null(pcp_obs_registry_find(f->registry, "pcp_test_inflight"));
}

//===----------------------------------------------------------------------===//
// Updates and rendering
//===----------------------------------------------------------------------===//

static void counters_and_gauges(void** state) {
  fixture_t* f = *state;
  const char* get_200[] = {"GET", "200"};
  pcp_obs_series_t* series = NULL;
  assert_null(
      pcp_obs_family_series_get(f->families[kRequests], get_200, &series));
  pcp_obs_counter_increment(series);
  pcp_obs_counter_add(series, 2.5);
  pcp_obs_counter_add(series, -1);  // ignored
  assert_true(pcp_obs_series_value(series) == 3.5);
  pcp_obs_series_t* again = NULL;
  assert_null(
      pcp_obs_family_series_get(f->families[kRequests], get_200, &again));
  assert_ptr_equal(series, again);
  pcp_obs_family_add(f->families[kRequests], (const char*[]){"POST", "500"}, 1);
  assert_int_equal(pcp_obs_family_series_count(f->families[kRequests]), 2);

  pcp_obs_series_t* gauge = NULL;
  assert_null(pcp_obs_family_series_get(f->families[kInflight], NULL, &gauge));
  pcp_obs_gauge_set(gauge, 4);
  pcp_obs_gauge_add(gauge, -1.5);
  assert_true(pcp_obs_series_value(gauge) == 2.5);

  char* text = render(f->registry);
  assert_contains(text,
                  "# HELP pcp_test_requests_total Requests handled.\n"
                  "# TYPE pcp_test_requests_total counter\n"
                  "pcp_test_requests_total{method=\"GET\",code=\"200\"} 3.5\n"
                  "pcp_test_requests_total{method=\"POST\",code=\"500\"} 1\n");
  assert_contains(text,
                  "# HELP pcp_test_inflight Requests in flight\\nnow, with a "
                  "\\\\ in help.\n# TYPE pcp_test_inflight gauge\n"
                  "pcp_test_inflight 2.5\n");
  free(text);
}

static void label_values_are_escaped_and_checked(void** state) {
  fixture_t* f = *state;
  pcp_obs_family_add(f->families[kRequests], (const char*[]){"a\"b\\c\nd", ""},
                     1);
  char* text = render(f->registry);
  assert_contains(text,
                  "pcp_test_requests_total{method=\"a\\\"b\\\\c\\nd\","
                  "code=\"\"} 1\n");
  free(text);
  pcp_obs_series_t* series = NULL;
  assert_status(pcp_obs_family_series_get(f->families[kRequests],
                                          (const char*[]){"x", NULL}, &series),
                PCP_STATUS_INVALID_ARGUMENT, "label 'code' is missing");
  assert_status(
      pcp_obs_family_series_get(f->families[kRequests], NULL, &series),
      PCP_STATUS_INVALID_ARGUMENT, "2 label values needed");
  char* long_value = malloc(PCP_OBS_MAX_LABEL_VALUE_BYTES + 2);
  memset(long_value, 'v', PCP_OBS_MAX_LABEL_VALUE_BYTES + 1);
  long_value[PCP_OBS_MAX_LABEL_VALUE_BYTES + 1] = 0;
  assert_status(
      pcp_obs_family_series_get(f->families[kRequests],
                                (const char*[]){long_value, "1"}, &series),
      PCP_STATUS_INVALID_ARGUMENT, "longer than 1024 bytes");
  free(long_value);
}

static void invalid_utf8_label_values_are_repaired(void** state) {
  fixture_t* f = *state;
  pcp_obs_series_t* a = NULL;
  pcp_obs_series_t* b = NULL;
  // A stray byte, a truncated sequence, an overlong '/', a surrogate.
  const char* bad[] = {"x\xffy", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80"};
  const char* expected[] = {"x\xEF\xBF\xBDy", "\xEF\xBF\xBD\xEF\xBF\xBD",
                            "\xEF\xBF\xBD\xEF\xBF\xBD",
                            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    assert_null(pcp_obs_family_series_get(f->families[kPathHits],
                                          (const char*[]){bad[i]}, &a));
    assert_null(pcp_obs_family_series_get(f->families[kLatency],
                                          (const char*[]){bad[i]}, &b));
    pcp_obs_series_t* again = NULL;
    assert_null(pcp_obs_family_series_get(f->families[kLatency],
                                          (const char*[]){bad[i]}, &again));
    assert_ptr_equal(b, again);  // same bad input, same series
    pcp_obs_histogram_observe(b, 1);
    char* text = render(f->registry);
    char needle[64];
    snprintf(needle, sizeof(needle), "{path=\"%s\"}", expected[i]);
    assert_contains(text, needle);
    free(text);
  }
  // Valid multi-byte text is kept as is.
  assert_null(pcp_obs_family_series_get(
      f->families[kLatency], (const char*[]){"caf\xc3\xa9 \xf0\x9f\x9a\x80"},
      &b));
  pcp_obs_histogram_observe(b, 1);
  char* text = render(f->registry);
  assert_contains(text, "{path=\"caf\xc3\xa9 \xf0\x9f\x9a\x80\"}");
  free(text);
}

static void histograms_are_cumulative(void** state) {
  fixture_t* f = *state;
  pcp_obs_series_t* series = NULL;
  assert_null(pcp_obs_family_series_get(f->families[kLatency],
                                        (const char*[]){"/v1/jobs"}, &series));
  pcp_obs_histogram_observe(series, 0.05);
  pcp_obs_histogram_observe(series, 0.1);  // le is inclusive
  pcp_obs_histogram_observe(series, 0.7);
  pcp_obs_histogram_observe(series, 3);
  pcp_obs_histogram_observe(series, 0.0 / 0.0);  // NaN ignored
  pcp_obs_family_observe(f->families[kDefaultHistogram], NULL, 0.02);
  char* text = render(f->registry);
  assert_contains(
      text,
      "# TYPE pcp_test_latency_seconds histogram\n"
      "pcp_test_latency_seconds_bucket{path=\"/v1/jobs\",le=\"0.1\"} 2\n"
      "pcp_test_latency_seconds_bucket{path=\"/v1/jobs\",le=\"0.5\"} 2\n"
      "pcp_test_latency_seconds_bucket{path=\"/v1/jobs\",le=\"1\"} 3\n"
      "pcp_test_latency_seconds_bucket{path=\"/v1/jobs\",le=\"+Inf\"} 4\n"
      "pcp_test_latency_seconds_sum{path=\"/v1/jobs\"} 3.85\n"
      "pcp_test_latency_seconds_count{path=\"/v1/jobs\"} 4\n");
  assert_contains(text, "pcp_test_step_seconds_bucket{le=\"0.005\"} 0\n");
  assert_contains(text, "pcp_test_step_seconds_bucket{le=\"0.025\"} 1\n");
  assert_contains(text, "pcp_test_step_seconds_bucket{le=\"10\"} 1\n");
  assert_contains(text, "pcp_test_step_seconds_count 1\n");
  free(text);
}

static void series_cap_counts_drops(void** state) {
  fixture_t* f = *state;
  pcp_obs_family_t* hits = f->families[kPathHits];
  pcp_obs_family_add(hits, (const char*[]){"/a"}, 1);
  pcp_obs_family_add(hits, (const char*[]){"/b"}, 1);
  pcp_obs_family_add(hits, (const char*[]){"/c"}, 1);
  pcp_obs_family_add(hits, (const char*[]){"/d"}, 1);
  pcp_obs_family_add(hits, (const char*[]){"/a"}, 1);  // existing: kept
  assert_int_equal(pcp_obs_family_series_count(hits), 2);
  assert_int_equal(pcp_obs_family_dropped_count(hits), 2);
  // A handle to the sink keeps counting drops per update.
  pcp_obs_series_t* sink = NULL;
  assert_null(pcp_obs_family_series_get(hits, (const char*[]){"/e"}, &sink));
  pcp_obs_counter_increment(sink);
  assert_int_equal(pcp_obs_family_dropped_count(hits), 3);
  char* text = render(f->registry);
  assert_contains(text, "pcp_test_path_hits_total{path=\"/a\"} 2\n");
  assert_null(strstr(text, "/c"));
  assert_contains(text,
                  "# TYPE pcp_obs_series_dropped_total counter\n"
                  "pcp_obs_series_dropped_total{metric=\"pcp_test_path_hits_"
                  "total\"} 3\n");
  free(text);
}

static void render_respects_builder_cap(void** state) {
  fixture_t* f = *state;
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 64, &builder);
  assert_status(pcp_obs_registry_render(f->registry, &builder),
                PCP_STATUS_RESOURCE_EXHAUSTED, "");
  pcp_string_builder_deinitialize(&builder);
}

typedef struct worker_args_t {
  pcp_obs_family_t* counter;
  pcp_obs_family_t* histogram;
} worker_args_t;

static void* update_thread(void* arg) {
  worker_args_t* args = arg;
  pcp_obs_series_t* series = NULL;
  PCP_CHECK_OK(pcp_obs_family_series_get(
      args->counter, (const char*[]){"GET", "200"}, &series));
  for (int i = 0; i < 10000; ++i) {
    pcp_obs_counter_increment(series);
    pcp_obs_family_observe(args->histogram, (const char*[]){"/t"}, 0.25);
  }
  return NULL;
}

static void concurrent_updates_are_not_lost(void** state) {
  fixture_t* f = *state;
  worker_args_t args = {f->families[kRequests], f->families[kLatency]};
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) {
    assert_int_equal(pthread_create(&threads[i], NULL, update_thread, &args),
                     0);
  }
  // Render while the threads run: must not crash or tear.
  for (int i = 0; i < 5; ++i) {
    free(render(f->registry));
  }
  for (int i = 0; i < 4; ++i) {
    pthread_join(threads[i], NULL);
  }
  char* text = render(f->registry);
  assert_contains(text,
                  "pcp_test_requests_total{method=\"GET\",code=\"200\"} "
                  "40000\n");
  assert_contains(text, "pcp_test_latency_seconds_sum{path=\"/t\"} 10000\n");
  assert_contains(text, "pcp_test_latency_seconds_count{path=\"/t\"} 40000\n");
  free(text);
}

static void removed_series_leave_the_rendering(void** state) {
  fixture_t* f = *state;
  pcp_obs_series_t* job_a = NULL;
  pcp_obs_series_t* job_b = NULL;
  assert_null(pcp_obs_family_series_get(f->families[kPathHits],
                                        (const char*[]){"job-a"}, &job_a));
  assert_null(pcp_obs_family_series_get(f->families[kPathHits],
                                        (const char*[]){"job-b"}, &job_b));
  pcp_obs_counter_add(job_a, 5);
  pcp_obs_counter_add(job_b, 7);
  assert_true(pcp_obs_family_series_remove(f->families[kPathHits],
                                           (const char*[]){"job-a"}));
  assert_false(pcp_obs_family_series_remove(f->families[kPathHits],
                                            (const char*[]){"job-a"}));
  assert_int_equal(pcp_obs_family_series_count(f->families[kPathHits]), 1);
  // A stale handle stays safe to update; nothing of it is rendered.
  pcp_obs_counter_add(job_a, 1);
  char* text = render(f->registry);
  if (strstr(text, "job-a")) {
    fail_msg("removed series still rendered:\n%s", text);
  }
  assert_contains(text, "pcp_test_path_hits_total{path=\"job-b\"} 7\n");
  free(text);
  // The same labels again start a new series at zero.
  pcp_obs_series_t* again = NULL;
  assert_null(pcp_obs_family_series_get(f->families[kPathHits],
                                        (const char*[]){"job-a"}, &again));
  assert_ptr_not_equal(again, job_a);
  assert_true(pcp_obs_series_value(again) == 0);
  // Removing the last and only series empties the list cleanly.
  assert_true(pcp_obs_family_series_remove(f->families[kPathHits],
                                           (const char*[]){"job-b"}));
  assert_true(pcp_obs_family_series_remove(f->families[kPathHits],
                                           (const char*[]){"job-a"}));
  pcp_obs_family_add(f->families[kPathHits], (const char*[]){"job-c"}, 2);
  text = render(f->registry);
  assert_contains(text, "pcp_test_path_hits_total{path=\"job-c\"} 2\n");
  if (strstr(text, "job-a") || strstr(text, "job-b")) {
    fail_msg("removed series still rendered:\n%s", text);
  }
  free(text);
}

typedef struct churn_t {
  pcp_obs_family_t* family;
  _Atomic bool stop;
} churn_t;

static void* churn_main(void* opaque) {
  churn_t* c = opaque;
  for (int i = 0; !atomic_load(&c->stop) && i < 20000; ++i) {
    char job[16];
    snprintf(job, sizeof(job), "job-%d", i % 7);
    pcp_obs_family_add(c->family, (const char*[]){job}, 1);
    pcp_obs_family_series_remove(c->family, (const char*[]){job});
  }
  return NULL;
}

// Scrapes while series come and go (run under ASan in make test-asan).
static void remove_is_safe_against_concurrent_renders(void** state) {
  fixture_t* f = *state;
  churn_t churn = {.family = f->families[kPathHits]};
  atomic_init(&churn.stop, false);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, churn_main, &churn), 0);
  for (int i = 0; i < 200; ++i) {
    free(render(f->registry));
  }
  atomic_store(&churn.stop, true);
  pthread_join(thread, NULL);
}

static int collector_runs = 0;
static void count_collect(void* user_data, pcp_obs_registry_t* registry) {
  (void)registry;
  pcp_obs_family_set(user_data, NULL, ++collector_runs);
}

static void collectors_run_before_each_render(void** state) {
  fixture_t* f = *state;
  collector_runs = 0;
  assert_null(pcp_obs_registry_collector_add(f->registry, count_collect,
                                             f->families[kInflight]));
  char* text = render(f->registry);
  assert_contains(text, "pcp_test_inflight 1\n");
  free(text);
  text = render(f->registry);
  assert_contains(text, "pcp_test_inflight 2\n");
  free(text);
  pcp_obs_registry_collector_remove(f->registry, count_collect,
                                    f->families[kInflight]);
  text = render(f->registry);
  assert_contains(text, "pcp_test_inflight 2\n");
  free(text);
  for (int i = 0; i < PCP_OBS_MAX_COLLECTORS; ++i) {
    assert_null(pcp_obs_registry_collector_add(f->registry, count_collect,
                                               f->families[kInflight]));
  }
  assert_status(pcp_obs_registry_collector_add(f->registry, count_collect,
                                               f->families[kInflight]),
                PCP_STATUS_RESOURCE_EXHAUSTED, "collectors");
}

// Value of the unlabelled sample |name| in |text|; fails when absent.
static double sample_value(const char* text, const char* name) {
  char needle[128];
  snprintf(needle, sizeof(needle), "\n%s ", name);
  const char* at = strstr(text, needle);
  if (!at) {
    fail_msg("no sample %s in:\n%s", name, text);
  }
  return strtod(at + strlen(needle), NULL);
}

static void process_metrics_read_proc(void** state) {
  fixture_t* f = *state;
  pcp_obs_build_info_t info = {.version = "1.2.3",
                               .iree_compiler = "3.1.0",
                               .iree_runtime = NULL,
                               .role = "gateway"};
  assert_null(pcp_obs_process_metrics_register(f->registry, &info));
  // A second server sharing the registry: a no-op, not an error.
  assert_null(pcp_obs_process_metrics_register(f->registry, &info));
  // Burn some CPU so the counter is above zero.
  volatile double x = 0;
  for (int i = 0; i < 20000000; ++i) {
    x += i * 0.5;
  }
  int extra = dup(1);
  char* text = render(f->registry);
  assert_contains(text, "# TYPE process_cpu_seconds_total counter\n");
  assert_contains(text,
                  "pcp_build_info{version=\"1.2.3\",iree_compiler=\"3.1.0\","
                  "iree_runtime=\"unknown\",role=\"gateway\"} 1\n");
  assert_true(sample_value(text, "process_cpu_seconds_total") > 0);
  assert_true(sample_value(text, "process_resident_memory_bytes") > 1e5);
  assert_true(sample_value(text, "process_virtual_memory_bytes") >=
              sample_value(text, "process_resident_memory_bytes"));
  double open_fds = sample_value(text, "process_open_fds");
  assert_true(open_fds >= 4);  // stdin, stdout, stderr and |extra|
  assert_true(sample_value(text, "process_max_fds") >= open_fds);
  double start = sample_value(text, "process_start_time_seconds");
  double now = (double)time(NULL);
  if (!(start > now - 3600 && start <= now + 1)) {
    fail_msg("process_start_time_seconds %f not within the last hour of %f",
             start, now);
  }
  free(text);
  close(extra);
  text = render(f->registry);
  assert_true(sample_value(text, "process_open_fds") == open_fds - 1);
  free(text);
}

static void promtool_accepts_rendering(void** state) {
  fixture_t* f = *state;
  pcp_obs_build_info_t info = {.version = "0.1.0", .role = "test"};
  assert_null(pcp_obs_process_metrics_register(f->registry, &info));
  pcp_obs_family_add(f->families[kRequests],
                     (const char*[]){"GET", "a\"b\\c\nd"}, 3);
  pcp_obs_family_add(f->families[kRequests],
                     (const char*[]){"GET", "bad\xff\xfeutf8"}, 1);
  pcp_obs_family_set(f->families[kInflight], NULL, -2.75);
  pcp_obs_family_observe(f->families[kLatency], (const char*[]){"/x"}, 0.3);
  pcp_obs_family_observe(f->families[kDefaultHistogram], NULL, 12);
  for (int i = 0; i < 4; ++i) {
    char path[8];
    snprintf(path, sizeof(path), "/%d", i);
    pcp_obs_family_add(f->families[kPathHits], (const char*[]){path}, 1);
  }
  char* text = render(f->registry);
  char path[] = "/tmp/pcp_obs_metrics_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  // promtool comes with the set-up (package prometheus); missing is a
  // failure, never a skip.
  int found = system("command -v promtool >/dev/null 2>&1");
  if (found != 0) {
    unlink(path);
    fail_msg(
        "promtool not found: run tools/setup/setup.sh "
        "(apt package 'prometheus')");
  }
  char command[256];
  snprintf(command, sizeof(command), "promtool check metrics < %s", path);
  int rc = system(command);
  unlink(path);
  if (rc != 0) {
    fail_msg("promtool check metrics failed on:\n%s", text);
  }
  free(text);
}

// Creates, registers, updates and renders through |allocator|.
static pcp_status_t exercise_registry(pcp_allocator_t allocator) {
  pcp_obs_registry_t* registry = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_create(allocator, &registry));
  pcp_obs_family_t* families[kMetricCount];
  pcp_status_t status =
      pcp_obs_registry_register(registry, kDefs, kMetricCount, families);
  pcp_obs_series_t* series = NULL;
  if (!status) {
    status = pcp_obs_family_series_get(families[kRequests],
                                       (const char*[]){"GET", "200"}, &series);
  }
  if (!status) {
    pcp_obs_counter_increment(series);
    status = pcp_obs_family_series_get(families[kLatency],
                                       (const char*[]){"/p"}, &series);
  }
  if (!status) {
    pcp_obs_histogram_observe(series, 0.3);
    // Cold-path helpers swallow allocation failures as drops.
    pcp_obs_family_add(families[kPathHits], (const char*[]){"/x"}, 1);
    pcp_string_builder_t builder;
    pcp_string_builder_initialize(allocator, 0, &builder);
    status = pcp_obs_registry_render(registry, &builder);
    pcp_string_builder_deinitialize(&builder);
  }
  pcp_obs_registry_release(registry);
  return status;
}

// SQLite-style sweep: fail the Nth allocation for every N until the whole
// sequence succeeds; every failure must be a clean RESOURCE_EXHAUSTED and
// leave no memory behind.
static void registry_survives_every_allocation_failure(void** state) {
  (void)state;
  int64_t index = 0;
  for (;; ++index) {
    assert_true(index < 10000);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), index, true,
                                     &failing);
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counting);
    pcp_status_t status = exercise_registry(pcp_allocator_counting(&counting));
    assert_int_equal(counting.live_bytes, 0);
    if (!status) {
      assert_int_equal(failing.failure_count, 0);
      break;
    }
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  assert_true(index > 10);  // the sweep really covered the allocations
}

//===----------------------------------------------------------------------===//
// Progress
//===----------------------------------------------------------------------===//

static char* run_progress(pcp_progress_mode_t mode, int64_t total) {
  char* text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_clock_manual_t manual = {.now_ns = 0, .wall_ns = 1764666000000000000LL};
  pcp_log_context_t context = {.role = "gateway", .job_id = "j-1"};
  pcp_progress_options_t options = {
      .task = "compile",
      .units = "steps",
      .total = total,
      .clock = pcp_clock_manual(&manual),
      .out = out,
      .mode = mode,
      .log_interval_ms = 5000,
      .log_context = &context,
  };
  pcp_progress_t progress;
  pcp_progress_initialize(&options, &progress);
  for (int i = 1; i <= 20; ++i) {
    pcp_clock_manual_advance(&manual, 1000000000LL);  // 1 s per step
    pcp_progress_advance(&progress, 5);
  }
  pcp_progress_finish(&progress);
  pcp_progress_finish(&progress);  // idempotent
  fclose(out);
  return text;
}

static size_t count_of(const char* text, const char* needle) {
  size_t n = 0;
  for (const char* p = text; (p = strstr(p, needle)); p += strlen(needle)) {
    ++n;
  }
  return n;
}

static void progress_log_mode_is_rate_limited(void** state) {
  (void)state;
  char* text = run_progress(PCP_PROGRESS_MODE_LOG, 100);
  // 20 s of work, one line per 5 s (first update at 1 s: 1, 6, 11, 16),
  // plus the final line.
  assert_int_equal(count_of(text, "msg=progress"), 4);
  assert_int_equal(count_of(text, "msg=done"), 1);
  assert_int_equal(count_of(text, "\n"), 5);
  assert_contains(text,
                  "level=info role=gateway job=j-1 msg=progress "
                  "task=compile done=5 total=100 pct=5.0 units=steps "
                  "rate=5 eta_s=19\n");
  assert_contains(text,
                  "msg=done task=compile done=100 total=100 pct=100.0 "
                  "units=steps rate=5 elapsed_s=20.000\n");
  assert_contains(text, "ts=2025-12-02T");
  free(text);
}

static void progress_tty_mode_redraws_one_line(void** state) {
  (void)state;
  char* text = run_progress(PCP_PROGRESS_MODE_TTY, 100);
  assert_int_equal(count_of(text, "\n"), 1);
  assert_int_equal(count_of(text, "\r"), 21);
  assert_contains(text, "\rcompile 50.0% 50/100 steps 5.0 steps/s ETA 10s");
  assert_contains(text,
                  "\rcompile 100.0% 100/100 steps 5.0 steps/s done in "
                  "20s");
  free(text);
  // Unknown total: no percentage, no ETA.
  text = run_progress(PCP_PROGRESS_MODE_TTY, 0);
  assert_contains(text, "\rcompile 50 steps 5.0 steps/s");
  assert_null(strstr(text, "ETA"));
  assert_null(strstr(text, "%"));
  free(text);
}

static void progress_format_durations(void** state) {
  (void)state;
  pcp_clock_manual_t manual = {0};
  pcp_progress_options_t options = {.task = "download",
                                    .units = "bytes",
                                    .total = 10000,
                                    .clock = pcp_clock_manual(&manual),
                                    .mode = PCP_PROGRESS_MODE_LOG};
  pcp_progress_t progress;
  pcp_progress_initialize(&options, &progress);
  progress.done = 1;
  pcp_clock_manual_advance(&manual, 1000000000LL);
  char line[256];
  pcp_progress_format(&progress, line, sizeof(line));
  assert_string_equal(line,
                      "download 0.0% 1/10000 bytes 1.0 bytes/s ETA 2h46m");
  progress.done = 50;
  pcp_progress_format(&progress, line, sizeof(line));
  assert_string_equal(line,
                      "download 0.5% 50/10000 bytes 50.0 bytes/s ETA 3m19s");
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(registration_validates_names),
      T(counters_and_gauges),
      T(label_values_are_escaped_and_checked),
      T(invalid_utf8_label_values_are_repaired),
      T(histograms_are_cumulative),
      T(series_cap_counts_drops),
      T(render_respects_builder_cap),
      T(concurrent_updates_are_not_lost),
      T(removed_series_leave_the_rendering),
      T(remove_is_safe_against_concurrent_renders),
      T(collectors_run_before_each_render),
      T(process_metrics_read_proc),
      T(promtool_accepts_rendering),
      cmocka_unit_test(registry_survives_every_allocation_failure),
      cmocka_unit_test(progress_log_mode_is_rate_limited),
      cmocka_unit_test(progress_tty_mode_redraws_one_line),
      cmocka_unit_test(progress_format_durations),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
