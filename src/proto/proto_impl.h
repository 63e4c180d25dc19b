// SPDX-License-Identifier: Apache-2.0
//
// Private helpers shared by the files of src/proto. Never included outside
// this folder.

#ifndef PCP_PROTO_PROTO_IMPL_H_
#define PCP_PROTO_PROTO_IMPL_H_

#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "base/base.h"
#include "proto/proto.h"

// Little-endian stores and loads, byte by byte: the wire never depends on
// the host's layout or alignment.
static inline void store_le16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void store_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t load_le16(const uint8_t* p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t load_le32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

static inline uint64_t align64_u64(uint64_t v) {
  return (v + (PCP_PROTO_SECTION_ALIGNMENT - 1)) &
         ~(uint64_t)(PCP_PROTO_SECTION_ALIGNMENT - 1);
}

// 64-byte aligned allocations through a pcp_allocator_t: the distance to the
// real block is stored in the byte before the aligned pointer.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_aligned_allocate(
    pcp_allocator_t allocator, size_t byte_length, uint8_t** out_ptr);
void pcp_proto_aligned_free(pcp_allocator_t allocator, uint8_t* ptr);

// JSON field readers: INVALID_ARGUMENT naming |key| when missing or of the
// wrong type/range. "opt" variants leave the output alone when absent.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_u64(const json_t* object,
                                                    const char* key,
                                                    uint64_t max,
                                                    uint64_t* out_value);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_opt_u64(const json_t* object,
                                                        const char* key,
                                                        uint64_t max,
                                                        uint64_t* out_value,
                                                        bool* out_present);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_i64(const json_t* object,
                                                    const char* key,
                                                    int64_t min, int64_t max,
                                                    int64_t* out_value);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_string(const json_t* object,
                                                       const char* key,
                                                       size_t min_length,
                                                       size_t max_length,
                                                       const char** out_value);
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_json_opt_string(const json_t* object, const char* key,
                          size_t max_length, const char** out_value);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_hex(const json_t* object,
                                                    const char* key,
                                                    size_t byte_length,
                                                    uint8_t* out_bytes);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_bool(const json_t* object,
                                                     const char* key,
                                                     bool default_value,
                                                     bool* out_value);

// Shape array -> rank/dims (each >= 0, rank <= max_rank).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_shape(const json_t* value,
                                                      const char* what,
                                                      uint32_t max_rank,
                                                      uint32_t* out_rank,
                                                      int64_t* out_shape);

// Byte length of a dense tensor; false on overflow or a bad dtype.
bool pcp_proto_tensor_byte_length(pcp_element_type_t type, uint32_t rank,
                                  const int64_t* shape, uint64_t* out_length);

// json_object_set_new that turns a failed allocation into a status.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_set(json_t* object,
                                                    const char* key,
                                                    json_t* value);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_set_hex(json_t* object,
                                                        const char* key,
                                                        const uint8_t* bytes,
                                                        size_t byte_length);
// Strings longer than |max_length| are INVALID_ARGUMENT (senders fail first).
// A JSON string of |value| (NULL: ""): INVALID_ARGUMENT when longer than
// |max_length| or not UTF-8, RESOURCE_EXHAUSTED when out of memory.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_string_make(const char* key,
                                                            const char* value,
                                                            size_t max_length,
                                                            json_t** out);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_json_set_string(json_t* object,
                                                           const char* key,
                                                           const char* value,
                                                           size_t max_length);

// The scratch block of a frame's last parse (freed with the frame).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_scratch(
    pcp_proto_frame_t* frame, size_t byte_length, void** out_ptr);

// A small growable queue of actions (the state machines' output).
typedef struct pcp_proto_action_queue_t {
  pcp_allocator_t allocator;
  pcp_proto_action_t* items;
  size_t head;
  size_t count;
  size_t capacity;
} pcp_proto_action_queue_t;

void pcp_proto_action_queue_initialize(pcp_allocator_t allocator,
                                       pcp_proto_action_queue_t* out_queue);
void pcp_proto_action_queue_deinitialize(pcp_proto_action_queue_t* queue);
// Takes ownership of |action| (also on failure: it is deinitialized).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_action_queue_push(
    pcp_proto_action_queue_t* queue, pcp_proto_action_t* action);
bool pcp_proto_action_queue_pop(pcp_proto_action_queue_t* queue,
                                pcp_proto_action_t* out_action);

//===----------------------------------------------------------------------===//
// Tensors as chunked blobs (tensor_blobs.c)
//===----------------------------------------------------------------------===//

// Sender side: the sections of a TASK_ASSIGN or TASK_RESULT that do not fit
// inline (running inline total over limits->chunk_bytes) are sent first as
// BLOB_CHUNK frames through |emit|, and the references to them become BLOB
// references. |out| holds the rewritten refs and the inline sections.
typedef struct pcp_proto_outgoing_tensors_t {
  pcp_proto_tensor_ref_t* refs;
  pcp_proto_section_t* sections;
  size_t section_count;
  char* ids;  // blob ids, 32 bytes each
  pcp_allocator_t allocator;
} pcp_proto_outgoing_tensors_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_proto_outgoing_tensors_prepare(
    uint16_t version, uint64_t request_id, uint64_t task_id,
    const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_chunk_emit_fn_t emit, void* user_data,
    pcp_proto_outgoing_tensors_t* out);
void pcp_proto_outgoing_tensors_deinitialize(pcp_proto_outgoing_tensors_t* out);

// Receiver side: tensor blobs being assembled or waiting for the frame that
// references them, keyed by request id; at most |max| at once.
typedef struct pcp_proto_blob_slot_t {
  uint64_t request_id;
  bool complete;
  pcp_proto_blob_assembly_t assembly;
  pcp_proto_tensor_blob_t blob;
} pcp_proto_blob_slot_t;

typedef struct pcp_proto_blob_table_t {
  pcp_allocator_t allocator;
  pcp_proto_blob_slot_t* slots;
  size_t count;
  size_t max;
} pcp_proto_blob_table_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_table_initialize(
    size_t max, pcp_allocator_t allocator, pcp_proto_blob_table_t* out_table);
void pcp_proto_blob_table_deinitialize(pcp_proto_blob_table_t* table);
// Drops everything (a reconnect).
void pcp_proto_blob_table_clear(pcp_proto_blob_table_t* table);
// Adds a tensor chunk (starting or continuing its blob).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_table_add(
    pcp_proto_blob_table_t* table, uint64_t request_id,
    const pcp_proto_blob_chunk_t* chunk, const pcp_proto_limits_t* limits);
// Where |chunk| (parsed from a frame head: data still NULL, data_length
// set) can be read straight into its blob's buffer, starting the blob when
// it is chunk 0 (same checks as add, buffer allocated once with the
// announced total); NULL when add would refuse it or it is not a tensor.
uint8_t* pcp_proto_blob_table_dest(pcp_proto_blob_table_t* table,
                                   uint64_t request_id,
                                   const pcp_proto_blob_chunk_t* chunk,
                                   const pcp_proto_limits_t* limits);
// Moves every complete blob of |request_id| into |action| after checking
// that each BLOB reference in |refs| has one with the right byte length.
// Blobs of that request are dropped either way.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_blob_table_attach(pcp_proto_blob_table_t* table, uint64_t request_id,
                            const pcp_proto_tensor_ref_t* refs,
                            uint32_t ref_count, pcp_proto_action_t* action);

//===----------------------------------------------------------------------===//
// Messages described by field tables (message_codec.c, tables in messages.c)
//===----------------------------------------------------------------------===//
//
// Every message of docs/protocol.md s.3 is one table of fields, the way a
// config struct is one table (src/config): JSON key, wire kind, offset in the
// C struct, limits. One generic encoder walks the table in order (the JSON
// keys come out in table order, which the golden vectors pin) and one
// generic parser checks every limit before storing. What a table cannot say
// (cross-field rules such as HELLO's version range or a BLOB_CHUNK's data
// section) lives in the table's two hooks.

typedef enum pcp_proto_field_kind_e {
  // Unsigned integer member of |size| bytes (2, 4 or 8): [min, max].
  PCP_PROTO_FIELD_UINT = 0,
  // Signed integer member of |size| bytes (4 or 8): [(int64)min, max];
  // |absent_value| when an optional key is missing.
  PCP_PROTO_FIELD_INT,
  // bool member; a missing key is false.
  PCP_PROTO_FIELD_BOOL,
  // double member in [min, max] (integers on the wire are accepted).
  PCP_PROTO_FIELD_REAL,
  // const char* member (borrowed both ways): [min, max] bytes; an optional
  // key that is missing parses as "" and NULL encodes as "".
  PCP_PROTO_FIELD_STRING,
  // uint8_t[size] member as 2 * size lowercase hex digits.
  PCP_PROTO_FIELD_HEX,
  // Enum member (int sized): value i + 1 <-> |names|[i], a string of 1..max
  // bytes on the wire.
  PCP_PROTO_FIELD_ENUM,
  // No member: encodes |names|[0]; parsing accepts only that string (a
  // string of 1..max bytes, else UNIMPLEMENTED "<label> '<value>'").
  PCP_PROTO_FIELD_CONSTANT,
  // const char*[max] member plus a uint32_t count at |count_offset|; each
  // item at most PCP_PROTO_MAX_STRING_BYTES.
  PCP_PROTO_FIELD_STRING_LIST,
  // A nested JSON object whose fields (|table|) are members of this same
  // struct at |offset| + their offset.
  PCP_PROTO_FIELD_OBJECT,
  // Pointer member to |size|-byte elements described by |table|, count
  // (uint32_t) at |count_offset|, at most |max|. Parsed elements live in the
  // frame's scratch block.
  PCP_PROTO_FIELD_ARRAY,
  // const pcp_proto_tensor_ref_t* member, count (uint32_t) at
  // |count_offset|, at most |max| (s.3.9); SECTION references are checked
  // against the frame's sections.
  PCP_PROTO_FIELD_TENSOR_REFS,
} pcp_proto_field_kind_t;

typedef uint32_t pcp_proto_field_flags_t;
enum pcp_proto_field_flag_bits_e {
  PCP_PROTO_FIELD_FLAG_NONE = 0,
  // Parsing: a missing key is INVALID_ARGUMENT naming it.
  PCP_PROTO_FIELD_FLAG_REQUIRED = 1u << 0,
  // A bool member at |presence_offset| says whether the key is there: the
  // encoder leaves the key out when false, the parser sets it.
  PCP_PROTO_FIELD_FLAG_PRESENCE = 1u << 1,
  // Encoding: the key is left out when the value is 0 (ERROR's task_id).
  PCP_PROTO_FIELD_FLAG_OMIT_ZERO = 1u << 2,
  // ENUM encoding: a value without a name encodes as the last name instead
  // of failing (TASK_PROGRESS "state": anything but queued was "running").
  PCP_PROTO_FIELD_FLAG_ENUM_LAST_DEFAULT = 1u << 3,
  // ARRAY of pcp_proto_keep_resident_t only: from PCP_PROTO_VERSION_RUNS,
  // consecutive entries "<prefix><k>" with consecutive outputs travel as
  // one "keep_run" entry (s.3.9); the parser expands them back.
  PCP_PROTO_FIELD_FLAG_KEEP_RUNS = 1u << 4,
};

struct pcp_proto_message_table_t;

typedef struct pcp_proto_field_t {
  const char* key;  // JSON key; frozen once shipped
  pcp_proto_field_kind_t kind;
  pcp_proto_field_flags_t flags;
  size_t offset;             // offsetof(struct, member)
  uint32_t size;             // integer width, HEX bytes, ARRAY element size
  size_t count_offset;       // STRING_LIST, ARRAY, TENSOR_REFS: uint32_t count
  size_t presence_offset;    // FLAG_PRESENCE: bool member
  int64_t min;               // lower bound (numbers) or minimum string bytes
  uint64_t max;              // upper bound, maximum bytes or maximum items
  int64_t absent_value;      // optional INT: value when the key is missing
  const char* const* names;  // ENUM, CONSTANT: NULL-terminated
  const char* label;         // CONSTANT: names the field in the error
  const struct pcp_proto_message_table_t* table;  // OBJECT, ARRAY elements
} pcp_proto_field_t;

typedef struct pcp_proto_message_table_t {
  uint16_t type;       // pcp_proto_message_type_t; 0 for nested tables
  size_t struct_size;  // zeroed before parsing
  const pcp_proto_field_t* fields;
  size_t field_count;
  // Optional: cross-field checks before any key is encoded (|limits| and
  // the sections are the encoder's).
  pcp_status_t (*encode_check)(const void* message,
                               const pcp_proto_limits_t* limits,
                               size_t section_count);
  // Optional: cross-field checks and non-JSON parts (sections) once every
  // field parsed.
  pcp_status_t (*parse_check)(pcp_proto_frame_t* frame, void* message);
} pcp_proto_message_table_t;

// Encodes |message| (fields per |table|, in table order) into a frame of
// type table->type; |sections| as for pcp_proto_frame_encode. Errors are
// annotated "encoding <TYPE>".
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_message_encode(
    const pcp_proto_message_table_t* table, uint16_t version,
    uint64_t request_id, const void* message,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame);

// Parses |frame| (FAILED_PRECONDITION unless of type table->type) into
// |out_message| (zeroed first). Strings, arrays and data are borrowed from
// the frame. Errors are INVALID_ARGUMENT naming the key (UNIMPLEMENTED for a
// CONSTANT), annotated "parsing <TYPE>".
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_message_parse(const pcp_proto_message_table_t* table,
                        pcp_proto_frame_t* frame, void* out_message);

// The table of message |type|; NULL for a type without a JSON message.
const pcp_proto_message_table_t* pcp_proto_message_table_lookup(uint16_t type);

// The ERROR frame's fields as the table sees them (pcp_proto_error_encode
// and _parse map them to and from a pcp_status_t).
typedef struct pcp_proto_error_wire_t {
  uint64_t code;
  const char* message;
  uint64_t task_id;  // 0: none (left out)
} pcp_proto_error_wire_t;

#endif  // PCP_PROTO_PROTO_IMPL_H_
