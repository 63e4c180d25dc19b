// SPDX-License-Identifier: Apache-2.0
//
// The merge oracle (reference s.3.3 oracles, decoupled_merge): given the
// fragment updates a window received, which of them take part, what a
// correct merge outputs, and whether a claimed output is acceptable. It is
// the referee the decoupled and RDA models are checked against. Its RDA
// formula (pcp_topology_rda_merge, protocol_stubs.c, in double) is written
// apart from the library merge the models publish (decoupled_model.c runs
// pcp_decoupled_merge_tensor), and it shares none of the window logic, so a
// bug in one is not silently repeated in the other.

#include <math.h>
#include <string.h>

#include "topology/protocols_impl.h"

static const char* const kMergeViolationNames[] = {
    "none",
    "below_quorum",
    "duplicate_update",
    "outside_envelope",
    "average_mismatch",
    "rda_norm_mismatch",
    "rda_direction_mismatch",
    "incompatible_local_views",
};

const char* pcp_topology_merge_violation_name(
    pcp_topology_merge_violation_t violation) {
  if ((unsigned)violation >= PCP_ARRAYSIZE(kMergeViolationNames))
    return "?";
  return kMergeViolationNames[violation];
}

static double vector_norm(const double* v, size_t dimension) {
  double sum = 0.0;
  for (size_t i = 0; i < dimension; ++i) sum += v[i] * v[i];
  return sqrt(sum);
}

pcp_status_t pcp_topology_merge_oracle_run(
    pcp_topology_merge_kind_t kind, uint32_t window_step, uint32_t quorum,
    const pcp_topology_merge_update_t* updates, size_t count, size_t dimension,
    pcp_topology_merge_result_t* out) {
  memset(out, 0, sizeof(*out));
  if (dimension == 0 || dimension > PCP_TOPOLOGY_RDA_MAX_DIMENSION ||
      count > PCP_TOPOLOGY_MERGE_MAX_UPDATES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "merge oracle takes 1..%u dimensions and at most "
                           "%u updates",
                           PCP_TOPOLOGY_RDA_MAX_DIMENSION,
                           PCP_TOPOLOGY_MERGE_MAX_UPDATES);
  }
  out->dimension = dimension;
  pcp_topology_rda_update_t included[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
  for (size_t i = 0; i < count; ++i) {
    const pcp_topology_merge_update_t* u = &updates[i];
    // Late updates (past the grace window) and updates for another step do
    // not take part; they are not errors.
    if (u->late || u->step != window_step) {
      out->non_participants++;
      continue;
    }
    for (size_t k = 0; k < out->participants; ++k) {
      if (out->participant_learners[k] == u->learner) {
        out->violation = PCP_TOPOLOGY_MERGE_VIOLATION_DUPLICATE_UPDATE;
        return pcp_ok_status();
      }
    }
    out->participant_learners[out->participants] = u->learner;
    included[out->participants].values = u->values;
    included[out->participants].tokens = u->tokens;
    included[out->participants].steps = u->steps;
    out->participants++;
  }
  if (out->participants < quorum) {
    out->violation = PCP_TOPOLOGY_MERGE_VIOLATION_BELOW_QUORUM;
    return pcp_ok_status();
  }
  for (size_t i = 0; i < dimension; ++i) {
    out->envelope_min[i] = INFINITY;
    out->envelope_max[i] = -INFINITY;
  }
  double norm_sum = 0.0;
  for (size_t k = 0; k < out->participants; ++k) {
    double w =
        pcp_topology_token_step_weight(included[k].tokens, included[k].steps);
    out->total_weight += w;
    double n = vector_norm(included[k].values, dimension);
    norm_sum += w * n;
    if (n > 0.0)
      out->direction_weight += w;
    for (size_t i = 0; i < dimension; ++i) {
      double x = included[k].values[i];
      if (x < out->envelope_min[i])
        out->envelope_min[i] = x;
      if (x > out->envelope_max[i])
        out->envelope_max[i] = x;
    }
  }
  out->mean_norm = out->total_weight > 0.0 ? norm_sum / out->total_weight : 0.0;
  switch (kind) {
    case PCP_TOPOLOGY_MERGE_DIRECT_AVERAGE:
      pcp_topology_direct_average(included, out->participants, dimension,
                                  out->output);
      break;
    case PCP_TOPOLOGY_MERGE_TOKEN_WEIGHTED:
      for (size_t i = 0; i < dimension; ++i) {
        double sum = 0.0;
        for (size_t k = 0; k < out->participants; ++k) {
          sum += pcp_topology_token_step_weight(included[k].tokens,
                                                included[k].steps) *
                 included[k].values[i];
        }
        out->output[i] = out->total_weight > 0.0 ? sum / out->total_weight : 0;
      }
      break;
    case PCP_TOPOLOGY_MERGE_RDA:
      (void)pcp_topology_rda_merge(included, out->participants, dimension,
                                   out->output);
      break;
  }
  out->output_norm = vector_norm(out->output, dimension);
  return pcp_ok_status();
}

#define CLAIM_TOLERANCE 1e-9

pcp_topology_merge_violation_t pcp_topology_merge_oracle_check_claim(
    pcp_topology_merge_kind_t kind, const pcp_topology_merge_result_t* merge,
    const double* claimed) {
  if (merge->violation != PCP_TOPOLOGY_MERGE_VIOLATION_NONE) {
    return merge->violation;
  }
  size_t d = merge->dimension;
  if (kind != PCP_TOPOLOGY_MERGE_RDA) {
    // Averages stay inside the coordinate envelope of their inputs.
    for (size_t i = 0; i < d; ++i) {
      if (claimed[i] < merge->envelope_min[i] - CLAIM_TOLERANCE ||
          claimed[i] > merge->envelope_max[i] + CLAIM_TOLERANCE) {
        return PCP_TOPOLOGY_MERGE_VIOLATION_OUTSIDE_ENVELOPE;
      }
    }
    for (size_t i = 0; i < d; ++i) {
      if (fabs(claimed[i] - merge->output[i]) > CLAIM_TOLERANCE) {
        return PCP_TOPOLOGY_MERGE_VIOLATION_AVERAGE_MISMATCH;
      }
    }
    return PCP_TOPOLOGY_MERGE_VIOLATION_NONE;
  }
  // RDA may leave the envelope; it must carry the weighted mean norm along
  // the merged direction. A cancelling direction allows only zero.
  double claimed_norm = vector_norm(claimed, d);
  if (merge->output_norm <= CLAIM_TOLERANCE) {
    return claimed_norm <= CLAIM_TOLERANCE
               ? PCP_TOPOLOGY_MERGE_VIOLATION_NONE
               : PCP_TOPOLOGY_MERGE_VIOLATION_RDA_DIRECTION_MISMATCH;
  }
  if (fabs(claimed_norm - merge->output_norm) > 1e-6 * merge->output_norm) {
    return PCP_TOPOLOGY_MERGE_VIOLATION_RDA_NORM_MISMATCH;
  }
  for (size_t i = 0; i < d; ++i) {
    if (fabs(claimed[i] / claimed_norm -
             merge->output[i] / merge->output_norm) > 1e-6) {
      return PCP_TOPOLOGY_MERGE_VIOLATION_RDA_DIRECTION_MISMATCH;
    }
  }
  return PCP_TOPOLOGY_MERGE_VIOLATION_NONE;
}

pcp_topology_merge_violation_t pcp_topology_merge_local_views_check(
    const pcp_topology_merge_update_t* updates, size_t count) {
  // Same local view => same decision: learners that saw the same thing must
  // not end in different merge decisions.
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = i + 1; j < count; ++j) {
      if (updates[i].view == updates[j].view &&
          updates[i].decision != updates[j].decision) {
        return PCP_TOPOLOGY_MERGE_VIOLATION_INCOMPATIBLE_LOCAL_VIEWS;
      }
    }
  }
  return PCP_TOPOLOGY_MERGE_VIOLATION_NONE;
}
