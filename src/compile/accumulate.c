// SPDX-License-Identifier: Apache-2.0
//
// Gradient accumulation: @compute_gradients_accumulated, emitted next to
// @compute_gradients when options->accumulation_steps A > 1, and the
// per-step data shape the fused programs use with it.
//
//   @compute_gradients_accumulated(params..., data (each [A, ...])...)
//       -> (loss, grads...)          (the same results as @compute_gradients)
//
// One optimizer step then sees A micro-batches of the forward's batch B: a
// stablehlo.while over a in [0, A) takes slice a of each data argument
// (dynamic_slice, as @train_steps does for its K steps), calls
// @compute_gradients, and adds the loss and the gradients into sums kept in
// the master element (f32 for bf16/f16/f32, f64 for f64: a bf16 running sum
// would drop the later micro-batches' low bits). After the loop both are
// multiplied by 1/A and converted back to the loss and parameter types, so
// the result is the mean over the A micro-batches: for a loss that is a
// mean over its batch, exactly the loss and gradient of one batch of A x B
// rows (upstream's in-graph variant, reference upstream-workloads.md s.1.1;
// the B x A rows never need to be live at once, which is the point).
//
// @train_steps and @diloco_round then take data [K, A, ...] and call this
// function once per step (optimizer.c, diloco_program.c).

#include <stdio.h>
#include <string.h>

#include "compile/autodiff_impl.h"

typedef pcp_autodiff_ref_t ref_t;
typedef pcp_autodiff_type_t type_t;

static bool accumulates(const pcp_compile_training_options_t* options) {
  return options->accumulation_steps > 1;
}

type_t pcp_autodiff_step_data_type(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options, size_t data_index) {
  const type_t* type =
      &signature->arguments[signature->param_count + data_index];
  if (!accumulates(options)) {
    return *type;
  }
  return pcp_autodiff_type_stacked(e, type, options->accumulation_steps);
}

const char* pcp_autodiff_step_gradient_function(
    const pcp_compile_training_options_t* options) {
  return accumulates(options) ? "compute_gradients_accumulated"
                              : "compute_gradients";
}

static ref_t named(const char* name, const type_t* type) {
  ref_t ref;
  memset(&ref, 0, sizeof(ref));
  snprintf(ref.name, sizeof(ref.name), "%s", name);
  ref.type = *type;
  return ref;
}

void pcp_autodiff_emit_gradients_accumulated(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options) {
  if (!accumulates(options) || e->status) {
    return;
  }
  size_t n = signature->param_count;
  size_t argument_count = signature->argument_count;
  size_t data_count = argument_count - n;
  const type_t* types = signature->arguments;
  int64_t steps = options->accumulation_steps;
  type_t i64 = pcp_autodiff_type_scalar("i64");
  type_t loss_sum_type = pcp_autodiff_type_with_element(
      &signature->loss, pcp_autodiff_master_element(signature->loss.element));
  // Loop carries: the micro-batch index, the loss sum, the gradient sums.
  size_t carried = 2 + n;
  // init, cond block args, body block args, body results (carried each);
  // the function's arguments; call operands; call result types.
  size_t ref_count = 4 * carried + 2 * argument_count;
  ref_t* refs = NULL;
  const type_t** result_types = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      e->out->allocator, ref_count * sizeof(ref_t), (void**)&refs);
  if (!status) {
    status = pcp_allocator_calloc(e->out->allocator, (n + 1) * sizeof(type_t*),
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
  ref_t* init = refs;
  ref_t* cond_args = init + carried;
  ref_t* body_args = cond_args + carried;
  ref_t* next = body_args + carried;
  ref_t* args = next + carried;  // params..., data [A, ...]...
  ref_t* call_args = args + argument_count;

  for (size_t j = 0; j < n; ++j) {
    char name[32];
    snprintf(name, sizeof(name), "%%p%zu", j);
    args[j] = named(name, &types[j]);
  }
  for (size_t d = 0; d < data_count; ++d) {
    char name[32];
    snprintf(name, sizeof(name), "%%d%zu", d);
    type_t stacked = pcp_autodiff_step_data_type(e, signature, options, d);
    args[n + d] = named(name, &stacked);
  }
  pcp_autodiff_emit_f(e, "  func.func @compute_gradients_accumulated(");
  pcp_autodiff_emit_arg_list(e, args, argument_count);
  pcp_autodiff_emit_f(e, ") -> (");
  pcp_autodiff_type_append(e, &signature->loss);
  for (size_t j = 0; j < n; ++j) {
    pcp_autodiff_emit_f(e, ", ");
    pcp_autodiff_type_append(e, &types[j]);
  }
  pcp_autodiff_emit_f(e, ") {\n");

  init[0] = pcp_autodiff_splat(e, 0.0, &i64);
  init[1] = pcp_autodiff_splat(e, 0.0, &loss_sum_type);
  for (size_t j = 0; j < n; ++j) {
    type_t sum_type = pcp_autodiff_moment_type(&types[j]);
    init[2 + j] = pcp_autodiff_splat(e, 0.0, &sum_type);
  }
  ref_t count = pcp_autodiff_splat(e, (double)steps, &i64);
  ref_t zero_index = pcp_autodiff_splat(e, 0.0, &i64);
  ref_t one_index = pcp_autodiff_splat(e, 1.0, &i64);
  pcp_autodiff_while_begin(e, "acc", init, carried, count, "ac", "ab",
                           cond_args, body_args);
  ref_t a = body_args[0];
  // Micro-batch a: the parameters as they are, slice a of each data
  // argument.
  for (size_t j = 0; j < n; ++j) {
    call_args[j] = args[j];
  }
  for (size_t d = 0; d < data_count; ++d) {
    call_args[n + d] = pcp_autodiff_index_leading(e, args[n + d], a, zero_index,
                                                  &types[n + d]);
  }
  result_types[0] = &signature->loss;
  for (size_t j = 0; j < n; ++j) {
    result_types[1 + j] = &types[j];
  }
  pcp_autodiff_emit_call(e, "%micro", "compute_gradients", call_args,
                         argument_count, result_types, n + 1);
  next[0] = pcp_autodiff_binary(e, "stablehlo.add", a, one_index);
  for (size_t c = 1; c < carried; ++c) {
    const type_t* type = c == 1 ? &signature->loss : &types[c - 2];
    ref_t value =
        pcp_autodiff_convert(e, pcp_autodiff_call_result("%micro", c - 1, type),
                             body_args[c].type.element);
    next[c] = pcp_autodiff_binary(e, "stablehlo.add", body_args[c], value);
  }
  pcp_autodiff_while_end(e, next, init, carried);

  // The means: sum x 1/A in the master element, then the caller's types.
  // (1/A is exact for A a power of two; otherwise within half an ulp.)
  double inverse = 1.0 / (double)steps;
  for (size_t c = 1; c < carried; ++c) {
    const type_t* type = c == 1 ? &signature->loss : &types[c - 2];
    ref_t sum = pcp_autodiff_call_result("%acc", c, &init[c].type);
    ref_t mean =
        pcp_autodiff_binary(e, "stablehlo.multiply", sum,
                            pcp_autodiff_splat(e, inverse, &init[c].type));
    next[c] = pcp_autodiff_convert(e, mean, type->element);
  }
  pcp_autodiff_emit_f(e, "    \"func.return\"(");
  pcp_autodiff_emit_name_list(e, next + 1, carried - 1);
  pcp_autodiff_emit_f(e, ") : (");
  pcp_autodiff_emit_type_list(e, next + 1, carried - 1);
  pcp_autodiff_emit_f(e, ") -> ()\n  }\n");
  pcp_allocator_free(e->out->allocator, refs);
  pcp_allocator_free(e->out->allocator, result_types);
}
