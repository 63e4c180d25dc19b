// SPDX-License-Identifier: Apache-2.0
// sched: the federation hub's gateway registry and placement (sched.h,
// "Federation"). Pure bookkeeping: the hub role adds the mutex, the disk and
// the HTTP around it.

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

// One registration. Every string is its own allocation from the registry's
// allocator (freed by record_free), so a record can be built completely
// before it replaces the old one: a failed connect changes nothing.
typedef struct record_t {
  pcp_sched_federation_gateway_t view;  // status / timing filled on read
  pcp_sched_federation_service_t* services;
  bool restored;  // read back from disk, no connect since
} record_t;

struct pcp_sched_federation_t {
  pcp_allocator_t allocator;
  pcp_sched_federation_options_t options;
  record_t** records;  // first-registration order
  uint32_t count;
  uint64_t next_epoch;
};

//===----------------------------------------------------------------------===//
// Names and options
//===----------------------------------------------------------------------===//

const char* pcp_sched_federation_status_name(
    pcp_sched_federation_status_t status) {
  return status == PCP_SCHED_FEDERATION_STATUS_CONNECTED ? "connected"
                                                         : "stale";
}

void pcp_sched_federation_service_initialize(
    pcp_sched_federation_service_t* out_service) {
  memset(out_service, 0, sizeof(*out_service));
  out_service->worker_count = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  out_service->ready_worker_count = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  out_service->workers_connected = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  out_service->workers_ready = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  out_service->workers_available = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  out_service->workers_dispatchable = PCP_SCHED_FEDERATION_COUNT_ABSENT;
}

void pcp_sched_federation_options_initialize(
    pcp_sched_federation_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->heartbeat_interval_ns = INT64_C(5000000000);
  out_options->max_gateways = PCP_SCHED_FEDERATION_MAX_GATEWAYS_DEFAULT;
}

pcp_status_t pcp_sched_federation_create(
    const pcp_sched_federation_options_t* options, pcp_allocator_t allocator,
    pcp_sched_federation_t** out_federation) {
  *out_federation = NULL;
  if (!options || options->heartbeat_interval_ns <= 0 ||
      options->max_gateways == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "federation registry: heartbeat_interval_ns must "
                           "be > 0 and max_gateways > 0");
  }
  // The stale threshold is interval * 3; keep it from overflowing.
  if (options->heartbeat_interval_ns >
      INT64_MAX / (PCP_SCHED_FEDERATION_STALE_INTERVALS + 1)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "federation registry: heartbeat_interval_ns %lld "
                           "is too large",
                           (long long)options->heartbeat_interval_ns);
  }
  pcp_sched_federation_t* f = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*f), (void**)&f));
  f->allocator = allocator;
  f->options = *options;
  f->next_epoch = 1;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, (size_t)options->max_gateways * sizeof(record_t*),
      (void**)&f->records);
  if (status) {
    pcp_allocator_free(allocator, f);
    return status;
  }
  *out_federation = f;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Records
//===----------------------------------------------------------------------===//

static void string_free(pcp_allocator_t allocator, const char* value) {
  if (value) {
    pcp_allocator_free(allocator, (void*)value);
  }
}

static void record_free(pcp_allocator_t allocator, record_t* record) {
  if (!record) {
    return;
  }
  string_free(allocator, record->view.gateway_id);
  string_free(allocator, record->view.lab_id);
  string_free(allocator, record->view.base_url);
  string_free(allocator, record->view.graph_backend);
  for (uint32_t i = 0; record->services && i < record->view.service_count;
       ++i) {
    pcp_sched_federation_service_t* s = &record->services[i];
    string_free(allocator, s->service_id);
    string_free(allocator, s->executor_id);
    string_free(allocator, s->service_type);
    string_free(allocator, s->base_url);
    string_free(allocator, s->auth_mode);
    string_free(allocator, s->health_status);
    string_free(allocator, s->job_status);
    string_free(allocator, s->worker_class);
    string_free(allocator, s->target_arch);
    for (uint32_t c = 0; s->capabilities && c < s->capability_count; ++c) {
      string_free(allocator, s->capabilities[c]);
    }
    if (s->capabilities) {
      pcp_allocator_free(allocator, (void*)s->capabilities);
    }
  }
  if (record->services) {
    pcp_allocator_free(allocator, record->services);
  }
  pcp_allocator_free(allocator, record);
}

void pcp_sched_federation_release(pcp_sched_federation_t* federation) {
  if (!federation) {
    return;
  }
  for (uint32_t i = 0; i < federation->count; ++i) {
    record_free(federation->allocator, federation->records[i]);
  }
  pcp_allocator_free(federation->allocator, federation->records);
  pcp_allocator_free(federation->allocator, federation);
}

static pcp_status_t string_copy(pcp_allocator_t allocator, const char* value,
                                const char** out_copy) {
  *out_copy = NULL;
  if (!value) {
    return pcp_ok_status();
  }
  size_t length = strlen(value);
  char* copy = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, length + 1, (void**)&copy));
  memcpy(copy, value, length + 1);
  *out_copy = copy;
  return pcp_ok_status();
}

// 1..|max_length| bytes, printable ASCII or UTF-8, no spaces or controls
// (ids end up in URLs, metric labels and log lines).
static pcp_status_t text_check(const char* field, const char* value,
                               size_t max_length, bool required,
                               bool allow_space) {
  if (!value) {
    if (required) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s is required",
                             field);
    }
    return pcp_ok_status();
  }
  size_t length = strlen(value);
  if (length == 0 || length > max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must be 1..%zu bytes (got %zu)", field,
                           max_length, length);
  }
  for (size_t i = 0; i < length; ++i) {
    unsigned char c = (unsigned char)value[i];
    if (c < 0x20 || c == 0x7f || (c == ' ' && !allow_space)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s holds a space or control character at "
                             "byte %zu",
                             field, i);
    }
  }
  return pcp_ok_status();
}

// Gateway ids key the hub's database rows and appear in URLs: the store's
// id alphabet [A-Za-z0-9._:@-], so a registration the registry accepts can
// always be persisted.
static pcp_status_t gateway_id_check(const char* value) {
  PCP_RETURN_IF_ERROR_BARE(text_check(
      "gateway_id", value, PCP_SCHED_FEDERATION_ID_MAX_LENGTH, true, false));
  if (strcmp(value, ".") == 0 || strcmp(value, "..") == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway_id '%s' is reserved", value);
  }
  for (const char* c = value; *c; ++c) {
    bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9') || *c == '.' || *c == '_' || *c == '-' ||
              *c == ':' || *c == '@';
    if (!ok) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gateway_id has a byte 0x%02x outside "
                             "[A-Za-z0-9._:@-]",
                             (unsigned)(unsigned char)*c);
    }
  }
  return pcp_ok_status();
}

static pcp_status_t url_check(const char* field, const char* value,
                              bool required) {
  PCP_RETURN_IF_ERROR_BARE(text_check(
      field, value, PCP_SCHED_FEDERATION_URL_MAX_LENGTH, required, false));
  if (value && strncmp(value, "http://", 7) != 0 &&
      strncmp(value, "https://", 8) != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must start with http:// or https://", field);
  }
  return pcp_ok_status();
}

static pcp_status_t count_check(const char* field, int64_t value) {
  if (value == PCP_SCHED_FEDERATION_COUNT_ABSENT) {
    return pcp_ok_status();
  }
  if (value < 0 || value > PCP_SCHED_FEDERATION_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must be 0..%d (got %lld)", field,
                           PCP_SCHED_FEDERATION_MAX_WORKERS, (long long)value);
  }
  return pcp_ok_status();
}

static int64_t first_given(int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t values[] = {a, b, c, d};
  for (size_t i = 0; i < PCP_ARRAYSIZE(values); ++i) {
    if (values[i] != PCP_SCHED_FEDERATION_COUNT_ABSENT) {
      return values[i];
    }
  }
  return 0;
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

static pcp_status_t service_check(uint32_t index,
                                  const pcp_sched_federation_service_t* s) {
  static const char* const kCountNames[] = {
      "worker_count",  "ready_worker_count", "workers_connected",
      "workers_ready", "workers_available",  "workers_dispatchable"};
  const int64_t counts[] = {s->worker_count,      s->ready_worker_count,
                            s->workers_connected, s->workers_ready,
                            s->workers_available, s->workers_dispatchable};
  char field[64];
  const struct {
    const char* name;
    const char* value;
    size_t max_length;
    bool required;
  } texts[] = {
      {"service_id", s->service_id, PCP_SCHED_FEDERATION_ID_MAX_LENGTH, true},
      {"executor_id", s->executor_id, PCP_SCHED_FEDERATION_ID_MAX_LENGTH,
       false},
      {"service_type", s->service_type, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
       true},
      {"auth_mode", s->auth_mode, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH, false},
      {"health_status", s->health_status, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
       false},
      {"job_status", s->job_status, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
       false},
      {"worker_class", s->worker_class, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
       false},
      {"target_arch", s->target_arch, PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
       false},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(texts); ++i) {
    snprintf(field, sizeof(field), "services[%u].%s", index, texts[i].name);
    PCP_RETURN_IF_ERROR_BARE(text_check(
        field, texts[i].value, texts[i].max_length, texts[i].required, false));
  }
  snprintf(field, sizeof(field), "services[%u].base_url", index);
  PCP_RETURN_IF_ERROR_BARE(url_check(field, s->base_url, false));
  for (size_t i = 0; i < PCP_ARRAYSIZE(counts); ++i) {
    snprintf(field, sizeof(field), "services[%u].%s", index, kCountNames[i]);
    PCP_RETURN_IF_ERROR_BARE(count_check(field, counts[i]));
  }
  if (s->capability_count > PCP_SCHED_FEDERATION_MAX_CAPABILITIES ||
      (s->capability_count && !s->capabilities)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "services[%u].capabilities: at most %u entries",
                           index, PCP_SCHED_FEDERATION_MAX_CAPABILITIES);
  }
  for (uint32_t c = 0; c < s->capability_count; ++c) {
    snprintf(field, sizeof(field), "services[%u].capabilities[%u]", index, c);
    PCP_RETURN_IF_ERROR_BARE(text_check(field, s->capabilities[c],
                                        PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
                                        true, false));
  }
  if (s->updated_at_wall_ns < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "services[%u].updated_at must not be negative",
                           index);
  }
  return pcp_ok_status();
}

static pcp_status_t request_check(const pcp_sched_federation_connect_t* r) {
  if (!r) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "connect: no request");
  }
  PCP_RETURN_IF_ERROR_BARE(gateway_id_check(r->gateway_id));
  PCP_RETURN_IF_ERROR_BARE(text_check(
      "lab_id", r->lab_id, PCP_SCHED_FEDERATION_ID_MAX_LENGTH, true, false));
  PCP_RETURN_IF_ERROR_BARE(url_check("base_url", r->base_url, true));
  PCP_RETURN_IF_ERROR_BARE(text_check("graph_backend", r->graph_backend,
                                      PCP_SCHED_FEDERATION_NAME_MAX_LENGTH,
                                      true, false));
  if (r->service_count > PCP_SCHED_FEDERATION_MAX_SERVICES ||
      (r->service_count && !r->services)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "services: at most %u entries (got %u)",
                           PCP_SCHED_FEDERATION_MAX_SERVICES, r->service_count);
  }
  if (r->registered_services != PCP_SCHED_FEDERATION_COUNT_ABSENT &&
      (r->registered_services < 0 ||
       r->registered_services > PCP_SCHED_FEDERATION_MAX_WORKERS)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "registered_services must be 0..%d (got %lld)",
                           PCP_SCHED_FEDERATION_MAX_WORKERS,
                           (long long)r->registered_services);
  }
  if (r->last_sequence_no < 0 || r->last_replicated_sequence < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "last_sequence_no and last_replicated_sequence "
                           "must not be negative");
  }
  for (uint32_t i = 0; i < r->service_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(service_check(i, &r->services[i]));
  }
  return pcp_ok_status();
}

// Copies service |in| of gateway |gateway_id| into |out| (normalised).
static pcp_status_t service_copy(pcp_allocator_t allocator,
                                 const char* gateway_id,
                                 const pcp_sched_federation_service_t* in,
                                 int64_t wall_ns,
                                 pcp_sched_federation_service_t* out) {
  memset(out, 0, sizeof(*out));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->service_id, &out->service_id));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->service_type, &out->service_type));
  if (in->executor_id) {
    PCP_RETURN_IF_ERROR_BARE(
        string_copy(allocator, in->executor_id, &out->executor_id));
  } else {
    // Upstream's default executor id (s.3.1.1).
    char executor[3 * (PCP_SCHED_FEDERATION_ID_MAX_LENGTH + 1)];
    int n = snprintf(executor, sizeof(executor), "%s:%s:%s", gateway_id,
                     in->service_type, in->service_id);
    if (n < 0 || (size_t)n > PCP_SCHED_FEDERATION_ID_MAX_LENGTH) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "executor_id derived for service %s is longer "
                             "than %d bytes; give executor_id",
                             in->service_id,
                             PCP_SCHED_FEDERATION_ID_MAX_LENGTH);
    }
    PCP_RETURN_IF_ERROR_BARE(
        string_copy(allocator, executor, &out->executor_id));
  }
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->base_url, &out->base_url));
  PCP_RETURN_IF_ERROR_BARE(string_copy(
      allocator, in->auth_mode ? in->auth_mode : "none", &out->auth_mode));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->health_status ? in->health_status : "unknown",
                  &out->health_status));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->job_status ? in->job_status : "unknown",
                  &out->job_status));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->worker_class, &out->worker_class));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(allocator, in->target_arch, &out->target_arch));
  if (in->capability_count) {
    const char** caps = NULL;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        allocator, (size_t)in->capability_count * sizeof(char*),
        (void**)&caps));
    out->capabilities = caps;
    for (uint32_t c = 0; c < in->capability_count; ++c) {
      PCP_RETURN_IF_ERROR_BARE(
          string_copy(allocator, in->capabilities[c], &caps[c]));
      out->capability_count = c + 1;
    }
  }
  const int64_t absent = PCP_SCHED_FEDERATION_COUNT_ABSENT;
  int64_t connected =
      first_given(in->workers_connected, in->worker_count, absent, absent);
  int64_t ready =
      first_given(in->workers_ready, in->ready_worker_count, absent, absent);
  int64_t available =
      first_given(in->workers_dispatchable, in->workers_available,
                  in->ready_worker_count, absent);
  ready = max64(ready, available);
  connected = max64(connected, ready);
  out->workers_connected = connected;
  out->worker_count = connected;
  out->workers_ready = ready;
  out->workers_available = available;
  out->ready_worker_count = available;
  out->workers_dispatchable = available;
  out->updated_at_wall_ns =
      in->updated_at_wall_ns ? in->updated_at_wall_ns : wall_ns;
  return pcp_ok_status();
}

// Builds a complete record for |r| (validated).
static pcp_status_t record_build(pcp_allocator_t allocator,
                                 const pcp_sched_federation_connect_t* r,
                                 int64_t wall_ns, record_t** out_record) {
  *out_record = NULL;
  record_t* record = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*record), (void**)&record));
  pcp_status_t status =
      string_copy(allocator, r->gateway_id, &record->view.gateway_id);
  if (!status) {
    status = string_copy(allocator, r->lab_id, &record->view.lab_id);
  }
  if (!status) {
    status = string_copy(allocator, r->base_url, &record->view.base_url);
  }
  if (!status) {
    status =
        string_copy(allocator, r->graph_backend, &record->view.graph_backend);
  }
  if (!status && r->service_count) {
    status = pcp_allocator_calloc(
        allocator, (size_t)r->service_count * sizeof(*record->services),
        (void**)&record->services);
  }
  for (uint32_t i = 0; !status && i < r->service_count; ++i) {
    // Counted before the copy so record_free sees a half-copied service.
    record->view.service_count = i + 1;
    status = service_copy(allocator, r->gateway_id, &r->services[i], wall_ns,
                          &record->services[i]);
  }
  // One executor per gateway: two entries with the same executor id would
  // make placement answers depend on list order.
  for (uint32_t i = 0; !status && i < r->service_count; ++i) {
    for (uint32_t j = 0; j < i; ++j) {
      if (strcmp(record->services[i].executor_id,
                 record->services[j].executor_id) == 0) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "services[%u].executor_id %s repeats "
                                 "services[%u]",
                                 i, record->services[i].executor_id, j);
        break;
      }
    }
  }
  if (status) {
    record_free(allocator, record);
    return status;
  }
  record->view.services = record->services;
  record->view.service_count = r->service_count;
  record->view.registered_services =
      r->service_count ? (int64_t)r->service_count
      : r->registered_services == PCP_SCHED_FEDERATION_COUNT_ABSENT
          ? 0
          : r->registered_services;
  record->view.last_sequence_no = r->last_sequence_no;
  record->view.last_replicated_sequence = r->last_replicated_sequence;
  *out_record = record;
  return pcp_ok_status();
}

static int32_t record_index(const pcp_sched_federation_t* f,
                            const char* gateway_id) {
  if (!gateway_id) {
    return -1;
  }
  for (uint32_t i = 0; i < f->count; ++i) {
    if (strcmp(f->records[i]->view.gateway_id, gateway_id) == 0) {
      return (int32_t)i;
    }
  }
  return -1;
}

static pcp_sched_federation_status_t record_status(
    const pcp_sched_federation_t* f, const record_t* record, int64_t now_ns) {
  if (record->restored) {
    return PCP_SCHED_FEDERATION_STATUS_STALE;
  }
  // now - last_seen > 3 * interval, written so it cannot overflow when
  // |now_ns| is far from |last_seen_ns|.
  int64_t limit =
      PCP_SCHED_FEDERATION_STALE_INTERVALS * f->options.heartbeat_interval_ns;
  int64_t last_seen = record->view.last_seen_ns;
  if (now_ns > last_seen && now_ns - last_seen > limit) {
    return PCP_SCHED_FEDERATION_STATUS_STALE;
  }
  return PCP_SCHED_FEDERATION_STATUS_CONNECTED;
}

pcp_status_t pcp_sched_federation_connect(
    pcp_sched_federation_t* federation,
    const pcp_sched_federation_connect_t* request, int64_t now_ns,
    int64_t wall_ns, bool* out_recovered) {
  if (out_recovered) {
    *out_recovered = false;
  }
  PCP_RETURN_IF_ERROR_BARE(request_check(request));
  int32_t index = record_index(federation, request->gateway_id);
  if (index < 0 && federation->count >= federation->options.max_gateways) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "the hub holds its maximum of %u gateways; %s "
                           "is refused",
                           federation->options.max_gateways,
                           request->gateway_id);
  }
  record_t* record = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      record_build(federation->allocator, request, wall_ns, &record));
  record->view.last_seen_ns = now_ns;
  record->view.last_seen_wall_ns = wall_ns;
  if (index < 0) {
    record->view.connected_at_wall_ns = wall_ns;
    record->view.epoch = federation->next_epoch++;
    federation->records[federation->count++] = record;
    return pcp_ok_status();
  }
  record_t* old = federation->records[index];
  bool was_stale = record_status(federation, old, now_ns) ==
                   PCP_SCHED_FEDERATION_STATUS_STALE;
  record->view.connected_at_wall_ns = old->view.connected_at_wall_ns;
  // A stale gateway that returns may have restarted and lost what it was
  // running: a new epoch makes earlier placements on it checkable.
  record->view.epoch = was_stale ? federation->next_epoch++ : old->view.epoch;
  if (old->view.last_replicated_sequence >
      record->view.last_replicated_sequence) {
    record->view.last_replicated_sequence = old->view.last_replicated_sequence;
  }
  federation->records[index] = record;
  record_free(federation->allocator, old);
  if (out_recovered) {
    *out_recovered = was_stale;
  }
  return pcp_ok_status();
}

pcp_status_t pcp_sched_federation_restore(
    pcp_sched_federation_t* federation,
    const pcp_sched_federation_connect_t* request, int64_t connected_at_wall_ns,
    int64_t last_seen_wall_ns) {
  PCP_RETURN_IF_ERROR_BARE(request_check(request));
  if (record_index(federation, request->gateway_id) >= 0) {
    return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                           "gateway %s is already registered",
                           request->gateway_id);
  }
  if (federation->count >= federation->options.max_gateways) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "the hub holds its maximum of %u gateways",
                           federation->options.max_gateways);
  }
  record_t* record = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      record_build(federation->allocator, request, last_seen_wall_ns, &record));
  record->restored = true;
  record->view.last_seen_ns = INT64_MIN;
  record->view.last_seen_wall_ns = last_seen_wall_ns;
  record->view.connected_at_wall_ns = connected_at_wall_ns;
  record->view.epoch = federation->next_epoch++;
  federation->records[federation->count++] = record;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_federation_remove(pcp_sched_federation_t* federation,
                                         const char* gateway_id) {
  int32_t index = record_index(federation, gateway_id);
  if (index < 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "gateway %s is not registered",
                           gateway_id ? gateway_id : "(null)");
  }
  record_free(federation->allocator, federation->records[index]);
  memmove(&federation->records[index], &federation->records[index + 1],
          (federation->count - (uint32_t)index - 1) * sizeof(record_t*));
  --federation->count;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Views
//===----------------------------------------------------------------------===//

uint32_t pcp_sched_federation_gateway_count(
    const pcp_sched_federation_t* federation) {
  return federation->count;
}

static void view_of(const pcp_sched_federation_t* f, const record_t* record,
                    int64_t now_ns, pcp_sched_federation_gateway_t* out) {
  *out = record->view;
  out->status = record_status(f, record, now_ns);
}

pcp_status_t pcp_sched_federation_gateway_at(
    const pcp_sched_federation_t* federation, uint32_t index, int64_t now_ns,
    pcp_sched_federation_gateway_t* out_gateway) {
  memset(out_gateway, 0, sizeof(*out_gateway));
  if (index >= federation->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway index %u out of range (%u registered)",
                           index, federation->count);
  }
  view_of(federation, federation->records[index], now_ns, out_gateway);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_federation_gateway_find(
    const pcp_sched_federation_t* federation, const char* gateway_id,
    int64_t now_ns, pcp_sched_federation_gateway_t* out_gateway) {
  memset(out_gateway, 0, sizeof(*out_gateway));
  int32_t index = record_index(federation, gateway_id);
  if (index < 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "gateway %s is not registered",
                           gateway_id ? gateway_id : "(null)");
  }
  view_of(federation, federation->records[index], now_ns, out_gateway);
  return pcp_ok_status();
}

void pcp_sched_federation_status_counts(
    const pcp_sched_federation_t* federation, int64_t now_ns,
    uint32_t* out_connected, uint32_t* out_stale) {
  uint32_t connected = 0;
  for (uint32_t i = 0; i < federation->count; ++i) {
    connected += record_status(federation, federation->records[i], now_ns) ==
                 PCP_SCHED_FEDERATION_STATUS_CONNECTED;
  }
  *out_connected = connected;
  *out_stale = federation->count - connected;
}

//===----------------------------------------------------------------------===//
// Placement
//===----------------------------------------------------------------------===//

static const char* const kSelectorKeys[] = {
    "gateway_id",   "service_id",  "executor_id",
    "worker_class", "target_arch", "workers_required",
};

bool pcp_sched_federation_selector_key_known(const char* key) {
  for (size_t i = 0; key && i < PCP_ARRAYSIZE(kSelectorKeys); ++i) {
    if (strcmp(key, kSelectorKeys[i]) == 0) {
      return true;
    }
  }
  return false;
}

static bool field_matches(const char* wanted, const char* have) {
  return !wanted || (have && strcmp(wanted, have) == 0);
}

static bool service_offers(const pcp_sched_federation_service_t* s,
                           const pcp_sched_federation_selector_t* sel) {
  if (sel->service_type) {
    return strcmp(s->service_type, sel->service_type) == 0;
  }
  for (uint32_t c = 0; c < s->capability_count; ++c) {
    if (strcmp(s->capabilities[c], sel->capability) == 0) {
      return true;
    }
  }
  return false;
}

// True when |a| ranks strictly above |b|.
static bool service_better(const pcp_sched_federation_service_t* a,
                           const pcp_sched_federation_service_t* b) {
  bool a_ok = strcmp(a->health_status, "ok") == 0;
  bool b_ok = strcmp(b->health_status, "ok") == 0;
  if (a_ok != b_ok) {
    return a_ok;
  }
  if (a->workers_available != b->workers_available) {
    return a->workers_available > b->workers_available;
  }
  if (a->workers_ready != b->workers_ready) {
    return a->workers_ready > b->workers_ready;
  }
  return a->updated_at_wall_ns > b->updated_at_wall_ns;
}

static void copy_bounded(char* out, size_t capacity, const char* value) {
  snprintf(out, capacity, "%s", value ? value : "");
}

pcp_status_t pcp_sched_federation_place(
    const pcp_sched_federation_t* federation,
    const pcp_sched_federation_selector_t* selector, int64_t now_ns,
    pcp_sched_federation_placement_t* out_placement) {
  memset(out_placement, 0, sizeof(*out_placement));
  if (!selector || (!selector->capability == !selector->service_type)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement needs exactly one of capability and "
                           "service_type");
  }
  if (selector->workers_required < 0 ||
      selector->workers_required > PCP_SCHED_FEDERATION_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.workers_required must be 0..%d (got "
                           "%lld)",
                           PCP_SCHED_FEDERATION_MAX_WORKERS,
                           (long long)selector->workers_required);
  }
  const struct {
    const char* name;
    const char* value;
  } texts[] = {
      {"placement.gateway_id", selector->gateway_id},
      {"placement.service_id", selector->service_id},
      {"placement.executor_id", selector->executor_id},
      {"placement.worker_class", selector->worker_class},
      {"placement.target_arch", selector->target_arch},
      {"capability", selector->capability},
      {"service_type", selector->service_type},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(texts); ++i) {
    PCP_RETURN_IF_ERROR_BARE(text_check(texts[i].name, texts[i].value,
                                        PCP_SCHED_FEDERATION_ID_MAX_LENGTH,
                                        false, false));
  }
  const bool accept_stale = federation->options.bug_accept_stale;
  if (selector->gateway_id) {
    int32_t index = record_index(federation, selector->gateway_id);
    if (index < 0) {
      return pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "gateway %s is not registered",
                             selector->gateway_id);
    }
    if (!accept_stale &&
        record_status(federation, federation->records[index], now_ns) ==
            PCP_SCHED_FEDERATION_STATUS_STALE) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "gateway %s is stale (no connect within %d "
                             "heartbeat intervals)",
                             selector->gateway_id,
                             PCP_SCHED_FEDERATION_STALE_INTERVALS);
    }
  }
  const record_t* best_record = NULL;
  const pcp_sched_federation_service_t* best = NULL;
  // How far candidates got, to say which filter emptied the set.
  uint32_t offering = 0, matching = 0, candidates = 0;
  for (uint32_t g = 0; g < federation->count; ++g) {
    const record_t* record = federation->records[g];
    if (selector->gateway_id &&
        strcmp(record->view.gateway_id, selector->gateway_id) != 0) {
      continue;
    }
    if (!accept_stale && record_status(federation, record, now_ns) ==
                             PCP_SCHED_FEDERATION_STATUS_STALE) {
      continue;
    }
    for (uint32_t s = 0; s < record->view.service_count; ++s) {
      const pcp_sched_federation_service_t* service = &record->services[s];
      if (!service_offers(service, selector)) {
        continue;
      }
      ++offering;
      if (!field_matches(selector->service_id, service->service_id) ||
          !field_matches(selector->executor_id, service->executor_id) ||
          !field_matches(selector->worker_class, service->worker_class) ||
          !field_matches(selector->target_arch, service->target_arch)) {
        continue;
      }
      ++matching;
      if (service->workers_available < selector->workers_required) {
        continue;
      }
      ++candidates;
      if (!best || service_better(service, best)) {
        best = service;
        best_record = record;
      }
    }
  }
  const char* wanted =
      selector->capability ? selector->capability : selector->service_type;
  if (!best) {
    if (offering == 0) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "no connected gateway offers %s", wanted);
    }
    if (matching == 0) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "%u connected service(s) offer %s but none "
                             "matches the placement fields",
                             offering, wanted);
    }
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "%u matching service(s) offer %s but none has "
                           "%lld workers available",
                           matching, wanted,
                           (long long)selector->workers_required);
  }
  pcp_sched_federation_placement_t* p = out_placement;
  copy_bounded(p->gateway_id, sizeof(p->gateway_id),
               best_record->view.gateway_id);
  copy_bounded(p->lab_id, sizeof(p->lab_id), best_record->view.lab_id);
  copy_bounded(p->base_url, sizeof(p->base_url), best_record->view.base_url);
  copy_bounded(p->service_id, sizeof(p->service_id), best->service_id);
  copy_bounded(p->executor_id, sizeof(p->executor_id), best->executor_id);
  copy_bounded(p->service_type, sizeof(p->service_type), best->service_type);
  p->workers_available = best->workers_available;
  p->epoch = best_record->view.epoch;
  p->candidate_count = candidates;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_federation_placement_check(
    const pcp_sched_federation_t* federation,
    const pcp_sched_federation_placement_t* placement, int64_t now_ns) {
  int32_t index = record_index(federation, placement->gateway_id);
  if (index < 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "gateway %s was removed after the placement",
                           placement->gateway_id);
  }
  const record_t* record = federation->records[index];
  if (record_status(federation, record, now_ns) ==
      PCP_SCHED_FEDERATION_STATUS_STALE) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "gateway %s went stale after the placement",
                           placement->gateway_id);
  }
  if (record->view.epoch != placement->epoch) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "gateway %s came back as a new registration "
                           "after the placement",
                           placement->gateway_id);
  }
  return pcp_ok_status();
}
