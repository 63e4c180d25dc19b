// SPDX-License-Identifier: Apache-2.0
// The RL job's parts that need no worker (job_impl.h): its state and
// state.json, the progress JSON, stale groups, checkpoints on disk and the
// served policy directory.

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"
// After workloads.h.
#include "workloads/rl/job_impl.h"

//===----------------------------------------------------------------------===//
// State
//===----------------------------------------------------------------------===//

static void last_clear(pcp_workloads_rl_last_t* last) {
  last->reward_mean = NAN;
  last->reward_std = NAN;
  last->kl = NAN;
  last->clip_fraction = NAN;
  last->mean_ratio = NAN;
  last->loss = NAN;
  last->grad_norm = NAN;
  last->tokens_per_second = NAN;
  last->weight_refresh_seconds = NAN;
  last->weight_refresh_bytes = 0;
}

void pcp_workloads_rl_state_initialize(int64_t seed,
                                       pcp_workloads_rl_state_t* out_state) {
  memset(out_state, 0, sizeof(*out_state));
  out_state->seed = seed;
  out_state->eval_reward_mean = NAN;
  out_state->checkpoint_iteration = -1;
  last_clear(&out_state->last);
}

void pcp_workloads_rl_state_history_append(
    pcp_workloads_rl_state_t* state, const pcp_workloads_rl_point_t* point) {
  if (state->history_count > 0 &&
      state->history[state->history_count - 1].iteration == point->iteration) {
    state->history[state->history_count - 1] = *point;
    return;
  }
  if (state->history_count == PCP_WORKLOADS_RL_HISTORY_MAX_POINTS) {
    memmove(
        &state->history[0], &state->history[1],
        (PCP_WORKLOADS_RL_HISTORY_MAX_POINTS - 1) * sizeof(state->history[0]));
    --state->history_count;
  }
  state->history[state->history_count++] = *point;
}

// JSON has no NaN: an unmeasured number is null.
static json_t* number_or_null(double value) {
  return isfinite(value) ? json_real(value) : json_null();
}

static json_t* point_json(const pcp_workloads_rl_point_t* p) {
  json_t* out = json_pack(
      "{s:I, s:o, s:o, s:o, s:o}", "iteration", (json_int_t)p->iteration,
      "reward_mean", number_or_null(p->reward_mean), "reward_std",
      number_or_null(p->reward_std), "kl", number_or_null(p->kl),
      "clip_fraction", number_or_null(p->clip_fraction));
  if (out && isfinite(p->eval_reward_mean)) {
    json_object_set_new(out, "eval_reward_mean",
                        json_real(p->eval_reward_mean));
  }
  return out;
}

static json_t* history_json(const pcp_workloads_rl_state_t* state) {
  json_t* history = json_array();
  for (size_t i = 0; history && i < state->history_count; ++i) {
    if (json_array_append_new(history, point_json(&state->history[i]))) {
      json_decref(history);
      return NULL;
    }
  }
  return history;
}

static json_t* last_json(const pcp_workloads_rl_last_t* l) {
  return json_pack(
      "{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I}", "reward_mean",
      number_or_null(l->reward_mean), "reward_std",
      number_or_null(l->reward_std), "kl", number_or_null(l->kl),
      "clip_fraction", number_or_null(l->clip_fraction), "mean_ratio",
      number_or_null(l->mean_ratio), "loss", number_or_null(l->loss),
      "grad_norm", number_or_null(l->grad_norm), "tokens_per_second",
      number_or_null(l->tokens_per_second), "weight_refresh_seconds",
      number_or_null(l->weight_refresh_seconds), "weight_refresh_bytes",
      (json_int_t)l->weight_refresh_bytes);
}

json_t* pcp_workloads_rl_state_json(const pcp_workloads_rl_state_t* state) {
  return json_pack(
      "{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:o, "
      "s:o, s:I}",
      "format", 1, "iteration", (json_int_t)state->iteration, "step",
      (json_int_t)state->step, "version", (json_int_t)state->version, "seed",
      (json_int_t)state->seed, "rollout_tokens",
      (json_int_t)state->rollout_tokens, "stale_dropped",
      (json_int_t)state->stale_dropped, "degenerate_groups",
      (json_int_t)state->degenerate_groups, "truncated_tokens",
      (json_int_t)state->truncated_tokens, "skipped_updates",
      (json_int_t)state->skipped_updates, "eval_reward_mean",
      number_or_null(state->eval_reward_mean), "checkpoint_iteration",
      (json_int_t)state->checkpoint_iteration, "last", last_json(&state->last),
      "history", history_json(state), "workers", (json_int_t)state->workers);
}

static pcp_status_t bad_state(const char* key) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "rl state.json: key '%s' missing or of a wrong type",
                         key);
}

static pcp_status_t int_read(const json_t* object, const char* key, int64_t min,
                             int64_t* out) {
  json_t* value = json_object_get(object, key);
  if (!json_is_integer(value) || json_integer_value(value) < min) {
    return bad_state(key);
  }
  *out = json_integer_value(value);
  return pcp_ok_status();
}

// A number or null (NaN).
static pcp_status_t real_read(const json_t* object, const char* key,
                              double* out) {
  json_t* value = json_object_get(object, key);
  if (json_is_null(value)) {
    *out = NAN;
    return pcp_ok_status();
  }
  if (!json_is_number(value)) {
    return bad_state(key);
  }
  *out = json_number_value(value);
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_rl_state_from_json(
    const json_t* json, pcp_workloads_rl_state_t* out_state) {
  pcp_workloads_rl_state_initialize(0, out_state);
  pcp_workloads_rl_state_t* s = out_state;
  if (!json_is_object(json)) {
    return bad_state("(root)");
  }
  int64_t format = 0;
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "format", 1, &format));
  if (format != 1) {
    return bad_state("format");
  }
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "iteration", 0, &s->iteration));
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "step", 0, &s->step));
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "version", 0, &s->version));
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "seed", 0, &s->seed));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "rollout_tokens", 0, &s->rollout_tokens));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "stale_dropped", 0, &s->stale_dropped));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "degenerate_groups", 0, &s->degenerate_groups));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "truncated_tokens", 0, &s->truncated_tokens));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "skipped_updates", 0, &s->skipped_updates));
  PCP_RETURN_IF_ERROR_BARE(int_read(json, "workers", 0, &s->workers));
  PCP_RETURN_IF_ERROR_BARE(
      real_read(json, "eval_reward_mean", &s->eval_reward_mean));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(json, "checkpoint_iteration", -1, &s->checkpoint_iteration));
  json_t* last = json_object_get(json, "last");
  if (!json_is_object(last)) {
    return bad_state("last");
  }
  pcp_workloads_rl_last_t* l = &s->last;
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "reward_mean", &l->reward_mean));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "reward_std", &l->reward_std));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "kl", &l->kl));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "clip_fraction", &l->clip_fraction));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "mean_ratio", &l->mean_ratio));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "loss", &l->loss));
  PCP_RETURN_IF_ERROR_BARE(real_read(last, "grad_norm", &l->grad_norm));
  PCP_RETURN_IF_ERROR_BARE(
      real_read(last, "tokens_per_second", &l->tokens_per_second));
  PCP_RETURN_IF_ERROR_BARE(
      real_read(last, "weight_refresh_seconds", &l->weight_refresh_seconds));
  PCP_RETURN_IF_ERROR_BARE(
      int_read(last, "weight_refresh_bytes", 0, &l->weight_refresh_bytes));
  json_t* history = json_object_get(json, "history");
  if (!json_is_array(history) ||
      json_array_size(history) > PCP_WORKLOADS_RL_HISTORY_MAX_POINTS) {
    return bad_state("history");
  }
  size_t i;
  json_t* item;
  json_array_foreach(history, i, item) {
    pcp_workloads_rl_point_t p;
    PCP_RETURN_IF_ERROR_BARE(int_read(item, "iteration", 0, &p.iteration));
    PCP_RETURN_IF_ERROR_BARE(real_read(item, "reward_mean", &p.reward_mean));
    PCP_RETURN_IF_ERROR_BARE(real_read(item, "reward_std", &p.reward_std));
    PCP_RETURN_IF_ERROR_BARE(real_read(item, "kl", &p.kl));
    PCP_RETURN_IF_ERROR_BARE(
        real_read(item, "clip_fraction", &p.clip_fraction));
    p.eval_reward_mean = NAN;
    if (json_object_get(item, "eval_reward_mean")) {
      PCP_RETURN_IF_ERROR_BARE(
          real_read(item, "eval_reward_mean", &p.eval_reward_mean));
    }
    s->history[s->history_count++] = p;
  }
  return pcp_ok_status();
}

json_t* pcp_workloads_rl_progress_json(const pcp_workloads_rl_state_t* state,
                                       int64_t num_iterations,
                                       const char* served_model) {
  const pcp_workloads_rl_last_t* l = &state->last;
  double clip = l->clip_fraction;
  json_t* out = json_pack(
      "{s:I, s:I, s:I, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
      "iteration", (json_int_t)state->iteration, "num_iterations",
      (json_int_t)num_iterations, "policy_version", (json_int_t)state->version,
      "served_model", served_model ? served_model : "", "reward_mean",
      number_or_null(l->reward_mean), "reward_std",
      number_or_null(l->reward_std), "kl", number_or_null(l->kl),
      "clip_fraction", number_or_null(clip), "mean_ratio",
      number_or_null(l->mean_ratio), "loss", number_or_null(l->loss),
      "grad_norm", number_or_null(l->grad_norm), "tokens_per_second",
      number_or_null(l->tokens_per_second));
  if (!out) {
    return NULL;
  }
  json_t* more = json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:o, s:o, s:I}", "rollout_tokens",
      (json_int_t)state->rollout_tokens, "stale_dropped",
      (json_int_t)state->stale_dropped, "degenerate_groups",
      (json_int_t)state->degenerate_groups, "truncated_tokens",
      (json_int_t)state->truncated_tokens, "skipped_updates",
      (json_int_t)state->skipped_updates, "weight_refresh_seconds",
      number_or_null(l->weight_refresh_seconds), "weight_refresh_bytes",
      (json_int_t)l->weight_refresh_bytes, "eval_reward_mean",
      number_or_null(state->eval_reward_mean), "checkpoint_iteration",
      state->checkpoint_iteration >= 0
          ? json_integer((json_int_t)state->checkpoint_iteration)
          : json_null(),
      "step", (json_int_t)state->step);
  json_t* history = history_json(state);
  if (!more || !history || json_object_update(out, more) ||
      json_object_set_new(out, "history", history)) {
    json_decref(more);
    json_decref(out);
    return NULL;
  }
  json_decref(more);
  return out;
}

void pcp_workloads_rl_served_name_default(const char* job_id, char* out_name,
                                          size_t capacity) {
  const char* rest = strncmp(job_id, "rl-", 3) == 0 ? job_id + 3 : job_id;
  snprintf(out_name, capacity, "rl-%.8s", rest);
}

//===----------------------------------------------------------------------===//
// Stale rollouts, rows, lengths
//===----------------------------------------------------------------------===//

int64_t pcp_workloads_rl_stale_groups_mark(
    const pcp_workloads_rl_rollout_t* rollouts, size_t count,
    int64_t group_size, int64_t version, int64_t max_off_policy_steps,
    bool* out_keep) {
  int64_t dropped = 0;
  size_t groups = group_size > 0 ? count / (size_t)group_size : 0;
  for (size_t g = 0; g < groups; ++g) {
    bool keep = true;
    for (int64_t i = 0; i < group_size; ++i) {
      int64_t v = rollouts[g * (size_t)group_size + (size_t)i].policy_version;
      if (v < version - max_off_policy_steps || v > version) {
        keep = false;
      }
    }
    out_keep[g] = keep;
    if (!keep) {
      dropped += group_size;
    }
  }
  return dropped;
}

int64_t pcp_workloads_rl_batch_rows(int64_t sequences, int64_t micro_batch,
                                    int64_t accumulation, int64_t workers) {
  int64_t unit = (micro_batch < 1 ? 1 : micro_batch) *
                 (accumulation < 1 ? 1 : accumulation) *
                 (workers < 1 ? 1 : workers);
  int64_t units = (sequences + unit - 1) / unit;
  return (units < 1 ? 1 : units) * unit;
}

pcp_status_t pcp_workloads_rl_length_check(const char* what,
                                           int64_t longest_prompt_tokens,
                                           size_t longest_index,
                                           int64_t rollout_max_tokens,
                                           int64_t block_size) {
  if (longest_prompt_tokens + rollout_max_tokens <= block_size) {
    return pcp_ok_status();
  }
  return pcp_make_status(
      PCP_STATUS_FAILED_PRECONDITION,
      "%s[%zu] is %" PRId64 " tokens; with rollout_max_tokens %" PRId64
      " that exceeds the model's block_size %" PRId64
      " (shorten the prompts, lower rollout_max_tokens or use a model with a "
      "longer block)",
      what, longest_index, longest_prompt_tokens, rollout_max_tokens,
      block_size);
}

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

// Removes directory |path| with the plain files in it (what this file
// writes there; no subdirectories).
static void directory_remove(const char* path) {
  DIR* dir = opendir(path);
  if (dir) {
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL) {
      if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) {
        continue;
      }
      char file[8192];
      snprintf(file, sizeof(file), "%s/%s", path, entry->d_name);
      unlink(file);
    }
    closedir(dir);
  }
  rmdir(path);
}

// "checkpoint-<digits>" exactly: its iteration; -1 otherwise.
static int64_t checkpoint_name_parse(const char* name) {
  static const char kPrefix[] = "checkpoint-";
  if (strncmp(name, kPrefix, sizeof(kPrefix) - 1) != 0) {
    return -1;
  }
  const char* digits = name + sizeof(kPrefix) - 1;
  if (!*digits || strlen(digits) > 18) {
    return -1;
  }
  int64_t value = 0;
  for (const char* p = digits; *p; ++p) {
    if (*p < '0' || *p > '9') {
      return -1;
    }
    value = value * 10 + (*p - '0');
  }
  return value;
}

// Iterations of the complete checkpoints under |root|, descending, at most
// |capacity|; returns how many there are in all.
static size_t checkpoints_list(const char* root, int64_t* out_iterations,
                               size_t capacity) {
  DIR* dir = opendir(root);
  if (!dir) {
    return 0;
  }
  size_t count = 0;
  struct dirent* entry;
  while ((entry = readdir(dir)) != NULL) {
    int64_t iteration = checkpoint_name_parse(entry->d_name);
    if (iteration < 0) {
      continue;
    }
    char state[8192];
    snprintf(state, sizeof(state), "%s/%s/state.json", root, entry->d_name);
    if (!pcp_file_exists(state)) {
      continue;
    }
    // Insertion into the descending top |capacity|.
    size_t kept = count < capacity ? count : capacity;
    size_t at = kept;
    while (at > 0 && out_iterations[at - 1] < iteration) {
      --at;
    }
    if (at < capacity) {
      size_t move = (kept < capacity ? kept : capacity - 1) - at;
      memmove(&out_iterations[at + 1], &out_iterations[at],
              move * sizeof(int64_t));
      out_iterations[at] = iteration;
    }
    ++count;
  }
  closedir(dir);
  return count;
}

bool pcp_workloads_rl_checkpoint_newest(const char* root,
                                        int64_t* out_iteration) {
  int64_t newest = -1;
  if (checkpoints_list(root, &newest, 1) == 0) {
    return false;
  }
  *out_iteration = newest;
  return true;
}

static pcp_status_t tensors_save(const pcp_models_parameter_table_t* table,
                                 const float* const* buffers, const char* dir,
                                 const char* file) {
  char path[8192];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  return pcp_models_safetensors_save(table, (const void* const*)buffers, path);
}

static pcp_status_t state_write(const char* dir,
                                const pcp_workloads_rl_state_t* state) {
  json_t* json = pcp_workloads_rl_state_json(state);
  char* text = json ? json_dumps(json, JSON_COMPACT) : NULL;
  json_decref(json);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "rl state.json");
  }
  char path[8192];
  snprintf(path, sizeof(path), "%s/state.json", dir);
  pcp_status_t status = pcp_file_write_atomic(path, text, strlen(text));
  pcp_libc_free(text);
  return status;
}

pcp_status_t pcp_workloads_rl_checkpoint_write(
    const char* root, const pcp_models_parameter_table_t* table,
    const float* const* params, const float* const* m, const float* const* v,
    const pcp_workloads_rl_state_t* state) {
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(root));
  char final_dir[4400], temp_dir[4500];
  snprintf(final_dir, sizeof(final_dir), "%s/checkpoint-%" PRId64, root,
           state->iteration);
  snprintf(temp_dir, sizeof(temp_dir), "%s.tmp", final_dir);
  // A leftover of a write a crash cut short, or this iteration again (a
  // resumed run repeats nothing before its checkpoint, but be safe).
  directory_remove(temp_dir);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(temp_dir));
  pcp_status_t status =
      tensors_save(table, params, temp_dir, "params.safetensors");
  if (!status) {
    status = tensors_save(table, m, temp_dir, "m.safetensors");
  }
  if (!status) {
    status = tensors_save(table, v, temp_dir, "v.safetensors");
  }
  if (!status) {
    pcp_workloads_rl_state_t* copy = NULL;
    status = pcp_allocator_malloc(pcp_allocator_system(), sizeof(*copy),
                                  (void**)&copy);
    if (!status) {
      *copy = *state;
      copy->checkpoint_iteration = state->iteration;
      status = state_write(temp_dir, copy);
      pcp_allocator_free(pcp_allocator_system(), copy);
    }
  }
  if (!status) {
    directory_remove(final_dir);
    if (rename(temp_dir, final_dir) != 0) {
      status = pcp_status_from_errno(errno, "renaming %s", temp_dir);
    }
  }
  if (status) {
    directory_remove(temp_dir);
    return status;
  }
  int64_t newest[PCP_WORKLOADS_RL_CHECKPOINTS_KEPT + 1];
  size_t count = checkpoints_list(root, newest, PCP_ARRAYSIZE(newest));
  // One old checkpoint goes per write (one is made per write), so the
  // list of the newest kept + 1 names the one to remove.
  if (count > PCP_WORKLOADS_RL_CHECKPOINTS_KEPT) {
    DIR* dir = opendir(root);
    int64_t oldest_kept = newest[PCP_WORKLOADS_RL_CHECKPOINTS_KEPT - 1];
    if (dir) {
      struct dirent* entry;
      while ((entry = readdir(dir)) != NULL) {
        int64_t iteration = checkpoint_name_parse(entry->d_name);
        if (iteration >= 0 && iteration < oldest_kept) {
          char old[8192];
          snprintf(old, sizeof(old), "%s/%s", root, entry->d_name);
          directory_remove(old);
        }
      }
      closedir(dir);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_rl_checkpoint_state_read(
    const char* root, int64_t iteration, pcp_workloads_rl_state_t* out_state) {
  char path[8192];
  snprintf(path, sizeof(path), "%s/checkpoint-%" PRId64 "/state.json", root,
           iteration);
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_read_all(
      path, PCP_WORKLOADS_RL_STATE_MAX_BYTES, &data, &length));
  json_error_t error;
  json_t* json = json_loadb(data, length, 0, &error);
  pcp_allocator_free(pcp_allocator_system(), data);  // pcp_file_read_all
  if (!json) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "%s: line %d: %s", path,
                           error.line, error.text);
  }
  pcp_status_t status = pcp_workloads_rl_state_from_json(json, out_state);
  json_decref(json);
  if (status) {
    return pcp_status_annotate_f(status, "%s", path);
  }
  if (out_state->iteration != iteration) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "%s: iteration %" PRId64 " in checkpoint-%" PRId64,
                           path, out_state->iteration, iteration);
  }
  return pcp_ok_status();
}

static pcp_status_t tensors_load(const pcp_models_parameter_table_t* table,
                                 float* const* buffers, const char* dir,
                                 const char* file) {
  char path[8192];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_safetensors_checkpoint_open(
      path, pcp_allocator_system(), &checkpoint));
  pcp_status_t status = pcp_models_safetensors_load(table, checkpoint, false,
                                                    (void* const*)buffers);
  pcp_safetensors_checkpoint_release(checkpoint);
  return status;
}

pcp_status_t pcp_workloads_rl_checkpoint_read(
    const char* root, int64_t iteration,
    const pcp_models_parameter_table_t* table, float* const* params,
    float* const* m, float* const* v, pcp_workloads_rl_state_t* out_state) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_rl_checkpoint_state_read(root, iteration, out_state));
  char dir[4400];
  snprintf(dir, sizeof(dir), "%s/checkpoint-%" PRId64, root, iteration);
  PCP_RETURN_IF_ERROR_BARE(
      tensors_load(table, params, dir, "params.safetensors"));
  PCP_RETURN_IF_ERROR_BARE(tensors_load(table, m, dir, "m.safetensors"));
  return tensors_load(table, v, dir, "v.safetensors");
}

//===----------------------------------------------------------------------===//
// The served policy directory
//===----------------------------------------------------------------------===//

// "model-<version>.safetensors": its version; -1 otherwise.
static int64_t weights_name_parse(const char* name) {
  static const char kPrefix[] = "model-";
  static const char kSuffix[] = ".safetensors";
  size_t length = strlen(name);
  if (strncmp(name, kPrefix, sizeof(kPrefix) - 1) != 0 ||
      length <= sizeof(kPrefix) - 1 + sizeof(kSuffix) - 1 ||
      strcmp(name + length - (sizeof(kSuffix) - 1), kSuffix) != 0) {
    return -1;
  }
  size_t digits = length - (sizeof(kPrefix) - 1) - (sizeof(kSuffix) - 1);
  if (digits > 18) {
    return -1;
  }
  int64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    char c = name[sizeof(kPrefix) - 1 + i];
    if (c < '0' || c > '9') {
      return -1;
    }
    value = value * 10 + (c - '0');
  }
  return value;
}

static const char* const kTrainingOnlyKeys[] = {"loss", "val_loss"};

pcp_status_t pcp_workloads_rl_policy_export(
    const pcp_workloads_rl_export_t* e,
    const pcp_models_parameter_table_t* table, const float* const* params,
    int64_t* out_bytes) {
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(e->dir));
  char file[64];
  snprintf(file, sizeof(file), "model-%" PRId64 ".safetensors", e->version);
  char path[8192];
  snprintf(path, sizeof(path), "%s/%s", e->dir, file);
  // A new name per version: the service may still be loading the previous
  // one when this is written; model.json names it only once it is whole.
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_safetensors_save(table, (const void* const*)params, path));
  pcp_sha256_t digest;
  uint64_t bytes = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_sha256(path, &digest, &bytes));
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  json_t* model = json_is_object(e->base_model_json)
                      ? json_deep_copy(e->base_model_json)
                      : json_object();
  if (!model) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "model.json");
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kTrainingOnlyKeys); ++i) {
    json_object_del(model, kTrainingOnlyKeys[i]);
  }
  int failed = 0;
  failed |= json_object_set_new(model, "name", json_string(e->name));
  failed |= json_object_set_new(model, "job_id", json_string(e->job_id));
  failed |= json_object_set_new(model, "outer_step",
                                json_integer((json_int_t)e->version));
  failed |= json_object_set_new(model, "weights", json_string(file));
  failed |= json_object_set_new(model, "weights_bytes",
                                json_integer((json_int_t)bytes));
  failed |= json_object_set_new(model, "weights_sha256", json_string(hex));
  failed |= json_object_set_new(model, "dtype", json_string("f32"));
  failed |= json_object_set_new(model, "max_length",
                                json_integer((json_int_t)e->max_length));
  if (e->worker_class && e->worker_class[0]) {
    failed |= json_object_set_new(model, "worker_class",
                                  json_string(e->worker_class));
  }
  char* text = failed ? NULL : json_dumps(model, JSON_INDENT(2));
  json_decref(model);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "model.json");
  }
  snprintf(path, sizeof(path), "%s/model.json", e->dir);
  pcp_status_t status = pcp_file_write_atomic(path, text, strlen(text));
  pcp_libc_free(text);
  PCP_RETURN_IF_ERROR_BARE(status);
  if (out_bytes) {
    *out_bytes = (int64_t)bytes;
  }
  // Older weight files: no model.json names them any more. So are the
  // temp files of saves a SIGKILL cut short (pcp_safetensors_write's
  // "<name>.tmp.<pid>"; only this job writes here): each a weights file's
  // size, left for good otherwise.
  DIR* dir = opendir(e->dir);
  if (dir) {
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL) {
      int64_t version = weights_name_parse(entry->d_name);
      if (version < 0) {
        const char* temp = strstr(entry->d_name, ".safetensors.tmp.");
        char name[256];
        if (temp && (size_t)(temp - entry->d_name) + 12 < sizeof(name)) {
          snprintf(name, sizeof(name), "%.*s", (int)(temp - entry->d_name) + 12,
                   entry->d_name);
          version = weights_name_parse(name) >= 0 ? INT64_MAX : -1;
        }
      }
      if (version >= 0 &&
          (version <= e->version - PCP_WORKLOADS_RL_SERVED_WEIGHTS_KEPT ||
           version > e->version)) {
        snprintf(path, sizeof(path), "%s/%s", e->dir, entry->d_name);
        unlink(path);
      }
    }
    closedir(dir);
  }
  return pcp_ok_status();
}
