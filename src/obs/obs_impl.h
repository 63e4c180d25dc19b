// SPDX-License-Identifier: Apache-2.0
//
// Private to src/obs: hooks between the registry (metrics.c) and the
// built-in collectors (process.c).

#ifndef PCP_OBS_OBS_IMPL_H_
#define PCP_OBS_OBS_IMPL_H_

#include "obs/obs.h"

// As pcp_obs_registry_collector_add, and the registry frees |user_data|
// (with its allocator) when it is released.
PCP_MUST_USE_RESULT pcp_status_t pcp_obs_registry_collector_add_owned(
    pcp_obs_registry_t* registry, pcp_obs_collect_fn_t fn, void* user_data);

// The registry's allocator, for blocks handed to _add_owned.
pcp_allocator_t pcp_obs_registry_allocator(pcp_obs_registry_t* registry);

#endif  // PCP_OBS_OBS_IMPL_H_
