// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: the experiment keys of the decoupled_diloco block
// (reference s.1.3 defaults and validation, s.1.6 keys). See decoupled.h.

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "config/config.h"
#include "workloads/train/decoupled.h"

static const char* const kMerges[] = {"weighted_average", "rda",
                                      "avg_embedding_rda_model",
                                      "rda_embedding_avg_model", NULL};
static const char* const kFragments[] = {"strided", "balanced_tensor", NULL};
static const char* const kCompressions[] = {"none", "int4", NULL};
static const char* const kInt4Down[] = {"auto", "on", "off", NULL};
static const char* const kSeededInit[] = {"auto", "off", NULL};

#define T pcp_decoupled_config_t
static const pcp_config_field_t kFields[] = {
    {.name = "num_fragments",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, num_fragments),
     .default_value = "24",
     .min = 1,
     .max = PCP_DECOUPLED_MAX_FRAGMENTS,
     .help = "P: parameter fragments"},
    {.name = "sync_interval_h",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, sync_interval_h),
     .default_value = "0",
     .min = 0,
     .max = PCP_DECOUPLED_MAX_SYNCER_STEPS,
     .help = "H: syncer steps between two syncs of a fragment (0: tau)"},
    {.name = "overlap_tau",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, overlap_tau),
     .default_value = "2",
     .min = 1,
     .max = 1e9,
     .help = "learner steps a sync may take before its fragment is due"},
    {.name = "min_quorum",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, min_quorum),
     .default_value = "1",
     .min = 1,
     .max = PCP_DECOUPLED_MAX_LEARNERS,
     .help = "learners a fragment sync waits for (at most the workers)"},
    {.name = "grace_window_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, grace_window_ms),
     .default_value = "0",
     .min = 0,
     .max = 3600000,
     .help = "fixed wait after the quorum for late learners"},
    {.name = "grace_gamma",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, grace_gamma),
     .default_value = "1.0",
     .min = 0,
     .max = 1e6,
     .help = "adaptive grace: share of the slack spent waiting"},
    {.name = "max_grace_steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, max_grace_steps),
     .default_value = "1",
     .min = 1,
     .max = 1e6,
     .help = "adaptive grace cap, in learner step times"},
    {.name = "adaptive_grace_enabled",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(T, adaptive_grace_enabled),
     .default_value = "false",
     .help = "grace from the timing EMAs instead of grace_window_ms"},
    {.name = "timing_ema_alpha",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, timing_ema_alpha),
     .default_value = "0.125",
     .min = 0,
     .max = 1,
     .help = "weight of a new sample in the timing EMAs, in (0, 1]"},
    {.name = "merge_strategy",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, merge_strategy),
     .default_value = "avg_embedding_rda_model",
     .enum_values = kMerges,
     .help = "how learners' outer gradients are merged"},
    {.name = "fragment_strategy",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, fragment_strategy),
     .default_value = "balanced_tensor",
     .enum_values = kFragments,
     .help = "how tensors are split into fragments"},
    {.name = "learner_alpha",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, learner_alpha),
     .default_value = "0.0",
     .min = 0,
     .max = 1,
     .help = "blend: local = alpha*local + (1-alpha)*global"},
    {.name = "outer_learning_rate",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, outer_learning_rate),
     .default_value = "0.7",
     .min = 0,
     .max = 1e3,
     .help = "outer Nesterov learning rate"},
    {.name = "outer_gradient_compression",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, outer_gradient_compression),
     .default_value = "none",
     .enum_values = kCompressions,
     .help = "none or int4 (per-block scales) on the wire"},
    {.name = "int4_block_size",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, int4_block_size),
     .default_value = "64",
     .min = 1,
     .max = PCP_DECOUPLED_INT4_MAX_BLOCK,
     .help = "values per int4 scale"},
    {.name = "max_recovery_syncer_steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, max_recovery_syncer_steps),
     .default_value = "24",
     .min = 0,
     .max = PCP_DECOUPLED_MAX_SYNCER_STEPS,
     .help = "steps a restarted syncer may take to catch up"},
    {.name = "int4_down",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, int4_down),
     .default_value = "auto",
     .enum_values = kInt4Down,
     .help = "int4 on the down path (merged fragments to the learners, "
             "error feedback): auto follows outer_gradient_compression"},
    {.name = "steps_per_task",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, steps_per_task),
     .default_value = "1",
     .min = 1,
     .max = PCP_DECOUPLED_MAX_STEPS_PER_TASK,
     .help = "local steps a learner runs per task (fewer tasks and bytes; "
             "one more program to compile)"},
    {.name = "seeded_init",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, seeded_init),
     .default_value = "auto",
     .enum_values = kSeededInit,
     .help = "a fresh start's learners draw the seeded initial parameters "
             "themselves instead of receiving them (off: always values)"},
    {.name = "final_sync",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(T, final_sync),
     .default_value = "true",
     .help = "after the last local step, one more round for every fragment "
             "synced last before it (the exported model holds every step)"},
};
#undef T

static pcp_status_t validate_decoupled(const void* config) {
  const pcp_decoupled_config_t* c = config;
  if (!(c->timing_ema_alpha > 0.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled_diloco: key 'timing_ema_alpha': must be "
                           "in (0, 1]");
  }
  if (!isfinite(c->grace_gamma)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled_diloco: key 'grace_gamma': must be "
                           "finite");
  }
  if (c->sync_interval_h != 0 && c->num_fragments > c->sync_interval_h) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled_diloco: key 'num_fragments': %lld > "
                           "sync_interval_h %lld (rule: P <= H, or fragments "
                           ">= H never sync)",
                           (long long)c->num_fragments,
                           (long long)c->sync_interval_h);
  }
  return pcp_ok_status();
}

static const pcp_config_table_t kTable = {
    "decoupled_diloco", kFields, PCP_ARRAYSIZE(kFields), validate_decoupled};

const pcp_config_table_t* pcp_decoupled_config_table(void) {
  return &kTable;
}

pcp_status_t pcp_decoupled_config_parse_json(
    const char* text, size_t byte_length, pcp_decoupled_config_t* out_config,
    pcp_string_list_t* out_unknown_keys) {
  memset(out_config, 0, sizeof(*out_config));
  pcp_status_t status = pcp_config_initialize(&kTable, out_config);
  if (status == NULL) {
    status = pcp_config_parse_json(&kTable, text, byte_length, out_config,
                                   out_unknown_keys);
  }
  if (status == NULL)
    status = pcp_config_validate(&kTable, out_config);
  if (status == NULL)
    out_config->present = true;
  if (status != NULL)
    pcp_config_deinitialize(&kTable, out_config);
  return status;
}

pcp_status_t pcp_decoupled_config_resolve(
    const pcp_decoupled_config_t* config, uint32_t workers, uint64_t tau,
    pcp_decoupled_schedule_t* out_schedule,
    pcp_decoupled_grace_config_t* out_grace) {
  uint64_t h =
      config->sync_interval_h > 0 ? (uint64_t)config->sync_interval_h : tau;
  if (h == 0 || h > PCP_DECOUPLED_MAX_SYNCER_STEPS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "decoupled_diloco: sync interval %llu (from %s): "
        "must be in [1, %u]",
        (unsigned long long)h,
        config->sync_interval_h > 0 ? "sync_interval_h" : "tau",
        PCP_DECOUPLED_MAX_SYNCER_STEPS);
  }
  if (workers == 0 || (uint64_t)config->min_quorum > workers) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled_diloco: key 'min_quorum': %lld with %u "
                           "worker(s) (rule: 1 <= min_quorum <= workers)",
                           (long long)config->min_quorum, workers);
  }
  pcp_decoupled_schedule_t schedule = {(uint32_t)config->num_fragments,
                                       (uint32_t)h,
                                       (uint32_t)config->overlap_tau};
  PCP_RETURN_IF_ERROR(pcp_decoupled_schedule_check(&schedule),
                      "decoupled_diloco");
  pcp_decoupled_grace_config_t grace = {(uint64_t)config->grace_window_ms,
                                        config->adaptive_grace_enabled,
                                        config->grace_gamma,
                                        (uint32_t)config->max_grace_steps,
                                        (uint32_t)config->overlap_tau,
                                        config->timing_ema_alpha};
  PCP_RETURN_IF_ERROR(pcp_decoupled_grace_config_check(&grace),
                      "decoupled_diloco");
  if (out_schedule)
    *out_schedule = schedule;
  if (out_grace)
    *out_grace = grace;
  return pcp_ok_status();
}

void pcp_decoupled_config_deinitialize(pcp_decoupled_config_t* config) {
  pcp_config_deinitialize(&kTable, config);
}
