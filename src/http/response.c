// SPDX-License-Identifier: Apache-2.0
//
// The response builder handed to handlers, and the request accessors.

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/http_impl.h"

void pcp_http_response_initialize(pcp_allocator_t allocator,
                                  pcp_http_response_t* out_response) {
  memset(out_response, 0, sizeof(*out_response));
  out_response->allocator = allocator;
  out_response->file_fd = -1;
}

void pcp_http_body_block_free(void* block) {
  if (block) {
    pcp_http_body_block_t* b = block;
    pcp_allocator_free(b->allocator, b);
  }
}

// Frees |body| as body_take's contract says it was made: by libc's malloc
// (json_dumps and callers' own malloc), or in a block of the allocator.
static void body_free(char* body, pcp_http_body_block_t* block) {
  if (block) {
    pcp_http_body_block_free(block);
  } else {
    pcp_libc_free(body);  // libc's malloc (body_take's contract)
  }
}

static void response_body_clear(pcp_http_response_t* response) {
  if (response->file_fd >= 0) {
    close(response->file_fd);
    response->file_fd = -1;
    response->file_byte_length = 0;
  }
  if (response->sse) {
    pcp_http_sse_stream_abandon(response->sse);
    response->sse = NULL;
  }
  body_free(response->body, response->body_block);
  pcp_allocator_free(response->allocator, response->content_type);
  response->body = NULL;
  response->body_block = NULL;
  response->content_type = NULL;
  response->body_length = 0;
}

void pcp_http_response_deinitialize(pcp_http_response_t* response) {
  response_body_clear(response);
  for (size_t i = 0; i < response->header_count; ++i) {
    pcp_allocator_free(response->allocator, response->header_names[i]);
    pcp_allocator_free(response->allocator, response->header_values[i]);
  }
  pcp_allocator_t allocator = response->allocator;
  memset(response, 0, sizeof(*response));
  response->allocator = allocator;
  response->file_fd = -1;
}

static bool header_value_is_safe(const char* value) {
  // A CR or LF in a value would let a handler (or the user data it echoes)
  // inject headers; refuse it.
  return strpbrk(value, "\r\n") == NULL;
}

pcp_status_t pcp_http_response_header_add(pcp_http_response_t* response,
                                          const char* name, const char* value) {
  if (!name || !value || !name[0] || !header_value_is_safe(name) ||
      !header_value_is_safe(value) || strchr(name, ':')) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad response header");
  }
  if (strcasecmp(name, "Content-Type") == 0 ||
      strcasecmp(name, "Content-Length") == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "header %s is set by the server", name);
  }
  if (response->header_count == PCP_HTTP_MAX_RESPONSE_HEADERS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "more than %d response headers",
                           PCP_HTTP_MAX_RESPONSE_HEADERS);
  }
  char* name_copy = NULL;
  char* value_copy = NULL;
  pcp_status_t status =
      pcp_allocator_strdup(response->allocator, name, &name_copy);
  if (!status) {
    status = pcp_allocator_strdup(response->allocator, value, &value_copy);
  }
  if (status) {
    pcp_status_ignore(status);
    pcp_allocator_free(response->allocator, name_copy);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory adding a header");
  }
  response->header_names[response->header_count] = name_copy;
  response->header_values[response->header_count] = value_copy;
  ++response->header_count;
  return pcp_ok_status();
}

// Sets the body to |data| (freed as body_free says, on error too).
static pcp_status_t body_install(pcp_http_response_t* response, int http_status,
                                 const char* content_type, char* data,
                                 pcp_http_body_block_t* block,
                                 size_t byte_length) {
  if (http_status < 100 || http_status > 599) {
    body_free(data, block);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "HTTP status %d out of range", http_status);
  }
  char* type_copy = NULL;
  if (content_type) {
    if (!header_value_is_safe(content_type)) {
      body_free(data, block);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad content type");
    }
    pcp_status_t status =
        pcp_allocator_strdup(response->allocator, content_type, &type_copy);
    if (status) {
      body_free(data, block);
      return status;
    }
  }
  response_body_clear(response);
  response->http_status = http_status;
  response->content_type = type_copy;
  response->body = data;
  response->body_block = data ? block : NULL;
  response->body_length = data ? byte_length : 0;
  return pcp_ok_status();
}

pcp_status_t pcp_http_response_body_take(pcp_http_response_t* response,
                                         int http_status,
                                         const char* content_type, char* data,
                                         size_t byte_length) {
  return body_install(response, http_status, content_type, data, NULL,
                      byte_length);
}

pcp_status_t pcp_http_response_body_set(pcp_http_response_t* response,
                                        int http_status,
                                        const char* content_type,
                                        const void* data, size_t byte_length) {
  pcp_http_body_block_t* block = NULL;
  if (byte_length > 0) {
    if (byte_length > SIZE_MAX - sizeof(*block)) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "a %zu-byte body is too large", byte_length);
    }
    pcp_status_t status = pcp_allocator_malloc(
        response->allocator, sizeof(*block) + byte_length, (void**)&block);
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory copying a %zu-byte body",
                             byte_length);
    }
    block->allocator = response->allocator;
    memcpy(block->data, data, byte_length);
  }
  return body_install(response, http_status, content_type,
                      block ? block->data : NULL, block, byte_length);
}

pcp_status_t pcp_http_response_file_set(pcp_http_response_t* response,
                                        int http_status,
                                        const char* content_type,
                                        const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "opening '%s'", path);
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error_number = errno;
    close(fd);
    return pcp_status_from_errno(error_number, "stat '%s'", path);
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "'%s' is not a regular file", path);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_http_response_body_take(response, http_status,
                                                       content_type, NULL, 0));
  response->file_fd = fd;
  response->file_byte_length = (uint64_t)info.st_size;
  return pcp_ok_status();
}

pcp_status_t pcp_http_response_json_set(pcp_http_response_t* response,
                                        int http_status, const json_t* value) {
  char* text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!text) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "JSON value could not be serialized");
  }
  return pcp_http_response_body_take(response, http_status, "application/json",
                                     text, strlen(text));
}

pcp_status_t pcp_http_response_json_take(pcp_http_response_t* response,
                                         int http_status, json_t* value) {
  if (!value) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "JSON response value missing (json_pack failed?)");
  }
  pcp_status_t status =
      pcp_http_response_json_set(response, http_status, value);
  json_decref(value);
  return status;
}

pcp_status_t pcp_http_response_error_set(pcp_http_response_t* response,
                                         int http_status, const char* code,
                                         const char* message) {
  // Built in a scratch builder and copied into a body block: error bodies
  // are small, and the block is what lets libmicrohttpd free through the
  // allocator.
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(response->allocator, 0, &builder);
  pcp_status_t status = pcp_http_error_json_format(code, message, &builder);
  if (!status) {
    status = pcp_http_response_body_set(
        response, http_status, "application/json", builder.data, builder.size);
  }
  pcp_string_builder_deinitialize(&builder);
  return status;
}

pcp_status_t pcp_http_response_status_set(pcp_http_response_t* response,
                                          pcp_status_t status) {
  pcp_status_code_t code = pcp_status_code(status);
  if (code == PCP_STATUS_OK) {
    code = PCP_STATUS_INTERNAL;  // an error body for OK is a caller bug
  }
  return pcp_http_response_error_set(response, pcp_http_status_from_code(code),
                                     pcp_status_code_string(code),
                                     pcp_status_message(status));
}

//===----------------------------------------------------------------------===//
// Request accessors
//===----------------------------------------------------------------------===//

const char* pcp_http_request_method(const pcp_http_request_t* request) {
  return request->method;
}

const char* pcp_http_request_path(const pcp_http_request_t* request) {
  return request->path;
}

const char* pcp_http_request_route(const pcp_http_request_t* request) {
  return request->route ? request->route->pattern : NULL;
}

const char* pcp_http_request_param(const pcp_http_request_t* request,
                                   const char* name) {
  for (size_t i = 0; i < request->param_count; ++i) {
    if (strcmp(request->param_names[i], name) == 0) {
      return request->param_values[i];
    }
  }
  return NULL;
}

const char* pcp_http_request_query(const pcp_http_request_t* request,
                                   const char* name) {
  const char* value = NULL;
  if (MHD_lookup_connection_value_n(request->connection, MHD_GET_ARGUMENT_KIND,
                                    name, strlen(name), &value,
                                    NULL) != MHD_YES) {
    return NULL;
  }
  return value ? value : "";  // "?flag" without '=' has a NULL value
}

const char* pcp_http_request_header(const pcp_http_request_t* request,
                                    const char* name) {
  return MHD_lookup_connection_value(request->connection, MHD_HEADER_KIND,
                                     name);
}

pcp_string_view_t pcp_http_request_body(const pcp_http_request_t* request) {
  return pcp_make_string_view(request->body ? request->body : "",
                              request->body_length);
}

const char* pcp_http_request_remote_address(const pcp_http_request_t* request) {
  return request->remote_address;
}

bool pcp_http_request_client_gone(const pcp_http_request_t* request) {
  const union MHD_ConnectionInfo* info = MHD_get_connection_info(
      request->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!info) {
    return false;
  }
  // The request is read in full, so the socket holds nothing for us until
  // the client sends its next request (then a byte is waiting: alive) or
  // closes (recv answers 0, or a reset). Peeking consumes nothing, and a
  // TLS peer's close_notify record reads as data: such a client is seen
  // gone only once its FIN or RST arrives after it.
  char byte;
  ssize_t n = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    return true;
  }
  return n < 0 && (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN ||
                   errno == EBADF);
}

const char* pcp_http_request_id(const pcp_http_request_t* request) {
  return request->request_id;
}

const char* pcp_http_request_scope(const pcp_http_request_t* request) {
  return request->route ? request->route->scope : NULL;
}

pcp_status_t pcp_http_request_json_parse(const pcp_http_request_t* request,
                                         json_t** out_value) {
  *out_value = NULL;
  if (request->body_length == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "request body is empty; expected JSON");
  }
  size_t max_depth = request->route && request->route->max_json_depth
                         ? request->route->max_json_depth
                         : 0;
  if (max_depth == 0) {
    max_depth = pcp_http_server_json_depth_limit(request->server);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_http_json_depth_check(
      request->body, request->body_length, max_depth));
  json_error_t error;
  json_t* value = json_loadb(request->body, request->body_length,
                             JSON_REJECT_DUPLICATES, &error);
  if (!value) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "invalid JSON at line %d column %d: %s", error.line,
                           error.column, error.text);
  }
  *out_value = value;
  return pcp_ok_status();
}
