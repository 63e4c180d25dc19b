// SPDX-License-Identifier: Apache-2.0
// safetensors: writer/reader round trip, malformed headers (each a clear
// status, never a crash), sharded checkpoints, and the Qwen3 name mapping
// of a tiny random checkpoint onto the built-in parameter table.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/models.h"

static char g_dir[256];

static int setup(void** state) {
  (void)state;
  snprintf(g_dir, sizeof(g_dir), "/tmp/pcp_safetensors_test_XXXXXX");
  return mkdtemp(g_dir) == NULL ? -1 : 0;
}

static int teardown(void** state) {
  (void)state;
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_dir);
  return system(command) == 0 ? 0 : -1;
}

static void path_in_dir(const char* name, char* out, size_t capacity) {
  snprintf(out, capacity, "%s/%s", g_dir, name);
}

// Builds a file image: 8-byte length, |header|, |data_length| bytes.
static uint8_t* image(const char* header, size_t data_length,
                      size_t* out_length) {
  size_t header_length = strlen(header);
  *out_length = 8 + header_length + data_length;
  uint8_t* bytes = calloc(1, *out_length + 1);
  for (int i = 0; i < 8; ++i) {
    bytes[i] = (uint8_t)((uint64_t)header_length >> (8 * i));
  }
  memcpy(bytes + 8, header, header_length);
  return bytes;
}

// Parses |header| + |data_length| zero bytes; returns the status code and
// checks that the message contains |needle|.
static pcp_status_code_t parse_code(const char* header, size_t data_length,
                                    const char* needle) {
  size_t length = 0;
  uint8_t* bytes = image(header, data_length, &length);
  pcp_safetensors_file_t* file = NULL;
  pcp_status_t status =
      pcp_safetensors_file_parse(bytes, length, pcp_allocator_system(), &file);
  pcp_status_code_t code = pcp_status_code(status);
  if (status) {
    assert_null(file);
    if (needle != NULL && strstr(pcp_status_message(status), needle) == NULL) {
      fail_msg("message '%s' lacks '%s'", pcp_status_message(status), needle);
    }
    pcp_status_ignore(status);
  }
  pcp_safetensors_file_release(file);
  free(bytes);
  return code;
}

static void test_round_trip(void** state) {
  (void)state;
  float f32[6] = {1, -2, 3.5f, 0, 1e-20f, -7};
  uint16_t bf16[3] = {0x3F80, 0xC000, 0x7FC0};
  int64_t i64[2] = {INT64_MIN, INT64_MAX};
  uint8_t flags[1] = {1};
  pcp_safetensors_tensor_t tensors[] = {
      {.name = "b",
       .element_type = PCP_ELEMENT_TYPE_BF16,
       .rank = 1,
       .dims = {3},
       .data = bf16,
       .byte_length = sizeof(bf16)},
      {.name = "a",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .dims = {2, 3},
       .data = f32,
       .byte_length = sizeof(f32)},
      {.name = "flag",
       .element_type = PCP_ELEMENT_TYPE_I1,
       .rank = 1,
       .dims = {1},
       .data = flags,
       .byte_length = 1},
      {.name = "i",
       .element_type = PCP_ELEMENT_TYPE_I64,
       .rank = 1,
       .dims = {2},
       .data = i64,
       .byte_length = sizeof(i64)},
      {.name = "none",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .dims = {4, 0},
       .data = NULL,
       .byte_length = 0},
  };
  const char* metadata[] = {"format", "pt"};
  char path[512];
  path_in_dir("rt.safetensors", path, sizeof(path));
  PCP_CHECK_OK(pcp_safetensors_write(path, tensors, 5, metadata, 1));
  pcp_safetensors_file_t* file = NULL;
  PCP_CHECK_OK(pcp_safetensors_file_open(path, pcp_allocator_system(), &file));
  assert_int_equal(pcp_safetensors_file_tensor_count(file), 5);
  assert_string_equal(pcp_safetensors_file_metadata(file, "format"), "pt");
  assert_null(pcp_safetensors_file_metadata(file, "other"));
  for (size_t i = 0; i < 5; ++i) {
    const pcp_safetensors_tensor_t* t =
        pcp_safetensors_file_find(file, tensors[i].name);
    assert_non_null(t);
    assert_int_equal(t->element_type, tensors[i].element_type);
    assert_int_equal(t->rank, tensors[i].rank);
    assert_memory_equal(t->dims, tensors[i].dims,
                        sizeof(int64_t) * (size_t)t->rank);
    assert_int_equal(t->byte_length, tensors[i].byte_length);
    if (t->byte_length > 0) {
      assert_memory_equal(t->data, tensors[i].data, t->byte_length);
    }
  }
  assert_null(pcp_safetensors_file_find(file, "missing"));
  pcp_safetensors_file_release(file);

  // The header is padded to 8 bytes, so the data region is 8-aligned.
  FILE* stream = fopen(path, "rb");
  uint8_t length_bytes[8];
  assert_int_equal(fread(length_bytes, 1, 8, stream), 8);
  fclose(stream);
  assert_int_equal(length_bytes[0] % 8, 0);

  // Writer errors name the tensor.
  pcp_safetensors_tensor_t bad = tensors[1];
  bad.byte_length = 20;
  pcp_status_t status = pcp_safetensors_write(path, &bad, 1, NULL, 0);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "'a'"));
  pcp_status_ignore(status);
  pcp_safetensors_tensor_t twice[2] = {tensors[1], tensors[1]};
  status = pcp_safetensors_write(path, twice, 2, NULL, 0);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
}

static void test_malformed_headers(void** state) {
  (void)state;
  const char* ok =
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
      "\"data_offsets\":[0,8]}}";
  assert_int_equal(parse_code(ok, 8, NULL), PCP_STATUS_OK);
  // Trailing spaces are the format's padding.
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
                              "\"data_offsets\":[0,8]}}     ",
                              8, NULL),
                   PCP_STATUS_OK);
  // Metadata only, no tensors.
  assert_int_equal(parse_code("{\"__metadata__\":{\"a\":\"b\"}}", 0, NULL),
                   PCP_STATUS_OK);

  // Truncated: fewer than 8 bytes.
  pcp_safetensors_file_t* file = NULL;
  pcp_status_t status = pcp_safetensors_file_parse(
      "\x10\x00\x00", 3, pcp_allocator_system(), &file);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "truncated"));
  pcp_status_ignore(status);
  // Header length beyond the file.
  size_t length = 0;
  uint8_t* bytes = image(ok, 8, &length);
  bytes[0] = 0xF0;
  status =
      pcp_safetensors_file_parse(bytes, length, pcp_allocator_system(), &file);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "past the end"));
  pcp_status_ignore(status);
  // A huge header length is refused before anything is allocated.
  memset(bytes, 0xFF, 8);
  status =
      pcp_safetensors_file_parse(bytes, length, pcp_allocator_null(), &file);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
  bytes[7] = 0;
  bytes[6] = 0;
  bytes[5] = 0;
  bytes[4] = 0;
  bytes[3] = 0x07;  // 0x07FFFFFF: 128 MiB - 1, over the cap
  status =
      pcp_safetensors_file_parse(bytes, length, pcp_allocator_null(), &file);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
  free(bytes);

  // Not JSON, not an object, duplicate keys.
  assert_int_equal(parse_code("{\"t\":", 0, "JSON"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("[1,2,3]", 0, "not a JSON object"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(
      parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,4]},\"t\":{\"dtype\":\"F32\","
                 "\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, NULL),
      PCP_STATUS_INVALID_ARGUMENT);
  // Overlapping offsets.
  assert_int_equal(
      parse_code("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                 "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                 "\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, "overlap"),
      PCP_STATUS_INVALID_ARGUMENT);
  // A gap, and bytes left over at the end.
  assert_int_equal(parse_code("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[4,8]}}",
                              8, "gap"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code(ok, 12, "cover 8 of the 12"),
                   PCP_STATUS_INVALID_ARGUMENT);
  // Offsets beyond the data region.
  assert_int_equal(parse_code(ok, 4, "outside"), PCP_STATUS_INVALID_ARGUMENT);
  // Unknown and unsupported dtypes.
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F33\",\"shape\":[2],"
                              "\"data_offsets\":[0,8]}}",
                              8, "unknown dtype 'F33'"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],"
                              "\"data_offsets\":[0,8]}}",
                              8, "F8_E4M3"),
                   PCP_STATUS_UNIMPLEMENTED);
  // Shape and size disagree.
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
                              "\"data_offsets\":[0,8]}}",
                              8, "'t'"),
                   PCP_STATUS_INVALID_ARGUMENT);
  // Shapes whose product overflows 64 bits.
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,"
                              "4294967296,16],\"data_offsets\":[0,8]}}",
                              8, "more than the file"),
                   PCP_STATUS_INVALID_ARGUMENT);
  // Negative and non-integer dims, bad offsets, extra fields, metadata.
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],"
                              "\"data_offsets\":[0,8]}}",
                              8, "shape[0]"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],"
                              "\"data_offsets\":[0,8]}}",
                              8, NULL),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
                              "\"data_offsets\":[8,0]}}",
                              8, NULL),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
                              "\"data_offsets\":[0,8],\"x\":1}}",
                              8, NULL),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(parse_code("{\"__metadata__\":{\"a\":1}}", 0, "metadata"),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(
      parse_code("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,"
                 "1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                 4, "rank"),
      PCP_STATUS_INVALID_ARGUMENT);

  // Opening: a missing file and an empty file.
  char path[512];
  path_in_dir("nope.safetensors", path, sizeof(path));
  status = pcp_safetensors_file_open(path, pcp_allocator_system(), &file);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_NOT_FOUND);
  path_in_dir("empty.safetensors", path, sizeof(path));
  FILE* stream = fopen(path, "wb");
  fclose(stream);
  status = pcp_safetensors_file_open(path, pcp_allocator_system(), &file);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
}

static void write_one(const char* name, const char* tensor, float value) {
  char path[512];
  path_in_dir(name, path, sizeof(path));
  pcp_safetensors_tensor_t t = {.name = tensor,
                                .element_type = PCP_ELEMENT_TYPE_F32,
                                .rank = 1,
                                .dims = {1},
                                .data = &value,
                                .byte_length = 4};
  PCP_CHECK_OK(pcp_safetensors_write(path, &t, 1, NULL, 0));
}

static void write_text(const char* name, const char* text) {
  char path[512];
  path_in_dir(name, path, sizeof(path));
  PCP_CHECK_OK(pcp_file_write_atomic(path, text, strlen(text)));
}

static void test_sharded_checkpoint(void** state) {
  (void)state;
  char path[512];
  path_in_dir("shards", path, sizeof(path));
  PCP_CHECK_OK(pcp_file_make_directories(path));
  write_one("shards/s1.safetensors", "x", 1.0f);
  write_one("shards/s2.safetensors", "y", 2.0f);
  write_text("shards/model.safetensors.index.json",
             "{\"metadata\":{},\"weight_map\":{\"x\":\"s1.safetensors\","
             "\"y\":\"s2.safetensors\"}}");
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  PCP_CHECK_OK(pcp_safetensors_checkpoint_open(path, pcp_allocator_system(),
                                               &checkpoint));
  assert_int_equal(pcp_safetensors_checkpoint_tensor_count(checkpoint), 2);
  const pcp_safetensors_tensor_t* y =
      pcp_safetensors_checkpoint_find(checkpoint, "y");
  assert_non_null(y);
  float value;
  memcpy(&value, y->data, 4);
  assert_true(value == 2.0f);
  pcp_safetensors_checkpoint_release(checkpoint);

  // An index naming a tensor its shard lacks.
  write_text("shards/model.safetensors.index.json",
             "{\"weight_map\":{\"x\":\"s1.safetensors\","
             "\"z\":\"s2.safetensors\"}}");
  pcp_status_t status = pcp_safetensors_checkpoint_open(
      path, pcp_allocator_system(), &checkpoint);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_NOT_FOUND);
  assert_non_null(strstr(pcp_status_message(status), "'z'"));
  pcp_status_ignore(status);
  // The same tensor in two shards.
  write_one("shards/s3.safetensors", "x", 3.0f);
  write_text("shards/model.safetensors.index.json",
             "{\"weight_map\":{\"x\":\"s1.safetensors\","
             "\"y\":\"s3.safetensors\"}}");
  status = pcp_safetensors_checkpoint_open(path, pcp_allocator_system(),
                                           &checkpoint);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
  // Shard names may not leave the directory.
  write_text("shards/model.safetensors.index.json",
             "{\"weight_map\":{\"x\":\"../rt.safetensors\"}}");
  status = pcp_safetensors_checkpoint_open(path, pcp_allocator_system(),
                                           &checkpoint);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
}

//===----------------------------------------------------------------------===//
// Qwen3 name mapping
//===----------------------------------------------------------------------===//

typedef struct model_t {
  pcp_models_spec_t spec;
  pcp_models_parameter_table_t table;
  void** buffers;
} model_t;

static void model_initialize(pcp_element_type_t dtype, bool tied, uint64_t seed,
                             model_t* out) {
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_QWEN3, &out->spec);
  out->spec.layers = 2;
  out->spec.width = 32;
  out->spec.heads = 4;
  out->spec.kv_heads = 2;
  out->spec.vocab = 50;
  out->spec.block_size = 8;
  out->spec.batch = 1;
  out->spec.dtype = dtype;
  out->spec.tie_embeddings = tied;
  PCP_CHECK_OK(pcp_models_parameter_table_initialize(
      &out->spec, pcp_allocator_system(), &out->table));
  out->buffers = calloc(out->table.count, sizeof(void*));
  for (size_t i = 0; i < out->table.count; ++i) {
    out->buffers[i] = calloc(1, out->table.parameters[i].byte_length);
  }
  if (seed != 0) {
    pcp_models_parameters_initialize(&out->table, seed, out->buffers);
  }
}

static void model_deinitialize(model_t* model) {
  for (size_t i = 0; i < model->table.count; ++i) {
    free(model->buffers[i]);
  }
  free(model->buffers);
  pcp_models_parameter_table_deinitialize(&model->table);
}

static pcp_status_t load_from(const char* path, model_t* model, bool tie) {
  pcp_safetensors_checkpoint_t* checkpoint = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_safetensors_checkpoint_open(
      path, pcp_allocator_system(), &checkpoint));
  pcp_status_t status = pcp_models_safetensors_load(&model->table, checkpoint,
                                                    tie, model->buffers);
  pcp_safetensors_checkpoint_release(checkpoint);
  return status;
}

static uint16_t to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static void test_qwen3_mapping(void** state) {
  (void)state;
  char path[512];
  path_in_dir("qwen3.safetensors", path, sizeof(path));
  // A bf16 checkpoint with the Hugging Face names of the f32 model,
  // loaded into the f32 table: values widen exactly.
  model_t source;
  model_initialize(PCP_ELEMENT_TYPE_BF16, false, 7, &source);
  assert_true(pcp_models_parameter_table_find(
                  &source.table, "model.layers.1.self_attn.q_norm.weight") >=
              0);
  PCP_CHECK_OK(pcp_models_safetensors_save(
      &source.table, (const void* const*)source.buffers, path));
  model_t f32;
  model_initialize(PCP_ELEMENT_TYPE_F32, false, 0, &f32);
  PCP_CHECK_OK(load_from(path, &f32, false));
  for (size_t i = 0; i < f32.table.count; ++i) {
    const uint16_t* src = source.buffers[i];
    const float* dst = f32.buffers[i];
    for (int64_t j = 0; j < f32.table.parameters[i].element_count; ++j) {
      uint32_t bits = (uint32_t)src[j] << 16;
      float expected;
      memcpy(&expected, &bits, 4);
      assert_true(dst[j] == expected);
    }
  }
  // And back: the f32 values narrowed to bf16 give the source bits.
  model_t bf16;
  model_initialize(PCP_ELEMENT_TYPE_BF16, false, 0, &bf16);
  char f32_path[512];
  path_in_dir("qwen3_f32.safetensors", f32_path, sizeof(f32_path));
  PCP_CHECK_OK(pcp_models_safetensors_save(
      &f32.table, (const void* const*)f32.buffers, f32_path));
  PCP_CHECK_OK(load_from(f32_path, &bf16, false));
  for (size_t i = 0; i < bf16.table.count; ++i) {
    assert_memory_equal(bf16.buffers[i], source.buffers[i],
                        bf16.table.parameters[i].byte_length);
  }
  // Rounding to nearest even on the way down.
  assert_int_equal(to_bf16(1.00390625f), 0x3F80);  // tie, even stays
  model_deinitialize(&bf16);

  // A tied model accepts (and ignores) lm_head.weight.
  model_t tied;
  model_initialize(PCP_ELEMENT_TYPE_F32, true, 0, &tied);
  assert_true(pcp_models_parameter_table_find(&tied.table, "lm_head.weight") <
              0);
  PCP_CHECK_OK(load_from(path, &tied, false));
  // An untied model loads a tied checkpoint (no lm_head.weight) only when
  // told tie_word_embeddings; lm_head then equals the embedding.
  char tied_path[512];
  path_in_dir("qwen3_tied.safetensors", tied_path, sizeof(tied_path));
  PCP_CHECK_OK(pcp_models_safetensors_save(
      &tied.table, (const void* const*)tied.buffers, tied_path));
  pcp_status_t status = load_from(tied_path, &f32, false);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_NOT_FOUND);
  assert_non_null(strstr(pcp_status_message(status), "'lm_head.weight'"));
  pcp_status_ignore(status);
  PCP_CHECK_OK(load_from(tied_path, &f32, true));
  int64_t embed =
      pcp_models_parameter_table_find(&f32.table, "model.embed_tokens.weight");
  int64_t head = pcp_models_parameter_table_find(&f32.table, "lm_head.weight");
  assert_memory_equal(f32.buffers[embed], f32.buffers[head],
                      f32.table.parameters[head].byte_length);
  model_deinitialize(&tied);

  // Wrong shape: a checkpoint of a wider model names the tensor and both
  // shapes.
  model_t wide;
  model_initialize(PCP_ELEMENT_TYPE_F32, false, 3, &wide);
  model_deinitialize(&wide);
  pcp_models_spec_t spec = f32.spec;
  spec.mlp_hidden = 64;
  pcp_models_parameter_table_t other;
  PCP_CHECK_OK(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &other));
  void** buffers = calloc(other.count, sizeof(void*));
  for (size_t i = 0; i < other.count; ++i) {
    buffers[i] = calloc(1, other.parameters[i].byte_length);
  }
  char other_path[512];
  path_in_dir("qwen3_other.safetensors", other_path, sizeof(other_path));
  PCP_CHECK_OK(pcp_models_safetensors_save(&other, (const void* const*)buffers,
                                           other_path));
  for (size_t i = 0; i < other.count; ++i) {
    free(buffers[i]);
  }
  free(buffers);
  pcp_models_parameter_table_deinitialize(&other);
  status = load_from(other_path, &f32, false);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(
      strstr(pcp_status_message(status), "'model.layers.0.mlp.gate_proj"));
  assert_non_null(strstr(pcp_status_message(status), "[64, 32]"));
  assert_non_null(strstr(pcp_status_message(status), "[96, 32]"));
  pcp_status_ignore(status);

  // Unexpected tensor; ignored rotary buffers; wrong dtype.
  const pcp_models_parameter_t* norm =
      &f32.table.parameters[f32.table.count - 2];
  assert_string_equal(norm->name, "model.norm.weight");
  size_t n = f32.table.count;
  pcp_safetensors_tensor_t* tensors = calloc(n + 2, sizeof(*tensors));
  for (size_t i = 0; i < n; ++i) {
    const pcp_models_parameter_t* p = &f32.table.parameters[i];
    tensors[i] = (pcp_safetensors_tensor_t){.name = p->name,
                                            .element_type = p->element_type,
                                            .rank = p->rank,
                                            .dims = {p->dims[0], p->dims[1]},
                                            .data = f32.buffers[i],
                                            .byte_length = p->byte_length};
  }
  float inv_freq[4] = {1, 2, 3, 4};
  tensors[n] = (pcp_safetensors_tensor_t){
      .name = "model.layers.0.self_attn.rotary_emb.inv_freq",
      .element_type = PCP_ELEMENT_TYPE_F32,
      .rank = 1,
      .dims = {4},
      .data = inv_freq,
      .byte_length = sizeof(inv_freq)};
  tensors[n + 1] =
      (pcp_safetensors_tensor_t){.name = "model.layers.9.mlp.up_proj.weight",
                                 .element_type = PCP_ELEMENT_TYPE_F32,
                                 .rank = 1,
                                 .dims = {4},
                                 .data = inv_freq,
                                 .byte_length = sizeof(inv_freq)};
  char extra_path[512];
  path_in_dir("qwen3_extra.safetensors", extra_path, sizeof(extra_path));
  PCP_CHECK_OK(pcp_safetensors_write(extra_path, tensors, n + 1, NULL, 0));
  PCP_CHECK_OK(load_from(extra_path, &f32, false));
  PCP_CHECK_OK(pcp_safetensors_write(extra_path, tensors, n + 2, NULL, 0));
  status = load_from(extra_path, &f32, false);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status),
                         "unexpected tensor 'model.layers.9.mlp.up_proj"));
  pcp_status_ignore(status);
  // An i32 tensor where a weight belongs.
  tensors[0].element_type = PCP_ELEMENT_TYPE_I32;
  PCP_CHECK_OK(pcp_safetensors_write(extra_path, tensors, n, NULL, 0));
  status = load_from(extra_path, &f32, false);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "dtype i32"));
  pcp_status_ignore(status);
  free(tensors);

  model_deinitialize(&f32);
  model_deinitialize(&source);
}

// OOM sweep (SQLite style): fail the Nth allocation of a parse and of a
// checkpoint open, for every N until one succeeds; each failure is
// RESOURCE_EXHAUSTED and nothing is left allocated.
static void test_oom_sweep(void** state) {
  (void)state;
  const char* header =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}";
  size_t length = 0;
  uint8_t* bytes = image(header, 12, &length);
  char path[512];
  path_in_dir("oom.safetensors", path, sizeof(path));
  PCP_CHECK_OK(pcp_file_write_atomic(path, bytes, length));
  for (int which = 0; which < 2; ++which) {
    bool succeeded = false;
    for (int64_t n = 0; n < 64 && !succeeded; ++n) {
      pcp_allocator_counting_t counting;
      pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
      pcp_allocator_failing_t failing;
      pcp_allocator_failing_initialize(pcp_allocator_counting(&counting), n,
                                       true, &failing);
      pcp_allocator_t allocator = pcp_allocator_failing(&failing);
      pcp_status_t status;
      if (which == 0) {
        pcp_safetensors_file_t* file = NULL;
        status = pcp_safetensors_file_parse(bytes, length, allocator, &file);
        pcp_safetensors_file_release(file);
      } else {
        pcp_safetensors_checkpoint_t* checkpoint = NULL;
        status = pcp_safetensors_checkpoint_open(path, allocator, &checkpoint);
        pcp_safetensors_checkpoint_release(checkpoint);
      }
      if (status) {
        assert_int_equal(pcp_status_consume_code(status),
                         PCP_STATUS_RESOURCE_EXHAUSTED);
        assert_true(failing.failure_count > 0);
      } else {
        succeeded = true;
      }
      assert_int_equal(counting.live_bytes, 0);
    }
    assert_true(succeeded);
  }
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_malformed_headers),
      cmocka_unit_test(test_sharded_checkpoint),
      cmocka_unit_test(test_qwen3_mapping),
      cmocka_unit_test(test_oom_sweep),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
