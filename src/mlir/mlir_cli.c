// SPDX-License-Identifier: Apache-2.0
//
// `pcp inspect`: a StableHLO module's functions and signatures.

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config/config.h"
#include "mlir/mlir.h"

typedef struct inspect_options_t {
  char* function;
  bool print;
  bool generic;
  bool json;
  bool help;
} inspect_options_t;

#define OFFSET(member) offsetof(inspect_options_t, member)

static const pcp_config_field_t kFields[] = {
    {.name = "function",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(function),
     .value_name = "NAME",
     .help = "the function to describe (default: @main, or the only public "
             "function)"},
    {.name = "print",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(print),
     .default_value = "false",
     .help = "print the module back instead of the summary"},
    {.name = "generic",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(generic),
     .default_value = "false",
     .help = "print in MLIR's generic form (implies --print)"},
    {.name = "json",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(json),
     .default_value = "false",
     .help = "print the summary as JSON (with --print: the text in \"text\")"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kTable = {
    .name = "inspect",
    .fields = kFields,
    .field_count = PCP_ARRAYSIZE(kFields),
};

static void print_help(void) {
  printf(
      "usage: pcp inspect MODEL.mlir [--function NAME] [--print] [--generic] "
      "[--json]\n\n"
      "Parses and verifies a StableHLO (MLIR) module with the IREE compiler "
      "library, lists its\nfunctions and shows the arguments and results of "
      "@main (or NAME), e.g.\n"
      "  @main(arg0: 2x3xf32, arg1: 3xf32) -> (2x3xf32)\n"
      "Exit status: 0 ok, 1 unreadable or invalid module or no such function, "
      "2 usage error.\n\nflags:\n");
  pcp_config_print_help(&kTable, stdout);
}

// The function to describe: --function, else @main, else the only public
// function (torch-mlir names its entry point @forward).
static const char* pick_function(const pcp_mlir_module_t* module,
                                 const char* requested) {
  if (requested && requested[0]) {
    return requested;
  }
  size_t count = pcp_mlir_module_function_count(module);
  const char* only_public = NULL;
  size_t public_count = 0;
  for (size_t i = 0; i < count; ++i) {
    pcp_mlir_function_info_t info;
    pcp_mlir_module_function_at(module, i, &info);
    if (strcmp(info.name, PCP_MLIR_DEFAULT_FUNCTION) == 0) {
      return PCP_MLIR_DEFAULT_FUNCTION;
    }
    if (info.is_public) {
      only_public = info.name;
      ++public_count;
    }
  }
  return public_count == 1 ? only_public : PCP_MLIR_DEFAULT_FUNCTION;
}

static const char* kind_name(pcp_mlir_type_kind_t kind) {
  switch (kind) {
    case PCP_MLIR_TYPE_KIND_RANKED_TENSOR:
      return "tensor";
    case PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR:
      return "unranked_tensor";
    case PCP_MLIR_TYPE_KIND_SCALAR:
      return "scalar";
    case PCP_MLIR_TYPE_KIND_OTHER:
    default:
      return "other";
  }
}

//===----------------------------------------------------------------------===//
// Text output
//===----------------------------------------------------------------------===//

static void print_function_list(const pcp_mlir_module_t* module, bool is_public,
                                FILE* out) {
  size_t count = pcp_mlir_module_function_count(module);
  size_t printed = 0;
  for (size_t i = 0; i < count; ++i) {
    pcp_mlir_function_info_t info;
    pcp_mlir_module_function_at(module, i, &info);
    if (info.is_public != is_public) {
      continue;
    }
    if (printed == 0) {
      fputs(is_public ? "public functions:" : "private functions:", out);
    }
    fprintf(out, "%s @%s", printed ? "," : "", info.name);
    ++printed;
  }
  if (printed) {
    fputc('\n', out);
  }
  if (is_public && !printed) {
    fputs("public functions: (none)\n", out);
  }
}

static pcp_status_t print_text_summary(
    const pcp_mlir_module_t* module,
    const pcp_mlir_function_signature_t* signature, pcp_allocator_t allocator,
    FILE* out) {
  const char* name = pcp_mlir_module_name(module);
  fprintf(out, "module%s%s (%s)\n", name[0] ? " @" : "", name,
          pcp_mlir_module_buffer_name(module));
  print_function_list(module, true, out);
  print_function_list(module, false, out);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(allocator, 0, &builder);
  pcp_status_t status = pcp_mlir_function_signature_format(signature, &builder);
  if (!status) {
    fprintf(out, "%s%s\n", pcp_string_builder_cstring(&builder),
            signature->is_public ? "" : "  (private)");
  }
  pcp_string_builder_deinitialize(&builder);
  return status;
}

//===----------------------------------------------------------------------===//
// JSON output
//===----------------------------------------------------------------------===//

static json_t* type_to_json(const pcp_mlir_type_t* type) {
  json_t* object = json_object();
  if (!object) {
    return NULL;
  }
  json_object_set_new(object, "type", json_string(type->spelling));
  json_object_set_new(object, "kind", json_string(kind_name(type->kind)));
  if (type->element_spelling[0]) {
    json_object_set_new(object, "element_type",
                        json_string(type->element_spelling));
  }
  if (type->kind == PCP_MLIR_TYPE_KIND_RANKED_TENSOR) {
    json_t* shape = json_array();
    for (int32_t d = 0; d < type->rank; ++d) {
      json_array_append_new(shape, json_integer(type->dims[d]));
    }
    json_object_set_new(object, "shape", shape);
  }
  return object;
}

static json_t* types_to_json(const pcp_mlir_type_t* types, size_t count) {
  json_t* array = json_array();
  for (size_t i = 0; i < count && array; ++i) {
    json_array_append_new(array, type_to_json(&types[i]));
  }
  return array;
}

static pcp_status_t print_json_summary(
    const pcp_mlir_module_t* module,
    const pcp_mlir_function_signature_t* signature, const char* text,
    pcp_allocator_t allocator, FILE* out) {
  json_t* root = json_object();
  const char* name = pcp_mlir_module_name(module);
  json_object_set_new(root, "file",
                      json_string(pcp_mlir_module_buffer_name(module)));
  json_object_set_new(root, "module",
                      name[0] ? json_string(name) : json_null());
  json_t* functions = json_array();
  size_t count = pcp_mlir_module_function_count(module);
  for (size_t i = 0; i < count; ++i) {
    pcp_mlir_function_info_t info;
    pcp_mlir_module_function_at(module, i, &info);
    json_array_append_new(
        functions,
        json_pack("{s:s, s:b, s:I, s:I}", "name", info.name, "public",
                  info.is_public, "arguments", (json_int_t)info.argument_count,
                  "results", (json_int_t)info.result_count));
  }
  json_object_set_new(root, "functions", functions);

  pcp_string_builder_t builder;
  pcp_string_builder_initialize(allocator, 0, &builder);
  pcp_status_t status = pcp_mlir_function_signature_format(signature, &builder);
  json_t* function = json_object();
  json_object_set_new(function, "name", json_string(signature->function_name));
  json_object_set_new(function, "public", json_boolean(signature->is_public));
  json_object_set_new(function, "signature",
                      json_string(pcp_string_builder_cstring(&builder)));
  json_object_set_new(
      function, "arguments",
      types_to_json(signature->arguments, signature->argument_count));
  json_object_set_new(
      function, "results",
      types_to_json(signature->results, signature->result_count));
  json_object_set_new(root, "function", function);
  pcp_string_builder_deinitialize(&builder);
  if (text) {
    json_object_set_new(root, "text", json_string(text));
  }

  if (!status) {
    char* dumped = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!dumped) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "cannot render the JSON summary");
    } else {
      fprintf(out, "%s\n", dumped);
      pcp_libc_free(dumped);  // json_dumps: jansson's malloc
    }
  }
  json_decref(root);
  return status;
}

//===----------------------------------------------------------------------===//
// Main
//===----------------------------------------------------------------------===//

static pcp_status_t inspect(const char* path, const inspect_options_t* options,
                            pcp_allocator_t allocator) {
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(path, PCP_MLIR_MAX_MODULE_BYTES, &data, &length));
  pcp_mlir_context_t* context = NULL;
  pcp_mlir_module_t* module = NULL;
  pcp_mlir_function_signature_t signature;
  memset(&signature, 0, sizeof(signature));
  signature.allocator = allocator;
  char* text = NULL;
  pcp_status_t status = pcp_mlir_context_create(NULL, allocator, &context);
  if (!status) {
    status = pcp_mlir_module_parse(context, (const char*)data, length, path,
                                   &module);
  }
  pcp_libc_free(data);  // pcp_file_read_all's buffer
  bool print = options->print || options->generic;
  if (!status && print) {
    pcp_string_builder_t builder;
    pcp_string_builder_initialize(allocator, 0, &builder);
    status =
        pcp_mlir_module_print(module,
                              options->generic ? PCP_MLIR_PRINT_FLAG_GENERIC
                                               : PCP_MLIR_PRINT_FLAG_NONE,
                              &builder);
    if (!status) {
      status = pcp_string_builder_take(&builder, &text);
    }
    pcp_string_builder_deinitialize(&builder);
  }
  if (!status && print && !options->json) {
    // The text alone, so that it can be redirected to a file and parsed.
    fprintf(stdout, "%s\n", text);
  } else if (!status) {
    status = pcp_mlir_module_function_signature(
        module, pick_function(module, options->function), allocator,
        &signature);
    if (!status) {
      status =
          options->json
              ? print_json_summary(module, &signature, text, allocator, stdout)
              : print_text_summary(module, &signature, allocator, stdout);
    }
  }
  pcp_allocator_free(allocator, text);
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(module);
  pcp_mlir_context_release(context);
  return status;
}

int pcp_mlir_inspect_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  inspect_options_t options;
  pcp_string_list_t positionals = {0};
  pcp_status_t status = pcp_config_initialize(&kTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kTable, argc - 1, argv + 1, &options,
                                   &positionals);
  }
  if (!status && options.help) {
    print_help();
    pcp_config_deinitialize(&kTable, &options);
    pcp_string_list_deinitialize(&positionals);
    return 0;
  }
  if (!status) {
    status = pcp_config_validate(&kTable, &options);
  }
  if (!status && positionals.count != 1) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        positionals.count ? "expected one MLIR file, got %zu"
                                          : "missing the MLIR file to inspect",
                        positionals.count);
  }
  if (status) {
    pcp_config_deinitialize(&kTable, &options);
    pcp_string_list_deinitialize(&positionals);
    return pcp_config_cli_usage_error("inspect", status);
  }

  int exit_code = 0;
  status = inspect(positionals.items[0], &options, allocator);
  if (status) {
    // The message carries MLIR's diagnostics ("file:line:col: error: ...").
    exit_code = pcp_config_cli_failure("inspect", status);
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
