// SPDX-License-Identifier: Apache-2.0
// Progress lines for long work. On a terminal a single line is redrawn in
// place; anywhere else (a supervisor's pipe, a container log) redraws would
// turn into thousands of lines, so a key=value line is written at most once
// per interval instead.

#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/obs.h"

#define TTY_REDRAW_INTERVAL_NS 100000000LL  // 100 ms
#define DEFAULT_LOG_INTERVAL_MS 10000

void pcp_progress_initialize(const pcp_progress_options_t* options,
                             pcp_progress_t* out_progress) {
  memset(out_progress, 0, sizeof(*out_progress));
  out_progress->options = *options;
  pcp_progress_options_t* o = &out_progress->options;
  if (!o->clock.now_ns) {
    o->clock = pcp_clock_system();
  }
  if (!o->out) {
    o->out = stderr;
  }
  if (!o->task) {
    o->task = "work";
  }
  if (!o->units) {
    o->units = "items";
  }
  if (o->log_interval_ms <= 0) {
    o->log_interval_ms = DEFAULT_LOG_INTERVAL_MS;
  }
  switch (o->mode) {
    case PCP_PROGRESS_MODE_TTY:
      out_progress->is_tty = true;
      break;
    case PCP_PROGRESS_MODE_LOG:
      out_progress->is_tty = false;
      break;
    default:
      out_progress->is_tty = isatty(fileno(o->out)) == 1;
      break;
  }
  out_progress->start_ns = pcp_clock_now_ns(o->clock);
  out_progress->last_report_ns = -1;
}

static double elapsed_seconds(const pcp_progress_t* progress, int64_t now_ns) {
  return (double)(now_ns - progress->start_ns) / 1e9;
}

// Average rate since the start: steadier than an instantaneous rate for
// work that arrives in bursts (compile phases, checkpoint writes).
static double rate_of(const pcp_progress_t* progress, int64_t now_ns) {
  double seconds = elapsed_seconds(progress, now_ns);
  return seconds > 0 ? (double)progress->done / seconds : 0;
}

// Returns seconds left, or -1 when unknown.
static double eta_of(const pcp_progress_t* progress, int64_t now_ns) {
  double rate = rate_of(progress, now_ns);
  if (progress->options.total <= 0 || rate <= 0) {
    return -1;
  }
  double left = (double)(progress->options.total - progress->done);
  return left > 0 ? left / rate : 0;
}

static void format_duration(double seconds, char* buffer, size_t capacity) {
  long long s = (long long)llround(seconds);
  if (s >= 3600) {
    snprintf(buffer, capacity, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    snprintf(buffer, capacity, "%lldm%02llds", s / 60, s % 60);
  } else {
    snprintf(buffer, capacity, "%llds", s);
  }
}

static void format_at(const pcp_progress_t* progress, int64_t now_ns,
                      char* buffer, size_t capacity) {
  const pcp_progress_options_t* o = &progress->options;
  size_t at = 0;
  int n;
#define APPEND(...)                                                            \
  do {                                                                         \
    n = snprintf(buffer + at, at < capacity ? capacity - at : 0, __VA_ARGS__); \
    if (n > 0) {                                                               \
      at += (size_t)n;                                                         \
    }                                                                          \
  } while (0)
  APPEND("%s", o->task);
  if (o->total > 0) {
    APPEND(" %.1f%% %lld/%lld %s",
           100.0 * (double)progress->done / (double)o->total,
           (long long)progress->done, (long long)o->total, o->units);
  } else {
    APPEND(" %lld %s", (long long)progress->done, o->units);
  }
  double rate = rate_of(progress, now_ns);
  if (rate > 0) {
    APPEND(" %.1f %s/s", rate, o->units);
  }
  double eta = eta_of(progress, now_ns);
  if (eta >= 0 && !progress->finished) {
    char text[32];
    format_duration(eta, text, sizeof(text));
    APPEND(" ETA %s", text);
  }
  if (progress->finished) {
    char text[32];
    format_duration(elapsed_seconds(progress, now_ns), text, sizeof(text));
    APPEND(" done in %s", text);
  }
#undef APPEND
}

void pcp_progress_format(const pcp_progress_t* progress, char* buffer,
                         size_t capacity) {
  format_at(progress, pcp_clock_now_ns(progress->options.clock), buffer,
            capacity);
}

static void draw_tty(pcp_progress_t* progress, int64_t now_ns) {
  char line[512];
  format_at(progress, now_ns, line, sizeof(line));
  size_t length = strlen(line);
  // Pad with spaces over a longer previous line rather than sending an
  // ANSI erase: works on every terminal, including dumb ones.
  int pad = progress->last_line_length > length
                ? (int)(progress->last_line_length - length)
                : 0;
  fprintf(progress->options.out, "\r%s%*s%s", line, pad, "",
          progress->finished ? "\n" : "");
  fflush(progress->options.out);
  progress->last_line_length = length;
}

// Appends ` key=value`, quoting values with blanks, quotes or '='.
static size_t append_kv(char* line, size_t at, size_t capacity, const char* key,
                        const char* value) {
  if (!value || at >= capacity) {
    return at;
  }
  bool quote = value[0] == 0 || strpbrk(value, " \"=\t\n") != NULL;
  int n = snprintf(line + at, capacity - at, " %s=%s", key, quote ? "\"" : "");
  if (n > 0) {
    at += (size_t)n;
  }
  for (const char* p = value; *p && at + 3 < capacity; ++p) {
    if (*p == '"' || *p == '\\') {
      line[at++] = '\\';
    }
    char c = *p;
    if (c == '\n') {
      c = ' ';
    }
    line[at++] = c;
  }
  if (quote && at + 1 < capacity) {
    line[at++] = '"';
  }
  if (at >= capacity) {
    at = capacity - 1;
  }
  line[at] = 0;
  return at;
}

static void write_log_line(pcp_progress_t* progress, int64_t now_ns) {
  const pcp_progress_options_t* o = &progress->options;
  char line[1024];
  int64_t wall_ns = pcp_clock_wall_ns(o->clock);
  time_t seconds = (time_t)(wall_ns / 1000000000LL);
  struct tm tm;
  gmtime_r(&seconds, &tm);
  int n = snprintf(line, sizeof(line),
                   "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=info",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, (int)((wall_ns / 1000000LL) % 1000));
  size_t at = n > 0 ? (size_t)n : 0;
  const size_t cap = sizeof(line) - 1;
  if (o->log_context) {
    at = append_kv(line, at, cap, "role", o->log_context->role);
    at = append_kv(line, at, cap, "node", o->log_context->node_id);
    at = append_kv(line, at, cap, "conn", o->log_context->connection_id);
    at = append_kv(line, at, cap, "job", o->log_context->job_id);
  }
  at =
      append_kv(line, at, cap, "msg", progress->finished ? "done" : "progress");
  at = append_kv(line, at, cap, "task", o->task);
  char number[64];
  snprintf(number, sizeof(number), "%lld", (long long)progress->done);
  at = append_kv(line, at, cap, "done", number);
  if (o->total > 0) {
    snprintf(number, sizeof(number), "%lld", (long long)o->total);
    at = append_kv(line, at, cap, "total", number);
    snprintf(number, sizeof(number), "%.1f",
             100.0 * (double)progress->done / (double)o->total);
    at = append_kv(line, at, cap, "pct", number);
  }
  at = append_kv(line, at, cap, "units", o->units);
  snprintf(number, sizeof(number), "%.3g", rate_of(progress, now_ns));
  at = append_kv(line, at, cap, "rate", number);
  if (progress->finished) {
    snprintf(number, sizeof(number), "%.3f", elapsed_seconds(progress, now_ns));
    at = append_kv(line, at, cap, "elapsed_s", number);
  } else {
    double eta = eta_of(progress, now_ns);
    if (eta >= 0) {
      snprintf(number, sizeof(number), "%.0f", eta);
      at = append_kv(line, at, cap, "eta_s", number);
    }
  }
  line[at++] = '\n';
  fwrite(line, 1, at, o->out);
  fflush(o->out);
}

static void report(pcp_progress_t* progress, bool force) {
  int64_t now_ns = pcp_clock_now_ns(progress->options.clock);
  int64_t interval_ns = progress->is_tty
                            ? TTY_REDRAW_INTERVAL_NS
                            : progress->options.log_interval_ms * 1000000LL;
  if (!force && progress->last_report_ns >= 0 &&
      now_ns - progress->last_report_ns < interval_ns) {
    return;
  }
  progress->last_report_ns = now_ns;
  if (progress->is_tty) {
    draw_tty(progress, now_ns);
  } else {
    write_log_line(progress, now_ns);
  }
}

void pcp_progress_update(pcp_progress_t* progress, int64_t done) {
  if (progress->finished) {
    return;
  }
  progress->done = done;
  report(progress, false);
}

void pcp_progress_advance(pcp_progress_t* progress, int64_t delta) {
  pcp_progress_update(progress, progress->done + delta);
}

void pcp_progress_finish(pcp_progress_t* progress) {
  if (progress->finished) {
    return;
  }
  progress->finished = true;
  report(progress, true);
}
