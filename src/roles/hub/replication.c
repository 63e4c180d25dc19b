// SPDX-License-Identifier: Apache-2.0
// The hub's half of knowledge-graph replication (docs/federation.md "Graph
// replication"): POST /v1/federation/mutations applies a gateway's batch
// exactly once (apply + ack in one transaction), the global graph routes
// answer only what may be seen globally, GET /v1/graph/policies lists the
// policy snapshots gateways sent.
//
// The replicated graph lives in the hub's own store (graph tables + mutation
// log); the hub's policies in its federation_policies table, one snapshot
// per namespace, last writer wins by the gateway's updated_at_ms.

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roles/hub/hub_impl.h"
#include "services/services.h"

// The handlers' state is the hub's (store, allocator); user_data is the
// pcp_roles_hub_t. One hub per process, so the lock that serializes the
// read-compare-write of policy snapshots is a static.
typedef pcp_roles_hub_t pcp_roles_hub_replication_t;
static pthread_mutex_t policy_mu = PTHREAD_MUTEX_INITIALIZER;

// The hub's policies as a sorted list (namespace ids ascending, as
// pcp_store_federation_policy_list returns them).
static pcp_status_t policies_load(pcp_roles_hub_replication_t* r,
                                  pcp_store_graph_policy_list_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = r->allocator;
  json_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_federation_policy_list(r->store, &map));
  size_t count = json_object_size(map);
  pcp_status_t status = pcp_ok_status();
  if (count) {
    status = pcp_allocator_malloc(r->allocator, count * sizeof(*out->items),
                                  (void**)&out->items);
  }
  const char* key;
  json_t* value;
  json_object_foreach(map, key, value) {
    if (status) {
      break;
    }
    pcp_store_graph_policy_t* p = &out->items[out->count++];
    pcp_services_replication_policy_default(key, PCP_STORE_VISIBILITY_LOCAL, p);
    // Stored by this file: a snapshot that passed the same check.
    pcp_status_ignore(pcp_services_replication_policy_update(value, true, p));
    json_t* at = json_object_get(value, "updated_at_ms");
    p->updated_at_ns =
        json_is_integer(at) ? json_integer_value(at) * 1000000 : 0;
  }
  json_decref(map);
  if (status) {
    pcp_store_graph_policy_list_deinitialize(out);
    return status;
  }
  // jansson iterates in insertion order, which follows the store's id
  // order; sort anyway, as lookups rely on it.
  for (size_t i = 1; i < out->count; ++i) {
    pcp_store_graph_policy_t item = out->items[i];
    size_t j = i;
    while (j > 0 &&
           strcmp(out->items[j - 1].namespace_id, item.namespace_id) > 0) {
      out->items[j] = out->items[j - 1];
      --j;
    }
    out->items[j] = item;
  }
  return pcp_ok_status();
}

// Applies |snapshots| (validated first, all or none), each only when newer
// than the hub's copy, and leaves the policies then in force in
// |out_policies| (release with _deinitialize; also after an error).
static pcp_status_t snapshots_apply(
    pcp_roles_hub_replication_t* r, json_t* snapshots,
    pcp_store_graph_policy_list_t* out_policies) {
  memset(out_policies, 0, sizeof(*out_policies));
  size_t i;
  json_t* snapshot;
  json_array_foreach(snapshots, i, snapshot) {
    pcp_store_graph_policy_t p;
    pcp_services_replication_policy_default("", PCP_STORE_VISIBILITY_LOCAL, &p);
    const char* ns =
        json_string_value(json_object_get(snapshot, "namespace_id"));
    json_t* at = json_object_get(snapshot, "updated_at_ms");
    // updated_at_ms becomes nanoseconds below: out of range it would
    // overflow (and a huge one would win every later comparison).
    if (!ns || !ns[0] || strlen(ns) > PCP_STORE_ID_MAX_LENGTH ||
        !json_is_integer(at) || json_integer_value(at) < 0 ||
        json_integer_value(at) > INT64_MAX / 1000000) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "namespace_policies[%zu] needs namespace_id and "
                             "an integer updated_at_ms in [0, %lld]",
                             i, (long long)(INT64_MAX / 1000000));
    }
    pcp_status_t status =
        pcp_services_replication_policy_update(snapshot, true, &p);
    if (status) {
      pcp_status_t wrapped = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                             "namespace_policies[%zu]: %s", i,
                                             pcp_status_message(status));
      pcp_status_ignore(status);
      return wrapped;
    }
  }
  pthread_mutex_lock(&policy_mu);
  pcp_store_graph_policy_list_t current;
  pcp_status_t status = policies_load(r, &current);
  bool changed = false;
  json_array_foreach(snapshots, i, snapshot) {
    if (status) {
      break;
    }
    const char* ns =
        json_string_value(json_object_get(snapshot, "namespace_id"));
    int64_t at_ns =
        json_integer_value(json_object_get(snapshot, "updated_at_ms")) *
        1000000;
    pcp_store_graph_policy_t existing;
    pcp_services_replication_policy_lookup(
        &current, ns, PCP_STORE_VISIBILITY_LOCAL, &existing);
    bool known = existing.updated_at_ns != 0 ||
                 existing.allow_global_replication ||
                 existing.allow_raw_payload_export;
    if (known && existing.updated_at_ns >= at_ns) {
      continue;  // last writer wins; an older or equal snapshot is stale
    }
    status = pcp_store_federation_policy_put(r->store, ns, snapshot);
    changed = true;
  }
  if (!status && changed) {
    pcp_store_graph_policy_list_deinitialize(&current);
    status = policies_load(r, &current);
  }
  pthread_mutex_unlock(&policy_mu);
  if (status) {
    pcp_store_graph_policy_list_deinitialize(&current);
    return status;
  }
  // Usually unchanged: the batch's own checks reuse this read.
  *out_policies = current;
  return pcp_ok_status();
}

// Known to the registry (connected, stale or restored after a restart).
static bool gateway_registered(pcp_roles_hub_t* hub, const char* gateway_id) {
  pcp_sched_federation_gateway_t g;
  pthread_mutex_lock(&hub->mutex);
  pcp_status_t status = pcp_sched_federation_gateway_find(
      hub->registry, gateway_id, pcp_clock_now_ns(hub->clock), &g);
  pthread_mutex_unlock(&hub->mutex);
  bool found = !status;
  pcp_status_ignore(status);
  return found;
}

static size_t gateway_count(pcp_roles_hub_t* hub) {
  pthread_mutex_lock(&hub->mutex);
  size_t count = pcp_sched_federation_gateway_count(hub->registry);
  pthread_mutex_unlock(&hub->mutex);
  return count;
}

// The hub's id of a replicated record: "{gateway_id}:{mutation_id}", so two
// gateways' unnamed records ("mut_1") never collide; when that is too long,
// the sender's id is replaced by its SHA-256.
static void hub_mutation_id(const char* gateway_id, pcp_store_mutation_t* m) {
  char id[sizeof(m->mutation_id)];
  int n = snprintf(id, sizeof(id), "%s:%s", gateway_id, m->mutation_id);
  if (n < 0 || (size_t)n >= sizeof(id)) {
    pcp_sha256_t digest;
    pcp_sha256_compute(m->mutation_id, strlen(m->mutation_id), &digest);
    int length = snprintf(id, sizeof(id), "%s:sha256-", gateway_id);
    for (size_t i = 0; i < sizeof(digest.bytes) && length + 2 < (int)sizeof(id);
         ++i) {
      length += snprintf(id + length, sizeof(id) - (size_t)length, "%02x",
                         digest.bytes[i]);
    }
  }
  memcpy(m->mutation_id, id, sizeof(id));
}

static pcp_status_t integer_field(json_t* body, const char* key, bool required,
                                  int64_t* out) {
  json_t* v = json_object_get(body, key);
  *out = 0;
  if (!v && !required) {
    return pcp_ok_status();
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be a non-negative integer", key);
  }
  *out = json_integer_value(v);
  return pcp_ok_status();
}

// Counters of the mutations route (registered with the hub's other
// metrics; looked up by name in the handler, a cold path).
#define METRIC_MUTATIONS "pcp_hub_replicated_mutations_total"
#define METRIC_BATCHES "pcp_hub_replication_batches_total"

static void metrics_count(pcp_roles_hub_t* hub, pcp_status_t status,
                          size_t applied, size_t duplicates) {
  pcp_obs_family_t* batches =
      pcp_obs_registry_find(hub->metrics, METRIC_BATCHES);
  pcp_obs_family_t* family =
      pcp_obs_registry_find(hub->metrics, METRIC_MUTATIONS);
  if (!batches || !family) {
    return;  // registered by routes_add; absent only in a broken build
  }
  const char* batch[] = {status ? "rejected" : "accepted"};
  pcp_obs_family_add(batches, batch, 1);
  if (!status) {
    const char* applied_label[] = {"applied"};
    const char* duplicate_label[] = {"duplicate"};
    pcp_obs_family_add(family, applied_label, (double)applied);
    pcp_obs_family_add(family, duplicate_label, (double)duplicates);
  }
}

static pcp_status_t mutations_post(void* user_data,
                                   const pcp_http_request_t* request,
                                   pcp_http_response_t* response) {
  pcp_roles_hub_replication_t* r = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  const char* gateway_id =
      json_string_value(json_object_get(body, "gateway_id"));
  json_t* items = json_object_get(body, "mutations");
  json_t* snapshots = json_object_get(body, "namespace_policies");
  int64_t through = 0, last = 0;
  pcp_status_t status = pcp_ok_status();
  if (!gateway_id || !gateway_id[0] ||
      strlen(gateway_id) > PCP_STORE_ID_MAX_LENGTH) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'gateway_id' must be a non-empty string of "
                             "at most %d bytes",
                             PCP_STORE_ID_MAX_LENGTH);
  } else if (!json_is_array(items) ||
             json_array_size(items) > PCP_SERVICES_REPLICATION_MAX_ITEMS) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'mutations' must be an array of at most %u "
                             "items",
                             PCP_SERVICES_REPLICATION_MAX_ITEMS);
  } else if (snapshots && (!json_is_array(snapshots) ||
                           json_array_size(snapshots) >
                               PCP_SERVICES_REPLICATION_MAX_POLICIES)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'namespace_policies' must be an array of "
                             "at most %u snapshots",
                             PCP_SERVICES_REPLICATION_MAX_POLICIES);
  }
  if (!status) {
    status = integer_field(body, "through_sequence_no", true, &through);
  }
  if (!status) {
    status = integer_field(body, "last_sequence_no", false, &last);
  }
  if (!status) {
    if (!gateway_registered(r, gateway_id)) {
      // Checked before anything is applied (upstream stored the batch and
      // then answered UnknownGateway).
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "UnknownGateway: gateway '%s' is not "
                               "registered (POST /v1/federation/connect first)",
                               gateway_id);
    }
  }
  pcp_store_graph_policy_list_t policies = {0};
  if (!status) {
    status = snapshots_apply(r, snapshots, &policies);
  }
  size_t count = status ? 0 : json_array_size(items);
  pcp_store_mutation_t* parsed = NULL;
  if (count) {
    status = pcp_allocator_malloc(r->allocator, count * sizeof(*parsed),
                                  (void**)&parsed);
    if (!status) {
      memset(parsed, 0, count * sizeof(*parsed));
    }
  }
  for (size_t i = 0; !status && i < count; ++i) {
    status = pcp_services_replication_item_parse(json_array_get(items, i),
                                                 &parsed[i]);
    if (!status) {
      if (parsed[i].sequence_no > through) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "sequence_no %lld is past "
                                 "through_sequence_no %lld",
                                 (long long)parsed[i].sequence_no,
                                 (long long)through);
      }
    }
    if (!status) {
      // One item the policy forbids rejects the whole batch (upstream
      // PolicyRejected): the gateway's policy and the hub's disagree.
      pcp_store_graph_policy_t policy;
      pcp_services_replication_policy_lookup(&policies, parsed[i].namespace_id,
                                             PCP_STORE_VISIBILITY_LOCAL,
                                             &policy);
      if (!pcp_services_replication_eligible(&policy, &parsed[i])) {
        status = pcp_make_status(
            PCP_STATUS_FAILED_PRECONDITION,
            "PolicyRejected: mutation '%s' (%s, %s) is not allowed to "
            "replicate under namespace '%s''s policy",
            parsed[i].mutation_id,
            pcp_store_mutation_type_name(parsed[i].mutation_type),
            pcp_store_visibility_name(parsed[i].visibility),
            parsed[i].namespace_id);
      }
    }
    if (!status) {
      hub_mutation_id(gateway_id, &parsed[i]);
    }
    if (status) {
      pcp_status_t wrapped =
          pcp_make_status(pcp_status_code(status), "mutations[%zu]: %s", i,
                          pcp_status_message(status));
      pcp_status_ignore(status);
      status = wrapped;
    }
  }
  size_t applied = 0, duplicates = 0;
  if (!status) {
    status = pcp_store_graph_mutation_batch_apply(r->store, gateway_id, parsed,
                                                  count, through, last,
                                                  &applied, &duplicates);
  }
  for (size_t i = 0; i < count; ++i) {
    pcp_services_replication_item_deinitialize(&parsed[i]);
  }
  if (parsed) {
    pcp_allocator_free(r->allocator, parsed);
  }
  pcp_store_graph_policy_list_deinitialize(&policies);
  json_decref(body);
  metrics_count(r, status, applied, duplicates);
  PCP_RETURN_IF_ERROR_BARE(status);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:b, s:I, s:I, s:I}", "accepted", 1, "acked_sequence_no",
                (json_int_t)through, "applied_count", (json_int_t)applied,
                "duplicate_count", (json_int_t)duplicates));
}

//===----------------------------------------------------------------------===//
// Global graph
//===----------------------------------------------------------------------===//

static pcp_status_t global_query(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  pcp_roles_hub_replication_t* r = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  pcp_store_graph_query_t q;
  const char* mode;  // unused: the hub holds one graph, its own
  pcp_status_t status = pcp_services_graph_query_read(body, &q, &mode);
  // The visibility filter runs after the store query, so asking the store
  // for |limit| items would let hidden ones (local, or in a namespace whose
  // policy was revoked) crowd out visible ones and answer a short page.
  // Fetch the most the store returns, filter, then cut to |limit|.
  uint32_t wanted = q.limit ? q.limit : 20;
  q.limit = PCP_STORE_LIST_LIMIT_MAX;
  pcp_store_graph_result_t result = {0};
  if (!status) {
    status = pcp_store_graph_query(r->store, &q, &result);
  }
  pcp_store_graph_policy_list_t policies = {0};
  if (!status) {
    status = policies_load(r, &policies);
  }
  json_decref(body);
  if (status) {
    pcp_store_graph_result_deinitialize(&result);
    return status;
  }
  json_t* out = pcp_services_graph_result_json(&result);
  pcp_store_graph_result_deinitialize(&result);
  // Only what was replicated as shared/global and is still allowed by the
  // namespace's policy (a policy that stops replication also hides what
  // the hub already holds).
  pcp_services_replication_result_filter(out, &policies);
  pcp_store_graph_policy_list_deinitialize(&policies);
  static const char* const kArrays[] = {"entities", "relations",
                                        "observations"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kArrays); ++i) {
    json_t* items = json_object_get(out, kArrays[i]);
    while (json_array_size(items) > wanted) {
      json_array_remove(items, json_array_size(items) - 1);
    }
  }
  return pcp_http_response_json_take(response, 200, out);
}

// Lag of each gateway and the max, with the registered gateway count.
static pcp_status_t gateways_json(pcp_roles_hub_replication_t* r,
                                  json_t** out_gateways, int64_t* out_max_lag,
                                  size_t* out_registered) {
  *out_gateways = NULL;
  *out_max_lag = 0;
  *out_registered = gateway_count(r);
  pcp_store_replication_peer_list_t peers;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_replication_peer_list(r->store, &peers));
  json_t* array = json_array();
  for (size_t i = 0; array && i < peers.count; ++i) {
    const pcp_store_replication_peer_t* p = &peers.items[i];
    int64_t lag = p->last_sequence_no > p->acked_sequence_no
                      ? p->last_sequence_no - p->acked_sequence_no
                      : 0;
    if (lag > *out_max_lag) {
      *out_max_lag = lag;
    }
    json_array_append_new(
        array,
        json_pack("{s:s, s:I, s:I, s:I}", "gateway_id", p->peer_id,
                  "last_sequence_no", (json_int_t)p->last_sequence_no,
                  "last_replicated_sequence", (json_int_t)p->acked_sequence_no,
                  "replication_lag", (json_int_t)lag));
  }
  pcp_store_replication_peer_list_deinitialize(&peers);
  if (!array) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "gateways");
  }
  *out_gateways = array;
  return pcp_ok_status();
}

static pcp_status_t global_status(void* user_data,
                                  const pcp_http_request_t* request,
                                  pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_replication_t* r = user_data;
  pcp_store_graph_log_counts_t counts;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_graph_log_counts_query(r->store, &counts));
  json_t* gateways = NULL;
  int64_t max_lag = 0;
  size_t registered = 0;
  PCP_RETURN_IF_ERROR_BARE(gateways_json(r, &gateways, &max_lag, &registered));
  json_decref(gateways);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:s, s:I, s:b, s:I, s:{s:I, s:I, s:I, s:I, s:I}}", "mode",
                "hub", "registered_gateways", (json_int_t)registered,
                "replication_enabled", 1, "max_replication_lag",
                (json_int_t)max_lag, "global_graph", "namespaces",
                (json_int_t)counts.namespace_count, "entities",
                (json_int_t)counts.entity_count, "relations",
                (json_int_t)counts.relation_count, "observations",
                (json_int_t)counts.observation_count, "mutations",
                (json_int_t)counts.mutation_count));
}

static pcp_status_t global_replication(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_replication_t* r = user_data;
  pcp_store_graph_log_counts_t counts;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_graph_log_counts_query(r->store, &counts));
  json_t* gateways = NULL;
  int64_t max_lag = 0;
  size_t registered = 0;
  PCP_RETURN_IF_ERROR_BARE(gateways_json(r, &gateways, &max_lag, &registered));
  pcp_store_namespace_stats_list_t stats;
  pcp_status_t status = pcp_store_namespace_stats_list(r->store, &stats);
  pcp_store_graph_policy_list_t policies = {0};
  if (!status) {
    status = policies_load(r, &policies);
  }
  if (status) {
    json_decref(gateways);
    pcp_store_namespace_stats_list_deinitialize(&stats);
    return status;
  }
  json_t* namespaces = json_array();
  for (size_t i = 0; namespaces && i < stats.count; ++i) {
    const pcp_store_namespace_stats_t* s = &stats.items[i];
    pcp_store_graph_policy_t policy;
    pcp_services_replication_policy_lookup(&policies, s->namespace_id,
                                           PCP_STORE_VISIBILITY_LOCAL, &policy);
    json_t* item = pcp_services_replication_policy_json(&policy);
    json_t* extra = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "total_mutations",
        (json_int_t)s->total_count, "shared_mutations",
        (json_int_t)s->visibility_counts[PCP_STORE_VISIBILITY_SHARED],
        "global_mutations",
        (json_int_t)s->visibility_counts[PCP_STORE_VISIBILITY_GLOBAL],
        "entity_mutations", (json_int_t)s->entity_count, "relation_mutations",
        (json_int_t)s->relation_count, "observation_mutations",
        (json_int_t)s->observation_count, "last_sequence_no",
        (json_int_t)s->last_sequence_no, "pending_mutations", (json_int_t)0,
        "replication_lag", (json_int_t)0);
    json_object_update(item, extra);
    json_decref(extra);
    json_array_append_new(namespaces, item);
  }
  pcp_store_namespace_stats_list_deinitialize(&stats);
  pcp_store_graph_policy_list_deinitialize(&policies);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:s, s:I, s:I, s:{s:I, s:I}, s:o, s:o}", "mode", "hub",
                "registered_gateways", (json_int_t)registered,
                "max_replication_lag", (json_int_t)max_lag, "global_graph",
                "namespaces", (json_int_t)counts.namespace_count, "mutations",
                (json_int_t)counts.mutation_count, "gateways", gateways,
                "namespaces", namespaces));
}

static pcp_status_t policies_get(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_replication_t* r = user_data;
  pcp_store_graph_policy_list_t policies;
  PCP_RETURN_IF_ERROR_BARE(policies_load(r, &policies));
  json_t* array = json_array();
  for (size_t i = 0; array && i < policies.count; ++i) {
    json_array_append_new(
        array, pcp_services_replication_policy_json(&policies.items[i]));
  }
  pcp_store_graph_policy_list_deinitialize(&policies);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "policies", array));
}

//===----------------------------------------------------------------------===//
// Routes
//===----------------------------------------------------------------------===//

pcp_status_t pcp_roles_hub_replication_routes_add(pcp_roles_hub_t* hub) {
  static const char* const kResult[] = {"result", NULL};
  // Static: the registry keeps pointers to its definitions.
  static const pcp_obs_metric_def_t metrics[] = {
      {METRIC_MUTATIONS, PCP_OBS_METRIC_TYPE_COUNTER,
       "Replicated graph mutations by result (applied, duplicate: already "
       "held, skipped)",
       kResult, NULL, 0, 4},
      {METRIC_BATCHES, PCP_OBS_METRIC_TYPE_COUNTER,
       "POST /v1/federation/mutations batches by result (accepted, "
       "rejected)",
       kResult, NULL, 0, 4},
  };
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_register(
      hub->metrics, metrics, PCP_ARRAYSIZE(metrics), NULL));
  const pcp_http_route_t routes[] = {
      {"POST", "/v1/federation/mutations", PCP_ROLES_HUB_SCOPE_FEDERATION,
       mutations_post, hub, PCP_SERVICES_REPLICATION_MAX_BODY_BYTES, 0},
      // Gateways' global queries (federation token); clients use
      // /v1/global-graph/query with the API token. A route has one scope.
      {"POST", "/v1/federation/global-graph/query",
       PCP_ROLES_HUB_SCOPE_FEDERATION, global_query, hub, 0, 0},
      {"POST", "/v1/global-graph/query", PCP_ROLES_HUB_SCOPE_API, global_query,
       hub, 0, 0},
      {"GET", "/v1/global-graph/status", PCP_ROLES_HUB_SCOPE_API, global_status,
       hub, 0, 0},
      {"GET", "/v1/global-graph/replication", PCP_ROLES_HUB_SCOPE_API,
       global_replication, hub, 0, 0},
      {"GET", "/v1/graph/policies", PCP_ROLES_HUB_SCOPE_API, policies_get, hub,
       0, 0},
  };
  return pcp_roles_hub_routes_add(hub, routes, PCP_ARRAYSIZE(routes));
}
