// SPDX-License-Identifier: Apache-2.0
//
// The training kind's validation (src/workloads/train/policy.c): what a
// DiLoCo experiment may reach and how big it may be, and the stored spec of
// an accepted one; and a job's step history (history.c). Part of the workloads
// module's public surface: include "workloads/workloads.h", which includes this
// file.
//
// Threading: a policy is read-only after initialize (thread-safe to share).
// Ownership: the policy owns its strings; free with _deinitialize.

#ifndef PCP_WORKLOADS_TRAIN_POLICY_H_
#define PCP_WORKLOADS_TRAIN_POLICY_H_

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

// Experiments are small JSON objects; the cap keeps a hostile body from
// reaching the config parser (STYLE 3.8: configs at most 1 MiB).
#define PCP_WORKLOADS_TRAIN_MAX_EXPERIMENT_BYTES ((size_t)1 << 20)

// Gateway memory a training job holds per parameter: f32 masters, the
// outer step's scratch, Nesterov velocity and the delta accumulator (4
// bytes each, service.c), plus a bf16 wire copy for bf16 parameters.
#define PCP_WORKLOADS_TRAIN_BYTES_PER_PARAMETER 16
#define PCP_WORKLOADS_TRAIN_BYTES_PER_BF16_PARAMETER 18

// The operator's settings the policy derives from (the gateway config's
// keys of the same names; borrowed).
typedef struct pcp_workloads_train_policy_config_t {
  const char* state_dir;  // NULL or "": "."
  // Empty: the defaults (<state_dir>/data, <state_dir>/models, the
  // project's data/).
  pcp_string_list_t data_roots;
  pcp_string_list_t model_roots;
  int64_t max_job_parameters;     // <= 0: derived from the memory cap
  int64_t max_job_gateway_bytes;  // <= 0: half the machine's memory
  // The policy's own memory; {0} (ctl NULL): pcp_allocator_system().
  pcp_allocator_t allocator;
} pcp_workloads_train_policy_config_t;

// What a training experiment may reach (docs/training.md "Paths and
// limits"): every path key must resolve (realpath, no link or `..` escape)
// under its roots, checkpoint_dir under the state dir; the job's parameters
// and the gateway memory they need are capped.
typedef struct pcp_workloads_train_policy_t {
  char* state_dir;                // resolved; checkpoint_dir lies below it
  pcp_string_list_t data_roots;   // resolved
  pcp_string_list_t model_roots;  // resolved
  int64_t max_parameters;         // > 0
  int64_t max_job_bytes;          // > 0
  pcp_allocator_t allocator;      // state_dir's
} pcp_workloads_train_policy_t;

// Fills |out_policy| from |file|: the roots given or the defaults
// (<state_dir>/data and <state_dir>/models, plus the project's data/ when
// |exe_path| is a build-tree binary: <exe dir>/../data beside a
// CMakeLists.txt), the caps given or derived from |memory_bytes| (the
// machine's MemTotal; half of it for one job). Roots are resolved with
// pcp_file_path_resolve. INVALID_ARGUMENT naming the key for a root that
// cannot be resolved. Free with _deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_train_policy_initialize(
    const pcp_workloads_train_policy_config_t* file, const char* exe_path,
    uint64_t memory_bytes, pcp_workloads_train_policy_t* out_policy);
void pcp_workloads_train_policy_deinitialize(
    pcp_workloads_train_policy_t* policy);
// One line an operator can check: the roots and the caps, into |out|.
void pcp_workloads_train_policy_describe(
    const pcp_workloads_train_policy_t* policy, char* out, size_t size);
// The machine's memory (MemTotal of /proc/meminfo); 0 when unknown.
uint64_t pcp_workloads_train_memory_total_bytes(void);

// Builds the stored spec of a training job from experiment JSON |text|:
// {"experiment", "unknown_keys", "training": progress}. The experiment is
// stored with its path keys replaced by the resolved absolute paths (a
// resume reads the same files whatever the gateway's working directory).
// INVALID_ARGUMENT naming the key (config table; a data or model file that
// is missing or unreadable; a job over the caps, with the bytes it needs),
// PERMISSION_DENIED naming the key and the allowed roots for a path outside
// them (nothing about the file), RESOURCE_EXHAUSTED over 1 MiB.
// |*out_spec| is a new reference on success. Thread-safe (|policy| is
// only read).
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_train_spec_build(
    const pcp_workloads_train_policy_t* policy, const char* text,
    size_t byte_length, json_t** out_spec);

// Confines |path| (experiment key |key|) under |policy|'s model roots
// (|model_roots| true) or data roots, writing the resolved path into
// |out_path| (|out_capacity| bytes): the rule every experiment path key
// follows (the RL experiment reuses it). INVALID_ARGUMENT for an empty path,
// PERMISSION_DENIED naming the key and the roots for a path outside them.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_train_policy_path_confine(
    const pcp_workloads_train_policy_t* policy, bool model_roots,
    const char* key, const char* path, char* out_path, size_t out_capacity);

// A training job's history (src/workloads/train/history.c): its
// "training.step" events as columns, one entry per outer step (the last
// event of a step wins), {"job_id", "state", "outer_loop_steps", "points",
// "truncated", "max_points", "outer_step", "time_ms", "loss", "val_loss",
// "tokens_per_second", "wire_bytes", "step_wire_bytes", "seconds", "lr"}:
// at most PCP_WORKLOADS_TRAIN_HISTORY_MAX_POINTS steps, read from at most
// PCP_WORKLOADS_TRAIN_HISTORY_MAX_PAGES pages of the job's events.
// NOT_FOUND for a job that is not a training job. |*out_history| is a new
// reference on success. Thread-safe.
#define PCP_WORKLOADS_TRAIN_HISTORY_MAX_POINTS 100000u
#define PCP_WORKLOADS_TRAIN_HISTORY_MAX_PAGES 200u
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_train_history_json(
    pcp_store_t* store, const char* id, json_t** out_history);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_TRAIN_POLICY_H_
