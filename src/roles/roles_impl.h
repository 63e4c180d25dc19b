// SPDX-License-Identifier: Apache-2.0
//
// Private to src/roles: the per-role config structs and tables, and the
// pieces every role shares (the started/stopping lines, the signal wait).

#ifndef PCP_ROLES_ROLES_IMPL_H_
#define PCP_ROLES_ROLES_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "obs/obs.h"
#include "roles/roles.h"
#include "services/services.h"

// Fields every role table starts with (offset 0 in every role struct, so
// the shared driver reads them without knowing the role).
typedef struct pcp_roles_common_t {
  bool mode;         // the role's own mode flag (--worker, ...)
  bool help;         // --help / -h
  bool dump_config;  // --dump-config
} pcp_roles_common_t;

// Upstream's backend names; "auto" is resolved by pcp_roles_backend_name.
extern const char* const pcp_roles_backend_values[];
// Returns the backend a role runs with: "auto" is "cpu" on Linux and "metal"
// on Apple platforms, as upstream's selectDefault().
const char* pcp_roles_backend_name(int32_t backend_index);

//===----------------------------------------------------------------------===//
// One role
//===----------------------------------------------------------------------===//

typedef struct pcp_roles_def_t {
  pcp_roles_role_t role;
  const char* flag;   // "--worker": names the role in messages and usage
  const char* usage;  // "pcp --worker [flags]"
  const pcp_config_table_t* table;
  size_t config_size;
  // After CLI parsing and table validation: resolves aliases and derived
  // values, loads files, checks cross-field rules. INVALID_ARGUMENT etc.
  // are usage errors (exit 2). May be NULL.
  pcp_status_t (*prepare)(void* config);
  // Prints the effective config for --dump-config. NULL: the table dump.
  void (*dump)(const void* config, FILE* out);
  // Runs the role; returns the exit code.
  int (*run)(void* config);
  // Frees what prepare allocated beyond the table. May be NULL.
  void (*cleanup)(void* config);
} pcp_roles_def_t;

extern const pcp_roles_def_t pcp_roles_gateway_def;
extern const pcp_roles_def_t pcp_roles_hub_def;
extern const pcp_roles_def_t pcp_roles_worker_def;
extern const pcp_roles_def_t pcp_roles_nodemgr_def;
extern const pcp_roles_def_t pcp_roles_supervise_def;

// The three fields of pcp_roles_common_t as table rows, for a role struct
// |role_struct| whose mode flag is |mode_name|.
#define PCP_ROLES_COMMON_FIELDS(role_struct, mode_name, mode_help) \
  {.name = (mode_name),                                            \
   .type = PCP_CONFIG_TYPE_BOOL,                                   \
   .offset = offsetof(role_struct, common.mode),                   \
   .flags = PCP_CONFIG_FLAG_CLI_ONLY,                              \
   .help = (mode_help)},                                           \
      {.name = "help",                                             \
       .type = PCP_CONFIG_TYPE_BOOL,                               \
       .offset = offsetof(role_struct, common.help),               \
       .flags = PCP_CONFIG_FLAG_CLI_ONLY,                          \
       .help = "print these flags and exit (also -h)"},            \
  {                                                                \
    .name = "dump-config", .type = PCP_CONFIG_TYPE_BOOL,           \
    .offset = offsetof(role_struct, common.dump_config),           \
    .flags = PCP_CONFIG_FLAG_CLI_ONLY,                             \
    .help = "print the effective config as JSON and exit"          \
  }

//===----------------------------------------------------------------------===//
// Role configs (exposed for the unit tests)
//===----------------------------------------------------------------------===//

typedef struct pcp_roles_worker_config_t {
  pcp_roles_common_t common;
  char* connect;
  char* host;
  int64_t port;
  int32_t backend;
  char* target;
  int64_t device_id;
  int64_t supervisor_id;  // -1: none
  // Runtime settings (src/roles/worker).
  char* join_token_env;           // names the env var holding the join token
  char* cache_dir;                // program cache; NULL: derived default
  int64_t device_memory_bytes;    // 0: query the device
  int64_t resident_memory_bytes;  // session tensor limit; 0: unlimited
  char* node_manager_id;
  char* worker_class;
  int64_t drain_timeout_ms;
  int64_t cpu_threads;
  int64_t test_task_delay_ms;  // hidden: tests of cancel and drain
  char* metrics_listen;        // HOST:PORT of the worker's /metrics; NULL
  // Derived by prepare: the stable worker id.
  char* worker_id;
} pcp_roles_worker_config_t;
extern const pcp_config_table_t pcp_roles_worker_table;

// Parses --connect: "host:port", "[v6addr]:port", or "host" alone (the
// port is then left as it is). Replaces |*inout_host| (owned, malloc'd).
// INVALID_ARGUMENT for an empty host or a port outside [1, 65535].
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_connect_parse(const char* value,
                                                         char** inout_host,
                                                         int64_t* inout_port);

typedef struct pcp_roles_hub_config_t {
  pcp_roles_common_t common;
  char* api_host;
  int64_t api_port;
  char* api_token_env;
  // Federation hub (src/roles/hub, docs/federation.md).
  char* state_dir;                // SQLite state; required to serve
  char* federation_token_env;     // gateways' credential (connect, mutations)
  int64_t heartbeat_interval_ms;  // gateways' interval; stale after 3
  int64_t gateway_timeout_ms;     // each hub -> gateway request
  int64_t max_gateways;
} pcp_roles_hub_config_t;
extern const pcp_config_table_t pcp_roles_hub_table;

// Supervision policy flags shared by --node-manager and --supervise (the
// policy is src/roles/nodemgr/supervision_impl.h; defaults and reasons in
// docs/decisions.md, "Node manager and supervisor").
typedef struct pcp_roles_policy_flags_t {
  int64_t running_after_ms;
  int64_t restart_min_ms;
  int64_t restart_max_ms;
  int64_t restart_reset_after_ms;
  int64_t crash_loop_restarts;
  int64_t crash_loop_window_ms;
  int64_t stop_grace_ms;
  char* worker_exe;  // NULL: this pcp binary
} pcp_roles_policy_flags_t;

typedef struct pcp_roles_nodemgr_config_t {
  pcp_roles_common_t common;
  char* host;
  int64_t port;
  char* api_host;
  int64_t api_port;
  int64_t scale;
  int32_t backend;
  char* target;
  int64_t start_stagger_ms;
  pcp_roles_policy_flags_t policy;
  int64_t http_header_timeout_ms;
  int64_t http_max_connections_per_client;
  int64_t worker_metrics_port;  // slot i: --metrics-listen api_host:P+i; 0
  char* worker_class;           // --worker-class of every child; NULL: none
} pcp_roles_nodemgr_config_t;
extern const pcp_config_table_t pcp_roles_nodemgr_table;

typedef struct pcp_roles_supervise_config_t {
  pcp_roles_common_t common;
  char* host;
  int64_t port;
  int64_t supervisor_id;  // -1: none
  pcp_roles_policy_flags_t policy;
  // Everything after --supervise (a leading `--` dropped): the child's argv
  // without the program name. Filled by the driver; a (JSON-only, hidden)
  // table field so that dump and deinitialize cover it.
  pcp_string_list_t child_args;
} pcp_roles_supervise_config_t;
extern const pcp_config_table_t pcp_roles_supervise_table;

// Checks supervisor child args: they must select the worker role (upstream
// SupervisorRequiresWorkerChild), hold no legacy flag and parse as worker
// flags.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_supervise_child_check(const pcp_string_list_t* child_args);

//===----------------------------------------------------------------------===//
// Gateway config (--gateway-config JSON, upstream s.2)
//===----------------------------------------------------------------------===//

typedef struct pcp_roles_endpoint_config_t {
  bool present;
  char* host;
  int64_t port;  // 0: not set
} pcp_roles_endpoint_config_t;

typedef struct pcp_roles_api_config_t {
  bool present;
  char* host;
  int64_t port;
  char* token_env;
  char* internal_token_env;
} pcp_roles_api_config_t;

// One embedded controller block; the three kinds share the struct, each
// has its own table (keys and defaults differ).
typedef struct pcp_roles_controller_config_t {
  bool present;
  bool enabled;
  char* config_path;
  char* service_id;
  pcp_roles_endpoint_config_t api;
  int64_t workers;     // 0: the gateway's --workers
  bool should_resume;  // training
  char* backend;       // rl
  char* worker_class;  // NULL: the kind's default
  char* target_arch;
  int64_t reserved_workers;
  int64_t max_workers;  // -1: unlimited
} pcp_roles_controller_config_t;

// An object whose keys are not interpreted (controllers.extensions).
typedef struct pcp_roles_opaque_config_t {
  bool present;
} pcp_roles_opaque_config_t;

typedef struct pcp_roles_controllers_config_t {
  bool present;
  pcp_roles_controller_config_t inference;
  pcp_roles_controller_config_t training;
  pcp_roles_controller_config_t rl;
  pcp_roles_opaque_config_t extensions;  // private slot: keys ignored
} pcp_roles_controllers_config_t;

// The gateway's worker_fabric block: where workers connect and how.
typedef struct pcp_roles_fabric_config_t {
  bool present;
  char* host;
  int64_t port;          // 0: not set
  char* join_token_env;  // NAME of the variable holding the join token
  int64_t heartbeat_ms;  // H: every fabric timeout derives from it
} pcp_roles_fabric_config_t;

// TLS for the gateway API: both PEM paths or neither.
typedef struct pcp_roles_tls_config_t {
  bool present;
  char* cert;
  char* key;
} pcp_roles_tls_config_t;

// HTTP connection limits of the gateway API (config object "http"); 0:
// the http module's default (docs/api.md "Limits").
typedef struct pcp_roles_http_limits_config_t {
  bool present;
  int64_t header_timeout_ms;
  int64_t idle_timeout_s;
  int64_t max_connections;
  int64_t max_connections_per_client;
} pcp_roles_http_limits_config_t;
// Most directories in data_roots or model_roots.
#define PCP_ROLES_GATEWAY_MAX_ROOTS 16

typedef struct pcp_roles_gateway_file_config_t {
  char* gateway_id;
  char* lab_id;
  int32_t graph_backend;  // memory (= sqlite) | sqlite | falkordb
  char* policy_store_path;
  pcp_services_neo4j_config_t neo4j;  // parsed, unused (neo4j is refused)
  pcp_services_falkordb_config_t falkordb;
  pcp_roles_api_config_t api;
  char* api_token_env;
  char* internal_api_token_env;
  pcp_services_federation_config_t federation;
  char* federation_hub_endpoint;
  pcp_roles_fabric_config_t worker_fabric;
  pcp_services_sharing_config_t sharing_defaults;
  pcp_roles_controllers_config_t controllers;
  char* state_dir;  // SQLite state, job files; required to serve
  pcp_roles_tls_config_t tls;
  pcp_roles_http_limits_config_t http;
  // Where experiment paths may point (docs/training.md "Paths"): data files
  // under |data_roots|, model modules under |model_roots|. Empty: the
  // defaults (<state_dir>/data, <state_dir>/models, the project's data/).
  pcp_string_list_t data_roots;
  pcp_string_list_t model_roots;
  // Per-job caps checked at submit; 0: derived from the machine's memory.
  int64_t max_job_parameters;
  int64_t max_job_gateway_bytes;
} pcp_roles_gateway_file_config_t;
extern const pcp_config_table_t pcp_roles_gateway_file_table;

// What the gateway runs with after flags and file are combined.
typedef struct pcp_roles_gateway_effective_t {
  char* api_host;
  int64_t api_port;
  char* api_token_env;
  char* internal_api_token_env;
  char* federation_upstream;
  char* federation_token_env;
  int64_t federation_heartbeat_interval_ms;
  char* worker_fabric_host;
  int64_t worker_fabric_port;
  pcp_string_list_t controllers;  // "training@127.0.0.1:8001"
  char* worker_join_token_env;
  int64_t worker_heartbeat_ms;
} pcp_roles_gateway_effective_t;
extern const pcp_config_table_t pcp_roles_gateway_effective_table;

typedef struct pcp_roles_gateway_config_t {
  pcp_roles_common_t common;
  char* gateway_config;
  char* api_host;
  int64_t api_port;
  char* control_host;
  int64_t control_port;
  char* api_token_env;
  int64_t workers;
  // --model-dir DIR (repeatable, or comma-separated): served from the start.
  pcp_string_list_t model_dirs;
  // Loaded and derived by prepare.
  bool file_loaded;
  pcp_roles_gateway_file_config_t file;
  pcp_roles_gateway_effective_t effective;
} pcp_roles_gateway_config_t;
extern const pcp_config_table_t pcp_roles_gateway_table;

// Loads |path| into |config->file|, validates it, and derives the effective
// settings (with the flags already in |config|). Unknown keys are logged as
// warnings. INVALID_ARGUMENT names the key.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_gateway_prepare_config(pcp_roles_gateway_config_t* config);

// Serves the gateway described by |config| (prepared) until SIGTERM/SIGINT:
// opens the store, starts the fabric endpoint and the HTTP API, drains.
// Returns the process exit code. Main thread only.
int pcp_roles_gateway_serve(const pcp_roles_gateway_config_t* config);

//===----------------------------------------------------------------------===//
// Shared run-time pieces
//===----------------------------------------------------------------------===//

// Installs SIGTERM/SIGINT handlers. Call before logging "started" so a
// signal sent right after that line is never fatal.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_signals_install(void);

// Blocks (no polling) until SIGTERM or SIGINT; returns its number.
int pcp_roles_signals_wait(void);

// Writes `ts=... level=info role=<role> msg="<msg>" k1=v1 k2=v2 ...` to
// stderr in one write. |pairs| holds |pair_count| key/value pairs (values
// may be NULL: the pair is skipped).
void pcp_roles_log_event(const char* role, const char* msg,
                         const char* const* pairs, size_t pair_count);
// The same at |level| (skipped below the process's log level): per-task
// lines go at debug so a serving worker does not log every decode step.
void pcp_roles_log_event_at(pcp_log_level_t level, const char* role,
                            const char* msg, const char* const* pairs,
                            size_t pair_count);

// Installs the handlers, logs "started" with |pairs|, waits for a signal,
// logs "stopping" and returns 0. The thin body of every role for now.
int pcp_roles_run_until_signal(const char* role, const char* const* pairs,
                               size_t pair_count);

// Registers process_* and pcp_build_info{version, iree_compiler,
// iree_runtime, role} in |registry| (a no-op when already there); the IREE
// versions are the venv's wheels ("unknown" without a venv).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_process_metrics_register(
    pcp_obs_registry_t* registry, const char* role);

#endif  // PCP_ROLES_ROLES_IMPL_H_
