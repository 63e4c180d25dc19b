// SPDX-License-Identifier: Apache-2.0
//
// The RL experiment parser (experiment.h). Hand-written over jansson rather
// than a pcp_config table: clip_eps is a number or an object, a model is one
// of three forms and unknown keys are refused, none of which the tables do;
// the built-in model spec and the schedule names are training's, taken from
// its table so the two cannot drift.

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

// Every message is "<key path>: <what>".
static pcp_status_t bad(const char* path, const char* what) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: %s", path, what);
}

static pcp_status_t oom(void) {
  return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                         "rl experiment: out of memory");
}

static void key_join(char* out, size_t size, const char* prefix,
                     const char* key) {
  if (prefix && prefix[0])
    snprintf(out, size, "%s.%s", prefix, key);
  else
    snprintf(out, size, "%s", key);
}

// Refuses keys of |object| outside |allowed| (NULL-terminated), naming the
// first unknown one and the allowed set.
static pcp_status_t keys_check(const json_t* object, const char* prefix,
                               const char* const* allowed) {
  const char* key;
  json_t* value;
  json_object_foreach((json_t*)object, key, value) {
    (void)value;
    bool known = false;
    for (const char* const* a = allowed; *a && !known; ++a)
      known = strcmp(*a, key) == 0;
    if (known)
      continue;
    char what[512];
    snprintf(what, sizeof(what), "unknown key (allowed:");
    for (const char* const* a = allowed; *a; ++a) {
      size_t used = strlen(what);
      snprintf(what + used, sizeof(what) - used, " %s", *a);
    }
    size_t used = strlen(what);
    snprintf(what + used, sizeof(what) - used, ")");
    char path[160];
    // A hostile key is cut so that the message stays one short line.
    char shown[64];
    snprintf(shown, sizeof(shown), "%s", key);
    key_join(path, sizeof(path), prefix, shown);
    return bad(path, what);
  }
  return pcp_ok_status();
}

// Integer |key| of |object| in [min, max] (|*out| = |def| when absent or
// null).
static pcp_status_t int_get(const json_t* object, const char* prefix,
                            const char* key, int64_t def, int64_t min,
                            int64_t max, int64_t* out) {
  *out = def;
  json_t* value = json_object_get(object, key);
  if (!value || json_is_null(value))
    return pcp_ok_status();
  char path[128];
  key_join(path, sizeof(path), prefix, key);
  if (!json_is_integer(value))
    return bad(path, "must be an integer");
  json_int_t v = json_integer_value(value);
  if (v < min || v > max) {
    char what[96];
    snprintf(what, sizeof(what), "must be in [%lld, %lld]", (long long)min,
             (long long)max);
    return bad(path, what);
  }
  *out = v;
  return pcp_ok_status();
}

// A number in [min, max], or (min, max] when |min_open|.
static pcp_status_t number_check(const json_t* value, const char* path,
                                 double min, bool min_open, double max,
                                 double* out) {
  if (!json_is_number(value))
    return bad(path, "must be a number");
  double v = json_number_value(value);
  if (!isfinite(v) || (min_open ? v <= min : v < min) || v > max) {
    char what[96];
    snprintf(what, sizeof(what), "must be in %c%g, %g]", min_open ? '(' : '[',
             min, max);
    return bad(path, what);
  }
  *out = v;
  return pcp_ok_status();
}

static pcp_status_t double_get(const json_t* object, const char* prefix,
                               const char* key, double def, double min,
                               bool min_open, double max, double* out) {
  *out = def;
  json_t* value = json_object_get(object, key);
  if (!value || json_is_null(value))
    return pcp_ok_status();
  char path[128];
  key_join(path, sizeof(path), prefix, key);
  return number_check(value, path, min, min_open, max, out);
}

static pcp_status_t string_dup(pcp_allocator_t allocator, const char* text,
                               char** out) {
  pcp_status_t status = pcp_allocator_strdup(allocator, text, out);
  if (status) {
    pcp_status_ignore(status);
    return oom();
  }
  return pcp_ok_status();
}

// An optional worker class name (a worker's --worker-class): absent or null
// leaves *out NULL (every worker).
static pcp_status_t class_get(const json_t* root, pcp_allocator_t allocator,
                              const char* key, char** out) {
  const json_t* value = json_object_get(root, key);
  if (!value || json_is_null(value))
    return pcp_ok_status();
  if (!json_is_string(value) ||
      !pcp_sched_class_name_is_valid(json_string_value(value))) {
    return bad(key, "must be a worker class: 1..63 bytes of [A-Za-z0-9._-]");
  }
  return string_dup(allocator, json_string_value(value), out);
}

//===----------------------------------------------------------------------===//
// Paths
//===----------------------------------------------------------------------===//

typedef enum path_kind_e {
  PATH_REGULAR_FILE,
  PATH_DIRECTORY,
} path_kind_t;

// Confines string |value| (key |path|) under the policy's roots, checks what
// it names (after confinement: the path is ours to describe) and stores the
// resolved copy.
static pcp_status_t path_take(const pcp_workloads_train_policy_t* policy,
                              const json_t* value, const char* path,
                              bool model_roots, path_kind_t kind,
                              pcp_allocator_t allocator, char** out) {
  if (!json_is_string(value))
    return bad(path, "must be a string (a path)");
  const char* text = json_string_value(value);
  if (strlen(text) != json_string_length(value))
    return bad(path, "must not contain NUL");
  if (json_string_length(value) >= PATH_MAX)
    return bad(path, "path too long");
  char resolved[PATH_MAX];
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_train_policy_path_confine(
      policy, model_roots, path, text, resolved, sizeof(resolved)));
  struct stat st;
  if (stat(resolved, &st) != 0) {
    int err = errno;
    char what[PATH_MAX + 64];
    snprintf(what, sizeof(what), "'%s' cannot be read (%s)", resolved,
             err == ENOENT ? "no such file" : "no permission");
    return bad(path, what);
  }
  bool fits =
      kind == PATH_DIRECTORY ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
  if (!fits) {
    char what[PATH_MAX + 64];
    snprintf(what, sizeof(what), "'%s' is not a %s", resolved,
             kind == PATH_DIRECTORY ? "directory" : "regular file");
    return bad(path, what);
  }
  if (kind == PATH_REGULAR_FILE && access(resolved, R_OK) != 0) {
    char what[PATH_MAX + 64];
    snprintf(what, sizeof(what), "'%s' cannot be read (no permission)",
             resolved);
    return bad(path, what);
  }
  return string_dup(allocator, resolved, out);
}

// Hugging Face's names for safetensors weights: "model.safetensors" or the
// shards "model-00001-of-00004.safetensors" (any prefix before ".safetensors"
// that is a plain file name; an index .json is not weights).
static bool safetensors_name_ok(const char* resolved) {
  const char* base = strrchr(resolved, '/');
  base = base ? base + 1 : resolved;
  static const char kSuffix[] = ".safetensors";
  size_t n = strlen(base);
  size_t s = sizeof(kSuffix) - 1;
  return n > s && strcmp(base + n - s, kSuffix) == 0;
}

//===----------------------------------------------------------------------===//
// Models
//===----------------------------------------------------------------------===//

// Training's built-in model table (the "model" field of its config table).
static const pcp_config_table_t* spec_table(void) {
  const pcp_config_table_t* table = pcp_diloco_config_table();
  for (size_t i = 0; i < table->field_count; ++i) {
    if (strcmp(table->fields[i].name, "model") == 0)
      return table->fields[i].object_table;
  }
  return NULL;
}

// Keys of a built-in spec ("kind", "layers", ...), from training's table.
static pcp_status_t spec_parse(const json_t* value, const char* path,
                               pcp_diloco_model_spec_t* out) {
  if (!json_is_object(value))
    return bad(path, "must be an object {kind, layers, heads, ...}");
  const pcp_config_table_t* table = spec_table();
  if (!table)
    return pcp_make_status(PCP_STATUS_INTERNAL, "%s: no model table", path);
  const char* allowed[16];
  size_t n = 0;
  for (size_t i = 0; i < table->field_count && n + 1 < PCP_ARRAYSIZE(allowed);
       ++i) {
    allowed[n++] = table->fields[i].name;
  }
  allowed[n] = NULL;
  PCP_RETURN_IF_ERROR_BARE(keys_check(value, path, allowed));
  // Values go through the table (its types, bounds and cross-field rules);
  // its messages are prefixed with the key path.
  // A spec is a handful of small numbers: its text fits on the stack.
  char text[1024];
  size_t length = json_dumpb(value, text, sizeof(text), JSON_COMPACT);
  if (length == 0 || length > sizeof(text))
    return bad(path, "too large for a model spec");
  memset(out, 0, sizeof(*out));
  pcp_status_t status = pcp_config_initialize(table, out);
  if (!status)
    status = pcp_config_parse_json(table, text, length, out, NULL);
  out->present = true;
  if (!status)
    status = pcp_config_validate(table, out);
  if (status) {
    if (pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED)
      return status;
    pcp_status_t wrapped = bad(path, pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  return pcp_ok_status();
}

static bool job_id_ok(const char* id, size_t length) {
  if (length == 0 || length > PCP_WORKLOADS_RL_MAX_JOB_ID_BYTES ||
      strlen(id) != length) {
    return false;
  }
  for (size_t i = 0; i < length; ++i) {
    char c = id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return false;
  }
  return true;
}

// A model object: exactly one of {"train_job" with "spec"},
// {"served_model_dir"}, {"safetensors"}.
static pcp_status_t model_parse(const pcp_workloads_train_policy_t* policy,
                                const json_t* value, const char* prefix,
                                pcp_allocator_t allocator,
                                pcp_workloads_rl_model_t* out) {
  if (!json_is_object(value)) {
    return bad(prefix,
               "must be an object with one of train_job (+ spec), "
               "served_model_dir, safetensors");
  }
  static const char* const kKeys[] = {"train_job", "spec", "served_model_dir",
                                      "safetensors", NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(value, prefix, kKeys));
  json_t* job = json_object_get(value, "train_job");
  json_t* spec = json_object_get(value, "spec");
  json_t* dir = json_object_get(value, "served_model_dir");
  json_t* file = json_object_get(value, "safetensors");
  int forms = (job != NULL) + (dir != NULL) + (file != NULL);
  if (forms != 1) {
    return bad(prefix,
               "give exactly one of train_job (with spec), served_model_dir "
               "and safetensors");
  }
  char path[128];
  if (spec && !job) {
    key_join(path, sizeof(path), prefix, "spec");
    return bad(path, "only with train_job (the other forms carry their own)");
  }
  if (job) {
    key_join(path, sizeof(path), prefix, "train_job");
    if (!json_is_string(job) ||
        !job_id_ok(json_string_value(job), json_string_length(job))) {
      return bad(path, "must be a job id: 1..128 bytes of [A-Za-z0-9._-]");
    }
    key_join(path, sizeof(path), prefix, "spec");
    if (!spec)
      return bad(path, "required with train_job (the built-in model's spec)");
    PCP_RETURN_IF_ERROR_BARE(spec_parse(spec, path, &out->spec));
    PCP_RETURN_IF_ERROR_BARE(
        string_dup(allocator, json_string_value(job), &out->train_job));
    out->source = PCP_WORKLOADS_RL_MODEL_TRAIN_JOB;
    return pcp_ok_status();
  }
  if (dir) {
    key_join(path, sizeof(path), prefix, "served_model_dir");
    PCP_RETURN_IF_ERROR_BARE(path_take(policy, dir, path, true, PATH_DIRECTORY,
                                       allocator, &out->path));
    out->source = PCP_WORKLOADS_RL_MODEL_SERVED_DIR;
    return pcp_ok_status();
  }
  key_join(path, sizeof(path), prefix, "safetensors");
  PCP_RETURN_IF_ERROR_BARE(path_take(policy, file, path, true,
                                     PATH_REGULAR_FILE, allocator, &out->path));
  out->source = PCP_WORKLOADS_RL_MODEL_SAFETENSORS;
  if (!safetensors_name_ok(out->path)) {
    return bad(path,
               "must name a .safetensors file (Hugging Face naming: "
               "model.safetensors, model-00001-of-00002.safetensors)");
  }
  return pcp_ok_status();
}

static void model_release(pcp_allocator_t allocator,
                          pcp_workloads_rl_model_t* model) {
  pcp_allocator_free(allocator, model->train_job);
  pcp_allocator_free(allocator, model->path);
  memset(model, 0, sizeof(*model));
}

//===----------------------------------------------------------------------===//
// Experiment
//===----------------------------------------------------------------------===//

static const char* const kKeys[] = {"num_iterations",
                                    "group_size",
                                    "num_prompts",
                                    "rollout_max_tokens",
                                    "learning_rate",
                                    "beta",
                                    "clip_eps",
                                    "temperature",
                                    "top_p",
                                    "max_off_policy_steps",
                                    "prompts_path",
                                    "eval_prompts_path",
                                    "eval_every",
                                    "reward",
                                    "base_model",
                                    "reference_model",
                                    "checkpoint_every",
                                    "weight_decay",
                                    "betas",
                                    "eps",
                                    "grad_clip",
                                    "lr_schedule",
                                    "warmup_steps",
                                    "min_lr",
                                    "seed",
                                    "rollout_worker_class",
                                    "trainer_worker_class",
                                    "served_model_name",
                                    NULL};

// clip_eps: a number (both sides) or {low, high}; each in (0, 10].
static pcp_status_t clip_parse(const json_t* root,
                               pcp_workloads_rl_experiment_t* e) {
  e->clip_low = 0.2;
  e->clip_high = 0.2;
  json_t* value = json_object_get(root, "clip_eps");
  if (!value || json_is_null(value))
    return pcp_ok_status();
  if (json_is_number(value)) {
    PCP_RETURN_IF_ERROR_BARE(
        number_check(value, "clip_eps", 0, true, 10, &e->clip_low));
    e->clip_high = e->clip_low;
    return pcp_ok_status();
  }
  if (!json_is_object(value))
    return bad("clip_eps", "must be a number or an object {low, high}");
  static const char* const kClipKeys[] = {"low", "high", NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(value, "clip_eps", kClipKeys));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(value, "clip_eps", "low", 0.2, 0, true, 10, &e->clip_low));
  return double_get(value, "clip_eps", "high", 0.2, 0, true, 10, &e->clip_high);
}

// betas: [beta1, beta2], each in [0, 1).
static pcp_status_t betas_parse(const json_t* root,
                                pcp_workloads_rl_experiment_t* e) {
  e->beta1 = 0.9;
  e->beta2 = 0.999;
  json_t* value = json_object_get(root, "betas");
  if (!value || json_is_null(value))
    return pcp_ok_status();
  if (!json_is_array(value) || json_array_size(value) != 2)
    return bad("betas", "must be an array [beta1, beta2]");
  double* out[2] = {&e->beta1, &e->beta2};
  for (size_t i = 0; i < 2; ++i) {
    char path[32];
    snprintf(path, sizeof(path), "betas[%zu]", i);
    PCP_RETURN_IF_ERROR_BARE(number_check(json_array_get(value, i), path, 0,
                                          false, 0.999999, out[i]));
  }
  return pcp_ok_status();
}

// lr_schedule: training's names (its table's enum), default "constant".
static pcp_status_t schedule_parse(const json_t* root,
                                   pcp_workloads_rl_experiment_t* e) {
  e->lr_schedule = PCP_DILOCO_LR_CONSTANT;
  json_t* value = json_object_get(root, "lr_schedule");
  if (!value || json_is_null(value))
    return pcp_ok_status();
  const pcp_config_table_t* table = pcp_diloco_config_table();
  const char* const* names = NULL;
  for (size_t i = 0; i < table->field_count; ++i) {
    if (strcmp(table->fields[i].name, "lr_schedule") == 0)
      names = table->fields[i].enum_values;
  }
  if (!names)
    return pcp_make_status(PCP_STATUS_INTERNAL, "lr_schedule: no names");
  char what[160];
  snprintf(what, sizeof(what), "must be one of");
  for (int32_t i = 0; names[i]; ++i) {
    size_t used = strlen(what);
    snprintf(what + used, sizeof(what) - used, " %s", names[i]);
    if (json_is_string(value) &&
        strcmp(json_string_value(value), names[i]) == 0) {
      e->lr_schedule = i;
      return pcp_ok_status();
    }
  }
  return bad("lr_schedule", what);
}

// The reward: a built-in is built (its own validation, key path "reward");
// an external verifier is the service's to build.
static pcp_status_t reward_parse(const json_t* root,
                                 pcp_workloads_rl_experiment_t* e) {
  json_t* value = json_object_get(root, "reward");
  if (!value)
    return bad("reward", "required (docs/rl.md \"Rewards\")");
  if (!json_is_object(value))
    return bad("reward", "must be an object with a type");
  e->reward_config = json_deep_copy(value);
  if (!e->reward_config)
    return oom();
  json_t* type = json_object_get(value, "type");
  if (json_is_string(type) &&
      strcmp(json_string_value(type), "verifier") == 0) {
    return pcp_ok_status();
  }
  return pcp_workloads_rl_reward_create(value, "reward", e->allocator,
                                        &e->reward);
}

// served_model_name: 1..64 of [A-Za-z0-9._-] (a directory name under
// <state_dir>/models and the name /v1/models lists); NULL: the job's
// default ("rl-" + the first 8 characters of its id).
static pcp_status_t served_name_parse(const json_t* root,
                                      pcp_workloads_rl_experiment_t* e) {
  json_t* value = json_object_get(root, "served_model_name");
  if (!value || json_is_null(value))
    return pcp_ok_status();
  const char* what = "must be a string of 1..64 characters of [A-Za-z0-9._-]";
  if (!json_is_string(value))
    return bad("served_model_name", what);
  const char* name = json_string_value(value);
  size_t length = json_string_length(value);
  bool ok = length >= 1 && length <= PCP_WORKLOADS_RL_MAX_SERVED_NAME_BYTES &&
            strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
  for (size_t i = 0; ok && i < length; ++i) {
    char c = name[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  }
  if (!ok)
    return bad("served_model_name", what);
  return pcp_allocator_strdup(e->allocator, name, &e->served_model_name);
}

static pcp_status_t cross_check(const pcp_workloads_rl_experiment_t* e,
                                const json_t* root) {
  if (e->num_prompts * e->group_size >
      PCP_WORKLOADS_RL_MAX_ROLLOUTS_PER_ITERATION) {
    char what[128];
    snprintf(what, sizeof(what),
             "num_prompts x group_size is %lld rollouts; at most %lld",
             (long long)(e->num_prompts * e->group_size),
             (long long)PCP_WORKLOADS_RL_MAX_ROLLOUTS_PER_ITERATION);
    return bad("num_prompts", what);
  }
  json_t* eval_every = json_object_get(root, "eval_every");
  if (eval_every && !json_is_null(eval_every) && !e->eval_prompts_path)
    return bad("eval_every", "needs eval_prompts_path (the held-out prompts)");
  if (e->warmup_steps > 0 && e->lr_schedule == PCP_DILOCO_LR_CONSTANT)
    return bad("warmup_steps", "needs lr_schedule cosine or warmup_constant");
  if (e->warmup_steps >= e->num_iterations && e->warmup_steps > 0)
    return bad("warmup_steps", "must be below num_iterations");
  if (e->min_lr > 0 && e->lr_schedule != PCP_DILOCO_LR_COSINE)
    return bad("min_lr", "only the cosine schedule decays to it");
  if (e->min_lr > e->learning_rate)
    return bad("min_lr", "must be at most learning_rate");
  return pcp_ok_status();
}

static pcp_status_t experiment_fill(const pcp_workloads_train_policy_t* policy,
                                    const json_t* root,
                                    pcp_workloads_rl_experiment_t* e) {
  PCP_RETURN_IF_ERROR_BARE(keys_check(root, NULL, kKeys));
  PCP_RETURN_IF_ERROR_BARE(int_get(root, NULL, "num_iterations", 100, 1,
                                   1000000, &e->num_iterations));
  PCP_RETURN_IF_ERROR_BARE(
      int_get(root, NULL, "group_size", 8, 2, 1024, &e->group_size));
  PCP_RETURN_IF_ERROR_BARE(
      int_get(root, NULL, "num_prompts", 8, 1, 65536, &e->num_prompts));
  PCP_RETURN_IF_ERROR_BARE(int_get(root, NULL, "rollout_max_tokens", 128, 1,
                                   32768, &e->rollout_max_tokens));
  PCP_RETURN_IF_ERROR_BARE(double_get(root, NULL, "learning_rate", 1e-6, 0,
                                      true, 1, &e->learning_rate));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "beta", 0.04, 0, false, 10, &e->beta));
  PCP_RETURN_IF_ERROR_BARE(clip_parse(root, e));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "temperature", 1.0, 0, true, 10, &e->temperature));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "top_p", 1.0, 0, true, 1, &e->top_p));
  PCP_RETURN_IF_ERROR_BARE(int_get(root, NULL, "max_off_policy_steps", 1, 0,
                                   1000, &e->max_off_policy_steps));
  json_t* prompts = json_object_get(root, "prompts_path");
  if (!prompts)
    return bad("prompts_path", "required (a prompts JSONL file)");
  PCP_RETURN_IF_ERROR_BARE(path_take(policy, prompts, "prompts_path", false,
                                     PATH_REGULAR_FILE, e->allocator,
                                     &e->prompts_path));
  json_t* eval = json_object_get(root, "eval_prompts_path");
  if (eval && !json_is_null(eval)) {
    PCP_RETURN_IF_ERROR_BARE(path_take(policy, eval, "eval_prompts_path", false,
                                       PATH_REGULAR_FILE, e->allocator,
                                       &e->eval_prompts_path));
  }
  PCP_RETURN_IF_ERROR_BARE(
      int_get(root, NULL, "eval_every", 10, 1, 1000000, &e->eval_every));
  PCP_RETURN_IF_ERROR_BARE(reward_parse(root, e));
  json_t* base = json_object_get(root, "base_model");
  if (!base)
    return bad("base_model",
               "required (train_job + spec, served_model_dir "
               "or safetensors)");
  PCP_RETURN_IF_ERROR_BARE(
      model_parse(policy, base, "base_model", e->allocator, &e->base_model));
  json_t* reference = json_object_get(root, "reference_model");
  if (reference && !json_is_null(reference)) {
    PCP_RETURN_IF_ERROR_BARE(model_parse(policy, reference, "reference_model",
                                         e->allocator, &e->reference_model));
  }
  PCP_RETURN_IF_ERROR_BARE(int_get(root, NULL, "checkpoint_every", 10, 1,
                                   1000000, &e->checkpoint_every));
  PCP_RETURN_IF_ERROR_BARE(double_get(root, NULL, "weight_decay", 0, 0, false,
                                      10, &e->weight_decay));
  PCP_RETURN_IF_ERROR_BARE(betas_parse(root, e));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "eps", 1e-8, 0, true, 1e-2, &e->eps));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "grad_clip", 1.0, 0, false, 1e6, &e->grad_clip));
  PCP_RETURN_IF_ERROR_BARE(schedule_parse(root, e));
  PCP_RETURN_IF_ERROR_BARE(
      int_get(root, NULL, "warmup_steps", 0, 0, 1000000, &e->warmup_steps));
  PCP_RETURN_IF_ERROR_BARE(
      double_get(root, NULL, "min_lr", 0, 0, false, 1, &e->min_lr));
  PCP_RETURN_IF_ERROR_BARE(
      int_get(root, NULL, "seed", 0, 0, (int64_t)1e15, &e->seed));
  PCP_RETURN_IF_ERROR_BARE(class_get(root, e->allocator, "rollout_worker_class",
                                     &e->rollout_worker_class));
  PCP_RETURN_IF_ERROR_BARE(class_get(root, e->allocator, "trainer_worker_class",
                                     &e->trainer_worker_class));
  PCP_RETURN_IF_ERROR_BARE(served_name_parse(root, e));
  return cross_check(e, root);
}

pcp_status_t pcp_workloads_rl_experiment_parse(
    const pcp_workloads_train_policy_t* policy, const char* text,
    size_t byte_length, pcp_allocator_t allocator,
    pcp_workloads_rl_experiment_t* out_experiment) {
  memset(out_experiment, 0, sizeof(*out_experiment));
  out_experiment->allocator = allocator;
  if (byte_length > PCP_WORKLOADS_RL_EXPERIMENT_MAX_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rl experiment: %zu bytes; at most %zu", byte_length,
                           PCP_WORKLOADS_RL_EXPERIMENT_MAX_BYTES);
  }
  json_error_t error;
  json_t* root = json_loadb(text, byte_length, JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rl experiment: line %d column %d: %s", error.line,
                           error.column, error.text);
  }
  pcp_status_t status = pcp_ok_status();
  if (!json_is_object(root))
    status = bad("rl experiment", "must be a JSON object");
  else
    status = experiment_fill(policy, root, out_experiment);
  json_decref(root);
  if (status)
    pcp_workloads_rl_experiment_deinitialize(out_experiment);
  return status;
}

void pcp_workloads_rl_experiment_deinitialize(
    pcp_workloads_rl_experiment_t* experiment) {
  pcp_allocator_t allocator = experiment->allocator;
  pcp_allocator_free(allocator, experiment->prompts_path);
  pcp_allocator_free(allocator, experiment->eval_prompts_path);
  pcp_allocator_free(allocator, experiment->rollout_worker_class);
  pcp_allocator_free(allocator, experiment->trainer_worker_class);
  pcp_allocator_free(allocator, experiment->served_model_name);
  json_decref(experiment->reward_config);
  pcp_workloads_rl_reward_release(experiment->reward);
  model_release(allocator, &experiment->base_model);
  model_release(allocator, &experiment->reference_model);
  memset(experiment, 0, sizeof(*experiment));
  experiment->allocator = allocator;
}
