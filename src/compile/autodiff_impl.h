// SPDX-License-Identifier: Apache-2.0
//
// Private to src/compile: the StableHLO text emitter shared by the autodiff
// (autodiff.c) and the optimizer and fused-step builders (optimizer.c).
//
// Everything is emitted in MLIR's generic op form ("stablehlo.add"(%a, %b)
// : (...) -> ...), which the parser reads for every op without depending on
// each op's custom syntax. Values are named %v<id> (forward values, ids from
// pcp_mlir_function_body_t) and %t<n> (new values). The first failure is kept
// in the emitter and every later call is a no-op, so rule code reads as
// straight-line math; callers check pcp_autodiff_emitter_t.status at the end.
//
// Thread-compatible.

#ifndef PCP_COMPILE_AUTODIFF_IMPL_H_
#define PCP_COMPILE_AUTODIFF_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "compile/compile.h"

// A ranked tensor type: dims plus the element's MLIR spelling.
typedef struct pcp_autodiff_type_t {
  int32_t rank;
  int64_t dims[PCP_MAX_TENSOR_RANK];
  char element[16];
} pcp_autodiff_type_t;

// An SSA value: its name ("%v3", "%t17", "%c2#1") and type.
typedef struct pcp_autodiff_ref_t {
  char name[32];
  pcp_autodiff_type_t type;
  // What this value was made from, for rewrites IREE's GPU pipelines need
  // (docs/backends.md): 'n' a stablehlo.negate of |source| (same type), set
  // by pcp_autodiff_unary; 'w' an exact widening convert of |source| (same
  // dims, element |source_element|: bf16 or f16 to f32), set by
  // pcp_autodiff_convert; 0 nothing known. |source_self| is this value's
  // name when it was made: a copy renamed since (a block argument made from
  // it) no longer matches |name| and is not treated as derived.
  char source_kind;
  char source[32];
  char source_self[32];
  char source_element[16];
} pcp_autodiff_ref_t;

typedef struct pcp_autodiff_emitter_t {
  pcp_string_builder_t* out;
  uint32_t next_temp;
  pcp_status_t status;  // first failure; later emits do nothing
  // Where the ops being emitted come from ("model.mlir:12:5
  // (stablehlo.scatter, gradient)"); "" for none. When set, every op line
  // ends in " // from <origin>", which pcp_compile_module reads back to
  // name the user's op when iree-compile fails on a derived line.
  char origin[256];
} pcp_autodiff_emitter_t;

// Type helpers.
bool pcp_autodiff_type_is_float(const pcp_autodiff_type_t* type);
pcp_autodiff_type_t pcp_autodiff_type_scalar(const char* element);
pcp_autodiff_type_t pcp_autodiff_type_with_element(
    const pcp_autodiff_type_t* type, const char* element);
int64_t pcp_autodiff_type_element_count(const pcp_autodiff_type_t* type);
// Appends "tensor<2x3xf32>".
void pcp_autodiff_type_append(pcp_autodiff_emitter_t* e,
                              const pcp_autodiff_type_t* type);

// Sets e->origin from a user op's location and name (|role| NULL or
// "gradient"); control characters in the location become '?'.
void pcp_autodiff_origin_set(pcp_autodiff_emitter_t* e, const char* location,
                             const char* op_name, const char* role);
// Ends an op line: " // from <origin>\n" when e->origin is set, else "\n".
void pcp_autodiff_emit_line_end(pcp_autodiff_emitter_t* e);

// printf into the output (no-op after a failure).
void pcp_autodiff_emit_f(pcp_autodiff_emitter_t* e, const char* fmt, ...)
    PCP_PRINTF_ATTR(2, 3);
// Appends "i0, i1, ..." for |count| int64 values.
void pcp_autodiff_emit_i64_list(pcp_autodiff_emitter_t* e,
                                const int64_t* values, int32_t count);

// A fresh name.
pcp_autodiff_ref_t pcp_autodiff_new_ref(pcp_autodiff_emitter_t* e,
                                        const pcp_autodiff_type_t* type);

// Emits `%t = "op"(operands) attributes : (types) -> result` with
// |attributes| pasted verbatim ("" or "{...}").
pcp_autodiff_ref_t pcp_autodiff_emit_op(pcp_autodiff_emitter_t* e,
                                        const char* op,
                                        const pcp_autodiff_ref_t* operands,
                                        int32_t operand_count,
                                        const char* attributes,
                                        const pcp_autodiff_type_t* result);

// The value |ref| was made from when it is still the value made as a
// |kind| ('n' negation, 'w' exact widening) of it (see
// pcp_autodiff_ref_t.source_kind): true and |out_source| set, else false.
bool pcp_autodiff_ref_source(const pcp_autodiff_ref_t* ref, char kind,
                             pcp_autodiff_ref_t* out_source);

// Elementwise and shape ops; operands of binary ops share one type.
pcp_autodiff_ref_t pcp_autodiff_splat(pcp_autodiff_emitter_t* e, double value,
                                      const pcp_autodiff_type_t* type);
pcp_autodiff_ref_t pcp_autodiff_unary(pcp_autodiff_emitter_t* e, const char* op,
                                      pcp_autodiff_ref_t a);
pcp_autodiff_ref_t pcp_autodiff_binary(pcp_autodiff_emitter_t* e,
                                       const char* op, pcp_autodiff_ref_t a,
                                       pcp_autodiff_ref_t b);
// |direction|: "EQ", "GT", "LT", "GE", "LE", "NE". Result is i1.
pcp_autodiff_ref_t pcp_autodiff_compare(pcp_autodiff_emitter_t* e,
                                        const char* direction,
                                        pcp_autodiff_ref_t a,
                                        pcp_autodiff_ref_t b);
pcp_autodiff_ref_t pcp_autodiff_select(pcp_autodiff_emitter_t* e,
                                       pcp_autodiff_ref_t predicate,
                                       pcp_autodiff_ref_t on_true,
                                       pcp_autodiff_ref_t on_false);
pcp_autodiff_ref_t pcp_autodiff_convert(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a,
                                        const char* element);
pcp_autodiff_ref_t pcp_autodiff_reshape(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a,
                                        const pcp_autodiff_type_t* type);
pcp_autodiff_ref_t pcp_autodiff_transpose(pcp_autodiff_emitter_t* e,
                                          pcp_autodiff_ref_t a,
                                          const int64_t* permutation);
// result dim dims[i] <- operand dim i.
pcp_autodiff_ref_t pcp_autodiff_broadcast(pcp_autodiff_emitter_t* e,
                                          pcp_autodiff_ref_t a,
                                          const int64_t* dims,
                                          const pcp_autodiff_type_t* type);
// Sums |a| over the listed dims (any order); the result drops them. A sum
// of a negation is emitted as the negation of the sum: IREE folds a negate
// feeding an add-reduction into a subtract combiner, which has no neutral
// element, and its GPU pipelines then fail ("failed to get neutral element
// for reduction"; docs/backends.md).
pcp_autodiff_ref_t pcp_autodiff_reduce_sum(pcp_autodiff_emitter_t* e,
                                           pcp_autodiff_ref_t a,
                                           const int64_t* dims,
                                           int32_t dim_count);
// Sum over every element to a rank-0 tensor.
pcp_autodiff_ref_t pcp_autodiff_sum_all(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a);
pcp_autodiff_ref_t pcp_autodiff_slice(pcp_autodiff_emitter_t* e,
                                      pcp_autodiff_ref_t a,
                                      const int64_t* start,
                                      const int64_t* limit,
                                      const int64_t* strides);

// |type| with a new leading dimension of |count| ([count, ...dims]). Sets
// e->status (and returns |type| unchanged) when the rank would pass
// PCP_MAX_TENSOR_RANK.
pcp_autodiff_type_t pcp_autodiff_type_stacked(pcp_autodiff_emitter_t* e,
                                              const pcp_autodiff_type_t* type,
                                              int64_t count);
// Entry |index| (an i64 scalar) of |stacked|'s leading dimension, reshaped
// to |type| (stacked's dims without the first): a stablehlo.dynamic_slice
// with start (index, zero_index, ...) and a reshape. |zero_index| is an i64
// scalar 0 the caller made once.
pcp_autodiff_ref_t pcp_autodiff_index_leading(pcp_autodiff_emitter_t* e,
                                              pcp_autodiff_ref_t stacked,
                                              pcp_autodiff_ref_t index,
                                              pcp_autodiff_ref_t zero_index,
                                              const pcp_autodiff_type_t* type);
// Emits `%name:N = "func.call"(operands) {callee = @callee} : (...) ->
// (results...)`; pcp_autodiff_call_result names result |index| ("%name#i").
void pcp_autodiff_emit_call(pcp_autodiff_emitter_t* e, const char* result_name,
                            const char* callee,
                            const pcp_autodiff_ref_t* operands,
                            size_t operand_count,
                            const pcp_autodiff_type_t* const* results,
                            size_t result_count);
pcp_autodiff_ref_t pcp_autodiff_call_result(const char* call_name, size_t index,
                                            const pcp_autodiff_type_t* type);

// Comma-separated lists of |count| refs: "%a: T, %b: U" (arguments),
// "T, U" (types), "%a, %b" (names).
void pcp_autodiff_emit_arg_list(pcp_autodiff_emitter_t* e,
                                const pcp_autodiff_ref_t* refs, size_t count);
void pcp_autodiff_emit_type_list(pcp_autodiff_emitter_t* e,
                                 const pcp_autodiff_ref_t* refs, size_t count);
void pcp_autodiff_emit_name_list(pcp_autodiff_emitter_t* e,
                                 const pcp_autodiff_ref_t* refs, size_t count);

// A counted loop as one stablehlo.while: `%<result>:N = "stablehlo.while"(
// init...)` whose condition is `carry[0] < count` (carry 0 an i64 counter)
// and whose body block takes the carries. pcp_autodiff_while_begin fills
// |cond_args| and |body_args| (|carried| each) with the block arguments,
// named "%<cond_prefix><c>" and "%<body_prefix><c>", and leaves the body
// open; the caller emits the body from |body_args| and ends it with
// pcp_autodiff_while_end(|next|: the carries' new values). Results are
// "%<result>#c".
void pcp_autodiff_while_begin(pcp_autodiff_emitter_t* e, const char* result,
                              const pcp_autodiff_ref_t* init, size_t carried,
                              pcp_autodiff_ref_t count, const char* cond_prefix,
                              const char* body_prefix,
                              pcp_autodiff_ref_t* cond_args,
                              pcp_autodiff_ref_t* body_args);
void pcp_autodiff_while_end(pcp_autodiff_emitter_t* e,
                            const pcp_autodiff_ref_t* next,
                            const pcp_autodiff_ref_t* init, size_t carried);

//===----------------------------------------------------------------------===//
// Optimizer and fused steps (optimizer.c)
//===----------------------------------------------------------------------===//

// The forward function's shape as the optimizer builders need it.
typedef struct pcp_autodiff_training_signature_t {
  size_t argument_count;
  size_t param_count;  // arguments[0..param_count) are parameters
  const pcp_autodiff_type_t* arguments;
  pcp_autodiff_type_t loss;
} pcp_autodiff_training_signature_t;

// The element type optimizer state and gradient sums are kept in: f64 for
// f64, f32 for every other float (bf16, f16, f32).
const char* pcp_autodiff_master_element(const char* element);
// The type of a parameter's AdamW moments (and gradient sums): |type|'s
// shape in its master element.
pcp_autodiff_type_t pcp_autodiff_moment_type(const pcp_autodiff_type_t* type);

// Emits @apply_optimizer (AdamW with global-norm clipping).
void pcp_autodiff_emit_optimizer(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options);

// Emits @train_steps (options->inner_steps unrolled steps calling
// @compute_gradients and @apply_optimizer).
void pcp_autodiff_emit_train_steps(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options);

// Gradient accumulation (accumulate.c). With options->accumulation_steps
// A > 1 every optimizer step reads A micro-batches: this is the type one
// step's data argument |data_index| has ([A, ...] or, for A <= 1, the
// forward's own type) and the function that turns one step's data into
// (loss, grads...): "compute_gradients_accumulated" or "compute_gradients".
pcp_autodiff_type_t pcp_autodiff_step_data_type(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options, size_t data_index);
const char* pcp_autodiff_step_gradient_function(
    const pcp_compile_training_options_t* options);

// Emits @compute_gradients_accumulated(params..., data [A, ...]...) ->
// (loss, grads...): a stablehlo.while over the A micro-batches calling
// @compute_gradients, sums in the master element, both scaled by 1/A.
void pcp_autodiff_emit_gradients_accumulated(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options);

// Emits @diloco_round (diloco_program.c): zero moments, step 1, a call of
// @train_steps, deltas = params_in - params_out in options->delta_element.
void pcp_autodiff_emit_diloco_round(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options);

#endif  // PCP_COMPILE_AUTODIFF_IMPL_H_
