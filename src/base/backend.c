// SPDX-License-Identifier: Apache-2.0
//
// The one table of device kinds (base.h "Backends"). Before it, seven
// modules each kept their own list of names in their own order, and one of
// them accepted "hip" where the others did not; every spelling a user may
// write is now a row here, and what a caller accepts is a flag, not a copy.

#include <string.h>

#include "base/base.h"

static const char* const kCudaEnv[] = {"CUDA_VISIBLE_DEVICES", NULL};
// ROCm reads these in this order; the first one set wins, even when empty.
static const char* const kRocmEnv[] = {
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", NULL};
static const char* const kNoEnv[] = {NULL};

// Indexed by pcp_backend_kind_t; the order is the canonical one.
static const pcp_backend_kind_info_t kBackends[PCP_BACKEND_KIND_COUNT_] = {
    {PCP_BACKEND_KIND_CPU, "cpu", "local-task", "local", "host", kNoEnv},
    {PCP_BACKEND_KIND_CUDA, "cuda", "cuda", "cuda", "sm_80", kCudaEnv},
    {PCP_BACKEND_KIND_ROCM, "rocm", "hip", "hip", "gfx942", kRocmEnv},
    // IREE's default vulkan target is used when none is given.
    {PCP_BACKEND_KIND_VULKAN, "vulkan", "vulkan", "vulkan", "", kNoEnv},
    {PCP_BACKEND_KIND_METAL, "metal", "metal", "metal", "macos", kNoEnv},
};

// Other spellings of a concrete kind, and which parse flag admits each.
static const struct {
  const char* name;
  pcp_backend_kind_t kind;
  const char* iree_driver;
  pcp_backend_parse_flags_t admitted_by;
} kAliases[] = {
    {"hip", PCP_BACKEND_KIND_ROCM, "hip",
     PCP_BACKEND_PARSE_FLAG_ALIASES | PCP_BACKEND_PARSE_FLAG_DRIVERS},
    {"local-task", PCP_BACKEND_KIND_CPU, "local-task",
     PCP_BACKEND_PARSE_FLAG_DRIVERS},
    {"local-sync", PCP_BACKEND_KIND_CPU, "local-sync",
     PCP_BACKEND_PARSE_FLAG_DRIVERS},
};

const pcp_backend_kind_info_t* pcp_backend_kind_info(pcp_backend_kind_t kind) {
  return (unsigned)kind < PCP_BACKEND_KIND_COUNT_ ? &kBackends[kind] : NULL;
}

const char* pcp_backend_kind_name(pcp_backend_kind_t kind) {
  if ((unsigned)kind < PCP_BACKEND_KIND_COUNT_) {
    return kBackends[kind].name;
  }
  if (kind == PCP_BACKEND_KIND_ANY) {
    return "any";
  }
  if (kind == PCP_BACKEND_KIND_AUTO) {
    return "auto";
  }
  return "unknown";
}

bool pcp_backend_kind_parse(pcp_string_view_t name,
                            pcp_backend_parse_flags_t flags,
                            pcp_backend_kind_t* out_kind) {
  for (int i = 0; i < PCP_BACKEND_KIND_COUNT_; ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kBackends[i].name))) {
      *out_kind = kBackends[i].kind;
      return true;
    }
  }
  if ((flags & PCP_BACKEND_PARSE_FLAG_ANY) &&
      pcp_string_view_equal(name, pcp_make_cstring_view("any"))) {
    *out_kind = PCP_BACKEND_KIND_ANY;
    return true;
  }
  if ((flags & PCP_BACKEND_PARSE_FLAG_AUTO) &&
      pcp_string_view_equal(name, pcp_make_cstring_view("auto"))) {
    *out_kind = PCP_BACKEND_KIND_AUTO;
    return true;
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kAliases); ++i) {
    if ((flags & kAliases[i].admitted_by) &&
        pcp_string_view_equal(name, pcp_make_cstring_view(kAliases[i].name))) {
      *out_kind = kAliases[i].kind;
      return true;
    }
  }
  return false;
}

void pcp_backend_kind_list_format(pcp_backend_parse_flags_t flags, char* buffer,
                                  size_t capacity) {
  if (capacity == 0) {
    return;
  }
  buffer[0] = 0;
  size_t at = 0;
  const char* names[PCP_BACKEND_KIND_COUNT_ + 2];
  size_t count = 0;
  if (flags & PCP_BACKEND_PARSE_FLAG_ANY)
    names[count++] = "any";
  if (flags & PCP_BACKEND_PARSE_FLAG_AUTO)
    names[count++] = "auto";
  for (int i = 0; i < PCP_BACKEND_KIND_COUNT_; ++i) {
    names[count++] = kBackends[i].name;
  }
  for (size_t i = 0; i < count && at < capacity; ++i) {
    const char* separator = i == 0 ? "" : (i + 1 == count ? " or " : ", ");
    int n = snprintf(buffer + at, capacity - at, "%s%s", separator, names[i]);
    if (n < 0) {
      break;
    }
    at += (size_t)n;
  }
}

pcp_status_t pcp_backend_kind_parse_or_status(const char* name,
                                              pcp_backend_parse_flags_t flags,
                                              pcp_backend_kind_t* out_kind) {
  if (name &&
      pcp_backend_kind_parse(pcp_make_cstring_view(name), flags, out_kind)) {
    return pcp_ok_status();
  }
  char expected[96];
  pcp_backend_kind_list_format(flags, expected, sizeof(expected));
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "unknown backend '%s' (expected %s)", name ? name : "",
                         expected);
}

const char* pcp_backend_iree_driver_for_name(pcp_string_view_t name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kAliases); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kAliases[i].name))) {
      return kAliases[i].iree_driver;
    }
  }
  pcp_backend_kind_t kind;
  if (!pcp_backend_kind_parse(name, PCP_BACKEND_PARSE_FLAG_NONE, &kind)) {
    return NULL;
  }
  return kBackends[kind].iree_driver;
}

pcp_backend_kind_t pcp_backend_kind_host(void) {
#if defined(__APPLE__)
  return PCP_BACKEND_KIND_METAL;
#else
  return PCP_BACKEND_KIND_CPU;
#endif
}
