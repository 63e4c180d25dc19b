// SPDX-License-Identifier: Apache-2.0
// The knowledge-graph API: /v1/graph/{status, mutate, query,
// entities/{id}} and the graph backend behind it (SQLite in the store or
// FalkorDB). Replication policies and query modes are in replication.c.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

//===----------------------------------------------------------------------===//
// /v1/graph
//===----------------------------------------------------------------------===//

// Copies |key| of |object| into |buffer| (capacity bytes); "" when absent.
static pcp_status_t copy_field(json_t* object, const char* key, bool required,
                               char* buffer, size_t capacity) {
  buffer[0] = 0;
  json_t* v = json_object_get(object, key);
  if (!v) {
    if (required) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field '%s' is required", key);
    }
    return pcp_ok_status();
  }
  if (!json_is_string(v)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be a string", key);
  }
  if (json_string_length(v) >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' is longer than %zu bytes", key,
                           capacity - 1);
  }
  memcpy(buffer, json_string_value(v), json_string_length(v) + 1);
  return pcp_ok_status();
}

static pcp_status_t mutation_parse(pcp_services_t* g, json_t* m,
                                   pcp_store_mutation_t* out) {
  memset(out, 0, sizeof(*out));
  if (!json_is_object(m)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "each mutation must be an object");
  }
  char type[64];
  PCP_RETURN_IF_ERROR_BARE(
      copy_field(m, "mutation_type", true, type, sizeof(type)));
  if (!pcp_store_mutation_type_parse(pcp_make_cstring_view(type),
                                     &out->mutation_type)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'mutation_type': unknown value '%s'", type);
  }
  PCP_RETURN_IF_ERROR_BARE(copy_field(m, "mutation_id", false, out->mutation_id,
                                      sizeof(out->mutation_id)));
  PCP_RETURN_IF_ERROR_BARE(copy_field(
      m, "namespace_id", false, out->namespace_id, sizeof(out->namespace_id)));
  if (!out->namespace_id[0]) {
    snprintf(out->namespace_id, sizeof(out->namespace_id), "%s",
             g->config.lab_id);
  }
  PCP_RETURN_IF_ERROR_BARE(
      copy_field(m, "target_id", true, out->target_id, sizeof(out->target_id)));
  char visibility[32];
  PCP_RETURN_IF_ERROR_BARE(
      copy_field(m, "visibility", false, visibility, sizeof(visibility)));
  if (visibility[0] &&
      !pcp_store_visibility_parse(pcp_make_cstring_view(visibility),
                                  &out->visibility)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'visibility': unknown value '%s'",
                           visibility);
  }
  json_t* payload = json_object_get(m, "payload");
  if (payload && !json_is_object(payload)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'payload' must be an object");
  }
  json_t* provenance = json_object_get(m, "provenance");
  if (provenance && !json_is_object(provenance)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'provenance' must be an object");
  }
  out->payload = payload;
  out->provenance = provenance;
  return pcp_ok_status();
}

#define GRAPH_MAX_MUTATIONS_PER_REQUEST 1000

pcp_status_t pcp_services_graph_mutate_post(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  json_t* mutations = json_object_get(body, "mutations");
  pcp_status_t status = pcp_ok_status();
  if (!json_is_array(mutations) || json_array_size(mutations) == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'mutations' must be a non-empty array");
  } else if (json_array_size(mutations) > GRAPH_MAX_MUTATIONS_PER_REQUEST) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "at most %d mutations per request",
                             GRAPH_MAX_MUTATIONS_PER_REQUEST);
  }
  json_t* ids = json_array();
  for (size_t i = 0; !status && i < json_array_size(mutations); ++i) {
    pcp_store_mutation_t m;
    status = mutation_parse(g, json_array_get(mutations, i), &m);
    int64_t sequence = 0;
    bool duplicate = false;
    // Through replication.c: the namespace's default visibility, and a
    // policy_update validated and applied.
    if (!status) {
      status = pcp_services_replication_mutation_apply(
          g, json_array_get(mutations, i), &m, &sequence, &duplicate);
    }
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(pcp_status_code(status), "mutations[%zu]: %s", i,
                          pcp_status_message(status));
      pcp_status_ignore(status);
      status = wrapped;
      break;
    }
    char id[PCP_STORE_ID_MAX_LENGTH + 1];
    if (m.mutation_id[0]) {
      snprintf(id, sizeof(id), "%s", m.mutation_id);
    } else {
      snprintf(id, sizeof(id), "mut_%lld", (long long)sequence);
    }
    json_array_append_new(ids, json_string(id));
  }
  json_decref(body);
  if (status) {
    json_decref(ids);
    return status;
  }
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:b, s:o}", "accepted", 1, "mutation_ids", ids));
}

// Unknown keys are ignored (upstream); known ones must have their type, or
// a typo'd value would silently widen the query to everything.
pcp_status_t pcp_services_graph_query_post(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  pcp_store_graph_query_t q;
  const char* mode;
  pcp_status_t status = pcp_services_graph_query_read(body, &q, &mode);
  // global / local_plus_global go through the hub (replication.c).
  bool remote = !status && strcmp(mode, "local") != 0;
  pcp_store_graph_result_t result = {0};
  bool global_only = remote && strcmp(mode, "global") == 0;
  if (!status && !global_only) {
    status = pcp_store_graph_backend_query(g->graph, &q, &result);
  }
  if (status) {
    json_decref(body);
    return status;
  }
  json_t* out = global_only ? NULL : pcp_services_graph_result_json(&result);
  pcp_store_graph_result_deinitialize(&result);
  if (remote) {
    status = pcp_services_replication_query(g, body, mode, out,
                                            q.limit ? q.limit : 20, response);
    json_decref(out);
    json_decref(body);
    return status;
  }
  json_decref(body);
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_services_graph_entity_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  pcp_store_graph_query_t q = {.entity_id =
                                   pcp_http_request_param(request, "id")};
  pcp_store_graph_entity_t e;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_graph_backend_entity_get(g->graph, q.entity_id, &e));
  pcp_store_graph_entity_deinitialize(&e);
  pcp_store_graph_result_t result = {0};
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_graph_backend_query(g->graph, &q, &result));
  json_t* out = pcp_services_graph_result_json(&result);
  pcp_store_graph_result_deinitialize(&result);
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_services_graph_status_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  pcp_store_mutation_log_stats_t stats;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_mutation_log_stats_query(g->store, &stats));
  pcp_store_graph_counts_t counts;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_graph_backend_counts_query(g->graph, &counts));
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "backend",
                pcp_store_graph_backend_name(g->graph), "namespaces",
                (json_int_t)counts.namespaces, "entities",
                (json_int_t)counts.entities, "relations",
                (json_int_t)counts.relations, "observations",
                (json_int_t)counts.observations, "mutations",
                (json_int_t)stats.last_sequence_no, "last_sequence",
                (json_int_t)stats.last_sequence_no, "last_replicated_sequence",
                (json_int_t)stats.last_replicated_sequence, "pending_mutations",
                (json_int_t)stats.pending_count, "federation_enabled", 0));
}

//===----------------------------------------------------------------------===//
// Backend
//===----------------------------------------------------------------------===//

pcp_status_t pcp_services_graph_open(pcp_services_t* g) {
  // kGraphBackends in the gateway's config: memory (= sqlite), sqlite,
  // falkordb.
  if (!g->config.graph_falkordb) {
    return pcp_store_graph_backend_sqlite_open(g->store, &g->graph);
  }
  const pcp_services_falkordb_config_t* f = &g->config.falkordb;
  const char* password = NULL;
  if (f->present && f->password_env && f->password_env[0]) {
    password = getenv(f->password_env);
    if (!password || !password[0]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gateway config: key 'falkordb.password_env' "
                             "names %s, which is not set",
                             f->password_env);
    }
  }
  pcp_store_falkordb_options_t options = {
      .host = f->present ? f->host : NULL,
      .port = f->present ? (uint16_t)f->port : 0,
      .password = password,
      .graph = f->present ? f->graph : NULL,
      .connect_timeout_ms = f->present ? (uint32_t)f->connect_timeout_ms : 0,
      .command_timeout_ms = f->present ? (uint32_t)f->command_timeout_ms : 0,
  };
  PCP_RETURN_IF_ERROR(
      pcp_store_graph_backend_falkordb_open(g->store, &options, &g->graph),
      "opening the FalkorDB graph backend (gateway config keys "
      "'graph_backend', 'falkordb')");
  PCP_LOG(PCP_LOG_INFO, &g->log, "graph backend falkordb at %s:%u graph %s",
          options.host ? options.host : "127.0.0.1",
          (unsigned)(options.port ? options.port : 6379),
          options.graph ? options.graph : "pcp");
  return pcp_ok_status();
}

void pcp_services_graph_close(pcp_services_t* g) {
  pcp_store_graph_backend_close(g->graph);
  g->graph = NULL;
}
