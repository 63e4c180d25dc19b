// SPDX-License-Identifier: Apache-2.0
//
// The generic-form StableHLO emitter (autodiff_impl.h).

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compile/autodiff_impl.h"

bool pcp_autodiff_type_is_float(const pcp_autodiff_type_t* type) {
  return strcmp(type->element, "f32") == 0 ||
         strcmp(type->element, "f64") == 0 ||
         strcmp(type->element, "f16") == 0 ||
         strcmp(type->element, "bf16") == 0;
}

pcp_autodiff_type_t pcp_autodiff_type_scalar(const char* element) {
  pcp_autodiff_type_t type;
  memset(&type, 0, sizeof(type));
  snprintf(type.element, sizeof(type.element), "%s", element);
  return type;
}

pcp_autodiff_type_t pcp_autodiff_type_with_element(
    const pcp_autodiff_type_t* type, const char* element) {
  pcp_autodiff_type_t result = *type;
  snprintf(result.element, sizeof(result.element), "%s", element);
  return result;
}

int64_t pcp_autodiff_type_element_count(const pcp_autodiff_type_t* type) {
  int64_t count = 1;
  for (int32_t i = 0; i < type->rank; ++i) {
    count *= type->dims[i];
  }
  return count;
}

void pcp_autodiff_emit_f(pcp_autodiff_emitter_t* e, const char* fmt, ...) {
  if (e->status) {
    return;
  }
  char stack[512];
  va_list args;
  va_start(args, fmt);
  int length = vsnprintf(stack, sizeof(stack), fmt, args);
  va_end(args);
  if (length < 0) {
    e->status = pcp_make_status(PCP_STATUS_INTERNAL, "format error");
    return;
  }
  if ((size_t)length < sizeof(stack)) {
    e->status = pcp_string_builder_append(
        e->out, pcp_make_string_view(stack, (size_t)length));
    return;
  }
  // Long lines (big constants): format straight into the builder.
  va_start(args, fmt);
  char* heap = NULL;
  pcp_status_t status = pcp_allocator_malloc(e->out->allocator,
                                             (size_t)length + 1, (void**)&heap);
  if (!status) {
    vsnprintf(heap, (size_t)length + 1, fmt, args);
    status = pcp_string_builder_append(
        e->out, pcp_make_string_view(heap, (size_t)length));
    pcp_allocator_free(e->out->allocator, heap);
  }
  va_end(args);
  e->status = status;
}

void pcp_autodiff_origin_set(pcp_autodiff_emitter_t* e, const char* location,
                             const char* op_name, const char* role) {
  int n = snprintf(e->origin, sizeof(e->origin), "%s (%s%s%s)", location,
                   op_name, role ? ", " : "", role ? role : "");
  if (n < 0) {
    e->origin[0] = 0;
  }
  for (char* p = e->origin; *p; ++p) {
    if ((unsigned char)*p < 0x20) {
      *p = '?';
    }
  }
}

void pcp_autodiff_emit_line_end(pcp_autodiff_emitter_t* e) {
  if (e->origin[0]) {
    pcp_autodiff_emit_f(e, "  // from %s\n", e->origin);
  } else {
    pcp_autodiff_emit_f(e, "\n");
  }
}

void pcp_autodiff_type_append(pcp_autodiff_emitter_t* e,
                              const pcp_autodiff_type_t* type) {
  pcp_autodiff_emit_f(e, "tensor<");
  for (int32_t i = 0; i < type->rank; ++i) {
    pcp_autodiff_emit_f(e, "%lldx", (long long)type->dims[i]);
  }
  pcp_autodiff_emit_f(e, "%s>", type->element);
}

void pcp_autodiff_emit_i64_list(pcp_autodiff_emitter_t* e,
                                const int64_t* values, int32_t count) {
  for (int32_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(e, "%s%lld", i ? ", " : "", (long long)values[i]);
  }
}

pcp_autodiff_ref_t pcp_autodiff_new_ref(pcp_autodiff_emitter_t* e,
                                        const pcp_autodiff_type_t* type) {
  pcp_autodiff_ref_t ref;
  memset(&ref, 0, sizeof(ref));
  snprintf(ref.name, sizeof(ref.name), "%%t%u", e->next_temp++);
  ref.type = *type;
  return ref;
}

static void emit_signature(pcp_autodiff_emitter_t* e,
                           const pcp_autodiff_ref_t* operands,
                           int32_t operand_count,
                           const pcp_autodiff_type_t* result) {
  pcp_autodiff_emit_f(e, " : (");
  for (int32_t i = 0; i < operand_count; ++i) {
    if (i) {
      pcp_autodiff_emit_f(e, ", ");
    }
    pcp_autodiff_type_append(e, &operands[i].type);
  }
  pcp_autodiff_emit_f(e, ") -> ");
  pcp_autodiff_type_append(e, result);
  pcp_autodiff_emit_line_end(e);
}

pcp_autodiff_ref_t pcp_autodiff_emit_op(pcp_autodiff_emitter_t* e,
                                        const char* op,
                                        const pcp_autodiff_ref_t* operands,
                                        int32_t operand_count,
                                        const char* attributes,
                                        const pcp_autodiff_type_t* result) {
  pcp_autodiff_ref_t ref = pcp_autodiff_new_ref(e, result);
  pcp_autodiff_emit_f(e, "    %s = \"%s\"(", ref.name, op);
  for (int32_t i = 0; i < operand_count; ++i) {
    pcp_autodiff_emit_f(e, "%s%s", i ? ", " : "", operands[i].name);
  }
  pcp_autodiff_emit_f(e, ")%s%s", attributes[0] ? " " : "", attributes);
  emit_signature(e, operands, operand_count, result);
  return ref;
}

pcp_autodiff_ref_t pcp_autodiff_splat(pcp_autodiff_emitter_t* e, double value,
                                      const pcp_autodiff_type_t* type) {
  pcp_autodiff_ref_t ref = pcp_autodiff_new_ref(e, type);
  pcp_autodiff_emit_f(e, "    %s = \"stablehlo.constant\"() {value = dense<",
                      ref.name);
  if (pcp_autodiff_type_is_float(type)) {
    pcp_autodiff_emit_f(e, "%.17e", value);
  } else if (strcmp(type->element, "i1") == 0) {
    pcp_autodiff_emit_f(e, "%s", value != 0 ? "true" : "false");
  } else {
    pcp_autodiff_emit_f(e, "%lld", (long long)value);
  }
  pcp_autodiff_emit_f(e, "> : ");
  pcp_autodiff_type_append(e, type);
  pcp_autodiff_emit_f(e, "}");
  emit_signature(e, NULL, 0, type);
  return ref;
}

pcp_autodiff_ref_t pcp_autodiff_unary(pcp_autodiff_emitter_t* e, const char* op,
                                      pcp_autodiff_ref_t a) {
  pcp_autodiff_ref_t ref = pcp_autodiff_emit_op(e, op, &a, 1, "", &a.type);
  if (strcmp(op, "stablehlo.negate") == 0) {
    ref.source_kind = 'n';
    snprintf(ref.source, sizeof(ref.source), "%s", a.name);
    snprintf(ref.source_self, sizeof(ref.source_self), "%s", ref.name);
    snprintf(ref.source_element, sizeof(ref.source_element), "%s",
             a.type.element);
  }
  return ref;
}

bool pcp_autodiff_ref_source(const pcp_autodiff_ref_t* ref, char kind,
                             pcp_autodiff_ref_t* out_source) {
  if (ref->source_kind != kind || strcmp(ref->name, ref->source_self) != 0) {
    return false;
  }
  memset(out_source, 0, sizeof(*out_source));
  snprintf(out_source->name, sizeof(out_source->name), "%s", ref->source);
  out_source->type =
      pcp_autodiff_type_with_element(&ref->type, ref->source_element);
  return true;
}

pcp_autodiff_ref_t pcp_autodiff_binary(pcp_autodiff_emitter_t* e,
                                       const char* op, pcp_autodiff_ref_t a,
                                       pcp_autodiff_ref_t b) {
  pcp_autodiff_ref_t operands[2] = {a, b};
  return pcp_autodiff_emit_op(e, op, operands, 2, "", &a.type);
}

pcp_autodiff_ref_t pcp_autodiff_compare(pcp_autodiff_emitter_t* e,
                                        const char* direction,
                                        pcp_autodiff_ref_t a,
                                        pcp_autodiff_ref_t b) {
  char attributes[128];
  snprintf(attributes, sizeof(attributes),
           "{comparison_direction = #stablehlo<comparison_direction %s>}",
           direction);
  pcp_autodiff_ref_t operands[2] = {a, b};
  pcp_autodiff_type_t type = pcp_autodiff_type_with_element(&a.type, "i1");
  return pcp_autodiff_emit_op(e, "stablehlo.compare", operands, 2, attributes,
                              &type);
}

pcp_autodiff_ref_t pcp_autodiff_select(pcp_autodiff_emitter_t* e,
                                       pcp_autodiff_ref_t predicate,
                                       pcp_autodiff_ref_t on_true,
                                       pcp_autodiff_ref_t on_false) {
  pcp_autodiff_ref_t operands[3] = {predicate, on_true, on_false};
  return pcp_autodiff_emit_op(e, "stablehlo.select", operands, 3, "",
                              &on_true.type);
}

pcp_autodiff_ref_t pcp_autodiff_convert(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a,
                                        const char* element) {
  if (strcmp(a.type.element, element) == 0) {
    return a;
  }
  pcp_autodiff_type_t type = pcp_autodiff_type_with_element(&a.type, element);
  pcp_autodiff_ref_t ref =
      pcp_autodiff_emit_op(e, "stablehlo.convert", &a, 1, "", &type);
  bool narrow =
      strcmp(a.type.element, "bf16") == 0 || strcmp(a.type.element, "f16") == 0;
  if (narrow && strcmp(element, "f32") == 0) {
    ref.source_kind = 'w';
    snprintf(ref.source, sizeof(ref.source), "%s", a.name);
    snprintf(ref.source_self, sizeof(ref.source_self), "%s", ref.name);
    snprintf(ref.source_element, sizeof(ref.source_element), "%s",
             a.type.element);
  }
  return ref;
}

pcp_autodiff_ref_t pcp_autodiff_reshape(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a,
                                        const pcp_autodiff_type_t* type) {
  bool same = a.type.rank == type->rank;
  for (int32_t i = 0; same && i < type->rank; ++i) {
    same = a.type.dims[i] == type->dims[i];
  }
  if (same) {
    return a;
  }
  return pcp_autodiff_emit_op(e, "stablehlo.reshape", &a, 1, "", type);
}

// Writes "{key = array<i64: ...>}" into |buffer|.
static void array_attribute(char* buffer, size_t capacity, const char* key,
                            const int64_t* values, int32_t count) {
  size_t used = (size_t)snprintf(buffer, capacity, "{%s = array<i64", key);
  for (int32_t i = 0; i < count && used < capacity; ++i) {
    used += (size_t)snprintf(buffer + used, capacity - used, "%s%lld",
                             i ? ", " : ": ", (long long)values[i]);
  }
  if (used < capacity) {
    snprintf(buffer + used, capacity - used, ">}");
  }
}

pcp_autodiff_ref_t pcp_autodiff_transpose(pcp_autodiff_emitter_t* e,
                                          pcp_autodiff_ref_t a,
                                          const int64_t* permutation) {
  bool identity = true;
  pcp_autodiff_type_t type = a.type;
  for (int32_t i = 0; i < a.type.rank; ++i) {
    type.dims[i] = a.type.dims[permutation[i]];
    identity = identity && permutation[i] == i;
  }
  if (identity) {
    return a;
  }
  char attributes[512];
  array_attribute(attributes, sizeof(attributes), "permutation", permutation,
                  a.type.rank);
  return pcp_autodiff_emit_op(e, "stablehlo.transpose", &a, 1, attributes,
                              &type);
}

pcp_autodiff_ref_t pcp_autodiff_broadcast(pcp_autodiff_emitter_t* e,
                                          pcp_autodiff_ref_t a,
                                          const int64_t* dims,
                                          const pcp_autodiff_type_t* type) {
  char attributes[512];
  array_attribute(attributes, sizeof(attributes), "broadcast_dimensions", dims,
                  a.type.rank);
  return pcp_autodiff_emit_op(e, "stablehlo.broadcast_in_dim", &a, 1,
                              attributes, type);
}

pcp_autodiff_ref_t pcp_autodiff_reduce_sum(pcp_autodiff_emitter_t* e,
                                           pcp_autodiff_ref_t a,
                                           const int64_t* dims,
                                           int32_t dim_count) {
  if (dim_count == 0) {
    return a;
  }
  pcp_autodiff_ref_t x;
  if (pcp_autodiff_ref_source(&a, 'n', &x)) {
    // -sum(x), not sum(-x) (see the header): the same bits (negation is
    // exact and rounding is sign-symmetric), and the negate of |a| is left
    // for IREE to drop when unused.
    return pcp_autodiff_unary(e, "stablehlo.negate",
                              pcp_autodiff_reduce_sum(e, x, dims, dim_count));
  }
  pcp_autodiff_type_t scalar = pcp_autodiff_type_scalar(a.type.element);
  pcp_autodiff_ref_t zero = pcp_autodiff_splat(e, 0.0, &scalar);
  pcp_autodiff_type_t type = scalar;
  int64_t sorted[PCP_MAX_TENSOR_RANK];
  int32_t sorted_count = 0;
  for (int32_t d = 0; d < a.type.rank; ++d) {
    bool reduced = false;
    for (int32_t i = 0; i < dim_count; ++i) {
      reduced = reduced || dims[i] == d;
    }
    if (reduced) {
      sorted[sorted_count++] = d;
    } else {
      type.dims[type.rank++] = a.type.dims[d];
    }
  }
  pcp_autodiff_ref_t result = pcp_autodiff_new_ref(e, &type);
  pcp_autodiff_ref_t lhs = pcp_autodiff_new_ref(e, &scalar);
  pcp_autodiff_ref_t rhs = pcp_autodiff_new_ref(e, &scalar);
  pcp_autodiff_ref_t sum = pcp_autodiff_new_ref(e, &scalar);
  pcp_autodiff_emit_f(e, "    %s = \"stablehlo.reduce\"(%s, %s) ({",
                      result.name, a.name, zero.name);
  pcp_autodiff_emit_line_end(e);
  pcp_autodiff_emit_f(e, "    ^bb0(%s: tensor<%s>, %s: tensor<%s>):\n",
                      lhs.name, scalar.element, rhs.name, scalar.element);
  pcp_autodiff_emit_f(e,
                      "      %s = \"stablehlo.add\"(%s, %s) : (tensor<%s>, "
                      "tensor<%s>) -> tensor<%s>\n",
                      sum.name, lhs.name, rhs.name, scalar.element,
                      scalar.element, scalar.element);
  pcp_autodiff_emit_f(e,
                      "      \"stablehlo.return\"(%s) : (tensor<%s>) -> ()\n",
                      sum.name, scalar.element);
  char attributes[512];
  array_attribute(attributes, sizeof(attributes), "dimensions", sorted,
                  sorted_count);
  pcp_autodiff_emit_f(e, "    }) %s", attributes);
  pcp_autodiff_ref_t operands[2] = {a, zero};
  emit_signature(e, operands, 2, &type);
  return result;
}

pcp_autodiff_ref_t pcp_autodiff_sum_all(pcp_autodiff_emitter_t* e,
                                        pcp_autodiff_ref_t a) {
  int64_t dims[PCP_MAX_TENSOR_RANK];
  for (int32_t i = 0; i < a.type.rank; ++i) {
    dims[i] = i;
  }
  return pcp_autodiff_reduce_sum(e, a, dims, a.type.rank);
}

pcp_autodiff_ref_t pcp_autodiff_slice(pcp_autodiff_emitter_t* e,
                                      pcp_autodiff_ref_t a,
                                      const int64_t* start,
                                      const int64_t* limit,
                                      const int64_t* strides) {
  pcp_autodiff_type_t type = a.type;
  for (int32_t i = 0; i < a.type.rank; ++i) {
    type.dims[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
  }
  char attributes[1024];
  char part[3][320];
  array_attribute(part[0], sizeof(part[0]), "start_indices", start,
                  a.type.rank);
  array_attribute(part[1], sizeof(part[1]), "limit_indices", limit,
                  a.type.rank);
  array_attribute(part[2], sizeof(part[2]), "strides", strides, a.type.rank);
  // Join the three one-key dictionaries into one.
  part[0][strlen(part[0]) - 1] = 0;
  part[1][strlen(part[1]) - 1] = 0;
  snprintf(attributes, sizeof(attributes), "%s, %s, %s", part[0], part[1] + 1,
           part[2] + 1);
  return pcp_autodiff_emit_op(e, "stablehlo.slice", &a, 1, attributes, &type);
}

pcp_autodiff_type_t pcp_autodiff_type_stacked(pcp_autodiff_emitter_t* e,
                                              const pcp_autodiff_type_t* type,
                                              int64_t count) {
  pcp_autodiff_type_t stacked = *type;
  if (type->rank >= PCP_MAX_TENSOR_RANK) {
    if (!e->status) {
      e->status = pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "a data argument of rank %d cannot take another leading dimension "
          "(at most %d)",
          (int)type->rank, PCP_MAX_TENSOR_RANK);
    }
    return stacked;
  }
  memmove(&stacked.dims[1], &stacked.dims[0],
          (size_t)stacked.rank * sizeof(int64_t));
  stacked.dims[0] = count;
  ++stacked.rank;
  return stacked;
}

pcp_autodiff_ref_t pcp_autodiff_index_leading(pcp_autodiff_emitter_t* e,
                                              pcp_autodiff_ref_t stacked,
                                              pcp_autodiff_ref_t index,
                                              pcp_autodiff_ref_t zero_index,
                                              const pcp_autodiff_type_t* type) {
  pcp_autodiff_ref_t operands[PCP_MAX_TENSOR_RANK + 1];
  operands[0] = stacked;
  operands[1] = index;
  for (int32_t r = 1; r < stacked.type.rank; ++r) {
    operands[1 + r] = zero_index;
  }
  pcp_autodiff_type_t one = stacked.type;
  one.dims[0] = 1;
  char attributes[512];
  int used =
      snprintf(attributes, sizeof(attributes), "{slice_sizes = array<i64");
  for (int32_t r = 0; r < one.rank; ++r) {
    used += snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                     "%s%lld", r ? ", " : ": ", (long long)one.dims[r]);
  }
  snprintf(attributes + used, sizeof(attributes) - (size_t)used, ">}");
  pcp_autodiff_ref_t slice =
      pcp_autodiff_emit_op(e, "stablehlo.dynamic_slice", operands,
                           1 + stacked.type.rank, attributes, &one);
  return pcp_autodiff_reshape(e, slice, type);
}

void pcp_autodiff_emit_call(pcp_autodiff_emitter_t* e, const char* result_name,
                            const char* callee,
                            const pcp_autodiff_ref_t* operands,
                            size_t operand_count,
                            const pcp_autodiff_type_t* const* results,
                            size_t result_count) {
  pcp_autodiff_emit_f(e, "    %s:%zu = \"func.call\"(", result_name,
                      result_count);
  for (size_t i = 0; i < operand_count; ++i) {
    pcp_autodiff_emit_f(e, "%s%s", i ? ", " : "", operands[i].name);
  }
  pcp_autodiff_emit_f(e, ") {callee = @%s} : (", callee);
  for (size_t i = 0; i < operand_count; ++i) {
    pcp_autodiff_emit_f(e, "%s", i ? ", " : "");
    pcp_autodiff_type_append(e, &operands[i].type);
  }
  pcp_autodiff_emit_f(e, ") -> (");
  for (size_t i = 0; i < result_count; ++i) {
    pcp_autodiff_emit_f(e, "%s", i ? ", " : "");
    pcp_autodiff_type_append(e, results[i]);
  }
  pcp_autodiff_emit_f(e, ")\n");
}

pcp_autodiff_ref_t pcp_autodiff_call_result(const char* call_name, size_t index,
                                            const pcp_autodiff_type_t* type) {
  pcp_autodiff_ref_t ref;
  memset(&ref, 0, sizeof(ref));
  snprintf(ref.name, sizeof(ref.name), "%s#%zu", call_name, index);
  ref.type = *type;
  return ref;
}

void pcp_autodiff_emit_arg_list(pcp_autodiff_emitter_t* e,
                                const pcp_autodiff_ref_t* refs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(e, "%s%s: ", i ? ", " : "", refs[i].name);
    pcp_autodiff_type_append(e, &refs[i].type);
  }
}

void pcp_autodiff_emit_type_list(pcp_autodiff_emitter_t* e,
                                 const pcp_autodiff_ref_t* refs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(e, "%s", i ? ", " : "");
    pcp_autodiff_type_append(e, &refs[i].type);
  }
}

void pcp_autodiff_emit_name_list(pcp_autodiff_emitter_t* e,
                                 const pcp_autodiff_ref_t* refs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(e, "%s%s", i ? ", " : "", refs[i].name);
  }
}

void pcp_autodiff_while_begin(pcp_autodiff_emitter_t* e, const char* result,
                              const pcp_autodiff_ref_t* init, size_t carried,
                              pcp_autodiff_ref_t count, const char* cond_prefix,
                              const char* body_prefix,
                              pcp_autodiff_ref_t* cond_args,
                              pcp_autodiff_ref_t* body_args) {
  for (size_t c = 0; c < carried; ++c) {
    cond_args[c] = init[c];
    snprintf(cond_args[c].name, sizeof(cond_args[c].name), "%%%s%zu",
             cond_prefix, c);
    body_args[c] = init[c];
    snprintf(body_args[c].name, sizeof(body_args[c].name), "%%%s%zu",
             body_prefix, c);
  }
  pcp_autodiff_emit_f(e, "    %%%s:%zu = \"stablehlo.while\"(", result,
                      carried);
  pcp_autodiff_emit_name_list(e, init, carried);
  pcp_autodiff_emit_f(e, ") ({\n    ^bb0(");
  pcp_autodiff_emit_arg_list(e, cond_args, carried);
  pcp_autodiff_emit_f(e, "):\n");
  pcp_autodiff_ref_t more = pcp_autodiff_compare(e, "LT", cond_args[0], count);
  pcp_autodiff_emit_f(e,
                      "    \"stablehlo.return\"(%s) : (tensor<i1>) -> ()\n"
                      "    }, {\n    ^bb0(",
                      more.name);
  pcp_autodiff_emit_arg_list(e, body_args, carried);
  pcp_autodiff_emit_f(e, "):\n");
}

void pcp_autodiff_while_end(pcp_autodiff_emitter_t* e,
                            const pcp_autodiff_ref_t* next,
                            const pcp_autodiff_ref_t* init, size_t carried) {
  pcp_autodiff_emit_f(e, "    \"stablehlo.return\"(");
  pcp_autodiff_emit_name_list(e, next, carried);
  pcp_autodiff_emit_f(e, ") : (");
  pcp_autodiff_emit_type_list(e, next, carried);
  pcp_autodiff_emit_f(e, ") -> ()\n    }) : (");
  pcp_autodiff_emit_type_list(e, init, carried);
  pcp_autodiff_emit_f(e, ") -> (");
  pcp_autodiff_emit_type_list(e, init, carried);
  pcp_autodiff_emit_f(e, ")\n");
}
