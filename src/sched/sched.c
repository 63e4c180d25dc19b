// SPDX-License-Identifier: Apache-2.0
//
// The scheduler keeps three fixed-size tables (workers, leases,
// reservations) allocated once at create, linked by slot indices. Lookups are
// linear scans: the registry is bounded (1024 by default) and every call is
// O(workers), which is cheaper than keeping a hash index consistent across
// rejoin, eviction and removal. Orders that callers can observe (candidates,
// events) are total orders on ids, never slot order, so results do not depend
// on which slot an entry happened to land in.

#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

// Backend names come from the one table in base (base.h "Backends"): the
// scheduler's backend numbers are base's kinds, and a worker class is a kind
// shifted by one to make room for ANY.
static_assert((int)PCP_SCHED_BACKEND_COUNT_ == (int)PCP_BACKEND_KIND_COUNT_ &&
                  PCP_SCHED_BACKEND_CUDA == (int)PCP_BACKEND_KIND_CUDA &&
                  PCP_SCHED_BACKEND_ROCM == (int)PCP_BACKEND_KIND_ROCM &&
                  PCP_SCHED_BACKEND_VULKAN == (int)PCP_BACKEND_KIND_VULKAN &&
                  PCP_SCHED_BACKEND_METAL == (int)PCP_BACKEND_KIND_METAL,
              "sched backends are base's backend kinds");
static_assert((int)PCP_SCHED_WORKER_CLASS_COUNT_ ==
                      PCP_BACKEND_KIND_COUNT_ + 1 &&
                  (int)PCP_SCHED_WORKER_CLASS_CPU == PCP_BACKEND_KIND_CPU + 1 &&
                  (int)PCP_SCHED_WORKER_CLASS_METAL ==
                      PCP_BACKEND_KIND_METAL + 1,
              "a worker class is a backend kind + 1");
static const char* const kStateNames[PCP_SCHED_WORKER_STATE_COUNT_] = {
    "joining", "ready", "busy", "draining", "lost"};
static const char* const kOwnerNames[PCP_SCHED_OWNER_COUNT_] = {
    "inference", "training", "rl", "jobs"};
static const char* const kEventNames[] = {"none",
                                          "worker_lost",
                                          "lease_reassigned",
                                          "lease_detached",
                                          "lease_resumed",
                                          "lease_expired",
                                          "reservation_expired",
                                          "reservation_broken"};

const char* pcp_sched_backend_name(pcp_sched_backend_t backend) {
  return (unsigned)backend < PCP_SCHED_BACKEND_COUNT_
             ? pcp_backend_kind_name((pcp_backend_kind_t)backend)
             : "unknown";
}
const char* pcp_sched_worker_class_name(pcp_sched_worker_class_t c) {
  if (c == PCP_SCHED_WORKER_CLASS_ANY) {
    return pcp_backend_kind_name(PCP_BACKEND_KIND_ANY);
  }
  return (unsigned)c < PCP_SCHED_WORKER_CLASS_COUNT_
             ? pcp_backend_kind_name((pcp_backend_kind_t)(c - 1))
             : "unknown";
}
const char* pcp_sched_worker_state_name(pcp_sched_worker_state_t state) {
  return (unsigned)state < PCP_SCHED_WORKER_STATE_COUNT_ ? kStateNames[state]
                                                         : "unknown";
}
const char* pcp_sched_owner_name(pcp_sched_owner_t owner) {
  return (unsigned)owner < PCP_SCHED_OWNER_COUNT_ ? kOwnerNames[owner]
                                                  : "unknown";
}
const char* pcp_sched_event_kind_name(pcp_sched_event_kind_t kind) {
  return (unsigned)kind < PCP_ARRAYSIZE(kEventNames) ? kEventNames[kind]
                                                     : "unknown";
}

static bool parse_name(pcp_string_view_t name, const char* const* names,
                       int count, int* out_index) {
  for (int i = 0; i < count; ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(names[i]))) {
      *out_index = i;
      return true;
    }
  }
  return false;
}

bool pcp_sched_backend_parse(pcp_string_view_t name,
                             pcp_sched_backend_t* out_backend) {
  pcp_backend_kind_t kind;
  if (!pcp_backend_kind_parse(name, PCP_BACKEND_PARSE_FLAG_NONE, &kind)) {
    return false;
  }
  *out_backend = (pcp_sched_backend_t)kind;
  return true;
}

bool pcp_sched_worker_class_parse(pcp_string_view_t name,
                                  pcp_sched_worker_class_t* out_class) {
  pcp_backend_kind_t kind;
  if (!pcp_backend_kind_parse(name, PCP_BACKEND_PARSE_FLAG_ANY, &kind)) {
    return false;
  }
  *out_class = kind == PCP_BACKEND_KIND_ANY
                   ? PCP_SCHED_WORKER_CLASS_ANY
                   : (pcp_sched_worker_class_t)(kind + 1);
  return true;
}

bool pcp_sched_owner_parse(pcp_string_view_t name,
                           pcp_sched_owner_t* out_owner) {
  int index = 0;
  if (!parse_name(name, kOwnerNames, PCP_SCHED_OWNER_COUNT_, &index)) {
    return false;
  }
  *out_owner = (pcp_sched_owner_t)index;
  return true;
}

pcp_sched_worker_class_t pcp_sched_worker_class_from_backend(
    pcp_sched_backend_t backend) {
  // The class enum is the backend enum shifted past ANY.
  return (pcp_sched_worker_class_t)((int)backend + 1);
}

//===----------------------------------------------------------------------===//
// Tables
//===----------------------------------------------------------------------===//

typedef struct filter_t {
  pcp_sched_worker_class_t worker_class;
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];  // "" = any
  uint64_t min_device_memory_bytes;
  char class_name[PCP_SCHED_CLASS_NAME_MAX_LENGTH + 1];  // "" = any
} filter_t;

typedef struct worker_t {
  bool in_use;
  char id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  pcp_sched_backend_t backend;
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  int32_t device_id;
  uint64_t device_memory_bytes;
  char node_manager_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char class_name[PCP_SCHED_CLASS_NAME_MAX_LENGTH + 1];  // "" = none
  pcp_sched_worker_state_t state;
  int64_t last_heartbeat_ns;
  int64_t lost_at_ns;
  uint32_t load_permille;
  int32_t lease_index;        // -1 when not leased
  int32_t reservation_index;  // -1 when not reserved
  uint64_t lease_grant_count;
} worker_t;

typedef struct lease_t {
  uint64_t id;  // 0: free slot
  pcp_sched_owner_t owner;
  uint64_t tag;
  filter_t filter;
  int32_t worker_index;  // -1: detached
  // The last worker that held it; |home_valid| is cleared when that worker is
  // removed, so that a different device reusing the id cannot resume it.
  char home_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  bool home_valid;
  int64_t detached_deadline_ns;
} lease_t;

typedef struct reservation_t {
  uint64_t id;  // 0: free slot
  pcp_sched_owner_t owner;
  uint64_t tag;
  filter_t filter;
  uint32_t worker_count;
  int64_t deadline_ns;
} reservation_t;

typedef struct policy_t {
  pcp_sched_worker_class_t worker_class;
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint32_t reserved_workers;
  uint32_t max_workers;
} policy_t;

typedef struct candidate_t {
  uint32_t protect;  // other owners' reservations this worker could serve
  uint32_t load_permille;
  uint64_t device_memory_bytes;
  const char* id;
  int32_t index;
} candidate_t;

typedef struct id_index_t {
  uint64_t id;
  int32_t index;
} id_index_t;

struct pcp_sched_t {
  pcp_allocator_t allocator;
  pcp_sched_options_t options;
  policy_t policies[PCP_SCHED_OWNER_COUNT_];
  worker_t* workers;
  uint32_t worker_count;
  lease_t* leases;
  uint32_t lease_count;
  reservation_t* reservations;
  uint32_t reservation_count;
  uint64_t next_lease_id;
  uint64_t next_reservation_id;
  // Cached per-owner counters (the invariant checker recounts them).
  uint32_t leased[PCP_SCHED_OWNER_COUNT_];
  uint32_t detached[PCP_SCHED_OWNER_COUNT_];
  uint32_t reserved_slots[PCP_SCHED_OWNER_COUNT_];
  // During a tick's sweep, workers already past their heartbeat deadline are
  // not candidates: reassigning a lease onto a worker that the same sweep is
  // about to declare lost would only move it twice.
  bool sweeping;
  int64_t sweep_now_ns;
  // Scratch, sized at create so that no call allocates.
  candidate_t* candidates;  // max_workers
  int32_t* picks;           // max_workers
  id_index_t* id_order;     // max(max_leases, max_reservations)
};

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static int64_t add_saturating(int64_t a, int64_t b) {
  if (b > 0 && a > INT64_MAX - b) {
    return INT64_MAX;
  }
  if (b < 0 && a < INT64_MIN - b) {
    return INT64_MIN;
  }
  return a + b;
}

// Names travel into logs, metrics labels and file names, so only the
// sanitized alphabet of upstream s.1.4 is accepted.
static bool name_is_valid(const char* value, size_t max_length,
                          bool allow_empty) {
  if (!value) {
    return allow_empty;
  }
  size_t length = strnlen(value, max_length + 1);
  if (length > max_length) {
    return false;
  }
  if (length == 0) {
    return allow_empty;
  }
  for (size_t i = 0; i < length; ++i) {
    char c = value[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) {
      return false;
    }
  }
  return true;
}

bool pcp_sched_class_name_is_valid(const char* name) {
  return name_is_valid(name, PCP_SCHED_CLASS_NAME_MAX_LENGTH, false);
}

static void copy_name(char* dst, size_t capacity, const char* src) {
  size_t length = src ? strnlen(src, capacity - 1) : 0;
  if (length) {
    memcpy(dst, src, length);
  }
  dst[length] = 0;
}

static void set_worker_id(pcp_sched_worker_id_t* out, const char* id) {
  copy_name(out->value, sizeof(out->value), id);
}

static bool class_matches(pcp_sched_worker_class_t want,
                          pcp_sched_backend_t backend) {
  return want == PCP_SCHED_WORKER_CLASS_ANY ||
         want == pcp_sched_worker_class_from_backend(backend);
}

// An empty |want| admits anything; a worker with no target never matches a
// filter that names one (upstream s.5.2).
static bool target_matches(const char* want, const char* have) {
  return want[0] == 0 || strcmp(want, have) == 0;
}

static bool worker_matches_filter(const worker_t* w, const filter_t* f) {
  // An empty class name in the filter admits every worker; a named one only
  // workers that joined with exactly that name (target_matches' rule).
  return class_matches(f->worker_class, w->backend) &&
         target_matches(f->target, w->target) &&
         target_matches(f->class_name, w->class_name) &&
         w->device_memory_bytes >= f->min_device_memory_bytes;
}

static bool worker_matches_policy(const worker_t* w, const policy_t* p) {
  return class_matches(p->worker_class, w->backend) &&
         target_matches(p->target, w->target);
}

static bool worker_holds(const worker_t* w) {
  return w->lease_index >= 0 || w->reservation_index >= 0;
}

static bool worker_is_free(const worker_t* w) {
  return w->in_use && w->state == PCP_SCHED_WORKER_STATE_READY &&
         !worker_holds(w);
}

static uint32_t owner_held(const pcp_sched_t* s, pcp_sched_owner_t owner) {
  return s->leased[owner] + s->detached[owner] + s->reserved_slots[owner];
}

static bool owner_is_valid(pcp_sched_owner_t owner) {
  return (unsigned)owner < PCP_SCHED_OWNER_COUNT_;
}

static int32_t find_worker(const pcp_sched_t* s, const char* id) {
  if (!id) {
    return -1;
  }
  for (uint32_t i = 0; i < s->options.max_workers; ++i) {
    if (s->workers[i].in_use && strcmp(s->workers[i].id, id) == 0) {
      return (int32_t)i;
    }
  }
  return -1;
}

static int32_t find_lease(const pcp_sched_t* s, uint64_t id) {
  if (id == 0) {
    return -1;
  }
  for (uint32_t i = 0; i < s->options.max_leases; ++i) {
    if (s->leases[i].id == id) {
      return (int32_t)i;
    }
  }
  return -1;
}

static int32_t find_reservation(const pcp_sched_t* s, uint64_t id) {
  if (id == 0) {
    return -1;
  }
  for (uint32_t i = 0; i < s->options.max_reservations; ++i) {
    if (s->reservations[i].id == id) {
      return (int32_t)i;
    }
  }
  return -1;
}

static pcp_status_t worker_not_found(const char* id) {
  if (!id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "worker id is NULL");
  }
  return pcp_make_status(PCP_STATUS_NOT_FOUND,
                         "worker '%.*s' is not registered",
                         PCP_SCHED_WORKER_ID_MAX_LENGTH, id);
}

static pcp_status_t lease_not_found(const pcp_sched_t* s, uint64_t id) {
  if (id != 0 && id < s->next_lease_id) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "lease %llu is no longer live (released, expired "
                           "or never committed)",
                           (unsigned long long)id);
  }
  return pcp_make_status(PCP_STATUS_NOT_FOUND, "lease %llu was never issued",
                         (unsigned long long)id);
}

static pcp_status_t reservation_not_found(uint64_t id) {
  return pcp_make_status(PCP_STATUS_NOT_FOUND,
                         "reservation %llu is not open (unknown, committed, "
                         "released, expired or broken)",
                         (unsigned long long)id);
}

static pcp_status_t filter_from_constraint(const pcp_sched_constraint_t* c,
                                           bool need_count,
                                           filter_t* out_filter) {
  memset(out_filter, 0, sizeof(*out_filter));
  if (!c) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "constraint is NULL");
  }
  if ((unsigned)c->worker_class >= PCP_SCHED_WORKER_CLASS_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "constraint worker class %d is out of range",
                           (int)c->worker_class);
  }
  if (!name_is_valid(c->target, PCP_SCHED_TARGET_MAX_LENGTH, true)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "constraint target is longer than %d bytes or has "
                           "characters outside [A-Za-z0-9._-]",
                           PCP_SCHED_TARGET_MAX_LENGTH);
  }
  if (need_count && c->worker_count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker_count must be at least 1");
  }
  if (need_count && c->worker_count > PCP_SCHED_REQUEST_WORKER_COUNT_MAX) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker_count %u exceeds the limit of %u",
                           c->worker_count, PCP_SCHED_REQUEST_WORKER_COUNT_MAX);
  }
  out_filter->worker_class = c->worker_class;
  copy_name(out_filter->target, sizeof(out_filter->target), c->target);
  out_filter->min_device_memory_bytes = c->min_device_memory_bytes;
  return pcp_ok_status();
}

static pcp_status_t validate_info(const pcp_sched_worker_info_t* info) {
  if (!info) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "worker info is NULL");
  }
  if (!name_is_valid(info->id, PCP_SCHED_WORKER_ID_MAX_LENGTH, false)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker id must be 1..%d bytes of [A-Za-z0-9._-]",
                           PCP_SCHED_WORKER_ID_MAX_LENGTH);
  }
  if ((unsigned)info->backend >= PCP_SCHED_BACKEND_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': backend %d is out of range", info->id,
                           (int)info->backend);
  }
  if (!name_is_valid(info->target, PCP_SCHED_TARGET_MAX_LENGTH, true)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': target must be at most %d bytes of "
                           "[A-Za-z0-9._-]",
                           info->id, PCP_SCHED_TARGET_MAX_LENGTH);
  }
  if (info->device_id < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': device id %d is negative", info->id,
                           (int)info->device_id);
  }
  if (!name_is_valid(info->node_manager_id, PCP_SCHED_WORKER_ID_MAX_LENGTH,
                     true)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': node manager id must be at most %d "
                           "bytes of [A-Za-z0-9._-]",
                           info->id, PCP_SCHED_WORKER_ID_MAX_LENGTH);
  }
  return pcp_ok_status();
}

static void apply_info(worker_t* w, const pcp_sched_worker_info_t* info) {
  copy_name(w->id, sizeof(w->id), info->id);
  w->backend = info->backend;
  copy_name(w->target, sizeof(w->target), info->target);
  w->device_id = info->device_id;
  w->device_memory_bytes = info->device_memory_bytes;
  copy_name(w->node_manager_id, sizeof(w->node_manager_id),
            info->node_manager_id);
}

static void event_clear(pcp_sched_event_t* event) {
  memset(event, 0, sizeof(*event));
  event->kind = PCP_SCHED_EVENT_NONE;
}

//===----------------------------------------------------------------------===//
// Candidate selection (shared by acquire, reserve and reassignment)
//===----------------------------------------------------------------------===//

// secured(R) for every owner: what R holds plus the free workers it could
// take. Only meaningful for owners with reserved_workers > 0.
static void compute_secured(const pcp_sched_t* s,
                            uint32_t secured[PCP_SCHED_OWNER_COUNT_]) {
  for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
    secured[r] = s->leased[r] + s->reserved_slots[r];
  }
  for (uint32_t i = 0; i < s->options.max_workers; ++i) {
    const worker_t* w = &s->workers[i];
    if (!worker_is_free(w)) {
      continue;
    }
    for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
      if (s->policies[r].reserved_workers > 0 &&
          worker_matches_policy(w, &s->policies[r])) {
        secured[r]++;
      }
    }
  }
}

static bool heartbeat_expired(const worker_t* w, int64_t now_ns,
                              int64_t timeout_ns) {
  if (timeout_ns <= 0 || w->state == PCP_SCHED_WORKER_STATE_LOST) {
    return false;
  }
  return now_ns >= add_saturating(w->last_heartbeat_ns, timeout_ns);
}

static int candidate_compare(const void* a_ptr, const void* b_ptr) {
  const candidate_t* a = (const candidate_t*)a_ptr;
  const candidate_t* b = (const candidate_t*)b_ptr;
  if (a->protect != b->protect) {
    return a->protect < b->protect ? -1 : 1;
  }
  if (a->load_permille != b->load_permille) {
    return a->load_permille < b->load_permille ? -1 : 1;
  }
  if (a->device_memory_bytes != b->device_memory_bytes) {
    return a->device_memory_bytes < b->device_memory_bytes ? -1 : 1;
  }
  return strcmp(a->id, b->id);
}

// Chooses up to |want| free workers for |owner| under |filter|, the owner's
// policy and the protection rule, into s->picks. Greedy: candidates no other
// reservation could use come first, so a taken worker rarely blocks a later
// one. |apply_owner_rules| false gives pure capability matching. Returns the
// number picked; nothing is changed.
static uint32_t select_workers(pcp_sched_t* s, pcp_sched_owner_t owner,
                               const filter_t* filter, bool apply_owner_rules,
                               uint32_t want) {
  uint32_t secured[PCP_SCHED_OWNER_COUNT_];
  compute_secured(s, secured);
  uint32_t candidate_count = 0;
  for (uint32_t i = 0; i < s->options.max_workers; ++i) {
    const worker_t* w = &s->workers[i];
    if (!worker_is_free(w)) {
      continue;
    }
    if (filter && !worker_matches_filter(w, filter)) {
      continue;
    }
    if (s->sweeping && heartbeat_expired(w, s->sweep_now_ns,
                                         s->options.heartbeat_timeout_ns)) {
      continue;
    }
    uint32_t protect = 0;
    if (apply_owner_rules) {
      if (!worker_matches_policy(w, &s->policies[owner])) {
        continue;
      }
      for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
        if (r != (int)owner && s->policies[r].reserved_workers > 0 &&
            worker_matches_policy(w, &s->policies[r])) {
          protect++;
        }
      }
    }
    candidate_t* c = &s->candidates[candidate_count++];
    c->protect = protect;
    c->load_permille = w->load_permille;
    c->device_memory_bytes = w->device_memory_bytes;
    c->id = w->id;
    c->index = (int32_t)i;
  }
  if (candidate_count > 1) {
    qsort(s->candidates, candidate_count, sizeof(candidate_t),
          candidate_compare);
  }
  uint32_t picked = 0;
  for (uint32_t k = 0; k < candidate_count && picked < want; ++k) {
    const worker_t* w = &s->workers[s->candidates[k].index];
    bool allowed = true;
    if (apply_owner_rules) {
      for (int r = 0; r < PCP_SCHED_OWNER_COUNT_ && allowed; ++r) {
        const policy_t* p = &s->policies[r];
        if (r != (int)owner && p->reserved_workers > 0 &&
            worker_matches_policy(w, p) && secured[r] <= p->reserved_workers) {
          allowed = false;
        }
      }
      if (!allowed) {
        continue;
      }
      for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
        if (r != (int)owner && s->policies[r].reserved_workers > 0 &&
            worker_matches_policy(w, &s->policies[r])) {
          secured[r]--;
        }
      }
    }
    s->picks[picked++] = s->candidates[k].index;
  }
  return picked;
}

//===----------------------------------------------------------------------===//
// Lifetime
//===----------------------------------------------------------------------===//

void pcp_sched_options_initialize(pcp_sched_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->max_workers = 1024;
  out_options->max_leases = 2048;
  out_options->max_reservations = 64;
  out_options->heartbeat_timeout_ns = 10ll * 1000 * 1000 * 1000;
  out_options->lease_rejoin_grace_ns = 30ll * 1000 * 1000 * 1000;
}

static void policy_default(policy_t* p) {
  memset(p, 0, sizeof(*p));
  p->worker_class = PCP_SCHED_WORKER_CLASS_ANY;
  p->max_workers = PCP_SCHED_UNLIMITED;
}

pcp_status_t pcp_sched_create(const pcp_sched_options_t* options,
                              pcp_allocator_t allocator,
                              pcp_sched_t** out_sched) {
  if (!out_sched) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "out_sched is NULL");
  }
  *out_sched = NULL;
  if (!options) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "options is NULL");
  }
  if (options->max_workers == 0 ||
      options->max_workers > PCP_SCHED_REGISTRY_WORKER_COUNT_MAX) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "max_workers %u must be in 1..%u",
        options->max_workers, PCP_SCHED_REGISTRY_WORKER_COUNT_MAX);
  }
  if (options->max_leases == 0 ||
      options->max_leases > 4u * PCP_SCHED_REGISTRY_WORKER_COUNT_MAX) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "max_leases %u must be in 1..%u",
        options->max_leases, 4u * PCP_SCHED_REGISTRY_WORKER_COUNT_MAX);
  }
  if (options->max_reservations == 0 ||
      options->max_reservations > PCP_SCHED_REGISTRY_WORKER_COUNT_MAX) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "max_reservations %u must be in 1..%u",
        options->max_reservations, PCP_SCHED_REGISTRY_WORKER_COUNT_MAX);
  }
  if (options->heartbeat_timeout_ns < 0 || options->lease_rejoin_grace_ns < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "heartbeat_timeout_ns and lease_rejoin_grace_ns "
                           "must not be negative");
  }
  pcp_sched_t* s = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, sizeof(*s), (void**)&s),
                      "allocating the scheduler");
  s->allocator = allocator;
  s->options = *options;
  s->next_lease_id = 1;
  s->next_reservation_id = 1;
  for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
    policy_default(&s->policies[r]);
  }
  uint32_t id_order_count = options->max_leases > options->max_reservations
                                ? options->max_leases
                                : options->max_reservations;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, sizeof(worker_t) * options->max_workers, (void**)&s->workers);
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, sizeof(lease_t) * options->max_leases, (void**)&s->leases);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, sizeof(reservation_t) * options->max_reservations,
        (void**)&s->reservations);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator,
                                  sizeof(candidate_t) * options->max_workers,
                                  (void**)&s->candidates);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, sizeof(int32_t) * options->max_workers, (void**)&s->picks);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, sizeof(id_index_t) * id_order_count, (void**)&s->id_order);
  }
  if (status) {
    pcp_sched_release(s);
    return pcp_status_annotate_f(status, "allocating scheduler tables");
  }
  for (uint32_t i = 0; i < options->max_workers; ++i) {
    s->workers[i].lease_index = -1;
    s->workers[i].reservation_index = -1;
  }
  *out_sched = s;
  return pcp_ok_status();
}

void pcp_sched_release(pcp_sched_t* sched) {
  if (!sched) {
    return;
  }
  pcp_allocator_t allocator = sched->allocator;
  pcp_allocator_free(allocator, sched->workers);
  pcp_allocator_free(allocator, sched->leases);
  pcp_allocator_free(allocator, sched->reservations);
  pcp_allocator_free(allocator, sched->candidates);
  pcp_allocator_free(allocator, sched->picks);
  pcp_allocator_free(allocator, sched->id_order);
  pcp_allocator_free(allocator, sched);
}

//===----------------------------------------------------------------------===//
// Owner policies
//===----------------------------------------------------------------------===//

pcp_status_t pcp_sched_owner_policy_set(
    pcp_sched_t* sched, pcp_sched_owner_t owner,
    const pcp_sched_owner_policy_t* policy) {
  if (!owner_is_valid(owner)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "owner %d is out of range", (int)owner);
  }
  if (!policy) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "policy is NULL");
  }
  if ((unsigned)policy->worker_class >= PCP_SCHED_WORKER_CLASS_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "policy worker class %d is out of range",
                           (int)policy->worker_class);
  }
  if (!name_is_valid(policy->target, PCP_SCHED_TARGET_MAX_LENGTH, true)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "policy target must be at most %d bytes of "
                           "[A-Za-z0-9._-]",
                           PCP_SCHED_TARGET_MAX_LENGTH);
  }
  if (policy->reserved_workers > policy->max_workers) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "owner %s: reserved_workers %u exceeds max_workers "
                           "%u",
                           pcp_sched_owner_name(owner),
                           policy->reserved_workers, policy->max_workers);
  }
  uint32_t held = owner_held(sched, owner);
  if (policy->max_workers < held) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "owner %s holds %u workers, more than the new "
                           "max_workers %u; release some first",
                           pcp_sched_owner_name(owner), held,
                           policy->max_workers);
  }
  policy_t next;
  policy_default(&next);
  next.worker_class = policy->worker_class;
  copy_name(next.target, sizeof(next.target), policy->target);
  next.reserved_workers = policy->reserved_workers;
  next.max_workers = policy->max_workers;
  for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
    const worker_t* w = &sched->workers[i];
    if (!w->in_use) {
      continue;
    }
    bool held_by_owner =
        (w->lease_index >= 0 && sched->leases[w->lease_index].owner == owner) ||
        (w->reservation_index >= 0 &&
         sched->reservations[w->reservation_index].owner == owner);
    if (held_by_owner && !worker_matches_policy(w, &next)) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "owner %s holds worker '%s', which the new policy "
                             "would not admit; release it first",
                             pcp_sched_owner_name(owner), w->id);
    }
  }
  sched->policies[owner] = next;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_owner_stats_query(const pcp_sched_t* sched,
                                         pcp_sched_owner_t owner,
                                         pcp_sched_owner_stats_t* out_stats) {
  if (!owner_is_valid(owner) || !out_stats) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "owner %d is out of range or out_stats is NULL",
                           (int)owner);
  }
  memset(out_stats, 0, sizeof(*out_stats));
  out_stats->leased_workers = sched->leased[owner];
  out_stats->detached_leases = sched->detached[owner];
  out_stats->reserved_slots = sched->reserved_slots[owner];
  out_stats->reserved_workers = sched->policies[owner].reserved_workers;
  out_stats->max_workers = sched->policies[owner].max_workers;
  // select_workers only writes scratch; the visible state is unchanged, so
  // the const is honoured where it matters.
  pcp_sched_t* scratch = (pcp_sched_t*)sched;
  uint32_t available = select_workers(scratch, owner, NULL, true, UINT32_MAX);
  uint32_t room = sched->policies[owner].max_workers - owner_held(sched, owner);
  out_stats->available_workers = available < room ? available : room;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_owner_leases_list(const pcp_sched_t* sched,
                                         pcp_sched_owner_t owner,
                                         uint64_t* out_lease_ids,
                                         size_t capacity, size_t* out_count) {
  if (!owner_is_valid(owner) || !out_count ||
      (capacity > 0 && !out_lease_ids)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "bad owner %d or NULL output", (int)owner);
  }
  // Lease ids grow monotonically, so an insertion into a sorted prefix keeps
  // the output ascending without another scratch table.
  size_t count = 0;
  for (uint32_t i = 0; i < sched->options.max_leases; ++i) {
    const lease_t* l = &sched->leases[i];
    if (l->id == 0 || l->owner != owner) {
      continue;
    }
    if (count < capacity) {
      size_t k = count;
      while (k > 0 && out_lease_ids[k - 1] > l->id) {
        out_lease_ids[k] = out_lease_ids[k - 1];
        --k;
      }
      out_lease_ids[k] = l->id;
    } else {
      // Keep the smallest |capacity| ids.
      if (capacity > 0 && l->id < out_lease_ids[capacity - 1]) {
        size_t k = capacity - 1;
        while (k > 0 && out_lease_ids[k - 1] > l->id) {
          out_lease_ids[k] = out_lease_ids[k - 1];
          --k;
        }
        out_lease_ids[k] = l->id;
      }
    }
    ++count;
  }
  *out_count = count;
  if (count > capacity) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "owner %s has %zu leases; capacity is %zu",
                           pcp_sched_owner_name(owner), count, capacity);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Lease and reservation mechanics
//===----------------------------------------------------------------------===//

static void lease_attach(pcp_sched_t* s, int32_t lease_index,
                         int32_t worker_index) {
  lease_t* l = &s->leases[lease_index];
  worker_t* w = &s->workers[worker_index];
  PCP_ASSERT(w->lease_index < 0 && w->reservation_index < 0);
  l->worker_index = worker_index;
  copy_name(l->home_id, sizeof(l->home_id), w->id);
  l->home_valid = true;
  l->detached_deadline_ns = 0;
  w->lease_index = lease_index;
  if (w->state == PCP_SCHED_WORKER_STATE_READY) {
    w->state = PCP_SCHED_WORKER_STATE_BUSY;
  }
  w->lease_grant_count++;
  s->leased[l->owner]++;
}

// Takes a free slot and fills a fresh lease; the caller attaches it.
static int32_t lease_allocate(pcp_sched_t* s, pcp_sched_owner_t owner,
                              uint64_t tag, const filter_t* filter) {
  for (uint32_t i = 0; i < s->options.max_leases; ++i) {
    lease_t* l = &s->leases[i];
    if (l->id != 0) {
      continue;
    }
    memset(l, 0, sizeof(*l));
    l->id = s->next_lease_id++;
    l->owner = owner;
    l->tag = tag;
    l->filter = *filter;
    l->worker_index = -1;
    s->lease_count++;
    return (int32_t)i;
  }
  PCP_ASSERT(false && "lease table full after the capacity check");
  return -1;
}

static void worker_unhold(worker_t* w) {
  w->lease_index = -1;
  w->reservation_index = -1;
  if (w->state == PCP_SCHED_WORKER_STATE_BUSY) {
    w->state = PCP_SCHED_WORKER_STATE_READY;
  }
}

static void lease_free(pcp_sched_t* s, int32_t lease_index) {
  lease_t* l = &s->leases[lease_index];
  if (l->worker_index >= 0) {
    worker_unhold(&s->workers[l->worker_index]);
    s->leased[l->owner]--;
  } else {
    s->detached[l->owner]--;
  }
  memset(l, 0, sizeof(*l));
  l->worker_index = -1;
  s->lease_count--;
}

static void reservation_free(pcp_sched_t* s, int32_t reservation_index) {
  reservation_t* r = &s->reservations[reservation_index];
  for (uint32_t i = 0; i < s->options.max_workers; ++i) {
    worker_t* w = &s->workers[i];
    if (w->in_use && w->reservation_index == reservation_index) {
      worker_unhold(w);
      s->reserved_slots[r->owner]--;
    }
  }
  memset(r, 0, sizeof(*r));
  s->reservation_count--;
}

static void reservation_hold(pcp_sched_t* s, int32_t reservation_index,
                             int32_t worker_index) {
  worker_t* w = &s->workers[worker_index];
  PCP_ASSERT(!worker_holds(w));
  w->reservation_index = reservation_index;
  if (w->state == PCP_SCHED_WORKER_STATE_READY) {
    w->state = PCP_SCHED_WORKER_STATE_BUSY;
  }
  s->reserved_slots[s->reservations[reservation_index].owner]++;
}

// Marks |w| lost and deals with what it held (see sched.h).
static void worker_lose(pcp_sched_t* s, int32_t worker_index, int64_t now_ns,
                        pcp_sched_event_t* out_event) {
  worker_t* w = &s->workers[worker_index];
  event_clear(out_event);
  out_event->worker_lost = true;
  set_worker_id(&out_event->worker_id, w->id);
  int32_t lease_index = w->lease_index;
  int32_t reservation_index = w->reservation_index;
  w->lease_index = -1;
  w->reservation_index = -1;
  w->state = PCP_SCHED_WORKER_STATE_LOST;
  w->lost_at_ns = now_ns;
  if (lease_index >= 0) {
    lease_t* l = &s->leases[lease_index];
    l->worker_index = -1;
    s->leased[l->owner]--;
    out_event->owner = l->owner;
    out_event->lease_id = l->id;
    out_event->tag = l->tag;
    // Same owner, same count: only the worker changes, so max_workers is
    // untouched, but other owners' reservations still protect their workers.
    if (select_workers(s, l->owner, &l->filter, true, 1) == 1) {
      lease_attach(s, lease_index, s->picks[0]);
      out_event->kind = PCP_SCHED_EVENT_LEASE_REASSIGNED;
      set_worker_id(&out_event->new_worker_id, s->workers[s->picks[0]].id);
    } else {
      l->detached_deadline_ns =
          add_saturating(now_ns, s->options.lease_rejoin_grace_ns);
      s->detached[l->owner]++;
      out_event->kind = PCP_SCHED_EVENT_LEASE_DETACHED;
    }
  } else if (reservation_index >= 0) {
    reservation_t* r = &s->reservations[reservation_index];
    s->reserved_slots[r->owner]--;
    out_event->owner = r->owner;
    out_event->reservation_id = r->id;
    out_event->tag = r->tag;
    // Nothing has run on a reserved worker yet, so a replacement is
    // invisible to the caller; without one the reservation cannot be
    // committed whole, and holding the rest would only block others.
    if (select_workers(s, r->owner, &r->filter, true, 1) == 1) {
      reservation_hold(s, reservation_index, s->picks[0]);
      event_clear(out_event);
      out_event->worker_lost = true;
      set_worker_id(&out_event->worker_id, w->id);
    } else {
      reservation_free(s, reservation_index);
      out_event->kind = PCP_SCHED_EVENT_RESERVATION_BROKEN;
    }
  }
}

// Forgets a LOST worker. Detached leases it held lose their home.
static void worker_forget(pcp_sched_t* s, int32_t worker_index) {
  worker_t* w = &s->workers[worker_index];
  PCP_ASSERT(w->state == PCP_SCHED_WORKER_STATE_LOST && !worker_holds(w));
  for (uint32_t i = 0; i < s->options.max_leases; ++i) {
    lease_t* l = &s->leases[i];
    if (l->id != 0 && l->worker_index < 0 && l->home_valid &&
        strcmp(l->home_id, w->id) == 0) {
      l->home_valid = false;
    }
  }
  memset(w, 0, sizeof(*w));
  w->lease_index = -1;
  w->reservation_index = -1;
  s->worker_count--;
}

//===----------------------------------------------------------------------===//
// Worker registry
//===----------------------------------------------------------------------===//

pcp_status_t pcp_sched_worker_join(pcp_sched_t* sched,
                                   const pcp_sched_worker_info_t* info,
                                   int64_t now_ns) {
  PCP_RETURN_IF_ERROR_BARE(validate_info(info));
  int32_t index = find_worker(sched, info->id);
  if (index >= 0) {
    worker_t* w = &sched->workers[index];
    if (w->state != PCP_SCHED_WORKER_STATE_LOST) {
      return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                             "worker '%s' is already joined (state %s); mark "
                             "it lost before it rejoins",
                             w->id, pcp_sched_worker_state_name(w->state));
    }
    // Rejoin: identity, history and lost_at_ns stay; what it can do may have
    // changed (a driver update, a different target).
    apply_info(w, info);
    w->class_name[0] = 0;  // the joiner sets it again
    w->state = PCP_SCHED_WORKER_STATE_JOINING;
    w->last_heartbeat_ns = now_ns;
    w->load_permille = 0;
    return pcp_ok_status();
  }
  if (sched->worker_count == sched->options.max_workers) {
    // Evict the worker lost longest ago (ties by id) so that dead entries
    // never lock live workers out.
    int32_t victim = -1;
    for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
      const worker_t* w = &sched->workers[i];
      if (!w->in_use || w->state != PCP_SCHED_WORKER_STATE_LOST) {
        continue;
      }
      if (victim < 0) {
        victim = (int32_t)i;
        continue;
      }
      const worker_t* v = &sched->workers[victim];
      if (w->lost_at_ns < v->lost_at_ns ||
          (w->lost_at_ns == v->lost_at_ns && strcmp(w->id, v->id) < 0)) {
        victim = (int32_t)i;
      }
    }
    if (victim < 0) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "worker registry is full (%u workers, none "
                             "lost); cannot add '%s'",
                             sched->options.max_workers, info->id);
    }
    worker_forget(sched, victim);
  }
  for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
    worker_t* w = &sched->workers[i];
    if (w->in_use) {
      continue;
    }
    memset(w, 0, sizeof(*w));
    w->in_use = true;
    apply_info(w, info);
    w->state = PCP_SCHED_WORKER_STATE_JOINING;
    w->last_heartbeat_ns = now_ns;
    w->lease_index = -1;
    w->reservation_index = -1;
    sched->worker_count++;
    return pcp_ok_status();
  }
  PCP_ASSERT(false && "worker table has no free slot below its count");
  return pcp_make_status(PCP_STATUS_INTERNAL, "worker table corrupt");
}

// Resumes the lowest-id detached lease whose home is |worker_index|, if any
// is still inside its deadline and still fits.
static void try_resume(pcp_sched_t* s, int32_t worker_index, int64_t now_ns,
                       pcp_sched_event_t* out_event) {
  worker_t* w = &s->workers[worker_index];
  int32_t best = -1;
  for (uint32_t i = 0; i < s->options.max_leases; ++i) {
    const lease_t* l = &s->leases[i];
    if (l->id == 0 || l->worker_index >= 0 || !l->home_valid) {
      continue;
    }
    if (strcmp(l->home_id, w->id) != 0) {
      continue;
    }
    if (now_ns >= l->detached_deadline_ns) {
      continue;
    }
    if (!worker_matches_filter(w, &l->filter) ||
        !worker_matches_policy(w, &s->policies[l->owner])) {
      continue;
    }
    if (best < 0 || l->id < s->leases[best].id) {
      best = (int32_t)i;
    }
  }
  if (best < 0) {
    return;
  }
  lease_t* l = &s->leases[best];
  s->detached[l->owner]--;
  lease_attach(s, best, worker_index);
  out_event->kind = PCP_SCHED_EVENT_LEASE_RESUMED;
  out_event->owner = l->owner;
  out_event->lease_id = l->id;
  out_event->tag = l->tag;
  set_worker_id(&out_event->worker_id, w->id);
  set_worker_id(&out_event->new_worker_id, w->id);
}

pcp_status_t pcp_sched_worker_ready(pcp_sched_t* sched, const char* worker_id,
                                    int64_t now_ns,
                                    pcp_sched_event_t* out_event) {
  pcp_sched_event_t ignored;
  pcp_sched_event_t* event = out_event ? out_event : &ignored;
  event_clear(event);
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  worker_t* w = &sched->workers[index];
  if (w->state != PCP_SCHED_WORKER_STATE_JOINING &&
      w->state != PCP_SCHED_WORKER_STATE_DRAINING) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is %s; only a joining or draining "
                           "worker can become ready",
                           w->id, pcp_sched_worker_state_name(w->state));
  }
  w->state = worker_holds(w) ? PCP_SCHED_WORKER_STATE_BUSY
                             : PCP_SCHED_WORKER_STATE_READY;
  if (w->state == PCP_SCHED_WORKER_STATE_READY) {
    try_resume(sched, index, now_ns, event);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_class_name_set(pcp_sched_t* sched,
                                             const char* worker_id,
                                             const char* class_name) {
  if (class_name && class_name[0] &&
      !pcp_sched_class_name_is_valid(class_name)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': class name must be 1..%d bytes of "
                           "[A-Za-z0-9._-]",
                           worker_id ? worker_id : "",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  worker_t* w = &sched->workers[index];
  if (worker_holds(w) || w->state == PCP_SCHED_WORKER_STATE_LOST) {
    // A held worker's class is what its lease was matched on.
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' holds a lease or reservation slot, or "
                           "is lost: its class cannot change now",
                           w->id);
  }
  copy_name(w->class_name, sizeof(w->class_name), class_name);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_update(pcp_sched_t* sched,
                                     const pcp_sched_worker_info_t* info) {
  PCP_RETURN_IF_ERROR_BARE(validate_info(info));
  int32_t index = find_worker(sched, info->id);
  if (index < 0) {
    return worker_not_found(info->id);
  }
  worker_t* w = &sched->workers[index];
  if (worker_holds(w) || w->state == PCP_SCHED_WORKER_STATE_LOST) {
    // A held worker was matched against its lease's constraint; changing
    // what it is under the lease would break that match silently.
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is %s%s; capabilities change only on "
                           "a worker that holds nothing",
                           w->id, pcp_sched_worker_state_name(w->state),
                           worker_holds(w) ? " and holds work" : "");
  }
  apply_info(w, info);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_heartbeat(pcp_sched_t* sched,
                                        const char* worker_id, int64_t now_ns,
                                        uint32_t load_permille) {
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  worker_t* w = &sched->workers[index];
  if (load_permille > 1000) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker '%s': load %u permille is above 1000", w->id,
                           load_permille);
  }
  if (w->state == PCP_SCHED_WORKER_STATE_LOST) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is lost; it must rejoin", w->id);
  }
  // A late, reordered heartbeat must not move liveness backwards.
  if (now_ns > w->last_heartbeat_ns) {
    w->last_heartbeat_ns = now_ns;
  }
  w->load_permille = load_permille;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_drain(pcp_sched_t* sched, const char* worker_id) {
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  worker_t* w = &sched->workers[index];
  if (w->state == PCP_SCHED_WORKER_STATE_JOINING ||
      w->state == PCP_SCHED_WORKER_STATE_LOST) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is %s and cannot drain", w->id,
                           pcp_sched_worker_state_name(w->state));
  }
  w->state = PCP_SCHED_WORKER_STATE_DRAINING;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_mark_lost(pcp_sched_t* sched,
                                        const char* worker_id, int64_t now_ns,
                                        pcp_sched_event_t* out_event) {
  pcp_sched_event_t ignored;
  pcp_sched_event_t* event = out_event ? out_event : &ignored;
  event_clear(event);
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  if (sched->workers[index].state == PCP_SCHED_WORKER_STATE_LOST) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is already lost", worker_id);
  }
  worker_lose(sched, index, now_ns, event);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_remove(pcp_sched_t* sched, const char* worker_id,
                                     int64_t now_ns,
                                     pcp_sched_event_t* out_event) {
  pcp_sched_event_t ignored;
  pcp_sched_event_t* event = out_event ? out_event : &ignored;
  event_clear(event);
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  if (sched->workers[index].state != PCP_SCHED_WORKER_STATE_LOST) {
    worker_lose(sched, index, now_ns, event);
  }
  worker_forget(sched, index);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_worker_query(const pcp_sched_t* sched,
                                    const char* worker_id,
                                    pcp_sched_worker_status_t* out_status) {
  if (!out_status) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "out_status is NULL");
  }
  memset(out_status, 0, sizeof(*out_status));
  int32_t index = find_worker(sched, worker_id);
  if (index < 0) {
    return worker_not_found(worker_id);
  }
  const worker_t* w = &sched->workers[index];
  set_worker_id(&out_status->id, w->id);
  out_status->backend = w->backend;
  out_status->worker_class = pcp_sched_worker_class_from_backend(w->backend);
  copy_name(out_status->target, sizeof(out_status->target), w->target);
  out_status->device_id = w->device_id;
  out_status->device_memory_bytes = w->device_memory_bytes;
  set_worker_id(&out_status->node_manager_id, w->node_manager_id);
  copy_name(out_status->class_name, sizeof(out_status->class_name),
            w->class_name);
  out_status->state = w->state;
  out_status->last_heartbeat_ns = w->last_heartbeat_ns;
  out_status->lost_at_ns = w->lost_at_ns;
  out_status->load_permille = w->load_permille;
  out_status->lease_grant_count = w->lease_grant_count;
  if (w->lease_index >= 0) {
    out_status->lease_id = sched->leases[w->lease_index].id;
    out_status->owner = sched->leases[w->lease_index].owner;
  }
  if (w->reservation_index >= 0) {
    out_status->reservation_id = sched->reservations[w->reservation_index].id;
    out_status->owner = sched->reservations[w->reservation_index].owner;
  }
  return pcp_ok_status();
}

uint32_t pcp_sched_worker_count(const pcp_sched_t* sched,
                                pcp_sched_worker_state_t state) {
  if (state == PCP_SCHED_WORKER_STATE_COUNT_) {
    return sched->worker_count;
  }
  uint32_t count = 0;
  for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
    if (sched->workers[i].in_use && sched->workers[i].state == state) {
      ++count;
    }
  }
  return count;
}

//===----------------------------------------------------------------------===//
// Matching and leases
//===----------------------------------------------------------------------===//

pcp_status_t pcp_sched_worker_match(const pcp_sched_t* sched,
                                    const pcp_sched_constraint_t* constraint,
                                    pcp_sched_worker_id_t* out_worker_ids,
                                    size_t capacity, size_t* out_count) {
  if (!out_count || (capacity > 0 && !out_worker_ids)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "NULL output");
  }
  *out_count = 0;
  filter_t filter;
  PCP_RETURN_IF_ERROR_BARE(filter_from_constraint(constraint, false, &filter));
  // Only scratch tables are written (see pcp_sched_owner_stats_query).
  pcp_sched_t* scratch = (pcp_sched_t*)sched;
  uint32_t count = select_workers(scratch, PCP_SCHED_OWNER_INFERENCE, &filter,
                                  false, UINT32_MAX);
  for (uint32_t k = 0; k < count && k < capacity; ++k) {
    set_worker_id(&out_worker_ids[k], sched->workers[sched->picks[k]].id);
  }
  *out_count = count;
  if (count > capacity) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%u workers match; capacity is %zu", count,
                           capacity);
  }
  return pcp_ok_status();
}

// Checks shared by acquire and reserve.
static pcp_status_t check_request(const pcp_sched_t* s, pcp_sched_owner_t owner,
                                  const pcp_sched_constraint_t* constraint,
                                  filter_t* out_filter) {
  memset(out_filter, 0, sizeof(*out_filter));
  if (!owner_is_valid(owner)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "owner %d is out of range", (int)owner);
  }
  PCP_RETURN_IF_ERROR_BARE(
      filter_from_constraint(constraint, true, out_filter));
  uint32_t held = owner_held(s, owner);
  uint32_t max = s->policies[owner].max_workers;
  if (constraint->worker_count > max - held) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "owner %s holds %u of at most %u workers; %u more "
                           "would exceed it",
                           pcp_sched_owner_name(owner), held, max,
                           constraint->worker_count);
  }
  return pcp_ok_status();
}

static pcp_status_t not_enough_workers(const pcp_sched_t* s,
                                       pcp_sched_owner_t owner,
                                       const filter_t* f, uint32_t want,
                                       uint32_t found) {
  return pcp_make_status(
      PCP_STATUS_UNAVAILABLE,
      "owner %s needs %u workers (class %s, target %s, worker class %s, "
      "memory >= %llu); %u eligible (%u ready in the registry)",
      pcp_sched_owner_name(owner), want,
      pcp_sched_worker_class_name(f->worker_class),
      f->target[0] ? f->target : "any",
      f->class_name[0] ? f->class_name : "any",
      (unsigned long long)f->min_device_memory_bytes, found,
      pcp_sched_worker_count(s, PCP_SCHED_WORKER_STATE_READY));
}

pcp_status_t pcp_sched_lease_acquire(pcp_sched_t* sched,
                                     pcp_sched_owner_t owner,
                                     const pcp_sched_constraint_t* constraint,
                                     uint64_t tag, uint64_t* out_lease_ids,
                                     size_t capacity) {
  return pcp_sched_lease_acquire_class(sched, owner, constraint, NULL, tag,
                                       out_lease_ids, capacity);
}

pcp_status_t pcp_sched_lease_acquire_class(
    pcp_sched_t* sched, pcp_sched_owner_t owner,
    const pcp_sched_constraint_t* constraint, const char* class_name,
    uint64_t tag, uint64_t* out_lease_ids, size_t capacity) {
  if (class_name && class_name[0] &&
      !pcp_sched_class_name_is_valid(class_name)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker class name must be 1..%d bytes of "
                           "[A-Za-z0-9._-]",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  filter_t filter;
  PCP_RETURN_IF_ERROR_BARE(check_request(sched, owner, constraint, &filter));
  copy_name(filter.class_name, sizeof(filter.class_name), class_name);
  uint32_t want = constraint->worker_count;
  if (!out_lease_ids || capacity < want) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "out_lease_ids holds %zu ids; %u needed", capacity,
                           want);
  }
  if (want > sched->options.max_leases - sched->lease_count) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "lease table is full (%u of %u live)",
                           sched->lease_count, sched->options.max_leases);
  }
  uint32_t found = select_workers(sched, owner, &filter, true, want);
  if (found < want) {
    return not_enough_workers(sched, owner, &filter, want, found);
  }
  for (uint32_t k = 0; k < want; ++k) {
    int32_t lease_index = lease_allocate(sched, owner, tag, &filter);
    lease_attach(sched, lease_index, sched->picks[k]);
    out_lease_ids[k] = sched->leases[lease_index].id;
  }
  return pcp_ok_status();
}

pcp_status_t pcp_sched_lease_release(pcp_sched_t* sched, uint64_t lease_id) {
  int32_t index = find_lease(sched, lease_id);
  if (index < 0) {
    return lease_not_found(sched, lease_id);
  }
  lease_free(sched, index);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_lease_transfer(pcp_sched_t* sched, uint64_t lease_id,
                                      pcp_sched_owner_t new_owner) {
  if (!owner_is_valid(new_owner)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "owner %d is out of range", (int)new_owner);
  }
  int32_t index = find_lease(sched, lease_id);
  if (index < 0) {
    return lease_not_found(sched, lease_id);
  }
  lease_t* l = &sched->leases[index];
  if (l->owner == new_owner) {
    return pcp_ok_status();
  }
  const policy_t* p = &sched->policies[new_owner];
  if (owner_held(sched, new_owner) >= p->max_workers) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "owner %s already holds its max of %u workers",
                           pcp_sched_owner_name(new_owner), p->max_workers);
  }
  if (l->worker_index >= 0 &&
      !worker_matches_policy(&sched->workers[l->worker_index], p)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' does not match owner %s's policy",
                           sched->workers[l->worker_index].id,
                           pcp_sched_owner_name(new_owner));
  }
  // The worker stays held, so no free worker changes hands and no
  // reservation loses capacity it had; the old owner gives it up by choice.
  if (l->worker_index >= 0) {
    sched->leased[l->owner]--;
    sched->leased[new_owner]++;
  } else {
    sched->detached[l->owner]--;
    sched->detached[new_owner]++;
  }
  l->owner = new_owner;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_lease_query(const pcp_sched_t* sched, uint64_t lease_id,
                                   pcp_sched_lease_status_t* out_status) {
  if (!out_status) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "out_status is NULL");
  }
  memset(out_status, 0, sizeof(*out_status));
  int32_t index = find_lease(sched, lease_id);
  if (index < 0) {
    return lease_not_found(sched, lease_id);
  }
  const lease_t* l = &sched->leases[index];
  out_status->lease_id = l->id;
  out_status->owner = l->owner;
  out_status->tag = l->tag;
  out_status->detached = l->worker_index < 0;
  set_worker_id(&out_status->worker_id, l->home_id);
  out_status->detached_deadline_ns = l->detached_deadline_ns;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Reservations
//===----------------------------------------------------------------------===//

pcp_status_t pcp_sched_reservation_reserve(
    pcp_sched_t* sched, pcp_sched_owner_t owner,
    const pcp_sched_constraint_t* constraint, uint64_t tag, int64_t now_ns,
    int64_t deadline_ns, uint64_t* out_reservation_id) {
  if (!out_reservation_id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "out_reservation_id is NULL");
  }
  *out_reservation_id = 0;
  filter_t filter;
  PCP_RETURN_IF_ERROR_BARE(check_request(sched, owner, constraint, &filter));
  if (deadline_ns <= now_ns) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "reservation deadline %lld is not after now %lld",
                           (long long)deadline_ns, (long long)now_ns);
  }
  if (sched->reservation_count == sched->options.max_reservations) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "reservation table is full (%u open)",
                           sched->reservation_count);
  }
  uint32_t want = constraint->worker_count;
  uint32_t found = select_workers(sched, owner, &filter, true, want);
  if (found < want) {
    return not_enough_workers(sched, owner, &filter, want, found);
  }
  int32_t index = -1;
  for (uint32_t i = 0; i < sched->options.max_reservations; ++i) {
    if (sched->reservations[i].id == 0) {
      index = (int32_t)i;
      break;
    }
  }
  PCP_ASSERT(index >= 0);
  reservation_t* r = &sched->reservations[index];
  memset(r, 0, sizeof(*r));
  r->id = sched->next_reservation_id++;
  r->owner = owner;
  r->tag = tag;
  r->filter = filter;
  r->worker_count = want;
  r->deadline_ns = deadline_ns;
  sched->reservation_count++;
  for (uint32_t k = 0; k < want; ++k) {
    reservation_hold(sched, index, sched->picks[k]);
  }
  *out_reservation_id = r->id;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_reservation_commit(pcp_sched_t* sched,
                                          uint64_t reservation_id,
                                          int64_t now_ns,
                                          uint64_t* out_lease_ids,
                                          size_t capacity) {
  int32_t index = find_reservation(sched, reservation_id);
  if (index < 0) {
    return reservation_not_found(reservation_id);
  }
  reservation_t* r = &sched->reservations[index];
  if (!out_lease_ids || capacity < r->worker_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "out_lease_ids holds %zu ids; %u needed", capacity,
                           r->worker_count);
  }
  if (now_ns >= r->deadline_ns) {
    // Past its deadline it is already dead; the tick would only be later.
    long long deadline = (long long)r->deadline_ns;
    reservation_free(sched, index);
    return pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                           "reservation %llu expired at %lld (now %lld)",
                           (unsigned long long)reservation_id, deadline,
                           (long long)now_ns);
  }
  if (r->worker_count > sched->options.max_leases - sched->lease_count) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "lease table is full (%u of %u live)",
                           sched->lease_count, sched->options.max_leases);
  }
  // Workers in id order, so lease ids map to workers the same way on every
  // replay.
  uint32_t count = 0;
  for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
    const worker_t* w = &sched->workers[i];
    if (w->in_use && w->reservation_index == index) {
      candidate_t* c = &sched->candidates[count++];
      memset(c, 0, sizeof(*c));
      c->id = w->id;
      c->index = (int32_t)i;
    }
  }
  PCP_ASSERT(count == r->worker_count);
  qsort(sched->candidates, count, sizeof(candidate_t), candidate_compare);
  pcp_sched_owner_t owner = r->owner;
  uint64_t tag = r->tag;
  filter_t filter = r->filter;
  for (uint32_t k = 0; k < count; ++k) {
    worker_t* w = &sched->workers[sched->candidates[k].index];
    w->reservation_index = -1;
    sched->reserved_slots[owner]--;
    int32_t lease_index = lease_allocate(sched, owner, tag, &filter);
    lease_attach(sched, lease_index, sched->candidates[k].index);
    out_lease_ids[k] = sched->leases[lease_index].id;
  }
  memset(r, 0, sizeof(*r));
  sched->reservation_count--;
  return pcp_ok_status();
}

pcp_status_t pcp_sched_reservation_release(pcp_sched_t* sched,
                                           uint64_t reservation_id) {
  int32_t index = find_reservation(sched, reservation_id);
  if (index < 0) {
    return reservation_not_found(reservation_id);
  }
  reservation_free(sched, index);
  return pcp_ok_status();
}

pcp_status_t pcp_sched_reservation_query(
    const pcp_sched_t* sched, uint64_t reservation_id,
    pcp_sched_reservation_status_t* out_status) {
  if (!out_status) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "out_status is NULL");
  }
  memset(out_status, 0, sizeof(*out_status));
  int32_t index = find_reservation(sched, reservation_id);
  if (index < 0) {
    return reservation_not_found(reservation_id);
  }
  const reservation_t* r = &sched->reservations[index];
  out_status->reservation_id = r->id;
  out_status->owner = r->owner;
  out_status->tag = r->tag;
  out_status->worker_count = r->worker_count;
  out_status->deadline_ns = r->deadline_ns;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Tick
//===----------------------------------------------------------------------===//

static int id_index_compare(const void* a_ptr, const void* b_ptr) {
  const id_index_t* a = (const id_index_t*)a_ptr;
  const id_index_t* b = (const id_index_t*)b_ptr;
  return a->id < b->id ? -1 : (a->id > b->id ? 1 : 0);
}

// Live detached leases (or open reservations) in ascending id order.
static uint32_t detached_in_order(pcp_sched_t* s) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < s->options.max_leases; ++i) {
    if (s->leases[i].id != 0 && s->leases[i].worker_index < 0) {
      s->id_order[count].id = s->leases[i].id;
      s->id_order[count].index = (int32_t)i;
      ++count;
    }
  }
  qsort(s->id_order, count, sizeof(id_index_t), id_index_compare);
  return count;
}

static uint32_t reservations_in_order(pcp_sched_t* s) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < s->options.max_reservations; ++i) {
    if (s->reservations[i].id != 0) {
      s->id_order[count].id = s->reservations[i].id;
      s->id_order[count].index = (int32_t)i;
      ++count;
    }
  }
  qsort(s->id_order, count, sizeof(id_index_t), id_index_compare);
  return count;
}

pcp_status_t pcp_sched_tick(pcp_sched_t* sched, int64_t now_ns,
                            pcp_sched_event_t* out_events, size_t capacity,
                            size_t* out_count) {
  if (!out_count || !out_events || capacity == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "tick needs an event array with capacity >= 1");
  }
  size_t count = 0;
  *out_count = 0;
  sched->sweeping = true;
  sched->sweep_now_ns = now_ns;
  // 1. Silent workers, in id order.
  for (;;) {
    int32_t oldest = -1;
    for (uint32_t i = 0; i < sched->options.max_workers; ++i) {
      const worker_t* w = &sched->workers[i];
      if (!w->in_use ||
          !heartbeat_expired(w, now_ns, sched->options.heartbeat_timeout_ns)) {
        continue;
      }
      if (oldest < 0 || strcmp(w->id, sched->workers[oldest].id) < 0) {
        oldest = (int32_t)i;
      }
    }
    if (oldest < 0) {
      break;
    }
    if (count == capacity) {
      goto done;
    }
    pcp_sched_event_t* event = &out_events[count++];
    worker_lose(sched, oldest, now_ns, event);
    if (event->kind == PCP_SCHED_EVENT_NONE) {
      event->kind = PCP_SCHED_EVENT_WORKER_LOST;
    }
  }
  // 2. Reservations past their deadline.
  {
    uint32_t n = reservations_in_order(sched);
    for (uint32_t k = 0; k < n; ++k) {
      reservation_t* r = &sched->reservations[sched->id_order[k].index];
      if (now_ns < r->deadline_ns) {
        continue;
      }
      if (count == capacity) {
        goto done;
      }
      pcp_sched_event_t* event = &out_events[count++];
      event_clear(event);
      event->kind = PCP_SCHED_EVENT_RESERVATION_EXPIRED;
      event->owner = r->owner;
      event->reservation_id = r->id;
      event->tag = r->tag;
      reservation_free(sched, sched->id_order[k].index);
    }
  }
  // 3. Detached leases past their grace deadline.
  {
    uint32_t n = detached_in_order(sched);
    for (uint32_t k = 0; k < n; ++k) {
      lease_t* l = &sched->leases[sched->id_order[k].index];
      // BUGGIFY: the grace may end early (simulation only, src/sim).
      if (now_ns < l->detached_deadline_ns &&
          !PCP_BUGGIFY("sched.lease_expire_early")) {
        continue;
      }
      if (count == capacity) {
        goto done;
      }
      pcp_sched_event_t* event = &out_events[count++];
      event_clear(event);
      event->kind = PCP_SCHED_EVENT_LEASE_EXPIRED;
      event->owner = l->owner;
      event->lease_id = l->id;
      event->tag = l->tag;
      set_worker_id(&event->worker_id, l->home_id);
      lease_free(sched, sched->id_order[k].index);
    }
  }
  // 4. Detached leases onto free workers.
  {
    uint32_t n = detached_in_order(sched);
    for (uint32_t k = 0; k < n; ++k) {
      int32_t lease_index = sched->id_order[k].index;
      lease_t* l = &sched->leases[lease_index];
      if (select_workers(sched, l->owner, &l->filter, true, 1) != 1) {
        continue;
      }
      if (count == capacity) {
        goto done;
      }
      pcp_sched_event_t* event = &out_events[count++];
      event_clear(event);
      event->kind = PCP_SCHED_EVENT_LEASE_REASSIGNED;
      event->owner = l->owner;
      event->lease_id = l->id;
      event->tag = l->tag;
      set_worker_id(&event->worker_id, l->home_id);
      int32_t worker_index = sched->picks[0];
      sched->detached[l->owner]--;
      lease_attach(sched, lease_index, worker_index);
      set_worker_id(&event->new_worker_id, sched->workers[worker_index].id);
    }
  }
done:
  sched->sweeping = false;
  *out_count = count;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Invariants
//===----------------------------------------------------------------------===//

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      return pcp_make_status(PCP_STATUS_INTERNAL, __VA_ARGS__); \
    }                                                           \
  } while (0)

pcp_status_t pcp_sched_check_invariants(const pcp_sched_t* s) {
  CHECK(s != NULL, "scheduler is NULL");
  const pcp_sched_options_t* o = &s->options;
  uint32_t workers = 0;
  uint32_t leased[PCP_SCHED_OWNER_COUNT_] = {0};
  uint32_t detached[PCP_SCHED_OWNER_COUNT_] = {0};
  uint32_t slots[PCP_SCHED_OWNER_COUNT_] = {0};
  for (uint32_t i = 0; i < o->max_workers; ++i) {
    const worker_t* w = &s->workers[i];
    if (!w->in_use) {
      CHECK(w->lease_index < 0 && w->reservation_index < 0,
            "free worker slot %u holds work", i);
      continue;
    }
    ++workers;
    CHECK(name_is_valid(w->id, PCP_SCHED_WORKER_ID_MAX_LENGTH, false),
          "worker slot %u has a malformed id", i);
    for (uint32_t j = i + 1; j < o->max_workers; ++j) {
      CHECK(!s->workers[j].in_use || strcmp(s->workers[j].id, w->id) != 0,
            "worker id '%s' registered twice", w->id);
    }
    CHECK((unsigned)w->state < PCP_SCHED_WORKER_STATE_COUNT_,
          "worker '%s' has state %d", w->id, (int)w->state);
    CHECK(!(w->lease_index >= 0 && w->reservation_index >= 0),
          "worker '%s' holds a lease and a reservation slot", w->id);
    bool holds = worker_holds(w);
    CHECK(!holds || w->state == PCP_SCHED_WORKER_STATE_BUSY ||
              w->state == PCP_SCHED_WORKER_STATE_DRAINING,
          "worker '%s' holds work in state %s", w->id,
          pcp_sched_worker_state_name(w->state));
    CHECK(holds || w->state != PCP_SCHED_WORKER_STATE_BUSY,
          "worker '%s' is busy holding nothing", w->id);
    if (w->lease_index >= 0) {
      CHECK((uint32_t)w->lease_index < o->max_leases,
            "worker '%s' lease index out of range", w->id);
      const lease_t* l = &s->leases[w->lease_index];
      CHECK(l->id != 0 && l->worker_index == (int32_t)i,
            "worker '%s' and its lease do not point at each other", w->id);
      CHECK(worker_matches_filter(w, &l->filter),
            "worker '%s' does not match the constraint of lease %llu", w->id,
            (unsigned long long)l->id);
      CHECK(worker_matches_policy(w, &s->policies[l->owner]),
            "worker '%s' does not match owner %s's policy", w->id,
            pcp_sched_owner_name(l->owner));
    }
    if (w->reservation_index >= 0) {
      CHECK((uint32_t)w->reservation_index < o->max_reservations,
            "worker '%s' reservation index out of range", w->id);
      const reservation_t* r = &s->reservations[w->reservation_index];
      CHECK(r->id != 0, "worker '%s' is in a closed reservation", w->id);
      CHECK(worker_matches_filter(w, &r->filter),
            "worker '%s' does not match reservation %llu", w->id,
            (unsigned long long)r->id);
      CHECK(worker_matches_policy(w, &s->policies[r->owner]),
            "worker '%s' does not match owner %s's policy", w->id,
            pcp_sched_owner_name(r->owner));
      slots[r->owner]++;
    }
  }
  CHECK(workers == s->worker_count && workers <= o->max_workers,
        "worker count %u, cached %u, max %u", workers, s->worker_count,
        o->max_workers);
  uint32_t leases = 0;
  for (uint32_t i = 0; i < o->max_leases; ++i) {
    const lease_t* l = &s->leases[i];
    if (l->id == 0) {
      continue;
    }
    ++leases;
    CHECK(l->id < s->next_lease_id, "lease %llu was not issued yet",
          (unsigned long long)l->id);
    CHECK(owner_is_valid(l->owner), "lease %llu has owner %d",
          (unsigned long long)l->id, (int)l->owner);
    for (uint32_t j = i + 1; j < o->max_leases; ++j) {
      CHECK(s->leases[j].id != l->id, "lease id %llu is live twice",
            (unsigned long long)l->id);
    }
    if (l->worker_index >= 0) {
      CHECK((uint32_t)l->worker_index < o->max_workers &&
                s->workers[l->worker_index].in_use &&
                s->workers[l->worker_index].lease_index == (int32_t)i,
            "lease %llu and its worker do not point at each other",
            (unsigned long long)l->id);
      leased[l->owner]++;
    } else {
      detached[l->owner]++;
    }
  }
  CHECK(leases == s->lease_count && leases <= o->max_leases,
        "lease count %u, cached %u, max %u", leases, s->lease_count,
        o->max_leases);
  uint32_t reservations = 0;
  for (uint32_t i = 0; i < o->max_reservations; ++i) {
    const reservation_t* r = &s->reservations[i];
    if (r->id == 0) {
      continue;
    }
    ++reservations;
    CHECK(r->id < s->next_reservation_id && owner_is_valid(r->owner),
          "reservation %llu is malformed", (unsigned long long)r->id);
    uint32_t held = 0;
    for (uint32_t k = 0; k < o->max_workers; ++k) {
      if (s->workers[k].in_use &&
          s->workers[k].reservation_index == (int32_t)i) {
        ++held;
      }
    }
    CHECK(held == r->worker_count,
          "reservation %llu holds %u workers, wants %u",
          (unsigned long long)r->id, held, r->worker_count);
  }
  CHECK(reservations == s->reservation_count &&
            reservations <= o->max_reservations,
        "reservation count %u, cached %u", reservations, s->reservation_count);
  for (int r = 0; r < PCP_SCHED_OWNER_COUNT_; ++r) {
    CHECK(leased[r] == s->leased[r] && detached[r] == s->detached[r] &&
              slots[r] == s->reserved_slots[r],
          "owner %s counters (%u, %u, %u) differ from a recount (%u, %u, %u)",
          pcp_sched_owner_name((pcp_sched_owner_t)r), s->leased[r],
          s->detached[r], s->reserved_slots[r], leased[r], detached[r],
          slots[r]);
    CHECK(leased[r] + detached[r] + slots[r] <= s->policies[r].max_workers,
          "owner %s holds %u, over its max of %u",
          pcp_sched_owner_name((pcp_sched_owner_t)r),
          leased[r] + detached[r] + slots[r], s->policies[r].max_workers);
    CHECK(s->policies[r].reserved_workers <= s->policies[r].max_workers,
          "owner %s reserves more than its max",
          pcp_sched_owner_name((pcp_sched_owner_t)r));
  }
  return pcp_ok_status();
}
