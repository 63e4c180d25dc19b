// SPDX-License-Identifier: Apache-2.0
//
// The hub's graph replication routes (hub/replication.c; docs/federation.md
// "Graph replication"). The hub creates one after its HTTP server and store
// exist and releases it after the server has stopped.

#ifndef PCP_ROLES_HUB_REPLICATION_IMPL_H_
#define PCP_ROLES_HUB_REPLICATION_IMPL_H_

#include "http/http.h"
#include "store/store.h"

typedef struct pcp_roles_hub_replication_options_t {
  pcp_http_server_t* http;  // routes are added to it (before its start)
  pcp_store_t* store;       // the hub's store; outlives the replication
  // Token scopes: clients (GET /v1/global-graph/*, POST
  // /v1/global-graph/query, GET /v1/graph/policies) and gateways (POST
  // /v1/federation/mutations, POST /v1/federation/global-graph/query).
  // NULL: open.
  const char* client_scope;
  const char* federation_scope;
} pcp_roles_hub_replication_options_t;

typedef struct pcp_roles_hub_replication_t pcp_roles_hub_replication_t;

// Adds the routes. Handlers are thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_hub_replication_create(
    const pcp_roles_hub_replication_options_t* options,
    pcp_allocator_t allocator, pcp_roles_hub_replication_t** out_replication);
// NULL is a no-op.
void pcp_roles_hub_replication_release(
    pcp_roles_hub_replication_t* replication);

#endif  // PCP_ROLES_HUB_REPLICATION_IMPL_H_
