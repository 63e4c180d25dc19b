// SPDX-License-Identifier: Apache-2.0
//
// Runs of resident names in TASK_ASSIGN / TASK_RESULT (docs/protocol.md
// s.3.9, protocol version 2): round trips of runs, mixed and broken lists,
// the exact wire entries the encoder picks, v1 frames staying plain, hostile
// run entries refused with clear errors, and the frame sizes of a decoupled
// DiLoCo local step (printed; the figures in docs/protocol.md).

#include <stdio.h>

#include "proto/proto_impl.h"
#include "proto/proto_test_impl.h"

static pcp_proto_limits_t limits(void) {
  return pcp_proto_limits_default();
}

static void decode_ok(const uint8_t* bytes, size_t n, uint16_t version,
                      pcp_proto_frame_t* out_frame) {
  pcp_proto_limits_t l = limits();
  ASSERT_OK(pcp_proto_frame_decode(bytes, n, &l, version,
                                   pcp_allocator_system(), out_frame));
}

// The JSON part's length: the u32 after the 32-byte header (s.1.2).
static size_t json_length(const uint8_t* frame) {
  return (size_t)frame[32] | (size_t)frame[33] << 8 | (size_t)frame[34] << 16 |
         (size_t)frame[35] << 24;
}

// The "inputs" (or "outputs") array of a decoded frame, for checking which
// entries went on the wire.
static const json_t* wire_array(const pcp_proto_frame_t* f, const char* key) {
  const json_t* a = json_object_get(f->control, key);
  assert_true(json_is_array(a));
  return a;
}

//===----------------------------------------------------------------------===//
// A decoupled local step (service_decoupled.c dec_step_submit)
//===----------------------------------------------------------------------===//

#define STEP_TENSORS_ 17u  // parameter tensors of the bench's GPT
#define STEP_RESIDENT_ (3u * STEP_TENSORS_)

typedef struct step_t {
  char names[STEP_RESIDENT_][8];
  pcp_proto_tensor_ref_t refs[STEP_RESIDENT_ + 4];
  pcp_proto_keep_resident_t keep[STEP_RESIDENT_];
  pcp_proto_tensor_ref_t outputs[STEP_RESIDENT_ + 1];
  float step;
  float lr;
  int32_t ids[2][8 * 32];
  pcp_proto_section_t sections[4];
  pcp_proto_section_t loss_section;
  float loss;
} step_t;

static void step_fill(step_t* s) {
  memset(s, 0, sizeof(*s));
  for (uint32_t g = 0; g < 3; ++g) {
    for (uint32_t i = 0; i < STEP_TENSORS_; ++i) {
      uint32_t k = g * STEP_TENSORS_ + i;
      snprintf(s->names[k], sizeof(s->names[k]), "%c%u", "pmv"[g], i);
      s->refs[k] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = s->names[k]};
      s->keep[k] = (pcp_proto_keep_resident_t){.output = k, .as = s->names[k]};
      // The worker's result names each kept output (runtime.c) and sends
      // the loss as a section after them.
      s->outputs[k] = s->refs[k];
    }
  }
  s->outputs[STEP_RESIDENT_] = (pcp_proto_tensor_ref_t){
      .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0};
  s->step = 3;
  s->lr = 1e-3f;
  s->sections[0] = (pcp_proto_section_t){
      .name = "step", .element_type = PCP_ELEMENT_TYPE_F32, .data = &s->step};
  s->sections[1] = (pcp_proto_section_t){.name = "lr",
                                         .element_type = PCP_ELEMENT_TYPE_F32,
                                         .rank = 1,
                                         .shape = {1},
                                         .data = &s->lr};
  for (int j = 0; j < 2; ++j) {
    s->sections[2 + j] =
        (pcp_proto_section_t){.name = j ? "targets" : "input_ids",
                              .element_type = PCP_ELEMENT_TYPE_I32,
                              .rank = 3,
                              .shape = {1, 8, 32},
                              .data = s->ids[j]};
    s->refs[STEP_RESIDENT_ + (uint32_t)j] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (uint32_t)j};
    s->refs[STEP_RESIDENT_ + 2 + (uint32_t)j] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 2 + (uint32_t)j};
  }
  s->loss = 2.5f;
  s->loss_section = (pcp_proto_section_t){.name = "output51",
                                          .element_type = PCP_ELEMENT_TYPE_F32,
                                          .data = &s->loss};
}

static pcp_proto_task_assign_t step_assign(step_t* s) {
  pcp_proto_task_assign_t t = {.task_id = 1234,
                               .session_id = "dec-worker-0",
                               .function = "train_steps",
                               .inputs = s->refs,
                               .input_count = STEP_RESIDENT_ + 4,
                               .keep_resident = s->keep,
                               .keep_resident_count = STEP_RESIDENT_};
  memset(t.program, 0x5a, sizeof(t.program));
  return t;
}

static uint8_t* step_assign_bytes(step_t* s, uint16_t version, size_t* n) {
  pcp_proto_limits_t l = limits();
  pcp_proto_task_assign_t t = step_assign(s);
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_assign_encode(version, 9, &t, s->sections, 4, &l,
                                         pcp_allocator_system(), &e));
  return test_flatten(&e, n);
}

static uint8_t* step_result_bytes(step_t* s, uint16_t version, size_t* n) {
  pcp_proto_limits_t l = limits();
  pcp_proto_task_result_t r = {.task_id = 1234,
                               .outputs = s->outputs,
                               .output_count = STEP_RESIDENT_ + 1,
                               .elapsed_us = 51234};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_result_encode(version, 9, &r, &s->loss_section, 1,
                                         &l, pcp_allocator_system(), &e));
  return test_flatten(&e, n);
}

// With PCP_RUNS_SEED_DIR set, writes |bytes| there as |name| (the v2 seeds
// of tests/fuzz/corpus/frame_decoder were made so).
static void maybe_write_seed(const char* name, const uint8_t* bytes, size_t n) {
  const char* dir = getenv("PCP_RUNS_SEED_DIR");
  if (!dir) {
    return;
  }
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

// Both versions decode to the same message the caller built; v2 is the
// smaller frame, and its lists are one run per state kind.
static void decoupled_step_round_trip_and_sizes(void** state) {
  (void)state;
  static step_t s;
  step_fill(&s);
  size_t assign_bytes[3] = {0};
  size_t result_bytes[3] = {0};
  size_t assign_json[3] = {0};
  size_t result_json[3] = {0};
  for (uint16_t v = 1; v <= 2; ++v) {
    size_t n = 0;
    uint8_t* b = step_assign_bytes(&s, v, &n);
    if (v == 2) {
      maybe_write_seed("task_assign_runs.bin", b, n);
    }
    pcp_proto_frame_t f;
    decode_ok(b, n, v, &f);
    assign_bytes[v] = n;
    assign_json[v] = json_length(b);
    pcp_proto_task_assign_t out;
    ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
    assert_int_equal(out.input_count, STEP_RESIDENT_ + 4);
    assert_int_equal(out.keep_resident_count, STEP_RESIDENT_);
    for (uint32_t k = 0; k < STEP_RESIDENT_; ++k) {
      assert_int_equal(out.inputs[k].kind, PCP_PROTO_TENSOR_REF_RESIDENT);
      assert_string_equal(out.inputs[k].name, s.names[k]);
      assert_int_equal(out.keep_resident[k].output, k);
      assert_string_equal(out.keep_resident[k].as, s.names[k]);
    }
    for (uint32_t j = 0; j < 4; ++j) {
      assert_int_equal(out.inputs[STEP_RESIDENT_ + j].kind,
                       PCP_PROTO_TENSOR_REF_SECTION);
      assert_int_equal(out.inputs[STEP_RESIDENT_ + j].section, j);
    }
    // v1: one entry per tensor; v2: p, m, v runs and the 4 sections.
    assert_int_equal(json_array_size(wire_array(&f, "inputs")),
                     v == 1 ? STEP_RESIDENT_ + 4 : 3 + 4);
    assert_int_equal(json_array_size(wire_array(&f, "keep_resident")),
                     v == 1 ? STEP_RESIDENT_ : 3);
    pcp_proto_frame_deinitialize(&f);
    free(b);

    b = step_result_bytes(&s, v, &n);
    if (v == 2) {
      maybe_write_seed("task_result_runs.bin", b, n);
    }
    decode_ok(b, n, v, &f);
    result_bytes[v] = n;
    result_json[v] = json_length(b);
    pcp_proto_task_result_t r;
    ASSERT_OK(pcp_proto_task_result_parse(&f, &r));
    assert_int_equal(r.output_count, STEP_RESIDENT_ + 1);
    for (uint32_t k = 0; k < STEP_RESIDENT_; ++k) {
      assert_int_equal(r.outputs[k].kind, PCP_PROTO_TENSOR_REF_RESIDENT);
      assert_string_equal(r.outputs[k].name, s.names[k]);
    }
    assert_int_equal(r.outputs[STEP_RESIDENT_].kind,
                     PCP_PROTO_TENSOR_REF_SECTION);
    assert_int_equal(json_array_size(wire_array(&f, "outputs")),
                     v == 1 ? STEP_RESIDENT_ + 1 : 3 + 1);
    pcp_proto_frame_deinitialize(&f);
    free(b);
  }
  printf(
      "decoupled step (%u resident tensors): TASK_ASSIGN %zu -> %zu bytes "
      "(JSON %zu -> %zu), TASK_RESULT %zu -> %zu bytes (JSON %zu -> %zu), "
      "v1 -> v2\n",
      STEP_RESIDENT_, assign_bytes[1], assign_bytes[2], assign_json[1],
      assign_json[2], result_bytes[1], result_bytes[2], result_json[1],
      result_json[2]);
  // The naming was over half of the task frame and nearly all the result.
  assert_true(assign_bytes[2] + 1500 < assign_bytes[1]);
  assert_true(result_bytes[2] + 700 < result_bytes[1]);
}

//===----------------------------------------------------------------------===//
// Round trips of mixed lists
//===----------------------------------------------------------------------===//

// Encodes |refs| as a TASK_ASSIGN's inputs at |version|, checks the parse
// gives them back and returns the wire entry count.
static size_t refs_round_trip(const pcp_proto_tensor_ref_t* refs,
                              uint32_t count, uint16_t version) {
  pcp_proto_limits_t l = limits();
  float x = 1;
  pcp_proto_section_t section = {
      .name = "x", .element_type = PCP_ELEMENT_TYPE_F32, .data = &x};
  pcp_proto_task_assign_t t = {
      .task_id = 1, .function = "f", .inputs = refs, .input_count = count};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_assign_encode(version, 1, &t, &section, 1, &l,
                                         pcp_allocator_system(), &e));
  size_t n = 0;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, version, &f);
  pcp_proto_task_assign_t out;
  ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
  assert_int_equal(out.input_count, count);
  for (uint32_t i = 0; i < count; ++i) {
    assert_int_equal(out.inputs[i].kind, refs[i].kind);
    if (refs[i].kind == PCP_PROTO_TENSOR_REF_SECTION) {
      assert_int_equal(out.inputs[i].section, refs[i].section);
    } else {
      assert_string_equal(out.inputs[i].name, refs[i].name);
    }
  }
  size_t entries = json_array_size(wire_array(&f, "inputs"));
  pcp_proto_frame_deinitialize(&f);
  free(b);
  return entries;
}

#define RES_(n) \
  { .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = (n) }
#define SEC_(k) \
  { .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (k) }

static void mixed_lists_round_trip(void** state) {
  (void)state;
  // A run broken in the middle by a section, then resumed: two runs.
  const pcp_proto_tensor_ref_t broken[] = {RES_("p0"), RES_("p1"), SEC_(0),
                                           RES_("p2"), RES_("p3")};
  assert_int_equal(refs_round_trip(broken, 5, 2), 3);
  assert_int_equal(refs_round_trip(broken, 5, 1), 5);
  // Numeric-looking names that do not count up by one stay plain; a gap
  // ends a run.
  const pcp_proto_tensor_ref_t gaps[] = {RES_("p0"), RES_("p2"), RES_("p4"),
                                         RES_("p5"), RES_("p6")};
  assert_int_equal(refs_round_trip(gaps, 5, 2), 3);  // p0, p2, p4..p6
  // Leading zeros, no index, other prefixes, descending: all plain.
  const pcp_proto_tensor_ref_t plain[] = {
      RES_("p00"), RES_("p01"), RES_("p02"), RES_("w"),  RES_("x"),
      RES_("a1"),  RES_("b2"),  RES_("c3"),  RES_("q2"), RES_("q1")};
  assert_int_equal(refs_round_trip(plain, 10, 2), 10);
  // A prefix with digits in it: only the trailing ones count.
  const pcp_proto_tensor_ref_t layer[] = {
      RES_("layer1.w8"), RES_("layer1.w9"), RES_("layer1.w10"),
      RES_("layer1.w11"), RES_("layer2.w12")};
  assert_int_equal(refs_round_trip(layer, 5, 2), 2);
  // Bare numbers (empty prefix) and the index 0.
  const pcp_proto_tensor_ref_t bare[] = {RES_("0"), RES_("1"), RES_("2")};
  assert_int_equal(refs_round_trip(bare, 3, 2), 1);
  // The widest index a run may hold, and one past it (10 digits: plain).
  const pcp_proto_tensor_ref_t wide[] = {RES_("t999999998"), RES_("t999999999"),
                                         RES_("t1000000000")};
  assert_int_equal(refs_round_trip(wide, 3, 2), 2);
  // 1024 names p0..p1023: one entry.
  static char names[PCP_PROTO_MAX_TASK_TENSORS][8];
  static pcp_proto_tensor_ref_t many[PCP_PROTO_MAX_TASK_TENSORS];
  for (uint32_t i = 0; i < PCP_PROTO_MAX_TASK_TENSORS; ++i) {
    snprintf(names[i], sizeof(names[i]), "p%u", i);
    many[i] = (pcp_proto_tensor_ref_t)RES_(names[i]);
  }
  assert_int_equal(refs_round_trip(many, PCP_PROTO_MAX_TASK_TENSORS, 2), 1);
}

// keep_resident: outputs must count up too; mixed runs and plain entries.
static void keep_lists_round_trip(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  const pcp_proto_keep_resident_t keep[] = {
      {.output = 0, .as = "p0"},    {.output = 1, .as = "p1"},
      {.output = 2, .as = "p2"},  // run of 3
      {.output = 4, .as = "p3"},  // output gap: new entry
      {.output = 5, .as = "cache"}, {.output = 6, .as = "m7"},
      {.output = 7, .as = "m8"},  // run of 2
      {.output = 9, .as = "m9"},
  };
  const uint32_t count = sizeof(keep) / sizeof(keep[0]);
  const pcp_proto_tensor_ref_t in[] = {RES_("p0")};
  pcp_proto_task_assign_t t = {.task_id = 1,
                               .function = "f",
                               .inputs = in,
                               .input_count = 1,
                               .keep_resident = keep,
                               .keep_resident_count = count};
  for (uint16_t v = 1; v <= 2; ++v) {
    pcp_proto_encoded_frame_t e;
    ASSERT_OK(pcp_proto_task_assign_encode(v, 1, &t, NULL, 0, &l,
                                           pcp_allocator_system(), &e));
    size_t n = 0;
    uint8_t* b = test_flatten(&e, &n);
    pcp_proto_frame_t f;
    decode_ok(b, n, v, &f);
    pcp_proto_task_assign_t out;
    ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
    assert_int_equal(out.keep_resident_count, count);
    for (uint32_t i = 0; i < count; ++i) {
      assert_int_equal(out.keep_resident[i].output, keep[i].output);
      assert_string_equal(out.keep_resident[i].as, keep[i].as);
    }
    const json_t* wire = wire_array(&f, "keep_resident");
    assert_int_equal(json_array_size(wire), v == 1 ? count : 5);
    if (v == 2) {
      const json_t* run = json_array_get(wire, 0);
      assert_string_equal(json_string_value(json_object_get(run, "keep_run")),
                          "p");
      assert_int_equal(json_integer_value(json_object_get(run, "output")), 0);
      assert_int_equal(json_integer_value(json_object_get(run, "first")), 0);
      assert_int_equal(json_integer_value(json_object_get(run, "count")), 3);
    }
    pcp_proto_frame_deinitialize(&f);
    free(b);
  }
}

//===----------------------------------------------------------------------===//
// Hostile input
//===----------------------------------------------------------------------===//

// Parses a TASK_ASSIGN whose control part is |text| (one section "x"),
// framed as |version|; returns the parse status for the caller to check.
static pcp_status_t parse_assign_text(const char* text, uint16_t version,
                                      pcp_proto_task_assign_t* out) {
  json_error_t error;
  json_t* control = json_loads(text, 0, &error);
  if (!control) {
    fail_msg("bad test JSON: %s", error.text);
  }
  pcp_proto_limits_t l = limits();
  float x = 1;
  pcp_proto_section_t section = {
      .name = "x", .element_type = PCP_ELEMENT_TYPE_F32, .data = &x};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_frame_encode(version, PCP_PROTO_MESSAGE_TASK_ASSIGN, 1,
                                   control, &section, 1, &l,
                                   pcp_allocator_system(), &e));
  json_decref(control);
  size_t n = 0;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, version, &f);
  pcp_status_t status = pcp_proto_task_assign_parse(&f, out);
  pcp_proto_frame_deinitialize(&f);
  free(b);
  return status;
}

// Expects INVALID_ARGUMENT whose text contains |needle|.
static void expect_refused(const char* text, uint16_t version,
                           const char* needle) {
  pcp_proto_task_assign_t out;
  pcp_status_t status = parse_assign_text(text, version, &out);
  char message[1024] = "OK";
  if (status) {
    pcp_status_format(status, message, sizeof(message));
  }
  pcp_status_code_t code = pcp_status_consume_code(status);
  if (code != PCP_STATUS_INVALID_ARGUMENT || !strstr(message, needle)) {
    fail_msg("%s: expected INVALID_ARGUMENT with '%s', got %s", text, needle,
             message);
  }
}

#define HEAD_ \
  "{\"task_id\":1,\"function\":\"f\",\"program\":\"" PROGRAM_HEX_ "\","
#define PROGRAM_HEX_ \
  "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static void hostile_runs_refused(void** state) {
  (void)state;
  // Version 1 frames never carry runs.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":2}]}",
                 1, "'resident_run' needs protocol version 2");
  expect_refused(HEAD_
                 "\"inputs\":[],\"keep_resident\":[{\"keep_run\":\"p\","
                 "\"output\":0,\"first\":0,\"count\":2}]}",
                 1, "'keep_run' needs protocol version 2");
  // count 0, huge, missing, negative, not a number.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":0}]}",
                 2, "a run of 0 names");
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":1025}]}",
                 2, "count");
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":9223372036854775807}]}",
                 2, "count");
  expect_refused(HEAD_ "\"inputs\":[{\"resident_run\":\"p\",\"first\":0}]}", 2,
                 "count");
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":-3}]}",
                 2, "count");
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":\"2\"}]}",
                 2, "count");
  // Two runs that each fit but together pass the 1024-tensor ceiling.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":1000},{\"resident_run\":\"m\",\"first\":0,"
                 "\"count\":1000}]}",
                 2, "more than 1024 entries once its runs are expanded");
  // A run plus plain entries past the ceiling.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":0,"
                 "\"count\":1024},{\"section\":0}]}",
                 2, "more than 1024 entries");
  // first + count overflowing, first past the index limit, first missing.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":"
                 "999999999,\"count\":2}]}",
                 2, "index 1000000000 past 999999999");
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":\"p\",\"first\":"
                 "4294967295,\"count\":2}]}",
                 2, "first");
  expect_refused(HEAD_ "\"inputs\":[{\"resident_run\":\"p\",\"count\":2}]}", 2,
                 "first");
  // Prefix: not a string, or too long once the digits are added.
  expect_refused(HEAD_
                 "\"inputs\":[{\"resident_run\":7,\"first\":0,"
                 "\"count\":2}]}",
                 2, "resident_run");
  char text[1024];
  char prefix[PCP_PROTO_MAX_STRING_BYTES + 1];
  memset(prefix, 'a', PCP_PROTO_MAX_STRING_BYTES - 1);
  prefix[PCP_PROTO_MAX_STRING_BYTES - 1] = '\0';
  snprintf(text, sizeof(text),
           HEAD_
           "\"inputs\":[{\"resident_run\":\"%s\",\"first\":8,"
           "\"count\":3}]}",
           prefix);
  expect_refused(text, 2, "names of 257 bytes, at most 256");
  // keep_run: output missing or running past the output limit.
  expect_refused(HEAD_
                 "\"inputs\":[],\"keep_resident\":[{\"keep_run\":\"p\","
                 "\"first\":0,\"count\":2}]}",
                 2, "output");
  expect_refused(HEAD_
                 "\"inputs\":[],\"keep_resident\":[{\"keep_run\":\"p\","
                 "\"output\":1000,\"first\":0,\"count\":100}]}",
                 2, "output 1099 past 1024");
  expect_refused(HEAD_
                 "\"inputs\":[],\"keep_resident\":[{\"keep_run\":\"p\","
                 "\"output\":0,\"first\":0,\"count\":600},{\"keep_run\":"
                 "\"m\",\"output\":0,\"first\":0,\"count\":600}]}",
                 2, "more than 1024 entries");
  // A run key in the wrong list is no ref at all.
  expect_refused(HEAD_
                 "\"inputs\":[{\"keep_run\":\"p\",\"output\":0,"
                 "\"first\":0,\"count\":2}]}",
                 2, "needs 'section', 'resident' or 'blob'");

  // Accepted at the edges: a name of exactly 256 bytes, a run of 1.
  snprintf(text, sizeof(text),
           HEAD_
           "\"inputs\":[{\"resident_run\":\"%s\",\"first\":8,"
           "\"count\":2},{\"resident_run\":\"q\",\"first\":5,"
           "\"count\":1}]}",
           prefix);
  pcp_proto_task_assign_t out;
  json_error_t error;
  json_t* control = json_loads(text, 0, &error);
  assert_non_null(control);
  pcp_proto_limits_t l = limits();
  float x = 1;
  pcp_proto_section_t section = {
      .name = "x", .element_type = PCP_ELEMENT_TYPE_F32, .data = &x};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_frame_encode(2, PCP_PROTO_MESSAGE_TASK_ASSIGN, 1, control,
                                   &section, 1, &l, pcp_allocator_system(),
                                   &e));
  json_decref(control);
  size_t n = 0;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 2, &f);
  ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
  assert_int_equal(out.input_count, 3);
  assert_int_equal(strlen(out.inputs[0].name), PCP_PROTO_MAX_STRING_BYTES);
  assert_int_equal(out.inputs[1].name[PCP_PROTO_MAX_STRING_BYTES - 1], '9');
  assert_string_equal(out.inputs[2].name, "q5");
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

// A v2 frame whose runs are parsed twice (a second parse replaces the
// first's scratch block, names included) and a frame that is parsed as a
// TASK_RESULT with runs: both ASan-clean.
static void reparse_and_result_runs(void** state) {
  (void)state;
  pcp_proto_task_assign_t out;
  pcp_proto_limits_t l = limits();
  json_error_t error;
  json_t* control = json_loads(
      "{\"task_id\":5,\"outputs\":[{\"resident_run\":\"s\",\"first\":98,"
      "\"count\":4},{\"section\":0}]}",
      0, &error);
  assert_non_null(control);
  float x = 1;
  pcp_proto_section_t section = {
      .name = "output4", .element_type = PCP_ELEMENT_TYPE_F32, .data = &x};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_frame_encode(2, PCP_PROTO_MESSAGE_TASK_RESULT, 1, control,
                                   &section, 1, &l, pcp_allocator_system(),
                                   &e));
  json_decref(control);
  size_t n = 0;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 2, &f);
  for (int pass = 0; pass < 2; ++pass) {
    pcp_proto_task_result_t r;
    ASSERT_OK(pcp_proto_task_result_parse(&f, &r));
    assert_int_equal(r.output_count, 5);
    assert_string_equal(r.outputs[0].name, "s98");
    assert_string_equal(r.outputs[1].name, "s99");
    assert_string_equal(r.outputs[2].name, "s100");
    assert_string_equal(r.outputs[3].name, "s101");
    assert_int_equal(r.outputs[4].kind, PCP_PROTO_TENSOR_REF_SECTION);
  }
  // Parsed as the wrong message: refused, nothing leaks.
  ASSERT_CODE(pcp_proto_task_assign_parse(&f, &out),
              PCP_STATUS_FAILED_PRECONDITION);
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

//===----------------------------------------------------------------------===//
// Out of memory
//===----------------------------------------------------------------------===//

// Checks |f| parses back to the step's TASK_ASSIGN (runs expanded).
static pcp_status_t step_parse_check(pcp_proto_frame_t* f, const step_t* s) {
  pcp_proto_task_assign_t out;
  pcp_status_t st = pcp_proto_task_assign_parse(f, &out);
  if (st) {
    return st;
  }
  assert_int_equal(out.input_count, STEP_RESIDENT_ + 4);
  assert_int_equal(out.keep_resident_count, STEP_RESIDENT_);
  for (uint32_t k = 0; k < STEP_RESIDENT_; ++k) {
    assert_string_equal(out.inputs[k].name, s->names[k]);
    assert_string_equal(out.keep_resident[k].as, s->names[k]);
  }
  return pcp_ok_status();
}

// The frame's allocator failing each allocation in turn through encode ->
// decode -> parse of a v2 step: RESOURCE_EXHAUSTED every time, nothing
// leaks, and some index lets it all succeed.
static void oom_sweep_step(void** state) {
  (void)state;
  static step_t s;
  step_fill(&s);
  pcp_proto_limits_t l = limits();
  pcp_proto_task_assign_t t = step_assign(&s);
  bool succeeded = false;
  for (int64_t fail_at = 0; fail_at < 100 && !succeeded; ++fail_at) {
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), fail_at,
                                     false, &failing);
    pcp_allocator_t a = pcp_allocator_failing(&failing);
    pcp_proto_encoded_frame_t e;
    pcp_status_t st =
        pcp_proto_task_assign_encode(2, 9, &t, s.sections, 4, &l, a, &e);
    uint8_t* bytes = NULL;
    size_t n = 0;
    if (!st) {
      st = pcp_proto_encoded_frame_flatten(&e, a, &bytes, &n);
      pcp_proto_encoded_frame_deinitialize(&e);
    }
    pcp_proto_frame_t f = {0};
    if (!st) {
      st = pcp_proto_frame_decode(bytes, n, &l, 2, a, &f);
    }
    if (!st) {
      st = step_parse_check(&f, &s);
    }
    if (!st) {
      succeeded = true;
    } else {
      assert_int_equal(pcp_status_code(st), PCP_STATUS_RESOURCE_EXHAUSTED);
      pcp_status_ignore(st);
    }
    pcp_proto_frame_deinitialize(&f);
    pcp_allocator_free(a, bytes);
    assert_int_equal(counter.live_bytes, 0);
  }
  assert_true(succeeded);
}

// jansson's allocations failing one at a time while a v2 step is encoded
// (the run entries are built there): each encode fails RESOURCE_EXHAUSTED
// or yields a frame that parses back whole. Leaks: LeakSanitizer (asan).
static int64_t g_json_fail_at = -1;  // the index that fails; -1: none
static int64_t g_json_calls;

static void* json_failing_malloc(size_t n) {
  if (g_json_fail_at >= 0 && g_json_calls++ == g_json_fail_at) {
    return NULL;
  }
  return malloc(n);
}

static void json_oom_sweep_step(void** state) {
  (void)state;
  static step_t s;
  step_fill(&s);
  pcp_proto_limits_t l = limits();
  pcp_proto_task_assign_t t = step_assign(&s);
  json_set_alloc_funcs(json_failing_malloc, free);
  bool succeeded = false;
  int64_t failures = 0;
  for (int64_t fail_at = 0; fail_at < 2000 && !succeeded; ++fail_at) {
    g_json_calls = 0;
    g_json_fail_at = fail_at;
    pcp_proto_encoded_frame_t e;
    pcp_status_t st = pcp_proto_task_assign_encode(2, 9, &t, s.sections, 4, &l,
                                                   pcp_allocator_system(), &e);
    g_json_fail_at = -1;
    if (st) {
      assert_int_equal(pcp_status_code(st), PCP_STATUS_RESOURCE_EXHAUSTED);
      pcp_status_ignore(st);
      ++failures;
      continue;
    }
    size_t n = 0;
    uint8_t* bytes = test_flatten(&e, &n);
    pcp_proto_frame_t f = {0};
    pcp_status_t decoded =
        pcp_proto_frame_decode(bytes, n, &l, 2, pcp_allocator_system(), &f);
    if (!decoded) {
      decoded = step_parse_check(&f, &s);
    }
    if (decoded && g_json_calls > fail_at) {
      // jansson 2.14's json_dumps can drop a failed append and emit
      // malformed text that the peer rejects (proto_table_test's sweep
      // has the same exception); not what this test checks.
      pcp_status_ignore(decoded);
    } else {
      ASSERT_OK(decoded);
      succeeded = g_json_calls <= fail_at;  // no allocation failed
    }
    pcp_proto_frame_deinitialize(&f);
    free(bytes);
  }
  json_set_alloc_funcs(malloc, free);
  assert_true(succeeded);
  assert_true(failures > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(decoupled_step_round_trip_and_sizes),
      cmocka_unit_test(mixed_lists_round_trip),
      cmocka_unit_test(keep_lists_round_trip),
      cmocka_unit_test(hostile_runs_refused),
      cmocka_unit_test(reparse_and_result_runs),
      cmocka_unit_test(oom_sweep_step),
      cmocka_unit_test(json_oom_sweep_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
