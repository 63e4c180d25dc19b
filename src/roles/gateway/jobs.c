// SPDX-License-Identifier: Apache-2.0
// Generic jobs: a program (StableHLO text or VMFB), a function, input
// tensors and placement constraints in; output tensors out.
//
// Durability: the program and inputs are written as files under
// <state_dir>/jobs/<id>/ (fsynced, renamed into place) BEFORE the job row is
// created, so every job in the store has its files; a crash in between
// leaves only unreferenced files. Results are written as files first and
// recorded next, and the job turns succeeded only after all of them are
// recorded: a finished job never lacks a result. The job's state and events
// live in the store, which enforces the transition table.
//
// One runner thread moves jobs: queued -> placing -> compiling -> running ->
// succeeded | failed, and cancelling -> cancelled. Compiling runs
// pcp_compile_module, which runs iree-compile as a child process (never
// MLIR in this process) and caches artifacts by (content, backend, target,
// compiler), so a program is compiled once per (backend, target). A
// restarted gateway turns every job it finds placing/compiling/running back
// to queued (re-run; generic jobs have no steps to resume from) and
// finishes cancelling ones as cancelled (pcp_roles_gateway_jobs_recover).

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "roles/gateway/gateway_impl.h"

struct pcp_roles_gateway_active_job_t {
  pcp_roles_gateway_active_job_t* next;
  char id[PCP_STORE_ID_MAX_LENGTH + 1];
  uint32_t task_count;
  pcp_fabric_task_t* tasks[PCP_GATEWAY_JOB_MAX_WORKERS];
  pcp_proto_section_t sections[PCP_GATEWAY_JOB_MAX_INPUTS];
  void* input_data[PCP_GATEWAY_JOB_MAX_INPUTS];
  char input_names[PCP_GATEWAY_JOB_MAX_INPUTS][32];
  uint32_t input_count;
  bool cancel_sent;
};

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

static pcp_status_t make_dir(const char* path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    return pcp_status_from_errno(errno, "mkdir %s", path);
  }
  return pcp_ok_status();
}

// Writes |data| to |path| through a temp file, fsync and rename, so a
// reader never sees a half-written file.
static pcp_status_t file_write_atomic(const char* path, const void* data,
                                      size_t length) {
  char tmp[4096 + 8];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "open %s", tmp);
  }
  const uint8_t* p = data;
  size_t left = length;
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      int err = errno;
      close(fd);
      unlink(tmp);
      return pcp_status_from_errno(err, "write %s", tmp);
    }
    p += n;
    left -= (size_t)n;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    int err = errno;
    unlink(tmp);
    return pcp_status_from_errno(err, "fsync %s", tmp);
  }
  if (rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return pcp_status_from_errno(err, "rename %s", tmp);
  }
  return pcp_ok_status();
}

static pcp_status_t file_read(const char* path, size_t max_length,
                              uint8_t** out_data, size_t* out_length) {
  *out_data = NULL;
  *out_length = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "open %s", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size > max_length) {
    close(fd);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%s too large", path);
  }
  // 64-byte aligned: tensors and VMFBs are read in place.
  size_t size = (size_t)st.st_size;
  uint8_t* data = aligned_alloc(64, (size + 64) / 64 * 64);
  if (!data) {
    close(fd);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom reading %s",
                           path);
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      close(fd);
      free(data);
      return pcp_make_status(PCP_STATUS_DATA_LOSS, "short read of %s", path);
    }
    done += (size_t)n;
  }
  close(fd);
  *out_data = data;
  *out_length = size;
  return pcp_ok_status();
}

static void job_dir(const pcp_roles_gateway_state_t* g, const char* id,
                    char* buffer, size_t capacity) {
  snprintf(buffer, capacity, "%s/jobs/%s", g->config->file.state_dir, id);
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

json_t* pcp_roles_gateway_job_json(const pcp_store_job_t* job) {
  json_t* spec = json_deep_copy(job->spec);
  return json_pack(
      "{s:s, s:s, s:s, s:o, s:O?, s:I, s:I, s:i, s:s?}", "job_id", job->id,
      "kind", job->kind, "state", pcp_store_job_state_name(job->state), "spec",
      spec ? spec : json_object(), "placement", job->placement, "created_at_ms",
      (json_int_t)(job->created_at_ns / 1000000), "updated_at_ms",
      (json_int_t)(job->updated_at_ns / 1000000), "attempt", (int)job->attempt,
      "error", job->error[0] ? job->error : NULL);
}

static json_t* event_json(const pcp_store_job_event_t* e) {
  return json_pack(
      "{s:I, s:s, s:s, s:s?, s:s?, s:O, s:I}", "event_id",
      (json_int_t)e->event_id, "job_id", e->job_id, "type", e->type, "from",
      e->has_from_state ? pcp_store_job_state_name(e->from_state) : NULL, "to",
      e->has_states ? pcp_store_job_state_name(e->to_state) : NULL, "payload",
      e->payload, "created_at_ms", (json_int_t)(e->created_at_ns / 1000000));
}

//===----------------------------------------------------------------------===//
// Submission
//===----------------------------------------------------------------------===//

static atomic_uint_fast64_t g_job_counter;

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
    if (dim && n > PCP_GATEWAY_JOB_MAX_BODY_BYTES / dim) {
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
  pcp_roles_gateway_state_t* g;
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
  pcp_status_t status = pcp_roles_gateway_base64_decode(
      json_string_value(encoded), json_string_length(encoded), &bytes, &length);
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
      status = file_write_atomic(path, bytes, length);
    }
  } else {
    // The .npy reader takes a path: the upload goes through a temp file.
    char npy_path[4096];
    snprintf(npy_path, sizeof(npy_path), "%s/input%zu.npy", s->dir, index);
    status = file_write_atomic(npy_path, bytes, length);
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
      status = file_write_atomic(path, tensor.data, tensor.byte_length);
    }
    pcp_host_tensor_deinitialize(&tensor);
  }
  free(bytes);
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
    pcp_status_t status = pcp_roles_gateway_base64_decode(
        json_string_value(b64), json_string_length(b64), &bytes, &length);
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "program.base64: %s",
                          pcp_status_message(status));
      pcp_status_ignore(status);
      return wrapped;
    }
  } else if (json_is_string(text) && !vmfb) {
    length = json_string_length(text);
    bytes = malloc(length + 1);
    if (!bytes) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
    }
    memcpy(bytes, json_string_value(text), length);
  } else {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program.base64' (or 'program.text' for "
                           "stablehlo) is required");
  }
  if (length == 0) {
    free(bytes);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'program': empty program");
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/program.%s", s->dir, vmfb ? "vmfb" : "mlir");
  pcp_status_t status = file_write_atomic(path, bytes, length);
  pcp_sha256_t digest;
  pcp_sha256_compute(bytes, length, &digest);
  free(bytes);
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
       json_integer_value(workers) > PCP_GATEWAY_JOB_MAX_WORKERS)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'placement.workers' must be an integer in "
                           "[1, %d]",
                           PCP_GATEWAY_JOB_MAX_WORKERS);
  }
  json_t* inputs = json_object_get(body, "inputs");
  if (inputs && (!json_is_array(inputs) ||
                 json_array_size(inputs) > PCP_GATEWAY_JOB_MAX_INPUTS)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'inputs' must be an array of at most %d "
                           "tensors",
                           PCP_GATEWAY_JOB_MAX_INPUTS);
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

// A raw body is the program itself; the rest comes from the query string.
static pcp_status_t submission_from_raw(submission_t* s,
                                        const pcp_http_request_t* request) {
  pcp_string_view_t body = pcp_http_request_body(request);
  const char* format = pcp_http_request_query(request, "format");
  if (!format) {
    const char* type = pcp_http_request_header(request, "Content-Type");
    format = type && strncmp(type, "text/", 5) == 0 ? "stablehlo" : "vmfb";
  }
  json_t* fake = json_object();
  json_t* program = json_object();
  json_object_set_new(fake, "program", program);
  json_object_set_new(program, "format", json_string(format));
  // The raw bytes are re-encoded only in memory; this keeps one validation
  // path for both forms.
  if (strcmp(format, "stablehlo") == 0) {
    json_object_set_new(program, "text",
                        json_stringn((const char*)body.data, body.size));
  } else {
    static const char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = (body.size + 2) / 3 * 4;
    char* text = malloc(n + 1);
    if (!text) {
      json_decref(fake);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
    }
    const uint8_t* in = (const uint8_t*)body.data;
    size_t o = 0;
    for (size_t i = 0; i < body.size; i += 3) {
      uint32_t v = (uint32_t)in[i] << 16;
      if (i + 1 < body.size) {
        v |= (uint32_t)in[i + 1] << 8;
      }
      if (i + 2 < body.size) {
        v |= in[i + 2];
      }
      char quad[4] = {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=',
                      '='};
      if (i + 1 < body.size) {
        quad[2] = kAlphabet[(v >> 6) & 63];
      }
      if (i + 2 < body.size) {
        quad[3] = kAlphabet[v & 63];
      }
      memcpy(text + o, quad, 4);
      o += 4;
    }
    text[o] = 0;
    json_object_set_new(program, "base64", json_stringn(text, o));
    free(text);
  }
  const char* function = pcp_http_request_query(request, "function");
  if (function) {
    json_object_set_new(fake, "function", json_string(function));
  }
  json_t* placement = json_object();
  json_object_set_new(fake, "placement", placement);
  const char* keys[] = {"backend", "target"};
  for (size_t i = 0; i < 2; ++i) {
    const char* v = pcp_http_request_query(request, keys[i]);
    if (v) {
      json_object_set_new(placement, keys[i], json_string(v));
    }
  }
  const char* workers = pcp_http_request_query(request, "workers");
  if (workers) {
    char* end = NULL;
    long long w = strtoll(workers, &end, 10);
    json_object_set_new(placement, "workers",
                        end && *end == 0 ? json_integer(w) : json_string(""));
  }
  pcp_status_t status = submission_from_json(s, fake);
  json_decref(fake);
  return status;
}

static void remove_dir(const char* dir) {
  // Only files this module wrote: program.*, input*.bin.
  char path[4096];
  const char* names[] = {"program.mlir", "program.vmfb"};
  for (size_t i = 0; i < 2; ++i) {
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    unlink(path);
  }
  for (int i = 0; i < PCP_GATEWAY_JOB_MAX_INPUTS; ++i) {
    snprintf(path, sizeof(path), "%s/input%d.bin", dir, i);
    unlink(path);
  }
  rmdir(dir);
}

pcp_status_t pcp_roles_gateway_job_submit(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  submission_t s = {.g = g};
  snprintf(s.id, sizeof(s.id), "job-%" PRIx64 "-%" PRIu64,
           (uint64_t)pcp_clock_wall_ns(g->clock),
           (uint64_t)atomic_fetch_add(&g_job_counter, 1));
  char jobs_root[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(jobs_root, sizeof(jobs_root), "%s/jobs", g->config->file.state_dir);
  PCP_RETURN_IF_ERROR_BARE(make_dir(jobs_root));
  job_dir(g, s.id, s.dir, sizeof(s.dir));
  PCP_RETURN_IF_ERROR_BARE(make_dir(s.dir));
  s.spec = json_object();
  const char* type = pcp_http_request_header(request, "Content-Type");
  pcp_status_t status;
  // A raw body is the program itself (octet-stream: VMFB or text; text/*:
  // StableHLO); anything else is the JSON form.
  bool raw = type && (strncmp(type, "application/octet-stream", 24) == 0 ||
                      strncmp(type, "text/", 5) == 0);
  if (!raw) {
    json_t* body = NULL;
    status = pcp_http_request_json_parse(request, &body);
    if (!status) {
      status = submission_from_json(&s, body);
    }
    json_decref(body);
  } else {
    status = submission_from_raw(&s, request);
  }
  int64_t event_id = 0;
  if (!status) {
    status = pcp_store_job_create(g->store, s.id, "generic", s.spec, &event_id);
    atomic_fetch_add(&g->job_generation, 1);
  }
  if (status) {
    json_decref(s.spec);
    remove_dir(s.dir);
    return status;
  }
  json_decref(s.spec);
  pcp_store_job_t job;
  pcp_status_t get_status = pcp_store_job_get(g->store, s.id, &job);
  // Wake the runner only now, so the answer usually shows "queued".
  pthread_mutex_lock(&g->mu);
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  PCP_RETURN_IF_ERROR_BARE(get_status);
  json_t* out = pcp_roles_gateway_job_json(&job);
  pcp_store_job_deinitialize(&job);
  char location[128];
  snprintf(location, sizeof(location), "/v1/jobs/%s", s.id);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Location", location));
  return pcp_http_response_json_take(response, 202, out);
}

//===----------------------------------------------------------------------===//
// Queries and cancel
//===----------------------------------------------------------------------===//

pcp_status_t pcp_roles_gateway_job_list(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  pcp_store_job_filter_t filter = {0};
  const char* states = pcp_http_request_query(request, "state");
  if (states) {
    const char* p = states;
    while (*p) {
      const char* comma = strchr(p, ',');
      size_t n = comma ? (size_t)(comma - p) : strlen(p);
      pcp_store_job_state_t state;
      if (!pcp_store_job_state_parse((pcp_string_view_t){p, n}, &state)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "query 'state': unknown state '%.*s'", (int)n,
                               p);
      }
      filter.states |= PCP_STORE_JOB_STATE_BIT(state);
      p += n + (comma ? 1 : 0);
    }
  }
  filter.kind = pcp_http_request_query(request, "kind");
  filter.after_id = pcp_http_request_query(request, "after");
  const char* limit = pcp_http_request_query(request, "limit");
  if (limit) {
    char* end = NULL;
    long long v = strtoll(limit, &end, 10);
    if (!end || *end || v < 1 || v > PCP_STORE_LIST_LIMIT_MAX) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "query 'limit' must be an integer in [1, %u]",
                             PCP_STORE_LIST_LIMIT_MAX);
    }
    filter.limit = (uint32_t)v;
  }
  pcp_store_job_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_list(g->store, &filter, &list));
  json_t* jobs = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_t* one = pcp_roles_gateway_job_json(&list.items[i]);
    if (one) {
      pcp_roles_gateway_training_json_merge(g, one);
    }
    json_array_append_new(jobs, one);
  }
  pcp_store_job_list_deinitialize(&list);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "jobs", jobs));
}

static size_t cache_slot(const char* id) {
  // FNV-1a: ids are short and this runs per request.
  uint64_t h = UINT64_C(1469598103934665603);
  for (const char* p = id; *p; ++p) {
    h = (h ^ (uint8_t)*p) * UINT64_C(1099511628211);
  }
  return (size_t)(h % PCP_GATEWAY_JOB_CACHE_SLOTS);
}

pcp_status_t pcp_roles_gateway_job_get(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  // Job polling is the hot read: the answer is served from memory while no
  // job was written since it was built (bench/http), else from the store.
  bool cacheable = strlen(id) < sizeof(g->job_cache[0].id);
  size_t slot = cacheable ? cache_slot(id) : 0;
  uint64_t generation = atomic_load(&g->job_generation);
  if (cacheable) {
    pthread_mutex_lock(&g->cache_mu);
    pcp_roles_gateway_job_cache_entry_t* e = &g->job_cache[slot];
    if (e->json && e->generation == generation && strcmp(e->id, id) == 0) {
      pcp_status_t status = pcp_http_response_body_set(
          response, 200, "application/json", e->json, e->length);
      pthread_mutex_unlock(&g->cache_mu);
      return status;
    }
    pthread_mutex_unlock(&g->cache_mu);
  }
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  json_t* out = pcp_roles_gateway_job_json(&job);
  pcp_store_job_deinitialize(&job);
  if (out) {
    pcp_roles_gateway_training_json_merge(g, out);
  }
  char* text = out ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(out);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  size_t length = strlen(text);
  pcp_status_t status = pcp_http_response_body_set(
      response, 200, "application/json", text, length);
  if (cacheable) {
    // Tagged with the generation read BEFORE the store read: a write in
    // between makes the entry stale at once, never wrongly fresh.
    pthread_mutex_lock(&g->cache_mu);
    pcp_roles_gateway_job_cache_entry_t* e = &g->job_cache[slot];
    free(e->json);
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->generation = generation;
    e->json = text;
    e->length = length;
    text = NULL;
    pthread_mutex_unlock(&g->cache_mu);
  }
  free(text);
  return status;
}

void pcp_roles_gateway_jobs_cache_free(pcp_roles_gateway_state_t* g) {
  for (size_t i = 0; i < PCP_GATEWAY_JOB_CACHE_SLOTS; ++i) {
    free(g->job_cache[i].json);
    g->job_cache[i].json = NULL;
  }
}

pcp_status_t pcp_roles_gateway_job_cancel(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  // The runner's cancel: the store arbitrates a race with the job's own
  // moves; a running training job is woken through its condition variable.
  pcp_store_job_state_t state = PCP_STORE_JOB_STATE_QUEUED;
  bool changed = false;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_runner_job_cancel(g->runner, id, &state, &changed));
  if (!changed) {
    return pcp_http_response_json_take(
        response, 200,
        json_pack("{s:b, s:s, s:s}", "accepted",
                  state == PCP_STORE_JOB_STATE_CANCELLING, "status",
                  pcp_store_job_state_name(state), "job_id", id));
  }
  // The generic runner notices at once.
  pthread_mutex_lock(&g->mu);
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  return pcp_http_response_json_take(
      response, state == PCP_STORE_JOB_STATE_CANCELLING ? 202 : 200,
      json_pack("{s:b, s:s, s:s}", "accepted", 1, "status",
                pcp_store_job_state_name(state), "job_id", id));
}

pcp_status_t pcp_roles_gateway_job_events(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  pcp_store_job_deinitialize(&job);
  // ?after=EVENT_ID pages on: one answer holds at most
  // PCP_STORE_LIST_LIMIT_MAX events ("more" says another page follows).
  int64_t after = 0;
  const char* after_text = pcp_http_request_query(request, "after");
  if (after_text) {
    char* end = NULL;
    errno = 0;
    long long v = strtoll(after_text, &end, 10);
    if (!after_text[0] || !end || *end || v < 0 || errno == ERANGE) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "query 'after' must be an event id in [0, "
                             "9223372036854775807]");
    }
    after = v;
  }
  pcp_store_job_event_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_event_list(
      g->store, after, id, PCP_STORE_LIST_LIMIT_MAX, &list));
  json_t* events = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_array_append_new(events, event_json(&list.items[i]));
  }
  bool more = list.count == PCP_STORE_LIST_LIMIT_MAX;
  pcp_store_job_event_list_deinitialize(&list);
  return pcp_http_response_json_take(
      response, 200, json_pack("{s:o, s:b}", "events", events, "more", more));
}

static json_t* result_json(const pcp_store_job_result_t* r) {
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

pcp_status_t pcp_roles_gateway_job_results(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  pcp_store_job_deinitialize(&job);
  pcp_store_job_result_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_result_list(g->store, id, &list));
  json_t* results = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_array_append_new(results, result_json(&list.items[i]));
  }
  pcp_store_job_result_list_deinitialize(&list);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "results", results));
}

pcp_status_t pcp_roles_gateway_job_result_get(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  const char* name = pcp_http_request_param(request, "name");
  const char* format = pcp_http_request_query(request, "format");
  if (format && strcmp(format, "raw") != 0 && strcmp(format, "npy") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "query 'format' must be raw or npy");
  }
  pcp_store_job_result_t r;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_result_get(g->store, id, name, &r));
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&r.sha256, hex);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "X-Content-SHA256", hex));
  if (!format || strcmp(format, "raw") == 0) {
    return pcp_http_response_file_set(response, 200, "application/octet-stream",
                                      r.path);
  }
  uint8_t* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      file_read(r.path, (size_t)r.byte_length, &data, &length));
  pcp_tensor_shape_t shape = {.element_type = r.dtype, .rank = (int32_t)r.rank};
  memcpy(shape.dims, r.shape, sizeof(shape.dims));
  pcp_host_tensor_t tensor;
  pcp_status_t status = pcp_host_tensor_wrap(&shape, data, length, &tensor);
  // The .npy writer takes a path; the file is unlinked once opened for the
  // response (the open descriptor keeps it readable).
  char path[4096];
  snprintf(path, sizeof(path), "%s.%" PRIu64 ".npy", r.path,
           (uint64_t)atomic_fetch_add(&g_job_counter, 1));
  if (!status) {
    status = pcp_host_tensor_write_npy(&tensor, path, false);
  }
  if (!status) {
    status = pcp_http_response_file_set(response, 200,
                                        "application/octet-stream", path);
  }
  unlink(path);
  free(data);
  return status;
}

//===----------------------------------------------------------------------===//
// Runner
//===----------------------------------------------------------------------===//

// Every move goes through the runner's one transition function (the
// answer cache is told through its |changed| hook).
static pcp_status_t transition(pcp_roles_gateway_state_t* g, const char* id,
                               pcp_store_job_state_t to, const char* error,
                               const json_t* placement) {
  pcp_store_job_transition_params_t params = {.placement = placement,
                                              .error = error};
  return pcp_workloads_runner_transition(g->runner, id, to, &params);
}

static void fail_job(pcp_roles_gateway_state_t* g, const char* id,
                     pcp_status_t cause) {
  char message[PCP_STORE_ERROR_MAX_LENGTH + 1];
  snprintf(message, sizeof(message), "%s: %s",
           pcp_status_code_string(pcp_status_code(cause)),
           pcp_status_message(cause));
  pcp_status_ignore(cause);
  pcp_log_context_t log = g->log;
  log.job_id = id;
  // A cancel that raced the start (queued -> placing -> compiling) leaves
  // the job cancelling and makes the next step fail: the user asked for a
  // cancel, so it ends cancelled, not failed.
  pcp_store_job_t current;
  pcp_status_t got = pcp_store_job_get(g->store, id, &current);
  bool cancelling = !got && current.state == PCP_STORE_JOB_STATE_CANCELLING;
  if (!got) {
    pcp_store_job_deinitialize(&current);
  }
  pcp_status_ignore(got);
  if (cancelling) {
    PCP_LOG(PCP_LOG_INFO, &log, "job cancelled while starting (%s)", message);
    pcp_status_ignore(
        transition(g, id, PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL));
    pcp_obs_family_add(g->job_runs_family, (const char*[]){"cancelled"}, 1);
    return;
  }
  PCP_LOG(PCP_LOG_WARN, &log, "job failed: %s", message);
  pcp_status_t status =
      transition(g, id, PCP_STORE_JOB_STATE_FAILED, message, NULL);
  if (status && pcp_status_code(status) == PCP_STATUS_FAILED_PRECONDITION) {
    // It was cancelled meanwhile: cancelling -> cancelled.
    pcp_status_ignore(status);
    status = transition(g, id, PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL);
  }
  pcp_status_ignore(status);
  pcp_obs_family_add(g->job_runs_family, (const char*[]){"failed"}, 1);
}

static void active_free(pcp_roles_gateway_active_job_t* a) {
  for (uint32_t i = 0; i < a->task_count; ++i) {
    pcp_fabric_task_release(a->tasks[i]);
  }
  for (uint32_t i = 0; i < a->input_count; ++i) {
    free(a->input_data[i]);
  }
  free(a);
}

// Marker that makes the test hook delay a compile (see gateway_impl.h).
#define TEST_SLOW_COMPILE_MARKER "pcp-test:slow-compile"

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
  if (workers > PCP_GATEWAY_JOB_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.workers %lld is over %d",
                           (long long)workers, PCP_GATEWAY_JOB_MAX_WORKERS);
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

// Pool thread: one StableHLO program to a VMFB (artifact cache under
// state_dir/artifacts), registered with the fabric.
static pcp_status_t compile_slot_run(pcp_roles_gateway_state_t* g,
                                     pcp_roles_gateway_compile_slot_t* slot) {
  if (g->test_compile_delay_ms > 0) {
    size_t n = strlen(TEST_SLOW_COMPILE_MARKER);
    for (size_t i = 0; i + n <= slot->mlir_byte_length; ++i) {
      if (memcmp(slot->mlir + i, TEST_SLOW_COMPILE_MARKER, n) == 0) {
        pcp_sleep_ms(g->test_compile_delay_ms);
        break;
      }
    }
  }
  pcp_compile_backend_t compile_backend = PCP_COMPILE_BACKEND_CPU;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_compile_backend_parse(slot->backend, &compile_backend));
  char cache[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(cache, sizeof(cache), "%s/artifacts", g->config->file.state_dir);
  pcp_compile_request_t request = {
      .mlir_text = (const char*)slot->mlir,
      .mlir_byte_length = slot->mlir_byte_length,
      .source_name = "program.mlir",
      .backend = compile_backend,
      .target = slot->target,
      .cache_dir = cache,
      .timeout_ms = 600000,
  };
  pcp_compile_result_t compiled = {0};
  pcp_status_t status = pcp_compile_module(&request, &compiled);
  if (!status) {
    pcp_log_context_t log = g->log;
    log.job_id = slot->job_id;
    PCP_LOG(PCP_LOG_INFO, &log,
            "program ready backend=%s target=%s cache_hit=%d seconds=%.3f",
            slot->backend, compiled.flags.effective_target, compiled.cache_hit,
            compiled.compile_seconds);
    status = pcp_fabric_program_register(
        g->fabric, compiled.vmfb, compiled.vmfb_byte_length, slot->backend,
        slot->target, slot->program);
  }
  pcp_compile_result_deinitialize(&compiled);
  return status;
}

static void* compile_thread_main(void* opaque) {
  pcp_roles_gateway_state_t* g = opaque;
  pthread_mutex_lock(&g->compile_mu);
  // At stop, queued compiles are left (their jobs re-run at the next start)
  // rather than run one after another while the process is exiting.
  while (!atomic_load(&g->stopping)) {
    pcp_roles_gateway_compile_slot_t* slot = NULL;
    for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS && !slot; ++i) {
      if (g->compile_slots[i].state == PCP_GATEWAY_COMPILE_SLOT_QUEUED) {
        slot = &g->compile_slots[i];
      }
    }
    if (!slot) {
      pthread_cond_wait(&g->compile_cv, &g->compile_mu);
      continue;
    }
    slot->state = PCP_GATEWAY_COMPILE_SLOT_RUNNING;
    pthread_mutex_unlock(&g->compile_mu);
    // Only this thread touches a RUNNING slot, so no lock while compiling.
    pcp_status_t status = compile_slot_run(g, slot);
    free(slot->mlir);
    slot->mlir = NULL;
    pthread_mutex_lock(&g->compile_mu);
    slot->status = status;
    slot->state = PCP_GATEWAY_COMPILE_SLOT_DONE;
    pthread_mutex_unlock(&g->compile_mu);
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_lock(&g->compile_mu);
  }
  pthread_mutex_unlock(&g->compile_mu);
  return NULL;
}

pcp_status_t pcp_roles_gateway_compile_pool_start(
    pcp_roles_gateway_state_t* g) {
  const char* delay = getenv("PCP_GATEWAY_TEST_COMPILE_DELAY_MS");
  g->test_compile_delay_ms = delay ? strtoll(delay, NULL, 10) : 0;
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_THREADS; ++i) {
    if (pthread_create(&g->compile_threads[i], NULL, compile_thread_main, g)) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE, "compile pool thread");
    }
    ++g->compile_thread_count;
  }
  return pcp_ok_status();
}

void pcp_roles_gateway_compile_pool_stop(pcp_roles_gateway_state_t* g) {
  atomic_store(&g->stopping, true);
  pthread_mutex_lock(&g->compile_mu);
  pthread_cond_broadcast(&g->compile_cv);
  pthread_mutex_unlock(&g->compile_mu);
  for (uint32_t i = 0; i < g->compile_thread_count; ++i) {
    pthread_join(g->compile_threads[i], NULL);
  }
  g->compile_thread_count = 0;
  // Queued slots never ran (their jobs stay compiling and re-run at the
  // next start); done ones were not taken.
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS; ++i) {
    pcp_roles_gateway_compile_slot_t* slot = &g->compile_slots[i];
    free(slot->mlir);
    slot->mlir = NULL;
    pcp_status_ignore(slot->status);
    slot->status = pcp_ok_status();
    slot->state = PCP_GATEWAY_COMPILE_SLOT_FREE;
  }
}

static uint32_t compile_slots_in_use(pcp_roles_gateway_state_t* g) {
  uint32_t used = 0;
  pthread_mutex_lock(&g->compile_mu);
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS; ++i) {
    used += g->compile_slots[i].state != PCP_GATEWAY_COMPILE_SLOT_FREE;
  }
  pthread_mutex_unlock(&g->compile_mu);
  return used;
}

static bool is_compiling(pcp_roles_gateway_state_t* g, const char* id) {
  bool found = false;
  pthread_mutex_lock(&g->compile_mu);
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS && !found; ++i) {
    found = g->compile_slots[i].state != PCP_GATEWAY_COMPILE_SLOT_FREE &&
            strcmp(g->compile_slots[i].job_id, id) == 0;
  }
  pthread_mutex_unlock(&g->compile_mu);
  return found;
}

static pcp_status_t job_launch(
    pcp_roles_gateway_state_t* g, const pcp_store_job_t* job,
    const uint8_t program_hash[PCP_SHA256_BYTE_LENGTH],
    pcp_roles_gateway_active_job_t** out_active);

// queued -> placing -> compiling; a VMFB goes on to running at once, a
// StableHLO program into a free compile slot (the runner launches it when
// the pool is done): OK with *out_active NULL then. RESOURCE_EXHAUSTED when
// no slot is free (the caller checks first, so only a race gets it).
static pcp_status_t job_start(pcp_roles_gateway_state_t* g,
                              const pcp_store_job_t* job,
                              pcp_roles_gateway_active_job_t** out_active) {
  *out_active = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      transition(g, job->id, PCP_STORE_JOB_STATE_PLACING, NULL, NULL));
  json_int_t workers = 1;
  pcp_sched_worker_class_t worker_class;
  PCP_RETURN_IF_ERROR_BARE(job_placement(job, &workers, &worker_class));
  PCP_RETURN_IF_ERROR_BARE(
      transition(g, job->id, PCP_STORE_JOB_STATE_COMPILING, NULL, NULL));
  json_t* placement = json_object_get(job->spec, "placement");
  const char* backend = placement_string(placement, "backend", "cpu");
  const char* target = placement_string(placement, "target", "");
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(g, job->id, dir, sizeof(dir));
  json_t* program = json_object_get(job->spec, "program");
  bool vmfb = strcmp(placement_string(program, "format", ""), "vmfb") == 0;
  char path[4096];
  snprintf(path, sizeof(path), "%s/program.%s", dir, vmfb ? "vmfb" : "mlir");
  uint8_t* bytes = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      file_read(path, PCP_GATEWAY_JOB_MAX_BODY_BYTES, &bytes, &length));
  if (vmfb) {
    uint8_t program_hash[PCP_SHA256_BYTE_LENGTH];
    pcp_status_t status = pcp_fabric_program_register(
        g->fabric, bytes, length, backend, target, program_hash);
    free(bytes);
    PCP_RETURN_IF_ERROR_BARE(status);
    return job_launch(g, job, program_hash, out_active);
  }
  if (strlen(backend) >= sizeof(g->compile_slots[0].backend) ||
      strlen(target) >= sizeof(g->compile_slots[0].target)) {
    free(bytes);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "placement.backend or placement.target too long");
  }
  pcp_roles_gateway_compile_slot_t* slot = NULL;
  pthread_mutex_lock(&g->compile_mu);
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS && !slot; ++i) {
    if (g->compile_slots[i].state == PCP_GATEWAY_COMPILE_SLOT_FREE) {
      slot = &g->compile_slots[i];
    }
  }
  if (slot) {
    snprintf(slot->job_id, sizeof(slot->job_id), "%s", job->id);
    snprintf(slot->backend, sizeof(slot->backend), "%s", backend);
    snprintf(slot->target, sizeof(slot->target), "%s", target);
    slot->mlir = bytes;
    slot->mlir_byte_length = length;
    slot->status = pcp_ok_status();
    slot->state = PCP_GATEWAY_COMPILE_SLOT_QUEUED;
    pthread_cond_signal(&g->compile_cv);
  }
  pthread_mutex_unlock(&g->compile_mu);
  if (!slot) {
    free(bytes);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "no free compile slot");
  }
  return pcp_ok_status();
}

// compiling -> running: inputs read, one gang of tasks submitted.
static pcp_status_t job_launch(
    pcp_roles_gateway_state_t* g, const pcp_store_job_t* job,
    const uint8_t program_hash[PCP_SHA256_BYTE_LENGTH],
    pcp_roles_gateway_active_job_t** out_active) {
  *out_active = NULL;
  json_int_t workers = 1;
  pcp_sched_worker_class_t worker_class;
  PCP_RETURN_IF_ERROR_BARE(job_placement(job, &workers, &worker_class));
  json_t* placement = json_object_get(job->spec, "placement");
  const char* target = placement_string(placement, "target", "");
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(g, job->id, dir, sizeof(dir));
  char path[4096];
  size_t length = 0;
  pcp_status_t status = pcp_ok_status();
  pcp_roles_gateway_active_job_t* a = calloc(1, sizeof(*a));
  if (!a) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  snprintf(a->id, sizeof(a->id), "%s", job->id);
  json_t* inputs = json_object_get(job->spec, "inputs");
  for (size_t i = 0; !status && i < json_array_size(inputs); ++i) {
    json_t* in = json_array_get(inputs, i);
    snprintf(path, sizeof(path), "%s/input%zu.bin", dir, i);
    uint8_t* data = NULL;
    status = file_read(path, PCP_GATEWAY_JOB_MAX_BODY_BYTES, &data, &length);
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
    status = transition(g, job->id, PCP_STORE_JOB_STATE_RUNNING, NULL, NULL);
  }
  const char* function = placement_string(job->spec, "function", "main");
  if (!status) {
    pcp_fabric_task_params_t params = {
        .function = function,
        .inputs = a->sections,
        .input_count = a->input_count,
        .worker_class = worker_class,
        .target = target,
    };
    memcpy(params.program, program_hash, PCP_SHA256_BYTE_LENGTH);
    // One gang, not |workers| separate tasks: separate tasks could all land
    // on one worker one after another, and a partial placement could hold
    // some workers while the rest wait. The group is placed all at once on
    // distinct workers or waits whole.
    status = pcp_fabric_task_submit_group(g->fabric, &params, (uint32_t)workers,
                                          a->tasks);
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

// Stores every output of every task, then turns the job succeeded.
static pcp_status_t job_results_store(pcp_roles_gateway_state_t* g,
                                      pcp_roles_gateway_active_job_t* a,
                                      json_t* worker_ids) {
  char dir[PCP_STORE_PATH_MAX_LENGTH + 1];
  job_dir(g, a->id, dir, sizeof(dir));
  char results_dir[PCP_STORE_PATH_MAX_LENGTH + 16];
  snprintf(results_dir, sizeof(results_dir), "%s/results", dir);
  PCP_RETURN_IF_ERROR_BARE(make_dir(results_dir));
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
      PCP_RETURN_IF_ERROR_BARE(file_write_atomic(
          r.path, outputs[o].data, (size_t)outputs[o].byte_length));
      pcp_status_t status = pcp_store_job_result_put(g->store, &r);
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

static void job_finish(pcp_roles_gateway_state_t* g,
                       pcp_roles_gateway_active_job_t* a) {
  pcp_store_job_t job;
  pcp_status_t status = pcp_store_job_get(g->store, a->id, &job);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  pcp_store_job_state_t state = job.state;
  json_t* placement = json_object_get(job.spec, "placement");
  json_t* record = json_pack("{s:O?, s:[]}", "requested", placement, "workers");
  pcp_store_job_deinitialize(&job);
  pcp_status_t failure = pcp_ok_status();
  for (uint32_t t = 0; t < a->task_count && !failure; ++t) {
    pcp_status_t s = pcp_fabric_task_status(a->tasks[t]);
    if (s) {
      failure = pcp_make_status(pcp_status_code(s), "task %u: %s", t,
                                pcp_status_message(s));
    }
  }
  if (state == PCP_STORE_JOB_STATE_CANCELLING) {
    pcp_status_ignore(failure);
    pcp_status_ignore(
        transition(g, a->id, PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL));
    pcp_obs_family_add(g->job_runs_family, (const char*[]){"cancelled"}, 1);
  } else if (failure) {
    fail_job(g, a->id, failure);
  } else {
    status = job_results_store(g, a, json_object_get(record, "workers"));
    if (!status) {
      status = transition(g, a->id, PCP_STORE_JOB_STATE_SUCCEEDED, "", record);
    }
    if (status) {
      fail_job(g, a->id, status);
    } else {
      pcp_obs_family_add(g->job_runs_family, (const char*[]){"succeeded"}, 1);
    }
  }
  json_decref(record);
}

// The runner's hooks: answers cached from the store are stale after every
// write; outcomes feed pcp_gateway_job_outcomes_total; no job starts while
// the gateway drains.
static void runner_changed(void* user_data, const char* job_id) {
  (void)job_id;
  pcp_roles_gateway_state_t* g = user_data;
  atomic_fetch_add(&g->job_generation, 1);
}

static void runner_outcome(void* user_data, const char* kind,
                           const char* outcome) {
  (void)kind;
  pcp_roles_gateway_state_t* g = user_data;
  pcp_obs_family_add(g->job_runs_family, (const char*[]){outcome}, 1);
}

static bool runner_draining(void* user_data) {
  pcp_roles_gateway_state_t* g = user_data;
  return atomic_load(&g->draining);
}

pcp_status_t pcp_roles_gateway_jobs_recover(pcp_roles_gateway_state_t* g) {
  // The kinds the runner schedules: training (adding one is one more line).
  // Generic jobs keep the runner thread below and only share the runner's
  // transition function and recovery.
  const pcp_workloads_kind_t kinds[] = {
      pcp_workloads_train_kind(&g->train_kind),
  };
  pcp_workloads_runner_options_t options = {
      .store = g->store,
      .clock = g->clock,
      .log = g->log,
      .kinds = kinds,
      .kind_count = PCP_ARRAYSIZE(kinds),
      .hooks = {.changed = runner_changed,
                .outcome = runner_outcome,
                .draining = runner_draining,
                .user_data = g},
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_runner_create(&options, g->allocator, &g->runner));
  // Jobs caught mid-flight by a crash or a stop: re-run or finish cancel.
  return pcp_workloads_runner_recover(g->runner);
}

void pcp_roles_gateway_jobs_metrics_update(pcp_roles_gateway_state_t* g) {
  int64_t counts[PCP_STORE_JOB_STATE_COUNT_] = {0};
  char after[PCP_STORE_ID_MAX_LENGTH + 1] = "";
  for (;;) {
    pcp_store_job_filter_t filter = {.after_id = after[0] ? after : NULL,
                                     .limit = PCP_STORE_LIST_LIMIT_MAX};
    pcp_store_job_list_t list = {0};
    pcp_status_t status = pcp_store_job_list(g->store, &filter, &list);
    if (status) {
      pcp_status_ignore(status);
      return;
    }
    for (size_t i = 0; i < list.count; ++i) {
      ++counts[list.items[i].state];
    }
    size_t count = list.count;
    if (count) {
      snprintf(after, sizeof(after), "%s", list.items[count - 1].id);
    }
    pcp_store_job_list_deinitialize(&list);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      break;
    }
  }
  for (int s = 0; s < PCP_STORE_JOB_STATE_COUNT_; ++s) {
    const char* labels[] = {pcp_store_job_state_name((pcp_store_job_state_t)s)};
    pcp_obs_family_set(g->jobs_family, labels, (double)counts[s]);
  }
}

static bool is_active(pcp_roles_gateway_state_t* g, const char* id) {
  for (pcp_roles_gateway_active_job_t* a = g->active; a; a = a->next) {
    if (strcmp(a->id, id) == 0) {
      return true;
    }
  }
  return false;
}

static void worker_counts_watch(pcp_roles_gateway_state_t* g) {
  char data[256];
  uint32_t counts[PCP_FABRIC_WORKER_STATE_COUNT_];
  bool changed = false;
  for (int s = 0; s < PCP_FABRIC_WORKER_STATE_COUNT_; ++s) {
    counts[s] =
        pcp_fabric_worker_count(g->fabric, (pcp_fabric_worker_state_t)s);
    changed = changed || counts[s] != g->last_worker_counts[s];
    g->last_worker_counts[s] = counts[s];
  }
  if (changed) {
    snprintf(
        data, sizeof(data), "{\"connected\":%u,\"draining\":%u,\"lost\":%u}",
        counts[PCP_FABRIC_WORKER_CONNECTED], counts[PCP_FABRIC_WORKER_DRAINING],
        counts[PCP_FABRIC_WORKER_LOST]);
    pcp_roles_gateway_events_broadcast(g, "workers", data);
  }
}

// Jobs whose compile is done: launched if still compiling in the store
// (a cancel meanwhile made them cancelled; their program stays registered
// and cached, which a later job may use).
static void compiles_harvest(pcp_roles_gateway_state_t* g) {
  for (uint32_t i = 0; i < PCP_GATEWAY_COMPILE_SLOTS; ++i) {
    pcp_roles_gateway_compile_slot_t* slot = &g->compile_slots[i];
    pthread_mutex_lock(&g->compile_mu);
    bool done = slot->state == PCP_GATEWAY_COMPILE_SLOT_DONE;
    pthread_mutex_unlock(&g->compile_mu);
    if (!done) {
      continue;
    }
    // A DONE slot belongs to the runner until it frees it.
    pcp_status_t status = slot->status;
    slot->status = pcp_ok_status();
    pcp_store_job_t job;
    pcp_status_t got = pcp_store_job_get(g->store, slot->job_id, &job);
    if (got) {
      pcp_status_ignore(got);
      pcp_status_ignore(status);
    } else if (job.state != PCP_STORE_JOB_STATE_COMPILING) {
      pcp_status_ignore(status);
    } else if (status) {
      fail_job(g, job.id, status);
    } else {
      pcp_roles_gateway_active_job_t* a = NULL;
      status = job_launch(g, &job, slot->program, &a);
      if (status || !a) {
        fail_job(g, job.id,
                 status
                     ? status
                     : pcp_make_status(PCP_STATUS_INTERNAL, "no job started"));
      } else {
        a->next = g->active;
        g->active = a;
        ++g->active_count;
      }
    }
    if (!got) {
      pcp_store_job_deinitialize(&job);
    }
    pthread_mutex_lock(&g->compile_mu);
    slot->state = PCP_GATEWAY_COMPILE_SLOT_FREE;
    pthread_mutex_unlock(&g->compile_mu);
  }
}

static void runner_tick(pcp_roles_gateway_state_t* g) {
  compiles_harvest(g);
  // 1. Active jobs: cancel reaches the workers; finished ones are stored.
  pcp_roles_gateway_active_job_t** link = &g->active;
  while (*link) {
    pcp_roles_gateway_active_job_t* a = *link;
    pcp_store_job_t job;
    pcp_status_t status = pcp_store_job_get(g->store, a->id, &job);
    bool cancelling = !status && job.state == PCP_STORE_JOB_STATE_CANCELLING;
    if (!status) {
      pcp_store_job_deinitialize(&job);
    }
    pcp_status_ignore(status);
    if (cancelling && !a->cancel_sent) {
      for (uint32_t i = 0; i < a->task_count; ++i) {
        pcp_fabric_task_cancel(a->tasks[i]);
      }
      a->cancel_sent = true;
    }
    bool done = true;
    for (uint32_t i = 0; i < a->task_count; ++i) {
      done = done && pcp_fabric_task_is_done(a->tasks[i]);
    }
    if (!done) {
      link = &a->next;
      continue;
    }
    job_finish(g, a);
    *link = a->next;
    --g->active_count;
    active_free(a);
  }
  // 2. Cancelling jobs nobody runs (cancelled between runner steps).
  // Training jobs end their cancel in the training service (training.c).
  pcp_store_job_filter_t filter = {
      .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_CANCELLING),
      .kind = "generic"};
  pcp_store_job_list_t list = {0};
  if (!pcp_store_job_list(g->store, &filter, &list)) {
    for (size_t i = 0; i < list.count; ++i) {
      if (!is_active(g, list.items[i].id) &&
          !is_compiling(g, list.items[i].id)) {
        pcp_status_ignore(transition(
            g, list.items[i].id, PCP_STORE_JOB_STATE_CANCELLED, NULL, NULL));
      }
    }
  }
  pcp_store_job_list_deinitialize(&list);
  // 3. Queued jobs, oldest first, while there is room. A job holds a
  // compile slot (StableHLO) or an active entry; when every slot is taken
  // the rest stay queued, so the slots bound the compile backlog.
  uint32_t compiling = compile_slots_in_use(g);
  if (g->active_count + compiling >= PCP_GATEWAY_MAX_ACTIVE_JOBS ||
      compiling >= PCP_GATEWAY_COMPILE_SLOTS || atomic_load(&g->draining)) {
    return;
  }
  filter.states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_QUEUED);
  filter.limit = PCP_GATEWAY_MAX_ACTIVE_JOBS - g->active_count - compiling;
  if (filter.limit > PCP_GATEWAY_COMPILE_SLOTS - compiling) {
    filter.limit = PCP_GATEWAY_COMPILE_SLOTS - compiling;
  }
  // Training jobs belong to the training service (training.c), not here.
  filter.kind = "generic";
  if (pcp_store_job_list(g->store, &filter, &list)) {
    return;
  }
  for (size_t i = 0; i < list.count && !atomic_load(&g->stopping); ++i) {
    pcp_roles_gateway_active_job_t* a = NULL;
    pcp_status_t status = job_start(g, &list.items[i], &a);
    if (status) {
      fail_job(g, list.items[i].id, status);
      continue;
    }
    if (!a) {
      continue;  // waiting for its compile
    }
    a->next = g->active;
    g->active = a;
    ++g->active_count;
  }
  pcp_store_job_list_deinitialize(&list);
}

// Deletes services whose TTL ran out (reads already hide them) and tells
// event streams, so registrations do not pile up in the store.
static void services_sweep(pcp_roles_gateway_state_t* g) {
  for (int round = 0; round < 16; ++round) {
    pcp_store_service_list_t expired = {0};
    pcp_status_t status = pcp_store_service_expired_sweep(g->store, &expired);
    if (status) {
      pcp_status_ignore(status);
      return;
    }
    for (size_t i = 0; i < expired.count; ++i) {
      json_t* data = json_pack(
          "{s:s, s:s, s:s}", "executor_id", expired.items[i].executor_id,
          "service_type", expired.items[i].service_type, "status", "expired");
      char* text = data ? json_dumps(data, JSON_COMPACT) : NULL;
      if (text) {
        pcp_roles_gateway_events_broadcast(g, "service", text);
      }
      free(text);
      json_decref(data);
    }
    size_t count = expired.count;
    pcp_store_service_list_deinitialize(&expired);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      return;
    }
  }
}

void* pcp_roles_gateway_jobs_runner_main(void* opaque) {
  pcp_roles_gateway_state_t* g = opaque;
  int64_t next_metrics_ns = 0;
  while (!atomic_load(&g->stopping)) {
    runner_tick(g);
    worker_counts_watch(g);
    int64_t now = pcp_clock_now_ns(g->clock);
    if (now >= next_metrics_ns) {
      pcp_roles_gateway_jobs_metrics_update(g);
      services_sweep(g);
      next_metrics_ns = now + INT64_C(1000000000);
    }
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->stopping)) {
      struct timespec deadline = pcp_realtime_deadline_ms(50);
      pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
    }
    pthread_mutex_unlock(&g->mu);
  }
  // Running jobs stay "running" in the store: the next start re-runs them.
  // Their tasks still borrow the input buffers, so g->active is freed only
  // after the fabric endpoint is gone (pcp_roles_gateway_jobs_active_free).
  return NULL;
}

void pcp_roles_gateway_jobs_active_free(pcp_roles_gateway_state_t* g) {
  while (g->active) {
    pcp_roles_gateway_active_job_t* a = g->active;
    g->active = a->next;
    active_free(a);
  }
  g->active_count = 0;
  pcp_workloads_runner_release(g->runner);
  g->runner = NULL;
}
