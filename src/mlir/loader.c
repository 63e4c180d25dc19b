// SPDX-License-Identifier: Apache-2.0
//
// Finds, loads and resolves libIREECompiler.so once per process.

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mlir/loader_impl.h"
#include "mlir/mlir.h"

// dlsym hands back an object pointer; ISO C has no conversion to a function
// pointer, so the table is filled by copying the bytes (POSIX guarantees the
// representations match).
static_assert(sizeof(void*) == sizeof(void (*)(void)),
              "function and object pointers must have the same size");

#define LIBRARY_RELATIVE_PATH "iree/compiler/_mlir_libs/libIREECompiler.so"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pcp_status_t g_load_status;
static pcp_mlir_api_t g_api;
static char g_path[4096];
static char g_revision[256];
static int32_t g_api_version;
static bool g_loaded;

static const struct {
  const char* name;
  size_t offset;
} kSymbols[] = {
#define SYMBOL_ENTRY(name) {#name, offsetof(pcp_mlir_api_t, name)},
    PCP_MLIR_API_SYMBOLS(SYMBOL_ENTRY)
#undef SYMBOL_ENTRY
};

static pcp_status_t resolve_path(void) {
  const char* env = getenv(PCP_MLIR_COMPILER_LIB_ENV);
  if (env && env[0]) {
    if (strlen(env) >= sizeof(g_path)) {
      return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "%s is longer than %zu bytes",
                             PCP_MLIR_COMPILER_LIB_ENV, sizeof(g_path) - 1);
    }
    memcpy(g_path, env, strlen(env) + 1);
    return pcp_ok_status();
  }
  char site_packages[4096];
  PCP_RETURN_IF_ERROR(
      pcp_venv_site_packages(site_packages, sizeof(site_packages)),
      "looking for libIREECompiler.so (or set %s to its path)",
      PCP_MLIR_COMPILER_LIB_ENV);
  int n = snprintf(g_path, sizeof(g_path), "%s/%s", site_packages,
                   LIBRARY_RELATIVE_PATH);
  if (n < 0 || (size_t)n >= sizeof(g_path)) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "path of libIREECompiler.so under '%s' is too long",
                           site_packages);
  }
  return pcp_ok_status();
}

static pcp_status_t load_library(void) {
  PCP_RETURN_IF_ERROR_BARE(resolve_path());
  struct stat st;
  if (stat(g_path, &st) != 0 || !S_ISREG(st.st_mode)) {
    return pcp_make_status(
        PCP_STATUS_NOT_FOUND,
        "IREE compiler library '%s' not found; install the iree-base-compiler "
        "wheel into the venv (make setup) or set %s to the path of "
        "libIREECompiler.so",
        g_path, PCP_MLIR_COMPILER_LIB_ENV);
  }
  // RTLD_LOCAL: the library's LLVM must not interpose on anything else in
  // the process. RTLD_NOW: an unresolvable dependency fails here, not at the
  // first call.
  void* handle = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = dlerror();
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "cannot load IREE compiler library '%s' (set by %s "
                           "or the venv): %s",
                           g_path, PCP_MLIR_COMPILER_LIB_ENV,
                           error ? error : "unknown dlopen error");
  }
  // Never dlclose: LLVM registers static destructors and global options that
  // do not survive unloading.
  for (size_t i = 0; i < PCP_ARRAYSIZE(kSymbols); ++i) {
    void* symbol = dlsym(handle, kSymbols[i].name);
    if (!symbol) {
      return pcp_make_status(
          PCP_STATUS_INCOMPATIBLE,
          "IREE compiler library '%s' has no symbol '%s'; is it "
          "libIREECompiler.so from iree-base-compiler 3.x? (path from %s or "
          "the venv)",
          g_path, kSymbols[i].name, PCP_MLIR_COMPILER_LIB_ENV);
    }
    memcpy((char*)&g_api + kSymbols[i].offset, &symbol, sizeof(symbol));
  }
  int version = g_api.ireeCompilerGetAPIVersion();
  int major = version >> 16;
  int minor = version & 0xFFFF;
  if (major != PCP_MLIR_IREE_API_MAJOR || minor < PCP_MLIR_IREE_API_MINOR_MIN) {
    return pcp_make_status(
        PCP_STATUS_INCOMPATIBLE,
        "IREE compiler library '%s' has embedding API %d.%d; PCP needs %d.x "
        "with x >= %d (path from %s or the venv)",
        g_path, major, minor, PCP_MLIR_IREE_API_MAJOR,
        PCP_MLIR_IREE_API_MINOR_MIN, PCP_MLIR_COMPILER_LIB_ENV);
  }
  // Refcounted inside IREE; PCP never calls ireeCompilerGlobalShutdown
  // because the library cannot be initialized again in the same process.
  g_api.ireeCompilerGlobalInitialize();
  const char* revision = g_api.ireeCompilerGetRevision();
  snprintf(g_revision, sizeof(g_revision), "%s", revision ? revision : "");
  g_api_version = version;
  return pcp_ok_status();
}

static void load_once(void) {
  g_load_status = load_library();
  g_loaded = g_load_status == NULL;
}

pcp_status_t pcp_mlir_library_load(void) {
  pthread_once(&g_once, load_once);
  // Every caller gets its own copy: the cached status stays for later ones.
  return pcp_status_clone(g_load_status);
}

pcp_status_t pcp_mlir_api_get(const pcp_mlir_api_t** out_api) {
  *out_api = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_library_load());
  *out_api = &g_api;
  return pcp_ok_status();
}

const char* pcp_mlir_library_path(void) {
  pthread_once(&g_once, load_once);
  return g_loaded ? g_path : NULL;
}

int32_t pcp_mlir_library_api_version(void) {
  pthread_once(&g_once, load_once);
  return g_loaded ? g_api_version : 0;
}

const char* pcp_mlir_library_revision(void) {
  pthread_once(&g_once, load_once);
  return g_loaded ? g_revision : "";
}
