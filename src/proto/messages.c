// SPDX-License-Identifier: Apache-2.0
//
// Typed messages of docs/protocol.md s.3 as field tables (one per message,
// read by the generic encoder and parser of message_codec.c), the ERROR
// frame <-> pcp_status_t mapping and the HMAC join proof.
//
// A table lists the JSON keys in wire order: the encoder writes them in that
// order, so reordering a table changes the bytes the golden vectors pin.

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "proto/proto_impl.h"

#define STR_MAX_ PCP_PROTO_MAX_STRING_BYTES
#define REQ_ PCP_PROTO_FIELD_FLAG_REQUIRED

// Field initializers: struct type |s|, member |m|, JSON key |k|.
// NOLINTBEGIN(bugprone-macro-parentheses): |s| is a type name.
#define SIZE_OF_(s, m) ((uint32_t)sizeof(((s*)0)->m))
#define UINT_(s, m, k, flags_, lo, hi)                                         \
  {                                                                            \
    .key = k, .kind = PCP_PROTO_FIELD_UINT, .flags = (flags_),                 \
    .offset = offsetof(s, m), .size = SIZE_OF_(s, m), .min = (lo), .max = (hi) \
  }
#define INT_(s, m, k, flags_, lo, hi, absent)                      \
  {                                                                \
    .key = k, .kind = PCP_PROTO_FIELD_INT, .flags = (flags_),      \
    .offset = offsetof(s, m), .size = SIZE_OF_(s, m), .min = (lo), \
    .max = (hi), .absent_value = (absent)                          \
  }
#define BOOL_(s, m, k) \
  { .key = k, .kind = PCP_PROTO_FIELD_BOOL, .offset = offsetof(s, m) }
#define STRING_(s, m, k, flags_, hi)                                      \
  {                                                                       \
    .key = k, .kind = PCP_PROTO_FIELD_STRING, .flags = (flags_),          \
    .offset = offsetof(s, m), .min = ((flags_)&REQ_) ? 1 : 0, .max = (hi) \
  }
#define HEX_(s, m, k)                                     \
  {                                                       \
    .key = k, .kind = PCP_PROTO_FIELD_HEX, .flags = REQ_, \
    .offset = offsetof(s, m), .size = SIZE_OF_(s, m)      \
  }
#define ENUM_(s, m, k, flags_, names_)                                \
  {                                                                   \
    .key = k, .kind = PCP_PROTO_FIELD_ENUM, .flags = REQ_ | (flags_), \
    .offset = offsetof(s, m), .size = SIZE_OF_(s, m), .max = 32,      \
    .names = (names_)                                                 \
  }
// A counted array member |m| with its count in |count_m|.
#define LIST_(s, m, count_m, k, kind_, flags_, hi, table_, elem_size)       \
  {                                                                         \
    .key = k, .kind = (kind_), .flags = (flags_), .offset = offsetof(s, m), \
    .count_offset = offsetof(s, count_m), .max = (hi), .table = (table_),   \
    .size = (elem_size)                                                     \
  }
#define TABLE_(type_, s, fields_, encode_check_, parse_check_)      \
  {                                                                 \
    .type = (type_), .struct_size = sizeof(s), .fields = (fields_), \
    .field_count = sizeof(fields_) / sizeof((fields_)[0]),          \
    .encode_check = (encode_check_), .parse_check = (parse_check_)  \
  }
// NOLINTEND(bugprone-macro-parentheses)

// The public pair of a message without sections: thin wrappers over the
// generic codec, so no caller changes.
#define DEFINE_MESSAGE_(name, type_t)                                    \
  pcp_status_t pcp_proto_##name##_encode(                                \
      uint16_t version, uint64_t request_id, const type_t* message,      \
      const pcp_proto_limits_t* limits, pcp_allocator_t allocator,       \
      pcp_proto_encoded_frame_t* out_frame) {                            \
    return pcp_proto_message_encode(&name##_table, version, request_id,  \
                                    message, NULL, 0, limits, allocator, \
                                    out_frame);                          \
  }                                                                      \
  pcp_status_t pcp_proto_##name##_parse(pcp_proto_frame_t* frame,        \
                                        type_t* out_message) {           \
    return pcp_proto_message_parse(&name##_table, frame, out_message);   \
  }

//===----------------------------------------------------------------------===//
// HELLO
//===----------------------------------------------------------------------===//

uint16_t pcp_proto_version_select(uint16_t local_min, uint16_t local_max,
                                  uint16_t peer_min, uint16_t peer_max) {
  uint16_t high = local_max < peer_max ? local_max : peer_max;
  uint16_t low = local_min > peer_min ? local_min : peer_min;
  return high >= low && high > 0 ? high : 0;
}

static pcp_status_t hello_encode_check(const void* message,
                                       const pcp_proto_limits_t* limits,
                                       size_t section_count) {
  (void)limits;
  (void)section_count;
  const pcp_proto_hello_t* m = message;
  if (m->min_version == 0 || m->min_version > m->max_version) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "HELLO: bad version range %u..%u", m->min_version,
                           m->max_version);
  }
  return pcp_ok_status();
}

static pcp_status_t hello_parse_check(pcp_proto_frame_t* frame, void* message) {
  (void)frame;
  const pcp_proto_hello_t* m = message;
  if (m->min_version == 0 || m->min_version > m->max_version) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "bad version range %llu..%llu",
        (unsigned long long)m->min_version, (unsigned long long)m->max_version);
  }
  return pcp_ok_status();
}

// Frozen key set (s.2): never rename or reorder these.
static const pcp_proto_field_t hello_fields[] = {
    UINT_(pcp_proto_hello_t, min_version, "min_version", REQ_, 0, UINT16_MAX),
    UINT_(pcp_proto_hello_t, max_version, "max_version", REQ_, 0, UINT16_MAX),
    STRING_(pcp_proto_hello_t, role, "role", REQ_, 32),
    STRING_(pcp_proto_hello_t, software, "software", 0, STR_MAX_),
    {.key = "selected_version",
     .kind = PCP_PROTO_FIELD_UINT,
     .flags = PCP_PROTO_FIELD_FLAG_PRESENCE,
     .offset = offsetof(pcp_proto_hello_t, selected_version),
     .size = sizeof(uint16_t),
     .presence_offset = offsetof(pcp_proto_hello_t, has_selected_version),
     .max = UINT16_MAX},
};
static const pcp_proto_message_table_t hello_table =
    TABLE_(PCP_PROTO_MESSAGE_HELLO, pcp_proto_hello_t, hello_fields,
           hello_encode_check, hello_parse_check);

pcp_status_t pcp_proto_hello_encode(uint16_t version, uint64_t request_id,
                                    const pcp_proto_hello_t* message,
                                    const pcp_proto_limits_t* limits,
                                    pcp_allocator_t allocator,
                                    pcp_proto_encoded_frame_t* out_frame) {
  (void)version;
  (void)request_id;
  // HELLO's header carries the sender's max version and request id 0.
  return pcp_proto_message_encode(&hello_table, message->max_version, 0,
                                  message, NULL, 0, limits, allocator,
                                  out_frame);
}

pcp_status_t pcp_proto_hello_parse(pcp_proto_frame_t* frame,
                                   pcp_proto_hello_t* out_message) {
  return pcp_proto_message_parse(&hello_table, frame, out_message);
}

//===----------------------------------------------------------------------===//
// JOIN
//===----------------------------------------------------------------------===//

bool pcp_proto_worker_id_is_valid(const char* worker_id) {
  if (!worker_id)
    return false;
  size_t n = strlen(worker_id);
  if (n == 0 || n > PCP_PROTO_MAX_STRING_BYTES)
    return false;
  for (size_t i = 0; i < n; ++i) {
    char c = worker_id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok)
      return false;
  }
  return true;
}

static pcp_status_t check_worker_id(const char* worker_id) {
  if (!pcp_proto_worker_id_is_valid(worker_id)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'worker_id': must be 1..%u bytes of "
                           "[A-Za-z0-9._-]",
                           PCP_PROTO_MAX_STRING_BYTES);
  }
  return pcp_ok_status();
}

static pcp_status_t join_encode_check(const void* message,
                                      const pcp_proto_limits_t* limits,
                                      size_t section_count) {
  (void)limits;
  (void)section_count;
  return check_worker_id(((const pcp_proto_join_t*)message)->worker_id);
}

static pcp_status_t join_parse_check(pcp_proto_frame_t* frame, void* message) {
  (void)frame;
  return check_worker_id(((const pcp_proto_join_t*)message)->worker_id);
}

// "resume": {lease_epoch, resume_token}, members of pcp_proto_join_t.
static const pcp_proto_field_t join_resume_fields[] = {
    UINT_(pcp_proto_join_t, lease_epoch, "lease_epoch", REQ_, 0, INT64_MAX),
    HEX_(pcp_proto_join_t, resume_token, "resume_token"),
};
static const pcp_proto_message_table_t join_resume_table =
    TABLE_(0, pcp_proto_join_t, join_resume_fields, NULL, NULL);

static const pcp_proto_field_t join_fields[] = {
    STRING_(pcp_proto_join_t, worker_id, "worker_id", REQ_, STR_MAX_),
    STRING_(pcp_proto_join_t, backend, "backend", REQ_, STR_MAX_),
    STRING_(pcp_proto_join_t, target, "target", 0, STR_MAX_),
    INT_(pcp_proto_join_t, device_id, "device_id", REQ_, 0, INT32_MAX, 0),
    UINT_(pcp_proto_join_t, device_memory_bytes, "device_memory_bytes", REQ_, 0,
          INT64_MAX),
    LIST_(pcp_proto_join_t, drivers, driver_count, "drivers",
          PCP_PROTO_FIELD_STRING_LIST, 0, PCP_PROTO_MAX_LIST_ITEMS, NULL, 0),
    STRING_(pcp_proto_join_t, runtime_version, "runtime_version", 0, STR_MAX_),
    STRING_(pcp_proto_join_t, compiler_version, "compiler_version", 0,
            STR_MAX_),
    STRING_(pcp_proto_join_t, node_manager_id, "node_manager_id", 0, STR_MAX_),
    // -1: not supervised (also when the key is missing).
    INT_(pcp_proto_join_t, supervisor_id, "supervisor_id", 0, -1, INT64_MAX,
         -1),
    STRING_(pcp_proto_join_t, worker_class, "worker_class", 0, STR_MAX_),
    {.key = "resume",
     .kind = PCP_PROTO_FIELD_OBJECT,
     .flags = PCP_PROTO_FIELD_FLAG_PRESENCE,
     .offset = 0,
     .presence_offset = offsetof(pcp_proto_join_t, has_resume),
     .table = &join_resume_table},
};
static const pcp_proto_message_table_t join_table =
    TABLE_(PCP_PROTO_MESSAGE_JOIN, pcp_proto_join_t, join_fields,
           join_encode_check, join_parse_check);
DEFINE_MESSAGE_(join, pcp_proto_join_t)

//===----------------------------------------------------------------------===//
// CHALLENGE, JOIN_PROOF, ACCEPT, REJECT
//===----------------------------------------------------------------------===//

static const char* const kChallengeAlgorithms[] = {"hmac-sha256", NULL};

static const pcp_proto_field_t challenge_fields[] = {
    HEX_(pcp_proto_challenge_t, nonce, "nonce"),
    {.key = "algorithm",
     .kind = PCP_PROTO_FIELD_CONSTANT,
     .flags = REQ_,
     .max = 32,
     .names = kChallengeAlgorithms,
     .label = "challenge algorithm"},
};
static const pcp_proto_message_table_t challenge_table =
    TABLE_(PCP_PROTO_MESSAGE_CHALLENGE, pcp_proto_challenge_t, challenge_fields,
           NULL, NULL);
DEFINE_MESSAGE_(challenge, pcp_proto_challenge_t)

static pcp_status_t join_proof_encode_check(const void* message,
                                            const pcp_proto_limits_t* limits,
                                            size_t section_count) {
  (void)limits;
  (void)section_count;
  return check_worker_id(((const pcp_proto_join_proof_t*)message)->worker_id);
}

static const pcp_proto_field_t join_proof_fields[] = {
    STRING_(pcp_proto_join_proof_t, worker_id, "worker_id", REQ_, STR_MAX_),
    HEX_(pcp_proto_join_proof_t, mac, "mac"),
};
static const pcp_proto_message_table_t join_proof_table =
    TABLE_(PCP_PROTO_MESSAGE_JOIN_PROOF, pcp_proto_join_proof_t,
           join_proof_fields, join_proof_encode_check, NULL);
DEFINE_MESSAGE_(join_proof, pcp_proto_join_proof_t)

static const pcp_proto_field_t accept_fields[] = {
    STRING_(pcp_proto_accept_t, worker_id, "worker_id", REQ_, STR_MAX_),
    UINT_(pcp_proto_accept_t, lease_epoch, "lease_epoch", REQ_, 0, INT64_MAX),
    HEX_(pcp_proto_accept_t, resume_token, "resume_token"),
    BOOL_(pcp_proto_accept_t, resumed, "resumed"),
    UINT_(pcp_proto_accept_t, heartbeat_interval_ms, "heartbeat_interval_ms",
          REQ_, PCP_PROTO_HEARTBEAT_MIN_MS, PCP_PROTO_HEARTBEAT_MAX_MS),
    UINT_(pcp_proto_accept_t, max_frame_bytes, "max_frame_bytes", REQ_, 0,
          PCP_PROTO_CEILING_FRAME_BYTES),
    UINT_(pcp_proto_accept_t, max_chunk_bytes, "max_chunk_bytes", REQ_, 0,
          PCP_PROTO_CEILING_CHUNK_BYTES),
    UINT_(pcp_proto_accept_t, max_in_flight, "max_in_flight", REQ_, 0,
          PCP_PROTO_CEILING_IN_FLIGHT),
};
static const pcp_proto_message_table_t accept_table = TABLE_(
    PCP_PROTO_MESSAGE_ACCEPT, pcp_proto_accept_t, accept_fields, NULL, NULL);
DEFINE_MESSAGE_(accept, pcp_proto_accept_t)

static const pcp_proto_field_t reject_fields[] = {
    // Unknown reasons (a newer gateway) are kept as numbers, not refused.
    UINT_(pcp_proto_reject_t, reason, "reason", REQ_, 0, 255),
    STRING_(pcp_proto_reject_t, message, "message", 0,
            PCP_PROTO_MAX_MESSAGE_BYTES),
};
static const pcp_proto_message_table_t reject_table = TABLE_(
    PCP_PROTO_MESSAGE_REJECT, pcp_proto_reject_t, reject_fields, NULL, NULL);
DEFINE_MESSAGE_(reject, pcp_proto_reject_t)

//===----------------------------------------------------------------------===//
// HEARTBEAT, DRAIN, SHUTDOWN
//===----------------------------------------------------------------------===//

static const pcp_proto_field_t heartbeat_fields[] = {
    UINT_(pcp_proto_heartbeat_t, seq, "seq", REQ_, 0, INT64_MAX),
    UINT_(pcp_proto_heartbeat_t, ack, "ack", REQ_, 0, INT64_MAX),
};
static const pcp_proto_message_table_t heartbeat_table =
    TABLE_(PCP_PROTO_MESSAGE_HEARTBEAT, pcp_proto_heartbeat_t, heartbeat_fields,
           NULL, NULL);
DEFINE_MESSAGE_(heartbeat, pcp_proto_heartbeat_t)

static const pcp_proto_field_t drain_fields[] = {
    UINT_(pcp_proto_drain_t, deadline_ms, "deadline_ms", REQ_, 0, INT64_MAX),
};
static const pcp_proto_message_table_t drain_table = TABLE_(
    PCP_PROTO_MESSAGE_DRAIN, pcp_proto_drain_t, drain_fields, NULL, NULL);
DEFINE_MESSAGE_(drain, pcp_proto_drain_t)

static const pcp_proto_field_t shutdown_fields[] = {
    STRING_(pcp_proto_shutdown_t, reason, "reason", 0, STR_MAX_),
};
static const pcp_proto_message_table_t shutdown_table =
    TABLE_(PCP_PROTO_MESSAGE_SHUTDOWN, pcp_proto_shutdown_t, shutdown_fields,
           NULL, NULL);
DEFINE_MESSAGE_(shutdown, pcp_proto_shutdown_t)

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

static const pcp_proto_field_t program_offer_fields[] = {
    HEX_(pcp_proto_program_offer_t, program, "program"),
    UINT_(pcp_proto_program_offer_t, byte_length, "byte_length", REQ_, 0,
          INT64_MAX),
    STRING_(pcp_proto_program_offer_t, backend, "backend", REQ_, STR_MAX_),
    STRING_(pcp_proto_program_offer_t, target, "target", 0, STR_MAX_),
};
static const pcp_proto_message_table_t program_offer_table =
    TABLE_(PCP_PROTO_MESSAGE_PROGRAM_OFFER, pcp_proto_program_offer_t,
           program_offer_fields, NULL, NULL);
DEFINE_MESSAGE_(program_offer, pcp_proto_program_offer_t)

static const pcp_proto_field_t program_fetch_fields[] = {
    HEX_(pcp_proto_program_fetch_t, program, "program"),
};
static const pcp_proto_message_table_t program_fetch_table =
    TABLE_(PCP_PROTO_MESSAGE_PROGRAM_FETCH, pcp_proto_program_fetch_t,
           program_fetch_fields, NULL, NULL);
DEFINE_MESSAGE_(program_fetch, pcp_proto_program_fetch_t)

// Indexed by pcp_proto_program_ack_status_t - 1.
static const char* const kProgramAckStatuses[] = {"cached", "stored", NULL};

static const pcp_proto_field_t program_ack_fields[] = {
    HEX_(pcp_proto_program_ack_t, program, "program"),
    ENUM_(pcp_proto_program_ack_t, status, "status", 0, kProgramAckStatuses),
};
static const pcp_proto_message_table_t program_ack_table =
    TABLE_(PCP_PROTO_MESSAGE_PROGRAM_ACK, pcp_proto_program_ack_t,
           program_ack_fields, NULL, NULL);
DEFINE_MESSAGE_(program_ack, pcp_proto_program_ack_t)

//===----------------------------------------------------------------------===//
// BLOB_CHUNK
//===----------------------------------------------------------------------===//

// Indexed by pcp_proto_blob_kind_t - 1.
static const char* const kBlobKinds[] = {"program", "tensor", NULL};

static pcp_status_t blob_chunk_encode_check(const void* message,
                                            const pcp_proto_limits_t* limits,
                                            size_t section_count) {
  (void)section_count;
  const pcp_proto_blob_chunk_t* m = message;
  if (m->data_length > limits->chunk_bytes &&
      m->data_length > limits->max_chunk_bytes) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "BLOB_CHUNK of %llu bytes exceeds %llu",
                           (unsigned long long)m->data_length,
                           (unsigned long long)limits->max_chunk_bytes);
  }
  return pcp_ok_status();
}

// The index and the one "data" section, which the table cannot describe.
static pcp_status_t blob_chunk_parse_check(pcp_proto_frame_t* frame,
                                           void* message) {
  pcp_proto_blob_chunk_t* m = message;
  if (m->count == 0 || m->index >= m->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "chunk %llu of %llu",
                           (unsigned long long)m->index,
                           (unsigned long long)m->count);
  }
  const pcp_proto_section_t* s =
      frame->section_count == 1 ? &frame->sections[0] : NULL;
  if (!s || strcmp(s->name, "data") != 0 ||
      s->element_type != PCP_ELEMENT_TYPE_U8 || s->rank != 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "expected one u8 section named 'data'");
  }
  m->data = s->data;
  m->data_length = s->byte_length;
  if (m->offset > m->total || m->data_length > m->total - m->offset) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "chunk at %llu+%llu overruns the blob of %llu",
                           (unsigned long long)m->offset,
                           (unsigned long long)m->data_length,
                           (unsigned long long)m->total);
  }
  return pcp_ok_status();
}

static const pcp_proto_field_t blob_chunk_fields[] = {
    STRING_(pcp_proto_blob_chunk_t, blob_id, "blob", REQ_, STR_MAX_),
    ENUM_(pcp_proto_blob_chunk_t, kind, "kind", 0, kBlobKinds),
    UINT_(pcp_proto_blob_chunk_t, index, "index", REQ_, 0, INT64_MAX),
    UINT_(pcp_proto_blob_chunk_t, count, "count", REQ_, 0, INT64_MAX),
    UINT_(pcp_proto_blob_chunk_t, offset, "offset", REQ_, 0, INT64_MAX),
    UINT_(pcp_proto_blob_chunk_t, total, "total", REQ_, 0, INT64_MAX),
    // Last chunk of a program blob only.
    {.key = "sha256",
     .kind = PCP_PROTO_FIELD_HEX,
     .flags = PCP_PROTO_FIELD_FLAG_PRESENCE,
     .offset = offsetof(pcp_proto_blob_chunk_t, sha256),
     .size = PCP_SHA256_BYTE_LENGTH,
     .presence_offset = offsetof(pcp_proto_blob_chunk_t, has_sha256)},
};
static const pcp_proto_message_table_t blob_chunk_table =
    TABLE_(PCP_PROTO_MESSAGE_BLOB_CHUNK, pcp_proto_blob_chunk_t,
           blob_chunk_fields, blob_chunk_encode_check, blob_chunk_parse_check);

pcp_status_t pcp_proto_blob_chunk_encode(uint16_t version, uint64_t request_id,
                                         const pcp_proto_blob_chunk_t* m,
                                         const pcp_proto_limits_t* limits,
                                         pcp_allocator_t allocator,
                                         pcp_proto_encoded_frame_t* out_frame) {
  pcp_proto_section_t section = {
      .name = "data",
      .element_type = PCP_ELEMENT_TYPE_U8,
      .rank = 1,
      .shape = {(int64_t)m->data_length},
      .data = m->data,
  };
  return pcp_proto_message_encode(&blob_chunk_table, version, request_id, m,
                                  &section, 1, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_blob_chunk_parse(pcp_proto_frame_t* frame,
                                        pcp_proto_blob_chunk_t* m) {
  return pcp_proto_message_parse(&blob_chunk_table, frame, m);
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

static const pcp_proto_field_t keep_resident_fields[] = {
    UINT_(pcp_proto_keep_resident_t, output, "output", REQ_, 0,
          PCP_PROTO_MAX_TASK_TENSORS),
    STRING_(pcp_proto_keep_resident_t, as, "as", REQ_, STR_MAX_),
};
static const pcp_proto_message_table_t keep_resident_table =
    TABLE_(0, pcp_proto_keep_resident_t, keep_resident_fields, NULL, NULL);

static const pcp_proto_field_t task_assign_fields[] = {
    UINT_(pcp_proto_task_assign_t, task_id, "task_id", REQ_, 0, INT64_MAX),
    STRING_(pcp_proto_task_assign_t, session_id, "session_id", 0, STR_MAX_),
    HEX_(pcp_proto_task_assign_t, program, "program"),
    STRING_(pcp_proto_task_assign_t, function, "function", REQ_, STR_MAX_),
    LIST_(pcp_proto_task_assign_t, inputs, input_count, "inputs",
          PCP_PROTO_FIELD_TENSOR_REFS, REQ_, PCP_PROTO_MAX_TASK_TENSORS, NULL,
          0),
    LIST_(pcp_proto_task_assign_t, keep_resident, keep_resident_count,
          "keep_resident", PCP_PROTO_FIELD_ARRAY,
          PCP_PROTO_FIELD_FLAG_KEEP_RUNS, PCP_PROTO_MAX_TASK_TENSORS,
          &keep_resident_table, sizeof(pcp_proto_keep_resident_t)),
    BOOL_(pcp_proto_task_assign_t, return_resident, "return_resident"),
    UINT_(pcp_proto_task_assign_t, hash_inputs, "hash_inputs",
          PCP_PROTO_FIELD_FLAG_OMIT_ZERO, 0, PCP_PROTO_MAX_TASK_TENSORS),
    UINT_(pcp_proto_task_assign_t, hash_outputs, "hash_outputs",
          PCP_PROTO_FIELD_FLAG_OMIT_ZERO, 0, PCP_PROTO_MAX_TASK_TENSORS),
};
static const pcp_proto_message_table_t task_assign_table =
    TABLE_(PCP_PROTO_MESSAGE_TASK_ASSIGN, pcp_proto_task_assign_t,
           task_assign_fields, NULL, NULL);

pcp_status_t pcp_proto_task_assign_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_assign_t* m,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  return pcp_proto_message_encode(&task_assign_table, version, request_id, m,
                                  sections, section_count, limits, allocator,
                                  out_frame);
}

pcp_status_t pcp_proto_task_assign_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_task_assign_t* m) {
  return pcp_proto_message_parse(&task_assign_table, frame, m);
}

// Indexed by pcp_proto_task_state_t - 1.
static const char* const kTaskStates[] = {"queued", "running", NULL};

static const pcp_proto_field_t task_progress_fields[] = {
    UINT_(pcp_proto_task_progress_t, task_id, "task_id", REQ_, 0, INT64_MAX),
    ENUM_(pcp_proto_task_progress_t, state, "state",
          PCP_PROTO_FIELD_FLAG_ENUM_LAST_DEFAULT, kTaskStates),
    {.key = "fraction",
     .kind = PCP_PROTO_FIELD_REAL,
     .flags = PCP_PROTO_FIELD_FLAG_PRESENCE,
     .offset = offsetof(pcp_proto_task_progress_t, fraction),
     .presence_offset = offsetof(pcp_proto_task_progress_t, has_fraction),
     .min = 0,
     .max = 1},
};
static const pcp_proto_message_table_t task_progress_table =
    TABLE_(PCP_PROTO_MESSAGE_TASK_PROGRESS, pcp_proto_task_progress_t,
           task_progress_fields, NULL, NULL);
DEFINE_MESSAGE_(task_progress, pcp_proto_task_progress_t)

static const pcp_proto_field_t task_result_fields[] = {
    UINT_(pcp_proto_task_result_t, task_id, "task_id", REQ_, 0, INT64_MAX),
    LIST_(pcp_proto_task_result_t, outputs, output_count, "outputs",
          PCP_PROTO_FIELD_TENSOR_REFS, REQ_, PCP_PROTO_MAX_TASK_TENSORS, NULL,
          0),
    UINT_(pcp_proto_task_result_t, elapsed_us, "elapsed_us", 0, 0, INT64_MAX),
};
static const pcp_proto_message_table_t task_result_table =
    TABLE_(PCP_PROTO_MESSAGE_TASK_RESULT, pcp_proto_task_result_t,
           task_result_fields, NULL, NULL);

pcp_status_t pcp_proto_task_result_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_result_t* m,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  return pcp_proto_message_encode(&task_result_table, version, request_id, m,
                                  sections, section_count, limits, allocator,
                                  out_frame);
}

pcp_status_t pcp_proto_task_result_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_task_result_t* m) {
  return pcp_proto_message_parse(&task_result_table, frame, m);
}

static const pcp_proto_field_t task_cancel_fields[] = {
    UINT_(pcp_proto_task_cancel_t, task_id, "task_id", REQ_, 0, INT64_MAX),
    STRING_(pcp_proto_task_cancel_t, reason, "reason", 0, STR_MAX_),
};
static const pcp_proto_message_table_t task_cancel_table =
    TABLE_(PCP_PROTO_MESSAGE_TASK_CANCEL, pcp_proto_task_cancel_t,
           task_cancel_fields, NULL, NULL);
DEFINE_MESSAGE_(task_cancel, pcp_proto_task_cancel_t)

//===----------------------------------------------------------------------===//
// ERROR <-> pcp_status_t
//===----------------------------------------------------------------------===//

static pcp_status_t error_parse_check(pcp_proto_frame_t* frame, void* message) {
  (void)frame;
  if (((const pcp_proto_error_wire_t*)message)->code == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'code': 0 (OK) is not an error");
  }
  return pcp_ok_status();
}

static const pcp_proto_field_t error_fields[] = {
    UINT_(pcp_proto_error_wire_t, code, "code", REQ_, 0, 255),
    STRING_(pcp_proto_error_wire_t, message, "message", 0,
            PCP_PROTO_MAX_MESSAGE_BYTES),
    UINT_(pcp_proto_error_wire_t, task_id, "task_id",
          PCP_PROTO_FIELD_FLAG_OMIT_ZERO, 0, INT64_MAX),
};
static const pcp_proto_message_table_t error_table =
    TABLE_(PCP_PROTO_MESSAGE_ERROR, pcp_proto_error_wire_t, error_fields, NULL,
           error_parse_check);

//===----------------------------------------------------------------------===//
// The registry (every JSON message, for the table tests)
//===----------------------------------------------------------------------===//

static const pcp_proto_message_table_t* const kMessageTables[] = {
    &hello_table,         &join_table,          &challenge_table,
    &join_proof_table,    &accept_table,        &reject_table,
    &heartbeat_table,     &error_table,         &drain_table,
    &shutdown_table,      &program_offer_table, &program_fetch_table,
    &blob_chunk_table,    &program_ack_table,   &task_assign_table,
    &task_progress_table, &task_result_table,   &task_cancel_table,
};

const pcp_proto_message_table_t* pcp_proto_message_table_lookup(uint16_t type) {
  for (size_t i = 0; i < sizeof(kMessageTables) / sizeof(kMessageTables[0]);
       ++i) {
    if (kMessageTables[i]->type == type)
      return kMessageTables[i];
  }
  return NULL;
}

// The status text without "CODE: " and without " (file.c:123)": the peer
// gets the message and the annotations, not our source layout.
static void status_wire_message(pcp_status_t status, char* out, size_t cap) {
  char text[PCP_PROTO_MAX_MESSAGE_BYTES + 256];
  pcp_status_format(status, text, sizeof(text));
  const char* code = pcp_status_code_string(pcp_status_code(status));
  const char* start = text;
  size_t code_length = strlen(code);
  if (strncmp(text, code, code_length) == 0 && text[code_length] == ':' &&
      text[code_length + 1] == ' ') {
    start = text + code_length + 2;
  } else if (strcmp(text, code) == 0) {
    start = text + code_length;
  }
  size_t n = strlen(start);
  if (n > 0 && start[n - 1] == ')') {
    const char* open = strrchr(start, '(');
    if (open && open > start && open[-1] == ' ' && strchr(open, ':')) {
      n = (size_t)(open - 1 - start);
    }
  }
  if (n >= cap)
    n = cap - 1;
  // Cut on a UTF-8 boundary: never leave half a character.
  while (n > 0 && n < strlen(start) && ((uint8_t)start[n] & 0xC0) == 0x80) {
    --n;
  }
  memcpy(out, start, n);
  out[n] = '\0';
  // Invalid UTF-8 (a peer's bytes echoed in a message) would make jansson
  // refuse the string; replace such bytes rather than lose the error.
  json_t* probe = json_stringn(out, n);
  if (!probe) {
    for (size_t i = 0; i < n; ++i) {
      if ((uint8_t)out[i] >= 0x80)
        out[i] = '?';
    }
  }
  json_decref(probe);
}

pcp_status_t pcp_proto_error_encode(uint16_t version, uint64_t request_id,
                                    pcp_status_t peer_status, uint64_t task_id,
                                    const pcp_proto_limits_t* limits,
                                    pcp_allocator_t allocator,
                                    pcp_proto_encoded_frame_t* out_frame) {
  if (!peer_status) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "ERROR frame needs a failed status");
  }
  char message[PCP_PROTO_MAX_MESSAGE_BYTES + 1];
  status_wire_message(peer_status, message, sizeof(message));
  pcp_proto_error_wire_t wire = {
      .code = (uint64_t)pcp_status_code(peer_status),
      .message = message,
      .task_id = task_id,
  };
  return pcp_proto_message_encode(&error_table, version, request_id, &wire,
                                  NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_error_parse(pcp_proto_frame_t* frame,
                                   pcp_status_t* out_peer_status,
                                   uint64_t* out_task_id) {
  *out_peer_status = pcp_ok_status();
  *out_task_id = 0;
  pcp_proto_error_wire_t wire;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_message_parse(&error_table, frame, &wire));
  *out_task_id = wire.task_id;
  pcp_status_t peer;
  if (wire.code < PCP_STATUS_CODE_COUNT_) {
    peer = pcp_make_status((pcp_status_code_t)wire.code, "%s", wire.message);
  } else {
    peer = pcp_make_status(PCP_STATUS_UNKNOWN, "peer status code %llu: %s",
                           (unsigned long long)wire.code, wire.message);
  }
  *out_peer_status = pcp_status_annotate_f(peer, "from peer");
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Join proof
//===----------------------------------------------------------------------===//

static const char kJoinDomain[] = "pcp-join-v1";  // frozen: part of the MAC

pcp_status_t pcp_proto_join_mac_compute(
    const uint8_t* token, size_t token_length,
    const uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH], const char* worker_id,
    uint8_t out_mac[PCP_PROTO_MAC_BYTE_LENGTH]) {
  memset(out_mac, 0, PCP_PROTO_MAC_BYTE_LENGTH);
  if (!token || token_length == 0 || token_length > INT32_MAX) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "join token is empty");
  }
  size_t id_length = worker_id ? strlen(worker_id) : 0;
  if (id_length > PCP_PROTO_MAX_STRING_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "worker id too long");
  }
  // domain || 0x00 || nonce || worker_id
  uint8_t message[sizeof(kJoinDomain) + PCP_PROTO_NONCE_BYTE_LENGTH +
                  PCP_PROTO_MAX_STRING_BYTES];
  size_t n = 0;
  memcpy(message, kJoinDomain, sizeof(kJoinDomain));  // includes the NUL
  n += sizeof(kJoinDomain);
  memcpy(message + n, nonce, PCP_PROTO_NONCE_BYTE_LENGTH);
  n += PCP_PROTO_NONCE_BYTE_LENGTH;
  if (id_length) {
    // The MAC input is a byte string, not a C string.
    // NOLINTNEXTLINE(bugprone-not-null-terminated-result)
    memcpy(message + n, worker_id, id_length);
  }
  n += id_length;
  unsigned int mac_length = 0;
  if (!HMAC(EVP_sha256(), token, (int)token_length, message, n, out_mac,
            &mac_length) ||
      mac_length != PCP_PROTO_MAC_BYTE_LENGTH) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "HMAC-SHA256 failed");
  }
  return pcp_ok_status();
}

bool pcp_proto_join_mac_verify(const uint8_t* token, size_t token_length,
                               const uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH],
                               const char* worker_id,
                               const uint8_t mac[PCP_PROTO_MAC_BYTE_LENGTH]) {
  uint8_t expected[PCP_PROTO_MAC_BYTE_LENGTH];
  pcp_status_t status = pcp_proto_join_mac_compute(token, token_length, nonce,
                                                   worker_id, expected);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return CRYPTO_memcmp(expected, mac, PCP_PROTO_MAC_BYTE_LENGTH) == 0;
}

pcp_status_t pcp_proto_random_bytes(uint8_t* out_bytes, size_t byte_length) {
  if (byte_length > INT32_MAX || RAND_bytes(out_bytes, (int)byte_length) != 1) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "CSPRNG failed");
  }
  return pcp_ok_status();
}

bool pcp_proto_join_resume_matches(
    const pcp_proto_join_t* join, uint64_t lease_epoch,
    const uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH]) {
  if (!join->has_resume)
    return false;
  bool token_ok = CRYPTO_memcmp(join->resume_token, resume_token,
                                PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH) == 0;
  return token_ok && join->lease_epoch == lease_epoch;
}
