// SPDX-License-Identifier: Apache-2.0
//
// Replay fixtures and the review artifacts built from them: counterexample
// reports (human and JSON), smoke-replay import, and the CI artifact
// summary of report signatures.

#include <inttypes.h>
#include <string.h>

#include <jansson.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

pcp_status_t pcp_topology_json_append_string(pcp_string_builder_t* builder,
                                             const char* value) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "\""));
  for (const unsigned char* p = (const unsigned char*)(value ? value : ""); *p;
       ++p) {
    switch (*p) {
      case '"':
        PCP_RETURN_IF_ERROR_BARE(
            pcp_string_builder_append_cstring(builder, "\\\""));
        break;
      case '\\':
        PCP_RETURN_IF_ERROR_BARE(
            pcp_string_builder_append_cstring(builder, "\\\\"));
        break;
      case '\n':
        PCP_RETURN_IF_ERROR_BARE(
            pcp_string_builder_append_cstring(builder, "\\n"));
        break;
      default:
        if (*p < 0x20) {
          PCP_RETURN_IF_ERROR_BARE(
              pcp_string_builder_append_f(builder, "\\u%04x", *p));
        } else {
          PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
              builder, pcp_make_string_view((const char*)p, 1)));
        }
        break;
    }
  }
  return pcp_string_builder_append_cstring(builder, "\"");
}

pcp_status_t pcp_topology_json_append_events(pcp_string_builder_t* builder,
                                             const pcp_topology_event_t* events,
                                             size_t event_count) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "["));
  for (size_t i = 0; i < event_count; ++i) {
    const pcp_topology_event_t* e = &events[i];
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        builder, "%s{\"tag\":\"%s\",\"actor\":%u,\"peer\":", i ? "," : "",
        pcp_topology_event_tag_name(e->tag), (unsigned)e->actor));
    if (e->peer == PCP_TOPOLOGY_NO_NODE) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(builder, "null"));
    } else {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_f(builder, "%u", (unsigned)e->peer));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        builder, ",\"message_id\":%" PRIu32 "}", e->message_id));
  }
  return pcp_string_builder_append_cstring(builder, "]");
}

pcp_status_t pcp_topology_counterexample_format(
    const pcp_topology_counterexample_t* report,
    pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      builder,
      "topology simulator counterexample\n"
      "input_simplex: %s\n"
      "final_protocol_simplex: %s\n"
      "output_decision: %s\n"
      "violated_rule: %s\n"
      "seed: %" PRIu64
      "\n"
      "events: %zu\n",
      report->input_simplex ? report->input_simplex : "",
      report->final_protocol_simplex ? report->final_protocol_simplex : "",
      report->output_decision ? report->output_decision : "",
      report->violated_rule ? report->violated_rule : "", report->seed,
      report->event_count));
  for (size_t i = 0; i < report->event_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_event_format(i, report->events[i], builder));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_counterexample_format_json(
    const pcp_topology_counterexample_t* report,
    pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      builder,
      "{\"schema\":\"pcp.topology.replay.v1\",\"seed\":%" PRIu64
      ",\"input_simplex\":",
      report->seed));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_string(builder, report->input_simplex));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      builder, ",\"final_protocol_simplex\":"));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_string(builder, report->final_protocol_simplex));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(builder, ",\"output_decision\":"));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_string(builder, report->output_decision));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(builder, ",\"violated_rule\":"));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_string(builder, report->violated_rule));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(builder, ",\"events\":"));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_json_append_events(
      builder, report->events, report->event_count));
  return pcp_string_builder_append_cstring(builder, "}");
}

//===----------------------------------------------------------------------===//
// Smoke replay import
//===----------------------------------------------------------------------===//

static pcp_status_t copy_string(pcp_allocator_t allocator, const char* value,
                                char** out_copy) {
  size_t length = strlen(value);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, length + 1, (void**)out_copy));
  memcpy(*out_copy, value, length + 1);
  return pcp_ok_status();
}

static pcp_status_t json_required_string(json_t* root, const char* key,
                                         const char** out_value) {
  json_t* value = json_object_get(root, key);
  if (!json_is_string(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: '%s' must be a string", key);
  }
  *out_value = json_string_value(value);
  return pcp_ok_status();
}

static pcp_status_t json_event_u64(json_t* event, size_t index, const char* key,
                                   uint64_t max_value, uint64_t* out_value) {
  json_t* value = json_object_get(event, key);
  if (!json_is_integer(value) || json_integer_value(value) < 0 ||
      (uint64_t)json_integer_value(value) > max_value) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "smoke replay: events[%zu].%s must be an integer in [0, %" PRIu64 "]",
        index, key, max_value);
  }
  *out_value = (uint64_t)json_integer_value(value);
  return pcp_ok_status();
}

static pcp_status_t smoke_replay_parse_root(json_t* root, size_t max_events,
                                            pcp_allocator_t allocator,
                                            pcp_topology_smoke_replay_t* out) {
  if (!json_is_object(root)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: top level must be an object");
  }
  const char* schema = NULL;
  PCP_RETURN_IF_ERROR_BARE(json_required_string(root, "schema", &schema));
  if (strcmp(schema, "pcp.topology.smoke_replay.v1") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: unknown schema '%s'", schema);
  }
  const char *trace_id = NULL, *input = NULL, *output = NULL;
  PCP_RETURN_IF_ERROR_BARE(json_required_string(root, "trace_id", &trace_id));
  PCP_RETURN_IF_ERROR_BARE(json_required_string(root, "input", &input));
  PCP_RETURN_IF_ERROR_BARE(json_required_string(root, "output", &output));
  json_t* seed = json_object_get(root, "seed");
  if (!json_is_integer(seed) || json_integer_value(seed) < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: 'seed' must be an integer >= 0");
  }
  json_t* events = json_object_get(root, "events");
  if (!json_is_array(events)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: 'events' must be an array");
  }
  if (json_array_size(events) > max_events) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "smoke replay: %zu events exceed the bound %zu",
                           json_array_size(events), max_events);
  }
  PCP_RETURN_IF_ERROR_BARE(copy_string(allocator, trace_id, &out->trace_id));
  PCP_RETURN_IF_ERROR_BARE(copy_string(allocator, input, &out->input));
  PCP_RETURN_IF_ERROR_BARE(copy_string(allocator, output, &out->output));
  out->trace.seed = (uint64_t)json_integer_value(seed);

  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(pcp_topology_ascii_seed("smoke_xi"), &hasher);
  pcp_topology_hasher_update_le(&hasher, out->trace.seed, 8);
  pcp_topology_hasher_update(&hasher, input, strlen(input) + 1);
  pcp_topology_hasher_update(&hasher, output, strlen(output) + 1);
  for (size_t i = 0; i < json_array_size(events); ++i) {
    json_t* item = json_array_get(events, i);
    if (!json_is_object(item)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "smoke replay: events[%zu] must be an object", i);
    }
    json_t* tag_value = json_object_get(item, "tag");
    pcp_topology_event_tag_t tag;
    if (!json_is_string(tag_value) ||
        !pcp_topology_event_tag_parse(
            pcp_make_cstring_view(json_string_value(tag_value)), &tag)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "smoke replay: events[%zu].tag is not a known "
                             "event tag",
                             i);
    }
    uint64_t actor = 0, message_id = 0, peer = PCP_TOPOLOGY_NO_NODE;
    PCP_RETURN_IF_ERROR_BARE(json_event_u64(item, i, "actor", 0xFFFEu, &actor));
    PCP_RETURN_IF_ERROR_BARE(
        json_event_u64(item, i, "message_id", UINT32_MAX, &message_id));
    // peer is required and may be null: a missing key is an error so that
    // a typo cannot silently turn a message into a local event.
    json_t* peer_value = json_object_get(item, "peer");
    if (peer_value == NULL) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "smoke replay: events[%zu].peer is required "
                             "(null or an integer)",
                             i);
    }
    if (!json_is_null(peer_value)) {
      PCP_RETURN_IF_ERROR_BARE(json_event_u64(item, i, "peer", 0xFFFEu, &peer));
    }
    pcp_topology_event_t event = {(uint8_t)tag, (uint16_t)actor, (uint16_t)peer,
                                  (uint32_t)message_id};
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_trace_append(&out->trace, event));
    pcp_topology_hasher_update_le(&hasher, pcp_topology_event_hash(event), 8);
  }
  pcp_topology_snapshot_t snapshot;
  memset(&snapshot, 0, sizeof(snapshot));
  snapshot.steps = (uint32_t)out->trace.event_count;
  snapshot.checksum = pcp_topology_hasher_finish(&hasher);
  pcp_topology_trace_finish(&out->trace, &snapshot);
  return pcp_ok_status();
}

pcp_status_t pcp_topology_smoke_replay_parse(
    pcp_string_view_t json_text, size_t max_events, pcp_allocator_t allocator,
    pcp_topology_smoke_replay_t* out_replay) {
  memset(out_replay, 0, sizeof(*out_replay));
  pcp_topology_trace_initialize(allocator, 0, &out_replay->trace);
  json_error_t error;
  json_t* root = json_loadb(json_text.data, json_text.size,
                            JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "smoke replay: invalid JSON at line %d: %s",
                           error.line, error.text);
  }
  pcp_status_t status =
      smoke_replay_parse_root(root, max_events, allocator, out_replay);
  json_decref(root);
  if (status)
    pcp_topology_smoke_replay_deinitialize(out_replay);
  return status;
}

void pcp_topology_smoke_replay_deinitialize(
    pcp_topology_smoke_replay_t* replay) {
  pcp_allocator_t allocator = replay->trace.allocator;
  if (replay->trace_id)
    pcp_allocator_free(allocator, replay->trace_id);
  if (replay->input)
    pcp_allocator_free(allocator, replay->input);
  if (replay->output)
    pcp_allocator_free(allocator, replay->output);
  replay->trace_id = replay->input = replay->output = NULL;
  pcp_topology_trace_deinitialize(&replay->trace);
}

//===----------------------------------------------------------------------===//
// CI artifact summary
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_artifact_summary_format(
    const pcp_topology_artifact_t* artifacts, size_t artifact_count,
    pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      builder, "pcp topology artifact summary: %zu item(s)\n", artifact_count));
  for (size_t i = 0; i < artifact_count; ++i) {
    const pcp_topology_artifact_t* a = &artifacts[i];
    const char* change = "unchanged";
    if (a->has_before && a->has_after) {
      change = a->before == a->after ? "unchanged" : "changed";
    } else if (a->has_after) {
      change = "added";
    } else if (a->has_before) {
      change = "removed";
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(builder, "- %s: %s", a->name, change));
    if (a->has_before) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_f(builder, " before=%" PRIx64, a->before));
    }
    if (a->has_after) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_f(builder, " after=%" PRIx64, a->after));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "\n"));
  }
  return pcp_ok_status();
}
