// SPDX-License-Identifier: Apache-2.0
// pcp_status_t: a tagged pointer. OK is NULL; an error is either a bare code
// (PCP_STATUS_MODE 0, or when the payload could not be allocated) or a
// 32-byte aligned payload whose low bits repeat the code.

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

typedef struct status_payload_t {
  pcp_status_code_t code;
  int line;
  const char* file;   // static string from __FILE__
  char* message;      // owned, never NULL
  char* annotations;  // owned, "; "-separated, NULL when none
} status_payload_t;

static const char* const kCodeNames[PCP_STATUS_CODE_COUNT_] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
    "DEFERRED",
    "INCOMPATIBLE",
};

const char* pcp_status_code_string(pcp_status_code_t code) {
  if ((unsigned)code < PCP_STATUS_CODE_COUNT_)
    return kCodeNames[code];
  return "UNKNOWN";
}

bool pcp_status_code_from_string(const char* name,
                                 pcp_status_code_t* out_code) {
  for (int i = 0; i < PCP_STATUS_CODE_COUNT_; ++i) {
    if (strcmp(name, kCodeNames[i]) == 0) {
      *out_code = (pcp_status_code_t)i;
      return true;
    }
  }
  return false;
}

static status_payload_t* payload_of(pcp_status_t status) {
  return (status_payload_t*)((uintptr_t)status &
                             ~(uintptr_t)PCP_STATUS_CODE_MASK);
}

static pcp_status_t bare_status(pcp_status_code_t code) {
  return (pcp_status_t)(uintptr_t)(code & PCP_STATUS_CODE_MASK);
}

PCP_PRINTF_ATTR(1, 0)
static char* vformat_alloc(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  if (n < 0)
    return NULL;
  char* text = malloc((size_t)n + 1);
  if (!text)
    return NULL;
  vsnprintf(text, (size_t)n + 1, fmt, args);
  return text;
}

pcp_status_t pcp_status_allocate_v(pcp_status_code_t code, const char* file,
                                   int line, const char* fmt, va_list args) {
  if (code == PCP_STATUS_OK) {
    // Asking for an error with the OK code is a bug in the caller; make it
    // visible rather than silently succeeding.
    code = PCP_STATUS_INTERNAL;
  }
#if PCP_STATUS_MODE == 0
  (void)file;
  (void)line;
  (void)fmt;
  (void)args;
  return bare_status(code);
#else
  status_payload_t* payload = aligned_alloc(
      PCP_STATUS_PAYLOAD_ALIGNMENT,
      (sizeof(status_payload_t) + PCP_STATUS_PAYLOAD_ALIGNMENT - 1) &
          ~(size_t)(PCP_STATUS_PAYLOAD_ALIGNMENT - 1));
  if (!payload)
    return bare_status(code);
  payload->code = code;
  payload->file = file;
  payload->line = line;
  payload->annotations = NULL;
  payload->message = fmt ? vformat_alloc(fmt, args) : NULL;
  if (!payload->message)
    payload->message = strdup("");
  if (!payload->message) {
    free(payload);
    return bare_status(code);
  }
  return (pcp_status_t)((uintptr_t)payload | (uintptr_t)code);
#endif
}

pcp_status_t pcp_status_allocate_f(pcp_status_code_t code, const char* file,
                                   int line, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  pcp_status_t status = pcp_status_allocate_v(code, file, line, fmt, args);
  va_end(args);
  return status;
}

static void append_annotation(status_payload_t* payload, const char* text) {
  if (!text || !text[0])
    return;
  size_t old_len = payload->annotations ? strlen(payload->annotations) : 0;
  size_t add_len = strlen(text);
  char* joined = realloc(payload->annotations, old_len + add_len + 3);
  if (!joined)
    return;  // keep the status; losing context beats losing the error
  if (old_len) {
    memcpy(joined + old_len, "; ", 2);
    memcpy(joined + old_len + 2, text, add_len + 1);
  } else {
    memcpy(joined, text, add_len + 1);
  }
  payload->annotations = joined;
}

pcp_status_t pcp_status_annotate_f(pcp_status_t base, const char* fmt, ...) {
  if (!base)
    return base;
#if PCP_STATUS_MODE >= 2
  status_payload_t* payload = payload_of(base);
  if (!payload || !fmt || !fmt[0])
    return base;
  va_list args;
  va_start(args, fmt);
  char* text = vformat_alloc(fmt, args);
  va_end(args);
  append_annotation(payload, text);
  free(text);
#else
  (void)fmt;
#endif
  return base;
}

void pcp_status_ignore(pcp_status_t status) {
  status_payload_t* payload = payload_of(status);
  if (!payload)
    return;
  free(payload->message);
  free(payload->annotations);
  free(payload);
}

pcp_status_code_t pcp_status_consume_code(pcp_status_t status) {
  pcp_status_code_t code = pcp_status_code(status);
  pcp_status_ignore(status);
  return code;
}

const char* pcp_status_message(pcp_status_t status) {
  status_payload_t* payload = payload_of(status);
  return payload ? payload->message : "";
}

pcp_status_t pcp_status_clone(pcp_status_t status) {
  if (!status)
    return status;
  status_payload_t* payload = payload_of(status);
  if (!payload)
    return status;  // bare codes are values
  pcp_status_t copy = pcp_status_allocate_f(
      payload->code, payload->file, payload->line, "%s", payload->message);
  status_payload_t* copy_payload = payload_of(copy);
  if (copy_payload && payload->annotations) {
    copy_payload->annotations = strdup(payload->annotations);
  }
  return copy;
}

pcp_status_t pcp_status_join(pcp_status_t a, pcp_status_t b) {
  if (!a)
    return b;
  if (!b)
    return a;
  char* text = pcp_status_to_string(b);
  a = pcp_status_annotate_f(a, "also: %s", text ? text : "(unformattable)");
  free(text);
  pcp_status_ignore(b);
  return a;
}

size_t pcp_status_format(pcp_status_t status, char* buffer, size_t capacity) {
  pcp_status_code_t code = pcp_status_code(status);
  status_payload_t* payload = payload_of(status);
  int n;
  if (!payload) {
    n = snprintf(buffer, capacity, "%s", pcp_status_code_string(code));
  } else {
#if PCP_STATUS_MODE >= 2
    const char* file = payload->file ? payload->file : "?";
    const char* slash = strrchr(file, '/');
    if (slash)
      file = slash + 1;
    n = snprintf(
        buffer, capacity, "%s: %s%s%s (%s:%d)", pcp_status_code_string(code),
        payload->message, payload->annotations ? "; " : "",
        payload->annotations ? payload->annotations : "", file, payload->line);
#else
    n = snprintf(buffer, capacity, "%s: %s", pcp_status_code_string(code),
                 payload->message);
#endif
  }
  return n < 0 ? 0 : (size_t)n;
}

size_t pcp_status_format_for_user(pcp_status_t status, char* buffer,
                                  size_t capacity) {
  if (pcp_log_level() == PCP_LOG_DEBUG) {
    return pcp_status_format(status, buffer, capacity);
  }
  status_payload_t* payload = payload_of(status);
  const char* head = payload && payload->message[0] ? payload->message : NULL;
  char words[32];
  if (!head) {
    // "NOT_FOUND" -> "not found": the code is all there is to say.
    const char* name = pcp_status_code_string(pcp_status_code(status));
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof(words); ++i) {
      char c = name[i];
      words[i] = c == '_' ? ' ' : (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    words[i] = 0;
    head = words;
  }
  const char* annotations = payload ? payload->annotations : NULL;
  int n = snprintf(buffer, capacity, "%s%s%s", head, annotations ? "; " : "",
                   annotations ? annotations : "");
  return n < 0 ? 0 : (size_t)n;
}

char* pcp_status_to_string(pcp_status_t status) {
  size_t n = pcp_status_format(status, NULL, 0);
  char* text = malloc(n + 1);
  if (!text)
    return NULL;
  pcp_status_format(status, text, n + 1);
  return text;
}

static pcp_status_code_t code_from_errno(int error_number) {
  switch (error_number) {
    case 0:
      return PCP_STATUS_UNKNOWN;
    case EINVAL:
    case ENAMETOOLONG:
    case E2BIG:
    case EDOM:
    case EFAULT:
    case EILSEQ:
    case ENOTDIR:
    case ENOTEMPTY:
    case ESPIPE:
      return PCP_STATUS_INVALID_ARGUMENT;
    case ENOENT:
    case ENXIO:
    case ESRCH:
    case ENODEV:
      return PCP_STATUS_NOT_FOUND;
    case EEXIST:
    case EADDRINUSE:
    case EALREADY:
      return PCP_STATUS_ALREADY_EXISTS;
    case EPERM:
    case EACCES:
    case EROFS:
      return PCP_STATUS_PERMISSION_DENIED;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case EFBIG:
    case EDQUOT:
      return PCP_STATUS_RESOURCE_EXHAUSTED;
    case ETIMEDOUT:
      return PCP_STATUS_DEADLINE_EXCEEDED;
    case ECANCELED:
    case EINTR:
      return PCP_STATUS_CANCELLED;
    case EAGAIN:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EPIPE:
    case ENOTCONN:
      return PCP_STATUS_UNAVAILABLE;
    case ENOSYS:
    case ENOTSUP:
    case EAFNOSUPPORT:
    case EPROTONOSUPPORT:
      return PCP_STATUS_UNIMPLEMENTED;
    case EOVERFLOW:
    case ERANGE:
      return PCP_STATUS_OUT_OF_RANGE;
    case EIO:
      return PCP_STATUS_DATA_LOSS;
    default:
      return PCP_STATUS_UNKNOWN;
  }
}

pcp_status_t pcp_status_from_errno_f(int error_number, const char* file,
                                     int line, const char* fmt, ...) {
  char context[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(context, sizeof(context), fmt, args);
  va_end(args);
  char reason[128];
  // XSI strerror_r (the build defines _POSIX_C_SOURCE, not _GNU_SOURCE).
  if (strerror_r(error_number, reason, sizeof(reason)) != 0) {
    snprintf(reason, sizeof(reason), "unknown error");
  }
  const char* text = reason;
  return pcp_status_allocate_f(code_from_errno(error_number), file, line,
                               "%s: %s (errno %d)", context, text,
                               error_number);
}

void pcp_abort_at(const char* file, int line, const char* fmt, ...) {
  char message[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  fprintf(stderr, "pcp: fatal: %s:%d: %s\n", file, line, message);
  fflush(stderr);
  abort();
}
