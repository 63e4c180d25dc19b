// SPDX-License-Identifier: Apache-2.0
// OpenAI's wire shapes shared by every route that speaks the OpenAI API
// (services.h "OpenAI shapes"): the error body {"error": {message, type,
// param, code}} and a JSON value sent as one SSE "data:" event. One copy,
// so a proxied error and a locally generated one read the same.

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

json_t* pcp_services_openai_error_json(const char* message, const char* type,
                                       const char* param, const char* code) {
  return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message,
                   "type", type, "param",
                   param ? json_string(param) : json_null(), "code",
                   code ? json_string(code) : json_null());
}

pcp_status_t pcp_services_openai_error_reply(pcp_http_response_t* response,
                                             int http_status, const char* type,
                                             const char* param,
                                             const char* code,
                                             const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  return pcp_http_response_json_take(
      response, http_status,
      pcp_services_openai_error_json(message, type, param, code));
}

pcp_status_t pcp_services_openai_sse_json_send(pcp_http_sse_stream_t* stream,
                                               const char* event,
                                               json_t* value) {
  char* text = value ? json_dumps(value, JSON_COMPACT) : NULL;
  json_decref(value);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "event body");
  }
  pcp_status_t status = pcp_http_sse_stream_send(stream, NULL, event, text);
  pcp_libc_free(text);
  return status;
}
