// SPDX-License-Identifier: Apache-2.0
//
// Route patterns: compiled once into segments when added, matched by a
// linear scan. A gateway has a few dozen routes, so a scan over compiled
// segments costs less than a trie's pointer chasing and keeps the ranking
// rule (literal beats parameter, position by position) easy to read.

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/http_impl.h"

void pcp_http_router_initialize(pcp_allocator_t allocator,
                                pcp_http_router_t* out_router) {
  memset(out_router, 0, sizeof(*out_router));
  out_router->allocator = allocator;
}

static void entry_deinitialize(pcp_allocator_t allocator,
                               pcp_http_route_entry_t* entry) {
  pcp_allocator_free(allocator, entry->method);
  pcp_allocator_free(allocator, entry->pattern);
  pcp_allocator_free(allocator, entry->scope);
  for (size_t i = 0; i < entry->segment_count; ++i) {
    pcp_allocator_free(allocator, entry->segments[i]);
  }
  memset(entry, 0, sizeof(*entry));
}

void pcp_http_router_deinitialize(pcp_http_router_t* router) {
  for (size_t i = 0; i < router->count; ++i) {
    entry_deinitialize(router->allocator, &router->entries[i]);
  }
  pcp_allocator_free(router->allocator, router->entries);
  memset(router, 0, sizeof(*router));
}

static pcp_status_t copy_range(pcp_allocator_t allocator, const char* data,
                               size_t length, char** out_value) {
  *out_value = NULL;
  char* value = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, length + 1, (void**)&value));
  memcpy(value, data, length);
  value[length] = '\0';
  *out_value = value;
  return pcp_ok_status();
}

static pcp_status_t copy_string(pcp_allocator_t allocator, const char* value,
                                char** out_value) {
  if (!value) {
    *out_value = NULL;
    return pcp_ok_status();
  }
  return copy_range(allocator, value, strlen(value), out_value);
}

static bool is_param_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

// Splits |pattern| into |entry|'s segments.
static pcp_status_t compile_pattern(pcp_allocator_t allocator,
                                    const char* pattern,
                                    pcp_http_route_entry_t* entry) {
  if (!pattern || pattern[0] != '/') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "route pattern '%s' must start with '/'",
                           pattern ? pattern : "(null)");
  }
  const char* cursor = pattern + 1;
  if (*cursor == '\0') {
    return pcp_ok_status();  // "/": zero segments
  }
  size_t param_count = 0;
  for (;;) {
    const char* end = strchr(cursor, '/');
    size_t length = end ? (size_t)(end - cursor) : strlen(cursor);
    if (length == 1 && cursor[0] == '*') {
      if (end) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "route pattern '%s': '*' must be last", pattern);
      }
      entry->prefix = true;
      return pcp_ok_status();
    }
    if (entry->segment_count == PCP_HTTP_MAX_PATH_SEGMENTS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "route pattern '%s' has more than %d segments",
                             pattern, PCP_HTTP_MAX_PATH_SEGMENTS);
    }
    bool is_param =
        length >= 2 && cursor[0] == '{' && cursor[length - 1] == '}';
    const char* name = cursor;
    size_t name_length = length;
    if (is_param) {
      name = cursor + 1;
      name_length = length - 2;
      bool valid = name_length > 0;
      for (size_t i = 0; i < name_length; ++i) {
        valid = valid && is_param_name_char(name[i]);
      }
      if (!valid) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "route pattern '%s': bad parameter name",
                               pattern);
      }
      if (++param_count > PCP_HTTP_MAX_PATH_PARAMS) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "route pattern '%s' has more than %d "
                               "parameters",
                               pattern, PCP_HTTP_MAX_PATH_PARAMS);
      }
    } else if (memchr(cursor, '{', length) || memchr(cursor, '}', length) ||
               memchr(cursor, '*', length)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "route pattern '%s': '{', '}' and '*' only as "
                             "whole segments",
                             pattern);
    }
    size_t index = entry->segment_count;
    PCP_RETURN_IF_ERROR_BARE(
        copy_range(allocator, name, name_length, &entry->segments[index]));
    entry->segment_is_param[index] = is_param;
    entry->segment_count = index + 1;
    if (!end) {
      return pcp_ok_status();
    }
    cursor = end + 1;
  }
}

pcp_status_t pcp_http_router_add(pcp_http_router_t* router,
                                 const pcp_http_route_t* route,
                                 int scope_index) {
  if (!route->method || !route->method[0] || !route->handler) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "route '%s' needs a method and a handler",
                           route->pattern ? route->pattern : "(null)");
  }
  for (size_t i = 0; i < router->count; ++i) {
    const pcp_http_route_entry_t* other = &router->entries[i];
    if (strcmp(other->pattern, route->pattern ? route->pattern : "") == 0 &&
        strcmp(other->method, route->method) == 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "route %s %s added twice", route->method,
                             route->pattern);
    }
  }
  if (router->count == router->capacity) {
    size_t capacity = router->capacity ? router->capacity * 2 : 16;
    void* entries = router->entries;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        router->allocator, capacity * sizeof(pcp_http_route_entry_t),
        &entries));
    router->entries = entries;
    router->capacity = capacity;
  }
  pcp_http_route_entry_t entry;
  memset(&entry, 0, sizeof(entry));
  entry.scope_index = scope_index;
  entry.handler = route->handler;
  entry.user_data = route->user_data;
  entry.max_body_bytes = route->max_body_bytes;
  entry.max_json_depth = route->max_json_depth;
  pcp_status_t status =
      compile_pattern(router->allocator, route->pattern, &entry);
  if (!status) {
    status = copy_string(router->allocator, route->method, &entry.method);
  }
  if (!status) {
    status = copy_string(router->allocator, route->pattern, &entry.pattern);
  }
  if (!status) {
    status = copy_string(router->allocator, route->scope, &entry.scope);
  }
  if (status) {
    entry_deinitialize(router->allocator, &entry);
    return status;
  }
  // memcpy rather than assignment: the entry holds atomics (all NULL).
  memcpy(&router->entries[router->count++], &entry, sizeof(entry));
  return pcp_ok_status();
}

// Matches |path| against |entry|. On success fills the parameters of
// |out_match| and returns a rank: bit (31 - i) set when segment i matched a
// literal, so comparing ranks prefers literals position by position.
static bool match_entry(const pcp_http_route_entry_t* entry, const char* path,
                        uint64_t* out_rank, pcp_http_route_match_t* out_match) {
  if (path[0] != '/') {
    return false;
  }
  size_t offset = 1;
  size_t param_count = 0;
  uint64_t rank = 0;
  bool at_end = path[1] == '\0';
  for (size_t i = 0; i < entry->segment_count; ++i) {
    if (at_end) {
      return false;
    }
    const char* segment = path + offset;
    const char* slash = strchr(segment, '/');
    size_t length = slash ? (size_t)(slash - segment) : strlen(segment);
    if (entry->segment_is_param[i]) {
      if (length == 0) {
        return false;
      }
      out_match->param_names[param_count] = entry->segments[i];
      out_match->param_begin[param_count] = offset;
      out_match->param_end[param_count] = offset + length;
      ++param_count;
    } else {
      if (strlen(entry->segments[i]) != length ||
          memcmp(entry->segments[i], segment, length) != 0) {
        return false;
      }
      if (i < 32) {
        rank |= (uint64_t)1 << (32 - i);
      }
    }
    offset += length;
    if (slash) {
      offset += 1;  // past the '/'
    } else {
      at_end = true;
    }
  }
  if (entry->prefix) {
    // "*" binds the rest (possibly empty). A path that ended exactly at the
    // last literal ("/static" for "/static/*") binds "".
    size_t rest = at_end ? strlen(path) : offset;
    out_match->param_names[param_count] = "*";
    out_match->param_begin[param_count] = rest;
    out_match->param_end[param_count] = strlen(path);
    ++param_count;
  } else if (!at_end) {
    return false;
  } else {
    rank |= 1;  // a full match beats a prefix match with the same literals
  }
  out_match->param_count = param_count;
  *out_rank = rank;
  return true;
}

void pcp_http_router_match(const pcp_http_router_t* router, const char* method,
                           const char* path,
                           pcp_http_route_match_t* out_match) {
  memset(out_match, 0, sizeof(*out_match));
  uint64_t best_rank = 0;
  pcp_http_route_match_t candidate;
  size_t allow_length = 0;
  for (size_t i = 0; i < router->count; ++i) {
    const pcp_http_route_entry_t* entry = &router->entries[i];
    uint64_t rank = 0;
    memset(&candidate, 0, sizeof(candidate));
    if (!match_entry(entry, path, &rank, &candidate)) {
      continue;
    }
    out_match->path_matched = true;
    // HEAD is answered by GET routes (libmicrohttpd drops the body), as
    // RFC 9110 expects of a server that supports GET.
    bool method_ok =
        strcmp(entry->method, "*") == 0 || strcmp(entry->method, method) == 0 ||
        (strcmp(method, "HEAD") == 0 && strcmp(entry->method, "GET") == 0);
    if (!method_ok) {
      // Collect the Allow list (distinct methods, in route order).
      size_t method_length = strlen(entry->method);
      bool seen = false;
      for (const char* p = out_match->allow; *p;) {
        const char* comma = strstr(p, ", ");
        size_t length = comma ? (size_t)(comma - p) : strlen(p);
        if (length == method_length && memcmp(p, entry->method, length) == 0) {
          seen = true;
        }
        p = comma ? comma + 2 : p + length;
      }
      if (!seen &&
          allow_length + method_length + 3 < sizeof(out_match->allow)) {
        if (allow_length) {
          memcpy(out_match->allow + allow_length, ", ", 2);
          allow_length += 2;
        }
        memcpy(out_match->allow + allow_length, entry->method, method_length);
        allow_length += method_length;
        out_match->allow[allow_length] = '\0';
      }
      continue;
    }
    if (!out_match->route || rank > best_rank) {
      bool path_matched = out_match->path_matched;
      char allow[sizeof(out_match->allow)];
      memcpy(allow, out_match->allow, sizeof(allow));
      *out_match = candidate;
      out_match->route = entry;
      out_match->path_matched = path_matched;
      memcpy(out_match->allow, allow, sizeof(allow));
      best_rank = rank;
    }
  }
}
