// SPDX-License-Identifier: Apache-2.0
//
// Reverse-mode autodiff over a forward-loss StableHLO function.
//
// The forward function is read through the MLIR C API
// (pcp_mlir_module_function_body), re-emitted op by op (generic form, values
// renamed %v<id>), and followed by the adjoint code: ops are visited in
// reverse order and each op with a gradient flowing into it applies its VJP
// rule (one per op name, docs/autodiff.md). Contributions to a value used
// more than once are summed. A value is "active" when it is a float that
// depends on a parameter; only active operands receive gradients, so integer
// data and constants never do. Gradient reaching an op without a rule is an
// UNIMPLEMENTED error naming the op and its location: upstream silently
// dropped such gradients.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/autodiff_impl.h"
#include "compile/compile.h"
#include "mlir/mlir.h"

typedef pcp_autodiff_ref_t ref_t;
typedef pcp_autodiff_type_t type_t;

typedef struct ad_t {
  pcp_autodiff_emitter_t e;
  const pcp_mlir_function_body_t* body;
  pcp_allocator_t allocator;
  char (*names)[32];
  bool* active;
  bool* has_adjoint;
  ref_t* adjoints;
} ad_t;

static void fail(ad_t* ad, pcp_status_t status) {
  if (!ad->e.status) {
    ad->e.status = status;
  } else {
    pcp_status_ignore(status);
  }
}

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

static bool mlir_type_to_type(const pcp_mlir_type_t* in, type_t* out) {
  memset(out, 0, sizeof(*out));
  if (in->kind != PCP_MLIR_TYPE_KIND_RANKED_TENSOR) {
    return false;
  }
  out->rank = in->rank;
  for (int32_t i = 0; i < in->rank; ++i) {
    if (in->dims[i] < 0) {
      return false;
    }
    out->dims[i] = in->dims[i];
  }
  snprintf(out->element, sizeof(out->element), "%s", in->element_spelling);
  return true;
}

static bool value_is_float(const ad_t* ad, uint32_t id) {
  type_t type;
  return mlir_type_to_type(&ad->body->values[id], &type) &&
         pcp_autodiff_type_is_float(&type);
}

static ref_t value_ref(ad_t* ad, uint32_t id) {
  ref_t ref;
  memset(&ref, 0, sizeof(ref));
  memcpy(ref.name, ad->names[id], sizeof(ref.name));
  if (!mlir_type_to_type(&ad->body->values[id], &ref.type)) {
    fail(ad, pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "value %s has type %s; gradients need static "
                             "ranked tensors",
                             ad->names[id], ad->body->values[id].spelling));
  }
  return ref;
}

static uint32_t operand_id(const ad_t* ad, const pcp_mlir_op_t* op,
                           uint32_t i) {
  return ad->body->operands[op->first_operand + i];
}

static ref_t operand(ad_t* ad, const pcp_mlir_op_t* op, uint32_t i) {
  return value_ref(ad, operand_id(ad, op, i));
}

static bool operand_active(const ad_t* ad, const pcp_mlir_op_t* op,
                           uint32_t i) {
  return i < op->operand_count && ad->active[operand_id(ad, op, i)];
}

// Adds |contribution| to the adjoint of operand |i| (when active).
static void accumulate(ad_t* ad, const pcp_mlir_op_t* op, uint32_t i,
                       ref_t contribution) {
  uint32_t id = operand_id(ad, op, i);
  if (!ad->active[id]) {
    return;
  }
  if (ad->has_adjoint[id]) {
    ad->adjoints[id] = pcp_autodiff_binary(&ad->e, "stablehlo.add",
                                           ad->adjoints[id], contribution);
  } else {
    ad->adjoints[id] = contribution;
    ad->has_adjoint[id] = true;
  }
}

//===----------------------------------------------------------------------===//
// Attributes (read from their printed form)
//===----------------------------------------------------------------------===//

// Finds "key = " in the op's properties or attributes, as a whole word.
static const char* attribute_find(const pcp_mlir_op_t* op, const char* key) {
  const char* texts[2] = {op->properties, op->attributes};
  size_t key_length = strlen(key);
  for (int t = 0; t < 2; ++t) {
    for (const char* p = strstr(texts[t], key); p; p = strstr(p + 1, key)) {
      int before = p == texts[t] ? ' ' : (unsigned char)p[-1];
      bool word_start = !(before == '_' || (before >= 'a' && before <= 'z') ||
                          (before >= 'A' && before <= 'Z'));
      if (word_start && strncmp(p + key_length, " = ", 3) == 0) {
        return p + key_length + 3;
      }
    }
  }
  return NULL;
}

// Parses an integer list: "array<i64: 1, 2>", "[1, 2]", "dense<[1, 2]>",
// "dense<3>" or "3 : i64". Returns the count (0 when absent).
static int32_t attribute_ints(const pcp_mlir_op_t* op, const char* key,
                              int64_t* out, int32_t capacity) {
  const char* p = attribute_find(op, key);
  if (!p) {
    return 0;
  }
  char end = 0;
  if (strncmp(p, "array<", 6) == 0) {
    p = strchr(p, '>') && strchr(p, ':') && strchr(p, ':') < strchr(p, '>')
            ? strchr(p, ':') + 1
            : strchr(p, '>');
    end = '>';
  } else if (strncmp(p, "dense<", 6) == 0) {
    p += 6;
    end = '>';
    if (*p == '[') {
      ++p;
      end = ']';
    }
  } else if (*p == '[') {
    ++p;
    end = ']';
  }
  int32_t count = 0;
  while (p && *p && *p != end && count < capacity) {
    while (*p == ' ' || *p == ',') {
      ++p;
    }
    if (*p == end || !*p) {
      break;
    }
    char* next = NULL;
    long long value = strtoll(p, &next, 10);
    if (next == p) {
      break;
    }
    out[count++] = value;
    p = next;
    if (!end) {
      break;  // a single integer
    }
  }
  return count;
}

static int64_t attribute_int(const pcp_mlir_op_t* op, const char* key,
                             int64_t fallback) {
  int64_t value = fallback;
  return attribute_ints(op, key, &value, 1) ? value : fallback;
}

// Checks that |count| dims were read (|expected| of them unless negative)
// and each is below |rank|; a mismatch means an attribute this file could
// not read (a printer change), never a valid module, so it is an error
// rather than a guess.
static bool dims_valid(ad_t* ad, const pcp_mlir_op_t* op, const char* what,
                       const int64_t* dims, int32_t count, int32_t expected,
                       int32_t rank) {
  bool ok = expected < 0 || count == expected;
  for (int32_t i = 0; ok && i < count; ++i) {
    ok = dims[i] >= 0 && dims[i] < rank;
  }
  if (!ok) {
    fail(ad, pcp_make_status(
                 PCP_STATUS_INTERNAL, "%s at %s: cannot read %s from '%s %s'",
                 op->name, op->location, what, op->properties, op->attributes));
  }
  return ok;
}

//===----------------------------------------------------------------------===//
// The forward function, re-emitted
//===----------------------------------------------------------------------===//

static void emit_block_ops(ad_t* ad, const pcp_mlir_block_t* block,
                           bool top_level, const char* indent);

static void emit_types(ad_t* ad, const uint32_t* ids, uint32_t count,
                       bool parenthesize_one) {
  bool parens = count != 1 || parenthesize_one;
  pcp_autodiff_emit_f(&ad->e, "%s", parens ? "(" : "");
  for (uint32_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(&ad->e, "%s%s", i ? ", " : "",
                        ad->body->values[ids[i]].spelling);
  }
  pcp_autodiff_emit_f(&ad->e, "%s", parens ? ")" : "");
}

// IREE 3.13's CPU backend rejects a bf16 `dense_resource` constant
// ("'arith.constant' op failed to verify that all of {value, result} have
// same type": its bf16 storage rewrite cannot retype a resource), which is
// how torch-mlir stores bf16 weights. The same blob read as i16 and
// bitcast to bf16 is the same tensor and compiles. Returns true when |op|
// was emitted that way.
static bool emit_bf16_resource_constant(ad_t* ad, const pcp_mlir_op_t* op,
                                        const char* indent) {
  if (strcmp(op->name, "stablehlo.constant") != 0 || op->result_count != 1 ||
      !strstr(op->properties, "dense_resource<")) {
    return false;
  }
  const pcp_mlir_type_t* type = &ad->body->values[op->first_result];
  const char* bf16 = strstr(op->properties, "bf16>");
  if (strcmp(type->element_spelling, "bf16") != 0 || !bf16 ||
      strstr(bf16 + 1, "bf16>")) {
    return false;
  }
  // "...tensor<8x16xbf16>}>" -> "...tensor<8x16xi16>}>", and the same for
  // the result type.
  char bits_type[192];
  const char* at = strstr(type->spelling, "bf16>");
  if (!at || strlen(type->spelling) + 2 > sizeof(bits_type)) {
    return false;
  }
  snprintf(bits_type, sizeof(bits_type), "%.*si16>", (int)(at - type->spelling),
           type->spelling);
  const char* name = ad->names[op->first_result];
  pcp_autodiff_origin_set(&ad->e, op->location, op->name, NULL);
  pcp_autodiff_emit_f(
      &ad->e, "%s%s_bits = \"stablehlo.constant\"() %.*si16>%s : () -> %s",
      indent, name, (int)(bf16 - op->properties), op->properties,
      bf16 + strlen("bf16>"), bits_type);
  pcp_autodiff_emit_line_end(&ad->e);
  pcp_autodiff_emit_f(
      &ad->e, "%s%s = \"stablehlo.bitcast_convert\"(%s_bits) : (%s) -> %s",
      indent, name, name, bits_type, type->spelling);
  pcp_autodiff_emit_line_end(&ad->e);
  ad->e.origin[0] = 0;
  return true;
}

static void emit_forward_op(ad_t* ad, const pcp_mlir_op_t* op,
                            const char* indent) {
  const pcp_mlir_function_body_t* body = ad->body;
  if (emit_bf16_resource_constant(ad, op, indent)) {
    return;
  }
  pcp_autodiff_emit_f(&ad->e, "%s", indent);
  if (op->result_count == 1) {
    pcp_autodiff_emit_f(&ad->e, "%s = ", ad->names[op->first_result]);
  } else if (op->result_count > 1) {
    pcp_autodiff_emit_f(&ad->e, "%%m%u:%u = ", op->first_result,
                        op->result_count);
  }
  pcp_autodiff_emit_f(&ad->e, "\"%s\"(", op->name);
  for (uint32_t i = 0; i < op->operand_count; ++i) {
    pcp_autodiff_emit_f(&ad->e, "%s%s", i ? ", " : "",
                        ad->names[operand_id(ad, op, i)]);
  }
  pcp_autodiff_emit_f(&ad->e, ")");
  if (op->properties[0]) {
    pcp_autodiff_emit_f(&ad->e, " %s", op->properties);
  }
  // The op's first line names the user's op (diagnostics, compile.c).
  pcp_autodiff_origin_set(&ad->e, op->location, op->name, NULL);
  if (op->region_count) {
    pcp_autodiff_emit_f(&ad->e, " (");
    for (uint32_t r = 0; r < op->region_count; ++r) {
      const pcp_mlir_block_t* block = &body->blocks[op->first_block + r];
      pcp_autodiff_emit_f(&ad->e, "%s{", r ? ", " : "");
      if (r == 0) {
        pcp_autodiff_emit_line_end(&ad->e);
      } else {
        pcp_autodiff_emit_f(&ad->e, "\n");
      }
      pcp_autodiff_emit_f(&ad->e, "%s^bb0(", indent);
      for (uint32_t a = 0; a < block->argument_count; ++a) {
        uint32_t id = block->first_argument + a;
        pcp_autodiff_emit_f(&ad->e, "%s%s: %s", a ? ", " : "", ad->names[id],
                            body->values[id].spelling);
      }
      pcp_autodiff_emit_f(&ad->e, "):\n");
      emit_block_ops(ad, block, false, "      ");
      pcp_autodiff_emit_f(&ad->e, "%s}", indent);
    }
    pcp_autodiff_emit_f(&ad->e, ")");
  }
  if (op->attributes[0]) {
    pcp_autodiff_emit_f(&ad->e, " %s", op->attributes);
  }
  pcp_autodiff_emit_f(&ad->e, " : ");
  emit_types(ad, &body->operands[op->first_operand], op->operand_count, true);
  pcp_autodiff_emit_f(&ad->e, " -> ");
  uint32_t results[64];
  uint32_t result_count = op->result_count < 64 ? op->result_count : 64;
  for (uint32_t i = 0; i < result_count; ++i) {
    results[i] = op->first_result + i;
  }
  emit_types(ad, results, result_count, false);
  if (op->region_count) {
    pcp_autodiff_emit_f(&ad->e, "\n");
  } else {
    pcp_autodiff_origin_set(&ad->e, op->location, op->name, NULL);
    pcp_autodiff_emit_line_end(&ad->e);
  }
  ad->e.origin[0] = 0;
}

static void emit_block_ops(ad_t* ad, const pcp_mlir_block_t* block,
                           bool top_level, const char* indent) {
  for (uint32_t i = 0; i < block->op_count; ++i) {
    const pcp_mlir_op_t* op = &ad->body->ops[block->first_op + i];
    if (top_level && strcmp(op->name, "func.return") == 0) {
      continue;
    }
    emit_forward_op(ad, op, indent);
  }
}

//===----------------------------------------------------------------------===//
// VJP rules
//===----------------------------------------------------------------------===//

// Ops whose result carries no gradient: comparisons, index and constant
// producers, and piecewise-constant functions (derivative 0 almost
// everywhere).
static const char* const kNonDifferentiableOps[] = {
    "stablehlo.compare",
    "stablehlo.iota",
    "stablehlo.constant",
    "stablehlo.sign",
    "stablehlo.floor",
    "stablehlo.ceil",
    "stablehlo.round_nearest_even",
    "stablehlo.round_nearest_afz",
    "stablehlo.not",
    "stablehlo.and",
    "stablehlo.or",
    "stablehlo.xor",
    "stablehlo.rng",
    "stablehlo.rng_bit_generator",
};

static bool is_non_differentiable(const char* name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kNonDifferentiableOps); ++i) {
    if (strcmp(name, kNonDifferentiableOps[i]) == 0) {
      return true;
    }
  }
  return false;
}

typedef void (*vjp_rule_t)(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y);

static ref_t splat_like(ad_t* ad, double value, ref_t like) {
  return pcp_autodiff_splat(&ad->e, value, &like.type);
}

static ref_t mul(ad_t* ad, ref_t a, ref_t b) {
  return pcp_autodiff_binary(&ad->e, "stablehlo.multiply", a, b);
}

static ref_t mul_scalar(ad_t* ad, ref_t a, double value) {
  return mul(ad, a, splat_like(ad, value, a));
}

// d(a+b) = (g, g)
static void rule_add(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(ad, op, 0, g);
  accumulate(ad, op, 1, g);
}

// d(a-b) = (g, -g)
static void rule_subtract(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(ad, op, 0, g);
  if (operand_active(ad, op, 1)) {
    accumulate(ad, op, 1, pcp_autodiff_unary(&ad->e, "stablehlo.negate", g));
  }
}

// d(a*b) = (g*b, g*a)
static void rule_multiply(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  if (operand_active(ad, op, 0)) {
    accumulate(ad, op, 0, mul(ad, g, operand(ad, op, 1)));
  }
  if (operand_active(ad, op, 1)) {
    accumulate(ad, op, 1, mul(ad, g, operand(ad, op, 0)));
  }
}

// d(a/b) = (g/b, -(g/b)*y)   since -g*a/b^2 = -(g/b)*(a/b)
static void rule_divide(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  ref_t g_over_b =
      pcp_autodiff_binary(&ad->e, "stablehlo.divide", g, operand(ad, op, 1));
  accumulate(ad, op, 0, g_over_b);
  if (operand_active(ad, op, 1)) {
    accumulate(
        ad, op, 1,
        pcp_autodiff_unary(&ad->e, "stablehlo.negate", mul(ad, g_over_b, y)));
  }
}

// d(-a) = -g
static void rule_negate(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(ad, op, 0, pcp_autodiff_unary(&ad->e, "stablehlo.negate", g));
}

// d exp(a) = g*y
static void rule_exponential(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                             ref_t y) {
  accumulate(ad, op, 0, mul(ad, g, y));
}

// d (exp(a)-1) = g*(y+1)
static void rule_expm1(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  accumulate(ad, op, 0,
             mul(ad, g,
                 pcp_autodiff_binary(&ad->e, "stablehlo.add", y,
                                     splat_like(ad, 1.0, y))));
}

// d log(a) = g/a
static void rule_log(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(
      ad, op, 0,
      pcp_autodiff_binary(&ad->e, "stablehlo.divide", g, operand(ad, op, 0)));
}

// d log(1+a) = g/(1+a)
static void rule_log1p(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  ref_t one_plus =
      pcp_autodiff_binary(&ad->e, "stablehlo.add", a, splat_like(ad, 1.0, a));
  accumulate(ad, op, 0,
             pcp_autodiff_binary(&ad->e, "stablehlo.divide", g, one_plus));
}

// d tanh(a) = g*(1-y^2)
static void rule_tanh(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  ref_t one_minus = pcp_autodiff_binary(&ad->e, "stablehlo.subtract",
                                        splat_like(ad, 1.0, y), mul(ad, y, y));
  accumulate(ad, op, 0, mul(ad, g, one_minus));
}

// d sigmoid(a) = g*y*(1-y)
static void rule_logistic(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  ref_t one_minus = pcp_autodiff_binary(&ad->e, "stablehlo.subtract",
                                        splat_like(ad, 1.0, y), y);
  accumulate(ad, op, 0, mul(ad, g, mul(ad, y, one_minus)));
}

// d a^(-1/2) = -0.5*g*y^3
static void rule_rsqrt(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  ref_t y3 = mul(ad, y, mul(ad, y, y));
  accumulate(ad, op, 0, mul(ad, mul_scalar(ad, g, -0.5), y3));
}

// d sqrt(a) = 0.5*g/y
static void rule_sqrt(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  accumulate(ad, op, 0,
             pcp_autodiff_binary(&ad->e, "stablehlo.divide",
                                 mul_scalar(ad, g, 0.5), y));
}

// d a^b = (g*b*a^(b-1), g*y*log(a))
static void rule_power(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  ref_t a = operand(ad, op, 0);
  ref_t b = operand(ad, op, 1);
  if (operand_active(ad, op, 0)) {
    ref_t b_minus_one = pcp_autodiff_binary(&ad->e, "stablehlo.subtract", b,
                                            splat_like(ad, 1.0, b));
    ref_t power =
        pcp_autodiff_binary(&ad->e, "stablehlo.power", a, b_minus_one);
    accumulate(ad, op, 0, mul(ad, g, mul(ad, b, power)));
  }
  if (operand_active(ad, op, 1)) {
    accumulate(
        ad, op, 1,
        mul(ad, g, mul(ad, y, pcp_autodiff_unary(&ad->e, "stablehlo.log", a))));
  }
}

// d max(a,b): g to the larger operand, g/2 to each on a tie (as JAX).
static void rule_max_min(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                         bool is_max) {
  ref_t a = operand(ad, op, 0);
  ref_t b = operand(ad, op, 1);
  ref_t zero = splat_like(ad, 0.0, g);
  ref_t half = mul_scalar(ad, g, 0.5);
  ref_t tie = pcp_autodiff_compare(&ad->e, "EQ", a, b);
  ref_t tie_share = pcp_autodiff_select(&ad->e, tie, half, zero);
  if (operand_active(ad, op, 0)) {
    ref_t wins = pcp_autodiff_compare(&ad->e, is_max ? "GT" : "LT", a, b);
    accumulate(ad, op, 0, pcp_autodiff_select(&ad->e, wins, g, tie_share));
  }
  if (operand_active(ad, op, 1)) {
    ref_t wins = pcp_autodiff_compare(&ad->e, is_max ? "LT" : "GT", a, b);
    accumulate(ad, op, 1, pcp_autodiff_select(&ad->e, wins, g, tie_share));
  }
}

static void rule_maximum(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  rule_max_min(ad, op, g, true);
}

static void rule_minimum(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  rule_max_min(ad, op, g, false);
}

// d |a| = g*sign(a)
static void rule_abs(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(
      ad, op, 0,
      mul(ad, g,
          pcp_autodiff_unary(&ad->e, "stablehlo.sign", operand(ad, op, 0))));
}

// d sin(a) = g*cos(a)
static void rule_sine(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(
      ad, op, 0,
      mul(ad, g,
          pcp_autodiff_unary(&ad->e, "stablehlo.cosine", operand(ad, op, 0))));
}

// d cos(a) = -g*sin(a)
static void rule_cosine(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t sine = pcp_autodiff_unary(&ad->e, "stablehlo.sine", operand(ad, op, 0));
  accumulate(ad, op, 0,
             pcp_autodiff_unary(&ad->e, "stablehlo.negate", mul(ad, g, sine)));
}

// Identity-like ops (optimization_barrier with one operand): g.
static void rule_identity(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  accumulate(ad, op, 0, g);
}

// d transpose(a, p) = transpose(g, p^-1)
static void rule_transpose(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                           ref_t y) {
  (void)y;
  int64_t permutation[PCP_MAX_TENSOR_RANK] = {0};
  int64_t inverse[PCP_MAX_TENSOR_RANK] = {0};
  int32_t rank =
      attribute_ints(op, "permutation", permutation, PCP_MAX_TENSOR_RANK);
  if (!dims_valid(ad, op, "permutation", permutation, rank, g.type.rank,
                  g.type.rank)) {
    return;
  }
  for (int32_t i = 0; i < rank; ++i) {
    inverse[permutation[i]] = i;
  }
  accumulate(ad, op, 0, pcp_autodiff_transpose(&ad->e, g, inverse));
}

// d reshape(a) = reshape(g, shape(a))
static void rule_reshape(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  accumulate(ad, op, 0, pcp_autodiff_reshape(&ad->e, g, &a.type));
}

// d convert(a) = convert(g, type(a))
static void rule_convert(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  accumulate(ad, op, 0, pcp_autodiff_convert(&ad->e, g, a.type.element));
}

// d broadcast_in_dim(a) = sum of g over the added dims and over the dims
// where a has size 1, reshaped (and transposed back when the mapping
// reorders dims) to shape(a).
static void rule_broadcast_in_dim(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                                  ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  int64_t dims[PCP_MAX_TENSOR_RANK] = {0};
  int32_t dim_count =
      attribute_ints(op, "broadcast_dimensions", dims, PCP_MAX_TENSOR_RANK);
  if (!dims_valid(ad, op, "broadcast_dimensions", dims, dim_count, a.type.rank,
                  g.type.rank)) {
    return;
  }
  bool keep[PCP_MAX_TENSOR_RANK] = {false};
  int64_t kept_operand_dims[PCP_MAX_TENSOR_RANK];
  int32_t kept_count = 0;
  for (int32_t i = 0; i < a.type.rank; ++i) {
    if (!(a.type.dims[i] == 1 && g.type.dims[dims[i]] != 1)) {
      keep[dims[i]] = true;
      kept_operand_dims[kept_count++] = i;
    }
  }
  int64_t reduced[PCP_MAX_TENSOR_RANK];
  int32_t reduced_count = 0;
  for (int32_t d = 0; d < g.type.rank; ++d) {
    if (!keep[d]) {
      reduced[reduced_count++] = d;
    }
  }
  ref_t sum = pcp_autodiff_reduce_sum(&ad->e, g, reduced, reduced_count);
  // sum's dims are the kept result dims in increasing order; operand order
  // may differ (broadcast_dimensions need not be sorted).
  int64_t permutation[PCP_MAX_TENSOR_RANK] = {0};
  for (int32_t j = 0; j < kept_count; ++j) {
    int64_t target = dims[kept_operand_dims[j]];
    int64_t position = 0;
    for (int32_t k = 0; k < kept_count; ++k) {
      position += dims[kept_operand_dims[k]] < target;
    }
    permutation[j] = position;
  }
  sum = pcp_autodiff_transpose(&ad->e, sum, permutation);
  accumulate(ad, op, 0, pcp_autodiff_reshape(&ad->e, sum, &a.type));
}

// Which scalar op a reduce's body applies: "add", "max", "min" or NULL.
static const char* reduce_kind(const ad_t* ad, const pcp_mlir_op_t* op) {
  if (op->region_count != 1) {
    return NULL;
  }
  const pcp_mlir_block_t* block = &ad->body->blocks[op->first_block];
  if (block->op_count != 2) {
    return NULL;
  }
  const char* name = ad->body->ops[block->first_op].name;
  if (strcmp(name, "stablehlo.add") == 0) {
    return "add";
  }
  if (strcmp(name, "stablehlo.maximum") == 0) {
    return "max";
  }
  if (strcmp(name, "stablehlo.minimum") == 0) {
    return "min";
  }
  return NULL;
}

// reduce(add): da = broadcast(g) over the reduced dims; dinit = sum(g).
// reduce(max|min): g goes to the elements equal to the result, split
// evenly among ties (as JAX); the init value gets nothing.
static void rule_reduce(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  const char* kind = reduce_kind(ad, op);
  if (!kind || op->operand_count != 2) {
    fail(ad, pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "no VJP rule for this stablehlo.reduce at %s "
                             "(only single-input add, max and min reductions)",
                             op->location));
    return;
  }
  ref_t a = operand(ad, op, 0);
  int64_t reduced[PCP_MAX_TENSOR_RANK];
  int32_t reduced_count =
      attribute_ints(op, "dimensions", reduced, PCP_MAX_TENSOR_RANK);
  int64_t kept[PCP_MAX_TENSOR_RANK];
  int32_t kept_count = 0;
  for (int32_t d = 0; d < a.type.rank; ++d) {
    bool is_reduced = false;
    for (int32_t i = 0; i < reduced_count; ++i) {
      is_reduced = is_reduced || reduced[i] == d;
    }
    if (!is_reduced) {
      kept[kept_count++] = d;
    }
  }
  if (strcmp(kind, "add") == 0) {
    accumulate(ad, op, 0, pcp_autodiff_broadcast(&ad->e, g, kept, &a.type));
    if (operand_active(ad, op, 1)) {
      accumulate(ad, op, 1, pcp_autodiff_sum_all(&ad->e, g));
    }
    return;
  }
  ref_t y_full = pcp_autodiff_broadcast(&ad->e, y, kept, &a.type);
  ref_t hit = pcp_autodiff_compare(&ad->e, "EQ", a, y_full);
  ref_t mask = pcp_autodiff_select(&ad->e, hit, splat_like(ad, 1.0, a),
                                   splat_like(ad, 0.0, a));
  ref_t count = pcp_autodiff_reduce_sum(&ad->e, mask, reduced, reduced_count);
  ref_t share = pcp_autodiff_binary(&ad->e, "stablehlo.divide", g, count);
  accumulate(
      ad, op, 0,
      mul(ad, mask, pcp_autodiff_broadcast(&ad->e, share, kept, &a.type)));
}

static bool contains(const int64_t* values, int32_t count, int64_t value) {
  for (int32_t i = 0; i < count; ++i) {
    if (values[i] == value) {
      return true;
    }
  }
  return false;
}

// Rank of |value| among |values| (how many are smaller).
static int64_t rank_among(const int64_t* values, int32_t count, int64_t value) {
  int64_t rank = 0;
  for (int32_t i = 0; i < count; ++i) {
    rank += values[i] < value;
  }
  return rank;
}

static ref_t emit_dot(ad_t* ad, ref_t lhs, ref_t rhs, const int64_t* lb,
                      const int64_t* rb, int32_t nb, const int64_t* lc,
                      const int64_t* rc, int32_t nc, const type_t* result) {
  pcp_autodiff_emitter_t* e = &ad->e;
  // A cotangent that is an exact widening of a bf16 value (the backward of
  // a bf16 dot accumulated in f32, src/models/emit.c) meets a bf16 operand
  // in its bf16 form: the same values, and a bf16 matrix-unit product.
  ref_t narrow;
  if (strcmp(lhs.type.element, rhs.type.element) != 0) {
    if (pcp_autodiff_ref_source(&lhs, 'w', &narrow) &&
        strcmp(narrow.type.element, rhs.type.element) == 0) {
      lhs = narrow;
    } else if (pcp_autodiff_ref_source(&rhs, 'w', &narrow) &&
               strcmp(narrow.type.element, lhs.type.element) == 0) {
      rhs = narrow;
    }
  }
  // A bf16 (f16) result is accumulated in f32 and rounded once: IREE's GPU
  // pipelines reject a dot with a bf16 result ("failed to distribute",
  // docs/backends.md).
  bool low = strcmp(result->element, "bf16") == 0 ||
             strcmp(result->element, "f16") == 0;
  type_t wide = pcp_autodiff_type_with_element(result, "f32");
  ref_t out = pcp_autodiff_new_ref(e, low ? &wide : result);
  pcp_autodiff_emit_f(e,
                      "    %s = \"stablehlo.dot_general\"(%s, %s) "
                      "{dot_dimension_numbers = #stablehlo.dot<",
                      out.name, lhs.name, rhs.name);
  const char* sep = "";
  if (nb) {
    pcp_autodiff_emit_f(e, "lhs_batching_dimensions = [");
    pcp_autodiff_emit_i64_list(e, lb, nb);
    pcp_autodiff_emit_f(e, "], rhs_batching_dimensions = [");
    pcp_autodiff_emit_i64_list(e, rb, nb);
    pcp_autodiff_emit_f(e, "]");
    sep = ", ";
  }
  if (nc) {
    pcp_autodiff_emit_f(e, "%slhs_contracting_dimensions = [", sep);
    pcp_autodiff_emit_i64_list(e, lc, nc);
    pcp_autodiff_emit_f(e, "], rhs_contracting_dimensions = [");
    pcp_autodiff_emit_i64_list(e, rc, nc);
    pcp_autodiff_emit_f(e, "]");
  }
  pcp_autodiff_emit_f(e, ">} : (");
  pcp_autodiff_type_append(e, &lhs.type);
  pcp_autodiff_emit_f(e, ", ");
  pcp_autodiff_type_append(e, &rhs.type);
  pcp_autodiff_emit_f(e, ") -> ");
  pcp_autodiff_type_append(e, &out.type);
  pcp_autodiff_emit_f(e, "\n");
  return low ? pcp_autodiff_convert(e, out, result->element) : out;
}

// dot_general with result layout [batch, lhs free, rhs free]:
//   dA = dot(g, B) contracting g's rhs-free dims with B's free dims, batched,
//        giving [batch, lhs free, B's contracting dims], transposed to A;
//   dB = dot(g, A) likewise, transposed to B's layout.
static void rule_dot_general(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                             ref_t y) {
  (void)y;
  ref_t lhs = operand(ad, op, 0);
  ref_t rhs = operand(ad, op, 1);
  int64_t lb[PCP_MAX_TENSOR_RANK] = {0}, rb[PCP_MAX_TENSOR_RANK] = {0};
  int64_t lc[PCP_MAX_TENSOR_RANK] = {0}, rc[PCP_MAX_TENSOR_RANK] = {0};
  int32_t nb =
      attribute_ints(op, "lhs_batching_dimensions", lb, PCP_MAX_TENSOR_RANK);
  int32_t nrb =
      attribute_ints(op, "rhs_batching_dimensions", rb, PCP_MAX_TENSOR_RANK);
  int32_t nc =
      attribute_ints(op, "lhs_contracting_dimensions", lc, PCP_MAX_TENSOR_RANK);
  int32_t nrc =
      attribute_ints(op, "rhs_contracting_dimensions", rc, PCP_MAX_TENSOR_RANK);
  if (!dims_valid(ad, op, "lhs_batching_dimensions", lb, nb, -1,
                  lhs.type.rank) ||
      !dims_valid(ad, op, "rhs_batching_dimensions", rb, nrb, nb,
                  rhs.type.rank) ||
      !dims_valid(ad, op, "lhs_contracting_dimensions", lc, nc, -1,
                  lhs.type.rank) ||
      !dims_valid(ad, op, "rhs_contracting_dimensions", rc, nrc, nc,
                  rhs.type.rank)) {
    return;
  }
  int64_t lf[PCP_MAX_TENSOR_RANK] = {0}, rf[PCP_MAX_TENSOR_RANK] = {0};
  int32_t nlf = 0, nrf = 0;
  for (int32_t d = 0; d < lhs.type.rank; ++d) {
    if (!contains(lb, nb, d) && !contains(lc, nc, d)) {
      lf[nlf++] = d;
    }
  }
  for (int32_t d = 0; d < rhs.type.rank; ++d) {
    if (!contains(rb, nb, d) && !contains(rc, nc, d)) {
      rf[nrf++] = d;
    }
  }
  int64_t g_batch[PCP_MAX_TENSOR_RANK], g_lf[PCP_MAX_TENSOR_RANK],
      g_rf[PCP_MAX_TENSOR_RANK];
  for (int32_t i = 0; i < nb; ++i) {
    g_batch[i] = i;
  }
  for (int32_t i = 0; i < nlf; ++i) {
    g_lf[i] = nb + i;
  }
  for (int32_t i = 0; i < nrf; ++i) {
    g_rf[i] = nb + nlf + i;
  }
  if (operand_active(ad, op, 0)) {
    // [batch, lhs free, rhs contracting (ascending rhs order)]
    type_t type = pcp_autodiff_type_scalar(lhs.type.element);
    for (int32_t i = 0; i < nb; ++i) {
      type.dims[type.rank++] = lhs.type.dims[lb[i]];
    }
    for (int32_t i = 0; i < nlf; ++i) {
      type.dims[type.rank++] = lhs.type.dims[lf[i]];
    }
    int64_t rc_sorted[PCP_MAX_TENSOR_RANK] = {0};
    for (int32_t i = 0; i < nc; ++i) {
      rc_sorted[rank_among(rc, nc, rc[i])] = rc[i];
    }
    for (int32_t i = 0; i < nc; ++i) {
      type.dims[type.rank++] = rhs.type.dims[rc_sorted[i]];
    }
    ref_t product = emit_dot(ad, g, rhs, g_batch, rb, nb, g_rf, rf, nrf, &type);
    int64_t permutation[PCP_MAX_TENSOR_RANK] = {0};
    for (int32_t i = 0; i < nb; ++i) {
      permutation[lb[i]] = i;
    }
    for (int32_t i = 0; i < nlf; ++i) {
      permutation[lf[i]] = nb + i;
    }
    for (int32_t i = 0; i < nc; ++i) {
      permutation[lc[i]] = nb + nlf + rank_among(rc, nc, rc[i]);
    }
    accumulate(ad, op, 0, pcp_autodiff_transpose(&ad->e, product, permutation));
  }
  if (operand_active(ad, op, 1)) {
    // [batch, rhs free, lhs contracting (ascending lhs order)]
    type_t type = pcp_autodiff_type_scalar(rhs.type.element);
    for (int32_t i = 0; i < nb; ++i) {
      type.dims[type.rank++] = rhs.type.dims[rb[i]];
    }
    for (int32_t i = 0; i < nrf; ++i) {
      type.dims[type.rank++] = rhs.type.dims[rf[i]];
    }
    int64_t lc_sorted[PCP_MAX_TENSOR_RANK] = {0};
    for (int32_t i = 0; i < nc; ++i) {
      lc_sorted[rank_among(lc, nc, lc[i])] = lc[i];
    }
    for (int32_t i = 0; i < nc; ++i) {
      type.dims[type.rank++] = lhs.type.dims[lc_sorted[i]];
    }
    ref_t product = emit_dot(ad, g, lhs, g_batch, lb, nb, g_lf, lf, nlf, &type);
    int64_t permutation[PCP_MAX_TENSOR_RANK] = {0};
    for (int32_t i = 0; i < nb; ++i) {
      permutation[rb[i]] = i;
    }
    for (int32_t i = 0; i < nrf; ++i) {
      permutation[rf[i]] = nb + i;
    }
    for (int32_t i = 0; i < nc; ++i) {
      permutation[rc[i]] = nb + nrf + rank_among(lc, nc, lc[i]);
    }
    accumulate(ad, op, 1, pcp_autodiff_transpose(&ad->e, product, permutation));
  }
}

// d select(p, a, b) = (none, select(p, g, 0), select(p, 0, g))
static void rule_select(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t predicate = operand(ad, op, 0);
  ref_t zero = splat_like(ad, 0.0, g);
  if (operand_active(ad, op, 1)) {
    accumulate(ad, op, 1, pcp_autodiff_select(&ad->e, predicate, g, zero));
  }
  if (operand_active(ad, op, 2)) {
    accumulate(ad, op, 2, pcp_autodiff_select(&ad->e, predicate, zero, g));
  }
}

static ref_t emit_pad(ad_t* ad, ref_t a, const int64_t* low,
                      const int64_t* high, const int64_t* interior,
                      const type_t* type) {
  pcp_autodiff_emitter_t* e = &ad->e;
  type_t scalar = pcp_autodiff_type_scalar(a.type.element);
  ref_t zero = pcp_autodiff_splat(e, 0.0, &scalar);
  ref_t out = pcp_autodiff_new_ref(e, type);
  pcp_autodiff_emit_f(e,
                      "    %s = \"stablehlo.pad\"(%s, %s) "
                      "{edge_padding_low = array<i64: ",
                      out.name, a.name, zero.name);
  pcp_autodiff_emit_i64_list(e, low, a.type.rank);
  pcp_autodiff_emit_f(e, ">, edge_padding_high = array<i64: ");
  pcp_autodiff_emit_i64_list(e, high, a.type.rank);
  pcp_autodiff_emit_f(e, ">, interior_padding = array<i64: ");
  pcp_autodiff_emit_i64_list(e, interior, a.type.rank);
  pcp_autodiff_emit_f(e, ">} : (");
  pcp_autodiff_type_append(e, &a.type);
  pcp_autodiff_emit_f(e, ", ");
  pcp_autodiff_type_append(e, &scalar);
  pcp_autodiff_emit_f(e, ") -> ");
  pcp_autodiff_type_append(e, type);
  pcp_autodiff_emit_f(e, "\n");
  return out;
}

// d slice(a) = g padded with zeros back to shape(a): low = start,
// interior = stride - 1, high = what is left after the last taken element.
static void rule_slice(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  int64_t start[PCP_MAX_TENSOR_RANK], strides[PCP_MAX_TENSOR_RANK];
  int64_t high[PCP_MAX_TENSOR_RANK], interior[PCP_MAX_TENSOR_RANK];
  attribute_ints(op, "start_indices", start, PCP_MAX_TENSOR_RANK);
  int32_t stride_count =
      attribute_ints(op, "strides", strides, PCP_MAX_TENSOR_RANK);
  for (int32_t d = 0; d < a.type.rank; ++d) {
    if (d >= stride_count) {
      strides[d] = 1;
    }
    interior[d] = strides[d] - 1;
    int64_t last = g.type.dims[d] ? start[d] + (g.type.dims[d] - 1) * strides[d]
                                  : start[d] - 1;
    high[d] = a.type.dims[d] - last - 1;
  }
  accumulate(ad, op, 0, emit_pad(ad, g, start, high, interior, &a.type));
}

// d pad(a, v) = (strided slice of g at the operand's positions,
//                sum(g) - sum(that slice))
static void rule_pad(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  int64_t low[PCP_MAX_TENSOR_RANK], interior[PCP_MAX_TENSOR_RANK];
  int64_t limit[PCP_MAX_TENSOR_RANK], strides[PCP_MAX_TENSOR_RANK];
  attribute_ints(op, "edge_padding_low", low, PCP_MAX_TENSOR_RANK);
  attribute_ints(op, "interior_padding", interior, PCP_MAX_TENSOR_RANK);
  for (int32_t d = 0; d < a.type.rank; ++d) {
    strides[d] = interior[d] + 1;
    limit[d] = low[d] + (a.type.dims[d] - 1) * strides[d] + 1;
    if (low[d] < 0 || limit[d] > g.type.dims[d]) {
      fail(ad, pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                               "stablehlo.pad at %s: negative padding has no "
                               "VJP rule yet",
                               op->location));
      return;
    }
  }
  ref_t inner = pcp_autodiff_slice(&ad->e, g, low, limit, strides);
  accumulate(ad, op, 0, inner);
  if (operand_active(ad, op, 1)) {
    accumulate(ad, op, 1,
               pcp_autodiff_binary(&ad->e, "stablehlo.subtract",
                                   pcp_autodiff_sum_all(&ad->e, g),
                                   pcp_autodiff_sum_all(&ad->e, inner)));
  }
}

// d concatenate(a_i) = the slices of g along the dimension.
static void rule_concatenate(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                             ref_t y) {
  (void)y;
  int64_t dimension = attribute_int(op, "dimension", 0);
  int64_t offset = 0;
  for (uint32_t i = 0; i < op->operand_count; ++i) {
    ref_t a = operand(ad, op, i);
    if (operand_active(ad, op, i)) {
      int64_t start[PCP_MAX_TENSOR_RANK] = {0}, limit[PCP_MAX_TENSOR_RANK];
      int64_t strides[PCP_MAX_TENSOR_RANK];
      for (int32_t d = 0; d < g.type.rank; ++d) {
        limit[d] = g.type.dims[d];
        strides[d] = 1;
      }
      start[dimension] = offset;
      limit[dimension] = offset + a.type.dims[dimension];
      accumulate(ad, op, i,
                 pcp_autodiff_slice(&ad->e, g, start, limit, strides));
    }
    offset += a.type.dims[dimension];
  }
}

static void emit_dims_field(ad_t* ad, const char* key, const int64_t* values,
                            int32_t count, const char** separator) {
  if (!count) {
    return;
  }
  pcp_autodiff_emit_f(&ad->e, "%s%s = [", *separator, key);
  pcp_autodiff_emit_i64_list(&ad->e, values, count);
  pcp_autodiff_emit_f(&ad->e, "]");
  *separator = ", ";
}

// The dimension numbers of a stablehlo.scatter the VJP rules emit (gather's
// cotangent, scatter's operand gradient).
typedef struct scatter_dims_t {
  const int64_t* window;
  int32_t window_count;
  const int64_t* inserted;
  int32_t inserted_count;
  const int64_t* input_batching;
  int32_t input_batching_count;
  const int64_t* indices_batching;
  int32_t indices_batching_count;
  const int64_t* to_operand;
  int32_t to_operand_count;
  int64_t index_vector_dim;
} scatter_dims_t;

// Closes a scatter's region and writes its attributes, up to and including
// the closing "}" of the attribute dictionary.
static void emit_scatter_attributes(ad_t* ad, const scatter_dims_t* d) {
  pcp_autodiff_emitter_t* e = &ad->e;
  pcp_autodiff_emit_f(e,
                      "    }) {indices_are_sorted = false, "
                      "scatter_dimension_numbers = #stablehlo.scatter<");
  const char* separator = "";
  emit_dims_field(ad, "update_window_dims", d->window, d->window_count,
                  &separator);
  emit_dims_field(ad, "inserted_window_dims", d->inserted, d->inserted_count,
                  &separator);
  emit_dims_field(ad, "input_batching_dims", d->input_batching,
                  d->input_batching_count, &separator);
  emit_dims_field(ad, "scatter_indices_batching_dims", d->indices_batching,
                  d->indices_batching_count, &separator);
  emit_dims_field(ad, "scatter_dims_to_operand_dims", d->to_operand,
                  d->to_operand_count, &separator);
  pcp_autodiff_emit_f(e, "%sindex_vector_dim = %lld>, unique_indices = false}",
                      separator, (long long)d->index_vector_dim);
}

// d gather(a, idx) = scatter-add of g into zeros(shape(a)) with the same
// dimension numbers (the transpose of a gather is a scatter).
static void rule_gather(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  ref_t indices = operand(ad, op, 1);
  int64_t offset[PCP_MAX_TENSOR_RANK], collapsed[PCP_MAX_TENSOR_RANK];
  int64_t operand_batching[PCP_MAX_TENSOR_RANK];
  int64_t indices_batching[PCP_MAX_TENSOR_RANK], start_map[PCP_MAX_TENSOR_RANK];
  int32_t n_offset = attribute_ints(op, "offset_dims", offset, 16);
  int32_t n_collapsed =
      attribute_ints(op, "collapsed_slice_dims", collapsed, 16);
  int32_t n_ob =
      attribute_ints(op, "operand_batching_dims", operand_batching, 16);
  int32_t n_ib =
      attribute_ints(op, "start_indices_batching_dims", indices_batching, 16);
  int32_t n_map = attribute_ints(op, "start_index_map", start_map, 16);
  int64_t index_vector_dim = attribute_int(op, "index_vector_dim", 0);
  ref_t zeros = splat_like(ad, 0.0, a);
  type_t scalar = pcp_autodiff_type_scalar(a.type.element);
  pcp_autodiff_emitter_t* e = &ad->e;
  // The updates pass through an optimization barrier: IREE's GPU pipelines
  // fuse an element-wise producer (a norm's backward) into the scatter's
  // dispatch and then cannot distribute it ("write affecting operations on
  // global resources are restricted to workgroup distributed contexts" on
  // cuda, "failed to apply fusion + hoisting patterns" on rocm;
  // docs/backends.md). The values are unchanged; only fusion is stopped.
  g = pcp_autodiff_emit_op(e, "stablehlo.optimization_barrier", &g, 1, "",
                           &g.type);
  ref_t out = pcp_autodiff_new_ref(e, &a.type);
  ref_t lhs = pcp_autodiff_new_ref(e, &scalar);
  ref_t rhs = pcp_autodiff_new_ref(e, &scalar);
  ref_t sum = pcp_autodiff_new_ref(e, &scalar);
  pcp_autodiff_emit_f(e, "    %s = \"stablehlo.scatter\"(%s, %s, %s) ({",
                      out.name, zeros.name, indices.name, g.name);
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
  const scatter_dims_t dims = {.window = offset,
                               .window_count = n_offset,
                               .inserted = collapsed,
                               .inserted_count = n_collapsed,
                               .input_batching = operand_batching,
                               .input_batching_count = n_ob,
                               .indices_batching = indices_batching,
                               .indices_batching_count = n_ib,
                               .to_operand = start_map,
                               .to_operand_count = n_map,
                               .index_vector_dim = index_vector_dim};
  emit_scatter_attributes(ad, &dims);
  ref_t operands[3] = {zeros, indices, g};
  pcp_autodiff_emit_f(e, " : (");
  for (int i = 0; i < 3; ++i) {
    pcp_autodiff_emit_f(e, "%s", i ? ", " : "");
    pcp_autodiff_type_append(e, &operands[i].type);
  }
  pcp_autodiff_emit_f(e, ") -> ");
  pcp_autodiff_type_append(e, &a.type);
  pcp_autodiff_emit_f(e, "\n");
  accumulate(ad, op, 0, out);
}

// Which combiner a scatter's update computation applies: "add" (index_add,
// index_put with accumulate), "replace" (index_put: the body returns its
// second argument) or NULL.
static const char* scatter_kind(const ad_t* ad, const pcp_mlir_op_t* op) {
  if (op->region_count != 1) {
    return NULL;
  }
  const pcp_mlir_block_t* block = &ad->body->blocks[op->first_block];
  if (block->argument_count != 2) {
    return NULL;
  }
  const pcp_mlir_op_t* first = &ad->body->ops[block->first_op];
  if (block->op_count == 2 && strcmp(first->name, "stablehlo.add") == 0) {
    return "add";
  }
  if (block->op_count == 1 && strcmp(first->name, "stablehlo.return") == 0 &&
      first->operand_count == 1 &&
      ad->body->operands[first->first_operand] == block->first_argument + 1) {
    return "replace";
  }
  return NULL;
}

// scatter(a, idx, u) with the add combiner: da = g; du = gather(g, idx)
// with the scatter's dimension numbers read as a gather's (the transpose
// of a scatter-add is a gather). With the replace combiner (index_put) the
// scattered positions of a are overwritten: da = scatter(g, idx, zeros(u))
// (replace), du = gather(g, idx). Replace assumes unique indices (as
// torch's index_put does for its gradient): with duplicates only one
// update survives the forward, but each gets the gradient.
static void rule_scatter(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  const char* kind = scatter_kind(ad, op);
  if (!kind || op->operand_count != 3) {
    fail(ad, pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "no VJP rule for this stablehlo.scatter at %s "
                             "(only single-input scatters whose update "
                             "computation adds or replaces)",
                             op->location));
    return;
  }
  ref_t a = operand(ad, op, 0);
  ref_t indices = operand(ad, op, 1);
  ref_t updates = operand(ad, op, 2);
  int64_t window[PCP_MAX_TENSOR_RANK], inserted[PCP_MAX_TENSOR_RANK];
  int64_t input_batching[PCP_MAX_TENSOR_RANK];
  int64_t indices_batching[PCP_MAX_TENSOR_RANK],
      to_operand[PCP_MAX_TENSOR_RANK];
  int32_t n_window = attribute_ints(op, "update_window_dims", window, 16);
  int32_t n_inserted = attribute_ints(op, "inserted_window_dims", inserted, 16);
  int32_t n_ib = attribute_ints(op, "input_batching_dims", input_batching, 16);
  int32_t n_sb =
      attribute_ints(op, "scatter_indices_batching_dims", indices_batching, 16);
  int32_t n_map =
      attribute_ints(op, "scatter_dims_to_operand_dims", to_operand, 16);
  int64_t index_vector_dim = attribute_int(op, "index_vector_dim", 0);
  if (!dims_valid(ad, op, "update_window_dims", window, n_window, -1,
                  updates.type.rank) ||
      !dims_valid(ad, op, "inserted_window_dims", inserted, n_inserted, -1,
                  a.type.rank) ||
      !dims_valid(ad, op, "input_batching_dims", input_batching, n_ib, -1,
                  a.type.rank) ||
      n_window + n_inserted + n_ib != a.type.rank) {
    if (!ad->e.status) {
      fail(ad, pcp_make_status(PCP_STATUS_INTERNAL,
                               "stablehlo.scatter at %s: window, inserted and "
                               "batching dims do not cover the operand",
                               op->location));
    }
    return;
  }
  if (operand_active(ad, op, 0)) {
    if (strcmp(kind, "add") == 0) {
      accumulate(ad, op, 0, g);
    } else {
      ref_t zeros = splat_like(ad, 0.0, updates);
      type_t scalar = pcp_autodiff_type_scalar(a.type.element);
      pcp_autodiff_emitter_t* e = &ad->e;
      ref_t out = pcp_autodiff_new_ref(e, &a.type);
      ref_t lhs = pcp_autodiff_new_ref(e, &scalar);
      ref_t rhs = pcp_autodiff_new_ref(e, &scalar);
      pcp_autodiff_emit_f(e, "    %s = \"stablehlo.scatter\"(%s, %s, %s) ({",
                          out.name, g.name, indices.name, zeros.name);
      pcp_autodiff_emit_line_end(e);
      pcp_autodiff_emit_f(e, "    ^bb0(%s: tensor<%s>, %s: tensor<%s>):\n",
                          lhs.name, scalar.element, rhs.name, scalar.element);
      pcp_autodiff_emit_f(
          e, "      \"stablehlo.return\"(%s) : (tensor<%s>) -> ()\n", rhs.name,
          scalar.element);
      const scatter_dims_t dims = {.window = window,
                                   .window_count = n_window,
                                   .inserted = inserted,
                                   .inserted_count = n_inserted,
                                   .input_batching = input_batching,
                                   .input_batching_count = n_ib,
                                   .indices_batching = indices_batching,
                                   .indices_batching_count = n_sb,
                                   .to_operand = to_operand,
                                   .to_operand_count = n_map,
                                   .index_vector_dim = index_vector_dim};
      emit_scatter_attributes(ad, &dims);
      pcp_autodiff_emit_f(e, " : (");
      pcp_autodiff_type_append(e, &g.type);
      pcp_autodiff_emit_f(e, ", ");
      pcp_autodiff_type_append(e, &indices.type);
      pcp_autodiff_emit_f(e, ", ");
      pcp_autodiff_type_append(e, &zeros.type);
      pcp_autodiff_emit_f(e, ") -> ");
      pcp_autodiff_type_append(e, &a.type);
      pcp_autodiff_emit_f(e, "\n");
      accumulate(ad, op, 0, out);
    }
  }
  if (!operand_active(ad, op, 2)) {
    return;
  }
  // The gather reading back what each update wrote: operand dim d's slice
  // size is 1 for inserted and batching dims, else the size of the update
  // window dim that maps to it (window dims map to the remaining operand
  // dims in order).
  int64_t slice_sizes[PCP_MAX_TENSOR_RANK];
  int32_t next_window = 0;
  for (int32_t d = 0; d < a.type.rank; ++d) {
    if (contains(inserted, n_inserted, d) ||
        contains(input_batching, n_ib, d)) {
      slice_sizes[d] = 1;
    } else {
      slice_sizes[d] = updates.type.dims[window[next_window++]];
    }
  }
  char attributes[1024];
  int used = snprintf(attributes, sizeof(attributes),
                      "{dimension_numbers = #stablehlo.gather<");
  const char* separator = "";
  const struct {
    const char* key;
    const int64_t* values;
    int32_t count;
  } fields[] = {{"offset_dims", window, n_window},
                {"collapsed_slice_dims", inserted, n_inserted},
                {"operand_batching_dims", input_batching, n_ib},
                {"start_indices_batching_dims", indices_batching, n_sb},
                {"start_index_map", to_operand, n_map}};
  for (size_t f = 0; f < PCP_ARRAYSIZE(fields); ++f) {
    if (!fields[f].count) {
      continue;
    }
    used += snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                     "%s%s = [", separator, fields[f].key);
    for (int32_t i = 0; i < fields[f].count; ++i) {
      used += snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                       "%s%lld", i ? ", " : "", (long long)fields[f].values[i]);
    }
    used += snprintf(attributes + used, sizeof(attributes) - (size_t)used, "]");
    separator = ", ";
  }
  used += snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                   "%sindex_vector_dim = %lld>, indices_are_sorted = false, "
                   "slice_sizes = array<i64",
                   separator, (long long)index_vector_dim);
  for (int32_t d = 0; d < a.type.rank; ++d) {
    used += snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                     "%s%lld", d ? ", " : ": ", (long long)slice_sizes[d]);
  }
  snprintf(attributes + used, sizeof(attributes) - (size_t)used, ">}");
  ref_t operands[2] = {g, indices};
  accumulate(ad, op, 2,
             pcp_autodiff_emit_op(&ad->e, "stablehlo.gather", operands, 2,
                                  attributes, &updates.type));
}

// d dynamic_slice(a, i...) = dynamic_update_slice(zeros(a), g, i...)
static void rule_dynamic_slice(ad_t* ad, const pcp_mlir_op_t* op, ref_t g,
                               ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  ref_t operands[PCP_MAX_TENSOR_RANK + 2];
  operands[0] = splat_like(ad, 0.0, a);
  operands[1] = g;
  for (uint32_t i = 1; i < op->operand_count && i <= PCP_MAX_TENSOR_RANK; ++i) {
    operands[i + 1] = operand(ad, op, i);
  }
  accumulate(
      ad, op, 0,
      pcp_autodiff_emit_op(&ad->e, "stablehlo.dynamic_update_slice", operands,
                           (int32_t)op->operand_count + 1, "", &a.type));
}

// d dynamic_update_slice(a, u, i...) = (DUS(g, zeros(u), i...),
//                                       dynamic_slice(g, i..., shape(u)))
static void rule_dynamic_update_slice(ad_t* ad, const pcp_mlir_op_t* op,
                                      ref_t g, ref_t y) {
  (void)y;
  ref_t update = operand(ad, op, 1);
  ref_t operands[PCP_MAX_TENSOR_RANK + 2];
  operands[0] = g;
  operands[1] = splat_like(ad, 0.0, update);
  for (uint32_t i = 2; i < op->operand_count && i < PCP_MAX_TENSOR_RANK + 2;
       ++i) {
    operands[i] = operand(ad, op, i);
  }
  if (operand_active(ad, op, 0)) {
    accumulate(
        ad, op, 0,
        pcp_autodiff_emit_op(&ad->e, "stablehlo.dynamic_update_slice", operands,
                             (int32_t)op->operand_count, "", &g.type));
  }
  if (operand_active(ad, op, 1)) {
    char attributes[512];
    int used =
        snprintf(attributes, sizeof(attributes), "{slice_sizes = array<i64");
    for (int32_t d = 0; d < update.type.rank; ++d) {
      used +=
          snprintf(attributes + used, sizeof(attributes) - (size_t)used,
                   "%s%lld", d ? ", " : ": ", (long long)update.type.dims[d]);
    }
    snprintf(attributes + used, sizeof(attributes) - (size_t)used, ">}");
    operands[1] = g;
    accumulate(ad, op, 1,
               pcp_autodiff_emit_op(
                   &ad->e, "stablehlo.dynamic_slice", operands + 1,
                   (int32_t)op->operand_count - 1, attributes, &update.type));
  }
}

// d atan2(a, b) = (g*b/(a^2+b^2), -g*a/(a^2+b^2))
static void rule_atan2(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  ref_t b = operand(ad, op, 1);
  ref_t g_over =
      pcp_autodiff_binary(&ad->e, "stablehlo.divide", g,
                          pcp_autodiff_binary(&ad->e, "stablehlo.add",
                                              mul(ad, a, a), mul(ad, b, b)));
  if (operand_active(ad, op, 0)) {
    accumulate(ad, op, 0, mul(ad, g_over, b));
  }
  if (operand_active(ad, op, 1)) {
    accumulate(
        ad, op, 1,
        pcp_autodiff_unary(&ad->e, "stablehlo.negate", mul(ad, g_over, a)));
  }
}

// d tan(a) = g*(1+y^2)
static void rule_tan(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  accumulate(ad, op, 0,
             mul(ad, g,
                 pcp_autodiff_binary(&ad->e, "stablehlo.add",
                                     splat_like(ad, 1.0, y), mul(ad, y, y))));
}

// d erf(a) = g*(2/sqrt(pi))*exp(-a^2)
static void rule_erf(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t a = operand(ad, op, 0);
  ref_t bell = pcp_autodiff_unary(
      &ad->e, "stablehlo.exponential",
      pcp_autodiff_unary(&ad->e, "stablehlo.negate", mul(ad, a, a)));
  accumulate(ad, op, 0, mul(ad, mul_scalar(ad, g, 1.1283791670955126), bell));
}

// clamp(lo, x, hi): g to x where lo <= x <= hi, to lo where x < lo, to hi
// where x > hi (summed when lo or hi is a scalar).
static void rule_clamp(ad_t* ad, const pcp_mlir_op_t* op, ref_t g, ref_t y) {
  (void)y;
  ref_t x = operand(ad, op, 1);
  ref_t bounds[2] = {operand(ad, op, 0), operand(ad, op, 2)};
  ref_t full[2];
  for (int i = 0; i < 2; ++i) {
    full[i] = bounds[i].type.rank == x.type.rank
                  ? bounds[i]
                  : pcp_autodiff_broadcast(&ad->e, bounds[i], NULL, &x.type);
  }
  ref_t zero = splat_like(ad, 0.0, g);
  ref_t below = pcp_autodiff_compare(&ad->e, "LT", x, full[0]);
  ref_t above = pcp_autodiff_compare(&ad->e, "GT", x, full[1]);
  if (operand_active(ad, op, 1)) {
    accumulate(
        ad, op, 1,
        pcp_autodiff_select(&ad->e, below, zero,
                            pcp_autodiff_select(&ad->e, above, zero, g)));
  }
  ref_t picked[2] = {below, above};
  uint32_t index[2] = {0, 2};
  for (int i = 0; i < 2; ++i) {
    if (operand_active(ad, op, index[i])) {
      ref_t part = pcp_autodiff_select(&ad->e, picked[i], g, zero);
      if (bounds[i].type.rank != x.type.rank) {
        part = pcp_autodiff_sum_all(&ad->e, part);
      }
      accumulate(ad, op, index[i], part);
    }
  }
}

typedef struct rule_entry_t {
  const char* name;
  vjp_rule_t rule;
} rule_entry_t;

static const rule_entry_t kRules[] = {
    {"stablehlo.add", rule_add},
    {"stablehlo.subtract", rule_subtract},
    {"stablehlo.multiply", rule_multiply},
    {"stablehlo.divide", rule_divide},
    {"stablehlo.negate", rule_negate},
    {"stablehlo.exponential", rule_exponential},
    {"stablehlo.exponential_minus_one", rule_expm1},
    {"stablehlo.log", rule_log},
    {"stablehlo.log_plus_one", rule_log1p},
    {"stablehlo.tanh", rule_tanh},
    {"stablehlo.logistic", rule_logistic},
    {"stablehlo.rsqrt", rule_rsqrt},
    {"stablehlo.sqrt", rule_sqrt},
    {"stablehlo.power", rule_power},
    {"stablehlo.maximum", rule_maximum},
    {"stablehlo.minimum", rule_minimum},
    {"stablehlo.abs", rule_abs},
    {"stablehlo.sine", rule_sine},
    {"stablehlo.cosine", rule_cosine},
    {"stablehlo.transpose", rule_transpose},
    {"stablehlo.reshape", rule_reshape},
    {"stablehlo.convert", rule_convert},
    {"stablehlo.broadcast_in_dim", rule_broadcast_in_dim},
    {"stablehlo.reduce", rule_reduce},
    {"stablehlo.dot_general", rule_dot_general},
    {"stablehlo.select", rule_select},
    {"stablehlo.slice", rule_slice},
    {"stablehlo.pad", rule_pad},
    {"stablehlo.concatenate", rule_concatenate},
    {"stablehlo.gather", rule_gather},
    {"stablehlo.scatter", rule_scatter},
    {"stablehlo.dynamic_slice", rule_dynamic_slice},
    {"stablehlo.dynamic_update_slice", rule_dynamic_update_slice},
    {"stablehlo.optimization_barrier", rule_identity},
    {"stablehlo.atan2", rule_atan2},
    {"stablehlo.tan", rule_tan},
    {"chlo.erf", rule_erf},
    {"stablehlo.clamp", rule_clamp},
};

static vjp_rule_t find_rule(const char* name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kRules); ++i) {
    if (strcmp(kRules[i].name, name) == 0) {
      return kRules[i].rule;
    }
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// Inlining func.call
//===----------------------------------------------------------------------===//

// JAX exports call private helpers (@_where, @_one_hot) and torch-mlir ones
// may too. The autodiff works on one flat function, so calls are inlined
// first: the callee's ops are copied in place with its arguments bound to the
// call's operands and the call's results bound to what its func.return
// returns. The flat body borrows every string from the walked bodies, which
// stay alive in |callees|.

#define MAX_INLINE_DEPTH 32

typedef struct flat_t {
  pcp_allocator_t allocator;
  pcp_mlir_module_t* module;
  pcp_mlir_function_body_t body;  // arrays owned here; strings borrowed
  size_t value_capacity, op_capacity, block_capacity, operand_capacity;
  pcp_mlir_function_body_t* callees;
  char** callee_names;
  size_t callee_count, callee_capacity;
  uint32_t** maps;
  size_t map_count, map_capacity;
} flat_t;

static pcp_status_t flat_grow(pcp_allocator_t allocator, void** items,
                              size_t* capacity, size_t needed,
                              size_t item_size) {
  if (needed <= *capacity) {
    return pcp_ok_status();
  }
  size_t new_capacity = *capacity ? *capacity * 2 : 64;
  while (new_capacity < needed) {
    new_capacity *= 2;
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(allocator, new_capacity * item_size, items));
  *capacity = new_capacity;
  return pcp_ok_status();
}

static pcp_status_t flat_new_map(flat_t* f, size_t count, uint32_t** out) {
  PCP_RETURN_IF_ERROR_BARE(flat_grow(f->allocator, (void**)&f->maps,
                                     &f->map_capacity, f->map_count + 1,
                                     sizeof(uint32_t*)));
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      f->allocator, (count ? count : 1) * sizeof(uint32_t), (void**)out));
  f->maps[f->map_count++] = *out;
  return pcp_ok_status();
}

static pcp_status_t flat_new_value(flat_t* f, const pcp_mlir_type_t* type,
                                   uint32_t* out_id) {
  PCP_RETURN_IF_ERROR_BARE(
      flat_grow(f->allocator, (void**)&f->body.values, &f->value_capacity,
                f->body.value_count + 1, sizeof(pcp_mlir_type_t)));
  *out_id = (uint32_t)f->body.value_count;
  f->body.values[f->body.value_count++] = *type;
  return pcp_ok_status();
}

static pcp_status_t flat_callee(flat_t* f, const char* name,
                                const pcp_mlir_function_body_t** out) {
  for (size_t i = 0; i < f->callee_count; ++i) {
    if (strcmp(f->callee_names[i], name) == 0) {
      *out = &f->callees[i];
      return pcp_ok_status();
    }
  }
  // Pending work points into callee bodies, so the array never moves: a
  // fixed capacity instead of growth.
  if (f->callee_count == f->callee_capacity) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "more than %zu distinct called functions",
                           f->callee_capacity);
  }
  size_t length = strlen(name);
  char* copy = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(f->allocator, length + 1, (void**)&copy));
  memcpy(copy, name, length + 1);
  pcp_status_t status = pcp_mlir_module_function_body(
      f->module, name, f->allocator, &f->callees[f->callee_count]);
  if (status) {
    pcp_allocator_free(f->allocator, copy);
    return status;
  }
  f->callee_names[f->callee_count] = copy;
  *out = &f->callees[f->callee_count++];
  return pcp_ok_status();
}

typedef struct pending_t {
  size_t dst_op;
  const pcp_mlir_function_body_t* src;
  const pcp_mlir_op_t* op;
  uint32_t* map;
} pending_t;

typedef struct pending_list_t {
  pending_t* items;
  size_t count, capacity;
} pending_list_t;

// Binds a callee's func.return to the call's results.
typedef struct return_binding_t {
  uint32_t* caller_map;
  uint32_t first_result;
  uint32_t result_count;
} return_binding_t;

static pcp_status_t flat_fill_block(flat_t* f,
                                    const pcp_mlir_function_body_t* src,
                                    const pcp_mlir_block_t* block,
                                    uint32_t* map, size_t dst_block, int depth);

// Appends |block|'s ops (calls expanded) to the current dst block.
static pcp_status_t flat_append_ops(flat_t* f,
                                    const pcp_mlir_function_body_t* src,
                                    const pcp_mlir_block_t* block,
                                    uint32_t* map,
                                    const return_binding_t* binding,
                                    pending_list_t* pending, int depth) {
  for (uint32_t k = 0; k < block->op_count; ++k) {
    const pcp_mlir_op_t* op = &src->ops[block->first_op + k];
    const uint32_t* operands = &src->operands[op->first_operand];
    if (binding && strcmp(op->name, "func.return") == 0) {
      for (uint32_t r = 0; r < op->operand_count && r < binding->result_count;
           ++r) {
        binding->caller_map[binding->first_result + r] = map[operands[r]];
      }
      continue;
    }
    if (strcmp(op->name, "func.call") == 0) {
      const char* at = strstr(op->properties, "callee = @");
      if (!at) {
        at = strstr(op->attributes, "callee = @");
      }
      if (!at || depth >= MAX_INLINE_DEPTH) {
        return pcp_make_status(
            PCP_STATUS_UNIMPLEMENTED, "func.call at %s: cannot inline (%s)",
            op->location, at ? "calls nested too deep" : "no callee");
      }
      at += strlen("callee = @");
      char name[256];
      size_t n = 0;
      if (*at == '"') {
        ++at;
      }
      while (at[n] && at[n] != '"' && at[n] != '}' && at[n] != ',' &&
             at[n] != ' ' && at[n] != '>' && n + 1 < sizeof(name)) {
        ++n;
      }
      memcpy(name, at, n);
      name[n] = 0;
      const pcp_mlir_function_body_t* callee = NULL;
      PCP_RETURN_IF_ERROR(flat_callee(f, name, &callee), "inlining @%s at %s",
                          name, op->location);
      uint32_t* callee_map = NULL;
      PCP_RETURN_IF_ERROR_BARE(
          flat_new_map(f, callee->value_count, &callee_map));
      const pcp_mlir_block_t* entry = &callee->blocks[0];
      if (entry->argument_count != op->operand_count) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "func.call at %s: @%s takes %u arguments, "
                               "given %u",
                               op->location, name, entry->argument_count,
                               op->operand_count);
      }
      for (uint32_t i = 0; i < entry->argument_count; ++i) {
        callee_map[entry->first_argument + i] = map[operands[i]];
      }
      return_binding_t inner = {map, op->first_result, op->result_count};
      PCP_RETURN_IF_ERROR_BARE(flat_append_ops(f, callee, entry, callee_map,
                                               &inner, pending, depth + 1));
      continue;
    }
    PCP_RETURN_IF_ERROR_BARE(flat_grow(f->allocator, (void**)&f->body.ops,
                                       &f->op_capacity, f->body.op_count + 1,
                                       sizeof(pcp_mlir_op_t)));
    PCP_RETURN_IF_ERROR_BARE(
        flat_grow(f->allocator, (void**)&f->body.operands, &f->operand_capacity,
                  f->body.operand_count + op->operand_count, sizeof(uint32_t)));
    pcp_mlir_op_t copy = *op;
    copy.first_operand = (uint32_t)f->body.operand_count;
    for (uint32_t i = 0; i < op->operand_count; ++i) {
      f->body.operands[f->body.operand_count++] = map[operands[i]];
    }
    copy.first_result = (uint32_t)f->body.value_count;
    for (uint32_t r = 0; r < op->result_count; ++r) {
      uint32_t id = 0;
      PCP_RETURN_IF_ERROR_BARE(
          flat_new_value(f, &src->values[op->first_result + r], &id));
      map[op->first_result + r] = id;
    }
    copy.region_count = op->region_count;
    copy.first_block = 0;
    size_t dst_op = f->body.op_count;
    f->body.ops[f->body.op_count++] = copy;
    if (op->region_count) {
      PCP_RETURN_IF_ERROR_BARE(flat_grow(f->allocator, (void**)&pending->items,
                                         &pending->capacity, pending->count + 1,
                                         sizeof(pending_t)));
      pending->items[pending->count++] = (pending_t){dst_op, src, op, map};
    }
  }
  return pcp_ok_status();
}

static pcp_status_t flat_fill_block(flat_t* f,
                                    const pcp_mlir_function_body_t* src,
                                    const pcp_mlir_block_t* block,
                                    uint32_t* map, size_t dst_block,
                                    int depth) {
  pcp_mlir_block_t info = {0};
  info.argument_count = block->argument_count;
  info.first_argument = (uint32_t)f->body.value_count;
  for (uint32_t a = 0; a < block->argument_count; ++a) {
    uint32_t id = 0;
    PCP_RETURN_IF_ERROR_BARE(
        flat_new_value(f, &src->values[block->first_argument + a], &id));
    map[block->first_argument + a] = id;
  }
  info.first_op = (uint32_t)f->body.op_count;
  pending_list_t pending = {0};
  pcp_status_t status =
      flat_append_ops(f, src, block, map, NULL, &pending, depth);
  info.op_count = (uint32_t)(f->body.op_count - info.first_op);
  f->body.blocks[dst_block] = info;
  for (size_t p = 0; p < pending.count && !status; ++p) {
    const pending_t* item = &pending.items[p];
    size_t first = f->body.block_count;
    status =
        flat_grow(f->allocator, (void**)&f->body.blocks, &f->block_capacity,
                  first + item->op->region_count, sizeof(pcp_mlir_block_t));
    if (status) {
      break;
    }
    f->body.block_count += item->op->region_count;
    f->body.ops[item->dst_op].first_block = (uint32_t)first;
    for (uint32_t r = 0; r < item->op->region_count && !status; ++r) {
      status = flat_fill_block(f, item->src,
                               &item->src->blocks[item->op->first_block + r],
                               item->map, first + r, depth);
    }
  }
  pcp_allocator_free(f->allocator, pending.items);
  return status;
}

static void flat_deinitialize(flat_t* f) {
  pcp_allocator_free(f->allocator, f->body.values);
  pcp_allocator_free(f->allocator, f->body.ops);
  pcp_allocator_free(f->allocator, f->body.blocks);
  pcp_allocator_free(f->allocator, f->body.operands);
  for (size_t i = 0; i < f->callee_count; ++i) {
    pcp_mlir_function_body_deinitialize(&f->callees[i]);
    pcp_allocator_free(f->allocator, f->callee_names[i]);
  }
  pcp_allocator_free(f->allocator, f->callees);
  pcp_allocator_free(f->allocator, f->callee_names);
  for (size_t i = 0; i < f->map_count; ++i) {
    pcp_allocator_free(f->allocator, f->maps[i]);
  }
  pcp_allocator_free(f->allocator, f->maps);
}

// Flattens |src| (the body of the forward function) into |f->body|.
static pcp_status_t flat_build(flat_t* f, const pcp_mlir_function_body_t* src) {
  f->callee_capacity = 256;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      f->allocator, f->callee_capacity * sizeof(pcp_mlir_function_body_t),
      (void**)&f->callees));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(f->allocator, f->callee_capacity * sizeof(char*),
                           (void**)&f->callee_names));
  uint32_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(flat_new_map(f, src->value_count, &map));
  PCP_RETURN_IF_ERROR_BARE(flat_grow(f->allocator, (void**)&f->body.blocks,
                                     &f->block_capacity, 1,
                                     sizeof(pcp_mlir_block_t)));
  f->body.block_count = 1;
  f->body.allocator = f->allocator;
  return flat_fill_block(f, src, &src->blocks[0], map, 0, 0);
}

//===----------------------------------------------------------------------===//
// The gradient function
//===----------------------------------------------------------------------===//

// Marks values that are floats depending on a parameter.
static void propagate_activity(ad_t* ad, size_t param_count) {
  const pcp_mlir_function_body_t* body = ad->body;
  for (size_t i = 0; i < param_count; ++i) {
    ad->active[i] = value_is_float(ad, (uint32_t)i);
  }
  const pcp_mlir_block_t* entry = &body->blocks[0];
  for (uint32_t k = 0; k < entry->op_count; ++k) {
    const pcp_mlir_op_t* op = &body->ops[entry->first_op + k];
    if (is_non_differentiable(op->name)) {
      continue;
    }
    bool any = false;
    for (uint32_t i = 0; i < op->operand_count; ++i) {
      any = any || ad->active[operand_id(ad, op, i)];
    }
    for (uint32_t r = 0; any && r < op->result_count; ++r) {
      uint32_t id = op->first_result + r;
      ad->active[id] = value_is_float(ad, id);
    }
  }
}

// Emits the adjoint code; on return the adjoints of the parameters are set
// (or absent when no gradient reaches them). |loss_id| is the loss value.
static void emit_backward(ad_t* ad, uint32_t loss_id) {
  const pcp_mlir_function_body_t* body = ad->body;
  if (!ad->active[loss_id]) {
    return;  // the loss does not depend on any parameter
  }
  ref_t loss = value_ref(ad, loss_id);
  ad->adjoints[loss_id] = splat_like(ad, 1.0, loss);
  ad->has_adjoint[loss_id] = true;
  const pcp_mlir_block_t* entry = &body->blocks[0];
  for (uint32_t k = entry->op_count; k-- > 0 && !ad->e.status;) {
    const pcp_mlir_op_t* op = &body->ops[entry->first_op + k];
    if (op->result_count == 0 || is_non_differentiable(op->name)) {
      continue;
    }
    bool flows = false;
    for (uint32_t r = 0; r < op->result_count; ++r) {
      flows = flows || ad->has_adjoint[op->first_result + r];
    }
    bool any_active = false;
    for (uint32_t i = 0; i < op->operand_count; ++i) {
      any_active = any_active || ad->active[operand_id(ad, op, i)];
    }
    if (!flows || !any_active) {
      continue;
    }
    vjp_rule_t rule = find_rule(op->name);
    if (!rule || op->result_count != 1) {
      fail(ad, pcp_make_status(
                   PCP_STATUS_UNIMPLEMENTED,
                   "no VJP rule for %s at %s: its gradient would be lost "
                   "(docs/autodiff.md lists the supported ops)",
                   op->name, op->location));
      return;
    }
    uint32_t result = op->first_result;
    // Every op the rule emits is traced back to this user op.
    pcp_autodiff_origin_set(&ad->e, op->location, op->name, "gradient");
    rule(ad, op, ad->adjoints[result], value_ref(ad, result));
    ad->e.origin[0] = 0;
  }
}

static void emit_signature_args(ad_t* ad, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    pcp_autodiff_emit_f(&ad->e, "%s%s: %s", i ? ", " : "", ad->names[i],
                        ad->body->values[i].spelling);
  }
}

typedef struct forward_info_t {
  size_t argument_count;
  size_t param_count;
  uint32_t loss_id;
} forward_info_t;

static pcp_status_t check_forward(const pcp_mlir_function_body_t* body,
                                  size_t argument_count,
                                  int32_t data_argument_count,
                                  forward_info_t* out_info) {
  const pcp_mlir_block_t* entry = &body->blocks[0];
  const pcp_mlir_op_t* ret =
      entry->op_count ? &body->ops[entry->first_op + entry->op_count - 1]
                      : NULL;
  if (!ret || strcmp(ret->name, "func.return") != 0 ||
      ret->operand_count != 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a forward-loss function returns exactly one "
                           "value (the loss)");
  }
  uint32_t loss_id = body->operands[ret->first_operand];
  const pcp_mlir_type_t* loss = &body->values[loss_id];
  if (loss->kind != PCP_MLIR_TYPE_KIND_RANKED_TENSOR || loss->rank != 0 ||
      !(strcmp(loss->element_spelling, "f32") == 0 ||
        strcmp(loss->element_spelling, "f64") == 0 ||
        strcmp(loss->element_spelling, "f16") == 0 ||
        strcmp(loss->element_spelling, "bf16") == 0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the loss must be a rank-0 float tensor, got %s",
                           loss->spelling);
  }
  size_t data_count = 0;
  if (data_argument_count >= 0) {
    data_count = (size_t)data_argument_count;
  } else {
    while (data_count < argument_count) {
      const pcp_mlir_type_t* t = &body->values[argument_count - 1 - data_count];
      bool is_float = strcmp(t->element_spelling, "f32") == 0 ||
                      strcmp(t->element_spelling, "f64") == 0 ||
                      strcmp(t->element_spelling, "f16") == 0 ||
                      strcmp(t->element_spelling, "bf16") == 0;
      if (is_float) {
        break;
      }
      ++data_count;
    }
  }
  if (data_count > argument_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%zu data arguments but the function has %zu",
                           data_count, argument_count);
  }
  for (size_t i = 0; i < argument_count; ++i) {
    type_t type;
    if (!mlir_type_to_type(&body->values[i], &type)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "argument %zu has type %s; training needs static "
                             "ranked tensors",
                             i, body->values[i].spelling);
    }
  }
  out_info->argument_count = argument_count;
  out_info->param_count = argument_count - data_count;
  out_info->loss_id = loss_id;
  return pcp_ok_status();
}

static pcp_status_t ad_initialize(ad_t* ad,
                                  const pcp_mlir_function_body_t* body,
                                  pcp_allocator_t allocator,
                                  pcp_string_builder_t* out) {
  memset(ad, 0, sizeof(*ad));
  ad->body = body;
  ad->allocator = allocator;
  ad->e.out = out;
  size_t n = body->value_count ? body->value_count : 1;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, n * sizeof(ad->names[0]), (void**)&ad->names));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, n, (void**)&ad->active));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, n, (void**)&ad->has_adjoint));
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(allocator, n * sizeof(ref_t),
                                                (void**)&ad->adjoints));
  for (size_t i = 0; i < body->value_count; ++i) {
    snprintf(ad->names[i], sizeof(ad->names[i]), "%%v%zu", i);
  }
  for (size_t k = 0; k < body->op_count; ++k) {
    const pcp_mlir_op_t* op = &body->ops[k];
    for (uint32_t r = 0; op->result_count > 1 && r < op->result_count; ++r) {
      snprintf(ad->names[op->first_result + r], sizeof(ad->names[0]),
               "%%m%u#%u", op->first_result, r);
    }
  }
  return pcp_ok_status();
}

static void ad_deinitialize(ad_t* ad) {
  pcp_allocator_free(ad->allocator, ad->names);
  pcp_allocator_free(ad->allocator, ad->active);
  pcp_allocator_free(ad->allocator, ad->has_adjoint);
  pcp_allocator_free(ad->allocator, ad->adjoints);
}

// @main(params..., data...) -> loss, re-emitted.
static void emit_forward_function(ad_t* ad, const forward_info_t* info) {
  pcp_autodiff_emit_f(&ad->e, "  func.func @main(");
  emit_signature_args(ad, info->argument_count);
  pcp_autodiff_emit_f(&ad->e, ") -> %s {\n",
                      ad->body->values[info->loss_id].spelling);
  emit_block_ops(ad, &ad->body->blocks[0], true, "    ");
  pcp_autodiff_emit_f(&ad->e, "    \"func.return\"(%s) : (%s) -> ()\n  }\n",
                      ad->names[info->loss_id],
                      ad->body->values[info->loss_id].spelling);
}

// @compute_gradients(params..., data...) -> (loss, dparams...)
static void emit_gradient_function(ad_t* ad, const forward_info_t* info) {
  const pcp_mlir_function_body_t* body = ad->body;
  pcp_autodiff_emit_f(&ad->e, "  func.func @compute_gradients(");
  emit_signature_args(ad, info->argument_count);
  pcp_autodiff_emit_f(&ad->e, ") -> (%s", body->values[info->loss_id].spelling);
  for (size_t i = 0; i < info->param_count; ++i) {
    pcp_autodiff_emit_f(&ad->e, ", %s", body->values[i].spelling);
  }
  pcp_autodiff_emit_f(&ad->e, ") {\n");
  emit_block_ops(ad, &body->blocks[0], true, "    ");
  emit_backward(ad, info->loss_id);
  for (size_t i = 0; i < info->param_count; ++i) {
    if (!ad->has_adjoint[i]) {
      // No gradient reaches this parameter (or it is not a float).
      ad->adjoints[i] = splat_like(ad, 0.0, value_ref(ad, (uint32_t)i));
      ad->has_adjoint[i] = true;
    }
  }
  pcp_autodiff_emit_f(&ad->e, "    \"func.return\"(%s",
                      ad->names[info->loss_id]);
  for (size_t i = 0; i < info->param_count; ++i) {
    pcp_autodiff_emit_f(&ad->e, ", %s", ad->adjoints[i].name);
  }
  pcp_autodiff_emit_f(&ad->e, ") : (%s", body->values[info->loss_id].spelling);
  for (size_t i = 0; i < info->param_count; ++i) {
    pcp_autodiff_emit_f(&ad->e, ", %s", body->values[i].spelling);
  }
  pcp_autodiff_emit_f(&ad->e, ") -> ()\n  }\n");
}

void pcp_compile_training_options_initialize(
    pcp_compile_training_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->program = PCP_COMPILE_PROGRAM_GRAD;
  out_options->data_argument_count = -1;
  out_options->beta1 = 0.9;
  out_options->beta2 = 0.999;
  out_options->epsilon = 1e-8;
  out_options->weight_decay = 0.01;
  out_options->max_grad_norm = 1.0;
}

static pcp_status_t build_text(pcp_mlir_module_t* module,
                               const pcp_compile_training_options_t* options,
                               pcp_allocator_t allocator,
                               pcp_string_builder_t* out) {
  pcp_mlir_function_signature_t signature;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_module_function_signature(
      module, options->function_name, allocator, &signature));
  size_t argument_count = signature.argument_count;
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_function_body_t walked;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_module_function_body(
      module, options->function_name, allocator, &walked));
  flat_t flat;
  memset(&flat, 0, sizeof(flat));
  flat.allocator = allocator;
  flat.module = module;
  pcp_status_t status = flat_build(&flat, &walked);
  const pcp_mlir_function_body_t* body = &flat.body;
  forward_info_t info = {0};
  if (!status) {
    status = check_forward(body, argument_count, options->data_argument_count,
                           &info);
  }
  ad_t ad;
  if (!status) {
    status = ad_initialize(&ad, body, allocator, out);
    if (!status) {
      propagate_activity(&ad, info.param_count);
      pcp_autodiff_emit_f(&ad.e, "module {\n");
      emit_forward_function(&ad, &info);
      emit_gradient_function(&ad, &info);
      bool accumulates = options->accumulation_steps > 1;
      if (options->program == PCP_COMPILE_PROGRAM_TRAIN ||
          options->program == PCP_COMPILE_PROGRAM_DILOCO || accumulates) {
        pcp_autodiff_training_signature_t training = {
            .argument_count = info.argument_count,
            .param_count = info.param_count,
        };
        type_t* arguments = NULL;
        pcp_status_t alloc_status = pcp_allocator_calloc(
            allocator, (info.argument_count + 1) * sizeof(type_t),
            (void**)&arguments);
        if (alloc_status) {
          fail(&ad, alloc_status);
        }
        for (size_t i = 0; i < info.argument_count && !ad.e.status; ++i) {
          arguments[i] = value_ref(&ad, (uint32_t)i).type;
        }
        training.arguments = arguments;
        training.loss = value_ref(&ad, info.loss_id).type;
        if (!ad.e.status && accumulates) {
          pcp_autodiff_emit_gradients_accumulated(&ad.e, &training, options);
        }
        if (!ad.e.status && options->program != PCP_COMPILE_PROGRAM_GRAD) {
          pcp_autodiff_emit_optimizer(&ad.e, &training, options);
          if (options->inner_steps > 0) {
            pcp_autodiff_emit_train_steps(&ad.e, &training, options);
          }
          if (options->program == PCP_COMPILE_PROGRAM_DILOCO) {
            pcp_autodiff_emit_diloco_round(&ad.e, &training, options);
          }
        }
        pcp_allocator_free(allocator, arguments);
      }
      pcp_autodiff_emit_f(&ad.e, "}\n");
      status = ad.e.status;
      ad.e.status = pcp_ok_status();
    }
    ad_deinitialize(&ad);
  }
  flat_deinitialize(&flat);
  pcp_mlir_function_body_deinitialize(&walked);
  return status;
}

pcp_status_t pcp_compile_training_module_build(
    const char* mlir_text, size_t mlir_byte_length, const char* source_name,
    const pcp_compile_training_options_t* options, pcp_allocator_t allocator,
    char** out_text, size_t* out_byte_length) {
  *out_text = NULL;
  *out_byte_length = 0;
  pcp_compile_training_options_t defaults;
  if (!options) {
    pcp_compile_training_options_initialize(&defaults);
    options = &defaults;
  }
  if (options->inner_steps < 0 || options->inner_steps > 4096) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inner steps must be within 0..4096, got %d",
                           options->inner_steps);
  }
  if (options->accumulation_steps < 0 ||
      options->accumulation_steps > PCP_COMPILE_MAX_ACCUMULATION_STEPS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "accumulation steps must be within 0..%d (0 or 1: "
                           "none), got %lld",
                           PCP_COMPILE_MAX_ACCUMULATION_STEPS,
                           (long long)options->accumulation_steps);
  }
  if (options->program != PCP_COMPILE_PROGRAM_DILOCO &&
      options->inner_state != PCP_COMPILE_INNER_STATE_RESET) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a kept inner state is a property of the diloco "
                           "program's round (@train_steps always takes and "
                           "returns the state)");
  }
  if (options->program == PCP_COMPILE_PROGRAM_DILOCO) {
    if (options->inner_steps < 1) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "the diloco program needs inner steps >= 1");
    }
    if (options->inner_state != PCP_COMPILE_INNER_STATE_RESET &&
        options->inner_state != PCP_COMPILE_INNER_STATE_KEEP) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "inner state must be reset (0) or keep (1), got "
                             "%d",
                             (int)options->inner_state);
    }
    if (options->delta_element && options->delta_element[0] &&
        strcmp(options->delta_element, "f32") != 0 &&
        strcmp(options->delta_element, "bf16") != 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "delta element type must be f32 or bf16, got "
                             "'%s'",
                             options->delta_element);
    }
  }
  pcp_mlir_context_t* context = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_context_create(NULL, allocator, &context));
  pcp_mlir_module_t* module = NULL;
  pcp_status_t status = pcp_mlir_module_parse(
      context, mlir_text, mlir_byte_length, source_name, &module);
  pcp_string_builder_t out;
  pcp_string_builder_initialize(allocator, PCP_COMPILE_MAX_MLIR_BYTES, &out);
  if (!status) {
    status = build_text(module, options, allocator, &out);
  }
  if (!status) {
    // dense_resource constants (torch-mlir's weights) refer to blobs in the
    // file-metadata section; the derived ops keep the references, so the
    // derived module carries the section too.
    status = pcp_mlir_module_print_resources(module, &out);
  }
  if (!status) {
    *out_byte_length = out.size;
    status = pcp_string_builder_take(&out, out_text);
  }
  pcp_string_builder_deinitialize(&out);
  pcp_mlir_module_release(module);
  pcp_mlir_context_release(context);
  return status;
}
