// SPDX-License-Identifier: Apache-2.0
//
// Decoupled DiLoCo in the training service (issue 17 Deliver 1; reference
// s.1.3), selected by `"aggregation_strategy": "decoupled_diloco"` with an
// optional `"decoupled_diloco": {...}` block (decoupled.h's keys). The
// protocol's decisions are decoupled.h's (plan, schedule, round machine,
// merges, outer Nesterov, learner counters, clocks, tape); this file is the
// I/O around them:
//   * learners are the connected workers, each with resident state in one
//     fabric session (p<i>, m<i>, v<i> and s<i>, the global values it last
//     received), driven by a per-learner loop: each learner's next task is
//     submitted as soon as its previous one ends, so a slow learner does not
//     stall the others;
//   * the fastest learner's local step is the syncer's clock: when one
//     reaches step t, the fragment scheduled at syncer step t is pulled from
//     every live learner, each answering at its next task boundary (@delta:
//     s - p, f32 or int4 on the wire) and training on; a learner may start
//     step t only once every round s with s + overlap_tau < t has closed
//     (the overlap budget);
//   * the gateway is the syncer: one round machine per syncer step (quorum,
//     grace or adaptive grace), the merge over the selected learners, outer
//     Nesterov on the fragment, the sync on the tape; every live learner
//     then blends the merged fragment in before its next step (@mix).
// Single-threaded: the job's thread polls its learners' tasks.

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workloads/train/service_impl.h"

#define DEC_MAX_OPEN 32
// Fragments of a decoupled job (one compiled module each).
#define DEC_MAX_FRAGMENTS 64
// Tensors of one fragment: a task frame carries at most 64 sections (the
// fabric's max_sections); @mix carries alpha and the fragment.
#define DEC_MAX_FRAGMENT_TENSORS 60
#define DEC_POLL_NS 2000000
// A round that reaches no quorum in this time is skipped (upstream's
// collection limit).
#define DEC_COLLECTION_TIMEOUT_MS 30000
// A resumed job waits this long for the checkpoint's live learners to
// reconnect before it starts with those back (later ones join).
#define DEC_RESUME_WAIT_MS 20000

enum {
  TASK_NONE = 0,
  TASK_INIT = 1,
  TASK_STEP = 2,
  TASK_DELTA = 3,
  TASK_MIX = 4,
  TASK_VERIFY = 5,
  // A @mix again with alpha 0 and the f32 values, after a hash mismatch
  // (on_param_mismatch "resync").
  TASK_RESYNC = 6,
};

// A learner's sampler cursor before it drew the batches of local step
// |step| + 1 (finding 5: a checkpoint stores the one of the syncer step it
// resumes at, not the one the learner ran ahead to).
typedef struct dec_cursor_at_t {
  uint64_t step;
  bool used;
  pcp_data_cursor_t cursor;
} dec_cursor_at_t;

// At most this many cursors per learner: overlap_tau + steps_per_task + 3
// is enough (a learner runs at most overlap_tau steps past the last closed
// round, plus the steps of the task in flight); a larger overlap_tau falls
// back to the current cursor for the ones out of reach (logged).
#define DEC_CURSOR_RING_MAX 4096

typedef struct dec_learner_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[PCP_STORE_ID_MAX_LENGTH + 48];
  bool alive;
  pcp_data_sampler_t* sampler;
  int32_t* tokens;
  int64_t* tokens64;
  pcp_fabric_task_t* task;
  int task_kind;
  uint32_t task_fragment;
  uint64_t task_step;  // syncer step of a delta / mix task
  uint32_t init_next;  // fragments initialized so far
  uint64_t step;       // completed local steps
  // AdamW's t (bias corrections) is the steps since its moments were last
  // reset, not the global step: @init zeroes m and v (joins, rejoins,
  // resume), dec_learner_admit resets this to 0 with them. |step| drives
  // the lr schedule and the overlap budget only.
  uint64_t adam_step;
  float step_value;  // borrowed by the step task
  // The step task's local steps (1 or steps_per_task) and one learning
  // rate per step (borrowed by it).
  uint32_t task_steps;
  float lr[PCP_DECOUPLED_MAX_STEPS_PER_TASK];
  float alpha;
  float last_loss;
  pcp_decoupled_learner_t counters;
  bool counters_ready;
  float* base;     // parameter vector: the global values it last received
  float* mix_buf;  // the fragment a @mix task carries (borrowed by it)
  uint64_t sends[DEC_MAX_OPEN];  // syncer steps whose delta is due
  uint32_t send_count;
  // Fragments to blend in, one entry per fragment (a newer sync of a
  // pending one replaces its step: @mix sends the current values anyway).
  uint32_t apply_fragment[DEC_MAX_FRAGMENTS];
  uint64_t apply_step[DEC_MAX_FRAGMENTS];
  uint32_t apply_count;
  int64_t ready_ns;  // test delay hook: no step before this time
  int64_t task_started_ns;
  // int4 verification: the decoded int4 delta awaiting the f32 one.
  float* verify_values;
  bool verify_pending;
  bool verify_done;  // one verification per learner
  uint32_t verify_fragment;
  uint64_t verify_step;
  // Joins and resume ("Joins" and "Checkpoints and resume" below).
  uint32_t join_count;  // the fabric's join_count of the admitted connection
  bool joining;         // admitted mid-run, its @init (full resync) not done
  bool joined;          // a slot a join made: samples the whole train split
  uint64_t first_pull;  // first syncer step it is pulled for (0: any)
  bool has_cursor;      // sampler cursor restored from a checkpoint
  bool was_alive;       // alive in the checkpoint a resume started from
  pcp_data_cursor_t cursor;
  dec_cursor_at_t* cursor_ring;  // cursor_ring_size entries, by step
  uint32_t cursor_ring_size;
  // Bit-identity (issue 17 Deliver 3). The next task submitted hashes its
  // first |hash_inputs| inputs (0: none); |hash_want| is the gateway's
  // SHA-256 of the same bytes, compared when the task ends.
  uint32_t hash_inputs;
  uint8_t hash_want[PCP_SHA256_BYTE_LENGTH];
  // @mix_int4 also hashes its first |hash_outputs| outputs, the g it keeps
  // as s (TASK_ASSIGN hash_outputs); |hash_out_want| is the gateway's B.
  // |task_hash_outputs|: the task out asked for it.
  uint32_t hash_outputs;
  bool task_hash_outputs;
  uint8_t hash_out_want[PCP_SHA256_BYTE_LENGTH];
  bool resync_pending;
  bool init_mismatch;  // its last @init's hash mismatched (sent again)
  bool task_seeded;    // the @init out carries seeded-init refs, no values
  // A seeded @init of it was refused, failed or hashed differently: its
  // remaining @init tasks carry values (dec_seeded_fallback).
  bool seeded_off;
  uint32_t resync_fragment;
  uint64_t resync_step;
  // int4 down path: per fragment, the version of the broadcast copy B it
  // holds (0: not known to be any, it gets B in f32 next); the version its
  // @mix out sets; the int4 payload that task carries (borrowed by it).
  uint64_t* bcast_version;
  uint64_t task_bcast_version;
  uint8_t* mix_q;
} dec_learner_t;

typedef struct dec_round_t {
  bool used;
  bool opened;
  bool final;
  uint64_t step;
  uint32_t fragment;
  uint64_t grace_ms;
  int64_t opened_ns;
  pcp_decoupled_round_t machine;
  float* values;  // per learner: its fragment values (base - delta)
  bool has[MAX_ROUND_WORKERS];
  uint64_t tokens_since[MAX_ROUND_WORKERS];
  uint64_t steps_since[MAX_ROUND_WORKERS];
  uint64_t learner_step[MAX_ROUND_WORKERS];
  uint64_t up_bytes;
  uint32_t values_slots;  // learners |values| has room for
} dec_round_t;

typedef struct dec_t {
  job_t* job;
  pcp_decoupled_config_t config;
  pcp_decoupled_schedule_t schedule;
  pcp_decoupled_grace_t grace;
  pcp_decoupled_plan_t plan;
  bool plan_ready;
  pcp_decoupled_nesterov_t nesterov;
  bool nesterov_ready;
  pcp_decoupled_syncer_state_t* state;
  pcp_decoupled_tape_t tape;
  bool int4;
  bool verify_int4;
  uint32_t block;
  uint8_t train_hash[PCP_SHA256_BYTE_LENGTH];
  // steps_per_task > 1: the K-step @train_steps (train_hash runs 1 step).
  uint32_t steps_per_task;
  uint8_t train_fused_hash[PCP_SHA256_BYTE_LENGTH];
  uint64_t step_tasks;  // @train_steps tasks submitted (this gateway run)
  uint8_t (*fragment_hash)[PCP_SHA256_BYTE_LENGTH];
  dec_learner_t learners[MAX_ROUND_WORKERS];
  uint32_t learner_count;
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  char (*names)[24];
  dec_round_t* rounds;   // DEC_MAX_OPEN slots
  uint64_t total_steps;  // S: local steps per learner
  // The syncer's last step: S, or with final_sync the last virtual step
  // past S that gives a fragment its final round (decoupled.h
  // pcp_decoupled_schedule_last_step); they open once a learner reached S.
  uint64_t sync_end;
  uint32_t final_rounds;    // scheduled rounds in S+1..sync_end
  uint64_t next_final;      // the next syncer step to finalize
  uint64_t opened_through;  // syncer steps pulled so far
  uint64_t scheduled;       // scheduled rounds in 1..sync_end
  uint64_t syncs;
  uint64_t skipped_rounds;
  uint64_t dropped_pulls;  // pulls answered after their round closed
  uint64_t tokens_computed;
  double tokens_merged;
  uint64_t up_bytes_total;
  uint64_t down_bytes_total;
  double int4_max_error;
  double int4_max_ratio;  // max |err| / (scale / 2) over verified deltas
  uint64_t int4_verified;
  size_t frag_max;  // values of the largest fragment
  float* grad;      // fragment buffer: merged outer gradient
  float* before;    // fragment buffer: global before the merge
  int64_t delay_ms;
  uint32_t delay_learner;
  uint64_t delay_until;
  uint64_t lose_pull_step;  // test hook (PCP_DECOUPLED_TEST_LOSE_PULL)
  char tape_path[1200];
  uint64_t tape_written;  // records of d->tape in tape_path (0: none yet)
  int64_t last_event_ns;
  uint64_t last_event_tokens;
  // Joins and resume.
  uint64_t nonce;        // session names of this gateway run
  uint64_t admissions;   // sessions opened (unique session names)
  uint32_t shard_count;  // learners at the start: the shard plan's size
  uint64_t joins;        // learners admitted mid-run
  bool full_logged;      // "no learner slot left" said once
  int64_t last_join_poll_ns;
  pcp_fabric_worker_info_t* infos;  // MAX_ROUND_WORKERS, for join polls
  uint64_t last_checkpoint_step;    // outer step of the newest checkpoint
  bool resumed;                     // started from a decoupled checkpoint
  uint64_t resumed_at;              // its syncer step
  bool resume_replay_ok;            // its tape replayed to its state
  // Bit-identity: @mix tasks re-sent after a mismatch.
  uint64_t resyncs;
  // Seeded init (key seeded_init): an @init whose fragment still holds
  // exactly pcp_models_parameters_initialize(job seed) goes down as "init"
  // refs (the worker fills the values itself) instead of 4 bytes a value.
  // |seeded_inits|: fragments sent so; |seeded_fallbacks|: of those, the
  // ones whose hash mismatched and were sent again with values.
  bool seeded_init;
  uint64_t seeded_inits;
  uint64_t seeded_fallbacks;
  // Per fragment, whether its values equal the seeded fill (0 not known
  // yet, 1 yes, 2 no), kept while no round has merged (syncs == 0): the
  // values every starting learner is sent are the same then, so the
  // gateway fills each fragment once, not once per learner.
  uint8_t seeded_verdict[DEC_MAX_FRAGMENTS];
  // int4 down path: the broadcast copy B (a parameter vector; every live
  // learner holds its fragments exactly), per fragment its version (1 at
  // start, +1 per sync) and the latest payload q = int4(G - B) that moved
  // B from the previous version (at down_q_offset[f], down_q_size[f]
  // bytes); G - B stays on the gateway and goes into the next sync of the
  // fragment (error feedback).
  bool int4_down;
  float* bcast;
  uint64_t* bcast_version;
  uint8_t* down_q;
  size_t* down_q_offset;
  size_t* down_q_size;
  size_t down_q_max;    // bytes of the largest fragment's payload
  float* down_scratch;  // fragment buffer: G - B, then decode(q)
  uint64_t down_int4_sends;
  uint64_t down_f32_sends;
  double int4_down_max_ratio;  // max |G - B| / (scale / 2) after a sync
} dec_t;

// Whether learner |l| is pulled for syncer step |step|: alive, and for a
// learner that joined mid-run, synced and admitted before that step opened.
static bool dec_pulled(const dec_learner_t* l, uint64_t step) {
  return l->alive && !l->joining && step >= l->first_pull;
}

static void dec_join_ready(dec_t* d, uint32_t li);

// Whether a live learner still owes syncer step |step| its delta: the pull
// queued, or its @delta in flight. A round opens at its first delta, so a
// scheduled step that nobody owes any more (every learner pulled for it
// lost, joiners and rejoiners pulled only from later steps) would never
// open and never close: the finalize loop skips it instead (finding 2).
static bool dec_step_awaited(const dec_t* d, uint64_t step) {
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    const dec_learner_t* l = &d->learners[k];
    if (!l->alive) {
      continue;
    }
    if (l->task && l->task_kind == TASK_DELTA && l->task_step == step) {
      return true;
    }
    for (uint32_t i = 0; i < l->send_count; ++i) {
      if (l->sends[i] == step) {
        return true;
      }
    }
  }
  return false;
}

static const char* dec_name(dec_t* d, char kind, size_t tensor) {
  size_t slot = kind == 'p' ? 0 : kind == 'm' ? 1 : kind == 'v' ? 2 : 3;
  return d->names[4 * tensor + slot];
}

//===----------------------------------------------------------------------===//
// The fragment module (StableHLO text)
//===----------------------------------------------------------------------===//

static void dec_type(const pcp_models_parameter_t* p, const char* element,
                     char* out, size_t capacity) {
  int used = snprintf(out, capacity, "tensor<");
  for (int32_t d = 0; d < p->rank; ++d) {
    used += snprintf(out + used, capacity - (size_t)used, "%lldx",
                     (long long)p->dims[d]);
  }
  snprintf(out + used, capacity - (size_t)used, "%s>", element);
}

// Appends "PREFIX<i>: TYPE, ..." (args) or "TYPE, ..." (types) for every
// tensor of |fragment|, |groups| times with prefixes |prefix|.
static pcp_status_t dec_list(pcp_string_builder_t* b,
                             const pcp_models_parameter_table_t* table,
                             const pcp_decoupled_fragment_t* f, bool args,
                             bool names_only, const char* const* prefix,
                             const char* const* element, int groups,
                             bool* first) {
  char t[128];
  for (int g = 0; g < groups; ++g) {
    for (uint32_t k = 0; k < f->tensor_count; ++k) {
      uint32_t i = f->tensor_indices[k];
      dec_type(&table->parameters[i], element[g], t, sizeof(t));
      const char* sep = *first ? "" : ", ";
      *first = false;
      pcp_status_t status;
      if (names_only) {
        status = pcp_string_builder_append_f(b, "%s%%%s%u", sep, prefix[g], i);
      } else if (args) {
        status = pcp_string_builder_append_f(b, "%s%%%s%u: %s", sep, prefix[g],
                                             i, t);
      } else {
        status = pcp_string_builder_append_f(b, "%s%s", sep, t);
      }
      PCP_RETURN_IF_ERROR_BARE(status);
    }
  }
  return pcp_ok_status();
}

// The result types of @delta (f32, the parameter's shape) or @delta_int4
// (the codec's bytes as ui8: pcp_decoupled_int4_encoded_size, so the program
// and the gateway's decoder agree on the layout), comma-separated.
static pcp_status_t dec_delta_types(pcp_string_builder_t* b,
                                    const pcp_models_parameter_table_t* table,
                                    const pcp_decoupled_fragment_t* f,
                                    bool int4, uint32_t block) {
  char t[256];
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    const pcp_models_parameter_t* p = &table->parameters[f->tensor_indices[k]];
    if (int4) {
      size_t bytes =
          pcp_decoupled_int4_encoded_size((size_t)p->element_count, block);
      if (bytes == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: %lld values do not fit the int4 codec "
                               "(block %u)",
                               p->name, (long long)p->element_count, block);
      }
      snprintf(t, sizeof(t), "tensor<%zuxui8>", bytes);
    } else {
      dec_type(p, "f32", t, sizeof(t));
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(b, "%s%s", k ? ", " : "", t));
  }
  return pcp_ok_status();
}

// The int4 packing of one tensor's delta %d<i> (|n| f32 values) into
// %q<i>: tensor<(4*nb + ceil(n/2)) x ui8>, decoupled.h's layout exactly
// (nb f32 LE scales, then two codes per byte, element j in byte j/2, low
// nibble when j is even). Per block of |bs|: m = max|x|, s = m/7 rounded
// up to a multiple of 8 in its bit pattern (the low 3 mantissa bits clear,
// so q*s is exact and s >= m/7), 0 for a zero block; q = round(x/s) (ties
// to even) clamped to [-7, 7], stored as q + 8.
static pcp_status_t dec_int4_append(pcp_string_builder_t* b,
                                    const pcp_models_parameter_t* p, uint32_t i,
                                    uint32_t bs) {
  uint64_t n = (uint64_t)p->element_count;
  uint64_t nb = (n + bs - 1) / bs;
  uint64_t np = nb * bs;
  uint64_t nc = (n + 1) / 2;
  char t[128];
  dec_type(p, "f32", t, sizeof(t));
#define L(...) \
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, __VA_ARGS__))
  L("    %%qf_%u = stablehlo.reshape %%d%u : (%s) -> tensor<%" PRIu64 "xf32>\n",
    i, i, t, n);
  if (np != n) {
    L("    %%qz_%u = stablehlo.constant dense<0.000000e+00> : tensor<%" PRIu64
      "xf32>\n",
      i, np - n);
    L("    %%qp_%u = stablehlo.concatenate %%qf_%u, %%qz_%u, dim = 0 : "
      "(tensor<%" PRIu64 "xf32>, tensor<%" PRIu64 "xf32>) -> tensor<%" PRIu64
      "xf32>\n",
      i, i, i, n, np - n, np);
  } else {
    L("    %%qp_%u = stablehlo.reshape %%qf_%u : (tensor<%" PRIu64
      "xf32>) -> tensor<%" PRIu64 "xf32>\n",
      i, i, n, np);
  }
  L("    %%qb_%u = stablehlo.reshape %%qp_%u : (tensor<%" PRIu64
    "xf32>) -> tensor<%" PRIu64 "x%uxf32>\n",
    i, i, np, nb, bs);
  L("    %%qa_%u = stablehlo.abs %%qb_%u : tensor<%" PRIu64 "x%uxf32>\n", i, i,
    nb, bs);
  L("    %%qzero_%u = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n",
    i);
  L("    %%qm_%u = stablehlo.reduce(%%qa_%u init: %%qzero_%u) applies "
    "stablehlo.maximum across dimensions = [1] : (tensor<%" PRIu64
    "x%uxf32>, tensor<f32>) -> tensor<%" PRIu64 "xf32>\n",
    i, i, i, nb, bs, nb);
  char v[64];
  snprintf(v, sizeof(v), "tensor<%" PRIu64 "xf32>", nb);
  char vi[64];
  snprintf(vi, sizeof(vi), "tensor<%" PRIu64 "xi32>", nb);
  char vb[64];
  snprintf(vb, sizeof(vb), "tensor<%" PRIu64 "xi1>", nb);
  L("    %%qseven_%u = stablehlo.constant dense<7.000000e+00> : %s\n", i, v);
  L("    %%qs0_%u = stablehlo.divide %%qm_%u, %%qseven_%u : %s\n", i, i, i, v);
  L("    %%qbits_%u = stablehlo.bitcast_convert %%qs0_%u : (%s) -> %s\n", i, i,
    v, vi);
  // +8 then clear the low 3 bits: a multiple of 8 strictly above the
  // rounded quotient's pattern, so s >= m/7 however m/7 was rounded.
  L("    %%qeight_%u = stablehlo.constant dense<8> : %s\n", i, vi);
  L("    %%qmask_%u = stablehlo.constant dense<-8> : %s\n", i, vi);
  L("    %%qb1_%u = stablehlo.add %%qbits_%u, %%qeight_%u : %s\n", i, i, i, vi);
  L("    %%qb2_%u = stablehlo.and %%qb1_%u, %%qmask_%u : %s\n", i, i, i, vi);
  L("    %%qsu_%u = stablehlo.bitcast_convert %%qb2_%u : (%s) -> %s\n", i, i,
    vi, v);
  L("    %%qzv_%u = stablehlo.constant dense<0.000000e+00> : %s\n", i, v);
  L("    %%qone_%u = stablehlo.constant dense<1.000000e+00> : %s\n", i, v);
  L("    %%qpos_%u = stablehlo.compare GT, %%qm_%u, %%qzv_%u : (%s, %s) -> "
    "%s\n",
    i, i, i, v, v, vb);
  L("    %%qsc_%u = stablehlo.select %%qpos_%u, %%qsu_%u, %%qzv_%u : %s, %s\n",
    i, i, i, i, vb, v);
  L("    %%qdv_%u = stablehlo.select %%qpos_%u, %%qsu_%u, %%qone_%u : %s, %s\n",
    i, i, i, i, vb, v);
  char m2[64];
  snprintf(m2, sizeof(m2), "tensor<%" PRIu64 "x%uxf32>", nb, bs);
  char m2i[64];
  snprintf(m2i, sizeof(m2i), "tensor<%" PRIu64 "x%uxi32>", nb, bs);
  L("    %%qdb_%u = stablehlo.broadcast_in_dim %%qdv_%u, dims = [0] : (%s) -> "
    "%s\n",
    i, i, v, m2);
  L("    %%qx_%u = stablehlo.divide %%qb_%u, %%qdb_%u : %s\n", i, i, i, m2);
  L("    %%qr_%u = stablehlo.round_nearest_even %%qx_%u : %s\n", i, i, m2);
  L("    %%qlo_%u = stablehlo.constant dense<-7.000000e+00> : %s\n", i, m2);
  L("    %%qhi_%u = stablehlo.constant dense<7.000000e+00> : %s\n", i, m2);
  L("    %%qc_%u = stablehlo.clamp %%qlo_%u, %%qr_%u, %%qhi_%u : %s\n", i, i, i,
    i, m2);
  L("    %%qi_%u = stablehlo.convert %%qc_%u : (%s) -> %s\n", i, i, m2, m2i);
  L("    %%qe8_%u = stablehlo.constant dense<8> : %s\n", i, m2i);
  L("    %%qn_%u = stablehlo.add %%qi_%u, %%qe8_%u : %s\n", i, i, i, m2i);
  uint64_t half = np / 2;
  L("    %%qpair_%u = stablehlo.reshape %%qn_%u : (%s) -> tensor<%" PRIu64
    "x2xi32>\n",
    i, i, m2i, half);
  for (int h = 0; h < 2; ++h) {
    L("    %%qh%d_%u = \"stablehlo.slice\"(%%qpair_%u) {start_indices = "
      "array<i64: 0, %d>, limit_indices = array<i64: %" PRIu64
      ", %d>, strides = array<i64: 1, 1>} : (tensor<%" PRIu64
      "x2xi32>) -> tensor<%" PRIu64 "x1xi32>\n",
      h, i, i, h, half, h + 1, half, half);
    L("    %%qhr%d_%u = stablehlo.reshape %%qh%d_%u : (tensor<%" PRIu64
      "x1xi32>) -> tensor<%" PRIu64 "xi32>\n",
      h, i, h, i, half, half);
  }
  L("    %%qfour_%u = stablehlo.constant dense<4> : tensor<%" PRIu64 "xi32>\n",
    i, half);
  L("    %%qhs_%u = stablehlo.shift_left %%qhr1_%u, %%qfour_%u : "
    "tensor<%" PRIu64 "xi32>\n",
    i, i, i, half);
  L("    %%qby_%u = stablehlo.or %%qhr0_%u, %%qhs_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, half);
  if (nc != half) {
    L("    %%qbc_%u = \"stablehlo.slice\"(%%qby_%u) {start_indices = "
      "array<i64: 0>, limit_indices = array<i64: %" PRIu64
      ">, strides = array<i64: 1>} : (tensor<%" PRIu64
      "xi32>) -> tensor<%" PRIu64 "xi32>\n",
      i, i, nc, half, nc);
  } else {
    L("    %%qbc_%u = stablehlo.reshape %%qby_%u : (tensor<%" PRIu64
      "xi32>) -> tensor<%" PRIu64 "xi32>\n",
      i, i, half, nc);
  }
  // The scales' bytes, little-endian: byte k of the pattern is
  // (bits >> 8k) & 255.
  L("    %%qsb_%u = stablehlo.bitcast_convert %%qsc_%u : (%s) -> %s\n", i, i, v,
    vi);
  L("    %%q255_%u = stablehlo.constant dense<255> : %s\n", i, vi);
  for (int k = 0; k < 4; ++k) {
    L("    %%qk%d_%u = stablehlo.constant dense<%d> : %s\n", k, i, 8 * k, vi);
    L("    %%qsr%d_%u = stablehlo.shift_right_logical %%qsb_%u, %%qk%d_%u : "
      "%s\n",
      k, i, i, k, i, vi);
    L("    %%qsa%d_%u = stablehlo.and %%qsr%d_%u, %%q255_%u : %s\n", k, i, k, i,
      i, vi);
    L("    %%qsx%d_%u = stablehlo.reshape %%qsa%d_%u : (%s) -> tensor<%" PRIu64
      "x1xi32>\n",
      k, i, k, i, vi, nb);
  }
  L("    %%qs4_%u = stablehlo.concatenate %%qsx0_%u, %%qsx1_%u, %%qsx2_%u, "
    "%%qsx3_%u, dim = 1 : (tensor<%" PRIu64 "x1xi32>, tensor<%" PRIu64
    "x1xi32>, tensor<%" PRIu64 "x1xi32>, tensor<%" PRIu64
    "x1xi32>) -> tensor<%" PRIu64 "x4xi32>\n",
    i, i, i, i, i, nb, nb, nb, nb, nb);
  L("    %%qsf_%u = stablehlo.reshape %%qs4_%u : (tensor<%" PRIu64
    "x4xi32>) -> tensor<%" PRIu64 "xi32>\n",
    i, i, nb, 4 * nb);
  L("    %%qall_%u = stablehlo.concatenate %%qsf_%u, %%qbc_%u, dim = 0 : "
    "(tensor<%" PRIu64 "xi32>, tensor<%" PRIu64 "xi32>) -> tensor<%" PRIu64
    "xi32>\n",
    i, i, i, 4 * nb, nc, 4 * nb + nc);
  L("    %%q%u = stablehlo.convert %%qall_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "xui8>\n",
    i, i, 4 * nb + nc, 4 * nb + nc);
#undef L
  return pcp_ok_status();
}

// The int4 decoding of %q<i> (decoupled.h's layout, |bs| values per
// block) into %ud<i>, the parameter's shape: scale bytes reassembled
// little-endian and bitcast, codes unpacked (low nibble first), value =
// f32(code - 8) * scale. The product is exact in f32 (the scale's low 3
// mantissa bits are zero), so this equals pcp_decoupled_int4_decode bit for
// bit; the validity checks stay on the gateway, which wrote the payload.
static pcp_status_t dec_int4_decode_append(pcp_string_builder_t* b,
                                           const pcp_models_parameter_t* p,
                                           uint32_t i, uint32_t bs) {
  uint64_t n = (uint64_t)p->element_count;
  uint64_t nb = (n + bs - 1) / bs;
  uint64_t np = nb * bs;
  uint64_t nc = (n + 1) / 2;
  uint64_t total = 4 * nb + nc;
  char t[128];
  dec_type(p, "f32", t, sizeof(t));
#define L(...) \
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, __VA_ARGS__))
  L("    %%ui_%u = stablehlo.convert %%q%u : (tensor<%" PRIu64
    "xui8>) -> tensor<%" PRIu64 "xi32>\n",
    i, i, total, total);
  L("    %%usb_%u = \"stablehlo.slice\"(%%ui_%u) {start_indices = "
    "array<i64: 0>, limit_indices = array<i64: %" PRIu64
    ">, strides = array<i64: 1>} : (tensor<%" PRIu64 "xi32>) -> tensor<%" PRIu64
    "xi32>\n",
    i, i, 4 * nb, total, 4 * nb);
  L("    %%us4_%u = stablehlo.reshape %%usb_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "x4xi32>\n",
    i, i, 4 * nb, nb);
  for (int k = 0; k < 4; ++k) {
    L("    %%uc%d_%u = \"stablehlo.slice\"(%%us4_%u) {start_indices = "
      "array<i64: 0, %d>, limit_indices = array<i64: %" PRIu64
      ", %d>, strides = array<i64: 1, 1>} : (tensor<%" PRIu64
      "x4xi32>) -> tensor<%" PRIu64 "x1xi32>\n",
      k, i, i, k, nb, k + 1, nb, nb);
    L("    %%ucr%d_%u = stablehlo.reshape %%uc%d_%u : (tensor<%" PRIu64
      "x1xi32>) -> tensor<%" PRIu64 "xi32>\n",
      k, i, k, i, nb, nb);
    L("    %%uk%d_%u = stablehlo.constant dense<%d> : tensor<%" PRIu64
      "xi32>\n",
      k, i, 8 * k, nb);
    L("    %%ush%d_%u = stablehlo.shift_left %%ucr%d_%u, %%uk%d_%u : "
      "tensor<%" PRIu64 "xi32>\n",
      k, i, k, i, k, i, nb);
  }
  L("    %%uo1_%u = stablehlo.or %%ush0_%u, %%ush1_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, nb);
  L("    %%uo2_%u = stablehlo.or %%uo1_%u, %%ush2_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, nb);
  L("    %%uo3_%u = stablehlo.or %%uo2_%u, %%ush3_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, nb);
  L("    %%uscale_%u = stablehlo.bitcast_convert %%uo3_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "xf32>\n",
    i, i, nb, nb);
  L("    %%ucd_%u = \"stablehlo.slice\"(%%ui_%u) {start_indices = "
    "array<i64: %" PRIu64 ">, limit_indices = array<i64: %" PRIu64
    ">, strides = array<i64: 1>} : (tensor<%" PRIu64 "xi32>) -> tensor<%" PRIu64
    "xi32>\n",
    i, i, 4 * nb, total, total, nc);
  L("    %%u15_%u = stablehlo.constant dense<15> : tensor<%" PRIu64 "xi32>\n",
    i, nc);
  L("    %%ufour_%u = stablehlo.constant dense<4> : tensor<%" PRIu64 "xi32>\n",
    i, nc);
  L("    %%ulo_%u = stablehlo.and %%ucd_%u, %%u15_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, nc);
  L("    %%uhs_%u = stablehlo.shift_right_logical %%ucd_%u, %%ufour_%u : "
    "tensor<%" PRIu64 "xi32>\n",
    i, i, i, nc);
  L("    %%uhi_%u = stablehlo.and %%uhs_%u, %%u15_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, nc);
  L("    %%ulo2_%u = stablehlo.reshape %%ulo_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "x1xi32>\n",
    i, i, nc, nc);
  L("    %%uhi2_%u = stablehlo.reshape %%uhi_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "x1xi32>\n",
    i, i, nc, nc);
  L("    %%upair_%u = stablehlo.concatenate %%ulo2_%u, %%uhi2_%u, dim = 1 : "
    "(tensor<%" PRIu64 "x1xi32>, tensor<%" PRIu64 "x1xi32>) -> tensor<%" PRIu64
    "x2xi32>\n",
    i, i, i, nc, nc, nc);
  L("    %%uall_%u = stablehlo.reshape %%upair_%u : (tensor<%" PRIu64
    "x2xi32>) -> tensor<%" PRIu64 "xi32>\n",
    i, i, nc, 2 * nc);
  // Exactly n codes, then code 8 (value 0) up to whole blocks.
  if (2 * nc != n) {
    L("    %%un_%u = \"stablehlo.slice\"(%%uall_%u) {start_indices = "
      "array<i64: 0>, limit_indices = array<i64: %" PRIu64
      ">, strides = array<i64: 1>} : (tensor<%" PRIu64
      "xi32>) -> tensor<%" PRIu64 "xi32>\n",
      i, i, n, 2 * nc, n);
  } else {
    L("    %%un_%u = stablehlo.reshape %%uall_%u : (tensor<%" PRIu64
      "xi32>) -> tensor<%" PRIu64 "xi32>\n",
      i, i, n, n);
  }
  if (np != n) {
    L("    %%upz_%u = stablehlo.constant dense<8> : tensor<%" PRIu64 "xi32>\n",
      i, np - n);
    L("    %%unp_%u = stablehlo.concatenate %%un_%u, %%upz_%u, dim = 0 : "
      "(tensor<%" PRIu64 "xi32>, tensor<%" PRIu64 "xi32>) -> tensor<%" PRIu64
      "xi32>\n",
      i, i, i, n, np - n, np);
  } else {
    L("    %%unp_%u = stablehlo.reshape %%un_%u : (tensor<%" PRIu64
      "xi32>) -> tensor<%" PRIu64 "xi32>\n",
      i, i, n, np);
  }
  L("    %%ue8_%u = stablehlo.constant dense<8> : tensor<%" PRIu64 "xi32>\n", i,
    np);
  L("    %%uq_%u = stablehlo.subtract %%unp_%u, %%ue8_%u : tensor<%" PRIu64
    "xi32>\n",
    i, i, i, np);
  L("    %%uqf_%u = stablehlo.convert %%uq_%u : (tensor<%" PRIu64
    "xi32>) -> tensor<%" PRIu64 "xf32>\n",
    i, i, np, np);
  L("    %%uqb_%u = stablehlo.reshape %%uqf_%u : (tensor<%" PRIu64
    "xf32>) -> tensor<%" PRIu64 "x%uxf32>\n",
    i, i, np, nb, bs);
  L("    %%usbc_%u = stablehlo.broadcast_in_dim %%uscale_%u, dims = [0] : "
    "(tensor<%" PRIu64 "xf32>) -> tensor<%" PRIu64 "x%uxf32>\n",
    i, i, nb, nb, bs);
  L("    %%uv_%u = stablehlo.multiply %%uqb_%u, %%usbc_%u : tensor<%" PRIu64
    "x%uxf32>\n",
    i, i, i, nb, bs);
  L("    %%uvf_%u = stablehlo.reshape %%uv_%u : (tensor<%" PRIu64
    "x%uxf32>) -> tensor<%" PRIu64 "xf32>\n",
    i, i, nb, bs, np);
  if (np != n) {
    L("    %%uvn_%u = \"stablehlo.slice\"(%%uvf_%u) {start_indices = "
      "array<i64: 0>, limit_indices = array<i64: %" PRIu64
      ">, strides = array<i64: 1>} : (tensor<%" PRIu64
      "xf32>) -> tensor<%" PRIu64 "xf32>\n",
      i, i, n, np, n);
  } else {
    L("    %%uvn_%u = stablehlo.reshape %%uvf_%u : (tensor<%" PRIu64
      "xf32>) -> tensor<%" PRIu64 "xf32>\n",
      i, i, np, n);
  }
  L("    %%ud%u = stablehlo.reshape %%uvn_%u : (tensor<%" PRIu64
    "xf32>) -> %s\n",
    i, i, n, t);
#undef L
  return pcp_ok_status();
}

// @init(p...) -> (p..., 0..., 0..., p...); @delta(s..., c...) -> (s - c...)
// in f32; with int4 also @delta_int4(s..., c...) -> (packed bytes...);
// @mix(g..., alpha, l...) -> (alpha*l + (1-alpha)*g..., g...): the blend
// becomes the local values and the global values the new base s; with
// int4_down also @mix_int4(s..., q..., alpha, l...), g = s + decode(q).
pcp_status_t pcp_decoupled_fragment_module_emit(
    const pcp_models_parameter_table_t* table, const pcp_decoupled_plan_t* plan,
    uint32_t fragment, bool int4, bool int4_down, uint32_t block,
    pcp_string_builder_t* b) {
  if (fragment >= plan->fragment_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "fragment %u of %u",
                           fragment, plan->fragment_count);
  }
  const pcp_decoupled_fragment_t* f = &plan->fragments[fragment];
  const char* const f32[] = {"f32", "f32", "f32", "f32"};
  char t[128];
  bool first;
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "module {\n"));
  // @init
  const char* const p1[] = {"p"};
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "  func.func @init("));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(
      dec_list(b, table, f, true, false, p1, f32, 1, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(
      dec_list(b, table, f, false, false, p1, f32, 4, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") {\n"));
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    dec_type(&table->parameters[i], "f32", t, sizeof(t));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%z%u = stablehlo.constant dense<0.000000e+00> : %s\n", i, t));
  }
  const char* const init_out[] = {"p", "z", "z", "p"};
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "    return "));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(
      dec_list(b, table, f, false, true, init_out, f32, 4, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(
      dec_list(b, table, f, false, false, init_out, f32, 4, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n  }\n"));
  // @delta and @delta_int4
  const char* const sc[] = {"s", "c"};
  for (int variant = 0; variant < (int4 ? 2 : 1); ++variant) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "  func.func @%s(", variant ? "delta_int4" : "delta"));
    first = true;
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, true, false, sc, f32, 2, &first));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
    PCP_RETURN_IF_ERROR_BARE(dec_delta_types(b, table, f, variant, block));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") {\n"));
    for (uint32_t k = 0; k < f->tensor_count; ++k) {
      uint32_t i = f->tensor_indices[k];
      const pcp_models_parameter_t* p = &table->parameters[i];
      dec_type(p, "f32", t, sizeof(t));
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "    %%d%u = stablehlo.subtract %%s%u, %%c%u : %s\n", i, i, i, t));
      if (variant) {
        PCP_RETURN_IF_ERROR_BARE(dec_int4_append(b, p, i, block));
      }
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "    return "));
    for (uint32_t k = 0; k < f->tensor_count; ++k) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "%s%%%s%u", k ? ", " : "", variant ? "q" : "d",
          f->tensor_indices[k]));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
    PCP_RETURN_IF_ERROR_BARE(dec_delta_types(b, table, f, variant, block));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n  }\n"));
  }
  // @mix and @mix_int4. The global values come first so that the worker's
  // hash of the task's first inputs (TASK_ASSIGN hash_inputs) covers what
  // it holds afterwards: g for @mix; for @mix_int4 its resident s (the
  // broadcast copy it held) and the int4 change q it received.
  for (int variant = 0; variant < (int4_down ? 2 : 1); ++variant) {
    const char* const head[] = {variant ? "s" : "g"};
    const char* const local[] = {"l"};
    const char* const gl[] = {"g", "l"};
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "  func.func @%s(", variant ? "mix_int4" : "mix"));
    first = true;
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, true, false, head, f32, 1, &first));
    if (variant) {
      for (uint32_t k = 0; k < f->tensor_count; ++k) {
        const pcp_models_parameter_t* p =
            &table->parameters[f->tensor_indices[k]];
        size_t bytes =
            pcp_decoupled_int4_encoded_size((size_t)p->element_count, block);
        if (bytes == 0) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "%s: %lld values do not fit the int4 codec "
                                 "(block %u)",
                                 p->name, (long long)p->element_count, block);
        }
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
            b, ", %%q%u: tensor<%zuxui8>", f->tensor_indices[k], bytes));
      }
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, ", %alpha: tensor<f32>"));
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, true, false, local, f32, 1, &first));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
    first = true;
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, false, false, gl, f32, 2, &first));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") {\n"));
    for (uint32_t k = 0; k < f->tensor_count; ++k) {
      uint32_t i = f->tensor_indices[k];
      const pcp_models_parameter_t* p = &table->parameters[i];
      dec_type(p, "f32", t, sizeof(t));
      if (variant) {
        // g = s + decode(q): the same f32 arithmetic as the gateway's
        // pcp_decoupled_int4_decode and add (q*scale is exact).
        PCP_RETURN_IF_ERROR_BARE(dec_int4_decode_append(b, p, i, block));
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
            b, "    %%g%u = stablehlo.add %%s%u, %%ud%u : %s\n", i, i, i, t));
      }
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b,
          "    %%a%u = stablehlo.broadcast_in_dim %%alpha, dims = [] : "
          "(tensor<f32>) -> %s\n"
          "    %%one%u = stablehlo.constant dense<1.000000e+00> : %s\n"
          "    %%r%u = stablehlo.subtract %%one%u, %%a%u : %s\n"
          "    %%x%u = stablehlo.multiply %%a%u, %%l%u : %s\n"
          "    %%y%u = stablehlo.multiply %%r%u, %%g%u : %s\n"
          "    %%b%u = stablehlo.add %%x%u, %%y%u : %s\n",
          i, t, i, t, i, i, i, t, i, i, i, t, i, i, i, t, i, i, i, t));
    }
    // g first: @mix_int4's hash_outputs covers outputs 0..count-1, the
    // g = s + decode(q) the learner keeps as s.
    const char* const mix_out[] = {"g", "b"};
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "    return "));
    first = true;
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, false, true, mix_out, f32, 2, &first));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
    first = true;
    PCP_RETURN_IF_ERROR_BARE(
        dec_list(b, table, f, false, false, mix_out, f32, 2, &first));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n  }\n"));
  }
  return pcp_string_builder_append_cstring(b, "}\n");
}

static pcp_status_t dec_programs(dec_t* d) {
  job_t* job = d->job;
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_job_child_compile(job, model, job->model_hash, "train", 1,
                                   d->backend, d->target, d->train_hash));
  if (d->steps_per_task > 1) {
    // Another program (the compile key holds inner_steps): the 1-step one
    // stays for the steps next to a boundary (dec_task_steps).
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_job_child_compile(
        job, model, job->model_hash, "train", d->steps_per_task, d->backend,
        d->target, d->train_fused_hash));
  }
  for (uint32_t f = 0; f < d->plan.fragment_count; ++f) {
    pcp_string_builder_t b;
    pcp_string_builder_initialize(pcp_allocator_system(), (size_t)64 << 20, &b);
    pcp_status_t status = pcp_decoupled_fragment_module_emit(
        &job->table, &d->plan, f, d->int4, d->int4_down, d->block, &b);
    char name[64];
    snprintf(name, sizeof(name), "decoupled-fragment-%u.mlir", f);
    if (!status) {
      status =
          pcp_diloco_job_module_compile(job, name, b.data, b.size, d->backend,
                                        d->target, d->fragment_hash[f]);
    }
    pcp_string_builder_deinitialize(&b);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

static int64_t dec_now_ns(dec_t* d) {
  return pcp_clock_now_ns(d->job->options->clock);
}

static void dec_learner_lost(dec_t* d, uint32_t li, const char* why);

// Submits a task for |l|; a refusal is returned (the learner stays).
static pcp_status_t dec_submit_try(
    dec_t* d, dec_learner_t* l, const uint8_t* program, const char* function,
    const pcp_proto_section_t* sections, uint32_t section_count,
    const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
    const pcp_proto_keep_resident_t* keep, uint32_t keep_count, int kind) {
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, program, sizeof(params.program));
  params.function = function;
  params.inputs = sections;
  params.input_count = section_count;
  params.input_refs = refs;
  params.input_ref_count = ref_count;
  params.keep_resident = keep;
  params.keep_resident_count = keep_count;
  params.worker_id = l->worker_id;
  params.session_id = l->session;
  params.max_attempts = 1;
  params.hash_inputs = l->hash_inputs;
  params.hash_outputs = l->hash_outputs;
  l->hash_inputs = 0;
  l->task_hash_outputs = l->hash_outputs > 0;
  l->hash_outputs = 0;
  pcp_status_t status = pcp_diloco_job_task_submit(d->job, &params, &l->task);
  if (status) {
    l->task = NULL;
    return status;
  }
  l->task_kind = kind;
  l->task_started_ns = dec_now_ns(d);
  return pcp_ok_status();
}

static void dec_submit(dec_t* d, dec_learner_t* l, const uint8_t* program,
                       const char* function,
                       const pcp_proto_section_t* sections,
                       uint32_t section_count,
                       const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
                       const pcp_proto_keep_resident_t* keep,
                       uint32_t keep_count, int kind) {
  pcp_status_t status =
      dec_submit_try(d, l, program, function, sections, section_count, refs,
                     ref_count, keep, keep_count, kind);
  if (status) {
    // Through dec_learner_lost like every other drop: the tape's
    // LEARNER_FAILURE record, the lost-task metric and the log.
    dec_learner_lost(d, (uint32_t)(l - d->learners),
                     pcp_status_message(status));
    pcp_status_ignore(status);
  }
}

static void dec_section_of(const pcp_models_parameter_t* p, const char* name,
                           const float* data, pcp_proto_section_t* s) {
  memset(s, 0, sizeof(*s));
  s->name = name;
  s->element_type = PCP_ELEMENT_TYPE_F32;
  s->rank = (uint32_t)p->rank;
  for (int32_t r = 0; r < p->rank; ++r) {
    s->shape[r] = p->dims[r];
  }
  s->byte_length = (uint64_t)p->element_count * sizeof(float);
  s->data = data;
}

// The @mix (or @mix_int4) of |fragment| for |l| (TASK_MIX, or TASK_RESYNC:
// alpha 0, f32 values). Fills the task's sections, refs and keeps, the
// values the learner holds afterwards (l->mix_buf, copied: the masters may
// change while the task is out) and the hash it must return of its first
// inputs (l->hash_want): the f32 global values g it received, or for
// @mix_int4 the broadcast copy it held (s, resident) and the payload q.
static pcp_status_t dec_mix_prepare(
    dec_t* d, dec_learner_t* l, uint32_t fragment, int kind,
    pcp_proto_section_t* sections, uint32_t* section_count,
    pcp_proto_tensor_ref_t* refs, uint32_t* ref_count,
    pcp_proto_keep_resident_t* keep, uint32_t* keep_count,
    const char** function) {
  static const float kZero = 0.0f;
  job_t* job = d->job;
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  uint32_t count = f->tensor_count;
  // int4 only when the learner holds the version the latest payload moves
  // from; otherwise (a skipped sync, a join, a resync) B in f32.
  // (A learner without the int4 buffers, set up by another path, is
  // always sent f32.)
  bool int4 = d->int4_down && kind == TASK_MIX && l->bcast_version &&
              l->mix_q && l->bcast_version[fragment] != 0 &&
              l->bcast_version[fragment] + 1 == d->bcast_version[fragment];
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_plan_gather(
      &d->plan, fragment, d->int4_down ? d->bcast : job->parameters,
      l->mix_buf));
  l->task_bcast_version = d->int4_down ? d->bcast_version[fragment] : 0;
  pcp_proto_section_t hashed[2 * DEC_MAX_FRAGMENT_TENSORS];
  uint32_t hashed_count = 0;
  *function = int4 ? "mix_int4" : "mix";
  if (int4) {
    // s (resident), then q: the worker hashes both in this order.
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t i = f->tensor_indices[k];
      refs[(*ref_count)++] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = dec_name(d, 's', i)};
      dec_section_of(&job->table.parameters[i], "s",
                     l->base + d->plan.tensor_value_offset[i],
                     &hashed[hashed_count++]);
    }
    memcpy(l->mix_q, d->down_q + d->down_q_offset[fragment],
           d->down_q_size[fragment]);
    size_t at = 0;
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t i = f->tensor_indices[k];
      size_t bytes = pcp_decoupled_int4_encoded_size(
          (size_t)d->plan.tensor_values[i], d->block);
      pcp_proto_section_t* q = &sections[*section_count];
      *q = (pcp_proto_section_t){.name = job->table.parameters[i].name,
                                 .element_type = PCP_ELEMENT_TYPE_U8,
                                 .rank = 1,
                                 .shape = {(int64_t)bytes},
                                 .byte_length = bytes,
                                 .data = l->mix_q + at};
      hashed[hashed_count++] = *q;
      refs[(*ref_count)++] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (*section_count)++};
      at += bytes;
    }
    d->down_bytes_total += at;
    ++d->down_int4_sends;
  } else {
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t i = f->tensor_indices[k];
      dec_section_of(&job->table.parameters[i], job->table.parameters[i].name,
                     l->mix_buf + f->offset_bytes[k] / 4,
                     &sections[*section_count]);
      hashed[hashed_count++] = sections[*section_count];
      refs[(*ref_count)++] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (*section_count)++};
    }
    d->down_bytes_total += f->byte_count;
    d->down_f32_sends += d->int4_down;
  }
  l->hash_inputs = hashed_count;
  pcp_diloco_param_hash(hashed, hashed_count, l->hash_want);
  if (int4) {
    // What it keeps, g, must be B bit for bit (l->mix_buf): a worker whose
    // s + decode(q) differs (flush-to-zero, contraction, a miscompile)
    // is caught now, not at the fragment's next sync.
    pcp_proto_section_t kept[DEC_MAX_FRAGMENT_TENSORS];
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t i = f->tensor_indices[k];
      dec_section_of(&job->table.parameters[i], "g",
                     l->mix_buf + f->offset_bytes[k] / 4, &kept[k]);
    }
    l->hash_outputs = count;
    pcp_diloco_param_hash(kept, count, l->hash_out_want);
  }
  sections[*section_count] =
      (pcp_proto_section_t){.name = "alpha",
                            .element_type = PCP_ELEMENT_TYPE_F32,
                            .byte_length = sizeof(float),
                            .data = kind == TASK_RESYNC ? &kZero : &l->alpha};
  refs[(*ref_count)++] = (pcp_proto_tensor_ref_t){
      .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (*section_count)++};
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t i = f->tensor_indices[k];
    refs[(*ref_count)++] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = dec_name(d, 'p', i)};
    keep[(*keep_count)++] =
        (pcp_proto_keep_resident_t){.output = k, .as = dec_name(d, 's', i)};
    keep[(*keep_count)++] = (pcp_proto_keep_resident_t){
        .output = count + k, .as = dec_name(d, 'p', i)};
  }
  return pcp_ok_status();
}

// Whether the @init of |fragment| for |l| may go as seeded-init refs: the
// key allows it, this is a fresh start (not a resume, not a joiner, not an
// @init sent again after a mismatch), every tensor of the fragment is
// whole in it, no seeded @init of the learner fell back before
// (dec_seeded_fallback), the refs pass the ceilings the fabric checks,
// and the values it would send (l->mix_buf, just gathered)
// are bit for bit what pcp_models_parameter_fill gives. The last check is
// what makes it exact whatever set the masters (a checkpoint, a merge):
// only seeded values qualify. It costs one fill of the fragment on the
// gateway.
static bool dec_init_seeded(dec_t* d, const dec_learner_t* l, uint32_t fragment,
                            pcp_proto_tensor_ref_t* refs, uint32_t* ref_count) {
  job_t* job = d->job;
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  if (!d->seeded_init || d->resumed || l->joining || l->init_mismatch ||
      l->seeded_off || job->param_type != PCP_ELEMENT_TYPE_F32 ||
      f->tensor_count == 0) {
    return false;
  }
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    if (d->plan.tensor_values[i] !=
        (uint64_t)job->table.parameters[i].element_count) {
      return false;  // part of a tensor: values
    }
  }
  // The same inputs as refs the worker fills. Refs the fabric would refuse
  // at submit (a tensor over the per-ref ceiling, a fragment over the
  // total) go as values instead: a refused submit would lose the learner.
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    const pcp_models_parameter_t* p = &job->table.parameters[i];
    pcp_proto_tensor_ref_t* r = &refs[k];
    *r = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_INIT,
                                  .init = (pcp_proto_init_kind_t)p->init,
                                  .seed = job->seed,
                                  .index = i,
                                  .element_type = PCP_ELEMENT_TYPE_F32,
                                  .rank = (uint32_t)p->rank};
    for (int32_t g = 0; g < p->rank; ++g) {
      r->shape[g] = p->dims[g];
    }
  }
  pcp_status_t valid = pcp_proto_init_refs_validate(refs, f->tensor_count);
  if (valid) {
    pcp_status_ignore(valid);
    return false;
  }
  bool cached = d->syncs == 0 && fragment < DEC_MAX_FRAGMENTS;
  if (cached && d->seeded_verdict[fragment] != 0) {
    if (d->seeded_verdict[fragment] == 1) {
      *ref_count = f->tensor_count;
    }
    return d->seeded_verdict[fragment] == 1;
  }
  float* fill = pcp_diloco_job_calloc(job, f->value_count ? f->value_count : 1,
                                      sizeof(float));
  if (!fill) {
    return false;  // no scratch: the values go, as without the key
  }
  bool same = true;
  for (uint32_t k = 0; k < f->tensor_count && same; ++k) {
    uint32_t i = f->tensor_indices[k];
    const pcp_models_parameter_t* p = &job->table.parameters[i];
    float* at = fill + f->offset_bytes[k] / 4;
    pcp_models_parameter_fill(p->init, job->seed, i, PCP_ELEMENT_TYPE_F32,
                              p->element_count, at);
    same = memcmp(at, l->mix_buf + f->offset_bytes[k] / 4,
                  (size_t)p->element_count * sizeof(float)) == 0;
  }
  pcp_diloco_job_free(job, fill);
  if (cached) {
    d->seeded_verdict[fragment] = same ? 1 : 2;
  }
  if (same) {
    *ref_count = f->tensor_count;
  }
  return same;
}

// A seeded @init of |fragment| for |l| that will not do (refused at
// submit, failed on the worker, or hashed other than the values): an
// expected fallback, not a failure. The fragment goes again with values,
// as do the learner's remaining fragments: one that failed seeded is
// likely to fail so again (an older worker build, a libm that draws other
// bits).
static void dec_seeded_fallback(dec_t* d, dec_learner_t* l, uint32_t fragment,
                                const char* why) {
  ++d->seeded_fallbacks;
  l->seeded_off = true;
  l->task_seeded = false;
  PCP_LOG(PCP_LOG_WARN, &d->job->log,
          "learner %u: seeded @init of fragment %u: %s; sending the values",
          (uint32_t)(l - d->learners) + 1, fragment, why);
}

// Submits one fragment task (init, delta, delta_int4 or mix) for |l|.
static pcp_status_t dec_fragment_submit(dec_t* d, dec_learner_t* l,
                                        uint32_t fragment, int kind,
                                        uint64_t syncer_step) {
  job_t* job = d->job;
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  uint32_t count = f->tensor_count;
  // @mix_int4 refs: s, q, alpha and l per tensor.
  pcp_proto_tensor_ref_t refs[3 * DEC_MAX_FRAGMENT_TENSORS + 2];
  pcp_proto_section_t sections[DEC_MAX_FRAGMENT_TENSORS + 2];
  pcp_proto_keep_resident_t keep[4 * DEC_MAX_FRAGMENT_TENSORS];
  uint32_t ref_count = 0, section_count = 0, keep_count = 0;
  const char* function = "init";
  if (kind == TASK_INIT) {
    // The fragment's current global values (a full resync for a learner
    // joining or resumed mid-run), copied: the masters may change while the
    // task is out, and they become the learner's base s. With int4_down
    // that is the broadcast copy B, not the masters G, so that a joiner
    // holds what every other learner holds (and gets int4 payloads next).
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_plan_gather(
        &d->plan, fragment, d->int4_down ? d->bcast : job->parameters,
        l->mix_buf));
    l->task_bcast_version = d->int4_down ? d->bcast_version[fragment] : 0;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_decoupled_plan_scatter(&d->plan, fragment, l->mix_buf, l->base));
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t i = f->tensor_indices[k];
      dec_section_of(&job->table.parameters[i], job->table.parameters[i].name,
                     l->mix_buf + f->offset_bytes[k] / 4,
                     &sections[section_count++]);
      for (int g = 0; g < 4; ++g) {
        keep[keep_count++] =
            (pcp_proto_keep_resident_t){.output = (uint32_t)(g * count + k),
                                        .as = dec_name(d, "pmvs"[g], i)};
      }
    }
    // Hashed like a @mix: a corrupted full resync is caught here, before
    // any delta is computed against it (dec_init_hash_check).
    l->hash_inputs = section_count;
    pcp_diloco_param_hash(sections, section_count, l->hash_want);
    bool seeded = dec_init_seeded(d, l, fragment, refs, &ref_count);
    l->task_seeded = seeded;
    if (seeded) {
      // The refs in place of the values; the hash the worker returns is
      // still checked against these values (a worker whose libm draws
      // other bits gets the values next: dec_init_hash_check).
      ++d->seeded_inits;
      l->task_fragment = fragment;
      l->task_step = syncer_step;
      uint32_t hash_inputs = l->hash_inputs;
      pcp_status_t status =
          dec_submit_try(d, l, d->fragment_hash[fragment], function, NULL, 0,
                         refs, ref_count, keep, keep_count, kind);
      if (!status) {
        return pcp_ok_status();
      }
      // Refused (a worker or fabric that cannot take the refs): the values
      // go now, in the same call, so the learner is not lost for it.
      dec_seeded_fallback(d, l, fragment, pcp_status_message(status));
      pcp_status_ignore(status);
      l->hash_inputs = hash_inputs;
      ref_count = 0;
    }
  } else if (kind == TASK_DELTA || kind == TASK_VERIFY) {
    function = (kind == TASK_DELTA && d->int4) ? "delta_int4" : "delta";
    for (int g = 0; g < 2; ++g) {
      for (uint32_t k = 0; k < count; ++k) {
        refs[ref_count++] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT,
            .name = dec_name(d, g ? 'p' : 's', f->tensor_indices[k])};
      }
    }
  } else {
    PCP_RETURN_IF_ERROR_BARE(dec_mix_prepare(d, l, fragment, kind, sections,
                                             &section_count, refs, &ref_count,
                                             keep, &keep_count, &function));
  }
  l->task_fragment = fragment;
  l->task_step = syncer_step;
  dec_submit(d, l, d->fragment_hash[fragment], function,
             section_count ? sections : NULL, section_count,
             ref_count ? refs : NULL, ref_count, keep_count ? keep : NULL,
             keep_count, kind);
  return pcp_ok_status();
}

// |k| local steps on |l| (all state resident; only the batches go down):
// @train_steps of 1 step, or of steps_per_task steps when |k| is that.
static void dec_step_submit(dec_t* d, dec_learner_t* l, uint32_t k) {
  job_t* job = d->job;
  size_t n = job->table.count;
  uint32_t B = (uint32_t)job->spec.batch, T = (uint32_t)job->spec.block_size;
  pcp_proto_tensor_ref_t* refs =
      pcp_diloco_job_calloc(job, 3 * n + 4, sizeof(*refs));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, 3 * n, sizeof(*keep));
  pcp_proto_section_t sections[4];
  if (!l->cursor_ring) {
    uint64_t size = (uint64_t)d->schedule.overlap_tau + d->steps_per_task + 3;
    l->cursor_ring_size =
        (uint32_t)(size < DEC_CURSOR_RING_MAX ? size : DEC_CURSOR_RING_MAX);
    l->cursor_ring = pcp_diloco_job_calloc(job, l->cursor_ring_size,
                                           sizeof(*l->cursor_ring));
  }
  if (!refs || !keep || !l->cursor_ring) {
    pcp_diloco_job_free(job, refs);
    pcp_diloco_job_free(job, keep);
    dec_learner_lost(d, (uint32_t)(l - d->learners),
                     "out of memory for its step task");
    return;
  }
  // Fused step i uses step + i and lr[i] (compile.h): AdamW's t from
  // adam_step + 1, each step's rate from the schedule at its local step.
  l->task_steps = k;
  l->step_value = (float)(l->adam_step + 1);
  size_t A = (size_t)job->accumulation;
  size_t per_step = A * B * T;
  size_t rows = (size_t)k * per_step;  // ids (then as many targets)
  for (uint32_t i = 0; i < k; ++i) {
    // The cursor before step l->step + i + 1's batches: the one a
    // checkpoint taken at syncer step l->step + i stores.
    uint64_t before = l->step + i;
    dec_cursor_at_t* at = &l->cursor_ring[before % l->cursor_ring_size];
    at->step = before;
    at->used = true;
    pcp_data_sampler_cursor(l->sampler, &at->cursor);
    l->lr[i] = pcp_diloco_lr_schedule_at(&job->schedule, before);
    for (size_t a = 0; a < A; ++a) {
      size_t row = (i * A + a) * B * T;
      pcp_data_sampler_next(l->sampler, l->tokens + row, l->tokens + rows + row,
                            NULL);
    }
  }
  job->last_lr = l->lr[k - 1];
  bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
  if (wide) {
    for (size_t e = 0; e < 2 * rows; ++e) {
      l->tokens64[e] = l->tokens[e];
    }
  }
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      keep[g * n + i] = (pcp_proto_keep_resident_t){
          .output = (uint32_t)(g * n + i), .as = dec_name(d, "pmv"[g], i)};
      refs[g * n + i] =
          (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                   .name = dec_name(d, "pmv"[g], i)};
    }
  }
  sections[0] = (pcp_proto_section_t){.name = "step",
                                      .element_type = PCP_ELEMENT_TYPE_F32,
                                      .byte_length = sizeof(float),
                                      .data = &l->step_value};
  sections[1] = (pcp_proto_section_t){.name = "lr",
                                      .element_type = PCP_ELEMENT_TYPE_F32,
                                      .rank = 1,
                                      .shape = {k},
                                      .byte_length = k * sizeof(float),
                                      .data = l->lr};
  size_t id_size = pcp_element_type_byte_size(job->data_type);
  for (int j = 0; j < 2; ++j) {
    pcp_proto_section_t* s = &sections[2 + j];
    *s = (pcp_proto_section_t){
        .name = j ? "targets" : "input_ids",
        .element_type = job->data_type,
        .byte_length = (uint64_t)(rows * id_size),
        .data = wide ? (const void*)(l->tokens64 + (size_t)j * rows)
                     : (const void*)(l->tokens + (size_t)j * rows)};
    uint32_t r = 0;
    s->shape[r++] = k;
    if (A > 1) {
      s->shape[r++] = (int64_t)A;
    }
    s->shape[r++] = B;
    s->shape[r++] = T;
    s->rank = r;
  }
  for (int j = 0; j < 4; ++j) {
    refs[3 * n + j] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (uint32_t)j};
  }
  job->token_bytes += 2ull * rows * id_size;
  ++d->step_tasks;
  dec_submit(d, l, k > 1 ? d->train_fused_hash : d->train_hash, "train_steps",
             sections, 4, refs, (uint32_t)(3 * n + 4), keep, (uint32_t)(3 * n),
             TASK_STEP);
  pcp_diloco_job_free(job, refs);
  pcp_diloco_job_free(job, keep);
}

//===----------------------------------------------------------------------===//
// Rounds
//===----------------------------------------------------------------------===//

static dec_round_t* dec_round_find(dec_t* d, uint64_t step, bool create) {
  for (uint32_t k = 0; k < DEC_MAX_OPEN; ++k) {
    if (d->rounds[k].used && d->rounds[k].step == step) {
      return &d->rounds[k];
    }
  }
  if (!create) {
    return NULL;
  }
  for (uint32_t k = 0; k < DEC_MAX_OPEN; ++k) {
    dec_round_t* r = &d->rounds[k];
    if (!r->used) {
      float* values = r->values;
      uint32_t slots = r->values_slots;
      if (values && slots < d->learner_count) {
        // A join added learners since: a free slot holds no data to keep.
        pcp_diloco_job_free(d->job, values);
        values = NULL;
      }
      if (!values) {
        // Allocated on first use and kept for the slot's later rounds.
        slots = d->learner_count;
        values = pcp_diloco_job_malloc(
            d->job, (size_t)slots * d->frag_max * sizeof(float));
        if (!values) {
          r->values = NULL;
          r->values_slots = 0;
          return NULL;
        }
      }
      memset(r, 0, sizeof(*r));
      r->values = values;
      r->values_slots = slots;
      r->used = true;
      r->step = step;
      return r;
    }
  }
  return NULL;
}

static uint64_t dec_ms(dec_t* d, int64_t ns) {
  (void)d;
  return ns > 0 ? (uint64_t)(ns / 1000000) : 0;
}

// Puts the tape's new records on disk. Each round appends only the records
// recorded since the last write (records are self-delimiting, with a CRC
// each), no fsync: rewriting and fsyncing the whole tape every round was
// quadratic in the run's length on the job thread. |full| (checkpoints, the
// end, the first write, a resumed tape) rewrites it atomically and fsynced:
// the compaction point, after which a crash leaves it whole; a crash of the
// machine between two can cut the last appended record, which decoding
// reports. (Resume reads the checkpoint's own copy of the tape, not this
// file.)
static pcp_status_t dec_tape_write(dec_t* d, bool full) {
  bool append =
      !full && d->tape_written > 0 && d->tape_written <= d->tape.count;
  if (append && d->tape_written == d->tape.count) {
    return pcp_ok_status();  // nothing new
  }
  uint64_t first = append ? d->tape_written : 0;
  uint8_t* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_tape_encode_records(
      &d->tape, first, !append, &data, &length));
  pcp_status_t status = append
                            ? pcp_file_append(d->tape_path, data, length)
                            : pcp_file_write_atomic(d->tape_path, data, length);
  pcp_allocator_free(d->tape.allocator, data);
  // After a failed append the file's end is unknown: rewrite it next time.
  d->tape_written = status ? 0 : d->tape.count;
  return status;
}

static pcp_status_t dec_record(dec_t* d, int32_t kind, uint32_t learner,
                               uint32_t fragment, uint64_t step) {
  pcp_decoupled_event_t e;
  memset(&e, 0, sizeof(e));
  e.kind = kind;
  e.learner_id = learner;
  e.fragment_id = fragment;
  e.syncer_step = step;
  return pcp_decoupled_syncer_record_event(d->state, &d->tape, &e);
}

static void dec_learner_lost(dec_t* d, uint32_t li, const char* why) {
  dec_learner_t* l = &d->learners[li];
  if (!l->alive) {
    return;
  }
  PCP_LOG(PCP_LOG_WARN, &d->job->log,
          "decoupled learner %u (%s) lost: %s; left out of later rounds", li,
          l->worker_id, why);
  l->alive = false;
  pcp_status_ignore(dec_record(d, PCP_DECOUPLED_EVENT_LEARNER_FAILURE, li + 1,
                               0, d->state->global_step));
  if (d->job->options->metrics) {
    pcp_obs_family_add(d->job->options->metrics->lost_tasks, NULL, 1);
  }
}

// A learner's delta for round |r| came back: its fragment values (base -
// delta, decoded from int4 when compressed) go into the round and the
// round machine hears the arrival.
static pcp_status_t dec_delta_arrived(dec_t* d, uint32_t li, dec_round_t* r,
                                      const pcp_proto_section_t* outputs,
                                      size_t n_out, int64_t now_ns) {
  dec_learner_t* l = &d->learners[li];
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[r->fragment];
  // The outputs are the worker's: a malformed result loses that learner
  // (its values stay out of the round), not the job.
  char why[160];
  if (n_out != f->tensor_count) {
    snprintf(why, sizeof(why), "@delta returned %zu tensors, not %u", n_out,
             f->tensor_count);
    dec_learner_lost(d, li, why);
    return pcp_ok_status();
  }
  float* values = r->values + (size_t)li * d->frag_max;
  uint64_t up_bytes = 0;
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    size_t n = (size_t)d->plan.tensor_values[i];
    float* out = values + f->offset_bytes[k] / 4;
    if (d->int4) {
      pcp_status_t status = pcp_decoupled_int4_decode(
          outputs[k].data, outputs[k].byte_length, n, d->block, out);
      if (status) {
        snprintf(why, sizeof(why),
                 "@delta_int4 payload of %" PRIu64 " bytes rejected: %s",
                 outputs[k].byte_length, pcp_status_message(status));
        pcp_status_ignore(status);
        dec_learner_lost(d, li, why);
        return pcp_ok_status();
      }
    } else if (outputs[k].byte_length != n * sizeof(float)) {
      snprintf(why, sizeof(why), "@delta returned %" PRIu64 " bytes, not %zu",
               outputs[k].byte_length, n * sizeof(float));
      dec_learner_lost(d, li, why);
      return pcp_ok_status();
    } else {
      memcpy(out, outputs[k].data, n * sizeof(float));
    }
    up_bytes += outputs[k].byte_length;
  }
  r->up_bytes += up_bytes;
  d->up_bytes_total += up_bytes;
  if (d->verify_int4 && d->int4 && !l->verify_done) {
    // Kept for the f32 @delta that follows on the same, unchanged state.
    memcpy(l->verify_values, values, f->value_count * sizeof(float));
    l->verify_pending = true;
    l->verify_done = true;
    l->verify_step = r->step;
    l->verify_fragment = r->fragment;
  }
  // values = base - delta: the learner's current fragment.
  const float* base = l->base;
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    size_t n = (size_t)d->plan.tensor_values[i];
    const float* b = base + d->plan.tensor_value_offset[i];
    float* out = values + f->offset_bytes[k] / 4;
    for (size_t e = 0; e < n; ++e) {
      out[e] = b[e] - out[e];
    }
  }
  r->has[li] = true;
  if (!r->opened) {
    uint32_t expected[MAX_ROUND_WORKERS];
    uint32_t count = 0;
    for (uint32_t k = 0; k < d->learner_count; ++k) {
      if (dec_pulled(&d->learners[k], r->step) || k == li) {
        expected[count++] = k;
      }
    }
    uint32_t quorum = (uint32_t)d->config.min_quorum;
    r->grace_ms = pcp_decoupled_grace_ms(&d->grace);
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_round_open(
        dec_ms(d, now_ns), expected, count, quorum < count ? quorum : count,
        r->grace_ms, DEC_COLLECTION_TIMEOUT_MS, &r->machine));
    r->opened = true;
    r->opened_ns = now_ns;
  }
  pcp_decoupled_round_arrive(&r->machine, li, dec_ms(d, now_ns));
  return pcp_ok_status();
}

// The f32 @delta of the state whose int4 delta was just decoded: every
// element within F's bound, scale / 2 of its block (plus the f32 quotient's
// rounding: the worker divides in f32 where the host codec divides in
// double, which can move a code at an exact half by one ulp of x/s).
static pcp_status_t dec_verify(dec_t* d, uint32_t li, uint32_t fragment,
                               const pcp_proto_section_t* outputs,
                               size_t n_out) {
  dec_learner_t* l = &d->learners[li];
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  // A malformed result (the worker's input) loses the learner, not the job.
  bool ok = n_out == f->tensor_count;
  for (uint32_t k = 0; ok && k < f->tensor_count; ++k) {
    size_t n = (size_t)d->plan.tensor_values[f->tensor_indices[k]];
    ok = outputs[k].byte_length == n * sizeof(float);
  }
  if (!ok) {
    char why[96];
    snprintf(why, sizeof(why),
             "the f32 @delta to verify returned %zu "
             "outputs of the wrong count or size",
             n_out);
    dec_learner_lost(d, li, why);
    return pcp_ok_status();
  }
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    size_t n = (size_t)d->plan.tensor_values[f->tensor_indices[k]];
    const float* exact = outputs[k].data;
    const float* decoded = l->verify_values + f->offset_bytes[k] / 4;
    for (size_t b0 = 0; b0 < n; b0 += d->block) {
      size_t b1 = b0 + d->block < n ? b0 + d->block : n;
      float max_abs = 0;
      for (size_t e = b0; e < b1; ++e) {
        max_abs = fmaxf(max_abs, fabsf(exact[e]));
      }
      // s < max/7 * (1 + 2^-19) (the pattern rounded up to a multiple of 8
      // moves it by at most 8 ulps plus the quotient's half ulp).
      double s = (double)max_abs / 7.0 * (1.0 + 0x1p-19);
      for (size_t e = b0; e < b1; ++e) {
        double err = fabs((double)exact[e] - (double)decoded[e]);
        if (err > d->int4_max_error) {
          d->int4_max_error = err;
        }
        double ratio = s > 0 ? err / (s / 2) : (err > 0 ? INFINITY : 0);
        if (ratio > d->int4_max_ratio) {
          d->int4_max_ratio = ratio;
        }
      }
    }
  }
  ++d->int4_verified;
  if (d->int4_max_ratio > 1.0 + 1e-6) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "int4 delta off the f32 one by %g of the bound",
                           d->int4_max_ratio);
  }
  return pcp_ok_status();
}

static double dec_mean_loss(const dec_t* d) {
  double loss = 0;
  uint32_t alive = 0;
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    if (d->learners[k].alive && isfinite(d->learners[k].last_loss)) {
      loss += d->learners[k].last_loss;
      ++alive;
    }
  }
  return alive ? loss / alive : NAN;
}

static json_t* dec_totals_json(const dec_t* d) {
  double goodput =
      d->tokens_computed ? d->tokens_merged / (double)d->tokens_computed : 0.0;
  json_t* o = json_pack(
      "{s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:s, s:I}", "tokens_computed",
      (json_int_t)d->tokens_computed, "tokens_merged",
      (json_int_t)llround(d->tokens_merged), "goodput", goodput,
      "delta_bytes_total", (json_int_t)d->up_bytes_total,
      "fragment_bytes_down_total", (json_int_t)d->down_bytes_total, "syncs",
      (json_int_t)d->syncs, "skipped_rounds", (json_int_t)d->skipped_rounds,
      "compression", d->int4 ? "int4" : "none", "int4_verified",
      (json_int_t)d->int4_verified);
  if (o) {
    json_object_set_new(o, "dropped_pulls",
                        json_integer((json_int_t)d->dropped_pulls));
    json_object_set_new(o, "learners_joined",
                        json_integer((json_int_t)d->joins));
  }
  if (o && d->resumed) {
    json_object_set_new(o, "resumed_at_syncer_step",
                        json_integer((json_int_t)d->resumed_at));
    json_object_set_new(o, "resume_tape_replayed",
                        json_boolean(d->resume_replay_ok));
  }
  json_t* steps = o ? json_array() : NULL;
  for (uint32_t k = 0; k < d->learner_count && steps; ++k) {
    // Per learner: its local step and AdamW's t (steps since its last
    // @init reset the moments: a join, a rejoin or a resume).
    const dec_learner_t* l = &d->learners[k];
    json_array_append_new(
        steps,
        json_pack("{s:I, s:I, s:I}", "learner", (json_int_t)(k + 1), "step",
                  (json_int_t)l->step, "adam_step", (json_int_t)l->adam_step));
  }
  if (steps) {
    json_object_set_new(o, "learner_steps", steps);
  }
  if (o) {
    json_object_set_new(o, "resyncs", json_integer((json_int_t)d->resyncs));
    json_object_set_new(o, "final_sync", json_boolean(d->config.final_sync));
    json_object_set_new(o, "final_sync_rounds",
                        json_integer((json_int_t)d->final_rounds));
    json_object_set_new(o, "steps_per_task",
                        json_integer((json_int_t)d->steps_per_task));
    json_object_set_new(o, "step_tasks",
                        json_integer((json_int_t)d->step_tasks));
    json_object_set_new(o, "seeded_inits",
                        json_integer((json_int_t)d->seeded_inits));
    json_object_set_new(o, "seeded_init_fallbacks",
                        json_integer((json_int_t)d->seeded_fallbacks));
    json_object_set_new(o, "down_compression",
                        json_string(d->int4_down ? "int4" : "none"));
  }
  if (o && d->int4_down) {
    json_object_set_new(o, "down_int4_sends",
                        json_integer((json_int_t)d->down_int4_sends));
    json_object_set_new(o, "down_f32_sends",
                        json_integer((json_int_t)d->down_f32_sends));
    json_object_set_new(o, "int4_down_error_over_bound",
                        json_real(d->int4_down_max_ratio));
  }
  if (o && d->int4_verified) {
    json_object_set_new(o, "int4_max_error", json_real(d->int4_max_error));
    json_object_set_new(o, "int4_error_over_bound",
                        json_real(d->int4_max_ratio));
  }
  return o;
}

// The int4 down path after a merge of |fragment| into the masters G: per
// tensor q = int4(G - B), then B += decode(q) in f32, the arithmetic
// @mix_int4 runs on every learner (so both hold the same bits, which the
// hashes check). What int4 leaves out of G - B stays there and is sent
// with the next sync of the fragment (error feedback). The codec's bound
// is asserted: |(G - B) - decode(q)| <= scale / 2 per element.
static pcp_status_t dec_down_encode(dec_t* d, uint32_t fragment) {
  job_t* job = d->job;
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  uint8_t* q = d->down_q + d->down_q_offset[fragment];
  size_t at = 0;
  for (uint32_t k = 0; k < f->tensor_count; ++k) {
    uint32_t i = f->tensor_indices[k];
    size_t n = (size_t)d->plan.tensor_values[i];
    size_t offset = (size_t)d->plan.tensor_value_offset[i];
    const float* g = job->parameters + offset;
    float* bcast = d->bcast + offset;
    // down_scratch: the residual G - B, then its decoding.
    float* residual = d->down_scratch;
    float* decoded = d->down_scratch + d->frag_max;
    for (size_t e = 0; e < n; ++e) {
      residual[e] = g[e] - bcast[e];
    }
    size_t bytes = pcp_decoupled_int4_encoded_size(n, d->block);
    pcp_status_t status =
        pcp_decoupled_int4_encode(residual, n, d->block, q + at, bytes);
    if (!status) {
      status = pcp_decoupled_int4_decode(q + at, bytes, n, d->block, decoded);
    }
    if (status) {
      return pcp_status_annotate_f(status, "int4 down path, tensor %s",
                                   job->table.parameters[i].name);
    }
    for (size_t b0 = 0, block = 0; b0 < n; b0 += d->block, ++block) {
      // The block's scale as the payload holds it (little-endian f32).
      uint32_t bits = 0;
      for (int byte = 0; byte < 4; ++byte) {
        bits |= (uint32_t)q[at + 4 * block + (size_t)byte] << (8 * byte);
      }
      float scale;
      memcpy(&scale, &bits, sizeof(scale));
      size_t b1 = b0 + d->block < n ? b0 + d->block : n;
      for (size_t e = b0; e < b1; ++e) {
        double err = fabs((double)residual[e] - (double)decoded[e]);
        double ratio =
            scale > 0 ? err / ((double)scale / 2) : (err > 0 ? INFINITY : 0);
        if (ratio > d->int4_down_max_ratio) {
          d->int4_down_max_ratio = ratio;
        }
        bcast[e] = bcast[e] + decoded[e];
      }
    }
    at += bytes;
  }
  if (d->int4_down_max_ratio > 1.0) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "int4 down path: an element off by %g of the "
                           "codec's bound",
                           d->int4_down_max_ratio);
  }
  ++d->bcast_version[fragment];
  return pcp_ok_status();
}

// The hash a @mix returned (its last output) against l->hash_want. A
// mismatch is the job's event and metric (pcp_diloco_param_hash_check);
// with on_param_mismatch "fail" the job fails, with "resync" the learner
// gets the fragment again in f32 (alpha 0: its local copy of the fragment
// becomes the global values) before anything else; a learner whose resync
// mismatches too is lost.
static pcp_status_t dec_mix_hash_check(dec_t* d, uint32_t li, int kind,
                                       const pcp_proto_section_t* outputs,
                                       size_t n_out) {
  dec_learner_t* l = &d->learners[li];
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[l->task_fragment];
  size_t hashes = l->task_hash_outputs ? 2 : 1;
  if (n_out != 2 * (size_t)f->tensor_count + hashes ||
      outputs[n_out - 1].byte_length != PCP_SHA256_BYTE_LENGTH ||
      outputs[n_out - hashes].byte_length != PCP_SHA256_BYTE_LENGTH) {
    // The worker's result (an older build that ignores hash_inputs, a
    // truncated section): that learner is lost, the job goes on.
    char why[96];
    snprintf(why, sizeof(why),
             "@mix returned %zu outputs without its input "
             "hash",
             n_out);
    dec_learner_lost(d, li, why);
    return pcp_ok_status();
  }
  bool match = false;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_param_hash_check(
      d->job, l->worker_id, l->task_step, l->hash_want,
      outputs[n_out - hashes].data, &match));
  if (match && l->task_hash_outputs) {
    // It received the right s and q; does it keep B?
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_param_hash_check(
        d->job, l->worker_id, l->task_step, l->hash_out_want,
        outputs[n_out - 1].data, &match));
  }
  if (!match && kind == TASK_RESYNC) {
    // Its copy still differs after the gateway's values were sent again:
    // out of later rounds, as streaming does.
    dec_learner_lost(d, li, "parameter hash mismatch after a resync");
  } else if (!match) {
    l->resync_pending = true;
    l->resync_fragment = l->task_fragment;
    l->resync_step = l->task_step;
  }
  return pcp_ok_status();
}

// The hash an @init returned (its last output, after the 4 per tensor)
// against l->hash_want, as dec_mix_hash_check does for a @mix: a malformed
// result loses the learner; a mismatch is the job's event (and its failure
// with on_param_mismatch "fail"); with "resync" the @init of the fragment
// is sent again (init_next stays), and a second mismatch loses the
// learner. *out_match true when the learner holds the values it was sent.
static pcp_status_t dec_init_hash_check(dec_t* d, uint32_t li,
                                        const pcp_proto_section_t* outputs,
                                        size_t n_out, bool* out_match) {
  dec_learner_t* l = &d->learners[li];
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[l->task_fragment];
  *out_match = false;
  if (n_out != 4 * (size_t)f->tensor_count + 1 ||
      outputs[n_out - 1].byte_length != PCP_SHA256_BYTE_LENGTH) {
    char why[96];
    snprintf(why, sizeof(why),
             "@init returned %zu outputs without its input "
             "hash",
             n_out);
    dec_learner_lost(d, li, why);
    return pcp_ok_status();
  }
  if (l->task_seeded && memcmp(l->hash_want, outputs[n_out - 1].data,
                               PCP_SHA256_BYTE_LENGTH) != 0) {
    // The worker's fill differs from the gateway's (its libm draws other
    // bits): the expected fallback of a seeded @init, not a bit-identity
    // failure. It is not recorded as a mismatch or a resync (nor fails the
    // job under on_param_mismatch "fail"); the values go next and their
    // @init is checked as any other.
    dec_seeded_fallback(d, l, l->task_fragment,
                        "the worker's fill hashed differently");
    return pcp_ok_status();
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_param_hash_check(
      d->job, l->worker_id, d->state->global_step, l->hash_want,
      outputs[n_out - 1].data, out_match));
  if (*out_match) {
    l->init_mismatch = false;
  } else if (l->init_mismatch) {
    dec_learner_lost(d, li, "parameter hash mismatch on its @init sent again");
  } else {
    l->init_mismatch = true;
    ++d->resyncs;
  }
  return pcp_ok_status();
}

// The progress's measured figures: "bytes" (the fabric's counters since
// the previous sync's event), "bytes_total" and "param_hash" (the last
// verified @mix and the mismatches), as classic and streaming report them.
static void dec_progress_measured(dec_t* d, json_t* progress) {
  job_t* job = d->job;
  pcp_diloco_job_bytes_stop(job);
  json_t* bytes = pcp_diloco_job_bytes_json(job);
  if (bytes) {
    json_object_set_new(progress, "bytes", bytes);
  }
  json_t* totals = pcp_diloco_job_bytes_total_json(job);
  if (totals) {
    json_object_set_new(progress, "bytes_total", totals);
  }
  pcp_diloco_job_bytes_mark(job);
  pcp_diloco_param_hash_json(job, progress);
}

// Closes round |r| (its machine CLOSED or TIMED_OUT): merge, outer
// Nesterov, tape, applies queued for every live learner, the progress
// event.
static pcp_status_t dec_finalize(dec_t* d, dec_round_t* r, int64_t now_ns) {
  job_t* job = d->job;
  const pcp_diloco_job_options_t* o = job->options;
  uint32_t fragment = r->fragment;
  const pcp_decoupled_fragment_t* f = &d->plan.fragments[fragment];
  r->final = true;
  const pcp_decoupled_selection_t* sel = &r->machine.selection;
  bool merged = r->opened && r->machine.state == PCP_DECOUPLED_ROUND_CLOSED &&
                sel->participant_count > 0;
  pcp_decoupled_participant_t parts[MAX_ROUND_WORKERS];
  const float* values[MAX_ROUND_WORKERS];
  double weights[MAX_ROUND_WORKERS];
  uint32_t count = 0;
  double merged_tokens = 0;
  bool no_weight = false;  // participants, none with a usable merge weight
  pcp_decoupled_merge_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  if (merged) {
    for (uint32_t p = 0; p < sel->participant_count; ++p) {
      uint32_t li = sel->participants[p];
      if (li >= d->learner_count || !r->has[li]) {
        continue;
      }
      double w =
          pcp_decoupled_merge_weight(r->tokens_since[li], r->steps_since[li]);
      parts[count] =
          (pcp_decoupled_participant_t){.learner_id = li + 1,
                                        .learner_step = r->learner_step[li],
                                        .steps_since = r->steps_since[li],
                                        .tokens_since = r->tokens_since[li],
                                        .merge_weight = w};
      values[count] = r->values + (size_t)li * d->frag_max;
      weights[count] = w;
      merged_tokens += (double)r->tokens_since[li];
      ++count;
    }
    if (pcp_decoupled_merge_usable_count(weights, count) == 0) {
      // Participants but no data since their last receipt (resumed
      // learners in a final sync, joiners): the merged gradient would be
      // 0, and an outer step with momentum would still move the masters.
      // Skipped, as a round nobody reported to.
      merged = false;
      no_weight = true;
      count = 0;
      merged_tokens = 0;
    }
  }
  if (merged) {
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_plan_gather(
        &d->plan, fragment, job->parameters, d->before));
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_merge_fragment(
        &d->plan, fragment,
        (pcp_decoupled_merge_strategy_t)d->config.merge_strategy, d->before,
        values, weights, count, d->grad, &stats));
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_nesterov_step_fragment(
        &d->nesterov, &d->plan, fragment, d->grad, job->parameters));
    if (d->int4_down) {
      PCP_RETURN_IF_ERROR_BARE(dec_down_encode(d, fragment));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_syncer_record_sync(
        d->state, &d->tape, r->step, fragment, parts, count));
    ++d->syncs;
    // A token trained every fragment; the share of it merged here is the
    // fragment's share of the parameters.
    d->tokens_merged +=
        merged_tokens * (double)f->value_count / (double)job->parameter_count;
    for (uint32_t k = 0; k < d->learner_count; ++k) {
      dec_learner_t* l = &d->learners[k];
      if (!l->alive) {
        continue;
      }
      uint32_t a = 0;
      while (a < l->apply_count && l->apply_fragment[a] != fragment) {
        ++a;
      }
      l->apply_fragment[a] = fragment;
      l->apply_step[a] = r->step;
      l->apply_count += a == l->apply_count;
    }
    // Arrivals (and so quorum_wait_ms) are already measured from the
    // round's opening; subtracting the absolute open time wrapped the
    // unsigned difference and fed adaptive grace garbage.
    pcp_decoupled_grace_observe_quorum_wait(&d->grace,
                                            (double)sel->quorum_wait_ms);
  } else {
    ++d->skipped_rounds;
  }
  PCP_RETURN_IF_ERROR_BARE(dec_tape_write(d, false));
  job->outer_step = d->syncs + d->skipped_rounds;
  job->last_loss = dec_mean_loss(d);
  job->last_loss_mean = job->last_loss;
  job->wire_bytes = d->up_bytes_total + d->down_bytes_total;
  uint32_t alive = 0;
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    alive += d->learners[k].alive;
  }
  // What the @mix tasks of this sync will send: int4 payloads with
  // int4_down (a learner that needs B in f32 gets more, counted in the
  // totals when sent).
  uint64_t down_each =
      d->int4_down ? (uint64_t)d->down_q_size[fragment] : f->byte_count;
  uint64_t down = merged ? (uint64_t)alive * down_each : 0;
  round_outcome_t outcome = {.reporters = count,
                             .parameter_bytes = r->up_bytes + down};
  double seconds = r->opened ? (double)(now_ns - r->opened_ns) / 1e9 : 0;
  double window = (double)(now_ns - d->last_event_ns) / 1e9;
  double tokens_per_second =
      window > 0 ? (double)(d->tokens_computed - d->last_event_tokens) / window
                 : 0;
  d->last_event_ns = now_ns;
  d->last_event_tokens = d->tokens_computed;
  json_t* progress =
      pcp_diloco_job_progress_json(job, &outcome, seconds, tokens_per_second);
  if (progress) {
    json_t* ids = json_array();
    for (uint32_t p = 0; p < count && ids; ++p) {
      json_array_append_new(ids, json_integer(parts[p].learner_id));
    }
    json_object_set_new(progress, "decoupled", json_true());
    json_object_set_new(progress, "syncer_step",
                        json_integer((json_int_t)r->step));
    json_object_set_new(progress, "fragment", json_integer(fragment));
    json_object_set_new(progress, "participants", ids ? ids : json_array());
    json_object_set_new(progress, "skipped", json_boolean(!merged));
    if (no_weight) {
      json_object_set_new(progress, "skipped_reason",
                          json_string("no participant trained since its "
                                      "last receipt (merge weight 0)"));
    }
    json_object_set_new(progress, "late",
                        json_integer(r->opened ? r->machine.late_count : 0));
    json_object_set_new(
        progress, "skipped_learners",
        json_integer(merged ? (json_int_t)(alive > count ? alive - count : 0)
                            : (json_int_t)alive));
    json_object_set_new(progress, "grace_inclusions",
                        json_integer(merged ? sel->grace_inclusion_count : 0));
    json_object_set_new(progress, "grace_ms",
                        json_integer((json_int_t)r->grace_ms));
    json_object_set_new(progress, "delta_bytes",
                        json_integer((json_int_t)r->up_bytes));
    json_object_set_new(progress, "fragment_bytes_down",
                        json_integer((json_int_t)down));
    json_object_set_new(progress, "fragment_values",
                        json_integer((json_int_t)f->value_count));
    json_object_set_new(progress, "merge_sanitized",
                        json_integer((json_int_t)stats.sanitized_count));
    json_object_set_new(progress, "workers_alive", json_integer(alive));
    json_object_set_new(progress, "outer_loop_steps",
                        json_integer((json_int_t)d->scheduled));
    json_t* clock = pcp_decoupled_clock_to_json(&d->state->clock);
    if (clock) {
      json_object_set_new(progress, "clock", clock);
    }
    json_t* totals = dec_totals_json(d);
    if (totals) {
      json_object_update(progress, totals);
      json_decref(totals);
    }
    dec_progress_measured(d, progress);
    pcp_status_ignore(pcp_store_job_event_append(
        o->store, o->job_id, "training.step", progress, NULL));
  }
  pcp_diloco_job_progress_report(job, progress);
  json_decref(progress);
  if (o->metrics) {
    const char* job_label[] = {o->job_id};
    pcp_obs_family_set(o->metrics->loss, job_label, job->last_loss);
    pcp_obs_family_add(o->metrics->outer_steps, NULL, 1);
  }
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "decoupled step=%" PRIu64
          " fragment=%u %s participants=%u late=%u "
          "grace_ms=%" PRIu64 " loss=%.4f delta_bytes=%" PRIu64,
          r->step, fragment, merged ? "merged" : "skipped", count,
          r->opened ? r->machine.late_count : 0, r->grace_ms, job->last_loss,
          r->up_bytes);
  return pcp_ok_status();
}

// The fastest learner's clock drives the syncer: a learner reaching local
// step t opens the scheduled syncer steps up to t, and the pull of each goes
// to every live learner, which answers with its current fragment at its
// next task boundary (a lagging learner too: smaller weight). Past the
// last local step S the final rounds' virtual steps S+1..sync_end open as
// if the learner kept stepping at its overlap budget (up to next_final +
// overlap_tau, dec_loop calls again as rounds close): they pull the
// learners' state after S, no local step follows, and at most
// overlap_tau + 1 rounds are open at once, as before S (DEC_MAX_OPEN).
static void dec_open(dec_t* d, uint64_t learner_step) {
  uint64_t through = learner_step;
  if (learner_step >= d->total_steps) {
    uint64_t budget = d->next_final + d->schedule.overlap_tau;
    through = budget > d->total_steps ? budget : d->total_steps;
    through = through < d->sync_end ? through : d->sync_end;
  }
  for (uint64_t s = d->opened_through + 1; s <= through; ++s) {
    uint32_t fragment = 0;
    d->opened_through = s;
    if (!pcp_decoupled_schedule_fragment_at(&d->schedule, s, &fragment)) {
      continue;
    }
    for (uint32_t k = 0; k < d->learner_count; ++k) {
      dec_learner_t* other = &d->learners[k];
      if (s == d->lose_pull_step) {
        break;  // test hook: as if each pulled learner were lost
      }
      if (!dec_pulled(other, s)) {
        continue;  // lost, or a joiner not synced yet
      }
      if (other->send_count < DEC_MAX_OPEN) {
        other->sends[other->send_count++] = s;
      } else {
        ++d->dropped_pulls;  // too far behind to queue another pull
      }
    }
  }
}

// A finished task of learner |li|.
static pcp_status_t dec_task_done(dec_t* d, uint32_t li, int64_t now_ns) {
  dec_learner_t* l = &d->learners[li];
  job_t* job = d->job;
  pcp_fabric_task_t* task = l->task;
  int kind = l->task_kind;
  l->task = NULL;
  l->task_kind = TASK_NONE;
  pcp_status_t task_status = pcp_fabric_task_status(task);
  if (task_status && kind == TASK_INIT && l->task_seeded) {
    // A seeded @init the worker could not run (an older build, out of
    // memory for the fill): init_next stays, and dec_learner_next sends
    // the fragment again with values. A worker that is gone fails that
    // submit, and only then is the learner lost.
    dec_seeded_fallback(d, l, l->task_fragment,
                        pcp_status_message(task_status));
    pcp_fabric_task_release(task);
    return pcp_ok_status();
  }
  if (task_status) {
    dec_learner_lost(d, li, pcp_status_message(task_status));
    pcp_fabric_task_release(task);
    return pcp_ok_status();
  }
  const pcp_proto_section_t* outputs = NULL;
  size_t n_out = 0;
  pcp_status_t status = pcp_fabric_task_outputs(task, &outputs, &n_out);
  if (!status && kind == TASK_INIT) {
    bool match = false;
    status = dec_init_hash_check(d, li, outputs, n_out, &match);
    if (status || !match) {
      pcp_fabric_task_release(task);
      return status;  // lost, or its @init of this fragment is sent again
    }
    // @init sent B (int4_down) at the version captured when it was sent.
    if (d->int4_down && l->bcast_version) {
      l->bcast_version[l->task_fragment] = l->task_bcast_version;
    }
    ++l->init_next;
    if (l->joining && l->init_next == d->plan.fragment_count) {
      dec_join_ready(d, li);
    }
    if (li == d->delay_learner && l->init_next == d->plan.fragment_count &&
        d->delay_until > 0) {
      l->ready_ns = now_ns + d->delay_ms * 1000000;  // slow from the start
    }
  } else if (!status && kind == TASK_STEP) {
    uint32_t fused = l->task_steps ? l->task_steps : 1;
    l->step += fused;
    l->adam_step += fused;
    // losses[k]: last_loss is the loss of the learner's latest local step,
    // whatever the fusion (the rounds report the mean over learners).
    if (n_out >= 1 && outputs[n_out - 1].byte_length == 4ull * fused) {
      memcpy(&l->last_loss,
             (const uint8_t*)outputs[n_out - 1].data + 4ull * (fused - 1),
             sizeof(float));
    }
    uint64_t tokens = (uint64_t)job->accumulation * (uint64_t)job->spec.batch *
                      (uint64_t)job->spec.block_size;
    // Adaptive grace's step EMA: the step task's round trip per step, once
    // per step, so that the EMA's memory stays in steps at any fusion.
    double step_ms = (double)(now_ns - l->task_started_ns) / 1e6 / fused;
    for (uint32_t i = 0; i < fused; ++i) {
      pcp_decoupled_learner_record_step(&l->counters, tokens);
      pcp_decoupled_grace_observe_step(&d->grace, step_ms);
    }
    d->tokens_computed += fused * tokens;
    dec_open(d, l->step);
    if (li == d->delay_learner && l->step < d->delay_until) {
      l->ready_ns = now_ns + d->delay_ms * 1000000;
    }
  } else if (!status && kind == TASK_DELTA) {
    dec_round_t* r = dec_round_find(d, l->task_step, false);
    // A round made before a join has no room for the joiner's values; a
    // joiner is never pulled for one (dec_join_ready), this is the guard.
    if (r && !r->final && li < r->values_slots) {
      status = dec_delta_arrived(d, li, r, outputs, n_out, now_ns);
    } else {
      ++d->dropped_pulls;  // its round closed while the delta was out
    }
  } else if (!status && kind == TASK_VERIFY) {
    status = dec_verify(d, li, l->task_fragment, outputs, n_out);
  } else if (!status && (kind == TASK_MIX || kind == TASK_RESYNC)) {
    status = dec_mix_hash_check(d, li, kind, outputs, n_out);
    // The gateway's view of the learner: the values it was sent (after a
    // mismatch too: the resync that follows makes them true). Nothing more
    // for a learner the check lost.
    if (!status && !l->alive) {
      pcp_fabric_task_release(task);
      return pcp_ok_status();
    }
    if (!status) {
      status = pcp_decoupled_plan_scatter(&d->plan, l->task_fragment,
                                          l->mix_buf, l->base);
    }
    if (!status && d->int4_down && l->bcast_version) {
      l->bcast_version[l->task_fragment] = l->task_bcast_version;
    }
    if (!status && kind == TASK_MIX) {
      status = pcp_decoupled_learner_apply_fragment(
          &l->counters, l->task_fragment, l->task_step);
    }
    if (!status) {
      status = dec_record(d, PCP_DECOUPLED_EVENT_LEARNER_APPLY, li + 1,
                          l->task_fragment, l->task_step);
    }
  }
  pcp_fabric_task_release(task);
  return status;
}

// Whether learner |li|'s next step would be thrown away whole: every
// fragment has a pull it answered whose blend it has not run yet (its
// answer is in an open round, or the merged fragment is queued). The @mix
// then overwrites (alpha 0) or blends away each fragment's share of the
// step and zeroes its counters, so no token of the step could reach the
// global model: the learner waits for the blend instead (docs/training.md
// "Goodput"). Typical when a round waits out its grace for a stopped
// learner, or with fragments scheduled on consecutive syncer steps.
//
// A fragment with no round left for this learner (no pull queued and none
// scheduled after the syncer steps opened) cannot merge the step either:
// once every fragment's last round is pulled, the learner stops (as
// upstream's learners stop at the last syncer step) instead of running
// out its local steps, which under load made a round's grace wait a
// window of unmergeable catch-up steps.
static bool dec_step_wasted(const dec_t* d, uint32_t li) {
  const dec_learner_t* l = &d->learners[li];
  uint64_t pending = 0;  // fragments awaiting their blend (bit f)
  for (uint32_t a = 0; a < l->apply_count; ++a) {
    pending |= (uint64_t)1 << l->apply_fragment[a];
  }
  // Fragments with a round still ahead: a pull queued, or scheduled in the
  // next H syncer steps not opened yet (each fragment once per H).
  uint64_t ahead = 0;
  for (uint32_t k = 0; k < l->send_count; ++k) {
    uint32_t f = 0;
    if (pcp_decoupled_schedule_fragment_at(&d->schedule, l->sends[k], &f)) {
      ahead |= (uint64_t)1 << f;
    }
  }
  // Up to the syncer's last step: a final round (past S) merges the
  // steps after the fragment's last scheduled one.
  for (uint64_t s = d->opened_through + 1;
       s <= d->sync_end && s <= d->opened_through + d->schedule.sync_interval_h;
       ++s) {
    uint32_t f = 0;
    if (pcp_decoupled_schedule_fragment_at(&d->schedule, s, &f)) {
      ahead |= (uint64_t)1 << f;
    }
  }
  pending |= ~ahead;
  for (uint32_t k = 0; k < DEC_MAX_OPEN; ++k) {
    const dec_round_t* r = &d->rounds[k];
    if (r->used && !r->final && r->has[li]) {
      pending |= (uint64_t)1 << r->fragment;
    }
  }
  uint32_t count = d->plan.fragment_count;
  uint64_t all = count >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << count) - 1;
  return count > 0 && (pending & all) == all;
}

// How many local steps learner |li|'s next step task runs (step t =
// l->step + 1 may run, the caller checked): steps_per_task when nothing is
// due after any of the steps t .. t + K - 2, else 1 (two programs: any k
// would be a compile per k). Whatever happens between two tasks of a
// learner must happen at the same local step as with one step per task,
// so that the fused run computes what single steps would:
// - a scheduled syncer step s: reaching it opens the pull, which the
//   learner answers at its next task boundary with its state after s;
// - s + overlap_tau: the merged fragment of s is blended before step
//   s + overlap_tau + 1 at the latest;
// - the overlap budget: every step t' of the task must satisfy
//   t' <= next_final + overlap_tau (the last one is the largest), and
//   total_steps;
// - the test delay (delay_learner waits after each step below delay_until).
// The caller's dec_step_wasted check holds for the whole task: it turns
// true only when a scheduled step opens (a round closing moves its
// fragment from pending to a queued blend, still pending), and the task
// opens none. Another learner may open one meanwhile: this learner then
// answers its pull up to K - 1 steps later than at K=1, the timing
// freedom several learners have anyway (a one-learner run is exact).
static uint32_t dec_task_steps(const dec_t* d, uint32_t li) {
  const dec_learner_t* l = &d->learners[li];
  uint64_t K = d->steps_per_task, t = l->step + 1,
           tau = d->schedule.overlap_tau;
  uint64_t last = t + K - 1;
  if (K <= 1 || last > d->total_steps || last > d->next_final + tau ||
      (li == d->delay_learner && t <= d->delay_until)) {
    return 1;
  }
  for (uint64_t s = t; s < last; ++s) {
    uint32_t f = 0;
    if (pcp_decoupled_schedule_fragment_at(&d->schedule, s, &f) ||
        (s > tau &&
         pcp_decoupled_schedule_fragment_at(&d->schedule, s - tau, &f))) {
      return 1;
    }
  }
  return (uint32_t)K;
}

// The next task of an idle learner, if any is due.
static pcp_status_t dec_learner_next(dec_t* d, uint32_t li, int64_t now_ns) {
  dec_learner_t* l = &d->learners[li];
  if (l->init_next < d->plan.fragment_count) {
    return dec_fragment_submit(d, l, l->init_next, TASK_INIT, 0);
  }
  if (now_ns < l->ready_ns) {
    return pcp_ok_status();  // the test delay: still "computing"
  }
  if (l->resync_pending) {
    l->resync_pending = false;
    ++d->resyncs;
    return dec_fragment_submit(d, l, l->resync_fragment, TASK_RESYNC,
                               l->resync_step);
  }
  if (l->verify_pending) {
    l->verify_pending = false;
    return dec_fragment_submit(d, l, l->verify_fragment, TASK_VERIFY,
                               l->verify_step);
  }
  if (l->apply_count) {
    uint32_t fragment = l->apply_fragment[0];
    uint64_t step = l->apply_step[0];
    memmove(l->apply_fragment, l->apply_fragment + 1,
            (l->apply_count - 1) * sizeof(l->apply_fragment[0]));
    memmove(l->apply_step, l->apply_step + 1,
            (l->apply_count - 1) * sizeof(l->apply_step[0]));
    --l->apply_count;
    return dec_fragment_submit(d, l, fragment, TASK_MIX, step);
  }
  while (l->send_count) {
    uint64_t step = l->sends[0];
    memmove(l->sends, l->sends + 1, (l->send_count - 1) * sizeof(l->sends[0]));
    --l->send_count;
    if (step < d->next_final) {
      // Its round closed before this learner got there: the contribution
      // is dropped (not merged; it still receives the merged fragment).
      ++d->dropped_pulls;
      continue;
    }
    dec_round_t* r = dec_round_find(d, step, true);
    if (!r) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "more than %d decoupled rounds open",
                             DEC_MAX_OPEN);
    }
    uint32_t fragment = 0;
    pcp_decoupled_schedule_fragment_at(&d->schedule, step, &fragment);
    r->fragment = fragment;
    r->tokens_since[li] = l->counters.tokens_since[fragment];
    r->steps_since[li] = l->counters.steps_since[fragment];
    r->learner_step[li] = l->counters.learner_step;
    // On the tape: a restart finding no sync after it pulls again (REPULL).
    PCP_RETURN_IF_ERROR_BARE(dec_record(
        d, PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE, li + 1, fragment, step));
    return dec_fragment_submit(d, l, fragment, TASK_DELTA, step);
  }
  // The overlap budget: step t waits until every round s with
  // s + overlap_tau < t has closed; and no step whose work every pending
  // blend would throw away.
  uint64_t t = l->step + 1;
  if (t <= d->total_steps && t <= d->next_final + d->schedule.overlap_tau &&
      !dec_step_wasted(d, li)) {
    dec_step_submit(d, l, dec_task_steps(d, li));
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// The run
//===----------------------------------------------------------------------===//

bool pcp_diloco_decoupled_selected(const job_t* job) {
  const char* strategy = json_string_value(
      json_object_get(job->experiment, "aggregation_strategy"));
  return strategy && strcmp(strategy, "decoupled_diloco") == 0;
}

static pcp_status_t dec_config_check(dec_t* d);

// The experiment's decoupled_diloco block (decoupled.h's keys). On an
// error nothing stays allocated (the caller deinitializes the config only
// after a success).
static pcp_status_t dec_config_parse(dec_t* d) {
  job_t* job = d->job;
  json_t* block = json_object_get(job->experiment, "decoupled_diloco");
  if (block && !json_is_object(block)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'decoupled_diloco': must be an object");
  }
  char text[8192] = "{}";
  size_t length = 2;
  if (block) {
    length = json_dumpb(block, text, sizeof(text), JSON_COMPACT);
    if (length == 0 || length >= sizeof(text)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'decoupled_diloco': over %zu bytes",
                             sizeof(text) - 1);
    }
  }
  pcp_string_list_t unknown;
  memset(&unknown, 0, sizeof(unknown));
  pcp_status_t status =
      pcp_decoupled_config_parse_json(text, length, &d->config, &unknown);
  if (!status && unknown.count) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        "key 'decoupled_diloco.%s': unknown", unknown.items[0]);
    pcp_decoupled_config_deinitialize(&d->config);
  }
  pcp_string_list_deinitialize(&unknown);
  PCP_RETURN_IF_ERROR_BARE(status);
  status = dec_config_check(d);
  if (status) {
    pcp_decoupled_config_deinitialize(&d->config);
  }
  return status;
}

// The parsed config against the job (dtype, streaming) and the wire.
static pcp_status_t dec_config_check(dec_t* d) {
  job_t* job = d->job;
  if (job->param_type != PCP_ELEMENT_TYPE_F32) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled_diloco trains f32 models only (key "
                           "'dtype')");
  }
  if (job->config.streaming.present) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "aggregation_strategy 'decoupled_diloco' and a "
                           "'streaming' block exclude each other");
  }
  d->int4 = d->config.outer_gradient_compression == 1;
  d->block = (uint32_t)d->config.int4_block_size;
  if (d->int4 && (d->block % 2 != 0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'decoupled_diloco.int4_block_size': must be "
                           "even on the wire (two codes per byte), got %u",
                           d->block);
  }
  // int4_down: auto (0) follows the up path's compression.
  d->int4_down =
      d->config.int4_down == 1 || (d->config.int4_down == 0 && d->int4);
  if (d->int4_down && d->block % 2 != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'decoupled_diloco.int4_block_size': must be "
                           "even for int4_down (two codes per byte), got %u",
                           d->block);
  }
  d->seeded_init = d->config.seeded_init == 0;  // auto
  json_t* verify = json_object_get(job->experiment, "decoupled_verify_int4");
  d->verify_int4 = json_is_true(verify);
  d->steps_per_task = (uint32_t)d->config.steps_per_task;  // 1..64, parsed
  return pcp_ok_status();
}

// Whether |info| can be a learner of this job: connected, of the job's
// class and of the learners' (backend, target) (the first one's when none
// is set yet).
static bool dec_worker_fits(dec_t* d, const pcp_fabric_worker_info_t* info) {
  const char* worker_class = d->job->config.worker_class;
  if (info->state != PCP_FABRIC_WORKER_CONNECTED ||
      (worker_class && strcmp(info->worker_class, worker_class))) {
    return false;
  }
  if (!d->backend[0]) {
    snprintf(d->backend, sizeof(d->backend), "%s", info->backend);
    snprintf(d->target, sizeof(d->target), "%s", info->target);
  }
  return !strcmp(info->backend, d->backend) && !strcmp(info->target, d->target);
}

// The slot of worker |id|: its own (a resume or a rejoin keeps its learner
// id), else learner_count (a new one; the caller checks the bound).
static uint32_t dec_slot_of(const dec_t* d, const char* id) {
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    if (!strcmp(d->learners[k].worker_id, id)) {
      return k;
    }
  }
  return d->learner_count;
}

// The learners: the connected workers of the first worker's kind and the
// job's class (waits for one). A resumed job gives each worker of the
// checkpoint its slot back (its learner id and sampler) and waits up to
// DEC_RESUME_WAIT_MS for the ones alive then to reconnect; a worker not in
// it takes a new slot.
static pcp_status_t dec_learners_gather(dec_t* d) {
  job_t* job = d->job;
  const pcp_diloco_job_options_t* o = job->options;
  pcp_fabric_worker_info_t* infos =
      pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS, sizeof(*infos));
  if (!infos) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  uint32_t want = 0;
  for (uint32_t k = 0; d->resumed && k < d->learner_count; ++k) {
    want += d->learners[k].was_alive;
  }
  want = want ? want : 1;
  int64_t deadline = pcp_clock_now_ns(o->clock) +
                     (d->resumed ? (int64_t)DEC_RESUME_WAIT_MS * 1000000 : 0);
  pcp_status_t status = pcp_ok_status();
  const char* worker_class = job->config.worker_class;
  for (;;) {
    if (pcp_diloco_job_should_stop(job)) {
      status = pcp_make_status(PCP_STATUS_CANCELLED, "training stopped");
      break;
    }
    uint32_t count =
        pcp_fabric_worker_list(o->fabric, infos, MAX_ROUND_WORKERS, NULL);
    for (uint32_t i = 0; i < count; ++i) {
      if (!dec_worker_fits(d, &infos[i])) {
        continue;
      }
      uint32_t k = dec_slot_of(d, infos[i].worker_id);
      if (k < d->learner_count && d->learners[k].alive) {
        continue;
      }
      if (k == d->learner_count) {
        if (k >= MAX_ROUND_WORKERS) {
          continue;
        }
        ++d->learner_count;
        d->learners[k].joined = d->resumed;  // not one of the start's shards
      }
      dec_learner_t* l = &d->learners[k];
      snprintf(l->worker_id, sizeof(l->worker_id), "%s", infos[i].worker_id);
      snprintf(l->session, sizeof(l->session), "%s-decoupled-%u-%" PRIx64,
               o->job_id, k, d->nonce);
      l->alive = true;
      l->join_count = infos[i].join_count;
    }
    uint32_t alive = 0;
    for (uint32_t k = 0; k < d->learner_count; ++k) {
      alive += d->learners[k].alive;
    }
    if (alive >= want || (alive && pcp_clock_now_ns(o->clock) >= deadline)) {
      break;
    }
    if (alive) {
      struct timespec nap = {0, 100000000};
      nanosleep(&nap, NULL);
      continue;
    }
    pcp_status_t waited = pcp_fabric_workers_wait_class(
        o->fabric, NULL, NULL, worker_class, 1,
        pcp_fabric_endpoint_now_ns(o->fabric) +
            (int64_t)NOBODY_WAIT_MS * 1000000,
        job->waker ? pcp_diloco_job_stop_fn : NULL, job->waker ? job : NULL,
        NULL);
    if (pcp_status_code(waited) == PCP_STATUS_FAILED_PRECONDITION) {
      status = waited;
      break;
    }
    pcp_status_ignore(waited);
  }
  pcp_diloco_job_free(job, infos);
  return status;
}

// Slot |k|'s sampler on |a|'s range and seed, its token and fragment
// buffers, its base (the masters now) and fresh counters; a restored
// sampler cursor (a resume) continues where the checkpoint left it.
static pcp_status_t dec_learner_alloc(dec_t* d, uint32_t k,
                                      const pcp_data_assignment_t* a) {
  job_t* job = d->job;
  dec_learner_t* l = &d->learners[k];
  size_t rows = (size_t)job->accumulation *
                (size_t)(job->spec.batch * job->spec.block_size);
  pcp_data_sampler_options_t so = {
      .sampling = job->config.sampling == PCP_DILOCO_SAMPLING_FIFO
                      ? PCP_DATA_SAMPLING_SEQUENTIAL
                      : PCP_DATA_SAMPLING_RANDOM,
      .batch_size = (uint32_t)job->spec.batch,
      .block_size = (uint32_t)job->spec.block_size,
      .seed = a->seed};
  PCP_RETURN_IF_ERROR_BARE(pcp_data_sampler_create(
      job->dataset, a->range, &so, pcp_allocator_system(), &l->sampler));
  if (l->has_cursor) {
    pcp_status_t restored = pcp_data_sampler_restore(l->sampler, &l->cursor);
    if (restored) {
      pcp_status_t wrapped = pcp_make_status(
          PCP_STATUS_FAILED_PRECONDITION,
          "decoupled checkpoint: learner %u's sampler cursor does not fit its "
          "shard: %s",
          k + 1, pcp_status_message(restored));
      pcp_status_ignore(restored);
      return wrapped;
    }
  }
  // Ids and targets of up to steps_per_task steps (dec_step_submit).
  size_t task_rows = rows * d->steps_per_task;
  l->tokens = pcp_diloco_job_malloc(job, 2 * task_rows * sizeof(int32_t));
  l->tokens64 =
      job->data_type == PCP_ELEMENT_TYPE_I64
          ? pcp_diloco_job_malloc(job, 2 * task_rows * sizeof(int64_t))
          : NULL;
  l->base = pcp_diloco_job_malloc(job, job->parameter_count * sizeof(float));
  l->mix_buf = pcp_diloco_job_malloc(job, d->frag_max * sizeof(float));
  l->verify_values = pcp_diloco_job_malloc(job, d->frag_max * sizeof(float));
  if (!l->tokens || !l->base || !l->mix_buf || !l->verify_values ||
      (job->data_type == PCP_ELEMENT_TYPE_I64 && !l->tokens64)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "learner buffers");
  }
  if (d->int4_down) {
    l->bcast_version = pcp_diloco_job_calloc(job, d->plan.fragment_count,
                                             sizeof(*l->bcast_version));
    l->mix_q = pcp_diloco_job_malloc(job, d->down_q_max);
    if (!l->bcast_version || !l->mix_q) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "learner int4 down buffers");
    }
  }
  memcpy(l->base, job->parameters, job->parameter_count * sizeof(float));
  l->alpha = (float)d->config.learner_alpha;
  l->last_loss = NAN;
  pcp_status_t status = pcp_decoupled_learner_initialize(
      pcp_allocator_system(), (uint16_t)(k + 1), d->plan.fragment_count,
      &l->counters);
  l->counters_ready = !status;
  return status;
}

// The whole train split under slot |k|'s own seed: the sampler of a slot a
// join made (the start's shards are spoken for; random sampling overlaps
// them anyway, a sequential one starts at its own offset).
static pcp_status_t dec_join_assignment(dec_t* d, uint32_t k,
                                        pcp_data_assignment_t* out) {
  job_t* job = d->job;
  char name[32];
  snprintf(name, sizeof(name), "join-%04u", k);
  const char* names[1] = {name};
  return pcp_data_shard_plan(job->dataset, job->train_range,
                             (uint32_t)job->spec.block_size, names, 1, 0,
                             job->seed, out);
}

// Per learner: sampler (shard k of the train split over the learners at
// the start; a joined slot's: dec_join_assignment), token buffers,
// counters, its base (the masters at start) and fragment buffers.
static pcp_status_t dec_learners_setup(dec_t* d) {
  job_t* job = d->job;
  if (!d->shard_count) {
    d->shard_count = d->learner_count;
  }
  const char* names[MAX_ROUND_WORKERS];
  char storage[MAX_ROUND_WORKERS][24];
  for (uint32_t k = 0; k < d->shard_count; ++k) {
    snprintf(storage[k], sizeof(storage[k]), "shard-%04u", k);
    names[k] = storage[k];
  }
  pcp_data_assignment_t* plan =
      pcp_diloco_job_calloc(job, d->shard_count + 1, sizeof(*plan));
  if (!plan) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "shard plan");
  }
  pcp_status_t status = pcp_data_shard_plan(
      job->dataset, job->train_range, (uint32_t)job->spec.block_size, names,
      d->shard_count, 0, job->seed, plan);
  for (uint32_t k = 0; k < d->learner_count && !status; ++k) {
    pcp_data_assignment_t own;
    const pcp_data_assignment_t* a = &plan[k < d->shard_count ? k : 0];
    if (d->learners[k].joined || k >= d->shard_count) {
      d->learners[k].joined = true;
      status = dec_join_assignment(d, k, &own);
      a = &own;
    }
    if (!status) {
      status = dec_learner_alloc(d, k, a);
    }
  }
  pcp_diloco_job_free(job, plan);
  return status;
}

// The plan over the job's parameter table. Tensors whose name says
// embedding (wte, wpe, embed) get role EMBEDDING, for the mixed merges.
static pcp_status_t dec_plan_build(dec_t* d) {
  job_t* job = d->job;
  size_t n = job->table.count;
  pcp_decoupled_tensor_spec_t* specs =
      pcp_diloco_job_calloc(job, n + 1, sizeof(*specs));
  uint32_t* embedding = pcp_diloco_job_calloc(job, n + 1, sizeof(*embedding));
  if (!specs || !embedding) {
    pcp_diloco_job_free(job, specs);
    pcp_diloco_job_free(job, embedding);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "plan specs");
  }
  uint32_t embedding_count = 0;
  for (size_t i = 0; i < n; ++i) {
    const pcp_models_parameter_t* p = &job->table.parameters[i];
    specs[i] =
        (pcp_decoupled_tensor_spec_t){.name = p->name,
                                      .value_count = (uint64_t)p->element_count,
                                      .role = PCP_DECOUPLED_ROLE_UNKNOWN};
    if (strstr(p->name, "wte") || strstr(p->name, "wpe") ||
        strstr(p->name, "embed")) {
      embedding[embedding_count++] = (uint32_t)i;
    }
  }
  pcp_status_t status = pcp_decoupled_plan_initialize(
      pcp_allocator_system(),
      (pcp_decoupled_fragment_strategy_t)d->config.fragment_strategy, specs,
      (uint32_t)n, embedding, embedding_count, d->schedule.fragment_count,
      d->schedule.sync_interval_h, &d->plan);
  pcp_diloco_job_free(job, specs);
  pcp_diloco_job_free(job, embedding);
  PCP_RETURN_IF_ERROR_BARE(status);
  d->plan_ready = true;
  for (uint32_t f = 0; f < d->plan.fragment_count; ++f) {
    if (d->plan.fragments[f].tensor_count > DEC_MAX_FRAGMENT_TENSORS) {
      return pcp_make_status(
          PCP_STATUS_FAILED_PRECONDITION,
          "decoupled fragment %u has %u tensors; a task frame carries at most "
          "%d (key 'decoupled_diloco.num_fragments': use more fragments)",
          f, d->plan.fragments[f].tensor_count, DEC_MAX_FRAGMENT_TENSORS);
    }
    if (d->plan.fragments[f].value_count > d->frag_max) {
      d->frag_max = (size_t)d->plan.fragments[f].value_count;
    }
  }
  return pcp_ok_status();
}

// The int4 down path's state: B = the masters at start (what @init sends;
// version 1 of every fragment), the payload buffer of every fragment and
// the scratch.
static pcp_status_t dec_down_setup(dec_t* d) {
  job_t* job = d->job;
  uint32_t count = d->plan.fragment_count;
  d->bcast = pcp_diloco_job_malloc(job, job->parameter_count * sizeof(float));
  d->bcast_version = pcp_diloco_job_calloc(job, count, sizeof(uint64_t));
  d->down_q_offset = pcp_diloco_job_calloc(job, count, sizeof(size_t));
  d->down_q_size = pcp_diloco_job_calloc(job, count, sizeof(size_t));
  d->down_scratch = pcp_diloco_job_malloc(job, 2 * d->frag_max * sizeof(float));
  if (!d->bcast || !d->bcast_version || !d->down_q_offset || !d->down_q_size ||
      !d->down_scratch) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "int4 down state");
  }
  memcpy(d->bcast, job->parameters, job->parameter_count * sizeof(float));
  size_t total = 0;
  for (uint32_t f = 0; f < count; ++f) {
    const pcp_decoupled_fragment_t* fr = &d->plan.fragments[f];
    size_t bytes = 0;
    for (uint32_t k = 0; k < fr->tensor_count; ++k) {
      size_t n = (size_t)d->plan.tensor_values[fr->tensor_indices[k]];
      size_t one = pcp_decoupled_int4_encoded_size(n, d->block);
      if (one == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "int4 down path: a tensor of %zu values does "
                               "not fit the codec (block %u)",
                               n, d->block);
      }
      bytes += one;
    }
    d->bcast_version[f] = 1;
    d->down_q_offset[f] = total;
    d->down_q_size[f] = bytes;
    total += bytes;
    if (bytes > d->down_q_max) {
      d->down_q_max = bytes;
    }
  }
  d->down_q = pcp_diloco_job_malloc(job, total ? total : 1);
  if (!d->down_q) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "int4 down payloads");
  }
  return pcp_ok_status();
}

// The tape on disk replays to the live syncer state.
static pcp_status_t dec_tape_check(dec_t* d, bool* out_equal) {
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_read_all(
      d->tape_path, PCP_DECOUPLED_TAPE_MAX_BYTES, &data, &length));
  pcp_decoupled_tape_t tape;
  pcp_decoupled_tape_initialize(pcp_allocator_system(), &tape);
  pcp_status_t status = pcp_decoupled_tape_decode(data, length, &tape);
  pcp_allocator_free(pcp_allocator_system(), data);
  pcp_decoupled_syncer_state_t* replayed =
      pcp_diloco_job_calloc(d->job, 1, sizeof(*replayed));
  if (!status && !replayed) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "replay state");
  }
  if (!status) {
    status = pcp_decoupled_syncer_state_replay(
        pcp_allocator_system(), d->plan.fragment_count, &tape, replayed);
    if (!status) {
      *out_equal = pcp_decoupled_syncer_state_equal(replayed, d->state);
      pcp_decoupled_syncer_state_deinitialize(replayed);
    }
  }
  pcp_diloco_job_free(d->job, replayed);
  pcp_decoupled_tape_deinitialize(&tape);
  return status;
}

//===----------------------------------------------------------------------===//
// Joins
//===----------------------------------------------------------------------===//
//
// A worker that connects mid-run (of the job's class and the learners'
// backend and target) becomes a learner, and so does a lost learner's
// worker back on a new connection (a node manager restart; the fabric's
// join_count tells a new connection from the one it was lost on). It keeps
// its slot (learner id, sampler) when it had one; otherwise it takes a new
// slot, at most MAX_ROUND_WORKERS in all (logged once when full). It gets a
// fresh session: @init of every fragment from the masters (FULL_RESYNC:
// the current global values, fresh AdamW moments), LEARNER_RECOVERY on the
// tape, and once synced it is pulled from the next syncer step opened (its
// local step count starts at the syncer steps closed so far).

static void dec_join_ready(dec_t* d, uint32_t li) {
  dec_learner_t* l = &d->learners[li];
  l->joining = false;
  l->first_pull = d->opened_through + 1;
  uint64_t closed = d->next_final > 0 ? d->next_final - 1 : 0;
  if (closed > d->total_steps) {
    closed = d->total_steps;  // in the final rounds: no local step left
  }
  l->step = closed > l->step ? closed : l->step;
  PCP_LOG(PCP_LOG_INFO, &d->job->log,
          "decoupled learner %u (id %u, %s) synced: %u fragments from the "
          "masters, trains from local step %" PRIu64
          ", pulled from syncer step %" PRIu64,
          li, li + 1, l->worker_id, d->plan.fragment_count, l->step + 1,
          l->first_pull);
}

// Admits |info| as learner slot |k| (allocated). |mid_run|: a join (synced
// before it is pulled); otherwise a resumed learner (pulled as at a start).
static pcp_status_t dec_learner_admit(dec_t* d, uint32_t k,
                                      const char* worker_id,
                                      uint32_t join_count, bool mid_run) {
  dec_learner_t* l = &d->learners[k];
  const pcp_diloco_job_options_t* o = d->job->options;
  if (worker_id != l->worker_id) {
    snprintf(l->worker_id, sizeof(l->worker_id), "%s", worker_id);
  }
  snprintf(l->session, sizeof(l->session),
           "%s-decoupled-%u-%" PRIx64 "-a%" PRIu64, o->job_id, k, d->nonce,
           ++d->admissions);
  l->join_count = join_count;
  l->alive = true;
  l->joining = mid_run;
  l->first_pull = 0;
  l->init_next = 0;
  l->seeded_off = false;  // another worker: seeded may work there
  l->adam_step = 0;       // @init sends fresh moments: AdamW restarts at t = 1
  l->send_count = 0;
  l->apply_count = 0;
  l->verify_pending = false;
  l->ready_ns = 0;
  l->last_loss = NAN;
  // Nothing of the old session is held: no resync due, and the broadcast
  // copy's versions unknown (its first @mix of each fragment is f32).
  l->resync_pending = false;
  l->init_mismatch = false;
  l->hash_inputs = 0;
  l->hash_outputs = 0;
  if (l->bcast_version) {
    memset(l->bcast_version, 0,
           d->plan.fragment_count * sizeof(*l->bcast_version));
  }
  if (l->counters_ready) {
    pcp_decoupled_learner_deinitialize(&l->counters);
    l->counters_ready = false;
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_learner_initialize(
      pcp_allocator_system(), (uint16_t)(k + 1), d->plan.fragment_count,
      &l->counters));
  l->counters_ready = true;
  if (mid_run) {
    ++d->joins;
    PCP_LOG(PCP_LOG_INFO, &d->job->log,
            "decoupled learner %u (id %u, %s) joins at syncer step %" PRIu64
            ": full resync of %u fragments, fresh AdamW state",
            k, k + 1, l->worker_id, d->state->global_step,
            d->plan.fragment_count);
  }
  return dec_record(d, PCP_DECOUPLED_EVENT_LEARNER_RECOVERY, k + 1, 0,
                    d->state->global_step);
}

#define DEC_JOIN_POLL_NS 250000000

// Admits the workers that fit and are not live learners (see above).
static pcp_status_t dec_joins_poll(dec_t* d, int64_t now_ns) {
  if (now_ns - d->last_join_poll_ns < DEC_JOIN_POLL_NS) {
    return pcp_ok_status();
  }
  d->last_join_poll_ns = now_ns;
  const pcp_diloco_job_options_t* o = d->job->options;
  uint32_t count =
      pcp_fabric_worker_list(o->fabric, d->infos, MAX_ROUND_WORKERS, NULL);
  for (uint32_t i = 0; i < count; ++i) {
    const pcp_fabric_worker_info_t* info = &d->infos[i];
    if (!dec_worker_fits(d, info)) {
      continue;
    }
    uint32_t k = dec_slot_of(d, info->worker_id);
    if (k < d->learner_count) {
      dec_learner_t* l = &d->learners[k];
      if (l->join_count == info->join_count) {
        continue;  // live, or lost on this connection: a new one rejoins
      }
      if (l->alive) {
        if (l->task) {
          continue;  // its task ends (fails) first; then it rejoins
        }
        // Reconnected while idle: the session it trained in is gone.
        dec_learner_lost(d, k, "reconnected (its session state is gone)");
      }
    } else if (k >= MAX_ROUND_WORKERS) {
      if (!d->full_logged) {
        PCP_LOG(PCP_LOG_WARN, &d->job->log,
                "decoupled: worker %s not admitted: all %d learner slots are "
                "taken",
                info->worker_id, MAX_ROUND_WORKERS);
        d->full_logged = true;
      }
      continue;
    } else {
      pcp_data_assignment_t a;
      d->learners[k].joined = true;
      d->learner_count = k + 1;
      PCP_RETURN_IF_ERROR_BARE(dec_join_assignment(d, k, &a));
      PCP_RETURN_IF_ERROR_BARE(dec_learner_alloc(d, k, &a));
    }
    PCP_RETURN_IF_ERROR_BARE(
        dec_learner_admit(d, k, info->worker_id, info->join_count, true));
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Checkpoints and resume
//===----------------------------------------------------------------------===//
//
// At checkpoint_every outer steps (syncs + skipped rounds; the round just
// closed) and at the end, a checkpoint of cursor kind CURSOR_KIND_DECOUPLED:
// the masters and the per-fragment outer Nesterov velocity in the image,
// and in the cursor's "decoupled" object the schedule, the syncer's
// counters (and the replayed state's fields a restart compares), every
// learner's slot (worker id, step, counters, sampler cursor) and the tape
// as a side file decoupled-tape-<step>.workers (written atomically, named
// with its SHA-256). A restarted gateway reads it back (job_resume hands
// the object over), replays the tape (it must give the checkpoint's
// state), gives the workers back their slots, and carries out the recovery
// plan (pcp_decoupled_recovery_*): every learner's worker state is gone
// with the old sessions, so each live one is resynced in full whatever the
// plan's kind for it (logged beside it), MARK_FAILED learners are recorded
// failed, REPULL fragments are pulled again as their rounds reopen: the
// learners restart at the checkpoint's syncer step, and the rounds after it
// run again (their earlier events are superseded).

static json_t* dec_u64_array(const uint64_t* values, uint32_t count) {
  json_t* a = json_array();
  for (uint32_t k = 0; k < count && a; ++k) {
    json_array_append_new(a, json_integer((json_int_t)values[k]));
  }
  return a;
}

// The fields of the syncer state a resume compares with its replay.
static json_t* dec_state_json(const dec_t* d,
                              const pcp_decoupled_syncer_state_t* s) {
  // The learners the tape names (the rest are all zero): [id, status,
  // last applied step, last learner step].
  (void)d;
  json_t* learners = json_array();
  for (uint32_t k = 0; k < PCP_DECOUPLED_MAX_LEARNERS && learners; ++k) {
    const pcp_decoupled_syncer_learner_t* l = &s->learners[k];
    if (l->status || l->last_applied_step || l->last_learner_step) {
      json_array_append_new(learners,
                            json_pack("[i, i, I, I]", (int)k, (int)l->status,
                                      (json_int_t)l->last_applied_step,
                                      (json_int_t)l->last_learner_step));
    }
  }
  return json_pack("{s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "global_step",
                   (json_int_t)s->global_step, "participants_total",
                   (json_int_t)s->participants_total, "in_flight_count",
                   (json_int_t)s->in_flight_count, "syncer_clock",
                   (json_int_t)pcp_decoupled_clock_get(&s->clock, 0),
                   "fragment_versions",
                   dec_u64_array(s->fragment_versions, s->fragment_count),
                   "fragment_last_step",
                   dec_u64_array(s->fragment_last_step, s->fragment_count),
                   "learners", learners ? learners : json_array());
}

// Learner |k|'s sampler cursor as it was after local step
// min(next_final - 1, its last completed step): a resume puts every
// learner at syncer step next_final - 1, and a learner runs up to
// overlap_tau steps past it (plus the step in flight) whose batches were
// never merged, so the resume must draw them again (finding 5). The
// cursor before step c + 1 was kept when that step was submitted.
static void dec_checkpoint_cursor(dec_t* d, uint32_t k,
                                  pcp_data_cursor_t* out_cursor) {
  const dec_learner_t* l = &d->learners[k];
  uint64_t at = d->next_final > 0 ? d->next_final - 1 : 0;
  uint64_t c = l->step < at ? l->step : at;
  pcp_data_sampler_cursor(l->sampler, out_cursor);
  bool drawn_past = l->step > c || (l->task && l->task_kind == TASK_STEP);
  if (!drawn_past) {
    return;  // the current cursor is the one after step c
  }
  const dec_cursor_at_t* e =
      l->cursor_ring ? &l->cursor_ring[c % l->cursor_ring_size] : NULL;
  if (e && e->used && e->step == c) {
    *out_cursor = e->cursor;
    return;
  }
  PCP_LOG(PCP_LOG_WARN, &d->job->log,
          "decoupled learner %u: no sampler cursor kept for step %" PRIu64
          " (at local step %" PRIu64
          "); its checkpoint keeps the current one, a resume skips the "
          "batches in between",
          k, c, l->step);
}

static pcp_status_t dec_checkpoint(dec_t* d) {
  job_t* job = d->job;
  const pcp_diloco_job_options_t* o = job->options;
  d->last_checkpoint_step = job->outer_step;
  pcp_store_checkpoint_t row;
  pcp_status_t status = pcp_store_checkpoint_get(
      o->store, o->job_id, (int64_t)job->outer_step, &row);
  if (!status) {
    // Indexed before a restart: that one is kept (its tape file too), this
    // run's state of the same step only exported.
    return pcp_diloco_job_model_export(job);
  }
  if (pcp_status_code(status) != PCP_STATUS_NOT_FOUND) {
    return status;
  }
  pcp_status_ignore(status);
  uint8_t* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_tape_encode(&d->tape, &data, &length));
  char name[64];
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  status = pcp_diloco_job_state_file_write(job, "decoupled-tape", data, length,
                                           name, hex);
  if (!status) {
    // The compaction point of the job's own tape file (dec_tape_write): the
    // same bytes, rewritten whole and fsynced.
    status = pcp_file_write_atomic(d->tape_path, data, length);
    d->tape_written = status ? 0 : d->tape.count;
  }
  pcp_allocator_free(d->tape.allocator, data);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* learners = json_array();
  char text[PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1];
  for (uint32_t k = 0; k < d->learner_count && learners; ++k) {
    const dec_learner_t* l = &d->learners[k];
    pcp_data_cursor_t cursor;
    dec_checkpoint_cursor(d, k, &cursor);
    pcp_data_cursor_format(&cursor, text, sizeof(text));
    json_t* slot = json_pack(
        "{s:s, s:b, s:b, s:I, s:o, s:s, s:I, s:I, s:o, s:o}", "worker_id",
        l->worker_id, "alive", l->alive && !l->joining, "joined", l->joined,
        "step", (json_int_t)l->step, "loss",
        pcp_diloco_json_number_or_null(l->last_loss), "sampler", text,
        "learner_step", (json_int_t)l->counters.learner_step,
        "observed_global_step", (json_int_t)l->counters.observed_global_step,
        "steps_since",
        dec_u64_array(l->counters.steps_since, d->plan.fragment_count),
        "tokens_since",
        dec_u64_array(l->counters.tokens_since, d->plan.fragment_count));
    if (slot) {
      // Informational (not read back: a resume resets it with the
      // moments): AdamW's t, steps since its last @init.
      json_object_set_new(slot, "adam_step",
                          json_integer((json_int_t)l->adam_step));
    }
    json_array_append_new(learners, slot);
  }
  json_t* c = json_pack(
      "{s:I, s:I, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, "
      "s:I, s:I, s:I, s:I}",
      "fragments", (json_int_t)d->schedule.fragment_count, "sync_interval_h",
      (json_int_t)d->schedule.sync_interval_h, "overlap_tau",
      (json_int_t)d->schedule.overlap_tau, "compression",
      d->int4 ? "int4" : "none", "backend", d->backend, "target", d->target,
      "next_final", (json_int_t)d->next_final, "syncs", (json_int_t)d->syncs,
      "skipped_rounds", (json_int_t)d->skipped_rounds, "dropped_pulls",
      (json_int_t)d->dropped_pulls, "tokens_computed",
      (json_int_t)d->tokens_computed, "joins", (json_int_t)d->joins,
      "tokens_merged", d->tokens_merged, "delta_bytes_total",
      (json_int_t)d->up_bytes_total, "fragment_bytes_down_total",
      (json_int_t)d->down_bytes_total, "shards", (json_int_t)d->shard_count,
      "tape_bytes", (json_int_t)length);
  if (!c || !learners) {
    json_decref(c);
    json_decref(learners);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "decoupled cursor");
  }
  json_object_set_new(c, "learners", learners);
  // What the tape's fragment ids and the merges depend on, checked at a
  // resume (dec_resume_keys_check).
  json_object_set_new(c, "fragment_strategy",
                      json_integer(d->config.fragment_strategy));
  json_object_set_new(c, "merge_strategy",
                      json_integer(d->config.merge_strategy));
  json_object_set_new(c, "int4_block_size",
                      json_integer((json_int_t)d->config.int4_block_size));
  json_object_set_new(c, "tape_file", json_string(name));
  json_object_set_new(c, "tape_sha256", json_string(hex));
  json_object_set_new(c, "tape_events",
                      json_integer((json_int_t)d->tape.count));
  json_t* state = dec_state_json(d, d->state);
  if (state) {
    json_object_set_new(c, "syncer", state);
  }
  job->stream_cursor = c;
  // The image's velocity is the syncer's (per fragment, parameter order).
  memcpy(job->nesterov.velocity, d->nesterov.velocity,
         job->parameter_count * sizeof(float));
  status = pcp_diloco_job_checkpoint_write(job);
  json_decref(job->stream_cursor);
  job->stream_cursor = NULL;
  if (!status) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "decoupled checkpoint at syncer step %" PRIu64
            " (outer step %" PRIu64 "): %u learners, tape of %" PRIu64
            " records (%zu bytes, %s)",
            d->next_final - 1, job->outer_step, d->learner_count, d->tape.count,
            length, name);
  }
  return status;
}

static pcp_status_t dec_resume_error(const char* what) {
  return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                         "decoupled checkpoint: %s", what);
}

// The learners' slots of the resumed cursor (before the workers are
// gathered: each gets its slot back): worker ids, sampler cursors, the
// backend and target, the start's shard count.
static pcp_status_t dec_resume_slots(dec_t* d) {
  json_t* c = d->job->stream_resume;
  const char* backend = json_string_value(json_object_get(c, "backend"));
  const char* target = json_string_value(json_object_get(c, "target"));
  json_t* learners = json_object_get(c, "learners");
  size_t count = json_array_size(learners);
  json_int_t shards = json_integer_value(json_object_get(c, "shards"));
  if (!backend || !target || strlen(backend) >= sizeof(d->backend) ||
      strlen(target) >= sizeof(d->target) || count < 1 ||
      count > MAX_ROUND_WORKERS || shards < 1 || shards > (json_int_t)count ||
      !json_is_object(json_object_get(c, "syncer"))) {
    return dec_resume_error("malformed cursor (backend, learners, shards)");
  }
  snprintf(d->backend, sizeof(d->backend), "%s", backend);
  snprintf(d->target, sizeof(d->target), "%s", target);
  d->shard_count = (uint32_t)shards;
  for (size_t k = 0; k < count; ++k) {
    json_t* w = json_array_get(learners, k);
    dec_learner_t* l = &d->learners[k];
    const char* id = json_string_value(json_object_get(w, "worker_id"));
    const char* sampler = json_string_value(json_object_get(w, "sampler"));
    if (!id || !id[0] || strlen(id) >= sizeof(l->worker_id) || !sampler) {
      return dec_resume_error("malformed learner entry");
    }
    pcp_status_t parsed =
        pcp_data_cursor_parse(pcp_make_cstring_view(sampler), &l->cursor);
    if (parsed) {
      pcp_status_ignore(parsed);
      return dec_resume_error("malformed learner sampler cursor");
    }
    snprintf(l->worker_id, sizeof(l->worker_id), "%s", id);
    l->has_cursor = true;
    l->joined = json_is_true(json_object_get(w, "joined"));
    l->was_alive = json_is_true(json_object_get(w, "alive"));
    l->join_count = UINT32_MAX;  // any connection of the new gateway
  }
  d->learner_count = (uint32_t)count;
  d->resumed = true;
  return pcp_ok_status();
}

// The decoupled_diloco keys a resume must not change besides P, H,
// overlap_tau and compression: the tape's per-fragment versions and REPULL
// fragment ids refer to the fragmentation, and the merge and the int4
// blocks to the rest. A checkpoint without a key (older) is not checked
// for it.
static pcp_status_t dec_resume_keys_check(dec_t* d, json_t* c) {
  struct {
    const char* key;
    json_int_t value;
  } keys[] = {
      {"fragment_strategy", d->config.fragment_strategy},
      {"merge_strategy", d->config.merge_strategy},
      {"int4_block_size", (json_int_t)d->config.int4_block_size},
  };
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); ++i) {
    json_t* v = json_object_get(c, keys[i].key);
    if (!v) {
      continue;
    }
    if (!json_is_integer(v) || json_integer_value(v) != keys[i].value) {
      return pcp_make_status(
          PCP_STATUS_FAILED_PRECONDITION,
          "decoupled checkpoint of another key 'decoupled_diloco.%s' (%lld "
          "there, %lld in this job; for the enums: the index of the value "
          "in decoupled.h): a resume must keep it",
          keys[i].key, (long long)json_integer_value(v),
          (long long)keys[i].value);
    }
  }
  return pcp_ok_status();
}

// Reads the resumed cursor (job->stream_resume): checks it against this
// job's schedule, restores the counters and the learners' slots, and loads
// the tape side file (SHA-256 checked) into d->tape. The plan must be
// built (fragment count).
static pcp_status_t dec_resume_load(dec_t* d) {
  job_t* job = d->job;
  json_t* c = job->stream_resume;
  json_int_t fragments = json_integer_value(json_object_get(c, "fragments"));
  json_int_t h = json_integer_value(json_object_get(c, "sync_interval_h"));
  json_int_t tau = json_integer_value(json_object_get(c, "overlap_tau"));
  const char* compression =
      json_string_value(json_object_get(c, "compression"));
  if (fragments != (json_int_t)d->schedule.fragment_count ||
      h != (json_int_t)d->schedule.sync_interval_h ||
      tau != (json_int_t)d->schedule.overlap_tau || !compression ||
      strcmp(compression, d->int4 ? "int4" : "none") != 0) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "decoupled checkpoint of P=%lld H=%lld overlap_tau=%lld compression=%s;"
        " this job has P=%u H=%u overlap_tau=%u compression=%s",
        (long long)fragments, (long long)h, (long long)tau,
        compression ? compression : "?", d->schedule.fragment_count,
        d->schedule.sync_interval_h, d->schedule.overlap_tau,
        d->int4 ? "int4" : "none");
  }
  PCP_RETURN_IF_ERROR_BARE(dec_resume_keys_check(d, c));
  json_int_t next_final = json_integer_value(json_object_get(c, "next_final"));
  // A checkpoint taken in the final sync rounds (syncer steps past S) has
  // merges this job's schedule would not have without final_sync: name the
  // key rather than call the cursor malformed.
  if (!d->config.final_sync && next_final > (json_int_t)d->total_steps + 1) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "decoupled checkpoint taken in the final sync rounds (syncer step "
        "%lld, after the last local step %" PRIu64
        "); this job has 'decoupled_diloco.final_sync' false: resume it "
        "with final_sync true",
        (long long)(next_final - 1), d->total_steps);
  }
  json_int_t syncs = json_integer_value(json_object_get(c, "syncs"));
  json_int_t skipped = json_integer_value(json_object_get(c, "skipped_rounds"));
  const char* name = json_string_value(json_object_get(c, "tape_file"));
  const char* hex = json_string_value(json_object_get(c, "tape_sha256"));
  if (next_final < 2 || (uint64_t)next_final > d->sync_end + 1 || syncs < 0 ||
      skipped < 0 || (uint64_t)(syncs + skipped) != job->outer_step || !hex ||
      strlen(hex) != PCP_SHA256_HEX_LENGTH) {
    return dec_resume_error(
        "malformed cursor (syncer step, or syncs and skipped rounds against "
        "the outer step)");
  }
  // A plain file name beside the checkpoint, nothing else.
  if (!name || !name[0] || name[0] == '.' || strchr(name, '/') ||
      strlen(name) > 128) {
    return dec_resume_error("bad tape file name");
  }
  d->next_final = (uint64_t)next_final;
  d->opened_through = d->next_final - 1;
  d->syncs = (uint64_t)syncs;
  d->skipped_rounds = (uint64_t)skipped;
  d->dropped_pulls =
      (uint64_t)json_integer_value(json_object_get(c, "dropped_pulls"));
  d->tokens_computed =
      (uint64_t)json_integer_value(json_object_get(c, "tokens_computed"));
  d->tokens_merged = json_number_value(json_object_get(c, "tokens_merged"));
  d->up_bytes_total =
      (uint64_t)json_integer_value(json_object_get(c, "delta_bytes_total"));
  d->down_bytes_total = (uint64_t)json_integer_value(
      json_object_get(c, "fragment_bytes_down_total"));
  d->joins = (uint64_t)json_integer_value(json_object_get(c, "joins"));
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    // Every learner restarts at the checkpoint's syncer step (at S in the
    // final rounds, which run no local step).
    d->learners[k].step =
        d->next_final - 1 < d->total_steps ? d->next_final - 1 : d->total_steps;
  }
  char path[1500];
  snprintf(path, sizeof(path), "%s/%s", job->stream_resume_dir, name);
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(path, PCP_DECOUPLED_TAPE_MAX_BYTES, &data, &length);
  if (status) {
    pcp_status_t wrapped = pcp_make_status(PCP_STATUS_DATA_LOSS,
                                           "decoupled checkpoint's tape %s: %s",
                                           path, pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  char got[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, got);
  if (strcmp(got, hex) != 0) {
    pcp_allocator_free(pcp_allocator_system(), data);
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "decoupled checkpoint's tape %s does not match its "
                           "checkpoint (SHA-256 %s, expected %s)",
                           path, got, hex);
  }
  status = pcp_decoupled_tape_decode(data, length, &d->tape);
  pcp_allocator_free(pcp_allocator_system(), data);
  d->resumed = true;
  d->resumed_at = d->next_final - 1;
  return status;
}

// Replays the resumed tape into d->state (initialized here) and compares
// it with the state the checkpoint recorded: DATA_LOSS when they differ.
static pcp_status_t dec_resume_replay(dec_t* d) {
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_syncer_state_replay(
      pcp_allocator_system(), d->plan.fragment_count, &d->tape, d->state));
  json_t* replayed = dec_state_json(d, d->state);
  json_t* recorded = json_object_get(d->job->stream_resume, "syncer");
  d->resume_replay_ok = replayed && recorded && json_equal(replayed, recorded);
  json_decref(replayed);
  if (!d->resume_replay_ok) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "decoupled checkpoint: its tape (%" PRIu64
                           " records) does not replay to the syncer state it "
                           "recorded",
                           d->tape.count);
  }
  return pcp_ok_status();
}

static const char* dec_action_name(int32_t kind) {
  switch (kind) {
    case PCP_DECOUPLED_RECOVERY_RESUME:
      return "resume";
    case PCP_DECOUPLED_RECOVERY_CATCH_UP:
      return "catch_up";
    case PCP_DECOUPLED_RECOVERY_FULL_RESYNC:
      return "full_resync";
    case PCP_DECOUPLED_RECOVERY_MARK_FAILED:
      return "mark_failed";
    case PCP_DECOUPLED_RECOVERY_REPULL:
      return "repull";
    default:
      return "?";
  }
}

// The recovery plan of the resumed syncer over the learners back now, and
// its execution (see above); a training.decoupled.resumed event lists it.
static pcp_status_t dec_recover(dec_t* d) {
  job_t* job = d->job;
  pcp_decoupled_live_learner_t live[MAX_ROUND_WORKERS];
  uint32_t live_count = 0;
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    if (d->learners[k].alive) {
      // Its worker's copy went with the old sessions: nothing observed.
      live[live_count++] = (pcp_decoupled_live_learner_t){
          .learner_id = k + 1, .observed_global_step = 0};
    }
  }
  pcp_decoupled_recovery_plan_t plan;
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_recovery_plan_initialize(
      pcp_allocator_system(), d->state, &d->tape, live, live_count,
      (uint64_t)d->config.max_recovery_syncer_steps, &plan));
  json_t* actions = json_array();
  pcp_status_t status = pcp_ok_status();
  for (uint32_t a = 0; a < plan.action_count && !status; ++a) {
    const pcp_decoupled_recovery_action_t* action = &plan.actions[a];
    const char* kind = dec_action_name(action->kind);
    const char* done = kind;
    if (action->kind == PCP_DECOUPLED_RECOVERY_MARK_FAILED) {
      status = dec_record(d, PCP_DECOUPLED_EVENT_LEARNER_FAILURE,
                          action->learner_id, 0, d->state->global_step);
    } else if (action->kind != PCP_DECOUPLED_RECOVERY_REPULL) {
      uint32_t k = action->learner_id - 1;
      done = "full_resync";
      status = dec_learner_admit(d, k, d->learners[k].worker_id,
                                 d->learners[k].join_count, false);
    }
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "decoupled recovery at syncer step %" PRIu64
            ": %s learner %u fragment %u (%u fragments listed), carried out "
            "as %s",
            d->state->global_step, kind, action->learner_id,
            action->fragment_id, action->fragment_count, done);
    json_array_append_new(
        actions, json_pack("{s:s, s:s, s:i, s:i, s:i}", "planned", kind, "done",
                           done, "learner", (int)action->learner_id, "fragment",
                           (int)action->fragment_id, "fragments",
                           (int)action->fragment_count));
  }
  pcp_decoupled_recovery_plan_deinitialize(&plan);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* event = json_pack(
      "{s:I, s:I, s:I, s:b, s:I, s:o}", "syncer_step",
      (json_int_t)d->resumed_at, "outer_step", (json_int_t)job->outer_step,
      "tape_records", (json_int_t)d->tape.count, "tape_replayed",
      d->resume_replay_ok, "learners", (json_int_t)live_count, "actions",
      actions ? actions : json_array());
  if (event) {
    pcp_status_ignore(
        pcp_store_job_event_append(job->options->store, job->options->job_id,
                                   "training.decoupled.resumed", event, NULL));
    json_decref(event);
  }
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "decoupled resumed at syncer step %" PRIu64 " (outer step %" PRIu64
          "): tape of %" PRIu64
          " records replayed to the checkpoint's state, "
          "%u learners back",
          d->resumed_at, job->outer_step, d->tape.count, live_count);
  return dec_tape_write(d, true);
}

static pcp_status_t dec_loop(dec_t* d) {
  job_t* job = d->job;
  pcp_status_t status = pcp_ok_status();
  if (!d->next_final) {
    d->next_final = 1;  // a resume starts after its checkpoint's step
  }
  d->last_event_ns = dec_now_ns(d);
  pcp_diloco_job_bytes_mark(job);
  for (;;) {
    if (pcp_diloco_job_should_stop(job)) {
      return pcp_make_status(PCP_STATUS_CANCELLED,
                             "training stopped at syncer step %" PRIu64,
                             d->next_final);
    }
    int64_t now = dec_now_ns(d);
    for (uint32_t k = 0; k < d->learner_count && !status; ++k) {
      dec_learner_t* l = &d->learners[k];
      if (l->task && pcp_fabric_task_is_done(l->task)) {
        status = dec_task_done(d, k, now);
      }
    }
    // The final rounds' virtual steps open as rounds close (dec_open);
    // after a resume in them too (learners back at S, no step to run).
    for (uint32_t k = 0;
         k < d->learner_count && d->opened_through < d->sync_end; ++k) {
      const dec_learner_t* l = &d->learners[k];
      if (l->alive && !l->joining && l->step >= d->total_steps) {
        dec_open(d, l->step);
      }
    }
    // Rounds close in syncer-step order.
    while (!status && d->next_final <= d->sync_end) {
      uint32_t fragment = 0;
      if (!pcp_decoupled_schedule_fragment_at(&d->schedule, d->next_final,
                                              &fragment)) {
        ++d->next_final;
        continue;
      }
      dec_round_t* r = dec_round_find(d, d->next_final, false);
      if (!r || !r->opened) {
        if (d->next_final > d->opened_through ||
            dec_step_awaited(d, d->next_final)) {
          break;
        }
        // Pulled, and nobody left to answer: skipped (not opened, so
        // dec_finalize merges nothing).
        if (!r) {
          r = dec_round_find(d, d->next_final, true);
          if (!r) {
            break;  // every round slot busy: again at the next poll
          }
          r->fragment = fragment;
        }
        PCP_LOG(PCP_LOG_WARN, &job->log,
                "decoupled syncer step %" PRIu64
                ": every learner pulled for it was lost before its delta; "
                "skipped",
                d->next_final);
      } else if (pcp_decoupled_round_poll(&r->machine, dec_ms(d, now)) ==
                 PCP_DECOUPLED_ROUND_COLLECTING) {
        break;
      }
      status = dec_finalize(d, r, now);
      r->used = false;
      ++d->next_final;
      int64_t every = job->config.checkpoint_every;
      if (!status && every > 0 && job->outer_step % (uint64_t)every == 0 &&
          job->outer_step != d->last_checkpoint_step) {
        status = dec_checkpoint(d);
      }
    }
    if (!status) {
      status = dec_joins_poll(d, now);
    }
    uint32_t alive = 0;
    bool busy = false;
    for (uint32_t k = 0; k < d->learner_count && !status; ++k) {
      dec_learner_t* l = &d->learners[k];
      if (!l->alive) {
        continue;
      }
      ++alive;
      if (!l->task) {
        status = dec_learner_next(d, k, now);
      }
      busy |= l->task != NULL || l->apply_count || l->send_count ||
              l->resync_pending ||
              (l->step < d->total_steps && !dec_step_wasted(d, k));
    }
    PCP_RETURN_IF_ERROR_BARE(status);
    if (!alive) {
      return pcp_make_status(PCP_STATUS_ABORTED,
                             "every decoupled learner was lost by syncer step "
                             "%" PRIu64,
                             d->next_final);
    }
    if (!busy && d->next_final > d->sync_end) {
      return pcp_ok_status();
    }
    // A round whose learners all reported (or a lost learner's) may be
    // waiting on the last ones forever: a quorum round times out, and a
    // learner that ran its steps but was never heard from is lost already.
    struct timespec nap = {0, DEC_POLL_NS};
    nanosleep(&nap, NULL);
  }
}

pcp_status_t pcp_diloco_decoupled_run(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  dec_t* d = pcp_diloco_job_calloc(job, 1, sizeof(*d));
  if (!d) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "decoupled state");
  }
  d->job = job;
  // First: a resume loads its checkpoint's tape before the rest is set up.
  pcp_decoupled_tape_initialize(pcp_allocator_system(), &d->tape);
  pcp_status_t status = dec_config_parse(d);
  bool config_ready = !status;
  d->nonce = (uint64_t)pcp_clock_now_ns(o->clock) & 0xffffffffffull;
  if (!status && job->stream_resume) {
    status = dec_resume_slots(d);
  }
  if (!status) {
    status = dec_learners_gather(d);
  }
  pcp_decoupled_grace_config_t grace;
  if (!status) {
    status = pcp_decoupled_config_resolve(&d->config, d->learner_count,
                                          (uint64_t)job->config.tau,
                                          &d->schedule, &grace);
  }
  if (!status && (d->schedule.fragment_count > DEC_MAX_FRAGMENTS ||
                  d->schedule.overlap_tau > DEC_MAX_OPEN - 2)) {
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "decoupled_diloco in the service: num_fragments at most %d and "
        "overlap_tau at most %d (got %u and %u)",
        DEC_MAX_FRAGMENTS, DEC_MAX_OPEN - 2, d->schedule.fragment_count,
        d->schedule.overlap_tau);
  }
  if (!status) {
    d->grace.config = grace;
    d->total_steps = (uint64_t)job->config.outer_loop_steps;
    // The inner rate schedule runs over a learner's local steps, which are
    // the syncer steps here (outer_loop_steps), not outer_loop_steps x tau
    // as the job set it up for classic rounds: a cosine over that length
    // barely decayed in a decoupled run.
    pcp_diloco_lr_schedule_initialize(&job->config, d->total_steps,
                                      &job->schedule);
    d->sync_end = pcp_decoupled_schedule_last_step(
        &d->schedule, d->total_steps, d->config.final_sync, &d->final_rounds);
    for (uint64_t s = 1; s <= d->sync_end; ++s) {
      uint32_t f;
      d->scheduled += pcp_decoupled_schedule_fragment_at(&d->schedule, s, &f);
    }
    status = dec_plan_build(d);
  }
  if (!status) {
    status = pcp_decoupled_nesterov_initialize(
        pcp_allocator_system(), job->parameter_count,
        (float)d->config.outer_learning_rate,
        (float)job->config.nesterov_momentum, &d->nesterov);
    d->nesterov_ready = !status;
  }
  if (!status && job->stream_resume) {
    // The checkpoint's velocity (job_resume restored the image).
    memcpy(d->nesterov.velocity, job->nesterov.velocity,
           job->parameter_count * sizeof(float));
    status = dec_resume_load(d);
  }
  d->state = pcp_diloco_job_calloc(job, 1, sizeof(*d->state));
  d->rounds = pcp_diloco_job_calloc(job, DEC_MAX_OPEN, sizeof(*d->rounds));
  d->names =
      pcp_diloco_job_calloc(job, 4 * job->table.count + 1, sizeof(*d->names));
  d->fragment_hash = pcp_diloco_job_calloc(
      job, (size_t)d->schedule.fragment_count + 1, sizeof(*d->fragment_hash));
  bool state_ready = false;
  if (!status && (!d->state || !d->rounds || !d->names || !d->fragment_hash)) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "decoupled state");
  }
  d->infos = pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS, sizeof(*d->infos));
  if (!status && !d->infos) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  if (!status && d->resumed) {
    status = dec_resume_replay(d);
    state_ready = !status;
  } else if (!status) {
    status = pcp_decoupled_syncer_state_initialize(
        pcp_allocator_system(), d->plan.fragment_count, d->state);
    state_ready = !status;
  }
  if (!status) {
    d->grad = pcp_diloco_job_malloc(job, d->frag_max * sizeof(float));
    d->before = pcp_diloco_job_malloc(job, d->frag_max * sizeof(float));
    if (!d->grad || !d->before) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "round buffers");
    }
  }
  if (!status) {
    for (size_t i = 0; i < job->table.count; ++i) {
      snprintf(d->names[4 * i + 0], 24, "p%u", (unsigned)i);
      snprintf(d->names[4 * i + 1], 24, "m%u", (unsigned)i);
      snprintf(d->names[4 * i + 2], 24, "v%u", (unsigned)i);
      snprintf(d->names[4 * i + 3], 24, "s%u", (unsigned)i);
    }
    snprintf(d->tape_path, sizeof(d->tape_path), "%s/decoupled.tape", job->dir);
    // Test hook: PCP_DECOUPLED_TEST_DELAY="<learner>:<ms>:<until step>"
    // keeps that learner busy for <ms> before each of its local steps up
    // to <until> (no task at all then, pulls included): a slow learner
    // without a slow machine.
    d->delay_learner = UINT32_MAX;
    const char* delay = getenv("PCP_DECOUPLED_TEST_DELAY");
    unsigned learner = 0, until = 0;
    long ms = 0;
    if (delay && sscanf(delay, "%u:%ld:%u", &learner, &ms, &until) == 3 &&
        ms > 0 && ms <= 60000) {
      d->delay_learner = learner;
      d->delay_ms = ms;
      d->delay_until = until;
      PCP_LOG(PCP_LOG_WARN, &job->log,
              "test hook: decoupled learner %u slowed by %ld ms per step "
              "until step %u",
              learner, ms, until);
    }
    // Test hook: PCP_DECOUPLED_TEST_LOSE_PULL="<syncer step>" queues no
    // pull for that step, as if every learner pulled for it were lost
    // before answering (and back on a new connection, so pulled only from
    // later steps): the round never opens, and the finalize loop must skip
    // it rather than wait forever.
    const char* lose = getenv("PCP_DECOUPLED_TEST_LOSE_PULL");
    unsigned lose_step = 0;
    if (lose && sscanf(lose, "%u", &lose_step) == 1 && lose_step > 0) {
      d->lose_pull_step = lose_step;
      PCP_LOG(PCP_LOG_WARN, &job->log,
              "test hook: no learner answers syncer step %u's pull", lose_step);
    }
    if (d->int4_down) {
      status = dec_down_setup(d);
    }
  }
  if (!status) {
    status = dec_learners_setup(d);
  }
  if (!status) {
    status = dec_programs(d);
  }
  if (!status && d->resumed) {
    status = dec_recover(d);
  }
  if (!status && o->hooks.phase) {
    status = o->hooks.phase(o->hooks.user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  if (!status) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "decoupled DiLoCo: %u learners, P=%u H=%u overlap_tau=%u "
            "min_quorum=%" PRId64 " merge=%d compression=%s, %" PRIu64
            " local steps, %" PRIu64 " syncer steps (%" PRIu64
            " scheduled, %u of them final rounds)",
            d->learner_count, d->schedule.fragment_count,
            d->schedule.sync_interval_h, d->schedule.overlap_tau,
            d->config.min_quorum, (int)d->config.merge_strategy,
            d->int4 ? "int4" : "none", d->total_steps, d->sync_end,
            d->scheduled, d->final_rounds);
    status = dec_loop(d);
  }
  bool replayed = false;
  if (!status) {
    // The applies after the last round are on the tape too (rewritten
    // whole and fsynced: the end of the run).
    status = dec_tape_write(d, true);
  }
  if (!status) {
    status = dec_tape_check(d, &replayed);
    if (!status && !replayed) {
      status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "the decoupled tape %s does not replay to the "
                               "syncer's state",
                               d->tape_path);
    }
  }
  if (!status) {
    json_t* summary = dec_totals_json(d);
    if (summary) {
      json_object_set_new(summary, "tape_replayed", json_boolean(replayed));
      // After the last @mix: every hash the run asked for was compared.
      dec_progress_measured(d, summary);
      json_object_set_new(summary, "tape", json_string(d->tape_path));
      json_object_set_new(summary, "loss",
                          pcp_diloco_json_number_or_null(job->last_loss));
      pcp_status_ignore(pcp_store_job_event_append(
          o->store, o->job_id, "training.decoupled", summary, NULL));
      PCP_LOG(PCP_LOG_INFO, &job->log,
              "decoupled done: %" PRIu64 " syncs, %" PRIu64
              " skipped, tokens computed %" PRIu64
              " merged %.0f, delta bytes %" PRIu64 ", tape replayed",
              d->syncs, d->skipped_rounds, d->tokens_computed, d->tokens_merged,
              d->up_bytes_total);
      json_decref(summary);
    }
    // The final checkpoint (the tape with the last applies), unless the
    // last round's was written already; it exports the model too.
    status = d->last_checkpoint_step == job->outer_step
                 ? pcp_diloco_job_model_export(job)
                 : dec_checkpoint(d);
  }
  // Tasks still out (a failure or a stop mid-step) are cancelled and
  // waited for: they borrow this run's buffers.
  pcp_fabric_task_t* tasks[MAX_ROUND_WORKERS];
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    tasks[k] = d->learners[k].task;
    if (tasks[k]) {
      pcp_fabric_task_cancel(tasks[k]);
    }
  }
  if (d->learner_count) {
    (void)pcp_diloco_job_tasks_wait(job, tasks, d->learner_count,
                                    SHORT_WAIT_MIN_MS, "decoupled tasks");
  }
  for (uint32_t k = 0; k < d->learner_count; ++k) {
    dec_learner_t* l = &d->learners[k];
    pcp_fabric_task_release(l->task);
    pcp_data_sampler_release(l->sampler);
    pcp_diloco_job_free(job, l->tokens);
    pcp_diloco_job_free(job, l->tokens64);
    pcp_diloco_job_free(job, l->base);
    pcp_diloco_job_free(job, l->mix_buf);
    pcp_diloco_job_free(job, l->verify_values);
    pcp_diloco_job_free(job, l->bcast_version);
    pcp_diloco_job_free(job, l->mix_q);
    pcp_diloco_job_free(job, l->cursor_ring);
    if (l->counters_ready) {
      pcp_decoupled_learner_deinitialize(&l->counters);
    }
  }
  for (uint32_t k = 0; d->rounds && k < DEC_MAX_OPEN; ++k) {
    pcp_diloco_job_free(job, d->rounds[k].values);
  }
  pcp_diloco_job_free(job, d->rounds);
  pcp_diloco_job_free(job, d->grad);
  pcp_diloco_job_free(job, d->before);
  pcp_diloco_job_free(job, d->names);
  pcp_diloco_job_free(job, d->fragment_hash);
  pcp_diloco_job_free(job, d->infos);
  pcp_diloco_job_free(job, d->bcast);
  pcp_diloco_job_free(job, d->bcast_version);
  pcp_diloco_job_free(job, d->down_q);
  pcp_diloco_job_free(job, d->down_q_offset);
  pcp_diloco_job_free(job, d->down_q_size);
  pcp_diloco_job_free(job, d->down_scratch);
  if (state_ready) {
    pcp_decoupled_syncer_state_deinitialize(d->state);
  }
  pcp_diloco_job_free(job, d->state);
  pcp_decoupled_tape_deinitialize(&d->tape);
  if (d->nesterov_ready) {
    pcp_decoupled_nesterov_deinitialize(&d->nesterov);
  }
  if (d->plan_ready) {
    pcp_decoupled_plan_deinitialize(&d->plan);
  }
  if (config_ready) {
    pcp_decoupled_config_deinitialize(&d->config);
  }
  pcp_diloco_job_free(job, d);
  return status;
}
