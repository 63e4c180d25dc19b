// SPDX-License-Identifier: Apache-2.0
// The worker's on-disk program cache: one file per program, named by its
// SHA-256, verified on every read.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "roles/worker/worker_impl.h"

pcp_status_t pcp_roles_worker_program_cache_initialize(
    const char* directory, pcp_allocator_t allocator,
    pcp_roles_worker_program_cache_t* out_cache) {
  memset(out_cache, 0, sizeof(*out_cache));
  if (!directory || !directory[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "program cache: empty directory");
  }
  PCP_RETURN_IF_ERROR(pcp_file_make_directories(directory),
                      "program cache directory '%s'", directory);
  size_t length = strlen(directory) + 1;
  void* copy = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_malloc(allocator, length, &copy),
                      "program cache");
  memcpy(copy, directory, length);
  out_cache->directory = copy;
  out_cache->allocator = allocator;
  return pcp_ok_status();
}

void pcp_roles_worker_program_cache_deinitialize(
    pcp_roles_worker_program_cache_t* cache) {
  if (cache->directory) {
    pcp_allocator_free(cache->allocator, cache->directory);
  }
  cache->directory = NULL;
}

pcp_status_t pcp_roles_worker_program_cache_path(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], char* buffer,
    size_t capacity) {
  pcp_sha256_t digest;
  memcpy(digest.bytes, program, sizeof(digest.bytes));
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  int n = snprintf(buffer, capacity, "%s/%s.vmfb", cache->directory, hex);
  if (n < 0 || (size_t)n >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "program cache path under '%s' is too long",
                           cache->directory);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_roles_worker_program_cache_load(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], void** out_data,
    size_t* out_byte_length) {
  *out_data = NULL;
  *out_byte_length = 0;
  char path[4096];
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_worker_program_cache_path(cache, program, path, sizeof(path)));
  if (!pcp_file_exists(path)) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "program '%s' not cached",
                           path);
  }
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_read_all(
      path, PCP_ROLES_WORKER_MAX_PROGRAM_BYTES, &data, &length));
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  if (memcmp(digest.bytes, program, PCP_SHA256_BYTE_LENGTH) != 0) {
    pcp_allocator_free(pcp_allocator_system(), data);  // pcp_file_read_all
    // A torn or corrupted copy: removing it turns the next offer into a
    // fetch instead of a load that fails the same way forever.
    int removed = unlink(path) == 0 ? 0 : errno;
    return pcp_make_status(
        PCP_STATUS_DATA_LOSS, "cached program '%s' does not match its hash%s",
        path, removed ? " (and could not be removed)" : "; removed");
  }
  *out_data = data;
  *out_byte_length = length;
  return pcp_ok_status();
}

pcp_status_t pcp_roles_worker_program_cache_lookup(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], bool* out_found) {
  *out_found = false;
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_roles_worker_program_cache_load(cache, program, &data, &length);
  pcp_allocator_free(pcp_allocator_system(), data);  // pcp_file_read_all
  if (!status) {
    *out_found = true;
    return pcp_ok_status();
  }
  pcp_status_code_t code = pcp_status_code(status);
  if (code == PCP_STATUS_NOT_FOUND || code == PCP_STATUS_DATA_LOSS) {
    if (code == PCP_STATUS_DATA_LOSS) {
      pcp_log_context_t context = {.role = "worker"};
      pcp_log_status(PCP_LOG_WARN, &context, status, "program cache");
    }
    pcp_status_ignore(status);
    return pcp_ok_status();
  }
  return status;
}

pcp_status_t pcp_roles_worker_program_cache_store(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], const void* data,
    size_t byte_length) {
  pcp_sha256_t digest;
  pcp_sha256_compute(data, byte_length, &digest);
  if (memcmp(digest.bytes, program, PCP_SHA256_BYTE_LENGTH) != 0) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "program bytes do not hash to the offered id");
  }
  char path[4096];
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_worker_program_cache_path(cache, program, path, sizeof(path)));
  return pcp_file_write_atomic(path, data, byte_length);
}
