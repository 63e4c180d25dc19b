// SPDX-License-Identifier: Apache-2.0
// String views, strict number parsing and a capped string builder.

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

pcp_string_view_t pcp_make_string_view(const char* data, size_t size) {
  return (pcp_string_view_t){.data = data, .size = size};
}

pcp_string_view_t pcp_make_cstring_view(const char* value) {
  return (pcp_string_view_t){.data = value, .size = value ? strlen(value) : 0};
}

bool pcp_string_view_equal(pcp_string_view_t a, pcp_string_view_t b) {
  return a.size == b.size &&
         (a.size == 0 || memcmp(a.data, b.data, a.size) == 0);
}

bool pcp_string_view_starts_with(pcp_string_view_t value,
                                 pcp_string_view_t prefix) {
  return value.size >= prefix.size &&
         (prefix.size == 0 ||
          memcmp(value.data, prefix.data, prefix.size) == 0);
}

pcp_string_view_t pcp_string_view_trim(pcp_string_view_t value) {
  while (value.size && isspace((unsigned char)value.data[0])) {
    value.data++;
    value.size--;
  }
  while (value.size && isspace((unsigned char)value.data[value.size - 1])) {
    value.size--;
  }
  return value;
}

bool pcp_string_view_split(pcp_string_view_t value, char separator,
                           pcp_string_view_t* out_head,
                           pcp_string_view_t* out_tail) {
  const char* hit =
      value.size ? memchr(value.data, separator, value.size) : NULL;
  if (!hit) {
    *out_head = value;
    *out_tail = pcp_make_string_view(value.data + value.size, 0);
    return false;
  }
  size_t head = (size_t)(hit - value.data);
  *out_head = pcp_make_string_view(value.data, head);
  *out_tail = pcp_make_string_view(hit + 1, value.size - head - 1);
  return true;
}

// Copies a short view into a NUL-terminated stack buffer for strto*.
static bool view_to_buffer(pcp_string_view_t value, char* buffer, size_t cap) {
  if (value.size == 0 || value.size >= cap)
    return false;
  memcpy(buffer, value.data, value.size);
  buffer[value.size] = 0;
  return !isspace((unsigned char)buffer[0]);
}

bool pcp_string_view_parse_int64(pcp_string_view_t value, int64_t* out_value) {
  char buffer[32];
  if (!view_to_buffer(value, buffer, sizeof(buffer)))
    return false;
  char* end = NULL;
  errno = 0;
  long long parsed = strtoll(buffer, &end, 10);
  if (errno || *end)
    return false;
  *out_value = parsed;
  return true;
}

bool pcp_string_view_parse_uint64(pcp_string_view_t value,
                                  uint64_t* out_value) {
  char buffer[32];
  if (!view_to_buffer(value, buffer, sizeof(buffer)))
    return false;
  if (buffer[0] == '-')
    return false;
  char* end = NULL;
  errno = 0;
  unsigned long long parsed = strtoull(buffer, &end, 10);
  if (errno || *end)
    return false;
  *out_value = parsed;
  return true;
}

bool pcp_string_view_parse_double(pcp_string_view_t value, double* out_value) {
  char buffer[64];
  if (!view_to_buffer(value, buffer, sizeof(buffer)))
    return false;
  char* end = NULL;
  errno = 0;
  double parsed = strtod(buffer, &end);
  if (errno || *end)
    return false;
  *out_value = parsed;
  return true;
}

void pcp_string_builder_initialize(pcp_allocator_t allocator, size_t max_size,
                                   pcp_string_builder_t* out_builder) {
  memset(out_builder, 0, sizeof(*out_builder));
  out_builder->allocator = allocator;
  out_builder->max_size = max_size ? max_size : SIZE_MAX / 2;
}

void pcp_string_builder_deinitialize(pcp_string_builder_t* builder) {
  pcp_allocator_free(builder->allocator, builder->data);
  builder->data = NULL;
  builder->size = builder->capacity = 0;
}

void pcp_string_builder_reset(pcp_string_builder_t* builder) {
  builder->size = 0;
  if (builder->data)
    builder->data[0] = 0;
}

static pcp_status_t builder_reserve(pcp_string_builder_t* builder,
                                    size_t extra) {
  if (extra > builder->max_size - builder->size) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "text exceeds its limit of %zu bytes",
                           builder->max_size);
  }
  size_t need = builder->size + extra + 1;
  if (need <= builder->capacity)
    return pcp_ok_status();
  size_t capacity = builder->capacity ? builder->capacity : 64;
  while (capacity < need) capacity *= 2;
  void* data = builder->data;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(builder->allocator, capacity, &data));
  builder->data = data;
  builder->capacity = capacity;
  builder->data[builder->size] = 0;  // a fresh buffer reads as "" at once
  return pcp_ok_status();
}

pcp_status_t pcp_string_builder_append(pcp_string_builder_t* builder,
                                       pcp_string_view_t value) {
  PCP_RETURN_IF_ERROR_BARE(builder_reserve(builder, value.size));
  if (value.size)
    memcpy(builder->data + builder->size, value.data, value.size);
  builder->size += value.size;
  builder->data[builder->size] = 0;
  return pcp_ok_status();
}

pcp_status_t pcp_string_builder_append_cstring(pcp_string_builder_t* builder,
                                               const char* value) {
  return pcp_string_builder_append(builder, pcp_make_cstring_view(value));
}

pcp_status_t pcp_string_builder_append_f(pcp_string_builder_t* builder,
                                         const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  if (n < 0) {
    va_end(args);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad format string");
  }
  pcp_status_t status = builder_reserve(builder, (size_t)n);
  if (!status) {
    vsnprintf(builder->data + builder->size, (size_t)n + 1, fmt, args);
    builder->size += (size_t)n;
  }
  va_end(args);
  return status;
}

pcp_status_t pcp_string_builder_take(pcp_string_builder_t* builder,
                                     char** out_value) {
  PCP_RETURN_IF_ERROR_BARE(builder_reserve(builder, 0));
  *out_value = builder->data;
  builder->data = NULL;
  builder->size = builder->capacity = 0;
  return pcp_ok_status();
}

const char* pcp_string_builder_cstring(const pcp_string_builder_t* builder) {
  return builder->data ? builder->data : "";
}

//===----------------------------------------------------------------------===//
// Base64 (RFC 4648)
//===----------------------------------------------------------------------===//

static const char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pcp_status_t pcp_base64_decode(pcp_allocator_t allocator, const char* text,
                               size_t length, uint8_t** out_data,
                               size_t* out_length) {
  *out_data = NULL;
  *out_length = 0;
  while (length > 0 && text[length - 1] == '=') {
    --length;
  }
  if (length % 4 == 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "base64: truncated input");
  }
  // 0: not in the alphabet; else the 6-bit value + 1.
  uint8_t values[256] = {0};
  for (int i = 0; i < 64; ++i) {
    values[(unsigned char)kBase64Alphabet[i]] = (uint8_t)(i + 1);
  }
  uint8_t* data = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, length / 4 * 3 + 3, (void**)&data));
  size_t n = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < length; ++i) {
    int v = values[(unsigned char)text[i]];
    if (v == 0) {
      pcp_allocator_free(allocator, data);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "base64: invalid character at offset %zu", i);
    }
    acc = (acc << 6) | (uint32_t)(v - 1);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      data[n++] = (uint8_t)(acc >> bits);
    }
  }
  *out_data = data;
  *out_length = n;
  return pcp_ok_status();
}

pcp_status_t pcp_base64_encode(pcp_allocator_t allocator, const void* data,
                               size_t length, char** out_text,
                               size_t* out_text_length) {
  *out_text = NULL;
  *out_text_length = 0;
  size_t n = (length + 2) / 3 * 4;
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, n + 1, (void**)&text));
  const uint8_t* in = data;
  size_t o = 0;
  for (size_t i = 0; i < length; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16;
    if (i + 1 < length) {
      v |= (uint32_t)in[i + 1] << 8;
    }
    if (i + 2 < length) {
      v |= in[i + 2];
    }
    text[o++] = kBase64Alphabet[(v >> 18) & 63];
    text[o++] = kBase64Alphabet[(v >> 12) & 63];
    text[o++] = i + 1 < length ? kBase64Alphabet[(v >> 6) & 63] : '=';
    text[o++] = i + 2 < length ? kBase64Alphabet[v & 63] : '=';
  }
  text[o] = 0;
  *out_text = text;
  *out_text_length = o;
  return pcp_ok_status();
}
