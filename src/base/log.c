// SPDX-License-Identifier: Apache-2.0
// key=value log lines, one write per line so concurrent threads and processes
// sharing stderr never interleave within a line.

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

static _Atomic int g_level = -1;  // -1: not read from the environment yet
static FILE* g_sink = NULL;

static const char* const kLevelNames[] = {"debug", "info", "warn", "error"};

const char* pcp_log_level_name(pcp_log_level_t level) {
  return (unsigned)level < 4 ? kLevelNames[level] : "info";
}

bool pcp_log_level_parse(const char* name, pcp_log_level_t* out_level) {
  for (int i = 0; i < 4; ++i) {
    if (strcasecmp(name, kLevelNames[i]) == 0) {
      *out_level = (pcp_log_level_t)i;
      return true;
    }
  }
  if (strcasecmp(name, "warning") == 0) {
    *out_level = PCP_LOG_WARN;
    return true;
  }
  return false;
}

void pcp_log_set_level(pcp_log_level_t level) {
  atomic_store(&g_level, (int)level);
}

pcp_log_level_t pcp_log_level(void) {
  int level = atomic_load(&g_level);
  if (level >= 0)
    return (pcp_log_level_t)level;
  pcp_log_level_t parsed = PCP_LOG_INFO;
  const char* env = getenv("PCP_LOG_LEVEL");
  if (env && !pcp_log_level_parse(env, &parsed))
    parsed = PCP_LOG_INFO;
  atomic_store(&g_level, (int)parsed);
  return parsed;
}

void pcp_log_set_sink(FILE* sink) {
  g_sink = sink;
}

// Appends value, quoting it when it holds spaces, quotes or '='.
static size_t append_value(char* line, size_t at, size_t cap,
                           const char* value) {
  bool quote = value[0] == 0 || strpbrk(value, " \"=\t") != NULL;
  if (at < cap && quote)
    line[at++] = '"';
  for (const char* p = value; *p && at + 2 < cap; ++p) {
    char c = *p;
    if (c == '"' || c == '\\') {
      line[at++] = '\\';
      line[at++] = c;
    } else if (c == '\n') {
      line[at++] = '\\';
      line[at++] = 'n';
    } else {
      line[at++] = c;
    }
  }
  if (at < cap && quote)
    line[at++] = '"';
  return at;
}

static size_t append_field(char* line, size_t at, size_t cap, const char* key,
                           const char* value) {
  if (!value)
    return at;
  int n = snprintf(line + at, at < cap ? cap - at : 0, " %s=", key);
  if (n > 0)
    at += (size_t)n;
  if (at >= cap)
    return cap;
  return append_value(line, at, cap, value);
}

void pcp_log_write(pcp_log_level_t level, const pcp_log_context_t* context,
                   const char* file, int line_number, const char* fmt, ...) {
  char message[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);

  char line[4096];
  const size_t cap = sizeof(line) - 2;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(
      line, cap, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s",
      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
      tm.tm_sec, ts.tv_nsec / 1000000L, pcp_log_level_name(level));
  size_t at = n > 0 ? (size_t)n : 0;
  if (context) {
    at = append_field(line, at, cap, "role", context->role);
    at = append_field(line, at, cap, "node", context->node_id);
    at = append_field(line, at, cap, "conn", context->connection_id);
    at = append_field(line, at, cap, "job", context->job_id);
  }
  at = append_field(line, at, cap, "msg", message);
  // The source location is for developers: shown at PCP_LOG_LEVEL=debug
  // only, like the status code names (pcp_status_format_for_user).
  if (pcp_log_level() == PCP_LOG_DEBUG) {
    const char* slash = strrchr(file, '/');
    char where[256];
    snprintf(where, sizeof(where), "%s:%d", slash ? slash + 1 : file,
             line_number);
    at = append_field(line, at, cap, "src", where);
  }
  if (at > cap)
    at = cap;
  line[at++] = '\n';
  if (g_sink) {
    fwrite(line, 1, at, g_sink);
    fflush(g_sink);
  } else {
    ssize_t ignored = write(STDERR_FILENO, line, at);
    (void)ignored;
  }
}

void pcp_log_status(pcp_log_level_t level, const pcp_log_context_t* context,
                    pcp_status_t status, const char* what) {
  char text[1024];
  pcp_status_format_for_user(status, text, sizeof(text));
  PCP_LOG(level, context, "%s: %s", what, text);
}
