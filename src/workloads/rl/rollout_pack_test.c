// SPDX-License-Identifier: Apache-2.0
// The rollout library without a model (rollout.h): batch_pack on hand-made
// rollouts, every field of every row checked against the layout written
// out by hand; score through a built-in reward and through fake verifiers;
// generate's refusals against a real service that has no workers. The
// generation itself runs in tests/integration/rollout_test.py (a real
// service and a real worker).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workloads/workloads.h"

#define PAD 99

// A rollout over the caller's arrays (nothing owned).
static pcp_workloads_rl_rollout_t rollout(const int32_t* prompt,
                                          int64_t prompt_count,
                                          const int32_t* ids, const float* logp,
                                          int64_t count) {
  pcp_workloads_rl_rollout_t r;
  memset(&r, 0, sizeof(r));
  r.prompt_ids = (int32_t*)prompt;
  r.prompt_count = prompt_count;
  r.completion_ids = (int32_t*)ids;
  r.completion_logp = (float*)logp;
  r.completion_count = count;
  return r;
}

// Row |row| of |b| equals the expected arrays (length b->length each).
static void expect_row(const pcp_workloads_rl_batch_t* b, int64_t row,
                       const int32_t* input, const int32_t* target,
                       const float* mask, const float* old_logp,
                       float advantage) {
  for (int64_t t = 0; t < b->length; ++t) {
    int64_t i = row * b->length + t;
    if (b->input_ids[i] != input[t] || b->targets[i] != target[t] ||
        b->mask[i] != mask[t] || b->old_logp[i] != old_logp[t] ||
        b->ref_logp[i] != 0.0f) {
      fail_msg(
          "row %lld t %lld: input %d/%d target %d/%d mask %g/%g "
          "old_logp %g/%g ref_logp %g",
          (long long)row, (long long)t, b->input_ids[i], input[t],
          b->targets[i], target[t], (double)b->mask[i], (double)mask[t],
          (double)b->old_logp[i], (double)old_logp[t], (double)b->ref_logp[i]);
    }
  }
  assert_true(b->advantages[row] == advantage);
}

static void expect_pad_row(const pcp_workloads_rl_batch_t* b, int64_t row) {
  int32_t ids[16];
  float zeros[16] = {0};
  for (int i = 0; i < 16; ++i) {
    ids[i] = PAD;
  }
  assert_true(b->length <= 16);
  expect_row(b, row, ids, ids, zeros, zeros, 0.0f);
}

static void test_pack_layout_and_padding(void** state) {
  (void)state;
  static const int32_t p0[] = {1, 2, 3};
  static const int32_t c0[] = {4, 5};
  static const float l0[] = {-0.5f, -0.25f};
  static const int32_t p1[] = {7};
  static const int32_t c1[] = {8, 9, 10};
  static const float l1[] = {-1.0f, -2.0f, -3.0f};
  pcp_workloads_rl_rollout_t r0 = rollout(p0, 3, c0, l0, 2);
  pcp_workloads_rl_rollout_t r1 = rollout(p1, 1, c1, l1, 3);
  const pcp_workloads_rl_rollout_t* rs[] = {&r0, &r1};
  const float adv[] = {0.75f, -1.5f};
  pcp_workloads_rl_batch_t b;
  PCP_CHECK_OK(pcp_workloads_rl_batch_pack(rs, adv, 2, 4, 8, PAD,
                                           pcp_allocator_system(), &b));
  assert_int_equal(b.rows, 4);
  assert_int_equal(b.length, 8);
  assert_int_equal(b.sequences, 2);
  assert_int_equal(b.completion_tokens, 5);
  assert_int_equal(b.truncated_tokens, 0);
  // s = 1 2 3 4 5: the targets 4 and 5 are the completion's.
  {
    const int32_t in[] = {1, 2, 3, 4, 5, PAD, PAD, PAD};
    const int32_t tg[] = {2, 3, 4, 5, PAD, PAD, PAD, PAD};
    const float m[] = {0, 0, 1, 1, 0, 0, 0, 0};
    const float lp[] = {0, 0, -0.5f, -0.25f, 0, 0, 0, 0};
    expect_row(&b, 0, in, tg, m, lp, 0.75f);
  }
  // s = 7 8 9 10: every target is a completion token.
  {
    const int32_t in[] = {7, 8, 9, 10, PAD, PAD, PAD, PAD};
    const int32_t tg[] = {8, 9, 10, PAD, PAD, PAD, PAD, PAD};
    const float m[] = {1, 1, 1, 0, 0, 0, 0, 0};
    const float lp[] = {-1, -2, -3, 0, 0, 0, 0, 0};
    expect_row(&b, 1, in, tg, m, lp, -1.5f);
  }
  expect_pad_row(&b, 2);
  expect_pad_row(&b, 3);
  pcp_workloads_rl_batch_deinitialize(&b);
  assert_null(b.input_ids);
  pcp_workloads_rl_batch_deinitialize(&b);  // twice: a zeroed struct
}

static void test_pack_truncation(void** state) {
  (void)state;
  static const int32_t prompt[] = {1, 2, 3, 4, 5, 6};
  static const int32_t comp[] = {20, 21, 22, 23, 24, 25};
  static const float logp[] = {-0.1f, -0.2f, -0.3f, -0.4f, -0.5f, -0.6f};
  pcp_workloads_rl_batch_t b;
  // Length 4 holds 5 tokens of s. 6 prompt + 2 completion: the prompt
  // loses its first 3 tokens, the completion is whole.
  {
    pcp_workloads_rl_rollout_t r = rollout(prompt, 6, comp, logp, 2);
    const pcp_workloads_rl_rollout_t* rs[] = {&r};
    const float adv[] = {2.0f};
    PCP_CHECK_OK(pcp_workloads_rl_batch_pack(rs, adv, 1, 1, 4, PAD,
                                             pcp_allocator_system(), &b));
    const int32_t in[] = {4, 5, 6, 20};
    const int32_t tg[] = {5, 6, 20, 21};
    const float m[] = {0, 0, 1, 1};
    const float lp[] = {0, 0, -0.1f, -0.2f};
    expect_row(&b, 0, in, tg, m, lp, 2.0f);
    assert_int_equal(b.completion_tokens, 2);
    assert_int_equal(b.truncated_tokens, 0);
    pcp_workloads_rl_batch_deinitialize(&b);
  }
  // 2 prompt + 6 completion: one prompt token is kept (the last), then
  // the completion loses its last 2 tokens (counted, never trained on).
  {
    pcp_workloads_rl_rollout_t r = rollout(prompt, 2, comp, logp, 6);
    const pcp_workloads_rl_rollout_t* rs[] = {&r};
    const float adv[] = {-1.0f};
    PCP_CHECK_OK(pcp_workloads_rl_batch_pack(rs, adv, 1, 2, 4, PAD,
                                             pcp_allocator_system(), &b));
    const int32_t in[] = {2, 20, 21, 22};
    const int32_t tg[] = {20, 21, 22, 23};
    const float m[] = {1, 1, 1, 1};
    const float lp[] = {-0.1f, -0.2f, -0.3f, -0.4f};
    expect_row(&b, 0, in, tg, m, lp, -1.0f);
    expect_pad_row(&b, 1);
    assert_int_equal(b.completion_tokens, 4);
    assert_int_equal(b.truncated_tokens, 2);
    assert_int_equal(b.sequences, 1);
    pcp_workloads_rl_batch_deinitialize(&b);
  }
  // Exactly length + 1 tokens: nothing cut. One short: the last input
  // position holds the last token with a padding target.
  {
    pcp_workloads_rl_rollout_t r = rollout(prompt, 2, comp, logp, 3);
    pcp_workloads_rl_rollout_t q = rollout(prompt, 1, comp, logp, 3);
    const pcp_workloads_rl_rollout_t* rs[] = {&r, &q};
    const float adv[] = {0.5f, 0.25f};
    PCP_CHECK_OK(pcp_workloads_rl_batch_pack(rs, adv, 2, 2, 4, PAD,
                                             pcp_allocator_system(), &b));
    const int32_t in[] = {1, 2, 20, 21};
    const int32_t tg[] = {2, 20, 21, 22};
    const float m[] = {0, 1, 1, 1};
    const float lp[] = {0, -0.1f, -0.2f, -0.3f};
    expect_row(&b, 0, in, tg, m, lp, 0.5f);
    const int32_t in1[] = {1, 20, 21, 22};
    const int32_t tg1[] = {20, 21, 22, PAD};
    const float m1[] = {1, 1, 1, 0};
    const float lp1[] = {-0.1f, -0.2f, -0.3f, 0};
    expect_row(&b, 1, in1, tg1, m1, lp1, 0.25f);
    assert_int_equal(b.truncated_tokens, 0);
    assert_int_equal(b.completion_tokens, 6);
    pcp_workloads_rl_batch_deinitialize(&b);
  }
  // A completion without tokens: a prompt-only row, nothing trained.
  {
    pcp_workloads_rl_rollout_t r = rollout(prompt, 3, NULL, NULL, 0);
    const pcp_workloads_rl_rollout_t* rs[] = {&r};
    const float adv[] = {1.0f};
    PCP_CHECK_OK(pcp_workloads_rl_batch_pack(rs, adv, 1, 1, 4, PAD,
                                             pcp_allocator_system(), &b));
    const int32_t in[] = {1, 2, 3, PAD};
    const int32_t tg[] = {2, 3, PAD, PAD};
    const float zero[] = {0, 0, 0, 0};
    expect_row(&b, 0, in, tg, zero, zero, 1.0f);
    assert_int_equal(b.completion_tokens, 0);
    pcp_workloads_rl_batch_deinitialize(&b);
  }
  // Zero rollouts: every row pads.
  PCP_CHECK_OK(pcp_workloads_rl_batch_pack(NULL, NULL, 0, 2, 3, PAD,
                                           pcp_allocator_system(), &b));
  assert_int_equal(b.sequences, 0);
  expect_pad_row(&b, 0);
  expect_pad_row(&b, 1);
  pcp_workloads_rl_batch_deinitialize(&b);
}

static void expect_pack_error(const pcp_workloads_rl_rollout_t* const* rs,
                              const float* adv, size_t count, int64_t rows,
                              int64_t length, int32_t pad, const char* field) {
  pcp_workloads_rl_batch_t b;
  memset(&b, 0x5a, sizeof(b));
  pcp_status_t status = pcp_workloads_rl_batch_pack(
      rs, adv, count, rows, length, pad, pcp_allocator_system(), &b);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  if (strncmp(pcp_status_message(status), field, strlen(field)) != 0) {
    fail_msg("'%s' does not start with '%s'", pcp_status_message(status),
             field);
  }
  pcp_status_ignore(status);
  assert_null(b.input_ids);
  assert_int_equal(b.rows, 0);
}

static void test_pack_refusals(void** state) {
  (void)state;
  static const int32_t prompt[] = {1, 2};
  static const int32_t comp[] = {3, 4};
  static const float logp[] = {-1.0f, -1.0f};
  static const float bad_logp[] = {-1.0f, NAN};
  pcp_workloads_rl_rollout_t r = rollout(prompt, 2, comp, logp, 2);
  const pcp_workloads_rl_rollout_t* rs[] = {&r, &r};
  const float adv[] = {1.0f, 1.0f};
  expect_pack_error(rs, adv, 2, 1, 8, PAD, "count: ");
  expect_pack_error(rs, adv, 1, 0, 8, PAD, "rows: ");
  expect_pack_error(rs, adv, 1, 1, 1, PAD, "length: ");
  expect_pack_error(rs, adv, 1, (int64_t)1 << 20, (int64_t)1 << 20, PAD,
                    "rows x length: ");
  expect_pack_error(rs, adv, 1, 1, 8, -1, "pad_id: ");
  expect_pack_error(NULL, adv, 1, 1, 8, PAD, "rollouts and advantages: ");
  expect_pack_error(rs, NULL, 1, 1, 8, PAD, "rollouts and advantages: ");
  const pcp_workloads_rl_rollout_t* holes[] = {&r, NULL};
  expect_pack_error(holes, adv, 2, 2, 8, PAD, "rollouts[1]: ");
  pcp_workloads_rl_rollout_t no_prompt = rollout(prompt, 0, comp, logp, 2);
  const pcp_workloads_rl_rollout_t* np[] = {&r, &no_prompt};
  expect_pack_error(np, adv, 2, 2, 8, PAD, "rollouts[1].prompt_count: ");
  pcp_workloads_rl_rollout_t no_ids = rollout(prompt, 2, NULL, logp, 2);
  const pcp_workloads_rl_rollout_t* ni[] = {&no_ids};
  expect_pack_error(ni, adv, 1, 1, 8, PAD, "rollouts[0].completion_count: ");
  pcp_workloads_rl_rollout_t nan_logp = rollout(prompt, 2, comp, bad_logp, 2);
  const pcp_workloads_rl_rollout_t* nl[] = {&nan_logp};
  expect_pack_error(nl, adv, 1, 1, 8, PAD, "rollouts[0].completion_logp[1]: ");
  const float nan_adv[] = {1.0f, INFINITY};
  expect_pack_error(rs, nan_adv, 2, 2, 8, PAD, "advantages[1]: ");
}

// Every allocation of a pack failed in turn: RESOURCE_EXHAUSTED, nothing
// held afterwards, the batch zeroed.
static void test_pack_out_of_memory(void** state) {
  (void)state;
  static const int32_t prompt[] = {1, 2};
  static const int32_t comp[] = {3, 4};
  static const float logp[] = {-1.0f, -1.0f};
  pcp_workloads_rl_rollout_t r = rollout(prompt, 2, comp, logp, 2);
  const pcp_workloads_rl_rollout_t* rs[] = {&r};
  const float adv[] = {1.0f};
  for (int64_t n = 0;; ++n) {
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counting), n, true,
                                     &failing);
    pcp_workloads_rl_batch_t b;
    pcp_status_t status = pcp_workloads_rl_batch_pack(
        rs, adv, 1, 2, 4, PAD, pcp_allocator_failing(&failing), &b);
    if (!status) {
      assert_int_equal(b.completion_tokens, 2);
      pcp_workloads_rl_batch_deinitialize(&b);
      assert_int_equal(atomic_load(&counting.live_bytes), 0);
      assert_true(n >= 6);  // six tensors
      break;
    }
    assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
    pcp_status_ignore(status);
    assert_null(b.input_ids);
    assert_int_equal(atomic_load(&counting.live_bytes), 0);
  }
}

//===----------------------------------------------------------------------===//
// Score
//===----------------------------------------------------------------------===//

// A set of |count| rollouts over prompts 0 and 1, each completion "c<i>".
static void make_set(size_t count, pcp_workloads_rl_rollout_set_t* set) {
  memset(set, 0, sizeof(*set));
  set->allocator = pcp_allocator_system();
  PCP_CHECK_OK(pcp_allocator_calloc(set->allocator, count * sizeof(*set->items),
                                    (void**)&set->items));
  set->count = count;
  set->group_size = 1;
  for (size_t i = 0; i < count; ++i) {
    char text[32];
    snprintf(text, sizeof(text), "c%zu", i);
    pcp_workloads_rl_rollout_t* r = &set->items[i];
    r->prompt_index = (uint32_t)(i % 2);
    PCP_CHECK_OK(
        pcp_allocator_strdup(set->allocator, text, &r->completion_text));
    r->completion_length = strlen(text);
    r->completion_count = (int64_t)i + 1;
    r->reward = -7.0f;
  }
}

static void make_prompts(pcp_workloads_rl_prompts_t* prompts) {
  const char* text =
      "{\"prompt\": \"p0\", \"answer\": \"c2\", \"metadata\": {\"k\": 1}}\n"
      "{\"prompt\": \"p1\"}\n";
  PCP_CHECK_OK(pcp_workloads_rl_prompts_parse(
      pcp_make_cstring_view(text), "test", pcp_allocator_system(), prompts));
}

typedef struct fake_verifier_t {
  size_t calls;
  size_t sizes[16];
  size_t seen;          // items so far
  size_t fail_at_call;  // 0: never
  bool bad_fields;      // a sample's fields differed from the set's
} fake_verifier_t;

// Reward: the index of the item across calls + 0.5; checks the samples.
static pcp_status_t fake_score(void* self,
                               const pcp_workloads_rl_sample_t* items,
                               size_t count, double* out_rewards) {
  fake_verifier_t* f = self;
  f->calls++;
  if (f->calls < 16) {
    f->sizes[f->calls - 1] = count;
  }
  if (f->fail_at_call && f->calls == f->fail_at_call) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "verifier down");
  }
  for (size_t k = 0; k < count; ++k) {
    size_t i = f->seen + k;
    char want[32];
    snprintf(want, sizeof(want), "c%zu", i);
    const pcp_workloads_rl_sample_t* s = &items[k];
    bool odd = i % 2 == 1;
    f->bad_fields =
        f->bad_fields ||
        !pcp_string_view_equal(s->completion, pcp_make_cstring_view(want)) ||
        !pcp_string_view_equal(s->prompt,
                               pcp_make_cstring_view(odd ? "p1" : "p0")) ||
        (odd ? s->answer.data != NULL
             : !pcp_string_view_equal(s->answer,
                                      pcp_make_cstring_view("c2"))) ||
        (odd ? s->metadata != NULL : !json_is_object(s->metadata)) ||
        s->completion_token_count != (int64_t)i + 1;
    out_rewards[k] = (double)i + 0.5;
  }
  f->seen += count;
  return pcp_ok_status();
}

static void test_score_slices_and_fields(void** state) {
  (void)state;
  pcp_workloads_rl_prompts_t prompts;
  make_prompts(&prompts);
  pcp_workloads_rl_rollout_set_t set;
  make_set(7, &set);
  fake_verifier_t fake = {0};
  pcp_workloads_rl_verifier_t verifier = {.self = &fake,
                                          .score_batch = fake_score};
  PCP_CHECK_OK(pcp_workloads_rl_rollouts_score(&verifier, &prompts, 3, &set));
  assert_int_equal(fake.calls, 3);
  assert_int_equal(fake.sizes[0], 3);
  assert_int_equal(fake.sizes[1], 3);
  assert_int_equal(fake.sizes[2], 1);
  assert_false(fake.bad_fields);
  for (size_t i = 0; i < set.count; ++i) {
    assert_true(set.items[i].reward == (float)i + 0.5f);
  }
  // max_batch 0: one call for all.
  fake = (fake_verifier_t){0};
  PCP_CHECK_OK(pcp_workloads_rl_rollouts_score(&verifier, &prompts, 0, &set));
  assert_int_equal(fake.calls, 1);
  assert_int_equal(fake.sizes[0], 7);
  // A failure in the second slice fails the call, names the slice and
  // leaves every reward as it was (no zeros).
  for (size_t i = 0; i < set.count; ++i) {
    set.items[i].reward = -7.0f;
  }
  fake = (fake_verifier_t){.fail_at_call = 2};
  pcp_status_t status =
      pcp_workloads_rl_rollouts_score(&verifier, &prompts, 3, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_UNAVAILABLE);
  char text[512];
  pcp_status_format(status, text, sizeof(text));
  assert_non_null(strstr(text, "verifier down"));
  assert_non_null(strstr(text, "[3, 6)"));
  pcp_status_ignore(status);
  for (size_t i = 0; i < set.count; ++i) {
    assert_true(set.items[i].reward == -7.0f);
  }
  // A prompt index past the prompts.
  set.items[4].prompt_index = 2;
  status = pcp_workloads_rl_rollouts_score(&verifier, &prompts, 3, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "set.items[4]"));
  pcp_status_ignore(status);
  pcp_workloads_rl_rollout_set_deinitialize(&set);
  pcp_workloads_rl_rollout_set_deinitialize(&set);  // zeroed: a no-op
  pcp_workloads_rl_prompts_deinitialize(&prompts);
}

static pcp_status_t nan_score(void* self,
                              const pcp_workloads_rl_sample_t* items,
                              size_t count, double* out_rewards) {
  (void)self;
  (void)items;
  for (size_t k = 0; k < count; ++k) {
    out_rewards[k] = k == 1 ? NAN : 1.0;
  }
  return pcp_ok_status();
}

static void test_score_builtin_and_broken(void** state) {
  (void)state;
  pcp_workloads_rl_prompts_t prompts;
  make_prompts(&prompts);
  pcp_workloads_rl_rollout_set_t set;
  make_set(4, &set);
  // contains "2": only c2 scores 1.
  pcp_workloads_rl_reward_t* reward = NULL;
  PCP_CHECK_OK(pcp_workloads_rl_reward_create_from_string(
      pcp_make_cstring_view("{\"type\": \"contains\", \"text\": \"2\"}"), NULL,
      pcp_allocator_system(), &reward));
  pcp_workloads_rl_verifier_t builtin =
      pcp_workloads_rl_reward_verifier(reward);
  PCP_CHECK_OK(pcp_workloads_rl_rollouts_score(&builtin, &prompts, 2, &set));
  assert_true(set.items[0].reward == 0.0f && set.items[1].reward == 0.0f &&
              set.items[2].reward == 1.0f && set.items[3].reward == 0.0f);
  pcp_workloads_rl_reward_release(reward);
  // exact_match needs an answer: prompt 1 has none, an error, not a 0.
  PCP_CHECK_OK(pcp_workloads_rl_reward_create_from_string(
      pcp_make_cstring_view("{\"type\": \"exact_match\"}"), NULL,
      pcp_allocator_system(), &reward));
  builtin = pcp_workloads_rl_reward_verifier(reward);
  pcp_status_t status =
      pcp_workloads_rl_rollouts_score(&builtin, &prompts, 0, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_FAILED_PRECONDITION);
  pcp_status_ignore(status);
  assert_true(set.items[2].reward == 1.0f);  // untouched
  pcp_workloads_rl_reward_release(reward);
  // A verifier that breaks its contract (NaN): INTERNAL.
  pcp_workloads_rl_verifier_t broken = {.score_batch = nan_score};
  status = pcp_workloads_rl_rollouts_score(&broken, &prompts, 0, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INTERNAL);
  pcp_status_ignore(status);
  status = pcp_workloads_rl_rollouts_score(NULL, &prompts, 0, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
  pcp_workloads_rl_rollout_set_deinitialize(&set);
  pcp_workloads_rl_prompts_deinitialize(&prompts);
}

//===----------------------------------------------------------------------===//
// Generate: refusals (no worker, so nothing is generated here)
//===----------------------------------------------------------------------===//

static void expect_generate_error(pcp_infer_service_t* service,
                                  const pcp_workloads_rl_rollout_request_t* rq,
                                  pcp_status_code_t code, const char* text) {
  pcp_workloads_rl_rollout_set_t set;
  memset(&set, 0x5a, sizeof(set));
  pcp_status_t status = pcp_workloads_rl_rollouts_generate(
      service, rq, pcp_allocator_system(), &set);
  assert_int_equal(pcp_status_code(status), code);
  char message[512];
  pcp_status_format(status, message, sizeof(message));
  if (!strstr(message, text)) {
    fail_msg("'%s' does not hold '%s'", message, text);
  }
  pcp_status_ignore(status);
  assert_null(set.items);
  assert_int_equal(set.count, 0);
}

static bool stop_now(void* user_data) {
  (void)user_data;
  return true;
}

static void test_generate_refusals(void** state) {
  (void)state;
  setenv("PCP_ROLLOUT_TEST_JOIN", "join", 1);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_ROLLOUT_TEST_JOIN";
  pcp_fabric_endpoint_t* fabric = NULL;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&fabric_options,
                                          pcp_allocator_system(), &fabric));
  pcp_infer_service_options_t options = {.fabric = fabric};
  pcp_infer_service_t* service = NULL;
  PCP_CHECK_OK(
      pcp_infer_service_create(&options, pcp_allocator_system(), &service));
  pcp_workloads_rl_prompts_t prompts;
  make_prompts(&prompts);
  const uint32_t indices[] = {0, 1, 0};
  const pcp_workloads_rl_rollout_request_t good = {
      .model = "none",
      .prompts = &prompts,
      .prompt_indices = indices,
      .prompt_count = 3,
      .group_size = 4,
      .temperature = 1.0,
      .top_p = 1.0,
      .max_tokens = 8,
  };
  pcp_workloads_rl_rollout_request_t rq = good;
  rq.model = NULL;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT, "model: ");
  rq = good;
  rq.prompts = NULL;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT, "prompts: ");
  rq = good;
  rq.prompt_count = 0;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "prompt_indices: ");
  const uint32_t past[] = {0, 2};
  rq = good;
  rq.prompt_indices = past;
  rq.prompt_count = 2;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "prompt_indices[1]: 2 ");
  rq = good;
  rq.group_size = 0;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "group_size: ");
  rq.group_size = 1025;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "group_size: ");
  rq = good;
  rq.temperature = NAN;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "temperature: ");
  rq = good;
  rq.top_p = 0.0;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT, "top_p: ");
  rq = good;
  rq.max_tokens = 0;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "max_tokens: ");
  rq = good;
  rq.timeout_ms = -1;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "timeout_ms: ");
  // Past the limit: the deadline in ns (start + timeout_ms x 10^6) would
  // overflow and end the call at once with DEADLINE_EXCEEDED.
  rq.timeout_ms = INT64_MAX / 1000;
  expect_generate_error(service, &rq, PCP_STATUS_INVALID_ARGUMENT,
                        "timeout_ms: ");
  // An unknown model fails the call with the service's NOT_FOUND, naming
  // the rollout.
  expect_generate_error(service, &good, PCP_STATUS_NOT_FOUND,
                        "rollout of prompt 0 sample 0");
  // stop() before anything: CANCELLED.
  rq = good;
  rq.stop = stop_now;
  expect_generate_error(service, &rq, PCP_STATUS_CANCELLED, "stopped");
  pcp_workloads_rl_prompts_deinitialize(&prompts);
  pcp_infer_service_release(service);
  pcp_fabric_endpoint_release(fabric);
}

// A model that no worker serves (its weights are missing, and there is no
// worker anyway): UNAVAILABLE is waited out until timeout_ms, then
// DEADLINE_EXCEEDED quoting the service's refusal.
static void test_generate_waits_for_a_worker_until_the_deadline(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-rollout-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof(path), "%s/model.json", dir);
  const char* json =
      "{\"name\": \"m\", \"architecture\": \"gpt\", \"layers\": 1, "
      "\"heads\": 2, \"width\": 16, \"vocab\": 256, \"block_size\": 64, "
      "\"tokenizer\": {\"kind\": \"byte\"}}";
  assert_null(pcp_file_write_atomic(path, json, strlen(json)));
  setenv("PCP_ROLLOUT_TEST_JOIN", "join", 1);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_ROLLOUT_TEST_JOIN";
  pcp_fabric_endpoint_t* fabric = NULL;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&fabric_options,
                                          pcp_allocator_system(), &fabric));
  const char* dirs[] = {dir};
  pcp_infer_service_options_t options = {
      .fabric = fabric, .model_dirs = dirs, .model_dir_count = 1};
  pcp_infer_service_t* service = NULL;
  PCP_CHECK_OK(
      pcp_infer_service_create(&options, pcp_allocator_system(), &service));
  pcp_workloads_rl_prompts_t prompts;
  make_prompts(&prompts);
  const uint32_t indices[] = {0};
  pcp_workloads_rl_rollout_request_t rq = {
      .model = "m",
      .prompts = &prompts,
      .prompt_indices = indices,
      .prompt_count = 1,
      .group_size = 2,
      .temperature = 1.0,
      .top_p = 1.0,
      .max_tokens = 4,
  };
  // No timeout: at once.
  expect_generate_error(service, &rq, PCP_STATUS_UNAVAILABLE, "m");
  rq.timeout_ms = 300;
  pcp_clock_t clock = pcp_clock_system();
  int64_t start = pcp_clock_now_ns(clock);
  expect_generate_error(service, &rq, PCP_STATUS_DEADLINE_EXCEEDED,
                        "last refusal: ");
  int64_t took_ms = (pcp_clock_now_ns(clock) - start) / 1000000;
  assert_true(took_ms >= 300 && took_ms < 5000);
  pcp_workloads_rl_prompts_deinitialize(&prompts);
  pcp_infer_service_release(service);
  pcp_fabric_endpoint_release(fabric);
  unlink(path);
  rmdir(dir);
}

// The stop reaches a stoppable verifier (the external one) on every slice;
// a stop that turns true fails the call with the verifier's CANCELLED and
// leaves the rewards as they were. Built-in rewards (no stoppable hook)
// ignore it.
typedef struct stop_counter_t {
  int checks;
  int stop_after;  // the check that first answers true
} stop_counter_t;

static bool counting_stop(void* user_data) {
  stop_counter_t* c = user_data;
  return ++c->checks >= c->stop_after;
}

static pcp_status_t fake_score_stoppable(void* self,
                                         const pcp_workloads_rl_sample_t* items,
                                         size_t count,
                                         const pcp_workloads_rl_stop_t* stop,
                                         double* out_rewards) {
  if (stop->should_stop(stop->user_data)) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "scoring cancelled");
  }
  return fake_score(self, items, count, out_rewards);
}

static void test_score_stop(void** state) {
  (void)state;
  pcp_workloads_rl_prompts_t prompts;
  make_prompts(&prompts);
  pcp_workloads_rl_rollout_set_t set;
  make_set(7, &set);
  fake_verifier_t fake = {0};
  pcp_workloads_rl_verifier_t verifier = {
      .self = &fake,
      .score_batch = fake_score,
      .score_batch_stoppable = fake_score_stoppable};
  stop_counter_t never = {.stop_after = 1000};
  pcp_workloads_rl_stop_t stop = {counting_stop, &never};
  PCP_CHECK_OK(pcp_workloads_rl_rollouts_score_until(&verifier, &prompts, 3,
                                                     &stop, &set));
  assert_int_equal(never.checks, 3);
  assert_int_equal(fake.calls, 3);
  for (size_t i = 0; i < set.count; ++i) {
    assert_true(set.items[i].reward == (float)i + 0.5f);
    set.items[i].reward = -7.0f;
  }
  fake = (fake_verifier_t){0};
  stop_counter_t second = {.stop_after = 2};
  stop.user_data = &second;
  pcp_status_t status = pcp_workloads_rl_rollouts_score_until(
      &verifier, &prompts, 3, &stop, &set);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_CANCELLED);
  assert_non_null(strstr(pcp_status_message(status), "scoring cancelled"));
  pcp_status_ignore(status);
  assert_int_equal(fake.calls, 1);
  for (size_t i = 0; i < set.count; ++i) {
    assert_true(set.items[i].reward == -7.0f);
  }
  // Without the hook the stop is not consulted (built-in rewards).
  verifier.score_batch_stoppable = NULL;
  fake = (fake_verifier_t){0};
  stop_counter_t at_once = {.stop_after = 1};
  stop.user_data = &at_once;
  PCP_CHECK_OK(pcp_workloads_rl_rollouts_score_until(&verifier, &prompts, 0,
                                                     &stop, &set));
  assert_int_equal(at_once.checks, 0);
  assert_int_equal(fake.calls, 1);
  pcp_workloads_rl_rollout_set_deinitialize(&set);
  pcp_workloads_rl_prompts_deinitialize(&prompts);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_layout_and_padding),
      cmocka_unit_test(test_pack_truncation),
      cmocka_unit_test(test_pack_refusals),
      cmocka_unit_test(test_pack_out_of_memory),
      cmocka_unit_test(test_score_slices_and_fields),
      cmocka_unit_test(test_score_stop),
      cmocka_unit_test(test_score_builtin_and_broken),
      cmocka_unit_test(test_generate_refusals),
      cmocka_unit_test(test_generate_waits_for_a_worker_until_the_deadline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
