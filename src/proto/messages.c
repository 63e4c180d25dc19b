// SPDX-License-Identifier: Apache-2.0
//
// Typed messages of docs/protocol.md s.3: one encoder and one parser each,
// the ERROR frame <-> pcp_status_t mapping and the HMAC join proof.

#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "proto/proto_impl.h"

// Chains a status-returning step: later steps run only while all is well.
#define TRY_(expr)     \
  do {                 \
    if (!status)       \
      status = (expr); \
  } while (0)

#define STR_MAX_ PCP_PROTO_MAX_STRING_BYTES

static pcp_status_t expect_type(const pcp_proto_frame_t* frame,
                                pcp_proto_message_type_t type) {
  if (frame->header.type != type || !frame->control) {
    const char* got = pcp_proto_message_type_name(frame->header.type);
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "expected a %s frame, got %s (%u)",
                           pcp_proto_message_type_name(type),
                           got ? got : "unknown", frame->header.type);
  }
  return pcp_ok_status();
}

static pcp_status_t new_object(json_t** out_object) {
  *out_object = json_object();
  if (!*out_object) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  }
  return pcp_ok_status();
}

// Encodes |object| (consumed) into a frame once all fields were set.
static pcp_status_t finish_encode(
    pcp_status_t status, uint16_t version, uint16_t type, uint64_t request_id,
    json_t* object, const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  if (!status) {
    status =
        pcp_proto_frame_encode(version, type, request_id, object, sections,
                               section_count, limits, allocator, out_frame);
  }
  json_decref(object);
  if (status) {
    return pcp_status_annotate_f(status, "encoding %s",
                                 pcp_proto_message_type_name(type));
  }
  return status;
}

static json_t* json_u64(uint64_t value) {
  return json_integer((json_int_t)value);
}

#define PARSE_CONTEXT_(type) "parsing %s", pcp_proto_message_type_name(type)

//===----------------------------------------------------------------------===//
// HELLO
//===----------------------------------------------------------------------===//

uint16_t pcp_proto_version_select(uint16_t local_min, uint16_t local_max,
                                  uint16_t peer_min, uint16_t peer_max) {
  uint16_t high = local_max < peer_max ? local_max : peer_max;
  uint16_t low = local_min > peer_min ? local_min : peer_min;
  return high >= low && high > 0 ? high : 0;
}

pcp_status_t pcp_proto_hello_encode(uint16_t version, uint64_t request_id,
                                    const pcp_proto_hello_t* message,
                                    const pcp_proto_limits_t* limits,
                                    pcp_allocator_t allocator,
                                    pcp_proto_encoded_frame_t* out_frame) {
  (void)version;
  (void)request_id;
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  if (message->min_version == 0 ||
      message->min_version > message->max_version) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "HELLO: bad version range %u..%u",
                             message->min_version, message->max_version);
  }
  // Frozen key set (s.2): never rename these.
  TRY_(
      pcp_proto_json_set(o, "min_version", json_integer(message->min_version)));
  TRY_(
      pcp_proto_json_set(o, "max_version", json_integer(message->max_version)));
  TRY_(pcp_proto_json_set_string(o, "role", message->role, 32));
  TRY_(pcp_proto_json_set_string(o, "software", message->software, STR_MAX_));
  if (message->has_selected_version) {
    TRY_(pcp_proto_json_set(o, "selected_version",
                            json_integer(message->selected_version)));
  }
  // HELLO's header carries the sender's max version and request id 0.
  return finish_encode(status, message->max_version, PCP_PROTO_MESSAGE_HELLO, 0,
                       o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_hello_parse(pcp_proto_frame_t* frame,
                                   pcp_proto_hello_t* out_message) {
  memset(out_message, 0, sizeof(*out_message));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_HELLO));
  const json_t* o = frame->control;
  uint64_t min_v = 0, max_v = 0, selected = 0;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(o, "min_version", UINT16_MAX, &min_v));
  TRY_(pcp_proto_json_u64(o, "max_version", UINT16_MAX, &max_v));
  TRY_(pcp_proto_json_string(o, "role", 1, 32, &out_message->role));
  TRY_(pcp_proto_json_opt_string(o, "software", STR_MAX_,
                                 &out_message->software));
  TRY_(pcp_proto_json_opt_u64(o, "selected_version", UINT16_MAX, &selected,
                              &out_message->has_selected_version));
  if (!status && (min_v == 0 || min_v > max_v)) {
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "bad version range %llu..%llu",
        (unsigned long long)min_v, (unsigned long long)max_v);
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_HELLO));
  out_message->min_version = (uint16_t)min_v;
  out_message->max_version = (uint16_t)max_v;
  out_message->selected_version = (uint16_t)selected;
  return pcp_ok_status();
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

pcp_status_t pcp_proto_join_encode(uint16_t version, uint64_t request_id,
                                   const pcp_proto_join_t* m,
                                   const pcp_proto_limits_t* limits,
                                   pcp_allocator_t allocator,
                                   pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  json_t* drivers = json_array();
  TRY_(check_worker_id(m->worker_id));
  if (!status && m->driver_count > PCP_PROTO_MAX_LIST_ITEMS) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'drivers': at most %u items",
                             PCP_PROTO_MAX_LIST_ITEMS);
  }
  TRY_(pcp_proto_json_set_string(o, "worker_id", m->worker_id, STR_MAX_));
  TRY_(pcp_proto_json_set_string(o, "backend", m->backend, STR_MAX_));
  TRY_(pcp_proto_json_set_string(o, "target", m->target, STR_MAX_));
  TRY_(pcp_proto_json_set(o, "device_id", json_integer(m->device_id)));
  TRY_(pcp_proto_json_set(o, "device_memory_bytes",
                          json_u64(m->device_memory_bytes)));
  for (uint32_t i = 0; i < m->driver_count && !status && drivers; ++i) {
    const char* d = m->drivers[i] ? m->drivers[i] : "";
    if (strlen(d) > STR_MAX_ ||
        json_array_append_new(drivers, json_string(d))) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'drivers': bad item %u", i);
    }
  }
  if (!status) {
    status = pcp_proto_json_set(o, "drivers", drivers);
  } else {
    json_decref(drivers);
  }
  TRY_(pcp_proto_json_set_string(o, "runtime_version", m->runtime_version,
                                 STR_MAX_));
  TRY_(pcp_proto_json_set_string(o, "compiler_version", m->compiler_version,
                                 STR_MAX_));
  TRY_(pcp_proto_json_set_string(o, "node_manager_id", m->node_manager_id,
                                 STR_MAX_));
  TRY_(pcp_proto_json_set(o, "supervisor_id", json_integer(m->supervisor_id)));
  TRY_(pcp_proto_json_set_string(o, "worker_class", m->worker_class, STR_MAX_));
  if (m->has_resume && !status) {
    json_t* r = json_object();
    status = r ? pcp_ok_status()
               : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
    TRY_(pcp_proto_json_set(r, "lease_epoch", json_u64(m->lease_epoch)));
    TRY_(pcp_proto_json_set_hex(r, "resume_token", m->resume_token,
                                sizeof(m->resume_token)));
    if (!status) {
      status = pcp_proto_json_set(o, "resume", r);
    } else {
      json_decref(r);
    }
  }
  return finish_encode(status, version, PCP_PROTO_MESSAGE_JOIN, request_id, o,
                       NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_join_parse(pcp_proto_frame_t* frame,
                                  pcp_proto_join_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_JOIN));
  const json_t* o = frame->control;
  pcp_status_t status = pcp_ok_status();
  int64_t device_id = 0;
  TRY_(pcp_proto_json_string(o, "worker_id", 1, STR_MAX_, &m->worker_id));
  TRY_(check_worker_id(m->worker_id));
  TRY_(pcp_proto_json_string(o, "backend", 1, STR_MAX_, &m->backend));
  TRY_(pcp_proto_json_opt_string(o, "target", STR_MAX_, &m->target));
  TRY_(pcp_proto_json_i64(o, "device_id", 0, INT32_MAX, &device_id));
  TRY_(pcp_proto_json_u64(o, "device_memory_bytes", INT64_MAX,
                          &m->device_memory_bytes));
  json_t* drivers = json_object_get(o, "drivers");
  if (!status && drivers) {
    if (!json_is_array(drivers) ||
        json_array_size(drivers) > PCP_PROTO_MAX_LIST_ITEMS) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'drivers': expected at most %u strings",
                               PCP_PROTO_MAX_LIST_ITEMS);
    }
    for (size_t i = 0; !status && i < json_array_size(drivers); ++i) {
      json_t* d = json_array_get(drivers, i);
      if (!json_is_string(d) || json_string_length(d) > STR_MAX_) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key 'drivers': item %zu is not a short "
                                 "string",
                                 i);
      } else {
        m->drivers[m->driver_count++] = json_string_value(d);
      }
    }
  }
  TRY_(pcp_proto_json_opt_string(o, "runtime_version", STR_MAX_,
                                 &m->runtime_version));
  TRY_(pcp_proto_json_opt_string(o, "compiler_version", STR_MAX_,
                                 &m->compiler_version));
  TRY_(pcp_proto_json_opt_string(o, "node_manager_id", STR_MAX_,
                                 &m->node_manager_id));
  m->supervisor_id = -1;
  if (!status && json_object_get(o, "supervisor_id")) {
    status = pcp_proto_json_i64(o, "supervisor_id", -1, INT64_MAX,
                                &m->supervisor_id);
  }
  TRY_(
      pcp_proto_json_opt_string(o, "worker_class", STR_MAX_, &m->worker_class));
  json_t* resume = json_object_get(o, "resume");
  if (!status && resume) {
    if (!json_is_object(resume)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'resume': expected an object");
    }
    TRY_(pcp_proto_json_u64(resume, "lease_epoch", INT64_MAX, &m->lease_epoch));
    TRY_(pcp_proto_json_hex(resume, "resume_token", sizeof(m->resume_token),
                            m->resume_token));
    m->has_resume = !status;
  }
  m->device_id = (int32_t)device_id;
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_JOIN));
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// CHALLENGE, JOIN_PROOF, ACCEPT, REJECT
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_challenge_encode(uint16_t version, uint64_t request_id,
                                        const pcp_proto_challenge_t* m,
                                        const pcp_proto_limits_t* limits,
                                        pcp_allocator_t allocator,
                                        pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set_hex(o, "nonce", m->nonce, sizeof(m->nonce)));
  TRY_(pcp_proto_json_set(o, "algorithm", json_string("hmac-sha256")));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_CHALLENGE, request_id,
                       o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_challenge_parse(pcp_proto_frame_t* frame,
                                       pcp_proto_challenge_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_CHALLENGE));
  const char* algorithm = NULL;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_hex(frame->control, "nonce", sizeof(m->nonce), m->nonce));
  TRY_(pcp_proto_json_string(frame->control, "algorithm", 1, 32, &algorithm));
  if (!status && strcmp(algorithm, "hmac-sha256") != 0) {
    status = pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "challenge algorithm '%s'", algorithm);
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_CHALLENGE));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_join_proof_encode(uint16_t version, uint64_t request_id,
                                         const pcp_proto_join_proof_t* m,
                                         const pcp_proto_limits_t* limits,
                                         pcp_allocator_t allocator,
                                         pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(check_worker_id(m->worker_id));
  TRY_(pcp_proto_json_set_string(o, "worker_id", m->worker_id, STR_MAX_));
  TRY_(pcp_proto_json_set_hex(o, "mac", m->mac, sizeof(m->mac)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_JOIN_PROOF,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_join_proof_parse(pcp_proto_frame_t* frame,
                                        pcp_proto_join_proof_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_JOIN_PROOF));
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_string(frame->control, "worker_id", 1, STR_MAX_,
                             &m->worker_id));
  TRY_(pcp_proto_json_hex(frame->control, "mac", sizeof(m->mac), m->mac));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_JOIN_PROOF));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_accept_encode(uint16_t version, uint64_t request_id,
                                     const pcp_proto_accept_t* m,
                                     const pcp_proto_limits_t* limits,
                                     pcp_allocator_t allocator,
                                     pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set_string(o, "worker_id", m->worker_id, STR_MAX_));
  TRY_(pcp_proto_json_set(o, "lease_epoch", json_u64(m->lease_epoch)));
  TRY_(pcp_proto_json_set_hex(o, "resume_token", m->resume_token,
                              sizeof(m->resume_token)));
  TRY_(pcp_proto_json_set(o, "resumed", json_boolean(m->resumed)));
  TRY_(pcp_proto_json_set(o, "heartbeat_interval_ms",
                          json_integer(m->heartbeat_interval_ms)));
  TRY_(pcp_proto_json_set(o, "max_frame_bytes", json_u64(m->max_frame_bytes)));
  TRY_(pcp_proto_json_set(o, "max_chunk_bytes", json_u64(m->max_chunk_bytes)));
  TRY_(pcp_proto_json_set(o, "max_in_flight", json_integer(m->max_in_flight)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_ACCEPT, request_id, o,
                       NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_accept_parse(pcp_proto_frame_t* frame,
                                    pcp_proto_accept_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_ACCEPT));
  const json_t* o = frame->control;
  uint64_t hb = 0, in_flight = 0;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_string(o, "worker_id", 1, STR_MAX_, &m->worker_id));
  TRY_(pcp_proto_json_u64(o, "lease_epoch", INT64_MAX, &m->lease_epoch));
  TRY_(pcp_proto_json_hex(o, "resume_token", sizeof(m->resume_token),
                          m->resume_token));
  TRY_(pcp_proto_json_bool(o, "resumed", false, &m->resumed));
  TRY_(pcp_proto_json_u64(o, "heartbeat_interval_ms",
                          PCP_PROTO_HEARTBEAT_MAX_MS, &hb));
  TRY_(pcp_proto_json_u64(o, "max_frame_bytes", PCP_PROTO_CEILING_FRAME_BYTES,
                          &m->max_frame_bytes));
  TRY_(pcp_proto_json_u64(o, "max_chunk_bytes", PCP_PROTO_CEILING_CHUNK_BYTES,
                          &m->max_chunk_bytes));
  TRY_(pcp_proto_json_u64(o, "max_in_flight", PCP_PROTO_CEILING_IN_FLIGHT,
                          &in_flight));
  if (!status && hb < PCP_PROTO_HEARTBEAT_MIN_MS) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'heartbeat_interval_ms': below %u",
                             PCP_PROTO_HEARTBEAT_MIN_MS);
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_ACCEPT));
  m->heartbeat_interval_ms = (uint32_t)hb;
  m->max_in_flight = (uint32_t)in_flight;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_reject_encode(uint16_t version, uint64_t request_id,
                                     const pcp_proto_reject_t* m,
                                     const pcp_proto_limits_t* limits,
                                     pcp_allocator_t allocator,
                                     pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "reason", json_integer(m->reason)));
  TRY_(pcp_proto_json_set_string(o, "message", m->message,
                                 PCP_PROTO_MAX_MESSAGE_BYTES));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_REJECT, request_id, o,
                       NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_reject_parse(pcp_proto_frame_t* frame,
                                    pcp_proto_reject_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_REJECT));
  uint64_t reason = 0;
  pcp_status_t status = pcp_ok_status();
  // Unknown reasons (a newer gateway) are kept as numbers, not refused.
  TRY_(pcp_proto_json_u64(frame->control, "reason", 255, &reason));
  TRY_(pcp_proto_json_opt_string(frame->control, "message",
                                 PCP_PROTO_MAX_MESSAGE_BYTES, &m->message));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_REJECT));
  m->reason = (uint32_t)reason;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// HEARTBEAT, DRAIN, SHUTDOWN
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_heartbeat_encode(uint16_t version, uint64_t request_id,
                                        const pcp_proto_heartbeat_t* m,
                                        const pcp_proto_limits_t* limits,
                                        pcp_allocator_t allocator,
                                        pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "seq", json_u64(m->seq)));
  TRY_(pcp_proto_json_set(o, "ack", json_u64(m->ack)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_HEARTBEAT, request_id,
                       o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_heartbeat_parse(pcp_proto_frame_t* frame,
                                       pcp_proto_heartbeat_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_HEARTBEAT));
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(frame->control, "seq", INT64_MAX, &m->seq));
  TRY_(pcp_proto_json_u64(frame->control, "ack", INT64_MAX, &m->ack));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_HEARTBEAT));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_drain_encode(uint16_t version, uint64_t request_id,
                                    const pcp_proto_drain_t* m,
                                    const pcp_proto_limits_t* limits,
                                    pcp_allocator_t allocator,
                                    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "deadline_ms", json_u64(m->deadline_ms)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_DRAIN, request_id, o,
                       NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_drain_parse(pcp_proto_frame_t* frame,
                                   pcp_proto_drain_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_DRAIN));
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(frame->control, "deadline_ms",
                                         INT64_MAX, &m->deadline_ms),
                      PARSE_CONTEXT_(PCP_PROTO_MESSAGE_DRAIN));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_shutdown_encode(uint16_t version, uint64_t request_id,
                                       const pcp_proto_shutdown_t* m,
                                       const pcp_proto_limits_t* limits,
                                       pcp_allocator_t allocator,
                                       pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set_string(o, "reason", m->reason, STR_MAX_));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_SHUTDOWN, request_id,
                       o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_shutdown_parse(pcp_proto_frame_t* frame,
                                      pcp_proto_shutdown_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_SHUTDOWN));
  PCP_RETURN_IF_ERROR(
      pcp_proto_json_opt_string(frame->control, "reason", STR_MAX_, &m->reason),
      PARSE_CONTEXT_(PCP_PROTO_MESSAGE_SHUTDOWN));
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_program_offer_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_program_offer_t* m,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set_hex(o, "program", m->program, sizeof(m->program)));
  TRY_(pcp_proto_json_set(o, "byte_length", json_u64(m->byte_length)));
  TRY_(pcp_proto_json_set_string(o, "backend", m->backend, STR_MAX_));
  TRY_(pcp_proto_json_set_string(o, "target", m->target, STR_MAX_));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_PROGRAM_OFFER,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_program_offer_parse(pcp_proto_frame_t* frame,
                                           pcp_proto_program_offer_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_PROGRAM_OFFER));
  const json_t* o = frame->control;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_hex(o, "program", sizeof(m->program), m->program));
  TRY_(pcp_proto_json_u64(o, "byte_length", INT64_MAX, &m->byte_length));
  TRY_(pcp_proto_json_string(o, "backend", 1, STR_MAX_, &m->backend));
  TRY_(pcp_proto_json_opt_string(o, "target", STR_MAX_, &m->target));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_PROGRAM_OFFER));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_program_fetch_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_program_fetch_t* m,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set_hex(o, "program", m->program, sizeof(m->program)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_PROGRAM_FETCH,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_program_fetch_parse(pcp_proto_frame_t* frame,
                                           pcp_proto_program_fetch_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_PROGRAM_FETCH));
  PCP_RETURN_IF_ERROR(pcp_proto_json_hex(frame->control, "program",
                                         sizeof(m->program), m->program),
                      PARSE_CONTEXT_(PCP_PROTO_MESSAGE_PROGRAM_FETCH));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_program_ack_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_program_ack_t* m,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  const char* text = m->status == PCP_PROTO_PROGRAM_CACHED   ? "cached"
                     : m->status == PCP_PROTO_PROGRAM_STORED ? "stored"
                                                             : NULL;
  if (!text) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "PROGRAM_ACK: bad status %d", (int)m->status);
  }
  TRY_(pcp_proto_json_set_hex(o, "program", m->program, sizeof(m->program)));
  TRY_(pcp_proto_json_set(o, "status", json_string(text ? text : "")));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_PROGRAM_ACK,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_program_ack_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_program_ack_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_PROGRAM_ACK));
  const char* text = NULL;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_hex(frame->control, "program", sizeof(m->program),
                          m->program));
  TRY_(pcp_proto_json_string(frame->control, "status", 1, 32, &text));
  if (!status) {
    if (strcmp(text, "cached") == 0) {
      m->status = PCP_PROTO_PROGRAM_CACHED;
    } else if (strcmp(text, "stored") == 0) {
      m->status = PCP_PROTO_PROGRAM_STORED;
    } else {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'status': '%s'", text);
    }
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_PROGRAM_ACK));
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// BLOB_CHUNK
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_blob_chunk_encode(uint16_t version, uint64_t request_id,
                                         const pcp_proto_blob_chunk_t* m,
                                         const pcp_proto_limits_t* limits,
                                         pcp_allocator_t allocator,
                                         pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  if (m->kind != PCP_PROTO_BLOB_PROGRAM && m->kind != PCP_PROTO_BLOB_TENSOR) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad blob kind");
  }
  if (!status && m->data_length > limits->chunk_bytes &&
      m->data_length > limits->max_chunk_bytes) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "BLOB_CHUNK of %llu bytes exceeds %llu",
                             (unsigned long long)m->data_length,
                             (unsigned long long)limits->max_chunk_bytes);
  }
  TRY_(pcp_proto_json_set_string(o, "blob", m->blob_id, STR_MAX_));
  TRY_(pcp_proto_json_set(
      o, "kind",
      json_string(m->kind == PCP_PROTO_BLOB_PROGRAM ? "program" : "tensor")));
  TRY_(pcp_proto_json_set(o, "index", json_u64(m->index)));
  TRY_(pcp_proto_json_set(o, "count", json_u64(m->count)));
  TRY_(pcp_proto_json_set(o, "offset", json_u64(m->offset)));
  TRY_(pcp_proto_json_set(o, "total", json_u64(m->total)));
  if (m->has_sha256) {
    TRY_(pcp_proto_json_set_hex(o, "sha256", m->sha256, sizeof(m->sha256)));
  }
  pcp_proto_section_t section = {
      .name = "data",
      .element_type = PCP_ELEMENT_TYPE_U8,
      .rank = 1,
      .shape = {(int64_t)m->data_length},
      .data = m->data,
  };
  return finish_encode(status, version, PCP_PROTO_MESSAGE_BLOB_CHUNK,
                       request_id, o, &section, 1, limits, allocator,
                       out_frame);
}

pcp_status_t pcp_proto_blob_chunk_parse(pcp_proto_frame_t* frame,
                                        pcp_proto_blob_chunk_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_BLOB_CHUNK));
  const json_t* o = frame->control;
  const char* kind = NULL;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_string(o, "blob", 1, STR_MAX_, &m->blob_id));
  TRY_(pcp_proto_json_string(o, "kind", 1, 32, &kind));
  TRY_(pcp_proto_json_u64(o, "index", INT64_MAX, &m->index));
  TRY_(pcp_proto_json_u64(o, "count", INT64_MAX, &m->count));
  TRY_(pcp_proto_json_u64(o, "offset", INT64_MAX, &m->offset));
  TRY_(pcp_proto_json_u64(o, "total", INT64_MAX, &m->total));
  if (!status && json_object_get(o, "sha256")) {
    status = pcp_proto_json_hex(o, "sha256", sizeof(m->sha256), m->sha256);
    m->has_sha256 = !status;
  }
  if (!status) {
    if (strcmp(kind, "program") == 0) {
      m->kind = PCP_PROTO_BLOB_PROGRAM;
    } else if (strcmp(kind, "tensor") == 0) {
      m->kind = PCP_PROTO_BLOB_TENSOR;
    } else {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "key 'kind': '%s'",
                               kind);
    }
  }
  if (!status && (m->count == 0 || m->index >= m->count)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "chunk %llu of %llu",
                             (unsigned long long)m->index,
                             (unsigned long long)m->count);
  }
  if (!status) {
    const pcp_proto_section_t* s =
        frame->section_count == 1 ? &frame->sections[0] : NULL;
    if (!s || strcmp(s->name, "data") != 0 ||
        s->element_type != PCP_ELEMENT_TYPE_U8 || s->rank != 1) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "expected one u8 section named 'data'");
    } else {
      m->data = s->data;
      m->data_length = s->byte_length;
    }
  }
  if (!status &&
      (m->offset > m->total || m->data_length > m->total - m->offset)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "chunk at %llu+%llu overruns the blob of %llu",
                             (unsigned long long)m->offset,
                             (unsigned long long)m->data_length,
                             (unsigned long long)m->total);
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_BLOB_CHUNK));
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

static pcp_status_t refs_to_json(const char* key,
                                 const pcp_proto_tensor_ref_t* refs,
                                 uint32_t count, size_t section_count,
                                 json_t* object) {
  if (count > PCP_PROTO_MAX_TASK_TENSORS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': at most %u tensors", key,
                           PCP_PROTO_MAX_TASK_TENSORS);
  }
  json_t* array = json_array();
  pcp_status_t status =
      array ? pcp_ok_status()
            : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  for (uint32_t i = 0; i < count && !status; ++i) {
    const pcp_proto_tensor_ref_t* r = &refs[i];
    json_t* e = json_object();
    if (!e) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
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
        json_t* shape = json_array();
        for (uint32_t d = 0; shape && d < r->rank && d < PCP_MAX_TENSOR_RANK;
             ++d) {
          json_array_append_new(shape, json_integer(r->shape[d]));
        }
        TRY_(pcp_proto_json_set(e, "shape", shape));
        break;
      }
      default:
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "key '%s'[%u]: bad kind", key, i);
    }
    if (!status && json_array_append_new(array, e) != 0) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
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

static pcp_status_t refs_from_json(const pcp_proto_frame_t* frame,
                                   const char* key, uint32_t max_rank,
                                   pcp_proto_tensor_ref_t* refs,
                                   uint32_t count) {
  json_t* array = json_object_get(frame->control, key);
  for (uint32_t i = 0; i < count; ++i) {
    json_t* e = json_array_get(array, i);
    pcp_proto_tensor_ref_t* r = &refs[i];
    char what[64];
    snprintf(what, sizeof(what), "key '%s'[%u]", key, i);
    if (!json_is_object(e)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: not an object",
                             what);
    }
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
      PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_shape(
          json_object_get(e, "shape"), what, max_rank, &r->rank, r->shape));
    } else {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: needs 'section', 'resident' or 'blob'", what);
    }
  }
  return pcp_ok_status();
}

static pcp_status_t array_count(const json_t* object, const char* key,
                                bool required, uint32_t* out_count) {
  json_t* array = json_object_get(object, key);
  *out_count = 0;
  if (!array && !required)
    return pcp_ok_status();
  if (!json_is_array(array) ||
      json_array_size(array) > PCP_PROTO_MAX_TASK_TENSORS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected an array of at most %u", key,
                           PCP_PROTO_MAX_TASK_TENSORS);
  }
  *out_count = (uint32_t)json_array_size(array);
  return pcp_ok_status();
}

pcp_status_t pcp_proto_task_assign_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_assign_t* m,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "task_id", json_u64(m->task_id)));
  TRY_(pcp_proto_json_set_string(o, "session_id", m->session_id, STR_MAX_));
  TRY_(pcp_proto_json_set_hex(o, "program", m->program, sizeof(m->program)));
  TRY_(pcp_proto_json_set_string(o, "function", m->function, STR_MAX_));
  TRY_(refs_to_json("inputs", m->inputs, m->input_count, section_count, o));
  if (!status && m->keep_resident_count > PCP_PROTO_MAX_TASK_TENSORS) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'keep_resident': too many");
  }
  json_t* keep = status ? NULL : json_array();
  for (uint32_t i = 0; keep && !status && i < m->keep_resident_count; ++i) {
    json_t* e = json_object();
    if (!e) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
      break;
    }
    TRY_(pcp_proto_json_set(e, "output",
                            json_integer(m->keep_resident[i].output)));
    TRY_(pcp_proto_json_set_string(e, "as", m->keep_resident[i].as, STR_MAX_));
    if (!status) {
      json_array_append_new(keep, e);
    } else {
      json_decref(e);
    }
  }
  if (keep) {
    if (!status) {
      status = pcp_proto_json_set(o, "keep_resident", keep);
    } else {
      json_decref(keep);
    }
  }
  TRY_(pcp_proto_json_set(o, "return_resident",
                          json_boolean(m->return_resident)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_TASK_ASSIGN,
                       request_id, o, sections, section_count, limits,
                       allocator, out_frame);
}

pcp_status_t pcp_proto_task_assign_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_task_assign_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_TASK_ASSIGN));
  const json_t* o = frame->control;
  uint32_t input_count = 0, keep_count = 0;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(o, "task_id", INT64_MAX, &m->task_id));
  TRY_(pcp_proto_json_opt_string(o, "session_id", STR_MAX_, &m->session_id));
  TRY_(pcp_proto_json_hex(o, "program", sizeof(m->program), m->program));
  TRY_(pcp_proto_json_string(o, "function", 1, STR_MAX_, &m->function));
  TRY_(array_count(o, "inputs", true, &input_count));
  TRY_(array_count(o, "keep_resident", false, &keep_count));
  TRY_(pcp_proto_json_bool(o, "return_resident", false, &m->return_resident));
  void* scratch = NULL;
  // Counts were bounded above, before this allocation.
  TRY_(pcp_proto_frame_scratch(
      frame,
      input_count * sizeof(pcp_proto_tensor_ref_t) +
          keep_count * sizeof(pcp_proto_keep_resident_t),
      &scratch));
  pcp_proto_tensor_ref_t* inputs = scratch;
  pcp_proto_keep_resident_t* keep =
      scratch ? (pcp_proto_keep_resident_t*)(inputs + input_count) : NULL;
  TRY_(refs_from_json(frame, "inputs", PCP_MAX_TENSOR_RANK, inputs,
                      input_count));
  json_t* keep_array = json_object_get(o, "keep_resident");
  for (uint32_t i = 0; !status && i < keep_count; ++i) {
    json_t* e = json_array_get(keep_array, i);
    uint64_t output = 0;
    if (!json_is_object(e)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'keep_resident'[%u]: not an object", i);
    }
    TRY_(pcp_proto_json_u64(e, "output", PCP_PROTO_MAX_TASK_TENSORS, &output));
    if (!status && keep) {
      status = pcp_proto_json_string(e, "as", 1, STR_MAX_, &keep[i].as);
      keep[i].output = (uint32_t)output;
    }
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_TASK_ASSIGN));
  m->inputs = inputs;
  m->input_count = input_count;
  m->keep_resident = keep;
  m->keep_resident_count = keep_count;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_task_progress_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_progress_t* m,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "task_id", json_u64(m->task_id)));
  TRY_(pcp_proto_json_set(
      o, "state",
      json_string(m->state == PCP_PROTO_TASK_QUEUED ? "queued" : "running")));
  if (m->has_fraction) {
    if (!(m->fraction >= 0.0 && m->fraction <= 1.0)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "fraction must be in [0, 1]");
    }
    TRY_(pcp_proto_json_set(o, "fraction", json_real(m->fraction)));
  }
  return finish_encode(status, version, PCP_PROTO_MESSAGE_TASK_PROGRESS,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_task_progress_parse(pcp_proto_frame_t* frame,
                                           pcp_proto_task_progress_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_TASK_PROGRESS));
  const json_t* o = frame->control;
  const char* state = NULL;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(o, "task_id", INT64_MAX, &m->task_id));
  TRY_(pcp_proto_json_string(o, "state", 1, 32, &state));
  if (!status) {
    if (strcmp(state, "queued") == 0) {
      m->state = PCP_PROTO_TASK_QUEUED;
    } else if (strcmp(state, "running") == 0) {
      m->state = PCP_PROTO_TASK_RUNNING;
    } else {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "key 'state': '%s'",
                               state);
    }
  }
  json_t* fraction = json_object_get(o, "fraction");
  if (!status && fraction) {
    if (!json_is_number(fraction) || json_number_value(fraction) < 0.0 ||
        json_number_value(fraction) > 1.0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'fraction': expected a number in [0, 1]");
    } else {
      m->has_fraction = true;
      m->fraction = json_number_value(fraction);
    }
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_TASK_PROGRESS));
  return pcp_ok_status();
}

pcp_status_t pcp_proto_task_result_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_result_t* m,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "task_id", json_u64(m->task_id)));
  TRY_(refs_to_json("outputs", m->outputs, m->output_count, section_count, o));
  TRY_(pcp_proto_json_set(o, "elapsed_us", json_u64(m->elapsed_us)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_TASK_RESULT,
                       request_id, o, sections, section_count, limits,
                       allocator, out_frame);
}

pcp_status_t pcp_proto_task_result_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_task_result_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_TASK_RESULT));
  const json_t* o = frame->control;
  uint32_t count = 0;
  bool present = false;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(o, "task_id", INT64_MAX, &m->task_id));
  TRY_(pcp_proto_json_opt_u64(o, "elapsed_us", INT64_MAX, &m->elapsed_us,
                              &present));
  TRY_(array_count(o, "outputs", true, &count));
  void* scratch = NULL;
  TRY_(pcp_proto_frame_scratch(frame, count * sizeof(pcp_proto_tensor_ref_t),
                               &scratch));
  TRY_(refs_from_json(frame, "outputs", PCP_MAX_TENSOR_RANK, scratch, count));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_TASK_RESULT));
  m->outputs = scratch;
  m->output_count = count;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_task_cancel_encode(
    uint16_t version, uint64_t request_id, const pcp_proto_task_cancel_t* m,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame) {
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "task_id", json_u64(m->task_id)));
  TRY_(pcp_proto_json_set_string(o, "reason", m->reason, STR_MAX_));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_TASK_CANCEL,
                       request_id, o, NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_task_cancel_parse(pcp_proto_frame_t* frame,
                                         pcp_proto_task_cancel_t* m) {
  memset(m, 0, sizeof(*m));
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_TASK_CANCEL));
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(frame->control, "task_id", INT64_MAX, &m->task_id));
  TRY_(pcp_proto_json_opt_string(frame->control, "reason", STR_MAX_,
                                 &m->reason));
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_TASK_CANCEL));
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// ERROR <-> pcp_status_t
//===----------------------------------------------------------------------===//

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
  json_t* o = NULL;
  pcp_status_t status = new_object(&o);
  if (status)
    return status;
  TRY_(pcp_proto_json_set(o, "code",
                          json_integer(pcp_status_code(peer_status))));
  TRY_(pcp_proto_json_set_string(o, "message", message,
                                 PCP_PROTO_MAX_MESSAGE_BYTES));
  if (task_id)
    TRY_(pcp_proto_json_set(o, "task_id", json_u64(task_id)));
  return finish_encode(status, version, PCP_PROTO_MESSAGE_ERROR, request_id, o,
                       NULL, 0, limits, allocator, out_frame);
}

pcp_status_t pcp_proto_error_parse(pcp_proto_frame_t* frame,
                                   pcp_status_t* out_peer_status,
                                   uint64_t* out_task_id) {
  *out_peer_status = pcp_ok_status();
  *out_task_id = 0;
  PCP_RETURN_IF_ERROR_BARE(expect_type(frame, PCP_PROTO_MESSAGE_ERROR));
  uint64_t code = 0;
  const char* message = NULL;
  pcp_status_t status = pcp_ok_status();
  TRY_(pcp_proto_json_u64(frame->control, "code", 255, &code));
  TRY_(pcp_proto_json_opt_string(frame->control, "message",
                                 PCP_PROTO_MAX_MESSAGE_BYTES, &message));
  bool present = false;
  TRY_(pcp_proto_json_opt_u64(frame->control, "task_id", INT64_MAX, out_task_id,
                              &present));
  if (!status && code == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'code': 0 (OK) is not an error");
  }
  PCP_RETURN_IF_ERROR(status, PARSE_CONTEXT_(PCP_PROTO_MESSAGE_ERROR));
  pcp_status_t peer;
  if (code < PCP_STATUS_CODE_COUNT_) {
    peer = pcp_make_status((pcp_status_code_t)code, "%s", message);
  } else {
    peer = pcp_make_status(PCP_STATUS_UNKNOWN, "peer status code %llu: %s",
                           (unsigned long long)code, message);
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
