// SPDX-License-Identifier: Apache-2.0
// The IREE backend: CPython embedded in this process drives iree.runtime
// from the project's .venv. This is the only file in PCP that includes
// Python.h.
//
// Set-up (devices, program loading, downloads) calls the helper module
// embedded from iree_helper.py. The per-call path builds the VM argument
// list, invokes and collects results with direct C calls on cached objects,
// so no Python bytecode runs per invocation and IREE's invoke releases the
// GIL while the program runs.
//
// The interpreter is started once per process with the GIL released after
// start-up; every entry point takes it with PyGILState_Ensure, so a backend
// may be used from any thread (one at a time).

// Python.h first: it sets feature macros the system headers below read
// (CPU_ZERO, sched_getaffinity), so clang-format must not regroup it.
// clang-format off
#define PY_SSIZE_T_CLEAN
#include <Python.h>
// clang-format on
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compute/backends/iree/iree_helper_source.h"
#include "compute/compute_impl.h"

//===----------------------------------------------------------------------===//
// The interpreter
//===----------------------------------------------------------------------===//

static pthread_once_t g_python_once = PTHREAD_ONCE_INIT;
static pcp_status_code_t g_python_code = PCP_STATUS_OK;
static char g_python_error[2048];

// Cached objects and interned names (owned for the life of the process).
static PyObject* g_helper;
static PyObject* g_vm_variant_list;  // type
static PyObject* g_hal_buffer_view;  // type
static PyObject* g_name_push_ref;
static PyObject* g_name_invoke;
static PyObject* g_name_get_as_object;
static PyObject* g_name_element_type;
static PyObject* g_name_shape;
static PyObject* g_name_byte_length;
// PCP element type -> IREE HAL element type value, and the reverse lookup.
static long g_hal_types[PCP_ELEMENT_TYPE_COUNT_];
static PyObject* g_result_types;  // dict: HAL type -> PCP type

// Turns the pending Python exception into a status. IREE raises
// RuntimeError with its canonical code name inside the message
// ("...: INVALID_ARGUMENT; input0 shape..."), which maps back losslessly.
static pcp_status_t status_from_python(const char* context) {
  PyObject *type = NULL, *value = NULL, *traceback = NULL;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  pcp_status_code_t code = PCP_STATUS_INTERNAL;
  const char* text = "unknown Python error";
  PyObject* str = value ? PyObject_Str(value) : NULL;
  if (str)
    text = PyUnicode_AsUTF8(str);
  if (!text) {
    PyErr_Clear();
    text = "unprintable Python error";
  }
  if (type) {
    if (PyErr_GivenExceptionMatches(type, PyExc_LookupError)) {
      code = PCP_STATUS_NOT_FOUND;
    } else if (PyErr_GivenExceptionMatches(type, PyExc_ConnectionError)) {
      code = PCP_STATUS_UNAVAILABLE;
    } else if (PyErr_GivenExceptionMatches(type, PyExc_ValueError) ||
               PyErr_GivenExceptionMatches(type, PyExc_TypeError)) {
      code = PCP_STATUS_INVALID_ARGUMENT;
    } else if (PyErr_GivenExceptionMatches(type, PyExc_MemoryError)) {
      code = PCP_STATUS_RESOURCE_EXHAUSTED;
    } else if (PyErr_GivenExceptionMatches(type, PyExc_ImportError)) {
      code = PCP_STATUS_FAILED_PRECONDITION;
    }
  }
  // IREE's "<path>.c:NN: CODE; " is internal: the code maps back below and
  // users see the text around it (PCP_LOG_LEVEL=debug keeps it whole).
  const char* tail = NULL;            // text after "CODE; "
  size_t head_length = strlen(text);  // text before "<path>:NN: "
  for (int c = 1; c < PCP_STATUS_CODE_COUNT_; ++c) {
    char needle[48];
    snprintf(needle, sizeof(needle), ": %s;",
             pcp_status_code_string((pcp_status_code_t)c));
    const char* at = strstr(text, needle);
    if (!at)
      continue;
    if (code == PCP_STATUS_INTERNAL)
      code = (pcp_status_code_t)c;
    // Back over ":NN" and the path (no spaces) to the location's start.
    const char* start = at;
    while (start > text && start[-1] >= '0' && start[-1] <= '9') --start;
    if (start == at || start == text || start[-1] != ':')
      break;
    --start;
    while (start > text && start[-1] != ' ') --start;
    head_length = (size_t)(start - text);
    while (head_length > 0 &&
           (text[head_length - 1] == ' ' || text[head_length - 1] == ':')) {
      --head_length;
    }
    tail = at + strlen(needle);
    while (*tail == ' ') ++tail;
    break;
  }
  for (int c = 1; c < PCP_STATUS_CODE_COUNT_ && code == PCP_STATUS_INTERNAL;
       ++c) {
    char needle[48];
    snprintf(needle, sizeof(needle), "%s;",
             pcp_status_code_string((pcp_status_code_t)c));
    if (strstr(text, needle))
      code = (pcp_status_code_t)c;
  }
  pcp_status_t status;
  if (tail && pcp_log_level() != PCP_LOG_DEBUG) {
    status = pcp_make_status(code, "%s: %.*s%s%.1500s", context,
                             (int)(head_length > 300 ? 300 : head_length), text,
                             head_length ? ": " : "", tail);
  } else {
    status = pcp_make_status(code, "%s: %.1800s", context, text);
  }
  Py_XDECREF(str);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return status;
}

static void record_python_failure(pcp_status_code_t code, const char* what) {
  g_python_code = code;
  snprintf(g_python_error, sizeof(g_python_error), "%s", what);
}

static void record_python_exception(const char* context) {
  pcp_status_t status = status_from_python(context);
  record_python_failure(pcp_status_code(status), pcp_status_message(status));
  pcp_status_ignore(status);
}

static bool cache_attr(PyObject* module, const char* name, PyObject** out) {
  *out = PyObject_GetAttrString(module, name);
  return *out != NULL;
}

static void python_initialize(void) {
  char site[PATH_MAX];
  pcp_status_t status = pcp_venv_site_packages(site, sizeof(site));
  if (status) {
    record_python_failure(pcp_status_code(status), pcp_status_message(status));
    pcp_status_ignore(status);
    return;
  }
  if (!Py_IsInitialized()) {
    // Isolated: no PYTHON* variables, no user site. Pointing program_name
    // at the venv's interpreter makes Python read its pyvenv.cfg, so
    // sys.path is exactly the venv's (as if the venv's python were run),
    // and never the system dist-packages with their own numpy.
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;  // signals belong to pcp
    config.parse_argv = 0;
    char program[PATH_MAX];
    snprintf(program, sizeof(program), "%s/bin/python3", pcp_venv_directory());
    PyStatus py_status =
        PyConfig_SetBytesString(&config, &config.program_name, program);
    if (!PyStatus_Exception(py_status))
      py_status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(py_status)) {
      char message[512];
      snprintf(message, sizeof(message),
               "starting the embedded Python failed: %s",
               py_status.err_msg ? py_status.err_msg : "unknown error");
      record_python_failure(PCP_STATUS_FAILED_PRECONDITION, message);
      return;
    }
  } else {
    // Someone else (a test harness) started Python: take the GIL.
    PyGILState_Ensure();
  }
  // Make sure the venv's packages come first even if Python was started by
  // someone else.
  PyObject* sys_path = PySys_GetObject("path");
  PyObject* site_str = PyUnicode_FromString(site);
  if (sys_path && site_str && PySequence_Contains(sys_path, site_str) != 1) {
    PyList_Insert(sys_path, 0, site_str);
  }
  Py_XDECREF(site_str);

  PyObject* code =
      Py_CompileString(kIreeHelperSource, "pcp/iree_helper.py", Py_file_input);
  g_helper = code ? PyImport_ExecCodeModule("pcp_iree_helper", code) : NULL;
  Py_XDECREF(code);
  if (!g_helper) {
    record_python_exception(
        "importing iree.runtime from the .venv (run 'make setup')");
    PyEval_SaveThread();
    return;
  }
  PyObject* binding = PyImport_ImportModule("iree._runtime_libs._runtime");
  bool ok = binding &&
            cache_attr(binding, "VmVariantList", &g_vm_variant_list) &&
            cache_attr(binding, "HalBufferView", &g_hal_buffer_view);
  Py_XDECREF(binding);
  g_name_push_ref = PyUnicode_InternFromString("push_ref");
  g_name_invoke = PyUnicode_InternFromString("invoke");
  g_name_get_as_object = PyUnicode_InternFromString("get_as_object");
  g_name_element_type = PyUnicode_InternFromString("element_type");
  g_name_shape = PyUnicode_InternFromString("shape");
  g_name_byte_length = PyUnicode_InternFromString("byte_length");
  PyObject* types =
      ok ? PyObject_GetAttrString(g_helper, "ELEMENT_TYPES") : NULL;
  ok = ok && types && cache_attr(g_helper, "RESULT_TYPES", &g_result_types);
  for (int t = 1; ok && t < PCP_ELEMENT_TYPE_COUNT_; ++t) {
    PyObject* key = PyLong_FromLong(t);
    PyObject* value = PyDict_GetItem(types, key);  // borrowed
    Py_DECREF(key);
    g_hal_types[t] = value ? PyLong_AsLong(value) : 0;
  }
  Py_XDECREF(types);
  if (!ok)
    record_python_exception("reading iree.runtime bindings");
  PyEval_SaveThread();  // release the GIL; entry points re-take it
}

static pcp_status_t python_ready(void) {
  pthread_once(&g_python_once, python_initialize);
  if (g_python_code != PCP_STATUS_OK) {
    return pcp_make_status(g_python_code, "IREE runtime unavailable: %s",
                           g_python_error);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Objects
//===----------------------------------------------------------------------===//

typedef struct iree_backend_t {
  pcp_backend_t base;
  PyObject* device;
  PyObject* config;
} iree_backend_t;

typedef struct iree_program_t {
  pcp_program_t base;
  PyObject* program;     // helper Program
  PyObject* vm_context;  // its VmContext (the invoke target)
} iree_program_t;

typedef struct iree_tensor_t {
  pcp_tensor_t base;
  PyObject* view;  // HalBufferView
} iree_tensor_t;

static const pcp_backend_vtable_t kIreeVtable;

static pcp_status_t make_tensor(pcp_backend_t* backend, PyObject* view,
                                const pcp_tensor_shape_t* shape,
                                size_t byte_length, pcp_tensor_t** out) {
  iree_tensor_t* tensor = NULL;
  pcp_status_t status = pcp_allocator_malloc(backend->allocator,
                                             sizeof(*tensor), (void**)&tensor);
  if (status) {
    Py_DECREF(view);
    return pcp_status_annotate_f(status, "tensor handle");
  }
  atomic_init(&tensor->base.ref_count, 1);
  tensor->base.backend = backend;
  tensor->base.shape = *shape;
  tensor->base.byte_length = byte_length;
  tensor->view = view;  // takes the reference
  *out = &tensor->base;
  return pcp_ok_status();
}

// Reads shape and element type back from a result view (used only when the
// signature leaves them open: dynamic dims or undeclared types).
static pcp_status_t describe_view(PyObject* view, pcp_tensor_shape_t* out_shape,
                                  size_t* out_byte_length) {
  memset(out_shape, 0, sizeof(*out_shape));
  PyObject* et = PyObject_GetAttr(view, g_name_element_type);
  PyObject* shape = PyObject_GetAttr(view, g_name_shape);
  PyObject* bytes = PyObject_GetAttr(view, g_name_byte_length);
  pcp_status_t status = pcp_ok_status();
  if (!et || !shape || !bytes) {
    status = status_from_python("reading a result");
  } else {
    PyObject* et_int = PyNumber_Long(et);
    PyObject* mapped = et_int ? PyDict_GetItem(g_result_types, et_int) : NULL;
    out_shape->element_type = mapped ? (pcp_element_type_t)PyLong_AsLong(mapped)
                                     : PCP_ELEMENT_TYPE_UNKNOWN;
    Py_XDECREF(et_int);
    Py_ssize_t rank = PySequence_Size(shape);
    if (rank < 0 || rank > PCP_MAX_TENSOR_RANK) {
      PyErr_Clear();
      status =
          pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "result rank %zd", rank);
    } else {
      out_shape->rank = (int32_t)rank;
      for (Py_ssize_t d = 0; d < rank; ++d) {
        PyObject* dim = PySequence_GetItem(shape, d);
        out_shape->dims[d] = dim ? PyLong_AsLongLong(dim) : 0;
        Py_XDECREF(dim);
      }
      *out_byte_length = (size_t)PyLong_AsSize_t(bytes);
    }
  }
  Py_XDECREF(et);
  Py_XDECREF(shape);
  Py_XDECREF(bytes);
  return status;
}

// New reference to a HalBufferView holding a copy of |host|.
static PyObject* upload_view(iree_backend_t* backend,
                             const pcp_host_tensor_t* host) {
  // A zero-byte tensor still needs a (1-byte) buffer to wrap.
  static const uint8_t kEmpty[1] = {0};
  const void* data = host->byte_length ? host->data : kEmpty;
  size_t length = host->byte_length ? host->byte_length : 1;
  PyObject* memory =
      PyMemoryView_FromMemory((char*)data, (Py_ssize_t)length, PyBUF_READ);
  PyObject* shape = PyList_New(host->shape.rank);
  for (int32_t d = 0; shape && d < host->shape.rank; ++d) {
    PyList_SET_ITEM(shape, d, PyLong_FromLongLong(host->shape.dims[d]));
  }
  PyObject* view = NULL;
  if (memory && shape) {
    view =
        PyObject_CallMethod(g_helper, "upload", "OOOl", backend->device, memory,
                            shape, g_hal_types[host->shape.element_type]);
  }
  Py_XDECREF(memory);
  Py_XDECREF(shape);
  return view;
}

//===----------------------------------------------------------------------===//
// vtable
//===----------------------------------------------------------------------===//

static void backend_destroy(pcp_backend_t* base) {
  iree_backend_t* backend = (iree_backend_t*)base;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(backend->config);
  // Releasing the device joins IREE's task workers, and the bindings do it
  // with the GIL held. A worker that is still dropping the last reference
  // to a Python-owned buffer of a finished call waits for the GIL inside its
  // task, so the join never returns (seen once in the ASan suite: `pcp run`
  // hung in backend_destroy). Give the GIL away for a moment first: a
  // waiting worker takes it (the release wakes it), finishes its task and
  // the join then has nothing to wait for. Calls are synchronous, so no new
  // task starts after the last one returned.
  for (int i = 0; i < 3; ++i) {
    Py_BEGIN_ALLOW_THREADS;
    struct timespec pause = {0, 5 * 1000 * 1000};
    nanosleep(&pause, NULL);
    Py_END_ALLOW_THREADS;
  }
  Py_XDECREF(backend->device);
  PyGILState_Release(gil);
  pcp_allocator_free(base->allocator, backend);
}

// Frees the exported names (NULL-safe entries), as far as they were copied.
static void free_function_names(pcp_program_t* base) {
  pcp_allocator_t allocator = base->backend->allocator;
  for (size_t i = 0; base->function_names && i < base->function_count; ++i)
    pcp_allocator_free(allocator, base->function_names[i]);
  pcp_allocator_free(allocator, base->function_names);
  base->function_names = NULL;
  base->function_count = 0;
}

static pcp_status_t program_load(pcp_backend_t* base, const void* vmfb,
                                 size_t byte_length,
                                 pcp_program_t** out_program) {
  iree_backend_t* backend = (iree_backend_t*)base;
  pcp_allocator_t allocator = base->allocator;
  iree_program_t* program = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, sizeof(*program), (void**)&program),
      "program");
  program->base.backend = base;
  pcp_status_t status = pcp_ok_status();
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* bytes = PyBytes_FromStringAndSize(vmfb, (Py_ssize_t)byte_length);
  PyObject* cls = bytes ? PyObject_GetAttrString(g_helper, "Program") : NULL;
  program->program =
      cls ? PyObject_CallFunction(cls, "OO", backend->config, bytes) : NULL;
  Py_XDECREF(cls);
  Py_XDECREF(bytes);
  if (!program->program) {
    status = status_from_python("loading the program");
    // A module the runtime can't parse is bad input, not an internal fault.
    if (pcp_status_code(status) == PCP_STATUS_INTERNAL) {
      pcp_status_t bad = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s",
                                         pcp_status_message(status));
      pcp_status_ignore(status);
      status = bad;
    }
  }
  PyObject* names = NULL;
  if (!status) {
    program->vm_context =
        PyObject_GetAttrString(program->program, "vm_context");
    names = PyObject_GetAttrString(program->program, "names");
    if (!program->vm_context || !names)
      status = status_from_python("loading the program");
  }
  if (!status) {
    Py_ssize_t count = PyList_Size(names);
    size_t slots = (size_t)(count > 0 ? count : 1);
    status = pcp_allocator_calloc(allocator, slots * sizeof(char*),
                                  (void**)&program->base.function_names);
    if (!status)
      program->base.function_count = (size_t)(count > 0 ? count : 0);
    for (Py_ssize_t i = 0; !status && i < count; ++i) {
      const char* name = PyUnicode_AsUTF8(PyList_GetItem(names, i));
      status = pcp_allocator_strdup(allocator, name ? name : "?",
                                    &program->base.function_names[i]);
    }
    if (status)
      status = pcp_status_annotate_f(status, "function names");
  }
  Py_XDECREF(names);
  if (status) {
    free_function_names(&program->base);
    Py_XDECREF(program->vm_context);
    Py_XDECREF(program->program);
    pcp_allocator_free(allocator, program);
    program = NULL;
  }
  PyGILState_Release(gil);
  *out_program = program ? &program->base : NULL;
  return status;
}

static void program_destroy(pcp_program_t* base) {
  iree_program_t* program = (iree_program_t*)base;
  pcp_allocator_t allocator = base->backend->allocator;
  PyGILState_STATE gil = PyGILState_Ensure();
  for (size_t i = 0; i < base->resolved_count; ++i) {
    Py_XDECREF((PyObject*)base->resolved[i].handle);
    pcp_allocator_free(allocator, base->resolved[i].name);
  }
  Py_XDECREF(program->vm_context);
  Py_XDECREF(program->program);
  PyGILState_Release(gil);
  free_function_names(base);
  pcp_allocator_free(allocator, base->resolved);
  pcp_allocator_free(allocator, program);
}

static pcp_status_t function_resolve(pcp_program_t* base, const char* name,
                                     pcp_function_signature_t* out_signature,
                                     void** out_handle) {
  iree_program_t* program = (iree_program_t*)base;
  memset(out_signature, 0, sizeof(*out_signature));
  pcp_status_t status = pcp_ok_status();
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* found = PyObject_CallMethod(program->program, "lookup", "s", name);
  PyObject* fn = NULL;
  const char* declaration = "";
  long inputs = 0, results = 0;
  if (!found ||
      !PyArg_ParseTuple(found, "Osll", &fn, &declaration, &inputs, &results)) {
    status = status_from_python("looking up the function");
  } else if (inputs > PCP_MAX_FUNCTION_ARITY ||
             results > PCP_MAX_FUNCTION_ARITY) {
    status =
        pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                        "function '%s' has %ld inputs and %ld results; the "
                        "limit is %d",
                        name, inputs, results, PCP_MAX_FUNCTION_ARITY);
  } else {
    out_signature->input_count = (int32_t)inputs;
    out_signature->result_count = (int32_t)results;
    status = pcp_compute_parse_abi_declaration(declaration, out_signature);
    if (!status) {
      Py_INCREF(fn);
      *out_handle = fn;
    }
  }
  Py_XDECREF(found);
  PyGILState_Release(gil);
  return status;
}

static pcp_status_t tensor_upload(pcp_backend_t* base,
                                  const pcp_host_tensor_t* host,
                                  pcp_tensor_t** out_tensor) {
  iree_backend_t* backend = (iree_backend_t*)base;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* view = upload_view(backend, host);
  pcp_status_t status = view ? make_tensor(base, view, &host->shape,
                                           host->byte_length, out_tensor)
                             : status_from_python("uploading a tensor");
  PyGILState_Release(gil);
  return status;
}

static pcp_status_t tensor_download(pcp_tensor_t* base, void* buffer,
                                    size_t byte_length) {
  iree_tensor_t* tensor = (iree_tensor_t*)base;
  iree_backend_t* backend = (iree_backend_t*)base->backend;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* memory =
      PyMemoryView_FromMemory(buffer, (Py_ssize_t)byte_length, PyBUF_WRITE);
  PyObject* done =
      memory ? PyObject_CallMethod(g_helper, "download", "OOO", backend->device,
                                   tensor->view, memory)
             : NULL;
  pcp_status_t status =
      done ? pcp_ok_status() : status_from_python("downloading a tensor");
  Py_XDECREF(done);
  Py_XDECREF(memory);
  PyGILState_Release(gil);
  return status;
}

static void tensor_destroy(pcp_tensor_t* base) {
  iree_tensor_t* tensor = (iree_tensor_t*)base;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(tensor->view);
  PyGILState_Release(gil);
  pcp_allocator_free(base->backend->allocator, tensor);
}

static pcp_status_t invoke(pcp_program_t* base,
                           const pcp_program_function_t* function,
                           const pcp_value_t* inputs, size_t input_count,
                           pcp_tensor_t** out_results) {
  const pcp_function_signature_t* signature = &function->signature;
  size_t result_count = (size_t)signature->result_count;
  iree_program_t* program = (iree_program_t*)base;
  iree_backend_t* backend = (iree_backend_t*)base->backend;
  pcp_status_t status = pcp_ok_status();
  size_t produced = 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* count = PyLong_FromSize_t(input_count);
  PyObject* args = count ? PyObject_CallOneArg(g_vm_variant_list, count) : NULL;
  Py_XDECREF(count);
  if (!args)
    status = status_from_python("building arguments");
  for (size_t i = 0; !status && i < input_count; ++i) {
    PyObject* view;
    if (inputs[i].resident) {
      view = ((iree_tensor_t*)inputs[i].resident)->view;
      Py_INCREF(view);
    } else {
      view = upload_view(backend, inputs[i].host);
    }
    PyObject* pushed =
        view ? PyObject_CallMethodOneArg(args, g_name_push_ref, view) : NULL;
    if (!pushed)
      status = status_from_python("passing an input");
    Py_XDECREF(pushed);
    Py_XDECREF(view);
  }
  PyObject* results = NULL;
  if (!status) {
    PyObject* n = PyLong_FromSize_t(result_count);
    results = n ? PyObject_CallOneArg(g_vm_variant_list, n) : NULL;
    Py_XDECREF(n);
    PyObject* done =
        results ? PyObject_CallMethodObjArgs(program->vm_context, g_name_invoke,
                                             (PyObject*)function->handle, args,
                                             results, NULL)
                : NULL;
    if (!done)
      status = status_from_python("running the function");
    Py_XDECREF(done);
  }
  for (size_t i = 0; !status && i < result_count; ++i) {
    PyObject* index = PyLong_FromSize_t(i);
    PyObject* view =
        index ? PyObject_CallMethodObjArgs(results, g_name_get_as_object, index,
                                           g_hal_buffer_view, NULL)
              : NULL;
    Py_XDECREF(index);
    if (!view) {
      status = status_from_python("reading a result");
      break;
    }
    pcp_tensor_shape_t shape;
    size_t byte_length = 0;
    // Declared, fully static result types skip the read-back.
    const pcp_tensor_shape_t* declared =
        i < PCP_SIGNATURE_MAX_TYPES ? &signature->results[i] : NULL;
    bool is_static = declared && declared->rank >= 0 &&
                     declared->element_type != PCP_ELEMENT_TYPE_UNKNOWN;
    for (int32_t d = 0; is_static && d < declared->rank; ++d) {
      is_static = declared->dims[d] >= 0;
    }
    if (is_static) {
      shape = *declared;
      status = pcp_tensor_shape_byte_length(&shape, &byte_length);
    } else {
      status = describe_view(view, &shape, &byte_length);
    }
    if (status) {
      Py_DECREF(view);
      break;
    }
    status =
        make_tensor(base->backend, view, &shape, byte_length, &out_results[i]);
    if (!status)
      produced++;
  }
  Py_XDECREF(results);
  Py_XDECREF(args);
  PyGILState_Release(gil);
  if (status) {
    for (size_t i = 0; i < produced; ++i) pcp_tensor_release(out_results[i]);
  }
  return status;
}

// IREE's allocator statistics through the helper (`memory`: a tuple of
// has_statistics, device bytes allocated, freed and peak).
static pcp_status_t memory_query(pcp_backend_t* base,
                                 pcp_backend_memory_t* out_memory) {
  iree_backend_t* backend = (iree_backend_t*)base;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallMethod(g_helper, "memory", "O", backend->device);
  pcp_status_t status = pcp_ok_status();
  if (!r || !PyTuple_Check(r) || PyTuple_Size(r) != 4) {
    status = r ? pcp_make_status(PCP_STATUS_INTERNAL,
                                 "allocator statistics: not a 4-tuple")
               : status_from_python("allocator statistics");
  } else if (!PyObject_IsTrue(PyTuple_GetItem(r, 0))) {
    status = pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "this IREE runtime keeps no allocator statistics");
  } else {
    uint64_t allocated = PyLong_AsUnsignedLongLong(PyTuple_GetItem(r, 1));
    uint64_t freed = PyLong_AsUnsignedLongLong(PyTuple_GetItem(r, 2));
    uint64_t peak = PyLong_AsUnsignedLongLong(PyTuple_GetItem(r, 3));
    if (PyErr_Occurred()) {
      status = status_from_python("allocator statistics");
    } else {
      out_memory->device_bytes_allocated = allocated;
      out_memory->device_bytes_live =
          allocated >= freed ? allocated - freed : 0;
      out_memory->device_bytes_peak = peak;
    }
  }
  Py_XDECREF(r);
  PyGILState_Release(gil);
  return status;
}

static const pcp_backend_vtable_t kIreeVtable = {
    .destroy = backend_destroy,
    .program_load = program_load,
    .program_destroy = program_destroy,
    .function_resolve = function_resolve,
    .tensor_upload = tensor_upload,
    .tensor_download = tensor_download,
    .tensor_destroy = tensor_destroy,
    .invoke = invoke,
    .memory_query = memory_query,
};

//===----------------------------------------------------------------------===//
// Creation
//===----------------------------------------------------------------------===//

// One number from /sys/devices/system/cpu/cpuN/topology/NAME, or -1.
static long cpu_topology_value(int cpu, const char* name) {
  char path[128];
  snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/%s", cpu,
           name);
  FILE* f = fopen(path, "r");
  long value = -1;
  if (f) {
    if (fscanf(f, "%ld", &value) != 1)
      value = -1;
    fclose(f);
  }
  return value;
}

// Physical cores this process may run on: distinct (package, core) pairs
// among the CPUs of its affinity mask -- the worker count IREE's default
// "physical_cores" topology picks -- or the mask's CPU count where sysfs
// does not say.
static int32_t physical_core_count(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int32_t)online : 1;
  }
  static long seen[CPU_SETSIZE];  // package << 20 | core; under the GIL
  int32_t cpus = 0, cores = 0;
  bool known = true;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set))
      continue;
    ++cpus;
    long package = cpu_topology_value(cpu, "physical_package_id");
    long core = cpu_topology_value(cpu, "core_id");
    if (package < 0 || core < 0)
      known = false;
    if (!known)
      continue;
    long key = (package << 20) | core;
    bool repeat = false;
    for (int32_t i = 0; i < cores && !repeat; ++i) repeat = seen[i] == key;
    if (!repeat)
      seen[cores++] = key;
  }
  int32_t count = known ? cores : cpus;
  return count > 0 ? count : 1;
}

pcp_status_t pcp_iree_backend_create(const pcp_backend_options_t* options,
                                     pcp_backend_t** out_backend) {
  *out_backend = NULL;
  const char* driver = options && options->driver ? options->driver : "cpu";
  int32_t ordinal = options ? options->device_ordinal : 0;
  // PCP and IREE driver names -> the IREE HAL driver (base's backend table).
  const char* iree_driver =
      pcp_backend_iree_driver_for_name(pcp_make_cstring_view(driver));
  if (!iree_driver) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "unknown device driver '%s' (expected cpu, local-sync, "
        "cuda, rocm, vulkan or metal)",
        driver);
  }
  if (ordinal < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "negative device ordinal %d", ordinal);
  }
  PCP_RETURN_IF_ERROR_BARE(python_ready());
  pcp_allocator_t allocator = options && options->allocator.ctl
                                  ? options->allocator
                                  : pcp_allocator_system();
  iree_backend_t* backend = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, sizeof(*backend), (void**)&backend),
      "backend");
  backend->base.vtable = &kIreeVtable;
  backend->base.allocator = allocator;
  snprintf(backend->base.info.driver, sizeof(backend->base.info.driver), "%s",
           iree_driver);
  backend->base.info.device_ordinal = ordinal;
  pcp_status_t status =
      pcp_compute_runtime_version(backend->base.info.runtime_version,
                                  sizeof(backend->base.info.runtime_version));
  pcp_status_ignore(status);  // informational; the import above succeeded
  status = pcp_ok_status();

  PyGILState_STATE gil = PyGILState_Ensure();
  if (strcmp(iree_driver, "local-task") == 0) {
    // An explicit group count makes IREE leave its workers unpinned; by
    // default it pins one per physical core. On a machine shared with other
    // work a pinned worker waits for its own core while another sits idle,
    // and every dispatch waits for its slowest worker: bench/train_step
    // measured 3.4k tokens/s pinned against 4.6k unpinned with the same two
    // workers on this 2-core machine under load (docs/performance.md,
    // docs/decisions.md "compute").
    int32_t workers = options && options->cpu_threads > 0
                          ? options->cpu_threads
                          : physical_core_count();
    char flag[64];
    snprintf(flag, sizeof(flag), "--task_topology_group_count=%d",
             (int)workers);
    // Dispatches may hold up to the compile's stack-allocation limit (4 MiB
    // for cpu, PCP_COMPILE_CPU_STACK_ALLOCATION_LIMIT) on a worker thread's
    // stack; IREE's own default stack is 128 KiB. 8 MiB is glibc's default
    // thread stack (reserved, committed only as touched). docs/decisions.md.
    PyObject* r = PyObject_CallMethod(g_helper, "set_flags", "ss", flag,
                                      "--task_worker_stack_size=8388608");
    if (!r)
      status = status_from_python("setting CPU threads");
    Py_XDECREF(r);
  }
  PyObject* created = status ? NULL
                             : PyObject_CallMethod(g_helper, "create_device",
                                                   "si", iree_driver, ordinal);
  if (!status && !created) {
    status = status_from_python("creating the device");
  } else if (created) {
    PyObject* name = NULL;
    if (PyArg_ParseTuple(created, "OOO", &backend->device, &backend->config,
                         &name)) {
      Py_INCREF(backend->device);
      Py_INCREF(backend->config);
      const char* text = PyUnicode_AsUTF8(name);
      snprintf(backend->base.info.device_name,
               sizeof(backend->base.info.device_name), "%s",
               text ? text : iree_driver);
      PyErr_Clear();
    } else {
      status = status_from_python("creating the device");
    }
  }
  Py_XDECREF(created);
  PyGILState_Release(gil);
  if (status) {
    backend_destroy(&backend->base);
    return pcp_status_annotate_f(status, "driver %s, device %d", driver,
                                 ordinal);
  }
  *out_backend = &backend->base;
  return pcp_ok_status();
}
