// SPDX-License-Identifier: Apache-2.0
//
// `pcp submit train EXP.json [--gateway URL]`: posts a DiLoCo experiment to
// the gateway's training API and follows the job (GET /v1/training/jobs/{id}
// every --poll-ms) with a progress bar and a loss readout until it ends.
// `pcp submit rl EXP.json`: the same for a GRPO experiment (POST
// /v1/rl/jobs, followed through GET /v1/jobs/{id}, whose "rl" object is the
// job's progress: iteration, reward mean and std, KL, clip fraction,
// rollout tokens/s, eval reward). One submit-and-follow loop serves both;
// a kind differs only in its routes and its progress line.
//
// Polling, not the SSE stream: the job row carries the whole progress, so a
// poll that is lost or late loses nothing, and the client needs no event
// parser; at one request per 500 ms the cost is nil next to a training run.
// Thread-safety: a CLI entry point, called once from main().

#include <signal.h>
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
  fprintf(out,
          "usage: pcp submit train EXP.json [flags]\n"
          "       pcp submit rl EXP.json [flags]\n\n"
          "train: a DiLoCo experiment (POST /v1/training/jobs; docs/"
          "training.md).\n"
          "rl: a GRPO experiment (POST /v1/rl/jobs; docs/rl.md).\n"
          "Follows the job with a progress bar until it ends. Exit codes: 0 "
          "succeeded\n(or submitted, with --no-follow), 1 failed, cancelled, "
          "refused or timed out\n(the error printed), 2 usage, 130 "
          "interrupted (Ctrl-C stops following;\nthe job keeps running).\n\n"
          "flags:\n");
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

// "[####......]": |done| of |total| in SUBMIT_BAR_WIDTH cells.
static void bar_format(json_int_t done, json_int_t total,
                       char bar[SUBMIT_BAR_WIDTH + 1]) {
  int filled = total > 0 ? (int)(SUBMIT_BAR_WIDTH * done / total) : 0;
  if (filled > SUBMIT_BAR_WIDTH) {
    filled = SUBMIT_BAR_WIDTH;
  }
  for (int i = 0; i < SUBMIT_BAR_WIDTH; ++i) {
    bar[i] = i < filled ? '#' : '.';
  }
  bar[SUBMIT_BAR_WIDTH] = '\0';
}

// |value| with |digits| decimals (scientific with |scientific|) when it is
// a JSON number, else "-".
static void number_format(json_t* value, int digits, bool scientific, char* out,
                          size_t size) {
  if (!json_is_number(value)) {
    snprintf(out, size, "-");
  } else if (scientific) {
    snprintf(out, size, "%.*e", digits, json_number_value(value));
  } else {
    snprintf(out, size, "%.*f", digits, json_number_value(value));
  }
}

// A training job's status line (without the terminal's \r or the log's \n).
static void train_line_format(json_t* job, char* out, size_t size) {
  json_t* t = json_object_get(job, "training");
  json_int_t step = json_integer_value(json_object_get(t, "outer_step"));
  json_int_t steps = json_integer_value(json_object_get(t, "outer_loop_steps"));
  json_int_t wire = json_integer_value(json_object_get(t, "wire_bytes"));
  const char* state = json_string_value(json_object_get(job, "state"));
  char bar[SUBMIT_BAR_WIDTH + 1];
  bar_format(step, steps, bar);
  char loss_text[32], rate_text[32], val_text[32], lr_text[32];
  number_format(json_object_get(t, "loss"), 4, false, loss_text,
                sizeof(loss_text));
  number_format(json_object_get(t, "tokens_per_s"), 0, false, rate_text,
                sizeof(rate_text));
  // The held-out loss (from the last evaluation) and the inner rate of the
  // last inner step (the schedule).
  number_format(json_object_get(t, "val_loss"), 4, false, val_text,
                sizeof(val_text));
  number_format(json_object_get(t, "lr"), 2, true, lr_text, sizeof(lr_text));
  snprintf(out, size,
           "[%s] step %lld/%lld loss %s val %s lr %s tok/s %s wire %.2f MiB "
           "%s",
           bar, (long long)step, (long long)steps, loss_text, val_text, lr_text,
           rate_text, (double)wire / (1024.0 * 1024.0), state ? state : "?");
}

// What decides "changed" for a training job: its state and whole progress
// object.
static void train_change_key(json_t* job, char* out, size_t size) {
  const char* state = json_string_value(json_object_get(job, "state"));
  char* line = json_dumps(json_object_get(job, "training"), JSON_COMPACT);
  snprintf(out, size, "%s %s", state ? state : "", line ? line : "");
  pcp_libc_free(line);  // json_dumps
}

// The end of a run: its final held-out loss, when it has one.
static void train_summary_print(json_t* job) {
  json_t* val = json_object_get(json_object_get(job, "training"), "val_loss");
  if (json_is_number(val)) {
    printf("final val_loss %.4f\n", json_number_value(val));
  }
}

// An RL job's status line from its "rl" progress (docs/rl.md, "Running an
// RL job"); before the first iteration the experiment gives the total.
static void rl_line_format(json_t* job, char* out, size_t size) {
  json_t* rl = json_object_get(job, "rl");
  json_int_t iteration = json_integer_value(json_object_get(rl, "iteration"));
  json_t* total_json = json_object_get(rl, "num_iterations");
  if (!json_is_integer(total_json)) {
    total_json = json_object_get(
        json_object_get(json_object_get(job, "spec"), "experiment"),
        "num_iterations");
  }
  json_int_t total = json_integer_value(total_json);
  const char* state = json_string_value(json_object_get(job, "state"));
  char bar[SUBMIT_BAR_WIDTH + 1];
  bar_format(iteration, total, bar);
  char mean[32], std[32], kl[32], clip[32], rate[32], eval[48] = "";
  number_format(json_object_get(rl, "reward_mean"), 3, false, mean,
                sizeof(mean));
  number_format(json_object_get(rl, "reward_std"), 3, false, std, sizeof(std));
  number_format(json_object_get(rl, "kl"), 4, false, kl, sizeof(kl));
  number_format(json_object_get(rl, "clip_fraction"), 3, false, clip,
                sizeof(clip));
  number_format(json_object_get(rl, "tokens_per_second"), 0, false, rate,
                sizeof(rate));
  json_t* eval_mean = json_object_get(rl, "eval_reward_mean");
  if (json_is_number(eval_mean)) {
    snprintf(eval, sizeof(eval), " eval %.3f", json_number_value(eval_mean));
  }
  snprintf(out, size,
           "[%s] iter %lld/%lld reward %s +- %s kl %s clip %s tok/s %s%s %s",
           bar, (long long)iteration, (long long)total, mean, std, kl, clip,
           rate, eval, state ? state : "?");
}

// The "rl" object carries up to 1,000 history points, too long to compare
// whole: what is printed is what decides "changed".
static void rl_change_key(json_t* job, char* out, size_t size) {
  rl_line_format(job, out, size);
}

static void rl_summary_print(json_t* job) {
  json_t* rl = json_object_get(job, "rl");
  json_t* mean = json_object_get(rl, "reward_mean");
  json_t* eval_mean = json_object_get(rl, "eval_reward_mean");
  const char* served = json_string_value(json_object_get(rl, "served_model"));
  if (json_is_number(mean)) {
    printf("final reward_mean %.4f", json_number_value(mean));
    if (json_is_number(eval_mean)) {
      printf(" eval_reward_mean %.4f", json_number_value(eval_mean));
    }
    printf("\n");
  }
  if (served && served[0]) {
    printf("policy served as model %s\n", served);
  }
}

// What differs between `submit train` and `submit rl`.
typedef struct submit_kind_t {
  const char* name;       // the positional: "train", "rl"
  const char* post_path;  // the route the experiment is posted to
  const char* get_path;   // followed at get_path + the job id
  void (*line_format)(json_t* job, char* out, size_t size);
  void (*change_key)(json_t* job, char* out, size_t size);
  void (*summary_print)(json_t* job);
} submit_kind_t;

static const submit_kind_t kKinds[] = {
    {.name = "train",
     .post_path = "/v1/training/jobs",
     .get_path = "/v1/training/jobs/",
     .line_format = train_line_format,
     .change_key = train_change_key,
     .summary_print = train_summary_print},
    // The generic job route: it folds the kind's live progress ("rl") into
    // the job, so the client needs no RL-specific GET.
    {.name = "rl",
     .post_path = "/v1/rl/jobs",
     .get_path = "/v1/jobs/",
     .line_format = rl_line_format,
     .change_key = rl_change_key,
     .summary_print = rl_summary_print},
};

static const submit_kind_t* kind_find(const char* name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kKinds); ++i) {
    if (strcmp(kKinds[i].name, name) == 0) {
      return &kKinds[i];
    }
  }
  return NULL;
}

// One status line, rewritten in place on a terminal and appended otherwise
// (logs of CI runs stay readable).
static void progress_print(const submit_kind_t* kind, json_t* job, bool tty) {
  char line[1024];
  kind->line_format(job, line, sizeof(line));
  printf("%s%s%s", tty ? "\r" : "", line, tty ? "\033[K" : "\n");
  fflush(stdout);
}

static bool state_is_terminal(const char* state) {
  return state &&
         (strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 ||
          strcmp(state, "cancelled") == 0);
}

// Ctrl-C while following: the job is not cancelled (Ctrl-C ends the
// client, not the work; `POST /v1/jobs/{id}/cancel` does that), and the
// exit code is the shell's 128 + SIGINT. The message is formatted before
// the handler is installed: the handler only write()s and _exit()s, both
// async-signal-safe.
static char g_interrupt_message[512];
static size_t g_interrupt_message_length = 0;

static void on_sigint(int signal_number) {
  (void)signal_number;
  ssize_t ignored =
      write(STDOUT_FILENO, g_interrupt_message, g_interrupt_message_length);
  (void)ignored;
  _exit(130);
}

static void sigint_install(const char* gateway, const char* id, bool tty) {
  int n = snprintf(g_interrupt_message, sizeof(g_interrupt_message),
                   "%sinterrupted: job %s keeps running (cancel: POST "
                   "%s/v1/jobs/%s/cancel)\n",
                   tty ? "\n" : "", id, gateway, id);
  g_interrupt_message_length = n < 0 ? 0
                                     : ((size_t)n < sizeof(g_interrupt_message)
                                            ? (size_t)n
                                            : sizeof(g_interrupt_message) - 1);
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  // Best effort: without the handler the default action still ends the
  // process with the same meaning.
  (void)sigaction(SIGINT, &action, NULL);
}

static int submit_follow(const submit_kind_t* kind,
                         const submit_options_t* options, const char* path) {
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
  snprintf(url, sizeof(url), "%s%s", options->gateway, kind->post_path);
  int http_status = 0;
  json_t* job = NULL;
  status = request_json(client, "POST", url, token, text, length, &http_status,
                        &job);
  pcp_allocator_free(pcp_allocator_system(), text);
  if (status) {
    pcp_http_client_release(client);
    return report_error(status);
  }
  // The job JSON names its id "job_id"; "id" is accepted too.
  const char* id_text = json_string_value(json_object_get(job, "job_id"));
  if (!id_text) {
    id_text = json_string_value(json_object_get(job, "id"));
  }
  char id[256];
  snprintf(id, sizeof(id), "%s", id_text ? id_text : "");
  printf("job %s\n", id);
  fflush(stdout);
  int exit_code = 0;
  if (!options->no_follow) {
    bool tty = isatty(STDOUT_FILENO) != 0;
    sigint_install(options->gateway, id, tty);
    snprintf(url, sizeof(url), "%s%s%s", options->gateway, kind->get_path, id);
    pcp_clock_t clock = pcp_clock_system();
    int64_t deadline_ns =
        options->timeout_s > 0
            ? pcp_clock_now_ns(clock) + options->timeout_s * 1000000000
            : 0;
    char last_line[2048] = "";
    for (;;) {
      const char* state = json_string_value(json_object_get(job, "state"));
      // Print only when something changed, so a piped log stays short.
      char key[2048];
      kind->change_key(job, key, sizeof(key));
      if (strcmp(key, last_line) != 0) {
        progress_print(kind, job, tty);
        snprintf(last_line, sizeof(last_line), "%s", key);
      }
      if (state_is_terminal(state)) {
        if (tty) {
          printf("\n");
        }
        const char* error = json_string_value(json_object_get(job, "error"));
        printf("job %s %s%s%s\n", id, state, error ? ": " : "",
               error ? error : "");
        kind->summary_print(job);
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
    fflush(stdout);
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
    const submit_kind_t* kind =
        !status && positionals.count ? kind_find(positionals.items[0]) : NULL;
    if (!status && !kind) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "expected 'train EXP.json' or 'rl EXP.json'"
                               "%s%s%s",
                               positionals.count ? ", got '" : "",
                               positionals.count ? positionals.items[0] : "",
                               positionals.count ? "'" : "");
    } else if (!status && positionals.count != 2) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "expected one experiment file after '%s', "
                               "got %zu",
                               kind->name, positionals.count - 1);
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
      exit_code = submit_follow(kind, &options, positionals.items[1]);
    }
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
