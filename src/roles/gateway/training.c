// SPDX-License-Identifier: Apache-2.0
//
// The gateway's training API: POST /v1/training/jobs takes a DiLoCo
// experiment (the workloads config table's keys), validates it there and
// records a job of kind "training" with its events; GET
// /v1/training/jobs/{id} answers the job with its training progress.
//
// The outer loop itself is src/workloads/train/service.c
// (pcp_diloco_job_run) and the job's lifecycle is the training kind on the
// shared workload runner (src/workloads/train/job.c, runtime.h): its
// scheduler starts queued training jobs on its bounded pool and moves them
// through the store's states (queued -> placing -> compiling -> running ->
// succeeded | failed, cancelling -> cancelled); a cancel reaches the run
// through its condition variable. Here are the API, the paths-and-limits
// policy and the hooks the kind calls back (the policy re-check at placing,
// the inference reload on export). The runner schedules each kind on its
// own (a queued list per kind, a limit per kind). A gateway stopped (or
// killed) mid-run leaves the job running in the store; the restart
// re-queues it (the runner's recovery) and the service resumes it from its
// newest checkpoint.
//
// Thread-safety: the handlers run on libmicrohttpd's threads and touch only
// the store and the runner (both thread-safe) and the gateway's atomics.

// realpath(3) is XSI: glibc declares it only with _XOPEN_SOURCE.
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "models/models.h"
#include "roles/gateway/gateway_impl.h"
#include "workloads/workloads.h"

// Experiments are small JSON objects; the cap keeps a hostile body from
// reaching the config parser (STYLE 3.8: configs at most 1 MiB).
#define PCP_GATEWAY_TRAINING_MAX_BODY_BYTES ((size_t)1 << 20)

static atomic_uint_fast64_t g_training_counter;

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

uint64_t pcp_roles_gateway_memory_total_bytes(void) {
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

pcp_status_t pcp_roles_gateway_training_policy_initialize(
    const pcp_roles_gateway_file_config_t* file, const char* exe_path,
    uint64_t memory_bytes, pcp_roles_gateway_training_policy_t* out_policy) {
  memset(out_policy, 0, sizeof(*out_policy));
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
  out_policy->state_dir = strdup(resolved);
  if (!out_policy->state_dir) {
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
    pcp_roles_gateway_training_policy_deinitialize(out_policy);
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
          : out_policy->max_job_bytes /
                PCP_GATEWAY_TRAINING_BYTES_PER_PARAMETER;
  if (out_policy->max_parameters < 1) {
    out_policy->max_parameters = 1;
  }
  return pcp_ok_status();
}

void pcp_roles_gateway_training_policy_deinitialize(
    pcp_roles_gateway_training_policy_t* policy) {
  free(policy->state_dir);
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

// Confines |*inout_path| (key |key|) under |roots| and replaces it with the
// resolved path (owned, malloc'd).
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
  char* copy = strdup(resolved);
  if (!copy) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path");
  }
  free(*inout_path);
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
    const pcp_roles_gateway_training_policy_t* policy,
    pcp_diloco_config_t* config) {
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
      char* joined = malloc(n);
      if (!joined) {
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path");
      }
      snprintf(joined, n, "%s/%s", policy->state_dir, config->checkpoint_dir);
      free(config->checkpoint_dir);
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
static pcp_status_t job_size_check(
    const pcp_roles_gateway_training_policy_t* policy,
    const pcp_diloco_config_t* config, int64_t parameter_count) {
  const char* key = config->model.present ? "model" : "model_path";
  uint64_t per = config->dtype == PCP_DILOCO_DTYPE_BF16
                     ? PCP_GATEWAY_TRAINING_BYTES_PER_BF16_PARAMETER
                     : PCP_GATEWAY_TRAINING_BYTES_PER_PARAMETER;
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

pcp_status_t pcp_roles_gateway_training_spec_build(
    const pcp_roles_gateway_training_policy_t* policy, const char* text,
    size_t byte_length, json_t** out_spec) {
  *out_spec = NULL;
  if (byte_length > PCP_GATEWAY_TRAINING_MAX_BODY_BYTES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "experiment of %zu bytes; the limit is %zu",
                           byte_length, PCP_GATEWAY_TRAINING_MAX_BODY_BYTES);
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

static pcp_status_t training_job_answer(pcp_roles_gateway_state_t* g,
                                        const char* id, int http_status,
                                        pcp_http_response_t* response) {
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  if (strcmp(job.kind, "training") != 0) {
    pcp_store_job_deinitialize(&job);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "training job %s", id);
  }
  json_t* out = pcp_roles_gateway_job_json(&job);
  json_t* training = json_object_get(job.spec, "training");
  if (out && training) {
    // Progress at the top level too, so `pcp submit train` reads one object.
    json_object_set(out, "training", training);
  }
  pcp_store_job_deinitialize(&job);
  if (out) {
    pcp_roles_gateway_training_json_merge(g, out);
  }
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job JSON");
  }
  return pcp_http_response_json_take(response, http_status, out);
}

pcp_status_t pcp_roles_gateway_training_submit(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  pcp_string_view_t body = pcp_http_request_body(request);
  return pcp_roles_gateway_training_text_submit(user_data, body.data,
                                                body.size, response);
}

pcp_status_t pcp_roles_gateway_training_text_submit(
    pcp_roles_gateway_state_t* g, const char* text, size_t byte_length,
    pcp_http_response_t* response) {
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_training_spec_build(
      &g->training_policy, text, byte_length, &spec));
  char id[64];
  snprintf(id, sizeof(id), "train-%" PRIx64 "-%" PRIu64,
           (uint64_t)pcp_clock_wall_ns(g->clock),
           (uint64_t)atomic_fetch_add(&g_training_counter, 1));
  // "training.accepted" follows "queued" before the job can start.
  pcp_status_t status = pcp_workloads_runner_job_submit(
      g->runner, id, "training", spec, "training.accepted",
      json_object_get(spec, "training"), NULL);
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  char location[128];
  snprintf(location, sizeof(location), "/v1/training/jobs/%s", id);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Location", location));
  status = training_job_answer(g, id, 202, response);
  // Only now, so the answer shows "queued".
  pcp_workloads_runner_wake(g->runner);
  return status;
}

pcp_status_t pcp_roles_gateway_training_get(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  if (!id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "missing job id");
  }
  return training_job_answer(g, id, 200, response);
}

//===----------------------------------------------------------------------===//
// The training kind's hooks (the kind itself: src/workloads/train/job.c)
//===----------------------------------------------------------------------===//

// The submit-time checks again, at placing, under today's policy.
static pcp_status_t experiment_check(void* user_data, const char* experiment,
                                     char** out_checked) {
  pcp_roles_gateway_state_t* g = user_data;
  *out_checked = NULL;
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_training_spec_build(
      &g->training_policy, experiment, strlen(experiment), &spec));
  *out_checked = json_dumps(json_object_get(spec, "experiment"), JSON_COMPACT);
  json_decref(spec);
  if (!*out_checked) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "experiment");
  }
  return pcp_ok_status();
}

// A checkpoint's export was written: the inference service reloads the
// model now rather than at its next periodic scan.
static void model_exported(void* user_data, const char* model_dir) {
  pcp_roles_gateway_state_t* g = user_data;
  pcp_infer_service_dir_notify(g->infer, model_dir);
}

pcp_status_t pcp_roles_gateway_training_start(pcp_roles_gateway_state_t* g) {
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_training_policy_initialize(
      &g->config->file, "/proc/self/exe",
      pcp_roles_gateway_memory_total_bytes(), &g->training_policy));
  {
    // One line an operator can check: where experiments may point, and the
    // size caps.
    const pcp_roles_gateway_training_policy_t* p = &g->training_policy;
    char roots[2][1024];
    roots_join(&p->data_roots, ",", roots[0], sizeof(roots[0]));
    roots_join(&p->model_roots, ",", roots[1], sizeof(roots[1]));
    PCP_LOG(PCP_LOG_INFO, &g->log,
            "training paths and caps data_roots=%s model_roots=%s "
            "max_job_parameters=%" PRId64 " max_job_gateway_bytes=%" PRId64,
            roots[0], roots[1], p->max_parameters, p->max_job_bytes);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_metrics_register(g->registry, &g->training_metrics));
  g->train_kind.options = (pcp_workloads_train_options_t){
      .fabric = g->fabric,
      .state_dir = g->config->file.state_dir,
      .metrics = &g->training_metrics,
      .compile_queue = g->compile_queue,
      .store = g->store,
      .clock = g->clock,
      .log = g->log,
      .experiment_check = experiment_check,
      .exported = model_exported,
      .user_data = g,
  };
  return pcp_workloads_runner_start(g->runner);
}

void pcp_roles_gateway_training_stop(pcp_roles_gateway_state_t* g) {
  // Every run sees should_stop and returns; its job stays running in the
  // store and resumes from a checkpoint at the next start.
  if (g->runner) {
    pcp_workloads_runner_stop(g->runner);
  }
  pcp_roles_gateway_training_policy_deinitialize(&g->training_policy);
}

void pcp_roles_gateway_training_json_merge(pcp_roles_gateway_state_t* g,
                                           json_t* job_json) {
  if (g->runner) {
    pcp_workloads_runner_job_json_merge(g->runner, job_json);
  }
}
