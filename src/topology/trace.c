// SPDX-License-Identifier: Apache-2.0
//
// Events, snapshots and traces: the replayable record of one simulated run,
// with its text form (which is also the replay fixture format).

#include <inttypes.h>
#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

static const char* const kEventTagNames[PCP_TOPOLOGY_EVENT_TAG_COUNT_] = {
    "noop",          "send",
    "deliver",       "drop",
    "duplicate",     "timeout",
    "crash",         "restart",
    "join",          "leave",
    "cancel",        "heartbeat",
    "health_update", "local_step_complete",
    "lease_reserve", "lease_commit",
    "lease_release", "lease_expire",
};

static const char* const kFailureNames[PCP_TOPOLOGY_FAILURE_COUNT_] = {
    "none",           "invalid_actor",
    "invalid_peer",   "invalid_delivery",
    "duplicate_send", "event_on_crashed_node",
};

const char* pcp_topology_event_tag_name(pcp_topology_event_tag_t tag) {
  if ((unsigned)tag >= PCP_TOPOLOGY_EVENT_TAG_COUNT_)
    return "?";
  return kEventTagNames[tag];
}

bool pcp_topology_event_tag_parse(pcp_string_view_t name,
                                  pcp_topology_event_tag_t* out_tag) {
  for (int i = 0; i < PCP_TOPOLOGY_EVENT_TAG_COUNT_; ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kEventTagNames[i]))) {
      *out_tag = (pcp_topology_event_tag_t)i;
      return true;
    }
  }
  return false;
}

const char* pcp_topology_failure_name(pcp_topology_failure_t failure) {
  if ((unsigned)failure >= PCP_TOPOLOGY_FAILURE_COUNT_)
    return "?";
  return kFailureNames[failure];
}

bool pcp_topology_failure_parse(pcp_string_view_t name,
                                pcp_topology_failure_t* out_failure) {
  for (int i = 0; i < PCP_TOPOLOGY_FAILURE_COUNT_; ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kFailureNames[i]))) {
      *out_failure = (pcp_topology_failure_t)i;
      return true;
    }
  }
  return false;
}

bool pcp_topology_event_tag_is_execution_vocabulary(
    pcp_topology_event_tag_t tag) {
  // noop carries no behaviour and health_update is a monitoring signal that
  // no coordination rule reads; every other tag drives some protocol model.
  return (unsigned)tag < PCP_TOPOLOGY_EVENT_TAG_COUNT_ &&
         tag != PCP_TOPOLOGY_EVENT_NOOP &&
         tag != PCP_TOPOLOGY_EVENT_HEALTH_UPDATE;
}

uint64_t pcp_topology_event_hash(pcp_topology_event_t event) {
  // Whole field values, not bytes: this is the upstream definition, and it
  // keeps the hash independent of struct padding.
  const uint64_t fields[4] = {event.tag, event.actor, event.peer,
                              event.message_id};
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < 4; ++i) {
    h = (h ^ fields[i]) * 1099511628211ull;
  }
  return h;
}

pcp_status_t pcp_topology_event_format(size_t index, pcp_topology_event_t event,
                                       pcp_string_builder_t* builder) {
  const char* tag = pcp_topology_event_tag_name(event.tag);
  if (event.peer == PCP_TOPOLOGY_NO_NODE) {
    return pcp_string_builder_append_f(
        builder, "%zu: %s actor=%u peer=- message=%" PRIu32 "\n", index, tag,
        (unsigned)event.actor, event.message_id);
  }
  return pcp_string_builder_append_f(
      builder, "%zu: %s actor=%u peer=%u message=%" PRIu32 "\n", index, tag,
      (unsigned)event.actor, (unsigned)event.peer, event.message_id);
}

bool pcp_topology_events_independent(pcp_topology_event_t a,
                                     pcp_topology_event_t b) {
  if (a.message_id != 0 && a.message_id == b.message_id)
    return false;
  // Either event touching a node the other acts on or talks to makes them
  // dependent. PCP_TOPOLOGY_NO_NODE never matches a real actor.
  if (a.actor == b.actor)
    return false;
  if (a.peer != PCP_TOPOLOGY_NO_NODE &&
      (a.peer == b.actor || a.peer == b.peer)) {
    return false;
  }
  if (b.peer != PCP_TOPOLOGY_NO_NODE && b.peer == a.actor)
    return false;
  return true;
}

static uint64_t partial_order_key(pcp_topology_event_t e) {
  return (((uint64_t)e.tag * 257u + e.actor) * 257u + e.peer) * 4294967291ull +
         e.message_id;
}

bool pcp_topology_partial_order_allows(const pcp_topology_event_t* prefix,
                                       size_t prefix_count,
                                       pcp_topology_event_t next) {
  if (prefix_count == 0)
    return true;
  pcp_topology_event_t last = prefix[prefix_count - 1];
  if (!pcp_topology_events_independent(last, next))
    return true;
  return partial_order_key(last) <= partial_order_key(next);
}

uint64_t pcp_topology_snapshot_hash(const pcp_topology_snapshot_t* snapshot) {
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(pcp_topology_ascii_seed("snapshot"), &hasher);
  pcp_topology_hasher_update_le(&hasher, snapshot->steps, 4);
  pcp_topology_hasher_update_le(&hasher, snapshot->node_count, 1);
  pcp_topology_hasher_update_le(&hasher, snapshot->online_mask, 8);
  pcp_topology_hasher_update_le(&hasher, snapshot->pending, 4);
  pcp_topology_hasher_update_le(&hasher, snapshot->delivered, 4);
  pcp_topology_hasher_update_le(&hasher, snapshot->checksum, 8);
  pcp_topology_hasher_update_le(&hasher, snapshot->failure, 1);
  return pcp_topology_hasher_finish(&hasher);
}

pcp_status_t pcp_topology_snapshot_format(
    const pcp_topology_snapshot_t* snapshot, pcp_string_builder_t* builder) {
  return pcp_string_builder_append_f(
      builder,
      "final steps=%" PRIu32 " nodes=%u online_mask=%" PRIu64
      " pending=%" PRIu32 " delivered=%" PRIu32 " checksum=%" PRIu64
      " failure=%s\n",
      snapshot->steps, (unsigned)snapshot->node_count, snapshot->online_mask,
      snapshot->pending, snapshot->delivered, snapshot->checksum,
      pcp_topology_failure_name(snapshot->failure));
}

void pcp_topology_trace_initialize(pcp_allocator_t allocator, uint64_t seed,
                                   pcp_topology_trace_t* out_trace) {
  memset(out_trace, 0, sizeof(*out_trace));
  out_trace->allocator = allocator;
  out_trace->seed = seed;
}

void pcp_topology_trace_deinitialize(pcp_topology_trace_t* trace) {
  if (trace->events)
    pcp_allocator_free(trace->allocator, trace->events);
  trace->events = NULL;
  trace->event_count = 0;
  trace->event_capacity = 0;
}

pcp_status_t pcp_topology_trace_append(pcp_topology_trace_t* trace,
                                       pcp_topology_event_t event) {
  if (trace->event_count >= PCP_TOPOLOGY_TRACE_MAX_EVENTS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "trace exceeds %u events",
                           PCP_TOPOLOGY_TRACE_MAX_EVENTS);
  }
  if (trace->event_count == trace->event_capacity) {
    size_t capacity = trace->event_capacity ? trace->event_capacity * 2 : 8;
    void* events = trace->events;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_realloc(trace->allocator,
                              capacity * sizeof(pcp_topology_event_t), &events),
        "growing trace");
    trace->events = events;
    trace->event_capacity = capacity;
  }
  trace->events[trace->event_count++] = event;
  return pcp_ok_status();
}

void pcp_topology_trace_finish(pcp_topology_trace_t* trace,
                               const pcp_topology_snapshot_t* snapshot) {
  trace->final_snapshot = *snapshot;
}

pcp_status_t pcp_topology_trace_format(const pcp_topology_trace_t* trace,
                                       pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR(
      pcp_string_builder_append_f(
          builder, "topology-simulator-trace v1 seed=%" PRIu64 " events=%zu\n",
          trace->seed, trace->event_count),
      "trace header");
  for (size_t i = 0; i < trace->event_count; ++i) {
    PCP_RETURN_IF_ERROR(pcp_topology_event_format(i, trace->events[i], builder),
                        "event");
  }
  return pcp_topology_snapshot_format(&trace->final_snapshot, builder);
}

//===----------------------------------------------------------------------===//
// Parsing the text form
//===----------------------------------------------------------------------===//

// Finds "key=" among space-separated words of |line| and returns its value.
static bool find_field(pcp_string_view_t line, const char* key,
                       pcp_string_view_t* out_value) {
  size_t key_length = strlen(key);
  pcp_string_view_t rest = line;
  while (rest.size > 0) {
    pcp_string_view_t word, tail;
    if (!pcp_string_view_split(rest, ' ', &word, &tail)) {
      word = rest;
      tail = pcp_make_string_view(rest.data + rest.size, 0);
    }
    if (word.size > key_length && memcmp(word.data, key, key_length) == 0 &&
        word.data[key_length] == '=') {
      *out_value = pcp_make_string_view(word.data + key_length + 1,
                                        word.size - key_length - 1);
      return true;
    }
    rest = tail;
  }
  return false;
}

static pcp_status_t parse_u64_field(pcp_string_view_t line, size_t line_number,
                                    const char* key, uint64_t max_value,
                                    uint64_t* out_value) {
  pcp_string_view_t value;
  if (!find_field(line, key, &value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: missing '%s='", line_number, key);
  }
  if (!pcp_string_view_parse_uint64(value, out_value) ||
      *out_value > max_value) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: '%s' is not a number <= %" PRIu64,
                           line_number, key, max_value);
  }
  return pcp_ok_status();
}

static pcp_status_t parse_event_line(pcp_string_view_t line, size_t line_number,
                                     size_t index,
                                     pcp_topology_event_t* out_event) {
  pcp_string_view_t head, tail;
  if (!pcp_string_view_split(line, ':', &head, &tail)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: expected '<index>: <tag> ...'",
                           line_number);
  }
  uint64_t parsed_index = 0;
  if (!pcp_string_view_parse_uint64(head, &parsed_index) ||
      parsed_index != index) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: expected event index %zu",
                           line_number, index);
  }
  tail = pcp_string_view_trim(tail);
  pcp_string_view_t tag_name, fields;
  if (!pcp_string_view_split(tail, ' ', &tag_name, &fields)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: event has no fields", line_number);
  }
  pcp_topology_event_tag_t tag;
  if (!pcp_topology_event_tag_parse(tag_name, &tag)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: unknown event tag '%.*s'",
                           line_number, (int)tag_name.size, tag_name.data);
  }
  uint64_t actor = 0, message = 0;
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(fields, line_number, "actor", 0xFFFEu, &actor));
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(fields, line_number, "message", UINT32_MAX, &message));
  pcp_string_view_t peer_text;
  uint64_t peer = PCP_TOPOLOGY_NO_NODE;
  if (!find_field(fields, "peer", &peer_text)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: missing 'peer='", line_number);
  }
  if (!pcp_string_view_equal(peer_text, pcp_make_cstring_view("-"))) {
    PCP_RETURN_IF_ERROR_BARE(
        parse_u64_field(fields, line_number, "peer", 0xFFFEu, &peer));
  }
  out_event->tag = (uint8_t)tag;
  out_event->actor = (uint16_t)actor;
  out_event->peer = (uint16_t)peer;
  out_event->message_id = (uint32_t)message;
  return pcp_ok_status();
}

static pcp_status_t parse_snapshot_line(pcp_string_view_t line,
                                        size_t line_number,
                                        pcp_topology_snapshot_t* out) {
  uint64_t value = 0;
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(line, line_number, "steps", UINT32_MAX, &value));
  out->steps = (uint32_t)value;
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(line, line_number, "nodes", UINT8_MAX, &value));
  out->node_count = (uint8_t)value;
  PCP_RETURN_IF_ERROR_BARE(parse_u64_field(line, line_number, "online_mask",
                                           UINT64_MAX, &out->online_mask));
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(line, line_number, "pending", UINT32_MAX, &value));
  out->pending = (uint32_t)value;
  PCP_RETURN_IF_ERROR_BARE(
      parse_u64_field(line, line_number, "delivered", UINT32_MAX, &value));
  out->delivered = (uint32_t)value;
  PCP_RETURN_IF_ERROR_BARE(parse_u64_field(line, line_number, "checksum",
                                           UINT64_MAX, &out->checksum));
  pcp_string_view_t failure_text;
  pcp_topology_failure_t failure;
  if (!find_field(line, "failure", &failure_text) ||
      !pcp_topology_failure_parse(failure_text, &failure)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace line %zu: missing or unknown 'failure='",
                           line_number);
  }
  out->failure = (uint8_t)failure;
  return pcp_ok_status();
}

static pcp_status_t trace_parse_into(pcp_string_view_t text,
                                     pcp_topology_trace_t* trace) {
  pcp_string_view_t rest = text;
  size_t line_number = 0;
  uint64_t declared_events = 0;
  bool have_header = false;
  bool have_snapshot = false;
  while (rest.size > 0) {
    pcp_string_view_t line, tail;
    if (!pcp_string_view_split(rest, '\n', &line, &tail)) {
      line = rest;
      tail = pcp_make_string_view(rest.data + rest.size, 0);
    }
    rest = tail;
    ++line_number;
    line = pcp_string_view_trim(line);
    if (line.size == 0)
      continue;
    if (have_snapshot) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "trace line %zu: text after the final line",
                             line_number);
    }
    if (!have_header) {
      if (!pcp_string_view_starts_with(
              line, pcp_make_cstring_view("topology-simulator-trace v1 "))) {
        return pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "trace line %zu: expected 'topology-simulator-trace v1' header",
            line_number);
      }
      PCP_RETURN_IF_ERROR_BARE(
          parse_u64_field(line, line_number, "seed", UINT64_MAX, &trace->seed));
      PCP_RETURN_IF_ERROR_BARE(parse_u64_field(line, line_number, "events",
                                               PCP_TOPOLOGY_TRACE_MAX_EVENTS,
                                               &declared_events));
      have_header = true;
      continue;
    }
    if (pcp_string_view_starts_with(line, pcp_make_cstring_view("final "))) {
      PCP_RETURN_IF_ERROR_BARE(
          parse_snapshot_line(line, line_number, &trace->final_snapshot));
      have_snapshot = true;
      continue;
    }
    pcp_topology_event_t event;
    PCP_RETURN_IF_ERROR_BARE(
        parse_event_line(line, line_number, trace->event_count, &event));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_trace_append(trace, event));
  }
  if (!have_header) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "trace text is empty");
  }
  if (!have_snapshot) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace has no 'final ...' line");
  }
  if (declared_events != trace->event_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "trace header says %" PRIu64 " events, found %zu",
                           declared_events, trace->event_count);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_trace_parse(pcp_string_view_t text,
                                      pcp_allocator_t allocator,
                                      pcp_topology_trace_t* out_trace) {
  pcp_topology_trace_initialize(allocator, 0, out_trace);
  pcp_status_t status = trace_parse_into(text, out_trace);
  if (status)
    pcp_topology_trace_deinitialize(out_trace);
  return status;
}
