// SPDX-License-Identifier: Apache-2.0
//
// The external reward verifier (services.h, docs/rl.md "Rewards"): scores a
// batch of RL samples by POSTing them as JSON to a configured URL over
// src/http's client, in slices of at most max_batch items, with a timeout per
// attempt and retries with doubling backoff for the failures that can pass
// (connection refused or reset, timeout, 5xx, 429). Everything else (another
// 4xx, a body that is not {"rewards":[finite numbers]} of the slice's
// length, an oversized answer) fails the caller at once: a reward the
// verifier did not give is never replaced by a zero.
//
// One libcurl handle serves every call (keep-alive to the verifier); the
// client is thread-compatible, so a mutex serialises batches. The RL
// workload scores one group at a time, so the lock costs nothing there.

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services.h"

// Longest key path kept for messages.
#define KEY_PATH_CAPACITY 96
// Body bytes quoted in an error.
#define BODY_QUOTE_BYTES 200
// Longest backoff between two attempts.
#define MAX_BACKOFF_MS 60000
// A backoff sleeps in pieces of this many ms, checking the caller's stop.
#define STOP_SLEEP_MS 50

typedef struct verifier_t {
  pcp_allocator_t allocator;
  char key_path[KEY_PATH_CAPACITY];
  char* url;
  // scheme://host/path without the query, for messages.
  char* url_for_messages;
  char* token;  // NULL: no Authorization header
  int64_t timeout_ms;
  uint32_t max_retries;
  int64_t backoff_ms;
  uint32_t max_batch;
  size_t max_response_bytes;
  pthread_mutex_t mutex;
  pcp_http_client_t* client;
} verifier_t;

//===----------------------------------------------------------------------===//
// Config
//===----------------------------------------------------------------------===//

static pcp_status_t bad(const char* path, const char* key, const char* what) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s%s%s: %s", path,
                         key ? "." : "", key ? key : "", what);
}

static pcp_status_t integer_get(const json_t* config, const char* path,
                                const char* key, int64_t default_value,
                                int64_t min, int64_t max, int64_t* out_value) {
  json_t* value = json_object_get(config, key);
  *out_value = default_value;
  if (!value)
    return NULL;
  if (!json_is_integer(value) || json_integer_value(value) < min ||
      json_integer_value(value) > max) {
    char what[96];
    snprintf(what, sizeof(what), "must be an integer in [%lld, %lld]",
             (long long)min, (long long)max);
    return bad(path, key, what);
  }
  *out_value = (int64_t)json_integer_value(value);
  return NULL;
}

static pcp_status_t string_get(const json_t* config, const char* path,
                               const char* key, size_t max_bytes,
                               const char** out_value) {
  json_t* value = json_object_get(config, key);
  *out_value = NULL;
  if (!value)
    return NULL;
  if (!json_is_string(value))
    return bad(path, key, "must be a string");
  const char* text = json_string_value(value);
  size_t length = json_string_length(value);
  if (length == 0 || length > max_bytes || strlen(text) != length) {
    char what[96];
    snprintf(what, sizeof(what), "must be 1 to %zu bytes without NUL",
             max_bytes);
    return bad(path, key, what);
  }
  for (size_t i = 0; i < length; ++i) {
    unsigned char c = (unsigned char)text[i];
    if (c <= ' ' || c == 0x7F) {
      return bad(path, key, "must not contain spaces or control characters");
    }
  }
  *out_value = text;
  return NULL;
}

// The host of an http(s) URL, "[::1]" style kept as is.
static void url_host(const char* url, char* out_host, size_t capacity) {
  const char* start = strstr(url, "://");
  start = start ? start + 3 : url;
  const char* at = start;
  // Skip "user:pass@" if present in the authority, which ends at the first
  // '/', '?' or '#' as libcurl reads it (an '@' after a '?' is the query's).
  const char* slash = start + strcspn(start, "/?#");
  const char* user_end = strchr(start, '@');
  if (user_end && user_end < slash)
    at = user_end + 1;
  size_t length = 0;
  if (*at == '[') {
    const char* close = strchr(at, ']');
    length = close ? (size_t)(close - at) + 1 : strlen(at);
  } else {
    length = strcspn(at, ":/?#");
  }
  if (length >= capacity)
    length = capacity - 1;
  memcpy(out_host, at, length);
  out_host[length] = '\0';
}

static bool host_is_loopback(const char* host) {
  return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 ||
         strcmp(host, "[::1]") == 0;
}

static bool env_name_valid(const char* name) {
  if (!(isalpha((unsigned char)name[0]) || name[0] == '_'))
    return false;
  for (const char* c = name; *c; ++c) {
    if (!(isalnum((unsigned char)*c) || *c == '_'))
      return false;
  }
  return true;
}

static void verifier_release(void* self) {
  verifier_t* v = self;
  if (!v)
    return;
  pcp_http_client_release(v->client);
  pthread_mutex_destroy(&v->mutex);
  if (v->token) {
    // The secret does not outlive the verifier in freed memory.
    volatile char* p = v->token;
    while (*p) *p++ = 0;
  }
  pcp_allocator_free(v->allocator, v->token);
  pcp_allocator_free(v->allocator, v->url);
  pcp_allocator_free(v->allocator, v->url_for_messages);
  pcp_allocator_free(v->allocator, v);
}

static pcp_status_t config_parse(const json_t* config, const char* path,
                                 verifier_t* v, const char** out_ca_path) {
  if (!json_is_object(config))
    return bad(path, NULL, "must be an object");
  static const char* const kAllowed[] = {"type",
                                         "url",
                                         "timeout_ms",
                                         "max_retries",
                                         "backoff_ms",
                                         "max_batch",
                                         "max_response_bytes",
                                         "token_env",
                                         "ca_path",
                                         "insecure_http",
                                         NULL};
  const char* key;
  json_t* value;
  json_object_foreach((json_t*)config, key, value) {
    (void)value;
    bool known = false;
    for (const char* const* a = kAllowed; *a; ++a) known |= !strcmp(*a, key);
    if (!known) {
      return bad(path, key,
                 "unknown key (allowed: type url timeout_ms max_retries "
                 "backoff_ms max_batch max_response_bytes token_env ca_path "
                 "insecure_http)");
    }
  }
  json_t* type = json_object_get(config, "type");
  if (!json_is_string(type) || strcmp(json_string_value(type), "verifier")) {
    return bad(path, "type", "must be \"verifier\"");
  }
  const char* url = NULL;
  PCP_RETURN_IF_ERROR_BARE(string_get(config, path, "url", 2048, &url));
  if (!url)
    return bad(path, "url", "is required");
  bool https = strncmp(url, "https://", 8) == 0;
  if (!https && strncmp(url, "http://", 7) != 0) {
    return bad(path, "url", "must start with https:// or http://");
  }
  char host[256];
  url_host(url, host, sizeof(host));
  if (host[0] == '\0')
    return bad(path, "url", "has no host");
  json_t* insecure = json_object_get(config, "insecure_http");
  if (insecure && !json_is_boolean(insecure)) {
    return bad(path, "insecure_http", "must be true or false");
  }
  // Plain HTTP would carry the bearer token and the completions in clear
  // over the network; only loopback gets it without asking.
  if (!https && !host_is_loopback(host) && !json_is_true(insecure)) {
    return bad(path, "url",
               "http:// is only allowed to 127.0.0.1, localhost or [::1] "
               "(use https://, or set insecure_http: true)");
  }
  int64_t number = 0;
  PCP_RETURN_IF_ERROR_BARE(
      integer_get(config, path, "timeout_ms", 30000, 1, 600000, &number));
  v->timeout_ms = number;
  PCP_RETURN_IF_ERROR_BARE(
      integer_get(config, path, "max_retries", 2, 0, 10, &number));
  v->max_retries = (uint32_t)number;
  PCP_RETURN_IF_ERROR_BARE(
      integer_get(config, path, "backoff_ms", 500, 0, MAX_BACKOFF_MS, &number));
  v->backoff_ms = number;
  PCP_RETURN_IF_ERROR_BARE(integer_get(config, path, "max_batch", 64, 1,
                                       PCP_SERVICES_VERIFIER_MAX_BATCH,
                                       &number));
  v->max_batch = (uint32_t)number;
  PCP_RETURN_IF_ERROR_BARE(
      integer_get(config, path, "max_response_bytes", 1 << 20, 256,
                  PCP_SERVICES_VERIFIER_MAX_RESPONSE_BYTES, &number));
  v->max_response_bytes = (size_t)number;
  PCP_RETURN_IF_ERROR_BARE(
      string_get(config, path, "ca_path", 4096, out_ca_path));
  const char* token_env = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      string_get(config, path, "token_env", 128, &token_env));
  if (token_env) {
    if (!env_name_valid(token_env)) {
      return bad(path, "token_env",
                 "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*"
                 "), not the token itself");
    }
    const char* token = getenv(token_env);
    if (!token || !*token) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "%s.token_env: the environment variable %s is "
                             "not set or empty",
                             path, token_env);
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_allocator_strdup(v->allocator, token, &v->token));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_strdup(v->allocator, url, &v->url));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_strdup(v->allocator, url, &v->url_for_messages));
  char* m = v->url_for_messages;
  m[strcspn(m, "?#")] = '\0';
  // Nor "user:password@" (a credential): the authority after its last '@'.
  char* authority = strstr(m, "://");
  authority = authority ? authority + 3 : m;
  size_t authority_length = strcspn(authority, "/");
  char* at = NULL;
  for (size_t i = 0; i < authority_length; ++i) {
    if (authority[i] == '@')
      at = authority + i;
  }
  if (at)
    memmove(authority, at + 1, strlen(at + 1) + 1);
  return NULL;
}

//===----------------------------------------------------------------------===//
// Requests
//===----------------------------------------------------------------------===//

// Length of the valid UTF-8 sequence at |s| (at most |n| bytes), 0 if none.
// NUL counts as invalid: JSON allows \u0000 but many servers (PCP's own, any
// on C strings) refuse it, and no tokenizer text needs it.
static size_t utf8_sequence(const unsigned char* s, size_t n) {
  unsigned char c = s[0];
  if (c == 0)
    return 0;
  if (c < 0x80)
    return 1;
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0)
      lo = 0xA0;
    if (c == 0xED)
      hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0)
      lo = 0x90;
    if (c == 0xF4)
      hi = 0x8F;
  } else {
    return 0;
  }
  if (length > n)
    return 0;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < length; ++i) {
    if (s[i] < 0x80 || s[i] > 0xBF)
      return 0;
  }
  return length;
}

// A JSON string of |text|; NUL and bytes that are not valid UTF-8 (a model
// can emit half a character at max_tokens) become U+FFFD, since JSON text
// must be Unicode. NULL when out of memory.
static json_t* json_text(pcp_allocator_t allocator, pcp_string_view_t text) {
  const unsigned char* s = (const unsigned char*)text.data;
  size_t n = text.size;
  bool valid = true;
  for (size_t i = 0; i < n;) {
    size_t step = utf8_sequence(s + i, n - i);
    if (!step) {
      valid = false;
      break;
    }
    i += step;
  }
  if (valid)
    return json_stringn(n ? text.data : "", n);
  char* clean = NULL;
  // Each invalid byte becomes three.
  if (pcp_allocator_malloc(allocator, 3 * n + 1, (void**)&clean))
    return NULL;
  size_t used = 0;
  for (size_t i = 0; i < n;) {
    size_t step = utf8_sequence(s + i, n - i);
    if (step) {
      memcpy(clean + used, s + i, step);
      used += step;
      i += step;
    } else {
      memcpy(clean + used, "\xEF\xBF\xBD", 3);
      used += 3;
      ++i;
    }
  }
  json_t* value = json_stringn(clean, used);
  pcp_allocator_free(allocator, clean);
  return value;
}

static pcp_status_t request_body(verifier_t* v,
                                 const pcp_workloads_rl_sample_t* items,
                                 size_t count, char** out_body,
                                 size_t* out_length) {
  *out_body = NULL;
  json_t* array = json_array();
  json_t* root = json_pack("{s:o}", "items", array);
  if (!root) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "verifier request");
  }
  pcp_status_t status = NULL;
  for (size_t i = 0; i < count && !status; ++i) {
    const pcp_workloads_rl_sample_t* item = &items[i];
    if (item->prompt.size > PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES ||
        item->completion.size > PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES ||
        item->answer.size > PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: item %zu has a text longer than %u bytes",
                               v->key_path, i,
                               PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES);
      break;
    }
    if (item->metadata && !json_is_object(item->metadata)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: item %zu metadata is not an object",
                               v->key_path, i);
      break;
    }
    json_t* answer =
        item->answer.data ? json_text(v->allocator, item->answer) : json_null();
    json_t* metadata =
        item->metadata ? json_deep_copy(item->metadata) : json_null();
    json_t* entry =
        json_pack("{s:o*, s:o*, s:o*, s:o*}", "prompt",
                  json_text(v->allocator, item->prompt), "completion",
                  json_text(v->allocator, item->completion), "answer", answer,
                  "metadata", metadata);
    if (!entry || json_object_size(entry) != 4 ||
        json_array_append_new(array, entry)) {
      json_decref(entry);
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "%s: building the request", v->key_path);
    }
  }
  if (!status) {
    *out_body = json_dumps(root, JSON_COMPACT);
    if (!*out_body) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "%s: serialising the request", v->key_path);
    } else {
      *out_length = strlen(*out_body);
    }
  }
  json_decref(root);
  return status;
}

// The first bytes of |body|, printable ASCII only, for an error message.
static void body_quote(const char* body, size_t length, char* out,
                       size_t capacity) {
  size_t used = 0;
  for (size_t i = 0; i < length && i < BODY_QUOTE_BYTES && used + 4 < capacity;
       ++i) {
    unsigned char c = (unsigned char)body[i];
    out[used++] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
  }
  if (length > BODY_QUOTE_BYTES && used + 4 < capacity) {
    memcpy(out + used, "...", 3);
    used += 3;
  }
  out[used] = '\0';
}

// Reads {"rewards":[...]} of |count| finite numbers into |out_rewards|.
static pcp_status_t response_parse(verifier_t* v,
                                   const pcp_http_client_response_t* response,
                                   size_t count, double* out_rewards) {
  char quote[BODY_QUOTE_BYTES + 8];
  body_quote(response->body, response->body_length, quote, sizeof(quote));
  json_error_t error;
  json_t* root = json_loadb(response->body, response->body_length, 0, &error);
  if (!root) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "%s: verifier %s answered %d with a body that is "
                           "not JSON (%s): '%s'",
                           v->key_path, v->url_for_messages,
                           response->http_status, error.text, quote);
  }
  pcp_status_t status = NULL;
  json_t* rewards = json_object_get(root, "rewards");
  if (!json_is_array(rewards)) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "%s: verifier %s answered without a \"rewards\" "
                             "array: '%s'",
                             v->key_path, v->url_for_messages, quote);
  } else if (json_array_size(rewards) != count) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "%s: verifier %s returned %zu rewards for %zu "
                             "items",
                             v->key_path, v->url_for_messages,
                             json_array_size(rewards), count);
  } else {
    for (size_t i = 0; i < count; ++i) {
      json_t* value = json_array_get(rewards, i);
      double reward = json_is_number(value) ? json_number_value(value) : NAN;
      if (!isfinite(reward)) {
        char* text = json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT);
        status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                                 "%s: verifier %s returned rewards[%zu] = %.64s"
                                 ", not a finite number",
                                 v->key_path, v->url_for_messages, i,
                                 text ? text : "?");
        pcp_libc_free(text);  // json_dumps: jansson's malloc
        break;
      }
      out_rewards[i] = reward;
    }
  }
  json_decref(root);
  return status;
}

static bool stop_requested(const pcp_workloads_rl_stop_t* stop) {
  return stop && stop->should_stop && stop->should_stop(stop->user_data);
}

static bool request_should_stop(void* user_data) {
  return stop_requested(user_data);
}

static pcp_status_t cancelled(const verifier_t* v) {
  return pcp_make_status(PCP_STATUS_CANCELLED, "%s: scoring cancelled",
                         v->key_path);
}

// Sleeps |ms| in pieces of STOP_SLEEP_MS; false when |stop| turned true.
static bool sleep_unless_stopped(int64_t ms,
                                 const pcp_workloads_rl_stop_t* stop) {
  if (!stop || !stop->should_stop) {
    pcp_sleep_ms(ms);
    return true;
  }
  while (ms > 0) {
    if (stop_requested(stop))
      return false;
    int64_t piece = ms < STOP_SLEEP_MS ? ms : STOP_SLEEP_MS;
    pcp_sleep_ms(piece);
    ms -= piece;
  }
  return !stop_requested(stop);
}

// One slice, with retries; |stop| (may be NULL) is checked before each
// attempt, during the backoff and while a request waits (a verifier may
// take timeout_ms x (max_retries + 1), over an hour, and a job's cancel
// must not wait for it). Called with the mutex held.
static pcp_status_t slice_score(verifier_t* v,
                                const pcp_workloads_rl_sample_t* items,
                                size_t count,
                                const pcp_workloads_rl_stop_t* stop,
                                double* out_rewards) {
  char* body = NULL;
  size_t body_length = 0;
  PCP_RETURN_IF_ERROR_BARE(request_body(v, items, count, &body, &body_length));
  static const char* const kHeaders[] = {"Content-Type: application/json",
                                         "Accept: application/json", NULL};
  pcp_http_client_request_t request = {
      .method = "POST",
      .url = v->url,
      .headers = kHeaders,
      .bearer_token = v->token,
      .body = body,
      .body_length = body_length,
      .should_stop = stop && stop->should_stop ? request_should_stop : NULL,
      .stop_user_data = (void*)stop,
  };
  pcp_status_t last = NULL;
  int64_t backoff_ms = v->backoff_ms;
  uint32_t attempt = 0;
  for (; attempt <= v->max_retries; ++attempt) {
    if (attempt > 0 && !sleep_unless_stopped(backoff_ms, stop)) {
      pcp_status_ignore(last);
      last = cancelled(v);
      break;
    }
    if (attempt > 0) {
      backoff_ms =
          backoff_ms * 2 > MAX_BACKOFF_MS ? MAX_BACKOFF_MS : backoff_ms * 2;
    }
    if (stop_requested(stop)) {
      pcp_status_ignore(last);
      last = cancelled(v);
      break;
    }
    pcp_http_client_response_t response;
    pcp_status_t status = pcp_http_client_send(v->client, &request, &response);
    pcp_status_ignore(last);
    last = NULL;
    if (status) {
      pcp_status_code_t code = pcp_status_code(status);
      if (code == PCP_STATUS_CANCELLED) {
        pcp_status_ignore(status);
        last = cancelled(v);
        break;
      }
      if (code == PCP_STATUS_RESOURCE_EXHAUSTED) {
        pcp_status_ignore(status);
        last = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "%s: verifier %s answered more than %zu bytes "
                               "(max_response_bytes)",
                               v->key_path, v->url_for_messages,
                               v->max_response_bytes);
        break;
      }
      // Connection failures and timeouts may pass: retry.
      last = status;
      continue;
    }
    int http = response.http_status;
    if (http >= 200 && http < 300) {
      last = response_parse(v, &response, count, out_rewards);
      pcp_http_client_response_deinitialize(&response);
      break;
    }
    char quote[BODY_QUOTE_BYTES + 8];
    body_quote(response.body, response.body_length, quote, sizeof(quote));
    bool retry = http >= 500 || http == 429;
    last = pcp_make_status(
        retry ? PCP_STATUS_UNAVAILABLE : PCP_STATUS_FAILED_PRECONDITION,
        "%s: verifier %s answered HTTP %d: '%s'", v->key_path,
        v->url_for_messages, http, quote);
    pcp_http_client_response_deinitialize(&response);
    if (!retry)
      break;
  }
  pcp_libc_free(body);  // json_dumps allocates with jansson's malloc
  if (last && attempt > v->max_retries) {
    last = pcp_status_annotate_f(last, "%s: gave up after %u attempts",
                                 v->key_path, v->max_retries + 1);
  }
  return last;
}

static pcp_status_t verifier_score_batch_stoppable(
    void* self, const pcp_workloads_rl_sample_t* items, size_t count,
    const pcp_workloads_rl_stop_t* stop, double* out_rewards) {
  verifier_t* v = self;
  pcp_status_t status = NULL;
  pthread_mutex_lock(&v->mutex);
  for (size_t offset = 0; offset < count && !status; offset += v->max_batch) {
    if (stop_requested(stop)) {
      status = cancelled(v);
      break;
    }
    size_t slice =
        count - offset < v->max_batch ? count - offset : v->max_batch;
    status = slice_score(v, items + offset, slice, stop, out_rewards + offset);
    if (status && count > slice) {
      status = pcp_status_annotate_f(status, "items %zu..%zu of %zu", offset,
                                     offset + slice - 1, count);
    }
  }
  pthread_mutex_unlock(&v->mutex);
  return status;
}

static pcp_status_t verifier_score_batch(void* self,
                                         const pcp_workloads_rl_sample_t* items,
                                         size_t count, double* out_rewards) {
  return verifier_score_batch_stoppable(self, items, count, NULL, out_rewards);
}

pcp_status_t pcp_services_verifier_create(
    const json_t* config, const char* key_path, pcp_allocator_t allocator,
    pcp_workloads_rl_verifier_t* out_verifier) {
  memset(out_verifier, 0, sizeof(*out_verifier));
  verifier_t* v = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*v), (void**)&v));
  v->allocator = allocator;
  int written = snprintf(v->key_path, sizeof(v->key_path), "%s",
                         key_path && *key_path ? key_path : "reward");
  if (written < 0 || (size_t)written >= sizeof(v->key_path)) {
    pcp_allocator_free(allocator, v);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "verifier key path longer than %d bytes",
                           KEY_PATH_CAPACITY - 1);
  }
  if (pthread_mutex_init(&v->mutex, NULL) != 0) {
    pcp_allocator_free(allocator, v);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "verifier mutex");
  }
  const char* ca_path = NULL;
  pcp_status_t status = config_parse(config, v->key_path, v, &ca_path);
  if (!status) {
    pcp_http_client_options_t options = {
        .ca_path = ca_path,
        .timeout_ms = v->timeout_ms,
        .max_response_bytes = v->max_response_bytes,
    };
    status = pcp_http_client_create(&options, allocator, &v->client);
  }
  if (status) {
    verifier_release(v);
    return status;
  }
  out_verifier->self = v;
  out_verifier->score_batch = verifier_score_batch;
  out_verifier->release = verifier_release;
  out_verifier->score_batch_stoppable = verifier_score_batch_stoppable;
  return NULL;
}
