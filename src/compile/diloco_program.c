// SPDX-License-Identifier: Apache-2.0
//
// @diloco_round: one DiLoCo worker round as one function, emitted next to
// @train_steps. Two forms, by options->inner_state (docs/autodiff.md
// "DiLoCo rounds"; docs/decisions.md "kept inner state"):
//
//   reset: @diloco_round(params..., lr: [tau] x f32, data (each [tau, ...])...)
//              -> (deltas..., losses: [tau] x loss type)
//   keep:  @diloco_round(params..., m..., v..., step: f32, lr: [tau] x f32,
//                        data...)
//              -> (deltas..., m'..., v'..., step + tau: f32, losses)
//
// (data [tau, A, ...] with gradient accumulation, accumulate.c). Moments are
// in the master element (f32 for bf16 parameters, pcp_autodiff_moment_type),
// as @train_steps takes them.
//
// reset: AdamW moments start at zero and the step number at 1 inside the
// function (a fresh inner optimizer every round, nothing survives on the
// worker: a joiner needs no set-up and the gateway's checkpoint alone
// resumes a run exactly). keep: the moments and the step number are the
// caller's, so a worker that keeps them resident continues its inner AdamW
// across rounds as the DiLoCo paper does, while the parameters still start
// from the global ones the caller passes in. Either way the fused
// @train_steps runs the tau inner steps (step i at rate lr[i]) and each
// delta is params_in - params_out (upstream's sign: a positive delta means
// "move down"), converted to the wire element type on the device so a bf16
// round sends half the bytes with no host pass.

#include <stdio.h>
#include <string.h>

#include "compile/autodiff_impl.h"

typedef pcp_autodiff_ref_t ref_t;
typedef pcp_autodiff_type_t type_t;

static ref_t arg_ref(const char* prefix, size_t index, const type_t* type) {
  ref_t ref;
  memset(&ref, 0, sizeof(ref));
  snprintf(ref.name, sizeof(ref.name), "%%%s%zu", prefix, index);
  ref.type = *type;
  return ref;
}

pcp_status_t pcp_compile_inner_state_parse(
    const char* name, pcp_compile_inner_state_t* out_state) {
  *out_state = PCP_COMPILE_INNER_STATE_RESET;
  if (name && strcmp(name, "reset") == 0) {
    return pcp_ok_status();
  }
  if (name && strcmp(name, "keep") == 0) {
    *out_state = PCP_COMPILE_INNER_STATE_KEEP;
    return pcp_ok_status();
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "inner state must be reset or keep, got '%s'",
                         name ? name : "(none)");
}

void pcp_autodiff_emit_diloco_round(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options) {
  size_t n = signature->param_count;
  size_t data_count = signature->argument_count - n;
  const type_t* types = signature->arguments;
  int64_t k = options->inner_steps;
  bool keep = options->inner_state == PCP_COMPILE_INNER_STATE_KEEP;
  const char* wire = options->delta_element && options->delta_element[0]
                         ? options->delta_element
                         : "f32";
  type_t f32 = pcp_autodiff_type_scalar("f32");
  type_t lr_type = f32;
  lr_type.rank = 1;
  lr_type.dims[0] = k;
  type_t losses_type = signature->loss;
  losses_type.rank = 1;
  losses_type.dims[0] = k;

  // refs: the function's arguments (params, m, v, step, lr, data: the
  // operands of the @train_steps call), @train_steps' results, and the
  // round's results.
  size_t call_count = 3 * n + 2 + data_count;
  size_t ref_count = call_count + (3 * n + 2) + (3 * n + 2);
  ref_t* refs = NULL;
  const type_t** result_types = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      e->out->allocator, ref_count * sizeof(ref_t), (void**)&refs);
  if (!status) {
    status =
        pcp_allocator_calloc(e->out->allocator, (3 * n + 2) * sizeof(type_t*),
                             (void**)&result_types);
  }
  if (status) {
    if (!e->status) {
      e->status = status;
    } else {
      pcp_status_ignore(status);
    }
    pcp_allocator_free(e->out->allocator, refs);
    return;
  }
  ref_t* call_args = refs;              // params, m, v, step, lr, data
  ref_t* run = call_args + call_count;  // @train_steps' results
  ref_t* results = run + (3 * n + 2);   // the round's results

  const char* groups[3] = {"p", "m", "s"};
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      type_t type = g ? pcp_autodiff_moment_type(&types[i]) : types[i];
      call_args[g * n + i] = arg_ref(groups[g], i, &type);
    }
  }
  call_args[3 * n] = arg_ref("step", 0, &f32);
  snprintf(call_args[3 * n].name, sizeof(call_args[3 * n].name), "%%step");
  call_args[3 * n + 1] = arg_ref("lr", 0, &lr_type);
  snprintf(call_args[3 * n + 1].name, sizeof(call_args[3 * n + 1].name),
           "%%lr");
  for (size_t d = 0; d < data_count; ++d) {
    type_t per_step = pcp_autodiff_step_data_type(e, signature, options, d);
    type_t stacked = pcp_autodiff_type_stacked(e, &per_step, k);
    call_args[3 * n + 2 + d] = arg_ref("d", d, &stacked);
  }

  // Signature: reset takes params, lr, data; keep also m, v and step.
  pcp_autodiff_emit_f(e, "  func.func @diloco_round(");
  if (keep) {
    pcp_autodiff_emit_arg_list(e, call_args, call_count);
  } else {
    pcp_autodiff_emit_arg_list(e, call_args, n);
    pcp_autodiff_emit_f(e, ", ");
    pcp_autodiff_emit_arg_list(e, call_args + 3 * n + 1, 1 + data_count);
  }
  pcp_autodiff_emit_f(e, ") -> (");
  for (size_t i = 0; i < n; ++i) {
    type_t delta = pcp_autodiff_type_with_element(&types[i], wire);
    pcp_autodiff_type_append(e, &delta);
    pcp_autodiff_emit_f(e, ", ");
  }
  if (keep) {
    pcp_autodiff_emit_type_list(e, call_args + n, 2 * n + 1);
    pcp_autodiff_emit_f(e, ", ");
  }
  pcp_autodiff_type_append(e, &losses_type);
  pcp_autodiff_emit_f(e, ") {\n");

  if (!keep) {
    // Zero moments (one splat per parameter shape) and step 1: the inner
    // optimizer starts afresh every round.
    for (size_t i = 0; i < n; ++i) {
      call_args[n + i] = pcp_autodiff_splat(e, 0.0, &call_args[n + i].type);
      call_args[2 * n + i] = call_args[n + i];
    }
    call_args[3 * n] = pcp_autodiff_splat(e, 1.0, &f32);
  }
  for (size_t j = 0; j < 3 * n + 2; ++j) {
    result_types[j] = j < 3 * n    ? &call_args[j].type
                      : j == 3 * n ? &f32
                                   : &losses_type;
  }
  pcp_autodiff_emit_call(e, "%run", "train_steps", call_args, call_count,
                         result_types, 3 * n + 2);
  for (size_t j = 0; j < 3 * n + 2; ++j) {
    run[j] = pcp_autodiff_call_result("%run", j, result_types[j]);
  }

  // delta = params_in - params_out, in the wire element type; keep adds
  // m', v' and the next step number; the losses last.
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    ref_t delta = pcp_autodiff_binary(e, "stablehlo.subtract",
                                      arg_ref("p", i, &types[i]), run[i]);
    results[count++] = pcp_autodiff_convert(e, delta, wire);
  }
  if (keep) {
    for (size_t j = n; j < 3 * n + 1; ++j) {
      results[count++] = run[j];
    }
  }
  results[count++] = run[3 * n + 1];
  pcp_autodiff_emit_f(e, "    \"func.return\"(");
  pcp_autodiff_emit_name_list(e, results, count);
  pcp_autodiff_emit_f(e, ") : (");
  pcp_autodiff_emit_type_list(e, results, count);
  pcp_autodiff_emit_f(e, ") -> ()\n  }\n");
  pcp_allocator_free(e->out->allocator, refs);
  pcp_allocator_free(e->out->allocator, result_types);
}
