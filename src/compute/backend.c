// SPDX-License-Identifier: Apache-2.0
// Backend-independent half of pcp_backend_t: argument checking, the
// per-program function cache, reference counting, ABI declaration parsing.

#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute_impl.h"

//===----------------------------------------------------------------------===//
// Backends
//===----------------------------------------------------------------------===//

pcp_status_t pcp_backend_create(const pcp_backend_options_t* options,
                                pcp_backend_t** out_backend) {
  *out_backend = NULL;
  return pcp_iree_backend_create(options, out_backend);
}

void pcp_backend_release(pcp_backend_t* backend) {
  if (backend)
    backend->vtable->destroy(backend);
}

pcp_status_t pcp_backend_memory_query(pcp_backend_t* backend,
                                      pcp_backend_memory_t* out_memory) {
  memset(out_memory, 0, sizeof(*out_memory));
  if (!backend->vtable->memory_query) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "backend '%s' keeps no allocator statistics",
                           backend->info.driver);
  }
  return backend->vtable->memory_query(backend, out_memory);
}

const pcp_backend_info_t* pcp_backend_info(const pcp_backend_t* backend) {
  return &backend->info;
}

pcp_status_t pcp_compute_runtime_version(char* buffer, size_t capacity) {
  char site[PATH_MAX];
  PCP_RETURN_IF_ERROR(pcp_venv_site_packages(site, sizeof(site)),
                      "reading the IREE runtime version");
  DIR* dir = opendir(site);
  if (!dir) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "cannot list %s", site);
  }
  const char prefix[] = "iree_base_runtime-";
  struct dirent* entry;
  pcp_status_t status = pcp_make_status(
      PCP_STATUS_NOT_FOUND,
      "the iree-base-runtime wheel is not installed in %s; run 'make setup'",
      site);
  while ((entry = readdir(dir)) != NULL) {
    const char* name = entry->d_name;
    const char* suffix = strstr(name, ".dist-info");
    if (strncmp(name, prefix, sizeof(prefix) - 1) != 0 || !suffix)
      continue;
    size_t n = (size_t)(suffix - name) - (sizeof(prefix) - 1);
    if (n >= capacity)
      n = capacity - 1;
    memcpy(buffer, name + sizeof(prefix) - 1, n);
    buffer[n] = 0;
    pcp_status_ignore(status);
    status = pcp_ok_status();
    break;
  }
  closedir(dir);
  return status;
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

pcp_status_t pcp_program_load(pcp_backend_t* backend, const void* vmfb,
                              size_t byte_length, pcp_program_t** out_program) {
  *out_program = NULL;
  if (!vmfb || byte_length == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "empty program");
  }
  if (byte_length > PCP_MAX_PROGRAM_BYTES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "program is %zu bytes; the limit is %zu",
                           byte_length, PCP_MAX_PROGRAM_BYTES);
  }
  return backend->vtable->program_load(backend, vmfb, byte_length, out_program);
}

void pcp_program_release(pcp_program_t* program) {
  if (!program)
    return;
  program->backend->vtable->program_destroy(program);
}

size_t pcp_program_function_count(const pcp_program_t* program) {
  return program->function_count;
}

const char* pcp_program_function_name(const pcp_program_t* program,
                                      size_t index) {
  return index < program->function_count ? program->function_names[index]
                                         : NULL;
}

static pcp_status_t resolve_function(pcp_program_t* program, const char* name,
                                     pcp_program_function_t** out_function) {
  for (size_t i = 0; i < program->resolved_count; ++i) {
    if (strcmp(program->resolved[i].name, name) == 0) {
      *out_function = &program->resolved[i];
      return pcp_ok_status();
    }
  }
  pcp_allocator_t allocator = program->backend->allocator;
  if (program->resolved_count == program->resolved_capacity) {
    size_t capacity =
        program->resolved_capacity ? program->resolved_capacity * 2 : 4;
    void* grown = program->resolved;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_realloc(
            allocator, capacity * sizeof(pcp_program_function_t), &grown),
        "function cache");
    program->resolved = grown;
    program->resolved_capacity = capacity;
  }
  pcp_program_function_t* function =
      &program->resolved[program->resolved_count];
  memset(function, 0, sizeof(*function));
  // The name first: once resolved, the handle is the program's to release,
  // so nothing may fail after it.
  PCP_RETURN_IF_ERROR(pcp_allocator_strdup(allocator, name, &function->name),
                      "function cache");
  pcp_status_t status = program->backend->vtable->function_resolve(
      program, name, &function->signature, &function->handle);
  if (status) {
    pcp_allocator_free(allocator, function->name);
    function->name = NULL;
    return status;
  }
  program->resolved_count++;
  *out_function = function;
  return pcp_ok_status();
}

pcp_status_t pcp_program_function_signature(
    pcp_program_t* program, const char* name,
    pcp_function_signature_t* out_signature) {
  pcp_program_function_t* function = NULL;
  PCP_RETURN_IF_ERROR_BARE(resolve_function(program, name, &function));
  *out_signature = function->signature;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

pcp_status_t pcp_tensor_upload(pcp_backend_t* backend,
                               const pcp_host_tensor_t* host,
                               pcp_tensor_t** out_tensor) {
  *out_tensor = NULL;
  size_t expected = 0;
  PCP_RETURN_IF_ERROR(pcp_tensor_shape_byte_length(&host->shape, &expected),
                      "uploading a tensor");
  if (expected != host->byte_length) {
    char shape[96];
    pcp_tensor_shape_format(&host->shape, shape, sizeof(shape));
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "tensor %s needs %zu bytes, got %zu", shape,
                           expected, host->byte_length);
  }
  return backend->vtable->tensor_upload(backend, host, out_tensor);
}

void pcp_tensor_retain(pcp_tensor_t* tensor) {
  if (tensor)
    atomic_fetch_add_explicit(&tensor->ref_count, 1, memory_order_relaxed);
}

void pcp_tensor_release(pcp_tensor_t* tensor) {
  if (!tensor)
    return;
  if (atomic_fetch_sub_explicit(&tensor->ref_count, 1, memory_order_acq_rel) ==
      1) {
    tensor->backend->vtable->tensor_destroy(tensor);
  }
}

const pcp_tensor_shape_t* pcp_tensor_shape(const pcp_tensor_t* tensor) {
  return &tensor->shape;
}

size_t pcp_tensor_byte_length(const pcp_tensor_t* tensor) {
  return tensor->byte_length;
}

pcp_status_t pcp_tensor_download(pcp_tensor_t* tensor, void* buffer,
                                 size_t byte_length) {
  if (byte_length != tensor->byte_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "download buffer is %zu bytes; the tensor has %zu",
                           byte_length, tensor->byte_length);
  }
  if (byte_length == 0)
    return pcp_ok_status();
  return tensor->backend->vtable->tensor_download(tensor, buffer, byte_length);
}

pcp_status_t pcp_tensor_download_host(pcp_tensor_t* tensor,
                                      pcp_host_tensor_t* out_host) {
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_allocate_with_allocator(
      &tensor->shape, tensor->backend->allocator, out_host));
  pcp_status_t status =
      pcp_tensor_download(tensor, out_host->data, out_host->byte_length);
  if (status)
    pcp_host_tensor_deinitialize(out_host);
  return status;
}

//===----------------------------------------------------------------------===//
// Invocation
//===----------------------------------------------------------------------===//

static pcp_status_t check_input(const char* function, size_t index,
                                const pcp_tensor_shape_t* expected,
                                const pcp_tensor_shape_t* actual) {
  if (expected->rank < 0)
    return pcp_ok_status();  // not declared: IREE checks
  bool ok = expected->rank == actual->rank &&
            (expected->element_type == actual->element_type ||
             expected->element_type == PCP_ELEMENT_TYPE_UNKNOWN);
  for (int32_t d = 0; ok && d < expected->rank; ++d) {
    ok = expected->dims[d] < 0 || expected->dims[d] == actual->dims[d];
  }
  if (ok)
    return pcp_ok_status();
  char want[128], got[128];
  pcp_tensor_shape_format(expected, want, sizeof(want));
  pcp_tensor_shape_format(actual, got, sizeof(got));
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "function '%s' input %zu: expected %s, got %s",
                         function, index, want, got);
}

pcp_status_t pcp_program_invoke(pcp_program_t* program, const char* function,
                                const pcp_value_t* inputs, size_t input_count,
                                pcp_tensor_t** out_results,
                                size_t result_capacity,
                                size_t* out_result_count) {
  *out_result_count = 0;
  pcp_program_function_t* resolved = NULL;
  PCP_RETURN_IF_ERROR_BARE(resolve_function(program, function, &resolved));
  const pcp_function_signature_t* signature = &resolved->signature;
  if ((int64_t)input_count != signature->input_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "function '%s' takes %d inputs, got %zu (%s)",
                           function, signature->input_count, input_count,
                           signature->declaration);
  }
  if ((size_t)signature->result_count > result_capacity) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "function '%s' returns %d results; room for %zu",
                           function, signature->result_count, result_capacity);
  }
  for (size_t i = 0; i < input_count; ++i) {
    const pcp_value_t* value = &inputs[i];
    if ((value->resident == NULL) == (value->host == NULL)) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "input %zu must be exactly one of resident or host", i);
    }
    if (value->resident && value->resident->backend != program->backend) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "input %zu lives on another device", i);
    }
    const pcp_tensor_shape_t* actual =
        value->resident ? &value->resident->shape : &value->host->shape;
    if (value->host) {
      size_t expected_bytes = 0;
      PCP_RETURN_IF_ERROR(pcp_tensor_shape_byte_length(actual, &expected_bytes),
                          "input %zu", i);
      if (expected_bytes != value->host->byte_length) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "input %zu: shape needs %zu bytes, got %zu", i,
                               expected_bytes, value->host->byte_length);
      }
    }
    if (i < PCP_SIGNATURE_MAX_TYPES) {
      PCP_RETURN_IF_ERROR_BARE(
          check_input(function, i, &signature->inputs[i], actual));
    }
  }
  PCP_RETURN_IF_ERROR(program->backend->vtable->invoke(
                          program, resolved, inputs, input_count, out_results),
                      "invoking '%s'", function);
  *out_result_count = (size_t)signature->result_count;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// ABI declarations
//===----------------------------------------------------------------------===//

// Parses "tensor<2x?x4xf32>" (or a scalar type "i32"/"f32") into |out|.
static void parse_abi_type(pcp_string_view_t text, pcp_tensor_shape_t* out) {
  memset(out, 0, sizeof(*out));
  out->rank = -1;
  text = pcp_string_view_trim(text);
  pcp_string_view_t prefix = pcp_make_cstring_view("tensor<");
  if (!pcp_string_view_starts_with(text, prefix) ||
      text.size < prefix.size + 2 || text.data[text.size - 1] != '>') {
    return;
  }
  pcp_string_view_t inner = pcp_make_string_view(text.data + prefix.size,
                                                 text.size - prefix.size - 1);
  // Encodings or layouts after a comma ("tensor<4xf32, #enc>") are ignored.
  const char* comma = memchr(inner.data, ',', inner.size);
  if (comma)
    inner.size = (size_t)(comma - inner.data);
  pcp_tensor_shape_t parsed;
  pcp_status_t status = pcp_tensor_shape_parse(inner, &parsed);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  *out = parsed;
}

// Splits "a: T, b: U" at top-level commas (commas inside <> belong to types).
static void parse_abi_list(pcp_string_view_t list, pcp_tensor_shape_t* types,
                           int32_t* out_count) {
  int32_t count = 0;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size; ++i) {
    char c = i < list.size ? list.data[i] : ',';
    if (c == '<' || c == '(')
      depth++;
    if (c == '>' || c == ')')
      depth--;
    if (c == ',' && depth == 0) {
      pcp_string_view_t item = pcp_string_view_trim(
          pcp_make_string_view(list.data + start, i - start));
      start = i + 1;
      if (item.size == 0)
        continue;
      const char* colon = memchr(item.data, ':', item.size);
      pcp_string_view_t type =
          colon ? pcp_make_string_view(
                      colon + 1, item.size - (size_t)(colon + 1 - item.data))
                : item;
      if (count < PCP_SIGNATURE_MAX_TYPES)
        parse_abi_type(type, &types[count]);
      count++;
    }
  }
  *out_count = count;
}

// Finds the matching ')' for the '(' at |open|.
static const char* matching_paren(const char* open) {
  int depth = 0;
  for (const char* p = open; *p; ++p) {
    if (*p == '(')
      depth++;
    if (*p == ')' && --depth == 0)
      return p;
  }
  return NULL;
}

pcp_status_t pcp_compute_parse_abi_declaration(
    const char* declaration, pcp_function_signature_t* inout_signature) {
  for (int i = 0; i < PCP_SIGNATURE_MAX_TYPES; ++i) {
    inout_signature->inputs[i].rank = -1;
    inout_signature->results[i].rank = -1;
  }
  snprintf(inout_signature->declaration, sizeof(inout_signature->declaration),
           "%s", declaration);
  const char* open = strchr(declaration, '(');
  if (!open)
    return pcp_ok_status();  // nothing declared: counts only
  const char* close = matching_paren(open);
  if (!close) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "malformed ABI declaration: %s", declaration);
  }
  int32_t inputs = 0, results = 0;
  parse_abi_list(pcp_make_string_view(open + 1, (size_t)(close - open - 1)),
                 inout_signature->inputs, &inputs);
  const char* arrow = strstr(close, "->");
  if (arrow) {
    const char* rest = arrow + 2;
    while (*rest == ' ') rest++;
    if (*rest == '(') {
      const char* rclose = matching_paren(rest);
      if (rclose) {
        parse_abi_list(
            pcp_make_string_view(rest + 1, (size_t)(rclose - rest - 1)),
            inout_signature->results, &results);
      }
    } else {
      parse_abi_list(pcp_make_cstring_view(rest), inout_signature->results,
                     &results);
    }
  }
  // Counts come from the calling convention; a declaration that disagrees
  // is not trusted for types.
  if (inputs != inout_signature->input_count) {
    for (int i = 0; i < PCP_SIGNATURE_MAX_TYPES; ++i)
      inout_signature->inputs[i].rank = -1;
  }
  if (results != inout_signature->result_count) {
    for (int i = 0; i < PCP_SIGNATURE_MAX_TYPES; ++i)
      inout_signature->results[i].rank = -1;
  }
  return pcp_ok_status();
}
