// SPDX-License-Identifier: Apache-2.0
// The services' lifecycle (services.h): create opens the graph backend,
// start links the gateway's engines and makes replication and the
// federation state, stop and release undo them in reverse.

#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

pcp_status_t pcp_services_create(const pcp_services_options_t* options,
                                 pcp_allocator_t allocator,
                                 pcp_services_t** out_services) {
  *out_services = NULL;
  pcp_services_t* svc = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, sizeof(*svc), (void**)&svc));
  memset(svc, 0, sizeof(*svc));
  svc->config = options->config;
  svc->allocator = allocator;
  svc->clock = options->clock;
  svc->log = options->log;
  svc->event_log = options->event_log;
  svc->store = options->store;
  *out_services = svc;
  return pcp_services_graph_open(svc);
}

pcp_status_t pcp_services_start(pcp_services_t* svc,
                                const pcp_services_links_t* links) {
  svc->fabric = links->fabric;
  svc->infer = links->infer;
  svc->http = links->http;
  svc->draining = links->draining;
  PCP_RETURN_IF_ERROR_BARE(pcp_services_replication_start(svc));
  PCP_RETURN_IF_ERROR_BARE(pcp_services_federation_create(svc));
  pcp_services_proxy_reset();
  pcp_services_openai_limits_reset();
  return pcp_ok_status();
}

void pcp_services_stop(pcp_services_t* svc) {
  if (!svc) {
    return;
  }
  pcp_services_replication_stop(svc);
}

void pcp_services_release(pcp_services_t* svc) {
  if (!svc) {
    return;
  }
  pcp_services_graph_close(svc);
  pcp_allocator_free(svc->allocator, svc);
}

bool pcp_services_draining(const pcp_services_t* svc) {
  return svc->draining && atomic_load(svc->draining);
}

const char* pcp_services_graph_backend_name(const pcp_services_t* svc) {
  return svc && svc->graph ? pcp_store_graph_backend_name(svc->graph)
                           : "sqlite";
}
