// SPDX-License-Identifier: Apache-2.0
//
// The training kind's validation: the paths-and-caps policy a DiLoCo
// experiment must meet (docs/training.md "Paths and limits") and the stored
// spec built from an accepted experiment. The gateway's POST
// /v1/training/jobs calls pcp_workloads_train_spec_build at submit and the
// training kind's experiment_check hook calls it again at placing, under the
// policy of the day (moved out of src/roles/gateway/training.c, issue 14).
//
// Thread-safety: a policy is read-only after initialize; spec_build only
// reads it.

// realpath(3) is XSI: glibc declares it only with _XOPEN_SOURCE.
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "models/models.h"
#include "workloads/train/decoupled.h"
#include "workloads/workloads.h"

static const char* wire_dtype_name(int32_t dtype) {
  return dtype == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32";
}

// The built-in model of |config| as a models spec, validated by the models
// module too (it knows rules the config table does not, e.g. GPT's fused qkv),
// and its parameter count. A model_path module is read and its @main checked
// here, so a wrong path or signature is a 400 at submit, not a failed job.
static pcp_status_t model_parameter_count(const pcp_diloco_config_t* config,
                                          int64_t* out_parameter_count) {
  *out_parameter_count = 0;
  if (!config->model.present) {
    pcp_diloco_module_t module;
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_module_load(config, &module));
    *out_parameter_count = module.table.total_elements;
    pcp_status_t status = pcp_diloco_experiment_check(
        config, module.batch, module.block_size, module.data_type);
    pcp_diloco_module_deinitialize(&module);
    return status;
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_experiment_check(
      config, config->model.batch, config->model.block_size,
      PCP_ELEMENT_TYPE_I32));
  pcp_models_spec_t spec;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_model_spec_resolve(config, &spec));
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  *out_parameter_count = table.total_elements;
  pcp_models_parameter_table_deinitialize(&table);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Paths and limits (docs/training.md "Paths and limits")
//===----------------------------------------------------------------------===//

uint64_t pcp_workloads_train_memory_total_bytes(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) {
    return 0;
  }
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof(line), f)) {
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
      break;
    }
  }
  fclose(f);
  return kib > UINT64_MAX / 1024 ? UINT64_MAX : (uint64_t)kib * 1024;
}

// Appends |path| resolved, once: a root named twice (or the default state
// dir's data/ that is the project's data/) is kept once, so each check and
// each message names it once. |key| names the config key in the error.
static pcp_status_t root_append(pcp_string_list_t* list, const char* path,
                                const char* key) {
  char resolved[PATH_MAX];
  pcp_status_t status = pcp_file_path_resolve(path, resolved, sizeof(resolved));
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key '%s': '%s' cannot be resolved",
                           key, path);
  }
  for (size_t i = 0; i < list->count; ++i) {
    if (strcmp(list->items[i], resolved) == 0) {
      return pcp_ok_status();
    }
  }
  return pcp_string_list_append(list, resolved);
}

// |list| joined with |separator| into |out| (cut short when it does not fit).
static void roots_join(const pcp_string_list_t* list, const char* separator,
                       char* out, size_t size) {
  size_t used = 0;
  out[0] = 0;
  for (size_t i = 0; i < list->count && used < size; ++i) {
    int n = snprintf(out + used, size - used, "%s%s", i ? separator : "",
                     list->items[i]);
    if (n < 0) {
      break;
    }
    used += (size_t)n;
  }
}

// The project's data/ for a binary in a source checkout's build tree
// (build/pcp -> data/, what the quickstart's data_path names); "" else.
static void project_data_dir(const char* exe_path, char* out, size_t size) {
  out[0] = 0;
  char exe[PATH_MAX];
  if (!exe_path || !realpath(exe_path, exe)) {
    return;
  }
  char* slash = strrchr(exe, '/');
  if (!slash || slash == exe) {
    return;
  }
  *slash = 0;  // the binary's directory
  char marker[PATH_MAX + 32];
  snprintf(marker, sizeof(marker), "%s/../CMakeLists.txt", exe);
  struct stat st;
  if (stat(marker, &st) != 0 || !S_ISREG(st.st_mode)) {
    return;
  }
  char data[PATH_MAX + 16];
  snprintf(data, sizeof(data), "%s/../data", exe);
  char resolved[PATH_MAX];
  if (realpath(data, resolved) && stat(resolved, &st) == 0 &&
      S_ISDIR(st.st_mode) && strlen(resolved) < size) {
    snprintf(out, size, "%s", resolved);
  }
}

static pcp_status_t roots_fill(const pcp_string_list_t* given,
                               const char* state_dir, const char* state_sub,
                               const char* project_data, const char* key,
                               pcp_string_list_t* out) {
  if (given->count > 0) {
    for (size_t i = 0; i < given->count; ++i) {
      PCP_RETURN_IF_ERROR_BARE(root_append(out, given->items[i], key));
    }
    return pcp_ok_status();
  }
  char path[PATH_MAX + 16];
  snprintf(path, sizeof(path), "%s/%s", state_dir, state_sub);
  PCP_RETURN_IF_ERROR_BARE(root_append(out, path, key));
  if (project_data[0]) {
    PCP_RETURN_IF_ERROR_BARE(root_append(out, project_data, key));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_train_policy_initialize(
    const pcp_workloads_train_policy_config_t* file, const char* exe_path,
    uint64_t memory_bytes, pcp_workloads_train_policy_t* out_policy) {
  memset(out_policy, 0, sizeof(*out_policy));
  out_policy->allocator =
      file->allocator.ctl ? file->allocator : pcp_allocator_system();
  const char* state_dir =
      file->state_dir && file->state_dir[0] ? file->state_dir : ".";
  char resolved[PATH_MAX];
  pcp_status_t status =
      pcp_file_path_resolve(state_dir, resolved, sizeof(resolved));
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'state_dir': '%s' cannot be "
                           "resolved",
                           state_dir);
  }
  status = pcp_allocator_strdup(out_policy->allocator, resolved,
                                &out_policy->state_dir);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "state dir");
  }
  char project_data[PATH_MAX];
  project_data_dir(exe_path, project_data, sizeof(project_data));
  status = roots_fill(&file->data_roots, resolved, "data", project_data,
                      "data_roots", &out_policy->data_roots);
  if (!status) {
    status = roots_fill(&file->model_roots, resolved, "models", project_data,
                        "model_roots", &out_policy->model_roots);
  }
  if (status) {
    pcp_workloads_train_policy_deinitialize(out_policy);
    return status;
  }
  // One job may hold half the machine (the rest: the other jobs, the
  // inference engine, the OS); 8 GiB when /proc/meminfo is unreadable.
  uint64_t half = memory_bytes ? memory_bytes / 2 : (uint64_t)8 << 30;
  out_policy->max_job_bytes =
      file->max_job_gateway_bytes > 0
          ? file->max_job_gateway_bytes
          : (int64_t)(half > INT64_MAX ? INT64_MAX : half);
  out_policy->max_parameters =
      file->max_job_parameters > 0
          ? file->max_job_parameters
          : out_policy->max_job_bytes / PCP_WORKLOADS_TRAIN_BYTES_PER_PARAMETER;
  if (out_policy->max_parameters < 1) {
    out_policy->max_parameters = 1;
  }
  return pcp_ok_status();
}

void pcp_workloads_train_policy_deinitialize(
    pcp_workloads_train_policy_t* policy) {
  pcp_allocator_free(policy->allocator, policy->state_dir);
  pcp_string_list_deinitialize(&policy->data_roots);
  pcp_string_list_deinitialize(&policy->model_roots);
  memset(policy, 0, sizeof(*policy));
}

// The 403 for a path outside its roots: the key and the roots, nothing
// about the file (not whether it exists, not its size or content).
static pcp_status_t path_outside(const char* key, const char* what,
                                 const pcp_string_list_t* roots,
                                 const char* config_key) {
  char list[2048];
  roots_join(roots, ", ", list, sizeof(list));
  return pcp_make_status(PCP_STATUS_PERMISSION_DENIED,
                         "key '%s': the path must lie under %s [%s]%s%s%s "
                         "(symbolic links and '..' are resolved first)",
                         key, what, list,
                         config_key ? " (gateway config '" : "",
                         config_key ? config_key : "", config_key ? "')" : "");
}

pcp_status_t pcp_workloads_train_policy_path_confine(
    const pcp_workloads_train_policy_t* policy, bool model_roots,
    const char* key, const char* path, char* out_path, size_t out_capacity) {
  const pcp_string_list_t* roots =
      model_roots ? &policy->model_roots : &policy->data_roots;
  pcp_status_t status =
      pcp_file_path_confine(path, (const char* const*)roots->items,
                            roots->count, out_path, out_capacity);
  if (!status)
    return pcp_ok_status();
  pcp_status_code_t code = pcp_status_consume_code(status);
  if (code == PCP_STATUS_INVALID_ARGUMENT) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "key '%s': empty path",
                           key);
  }
  return path_outside(key, model_roots ? "the model roots" : "the data roots",
                      roots, model_roots ? "model_roots" : "data_roots");
}

// The strings of a pcp_diloco_config_t belong to the config module, which
// frees them with the system allocator (pcp_config_deinitialize); a string
// put in their place must come from the same one.
static pcp_allocator_t config_string_allocator(void) {
  return pcp_allocator_system();
}

// Confines |*inout_path| (key |key|) under |roots| and replaces it with the
// resolved path (owned, from config_string_allocator).
static pcp_status_t path_confine(const char* key, const char* what,
                                 const pcp_string_list_t* roots,
                                 const char* config_key, char** inout_path) {
  char resolved[PATH_MAX];
  pcp_status_t status =
      pcp_file_path_confine(*inout_path, (const char* const*)roots->items,
                            roots->count, resolved, sizeof(resolved));
  if (status) {
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    if (code == PCP_STATUS_INVALID_ARGUMENT) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key '%s': empty path", key);
    }
    return path_outside(key, what, roots, config_key);
  }
  char* copy = NULL;
  status = pcp_allocator_strdup(config_string_allocator(), resolved, &copy);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path");
  }
  pcp_allocator_free(config_string_allocator(), *inout_path);
  *inout_path = copy;
  return pcp_ok_status();
}

// A data file must be a readable regular file when the job is submitted,
// not only when it runs (called after confinement: the path is ours to
// describe).
static pcp_status_t data_file_check(const char* key, const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': '%s' cannot be read (%s)", key, path,
                           err == ENOENT ? "no such file"
                                         : "no permission "
                                           "or not a file");
  }
  struct stat st;
  bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  close(fd);
  if (!regular) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': '%s' is not a regular file", key, path);
  }
  return pcp_ok_status();
}

// Confines every path key of |config| (replacing each with its resolved
// path) and checks the data file. checkpoint_dir: a relative one is taken
// under the state dir (as the service does), an absolute one must lie
// there too.
static pcp_status_t experiment_paths_confine(
    const pcp_workloads_train_policy_t* policy, pcp_diloco_config_t* config) {
  if (config->model_path && config->model_path[0]) {
    PCP_RETURN_IF_ERROR_BARE(path_confine("model_path", "the model roots",
                                          &policy->model_roots, "model_roots",
                                          &config->model_path));
  }
  PCP_RETURN_IF_ERROR_BARE(path_confine("data_path", "the data roots",
                                        &policy->data_roots, "data_roots",
                                        &config->data_path));
  PCP_RETURN_IF_ERROR_BARE(data_file_check("data_path", config->data_path));
  if (config->checkpoint_dir && config->checkpoint_dir[0]) {
    if (config->checkpoint_dir[0] != '/') {
      size_t n = strlen(policy->state_dir) + strlen(config->checkpoint_dir) + 2;
      char* joined = NULL;
      pcp_status_t status =
          pcp_allocator_malloc(config_string_allocator(), n, (void**)&joined);
      if (status) {
        pcp_status_ignore(status);
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path");
      }
      snprintf(joined, n, "%s/%s", policy->state_dir, config->checkpoint_dir);
      pcp_allocator_free(config_string_allocator(), config->checkpoint_dir);
      config->checkpoint_dir = joined;
    }
    // Read only: path_confine takes the list as roots.
    pcp_string_list_t state = {.items = (char**)&policy->state_dir, .count = 1};
    PCP_RETURN_IF_ERROR_BARE(path_confine("checkpoint_dir",
                                          "the gateway's state dir", &state,
                                          NULL, &config->checkpoint_dir));
  }
  return pcp_ok_status();
}

// The caps: parameters, and the gateway memory they need (checked 64-bit
// products; a parameter count from the models module is below 2^46 and a
// module's below 2^40, but the arithmetic does not rely on it).
static pcp_status_t job_size_check(const pcp_workloads_train_policy_t* policy,
                                   const pcp_diloco_config_t* config,
                                   int64_t parameter_count) {
  const char* key = config->model.present ? "model" : "model_path";
  uint64_t per = config->dtype == PCP_DILOCO_DTYPE_BF16
                     ? PCP_WORKLOADS_TRAIN_BYTES_PER_BF16_PARAMETER
                     : PCP_WORKLOADS_TRAIN_BYTES_PER_PARAMETER;
  uint64_t bytes = 0;
  bool overflow =
      parameter_count < 0 ||
      __builtin_mul_overflow((uint64_t)parameter_count, per, &bytes);
  if (overflow || bytes > (uint64_t)policy->max_job_bytes) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key '%s': the job would need %s%" PRIu64
        " bytes of gateway memory "
        "(%" PRId64 " parameters, %" PRIu64 " bytes each); the cap is %" PRId64
        " bytes (gateway config 'max_job_gateway_bytes')",
        key, overflow ? "more than " : "", overflow ? UINT64_MAX : bytes,
        parameter_count, per, policy->max_job_bytes);
  }
  if (parameter_count > policy->max_parameters) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': %" PRId64 " parameters (%" PRIu64
                           " bytes of gateway "
                           "memory); the cap is %" PRId64
                           " parameters (gateway config "
                           "'max_job_parameters')",
                           key, parameter_count, bytes, policy->max_parameters);
  }
  return pcp_ok_status();
}

// Replaces the value of |key| in |experiment| with |value| when the key is
// there (what the job reads is what was checked).
static pcp_status_t experiment_path_set(json_t* experiment, const char* key,
                                        const char* value) {
  if (!value || !json_object_get(experiment, key)) {
    return pcp_ok_status();
  }
  if (json_object_set_new(experiment, key, json_string(value)) != 0) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "experiment");
  }
  return pcp_ok_status();
}

// The "decoupled_diloco" block against its key table (decoupled_config.c),
// as the service parses it when the job starts: a bad value or an unknown
// key is a 400 naming it at submit rather than a job failing later. The
// rules that need the run (P <= H from tau, min_quorum against the
// workers, int4 block parity) stay with the service.
static pcp_status_t decoupled_block_check(const json_t* block) {
  if (!json_is_object(block)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'decoupled_diloco': must be an object");
  }
  char text[8192];
  size_t length = json_dumpb(block, text, sizeof(text), JSON_COMPACT);
  if (length == 0 || length >= sizeof(text)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'decoupled_diloco': over %zu bytes",
                           sizeof(text) - 1);
  }
  pcp_decoupled_config_t config;
  pcp_string_list_t unknown;
  memset(&unknown, 0, sizeof(unknown));
  pcp_status_t status =
      pcp_decoupled_config_parse_json(text, length, &config, &unknown);
  if (!status) {
    if (unknown.count) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'decoupled_diloco.%s': unknown",
                               unknown.items[0]);
    }
    pcp_decoupled_config_deinitialize(&config);
  }
  pcp_string_list_deinitialize(&unknown);
  return status;
}

// "aggregation_strategy" (read by the service, not the config table): absent
// or "diloco" runs classic DiLoCo (streaming with a "streaming" block),
// "decoupled_diloco" decoupled DiLoCo, "ddp" the per-step synchronous
// baseline. Anything else used to run classic DiLoCo silently, so a typo
// trained the wrong mode; now it is a 400 naming the key and the values.
// For the same reason a "decoupled_diloco" block needs the strategy that
// reads it: absent or "diloco", the block would be ignored and classic
// DiLoCo trained.
static pcp_status_t aggregation_strategy_check(
    const json_t* experiment, const pcp_diloco_config_t* config) {
  const json_t* value = json_object_get(experiment, "aggregation_strategy");
  const char* strategy = json_string_value(value);
  bool block = json_object_get(experiment, "decoupled_diloco") != NULL;
  if (block && (!value || (strategy && strcmp(strategy, "diloco") == 0))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'aggregation_strategy': a 'decoupled_diloco' "
                           "block needs aggregation_strategy "
                           "'decoupled_diloco' (%s would train classic "
                           "DiLoCo and ignore the block)",
                           value ? "'diloco'" : "its absence");
  }
  if (!value) {
    return pcp_ok_status();
  }
  static const char kAllowed[] = "'diloco', 'decoupled_diloco' or 'ddp'";
  if (!strategy) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'aggregation_strategy': must be a string, "
                           "one of %s",
                           kAllowed);
  }
  bool ddp = strcmp(strategy, "ddp") == 0;
  bool decoupled = strcmp(strategy, "decoupled_diloco") == 0;
  if (!ddp && !decoupled && strcmp(strategy, "diloco") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'aggregation_strategy': '%.64s' is not one "
                           "of %s",
                           strategy, kAllowed);
  }
  if ((ddp || decoupled) && config->streaming.present) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'aggregation_strategy': '%s' and a "
                           "'streaming' block exclude each other",
                           strategy);
  }
  if (decoupled && block) {
    PCP_RETURN_IF_ERROR_BARE(
        decoupled_block_check(json_object_get(experiment, "decoupled_diloco")));
  }
  if (ddp && json_object_get(experiment, "decoupled_diloco")) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'aggregation_strategy': 'ddp' and a "
                           "'decoupled_diloco' block exclude each other");
  }
  if (decoupled && config->warmup_steps > config->outer_loop_steps) {
    // Decoupled learners run outer_loop_steps local steps (one per syncer
    // step), not outer_loop_steps x tau: the general check allowed a warmup
    // that never ends.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'warmup_steps': %lld warmup steps; a "
                           "decoupled_diloco learner runs outer_loop_steps = "
                           "%lld local steps",
                           (long long)config->warmup_steps,
                           (long long)config->outer_loop_steps);
  }
  if (ddp && config->dtype != PCP_DILOCO_DTYPE_F32) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'dtype': aggregation_strategy 'ddp' trains "
                           "f32 models only");
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_train_spec_build(
    const pcp_workloads_train_policy_t* policy, const char* text,
    size_t byte_length, json_t** out_spec) {
  *out_spec = NULL;
  if (byte_length > PCP_WORKLOADS_TRAIN_MAX_EXPERIMENT_BYTES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "experiment of %zu bytes; the limit is %zu",
                           byte_length,
                           PCP_WORKLOADS_TRAIN_MAX_EXPERIMENT_BYTES);
  }
  pcp_diloco_config_t config;
  pcp_string_list_t unknown = {0};
  // The config table is the one validator: its message names the key, and
  // the HTTP layer maps INVALID_ARGUMENT to 400.
  pcp_status_t parsed =
      pcp_diloco_config_parse_json(text, byte_length, &config, &unknown);
  if (parsed) {
    // The unknown keys seen before the failing one are still in the list.
    pcp_string_list_deinitialize(&unknown);
    return parsed;
  }
  // Paths first: nothing is opened before it is known to lie under a root.
  int64_t parameter_count = 0;
  pcp_status_t model_status = experiment_paths_confine(policy, &config);
  if (!model_status) {
    model_status = model_parameter_count(&config, &parameter_count);
  }
  if (!model_status) {
    model_status = job_size_check(policy, &config, parameter_count);
  }
  if (model_status) {
    pcp_string_list_deinitialize(&unknown);
    pcp_diloco_config_deinitialize(&config);
    return model_status;
  }
  // Analytic bytes one worker moves per outer step (its delta up in the
  // wire dtype, the parameters down in the model's dtype): what the outer
  // loop's measured wire_bytes must add up to.
  uint64_t worker_step_bytes = pcp_diloco_outer_step_wire_bytes(
      (uint64_t)parameter_count, 1,
      (pcp_diloco_wire_dtype_t)config.deltas_dtype,
      config.dtype == PCP_DILOCO_DTYPE_BF16 ? PCP_DILOCO_WIRE_BF16
                                            : PCP_DILOCO_WIRE_F32);
  json_error_t error;
  json_t* experiment =
      json_loadb(text, byte_length, JSON_REJECT_DUPLICATES, &error);
  json_t* unknown_json = json_array();
  for (size_t i = 0; unknown_json && i < unknown.count; ++i) {
    json_array_append_new(unknown_json, json_string(unknown.items[i]));
  }
  pcp_status_t status = pcp_ok_status();
  if (!experiment || !json_is_object(experiment)) {
    // The config parser accepted it, so this is a jansson disagreement (or
    // OOM), not the client's fault.
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "experiment re-parse failed: %s", error.text);
  }
  if (!status) {
    status = aggregation_strategy_check(experiment, &config);
  }
  if (!status &&
      json_string_value(json_object_get(experiment, "aggregation_strategy")) &&
      strcmp(json_string_value(
                 json_object_get(experiment, "aggregation_strategy")),
             "ddp") == 0) {
    // ddp: the f32 gradient up and the averaged gradient down at each of
    // the tau inner steps one reported step covers.
    worker_step_bytes = 8 * (uint64_t)parameter_count * (uint64_t)config.tau;
  }
  if (!status) {
    status = experiment_path_set(experiment, "data_path", config.data_path);
  }
  if (!status) {
    status = experiment_path_set(experiment, "model_path", config.model_path);
  }
  if (!status) {
    status = experiment_path_set(experiment, "checkpoint_dir",
                                 config.checkpoint_dir);
  }
  json_t* spec = NULL;
  if (!status) {
    // "training" is the progress the outer loop updates; it starts at zero
    // so clients can render it before the first round.
    spec = json_pack(
        "{s:O, s:o, s:{s:I, s:I, s:I, s:n, s:n, s:I, s:s, s:b, s:I, s:I}}",
        "experiment", experiment, "unknown_keys",
        unknown_json ? unknown_json : json_array(), "training", "outer_step",
        (json_int_t)0, "outer_loop_steps", (json_int_t)config.outer_loop_steps,
        "tau", (json_int_t)config.tau, "loss", "tokens_per_s", "wire_bytes",
        (json_int_t)0, "deltas_dtype", wire_dtype_name(config.deltas_dtype),
        "streaming", config.streaming.present, "parameter_count",
        (json_int_t)parameter_count, "wire_bytes_per_worker_outer_step",
        (json_int_t)worker_step_bytes);
    unknown_json = NULL;  // json_pack's "o" took it
    if (!spec) {
      status =
          pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "training job spec");
    }
  }
  json_decref(unknown_json);
  json_decref(experiment);
  pcp_string_list_deinitialize(&unknown);
  pcp_diloco_config_deinitialize(&config);
  *out_spec = spec;
  return status;
}

void pcp_workloads_train_policy_describe(
    const pcp_workloads_train_policy_t* policy, char* out, size_t size) {
  char roots[2][1024];
  roots_join(&policy->data_roots, ",", roots[0], sizeof(roots[0]));
  roots_join(&policy->model_roots, ",", roots[1], sizeof(roots[1]));
  snprintf(out, size,
           "data_roots=%s model_roots=%s max_job_parameters=%" PRId64
           " max_job_gateway_bytes=%" PRId64,
           roots[0], roots[1], policy->max_parameters, policy->max_job_bytes);
}
