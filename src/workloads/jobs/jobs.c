// SPDX-License-Identifier: Apache-2.0
// The generic job workload kind (jobs.h): files, submission, the compile
// pool and the run of one job on the shared runner. Moved from
// roles/gateway/jobs.c (issue 14): its runner thread, which polled the
// store every 50 ms, is now one run per job on the runner's pool, woken by
// the compile pool and the fabric's task callbacks; its transitions,
// recovery and cancel are the runner's.

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "workloads/workloads.h"

// Marker that makes the test hook delay a compile (jobs.h).
#define TEST_SLOW_COMPILE_MARKER "pcp-test:slow-compile"

// The compile pool: a fixed number of threads take StableHLO programs from
// a fixed number of slots, so a long compile holds one pool thread and one
// slot, never a job's run beyond its own.
typedef enum compile_slot_state_e {
  COMPILE_SLOT_FREE = 0,
  COMPILE_SLOT_QUEUED = 1,   // waiting for a pool thread
  COMPILE_SLOT_RUNNING = 2,  // a pool thread compiles it
  COMPILE_SLOT_DONE = 3,     // |status| / |program| set
} compile_slot_state_t;

typedef struct compile_slot_t {
  compile_slot_state_t state;
  char job_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char backend[32];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint8_t* mlir;  // freed by the pool thread after the compile
  size_t mlir_byte_length;
  pcp_status_t status;  // owned by the slot until the run takes it
  uint8_t program[PCP_SHA256_BYTE_LENGTH];  // registered with the fabric
  // The run waiting for it (signalled when DONE, by id through |runner|);
  // NULL once it gave the slot up (cancel or stop): the pool thread frees
  // the slot when done.
  pcp_workloads_job_t* waiter;
  pcp_workloads_runner_t* runner;
  // The queue request while the pool thread waits on it (guarded by
  // compile_mu): a run that gives the slot up cancels it, so the child
  // `pcp compile` is killed instead of running on for nobody.
  pcp_workloads_compile_request_t* request;
} compile_slot_t;

// One job's tasks and the input buffers they borrow until DONE.
typedef struct active_t active_t;
struct active_t {
  active_t* next;  // the leftovers list
  pcp_workloads_jobs_t* jobs;
  pcp_workloads_job_t* job;
  char id[PCP_STORE_ID_MAX_LENGTH + 1];
  uint32_t task_count;
  pcp_fabric_task_t* tasks[PCP_WORKLOADS_JOBS_MAX_WORKERS];
  pcp_proto_section_t sections[PCP_WORKLOADS_JOBS_MAX_INPUTS];
  void* input_data[PCP_WORKLOADS_JOBS_MAX_INPUTS];
  char input_names[PCP_WORKLOADS_JOBS_MAX_INPUTS][32];
  uint32_t input_count;
  atomic_uint done_count;  // DONE callbacks seen
  bool cancel_sent;        // guarded by jobs->mu
};

struct pcp_workloads_jobs_t {
  pcp_allocator_t allocator;
  pcp_store_t* store;
  char* state_dir;
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_fabric_endpoint_t* fabric;  // set by _start
  // The gateway's one compile queue (borrowed; set by _start).
  pcp_workloads_compile_queue_t* compile_queue;
  atomic_uint_fast64_t counter;  // job ids, temp names

  // Guards every run's active_t (tasks, cancel_sent) and |leftovers|: runs
  // interrupted by a stop, freed after the fabric endpoint is released.
  pthread_mutex_t mu;
  active_t* leftovers;

  // Compile pool. Slots are guarded by |compile_mu|; pool threads wait on
  // |compile_cv| and wake a slot's run through its job's condition variable.
  pthread_mutex_t compile_mu;
  pthread_cond_t compile_cv;
  compile_slot_t compile_slots[PCP_WORKLOADS_JOBS_COMPILE_SLOTS];
  pthread_t compile_threads[PCP_WORKLOADS_JOBS_COMPILE_THREADS];
  uint32_t compile_thread_count;
  uint32_t admitted;  // runs admitted that hold no slot yet; |compile_mu|
  atomic_bool stopping;
  // Test hook: programs whose text holds "pcp-test:slow-compile" wait this
  // long before compiling (0: off; from PCP_GATEWAY_TEST_COMPILE_DELAY_MS).
  int64_t test_compile_delay_ms;
};

static void job_dir(const pcp_workloads_jobs_t* jobs, const char* id,
                    char* buffer, size_t capacity) {
  snprintf(buffer, capacity, "%s/jobs/%s", jobs->state_dir, id);
}

// base/file.c's reader under this module's limit: 64-byte aligned (tensors
// and VMFBs are read in place), freed with free().
static pcp_status_t file_read(const char* path, size_t max_length,
                              uint8_t** out_data, size_t* out_length) {
  return pcp_file_read_all(path, max_length, (void**)out_data, out_length);
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

json_t* pcp_workloads_job_json(const pcp_store_job_t* job) {
  json_t* spec = json_deep_copy(job->spec);
  return json_pack(
      "{s:s, s:s, s:s, s:o, s:O?, s:I, s:I, s:i, s:s?}", "job_id", job->id,
      "kind", job->kind, "state", pcp_store_job_state_name(job->state), "spec",
      spec ? spec : json_object(), "placement", job->placement, "created_at_ms",
      (json_int_t)(job->created_at_ns / 1000000), "updated_at_ms",
      (json_int_t)(job->updated_at_ns / 1000000), "attempt", (int)job->attempt,
      "error", job->error[0] ? job->error : NULL);
}

json_t* pcp_workloads_job_event_json(const pcp_store_job_event_t* e) {
  return json_pack(
      "{s:I, s:s, s:s, s:s?, s:s?, s:O, s:I}", "event_id",
      (json_int_t)e->event_id, "job_id", e->job_id, "type", e->type, "from",
      e->has_from_state ? pcp_store_job_state_name(e->from_state) : NULL, "to",
      e->has_states ? pcp_store_job_state_name(e->to_state) : NULL, "payload",
      e->payload, "created_at_ms", (json_int_t)(e->created_at_ns / 1000000));
}

json_t* pcp_workloads_job_result_json(const pcp_store_job_result_t* r) {
  json_t* shape = json_array();
  for (uint32_t d = 0; d < r->rank; ++d) {
    json_array_append_new(shape, json_integer(r->shape[d]));
  }
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&r->sha256, hex);
  return json_pack("{s:s, s:s, s:o, s:I, s:s}", "name", r->name, "dtype",
                   pcp_element_type_name(r->dtype), "shape", shape,
                   "byte_length", (json_int_t)r->byte_length, "sha256", hex);
}

//===----------------------------------------------------------------------===//
// Submission
//===----------------------------------------------------------------------===//

// Parses dtype + shape of one input into |out_shape|; checks that
// |byte_length| matches.
static pcp_status_t input_shape_parse(json_t* input, size_t index,
                                      pcp_tensor_shape_t* out_shape) {
  memset(out_shape, 0, sizeof(*out_shape));
  json_t* dtype = json_object_get(input, "dtype");
  json_t* shape = json_object_get(input, "shape");
  if (!json_is_string(dtype) ||
      !pcp_element_type_parse(pcp_make_cstring_view(json_string_value(dtype)),
                              &out_shape->element_type) ||
      out_shape->element_type == PCP_ELEMENT_TYPE_UNKNOWN) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inputs[%zu].dtype: expected an element type such "
                           "as \"f32\"",
                           index);
  }
  if (!json_is_array(shape) || json_array_size(shape) > PCP_MAX_TENSOR_RANK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inputs[%zu].shape: expected an array of at most "
                           "%d dimensions",
                           index, PCP_MAX_TENSOR_RANK);
  }
  out_shape->rank = (int32_t)json_array_size(shape);
  for (size_t d = 0; d < json_array_size(shape); ++d) {
    json_t* dim = json_array_get(shape, d);
    if (!json_is_integer(dim) || json_integer_value(dim) < 0 ||
        json_integer_value(dim) > (INT64_C(1) << 40)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "inputs[%zu].shape[%zu]: expected an integer in "
                             "[0, 2^40]",
                             index, d);
    }
    out_shape->dims[d] = json_integer_value(dim);
  }
  return pcp_ok_status();
}

static pcp_status_t shape_byte_length(const pcp_tensor_shape_t* shape,
                                      size_t index, uint64_t* out_length) {
  uint64_t n = pcp_element_type_byte_size(shape->element_type);
  for (int32_t d = 0; d < shape->rank; ++d) {
    uint64_t dim = (uint64_t)shape->dims[d];
    if (dim && n > PCP_WORKLOADS_JOBS_MAX_BODY_BYTES / dim) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "inputs[%zu]: tensor larger than the body limit",
                             index);
    }
    n *= dim;
  }
  *out_length = n;
  return pcp_ok_status();
}

typedef struct submission_t {
  pcp_workloads_jobs_t* jobs;
  char id[64];
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  json_t* spec;
} submission_t;

// One input: raw base64 with dtype+shape, or a .npy file in base64.
static pcp_status_t input_write(submission_t* s, json_t* input, size_t index,
                                json_t* out_inputs) {
  if (!json_is_object(input)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inputs[%zu]: expected an object", index);
  }
  json_t* raw = json_object_get(input, "data_base64");
  json_t* npy = json_object_get(input, "npy_base64");
  if (!json_is_string(raw) == !json_is_string(npy)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inputs[%zu]: give exactly one of 'data_base64' "
                           "(with dtype and shape) or 'npy_base64'",
                           index);
  }
  json_t* encoded = raw ? raw : npy;
  uint8_t* bytes = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_base64_decode(s->jobs->allocator, json_string_value(encoded),
                        json_string_length(encoded), &bytes, &length);
  if (status) {
    pcp_status_t wrapped = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "inputs[%zu].%s: %s", index,
        raw ? "data_base64" : "npy_base64", pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  pcp_tensor_shape_t shape;
  char path[4096];
  snprintf(path, sizeof(path), "%s/input%zu.bin", s->dir, index);
  if (raw) {
    uint64_t expected = 0;
    status = input_shape_parse(input, index, &shape);
    if (!status) {
      status = shape_byte_length(&shape, index, &expected);
    }
    if (!status && expected != length) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "inputs[%zu]: %zu bytes given, the dtype and "
                               "shape need %" PRIu64,
                               index, length, expected);
    }
    if (!status) {
      status = pcp_file_write_atomic(path, bytes, length);
    }
  } else {
    // The .npy reader takes a path: the upload goes through a temp file.
    char npy_path[4096];
    snprintf(npy_path, sizeof(npy_path), "%s/input%zu.npy", s->dir, index);
    status = pcp_file_write_atomic(npy_path, bytes, length);
    pcp_host_tensor_t tensor = {0};
    if (!status) {
      status =
          pcp_host_tensor_read_npy(npy_path, PCP_ELEMENT_TYPE_UNKNOWN, &tensor);
      unlink(npy_path);
      if (status) {
        pcp_status_t wrapped =
            pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "inputs[%zu]: %s",
                            index, pcp_status_message(status));
        pcp_status_ignore(status);
        status = wrapped;
      }
    }
    if (!status) {
      shape = tensor.shape;
      length = tensor.byte_length;
      status = pcp_file_write_atomic(path, tensor.data, tensor.byte_length);
    }
    pcp_host_tensor_deinitialize(&tensor);
  }
  pcp_allocator_free(s->jobs->allocator, bytes);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* dims = json_array();
  for (int32_t d = 0; d < shape.rank; ++d) {
    json_array_append_new(dims, json_integer(shape.dims[d]));
  }
  json_array_append_new(
      out_inputs, json_pack("{s:s, s:o, s:I}", "dtype",
                            pcp_element_type_name(shape.element_type), "shape",
                            dims, "byte_length", (json_int_t)length));
  return pcp_ok_status();
}

static const char* placement_string(json_t* placement, const char* key,
                                    const char* fallback) {
  json_t* v = json_object_get(placement, key);
  return json_is_string(v) ? json_string_value(v) : fallback;
}

// Fills s->spec from the JSON body (program, function, inputs, placement)
// and writes the files. Errors name the field.
static pcp_status_t submission_from_json(submission_t* s, json_t* body) {
  if (!json_is_object(body)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the body must be a JSON object");
  }
  json_t* program = json_object_get(body, "program");
  if (!json_is_object(program)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program' (object) is required");
  }
  json_t* format = json_object_get(program, "format");
  const char* fmt = json_is_string(format) ? json_string_value(format) : "";
  bool vmfb = strcmp(fmt, "vmfb") == 0;
  if (!vmfb && strcmp(fmt, "stablehlo") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program.format' must be \"stablehlo\" or "
                           "\"vmfb\"");
  }
  json_t* text = json_object_get(program, "text");
  json_t* b64 = json_object_get(program, "base64");
  uint8_t* bytes = NULL;
  size_t length = 0;
  if (json_is_string(b64)) {
    pcp_status_t status =
        pcp_base64_decode(s->jobs->allocator, json_string_value(b64),
                          json_string_length(b64), &bytes, &length);
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "program.base64: %s",
                          pcp_status_message(status));
      pcp_status_ignore(status);
      return wrapped;
    }
  } else if (json_is_string(text) && !vmfb) {
    length = json_string_length(text);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_allocator_malloc(s->jobs->allocator, length + 1, (void**)&bytes));
    memcpy(bytes, json_string_value(text), length);
  } else {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program.base64' (or 'program.text' for "
                           "stablehlo) is required");
  }
  if (length == 0) {
    pcp_allocator_free(s->jobs->allocator, bytes);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program': empty program");
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/program.%s", s->dir, vmfb ? "vmfb" : "mlir");
  pcp_status_t status = pcp_file_write_atomic(path, bytes, length);
  pcp_sha256_t digest;
  pcp_sha256_compute(bytes, length, &digest);
  pcp_allocator_free(s->jobs->allocator, bytes);
  PCP_RETURN_IF_ERROR_BARE(status);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);

  json_t* function = json_object_get(body, "function");
  if (function &&
      (!json_is_string(function) || json_string_length(function) == 0 ||
       json_string_length(function) > 127)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'function' must be a name of 1..127 bytes");
  }
  json_t* placement = json_object_get(body, "placement");
  if (placement && !json_is_object(placement)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'placement' must be an object");
  }
  const char* backend = placement_string(placement, "backend", "cpu");
  pcp_compile_backend_t compile_backend;
  pcp_status_t parsed = pcp_compile_backend_parse(backend, &compile_backend);
  if (parsed) {
    pcp_status_ignore(parsed);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'placement.backend': unknown backend '%s' "
                           "(cpu, cuda, rocm, vulkan, metal)",
                           backend);
  }
  const char* target = placement_string(placement, "target", "");
  if (strlen(target) > PCP_SCHED_TARGET_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'placement.target' is too long");
  }
  json_t* workers = json_object_get(placement, "workers");
  if (workers &&
      (!json_is_integer(workers) || json_integer_value(workers) < 1 ||
       json_integer_value(workers) > PCP_WORKLOADS_JOBS_MAX_WORKERS)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'placement.workers' must be an integer in "
                           "[1, %d]",
                           PCP_WORKLOADS_JOBS_MAX_WORKERS);
  }
  json_t* inputs = json_object_get(body, "inputs");
  if (inputs && (!json_is_array(inputs) ||
                 json_array_size(inputs) > PCP_WORKLOADS_JOBS_MAX_INPUTS)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'inputs' must be an array of at most %d "
                           "tensors",
                           PCP_WORKLOADS_JOBS_MAX_INPUTS);
  }
  json_t* input_specs = json_array();
  json_object_set_new(s->spec, "inputs", input_specs);
  for (size_t i = 0; i < json_array_size(inputs); ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        input_write(s, json_array_get(inputs, i), i, input_specs));
  }
  json_object_set_new(
      s->spec, "program",
      json_pack("{s:s, s:I, s:s}", "format", vmfb ? "vmfb" : "stablehlo",
                "byte_length", (json_int_t)length, "sha256", hex));
  json_object_set_new(
      s->spec, "function",
      json_string(function ? json_string_value(function) : "main"));
  json_object_set_new(
      s->spec, "placement",
      json_pack("{s:s, s:s, s:I}", "backend", backend, "target", target,
                "workers",
                (json_int_t)(workers ? json_integer_value(workers) : 1)));
  return pcp_ok_status();
}

static void remove_dir(const char* dir) {
  // Only files this module wrote: program.*, input*.bin.
  char path[4096];
  const char* names[] = {"program.mlir", "program.vmfb"};
  for (size_t i = 0; i < 2; ++i) {
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    unlink(path);
  }
  for (int i = 0; i < PCP_WORKLOADS_JOBS_MAX_INPUTS; ++i) {
    snprintf(path, sizeof(path), "%s/input%d.bin", dir, i);
    unlink(path);
  }
  rmdir(dir);
}

pcp_status_t pcp_workloads_jobs_submit(pcp_workloads_jobs_t* jobs,
                                       pcp_workloads_runner_t* runner,
                                       const json_t* body, json_t** out_job) {
  *out_job = NULL;
  submission_t s = {.jobs = jobs};
  snprintf(s.id, sizeof(s.id), "job-%" PRIx64 "-%" PRIu64,
           (uint64_t)pcp_clock_wall_ns(jobs->clock),
           (uint64_t)atomic_fetch_add(&jobs->counter, 1));
  char jobs_root[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(jobs_root, sizeof(jobs_root), "%s/jobs", jobs->state_dir);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(jobs_root));
  job_dir(jobs, s.id, s.dir, sizeof(s.dir));
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(s.dir));
  s.spec = json_object();
  pcp_status_t status =
      s.spec ? submission_from_json(&s, (json_t*)body)
             : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "spec");
  if (!status) {
    status = pcp_workloads_runner_job_submit(runner, s.id, "generic", s.spec,
                                             NULL, NULL, NULL);
  }
  json_decref(s.spec);
  if (status) {
    remove_dir(s.dir);
    return status;
  }
  pcp_store_job_t job;
  pcp_status_t got = pcp_store_job_get(jobs->store, s.id, &job);
  // Wake the runner only now, so the answer usually shows "queued".
  pcp_workloads_runner_wake(runner);
  PCP_RETURN_IF_ERROR_BARE(got);
  *out_job = pcp_workloads_job_json(&job);
  pcp_store_job_deinitialize(&job);
  return *out_job ? pcp_ok_status()
                  : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job JSON");
}

pcp_status_t pcp_workloads_jobs_result_npy_write(
    pcp_workloads_jobs_t* jobs, const pcp_store_job_result_t* r, char* out_path,
    size_t capacity) {
  uint8_t* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      file_read(r->path, (size_t)r->byte_length, &data, &length));
  pcp_tensor_shape_t shape = {.element_type = r->dtype,
                              .rank = (int32_t)r->rank};
  memcpy(shape.dims, r->shape, sizeof(shape.dims));
  pcp_host_tensor_t tensor;
  pcp_status_t status = pcp_host_tensor_wrap(&shape, data, length, &tensor);
  // The .npy writer takes a path: a fresh one beside the result.
  snprintf(out_path, capacity, "%s.%" PRIu64 ".npy", r->path,
           (uint64_t)atomic_fetch_add(&jobs->counter, 1));
  if (!status) {
    status = pcp_host_tensor_write_npy(&tensor, out_path, false);
  }
  pcp_allocator_free(pcp_allocator_system(), data);
  return status;
}

//===----------------------------------------------------------------------===//
// Compile pool
//===----------------------------------------------------------------------===//

// Pool thread: one StableHLO program to a VMFB (artifact cache under
// state_dir/artifacts), registered with the fabric.
static pcp_status_t compile_slot_run(pcp_workloads_jobs_t* jobs,
                                     compile_slot_t* slot) {
  if (jobs->test_compile_delay_ms > 0) {
    size_t n = strlen(TEST_SLOW_COMPILE_MARKER);
    for (size_t i = 0; i + n <= slot->mlir_byte_length; ++i) {
      if (memcmp(slot->mlir + i, TEST_SLOW_COMPILE_MARKER, n) == 0) {
        pcp_sleep_ms(jobs->test_compile_delay_ms);
        break;
      }
    }
  }
  pcp_compile_backend_t compile_backend = PCP_COMPILE_BACKEND_CPU;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_compile_backend_parse(slot->backend, &compile_backend));
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(jobs, slot->job_id, dir, sizeof(dir));
  char path[PCP_STORE_PATH_MAX_LENGTH + 32];
  snprintf(path, sizeof(path), "%s/program.mlir", dir);
  // The hash of the text the run read (the file holds the same bytes).
  pcp_sha256_t digest;
  pcp_sha256_compute(slot->mlir, slot->mlir_byte_length, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  pcp_workloads_compile_spec_t spec = {
      .mlir_path = path,
      .content_hash = hex,
      .backend = slot->backend,
      .target = slot->target,
      .log_dir = dir,
      .label = slot->job_id,
  };
  pcp_workloads_compile_request_t* request = NULL;
  pcp_status_t status =
      pcp_workloads_compile_queue_submit(jobs->compile_queue, &spec, &request);
  if (!status) {
    pthread_mutex_lock(&jobs->compile_mu);
    if (slot->waiter) {
      slot->request = request;
    } else {
      pcp_workloads_compile_request_cancel(request);  // given up meanwhile
    }
    pthread_mutex_unlock(&jobs->compile_mu);
    status = pcp_workloads_compile_request_wait(request);
    pthread_mutex_lock(&jobs->compile_mu);
    slot->request = NULL;
    pthread_mutex_unlock(&jobs->compile_mu);
  }
  void* vmfb = NULL;
  size_t length = 0;
  if (!status) {
    status = pcp_file_read_all(pcp_workloads_compile_request_vmfb_path(request),
                               (size_t)1 << 30, &vmfb, &length);
  }
  if (!status) {
    pcp_log_context_t log = jobs->log;
    log.job_id = slot->job_id;
    PCP_LOG(PCP_LOG_INFO, &log,
            "program ready backend=%s target=%s cache_hit=%d", slot->backend,
            slot->target, pcp_workloads_compile_request_cache_hit(request));
    status = pcp_fabric_program_register(
        jobs->fabric, vmfb, length, slot->backend, slot->target, slot->program);
  }
  pcp_allocator_free(pcp_allocator_system(), vmfb);  // read_all: system
  pcp_workloads_compile_request_release(request);
  return status;
}

static void* compile_thread_main(void* opaque) {
  pcp_workloads_jobs_t* jobs = opaque;
  pthread_mutex_lock(&jobs->compile_mu);
  // At stop, queued compiles are left (their jobs re-run at the next start)
  // rather than run one after another while the process is exiting.
  while (!atomic_load(&jobs->stopping)) {
    compile_slot_t* slot = NULL;
    for (uint32_t i = 0; i < PCP_WORKLOADS_JOBS_COMPILE_SLOTS && !slot; ++i) {
      if (jobs->compile_slots[i].state == COMPILE_SLOT_QUEUED) {
        slot = &jobs->compile_slots[i];
      }
    }
    if (!slot) {
      pthread_cond_wait(&jobs->compile_cv, &jobs->compile_mu);
      continue;
    }
    slot->state = COMPILE_SLOT_RUNNING;
    pthread_mutex_unlock(&jobs->compile_mu);
    // Only this thread touches a RUNNING slot, so no lock while compiling.
    pcp_status_t status = compile_slot_run(jobs, slot);
    pcp_allocator_free(jobs->allocator, slot->mlir);
    slot->mlir = NULL;
    pthread_mutex_lock(&jobs->compile_mu);
    // The waiter is woken by id (its context may end as soon as it sees
    // DONE).
    pcp_workloads_runner_t* runner = slot->waiter ? slot->runner : NULL;
    char waiter_id[PCP_STORE_ID_MAX_LENGTH + 1];
    snprintf(waiter_id, sizeof(waiter_id), "%s", slot->job_id);
    if (runner) {
      slot->status = status;
      slot->state = COMPILE_SLOT_DONE;
    } else {
      // Its run gave it up (cancel or stop); the program stays registered
      // and cached, which a later job may use.
      pcp_status_ignore(status);
      slot->state = COMPILE_SLOT_FREE;
    }
    pthread_mutex_unlock(&jobs->compile_mu);
    // The state is set first, then the run is woken (no lost wake-up).
    if (runner) {
      pcp_workloads_runner_job_signal(runner, waiter_id);
    }
    pthread_mutex_lock(&jobs->compile_mu);
  }
  pthread_mutex_unlock(&jobs->compile_mu);
  return NULL;
}

pcp_status_t pcp_workloads_jobs_start(
    pcp_workloads_jobs_t* jobs, pcp_fabric_endpoint_t* fabric,
    pcp_workloads_compile_queue_t* compile_queue) {
  if (!compile_queue) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "jobs start: a compile queue is required");
  }
  jobs->fabric = fabric;
  jobs->compile_queue = compile_queue;
  const char* delay = getenv("PCP_GATEWAY_TEST_COMPILE_DELAY_MS");
  jobs->test_compile_delay_ms = delay ? strtoll(delay, NULL, 10) : 0;
  for (uint32_t i = 0; i < PCP_WORKLOADS_JOBS_COMPILE_THREADS; ++i) {
    if (pthread_create(&jobs->compile_threads[i], NULL, compile_thread_main,
                       jobs)) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE, "compile pool thread");
    }
    ++jobs->compile_thread_count;
  }
  return pcp_ok_status();
}

void pcp_workloads_jobs_stop(pcp_workloads_jobs_t* jobs) {
  atomic_store(&jobs->stopping, true);
  pthread_mutex_lock(&jobs->compile_mu);
  pthread_cond_broadcast(&jobs->compile_cv);
  pthread_mutex_unlock(&jobs->compile_mu);
  for (uint32_t i = 0; i < jobs->compile_thread_count; ++i) {
    pthread_join(jobs->compile_threads[i], NULL);
  }
  jobs->compile_thread_count = 0;
  // Queued slots never ran (their jobs stay compiling and re-run at the
  // next start); done ones were not taken.
  for (uint32_t i = 0; i < PCP_WORKLOADS_JOBS_COMPILE_SLOTS; ++i) {
    compile_slot_t* slot = &jobs->compile_slots[i];
    pcp_allocator_free(jobs->allocator, slot->mlir);
    slot->mlir = NULL;
    pcp_status_ignore(slot->status);
    slot->status = pcp_ok_status();
    slot->state = COMPILE_SLOT_FREE;
    slot->waiter = NULL;
  }
}

//===----------------------------------------------------------------------===//
// One job's run
//===----------------------------------------------------------------------===//

// The placement's worker count and class, validated again: the spec comes
// back from the store, written by an older gateway perhaps.
static pcp_status_t job_placement(const pcp_store_job_t* job,
                                  json_int_t* out_workers,
                                  pcp_sched_worker_class_t* out_class) {
  json_t* placement = json_object_get(job->spec, "placement");
  const char* backend = placement_string(placement, "backend", "cpu");
  json_int_t workers =
      json_integer_value(json_object_get(placement, "workers"));
  if (workers < 1) {
    workers = 1;
  }
  if (workers > PCP_WORKLOADS_JOBS_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.workers %lld is over %d",
                           (long long)workers, PCP_WORKLOADS_JOBS_MAX_WORKERS);
  }
  if (!pcp_sched_worker_class_parse(pcp_make_cstring_view(backend),
                                    out_class)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.backend '%s' is not a worker class",
                           backend);
  }
  *out_workers = workers;
  return pcp_ok_status();
}

// Fabric loop thread: one task of |a| is done.
static void task_done(void* user_data, pcp_fabric_task_t* task,
                      pcp_fabric_task_event_t event) {
  (void)task;
  active_t* a = user_data;
  if (event != PCP_FABRIC_TASK_EVENT_DONE) {
    return;
  }
  pcp_workloads_jobs_t* jobs = a->jobs;
  pthread_mutex_lock(&jobs->mu);
  atomic_fetch_add(&a->done_count, 1);
  // NULL once the run left it behind at a stop. By id: the run may end
  // (and its context with it) as soon as the count is complete.
  // Everything is copied under the lock: the run frees |a| once it has
  // taken the lock after the count is complete.
  pcp_workloads_runner_t* runner =
      a->job ? pcp_workloads_job_runner(a->job) : NULL;
  char id[PCP_STORE_ID_MAX_LENGTH + 1];
  snprintf(id, sizeof(id), "%s", a->id);
  pthread_mutex_unlock(&jobs->mu);
  if (runner) {
    pcp_workloads_runner_job_signal(runner, id);
  }
}

static void active_free(active_t* a) {
  for (uint32_t i = 0; i < a->task_count; ++i) {
    pcp_fabric_task_release(a->tasks[i]);
  }
  for (uint32_t i = 0; i < a->input_count; ++i) {
    pcp_allocator_free(pcp_allocator_system(),
                       a->input_data[i]);  // pcp_file_read_all's buffers
  }
  pcp_allocator_free(a->jobs->allocator, a);
}

// compiling -> running: inputs read, one gang of tasks submitted (their
// DONE callbacks wake |run_job|).
static pcp_status_t job_launch(
    pcp_workloads_jobs_t* jobs, pcp_workloads_job_t* run_job,
    const pcp_store_job_t* job,
    const uint8_t program_hash[PCP_SHA256_BYTE_LENGTH], active_t** out_active) {
  *out_active = NULL;
  json_int_t workers = 1;
  pcp_sched_worker_class_t worker_class;
  PCP_RETURN_IF_ERROR_BARE(job_placement(job, &workers, &worker_class));
  json_t* placement = json_object_get(job->spec, "placement");
  const char* target = placement_string(placement, "target", "");
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(jobs, job->id, dir, sizeof(dir));
  char path[4096];
  size_t length = 0;
  active_t* a = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(jobs->allocator, sizeof(*a), (void**)&a));
  pcp_status_t status = pcp_ok_status();
  a->jobs = jobs;
  a->job = run_job;
  snprintf(a->id, sizeof(a->id), "%s", job->id);
  json_t* inputs = json_object_get(job->spec, "inputs");
  for (size_t i = 0; !status && i < json_array_size(inputs); ++i) {
    json_t* in = json_array_get(inputs, i);
    snprintf(path, sizeof(path), "%s/input%zu.bin", dir, i);
    uint8_t* data = NULL;
    status = file_read(path, PCP_WORKLOADS_JOBS_MAX_BODY_BYTES, &data, &length);
    if (status) {
      break;
    }
    pcp_proto_section_t* s = &a->sections[a->input_count];
    a->input_data[a->input_count] = data;
    snprintf(a->input_names[a->input_count], sizeof(a->input_names[0]), "in%zu",
             i);
    s->name = a->input_names[a->input_count];
    ++a->input_count;
    pcp_element_type_parse(
        pcp_make_cstring_view(placement_string(in, "dtype", "")),
        &s->element_type);
    json_t* shape = json_object_get(in, "shape");
    s->rank = (uint32_t)json_array_size(shape);
    for (uint32_t d = 0; d < s->rank && d < PCP_MAX_TENSOR_RANK; ++d) {
      s->shape[d] = json_integer_value(json_array_get(shape, d));
    }
    s->byte_length = length;
    s->data = data;
  }
  if (!status) {
    status = pcp_workloads_job_transition(run_job, PCP_STORE_JOB_STATE_RUNNING,
                                          NULL);
  }
  const char* function = placement_string(job->spec, "function", "main");
  if (!status) {
    pcp_fabric_task_params_t params = {
        .function = function,
        .inputs = a->sections,
        .input_count = a->input_count,
        .worker_class = worker_class,
        .target = target,
        .callback = task_done,
        .user_data = a,
    };
    memcpy(params.program, program_hash, PCP_SHA256_BYTE_LENGTH);
    // One gang, not |workers| separate tasks: separate tasks could all land
    // on one worker one after another, and a partial placement could hold
    // some workers while the rest wait. The group is placed all at once on
    // distinct workers or waits whole.
    status = pcp_fabric_task_submit_group(jobs->fabric, &params,
                                          (uint32_t)workers, a->tasks);
    if (!status) {
      a->task_count = (uint32_t)workers;
    }
  }
  if (status) {
    for (uint32_t i = 0; i < a->task_count; ++i) {
      // The task borrows the input buffers until it is done.
      pcp_fabric_task_cancel(a->tasks[i]);
      pcp_fabric_task_wait(a->tasks[i], -1);
    }
    active_free(a);
    return status;
  }
  *out_active = a;
  return pcp_ok_status();
}

// Stores every output of every task (the run then returns OK: the runner
// turns the job succeeded).
static pcp_status_t job_results_store(pcp_workloads_jobs_t* jobs, active_t* a,
                                      json_t* worker_ids) {
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(jobs, a->id, dir, sizeof(dir));
  char results_dir[PCP_STORE_PATH_MAX_LENGTH + 16];
  snprintf(results_dir, sizeof(results_dir), "%s/results", dir);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(results_dir));
  for (uint32_t t = 0; t < a->task_count; ++t) {
    const pcp_proto_section_t* outputs = NULL;
    size_t count = 0;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_fabric_task_outputs(a->tasks[t], &outputs, &count));
    pcp_fabric_task_info_t info;
    pcp_fabric_task_info_query(a->tasks[t], &info);
    json_array_append_new(worker_ids, json_string(info.worker_id.value));
    for (size_t o = 0; o < count; ++o) {
      pcp_store_job_result_t r;
      memset(&r, 0, sizeof(r));
      snprintf(r.job_id, sizeof(r.job_id), "%s", a->id);
      if (a->task_count > 1) {
        snprintf(r.name, sizeof(r.name), "w%u.out%zu", t, o);
      } else {
        snprintf(r.name, sizeof(r.name), "out%zu", o);
      }
      r.dtype = outputs[o].element_type;
      r.rank = outputs[o].rank;
      memcpy(r.shape, outputs[o].shape, sizeof(r.shape));
      r.byte_length = outputs[o].byte_length;
      pcp_sha256_compute(outputs[o].data, outputs[o].byte_length, &r.sha256);
      int n =
          snprintf(r.path, sizeof(r.path), "%s/%s.bin", results_dir, r.name);
      if (n < 0 || (size_t)n >= sizeof(r.path)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "state_dir too long for result paths");
      }
      PCP_RETURN_IF_ERROR_BARE(pcp_file_write_atomic(
          r.path, outputs[o].data, (size_t)outputs[o].byte_length));
      pcp_status_t status = pcp_store_job_result_put(jobs->store, &r);
      // A re-run after a crash between put and the final transition finds
      // the same deterministic result already recorded.
      if (status && pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
        pcp_status_ignore(status);
        status = pcp_ok_status();
      }
      PCP_RETURN_IF_ERROR_BARE(status);
    }
  }
  return pcp_ok_status();
}

// Predicates of pcp_workloads_job_wait_for (evaluated under the runner's
// lock; the pool thread / the fabric callback set the state, then signal).
typedef struct slot_wait_t {
  pcp_workloads_jobs_t* jobs;
  compile_slot_t* slot;
} slot_wait_t;

static bool slot_done(void* arg) {
  slot_wait_t* w = arg;
  pthread_mutex_lock(&w->jobs->compile_mu);
  bool done = w->slot->state == COMPILE_SLOT_DONE;
  pthread_mutex_unlock(&w->jobs->compile_mu);
  return done;
}

static bool tasks_done(void* arg) {
  active_t* a = arg;
  return atomic_load(&a->done_count) >= a->task_count;
}

// Gives back the admission the kind's admit took for this run (once).
static void admission_release(pcp_workloads_jobs_t* jobs, bool* inout_held) {
  if (*inout_held) {
    pthread_mutex_lock(&jobs->compile_mu);
    --jobs->admitted;
    pthread_mutex_unlock(&jobs->compile_mu);
    *inout_held = false;
  }
}

// The compile phase of a StableHLO program: a free slot (the admission
// this run holds keeps one for it; the loop only guards the invariant),
// then the pool's answer. |*inout_bytes| is handed to the slot.
static pcp_status_t program_compile(
    pcp_workloads_jobs_t* jobs, pcp_workloads_job_t* run_job,
    bool* inout_admitted, const char* backend, const char* target,
    uint8_t** inout_bytes, size_t length,
    uint8_t out_program[PCP_SHA256_BYTE_LENGTH]) {
  if (strlen(backend) >= sizeof(jobs->compile_slots[0].backend) ||
      strlen(target) >= sizeof(jobs->compile_slots[0].target)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.backend or placement.target too long");
  }
  compile_slot_t* slot = NULL;
  while (!slot) {
    pthread_mutex_lock(&jobs->compile_mu);
    for (uint32_t i = 0; i < PCP_WORKLOADS_JOBS_COMPILE_SLOTS && !slot; ++i) {
      if (jobs->compile_slots[i].state == COMPILE_SLOT_FREE) {
        slot = &jobs->compile_slots[i];
      }
    }
    if (slot) {
      snprintf(slot->job_id, sizeof(slot->job_id), "%s",
               pcp_workloads_job_id(run_job));
      snprintf(slot->backend, sizeof(slot->backend), "%s", backend);
      snprintf(slot->target, sizeof(slot->target), "%s", target);
      slot->mlir = *inout_bytes;
      *inout_bytes = NULL;
      slot->mlir_byte_length = length;
      slot->status = pcp_ok_status();
      slot->waiter = run_job;
      slot->runner = pcp_workloads_job_runner(run_job);
      slot->state = COMPILE_SLOT_QUEUED;
      if (*inout_admitted) {
        // The slot now counts in place of the admission.
        --jobs->admitted;
        *inout_admitted = false;
      }
      pthread_cond_signal(&jobs->compile_cv);
    }
    pthread_mutex_unlock(&jobs->compile_mu);
    // Slots free without a signal to this run: a short timed wait.
    if (!slot && pcp_workloads_job_wait(run_job, 50)) {
      return pcp_make_status(PCP_STATUS_CANCELLED, "stopped");
    }
  }
  slot_wait_t wait = {jobs, slot};
  pcp_workloads_job_wait_for(run_job, slot_done, &wait, true, -1);
  pthread_mutex_lock(&jobs->compile_mu);
  pcp_status_t status;
  if (slot->state == COMPILE_SLOT_DONE) {
    status = slot->status;
    slot->status = pcp_ok_status();
    memcpy(out_program, slot->program, PCP_SHA256_BYTE_LENGTH);
    slot->state = COMPILE_SLOT_FREE;
  } else {
    // Cancelled or stopping: a queued compile is withdrawn; a running one
    // is cancelled (its child killed) and its pool thread frees the slot.
    if (slot->state == COMPILE_SLOT_QUEUED) {
      pcp_allocator_free(jobs->allocator, slot->mlir);
      slot->mlir = NULL;
      slot->state = COMPILE_SLOT_FREE;
    } else if (slot->request) {
      // Running: the child is killed (the queue keeps a compile another
      // request shares); the pool thread then frees the slot.
      pcp_workloads_compile_request_cancel(slot->request);
    }
    slot->waiter = NULL;
    status = pcp_make_status(PCP_STATUS_CANCELLED, "the job was stopped");
  }
  pthread_mutex_unlock(&jobs->compile_mu);
  return status;
}

// Waits for every task of |a|; a cancel reaches them through the kind's
// cancel. A stop leaves them running (the job stays running in the store
// and re-runs at the next start): |a| goes on the leftovers list, freed
// after the fabric endpoint (the tasks borrow its input buffers).
static pcp_status_t tasks_wait(pcp_workloads_jobs_t* jobs,
                               pcp_workloads_job_t* run_job, active_t* a,
                               bool* out_left) {
  *out_left = false;
  for (;;) {
    // Woken by each DONE callback, by a cancel or by a stop.
    if (pcp_workloads_job_wait_for(run_job, tasks_done, a, true, -1)) {
      return pcp_ok_status();
    }
    if (pcp_workloads_job_runner_stopping(run_job)) {
      pthread_mutex_lock(&jobs->mu);
      a->job = NULL;
      a->next = jobs->leftovers;
      jobs->leftovers = a;
      pthread_mutex_unlock(&jobs->mu);
      *out_left = true;
      return pcp_make_status(PCP_STATUS_CANCELLED, "the gateway stops");
    }
    // Cancelled: the tasks end with the workers' answers; wait for them
    // without the stop flag (it stays set).
    if (pcp_workloads_job_wait_for(run_job, tasks_done, a, false, 200)) {
      return pcp_ok_status();
    }
  }
}

// The kind's run: queued -> placing -> compiling -> running, then the
// results (the runner records the end).
static pcp_status_t jobs_run(void* self, pcp_workloads_job_t* run_job) {
  pcp_workloads_jobs_t* jobs = self;
  bool admitted = true;  // taken by jobs_admit for this run
  pcp_store_job_t job;
  pcp_status_t got =
      pcp_store_job_get(jobs->store, pcp_workloads_job_id(run_job), &job);
  if (got) {
    admission_release(jobs, &admitted);
    return got;
  }
  pcp_status_t status =
      pcp_workloads_job_transition(run_job, PCP_STORE_JOB_STATE_PLACING, NULL);
  json_int_t workers = 1;
  pcp_sched_worker_class_t worker_class;
  if (!status) {
    status = job_placement(&job, &workers, &worker_class);
  }
  if (!status) {
    status = pcp_workloads_job_transition(run_job,
                                          PCP_STORE_JOB_STATE_COMPILING, NULL);
  }
  json_t* placement = json_object_get(job.spec, "placement");
  const char* backend = placement_string(placement, "backend", "cpu");
  const char* target = placement_string(placement, "target", "");
  json_t* program = json_object_get(job.spec, "program");
  bool vmfb = strcmp(placement_string(program, "format", ""), "vmfb") == 0;
  uint8_t* bytes = NULL;
  size_t length = 0;
  if (!status) {
    char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
    job_dir(jobs, job.id, dir, sizeof(dir));
    char path[4096];
    snprintf(path, sizeof(path), "%s/program.%s", dir, vmfb ? "vmfb" : "mlir");
    status =
        file_read(path, PCP_WORKLOADS_JOBS_MAX_BODY_BYTES, &bytes, &length);
  }
  uint8_t program_hash[PCP_SHA256_BYTE_LENGTH];
  if (!status && vmfb) {
    status = pcp_fabric_program_register(jobs->fabric, bytes, length, backend,
                                         target, program_hash);
  } else if (!status) {
    // The slot takes the text (freed by the pool thread): a copy from this
    // module's allocator.
    uint8_t* text = NULL;
    status = pcp_allocator_malloc(jobs->allocator, length + 1, (void**)&text);
    if (!status) {
      memcpy(text, bytes, length);
      status = program_compile(jobs, run_job, &admitted, backend, target, &text,
                               length, program_hash);
      pcp_allocator_free(jobs->allocator, text);
    }
  }
  pcp_allocator_free(pcp_allocator_system(), bytes);
  admission_release(jobs, &admitted);  // VMFB, or a failure before a slot
  active_t* a = NULL;
  if (!status && pcp_workloads_job_should_stop(run_job)) {
    status = pcp_make_status(PCP_STATUS_CANCELLED, "the job was stopped");
  }
  if (!status) {
    status = job_launch(jobs, run_job, &job, program_hash, &a);
  }
  bool left = false;
  if (!status) {
    // Visible to the kind's cancel from now on; a cancel that came first
    // is passed on here.
    pthread_mutex_lock(&jobs->mu);
    pcp_workloads_job_user_data_set(run_job, a);
    bool cancel = pcp_workloads_job_cancel_requested(run_job);
    if (cancel) {
      for (uint32_t i = 0; i < a->task_count; ++i) {
        pcp_fabric_task_cancel(a->tasks[i]);
      }
      a->cancel_sent = true;
    }
    pthread_mutex_unlock(&jobs->mu);
    status = tasks_wait(jobs, run_job, a, &left);
    pthread_mutex_lock(&jobs->mu);
    pcp_workloads_job_user_data_set(run_job, NULL);
    pthread_mutex_unlock(&jobs->mu);
  }
  for (uint32_t t = 0; !status && t < a->task_count; ++t) {
    pcp_status_t s = pcp_fabric_task_status(a->tasks[t]);
    if (s) {
      status = pcp_make_status(pcp_status_code(s), "task %u: %s", t,
                               pcp_status_message(s));
    }
  }
  if (!status && pcp_workloads_job_cancel_requested(run_job)) {
    status = pcp_make_status(PCP_STATUS_CANCELLED, "cancelled");
  }
  if (!status) {
    json_t* record =
        json_pack("{s:O?, s:[]}", "requested", placement, "workers");
    status =
        record ? job_results_store(jobs, a, json_object_get(record, "workers"))
               : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "record");
    if (!status) {
      pcp_workloads_job_placement_set(run_job, record);
    }
    json_decref(record);
  }
  if (a && !left) {
    active_free(a);
  }
  pcp_store_job_deinitialize(&job);
  return status;
}

// While every compile slot is taken no generic job starts (VMFB ones
// included), as the runner thread before issue 14 did: the slots bound the
// compile backlog.
// Each admitted job holds an admission until it holds a slot or needs none
// (|admitted|), so one round admits at most the free slots. The own pool
// never refuses a job it is given; an injected executor that refuses one
// keeps its admission (a slot fewer until restart).
static bool jobs_admit(void* self, const pcp_store_job_t* job) {
  (void)job;
  pcp_workloads_jobs_t* jobs = self;
  pthread_mutex_lock(&jobs->compile_mu);
  uint32_t used = jobs->admitted;
  for (uint32_t i = 0; i < PCP_WORKLOADS_JOBS_COMPILE_SLOTS; ++i) {
    used += jobs->compile_slots[i].state != COMPILE_SLOT_FREE;
  }
  bool ok = used < PCP_WORKLOADS_JOBS_COMPILE_SLOTS;
  jobs->admitted += ok;
  pthread_mutex_unlock(&jobs->compile_mu);
  return ok;
}

// A cancel (not a stop: a stop leaves the tasks for the next start) reaches
// the job's tasks on the workers.
static void jobs_cancel(void* self, pcp_workloads_job_t* run_job) {
  pcp_workloads_jobs_t* jobs = self;
  if (!pcp_workloads_job_cancel_requested(run_job)) {
    return;
  }
  pthread_mutex_lock(&jobs->mu);
  active_t* a = pcp_workloads_job_user_data(run_job);
  if (a && !a->cancel_sent) {
    for (uint32_t i = 0; i < a->task_count; ++i) {
      pcp_fabric_task_cancel(a->tasks[i]);
    }
    a->cancel_sent = true;
  }
  pthread_mutex_unlock(&jobs->mu);
}

pcp_workloads_kind_t pcp_workloads_jobs_kind(pcp_workloads_jobs_t* jobs) {
  return (pcp_workloads_kind_t){
      .name = "generic",
      .max_running = PCP_WORKLOADS_JOBS_MAX_RUNNING,
      .self = jobs,
      .admit = jobs_admit,
      .run = jobs_run,
      .cancel = jobs_cancel,
  };
}

//===----------------------------------------------------------------------===//
// Create / release
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_jobs_create(
    const pcp_workloads_jobs_options_t* options, pcp_allocator_t allocator,
    pcp_workloads_jobs_t** out_jobs) {
  *out_jobs = NULL;
  if (!options->store) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "jobs options: 'store' is required");
  }
  if (!options->state_dir || !options->state_dir[0] ||
      strlen(options->state_dir) > PCP_STORE_PATH_MAX_LENGTH - 64) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "jobs options: 'state_dir' must be a path of 1..%d "
                           "bytes",
                           PCP_STORE_PATH_MAX_LENGTH - 64);
  }
  pcp_workloads_jobs_t* jobs = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*jobs), (void**)&jobs));
  size_t n = strlen(options->state_dir) + 1;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, n, (void**)&jobs->state_dir);
  if (status) {
    pcp_allocator_free(allocator, jobs);
    return status;
  }
  memcpy(jobs->state_dir, options->state_dir, n);
  jobs->allocator = allocator;
  jobs->store = options->store;
  jobs->clock = options->clock.now_ns ? options->clock : pcp_clock_system();
  jobs->log = options->log;
  pthread_mutex_init(&jobs->mu, NULL);
  pthread_mutex_init(&jobs->compile_mu, NULL);
  pthread_cond_init(&jobs->compile_cv, NULL);
  *out_jobs = jobs;
  return pcp_ok_status();
}

void pcp_workloads_jobs_release(pcp_workloads_jobs_t* jobs) {
  if (!jobs) {
    return;
  }
  pcp_workloads_jobs_stop(jobs);
  while (jobs->leftovers) {
    active_t* a = jobs->leftovers;
    jobs->leftovers = a->next;
    active_free(a);
  }
  pthread_cond_destroy(&jobs->compile_cv);
  pthread_mutex_destroy(&jobs->compile_mu);
  pthread_mutex_destroy(&jobs->mu);
  pcp_allocator_free(jobs->allocator, jobs->state_dir);
  pcp_allocator_free(jobs->allocator, jobs);
}
