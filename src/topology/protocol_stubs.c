// SPDX-License-Identifier: Apache-2.0
//
// The protocol definitions the topology models run: read from the real
// modules where they define the same thing, STUBS of the upstream
// definitions (reference/upstream-control-plane.md s.4.4 and s.5,
// upstream-topology.md s.3.3 and s.7.3) where they do not:
//   - REAL: the fabric's wire messages, from proto's message-type table
//     (pcp_topology_fabric_catalog); only their directions are stated here,
//     because proto does not export them;
//   - stub: upstream's workload message registry (32 messages: family,
//     direction, result queue, worker handler) and the gateway dispatch rule;
//     this project's fabric carries workloads inside TASK_ASSIGN and
//     TASK_RESULT, so those message names have no real definition;
//   - stub: the lease/reservation scheduler (owner policies, max_workers,
//     reserved_workers, reservations, the embedded job queue). src/sched
//     exists but deliberately differs (lease ids, re-placement on loss,
//     a narrowed protection rule, deadlines, no job queue): the upstream
//     model is the task reference s.6 pins;
//   - stub: the federation hub's gateway registry and placement ranking (no
//     hub registry in this tree yet);
//   - real: the decoupled DiLoCo fragment window runs the library's state
//     machine (decoupled_model.c over workloads/train/decoupled.h: round,
//     learners, clocks, tape, schedule); here stay its envelope collectors,
//     the configuration invariants, the projection tape and vector clock the
//     tests read, and the referee's own double RDA formula (the model
//     publishes the library's merge: pcp_topology_rda_merge_real); the
//     training request kind parser is a stub.
// The stubs stay in this one file so that each block can be replaced by a
// call into its module when one exists; until then a change to the
// protocol must be mirrored here by hand. docs/topology.md has the table.

#include <math.h>
#include <string.h>

#include "proto/proto.h"
#include "sched/sched.h"
#include "topology/protocols_impl.h"

//===----------------------------------------------------------------------===//
// Message catalogue
//===----------------------------------------------------------------------===//

#define C2W PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_WORKER
#define W2C PCP_TOPOLOGY_MESSAGE_WORKER_TO_CONTROLLER
#define S2C PCP_TOPOLOGY_MESSAGE_SUPERVISOR_TO_CONTROLLER
#define C2S PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_SUPERVISOR

static const pcp_topology_message_entry_t kMessages[] = {
    {"JoinRequest", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"JoinAccept", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, C2W, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"InitializeGraph", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, C2W, false,
     PCP_TOPOLOGY_HANDLER_GRAPH},
    {"InitializeGraphComplete", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"Shutdown", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, C2W, false,
     PCP_TOPOLOGY_HANDLER_LIFECYCLE},
    {"Heartbeat", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"SupervisorHandshake", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, S2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"RestartWorker", PCP_TOPOLOGY_FAMILY_WORKER_CONTROL, C2S, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"WeightChunk", PCP_TOPOLOGY_FAMILY_ARTIFACT_TRANSFER, C2W, false,
     PCP_TOPOLOGY_HANDLER_TRANSFER},
    {"UpdateChunk", PCP_TOPOLOGY_FAMILY_ARTIFACT_TRANSFER, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"StartInnerLoop", PCP_TOPOLOGY_FAMILY_REGULAR_TRAINING, C2W, false,
     PCP_TOPOLOGY_HANDLER_REGULAR_TRAINING},
    {"InnerLoopComplete", PCP_TOPOLOGY_FAMILY_REGULAR_TRAINING, W2C, true,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"StartStreamingLoop", PCP_TOPOLOGY_FAMILY_STREAMING_DILOCO, C2W, false,
     PCP_TOPOLOGY_HANDLER_STREAMING_DILOCO},
    {"FragmentUpdate", PCP_TOPOLOGY_FAMILY_STREAMING_DILOCO, W2C, true,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"FragmentReady", PCP_TOPOLOGY_FAMILY_STREAMING_DILOCO, C2W, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"StartDecoupledDilocoLoop", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, C2W,
     false, PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING},
    {"DecoupledLearnerMetadata", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, W2C,
     true, PCP_TOPOLOGY_HANDLER_NONE},
    {"DecoupledFragmentPull", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, C2W,
     false, PCP_TOPOLOGY_HANDLER_NONE},
    {"DecoupledFragmentUpdate", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, W2C,
     true, PCP_TOPOLOGY_HANDLER_NONE},
    {"DecoupledFragmentReady", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, C2W,
     false, PCP_TOPOLOGY_HANDLER_NONE},
    {"StopDecoupledDilocoLoop", PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING, C2W,
     false, PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING},
    {"LoadModel", PCP_TOPOLOGY_FAMILY_INFERENCE, C2W, false,
     PCP_TOPOLOGY_HANDLER_INFERENCE},
    {"ModelReady", PCP_TOPOLOGY_FAMILY_INFERENCE, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"StartGeneration", PCP_TOPOLOGY_FAMILY_INFERENCE, C2W, false,
     PCP_TOPOLOGY_HANDLER_INFERENCE},
    {"GenerationChunk", PCP_TOPOLOGY_FAMILY_INFERENCE, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"GenerationComplete", PCP_TOPOLOGY_FAMILY_INFERENCE, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"GenerationError", PCP_TOPOLOGY_FAMILY_INFERENCE, W2C, false,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"CancelGeneration", PCP_TOPOLOGY_FAMILY_INFERENCE, C2W, false,
     PCP_TOPOLOGY_HANDLER_INFERENCE},
    {"FlushSession", PCP_TOPOLOGY_FAMILY_INFERENCE, C2W, false,
     PCP_TOPOLOGY_HANDLER_INFERENCE},
    {"StartRollout", PCP_TOPOLOGY_FAMILY_RL, C2W, false,
     PCP_TOPOLOGY_HANDLER_RL},
    {"RolloutComplete", PCP_TOPOLOGY_FAMILY_RL, W2C, true,
     PCP_TOPOLOGY_HANDLER_NONE},
    {"UpdateWeights", PCP_TOPOLOGY_FAMILY_RL, C2W, false,
     PCP_TOPOLOGY_HANDLER_RL},
};

static const char* const kFamilyNames[PCP_TOPOLOGY_FAMILY_COUNT_] = {
    "worker_control",
    "artifact_transfer",
    "regular_training",
    "streaming_diloco",
    "decoupled_training",
    "inference",
    "rl",
};

static const char* const kHandlerNames[PCP_TOPOLOGY_HANDLER_COUNT_] = {
    "none",
    "graph",
    "transfer",
    "regular_training",
    "decoupled_training",
    "streaming_diloco",
    "rl",
    "inference",
    "lifecycle",
};

const pcp_topology_message_entry_t* pcp_topology_message_catalog(
    size_t* out_count) {
  *out_count = PCP_ARRAYSIZE(kMessages);
  return kMessages;
}

const char* pcp_topology_message_family_name(
    pcp_topology_message_family_t family) {
  if ((unsigned)family >= PCP_TOPOLOGY_FAMILY_COUNT_)
    return "?";
  return kFamilyNames[family];
}

const char* pcp_topology_worker_handler_name(
    pcp_topology_worker_handler_t handler) {
  if ((unsigned)handler >= PCP_TOPOLOGY_HANDLER_COUNT_)
    return "?";
  return kHandlerNames[handler];
}

const pcp_topology_message_entry_t* pcp_topology_message_lookup(
    const pcp_topology_message_entry_t* catalog, size_t count,
    const char* name) {
  for (size_t i = 0; i < count; ++i) {
    if (strcmp(catalog[i].name, name) == 0)
      return &catalog[i];
  }
  return NULL;
}

pcp_topology_dispatch_t pcp_topology_message_dispatch(
    const pcp_topology_message_entry_t* catalog, size_t count,
    const char* name) {
  const pcp_topology_message_entry_t* entry =
      pcp_topology_message_lookup(catalog, count, name);
  // Unknown messages fail closed: the gateway neither forwards nor queues.
  if (!entry)
    return PCP_TOPOLOGY_DISPATCH_FAIL_CLOSED;
  if (entry->direction == C2W) {
    return PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER;
  }
  if (entry->direction == W2C && entry->queued) {
    return PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY;
  }
  return PCP_TOPOLOGY_DISPATCH_GATEWAY_HANDLED;
}

pcp_topology_handler_verdict_t pcp_topology_worker_handler_check(
    const pcp_topology_message_entry_t* catalog, size_t count, const char* name,
    pcp_topology_worker_handler_t claimed) {
  const pcp_topology_message_entry_t* entry =
      pcp_topology_message_lookup(catalog, count, name);
  if (!entry)
    return PCP_TOPOLOGY_HANDLER_VERDICT_UNKNOWN_MESSAGE;
  if (entry->handler == PCP_TOPOLOGY_HANDLER_NONE) {
    return PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER;
  }
  if (entry->handler != claimed) {
    return PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER;
  }
  return PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED;
}

//===----------------------------------------------------------------------===//
// Fabric message catalogue (the real one, from src/proto)
//===----------------------------------------------------------------------===//

#define F_W2G PCP_TOPOLOGY_FABRIC_WORKER_TO_GATEWAY
#define F_G2W PCP_TOPOLOGY_FABRIC_GATEWAY_TO_WORKER
#define F_BOTH PCP_TOPOLOGY_FABRIC_BOTH

// docs/protocol.md s.3, the "dir" column. BLOB_CHUNK goes both ways
// (programs and inputs down, results up).
static const struct {
  pcp_proto_message_type_t type;
  pcp_topology_fabric_direction_t direction;
} kFabricDirections[] = {
    {PCP_PROTO_MESSAGE_HELLO, F_BOTH},
    {PCP_PROTO_MESSAGE_JOIN, F_W2G},
    {PCP_PROTO_MESSAGE_CHALLENGE, F_G2W},
    {PCP_PROTO_MESSAGE_JOIN_PROOF, F_W2G},
    {PCP_PROTO_MESSAGE_ACCEPT, F_G2W},
    {PCP_PROTO_MESSAGE_REJECT, F_G2W},
    {PCP_PROTO_MESSAGE_HEARTBEAT, F_BOTH},
    {PCP_PROTO_MESSAGE_ERROR, F_BOTH},
    {PCP_PROTO_MESSAGE_DRAIN, F_BOTH},
    {PCP_PROTO_MESSAGE_SHUTDOWN, F_G2W},
    {PCP_PROTO_MESSAGE_PROGRAM_OFFER, F_G2W},
    {PCP_PROTO_MESSAGE_PROGRAM_FETCH, F_W2G},
    {PCP_PROTO_MESSAGE_BLOB_CHUNK, F_BOTH},
    {PCP_PROTO_MESSAGE_PROGRAM_ACK, F_W2G},
    {PCP_PROTO_MESSAGE_TASK_ASSIGN, F_G2W},
    {PCP_PROTO_MESSAGE_TASK_PROGRESS, F_W2G},
    {PCP_PROTO_MESSAGE_TASK_RESULT, F_W2G},
    {PCP_PROTO_MESSAGE_TASK_CANCEL, F_G2W},
};

pcp_status_t pcp_topology_fabric_catalog(
    pcp_topology_fabric_message_t* out_messages, size_t capacity,
    size_t* out_count) {
  *out_count = 0;
  for (size_t d = 0; d < PCP_ARRAYSIZE(kFabricDirections); ++d) {
    if (!pcp_proto_message_type_name((uint16_t)kFabricDirections[d].type)) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "topology fabric catalogue: message type %u has "
                             "a direction but proto does not name it",
                             (unsigned)kFabricDirections[d].type);
    }
  }
  // Every wire number, so that a type proto adds anywhere is seen.
  for (uint32_t type = 0; type <= UINT16_MAX; ++type) {
    const char* name = pcp_proto_message_type_name((uint16_t)type);
    if (!name) {
      continue;
    }
    pcp_topology_fabric_direction_t direction = 0;
    for (size_t d = 0; d < PCP_ARRAYSIZE(kFabricDirections); ++d) {
      if ((uint32_t)kFabricDirections[d].type == type) {
        direction = kFabricDirections[d].direction;
      }
    }
    if (!direction) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "topology fabric catalogue: proto message %s "
                             "(%u) has no direction in the topology model",
                             name, type);
    }
    if (*out_count >= capacity) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "fabric catalogue holds more than %zu messages",
                             capacity);
    }
    out_messages[*out_count].type = (uint16_t)type;
    out_messages[*out_count].name = name;
    out_messages[*out_count].direction = direction;
    ++*out_count;
  }
  return pcp_ok_status();
}

const char* pcp_topology_fabric_direction_name(
    pcp_topology_fabric_direction_t direction) {
  switch (direction) {
    case PCP_TOPOLOGY_FABRIC_WORKER_TO_GATEWAY:
      return "W->G";
    case PCP_TOPOLOGY_FABRIC_GATEWAY_TO_WORKER:
      return "G->W";
    case PCP_TOPOLOGY_FABRIC_BOTH:
      return "both";
  }
  return "?";
}

//===----------------------------------------------------------------------===//
// Workload request normalization
//===----------------------------------------------------------------------===//

pcp_topology_training_kind_t pcp_topology_training_kind_from_request_body(
    const char* body) {
  // The upstream parser defaults to regular training; a body naming another
  // kind selects it. A missing or empty body is regular.
  if (!body || !strstr(body, "\"training_kind\"")) {
    return PCP_TOPOLOGY_TRAINING_REGULAR;
  }
  if (strstr(body, "\"decoupled\""))
    return PCP_TOPOLOGY_TRAINING_DECOUPLED;
  if (strstr(body, "\"streaming\""))
    return PCP_TOPOLOGY_TRAINING_STREAMING;
  if (strstr(body, "\"regular\""))
    return PCP_TOPOLOGY_TRAINING_REGULAR;
  return PCP_TOPOLOGY_TRAINING_INVALID;
}

bool pcp_topology_workload_route_regular(const char* body,
                                         const char* session_id) {
  // Regular training is routed to the regular training service; anything
  // else, or a session id the workload does not know, is rejected.
  if (pcp_topology_training_kind_from_request_body(body) !=
      PCP_TOPOLOGY_TRAINING_REGULAR) {
    return false;
  }
  return session_id && strncmp(session_id, "invalid", 7) != 0;
}

//===----------------------------------------------------------------------===//
// Scheduler: policies, leases, reservations, the embedded job queue
//===----------------------------------------------------------------------===//

bool pcp_topology_worker_class_parse(const char* name,
                                     pcp_topology_worker_class_t* out_class) {
  // Names and the "hip" alias come from base's backend table; this enum
  // keeps its own order (metal before vulkan), so map by kind.
  static const pcp_topology_worker_class_t kByKind[PCP_BACKEND_KIND_COUNT_] = {
      [PCP_BACKEND_KIND_CPU] = PCP_TOPOLOGY_WORKER_CLASS_CPU,
      [PCP_BACKEND_KIND_CUDA] = PCP_TOPOLOGY_WORKER_CLASS_CUDA,
      [PCP_BACKEND_KIND_ROCM] = PCP_TOPOLOGY_WORKER_CLASS_ROCM,
      [PCP_BACKEND_KIND_VULKAN] = PCP_TOPOLOGY_WORKER_CLASS_VULKAN,
      [PCP_BACKEND_KIND_METAL] = PCP_TOPOLOGY_WORKER_CLASS_METAL};
  pcp_backend_kind_t kind;
  if (!pcp_backend_kind_parse(
          pcp_make_cstring_view(name),
          PCP_BACKEND_PARSE_FLAG_ANY | PCP_BACKEND_PARSE_FLAG_ALIASES, &kind)) {
    return false;
  }
  *out_class = kind == PCP_BACKEND_KIND_ANY ? PCP_TOPOLOGY_WORKER_CLASS_ANY
                                            : kByKind[kind];
  return true;
}

bool pcp_topology_sched_policy_allows(const pcp_topology_sched_policy_t* policy,
                                      pcp_topology_worker_class_t worker_class,
                                      const char* arch) {
  if (policy->worker_class != PCP_TOPOLOGY_WORKER_CLASS_ANY &&
      policy->worker_class != worker_class) {
    return false;
  }
  if (policy->target_arch) {
    return arch && strcmp(policy->target_arch, arch) == 0;
  }
  return true;
}

void pcp_topology_sched_initialize(pcp_topology_sched_t* out_sched) {
  memset(out_sched, 0, sizeof(*out_sched));
  for (size_t i = 0; i < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++i) {
    out_sched->policies[i].worker_class = PCP_TOPOLOGY_WORKER_CLASS_ANY;
  }
}

pcp_status_t pcp_topology_sched_add_worker(
    pcp_topology_sched_t* sched, uint32_t id,
    pcp_topology_worker_class_t worker_class, const char* arch) {
  if (sched->worker_count >= PCP_TOPOLOGY_SCHED_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "scheduler model holds at most %u workers",
                           PCP_TOPOLOGY_SCHED_MAX_WORKERS);
  }
  pcp_topology_sched_worker_t* w = &sched->workers[sched->worker_count++];
  memset(w, 0, sizeof(*w));
  w->id = id;
  w->worker_class = worker_class;
  w->arch = arch;
  w->state = PCP_TOPOLOGY_WORKER_IDLE;
  w->owner = -1;
  w->reservation = -1;
  return pcp_ok_status();
}

static void sched_reject(pcp_topology_sched_t* s,
                         pcp_topology_sched_violation_t violation) {
  s->violation = violation;
  s->decision = PCP_TOPOLOGY_SCHED_REJECTED;
}

static pcp_topology_sched_worker_t* sched_worker(pcp_topology_sched_t* s,
                                                 uint32_t id) {
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    if (s->workers[i].id == id)
      return &s->workers[i];
  }
  return NULL;
}

uint32_t pcp_topology_sched_owner_leases(const pcp_topology_sched_t* s,
                                         uint32_t owner) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    count += s->workers[i].owner == (int32_t)owner;
  }
  return count;
}

uint32_t pcp_topology_sched_owner_capacity(const pcp_topology_sched_t* s,
                                           uint32_t owner) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    const pcp_topology_sched_worker_t* w = &s->workers[i];
    if (w->state == PCP_TOPOLOGY_WORKER_OFFLINE)
      continue;
    if (w->owner >= 0 && w->owner != (int32_t)owner)
      continue;
    count += pcp_topology_sched_policy_allows(&s->policies[owner],
                                              w->worker_class, w->arch);
  }
  return count;
}

// Why |worker| cannot be leased to |owner| now (NONE when it can).
static pcp_topology_sched_block_t sched_can_lease(
    const pcp_topology_sched_t* s, const pcp_topology_sched_worker_t* w,
    uint32_t owner) {
  // The duplicate-reservation bug takes a worker that another reservation
  // holds (reserved, not yet assigned) as if it were idle.
  bool stealable = s->bug_duplicate_worker_reservation &&
                   w->state == PCP_TOPOLOGY_WORKER_RESERVED;
  if (!stealable && (w->state != PCP_TOPOLOGY_WORKER_IDLE || w->owner >= 0)) {
    return PCP_TOPOLOGY_SCHED_BLOCK_BUSY;
  }
  const pcp_topology_sched_policy_t* policy = &s->policies[owner];
  if (!pcp_topology_sched_policy_allows(policy, w->worker_class, w->arch)) {
    return PCP_TOPOLOGY_SCHED_BLOCK_POLICY;
  }
  if (policy->max_workers &&
      pcp_topology_sched_owner_leases(s, owner) >= policy->max_workers) {
    return PCP_TOPOLOGY_SCHED_BLOCK_MAX_WORKERS;
  }
  if (s->bug_ignore_reserved_capacity)
    return PCP_TOPOLOGY_SCHED_BLOCK_NONE;
  for (uint32_t other = 0; other < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++other) {
    if (other == owner || s->policies[other].reserved_workers == 0)
      continue;
    uint32_t capacity = pcp_topology_sched_owner_capacity(s, other);
    bool counted = pcp_topology_sched_policy_allows(&s->policies[other],
                                                    w->worker_class, w->arch);
    if (capacity - (counted ? 1u : 0u) < s->policies[other].reserved_workers) {
      return PCP_TOPOLOGY_SCHED_BLOCK_RESERVED_CAPACITY;
    }
  }
  return PCP_TOPOLOGY_SCHED_BLOCK_NONE;
}

uint32_t pcp_topology_sched_owner_available(const pcp_topology_sched_t* s,
                                            uint32_t owner) {
  // Greedy and hypothetical: lease one, re-check the reservation rules.
  pcp_topology_sched_t copy = *s;
  uint32_t available = 0;
  for (uint32_t i = 0; i < copy.worker_count; ++i) {
    if (sched_can_lease(&copy, &copy.workers[i], owner) ==
        PCP_TOPOLOGY_SCHED_BLOCK_NONE) {
      copy.workers[i].owner = (int32_t)owner;
      copy.workers[i].state = PCP_TOPOLOGY_WORKER_RESERVED;
      available++;
    }
  }
  return available;
}

static int32_t sched_find_reservation(const pcp_topology_sched_t* s,
                                      uint32_t job) {
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    if (s->reservations[i].active && s->reservations[i].job == job) {
      return (int32_t)i;
    }
  }
  return -1;
}

static bool sched_job_known(const pcp_topology_sched_t* s, uint32_t job) {
  for (uint32_t i = 0; i < s->queue_count; ++i) {
    if (s->queue[i].job == job)
      return true;
  }
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    if (s->active[i].in_use && s->active[i].job == job)
      return true;
  }
  return false;
}

static void sched_free_workers(pcp_topology_sched_t* s, int32_t reservation,
                               uint32_t owner, uint32_t job) {
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    pcp_topology_sched_worker_t* w = &s->workers[i];
    bool mine = reservation >= 0
                    ? w->reservation == reservation
                    : (w->owner == (int32_t)owner && w->job == job &&
                       w->state == PCP_TOPOLOGY_WORKER_ASSIGNED);
    if (!mine)
      continue;
    if (w->state != PCP_TOPOLOGY_WORKER_OFFLINE) {
      w->state = PCP_TOPOLOGY_WORKER_IDLE;
    }
    w->owner = -1;
    w->reservation = -1;
    w->job = 0;
  }
}

int32_t pcp_topology_sched_reserve(pcp_topology_sched_t* s, uint32_t job,
                                   uint32_t owner, uint32_t workers_required) {
  s->block = PCP_TOPOLOGY_SCHED_BLOCK_NONE;
  if (owner >= PCP_TOPOLOGY_SCHED_OWNER_COUNT || workers_required == 0 ||
      workers_required > PCP_TOPOLOGY_SCHED_MAX_WORKERS) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_REQUEST);
    return -1;
  }
  if (sched_find_reservation(s, job) >= 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_JOB_RESERVATION);
    return -1;
  }
  if (sched_job_known(s, job)) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_QUEUED_JOB);
    return -1;
  }
  int32_t slot = -1;
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    if (!s->reservations[i].active) {
      slot = (int32_t)i;
      break;
    }
  }
  if (slot < 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_UNAVAILABLE);
    return -1;
  }
  uint32_t selected = 0;
  uint32_t mask = 0;
  pcp_topology_sched_block_t first_block = PCP_TOPOLOGY_SCHED_BLOCK_NONE;
  // First fit in insertion order; selected workers are taken immediately so
  // later checks see them leased (and the reservation rule stays exact).
  for (uint32_t i = 0; i < s->worker_count && selected < workers_required;
       ++i) {
    pcp_topology_sched_worker_t* w = &s->workers[i];
    pcp_topology_sched_block_t block = sched_can_lease(s, w, owner);
    if (block != PCP_TOPOLOGY_SCHED_BLOCK_NONE) {
      if (first_block == PCP_TOPOLOGY_SCHED_BLOCK_NONE ||
          (first_block == PCP_TOPOLOGY_SCHED_BLOCK_BUSY &&
           block != PCP_TOPOLOGY_SCHED_BLOCK_BUSY)) {
        first_block = block;
      }
      continue;
    }
    w->state = PCP_TOPOLOGY_WORKER_RESERVED;
    w->owner = (int32_t)owner;
    w->reservation = slot;
    w->job = job;
    mask |= 1u << i;
    selected++;
  }
  if (selected < workers_required) {
    sched_free_workers(s, slot, owner, job);
    s->block = first_block == PCP_TOPOLOGY_SCHED_BLOCK_NONE
                   ? PCP_TOPOLOGY_SCHED_BLOCK_BUSY
                   : first_block;
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_UNAVAILABLE);
    return -1;
  }
  pcp_topology_sched_reservation_t* r = &s->reservations[slot];
  r->active = true;
  r->job = job;
  r->owner = owner;
  r->workers_required = workers_required;
  r->worker_mask = mask;
  s->decision = PCP_TOPOLOGY_SCHED_RESERVED;
  return slot;
}

static bool sched_reservation_intact(const pcp_topology_sched_t* s,
                                     int32_t slot) {
  const pcp_topology_sched_reservation_t* r = &s->reservations[slot];
  uint32_t held = 0;
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    const pcp_topology_sched_worker_t* w = &s->workers[i];
    if (w->reservation != slot)
      continue;
    if (w->state != PCP_TOPOLOGY_WORKER_RESERVED ||
        w->owner != (int32_t)r->owner) {
      return false;
    }
    held++;
  }
  return held == r->workers_required;
}

static bool sched_lookup(pcp_topology_sched_t* s, uint32_t job,
                         int32_t* out_slot) {
  *out_slot = sched_find_reservation(s, job);
  if (*out_slot < 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_NOT_FOUND);
    return false;
  }
  return true;
}

static bool sched_activate(pcp_topology_sched_t* s, uint32_t job,
                           uint32_t owner, uint32_t workers) {
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    if (!s->active[i].in_use) {
      s->active[i].in_use = true;
      s->active[i].job = job;
      s->active[i].owner = owner;
      s->active[i].workers = workers;
      return true;
    }
  }
  return false;
}

void pcp_topology_sched_commit(pcp_topology_sched_t* s, uint32_t job) {
  int32_t slot;
  if (!sched_lookup(s, job, &slot))
    return;
  if (!s->bug_commit_after_loss && !sched_reservation_intact(s, slot)) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS);
    return;
  }
  pcp_topology_sched_reservation_t* r = &s->reservations[slot];
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    pcp_topology_sched_worker_t* w = &s->workers[i];
    if (w->reservation == slot) {
      w->state = PCP_TOPOLOGY_WORKER_ASSIGNED;
      w->reservation = -1;
    }
  }
  sched_activate(s, job, r->owner, r->workers_required);
  r->active = false;
  s->decision = PCP_TOPOLOGY_SCHED_COMMITTED;
}

void pcp_topology_sched_commit_to_queue(pcp_topology_sched_t* s, uint32_t job) {
  int32_t slot;
  if (!sched_lookup(s, job, &slot))
    return;
  if (s->queue_count >= PCP_TOPOLOGY_SCHED_MAX_QUEUE) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_QUEUE_FULL);
    return;
  }
  // Committed reservations jump the queue: their workers are already held.
  memmove(&s->queue[1], &s->queue[0], s->queue_count * sizeof(s->queue[0]));
  s->queue[0].job = job;
  s->queue[0].owner = s->reservations[slot].owner;
  s->queue[0].workers = s->reservations[slot].workers_required;
  s->queue[0].reservation = slot;
  s->queue_count++;
  s->decision = PCP_TOPOLOGY_SCHED_QUEUED;
}

void pcp_topology_sched_enqueue(pcp_topology_sched_t* s, uint32_t job,
                                uint32_t owner, uint32_t workers) {
  if (sched_job_known(s, job) || sched_find_reservation(s, job) >= 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_QUEUED_JOB);
    return;
  }
  if (s->queue_count >= PCP_TOPOLOGY_SCHED_MAX_QUEUE) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_QUEUE_FULL);
    return;
  }
  pcp_topology_sched_queued_t* q = &s->queue[s->queue_count++];
  q->job = job;
  q->owner = owner;
  q->workers = workers;
  q->reservation = -1;
  s->decision = PCP_TOPOLOGY_SCHED_QUEUED;
}

uint32_t pcp_topology_sched_start_next(pcp_topology_sched_t* s) {
  if (s->queue_count == 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND);
    return 0;
  }
  pcp_topology_sched_queued_t q = s->queue[0];
  if (q.reservation >= 0) {
    if (!sched_reservation_intact(s, q.reservation)) {
      sched_reject(s,
                   PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS);
      return 0;
    }
    for (uint32_t i = 0; i < s->worker_count; ++i) {
      if (s->workers[i].reservation == q.reservation) {
        s->workers[i].state = PCP_TOPOLOGY_WORKER_ASSIGNED;
        s->workers[i].reservation = -1;
      }
    }
    s->reservations[q.reservation].active = false;
  } else {
    // The job leaves the queue while it leases, so the duplicate-job check
    // inside reserve does not see it; it goes back to the head on failure.
    memmove(&s->queue[0], &s->queue[1],
            (s->queue_count - 1) * sizeof(s->queue[0]));
    s->queue_count--;
    int32_t slot = pcp_topology_sched_reserve(s, q.job, q.owner, q.workers);
    memmove(&s->queue[1], &s->queue[0], s->queue_count * sizeof(s->queue[0]));
    s->queue[0] = q;
    s->queue_count++;
    if (slot < 0)
      return 0;
    for (uint32_t i = 0; i < s->worker_count; ++i) {
      if (s->workers[i].reservation == slot) {
        s->workers[i].state = PCP_TOPOLOGY_WORKER_ASSIGNED;
        s->workers[i].reservation = -1;
      }
    }
    s->reservations[slot].active = false;
  }
  memmove(&s->queue[0], &s->queue[1],
          (s->queue_count - 1) * sizeof(s->queue[0]));
  s->queue_count--;
  sched_activate(s, q.job, q.owner, q.workers);
  s->decision = PCP_TOPOLOGY_SCHED_STARTED;
  return q.job;
}

static int32_t sched_find_active(const pcp_topology_sched_t* s, uint32_t job) {
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    if (s->active[i].in_use && s->active[i].job == job)
      return (int32_t)i;
  }
  return -1;
}

static void sched_end_active(pcp_topology_sched_t* s, uint32_t job,
                             pcp_topology_sched_decision_t decision) {
  int32_t slot = sched_find_active(s, job);
  if (slot < 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_ACTIVE_JOB_NOT_FOUND);
    return;
  }
  sched_free_workers(s, -1, s->active[slot].owner, job);
  s->active[slot].in_use = false;
  s->decision = decision;
}

void pcp_topology_sched_complete(pcp_topology_sched_t* s, uint32_t job) {
  sched_end_active(s, job, PCP_TOPOLOGY_SCHED_COMPLETED);
}

void pcp_topology_sched_cancel_active(pcp_topology_sched_t* s, uint32_t job) {
  sched_end_active(s, job, PCP_TOPOLOGY_SCHED_CANCELED);
}

void pcp_topology_sched_cancel_queued(pcp_topology_sched_t* s, uint32_t job) {
  for (uint32_t i = 0; i < s->queue_count; ++i) {
    if (s->queue[i].job != job)
      continue;
    int32_t reservation = s->queue[i].reservation;
    // The cleanup-leak bug drops the reservation but forgets the workers it
    // holds.
    if (reservation >= 0) {
      if (!s->bug_leak_on_cancel) {
        sched_free_workers(s, reservation, s->queue[i].owner, job);
      }
      s->reservations[reservation].active = false;
    }
    memmove(&s->queue[i], &s->queue[i + 1],
            (s->queue_count - i - 1) * sizeof(s->queue[0]));
    s->queue_count--;
    s->decision = PCP_TOPOLOGY_SCHED_CANCELED;
    return;
  }
  sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND);
}

void pcp_topology_sched_cancel(pcp_topology_sched_t* s, uint32_t job) {
  for (uint32_t i = 0; i < s->queue_count; ++i) {
    if (s->queue[i].job == job) {
      pcp_topology_sched_cancel_queued(s, job);
      return;
    }
  }
  if (sched_find_active(s, job) >= 0) {
    pcp_topology_sched_cancel_active(s, job);
    return;
  }
  int32_t slot = sched_find_reservation(s, job);
  if (slot < 0) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND);
    return;
  }
  // Same cleanup as a queued reserved job, and the same injected leak.
  if (!s->bug_leak_on_cancel) {
    sched_free_workers(s, slot, s->reservations[slot].owner, job);
  }
  s->reservations[slot].active = false;
  s->decision = PCP_TOPOLOGY_SCHED_CANCELED;
}

static void sched_drop_reservation(pcp_topology_sched_t* s, uint32_t job,
                                   pcp_topology_sched_decision_t decision) {
  int32_t slot;
  if (!sched_lookup(s, job, &slot))
    return;
  sched_free_workers(s, slot, s->reservations[slot].owner, job);
  s->reservations[slot].active = false;
  s->decision = decision;
}

void pcp_topology_sched_release(pcp_topology_sched_t* s, uint32_t job) {
  sched_drop_reservation(s, job, PCP_TOPOLOGY_SCHED_RELEASED);
}

void pcp_topology_sched_expire(pcp_topology_sched_t* s, uint32_t job) {
  sched_drop_reservation(s, job, PCP_TOPOLOGY_SCHED_EXPIRED);
}

void pcp_topology_sched_lose_worker(pcp_topology_sched_t* s, uint32_t id) {
  pcp_topology_sched_worker_t* w = sched_worker(s, id);
  if (!w) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_WORKER);
    return;
  }
  // The lease fields stay: a later commit must notice the loss.
  w->state = PCP_TOPOLOGY_WORKER_OFFLINE;
}

void pcp_topology_sched_restore_worker(pcp_topology_sched_t* s, uint32_t id) {
  pcp_topology_sched_worker_t* w = sched_worker(s, id);
  if (!w) {
    sched_reject(s, PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_WORKER);
    return;
  }
  w->state = PCP_TOPOLOGY_WORKER_IDLE;
  w->owner = -1;
  w->reservation = -1;
  w->job = 0;
  // Its reservation no longer holds it either (the commit will report the
  // loss because the reservation is short).
  uint32_t bit = 1u << (uint32_t)(w - s->workers);
  for (uint32_t r = 0; r < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++r) {
    s->reservations[r].worker_mask &= ~bit;
  }
}

uint32_t pcp_topology_sched_count_state(const pcp_topology_sched_t* s,
                                        pcp_topology_worker_state_t state) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    count += s->workers[i].state == state;
  }
  return count;
}

uint32_t pcp_topology_sched_active_reservations(const pcp_topology_sched_t* s) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++i) {
    count += s->reservations[i].active;
  }
  return count;
}

static const char* const kSchedInvariantNames[] = {
    "ok",
    "orphan_reserved_worker",
    "reservation_overfull",
    "orphan_assigned_worker",
    "max_workers_exceeded",
    "reserved_capacity_starved",
    "queued_reservation_missing",
    "idle_worker_owned",
    "duplicate_worker_reservation",
};

const char* pcp_topology_sched_invariant_name(
    pcp_topology_sched_invariant_t invariant) {
  if ((unsigned)invariant >= PCP_ARRAYSIZE(kSchedInvariantNames))
    return "?";
  return kSchedInvariantNames[invariant];
}

pcp_topology_sched_invariant_t pcp_topology_sched_check_invariants(
    const pcp_topology_sched_t* s) {
  for (uint32_t i = 0; i < s->worker_count; ++i) {
    const pcp_topology_sched_worker_t* w = &s->workers[i];
    if (w->state == PCP_TOPOLOGY_WORKER_IDLE &&
        (w->owner >= 0 || w->reservation >= 0)) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_IDLE_WORKER_OWNED;
    }
    if (w->state == PCP_TOPOLOGY_WORKER_RESERVED &&
        (w->reservation < 0 || !s->reservations[w->reservation].active)) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER;
    }
    if (w->state == PCP_TOPOLOGY_WORKER_ASSIGNED) {
      bool found = false;
      for (uint32_t k = 0; k < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++k) {
        found |= s->active[k].in_use && s->active[k].job == w->job &&
                 (int32_t)s->active[k].owner == w->owner;
      }
      if (!found)
        return PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_ASSIGNED_WORKER;
    }
  }
  for (uint32_t r = 0; r < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++r) {
    if (!s->reservations[r].active)
      continue;
    uint32_t held = 0;
    for (uint32_t i = 0; i < s->worker_count; ++i) {
      held += s->workers[i].reservation == (int32_t)r;
    }
    if (held > s->reservations[r].workers_required) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_RESERVATION_OVERFULL;
    }
  }
  for (uint32_t o = 0; o < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++o) {
    const pcp_topology_sched_policy_t* p = &s->policies[o];
    if (p->max_workers &&
        pcp_topology_sched_owner_leases(s, o) > p->max_workers) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_MAX_WORKERS_EXCEEDED;
    }
    if (p->reserved_workers &&
        pcp_topology_sched_owner_capacity(s, o) < p->reserved_workers) {
      // Only a violation when the pool could have kept it: count the
      // non-offline workers the policy admits at all.
      uint32_t admissible = 0;
      for (uint32_t i = 0; i < s->worker_count; ++i) {
        admissible += s->workers[i].state != PCP_TOPOLOGY_WORKER_OFFLINE &&
                      pcp_topology_sched_policy_allows(
                          p, s->workers[i].worker_class, s->workers[i].arch);
      }
      if (admissible >= p->reserved_workers) {
        return PCP_TOPOLOGY_SCHED_INVARIANT_RESERVED_CAPACITY_STARVED;
      }
    }
  }
  for (uint32_t q = 0; q < s->queue_count; ++q) {
    int32_t r = s->queue[q].reservation;
    if (r >= 0 && !s->reservations[r].active) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_QUEUED_RESERVATION_MISSING;
    }
  }
  uint32_t held = 0;
  for (uint32_t r = 0; r < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++r) {
    if (!s->reservations[r].active) {
      continue;
    }
    if (held & s->reservations[r].worker_mask) {
      return PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION;
    }
    held |= s->reservations[r].worker_mask;
  }
  return PCP_TOPOLOGY_SCHED_INVARIANT_OK;
}

//===----------------------------------------------------------------------===//
// Federation hub: gateway registry and placement
//===----------------------------------------------------------------------===//

void pcp_topology_federation_initialize(pcp_topology_federation_t* out) {
  memset(out, 0, sizeof(*out));
}

int32_t pcp_topology_federation_register(pcp_topology_federation_t* f,
                                         const char* name) {
  for (uint32_t i = 0; i < f->gateway_count; ++i) {
    if (strcmp(f->gateways[i].name, name) == 0) {
      f->gateways[i].connected = true;
      f->gateways[i].generation++;
      return (int32_t)i;
    }
  }
  if (f->gateway_count >= PCP_TOPOLOGY_FEDERATION_MAX_GATEWAYS)
    return -1;
  pcp_topology_federation_gateway_t* g = &f->gateways[f->gateway_count];
  memset(g, 0, sizeof(*g));
  g->name = name;
  g->connected = true;
  g->generation = 1;
  return (int32_t)f->gateway_count++;
}

bool pcp_topology_federation_add_service(
    pcp_topology_federation_t* f, int32_t gateway,
    const pcp_topology_federation_service_t* service) {
  if (gateway < 0 || (uint32_t)gateway >= f->gateway_count)
    return false;
  pcp_topology_federation_gateway_t* g = &f->gateways[gateway];
  if (g->service_count >= PCP_TOPOLOGY_FEDERATION_MAX_SERVICES)
    return false;
  g->services[g->service_count++] = *service;
  return true;
}

void pcp_topology_federation_mark_stale(pcp_topology_federation_t* f,
                                        int32_t gateway) {
  if (gateway < 0 || (uint32_t)gateway >= f->gateway_count)
    return;
  f->gateways[gateway].connected = false;
  f->gateways[gateway].generation++;
}

void pcp_topology_federation_lose_gateway(pcp_topology_federation_t* f,
                                          int32_t gateway) {
  pcp_topology_federation_mark_stale(f, gateway);
}

// Placement is the hub's real registry (sched.h "Federation"), built from
// the model's gateways for each decision: the model no longer restates the
// rules, so a check of the model is a check of the hub. A model type T
// matches a service whose type is T or that lists T as a capability: the
// service is advertised with its type among its capabilities and the
// registry asked for capability T. Stale gateways are connected 10 ns in
// the past with a 1 ns interval (so they are past the 3-interval limit);
// connected ones at the decision time. The injected bug is the registry's
// own test-only option.
static void place_from_status(pcp_status_t status,
                              pcp_topology_federation_placement_t* p) {
  switch (pcp_status_code(status)) {
    case PCP_STATUS_NOT_FOUND:
      p->violation = PCP_TOPOLOGY_FEDERATION_VIOLATION_UNKNOWN_GATEWAY;
      break;
    case PCP_STATUS_FAILED_PRECONDITION:
      p->violation = PCP_TOPOLOGY_FEDERATION_VIOLATION_STALE_GATEWAY;
      break;
    case PCP_STATUS_UNAVAILABLE:
      p->violation = PCP_TOPOLOGY_FEDERATION_VIOLATION_INCOMPATIBLE_GATEWAY;
      break;
    default:
      p->violation = PCP_TOPOLOGY_FEDERATION_VIOLATION_INVALID_REQUEST;
      break;
  }
  pcp_status_ignore(status);
}

static pcp_status_t registry_build(const pcp_topology_federation_t* f,
                                   pcp_sched_federation_t* registry,
                                   int64_t now_ns) {
  static const char* const kServiceIds[] = {"s0", "s1", "s2", "s3",
                                            "s4", "s5", "s6", "s7"};
  static_assert(
      PCP_ARRAYSIZE(kServiceIds) == PCP_TOPOLOGY_FEDERATION_MAX_SERVICES,
      "one service id per model service slot");
  for (uint32_t g = 0; g < f->gateway_count; ++g) {
    const pcp_topology_federation_gateway_t* gateway = &f->gateways[g];
    pcp_sched_federation_service_t
        services[PCP_TOPOLOGY_FEDERATION_MAX_SERVICES];
    const char* caps[PCP_TOPOLOGY_FEDERATION_MAX_SERVICES]
                    [PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES + 1];
    for (uint32_t i = 0; i < gateway->service_count; ++i) {
      const pcp_topology_federation_service_t* in = &gateway->services[i];
      pcp_sched_federation_service_t* out = &services[i];
      pcp_sched_federation_service_initialize(out);
      out->service_id = kServiceIds[i];
      out->service_type = in->service_type;
      out->health_status = in->health_ok ? "ok" : "degraded";
      out->workers_available = in->workers_available;
      out->workers_ready = in->workers_ready;
      // 0 would mean "the connect's time": shift by one, order kept.
      out->updated_at_wall_ns =
          (int64_t)(in->updated_at & (UINT64_MAX >> 2)) + 1;
      uint32_t count = 0;
      caps[i][count++] = in->service_type;
      for (size_t k = 0; k < PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES; ++k) {
        if (in->capabilities[k]) {
          caps[i][count++] = in->capabilities[k];
        }
      }
      out->capabilities = caps[i];
      out->capability_count = count;
    }
    pcp_sched_federation_connect_t request = {
        .gateway_id = gateway->name,
        .lab_id = "model",
        .base_url = "http://127.0.0.1:1",
        .graph_backend = "model",
        .services = services,
        .service_count = gateway->service_count,
        .registered_services = PCP_SCHED_FEDERATION_COUNT_ABSENT,
    };
    PCP_RETURN_IF_ERROR_BARE(pcp_sched_federation_connect(
        registry, &request, gateway->connected ? now_ns : now_ns - 10, 0,
        NULL));
  }
  return pcp_ok_status();
}

pcp_topology_federation_placement_t pcp_topology_federation_place(
    const pcp_topology_federation_t* f,
    const pcp_topology_federation_selector_t* selector) {
  pcp_topology_federation_placement_t p;
  memset(&p, 0, sizeof(p));
  p.gateway = -1;
  p.service = -1;
  if (!selector || !selector->service_type || !*selector->service_type) {
    p.violation = PCP_TOPOLOGY_FEDERATION_VIOLATION_INVALID_REQUEST;
    return p;
  }
  pcp_sched_federation_options_t options;
  pcp_sched_federation_options_initialize(&options);
  options.heartbeat_interval_ns = 1;
  options.max_gateways = PCP_TOPOLOGY_FEDERATION_MAX_GATEWAYS;
  options.bug_accept_stale = f->bug_accept_stale;
  pcp_sched_federation_t* registry = NULL;
  pcp_status_t status =
      pcp_sched_federation_create(&options, pcp_allocator_system(), &registry);
  const int64_t now_ns = 100;
  if (!status) {
    status = registry_build(f, registry, now_ns);
  }
  pcp_sched_federation_placement_t placement;
  if (!status) {
    pcp_sched_federation_selector_t wanted = {
        .capability = selector->service_type,
        .gateway_id = selector->gateway,
        .workers_required = selector->workers_required,
    };
    status = pcp_sched_federation_place(registry, &wanted, now_ns, &placement);
  }
  pcp_sched_federation_release(registry);
  if (status) {
    place_from_status(status, &p);
    return p;
  }
  for (uint32_t g = 0; g < f->gateway_count; ++g) {
    if (strcmp(f->gateways[g].name, placement.gateway_id) == 0) {
      p.gateway = (int32_t)g;
    }
  }
  p.service = placement.service_id[1] - '0';
  PCP_ASSERT(p.gateway >= 0 && p.service >= 0 &&
             (uint32_t)p.service < f->gateways[p.gateway].service_count);
  p.placed = true;
  p.generation = f->gateways[p.gateway].generation;
  return p;
}

pcp_topology_federation_violation_t pcp_topology_federation_complete_routed(
    const pcp_topology_federation_t* f,
    const pcp_topology_federation_placement_t* placement) {
  if (!placement->placed)
    return placement->violation;
  const pcp_topology_federation_gateway_t* g = &f->gateways[placement->gateway];
  if (!g->connected || g->generation != placement->generation) {
    return PCP_TOPOLOGY_FEDERATION_VIOLATION_FAILED_AFTER_PLACEMENT_LOSS;
  }
  return PCP_TOPOLOGY_FEDERATION_VIOLATION_NONE;
}

//===----------------------------------------------------------------------===//
// Decoupled DiLoCo fragment window
//===----------------------------------------------------------------------===//

void pcp_topology_vector_clock_tick(pcp_topology_vector_clock_t* clock,
                                    uint32_t node) {
  if (node < PCP_TOPOLOGY_VECTOR_CLOCK_NODES)
    clock->counters[node]++;
}

void pcp_topology_vector_clock_observe(
    pcp_topology_vector_clock_t* clock,
    const pcp_topology_vector_clock_t* other) {
  for (uint32_t i = 0; i < PCP_TOPOLOGY_VECTOR_CLOCK_NODES; ++i) {
    if (other->counters[i] > clock->counters[i]) {
      clock->counters[i] = other->counters[i];
    }
  }
}

uint64_t pcp_topology_vector_clock_counter(
    const pcp_topology_vector_clock_t* clock, uint32_t node) {
  return node < PCP_TOPOLOGY_VECTOR_CLOCK_NODES ? clock->counters[node] : 0;
}

pcp_status_t pcp_topology_event_tape_append(
    pcp_topology_event_tape_t* tape, const pcp_topology_tape_entry_t* entry) {
  if (tape->count >= PCP_TOPOLOGY_TAPE_MAX_ENTRIES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "event tape holds at most %u entries",
                           PCP_TOPOLOGY_TAPE_MAX_ENTRIES);
  }
  tape->entries[tape->count++] = *entry;
  return pcp_ok_status();
}

const pcp_topology_tape_entry_t* pcp_topology_event_tape_replay_fragment_sync(
    const pcp_topology_event_tape_t* tape, uint32_t step, uint32_t fragment) {
  for (uint32_t i = 0; i < tape->count; ++i) {
    const pcp_topology_tape_entry_t* e = &tape->entries[i];
    if (e->kind == PCP_TOPOLOGY_TAPE_FRAGMENT_SYNC && e->step == step &&
        e->fragment == fragment) {
      return e;
    }
  }
  return NULL;
}

pcp_status_t pcp_topology_decoupled_quorum_validate(uint32_t quorum,
                                                    uint32_t worker_count) {
  // The worker count is checked first: no quorum is meaningful without
  // workers.
  if (worker_count == 0) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_INVALID_WORKER_COUNT,
                                    "a decoupled session needs a worker");
  }
  if (quorum == 0 || quorum > worker_count) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_INVALID_QUORUM,
                                    "quorum %u outside 1..%u", quorum,
                                    worker_count);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_decoupled_fragment_validate(uint32_t fragment_index,
                                                      uint32_t fragment_count) {
  if (fragment_count == 0) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_INVALID_FRAGMENT_COUNT,
                                    "a decoupled model needs a fragment");
  }
  if (fragment_index >= fragment_count) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_INVALID_FRAGMENT_INDEX,
                                    "fragment %u of %u", fragment_index,
                                    fragment_count);
  }
  return pcp_ok_status();
}

// The window itself (initialize, apply, resume) runs the real state machine:
// decoupled_model.c.

void pcp_topology_decoupled_collect(
    const pcp_topology_decoupled_t* d, bool fragments,
    const pcp_topology_decoupled_response_t* responses, size_t count,
    pcp_topology_decoupled_collection_t* out) {
  memset(out, 0, sizeof(*out));
  uint64_t seen = 0;
  for (size_t i = 0; i < count; ++i) {
    const pcp_topology_decoupled_response_t* r = &responses[i];
    bool match = r->request_id == d->session;
    if (fragments) {
      match = match && r->round == d->step && r->task == d->fragment + 1;
    }
    if (!match || r->sender >= 64) {
      out->ignored++;
      continue;
    }
    out->matched++;
    if (fragments && !r->payload_consistent) {
      out->violation =
          PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH;
      continue;
    }
    if ((seen >> r->sender) & 1u) {
      out->duplicates++;
      continue;
    }
    seen |= 1ull << r->sender;
    out->accepted++;
    out->unique++;
  }
}

//===----------------------------------------------------------------------===//
// RDA merge: the referee's formula, in double and written apart from the
// library's (decoupled_conformance_test compares the two)
//===----------------------------------------------------------------------===//

double pcp_topology_token_step_weight(uint64_t tokens, uint64_t steps) {
  if (tokens == 0)
    return 0.0;
  double t = (double)tokens;
  double w = t * t / (double)(steps ? steps : 1);
  return w > 3.4028234663852886e38 ? 3.4028234663852886e38 : w;
}

static double norm(const double* v, size_t dimension) {
  double sum = 0.0;
  for (size_t i = 0; i < dimension; ++i) sum += v[i] * v[i];
  return sqrt(sum);
}

bool pcp_topology_rda_merge(const pcp_topology_rda_update_t* updates,
                            size_t update_count, size_t dimension,
                            double* out) {
  double weight_sum = 0.0, norm_sum = 0.0;
  double u[PCP_TOPOLOGY_RDA_MAX_DIMENSION] = {0};
  if (dimension > PCP_TOPOLOGY_RDA_MAX_DIMENSION)
    return false;
  for (size_t i = 0; i < dimension; ++i) out[i] = 0.0;
  for (size_t k = 0; k < update_count; ++k) {
    double w =
        pcp_topology_token_step_weight(updates[k].tokens, updates[k].steps);
    double n = norm(updates[k].values, dimension);
    weight_sum += w;
    norm_sum += w * n;
    if (n == 0.0)
      continue;
    for (size_t i = 0; i < dimension; ++i) {
      u[i] += w * updates[k].values[i] / n;
    }
  }
  double u_norm = norm(u, dimension);
  // Unusable weights or a cancelling direction: the merge is zero.
  if (!(weight_sum > 0.0) || !isfinite(weight_sum) || u_norm == 0.0) {
    return true;
  }
  double scale = (norm_sum / weight_sum) / u_norm;
  for (size_t i = 0; i < dimension; ++i) out[i] = scale * u[i];
  return true;
}

void pcp_topology_direct_average(const pcp_topology_rda_update_t* updates,
                                 size_t update_count, size_t dimension,
                                 double* out) {
  for (size_t i = 0; i < dimension; ++i) {
    out[i] = 0.0;
    for (size_t k = 0; k < update_count; ++k) out[i] += updates[k].values[i];
    if (update_count)
      out[i] /= (double)update_count;
  }
}
