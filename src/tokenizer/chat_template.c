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
      message_count > 0 &&
      messages[0].role == PCP_TOKENIZER_CHAT_ROLE_SYSTEM;
  if (!has_system && options && options->default_system_prompt.data) {
    PCP_RETURN_IF_ERROR_BARE(
        append_turn(out_text, "system", options->default_system_prompt));
  }
  for (size_t i = 0; i < message_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(append_turn(
        out_text, kRoleNames[messages[i].role], messages[i].content));
  }
  if (options && options->add_generation_prompt) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(out_text, "<|im_start|>assistant\n"));
  }
  return pcp_ok_status();
}
