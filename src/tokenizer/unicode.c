// SPDX-License-Identifier: Apache-2.0
//
// UTF-8 helpers and NFC without ICU: the tables come from Python's
// unicodedata (gen_nfc_tables.py), the algorithm is UAX #15's: full
// canonical decomposition, canonical ordering, canonical composition.

#include <stdlib.h>
#include <string.h>

#include "tokenizer/nfc_tables_impl.h"
#include "tokenizer/tokenizer_impl.h"

//===----------------------------------------------------------------------===//
// UTF-8
//===----------------------------------------------------------------------===//

// Bounds of the second byte for a given lead byte (Unicode Table 3-7); the
// remaining continuation bytes are always 80..BF.
static int utf8_sequence_length(uint8_t lead, uint8_t* out_lo,
                                uint8_t* out_hi) {
  *out_lo = 0x80;
  *out_hi = 0xBF;
  if (lead < 0x80)
    return 1;
  if (lead < 0xC2)
    return 0;
  if (lead < 0xE0)
    return 2;
  if (lead == 0xE0) {
    *out_lo = 0xA0;
    return 3;
  }
  if (lead == 0xED) {
    *out_hi = 0x9F;
    return 3;
  }
  if (lead < 0xF0)
    return 3;
  if (lead == 0xF0) {
    *out_lo = 0x90;
    return 4;
  }
  if (lead < 0xF4)
    return 4;
  if (lead == 0xF4) {
    *out_hi = 0x8F;
    return 4;
  }
  return 0;
}

// Number of bytes of the sequence starting at |data| that are a valid prefix
// (1..need) and the full |need|; 0 valid bytes for an invalid lead.
static size_t utf8_valid_prefix(const uint8_t* data, size_t byte_length,
                                int* out_need) {
  uint8_t lo, hi;
  int need = utf8_sequence_length(data[0], &lo, &hi);
  *out_need = need;
  if (need == 0)
    return 0;
  size_t valid = 1;
  for (int k = 1; k < need; ++k) {
    if (valid >= byte_length)
      break;
    uint8_t b = data[valid];
    uint8_t blo = k == 1 ? lo : 0x80, bhi = k == 1 ? hi : 0xBF;
    if (b < blo || b > bhi)
      break;
    ++valid;
  }
  return valid;
}

int32_t pcp_tokenizer_utf8_decode(const uint8_t* data, size_t byte_length,
                                  size_t* out_length) {
  uint8_t b0 = data[0];
  if (b0 < 0x80) {
    *out_length = 1;
    return b0;
  }
  int need = 0;
  size_t valid = utf8_valid_prefix(data, byte_length, &need);
  if (need == 0 || (int)valid != need) {
    *out_length = 1;
    return -1;
  }
  *out_length = (size_t)need;
  switch (need) {
    case 2:
      return ((b0 & 0x1F) << 6) | (data[1] & 0x3F);
    case 3:
      return ((b0 & 0x0F) << 12) | ((data[1] & 0x3F) << 6) | (data[2] & 0x3F);
    default:
      return ((b0 & 0x07) << 18) | ((data[1] & 0x3F) << 12) |
             ((data[2] & 0x3F) << 6) | (data[3] & 0x3F);
  }
}

pcp_status_t pcp_tokenizer_utf8_append_lossy(pcp_string_builder_t* builder,
                                             const uint8_t* data,
                                             size_t byte_length) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  size_t run_start = 0, i = 0;
  while (i < byte_length) {
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    int need = 0;
    size_t valid = utf8_valid_prefix(data + i, byte_length - i, &need);
    if (need != 0 && (int)valid == need) {
      i += valid;
      continue;
    }
    // A maximal invalid subsequence: the valid prefix of a sequence that
    // could not be completed, or a single byte that starts none.
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
        builder,
        pcp_make_string_view((const char*)data + run_start, i - run_start)));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
        builder, pcp_make_string_view(kReplacement, 3)));
    i += valid == 0 ? 1 : valid;
    run_start = i;
  }
  return pcp_string_builder_append(
      builder,
      pcp_make_string_view((const char*)data + run_start, i - run_start));
}

size_t pcp_tokenizer_utf8_complete_length(const char* data,
                                          size_t byte_length) {
  const uint8_t* bytes = (const uint8_t*)data;
  for (size_t k = 1; k <= 3 && k <= byte_length; ++k) {
    uint8_t b = bytes[byte_length - k];
    if (b >= 0x80 && b <= 0xBF)
      continue;  // continuation: look further back
    int need = 0;
    size_t valid = utf8_valid_prefix(bytes + byte_length - k, k, &need);
    // Hold back only a sequence that is valid so far and still short.
    if (need > (int)k && valid == k)
      return byte_length - k;
    return byte_length;
  }
  return byte_length;
}

static void utf8_encode(uint32_t cp, char* out, size_t* out_length) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    *out_length = 1;
  } else if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    *out_length = 2;
  } else if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    *out_length = 3;
  } else {
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    *out_length = 4;
  }
}

//===----------------------------------------------------------------------===//
// NFC
//===----------------------------------------------------------------------===//

// Invalid input bytes travel through the code point buffer tagged with this
// bit: class 0, never composed, written back as the byte itself.
#define NFC_RAW_BYTE 0x80000000u

enum {
  kHangulSBase = 0xAC00,
  kHangulLBase = 0x1100,
  kHangulVBase = 0x1161,
  kHangulTBase = 0x11A7,
  kHangulLCount = 19,
  kHangulVCount = 21,
  kHangulTCount = 28,
  kHangulNCount = kHangulVCount * kHangulTCount,
  kHangulSCount = kHangulLCount * kHangulNCount,
};

static bool nfc_maybe(uint32_t cp) {
  size_t lo = 0, hi = PCP_ARRAYSIZE(kNfcMaybe);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < kNfcMaybe[mid][0]) {
      hi = mid;
    } else if (cp > kNfcMaybe[mid][1]) {
      lo = mid + 1;
    } else {
      return true;
    }
  }
  return false;
}

// Length of the code point at |data| if it is valid and below U+0300 (the
// common case, decided without a table), else 0.
static inline size_t below_u0300_length(const uint8_t* data, size_t n) {
  if (data[0] < 0x80)
    return 1;
  if (data[0] >= 0xC2 && data[0] < 0xCC && n > 1 && (data[1] & 0xC0) == 0x80) {
    return 2;
  }
  return 0;
}

bool pcp_tokenizer_nfc_maybe_changes(pcp_string_view_t text) {
  const uint8_t* data = (const uint8_t*)text.data;
  size_t i = 0;
  while (i < text.size) {
    // Everything below U+0300 is quick-check Yes with class 0.
    size_t skip = below_u0300_length(data + i, text.size - i);
    if (skip) {
      i += skip;
      continue;
    }
    size_t length = 1;
    int32_t cp = pcp_tokenizer_utf8_decode(data + i, text.size - i, &length);
    if (cp >= 0 && nfc_maybe((uint32_t)cp))
      return true;
    i += length;
  }
  return false;
}

static uint8_t nfc_ccc(uint32_t cp) {
  if (cp < 0x300 || (cp & NFC_RAW_BYTE))
    return 0;
  size_t lo = 0, hi = PCP_ARRAYSIZE(kNfcCcc);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    uint32_t key = kNfcCcc[mid] >> 8;
    if (cp < key) {
      hi = mid;
    } else if (cp > key) {
      lo = mid + 1;
    } else {
      return (uint8_t)(kNfcCcc[mid] & 0xFF);
    }
  }
  return 0;
}

static const nfc_decomp_t* nfc_decomposition(uint32_t cp) {
  size_t lo = 0, hi = PCP_ARRAYSIZE(kNfcDecomp);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < kNfcDecomp[mid].cp) {
      hi = mid;
    } else if (cp > kNfcDecomp[mid].cp) {
      lo = mid + 1;
    } else {
      return &kNfcDecomp[mid];
    }
  }
  return NULL;
}

// Returns the primary composite of |first| + |second|, or 0.
static uint32_t nfc_compose(uint32_t first, uint32_t second) {
  if ((first | second) & NFC_RAW_BYTE)
    return 0;
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount &&
      second >= kHangulVBase && second < kHangulVBase + kHangulVCount) {
    return kHangulSBase +
           ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) *
               kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  size_t lo = 0, hi = PCP_ARRAYSIZE(kNfcCompose);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const nfc_compose_t* c = &kNfcCompose[mid];
    if (first < c->first || (first == c->first && second < c->second)) {
      hi = mid;
    } else if (first > c->first || second > c->second) {
      lo = mid + 1;
    } else {
      return c->composite;
    }
  }
  return 0;
}

// Normalizes one region that starts at a safe boundary (see below).
static pcp_status_t nfc_region(const uint8_t* data, size_t size,
                               pcp_string_builder_t* out_text) {
  // A full canonical decomposition is at most 4 code points per input byte
  // (in practice far fewer); small regions use the stack.
  uint32_t stack_buffer[256];
  uint32_t* cps = stack_buffer;
  if (size * 4 > PCP_ARRAYSIZE(stack_buffer)) {
    if (size > SIZE_MAX / (4 * sizeof(uint32_t))) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "NFC input too long");
    }
    // The output builder's allocator: the caller's (no API change needed).
    cps = NULL;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(out_text->allocator, size * 4 * sizeof(uint32_t),
                             (void**)&cps),
        "NFC buffer for %zu bytes", size);
  }
  pcp_string_view_t text = pcp_make_string_view((const char*)data, size);
  // 1. Decompose.
  size_t n = 0;
  for (size_t i = 0; i < text.size;) {
    size_t length = 1;
    int32_t cp = pcp_tokenizer_utf8_decode(data + i, text.size - i, &length);
    if (cp < 0) {
      cps[n++] = NFC_RAW_BYTE | data[i];
    } else if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
      uint32_t s = (uint32_t)cp - kHangulSBase;
      cps[n++] = kHangulLBase + s / kHangulNCount;
      cps[n++] = kHangulVBase + (s % kHangulNCount) / kHangulTCount;
      if (s % kHangulTCount)
        cps[n++] = kHangulTBase + s % kHangulTCount;
    } else {
      const nfc_decomp_t* d =
          cp >= 0xC0 ? nfc_decomposition((uint32_t)cp) : NULL;
      if (d) {
        memcpy(cps + n, kNfcDecompData + d->offset,
               d->length * sizeof(uint32_t));
        n += d->length;
      } else {
        cps[n++] = (uint32_t)cp;
      }
    }
    i += length;
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by class.
  for (size_t i = 1; i < n; ++i) {
    uint8_t c = nfc_ccc(cps[i]);
    if (c == 0)
      continue;
    size_t j = i;
    uint32_t cp = cps[i];
    while (j > 0 && nfc_ccc(cps[j - 1]) > c) {
      cps[j] = cps[j - 1];
      --j;
    }
    cps[j] = cp;
  }
  // 3. Compose: a character joins the last starter unless a character
  // between them has class 0 or a class >= its own (it is "blocked").
  size_t out_n = 0;
  if (n > 0) {
    size_t starter = 0;
    int last_class = nfc_ccc(cps[0]) ? 256 : 0;
    out_n = 1;
    for (size_t i = 1; i < n; ++i) {
      uint32_t ch = cps[i];
      int ch_class = nfc_ccc(ch);
      uint32_t composite = nfc_compose(cps[starter], ch);
      if (composite && (last_class < ch_class || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (ch_class == 0)
        starter = out_n;
      last_class = ch_class;
      cps[out_n++] = ch;
    }
  }
  // 4. Re-encode.
  pcp_status_t status = pcp_ok_status();
  char buffer[256];
  size_t used = 0;
  for (size_t i = 0; i < out_n && !status; ++i) {
    if (used + 4 > sizeof(buffer)) {
      status = pcp_string_builder_append(out_text,
                                         pcp_make_string_view(buffer, used));
      used = 0;
    }
    if (cps[i] & NFC_RAW_BYTE) {
      buffer[used++] = (char)(cps[i] & 0xFF);
    } else {
      size_t length = 0;
      utf8_encode(cps[i], buffer + used, &length);
      used += length;
    }
  }
  if (!status) {
    status =
        pcp_string_builder_append(out_text, pcp_make_string_view(buffer, used));
  }
  if (cps != stack_buffer)
    pcp_allocator_free(out_text->allocator, cps);
  return status;
}

// Only the regions around code points that can change are normalized; the
// rest is copied. A code point outside kNfcMaybe has class 0 and never
// composes with what precedes it, so nothing before it can be affected by
// what follows: each region starts at the last such code point before a
// "maybe" run and ends at the first one after it.
pcp_status_t pcp_tokenizer_nfc_append(pcp_string_view_t text,
                                      pcp_string_builder_t* out_text) {
  const uint8_t* data = (const uint8_t*)text.data;
  size_t n = text.size, copied = 0, safe = 0, i = 0;
  while (i < n) {
    size_t skip = below_u0300_length(data + i, n - i);
    if (skip) {  // below U+0300: never changes
      safe = i;
      i += skip;
      continue;
    }
    size_t length = 1;
    int32_t cp = pcp_tokenizer_utf8_decode(data + i, n - i, &length);
    if (cp < 0 || !nfc_maybe((uint32_t)cp)) {
      safe = i;
      i += length;
      continue;
    }
    size_t j = i + length;
    while (j < n) {
      int32_t next = pcp_tokenizer_utf8_decode(data + j, n - j, &length);
      if (next < 0x300 || !nfc_maybe((uint32_t)next))
        break;
      j += length;
    }
    if (safe < copied)
      safe = copied;
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
        out_text, pcp_make_string_view(text.data + copied, safe - copied)));
    PCP_RETURN_IF_ERROR_BARE(nfc_region(data + safe, j - safe, out_text));
    copied = safe = i = j;
  }
  return pcp_string_builder_append(
      out_text, pcp_make_string_view(text.data + copied, n - copied));
}
