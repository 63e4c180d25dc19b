// SPDX-License-Identifier: Apache-2.0
#include "config/config.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

//===----------------------------------------------------------------------===//
// A table with every type
//===----------------------------------------------------------------------===//

typedef struct limits_t {
  bool present;  // OBJECT convention: first member
  char* name;
  int64_t count;
} limits_t;

typedef struct sample_t {
  bool verbose;
  int64_t port;
  double ratio;
  char* host;
  int32_t backend;
  pcp_string_list_t inputs;
  char* token_env;
  char* secret_internal;
  char* needed;
  bool help;
  char* file_only;
  limits_t limits;
} sample_t;

static const char* const kBackends[] = {"cpu", "cuda", "rocm", NULL};

static pcp_status_t validate_count(const void* config,
                                   const pcp_config_field_t* field) {
  const limits_t* limits = (const limits_t*)config;
  if (limits->count % 2 != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s must be even",
                           field->name);
  }
  return pcp_ok_status();
}

static const pcp_config_field_t kLimitsFields[] = {
    {.name = "name",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(limits_t, name),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .help = "limit name"},
    {.name = "count",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(limits_t, count),
     .default_value = "4",
     .min = 0,
     .max = 100,
     .help = "count",
     .validate = validate_count},
};
static const pcp_config_table_t kLimitsTable = {
    "limits", kLimitsFields, PCP_ARRAYSIZE(kLimitsFields), NULL};

static const pcp_config_field_t kSampleFields[] = {
    {.name = "verbose",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(sample_t, verbose),
     .help = "talk more"},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(sample_t, port),
     .default_value = "8080",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "TCP port"},
    {.name = "listen-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(sample_t, port),
     .min = 1,
     .max = 65535,
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "old name"},
    {.name = "bind-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, host),
     .flags = PCP_CONFIG_FLAG_RENAMED},
    {.name = "ratio",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(sample_t, ratio),
     .default_value = "0.5",
     .min = 0,
     .max = 1,
     .help = "a fraction"},
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, host),
     .default_value = "127.0.0.1",
     .help = "host name"},
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(sample_t, backend),
     .default_value = "cpu",
     .enum_values = kBackends,
     .help = "device kind"},
    {.name = "input",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(sample_t, inputs),
     .default_value = "a,b",
     .help = "input files"},
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .help = "env var with the token"},
    {.name = "secret-internal",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, secret_internal),
     .flags = PCP_CONFIG_FLAG_HIDDEN,
     .help = "internal"},
    {.name = "needed",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, needed),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .help = "must be given"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(sample_t, help),
     .flags = PCP_CONFIG_FLAG_CLI_ONLY,
     .help = "print help"},
    {.name = "file-only",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(sample_t, file_only),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "json only"},
    {.name = "limits",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(sample_t, limits),
     .object_table = &kLimitsTable,
     .help = "nested"},
};

static pcp_status_t validate_sample(const void* config) {
  const sample_t* sample = (const sample_t*)config;
  if (sample->backend == 1 && sample->port == 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "cuda cannot use port 1");
  }
  return pcp_ok_status();
}

static const pcp_config_table_t kSampleTable = {
    "sample", kSampleFields, PCP_ARRAYSIZE(kSampleFields), validate_sample};

// Returns the message of |status| (copied) and consumes it.
static char* take_message(pcp_status_t status) {
  assert_non_null(status);
  char* message = strdup(pcp_status_message(status));
  pcp_status_ignore(status);
  return message;
}

static void assert_message(pcp_status_t status, pcp_status_code_t code,
                           const char* expected_substring) {
  assert_non_null(status);
  assert_int_equal(pcp_status_code(status), code);
  char* message = take_message(status);
  if (!strstr(message, expected_substring)) {
    fail_msg("message '%s' lacks '%s'", message, expected_substring);
  }
  free(message);
}

static int setup_sample(void** state) {
  sample_t* sample = calloc(1, sizeof(sample_t));
  PCP_CHECK_OK(pcp_config_initialize(&kSampleTable, sample));
  *state = sample;
  return 0;
}

static int teardown_sample(void** state) {
  pcp_config_deinitialize(&kSampleTable, *state);
  free(*state);
  return 0;
}

static pcp_status_t parse(sample_t* sample, pcp_string_list_t* positionals,
                          int argc, ...) {
  char* argv[32];
  va_list args;
  va_start(args, argc);
  for (int i = 0; i < argc; ++i) {
    argv[i] = va_arg(args, char*);
  }
  va_end(args);
  return pcp_config_parse_argv(&kSampleTable, argc, argv, sample, positionals);
}

static pcp_status_t parse_json(sample_t* sample, const char* text,
                               pcp_string_list_t* unknown) {
  return pcp_config_parse_json(&kSampleTable, text, strlen(text), sample,
                               unknown);
}

//===----------------------------------------------------------------------===//
// Defaults and types
//===----------------------------------------------------------------------===//

static void defaults_are_applied(void** state) {
  sample_t* s = *state;
  assert_false(s->verbose);
  assert_int_equal(s->port, 8080);
  assert_true(s->ratio == 0.5);
  assert_string_equal(s->host, "127.0.0.1");
  assert_int_equal(s->backend, 0);
  assert_int_equal(s->inputs.count, 2);
  assert_string_equal(s->inputs.items[1], "b");
  assert_null(s->token_env);
  assert_null(s->needed);
  assert_false(s->limits.present);
  assert_int_equal(s->limits.count, 4);
}

static void bad_default_fails_initialize(void** state) {
  (void)state;
  static const pcp_config_field_t kBad[] = {
      {.name = "port",
       .type = PCP_CONFIG_TYPE_INT64,
       .offset = offsetof(sample_t, port),
       .default_value = "99999",
       .min = 1,
       .max = 65535},
  };
  static const pcp_config_table_t kBadTable = {"bad", kBad, 1, NULL};
  sample_t s;
  memset(&s, 0, sizeof(s));
  assert_message(pcp_config_initialize(&kBadTable, &s),
                 PCP_STATUS_INVALID_ARGUMENT, "default of 'port'");
}

static void cli_sets_every_type(void** state) {
  sample_t* s = *state;
  assert_null(parse(s, NULL, 10, "--verbose", "--port", "9000", "--ratio=0.25",
                    "--host", "example.org", "--backend=cuda", "--input", "x",
                    "--input=y"));
  assert_true(s->verbose);
  assert_int_equal(s->port, 9000);
  assert_true(s->ratio == 0.25);
  assert_string_equal(s->host, "example.org");
  assert_int_equal(s->backend, 1);
  // The command line replaces the default list; repeats append.
  assert_int_equal(s->inputs.count, 2);
  assert_string_equal(s->inputs.items[0], "x");
  assert_string_equal(s->inputs.items[1], "y");
  assert_null(parse(s, NULL, 1, "--verbose=false"));
  assert_false(s->verbose);
  assert_null(parse(s, NULL, 1, "--verbose=yes"));
  assert_true(s->verbose);
  assert_message(parse(s, NULL, 1, "--verbose=maybe"),
                 PCP_STATUS_INVALID_ARGUMENT, "expected true or false");
}

static void dashes_and_underscores_are_equal(void** state) {
  sample_t* s = *state;
  assert_null(parse(s, NULL, 2, "--api_token_env", "MY_TOKEN"));
  assert_string_equal(s->token_env, "MY_TOKEN");
  assert_null(pcp_config_set(&kSampleTable, s, "api_token-env", "OTHER"));
  assert_string_equal(s->token_env, "OTHER");
  assert_message(pcp_config_set(&kSampleTable, s, "nope", "1"),
                 PCP_STATUS_NOT_FOUND, "no field 'nope'");
}

static void numbers_are_checked(void** state) {
  sample_t* s = *state;
  assert_message(parse(s, NULL, 2, "--port", "abc"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--port': expected an integer, got 'abc'");
  assert_message(parse(s, NULL, 2, "--port", " 80"),
                 PCP_STATUS_INVALID_ARGUMENT, "expected an integer");
  assert_message(parse(s, NULL, 2, "--port", "80x"),
                 PCP_STATUS_INVALID_ARGUMENT, "expected an integer");
  assert_message(parse(s, NULL, 2, "--port", "99999999999999999999999"),
                 PCP_STATUS_INVALID_ARGUMENT, "expected an integer");
  assert_message(parse(s, NULL, 2, "--port", "70000"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--port': 70000 is out of range [1, 65535]");
  assert_message(parse(s, NULL, 2, "--port", "0"), PCP_STATUS_INVALID_ARGUMENT,
                 "out of range [1, 65535]");
  assert_message(parse(s, NULL, 1, "--ratio=1.5"), PCP_STATUS_INVALID_ARGUMENT,
                 "out of range [0, 1]");
  assert_message(parse(s, NULL, 1, "--ratio=nan"), PCP_STATUS_INVALID_ARGUMENT,
                 "expected a number");
  assert_message(parse(s, NULL, 1, "--ratio=inf"), PCP_STATUS_INVALID_ARGUMENT,
                 "expected a number");
  assert_null(parse(s, NULL, 1, "--port=1"));
  assert_null(parse(s, NULL, 1, "--port=65535"));
  assert_int_equal(s->port, 65535);
}

static void enums_list_allowed_values(void** state) {
  sample_t* s = *state;
  assert_message(parse(s, NULL, 2, "--backend", "tpu"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--backend': invalid value 'tpu' (allowed: cpu, cuda, "
                 "rocm)");
  assert_null(parse(s, NULL, 2, "--backend", "rocm"));
  assert_int_equal(s->backend, 2);
}

static void unknown_and_missing_flags(void** state) {
  sample_t* s = *state;
  assert_message(parse(s, NULL, 1, "--foo"), PCP_STATUS_INVALID_ARGUMENT,
                 "unknown flag '--foo'");
  assert_message(parse(s, NULL, 1, "--foo=1"), PCP_STATUS_INVALID_ARGUMENT,
                 "unknown flag '--foo'");
  assert_message(parse(s, NULL, 1, "-p"), PCP_STATUS_INVALID_ARGUMENT,
                 "unknown flag '-p'");
  assert_message(parse(s, NULL, 1, "--port"), PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--port' needs a value");
  assert_message(parse(s, NULL, 3, "--port", "--host", "x"),
                 PCP_STATUS_INVALID_ARGUMENT, "flag '--port' needs a value");
  // JSON-only fields and objects are not flags.
  assert_message(parse(s, NULL, 2, "--file-only", "x"),
                 PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--file-only'");
  assert_message(parse(s, NULL, 2, "--limits", "x"),
                 PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--limits'");
  // An empty value is a value.
  assert_null(parse(s, NULL, 1, "--host="));
  assert_string_equal(s->host, "");
}

static void positionals_and_double_dash(void** state) {
  sample_t* s = *state;
  pcp_string_list_t positionals = {0};
  assert_null(parse(s, &positionals, 7, "one", "--port", "81", "-", "--",
                    "--port", "two"));
  assert_int_equal(s->port, 81);
  assert_int_equal(positionals.count, 4);
  assert_string_equal(positionals.items[0], "one");
  assert_string_equal(positionals.items[1], "-");
  assert_string_equal(positionals.items[2], "--port");
  assert_string_equal(positionals.items[3], "two");
  pcp_string_list_deinitialize(&positionals);
  assert_message(parse(s, NULL, 1, "stray"), PCP_STATUS_INVALID_ARGUMENT,
                 "unexpected argument 'stray'");
}

static void required_and_validate_hooks(void** state) {
  sample_t* s = *state;
  assert_message(pcp_config_validate(&kSampleTable, s),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "missing required flag '--needed'");
  assert_null(parse(s, NULL, 2, "--needed", "yes"));
  assert_null(pcp_config_validate(&kSampleTable, s));
  assert_null(parse(s, NULL, 4, "--backend", "cuda", "--port", "1"));
  assert_message(pcp_config_validate(&kSampleTable, s),
                 PCP_STATUS_INVALID_ARGUMENT, "cuda cannot use port 1");
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

static void json_sets_every_type(void** state) {
  sample_t* s = *state;
  pcp_string_list_t unknown = {0};
  assert_null(parse_json(
      s,
      "{\"verbose\": true, \"port\": 443, \"ratio\": 1, \"host\": \"h\","
      " \"backend\": \"rocm\", \"input\": [\"p\", \"q\", \"r\"],"
      " \"api-token-env\": \"TOK\", \"needed\": \"n\", \"file_only\": \"f\","
      " \"limits\": {\"name\": \"l\", \"count\": 6, \"extra\": 1},"
      " \"mystery\": {\"deep\": [1]}, \"help\": true}",
      &unknown));
  assert_true(s->verbose);
  assert_int_equal(s->port, 443);
  assert_true(s->ratio == 1.0);
  assert_string_equal(s->host, "h");
  assert_int_equal(s->backend, 2);
  assert_int_equal(s->inputs.count, 3);
  assert_string_equal(s->token_env, "TOK");
  assert_string_equal(s->file_only, "f");
  assert_true(s->limits.present);
  assert_string_equal(s->limits.name, "l");
  assert_int_equal(s->limits.count, 6);
  // CLI-only fields are unknown keys in JSON.
  assert_false(s->help);
  assert_int_equal(unknown.count, 3);
  assert_string_equal(unknown.items[0], "limits.extra");
  assert_string_equal(unknown.items[1], "mystery");
  assert_string_equal(unknown.items[2], "help");
  pcp_string_list_deinitialize(&unknown);
  assert_null(pcp_config_validate(&kSampleTable, s));
  // Unknown keys are fine without a list to report them to.
  assert_null(parse_json(s, "{\"zzz\": 1}", NULL));
}

static void json_wrong_types_name_the_key(void** state) {
  sample_t* s = *state;
  assert_message(parse_json(s, "{\"port\": \"80\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "sample: key 'port': expected an integer, got a string");
  assert_message(parse_json(s, "{\"port\": 80.5}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "expected an integer");
  assert_message(parse_json(s, "{\"port\": 0}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "key 'port': 0 is out of range [1, 65535]");
  assert_message(parse_json(s, "{\"verbose\": 1}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "key 'verbose': expected true");
  assert_message(parse_json(s, "{\"ratio\": \"x\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "expected a number");
  assert_message(parse_json(s, "{\"host\": 5}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "key 'host': expected a string");
  assert_message(parse_json(s, "{\"backend\": \"tpu\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "(allowed: cpu, cuda, rocm)");
  assert_message(parse_json(s, "{\"input\": \"x\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "expected an array of strings");
  assert_message(parse_json(s, "{\"input\": [\"x\", 2]}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "key 'input'[1]: expected a string");
  assert_message(parse_json(s, "{\"limits\": []}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "key 'limits': expected an object");
  assert_message(parse_json(s, "{\"limits\": {\"count\": 101}}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "key 'limits.count': 101 is out");
  assert_message(parse_json(s, "[1]", NULL), PCP_STATUS_INVALID_ARGUMENT,
                 "expected a JSON object at the top level");
  assert_message(parse_json(s, "{\"port\": 1,}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "invalid JSON at line 1");
  assert_message(parse_json(s, "{\"port\": 1, \"port\": 2}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "invalid JSON");
  assert_message(parse_json(s, "", NULL), PCP_STATUS_INVALID_ARGUMENT,
                 "invalid JSON");
}

static void json_null_restores_default(void** state) {
  sample_t* s = *state;
  assert_null(parse_json(
      s, "{\"host\": \"x\", \"limits\": {\"name\": \"n\", \"count\": 8}}",
      NULL));
  assert_true(s->limits.present);
  assert_null(parse_json(s, "{\"host\": null, \"limits\": null}", NULL));
  assert_string_equal(s->host, "127.0.0.1");
  assert_false(s->limits.present);
  assert_null(s->limits.name);
  assert_int_equal(s->limits.count, 4);
}

static void json_nested_required_and_hooks(void** state) {
  sample_t* s = *state;
  assert_null(parse(s, NULL, 2, "--needed", "x"));
  // Absent object: its required fields are not checked.
  assert_null(pcp_config_validate(&kSampleTable, s));
  assert_null(parse_json(s, "{\"limits\": {}}", NULL));
  assert_message(pcp_config_validate(&kSampleTable, s),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "sample: missing required key 'limits.name'");
  assert_null(
      parse_json(s, "{\"limits\": {\"name\": \"a\", \"count\": 3}}", NULL));
  assert_message(pcp_config_validate(&kSampleTable, s),
                 PCP_STATUS_INVALID_ARGUMENT, "count must be even");
}

static char* nested_json(size_t depth) {
  char* text = malloc(depth * 8 + 32);
  size_t at = 0;
  for (size_t i = 0; i < depth; ++i) {
    at += (size_t)sprintf(text + at, "{\"a\":");
  }
  at += (size_t)sprintf(text + at, "1");
  for (size_t i = 0; i < depth; ++i) {
    text[at++] = '}';
  }
  text[at] = 0;
  return text;
}

static void json_depth_is_capped(void** state) {
  sample_t* s = *state;
  char* ok = nested_json(PCP_CONFIG_MAX_JSON_DEPTH);
  assert_null(parse_json(s, ok, NULL));
  free(ok);
  char* deep = nested_json(PCP_CONFIG_MAX_JSON_DEPTH + 1);
  assert_message(parse_json(s, deep, NULL), PCP_STATUS_INVALID_ARGUMENT,
                 "deeper than 64 levels");
  free(deep);
  // Arrays count as levels too.
  char text[512];
  size_t at = (size_t)sprintf(text, "{\"x\":");
  for (int i = 0; i < 70; ++i) {
    text[at++] = '[';
  }
  for (int i = 0; i < 70; ++i) {
    text[at++] = ']';
  }
  text[at++] = '}';
  text[at] = 0;
  assert_message(parse_json(s, text, NULL), PCP_STATUS_INVALID_ARGUMENT,
                 "deeper than");
}

static void json_size_is_capped(void** state) {
  sample_t* s = *state;
  size_t size = PCP_CONFIG_MAX_FILE_BYTES + 1;
  char* text = malloc(size + 1);
  memset(text, ' ', size);
  text[0] = '{';
  text[size - 1] = '}';
  text[size] = 0;
  assert_message(pcp_config_parse_json(&kSampleTable, text, size, s, NULL),
                 PCP_STATUS_RESOURCE_EXHAUSTED, "the limit is 1048576");
  // The same bytes as a file are refused before they are read.
  char path[] = "/tmp/pcp_config_test_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, size), (ssize_t)size);
  close(fd);
  assert_message(pcp_config_load_json_file(&kSampleTable, path, s, NULL),
                 PCP_STATUS_RESOURCE_EXHAUSTED, "the limit is 1048576");
  // Exactly at the cap is accepted.
  assert_int_equal(truncate(path, (off_t)(size - 1)), 0);
  fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, "}", 1, (off_t)(size - 2)), 1);
  close(fd);
  assert_null(pcp_config_load_json_file(&kSampleTable, path, s, NULL));
  unlink(path);
  free(text);
  assert_message(
      pcp_config_load_json_file(&kSampleTable, "/nonexistent/x.json", s, NULL),
      PCP_STATUS_NOT_FOUND, "/nonexistent/x.json");
}

static void json_string_limits(void** state) {
  sample_t* s = *state;
  size_t length = PCP_CONFIG_MAX_STRING_BYTES + 1;
  char* text = malloc(length + 32);
  size_t at = (size_t)sprintf(text, "{\"host\": \"");
  memset(text + at, 'x', length);
  at += length;
  strcpy(text + at, "\"}");
  assert_message(parse_json(s, text, NULL), PCP_STATUS_INVALID_ARGUMENT,
                 "longer than 65536 bytes");
  free(text);
  // NUL inside a string is refused by the parser.
  assert_message(parse_json(s, "{\"host\": \"a\\u0000b\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT, "invalid JSON");
}

//===----------------------------------------------------------------------===//
// Help and dump
//===----------------------------------------------------------------------===//

static char* capture_help(void) {
  char* text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_config_print_help(&kSampleTable, out);
  fclose(out);
  return text;
}

static void help_lists_visible_fields(void** state) {
  (void)state;
  char* text = capture_help();
  assert_non_null(strstr(text, "  --verbose "));
  assert_non_null(strstr(text, "talk more (default: false)"));
  assert_non_null(strstr(text, "  --port PORT "));
  assert_non_null(strstr(text, "TCP port (default: 8080)"));
  assert_non_null(strstr(text, "  --ratio X "));
  assert_non_null(strstr(text, "(default: 0.5)"));
  assert_non_null(strstr(text, "  --backend cpu|cuda|rocm "));
  assert_non_null(strstr(text, "(default: cpu)"));
  assert_non_null(strstr(text, "  --input VALUE "));
  assert_non_null(strstr(text, "(default: a,b)"));
  assert_non_null(strstr(text, "  --api-token-env ENV "));
  assert_non_null(strstr(text, "(default: none)"));
  assert_non_null(strstr(text, "must be given (required)"));
  assert_null(strstr(text, "secret-internal"));
  assert_null(strstr(text, "file-only"));
  assert_null(strstr(text, "limits"));
  free(text);
}

static void dump_prints_effective_config(void** state) {
  sample_t* s = *state;
  assert_null(
      parse(s, NULL, 4, "--api-token-env", "PCP_SECRET_TOKEN", "--port", "9"));
  setenv("PCP_SECRET_TOKEN", "hunter2", 1);
  char* text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_config_dump_json(&kSampleTable, s, out);
  fclose(out);
  assert_non_null(strstr(text, "\"port\": 9"));
  assert_non_null(strstr(text, "\"api_token_env\": \"PCP_SECRET_TOKEN\""));
  assert_null(strstr(text, "hunter2"));
  assert_non_null(strstr(text, "\"backend\": \"cpu\""));
  assert_non_null(strstr(text, "\"input\": [\n    \"a\",\n    \"b\"\n  ]"));
  assert_non_null(strstr(text, "\"needed\": null"));
  assert_non_null(strstr(text, "\"limits\": null"));
  // The dump reads back as the same config.
  sample_t copy;
  memset(&copy, 0, sizeof(copy));
  PCP_CHECK_OK(pcp_config_initialize(&kSampleTable, &copy));
  assert_null(parse_json(&copy, text, NULL));
  assert_int_equal(copy.port, 9);
  assert_string_equal(copy.token_env, "PCP_SECRET_TOKEN");
  pcp_config_deinitialize(&kSampleTable, &copy);
  free(text);
  unsetenv("PCP_SECRET_TOKEN");
}

static void aliases_write_the_same_member(void** state) {
  sample_t* s = *state;
  assert_int_equal(s->port, 8080);  // the alias has no default of its own
  assert_null(parse(s, NULL, 4, "--port", "1000", "--listen-port", "2000"));
  assert_int_equal(s->port, 2000);
  assert_null(parse(s, NULL, 4, "--listen-port", "2000", "--port", "1000"));
  assert_int_equal(s->port, 1000);
  assert_message(parse(s, NULL, 2, "--listen-port", "0"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--listen-port': 0 is out of range");
  assert_null(parse_json(s, "{\"listen_port\": 7}", NULL));
  assert_int_equal(s->port, 7);
  assert_null(parse_json(s, "{\"listen_port\": null}", NULL));
  assert_int_equal(s->port, 8080);
  char* text = capture_help();
  assert_non_null(strstr(text, "old name (alias of --port)"));
  free(text);
  text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_config_dump_json(&kSampleTable, s, out);
  fclose(out);
  assert_null(strstr(text, "listen_port"));
  free(text);
}

static void sections_dump_as_one_object(void** state) {
  sample_t* s = *state;
  assert_null(parse_json(s, "{\"limits\": {\"name\": \"n\"}}", NULL));
  pcp_config_section_t sections[] = {
      {"flags", &kSampleTable, s},
      {"limits", &kLimitsTable, &s->limits},
  };
  char* text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_config_dump_json_sections(sections, 2, out);
  fclose(out);
  assert_non_null(strstr(text, "{\n  \"flags\": {\n    \"verbose\": false,"));
  assert_non_null(strstr(text,
                         "\n  \"limits\": {\n    \"name\": \"n\",\n"
                         "    \"count\": 4\n  }\n}\n"));
  free(text);
}

static void usage_error_returns_two(void** state) {
  (void)state;
  int saved = dup(STDERR_FILENO);
  char path[] = "/tmp/pcp_config_stderr_XXXXXX";
  int fd = mkstemp(path);
  dup2(fd, STDERR_FILENO);
  int rc = pcp_config_cli_usage_error(
      "--worker",
      pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--foo'"));
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  assert_int_equal(rc, 2);
  char text[256] = {0};
  assert_true(pread(fd, text, sizeof(text) - 1, 0) > 0);
  close(fd);
  unlink(path);
  assert_string_equal(text,
                      "pcp --worker: unknown flag '--foo'\n"
                      "Try 'pcp --worker --help'.\n");
}

static void renamed_flags_name_the_new_one(void** state) {
  sample_t* s = *state;
  assert_message(parse(s, NULL, 2, "--bind-host", "h"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "flag '--bind-host' was renamed to '--host'");
  assert_message(parse(s, NULL, 1, "--bind-host=h"),
                 PCP_STATUS_INVALID_ARGUMENT, "renamed to '--host'");
  assert_message(parse_json(s, "{\"bind_host\": \"h\"}", NULL),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "key 'bind_host' was renamed to 'host'");
  assert_message(pcp_config_set(&kSampleTable, s, "bind-host", "h"),
                 PCP_STATUS_INVALID_ARGUMENT, "renamed to '--host'");
  assert_string_equal(s->host, "127.0.0.1");
  char* text = capture_help();
  assert_null(strstr(text, "bind-host"));
  free(text);
  text = NULL;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  pcp_config_dump_json(&kSampleTable, s, out);
  fclose(out);
  assert_null(strstr(text, "bind_host"));
  free(text);
  // A renamed name is never offered as a suggestion.
  assert_null(pcp_config_suggest_flag(&kSampleTable, "bind-hots"));
  assert_string_equal(pcp_config_suggest_flag(&kSampleTable, "hots"), "host");
}

static void unknown_flags_suggest_the_closest(void** state) {
  sample_t* s = *state;
  assert_message(parse(s, NULL, 2, "--prot", "1"), PCP_STATUS_INVALID_ARGUMENT,
                 "unknown flag '--prot' (did you mean '--port'?)");
  assert_message(parse(s, NULL, 1, "--verbsoe"), PCP_STATUS_INVALID_ARGUMENT,
                 "(did you mean '--verbose'?)");
  assert_message(parse(s, NULL, 1, "--api_tokn_env=X"),
                 PCP_STATUS_INVALID_ARGUMENT,
                 "unknown flag '--api_tokn_env' (did you mean "
                 "'--api-token-env'?)");
  assert_message(parse(s, NULL, 1, "-h"), PCP_STATUS_INVALID_ARGUMENT,
                 "did you mean '--help'?");
  pcp_status_t status = parse(s, NULL, 1, "--frobnicate");
  char* message = take_message(status);
  assert_string_equal(message, "unknown flag '--frobnicate'");
  free(message);
  // Hidden and JSON-only fields stay unmentioned.
  message = take_message(parse(s, NULL, 2, "--secret-internl", "x"));
  assert_null(strstr(message, "did you mean"));
  free(message);
  message = take_message(parse(s, NULL, 2, "--file-onl", "x"));
  assert_null(strstr(message, "did you mean"));
  free(message);
  static const char* const kWords[] = {"version", "help", "worker"};
  assert_string_equal(pcp_config_suggest("verison", kWords, 3), "version");
  assert_string_equal(pcp_config_suggest("hlep", kWords, 3), "help");
  assert_null(pcp_config_suggest("gateway", kWords, 3));
  assert_int_equal(pcp_config_edit_distance("verison", "version"), 1);
  assert_int_equal(pcp_config_edit_distance("api_port", "api-port"), 0);
  assert_int_equal(pcp_config_edit_distance("", "abc"), 3);
  assert_int_equal(pcp_config_edit_distance("kitten", "sitting"), 3);
  assert_true(pcp_config_has_flag(&kSampleTable, "api_token_env"));
  assert_false(pcp_config_has_flag(&kSampleTable, "file-only"));
}

// Runs |fn| with stderr captured; returns its exit code, text in |out|.
static int capture_stderr(int (*fn)(pcp_status_t), pcp_status_t status,
                          char* out, size_t capacity) {
  int saved = dup(STDERR_FILENO);
  char path[] = "/tmp/pcp_config_stderr_XXXXXX";
  int fd = mkstemp(path);
  dup2(fd, STDERR_FILENO);
  int rc = fn(status);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  memset(out, 0, capacity);
  assert_true(pread(fd, out, capacity - 1, 0) > 0);
  close(fd);
  unlink(path);
  return rc;
}

static int fail_run(pcp_status_t status) {
  return pcp_config_cli_failure("run", status);
}

static int usage_run(pcp_status_t status) {
  return pcp_config_cli_usage_error("run", status);
}

static void cli_messages_hide_internal_names(void** state) {
  (void)state;
  char text[512];
  pcp_log_set_level(PCP_LOG_INFO);
  int rc = capture_stderr(
      fail_run,
      pcp_status_annotate_f(
          pcp_make_status(PCP_STATUS_NOT_FOUND, "opening 'x.vmfb'"),
          "loading the program"),
      text, sizeof(text));
  assert_int_equal(rc, 1);
  assert_string_equal(text, "pcp run: opening 'x.vmfb'; loading the program\n");
  rc = capture_stderr(usage_run,
                      pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad"), text,
                      sizeof(text));
  assert_int_equal(rc, 2);
  assert_string_equal(text, "pcp run: bad\nTry 'pcp run --help'.\n");
  // A status without a message reads as its code in words.
  rc = capture_stderr(fail_run, pcp_make_status(PCP_STATUS_DATA_LOSS, NULL),
                      text, sizeof(text));
  assert_string_equal(text, "pcp run: data loss\n");
  // PCP_LOG_LEVEL=debug shows the code and the source location.
  pcp_log_set_level(PCP_LOG_DEBUG);
  rc = capture_stderr(fail_run, pcp_make_status(PCP_STATUS_NOT_FOUND, "gone"),
                      text, sizeof(text));
  pcp_log_set_level(PCP_LOG_INFO);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(text, "pcp run: NOT_FOUND: gone (config_test.c:"));
}

static void string_list_caps_items(void** state) {
  (void)state;
  pcp_string_list_t list = {0};
  for (int i = 0; i < (int)PCP_CONFIG_MAX_LIST_ITEMS; ++i) {
    assert_null(pcp_string_list_append(&list, "x"));
  }
  assert_message(pcp_string_list_append(&list, "x"),
                 PCP_STATUS_RESOURCE_EXHAUSTED, "more than 4096 items");
  pcp_string_list_deinitialize(&list);
  assert_int_equal(list.count, 0);
}

int main(void) {
#define T(name) \
  cmocka_unit_test_setup_teardown(name, setup_sample, teardown_sample)
  const struct CMUnitTest tests[] = {
      T(defaults_are_applied),
      cmocka_unit_test(bad_default_fails_initialize),
      T(cli_sets_every_type),
      T(dashes_and_underscores_are_equal),
      T(numbers_are_checked),
      T(enums_list_allowed_values),
      T(unknown_and_missing_flags),
      T(positionals_and_double_dash),
      T(required_and_validate_hooks),
      T(json_sets_every_type),
      T(json_wrong_types_name_the_key),
      T(json_null_restores_default),
      T(json_nested_required_and_hooks),
      T(json_depth_is_capped),
      T(json_size_is_capped),
      T(json_string_limits),
      cmocka_unit_test(help_lists_visible_fields),
      T(dump_prints_effective_config),
      T(aliases_write_the_same_member),
      T(sections_dump_as_one_object),
      cmocka_unit_test(usage_error_returns_two),
      cmocka_unit_test(string_list_caps_items),
      T(renamed_flags_name_the_new_one),
      T(unknown_flags_suggest_the_closest),
      cmocka_unit_test(cli_messages_hide_internal_names),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
