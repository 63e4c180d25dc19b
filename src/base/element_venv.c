// SPDX-License-Identifier: Apache-2.0
// Element type names and the location of the project's .venv.

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base.h"

#ifndef PCP_DEFAULT_VENV
#define PCP_DEFAULT_VENV ".venv"
#endif

static const struct {
  const char* name;
  size_t byte_size;
} kElementTypes[PCP_ELEMENT_TYPE_COUNT_] = {
    [PCP_ELEMENT_TYPE_UNKNOWN] = {"unknown", 0},
    [PCP_ELEMENT_TYPE_F32] = {"f32", 4},
    [PCP_ELEMENT_TYPE_F16] = {"f16", 2},
    [PCP_ELEMENT_TYPE_BF16] = {"bf16", 2},
    [PCP_ELEMENT_TYPE_F64] = {"f64", 8},
    [PCP_ELEMENT_TYPE_I1] = {"i1", 1},
    [PCP_ELEMENT_TYPE_I8] = {"i8", 1},
    [PCP_ELEMENT_TYPE_I16] = {"i16", 2},
    [PCP_ELEMENT_TYPE_I32] = {"i32", 4},
    [PCP_ELEMENT_TYPE_I64] = {"i64", 8},
    [PCP_ELEMENT_TYPE_U8] = {"ui8", 1},
    [PCP_ELEMENT_TYPE_U16] = {"ui16", 2},
    [PCP_ELEMENT_TYPE_U32] = {"ui32", 4},
    [PCP_ELEMENT_TYPE_U64] = {"ui64", 8},
};

const char* pcp_element_type_name(pcp_element_type_t type) {
  if ((unsigned)type >= PCP_ELEMENT_TYPE_COUNT_)
    return "unknown";
  return kElementTypes[type].name;
}

size_t pcp_element_type_byte_size(pcp_element_type_t type) {
  if ((unsigned)type >= PCP_ELEMENT_TYPE_COUNT_)
    return 0;
  return kElementTypes[type].byte_size;
}

bool pcp_element_type_parse(pcp_string_view_t name,
                            pcp_element_type_t* out_type) {
  static const struct {
    const char* alias;
    pcp_element_type_t type;
  } kAliases[] = {{"u8", PCP_ELEMENT_TYPE_U8},   {"u16", PCP_ELEMENT_TYPE_U16},
                  {"u32", PCP_ELEMENT_TYPE_U32}, {"u64", PCP_ELEMENT_TYPE_U64},
                  {"bool", PCP_ELEMENT_TYPE_I1}, {"si32", PCP_ELEMENT_TYPE_I32},
                  {"si64", PCP_ELEMENT_TYPE_I64}};
  for (int i = 1; i < PCP_ELEMENT_TYPE_COUNT_; ++i) {
    if (pcp_string_view_equal(name,
                              pcp_make_cstring_view(kElementTypes[i].name))) {
      *out_type = (pcp_element_type_t)i;
      return true;
    }
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kAliases); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kAliases[i].alias))) {
      *out_type = kAliases[i].type;
      return true;
    }
  }
  return false;
}

const char* pcp_venv_directory(void) {
  const char* env = getenv("PCP_VENV");
  return env && env[0] ? env : PCP_DEFAULT_VENV;
}

pcp_status_t pcp_venv_site_packages(char* buffer, size_t capacity) {
  const char* venv = pcp_venv_directory();
  int n = snprintf(buffer, capacity, "%s/lib/python3.11/site-packages", venv);
  if (n < 0 || (size_t)n >= capacity) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "venv path too long: '%s'",
                           venv);
  }
  struct stat st;
  if (stat(buffer, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return pcp_make_status(
        PCP_STATUS_NOT_FOUND,
        "the Python environment '%s' is missing (no %s); run 'make setup' or "
        "point PCP_VENV at a venv with the pinned IREE wheels",
        venv, buffer);
  }
  return pcp_ok_status();
}
