// SPDX-License-Identifier: Apache-2.0
// Metrics registry and Prometheus text exposition (format 0.0.4).
//
// Values are doubles stored as bit patterns in 64-bit atomics, updated with
// compare-and-swap, so updates never take a lock; only creating a series
// (rare: first use of a label tuple) takes the family mutex. A mutex per
// series was rejected: /metrics renders hundreds of series while workers
// update them from the loop and compute threads.

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs.h"
#include "obs/obs_impl.h"

struct pcp_obs_series_t {
  pcp_obs_family_t* family;
  pcp_obs_series_t* next;
  bool is_sink;
  uint64_t hash;
  char** label_values;              // label_count owned strings
  _Atomic uint64_t value_bits;      // counter / gauge
  _Atomic uint64_t sum_bits;        // histogram
  _Atomic uint64_t* bucket_counts;  // histogram: bucket_count + 1 (+Inf)
};

struct pcp_obs_family_t {
  pcp_obs_registry_t* registry;
  pcp_obs_family_t* next;
  const pcp_obs_metric_def_t* def;
  size_t label_count;
  const double* buckets;
  size_t bucket_count;
  size_t max_series;
  pthread_mutex_t mutex;  // guards the series list
  pcp_obs_series_t* head;
  pcp_obs_series_t* tail;
  size_t series_count;
  pcp_obs_series_t sink;
  // Removed series: unlinked from the rendered list but kept until the
  // registry goes, since hot paths may still hold their handles.
  pcp_obs_series_t* retired;
  _Atomic uint64_t dropped;
  bool is_dropped_family;
};

struct pcp_obs_registry_t {
  pcp_allocator_t allocator;
  pthread_mutex_t mutex;  // guards the family list
  pcp_obs_family_t* head;
  pcp_obs_family_t* tail;
  pcp_obs_family_t* dropped_family;
  // Serializes collector runs and guards the table (a remove waits for a
  // run in progress).
  pthread_mutex_t collect_mutex;
  struct {
    pcp_obs_collect_fn_t fn;
    void* user_data;
    bool owned;  // user_data freed with the registry
  } collectors[PCP_OBS_MAX_COLLECTORS];
  size_t collector_count;
};

// Prometheus client defaults: 5 ms to 10 s, for request latencies.
static const double kDefaultBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5,   1,    2.5,   5,    10};

static const char* const kDroppedLabels[] = {"metric", NULL};
static const pcp_obs_metric_def_t kDroppedDef = {
    .name = PCP_OBS_DROPPED_METRIC_NAME,
    .type = PCP_OBS_METRIC_TYPE_COUNTER,
    .help =
        "Metric updates dropped because the family reached its series "
        "cap.",
    .label_names = kDroppedLabels,
    .max_series = 4096,
};

//===----------------------------------------------------------------------===//
// Atomic doubles
//===----------------------------------------------------------------------===//

static uint64_t double_bits(double value) {
  uint64_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

static double bits_double(uint64_t bits) {
  double value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

static void atomic_double_add(_Atomic uint64_t* slot, double delta) {
  uint64_t old_bits = atomic_load_explicit(slot, memory_order_relaxed);
  for (;;) {
    uint64_t new_bits = double_bits(bits_double(old_bits) + delta);
    if (atomic_compare_exchange_weak_explicit(slot, &old_bits, new_bits,
                                              memory_order_relaxed,
                                              memory_order_relaxed)) {
      return;
    }
  }
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

static bool is_name_start_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool metric_name_valid(const char* name) {
  if (!name || !(is_name_start_char(name[0]) || name[0] == ':')) {
    return false;
  }
  for (const char* p = name + 1; *p; ++p) {
    if (!(is_name_start_char(*p) || is_digit(*p) || *p == ':')) {
      return false;
    }
  }
  return true;
}

static bool label_name_valid(const char* name) {
  if (!name || !is_name_start_char(name[0])) {
    return false;
  }
  if (name[0] == '_' && name[1] == '_') {
    return false;  // reserved
  }
  for (const char* p = name + 1; *p; ++p) {
    if (!(is_name_start_char(*p) || is_digit(*p))) {
      return false;
    }
  }
  return true;
}

static bool ends_with(const char* value, const char* suffix) {
  size_t n = strlen(value), m = strlen(suffix);
  return n >= m && strcmp(value + n - m, suffix) == 0;
}

static pcp_status_t validate_def(const pcp_obs_metric_def_t* def) {
  if (!metric_name_valid(def->name)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "metric name '%s' does not match "
                           "[a-zA-Z_:][a-zA-Z0-9_:]*",
                           def->name ? def->name : "(null)");
  }
  if ((unsigned)def->type > PCP_OBS_METRIC_TYPE_HISTOGRAM) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "metric '%s': unknown type %d", def->name,
                           (int)def->type);
  }
  if (!def->help || !def->help[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "metric '%s': help text is empty", def->name);
  }
  bool is_counter = def->type == PCP_OBS_METRIC_TYPE_COUNTER;
  if (is_counter != ends_with(def->name, "_total")) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           is_counter
                               ? "metric '%s': counter names end in _total"
                               : "metric '%s': only counters end in _total",
                           def->name);
  }
  size_t label_count = 0;
  for (; def->label_names && def->label_names[label_count]; ++label_count) {
    const char* label = def->label_names[label_count];
    if (label_count >= PCP_OBS_MAX_LABELS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': more than %d labels", def->name,
                             PCP_OBS_MAX_LABELS);
    }
    if (!label_name_valid(label)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': label name '%s' is invalid",
                             def->name, label);
    }
    if (def->type == PCP_OBS_METRIC_TYPE_HISTOGRAM &&
        strcmp(label, "le") == 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': label 'le' is reserved", def->name);
    }
    for (size_t j = 0; j < label_count; ++j) {
      if (strcmp(def->label_names[j], label) == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "metric '%s': label '%s' appears twice",
                               def->name, label);
      }
    }
  }
  if (def->type == PCP_OBS_METRIC_TYPE_HISTOGRAM && def->buckets) {
    if (def->bucket_count == 0 || def->bucket_count > PCP_OBS_MAX_BUCKETS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': bucket count %zu not in [1, %d]",
                             def->name, def->bucket_count, PCP_OBS_MAX_BUCKETS);
    }
    for (size_t i = 0; i < def->bucket_count; ++i) {
      if (!isfinite(def->buckets[i]) ||
          (i > 0 && !(def->buckets[i] > def->buckets[i - 1]))) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "metric '%s': buckets must be finite and "
                               "strictly increasing",
                               def->name);
      }
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

static void series_free(pcp_allocator_t allocator, pcp_obs_family_t* family,
                        pcp_obs_series_t* series) {
  if (series->label_values) {
    for (size_t i = 0; i < family->label_count; ++i) {
      pcp_allocator_free(allocator, series->label_values[i]);
    }
    pcp_allocator_free(allocator, series->label_values);
  }
  pcp_allocator_free(allocator, (void*)series->bucket_counts);
}

static void series_list_free(pcp_allocator_t allocator,
                             pcp_obs_family_t* family,
                             pcp_obs_series_t* series) {
  while (series) {
    pcp_obs_series_t* next = series->next;
    series_free(allocator, family, series);
    pcp_allocator_free(allocator, series);
    series = next;
  }
}

static void family_free(pcp_allocator_t allocator, pcp_obs_family_t* family) {
  series_list_free(allocator, family, family->head);
  series_list_free(allocator, family, family->retired);
  series_free(allocator, family, &family->sink);
  pthread_mutex_destroy(&family->mutex);
  pcp_allocator_free(allocator, family);
}

static pcp_status_t bucket_counts_allocate(pcp_allocator_t allocator,
                                           const pcp_obs_family_t* family,
                                           pcp_obs_series_t* series) {
  if (family->def->type != PCP_OBS_METRIC_TYPE_HISTOGRAM) {
    return pcp_ok_status();
  }
  void* counts = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, (family->bucket_count + 1) * sizeof(_Atomic uint64_t),
      &counts));
  series->bucket_counts = (_Atomic uint64_t*)counts;
  return pcp_ok_status();
}

static pcp_status_t family_create(pcp_obs_registry_t* registry,
                                  const pcp_obs_metric_def_t* def,
                                  pcp_obs_family_t** out_family) {
  *out_family = NULL;
  pcp_obs_family_t* family = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      registry->allocator, sizeof(*family), (void**)&family));
  family->registry = registry;
  family->def = def;
  while (def->label_names && def->label_names[family->label_count]) {
    ++family->label_count;
  }
  family->buckets = def->buckets ? def->buckets : kDefaultBuckets;
  family->bucket_count =
      def->buckets ? def->bucket_count : PCP_ARRAYSIZE(kDefaultBuckets);
  family->max_series =
      def->max_series ? def->max_series : PCP_OBS_DEFAULT_MAX_SERIES;
  pthread_mutex_init(&family->mutex, NULL);
  family->sink.family = family;
  family->sink.is_sink = true;
  pcp_status_t status =
      bucket_counts_allocate(registry->allocator, family, &family->sink);
  if (status) {
    family_free(registry->allocator, family);
    return status;
  }
  *out_family = family;
  return pcp_ok_status();
}

pcp_status_t pcp_obs_registry_create(pcp_allocator_t allocator,
                                     pcp_obs_registry_t** out_registry) {
  *out_registry = NULL;
  pcp_obs_registry_t* registry = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*registry), (void**)&registry));
  registry->allocator = allocator;
  pthread_mutex_init(&registry->mutex, NULL);
  pthread_mutex_init(&registry->collect_mutex, NULL);
  pcp_obs_family_t* dropped = NULL;
  pcp_status_t status =
      pcp_obs_registry_register(registry, &kDroppedDef, 1, &dropped);
  if (status) {
    pcp_obs_registry_release(registry);
    return status;
  }
  dropped->is_dropped_family = true;
  registry->dropped_family = dropped;
  *out_registry = registry;
  return pcp_ok_status();
}

void pcp_obs_registry_release(pcp_obs_registry_t* registry) {
  if (!registry) {
    return;
  }
  pcp_obs_family_t* family = registry->head;
  while (family) {
    pcp_obs_family_t* next = family->next;
    family_free(registry->allocator, family);
    family = next;
  }
  for (size_t i = 0; i < registry->collector_count; ++i) {
    if (registry->collectors[i].owned) {
      pcp_allocator_free(registry->allocator,
                         registry->collectors[i].user_data);
    }
  }
  pthread_mutex_destroy(&registry->mutex);
  pthread_mutex_destroy(&registry->collect_mutex);
  pcp_allocator_free(registry->allocator, registry);
}

// True when a sample name of |def| equals |name| (histograms render three).
static bool def_claims_name(const pcp_obs_metric_def_t* def, const char* name) {
  if (strcmp(def->name, name) == 0) {
    return true;
  }
  if (def->type != PCP_OBS_METRIC_TYPE_HISTOGRAM) {
    return false;
  }
  size_t n = strlen(def->name);
  if (strncmp(def->name, name, n) != 0) {
    return false;
  }
  const char* suffix = name + n;
  return strcmp(suffix, "_bucket") == 0 || strcmp(suffix, "_sum") == 0 ||
         strcmp(suffix, "_count") == 0;
}

static bool defs_collide(const pcp_obs_metric_def_t* a,
                         const pcp_obs_metric_def_t* b) {
  if (def_claims_name(a, b->name) || def_claims_name(b, a->name)) {
    return true;
  }
  if (a->type == PCP_OBS_METRIC_TYPE_HISTOGRAM &&
      b->type == PCP_OBS_METRIC_TYPE_HISTOGRAM) {
    return strcmp(a->name, b->name) == 0;
  }
  return false;
}

pcp_status_t pcp_obs_registry_register(pcp_obs_registry_t* registry,
                                       const pcp_obs_metric_def_t* defs,
                                       size_t def_count,
                                       pcp_obs_family_t** out_families) {
  for (size_t i = 0; i < def_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(validate_def(&defs[i]));
    for (size_t j = 0; j < i; ++j) {
      if (defs_collide(&defs[i], &defs[j])) {
        return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                               "metric '%s' is declared twice", defs[i].name);
      }
    }
  }
  // Build every family before taking the lock, then link them all at once,
  // so a failure leaves the registry unchanged.
  pcp_obs_family_t** created = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      registry->allocator, (def_count + 1) * sizeof(pcp_obs_family_t*),
      (void**)&created));
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < def_count && !status; ++i) {
    status = family_create(registry, &defs[i], &created[i]);
  }
  pthread_mutex_lock(&registry->mutex);
  for (size_t i = 0; i < def_count && !status; ++i) {
    for (pcp_obs_family_t* f = registry->head; f; f = f->next) {
      if (defs_collide(f->def, &defs[i])) {
        status =
            pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                            "metric '%s' is already registered", defs[i].name);
        break;
      }
    }
  }
  if (!status) {
    for (size_t i = 0; i < def_count; ++i) {
      if (registry->tail) {
        registry->tail->next = created[i];
      } else {
        registry->head = created[i];
      }
      registry->tail = created[i];
      if (out_families) {
        out_families[i] = created[i];
      }
    }
  }
  pthread_mutex_unlock(&registry->mutex);
  if (status) {
    for (size_t i = 0; i < def_count; ++i) {
      if (created[i]) {
        family_free(registry->allocator, created[i]);
      }
    }
  }
  pcp_allocator_free(registry->allocator, created);
  return status;
}

pcp_obs_family_t* pcp_obs_registry_find(pcp_obs_registry_t* registry,
                                        const char* name) {
  pthread_mutex_lock(&registry->mutex);
  pcp_obs_family_t* found = NULL;
  for (pcp_obs_family_t* f = registry->head; f; f = f->next) {
    if (strcmp(f->def->name, name) == 0) {
      found = f;
      break;
    }
  }
  pthread_mutex_unlock(&registry->mutex);
  return found;
}

//===----------------------------------------------------------------------===//
// Series
//===----------------------------------------------------------------------===//

static uint64_t hash_labels(const char* const* values, size_t count) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < count; ++i) {
    for (const char* p = values[i]; *p; ++p) {
      hash = (hash ^ (uint8_t)*p) * 1099511628211ull;
    }
    hash = (hash ^ 0xFFu) * 1099511628211ull;  // separator
  }
  return hash;
}

static bool labels_equal(const pcp_obs_series_t* series,
                         const char* const* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (strcmp(series->label_values[i], values[i]) != 0) {
      return false;
    }
  }
  return true;
}

static pcp_status_t series_create(pcp_obs_family_t* family,
                                  const char* const* values, size_t label_count,
                                  uint64_t hash,
                                  pcp_obs_series_t** out_series) {
  pcp_allocator_t allocator = family->registry->allocator;
  pcp_obs_series_t* series = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*series), (void**)&series));
  series->family = family;
  series->hash = hash;
  pcp_status_t status = pcp_ok_status();
  if (label_count) {
    status = pcp_allocator_calloc(allocator, label_count * sizeof(char*),
                                  (void**)&series->label_values);
  }
  for (size_t i = 0; i < label_count && !status; ++i) {
    size_t length = strlen(values[i]);
    status = pcp_allocator_malloc(allocator, length + 1,
                                  (void**)&series->label_values[i]);
    if (!status) {
      memcpy(series->label_values[i], values[i], length + 1);
    }
  }
  if (!status) {
    status = bucket_counts_allocate(allocator, family, series);
  }
  if (status) {
    series_free(allocator, family, series);
    pcp_allocator_free(allocator, series);
    return status;
  }
  *out_series = series;
  return pcp_ok_status();
}

// Length of the valid UTF-8 sequence at |p| (1-4), or 0 when the bytes
// there are not one (overlong forms, surrogates and values past U+10FFFF
// included).
static size_t utf8_sequence_length(const unsigned char* p) {
  unsigned char c = p[0];
  if (c < 0x80) {
    return 1;
  }
  size_t length = 0;
  uint32_t code_point = 0;
  if ((c & 0xE0) == 0xC0) {
    length = 2;
    code_point = c & 0x1Fu;
  } else if ((c & 0xF0) == 0xE0) {
    length = 3;
    code_point = c & 0x0Fu;
  } else if ((c & 0xF8) == 0xF0) {
    length = 4;
    code_point = c & 0x07u;
  } else {
    return 0;
  }
  for (size_t i = 1; i < length; ++i) {
    if ((p[i] & 0xC0) != 0x80) {
      return 0;  // also stops at the NUL terminator
    }
    code_point = (code_point << 6) | (p[i] & 0x3Fu);
  }
  static const uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kMinimum[length] || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return 0;
  }
  return length;
}

static bool utf8_valid(const char* value) {
  const unsigned char* p = (const unsigned char*)value;
  while (*p) {
    size_t n = utf8_sequence_length(p);
    if (n == 0) {
      return false;
    }
    p += n;
  }
  return true;
}

// Writes |value| with every byte that does not start a valid sequence
// replaced by U+FFFD. |out| holds at least 3 * strlen(value) + 1 bytes.
static void utf8_sanitize(const char* value, char* out) {
  const unsigned char* p = (const unsigned char*)value;
  while (*p) {
    size_t n = utf8_sequence_length(p);
    if (n == 0) {
      memcpy(out, "\xEF\xBF\xBD", 3);
      out += 3;
      ++p;
    } else {
      memcpy(out, p, n);
      out += n;
      p += n;
    }
  }
  *out = 0;
}

static pcp_status_t series_find_or_create(pcp_obs_family_t* family,
                                          const char* const* label_values,
                                          size_t label_count,
                                          pcp_obs_series_t** out_series);

pcp_status_t pcp_obs_family_series_get(pcp_obs_family_t* family,
                                       const char* const* label_values,
                                       pcp_obs_series_t** out_series) {
  *out_series = NULL;
  // Immutable after registration; a local keeps that visible across the
  // lock below.
  const size_t label_count = family->label_count;
  if (label_count && !label_values) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "metric '%s': %zu label values needed",
                           family->def->name, label_count);
  }
  bool all_valid = true;
  size_t sanitized_bytes = 0;
  for (size_t i = 0; i < label_count; ++i) {
    if (!label_values[i]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': value of label '%s' is missing",
                             family->def->name, family->def->label_names[i]);
    }
    size_t length = strlen(label_values[i]);
    if (length > PCP_OBS_MAX_LABEL_VALUE_BYTES) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "metric '%s': value of label '%s' is longer "
                             "than %d bytes",
                             family->def->name, family->def->label_names[i],
                             PCP_OBS_MAX_LABEL_VALUE_BYTES);
    }
    all_valid = all_valid && utf8_valid(label_values[i]);
    sanitized_bytes += 3 * length + 1;
  }
  if (all_valid) {
    return series_find_or_create(family, label_values, label_count, out_series);
  }
  // The exposition format is UTF-8 and one bad byte makes scrapers reject
  // the whole page, so values from peers are repaired (U+FFFD) here, once,
  // before the lookup: the same bad input always maps to the same series.
  char* scratch = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      family->registry->allocator, sanitized_bytes, (void**)&scratch));
  const char* fixed[PCP_OBS_MAX_LABELS];
  char* at = scratch;
  for (size_t i = 0; i < label_count; ++i) {
    utf8_sanitize(label_values[i], at);
    fixed[i] = at;
    at += strlen(at) + 1;
  }
  pcp_status_t status =
      series_find_or_create(family, fixed, label_count, out_series);
  pcp_allocator_free(family->registry->allocator, scratch);
  return status;
}

static pcp_status_t series_find_or_create(pcp_obs_family_t* family,
                                          const char* const* label_values,
                                          size_t label_count,
                                          pcp_obs_series_t** out_series) {
  uint64_t hash = hash_labels(label_values, label_count);
  pcp_status_t status = pcp_ok_status();
  pthread_mutex_lock(&family->mutex);
  pcp_obs_series_t* found = NULL;
  for (pcp_obs_series_t* s = family->head; s; s = s->next) {
    if (s->hash == hash && labels_equal(s, label_values, label_count)) {
      found = s;
      break;
    }
  }
  if (!found && family->series_count >= family->max_series) {
    found = &family->sink;
  }
  if (!found) {
    status = series_create(family, label_values, label_count, hash, &found);
    if (!status) {
      if (family->tail) {
        family->tail->next = found;
      } else {
        family->head = found;
      }
      family->tail = found;
      ++family->series_count;
    }
  }
  pthread_mutex_unlock(&family->mutex);
  *out_series = found;
  return status;
}

bool pcp_obs_family_series_remove(pcp_obs_family_t* family,
                                  const char* const* label_values) {
  const size_t label_count = family->label_count;
  if (label_count && !label_values) {
    return false;
  }
  const char* fixed[PCP_OBS_MAX_LABELS];
  char repaired[PCP_OBS_MAX_LABELS][3 * 64 + 1];
  for (size_t i = 0; i < label_count; ++i) {
    if (!label_values[i] ||
        strlen(label_values[i]) > PCP_OBS_MAX_LABEL_VALUE_BYTES) {
      return false;
    }
    fixed[i] = label_values[i];
    // Values that series_get repaired are matched in their repaired form;
    // only short ones are looked up that way (the names of things that end
    // are ids, far below the bound).
    if (!utf8_valid(label_values[i])) {
      if (strlen(label_values[i]) > 64) {
        return false;
      }
      utf8_sanitize(label_values[i], repaired[i]);
      fixed[i] = repaired[i];
    }
  }
  uint64_t hash = hash_labels(fixed, label_count);
  bool removed = false;
  pthread_mutex_lock(&family->mutex);
  pcp_obs_series_t* previous = NULL;
  for (pcp_obs_series_t* s = family->head; s; previous = s, s = s->next) {
    if (s->hash != hash || !labels_equal(s, fixed, label_count)) {
      continue;
    }
    if (previous) {
      previous->next = s->next;
    } else {
      family->head = s->next;
    }
    if (family->tail == s) {
      family->tail = previous;
    }
    --family->series_count;
    s->next = family->retired;
    family->retired = s;
    removed = true;
    break;
  }
  pthread_mutex_unlock(&family->mutex);
  return removed;
}

size_t pcp_obs_family_series_count(pcp_obs_family_t* family) {
  pthread_mutex_lock(&family->mutex);
  size_t count = family->series_count;
  pthread_mutex_unlock(&family->mutex);
  return count;
}

uint64_t pcp_obs_family_dropped_count(pcp_obs_family_t* family) {
  return atomic_load(&family->dropped);
}

pcp_obs_metric_type_t pcp_obs_family_type(const pcp_obs_family_t* family) {
  return family->def->type;
}

static void count_drop(pcp_obs_family_t* family) {
  atomic_fetch_add(&family->dropped, 1);
  // The dropped family itself only has one series per family, so it cannot
  // overflow in practice; if it did, counting into itself would recurse.
  if (family->is_dropped_family) {
    return;
  }
  pcp_obs_family_t* dropped = family->registry->dropped_family;
  if (!dropped) {
    return;
  }
  // Sized for any family so no reader can run past the array.
  const char* values[PCP_OBS_MAX_LABELS] = {family->def->name};
  pcp_obs_series_t* series = NULL;
  pcp_status_t status = pcp_obs_family_series_get(dropped, values, &series);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  if (series && !series->is_sink) {
    atomic_double_add(&series->value_bits, 1.0);
  }
}

// Sinks swallow updates (counted); everything else must match the type.
static bool accept_update(pcp_obs_series_t* series,
                          pcp_obs_metric_type_t type) {
  PCP_ASSERT(series->family->def->type == type);
  if (series->is_sink) {
    count_drop(series->family);
    return false;
  }
  return true;
}

void pcp_obs_counter_add(pcp_obs_series_t* series, double delta) {
  if (!accept_update(series, PCP_OBS_METRIC_TYPE_COUNTER)) {
    return;
  }
  if (!(delta >= 0)) {
    return;  // negative or NaN
  }
  atomic_double_add(&series->value_bits, delta);
}

void pcp_obs_counter_increment(pcp_obs_series_t* series) {
  pcp_obs_counter_add(series, 1.0);
}

void pcp_obs_gauge_set(pcp_obs_series_t* series, double value) {
  if (!accept_update(series, PCP_OBS_METRIC_TYPE_GAUGE)) {
    return;
  }
  atomic_store_explicit(&series->value_bits, double_bits(value),
                        memory_order_relaxed);
}

void pcp_obs_gauge_add(pcp_obs_series_t* series, double delta) {
  if (!accept_update(series, PCP_OBS_METRIC_TYPE_GAUGE)) {
    return;
  }
  atomic_double_add(&series->value_bits, delta);
}

void pcp_obs_histogram_observe(pcp_obs_series_t* series, double value) {
  if (!accept_update(series, PCP_OBS_METRIC_TYPE_HISTOGRAM)) {
    return;
  }
  if (isnan(value)) {
    return;
  }
  const pcp_obs_family_t* family = series->family;
  // Buckets are stored non-cumulative (one increment per observation) and
  // summed when rendering; _count is derived from them, so _count and the
  // +Inf bucket always agree even while observations race a render.
  size_t index = 0;
  while (index < family->bucket_count && value > family->buckets[index]) {
    ++index;
  }
  atomic_fetch_add_explicit(&series->bucket_counts[index], 1,
                            memory_order_relaxed);
  atomic_double_add(&series->sum_bits, value);
}

double pcp_obs_series_value(const pcp_obs_series_t* series) {
  return bits_double(atomic_load_explicit(
      (_Atomic uint64_t*)&series->value_bits, memory_order_relaxed));
}

static pcp_obs_series_t* lookup_or_drop(pcp_obs_family_t* family,
                                        const char* const* label_values) {
  pcp_obs_series_t* series = NULL;
  pcp_status_t status =
      pcp_obs_family_series_get(family, label_values, &series);
  if (status) {
    pcp_status_ignore(status);
    count_drop(family);
    return NULL;
  }
  return series;
}

void pcp_obs_family_add(pcp_obs_family_t* family,
                        const char* const* label_values, double delta) {
  pcp_obs_series_t* series = lookup_or_drop(family, label_values);
  if (!series) {
    return;
  }
  if (family->def->type == PCP_OBS_METRIC_TYPE_COUNTER) {
    pcp_obs_counter_add(series, delta);
  } else {
    pcp_obs_gauge_add(series, delta);
  }
}

void pcp_obs_family_set(pcp_obs_family_t* family,
                        const char* const* label_values, double value) {
  pcp_obs_series_t* series = lookup_or_drop(family, label_values);
  if (series) {
    pcp_obs_gauge_set(series, value);
  }
}

void pcp_obs_family_observe(pcp_obs_family_t* family,
                            const char* const* label_values, double value) {
  pcp_obs_series_t* series = lookup_or_drop(family, label_values);
  if (series) {
    pcp_obs_histogram_observe(series, value);
  }
}

//===----------------------------------------------------------------------===//
// Rendering
//===----------------------------------------------------------------------===//

// Exposition-format numbers: integers without a fraction, otherwise the
// shortest text that reads back to the same double; Go's parser (promtool,
// Prometheus) takes "+Inf", "-Inf" and "NaN".
static void format_value(double value, char* buffer, size_t capacity) {
  if (isnan(value)) {
    snprintf(buffer, capacity, "NaN");
  } else if (isinf(value)) {
    snprintf(buffer, capacity, value > 0 ? "+Inf" : "-Inf");
  } else if (value == floor(value) && fabs(value) < 1e15) {
    snprintf(buffer, capacity, "%lld", (long long)value);
  } else {
    for (int precision = 6; precision <= 17; ++precision) {
      snprintf(buffer, capacity, "%.*g", precision, value);
      if (strtod(buffer, NULL) == value) {
        break;
      }
    }
  }
}

static pcp_status_t append_escaped(pcp_string_builder_t* builder,
                                   const char* value, bool escape_quote) {
  const char* run = value;
  for (const char* p = value;; ++p) {
    const char* replacement = NULL;
    if (*p == '\\') {
      replacement = "\\\\";
    } else if (*p == '\n') {
      replacement = "\\n";
    } else if (*p == '"' && escape_quote) {
      replacement = "\\\"";
    }
    if (replacement || *p == 0) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
          builder, pcp_make_string_view(run, (size_t)(p - run))));
      if (*p == 0) {
        break;
      }
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(builder, replacement));
      run = p + 1;
    }
  }
  return pcp_ok_status();
}

// Writes `name{a="x",le="0.1"} value\n`. |le| may be NULL.
static pcp_status_t append_sample(pcp_string_builder_t* builder,
                                  const pcp_obs_family_t* family,
                                  const pcp_obs_series_t* series,
                                  const char* suffix, const char* le,
                                  double value) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(builder, "%s%s", family->def->name, suffix));
  bool any = family->label_count > 0 || le;
  if (any) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "{"));
  }
  for (size_t i = 0; i < family->label_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        builder, "%s%s=\"", i ? "," : "", family->def->label_names[i]));
    PCP_RETURN_IF_ERROR_BARE(
        append_escaped(builder, series->label_values[i], true));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "\""));
  }
  if (le) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        builder, "%sle=\"%s\"", family->label_count ? "," : "", le));
  }
  if (any) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "}"));
  }
  char text[64];
  format_value(value, text, sizeof(text));
  return pcp_string_builder_append_f(builder, " %s\n", text);
}

static pcp_status_t render_series(pcp_string_builder_t* builder,
                                  const pcp_obs_family_t* family,
                                  pcp_obs_series_t* series) {
  if (family->def->type != PCP_OBS_METRIC_TYPE_HISTOGRAM) {
    return append_sample(builder, family, series, "", NULL,
                         pcp_obs_series_value(series));
  }
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= family->bucket_count; ++i) {
    cumulative +=
        atomic_load_explicit(&series->bucket_counts[i], memory_order_relaxed);
    char le[64];
    if (i < family->bucket_count) {
      format_value(family->buckets[i], le, sizeof(le));
    } else {
      snprintf(le, sizeof(le), "+Inf");
    }
    PCP_RETURN_IF_ERROR_BARE(append_sample(builder, family, series, "_bucket",
                                           le, (double)cumulative));
  }
  double sum = bits_double(
      atomic_load_explicit(&series->sum_bits, memory_order_relaxed));
  PCP_RETURN_IF_ERROR_BARE(
      append_sample(builder, family, series, "_sum", NULL, sum));
  return append_sample(builder, family, series, "_count", NULL,
                       (double)cumulative);
}

static const char* type_name(pcp_obs_metric_type_t type) {
  switch (type) {
    case PCP_OBS_METRIC_TYPE_COUNTER:
      return "counter";
    case PCP_OBS_METRIC_TYPE_GAUGE:
      return "gauge";
    case PCP_OBS_METRIC_TYPE_HISTOGRAM:
      return "histogram";
  }
  return "untyped";
}

static pcp_status_t render_family(pcp_string_builder_t* builder,
                                  pcp_obs_family_t* family) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(builder, "# HELP %s ", family->def->name));
  PCP_RETURN_IF_ERROR_BARE(append_escaped(builder, family->def->help, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      builder, "\n# TYPE %s %s\n", family->def->name,
      type_name(family->def->type)));
  // Rendered under the family lock: a series may be unlinked
  // (pcp_obs_family_series_remove) while a scrape runs. Hot paths hold
  // series handles and do not take this lock, so a scrape only delays
  // series creation.
  pthread_mutex_lock(&family->mutex);
  pcp_status_t status = pcp_ok_status();
  for (pcp_obs_series_t* s = family->head; s && !status; s = s->next) {
    status = render_series(builder, family, s);
  }
  pthread_mutex_unlock(&family->mutex);
  return status;
}

static pcp_status_t collector_add(pcp_obs_registry_t* registry,
                                  pcp_obs_collect_fn_t fn, void* user_data,
                                  bool owned) {
  pthread_mutex_lock(&registry->collect_mutex);
  pcp_status_t status = pcp_ok_status();
  if (registry->collector_count == PCP_OBS_MAX_COLLECTORS) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "metrics registry: more than %d collectors",
                             PCP_OBS_MAX_COLLECTORS);
  } else {
    registry->collectors[registry->collector_count].fn = fn;
    registry->collectors[registry->collector_count].user_data = user_data;
    registry->collectors[registry->collector_count].owned = owned;
    ++registry->collector_count;
  }
  pthread_mutex_unlock(&registry->collect_mutex);
  return status;
}

pcp_status_t pcp_obs_registry_collector_add(pcp_obs_registry_t* registry,
                                            pcp_obs_collect_fn_t fn,
                                            void* user_data) {
  return collector_add(registry, fn, user_data, false);
}

pcp_status_t pcp_obs_registry_collector_add_owned(pcp_obs_registry_t* registry,
                                                  pcp_obs_collect_fn_t fn,
                                                  void* user_data) {
  return collector_add(registry, fn, user_data, true);
}

pcp_allocator_t pcp_obs_registry_allocator(pcp_obs_registry_t* registry) {
  return registry->allocator;
}

void pcp_obs_registry_collector_remove(pcp_obs_registry_t* registry,
                                       pcp_obs_collect_fn_t fn,
                                       void* user_data) {
  pthread_mutex_lock(&registry->collect_mutex);
  for (size_t i = 0; i < registry->collector_count; ++i) {
    if (registry->collectors[i].fn == fn &&
        registry->collectors[i].user_data == user_data &&
        !registry->collectors[i].owned) {
      memmove(&registry->collectors[i], &registry->collectors[i + 1],
              (registry->collector_count - i - 1) *
                  sizeof(registry->collectors[0]));
      --registry->collector_count;
      break;
    }
  }
  pthread_mutex_unlock(&registry->collect_mutex);
}

pcp_status_t pcp_obs_registry_render(pcp_obs_registry_t* registry,
                                     pcp_string_builder_t* builder) {
  // Collectors first, outside the family list lock: they update series,
  // which may create some.
  pthread_mutex_lock(&registry->collect_mutex);
  for (size_t i = 0; i < registry->collector_count; ++i) {
    registry->collectors[i].fn(registry->collectors[i].user_data, registry);
  }
  pthread_mutex_unlock(&registry->collect_mutex);
  pthread_mutex_lock(&registry->mutex);
  pcp_status_t status = pcp_ok_status();
  for (pcp_obs_family_t* f = registry->head; f && !status; f = f->next) {
    status = render_family(builder, f);
  }
  pthread_mutex_unlock(&registry->mutex);
  return status;
}
