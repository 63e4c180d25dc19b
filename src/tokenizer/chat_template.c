// SPDX-License-Identifier: Apache-2.0
//
// The Qwen ChatML template, written out in C: the text the official Jinja
// template produces for text-only system/user/assistant conversations. No
// Jinja engine: the shape is fixed, and a template language would be a
// second parser to fuzz for one format.

#include <string.h>

#include "tokenizer/tokenizer.h"

static const char* const kRoleNames[] = {"system", "user", "assistant"};

bool pcp_tokenizer_chat_role_parse(pcp_string_view_t name,
                                   pcp_tokenizer_chat_role_t* out_role) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kRoleNames); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kRoleNames[i]))) {
      *out_role = (pcp_tokenizer_chat_role_t)i;
      return true;
    }
  }
  return false;
}

// Last occurrence of |needle| in |haystack|, or NULL.
static const char* find_last(pcp_string_view_t haystack, const char* needle) {
  size_t n = strlen(needle);
  if (haystack.size < n)
    return NULL;
  for (size_t i = haystack.size - n + 1; i-- > 0;) {
    if (memcmp(haystack.data + i, needle, n) == 0)
      return haystack.data + i;
  }
  return NULL;
}

// First occurrence of |needle| in |haystack|, or NULL.
static const char* find_first(pcp_string_view_t haystack, const char* needle) {
  size_t n = strlen(needle);
  for (size_t i = 0; i + n <= haystack.size; ++i) {
    if (memcmp(haystack.data + i, needle, n) == 0)
      return haystack.data + i;
  }
  return NULL;
}

// Jinja's lstrip('\n') / rstrip('\n') / strip('\n').
static pcp_string_view_t strip_newlines(pcp_string_view_t v, bool left,
                                        bool right) {
  while (left && v.size && v.data[0] == '\n') {
    ++v.data;
    --v.size;
  }
  while (right && v.size && v.data[v.size - 1] == '\n') --v.size;
  return v;
}

static pcp_status_t append_turn(pcp_string_builder_t* out, const char* role,
                                pcp_string_view_t content) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(out, "<|im_start|>"));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(out, role));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(out, "\n"));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(out, content));
  return pcp_string_builder_append_cstring(out, "<|im_end|>\n");
}

pcp_status_t pcp_tokenizer_chat_render(
    const pcp_tokenizer_chat_message_t* messages, size_t message_count,
    const pcp_tokenizer_chat_options_t* options,
    pcp_string_builder_t* out_text) {
  for (size_t i = 0; i < message_count; ++i) {
    if ((unsigned)messages[i].role >= PCP_ARRAYSIZE(kRoleNames)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "message %zu: unknown role %d", i,
                             (int)messages[i].role);
    }
  }
  bool has_system =
      message_count > 0 && messages[0].role == PCP_TOKENIZER_CHAT_ROLE_SYSTEM;
  if (!has_system && options && options->default_system_prompt.data) {
    PCP_RETURN_IF_ERROR_BARE(
        append_turn(out_text, "system", options->default_system_prompt));
  }
  bool qwen3 = options && options->qwen3_reasoning;
  size_t last_query = SIZE_MAX;  // index of the last user message
  for (size_t i = 0; i < message_count; ++i) {
    // A user message that only wraps a tool response is not a query.
    pcp_string_view_t c = messages[i].content;
    bool tool_response =
        pcp_string_view_starts_with(c,
                                    pcp_make_cstring_view("<tool_response>")) &&
        c.size >= 16 &&
        memcmp(c.data + c.size - 16, "</tool_response>", 16) == 0;
    if (messages[i].role == PCP_TOKENIZER_CHAT_ROLE_USER && !tool_response) {
      last_query = i;
    }
  }
  for (size_t i = 0; i < message_count; ++i) {
    if (!qwen3 || messages[i].role != PCP_TOKENIZER_CHAT_ROLE_ASSISTANT) {
      PCP_RETURN_IF_ERROR_BARE(append_turn(
          out_text, kRoleNames[messages[i].role], messages[i].content));
      continue;
    }
    pcp_string_view_t content = messages[i].content;
    pcp_string_view_t reasoning = pcp_make_string_view("", 0);
    const char* end_tag = find_last(content, "</think>");
    if (end_tag) {
      // The template's split('</think>'): content after the last tag,
      // reasoning before the first one (after its last "<think>").
      const char* first_end = find_first(content, "</think>");
      pcp_string_view_t before = pcp_make_string_view(
          content.data, (size_t)(first_end - content.data));
      size_t tail = (size_t)(end_tag - content.data) + 8;
      content = pcp_make_string_view(content.data + tail, content.size - tail);
      content = strip_newlines(content, true, false);
      reasoning = strip_newlines(before, false, true);
      const char* start_tag = find_last(reasoning, "<think>");
      if (start_tag) {
        size_t skip = (size_t)(start_tag - reasoning.data) + 7;
        reasoning =
            pcp_make_string_view(reasoning.data + skip, reasoning.size - skip);
      }
      reasoning = strip_newlines(reasoning, true, false);
    }
    bool after_query = last_query != SIZE_MAX && i > last_query;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(out_text, "<|im_start|>assistant\n"));
    if (after_query && (i + 1 == message_count || reasoning.size > 0)) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(out_text, "<think>\n"));
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
          out_text, strip_newlines(reasoning, true, true)));
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(out_text, "\n</think>\n\n"));
      content = strip_newlines(content, true, false);
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(out_text, content));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(out_text, "<|im_end|>\n"));
  }
  if (options && options->add_generation_prompt) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(out_text, "<|im_start|>assistant\n"));
    if (options->disable_thinking) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
          out_text, "<think>\n\n</think>\n\n"));
    }
  }
  return pcp_ok_status();
}
