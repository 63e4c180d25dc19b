// SPDX-License-Identifier: Apache-2.0
// Datasets: the read-only mapping, vocabularies, ranges, encode/decode.

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_impl.h"

const char* pcp_data_format_name(pcp_data_format_t format) {
  switch (format) {
    case PCP_DATA_FORMAT_CHAR:
      return "char";
    case PCP_DATA_FORMAT_BYTE:
      return "byte";
    case PCP_DATA_FORMAT_U16:
      return "u16";
  }
  return "unknown";
}

bool pcp_data_format_parse(pcp_string_view_t name,
                           pcp_data_format_t* out_format) {
  static const pcp_data_format_t kFormats[] = {
      PCP_DATA_FORMAT_CHAR, PCP_DATA_FORMAT_BYTE, PCP_DATA_FORMAT_U16};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kFormats); ++i) {
    if (pcp_string_view_equal(
            name, pcp_make_cstring_view(pcp_data_format_name(kFormats[i])))) {
      *out_format = kFormats[i];
      return true;
    }
  }
  return false;
}

void pcp_data_dataset_options_initialize(
    pcp_data_format_t format, pcp_data_dataset_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->format = format;
  out_options->max_file_byte_length = PCP_DATA_DEFAULT_MAX_FILE_BYTE_LENGTH;
}

//===----------------------------------------------------------------------===//
// UTF-8
//===----------------------------------------------------------------------===//

// Decodes one code point at |p| (|n| bytes left). Returns its byte length, or
// 0 for invalid UTF-8 (overlong forms, surrogates and values above U+10FFFF
// included: the vocabulary must not depend on how a decoder treats them).
size_t pcp_data_utf8_decode(const uint8_t* p, uint64_t n,
                            uint32_t* out_code_point) {
  uint8_t c = p[0];
  if (c < 0x80) {
    *out_code_point = c;
    return 1;
  }
  size_t length;
  uint32_t cp;
  uint32_t min;
  if ((c & 0xE0) == 0xC0) {
    length = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    length = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    length = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < length)
    return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((p[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  *out_code_point = cp;
  return length;
}

static size_t utf8_encode(uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int32_t pcp_data_char_id(const pcp_data_dataset_t* dataset, uint32_t cp) {
  if (cp < 128)
    return dataset->ascii_ids[cp];
  // Binary search over the sorted symbols; non-ASCII is rare in the corpora
  // char-level models train on, so no larger table.
  size_t lo = 0;
  size_t hi = dataset->symbol_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (dataset->symbols[mid] < cp) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo < dataset->symbol_count && dataset->symbols[lo] == cp) {
    return (int32_t)lo;
  }
  return -1;
}

//===----------------------------------------------------------------------===//
// Vocabularies
//===----------------------------------------------------------------------===//

static int compare_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a;
  uint32_t y = *(const uint32_t*)b;
  return (x > y) - (x < y);
}

static pcp_status_t build_char_vocab(pcp_data_dataset_t* dataset) {
  // ASCII in a bitmap; other code points collected and de-duplicated by sort.
  // The set is small for text (tiny_shakespeare: 65, all ASCII).
  bool seen_ascii[128] = {false};
  uint32_t* other = NULL;
  size_t other_count = 0;
  size_t other_capacity = 0;
  const uint8_t* p = dataset->bytes;
  uint64_t n = dataset->byte_length;
  pcp_status_t status = pcp_ok_status();
  for (uint64_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      seen_ascii[p[i]] = true;
      ++i;
      continue;
    }
    uint32_t cp;
    size_t length = pcp_data_utf8_decode(p + i, n - i, &cp);
    if (length == 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: invalid UTF-8 at byte %llu (a char "
                               "dataset is UTF-8 text; use tokenizer byte "
                               "for binary files)",
                               dataset->path, (unsigned long long)i);
      break;
    }
    i += length;
    if (other_count == other_capacity) {
      // Compact before growing: sort + unique keeps the buffer at the
      // number of distinct symbols instead of the number of occurrences.
      if (other_count > 0) {
        qsort(other, other_count, sizeof(uint32_t), compare_u32);
        size_t w = 1;
        for (size_t r = 1; r < other_count; ++r) {
          if (other[r] != other[w - 1])
            other[w++] = other[r];
        }
        other_count = w;
      }
      if (other_capacity == 0 || other_count * 2 > other_capacity) {
        size_t capacity = other_capacity ? other_capacity * 2 : 256;
        void* grown = other;
        status = pcp_allocator_realloc(dataset->allocator,
                                       capacity * sizeof(uint32_t), &grown);
        if (status)
          break;
        other = grown;
        other_capacity = capacity;
      }
    }
    other[other_count++] = cp;
  }
  if (!status && other_count > 0) {
    qsort(other, other_count, sizeof(uint32_t), compare_u32);
    size_t w = 1;
    for (size_t r = 1; r < other_count; ++r) {
      if (other[r] != other[w - 1])
        other[w++] = other[r];
    }
    other_count = w;
  }
  size_t ascii_count = 0;
  for (int c = 0; c < 128; ++c) ascii_count += seen_ascii[c];
  if (!status) {
    status = pcp_allocator_malloc(
        dataset->allocator, (ascii_count + other_count) * sizeof(uint32_t) + 1,
        (void**)&dataset->symbols);
  }
  if (!status) {
    size_t k = 0;
    for (int c = 0; c < 128; ++c) {
      dataset->ascii_ids[c] = seen_ascii[c] ? (int32_t)k : -1;
      if (seen_ascii[c])
        dataset->symbols[k++] = (uint32_t)c;
    }
    // Every non-ASCII code point is above 127, so appending keeps the order.
    for (size_t r = 0; r < other_count; ++r) dataset->symbols[k++] = other[r];
    dataset->symbol_count = k;
    dataset->vocab_size = (uint32_t)k;
  }
  pcp_allocator_free(dataset->allocator, other);
  return status;
}

static pcp_status_t check_u16_vocab(pcp_data_dataset_t* dataset,
                                    uint32_t vocab_size) {
  const uint8_t* p = dataset->bytes;
  uint64_t count = dataset->byte_length / 2;
  uint32_t max_id = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t id = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8);
    if (vocab_size != 0 && id >= vocab_size) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: token %u at index %llu is not below the "
                             "vocab_size %u",
                             dataset->path, id, (unsigned long long)i,
                             vocab_size);
    }
    if (id > max_id)
      max_id = id;
  }
  dataset->vocab_size = vocab_size != 0 ? vocab_size : max_id + 1;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Open / release
//===----------------------------------------------------------------------===//

pcp_status_t pcp_data_dataset_open(const char* path,
                                   const pcp_data_dataset_options_t* options,
                                   pcp_allocator_t allocator,
                                   pcp_data_dataset_t** out_dataset) {
  *out_dataset = NULL;
  if (path == NULL || path[0] == '\0') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "empty dataset path");
  }
  size_t path_length = strlen(path);
  if (path_length > PCP_DATA_MAX_PATH_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "dataset path of %zu bytes exceeds %d", path_length,
                           PCP_DATA_MAX_PATH_LENGTH);
  }
  if (options->format != PCP_DATA_FORMAT_CHAR &&
      options->format != PCP_DATA_FORMAT_BYTE &&
      options->format != PCP_DATA_FORMAT_U16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unknown dataset format %d", (int)options->format);
  }
  uint64_t max_length = options->max_file_byte_length
                            ? options->max_file_byte_length
                            : PCP_DATA_DEFAULT_MAX_FILE_BYTE_LENGTH;

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "open dataset %s", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return pcp_status_from_errno(err, "stat dataset %s", path);
  }
  pcp_status_t status = pcp_ok_status();
  uint64_t length = (uint64_t)st.st_size;
  if (!S_ISREG(st.st_mode)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "dataset %s is not a regular file", path);
  } else if (length == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "dataset %s is empty",
                             path);
  } else if (length > max_length) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "dataset %s is %llu bytes, over the limit of "
                             "%llu bytes (max_file_byte_length)",
                             path, (unsigned long long)length,
                             (unsigned long long)max_length);
  } else if (length > SIZE_MAX) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "dataset %s does not fit the address space", path);
  } else if (options->format == PCP_DATA_FORMAT_U16 && (length & 1u)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "u16 dataset %s has an odd length (%llu bytes): "
                             "not a stream of little-endian uint16 ids",
                             path, (unsigned long long)length);
  }
  if (status) {
    close(fd);
    return status;
  }

  pcp_data_dataset_t* dataset = NULL;
  status = pcp_allocator_calloc(allocator, sizeof(*dataset), (void**)&dataset);
  if (status) {
    close(fd);
    return status;
  }
  dataset->allocator = allocator;
  dataset->format = options->format;
  memcpy(dataset->path, path, path_length + 1);
  void* mapping = mmap(NULL, (size_t)length, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  // The mapping keeps the file alive; the descriptor is not needed.
  close(fd);
  if (mapping == MAP_FAILED) {
    pcp_allocator_free(allocator, dataset);
    return pcp_status_from_errno(map_errno, "mmap dataset %s", path);
  }
  dataset->bytes = mapping;
  dataset->byte_length = length;

  switch (options->format) {
    case PCP_DATA_FORMAT_CHAR:
      status = build_char_vocab(dataset);
      break;
    case PCP_DATA_FORMAT_BYTE:
      dataset->vocab_size = 256;
      break;
    case PCP_DATA_FORMAT_U16:
      status = check_u16_vocab(dataset, options->vocab_size);
      break;
  }
  if (status) {
    pcp_data_dataset_release(dataset);
    return status;
  }
  *out_dataset = dataset;
  return pcp_ok_status();
}

void pcp_data_dataset_release(pcp_data_dataset_t* dataset) {
  if (dataset == NULL)
    return;
  if (dataset->bytes) {
    munmap((void*)dataset->bytes, (size_t)dataset->byte_length);
  }
  pcp_allocator_free(dataset->allocator, dataset->symbols);
  pcp_allocator_free(dataset->allocator, dataset);
}

//===----------------------------------------------------------------------===//
// Accessors and ranges
//===----------------------------------------------------------------------===//

pcp_data_format_t pcp_data_dataset_format(const pcp_data_dataset_t* dataset) {
  return dataset->format;
}
const char* pcp_data_dataset_path(const pcp_data_dataset_t* dataset) {
  return dataset->path;
}
uint64_t pcp_data_dataset_byte_length(const pcp_data_dataset_t* dataset) {
  return dataset->byte_length;
}
uint32_t pcp_data_dataset_vocab_size(const pcp_data_dataset_t* dataset) {
  return dataset->vocab_size;
}
const uint8_t* pcp_data_dataset_bytes(const pcp_data_dataset_t* dataset) {
  return dataset->bytes;
}
pcp_data_range_t pcp_data_dataset_full_range(
    const pcp_data_dataset_t* dataset) {
  return (pcp_data_range_t){0, dataset->byte_length};
}

const uint32_t* pcp_data_dataset_symbols(const pcp_data_dataset_t* dataset,
                                         size_t* out_symbol_count) {
  if (dataset->format != PCP_DATA_FORMAT_CHAR) {
    *out_symbol_count = 0;
    return NULL;
  }
  *out_symbol_count = dataset->symbol_count;
  return dataset->symbols;
}

bool pcp_data_is_boundary(const pcp_data_dataset_t* dataset,
                          uint64_t byte_offset) {
  if (byte_offset == 0 || byte_offset == dataset->byte_length)
    return true;
  if (byte_offset > dataset->byte_length)
    return false;
  switch (dataset->format) {
    case PCP_DATA_FORMAT_U16:
      return (byte_offset & 1u) == 0;
    case PCP_DATA_FORMAT_CHAR:
      // The file is valid UTF-8 (checked at open): every non-continuation
      // byte starts a code point.
      return (dataset->bytes[byte_offset] & 0xC0) != 0x80;
    case PCP_DATA_FORMAT_BYTE:
      return true;
  }
  return false;
}

uint64_t pcp_data_dataset_align_down(const pcp_data_dataset_t* dataset,
                                     uint64_t byte_offset) {
  if (byte_offset >= dataset->byte_length)
    return dataset->byte_length;
  while (!pcp_data_is_boundary(dataset, byte_offset)) --byte_offset;
  return byte_offset;
}

pcp_status_t pcp_data_check_range(const pcp_data_dataset_t* dataset,
                                  pcp_data_range_t range) {
  if (range.byte_offset > dataset->byte_length ||
      range.byte_length > dataset->byte_length - range.byte_offset) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "range [%llu, +%llu) is outside %s (%llu bytes)",
                           (unsigned long long)range.byte_offset,
                           (unsigned long long)range.byte_length, dataset->path,
                           (unsigned long long)dataset->byte_length);
  }
  if (!pcp_data_is_boundary(dataset, range.byte_offset) ||
      !pcp_data_is_boundary(dataset, range.byte_offset + range.byte_length)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "range [%llu, +%llu) of %s does not start and end "
                           "on %s token boundaries",
                           (unsigned long long)range.byte_offset,
                           (unsigned long long)range.byte_length, dataset->path,
                           pcp_data_format_name(dataset->format));
  }
  return pcp_ok_status();
}

uint64_t pcp_data_count_tokens(const pcp_data_dataset_t* dataset,
                               uint64_t byte_offset, uint64_t byte_length) {
  switch (dataset->format) {
    case PCP_DATA_FORMAT_U16:
      return byte_length / 2;
    case PCP_DATA_FORMAT_BYTE:
      return byte_length;
    case PCP_DATA_FORMAT_CHAR: {
      uint64_t count = 0;
      const uint8_t* p = dataset->bytes + byte_offset;
      for (uint64_t i = 0; i < byte_length; ++i) {
        count += (p[i] & 0xC0) != 0x80;
      }
      return count;
    }
  }
  return 0;
}

pcp_status_t pcp_data_dataset_token_count(const pcp_data_dataset_t* dataset,
                                          pcp_data_range_t range,
                                          uint64_t* out_token_count) {
  *out_token_count = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_data_check_range(dataset, range));
  *out_token_count =
      pcp_data_count_tokens(dataset, range.byte_offset, range.byte_length);
  return pcp_ok_status();
}

pcp_status_t pcp_data_dataset_split(const pcp_data_dataset_t* dataset,
                                    double validation_fraction,
                                    pcp_data_range_t* out_train,
                                    pcp_data_range_t* out_validation) {
  memset(out_train, 0, sizeof(*out_train));
  memset(out_validation, 0, sizeof(*out_validation));
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "validation fraction %g is not in [0, 1)",
                           validation_fraction);
  }
  // floor() in double is exact for any file below 2^53 bytes; nanoGPT's
  // int(n * 0.9) is the same cut.
  double cut_f =
      floor((double)dataset->byte_length * (1.0 - validation_fraction));
  uint64_t cut = cut_f >= (double)dataset->byte_length ? dataset->byte_length
                                                       : (uint64_t)cut_f;
  cut = pcp_data_dataset_align_down(dataset, cut);
  *out_train = (pcp_data_range_t){0, cut};
  *out_validation = (pcp_data_range_t){cut, dataset->byte_length - cut};
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Encode / decode
//===----------------------------------------------------------------------===//

pcp_status_t pcp_data_dataset_encode(const pcp_data_dataset_t* dataset,
                                     pcp_string_view_t text, int32_t* out_ids,
                                     size_t capacity, size_t* out_count) {
  *out_count = 0;
  const uint8_t* p = (const uint8_t*)text.data;
  size_t count = 0;
  switch (dataset->format) {
    case PCP_DATA_FORMAT_U16:
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "a u16 dataset has no text form (ids come from "
                             "an external tokenizer)");
    case PCP_DATA_FORMAT_BYTE:
      for (size_t i = 0; i < text.size; ++i) {
        if (count < capacity)
          out_ids[count] = p[i];
        ++count;
      }
      break;
    case PCP_DATA_FORMAT_CHAR:
      for (size_t i = 0; i < text.size;) {
        uint32_t cp;
        size_t length = pcp_data_utf8_decode(p + i, text.size - i, &cp);
        if (length == 0) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "invalid UTF-8 at byte %zu of the text", i);
        }
        int32_t id = pcp_data_char_id(dataset, cp);
        if (id < 0) {
          return pcp_make_status(PCP_STATUS_NOT_FOUND,
                                 "character U+%04X at byte %zu is not in the "
                                 "vocabulary of %s",
                                 cp, i, dataset->path);
        }
        if (count < capacity)
          out_ids[count] = id;
        ++count;
        i += length;
      }
      break;
  }
  *out_count = count;
  if (count > capacity) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "text needs %zu ids, capacity is %zu", count,
                           capacity);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_data_dataset_decode(const pcp_data_dataset_t* dataset,
                                     const int32_t* ids, size_t id_count,
                                     char* out_text, size_t capacity,
                                     size_t* out_byte_length) {
  *out_byte_length = 0;
  if (dataset->format == PCP_DATA_FORMAT_U16) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "a u16 dataset has no text form");
  }
  size_t length = 0;
  for (size_t i = 0; i < id_count; ++i) {
    int32_t id = ids[i];
    if (id < 0 || (uint32_t)id >= dataset->vocab_size) {
      return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "id %d at index %zu is outside the vocabulary "
                             "of %u",
                             id, i, dataset->vocab_size);
    }
    char buffer[4];
    size_t n;
    if (dataset->format == PCP_DATA_FORMAT_BYTE) {
      buffer[0] = (char)(uint8_t)id;
      n = 1;
    } else {
      n = utf8_encode(dataset->symbols[id], buffer);
    }
    for (size_t k = 0; k < n; ++k) {
      if (length + k < capacity)
        out_text[length + k] = buffer[k];
    }
    length += n;
  }
  *out_byte_length = length;
  if (length + 1 > capacity) {
    if (capacity > 0)
      out_text[capacity - 1] = '\0';
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "text needs %zu bytes plus NUL, capacity is %zu",
                           length, capacity);
  }
  out_text[length] = '\0';
  return pcp_ok_status();
}
