// SPDX-License-Identifier: Apache-2.0
// StableHLO text emitters for the built-in architectures.
//
// The emitter writes pretty-form StableHLO line by line, one SSA value per
// op, tracking each value's shape so that every type annotation is computed,
// never hand-written. Hidden states are kept as [N, D] with N = B * T, so a
// linear layer is one dot_general contracting the last dims of x [N, in] and
// W [out, in] (torch's nn.Linear layout: no transposes of the weights).
// Attention reshapes to [B, T, H, hd] and transposes to [B, H, T, hd].
//
// Op set (autodiff needs a rule for each op on a parameter's path; iota and
// compare only build masks and one-hots, off every gradient path):
// add, subtract, multiply, divide, maximum, negate, exponential, log, rsqrt,
// tanh, logistic, sine, cosine, convert, reshape, transpose, broadcast_in_dim,
// reduce (add, max), dot_general, gather, slice, concatenate, select,
// constant, iota, compare.

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/models.h"
#include "models/models_impl.h"

#define MAX_RANK 5

typedef struct val_t {
  char name[PCP_MODELS_MAX_NAME_LENGTH + 2];
  int rank;
  int64_t dims[MAX_RANK];
  pcp_element_type_t et;
} val_t;

typedef struct emitter_t {
  pcp_string_builder_t* builder;
  pcp_status_t status;  // first failure; later appends are skipped
  int64_t next_id;
  const pcp_models_spec_t* spec;
  pcp_element_type_t adt;  // activation (and parameter) dtype
  int64_t b, t, n, d, h, kv, hd, f, v;
  // Per-function values built once and reused by every layer.
  val_t causal_mask;  // [B, H, T, T] i1, true where key <= query
  val_t neg_inf;      // [B, H, T, T] f32
  val_t rope_cos;     // [T, hd/2] f32
  val_t rope_sin;
  // Generation functions (@prefill / @decode): t is the chunk length S, the
  // KV cache [layers, B, KV, L, hd] is read and written per layer, and
  // positions are per slot instead of 0..T-1.
  bool gen;
  int64_t max_len;    // L
  int64_t layer;      // next layer attention() handles
  val_t gen_pos;      // [B, S] i32: absolute position of each query
  val_t gen_onehot;   // [B, S, L] adt: query s writes cache row l
  val_t gen_written;  // [B, KV, L, hd] i1: rows this call writes
  val_t gen_allowed;  // [B, KV, G, S, L] i1: key l visible to query s
  val_t gen_neg_inf;  // [B, KV, G, S, L] f32
  val_t k_cache_in, v_cache_in;    // [layers, B, KV, L, hd]
  val_t k_cache_out, v_cache_out;  // concatenation of the layers so far
  // @decode writes only its rows (scatter) into a cache tied to its
  // argument, so the cache is updated in place (docs/decisions.md, "@decode
  // updates the KV cache in place"); @prefill keeps the one-hot rewrite.
  bool decode_rows;
  val_t gen_row_tail;  // [B, KV, 3] i32: (slot, kv head, row) per update
} emitter_t;

//===----------------------------------------------------------------------===//
// Text helpers
//===----------------------------------------------------------------------===//

// Appends one indented line unless an earlier append failed. A macro rather
// than a va_list helper: the builder formats straight into its buffer.
#define EMIT_LINE(e, fmt, ...)                                                 \
  do {                                                                         \
    if (!(e)->status) {                                                        \
      (e)->status = pcp_string_builder_append_f((e)->builder, "    " fmt "\n", \
                                                __VA_ARGS__);                  \
    }                                                                          \
  } while (0)

// "tensor<2x3xf32>", "tensor<f32>".
static void type_of(const val_t* v, char out[128]) {
  size_t used = (size_t)snprintf(out, 128, "tensor<");
  for (int i = 0; i < v->rank; ++i) {
    used += (size_t)snprintf(out + used, 128 - used, "%lldx",
                             (long long)v->dims[i]);
  }
  snprintf(out + used, 128 - used, "%s>", pcp_element_type_name(v->et));
}

static val_t fresh(emitter_t* e, int rank, const int64_t* dims,
                   pcp_element_type_t et) {
  PCP_ASSERT(rank >= 0 && rank <= MAX_RANK);
  val_t v;
  memset(&v, 0, sizeof(v));
  snprintf(v.name, sizeof(v.name), "%%%lld", (long long)e->next_id++);
  v.rank = rank;
  for (int i = 0; i < rank; ++i) v.dims[i] = dims[i];
  v.et = et;
  return v;
}

static bool same_shape(const val_t* a, const val_t* b) {
  if (a->rank != b->rank) {
    return false;
  }
  for (int i = 0; i < a->rank; ++i) {
    if (a->dims[i] != b->dims[i]) {
      return false;
    }
  }
  return true;
}

static int64_t elements(const val_t* v) {
  int64_t n = 1;
  for (int i = 0; i < v->rank; ++i) n *= v->dims[i];
  return n;
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

static val_t op_unary(emitter_t* e, const char* op, val_t a) {
  val_t r = fresh(e, a.rank, a.dims, a.et);
  char ta[128];
  type_of(&a, ta);
  EMIT_LINE(e, "%s = stablehlo.%s %s : %s", r.name, op, a.name, ta);
  return r;
}

static val_t op_binary(emitter_t* e, const char* op, val_t a, val_t b) {
  PCP_ASSERT(same_shape(&a, &b) && a.et == b.et);
  val_t r = fresh(e, a.rank, a.dims, a.et);
  char ta[128];
  type_of(&a, ta);
  EMIT_LINE(e, "%s = stablehlo.%s %s, %s : %s", r.name, op, a.name, b.name, ta);
  return r;
}

static val_t add(emitter_t* e, val_t a, val_t b) {
  return op_binary(e, "add", a, b);
}
static val_t sub(emitter_t* e, val_t a, val_t b) {
  return op_binary(e, "subtract", a, b);
}
static val_t mul(emitter_t* e, val_t a, val_t b) {
  return op_binary(e, "multiply", a, b);
}

static val_t convert(emitter_t* e, val_t a, pcp_element_type_t et) {
  if (a.et == et) {
    return a;
  }
  val_t r = fresh(e, a.rank, a.dims, et);
  char ta[128], tr[128];
  type_of(&a, ta);
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.convert %s : (%s) -> %s", r.name, a.name, ta,
            tr);
  return r;
}

static val_t reshape(emitter_t* e, val_t a, int rank, const int64_t* dims) {
  val_t r = fresh(e, rank, dims, a.et);
  PCP_ASSERT(elements(&a) == elements(&r));
  char ta[128], tr[128];
  type_of(&a, ta);
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.reshape %s : (%s) -> %s", r.name, a.name, ta,
            tr);
  return r;
}

// At most MAX_RANK values of up to 20 characters each fit in 128 bytes.
static void format_list(const int64_t* values, int count, char* out,
                        size_t capacity) {
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; values && i < count && used < capacity; ++i) {
    used += (size_t)snprintf(out + used, capacity - used, "%s%lld",
                             i ? ", " : "", (long long)values[i]);
  }
}

static val_t transpose(emitter_t* e, val_t a, const int64_t* perm) {
  int64_t dims[MAX_RANK];
  for (int i = 0; i < a.rank; ++i) dims[i] = a.dims[perm[i]];
  val_t r = fresh(e, a.rank, dims, a.et);
  char ta[128], tr[128], p[128];
  type_of(&a, ta);
  type_of(&r, tr);
  format_list(perm, a.rank, p, sizeof(p));
  EMIT_LINE(e, "%s = stablehlo.transpose %s, dims = [%s] : (%s) -> %s", r.name,
            a.name, p, ta, tr);
  return r;
}

// broadcast_in_dim: operand dim i becomes result dim |mapping[i]|.
// |mapping_count| must equal a.rank (it lets the compiler-side analysis see
// the array bounds; the call sites pass PCP_ARRAYSIZE of a literal table).
static val_t broadcast(emitter_t* e, val_t a, int rank, const int64_t* dims,
                       const int64_t* mapping, int mapping_count) {
  PCP_ASSERT(mapping_count == a.rank);
  val_t r = fresh(e, rank, dims, a.et);
  char ta[128], tr[128], m[128];
  type_of(&a, ta);
  type_of(&r, tr);
  format_list(mapping, mapping_count, m, sizeof(m));
  EMIT_LINE(e, "%s = stablehlo.broadcast_in_dim %s, dims = [%s] : (%s) -> %s",
            r.name, a.name, m, ta, tr);
  return r;
}

// A rank-(r-1) value (a reduction over the last dim) back to |like|'s shape.
static val_t broadcast_last(emitter_t* e, val_t a, const val_t* like) {
  static const int64_t kLeading[MAX_RANK] = {0, 1, 2, 3, 4};
  PCP_ASSERT(a.rank == like->rank - 1);
  return broadcast(e, a, like->rank, like->dims, kLeading, like->rank - 1);
}

static val_t scalar(emitter_t* e, double value, pcp_element_type_t et) {
  val_t r = fresh(e, 0, NULL, et);
  char tr[128], text[64];
  type_of(&r, tr);
  if (isinf(value) && value < 0) {
    // The f32 / bf16 bit patterns of -inf (MLIR has no -inf literal).
    snprintf(text, sizeof(text), "%s",
             et == PCP_ELEMENT_TYPE_BF16 ? "0xFF80" : "0xFF800000");
  } else if (et == PCP_ELEMENT_TYPE_I32) {
    snprintf(text, sizeof(text), "%lld", (long long)value);
  } else {
    snprintf(text, sizeof(text), "%.9e", value);
  }
  EMIT_LINE(e, "%s = stablehlo.constant dense<%s> : %s", r.name, text, tr);
  return r;
}

static val_t splat(emitter_t* e, double value, pcp_element_type_t et,
                   const val_t* like) {
  val_t s = scalar(e, value, et);
  return broadcast(e, s, like->rank, like->dims, NULL, 0);
}

typedef enum reduce_kind_e { REDUCE_ADD = 0, REDUCE_MAX = 1 } reduce_kind_t;

// Reduces dimension |dim| of an f32 value (the init value is f32).
static val_t reduce(emitter_t* e, val_t a, reduce_kind_t kind, int dim) {
  val_t init = scalar(e, kind == REDUCE_ADD ? 0.0 : -INFINITY, a.et);
  int64_t dims[MAX_RANK] = {0};
  int rank = 0;
  for (int i = 0; i < a.rank; ++i) {
    if (i != dim) {
      dims[rank++] = a.dims[i];
    }
  }
  val_t r = fresh(e, rank, dims, a.et);
  char ta[128], ti[128], tr[128];
  type_of(&a, ta);
  type_of(&init, ti);
  type_of(&r, tr);
  EMIT_LINE(e,
            "%s = stablehlo.reduce(%s init: %s) applies stablehlo.%s across "
            "dimensions = [%d] : (%s, %s) -> %s",
            r.name, a.name, init.name, kind == REDUCE_ADD ? "add" : "maximum",
            dim, ta, ti, tr);
  return r;
}

// dot_general with |batch| leading batch dims (the same positions in both
// operands) and one contracting dim each. Result: batch dims, lhs free dims,
// rhs free dims (StableHLO's order).
static val_t dot(emitter_t* e, val_t a, val_t b, int batch, int lhs_contract,
                 int rhs_contract) {
  PCP_ASSERT(a.et == b.et);
  PCP_ASSERT(a.dims[lhs_contract] == b.dims[rhs_contract]);
  int64_t dims[MAX_RANK];
  int rank = 0;
  for (int i = 0; i < batch; ++i) {
    PCP_ASSERT(a.dims[i] == b.dims[i]);
    dims[rank++] = a.dims[i];
  }
  for (int i = batch; i < a.rank; ++i) {
    if (i != lhs_contract) {
      dims[rank++] = a.dims[i];
    }
  }
  for (int i = batch; i < b.rank; ++i) {
    if (i != rhs_contract) {
      dims[rank++] = b.dims[i];
    }
  }
  // A bf16 dot accumulates and returns f32, rounded to bf16 once after: as
  // GPU matrix units (and JAX) compute it. IREE's GPU pipelines reject a
  // dot with a bf16 result ("failed to distribute", docs/backends.md), and
  // the CPU's bf16-result dot rounded partial sums to bf16.
  bool low = a.et == PCP_ELEMENT_TYPE_BF16 || a.et == PCP_ELEMENT_TYPE_F16;
  val_t r = fresh(e, rank, dims, low ? PCP_ELEMENT_TYPE_F32 : a.et);
  char ta[128], tb[128], tr[128], bl[128] = "";
  type_of(&a, ta);
  type_of(&b, tb);
  type_of(&r, tr);
  if (batch > 0) {
    static const int64_t kBatch[MAX_RANK] = {0, 1, 2, 3, 4};
    char list[32];
    format_list(kBatch, batch, list, sizeof(list));
    snprintf(bl, sizeof(bl), "batching_dims = [%s] x [%s], ", list, list);
  }
  EMIT_LINE(e,
            "%s = stablehlo.dot_general %s, %s, %scontracting_dims = [%d] x "
            "[%d] : (%s, %s) -> %s",
            r.name, a.name, b.name, bl, lhs_contract, rhs_contract, ta, tb, tr);
  return low ? convert(e, r, a.et) : r;
}

static val_t iota(emitter_t* e, int rank, const int64_t* dims, int dim,
                  pcp_element_type_t et) {
  val_t r = fresh(e, rank, dims, et);
  char tr[128];
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.iota dim = %d : %s", r.name, dim, tr);
  return r;
}

static val_t compare(emitter_t* e, const char* direction, val_t a, val_t b) {
  PCP_ASSERT(same_shape(&a, &b) && a.et == b.et);
  val_t r = fresh(e, a.rank, a.dims, PCP_ELEMENT_TYPE_I1);
  char ta[128], tr[128];
  type_of(&a, ta);
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.compare %s, %s, %s : (%s, %s) -> %s", r.name,
            direction, a.name, b.name, ta, ta, tr);
  return r;
}

static val_t select_op(emitter_t* e, val_t pred, val_t on_true,
                       val_t on_false) {
  PCP_ASSERT(same_shape(&pred, &on_true) && same_shape(&on_true, &on_false));
  val_t r = fresh(e, on_true.rank, on_true.dims, on_true.et);
  char tp[128], tr[128];
  type_of(&pred, tp);
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.select %s, %s, %s : %s, %s", r.name, pred.name,
            on_true.name, on_false.name, tp, tr);
  return r;
}

// [start, limit) of dimension |dim|; the other dims whole.
static val_t slice(emitter_t* e, val_t a, int dim, int64_t start,
                   int64_t limit) {
  int64_t starts[MAX_RANK] = {0}, limits[MAX_RANK], strides[MAX_RANK];
  int64_t dims[MAX_RANK];
  for (int i = 0; i < a.rank; ++i) {
    limits[i] = a.dims[i];
    strides[i] = 1;
    dims[i] = a.dims[i];
  }
  starts[dim] = start;
  limits[dim] = limit;
  dims[dim] = limit - start;
  val_t r = fresh(e, a.rank, dims, a.et);
  char ta[128], tr[128], s[128], l[128], st[128];
  type_of(&a, ta);
  type_of(&r, tr);
  format_list(starts, a.rank, s, sizeof(s));
  format_list(limits, a.rank, l, sizeof(l));
  format_list(strides, a.rank, st, sizeof(st));
  // Generic form: the pretty slice syntax changed between StableHLO
  // releases, the generic one did not.
  EMIT_LINE(e,
            "%s = \"stablehlo.slice\"(%s) {start_indices = array<i64: %s>, "
            "limit_indices = array<i64: %s>, strides = array<i64: %s>} : "
            "(%s) -> %s",
            r.name, a.name, s, l, st, ta, tr);
  return r;
}

static val_t concat(emitter_t* e, val_t a, val_t b, int dim) {
  PCP_ASSERT(dim >= 0 && dim < a.rank);
  int64_t dims[MAX_RANK] = {0};
  for (int i = 0; i < a.rank; ++i) dims[i] = a.dims[i];
  dims[dim] += b.dims[dim];
  val_t r = fresh(e, a.rank, dims, a.et);
  char ta[128], tb[128], tr[128];
  type_of(&a, ta);
  type_of(&b, tb);
  type_of(&r, tr);
  EMIT_LINE(e, "%s = stablehlo.concatenate %s, %s, dim = %d : (%s, %s) -> %s",
            r.name, a.name, b.name, dim, ta, tb, tr);
  return r;
}

// Rows of |table| [V, D] picked by |indices| [N, 1] i32 -> [N, D]: the
// embedding lookup (the gather form upstream's VJP rule handles).
static val_t gather_rows(emitter_t* e, val_t table, val_t indices) {
  int64_t dims[2] = {indices.dims[0], table.dims[1]};
  val_t r = fresh(e, 2, dims, table.et);
  char tt[128], ti[128], tr[128];
  type_of(&table, tt);
  type_of(&indices, ti);
  type_of(&r, tr);
  EMIT_LINE(e,
            "%s = \"stablehlo.gather\"(%s, %s) {dimension_numbers = "
            "#stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
            "start_index_map = [0], index_vector_dim = 1>, slice_sizes = "
            "array<i64: 1, %lld>, indices_are_sorted = false} : (%s, %s) -> "
            "%s",
            r.name, table.name, indices.name, (long long)table.dims[1], tt, ti,
            tr);
  return r;
}

// |table| [layers, B, KV, L, hd] with the rows [N, hd] |updates| written at
// the [N, 4] |indices| (sorted and unique: one row per slot and kv head).
// A scatter, unlike the one-hot rewrite, touches only those rows, so IREE
// updates the tied cache in place.
static val_t scatter_cache_rows(emitter_t* e, val_t table, val_t indices,
                                val_t updates) {
  val_t r = fresh(e, table.rank, table.dims, table.et);
  // Region arguments get ids of their own: names must not repeat within a
  // function, nested regions included.
  long long old_id = (long long)e->next_id++;
  long long new_id = (long long)e->next_id++;
  const char* et = pcp_element_type_name(table.et);
  char tt[128], ti[128], tu[128];
  type_of(&table, tt);
  type_of(&indices, ti);
  type_of(&updates, tu);
  EMIT_LINE(e,
            "%s = \"stablehlo.scatter\"(%s, %s, %s) ({\n"
            "    ^bb0(%%%lld: tensor<%s>, %%%lld: tensor<%s>):\n"
            "      stablehlo.return %%%lld : tensor<%s>\n"
            "    }) {scatter_dimension_numbers = #stablehlo.scatter<"
            "update_window_dims = [1], inserted_window_dims = [0, 1, 2, 3], "
            "scatter_dims_to_operand_dims = [0, 1, 2, 3], index_vector_dim = "
            "1>, indices_are_sorted = true, unique_indices = true} : (%s, %s, "
            "%s) -> %s",
            r.name, table.name, indices.name, updates.name, old_id, et, new_id,
            et, new_id, et, tt, ti, tu, tt);
  return r;
}

//===----------------------------------------------------------------------===//
// Layers
//===----------------------------------------------------------------------===//

// x [N, in] @ W[out, in]^T (+ bias [out]).
static val_t linear(emitter_t* e, val_t x, val_t weight, const val_t* bias) {
  val_t y = dot(e, x, weight, 0, 1, 1);
  if (bias) {
    static const int64_t kLast[1] = {1};
    y = add(e, y,
            broadcast(e, *bias, y.rank, y.dims, kLast, PCP_ARRAYSIZE(kLast)));
  }
  return y;
}

// Mean over the last dim (f32), as a rank-(r-1) value.
static val_t mean_last(emitter_t* e, val_t x) {
  val_t s = reduce(e, x, REDUCE_ADD, x.rank - 1);
  // Multiplying by 1/D keeps divide (and its epsilon-guarded VJP upstream)
  // off the norm's gradient path.
  return mul(e, s, splat(e, 1.0 / (double)x.dims[x.rank - 1], s.et, &s));
}

// Weight [D] (any dtype) as f32 broadcast along the last dim of |like|.
static val_t broadcast_weight(emitter_t* e, val_t weight, const val_t* like) {
  int64_t last[1] = {like->rank - 1};
  return broadcast(e, convert(e, weight, PCP_ELEMENT_TYPE_F32), like->rank,
                   like->dims, last, 1);
}

// RMSNorm over the last dim, computed in f32 (weight applied in f32 too),
// returned in |x|'s dtype. |weight| NULL: nanochat's parameter-free norm.
static val_t rms_norm(emitter_t* e, val_t x, const val_t* weight, double eps) {
  val_t xf = convert(e, x, PCP_ELEMENT_TYPE_F32);
  val_t ms = mean_last(e, mul(e, xf, xf));
  val_t r = op_unary(e, "rsqrt", add(e, ms, splat(e, eps, ms.et, &ms)));
  val_t y = mul(e, xf, broadcast_last(e, r, &xf));
  if (weight) {
    y = mul(e, y, broadcast_weight(e, *weight, &y));
  }
  return convert(e, y, x.et);
}

// LayerNorm (biased variance, as torch) over the last dim, in f32.
static val_t layer_norm(emitter_t* e, val_t x, val_t weight, val_t bias,
                        double eps) {
  val_t xf = convert(e, x, PCP_ELEMENT_TYPE_F32);
  val_t mean = mean_last(e, xf);
  val_t xc = sub(e, xf, broadcast_last(e, mean, &xf));
  val_t var = mean_last(e, mul(e, xc, xc));
  val_t r = op_unary(e, "rsqrt", add(e, var, splat(e, eps, var.et, &var)));
  val_t y = mul(e, xc, broadcast_last(e, r, &xc));
  y = mul(e, y, broadcast_weight(e, weight, &y));
  y = add(e, y, broadcast_weight(e, bias, &y));
  return convert(e, y, x.et);
}

// GELU, tanh approximation (GPT-2's "gelu_new"; StableHLO has no erf):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
static val_t gelu_tanh(emitter_t* e, val_t x) {
  val_t x3 = mul(e, mul(e, x, x), x);
  val_t inner = add(e, x, mul(e, splat(e, 0.044715, x.et, &x), x3));
  val_t t = op_unary(
      e, "tanh",
      mul(e, splat(e, 0.7978845608028654 /* sqrt(2/pi) */, x.et, &x), inner));
  val_t one_plus = add(e, splat(e, 1.0, x.et, &x), t);
  return mul(e, mul(e, splat(e, 0.5, x.et, &x), x), one_plus);
}

// cos/sin tables [T, hd/2] in f32: angle(t, i) = t * theta^(-2i/hd). The
// inverse frequencies are computed in double here and rounded to f32 once.
static void build_rope_tables(emitter_t* e) {
  int64_t half = e->hd / 2;
  int64_t dims[2] = {e->t, half};
  int64_t gen_dims[3] = {e->b, e->t, half};
  val_t pos;
  if (e->gen) {
    // Per-slot positions: angle(b, s, i) = pos[b, s] * inv[i], the same f32
    // product as the table of the training functions.
    static const int64_t kBs[2] = {0, 1};
    pos = broadcast(e, convert(e, e->gen_pos, PCP_ELEMENT_TYPE_F32), 3,
                    gen_dims, kBs, PCP_ARRAYSIZE(kBs));
  } else {
    pos = iota(e, 2, dims, 0, PCP_ELEMENT_TYPE_F32);
  }
  // dense<[...]> of hd/2 (at most 512) values.
  val_t inv = fresh(e, 1, &half, PCP_ELEMENT_TYPE_F32);
  pcp_string_builder_t* b = e->builder;
  if (!e->status) {
    e->status = pcp_string_builder_append_f(
        b, "    %s = stablehlo.constant dense<[", inv.name);
  }
  double theta = pcp_models_spec_rope_theta(e->spec);
  for (int64_t i = 0; i < half && !e->status; ++i) {
    double value = 1.0 / pow(theta, (double)(2 * i) / (double)e->hd);
    e->status = pcp_string_builder_append_f(b, "%s%.9e", i ? ", " : "",
                                            (double)(float)value);
  }
  if (!e->status) {
    e->status = pcp_string_builder_append_f(b, "]> : tensor<%lldxf32>\n",
                                            (long long)half);
  }
  static const int64_t kCol[1] = {1};
  static const int64_t kGenCol[1] = {2};
  val_t angle =
      e->gen
          ? mul(e, pos,
                broadcast(e, inv, 3, gen_dims, kGenCol, PCP_ARRAYSIZE(kGenCol)))
          : mul(e, pos, broadcast(e, inv, 2, dims, kCol, PCP_ARRAYSIZE(kCol)));
  e->rope_cos = op_unary(e, "cosine", angle);
  e->rope_sin = op_unary(e, "sine", angle);
}

// RoPE on x [B, T, heads, hd] with the two halves of each head as the
// rotated pairs (HF rotate_half layout, also nanochat's). Qwen3 (HF):
// y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin. nanochat rotates the other way:
// y1 = x1 cos + x2 sin, y2 = x2 cos - x1 sin. Computed in f32.
static val_t rope(emitter_t* e, val_t x) {
  val_t xf = convert(e, x, PCP_ELEMENT_TYPE_F32);
  int64_t half = e->hd / 2;
  val_t x1 = slice(e, xf, 3, 0, half);
  val_t x2 = slice(e, xf, 3, half, e->hd);
  static const int64_t kTd[2] = {1, 3};
  static const int64_t kBtd[3] = {0, 1, 3};
  val_t c =
      e->gen ? broadcast(e, e->rope_cos, 4, x1.dims, kBtd, PCP_ARRAYSIZE(kBtd))
             : broadcast(e, e->rope_cos, 4, x1.dims, kTd, PCP_ARRAYSIZE(kTd));
  val_t s =
      e->gen ? broadcast(e, e->rope_sin, 4, x1.dims, kBtd, PCP_ARRAYSIZE(kBtd))
             : broadcast(e, e->rope_sin, 4, x1.dims, kTd, PCP_ARRAYSIZE(kTd));
  // Products in a fixed order: C leaves the order of argument evaluation
  // unspecified, and the text (an artifact cache key) must not depend on
  // the compiler that built pcp.
  val_t x1c = mul(e, x1, c);
  val_t x2s = mul(e, x2, s);
  val_t x2c = mul(e, x2, c);
  val_t x1s = mul(e, x1, s);
  val_t y1, y2;
  if (e->spec->architecture == PCP_MODELS_ARCHITECTURE_NANOCHAT) {
    y1 = add(e, x1c, x2s);
    y2 = sub(e, x2c, x1s);
  } else {
    y1 = sub(e, x1c, x2s);
    y2 = add(e, x2c, x1s);
  }
  return convert(e, concat(e, y1, y2, 3), x.et);
}

// Causal mask and the -inf fill, built once per function.
static void build_mask(emitter_t* e) {
  int64_t tt[2] = {e->t, e->t};
  val_t query = iota(e, 2, tt, 0, PCP_ELEMENT_TYPE_I32);
  val_t key = iota(e, 2, tt, 1, PCP_ELEMENT_TYPE_I32);
  val_t allowed = compare(e, "GE", query, key);
  int64_t dims[4] = {e->b, e->h, e->t, e->t};
  static const int64_t kLast2[2] = {2, 3};
  e->causal_mask =
      broadcast(e, allowed, 4, dims, kLast2, PCP_ARRAYSIZE(kLast2));
  val_t like = {.rank = 4, .et = PCP_ELEMENT_TYPE_F32};  // shape only
  memcpy(like.dims, dims, sizeof(dims));
  e->neg_inf = splat(e, -INFINITY, PCP_ELEMENT_TYPE_F32, &like);
}

// Generation masks, built once per @prefill / @decode from the slot
// positions [B] (tokens already in each slot's cache) and the chunk lengths
// [B] (tokens of this call that are real; 0 leaves a slot untouched, which
// lets one slot be prefilled while the others keep their caches).
static void build_gen_masks(emitter_t* e, val_t positions, val_t lengths) {
  int64_t bs[2] = {e->b, e->t};
  int64_t bsl[3] = {e->b, e->t, e->max_len};
  int64_t bl[2] = {e->b, e->max_len};
  static const int64_t kB[1] = {0};
  static const int64_t kBs[2] = {0, 1};
  val_t start = broadcast(e, positions, 2, bs, kB, PCP_ARRAYSIZE(kB));
  e->gen_pos = add(e, start, iota(e, 2, bs, 1, PCP_ELEMENT_TYPE_I32));
  val_t key = iota(e, 3, bsl, 2, PCP_ELEMENT_TYPE_I32);
  val_t query_pos = broadcast(e, e->gen_pos, 3, bsl, kBs, PCP_ARRAYSIZE(kBs));
  // Query s writes row pos + s, only when s < length (padding never lands
  // in the cache).
  val_t hit = compare(e, "EQ", key, query_pos);
  val_t real = compare(e, "LT", iota(e, 3, bsl, 1, PCP_ELEMENT_TYPE_I32),
                       broadcast(e, lengths, 3, bsl, kB, PCP_ARRAYSIZE(kB)));
  val_t writes = select_op(e, real, hit, real);  // logical and
  val_t like = key;
  like.et = e->adt;
  e->gen_onehot = select_op(e, writes, splat(e, 1.0, e->adt, &like),
                            splat(e, 0.0, e->adt, &like));
  // Rows [pos, pos + length) of each slot are replaced.
  val_t offset = sub(e, iota(e, 2, bl, 1, PCP_ELEMENT_TYPE_I32),
                     broadcast(e, positions, 2, bl, kB, PCP_ARRAYSIZE(kB)));
  val_t ge =
      compare(e, "GE", offset, splat(e, 0.0, PCP_ELEMENT_TYPE_I32, &offset));
  val_t lt = compare(e, "LT", offset,
                     broadcast(e, lengths, 2, bl, kB, PCP_ARRAYSIZE(kB)));
  val_t rows = select_op(e, ge, lt, ge);
  int64_t cd[4] = {e->b, e->kv, e->max_len, e->hd};
  static const int64_t kRows[2] = {0, 2};
  e->gen_written = broadcast(e, rows, 4, cd, kRows, PCP_ARRAYSIZE(kRows));
  // Causal by absolute position: key l is visible to the query at p when
  // l <= p. Rows past a slot's position hold stale or padding values and
  // are masked, so slots at different lengths share one batch.
  val_t visible = compare(e, "LE", key, query_pos);
  int64_t sd[5] = {e->b, e->kv, e->h / e->kv, e->t, e->max_len};
  static const int64_t kVis[3] = {0, 3, 4};
  e->gen_allowed = broadcast(e, visible, 5, sd, kVis, PCP_ARRAYSIZE(kVis));
  val_t f32_like = {.rank = 5, .et = PCP_ELEMENT_TYPE_F32};
  memcpy(f32_like.dims, sd, sizeof(sd));
  e->gen_neg_inf = splat(e, -INFINITY, PCP_ELEMENT_TYPE_F32, &f32_like);
}

// @decode's row addresses, built once from the slot positions [B]: slot b
// writes row pos_b of each kv head. A slot at pos_b >= L (full, idle in the
// batch) writes row L - 1 instead: the scatter must stay in bounds, and a
// full slot's last row is never read again (it cannot decode or prefill
// more; a session that reuses the slot keeps at most L - 1 rows, and a
// reset starts from row 0). The one-hot @prefill writes nothing there.
static void build_decode_rows(emitter_t* e, val_t positions) {
  int64_t bk1[3] = {e->b, e->kv, 1};
  static const int64_t kB[1] = {0};
  val_t last =
      splat(e, (double)(e->max_len - 1), PCP_ELEMENT_TYPE_I32, &positions);
  val_t row = op_binary(e, "minimum", positions, last);
  val_t slot = iota(e, 3, bk1, 0, PCP_ELEMENT_TYPE_I32);
  val_t head = iota(e, 3, bk1, 1, PCP_ELEMENT_TYPE_I32);
  e->gen_row_tail = concat(e, concat(e, slot, head, 2),
                           broadcast(e, row, 3, bk1, kB, PCP_ARRAYSIZE(kB)), 2);
}

// Writes one layer's new rows |rows| [B, 1, KV, hd] into |cache| [layers,
// B, KV, L, hd] at the decode positions (build_decode_rows).
static val_t write_decode_rows(emitter_t* e, val_t cache, int64_t layer,
                               val_t rows) {
  int64_t bk1[3] = {e->b, e->kv, 1};
  int64_t n4[2] = {e->b * e->kv, 4};
  int64_t nd[2] = {e->b * e->kv, e->hd};
  val_t like = {.rank = 3, .et = PCP_ELEMENT_TYPE_I32};  // shape only
  memcpy(like.dims, bk1, sizeof(bk1));
  val_t index =
      reshape(e,
              concat(e, splat(e, (double)layer, PCP_ELEMENT_TYPE_I32, &like),
                     e->gen_row_tail, 2),
              2, n4);
  val_t update = reshape(e, rows, 2, nd);
  return scatter_cache_rows(e, cache, index, update);
}

// Cached attention of one layer: k, v [B, S, KV, hd] (after norm and RoPE)
// are written into the layer's cache rows, then q [B, S, H, hd] attends to
// all L rows under gen_allowed. @prefill updates the cache by select with
// a one-hot matmul rather than a scatter: every op stays in the training op
// set, and in f32 the one-hot product is exact. @decode scatters its rows
// into the tied cache instead (write_decode_rows). GQA needs no repeat: q is
// viewed as [B, KV, G, S, hd] and KV is a batch dim of both dots.
static val_t attend_cache(emitter_t* e, val_t q, val_t k, val_t v) {
  int64_t layer = e->layer++;
  int64_t cd[4] = {e->b, e->kv, e->max_len, e->hd};
  int64_t c1[5] = {1, e->b, e->kv, e->max_len, e->hd};
  static const int64_t kCacheOrder[4] = {0, 2, 1, 3};  // [B,L,KV,hd] ->
  val_t news[2] = {k, v};
  val_t* ins[2] = {&e->k_cache_in, &e->v_cache_in};
  val_t* outs[2] = {&e->k_cache_out, &e->v_cache_out};
  val_t caches[2];
  for (int i = 0; i < 2; ++i) {
    if (e->decode_rows) {
      // The layer's rows go into the whole cache; attention reads the
      // layer's slice of the updated cache (this step's row included).
      *outs[i] =
          write_decode_rows(e, layer == 0 ? *ins[i] : *outs[i], layer, news[i]);
      caches[i] = reshape(e, slice(e, *outs[i], 0, layer, layer + 1), 4, cd);
      continue;
    }
    val_t c = reshape(e, slice(e, *ins[i], 0, layer, layer + 1), 4, cd);
    val_t rows =
        transpose(e, dot(e, e->gen_onehot, news[i], 1, 1, 1), kCacheOrder);
    c = select_op(e, e->gen_written, rows, c);
    val_t c5 = reshape(e, c, 5, c1);
    *outs[i] = layer == 0 ? c5 : concat(e, *outs[i], c5, 0);
    caches[i] = c;
  }
  int64_t qd[5] = {e->b, e->t, e->kv, e->h / e->kv, e->hd};
  static const int64_t kGroupFirst[5] = {0, 2, 3, 1, 4};  // [B,KV,G,S,hd]
  val_t q5 = transpose(e, reshape(e, q, 5, qd), kGroupFirst);
  val_t s = convert(e, dot(e, q5, caches[0], 2, 4, 3), PCP_ELEMENT_TYPE_F32);
  s = mul(e, s, splat(e, 1.0 / sqrt((double)e->hd), s.et, &s));
  s = select_op(e, e->gen_allowed, s, e->gen_neg_inf);
  val_t m = reduce(e, s, REDUCE_MAX, 4);
  val_t p = op_unary(e, "exponential", sub(e, s, broadcast_last(e, m, &s)));
  val_t z = reduce(e, p, REDUCE_ADD, 4);
  p = op_binary(e, "divide", p, broadcast_last(e, z, &p));
  val_t o = dot(e, convert(e, p, e->adt), caches[1], 2, 4, 2);
  static const int64_t kBack[5] = {0, 3, 1, 2, 4};  // [B,S,KV,G,hd]
  o = transpose(e, o, kBack);
  int64_t od[2] = {e->n, e->h * e->hd};
  return reshape(e, o, 2, od);
}

typedef struct attention_params_t {
  const val_t* q_norm;  // Qwen3 per-head RMSNorm weights [hd], or NULL
  const val_t* k_norm;
} attention_params_t;

// Causal self-attention. q [N, H*hd], k and v [N, KV*hd] -> [N, H*hd].
static val_t attention(emitter_t* e, val_t q, val_t k, val_t v,
                       const attention_params_t* params) {
  int64_t qd[4] = {e->b, e->t, e->h, e->hd};
  int64_t kd[4] = {e->b, e->t, e->kv, e->hd};
  q = reshape(e, q, 4, qd);
  k = reshape(e, k, 4, kd);
  v = reshape(e, v, 4, kd);
  pcp_models_architecture_t arch = e->spec->architecture;
  if (arch == PCP_MODELS_ARCHITECTURE_QWEN3) {
    // Qwen3: per-head RMSNorm (weights [hd]) before RoPE.
    q = rope(e, rms_norm(e, q, params->q_norm, 1e-6));
    k = rope(e, rms_norm(e, k, params->k_norm, 1e-6));
  } else if (arch == PCP_MODELS_ARCHITECTURE_NANOCHAT) {
    // nanochat: RoPE, then parameter-free RMSNorm of q and k ("QK norm").
    q = rms_norm(e, rope(e, q), NULL, 1.1920928955078125e-07);
    k = rms_norm(e, rope(e, k), NULL, 1.1920928955078125e-07);
  }
  if (e->gen) {
    return attend_cache(e, q, k, v);
  }
  if (e->kv != e->h) {
    // Grouped-query attention: each kv head serves heads/kv consecutive
    // query heads (HF repeat_kv): [B,T,KV,hd] -> [B,T,KV,G,hd] -> [B,T,H,hd].
    int64_t gd[5] = {e->b, e->t, e->kv, e->h / e->kv, e->hd};
    static const int64_t kSkipGroup[4] = {0, 1, 2, 4};
    k = reshape(e,
                broadcast(e, k, 5, gd, kSkipGroup, PCP_ARRAYSIZE(kSkipGroup)),
                4, qd);
    v = reshape(e,
                broadcast(e, v, 5, gd, kSkipGroup, PCP_ARRAYSIZE(kSkipGroup)),
                4, qd);
  }
  static const int64_t kHeadsFirst[4] = {0, 2, 1, 3};
  q = transpose(e, q, kHeadsFirst);  // [B, H, T, hd]
  k = transpose(e, k, kHeadsFirst);
  v = transpose(e, v, kHeadsFirst);
  // Scores and softmax in f32: scale by 1/sqrt(hd), mask, subtract the row
  // max, exponentiate, normalize.
  val_t s = convert(e, dot(e, q, k, 2, 3, 3), PCP_ELEMENT_TYPE_F32);
  s = mul(e, s, splat(e, 1.0 / sqrt((double)e->hd), s.et, &s));
  s = select_op(e, e->causal_mask, s, e->neg_inf);
  val_t m = reduce(e, s, REDUCE_MAX, 3);
  val_t p = op_unary(e, "exponential", sub(e, s, broadcast_last(e, m, &s)));
  val_t z = reduce(e, p, REDUCE_ADD, 3);
  p = op_binary(e, "divide", p, broadcast_last(e, z, &p));
  val_t o = dot(e, convert(e, p, e->adt), v, 2, 3, 2);  // [B, H, T, hd]
  o = transpose(e, o, kHeadsFirst);                     // [B, T, H, hd]
  int64_t od[2] = {e->n, e->h * e->hd};
  return reshape(e, o, 2, od);
}

//===----------------------------------------------------------------------===//
// Architectures: each returns the logits [N, V] in f32
//===----------------------------------------------------------------------===//

static val_t embed(emitter_t* e, val_t table, val_t input_ids) {
  int64_t id[2] = {e->n, 1};
  return gather_rows(e, table, reshape(e, input_ids, 2, id));
}

static val_t forward_gpt(emitter_t* e, const val_t* p, val_t input_ids) {
  const double eps = 1e-5;  // torch.nn.LayerNorm default
  val_t x = embed(e, p[0], input_ids);
  int64_t btd[3] = {e->b, e->t, e->d};
  static const int64_t kTd[2] = {1, 2};
  int64_t nd[2] = {e->n, e->d};
  if (e->gen) {
    // Rows of the position table at each query's absolute position.
    x = add(e, x, embed(e, p[1], e->gen_pos));
  } else {
    x = add(
        e, x,
        reshape(e, broadcast(e, p[1], 3, btd, kTd, PCP_ARRAYSIZE(kTd)), 2, nd));
  }
  for (int64_t l = 0; l < e->spec->layers; ++l) {
    const val_t* w = &p[2 + 12 * l];
    val_t h = layer_norm(e, x, w[0], w[1], eps);
    val_t qkv = linear(e, h, w[2], &w[3]);
    val_t q = slice(e, qkv, 1, 0, e->d);
    val_t k = slice(e, qkv, 1, e->d, 2 * e->d);
    val_t v = slice(e, qkv, 1, 2 * e->d, 3 * e->d);
    attention_params_t none = {0};
    x = add(e, x, linear(e, attention(e, q, k, v, &none), w[4], &w[5]));
    h = layer_norm(e, x, w[6], w[7], eps);
    x = add(e, x,
            linear(e, gelu_tanh(e, linear(e, h, w[8], &w[9])), w[10], &w[11]));
  }
  size_t last = 2 + 12 * (size_t)e->spec->layers;
  x = layer_norm(e, x, p[last], p[last + 1], eps);
  return convert(e, linear(e, x, p[0], NULL), PCP_ELEMENT_TYPE_F32);
}

static val_t forward_nanochat(emitter_t* e, const val_t* p, val_t input_ids) {
  // F.rms_norm(x, (d,)) with eps=None uses torch.finfo(float32).eps.
  const double eps = 1.1920928955078125e-07;
  val_t x = rms_norm(e, embed(e, p[0], input_ids), NULL, eps);
  for (int64_t l = 0; l < e->spec->layers; ++l) {
    const val_t* w = &p[1 + 6 * l];
    val_t h = rms_norm(e, x, NULL, eps);
    attention_params_t none = {0};
    val_t q = linear(e, h, w[0], NULL);  // one statement each: a fixed order
    val_t k = linear(e, h, w[1], NULL);
    val_t v = linear(e, h, w[2], NULL);
    val_t a = attention(e, q, k, v, &none);
    x = add(e, x, linear(e, a, w[3], NULL));
    h = rms_norm(e, x, NULL, eps);
    val_t u = linear(e, h, w[4], NULL);
    u = op_binary(e, "maximum", u, splat(e, 0.0, u.et, &u));
    x = add(e, x, linear(e, mul(e, u, u), w[5], NULL));  // ReLU^2
  }
  x = rms_norm(e, x, NULL, eps);
  size_t head = 1 + 6 * (size_t)e->spec->layers;
  val_t logits = convert(e, linear(e, x, p[head], NULL), PCP_ELEMENT_TYPE_F32);
  // nanochat soft-caps the logits: 15 tanh(logits / 15).
  val_t cap = splat(e, 15.0, logits.et, &logits);
  val_t inv = splat(e, 1.0 / 15.0, logits.et, &logits);
  return mul(e, cap, op_unary(e, "tanh", mul(e, logits, inv)));
}

static val_t forward_qwen3(emitter_t* e, const val_t* p, val_t input_ids) {
  const double eps = 1e-6;  // Qwen3 rms_norm_eps
  val_t x = embed(e, p[0], input_ids);
  for (int64_t l = 0; l < e->spec->layers; ++l) {
    const val_t* w = &p[1 + 11 * l];
    val_t h = rms_norm(e, x, &w[9], eps);
    attention_params_t norms = {.q_norm = &w[4], .k_norm = &w[5]};
    val_t q = linear(e, h, w[0], NULL);  // one statement each: a fixed order
    val_t k = linear(e, h, w[1], NULL);
    val_t v = linear(e, h, w[2], NULL);
    val_t a = attention(e, q, k, v, &norms);
    x = add(e, x, linear(e, a, w[3], NULL));
    h = rms_norm(e, x, &w[10], eps);
    val_t g = linear(e, h, w[6], NULL);
    val_t u = linear(e, h, w[7], NULL);
    val_t silu = mul(e, g, op_unary(e, "logistic", g));  // SiLU
    x = add(e, x, linear(e, mul(e, silu, u), w[8], NULL));
  }
  size_t last = 1 + 11 * (size_t)e->spec->layers;
  x = rms_norm(e, x, &p[last], eps);
  val_t head = e->spec->tie_embeddings ? p[0] : p[last + 1];
  return convert(e, linear(e, x, head, NULL), PCP_ELEMENT_TYPE_F32);
}

static val_t forward(emitter_t* e, const val_t* params, val_t input_ids) {
  if (e->spec->architecture != PCP_MODELS_ARCHITECTURE_GPT) {
    build_rope_tables(e);
  }
  if (!e->gen) {
    build_mask(e);
  }
  switch (e->spec->architecture) {
    case PCP_MODELS_ARCHITECTURE_GPT:
      return forward_gpt(e, params, input_ids);
    case PCP_MODELS_ARCHITECTURE_NANOCHAT:
      return forward_nanochat(e, params, input_ids);
    default:
      return forward_qwen3(e, params, input_ids);
  }
}

// Mean cross-entropy of logits [N, V] f32 against targets [B, T] i32:
// mean(logsumexp(l) - l[target]), with the row max subtracted first.
static val_t cross_entropy(emitter_t* e, val_t logits, val_t targets) {
  val_t m = reduce(e, logits, REDUCE_MAX, 1);
  val_t z = sub(e, logits, broadcast_last(e, m, &logits));
  val_t lse = op_unary(e, "log",
                       reduce(e, op_unary(e, "exponential", z), REDUCE_ADD, 1));
  int64_t n = e->n;
  val_t t = reshape(e, targets, 1, &n);
  static const int64_t kRow[1] = {0};
  val_t tb = broadcast(e, t, 2, logits.dims, kRow, PCP_ARRAYSIZE(kRow));
  val_t column = iota(e, 2, logits.dims, 1, PCP_ELEMENT_TYPE_I32);
  val_t one_hot = compare(e, "EQ", column, tb);
  val_t picked = reduce(e, select_op(e, one_hot, z, splat(e, 0.0, z.et, &z)),
                        REDUCE_ADD, 1);
  val_t total = reduce(e, sub(e, lse, picked), REDUCE_ADD, 0);
  return mul(e, total, scalar(e, 1.0 / (double)n, total.et));
}

//===----------------------------------------------------------------------===//
// Module
//===----------------------------------------------------------------------===//

static void emit_function(emitter_t* e,
                          const pcp_models_parameter_table_t* table,
                          val_t* params, bool loss) {
  e->next_id = 0;
  char type[128];
  int64_t bt[2] = {e->b, e->t};
  val_t ids = {.name = "%input_ids", .rank = 2, .et = PCP_ELEMENT_TYPE_I32};
  memcpy(ids.dims, bt, sizeof(bt));
  val_t targets = ids;
  snprintf(targets.name, sizeof(targets.name), "%%targets");
  if (!e->status) {
    e->status = pcp_string_builder_append_f(e->builder, "  func.func @%s(",
                                            loss ? "main" : "logits");
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    type_of(&params[i], type);
    e->status = pcp_string_builder_append_f(e->builder, "%s: %s, ",
                                            params[i].name, type);
  }
  type_of(&ids, type);
  val_t result;
  if (!e->status) {
    if (loss) {
      e->status = pcp_string_builder_append_f(
          e->builder, "%%input_ids: %s, %%targets: %s) -> tensor<f32> {\n",
          type, type);
    } else {
      e->status = pcp_string_builder_append_f(
          e->builder, "%%input_ids: %s) -> tensor<%lldx%lldx%lldxf32> {\n",
          type, (long long)e->b, (long long)e->t, (long long)e->v);
    }
  }
  val_t logits = forward(e, params, ids);
  if (loss) {
    result = cross_entropy(e, logits, targets);
  } else {
    int64_t btv[3] = {e->b, e->t, e->v};
    result = reshape(e, logits, 3, btv);
  }
  type_of(&result, type);
  EMIT_LINE(e, "return %s : %s", result.name, type);
  if (!e->status) {
    e->status = pcp_string_builder_append_cstring(e->builder, "  }\n");
  }
}

pcp_status_t pcp_models_module_emit(const pcp_models_spec_t* spec,
                                    pcp_string_builder_t* builder) {
  // Scratch comes from the output builder's allocator: the caller's.
  pcp_allocator_t allocator = builder->allocator;
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_parameter_table_initialize(spec, allocator, &table));
  val_t* params = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, table.count * sizeof(val_t), (void**)&params);
  if (status) {
    pcp_models_parameter_table_deinitialize(&table);
    return status;
  }
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    // Parameter names are valid SSA names (letters, digits, '.', '_'), so
    // the text reads like the checkpoint.
    snprintf(params[i].name, sizeof(params[i].name), "%%%s", p->name);
    params[i].rank = p->rank;
    params[i].dims[0] = p->dims[0];
    params[i].dims[1] = p->dims[1];
    params[i].et = p->element_type;
  }
  emitter_t e = {
      .builder = builder,
      .spec = spec,
      .adt = spec->dtype,
      .b = spec->batch,
      .t = spec->block_size,
      .n = spec->batch * spec->block_size,
      .d = spec->width,
      .h = spec->heads,
      .kv = pcp_models_spec_kv_heads(spec),
      .hd = pcp_models_spec_head_dim(spec),
      .f = pcp_models_spec_mlp_hidden(spec),
      .v = spec->vocab,
  };
  e.status = pcp_string_builder_append_f(
      builder,
      "// PCP built-in model: %s, %lld layers, %lld heads (%lld kv), width "
      "%lld, head_dim %lld, mlp %lld, vocab %lld, B=%lld, T=%lld, %s, %zu "
      "tensors, %lld parameters.\n// Emitted by `pcp model`; see "
      "docs/models.md.\nmodule @pcp_%s {\n",
      pcp_models_architecture_name(spec->architecture), (long long)spec->layers,
      (long long)e.h, (long long)e.kv, (long long)e.d, (long long)e.hd,
      (long long)e.f, (long long)e.v, (long long)e.b, (long long)e.t,
      pcp_element_type_name(spec->dtype), table.count,
      (long long)table.total_elements,
      pcp_models_architecture_name(spec->architecture));
  emit_function(&e, &table, params, true);
  emit_function(&e, &table, params, false);
  if (!e.status) {
    e.status = pcp_string_builder_append_cstring(builder, "}\n");
  }
  pcp_allocator_free(allocator, params);
  pcp_models_parameter_table_deinitialize(&table);
  return e.status;
}

//===----------------------------------------------------------------------===//
// Generation module
//===----------------------------------------------------------------------===//

pcp_status_t pcp_models_generation_validate(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen) {
  PCP_RETURN_IF_ERROR_BARE(pcp_models_spec_validate(spec));
  if (gen->slots < 1 || gen->slots > PCP_MODELS_MAX_BATCH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "slots %lld is outside [1, %d]",
                           (long long)gen->slots, PCP_MODELS_MAX_BATCH);
  }
  if (gen->max_length < 1 || gen->max_length > PCP_MODELS_MAX_BLOCK_SIZE) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "max length %lld is outside [1, %d]",
        (long long)gen->max_length, PCP_MODELS_MAX_BLOCK_SIZE);
  }
  if (gen->prefill_length < 1 || gen->prefill_length > gen->max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "prefill length %lld is outside [1, max length "
                           "%lld]",
                           (long long)gen->prefill_length,
                           (long long)gen->max_length);
  }
  if (spec->architecture == PCP_MODELS_ARCHITECTURE_GPT &&
      gen->max_length > spec->block_size) {
    // GPT's learned position table has block_size rows.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gpt max length %lld exceeds block size %lld (the "
                           "position table)",
                           (long long)gen->max_length,
                           (long long)spec->block_size);
  }
  int64_t scores =
      gen->slots * spec->heads * gen->prefill_length * gen->max_length;
  if (scores > PCP_MODELS_MAX_TENSOR_ELEMENTS / 4) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "slots x heads x prefill x max length is too large");
  }
  return pcp_ok_status();
}

uint64_t pcp_models_generation_cache_byte_length(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen) {
  // k and v: [layers, KV, L, hd] per slot.
  return 2u * (uint64_t)spec->layers *
         (uint64_t)pcp_models_spec_kv_heads(spec) * (uint64_t)gen->max_length *
         (uint64_t)pcp_models_spec_head_dim(spec) *
         (uint64_t)pcp_element_type_byte_size(spec->dtype);
}

// One of @prefill (S = prefill_length, with %lengths) and @decode (S = 1).
static void emit_generation_function(emitter_t* e,
                                     const pcp_models_parameter_table_t* table,
                                     val_t* params, bool prefill) {
  e->next_id = 0;
  e->layer = 0;
  e->t = prefill ? e->t : 1;
  e->n = e->b * e->t;
  e->decode_rows = !prefill;
  char type[128], cache_type[128], vec_type[128];
  int64_t bs[2] = {e->b, e->t};
  val_t ids = {.name = "%input_ids", .rank = 2, .et = PCP_ELEMENT_TYPE_I32};
  memcpy(ids.dims, bs, sizeof(bs));
  val_t positions = {.name = "%positions",
                     .rank = 1,
                     .dims = {e->b},
                     .et = PCP_ELEMENT_TYPE_I32};
  val_t lengths = positions;
  snprintf(lengths.name, sizeof(lengths.name), "%%lengths");
  int64_t cd[5] = {e->spec->layers, e->b, e->kv, e->max_len, e->hd};
  val_t kc = {.name = "%k_cache", .rank = 5, .et = e->adt};
  memcpy(kc.dims, cd, sizeof(cd));
  val_t vc = kc;
  snprintf(vc.name, sizeof(vc.name), "%%v_cache");
  e->k_cache_in = kc;
  e->v_cache_in = vc;
  if (!e->status) {
    e->status = pcp_string_builder_append_f(e->builder, "  func.func @%s(",
                                            prefill ? "prefill" : "decode");
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    type_of(&params[i], type);
    e->status = pcp_string_builder_append_f(e->builder, "%s: %s, ",
                                            params[i].name, type);
  }
  type_of(&ids, type);
  type_of(&kc, cache_type);
  type_of(&positions, vec_type);
  if (!e->status) {
    e->status = pcp_string_builder_append_f(
        e->builder,
        "%%input_ids: %s, %%positions: %s, %s%s%s%%k_cache: %s%s, "
        "%%v_cache: %s%s) -> (tensor<%lldx%lldxf32>, %s, %s) {\n",
        type, vec_type, prefill ? "%lengths: " : "", prefill ? vec_type : "",
        prefill ? ", " : "", cache_type,
        // @decode's caches are results 1 and 2 written into the argument's
        // storage (IREE's iree.abi.output): the caller's resident cache is
        // updated in place and comes back as the result.
        prefill ? "" : " {iree.abi.output = 1 : index}", cache_type,
        prefill ? "" : " {iree.abi.output = 2 : index}", (long long)e->b,
        (long long)e->v, cache_type, cache_type);
  }
  if (!prefill) {
    lengths = splat(e, 1.0, PCP_ELEMENT_TYPE_I32, &positions);
  }
  build_gen_masks(e, positions, lengths);
  if (!prefill) {
    build_decode_rows(e, positions);
  }
  val_t logits = forward(e, params, ids);  // [B * S, V]
  int64_t bv[2] = {e->b, e->v};
  if (prefill) {
    // The logits of each slot's last real token: a one-hot row over S
    // (exact in f32), zeros for a slot with length 0.
    int64_t bsv[3] = {e->b, e->t, e->v};
    static const int64_t kB[1] = {0};
    val_t last = sub(e, broadcast(e, lengths, 2, bs, kB, PCP_ARRAYSIZE(kB)),
                     splat(e, 1.0, PCP_ELEMENT_TYPE_I32, &ids));
    val_t pick =
        compare(e, "EQ", iota(e, 2, bs, 1, PCP_ELEMENT_TYPE_I32), last);
    val_t like = ids;
    like.et = PCP_ELEMENT_TYPE_F32;
    val_t onehot = select_op(e, pick, splat(e, 1.0, like.et, &like),
                             splat(e, 0.0, like.et, &like));
    logits = dot(e, onehot, reshape(e, logits, 3, bsv), 1, 1, 1);
  } else {
    logits = reshape(e, logits, 2, bv);
  }
  type_of(&logits, type);
  EMIT_LINE(e, "return %s, %s, %s : %s, %s, %s", logits.name,
            e->k_cache_out.name, e->v_cache_out.name, type, cache_type,
            cache_type);
  if (!e->status) {
    e->status = pcp_string_builder_append_cstring(e->builder, "  }\n");
  }
}

// @load(params...) -> (params..., k_cache, v_cache): the parameters as
// they came and two zeroed caches. A server runs it once per worker with
// every output kept resident, so weights cross the wire once and the caches
// start on the device (no zeros shipped).
static void emit_load_function(emitter_t* e,
                               const pcp_models_parameter_table_t* table,
                               const val_t* params) {
  char type[128], cache_type[128];
  val_t kc = {.name = "%k", .rank = 5, .et = e->adt};
  int64_t cd[5] = {e->spec->layers, e->b, e->kv, e->max_len, e->hd};
  memcpy(kc.dims, cd, sizeof(cd));
  type_of(&kc, cache_type);
  if (!e->status) {
    e->status =
        pcp_string_builder_append_cstring(e->builder, "  func.func @load(");
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    type_of(&params[i], type);
    e->status = pcp_string_builder_append_f(
        e->builder, "%s%s: %s", i ? ", " : "", params[i].name, type);
  }
  if (!e->status) {
    e->status = pcp_string_builder_append_cstring(e->builder, ") -> (");
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    type_of(&params[i], type);
    e->status = pcp_string_builder_append_f(e->builder, "%s, ", type);
  }
  if (!e->status) {
    e->status = pcp_string_builder_append_f(
        e->builder,
        "%s, %s) {\n    %%k = stablehlo.constant dense<0.0> : %s\n"
        "    %%v = stablehlo.constant dense<0.0> : %s\n    return ",
        cache_type, cache_type, cache_type, cache_type);
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    e->status = pcp_string_builder_append_f(e->builder, "%s, ", params[i].name);
  }
  if (!e->status) {
    e->status = pcp_string_builder_append_cstring(e->builder, "%k, %v : ");
  }
  for (size_t i = 0; i < table->count && !e->status; ++i) {
    type_of(&params[i], type);
    e->status = pcp_string_builder_append_f(e->builder, "%s, ", type);
  }
  if (!e->status) {
    e->status = pcp_string_builder_append_f(e->builder, "%s, %s\n  }\n",
                                            cache_type, cache_type);
  }
}

pcp_status_t pcp_models_generation_module_emit(
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen,
    pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_models_generation_validate(spec, gen));
  // Scratch comes from the output builder's allocator: the caller's.
  pcp_allocator_t allocator = builder->allocator;
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_parameter_table_initialize(spec, allocator, &table));
  val_t* params = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, table.count * sizeof(val_t), (void**)&params);
  if (status) {
    pcp_models_parameter_table_deinitialize(&table);
    return status;
  }
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    snprintf(params[i].name, sizeof(params[i].name), "%%%s", p->name);
    params[i].rank = p->rank;
    params[i].dims[0] = p->dims[0];
    params[i].dims[1] = p->dims[1];
    params[i].et = p->element_type;
  }
  emitter_t e = {
      .builder = builder,
      .spec = spec,
      .adt = spec->dtype,
      .b = gen->slots,
      .d = spec->width,
      .h = spec->heads,
      .kv = pcp_models_spec_kv_heads(spec),
      .hd = pcp_models_spec_head_dim(spec),
      .f = pcp_models_spec_mlp_hidden(spec),
      .v = spec->vocab,
      .gen = true,
      .max_len = gen->max_length,
  };
  e.status = pcp_string_builder_append_f(
      builder,
      "// PCP built-in model, generation: %s, %lld layers, %lld heads (%lld "
      "kv), width %lld, head_dim %lld, vocab %lld, %s; %lld slots, max "
      "length %lld, prefill %lld.\n// KV cache [layers, slots, kv_heads, "
      "max_length, head_dim]; see docs/models.md.\nmodule @pcp_%s_generate "
      "{\n",
      pcp_models_architecture_name(spec->architecture), (long long)spec->layers,
      (long long)e.h, (long long)e.kv, (long long)e.d, (long long)e.hd,
      (long long)e.v, pcp_element_type_name(spec->dtype), (long long)gen->slots,
      (long long)gen->max_length, (long long)gen->prefill_length,
      pcp_models_architecture_name(spec->architecture));
  e.t = gen->prefill_length;
  emit_generation_function(&e, &table, params, true);
  emit_generation_function(&e, &table, params, false);
  emit_load_function(&e, &table, params);
  if (!e.status) {
    e.status = pcp_string_builder_append_cstring(builder, "}\n");
  }
  pcp_allocator_free(allocator, params);
  pcp_models_parameter_table_deinitialize(&table);
  return e.status;
}
