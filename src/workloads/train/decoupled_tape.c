// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: vector clocks, the event tape (encoding, replay), the
// syncer state it rebuilds and the recovery plan (reference s.1.3).

#include <math.h>
#include <string.h>

#include "proto/proto.h"
#include "workloads/train/decoupled.h"

//===----------------------------------------------------------------------===//
// Vector clocks
//===----------------------------------------------------------------------===//

void pcp_decoupled_clock_initialize(pcp_decoupled_clock_t* out_clock) {
  out_clock->count = 0;
}

// Index of |node_id| or of where it would be inserted.
static uint32_t clock_find(const pcp_decoupled_clock_t* clock, uint16_t node_id,
                           bool* out_found) {
  uint32_t lo = 0;
  uint32_t hi = clock->count;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (clock->entries[mid].node_id < node_id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *out_found = lo < clock->count && clock->entries[lo].node_id == node_id;
  return lo;
}

uint64_t pcp_decoupled_clock_get(const pcp_decoupled_clock_t* clock,
                                 uint16_t node_id) {
  bool found = false;
  uint32_t i = clock_find(clock, node_id, &found);
  return found ? clock->entries[i].counter : 0;
}

static pcp_status_t clock_slot(pcp_decoupled_clock_t* clock, uint16_t node_id,
                               pcp_decoupled_clock_entry_t** out_entry) {
  bool found = false;
  uint32_t i = clock_find(clock, node_id, &found);
  if (!found) {
    if (clock->count == PCP_DECOUPLED_CLOCK_MAX_ENTRIES) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "vector clock full (%u nodes) adding node %u",
                             PCP_DECOUPLED_CLOCK_MAX_ENTRIES, node_id);
    }
    memmove(&clock->entries[i + 1], &clock->entries[i],
            sizeof(clock->entries[0]) * (clock->count - i));
    clock->entries[i].node_id = node_id;
    clock->entries[i].counter = 0;
    clock->count++;
  }
  *out_entry = &clock->entries[i];
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_clock_tick(pcp_decoupled_clock_t* clock,
                                      uint16_t node_id) {
  pcp_decoupled_clock_entry_t* e = NULL;
  PCP_RETURN_IF_ERROR_BARE(clock_slot(clock, node_id, &e));
  if (e->counter != UINT64_MAX)
    e->counter++;
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_clock_observe(pcp_decoupled_clock_t* clock,
                                         uint16_t node_id, uint64_t value) {
  pcp_decoupled_clock_entry_t* e = NULL;
  PCP_RETURN_IF_ERROR_BARE(clock_slot(clock, node_id, &e));
  if (value > e->counter)
    e->counter = value;
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_clock_merge(pcp_decoupled_clock_t* inout_clock,
                                       const pcp_decoupled_clock_t* other) {
  for (uint32_t i = 0; i < other->count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_clock_observe(
        inout_clock, other->entries[i].node_id, other->entries[i].counter));
  }
  return pcp_ok_status();
}

pcp_decoupled_clock_order_t pcp_decoupled_clock_compare(
    const pcp_decoupled_clock_t* a, const pcp_decoupled_clock_t* b) {
  bool a_less = false;  // some entry a < b
  bool b_less = false;
  uint32_t i = 0;
  uint32_t j = 0;
  // Merge walk over both sorted lists; a missing entry is 0.
  while (i < a->count || j < b->count) {
    uint64_t va = 0;
    uint64_t vb = 0;
    if (j >= b->count ||
        (i < a->count && a->entries[i].node_id < b->entries[j].node_id)) {
      va = a->entries[i++].counter;
    } else if (i >= a->count || b->entries[j].node_id < a->entries[i].node_id) {
      vb = b->entries[j++].counter;
    } else {
      va = a->entries[i++].counter;
      vb = b->entries[j++].counter;
    }
    if (va < vb)
      a_less = true;
    if (vb < va)
      b_less = true;
  }
  if (a_less && b_less)
    return PCP_DECOUPLED_CLOCK_CONCURRENT;
  if (a_less)
    return PCP_DECOUPLED_CLOCK_BEFORE;
  if (b_less)
    return PCP_DECOUPLED_CLOCK_AFTER;
  return PCP_DECOUPLED_CLOCK_EQUAL;
}

json_t* pcp_decoupled_clock_to_json(const pcp_decoupled_clock_t* clock) {
  json_t* array = json_array();
  if (array == NULL)
    return NULL;
  for (uint32_t i = 0; i < clock->count; ++i) {
    uint64_t counter = clock->entries[i].counter;
    json_t* entry = json_pack(
        "{s:I, s:I}", "node_id", (json_int_t)clock->entries[i].node_id,
        "counter",
        (json_int_t)(counter > (uint64_t)INT64_MAX ? INT64_MAX : counter));
    if (entry == NULL || json_array_append_new(array, entry) != 0) {
      json_decref(array);
      return NULL;
    }
  }
  return array;
}

pcp_status_t pcp_decoupled_clock_from_json(const json_t* json,
                                           pcp_decoupled_clock_t* out_clock) {
  pcp_decoupled_clock_initialize(out_clock);
  if (!json_is_array(json)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "vector_clock: want an array of {node_id, counter}");
  }
  size_t n = json_array_size(json);
  if (n > PCP_DECOUPLED_CLOCK_MAX_ENTRIES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "vector_clock: %zu entries, limit %u", n,
                           PCP_DECOUPLED_CLOCK_MAX_ENTRIES);
  }
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < n && status == NULL; ++i) {
    const json_t* e = json_array_get(json, i);
    const json_t* node = json_object_get(e, "node_id");
    const json_t* counter = json_object_get(e, "counter");
    if (!json_is_object(e)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "vector_clock[%zu]: want an object", i);
    } else if (!json_is_integer(node) || json_integer_value(node) < 0 ||
               json_integer_value(node) > UINT16_MAX) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "vector_clock[%zu].node_id: want an integer in "
                               "[0, 65535]",
                               i);
    } else if (!json_is_integer(counter) || json_integer_value(counter) < 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "vector_clock[%zu].counter: want an integer "
                               ">= 0",
                               i);
    } else {
      uint16_t id = (uint16_t)json_integer_value(node);
      bool found = false;
      (void)clock_find(out_clock, id, &found);
      if (found) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "vector_clock[%zu].node_id: node %u listed "
                                 "twice",
                                 i, id);
      } else {
        status = pcp_decoupled_clock_observe(
            out_clock, id, (uint64_t)json_integer_value(counter));
      }
    }
  }
  if (status != NULL)
    pcp_decoupled_clock_initialize(out_clock);
  return status;
}

//===----------------------------------------------------------------------===//
// Event tape
//===----------------------------------------------------------------------===//

void pcp_decoupled_tape_initialize(pcp_allocator_t allocator,
                                   pcp_decoupled_tape_t* out_tape) {
  memset(out_tape, 0, sizeof(*out_tape));
  out_tape->allocator = allocator;
}

static void event_free(pcp_allocator_t a, pcp_decoupled_event_t* e) {
  pcp_allocator_free(a, e->participants);
  pcp_allocator_free(a, e->clock_entries);
  e->participants = NULL;
  e->clock_entries = NULL;
}

void pcp_decoupled_tape_deinitialize(pcp_decoupled_tape_t* tape) {
  if (tape == NULL)
    return;
  for (uint64_t i = 0; i < tape->count; ++i) {
    event_free(tape->allocator, &tape->events[i]);
  }
  pcp_allocator_free(tape->allocator, tape->events);
  pcp_allocator_t a = tape->allocator;
  memset(tape, 0, sizeof(*tape));
  tape->allocator = a;
}

static bool kind_valid(int32_t kind) {
  return kind >= PCP_DECOUPLED_EVENT_FRAGMENT_SYNC &&
         kind <= PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE;
}

static pcp_status_t copy_array(pcp_allocator_t a, const void* src, size_t count,
                               size_t size, void** out) {
  *out = NULL;
  if (count == 0)
    return pcp_ok_status();
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(a, count * size, out));
  memcpy(*out, src, count * size);
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_tape_append(pcp_decoupled_tape_t* tape,
                                       const pcp_decoupled_event_t* event,
                                       uint64_t* out_id) {
  if (!kind_valid(event->kind)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "event tape: unknown kind %d", (int)event->kind);
  }
  if (event->participant_count > PCP_DECOUPLED_MAX_LEARNERS ||
      event->clock_entry_count > PCP_DECOUPLED_CLOCK_MAX_ENTRIES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "event tape: %u participants / %u clock entries, "
                           "limits %u / %u",
                           event->participant_count, event->clock_entry_count,
                           PCP_DECOUPLED_MAX_LEARNERS,
                           PCP_DECOUPLED_CLOCK_MAX_ENTRIES);
  }
  if (tape->count >= PCP_DECOUPLED_TAPE_MAX_EVENTS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "event tape full (%u records)",
                           PCP_DECOUPLED_TAPE_MAX_EVENTS);
  }
  if (tape->count == tape->capacity) {
    uint64_t capacity = tape->capacity ? tape->capacity * 2 : 16;
    void* events = tape->events;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_realloc(tape->allocator,
                              (size_t)capacity * sizeof(pcp_decoupled_event_t),
                              &events),
        "event tape growth");
    tape->events = events;
    tape->capacity = capacity;
  }
  pcp_decoupled_event_t copy = *event;
  copy.participants = NULL;
  copy.clock_entries = NULL;
  pcp_status_t status = copy_array(
      tape->allocator, event->participants, event->participant_count,
      sizeof(pcp_decoupled_participant_t), (void**)&copy.participants);
  if (status == NULL) {
    status = copy_array(
        tape->allocator, event->clock_entries, event->clock_entry_count,
        sizeof(pcp_decoupled_clock_entry_t), (void**)&copy.clock_entries);
  }
  if (status != NULL) {
    event_free(tape->allocator, &copy);
    return pcp_status_annotate_f(status, "event tape record");
  }
  copy.id = tape->count + 1;
  tape->events[tape->count++] = copy;
  if (out_id)
    *out_id = copy.id;
  return pcp_ok_status();
}

// Little-endian writer/reader over a bounded buffer.
typedef struct writer_t {
  uint8_t* data;
  size_t at;
} writer_t;

static void put_u8(writer_t* w, uint8_t v) {
  w->data[w->at++] = v;
}
static void put_u16(writer_t* w, uint16_t v) {
  for (int i = 0; i < 2; ++i) put_u8(w, (uint8_t)(v >> (8 * i)));
}
static void put_u32(writer_t* w, uint32_t v) {
  for (int i = 0; i < 4; ++i) put_u8(w, (uint8_t)(v >> (8 * i)));
}
static void put_u64(writer_t* w, uint64_t v) {
  for (int i = 0; i < 8; ++i) put_u8(w, (uint8_t)(v >> (8 * i)));
}
static void put_f64(writer_t* w, double v) {
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(bits));
  put_u64(w, bits);
}

typedef struct reader_t {
  const uint8_t* data;
  size_t length;
  size_t at;
} reader_t;

static bool get_bytes(reader_t* r, size_t n, const uint8_t** out) {
  if (r->length - r->at < n)
    return false;
  *out = r->data + r->at;
  r->at += n;
  return true;
}
static bool get_uint(reader_t* r, int bytes, uint64_t* out) {
  const uint8_t* p = NULL;
  if (!get_bytes(r, (size_t)bytes, &p))
    return false;
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
  *out = v;
  return true;
}

#define TAPE_MAGIC "PCPTAPE1"
#define TAPE_HEADER_BYTES 16u
#define RECORD_FIXED_BYTES (8u + 1u + 8u + 4u + 4u + 8u + 4u + 4u)
#define PARTICIPANT_BYTES (4u + 8u + 8u + 8u + 8u)
#define CLOCK_ENTRY_BYTES (2u + 8u)

static size_t record_payload_bytes(const pcp_decoupled_event_t* e) {
  return RECORD_FIXED_BYTES + (size_t)e->participant_count * PARTICIPANT_BYTES +
         (size_t)e->clock_entry_count * CLOCK_ENTRY_BYTES;
}

pcp_status_t pcp_decoupled_tape_encode(const pcp_decoupled_tape_t* tape,
                                       uint8_t** out_data,
                                       size_t* out_byte_length) {
  *out_data = NULL;
  *out_byte_length = 0;
  size_t total = TAPE_HEADER_BYTES;
  for (uint64_t i = 0; i < tape->count; ++i) {
    total += 8u + record_payload_bytes(&tape->events[i]);
    if (total > PCP_DECOUPLED_TAPE_MAX_BYTES) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "event tape encoding passes %zu bytes",
                             PCP_DECOUPLED_TAPE_MAX_BYTES);
    }
  }
  void* data = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_malloc(tape->allocator, total, &data),
                      "event tape encoding (%zu bytes)", total);
  writer_t w = {data, 0};
  memcpy(w.data, TAPE_MAGIC, 8);
  w.at = 8;
  put_u32(&w, PCP_DECOUPLED_TAPE_VERSION);
  put_u32(&w, pcp_proto_crc32c(w.data, 12));
  for (uint64_t i = 0; i < tape->count; ++i) {
    const pcp_decoupled_event_t* e = &tape->events[i];
    size_t payload = record_payload_bytes(e);
    put_u32(&w, (uint32_t)payload);
    size_t crc_at = w.at;
    put_u32(&w, 0);
    size_t start = w.at;
    put_u64(&w, e->id);
    put_u8(&w, (uint8_t)e->kind);
    put_u64(&w, e->syncer_step);
    put_u32(&w, e->fragment_id);
    put_u32(&w, e->learner_id);
    put_u64(&w, e->snapshot_id);
    put_u32(&w, e->participant_count);
    for (uint32_t p = 0; p < e->participant_count; ++p) {
      const pcp_decoupled_participant_t* pp = &e->participants[p];
      put_u32(&w, pp->learner_id);
      put_u64(&w, pp->learner_step);
      put_u64(&w, pp->steps_since);
      put_u64(&w, pp->tokens_since);
      put_f64(&w, pp->merge_weight);
    }
    put_u32(&w, e->clock_entry_count);
    for (uint32_t c = 0; c < e->clock_entry_count; ++c) {
      put_u16(&w, e->clock_entries[c].node_id);
      put_u64(&w, e->clock_entries[c].counter);
    }
    PCP_ASSERT(w.at - start == payload);
    writer_t crc = {w.data, crc_at};
    put_u32(&crc, pcp_proto_crc32c(w.data + start, payload));
  }
  PCP_ASSERT(w.at == total);
  *out_data = w.data;
  *out_byte_length = total;
  return pcp_ok_status();
}

// Parses one record payload into |out_event| (arrays from |a|).
static pcp_status_t decode_payload(pcp_allocator_t a, const uint8_t* payload,
                                   size_t length, uint64_t expected_id,
                                   pcp_decoupled_event_t* out_event) {
  memset(out_event, 0, sizeof(*out_event));
  reader_t r = {payload, length, 0};
  uint64_t v[7] = {0};
  static const int widths[7] = {8, 1, 8, 4, 4, 8, 4};
  for (int i = 0; i < 7; ++i) {
    if (!get_uint(&r, widths[i], &v[i])) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS, "record too short");
    }
  }
  if (v[0] != expected_id) {
    return pcp_make_status(
        PCP_STATUS_DATA_LOSS, "record id %llu, want %llu (ids out of sequence)",
        (unsigned long long)v[0], (unsigned long long)expected_id);
  }
  if (!kind_valid((int32_t)v[1])) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "unknown kind %u",
                           (unsigned)v[1]);
  }
  if (v[6] > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "%llu participants",
                           (unsigned long long)v[6]);
  }
  out_event->id = v[0];
  out_event->kind = (int32_t)v[1];
  out_event->syncer_step = v[2];
  out_event->fragment_id = (uint32_t)v[3];
  out_event->learner_id = (uint32_t)v[4];
  out_event->snapshot_id = v[5];
  out_event->participant_count = (uint32_t)v[6];
  if (out_event->participant_count > 0) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, out_event->participant_count * sizeof(pcp_decoupled_participant_t),
        (void**)&out_event->participants));
  }
  for (uint32_t p = 0; p < out_event->participant_count; ++p) {
    uint64_t f[5];
    static const int pw[5] = {4, 8, 8, 8, 8};
    for (int i = 0; i < 5; ++i) {
      if (!get_uint(&r, pw[i], &f[i])) {
        return pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "record too short (participant %u)", p);
      }
    }
    pcp_decoupled_participant_t* pp = &out_event->participants[p];
    pp->learner_id = (uint32_t)f[0];
    pp->learner_step = f[1];
    pp->steps_since = f[2];
    pp->tokens_since = f[3];
    memcpy(&pp->merge_weight, &f[4], sizeof(double));
  }
  uint64_t clock_count = 0;
  if (!get_uint(&r, 4, &clock_count) ||
      clock_count > PCP_DECOUPLED_CLOCK_MAX_ENTRIES) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "bad clock length");
  }
  out_event->clock_entry_count = (uint32_t)clock_count;
  if (clock_count > 0) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, clock_count * sizeof(pcp_decoupled_clock_entry_t),
        (void**)&out_event->clock_entries));
  }
  for (uint32_t c = 0; c < clock_count; ++c) {
    uint64_t node = 0;
    uint64_t counter = 0;
    if (!get_uint(&r, 2, &node) || !get_uint(&r, 8, &counter)) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "record too short (clock entry %u)", c);
    }
    if (c > 0 && out_event->clock_entries[c - 1].node_id >= node) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "clock entries not sorted by node");
    }
    out_event->clock_entries[c].node_id = (uint16_t)node;
    out_event->clock_entries[c].counter = counter;
  }
  if (r.at != length) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "%zu trailing bytes in the record", length - r.at);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_tape_decode(const uint8_t* data, size_t byte_length,
                                       pcp_decoupled_tape_t* inout_tape) {
  if (inout_tape->count != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "event tape decode into a non-empty tape");
  }
  if (byte_length > PCP_DECOUPLED_TAPE_MAX_BYTES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "event tape of %zu bytes, limit %zu", byte_length,
                           PCP_DECOUPLED_TAPE_MAX_BYTES);
  }
  reader_t r = {data, byte_length, 0};
  const uint8_t* header = NULL;
  if (!get_bytes(&r, TAPE_HEADER_BYTES, &header) ||
      memcmp(header, TAPE_MAGIC, 8) != 0) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "event tape: no PCPTAPE1 header (%zu bytes)",
                           byte_length);
  }
  reader_t hr = {header + 8, 8, 0};
  uint64_t version = 0;
  uint64_t header_crc = 0;
  (void)get_uint(&hr, 4, &version);
  (void)get_uint(&hr, 4, &header_crc);
  if (header_crc != pcp_proto_crc32c(header, 12)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "event tape: header CRC mismatch");
  }
  if (version != PCP_DECOUPLED_TAPE_VERSION) {
    return pcp_make_status(
        PCP_STATUS_INCOMPATIBLE, "event tape version %llu, this build reads %u",
        (unsigned long long)version, PCP_DECOUPLED_TAPE_VERSION);
  }
  pcp_status_t status = pcp_ok_status();
  while (r.at < r.length && status == NULL) {
    size_t record_at = r.at;
    uint64_t record_number = inout_tape->count + 1;
    uint64_t length = 0;
    uint64_t crc = 0;
    const uint8_t* payload = NULL;
    if (!get_uint(&r, 4, &length) || !get_uint(&r, 4, &crc) ||
        !get_bytes(&r, (size_t)length, &payload)) {
      status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "event tape truncated in record %llu at byte "
                               "%zu (%zu bytes left)",
                               (unsigned long long)record_number, record_at,
                               byte_length - record_at);
      break;
    }
    if (pcp_proto_crc32c(payload, (size_t)length) != crc) {
      status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "event tape record %llu at byte %zu: CRC "
                               "mismatch",
                               (unsigned long long)record_number, record_at);
      break;
    }
    pcp_decoupled_event_t event;
    status = decode_payload(inout_tape->allocator, payload, (size_t)length,
                            record_number, &event);
    if (status == NULL) {
      status = pcp_decoupled_tape_append(inout_tape, &event, NULL);
    }
    event_free(inout_tape->allocator, &event);
    if (status != NULL) {
      status =
          pcp_status_annotate_f(status, "event tape record %llu at byte %zu",
                                (unsigned long long)record_number, record_at);
    }
  }
  if (status != NULL)
    pcp_decoupled_tape_deinitialize(inout_tape);
  return status;
}

pcp_status_t pcp_decoupled_tape_replay_fragment_sync(
    pcp_decoupled_tape_t* tape, uint64_t syncer_step, uint32_t fragment_id,
    const pcp_decoupled_event_t** out_event) {
  *out_event = NULL;
  uint64_t i = tape->cursor;
  while (i < tape->count &&
         tape->events[i].kind != PCP_DECOUPLED_EVENT_FRAGMENT_SYNC) {
    ++i;
  }
  if (i >= tape->count) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "event tape: no fragment_sync left to replay for "
                           "step %llu",
                           (unsigned long long)syncer_step);
  }
  const pcp_decoupled_event_t* e = &tape->events[i];
  if (e->syncer_step != syncer_step || e->fragment_id != fragment_id) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "event tape: next sync is step %llu fragment %u, "
                           "the replay asked for step %llu fragment %u",
                           (unsigned long long)e->syncer_step, e->fragment_id,
                           (unsigned long long)syncer_step, fragment_id);
  }
  tape->cursor = i + 1;
  *out_event = e;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Syncer state
//===----------------------------------------------------------------------===//

pcp_status_t pcp_decoupled_syncer_state_initialize(
    pcp_allocator_t allocator, uint32_t fragment_count,
    pcp_decoupled_syncer_state_t* out_state) {
  memset(out_state, 0, sizeof(*out_state));
  if (fragment_count == 0 || fragment_count > PCP_DECOUPLED_MAX_FRAGMENTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "syncer state: %u fragments, want [1, %u]",
                           fragment_count, PCP_DECOUPLED_MAX_FRAGMENTS);
  }
  size_t bytes = sizeof(uint64_t) * fragment_count;
  void* versions = NULL;
  void* last = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, bytes, &versions),
                      "syncer state");
  pcp_status_t status = pcp_allocator_calloc(allocator, bytes, &last);
  if (status != NULL) {
    pcp_allocator_free(allocator, versions);
    return pcp_status_annotate_f(status, "syncer state");
  }
  out_state->allocator = allocator;
  out_state->fragment_count = fragment_count;
  out_state->fragment_versions = versions;
  out_state->fragment_last_step = last;
  pcp_decoupled_clock_initialize(&out_state->clock);
  return pcp_ok_status();
}

void pcp_decoupled_syncer_state_deinitialize(
    pcp_decoupled_syncer_state_t* state) {
  if (state == NULL)
    return;
  pcp_allocator_free(state->allocator, state->fragment_versions);
  pcp_allocator_free(state->allocator, state->fragment_last_step);
  state->fragment_versions = NULL;
  state->fragment_last_step = NULL;
}

pcp_status_t pcp_decoupled_syncer_record_sync(
    pcp_decoupled_syncer_state_t* state, pcp_decoupled_tape_t* tape,
    uint64_t syncer_step, uint32_t fragment_id,
    const pcp_decoupled_participant_t* participants,
    uint32_t participant_count) {
  if (fragment_id >= state->fragment_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment sync: fragment %u of %u", fragment_id,
                           state->fragment_count);
  }
  if (syncer_step <= state->global_step) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment sync at step %llu, global step is "
                           "already %llu",
                           (unsigned long long)syncer_step,
                           (unsigned long long)state->global_step);
  }
  if (participant_count > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment sync: %u participants", participant_count);
  }
  for (uint32_t p = 0; p < participant_count; ++p) {
    if (participants[p].learner_id >= PCP_DECOUPLED_MAX_LEARNERS) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT, "fragment sync: learner id %u, limit %u",
          participants[p].learner_id, PCP_DECOUPLED_MAX_LEARNERS);
    }
  }
  pcp_decoupled_clock_t clock = state->clock;
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_clock_tick(&clock, 0));
  pcp_decoupled_event_t event;
  memset(&event, 0, sizeof(event));
  event.kind = PCP_DECOUPLED_EVENT_FRAGMENT_SYNC;
  event.syncer_step = syncer_step;
  event.fragment_id = fragment_id;
  event.participants = (pcp_decoupled_participant_t*)participants;
  event.participant_count = participant_count;
  event.clock_entries = clock.entries;
  event.clock_entry_count = clock.count;
  // Append first: the tape is the record of truth, so state changes only
  // once the record exists.
  PCP_RETURN_IF_ERROR(pcp_decoupled_tape_append(tape, &event, NULL),
                      "fragment sync at step %llu",
                      (unsigned long long)syncer_step);
  state->clock = clock;
  state->global_step = syncer_step;
  state->fragment_versions[fragment_id]++;
  state->fragment_last_step[fragment_id] = syncer_step;
  state->participants_total += participant_count;
  for (uint32_t p = 0; p < participant_count; ++p) {
    pcp_decoupled_syncer_learner_t* l =
        &state->learners[participants[p].learner_id];
    l->status = PCP_DECOUPLED_LEARNER_ACTIVE;
    if (participants[p].learner_step > l->last_learner_step) {
      l->last_learner_step = participants[p].learner_step;
    }
  }
  return pcp_ok_status();
}

// The effect of one record other than a sync. Live and replay share it: its
// effect is plain assignment. The sync record (counters, steps, the clock)
// has separate live and replay code, so the replay test checks one against
// the other.
static pcp_status_t apply_other(pcp_decoupled_syncer_state_t* state,
                                const pcp_decoupled_event_t* e) {
  if (e->kind != PCP_DECOUPLED_EVENT_SNAPSHOT_MARKER &&
      e->learner_id >= PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "learner id %u",
                           e->learner_id);
  }
  pcp_decoupled_syncer_learner_t* l = e->learner_id < PCP_DECOUPLED_MAX_LEARNERS
                                          ? &state->learners[e->learner_id]
                                          : NULL;
  switch (e->kind) {
    case PCP_DECOUPLED_EVENT_LEARNER_APPLY:
      if (e->fragment_id >= state->fragment_count) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "learner_apply of fragment %u of %u",
                               e->fragment_id, state->fragment_count);
      }
      if (e->syncer_step > l->last_applied_step) {
        l->last_applied_step = e->syncer_step;
      }
      break;
    case PCP_DECOUPLED_EVENT_LEARNER_FAILURE:
      l->status = PCP_DECOUPLED_LEARNER_FAILED;
      break;
    case PCP_DECOUPLED_EVENT_LEARNER_RECOVERY:
      l->status = PCP_DECOUPLED_LEARNER_ACTIVE;
      if (e->syncer_step > l->last_applied_step) {
        l->last_applied_step = e->syncer_step;
      }
      break;
    case PCP_DECOUPLED_EVENT_SNAPSHOT_MARKER: {
      bool pending = false;
      for (uint32_t p = 0; p < e->participant_count; ++p) {
        if (e->participants[p].learner_step != 0)
          pending = true;
      }
      state->last_snapshot_id = e->snapshot_id;
      state->last_snapshot_step = e->syncer_step;
      state->snapshot_pending = pending;
      break;
    }
    case PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE:
      if (e->fragment_id >= state->fragment_count) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "in-flight pull of fragment %u of %u",
                               e->fragment_id, state->fragment_count);
      }
      state->in_flight_count++;
      break;
    default:
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "event kind %d is not a plain record",
                             (int)e->kind);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_syncer_record_event(
    pcp_decoupled_syncer_state_t* state, pcp_decoupled_tape_t* tape,
    const pcp_decoupled_event_t* event) {
  if (event->kind == PCP_DECOUPLED_EVENT_FRAGMENT_SYNC) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fragment syncs go through "
                           "pcp_decoupled_syncer_record_sync");
  }
  // Check on a copy, then append, then commit.
  pcp_decoupled_syncer_state_t scratch = *state;  // shares the arrays,
                                                  // which it does not touch
  PCP_RETURN_IF_ERROR_BARE(apply_other(&scratch, event));
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_tape_append(tape, event, NULL));
  *state = scratch;
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_syncer_state_replay(
    pcp_allocator_t allocator, uint32_t fragment_count,
    const pcp_decoupled_tape_t* tape, pcp_decoupled_syncer_state_t* out_state) {
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_syncer_state_initialize(
      allocator, fragment_count, out_state));
  pcp_status_t status = pcp_ok_status();
  for (uint64_t i = 0; i < tape->count && status == NULL; ++i) {
    const pcp_decoupled_event_t* e = &tape->events[i];
    if (e->kind != PCP_DECOUPLED_EVENT_FRAGMENT_SYNC) {
      pcp_status_t inner = apply_other(out_state, e);
      if (inner != NULL) {
        // A tape record that does not apply is damage, not a bad argument.
        status = pcp_make_status(
            PCP_STATUS_DATA_LOSS, "replay: record %llu does not apply: %s",
            (unsigned long long)e->id, pcp_status_message(inner));
        pcp_status_ignore(inner);
      }
      continue;
    }
    if (e->fragment_id >= fragment_count ||
        e->syncer_step <= out_state->global_step) {
      status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "replay: record %llu syncs fragment %u at step "
                               "%llu after step %llu (%u fragments)",
                               (unsigned long long)e->id, e->fragment_id,
                               (unsigned long long)e->syncer_step,
                               (unsigned long long)out_state->global_step,
                               fragment_count);
      break;
    }
    // The recorded clock must be the replayed one after node 0's tick.
    uint64_t syncer_ticks = 0;
    for (uint32_t c = 0; c < e->clock_entry_count; ++c) {
      if (e->clock_entries[c].node_id == 0) {
        syncer_ticks = e->clock_entries[c].counter;
      }
    }
    if (syncer_ticks != pcp_decoupled_clock_get(&out_state->clock, 0) + 1) {
      status = pcp_make_status(
          PCP_STATUS_DATA_LOSS,
          "replay: record %llu has syncer clock %llu, "
          "replay is at %llu",
          (unsigned long long)e->id, (unsigned long long)syncer_ticks,
          (unsigned long long)pcp_decoupled_clock_get(&out_state->clock, 0));
      break;
    }
    pcp_decoupled_clock_t recorded;
    pcp_decoupled_clock_initialize(&recorded);
    for (uint32_t c = 0; c < e->clock_entry_count && status == NULL; ++c) {
      status = pcp_decoupled_clock_observe(
          &recorded, e->clock_entries[c].node_id, e->clock_entries[c].counter);
    }
    if (status == NULL)
      status = pcp_decoupled_clock_merge(&out_state->clock, &recorded);
    if (status != NULL)
      break;
    out_state->global_step = e->syncer_step;
    out_state->fragment_versions[e->fragment_id] += 1;
    out_state->fragment_last_step[e->fragment_id] = e->syncer_step;
    out_state->participants_total += e->participant_count;
    for (uint32_t p = 0; p < e->participant_count; ++p) {
      uint32_t id = e->participants[p].learner_id;
      if (id >= PCP_DECOUPLED_MAX_LEARNERS) {
        status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                                 "replay: record %llu names learner %u",
                                 (unsigned long long)e->id, id);
        break;
      }
      out_state->learners[id].status = PCP_DECOUPLED_LEARNER_ACTIVE;
      if (e->participants[p].learner_step >
          out_state->learners[id].last_learner_step) {
        out_state->learners[id].last_learner_step =
            e->participants[p].learner_step;
      }
    }
  }
  if (status != NULL)
    pcp_decoupled_syncer_state_deinitialize(out_state);
  return status;
}

bool pcp_decoupled_syncer_state_equal(const pcp_decoupled_syncer_state_t* a,
                                      const pcp_decoupled_syncer_state_t* b) {
  if (a->fragment_count != b->fragment_count ||
      a->global_step != b->global_step ||
      a->participants_total != b->participants_total ||
      a->last_snapshot_id != b->last_snapshot_id ||
      a->last_snapshot_step != b->last_snapshot_step ||
      a->snapshot_pending != b->snapshot_pending ||
      a->in_flight_count != b->in_flight_count) {
    return false;
  }
  size_t bytes = sizeof(uint64_t) * a->fragment_count;
  if (memcmp(a->fragment_versions, b->fragment_versions, bytes) != 0 ||
      memcmp(a->fragment_last_step, b->fragment_last_step, bytes) != 0) {
    return false;
  }
  if (pcp_decoupled_clock_compare(&a->clock, &b->clock) !=
      PCP_DECOUPLED_CLOCK_EQUAL) {
    return false;
  }
  for (uint32_t i = 0; i < PCP_DECOUPLED_MAX_LEARNERS; ++i) {
    const pcp_decoupled_syncer_learner_t* la = &a->learners[i];
    const pcp_decoupled_syncer_learner_t* lb = &b->learners[i];
    if (la->status != lb->status ||
        la->last_applied_step != lb->last_applied_step ||
        la->last_learner_step != lb->last_learner_step) {
      return false;
    }
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Recovery plan
//===----------------------------------------------------------------------===//

bool pcp_decoupled_recovery_accepts(
    const pcp_decoupled_recovery_window_t* window, uint64_t step) {
  return step >= window->target_step;
}

bool pcp_decoupled_recovery_restart_required(
    const pcp_decoupled_recovery_window_t* window, uint64_t current_step) {
  uint64_t limit = window->started_step + window->max_recovery_syncer_steps;
  if (limit < window->started_step)
    return false;  // saturated: never
  return current_step > limit;
}

void pcp_decoupled_recovery_plan_deinitialize(
    pcp_decoupled_recovery_plan_t* plan) {
  if (plan == NULL)
    return;
  for (uint32_t i = 0; i < plan->action_count; ++i) {
    pcp_allocator_free(plan->allocator, plan->actions[i].fragments);
  }
  pcp_allocator_free(plan->allocator, plan->actions);
  plan->actions = NULL;
  plan->action_count = 0;
}

// Fragments whose newest sync is after |after_step| (all synced ones when
// 0 and |all|: every fragment).
static pcp_status_t fragments_after(pcp_allocator_t a,
                                    const pcp_decoupled_syncer_state_t* state,
                                    uint64_t after_step, bool all,
                                    pcp_decoupled_recovery_action_t* action) {
  uint32_t n = 0;
  for (uint32_t f = 0; f < state->fragment_count; ++f) {
    if (all || state->fragment_last_step[f] > after_step)
      ++n;
  }
  action->fragment_count = n;
  if (n == 0)
    return pcp_ok_status();
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(a, sizeof(uint32_t) * n,
                                                (void**)&action->fragments));
  n = 0;
  for (uint32_t f = 0; f < state->fragment_count; ++f) {
    if (all || state->fragment_last_step[f] > after_step) {
      action->fragments[n++] = f;
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_recovery_plan_initialize(
    pcp_allocator_t allocator, const pcp_decoupled_syncer_state_t* state,
    const pcp_decoupled_tape_t* tape, const pcp_decoupled_live_learner_t* live,
    uint32_t live_count, uint64_t max_recovery_syncer_steps,
    pcp_decoupled_recovery_plan_t* out_plan) {
  memset(out_plan, 0, sizeof(*out_plan));
  if (live_count > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "recovery: %u live learners, limit %u", live_count,
                           PCP_DECOUPLED_MAX_LEARNERS);
  }
  bool alive[PCP_DECOUPLED_MAX_LEARNERS];
  memset(alive, 0, sizeof(alive));
  uint64_t observed[PCP_DECOUPLED_MAX_LEARNERS];
  for (uint32_t i = 0; i < live_count; ++i) {
    uint32_t id = live[i].learner_id;
    if (id >= PCP_DECOUPLED_MAX_LEARNERS || alive[id]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "recovery: live learner id %u out of range or "
                             "listed twice",
                             id);
    }
    alive[id] = true;
    observed[id] = live[i].observed_global_step;
  }
  // Pulls recorded in flight after their fragment's newest sync: the sync
  // they belonged to never landed.
  bool repull[PCP_DECOUPLED_MAX_FRAGMENTS];
  memset(repull, 0, sizeof(bool) * state->fragment_count);
  uint32_t repull_count = 0;
  for (uint64_t i = 0; i < tape->count; ++i) {
    const pcp_decoupled_event_t* e = &tape->events[i];
    if (e->kind == PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE &&
        e->fragment_id < state->fragment_count &&
        e->syncer_step > state->fragment_last_step[e->fragment_id] &&
        !repull[e->fragment_id]) {
      repull[e->fragment_id] = true;
      ++repull_count;
    }
  }
  uint32_t failed_count = 0;
  for (uint32_t id = 0; id < PCP_DECOUPLED_MAX_LEARNERS; ++id) {
    if (state->learners[id].status == PCP_DECOUPLED_LEARNER_ACTIVE &&
        !alive[id]) {
      ++failed_count;
    }
  }
  uint32_t total = failed_count + repull_count + live_count;
  pcp_decoupled_recovery_plan_t plan;
  memset(&plan, 0, sizeof(plan));
  plan.allocator = allocator;
  plan.window.target_step = state->global_step;
  plan.window.started_step = state->global_step;
  plan.window.max_recovery_syncer_steps = max_recovery_syncer_steps;
  plan.snapshot_complete = !state->snapshot_pending;
  if (total > 0) {
    PCP_RETURN_IF_ERROR(
        pcp_allocator_calloc(allocator,
                             sizeof(pcp_decoupled_recovery_action_t) * total,
                             (void**)&plan.actions),
        "recovery plan");
  }
  for (uint32_t id = 0; id < PCP_DECOUPLED_MAX_LEARNERS; ++id) {
    if (state->learners[id].status == PCP_DECOUPLED_LEARNER_ACTIVE &&
        !alive[id]) {
      pcp_decoupled_recovery_action_t* a = &plan.actions[plan.action_count++];
      a->kind = PCP_DECOUPLED_RECOVERY_MARK_FAILED;
      a->learner_id = id;
    }
  }
  for (uint32_t f = 0; f < state->fragment_count; ++f) {
    if (!repull[f])
      continue;
    pcp_decoupled_recovery_action_t* a = &plan.actions[plan.action_count++];
    a->kind = PCP_DECOUPLED_RECOVERY_REPULL;
    a->fragment_id = f;
  }
  pcp_status_t status = pcp_ok_status();
  for (uint32_t id = 0; id < PCP_DECOUPLED_MAX_LEARNERS && status == NULL;
       ++id) {
    if (!alive[id])
      continue;
    pcp_decoupled_recovery_action_t* a = &plan.actions[plan.action_count++];
    a->learner_id = id;
    // A learner the tape marked FAILED, or never saw, gets everything: its
    // counters and copy are not to be trusted.
    bool known = state->learners[id].status == PCP_DECOUPLED_LEARNER_ACTIVE;
    uint64_t target = state->global_step;
    if (known && observed[id] >= target) {
      a->kind = PCP_DECOUPLED_RECOVERY_RESUME;
    } else if (known && target - observed[id] <= max_recovery_syncer_steps) {
      a->kind = PCP_DECOUPLED_RECOVERY_CATCH_UP;
      status = fragments_after(allocator, state, observed[id], false, a);
    } else {
      a->kind = PCP_DECOUPLED_RECOVERY_FULL_RESYNC;
      status = fragments_after(allocator, state, 0, true, a);
    }
  }
  if (status != NULL) {
    pcp_decoupled_recovery_plan_deinitialize(&plan);
    return pcp_status_annotate_f(status, "recovery plan");
  }
  *out_plan = plan;
  return pcp_ok_status();
}
