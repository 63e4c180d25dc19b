// SPDX-License-Identifier: Apache-2.0
// SHA-256 through OpenSSL's EVP interface (hardware-accelerated where the CPU
// has SHA extensions).

#include <openssl/evp.h>

#include "base.h"

void pcp_sha256_compute(const void* data, size_t byte_length,
                        pcp_sha256_t* out_digest) {
  unsigned int length = 0;
  PCP_ASSERT(EVP_Digest(data, byte_length, out_digest->bytes, &length,
                        EVP_sha256(), NULL) == 1);
}

void pcp_sha256_to_hex(const pcp_sha256_t* digest,
                       char out_hex[PCP_SHA256_HEX_LENGTH + 1]) {
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < PCP_SHA256_BYTE_LENGTH; ++i) {
    out_hex[2 * i] = kHex[digest->bytes[i] >> 4];
    out_hex[2 * i + 1] = kHex[digest->bytes[i] & 15];
  }
  out_hex[PCP_SHA256_HEX_LENGTH] = 0;
}

pcp_status_t pcp_sha256_stream_create(pcp_sha256_stream_t** out_stream) {
  *out_stream = NULL;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(ctx);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "creating SHA-256 context");
  }
  // The handle is the context itself; no extra allocation.
  *out_stream = (pcp_sha256_stream_t*)ctx;
  return pcp_ok_status();
}

void pcp_sha256_stream_update(pcp_sha256_stream_t* stream, const void* data,
                              size_t byte_length) {
  PCP_ASSERT(EVP_DigestUpdate((EVP_MD_CTX*)stream, data, byte_length) == 1);
}

void pcp_sha256_stream_finish(pcp_sha256_stream_t* stream,
                              pcp_sha256_t* out_digest) {
  unsigned int length = 0;
  PCP_ASSERT(
      EVP_DigestFinal_ex((EVP_MD_CTX*)stream, out_digest->bytes, &length) == 1);
  EVP_MD_CTX_free((EVP_MD_CTX*)stream);
}
