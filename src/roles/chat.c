// SPDX-License-Identifier: Apache-2.0
//
// `pcp chat [PROMPT...]`: a terminal client for any OpenAI-compatible chat
// service (the gateway's /v1/chat/completions first of all). With a prompt
// it asks once and prints the reply as it streams; without one it reads
// lines from stdin and keeps the conversation (every request carries the
// whole history, as the API is stateless; --session names it for the
// server's KV-cache reuse).
//
// Written against the public wire format, not the gateway's code: SSE
// `data: {chunk}` lines with choices[0].delta.content, a chunk with
// finish_reason, an optional usage chunk (stream_options.include_usage),
// `data: [DONE]`, and errors as {"error":{"message",...}} bodies or
// mid-stream `data: {"error":...}` events. Anything else is a clear error:
// a stream that ends before [DONE] is not a reply, even if text came.
//
// Every input is bounded: a stdin line (64 KiB), the prompt argument
// (256 KiB), a reply (256 KiB), an SSE line (64 KiB), an error body
// (64 KiB), a JSON answer (1 MiB) and the history sent (768 KiB, oldest
// turns dropped first, so a long session keeps going).
//
// Ctrl-C: SIGINT only sets a flag (installed without SA_RESTART, so the
// wait it interrupts returns at once); the transfer's progress callback
// sees it and libcurl drops the connection, which stops the generation on
// the server. Mid-reply it returns to the prompt; at the prompt it ends the
// session.
//
// Thread-safety: a CLI entry point, called once from main().

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"
#include "config/config.h"
#include "http/http.h"
#include "roles/roles.h"

#define CHAT_MAX_LINE_BYTES ((size_t)64 << 10)
#define CHAT_MAX_PROMPT_BYTES ((size_t)256 << 10)
#define CHAT_MAX_REPLY_BYTES ((size_t)256 << 10)
#define CHAT_MAX_HISTORY_BYTES ((size_t)768 << 10)
#define CHAT_MAX_SSE_LINE_BYTES ((size_t)64 << 10)
#define CHAT_MAX_ERROR_BODY_BYTES ((size_t)64 << 10)
#define CHAT_MAX_JSON_BYTES ((size_t)1 << 20)
#define CHAT_CONNECT_TIMEOUT_MS 10000
#define CHAT_DEFAULT_TOKEN_ENV "PCP_API_TOKEN"

// Exit codes: 0 done, 1 the server or the network failed, 2 usage, 130
// interrupted (the shell's 128 + SIGINT).
#define CHAT_EXIT_FAILED 1
#define CHAT_EXIT_INTERRUPTED 130

//===----------------------------------------------------------------------===//
// Flags
//===----------------------------------------------------------------------===//

typedef struct chat_options_t {
  char* url;
  char* model;
  char* system;
  int64_t max_tokens;  // 0: the server's default
  double temperature;  // < 0: the server's default
  double top_p;        // < 0: the server's default
  int64_t seed;        // < 0: none
  bool no_stream;
  char* api_token_env;  // NULL: PCP_API_TOKEN when set
  char* session;
  bool usage;
  int64_t timeout_s;
  bool help;
} chat_options_t;

#define OFFSET(member) offsetof(chat_options_t, member)

static const pcp_config_field_t kFields[] = {
    {.name = "url",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(url),
     .default_value = "http://127.0.0.1:8000",
     .value_name = "URL",
     .help = "the service's base URL (the gateway's default --api-port; a "
             "trailing /v1 is accepted)"},
    {.name = "model",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(model),
     .value_name = "ID",
     .help = "model id; none: the first of GET /v1/models"},
    {.name = "system",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(system),
     .value_name = "TEXT",
     .help = "system message that opens the conversation"},
    {.name = "max-tokens",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(max_tokens),
     .default_value = "0",
     .min = 0,
     .max = 1 << 20,
     .value_name = "N",
     .help = "most tokens in a reply (0: the server's default)"},
    {.name = "temperature",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(temperature),
     .default_value = "-1",
     .min = -1,
     .max = 2,
     .value_name = "T",
     .help = "sampling temperature in [0, 2], 0 greedy (-1: the server's "
             "default)"},
    {.name = "top-p",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(top_p),
     .default_value = "-1",
     .min = -1,
     .max = 1,
     .value_name = "P",
     .help = "nucleus sampling mass in (0, 1] (-1: the server's default)"},
    {.name = "seed",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(seed),
     .default_value = "-1",
     .min = -1,
     .max = 9007199254740991.0,  // 2^53 - 1: exact in every JSON parser
     .value_name = "N",
     .help = "sampling seed, for repeatable replies (-1: none)"},
    {.name = "no-stream",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(no_stream),
     .help = "ask for the whole reply at once instead of streaming it"},
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .value_name = "NAME",
     .help = "environment variable holding the API bearer token; none: "
             "PCP_API_TOKEN when set, else no token"},
    // One name for a token flag across pcp (the gateway's); the old one
    // answers "renamed to --api-token-env".
    {.name = "api-key-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(api_token_env),
     .flags = PCP_CONFIG_FLAG_RENAMED},
    {.name = "session",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(session),
     .value_name = "ID",
     .help = "session id, sent as `user` so the server reuses its KV cache"},
    {.name = "usage",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(usage),
     .help = "print the token counts of each reply on stderr"},
    {.name = "timeout-s",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(timeout_s),
     .default_value = "300",
     .min = 1,
     .max = 86400,
     .value_name = "N",
     .help = "give up after N s without a byte from the server (with "
             "--no-stream: for the whole reply)"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .flags = PCP_CONFIG_FLAG_CLI_ONLY,
     .help = "print these flags and exit (also -h)"},
};

static pcp_status_t options_validate(const void* config) {
  const chat_options_t* options = config;
  if (options->temperature < 0 && options->temperature != -1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--temperature must be in [0, 2] (or -1)");
  }
  if (options->top_p != -1 && options->top_p <= 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--top-p must be in (0, 1] (or -1)");
  }
  if (!options->url || (strncmp(options->url, "http://", 7) != 0 &&
                        strncmp(options->url, "https://", 8) != 0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--url must start with http:// or https://");
  }
  if (options->model && !options->model[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--model must not be empty");
  }
  return pcp_ok_status();
}

static const pcp_config_table_t kTable = {
    .name = "chat",
    .fields = kFields,
    .field_count = PCP_ARRAYSIZE(kFields),
    .validate = options_validate,
};

static void usage_print(FILE* out) {
  fprintf(out,
          "usage: pcp chat [flags] [PROMPT...]\n\n"
          "Talks to an OpenAI-compatible chat service (the gateway's "
          "/v1/chat/completions).\n"
          "With a PROMPT (the words joined by spaces): asks once, prints the "
          "reply as it\n"
          "streams and exits. Without one: reads lines from stdin and keeps "
          "the conversation;\n"
          "/reset forgets it, /exit or end of input ends it. Ctrl-C stops a "
          "reply (back to\n"
          "the prompt) or, at the prompt, ends the session.\n"
          "Exit codes: 0 done, 1 server or network error, 2 usage error, "
          "130 interrupted.\n\n"
          "flags:\n");
  pcp_config_print_help(&kTable, out);
}

//===----------------------------------------------------------------------===//
// Signals and output
//===----------------------------------------------------------------------===//

static volatile sig_atomic_t g_interrupted = 0;

static void on_sigint(int signal_number) {
  (void)signal_number;
  g_interrupted = 1;
}

static pcp_status_t sigint_install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocked read or poll returns
  if (sigaction(SIGINT, &action, NULL) != 0) {
    return pcp_status_from_errno(errno, "installing the SIGINT handler");
  }
  return pcp_ok_status();
}

typedef struct chat_t {
  const chat_options_t* options;
  pcp_http_client_t* client;
  const char* token;  // borrowed from the environment; NULL: none
  char base_url[2048];
  char* model;  // owned
  bool tty_out;
  json_t* messages;        // the conversation
  size_t first_droppable;  // 1 with a system message, else 0
} chat_t;

// Writes reply text. On a terminal, control bytes other than newline and
// tab become '?': a model's output must not drive the terminal (escape
// sequences can retitle windows or rewrite what is on screen).
static void text_print(const chat_t* chat, const char* text, size_t length) {
  if (!chat->tty_out) {
    fwrite(text, 1, length, stdout);
  } else {
    for (size_t i = 0; i < length; ++i) {
      unsigned char c = (unsigned char)text[i];
      bool control = (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f;
      fputc(control ? '?' : c, stdout);
    }
  }
  fflush(stdout);
}

static void usage_line_print(json_t* usage) {
  if (!json_is_object(usage)) {
    fprintf(stderr, "[usage] not reported by the server\n");
    return;
  }
  fprintf(
      stderr,
      "[usage] prompt_tokens=%lld completion_tokens=%lld "
      "total_tokens=%lld\n",
      (long long)json_integer_value(json_object_get(usage, "prompt_tokens")),
      (long long)json_integer_value(
          json_object_get(usage, "completion_tokens")),
      (long long)json_integer_value(json_object_get(usage, "total_tokens")));
}

// The server's error text from an OpenAI-style body ({"error":{"message",
// "type","code"}}, the gateway's {"error":{"code","message"}} too), else the
// body itself, cut and with control bytes dropped.
static void error_text_format(const char* body, size_t length, char* out,
                              size_t capacity) {
  if (!body) {
    body = "";
    length = 0;
  }
  json_t* json = json_loadb(body, length, 0, NULL);
  json_t* error = json_object_get(json, "error");
  const char* message = json_string_value(json_object_get(error, "message"));
  if (!message) {
    message = json_string_value(error);  // {"error": "text"}
  }
  if (message) {
    const char* type = json_string_value(json_object_get(error, "type"));
    json_t* code_json = json_object_get(error, "code");
    const char* code = json_string_value(code_json);
    char code_text[32] = "";
    if (!code && json_is_integer(code_json)) {
      snprintf(code_text, sizeof(code_text), "%lld",
               (long long)json_integer_value(code_json));
      code = code_text;
    }
    if (type && code && strcmp(type, code) != 0) {
      snprintf(out, capacity, "%s (%s, %s)", message, type, code);
    } else if (type || code) {
      snprintf(out, capacity, "%s (%s)", message, type ? type : code);
    } else {
      snprintf(out, capacity, "%s", message);
    }
  } else {
    size_t n = 0;
    for (size_t i = 0; i < length && n + 1 < capacity && n < 200; ++i) {
      unsigned char c = (unsigned char)body[i];
      out[n++] = c < 0x20 || c == 0x7f ? (char)0x20 : body[i];
    }
    if (capacity > 0) {
      out[n] = '\0';
    }
    if (n == 0) {
      snprintf(out, capacity, "(empty body)");
    }
  }
  json_decref(json);
}

//===----------------------------------------------------------------------===//
// One request
//===----------------------------------------------------------------------===//

typedef struct turn_t {
  chat_t* chat;
  bool streaming;
  int http_status;
  bool error_mode;  // a non-2xx answer: collect the body as the message
  pcp_string_builder_t body;   // error body, or the JSON answer
  pcp_string_builder_t reply;  // the assistant's text so far
  pcp_http_sse_parser_t parser;
  bool done;  // data: [DONE] seen
  char finish_reason[32];
  json_t* usage;         // owned; NULL until reported
  pcp_status_t failure;  // the first failure found inside a callback
} turn_t;

static pcp_status_t turn_fail(turn_t* turn, pcp_status_t status) {
  if (!turn->failure) {
    turn->failure = status;
  } else {
    pcp_status_ignore(status);
  }
  return pcp_make_status(PCP_STATUS_ABORTED, "stop");
}

static pcp_status_t reply_append(turn_t* turn, const char* text,
                                 size_t length) {
  pcp_status_t status = pcp_string_builder_append(
      &turn->reply, pcp_make_string_view(text, length));
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "the reply passed %zu KiB; stopped",
                           CHAT_MAX_REPLY_BYTES >> 10);
  }
  text_print(turn->chat, text, length);
  return pcp_ok_status();
}

static void finish_reason_keep(turn_t* turn, json_t* choice) {
  const char* reason =
      json_string_value(json_object_get(choice, "finish_reason"));
  if (reason) {
    snprintf(turn->finish_reason, sizeof(turn->finish_reason), "%s", reason);
  }
}

static void usage_keep(turn_t* turn, json_t* object) {
  json_t* usage = json_object_get(object, "usage");
  if (json_is_object(usage)) {
    json_decref(turn->usage);
    turn->usage = json_incref(usage);
  }
}

// The message of a mid-stream or body error object.
static pcp_status_t server_error(const char* where, const char* data,
                                 size_t length) {
  char text[1024];
  error_text_format(data, length, text, sizeof(text));
  return pcp_make_status(PCP_STATUS_UNAVAILABLE, "%s: %s", where, text);
}

static pcp_status_t on_event(void* user_data,
                             const pcp_http_sse_event_t* event) {
  turn_t* turn = user_data;
  if (turn->done) {
    return pcp_ok_status();  // nothing after [DONE] is part of the reply
  }
  if (strcmp(event->data, "[DONE]") == 0) {
    turn->done = true;
    return pcp_ok_status();
  }
  if (strcmp(event->type, "error") == 0) {
    return turn_fail(turn, server_error("server error mid-stream", event->data,
                                        event->data_length));
  }
  json_error_t json_error;
  json_t* chunk =
      json_loadb(event->data, event->data_length, JSON_ALLOW_NUL, &json_error);
  if (!json_is_object(chunk)) {
    json_decref(chunk);
    return turn_fail(
        turn, pcp_make_status(PCP_STATUS_DATA_LOSS,
                              "malformed stream event (not a JSON object): "
                              "%.80s",
                              event->data));
  }
  pcp_status_t status = pcp_ok_status();
  json_t* choices = json_object_get(chunk, "choices");
  if (json_object_get(chunk, "error")) {
    status = server_error("server error mid-stream", event->data,
                          event->data_length);
  } else if (choices && !json_is_array(choices)) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "malformed stream chunk: 'choices' is not a list");
  } else if (json_array_size(choices) > 0) {
    json_t* choice = json_array_get(choices, 0);
    json_t* content =
        json_object_get(json_object_get(choice, "delta"), "content");
    if (content && !json_is_string(content) && !json_is_null(content)) {
      status = pcp_make_status(
          PCP_STATUS_DATA_LOSS,
          "malformed stream chunk: delta.content is not a string");
    } else if (json_is_string(content)) {
      status = reply_append(turn, json_string_value(content),
                            json_string_length(content));
    }
    finish_reason_keep(turn, choice);
  }
  if (!status) {
    usage_keep(turn, chunk);
  }
  json_decref(chunk);
  return status ? turn_fail(turn, status) : pcp_ok_status();
}

static bool header_starts_with(const char* headers, const char* name,
                               const char* prefix) {
  pcp_http_client_response_t view = {.headers = (char*)headers};
  char value[256];
  return pcp_http_client_response_header(&view, name, value, sizeof(value)) &&
         strncasecmp(value, prefix, strlen(prefix)) == 0;
}

static bool on_head(void* user_data, int http_status, const char* headers) {
  turn_t* turn = user_data;
  turn->http_status = http_status;
  if (http_status < 200 || http_status >= 300) {
    turn->error_mode = true;
    return true;
  }
  if (turn->streaming &&
      !header_starts_with(headers, "Content-Type", "text/event-stream")) {
    char type[128] = "none";
    pcp_http_client_response_t view = {.headers = (char*)headers};
    pcp_http_client_response_header(&view, "Content-Type", type, sizeof(type));
    pcp_status_ignore(turn_fail(
        turn, pcp_make_status(PCP_STATUS_DATA_LOSS,
                              "expected a text/event-stream answer, got "
                              "Content-Type '%s'",
                              type)));
    return false;
  }
  return true;
}

static bool on_body(void* user_data, const char* data, size_t length) {
  turn_t* turn = user_data;
  if (turn->error_mode) {
    // Enough of an error body to show; the rest is not read.
    size_t room = CHAT_MAX_ERROR_BODY_BYTES - turn->body.size;
    pcp_status_t status = pcp_string_builder_append(
        &turn->body, pcp_make_string_view(data, length < room ? length : room));
    pcp_status_ignore(status);
    return length < room;
  }
  if (!turn->streaming) {
    pcp_status_t status = pcp_string_builder_append(
        &turn->body, pcp_make_string_view(data, length));
    if (status) {
      pcp_status_ignore(status);
      pcp_status_ignore(
          turn_fail(turn, pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                          "the answer passed %zu KiB",
                                          CHAT_MAX_JSON_BYTES >> 10)));
      return false;
    }
    return true;
  }
  pcp_status_t status = pcp_http_sse_parser_feed(&turn->parser, data, length);
  if (status) {
    if (pcp_status_code(status) == PCP_STATUS_ABORTED) {
      pcp_status_ignore(status);  // on_event already kept the reason
    } else {
      pcp_status_ignore(turn_fail(turn, status));
    }
    return false;
  }
  return true;
}

static bool should_stop(void* user_data) {
  (void)user_data;
  return g_interrupted != 0;
}

static void turn_initialize(chat_t* chat, bool streaming, turn_t* out_turn) {
  memset(out_turn, 0, sizeof(*out_turn));
  out_turn->chat = chat;
  out_turn->streaming = streaming;
  pcp_string_builder_initialize(pcp_allocator_system(), CHAT_MAX_JSON_BYTES,
                                &out_turn->body);
  pcp_string_builder_initialize(pcp_allocator_system(), CHAT_MAX_REPLY_BYTES,
                                &out_turn->reply);
  pcp_http_sse_parser_initialize(CHAT_MAX_SSE_LINE_BYTES, CHAT_MAX_JSON_BYTES,
                                 on_event, out_turn, &out_turn->parser);
}

static void turn_deinitialize(turn_t* turn) {
  pcp_string_builder_deinitialize(&turn->body);
  pcp_string_builder_deinitialize(&turn->reply);
  pcp_http_sse_parser_deinitialize(&turn->parser);
  json_decref(turn->usage);
  pcp_status_ignore(turn->failure);
}

// Turns a finished non-stream answer into the reply.
static pcp_status_t answer_parse(turn_t* turn) {
  json_error_t json_error;
  json_t* answer = json_loadb(pcp_string_builder_cstring(&turn->body),
                              turn->body.size, JSON_ALLOW_NUL, &json_error);
  json_t* choice = json_array_get(json_object_get(answer, "choices"), 0);
  json_t* content =
      json_object_get(json_object_get(choice, "message"), "content");
  pcp_status_t status = pcp_ok_status();
  if (!answer) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS, "the answer is not JSON: %s",
                             json_error.text);
  } else if (json_object_get(answer, "error")) {
    status = server_error("server error", turn->body.data, turn->body.size);
  } else if (!json_is_string(content) && !json_is_null(content)) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "malformed answer: no choices[0].message.content");
  } else {
    if (json_is_string(content)) {
      status = reply_append(turn, json_string_value(content),
                            json_string_length(content));
    }
    finish_reason_keep(turn, choice);
    usage_keep(turn, answer);
  }
  json_decref(answer);
  return status;
}

// Sends |body| (a chat.completions request) and prints the reply as it
// arrives. CANCELLED after Ctrl-C; the reply so far is in turn->reply.
static pcp_status_t turn_run(turn_t* turn, const char* body) {
  chat_t* chat = turn->chat;
  char url[2100];
  snprintf(url, sizeof(url), "%s/v1/chat/completions", chat->base_url);
  const char* headers[] = {"Content-Type: application/json",
                           turn->streaming ? "Accept: text/event-stream"
                                           : "Accept: application/json",
                           NULL};
  pcp_http_client_request_t request = {
      .method = "POST",
      .url = url,
      .headers = headers,
      .bearer_token = chat->token,
      .body = body,
      .body_length = strlen(body),
  };
  pcp_http_client_stream_t stream = {
      .on_head = on_head,
      .on_body = on_body,
      .should_stop = should_stop,
      .user_data = turn,
      .connect_timeout_ms = CHAT_CONNECT_TIMEOUT_MS,
      .idle_timeout_ms = chat->options->timeout_s * 1000,
  };
  int http_status = 0;
  pcp_status_t status =
      pcp_http_client_stream(chat->client, &request, &stream, &http_status);
  if (turn->error_mode) {
    pcp_status_ignore(status);
    char text[1024];
    error_text_format(turn->body.data, turn->body.size, text, sizeof(text));
    return pcp_make_status(
        http_status == 401 || http_status == 403 ? PCP_STATUS_UNAUTHENTICATED
                                                 : PCP_STATUS_UNAVAILABLE,
        "HTTP %d: %s%s", http_status, text,
        http_status == 401 ? " (name the token's variable with --api-token-env)"
                           : "");
  }
  if (turn->failure) {
    pcp_status_ignore(status);
    status = turn->failure;
    turn->failure = pcp_ok_status();
    return status;
  }
  if (status && g_interrupted) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_CANCELLED, "interrupted");
  }
  if (status) {
    char message[1024];
    snprintf(message, sizeof(message), "%s", pcp_status_message(status));
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    if (http_status >= 200 && http_status < 300) {
      return pcp_make_status(code, "the stream broke mid-reply: %s", message);
    }
    if (code == PCP_STATUS_DEADLINE_EXCEEDED) {
      return pcp_make_status(code, "no answer within --timeout-s: %s", message);
    }
    return pcp_make_status(code, "cannot reach the server: %s", message);
  }
  if (!turn->streaming) {
    return answer_parse(turn);
  }
  if (!turn->done) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "the server ended the stream before "
                           "'data: [DONE]'%s",
                           pcp_http_sse_parser_has_partial(&turn->parser)
                               ? " (in the middle of an event)"
                               : "");
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Conversation
//===----------------------------------------------------------------------===//

static size_t json_byte_length(json_t* value) {
  return json_dumpb(value, NULL, 0, JSON_COMPACT);
}

// Drops the oldest turns (never the system message or the newest message)
// until the history fits CHAT_MAX_HISTORY_BYTES. Returns how many messages
// went; RESOURCE_EXHAUSTED when even the newest one alone does not fit.
static pcp_status_t history_trim(chat_t* chat, size_t* out_dropped) {
  *out_dropped = 0;
  while (json_byte_length(chat->messages) > CHAT_MAX_HISTORY_BYTES) {
    if (json_array_size(chat->messages) <= chat->first_droppable + 1) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "the message is over the %zu KiB history limit",
                             CHAT_MAX_HISTORY_BYTES >> 10);
    }
    json_array_remove(chat->messages, chat->first_droppable);
    ++*out_dropped;
  }
  // Keep user/assistant alternation: a history never starts with a reply.
  while (json_array_size(chat->messages) > chat->first_droppable + 1) {
    json_t* first = json_array_get(chat->messages, chat->first_droppable);
    const char* role = json_string_value(json_object_get(first, "role"));
    if (!role || strcmp(role, "assistant") != 0) {
      break;
    }
    json_array_remove(chat->messages, chat->first_droppable);
    ++*out_dropped;
  }
  return pcp_ok_status();
}

static pcp_status_t message_append(json_t* messages, const char* role,
                                   const char* content, size_t length) {
  json_t* message =
      json_pack("{s:s, s:s%}", "role", role, "content", content, length);
  if (!message) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the %s message is not valid UTF-8", role);
  }
  if (json_array_append_new(messages, message) != 0) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  return pcp_ok_status();
}

static char* request_body_build(const chat_t* chat) {
  const chat_options_t* options = chat->options;
  json_t* body = json_pack("{s:s, s:O, s:b}", "model", chat->model, "messages",
                           chat->messages, "stream", !options->no_stream);
  if (!body) {
    return NULL;
  }
  if (!options->no_stream && options->usage) {
    json_object_set_new(body, "stream_options",
                        json_pack("{s:b}", "include_usage", 1));
  }
  if (options->max_tokens > 0) {
    json_object_set_new(body, "max_tokens", json_integer(options->max_tokens));
  }
  if (options->temperature >= 0) {
    json_object_set_new(body, "temperature", json_real(options->temperature));
  }
  if (options->top_p > 0) {
    json_object_set_new(body, "top_p", json_real(options->top_p));
  }
  if (options->seed >= 0) {
    json_object_set_new(body, "seed", json_integer(options->seed));
  }
  if (options->session) {
    json_object_set_new(body, "user", json_string(options->session));
  }
  char* text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  return text;
}

// Asks with the history as it is (its last message the user's) and prints
// the reply. On success and on Ctrl-C with some text, the reply joins the
// history; on failure the user's message leaves it again.
static pcp_status_t chat_ask(chat_t* chat) {
  size_t dropped = 0;
  pcp_status_t status = history_trim(chat, &dropped);
  if (status) {
    json_array_remove(chat->messages, json_array_size(chat->messages) - 1);
    return status;
  }
  if (dropped) {
    fprintf(stderr,
            "[history] dropped the %zu oldest message%s (over %zu "
            "KiB)\n",
            dropped, dropped == 1 ? "" : "s", CHAT_MAX_HISTORY_BYTES >> 10);
  }
  char* body = request_body_build(chat);
  if (!body) {
    json_array_remove(chat->messages, json_array_size(chat->messages) - 1);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building the request");
  }
  turn_t turn;
  turn_initialize(chat, !chat->options->no_stream, &turn);
  status = turn_run(&turn, body);
  pcp_libc_free(body);  // json_dumps
  // The reply ends its line, whatever happened, so a message that follows
  // starts on a line of its own.
  if (turn.reply.size > 0 || !status) {
    if (turn.reply.size == 0 || turn.reply.data[turn.reply.size - 1] != '\n') {
      text_print(chat, "\n", 1);
    }
  }
  bool keep = !status || (pcp_status_code(status) == PCP_STATUS_CANCELLED &&
                          turn.reply.size > 0);
  if (keep) {
    pcp_status_t append_status = message_append(
        chat->messages, "assistant", pcp_string_builder_cstring(&turn.reply),
        turn.reply.size);
    if (append_status) {
      // Text that is not UTF-8 cannot go back to the server: forget the turn.
      pcp_status_ignore(append_status);
      keep = false;
    }
  }
  if (!keep) {
    json_array_remove(chat->messages, json_array_size(chat->messages) - 1);
  }
  if (!status) {
    if (strcmp(turn.finish_reason, "length") == 0) {
      fprintf(stderr, "[reply cut at the token limit]\n");
    }
    if (chat->options->usage) {
      usage_line_print(turn.usage);
    }
  }
  turn_deinitialize(&turn);
  return status;
}

// GET /v1/models: the first model's id.
static pcp_status_t model_resolve(chat_t* chat) {
  char url[2100];
  snprintf(url, sizeof(url), "%s/v1/models", chat->base_url);
  pcp_http_client_request_t request = {.url = url, .bearer_token = chat->token};
  pcp_http_client_response_t response;
  pcp_status_t status = pcp_http_client_send(chat->client, &request, &response);
  if (status) {
    char message[1024];
    snprintf(message, sizeof(message), "%s", pcp_status_message(status));
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    return pcp_make_status(code, "cannot reach the server: %s", message);
  }
  if (response.http_status != 200) {
    char text[1024];
    error_text_format(response.body, response.body_length, text, sizeof(text));
    status = pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "GET /v1/models: HTTP %d: %s%s",
        response.http_status, text,
        response.http_status == 401 ? " (name the token's variable with "
                                      "--api-token-env)"
                                    : "");
    pcp_http_client_response_deinitialize(&response);
    return status;
  }
  json_t* list = json_loadb(response.body, response.body_length, 0, NULL);
  pcp_http_client_response_deinitialize(&response);
  const char* id = json_string_value(
      json_object_get(json_array_get(json_object_get(list, "data"), 0), "id"));
  if (!id || !id[0]) {
    status = pcp_make_status(
        PCP_STATUS_UNAVAILABLE,
        json_is_array(json_object_get(list, "data"))
            ? "GET /v1/models lists no model; name one with --model"
            : "GET /v1/models: malformed answer (no data[0].id)");
  } else {
    status = pcp_allocator_strdup(pcp_allocator_system(), id, &chat->model);
  }
  json_decref(list);
  return status;
}

//===----------------------------------------------------------------------===//
// Interactive loop
//===----------------------------------------------------------------------===//

typedef enum line_result_e {
  LINE_OK = 0,
  LINE_EOF = 1,
  LINE_INTERRUPTED = 2,
  LINE_TOO_LONG = 3,
  LINE_ERROR = 4,
} line_result_t;

// Buffered line reads on a file descriptor (not stdio: a SIGINT must end a
// blocked read, and stdio would retry it or leave its error flag set).
typedef struct line_reader_t {
  int fd;
  char buffer[8192];
  size_t start;
  size_t end;
  bool eof;
} line_reader_t;

static line_result_t line_read(line_reader_t* reader,
                               pcp_string_builder_t* line) {
  pcp_string_builder_reset(line);
  bool too_long = false;
  for (;;) {
    if (reader->start == reader->end) {
      if (reader->eof) {
        if (too_long) {
          return LINE_TOO_LONG;
        }
        return line->size > 0 ? LINE_OK : LINE_EOF;
      }
      ssize_t n = read(reader->fd, reader->buffer, sizeof(reader->buffer));
      if (n < 0) {
        if (errno == EINTR && !g_interrupted) {
          continue;
        }
        return errno == EINTR ? LINE_INTERRUPTED : LINE_ERROR;
      }
      reader->start = 0;
      reader->end = (size_t)n;
      reader->eof = n == 0;
      continue;
    }
    char* begin = reader->buffer + reader->start;
    size_t available = reader->end - reader->start;
    char* newline = memchr(begin, '\n', available);
    size_t take = newline ? (size_t)(newline - begin) : available;
    if (!too_long) {
      pcp_status_t status =
          pcp_string_builder_append(line, pcp_make_string_view(begin, take));
      if (status) {
        pcp_status_ignore(status);
        too_long = true;  // read on to the end of the line, keeping nothing
        pcp_string_builder_reset(line);
      }
    }
    reader->start += take + (newline ? 1 : 0);
    if (newline) {
      if (too_long) {
        return LINE_TOO_LONG;
      }
      if (line->size > 0 && line->data[line->size - 1] == '\r') {
        line->data[--line->size] = '\0';
      }
      return LINE_OK;
    }
  }
}

static void history_reset(chat_t* chat) {
  while (json_array_size(chat->messages) > chat->first_droppable) {
    json_array_remove(chat->messages, chat->first_droppable);
  }
}

static void status_print(pcp_status_t status) {
  char message[2048];
  pcp_status_format_for_user(status, message, sizeof(message));
  fprintf(stderr, "pcp chat: %s\n", message);
}

static int chat_interactive(chat_t* chat) {
  bool tty_in = isatty(STDIN_FILENO) != 0;
  line_reader_t* reader = NULL;
  pcp_status_t alloc_status = pcp_allocator_calloc(
      pcp_allocator_system(), sizeof(*reader), (void**)&reader);
  if (alloc_status) {
    pcp_status_ignore(alloc_status);
    fprintf(stderr, "pcp chat: out of memory\n");
    return CHAT_EXIT_FAILED;
  }
  reader->fd = STDIN_FILENO;
  pcp_string_builder_t line;
  pcp_string_builder_initialize(pcp_allocator_system(), CHAT_MAX_LINE_BYTES,
                                &line);
  if (tty_in) {
    fprintf(stderr,
            "pcp chat: model %s at %s; /exit or Ctrl-D ends, /reset "
            "forgets\n",
            chat->model, chat->base_url);
  }
  int exit_code = 0;
  for (;;) {
    if (tty_in) {
      fputs("> ", stdout);
      fflush(stdout);
    }
    line_result_t result = line_read(reader, &line);
    if (result == LINE_INTERRUPTED) {
      if (tty_in) {
        fputc('\n', stdout);
      }
      exit_code = CHAT_EXIT_INTERRUPTED;
      break;
    }
    if (result == LINE_EOF) {
      if (tty_in) {
        fputc('\n', stdout);
      }
      break;
    }
    if (result == LINE_ERROR) {
      fprintf(stderr, "pcp chat: reading stdin: %s\n", strerror(errno));
      exit_code = CHAT_EXIT_FAILED;
      break;
    }
    if (result == LINE_TOO_LONG) {
      fprintf(stderr, "pcp chat: line over %zu KiB ignored\n",
              CHAT_MAX_LINE_BYTES >> 10);
      exit_code = CHAT_EXIT_FAILED;
      continue;
    }
    pcp_string_view_t text =
        pcp_string_view_trim(pcp_make_string_view(line.data, line.size));
    if (text.size == 0) {
      continue;
    }
    if (pcp_string_view_equal(text, pcp_make_cstring_view("/exit")) ||
        pcp_string_view_equal(text, pcp_make_cstring_view("/quit"))) {
      break;
    }
    if (pcp_string_view_equal(text, pcp_make_cstring_view("/reset"))) {
      history_reset(chat);
      fprintf(stderr, "[history] cleared\n");
      continue;
    }
    pcp_status_t status =
        message_append(chat->messages, "user", text.data, text.size);
    if (!status) {
      status = chat_ask(chat);
    }
    if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
      fprintf(stderr, "[interrupted]\n");
    } else if (status) {
      status_print(status);
      exit_code = CHAT_EXIT_FAILED;
    }
    pcp_status_ignore(status);
    // A Ctrl-C meant for this reply (even one that came as it ended) must
    // not end the session at the next prompt.
    g_interrupted = 0;
  }
  pcp_string_builder_deinitialize(&line);
  pcp_allocator_free(pcp_allocator_system(), reader);
  return exit_code;
}

//===----------------------------------------------------------------------===//
// Entry
//===----------------------------------------------------------------------===//

// The prompt argument: the positionals joined by single spaces.
static pcp_status_t prompt_join(const pcp_string_list_t* words,
                                pcp_string_builder_t* out_prompt) {
  for (size_t i = 0; i < words->count; ++i) {
    pcp_status_t status = pcp_string_builder_append_f(
        out_prompt, "%s%s", i ? " " : "", words->items[i]);
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "the prompt is over %zu KiB",
                             CHAT_MAX_PROMPT_BYTES >> 10);
    }
  }
  return pcp_ok_status();
}

static int chat_run(chat_t* chat, const pcp_string_builder_t* prompt) {
  pcp_status_t status = pcp_ok_status();
  if (!chat->model) {
    status = model_resolve(chat);
  }
  // Only now: until a reply can be stopped, Ctrl-C simply ends the process.
  if (!status) {
    status = sigint_install();
  }
  if (status) {
    status_print(status);
    pcp_status_ignore(status);
    return CHAT_EXIT_FAILED;
  }
  if (prompt->size == 0) {
    return chat_interactive(chat);
  }
  status = message_append(chat->messages, "user", prompt->data, prompt->size);
  if (status) {
    return pcp_config_cli_usage_error("chat", status);
  }
  status = chat_ask(chat);
  int exit_code = 0;
  if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
    fprintf(stderr, "[interrupted]\n");
    exit_code = CHAT_EXIT_INTERRUPTED;
  } else if (status) {
    status_print(status);
    exit_code = CHAT_EXIT_FAILED;
  }
  pcp_status_ignore(status);
  return exit_code;
}

int pcp_roles_chat_cli_main(int argc, char** argv) {
  chat_options_t options;
  memset(&options, 0, sizeof(options));
  pcp_string_list_t positionals = {0};
  pcp_string_builder_t prompt;
  pcp_string_builder_initialize(pcp_allocator_system(), CHAT_MAX_PROMPT_BYTES,
                                &prompt);
  chat_t chat;
  memset(&chat, 0, sizeof(chat));
  chat.options = &options;
  int exit_code = 0;
  // `-h` is the one short flag (the table speaks long flags only).
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (strcmp(argv[i], "-h") == 0) {
      usage_print(stdout);
      return 0;
    }
  }
  pcp_status_t status = pcp_config_initialize(&kTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kTable, argc - 1, argv + 1, &options,
                                   &positionals);
  }
  if (!status && options.help) {
    usage_print(stdout);
    goto done;
  }
  if (!status) {
    status = pcp_config_validate(&kTable, &options);
  }
  if (!status) {
    status = prompt_join(&positionals, &prompt);
  }
  if (!status && positionals.count > 0 &&
      pcp_string_view_trim(pcp_make_string_view(prompt.data, prompt.size))
              .size == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "the prompt is empty (leave it out for an "
                             "interactive session)");
  }
  if (!status) {
    const char* env =
        options.api_token_env ? options.api_token_env : CHAT_DEFAULT_TOKEN_ENV;
    chat.token = getenv(env);
    if (chat.token && !chat.token[0]) {
      chat.token = NULL;
    }
    if (!chat.token && options.api_token_env) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--api-token-env: %s is not set", env);
    }
  }
  if (status) {
    exit_code = pcp_config_cli_usage_error("chat", status);
    goto done;
  }
  // "http://h:p/", "http://h:p/v1" and "http://h:p" name the same service.
  size_t url_length = strlen(options.url);
  while (url_length > 0 && options.url[url_length - 1] == '/') {
    --url_length;
  }
  if (url_length >= 3 && strncmp(options.url + url_length - 3, "/v1", 3) == 0) {
    url_length -= 3;
  }
  if (url_length >= sizeof(chat.base_url)) {
    exit_code = pcp_config_cli_usage_error(
        "chat",
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "--url is over %zu bytes",
                        sizeof(chat.base_url) - 1));
    goto done;
  }
  memcpy(chat.base_url, options.url, url_length);
  chat.base_url[url_length] = '\0';
  chat.tty_out = isatty(STDOUT_FILENO) != 0;
  if (options.model) {
    // As before, a failed copy leaves no model (the gateway's first is used).
    pcp_status_ignore(pcp_allocator_strdup(pcp_allocator_system(),
                                           options.model, &chat.model));
  }
  chat.messages = json_array();
  if (options.system) {
    status = message_append(chat.messages, "system", options.system,
                            strlen(options.system));
    chat.first_droppable = 1;
    if (status) {
      exit_code = pcp_config_cli_usage_error("chat", status);
      goto done;
    }
  }
  pcp_http_client_options_t client_options = {
      .timeout_ms = options.timeout_s * 1000,
      .max_response_bytes = CHAT_MAX_JSON_BYTES,
  };
  status = pcp_http_client_create(&client_options, pcp_allocator_system(),
                                  &chat.client);
  if (status) {
    status_print(status);
    pcp_status_ignore(status);
    exit_code = CHAT_EXIT_FAILED;
    goto done;
  }
  exit_code = chat_run(&chat, &prompt);

done:
  pcp_http_client_release(chat.client);
  json_decref(chat.messages);
  pcp_allocator_free(pcp_allocator_system(), chat.model);
  pcp_string_builder_deinitialize(&prompt);
  pcp_string_list_deinitialize(&positionals);
  pcp_config_deinitialize(&kTable, &options);
  return exit_code;
}
