// SPDX-License-Identifier: Apache-2.0
//
// Helpers shared by the proto tests (not part of the module's API).

#ifndef PCP_PROTO_PROTO_TEST_IMPL_H_
#define PCP_PROTO_PROTO_TEST_IMPL_H_

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "proto/proto.h"

#define ASSERT_OK(expr)                      \
  do {                                       \
    pcp_status_t s_ = (expr);                \
    if (s_) {                                \
      char b_[1024];                         \
      pcp_status_format(s_, b_, sizeof(b_)); \
      pcp_status_ignore(s_);                 \
      fail_msg("%s failed: %s", #expr, b_);  \
    }                                        \
  } while (0)

#define ASSERT_CODE(expr, code)                                                \
  do {                                                                         \
    pcp_status_t s_ = (expr);                                                  \
    char b_[1024] = "OK";                                                      \
    if (s_)                                                                    \
      pcp_status_format(s_, b_, sizeof(b_));                                   \
    pcp_status_code_t c_ = pcp_status_consume_code(s_);                        \
    if (c_ != (code)) {                                                        \
      fail_msg("%s: expected %s, got %s", #expr, pcp_status_code_string(code), \
               b_);                                                            \
    }                                                                          \
  } while (0)

// Flattens and frees an encoded frame; caller frees the bytes with free().
static inline uint8_t* test_flatten(pcp_proto_encoded_frame_t* frame,
                                    size_t* out_length) {
  uint8_t* bytes = NULL;
  ASSERT_OK(pcp_proto_encoded_frame_flatten(frame, pcp_allocator_system(),
                                            &bytes, out_length));
  pcp_proto_encoded_frame_deinitialize(frame);
  return bytes;
}

#endif  // PCP_PROTO_PROTO_TEST_IMPL_H_
