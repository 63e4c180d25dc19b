// SPDX-License-Identifier: Apache-2.0
//
// The status -> HTTP table, the error schema, constant-time token equality
// and the JSON depth pre-check: the pure parts of the module.

#include <string.h>

#include <openssl/crypto.h>

#include "http/http_impl.h"

int pcp_http_status_from_code(pcp_status_code_t code) {
  // One table, in canonical-code order, so that adding a code is one line
  // and every boundary maps it the same way (STYLE.md s.3.4).
  switch (code) {
    case PCP_STATUS_OK:
      return 200;
    case PCP_STATUS_INVALID_ARGUMENT:
    case PCP_STATUS_OUT_OF_RANGE:
      return 400;
    case PCP_STATUS_UNAUTHENTICATED:
      return 401;
    case PCP_STATUS_PERMISSION_DENIED:
      return 403;
    case PCP_STATUS_NOT_FOUND:
      return 404;
    case PCP_STATUS_ALREADY_EXISTS:
    case PCP_STATUS_ABORTED:
    case PCP_STATUS_FAILED_PRECONDITION:
      return 409;
    case PCP_STATUS_RESOURCE_EXHAUSTED:
      return 429;
    case PCP_STATUS_UNIMPLEMENTED:
      return 501;
    case PCP_STATUS_UNAVAILABLE:
      return 503;
    case PCP_STATUS_DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

const char* pcp_http_status_reason(int http_status) {
  switch (http_status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

pcp_status_t pcp_http_error_json_format(const char* code, const char* message,
                                        pcp_string_builder_t* builder) {
  // jansson does the escaping, so a message quoting user input (a path, a
  // JSON parse error) can never break the schema.
  json_t* root =
      json_pack("{s:{s:s,s:s}}", "error", "code", code ? code : "INTERNAL",
                "message", message ? message : "");
  if (!root) {
    // Invalid UTF-8 in the message makes json_pack fail; say so instead.
    root = json_pack("{s:{s:s,s:s}}", "error", "code", code ? code : "INTERNAL",
                     "message", "(message was not valid UTF-8)");
  }
  if (!root) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building an error body");
  }
  char* text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building an error body");
  }
  pcp_status_t status = pcp_string_builder_append_cstring(builder, text);
  pcp_libc_free(text);
  return status;
}

bool pcp_http_token_equal(const void* a, size_t a_length, const void* b,
                          size_t b_length) {
  // Hashing first makes both operands 32 bytes, so CRYPTO_memcmp runs over
  // equal lengths and a length mismatch is not an early exit.
  pcp_sha256_t da;
  pcp_sha256_t db;
  pcp_sha256_compute(a, a_length, &da);
  pcp_sha256_compute(b, b_length, &db);
  return CRYPTO_memcmp(da.bytes, db.bytes, sizeof(da.bytes)) == 0;
}

pcp_status_t pcp_http_json_depth_check(const char* text, size_t length,
                                       size_t max_depth) {
  if (max_depth == 0) {
    max_depth = PCP_HTTP_DEFAULT_MAX_JSON_DEPTH;
  }
  // jansson's own limit is a compile-time 2048; this scan enforces ours and
  // runs before the parser allocates anything for the nesting.
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < length; ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "JSON nests deeper than %zu levels (at byte "
                               "%zu)",
                               max_depth, i);
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return pcp_ok_status();
}
