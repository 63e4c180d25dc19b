// SPDX-License-Identifier: Apache-2.0
// The GRPO objective as StableHLO text over a built-in model's forward.
//
// The module is the model's own (pcp_models_module_emit: @main, @logits)
// with @grpo and @grpo_metrics appended; both call @logits, so the policy's
// log-probabilities come from exactly the forward that training and
// inference use, and PCP's autodiff (which inlines func.call) derives
// d loss / d params from @grpo like it does for @main. Every op used here
// has a VJP rule (docs/autodiff.md): reduce (add, max), broadcast_in_dim,
// subtract, exponential, log, select, multiply, clamp, minimum, maximum,
// divide, negate.
//
// Formulas (docs/rl.md):
//   logp    = log_softmax(logits / temperature)[targets]
//             (row max subtracted; temperature > 0, 1 = the model's own)
//   ratio   = exp(logp - old_logp)
//   surr    = min(ratio A, clamp(ratio, 1 - clip_low, 1 + clip_high) A)
//   kl      = exp(ref_logp - logp) - (ref_logp - logp) - 1     (k3)
//   loss    = -sum(mask (surr - beta kl)) / N
// with N = token_normalizer when it is > 0, else max(sum(mask), 1).

#include <stdio.h>
#include <string.h>

#include "workloads/rl/rl.h"

// Appends one indented line unless an earlier append failed (the builder
// formats straight into its buffer, hence a macro).
#define LINE(s, fmt, ...)                                                      \
  do {                                                                         \
    if (!(s)->status) {                                                        \
      (s)->status = pcp_string_builder_append_f((s)->builder, "    " fmt "\n", \
                                                __VA_ARGS__);                  \
    }                                                                          \
  } while (0)

typedef struct objective_emitter_t {
  pcp_string_builder_t* builder;
  pcp_status_t status;
  const pcp_models_parameter_table_t* table;
  long long b, t, v;
  // Type spellings used throughout.
  char bt[64];    // tensor<BxTxf32>
  char bti[64];   // tensor<BxTxi32>
  char bt1[64];   // tensor<BxTxi1>
  char btv[64];   // tensor<BxTxVxf32>
  char btvi[64];  // tensor<BxTxVxi32>
  char btv1[64];  // tensor<BxTxVxi1>
  char vb[64];    // tensor<Bxf32>
} objective_emitter_t;

static void append(objective_emitter_t* s, const char* text) {
  if (!s->status) {
    s->status = pcp_string_builder_append_cstring(s->builder, text);
  }
}

static void parameter_type(const pcp_models_parameter_t* p, char out[96]) {
  size_t used = (size_t)snprintf(out, 96, "tensor<");
  for (int32_t i = 0; i < p->rank && used < 96; ++i) {
    used +=
        (size_t)snprintf(out + used, 96 - used, "%lldx", (long long)p->dims[i]);
  }
  if (used < 96) {
    snprintf(out + used, 96 - used, "%s>",
             pcp_element_type_name(p->element_type));
  }
}

// "  func.func @NAME(%p0: ..., %input_ids: ..., ..., %beta: tensor<f32>,
//    %token_normalizer: tensor<f32>, %temperature: tensor<f32>)"
static void emit_signature(objective_emitter_t* s, const char* name) {
  if (!s->status) {
    s->status =
        pcp_string_builder_append_f(s->builder, "  func.func @%s(", name);
  }
  char type[96];
  for (size_t i = 0; i < s->table->count && !s->status; ++i) {
    parameter_type(&s->table->parameters[i], type);
    s->status =
        pcp_string_builder_append_f(s->builder, "%%p%zu: %s, ", i, type);
  }
  if (!s->status) {
    s->status = pcp_string_builder_append_f(
        s->builder,
        "%%input_ids: %s, %%targets: %s, %%mask: %s, %%old_logp: %s, "
        "%%ref_logp: %s, %%advantages: %s, %%clip_low: tensor<f32>, "
        "%%clip_high: tensor<f32>, %%beta: tensor<f32>, "
        "%%token_normalizer: tensor<f32>, %%temperature: tensor<f32>)",
        s->bti, s->bti, s->bt, s->bt, s->bt, s->vb);
  }
}

// sum(x) over B and T -> tensor<f32>.
static void emit_sum(objective_emitter_t* s, const char* result,
                     const char* x) {
  LINE(s,
       "%s = stablehlo.reduce(%s init: %%zero) applies stablehlo.add across "
       "dimensions = [0, 1] : (%s, tensor<f32>) -> tensor<f32>",
       result, x, s->bt);
}

// The shared body: per-token log-probabilities, ratio, clipped surrogate,
// k3 KL and the masked token mean. Leaves %loss, %logp, %ratio, %kl, %adv,
// %low, %high, %count (the batch's completion tokens, at least 1), %ones_bt
// and %zeros_bt defined.
static void emit_body(objective_emitter_t* s) {
  // The call to the model's forward.
  if (!s->status) {
    s->status = pcp_string_builder_append_cstring(
        s->builder, "    %model_logits = func.call @logits(");
  }
  for (size_t i = 0; i < s->table->count && !s->status; ++i) {
    s->status = pcp_string_builder_append_f(s->builder, "%%p%zu, ", i);
  }
  append(s, "%input_ids) : (");
  char type[96];
  for (size_t i = 0; i < s->table->count && !s->status; ++i) {
    parameter_type(&s->table->parameters[i], type);
    s->status = pcp_string_builder_append_f(s->builder, "%s, ", type);
  }
  if (!s->status) {
    s->status =
        pcp_string_builder_append_f(s->builder, "%s) -> %s\n", s->bti, s->btv);
  }
  LINE(s, "%s",
       "%neg_inf = stablehlo.constant dense<0xFF800000> : tensor<f32>");
  LINE(s, "%s", "%zero = stablehlo.constant dense<0.0> : tensor<f32>");
  LINE(s, "%s", "%one = stablehlo.constant dense<1.0> : tensor<f32>");
  // The rollouts sampled from softmax(logits / T): the policy's logp must
  // be of the same distribution for the ratio to be 1 on-policy. x / 1 is
  // exact, so T = 1 gives the unscaled objective bit for bit.
  LINE(s,
       "%%temperature_btv = stablehlo.broadcast_in_dim %%temperature, dims = "
       "[] : (tensor<f32>) -> %s",
       s->btv);
  LINE(s, "%%logits = stablehlo.divide %%model_logits, %%temperature_btv : %s",
       s->btv);
  LINE(s,
       "%%zeros_bt = stablehlo.broadcast_in_dim %%zero, dims = [] : "
       "(tensor<f32>) -> %s",
       s->bt);
  LINE(s,
       "%%ones_bt = stablehlo.broadcast_in_dim %%one, dims = [] : "
       "(tensor<f32>) -> %s",
       s->bt);

  // logp = log_softmax(logits)[targets] = (l_t - max) - log(sum(exp(l - max))).
  LINE(s,
       "%%row_max = stablehlo.reduce(%%logits init: %%neg_inf) applies "
       "stablehlo.maximum across dimensions = [2] : (%s, tensor<f32>) -> %s",
       s->btv, s->bt);
  LINE(s,
       "%%row_max_b = stablehlo.broadcast_in_dim %%row_max, dims = [0, 1] "
       ": (%s) -> %s",
       s->bt, s->btv);
  LINE(s, "%%shifted = stablehlo.subtract %%logits, %%row_max_b : %s", s->btv);
  LINE(s, "%%exp = stablehlo.exponential %%shifted : %s", s->btv);
  LINE(s,
       "%%sum_exp = stablehlo.reduce(%%exp init: %%zero) applies stablehlo.add "
       "across dimensions = [2] : (%s, tensor<f32>) -> %s",
       s->btv, s->bt);
  LINE(s, "%%lse = stablehlo.log %%sum_exp : %s", s->bt);
  LINE(s, "%%vocab = stablehlo.iota dim = 2 : %s", s->btvi);
  LINE(s,
       "%%targets_b = stablehlo.broadcast_in_dim %%targets, dims = [0, 1] "
       ": (%s) -> %s",
       s->bti, s->btvi);
  LINE(s,
       "%%one_hot = stablehlo.compare EQ, %%vocab, %%targets_b : (%s, %s) "
       "-> %s",
       s->btvi, s->btvi, s->btv1);
  LINE(s,
       "%%zeros_btv = stablehlo.broadcast_in_dim %%zero, dims = [] : "
       "(tensor<f32>) -> %s",
       s->btv);
  LINE(s,
       "%%picked_all = stablehlo.select %%one_hot, %%shifted, %%zeros_btv "
       ": %s, %s",
       s->btv1, s->btv);
  LINE(s,
       "%%picked = stablehlo.reduce(%%picked_all init: %%zero) applies "
       "stablehlo.add across dimensions = [2] : (%s, tensor<f32>) -> %s",
       s->btv, s->bt);
  LINE(s, "%%logp = stablehlo.subtract %%picked, %%lse : %s", s->bt);

  // The clipped surrogate.
  LINE(s, "%%log_ratio = stablehlo.subtract %%logp, %%old_logp : %s", s->bt);
  LINE(s, "%%ratio = stablehlo.exponential %%log_ratio : %s", s->bt);
  LINE(s,
       "%%adv = stablehlo.broadcast_in_dim %%advantages, dims = [0] : "
       "(%s) -> %s",
       s->vb, s->bt);
  LINE(s, "%s", "%low = stablehlo.subtract %one, %clip_low : tensor<f32>");
  LINE(s, "%s", "%high = stablehlo.add %one, %clip_high : tensor<f32>");
  LINE(s,
       "%%clipped = \"stablehlo.clamp\"(%%low, %%ratio, %%high) : "
       "(tensor<f32>, %s, tensor<f32>) -> %s",
       s->bt, s->bt);
  LINE(s, "%%surr_raw = stablehlo.multiply %%ratio, %%adv : %s", s->bt);
  LINE(s, "%%surr_clipped = stablehlo.multiply %%clipped, %%adv : %s", s->bt);
  LINE(s, "%%surr = stablehlo.minimum %%surr_raw, %%surr_clipped : %s", s->bt);

  // k3 KL to the reference policy.
  LINE(s, "%%ref_delta = stablehlo.subtract %%ref_logp, %%logp : %s", s->bt);
  LINE(s, "%%ref_ratio = stablehlo.exponential %%ref_delta : %s", s->bt);
  LINE(s, "%%kl_plus_one = stablehlo.subtract %%ref_ratio, %%ref_delta : %s",
       s->bt);
  LINE(s, "%%kl = stablehlo.subtract %%kl_plus_one, %%ones_bt : %s", s->bt);
  LINE(s,
       "%%beta_bt = stablehlo.broadcast_in_dim %%beta, dims = [] : "
       "(tensor<f32>) -> %s",
       s->bt);
  LINE(s, "%%penalty = stablehlo.multiply %%beta_bt, %%kl : %s", s->bt);
  LINE(s, "%%objective = stablehlo.subtract %%surr, %%penalty : %s", s->bt);

  // Token-level mean over the masked tokens; max(count, 1) makes a batch
  // without completion tokens a zero loss instead of 0/0. A positive
  // token_normalizer replaces the count: the tokens of a whole accumulated
  // step, or Dr. GRPO's constant.
  LINE(s, "%%masked = stablehlo.multiply %%mask, %%objective : %s", s->bt);
  emit_sum(s, "%total", "%masked");
  emit_sum(s, "%mask_sum", "%mask");
  LINE(s, "%s", "%count = stablehlo.maximum %mask_sum, %one : tensor<f32>");
  LINE(s, "%s",
       "%given = stablehlo.compare GT, %token_normalizer, %zero : "
       "(tensor<f32>, tensor<f32>) -> tensor<i1>");
  LINE(s, "%s",
       "%divisor = stablehlo.select %given, %token_normalizer, %count : "
       "tensor<i1>, tensor<f32>");
  LINE(s, "%s",
       "%mean_objective = stablehlo.divide %total, %divisor : "
       "tensor<f32>");
  LINE(s, "%s", "%loss = stablehlo.negate %mean_objective : tensor<f32>");
}

// Masked token mean of |x| [B, T] f32 into |result|.
static void emit_masked_mean(objective_emitter_t* s, const char* result,
                             const char* x) {
  LINE(s, "%s_masked = stablehlo.multiply %%mask, %s : %s", result, x, s->bt);
  char masked[64], sum[64];
  snprintf(masked, sizeof(masked), "%s_masked", result);
  snprintf(sum, sizeof(sum), "%s_sum", result);
  emit_sum(s, sum, masked);
  LINE(s, "%s = stablehlo.divide %s, %%count : tensor<f32>", result, sum);
}

static void emit_grpo(objective_emitter_t* s) {
  emit_signature(s, PCP_RL_OBJECTIVE_FUNCTION);
  append(s, " -> tensor<f32> {\n");
  emit_body(s);
  LINE(s, "%s", "return %loss : tensor<f32>");
  append(s, "  }\n");
}

// A token is counted as clipped where the clip binds, i.e. where the min
// picks the clamped term and its gradient is zero: ratio below 1 - clip_low
// with A < 0 (low), ratio above 1 + clip_high with A > 0 (high).
static void emit_metrics(objective_emitter_t* s) {
  emit_signature(s, PCP_RL_OBJECTIVE_METRICS_FUNCTION);
  if (!s->status) {
    s->status = pcp_string_builder_append_f(
        s->builder,
        " -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, "
        "tensor<f32>, %s) {\n",
        s->bt);
  }
  emit_body(s);
  emit_masked_mean(s, "%mean_kl", "%kl");
  emit_masked_mean(s, "%mean_ratio", "%ratio");
  LINE(s,
       "%%low_b = stablehlo.broadcast_in_dim %%low, dims = [] : "
       "(tensor<f32>) -> %s",
       s->bt);
  LINE(s,
       "%%high_b = stablehlo.broadcast_in_dim %%high, dims = [] : "
       "(tensor<f32>) -> %s",
       s->bt);
  LINE(s, "%%below = stablehlo.compare LT, %%ratio, %%low_b : (%s, %s) -> %s",
       s->bt, s->bt, s->bt1);
  LINE(s, "%%above = stablehlo.compare GT, %%ratio, %%high_b : (%s, %s) -> %s",
       s->bt, s->bt, s->bt1);
  LINE(s,
       "%%negative = stablehlo.compare LT, %%adv, %%zeros_bt : (%s, %s) -> "
       "%s",
       s->bt, s->bt, s->bt1);
  LINE(s,
       "%%positive = stablehlo.compare GT, %%adv, %%zeros_bt : (%s, %s) -> "
       "%s",
       s->bt, s->bt, s->bt1);
  LINE(s, "%%low_hit = stablehlo.and %%below, %%negative : %s", s->bt1);
  LINE(s, "%%high_hit = stablehlo.and %%above, %%positive : %s", s->bt1);
  LINE(s,
       "%%low_f = stablehlo.select %%low_hit, %%ones_bt, %%zeros_bt : "
       "%s, %s",
       s->bt1, s->bt);
  LINE(s,
       "%%high_f = stablehlo.select %%high_hit, %%ones_bt, %%zeros_bt : "
       "%s, %s",
       s->bt1, s->bt);
  emit_masked_mean(s, "%low_fraction", "%low_f");
  emit_masked_mean(s, "%high_fraction", "%high_f");
  LINE(s,
       "return %%loss, %%mean_kl, %%low_fraction, %%high_fraction, "
       "%%mean_ratio, %%logp : tensor<f32>, tensor<f32>, tensor<f32>, "
       "tensor<f32>, tensor<f32>, %s",
       s->bt);
  append(s, "  }\n");
}

pcp_status_t pcp_workloads_rl_objective_module_emit(
    const pcp_models_spec_t* spec, pcp_string_builder_t* builder) {
  // The model module first, into a scratch builder: its closing "}\n" is
  // dropped so the GRPO functions land inside it.
  pcp_string_builder_t model;
  pcp_string_builder_initialize(pcp_allocator_system(), builder->max_size,
                                &model);
  pcp_status_t status = pcp_models_module_emit(spec, &model);
  const char* text = pcp_string_builder_cstring(&model);
  size_t length = strlen(text);
  if (!status && (length < 2 || strcmp(text + length - 2, "}\n") != 0)) {
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "model module does not end with '}'");
  }
  if (!status) {
    status = pcp_string_builder_append(
        builder, (pcp_string_view_t){.data = text, .size = length - 2});
  }
  pcp_string_builder_deinitialize(&model);
  PCP_RETURN_IF_ERROR_BARE(status);

  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(pcp_models_parameter_table_initialize(
      spec, pcp_allocator_system(), &table));
  objective_emitter_t s = {
      .builder = builder,
      .table = &table,
      .b = (long long)spec->batch,
      .t = (long long)spec->block_size,
      .v = (long long)spec->vocab,
  };
  snprintf(s.bt, sizeof(s.bt), "tensor<%lldx%lldxf32>", s.b, s.t);
  snprintf(s.bti, sizeof(s.bti), "tensor<%lldx%lldxi32>", s.b, s.t);
  snprintf(s.bt1, sizeof(s.bt1), "tensor<%lldx%lldxi1>", s.b, s.t);
  snprintf(s.btv, sizeof(s.btv), "tensor<%lldx%lldx%lldxf32>", s.b, s.t, s.v);
  snprintf(s.btvi, sizeof(s.btvi), "tensor<%lldx%lldx%lldxi32>", s.b, s.t, s.v);
  snprintf(s.btv1, sizeof(s.btv1), "tensor<%lldx%lldx%lldxi1>", s.b, s.t, s.v);
  snprintf(s.vb, sizeof(s.vb), "tensor<%lldxf32>", s.b);
  append(&s, "  // GRPO objective (docs/rl.md), over @logits.\n");
  emit_grpo(&s);
  emit_metrics(&s);
  append(&s, "}\n");
  pcp_models_parameter_table_deinitialize(&table);
  return s.status;
}

void pcp_workloads_rl_objective_training_options_initialize(
    pcp_compile_training_options_t* out_options) {
  pcp_compile_training_options_initialize(out_options);
  out_options->program = PCP_COMPILE_PROGRAM_GRAD;
  out_options->function_name = PCP_RL_OBJECTIVE_FUNCTION;
  out_options->data_argument_count = PCP_RL_OBJECTIVE_DATA_ARGUMENT_COUNT;
}
