// SPDX-License-Identifier: Apache-2.0
//
// tokenizer_tool: drives the tokenizer from the command line for the
// equivalence test (tests/tokenizer/equivalence_test.py) and by hand.
//
//   tokenizer_tool TOKENIZER_JSON encode FILE     ids of the whole file
//   tokenizer_tool TOKENIZER_JSON lines FILE      ids per line (no '\n')
//   tokenizer_tool TOKENIZER_JSON decode FILE     FILE: ids per line; prints
//   tokenizer_tool TOKENIZER_JSON decode-skip FILE  the text of each in hex
//   tokenizer_tool TOKENIZER_JSON roundtrip FILE  decode(encode(x)) == x for
//                                                 each line and the file
//   tokenizer_tool TOKENIZER_JSON chat FILE       FILE: one JSON object per
//       line {"messages": [{"role", "content"}], "add_generation_prompt",
//       "default_system_prompt", "qwen3_reasoning", "disable_thinking"};
//       prints the rendered text in hex, then its ids, per object

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer/tokenizer.h"

static int fail(pcp_status_t status, const char* what) {
  char buffer[1024];
  pcp_status_format(status, buffer, sizeof(buffer));
  fprintf(stderr, "tokenizer_tool: %s: %s\n", what, buffer);
  pcp_status_ignore(status);
  return 1;
}

static void print_ids(const pcp_tokenizer_id_list_t* ids) {
  for (size_t i = 0; i < ids->count; ++i) {
    printf(i ? " %d" : "%d", ids->values[i]);
  }
  putchar('\n');
}

static bool roundtrip_one(const pcp_tokenizer_t* t, pcp_tokenizer_encoder_t* e,
                          pcp_string_view_t text, size_t line,
                          pcp_allocator_t allocator) {
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(allocator, &ids);
  pcp_string_builder_t out;
  pcp_string_builder_initialize(allocator, 0, &out);
  // A failed call (out of memory, a limit) is reported, never an abort.
  pcp_status_t status = pcp_tokenizer_encoder_encode(e, text, &ids);
  if (!status) {
    status = pcp_tokenizer_decode(t, ids.values, ids.count,
                                  PCP_TOKENIZER_DECODE_FLAG_NONE, &out);
  }
  bool ok = !status && out.size == text.size &&
            memcmp(out.data ? out.data : "", text.data, text.size) == 0;
  if (status) {
    fail(status, "roundtrip");
  } else if (!ok) {
    fprintf(stderr, "roundtrip mismatch at line %zu\n", line);
  }
  pcp_string_builder_deinitialize(&out);
  pcp_tokenizer_id_list_deinitialize(&ids);
  return ok;
}

static int chat_one(pcp_tokenizer_encoder_t* e, const char* json_line,
                    pcp_allocator_t allocator) {
  json_error_t error;
  json_t* root = json_loads(json_line, 0, &error);
  if (!root) {
    fprintf(stderr, "tokenizer_tool: chat JSON: %s\n", error.text);
    return 1;
  }
  const json_t* list = json_object_get(root, "messages");
  size_t count = json_array_size(list);
  // json_array_size counts objects already in memory: no overflow.
  pcp_tokenizer_chat_message_t* messages = NULL;
  pcp_status_t alloc_status = pcp_allocator_calloc(
      allocator, (count ? count : 1) * sizeof(*messages), (void**)&messages);
  if (alloc_status) {
    json_decref(root);
    return fail(alloc_status, "chat messages");
  }
  for (size_t i = 0; i < count; ++i) {
    const json_t* m = json_array_get(list, i);
    const json_t* content = json_object_get(m, "content");
    if (!pcp_tokenizer_chat_role_parse(pcp_make_cstring_view(json_string_value(
                                           json_object_get(m, "role"))),
                                       &messages[i].role)) {
      fprintf(stderr, "tokenizer_tool: chat: bad role in message %zu\n", i);
      return 1;
    }
    messages[i].content = pcp_make_string_view(json_string_value(content),
                                               json_string_length(content));
  }
  pcp_tokenizer_chat_options_t options = {
      .add_generation_prompt =
          json_is_true(json_object_get(root, "add_generation_prompt")),
      .qwen3_reasoning = json_is_true(json_object_get(root, "qwen3_reasoning")),
      .disable_thinking =
          json_is_true(json_object_get(root, "disable_thinking")),
  };
  const json_t* system = json_object_get(root, "default_system_prompt");
  if (json_is_string(system)) {
    options.default_system_prompt = pcp_make_string_view(
        json_string_value(system), json_string_length(system));
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(allocator, 0, &text);
  pcp_status_t status =
      pcp_tokenizer_chat_render(messages, count, &options, &text);
  if (status) {
    pcp_string_builder_deinitialize(&text);
    pcp_allocator_free(allocator, messages);
    json_decref(root);
    return fail(status, "chat render");
  }
  for (size_t i = 0; i < text.size; ++i) {
    printf("%02x", (unsigned char)text.data[i]);
  }
  putchar('\n');
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(allocator, &ids);
  status = pcp_tokenizer_chat_encode(e, messages, count, &options, &ids);
  if (status)
    return fail(status, "chat encode");
  print_ids(&ids);
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_string_builder_deinitialize(&text);
  pcp_allocator_free(allocator, messages);
  json_decref(root);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr,
            "usage: tokenizer_tool TOKENIZER_JSON "
            "encode|lines|decode|decode-skip|roundtrip FILE\n");
    return 2;
  }
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_tokenizer_t* t = NULL;
  pcp_status_t status =
      pcp_tokenizer_create_from_file(argv[1], NULL, allocator, &t);
  if (status)
    return fail(status, "load");
  void* data = NULL;
  size_t size = 0;
  status = pcp_file_read_all(argv[3], (size_t)1 << 30, &data, &size);
  if (status)
    return fail(status, "read");
  pcp_tokenizer_encoder_t* e = NULL;
  status = pcp_tokenizer_encoder_create(t, allocator, &e);
  if (status)
    return fail(status, "encoder");
  const char* mode = argv[2];
  const char* text = data;
  int rc = 0;
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(allocator, &ids);
  if (strcmp(mode, "encode") == 0) {
    status =
        pcp_tokenizer_encoder_encode(e, pcp_make_string_view(text, size), &ids);
    if (status)
      return fail(status, "encode");
    print_ids(&ids);
  } else if (strcmp(mode, "lines") == 0 || strcmp(mode, "roundtrip") == 0) {
    bool roundtrip = strcmp(mode, "roundtrip") == 0;
    size_t start = 0, line = 0;
    while (start < size) {
      const char* nl = memchr(text + start, '\n', size - start);
      size_t end = nl ? (size_t)(nl - text) : size;
      pcp_string_view_t v = pcp_make_string_view(text + start, end - start);
      if (roundtrip) {
        if (!roundtrip_one(t, e, v, line, allocator))
          rc = 1;
      } else {
        ids.count = 0;
        status = pcp_tokenizer_encoder_encode(e, v, &ids);
        if (status)
          return fail(status, "encode");
        print_ids(&ids);
      }
      start = end + 1;
      ++line;
    }
    if (roundtrip) {
      if (!roundtrip_one(t, e, pcp_make_string_view(text, size), line,
                         allocator))
        rc = 1;
      printf(rc ? "roundtrip FAILED\n" : "roundtrip ok\n");
    }
  } else if (strcmp(mode, "decode") == 0 || strcmp(mode, "decode-skip") == 0) {
    pcp_tokenizer_decode_flags_t flags =
        strcmp(mode, "decode-skip") == 0
            ? PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL
            : PCP_TOKENIZER_DECODE_FLAG_NONE;
    char* cursor = data;
    char* line_end;
    while (*cursor) {
      line_end = strchr(cursor, '\n');
      if (line_end)
        *line_end = '\0';
      ids.count = 0;
      char* p = cursor;
      for (;;) {
        char* next;
        long v = strtol(p, &next, 10);
        if (next == p)
          break;
        status = pcp_tokenizer_id_list_append(&ids, (int32_t)v);
        if (status)
          return fail(status, "decode ids");
        p = next;
      }
      pcp_string_builder_t out;
      pcp_string_builder_initialize(allocator, 0, &out);
      status = pcp_tokenizer_decode(t, ids.values, ids.count, flags, &out);
      if (status)
        return fail(status, "decode");
      for (size_t i = 0; i < out.size; ++i) {
        printf("%02x", (unsigned char)out.data[i]);
      }
      putchar('\n');
      pcp_string_builder_deinitialize(&out);
      if (!line_end)
        break;
      cursor = line_end + 1;
    }
  } else if (strcmp(mode, "chat") == 0) {
    char* cursor = data;
    while (*cursor && rc == 0) {
      char* line_end = strchr(cursor, '\n');
      if (line_end)
        *line_end = '\0';
      if (*cursor)
        rc = chat_one(e, cursor, allocator);
      if (!line_end)
        break;
      cursor = line_end + 1;
    }
  } else {
    fprintf(stderr, "tokenizer_tool: unknown mode '%s'\n", mode);
    rc = 2;
  }
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_encoder_release(e);
  pcp_tokenizer_release(t);
  pcp_libc_free(data);  // pcp_file_read_all's buffer
  return rc;
}
