// SPDX-License-Identifier: Apache-2.0
//
// bench/tokenizer: encode throughput (MB/s, one thread) of PCP's tokenizer
// against the `tokenizers` package on the same tokenizer.json and corpus in
// the same run. The baseline runs in the project's venv python
// (bench/tokenizer_baseline.py, TOKENIZERS_PARALLELISM=false,
// RAYON_NUM_THREADS=1), which also writes the corpus and the ids it made.
// It times every encode mode of the package (encode and encode_batch_fast of
// the whole corpus; encode per line, encode_batch and encode_batch_fast of
// the lines) and the fastest one is the baseline. Every id is compared: ours
// of the whole corpus against encode's, ours line by line against
// encode_batch's (per-line counts included). Timed runs repeat for about two
// seconds after a warm-up run, so both word caches are warm.
//
// Fails (exit 1) on any id that differs or when our slower mode is slower
// than their fastest (goal: ratio >= 1). Prints `tokenizer ratio=<ours /
// theirs>` last.

#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOAL_RATIO 1.0
// Rounds of (their modes, then ours), and the time per mode per round.
#define ROUNDS 3
#define ROUND_NS 1000000000ll

#ifndef PCP_SOURCE_DIR
#define PCP_SOURCE_DIR "."
#endif

static bool read_value(const char* output, const char* key, char* out,
                       size_t capacity) {
  size_t n = strlen(key);
  for (const char* p = output; p && *p;) {
    if (strncmp(p, key, n) == 0 && p[n] == '=') {
      const char* v = p + n + 1;
      size_t length = strcspn(v, "\n");
      if (length >= capacity)
        return false;
      memcpy(out, v, length);
      out[length] = '\0';
      return true;
    }
    p = strchr(p, '\n');
    if (p)
      ++p;
  }
  return false;
}

// The little-endian uint32 file |dir|/|name| (caller frees *out_values).
static bool read_u32_file(const char* dir, const char* name,
                          uint32_t** out_values, size_t* out_count) {
  char path[4200];
  int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= sizeof(path))
    return false;
  void* data = NULL;
  size_t size = 0;
  pcp_status_t status = pcp_file_read_all(path, (size_t)1 << 30, &data, &size);
  if (status || size % sizeof(uint32_t)) {
    pcp_status_ignore(status);
    free(data);
    fprintf(stderr, "tokenizer: cannot read the baseline's ids %s\n", path);
    return false;
  }
  *out_values = data;
  *out_count = size / sizeof(uint32_t);
  return true;
}

// First index where |ours| and |theirs| differ, or -1 when they are equal
// (a length difference counts at the shorter length).
static long first_difference(const uint32_t* ours, size_t ours_count,
                             const uint32_t* theirs, size_t theirs_count) {
  size_t n = ours_count < theirs_count ? ours_count : theirs_count;
  for (size_t i = 0; i < n; ++i) {
    if (ours[i] != theirs[i])
      return (long)i;
  }
  return ours_count == theirs_count ? -1 : (long)n;
}

static void print_around(const char* label, const uint32_t* ids, size_t count,
                         long at) {
  fprintf(stderr, "  %s (%zu ids) from %ld:", label, count, at);
  for (long i = at; i < at + 8 && i < (long)count; ++i) {
    fprintf(stderr, " %u", ids[i]);
  }
  fprintf(stderr, "\n");
}

// Runs |command| and reads its whole output into |output|. False (with a
// message) when it cannot start or fails.
static bool run_baseline(const char* command, char* output, size_t capacity) {
  FILE* pipe = popen(command, "r");
  if (!pipe) {
    fprintf(stderr, "tokenizer: cannot run the baseline\n");
    return false;
  }
  size_t used = fread(output, 1, capacity - 1, pipe);
  output[used] = '\0';
  if (pclose(pipe) != 0) {
    fprintf(stderr, "tokenizer: baseline failed:\n%s\n", output);
    return false;
  }
  return true;
}

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

static double median_of(const double* values, int count) {
  double sorted[16];
  memcpy(sorted, values, (size_t)count * sizeof(double));
  qsort(sorted, (size_t)count, sizeof(double), compare_double);
  return sorted[count / 2];
}

// One round of our three modes on |text| (MB/s each): the whole corpus with
// the warm encoder |e|, line by line with |e|, and the whole corpus with a
// fresh encoder (empty word cache) per run.
static void time_ours(pcp_clock_t clock, pcp_tokenizer_t* t,
                      pcp_tokenizer_encoder_t* e, pcp_string_view_t text,
                      pcp_tokenizer_id_list_t* ids, double* out_whole,
                      double* out_lines, double* out_cold) {
  size_t size = text.size;
  int runs = 0;
  int64_t start = pcp_clock_now_ns(clock), elapsed = 0;
  do {
    ids->count = 0;
    PCP_CHECK_OK(pcp_tokenizer_encoder_encode(e, text, ids));
    ++runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < ROUND_NS || runs < 2);
  *out_whole = (double)size * runs / ((double)elapsed / 1e9) / 1e6;

  // Per line, as requests arrive (same encoder, warm cache).
  runs = 0;
  start = pcp_clock_now_ns(clock);
  do {
    size_t offset = 0;
    while (offset <= size) {
      const char* nl = memchr(text.data + offset, '\n', size - offset);
      size_t end = nl ? (size_t)(nl - text.data) : size;
      ids->count = 0;
      PCP_CHECK_OK(pcp_tokenizer_encoder_encode(
          e, pcp_make_string_view(text.data + offset, end - offset), ids));
      offset = end + 1;
    }
    ++runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < ROUND_NS || runs < 2);
  *out_lines = (double)size * runs / ((double)elapsed / 1e9) / 1e6;

  // Cold: a fresh encoder (empty word cache) per run.
  runs = 0;
  start = pcp_clock_now_ns(clock);
  do {
    pcp_tokenizer_encoder_t* cold = NULL;
    PCP_CHECK_OK(
        pcp_tokenizer_encoder_create(t, pcp_allocator_system(), &cold));
    ids->count = 0;
    PCP_CHECK_OK(pcp_tokenizer_encoder_encode(cold, text, ids));
    pcp_tokenizer_encoder_release(cold);
    ++runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < ROUND_NS / 2 || runs < 2);
  *out_cold = (double)size * runs / ((double)elapsed / 1e9) / 1e6;
}

int main(int argc, char** argv) {
  // The corpus is rewritten each run; nothing else is kept there.
  const char* out_dir = argc > 1 ? argv[1] : "/tmp/pcp-bench-tokenizer";
  char command[4096], timing_command[4200];
  snprintf(command, sizeof(command),
           "'%s/bin/python' '%s/bench/tokenizer_baseline.py' --out-dir '%s' "
           "--seconds %.1f",
           pcp_venv_directory(), PCP_SOURCE_DIR, out_dir,
           2.0 * (double)ROUND_NS / 1e9);
  snprintf(timing_command, sizeof(timing_command), "%s --timing-only", command);
  static char output[1 << 16];
  if (!run_baseline(command, output, sizeof(output)))
    return 1;
  char tokenizer_json[2048], corpus[2048], name[128], value[64];
  if (!read_value(output, "tokenizer_json", tokenizer_json,
                  sizeof(tokenizer_json)) ||
      !read_value(output, "corpus", corpus, sizeof(corpus)) ||
      !read_value(output, "tokenizer_name", name, sizeof(name)) ||
      !read_value(output, "baseline_mb_s", value, sizeof(value))) {
    fprintf(stderr, "tokenizer: unexpected baseline output:\n%s\n", output);
    return 1;
  }
  long expected_ids =
      read_value(output, "ids", value, sizeof(value)) ? atol(value) : -1;

  pcp_clock_t clock = pcp_clock_system();
  int64_t t0 = pcp_clock_now_ns(clock);
  pcp_tokenizer_t* t = NULL;
  PCP_CHECK_OK(pcp_tokenizer_create_from_file(tokenizer_json, NULL,
                                              pcp_allocator_system(), &t));
  double load_ms = (double)(pcp_clock_now_ns(clock) - t0) / 1e6;
  void* data = NULL;
  size_t size = 0;
  PCP_CHECK_OK(pcp_file_read_all(corpus, (size_t)1 << 30, &data, &size));
  pcp_tokenizer_encoder_t* e = NULL;
  PCP_CHECK_OK(pcp_tokenizer_encoder_create(t, pcp_allocator_system(), &e));
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  pcp_string_view_t text = pcp_make_string_view(data, size);
  PCP_CHECK_OK(pcp_tokenizer_encoder_encode(e, text, &ids));  // warm-up
  // Every id of the whole corpus against `tokenizers`' encode.
  uint32_t* theirs = NULL;
  size_t theirs_count = 0;
  if (!read_u32_file(out_dir, "ids_whole.u32", &theirs, &theirs_count)) {
    return 1;
  }
  long at = first_difference((const uint32_t*)ids.values, ids.count, theirs,
                             theirs_count);
  if (at >= 0 || (long)ids.count != expected_ids) {
    fprintf(stderr, "tokenizer: whole corpus: ids differ at %ld\n", at);
    print_around("ours", (const uint32_t*)ids.values, ids.count,
                 at < 0 ? 0 : at);
    print_around("tokenizers", theirs, theirs_count, at < 0 ? 0 : at);
    return 1;
  }
  free(theirs);
  // And line by line against encode_batch (counts per line too).
  uint32_t* line_counts = NULL;
  size_t line_count = 0;
  if (!read_u32_file(out_dir, "ids_lines.u32", &theirs, &theirs_count) ||
      !read_u32_file(out_dir, "ids_line_counts.u32", &line_counts,
                     &line_count)) {
    return 1;
  }
  {
    size_t offset = 0, line = 0, position = 0;
    while (offset <= size) {
      const char* nl = memchr((const char*)data + offset, '\n', size - offset);
      size_t end = nl ? (size_t)(nl - (const char*)data) : size;
      ids.count = 0;
      PCP_CHECK_OK(pcp_tokenizer_encoder_encode(
          e, pcp_make_string_view((const char*)data + offset, end - offset),
          &ids));
      if (line >= line_count || ids.count != line_counts[line] ||
          position + ids.count > theirs_count ||
          first_difference((const uint32_t*)ids.values, ids.count,
                           theirs + position, ids.count) >= 0) {
        long n = line < line_count ? (long)line_counts[line] : 0;
        fprintf(stderr,
                "tokenizer: line %zu: ids differ (ours %zu, theirs "
                "%ld)\n",
                line + 1, ids.count, n);
        print_around("ours", (const uint32_t*)ids.values, ids.count, 0);
        if (position + (size_t)n <= theirs_count) {
          print_around("tokenizers", theirs + position, (size_t)n, 0);
        }
        return 1;
      }
      position += ids.count;
      ++line;
      offset = end + 1;
    }
    if (line != line_count || position != theirs_count) {
      fprintf(stderr,
              "tokenizer: %zu lines and %zu ids, the baseline made "
              "%zu and %zu\n",
              line, position, line_count, theirs_count);
      return 1;
    }
  }
  free(theirs);
  free(line_counts);

  // Interleaved rounds: their modes (a fresh process), then ours, so a
  // burst of load on the shared machine hits both sides alike; medians over
  // the rounds.
  static const char* const kModes[] = {"whole_encode", "whole_batch_fast",
                                       "lines_encode", "lines_batch",
                                       "lines_batch_fast"};
  enum { kModeCount = PCP_ARRAYSIZE(kModes) };
  double theirs_mb_s[kModeCount][ROUNDS];
  double ours_whole[ROUNDS], ours_lines[ROUNDS], ours_cold[ROUNDS];
  for (int round = 0; round < ROUNDS; ++round) {
    if (round > 0 && !run_baseline(timing_command, output, sizeof(output))) {
      return 1;
    }
    for (int m = 0; m < kModeCount; ++m) {
      char key[64];
      snprintf(key, sizeof(key), "mode_%s_mb_s", kModes[m]);
      if (!read_value(output, key, value, sizeof(value))) {
        fprintf(stderr, "tokenizer: no %s in the baseline output:\n%s\n", key,
                output);
        return 1;
      }
      theirs_mb_s[m][round] = atof(value);
    }
    time_ours(clock, t, e, text, &ids, &ours_whole[round], &ours_lines[round],
              &ours_cold[round]);
  }
  double ours_mb_s = median_of(ours_whole, ROUNDS);
  double lines_mb_s = median_of(ours_lines, ROUNDS);
  double cold_mb_s = median_of(ours_cold, ROUNDS);
  int best = 0;
  double their_median[kModeCount];
  for (int m = 0; m < kModeCount; ++m) {
    their_median[m] = median_of(theirs_mb_s[m], ROUNDS);
    if (their_median[m] > their_median[best])
      best = m;
  }
  double baseline_mb_s = their_median[best];
  ids.count = 0;
  PCP_CHECK_OK(pcp_tokenizer_encoder_encode(e, text, &ids));

  printf(
      "tokenizer: %s, corpus %.2f MB, %zu ids, load %.0f ms; every id "
      "equal to tokenizers' (whole corpus and line by line)\n",
      name, (double)size / 1e6, ids.count, load_ms);
  char version[64] = "?";
  (void)read_value(output, "tokenizers_version", version, sizeof(version));
  printf(
      "tokenizer ours (median of %d rounds): whole corpus %.2f MB/s, per "
      "line %.2f MB/s, whole with a cold word cache %.2f MB/s\n",
      ROUNDS, ours_mb_s, lines_mb_s, cold_mb_s);
  printf("tokenizer tokenizers %s, one thread (median of %d rounds):", version,
         ROUNDS);
  for (int m = 0; m < kModeCount; ++m) {
    printf(" %s %.3f MB/s%s", kModes[m], their_median[m],
           m + 1 < kModeCount ? "," : "\n");
  }
  // Conservative: our slower mode against their fastest one.
  double ours = ours_mb_s < lines_mb_s ? ours_mb_s : lines_mb_s;
  double ratio = ours / baseline_mb_s;
  printf("tokenizer baseline: %s at %.3f MB/s\n", kModes[best], baseline_mb_s);
  if (ratio < GOAL_RATIO) {
    fprintf(stderr, "tokenizer: goal missed: ratio %.2f < %.2f\n", ratio,
            GOAL_RATIO);
  }
  printf("tokenizer ratio=%.2f\n", ratio);
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_encoder_release(e);
  pcp_tokenizer_release(t);
  free(data);
  return ratio >= GOAL_RATIO ? 0 : 1;
}
