// SPDX-License-Identifier: Apache-2.0
//
// The prompts JSONL of an RL experiment (experiment.h). Each line is checked
// before jansson sees it (length, UTF-8, nesting), so an error names the
// line and a hostile file cannot make the parser recurse deeply.

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

static pcp_status_t oom(void) {
  return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                         "rl prompts: out of memory");
}

// Length of the well-formed UTF-8 prefix of |data| (RFC 3629: no overlongs,
// no surrogates, nothing above U+10FFFF).
static size_t utf8_valid_prefix(const unsigned char* data, size_t length) {
  size_t i = 0;
  while (i < length) {
    unsigned char c = data[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0)
        lo = 0xa0;
      if (c == 0xed)
        hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0)
        lo = 0x90;
      if (c == 0xf4)
        hi = 0x8f;
    } else {
      return i;
    }
    if (length - i <= n)
      return i;
    if (data[i + 1] < lo || data[i + 1] > hi)
      return i;
    for (size_t k = 2; k <= n; ++k) {
      if (data[i + k] < 0x80 || data[i + k] > 0xbf)
        return i;
    }
    i += n + 1;
  }
  return i;
}

// Deepest nesting of [ and { outside strings.
static size_t nesting_depth(const char* data, size_t length) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < length; ++i) {
    char c = data[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest)
        deepest = depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

static bool blank_line(const char* data, size_t length) {
  for (size_t i = 0; i < length; ++i) {
    char c = data[i];
    if (c != ' ' && c != '\t' && c != '\r')
      return false;
  }
  return true;
}

static pcp_status_t line_error(const char* origin, size_t line, const char* key,
                               const char* what) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s:%zu: %s%s%s", origin,
                         line, key ? key : "", key ? ": " : "", what);
}

static pcp_status_t text_dup(pcp_allocator_t allocator, const char* text,
                             size_t length, char** out) {
  char* copy = NULL;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, length + 1, (void**)&copy);
  if (status) {
    pcp_status_ignore(status);
    return oom();
  }
  memcpy(copy, text, length);
  copy[length] = '\0';
  *out = copy;
  return pcp_ok_status();
}

static void prompt_release(pcp_allocator_t allocator,
                           pcp_workloads_rl_prompt_t* prompt) {
  pcp_allocator_free(allocator, prompt->prompt);
  pcp_allocator_free(allocator, prompt->answer);
  json_decref(prompt->metadata);
  memset(prompt, 0, sizeof(*prompt));
}

// Fills |out| from one parsed line object.
static pcp_status_t prompt_take(const json_t* object, const char* origin,
                                size_t line, pcp_allocator_t allocator,
                                pcp_workloads_rl_prompt_t* out) {
  static const char* const kKeys[] = {"prompt", "answer", "metadata", NULL};
  const char* key;
  json_t* value;
  json_object_foreach((json_t*)object, key, value) {
    (void)value;
    bool known = false;
    for (const char* const* k = kKeys; *k && !known; ++k)
      known = strcmp(*k, key) == 0;
    if (!known) {
      char shown[64];
      snprintf(shown, sizeof(shown), "%s", key);
      return line_error(origin, line, shown,
                        "unknown key (allowed: prompt answer metadata)");
    }
  }
  json_t* prompt = json_object_get(object, "prompt");
  if (!prompt)
    return line_error(origin, line, "prompt", "required");
  if (!json_is_string(prompt))
    return line_error(origin, line, "prompt", "must be a string");
  size_t length = json_string_length(prompt);
  if (length == 0)
    return line_error(origin, line, "prompt", "must not be empty");
  if (strlen(json_string_value(prompt)) != length)
    return line_error(origin, line, "prompt", "must not contain NUL");
  json_t* answer = json_object_get(object, "answer");
  if (answer && !json_is_null(answer)) {
    if (json_is_string(answer)) {
      if (strlen(json_string_value(answer)) != json_string_length(answer))
        return line_error(origin, line, "answer", "must not contain NUL");
    } else if (!json_is_number(answer)) {
      return line_error(origin, line, "answer", "must be a string or a number");
    }
  }
  json_t* metadata = json_object_get(object, "metadata");
  if (metadata && !json_is_null(metadata) && !json_is_object(metadata))
    return line_error(origin, line, "metadata", "must be an object");

  PCP_RETURN_IF_ERROR_BARE(
      text_dup(allocator, json_string_value(prompt), length, &out->prompt));
  out->prompt_length = length;
  if (answer && json_is_string(answer)) {
    out->answer_length = json_string_length(answer);
    PCP_RETURN_IF_ERROR_BARE(text_dup(allocator, json_string_value(answer),
                                      out->answer_length, &out->answer));
  } else if (answer && json_is_number(answer)) {
    // Integers exact, reals in the fewest digits that read back the same
    // double (0.1, not jansson's 0.10000000000000001): the text the numeric
    // reward parses.
    char text[64];
    if (json_is_integer(answer)) {
      snprintf(text, sizeof(text), "%lld",
               (long long)json_integer_value(answer));
    } else {
      double v = json_real_value(answer);
      for (int digits = 1; digits <= 17; ++digits) {
        snprintf(text, sizeof(text), "%.*g", digits, v);
        if (strtod(text, NULL) == v)
          break;
      }
    }
    size_t n = strlen(text);
    out->answer_length = n;
    PCP_RETURN_IF_ERROR_BARE(text_dup(allocator, text, n, &out->answer));
  }
  if (metadata && json_is_object(metadata))
    out->metadata = json_incref(metadata);
  return pcp_ok_status();
}

// Grows |prompts->items| to hold one more.
static pcp_status_t items_reserve(pcp_workloads_rl_prompts_t* prompts,
                                  size_t* capacity) {
  if (prompts->count < *capacity)
    return pcp_ok_status();
  size_t grown = *capacity ? *capacity * 2 : 64;
  void* items = prompts->items;
  pcp_status_t status = pcp_allocator_realloc(
      prompts->allocator, grown * sizeof(*prompts->items), &items);
  if (status) {
    pcp_status_ignore(status);
    return oom();
  }
  prompts->items = items;
  *capacity = grown;
  return pcp_ok_status();
}

static pcp_status_t prompts_fill(pcp_string_view_t text, const char* origin,
                                 pcp_workloads_rl_prompts_t* out) {
  const char* data = text.data;
  size_t length = text.size;
  if (length > PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: %zu bytes; at most %zu", origin, length,
                           PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES);
  }
  // A UTF-8 byte order mark some editors write is not part of line 1.
  if (length >= 3 && memcmp(data, "\xef\xbb\xbf", 3) == 0) {
    data += 3;
    length -= 3;
  }
  size_t capacity = 0;
  size_t line = 0;
  size_t offset = 0;
  while (offset < length) {
    ++line;
    const char* start = data + offset;
    const char* newline = memchr(start, '\n', length - offset);
    size_t n = newline ? (size_t)(newline - start) : length - offset;
    offset += n + (newline ? 1 : 0);
    if (line > PCP_WORKLOADS_RL_PROMPTS_MAX_LINES) {
      char what[64];
      snprintf(what, sizeof(what), "more than %zu lines",
               PCP_WORKLOADS_RL_PROMPTS_MAX_LINES);
      return line_error(origin, line, NULL, what);
    }
    if (n > PCP_WORKLOADS_RL_PROMPTS_MAX_LINE_BYTES) {
      char what[96];
      snprintf(what, sizeof(what), "line of %zu bytes; at most %zu", n,
               PCP_WORKLOADS_RL_PROMPTS_MAX_LINE_BYTES);
      return line_error(origin, line, NULL, what);
    }
    if (n > 0 && start[n - 1] == '\r')
      --n;  // CRLF
    if (blank_line(start, n))
      continue;
    size_t valid = utf8_valid_prefix((const unsigned char*)start, n);
    if (valid != n) {
      char what[64];
      snprintf(what, sizeof(what), "invalid UTF-8 at byte %zu of the line",
               valid + 1);
      return line_error(origin, line, NULL, what);
    }
    if (nesting_depth(start, n) > PCP_WORKLOADS_RL_PROMPTS_MAX_DEPTH) {
      char what[64];
      snprintf(what, sizeof(what), "nesting deeper than %d levels",
               PCP_WORKLOADS_RL_PROMPTS_MAX_DEPTH);
      return line_error(origin, line, NULL, what);
    }
    json_error_t error;
    json_t* object = json_loadb(start, n, JSON_REJECT_DUPLICATES, &error);
    if (!object) {
      char what[JSON_ERROR_TEXT_LENGTH + 32];
      snprintf(what, sizeof(what), "column %d: %s", error.column, error.text);
      return line_error(origin, line, NULL, what);
    }
    pcp_status_t status = pcp_ok_status();
    if (!json_is_object(object))
      status = line_error(origin, line, NULL, "must be a JSON object");
    if (!status)
      status = items_reserve(out, &capacity);
    if (!status) {
      pcp_workloads_rl_prompt_t* item = &out->items[out->count];
      memset(item, 0, sizeof(*item));
      status = prompt_take(object, origin, line, out->allocator, item);
      if (status)
        prompt_release(out->allocator, item);
      else
        ++out->count;
    }
    json_decref(object);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  if (out->count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: no prompt (every line is empty)", origin);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_rl_prompts_parse(
    pcp_string_view_t text, const char* origin, pcp_allocator_t allocator,
    pcp_workloads_rl_prompts_t* out_prompts) {
  memset(out_prompts, 0, sizeof(*out_prompts));
  out_prompts->allocator = allocator;
  pcp_status_t status =
      prompts_fill(text, origin ? origin : "prompts", out_prompts);
  if (status)
    pcp_workloads_rl_prompts_deinitialize(out_prompts);
  return status;
}

pcp_status_t pcp_workloads_rl_prompts_load(
    const char* path, pcp_allocator_t allocator,
    pcp_workloads_rl_prompts_t* out_prompts) {
  memset(out_prompts, 0, sizeof(*out_prompts));
  out_prompts->allocator = allocator;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: cannot open (%s)",
                           path, strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES) {
    close(fd);
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "%s: %lld bytes; at most %zu", path,
        (long long)st.st_size, PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES);
  }
  size_t size = (size_t)st.st_size;
  char* buffer = NULL;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, size + 1, (void**)&buffer);
  if (status) {
    pcp_status_ignore(status);
    close(fd);
    return oom();
  }
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, buffer + got, size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  if (got != size) {
    pcp_allocator_free(allocator, buffer);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: read %zu of %zu bytes", path, got, size);
  }
  status = pcp_workloads_rl_prompts_parse(pcp_make_string_view(buffer, size),
                                          path, allocator, out_prompts);
  pcp_allocator_free(allocator, buffer);
  return status;
}

void pcp_workloads_rl_prompts_deinitialize(
    pcp_workloads_rl_prompts_t* prompts) {
  pcp_allocator_t allocator = prompts->allocator;
  for (size_t i = 0; i < prompts->count; ++i)
    prompt_release(allocator, &prompts->items[i]);
  pcp_allocator_free(allocator, prompts->items);
  memset(prompts, 0, sizeof(*prompts));
  prompts->allocator = allocator;
}

//===----------------------------------------------------------------------===//
// Selection
//===----------------------------------------------------------------------===//

// SplitMix64: the stream of one epoch's permutation.
static uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// An unbiased draw in [0, bound) (rejection of the short last interval).
static uint32_t draw_below(uint64_t* state, uint32_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t r;
  do {
    r = splitmix64(state);
  } while (r >= limit);
  return (uint32_t)(r % bound);
}

// Fisher-Yates permutation of 0..count-1 for (seed, epoch).
static void epoch_permutation(uint32_t* order, uint32_t count, uint64_t seed,
                              uint64_t epoch) {
  uint64_t state = seed;
  uint64_t mix = epoch;
  state ^= splitmix64(&mix);
  for (uint32_t i = 0; i < count; ++i) order[i] = i;
  for (uint32_t i = count - 1; i > 0; --i) {
    uint32_t j = draw_below(&state, i + 1);
    uint32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

pcp_status_t pcp_workloads_rl_prompts_select(size_t count, uint64_t seed,
                                             uint64_t iteration,
                                             size_t num_prompts,
                                             pcp_allocator_t allocator,
                                             uint32_t* out_indices) {
  if (count == 0 || count > UINT32_MAX || num_prompts == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rl prompts: select %zu of %zu prompts", num_prompts,
                           count);
  }
  if (iteration > (UINT64_MAX - num_prompts) / num_prompts) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rl prompts: iteration %llu overflows",
                           (unsigned long long)iteration);
  }
  uint32_t* order = NULL;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, count * sizeof(*order), (void**)&order);
  if (status) {
    pcp_status_ignore(status);
    return oom();
  }
  uint64_t first = iteration * num_prompts;
  uint64_t epoch = UINT64_MAX;
  for (size_t i = 0; i < num_prompts; ++i) {
    uint64_t position = first + i;
    uint64_t e = position / count;
    if (e != epoch) {
      epoch_permutation(order, (uint32_t)count, seed, e);
      epoch = e;
    }
    out_indices[i] = order[position % count];
  }
  pcp_allocator_free(allocator, order);
  return pcp_ok_status();
}
