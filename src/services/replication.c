// SPDX-License-Identifier: Apache-2.0
// The gateway's half of knowledge-graph replication (docs/federation.md
// "Graph replication"): namespace policies (GET /v1/graph/policies,
// PUT /v1/graph/policies/{ns}, policy_update mutations applied), event
// ingest (POST /v1/internal/events), per-namespace lag
// (GET /v1/graph/replication), the push of eligible mutations to the hub and
// the global query modes of POST /v1/graph/query.
//
// Policies are policy_update records of the mutation log (store.h "Graph
// replication"); this file keeps a copy of the policies in force, reloaded
// after every policy write, guarded by |mu|. The push is a step of the
// federation thread (federation.c), run after every successful connect
// (every federation.heartbeat_interval_ms); |cycle_mu| keeps two cycles
// from overlapping should anything else run one.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

// Records one push cycle reads at most (pages of 128): a cycle stays short
// and the next one continues.
#define REPLICATION_MAX_PAGES_PER_CYCLE 64
// Item text (payload + provenance) per batch; the hub's body cap is 16 MiB.
#define REPLICATION_BATCH_MAX_BYTES ((size_t)8 << 20)
// Calls to the hub.
#define REPLICATION_HUB_TIMEOUT_MS 10000

struct pcp_services_replication_t {
  pthread_mutex_t mu;
  // Guarded by |mu|.
  pcp_store_graph_policy_list_t policies;
  bool policies_stale;
  int64_t last_push_at_ms;  // wall
  int64_t last_acked_sequence_no;
  uint64_t batches_sent;
  uint64_t items_sent;
  char last_error[256];

  // Serializes policy writes (read, merge, log): two concurrent partial
  // updates of one namespace must not lose either.
  pthread_mutex_t policy_write_mu;
  pthread_mutex_t cycle_mu;   // one push cycle at a time
  pcp_http_client_t* client;  // guarded by |cycle_mu|
};

static pcp_store_visibility_t default_visibility(pcp_services_t* g) {
  return g->config.default_visibility;
}

// The hub's base URL when federation is on (federation.enabled with
// federation.upstream, or the legacy federation_hub_endpoint), else NULL.
static const char* hub_url(pcp_services_t* g) {
  if (g->config.federation_present && !g->config.federation_enabled) {
    return NULL;
  }
  return g->config.federation_upstream;
}

static const char* hub_token(pcp_services_t* g) {
  const char* env = g->config.federation_token_env;
  return env ? getenv(env) : NULL;
}

// Reloads the policies when a write marked them stale. Holds |mu|.
static pcp_status_t policies_refresh_locked(pcp_services_t* g) {
  pcp_services_replication_t* r = g->replication;
  if (!r->policies_stale) {
    return pcp_ok_status();
  }
  pcp_store_graph_policy_list_t fresh;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_graph_policy_list(g->store, &fresh));
  pcp_store_graph_policy_list_deinitialize(&r->policies);
  r->policies = fresh;
  r->policies_stale = false;
  return pcp_ok_status();
}

// A copy of the policies in force (release with _deinitialize).
static pcp_status_t policies_copy(pcp_services_t* g,
                                  pcp_store_graph_policy_list_t* out) {
  pcp_services_replication_t* r = g->replication;
  memset(out, 0, sizeof(*out));
  out->allocator = g->allocator;
  pthread_mutex_lock(&r->mu);
  pcp_status_t status = policies_refresh_locked(g);
  if (!status && r->policies.count) {
    status = pcp_allocator_malloc(g->allocator,
                                  r->policies.count * sizeof(*out->items),
                                  (void**)&out->items);
    if (!status) {
      memcpy(out->items, r->policies.items,
             r->policies.count * sizeof(*out->items));
      out->count = r->policies.count;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return status;
}

static void policy_get(pcp_services_t* g, const char* namespace_id,
                       pcp_store_graph_policy_t* out) {
  pcp_services_replication_t* r = g->replication;
  pthread_mutex_lock(&r->mu);
  pcp_status_t status = policies_refresh_locked(g);
  // On a read error the cached list (possibly older) still answers; the
  // next call retries the reload.
  pcp_status_ignore(status);
  pcp_services_replication_policy_lookup(&r->policies, namespace_id,
                                         default_visibility(g), out);
  pthread_mutex_unlock(&r->mu);
}

void pcp_services_replication_policies_changed(pcp_services_t* g) {
  pcp_services_replication_t* r = g->replication;
  pthread_mutex_lock(&r->mu);
  r->policies_stale = true;
  pthread_mutex_unlock(&r->mu);
}

static pcp_status_t mutation_prepare(pcp_services_t* g, json_t* request,
                                     pcp_store_mutation_t* inout_mutation,
                                     json_t** out_payload) {
  *out_payload = NULL;
  pcp_store_graph_policy_t policy;
  policy_get(g, inout_mutation->namespace_id, &policy);
  if (!json_object_get(request, "visibility")) {
    inout_mutation->visibility = policy.default_visibility;
  }
  if (inout_mutation->mutation_type != PCP_STORE_MUTATION_POLICY_UPDATE) {
    return pcp_ok_status();
  }
  // A policy_update is applied: its payload (a partial update, validated)
  // is merged into the policy in force and logged as the whole snapshot.
  if (strcmp(inout_mutation->target_id, inout_mutation->namespace_id) != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a policy_update's target_id must be its "
                           "namespace_id ('%s')",
                           inout_mutation->namespace_id);
  }
  json_t* update = inout_mutation->payload;
  if (update) {
    PCP_RETURN_IF_ERROR(
        pcp_services_replication_policy_update(update, false, &policy),
        "policy_update payload");
  }
  *out_payload = pcp_services_replication_policy_payload(&policy);
  if (!*out_payload) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "policy payload");
  }
  inout_mutation->payload = *out_payload;
  // Policies stay on their gateway; only snapshots travel with batches.
  inout_mutation->visibility = PCP_STORE_VISIBILITY_LOCAL;
  return pcp_ok_status();
}

pcp_status_t pcp_services_replication_mutation_apply(
    pcp_services_t* g, json_t* request, pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate) {
  pcp_services_replication_t* r = g->replication;
  bool policy = mutation->mutation_type == PCP_STORE_MUTATION_POLICY_UPDATE;
  if (policy) {
    pthread_mutex_lock(&r->policy_write_mu);
  }
  json_t* payload = NULL;
  json_t* original = mutation->payload;
  pcp_status_t status = mutation_prepare(g, request, mutation, &payload);
  if (!status) {
    status = pcp_store_graph_backend_mutation_apply(
        g->graph, mutation, out_sequence_no, out_duplicate);
  }
  if (policy) {
    if (!status) {
      pcp_services_replication_policies_changed(g);
    }
    pthread_mutex_unlock(&r->policy_write_mu);
  }
  mutation->payload = original;
  json_decref(payload);
  return status;
}

//===----------------------------------------------------------------------===//
// GET /v1/graph/policies, PUT /v1/graph/policies/{namespace}
//===----------------------------------------------------------------------===//

pcp_status_t pcp_services_graph_policies_get(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  pcp_store_graph_policy_list_t list;
  PCP_RETURN_IF_ERROR_BARE(policies_copy(g, &list));
  json_t* array = json_array();
  for (size_t i = 0; array && i < list.count; ++i) {
    json_array_append_new(array,
                          pcp_services_replication_policy_json(&list.items[i]));
  }
  pcp_store_graph_policy_list_deinitialize(&list);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:o, s:s}", "policies", array, "default_visibility",
                pcp_store_visibility_name(default_visibility(g))));
}

pcp_status_t pcp_services_graph_policy_put(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  // A prefix route: namespace ids hold '/' ("{lab_id}/shared").
  const char* namespace_id = pcp_http_request_param(request, "*");
  if (!namespace_id || !namespace_id[0] ||
      strlen(namespace_id) > PCP_STORE_ID_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the namespace in the path must be 1..%d bytes",
                           PCP_STORE_ID_MAX_LENGTH);
  }
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  pcp_store_mutation_t m = {.mutation_type = PCP_STORE_MUTATION_POLICY_UPDATE};
  snprintf(m.namespace_id, sizeof(m.namespace_id), "%s", namespace_id);
  snprintf(m.target_id, sizeof(m.target_id), "%s", namespace_id);
  m.payload = body;
  int64_t sequence_no = 0;
  bool duplicate = false;
  pcp_status_t status = json_is_object(body)
                            ? pcp_services_replication_mutation_apply(
                                  g, body, &m, &sequence_no, &duplicate)
                            : pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                              "the body must be a JSON object");
  json_decref(body);
  PCP_RETURN_IF_ERROR_BARE(status);
  pcp_store_graph_policy_t policy;
  policy_get(g, namespace_id, &policy);
  char mutation_id[32];
  snprintf(mutation_id, sizeof(mutation_id), "mut_%lld",
           (long long)sequence_no);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:b, s:o, s:s}", "accepted", 1, "policy",
                pcp_services_replication_policy_json(&policy), "mutation_id",
                mutation_id));
}

//===----------------------------------------------------------------------===//
// POST /v1/internal/events
//===----------------------------------------------------------------------===//

pcp_status_t pcp_services_events_ingest_post(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  json_t* events = json_object_get(body, "events");
  pcp_status_t status = pcp_ok_status();
  if (!json_is_array(events) || json_array_size(events) == 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'events' must be a non-empty array");
  } else if (json_array_size(events) > PCP_SERVICES_EVENTS_MAX_PER_REQUEST) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'events': at most %u events per request",
                             PCP_SERVICES_EVENTS_MAX_PER_REQUEST);
  }
  // Every event is checked before any is written, so a bad one in the
  // middle leaves nothing half-ingested.
  size_t count = status ? 0 : json_array_size(events);
  pcp_store_mutation_t* mutations = NULL;
  if (count) {
    status = pcp_allocator_malloc(g->allocator, 2 * count * sizeof(*mutations),
                                  (void**)&mutations);
    if (!status) {
      memset(mutations, 0, 2 * count * sizeof(*mutations));
    }
  }
  for (size_t i = 0; !status && i < count; ++i) {
    status = pcp_services_replication_event_mutations(
        json_array_get(events, i), g->config.gateway_id, g->config.lab_id,
        &mutations[2 * i]);
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(pcp_status_code(status), "events[%zu]: %s", i,
                          pcp_status_message(status));
      pcp_status_ignore(status);
      status = wrapped;
    }
  }
  json_t* out = status ? NULL : json_array();
  for (size_t i = 0; !status && i < count; ++i) {
    pcp_store_graph_policy_t policy;
    policy_get(g, mutations[2 * i].namespace_id, &policy);
    json_t* ids = json_array();
    for (int k = 0; !status && k < 2; ++k) {
      pcp_store_mutation_t* m = &mutations[2 * i + k];
      m->visibility = policy.default_visibility;
      int64_t sequence_no = 0;
      bool duplicate = false;
      // Idempotent by the derived ids: a re-sent event writes nothing new.
      status = pcp_store_graph_backend_mutation_apply(g->graph, m, &sequence_no,
                                                      &duplicate);
      json_array_append_new(ids, json_string(m->mutation_id));
    }
    json_t* event = json_array_get(events, i);
    json_array_append_new(
        out,
        json_pack("{s:O, s:O, s:O, s:o}", "event_id",
                  json_object_get(event, "event_id"), "event_type",
                  json_object_get(event, "event_type"), "service_id",
                  json_object_get(event, "service_id"), "mutation_ids", ids));
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(pcp_status_code(status), "events[%zu]: %s", i,
                          pcp_status_message(status));
      pcp_status_ignore(status);
      status = wrapped;
    }
  }
  for (size_t i = 0; i < 2 * count; ++i) {
    pcp_services_replication_item_deinitialize(&mutations[i]);
  }
  if (mutations) {
    pcp_allocator_free(g->allocator, mutations);
  }
  json_decref(body);
  if (status) {
    json_decref(out);
    return status;
  }
  return pcp_http_response_json_take(
      response, 200, json_pack("{s:b, s:o}", "accepted", 1, "events", out));
}

//===----------------------------------------------------------------------===//
// GET /v1/graph/replication
//===----------------------------------------------------------------------===//

json_t* pcp_services_replication_status_json(pcp_services_t* g) {
  pcp_services_replication_t* r = g->replication;
  pcp_store_mutation_log_stats_t stats;
  pcp_store_namespace_stats_list_t namespaces = {0};
  pcp_store_graph_policy_list_t policies = {0};
  pcp_status_t status = pcp_store_mutation_log_stats_query(g->store, &stats);
  if (!status) {
    status = pcp_store_namespace_stats_list(g->store, &namespaces);
  }
  if (!status) {
    status = policies_copy(g, &policies);
  }
  if (status) {
    pcp_status_ignore(status);
    pcp_store_namespace_stats_list_deinitialize(&namespaces);
    return NULL;
  }
  json_t* array = json_array();
  for (size_t i = 0; array && i < namespaces.count; ++i) {
    const pcp_store_namespace_stats_t* s = &namespaces.items[i];
    pcp_store_graph_policy_t policy;
    pcp_services_replication_policy_lookup(&policies, s->namespace_id,
                                           default_visibility(g), &policy);
    json_t* item = pcp_services_replication_policy_json(&policy);
    json_t* counts = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
        "total_mutations", (json_int_t)s->total_count, "pending_mutations",
        (json_int_t)s->pending_count, "local_mutations",
        (json_int_t)s->visibility_counts[PCP_STORE_VISIBILITY_LOCAL],
        "shared_mutations",
        (json_int_t)s->visibility_counts[PCP_STORE_VISIBILITY_SHARED],
        "global_mutations",
        (json_int_t)s->visibility_counts[PCP_STORE_VISIBILITY_GLOBAL],
        "entity_mutations", (json_int_t)s->entity_count, "relation_mutations",
        (json_int_t)s->relation_count, "observation_mutations",
        (json_int_t)s->observation_count, "policy_mutations",
        (json_int_t)s->policy_count, "last_sequence_no",
        (json_int_t)s->last_sequence_no, "replicated_through_sequence",
        (json_int_t)(s->pending_count ? stats.last_replicated_sequence
                                      : s->last_sequence_no),
        "replication_lag", (json_int_t)s->pending_count);
    json_object_update(item, counts);
    json_decref(counts);
    json_array_append_new(array, item);
  }
  pcp_store_namespace_stats_list_deinitialize(&namespaces);
  pcp_store_graph_policy_list_deinitialize(&policies);
  pthread_mutex_lock(&r->mu);
  json_t* out = json_pack(
      "{s:s, s:s, s:b, s:s?, s:I, s:s?, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
      " s:o}",
      "gateway_id", g->config.gateway_id, "lab_id", g->config.lab_id,
      "replication_enabled", hub_url(g) != NULL, "federation_hub_endpoint",
      hub_url(g), "last_push_at_ms", (json_int_t)r->last_push_at_ms,
      "last_error", r->last_error[0] ? r->last_error : NULL, "summary",
      "namespace_count", (json_int_t)json_array_size(array), "last_sequence_no",
      (json_int_t)stats.last_sequence_no, "last_replicated_sequence",
      (json_int_t)stats.last_replicated_sequence, "pending_mutations",
      (json_int_t)stats.pending_count, "replication_lag",
      (json_int_t)stats.pending_count, "batches_sent",
      (json_int_t)r->batches_sent, "items_sent", (json_int_t)r->items_sent,
      "namespaces", array);
  pthread_mutex_unlock(&r->mu);
  return out;
}

pcp_status_t pcp_services_graph_replication_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  json_t* out = pcp_services_replication_status_json(user_data);
  if (!out) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "reading the replication status failed");
  }
  return pcp_http_response_json_take(response, 200, out);
}

//===----------------------------------------------------------------------===//
// Push
//===----------------------------------------------------------------------===//

// POSTs |body| (taken) as JSON to |path| on the hub with the federation
// token through |client|. The caller deinitializes |out_answer|.
static pcp_status_t hub_post(pcp_services_t* g, pcp_http_client_t* client,
                             const char* path, json_t* body,
                             pcp_http_client_response_t* out_answer) {
  char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%s body", path);
  }
  char url[1200];
  snprintf(url, sizeof(url), "%s%s", hub_url(g), path);
  const char* headers[] = {"Content-Type: application/json", NULL};
  pcp_http_client_request_t request = {.method = "POST",
                                       .url = url,
                                       .headers = headers,
                                       .bearer_token = hub_token(g),
                                       .body = text,
                                       .body_length = strlen(text)};
  pcp_status_t status = pcp_http_client_send(client, &request, out_answer);
  pcp_libc_free(text);
  PCP_RETURN_IF_ERROR(status, "POST %s", url);
  return pcp_ok_status();
}

// POSTs one batch and checks the ack. Holds |cycle_mu|.
static pcp_status_t batch_send(pcp_services_t* g, json_t* items,
                               json_t* policies, int64_t through,
                               const pcp_store_mutation_log_stats_t* stats) {
  pcp_services_replication_t* r = g->replication;
  json_t* body = json_pack(
      "{s:s, s:s, s:I, s:I, s:I, s:O, s:O}", "gateway_id", g->config.gateway_id,
      "lab_id", g->config.lab_id, "last_sequence_no",
      (json_int_t)stats->last_sequence_no, "last_replicated_sequence",
      (json_int_t)stats->last_replicated_sequence, "through_sequence_no",
      (json_int_t)through, "namespace_policies", policies, "mutations", items);
  pcp_http_client_response_t answer;
  PCP_RETURN_IF_ERROR_BARE(
      hub_post(g, r->client, "/v1/federation/mutations", body, &answer));
  pcp_status_t status = pcp_ok_status();
  json_t* ack = NULL;
  if (answer.http_status == 200) {
    ack = json_loadb(answer.body, answer.body_length, 0, NULL);
  }
  if (!ack) {
    status = pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "the hub answered HTTP %d: %.200s",
        answer.http_status, answer.body ? answer.body : "");
  } else if (!json_is_true(json_object_get(ack, "accepted")) ||
             json_integer_value(json_object_get(ack, "acked_sequence_no")) !=
                 through) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "the hub's ack does not acknowledge sequence "
                             "%lld: %.200s",
                             (long long)through, answer.body);
  }
  json_decref(ack);
  pcp_http_client_response_deinitialize(&answer);
  return status;
}

pcp_status_t pcp_services_replication_cycle(pcp_services_t* g) {
  pcp_services_replication_t* r = g->replication;
  if (!r || !hub_url(g)) {
    return pcp_ok_status();
  }
  pthread_mutex_lock(&r->cycle_mu);
  pcp_status_t status = pcp_ok_status();
  if (!r->client) {
    pcp_http_client_options_t options = {.timeout_ms =
                                             REPLICATION_HUB_TIMEOUT_MS};
    status = pcp_http_client_create(&options, g->allocator, &r->client);
  }
  uint64_t batches = 0, items_sent = 0;
  int64_t acked = 0;
  for (int page_index = 0;
       !status && page_index < REPLICATION_MAX_PAGES_PER_CYCLE; ++page_index) {
    pcp_store_mutation_log_stats_t stats;
    status = pcp_store_mutation_log_stats_query(g->store, &stats);
    if (status || stats.pending_count == 0) {
      break;
    }
    pcp_store_mutation_list_t page;
    status =
        pcp_store_mutation_list(g->store, stats.last_replicated_sequence,
                                PCP_SERVICES_REPLICATION_PAGE_RECORDS, &page);
    if (status) {
      break;
    }
    pcp_store_graph_policy_list_t policies;
    status = policies_copy(g, &policies);
    size_t index = 0;
    while (!status && index < page.count) {
      json_t *items = NULL, *snapshots = NULL;
      int64_t through = 0;
      status = pcp_services_replication_batch_build(
          &page, &index, &policies, default_visibility(g),
          PCP_SERVICES_REPLICATION_BATCH_ITEMS, REPLICATION_BATCH_MAX_BYTES,
          &items, &snapshots, &through);
      if (!status &&
          (json_array_size(items) > 0 || json_array_size(snapshots) > 0)) {
        status = batch_send(g, items, snapshots, through, &stats);
        ++batches;
        items_sent += json_array_size(items);
      }
      json_decref(items);
      json_decref(snapshots);
      // The ack (or a batch with nothing eligible) moves the mark: the
      // hub holds everything up to |through| that may leave this gateway.
      if (!status && through > 0) {
        status = pcp_store_mutation_replicated_mark(g->store, through);
        acked = through;
      }
    }
    bool full = page.count == PCP_SERVICES_REPLICATION_PAGE_RECORDS;
    pcp_store_graph_policy_list_deinitialize(&policies);
    pcp_store_mutation_list_deinitialize(&page);
    if (!full) {
      break;
    }
  }
  pthread_mutex_lock(&r->mu);
  r->last_push_at_ms = pcp_clock_wall_ns(g->clock) / 1000000;
  r->batches_sent += batches;
  r->items_sent += items_sent;
  if (acked) {
    r->last_acked_sequence_no = acked;
  }
  if (status) {
    snprintf(r->last_error, sizeof(r->last_error), "%s",
             pcp_status_message(status));
  } else {
    r->last_error[0] = 0;
  }
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&r->cycle_mu);
  return status;
}

// The federation thread's step after each successful connect (so the hub
// knows this gateway before its first batch).
static pcp_status_t replication_step(
    pcp_services_t* g, const pcp_services_federation_link_t* link) {
  (void)link;
  return pcp_services_replication_cycle(g);
}

//===----------------------------------------------------------------------===//
// Query modes
//===----------------------------------------------------------------------===//

pcp_status_t pcp_services_replication_query_run(pcp_services_t* g, json_t* body,
                                                const char* mode,
                                                json_t* local_result,
                                                size_t limit,
                                                json_t** out_result) {
  *out_result = NULL;
  bool global_only = strcmp(mode, "global") == 0;
  if (!global_only && strcmp(mode, "local_plus_global") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'query_mode' must be one of local, global, "
                           "local_plus_global");
  }
  if (!hub_url(g)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field 'query_mode': '%s' needs a federation hub "
                           "(federation.enabled and federation.upstream)",
                           mode);
  }
  json_t* forwarded = json_deep_copy(body);
  json_object_del(forwarded, "query_mode");
  pcp_http_client_options_t options = {.timeout_ms = REPLICATION_HUB_TIMEOUT_MS,
                                       .max_response_bytes = (size_t)32 << 20};
  pcp_http_client_t* client = NULL;
  pcp_http_client_response_t answer = {0};
  pcp_status_t status = pcp_http_client_create(&options, g->allocator, &client);
  // The gateway's route on the hub (federation token); clients use
  // /v1/global-graph/query with the hub's API token.
  if (!status) {
    status = hub_post(g, client, "/v1/federation/global-graph/query", forwarded,
                      &answer);
  } else {
    json_decref(forwarded);
  }
  pcp_http_client_release(client);
  char message[512];
  message[0] = 0;
  json_t* global = NULL;
  if (status) {
    snprintf(message, sizeof(message), "the federation hub query failed: %s",
             pcp_status_message(status));
    pcp_status_ignore(status);
  } else if (answer.http_status != 200) {
    snprintf(message, sizeof(message),
             "the federation hub answered HTTP %d: %.300s", answer.http_status,
             answer.body ? answer.body : "");
  } else {
    global = json_loadb(answer.body, answer.body_length, 0, NULL);
    if (!json_is_object(global) ||
        !json_is_array(json_object_get(global, "entities")) ||
        !json_is_array(json_object_get(global, "relations")) ||
        !json_is_array(json_object_get(global, "observations"))) {
      snprintf(message, sizeof(message),
               "the federation hub's answer is not a graph result");
      json_decref(global);
      global = NULL;
    }
  }
  pcp_http_client_response_deinitialize(&answer);
  if (!global) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "FederationHubQueryFailed: %s", message);
  }
  // The hub filters too; a gateway never shows a local item of another
  // gateway whatever the hub sends.
  pcp_services_replication_result_filter(global, NULL);
  json_t* out = global_only ? json_incref(global)
                            : pcp_services_replication_result_merge(
                                  local_result, global, limit);
  json_decref(global);
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "query result");
  }
  json_object_set_new(out, "query_mode", json_string(mode));
  *out_result = out;
  return pcp_ok_status();
}

pcp_status_t pcp_services_replication_query(pcp_services_t* g, json_t* body,
                                            const char* mode,
                                            json_t* local_result, size_t limit,
                                            pcp_http_response_t* response) {
  json_t* out = NULL;
  pcp_status_t status = pcp_services_replication_query_run(
      g, body, mode, local_result, limit, &out);
  if (pcp_status_code(status) == PCP_STATUS_UNAVAILABLE) {
    // The hub failed, not this gateway: 502 (upstream's status and code).
    pcp_status_t answered = pcp_http_response_error_set(
        response, 502, "FederationHubQueryFailed", pcp_status_message(status));
    pcp_status_ignore(status);
    return answered;
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  return pcp_http_response_json_take(response, 200, out);
}

//===----------------------------------------------------------------------===//
// Lifetime and routes
//===----------------------------------------------------------------------===//

pcp_status_t pcp_services_replication_start(pcp_services_t* g) {
  pcp_services_replication_t* r = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(g->allocator, sizeof(*r), (void**)&r));
  memset(r, 0, sizeof(*r));
  pthread_mutex_init(&r->mu, NULL);
  pthread_mutex_init(&r->cycle_mu, NULL);
  pthread_mutex_init(&r->policy_write_mu, NULL);
  r->policies.allocator = g->allocator;
  r->policies_stale = true;
  g->replication = r;
  if (hub_url(g)) {
    pcp_services_federation_step_set(g, replication_step);
  }
  return pcp_ok_status();
}

void pcp_services_replication_stop(pcp_services_t* g) {
  pcp_services_replication_t* r = g->replication;
  if (!r) {
    return;
  }
  // The federation thread (the only caller of the step) has stopped.
  pcp_http_client_release(r->client);
  pcp_store_graph_policy_list_deinitialize(&r->policies);
  pthread_mutex_destroy(&r->cycle_mu);
  pthread_mutex_destroy(&r->policy_write_mu);
  pthread_mutex_destroy(&r->mu);
  pcp_allocator_free(g->allocator, r);
  g->replication = NULL;
}
