// SPDX-License-Identifier: Apache-2.0
//
// libmicrohttpd opened with dlopen at first use. Linking it would make every
// `pcp` subcommand map it and, through it, GnuTLS and its eight libraries
// (about 2.7 MB of resident memory before main, measured with a dlopen probe),
// although only the servers (gateway, hub, node manager probes) use it.
//
// The rest of src/http calls libmicrohttpd's functions by their own names, so
// this file defines those names: each forwards to the function resolved from
// the library (docs/decisions.md, "Lazy loading"). The definitions include
// <microhttpd.h>, so a signature that differs from the header is a compile
// error. A function the module starts to use must be added here (the link
// fails with an undefined MHD_ symbol until it is).
//
// Failure: MHD_start_daemon returns NULL (the caller's existing "cannot
// listen" error) after logging why the library could not be loaded, and
// MHD_is_feature_supported says no. Every other function needs a daemon or a
// connection, which cannot exist without the library.

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "base/base.h"

// NOLINTBEGIN(readability-identifier-naming): libmicrohttpd's names.
#define MHD_API_SYMBOLS(X)                                  \
  X(MHD_add_connection)                                     \
  X(MHD_add_response_header)                                \
  X(MHD_create_response_from_buffer)                        \
  X(MHD_create_response_from_buffer_with_free_callback_cls) \
  X(MHD_create_response_from_callback)                      \
  X(MHD_create_response_from_fd64)                          \
  X(MHD_destroy_response)                                   \
  X(MHD_get_connection_info)                                \
  X(MHD_get_connection_values)                              \
  X(MHD_get_daemon_info)                                    \
  X(MHD_is_feature_supported)                               \
  X(MHD_lookup_connection_value)                            \
  X(MHD_lookup_connection_value_n)                          \
  X(MHD_queue_response)                                     \
  X(MHD_quiesce_daemon)                                     \
  X(MHD_resume_connection)                                  \
  X(MHD_start_daemon_va)                                    \
  X(MHD_stop_daemon)                                        \
  X(MHD_suspend_connection)

typedef struct mhd_api_t {
#define MHD_API_FIELD(name) __typeof__(name)* name;
  MHD_API_SYMBOLS(MHD_API_FIELD)
#undef MHD_API_FIELD
} mhd_api_t;

static const pcp_dynlib_symbol_t kMhdSymbols[] = {
#define MHD_API_ENTRY(name) {#name, offsetof(mhd_api_t, name)},
    MHD_API_SYMBOLS(MHD_API_ENTRY)
#undef MHD_API_ENTRY
};

static mhd_api_t g_mhd;
static pcp_status_t g_mhd_status;
static pthread_once_t g_mhd_once = PTHREAD_ONCE_INIT;

static void mhd_load_once(void) {
  static const char* const kSonames[] = {"libmicrohttpd.so.12",
                                         "libmicrohttpd.so", NULL};
  g_mhd_status =
      pcp_dynlib_load(kSonames, "the HTTP server", "libmicrohttpd12",
                      kMhdSymbols, PCP_ARRAYSIZE(kMhdSymbols), &g_mhd);
}

static bool mhd_load(void) {
  pthread_once(&g_mhd_once, mhd_load_once);
  return g_mhd_status == NULL;
}

// For the functions that need an object only a loaded library makes.
static const mhd_api_t* mhd(void) {
  PCP_ASSERT(mhd_load());
  return &g_mhd;
}

struct MHD_Daemon* MHD_start_daemon(unsigned int flags, uint16_t port,
                                    MHD_AcceptPolicyCallback apc, void* apc_cls,
                                    MHD_AccessHandlerCallback dh, void* dh_cls,
                                    ...) {
  va_list ap;
  va_start(ap, dh_cls);
  struct MHD_Daemon* daemon =
      MHD_start_daemon_va(flags, port, apc, apc_cls, dh, dh_cls, ap);
  va_end(ap);
  return daemon;
}

struct MHD_Daemon* MHD_start_daemon_va(unsigned int flags, uint16_t port,
                                       MHD_AcceptPolicyCallback apc,
                                       void* apc_cls,
                                       MHD_AccessHandlerCallback dh,
                                       void* dh_cls, va_list ap) {
  if (!mhd_load()) {
    pcp_log_status(PCP_LOG_ERROR, NULL, g_mhd_status, "cannot start a server");
    return NULL;
  }
  return g_mhd.MHD_start_daemon_va(flags, port, apc, apc_cls, dh, dh_cls, ap);
}

enum MHD_Result MHD_is_feature_supported(enum MHD_FEATURE feature) {
  return mhd_load() ? g_mhd.MHD_is_feature_supported(feature) : MHD_NO;
}

void MHD_stop_daemon(struct MHD_Daemon* daemon) {
  mhd()->MHD_stop_daemon(daemon);
}

MHD_socket MHD_quiesce_daemon(struct MHD_Daemon* daemon) {
  return mhd()->MHD_quiesce_daemon(daemon);
}

// libmicrohttpd 0.9.x reads no variadic argument for any info type (the
// `...` is reserved), so none is forwarded.
const union MHD_DaemonInfo* MHD_get_daemon_info(
    struct MHD_Daemon* daemon, enum MHD_DaemonInfoType info_type, ...) {
  return mhd()->MHD_get_daemon_info(daemon, info_type);
}

const union MHD_ConnectionInfo* MHD_get_connection_info(
    struct MHD_Connection* connection, enum MHD_ConnectionInfoType info_type,
    ...) {
  return mhd()->MHD_get_connection_info(connection, info_type);
}

int MHD_get_connection_values(struct MHD_Connection* connection,
                              enum MHD_ValueKind kind,
                              MHD_KeyValueIterator iterator,
                              void* iterator_cls) {
  return mhd()->MHD_get_connection_values(connection, kind, iterator,
                                          iterator_cls);
}

const char* MHD_lookup_connection_value(struct MHD_Connection* connection,
                                        enum MHD_ValueKind kind,
                                        const char* key) {
  return mhd()->MHD_lookup_connection_value(connection, kind, key);
}

enum MHD_Result MHD_lookup_connection_value_n(struct MHD_Connection* connection,
                                              enum MHD_ValueKind kind,
                                              const char* key, size_t key_size,
                                              const char** value_ptr,
                                              size_t* value_size_ptr) {
  return mhd()->MHD_lookup_connection_value_n(connection, kind, key, key_size,
                                              value_ptr, value_size_ptr);
}

struct MHD_Response* MHD_create_response_from_buffer(
    size_t size, void* buffer, enum MHD_ResponseMemoryMode mode) {
  return mhd()->MHD_create_response_from_buffer(size, buffer, mode);
}

struct MHD_Response* MHD_create_response_from_callback(
    uint64_t size, size_t block_size, MHD_ContentReaderCallback crc,
    void* crc_cls, MHD_ContentReaderFreeCallback crfc) {
  return mhd()->MHD_create_response_from_callback(size, block_size, crc,
                                                  crc_cls, crfc);
}

struct MHD_Response* MHD_create_response_from_buffer_with_free_callback_cls(
    size_t size, void* buffer, MHD_ContentReaderFreeCallback crfc,
    void* crfc_cls) {
  return mhd()->MHD_create_response_from_buffer_with_free_callback_cls(
      size, buffer, crfc, crfc_cls);
}

struct MHD_Response* MHD_create_response_from_fd64(uint64_t size, int fd) {
  return mhd()->MHD_create_response_from_fd64(size, fd);
}

enum MHD_Result MHD_add_response_header(struct MHD_Response* response,
                                        const char* header,
                                        const char* content) {
  return mhd()->MHD_add_response_header(response, header, content);
}

void MHD_destroy_response(struct MHD_Response* response) {
  mhd()->MHD_destroy_response(response);
}

enum MHD_Result MHD_queue_response(struct MHD_Connection* connection,
                                   unsigned int status_code,
                                   struct MHD_Response* response) {
  return mhd()->MHD_queue_response(connection, status_code, response);
}

enum MHD_Result MHD_add_connection(struct MHD_Daemon* daemon,
                                   MHD_socket client_socket,
                                   const struct sockaddr* addr,
                                   socklen_t addrlen) {
  return mhd()->MHD_add_connection(daemon, client_socket, addr, addrlen);
}

void MHD_suspend_connection(struct MHD_Connection* connection) {
  mhd()->MHD_suspend_connection(connection);
}

void MHD_resume_connection(struct MHD_Connection* connection) {
  mhd()->MHD_resume_connection(connection);
}
// NOLINTEND(readability-identifier-naming)
