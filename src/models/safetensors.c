// SPDX-License-Identifier: Apache-2.0
// safetensors reader (mmap, validated header, zero-copy views), writer,
// sharded checkpoints and the load of a checkpoint into a parameter table.

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "models/models.h"

//===----------------------------------------------------------------------===//
// dtypes
//===----------------------------------------------------------------------===//

typedef struct dtype_entry_t {
  const char* name;
  pcp_element_type_t type;
} dtype_entry_t;

// The format's spellings we map onto element types.
static const dtype_entry_t kDtypes[] = {
    {"F32", PCP_ELEMENT_TYPE_F32},   {"F16", PCP_ELEMENT_TYPE_F16},
    {"BF16", PCP_ELEMENT_TYPE_BF16}, {"F64", PCP_ELEMENT_TYPE_F64},
    {"BOOL", PCP_ELEMENT_TYPE_I1},   {"I8", PCP_ELEMENT_TYPE_I8},
    {"I16", PCP_ELEMENT_TYPE_I16},   {"I32", PCP_ELEMENT_TYPE_I32},
    {"I64", PCP_ELEMENT_TYPE_I64},   {"U8", PCP_ELEMENT_TYPE_U8},
    {"U16", PCP_ELEMENT_TYPE_U16},   {"U32", PCP_ELEMENT_TYPE_U32},
    {"U64", PCP_ELEMENT_TYPE_U64},
};

// Spellings the format defines that have no element type here (fp8, fp4,
// fp6, complex): a clear UNIMPLEMENTED rather than "bad dtype".
static const char* const kUnsupportedDtypes[] = {
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64",
};

static pcp_status_t dtype_parse(const char* file, const char* tensor,
                                const char* name,
                                pcp_element_type_t* out_type) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kDtypes); ++i) {
    if (strcmp(kDtypes[i].name, name) == 0) {
      *out_type = kDtypes[i].type;
      return pcp_ok_status();
    }
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kUnsupportedDtypes); ++i) {
    if (strcmp(kUnsupportedDtypes[i], name) == 0) {
      return pcp_make_status(
          PCP_STATUS_UNIMPLEMENTED,
          "%s: tensor '%s': dtype %s is not supported "
          "(supported: F32 F16 BF16 F64 BOOL I8..I64 U8..U64)",
          file, tensor, name);
    }
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "%s: tensor '%s': unknown dtype '%.32s'", file, tensor,
                         name);
}

static const char* dtype_name(pcp_element_type_t type) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kDtypes); ++i) {
    if (kDtypes[i].type == type) {
      return kDtypes[i].name;
    }
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// File
//===----------------------------------------------------------------------===//

struct pcp_safetensors_file_t {
  pcp_allocator_t allocator;
  // The mapping (NULL when parsing caller memory).
  void* mapping;
  size_t mapping_length;
  json_t* header;  // owns the name and metadata strings
  size_t tensor_count;
  pcp_safetensors_tensor_t tensors[];
};

void pcp_safetensors_file_release(pcp_safetensors_file_t* file) {
  if (file == NULL) {
    return;
  }
  if (file->mapping != NULL) {
    munmap(file->mapping, file->mapping_length);
  }
  json_decref(file->header);
  pcp_allocator_free(file->allocator, file);
}

typedef struct span_t {
  uint64_t begin;
  uint64_t end;
  size_t index;
} span_t;

static int span_compare(const void* a, const void* b) {
  const span_t* x = a;
  const span_t* y = b;
  if (x->begin != y->begin) {
    return x->begin < y->begin ? -1 : 1;
  }
  if (x->end != y->end) {
    return x->end < y->end ? -1 : 1;
  }
  return x->index < y->index ? -1 : (x->index > y->index);
}

// Reads a JSON integer in [0, INT64_MAX].
static bool json_to_u63(const json_t* value, uint64_t* out) {
  if (!json_is_integer(value) || json_integer_value(value) < 0) {
    return false;
  }
  *out = (uint64_t)json_integer_value(value);
  return true;
}

static pcp_status_t parse_tensor(const char* file, const char* name,
                                 json_t* entry, uint64_t data_length,
                                 pcp_safetensors_tensor_t* out,
                                 span_t* out_span) {
  if (!json_is_object(entry)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: tensor '%s' is not a JSON object", file, name);
  }
  json_t* dtype = json_object_get(entry, "dtype");
  json_t* shape = json_object_get(entry, "shape");
  json_t* offsets = json_object_get(entry, "data_offsets");
  if (!json_is_string(dtype) || !json_is_array(shape) ||
      !json_is_array(offsets)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "%s: tensor '%s' needs a string dtype, a shape array and a "
        "data_offsets array",
        file, name);
  }
  if (json_object_size(entry) != 3) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: tensor '%s' has fields other than dtype, "
                           "shape and data_offsets",
                           file, name);
  }
  out->name = name;
  PCP_RETURN_IF_ERROR_BARE(
      dtype_parse(file, name, json_string_value(dtype), &out->element_type));
  size_t rank = json_array_size(shape);
  if (rank > PCP_MAX_TENSOR_RANK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: tensor '%s' has rank %zu (at most %d)", file,
                           name, rank, PCP_MAX_TENSOR_RANK);
  }
  out->rank = (int32_t)rank;
  // Element count checked against the data region as it grows, so the
  // product cannot overflow: every factor is bounded by the region size
  // unless a zero dimension makes the tensor empty.
  uint64_t count = 1;
  bool empty = false;
  for (size_t d = 0; d < rank; ++d) {
    uint64_t dim = 0;
    if (!json_to_u63(json_array_get(shape, d), &dim)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: tensor '%s': shape[%zu] is not a "
                             "non-negative integer",
                             file, name, d);
    }
    out->dims[d] = (int64_t)dim;
    if (dim == 0) {
      empty = true;
    } else if (!empty) {
      if (dim > data_length || count > data_length / dim) {
        // More elements than the region has bytes: saturate (a later zero
        // dimension still makes the tensor empty).
        count = data_length + 1;
      } else {
        count *= dim;
      }
    }
  }
  if (empty) {
    count = 0;
  }
  uint64_t begin = 0;
  uint64_t end = 0;
  if (json_array_size(offsets) != 2 ||
      !json_to_u63(json_array_get(offsets, 0), &begin) ||
      !json_to_u63(json_array_get(offsets, 1), &end)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: tensor '%s': data_offsets must be two "
                           "non-negative integers",
                           file, name);
  }
  if (begin > end || end > data_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] outside "
                           "the data region of %llu bytes",
                           file, name, (unsigned long long)begin,
                           (unsigned long long)end,
                           (unsigned long long)data_length);
  }
  uint64_t element_size = pcp_element_type_byte_size(out->element_type);
  if (count > data_length || count * element_size != end - begin) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "%s: tensor '%s': %llu bytes in data_offsets but "
        "dtype x shape needs %s",
        file, name, (unsigned long long)(end - begin),
        count > data_length ? "more than the file holds" : "a different size");
  }
  out->element_count = (int64_t)count;
  out->byte_length = (size_t)(end - begin);
  out_span->begin = begin;
  out_span->end = end;
  return pcp_ok_status();
}

static pcp_status_t parse_file(const char* label, const uint8_t* bytes,
                               size_t byte_length, pcp_allocator_t allocator,
                               pcp_safetensors_file_t** out_file) {
  *out_file = NULL;
  if (byte_length < 8) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: truncated: %zu bytes, the header length alone "
                           "takes 8",
                           label, byte_length);
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) {
    header_length = (header_length << 8) | bytes[i];
  }
  // Both checks before any allocation: a hostile length costs nothing.
  if (header_length > PCP_SAFETENSORS_MAX_HEADER_BYTES) {
    return pcp_make_status(
        PCP_STATUS_RESOURCE_EXHAUSTED,
        "%s: header of %llu bytes exceeds the %llu byte cap", label,
        (unsigned long long)header_length,
        (unsigned long long)PCP_SAFETENSORS_MAX_HEADER_BYTES);
  }
  if (header_length > byte_length - 8) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: header length %llu runs past the end of the "
                           "file (%zu bytes)",
                           label, (unsigned long long)header_length,
                           byte_length);
  }
  if (header_length < 2 || bytes[8] != '{') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: the header is not a JSON object", label);
  }
  json_error_t error;
  json_t* header = json_loadb((const char*)bytes + 8, (size_t)header_length,
                              JSON_REJECT_DUPLICATES, &error);
  if (header == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: header JSON: %s at byte %d", label, error.text,
                           error.position);
  }
  if (!json_is_object(header)) {
    json_decref(header);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: the header is not a JSON object", label);
  }
  json_t* metadata = json_object_get(header, "__metadata__");
  if (metadata != NULL) {
    const char* key;
    json_t* value;
    bool ok = json_is_object(metadata);
    if (ok) {
      json_object_foreach(metadata, key, value) {
        ok = ok && json_is_string(value);
      }
    }
    if (!ok) {
      json_decref(header);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: __metadata__ must map strings to strings",
                             label);
    }
  }
  size_t count = json_object_size(header) - (metadata != NULL ? 1 : 0);
  uint64_t data_length = (uint64_t)(byte_length - 8 - header_length);
  pcp_safetensors_file_t* file = NULL;
  span_t* spans = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, sizeof(*file) + count * sizeof(file->tensors[0]),
      (void**)&file);
  if (!status) {
    status = pcp_allocator_malloc(allocator, (count + 1) * sizeof(span_t),
                                  (void**)&spans);
  }
  if (status) {
    pcp_allocator_free(allocator, file);
    json_decref(header);
    return status;
  }
  file->allocator = allocator;
  file->header = header;
  file->tensor_count = count;
  size_t at = 0;
  const char* name;
  json_t* entry;
  json_object_foreach(header, name, entry) {
    if (strcmp(name, "__metadata__") == 0) {
      continue;
    }
    status = parse_tensor(label, name, entry, data_length, &file->tensors[at],
                          &spans[at]);
    if (status) {
      break;
    }
    spans[at].index = at;
    ++at;
  }
  if (!status) {
    // The tensors must tile the data region: sorted by offset, each starts
    // where the previous ended and the last ends at the end of the file.
    qsort(spans, count, sizeof(span_t), span_compare);
    uint64_t cursor = 0;
    for (size_t i = 0; i < count && !status; ++i) {
      if (spans[i].begin != cursor) {
        status = pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "%s: tensor '%s' starts at data offset %llu but the previous "
            "tensor ends at %llu (%s)",
            label, file->tensors[spans[i].index].name,
            (unsigned long long)spans[i].begin, (unsigned long long)cursor,
            spans[i].begin < cursor ? "overlap" : "gap");
      }
      cursor = spans[i].end;
    }
    if (!status && cursor != data_length) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: tensors cover %llu of the %llu data bytes",
                               label, (unsigned long long)cursor,
                               (unsigned long long)data_length);
    }
  }
  if (!status) {
    const uint8_t* data = bytes + 8 + header_length;
    for (size_t i = 0; i < count; ++i) {
      // begin is recovered from the span table (same index).
      file->tensors[spans[i].index].data = data + spans[i].begin;
    }
  }
  pcp_allocator_free(allocator, spans);
  if (status) {
    pcp_safetensors_file_release(file);
    return status;
  }
  *out_file = file;
  return pcp_ok_status();
}

pcp_status_t pcp_safetensors_file_parse(const void* data, size_t byte_length,
                                        pcp_allocator_t allocator,
                                        pcp_safetensors_file_t** out_file) {
  return parse_file("<memory>", data, byte_length, allocator, out_file);
}

pcp_status_t pcp_safetensors_file_open(const char* path,
                                       pcp_allocator_t allocator,
                                       pcp_safetensors_file_t** out_file) {
  *out_file = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "open %s", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return pcp_status_from_errno(err, "stat %s", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s is not a regular file", path);
  }
  size_t length = (size_t)st.st_size;
  if (length < 8) {
    close(fd);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: truncated: %zu bytes, the header length alone "
                           "takes 8",
                           path, length);
  }
  // MAP_PRIVATE + PROT_READ: the views are read-only; pages load lazily,
  // so opening a large checkpoint reads only its header.
  void* mapping = mmap(NULL, length, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) {
    int err = errno;
    close(fd);
    return pcp_status_from_errno(err, "mmap %s", path);
  }
  close(fd);
  pcp_status_t status = parse_file(path, mapping, length, allocator, out_file);
  if (status) {
    munmap(mapping, length);
    return status;
  }
  (*out_file)->mapping = mapping;
  (*out_file)->mapping_length = length;
  return pcp_ok_status();
}

size_t pcp_safetensors_file_tensor_count(const pcp_safetensors_file_t* file) {
  return file->tensor_count;
}

const pcp_safetensors_tensor_t* pcp_safetensors_file_tensor(
    const pcp_safetensors_file_t* file, size_t index) {
  return index < file->tensor_count ? &file->tensors[index] : NULL;
}

const pcp_safetensors_tensor_t* pcp_safetensors_file_find(
    const pcp_safetensors_file_t* file, const char* name) {
  // Linear: checkpoints hold hundreds of tensors and a load looks each up
  // once; jansson's hash would give the index only through another table.
  for (size_t i = 0; i < file->tensor_count; ++i) {
    if (strcmp(file->tensors[i].name, name) == 0) {
      return &file->tensors[i];
    }
  }
  return NULL;
}

const char* pcp_safetensors_file_metadata(const pcp_safetensors_file_t* file,
                                          const char* key) {
  json_t* metadata = json_object_get(file->header, "__metadata__");
  return json_string_value(json_object_get(metadata, key));
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

static pcp_status_t write_bytes(FILE* stream, const char* path,
                                const void* data, size_t length) {
  if (length > 0 && fwrite(data, 1, length, stream) != length) {
    return pcp_status_from_errno(errno, "write %s", path);
  }
  return pcp_ok_status();
}

static pcp_status_t build_header(const pcp_safetensors_tensor_t* tensors,
                                 size_t tensor_count,
                                 const char* const* metadata,
                                 size_t metadata_count, char** out_text) {
  *out_text = NULL;
  json_t* root = json_object();
  pcp_status_t status = root ? pcp_ok_status()
                             : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                               "safetensors header");
  if (!status && metadata_count > 0) {
    json_t* object = json_object();
    for (size_t i = 0; object && i < metadata_count; ++i) {
      if (json_object_set_new(object, metadata[2 * i],
                              json_string(metadata[2 * i + 1])) != 0) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "safetensors metadata '%s' is not UTF-8",
                                 metadata[2 * i]);
        break;
      }
    }
    if (object == NULL ||
        json_object_set_new(root, "__metadata__", object) != 0) {
      status =
          pcp_status_join(status, pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                                  "safetensors metadata"));
    }
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensor_count && !status; ++i) {
    const pcp_safetensors_tensor_t* t = &tensors[i];
    const char* dtype = dtype_name(t->element_type);
    if (t->name == NULL || t->name[0] == 0 ||
        strcmp(t->name, "__metadata__") == 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "safetensors: tensor %zu has no usable name", i);
      break;
    }
    if (json_object_get(root, t->name) != NULL) {
      status =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                          "safetensors: tensor '%s' appears twice", t->name);
      break;
    }
    if (dtype == NULL || t->rank < 0 || t->rank > PCP_MAX_TENSOR_RANK) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "safetensors: tensor '%s': dtype %s or rank %d "
                               "cannot be written",
                               t->name, pcp_element_type_name(t->element_type),
                               (int)t->rank);
      break;
    }
    uint64_t count = 1;
    json_t* shape = json_array();
    for (int32_t d = 0; d < t->rank; ++d) {
      count *= (uint64_t)t->dims[d];
      json_array_append_new(shape, json_integer(t->dims[d]));
    }
    if (count * pcp_element_type_byte_size(t->element_type) != t->byte_length) {
      json_decref(shape);
      status = pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "safetensors: tensor '%s': %zu bytes given, "
          "dtype x shape is %llu",
          t->name, t->byte_length,
          (unsigned long long)(count *
                               pcp_element_type_byte_size(t->element_type)));
      break;
    }
    json_t* entry = json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype, "shape",
                              shape, "data_offsets", (json_int_t)offset,
                              (json_int_t)offset + (json_int_t)t->byte_length);
    if (entry == NULL || json_object_set_new(root, t->name, entry) != 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "safetensors: tensor '%s' (name not UTF-8?)",
                               t->name);
    }
    offset += t->byte_length;
  }
  if (!status) {
    *out_text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (*out_text == NULL) {
      status =
          pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "safetensors header");
    }
  }
  json_decref(root);
  return status;
}

pcp_status_t pcp_safetensors_write(const char* path,
                                   const pcp_safetensors_tensor_t* tensors,
                                   size_t tensor_count,
                                   const char* const* metadata,
                                   size_t metadata_count) {
  char* header = NULL;
  PCP_RETURN_IF_ERROR(
      build_header(tensors, tensor_count, metadata, metadata_count, &header),
      "writing %s", path);
  // |header| is json_dumps's (jansson's malloc): pcp_libc_free below.
  size_t header_length = strlen(header);
  // The format pads the header with spaces so the data region starts on an
  // 8-byte boundary (the reference writer does the same).
  size_t padded = (header_length + 7) & ~(size_t)7;
  char temp_path[PATH_MAX];
  int n =
      snprintf(temp_path, sizeof(temp_path), "%s.tmp.%d", path, (int)getpid());
  // |header| is json_dumps' text (jansson allocates it with libc malloc).
  if (n < 0 || (size_t)n >= sizeof(temp_path)) {
    pcp_libc_free(header);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "path too long: %s",
                           path);
  }
  FILE* stream = fopen(temp_path, "wb");
  if (stream == NULL) {
    int err = errno;
    pcp_libc_free(header);
    return pcp_status_from_errno(err, "create %s", temp_path);
  }
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) {
    length_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  }
  pcp_status_t status = write_bytes(stream, temp_path, length_bytes, 8);
  if (!status) {
    status = write_bytes(stream, temp_path, header, header_length);
  }
  for (size_t i = header_length; i < padded && !status; ++i) {
    status = write_bytes(stream, temp_path, " ", 1);
  }
  pcp_libc_free(header);
  for (size_t i = 0; i < tensor_count && !status; ++i) {
    status =
        write_bytes(stream, temp_path, tensors[i].data, tensors[i].byte_length);
  }
  if (!status && (fflush(stream) != 0 || fsync(fileno(stream)) != 0)) {
    status = pcp_status_from_errno(errno, "sync %s", temp_path);
  }
  if (fclose(stream) != 0 && !status) {
    status = pcp_status_from_errno(errno, "close %s", temp_path);
  }
  if (!status && rename(temp_path, path) != 0) {
    status = pcp_status_from_errno(errno, "rename %s", path);
  }
  if (status) {
    unlink(temp_path);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

struct pcp_safetensors_checkpoint_t {
  pcp_allocator_t allocator;
  size_t shard_count;
  size_t tensor_count;
  // tensors[i] points into one of the shards.
  const pcp_safetensors_tensor_t** tensors;
  pcp_safetensors_file_t* shards[];
};

void pcp_safetensors_checkpoint_release(
    pcp_safetensors_checkpoint_t* checkpoint) {
  if (checkpoint == NULL) {
    return;
  }
  for (size_t i = 0; i < checkpoint->shard_count; ++i) {
    pcp_safetensors_file_release(checkpoint->shards[i]);
  }
  pcp_allocator_free(checkpoint->allocator, checkpoint->tensors);
  pcp_allocator_free(checkpoint->allocator, checkpoint);
}

static bool ends_with(const char* text, const char* suffix) {
  size_t a = strlen(text);
  size_t b = strlen(suffix);
  return a >= b && strcmp(text + a - b, suffix) == 0;
}

// Builds the flat tensor list and rejects a name present in two shards.
static pcp_status_t checkpoint_index_tensors(
    pcp_safetensors_checkpoint_t* checkpoint) {
  size_t total = 0;
  for (size_t i = 0; i < checkpoint->shard_count; ++i) {
    total += pcp_safetensors_file_tensor_count(checkpoint->shards[i]);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      checkpoint->allocator, (total + 1) * sizeof(checkpoint->tensors[0]),
      (void**)&checkpoint->tensors));
  for (size_t i = 0; i < checkpoint->shard_count; ++i) {
    const pcp_safetensors_file_t* shard = checkpoint->shards[i];
    for (size_t j = 0; j < shard->tensor_count; ++j) {
      const pcp_safetensors_tensor_t* t = &shard->tensors[j];
      for (size_t k = 0; k < i; ++k) {
        if (pcp_safetensors_file_find(checkpoint->shards[k], t->name)) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "tensor '%s' is in shards %zu and %zu",
                                 t->name, k, i);
        }
      }
      checkpoint->tensors[checkpoint->tensor_count++] = t;
    }
  }
  return pcp_ok_status();
}

static pcp_status_t open_index(const char* path, pcp_allocator_t allocator,
                               pcp_safetensors_checkpoint_t** out) {
  json_error_t error;
  // An index is a few hundred KB for the largest public models.
  json_t* root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
  if (root == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: %s (line %d)",
                           path, error.text, error.line);
  }
  json_t* map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    json_decref(root);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: no weight_map object", path);
  }
  // Distinct shard names, in order of first appearance.
  const char* shard_names[PCP_SAFETENSORS_MAX_SHARDS] = {0};
  size_t shard_count = 0;
  const char* key;
  json_t* value;
  pcp_status_t status = pcp_ok_status();
  json_object_foreach(map, key, value) {
    const char* shard = json_string_value(value);
    if (shard == NULL || shard[0] == 0 || shard[0] == '/' ||
        strstr(shard, "..") != NULL) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: weight_map['%s'] must be a file name "
                               "relative to the index",
                               path, key);
      break;
    }
    size_t s = 0;
    while (s < shard_count && strcmp(shard_names[s], shard) != 0) {
      ++s;
    }
    if (s == shard_count) {
      if (shard_count == PCP_SAFETENSORS_MAX_SHARDS) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                 "%s: more than %d shards", path,
                                 PCP_SAFETENSORS_MAX_SHARDS);
        break;
      }
      shard_names[shard_count++] = shard;
    }
  }
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, sizeof(*checkpoint) + shard_count * sizeof(void*),
        (void**)&checkpoint);
  }
  if (!status) {
    checkpoint->allocator = allocator;
    const char* slash = strrchr(path, '/');
    int dir_length = slash ? (int)(slash - path + 1) : 0;
    for (size_t s = 0; s < shard_count && !status; ++s) {
      char shard_path[PATH_MAX];
      int n = snprintf(shard_path, sizeof(shard_path), "%.*s%s", dir_length,
                       path, shard_names[s]);
      if (n < 0 || (size_t)n >= sizeof(shard_path)) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "shard path too long: %s", shard_names[s]);
        break;
      }
      status = pcp_safetensors_file_open(shard_path, allocator,
                                         &checkpoint->shards[s]);
      if (!status) {
        checkpoint->shard_count = s + 1;
      }
    }
  }
  if (!status) {
    status = checkpoint_index_tensors(checkpoint);
  }
  if (!status) {
    // Every weight_map entry must be where the index says.
    json_object_foreach(map, key, value) {
      size_t s = 0;
      while (strcmp(shard_names[s], json_string_value(value)) != 0) {
        ++s;
      }
      if (pcp_safetensors_file_find(checkpoint->shards[s], key) == NULL) {
        status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                                 "%s: tensor '%s' is not in shard %s", path,
                                 key, shard_names[s]);
        break;
      }
    }
  }
  json_decref(root);
  if (status) {
    pcp_safetensors_checkpoint_release(checkpoint);
    return status;
  }
  *out = checkpoint;
  return pcp_ok_status();
}

pcp_status_t pcp_safetensors_checkpoint_open(
    const char* path, pcp_allocator_t allocator,
    pcp_safetensors_checkpoint_t** out_checkpoint) {
  *out_checkpoint = NULL;
  struct stat st;
  if (stat(path, &st) != 0) {
    return pcp_status_from_errno(errno, "checkpoint %s", path);
  }
  if (S_ISDIR(st.st_mode)) {
    char candidate[PATH_MAX];
    int n = snprintf(candidate, sizeof(candidate),
                     "%s/model.safetensors.index.json", path);
    if (n < 0 || (size_t)n >= sizeof(candidate)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "path too long: %s",
                             path);
    }
    if (!pcp_file_exists(candidate)) {
      snprintf(candidate, sizeof(candidate), "%s/model.safetensors", path);
      if (!pcp_file_exists(candidate)) {
        return pcp_make_status(PCP_STATUS_NOT_FOUND,
                               "%s holds neither model.safetensors.index.json "
                               "nor model.safetensors",
                               path);
      }
    }
    return pcp_safetensors_checkpoint_open(candidate, allocator,
                                           out_checkpoint);
  }
  if (ends_with(path, ".json")) {
    return open_index(path, allocator, out_checkpoint);
  }
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, sizeof(*checkpoint) + sizeof(void*), (void**)&checkpoint));
  checkpoint->allocator = allocator;
  pcp_status_t status =
      pcp_safetensors_file_open(path, allocator, &checkpoint->shards[0]);
  if (!status) {
    checkpoint->shard_count = 1;
    status = checkpoint_index_tensors(checkpoint);
  }
  if (status) {
    pcp_safetensors_checkpoint_release(checkpoint);
    return status;
  }
  *out_checkpoint = checkpoint;
  return pcp_ok_status();
}

size_t pcp_safetensors_checkpoint_tensor_count(
    const pcp_safetensors_checkpoint_t* checkpoint) {
  return checkpoint->tensor_count;
}

const pcp_safetensors_tensor_t* pcp_safetensors_checkpoint_tensor(
    const pcp_safetensors_checkpoint_t* checkpoint, size_t index) {
  return index < checkpoint->tensor_count ? checkpoint->tensors[index] : NULL;
}

const pcp_safetensors_tensor_t* pcp_safetensors_checkpoint_find(
    const pcp_safetensors_checkpoint_t* checkpoint, const char* name) {
  for (size_t i = 0; i < checkpoint->shard_count; ++i) {
    const pcp_safetensors_tensor_t* t =
        pcp_safetensors_file_find(checkpoint->shards[i], name);
    if (t != NULL) {
      return t;
    }
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// Parameter tables
//===----------------------------------------------------------------------===//

static float load_element(const uint8_t* data, pcp_element_type_t type,
                          size_t i) {
  if (type == PCP_ELEMENT_TYPE_F32) {
    float value;
    memcpy(&value, data + 4 * i, 4);
    return value;
  }
  uint16_t half;
  memcpy(&half, data + 2 * i, 2);
  return type == PCP_ELEMENT_TYPE_BF16 ? pcp_bf16_to_f32(half)
                                       : pcp_f16_to_f32(half);
}

static void format_dims(int32_t rank, const int64_t* dims, char* buffer,
                        size_t capacity) {
  size_t at = (size_t)snprintf(buffer, capacity, "[");
  for (int32_t d = 0; d < rank && at + 24 < capacity; ++d) {
    at += (size_t)snprintf(buffer + at, capacity - at, "%s%lld", d ? ", " : "",
                           (long long)dims[d]);
  }
  snprintf(buffer + at, capacity - at, "]");
}

static pcp_status_t convert_into(const pcp_models_parameter_t* p,
                                 const pcp_safetensors_tensor_t* t,
                                 void* buffer) {
  if (t->rank != p->rank || t->dims[0] != p->dims[0] ||
      (p->rank == 2 && t->dims[1] != p->dims[1])) {
    char got[200];
    char want[64];
    format_dims(t->rank, t->dims, got, sizeof(got));
    format_dims(p->rank, p->dims, want, sizeof(want));
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "tensor '%s': shape %s in the checkpoint, the model expects %s",
        p->name, got, want);
  }
  if (t->element_type != PCP_ELEMENT_TYPE_F32 &&
      t->element_type != PCP_ELEMENT_TYPE_BF16 &&
      t->element_type != PCP_ELEMENT_TYPE_F16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "tensor '%s': dtype %s cannot be converted to %s",
                           p->name, pcp_element_type_name(t->element_type),
                           pcp_element_type_name(p->element_type));
  }
  if (t->element_type == p->element_type) {
    memcpy(buffer, t->data, p->byte_length);
    return pcp_ok_status();
  }
  const uint8_t* src = t->data;
  size_t count = (size_t)p->element_count;
  if (p->element_type == PCP_ELEMENT_TYPE_F32) {
    float* dst = buffer;
    for (size_t i = 0; i < count; ++i) {
      dst[i] = load_element(src, t->element_type, i);
    }
  } else if (p->element_type == PCP_ELEMENT_TYPE_BF16) {
    uint16_t* dst = buffer;
    for (size_t i = 0; i < count; ++i) {
      dst[i] = pcp_f32_to_bf16(load_element(src, t->element_type, i));
    }
  } else {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "parameter '%s' has dtype %s", p->name,
                           pcp_element_type_name(p->element_type));
  }
  return pcp_ok_status();
}

static const char kEmbedName[] = "model.embed_tokens.weight";
static const char kLmHeadName[] = "lm_head.weight";

pcp_status_t pcp_models_safetensors_load(
    const pcp_models_parameter_table_t* table,
    const pcp_safetensors_checkpoint_t* checkpoint, bool tie_word_embeddings,
    void* const* buffers) {
  for (size_t i = 0; i < table->count; ++i) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    const pcp_safetensors_tensor_t* t =
        pcp_safetensors_checkpoint_find(checkpoint, p->name);
    if (t == NULL && tie_word_embeddings && strcmp(p->name, kLmHeadName) == 0) {
      t = pcp_safetensors_checkpoint_find(checkpoint, kEmbedName);
    }
    if (t == NULL) {
      return pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "tensor '%s' (parameter %zu) is missing from the "
                             "checkpoint",
                             p->name, i);
    }
    PCP_RETURN_IF_ERROR_BARE(convert_into(p, t, buffers[i]));
  }
  for (size_t i = 0; i < checkpoint->tensor_count; ++i) {
    const char* name = checkpoint->tensors[i]->name;
    if (pcp_models_parameter_table_find(table, name) >= 0 ||
        ends_with(name, ".rotary_emb.inv_freq") ||
        strcmp(name, kLmHeadName) == 0) {
      // lm_head.weight here means the table is tied (else it was found).
      continue;
    }
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unexpected tensor '%s' in the checkpoint (the "
                           "model has no such parameter)",
                           name);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_models_safetensors_save(
    const pcp_models_parameter_table_t* table, const void* const* buffers,
    const char* path) {
  pcp_safetensors_tensor_t* tensors = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      table->allocator, (table->count + 1) * sizeof(*tensors),
      (void**)&tensors));
  for (size_t i = 0; i < table->count; ++i) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    tensors[i].name = p->name;
    tensors[i].element_type = p->element_type;
    tensors[i].rank = p->rank;
    for (int32_t d = 0; d < p->rank; ++d) {
      tensors[i].dims[d] = p->dims[d];
    }
    tensors[i].element_count = p->element_count;
    tensors[i].data = buffers[i];
    tensors[i].byte_length = p->byte_length;
  }
  static const char* const kMetadata[] = {"format", "pt"};
  pcp_status_t status =
      pcp_safetensors_write(path, tensors, table->count, kMetadata, 1);
  pcp_allocator_free(table->allocator, tensors);
  return status;
}
