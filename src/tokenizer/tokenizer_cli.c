// SPDX-License-Identifier: Apache-2.0
//
// `pcp tokenize`: encode text to ids or decode ids to text with a
// tokenizer.json, for checking a tokenizer by hand and from scripts.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

// Larger inputs are refused by the tokenizer's own text limit anyway.
#define CLI_MAX_INPUT_BYTES ((size_t)64 << 20)

static void print_usage(FILE* out) {
  fprintf(out,
          "usage: pcp tokenize --tokenizer tokenizer.json [--decode] "
          "[--skip-special] TEXT|@FILE\n"
          "  encodes TEXT (or the contents of FILE) and prints the ids, one "
          "line;\n"
          "  --decode reads ids (separated by spaces or commas) and prints "
          "the text;\n"
          "  --skip-special drops special tokens when decoding.\n");
}

static int report(pcp_status_t status, const char* what) {
  char buffer[1024];
  pcp_status_format(status, buffer, sizeof(buffer));
  fprintf(stderr, "pcp tokenize: %s: %s\n", what, buffer);
  pcp_status_ignore(status);
  return 1;
}

static int run_decode(const pcp_tokenizer_t* t, const char* text,
                      pcp_tokenizer_decode_flags_t flags) {
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
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
      fprintf(stderr, "pcp tokenize: --decode: '%.20s' is not a token id\n",
              p);
      rc = 2;
      break;
    }
    pcp_status_t status = pcp_tokenizer_id_list_append(&ids, (int32_t)id);
    if (status) rc = report(status, "decode");
    p += length;
  }
  if (rc == 0) {
    pcp_string_builder_t out;
    pcp_string_builder_initialize(pcp_allocator_system(), 0, &out);
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

int pcp_tokenizer_cli_main(int argc, char** argv) {
  const char* tokenizer_path = NULL;
  const char* input = NULL;
  bool decode = false;
  pcp_tokenizer_decode_flags_t flags = PCP_TOKENIZER_DECODE_FLAG_NONE;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      print_usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
      tokenizer_path = argv[++i];
    } else if (strcmp(argv[i], "--decode") == 0) {
      decode = true;
    } else if (strcmp(argv[i], "--skip-special") == 0) {
      flags |= PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL;
    } else if (strncmp(argv[i], "--", 2) == 0 || input) {
      fprintf(stderr, "pcp tokenize: unexpected argument '%s'\n", argv[i]);
      print_usage(stderr);
      return 2;
    } else {
      input = argv[i];
    }
  }
  if (!tokenizer_path || !input) {
    print_usage(stderr);
    return 2;
  }
  void* file_data = NULL;
  size_t size = strlen(input);
  const char* text = input;
  if (input[0] == '@') {
    pcp_status_t status =
        pcp_file_read_all(input + 1, CLI_MAX_INPUT_BYTES, &file_data, &size);
    if (status) return report(status, input + 1);
    text = file_data;
  }
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status = pcp_tokenizer_create_from_file(
      tokenizer_path, NULL, pcp_allocator_system(), &t);
  int rc = 0;
  if (status) {
    rc = report(status, "loading the tokenizer");
  } else if (decode) {
    rc = run_decode(t, text, flags);
  } else {
    pcp_tokenizer_id_list_t ids;
    pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
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
  free(file_data);
  return rc;
}
