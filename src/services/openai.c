// SPDX-License-Identifier: Apache-2.0
// OpenAI's wire shapes shared by every route that speaks the OpenAI API
// (services.h "OpenAI shapes"): the error body {"error": {message, type,
// param, code}} and a JSON value sent as one SSE "data:" event. One copy,
// so a proxied error and a locally generated one read the same.
//
// Below them, the OpenAI-compatible inference routes (moved from
// src/roles/gateway/inference.c, issue 14): /v1/models,
// /v1/chat/completions, /v1/completions, streaming (SSE) and not. The
// engine is src/workloads/infer; this part parses and validates requests,
// shapes answers exactly as OpenAI does (objects, chunks, usage, [DONE]) and
// maps errors to the error body above.
//
// A streamed request is handed to the engine and the handler returns: text
// arrives on the engine's scheduler thread and is written to the SSE stream
// as it comes (no buffering). A request that is not streamed holds its
// server thread until the generation ends (the gateway runs enough server
// threads for that; docs/decisions.md).

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

//===----------------------------------------------------------------------===//
// The inference routes
//===----------------------------------------------------------------------===//

// Non-streamed requests waiting at once (each holds a server thread).
#define PCP_SERVICES_OPENAI_MAX_BLOCKING 24

static atomic_int g_blocking;
// The cap in force: PCP_SERVICES_OPENAI_MAX_BLOCKING, or lower from the test
// hook PCP_GATEWAY_TEST_INFER_MAX_BLOCKING (read when the services start),
// so a test can fill it without racing the generations.
static int g_max_blocking = PCP_SERVICES_OPENAI_MAX_BLOCKING;
static atomic_uint_fast64_t g_sequence;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

static pcp_status_t error_set(pcp_http_response_t* response, int http_status,
                              const char* message, const char* type,
                              const char* param, const char* code) {
  json_t* body = pcp_services_openai_error_json(message, type, param, code);
  char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "error body");
  }
  return pcp_http_response_body_take(response, http_status, "application/json",
                                     text, strlen(text));
}

// The OpenAI shape of an engine or validation status. A message that starts
// with "<param>: " names the parameter.
static json_t* status_error_json(pcp_status_t status, int* out_http) {
  const char* message = pcp_status_message(status);
  char param[96] = {0};
  const char* colon = strstr(message, ": ");
  if (colon && (size_t)(colon - message) < sizeof(param) &&
      strcspn(message, " ") >= (size_t)(colon - message)) {
    memcpy(param, message, (size_t)(colon - message));
  }
  const char* type = "invalid_request_error";
  const char* code = NULL;
  int http = 400;
  switch (pcp_status_code(status)) {
    case PCP_STATUS_INVALID_ARGUMENT:
      break;
    case PCP_STATUS_OUT_OF_RANGE:
      code = "context_length_exceeded";
      snprintf(param, sizeof(param), "messages");
      break;
    case PCP_STATUS_NOT_FOUND:
      http = 404;
      code = "model_not_found";
      snprintf(param, sizeof(param), "model");
      break;
    case PCP_STATUS_RESOURCE_EXHAUSTED:
      http = 429;
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      param[0] = 0;
      break;
    case PCP_STATUS_UNAVAILABLE:
      http = 503;
      type = "service_unavailable_error";
      param[0] = 0;
      break;
    default:
      http = 500;
      type = "server_error";
      param[0] = 0;
      break;
  }
  *out_http = http;
  return pcp_services_openai_error_json(message, type, param[0] ? param : NULL,
                                        code);
}

static pcp_status_t status_error_set(pcp_http_response_t* response,
                                     pcp_status_t status) {
  int http = 500;
  json_t* body = status_error_json(status, &http);
  pcp_status_ignore(status);
  char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "error body");
  }
  return pcp_http_response_body_take(response, http, "application/json", text,
                                     strlen(text));
}

static pcp_status_t bad(const char* param, const char* rule) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: %s", param, rule);
}

//===----------------------------------------------------------------------===//
// /v1/models
//===----------------------------------------------------------------------===//

static json_t* model_json(const pcp_infer_model_info_t* info) {
  static const char* const kStates[] = {"preparing", "ready", "failed"};
  json_t* m = json_pack(
      "{s:s, s:s, s:I, s:s, s:I, s:s, s:s}", "id", info->name, "object",
      "model", "created", (json_int_t)info->created_s, "owned_by", "pcp",
      "max_model_len", (json_int_t)info->max_length, "architecture",
      info->architecture, "status", kStates[info->state]);
  if (m && info->error[0]) {
    json_object_set_new(m, "error", json_string(info->error));
  }
  if (m) {
    // Which export is served (a training job's model is reloaded at every
    // checkpoint): the version, and the job and outer step it came from.
    json_object_set_new(m, "version", json_integer(info->version));
    json_object_set_new(
        m, "job_id", info->job_id[0] ? json_string(info->job_id) : json_null());
    json_object_set_new(m, "outer_step",
                        info->outer_step >= 0
                            ? json_integer((json_int_t)info->outer_step)
                            : json_null());
    if (info->pending_version) {
      json_object_set_new(m, "pending_version",
                          json_integer(info->pending_version));
    }
    if (info->reload_error[0]) {
      json_object_set_new(m, "reload_error", json_string(info->reload_error));
    }
    // Where it runs: the workers serving it now, and the worker class
    // model.json names (null: every worker).
    json_object_set_new(m, "workers", json_integer(info->workers));
    json_object_set_new(
        m, "worker_class",
        info->worker_class[0] ? json_string(info->worker_class) : json_null());
    // Served since the gateway started (the dashboard's models page):
    // means over the requests, null before the first one.
    const pcp_infer_model_stats_t* st = &info->stats;
    json_object_set_new(
        m, "stats",
        json_pack(
            "{s:I, s:I, s:I, s:o, s:o}", "requests", (json_int_t)st->requests,
            "failed_requests", (json_int_t)st->failed_requests,
            "generated_tokens", (json_int_t)st->generated_tokens,
            "ttft_seconds_mean",
            st->ttft_count
                ? json_real(st->ttft_seconds_sum / (double)st->ttft_count)
                : json_null(),
            "tokens_per_second",
            st->request_seconds > 0
                ? json_real((double)st->generated_tokens / st->request_seconds)
                : json_null()));
  }
  return m;
}

// The engine's models into |*out_infos| (PCP_INFER_MAX_MODELS entries from
// |svc|'s allocator; the caller frees them) and their count.
static pcp_status_t models_read(pcp_services_t* svc,
                                pcp_infer_model_info_t** out_infos,
                                size_t* out_count) {
  void* infos = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      svc->allocator, PCP_INFER_MAX_MODELS * sizeof(pcp_infer_model_info_t),
      &infos);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "models");
  }
  *out_infos = infos;
  *out_count = pcp_infer_service_model_list(svc->infer, infos,
                                            PCP_INFER_MAX_MODELS, NULL);
  return pcp_ok_status();
}

pcp_status_t pcp_services_openai_models_list(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* svc = user_data;
  pcp_infer_model_info_t* infos = NULL;
  size_t n = 0;
  PCP_RETURN_IF_ERROR_BARE(models_read(svc, &infos, &n));
  json_t* data = json_array();
  for (size_t i = 0; i < n; ++i) {
    json_array_append_new(data, model_json(&infos[i]));
  }
  pcp_allocator_free(svc->allocator, infos);
  return pcp_http_response_json_take(
      response, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

pcp_status_t pcp_services_openai_model_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_services_t* svc = user_data;
  const char* id = pcp_http_request_param(request, "*");
  pcp_infer_model_info_t* infos = NULL;
  size_t n = 0;
  PCP_RETURN_IF_ERROR_BARE(models_read(svc, &infos, &n));
  json_t* found = NULL;
  for (size_t i = 0; i < n && !found; ++i) {
    if (id && strcmp(infos[i].name, id) == 0) {
      found = model_json(&infos[i]);
    }
  }
  pcp_allocator_free(svc->allocator, infos);
  if (!found) {
    char message[PCP_INFER_MAX_MODEL_NAME + 64];
    snprintf(message, sizeof(message), "The model `%.128s` does not exist.",
             id ? id : "");
    return error_set(response, 404, message, "invalid_request_error", "model",
                     "model_not_found");
  }
  return pcp_http_response_json_take(response, 200, found);
}

//===----------------------------------------------------------------------===//
// Request parsing
//===----------------------------------------------------------------------===//

typedef struct parsed_t {
  pcp_allocator_t allocator;  // |messages| and |builders|
  json_t* body;
  const char* model;
  bool stream;
  bool include_usage;
  pcp_infer_message_t* messages;
  size_t message_count;
  pcp_string_view_t prompt;
  pcp_sampling_params_t sampling;
  int64_t max_tokens;
  const char* stop[4];
  size_t stop_count;
  const char* user;
  // `logprobs` asked for, with |top_logprobs| entries per token.
  bool logprobs;
  int64_t top_logprobs;
  pcp_string_builder_t* builders;  // one per message (joined text parts)
  size_t builder_count;
} parsed_t;

static void parsed_deinitialize(parsed_t* p) {
  json_decref(p->body);
  pcp_allocator_free(p->allocator, p->messages);
  for (size_t i = 0; i < p->builder_count; ++i) {
    pcp_string_builder_deinitialize(&p->builders[i]);
  }
  pcp_allocator_free(p->allocator, p->builders);
  memset(p, 0, sizeof(*p));
}

static pcp_status_t number_field(json_t* body, const char* key, double min,
                                 double max, double* inout) {
  json_t* v = json_object_get(body, key);
  if (!v || json_is_null(v)) {
    return pcp_ok_status();
  }
  if (!json_is_number(v) || json_number_value(v) < min ||
      json_number_value(v) > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: must be a number in [%g, %g]", key, min, max);
  }
  *inout = json_number_value(v);
  return pcp_ok_status();
}

static pcp_status_t int_field(json_t* body, const char* key, int64_t min,
                              int64_t max, int64_t* inout) {
  json_t* v = json_object_get(body, key);
  if (!v || json_is_null(v)) {
    return pcp_ok_status();
  }
  if (!json_is_integer(v) || json_integer_value(v) < min ||
      json_integer_value(v) > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: must be an integer in [%lld, %lld]", key,
                           (long long)min, (long long)max);
  }
  *inout = json_integer_value(v);
  return pcp_ok_status();
}

static pcp_status_t content_parse(json_t* content, size_t index,
                                  pcp_string_builder_t* joined,
                                  pcp_string_view_t* out) {
  char param[64];
  snprintf(param, sizeof(param), "messages[%zu].content", index);
  if (json_is_string(content)) {
    *out = pcp_make_string_view(json_string_value(content),
                                json_string_length(content));
    return pcp_ok_status();
  }
  if (json_is_null(content)) {
    *out = pcp_make_string_view("", 0);
    return pcp_ok_status();
  }
  if (!json_is_array(content)) {
    return bad(param, "must be a string or an array of text parts");
  }
  // Text parts are joined; the builder's contents stay put for the request
  // (one builder per message).
  size_t i;
  json_t* part;
  json_array_foreach(content, i, part) {
    const char* type = json_string_value(json_object_get(part, "type"));
    json_t* text = json_object_get(part, "text");
    if (!type || strcmp(type, "text") != 0 || !json_is_string(text)) {
      return bad(param,
                 "only parts {\"type\": \"text\", \"text\": ...} are "
                 "supported");
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
        joined, pcp_make_string_view(json_string_value(text),
                                     json_string_length(text))));
  }
  *out = pcp_make_string_view(joined->data ? joined->data : "", joined->size);
  return pcp_ok_status();
}

static pcp_status_t parse(pcp_allocator_t allocator,
                          const pcp_http_request_t* request, bool chat,
                          parsed_t* p) {
  memset(p, 0, sizeof(*p));
  p->allocator = allocator;
  pcp_sampling_params_initialize(&p->sampling);
  // OpenAI's defaults: temperature 1 and a fresh seed per request.
  p->sampling.temperature = 1.0;
  p->sampling.seed = (uint64_t)pcp_clock_now_ns(pcp_clock_system()) ^
                     (atomic_fetch_add(&g_sequence, 1) << 32);
  pcp_status_t status = pcp_http_request_json_parse(request, &p->body);
  if (status) {
    pcp_status_t out =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        "We could not parse the JSON body of your request: %s",
                        pcp_status_message(status));
    pcp_status_ignore(status);
    return out;
  }
  json_t* b = p->body;
  if (!json_is_object(b)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "The body of your request must be a JSON object.");
  }
  p->model = json_string_value(json_object_get(b, "model"));
  if (!p->model) {
    return bad("model", "you must provide a model parameter (a string)");
  }
  json_t* v = json_object_get(b, "stream");
  if (v && !json_is_null(v) && !json_is_boolean(v)) {
    return bad("stream", "must be a boolean");
  }
  p->stream = json_is_true(v);
  v = json_object_get(b, "stream_options");
  if (v && !json_is_null(v)) {
    if (!p->stream) {
      return bad("stream_options", "only allowed when 'stream' is set to true");
    }
    json_t* u = json_object_get(v, "include_usage");
    if (!json_is_object(v) || (u && !json_is_boolean(u))) {
      return bad("stream_options", "must be {\"include_usage\": bool}");
    }
    p->include_usage = json_is_true(u);
  }
  int64_t n = 1;
  PCP_RETURN_IF_ERROR_BARE(int_field(b, "n", 1, 128, &n));
  if (n != 1) {
    return bad("n", "only n = 1 is supported");
  }
  PCP_RETURN_IF_ERROR_BARE(
      number_field(b, "temperature", 0, 2, &p->sampling.temperature));
  PCP_RETURN_IF_ERROR_BARE(number_field(b, "top_p", 0, 1, &p->sampling.top_p));
  if (p->sampling.top_p <= 0) {
    return bad("top_p", "must be in (0, 1]");
  }
  PCP_RETURN_IF_ERROR_BARE(
      int_field(b, "top_k", -1, INT32_MAX, &p->sampling.top_k));
  if (p->sampling.top_k < 0) {
    p->sampling.top_k = 0;  // -1: off (vLLM)
  }
  PCP_RETURN_IF_ERROR_BARE(number_field(b, "presence_penalty", -2, 2,
                                        &p->sampling.presence_penalty));
  PCP_RETURN_IF_ERROR_BARE(number_field(b, "frequency_penalty", -2, 2,
                                        &p->sampling.frequency_penalty));
  PCP_RETURN_IF_ERROR_BARE(number_field(b, "repetition_penalty", 0.01, 100,
                                        &p->sampling.repetition_penalty));
  int64_t seed = -1;
  PCP_RETURN_IF_ERROR_BARE(int_field(b, "seed", INT64_MIN, INT64_MAX, &seed));
  if (json_is_integer(json_object_get(b, "seed"))) {
    p->sampling.seed = (uint64_t)seed;
  }
  PCP_RETURN_IF_ERROR_BARE(
      int_field(b, "max_tokens", 1, 131072, &p->max_tokens));
  if (chat) {
    PCP_RETURN_IF_ERROR_BARE(
        int_field(b, "max_completion_tokens", 1, 131072, &p->max_tokens));
  }
  v = json_object_get(b, "stop");
  if (json_is_string(v)) {
    if (json_string_length(v) == 0 ||
        json_string_length(v) > PCP_STOP_MAX_SEQUENCE_BYTES) {
      return bad("stop", "must be 1..256 bytes");
    }
    p->stop[p->stop_count++] = json_string_value(v);
  } else if (json_is_array(v)) {
    if (json_array_size(v) > 4) {
      return bad("stop", "at most 4 sequences");
    }
    size_t i;
    json_t* s;
    json_array_foreach(v, i, s) {
      if (!json_is_string(s) || json_string_length(s) == 0 ||
          json_string_length(s) > PCP_STOP_MAX_SEQUENCE_BYTES) {
        return bad("stop", "must hold strings of 1..256 bytes");
      }
      p->stop[p->stop_count++] = json_string_value(s);
    }
  } else if (v && !json_is_null(v)) {
    return bad("stop", "must be a string or an array of strings");
  }
  v = json_object_get(b, "user");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v) ||
        json_string_length(v) > PCP_INFER_MAX_MODEL_NAME) {
      return bad("user", "must be a string of at most 128 bytes");
    }
    p->user = json_string_value(v);
  }
  // Chat: `logprobs` a boolean and `top_logprobs` 0..20 beside it.
  // Completions: OpenAI's legacy integer `logprobs` (the top count; 0..20
  // here, 5 at OpenAI), or `true` with `top_logprobs` as chat has it.
  v = json_object_get(b, "logprobs");
  if (v && !json_is_null(v)) {
    if (json_is_boolean(v)) {
      p->logprobs = json_is_true(v);
    } else if (!chat && json_is_integer(v) && json_integer_value(v) >= 0 &&
               json_integer_value(v) <= PCP_SAMPLER_MAX_TOP_LOGPROBS) {
      p->logprobs = true;
      p->top_logprobs = json_integer_value(v);
    } else {
      return bad("logprobs", chat ? "must be a boolean"
                                  : "must be a boolean or an integer 0..20");
    }
  }
  v = json_object_get(b, "top_logprobs");
  if (v && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > PCP_SAMPLER_MAX_TOP_LOGPROBS) {
      return bad("top_logprobs", "must be an integer 0..20");
    }
    if (!p->logprobs) {
      return bad("top_logprobs", "needs 'logprobs' set to true");
    }
    p->top_logprobs = json_integer_value(v);
  }
  for (const char* const* k =
           (const char* const[]){"echo", "suffix", "tools", "functions", NULL};
       *k; ++k) {
    json_t* x = json_object_get(b, *k);
    if (x && !json_is_null(x) && !json_is_false(x) &&
        !(json_is_array(x) && json_array_size(x) == 0)) {
      return bad(*k, "is not supported by this server");
    }
  }
  if (!chat) {
    v = json_object_get(b, "prompt");
    if (json_is_array(v) && json_array_size(v) == 1) {
      v = json_array_get(v, 0);
    }
    if (!json_is_string(v)) {
      return bad("prompt", "must be a string (or an array of one string)");
    }
    if (json_string_length(v) > PCP_INFER_MAX_PROMPT_BYTES) {
      return bad("prompt", "longer than 1 MiB");
    }
    p->prompt =
        pcp_make_string_view(json_string_value(v), json_string_length(v));
    return pcp_ok_status();
  }
  v = json_object_get(b, "messages");
  if (!json_is_array(v) || json_array_size(v) == 0) {
    return bad("messages", "must be a non-empty array of messages");
  }
  if (json_array_size(v) > PCP_INFER_MAX_MESSAGES) {
    return bad("messages", "at most 1024 messages");
  }
  p->message_count = json_array_size(v);
  void* messages = NULL;
  void* builders = NULL;
  pcp_status_t messages_status = pcp_allocator_calloc(
      allocator, p->message_count * sizeof(*p->messages), &messages);
  if (!messages_status) {
    messages_status = pcp_allocator_calloc(
        allocator, p->message_count * sizeof(*p->builders), &builders);
  }
  p->messages = messages;
  p->builders = builders;
  if (messages_status) {
    pcp_status_ignore(messages_status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "messages");
  }
  p->builder_count = p->message_count;
  for (size_t i = 0; i < p->builder_count; ++i) {
    pcp_string_builder_initialize(pcp_allocator_system(),
                                  PCP_INFER_MAX_PROMPT_BYTES, &p->builders[i]);
  }
  size_t total = 0;
  for (size_t i = 0; i < p->message_count; ++i) {
    json_t* m = json_array_get(v, i);
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!json_is_object(m)) {
      return bad(param, "must be an object with 'role' and 'content'");
    }
    json_t* role = json_object_get(m, "role");
    snprintf(param, sizeof(param), "messages[%zu].role", i);
    if (!json_is_string(role)) {
      return bad(param, "must be one of 'system', 'user', 'assistant'");
    }
    const char* r = json_string_value(role);
    if (strcmp(r, "developer") == 0) {
      r = "system";  // OpenAI's newer name for the system role
    }
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 &&
        strcmp(r, "assistant") != 0) {
      return bad(param, "must be one of 'system', 'user', 'assistant'");
    }
    p->messages[i].role = pcp_make_cstring_view(r);
    json_t* content = json_object_get(m, "content");
    if (!content) {
      snprintf(param, sizeof(param), "messages[%zu].content", i);
      return bad(param, "is required");
    }
    PCP_RETURN_IF_ERROR_BARE(
        content_parse(content, i, &p->builders[i], &p->messages[i].content));
    total += p->messages[i].content.size;
  }
  if (total > PCP_INFER_MAX_PROMPT_BYTES) {
    return bad("messages", "longer than 1 MiB in all");
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Calls
//===----------------------------------------------------------------------===//

typedef struct call_t {
  pcp_allocator_t allocator;  // the call itself
  bool chat;
  bool stream;
  bool include_usage;
  char id[48];
  char model[PCP_INFER_MAX_MODEL_NAME + 1];
  int64_t created;
  int64_t prompt_tokens;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pcp_http_sse_stream_t* sse;  // streaming
  bool gone;                   // the stream could not be written
  // Not streamed: the text and the outcome.
  pcp_string_builder_t text;
  // `logprobs`: the entries of the tokens not yet sent (streamed) or all of
  // them (not streamed), chat's shape; |text_offset| counts their bytes
  // for the legacy completions shape.
  bool logprobs;
  json_t* tokens;
  int64_t text_offset;
  bool done;
  pcp_infer_result_t result;
  char error_text[512];
  pcp_status_code_t error_code;
} call_t;

static void call_free(call_t* c) {
  json_decref(c->tokens);
  pcp_string_builder_deinitialize(&c->text);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  pcp_allocator_free(c->allocator, c);
}

static json_t* usage_json(const call_t* c, const pcp_infer_result_t* r) {
  json_t* u = json_pack(
      "{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)r->prompt_tokens,
      "completion_tokens", (json_int_t)r->completion_tokens, "total_tokens",
      (json_int_t)r->prompt_tokens + (json_int_t)r->completion_tokens);
  if (u && c->chat) {
    json_object_set_new(
        u, "prompt_tokens_details",
        json_pack("{s:I}", "cached_tokens", (json_int_t)r->cached_tokens));
  }
  return u;
}

// A token's text for `token`: its bytes when they are UTF-8, else OpenAI's
// "bytes:\xNN..." form (a byte-level token may hold part of a character).
static json_t* token_string(pcp_string_view_t bytes) {
  json_t* text = json_stringn(bytes.data, bytes.size);
  if (text) {
    return text;
  }
  char buffer[6 + 4 * 64 + 1] = "bytes:";
  size_t at = 6;
  for (size_t i = 0; i < bytes.size && at + 5 <= sizeof(buffer); ++i) {
    at += (size_t)snprintf(buffer + at, sizeof(buffer) - at, "\\x%02x",
                           (unsigned)(uint8_t)bytes.data[i]);
  }
  return json_string(buffer);
}

static json_t* bytes_json(pcp_string_view_t bytes) {
  json_t* list = json_array();
  for (size_t i = 0; list && i < bytes.size; ++i) {
    json_array_append_new(list, json_integer((uint8_t)bytes.data[i]));
  }
  return list;
}

// One entry of chat's logprobs.content[].
static json_t* token_json(const pcp_infer_token_t* t) {
  return json_pack("{s:o, s:f, s:o}", "token", token_string(t->bytes),
                   "logprob", (double)t->logprob, "bytes",
                   bytes_json(t->bytes));
}

// Takes the pending entries (NULL: none asked for) as a choice's
// `logprobs`: chat's {content: [...], refusal: null}, or the legacy
// completions shape {tokens, token_logprobs, top_logprobs, text_offset}.
static json_t* logprobs_take(call_t* c) {
  if (!c->logprobs) {
    return json_null();
  }
  json_t* entries = c->tokens ? c->tokens : json_array();
  c->tokens = NULL;
  if (c->chat) {
    return json_pack("{s:o, s:n}", "content", entries, "refusal");
  }
  json_t* tokens = json_array();
  json_t* logprobs = json_array();
  json_t* tops = json_array();
  json_t* offsets = json_array();
  size_t i;
  json_t* e;
  json_array_foreach(entries, i, e) {
    json_array_append(tokens, json_object_get(e, "token"));
    json_array_append(logprobs, json_object_get(e, "logprob"));
    json_t* top = json_object();
    size_t j;
    json_t* t;
    json_array_foreach(json_object_get(e, "top_logprobs"), j, t) {
      // setn: a token may hold a NUL byte (json_string_length counts it).
      json_t* key = json_object_get(t, "token");
      json_object_setn(top, json_string_value(key), json_string_length(key),
                       json_object_get(t, "logprob"));
    }
    json_array_append_new(tops, top);
    json_array_append_new(offsets, json_integer(c->text_offset));
    c->text_offset += (int64_t)json_array_size(json_object_get(e, "bytes"));
  }
  json_decref(entries);
  return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs",
                   logprobs, "top_logprobs", tops, "text_offset", offsets);
}

// A chunk object with one choice: |delta_text| (NULL: none), |role| in the
// delta, |finish| (NULL: null).
static json_t* chunk_json(call_t* c, const char* text, size_t length, bool role,
                          const char* finish) {
  json_t* choice;
  if (c->chat) {
    json_t* delta = json_object();
    if (role) {
      json_object_set_new(delta, "role", json_string("assistant"));
    }
    if (text) {
      json_object_set_new(delta, "content", json_stringn(text, length));
    }
    choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta,
                       "logprobs", logprobs_take(c), "finish_reason",
                       finish ? json_string(finish) : json_null());
  } else {
    choice =
        json_pack("{s:o, s:i, s:o, s:o}", "text",
                  json_stringn(text ? text : "", text ? length : 0), "index", 0,
                  "logprobs", logprobs_take(c), "finish_reason",
                  finish ? json_string(finish) : json_null());
  }
  json_t* chunk =
      json_pack("{s:s, s:s, s:I, s:s, s:n, s:[o]}", "id", c->id, "object",
                c->chat ? "chat.completion.chunk" : "text_completion",
                "created", (json_int_t)c->created, "model", c->model,
                "system_fingerprint", "choices", choice);
  if (chunk && c->include_usage) {
    json_object_set_new(chunk, "usage", json_null());
  }
  return chunk;
}

// Mutex held. Writes one "data: <json>" event; marks the call gone when the
// client cannot be written to.
static void sse_json(call_t* c, json_t* value) {
  char* text = value ? json_dumps(value, JSON_COMPACT) : NULL;
  json_decref(value);
  if (!text || c->gone) {
    pcp_libc_free(text);
    return;
  }
  pcp_status_t status = pcp_http_sse_stream_send(c->sse, NULL, NULL, text);
  pcp_libc_free(text);
  if (status) {
    pcp_status_ignore(status);
    c->gone = true;
  }
}

// Collects the token's entry; the next text (or the end) carries it.
static bool on_token(void* user_data, const pcp_infer_token_t* token,
                     const pcp_infer_token_t* top, size_t top_count) {
  call_t* c = user_data;
  pthread_mutex_lock(&c->mu);
  if (!c->tokens) {
    c->tokens = json_array();
  }
  json_t* entry = token_json(token);
  json_t* list = json_array();
  for (size_t i = 0; list && i < top_count; ++i) {
    json_array_append_new(list, token_json(&top[i]));
  }
  bool keep = c->tokens && entry && list && !c->gone;
  if (entry) {
    json_object_set_new(entry, "top_logprobs", list);
    json_array_append_new(c->tokens, entry);
  } else {
    json_decref(list);
  }
  pthread_mutex_unlock(&c->mu);
  return keep;
}

static bool on_text(void* user_data, const char* text, size_t length) {
  call_t* c = user_data;
  pthread_mutex_lock(&c->mu);
  bool keep = true;
  if (c->stream) {
    if (!c->sse || !pcp_http_sse_stream_is_open(c->sse)) {
      c->gone = true;
    }
    if (!c->gone) {
      sse_json(c, chunk_json(c, text, length, false, NULL));
    }
    keep = !c->gone;
  } else {
    pcp_status_t status =
        pcp_string_builder_append(&c->text, pcp_make_string_view(text, length));
    // |gone|: the handler saw the client close its connection.
    keep = status == 0 && !c->gone;
    pcp_status_ignore(status);
  }
  pthread_mutex_unlock(&c->mu);
  return keep;
}

static void on_done(void* user_data, const pcp_infer_result_t* result) {
  call_t* c = user_data;
  pthread_mutex_lock(&c->mu);
  if (!c->stream) {
    c->result = *result;
    c->result.status = pcp_ok_status();
    if (result->status) {
      c->error_code = pcp_status_code(result->status);
      snprintf(c->error_text, sizeof(c->error_text), "%s",
               pcp_status_message(result->status));
    }
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return;  // the handler frees the call
  }
  if (c->sse && !c->gone) {
    if (result->status) {
      // Mid-stream error: an error event as OpenAI sends one.
      int http = 500;
      sse_json(c, status_error_json(result->status, &http));
    } else {
      sse_json(c, chunk_json(c, NULL, 0, false,
                             pcp_finish_reason_name(result->finish_reason)));
      if (c->include_usage) {
        json_t* chunk = chunk_json(c, NULL, 0, false, NULL);
        if (chunk) {
          json_object_set_new(chunk, "choices", json_array());
          json_object_set_new(chunk, "usage", usage_json(c, result));
        }
        sse_json(c, chunk);
      }
    }
    if (!c->gone) {
      pcp_status_ignore(pcp_http_sse_stream_send(c->sse, NULL, NULL, "[DONE]"));
    }
  }
  pcp_http_sse_stream_t* sse = c->sse;
  c->sse = NULL;
  c->done = true;
  pthread_mutex_unlock(&c->mu);
  if (sse) {
    pcp_http_sse_stream_close(sse);
    pcp_http_sse_stream_release(sse);
  }
  call_free(c);
}

static pcp_status_t complete(pcp_services_t* svc,
                             const pcp_http_request_t* request,
                             pcp_http_response_t* response, bool chat) {
  parsed_t p;
  pcp_status_t status = parse(svc->allocator, request, chat, &p);
  call_t* c = NULL;
  if (!status) {
    void* memory = NULL;
    pcp_status_t allocated =
        pcp_allocator_calloc(svc->allocator, sizeof(*c), &memory);
    if (allocated) {
      pcp_status_ignore(allocated);
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "request");
    } else {
      c = memory;
      c->allocator = svc->allocator;
    }
  }
  if (!status && !p.stream) {
    if (atomic_fetch_add(&g_blocking, 1) >= g_max_blocking) {
      atomic_fetch_sub(&g_blocking, 1);
      status = pcp_make_status(
          PCP_STATUS_RESOURCE_EXHAUSTED,
          "too many requests without streaming at once (%d); retry later or "
          "stream",
          g_max_blocking);
      pcp_allocator_free(svc->allocator, c);
      c = NULL;
    }
  }
  if (status || !c) {
    parsed_deinitialize(&p);
    return status_error_set(response, status);
  }
  c->chat = chat;
  c->stream = p.stream;
  c->include_usage = p.include_usage;
  c->logprobs = p.logprobs;
  c->created = pcp_clock_wall_ns(pcp_clock_system()) / 1000000000;
  snprintf(c->id, sizeof(c->id), "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl",
           (unsigned long long)c->created,
           (unsigned long long)atomic_fetch_add(&g_sequence, 1));
  snprintf(c->model, sizeof(c->model), "%s", p.model);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &c->text);

  const char* session = pcp_http_request_header(request, "X-Session-Id");
  if (!session || !session[0] || strlen(session) > PCP_INFER_MAX_MODEL_NAME) {
    session = p.user;
  }
  pcp_infer_request_params_t params = {
      .model = p.model,
      .chat = chat,
      .messages = p.messages,
      .message_count = p.message_count,
      .prompt = p.prompt,
      .sampling = p.sampling,
      .max_tokens = p.max_tokens,
      .stop = p.stop,
      .stop_count = p.stop_count,
      .session_key = session,
      .on_text = on_text,
      .on_done = on_done,
      .user_data = c,
      .on_token = p.logprobs ? on_token : NULL,
      .top_logprobs = (uint32_t)p.top_logprobs,
  };
  // Held across submit and the stream's start, so that the first text
  // callback finds the stream (or learns that it could not start).
  pthread_mutex_lock(&c->mu);
  status = pcp_infer_request_submit(svc->infer, &params, &c->prompt_tokens);
  parsed_deinitialize(&p);
  if (status) {
    pthread_mutex_unlock(&c->mu);
    if (!c->stream) {
      atomic_fetch_sub(&g_blocking, 1);
    }
    call_free(c);
    return status_error_set(response, status);
  }
  if (c->stream) {
    status = pcp_http_response_sse_start(response, 0, &c->sse);
    if (status) {
      c->gone = true;  // the engine stops at the next token
    } else {
      // OpenAI's first chunk: the role, empty content.
      if (chat) {
        sse_json(c, chunk_json(c, "", 0, true, NULL));
      }
    }
    pthread_mutex_unlock(&c->mu);
    return status;
  }
  // Wait for the end, looking at the connection every 20 ms (one recv
  // peek; a decode step of a small model is ~1 ms): a client that gives up
  // (closes) stops the generation at its next token instead of holding a
  // slot until max_tokens.
  while (!c->done) {
    struct timespec deadline = pcp_realtime_deadline_ms(20);
    pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    if (!c->done && !c->gone && pcp_http_request_client_gone(request)) {
      c->gone = true;
    }
  }
  bool gone = c->gone;
  pthread_mutex_unlock(&c->mu);
  atomic_fetch_sub(&g_blocking, 1);
  if (gone) {
    call_free(c);
    return pcp_make_status(PCP_STATUS_CANCELLED,
                           "the client closed the connection");
  }
  if (c->error_code) {
    pcp_status_t error = pcp_make_status(c->error_code, "%s", c->error_text);
    call_free(c);
    return status_error_set(response, error);
  }
  const char* finish = pcp_finish_reason_name(c->result.finish_reason);
  json_t* choice;
  json_t* text = json_stringn(c->text.data ? c->text.data : "", c->text.size);
  if (chat) {
    choice =
        json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", 0, "message",
                  "role", "assistant", "content", text, "refusal", "logprobs",
                  logprobs_take(c), "finish_reason", finish ? finish : "stop");
  } else {
    choice =
        json_pack("{s:o, s:i, s:o, s:s}", "text", text, "index", 0, "logprobs",
                  logprobs_take(c), "finish_reason", finish ? finish : "stop");
  }
  json_t* body =
      json_pack("{s:s, s:s, s:I, s:s, s:n, s:[o], s:o}", "id", c->id, "object",
                chat ? "chat.completion" : "text_completion", "created",
                (json_int_t)c->created, "model", c->model, "system_fingerprint",
                "choices", choice, "usage", usage_json(c, &c->result));
  call_free(c);
  return pcp_http_response_json_take(response, 200, body);
}

pcp_status_t pcp_services_openai_chat_completions_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  return complete(user_data, request, response, true);
}

pcp_status_t pcp_services_openai_completions_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  return complete(user_data, request, response, false);
}

void pcp_services_openai_limits_reset(void) {
  g_max_blocking = PCP_SERVICES_OPENAI_MAX_BLOCKING;
  const char* cap = getenv("PCP_GATEWAY_TEST_INFER_MAX_BLOCKING");
  if (cap) {
    long value = strtol(cap, NULL, 10);
    if (value >= 1 && value < PCP_SERVICES_OPENAI_MAX_BLOCKING) {
      g_max_blocking = (int)value;
    }
  }
}
