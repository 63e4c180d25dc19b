// SPDX-License-Identifier: Apache-2.0
//
// Internals shared by the tokenizer's .c files. Never included outside
// src/tokenizer/.

#ifndef PCP_TOKENIZER_TOKENIZER_IMPL_H_
#define PCP_TOKENIZER_TOKENIZER_IMPL_H_

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

// Decodes one UTF-8 sequence at |data| (|byte_length| > 0). Returns the code
// point and sets *out_length, or returns -1 with *out_length = 1 for a byte
// that does not start a valid, complete sequence (the strict rules of
// Unicode 3.9: no overlongs, no surrogates, nothing past U+10FFFF).
int32_t pcp_tokenizer_utf8_decode(const uint8_t* data, size_t byte_length,
                                  size_t* out_length);

// Appends |data| to |builder| with each maximal invalid subsequence replaced
// by U+FFFD (the rule Rust's String::from_utf8_lossy follows).
PCP_MUST_USE_RESULT pcp_status_t pcp_tokenizer_utf8_append_lossy(
    pcp_string_builder_t* builder, const uint8_t* data, size_t byte_length);

// True when |text| might change under NFC (contains a code point of the
// kNfcMaybe set). False means it is already NFC.
bool pcp_tokenizer_nfc_maybe_changes(pcp_string_view_t text);

#endif  // PCP_TOKENIZER_TOKENIZER_IMPL_H_
