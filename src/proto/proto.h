// SPDX-License-Identifier: Apache-2.0
//
// proto: the worker-fabric wire protocol (docs/protocol.md) and the sans-I/O
// state machines that speak it.
//
// Layers, bottom up:
//   - CRC32C and the 32-byte frame header, encoded and decoded field by
//     field (never by memcpy of a packed struct).
//   - Frames: header + length-prefixed JSON control part (jansson) + 64-byte
//     aligned raw tensor sections. An incremental decoder (bytes in, frames
//     out, PCP_PROTO_PARSE_NEED_MORE until one is complete) checks every
//     length against pcp_proto_limits_t before it allocates; an encoder
//     produces a scatter list whose tensor segments borrow the caller's
//     bytes (no copy of tensor data).
//   - Typed messages: one struct, one encoder and one parser per message of
//     the spec; the ERROR frame <-> pcp_status_t mapping; chunked blob
//     assembly (per-chunk CRC32C; SHA-256 of the whole blob for programs
//     only), chunks read into place through a decoder data sink; the HMAC
//     join proof.
//   - Sans-I/O state machines for one fabric connection, gateway side and
//     worker side: bytes, ticks and commands in; actions out (send these
//     bytes, close, run this task, reconnect now...). They read no clock and
//     touch no socket: the time is an argument, randomness an injected
//     pcp_rng_t, so the deterministic simulator and the libuv loop run the
//     same code.
//
// Ownership: encoded frames own their head bytes and borrow the tensor data
// they were given (keep it alive until the bytes are written). Decoded frames
// own their payload and JSON; everything a message parser returns (strings,
// arrays, tensor data) is borrowed from the frame and lives as long as it.
// Actions own what they carry; release them with pcp_proto_action_deinitialize.
//
// Thread-safety: everything here is thread-compatible (one owner at a time,
// usually the loop thread of the connection). Pure functions (CRC, header
// codec, HMAC) are thread-safe.

#ifndef PCP_PROTO_PROTO_H_
#define PCP_PROTO_PROTO_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Wire constants (frozen: these numbers are on the wire; never change them)
//===----------------------------------------------------------------------===//

// The bytes "PCPF" read as a little-endian u32.
#define PCP_PROTO_MAGIC 0x46504350u
#define PCP_PROTO_HEADER_BYTE_LENGTH 32u
// u32 json_length + u32 json_crc32c at the start of every payload.
#define PCP_PROTO_PAYLOAD_PREFIX_BYTE_LENGTH 8u
#define PCP_PROTO_SECTION_ALIGNMENT 64u

// Versions this build speaks. HELLO negotiates within [MIN, MAX].
// Version 2 adds runs of resident names to TASK_ASSIGN / TASK_RESULT
// (docs/protocol.md s.3.9): a v1 peer still gets plain lists.
#define PCP_PROTO_VERSION_MIN 1u
#define PCP_PROTO_VERSION_MAX 2u
// The first version whose tensor-ref and keep_resident lists may hold runs.
#define PCP_PROTO_VERSION_RUNS 2u

#define PCP_PROTO_NONCE_BYTE_LENGTH 32u
#define PCP_PROTO_MAC_BYTE_LENGTH 32u
#define PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH 32u

// Message types. HELLO (1) and its layout are frozen forever; the others can
// only be added to. The numbers are grouped: 1..15 connection control,
// 16..31 programs and blobs, 32..47 tasks.
typedef enum pcp_proto_message_type_e {
  PCP_PROTO_MESSAGE_HELLO = 1,
  PCP_PROTO_MESSAGE_JOIN = 2,
  PCP_PROTO_MESSAGE_CHALLENGE = 3,
  PCP_PROTO_MESSAGE_JOIN_PROOF = 4,
  PCP_PROTO_MESSAGE_ACCEPT = 5,
  PCP_PROTO_MESSAGE_REJECT = 6,
  PCP_PROTO_MESSAGE_HEARTBEAT = 7,
  PCP_PROTO_MESSAGE_ERROR = 8,
  PCP_PROTO_MESSAGE_DRAIN = 9,
  PCP_PROTO_MESSAGE_SHUTDOWN = 10,
  PCP_PROTO_MESSAGE_PROGRAM_OFFER = 16,
  PCP_PROTO_MESSAGE_PROGRAM_FETCH = 17,
  PCP_PROTO_MESSAGE_BLOB_CHUNK = 18,
  PCP_PROTO_MESSAGE_PROGRAM_ACK = 19,
  PCP_PROTO_MESSAGE_TASK_ASSIGN = 32,
  PCP_PROTO_MESSAGE_TASK_PROGRESS = 33,
  PCP_PROTO_MESSAGE_TASK_RESULT = 34,
  PCP_PROTO_MESSAGE_TASK_CANCEL = 35,
} pcp_proto_message_type_t;

// "HELLO", "TASK_ASSIGN"...; NULL for a type this build does not know.
const char* pcp_proto_message_type_name(uint16_t type);

// REJECT reasons (frozen wire numbers).
typedef enum pcp_proto_reject_reason_e {
  PCP_PROTO_REJECT_AUTH_FAILED = 1,
  PCP_PROTO_REJECT_VERSION_UNSUPPORTED = 2,
  PCP_PROTO_REJECT_DUPLICATE_WORKER = 3,
  PCP_PROTO_REJECT_DRAINING = 4,
  PCP_PROTO_REJECT_PROTOCOL_VIOLATION = 5,
  PCP_PROTO_REJECT_CAPACITY = 6,
  PCP_PROTO_REJECT_HANDSHAKE_TIMEOUT = 7,
  PCP_PROTO_REJECT_BAD_JOIN = 8,
  PCP_PROTO_REJECT_REASON_COUNT_ = 9,
} pcp_proto_reject_reason_t;

// "AUTH_FAILED"...; "UNKNOWN" otherwise.
const char* pcp_proto_reject_reason_name(uint32_t reason);

//===----------------------------------------------------------------------===//
// Limits and timeouts
//===----------------------------------------------------------------------===//

// Hard ceilings: no configuration may exceed them.
#define PCP_PROTO_CEILING_FRAME_BYTES (UINT64_C(1) << 30)
#define PCP_PROTO_CEILING_JSON_BYTES (16u << 20)
#define PCP_PROTO_CEILING_JSON_DEPTH 64u
#define PCP_PROTO_CEILING_SECTIONS 1024u
#define PCP_PROTO_CEILING_CHUNK_BYTES (UINT64_C(64) << 20)
#define PCP_PROTO_CEILING_BLOB_BYTES (UINT64_C(64) << 30)
#define PCP_PROTO_CEILING_BLOB_ASSEMBLIES 64u
#define PCP_PROTO_CEILING_IN_FLIGHT 1024u
// Fixed per-field caps (docs/protocol.md s.3).
#define PCP_PROTO_MAX_STRING_BYTES 256u
#define PCP_PROTO_MAX_MESSAGE_BYTES 4096u
#define PCP_PROTO_MAX_LIST_ITEMS 32u
#define PCP_PROTO_MAX_TASK_TENSORS 1024u

typedef struct pcp_proto_limits_t {
  uint64_t max_frame_bytes;  // header + payload
  uint32_t max_json_bytes;
  uint32_t max_json_depth;
  uint32_t max_sections;         // per frame
  uint32_t max_rank;             // <= PCP_MAX_TENSOR_RANK
  uint64_t chunk_bytes;          // what this side sends per BLOB_CHUNK
  uint64_t max_chunk_bytes;      // what this side accepts per BLOB_CHUNK
  uint64_t max_blob_bytes;       // whole chunked blob
  uint32_t max_blob_assemblies;  // concurrent, per connection
  uint32_t max_in_flight;        // tasks per connection
} pcp_proto_limits_t;

// The defaults of docs/protocol.md s.4.
pcp_proto_limits_t pcp_proto_limits_default(void);

// INVALID_ARGUMENT naming the field when a limit is zero, above its ceiling,
// or inconsistent (chunk_bytes > max_chunk_bytes, a chunk frame that would
// not fit max_frame_bytes).
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_limits_validate(const pcp_proto_limits_t* limits);

#define PCP_PROTO_HEARTBEAT_MIN_MS 50u
#define PCP_PROTO_HEARTBEAT_MAX_MS 60000u
#define PCP_PROTO_HEARTBEAT_DEFAULT_MS 1000u

// Every timeout, derived from the one heartbeat setting H (s.4).
typedef struct pcp_proto_timeouts_t {
  int64_t heartbeat_interval_ns;  // H
  int64_t silence_timeout_ns;     // 3H: evict a peer silent this long
  int64_t tick_interval_ns;       // H/4: call on_tick at least this often
  int64_t handshake_timeout_ns;   // 5H
  int64_t resume_window_ns;       // 10H
  int64_t backoff_initial_ns;     // H/10
  int64_t backoff_max_ns;         // 5H
} pcp_proto_timeouts_t;

// |heartbeat_interval_ms| is clamped to [MIN, MAX].
pcp_proto_timeouts_t pcp_proto_timeouts_from_heartbeat(
    uint32_t heartbeat_interval_ms);

//===----------------------------------------------------------------------===//
// Checksums, hex
//===----------------------------------------------------------------------===//

// CRC32C (Castagnoli) of |byte_length| bytes, continuing from |crc| (0 to
// start; pass a previous result to extend it over more bytes). Uses SSE 4.2
// when the CPU has it. Thread-safe.
uint32_t pcp_proto_crc32c_extend(uint32_t crc, const void* data,
                                 size_t byte_length);
static inline uint32_t pcp_proto_crc32c(const void* data, size_t byte_length) {
  return pcp_proto_crc32c_extend(0, data, byte_length);
}

// Lowercase hex of |byte_length| bytes into |out_hex| (2n+1 bytes, NUL).
void pcp_proto_hex_encode(const uint8_t* bytes, size_t byte_length,
                          char* out_hex);
// Exactly 2n hex digits (either case) into |out_bytes|; false otherwise.
bool pcp_proto_hex_decode(const char* hex, size_t byte_length,
                          uint8_t* out_bytes);

//===----------------------------------------------------------------------===//
// Header
//===----------------------------------------------------------------------===//

typedef struct pcp_proto_header_t {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t flags;          // none defined in version 1: must be 0
  uint32_t header_crc32c;  // CRC32C of the header with this field zeroed
  uint64_t request_id;
  uint64_t payload_length;
} pcp_proto_header_t;

// Writes the 32 header bytes. The magic and the checksum are computed here;
// |header|'s own magic and header_crc32c fields are ignored. Thread-safe.
void pcp_proto_header_encode(const pcp_proto_header_t* header,
                             uint8_t out_bytes[PCP_PROTO_HEADER_BYTE_LENGTH]);

// Decodes and checks 32 header bytes, in the order of docs/protocol.md s.1.1:
// magic (INVALID_ARGUMENT), checksum (DATA_LOSS), version (INCOMPATIBLE:
// with |negotiated_version| 0 a HELLO may carry any version and other types
// any supported one; otherwise every non-HELLO frame must carry exactly
// |negotiated_version|), flags (INVALID_ARGUMENT), payload length at least
// the prefix (INVALID_ARGUMENT) and within the frame limit
// (RESOURCE_EXHAUSTED). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_header_decode(
    const uint8_t bytes[PCP_PROTO_HEADER_BYTE_LENGTH],
    const pcp_proto_limits_t* limits, uint16_t negotiated_version,
    pcp_proto_header_t* out_header);

//===----------------------------------------------------------------------===//
// Frames
//===----------------------------------------------------------------------===//

// One raw tensor section. For encoding the caller fills name, element_type,
// rank, shape and data (byte_length is computed from the shape); offset and
// crc32c are ignored. A decoded frame fills every field and |data| points
// into the frame's 64-byte aligned payload.
typedef struct pcp_proto_section_t {
  const char* name;
  pcp_element_type_t element_type;
  uint32_t rank;
  int64_t shape[PCP_MAX_TENSOR_RANK];
  uint64_t offset;  // data-area offset (decoded)
  uint64_t byte_length;
  uint32_t crc32c;  // verified (decoded)
  const void* data;
} pcp_proto_section_t;

// A decoded frame. Owns everything it points to.
typedef struct pcp_proto_frame_t {
  pcp_proto_header_t header;
  json_t* control;                // the JSON object (one reference)
  pcp_proto_section_t* sections;  // |section_count| entries
  size_t section_count;
  uint8_t* payload;  // 64-byte aligned
  pcp_allocator_t allocator;
  void* parsed;  // storage of the last message parse
} pcp_proto_frame_t;

// Frees everything the frame owns and zeroes it. Safe on a zeroed frame.
void pcp_proto_frame_deinitialize(pcp_proto_frame_t* frame);

// Moves |frame| into |out_frame| (which must be zeroed or deinitialized) and
// leaves |frame| zeroed.
void pcp_proto_frame_move(pcp_proto_frame_t* frame,
                          pcp_proto_frame_t* out_frame);

// One contiguous piece of an encoded frame.
typedef struct pcp_proto_iovec_t {
  const void* data;
  size_t byte_length;
} pcp_proto_iovec_t;

// An encoded frame as a scatter list: segment 0 is |head| (header, payload
// prefix, JSON, padding to the data area); then each section's bytes
// (borrowed from the encode call) and zero padding between sections.
typedef struct pcp_proto_encoded_frame_t {
  uint8_t* head;  // owned
  size_t head_length;
  pcp_proto_iovec_t* segments;  // owned array; data borrowed
  size_t segment_count;
  uint64_t total_length;  // header + payload
  uint16_t type;
  pcp_allocator_t allocator;
} pcp_proto_encoded_frame_t;

void pcp_proto_encoded_frame_deinitialize(pcp_proto_encoded_frame_t* frame);

// Copies the whole frame into one new buffer (caller frees with
// |allocator|). For tests, golden vectors and small control frames.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_encoded_frame_flatten(
    const pcp_proto_encoded_frame_t* frame, pcp_allocator_t allocator,
    uint8_t** out_bytes, size_t* out_byte_length);

// Encodes a frame. |control| is a JSON object (borrowed; not modified: the
// encoder adds "sections" to a shallow copy when |section_count| > 0).
// Fails with INVALID_ARGUMENT for a bad section (rank, dtype, name) and
// RESOURCE_EXHAUSTED when the result would break |limits| (the receiver
// would refuse it anyway, so the sender fails first with a clear message).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_encode(
    uint16_t version, uint16_t type, uint64_t request_id, const json_t* control,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_encoded_frame_t* out_frame);

// "Not finished yet" is not an error (STYLE.md s.3.4).
typedef enum pcp_proto_parse_result_e {
  PCP_PROTO_PARSE_NEED_MORE = 0,
  PCP_PROTO_PARSE_FRAME_READY = 1,
} pcp_proto_parse_result_t;

typedef enum pcp_proto_decoder_stage_e {
  PCP_PROTO_DECODER_HEADER = 0,
  PCP_PROTO_DECODER_PAYLOAD = 1,
  PCP_PROTO_DECODER_READY = 2,
  PCP_PROTO_DECODER_FAILED = 3,
} pcp_proto_decoder_stage_t;

// Where the data area of a BLOB_CHUNK frame goes (zero copy on receive).
// Called once per such frame as soon as its prefix, JSON and section table
// have arrived and passed their checks, before any data byte: |head| has the
// header, the control part and the sections (their |data| still NULL).
// Returns |data_length| writable bytes for the data area (borrowed until the
// frame is taken or the decoder fails; the decoder then checks padding and
// every CRC32C in place), or NULL to have the decoder buffer the frame as
// usual. It must not fail the decoder: a chunk it does not like is declined
// and then refused on the normal path, with the normal error.
typedef uint8_t* (*pcp_proto_frame_data_sink_fn_t)(
    void* user_data, struct pcp_proto_frame_t* head, uint64_t data_length);

// Incremental frame decoder for one byte stream. Embed it; the fields are
// private to proto/.
typedef struct pcp_proto_frame_decoder_t {
  pcp_proto_limits_t limits;
  pcp_allocator_t allocator;
  uint16_t negotiated_version;  // 0 until HELLO settles it
  pcp_proto_decoder_stage_t stage;
  uint8_t header_bytes[PCP_PROTO_HEADER_BYTE_LENGTH];
  size_t header_filled;
  pcp_proto_header_t header;
  uint8_t* payload;
  size_t payload_filled;
  pcp_proto_frame_t ready;
  pcp_proto_frame_data_sink_fn_t data_sink;
  void* data_sink_user_data;
  // The current frame goes through the sink: its payload buffer holds only
  // the head (prefix, JSON, padding), |head_length| bytes once the prefix
  // has told the JSON length (0 before).
  bool direct;
  bool head_parsed;  // d->ready has the control part and section table
  size_t head_length;
  uint8_t* data_dest;  // the sink's buffer for the data area, borrowed
  // CRC32C of the data area so far, taken as each piece is committed (while
  // it is still in cache) rather than in a second pass over the chunk.
  uint32_t data_crc32c;
} pcp_proto_frame_decoder_t;

// |limits| is copied (validate it first).
void pcp_proto_frame_decoder_initialize(const pcp_proto_limits_t* limits,
                                        pcp_allocator_t allocator,
                                        pcp_proto_frame_decoder_t* out_decoder);
void pcp_proto_frame_decoder_deinitialize(pcp_proto_frame_decoder_t* decoder);

// Sends the data area of every later BLOB_CHUNK frame through |fn| (NULL:
// none). |user_data| is borrowed.
void pcp_proto_frame_decoder_set_data_sink(pcp_proto_frame_decoder_t* decoder,
                                           pcp_proto_frame_data_sink_fn_t fn,
                                           void* user_data);

// From now on every non-HELLO frame must carry |version|.
void pcp_proto_frame_decoder_set_version(pcp_proto_frame_decoder_t* decoder,
                                         uint16_t version);

// Consumes bytes from |data| until a frame is complete (then stops, with the
// rest of |data| unconsumed) or |data| is used up. |out_consumed| tells how
// many bytes were taken. Returns a status only on failure (malformed frame,
// limit, checksum): the decoder is then failed for good and the connection
// must be closed after an ERROR frame. With PCP_PROTO_PARSE_FRAME_READY the
// frame must be taken before the next feed. Lengths are checked against the
// limits before the payload buffer is allocated and, for the JSON part, as
// soon as its length prefix has arrived.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_decoder_feed(
    pcp_proto_frame_decoder_t* decoder, const void* data, size_t byte_length,
    size_t* out_consumed, pcp_proto_parse_result_t* out_result);

// Zero-copy variant of feed for a reader: returns where the next bytes go
// and how many the decoder wants at most (header remainder or payload
// remainder; the payload buffer is the frame's own aligned buffer, so a
// large tensor is read from the socket straight into place).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_decoder_window(
    pcp_proto_frame_decoder_t* decoder, void** out_data, size_t* out_capacity);
// Records that |byte_length| bytes were written into the window.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_decoder_commit(
    pcp_proto_frame_decoder_t* decoder, size_t byte_length,
    pcp_proto_parse_result_t* out_result);

// Moves the ready frame into |out_frame| (zeroed or deinitialized) and gets
// ready for the next one. Asserts that a frame is ready.
void pcp_proto_frame_decoder_take(pcp_proto_frame_decoder_t* decoder,
                                  pcp_proto_frame_t* out_frame);

// Decodes exactly one frame from |bytes| (the whole of it must be consumed:
// trailing bytes are INVALID_ARGUMENT; a short buffer is OUT_OF_RANGE).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_frame_decode(
    const void* bytes, size_t byte_length, const pcp_proto_limits_t* limits,
    uint16_t negotiated_version, pcp_allocator_t allocator,
    pcp_proto_frame_t* out_frame);

//===----------------------------------------------------------------------===//
// Messages
//===----------------------------------------------------------------------===//
//
// Each message has a struct, pcp_proto_<message>_encode (struct -> encoded
// frame; strings and data borrowed for the call, tensor data until the frame
// is written) and pcp_proto_<message>_parse (frame of that type -> struct;
// INVALID_ARGUMENT naming the key for a missing or wrong field,
// FAILED_PRECONDITION for a frame of another type). Parsed strings, arrays
// and tensor data are borrowed from the frame.

typedef struct pcp_proto_hello_t {
  uint16_t min_version;
  uint16_t max_version;
  uint16_t selected_version;  // reply only; 0 = no common version
  bool has_selected_version;  // set by the gateway's reply
  const char* role;           // "worker" | "gateway"
  const char* software;
} pcp_proto_hello_t;

// Negotiation rule 2 (s.2): the highest common version, or 0.
uint16_t pcp_proto_version_select(uint16_t local_min, uint16_t local_max,
                                  uint16_t peer_min, uint16_t peer_max);

typedef struct pcp_proto_join_t {
  const char* worker_id;
  const char* backend;
  const char* target;
  int32_t device_id;
  uint64_t device_memory_bytes;
  const char* drivers[PCP_PROTO_MAX_LIST_ITEMS];
  uint32_t driver_count;
  const char* runtime_version;
  const char* compiler_version;
  const char* node_manager_id;
  int64_t supervisor_id;  // -1: not supervised
  const char* worker_class;
  bool has_resume;
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
} pcp_proto_join_t;

// True when |worker_id| is a valid stable id: 1..256 bytes of [A-Za-z0-9._-].
bool pcp_proto_worker_id_is_valid(const char* worker_id);

typedef struct pcp_proto_challenge_t {
  uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH];
} pcp_proto_challenge_t;

typedef struct pcp_proto_join_proof_t {
  const char* worker_id;
  uint8_t mac[PCP_PROTO_MAC_BYTE_LENGTH];
} pcp_proto_join_proof_t;

typedef struct pcp_proto_accept_t {
  const char* worker_id;
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  bool resumed;
  uint32_t heartbeat_interval_ms;
  uint64_t max_frame_bytes;
  uint64_t max_chunk_bytes;
  uint32_t max_in_flight;
} pcp_proto_accept_t;

typedef struct pcp_proto_reject_t {
  uint32_t reason;  // pcp_proto_reject_reason_t
  const char* message;
} pcp_proto_reject_t;

typedef struct pcp_proto_heartbeat_t {
  uint64_t seq;
  uint64_t ack;
} pcp_proto_heartbeat_t;

typedef struct pcp_proto_drain_t {
  uint64_t deadline_ms;
} pcp_proto_drain_t;

typedef struct pcp_proto_shutdown_t {
  const char* reason;
} pcp_proto_shutdown_t;

typedef struct pcp_proto_program_offer_t {
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint64_t byte_length;
  const char* backend;
  const char* target;
} pcp_proto_program_offer_t;

typedef struct pcp_proto_program_fetch_t {
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
} pcp_proto_program_fetch_t;

typedef enum pcp_proto_program_ack_status_e {
  PCP_PROTO_PROGRAM_CACHED = 1,  // "cached": was on disk already
  PCP_PROTO_PROGRAM_STORED = 2,  // "stored": fetched, verified, written
} pcp_proto_program_ack_status_t;

typedef struct pcp_proto_program_ack_t {
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  pcp_proto_program_ack_status_t status;
} pcp_proto_program_ack_t;

typedef enum pcp_proto_blob_kind_e {
  PCP_PROTO_BLOB_PROGRAM = 1,  // "program"
  PCP_PROTO_BLOB_TENSOR = 2,   // "tensor"
} pcp_proto_blob_kind_t;

typedef struct pcp_proto_blob_chunk_t {
  const char* blob_id;
  pcp_proto_blob_kind_t kind;
  uint64_t index;
  uint64_t count;
  uint64_t offset;
  uint64_t total;
  bool has_sha256;  // last chunk of a program blob only
  uint8_t sha256[PCP_SHA256_BYTE_LENGTH];
  const void* data;  // the "data" section
  uint64_t data_length;
} pcp_proto_blob_chunk_t;

// Where a task input or output lives (s.3.9).
typedef enum pcp_proto_tensor_ref_kind_e {
  PCP_PROTO_TENSOR_REF_SECTION = 0,   // {"section": i}
  PCP_PROTO_TENSOR_REF_RESIDENT = 1,  // {"resident": name}
  PCP_PROTO_TENSOR_REF_BLOB = 2,      // {"blob": id, "dtype", "shape"}
  // Task inputs only: {"init": "normal"|"ones"|"zeros", "seed": "<16 hex>",
  // "index": i, "dtype", "shape"}: the worker fills the tensor itself with
  // pcp_models_parameter_fill (a seeded initial parameter: no bytes on the
  // wire). dtype f32 or bf16; at most PCP_PROTO_CEILING_INIT_REF_BYTES.
  PCP_PROTO_TENSOR_REF_INIT = 3,
} pcp_proto_tensor_ref_kind_t;

// An "init" ref's fill, numbered as pcp_models_init_t (proto does not
// depend on models; the worker casts).
typedef enum pcp_proto_init_kind_e {
  PCP_PROTO_INIT_NORMAL = 0,
  PCP_PROTO_INIT_ONES = 1,
  PCP_PROTO_INIT_ZEROS = 2,
} pcp_proto_init_kind_t;

// The largest tensor an "init" ref may make a worker allocate: what one
// frame could carry as a section, so a seeded input can never cost a
// worker more memory than the same input sent as values.
#define PCP_PROTO_CEILING_INIT_REF_BYTES PCP_PROTO_CEILING_FRAME_BYTES

// The most all "init" refs of one task may make a worker allocate
// together. Each ref alone is bounded above, but a ~200 KB frame of 1024
// such refs would otherwise ask for 1 TiB; bounding the sum by the same
// frame ceiling keeps a seeded task's inputs no larger than one frame of
// the same inputs sent as values.
#define PCP_PROTO_CEILING_INIT_REFS_TOTAL_BYTES PCP_PROTO_CEILING_FRAME_BYTES

typedef struct pcp_proto_tensor_ref_t {
  pcp_proto_tensor_ref_kind_t kind;
  uint32_t section;                 // SECTION
  const char* name;                 // RESIDENT name or BLOB id
  pcp_element_type_t element_type;  // BLOB
  uint32_t rank;                    // BLOB
  int64_t shape[PCP_MAX_TENSOR_RANK];
  pcp_proto_init_kind_t init;  // INIT (element_type, rank, shape too)
  uint64_t seed;               // INIT
  uint32_t index;              // INIT: the parameter's index in its table
} pcp_proto_tensor_ref_t;

// Checks an INIT ref's fields (known init, dtype f32 or bf16, rank and
// dims positive and at most PCP_PROTO_CEILING_INIT_REF_BYTES in all);
// INVALID_ARGUMENT naming the rule. The decoder, the fabric and the worker
// call it, so a bad ref is refused before anything is allocated.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_init_ref_validate(const pcp_proto_tensor_ref_t* ref);

// pcp_proto_init_ref_validate of every INIT ref of |refs| (other kinds are
// skipped) and their bytes summed: INVALID_ARGUMENT past
// PCP_PROTO_CEILING_INIT_REFS_TOTAL_BYTES. The decoder (task inputs), the
// fabric and the worker call it on a task's whole input list.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_init_refs_validate(
    const pcp_proto_tensor_ref_t* refs, uint32_t count);

typedef struct pcp_proto_keep_resident_t {
  uint32_t output;
  const char* as;
} pcp_proto_keep_resident_t;

typedef struct pcp_proto_task_assign_t {
  uint64_t task_id;
  const char* session_id;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  const char* function;
  const pcp_proto_tensor_ref_t* inputs;
  uint32_t input_count;
  const pcp_proto_keep_resident_t* keep_resident;
  uint32_t keep_resident_count;
  bool return_resident;
  // "hash_inputs" (omitted when 0): the worker returns, after the
  // function's outputs, one more output section "inputs_sha256" (u8[32]):
  // the SHA-256 of the raw bytes of inputs 0..hash_inputs-1 in order, as it
  // holds them when the function runs (docs/protocol.md). Lets the gateway
  // check that every worker holds the same tensors without a round trip.
  uint32_t hash_inputs;
  // "hash_outputs" (omitted when 0): one more output section after those
  // (and after "inputs_sha256" if any), "outputs_sha256" (u8[32]): the
  // SHA-256 of the raw bytes of the function's outputs 0..hash_outputs-1
  // in order, as it produced them (a kept output is read back for it). Lets
  // the gateway check what a worker keeps, not only what it received.
  uint32_t hash_outputs;
} pcp_proto_task_assign_t;

typedef enum pcp_proto_task_state_e {
  PCP_PROTO_TASK_QUEUED = 1,   // "queued"
  PCP_PROTO_TASK_RUNNING = 2,  // "running"
} pcp_proto_task_state_t;

typedef struct pcp_proto_task_progress_t {
  uint64_t task_id;
  pcp_proto_task_state_t state;
  bool has_fraction;
  double fraction;  // [0, 1]
} pcp_proto_task_progress_t;

typedef struct pcp_proto_task_result_t {
  uint64_t task_id;
  const pcp_proto_tensor_ref_t* outputs;
  uint32_t output_count;
  uint64_t elapsed_us;
} pcp_proto_task_result_t;

typedef struct pcp_proto_task_cancel_t {
  uint64_t task_id;
  const char* reason;
} pcp_proto_task_cancel_t;

// Encoders. |version| is the negotiated version (HELLO ignores it and uses
// its max_version, rule 1 of s.2).
// NOLINTBEGIN(bugprone-macro-parentheses): |type_t| is a type name.
#define PCP_PROTO_DECLARE_MESSAGE_(name, type_t)                    \
  PCP_MUST_USE_RESULT pcp_status_t pcp_proto_##name##_encode(       \
      uint16_t version, uint64_t request_id, const type_t* message, \
      const pcp_proto_limits_t* limits, pcp_allocator_t allocator,  \
      pcp_proto_encoded_frame_t* out_frame);                        \
  PCP_MUST_USE_RESULT pcp_status_t pcp_proto_##name##_parse(        \
      pcp_proto_frame_t* frame, type_t* out_message);

PCP_PROTO_DECLARE_MESSAGE_(hello, pcp_proto_hello_t)
PCP_PROTO_DECLARE_MESSAGE_(join, pcp_proto_join_t)
PCP_PROTO_DECLARE_MESSAGE_(challenge, pcp_proto_challenge_t)
PCP_PROTO_DECLARE_MESSAGE_(join_proof, pcp_proto_join_proof_t)
PCP_PROTO_DECLARE_MESSAGE_(accept, pcp_proto_accept_t)
PCP_PROTO_DECLARE_MESSAGE_(reject, pcp_proto_reject_t)
PCP_PROTO_DECLARE_MESSAGE_(heartbeat, pcp_proto_heartbeat_t)
PCP_PROTO_DECLARE_MESSAGE_(drain, pcp_proto_drain_t)
PCP_PROTO_DECLARE_MESSAGE_(shutdown, pcp_proto_shutdown_t)
PCP_PROTO_DECLARE_MESSAGE_(program_offer, pcp_proto_program_offer_t)
PCP_PROTO_DECLARE_MESSAGE_(program_fetch, pcp_proto_program_fetch_t)
PCP_PROTO_DECLARE_MESSAGE_(program_ack, pcp_proto_program_ack_t)
PCP_PROTO_DECLARE_MESSAGE_(blob_chunk, pcp_proto_blob_chunk_t)
PCP_PROTO_DECLARE_MESSAGE_(task_progress, pcp_proto_task_progress_t)
PCP_PROTO_DECLARE_MESSAGE_(task_cancel, pcp_proto_task_cancel_t)
// NOLINTEND(bugprone-macro-parentheses)

// TASK_ASSIGN and TASK_RESULT carry tensor sections: the encoder takes them
// (data borrowed until the frame is written); the parser checks every
// SECTION reference against the frame's sections.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_task_assign_encode(
    uint16_t version, uint64_t request_id,
    const pcp_proto_task_assign_t* message, const pcp_proto_section_t* sections,
    size_t section_count, const pcp_proto_limits_t* limits,
    pcp_allocator_t allocator, pcp_proto_encoded_frame_t* out_frame);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_task_assign_parse(
    pcp_proto_frame_t* frame, pcp_proto_task_assign_t* out_message);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_task_result_encode(
    uint16_t version, uint64_t request_id,
    const pcp_proto_task_result_t* message, const pcp_proto_section_t* sections,
    size_t section_count, const pcp_proto_limits_t* limits,
    pcp_allocator_t allocator, pcp_proto_encoded_frame_t* out_frame);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_task_result_parse(
    pcp_proto_frame_t* frame, pcp_proto_task_result_t* out_message);

// ERROR frame <-> pcp_status_t (s.3.6). |status| (borrowed, not OK) gives the
// code byte and the message (its text without the source location, at most
// 4096 bytes, cut on a UTF-8 boundary). |task_id| 0 means none.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_error_encode(
    uint16_t version, uint64_t request_id, pcp_status_t status,
    uint64_t task_id, const pcp_proto_limits_t* limits,
    pcp_allocator_t allocator, pcp_proto_encoded_frame_t* out_frame);
// Rebuilds the peer's status into |out_peer_status| (owned by the caller):
// same code, the peer's message, annotated "from peer". A code outside
// 1..18 becomes UNKNOWN with the number in the message; code 0 or a missing
// field is INVALID_ARGUMENT (returned; |out_peer_status| stays OK).
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_error_parse(pcp_proto_frame_t* frame, pcp_status_t* out_peer_status,
                      uint64_t* out_task_id);

//===----------------------------------------------------------------------===//
// Join proof (HMAC-SHA256, s.3.3)
//===----------------------------------------------------------------------===//

// mac = HMAC-SHA256(token, "pcp-join-v1" 0x00 nonce worker_id). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_join_mac_compute(
    const uint8_t* token, size_t token_length,
    const uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH], const char* worker_id,
    uint8_t out_mac[PCP_PROTO_MAC_BYTE_LENGTH]);

// Recomputes the MAC and compares it in constant time (CRYPTO_memcmp).
// Returns false for an empty token. Thread-safe.
bool pcp_proto_join_mac_verify(const uint8_t* token, size_t token_length,
                               const uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH],
                               const char* worker_id,
                               const uint8_t mac[PCP_PROTO_MAC_BYTE_LENGTH]);

// Fills |out_bytes| from OpenSSL's CSPRNG (nonces, resume tokens).
// UNAVAILABLE if the CSPRNG fails. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_random_bytes(uint8_t* out_bytes,
                                                        size_t byte_length);

// Constant-time check of a resuming JOIN against the registry's lease
// (s.5): true when |join| has a resume block with |lease_epoch| and
// |resume_token|.
bool pcp_proto_join_resume_matches(
    const pcp_proto_join_t* join, uint64_t lease_epoch,
    const uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH]);

//===----------------------------------------------------------------------===//
// Chunked blobs (s.1.4)
//===----------------------------------------------------------------------===//

// Splits |data| into BLOB_CHUNK frames of at most limits->chunk_bytes; calls
// |emit| once per chunk with the encoded frame (the callee takes ownership
// of it: deinitialize it when written). The frames borrow |data| (zero copy
// on send). Only a PROGRAM blob is hashed (its last chunk carries the
// SHA-256); a TENSOR blob relies on each chunk's CRC32C.
typedef pcp_status_t (*pcp_proto_chunk_emit_fn_t)(
    void* user_data, pcp_proto_encoded_frame_t* frame);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_encode_chunks(
    uint16_t version, uint64_t request_id, const char* blob_id,
    pcp_proto_blob_kind_t kind, const void* data, uint64_t byte_length,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_chunk_emit_fn_t emit, void* user_data);

// A tensor that travelled as a chunked blob (s.1.4): |data| is 64-byte
// aligned and |byte_length| matches the dtype and shape of the reference
// that names it (checked by the state machines).
typedef struct pcp_proto_tensor_blob_t {
  char id[PCP_PROTO_MAX_STRING_BYTES + 1];
  uint8_t* data;  // owned; pcp_proto_blob_free
  uint64_t byte_length;
} pcp_proto_tensor_blob_t;

// Reassembles one blob. Embed it; fields private to proto/.
typedef struct pcp_proto_blob_assembly_t {
  pcp_allocator_t allocator;
  char blob_id[PCP_PROTO_MAX_STRING_BYTES + 1];
  pcp_proto_blob_kind_t kind;
  uint64_t request_id;
  uint64_t total;
  uint64_t count;
  uint64_t next_index;
  uint64_t received;
  uint64_t max_chunk_bytes;
  uint8_t* data;  // 64-byte aligned, |total| bytes
  pcp_sha256_stream_t* hash;
} pcp_proto_blob_assembly_t;

// Starts from chunk 0: checks |chunk| (index 0, total within
// limits->max_blob_bytes, chunk size within max_chunk_bytes) before it
// allocates |total| bytes.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_assembly_initialize(
    uint64_t request_id, const pcp_proto_blob_chunk_t* chunk,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_blob_assembly_t* out_assembly);
// initialize without adding |chunk|: the same checks, then the buffer of
// |chunk->total| bytes is allocated (once, with the announced size).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_assembly_begin(
    uint64_t request_id, const pcp_proto_blob_chunk_t* chunk,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_blob_assembly_t* out_assembly);
// Where |chunk|'s bytes belong in the blob buffer when it is the next chunk
// and assembly_add would accept it; NULL otherwise. For the decoder's data
// sink (the bytes are then read from the socket into place and add copies
// nothing).
uint8_t* pcp_proto_blob_assembly_next_dest(
    const pcp_proto_blob_assembly_t* assembly,
    const pcp_proto_blob_chunk_t* chunk);
// Adds the next chunk (chunk 0 is added by initialize; after begin, add
// it). A chunk whose |data| already points at its place in the buffer (the
// decoder's data sink) is not copied. |out_complete| turns true after the
// last chunk; for a program blob the SHA-256 has then been verified
// (DATA_LOSS on mismatch); a tensor blob has no whole-blob hash (each chunk
// passed its CRC32C in the decoder). INVALID_ARGUMENT for an out-of-order or
// inconsistent chunk; RESOURCE_EXHAUSTED for a chunk over
// limits->max_chunk_bytes.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_blob_assembly_add(
    pcp_proto_blob_assembly_t* assembly, const pcp_proto_blob_chunk_t* chunk,
    bool* out_complete);
// Hands the assembled bytes (64-byte aligned) to the caller, who frees them
// with pcp_proto_blob_free(the assembly's allocator, data), and
// deinitializes the assembly.
void pcp_proto_blob_assembly_take(pcp_proto_blob_assembly_t* assembly,
                                  uint8_t** out_data,
                                  uint64_t* out_byte_length);
void pcp_proto_blob_assembly_deinitialize(pcp_proto_blob_assembly_t* assembly);
// Frees bytes from pcp_proto_blob_assembly_take (NULL is fine).
void pcp_proto_blob_free(pcp_allocator_t allocator, uint8_t* data);

//===----------------------------------------------------------------------===//
// Actions (what the state machines ask their owner to do)
//===----------------------------------------------------------------------===//

typedef enum pcp_proto_action_type_e {
  PCP_PROTO_ACTION_NONE = 0,
  // Both sides.
  PCP_PROTO_ACTION_SEND = 1,   // write |frame| (in order with other SENDs)
  PCP_PROTO_ACTION_CLOSE = 2,  // flush earlier SENDs, close; |status| = why
  // Gateway side.
  PCP_PROTO_ACTION_JOIN_VERIFIED = 10,   // proof valid: call accept or reject
  PCP_PROTO_ACTION_EVICT = 11,           // peer silent past the deadline
  PCP_PROTO_ACTION_PROGRAM_FETCH = 12,   // call send_program(|request_id|)
  PCP_PROTO_ACTION_PROGRAM_READY = 13,   // worker holds |program|
  PCP_PROTO_ACTION_PROGRAM_FAILED = 14,  // |status|
  PCP_PROTO_ACTION_TASK_PROGRESS = 15,   // |received| is the frame
  PCP_PROTO_ACTION_TASK_RESULT = 16,     // |received| is the frame
  PCP_PROTO_ACTION_TASK_FAILED = 17,     // |task_id|, |status|
  PCP_PROTO_ACTION_TASK_LOST = 18,       // connection ended under |task_id|
  PCP_PROTO_ACTION_PEER_DRAINING = 19,
  // Worker side.
  PCP_PROTO_ACTION_CONNECT = 30,         // open the TCP connection now
  PCP_PROTO_ACTION_ACCEPTED = 31,        // |resumed|, |lease_epoch|
  PCP_PROTO_ACTION_REJECTED = 32,        // |reject_reason|, |status|
  PCP_PROTO_ACTION_PROGRAM_LOOKUP = 33,  // is |program| cached? answer it
  PCP_PROTO_ACTION_PROGRAM_STORE = 34,   // store |blob| (verified) as |program|
  PCP_PROTO_ACTION_RUN_TASK = 35,        // |received| is the TASK_ASSIGN
  PCP_PROTO_ACTION_CANCEL_TASK = 36,     // |task_id|
  PCP_PROTO_ACTION_DROP_SESSIONS = 37,   // lease not resumed: drop residents
  PCP_PROTO_ACTION_DRAIN = 38,           // gateway asked to drain
  PCP_PROTO_ACTION_SHUTDOWN = 39,        // stop for good, do not reconnect
} pcp_proto_action_type_t;

typedef struct pcp_proto_action_t {
  pcp_proto_action_type_t type;
  uint64_t request_id;
  uint64_t task_id;
  pcp_proto_encoded_frame_t frame;  // SEND
  pcp_proto_frame_t received;       // TASK_*, RUN_TASK
  pcp_status_t status;              // owned
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint8_t* blob;  // PROGRAM_STORE, owned (pcp_proto_blob_free, |allocator|)
  uint64_t blob_length;
  pcp_allocator_t allocator;
  bool resumed;
  uint64_t lease_epoch;
  uint32_t reject_reason;
  // RUN_TASK, TASK_RESULT: tensors that arrived as chunked blobs before the
  // frame, named by the BLOB references in it. Owned.
  pcp_proto_tensor_blob_t* tensor_blobs;
  size_t tensor_blob_count;
} pcp_proto_action_t;

// Finds the blob a BLOB reference names in |action| (NULL when absent).
const pcp_proto_tensor_blob_t* pcp_proto_action_tensor_blob(
    const pcp_proto_action_t* action, const char* blob_id);

// Releases what the action owns. Safe on a zeroed action.
void pcp_proto_action_deinitialize(pcp_proto_action_t* action);

//===----------------------------------------------------------------------===//
// Gateway side of one connection (sans-I/O)
//===----------------------------------------------------------------------===//
//
// States: AWAIT_HELLO -> AWAIT_JOIN -> AWAIT_PROOF -> VERIFIED (owner
// decides) -> ACCEPTED (-> DRAINING) -> CLOSED. Any protocol violation sends
// ERROR (or REJECT during the handshake) and CLOSE. After CLOSE every
// in-flight task is reported once as TASK_LOST.

typedef enum pcp_proto_gateway_state_e {
  PCP_PROTO_GATEWAY_AWAIT_HELLO = 0,
  PCP_PROTO_GATEWAY_AWAIT_JOIN = 1,
  PCP_PROTO_GATEWAY_AWAIT_PROOF = 2,
  PCP_PROTO_GATEWAY_VERIFIED = 3,
  PCP_PROTO_GATEWAY_ACCEPTED = 4,
  PCP_PROTO_GATEWAY_DRAINING = 5,
  PCP_PROTO_GATEWAY_CLOSED = 6,
} pcp_proto_gateway_state_t;

typedef struct pcp_proto_gateway_config_t {
  pcp_proto_limits_t limits;
  uint32_t heartbeat_interval_ms;
  // Borrowed for the connection's lifetime.
  const uint8_t* join_token;
  size_t join_token_length;
  // Fresh CSPRNG bytes per connection (pcp_proto_random_bytes); injected
  // so the simulator can replay a run.
  uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH];
  const char* software;  // borrowed; NULL: "pcp"
} pcp_proto_gateway_config_t;

typedef struct pcp_proto_gateway_conn_t pcp_proto_gateway_conn_t;

// |now_ns| is the accept time (handshake deadline starts here).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_create(
    const pcp_proto_gateway_config_t* config, int64_t now_ns,
    pcp_allocator_t allocator, pcp_proto_gateway_conn_t** out_conn);
void pcp_proto_gateway_conn_release(pcp_proto_gateway_conn_t* conn);

// Events. Protocol errors from the peer do not fail these calls: they turn
// into ERROR/REJECT + CLOSE actions. A status means this side failed
// (RESOURCE_EXHAUSTED when an action could not be queued).
// |byte_length| bytes arrived at |now_ns|: any byte, a part of a frame too,
// proves the peer alive and restarts the silence timer (s.4), so call it as
// bytes arrive, not once a frame is complete.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_on_bytes(
    pcp_proto_gateway_conn_t* conn, const void* data, size_t byte_length,
    int64_t now_ns);
// Heartbeats out, silence and handshake deadlines. Call every
// timeouts.tick_interval_ns at least.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_gateway_conn_on_tick(pcp_proto_gateway_conn_t* conn, int64_t now_ns);
// The transport closed (peer or error).
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_on_closed(
    pcp_proto_gateway_conn_t* conn, int64_t now_ns);

// Commands. FAILED_PRECONDITION in the wrong state.
typedef struct pcp_proto_gateway_accept_params_t {
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  bool resumed;
} pcp_proto_gateway_accept_params_t;
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_accept(
    pcp_proto_gateway_conn_t* conn,
    const pcp_proto_gateway_accept_params_t* params, int64_t now_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_reject(
    pcp_proto_gateway_conn_t* conn, pcp_proto_reject_reason_t reason,
    const char* message, int64_t now_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_offer_program(
    pcp_proto_gateway_conn_t* conn, const pcp_proto_program_offer_t* offer,
    int64_t now_ns, uint64_t* out_request_id);
// Streams the program for a PROGRAM_FETCH action; |data| is borrowed until
// the SEND actions are written.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_send_program(
    pcp_proto_gateway_conn_t* conn, uint64_t request_id, const void* data,
    uint64_t byte_length, int64_t now_ns);
// RESOURCE_EXHAUSTED at the in-flight limit; FAILED_PRECONDITION unless
// ACCEPTED; ALREADY_EXISTS when the task id is already in flight here.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_assign_task(
    pcp_proto_gateway_conn_t* conn, const pcp_proto_task_assign_t* task,
    const pcp_proto_section_t* sections, size_t section_count, int64_t now_ns,
    uint64_t* out_request_id);
// NOT_FOUND when |task_id| is not in flight.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_cancel_task(
    pcp_proto_gateway_conn_t* conn, uint64_t task_id, const char* reason,
    int64_t now_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_drain(
    pcp_proto_gateway_conn_t* conn, uint64_t deadline_ms, int64_t now_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_shutdown(
    pcp_proto_gateway_conn_t* conn, const char* reason, int64_t now_ns);
// Sends ERROR(|status|, borrowed) and closes.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_gateway_conn_fail(
    pcp_proto_gateway_conn_t* conn, pcp_status_t status, int64_t now_ns);

// Pops the next action; false when there is none.
bool pcp_proto_gateway_conn_next_action(pcp_proto_gateway_conn_t* conn,
                                        pcp_proto_action_t* out_action);

pcp_proto_gateway_state_t pcp_proto_gateway_conn_state(
    const pcp_proto_gateway_conn_t* conn);
// The verified JOIN (borrowed from the connection; NULL before
// VERIFIED).
const pcp_proto_join_t* pcp_proto_gateway_conn_join(
    const pcp_proto_gateway_conn_t* conn);
size_t pcp_proto_gateway_conn_in_flight_count(
    const pcp_proto_gateway_conn_t* conn);
// Deadline after which the peer is evicted (last byte received + 3H).
int64_t pcp_proto_gateway_conn_deadline_ns(
    const pcp_proto_gateway_conn_t* conn);
// Frames dropped as duplicates or stale (results of unknown tasks, old
// heartbeats): for metrics and tests.
uint64_t pcp_proto_gateway_conn_dropped_count(
    const pcp_proto_gateway_conn_t* conn);

//===----------------------------------------------------------------------===//
// Worker side (sans-I/O): one logical session across reconnects
//===----------------------------------------------------------------------===//
//
// States: IDLE -> (CONNECT) CONNECTING -> AWAIT_HELLO -> AWAIT_CHALLENGE ->
// AWAIT_ACCEPT -> READY (-> DRAINING); on any close: BACKOFF -> CONNECTING;
// SHUTDOWN is final.

typedef enum pcp_proto_worker_state_e {
  PCP_PROTO_WORKER_IDLE = 0,
  PCP_PROTO_WORKER_CONNECTING = 1,
  PCP_PROTO_WORKER_AWAIT_HELLO = 2,
  PCP_PROTO_WORKER_AWAIT_CHALLENGE = 3,
  PCP_PROTO_WORKER_AWAIT_ACCEPT = 4,
  PCP_PROTO_WORKER_READY = 5,
  PCP_PROTO_WORKER_DRAINING = 6,
  PCP_PROTO_WORKER_BACKOFF = 7,
  PCP_PROTO_WORKER_SHUTDOWN = 8,
} pcp_proto_worker_state_t;

typedef struct pcp_proto_worker_config_t {
  pcp_proto_limits_t limits;
  // Used until ACCEPT brings the gateway's H.
  uint32_t heartbeat_interval_ms;
  // The worker's identity and capabilities; strings borrowed for the
  // worker's lifetime. |join.has_resume| is ignored (the machine adds the
  // resume block itself after the first ACCEPT).
  pcp_proto_join_t join;
  const uint8_t* join_token;  // borrowed
  size_t join_token_length;
  const char* software;  // borrowed; NULL: "pcp"
} pcp_proto_worker_config_t;

typedef struct pcp_proto_worker_t pcp_proto_worker_t;

// |rng| (borrowed) draws the backoff jitter.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_create(
    const pcp_proto_worker_config_t* config, pcp_rng_t* rng,
    pcp_allocator_t allocator, pcp_proto_worker_t** out_worker);
void pcp_proto_worker_release(pcp_proto_worker_t* worker);

// Events.
// IDLE -> CONNECTING: queues CONNECT.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_start(pcp_proto_worker_t* worker, int64_t now_ns);
// The TCP connection is up: sends HELLO.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_on_connected(pcp_proto_worker_t* worker, int64_t now_ns);
// Connecting failed, or the connection closed: cancels in-flight tasks and
// schedules the next CONNECT with backoff (none after SHUTDOWN).
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_on_closed(pcp_proto_worker_t* worker, int64_t now_ns);
// |byte_length| bytes arrived at |now_ns|; as on the gateway side, any byte
// restarts the silence timer (s.4).
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_on_bytes(pcp_proto_worker_t* worker, const void* data,
                          size_t byte_length, int64_t now_ns);
// Zero-copy variant of on_bytes for an owner that reads the socket itself:
// read_window says where the next bytes go and how many at most (the
// decoder's window: a tensor chunk's data goes straight into its blob
// buffer); read_commit hands over |byte_length| bytes written there and
// handles a completed frame as on_bytes does. FAILED_PRECONDITION when not
// connected.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_read_window(
    pcp_proto_worker_t* worker, void** out_data, size_t* out_capacity);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_read_commit(
    pcp_proto_worker_t* worker, size_t byte_length, int64_t now_ns);
// Heartbeats, silence deadline, reconnect timer.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_on_tick(pcp_proto_worker_t* worker, int64_t now_ns);

// Answers to actions.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_program_lookup_done(
    pcp_proto_worker_t* worker, uint64_t request_id, bool found,
    int64_t now_ns);
// |store_status| is consumed: OK sends ACK stored, an error sends ERROR.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_program_stored(pcp_proto_worker_t* worker, uint64_t request_id,
                                pcp_status_t store_status, int64_t now_ns);
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_task_progress(
    pcp_proto_worker_t* worker, const pcp_proto_task_progress_t* progress,
    int64_t now_ns);
// NOT_FOUND when |result->task_id| is not running (cancelled, or dropped by
// a reconnect): the result is not sent.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_task_complete(
    pcp_proto_worker_t* worker, const pcp_proto_task_result_t* result,
    const pcp_proto_section_t* sections, size_t section_count, int64_t now_ns);
// Sends ERROR(|status|, borrowed) for the task.
PCP_MUST_USE_RESULT pcp_status_t
pcp_proto_worker_task_fail(pcp_proto_worker_t* worker, uint64_t task_id,
                           pcp_status_t status, int64_t now_ns);
// The worker is stopping: DRAIN to the gateway.
PCP_MUST_USE_RESULT pcp_status_t pcp_proto_worker_drain(
    pcp_proto_worker_t* worker, uint64_t deadline_ms, int64_t now_ns);

bool pcp_proto_worker_next_action(pcp_proto_worker_t* worker,
                                  pcp_proto_action_t* out_action);

pcp_proto_worker_state_t pcp_proto_worker_state(
    const pcp_proto_worker_t* worker);
// When the next CONNECT fires (BACKOFF only).
int64_t pcp_proto_worker_reconnect_at_ns(const pcp_proto_worker_t* worker);
// Consecutive failed attempts since the last ACCEPT.
uint32_t pcp_proto_worker_attempt_count(const pcp_proto_worker_t* worker);
size_t pcp_proto_worker_in_flight_count(const pcp_proto_worker_t* worker);
uint64_t pcp_proto_worker_lease_epoch(const pcp_proto_worker_t* worker);
// Connected: the time after which the worker leaves a silent gateway (last
// byte received + 3H).
int64_t pcp_proto_worker_deadline_ns(const pcp_proto_worker_t* worker);

#ifdef __cplusplus
}
#endif

#endif  // PCP_PROTO_PROTO_H_
