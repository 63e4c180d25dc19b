// SPDX-License-Identifier: Apache-2.0
//
// The message tables and the generic codec, checked from the tables
// themselves: every message type has a table; a message filled from its
// table (every field present, strings and lists at their maximum) survives
// encode -> bytes -> decode -> parse unchanged and re-encodes to the same
// bytes; and each field's limits (type, range, length, count, required)
// refuse over-limit input on the wire and, where the encoder checks, on
// the way out. A field added to a table is covered without a new test.

#include <stdio.h>

#include "proto/proto_impl.h"
#include "proto/proto_test_impl.h"

static pcp_proto_limits_t limits(void) {
  return pcp_proto_limits_default();
}

//===----------------------------------------------------------------------===//
// Test-lifetime allocations (strings and arrays of generated messages)
//===----------------------------------------------------------------------===//

typedef struct pool_t {
  void* items[4096];
  size_t count;
} pool_t;

static pool_t g_pool;

static void* pool_calloc(size_t n) {
  assert_true(g_pool.count < sizeof(g_pool.items) / sizeof(g_pool.items[0]));
  void* p = calloc(1, n ? n : 1);
  assert_non_null(p);
  g_pool.items[g_pool.count++] = p;
  return p;
}

static void pool_reset(void) {
  for (size_t i = 0; i < g_pool.count; ++i) free(g_pool.items[i]);
  g_pool.count = 0;
}

static char* make_string(size_t n, char c) {
  char* s = pool_calloc(n + 1);
  memset(s, c, n);
  return s;
}

//===----------------------------------------------------------------------===//
// Filling a message from its table
//===----------------------------------------------------------------------===//

// The one section the generated TENSOR_REFS point at, and BLOB_CHUNK's data.
static const float kSectionData[6] = {1, 2, 3, 4, 5, 6};
static const uint8_t kChunkData[1] = {0xAB};

#define AT_(base, off, type) ((type*)(void*)((uint8_t*)(base) + (off)))

static void store_sized(void* p, uint32_t size, uint64_t v) {
  if (size == 2) {
    uint16_t x = (uint16_t)v;
    memcpy(p, &x, 2);
  } else if (size == 4) {
    uint32_t x = (uint32_t)v;
    memcpy(p, &x, 4);
  } else {
    assert_int_equal(size, 8);
    memcpy(p, &v, 8);
  }
}

static void fill(const pcp_proto_message_table_t* table, void* base) {
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_proto_field_t* f = &table->fields[i];
    void* member = AT_(base, f->offset, void);
    if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
      *AT_(base, f->presence_offset, bool) = true;
    switch (f->kind) {
      case PCP_PROTO_FIELD_UINT: {
        // Distinct small values (BLOB_CHUNK: index 3 of count 4 at offset
        // 5 of total 6; HELLO: versions 1..2), raised to the minimum.
        uint64_t v = i + 1;
        if (v < (uint64_t)f->min)
          v = (uint64_t)f->min;
        if (v > f->max)
          v = f->max;
        store_sized(member, f->size, v);
        break;
      }
      case PCP_PROTO_FIELD_INT: {
        int64_t v = f->min + (int64_t)i + 1;
        if (f->size == 4) {
          int32_t x = (int32_t)v;
          memcpy(member, &x, 4);
        } else {
          memcpy(member, &v, 8);
        }
        break;
      }
      case PCP_PROTO_FIELD_BOOL:
        *(bool*)member = true;
        break;
      case PCP_PROTO_FIELD_REAL:
        *(double*)member = 0.25;
        break;
      case PCP_PROTO_FIELD_STRING:
        *(const char**)member = make_string((size_t)f->max, 'w');
        break;
      case PCP_PROTO_FIELD_HEX:
        for (uint32_t k = 0; k < f->size; ++k) {
          ((uint8_t*)member)[k] = (uint8_t)(k * 7 + i);
        }
        break;
      case PCP_PROTO_FIELD_ENUM: {
        size_t n = 0;
        while (f->names[n]) ++n;
        *(int*)member = (int)n;
        break;
      }
      case PCP_PROTO_FIELD_CONSTANT:
        break;
      case PCP_PROTO_FIELD_STRING_LIST: {
        const char** items = member;
        for (uint64_t k = 0; k < f->max; ++k) {
          items[k] =
              make_string(PCP_PROTO_MAX_STRING_BYTES, (char)('a' + k % 26));
        }
        *AT_(base, f->count_offset, uint32_t) = (uint32_t)f->max;
        break;
      }
      case PCP_PROTO_FIELD_OBJECT:
        fill(f->table, member);
        break;
      case PCP_PROTO_FIELD_ARRAY: {
        uint8_t* items = pool_calloc(3 * (size_t)f->size);
        for (size_t k = 0; k < 3; ++k) fill(f->table, items + k * f->size);
        *(uint8_t**)member = items;
        *AT_(base, f->count_offset, uint32_t) = 3;
        break;
      }
      case PCP_PROTO_FIELD_TENSOR_REFS: {
        pcp_proto_tensor_ref_t* refs =
            pool_calloc(3 * sizeof(pcp_proto_tensor_ref_t));
        refs[0].kind = PCP_PROTO_TENSOR_REF_SECTION;
        refs[0].section = 0;
        refs[1].kind = PCP_PROTO_TENSOR_REF_RESIDENT;
        refs[1].name = make_string(PCP_PROTO_MAX_STRING_BYTES, 'r');
        refs[2].kind = PCP_PROTO_TENSOR_REF_BLOB;
        refs[2].name = "b0";
        refs[2].element_type = PCP_ELEMENT_TYPE_F32;
        refs[2].rank = 2;
        refs[2].shape[0] = 2;
        refs[2].shape[1] = 3;
        *(pcp_proto_tensor_ref_t**)member = refs;
        *AT_(base, f->count_offset, uint32_t) = 3;
        break;
      }
    }
  }
}

static void assert_same(const pcp_proto_message_table_t* table, const void* a,
                        const void* b) {
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_proto_field_t* f = &table->fields[i];
    const void* x = AT_(a, f->offset, const void);
    const void* y = AT_(b, f->offset, const void);
    if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE) {
      assert_int_equal(*AT_(a, f->presence_offset, bool),
                       *AT_(b, f->presence_offset, bool));
    }
    switch (f->kind) {
      case PCP_PROTO_FIELD_UINT:
      case PCP_PROTO_FIELD_INT:
      case PCP_PROTO_FIELD_HEX:
      case PCP_PROTO_FIELD_ENUM:
        assert_memory_equal(x, y, f->size);
        break;
      case PCP_PROTO_FIELD_BOOL:
        assert_int_equal(*(const bool*)x, *(const bool*)y);
        break;
      case PCP_PROTO_FIELD_REAL:
        assert_true(*(const double*)x == *(const double*)y);
        break;
      case PCP_PROTO_FIELD_STRING:
        assert_string_equal(*(const char* const*)x, *(const char* const*)y);
        break;
      case PCP_PROTO_FIELD_CONSTANT:
        break;
      case PCP_PROTO_FIELD_STRING_LIST: {
        uint32_t n = *AT_(a, f->count_offset, const uint32_t);
        assert_int_equal(n, *AT_(b, f->count_offset, const uint32_t));
        for (uint32_t k = 0; k < n; ++k) {
          assert_string_equal(((const char* const*)x)[k],
                              ((const char* const*)y)[k]);
        }
        break;
      }
      case PCP_PROTO_FIELD_OBJECT:
        assert_same(f->table, x, y);
        break;
      case PCP_PROTO_FIELD_ARRAY: {
        uint32_t n = *AT_(a, f->count_offset, const uint32_t);
        assert_int_equal(n, *AT_(b, f->count_offset, const uint32_t));
        const uint8_t* xs = *(const uint8_t* const*)x;
        const uint8_t* ys = *(const uint8_t* const*)y;
        for (uint32_t k = 0; k < n; ++k) {
          assert_same(f->table, xs + k * f->size, ys + k * f->size);
        }
        break;
      }
      case PCP_PROTO_FIELD_TENSOR_REFS: {
        uint32_t n = *AT_(a, f->count_offset, const uint32_t);
        assert_int_equal(n, *AT_(b, f->count_offset, const uint32_t));
        const pcp_proto_tensor_ref_t* xs =
            *(const pcp_proto_tensor_ref_t* const*)x;
        const pcp_proto_tensor_ref_t* ys =
            *(const pcp_proto_tensor_ref_t* const*)y;
        for (uint32_t k = 0; k < n; ++k) {
          assert_int_equal(xs[k].kind, ys[k].kind);
          if (xs[k].kind == PCP_PROTO_TENSOR_REF_SECTION) {
            assert_int_equal(xs[k].section, ys[k].section);
          } else {
            assert_string_equal(xs[k].name, ys[k].name);
          }
          if (xs[k].kind == PCP_PROTO_TENSOR_REF_BLOB) {
            assert_int_equal(xs[k].element_type, ys[k].element_type);
            assert_int_equal(xs[k].rank, ys[k].rank);
            assert_memory_equal(xs[k].shape, ys[k].shape,
                                xs[k].rank * sizeof(int64_t));
          }
        }
        break;
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Encoding and decoding through the generic codec
//===----------------------------------------------------------------------===//

static bool has_kind(const pcp_proto_message_table_t* table,
                     pcp_proto_field_kind_t kind) {
  for (size_t i = 0; i < table->field_count; ++i) {
    if (table->fields[i].kind == kind)
      return true;
  }
  return false;
}

// The sections a generated message of |table| travels with.
static size_t sections_for(const pcp_proto_message_table_t* table,
                           pcp_proto_section_t* out) {
  if (table->type == PCP_PROTO_MESSAGE_BLOB_CHUNK) {
    out[0] = (pcp_proto_section_t){.name = "data",
                                   .element_type = PCP_ELEMENT_TYPE_U8,
                                   .rank = 1,
                                   .shape = {sizeof(kChunkData)},
                                   .data = kChunkData};
    return 1;
  }
  if (has_kind(table, PCP_PROTO_FIELD_TENSOR_REFS)) {
    out[0] = (pcp_proto_section_t){.name = "x",
                                   .element_type = PCP_ELEMENT_TYPE_F32,
                                   .rank = 2,
                                   .shape = {2, 3},
                                   .data = kSectionData};
    return 1;
  }
  return 0;
}

static uint8_t* encode_bytes(const pcp_proto_message_table_t* table,
                             const void* message, size_t* out_length) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t sections[1];
  size_t section_count = sections_for(table, sections);
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_message_encode(table, 1, 7, message, sections,
                                     section_count, &l, pcp_allocator_system(),
                                     &e));
  return test_flatten(&e, out_length);
}

static void decode_bytes(const uint8_t* bytes, size_t n,
                         pcp_proto_frame_t* out_frame) {
  pcp_proto_limits_t l = limits();
  ASSERT_OK(pcp_proto_frame_decode(bytes, n, &l, 1, pcp_allocator_system(),
                                   out_frame));
}

// Every message type named by the protocol has a table.
static const uint16_t kTypes[] = {
    PCP_PROTO_MESSAGE_HELLO,         PCP_PROTO_MESSAGE_JOIN,
    PCP_PROTO_MESSAGE_CHALLENGE,     PCP_PROTO_MESSAGE_JOIN_PROOF,
    PCP_PROTO_MESSAGE_ACCEPT,        PCP_PROTO_MESSAGE_REJECT,
    PCP_PROTO_MESSAGE_HEARTBEAT,     PCP_PROTO_MESSAGE_ERROR,
    PCP_PROTO_MESSAGE_DRAIN,         PCP_PROTO_MESSAGE_SHUTDOWN,
    PCP_PROTO_MESSAGE_PROGRAM_OFFER, PCP_PROTO_MESSAGE_PROGRAM_FETCH,
    PCP_PROTO_MESSAGE_BLOB_CHUNK,    PCP_PROTO_MESSAGE_PROGRAM_ACK,
    PCP_PROTO_MESSAGE_TASK_ASSIGN,   PCP_PROTO_MESSAGE_TASK_PROGRESS,
    PCP_PROTO_MESSAGE_TASK_RESULT,   PCP_PROTO_MESSAGE_TASK_CANCEL,
};
#define TYPE_COUNT_ (sizeof(kTypes) / sizeof(kTypes[0]))

static void every_type_has_a_table(void** state) {
  (void)state;
  size_t named = 0;
  for (uint32_t type = 0; type <= UINT8_MAX; ++type) {
    if (!pcp_proto_message_type_name((uint16_t)type))
      continue;
    ++named;
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup((uint16_t)type);
    assert_non_null(table);
    assert_int_equal(table->type, type);
    assert_true(table->field_count > 0);
  }
  assert_int_equal(named, TYPE_COUNT_);
  assert_null(pcp_proto_message_table_lookup(0));
  assert_null(pcp_proto_message_table_lookup(999));
}

static void every_message_round_trips(void** state) {
  (void)state;
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    assert_non_null(table);
    void* in = pool_calloc(table->struct_size);
    void* out = pool_calloc(table->struct_size);
    fill(table, in);
    size_t n = 0;
    uint8_t* bytes = encode_bytes(table, in, &n);
    pcp_proto_frame_t frame;
    decode_bytes(bytes, n, &frame);
    assert_int_equal(frame.header.type, table->type);
    ASSERT_OK(pcp_proto_message_parse(table, &frame, out));
    assert_same(table, in, out);
    // Deterministic: the parsed message encodes to the very same bytes.
    size_t n2 = 0;
    uint8_t* again = encode_bytes(table, out, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(bytes, again, n);
    // A frame of another type is refused before any field is read.
    const pcp_proto_message_table_t* other =
        pcp_proto_message_table_lookup(kTypes[(t + 1) % TYPE_COUNT_]);
    ASSERT_CODE(
        pcp_proto_message_parse(other, &frame, pool_calloc(other->struct_size)),
        PCP_STATUS_FAILED_PRECONDITION);
    pcp_proto_frame_deinitialize(&frame);
    free(bytes);
    free(again);
    pool_reset();
  }
}

//===----------------------------------------------------------------------===//
// Limits on the wire: one key of a valid message changed at a time
//===----------------------------------------------------------------------===//

typedef struct wire_case_t {
  const pcp_proto_message_table_t* table;
  json_t* valid;  // control part of a valid frame, without "sections"
  pcp_proto_section_t sections[1];
  size_t section_count;
  size_t checked;  // mutations tried
} wire_case_t;

// Parses |control| (consumed) as table's message; returns the code.
static pcp_status_code_t parse_control(wire_case_t* c, json_t* control) {
  pcp_proto_limits_t l = limits();
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_frame_encode(1, c->table->type, 9, control, c->sections,
                                   c->section_count, &l, pcp_allocator_system(),
                                   &e));
  json_decref(control);
  size_t n = 0;
  uint8_t* bytes = test_flatten(&e, &n);
  pcp_proto_frame_t frame;
  decode_bytes(bytes, n, &frame);
  void* out = pool_calloc(c->table->struct_size);
  pcp_status_code_t code =
      pcp_status_consume_code(pcp_proto_message_parse(c->table, &frame, out));
  pcp_proto_frame_deinitialize(&frame);
  free(bytes);
  return code;
}

// |key| of |object| (the message or a nested object of it) set to |value|
// (consumed; NULL deletes the key) must parse to |expected|.
static void expect_mutation(wire_case_t* c, const char* parent, const char* key,
                            json_t* value, pcp_status_code_t expected) {
  json_t* control = json_deep_copy(c->valid);
  json_t* object = parent ? json_object_get(control, parent) : control;
  assert_non_null(object);
  if (value) {
    assert_int_equal(json_object_set_new(object, key, value), 0);
  } else {
    json_object_del(object, key);
  }
  pcp_status_code_t code = parse_control(c, control);
  if (code != expected) {
    fail_msg("%s key '%s%s%s': expected %s, got %s",
             pcp_proto_message_type_name(c->table->type), parent ? parent : "",
             parent ? "." : "", key, pcp_status_code_string(expected),
             pcp_status_code_string(code));
  }
  c->checked++;
}

static json_t* string_of(size_t n) {
  char* s = make_string(n, 'w');
  return json_string(s);
}

static json_t* array_of(size_t n, json_t* (*make)(size_t), size_t arg) {
  json_t* a = json_array();
  for (size_t i = 0; i < n; ++i) json_array_append_new(a, make(arg));
  return a;
}

static json_t* empty_object(size_t unused) {
  (void)unused;
  return json_object();
}

static json_t* resident_ref(size_t unused) {
  (void)unused;
  return json_pack("{s:s}", "resident", "r");
}

static void check_field_limits(wire_case_t* c, const char* parent,
                               const pcp_proto_field_t* f) {
  const pcp_status_code_t bad = PCP_STATUS_INVALID_ARGUMENT;
  bool required = f->flags & PCP_PROTO_FIELD_FLAG_REQUIRED;
  const char* k = f->key;
  // Required keys are required; optional ones may be left out.
  if (f->kind != PCP_PROTO_FIELD_BOOL) {
    expect_mutation(c, parent, k, NULL, required ? bad : PCP_STATUS_OK);
  }
  switch (f->kind) {
    case PCP_PROTO_FIELD_UINT:
      expect_mutation(c, parent, k, json_integer(-1), bad);
      expect_mutation(c, parent, k, json_string("1"), bad);
      expect_mutation(c, parent, k, json_real(1.5), bad);
      if (f->max < INT64_MAX) {
        expect_mutation(c, parent, k, json_integer((json_int_t)f->max + 1),
                        bad);
        // HELLO's min_version at its maximum is above max_version: the
        // cross-field check refuses it, not the field's limit.
        bool crossed = c->table->type == PCP_PROTO_MESSAGE_HELLO &&
                       strcmp(k, "min_version") == 0;
        expect_mutation(c, parent, k, json_integer((json_int_t)f->max),
                        crossed ? bad : PCP_STATUS_OK);
      }
      if (f->min > 0) {
        expect_mutation(c, parent, k, json_integer(f->min - 1), bad);
      }
      break;
    case PCP_PROTO_FIELD_INT:
      expect_mutation(c, parent, k, json_string("1"), bad);
      if (f->max < INT64_MAX) {
        expect_mutation(c, parent, k, json_integer((json_int_t)f->max + 1),
                        bad);
      }
      expect_mutation(c, parent, k, json_integer(f->min - 1), bad);
      expect_mutation(c, parent, k, json_integer(f->min), PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_BOOL:
      expect_mutation(c, parent, k, json_string("true"), bad);
      expect_mutation(c, parent, k, json_integer(1), bad);
      expect_mutation(c, parent, k, NULL, PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_REAL:
      expect_mutation(c, parent, k, json_real((double)f->max + 0.5), bad);
      expect_mutation(c, parent, k, json_real((double)f->min - 0.5), bad);
      expect_mutation(c, parent, k, json_string("0.5"), bad);
      expect_mutation(c, parent, k, json_integer((json_int_t)f->max),
                      PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_STRING:
      expect_mutation(c, parent, k, string_of((size_t)f->max + 1), bad);
      expect_mutation(c, parent, k, json_integer(1), bad);
      expect_mutation(c, parent, k, json_string(""),
                      f->min > 0 ? bad : PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_HEX:
      expect_mutation(c, parent, k, json_string("abcd"), bad);
      expect_mutation(c, parent, k, string_of(2 * (size_t)f->size), bad);
      expect_mutation(c, parent, k, json_integer(0), bad);
      break;
    case PCP_PROTO_FIELD_ENUM:
      expect_mutation(c, parent, k, json_string("bogus"), bad);
      expect_mutation(c, parent, k, json_string(""), bad);
      expect_mutation(c, parent, k, json_integer(1), bad);
      expect_mutation(c, parent, k, json_string(f->names[0]), PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_CONSTANT:
      expect_mutation(c, parent, k, json_string("md5"),
                      PCP_STATUS_UNIMPLEMENTED);
      expect_mutation(c, parent, k, json_integer(1), bad);
      break;
    case PCP_PROTO_FIELD_STRING_LIST:
      expect_mutation(c, parent, k, array_of((size_t)f->max + 1, string_of, 1),
                      bad);
      expect_mutation(c, parent, k, array_of(1, string_of, (size_t)257), bad);
      expect_mutation(c, parent, k, json_pack("[i]", 1), bad);
      expect_mutation(c, parent, k, json_string("a"), bad);
      expect_mutation(c, parent, k, json_array(), PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_OBJECT:
      expect_mutation(c, parent, k, json_integer(1), bad);
      expect_mutation(c, parent, k, json_array(), bad);
      for (size_t i = 0; i < f->table->field_count; ++i) {
        check_field_limits(c, k, &f->table->fields[i]);
      }
      break;
    case PCP_PROTO_FIELD_ARRAY:
      expect_mutation(c, parent, k,
                      array_of((size_t)f->max + 1, empty_object, 0), bad);
      expect_mutation(c, parent, k, json_pack("[i]", 1), bad);
      // An element missing its required keys.
      expect_mutation(c, parent, k, array_of(1, empty_object, 0), bad);
      expect_mutation(c, parent, k, json_object(), bad);
      expect_mutation(c, parent, k, json_array(), PCP_STATUS_OK);
      break;
    case PCP_PROTO_FIELD_TENSOR_REFS:
      expect_mutation(c, parent, k,
                      array_of((size_t)f->max + 1, resident_ref, 0), bad);
      expect_mutation(c, parent, k, array_of((size_t)f->max, resident_ref, 0),
                      PCP_STATUS_OK);
      expect_mutation(c, parent, k, json_pack("[i]", 1), bad);
      expect_mutation(c, parent, k, json_pack("[{s:i}]", "section", 1), bad);
      expect_mutation(c, parent, k, json_pack("[{s:i}]", "other", 1), bad);
      expect_mutation(
          c, parent, k,
          json_pack("[{s:s,s:i,s:[i]}]", "blob", "b", "dtype", 0, "shape", 1),
          bad);
      expect_mutation(c, parent, k, json_object(), bad);
      break;
  }
}

static void wire_limits_refuse_over_limit_input(void** state) {
  (void)state;
  size_t total = 0;
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    wire_case_t c = {.table = pcp_proto_message_table_lookup(kTypes[t])};
    void* in = pool_calloc(c.table->struct_size);
    fill(c.table, in);
    size_t n = 0;
    uint8_t* bytes = encode_bytes(c.table, in, &n);
    pcp_proto_frame_t frame;
    decode_bytes(bytes, n, &frame);
    c.valid = json_deep_copy(frame.control);
    json_object_del(c.valid, "sections");
    c.section_count = sections_for(c.table, c.sections);
    pcp_proto_frame_deinitialize(&frame);
    free(bytes);
    // The unchanged control part parses.
    assert_int_equal(parse_control(&c, json_deep_copy(c.valid)), PCP_STATUS_OK);
    for (size_t i = 0; i < c.table->field_count; ++i) {
      check_field_limits(&c, NULL, &c.table->fields[i]);
    }
    assert_true(c.checked >= c.table->field_count);
    total += c.checked;
    json_decref(c.valid);
    pool_reset();
  }
  print_message("%zu wire mutations checked\n", total);
}

//===----------------------------------------------------------------------===//
// Limits on the way out
//===----------------------------------------------------------------------===//

static void expect_encode(const pcp_proto_message_table_t* table,
                          const void* message, pcp_status_code_t expected,
                          const char* key) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t sections[1];
  size_t section_count = sections_for(table, sections);
  pcp_proto_encoded_frame_t e;
  pcp_status_t status =
      pcp_proto_message_encode(table, 1, 7, message, sections, section_count,
                               &l, pcp_allocator_system(), &e);
  pcp_status_code_t code = pcp_status_consume_code(status);
  if (code == PCP_STATUS_OK)
    pcp_proto_encoded_frame_deinitialize(&e);
  if (code != expected) {
    fail_msg("encoding %s with key '%s' changed: expected %s, got %s",
             pcp_proto_message_type_name(table->type), key,
             pcp_status_code_string(expected), pcp_status_code_string(code));
  }
}

static void encoder_refuses_over_limit_messages(void** state) {
  (void)state;
  size_t checked = 0;
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    void* m = pool_calloc(table->struct_size);
    for (size_t i = 0; i < table->field_count; ++i) {
      const pcp_proto_field_t* f = &table->fields[i];
      fill(table, m);
      void* member = AT_(m, f->offset, void);
      switch (f->kind) {
        case PCP_PROTO_FIELD_STRING:
          *(const char**)member = make_string((size_t)f->max + 1, 'w');
          expect_encode(table, m, PCP_STATUS_INVALID_ARGUMENT, f->key);
          checked++;
          break;
        case PCP_PROTO_FIELD_STRING_LIST:
        case PCP_PROTO_FIELD_ARRAY:
        case PCP_PROTO_FIELD_TENSOR_REFS:
          *AT_(m, f->count_offset, uint32_t) = (uint32_t)f->max + 1;
          expect_encode(table, m, PCP_STATUS_INVALID_ARGUMENT, f->key);
          checked++;
          break;
        case PCP_PROTO_FIELD_ENUM:
          *(int*)member = 99;
          expect_encode(table, m,
                        (f->flags & PCP_PROTO_FIELD_FLAG_ENUM_LAST_DEFAULT)
                            ? PCP_STATUS_OK
                            : PCP_STATUS_INVALID_ARGUMENT,
                        f->key);
          checked++;
          break;
        case PCP_PROTO_FIELD_REAL:
          *(double*)member = (double)f->max + 0.5;
          expect_encode(table, m, PCP_STATUS_INVALID_ARGUMENT, f->key);
          checked++;
          break;
        default:
          break;
      }
      pool_reset();
      m = pool_calloc(table->struct_size);
    }
    pool_reset();
  }
  assert_true(checked > TYPE_COUNT_);
}

// The JSON keys come out in table order (the golden vectors rely on it).
static void keys_follow_table_order(void** state) {
  (void)state;
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    void* m = pool_calloc(table->struct_size);
    fill(table, m);
    size_t n = 0;
    uint8_t* bytes = encode_bytes(table, m, &n);
    pcp_proto_frame_t frame;
    decode_bytes(bytes, n, &frame);
    const char* key = NULL;
    json_t* value = NULL;
    size_t i = 0;
    json_object_foreach(frame.control, key, value) {
      if (strcmp(key, "sections") == 0)
        continue;
      assert_true(i < table->field_count);
      assert_string_equal(key, table->fields[i].key);
      ++i;
    }
    assert_int_equal(i, table->field_count);
    pcp_proto_frame_deinitialize(&frame);
    free(bytes);
    pool_reset();
  }
}

// Every message through a failing allocator, failing each allocation in
// turn (SQLite-style): each failure is RESOURCE_EXHAUSTED, nothing leaks,
// and some index lets the whole encode -> decode -> parse succeed.
static void oom_sweep_every_message(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    void* in = pool_calloc(table->struct_size);
    void* out = pool_calloc(table->struct_size);
    fill(table, in);
    pcp_proto_section_t sections[1];
    size_t section_count = sections_for(table, sections);
    bool succeeded = false;
    int64_t failures = 0;
    for (int64_t fail_at = 0; fail_at < 100 && !succeeded; ++fail_at) {
      pcp_allocator_counting_t counter;
      pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
      pcp_allocator_failing_t failing;
      pcp_allocator_failing_initialize(pcp_allocator_counting(&counter),
                                       fail_at, false, &failing);
      pcp_allocator_t a = pcp_allocator_failing(&failing);
      pcp_proto_encoded_frame_t e;
      pcp_status_t st = pcp_proto_message_encode(table, 1, 7, in, sections,
                                                 section_count, &l, a, &e);
      uint8_t* bytes = NULL;
      size_t n = 0;
      if (!st) {
        st = pcp_proto_encoded_frame_flatten(&e, a, &bytes, &n);
        pcp_proto_encoded_frame_deinitialize(&e);
      }
      pcp_proto_frame_t f = {0};
      if (!st)
        st = pcp_proto_frame_decode(bytes, n, &l, 1, a, &f);
      if (!st)
        st = pcp_proto_message_parse(table, &f, out);
      if (!st) {
        succeeded = true;
        assert_same(table, in, out);
      } else {
        assert_int_equal(pcp_status_code(st), PCP_STATUS_RESOURCE_EXHAUSTED);
        pcp_status_ignore(st);
        ++failures;
      }
      pcp_proto_frame_deinitialize(&f);
      pcp_allocator_free(a, bytes);
      assert_int_equal(counter.live_bytes, 0);
    }
    assert_true(succeeded);
    assert_true(failures > 0);
    pool_reset();
  }
}

// jansson's allocations failing one at a time during an encode (the
// sweep above fails the frame's allocator, not jansson's): each encode
// either fails RESOURCE_EXHAUSTED or yields a message that parses back
// equal (never one with a dimension or an item silently left out). Leaks:
// LeakSanitizer in the asan preset (some JSON text is freed with free()).
static int64_t g_json_fail_at = -1;  // the index that fails; -1: none
static int64_t g_json_calls;

static void* json_failing_malloc(size_t n) {
  if (g_json_fail_at >= 0 && g_json_calls++ == g_json_fail_at) {
    return NULL;
  }
  return malloc(n);
}

static void json_oom_sweep_every_message(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  json_set_alloc_funcs(json_failing_malloc, free);
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    void* in = pool_calloc(table->struct_size);
    void* out = pool_calloc(table->struct_size);
    fill(table, in);
    pcp_proto_section_t sections[1];
    size_t section_count = sections_for(table, sections);
    bool succeeded = false;
    for (int64_t fail_at = 0; fail_at < 400 && !succeeded; ++fail_at) {
      g_json_calls = 0;
      g_json_fail_at = fail_at;
      pcp_proto_encoded_frame_t e;
      pcp_status_t st =
          pcp_proto_message_encode(table, 1, 7, in, sections, section_count, &l,
                                   pcp_allocator_system(), &e);
      g_json_fail_at = -1;
      if (st) {
        if (pcp_status_code(st) != PCP_STATUS_RESOURCE_EXHAUSTED) {
          fail_msg("type %u, allocation %lld failing: %s", (unsigned)kTypes[t],
                   (long long)fail_at, pcp_status_message(st));
        }
        pcp_status_ignore(st);
        continue;
      }
      size_t n = 0;
      uint8_t* bytes = test_flatten(&e, &n);
      pcp_proto_frame_t f = {0};
      pcp_status_t decoded =
          pcp_proto_frame_decode(bytes, n, &l, 1, pcp_allocator_system(), &f);
      if (!decoded) {
        decoded = pcp_proto_message_parse(table, &f, out);
      }
      if (decoded && g_json_calls > fail_at) {
        // jansson 2.14's json_dumps ignores a failed append of an object
        // key (dump_string's result): the text is malformed and the peer
        // rejects it (reported to the lead: json_dumpb into a sized buffer
        // would avoid it). Not what this test checks.
        pcp_status_ignore(decoded);
        pcp_proto_frame_deinitialize(&f);
        free(bytes);
        continue;
      }
      ASSERT_OK(decoded);
      assert_same(table, in, out);
      pcp_proto_frame_deinitialize(&f);
      free(bytes);
      succeeded = g_json_calls <= fail_at;  // no allocation failed
    }
    assert_true(succeeded);
    pool_reset();
  }
  json_set_alloc_funcs(malloc, free);
}

//===----------------------------------------------------------------------===//
// The tables themselves, pinned
//===----------------------------------------------------------------------===//
//
// The tests above check that the codec honours each table; this one checks
// that the tables say what the protocol says. Every key, kind, flag and
// limit is written out and compared with tests/conformance/fabric/
// message_tables.txt, so that loosening a limit (or dropping REQUIRED) shows
// up as a diff of that file. PCP_FABRIC_GOLDEN_WRITE=1 rewrites it.

static const char* kind_name(pcp_proto_field_kind_t kind) {
  static const char* const kNames[] = {
      "uint", "int",      "bool",        "real",   "string", "hex",
      "enum", "constant", "string_list", "object", "array",  "tensor_refs",
  };
  return kNames[kind];
}

static void dump_table(const pcp_proto_message_table_t* table,
                       const char* type_name, const char* prefix, FILE* out) {
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_proto_field_t* f = &table->fields[i];
    fprintf(out, "%s %s%s %s", type_name, prefix, f->key, kind_name(f->kind));
    if (f->flags & PCP_PROTO_FIELD_FLAG_REQUIRED)
      fprintf(out, " required");
    if (f->flags & PCP_PROTO_FIELD_FLAG_PRESENCE)
      fprintf(out, " presence");
    if (f->flags & PCP_PROTO_FIELD_FLAG_OMIT_ZERO)
      fprintf(out, " omit_zero");
    if (f->flags & PCP_PROTO_FIELD_FLAG_ENUM_LAST_DEFAULT)
      fprintf(out, " last_default");
    switch (f->kind) {
      case PCP_PROTO_FIELD_UINT:
      case PCP_PROTO_FIELD_INT:
      case PCP_PROTO_FIELD_REAL:
        fprintf(out, " [%lld, %llu]", (long long)f->min,
                (unsigned long long)f->max);
        if (f->kind == PCP_PROTO_FIELD_INT)
          fprintf(out, " absent=%lld", (long long)f->absent_value);
        if (f->kind != PCP_PROTO_FIELD_REAL)
          fprintf(out, " bytes=%u", f->size);
        break;
      case PCP_PROTO_FIELD_STRING:
        fprintf(out, " bytes=%lld..%llu", (long long)f->min,
                (unsigned long long)f->max);
        break;
      case PCP_PROTO_FIELD_HEX:
        fprintf(out, " bytes=%u", f->size);
        break;
      case PCP_PROTO_FIELD_ENUM:
      case PCP_PROTO_FIELD_CONSTANT:
        for (size_t k = 0; f->names[k]; ++k) {
          fprintf(out, "%s%s", k ? "|" : " ", f->names[k]);
        }
        fprintf(out, " bytes=1..%llu", (unsigned long long)f->max);
        break;
      case PCP_PROTO_FIELD_STRING_LIST:
      case PCP_PROTO_FIELD_ARRAY:
      case PCP_PROTO_FIELD_TENSOR_REFS:
        fprintf(out, " items<=%llu", (unsigned long long)f->max);
        break;
      default:
        break;
    }
    fprintf(out, "\n");
    if (f->kind == PCP_PROTO_FIELD_OBJECT || f->kind == PCP_PROTO_FIELD_ARRAY) {
      char nested[128];
      snprintf(nested, sizeof(nested), "%s%s%s", prefix, f->key,
               f->kind == PCP_PROTO_FIELD_ARRAY ? "[]." : ".");
      dump_table(f->table, type_name, nested, out);
    }
  }
}

static void tables_match_pinned_schema(void** state) {
  (void)state;
  char* text = NULL;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  assert_non_null(out);
  fprintf(out,
          "# Fabric message tables (src/proto/messages.c), written by "
          "proto_table_test.\n# One line per JSON key, in wire order.\n");
  for (size_t t = 0; t < TYPE_COUNT_; ++t) {
    const pcp_proto_message_table_t* table =
        pcp_proto_message_table_lookup(kTypes[t]);
    dump_table(table, pcp_proto_message_type_name(table->type), "", out);
  }
  assert_int_equal(fclose(out), 0);
  const char* path = PCP_FABRIC_GOLDEN_DIR "/message_tables.txt";
  const char* write = getenv("PCP_FABRIC_GOLDEN_WRITE");
  if (write && strcmp(write, "1") == 0) {
    FILE* f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, length, f), length);
    assert_int_equal(fclose(f), 0);
  }
  FILE* f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot open %s", path);
  char* expected = calloc(1, length + 2);
  size_t n = fread(expected, 1, length + 1, f);
  fclose(f);
  if (n != length || memcmp(expected, text, length) != 0) {
    fprintf(stderr, "%s differs; the tables now say:\n%s", path, text);
    fail_msg("message tables changed: review, then rewrite %s", path);
  }
  free(expected);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_type_has_a_table),
      cmocka_unit_test(every_message_round_trips),
      cmocka_unit_test(wire_limits_refuse_over_limit_input),
      cmocka_unit_test(encoder_refuses_over_limit_messages),
      cmocka_unit_test(keys_follow_table_order),
      cmocka_unit_test(oom_sweep_every_message),
      cmocka_unit_test(json_oom_sweep_every_message),
      cmocka_unit_test(tables_match_pinned_schema),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
