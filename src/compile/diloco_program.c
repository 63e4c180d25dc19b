// SPDX-License-Identifier: Apache-2.0
//
// @diloco_round: one DiLoCo worker round as one function, emitted next to
// @train_steps (docs/decisions.md "stateless DiLoCo rounds"):
//
//   @diloco_round(params..., lr: [tau] x f32, data (each [tau, ...])...)
//       -> (deltas..., losses: [tau] x loss type)
//
// (data [tau, A, ...] with gradient accumulation, accumulate.c). The zero
// moments are in the master element (f32 for bf16 parameters), as
// @train_steps takes them.
//
// AdamW moments start at zero and the step number at 1 inside the function
// (a fresh inner optimizer every round), the fused @train_steps runs the tau
// inner steps, and each delta is params_in - params_out (upstream's sign:
// a positive delta means "move down"), converted to the wire element type on
// the device so a bf16 round sends half the bytes with no host pass. Nothing
// survives on the worker between rounds: a joiner needs no set-up and the
// gateway's checkpoint alone resumes a run exactly.

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

// Data argument |d| as @train_steps takes it: [K, ...] or, with gradient
// accumulation, [K, A, ...].
static type_t stacked_type(pcp_autodiff_emitter_t* e,
                           const pcp_autodiff_training_signature_t* signature,
                           const pcp_compile_training_options_t* options,
                           size_t d) {
  type_t per_step = pcp_autodiff_step_data_type(e, signature, options, d);
  return pcp_autodiff_type_stacked(e, &per_step, options->inner_steps);
}

void pcp_autodiff_emit_diloco_round(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options) {
  size_t n = signature->param_count;
  size_t data_count = signature->argument_count - n;
  const type_t* types = signature->arguments;
  int64_t k = options->inner_steps;
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

  pcp_autodiff_emit_f(e, "  func.func @diloco_round(");
  for (size_t i = 0; i < n; ++i) {
    pcp_autodiff_emit_f(e, "%%p%zu: ", i);
    pcp_autodiff_type_append(e, &types[i]);
    pcp_autodiff_emit_f(e, ", ");
  }
  pcp_autodiff_emit_f(e, "%%lr: ");
  pcp_autodiff_type_append(e, &lr_type);
  for (size_t d = 0; d < data_count; ++d) {
    type_t stacked = stacked_type(e, signature, options, d);
    pcp_autodiff_emit_f(e, ", %%d%zu: ", d);
    pcp_autodiff_type_append(e, &stacked);
  }
  pcp_autodiff_emit_f(e, ") -> (");
  for (size_t i = 0; i < n; ++i) {
    type_t delta = pcp_autodiff_type_with_element(&types[i], wire);
    pcp_autodiff_type_append(e, &delta);
    pcp_autodiff_emit_f(e, ", ");
  }
  pcp_autodiff_type_append(e, &losses_type);
  pcp_autodiff_emit_f(e, ") {\n");

  // Zero moments (one splat per parameter shape) and step 1: the inner
  // optimizer starts afresh every round.
  ref_t* zeros = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      pcp_allocator_system(), (n + 1) * sizeof(ref_t), (void**)&zeros);
  if (status) {
    if (!e->status) {
      e->status = status;
    } else {
      pcp_status_ignore(status);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    type_t moment = pcp_autodiff_moment_type(&types[i]);
    zeros[i] = pcp_autodiff_splat(e, 0.0, &moment);
  }
  ref_t step = pcp_autodiff_splat(e, 1.0, &f32);
  pcp_autodiff_emit_f(e, "    %%run:%zu = \"func.call\"(", 3 * n + 2);
  for (size_t i = 0; i < n; ++i) {
    pcp_autodiff_emit_f(e, "%%p%zu, ", i);
  }
  for (int g = 0; g < 2; ++g) {
    for (size_t i = 0; i < n; ++i) {
      pcp_autodiff_emit_f(e, "%s, ", zeros[i].name);
    }
  }
  pcp_autodiff_emit_f(e, "%s, %%lr", step.name);
  for (size_t d = 0; d < data_count; ++d) {
    pcp_autodiff_emit_f(e, ", %%d%zu", d);
  }
  pcp_autodiff_emit_f(e, ") {callee = @train_steps} : (");
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      type_t state = g ? pcp_autodiff_moment_type(&types[i]) : types[i];
      pcp_autodiff_type_append(e, &state);
      pcp_autodiff_emit_f(e, ", ");
    }
  }
  pcp_autodiff_emit_f(e, "tensor<f32>, ");
  pcp_autodiff_type_append(e, &lr_type);
  for (size_t d = 0; d < data_count; ++d) {
    type_t stacked = stacked_type(e, signature, options, d);
    pcp_autodiff_emit_f(e, ", ");
    pcp_autodiff_type_append(e, &stacked);
  }
  pcp_autodiff_emit_f(e, ") -> (");
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < n; ++i) {
      type_t state = g ? pcp_autodiff_moment_type(&types[i]) : types[i];
      pcp_autodiff_type_append(e, &state);
      pcp_autodiff_emit_f(e, ", ");
    }
  }
  pcp_autodiff_emit_f(e, "tensor<f32>, ");
  pcp_autodiff_type_append(e, &losses_type);
  pcp_autodiff_emit_f(e, ")\n");

  // delta = params_in - params_out, in the wire element type.
  for (size_t i = 0; i < n; ++i) {
    ref_t out;
    memset(&out, 0, sizeof(out));
    snprintf(out.name, sizeof(out.name), "%%run#%zu", i);
    out.type = types[i];
    ref_t delta = pcp_autodiff_binary(e, "stablehlo.subtract",
                                      arg_ref("p", i, &types[i]), out);
    zeros[i] = pcp_autodiff_convert(e, delta, wire);
  }
  pcp_autodiff_emit_f(e, "    \"func.return\"(");
  for (size_t i = 0; i < n; ++i) {
    pcp_autodiff_emit_f(e, "%s, ", zeros[i].name);
  }
  pcp_autodiff_emit_f(e, "%%run#%zu) : (", 3 * n + 1);
  for (size_t i = 0; i < n; ++i) {
    pcp_autodiff_type_append(e, &zeros[i].type);
    pcp_autodiff_emit_f(e, ", ");
  }
  pcp_autodiff_type_append(e, &losses_type);
  pcp_autodiff_emit_f(e, ") -> ()\n  }\n");
  pcp_allocator_free(pcp_allocator_system(), zeros);
}
