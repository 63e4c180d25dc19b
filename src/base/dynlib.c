// SPDX-License-Identifier: Apache-2.0
//
// dlopen at first use for the heavy optional libraries (base.h, "Libraries
// loaded at first use"). src/mlir/loader.c does the same for
// libIREECompiler.so with its own path search and version check.

#include <dlfcn.h>
#include <string.h>

#include "base/base.h"

// dlsym hands back an object pointer; ISO C has no conversion to a function
// pointer, so the table is filled by copying the bytes (POSIX guarantees the
// representations match).
static_assert(sizeof(void*) == sizeof(void (*)(void)),
              "function and object pointers must have the same size");

pcp_status_t pcp_dynlib_load(const char* const* sonames, const char* what,
                             const char* package,
                             const pcp_dynlib_symbol_t* symbols,
                             size_t symbol_count, void* inout_table) {
  void* handle = NULL;
  const char* loaded = NULL;
  char first_error[512] = "";
  for (size_t i = 0; sonames[i] && !handle; ++i) {
    handle = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      loaded = sonames[i];
    } else if (!first_error[0]) {
      const char* error = dlerror();
      snprintf(first_error, sizeof(first_error), "%s",
               error ? error : "unknown dlopen error");
    }
  }
  if (!handle) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "%s needs the shared library %s, which could not "
                           "be loaded (install the Debian package %s): %s",
                           what, sonames[0] ? sonames[0] : "(none)", package,
                           first_error);
  }
  // Never dlclose: the tables stay valid for the life of the process, and
  // libraries such as libcurl keep global state between calls.
  for (size_t i = 0; i < symbol_count; ++i) {
    void* symbol = dlsym(handle, symbols[i].name);
    if (!symbol) {
      return pcp_make_status(PCP_STATUS_INCOMPATIBLE,
                             "%s: the shared library %s has no symbol '%s' "
                             "(is it the version Debian package %s ships?)",
                             what, loaded, symbols[i].name, package);
    }
    memcpy((char*)inout_table + symbols[i].offset, &symbol, sizeof(symbol));
  }
  return pcp_ok_status();
}
