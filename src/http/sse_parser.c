// SPDX-License-Identifier: Apache-2.0
//
// The client side of server-sent events: an incremental text/event-stream
// parser (WHATWG HTML, "9.2.6 Interpreting an event stream"). Sans I/O, so
// the same code parses bytes from libcurl, from a test vector or from a
// fuzzer. Every buffer is a capped string builder: the server decides how
// long a line is, so the client must decide how much of it it will hold.

#include <string.h>

#include "http/http_impl.h"

#define SSE_DEFAULT_MAX_LINE_BYTES (64u << 10)
#define SSE_DEFAULT_MAX_EVENT_BYTES (1u << 20)
// The `event:` and `id:` values are names, not payloads.
#define SSE_MAX_FIELD_BYTES 1024

static const unsigned char kBom[3] = {0xEF, 0xBB, 0xBF};

void pcp_http_sse_parser_initialize(size_t max_line_bytes,
                                    size_t max_event_bytes,
                                    pcp_http_sse_event_fn_t on_event,
                                    void* user_data,
                                    pcp_http_sse_parser_t* out_parser) {
  memset(out_parser, 0, sizeof(*out_parser));
  out_parser->on_event = on_event;
  out_parser->user_data = user_data;
  out_parser->max_line_bytes =
      max_line_bytes ? max_line_bytes : SSE_DEFAULT_MAX_LINE_BYTES;
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_string_builder_initialize(allocator, out_parser->max_line_bytes,
                                &out_parser->line);
  // +1: every data line is stored with its '\n', the last one dropped at
  // dispatch, so an event of exactly the cap still fits.
  pcp_string_builder_initialize(
      allocator,
      (max_event_bytes ? max_event_bytes : SSE_DEFAULT_MAX_EVENT_BYTES) + 1,
      &out_parser->data);
  pcp_string_builder_initialize(allocator, SSE_MAX_FIELD_BYTES,
                                &out_parser->type);
  pcp_string_builder_initialize(allocator, SSE_MAX_FIELD_BYTES,
                                &out_parser->id);
  out_parser->at_start = true;
}

void pcp_http_sse_parser_deinitialize(pcp_http_sse_parser_t* parser) {
  pcp_string_builder_deinitialize(&parser->line);
  pcp_string_builder_deinitialize(&parser->data);
  pcp_string_builder_deinitialize(&parser->type);
  pcp_string_builder_deinitialize(&parser->id);
}

bool pcp_http_sse_parser_has_partial(const pcp_http_sse_parser_t* parser) {
  return parser->line.size > 0 || parser->has_data;
}

static pcp_status_t dispatch(pcp_http_sse_parser_t* parser) {
  bool has_data = parser->has_data;
  parser->has_data = false;
  if (!has_data) {
    // The spec: an event with no data is not dispatched, and its type is
    // forgotten with it.
    pcp_string_builder_reset(&parser->type);
    return pcp_ok_status();
  }
  size_t length = parser->data.size;
  if (length > 0 && parser->data.data[length - 1] == '\n') {
    parser->data.data[--length] = '\0';
    parser->data.size = length;
  }
  pcp_http_sse_event_t event = {
      .type = pcp_string_builder_cstring(&parser->type),
      .data = pcp_string_builder_cstring(&parser->data),
      .data_length = length,
      .last_event_id = pcp_string_builder_cstring(&parser->id),
  };
  pcp_status_t status = parser->on_event(parser->user_data, &event);
  pcp_string_builder_reset(&parser->data);
  pcp_string_builder_reset(&parser->type);
  return status;
}

// One complete line (without its end).
static pcp_status_t process_line(pcp_http_sse_parser_t* parser,
                                 const char* line, size_t length) {
  if (length == 0) {
    return dispatch(parser);
  }
  if (line[0] == ':') {
    return pcp_ok_status();  // a comment (heartbeats)
  }
  const char* colon = memchr(line, ':', length);
  size_t name_length = colon ? (size_t)(colon - line) : length;
  const char* value = colon ? colon + 1 : line + length;
  size_t value_length = (size_t)(line + length - value);
  if (value_length > 0 && value[0] == ' ') {
    ++value;
    --value_length;
  }
  pcp_string_view_t view = pcp_make_string_view(value, value_length);
#define FIELD_IS(name) \
  (name_length == sizeof(name) - 1 && memcmp(line, name, name_length) == 0)
  if (FIELD_IS("data")) {
    pcp_status_t status = pcp_string_builder_append(&parser->data, view);
    if (!status) {
      status =
          pcp_string_builder_append(&parser->data, pcp_make_cstring_view("\n"));
    }
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "event-stream event data over %zu bytes",
                             parser->data.max_size - 1);
    }
    parser->has_data = true;
  } else if (FIELD_IS("event") || FIELD_IS("id")) {
    bool is_id = name_length == 2;
    // The spec ignores an id holding NUL (it could not be sent back in a
    // Last-Event-ID header).
    if (is_id && memchr(value, '\0', value_length)) {
      return pcp_ok_status();
    }
    pcp_string_builder_t* target = is_id ? &parser->id : &parser->type;
    pcp_string_builder_reset(target);
    pcp_status_t status = pcp_string_builder_append(target, view);
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "event-stream '%s' field over %d bytes",
                             is_id ? "id" : "event", SSE_MAX_FIELD_BYTES);
    }
  }
#undef FIELD_IS
  // retry: and unknown fields are ignored (the spec), as is a reconnection
  // delay: this parser does not reconnect.
  return pcp_ok_status();
}

pcp_status_t pcp_http_sse_parser_feed(pcp_http_sse_parser_t* parser,
                                      const char* data, size_t length) {
  size_t at = 0;
  // A BOM is only a BOM as the stream's first bytes; its prefix may arrive
  // split across feeds.
  while (parser->at_start && at < length) {
    if ((unsigned char)data[at] == kBom[parser->bom_seen]) {
      ++at;
      if (++parser->bom_seen == sizeof(kBom)) {
        parser->at_start = false;
      }
      continue;
    }
    parser->at_start = false;
    if (parser->bom_seen > 0) {
      // Not a BOM after all: the matched bytes were line content.
      pcp_status_t status = pcp_string_builder_append(
          &parser->line,
          pcp_make_string_view((const char*)kBom, parser->bom_seen));
      if (status) {
        return status;
      }
    }
  }
  while (at < length) {
    char c = data[at];
    if (parser->after_cr) {
      parser->after_cr = false;
      if (c == '\n') {
        ++at;  // the LF of a CRLF split from its CR
        continue;
      }
    }
    // Take the run of bytes up to the next line end in one append.
    size_t end = at;
    while (end < length && data[end] != '\n' && data[end] != '\r') {
      ++end;
    }
    if (end > at) {
      pcp_status_t status = pcp_string_builder_append(
          &parser->line, pcp_make_string_view(data + at, end - at));
      if (status) {
        pcp_status_ignore(status);
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "event-stream line over %zu bytes",
                               parser->max_line_bytes);
      }
    }
    if (end == length) {
      break;
    }
    parser->after_cr = data[end] == '\r';
    at = end + 1;
    pcp_status_t status = process_line(
        parser, parser->line.data ? parser->line.data : "", parser->line.size);
    pcp_string_builder_reset(&parser->line);
    if (status) {
      return status;
    }
  }
  return pcp_ok_status();
}
