// SPDX-License-Identifier: Apache-2.0
//
// `pcp tokenize`: encode text to ids or decode ids to text with a
// tokenizer.json, for checking a tokenizer by hand and from scripts.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tokenizer/tokenizer.h"

// Larger inputs are refused by the tokenizer's own text limit anyway.
#define CLI_MAX_INPUT_BYTES ((size_t)64 << 20)

typedef struct tokenize_options_t {
  char* tokenizer;
  bool decode;
  bool skip_special;
  bool help;
} tokenize_options_t;

#define OFFSET(member) offsetof(tokenize_options_t, member)
static const pcp_config_field_t kFields[] = {
    {.name = "tokenizer",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(tokenizer),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "PATH",
     .help = "the tokenizer.json to use"},
    {.name = "decode",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(decode),
     .help = "read ids (separated by spaces or commas) and print the text"},
    {.name = "skip-special",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(skip_special),
     .help = "drop special tokens when decoding"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .flags = PCP_CONFIG_FLAG_CLI_ONLY,
     .help = "print these flags and exit (also -h)"},
};
#undef OFFSET

static const pcp_config_table_t kTable = {
    .name = "tokenize",
    .fields = kFields,
    .field_count = PCP_ARRAYSIZE(kFields),
};

static void print_usage(FILE* out) {
  fprintf(out,
          "usage: pcp tokenize --tokenizer tokenizer.json [--decode] "
          "[--skip-special] TEXT|@FILE\n\n"
          "Encodes TEXT (or the contents of FILE) and prints the ids on one "
          "line;\nwith --decode, reads ids and prints the text.\n\n"
          "flags:\n");
  pcp_config_print_help(&kTable, out);
}

// "pcp tokenize: <what>: <message>"; the work failed: exit 1.
static int report(pcp_status_t status, const char* what) {
  char message[1024];
  pcp_status_format_for_user(status, message, sizeof(message));
  fprintf(stderr, "pcp tokenize: %s: %s\n", what, message);
  pcp_status_ignore(status);
  return 1;
}

static int run_decode(const pcp_tokenizer_t* t, const char* text,
                      pcp_tokenizer_decode_flags_t flags,
                      pcp_allocator_t allocator) {
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(allocator, &ids);
  const char* p = text;
  int rc = 0;
  while (*p && rc == 0) {
    if (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') {
      ++p;
      continue;
    }
    int64_t id = 0;
    size_t length = strspn(p, "-0123456789");
    if (length == 0 ||
        !pcp_string_view_parse_int64(pcp_make_string_view(p, length), &id) ||
        id < INT32_MIN || id > INT32_MAX) {
      fprintf(stderr, "pcp tokenize: --decode: '%.20s' is not a token id\n", p);
      rc = 2;
      break;
    }
    pcp_status_t status = pcp_tokenizer_id_list_append(&ids, (int32_t)id);
    if (status)
      rc = report(status, "decode");
    p += length;
  }
  if (rc == 0) {
    pcp_string_builder_t out;
    pcp_string_builder_initialize(allocator, 0, &out);
    pcp_status_t status =
        pcp_tokenizer_decode(t, ids.values, ids.count, flags, &out);
    if (status) {
      rc = report(status, "decode");
    } else {
      fwrite(out.data ? out.data : "", 1, out.size, stdout);
      putchar('\n');
    }
    pcp_string_builder_deinitialize(&out);
  }
  pcp_tokenizer_id_list_deinitialize(&ids);
  return rc;
}

static int tokenize_run(const tokenize_options_t* options, const char* input,
                        pcp_allocator_t allocator);

int pcp_tokenizer_cli_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (strcmp(argv[i], "-h") == 0) {
      print_usage(stdout);
      return 0;
    }
  }
  tokenize_options_t options;
  memset(&options, 0, sizeof(options));
  pcp_string_list_t positionals = {0};
  pcp_status_t parse_status = pcp_config_initialize(&kTable, &options);
  if (!parse_status) {
    parse_status = pcp_config_parse_argv(&kTable, argc - 1, argv + 1, &options,
                                         &positionals);
  }
  int rc = 0;
  if (!parse_status && options.help) {
    print_usage(stdout);
  } else {
    if (!parse_status) {
      parse_status = pcp_config_validate(&kTable, &options);
    }
    if (!parse_status && positionals.count != 1) {
      parse_status = pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "expected one TEXT or @FILE argument, got %zu", positionals.count);
    }
    rc = parse_status ? pcp_config_cli_usage_error("tokenize", parse_status)
                      : tokenize_run(&options, positionals.items[0], allocator);
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return rc;
}

static int tokenize_run(const tokenize_options_t* options, const char* input,
                        pcp_allocator_t allocator) {
  const char* tokenizer_path = options->tokenizer;
  bool decode = options->decode;
  pcp_tokenizer_decode_flags_t flags =
      options->skip_special ? PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL
                            : PCP_TOKENIZER_DECODE_FLAG_NONE;
  void* file_data = NULL;
  size_t size = strlen(input);
  const char* text = input;
  if (input[0] == '@') {
    pcp_status_t status =
        pcp_file_read_all(input + 1, CLI_MAX_INPUT_BYTES, &file_data, &size);
    if (status)
      return report(status, input + 1);
    text = file_data;
  }
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status =
      pcp_tokenizer_create_from_file(tokenizer_path, NULL, allocator, &t);
  int rc = 0;
  if (status) {
    rc = report(status, "loading the tokenizer");
  } else if (decode) {
    rc = run_decode(t, text, flags, allocator);
  } else {
    pcp_tokenizer_id_list_t ids;
    pcp_tokenizer_id_list_initialize(allocator, &ids);
    status = pcp_tokenizer_encode(t, pcp_make_string_view(text, size), &ids);
    if (status) {
      rc = report(status, "encode");
    } else {
      for (size_t i = 0; i < ids.count; ++i) {
        printf(i ? " %d" : "%d", ids.values[i]);
      }
      putchar('\n');
    }
    pcp_tokenizer_id_list_deinitialize(&ids);
  }
  pcp_tokenizer_release(t);
  pcp_libc_free(file_data);  // pcp_file_read_all's buffer
  return rc;
}
