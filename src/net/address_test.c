// SPDX-License-Identifier: Apache-2.0
//
// Address parsing table and backoff bounds and jitter (pure functions).

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "net/net.h"

//===----------------------------------------------------------------------===//
// Addresses
//===----------------------------------------------------------------------===//

typedef struct address_case_t {
  const char* text;
  const char* host;  // NULL: INVALID_ARGUMENT expected
  uint16_t port;
  const char* formatted;  // expected pcp_net_address_format output
} address_case_t;

static const address_case_t address_cases[] = {
    {"127.0.0.1:80", "127.0.0.1", 80, "127.0.0.1:80"},
    {"127.0.0.1:0", "127.0.0.1", 0, "127.0.0.1:0"},
    {"0.0.0.0:65535", "0.0.0.0", 65535, "0.0.0.0:65535"},
    {"localhost:8080", "localhost", 8080, "localhost:8080"},
    {"gateway.svc.cluster.local:7000", "gateway.svc.cluster.local", 7000,
     "gateway.svc.cluster.local:7000"},
    {"[::1]:80", "::1", 80, "[::1]:80"},
    {"[::]:0", "::", 0, "[::]:0"},
    {"[fe80::1%eth0]:9", "fe80::1%eth0", 9, "[fe80::1%eth0]:9"},
    {"[2001:db8::ff]:443", "2001:db8::ff", 443, "[2001:db8::ff]:443"},
    {"host:080", "host", 80, "host:80"},
    // Bad ones.
    {"", NULL, 0, NULL},
    {"127.0.0.1", NULL, 0, NULL},
    {"127.0.0.1:", NULL, 0, NULL},
    {":80", NULL, 0, NULL},
    {"127.0.0.1:65536", NULL, 0, NULL},
    {"127.0.0.1:99999999", NULL, 0, NULL},
    {"127.0.0.1:-1", NULL, 0, NULL},
    {"127.0.0.1:+80", NULL, 0, NULL},
    {"127.0.0.1:8o", NULL, 0, NULL},
    {"127.0.0.1: 80", NULL, 0, NULL},
    {"::1:80", NULL, 0, NULL},
    {"[::1]80", NULL, 0, NULL},
    {"[::1]", NULL, 0, NULL},
    {"[::1:80", NULL, 0, NULL},
    {"[]:80", NULL, 0, NULL},
    {"[not-v6]:80", NULL, 0, NULL},
    {"[127.0.0.1]:80", NULL, 0, NULL},
    {"a b:80", NULL, 0, NULL},
    {"host]:80", NULL, 0, NULL},
};

static void test_address_table(void** state) {
  PCP_UNUSED(state);
  for (size_t i = 0; i < PCP_ARRAYSIZE(address_cases); ++i) {
    const address_case_t* c = &address_cases[i];
    pcp_net_address_t address;
    pcp_status_t status =
        pcp_net_address_parse(pcp_make_cstring_view(c->text), &address);
    if (!c->host) {
      if (!status) {
        fail_msg("'%s' parsed but should not", c->text);
      }
      assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
      // The message quotes the input so an operator sees what was wrong.
      char quoted[128];
      snprintf(quoted, sizeof(quoted), "'%s'", c->text);
      if (!strstr(pcp_status_message(status), quoted)) {
        fail_msg("message '%s' does not quote %s", pcp_status_message(status),
                 quoted);
      }
      pcp_status_ignore(status);
      assert_string_equal(address.host, "");
      continue;
    }
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fail_msg("'%s' failed: %s", c->text, text);
    }
    assert_string_equal(address.host, c->host);
    assert_int_equal(address.port, c->port);
    char formatted[PCP_NET_ADDRESS_TEXT_CAPACITY];
    size_t length =
        pcp_net_address_format(&address, formatted, sizeof(formatted));
    assert_string_equal(formatted, c->formatted);
    assert_int_equal(length, strlen(c->formatted));
  }
}

static void test_address_long_host(void** state) {
  PCP_UNUSED(state);
  char text[400];
  memset(text, 'a', 300);
  snprintf(text + 300, sizeof(text) - 300, ":80");
  pcp_net_address_t address;
  pcp_status_t status =
      pcp_net_address_parse(pcp_make_cstring_view(text), &address);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  // 255 bytes is the limit and fits.
  memset(text, 'b', 255);
  snprintf(text + 255, sizeof(text) - 255, ":1");
  PCP_CHECK_OK(pcp_net_address_parse(pcp_make_cstring_view(text), &address));
  assert_int_equal(strlen(address.host), 255);
  // Not NUL-terminated input: only the view's bytes count.
  PCP_CHECK_OK(pcp_net_address_parse(pcp_make_string_view("10.0.0.1:77xyz", 11),
                                     &address));
  assert_string_equal(address.host, "10.0.0.1");
  assert_int_equal(address.port, 77);
}

static void test_host_is_literal(void** state) {
  PCP_UNUSED(state);
  assert_true(pcp_net_host_is_literal("127.0.0.1"));
  assert_true(pcp_net_host_is_literal("::1"));
  assert_true(pcp_net_host_is_literal("fe80::1%lo"));
  assert_false(pcp_net_host_is_literal("localhost"));
  assert_false(pcp_net_host_is_literal("1.2.3"));
  assert_false(pcp_net_host_is_literal(""));
}

//===----------------------------------------------------------------------===//
// Backoff
//===----------------------------------------------------------------------===//

static void test_backoff_options_checked(void** state) {
  PCP_UNUSED(state);
  pcp_backoff_t backoff;
  pcp_backoff_options_t options = {.min_ms = -1, .max_ms = 10, .multiplier = 2};
  assert_int_equal(
      pcp_status_consume_code(pcp_backoff_initialize(&options, &backoff)),
      PCP_STATUS_INVALID_ARGUMENT);
  options = (pcp_backoff_options_t){.min_ms = 10, .max_ms = 5, .multiplier = 2};
  assert_int_equal(
      pcp_status_consume_code(pcp_backoff_initialize(&options, &backoff)),
      PCP_STATUS_INVALID_ARGUMENT);
  options =
      (pcp_backoff_options_t){.min_ms = 1, .max_ms = 5, .multiplier = 0.5};
  assert_int_equal(
      pcp_status_consume_code(pcp_backoff_initialize(&options, &backoff)),
      PCP_STATUS_INVALID_ARGUMENT);
  options =
      (pcp_backoff_options_t){.min_ms = 1, .max_ms = 5, .multiplier = NAN};
  assert_int_equal(
      pcp_status_consume_code(pcp_backoff_initialize(&options, &backoff)),
      PCP_STATUS_INVALID_ARGUMENT);
}

// Each delay lies in [min, min(max, min * mult^n)], the ceiling grows
// geometrically and saturates, and reset starts over.
static void test_backoff_bounds(void** state) {
  PCP_UNUSED(state);
  pcp_backoff_options_t options = {
      .min_ms = 100, .max_ms = 5000, .multiplier = 2.0};
  pcp_backoff_t backoff;
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &backoff));
  pcp_rng_t rng;
  pcp_rng_initialize(42, &rng);
  for (int round = 0; round < 3; ++round) {
    double ceiling = 100;
    for (int n = 0; n < 200; ++n) {
      int64_t delay = pcp_backoff_next_ms(&backoff, &rng);
      assert_true(delay >= 100);
      assert_true(delay <= (int64_t)ceiling);
      ceiling = fmin(5000, ceiling * 2);
    }
    assert_int_equal(backoff.attempt, 200);
    pcp_backoff_reset(&backoff);
    assert_int_equal(backoff.attempt, 0);
    // Right after a reset the first delay is exactly min (ceiling == min).
    assert_int_equal(pcp_backoff_next_ms(&backoff, &rng), 100);
    pcp_backoff_reset(&backoff);
  }
  // Huge attempt counts do not overflow.
  options = (pcp_backoff_options_t){
      .min_ms = 1, .max_ms = INT64_MAX / 2, .multiplier = 10.0};
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &backoff));
  for (int n = 0; n < 100; ++n) {
    int64_t delay = pcp_backoff_next_ms(&backoff, &rng);
    assert_true(delay >= 1 && delay <= INT64_MAX / 2);
  }
  // min == 0 still grows (from 1 ms).
  options =
      (pcp_backoff_options_t){.min_ms = 0, .max_ms = 1000, .multiplier = 2.0};
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &backoff));
  int64_t largest = 0;
  for (int n = 0; n < 50; ++n) {
    int64_t delay = pcp_backoff_next_ms(&backoff, &rng);
    assert_true(delay >= 0 && delay <= 1000);
    if (delay > largest) {
      largest = delay;
    }
  }
  assert_true(largest > 500);
  // Multiplier 1: constant ceiling.
  options =
      (pcp_backoff_options_t){.min_ms = 50, .max_ms = 50, .multiplier = 1.0};
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &backoff));
  for (int n = 0; n < 10; ++n) {
    assert_int_equal(pcp_backoff_next_ms(&backoff, &rng), 50);
  }
}

// Full jitter: at the saturated ceiling the delays are uniform over
// [min, max]. Checked with a fixed seed by mean and a chi-square over ten
// buckets, and by reproducibility of the sequence.
static void test_backoff_jitter_distribution(void** state) {
  PCP_UNUSED(state);
  pcp_backoff_options_t options = {
      .min_ms = 1000, .max_ms = 2000, .multiplier = 3.0};
  pcp_backoff_t backoff;
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &backoff));
  pcp_rng_t rng;
  pcp_rng_initialize(0x5eed, &rng);
  enum { SAMPLE_COUNT = 20000, BUCKET_COUNT = 10 };
  // Skip to saturation (1000 -> 2000 after one step).
  (void)pcp_backoff_next_ms(&backoff, &rng);
  (void)pcp_backoff_next_ms(&backoff, &rng);
  int64_t counts[BUCKET_COUNT] = {0};
  double sum = 0;
  for (int i = 0; i < SAMPLE_COUNT; ++i) {
    int64_t delay = pcp_backoff_next_ms(&backoff, &rng);
    assert_true(delay >= 1000 && delay <= 2000);
    sum += (double)delay;
    int bucket = (int)((delay - 1000) * BUCKET_COUNT / 1001);
    ++counts[bucket];
  }
  double mean = sum / SAMPLE_COUNT;
  assert_true(fabs(mean - 1500.0) < 15.0);
  double expected = (double)SAMPLE_COUNT / BUCKET_COUNT;
  double chi2 = 0;
  for (int b = 0; b < BUCKET_COUNT; ++b) {
    double d = (double)counts[b] - expected;
    chi2 += d * d / expected;
  }
  // 9 degrees of freedom: p = 0.001 at 27.9.
  if (chi2 > 27.9) {
    fail_msg("chi-square %.2f: not uniform", chi2);
  }

  // Same seed, same sequence (what replay needs); another seed differs.
  pcp_backoff_t a, b;
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &a));
  PCP_CHECK_OK(pcp_backoff_initialize(&options, &b));
  pcp_rng_t rng_a, rng_b, rng_c;
  pcp_rng_initialize(7, &rng_a);
  pcp_rng_initialize(7, &rng_b);
  pcp_rng_initialize(8, &rng_c);
  pcp_backoff_t c = a;
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    int64_t x = pcp_backoff_next_ms(&a, &rng_a);
    assert_int_equal(x, pcp_backoff_next_ms(&b, &rng_b));
    if (x != pcp_backoff_next_ms(&c, &rng_c)) {
      ++differ;
    }
  }
  assert_true(differ > 50);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_address_table),
      cmocka_unit_test(test_address_long_host),
      cmocka_unit_test(test_host_is_literal),
      cmocka_unit_test(test_backoff_options_checked),
      cmocka_unit_test(test_backoff_bounds),
      cmocka_unit_test(test_backoff_jitter_distribution),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
