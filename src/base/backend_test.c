// SPDX-License-Identifier: Apache-2.0
//
// The one backend table (base.h "Backends"): canonical names round-trip,
// aliases and pseudo kinds are admitted only by their flags, the error lists
// the table, and the rows hold the IREE names the compiler and runtime use.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"

static bool parse(const char* name, pcp_backend_parse_flags_t flags,
                  pcp_backend_kind_t* out_kind) {
  return pcp_backend_kind_parse(pcp_make_cstring_view(name), flags, out_kind);
}

static void names_round_trip_in_canonical_order(void** state) {
  (void)state;
  static const char* const kExpected[] = {"cpu", "cuda", "rocm", "vulkan",
                                          "metal"};
  for (int i = 0; i < PCP_BACKEND_KIND_COUNT_; ++i) {
    const char* name = pcp_backend_kind_name((pcp_backend_kind_t)i);
    assert_string_equal(name, kExpected[i]);
    pcp_backend_kind_t kind = PCP_BACKEND_KIND_ANY;
    assert_true(parse(name, PCP_BACKEND_PARSE_FLAG_NONE, &kind));
    assert_int_equal(kind, i);
    assert_int_equal(pcp_backend_kind_info(kind)->kind, i);
  }
  assert_string_equal(pcp_backend_kind_name(PCP_BACKEND_KIND_ANY), "any");
  assert_string_equal(pcp_backend_kind_name(PCP_BACKEND_KIND_AUTO), "auto");
  assert_string_equal(pcp_backend_kind_name((pcp_backend_kind_t)42), "unknown");
  assert_null(pcp_backend_kind_info(PCP_BACKEND_KIND_ANY));
}

static void aliases_and_pseudo_kinds_need_their_flag(void** state) {
  (void)state;
  pcp_backend_kind_t kind = PCP_BACKEND_KIND_CPU;
  assert_false(parse("hip", PCP_BACKEND_PARSE_FLAG_NONE, &kind));
  assert_false(parse("any", PCP_BACKEND_PARSE_FLAG_NONE, &kind));
  assert_false(parse("auto", PCP_BACKEND_PARSE_FLAG_ANY, &kind));
  assert_false(parse("local-task", PCP_BACKEND_PARSE_FLAG_ALIASES, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_CPU);  // unchanged on failure
  assert_true(parse("hip", PCP_BACKEND_PARSE_FLAG_ALIASES, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_ROCM);
  assert_true(parse("any", PCP_BACKEND_PARSE_FLAG_ANY, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_ANY);
  assert_true(parse("auto", PCP_BACKEND_PARSE_FLAG_AUTO, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_AUTO);
  assert_true(parse("local-sync", PCP_BACKEND_PARSE_FLAG_DRIVERS, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_CPU);
  assert_true(parse("hip", PCP_BACKEND_PARSE_FLAG_DRIVERS, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_ROCM);
  // Exact and case-sensitive, as every table it replaced.
  assert_false(parse("CUDA", ~0u, &kind));
  assert_false(parse("cud", ~0u, &kind));
  assert_false(parse("", ~0u, &kind));
  // A view, not a C string: only its bytes count.
  assert_true(
      pcp_backend_kind_parse(pcp_make_string_view("cudax", 4), 0, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_CUDA);
}

static void parse_error_lists_the_table(void** state) {
  (void)state;
  pcp_backend_kind_t kind;
  pcp_status_t status = pcp_backend_kind_parse_or_status(
      "tpu", PCP_BACKEND_PARSE_FLAG_NONE, &kind);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  char text[256];
  pcp_status_format(status, text, sizeof(text));
  assert_non_null(strstr(
      text,
      "unknown backend 'tpu' (expected cpu, cuda, rocm, vulkan or metal)"));
  pcp_status_ignore(status);
  status = pcp_backend_kind_parse_or_status(NULL, 0, &kind);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
  assert_null(pcp_backend_kind_parse_or_status("rocm", 0, &kind));
  assert_int_equal(kind, PCP_BACKEND_KIND_ROCM);

  char list[64];
  pcp_backend_kind_list_format(PCP_BACKEND_PARSE_FLAG_ANY, list, sizeof(list));
  assert_string_equal(list, "any, cpu, cuda, rocm, vulkan or metal");
  pcp_backend_kind_list_format(0, list, 8);  // truncates, stays terminated
  assert_string_equal(list, "cpu, cu");
}

static void rows_hold_the_iree_names(void** state) {
  (void)state;
  const pcp_backend_kind_info_t* rocm =
      pcp_backend_kind_info(PCP_BACKEND_KIND_ROCM);
  assert_string_equal(rocm->iree_driver, "hip");
  assert_string_equal(rocm->iree_target_device, "hip");
  assert_string_equal(rocm->default_target, "gfx942");
  assert_string_equal(rocm->visible_devices_env[0], "HIP_VISIBLE_DEVICES");
  const pcp_backend_kind_info_t* cpu =
      pcp_backend_kind_info(PCP_BACKEND_KIND_CPU);
  assert_string_equal(cpu->iree_driver, "local-task");
  assert_string_equal(cpu->iree_target_device, "local");
  assert_null(cpu->visible_devices_env[0]);
  struct {
    const char* name;
    const char* driver;
  } kDrivers[] = {{"cpu", "local-task"},
                  {"local-task", "local-task"},
                  {"local-sync", "local-sync"},
                  {"cuda", "cuda"},
                  {"rocm", "hip"},
                  {"hip", "hip"},
                  {"vulkan", "vulkan"},
                  {"metal", "metal"}};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kDrivers); ++i) {
    assert_string_equal(pcp_backend_iree_driver_for_name(
                            pcp_make_cstring_view(kDrivers[i].name)),
                        kDrivers[i].driver);
  }
  assert_null(pcp_backend_iree_driver_for_name(pcp_make_cstring_view("tpu")));
  assert_null(pcp_backend_iree_driver_for_name(pcp_make_cstring_view("any")));
#if defined(__APPLE__)
  assert_int_equal(pcp_backend_kind_host(), PCP_BACKEND_KIND_METAL);
#else
  assert_int_equal(pcp_backend_kind_host(), PCP_BACKEND_KIND_CPU);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_round_trip_in_canonical_order),
      cmocka_unit_test(aliases_and_pseudo_kinds_need_their_flag),
      cmocka_unit_test(parse_error_lists_the_table),
      cmocka_unit_test(rows_hold_the_iree_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
