// SPDX-License-Identifier: Apache-2.0
// Host tensors: shapes, iree-run-module style text, .npy files, f16/bf16.

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute_impl.h"

//===----------------------------------------------------------------------===//
// Shapes
//===----------------------------------------------------------------------===//

pcp_status_t pcp_tensor_shape_byte_length(const pcp_tensor_shape_t* shape,
                                          size_t* out_byte_length) {
  *out_byte_length = 0;
  size_t element_size = pcp_element_type_byte_size(shape->element_type);
  if (element_size == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "unknown element type");
  }
  if (shape->rank < 0 || shape->rank > PCP_MAX_TENSOR_RANK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rank %d is outside 0..%d", shape->rank,
                           PCP_MAX_TENSOR_RANK);
  }
  size_t total = element_size;
  for (int32_t d = 0; d < shape->rank; ++d) {
    int64_t dim = shape->dims[d];
    if (dim < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "dimension %d is %s",
                             d, dim == -1 ? "dynamic" : "negative");
    }
    if (dim != 0 && total > PCP_MAX_TENSOR_BYTES / (uint64_t)dim) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "tensor is larger than the %zu byte limit",
                             PCP_MAX_TENSOR_BYTES);
    }
    total *= (size_t)dim;
  }
  *out_byte_length = total;
  return pcp_ok_status();
}

void pcp_tensor_shape_format(const pcp_tensor_shape_t* shape, char* buffer,
                             size_t capacity) {
  size_t at = 0;
  if (capacity == 0)
    return;
  buffer[0] = 0;
  for (int32_t d = 0; d < shape->rank && d < PCP_MAX_TENSOR_RANK; ++d) {
    int n = shape->dims[d] < 0 ? snprintf(buffer + at, capacity - at, "?x")
                               : snprintf(buffer + at, capacity - at, "%lldx",
                                          (long long)shape->dims[d]);
    if (n < 0 || (size_t)n >= capacity - at)
      return;
    at += (size_t)n;
  }
  snprintf(buffer + at, capacity - at, "%s",
           pcp_element_type_name(shape->element_type));
}

pcp_status_t pcp_tensor_shape_parse(pcp_string_view_t text,
                                    pcp_tensor_shape_t* out_shape) {
  memset(out_shape, 0, sizeof(*out_shape));
  pcp_string_view_t rest = pcp_string_view_trim(text);
  int32_t rank = 0;
  for (;;) {
    pcp_string_view_t head, tail;
    if (!pcp_string_view_split(rest, 'x', &head, &tail)) {
      // Last piece: the element type.
      if (!pcp_element_type_parse(head, &out_shape->element_type)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "unknown element type '%.*s' in '%.*s'",
                               (int)head.size, head.data, (int)text.size,
                               text.data);
      }
      break;
    }
    if (rank >= PCP_MAX_TENSOR_RANK) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "rank over %d in '%.*s'", PCP_MAX_TENSOR_RANK,
                             (int)text.size, text.data);
    }
    int64_t dim = 0;
    if (head.size == 1 && head.data[0] == '?') {
      dim = -1;
    } else if (!pcp_string_view_parse_int64(head, &dim) || dim < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "bad dimension '%.*s' in '%.*s'", (int)head.size,
                             head.data, (int)text.size, text.data);
    }
    out_shape->dims[rank++] = dim;
    rest = tail;
  }
  out_shape->rank = rank;
  return pcp_ok_status();
}

bool pcp_tensor_shape_equal(const pcp_tensor_shape_t* a,
                            const pcp_tensor_shape_t* b) {
  if (a->element_type != b->element_type || a->rank != b->rank)
    return false;
  for (int32_t d = 0; d < a->rank; ++d) {
    if (a->dims[d] != b->dims[d])
      return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Host tensors
//===----------------------------------------------------------------------===//

pcp_status_t pcp_host_tensor_allocate(const pcp_tensor_shape_t* shape,
                                      pcp_host_tensor_t* out_tensor) {
  return pcp_host_tensor_allocate_with_allocator(shape, pcp_allocator_system(),
                                                 out_tensor);
}

// A pcp_allocator_t promises no alignment beyond malloc's, so the block is
// over-allocated by the alignment and |data| rounded up inside it.
enum { HOST_TENSOR_ALIGNMENT = 64 };

pcp_status_t pcp_host_tensor_allocate_with_allocator(
    const pcp_tensor_shape_t* shape, pcp_allocator_t allocator,
    pcp_host_tensor_t* out_tensor) {
  memset(out_tensor, 0, sizeof(*out_tensor));
  size_t bytes = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_tensor_shape_byte_length(shape, &bytes));
  // pcp_tensor_shape_byte_length caps |bytes| at PCP_MAX_TENSOR_BYTES, so
  // adding the alignment cannot overflow.
  void* allocation = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, bytes + HOST_TENSOR_ALIGNMENT, &allocation);
  if (status) {
    return pcp_status_annotate_f(status, "out of memory for a %zu byte tensor",
                                 bytes);
  }
  uintptr_t address = (uintptr_t)allocation;
  address = (address + HOST_TENSOR_ALIGNMENT - 1) &
            ~(uintptr_t)(HOST_TENSOR_ALIGNMENT - 1);
  out_tensor->shape = *shape;
  out_tensor->data = (void*)address;
  out_tensor->byte_length = bytes;
  out_tensor->owns_data = true;
  out_tensor->allocator = allocator;
  out_tensor->allocation = allocation;
  return pcp_ok_status();
}

pcp_status_t pcp_host_tensor_wrap(const pcp_tensor_shape_t* shape, void* data,
                                  size_t byte_length,
                                  pcp_host_tensor_t* out_tensor) {
  memset(out_tensor, 0, sizeof(*out_tensor));
  size_t bytes = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_tensor_shape_byte_length(shape, &bytes));
  if (bytes != byte_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "shape needs %zu bytes, got %zu", bytes,
                           byte_length);
  }
  out_tensor->shape = *shape;
  out_tensor->data = data;
  out_tensor->byte_length = byte_length;
  return pcp_ok_status();
}

void pcp_host_tensor_deinitialize(pcp_host_tensor_t* tensor) {
  if (tensor->owns_data)
    pcp_allocator_free(tensor->allocator, tensor->allocation);
  memset(tensor, 0, sizeof(*tensor));
}

//===----------------------------------------------------------------------===//
// Element access
//===----------------------------------------------------------------------===//

static bool is_float_type(pcp_element_type_t t) {
  return t == PCP_ELEMENT_TYPE_F32 || t == PCP_ELEMENT_TYPE_F64 ||
         t == PCP_ELEMENT_TYPE_F16 || t == PCP_ELEMENT_TYPE_BF16;
}

static void store_double(pcp_element_type_t t, void* p, double v) {
  switch (t) {
    case PCP_ELEMENT_TYPE_F32: {
      float f = (float)v;
      memcpy(p, &f, 4);
      break;
    }
    case PCP_ELEMENT_TYPE_F64:
      memcpy(p, &v, 8);
      break;
    case PCP_ELEMENT_TYPE_F16: {
      uint16_t h = pcp_f32_to_f16((float)v);
      memcpy(p, &h, 2);
      break;
    }
    case PCP_ELEMENT_TYPE_BF16: {
      uint16_t h = pcp_f32_to_bf16((float)v);
      memcpy(p, &h, 2);
      break;
    }
    default:
      break;
  }
}

static void store_int(pcp_element_type_t t, void* p, int64_t v) {
  switch (t) {
    case PCP_ELEMENT_TYPE_I1:
    case PCP_ELEMENT_TYPE_I8:
    case PCP_ELEMENT_TYPE_U8: {
      uint8_t x = (uint8_t)v;
      memcpy(p, &x, 1);
      break;
    }
    case PCP_ELEMENT_TYPE_I16:
    case PCP_ELEMENT_TYPE_U16: {
      uint16_t x = (uint16_t)v;
      memcpy(p, &x, 2);
      break;
    }
    case PCP_ELEMENT_TYPE_I32:
    case PCP_ELEMENT_TYPE_U32: {
      uint32_t x = (uint32_t)v;
      memcpy(p, &x, 4);
      break;
    }
    case PCP_ELEMENT_TYPE_I64:
    case PCP_ELEMENT_TYPE_U64:
      memcpy(p, &v, 8);
      break;
    default:
      break;
  }
}

// Range of each integer type, for input checking.
static bool int_in_range(pcp_element_type_t t, int64_t v) {
  switch (t) {
    case PCP_ELEMENT_TYPE_I1:
      return v == 0 || v == 1;
    case PCP_ELEMENT_TYPE_I8:
      return v >= -128 && v <= 127;
    case PCP_ELEMENT_TYPE_U8:
      return v >= 0 && v <= 255;
    case PCP_ELEMENT_TYPE_I16:
      return v >= -32768 && v <= 32767;
    case PCP_ELEMENT_TYPE_U16:
      return v >= 0 && v <= 65535;
    case PCP_ELEMENT_TYPE_I32:
      return v >= INT32_MIN && v <= INT32_MAX;
    case PCP_ELEMENT_TYPE_U32:
      return v >= 0 && v <= (int64_t)UINT32_MAX;
    default:
      return true;
  }
}

static pcp_status_t parse_value(pcp_element_type_t t, pcp_string_view_t token,
                                void* p) {
  if (is_float_type(t)) {
    double v = 0;
    if (!pcp_string_view_parse_double(token, &v)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad number '%.*s'",
                             (int)token.size, token.data);
    }
    store_double(t, p, v);
    return pcp_ok_status();
  }
  int64_t v = 0;
  if (t == PCP_ELEMENT_TYPE_I1 &&
      pcp_string_view_equal(token, pcp_make_cstring_view("true"))) {
    v = 1;
  } else if (t == PCP_ELEMENT_TYPE_I1 &&
             pcp_string_view_equal(token, pcp_make_cstring_view("false"))) {
    v = 0;
  } else if (t == PCP_ELEMENT_TYPE_U64) {
    uint64_t u = 0;
    if (!pcp_string_view_parse_uint64(token, &u)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad integer '%.*s'",
                             (int)token.size, token.data);
    }
    memcpy(p, &u, 8);
    return pcp_ok_status();
  } else if (!pcp_string_view_parse_int64(token, &v)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad integer '%.*s'",
                           (int)token.size, token.data);
  }
  if (!int_in_range(t, v)) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "%lld does not fit %s",
                           (long long)v, pcp_element_type_name(t));
  }
  store_int(t, p, v);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Text input
//===----------------------------------------------------------------------===//

static pcp_status_t read_raw_file(const char* path, pcp_host_tensor_t* tensor) {
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(path, PCP_MAX_TENSOR_BYTES, &data, &length));
  // |data| is pcp_file_read_all's buffer (posix_memalign): libc frees it.
  if (length != tensor->byte_length) {
    pcp_libc_free(data);
    char shape[96];
    pcp_tensor_shape_format(&tensor->shape, shape, sizeof(shape));
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "'%s' has %zu bytes; %s needs %zu", path, length,
                           shape, tensor->byte_length);
  }
  memcpy(tensor->data, data, length);
  pcp_libc_free(data);
  return pcp_ok_status();
}

static bool is_separator(char c) {
  return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '[' || c == ']';
}

pcp_status_t pcp_host_tensor_parse(const char* text,
                                   pcp_host_tensor_t* out_tensor) {
  return pcp_host_tensor_parse_with_allocator(text, pcp_allocator_system(),
                                              out_tensor);
}

pcp_status_t pcp_host_tensor_parse_with_allocator(
    const char* text, pcp_allocator_t allocator,
    pcp_host_tensor_t* out_tensor) {
  memset(out_tensor, 0, sizeof(*out_tensor));
  if (!text || !text[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "empty input");
  }
  if (text[0] == '@') {
    return pcp_host_tensor_read_npy_with_allocator(
        text + 1, PCP_ELEMENT_TYPE_UNKNOWN, allocator, out_tensor);
  }
  const char* equals = strchr(text, '=');
  if (!equals) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "input '%s' is not SHAPExTYPE=VALUES or @file.npy",
                           text);
  }
  pcp_tensor_shape_t shape;
  PCP_RETURN_IF_ERROR(
      pcp_tensor_shape_parse(
          pcp_make_string_view(text, (size_t)(equals - text)), &shape),
      "input '%.40s'", text);
  PCP_RETURN_IF_ERROR(
      pcp_host_tensor_allocate_with_allocator(&shape, allocator, out_tensor),
      "input '%.40s'", text);
  const char* values = equals + 1;
  if (values[0] == '@') {
    pcp_status_t status = read_raw_file(values + 1, out_tensor);
    if (status)
      pcp_host_tensor_deinitialize(out_tensor);
    return status;
  }
  size_t element_size = pcp_element_type_byte_size(shape.element_type);
  size_t count = out_tensor->byte_length / element_size;
  size_t parsed = 0;
  uint8_t* out = out_tensor->data;
  pcp_status_t status = pcp_ok_status();
  for (const char* p = values; *p && !status;) {
    while (*p && is_separator(*p)) p++;
    if (!*p)
      break;
    const char* start = p;
    while (*p && !is_separator(*p)) p++;
    pcp_string_view_t token = pcp_make_string_view(start, (size_t)(p - start));
    if (parsed >= count && count > 0) {
      parsed++;
      continue;  // counted for the error below
    }
    if (count == 0) {
      parsed++;
      continue;
    }
    status =
        parse_value(shape.element_type, token, out + parsed * element_size);
    if (status) {
      status = pcp_status_annotate_f(status, "element %zu of input '%.40s'",
                                     parsed, text);
    }
    parsed++;
  }
  if (!status && parsed == 1 && count > 1) {
    // One value: splat it.
    for (size_t i = 1; i < count; ++i) {
      memcpy(out + i * element_size, out, element_size);
    }
  } else if (!status && parsed != count) {
    char shape_text[96];
    pcp_tensor_shape_format(&shape, shape_text, sizeof(shape_text));
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "input %s has %zu values; expected %zu (or one to splat)", shape_text,
        parsed, count);
  }
  if (status)
    pcp_host_tensor_deinitialize(out_tensor);
  return status;
}

//===----------------------------------------------------------------------===//
// Printing (iree-run-module's format)
//===----------------------------------------------------------------------===//

static pcp_status_t format_element(pcp_element_type_t t, const uint8_t* p,
                                   pcp_string_builder_t* b) {
  switch (t) {
    case PCP_ELEMENT_TYPE_F32: {
      float f;
      memcpy(&f, p, 4);
      return pcp_string_builder_append_f(b, "%G", (double)f);
    }
    case PCP_ELEMENT_TYPE_F64: {
      double d;
      memcpy(&d, p, 8);
      return pcp_string_builder_append_f(b, "%G", d);
    }
    case PCP_ELEMENT_TYPE_F16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return pcp_string_builder_append_f(b, "%G", (double)pcp_f16_to_f32(h));
    }
    case PCP_ELEMENT_TYPE_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return pcp_string_builder_append_f(b, "%G", (double)pcp_bf16_to_f32(h));
    }
    case PCP_ELEMENT_TYPE_I1:
      return pcp_string_builder_append_f(b, "%d", p[0] ? 1 : 0);
    case PCP_ELEMENT_TYPE_I8:
      return pcp_string_builder_append_f(b, "%d", (int)(int8_t)p[0]);
    case PCP_ELEMENT_TYPE_U8:
      return pcp_string_builder_append_f(b, "%u", (unsigned)p[0]);
    case PCP_ELEMENT_TYPE_I16: {
      int16_t v;
      memcpy(&v, p, 2);
      return pcp_string_builder_append_f(b, "%d", v);
    }
    case PCP_ELEMENT_TYPE_U16: {
      uint16_t v;
      memcpy(&v, p, 2);
      return pcp_string_builder_append_f(b, "%u", v);
    }
    case PCP_ELEMENT_TYPE_I32: {
      int32_t v;
      memcpy(&v, p, 4);
      return pcp_string_builder_append_f(b, "%d", v);
    }
    case PCP_ELEMENT_TYPE_U32: {
      uint32_t v;
      memcpy(&v, p, 4);
      return pcp_string_builder_append_f(b, "%u", v);
    }
    case PCP_ELEMENT_TYPE_I64: {
      int64_t v;
      memcpy(&v, p, 8);
      return pcp_string_builder_append_f(b, "%lld", (long long)v);
    }
    case PCP_ELEMENT_TYPE_U64: {
      uint64_t v;
      memcpy(&v, p, 8);
      return pcp_string_builder_append_f(b, "%llu", (unsigned long long)v);
    }
    default:
      return pcp_string_builder_append_cstring(b, "?");
  }
}

// Recursive: rank 1 prints "a b c"; higher ranks wrap each row in [ ].
static pcp_status_t format_dims(const pcp_host_tensor_t* t, int32_t dim,
                                size_t* inout_index, size_t max_elements,
                                pcp_string_builder_t* b) {
  size_t element_size = pcp_element_type_byte_size(t->shape.element_type);
  int64_t n = t->shape.dims[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (*inout_index >= max_elements) {
      return pcp_string_builder_append_cstring(b, "...");
    }
    if (dim + 1 == t->shape.rank) {
      if (i)
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " "));
      PCP_RETURN_IF_ERROR_BARE(format_element(
          t->shape.element_type,
          (const uint8_t*)t->data + *inout_index * element_size, b));
      (*inout_index)++;
    } else {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "["));
      PCP_RETURN_IF_ERROR_BARE(
          format_dims(t, dim + 1, inout_index, max_elements, b));
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "]"));
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_host_tensor_format(const pcp_host_tensor_t* tensor,
                                    size_t max_elements,
                                    pcp_string_builder_t* b) {
  char shape[128];
  pcp_tensor_shape_format(&tensor->shape, shape, sizeof(shape));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, "%s=", shape));
  if (tensor->shape.rank == 0) {
    return format_element(tensor->shape.element_type, tensor->data, b);
  }
  size_t index = 0;
  return format_dims(tensor, 0, &index, max_elements, b);
}

//===----------------------------------------------------------------------===//
// .npy
//===----------------------------------------------------------------------===//

static const struct {
  const char* descr;
  pcp_element_type_t type;
} kNpyTypes[] = {
    {"<f4", PCP_ELEMENT_TYPE_F32},  {"<f8", PCP_ELEMENT_TYPE_F64},
    {"<f2", PCP_ELEMENT_TYPE_F16},  {"|b1", PCP_ELEMENT_TYPE_I1},
    {"|i1", PCP_ELEMENT_TYPE_I8},   {"<i2", PCP_ELEMENT_TYPE_I16},
    {"<i4", PCP_ELEMENT_TYPE_I32},  {"<i8", PCP_ELEMENT_TYPE_I64},
    {"|u1", PCP_ELEMENT_TYPE_U8},   {"<u2", PCP_ELEMENT_TYPE_U16},
    {"<u4", PCP_ELEMENT_TYPE_U32},  {"<u8", PCP_ELEMENT_TYPE_U64},
    {"<V2", PCP_ELEMENT_TYPE_BF16},  // ml_dtypes bfloat16 (opaque 2 bytes)
};

#define NPY_MAX_HEADER_BYTES (64u << 10)

// Finds 'key': in a header dict and returns the text after the colon.
static const char* npy_find(const char* header, const char* key) {
  char needle[32];
  snprintf(needle, sizeof(needle), "'%s'", key);
  const char* at = strstr(header, needle);
  if (!at)
    return NULL;
  at = strchr(at + strlen(needle), ':');
  if (!at)
    return NULL;
  at++;
  while (*at == ' ') at++;
  return at;
}

static pcp_status_t npy_parse_header(const char* path, const char* header,
                                     pcp_element_type_t expected_type,
                                     pcp_tensor_shape_t* out_shape) {
  memset(out_shape, 0, sizeof(*out_shape));
  const char* descr = npy_find(header, "descr");
  const char* order = npy_find(header, "fortran_order");
  const char* shape = npy_find(header, "shape");
  if (!descr || !order || !shape || *descr != '\'' || *shape != '(') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "'%s' is not a valid .npy file (bad header)", path);
  }
  if (strncmp(order, "False", 5) != 0) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "'%s' is in Fortran order; save it C-contiguous",
                           path);
  }
  descr++;
  const char* end = strchr(descr, '\'');
  size_t n = end ? (size_t)(end - descr) : 0;
  char d[16] = {0};
  if (n == 0 || n >= sizeof(d)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s': bad descr",
                           path);
  }
  memcpy(d, descr, n);
  if (d[0] == '=')
    d[0] = '<';  // native order is little-endian here
  if (strcmp(d, "<b1") == 0)
    strcpy(d, "|b1");
  if (strcmp(d, "<i1") == 0)
    strcpy(d, "|i1");
  if (strcmp(d, "<u1") == 0)
    strcpy(d, "|u1");
  out_shape->element_type = PCP_ELEMENT_TYPE_UNKNOWN;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kNpyTypes); ++i) {
    if (strcmp(d, kNpyTypes[i].descr) == 0)
      out_shape->element_type = kNpyTypes[i].type;
  }
  if (out_shape->element_type == PCP_ELEMENT_TYPE_BF16 &&
      expected_type != PCP_ELEMENT_TYPE_BF16) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "'%s' holds opaque 2-byte values ('<V2'); for bf16 pass "
        "raw bytes as SHAPExbf16=@file.bin",
        path);
  }
  if (out_shape->element_type == PCP_ELEMENT_TYPE_UNKNOWN) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "'%s' has dtype '%s', which PCP does not take "
                           "(big-endian or complex?)",
                           path, d);
  }
  const char* p = shape + 1;
  int32_t rank = 0;
  while (*p && *p != ')') {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')')
      break;
    char* after = NULL;
    errno = 0;
    long long dim = strtoll(p, &after, 10);
    if (after == p || errno || dim < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s': bad shape",
                             path);
    }
    if (rank >= PCP_MAX_TENSOR_RANK) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s': rank over %d",
                             path, PCP_MAX_TENSOR_RANK);
    }
    out_shape->dims[rank++] = dim;
    p = after;
  }
  out_shape->rank = rank;
  return pcp_ok_status();
}

pcp_status_t pcp_host_tensor_read_npy(const char* path,
                                      pcp_element_type_t expected_type,
                                      pcp_host_tensor_t* out_tensor) {
  return pcp_host_tensor_read_npy_with_allocator(
      path, expected_type, pcp_allocator_system(), out_tensor);
}

pcp_status_t pcp_host_tensor_read_npy_with_allocator(
    const char* path, pcp_element_type_t expected_type,
    pcp_allocator_t allocator, pcp_host_tensor_t* out_tensor) {
  memset(out_tensor, 0, sizeof(*out_tensor));
  FILE* f = fopen(path, "rb");
  if (!f)
    return pcp_status_from_errno(errno, "opening '%s'", path);
  uint8_t preamble[12];
  pcp_status_t status = pcp_ok_status();
  size_t got = fread(preamble, 1, 10, f);
  uint32_t header_length = 0;
  size_t preamble_length = 10;
  if (got != 10 || memcmp(preamble, "\x93NUMPY", 6) != 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "'%s' is not a .npy file", path);
  } else if (preamble[6] == 1) {
    header_length = (uint32_t)preamble[8] | ((uint32_t)preamble[9] << 8);
  } else if (preamble[6] == 2 || preamble[6] == 3) {
    if (fread(preamble + 10, 1, 2, f) != 2) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s' is truncated",
                               path);
    }
    header_length = (uint32_t)preamble[8] | ((uint32_t)preamble[9] << 8) |
                    ((uint32_t)preamble[10] << 16) |
                    ((uint32_t)preamble[11] << 24);
    preamble_length = 12;
  } else {
    status = pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "'%s': .npy version %d",
                             path, preamble[6]);
  }
  if (!status && header_length > NPY_MAX_HEADER_BYTES) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "'%s': header of %u bytes is over the limit", path,
                             header_length);
  }
  char* header = NULL;
  pcp_tensor_shape_t shape;
  if (!status) {
    status = pcp_allocator_calloc(allocator, (size_t)header_length + 1,
                                  (void**)&header);
    if (status) {
      status = pcp_status_annotate_f(status, "reading '%s'", path);
    } else if (fread(header, 1, header_length, f) != header_length) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s' is truncated",
                               path);
    }
  }
  if (!status)
    status = npy_parse_header(path, header, expected_type, &shape);
  pcp_allocator_free(allocator, header);
  if (!status) {
    // Check the data length against the file size before allocating.
    long here = ftell(f);
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, here, SEEK_SET);
    size_t need = 0;
    status = pcp_tensor_shape_byte_length(&shape, &need);
    if (!status && (end < here || (size_t)(end - here) < need)) {
      status =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                          "'%s' holds %ld data bytes; its header promises %zu",
                          path, end - here, need);
    }
    (void)preamble_length;
  }
  if (!status)
    status =
        pcp_host_tensor_allocate_with_allocator(&shape, allocator, out_tensor);
  if (!status && out_tensor->byte_length &&
      fread(out_tensor->data, 1, out_tensor->byte_length, f) !=
          out_tensor->byte_length) {
    pcp_host_tensor_deinitialize(out_tensor);
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "'%s' is truncated", path);
  }
  fclose(f);
  return status;
}

pcp_status_t pcp_host_tensor_write_npy(const pcp_host_tensor_t* tensor,
                                       const char* path, bool append) {
  const char* descr = NULL;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kNpyTypes); ++i) {
    if (kNpyTypes[i].type == tensor->shape.element_type)
      descr = kNpyTypes[i].descr;
  }
  if (!descr) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "no .npy dtype for %s",
                           pcp_element_type_name(tensor->shape.element_type));
  }
  char dims[512] = {0};
  size_t at = 0;
  for (int32_t d = 0; d < tensor->shape.rank; ++d) {
    int n = snprintf(dims + at, sizeof(dims) - at, "%lld,%s",
                     (long long)tensor->shape.dims[d],
                     d + 1 < tensor->shape.rank ? " " : "");
    if (n > 0)
      at += (size_t)n;
  }
  if (tensor->shape.rank > 1)
    dims[at - 1] = 0;  // "(2, 3)" not "(2, 3,)"
  char header[1024];
  int n = snprintf(header, sizeof(header),
                   "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, dims);
  // Pad with spaces so data starts on a 64-byte boundary, then '\n'.
  size_t total = 10 + (size_t)n + 1;
  size_t padded = (total + 63) & ~(size_t)63;
  memset(header + n, ' ', padded - total);
  header[n + (int)(padded - total)] = '\n';
  size_t header_length = padded - 10;
  FILE* f = fopen(path, append ? "ab" : "wb");
  if (!f)
    return pcp_status_from_errno(errno, "opening '%s'", path);
  uint8_t preamble[10] = {0x93,
                          'N',
                          'U',
                          'M',
                          'P',
                          'Y',
                          1,
                          0,
                          (uint8_t)(header_length & 0xFF),
                          (uint8_t)(header_length >> 8)};
  bool ok =
      fwrite(preamble, 1, 10, f) == 10 &&
      fwrite(header, 1, header_length, f) == header_length &&
      (tensor->byte_length == 0 ||
       fwrite(tensor->data, 1, tensor->byte_length, f) == tensor->byte_length);
  if (fclose(f) != 0)
    ok = false;
  if (!ok)
    return pcp_status_from_errno(errno, "writing '%s'", path);
  return pcp_ok_status();
}
