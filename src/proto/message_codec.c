// SPDX-License-Identifier: Apache-2.0
//
// The one encoder and the one parser of the typed messages: both walk a
// message's field table (proto_impl.h; tables in messages.c). Every limit
// and error text of the former per-message code is kept here, per kind, so
// that adding a message is a table, not another hand-written pair.

#include <string.h>

#include "proto/proto_impl.h"

// Chains a status-returning step: later steps run only while all is well.
#define TRY_(expr)     \
  do {                 \
    if (!status)       \
      status = (expr); \
  } while (0)

#define STR_MAX_ PCP_PROTO_MAX_STRING_BYTES

static_assert(sizeof(pcp_proto_program_ack_status_t) == sizeof(int) &&
                  sizeof(pcp_proto_blob_kind_t) == sizeof(int) &&
                  sizeof(pcp_proto_task_state_t) == sizeof(int),
              "ENUM fields are read and written as int");

//===----------------------------------------------------------------------===//
// Member access
//===----------------------------------------------------------------------===//

static uint64_t load_uint(const uint8_t* base, const pcp_proto_field_t* f) {
  const uint8_t* p = base + f->offset;
  switch (f->size) {
    case 2: {
      uint16_t v;
      memcpy(&v, p, sizeof(v));
      return v;
    }
    case 4: {
      uint32_t v;
      memcpy(&v, p, sizeof(v));
      return v;
    }
    default: {
      PCP_ASSERT(f->size == 8);
      uint64_t v;
      memcpy(&v, p, sizeof(v));
      return v;
    }
  }
}

static void store_uint(uint8_t* base, const pcp_proto_field_t* f,
                       uint64_t value) {
  uint8_t* p = base + f->offset;
  switch (f->size) {
    case 2: {
      uint16_t v = (uint16_t)value;
      memcpy(p, &v, sizeof(v));
      break;
    }
    case 4: {
      uint32_t v = (uint32_t)value;
      memcpy(p, &v, sizeof(v));
      break;
    }
    default: {
      PCP_ASSERT(f->size == 8);
      memcpy(p, &value, sizeof(value));
      break;
    }
  }
}

static int64_t load_int(const uint8_t* base, const pcp_proto_field_t* f) {
  if (f->size == 4) {
    int32_t v;
    memcpy(&v, base + f->offset, sizeof(v));
    return v;
  }
  PCP_ASSERT(f->size == 8);
  int64_t v;
  memcpy(&v, base + f->offset, sizeof(v));
  return v;
}

static void store_int(uint8_t* base, const pcp_proto_field_t* f,
                      int64_t value) {
  if (f->size == 4) {
    int32_t v = (int32_t)value;
    memcpy(base + f->offset, &v, sizeof(v));
    return;
  }
  PCP_ASSERT(f->size == 8);
  memcpy(base + f->offset, &value, sizeof(value));
}

#define MEMBER_(base, f, type) ((type*)(void*)((base) + (f)->offset))
#define COUNT_(base, f) ((uint32_t*)(void*)((base) + (f)->count_offset))
#define PRESENT_(base, f) ((bool*)(void*)((base) + (f)->presence_offset))

static size_t name_count(const char* const* names) {
  size_t n = 0;
  while (names[n]) ++n;
  return n;
}

static pcp_status_t oom(void) {
  return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
}

//===----------------------------------------------------------------------===//
// Runs of indexed names (s.3.9, from PCP_PROTO_VERSION_RUNS)
//===----------------------------------------------------------------------===//

// The largest index a run may name: nine decimal digits, so that first +
// count - 1 and every expanded index fit a uint32_t with room to spare.
#define RUN_INDEX_MAX_ 999999999u

// Splits |name| into a prefix and the decimal index its trailing digits
// spell ("layer1.w12" -> "layer1.w", 12). False without such an index, with
// a leading zero ("p01": the expansion "p1" would be another name) or with
// more than nine digits.
static bool name_split(const char* name, size_t* out_prefix_length,
                       uint32_t* out_index) {
  if (!name) {
    return false;
  }
  size_t length = strnlen(name, STR_MAX_ + 1);
  if (length > STR_MAX_) {
    return false;
  }
  size_t start = length;
  while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9') {
    --start;
  }
  size_t digits = length - start;
  if (digits == 0 || digits > 9 || (digits > 1 && name[start] == '0')) {
    return false;
  }
  uint32_t index = 0;
  for (size_t i = start; i < length; ++i) {
    index = index * 10 + (uint32_t)(name[i] - '0');
  }
  *out_prefix_length = start;
  *out_index = index;
  return true;
}

// Whether |name| is the |prefix_length| bytes of |prefix| then |index|.
static bool name_continues(const char* name, const char* prefix,
                           size_t prefix_length, uint64_t index) {
  size_t length = 0;
  uint32_t k = 0;
  return name_split(name, &length, &k) && length == prefix_length &&
         k == index && memcmp(name, prefix, length) == 0;
}

static size_t digit_count(uint64_t value) {
  size_t n = 1;
  while (value >= 10) {
    value /= 10;
    ++n;
  }
  return n;
}

// A run entry as read from the wire, checked: |count| names |prefix| +
// first, first + 1, ... (keep runs: for outputs output, output + 1, ...).
typedef struct run_t {
  const char* prefix;
  size_t prefix_length;
  uint32_t first;
  uint32_t count;
  uint32_t output;
} run_t;

// Reads the run entry |e| whose prefix is under |key| ("resident_run" or
// "keep_run"; the latter also has "output"), at most |max_count| names.
static pcp_status_t run_read(const json_t* e, const char* key,
                             uint64_t max_count, const char* what,
                             run_t* out_run) {
  const char* prefix = NULL;
  uint64_t first = 0;
  uint64_t count = 0;
  PCP_RETURN_IF_ERROR(pcp_proto_json_string(e, key, 0, STR_MAX_, &prefix), "%s",
                      what);
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(e, "first", RUN_INDEX_MAX_, &first),
                      "%s", what);
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(e, "count", max_count, &count), "%s",
                      what);
  if (count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: a run of 0 names",
                           what);
  }
  uint64_t last = first + count - 1;  // both bounded: no overflow
  if (last > RUN_INDEX_MAX_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: index %llu past %u", what,
                           (unsigned long long)last, RUN_INDEX_MAX_);
  }
  size_t prefix_length = strlen(prefix);
  if (prefix_length + digit_count(last) > STR_MAX_) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "%s: names of %zu bytes, at most %u", what,
        prefix_length + digit_count(last), (unsigned)STR_MAX_);
  }
  uint64_t output = 0;
  if (strcmp(key, "keep_run") == 0) {
    PCP_RETURN_IF_ERROR(
        pcp_proto_json_u64(e, "output", PCP_PROTO_MAX_TASK_TENSORS, &output),
        "%s", what);
    if (output + count - 1 > PCP_PROTO_MAX_TASK_TENSORS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: output %llu past %u", what,
                             (unsigned long long)(output + count - 1),
                             (unsigned)PCP_PROTO_MAX_TASK_TENSORS);
    }
  }
  *out_run = (run_t){.prefix = prefix,
                     .prefix_length = prefix_length,
                     .first = (uint32_t)first,
                     .count = (uint32_t)count,
                     .output = (uint32_t)output};
  return pcp_ok_status();
}

// Bytes the names of |run| take expanded, terminators included (each
// counted with the widest index: an upper bound, cheap to check).
static size_t run_name_bytes(const run_t* run) {
  return (size_t)run->count *
         (run->prefix_length +
          digit_count((uint64_t)run->first + run->count - 1) + 1);
}

// Writes name |k| of |run| at |*cursor| (room counted by run_name_bytes)
// and moves the cursor past it.
static const char* run_name(const run_t* run, uint32_t k, char** cursor) {
  char* name = *cursor;
  size_t room = run->prefix_length +
                digit_count((uint64_t)run->first + run->count - 1) + 1;
  int n = snprintf(name, room, "%.*s%u", (int)run->prefix_length, run->prefix,
                   run->first + k);
  *cursor += (size_t)n + 1;
  return name;
}

// Appends to |array| the run entry {|key|: the first |prefix_length| bytes
// of |name|, "first", "count"} (keep runs: |output| too).
static pcp_status_t run_to_json(const char* key, const char* name,
                                size_t prefix_length, uint32_t first,
                                uint32_t count, const uint32_t* output,
                                json_t* array) {
  char prefix[STR_MAX_ + 1];
  memcpy(prefix, name, prefix_length);
  prefix[prefix_length] = '\0';
  json_t* e = json_object();
  if (!e) {
    return oom();
  }
  pcp_status_t status = pcp_proto_json_set_string(e, key, prefix, STR_MAX_);
  if (output) {
    TRY_(pcp_proto_json_set(e, "output", json_integer(*output)));
  }
  TRY_(pcp_proto_json_set(e, "first", json_integer(first)));
  TRY_(pcp_proto_json_set(e, "count", json_integer(count)));
  if (!status && json_array_append_new(array, e) != 0) {
    status = oom();
  } else if (status) {
    json_decref(e);
  }
  return status;
}

// The expanded length of the list |array| of field |f| (TENSOR_REFS, or an
// ARRAY with FLAG_KEEP_RUNS) and the bytes its runs' names take, checked
// against |f->max| before anything is allocated. Runs in a frame older
// than PCP_PROTO_VERSION_RUNS are an error: a v1 peer never sends them.
static pcp_status_t list_extent(const pcp_proto_field_t* f, const json_t* array,
                                uint16_t version, uint32_t* out_count,
                                size_t* out_name_bytes) {
  const char* run_key =
      f->kind == PCP_PROTO_FIELD_TENSOR_REFS ? "resident_run" : "keep_run";
  uint64_t count = 0;
  size_t name_bytes = 0;
  for (size_t i = 0; i < json_array_size(array); ++i) {
    const json_t* e = json_array_get(array, i);
    if (!json_object_get(e, run_key)) {
      ++count;
      continue;
    }
    char what[64];
    snprintf(what, sizeof(what), "key '%s'[%zu]", f->key, i);
    if (version < PCP_PROTO_VERSION_RUNS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: '%s' needs protocol version %u, the frame "
                             "is version %u",
                             what, run_key, PCP_PROTO_VERSION_RUNS, version);
    }
    run_t run;
    PCP_RETURN_IF_ERROR_BARE(run_read(e, run_key, f->max, what, &run));
    count += run.count;
    if (count > f->max) {
      break;
    }
    name_bytes += run_name_bytes(&run);
  }
  if (count > f->max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': more than %u entries once its runs are "
                           "expanded",
                           f->key, (unsigned)f->max);
  }
  *out_count = (uint32_t)count;
  *out_name_bytes = name_bytes;
  return pcp_ok_status();
}

// The length of the run of RESIDENT refs "<prefix><k>", "<prefix><k+1>",
// ... that starts at refs[i]; 1 when refs[i] starts none.
static uint32_t resident_run_length(const pcp_proto_tensor_ref_t* refs,
                                    uint32_t i, uint32_t count,
                                    size_t* out_prefix_length,
                                    uint32_t* out_first) {
  if (refs[i].kind != PCP_PROTO_TENSOR_REF_RESIDENT ||
      !name_split(refs[i].name, out_prefix_length, out_first)) {
    return 1;
  }
  uint32_t n = 1;
  while (i + n < count && refs[i + n].kind == PCP_PROTO_TENSOR_REF_RESIDENT &&
         name_continues(refs[i + n].name, refs[i].name, *out_prefix_length,
                        (uint64_t)*out_first + n)) {
    ++n;
  }
  return n;
}

// The same for keep entries, whose outputs must be consecutive too.
static uint32_t keep_run_length(const pcp_proto_keep_resident_t* keep,
                                uint32_t i, uint32_t count,
                                size_t* out_prefix_length,
                                uint32_t* out_first) {
  if (!name_split(keep[i].as, out_prefix_length, out_first)) {
    return 1;
  }
  uint32_t n = 1;
  while (i + n < count &&
         (uint64_t)keep[i + n].output == (uint64_t)keep[i].output + n &&
         name_continues(keep[i + n].as, keep[i].as, *out_prefix_length,
                        (uint64_t)*out_first + n)) {
    ++n;
  }
  return n;
}

//===----------------------------------------------------------------------===//
// Tensor references (s.3.9)
//===----------------------------------------------------------------------===//

// "init" refs (seeded initial parameters): names of pcp_proto_init_kind_t.
static const char* const kInitNames[] = {"normal", "ones", "zeros", NULL};

pcp_status_t pcp_proto_init_ref_validate(const pcp_proto_tensor_ref_t* ref) {
  if ((unsigned)ref->init > PCP_PROTO_INIT_ZEROS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "init ref: unknown init kind %d", (int)ref->init);
  }
  if (ref->element_type != PCP_ELEMENT_TYPE_F32 &&
      ref->element_type != PCP_ELEMENT_TYPE_BF16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "init ref: dtype %d is not f32 or bf16",
                           (int)ref->element_type);
  }
  if (ref->rank < 1 || ref->rank > PCP_MAX_TENSOR_RANK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "init ref: rank %u not in 1..%d", ref->rank,
                           PCP_MAX_TENSOR_RANK);
  }
  for (uint32_t d = 0; d < ref->rank; ++d) {
    if (ref->shape[d] < 1) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "init ref: dim %u is %lld, must be >= 1", d,
                             (long long)ref->shape[d]);
    }
  }
  uint64_t bytes = 0;
  if (!pcp_proto_tensor_byte_length(ref->element_type, ref->rank, ref->shape,
                                    &bytes) ||
      bytes > PCP_PROTO_CEILING_INIT_REF_BYTES) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "init ref: the tensor would exceed %llu bytes",
        (unsigned long long)PCP_PROTO_CEILING_INIT_REF_BYTES);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_init_refs_validate(const pcp_proto_tensor_ref_t* refs,
                                          uint32_t count) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const pcp_proto_tensor_ref_t* r = &refs[i];
    if (r->kind != PCP_PROTO_TENSOR_REF_INIT) {
      continue;
    }
    PCP_RETURN_IF_ERROR(pcp_proto_init_ref_validate(r), "input %u", i);
    uint64_t bytes = 0;
    // Validated: the length is known and at most the per-ref ceiling, so
    // the sum of at most 2^32 of them cannot wrap.
    (void)pcp_proto_tensor_byte_length(r->element_type, r->rank, r->shape,
                                       &bytes);
    total += bytes;
    if (total > PCP_PROTO_CEILING_INIT_REFS_TOTAL_BYTES) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "init refs: inputs 0..%u would make the worker allocate more "
          "than %llu bytes in all",
          i, (unsigned long long)PCP_PROTO_CEILING_INIT_REFS_TOTAL_BYTES);
    }
  }
  return pcp_ok_status();
}

// {"init", "seed" (16 hex digits: JSON numbers lose bits past 2^53),
// "index", "dtype", "shape"} of a valid INIT ref.
static pcp_status_t init_ref_to_json(const pcp_proto_tensor_ref_t* r,
                                     json_t* e) {
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_init_ref_validate(r));
  char seed[17];
  snprintf(seed, sizeof(seed), "%016llx", (unsigned long long)r->seed);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_json_set(e, "init", json_string(kInitNames[r->init])));
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_set(e, "seed", json_string(seed)));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_json_set(e, "index", json_integer((json_int_t)r->index)));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_json_set(e, "dtype", json_integer(r->element_type)));
  json_t* shape = json_array();
  if (!shape) {
    return oom();
  }
  for (uint32_t d = 0; d < r->rank; ++d) {
    if (json_array_append_new(shape, json_integer(r->shape[d])) != 0) {
      json_decref(shape);
      return oom();
    }
  }
  return pcp_proto_json_set(e, "shape", shape);
}

static pcp_status_t init_ref_from_json(const json_t* e, const char* what,
                                       pcp_proto_tensor_ref_t* r) {
  const char* init = NULL;
  const char* seed = NULL;
  uint64_t index = 0, dtype = 0;
  r->kind = PCP_PROTO_TENSOR_REF_INIT;
  PCP_RETURN_IF_ERROR(pcp_proto_json_string(e, "init", 1, 16, &init), "%s",
                      what);
  size_t k = 0;
  while (kInitNames[k] && strcmp(kInitNames[k], init) != 0) {
    ++k;
  }
  if (!kInitNames[k]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: init must be normal, ones or zeros", what);
  }
  r->init = (pcp_proto_init_kind_t)k;
  PCP_RETURN_IF_ERROR(pcp_proto_json_string(e, "seed", 16, 16, &seed), "%s",
                      what);
  r->seed = 0;
  for (size_t i = 0; i < 16; ++i) {
    char c = seed[i];
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                   : -1;
    if (v < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: seed must be 16 lowercase hex digits", what);
    }
    r->seed = (r->seed << 4) | (uint64_t)v;
  }
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(e, "index", UINT32_MAX, &index), "%s",
                      what);
  r->index = (uint32_t)index;
  PCP_RETURN_IF_ERROR(
      pcp_proto_json_u64(e, "dtype", PCP_ELEMENT_TYPE_COUNT_ - 1, &dtype), "%s",
      what);
  r->element_type = (pcp_element_type_t)dtype;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_shape(json_object_get(e, "shape"),
                                                what, PCP_MAX_TENSOR_RANK,
                                                &r->rank, r->shape));
  PCP_RETURN_IF_ERROR(pcp_proto_init_ref_validate(r), "%s", what);
  return pcp_ok_status();
}

static pcp_status_t refs_to_json(const char* key,
                                 const pcp_proto_tensor_ref_t* refs,
                                 uint32_t count, uint64_t max,
                                 size_t section_count, uint16_t version,
                                 json_t* object) {
  if (count > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': at most %u tensors", key, (unsigned)max);
  }
  // The encoder refuses what the decoder would (refs_from_json).
  if (strcmp(key, "inputs") == 0) {
    PCP_RETURN_IF_ERROR(pcp_proto_init_refs_validate(refs, count), "key '%s'",
                        key);
  }
  json_t* array = json_array();
  pcp_status_t status = array ? pcp_ok_status() : oom();
  for (uint32_t i = 0; i < count && !status; ++i) {
    const pcp_proto_tensor_ref_t* r = &refs[i];
    size_t prefix_length = 0;
    uint32_t first = 0;
    uint32_t run =
        version >= PCP_PROTO_VERSION_RUNS
            ? resident_run_length(refs, i, count, &prefix_length, &first)
            : 1;
    if (run >= 2) {
      // One entry instead of |run|: a decoupled step names 3n of them.
      status = run_to_json("resident_run", r->name, prefix_length, first, run,
                           NULL, array);
      i += run - 1;
      continue;
    }
    json_t* e = json_object();
    if (!e) {
      status = oom();
      break;
    }
    switch (r->kind) {
      case PCP_PROTO_TENSOR_REF_SECTION:
        if (r->section >= section_count) {
          status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                   "key '%s'[%u]: section %u of %zu", key, i,
                                   r->section, section_count);
        }
        TRY_(pcp_proto_json_set(e, "section", json_integer(r->section)));
        break;
      case PCP_PROTO_TENSOR_REF_RESIDENT:
        TRY_(pcp_proto_json_set_string(e, "resident", r->name, STR_MAX_));
        break;
      case PCP_PROTO_TENSOR_REF_BLOB: {
        TRY_(pcp_proto_json_set_string(e, "blob", r->name, STR_MAX_));
        TRY_(pcp_proto_json_set(e, "dtype", json_integer(r->element_type)));
        // Every dimension or an error: a dimension dropped for want of
        // memory would send a different shape.
        json_t* shape = status ? NULL : json_array();
        if (!status && !shape) {
          status = oom();
        }
        for (uint32_t d = 0; !status && d < r->rank && d < PCP_MAX_TENSOR_RANK;
             ++d) {
          if (json_array_append_new(shape, json_integer(r->shape[d])) != 0) {
            status = oom();
          }
        }
        if (status) {
          json_decref(shape);
        } else {
          status = pcp_proto_json_set(e, "shape", shape);
        }
        break;
      }
      case PCP_PROTO_TENSOR_REF_INIT:
        status = strcmp(key, "inputs") == 0
                     ? init_ref_to_json(r, e)
                     : pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                       "an init ref is a task input only");
        if (status) {
          status = pcp_status_annotate_f(status, "key '%s'[%u]", key, i);
        }
        break;
      default:
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key '%s'[%u]: bad kind", key, i);
    }
    if (!status && json_array_append_new(array, e) != 0) {
      status = oom();
    } else if (status) {
      json_decref(e);
    }
  }
  if (status) {
    json_decref(array);
    return status;
  }
  return pcp_proto_json_set(object, key, array);
}

// |count| refs (list_extent's, runs expanded) from |array|; the names of
// runs are written at |*names| (room counted by list_extent).
static pcp_status_t refs_from_json(const pcp_proto_frame_t* frame,
                                   const json_t* array, const char* key,
                                   pcp_proto_tensor_ref_t* refs, uint32_t count,
                                   char** names) {
  uint32_t i = 0;
  for (size_t j = 0; j < json_array_size(array); ++j) {
    json_t* e = json_array_get(array, j);
    char what[64];
    snprintf(what, sizeof(what), "key '%s'[%zu]", key, j);
    if (!json_is_object(e)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: not an object",
                             what);
    }
    if (json_object_get(e, "resident_run")) {
      run_t run;
      PCP_RETURN_IF_ERROR_BARE(run_read(e, "resident_run", count, what, &run));
      if (run.count > count - i) {
        return pcp_make_status(PCP_STATUS_INTERNAL, "%s: past the extent",
                               what);
      }
      for (uint32_t k = 0; k < run.count; ++k, ++i) {
        refs[i] =
            (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                     .name = run_name(&run, k, names)};
      }
      continue;
    }
    if (i >= count) {
      return pcp_make_status(PCP_STATUS_INTERNAL, "%s: past the extent", what);
    }
    pcp_proto_tensor_ref_t* r = &refs[i++];
    if (json_object_get(e, "section")) {
      uint64_t section = 0;
      PCP_RETURN_IF_ERROR(
          pcp_proto_json_u64(e, "section", PCP_PROTO_CEILING_SECTIONS,
                             &section),
          "%s", what);
      if (section >= frame->section_count) {
        return pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT, "%s: section %llu, the frame has %zu",
            what, (unsigned long long)section, frame->section_count);
      }
      r->kind = PCP_PROTO_TENSOR_REF_SECTION;
      r->section = (uint32_t)section;
    } else if (json_object_get(e, "resident")) {
      r->kind = PCP_PROTO_TENSOR_REF_RESIDENT;
      PCP_RETURN_IF_ERROR(
          pcp_proto_json_string(e, "resident", 1, STR_MAX_, &r->name), "%s",
          what);
    } else if (json_object_get(e, "blob")) {
      uint64_t dtype = 0;
      r->kind = PCP_PROTO_TENSOR_REF_BLOB;
      PCP_RETURN_IF_ERROR(
          pcp_proto_json_string(e, "blob", 1, STR_MAX_, &r->name), "%s", what);
      PCP_RETURN_IF_ERROR(
          pcp_proto_json_u64(e, "dtype", PCP_ELEMENT_TYPE_COUNT_ - 1, &dtype),
          "%s", what);
      if (dtype == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: dtype 0",
                               what);
      }
      r->element_type = (pcp_element_type_t)dtype;
      PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_shape(json_object_get(e, "shape"),
                                                    what, PCP_MAX_TENSOR_RANK,
                                                    &r->rank, r->shape));
    } else if (json_object_get(e, "init") && strcmp(key, "inputs") == 0) {
      // Task inputs only: a result's outputs are always bytes.
      PCP_RETURN_IF_ERROR_BARE(init_ref_from_json(e, what, r));
    } else {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: needs 'section', 'resident' or 'blob'", what);
    }
  }
  // Each init ref is bounded above; their sum is too, before a worker
  // allocates any of them.
  if (strcmp(key, "inputs") == 0) {
    PCP_RETURN_IF_ERROR(pcp_proto_init_refs_validate(refs, i), "key '%s'", key);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Encoding
//===----------------------------------------------------------------------===//

static pcp_status_t encode_fields(const pcp_proto_message_table_t* table,
                                  const uint8_t* base, size_t section_count,
                                  uint16_t version, json_t* object);

// A JSON object of |table|'s fields read from |base|, set as |key|.
static pcp_status_t encode_object(const char* key,
                                  const pcp_proto_message_table_t* table,
                                  const uint8_t* base, size_t section_count,
                                  uint16_t version, json_t* parent,
                                  json_t* array) {
  json_t* e = json_object();
  if (!e)
    return oom();
  pcp_status_t status = encode_fields(table, base, section_count, version, e);
  if (status) {
    json_decref(e);
    return status;
  }
  if (array) {
    return json_array_append_new(array, e) ? oom() : pcp_ok_status();
  }
  return pcp_proto_json_set(parent, key, e);
}

// keep_resident entries (FLAG_KEEP_RUNS) from PCP_PROTO_VERSION_RUNS:
// runs become one "keep_run" entry, the rest encode as usual.
static pcp_status_t keep_to_json(const pcp_proto_field_t* f,
                                 const pcp_proto_keep_resident_t* keep,
                                 uint32_t count, size_t section_count,
                                 uint16_t version, json_t* array) {
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < count && !status; ++i) {
    size_t prefix_length = 0;
    uint32_t first = 0;
    uint32_t run = keep_run_length(keep, i, count, &prefix_length, &first);
    if (run < 2) {
      status = encode_object(f->key, f->table, (const uint8_t*)&keep[i],
                             section_count, version, NULL, array);
      continue;
    }
    status = run_to_json("keep_run", keep[i].as, prefix_length, first, run,
                         &keep[i].output, array);
    i += run - 1;
  }
  return status;
}

static pcp_status_t encode_field(const pcp_proto_field_t* f,
                                 const uint8_t* base, size_t section_count,
                                 uint16_t version, json_t* o) {
  if ((f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE) && !*PRESENT_(base, f)) {
    return pcp_ok_status();
  }
  switch (f->kind) {
    case PCP_PROTO_FIELD_UINT: {
      uint64_t v = load_uint(base, f);
      if (v == 0 && (f->flags & PCP_PROTO_FIELD_FLAG_OMIT_ZERO))
        return pcp_ok_status();
      return pcp_proto_json_set(o, f->key, json_integer((json_int_t)v));
    }
    case PCP_PROTO_FIELD_INT:
      return pcp_proto_json_set(o, f->key,
                                json_integer((json_int_t)load_int(base, f)));
    case PCP_PROTO_FIELD_BOOL:
      return pcp_proto_json_set(o, f->key,
                                json_boolean(*MEMBER_(base, f, const bool)));
    case PCP_PROTO_FIELD_REAL: {
      double v = *MEMBER_(base, f, const double);
      if (!(v >= (double)f->min && v <= (double)f->max)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': must be in [%lld, %llu]", f->key,
                               (long long)f->min, (unsigned long long)f->max);
      }
      return pcp_proto_json_set(o, f->key, json_real(v));
    }
    case PCP_PROTO_FIELD_STRING:
      return pcp_proto_json_set_string(
          o, f->key, *MEMBER_(base, f, const char* const), (size_t)f->max);
    case PCP_PROTO_FIELD_HEX:
      return pcp_proto_json_set_hex(o, f->key, base + f->offset, f->size);
    case PCP_PROTO_FIELD_ENUM: {
      int v = *MEMBER_(base, f, const int);
      size_t n = name_count(f->names);
      if (v >= 1 && (size_t)v <= n) {
        return pcp_proto_json_set(o, f->key, json_string(f->names[v - 1]));
      }
      if (f->flags & PCP_PROTO_FIELD_FLAG_ENUM_LAST_DEFAULT) {
        return pcp_proto_json_set(o, f->key, json_string(f->names[n - 1]));
      }
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key '%s': no name for value %d", f->key, v);
    }
    case PCP_PROTO_FIELD_CONSTANT:
      return pcp_proto_json_set(o, f->key, json_string(f->names[0]));
    case PCP_PROTO_FIELD_STRING_LIST: {
      uint32_t count = *COUNT_(base, f);
      if (count > f->max) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': at most %u items", f->key,
                               (unsigned)f->max);
      }
      const char* const* items = MEMBER_(base, f, const char* const);
      json_t* array = json_array();
      pcp_status_t status = array ? pcp_ok_status() : oom();
      for (uint32_t i = 0; i < count && !status; ++i) {
        json_t* item = NULL;
        status = pcp_proto_json_string_make(f->key, items[i], STR_MAX_, &item);
        if (status &&
            pcp_status_code(status) != PCP_STATUS_RESOURCE_EXHAUSTED) {
          pcp_status_ignore(status);
          status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                   "key '%s': bad item %u", f->key, i);
        } else if (!status && json_array_append_new(array, item)) {
          status = oom();
        }
      }
      if (status) {
        json_decref(array);
        return status;
      }
      return pcp_proto_json_set(o, f->key, array);
    }
    case PCP_PROTO_FIELD_OBJECT:
      return encode_object(f->key, f->table, base + f->offset, section_count,
                           version, o, NULL);
    case PCP_PROTO_FIELD_ARRAY: {
      uint32_t count = *COUNT_(base, f);
      if (count > f->max) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': at most %u items", f->key,
                               (unsigned)f->max);
      }
      const uint8_t* items = *MEMBER_(base, f, const uint8_t* const);
      json_t* array = json_array();
      pcp_status_t status = array ? pcp_ok_status() : oom();
      if (!status && (f->flags & PCP_PROTO_FIELD_FLAG_KEEP_RUNS) &&
          version >= PCP_PROTO_VERSION_RUNS) {
        status = keep_to_json(f, (const pcp_proto_keep_resident_t*)items, count,
                              section_count, version, array);
      } else {
        for (uint32_t i = 0; i < count && !status; ++i) {
          status = encode_object(f->key, f->table, items + (size_t)i * f->size,
                                 section_count, version, NULL, array);
        }
      }
      if (status) {
        json_decref(array);
        return status;
      }
      return pcp_proto_json_set(o, f->key, array);
    }
    case PCP_PROTO_FIELD_TENSOR_REFS:
      return refs_to_json(
          f->key, *MEMBER_(base, f, const pcp_proto_tensor_ref_t* const),
          *COUNT_(base, f), f->max, section_count, version, o);
  }
  return pcp_make_status(PCP_STATUS_INTERNAL, "key '%s': bad field kind",
                         f->key);
}

static pcp_status_t encode_fields(const pcp_proto_message_table_t* table,
                                  const uint8_t* base, size_t section_count,
                                  uint16_t version, json_t* object) {
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < table->field_count && !status; ++i) {
    status =
        encode_field(&table->fields[i], base, section_count, version, object);
  }
  return status;
}

pcp_status_t pcp_proto_message_encode(const pcp_proto_message_table_t* table,
                                      uint16_t version, uint64_t request_id,
                                      const void* message,
                                      const pcp_proto_section_t* sections,
                                      size_t section_count,
                                      const pcp_proto_limits_t* limits,
                                      pcp_allocator_t allocator,
                                      pcp_proto_encoded_frame_t* out_frame) {
  json_t* object = json_object();
  if (!object) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  }
  pcp_status_t status = pcp_ok_status();
  if (table->encode_check) {
    status = table->encode_check(message, limits, section_count);
  }
  TRY_(encode_fields(table, message, section_count, version, object));
  TRY_(pcp_proto_frame_encode(version, table->type, request_id, object,
                              sections, section_count, limits, allocator,
                              out_frame));
  json_decref(object);
  if (status) {
    return pcp_status_annotate_f(status, "encoding %s",
                                 pcp_proto_message_type_name(table->type));
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Parsing
//===----------------------------------------------------------------------===//

// Checks an ARRAY or TENSOR_REFS key and returns its length (bounded by
// |f->max| before anything is allocated for it).
static pcp_status_t array_count(const json_t* object,
                                const pcp_proto_field_t* f,
                                uint32_t* out_count) {
  json_t* array = json_object_get(object, f->key);
  *out_count = 0;
  if (!array && !(f->flags & PCP_PROTO_FIELD_FLAG_REQUIRED))
    return pcp_ok_status();
  if (!json_is_array(array) || json_array_size(array) > f->max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected an array of at most %u", f->key,
                           (unsigned)f->max);
  }
  *out_count = (uint32_t)json_array_size(array);
  return pcp_ok_status();
}

static pcp_status_t parse_fields(const pcp_proto_message_table_t* table,
                                 const json_t* object, uint8_t* base);

// Every kind but ARRAY and TENSOR_REFS, whose elements need the scratch
// block (parse_arrays).
static pcp_status_t parse_field(const pcp_proto_field_t* f, const json_t* o,
                                uint8_t* base) {
  bool required = f->flags & PCP_PROTO_FIELD_FLAG_REQUIRED;
  // Parsing sits on every frame's path: look the key up here only where
  // the kind needs its value or its absence (the readers of codec.c look it
  // up themselves), so a required scalar costs one lookup, as before tables.
  bool optional_scalar = !required && (f->kind == PCP_PROTO_FIELD_UINT ||
                                       f->kind == PCP_PROTO_FIELD_INT ||
                                       f->kind == PCP_PROTO_FIELD_HEX);
  json_t* value = optional_scalar || f->kind == PCP_PROTO_FIELD_REAL ||
                          f->kind == PCP_PROTO_FIELD_STRING_LIST ||
                          f->kind == PCP_PROTO_FIELD_OBJECT
                      ? json_object_get(o, f->key)
                      : NULL;
  switch (f->kind) {
    case PCP_PROTO_FIELD_UINT: {
      uint64_t v = 0;
      if (!required && !value)
        return pcp_ok_status();
      if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
        *PRESENT_(base, f) = true;
      PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_u64(o, f->key, f->max, &v));
      if (v < (uint64_t)f->min) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': below %llu", f->key,
                               (unsigned long long)f->min);
      }
      store_uint(base, f, v);
      return pcp_ok_status();
    }
    case PCP_PROTO_FIELD_INT: {
      int64_t v = f->absent_value;
      if (required || value) {
        PCP_RETURN_IF_ERROR_BARE(
            pcp_proto_json_i64(o, f->key, f->min, (int64_t)f->max, &v));
      }
      store_int(base, f, v);
      return pcp_ok_status();
    }
    case PCP_PROTO_FIELD_BOOL:
      return pcp_proto_json_bool(o, f->key, false, MEMBER_(base, f, bool));
    case PCP_PROTO_FIELD_REAL:
      if (!value)
        return pcp_ok_status();
      if (!json_is_number(value) || json_number_value(value) < (double)f->min ||
          json_number_value(value) > (double)f->max) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': expected a number in [%lld, %llu]",
                               f->key, (long long)f->min,
                               (unsigned long long)f->max);
      }
      if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
        *PRESENT_(base, f) = true;
      *MEMBER_(base, f, double) = json_number_value(value);
      return pcp_ok_status();
    case PCP_PROTO_FIELD_STRING:
      if (required) {
        return pcp_proto_json_string(o, f->key, (size_t)f->min, (size_t)f->max,
                                     MEMBER_(base, f, const char*));
      }
      return pcp_proto_json_opt_string(o, f->key, (size_t)f->max,
                                       MEMBER_(base, f, const char*));
    case PCP_PROTO_FIELD_HEX: {
      if (!required && !value)
        return pcp_ok_status();
      pcp_status_t status =
          pcp_proto_json_hex(o, f->key, f->size, base + f->offset);
      if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
        *PRESENT_(base, f) = !status;
      return status;
    }
    case PCP_PROTO_FIELD_ENUM:
    case PCP_PROTO_FIELD_CONSTANT: {
      const char* text = NULL;
      PCP_RETURN_IF_ERROR_BARE(
          pcp_proto_json_string(o, f->key, 1, (size_t)f->max, &text));
      for (size_t i = 0; f->names[i]; ++i) {
        if (strcmp(text, f->names[i]) == 0) {
          if (f->kind == PCP_PROTO_FIELD_ENUM)
            *MEMBER_(base, f, int) = (int)(i + 1);
          return pcp_ok_status();
        }
      }
      if (f->kind == PCP_PROTO_FIELD_CONSTANT) {
        return pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "%s '%s'", f->label,
                               text);
      }
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "key '%s': '%s'",
                             f->key, text);
    }
    case PCP_PROTO_FIELD_STRING_LIST: {
      if (!value)
        return pcp_ok_status();
      if (!json_is_array(value) || json_array_size(value) > f->max) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key '%s': expected at most %u strings", f->key,
                               (unsigned)f->max);
      }
      const char** items = MEMBER_(base, f, const char*);
      uint32_t* count = COUNT_(base, f);
      for (size_t i = 0; i < json_array_size(value); ++i) {
        json_t* d = json_array_get(value, i);
        if (!json_is_string(d) || json_string_length(d) > STR_MAX_) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key '%s': item %zu is not a short string",
                                 f->key, i);
        }
        items[(*count)++] = json_string_value(d);
      }
      return pcp_ok_status();
    }
    case PCP_PROTO_FIELD_OBJECT: {
      if (!value && !required)
        return pcp_ok_status();
      pcp_status_t status = pcp_ok_status();
      if (!json_is_object(value)) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key '%s': expected an object", f->key);
      }
      TRY_(parse_fields(f->table, value, base + f->offset));
      if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
        *PRESENT_(base, f) = !status;
      return status;
    }
    case PCP_PROTO_FIELD_ARRAY:
    case PCP_PROTO_FIELD_TENSOR_REFS: {
      uint32_t count = 0;
      PCP_RETURN_IF_ERROR_BARE(array_count(o, f, &count));
      *COUNT_(base, f) = count;
      return pcp_ok_status();
    }
  }
  return pcp_make_status(PCP_STATUS_INTERNAL, "key '%s': bad field kind",
                         f->key);
}

static pcp_status_t parse_fields(const pcp_proto_message_table_t* table,
                                 const json_t* object, uint8_t* base) {
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < table->field_count && !status; ++i) {
    status = parse_field(&table->fields[i], object, base);
  }
  return status;
}

static size_t element_size(const pcp_proto_field_t* f) {
  return f->kind == PCP_PROTO_FIELD_TENSOR_REFS ? sizeof(pcp_proto_tensor_ref_t)
                                                : f->size;
}

static size_t align8(size_t n) {
  return (n + 7) & ~(size_t)7;
}

static bool has_runs(const pcp_proto_field_t* f) {
  return f->kind == PCP_PROTO_FIELD_TENSOR_REFS ||
         (f->kind == PCP_PROTO_FIELD_ARRAY &&
          (f->flags & PCP_PROTO_FIELD_FLAG_KEEP_RUNS));
}

// keep_resident entries (FLAG_KEEP_RUNS) into |keep| (|count|, runs
// expanded); run names are written at |*names|.
static pcp_status_t keep_from_json(const pcp_proto_field_t* f,
                                   const json_t* array,
                                   pcp_proto_keep_resident_t* keep,
                                   uint32_t count, char** names) {
  uint32_t i = 0;
  for (size_t j = 0; j < json_array_size(array); ++j) {
    json_t* e = json_array_get(array, j);
    char what[64];
    snprintf(what, sizeof(what), "key '%s'[%zu]", f->key, j);
    if (!json_is_object(e)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: not an object",
                             what);
    }
    if (json_object_get(e, "keep_run")) {
      run_t run;
      PCP_RETURN_IF_ERROR_BARE(run_read(e, "keep_run", count, what, &run));
      if (run.count > count - i) {
        return pcp_make_status(PCP_STATUS_INTERNAL, "%s: past the extent",
                               what);
      }
      for (uint32_t k = 0; k < run.count; ++k, ++i) {
        keep[i] = (pcp_proto_keep_resident_t){.output = run.output + k,
                                              .as = run_name(&run, k, names)};
      }
      continue;
    }
    if (i >= count) {
      return pcp_make_status(PCP_STATUS_INTERNAL, "%s: past the extent", what);
    }
    PCP_RETURN_IF_ERROR_BARE(
        parse_fields(f->table, e, (uint8_t*)(void*)&keep[i++]));
  }
  return pcp_ok_status();
}

// Second pass: the elements of every ARRAY and TENSOR_REFS field (their
// counts were bounded by the first pass; lists that may hold runs are
// measured again with the runs expanded) in one scratch block of the
// frame, the names the runs expand to at its end.
static pcp_status_t parse_arrays(const pcp_proto_message_table_t* table,
                                 pcp_proto_frame_t* frame, uint8_t* base) {
  size_t total = 0;
  size_t name_bytes = 0;
  bool any = false;
  const json_t* o = frame->control;
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_proto_field_t* f = &table->fields[i];
    if (f->kind != PCP_PROTO_FIELD_ARRAY &&
        f->kind != PCP_PROTO_FIELD_TENSOR_REFS) {
      continue;
    }
    any = true;
    if (has_runs(f)) {
      size_t bytes = 0;
      PCP_RETURN_IF_ERROR_BARE(list_extent(f, json_object_get(o, f->key),
                                           frame->header.version,
                                           COUNT_(base, f), &bytes));
      name_bytes += bytes;
    }
    total += align8((size_t)*COUNT_(base, f) * element_size(f));
  }
  if (!any)
    return pcp_ok_status();
  uint8_t* scratch = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_frame_scratch(frame, total + name_bytes, (void**)&scratch));
  char* names = (char*)scratch + total;
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_proto_field_t* f = &table->fields[i];
    if (f->kind != PCP_PROTO_FIELD_ARRAY &&
        f->kind != PCP_PROTO_FIELD_TENSOR_REFS) {
      continue;
    }
    uint32_t count = *COUNT_(base, f);
    const json_t* array = json_object_get(o, f->key);
    if (f->kind == PCP_PROTO_FIELD_TENSOR_REFS) {
      PCP_RETURN_IF_ERROR_BARE(refs_from_json(
          frame, array, f->key, (pcp_proto_tensor_ref_t*)(void*)scratch, count,
          &names));
    } else if (has_runs(f)) {
      PCP_RETURN_IF_ERROR_BARE(keep_from_json(
          f, array, (pcp_proto_keep_resident_t*)(void*)scratch, count, &names));
    } else {
      for (uint32_t k = 0; k < count; ++k) {
        json_t* e = json_array_get(array, k);
        if (!json_is_object(e)) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key '%s'[%u]: not an object", f->key, k);
        }
        PCP_RETURN_IF_ERROR_BARE(
            parse_fields(f->table, e, scratch + (size_t)k * f->size));
      }
    }
    *MEMBER_(base, f, const void*) = scratch;
    scratch += align8((size_t)count * element_size(f));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_message_parse(const pcp_proto_message_table_t* table,
                                     pcp_proto_frame_t* frame,
                                     void* out_message) {
  memset(out_message, 0, table->struct_size);
  if (frame->header.type != table->type || !frame->control) {
    const char* got = pcp_proto_message_type_name(frame->header.type);
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "expected a %s frame, got %s (%u)",
                           pcp_proto_message_type_name(table->type),
                           got ? got : "unknown", frame->header.type);
  }
  uint8_t* base = out_message;
  pcp_status_t status = parse_fields(table, frame->control, base);
  TRY_(parse_arrays(table, frame, base));
  if (table->parse_check)
    TRY_(table->parse_check(frame, out_message));
  PCP_RETURN_IF_ERROR(status, "parsing %s",
                      pcp_proto_message_type_name(table->type));
  return pcp_ok_status();
}
