// SPDX-License-Identifier: Apache-2.0
// process_* and pcp_build_info for every server role: the versions come
// from the wheels' dist-info directories in the venv (no compiler run, so
// a node manager that never compiles pays nothing for them).

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "roles/roles_impl.h"

// "<prefix><version>.dist-info" in the venv's site-packages; "" when absent.
static void wheel_version(const char* prefix, char* buffer, size_t capacity) {
  buffer[0] = 0;
  char site[4096];
  pcp_status_t status = pcp_venv_site_packages(site, sizeof(site));
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  DIR* dir = opendir(site);
  if (!dir) {
    return;
  }
  size_t prefix_length = strlen(prefix);
  struct dirent* entry;
  while ((entry = readdir(dir)) != NULL) {
    const char* name = entry->d_name;
    const char* suffix = strstr(name, ".dist-info");
    if (strncmp(name, prefix, prefix_length) != 0 || !suffix) {
      continue;
    }
    size_t n = (size_t)(suffix - name) - prefix_length;
    if (n >= capacity) {
      n = capacity - 1;
    }
    memcpy(buffer, name + prefix_length, n);
    buffer[n] = 0;
    break;
  }
  closedir(dir);
}

pcp_status_t pcp_roles_process_metrics_register(pcp_obs_registry_t* registry,
                                                const char* role) {
  char compiler[64], runtime[64];
  wheel_version("iree_base_compiler-", compiler, sizeof(compiler));
  wheel_version("iree_base_runtime-", runtime, sizeof(runtime));
  pcp_obs_build_info_t info = {
      .version = PCP_VERSION_STRING,
      .iree_compiler = compiler,
      .iree_runtime = runtime,
      .role = role,
  };
  return pcp_obs_process_metrics_register(registry, &info);
}
