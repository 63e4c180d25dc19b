// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: fragment plans and the syncer schedule (reference
// s.1.3). See decoupled.h.

#include <stdlib.h>
#include <string.h>

#include "workloads/train/decoupled.h"

//===----------------------------------------------------------------------===//
// Fragment plans
//===----------------------------------------------------------------------===//

static void plan_free_arrays(pcp_decoupled_plan_t* plan) {
  pcp_allocator_t a = plan->allocator;
  if (plan->fragments != NULL) {
    for (uint32_t f = 0; f < plan->fragment_count; ++f) {
      pcp_allocator_free(a, plan->fragments[f].tensor_indices);
      pcp_allocator_free(a, plan->fragments[f].offset_bytes);
    }
  }
  pcp_allocator_free(a, plan->fragments);
  pcp_allocator_free(a, plan->tensor_fragment);
  pcp_allocator_free(a, plan->tensor_values);
  pcp_allocator_free(a, plan->tensor_value_offset);
  pcp_allocator_free(a, plan->tensor_role);
}

void pcp_decoupled_plan_deinitialize(pcp_decoupled_plan_t* plan) {
  if (plan == NULL)
    return;
  plan_free_arrays(plan);
  memset(plan, 0, sizeof(*plan));
}

static pcp_status_t zalloc(pcp_allocator_t a, size_t count, size_t size,
                           void** out) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "decoupled: %zu x %zu bytes overflows", count, size);
  }
  return pcp_allocator_calloc(a, bytes == 0 ? 1 : bytes, out);
}

// Sort key of balanced_tensor: bytes descending, then index ascending.
typedef struct by_bytes_t {
  uint64_t bytes;
  uint32_t index;
} by_bytes_t;

static int by_bytes_compare(const void* pa, const void* pb) {
  const by_bytes_t* a = pa;
  const by_bytes_t* b = pb;
  if (a->bytes != b->bytes)
    return a->bytes > b->bytes ? -1 : 1;
  return a->index < b->index ? -1 : (a->index > b->index ? 1 : 0);
}

static const char* strategy_name(int32_t strategy) {
  return strategy == PCP_DECOUPLED_FRAGMENTS_STRIDED ? "strided"
                                                     : "balanced_tensor";
}

pcp_status_t pcp_decoupled_plan_initialize(
    pcp_allocator_t allocator, pcp_decoupled_fragment_strategy_t strategy,
    const pcp_decoupled_tensor_spec_t* tensors, uint32_t tensor_count,
    const uint32_t* embedding_indices, uint32_t embedding_count,
    uint32_t fragments, uint32_t sync_interval_h,
    pcp_decoupled_plan_t* out_plan) {
  memset(out_plan, 0, sizeof(*out_plan));
  if (strategy != PCP_DECOUPLED_FRAGMENTS_STRIDED &&
      strategy != PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment_strategy %d: want strided or "
                           "balanced_tensor",
                           (int)strategy);
  }
  if (fragments == 0 || fragments > PCP_DECOUPLED_MAX_FRAGMENTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "num_fragments %u: must be in [1, %u]", fragments,
                           PCP_DECOUPLED_MAX_FRAGMENTS);
  }
  if (sync_interval_h == 0 ||
      sync_interval_h > PCP_DECOUPLED_MAX_SYNCER_STEPS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "sync_interval_h %u: must be in [1, %u]",
                           sync_interval_h, PCP_DECOUPLED_MAX_SYNCER_STEPS);
  }
  if (fragments > sync_interval_h) {
    // Offsets are id mod H: fragments with id >= H would share a step with
    // a lower one and never be scheduled.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "num_fragments %u > sync_interval_h %u: fragment "
                           "%u would never be scheduled (rule: P <= H)",
                           fragments, sync_interval_h, sync_interval_h);
  }
  if (tensor_count == 0 || tensor_count > PCP_DECOUPLED_MAX_TENSORS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "parameter table of %u tensors: must be in [1, %u]",
                           tensor_count, PCP_DECOUPLED_MAX_TENSORS);
  }
  if (fragments > tensor_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "num_fragments %u > %u tensors: a fragment would be "
                           "empty (rule: every fragment holds a tensor)",
                           fragments, tensor_count);
  }
  for (uint32_t i = 0; i < tensor_count; ++i) {
    const char* name = tensors[i].name ? tensors[i].name : "?";
    if (tensors[i].value_count == 0 ||
        tensors[i].value_count > (UINT64_MAX / 4) / PCP_DECOUPLED_MAX_TENSORS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "tensor %u '%s': %llu values (rule: every tensor "
                             "holds at least one value, within the limit)",
                             i, name,
                             (unsigned long long)tensors[i].value_count);
    }
    if (tensors[i].role < PCP_DECOUPLED_ROLE_UNKNOWN ||
        tensors[i].role > PCP_DECOUPLED_ROLE_TRANSFORMER) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "tensor %u '%s': unknown role %d", i, name,
                             (int)tensors[i].role);
    }
  }
  for (uint32_t e = 0; e < embedding_count; ++e) {
    if (embedding_indices[e] >= tensor_count) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "embedding_tensor_indices[%u] = %u: the model "
                             "has %u tensors",
                             e, embedding_indices[e], tensor_count);
    }
  }

  pcp_decoupled_plan_t plan;
  memset(&plan, 0, sizeof(plan));
  plan.allocator = allocator;
  plan.strategy = (int32_t)strategy;
  plan.fragment_count = fragments;
  plan.sync_interval_h = sync_interval_h;
  plan.tensor_count = tensor_count;
  by_bytes_t* order = NULL;
  uint32_t* fill = NULL;
  pcp_status_t status = pcp_ok_status();
#define TRY(expr)       \
  do {                  \
    status = (expr);    \
    if (status != NULL) \
      goto done;        \
  } while (0)
  TRY(zalloc(allocator, fragments, sizeof(*plan.fragments),
             (void**)&plan.fragments));
  TRY(zalloc(allocator, tensor_count, sizeof(uint32_t),
             (void**)&plan.tensor_fragment));
  TRY(zalloc(allocator, tensor_count, sizeof(uint64_t),
             (void**)&plan.tensor_values));
  TRY(zalloc(allocator, tensor_count, sizeof(uint64_t),
             (void**)&plan.tensor_value_offset));
  TRY(zalloc(allocator, tensor_count, sizeof(int32_t),
             (void**)&plan.tensor_role));
  TRY(zalloc(allocator, fragments, sizeof(uint32_t), (void**)&fill));

  uint64_t offset = 0;
  for (uint32_t i = 0; i < tensor_count; ++i) {
    plan.tensor_values[i] = tensors[i].value_count;
    plan.tensor_value_offset[i] = offset;
    offset += tensors[i].value_count;
    plan.tensor_role[i] = tensors[i].role;
    uint64_t bytes = tensors[i].value_count * 4u;
    if (bytes > plan.max_tensor_bytes)
      plan.max_tensor_bytes = bytes;
  }
  for (uint32_t e = 0; e < embedding_count; ++e) {
    plan.tensor_role[embedding_indices[e]] = PCP_DECOUPLED_ROLE_EMBEDDING;
  }

  for (uint32_t f = 0; f < fragments; ++f) {
    plan.fragments[f].id = f;
    plan.fragments[f].offset = f % sync_interval_h;
  }
  if (strategy == PCP_DECOUPLED_FRAGMENTS_STRIDED) {
    for (uint32_t i = 0; i < tensor_count; ++i) {
      plan.tensor_fragment[i] = i % fragments;
    }
  } else {
    TRY(zalloc(allocator, tensor_count, sizeof(*order), (void**)&order));
    for (uint32_t i = 0; i < tensor_count; ++i) {
      order[i].bytes = tensors[i].value_count * 4u;
      order[i].index = i;
    }
    qsort(order, tensor_count, sizeof(*order), by_bytes_compare);
    for (uint32_t k = 0; k < tensor_count; ++k) {
      uint32_t best = 0;
      for (uint32_t f = 1; f < fragments; ++f) {
        // Strictly smaller: ties keep the lowest fragment id.
        if (plan.fragments[f].byte_count < plan.fragments[best].byte_count) {
          best = f;
        }
      }
      plan.tensor_fragment[order[k].index] = best;
      plan.fragments[best].byte_count += order[k].bytes;
    }
  }
  for (uint32_t f = 0; f < fragments; ++f) plan.fragments[f].byte_count = 0;
  for (uint32_t i = 0; i < tensor_count; ++i) {
    plan.fragments[plan.tensor_fragment[i]].tensor_count++;
  }
  for (uint32_t f = 0; f < fragments; ++f) {
    uint32_t n = plan.fragments[f].tensor_count;
    TRY(zalloc(allocator, n, sizeof(uint32_t),
               (void**)&plan.fragments[f].tensor_indices));
    TRY(zalloc(allocator, n, sizeof(uint64_t),
               (void**)&plan.fragments[f].offset_bytes));
  }
  // Walking tensors in index order lists each fragment's tensors ascending.
  for (uint32_t i = 0; i < tensor_count; ++i) {
    pcp_decoupled_fragment_t* fr = &plan.fragments[plan.tensor_fragment[i]];
    uint32_t k = fill[fr->id]++;
    fr->tensor_indices[k] = i;
    fr->offset_bytes[k] = fr->byte_count;
    fr->byte_count += tensors[i].value_count * 4u;
    fr->value_count += tensors[i].value_count;
  }
  TRY(pcp_decoupled_plan_check(&plan));
#undef TRY
done:
  pcp_allocator_free(allocator, order);
  pcp_allocator_free(allocator, fill);
  if (status != NULL) {
    plan_free_arrays(&plan);
    return pcp_status_annotate_f(status, "%s fragment plan, P=%u H=%u",
                                 strategy_name((int32_t)strategy), fragments,
                                 sync_interval_h);
  }
  *out_plan = plan;
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_plan_check(const pcp_decoupled_plan_t* plan) {
  if (plan->fragment_count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment plan: P = 0 (rule: P > 0)");
  }
  if (plan->sync_interval_h == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment plan: H = 0 (rule: H > 0)");
  }
  uint32_t n = plan->tensor_count;
  pcp_status_t status = pcp_ok_status();
  uint32_t* seen = NULL;
  PCP_RETURN_IF_ERROR(
      zalloc(plan->allocator, n, sizeof(uint32_t), (void**)&seen),
      "fragment plan check");
  uint64_t max_bytes = 0;
  uint64_t min_bytes = UINT64_MAX;
  for (uint32_t f = 0; f < plan->fragment_count && status == NULL; ++f) {
    const pcp_decoupled_fragment_t* fr = &plan->fragments[f];
    if (fr->id != f || fr->offset != f % plan->sync_interval_h) {
      status = pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "fragment plan: fragment %u has id %u offset %u (rule: id = "
          "position, offset = id mod H = %u)",
          f, fr->id, fr->offset, f % plan->sync_interval_h);
      break;
    }
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < fr->tensor_count; ++k) {
      uint32_t t = fr->tensor_indices[k];
      if (t >= n) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "fragment plan: fragment %u lists tensor %u "
                                 "of %u (rule: indices in range)",
                                 f, t, n);
        break;
      }
      if (seen[t] != 0) {
        status = pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "fragment plan: tensor %u is in fragment %u and fragment %u "
            "(rule: every tensor in exactly one fragment, no duplicate index)",
            t, seen[t] - 1, f);
        break;
      }
      seen[t] = f + 1;
      if (plan->tensor_fragment[t] != f) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "fragment plan: tensor %u is listed in "
                                 "fragment %u but mapped to %u",
                                 t, f, plan->tensor_fragment[t]);
        break;
      }
      if (k > 0 && fr->tensor_indices[k - 1] >= t) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "fragment plan: fragment %u lists tensor %u "
                                 "after %u (rule: ascending indices)",
                                 f, t, fr->tensor_indices[k - 1]);
        break;
      }
      if (fr->offset_bytes[k] != bytes) {
        status = pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "fragment plan: fragment %u tensor %u at byte %llu, want %llu "
            "(rule: cumulative offsets)",
            f, t, (unsigned long long)fr->offset_bytes[k],
            (unsigned long long)bytes);
        break;
      }
      bytes += plan->tensor_values[t] * 4u;
    }
    if (status != NULL)
      break;
    if (bytes != fr->byte_count) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "fragment plan: fragment %u says %llu bytes, "
                               "its tensors hold %llu",
                               f, (unsigned long long)fr->byte_count,
                               (unsigned long long)bytes);
      break;
    }
    if (bytes > max_bytes)
      max_bytes = bytes;
    if (bytes < min_bytes)
      min_bytes = bytes;
  }
  for (uint32_t t = 0; t < n && status == NULL; ++t) {
    if (seen[t] == 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "fragment plan: tensor %u is in no fragment "
                               "(rule: every tensor in exactly one fragment)",
                               t);
    }
  }
  if (status == NULL &&
      plan->strategy == PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR &&
      max_bytes - min_bytes > plan->max_tensor_bytes) {
    // Greedy to the least loaded fragment: when the fullest fragment got
    // its last tensor it was the least loaded, so it ends at most one
    // tensor above any other.
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "fragment plan: balanced_tensor sizes %llu..%llu bytes differ by more "
        "than the largest tensor (%llu bytes) (rule: balance bound)",
        (unsigned long long)min_bytes, (unsigned long long)max_bytes,
        (unsigned long long)plan->max_tensor_bytes);
  }
  pcp_allocator_free(plan->allocator, seen);
  return status;
}

static pcp_status_t copy_fragment(const pcp_decoupled_plan_t* plan,
                                  uint32_t fragment_id, const float* from,
                                  float* to, bool gather) {
  if (fragment_id >= plan->fragment_count) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "fragment %u of %u",
                           fragment_id, plan->fragment_count);
  }
  const pcp_decoupled_fragment_t* fr = &plan->fragments[fragment_id];
  for (uint32_t k = 0; k < fr->tensor_count; ++k) {
    uint32_t t = fr->tensor_indices[k];
    size_t values = (size_t)plan->tensor_values[t];
    size_t in_fragment = (size_t)(fr->offset_bytes[k] / 4u);
    size_t in_params = (size_t)plan->tensor_value_offset[t];
    if (gather) {
      memcpy(to + in_fragment, from + in_params, values * sizeof(float));
    } else {
      memcpy(to + in_params, from + in_fragment, values * sizeof(float));
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_plan_gather(const pcp_decoupled_plan_t* plan,
                                       uint32_t fragment_id,
                                       const float* params, float* out_values) {
  return copy_fragment(plan, fragment_id, params, out_values, true);
}

pcp_status_t pcp_decoupled_plan_scatter(const pcp_decoupled_plan_t* plan,
                                        uint32_t fragment_id,
                                        const float* values,
                                        float* inout_params) {
  return copy_fragment(plan, fragment_id, values, inout_params, false);
}

//===----------------------------------------------------------------------===//
// Schedule
//===----------------------------------------------------------------------===//

pcp_status_t pcp_decoupled_schedule_check(
    const pcp_decoupled_schedule_t* schedule) {
  if (schedule->fragment_count == 0 ||
      schedule->fragment_count > PCP_DECOUPLED_MAX_FRAGMENTS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "num_fragments %u: must be in [1, %u]",
        schedule->fragment_count, PCP_DECOUPLED_MAX_FRAGMENTS);
  }
  if (schedule->sync_interval_h == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "sync_interval_h 0: must be >= 1");
  }
  if (schedule->fragment_count > schedule->sync_interval_h) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "num_fragments %u > sync_interval_h %u (rule: "
                           "P <= H, or fragments >= H never sync)",
                           schedule->fragment_count, schedule->sync_interval_h);
  }
  if (schedule->overlap_tau == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "overlap_tau 0: must be >= 1");
  }
  return pcp_ok_status();
}

bool pcp_decoupled_schedule_fragment_at(
    const pcp_decoupled_schedule_t* schedule, uint64_t syncer_step,
    uint32_t* out_fragment_id) {
  if (schedule->sync_interval_h == 0)
    return false;
  uint64_t residue = syncer_step % schedule->sync_interval_h;
  // Offsets are id mod H and P <= H, so the fragment with offset r is r.
  if (residue >= schedule->fragment_count)
    return false;
  *out_fragment_id = (uint32_t)residue;
  return true;
}

uint64_t pcp_decoupled_schedule_apply_deadline(
    const pcp_decoupled_schedule_t* schedule, uint64_t syncer_step) {
  return syncer_step + schedule->overlap_tau;
}

uint64_t pcp_decoupled_schedule_last_step(
    const pcp_decoupled_schedule_t* schedule, uint64_t local_steps,
    bool final_sync, uint32_t* out_final_rounds) {
  uint32_t rounds = 0;
  uint64_t last = local_steps;
  uint64_t h = schedule->sync_interval_h;
  if (final_sync && h > 0) {
    // Fragment f (offset f, P <= H) is next scheduled at S + j with
    // j = (f - S) mod H in [0, H); j = 0 is the fragment synced at S.
    uint64_t residue = local_steps % h;
    for (uint32_t f = 0; f < schedule->fragment_count && f < h; ++f) {
      uint64_t j = ((uint64_t)f + h - residue) % h;
      if (j == 0) {
        continue;
      }
      ++rounds;
      if (local_steps + j > last) {
        last = local_steps + j;
      }
    }
  }
  if (out_final_rounds) {
    *out_final_rounds = rounds;
  }
  return last;
}
