// SPDX-License-Identifier: Apache-2.0
// Model directories: model.json, the tokenizer it names and the weights.
// Private to src/workloads/infer (infer_impl.h).

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "workloads/infer/infer_impl.h"

static pcp_status_t field_error(const char* dir, const char* key,
                                const char* rule) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "%s/model.json: key '%s' %s", dir, key, rule);
}

static pcp_status_t int_field(json_t* root, const char* dir, const char* key,
                              bool required, int64_t min, int64_t max,
                              int64_t* out) {
  json_t* v = json_object_get(root, key);
  if (!v) {
    return required ? field_error(dir, key, "is required") : pcp_ok_status();
  }
  if (!json_is_integer(v) || json_integer_value(v) < min ||
      json_integer_value(v) > max) {
    char rule[96];
    snprintf(rule, sizeof(rule), "must be an integer in [%lld, %lld]",
             (long long)min, (long long)max);
    return field_error(dir, key, rule);
  }
  *out = json_integer_value(v);
  return pcp_ok_status();
}

// Model ids are what clients send as "model": 1..128 bytes without control
// characters (a training job's name may hold spaces).
static bool name_valid(const char* name) {
  size_t n = strlen(name);
  if (n == 0 || n > PCP_INFER_MAX_MODEL_NAME) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c == 0x7f) {
      return false;
    }
  }
  return true;
}

// 64 hex digits (either case) into a digest.
static bool hex_digest_parse(const char* hex, pcp_sha256_t* out) {
  if (strlen(hex) != PCP_SHA256_HEX_LENGTH) {
    return false;
  }
  for (size_t i = 0; i < PCP_SHA256_BYTE_LENGTH; ++i) {
    unsigned value = 0;
    for (size_t k = 0; k < 2; ++k) {
      char c = hex[2 * i + k];
      unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                          : 16u;
      if (d > 15) {
        return false;
      }
      value = value * 16 + d;
    }
    out->bytes[i] = (uint8_t)value;
  }
  return true;
}

// Splits the char vocabulary into one UTF-8 character per id.
static pcp_status_t char_vocab_parse(const char* dir, const char* text,
                                     pcp_infer_model_t* m) {
  size_t n = strlen(text);
  m->char_count = 0;
  // The system allocator throughout: callers allocate the model itself with
  // calloc and pcp_infer_model_free releases it with everything it holds.
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(pcp_allocator_system(), (n + 2) * sizeof(uint32_t),
                           (void**)&m->char_offsets),
      "char vocab");
  PCP_RETURN_IF_ERROR(
      pcp_allocator_strdup(pcp_allocator_system(), text, &m->char_text),
      "char vocab");
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)text[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (i + len > n) {
      return field_error(dir, "tokenizer.vocab", "is not valid UTF-8");
    }
    m->char_offsets[m->char_count++] = (uint32_t)i;
    i += len;
  }
  m->char_offsets[m->char_count] = (uint32_t)n;
  if (m->char_count == 0) {
    return field_error(dir, "tokenizer.vocab", "must not be empty");
  }
  if ((int64_t)m->char_count > m->spec.vocab) {
    return field_error(dir, "tokenizer.vocab",
                       "has more characters than the model's vocab");
  }
  return pcp_ok_status();
}

pcp_status_t pcp_infer_model_json_load(const char* dir, pcp_infer_model_t* m) {
  char path[PCP_INFER_MAX_PATH];
  snprintf(path, sizeof(path), "%s/model.json", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    return pcp_status_from_errno(errno, "%s", path);
  }
  m->created_s = (int64_t)st.st_mtime;
  m->json_inode = (uint64_t)st.st_ino;
  m->json_mtime_ns =
      (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
  m->json_size = (int64_t)st.st_size;
  m->outer_step = -1;
  m->weights_bytes = -1;
  snprintf(m->dir, sizeof(m->dir), "%s", dir);
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(path, PCP_INFER_MAX_MODEL_JSON_BYTES, &data, &length));
  json_error_t error;
  json_t* root = json_loadb(data, length, 0, &error);
  pcp_allocator_free(pcp_allocator_system(), data);  // pcp_file_read_all
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: not a JSON object (line %d: %s)", path,
                           error.line, error.text);
  }
  pcp_status_t status = pcp_ok_status();
  json_t* name_value = json_object_get(root, "name");
  const char* name = json_string_value(name_value);
  const char* arch = json_string_value(json_object_get(root, "architecture"));
  char fallback[PCP_INFER_MAX_MODEL_NAME + 1];
  if (!name_value || (name && !name[0])) {
    // No name: the directory's own name.
    const char* base = strrchr(dir, '/');
    snprintf(fallback, sizeof(fallback), "%s", base ? base + 1 : dir);
    name = fallback;
  }
  if (!name || !name_valid(name)) {
    status = field_error(dir, "name",
                         "must be a string of 1..128 bytes without control "
                         "characters");
  } else {
    snprintf(m->name, sizeof(m->name), "%s", name);
  }
  // The parse's own status is dropped (consumed, not leaked): the field
  // error below names the key instead.
  if (!status &&
      (!arch || pcp_status_consume_code(pcp_models_architecture_parse(
                    arch, &m->spec.architecture)) != PCP_STATUS_OK)) {
    status = field_error(dir, "architecture", "must be gpt, nanochat or qwen3");
  }
  if (!status) {
    pcp_models_spec_initialize(m->spec.architecture, &m->spec);
    m->spec.batch = 1;
    m->spec.kv_heads = 0;
  }
  if (!status)
    status = int_field(root, dir, "layers", true, 1, PCP_MODELS_MAX_LAYERS,
                       &m->spec.layers);
  if (!status)
    status = int_field(root, dir, "heads", true, 1, PCP_MODELS_MAX_HEADS,
                       &m->spec.heads);
  if (!status)
    status = int_field(root, dir, "kv_heads", false, 0, PCP_MODELS_MAX_HEADS,
                       &m->spec.kv_heads);
  if (!status)
    status = int_field(root, dir, "width", true, 1, PCP_MODELS_MAX_WIDTH,
                       &m->spec.width);
  if (!status)
    status = int_field(root, dir, "head_dim", false, 0, PCP_MODELS_MAX_HEAD_DIM,
                       &m->spec.head_dim);
  if (!status)
    status = int_field(root, dir, "mlp_hidden", false, 0,
                       PCP_MODELS_MAX_MLP_HIDDEN, &m->spec.mlp_hidden);
  if (!status)
    status = int_field(root, dir, "vocab", true, 1, PCP_MODELS_MAX_VOCAB,
                       &m->spec.vocab);
  if (!status)
    status = int_field(root, dir, "block_size", true, 1,
                       PCP_MODELS_MAX_BLOCK_SIZE, &m->spec.block_size);
  if (!status) {
    json_t* tie = json_object_get(root, "tie_embeddings");
    m->spec.tie_embeddings = json_is_true(tie);
    json_t* theta = json_object_get(root, "rope_theta");
    if (json_is_number(theta)) {
      m->spec.rope_theta = json_number_value(theta);
    }
    const char* dtype = json_string_value(json_object_get(root, "dtype"));
    if (!dtype || strcmp(dtype, "f32") == 0) {
      m->spec.dtype = PCP_ELEMENT_TYPE_F32;
    } else if (strcmp(dtype, "bf16") == 0) {
      m->spec.dtype = PCP_ELEMENT_TYPE_BF16;
    } else {
      status = field_error(dir, "dtype", "must be f32 or bf16");
    }
  }
  if (!status) {
    status = pcp_models_spec_validate(&m->spec);
    if (status) {
      status = pcp_status_annotate_f(status, "%s/model.json", dir);
    }
  }
  // Serving shape: slots, context and prefill chunk.
  int64_t slots = PCP_INFER_DEFAULT_SLOTS;
  int64_t max_length = m->spec.block_size < 1024 ? m->spec.block_size : 1024;
  int64_t prefill = 0;
  if (!status)
    status =
        int_field(root, dir, "slots", false, 1, PCP_INFER_MAX_SLOTS, &slots);
  if (!status)
    status = int_field(root, dir, "max_length", false, 2, m->spec.block_size,
                       &max_length);
  if (!status)
    status =
        int_field(root, dir, "prefill_length", false, 1, max_length, &prefill);
  if (!status) {
    m->gen.slots = slots;
    m->gen.max_length = max_length;
    m->gen.prefill_length =
        prefill ? prefill : (max_length < 32 ? max_length : 32);
    status = pcp_models_generation_validate(&m->spec, &m->gen);
  }
  const char* weights = json_string_value(json_object_get(root, "weights"));
  if (!status) {
    if (weights && (strchr(weights, '/') || strstr(weights, ".."))) {
      status =
          field_error(dir, "weights", "must be a file name in the directory");
    } else {
      snprintf(m->weights_path, sizeof(m->weights_path), "%s/%s", dir,
               weights ? weights : "model.safetensors");
    }
  }
  // A training export's provenance and the weights it committed to.
  if (!status)
    status =
        int_field(root, dir, "outer_step", false, 0, INT64_MAX, &m->outer_step);
  if (!status)
    status = int_field(root, dir, "weights_bytes", false, 0, INT64_MAX,
                       &m->weights_bytes);
  if (!status) {
    json_t* job = json_object_get(root, "job_id");
    if (job && (!json_is_string(job) ||
                json_string_length(job) >= sizeof(m->job_id))) {
      status = field_error(dir, "job_id", "must be a string of < 64 bytes");
    } else if (job) {
      snprintf(m->job_id, sizeof(m->job_id), "%s", json_string_value(job));
    }
  }
  if (!status) {
    // The worker class that serves the model (docs/api.md): decode steps
    // then never queue behind another class's tasks (a training job's).
    json_t* wc = json_object_get(root, "worker_class");
    if (wc && (!json_is_string(wc) ||
               !pcp_sched_class_name_is_valid(json_string_value(wc)))) {
      status = field_error(dir, "worker_class",
                           "must be 1..63 bytes of [A-Za-z0-9._-]");
    } else if (wc) {
      snprintf(m->worker_class, sizeof(m->worker_class), "%s",
               json_string_value(wc));
    }
  }
  if (!status) {
    json_t* hash = json_object_get(root, "weights_sha256");
    if (hash) {
      const char* hex = json_string_value(hash);
      status = hex && hex_digest_parse(hex, &m->weights_sha256)
                   ? pcp_ok_status()
                   : field_error(dir, "weights_sha256",
                                 "must be 64 hexadecimal digits");
      m->has_weights_sha256 = !status;
    }
  }
  json_t* tok = json_object_get(root, "tokenizer");
  const char* kind = json_string_value(json_object_get(tok, "kind"));
  if (!status) {
    if (!kind) {
      status = field_error(dir, "tokenizer.kind", "must be char, byte or bpe");
    } else if (strcmp(kind, "char") == 0) {
      m->tokenizer_kind = PCP_INFER_TOKENIZER_CHAR;
      const char* vocab = json_string_value(json_object_get(tok, "vocab"));
      status = vocab ? char_vocab_parse(dir, vocab, m)
                     : field_error(dir, "tokenizer.vocab", "is required");
    } else if (strcmp(kind, "byte") == 0) {
      m->tokenizer_kind = PCP_INFER_TOKENIZER_BYTE;
      if (m->spec.vocab < 256) {
        status =
            field_error(dir, "vocab", "must be >= 256 for a byte tokenizer");
      }
    } else if (strcmp(kind, "bpe") == 0) {
      m->tokenizer_kind = PCP_INFER_TOKENIZER_BPE;
      const char* tpath = json_string_value(json_object_get(tok, "path"));
      if (!tpath || strchr(tpath, '/') || strstr(tpath, "..")) {
        status = field_error(dir, "tokenizer.path",
                             "must be a file name in the directory");
      } else {
        snprintf(m->tokenizer_path, sizeof(m->tokenizer_path), "%s/%s", dir,
                 tpath);
      }
    } else {
      status = field_error(dir, "tokenizer.kind", "must be char, byte or bpe");
    }
  }
  const char* tmpl = json_string_value(json_object_get(root, "chat_template"));
  if (!status) {
    if (!tmpl) {
      m->chat_template = m->tokenizer_kind == PCP_INFER_TOKENIZER_BPE
                             ? PCP_INFER_TEMPLATE_QWEN
                             : PCP_INFER_TEMPLATE_PLAIN;
    } else if (strcmp(tmpl, "qwen") == 0) {
      m->chat_template = PCP_INFER_TEMPLATE_QWEN;
    } else if (strcmp(tmpl, "plain") == 0) {
      m->chat_template = PCP_INFER_TEMPLATE_PLAIN;
    } else {
      status = field_error(dir, "chat_template", "must be qwen or plain");
    }
    if (!status && m->chat_template == PCP_INFER_TEMPLATE_QWEN &&
        m->tokenizer_kind != PCP_INFER_TOKENIZER_BPE) {
      status = field_error(dir, "chat_template",
                           "qwen needs a bpe tokenizer with <|im_start|>");
    }
  }
  json_t* eos = json_object_get(root, "eos_token_id");
  if (!status && eos) {
    if (json_is_integer(eos)) {
      m->eos_ids[m->eos_count++] = (int32_t)json_integer_value(eos);
    } else if (json_is_array(eos)) {
      size_t i;
      json_t* v;
      json_array_foreach(eos, i, v) {
        if (!json_is_integer(v) || m->eos_count >= PCP_STOP_MAX_EOS_IDS) {
          status = field_error(dir, "eos_token_id",
                               "must be an id or a list of at most 16 ids");
          break;
        }
        m->eos_ids[m->eos_count++] = (int32_t)json_integer_value(v);
      }
    } else {
      status = field_error(dir, "eos_token_id", "must be an id or a list");
    }
    for (size_t i = 0; !status && i < m->eos_count; ++i) {
      if (m->eos_ids[i] < 0 || m->eos_ids[i] >= m->spec.vocab) {
        status = field_error(dir, "eos_token_id", "is outside the vocab");
      }
    }
  }
  json_t* stop = json_object_get(root, "stop");
  if (!status && stop) {
    size_t i;
    json_t* v;
    if (!json_is_array(stop) || json_array_size(stop) > 4) {
      status = field_error(dir, "stop", "must be a list of at most 4 strings");
    }
    json_array_foreach(stop, i, v) {
      if (status)
        break;
      const char* s = json_string_value(v);
      if (!s || !s[0] || strlen(s) > PCP_STOP_MAX_SEQUENCE_BYTES) {
        status = field_error(dir, "stop", "holds an empty or long string");
        break;
      }
      snprintf(m->stop[m->stop_count++], sizeof(m->stop[0]), "%s", s);
    }
  }
  json_decref(root);
  return status;
}

pcp_status_t pcp_infer_model_weights_load(pcp_infer_model_t* m) {
  if (m->tokenizer_kind == PCP_INFER_TOKENIZER_BPE) {
    PCP_RETURN_IF_ERROR(
        pcp_tokenizer_create_from_file(m->tokenizer_path, NULL,
                                       pcp_allocator_system(), &m->bpe),
        "%s", m->tokenizer_path);
    if (pcp_tokenizer_vocab_size(m->bpe) > (uint32_t)m->spec.vocab) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "%s: tokenizer has %u ids, the model %lld", m->tokenizer_path,
          pcp_tokenizer_vocab_size(m->bpe), (long long)m->spec.vocab);
    }
    // Qwen's end-of-turn and end-of-text tokens stop a generation unless
    // model.json names its own.
    if (m->eos_count == 0) {
      static const char* const kEos[] = {"<|im_end|>", "<|endoftext|>"};
      for (size_t i = 0; i < PCP_ARRAYSIZE(kEos); ++i) {
        int32_t id = -1;
        if (pcp_tokenizer_token_to_id(m->bpe, pcp_make_cstring_view(kEos[i]),
                                      &id) &&
            id < m->spec.vocab) {
          m->eos_ids[m->eos_count++] = id;
        }
      }
    }
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_models_parameter_table_initialize(
      &m->spec, pcp_allocator_system(), &m->table));
  m->table_initialized = true;
  size_t n = m->table.count;
  // A step names every parameter, ids, positions, lengths and both caches.
  if (n + 5 > PCP_PROTO_MAX_TASK_TENSORS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s/model.json: %zu parameters; a worker task "
                           "takes at most %u tensors",
                           m->dir, n, PCP_PROTO_MAX_TASK_TENSORS - 5);
  }
  pcp_allocator_t allocator = pcp_allocator_system();
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, n * sizeof(void*),
                                           (void**)&m->param_data),
                      "weights");
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, n * sizeof(pcp_proto_section_t),
                           (void**)&m->param_sections),
      "weights");
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, n * sizeof(*m->param_names),
                           (void**)&m->param_names),
      "weights");
  for (size_t i = 0; i < n; ++i) {
    const pcp_models_parameter_t* p = &m->table.parameters[i];
    // 64-byte aligned: the fabric writes sections straight from here.
    if (posix_memalign(&m->param_data[i], 64,
                       p->byte_length ? p->byte_length : 1) != 0) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "weights");
    }
    snprintf(m->param_names[i], sizeof(m->param_names[i]), "p%u",
             (unsigned)(i % 100000000u));
  }
  // The weights model.json committed to: hashed through |pin|, which keeps
  // that inode alive; the file mapped below must be the same inode.
  int pin = -1;
  struct stat pinned;
  if (m->has_weights_sha256) {
    pin = open(m->weights_path, O_RDONLY | O_CLOEXEC);
    if (pin < 0 || fstat(pin, &pinned) != 0) {
      int err = errno;
      if (pin >= 0)
        close(pin);
      return pcp_status_from_errno(err, "%s", m->weights_path);
    }
    pcp_sha256_t digest;
    uint64_t length = 0;
    pcp_status_t hashed = pcp_file_sha256_fd(pin, &digest, &length);
    if (!hashed &&
        (memcmp(digest.bytes, m->weights_sha256.bytes, sizeof(digest.bytes)) !=
             0 ||
         (m->weights_bytes >= 0 && length != (uint64_t)m->weights_bytes))) {
      char hex[PCP_SHA256_HEX_LENGTH + 1];
      pcp_sha256_to_hex(&digest, hex);
      hashed = pcp_make_status(
          PCP_STATUS_FAILED_PRECONDITION,
          "%s (%llu bytes, sha256 %.16s...) is not the file model.json "
          "commits to: the directory is being rewritten; the next "
          "model.json is loaded when it lands",
          m->weights_path, (unsigned long long)length, hex);
    }
    if (hashed) {
      close(pin);
      return hashed;
    }
  }
  pcp_safetensors_checkpoint_t* ckpt = NULL;
  pcp_status_t status = pcp_safetensors_checkpoint_open(
      m->weights_path, pcp_allocator_system(), &ckpt);
  struct stat now;
  if (!status && pin >= 0 &&
      (stat(m->weights_path, &now) != 0 || now.st_ino != pinned.st_ino ||
       now.st_dev != pinned.st_dev)) {
    status =
        pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                        "%s was replaced while it was loaded", m->weights_path);
  }
  if (pin >= 0) {
    close(pin);
  }
  if (!status) {
    status = pcp_models_safetensors_load(&m->table, ckpt,
                                         m->spec.tie_embeddings, m->param_data);
  }
  pcp_safetensors_checkpoint_release(ckpt);
  PCP_RETURN_IF_ERROR(status, "%s", m->weights_path);
  for (size_t i = 0; i < n; ++i) {
    const pcp_models_parameter_t* p = &m->table.parameters[i];
    pcp_proto_section_t* s = &m->param_sections[i];
    s->name = m->param_names[i];
    s->element_type = p->element_type;
    s->rank = (uint32_t)p->rank;
    s->shape[0] = p->dims[0];
    s->shape[1] = p->dims[1];
    s->byte_length = p->byte_length;
    s->data = m->param_data[i];
  }
  return pcp_ok_status();
}

void pcp_infer_model_free(pcp_infer_model_t* m) {
  if (!m) {
    return;
  }
  if (m->table_initialized) {
    for (size_t i = 0; m->param_data && i < m->table.count; ++i) {
      pcp_libc_free(m->param_data[i]);  // posix_memalign
    }
    pcp_models_parameter_table_deinitialize(&m->table);
  }
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_allocator_free(allocator, m->param_data);
  pcp_allocator_free(allocator, m->param_sections);
  pcp_allocator_free(allocator, m->param_names);
  pcp_allocator_free(allocator, m->char_offsets);
  pcp_allocator_free(allocator, m->char_text);
  pcp_tokenizer_release(m->bpe);
  pcp_allocator_free(allocator, m);  // the caller's calloc'd model
}

//===----------------------------------------------------------------------===//
// Tokens
//===----------------------------------------------------------------------===//

// Appends the ids of |text| (char: one id per character; byte: one per
// byte; bpe: the tokenizer).
static pcp_status_t encode_text(const pcp_infer_model_t* m,
                                pcp_tokenizer_encoder_t* encoder,
                                pcp_string_view_t text, const char* param,
                                pcp_tokenizer_id_list_t* ids) {
  switch (m->tokenizer_kind) {
    case PCP_INFER_TOKENIZER_BYTE:
      for (size_t i = 0; i < text.size; ++i) {
        PCP_RETURN_IF_ERROR_BARE(pcp_tokenizer_id_list_append(
            ids, (int32_t)(unsigned char)text.data[i]));
      }
      return pcp_ok_status();
    case PCP_INFER_TOKENIZER_CHAR: {
      size_t i = 0;
      while (i < text.size) {
        unsigned char c = (unsigned char)text.data[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        if (i + len > text.size) {
          len = text.size - i;
        }
        int32_t found = -1;
        for (uint32_t id = 0; id < m->char_count && found < 0; ++id) {
          uint32_t o = m->char_offsets[id];
          if (m->char_offsets[id + 1] - o == len &&
              memcmp(m->char_text + o, text.data + i, len) == 0) {
            found = (int32_t)id;
          }
        }
        if (found < 0) {
          return pcp_make_status(
              PCP_STATUS_INVALID_ARGUMENT,
              "%s: the character '%.*s' (byte offset %zu) is not in the "
              "vocabulary of model %s",
              param, (int)len, text.data + i, i, m->name);
        }
        PCP_RETURN_IF_ERROR_BARE(pcp_tokenizer_id_list_append(ids, found));
        i += len;
      }
      return pcp_ok_status();
    }
    case PCP_INFER_TOKENIZER_BPE:
      return pcp_tokenizer_encoder_encode(encoder, text, ids);
  }
  return pcp_make_status(PCP_STATUS_INTERNAL, "tokenizer kind");
}

pcp_status_t pcp_infer_model_encode(const pcp_infer_model_t* m,
                                    const pcp_infer_request_params_t* params,
                                    pcp_tokenizer_id_list_t* ids) {
  pcp_tokenizer_encoder_t* encoder = NULL;
  if (m->tokenizer_kind == PCP_INFER_TOKENIZER_BPE) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_tokenizer_encoder_create(m->bpe, pcp_allocator_system(), &encoder));
  }
  pcp_status_t status = pcp_ok_status();
  if (!params->chat) {
    status = encode_text(m, encoder, params->prompt, "prompt", ids);
  } else if (m->chat_template == PCP_INFER_TEMPLATE_QWEN) {
    pcp_tokenizer_chat_message_t* messages = NULL;
    status = pcp_allocator_calloc(
        pcp_allocator_system(),
        (params->message_count ? params->message_count : 1) * sizeof(*messages),
        (void**)&messages);
    if (status) {
      status = pcp_status_annotate_f(status, "messages");
    }
    for (size_t i = 0; !status && i < params->message_count; ++i) {
      if (!pcp_tokenizer_chat_role_parse(params->messages[i].role,
                                         &messages[i].role)) {
        status = pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "messages[%zu].role: must be system, user or assistant", i);
      }
      messages[i].content = params->messages[i].content;
    }
    if (!status) {
      pcp_tokenizer_chat_options_t options = {.add_generation_prompt = true};
      status = pcp_tokenizer_chat_encode(encoder, messages,
                                         params->message_count, &options, ids);
    }
    pcp_allocator_free(pcp_allocator_system(), messages);
  } else {
    // "plain": the contents joined by newlines, no role markers (char and
    // byte models trained on raw text).
    for (size_t i = 0; !status && i < params->message_count; ++i) {
      pcp_tokenizer_chat_role_t role;
      if (!pcp_tokenizer_chat_role_parse(params->messages[i].role, &role)) {
        status = pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "messages[%zu].role: must be system, user or assistant", i);
        break;
      }
      if (i > 0) {
        status = encode_text(m, encoder, pcp_make_cstring_view("\n"),
                             "messages", ids);
      }
      if (!status) {
        char param[48];
        snprintf(param, sizeof(param), "messages[%zu].content", i);
        status =
            encode_text(m, encoder, params->messages[i].content, param, ids);
      }
    }
  }
  pcp_tokenizer_encoder_release(encoder);
  return status;
}
