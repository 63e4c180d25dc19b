// SPDX-License-Identifier: Apache-2.0
//
// sched: the gateway's worker registry, capability matching, leases per
// owner, two-phase reservations and reassignment when a worker dies.
//
// This module is pure bookkeeping: no I/O, no threads, no clock reads. Every
// call that depends on time takes |now_ns| (monotonic nanoseconds from the
// caller's pcp_clock_t), so the same sequence of calls always produces the
// same state, the same orderings and the same events; the deterministic
// simulator and the tests rely on that. The fabric endpoint tells the
// scheduler what it sees (joins, heartbeats, disconnects) and acts on what the
// scheduler returns (events, lease ids).
//
// Model (upstream reference s.5, with the differences listed in
// docs/decisions.md "sched:"):
//   - A worker is one device, keyed by its stable id (upstream s.1.4). Its
//     worker class is derived from its backend (upstream s.5.2).
//   - A worker is held by at most one thing at a time: one lease or one
//     reservation slot. A lease belongs to exactly one owner (inference,
//     training, rl, jobs) and has a scheduler-wide unique id that is never
//     reused, plus an opaque caller |tag| (job or task id).
//   - Each owner has a policy: class/target filter, |max_workers| (everything
//     it holds: leases, detached leases and reservation slots) and
//     |reserved_workers| (capacity other owners may not take; rule below).
//   - A reservation holds workers for an owner until |deadline_ns|; commit
//     turns its workers into leases, release frees them, and a tick after the
//     deadline expires it (upstream has no expiry).
//   - When a worker is lost, its lease moves to a free eligible worker if one
//     exists (REASSIGNED: re-run the work there); otherwise the lease is
//     DETACHED: it keeps its id, owner and tag but has no worker. A detached
//     lease comes back to the same worker if that worker rejoins and becomes
//     ready before the lease's grace deadline with capabilities that still
//     match (RESUMED); a tick may move it to any other free eligible worker
//     (REASSIGNED); a tick past the deadline ends it (EXPIRED).
//
// Reservation protection rule (upstream s.5.3 rule 4, narrowed): for an owner
// R with reserved_workers > 0, secured(R) = workers R holds (leased or in a
// reservation) + READY unheld workers matching R's policy. A lease or
// reservation by another owner may take a worker w only if w does not match
// R's policy, or secured(R) stays >= reserved(R) after taking it. Upstream
// evaluates the whole inequality even when w is irrelevant to R, which blocks
// every owner as soon as the fleet shrinks below a reservation; we only refuse
// workers that R could actually use.
//
// Threading: a pcp_sched_t is thread-compatible (one owner at a time; the
// gateway calls it from its loop thread). That includes the const queries:
// pcp_sched_worker_match and pcp_sched_owner_stats_query sort in scratch
// tables inside the scheduler, so two threads may not query concurrently.
// Ownership: strings passed in are copied; results are written into caller
// storage; nothing returned borrows from the scheduler.

#ifndef PCP_SCHED_SCHED_H_
#define PCP_SCHED_SCHED_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

// Longest worker id and node manager id, in bytes (the sanitized form of
// upstream s.1.4: [A-Za-z0-9._-] only).
#define PCP_SCHED_WORKER_ID_MAX_LENGTH 127
// Longest target name ("sm_80", "gfx942", "host").
#define PCP_SCHED_TARGET_MAX_LENGTH 31
// Longest worker class name ("gen", "train"): the operator's label a worker
// joins with (--worker-class) and a task, job or served model names to run
// only there. 1..63 bytes of [A-Za-z0-9._-]; "" or NULL means any class.
#define PCP_SCHED_CLASS_NAME_MAX_LENGTH 63
// Most workers one acquire or reservation may ask for (upstream
// worker_count_max, s.5.8).
#define PCP_SCHED_REQUEST_WORKER_COUNT_MAX 1024u
// Hard ceiling on pcp_sched_options_t.max_workers.
#define PCP_SCHED_REGISTRY_WORKER_COUNT_MAX 65536u
// pcp_sched_owner_policy_t.max_workers meaning "no limit" (upstream default).
#define PCP_SCHED_UNLIMITED UINT32_MAX

//===----------------------------------------------------------------------===//
// Vocabulary
//===----------------------------------------------------------------------===//

typedef enum pcp_sched_backend_e {
  PCP_SCHED_BACKEND_CPU = 0,
  PCP_SCHED_BACKEND_CUDA = 1,
  PCP_SCHED_BACKEND_ROCM = 2,
  PCP_SCHED_BACKEND_VULKAN = 3,
  PCP_SCHED_BACKEND_METAL = 4,
  PCP_SCHED_BACKEND_COUNT_ = 5,
} pcp_sched_backend_t;

// Upstream's worker class: ANY in a policy or constraint, otherwise the class
// of a worker is its backend (s.5.2). Kept as its own enum so that ANY cannot
// be reported by a worker.
typedef enum pcp_sched_worker_class_e {
  PCP_SCHED_WORKER_CLASS_ANY = 0,
  PCP_SCHED_WORKER_CLASS_CPU = 1,
  PCP_SCHED_WORKER_CLASS_CUDA = 2,
  PCP_SCHED_WORKER_CLASS_ROCM = 3,
  PCP_SCHED_WORKER_CLASS_VULKAN = 4,
  PCP_SCHED_WORKER_CLASS_METAL = 5,
  PCP_SCHED_WORKER_CLASS_COUNT_ = 6,
} pcp_sched_worker_class_t;

// JOINING: registered, not schedulable yet (handshake, program set-up).
// READY: schedulable and holds nothing. BUSY: holds a lease or a reservation
// slot. DRAINING: keeps what it holds, gets nothing new. LOST: silent or
// disconnected; holds nothing; keeps its identity until removed.
typedef enum pcp_sched_worker_state_e {
  PCP_SCHED_WORKER_STATE_JOINING = 0,
  PCP_SCHED_WORKER_STATE_READY = 1,
  PCP_SCHED_WORKER_STATE_BUSY = 2,
  PCP_SCHED_WORKER_STATE_DRAINING = 3,
  PCP_SCHED_WORKER_STATE_LOST = 4,
  PCP_SCHED_WORKER_STATE_COUNT_ = 5,
} pcp_sched_worker_state_t;

// Upstream's fixed owners (inference 0, training 1, rl 2) plus generic jobs.
typedef enum pcp_sched_owner_e {
  PCP_SCHED_OWNER_INFERENCE = 0,
  PCP_SCHED_OWNER_TRAINING = 1,
  PCP_SCHED_OWNER_RL = 2,
  PCP_SCHED_OWNER_JOBS = 3,
  PCP_SCHED_OWNER_COUNT_ = 4,
} pcp_sched_owner_t;

// Lower-case names ("cuda", "ready", "training"); "unknown" out of range.
const char* pcp_sched_backend_name(pcp_sched_backend_t backend);
const char* pcp_sched_worker_class_name(pcp_sched_worker_class_t worker_class);
const char* pcp_sched_worker_state_name(pcp_sched_worker_state_t state);
const char* pcp_sched_owner_name(pcp_sched_owner_t owner);
// Parse the names above. False when unknown.
bool pcp_sched_backend_parse(pcp_string_view_t name,
                             pcp_sched_backend_t* out_backend);
bool pcp_sched_worker_class_parse(pcp_string_view_t name,
                                  pcp_sched_worker_class_t* out_class);
bool pcp_sched_owner_parse(pcp_string_view_t name,
                           pcp_sched_owner_t* out_owner);
// The class a worker with |backend| reports (never ANY).
pcp_sched_worker_class_t pcp_sched_worker_class_from_backend(
    pcp_sched_backend_t backend);

// True when |name| is a worker class name: 1..PCP_SCHED_CLASS_NAME_MAX_LENGTH
// bytes of [A-Za-z0-9._-]. NULL and "" are not names (they mean "any class"
// where a field allows that). Every place a class name enters (the worker's
// flag, model.json, experiments) checks it with this one function.
bool pcp_sched_class_name_is_valid(const char* name);

// A worker id held by value, so that results never borrow scheduler memory.
typedef struct pcp_sched_worker_id_t {
  char value[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
} pcp_sched_worker_id_t;

//===----------------------------------------------------------------------===//
// Scheduler lifetime
//===----------------------------------------------------------------------===//

typedef struct pcp_sched_options_t {
  // Registry size (1..PCP_SCHED_REGISTRY_WORKER_COUNT_MAX). LOST workers
  // count until removed; a join into a full registry evicts the worker lost
  // longest ago (as pcp_sched_worker_remove would), and fails with
  // RESOURCE_EXHAUSTED only if none is lost.
  uint32_t max_workers;
  // Live leases, attached or detached (>= 1).
  uint32_t max_leases;
  // Open reservations (>= 1).
  uint32_t max_reservations;
  // A worker whose last heartbeat is this old is marked lost by the next
  // tick. 0 disables the sweep (the caller marks workers lost itself).
  int64_t heartbeat_timeout_ns;
  // How long a detached lease waits for a worker (its own, rejoining, or any
  // other that fits) before a tick ends it. >= 0.
  int64_t lease_rejoin_grace_ns;
} pcp_sched_options_t;

// Defaults: 1024 workers, 2048 leases, 64 reservations, 10 s heartbeat
// timeout, 30 s rejoin grace.
void pcp_sched_options_initialize(pcp_sched_options_t* out_options);

typedef struct pcp_sched_t pcp_sched_t;

// Creates an empty scheduler; every owner starts with the policy {ANY, no
// target, reserved 0, max unlimited}. All memory is allocated here, up front,
// from |allocator|; no later call allocates. Returns INVALID_ARGUMENT for
// options out of range, RESOURCE_EXHAUSTED when allocation fails.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_create(const pcp_sched_options_t* options, pcp_allocator_t allocator,
                 pcp_sched_t** out_sched);

// Frees |sched| (NULL is a no-op).
void pcp_sched_release(pcp_sched_t* sched);

//===----------------------------------------------------------------------===//
// Owner policies
//===----------------------------------------------------------------------===//

typedef struct pcp_sched_owner_policy_t {
  pcp_sched_worker_class_t worker_class;  // ANY or one class
  // Required target, NULL or "" for any. A worker with no target never
  // matches a policy that names one (upstream s.5.2). Copied.
  const char* target;
  uint32_t reserved_workers;  // <= max_workers
  uint32_t max_workers;       // PCP_SCHED_UNLIMITED for no limit
} pcp_sched_owner_policy_t;

// Replaces |owner|'s policy. INVALID_ARGUMENT for a bad owner, class, target
// or reserved > max; FAILED_PRECONDITION when |max_workers| is below what the
// owner already holds or a held worker would no longer match (release first).
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_owner_policy_set(pcp_sched_t* sched, pcp_sched_owner_t owner,
                           const pcp_sched_owner_policy_t* policy);

typedef struct pcp_sched_owner_stats_t {
  uint32_t leased_workers;    // leases with a worker
  uint32_t detached_leases;   // leases waiting for a worker
  uint32_t reserved_slots;    // workers held by the owner's reservations
  uint32_t reserved_workers;  // policy
  uint32_t max_workers;       // policy
  // Workers the owner could additionally lease right now under its policy
  // alone (upstream "available", computed greedily with the protection rule).
  uint32_t available_workers;
} pcp_sched_owner_stats_t;

// INVALID_ARGUMENT for a bad owner.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_owner_stats_query(const pcp_sched_t* sched, pcp_sched_owner_t owner,
                            pcp_sched_owner_stats_t* out_stats);

// Writes |owner|'s live lease ids (attached and detached) in ascending order.
// |out_count| receives the total; RESOURCE_EXHAUSTED (nothing written past
// |capacity|) when it exceeds |capacity|.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_owner_leases_list(
    const pcp_sched_t* sched, pcp_sched_owner_t owner, uint64_t* out_lease_ids,
    size_t capacity, size_t* out_count);

//===----------------------------------------------------------------------===//
// Events
//===----------------------------------------------------------------------===//

typedef enum pcp_sched_event_kind_e {
  PCP_SCHED_EVENT_NONE = 0,
  // A silent worker was marked lost by a tick; it held nothing.
  PCP_SCHED_EVENT_WORKER_LOST = 1,
  // The lease moved from |worker_id| (the worker that last held it, now
  // lost; |worker_lost| is false when a tick moves an already detached
  // lease) to |new_worker_id|: re-run the lease's work there.
  PCP_SCHED_EVENT_LEASE_REASSIGNED = 2,
  // |worker_id| was lost and no worker was free: the lease waits.
  PCP_SCHED_EVENT_LEASE_DETACHED = 3,
  // The lease's own worker came back in time and holds it again.
  PCP_SCHED_EVENT_LEASE_RESUMED = 4,
  // A detached lease passed its grace deadline and no longer exists.
  PCP_SCHED_EVENT_LEASE_EXPIRED = 5,
  // A reservation passed its deadline uncommitted; its workers are free.
  PCP_SCHED_EVENT_RESERVATION_EXPIRED = 6,
  // A reserved worker was lost with no replacement free: the whole
  // reservation is gone and its other workers are free.
  PCP_SCHED_EVENT_RESERVATION_BROKEN = 7,
} pcp_sched_event_kind_t;

typedef struct pcp_sched_event_t {
  pcp_sched_event_kind_t kind;
  pcp_sched_owner_t owner;          // LEASE_* and RESERVATION_*
  uint64_t lease_id;                // LEASE_*; 0 otherwise
  uint64_t reservation_id;          // RESERVATION_*; 0 otherwise
  uint64_t tag;                     // the lease's or reservation's caller tag
  bool worker_lost;                 // the event comes from |worker_id|'s loss
  pcp_sched_worker_id_t worker_id;  // the worker the event is about
  pcp_sched_worker_id_t new_worker_id;  // REASSIGNED, RESUMED: new holder
} pcp_sched_event_t;

const char* pcp_sched_event_kind_name(pcp_sched_event_kind_t kind);

// Advances time to |now_ns|: marks silent workers lost, expires reservations
// and detached leases past their deadlines, then moves detached leases onto
// free eligible workers, in that order and each in ascending id order. Writes
// one event per change into |out_events|; when |capacity| fills up it stops
// before the next change, so a caller that sees *out_count == capacity calls
// again with the same |now_ns| to continue. INVALID_ARGUMENT only for a NULL
// |out_events| or a zero |capacity| (which could never make progress).
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_tick(pcp_sched_t* sched,
                                                int64_t now_ns,
                                                pcp_sched_event_t* out_events,
                                                size_t capacity,
                                                size_t* out_count);

//===----------------------------------------------------------------------===//
// Worker registry
//===----------------------------------------------------------------------===//

// What a worker reports when it joins (fabric JOIN). Strings are copied.
typedef struct pcp_sched_worker_info_t {
  const char* id;  // stable id, [A-Za-z0-9._-], 1..127 bytes
  pcp_sched_backend_t backend;
  const char* target;  // NULL or "" when the worker has none
  int32_t device_id;   // >= 0
  uint64_t device_memory_bytes;
  const char* node_manager_id;  // NULL or "" when unmanaged
} pcp_sched_worker_info_t;

// Registers a worker in JOINING with its heartbeat at |now_ns|. A known id in
// state LOST rejoins: same identity and history, capabilities replaced by
// |info|. INVALID_ARGUMENT for a malformed |info|; ALREADY_EXISTS for a known
// id that is not LOST (mark it lost first); RESOURCE_EXHAUSTED when the
// registry is full and no LOST worker can be evicted.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_worker_join(
    pcp_sched_t* sched, const pcp_sched_worker_info_t* info, int64_t now_ns);

// JOINING -> READY (DRAINING -> READY/BUSY undoes a drain). If a detached
// lease last held by this worker is still inside its grace deadline and the
// worker still matches the lease's constraint and owner policy, the lowest
// such lease id is attached again and |out_event| (optional) gets
// LEASE_RESUMED; otherwise its kind is NONE. NOT_FOUND for an unknown id;
// FAILED_PRECONDITION from READY, BUSY or LOST.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_worker_ready(pcp_sched_t* sched, const char* worker_id,
                       int64_t now_ns, pcp_sched_event_t* out_event);

// Sets the worker class name a worker joined with (fabric JOIN's
// worker_class; NULL or "": none), which pcp_sched_lease_acquire_class
// matches. A join (and a rejoin) clears it, so the caller sets it after
// every join; pcp_sched_worker_update keeps it. Kept out of
// pcp_sched_worker_info_t so that the struct's positional initializers
// elsewhere stay valid. NOT_FOUND; INVALID_ARGUMENT for a malformed name
// (pcp_sched_class_name_is_valid); FAILED_PRECONDITION while it holds a
// lease or reservation slot, or is LOST.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_worker_class_name_set(
    pcp_sched_t* sched, const char* worker_id, const char* class_name);

// Replaces the capabilities of a worker that holds nothing (the id in |info|
// names it). NOT_FOUND; INVALID_ARGUMENT for a malformed |info|;
// FAILED_PRECONDITION while it holds a lease or reservation slot, or is LOST.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_worker_update(
    pcp_sched_t* sched, const pcp_sched_worker_info_t* info);

// Records a heartbeat at |now_ns| with the worker's load in permille (0..1000,
// used to order candidates). NOT_FOUND; FAILED_PRECONDITION when LOST (a lost
// worker must rejoin); INVALID_ARGUMENT for load > 1000.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_worker_heartbeat(pcp_sched_t* sched, const char* worker_id,
                           int64_t now_ns, uint32_t load_permille);

// READY/BUSY -> DRAINING: keeps what it holds, never gets anything new.
// NOT_FOUND; FAILED_PRECONDITION from JOINING or LOST. Draining twice is OK.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_worker_drain(pcp_sched_t* sched,
                                                        const char* worker_id);

// Marks a worker LOST (connection closed, or the caller's own timeout). What
// it held is handled as described at the top and reported in |out_event|
// (optional): LEASE_REASSIGNED or LEASE_DETACHED for a lease, nothing or
// RESERVATION_BROKEN for a reservation slot (a free worker silently takes
// the slot), NONE when it held nothing. A worker holds at most one thing, so
// one event is the whole list. NOT_FOUND; FAILED_PRECONDITION if already
// LOST.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_worker_mark_lost(pcp_sched_t* sched, const char* worker_id,
                           int64_t now_ns, pcp_sched_event_t* out_event);

// Forgets a worker. One that is not LOST is marked lost first (|out_event| as
// for mark_lost). Detached leases it last held can no longer resume on it but
// may still be reassigned by a tick. NOT_FOUND.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_worker_remove(pcp_sched_t* sched, const char* worker_id,
                        int64_t now_ns, pcp_sched_event_t* out_event);

typedef struct pcp_sched_worker_status_t {
  pcp_sched_worker_id_t id;
  pcp_sched_backend_t backend;
  pcp_sched_worker_class_t worker_class;
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];  // "" when none
  int32_t device_id;
  uint64_t device_memory_bytes;
  pcp_sched_worker_id_t node_manager_id;                 // "" when none
  char class_name[PCP_SCHED_CLASS_NAME_MAX_LENGTH + 1];  // "" when none
  pcp_sched_worker_state_t state;
  int64_t last_heartbeat_ns;
  int64_t lost_at_ns;  // when last marked lost; 0 if never
  uint32_t load_permille;
  uint64_t lease_id;        // 0 when not leased
  pcp_sched_owner_t owner;  // meaningful when lease_id or reservation_id != 0
  uint64_t reservation_id;  // 0 when not in a reservation
  uint64_t lease_grant_count;  // leases ever attached to this worker
} pcp_sched_worker_status_t;

// NOT_FOUND for an unknown id.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_worker_query(const pcp_sched_t* sched, const char* worker_id,
                       pcp_sched_worker_status_t* out_status);

// Registered workers in |state|, or all of them for
// PCP_SCHED_WORKER_STATE_COUNT_.
uint32_t pcp_sched_worker_count(const pcp_sched_t* sched,
                                pcp_sched_worker_state_t state);

//===----------------------------------------------------------------------===//
// Capability matching
//===----------------------------------------------------------------------===//

typedef struct pcp_sched_constraint_t {
  pcp_sched_worker_class_t worker_class;  // ANY or one class
  const char* target;                     // NULL or "" for any
  uint64_t min_device_memory_bytes;
  uint32_t worker_count;  // workers wanted (acquire, reserve); 1..1024
} pcp_sched_constraint_t;

// Writes the ids of READY workers that hold nothing and satisfy |constraint|
// (its worker_count is ignored), ordered by reported load, then device memory
// (smallest that fits first, keeping large devices for large requests), then
// id. Owner policies are not applied here; acquire applies them.
// |out_count| receives the total; RESOURCE_EXHAUSTED when it exceeds
// |capacity| (the first |capacity| are written). INVALID_ARGUMENT for a bad
// constraint.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_worker_match(
    const pcp_sched_t* sched, const pcp_sched_constraint_t* constraint,
    pcp_sched_worker_id_t* out_worker_ids, size_t capacity, size_t* out_count);

//===----------------------------------------------------------------------===//
// Leases
//===----------------------------------------------------------------------===//

// Leases constraint->worker_count workers to |owner|, all or nothing. A
// candidate must match |constraint| and the owner's policy and pass the
// protection rule; candidates that no other owner's reservation needs are
// taken first, then in pcp_sched_worker_match order. Lease ids are written to
// |out_lease_ids| (capacity >= worker_count) in ascending order.
// INVALID_ARGUMENT: bad owner or constraint, worker_count 0 or > 1024, small
// |capacity|. RESOURCE_EXHAUSTED: the owner's max_workers or the lease table
// would overflow. UNAVAILABLE: not enough eligible workers (nothing leased).
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_lease_acquire(pcp_sched_t* sched, pcp_sched_owner_t owner,
                        const pcp_sched_constraint_t* constraint, uint64_t tag,
                        uint64_t* out_lease_ids, size_t capacity);

// pcp_sched_lease_acquire restricted to workers whose class name
// (pcp_sched_worker_class_name_set) equals |class_name|; NULL or "" is
// exactly pcp_sched_lease_acquire. The name stays with each lease, so a
// reassignment after a loss (and a resume) only picks a worker of the same
// class. INVALID_ARGUMENT also for a malformed name.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_lease_acquire_class(
    pcp_sched_t* sched, pcp_sched_owner_t owner,
    const pcp_sched_constraint_t* constraint, const char* class_name,
    uint64_t tag, uint64_t* out_lease_ids, size_t capacity);

// Ends a lease; its worker (if any) becomes READY (or stays DRAINING).
// NOT_FOUND for an id that is not live (never issued, released, expired);
// ids are never reused, so a double release is always NOT_FOUND.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_lease_release(pcp_sched_t* sched,
                                                         uint64_t lease_id);

// Moves a live lease to |new_owner| (same id, worker and tag). NOT_FOUND;
// INVALID_ARGUMENT for a bad owner; RESOURCE_EXHAUSTED past the new owner's
// max_workers; FAILED_PRECONDITION when the worker does not match the new
// owner's policy. Transferring to the current owner is a no-op.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_lease_transfer(
    pcp_sched_t* sched, uint64_t lease_id, pcp_sched_owner_t new_owner);

typedef struct pcp_sched_lease_status_t {
  uint64_t lease_id;
  pcp_sched_owner_t owner;
  uint64_t tag;
  bool detached;                    // no worker right now
  pcp_sched_worker_id_t worker_id;  // holder, or the last holder if detached
  int64_t detached_deadline_ns;     // when detached: expiry at this time
} pcp_sched_lease_status_t;

// NOT_FOUND for an id that is not live.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_lease_query(const pcp_sched_t* sched, uint64_t lease_id,
                      pcp_sched_lease_status_t* out_status);

//===----------------------------------------------------------------------===//
// Reservations (two-phase placement, upstream s.5.5)
//===----------------------------------------------------------------------===//

// Holds constraint->worker_count workers for |owner| until |deadline_ns|
// (> now_ns), chosen as acquire chooses. Reserved workers count against the
// owner's max_workers and are BUSY. INVALID_ARGUMENT as for acquire and for a
// deadline not after |now_ns|; RESOURCE_EXHAUSTED past max_workers or the
// reservation table; UNAVAILABLE when not enough workers are eligible.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_reservation_reserve(
    pcp_sched_t* sched, pcp_sched_owner_t owner,
    const pcp_sched_constraint_t* constraint, uint64_t tag, int64_t now_ns,
    int64_t deadline_ns, uint64_t* out_reservation_id);

// Turns the reservation into one lease per worker (ids ascending in
// |out_lease_ids|, capacity >= its worker count) carrying the reservation's
// tag. NOT_FOUND for an unknown, released, expired or broken reservation;
// DEADLINE_EXCEEDED when |now_ns| >= its deadline (the reservation is released
// then, not left for the tick); INVALID_ARGUMENT for a small |capacity|;
// RESOURCE_EXHAUSTED when the lease table cannot take them (the reservation
// stays open).
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_reservation_commit(
    pcp_sched_t* sched, uint64_t reservation_id, int64_t now_ns,
    uint64_t* out_lease_ids, size_t capacity);

// Frees the reservation's workers. NOT_FOUND as for commit.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_reservation_release(pcp_sched_t* sched, uint64_t reservation_id);

typedef struct pcp_sched_reservation_status_t {
  uint64_t reservation_id;
  pcp_sched_owner_t owner;
  uint64_t tag;
  uint32_t worker_count;
  int64_t deadline_ns;
} pcp_sched_reservation_status_t;

// NOT_FOUND for a reservation that is not open.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_reservation_query(const pcp_sched_t* sched, uint64_t reservation_id,
                            pcp_sched_reservation_status_t* out_status);

//===----------------------------------------------------------------------===//
// Debug checking
//===----------------------------------------------------------------------===//

// Recomputes every invariant from scratch (O(workers + leases +
// reservations)) and returns INTERNAL naming the first one broken, or OK:
//   - ids unique and well-formed; registry, lease and reservation counts
//     within their bounds;
//   - every worker holds at most one lease or one reservation slot, and the
//     links are mutual (a worker is leased to at most one owner, a lease is on
//     at most one worker);
//   - state agrees with holdings (READY and JOINING and LOST hold nothing,
//     BUSY holds something);
//   - a leased or reserved worker matches its lease's or reservation's
//     constraint; each reservation holds exactly its worker count;
//   - every owner holds at most its max_workers; cached counters equal a
//     recount; lease ids are below the next id to issue.
// For tests and the simulator, after every step (TigerBeetle's checkers).
PCP_MUST_USE_RESULT pcp_status_t
pcp_sched_check_invariants(const pcp_sched_t* sched);

//===----------------------------------------------------------------------===//
// Federation: the hub's gateway registry and placement
//===----------------------------------------------------------------------===//
//
// The federation hub's bookkeeping, as pure as the worker scheduler above:
// no I/O, no threads, no clock reads. Every call that depends on time takes
// |now_ns| (monotonic, for staleness) and, where a time is shown to users or
// persisted, |wall_ns|. The hub role (src/roles/hub) wraps it with a mutex,
// SQLite and HTTP; the topology checks (src/topology) drive the same code.
//
// Model (reference/upstream-control-plane.md s.6.1-6.2, with the fixes its
// NOTEs ask for; docs/federation.md):
//   - A gateway is keyed by its gateway_id. A connect upserts it: lab_id,
//     base_url, graph_backend and the service list are replaced,
//     last_sequence_no is the reported value, last_replicated_sequence never
//     goes down, connected_at is kept from the first insert.
//   - Staleness (upstream has none): a gateway whose last connect is more
//     than PCP_SCHED_FEDERATION_STALE_INTERVALS heartbeat intervals old is
//     STALE (exactly 3 intervals is still CONNECTED; one nanosecond more is
//     STALE). A stale gateway is never chosen by placement and becomes
//     CONNECTED again on its next connect. A registration restored from disk
//     is STALE until its gateway connects.
//   - Service counts are normalised once, at connect (s.6.1 chain):
//     connected = workers_connected ?? worker_count ?? 0,
//     ready = workers_ready ?? ready_worker_count ?? 0,
//     available = workers_dispatchable ?? workers_available ??
//                 ready_worker_count ?? 0,
//     then ready = max(ready, available), connected = max(connected, ready).
//   - Placement: candidates are the services of CONNECTED gateways that match
//     every selector field given (gateway, service, executor, worker class,
//     target arch exactly; a service lacking a named field never matches),
//     offer the capability (training) or have the type (rl), and, unlike
//     upstream, have workers_available >= workers_required: the requirement
//     FILTERS. The best candidate: health "ok" first, then more available,
//     more ready, newer updated_at; remaining ties go to the earlier
//     registered gateway and the earlier listed service (deterministic).
//   - Every registration has an epoch, bumped when it is created and when a
//     stale gateway comes back, so a placement can be checked later against
//     the gateway having gone away or restarted in between.
//
// Threading: thread-compatible (the hub holds a mutex around every call).
// Ownership: strings passed in are copied. Views (pcp_sched_federation_
// gateway_t, the service arrays they point to) borrow from the registry and
// are valid until the next call that changes it (connect, restore, remove,
// release). Placements are copied into caller storage.

#define PCP_SCHED_FEDERATION_ID_MAX_LENGTH 255
#define PCP_SCHED_FEDERATION_NAME_MAX_LENGTH 127
#define PCP_SCHED_FEDERATION_URL_MAX_LENGTH 1023
#define PCP_SCHED_FEDERATION_MAX_GATEWAYS_DEFAULT 1024u
// Services one gateway may advertise, capabilities one service may list.
#define PCP_SCHED_FEDERATION_MAX_SERVICES 64u
#define PCP_SCHED_FEDERATION_MAX_CAPABILITIES 32u
// Largest worker count accepted in an advertisement or a selector.
#define PCP_SCHED_FEDERATION_MAX_WORKERS 1000000
// Missed heartbeat intervals after which a gateway is stale.
#define PCP_SCHED_FEDERATION_STALE_INTERVALS 3
// A count field that was not given (any other negative is refused).
#define PCP_SCHED_FEDERATION_COUNT_ABSENT INT64_MIN

typedef enum pcp_sched_federation_status_e {
  PCP_SCHED_FEDERATION_STATUS_CONNECTED = 0,
  PCP_SCHED_FEDERATION_STATUS_STALE = 1,
} pcp_sched_federation_status_t;

// "connected" / "stale".
const char* pcp_sched_federation_status_name(
    pcp_sched_federation_status_t status);

// One service a gateway advertises (upstream ServiceAdvertisement). As input
// to connect: NULL strings are absent, counts PCP_SCHED_FEDERATION_COUNT_ABSENT
// when absent. As a view: strings are never NULL except worker_class,
// target_arch and base_url when unset, and the normalised counts are in
// workers_connected / workers_ready / workers_available (the other three
// count fields repeat them: worker_count = connected, ready_worker_count and
// workers_dispatchable = available).
typedef struct pcp_sched_federation_service_t {
  const char* service_id;     // required
  const char* executor_id;    // NULL: "<gateway_id>:<type>:<service_id>"
  const char* service_type;   // required
  const char* base_url;       // optional
  const char* auth_mode;      // NULL: "none"
  const char* health_status;  // NULL: "unknown"
  const char* job_status;     // NULL: "unknown"
  const char* worker_class;   // optional
  const char* target_arch;    // optional
  const char* const* capabilities;
  uint32_t capability_count;
  int64_t worker_count;
  int64_t ready_worker_count;
  int64_t workers_connected;
  int64_t workers_ready;
  int64_t workers_available;
  int64_t workers_dispatchable;
  // The gateway's time of the service's last update (wall ns; 0: the
  // connect's wall time). Ranks otherwise equal candidates.
  int64_t updated_at_wall_ns;
} pcp_sched_federation_service_t;

// Fills the counts of |out_service| with PCP_SCHED_FEDERATION_COUNT_ABSENT
// and everything else with zero/NULL.
void pcp_sched_federation_service_initialize(
    pcp_sched_federation_service_t* out_service);

typedef struct pcp_sched_federation_connect_t {
  const char* gateway_id;     // required, 1..255 of [A-Za-z0-9._:@-]
  const char* lab_id;         // required
  const char* base_url;       // required, http:// or https://
  const char* graph_backend;  // required
  const pcp_sched_federation_service_t* services;
  uint32_t service_count;
  // Used when |service_count| is 0; ABSENT: 0.
  int64_t registered_services;
  int64_t last_sequence_no;          // >= 0
  int64_t last_replicated_sequence;  // >= 0
} pcp_sched_federation_connect_t;

// A registration as seen at some |now_ns| (borrowed, see above).
typedef struct pcp_sched_federation_gateway_t {
  const char* gateway_id;
  const char* lab_id;
  const char* base_url;
  const char* graph_backend;
  pcp_sched_federation_status_t status;
  int64_t registered_services;
  int64_t last_sequence_no;
  int64_t last_replicated_sequence;
  int64_t connected_at_wall_ns;
  int64_t last_seen_wall_ns;
  int64_t last_seen_ns;  // monotonic; INT64_MIN for a restored one
  uint64_t epoch;
  const pcp_sched_federation_service_t* services;
  uint32_t service_count;
} pcp_sched_federation_gateway_t;

typedef struct pcp_sched_federation_options_t {
  int64_t heartbeat_interval_ns;  // > 0; default 5 s (upstream's)
  uint32_t max_gateways;          // default 1024
  // TEST ONLY: placement ignores staleness (the injected bug the topology
  // checks must catch). Never set by the hub.
  bool bug_accept_stale;
} pcp_sched_federation_options_t;

typedef struct pcp_sched_federation_t pcp_sched_federation_t;

void pcp_sched_federation_options_initialize(
    pcp_sched_federation_options_t* out_options);

// INVALID_ARGUMENT for a non-positive interval or zero max_gateways.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_create(
    const pcp_sched_federation_options_t* options, pcp_allocator_t allocator,
    pcp_sched_federation_t** out_federation);
// NULL is a no-op.
void pcp_sched_federation_release(pcp_sched_federation_t* federation);

// Upserts |request|'s gateway as seen at |now_ns| / |wall_ns|; it is
// CONNECTED afterwards. |out_recovered| (optional) is set when the gateway
// was STALE before this call. INVALID_ARGUMENT naming the field for bad
// input (nothing changes); RESOURCE_EXHAUSTED past max_gateways.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_connect(
    pcp_sched_federation_t* federation,
    const pcp_sched_federation_connect_t* request, int64_t now_ns,
    int64_t wall_ns, bool* out_recovered);

// Inserts a registration read back from disk: STALE until its gateway
// connects. Same validation as connect; ALREADY_EXISTS for a known id.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_restore(
    pcp_sched_federation_t* federation,
    const pcp_sched_federation_connect_t* request, int64_t connected_at_wall_ns,
    int64_t last_seen_wall_ns);

// Forgets gateway |gateway_id|. NOT_FOUND.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_remove(
    pcp_sched_federation_t* federation, const char* gateway_id);

// Registrations, in first-registration order.
uint32_t pcp_sched_federation_gateway_count(
    const pcp_sched_federation_t* federation);
// The |index|th registration as seen at |now_ns|. INVALID_ARGUMENT for an
// index out of range.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_gateway_at(
    const pcp_sched_federation_t* federation, uint32_t index, int64_t now_ns,
    pcp_sched_federation_gateway_t* out_gateway);
// NOT_FOUND.
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_gateway_find(
    const pcp_sched_federation_t* federation, const char* gateway_id,
    int64_t now_ns, pcp_sched_federation_gateway_t* out_gateway);
// Registrations per status at |now_ns|.
void pcp_sched_federation_status_counts(
    const pcp_sched_federation_t* federation, int64_t now_ns,
    uint32_t* out_connected, uint32_t* out_stale);

// What a global job asks for. NULL fields are "any".
typedef struct pcp_sched_federation_selector_t {
  // Exactly one of the two: training jobs name a capability
  // ("training.regular"), rl jobs a service type ("rl").
  const char* capability;
  const char* service_type;
  const char* gateway_id;
  const char* service_id;
  const char* executor_id;
  const char* worker_class;
  const char* target_arch;
  // 0: no requirement; negative or above PCP_SCHED_FEDERATION_MAX_WORKERS:
  // INVALID_ARGUMENT.
  int64_t workers_required;
} pcp_sched_federation_selector_t;

// True when |key| is a selector key a request may carry ("gateway_id",
// "service_id", "executor_id", "worker_class", "target_arch",
// "workers_required"). The hub refuses any other key in a placement object.
bool pcp_sched_federation_selector_key_known(const char* key);

typedef struct pcp_sched_federation_placement_t {
  char gateway_id[PCP_SCHED_FEDERATION_ID_MAX_LENGTH + 1];
  char lab_id[PCP_SCHED_FEDERATION_ID_MAX_LENGTH + 1];
  char base_url[PCP_SCHED_FEDERATION_URL_MAX_LENGTH + 1];
  char service_id[PCP_SCHED_FEDERATION_ID_MAX_LENGTH + 1];
  char executor_id[PCP_SCHED_FEDERATION_ID_MAX_LENGTH + 1];
  char service_type[PCP_SCHED_FEDERATION_NAME_MAX_LENGTH + 1];
  int64_t workers_available;
  uint64_t epoch;
  uint32_t candidate_count;  // services that passed every filter
} pcp_sched_federation_placement_t;

// Chooses a service for |selector| at |now_ns| (rules above) and copies it
// into |out_placement|. INVALID_ARGUMENT for a bad selector; NOT_FOUND when
// the named gateway is unknown; FAILED_PRECONDITION when the named gateway is
// stale; UNAVAILABLE when no service passes the filters (the message says
// which filter emptied the set).
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_place(
    const pcp_sched_federation_t* federation,
    const pcp_sched_federation_selector_t* selector, int64_t now_ns,
    pcp_sched_federation_placement_t* out_placement);

// OK when |placement|'s gateway is still registered, CONNECTED at |now_ns|
// and in the same epoch; FAILED_PRECONDITION otherwise (it went stale, was
// removed, or came back as a new epoch since).
PCP_MUST_USE_RESULT pcp_status_t pcp_sched_federation_placement_check(
    const pcp_sched_federation_t* federation,
    const pcp_sched_federation_placement_t* placement, int64_t now_ns);

#ifdef __cplusplus
}
#endif

#endif  // PCP_SCHED_SCHED_H_
