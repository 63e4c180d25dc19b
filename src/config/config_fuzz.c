// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the config loader: JSON text and command lines through a
// table with every field type, a nested object and an alias.
//
// Built two ways: with -DPCP_FUZZ=ON under clang it is a libFuzzer binary
// (`config_fuzz tests/fuzz/config`); otherwise it is a replay tool that
// runs each file named on its command line once, registered with ctest
// over the seed corpus so every build exercises the target.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

typedef struct nested_t {
  bool present;
  char* name;
  int64_t count;
} nested_t;

typedef struct fuzz_config_t {
  bool flag;
  int64_t port;
  double ratio;
  char* host;
  int32_t mode;
  pcp_string_list_t items;
  nested_t nested;
} fuzz_config_t;

static const char* const kModes[] = {"a", "b", "c", NULL};

static const pcp_config_field_t kNestedFields[] = {
    {.name = "name",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(nested_t, name),
     .flags = PCP_CONFIG_FLAG_REQUIRED},
    {.name = "count",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(nested_t, count),
     .default_value = "1",
     .min = 0,
     .max = 10},
};
static const pcp_config_table_t kNestedTable = {
    "nested", kNestedFields, PCP_ARRAYSIZE(kNestedFields), NULL};

static const pcp_config_field_t kFields[] = {
    {.name = "flag",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(fuzz_config_t, flag)},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(fuzz_config_t, port),
     .default_value = "80",
     .min = 1,
     .max = 65535},
    {.name = "listen-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(fuzz_config_t, port),
     .min = 1,
     .max = 65535,
     .flags = PCP_CONFIG_FLAG_ALIAS},
    {.name = "ratio",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(fuzz_config_t, ratio),
     .default_value = "0.5",
     .min = 0,
     .max = 1},
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(fuzz_config_t, host),
     .default_value = "h"},
    {.name = "mode",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(fuzz_config_t, mode),
     .default_value = "a",
     .enum_values = kModes},
    {.name = "item",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(fuzz_config_t, items),
     .default_value = "x,y"},
    {.name = "nested",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(fuzz_config_t, nested),
     .object_table = &kNestedTable},
};
static const pcp_config_table_t kTable = {"fuzz", kFields,
                                          PCP_ARRAYSIZE(kFields), NULL};

// First byte even: the rest is JSON. Odd: NUL-separated argv.
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  // Counted, so that every input also checks that parsing and
  // deinitializing leave nothing behind.
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_t allocator = pcp_allocator_counting(&counter);
  fuzz_config_t config;
  memset(&config, 0, sizeof(config));
  PCP_CHECK_OK(
      pcp_config_initialize_with_allocator(&kTable, allocator, &config));
  pcp_status_t status = pcp_ok_status();
  if ((data[0] & 1) == 0) {
    pcp_string_list_t unknown = {0};
    status = pcp_config_parse_json_with_allocator(
        &kTable, allocator, (const char*)data + 1, size - 1, &config, &unknown);
    pcp_string_list_deinitialize(&unknown);
  } else {
    // Copy into NUL-terminated pieces; at most 64 arguments.
    char* text = NULL;
    PCP_CHECK_OK(pcp_allocator_malloc(allocator, size, (void**)&text));
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char* argv[64];
    int argc = 0;
    for (size_t at = 0; at < size - 1 && argc < 64;) {
      argv[argc++] = text + at;
      at += strlen(text + at) + 1;
    }
    pcp_string_list_t positionals = {0};
    status = pcp_config_parse_argv_with_allocator(&kTable, allocator, argc,
                                                  argv, &config, &positionals);
    pcp_string_list_deinitialize(&positionals);
    pcp_allocator_free(allocator, text);
  }
  if (!status) {
    status = pcp_config_validate(&kTable, &config);
  }
  if (status) {
    // Every failure is a status with a message, never a crash.
    PCP_ASSERT(pcp_status_message(status)[0] != 0);
    pcp_status_ignore(status);
  } else {
    FILE* sink = fopen("/dev/null", "w");
    if (sink) {
      pcp_config_dump_json(&kTable, &config, sink);
      fclose(sink);
    }
  }
  pcp_config_deinitialize_with_allocator(&kTable, allocator, &config);
  PCP_ASSERT(counter.live_bytes == 0);
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "config_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);  // pcp_file_read_all's buffer: posix_memalign
  }
  printf("config_fuzz: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
