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
} pcp_autodiff_ref_t;

typedef struct pcp_autodiff_emitter_t {
  pcp_string_builder_t* out;
  uint32_t next_temp;
  pcp_status_t status;  // first failure; later emits do nothing
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
// Sums |a| over the listed dims (any order); the result drops them.
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

// Emits @diloco_round (diloco_program.c): zero moments, step 1, a call of
// @train_steps, deltas = params_in - params_out in options->delta_element.
void pcp_autodiff_emit_diloco_round(
    pcp_autodiff_emitter_t* e,
    const pcp_autodiff_training_signature_t* signature,
    const pcp_compile_training_options_t* options);

#endif  // PCP_COMPILE_AUTODIFF_IMPL_H_
