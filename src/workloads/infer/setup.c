// SPDX-License-Identifier: Apache-2.0
//
// The inference service as a gateway serves it (moved from the gateway's
// start, issue 14): models under <state_dir>/models (training jobs export
// them there) and the --model-dir values, each a comma-separated list.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static pcp_status_t too_many_dirs(void) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "--model-dir: at most %d directories",
                         PCP_INFER_MAX_MODEL_DIRS);
}

pcp_status_t pcp_infer_service_create_in_state_dir(
    const pcp_infer_service_options_t* base, const char* state_dir,
    const char* const* model_dir_values, size_t model_dir_value_count,
    pcp_allocator_t allocator, pcp_infer_service_t** out_service) {
  const char* dirs[PCP_INFER_MAX_MODEL_DIRS];
  size_t dir_count = 0;
  char* copies[PCP_INFER_MAX_MODEL_DIRS];
  size_t copy_count = 0;
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < model_dir_value_count && !status; ++i) {
    if (copy_count >= PCP_INFER_MAX_MODEL_DIRS) {
      status = too_many_dirs();
      break;
    }
    char* copy = NULL;
    status = pcp_allocator_strdup(allocator, model_dir_values[i], &copy);
    if (status) {
      // As before the move: a copy that fails reads as too many.
      pcp_status_ignore(status);
      status = too_many_dirs();
      break;
    }
    copies[copy_count++] = copy;
    char* save = NULL;
    for (char* part = strtok_r(copy, ",", &save); part;
         part = strtok_r(NULL, ",", &save)) {
      if (!part[0]) {
        continue;
      }
      if (dir_count >= PCP_INFER_MAX_MODEL_DIRS) {
        status = too_many_dirs();
        break;
      }
      dirs[dir_count++] = part;
    }
  }
  char models_root[PCP_STORE_PATH_MAX_LENGTH + 16];
  char artifacts[PCP_STORE_PATH_MAX_LENGTH + 16];
  snprintf(models_root, sizeof(models_root), "%s/models", state_dir);
  snprintf(artifacts, sizeof(artifacts), "%s/artifacts", state_dir);
  pcp_infer_service_options_t options = *base;
  options.artifact_dir = artifacts;
  options.models_root = models_root;
  options.model_dirs = dirs;
  options.model_dir_count = dir_count;
  // Test hook: a pause per scheduling round, so a test can hold a request
  // in flight across a model reload (tests/integration).
  const char* delay = getenv("PCP_GATEWAY_TEST_INFER_STEP_DELAY_MS");
  if (delay && atoll(delay) > 0 && atoll(delay) <= 10000) {
    options.test_step_delay_ms = atoll(delay);
  }
  if (!status) {
    status = pcp_infer_service_create(&options, allocator, out_service);
  }
  for (size_t i = 0; i < copy_count; ++i) {
    pcp_allocator_free(allocator, copies[i]);
  }
  return status;
}
