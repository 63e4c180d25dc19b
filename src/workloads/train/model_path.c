// SPDX-License-Identifier: Apache-2.0
//
// A forward-loss module given by the experiment key model_path (service.h,
// pcp_diloco_module_load): the training service trains any module with the
// contract of the built-ins,
//
//   @main(params..., input_ids: tensor<BxTxi32|i64>,
//         targets: tensor<BxTxi32|i64>) -> tensor<f32|bf16>
//
// such as tools/export_jax.py writes. The module's signature is all the
// service needs: the parameters' shapes and types become a parameter table
// (named "param_<i>": a StableHLO argument has no name), the data shape
// gives the micro batch B and the block size T the gateway samples, and the
// data element type says whether token ids go out as i32 or i64 (torch-mlir
// exports use i64). What the module computes is checked by the compile,
// which differentiates it in a child process.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlir/mlir.h"
#include "workloads/workloads.h"

// Upstream reads at most 10 MiB of forward MLIR; built-in modules of a few
// hundred million parameters are a few MiB of text (weights are arguments),
// so 64 MiB leaves room for exporters that inline large constants.
#define MAX_MODULE_BYTES ((size_t)64 << 20)

static bool is_float(pcp_element_type_t type) {
  return type == PCP_ELEMENT_TYPE_F32 || type == PCP_ELEMENT_TYPE_BF16;
}

static bool is_token_type(const pcp_mlir_type_t* type) {
  return type->kind == PCP_MLIR_TYPE_KIND_RANKED_TENSOR && type->rank == 2 &&
         (type->element_type == PCP_ELEMENT_TYPE_I32 ||
          type->element_type == PCP_ELEMENT_TYPE_I64);
}

// Checks @main against the contract and fills |out| from it.
static pcp_status_t module_describe(const pcp_mlir_function_signature_t* sig,
                                    pcp_element_type_t dtype,
                                    pcp_diloco_module_t* out) {
  if (sig->argument_count < 3) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model_path': @main takes %zu arguments; a "
                           "forward-loss module takes parameters, then "
                           "input_ids and targets",
                           sig->argument_count);
  }
  const pcp_mlir_type_t* loss = sig->result_count == 1 ? &sig->results[0] : 0;
  if (!loss || loss->kind != PCP_MLIR_TYPE_KIND_RANKED_TENSOR ||
      loss->rank != 0 || !is_float(loss->element_type)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model_path': @main must return one scalar "
                           "f32 or bf16 loss (it returns %zu results%s%s)",
                           sig->result_count, loss ? ": " : "",
                           loss ? loss->spelling : "");
  }
  size_t n = sig->argument_count - 2;
  const pcp_mlir_type_t* ids = &sig->arguments[n];
  const pcp_mlir_type_t* targets = &sig->arguments[n + 1];
  if (!is_token_type(ids) || !is_token_type(targets) ||
      ids->element_type != targets->element_type ||
      ids->dims[0] != targets->dims[0] || ids->dims[1] != targets->dims[1] ||
      ids->dims[0] < 1 || ids->dims[1] < 1 || ids->dims[0] > (1 << 24) ||
      ids->dims[1] > (1 << 24)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'model_path': the last two arguments of @main must be input_ids "
        "and targets of one static shape BxT (B and T at most 2^24) of i32 "
        "or i64 (got %s and %s)",
        ids->spelling, targets->spelling);
  }
  out->batch = ids->dims[0];
  out->block_size = ids->dims[1];
  out->data_type = ids->element_type;
  pcp_models_parameter_table_t* table = &out->table;
  table->allocator = pcp_allocator_system();
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(table->allocator,
                                                n * sizeof(*table->parameters),
                                                (void**)&table->parameters));
  for (size_t i = 0; i < n; ++i) {
    const pcp_mlir_type_t* a = &sig->arguments[i];
    if (a->kind != PCP_MLIR_TYPE_KIND_RANKED_TENSOR) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'model_path': parameter %zu of @main is "
                             "%s; parameters are ranked tensors",
                             i, a->spelling);
    }
    if (a->element_type != dtype) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "key 'dtype': the experiment trains %s but parameter %zu of @main "
          "is %s (give the module's parameter type)",
          pcp_element_type_name(dtype), i, a->spelling);
    }
    pcp_models_parameter_t* p = &table->parameters[i];
    snprintf(p->name, sizeof(p->name), "param_%zu", i);
    p->rank = a->rank;
    p->element_count = 1;
    for (int32_t d = 0; d < a->rank; ++d) {
      if (a->dims[d] < 1) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'model_path': parameter %zu of @main is "
                               "%s; parameters need static, non-empty shapes",
                               i, a->spelling);
      }
      p->dims[d] = a->dims[d];
      p->element_count *= a->dims[d];
      if (p->element_count > ((int64_t)1 << 40)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "key 'model_path': parameter %zu (%s) is too "
                               "large",
                               i, a->spelling);
      }
    }
    p->element_type = a->element_type;
    // Upstream's init for a foreign module: N(0, 0.02^2) for every tensor
    // (a module's arguments carry no role, so gains and biases too).
    p->init = PCP_MODELS_INIT_NORMAL;
    p->byte_length =
        (size_t)p->element_count * pcp_element_type_byte_size(p->element_type);
    table->total_elements += p->element_count;
    table->total_byte_length += p->byte_length;
    table->count = i + 1;
    if (table->total_elements > ((int64_t)1 << 40)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "key 'model_path': more than 2^40 parameters "
                             "by argument %zu",
                             i);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_module_load(const pcp_diloco_config_t* config,
                                    pcp_diloco_module_t* out_module) {
  memset(out_module, 0, sizeof(*out_module));
  if (!config->model_path || !config->model_path[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model_path': not given");
  }
  pcp_element_type_t dtype = PCP_ELEMENT_TYPE_F32;
  if (config->dtype == PCP_DILOCO_DTYPE_BF16) {
    dtype = PCP_ELEMENT_TYPE_BF16;
  } else if (config->dtype != PCP_DILOCO_DTYPE_F32) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'dtype': the training service trains f32 or "
                           "bf16 parameters");
  }
  void* text = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(config->model_path, MAX_MODULE_BYTES, &text, &length);
  if (status) {
    // Missing, unreadable or too large: the experiment's fault either way
    // (a 400 at submit, not a 404 for the job). The file's name only (the
    // gateway confines model_path first), never its size or content.
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    const char* why = code == PCP_STATUS_RESOURCE_EXHAUSTED ? "is too large"
                      : code == PCP_STATUS_NOT_FOUND
                          ? "does not exist"
                          : "cannot be read as a regular file";
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model_path': '%s' %s (modules of at most "
                           "%zu MiB)",
                           config->model_path, why, MAX_MODULE_BYTES >> 20);
  }
  out_module->text = text;
  out_module->length = length;
  pcp_mlir_function_signature_t sig;
  memset(&sig, 0, sizeof(sig));
  status = pcp_mlir_text_function_signature(text, length, config->model_path,
                                            NULL, pcp_allocator_system(), &sig);
  if (status) {
    // The parser's message quotes the text it stopped at; for a file that
    // is not a module at all (a password file named by mistake or on
    // purpose) that would echo the file, so the client gets a generic
    // message and the parser's detail stays out of the reply.
    pcp_status_ignore(status);
    pcp_diloco_module_deinitialize(out_module);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model_path': the file is not a StableHLO "
                           "text module with a @main function (iree-compile "
                           "shows where it stops parsing)");
  }
  status = module_describe(&sig, dtype, out_module);
  pcp_mlir_function_signature_deinitialize(&sig);
  if (status) {
    pcp_diloco_module_deinitialize(out_module);
  }
  return status;
}

void pcp_diloco_module_deinitialize(pcp_diloco_module_t* module) {
  // From pcp_file_read_all: the system allocator.
  pcp_allocator_free(pcp_allocator_system(), module->text);
  pcp_models_parameter_table_deinitialize(&module->table);
  memset(module, 0, sizeof(*module));
}
