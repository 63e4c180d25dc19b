// SPDX-License-Identifier: Apache-2.0
//
// A training job's history (moved from src/roles/gateway/dashboard.c, issue
// 14; the gateway's GET /v1/training/jobs/{id}/history answers it and the
// operator dashboard charts it): the per-outer-step series (loss, val_loss,
// tokens/s, bytes on the wire, time) as columns, so a chart of a 1,000-step
// job is one small request instead of a walk over the job's raw events.
//
// The history is not a second copy: it is read from the job's
// "training.step" events in the store (one per outer step, written by the
// outer loop; the store keeps them durable and append-only), at most
// PCP_WORKLOADS_TRAIN_HISTORY_MAX_POINTS of them. A resumed job repeats the
// steps after its checkpoint: the last event of an outer step wins, as the
// resumed run's numbers are the ones the model carries on from.
//
// Thread-safety: touches only the store (thread-safe).

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "workloads/workloads.h"

// Columns of the history answer, in order; each is one array of the answer
// with one entry per outer step.
enum {
  COLUMN_OUTER_STEP = 0,
  COLUMN_TIME_MS,
  COLUMN_LOSS,
  COLUMN_VAL_LOSS,
  COLUMN_TOKENS_PER_SECOND,
  COLUMN_WIRE_BYTES,
  COLUMN_STEP_WIRE_BYTES,
  COLUMN_SECONDS,
  COLUMN_LR,
  // Measured bytes of the step (the progress's "bytes", from the fabric's
  // counters): the gateway link in and out, the per-worker means.
  COLUMN_GATEWAY_IN,
  COLUMN_GATEWAY_OUT,
  COLUMN_PER_WORKER_IN,
  COLUMN_PER_WORKER_OUT,
  // Goodput's running totals at the step (every mode reports them with
  // these names): tokens computed, tokens merged, their ratio.
  COLUMN_TOKENS_COMPUTED,
  COLUMN_TOKENS_MERGED,
  COLUMN_GOODPUT,
  COLUMN_COUNT_,
};

static const char* const kColumnNames[COLUMN_COUNT_] = {
    "outer_step",      "time_ms",           "loss",
    "val_loss",        "tokens_per_second", "wire_bytes",
    "step_wire_bytes", "seconds",           "lr",
    "gateway_in",      "gateway_out",       "per_worker_in",
    "per_worker_out",  "tokens_computed",   "tokens_merged",
    "goodput",
};

// The number at |key| of |payload| as JSON (a copy), or null when absent or
// not a number (a step without an evaluation has no val_loss).
static json_t* number_or_null(json_t* payload, const char* key) {
  json_t* v = json_object_get(payload, key);
  return json_is_number(v) ? json_deep_copy(v) : json_null();
}

// Drops the last entry of every column (a resumed job's repeated step).
static void columns_pop(json_t* const* columns) {
  for (int c = 0; c < COLUMN_COUNT_; ++c) {
    json_array_remove(columns[c], json_array_size(columns[c]) - 1);
  }
}

// Appends one "training.step" event's numbers to |columns|; events without
// an integer outer_step are not steps and are skipped.
static void columns_append(json_t* const* columns,
                           const pcp_store_job_event_t* e) {
  json_t* p = e->payload;
  json_t* step = json_object_get(p, "outer_step");
  if (!json_is_integer(step)) {
    return;
  }
  json_int_t s = json_integer_value(step);
  // The last event of an outer step wins: pop what a resume repeats.
  while (json_array_size(columns[COLUMN_OUTER_STEP]) > 0) {
    json_t* last = json_array_get(columns[COLUMN_OUTER_STEP],
                                  json_array_size(columns[0]) - 1);
    if (json_integer_value(last) < s) {
      break;
    }
    columns_pop(columns);
  }
  json_t* val = json_object_get(p, "evaluated");
  json_array_append_new(columns[COLUMN_OUTER_STEP], json_integer(s));
  json_array_append_new(columns[COLUMN_TIME_MS],
                        json_integer((json_int_t)(e->created_at_ns / 1000000)));
  json_array_append_new(columns[COLUMN_LOSS], number_or_null(p, "loss"));
  // val_loss is carried forward in the progress; it belongs to this step
  // only when this step evaluated.
  json_array_append_new(
      columns[COLUMN_VAL_LOSS],
      json_is_true(val) ? number_or_null(p, "val_loss") : json_null());
  json_array_append_new(columns[COLUMN_TOKENS_PER_SECOND],
                        number_or_null(p, "tokens_per_second"));
  json_array_append_new(columns[COLUMN_WIRE_BYTES],
                        number_or_null(p, "wire_bytes"));
  json_array_append_new(columns[COLUMN_STEP_WIRE_BYTES],
                        number_or_null(p, "step_wire_bytes"));
  json_array_append_new(columns[COLUMN_SECONDS], number_or_null(p, "seconds"));
  json_array_append_new(columns[COLUMN_LR], number_or_null(p, "lr"));
  json_t* bytes = json_object_get(p, "bytes");
  json_t* mean = json_object_get(bytes, "per_worker_mean");
  json_array_append_new(columns[COLUMN_GATEWAY_IN],
                        number_or_null(bytes, "gateway_in"));
  json_array_append_new(columns[COLUMN_GATEWAY_OUT],
                        number_or_null(bytes, "gateway_out"));
  json_array_append_new(columns[COLUMN_PER_WORKER_IN],
                        number_or_null(mean, "in"));
  json_array_append_new(columns[COLUMN_PER_WORKER_OUT],
                        number_or_null(mean, "out"));
  json_array_append_new(columns[COLUMN_TOKENS_COMPUTED],
                        number_or_null(p, "tokens_computed"));
  json_array_append_new(columns[COLUMN_TOKENS_MERGED],
                        number_or_null(p, "tokens_merged"));
  json_array_append_new(columns[COLUMN_GOODPUT], number_or_null(p, "goodput"));
}

pcp_status_t pcp_workloads_train_history_json(pcp_store_t* store,
                                              const char* id,
                                              json_t** out_history) {
  *out_history = NULL;
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(store, id, &job));
  bool training = strcmp(job.kind, "training") == 0;
  json_t* outer_loop_steps = json_object_get(
      json_object_get(job.spec, "training"), "outer_loop_steps");
  json_int_t planned = json_is_integer(outer_loop_steps)
                           ? json_integer_value(outer_loop_steps)
                           : 0;
  char state[32];
  snprintf(state, sizeof(state), "%s", pcp_store_job_state_name(job.state));
  pcp_store_job_deinitialize(&job);
  if (!training) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "training job %s", id);
  }
  json_t* columns[COLUMN_COUNT_];
  bool ok = true;
  for (int c = 0; c < COLUMN_COUNT_; ++c) {
    columns[c] = json_array();
    ok = ok && columns[c];
  }
  // Pages of the job's events in id order; bounded by the point cap (and
  // by the pages it takes to read that many events, whatever else the job
  // logged in between).
  pcp_status_t status = pcp_ok_status();
  int64_t after = 0;
  size_t steps_seen = 0;
  bool truncated = false;
  for (uint32_t page = 0;
       ok && !status && page < PCP_WORKLOADS_TRAIN_HISTORY_MAX_PAGES; ++page) {
    pcp_store_job_event_list_t list = {0};
    status = pcp_store_job_event_list(store, after, id,
                                      PCP_STORE_LIST_LIMIT_MAX, &list);
    if (status) {
      break;
    }
    for (size_t i = 0; i < list.count; ++i) {
      const pcp_store_job_event_t* e = &list.items[i];
      after = e->event_id;
      if (strcmp(e->type, "training.step") != 0) {
        continue;
      }
      if (steps_seen >= PCP_WORKLOADS_TRAIN_HISTORY_MAX_POINTS) {
        truncated = true;
        continue;
      }
      ++steps_seen;
      columns_append(columns, e);
    }
    size_t count = list.count;
    pcp_store_job_event_list_deinitialize(&list);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      break;
    }
    if (page + 1 == PCP_WORKLOADS_TRAIN_HISTORY_MAX_PAGES) {
      truncated = true;
    }
  }
  if (status || !ok) {
    for (int c = 0; c < COLUMN_COUNT_; ++c) {
      json_decref(columns[c]);
    }
    return status ? status
                  : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "history");
  }
  json_t* out = json_pack("{s:s, s:s, s:I, s:I, s:b, s:I}", "job_id", id,
                          "state", state, "outer_loop_steps", planned, "points",
                          (json_int_t)json_array_size(columns[0]), "truncated",
                          truncated, "max_points",
                          (json_int_t)PCP_WORKLOADS_TRAIN_HISTORY_MAX_POINTS);
  for (int c = 0; c < COLUMN_COUNT_; ++c) {
    if (out) {
      json_object_set_new(out, kColumnNames[c], columns[c]);
    } else {
      json_decref(columns[c]);
    }
  }
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "history");
  }
  *out_history = out;
  return pcp_ok_status();
}
