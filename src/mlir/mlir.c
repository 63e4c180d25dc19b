// SPDX-License-Identifier: Apache-2.0
//
// Contexts, modules, diagnostics and function signatures over the MLIR C API
// resolved by loader.c.

#include "mlir/mlir.h"

#include <stdlib.h>
#include <string.h>

#include "mlir/loader_impl.h"

// Diagnostics kept per parse or verify. A broken module can produce one
// error per op; the first ones are what a person reads.
#define MAX_DIAGNOSTIC_BYTES ((size_t)64 << 10)
// How deep location unwrapping goes (NameLoc(CallSiteLoc(FusedLoc(...)))).
#define MAX_LOCATION_DEPTH 8
// Fused locations with more parts than this are printed whole.
#define MAX_FUSED_LOCATIONS 16

struct pcp_mlir_context_t {
  pcp_allocator_t allocator;
  const pcp_mlir_api_t* api;
  MlirContext context;
  pcp_mlir_context_options_t options;
  // Diagnostics of the parse or verify in progress.
  pcp_string_builder_t diagnostics;
  bool diagnostics_truncated;
  // Name substituted for the file name "-" that mlirModuleCreateParse gives
  // every location in the text (it takes no buffer name; the alternative,
  // mlirOperationCreateParse, takes one but rejects texts without a single
  // top-level op). Borrowed during the call.
  const char* buffer_name;
  size_t live_module_count;
};

typedef struct function_entry_t {
  char* name;
  bool is_public;
  MlirOperation op;
  MlirType function_type;
  size_t argument_count;
  size_t result_count;
} function_entry_t;

struct pcp_mlir_module_t {
  pcp_mlir_context_t* context;
  MlirModule module;
  char* buffer_name;
  char* name;
  size_t function_count;
  function_entry_t* functions;
};

//===----------------------------------------------------------------------===//
// Printing into string builders
//===----------------------------------------------------------------------===//

// MlirStringCallback user data: the first append failure is kept and every
// later chunk dropped, so a capped builder holds a clean prefix.
typedef struct sink_t {
  pcp_string_builder_t* builder;
  pcp_status_t status;
} sink_t;

static void sink_append(MlirStringRef chunk, void* user_data) {
  sink_t* sink = (sink_t*)user_data;
  if (sink->status) {
    return;
  }
  sink->status = pcp_string_builder_append(
      sink->builder, pcp_make_string_view(chunk.data, chunk.length));
}

static pcp_status_t append_type_spelling(const pcp_mlir_api_t* api,
                                         MlirType type,
                                         pcp_string_builder_t* builder) {
  sink_t sink = {builder, pcp_ok_status()};
  api->mlirTypePrint(type, sink_append, &sink);
  return sink.status;
}

static MlirStringRef string_ref(const char* value) {
  return mlirStringRefCreate(value, strlen(value));
}

static bool string_ref_equals(MlirStringRef a, const char* b) {
  size_t length = strlen(b);
  return a.length == length && memcmp(a.data, b, length) == 0;
}

static char* string_ref_dup(pcp_allocator_t allocator, MlirStringRef value) {
  char* copy = NULL;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, value.length + 1, (void**)&copy);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  if (value.length) {
    memcpy(copy, value.data, value.length);
  }
  copy[value.length] = 0;
  return copy;
}

//===----------------------------------------------------------------------===//
// Diagnostics
//===----------------------------------------------------------------------===//

static void diagnostics_append_f(pcp_mlir_context_t* context, const char* fmt,
                                 ...) PCP_PRINTF_ATTR(2, 3);
static void diagnostics_append_f(pcp_mlir_context_t* context, const char* fmt,
                                 ...) {
  if (context->diagnostics_truncated) {
    return;
  }
  char line[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(line, sizeof(line), fmt, args);
  va_end(args);
  pcp_status_t status =
      pcp_string_builder_append_cstring(&context->diagnostics, line);
  if (status) {
    pcp_status_ignore(status);
    context->diagnostics_truncated = true;
  }
}

// Finds the innermost file:line:col inside |location|: JAX and torch-mlir
// wrap them in name, call-site and fused locations.
static bool find_file_location(const pcp_mlir_api_t* api, MlirLocation location,
                               int depth, MlirLocation* out_location) {
  if (mlirLocationIsNull(location) || depth > MAX_LOCATION_DEPTH) {
    return false;
  }
  if (api->mlirLocationIsAFileLineColRange(location)) {
    *out_location = location;
    return true;
  }
  if (api->mlirLocationIsAName(location)) {
    return find_file_location(api, api->mlirLocationNameGetChildLoc(location),
                              depth + 1, out_location);
  }
  if (api->mlirLocationIsACallSite(location)) {
    return find_file_location(api, api->mlirLocationCallSiteGetCallee(location),
                              depth + 1, out_location);
  }
  if (api->mlirLocationIsAFused(location)) {
    intptr_t count = api->mlirLocationFusedGetNumLocations(location);
    if (count <= 0 || count > MAX_FUSED_LOCATIONS) {
      return false;
    }
    MlirLocation parts[MAX_FUSED_LOCATIONS];
    api->mlirLocationFusedGetLocations(location, parts);
    for (intptr_t i = 0; i < count; ++i) {
      if (find_file_location(api, parts[i], depth + 1, out_location)) {
        return true;
      }
    }
  }
  return false;
}

static void diagnostics_append_location(pcp_mlir_context_t* context,
                                        MlirLocation location) {
  const pcp_mlir_api_t* api = context->api;
  MlirLocation file_location;
  if (find_file_location(api, location, 0, &file_location)) {
    MlirStringRef file = api->mlirIdentifierStr(
        api->mlirLocationFileLineColRangeGetFilename(file_location));
    int line = api->mlirLocationFileLineColRangeGetStartLine(file_location);
    int column = api->mlirLocationFileLineColRangeGetStartColumn(file_location);
    if (file.length == 0 || string_ref_equals(file, "-")) {
      diagnostics_append_f(context, "%s:%d:%d", context->buffer_name, line,
                           column);
    } else {
      diagnostics_append_f(context, "%.*s:%d:%d", (int)file.length, file.data,
                           line, column);
    }
    return;
  }
  // No file position at all (loc(unknown), a bare name): print it as MLIR
  // does, prefixed by the buffer so the reader knows which input it was.
  diagnostics_append_f(context, "%s: ", context->buffer_name);
  if (context->diagnostics_truncated) {
    return;
  }
  sink_t sink = {&context->diagnostics, pcp_ok_status()};
  api->mlirLocationPrint(location, sink_append, &sink);
  if (sink.status) {
    pcp_status_ignore(sink.status);
    context->diagnostics_truncated = true;
  }
}

static const char* severity_name(MlirDiagnosticSeverity severity) {
  switch (severity) {
    case MlirDiagnosticError:
      return "error";
    case MlirDiagnosticWarning:
      return "warning";
    case MlirDiagnosticNote:
      return "note";
    case MlirDiagnosticRemark:
      return "remark";
  }
  return "diagnostic";
}

static void diagnostics_append(pcp_mlir_context_t* context,
                               MlirDiagnostic diagnostic, int depth) {
  const pcp_mlir_api_t* api = context->api;
  if (context->diagnostics.size > 0) {
    diagnostics_append_f(context, "\n");
  }
  diagnostics_append_location(context,
                              api->mlirDiagnosticGetLocation(diagnostic));
  diagnostics_append_f(
      context,
      ": %s: ", severity_name(api->mlirDiagnosticGetSeverity(diagnostic)));
  if (!context->diagnostics_truncated) {
    sink_t sink = {&context->diagnostics, pcp_ok_status()};
    api->mlirDiagnosticPrint(diagnostic, sink_append, &sink);
    if (sink.status) {
      pcp_status_ignore(sink.status);
      context->diagnostics_truncated = true;
    }
  }
  if (depth >= MAX_LOCATION_DEPTH) {
    return;
  }
  intptr_t note_count = api->mlirDiagnosticGetNumNotes(diagnostic);
  for (intptr_t i = 0; i < note_count; ++i) {
    diagnostics_append(context, api->mlirDiagnosticGetNote(diagnostic, i),
                       depth + 1);
  }
}

static MlirLogicalResult handle_diagnostic(MlirDiagnostic diagnostic,
                                           void* user_data) {
  diagnostics_append((pcp_mlir_context_t*)user_data, diagnostic, 0);
  // Handled: nothing else (MLIR's default stderr printer) sees it.
  return mlirLogicalResultSuccess();
}

static void diagnostics_begin(pcp_mlir_context_t* context,
                              const char* buffer_name) {
  pcp_string_builder_reset(&context->diagnostics);
  context->diagnostics_truncated = false;
  // A diagnostic can also arrive outside a parse or verify (printing an
  // invalid op, for one); it still needs a name to print.
  context->buffer_name = buffer_name ? buffer_name : "<input>";
}

// Returns INVALID_ARGUMENT "<what>: <diagnostics>" and clears them.
static pcp_status_t diagnostics_status(pcp_mlir_context_t* context,
                                       const char* what) {
  const char* text = context->diagnostics.size
                         ? pcp_string_builder_cstring(&context->diagnostics)
                         : "(MLIR reported no diagnostic)";
  pcp_status_t status = pcp_make_status(
      PCP_STATUS_INVALID_ARGUMENT, "%s: %s%s", what, text,
      context->diagnostics_truncated ? "\n(more diagnostics omitted)" : "");
  diagnostics_begin(context, NULL);
  return status;
}

//===----------------------------------------------------------------------===//
// pcp_mlir_context_t
//===----------------------------------------------------------------------===//

void pcp_mlir_context_options_initialize(
    pcp_mlir_context_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->max_module_byte_length = PCP_MLIR_MAX_MODULE_BYTES;
}

pcp_status_t pcp_mlir_context_create(const pcp_mlir_context_options_t* options,
                                     pcp_allocator_t allocator,
                                     pcp_mlir_context_t** out_context) {
  *out_context = NULL;
  const pcp_mlir_api_t* api = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_api_get(&api));
  pcp_mlir_context_t* context = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*context), (void**)&context));
  context->allocator = allocator;
  context->api = api;
  if (options) {
    context->options = *options;
  } else {
    pcp_mlir_context_options_initialize(&context->options);
  }
  if (context->options.max_module_byte_length == 0) {
    context->options.max_module_byte_length = PCP_MLIR_MAX_MODULE_BYTES;
  }
  pcp_string_builder_initialize(allocator, MAX_DIAGNOSTIC_BYTES,
                                &context->diagnostics);

  // The registry holds every dialect IREE knows, including the default
  // plugins' (StableHLO, CHLO). Dialects are loaded lazily by the parser as
  // the text names them: loading all of them up front costs start-up time
  // for dialects a StableHLO module never uses.
  MlirDialectRegistry registry = api->mlirDialectRegistryCreate();
  api->ireeCompilerRegisterDialects(registry);
  context->context = api->mlirContextCreateWithRegistry(
      registry, context->options.enable_multithreading);
  api->mlirDialectRegistryDestroy(registry);
  if (mlirContextIsNull(context->context)) {
    pcp_string_builder_deinitialize(&context->diagnostics);
    pcp_allocator_free(allocator, context);
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "mlirContextCreateWithRegistry failed");
  }
  // Stays attached for the context's lifetime; the context is the user data
  // and outlives it, so no delete callback.
  api->mlirContextAttachDiagnosticHandler(context->context, handle_diagnostic,
                                          context, NULL);
  *out_context = context;
  return pcp_ok_status();
}

void pcp_mlir_context_release(pcp_mlir_context_t* context) {
  if (!context) {
    return;
  }
  PCP_ASSERT(context->live_module_count == 0);
  context->api->mlirContextDestroy(context->context);
  pcp_string_builder_deinitialize(&context->diagnostics);
  pcp_allocator_free(context->allocator, context);
}

//===----------------------------------------------------------------------===//
// pcp_mlir_module_t
//===----------------------------------------------------------------------===//

// Reads a string attribute named |name| off |op|; empty when absent.
static MlirStringRef op_string_attribute(const pcp_mlir_api_t* api,
                                         MlirOperation op, const char* name) {
  MlirAttribute attribute =
      api->mlirOperationGetInherentAttributeByName(op, string_ref(name));
  if (mlirAttributeIsNull(attribute) ||
      !api->mlirAttributeIsAString(attribute)) {
    return mlirStringRefCreate(NULL, 0);
  }
  return api->mlirStringAttrGetValue(attribute);
}

static void module_free(pcp_mlir_module_t* module) {
  pcp_allocator_t allocator = module->context->allocator;
  for (size_t i = 0; i < module->function_count; ++i) {
    pcp_allocator_free(allocator, module->functions[i].name);
  }
  pcp_allocator_free(allocator, module->functions);
  pcp_allocator_free(allocator, module->buffer_name);
  pcp_allocator_free(allocator, module->name);
  if (!mlirModuleIsNull(module->module)) {
    module->context->api->mlirModuleDestroy(module->module);
  }
  pcp_allocator_free(allocator, module);
}

// Records every top-level func.func. Nested modules are not searched: a
// StableHLO program's entry points are at the top level.
static pcp_status_t module_collect_functions(pcp_mlir_module_t* module) {
  const pcp_mlir_api_t* api = module->context->api;
  pcp_allocator_t allocator = module->context->allocator;
  MlirBlock body = api->mlirModuleGetBody(module->module);
  size_t capacity = 0;
  for (MlirOperation op = api->mlirBlockGetFirstOperation(body);
       !mlirOperationIsNull(op); op = api->mlirOperationGetNextInBlock(op)) {
    if (!string_ref_equals(
            api->mlirIdentifierStr(api->mlirOperationGetName(op)),
            "func.func")) {
      continue;
    }
    MlirAttribute type_attribute = api->mlirOperationGetInherentAttributeByName(
        op, string_ref("function_type"));
    if (mlirAttributeIsNull(type_attribute) ||
        !api->mlirAttributeIsAType(type_attribute)) {
      continue;  // the verifier rejects this; be defensive anyway
    }
    MlirType function_type = api->mlirTypeAttrGetValue(type_attribute);
    if (!api->mlirTypeIsAFunction(function_type)) {
      continue;
    }
    if (module->function_count == capacity) {
      capacity = capacity ? capacity * 2 : 8;
      void* functions = module->functions;
      PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
          allocator, capacity * sizeof(function_entry_t), &functions));
      module->functions = (function_entry_t*)functions;
    }
    function_entry_t* entry = &module->functions[module->function_count];
    memset(entry, 0, sizeof(*entry));
    entry->name =
        string_ref_dup(allocator, op_string_attribute(api, op, "sym_name"));
    if (!entry->name) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory reading function names");
    }
    ++module->function_count;
    MlirStringRef visibility = op_string_attribute(api, op, "sym_visibility");
    entry->is_public =
        visibility.length == 0 || string_ref_equals(visibility, "public");
    entry->op = op;
    entry->function_type = function_type;
    entry->argument_count =
        (size_t)api->mlirFunctionTypeGetNumInputs(function_type);
    entry->result_count =
        (size_t)api->mlirFunctionTypeGetNumResults(function_type);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_mlir_module_parse(pcp_mlir_context_t* context,
                                   const char* text, size_t byte_length,
                                   const char* buffer_name,
                                   pcp_mlir_module_t** out_module) {
  *out_module = NULL;
  if (!buffer_name || !buffer_name[0]) {
    buffer_name = "<input>";
  }
  if (byte_length > context->options.max_module_byte_length) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "MLIR module '%s' is %zu bytes; the limit is %zu",
                           buffer_name, byte_length,
                           context->options.max_module_byte_length);
  }
  if (!text && byte_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "MLIR module '%s': NULL text", buffer_name);
  }
  const pcp_mlir_api_t* api = context->api;
  pcp_allocator_t allocator = context->allocator;

  // MLIR's lexer finds the end of its buffer by the NUL after it, while
  // parseSourceString wraps the caller's bytes without requiring one. A
  // private NUL-terminated copy keeps the parser inside the input whatever
  // the caller passed; parsing costs far more than the copy.
  char* copy = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, byte_length + 1, (void**)&copy));
  if (byte_length) {
    memcpy(copy, text, byte_length);
  }
  copy[byte_length] = 0;

  diagnostics_begin(context, buffer_name);
  MlirModule parsed = api->mlirModuleCreateParse(
      context->context, mlirStringRefCreate(copy, byte_length));
  pcp_allocator_free(allocator, copy);
  if (mlirModuleIsNull(parsed)) {
    char what[512];
    snprintf(what, sizeof(what), "cannot parse MLIR module '%s'", buffer_name);
    return diagnostics_status(context, what);
  }
  diagnostics_begin(context, NULL);

  pcp_mlir_module_t* module = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(allocator, sizeof(*module), (void**)&module);
  if (status) {
    api->mlirModuleDestroy(parsed);
    return status;
  }
  module->context = context;
  module->module = parsed;
  ++context->live_module_count;
  module->buffer_name = string_ref_dup(allocator, string_ref(buffer_name));
  module->name = string_ref_dup(
      allocator, op_string_attribute(api, api->mlirModuleGetOperation(parsed),
                                     "sym_name"));
  if (!module->buffer_name || !module->name) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory reading module '%s'", buffer_name);
  }
  if (!status) {
    status = module_collect_functions(module);
  }
  if (status) {
    pcp_mlir_module_release(module);
    return status;
  }
  *out_module = module;
  return pcp_ok_status();
}

void pcp_mlir_module_release(pcp_mlir_module_t* module) {
  if (!module) {
    return;
  }
  --module->context->live_module_count;
  module_free(module);
}

pcp_status_t pcp_mlir_module_verify(pcp_mlir_module_t* module) {
  pcp_mlir_context_t* context = module->context;
  diagnostics_begin(context, module->buffer_name);
  bool valid = context->api->mlirOperationVerify(
      context->api->mlirModuleGetOperation(module->module));
  if (!valid) {
    char what[512];
    snprintf(what, sizeof(what), "MLIR module '%s' failed verification",
             module->buffer_name);
    return diagnostics_status(context, what);
  }
  diagnostics_begin(context, NULL);
  return pcp_ok_status();
}

const char* pcp_mlir_module_name(const pcp_mlir_module_t* module) {
  return module->name;
}

const char* pcp_mlir_module_buffer_name(const pcp_mlir_module_t* module) {
  return module->buffer_name;
}

pcp_status_t pcp_mlir_module_print(pcp_mlir_module_t* module,
                                   pcp_mlir_print_flags_t flags,
                                   pcp_string_builder_t* builder) {
  const pcp_mlir_api_t* api = module->context->api;
  MlirOpPrintingFlags printing_flags = api->mlirOpPrintingFlagsCreate();
  if (flags & PCP_MLIR_PRINT_FLAG_GENERIC) {
    api->mlirOpPrintingFlagsPrintGenericOpForm(printing_flags);
  }
  sink_t sink = {builder, pcp_ok_status()};
  api->mlirOperationPrintWithFlags(api->mlirModuleGetOperation(module->module),
                                   printing_flags, sink_append, &sink);
  api->mlirOpPrintingFlagsDestroy(printing_flags);
  return sink.status;
}

// Keeps only the file-metadata section the printer writes after the
// top-level op ("\n{-#" starts it; a string attribute cannot hold a raw
// newline, so the marker cannot occur earlier), so a large module's ops are
// never held in memory.
typedef struct resource_sink_t {
  pcp_string_builder_t* builder;
  pcp_status_t status;
  bool capturing;
  char last[4];  // the last four characters seen
} resource_sink_t;

static void resource_sink_append(MlirStringRef chunk, void* user_data) {
  resource_sink_t* sink = (resource_sink_t*)user_data;
  if (sink->status) {
    return;
  }
  size_t from = 0;
  if (!sink->capturing) {
    for (size_t i = 0; i < chunk.length && !sink->capturing; ++i) {
      memmove(sink->last, sink->last + 1, 3);
      sink->last[3] = chunk.data[i];
      if (memcmp(sink->last, "\n{-#", 4) == 0) {
        sink->capturing = true;
        from = i + 1;
        sink->status = pcp_string_builder_append_cstring(sink->builder, "{-#");
      }
    }
  }
  if (sink->capturing && !sink->status && from < chunk.length) {
    sink->status = pcp_string_builder_append(
        sink->builder,
        pcp_make_string_view(chunk.data + from, chunk.length - from));
  }
}

pcp_status_t pcp_mlir_module_print_resources(pcp_mlir_module_t* module,
                                             pcp_string_builder_t* builder) {
  const pcp_mlir_api_t* api = module->context->api;
  MlirOpPrintingFlags printing_flags = api->mlirOpPrintingFlagsCreate();
  // The generic form is the cheapest to print; the ops are dropped anyway.
  api->mlirOpPrintingFlagsPrintGenericOpForm(printing_flags);
  resource_sink_t sink = {builder, pcp_ok_status(), false, {0, 0, 0, 0}};
  api->mlirOperationPrintWithFlags(api->mlirModuleGetOperation(module->module),
                                   printing_flags, resource_sink_append, &sink);
  api->mlirOpPrintingFlagsDestroy(printing_flags);
  return sink.status;
}

//===----------------------------------------------------------------------===//
// Functions and signatures
//===----------------------------------------------------------------------===//

size_t pcp_mlir_module_function_count(const pcp_mlir_module_t* module) {
  return module->function_count;
}

void pcp_mlir_module_function_at(const pcp_mlir_module_t* module, size_t index,
                                 pcp_mlir_function_info_t* out_info) {
  PCP_ASSERT(index < module->function_count);
  const function_entry_t* entry = &module->functions[index];
  out_info->name = entry->name;
  out_info->is_public = entry->is_public;
  out_info->argument_count = entry->argument_count;
  out_info->result_count = entry->result_count;
}

static pcp_status_t function_not_found(const pcp_mlir_module_t* module,
                                       const char* name) {
  pcp_string_builder_t list;
  pcp_string_builder_initialize(pcp_allocator_system(), 4096, &list);
  pcp_status_t status = pcp_ok_status();
  // The list is a hint: a long one is cut (names are bounded by the 64-char
  // precision, so an entry always fits below the builder's cap).
  for (size_t i = 0; i < module->function_count && !status; ++i) {
    if (list.size > 3000) {
      status = pcp_string_builder_append_f(&list, ", ... (%zu more)",
                                           module->function_count - i);
      break;
    }
    status = pcp_string_builder_append_f(
        &list, "%s@%.64s%s", i ? ", " : "", module->functions[i].name,
        module->functions[i].is_public ? "" : " (private)");
  }
  pcp_status_ignore(status);
  pcp_status_t result;
  if (module->function_count == 0) {
    result = pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "function @%s not found in MLIR module '%s': it "
                             "has no func.func functions",
                             name, module->buffer_name);
  } else {
    result = pcp_make_status(
        PCP_STATUS_NOT_FOUND,
        "function @%s not found in MLIR module '%s'; available: %s", name,
        module->buffer_name, pcp_string_builder_cstring(&list));
  }
  pcp_string_builder_deinitialize(&list);
  return result;
}

// Maps an MLIR element spelling to PCP's numbering. Signed integers
// ("si32") share the signless numbers: PCP's wire types carry no
// signedness distinction between the two.
static pcp_element_type_t element_type_from_spelling(const char* spelling) {
  if (spelling[0] == 's' && spelling[1] == 'i') {
    ++spelling;
  }
  pcp_element_type_t type = PCP_ELEMENT_TYPE_UNKNOWN;
  if (!pcp_element_type_parse(pcp_make_cstring_view(spelling), &type)) {
    return PCP_ELEMENT_TYPE_UNKNOWN;
  }
  return type;
}

// Describes |type| into |out_type|. Its two spellings are appended to
// |strings| (NUL-separated) and their offsets stored in |out_offsets|; the
// pointers are set once the block stops moving.
static pcp_status_t describe_type(const pcp_mlir_api_t* api, MlirType type,
                                  const char* what,
                                  pcp_string_builder_t* strings,
                                  pcp_mlir_type_t* out_type,
                                  size_t out_offsets[2]) {
  memset(out_type, 0, sizeof(*out_type));
  out_type->kind = PCP_MLIR_TYPE_KIND_OTHER;
  out_type->rank = -1;
  size_t spelling_offset = strings->size;
  PCP_RETURN_IF_ERROR_BARE(append_type_spelling(api, type, strings));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append(strings, pcp_make_string_view("", 1)));
  size_t element_offset = strings->size;

  MlirType element = {NULL};
  if (api->mlirTypeIsARankedTensor(type)) {
    int64_t rank = api->mlirShapedTypeGetRank(type);
    if (rank > PCP_MAX_TENSOR_RANK) {
      return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "%s has rank %lld; the maximum is %d", what,
                             (long long)rank, PCP_MAX_TENSOR_RANK);
    }
    out_type->kind = PCP_MLIR_TYPE_KIND_RANKED_TENSOR;
    out_type->rank = (int32_t)rank;
    for (intptr_t d = 0; d < (intptr_t)rank; ++d) {
      out_type->dims[d] = api->mlirShapedTypeIsDynamicDim(type, d)
                              ? PCP_MLIR_DYNAMIC_DIM
                              : api->mlirShapedTypeGetDimSize(type, d);
    }
    element = api->mlirShapedTypeGetElementType(type);
  } else if (api->mlirTypeIsAUnrankedTensor(type)) {
    out_type->kind = PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR;
    element = api->mlirShapedTypeGetElementType(type);
  } else if (api->mlirTypeIsAInteger(type) || api->mlirTypeIsAFloat(type) ||
             api->mlirTypeIsAIndex(type)) {
    out_type->kind = PCP_MLIR_TYPE_KIND_SCALAR;
    out_type->rank = 0;
    element = type;
  }
  if (!mlirTypeIsNull(element)) {
    PCP_RETURN_IF_ERROR_BARE(append_type_spelling(api, element, strings));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append(strings, pcp_make_string_view("", 1)));
  out_type->element_type =
      element_type_from_spelling(strings->data + element_offset);
  out_offsets[0] = spelling_offset;
  out_offsets[1] = element_offset;
  return pcp_ok_status();
}

static void set_spellings(pcp_mlir_type_t* types, size_t count,
                          const size_t* offsets, const char* base) {
  for (size_t i = 0; i < count; ++i) {
    types[i].spelling = base + offsets[2 * i];
    types[i].element_spelling = base + offsets[2 * i + 1];
  }
}

static pcp_status_t fill_signature(const pcp_mlir_api_t* api,
                                   const function_entry_t* entry,
                                   pcp_mlir_function_signature_t* signature) {
  pcp_allocator_t allocator = signature->allocator;
  signature->function_name = string_ref_dup(allocator, string_ref(entry->name));
  if (!signature->function_name) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory copying a function name");
  }
  signature->is_public = entry->is_public;
  if (entry->argument_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        allocator, entry->argument_count * sizeof(pcp_mlir_type_t),
        (void**)&signature->arguments));
  }
  if (entry->result_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        allocator, entry->result_count * sizeof(pcp_mlir_type_t),
        (void**)&signature->results));
  }
  size_t type_count = entry->argument_count + entry->result_count;
  size_t* offsets = NULL;
  if (type_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
        allocator, 2 * type_count * sizeof(size_t), (void**)&offsets));
  }
  size_t* argument_offsets = offsets;
  size_t* result_offsets = offsets + 2 * entry->argument_count;
  pcp_string_builder_t strings;
  pcp_string_builder_initialize(allocator, 0, &strings);
  pcp_status_t status = pcp_ok_status();
  char what[128];
  for (size_t i = 0; i < entry->argument_count && !status; ++i) {
    snprintf(what, sizeof(what), "@%.64s argument %zu", entry->name, i);
    status = describe_type(
        api, api->mlirFunctionTypeGetInput(entry->function_type, (intptr_t)i),
        what, &strings, &signature->arguments[i], &argument_offsets[2 * i]);
  }
  for (size_t i = 0; i < entry->result_count && !status; ++i) {
    snprintf(what, sizeof(what), "@%.64s result %zu", entry->name, i);
    status = describe_type(
        api, api->mlirFunctionTypeGetResult(entry->function_type, (intptr_t)i),
        what, &strings, &signature->results[i], &result_offsets[2 * i]);
  }
  if (!status) {
    status = pcp_string_builder_take(&strings, &signature->strings_);
  }
  pcp_string_builder_deinitialize(&strings);
  if (!status) {
    signature->argument_count = entry->argument_count;
    signature->result_count = entry->result_count;
    set_spellings(signature->arguments, signature->argument_count,
                  argument_offsets, signature->strings_);
    set_spellings(signature->results, signature->result_count, result_offsets,
                  signature->strings_);
  }
  pcp_allocator_free(allocator, offsets);
  return status;
}

pcp_status_t pcp_mlir_module_function_signature(
    pcp_mlir_module_t* module, const char* function_name,
    pcp_allocator_t allocator, pcp_mlir_function_signature_t* out_signature) {
  memset(out_signature, 0, sizeof(*out_signature));
  out_signature->allocator = allocator;
  if (!function_name || !function_name[0]) {
    function_name = PCP_MLIR_DEFAULT_FUNCTION;
  }
  if (function_name[0] == '@') {
    ++function_name;
  }
  const function_entry_t* entry = NULL;
  for (size_t i = 0; i < module->function_count; ++i) {
    if (strcmp(module->functions[i].name, function_name) == 0) {
      entry = &module->functions[i];
      break;
    }
  }
  if (!entry) {
    return function_not_found(module, function_name);
  }
  pcp_status_t status =
      fill_signature(module->context->api, entry, out_signature);
  if (status) {
    pcp_mlir_function_signature_deinitialize(out_signature);
  }
  return status;
}

void pcp_mlir_function_signature_deinitialize(
    pcp_mlir_function_signature_t* signature) {
  pcp_allocator_t allocator = signature->allocator;
  pcp_allocator_free(allocator, signature->function_name);
  pcp_allocator_free(allocator, signature->arguments);
  pcp_allocator_free(allocator, signature->results);
  pcp_allocator_free(allocator, signature->strings_);
  memset(signature, 0, sizeof(*signature));
  signature->allocator = allocator;
}

pcp_status_t pcp_mlir_text_function_signature(
    const char* text, size_t byte_length, const char* buffer_name,
    const char* function_name, pcp_allocator_t allocator,
    pcp_mlir_function_signature_t* out_signature) {
  memset(out_signature, 0, sizeof(*out_signature));
  out_signature->allocator = allocator;
  pcp_mlir_context_t* context = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_mlir_context_create(NULL, allocator, &context));
  pcp_mlir_module_t* module = NULL;
  pcp_status_t status =
      pcp_mlir_module_parse(context, text, byte_length, buffer_name, &module);
  if (!status) {
    status = pcp_mlir_module_function_signature(module, function_name,
                                                allocator, out_signature);
  }
  pcp_mlir_module_release(module);
  pcp_mlir_context_release(context);
  return status;
}

//===----------------------------------------------------------------------===//
// Formatting and checking
//===----------------------------------------------------------------------===//

pcp_status_t pcp_mlir_type_format(const pcp_mlir_type_t* type,
                                  pcp_string_builder_t* builder) {
  switch (type->kind) {
    case PCP_MLIR_TYPE_KIND_RANKED_TENSOR:
      if (type->rank == 0) {
        return pcp_string_builder_append_f(builder, "tensor<%s>",
                                           type->element_spelling);
      }
      for (int32_t d = 0; d < type->rank; ++d) {
        if (type->dims[d] == PCP_MLIR_DYNAMIC_DIM) {
          PCP_RETURN_IF_ERROR_BARE(
              pcp_string_builder_append_cstring(builder, "?x"));
        } else {
          PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
              builder, "%lldx", (long long)type->dims[d]));
        }
      }
      return pcp_string_builder_append_cstring(builder, type->element_spelling);
    case PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR:
      return pcp_string_builder_append_f(builder, "*x%s",
                                         type->element_spelling);
    case PCP_MLIR_TYPE_KIND_SCALAR:
      return pcp_string_builder_append_cstring(builder, type->element_spelling);
    case PCP_MLIR_TYPE_KIND_OTHER:
    default:
      return pcp_string_builder_append_cstring(
          builder, type->spelling ? type->spelling : "?");
  }
}

pcp_status_t pcp_mlir_function_signature_format(
    const pcp_mlir_function_signature_t* signature,
    pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(builder, "@%s(", signature->function_name));
  for (size_t i = 0; i < signature->argument_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(builder, "%sarg%zu: ", i ? ", " : "", i));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_mlir_type_format(&signature->arguments[i], builder));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(builder, ") -> ("));
  for (size_t i = 0; i < signature->result_count; ++i) {
    if (i) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(builder, ", "));
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_mlir_type_format(&signature->results[i], builder));
  }
  return pcp_string_builder_append_cstring(builder, ")");
}

static pcp_status_t tensor_mismatch(const pcp_mlir_type_t* expected,
                                    pcp_element_type_t element_type,
                                    int32_t rank, const int64_t* dims,
                                    const char* what) {
  char expected_text[256];
  char actual_text[256];
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 200, &builder);
  pcp_status_ignore(pcp_mlir_type_format(expected, &builder));
  snprintf(expected_text, sizeof(expected_text), "%s",
           pcp_string_builder_cstring(&builder));
  pcp_string_builder_reset(&builder);
  pcp_mlir_type_t actual;
  memset(&actual, 0, sizeof(actual));
  actual.kind = PCP_MLIR_TYPE_KIND_RANKED_TENSOR;
  actual.rank = rank < 0 ? 0 : (rank > PCP_MAX_TENSOR_RANK ? 0 : rank);
  if (dims) {
    memcpy(actual.dims, dims, (size_t)actual.rank * sizeof(int64_t));
  }
  actual.element_spelling = pcp_element_type_name(element_type);
  if (rank < 0 || rank > PCP_MAX_TENSOR_RANK) {
    pcp_status_ignore(
        pcp_string_builder_append_f(&builder, "a rank-%d tensor of %s",
                                    (int)rank, actual.element_spelling));
  } else {
    pcp_status_ignore(pcp_mlir_type_format(&actual, &builder));
  }
  snprintf(actual_text, sizeof(actual_text), "%s",
           pcp_string_builder_cstring(&builder));
  pcp_string_builder_deinitialize(&builder);
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: expected %s, got %s",
                         what ? what : "value", expected_text, actual_text);
}

pcp_status_t pcp_mlir_type_check_tensor(const pcp_mlir_type_t* expected,
                                        pcp_element_type_t element_type,
                                        int32_t rank, const int64_t* dims,
                                        const char* what) {
  bool matches = false;
  if (expected->kind == PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR) {
    matches = expected->element_type != PCP_ELEMENT_TYPE_UNKNOWN &&
              expected->element_type == element_type && rank >= 0 &&
              rank <= PCP_MAX_TENSOR_RANK;
  } else if (expected->kind == PCP_MLIR_TYPE_KIND_RANKED_TENSOR) {
    matches = expected->element_type != PCP_ELEMENT_TYPE_UNKNOWN &&
              expected->element_type == element_type &&
              expected->rank == rank && (rank == 0 || dims);
    for (int32_t d = 0; matches && d < rank; ++d) {
      matches = expected->dims[d] == PCP_MLIR_DYNAMIC_DIM ||
                expected->dims[d] == dims[d];
    }
  }
  if (matches) {
    return pcp_ok_status();
  }
  return tensor_mismatch(expected, element_type, rank, dims, what);
}

//===----------------------------------------------------------------------===//
// Function bodies
//===----------------------------------------------------------------------===//

// Value handles are {void* ptr}; operands are mapped back to ids through an
// open-addressing table keyed by that pointer.
typedef struct value_slot_t {
  const void* key;
  uint32_t id;
} value_slot_t;

typedef struct body_builder_t {
  const pcp_mlir_api_t* api;
  const char* buffer_name;
  pcp_mlir_function_body_t* body;
  size_t value_capacity, op_capacity, block_capacity, operand_capacity;
  size_t* value_offsets;  // 2 per value: spelling, element spelling
  size_t* op_offsets;     // 4 per op: name, location, properties, attributes
  pcp_string_builder_t strings;
  pcp_string_builder_t scratch;
  value_slot_t* slots;
  size_t slot_capacity;  // power of two, at least twice the value count
} body_builder_t;

static pcp_status_t grow_array(pcp_allocator_t allocator, void** items,
                               size_t* capacity, size_t needed,
                               size_t item_size) {
  if (needed <= *capacity) {
    return pcp_ok_status();
  }
  size_t new_capacity = *capacity ? *capacity : 64;
  while (new_capacity < needed) {
    new_capacity *= 2;
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(allocator, new_capacity * item_size, items));
  *capacity = new_capacity;
  return pcp_ok_status();
}

static size_t slot_hash(const void* key, size_t mask) {
  uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 17) & mask;
}

static void slot_insert(value_slot_t* slots, size_t capacity, const void* key,
                        uint32_t id) {
  size_t mask = capacity - 1;
  size_t i = slot_hash(key, mask);
  while (slots[i].key && slots[i].key != key) {
    i = (i + 1) & mask;
  }
  slots[i].key = key;
  slots[i].id = id;
}

static pcp_status_t body_add_value(body_builder_t* b, MlirValue value) {
  pcp_mlir_function_body_t* body = b->body;
  pcp_allocator_t allocator = body->allocator;
  size_t id = body->value_count;
  if (id >= UINT32_MAX) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "too many values");
  }
  size_t old_capacity = b->value_capacity;
  PCP_RETURN_IF_ERROR_BARE(grow_array(allocator, (void**)&body->values,
                                      &b->value_capacity, id + 1,
                                      sizeof(pcp_mlir_type_t)));
  if (b->value_capacity != old_capacity) {
    size_t offsets_capacity = old_capacity;
    PCP_RETURN_IF_ERROR_BARE(grow_array(allocator, (void**)&b->value_offsets,
                                        &offsets_capacity, b->value_capacity,
                                        2 * sizeof(size_t)));
  }
  if (2 * (id + 1) > b->slot_capacity) {
    size_t capacity = b->slot_capacity ? b->slot_capacity * 2 : 256;
    value_slot_t* slots = NULL;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        allocator, capacity * sizeof(value_slot_t), (void**)&slots));
    for (size_t i = 0; i < b->slot_capacity; ++i) {
      if (b->slots[i].key) {
        slot_insert(slots, capacity, b->slots[i].key, b->slots[i].id);
      }
    }
    pcp_allocator_free(allocator, b->slots);
    b->slots = slots;
    b->slot_capacity = capacity;
  }
  PCP_RETURN_IF_ERROR_BARE(
      describe_type(b->api, b->api->mlirValueGetType(value), "a value",
                    &b->strings, &body->values[id], &b->value_offsets[2 * id]));
  slot_insert(b->slots, b->slot_capacity, value.ptr, (uint32_t)id);
  body->value_count = id + 1;
  return pcp_ok_status();
}

static bool body_find_value(const body_builder_t* b, MlirValue value,
                            uint32_t* out_id) {
  if (!b->slot_capacity) {
    return false;
  }
  size_t mask = b->slot_capacity - 1;
  size_t i = slot_hash(value.ptr, mask);
  while (b->slots[i].key) {
    if (b->slots[i].key == value.ptr) {
      *out_id = b->slots[i].id;
      return true;
    }
    i = (i + 1) & mask;
  }
  return false;
}

// Skips one bracketed group starting at text[i] ('(', '[' or '{'), string
// literals included; returns the index just past its closing bracket.
static size_t skip_group(const char* text, size_t length, size_t i) {
  int depth = 0;
  for (; i < length; ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < length && text[i] != '"'; ++i) {
        if (text[i] == '\\') {
          ++i;
        }
      }
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) {
        return i + 1;
      }
    }
  }
  return length;
}

static size_t skip_spaces(const char* text, size_t length, size_t i) {
  while (i < length && (text[i] == ' ' || text[i] == '\n')) {
    ++i;
  }
  return i;
}

// Finds the "<{...}>" properties and "{...}" attribute dictionary in the
// generic print of one op: "%0 = "name"(operands) [succ] <{..}> (regions)
// {..} : type".
static void split_generic_op(const char* text, size_t length,
                             pcp_string_view_t* out_properties,
                             pcp_string_view_t* out_attributes) {
  *out_properties = pcp_make_string_view("", 0);
  *out_attributes = pcp_make_string_view("", 0);
  const char* quote = memchr(text, '"', length);
  if (!quote) {
    return;
  }
  size_t i = (size_t)(quote - text) + 1;
  while (i < length && text[i] != '"') {
    ++i;
  }
  i = skip_spaces(text, length, i + 1);
  if (i < length && text[i] == '(') {
    i = skip_spaces(text, length, skip_group(text, length, i));
  }
  if (i < length && text[i] == '[') {
    i = skip_spaces(text, length, skip_group(text, length, i));
  }
  if (i + 1 < length && text[i] == '<' && text[i + 1] == '{') {
    size_t end = skip_group(text, length, i + 1);
    if (end < length && text[end] == '>') {
      ++end;
    }
    *out_properties = pcp_make_string_view(text + i, end - i);
    i = skip_spaces(text, length, end);
  }
  if (i < length && text[i] == '(') {
    i = skip_spaces(text, length, skip_group(text, length, i));
  }
  if (i < length && text[i] == '{') {
    size_t end = skip_group(text, length, i);
    *out_attributes = pcp_make_string_view(text + i, end - i);
  }
}

static pcp_status_t append_string(pcp_string_builder_t* strings,
                                  pcp_string_view_t value, size_t* out_offset) {
  *out_offset = strings->size;
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(strings, value));
  return pcp_string_builder_append(strings, pcp_make_string_view("", 1));
}

static pcp_status_t body_append_location(body_builder_t* b,
                                         MlirLocation location,
                                         size_t* out_offset) {
  const pcp_mlir_api_t* api = b->api;
  *out_offset = b->strings.size;
  MlirLocation file_location;
  if (find_file_location(api, location, 0, &file_location)) {
    MlirStringRef file = api->mlirIdentifierStr(
        api->mlirLocationFileLineColRangeGetFilename(file_location));
    int line = api->mlirLocationFileLineColRangeGetStartLine(file_location);
    int column = api->mlirLocationFileLineColRangeGetStartColumn(file_location);
    if (file.length == 0 || string_ref_equals(file, "-")) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          &b->strings, "%s:%d:%d", b->buffer_name, line, column));
    } else {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          &b->strings, "%.*s:%d:%d", (int)file.length, file.data, line,
          column));
    }
  } else {
    sink_t sink = {&b->strings, pcp_ok_status()};
    api->mlirLocationPrint(location, sink_append, &sink);
    PCP_RETURN_IF_ERROR_BARE(sink.status);
  }
  return pcp_string_builder_append(&b->strings, pcp_make_string_view("", 1));
}

static pcp_status_t body_walk_block(body_builder_t* b, MlirBlock block,
                                    size_t block_index);

static pcp_status_t body_add_op(body_builder_t* b, MlirOperation op) {
  const pcp_mlir_api_t* api = b->api;
  pcp_mlir_function_body_t* body = b->body;
  pcp_allocator_t allocator = body->allocator;
  size_t index = body->op_count;
  size_t old_capacity = b->op_capacity;
  PCP_RETURN_IF_ERROR_BARE(grow_array(allocator, (void**)&body->ops,
                                      &b->op_capacity, index + 1,
                                      sizeof(pcp_mlir_op_t)));
  if (b->op_capacity != old_capacity) {
    size_t offsets_capacity = old_capacity;
    PCP_RETURN_IF_ERROR_BARE(grow_array(allocator, (void**)&b->op_offsets,
                                        &offsets_capacity, b->op_capacity,
                                        4 * sizeof(size_t)));
  }
  pcp_mlir_op_t* out = &body->ops[index];
  memset(out, 0, sizeof(*out));
  size_t* offsets = &b->op_offsets[4 * index];
  MlirStringRef name = api->mlirIdentifierStr(api->mlirOperationGetName(op));
  PCP_RETURN_IF_ERROR_BARE(append_string(
      &b->strings, pcp_make_string_view(name.data, name.length), &offsets[0]));
  PCP_RETURN_IF_ERROR_BARE(
      body_append_location(b, api->mlirOperationGetLocation(op), &offsets[1]));

  // Attributes: print the op alone (local scope, so nothing outside it is
  // numbered) in generic form and keep the two dictionaries verbatim. The
  // C API's per-attribute accessors return MlirNamedAttribute by value,
  // which decisions.md keeps out of the table.
  pcp_string_builder_reset(&b->scratch);
  MlirOpPrintingFlags flags = api->mlirOpPrintingFlagsCreate();
  api->mlirOpPrintingFlagsPrintGenericOpForm(flags);
  api->mlirOpPrintingFlagsUseLocalScope(flags);
  sink_t sink = {&b->scratch, pcp_ok_status()};
  api->mlirOperationPrintWithFlags(op, flags, sink_append, &sink);
  api->mlirOpPrintingFlagsDestroy(flags);
  PCP_RETURN_IF_ERROR_BARE(sink.status);
  pcp_string_view_t properties, attributes;
  split_generic_op(b->scratch.data ? b->scratch.data : "", b->scratch.size,
                   &properties, &attributes);
  PCP_RETURN_IF_ERROR_BARE(append_string(&b->strings, properties, &offsets[2]));
  PCP_RETURN_IF_ERROR_BARE(append_string(&b->strings, attributes, &offsets[3]));

  intptr_t operand_count = api->mlirOperationGetNumOperands(op);
  out->operand_count = (uint32_t)operand_count;
  out->first_operand = (uint32_t)body->operand_count;
  PCP_RETURN_IF_ERROR_BARE(grow_array(
      allocator, (void**)&body->operands, &b->operand_capacity,
      body->operand_count + (size_t)operand_count, sizeof(uint32_t)));
  for (intptr_t i = 0; i < operand_count; ++i) {
    uint32_t id = 0;
    if (!body_find_value(b, api->mlirOperationGetOperand(op, i), &id)) {
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "%.*s: operand %d is defined outside the function",
                             (int)name.length, name.data, (int)i);
    }
    body->operands[body->operand_count++] = id;
  }
  ++body->op_count;
  intptr_t result_count = api->mlirOperationGetNumResults(op);
  body->ops[index].result_count = (uint32_t)result_count;
  body->ops[index].first_result = (uint32_t)body->value_count;
  for (intptr_t i = 0; i < result_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        body_add_value(b, api->mlirOperationGetResult(op, i)));
  }
  return pcp_ok_status();
}

static pcp_status_t body_walk_regions(body_builder_t* b, MlirOperation op,
                                      size_t op_index) {
  const pcp_mlir_api_t* api = b->api;
  pcp_mlir_function_body_t* body = b->body;
  intptr_t region_count = api->mlirOperationGetNumRegions(op);
  if (region_count == 0) {
    return pcp_ok_status();
  }
  size_t first_block = body->block_count;
  PCP_RETURN_IF_ERROR_BARE(
      grow_array(body->allocator, (void**)&body->blocks, &b->block_capacity,
                 first_block + (size_t)region_count, sizeof(pcp_mlir_block_t)));
  body->block_count += (size_t)region_count;
  body->ops[op_index].region_count = (uint32_t)region_count;
  body->ops[op_index].first_block = (uint32_t)first_block;
  for (intptr_t r = 0; r < region_count; ++r) {
    MlirBlock block =
        api->mlirRegionGetFirstBlock(api->mlirOperationGetRegion(op, r));
    if (mlirBlockIsNull(block) ||
        !mlirBlockIsNull(api->mlirBlockGetNextInRegion(block))) {
      return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "%s at %s: region %d must have exactly one block",
                             b->strings.data + b->op_offsets[4 * op_index],
                             b->strings.data + b->op_offsets[4 * op_index + 1],
                             (int)r);
    }
    PCP_RETURN_IF_ERROR_BARE(
        body_walk_block(b, block, first_block + (size_t)r));
  }
  return pcp_ok_status();
}

// Ops of one block are appended contiguously (and their results numbered)
// before any nested region is walked, so a block's op range is one slice.
static pcp_status_t body_walk_block(body_builder_t* b, MlirBlock block,
                                    size_t block_index) {
  const pcp_mlir_api_t* api = b->api;
  pcp_mlir_function_body_t* body = b->body;
  pcp_mlir_block_t info = {0};
  intptr_t argument_count = api->mlirBlockGetNumArguments(block);
  info.argument_count = (uint32_t)argument_count;
  info.first_argument = (uint32_t)body->value_count;
  for (intptr_t i = 0; i < argument_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        body_add_value(b, api->mlirBlockGetArgument(block, i)));
  }
  info.first_op = (uint32_t)body->op_count;
  for (MlirOperation op = api->mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(op); op = api->mlirOperationGetNextInBlock(op)) {
    PCP_RETURN_IF_ERROR_BARE(body_add_op(b, op));
  }
  info.op_count = (uint32_t)(body->op_count - info.first_op);
  body->blocks[block_index] = info;
  size_t op_index = info.first_op;
  for (MlirOperation op = api->mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(op);
       op = api->mlirOperationGetNextInBlock(op), ++op_index) {
    PCP_RETURN_IF_ERROR_BARE(body_walk_regions(b, op, op_index));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_mlir_module_function_body(pcp_mlir_module_t* module,
                                           const char* function_name,
                                           pcp_allocator_t allocator,
                                           pcp_mlir_function_body_t* out_body) {
  memset(out_body, 0, sizeof(*out_body));
  out_body->allocator = allocator;
  if (!function_name || !function_name[0]) {
    function_name = PCP_MLIR_DEFAULT_FUNCTION;
  }
  if (function_name[0] == '@') {
    ++function_name;
  }
  const function_entry_t* entry = NULL;
  for (size_t i = 0; i < module->function_count; ++i) {
    if (strcmp(module->functions[i].name, function_name) == 0) {
      entry = &module->functions[i];
      break;
    }
  }
  if (!entry) {
    return function_not_found(module, function_name);
  }
  const pcp_mlir_api_t* api = module->context->api;
  body_builder_t b = {
      .api = api, .buffer_name = module->buffer_name, .body = out_body};
  pcp_string_builder_initialize(allocator, 0, &b.strings);
  pcp_string_builder_initialize(allocator, 0, &b.scratch);
  MlirBlock entry_block =
      api->mlirRegionGetFirstBlock(api->mlirOperationGetRegion(entry->op, 0));
  pcp_status_t status = pcp_ok_status();
  if (mlirBlockIsNull(entry_block)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "@%s has no body (a declaration)", entry->name);
  }
  if (!status) {
    status = grow_array(allocator, (void**)&out_body->blocks, &b.block_capacity,
                        1, sizeof(pcp_mlir_block_t));
  }
  if (!status) {
    out_body->block_count = 1;
    status = body_walk_block(&b, entry_block, 0);
  }
  if (!status) {
    status = pcp_string_builder_take(&b.strings, &out_body->strings_);
  }
  if (!status) {
    const char* base = out_body->strings_;
    set_spellings(out_body->values, out_body->value_count, b.value_offsets,
                  base);
    for (size_t i = 0; i < out_body->op_count; ++i) {
      out_body->ops[i].name = base + b.op_offsets[4 * i];
      out_body->ops[i].location = base + b.op_offsets[4 * i + 1];
      out_body->ops[i].properties = base + b.op_offsets[4 * i + 2];
      out_body->ops[i].attributes = base + b.op_offsets[4 * i + 3];
    }
  }
  pcp_string_builder_deinitialize(&b.strings);
  pcp_string_builder_deinitialize(&b.scratch);
  pcp_allocator_free(allocator, b.value_offsets);
  pcp_allocator_free(allocator, b.op_offsets);
  pcp_allocator_free(allocator, b.slots);
  if (status) {
    pcp_mlir_function_body_deinitialize(out_body);
    out_body->allocator = allocator;
  }
  return status;
}

void pcp_mlir_function_body_deinitialize(pcp_mlir_function_body_t* body) {
  pcp_allocator_t allocator = body->allocator;
  pcp_allocator_free(allocator, body->values);
  pcp_allocator_free(allocator, body->ops);
  pcp_allocator_free(allocator, body->blocks);
  pcp_allocator_free(allocator, body->operands);
  pcp_allocator_free(allocator, body->strings_);
  memset(body, 0, sizeof(*body));
  body->allocator = allocator;
}
