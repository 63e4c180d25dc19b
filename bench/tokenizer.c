// SPDX-License-Identifier: Apache-2.0
//
// bench/tokenizer: encode throughput (MB/s, one thread) of PCP's tokenizer
// against the `tokenizers` package on the same tokenizer.json and corpus in
// the same run. The baseline runs in the project's venv python
// (bench/tokenizer_baseline.py, TOKENIZERS_PARALLELISM=false,
// RAYON_NUM_THREADS=1), which also writes the corpus. Both sides encode the
// whole corpus in one call, repeated for about two seconds after a warm-up
// run, so both word caches are warm. Prints `tokenizer ratio=<ours/theirs>`
// last.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

#define TOKENIZERS_VERSION_NOTE "(PyPI)"

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
      if (length >= capacity) return false;
      memcpy(out, v, length);
      out[length] = '\0';
      return true;
    }
    p = strchr(p, '\n');
    if (p) ++p;
  }
  return false;
}

int main(int argc, char** argv) {
  // The corpus is rewritten each run; nothing else is kept there.
  const char* out_dir = argc > 1 ? argv[1] : "/tmp/pcp-bench-tokenizer";
  char command[4096];
  snprintf(command, sizeof(command),
           "'%s/bin/python' '%s/bench/tokenizer_baseline.py' --out-dir '%s'",
           pcp_venv_directory(), PCP_SOURCE_DIR, out_dir);
  FILE* pipe = popen(command, "r");
  if (!pipe) {
    fprintf(stderr, "tokenizer: cannot run the baseline\n");
    return 1;
  }
  static char output[1 << 16];
  size_t used = fread(output, 1, sizeof(output) - 1, pipe);
  output[used] = '\0';
  if (pclose(pipe) != 0) {
    fprintf(stderr, "tokenizer: baseline failed:\n%s\n", output);
    return 1;
  }
  char tokenizer_json[2048], corpus[2048], name[128], value[64];
  if (!read_value(output, "tokenizer_json", tokenizer_json,
                  sizeof(tokenizer_json)) ||
      !read_value(output, "corpus", corpus, sizeof(corpus)) ||
      !read_value(output, "tokenizer_name", name, sizeof(name)) ||
      !read_value(output, "baseline_mb_s", value, sizeof(value))) {
    fprintf(stderr, "tokenizer: unexpected baseline output:\n%s\n", output);
    return 1;
  }
  double baseline_mb_s = atof(value);
  long expected_ids = read_value(output, "ids", value, sizeof(value))
                          ? atol(value)
                          : -1;

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
  if ((long)ids.count != expected_ids) {
    fprintf(stderr, "tokenizer: %zu ids, the baseline made %ld\n", ids.count,
            expected_ids);
    return 1;
  }
  int runs = 0;
  int64_t start = pcp_clock_now_ns(clock), elapsed = 0;
  do {
    ids.count = 0;
    PCP_CHECK_OK(pcp_tokenizer_encoder_encode(e, text, &ids));
    ++runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < 2000000000 || runs < 3);
  double ours_mb_s = (double)size * runs / ((double)elapsed / 1e9) / 1e6;

  // Per line, as requests arrive (same encoder, warm cache).
  int line_runs = 0;
  start = pcp_clock_now_ns(clock);
  do {
    size_t offset = 0;
    while (offset <= size) {
      const char* nl = memchr(text.data + offset, '\n', size - offset);
      size_t end = nl ? (size_t)(nl - text.data) : size;
      ids.count = 0;
      PCP_CHECK_OK(pcp_tokenizer_encoder_encode(
          e, pcp_make_string_view(text.data + offset, end - offset), &ids));
      offset = end + 1;
    }
    ++line_runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < 1000000000 || line_runs < 3);
  double lines_mb_s = (double)size * line_runs / ((double)elapsed / 1e9) / 1e6;

  // Cold: a fresh encoder (empty word cache) per run.
  int cold_runs = 0;
  start = pcp_clock_now_ns(clock);
  do {
    pcp_tokenizer_encoder_t* cold = NULL;
    PCP_CHECK_OK(pcp_tokenizer_encoder_create(t, pcp_allocator_system(),
                                              &cold));
    ids.count = 0;
    PCP_CHECK_OK(pcp_tokenizer_encoder_encode(cold, text, &ids));
    pcp_tokenizer_encoder_release(cold);
    ++cold_runs;
    elapsed = pcp_clock_now_ns(clock) - start;
  } while (elapsed < 1000000000 || cold_runs < 3);
  double cold_mb_s = (double)size * cold_runs / ((double)elapsed / 1e9) / 1e6;

  printf("tokenizer: %s, corpus %.2f MB, %zu ids, load %.0f ms\n", name,
         (double)size / 1e6, ids.count, load_ms);
  char whole[64] = "?", lines[64] = "?";
  (void)read_value(output, "baseline_whole_mb_s", whole, sizeof(whole));
  (void)read_value(output, "baseline_lines_mb_s", lines, sizeof(lines));
  printf("tokenizer ours: whole corpus %.2f MB/s, per line %.2f MB/s, "
         "whole with a cold word cache %.2f MB/s\n",
         ours_mb_s, lines_mb_s, cold_mb_s);
  printf("tokenizer tokenizers %s: whole corpus %s MB/s, per line %s MB/s "
         "(one thread each)\n",
         TOKENIZERS_VERSION_NOTE, whole, lines);
  // Conservative: our slower mode against their faster one.
  double ours = ours_mb_s < lines_mb_s ? ours_mb_s : lines_mb_s;
  printf("tokenizer ratio=%.2f\n", ours / baseline_mb_s);
  pcp_tokenizer_id_list_deinitialize(&ids);
  pcp_tokenizer_encoder_release(e);
  pcp_tokenizer_release(t);
  free(data);
  return 0;
}
