// SPDX-License-Identifier: Apache-2.0
//
// The BUGGIFY hook (base.h "Fault injection"). Kept apart from the rest of
// base so that the one mutable global is easy to find.

#include <stddef.h>

#include "base/base.h"

pcp_buggify_fn_t pcp_buggify_hook_ = NULL;
static void* buggify_user_data = NULL;

void pcp_buggify_install(pcp_buggify_fn_t fn, void* user_data) {
  buggify_user_data = user_data;
  pcp_buggify_hook_ = fn;
}

bool pcp_buggify_fire_(const char* site) {
  pcp_buggify_fn_t fn = pcp_buggify_hook_;
  return fn != NULL && fn(buggify_user_data, site);
}
