// SPDX-License-Identifier: Apache-2.0
//
// `pcp submit train EXP.json [--gateway URL]`: posts a DiLoCo experiment to
// the gateway's training API and follows the job (GET /v1/training/jobs/{id}
// every --poll-ms) with a progress bar and a loss readout until it ends.
//
// Polling, not the SSE stream: the job row carries the whole progress, so a
// poll that is lost or late loses nothing, and the client needs no event
// parser; at one request per 500 ms the cost is nil next to a training run.
// Thread-safety: a CLI entry point, called once from main().

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"
#include "config/config.h"
#include "http/http.h"
#include "roles/roles.h"

// Same cap as the gateway's (experiments are small JSON objects).
#define SUBMIT_MAX_EXPERIMENT_BYTES ((size_t)1 << 20)
#define SUBMIT_BAR_WIDTH 30

typedef struct submit_options_t {
  char* gateway;
  char* api_token_env;
  int64_t poll_ms;
  int64_t timeout_s;  // 0: follow until the job ends
  bool no_follow;
  bool help;
} submit_options_t;

#define OFFSET(member) offsetof(submit_options_t, member)
static const pcp_config_field_t kFields[] = {
    {.name = "gateway",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(gateway),
     .default_value = "http://127.0.0.1:8000",
     .value_name = "URL",
     .help = "gateway base URL"},
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(api_token_env),
     .default_value = "PCP_API_TOKEN",
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .value_name = "NAME",
     .help = "environment variable holding the API token (unset: no token)"},
    // One name for a token flag across pcp; the old one answers "renamed".
    {.name = "token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(api_token_env),
     .flags = PCP_CONFIG_FLAG_RENAMED},
    {.name = "no-follow",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(no_follow),
     .help = "print the job id and return"},
    {.name = "poll-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(poll_ms),
     .default_value = "500",
     .min = 10,
     .max = 60000,
     .value_name = "N",
     .help = "progress poll period"},
    {.name = "timeout-s",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(timeout_s),
     .default_value = "0",
     .min = 0,
     .max = 31536000,
     .value_name = "N",
     .help = "give up following after N s (exit 1; 0: never)"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .flags = PCP_CONFIG_FLAG_CLI_ONLY,
     .help = "print these flags and exit (also -h)"},
};
#undef OFFSET

static const pcp_config_table_t kTable = {
    .name = "submit",
    .fields = kFields,
    .field_count = PCP_ARRAYSIZE(kFields),
};

// Prints "pcp submit: <message>", consumes |status|; exit code 1 (a run-time
// failure: the file, the network or the gateway's answer).
static int report_error(pcp_status_t status) {
  return pcp_config_cli_failure("submit", status);
}

static void usage(FILE* out) {
  fprintf(out, "usage: pcp submit train EXP.json [flags]\n\nflags:\n");
  pcp_config_print_help(&kTable, out);
}

static pcp_status_t file_slurp(const char* path, char** out_text,
                               size_t* out_length) {
  *out_text = NULL;
  *out_length = 0;
  FILE* f = fopen(path, "rb");
  if (!f) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "cannot open %s", path);
  }
  // One byte over the cap tells "too large" from "exactly the cap".
  char* text = NULL;
  pcp_status_t status = pcp_allocator_malloc(
      pcp_allocator_system(), SUBMIT_MAX_EXPERIMENT_BYTES + 2, (void**)&text);
  if (status) {
    fclose(f);
    return status;
  }
  size_t n = fread(text, 1, SUBMIT_MAX_EXPERIMENT_BYTES + 1, f);
  bool failed = ferror(f) != 0;
  fclose(f);
  if (failed || n > SUBMIT_MAX_EXPERIMENT_BYTES) {
    pcp_allocator_free(pcp_allocator_system(), text);
    return pcp_make_status(
        failed ? PCP_STATUS_DATA_LOSS : PCP_STATUS_RESOURCE_EXHAUSTED,
        failed ? "read error on %s" : "%s is over 1 MiB", path);
  }
  text[n] = '\0';
  *out_text = text;
  *out_length = n;
  return pcp_ok_status();
}

// The gateway's JSON error message, or the raw body.
static const char* error_text(json_t* body, const char* raw) {
  const char* message = json_string_value(
      json_object_get(json_object_get(body, "error"), "message"));
  return message ? message : raw;
}

static pcp_status_t request_json(pcp_http_client_t* client, const char* method,
                                 const char* url, const char* token,
                                 const char* body, size_t body_length,
                                 int* out_http_status, json_t** out_json) {
  *out_json = NULL;
  const char* headers[] = {"Content-Type: application/json", NULL};
  pcp_http_client_request_t request = {
      .method = method,
      .url = url,
      .headers = body ? headers : NULL,
      .bearer_token = token,
      .body = body,
      .body_length = body_length,
  };
  pcp_http_client_response_t response;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_client_send(client, &request, &response));
  *out_http_status = response.http_status;
  json_error_t error;
  json_t* json = json_loadb(response.body ? response.body : "",
                            response.body_length, 0, &error);
  pcp_status_t status = pcp_ok_status();
  if (response.http_status >= 300) {
    status =
        pcp_make_status(PCP_STATUS_FAILED_PRECONDITION, "%s %s: HTTP %d: %s",
                        method, url, response.http_status,
                        error_text(json, response.body ? response.body : ""));
    json_decref(json);
  } else if (!json) {
    status =
        pcp_make_status(PCP_STATUS_DATA_LOSS, "%s %s: answer is not JSON: %s",
                        method, url, error.text);
  } else {
    *out_json = json;
  }
  pcp_http_client_response_deinitialize(&response);
  return status;
}

// One status line, rewritten in place on a terminal and appended otherwise
// (logs of CI runs stay readable).
static void progress_print(json_t* job, bool tty) {
  json_t* t = json_object_get(job, "training");
  json_int_t step = json_integer_value(json_object_get(t, "outer_step"));
  json_int_t steps = json_integer_value(json_object_get(t, "outer_loop_steps"));
  json_t* loss = json_object_get(t, "loss");
  json_t* rate = json_object_get(t, "tokens_per_s");
  json_int_t wire = json_integer_value(json_object_get(t, "wire_bytes"));
  const char* state = json_string_value(json_object_get(job, "state"));
  int filled = steps > 0 ? (int)(SUBMIT_BAR_WIDTH * step / steps) : 0;
  if (filled > SUBMIT_BAR_WIDTH) {
    filled = SUBMIT_BAR_WIDTH;
  }
  char bar[SUBMIT_BAR_WIDTH + 1];
  for (int i = 0; i < SUBMIT_BAR_WIDTH; ++i) {
    bar[i] = i < filled ? '#' : '.';
  }
  bar[SUBMIT_BAR_WIDTH] = '\0';
  char loss_text[32] = "-";
  if (json_is_number(loss)) {
    snprintf(loss_text, sizeof(loss_text), "%.4f", json_number_value(loss));
  }
  char rate_text[32] = "-";
  if (json_is_number(rate)) {
    snprintf(rate_text, sizeof(rate_text), "%.0f", json_number_value(rate));
  }
  // The held-out loss (from the last evaluation) and the inner rate of the
  // last inner step (the schedule).
  json_t* val_loss = json_object_get(t, "val_loss");
  json_t* lr = json_object_get(t, "lr");
  char val_text[32] = "-";
  if (json_is_number(val_loss)) {
    snprintf(val_text, sizeof(val_text), "%.4f", json_number_value(val_loss));
  }
  char lr_text[32] = "-";
  if (json_is_number(lr)) {
    snprintf(lr_text, sizeof(lr_text), "%.2e", json_number_value(lr));
  }
  printf(
      "%s[%s] step %lld/%lld loss %s val %s lr %s tok/s %s wire %.2f MiB "
      "%s%s",
      tty ? "\r" : "", bar, (long long)step, (long long)steps, loss_text,
      val_text, lr_text, rate_text, (double)wire / (1024.0 * 1024.0),
      state ? state : "?", tty ? "\033[K" : "\n");
  fflush(stdout);
}

static bool state_is_terminal(const char* state) {
  return state &&
         (strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 ||
          strcmp(state, "cancelled") == 0);
}

static int submit_train(const submit_options_t* options, const char* path) {
  char* text = NULL;
  size_t length = 0;
  pcp_status_t status = file_slurp(path, &text, &length);
  if (status) {
    return report_error(status);
  }
  const char* token = getenv(options->api_token_env);
  if (token && !token[0]) {
    token = NULL;
  }
  pcp_http_client_options_t client_options = {.timeout_ms = 30000};
  pcp_http_client_t* client = NULL;
  status =
      pcp_http_client_create(&client_options, pcp_allocator_system(), &client);
  if (status) {
    pcp_allocator_free(pcp_allocator_system(), text);
    return report_error(status);
  }
  char url[2048];
  snprintf(url, sizeof(url), "%s/v1/training/jobs", options->gateway);
  int http_status = 0;
  json_t* job = NULL;
  status = request_json(client, "POST", url, token, text, length, &http_status,
                        &job);
  pcp_allocator_free(pcp_allocator_system(), text);
  if (status) {
    pcp_http_client_release(client);
    return report_error(status);
  }
  char id[256];
  snprintf(id, sizeof(id), "%s",
           json_string_value(json_object_get(job, "job_id"))
               ? json_string_value(json_object_get(job, "job_id"))
               : "");
  printf("job %s\n", id);
  fflush(stdout);
  int exit_code = 0;
  if (!options->no_follow) {
    bool tty = isatty(STDOUT_FILENO) != 0;
    snprintf(url, sizeof(url), "%s/v1/training/jobs/%s", options->gateway, id);
    pcp_clock_t clock = pcp_clock_system();
    int64_t deadline_ns =
        options->timeout_s > 0
            ? pcp_clock_now_ns(clock) + options->timeout_s * 1000000000
            : 0;
    char last_line[2048] = "";
    for (;;) {
      const char* state = json_string_value(json_object_get(job, "state"));
      // Print only when something changed, so a piped log stays short.
      char* line = json_dumps(json_object_get(job, "training"), JSON_COMPACT);
      char key[2048];
      snprintf(key, sizeof(key), "%s %s", state ? state : "", line ? line : "");
      pcp_libc_free(line);  // json_dumps
      if (strcmp(key, last_line) != 0) {
        progress_print(job, tty);
        snprintf(last_line, sizeof(last_line), "%s", key);
      }
      if (state_is_terminal(state)) {
        if (tty) {
          printf("\n");
        }
        const char* error = json_string_value(json_object_get(job, "error"));
        printf("job %s %s%s%s\n", id, state, error ? ": " : "",
               error ? error : "");
        // The end of a run: its final held-out loss, when it has one.
        json_t* val =
            json_object_get(json_object_get(job, "training"), "val_loss");
        if (json_is_number(val)) {
          printf("final val_loss %.4f\n", json_number_value(val));
        }
        exit_code = strcmp(state, "succeeded") == 0 ? 0 : 1;
        break;
      }
      if (deadline_ns && pcp_clock_now_ns(clock) >= deadline_ns) {
        printf("%sjob %s still %s after %lld s; not following any more\n",
               tty ? "\n" : "", id, state ? state : "?",
               (long long)options->timeout_s);
        exit_code = 1;
        break;
      }
      pcp_sleep_ms(options->poll_ms);
      json_decref(job);
      job = NULL;
      status =
          request_json(client, "GET", url, token, NULL, 0, &http_status, &job);
      if (status) {
        exit_code = report_error(status);
        break;
      }
    }
  }
  json_decref(job);
  pcp_http_client_release(client);
  return exit_code;
}

int pcp_roles_submit_cli_main(int argc, char** argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  }
  submit_options_t options;
  memset(&options, 0, sizeof(options));
  pcp_string_list_t positionals = {0};
  pcp_status_t status = pcp_config_initialize(&kTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kTable, argc - 1, argv + 1, &options,
                                   &positionals);
  }
  int exit_code = 0;
  if (!status && options.help) {
    usage(stdout);
  } else {
    if (!status && (positionals.count == 0 ||
                    strcmp(positionals.items[0], "train") != 0)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "expected 'train EXP.json'%s%s%s",
                               positionals.count ? ", got '" : "",
                               positionals.count ? positionals.items[0] : "",
                               positionals.count ? "'" : "");
    } else if (!status && positionals.count != 2) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "expected one experiment file after 'train', "
                               "got %zu",
                               positionals.count - 1);
    }
    if (!status && strncmp(options.gateway, "http://", 7) != 0 &&
        strncmp(options.gateway, "https://", 8) != 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--gateway must start with http:// or "
                               "https://, got '%s'",
                               options.gateway);
    }
    if (status) {
      exit_code = pcp_config_cli_usage_error("submit", status);
    } else {
      exit_code = submit_train(&options, positionals.items[1]);
    }
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
