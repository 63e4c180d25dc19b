// SPDX-License-Identifier: Apache-2.0
//
// Frame codec: CRC32C, the 32-byte header, the payload (length-prefixed JSON
// + 64-byte aligned sections), the encoder and the incremental decoder.

#include <assert.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto_impl.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

//===----------------------------------------------------------------------===//
// Layout pins (docs/protocol.md s.1.1). The offsets are wire constants.
//===----------------------------------------------------------------------===//

enum {
  HEADER_OFFSET_MAGIC = 0,
  HEADER_OFFSET_VERSION = 4,
  HEADER_OFFSET_TYPE = 6,
  HEADER_OFFSET_FLAGS = 8,
  HEADER_OFFSET_CRC = 12,
  HEADER_OFFSET_REQUEST_ID = 16,
  HEADER_OFFSET_PAYLOAD_LENGTH = 24,
  HEADER_END = 32,
};
static_assert(HEADER_END == PCP_PROTO_HEADER_BYTE_LENGTH,
              "the header is 32 bytes forever");
static_assert(HEADER_OFFSET_VERSION == 4 && HEADER_OFFSET_TYPE == 6,
              "HELLO is frozen: magic, version and type never move");
static_assert(PCP_PROTO_MESSAGE_HELLO == 1, "HELLO is type 1 forever");
static_assert(PCP_PROTO_MAGIC ==
                  ('P' | ('C' << 8) | ('P' << 16) | ((uint32_t)'F' << 24)),
              "magic is the bytes PCPF");
static_assert(PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH == 8,
              "payload prefix: u32 json_length, u32 json_crc32c");
static_assert(PCP_PROTO_SECTION_ALIGNMENT == 64, "sections are 64-aligned");
static_assert(PCP_STATUS_CODE_COUNT_ <= 256, "status codes fit a byte");
static_assert(PCP_ELEMENT_TYPE_U64 == 13, "wire dtypes 1..13");

//===----------------------------------------------------------------------===//
// CRC32C
//===----------------------------------------------------------------------===//

// Fuzz builds (-DPCP_FUZZ=ON) compute every checksum but accept mismatches,
// the oss-fuzz convention: otherwise the fuzzer never gets past the header
// CRC into the JSON, section and state-machine code. Never set elsewhere.
#if defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
static const bool kFuzzIgnoresChecksums = true;
#else
static const bool kFuzzIgnoresChecksums = false;
#endif

// Reflected Castagnoli polynomial 0x82F63B78, one byte at a time.
static const uint32_t kCrc32cTable[256] = {
    0x00000000, 0xf26b8303, 0xe13b70f7, 0x1350f3f4, 0xc79a971f, 0x35f1141c,
    0x26a1e7e8, 0xd4ca64eb, 0x8ad958cf, 0x78b2dbcc, 0x6be22838, 0x9989ab3b,
    0x4d43cfd0, 0xbf284cd3, 0xac78bf27, 0x5e133c24, 0x105ec76f, 0xe235446c,
    0xf165b798, 0x030e349b, 0xd7c45070, 0x25afd373, 0x36ff2087, 0xc494a384,
    0x9a879fa0, 0x68ec1ca3, 0x7bbcef57, 0x89d76c54, 0x5d1d08bf, 0xaf768bbc,
    0xbc267848, 0x4e4dfb4b, 0x20bd8ede, 0xd2d60ddd, 0xc186fe29, 0x33ed7d2a,
    0xe72719c1, 0x154c9ac2, 0x061c6936, 0xf477ea35, 0xaa64d611, 0x580f5512,
    0x4b5fa6e6, 0xb93425e5, 0x6dfe410e, 0x9f95c20d, 0x8cc531f9, 0x7eaeb2fa,
    0x30e349b1, 0xc288cab2, 0xd1d83946, 0x23b3ba45, 0xf779deae, 0x05125dad,
    0x1642ae59, 0xe4292d5a, 0xba3a117e, 0x4851927d, 0x5b016189, 0xa96ae28a,
    0x7da08661, 0x8fcb0562, 0x9c9bf696, 0x6ef07595, 0x417b1dbc, 0xb3109ebf,
    0xa0406d4b, 0x522bee48, 0x86e18aa3, 0x748a09a0, 0x67dafa54, 0x95b17957,
    0xcba24573, 0x39c9c670, 0x2a993584, 0xd8f2b687, 0x0c38d26c, 0xfe53516f,
    0xed03a29b, 0x1f682198, 0x5125dad3, 0xa34e59d0, 0xb01eaa24, 0x42752927,
    0x96bf4dcc, 0x64d4cecf, 0x77843d3b, 0x85efbe38, 0xdbfc821c, 0x2997011f,
    0x3ac7f2eb, 0xc8ac71e8, 0x1c661503, 0xee0d9600, 0xfd5d65f4, 0x0f36e6f7,
    0x61c69362, 0x93ad1061, 0x80fde395, 0x72966096, 0xa65c047d, 0x5437877e,
    0x4767748a, 0xb50cf789, 0xeb1fcbad, 0x197448ae, 0x0a24bb5a, 0xf84f3859,
    0x2c855cb2, 0xdeeedfb1, 0xcdbe2c45, 0x3fd5af46, 0x7198540d, 0x83f3d70e,
    0x90a324fa, 0x62c8a7f9, 0xb602c312, 0x44694011, 0x5739b3e5, 0xa55230e6,
    0xfb410cc2, 0x092a8fc1, 0x1a7a7c35, 0xe811ff36, 0x3cdb9bdd, 0xceb018de,
    0xdde0eb2a, 0x2f8b6829, 0x82f63b78, 0x709db87b, 0x63cd4b8f, 0x91a6c88c,
    0x456cac67, 0xb7072f64, 0xa457dc90, 0x563c5f93, 0x082f63b7, 0xfa44e0b4,
    0xe9141340, 0x1b7f9043, 0xcfb5f4a8, 0x3dde77ab, 0x2e8e845f, 0xdce5075c,
    0x92a8fc17, 0x60c37f14, 0x73938ce0, 0x81f80fe3, 0x55326b08, 0xa759e80b,
    0xb4091bff, 0x466298fc, 0x1871a4d8, 0xea1a27db, 0xf94ad42f, 0x0b21572c,
    0xdfeb33c7, 0x2d80b0c4, 0x3ed04330, 0xccbbc033, 0xa24bb5a6, 0x502036a5,
    0x4370c551, 0xb11b4652, 0x65d122b9, 0x97baa1ba, 0x84ea524e, 0x7681d14d,
    0x2892ed69, 0xdaf96e6a, 0xc9a99d9e, 0x3bc21e9d, 0xef087a76, 0x1d63f975,
    0x0e330a81, 0xfc588982, 0xb21572c9, 0x407ef1ca, 0x532e023e, 0xa145813d,
    0x758fe5d6, 0x87e466d5, 0x94b49521, 0x66df1622, 0x38cc2a06, 0xcaa7a905,
    0xd9f75af1, 0x2b9cd9f2, 0xff56bd19, 0x0d3d3e1a, 0x1e6dcdee, 0xec064eed,
    0xc38d26c4, 0x31e6a5c7, 0x22b65633, 0xd0ddd530, 0x0417b1db, 0xf67c32d8,
    0xe52cc12c, 0x1747422f, 0x49547e0b, 0xbb3ffd08, 0xa86f0efc, 0x5a048dff,
    0x8ecee914, 0x7ca56a17, 0x6ff599e3, 0x9d9e1ae0, 0xd3d3e1ab, 0x21b862a8,
    0x32e8915c, 0xc083125f, 0x144976b4, 0xe622f5b7, 0xf5720643, 0x07198540,
    0x590ab964, 0xab613a67, 0xb831c993, 0x4a5a4a90, 0x9e902e7b, 0x6cfbad78,
    0x7fab5e8c, 0x8dc0dd8f, 0xe330a81a, 0x115b2b19, 0x020bd8ed, 0xf0605bee,
    0x24aa3f05, 0xd6c1bc06, 0xc5914ff2, 0x37faccf1, 0x69e9f0d5, 0x9b8273d6,
    0x88d28022, 0x7ab90321, 0xae7367ca, 0x5c18e4c9, 0x4f48173d, 0xbd23943e,
    0xf36e6f75, 0x0105ec76, 0x12551f82, 0xe03e9c81, 0x34f4f86a, 0xc69f7b69,
    0xd5cf889d, 0x27a40b9e, 0x79b737ba, 0x8bdcb4b9, 0x988c474d, 0x6ae7c44e,
    0xbe2da0a5, 0x4c4623a6, 0x5f16d052, 0xad7d5351};

static uint32_t crc32c_software(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    crc = kCrc32cTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  }
  return crc;
}

#if defined(__x86_64__)
// The SSE 4.2 instruction computes exactly this CRC. One chain of crc32q is
// bound by the instruction's 3-cycle latency, so long inputs run three
// independent chains over consecutive blocks and merge them: CRC is linear,
// so crc(A|B) = shift(crc(A), |B|) ^ crc0(B), where shift multiplies by
// x^(8|B|) mod P and crc0 starts from a zero register. shift over one block
// is a fixed linear map, tabulated once from its 32 basis images.
#define CRC_BLOCK_BYTES 4096u

static uint32_t g_crc_shift[4][256];
static pthread_once_t g_crc_shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint32_t crc_zeros(uint32_t state,
                                                            size_t n) {
  uint64_t c = state;
  for (size_t i = 0; i < n / 8; ++i) c = _mm_crc32_u64(c, 0);
  return (uint32_t)c;
}

static void crc_shift_initialize(void) {
  uint32_t basis[32];
  for (int i = 0; i < 32; ++i) basis[i] = crc_zeros(1u << i, CRC_BLOCK_BYTES);
  for (int k = 0; k < 4; ++k) {
    for (int b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int j = 0; j < 8; ++j) {
        if (b & (1 << j))
          v ^= basis[8 * k + j];
      }
      g_crc_shift[k][b] = v;
    }
  }
}

static inline uint32_t crc_shift_block(uint32_t x) {
  return g_crc_shift[0][x & 0xFF] ^ g_crc_shift[1][(x >> 8) & 0xFF] ^
         g_crc_shift[2][(x >> 16) & 0xFF] ^ g_crc_shift[3][x >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc,
                                                               const uint8_t* p,
                                                               size_t n) {
  uint64_t c = crc;
  while (n > 0 && ((uintptr_t)p & 7u) != 0) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    --n;
  }
  if (n >= 3 * CRC_BLOCK_BYTES) {
    pthread_once(&g_crc_shift_once, crc_shift_initialize);
    while (n >= 3 * CRC_BLOCK_BYTES) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < CRC_BLOCK_BYTES; i += 8) {
        uint64_t wa, wb, wd;
        memcpy(&wa, p + i, 8);
        memcpy(&wb, p + CRC_BLOCK_BYTES + i, 8);
        memcpy(&wd, p + 2 * CRC_BLOCK_BYTES + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
      }
      uint32_t merged = crc_shift_block((uint32_t)a) ^ (uint32_t)b;
      c = crc_shift_block(merged) ^ (uint32_t)d;
      p += 3 * CRC_BLOCK_BYTES;
      n -= 3 * CRC_BLOCK_BYTES;
    }
  }
  while (n >= 8) {
    uint64_t word;
    memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    --n;
  }
  return (uint32_t)c;
}
#endif

uint32_t pcp_proto_crc32c_extend(uint32_t crc, const void* data,
                                 size_t byte_length) {
  const uint8_t* p = (const uint8_t*)data;
  uint32_t state = ~crc;
  if (byte_length == 0)
    return crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) {
    return ~crc32c_sse42(state, p, byte_length);
  }
#endif
  return ~crc32c_software(state, p, byte_length);
}

//===----------------------------------------------------------------------===//
// Hex
//===----------------------------------------------------------------------===//

void pcp_proto_hex_encode(const uint8_t* bytes, size_t byte_length,
                          char* out_hex) {
  static const char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < byte_length; ++i) {
    out_hex[2 * i] = kDigits[bytes[i] >> 4];
    out_hex[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  out_hex[2 * byte_length] = '\0';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

bool pcp_proto_hex_decode(const char* hex, size_t byte_length,
                          uint8_t* out_bytes) {
  if (!hex || strlen(hex) != 2 * byte_length)
    return false;
  for (size_t i = 0; i < byte_length; ++i) {
    int hi = hex_value(hex[2 * i]);
    int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return false;
    out_bytes[i] = (uint8_t)((hi << 4) | lo);
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Names, limits, timeouts
//===----------------------------------------------------------------------===//

const char* pcp_proto_message_type_name(uint16_t type) {
  switch ((pcp_proto_message_type_t)type) {
    case PCP_PROTO_MESSAGE_HELLO:
      return "HELLO";
    case PCP_PROTO_MESSAGE_JOIN:
      return "JOIN";
    case PCP_PROTO_MESSAGE_CHALLENGE:
      return "CHALLENGE";
    case PCP_PROTO_MESSAGE_JOIN_PROOF:
      return "JOIN_PROOF";
    case PCP_PROTO_MESSAGE_ACCEPT:
      return "ACCEPT";
    case PCP_PROTO_MESSAGE_REJECT:
      return "REJECT";
    case PCP_PROTO_MESSAGE_HEARTBEAT:
      return "HEARTBEAT";
    case PCP_PROTO_MESSAGE_ERROR:
      return "ERROR";
    case PCP_PROTO_MESSAGE_DRAIN:
      return "DRAIN";
    case PCP_PROTO_MESSAGE_SHUTDOWN:
      return "SHUTDOWN";
    case PCP_PROTO_MESSAGE_PROGRAM_OFFER:
      return "PROGRAM_OFFER";
    case PCP_PROTO_MESSAGE_PROGRAM_FETCH:
      return "PROGRAM_FETCH";
    case PCP_PROTO_MESSAGE_BLOB_CHUNK:
      return "BLOB_CHUNK";
    case PCP_PROTO_MESSAGE_PROGRAM_ACK:
      return "PROGRAM_ACK";
    case PCP_PROTO_MESSAGE_TASK_ASSIGN:
      return "TASK_ASSIGN";
    case PCP_PROTO_MESSAGE_TASK_PROGRESS:
      return "TASK_PROGRESS";
    case PCP_PROTO_MESSAGE_TASK_RESULT:
      return "TASK_RESULT";
    case PCP_PROTO_MESSAGE_TASK_CANCEL:
      return "TASK_CANCEL";
  }
  return NULL;
}

const char* pcp_proto_reject_reason_name(uint32_t reason) {
  switch (reason) {
    case PCP_PROTO_REJECT_AUTH_FAILED:
      return "AUTH_FAILED";
    case PCP_PROTO_REJECT_VERSION_UNSUPPORTED:
      return "VERSION_UNSUPPORTED";
    case PCP_PROTO_REJECT_DUPLICATE_WORKER:
      return "DUPLICATE_WORKER";
    case PCP_PROTO_REJECT_DRAINING:
      return "DRAINING";
    case PCP_PROTO_REJECT_PROTOCOL_VIOLATION:
      return "PROTOCOL_VIOLATION";
    case PCP_PROTO_REJECT_CAPACITY:
      return "CAPACITY";
    case PCP_PROTO_REJECT_HANDSHAKE_TIMEOUT:
      return "HANDSHAKE_TIMEOUT";
    case PCP_PROTO_REJECT_BAD_JOIN:
      return "BAD_JOIN";
    default:
      return "UNKNOWN";
  }
}

pcp_proto_limits_t pcp_proto_limits_default(void) {
  pcp_proto_limits_t limits = {
      .max_frame_bytes = UINT64_C(80) << 20,
      .max_json_bytes = 1u << 20,
      .max_json_depth = 32,
      .max_sections = 64,
      .max_rank = PCP_MAX_TENSOR_RANK,
      .chunk_bytes = UINT64_C(16) << 20,
      .max_chunk_bytes = UINT64_C(64) << 20,
      .max_blob_bytes = UINT64_C(16) << 30,
      .max_blob_assemblies = 4,
      .max_in_flight = 64,
  };
  return limits;
}

#define CHECK_LIMIT_(field, ceiling)                                       \
  do {                                                                     \
    if (limits->field == 0 || (uint64_t)limits->field > (ceiling)) {       \
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,                  \
                             "fabric limit %s=%llu: must be in [1, %llu]", \
                             #field, (unsigned long long)limits->field,    \
                             (unsigned long long)(ceiling));               \
    }                                                                      \
  } while (0)

pcp_status_t pcp_proto_limits_validate(const pcp_proto_limits_t* limits) {
  CHECK_LIMIT_(max_frame_bytes, PCP_PROTO_CEILING_FRAME_BYTES);
  CHECK_LIMIT_(max_json_bytes, PCP_PROTO_CEILING_JSON_BYTES);
  CHECK_LIMIT_(max_json_depth, PCP_PROTO_CEILING_JSON_DEPTH);
  CHECK_LIMIT_(max_sections, PCP_PROTO_CEILING_SECTIONS);
  CHECK_LIMIT_(max_rank, PCP_MAX_TENSOR_RANK);
  CHECK_LIMIT_(chunk_bytes, PCP_PROTO_CEILING_CHUNK_BYTES);
  CHECK_LIMIT_(max_chunk_bytes, PCP_PROTO_CEILING_CHUNK_BYTES);
  CHECK_LIMIT_(max_blob_bytes, PCP_PROTO_CEILING_BLOB_BYTES);
  CHECK_LIMIT_(max_blob_assemblies, PCP_PROTO_CEILING_BLOB_ASSEMBLIES);
  CHECK_LIMIT_(max_in_flight, PCP_PROTO_CEILING_IN_FLIGHT);
  if (limits->chunk_bytes > limits->max_chunk_bytes) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric limit chunk_bytes=%llu exceeds "
                           "max_chunk_bytes=%llu",
                           (unsigned long long)limits->chunk_bytes,
                           (unsigned long long)limits->max_chunk_bytes);
  }
  // A chunk frame carries the chunk plus a small JSON part; leave 64 KiB.
  if (limits->chunk_bytes + (64u << 10) > limits->max_frame_bytes) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric limit chunk_bytes=%llu does not fit in "
                           "max_frame_bytes=%llu with 64 KiB for the header",
                           (unsigned long long)limits->chunk_bytes,
                           (unsigned long long)limits->max_frame_bytes);
  }
  return pcp_ok_status();
}

pcp_proto_timeouts_t pcp_proto_timeouts_from_heartbeat(
    uint32_t heartbeat_interval_ms) {
  if (heartbeat_interval_ms < PCP_PROTO_HEARTBEAT_MIN_MS) {
    heartbeat_interval_ms = PCP_PROTO_HEARTBEAT_MIN_MS;
  }
  if (heartbeat_interval_ms > PCP_PROTO_HEARTBEAT_MAX_MS) {
    heartbeat_interval_ms = PCP_PROTO_HEARTBEAT_MAX_MS;
  }
  int64_t h = (int64_t)heartbeat_interval_ms * 1000000;
  pcp_proto_timeouts_t t = {
      .heartbeat_interval_ns = h,
      .silence_timeout_ns = 3 * h,
      .tick_interval_ns = h / 4,
      .handshake_timeout_ns = 5 * h,
      .resume_window_ns = 10 * h,
      .backoff_initial_ns = h / 10,
      .backoff_max_ns = 5 * h,
  };
  return t;
}

//===----------------------------------------------------------------------===//
// Aligned memory, scratch
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_aligned_allocate(pcp_allocator_t allocator,
                                        size_t byte_length, uint8_t** out_ptr) {
  *out_ptr = NULL;
  if (byte_length > SIZE_MAX - PCP_PROTO_SECTION_ALIGNMENT) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "size overflow");
  }
  void* raw = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_malloc(allocator, byte_length + PCP_PROTO_SECTION_ALIGNMENT,
                           &raw),
      "allocating %zu bytes", byte_length);
  uintptr_t base = (uintptr_t)raw;
  uintptr_t aligned = (base + PCP_PROTO_SECTION_ALIGNMENT) &
                      ~(uintptr_t)(PCP_PROTO_SECTION_ALIGNMENT - 1);
  uint8_t* p = (uint8_t*)raw + (aligned - base);
  p[-1] = (uint8_t)(aligned - base);  // 1..64
  *out_ptr = p;
  return pcp_ok_status();
}

void pcp_proto_aligned_free(pcp_allocator_t allocator, uint8_t* ptr) {
  if (!ptr)
    return;
  pcp_allocator_free(allocator, ptr - ptr[-1]);
}

pcp_status_t pcp_proto_frame_scratch(pcp_proto_frame_t* frame,
                                     size_t byte_length, void** out_ptr) {
  pcp_allocator_free(frame->allocator, frame->parsed);
  frame->parsed = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      frame->allocator, byte_length ? byte_length : 1, &frame->parsed));
  *out_ptr = frame->parsed;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Header
//===----------------------------------------------------------------------===//

void pcp_proto_header_encode(const pcp_proto_header_t* header,
                             uint8_t out_bytes[PCP_PROTO_HEADER_BYTE_LENGTH]) {
  store_le32(out_bytes + HEADER_OFFSET_MAGIC, PCP_PROTO_MAGIC);
  store_le16(out_bytes + HEADER_OFFSET_VERSION, header->version);
  store_le16(out_bytes + HEADER_OFFSET_TYPE, header->type);
  store_le32(out_bytes + HEADER_OFFSET_FLAGS, header->flags);
  store_le32(out_bytes + HEADER_OFFSET_CRC, 0);
  store_le64(out_bytes + HEADER_OFFSET_REQUEST_ID, header->request_id);
  store_le64(out_bytes + HEADER_OFFSET_PAYLOAD_LENGTH, header->payload_length);
  store_le32(out_bytes + HEADER_OFFSET_CRC,
             pcp_proto_crc32c(out_bytes, PCP_PROTO_HEADER_BYTE_LENGTH));
}

pcp_status_t pcp_proto_header_decode(
    const uint8_t bytes[PCP_PROTO_HEADER_BYTE_LENGTH],
    const pcp_proto_limits_t* limits, uint16_t negotiated_version,
    pcp_proto_header_t* out_header) {
  memset(out_header, 0, sizeof(*out_header));
  pcp_proto_header_t h;
  h.magic = load_le32(bytes + HEADER_OFFSET_MAGIC);
  h.version = load_le16(bytes + HEADER_OFFSET_VERSION);
  h.type = load_le16(bytes + HEADER_OFFSET_TYPE);
  h.flags = load_le32(bytes + HEADER_OFFSET_FLAGS);
  h.header_crc32c = load_le32(bytes + HEADER_OFFSET_CRC);
  h.request_id = load_le64(bytes + HEADER_OFFSET_REQUEST_ID);
  h.payload_length = load_le64(bytes + HEADER_OFFSET_PAYLOAD_LENGTH);
  if (h.magic != PCP_PROTO_MAGIC) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: bad magic 0x%08x (not a PCP fabric "
                           "peer)",
                           h.magic);
  }
  uint8_t copy[PCP_PROTO_HEADER_BYTE_LENGTH];
  memcpy(copy, bytes, sizeof(copy));
  store_le32(copy + HEADER_OFFSET_CRC, 0);
  uint32_t crc = pcp_proto_crc32c(copy, sizeof(copy));
  if (crc != h.header_crc32c && !kFuzzIgnoresChecksums) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "fabric frame: header checksum 0x%08x, computed "
                           "0x%08x",
                           h.header_crc32c, crc);
  }
  if (h.type != PCP_PROTO_MESSAGE_HELLO) {
    // HELLO may carry any version (s.2 rule 1); everything else must match
    // the negotiated one, or be one we speak before negotiation.
    bool ok = negotiated_version ? h.version == negotiated_version
                                 : (h.version >= PCP_PROTO_VERSION_MIN &&
                                    h.version <= PCP_PROTO_VERSION_MAX);
    if (!ok) {
      return pcp_make_status(
          PCP_STATUS_INCOMPATIBLE,
          "fabric frame: version %u (type %u), expected "
          "%u",
          h.version, h.type,
          negotiated_version ? negotiated_version : PCP_PROTO_VERSION_MAX);
    }
  }
  if (h.flags != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: unknown flags 0x%08x", h.flags);
  }
  if (h.payload_length < PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: payload of %llu bytes is shorter "
                           "than its prefix",
                           (unsigned long long)h.payload_length);
  }
  if (h.payload_length >
      limits->max_frame_bytes - PCP_PROTO_HEADER_BYTE_LENGTH) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: %llu payload bytes exceed the "
                           "frame limit of %llu",
                           (unsigned long long)h.payload_length,
                           (unsigned long long)limits->max_frame_bytes);
  }
  *out_header = h;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// JSON helpers
//===----------------------------------------------------------------------===//

// Nesting depth of JSON text, counted before jansson parses it (jansson's
// own limit is a compile-time 2048, too deep for a recursive parser on a
// worker's stack budget and not configurable).
static bool json_depth_within(const uint8_t* text, size_t n,
                              uint32_t max_depth) {
  uint32_t depth = 0;
  bool in_string = false, escape = false;
  for (size_t i = 0; i < n; ++i) {
    uint8_t c = text[i];
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

pcp_status_t pcp_proto_json_u64(const json_t* object, const char* key,
                                uint64_t max, uint64_t* out_value) {
  json_t* v = json_object_get(object, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      (uint64_t)json_integer_value(v) > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected an integer in [0, %llu]", key,
                           (unsigned long long)max);
  }
  *out_value = (uint64_t)json_integer_value(v);
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_opt_u64(const json_t* object, const char* key,
                                    uint64_t max, uint64_t* out_value,
                                    bool* out_present) {
  if (out_present)
    *out_present = false;
  if (!json_object_get(object, key))
    return pcp_ok_status();
  if (out_present)
    *out_present = true;
  return pcp_proto_json_u64(object, key, max, out_value);
}

pcp_status_t pcp_proto_json_i64(const json_t* object, const char* key,
                                int64_t min, int64_t max, int64_t* out_value) {
  json_t* v = json_object_get(object, key);
  if (!json_is_integer(v) || json_integer_value(v) < min ||
      json_integer_value(v) > max) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected an integer in [%lld, %lld]", key,
                           (long long)min, (long long)max);
  }
  *out_value = (int64_t)json_integer_value(v);
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_string(const json_t* object, const char* key,
                                   size_t min_length, size_t max_length,
                                   const char** out_value) {
  json_t* v = json_object_get(object, key);
  if (!json_is_string(v)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected a string", key);
  }
  size_t n = json_string_length(v);
  if (n < min_length || n > max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': string of %zu bytes, expected %zu..%zu",
                           key, n, min_length, max_length);
  }
  *out_value = json_string_value(v);
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_opt_string(const json_t* object, const char* key,
                                       size_t max_length,
                                       const char** out_value) {
  *out_value = "";
  if (!json_object_get(object, key))
    return pcp_ok_status();
  return pcp_proto_json_string(object, key, 0, max_length, out_value);
}

pcp_status_t pcp_proto_json_hex(const json_t* object, const char* key,
                                size_t byte_length, uint8_t* out_bytes) {
  json_t* v = json_object_get(object, key);
  if (!json_is_string(v) ||
      !pcp_proto_hex_decode(json_string_value(v), byte_length, out_bytes)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected %zu hex digits", key,
                           2 * byte_length);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_bool(const json_t* object, const char* key,
                                 bool default_value, bool* out_value) {
  json_t* v = json_object_get(object, key);
  if (!v) {
    *out_value = default_value;
    return pcp_ok_status();
  }
  if (!json_is_boolean(v)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': expected true or false", key);
  }
  *out_value = json_is_true(v);
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_shape(const json_t* value, const char* what,
                                  uint32_t max_rank, uint32_t* out_rank,
                                  int64_t* out_shape) {
  if (!json_is_array(value) || json_array_size(value) > max_rank) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: 'shape' must be an array of at most %u dims",
                           what, max_rank);
  }
  size_t rank = json_array_size(value);
  for (size_t i = 0; i < rank; ++i) {
    json_t* d = json_array_get(value, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: shape dim %zu must be an integer >= 0", what,
                             i);
    }
    out_shape[i] = (int64_t)json_integer_value(d);
  }
  *out_rank = (uint32_t)rank;
  return pcp_ok_status();
}

bool pcp_proto_tensor_byte_length(pcp_element_type_t type, uint32_t rank,
                                  const int64_t* shape, uint64_t* out_length) {
  if (type <= PCP_ELEMENT_TYPE_UNKNOWN || type >= PCP_ELEMENT_TYPE_COUNT_) {
    return false;
  }
  uint64_t n = pcp_element_type_byte_size(type);
  for (uint32_t i = 0; i < rank; ++i) {
    if (shape[i] < 0)
      return false;
    if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
      return false;
  }
  *out_length = n;
  return true;
}

pcp_status_t pcp_proto_json_set(json_t* object, const char* key,
                                json_t* value) {
  if (!value || json_object_set_new(object, key, value) != 0) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building key '%s'", key);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_set_hex(json_t* object, const char* key,
                                    const uint8_t* bytes, size_t byte_length) {
  char hex[2 * 64 + 1];
  PCP_ASSERT(byte_length <= 64);
  pcp_proto_hex_encode(bytes, byte_length, hex);
  return pcp_proto_json_set(object, key, json_string(hex));
}

// Strict UTF-8 as jansson checks it (no overlong forms, no surrogates,
// nothing above U+10FFFF), so that a NULL from the unchecked constructor
// can only mean out of memory.
static bool utf8_valid(const char* text, size_t n) {
  const uint8_t* p = (const uint8_t*)text;
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    size_t extra = c < 0x80             ? 0
                   : (c & 0xe0) == 0xc0 ? 1
                   : (c & 0xf0) == 0xe0 ? 2
                   : (c & 0xf8) == 0xf0 ? 3
                                        : 4;
    if (extra == 4 || i + extra >= n + (extra == 0)) {
      return false;
    }
    uint32_t cp = extra == 0 ? c : c & (0x3f >> extra);
    for (size_t k = 1; k <= extra; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

pcp_status_t pcp_proto_json_string_make(const char* key, const char* value,
                                        size_t max_length, json_t** out) {
  *out = NULL;
  if (!value)
    value = "";
  size_t n = strlen(value);
  if (n > max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': %zu bytes, at most %zu", key, n,
                           max_length);
  }
  if (!utf8_valid(value, n)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key '%s': not valid UTF-8", key);
  }
  *out = json_stringn_nocheck(value, n);
  if (!*out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building key '%s'", key);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_json_set_string(json_t* object, const char* key,
                                       const char* value, size_t max_length) {
  json_t* s = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_json_string_make(key, value, max_length, &s));
  return pcp_proto_json_set(object, key, s);
}

//===----------------------------------------------------------------------===//
// Frames
//===----------------------------------------------------------------------===//

void pcp_proto_frame_deinitialize(pcp_proto_frame_t* frame) {
  if (!frame)
    return;
  if (frame->control)
    json_decref(frame->control);
  if (frame->sections)
    pcp_allocator_free(frame->allocator, frame->sections);
  if (frame->payload)
    pcp_proto_aligned_free(frame->allocator, frame->payload);
  if (frame->parsed)
    pcp_allocator_free(frame->allocator, frame->parsed);
  memset(frame, 0, sizeof(*frame));
}

void pcp_proto_frame_move(pcp_proto_frame_t* frame,
                          pcp_proto_frame_t* out_frame) {
  *out_frame = *frame;
  memset(frame, 0, sizeof(*frame));
}

void pcp_proto_encoded_frame_deinitialize(pcp_proto_encoded_frame_t* frame) {
  if (!frame)
    return;
  if (frame->head)
    pcp_allocator_free(frame->allocator, frame->head);
  if (frame->segments)
    pcp_allocator_free(frame->allocator, frame->segments);
  memset(frame, 0, sizeof(*frame));
}

pcp_status_t pcp_proto_encoded_frame_flatten(
    const pcp_proto_encoded_frame_t* frame, pcp_allocator_t allocator,
    uint8_t** out_bytes, size_t* out_byte_length) {
  *out_bytes = NULL;
  *out_byte_length = 0;
  if (frame->total_length > SIZE_MAX) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "frame too large");
  }
  void* buffer = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      allocator, frame->total_length ? (size_t)frame->total_length : 1,
      &buffer));
  uint8_t* p = buffer;
  for (size_t i = 0; i < frame->segment_count; ++i) {
    if (frame->segments[i].byte_length) {
      memcpy(p, frame->segments[i].data, frame->segments[i].byte_length);
      p += frame->segments[i].byte_length;
    }
  }
  PCP_ASSERT((uint64_t)(p - (uint8_t*)buffer) == frame->total_length);
  *out_bytes = buffer;
  *out_byte_length = (size_t)frame->total_length;
  return pcp_ok_status();
}

static const uint8_t kZeroPadding[PCP_PROTO_SECTION_ALIGNMENT];

static pcp_status_t build_sections_json(const pcp_proto_section_t* sections,
                                        size_t count,
                                        const pcp_proto_limits_t* limits,
                                        uint64_t* offsets, uint64_t* lengths,
                                        uint64_t* out_data_length,
                                        json_t** out_array) {
  *out_array = NULL;
  json_t* array = json_array();
  if (!array) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  }
  uint64_t end = 0;
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < count && !status; ++i) {
    const pcp_proto_section_t* s = &sections[i];
    size_t name_length = s->name ? strlen(s->name) : 0;
    uint64_t length = 0;
    if (name_length == 0 || name_length > PCP_PROTO_MAX_STRING_BYTES) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "section %zu: name must be 1..%u bytes", i,
                               PCP_PROTO_MAX_STRING_BYTES);
      break;
    }
    if (s->rank > limits->max_rank) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "section '%s': rank %u exceeds %u", s->name,
                               s->rank, limits->max_rank);
      break;
    }
    if (!pcp_proto_tensor_byte_length(s->element_type, s->rank, s->shape,
                                      &length)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "section '%s': bad dtype %d or shape", s->name,
                               (int)s->element_type);
      break;
    }
    if (length > 0 && !s->data) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "section '%s': no data", s->name);
      break;
    }
    uint64_t offset = align64_u64(end);
    if (length > limits->max_frame_bytes ||
        offset + length > limits->max_frame_bytes) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "section '%s': %llu bytes exceed the frame "
                               "limit %llu; send it as a chunked blob",
                               s->name, (unsigned long long)length,
                               (unsigned long long)limits->max_frame_bytes);
      break;
    }
    offsets[i] = offset;
    lengths[i] = length;
    end = offset + length;
    json_t* entry = json_object();
    json_t* shape = json_array();
    if (!entry || !shape) {
      json_decref(entry);
      json_decref(shape);
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    for (uint32_t d = 0; d < s->rank && !status; ++d) {
      if (json_array_append_new(shape, json_integer(s->shape[d])) != 0) {
        status =
            pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      }
    }
    uint32_t crc = pcp_proto_crc32c(s->data, (size_t)length);
    if (!status)
      status = pcp_proto_json_set_string(entry, "name", s->name, 256);
    if (!status) {
      status =
          pcp_proto_json_set(entry, "dtype", json_integer(s->element_type));
    }
    if (!status) {
      status = pcp_proto_json_set(entry, "shape", shape);
    } else {
      json_decref(shape);
    }
    if (!status) {
      status =
          pcp_proto_json_set(entry, "offset", json_integer((json_int_t)offset));
    }
    if (!status) {
      status =
          pcp_proto_json_set(entry, "length", json_integer((json_int_t)length));
    }
    if (!status)
      status = pcp_proto_json_set(entry, "crc32c", json_integer(crc));
    if (!status && json_array_append_new(array, entry) != 0) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else if (status) {
      json_decref(entry);
    }
  }
  if (status) {
    json_decref(array);
    return status;
  }
  *out_data_length = end;
  *out_array = array;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_frame_encode(uint16_t version, uint16_t type,
                                    uint64_t request_id, const json_t* control,
                                    const pcp_proto_section_t* sections,
                                    size_t section_count,
                                    const pcp_proto_limits_t* limits,
                                    pcp_allocator_t allocator,
                                    pcp_proto_encoded_frame_t* out_frame) {
  memset(out_frame, 0, sizeof(*out_frame));
  if (!json_is_object(control)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: control part must be an object");
  }
  if (section_count > limits->max_sections) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: %zu sections exceed the limit %u",
                           section_count, limits->max_sections);
  }
  uint64_t offsets[PCP_PROTO_CEILING_SECTIONS];
  uint64_t lengths[PCP_PROTO_CEILING_SECTIONS];
  uint64_t data_length = 0;
  json_t* object = (json_t*)control;
  json_incref(object);
  if (section_count > 0) {
    if (json_object_get(control, "sections")) {
      json_decref(object);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: 'sections' is reserved");
    }
    json_t* array = NULL;
    pcp_status_t status =
        build_sections_json(sections, section_count, limits, offsets, lengths,
                            &data_length, &array);
    if (status) {
      json_decref(object);
      return status;
    }
    json_decref(object);
    // json_copy is shallow and does not modify its argument; jansson's
    // prototype just lacks the const.
    object = json_copy((json_t*)control);
    // jansson's json_copy drops a key it cannot insert (out of memory)
    // without saying so: a short copy is a failure, not a smaller message.
    if (!object || json_object_size(object) != json_object_size(control)) {
      json_decref(object);
      json_decref(array);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    // set_new takes |array| even when it fails.
    if (json_object_set_new(object, "sections", array) != 0) {
      json_decref(object);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
  }
  char* text = json_dumps(object, JSON_COMPACT);
  json_decref(object);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: cannot serialize the control part");
  }
  size_t json_length = strlen(text);
  if (json_length > limits->max_json_bytes) {
    pcp_libc_free(text);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: JSON part of %zu bytes exceeds %u",
                           json_length, limits->max_json_bytes);
  }
  uint64_t prefix_and_json = PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH + json_length;
  uint64_t data_area =
      section_count ? align64_u64(prefix_and_json) : prefix_and_json;
  uint64_t payload_length = data_area + data_length;
  uint64_t total = PCP_PROTO_HEADER_BYTE_LENGTH + payload_length;
  if (total > limits->max_frame_bytes) {
    pcp_libc_free(text);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: %llu bytes exceed the frame limit "
                           "%llu",
                           (unsigned long long)total,
                           (unsigned long long)limits->max_frame_bytes);
  }
  size_t head_length = (size_t)(PCP_PROTO_HEADER_BYTE_LENGTH + data_area);
  size_t segment_capacity = 1 + 2 * section_count;
  void* head = NULL;
  void* segments = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, head_length, &head);
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, segment_capacity * sizeof(pcp_proto_iovec_t), &segments);
  }
  if (status) {
    pcp_libc_free(text);
    pcp_allocator_free(allocator, head);
    return status;
  }
  uint8_t* h = head;
  pcp_proto_header_t header = {
      .version = version,
      .type = type,
      .flags = 0,
      .request_id = request_id,
      .payload_length = payload_length,
  };
  pcp_proto_header_encode(&header, h);
  uint8_t* payload = h + PCP_PROTO_HEADER_BYTE_LENGTH;
  store_le32(payload, (uint32_t)json_length);
  store_le32(payload + 4, pcp_proto_crc32c(text, json_length));
  // The JSON part is length-prefixed, never NUL-terminated on the wire.
  // NOLINTNEXTLINE(bugprone-not-null-terminated-result)
  memcpy(payload + PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH, text, json_length);
  pcp_libc_free(text);

  pcp_proto_iovec_t* iov = segments;
  size_t n = 0;
  iov[n++] = (pcp_proto_iovec_t){head, head_length};
  for (size_t i = 0; i < section_count; ++i) {
    if (lengths[i]) {
      iov[n++] = (pcp_proto_iovec_t){sections[i].data, (size_t)lengths[i]};
    }
    if (i + 1 < section_count) {
      uint64_t gap = offsets[i + 1] - (offsets[i] + lengths[i]);
      if (gap)
        iov[n++] = (pcp_proto_iovec_t){kZeroPadding, (size_t)gap};
    }
  }
  out_frame->head = head;
  out_frame->head_length = head_length;
  out_frame->segments = iov;
  out_frame->segment_count = n;
  out_frame->total_length = total;
  out_frame->type = type;
  out_frame->allocator = allocator;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Payload validation (shared by the decoder)
//===----------------------------------------------------------------------===//

static bool all_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i])
      return false;
  }
  return true;
}

static pcp_status_t parse_section(const json_t* entry, size_t index,
                                  const pcp_proto_limits_t* limits,
                                  pcp_proto_section_t* out) {
  char what[48];
  snprintf(what, sizeof(what), "section %zu", index);
  if (!json_is_object(entry)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: not an object",
                           what);
  }
  uint64_t dtype = 0, offset = 0, length = 0, crc = 0;
  PCP_RETURN_IF_ERROR(
      pcp_proto_json_string(entry, "name", 1, PCP_PROTO_MAX_STRING_BYTES,
                            &out->name),
      "%s", what);
  PCP_RETURN_IF_ERROR(
      pcp_proto_json_u64(entry, "dtype", PCP_ELEMENT_TYPE_COUNT_ - 1, &dtype),
      "%s", what);
  if (dtype == PCP_ELEMENT_TYPE_UNKNOWN) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: dtype 0 (unknown) is not allowed", what);
  }
  out->element_type = (pcp_element_type_t)dtype;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_json_shape(json_object_get(entry, "shape"),
                                                what, limits->max_rank,
                                                &out->rank, out->shape));
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(entry, "offset", INT64_MAX, &offset),
                      "%s", what);
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(entry, "length", INT64_MAX, &length),
                      "%s", what);
  PCP_RETURN_IF_ERROR(pcp_proto_json_u64(entry, "crc32c", UINT32_MAX, &crc),
                      "%s", what);
  uint64_t expected = 0;
  if (!pcp_proto_tensor_byte_length(out->element_type, out->rank, out->shape,
                                    &expected) ||
      expected != length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s ('%s'): length %llu does not match its dtype "
                           "and shape",
                           what, out->name, (unsigned long long)length);
  }
  if (offset % PCP_PROTO_SECTION_ALIGNMENT != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s ('%s'): offset %llu is not 64-byte aligned",
                           what, out->name, (unsigned long long)offset);
  }
  out->offset = offset;
  out->byte_length = length;
  out->crc32c = (uint32_t)crc;
  return pcp_ok_status();
}

// Parses the control part and the section table of a payload whose first
// |head_length| bytes (prefix, JSON, padding to the data area) are in
// d->payload, into d->ready. Checks everything that does not need the data
// area's bytes: JSON checksum, depth and syntax, section rules and ranges.
static pcp_status_t parse_head(pcp_proto_frame_decoder_t* d) {
  const pcp_proto_limits_t* limits = &d->limits;
  uint8_t* payload = d->payload;
  uint64_t payload_length = d->header.payload_length;
  uint32_t json_length = load_le32(payload);
  uint32_t json_crc = load_le32(payload + 4);
  const uint8_t* text = payload + PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH;
  // Length limits were checked when the prefix arrived (commit).
  uint32_t crc = pcp_proto_crc32c(text, json_length);
  if (crc != json_crc && !kFuzzIgnoresChecksums) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "fabric frame: JSON checksum 0x%08x, computed "
                           "0x%08x",
                           json_crc, crc);
  }
  if (!json_depth_within(text, json_length, limits->max_json_depth)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: JSON nested deeper than %u",
                           limits->max_json_depth);
  }
  json_error_t error;
  json_t* control = json_loadb((const char*)text, json_length,
                               JSON_REJECT_DUPLICATES, &error);
  if (!control) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: JSON part: %s at %d:%d", error.text,
                           error.line, error.column);
  }
  if (!json_is_object(control)) {
    json_decref(control);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: JSON part is not an object");
  }
  pcp_proto_frame_t* frame = &d->ready;
  memset(frame, 0, sizeof(*frame));
  frame->allocator = d->allocator;
  frame->header = d->header;
  frame->control = control;
  d->head_parsed = true;
  uint64_t prefix_and_json =
      PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH + (uint64_t)json_length;
  json_t* array = json_object_get(control, "sections");
  size_t count = 0;
  if (array) {
    if (!json_is_array(array)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: 'sections' must be an array");
    }
    count = json_array_size(array);
  }
  if (count > limits->max_sections) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric frame: %zu sections exceed the limit %u",
                           count, limits->max_sections);
  }
  if (count == 0) {
    if (payload_length != prefix_and_json) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "fabric frame: %llu bytes after a JSON part of "
          "%u bytes and no sections",
          (unsigned long long)(payload_length - prefix_and_json), json_length);
    }
    return pcp_ok_status();
  }
  uint64_t data_area = align64_u64(prefix_and_json);
  if (data_area > payload_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: sections listed but no data area");
  }
  if (!all_zero(payload + prefix_and_json, data_area - prefix_and_json)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: non-zero padding after JSON");
  }
  uint64_t data_length = payload_length - data_area;
  void* table = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      d->allocator, count * sizeof(pcp_proto_section_t), &table));
  frame->sections = table;
  frame->section_count = count;
  uint64_t end = 0;
  for (size_t i = 0; i < count; ++i) {
    pcp_proto_section_t* s = &frame->sections[i];
    PCP_RETURN_IF_ERROR_BARE(
        parse_section(json_array_get(array, i), i, limits, s));
    if (s->offset < end || s->offset > data_length ||
        s->byte_length > data_length - s->offset) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: section %zu ('%s') at %llu+%llu "
                             "overlaps or leaves the data area of %llu",
                             i, s->name, (unsigned long long)s->offset,
                             (unsigned long long)s->byte_length,
                             (unsigned long long)data_length);
    }
    end = s->offset + s->byte_length;
  }
  if (end != data_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric frame: %llu trailing bytes after the "
                           "last section",
                           (unsigned long long)(data_length - end));
  }
  return pcp_ok_status();
}

// Checks the data area (|data|: in the payload, or where the data sink put
// it): zero padding and every section's CRC32C; points the sections at it.
static pcp_status_t check_data(pcp_proto_frame_decoder_t* d,
                               const uint8_t* data) {
  pcp_proto_frame_t* frame = &d->ready;
  uint64_t end = 0;
  for (size_t i = 0; i < frame->section_count; ++i) {
    pcp_proto_section_t* s = &frame->sections[i];
    if (!all_zero(data + end, s->offset - end)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: non-zero padding before section "
                             "%zu",
                             i);
    }
    s->data = data + s->offset;
    // A sink frame whose one section is its whole data area was checksummed
    // piece by piece as it arrived (commit).
    bool running = d->data_dest && frame->section_count == 1 &&
                   s->offset == 0 &&
                   s->byte_length == d->header.payload_length - d->head_length;
    uint32_t section_crc =
        running ? d->data_crc32c
                : pcp_proto_crc32c(s->data, (size_t)s->byte_length);
    if (section_crc != s->crc32c && !kFuzzIgnoresChecksums) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "fabric frame: section '%s' checksum 0x%08x, "
                             "computed 0x%08x",
                             s->name, s->crc32c, section_crc);
    }
    end = s->offset + s->byte_length;
  }
  return pcp_ok_status();
}

// Validates a complete payload and builds the frame.
static pcp_status_t finish_frame(pcp_proto_frame_decoder_t* d) {
  if (!d->head_parsed)
    PCP_RETURN_IF_ERROR_BARE(parse_head(d));
  const uint8_t* data = d->data_dest;
  if (!data) {
    uint64_t prefix_and_json =
        PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH + (uint64_t)load_le32(d->payload);
    data = d->payload + align64_u64(prefix_and_json);
  }
  PCP_RETURN_IF_ERROR_BARE(check_data(d, data));
  d->ready.payload = d->payload;
  d->payload = NULL;
  d->data_dest = NULL;
  d->head_parsed = false;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Incremental decoder
//===----------------------------------------------------------------------===//

void pcp_proto_frame_decoder_initialize(
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_frame_decoder_t* out_decoder) {
  memset(out_decoder, 0, sizeof(*out_decoder));
  out_decoder->limits = *limits;
  out_decoder->allocator = allocator;
  out_decoder->stage = PCP_PROTO_DECODER_HEADER;
}

void pcp_proto_frame_decoder_deinitialize(pcp_proto_frame_decoder_t* decoder) {
  pcp_proto_aligned_free(decoder->allocator, decoder->payload);
  decoder->payload = NULL;
  pcp_proto_frame_deinitialize(&decoder->ready);
  decoder->stage = PCP_PROTO_DECODER_FAILED;
}

void pcp_proto_frame_decoder_set_version(pcp_proto_frame_decoder_t* decoder,
                                         uint16_t version) {
  decoder->negotiated_version = version;
}

void pcp_proto_frame_decoder_set_data_sink(pcp_proto_frame_decoder_t* decoder,
                                           pcp_proto_frame_data_sink_fn_t fn,
                                           void* user_data) {
  decoder->data_sink = fn;
  decoder->data_sink_user_data = user_data;
}

static pcp_status_t decoder_fail(pcp_proto_frame_decoder_t* d,
                                 pcp_status_t status) {
  d->stage = PCP_PROTO_DECODER_FAILED;
  d->data_dest = NULL;
  d->head_parsed = false;
  pcp_proto_aligned_free(d->allocator, d->payload);
  d->payload = NULL;
  pcp_proto_frame_deinitialize(&d->ready);
  return status;
}

pcp_status_t pcp_proto_frame_decoder_window(pcp_proto_frame_decoder_t* decoder,
                                            void** out_data,
                                            size_t* out_capacity) {
  *out_data = NULL;
  *out_capacity = 0;
  switch (decoder->stage) {
    case PCP_PROTO_DECODER_HEADER:
      *out_data = decoder->header_bytes + decoder->header_filled;
      *out_capacity = PCP_PROTO_HEADER_BYTE_LENGTH - decoder->header_filled;
      return pcp_ok_status();
    case PCP_PROTO_DECODER_PAYLOAD: {
      size_t filled = decoder->payload_filled;
      size_t end = (size_t)decoder->header.payload_length;
      if (decoder->data_dest) {
        // The data area goes straight into the sink's buffer.
        *out_data = decoder->data_dest + (filled - decoder->head_length);
        *out_capacity = end - filled;
        return pcp_ok_status();
      }
      if (decoder->direct) {
        // Only the head goes into the payload buffer: stop at the prefix
        // until it tells the JSON length, then at the end of the head.
        end = decoder->head_length ? decoder->head_length
                                   : PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH;
      }
      *out_data = decoder->payload + filled;
      *out_capacity = end - filled;
      return pcp_ok_status();
    }
    case PCP_PROTO_DECODER_READY:
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "fabric decoder: take the ready frame first");
    case PCP_PROTO_DECODER_FAILED:
    default:
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "fabric decoder: failed earlier; close the "
                             "connection");
  }
}

// The head of a sink frame has arrived: check it, then ask the sink for the
// data area. When it declines, buffer the rest of the frame as usual.
static pcp_status_t direct_begin(pcp_proto_frame_decoder_t* d) {
  PCP_RETURN_IF_ERROR_BARE(parse_head(d));
  uint64_t data_length = d->header.payload_length - d->head_length;
  uint8_t* dest = NULL;
  if (d->ready.section_count > 0)
    dest = d->data_sink(d->data_sink_user_data, &d->ready, data_length);
  if (dest) {
    d->data_dest = dest;
    d->data_crc32c = 0;
    return pcp_ok_status();
  }
  uint8_t* full = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_aligned_allocate(
      d->allocator, (size_t)d->header.payload_length, &full));
  memcpy(full, d->payload, d->head_length);
  pcp_proto_aligned_free(d->allocator, d->payload);
  d->payload = full;
  d->direct = false;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_frame_decoder_commit(
    pcp_proto_frame_decoder_t* d, size_t byte_length,
    pcp_proto_parse_result_t* out_result) {
  *out_result = PCP_PROTO_PARSE_NEED_MORE;
  if (d->stage == PCP_PROTO_DECODER_HEADER) {
    PCP_ASSERT(byte_length <= PCP_PROTO_HEADER_BYTE_LENGTH - d->header_filled);
    d->header_filled += byte_length;
    if (d->header_filled < PCP_PROTO_HEADER_BYTE_LENGTH) {
      return pcp_ok_status();
    }
    pcp_status_t status = pcp_proto_header_decode(
        d->header_bytes, &d->limits, d->negotiated_version, &d->header);
    if (status)
      return decoder_fail(d, status);
    // The length was checked against the frame limit by header_decode:
    // this is the only allocation a peer can cause before the JSON arrives.
    // A chunk for the data sink gets a buffer for its head only (at most the
    // prefix, the JSON limit and the padding); its data goes to the sink.
    d->direct = d->data_sink && d->header.type == PCP_PROTO_MESSAGE_BLOB_CHUNK;
    d->head_length = 0;
    d->head_parsed = false;
    d->data_dest = NULL;
    uint64_t buffer_length = d->header.payload_length;
    uint64_t head_max = align64_u64(PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH +
                                    (uint64_t)d->limits.max_json_bytes);
    if (d->direct && head_max < buffer_length)
      buffer_length = head_max;
    status = pcp_proto_aligned_allocate(d->allocator, (size_t)buffer_length,
                                        &d->payload);
    if (status)
      return decoder_fail(d, status);
    d->payload_filled = 0;
    d->stage = PCP_PROTO_DECODER_PAYLOAD;
    return pcp_ok_status();
  }
  if (d->stage != PCP_PROTO_DECODER_PAYLOAD) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "fabric decoder: commit in the wrong stage");
  }
  size_t before = d->payload_filled;
  PCP_ASSERT(byte_length <= d->header.payload_length - before);
  d->payload_filled += byte_length;
  if (d->data_dest) {
    d->data_crc32c = pcp_proto_crc32c_extend(
        d->data_crc32c, d->data_dest + (before - d->head_length), byte_length);
  }
  if (before < PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH &&
      d->payload_filled >= PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH) {
    // Fail as soon as the JSON length is known, not after a big payload.
    uint32_t json_length = load_le32(d->payload);
    if (json_length > d->limits.max_json_bytes) {
      return decoder_fail(
          d, pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "fabric frame: JSON part of %u bytes exceeds %u",
                             json_length, d->limits.max_json_bytes));
    }
    if (PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH + (uint64_t)json_length >
        d->header.payload_length) {
      return decoder_fail(
          d, pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: JSON part of %u bytes overruns a "
                             "payload of %llu",
                             json_length,
                             (unsigned long long)d->header.payload_length));
    }
  }
  if (d->direct && !d->head_length &&
      d->payload_filled >= PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH) {
    uint64_t head = align64_u64(PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH +
                                (uint64_t)load_le32(d->payload));
    d->head_length =
        (size_t)(head < d->header.payload_length ? head
                                                 : d->header.payload_length);
  }
  if (d->direct && !d->data_dest && d->head_length &&
      d->payload_filled == d->head_length &&
      d->head_length < d->header.payload_length) {
    pcp_status_t status = direct_begin(d);
    if (status)
      return decoder_fail(d, status);
  }
  if (d->payload_filled < d->header.payload_length)
    return pcp_ok_status();
  pcp_status_t status = finish_frame(d);
  if (status)
    return decoder_fail(d, status);
  d->stage = PCP_PROTO_DECODER_READY;
  *out_result = PCP_PROTO_PARSE_FRAME_READY;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_frame_decoder_feed(
    pcp_proto_frame_decoder_t* decoder, const void* data, size_t byte_length,
    size_t* out_consumed, pcp_proto_parse_result_t* out_result) {
  *out_consumed = 0;
  *out_result = PCP_PROTO_PARSE_NEED_MORE;
  const uint8_t* p = data;
  while (*out_consumed < byte_length) {
    void* window = NULL;
    size_t capacity = 0;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_proto_frame_decoder_window(decoder, &window, &capacity));
    if (!window || capacity == 0) {
      return pcp_make_status(PCP_STATUS_INTERNAL, "fabric decoder: no window");
    }
    size_t n = byte_length - *out_consumed;
    if (n > capacity)
      n = capacity;
    memcpy(window, p + *out_consumed, n);
    *out_consumed += n;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_proto_frame_decoder_commit(decoder, n, out_result));
    if (*out_result == PCP_PROTO_PARSE_FRAME_READY)
      break;
  }
  return pcp_ok_status();
}

void pcp_proto_frame_decoder_take(pcp_proto_frame_decoder_t* decoder,
                                  pcp_proto_frame_t* out_frame) {
  PCP_ASSERT(decoder->stage == PCP_PROTO_DECODER_READY);
  pcp_proto_frame_move(&decoder->ready, out_frame);
  decoder->header_filled = 0;
  decoder->payload_filled = 0;
  decoder->direct = false;
  decoder->head_length = 0;
  decoder->stage = PCP_PROTO_DECODER_HEADER;
}

pcp_status_t pcp_proto_frame_decode(const void* bytes, size_t byte_length,
                                    const pcp_proto_limits_t* limits,
                                    uint16_t negotiated_version,
                                    pcp_allocator_t allocator,
                                    pcp_proto_frame_t* out_frame) {
  memset(out_frame, 0, sizeof(*out_frame));
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_frame_decoder_initialize(limits, allocator, &decoder);
  pcp_proto_frame_decoder_set_version(&decoder, negotiated_version);
  size_t consumed = 0;
  pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
  pcp_status_t status = pcp_proto_frame_decoder_feed(
      &decoder, bytes, byte_length, &consumed, &result);
  if (!status && result != PCP_PROTO_PARSE_FRAME_READY) {
    status =
        pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                        "fabric frame: truncated after %zu bytes", byte_length);
  }
  if (!status && consumed != byte_length) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric frame: %zu trailing bytes",
                             byte_length - consumed);
  }
  if (!status)
    pcp_proto_frame_decoder_take(&decoder, out_frame);
  pcp_proto_frame_decoder_deinitialize(&decoder);
  return status;
}
