// SPDX-License-Identifier: Apache-2.0
// The inference workload kind (infer.h, pcp_infer_kind): a served model
// version is a job on the shared runner (issue 14). The version's
// lifecycle (scan, weights, compiles, runners, promotion) stays on the
// service's manager thread, which serves the same way with or without a
// runner; the job is its record in the store and its control: states,
// end, cancel, recovery (docs/decisions.md, 2026-12-05).

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "workloads/infer/infer_impl.h"

void pcp_infer_job_id_make(const char* dir, uint64_t inode, int64_t mtime_ns,
                           int64_t size,
                           char out[PCP_INFER_JOB_ID_MAX_LENGTH + 1]) {
  // The directory and model.json's identity (the service's "seen" stamp):
  // the same files after a restart give the same id.
  char stamp[PCP_INFER_MAX_PATH + 96];
  int n = snprintf(stamp, sizeof(stamp), "%s\n%" PRIu64 ":%" PRId64 ":%" PRId64,
                   dir, inode, mtime_ns, size);
  pcp_sha256_t digest;
  pcp_sha256_compute(stamp, n > 0 ? (size_t)n : 0, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  snprintf(out, PCP_INFER_JOB_ID_MAX_LENGTH + 1, "infer-%.32s", hex);
}

static pcp_infer_service_t* kind_service(pcp_infer_kind_t* kind) {
  return __atomic_load_n(&kind->service, __ATOMIC_ACQUIRE);
}

// The spec the service submits: {name, dir, version, outer_step, pinned,
// job_id (the export's training job, optional)}.
static pcp_status_t infer_validate(void* self, const json_t* spec) {
  (void)self;
  if (!json_is_object(spec)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inference job spec: an object");
  }
  const char* key;
  json_t* value;
  json_object_foreach((json_t*)spec, key, value) {
    if (strcmp(key, "name") == 0) {
      size_t n = json_string_length(value);
      if (!json_is_string(value) || n == 0 || n > PCP_INFER_MAX_MODEL_NAME) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'name': a string of "
                               "1..%d bytes",
                               PCP_INFER_MAX_MODEL_NAME);
      }
    } else if (strcmp(key, "dir") == 0) {
      size_t n = json_string_length(value);
      if (!json_is_string(value) || n == 0 || n >= PCP_INFER_MAX_PATH) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'dir': a path of "
                               "1..%d bytes",
                               PCP_INFER_MAX_PATH - 1);
      }
    } else if (strcmp(key, "version") == 0) {
      if (!json_is_integer(value) || json_integer_value(value) < 1 ||
          json_integer_value(value) > UINT32_MAX) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'version': an integer "
                               ">= 1");
      }
    } else if (strcmp(key, "outer_step") == 0) {
      if (!json_is_integer(value) || json_integer_value(value) < -1) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'outer_step': an "
                               "integer >= -1");
      }
    } else if (strcmp(key, "job_id") == 0) {
      if (!json_is_string(value) || json_string_length(value) >= 64) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'job_id': a string of "
                               "at most 63 bytes");
      }
    } else if (strcmp(key, "pinned") == 0) {
      if (!json_is_boolean(value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inference job spec key 'pinned': a boolean");
      }
    } else {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "inference job spec key '%s': unknown", key);
    }
  }
  if (!json_object_get(spec, "name") || !json_object_get(spec, "dir")) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inference job spec key '%s': required",
                           json_object_get(spec, "name") ? "dir" : "name");
  }
  return pcp_ok_status();
}

static pcp_status_t infer_run(void* self, pcp_workloads_job_t* job) {
  pcp_infer_kind_t* kind = self;
  // The service attaches itself at create, before the owner starts the
  // runner; a run started earlier waits for it (a stop or cancel ends the
  // wait).
  pcp_infer_service_t* s = kind_service(kind);
  while (!s) {
    if (pcp_workloads_job_wait(job, 100)) {
      return pcp_make_status(PCP_STATUS_CANCELLED,
                             "no inference service was attached");
    }
    s = kind_service(kind);
  }
  return pcp_infer_service_job_run(s, job);
}

static void infer_progress(void* self, const json_t* published,
                           json_t* job_json) {
  pcp_infer_kind_t* kind = self;
  json_t* out = json_deep_copy(published);
  if (!out) {
    return;
  }
  // A job still serving shows the live numbers (requests go on without a
  // store write); an ended one what its run published last.
  const char* state = json_string_value(json_object_get(job_json, "state"));
  const char* id = json_string_value(json_object_get(job_json, "job_id"));
  pcp_infer_service_t* s = kind_service(kind);
  if (s && id && state && strcmp(state, "running") == 0) {
    (void)pcp_infer_service_job_progress(s, id, out);
  }
  json_object_set_new(job_json, "inference", out);
}

static void infer_cancel(void* self, pcp_workloads_job_t* job) {
  pcp_infer_kind_t* kind = self;
  // A runner stop (gateway shutdown) is not a cancel: the version keeps
  // its state and the job resumes at the next start.
  if (!pcp_workloads_job_cancel_requested(job)) {
    return;
  }
  pcp_infer_service_t* s = kind_service(kind);
  if (s) {
    pcp_infer_service_job_cancel(s, pcp_workloads_job_id(job));
  }
}

// A version is bound to its job before the job runs: a cancel that ends
// the job while queued must withdraw the version as a running one's does.
static void infer_cancel_queued(void* self, const char* id) {
  pcp_infer_service_t* s = kind_service(self);
  if (s) {
    pcp_infer_service_job_cancel(s, id);
  }
}

pcp_workloads_kind_t pcp_infer_kind(pcp_infer_kind_t* kind) {
  return (pcp_workloads_kind_t){
      .name = "inference",
      .max_running = 2 * PCP_INFER_MAX_MODELS,
      .self = kind,
      .validate = infer_validate,
      .run = infer_run,
      .progress = infer_progress,
      .cancel = infer_cancel,
      .cancel_queued = infer_cancel_queued,
  };
}
