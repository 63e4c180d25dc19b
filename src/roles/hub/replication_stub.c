// SPDX-License-Identifier: Apache-2.0
// Placeholder until graph replication (replication.c) lands: the hub serves
// no replication routes. replication.c replaces this file (delete it and
// list replication.c in src/roles/CMakeLists.txt); a weak symbol would not
// do, since the linker never pulls a strong one out of a static library
// once a weak one is defined.

#include "roles/hub/hub_impl.h"

pcp_status_t pcp_roles_hub_replication_routes_add(pcp_roles_hub_t* hub) {
  (void)hub;
  return pcp_ok_status();
}
