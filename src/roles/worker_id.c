// SPDX-License-Identifier: Apache-2.0
// The stable worker id (upstream s.1.4). It must match upstream byte for
// byte: gateways key leases and reservations by it, and a worker restarted
// by its supervisor (or rescheduled onto the same pod) must come back under
// the same id.

#include <stdlib.h>
#include <string.h>

#include "roles/roles.h"

#define WORKER_ID_MAX_BYTES 4096

const char* pcp_roles_getenv_process(void* user_data, const char* name) {
  (void)user_data;
  return getenv(name);
}

static bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static pcp_string_view_t trim_blanks(pcp_string_view_t value) {
  size_t begin = 0, end = value.size;
  while (begin < end && is_blank(value.data[begin])) {
    ++begin;
  }
  while (end > begin && is_blank(value.data[end - 1])) {
    --end;
  }
  return pcp_make_string_view(value.data + begin, end - begin);
}

static bool is_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

pcp_status_t pcp_roles_worker_id_append_sanitized(pcp_string_builder_t* builder,
                                                  pcp_string_view_t value) {
  pcp_string_view_t trimmed = trim_blanks(value);
  if (trimmed.size == 0) {
    trimmed = pcp_make_cstring_view("unknown");
  }
  for (size_t i = 0; i < trimmed.size; ++i) {
    char c = trimmed.data[i];
    if (!is_id_char(c)) {
      c = '-';
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append(builder, pcp_make_string_view(&c, 1)));
  }
  return pcp_ok_status();
}

static const char* visible_devices_env(const char* backend,
                                       pcp_roles_getenv_fn_t getenv_fn,
                                       void* user_data) {
  // The variables and their order are the backend table's (base.h); the
  // first one that is set wins, even when it is empty.
  pcp_backend_kind_t kind;
  if (!pcp_backend_kind_parse(pcp_make_cstring_view(backend),
                              PCP_BACKEND_PARSE_FLAG_NONE, &kind)) {
    return NULL;
  }
  for (const char* const* name =
           pcp_backend_kind_info(kind)->visible_devices_env;
       *name; ++name) {
    const char* value = getenv_fn(user_data, *name);
    if (value) {
      return value;
    }
  }
  return NULL;
}

bool pcp_roles_worker_id_visible_device(const char* backend, int64_t device_id,
                                        pcp_roles_getenv_fn_t getenv_fn,
                                        void* user_data,
                                        pcp_string_view_t* out_token) {
  *out_token = pcp_make_string_view("", 0);
  const char* raw = visible_devices_env(backend, getenv_fn, user_data);
  if (!raw || device_id < 0) {
    return false;
  }
  int64_t seen = 0;
  pcp_string_view_t rest = pcp_make_cstring_view(raw);
  for (;;) {
    pcp_string_view_t head, tail;
    bool more = pcp_string_view_split(rest, ',', &head, &tail);
    pcp_string_view_t token = trim_blanks(head);
    bool skipped = token.size == 0 ||
                   pcp_string_view_equal(token, pcp_make_cstring_view("-1"));
    if (!skipped) {
      if (seen == device_id) {
        *out_token = token;
        return true;
      }
      ++seen;
    }
    if (!more) {
      return false;
    }
    rest = tail;
  }
}

static const char* env_or(pcp_roles_getenv_fn_t getenv_fn, void* user_data,
                          const char* name, const char* fallback) {
  const char* value = getenv_fn(user_data, name);
  return value ? value : fallback;
}

static pcp_status_t build(pcp_string_builder_t* builder, const char* backend,
                          const char* target_arch, int64_t device_id,
                          pcp_roles_getenv_fn_t getenv_fn, void* user_data) {
  const char* override_id = getenv_fn(user_data, "PCP_WORKER_ID");
  if (override_id) {
    return pcp_roles_worker_id_append_sanitized(
        builder, pcp_make_cstring_view(override_id));
  }
  const char* parts[] = {
      env_or(getenv_fn, user_data, "PCP_SITE_ID", "local"),
      env_or(getenv_fn, user_data, "POD_NAMESPACE", "default"),
      env_or(getenv_fn, user_data, "NODE_NAME", "unknown-node"),
      env_or(getenv_fn, user_data, "POD_NAME", "unknown-pod"),
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(parts); ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_roles_worker_id_append_sanitized(
        builder, pcp_make_cstring_view(parts[i])));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "-"));
  }
  // The backend name comes from our own table; upstream does not sanitize
  // it either.
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(builder, "%s-", backend));
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_worker_id_append_sanitized(
      builder, pcp_make_cstring_view(target_arch ? target_arch : "default")));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(builder, "-device-"));
  pcp_string_view_t token;
  if (pcp_roles_worker_id_visible_device(backend, device_id, getenv_fn,
                                         user_data, &token)) {
    return pcp_roles_worker_id_append_sanitized(builder, token);
  }
  char number[32];
  snprintf(number, sizeof(number), "%lld", (long long)device_id);
  return pcp_roles_worker_id_append_sanitized(builder,
                                              pcp_make_cstring_view(number));
}

pcp_status_t pcp_roles_worker_id_build(const char* backend,
                                       const char* target_arch,
                                       int64_t device_id,
                                       pcp_roles_getenv_fn_t getenv_fn,
                                       void* user_data, char** out_id) {
  *out_id = NULL;
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), WORKER_ID_MAX_BYTES,
                                &builder);
  pcp_status_t status =
      build(&builder, backend, target_arch, device_id, getenv_fn, user_data);
  if (!status) {
    status = pcp_string_builder_take(&builder, out_id);
  }
  pcp_string_builder_deinitialize(&builder);
  if (status) {
    return pcp_status_annotate_f(status, "building the worker id");
  }
  return pcp_ok_status();
}
