// SPDX-License-Identifier: Apache-2.0
// Knowledge-graph replication shared by the gateway and the hub (see
// replication_impl.h).

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services.h"

void pcp_services_replication_policy_default(
    const char* namespace_id, pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy) {
  memset(out_policy, 0, sizeof(*out_policy));
  snprintf(out_policy->namespace_id, sizeof(out_policy->namespace_id), "%s",
           namespace_id);
  out_policy->default_visibility = default_visibility;
}

void pcp_services_replication_policy_lookup(
    const pcp_store_graph_policy_list_t* policies, const char* namespace_id,
    pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy) {
  size_t low = 0, high = policies ? policies->count : 0;
  while (low < high) {
    size_t mid = low + (high - low) / 2;
    int order = strcmp(policies->items[mid].namespace_id, namespace_id);
    if (order == 0) {
      *out_policy = policies->items[mid];
      return;
    }
    if (order < 0) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  pcp_services_replication_policy_default(namespace_id, default_visibility,
                                          out_policy);
}

bool pcp_services_replication_visible_globally(
    const pcp_store_graph_policy_t* policy, pcp_store_visibility_t visibility,
    bool is_observation) {
  if (visibility != PCP_STORE_VISIBILITY_SHARED &&
      visibility != PCP_STORE_VISIBILITY_GLOBAL) {
    return false;
  }
  if (!policy) {
    return true;
  }
  return policy->allow_global_replication &&
         (!is_observation || policy->allow_raw_payload_export);
}

bool pcp_services_replication_eligible(const pcp_store_graph_policy_t* policy,
                                       const pcp_store_mutation_t* mutation) {
  if (mutation->mutation_type == PCP_STORE_MUTATION_POLICY_UPDATE) {
    return false;
  }
  return pcp_services_replication_visible_globally(
      policy, mutation->visibility,
      mutation->mutation_type == PCP_STORE_MUTATION_APPEND_OBSERVATION);
}

json_t* pcp_services_replication_policy_json(
    const pcp_store_graph_policy_t* policy) {
  return json_pack("{s:s, s:s, s:b, s:b, s:I}", "namespace_id",
                   policy->namespace_id, "default_visibility",
                   pcp_store_visibility_name(policy->default_visibility),
                   "allow_global_replication", policy->allow_global_replication,
                   "allow_raw_payload_export", policy->allow_raw_payload_export,
                   "updated_at_ms",
                   (json_int_t)(policy->updated_at_ns / 1000000));
}

json_t* pcp_services_replication_policy_payload(
    const pcp_store_graph_policy_t* policy) {
  return json_pack("{s:s, s:b, s:b}", "default_visibility",
                   pcp_store_visibility_name(policy->default_visibility),
                   "allow_global_replication", policy->allow_global_replication,
                   "allow_raw_payload_export",
                   policy->allow_raw_payload_export);
}

pcp_status_t pcp_services_replication_policy_update(
    json_t* update, bool allow_snapshot_keys,
    pcp_store_graph_policy_t* inout_policy) {
  if (!json_is_object(update)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a policy must be a JSON object");
  }
  const char* key;
  json_t* value;
  json_object_foreach(update, key, value) {
    if (strcmp(key, "default_visibility") == 0) {
      pcp_store_visibility_t visibility;
      if (!json_is_string(value) ||
          !pcp_store_visibility_parse(
              pcp_make_cstring_view(json_string_value(value)), &visibility)) {
        return pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "field 'default_visibility' must be one of local, shared, global");
      }
      inout_policy->default_visibility = visibility;
    } else if (strcmp(key, "allow_global_replication") == 0 ||
               strcmp(key, "allow_raw_payload_export") == 0) {
      if (!json_is_boolean(value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "field '%s' must be a boolean", key);
      }
      if (key[6] == 'g') {  // allow_global_replication
        inout_policy->allow_global_replication = json_is_true(value);
      } else {
        inout_policy->allow_raw_payload_export = json_is_true(value);
      }
    } else if (allow_snapshot_keys && (strcmp(key, "namespace_id") == 0 ||
                                       strcmp(key, "updated_at_ms") == 0)) {
      continue;
    } else {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "unknown policy field '%s' (expected "
                             "default_visibility, allow_global_replication, "
                             "allow_raw_payload_export)",
                             key);
    }
  }
  return pcp_ok_status();
}

json_t* pcp_services_replication_item_json(const pcp_store_mutation_t* m) {
  // An absent payload or provenance reads "{}"; only json_dumps allocates.
  char* payload = m->payload ? json_dumps(m->payload, JSON_COMPACT) : NULL;
  char* provenance =
      m->provenance ? json_dumps(m->provenance, JSON_COMPACT) : NULL;
  json_t* item = NULL;
  if ((payload || !m->payload) && (provenance || !m->provenance)) {
    item = json_pack(
        "{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I}", "sequence_no",
        (json_int_t)m->sequence_no, "mutation_id", m->mutation_id,
        "namespace_id", m->namespace_id, "mutation_type",
        pcp_store_mutation_type_name(m->mutation_type), "target_id",
        m->target_id, "payload_json", payload ? payload : "{}", "visibility",
        pcp_store_visibility_name(m->visibility), "provenance_json",
        provenance ? provenance : "{}", "timestamp_ns",
        (json_int_t)m->timestamp_ns);
  }
  pcp_libc_free(payload);
  pcp_libc_free(provenance);
  return item;
}

// Copies string |key| of |object| into |buffer|; required and non-empty.
static pcp_status_t string_copy(json_t* object, const char* key, char* buffer,
                                size_t capacity) {
  json_t* v = json_object_get(object, key);
  if (!json_is_string(v) || json_string_length(v) == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be a non-empty string", key);
  }
  if (json_string_length(v) >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' is longer than %zu bytes", key,
                           capacity - 1);
  }
  memcpy(buffer, json_string_value(v), json_string_length(v) + 1);
  return pcp_ok_status();
}

// Parses the JSON text of |key| into an object (new reference).
static pcp_status_t json_text_parse(json_t* object, const char* key,
                                    json_t** out_value) {
  *out_value = NULL;
  json_t* v = json_object_get(object, key);
  if (!json_is_string(v)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be a string holding JSON", key);
  }
  json_error_t error;
  json_t* parsed = json_loadb(json_string_value(v), json_string_length(v),
                              JSON_REJECT_DUPLICATES, &error);
  if (!json_is_object(parsed)) {
    json_decref(parsed);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must hold a JSON object", key);
  }
  *out_value = parsed;
  return pcp_ok_status();
}

pcp_status_t pcp_services_replication_item_parse(json_t* item,
                                                 pcp_store_mutation_t* out) {
  memset(out, 0, sizeof(*out));
  if (!json_is_object(item)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "each mutation must be an object");
  }
  PCP_RETURN_IF_ERROR_BARE(string_copy(item, "mutation_id", out->mutation_id,
                                       sizeof(out->mutation_id)));
  PCP_RETURN_IF_ERROR_BARE(string_copy(item, "namespace_id", out->namespace_id,
                                       sizeof(out->namespace_id)));
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(item, "target_id", out->target_id, sizeof(out->target_id)));
  char text[64];
  PCP_RETURN_IF_ERROR_BARE(
      string_copy(item, "mutation_type", text, sizeof(text)));
  if (!pcp_store_mutation_type_parse(pcp_make_cstring_view(text),
                                     &out->mutation_type)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'mutation_type': unknown value '%s'", text);
  }
  PCP_RETURN_IF_ERROR_BARE(string_copy(item, "visibility", text, sizeof(text)));
  if (!pcp_store_visibility_parse(pcp_make_cstring_view(text),
                                  &out->visibility)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'visibility': unknown value '%s'", text);
  }
  json_t* timestamp = json_object_get(item, "timestamp_ns");
  if (timestamp) {
    if (!json_is_integer(timestamp) || json_integer_value(timestamp) < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'timestamp_ns' must be a non-negative "
                             "integer");
    }
    out->timestamp_ns = json_integer_value(timestamp);
  }
  json_t* sequence = json_object_get(item, "sequence_no");
  if (sequence) {
    if (!json_is_integer(sequence) || json_integer_value(sequence) < 1) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'sequence_no' must be a positive integer");
    }
    out->sequence_no = json_integer_value(sequence);
  }
  PCP_RETURN_IF_ERROR_BARE(
      json_text_parse(item, "payload_json", &out->payload));
  return json_text_parse(item, "provenance_json", &out->provenance);
}

void pcp_services_replication_item_deinitialize(
    pcp_store_mutation_t* mutation) {
  json_decref(mutation->payload);
  json_decref(mutation->provenance);
  mutation->payload = NULL;
  mutation->provenance = NULL;
}

static bool namespace_listed(json_t* policies, const char* namespace_id) {
  size_t i;
  json_t* p;
  json_array_foreach(policies, i, p) {
    const char* id = json_string_value(json_object_get(p, "namespace_id"));
    if (id && strcmp(id, namespace_id) == 0) {
      return true;
    }
  }
  return false;
}

pcp_status_t pcp_services_replication_batch_build(
    const pcp_store_mutation_list_t* page, size_t* inout_index,
    const pcp_store_graph_policy_list_t* policies,
    pcp_store_visibility_t default_visibility, size_t max_items,
    size_t max_bytes, json_t** out_items, json_t** out_policies,
    int64_t* out_through) {
  *out_items = json_array();
  *out_policies = json_array();
  *out_through = 0;
  if (!*out_items || !*out_policies) {
    json_decref(*out_items);
    json_decref(*out_policies);
    *out_items = *out_policies = NULL;
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "batch");
  }
  size_t bytes = 0;
  size_t i = *inout_index;
  for (; i < page->count; ++i) {
    const pcp_store_mutation_t* m = &page->items[i];
    pcp_store_graph_policy_t policy;
    pcp_services_replication_policy_lookup(policies, m->namespace_id,
                                           default_visibility, &policy);
    if (m->mutation_type == PCP_STORE_MUTATION_POLICY_UPDATE) {
      // A policy change travels as the snapshot in force, so the hub also
      // learns when a namespace stops replicating.
      if (!namespace_listed(*out_policies, m->namespace_id)) {
        json_array_append_new(*out_policies,
                              pcp_services_replication_policy_json(&policy));
      }
      *out_through = m->sequence_no;
      continue;
    }
    if (!pcp_services_replication_eligible(&policy, m)) {
      *out_through = m->sequence_no;
      continue;
    }
    if (json_array_size(*out_items) >= max_items) {
      break;
    }
    json_t* item = pcp_services_replication_item_json(m);
    if (!item) {
      break;
    }
    size_t size = json_string_length(json_object_get(item, "payload_json")) +
                  json_string_length(json_object_get(item, "provenance_json"));
    if (json_array_size(*out_items) > 0 && bytes + size > max_bytes) {
      json_decref(item);
      break;
    }
    bytes += size;
    json_array_append_new(*out_items, item);
    if (!namespace_listed(*out_policies, m->namespace_id)) {
      json_array_append_new(*out_policies,
                            pcp_services_replication_policy_json(&policy));
    }
    *out_through = m->sequence_no;
  }
  *inout_index = i;
  return pcp_ok_status();
}

static bool result_item_visible(json_t* item,
                                const pcp_store_graph_policy_list_t* policies,
                                bool is_observation) {
  pcp_store_visibility_t visibility;
  const char* text = json_string_value(json_object_get(item, "visibility"));
  if (!text ||
      !pcp_store_visibility_parse(pcp_make_cstring_view(text), &visibility)) {
    return false;
  }
  if (!policies) {
    return pcp_services_replication_visible_globally(NULL, visibility,
                                                     is_observation);
  }
  const char* ns = json_string_value(json_object_get(item, "namespace_id"));
  pcp_store_graph_policy_t policy;
  pcp_services_replication_policy_lookup(policies, ns ? ns : "",
                                         PCP_STORE_VISIBILITY_LOCAL, &policy);
  return pcp_services_replication_visible_globally(&policy, visibility,
                                                   is_observation);
}

void pcp_services_replication_result_filter(
    json_t* result, const pcp_store_graph_policy_list_t* policies) {
  static const char* const kArrays[] = {"entities", "relations",
                                        "observations"};
  for (size_t a = 0; a < 3; ++a) {
    json_t* array = json_object_get(result, kArrays[a]);
    for (size_t i = json_array_size(array); i > 0; --i) {
      if (!result_item_visible(json_array_get(array, i - 1), policies,
                               a == 2)) {
        json_array_remove(array, i - 1);
      }
    }
  }
}

static bool id_present(json_t* array, const char* key, const char* id) {
  size_t i;
  json_t* item;
  json_array_foreach(array, i, item) {
    const char* other = json_string_value(json_object_get(item, key));
    if (other && strcmp(other, id) == 0) {
      return true;
    }
  }
  return false;
}

json_t* pcp_services_replication_result_merge(json_t* local, json_t* global,
                                              size_t limit) {
  static const char* const kArrays[] = {"entities", "relations",
                                        "observations"};
  static const char* const kIds[] = {"entity_id", "relation_id",
                                     "observation_id"};
  json_t* out = json_object();
  if (!out) {
    return NULL;
  }
  for (size_t a = 0; a < 3; ++a) {
    json_t* merged = json_array();
    if (!merged || json_object_set_new(out, kArrays[a], merged)) {
      json_decref(out);
      return NULL;
    }
    json_t* sources[2] = {json_object_get(local, kArrays[a]),
                          json_object_get(global, kArrays[a])};
    for (size_t s = 0; s < 2; ++s) {
      size_t i;
      json_t* item;
      json_array_foreach(sources[s], i, item) {
        if (limit && json_array_size(merged) >= limit) {
          break;
        }
        const char* id = json_string_value(json_object_get(item, kIds[a]));
        // Local items are all kept (the store's ids are unique); a global
        // item whose id the merge already holds is the same record.
        if (s == 1 && (!id || id_present(merged, kIds[a], id))) {
          continue;
        }
        json_array_append(merged, item);
      }
    }
  }
  return out;
}

// Upstream: the entity type of an event's subject by event_type prefix.
static const char* subject_type(const char* event_type) {
  if (strncmp(event_type, "inference.", 10) == 0) {
    return "inference_job";
  }
  if (strncmp(event_type, "rl.", 3) == 0) {
    return "rl_job";
  }
  if (strncmp(event_type, "training.", 9) == 0) {
    return "training_job";
  }
  return "service_event";
}

static pcp_status_t optional_string(json_t* event, const char* key,
                                    size_t max_length, const char** out) {
  *out = NULL;
  json_t* v = json_object_get(event, key);
  if (!v || json_is_null(v)) {
    return pcp_ok_status();
  }
  if (!json_is_string(v) || json_string_length(v) == 0 ||
      json_string_length(v) > max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be a string of 1..%zu bytes", key,
                           max_length);
  }
  *out = json_string_value(v);
  return pcp_ok_status();
}

pcp_status_t pcp_services_replication_event_mutations(
    json_t* event, const char* gateway_id, const char* lab_id,
    pcp_store_mutation_t out_mutations[2]) {
  memset(out_mutations, 0, 2 * sizeof(*out_mutations));
  if (!json_is_object(event)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "each event must be an object");
  }
  // The ids get ":subject" / ":observation" appended (12 bytes), and the
  // subject "service:" / "job:" prepended (8).
  const size_t id_max = PCP_STORE_ID_MAX_LENGTH - 16;
  const char *event_id, *service_id, *event_type, *namespace_id, *job_id;
  PCP_RETURN_IF_ERROR_BARE(
      optional_string(event, "event_id", id_max, &event_id));
  PCP_RETURN_IF_ERROR_BARE(
      optional_string(event, "service_id", id_max, &service_id));
  PCP_RETURN_IF_ERROR_BARE(optional_string(
      event, "event_type", PCP_STORE_NAME_MAX_LENGTH, &event_type));
  PCP_RETURN_IF_ERROR_BARE(optional_string(
      event, "namespace_id", PCP_STORE_ID_MAX_LENGTH, &namespace_id));
  PCP_RETURN_IF_ERROR_BARE(optional_string(event, "job_id", id_max, &job_id));
  if (!event_id || !service_id || !event_type) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fields 'event_id', 'service_id' and 'event_type' "
                           "are required");
  }
  json_t* timestamp = json_object_get(event, "timestamp");
  if (timestamp && !json_is_null(timestamp) && !json_is_string(timestamp) &&
      !json_is_integer(timestamp)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'timestamp' must be a string or an integer");
  }
  json_t* extra = json_object_get(event, "provenance");
  if (extra && !json_is_null(extra) && !json_is_object(extra)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'provenance' must be an object");
  }
  json_t* payload = json_object_get(event, "payload");

  char subject[PCP_STORE_ID_MAX_LENGTH + 1];
  snprintf(subject, sizeof(subject), "%s:%s", job_id ? "job" : "service",
           job_id ? job_id : service_id);
  char ns[PCP_STORE_ID_MAX_LENGTH + 1];
  if (namespace_id) {
    snprintf(ns, sizeof(ns), "%s", namespace_id);
  } else if ((size_t)snprintf(ns, sizeof(ns), "%s/shared", lab_id) >=
             sizeof(ns)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "lab_id is too long");
  }

  json_t* provenance =
      json_pack("{s:s, s:s, s:s, s:s, s:s}", "gateway_id", gateway_id, "lab_id",
                lab_id, "service_id", service_id, "source_event_id", event_id,
                "reason", event_type);
  if (!provenance) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "event provenance");
  }
  if (job_id) {
    json_object_set_new(provenance, "job_id", json_string(job_id));
  }
  if (timestamp && !json_is_null(timestamp)) {
    json_object_set(provenance, "timestamp", timestamp);
  }
  if (json_is_object(extra)) {
    json_object_update(provenance, extra);
  }
  json_t* properties = json_pack("{s:s, s:s}", "event_type", event_type,
                                 "service_id", service_id);
  if (properties && job_id) {
    json_object_set_new(properties, "job_id", json_string(job_id));
  }

  pcp_store_mutation_t* s = &out_mutations[0];
  snprintf(s->mutation_id, sizeof(s->mutation_id), "%s:subject", event_id);
  snprintf(s->namespace_id, sizeof(s->namespace_id), "%s", ns);
  s->mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY;
  snprintf(s->target_id, sizeof(s->target_id), "%s", subject);
  s->payload = json_pack("{s:s, s:s, s:o*}", "entity_type",
                         subject_type(event_type), "display_name",
                         job_id ? job_id : subject, "properties", properties);
  s->provenance = json_deep_copy(provenance);

  pcp_store_mutation_t* o = &out_mutations[1];
  snprintf(o->mutation_id, sizeof(o->mutation_id), "%s:observation", event_id);
  snprintf(o->namespace_id, sizeof(o->namespace_id), "%s", ns);
  o->mutation_type = PCP_STORE_MUTATION_APPEND_OBSERVATION;
  snprintf(o->target_id, sizeof(o->target_id), "%s", event_id);
  o->payload = json_pack("{s:s, s:s, s:O}", "observation_type", event_type,
                         "subject_entity_id", subject, "payload",
                         payload ? payload : json_null());
  o->provenance = provenance;
  if (!s->payload || !s->provenance || !o->payload) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "event mutations");
  }
  return pcp_ok_status();
}

json_t* pcp_services_graph_result_json(const pcp_store_graph_result_t* r) {
  json_t* entities = json_array();
  for (size_t i = 0; i < r->entity_count; ++i) {
    const pcp_store_graph_entity_t* e = &r->entities[i];
    json_array_append_new(
        entities,
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:O, s:O, s:I, s:I}", "entity_id",
                  e->entity_id, "namespace_id", e->namespace_id, "entity_type",
                  e->entity_type, "display_name", e->display_name, "visibility",
                  pcp_store_visibility_name(e->visibility), "properties",
                  e->properties, "provenance", e->provenance, "created_at_ms",
                  (json_int_t)(e->created_at_ns / 1000000), "updated_at_ms",
                  (json_int_t)(e->updated_at_ns / 1000000)));
  }
  json_t* relations = json_array();
  for (size_t i = 0; i < r->relation_count; ++i) {
    const pcp_store_graph_relation_t* e = &r->relations[i];
    json_array_append_new(
        relations,
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:O, s:O}", "relation_id",
                  e->relation_id, "namespace_id", e->namespace_id,
                  "relation_type", e->relation_type, "from_entity_id",
                  e->from_entity_id, "to_entity_id", e->to_entity_id,
                  "visibility", pcp_store_visibility_name(e->visibility),
                  "properties", e->properties, "provenance", e->provenance));
  }
  json_t* observations = json_array();
  for (size_t i = 0; i < r->observation_count; ++i) {
    const pcp_store_graph_observation_t* e = &r->observations[i];
    json_array_append_new(
        observations,
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:O, s:O}", "observation_id",
                  e->observation_id, "namespace_id", e->namespace_id,
                  "subject_entity_id", e->subject_entity_id, "observation_type",
                  e->observation_type, "visibility",
                  pcp_store_visibility_name(e->visibility), "payload",
                  e->payload, "provenance", e->provenance));
  }
  return json_pack("{s:o, s:o, s:o}", "entities", entities, "relations",
                   relations, "observations", observations);
}

const char* pcp_services_graph_query_parse(json_t* body,
                                           pcp_store_graph_query_t* out_query,
                                           const char** out_mode,
                                           const char** out_key) {
  // The rules below spell these limits out.
  _Static_assert(PCP_STORE_ID_MAX_LENGTH == 255, "rule text");
  _Static_assert(PCP_STORE_LIST_LIMIT_MAX == 1000, "rule text");
  memset(out_query, 0, sizeof(*out_query));
  *out_mode = "local";
  *out_key = NULL;
  if (!json_is_object(body)) {
    return "must be a JSON object";
  }
  static const char* const kKeys[] = {"entity_id",   "namespace_id",
                                      "entity_type", "relation_type",
                                      "text",        "query_mode"};
  const char* values[PCP_ARRAYSIZE(kKeys)] = {0};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kKeys); ++i) {
    json_t* v = json_object_get(body, kKeys[i]);
    if (v && (!json_is_string(v) ||
              json_string_length(v) > PCP_STORE_ID_MAX_LENGTH)) {
      *out_key = kKeys[i];
      return "must be a string of at most 255 bytes";
    }
    values[i] = v ? json_string_value(v) : NULL;
  }
  if (values[5]) {
    if (strcmp(values[5], "local") != 0 && strcmp(values[5], "global") != 0 &&
        strcmp(values[5], "local_plus_global") != 0) {
      *out_key = "query_mode";
      return "must be one of local, global, local_plus_global";
    }
    *out_mode = values[5];
  }
  out_query->entity_id = values[0];
  out_query->namespace_id = values[1];
  out_query->entity_type = values[2];
  out_query->relation_type = values[3];
  out_query->text = values[4];
  json_t* limit = json_object_get(body, "limit");
  if (limit) {
    if (!json_is_integer(limit) || json_integer_value(limit) < 1 ||
        json_integer_value(limit) > PCP_STORE_LIST_LIMIT_MAX) {
      *out_key = "limit";
      return "must be an integer in [1, 1000]";
    }
    out_query->limit = (uint32_t)json_integer_value(limit);
  }
  return NULL;
}

pcp_status_t pcp_services_graph_query_read(json_t* body,
                                           pcp_store_graph_query_t* out_query,
                                           const char** out_mode) {
  const char* key;
  const char* rule =
      pcp_services_graph_query_parse(body, out_query, out_mode, &key);
  if (!rule) {
    return pcp_ok_status();
  }
  if (!key) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "the body %s", rule);
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "field '%s' %s", key,
                         rule);
}
