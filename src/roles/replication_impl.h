// SPDX-License-Identifier: Apache-2.0
//
// Knowledge-graph replication, the parts the gateway (push, policies, event
// ingest, query modes) and the hub (apply, global query) share: namespace
// policy eligibility, the wire form of a replicated mutation, batch
// building, the visibility filter and the local-first merge of query
// results (docs/federation.md "Graph replication"). Pure functions over
// store records and JSON: no I/O, no locks, all thread-compatible.

#ifndef PCP_ROLES_REPLICATION_IMPL_H_
#define PCP_ROLES_REPLICATION_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "store/store.h"

// Log records a gateway reads per page and items it sends per POST
// (upstream s.6.4: 128 and 64).
#define PCP_ROLES_REPLICATION_PAGE_RECORDS 128u
#define PCP_ROLES_REPLICATION_BATCH_ITEMS 64u
// Items the hub accepts in one POST /v1/federation/mutations, and the body
// cap of that route (64 items of up to 1 MiB JSON each would not fit: a
// gateway sends fewer items when they are large, see _batch_build).
#define PCP_ROLES_REPLICATION_MAX_ITEMS 256u
#define PCP_ROLES_REPLICATION_MAX_BODY_BYTES ((size_t)16 << 20)
// Namespace policy snapshots in one batch.
#define PCP_ROLES_REPLICATION_MAX_POLICIES 256u
// Events in one POST /v1/internal/events (two mutations each).
#define PCP_ROLES_EVENTS_MAX_PER_REQUEST 256u

// The policy of a namespace without one: |default_visibility|, nothing
// replicates (upstream s.6.5).
void pcp_roles_replication_policy_default(
    const char* namespace_id, pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy);

// |namespace_id|'s policy in |policies| (sorted by namespace id, as
// pcp_store_graph_policy_list returns them), else the default.
void pcp_roles_replication_policy_lookup(
    const pcp_store_graph_policy_list_t* policies, const char* namespace_id,
    pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy);

// True when |mutation| may leave its gateway under |policy|: visibility
// shared or global, allow_global_replication, and for observations also
// allow_raw_payload_export (their payload is raw data). policy_update
// records never travel as items (the batch carries policy snapshots).
bool pcp_roles_replication_eligible(const pcp_store_graph_policy_t* policy,
                                    const pcp_store_mutation_t* mutation);

// True when an item of |visibility| and |kind| ("entity", "relation",
// "observation") in a namespace under |policy| may be answered by a global
// query. NULL |policy|: visibility alone decides.
bool pcp_roles_replication_visible_globally(
    const pcp_store_graph_policy_t* policy, pcp_store_visibility_t visibility,
    bool is_observation);

// {namespace_id, default_visibility, allow_global_replication,
// allow_raw_payload_export, updated_at_ms}. NULL on OOM.
json_t* pcp_roles_replication_policy_json(
    const pcp_store_graph_policy_t* policy);

// Applies the keys of |update| (an object with any of default_visibility,
// allow_global_replication, allow_raw_payload_export) to |inout_policy|.
// INVALID_ARGUMENT naming the key for a wrong type, an unknown visibility or
// an unknown key. With |allow_snapshot_keys| the keys namespace_id and
// updated_at_ms are accepted and ignored (a snapshot sent by a gateway).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_replication_policy_update(json_t* update, bool allow_snapshot_keys,
                                    pcp_store_graph_policy_t* inout_policy);

// The payload of a policy_update record holding |policy| in full.
json_t* pcp_roles_replication_policy_payload(
    const pcp_store_graph_policy_t* policy);

// Wire form of one replicated record: {sequence_no, mutation_id,
// namespace_id, mutation_type, target_id, payload_json, visibility,
// provenance_json, timestamp_ns}; the two *_json fields hold JSON text (as
// upstream). NULL on OOM.
json_t* pcp_roles_replication_item_json(const pcp_store_mutation_t* mutation);

// Parses a wire item into |out_mutation| (payload and provenance are new
// references: release with pcp_roles_replication_item_deinitialize, also
// after an error). INVALID_ARGUMENT naming the field.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_replication_item_parse(
    json_t* item, pcp_store_mutation_t* out_mutation);
void pcp_roles_replication_item_deinitialize(pcp_store_mutation_t* mutation);

// Builds one batch from |page| (log records in sequence order) starting at
// |*inout_index|: eligible records (under |policies|, namespaces without a
// policy get |default_visibility| and replicate nothing) become items, up to
// |max_items| and about |max_bytes| of item text (at least one item);
// ineligible ones are skipped. |*inout_index| moves past every record
// examined and |*out_through| is the sequence number of the last one (0 when
// none was examined), which the sender may mark replicated once the batch is
// acknowledged (or at once when nothing is to be sent). |*out_policies|
// holds the snapshot in force of each namespace with an item or with a
// policy_update record among those examined, once: a batch with policies
// but no items is still sent. New references.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_replication_batch_build(
    const pcp_store_mutation_list_t* page, size_t* inout_index,
    const pcp_store_graph_policy_list_t* policies,
    pcp_store_visibility_t default_visibility, size_t max_items,
    size_t max_bytes, json_t** out_items, json_t** out_policies,
    int64_t* out_through);

// Removes from |result| ({entities, relations, observations} as the graph
// query routes answer) every item a global query must not answer (see
// _visible_globally; |policies| NULL: visibility alone). An item whose
// visibility is missing or unknown is removed.
void pcp_roles_replication_result_filter(
    json_t* result, const pcp_store_graph_policy_list_t* policies);

// local_plus_global: a new result with |local|'s items first, then
// |global|'s items whose id (entity_id, relation_id, observation_id) is not
// already there, each array cut at |limit| (0: no cut). NULL on OOM.
json_t* pcp_roles_replication_result_merge(json_t* local, json_t* global,
                                           size_t limit);

// One ingested event (upstream s.6.6) as its two mutations:
// "{event_id}:subject" (upsert_entity of job:{job_id} or
// service:{service_id}) and "{event_id}:observation" (append_observation).
// |namespace_id| is the event's or "{lab_id}/shared"; |visibility| is
// filled by the caller afterwards (the namespace's default). The mutations
// own their payload and provenance (release both with
// pcp_roles_replication_item_deinitialize, also after an error).
// INVALID_ARGUMENT naming the field for a bad event.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_replication_event_mutations(
    json_t* event, const char* gateway_id, const char* lab_id,
    pcp_store_mutation_t out_mutations[2]);

// The JSON answer of a graph query (/v1/graph/query on a gateway,
// /v1/global-graph/query on the hub): {entities, relations, observations}
// with every field of each item. New reference.
json_t* pcp_roles_graph_result_json(const pcp_store_graph_result_t* result);

// Reads a graph query body (upstream s.6.6 QueryRequest: entity_id,
// namespace_id, entity_type, relation_type, text, query_mode, limit) into
// |out_query| (strings borrowed from |body|) and |out_mode| ("local" when
// absent). Every filter is a string of at most PCP_STORE_ID_MAX_LENGTH
// bytes, query_mode one of local, global, local_plus_global, limit an
// integer in [1, PCP_STORE_LIST_LIMIT_MAX]. NULL when valid; else the rule
// broken, with the field in |out_key| (NULL: the body itself).
const char* pcp_roles_graph_query_parse(json_t* body,
                                        pcp_store_graph_query_t* out_query,
                                        const char** out_mode,
                                        const char** out_key);
// The same, with a broken rule as an INVALID_ARGUMENT status naming the
// field (the HTTP routes answer it as a 400).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_graph_query_read(
    json_t* body, pcp_store_graph_query_t* out_query, const char** out_mode);

#endif  // PCP_ROLES_REPLICATION_IMPL_H_
