// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the parts of src/http that read untrusted bytes without a
// socket: route matching (paths), the JSON depth pre-check in front of
// jansson (bodies), the error schema (messages that echo input), and the
// client-side SSE parser (a server's stream, fed whole and in pieces: both
// must give the same events).
//
// The first input byte picks the part; the rest is the input. Built two
// ways, like config_fuzz: with -DPCP_FUZZ=ON under clang a libFuzzer binary
// (`http_fuzz tests/fuzz/http`); otherwise a replay tool that ctest runs
// over the seed corpus, so every build exercises the target.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_impl.h"

// libFuzzer fixes this name.
int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size);

static pcp_status_t fuzz_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(request);
  PCP_UNUSED(response);
  return pcp_ok_status();
}

static const pcp_http_route_t kRoutes[] = {
    {"GET", "/", NULL, fuzz_handler, NULL, 0, 0},
    {"GET", "/v1/jobs", NULL, fuzz_handler, NULL, 0, 0},
    {"GET", "/v1/jobs/{id}", NULL, fuzz_handler, NULL, 0, 0},
    {"DELETE", "/v1/jobs/{id}", NULL, fuzz_handler, NULL, 0, 0},
    {"GET", "/v1/jobs/special", NULL, fuzz_handler, NULL, 0, 0},
    {"POST", "/v1/jobs/{id}/cancel", NULL, fuzz_handler, NULL, 0, 0},
    {"GET", "/v1/{a}/{b}/{c}/{d}", NULL, fuzz_handler, NULL, 0, 0},
    {"GET", "/static/*", NULL, fuzz_handler, NULL, 0, 0},
    {"*", "/any/*", NULL, fuzz_handler, NULL, 0, 0},
};

static void fuzz_router(const char* path, size_t length) {
  static pcp_http_router_t router;
  static bool ready = false;
  if (!ready) {
    pcp_http_router_initialize(pcp_allocator_system(), &router);
    for (size_t i = 0; i < PCP_ARRAYSIZE(kRoutes); ++i) {
      PCP_CHECK_OK(pcp_http_router_add(&router, &kRoutes[i], -1));
    }
    ready = true;
  }
  static const char* const kMethods[] = {"GET", "POST", "DELETE", "HEAD"};
  for (size_t m = 0; m < PCP_ARRAYSIZE(kMethods); ++m) {
    pcp_http_route_match_t match;
    pcp_http_router_match(&router, kMethods[m], path, &match);
    PCP_ASSERT(!match.route || match.path_matched);
    PCP_ASSERT(match.param_count <= PCP_HTTP_MAX_PATH_PARAMS);
    for (size_t i = 0; i < match.param_count; ++i) {
      PCP_ASSERT(match.param_begin[i] <= match.param_end[i]);
      PCP_ASSERT(match.param_end[i] <= length);
      // A "{name}" value is one non-empty segment.
      if (strcmp(match.param_names[i], "*") != 0) {
        PCP_ASSERT(match.param_end[i] > match.param_begin[i]);
        PCP_ASSERT(!memchr(path + match.param_begin[i], '/',
                           match.param_end[i] - match.param_begin[i]));
      }
    }
    PCP_ASSERT(strlen(match.allow) < sizeof(match.allow));
  }
}

// The header gate's classifier on raw bytes, with small limits so that
// fuzzer-sized inputs reach every verdict. A verdict on a prefix that is
// already REJECT or PASS must not change when more bytes come: the gate
// decides on whatever has arrived.
static void fuzz_gate(const char* data, size_t size) {
  const pcp_http_gate_limits_t limits = {
      .max_url_bytes = 64, .max_header_bytes = 256, .max_header_count = 8};
  pcp_http_gate_result_t whole;
  pcp_http_gate_verdict_t verdict =
      pcp_http_gate_classify(data, size, &limits, &whole);
  if (verdict == PCP_HTTP_GATE_REJECT) {
    PCP_ASSERT(whole.http_status == 400 || whole.http_status == 414 ||
               whole.http_status == 431);
    PCP_ASSERT(whole.code && whole.message[0]);
  }
  for (size_t cut = 0; cut < size; cut += 1 + size / 16) {
    pcp_http_gate_result_t prefix;
    pcp_http_gate_verdict_t early =
        pcp_http_gate_classify(data, cut, &limits, &prefix);
    if (early != PCP_HTTP_GATE_NEED_MORE) {
      PCP_ASSERT(early == verdict);
      PCP_ASSERT(early != PCP_HTTP_GATE_REJECT ||
                 prefix.http_status == whole.http_status);
    }
  }
}

static void fuzz_json(const char* text, size_t length) {
  pcp_status_t status = pcp_http_json_depth_check(text, length, 8);
  if (status) {
    PCP_ASSERT(pcp_status_code(status) == PCP_STATUS_INVALID_ARGUMENT);
    pcp_status_ignore(status);
    return;
  }
  json_error_t error;
  json_t* value = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
  json_decref(value);
}

static void fuzz_error_schema(const char* message) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  PCP_CHECK_OK(pcp_http_error_json_format("NOT_FOUND", message, &builder));
  // Whatever the message, the body parses and keeps the schema.
  json_error_t error;
  json_t* root = json_loads(pcp_string_builder_cstring(&builder), 0, &error);
  PCP_ASSERT(root);
  json_t* inner = json_object_get(root, "error");
  PCP_ASSERT(json_is_object(inner));
  PCP_ASSERT(json_is_string(json_object_get(inner, "message")));
  PCP_ASSERT(strcmp(json_string_value(json_object_get(inner, "code")),
                    "NOT_FOUND") == 0);
  json_decref(root);
  pcp_string_builder_deinitialize(&builder);
}

// Every event as "type\x1f" "data\x1f" "id\x1e", capped so that a long run
// stays bounded (the comparison only needs a prefix to catch a divergence).
static pcp_status_t sse_collect(void* user_data,
                                const pcp_http_sse_event_t* event) {
  pcp_string_builder_t* out = user_data;
  if (out->size < (64u << 10)) {
    pcp_status_ignore(pcp_string_builder_append_f(out, "%s\x1f%s\x1f%s\x1e",
                                                  event->type, event->data,
                                                  event->last_event_id));
  }
  return pcp_ok_status();
}

static bool sse_parse(const char* data, size_t size, size_t piece,
                      pcp_string_builder_t* out) {
  pcp_http_sse_parser_t parser;
  // Small caps, so that inputs of fuzzer size reach them.
  pcp_http_sse_parser_initialize(64, 256, sse_collect, out, &parser);
  pcp_status_t status = pcp_ok_status();
  for (size_t at = 0; at < size && !status;) {
    size_t n = piece < size - at ? piece : size - at;
    status = pcp_http_sse_parser_feed(&parser, data + at, n);
    at += n;
  }
  bool failed = status != NULL;
  pcp_status_ignore(status);
  pcp_http_sse_parser_deinitialize(&parser);
  return failed;
}

static void fuzz_sse(const char* data, size_t size) {
  pcp_string_builder_t whole;
  pcp_string_builder_t pieces;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &whole);
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &pieces);
  bool whole_failed = sse_parse(data, size, size ? size : 1, &whole);
  // A piece size from the data, so the fuzzer explores the splits too.
  size_t piece = size ? 1 + (unsigned char)data[0] % 7 : 1;
  bool pieces_failed = sse_parse(data, size, piece, &pieces);
  PCP_ASSERT(whole_failed == pieces_failed);
  PCP_ASSERT(whole.size == pieces.size);
  PCP_ASSERT(whole.size == 0 ||
             memcmp(whole.data, pieces.data, whole.size) == 0);
  pcp_string_builder_deinitialize(&whole);
  pcp_string_builder_deinitialize(&pieces);
}

int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  // NUL-terminated copy: paths and messages arrive as C strings.
  pcp_allocator_t allocator = pcp_allocator_system();
  char* text = NULL;
  PCP_CHECK_OK(pcp_allocator_malloc(allocator, size, (void**)&text));
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  switch (data[0] % 4) {
    case 3:
      fuzz_sse((const char*)data + 1, size - 1);
      break;
    case 0:
      fuzz_router(text, strlen(text));
      fuzz_gate((const char*)data + 1, size - 1);
      break;
    case 1:
      fuzz_json(text, size - 1);
      break;
    default:
      fuzz_error_schema(text);
      break;
  }
  pcp_allocator_free(allocator, text);
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "http_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);  // pcp_file_read_all's buffer: libc memory
  }
  printf("http_fuzz: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
