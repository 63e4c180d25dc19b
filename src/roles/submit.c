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

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"
#include "http/http.h"
#include "roles/roles.h"

// Same cap as the gateway's (experiments are small JSON objects).
#define SUBMIT_MAX_EXPERIMENT_BYTES ((size_t)1 << 20)
#define SUBMIT_BAR_WIDTH 30

typedef struct submit_options_t {
  const char* gateway;
  const char* token_env;
  int64_t poll_ms;
  int64_t timeout_s;  // 0: follow until the job ends
  bool follow;
} submit_options_t;

// Prints "pcp submit: <message>", consumes |status|; exit code 1 (a run-time
// failure: the file, the network or the gateway's answer).
static int report_error(pcp_status_t status) {
  char message[1024];
  pcp_status_format(status, message, sizeof(message));
  fprintf(stderr, "pcp submit: %s\n", message);
  pcp_status_ignore(status);
  return 1;
}

static void usage(FILE* out) {
  fprintf(out,
          "usage: pcp submit train EXP.json [flags]\n"
          "  --gateway URL      gateway base URL (default "
          "http://127.0.0.1:8000)\n"
          "  --token-env NAME   environment variable holding the API token "
          "(default PCP_API_TOKEN; unset: no token)\n"
          "  --no-follow        print the job id and return\n"
          "  --poll-ms N        progress poll period (default 500)\n"
          "  --timeout-s N      give up following after N s (exit 1; "
          "default: none)\n");
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
  char* text = malloc(SUBMIT_MAX_EXPERIMENT_BYTES + 2);
  if (!text) {
    fclose(f);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  size_t n = fread(text, 1, SUBMIT_MAX_EXPERIMENT_BYTES + 1, f);
  bool failed = ferror(f) != 0;
  fclose(f);
  if (failed || n > SUBMIT_MAX_EXPERIMENT_BYTES) {
    free(text);
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
  printf("%s[%s] step %lld/%lld loss %s val %s lr %s tok/s %s wire %.2f MiB "
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
  const char* token = getenv(options->token_env);
  if (token && !token[0]) {
    token = NULL;
  }
  pcp_http_client_options_t client_options = {.timeout_ms = 30000};
  pcp_http_client_t* client = NULL;
  status =
      pcp_http_client_create(&client_options, pcp_allocator_system(), &client);
  if (status) {
    free(text);
    return report_error(status);
  }
  char url[2048];
  snprintf(url, sizeof(url), "%s/v1/training/jobs", options->gateway);
  int http_status = 0;
  json_t* job = NULL;
  status = request_json(client, "POST", url, token, text, length, &http_status,
                        &job);
  free(text);
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
  if (options->follow) {
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
      free(line);
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
        json_t* val = json_object_get(json_object_get(job, "training"),
                                      "val_loss");
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
  submit_options_t options = {
      .gateway = "http://127.0.0.1:8000",
      .token_env = "PCP_API_TOKEN",
      .poll_ms = 500,
      .follow = true,
  };
  static const struct option kLongOptions[] = {
      {"gateway", required_argument, NULL, 'g'},
      {"token-env", required_argument, NULL, 't'},
      {"no-follow", no_argument, NULL, 'n'},
      {"poll-ms", required_argument, NULL, 'p'},
      {"timeout-s", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", kLongOptions, NULL)) != -1) {
    switch (c) {
      case 'g':
        options.gateway = optarg;
        break;
      case 't':
        options.token_env = optarg;
        break;
      case 'n':
        options.follow = false;
        break;
      case 'p':
        options.poll_ms = strtoll(optarg, NULL, 10);
        break;
      case 's':
        options.timeout_s = strtoll(optarg, NULL, 10);
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (argc - optind != 2 || strcmp(argv[optind], "train") != 0) {
    usage(stderr);
    return 2;
  }
  if (options.poll_ms < 10 || options.poll_ms > 60000 ||
      options.timeout_s < 0) {
    fprintf(stderr,
            "pcp submit: --poll-ms must be in [10, 60000] and --timeout-s "
            ">= 0\n");
    return 2;
  }
  return submit_train(&options, argv[optind + 1]);
}
