// SPDX-License-Identifier: Apache-2.0
//
// Private to src/workloads/infer: the model record that model_dir.c fills
// from a model directory and service.c serves.

#ifndef PCP_WORKLOADS_INFER_INFER_IMPL_H_
#define PCP_WORKLOADS_INFER_INFER_IMPL_H_

#include "models/models.h"
#include "proto/proto.h"
#include "tokenizer/tokenizer.h"
#include "workloads/workloads.h"

#define PCP_INFER_MAX_PATH 4096

typedef enum pcp_infer_tokenizer_kind_e {
  PCP_INFER_TOKENIZER_CHAR = 0,  // one id per character of a string
  PCP_INFER_TOKENIZER_BYTE = 1,  // id = byte value
  PCP_INFER_TOKENIZER_BPE = 2,   // a tokenizer.json
} pcp_infer_tokenizer_kind_t;

typedef enum pcp_infer_template_e {
  PCP_INFER_TEMPLATE_PLAIN = 0,  // contents joined by "\n"
  PCP_INFER_TEMPLATE_QWEN = 1,   // ChatML with the generation prompt
} pcp_infer_template_t;

// Immutable once loaded (read by handler and scheduler threads).
typedef struct pcp_infer_model_t {
  char name[PCP_INFER_MAX_MODEL_NAME + 1];
  char dir[PCP_INFER_MAX_PATH];
  char weights_path[PCP_INFER_MAX_PATH];
  char tokenizer_path[PCP_INFER_MAX_PATH];
  int64_t created_s;
  // model.json's identity when read: a rename or rewrite changes one of
  // them (mtime alone has one-second steps on some file systems).
  uint64_t json_inode;
  int64_t json_mtime_ns;
  int64_t json_size;
  // A training export's provenance ("job_id", "outer_step"; -1 when absent)
  // and the weights it committed to ("weights_bytes", "weights_sha256"):
  // when given, the weights file must match them or the load fails.
  char job_id[64];
  int64_t outer_step;
  // model.json's "worker_class": only workers that joined with this
  // --worker-class get a runner (and the probe); "" = every worker.
  char worker_class[PCP_SCHED_CLASS_NAME_MAX_LENGTH + 1];
  bool has_weights_sha256;
  pcp_sha256_t weights_sha256;
  int64_t weights_bytes;  // -1 when absent
  pcp_models_spec_t spec;
  pcp_models_generation_t gen;
  pcp_infer_tokenizer_kind_t tokenizer_kind;
  pcp_infer_template_t chat_template;
  // CHAR: character id i is char_text[char_offsets[i] .. char_offsets[i+1]).
  char* char_text;
  uint32_t* char_offsets;
  uint32_t char_count;
  pcp_tokenizer_t* bpe;
  int32_t eos_ids[PCP_STOP_MAX_EOS_IDS];
  size_t eos_count;
  char stop[4][PCP_STOP_MAX_SEQUENCE_BYTES + 1];
  size_t stop_count;
  // Weights in table order (64-byte aligned host copies) as @load inputs.
  bool table_initialized;
  pcp_models_parameter_table_t table;
  void** param_data;
  pcp_proto_section_t* param_sections;
  char (*param_names)[16];  // "p<i>": resident names on the worker
} pcp_infer_model_t;

// Reads <dir>/model.json into |m| (zeroed by the caller): INVALID_ARGUMENT
// naming the key. No weights yet.
PCP_MUST_USE_RESULT pcp_status_t
pcp_infer_model_json_load(const char* dir, pcp_infer_model_t* m);
// Loads the tokenizer and the weights (host copies). With a
// weights_sha256 in model.json the weights file is hashed first through
// an open descriptor, and the file the load maps must be that same inode
// (writers replace files by rename): FAILED_PRECONDITION when the bytes
// do not match or the file was replaced meanwhile (model.json names
// weights not written yet or already replaced; writers put model.json last,
// so the next model.json is the next chance).
PCP_MUST_USE_RESULT pcp_status_t
pcp_infer_model_weights_load(pcp_infer_model_t* m);
void pcp_infer_model_free(pcp_infer_model_t* m);

// The prompt ids of a request (chat template or plain text).
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_model_encode(
    const pcp_infer_model_t* m, const pcp_infer_request_params_t* params,
    pcp_tokenizer_id_list_t* ids);

//===----------------------------------------------------------------------===//
// Versions as jobs (service.c, for the kind in job.c)
//===----------------------------------------------------------------------===//

// "infer-" and 32 hex digits.
#define PCP_INFER_JOB_ID_MAX_LENGTH 38

// The job id of the version read from <dir>/model.json with that identity:
// "infer-" + the first 16 bytes of SHA-256 over them, in hex.
void pcp_infer_job_id_make(const char* dir, uint64_t inode, int64_t mtime_ns,
                           int64_t size,
                           char out[PCP_INFER_JOB_ID_MAX_LENGTH + 1]);

// The kind's run: follows the version whose job |job| is until it ends
// (the kind's header in infer.h). Returns when pcp_workloads_job_should_stop.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_service_job_run(
    pcp_infer_service_t* service, pcp_workloads_job_t* job);
// A client cancelled job |id|: its version stops serving (its runners
// finish what they hold and retire). A no-op for an unknown id.
void pcp_infer_service_job_cancel(pcp_infer_service_t* service, const char* id);
// Folds the live state of job |id|'s version (workers serving, version,
// the model's request stats) into |progress|. False when no version of
// this service has that job.
bool pcp_infer_service_job_progress(pcp_infer_service_t* service,
                                    const char* id, json_t* progress);

#endif  // PCP_WORKLOADS_INFER_INFER_IMPL_H_
