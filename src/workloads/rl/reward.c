// SPDX-License-Identifier: Apache-2.0
//
// Built-in RL rewards (reward.h). A config becomes a tree of nodes, each
// validated and (for regex) compiled once at create; scoring walks the tree
// and touches nothing shared but the immutable nodes.

#include "workloads/rl/reward.h"

#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Longest key path kept for messages; deeper paths are cut (never reached:
// 4 sums x "terms[15].reward." fit).
#define KEY_PATH_CAPACITY 192

typedef enum node_kind_e {
  NODE_EXACT_MATCH,
  NODE_NUMERIC,
  NODE_REGEX,
  NODE_CONTAINS,
  NODE_NOT_CONTAINS,
  NODE_LENGTH,
  NODE_SUM,
} node_kind_t;

struct pcp_workloads_rl_reward_t {
  pcp_allocator_t allocator;
  node_kind_t kind;
  char key_path[KEY_PATH_CAPACITY];
  // exact_match, contains, not_contains.
  bool trim;
  bool case_insensitive;
  // contains / not_contains: the needle (lower-cased when case-insensitive).
  char* text;
  size_t text_length;
  // Knuth-Morris-Pratt failure table of |text| (text_length entries), so a
  // search is linear in the completion, folded or not, without scratch.
  uint32_t* failure;
  // numeric.
  double tolerance;
  double relative_tolerance;
  // regex.
  regex_t regex;
  bool regex_compiled;
  size_t max_input_bytes;
  // length: -1 where unset.
  int64_t min_tokens;
  int64_t max_tokens;
  int64_t min_chars;
  int64_t max_chars;
  // sum.
  size_t term_count;
  double weights[PCP_WORKLOADS_RL_REWARD_MAX_TERMS];
  pcp_workloads_rl_reward_t* terms[PCP_WORKLOADS_RL_REWARD_MAX_TERMS];
};

//===----------------------------------------------------------------------===//
// Config parsing
//===----------------------------------------------------------------------===//

typedef struct parse_state_t {
  pcp_allocator_t allocator;
  size_t node_count;
} parse_state_t;

static pcp_status_t bad(const char* path, const char* key, const char* what) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s%s%s: %s", path,
                         key ? "." : "", key ? key : "", what);
}

// Refuses keys outside |allowed| (NULL-terminated).
static pcp_status_t keys_check(const json_t* config, const char* path,
                               const char* const* allowed) {
  const char* key;
  json_t* value;
  json_object_foreach((json_t*)config, key, value) {
    (void)value;
    bool known = false;
    for (const char* const* a = allowed; *a; ++a) {
      if (strcmp(*a, key) == 0) {
        known = true;
        break;
      }
    }
    if (!known) {
      char what[160];
      snprintf(what, sizeof(what), "unknown key (allowed:");
      for (const char* const* a = allowed; *a; ++a) {
        size_t used = strlen(what);
        snprintf(what + used, sizeof(what) - used, " %s", *a);
      }
      size_t used = strlen(what);
      snprintf(what + used, sizeof(what) - used, ")");
      return bad(path, key, what);
    }
  }
  return NULL;
}

static pcp_status_t bool_get(const json_t* config, const char* path,
                             const char* key, bool default_value,
                             bool* out_value) {
  json_t* value = json_object_get(config, key);
  *out_value = default_value;
  if (!value)
    return NULL;
  if (!json_is_boolean(value))
    return bad(path, key, "must be true or false");
  *out_value = json_is_true(value);
  return NULL;
}

static pcp_status_t double_get(const json_t* config, const char* path,
                               const char* key, double default_value,
                               double min, double max, double* out_value) {
  json_t* value = json_object_get(config, key);
  *out_value = default_value;
  if (!value)
    return NULL;
  if (!json_is_number(value))
    return bad(path, key, "must be a number");
  double v = json_number_value(value);
  if (!isfinite(v) || v < min || v > max) {
    char what[96];
    snprintf(what, sizeof(what), "%g is out of range [%g, %g]", v, min, max);
    return bad(path, key, what);
  }
  *out_value = v;
  return NULL;
}

// Bounds of a length window: absent -> -1.
static pcp_status_t bound_get(const json_t* config, const char* path,
                              const char* key, int64_t* out_value) {
  json_t* value = json_object_get(config, key);
  *out_value = -1;
  if (!value)
    return NULL;
  // 2^40 is far above any completion (inputs are capped at 1 MiB) and keeps
  // the number exact in a double for the docs' table.
  if (!json_is_integer(value) || json_integer_value(value) < 0 ||
      json_integer_value(value) > (INT64_C(1) << 40)) {
    return bad(path, key, "must be an integer in [0, 1099511627776]");
  }
  *out_value = (int64_t)json_integer_value(value);
  return NULL;
}

// A required string of 1..|max_bytes| bytes without NUL.
static pcp_status_t text_get(const json_t* config, const char* path,
                             const char* key, size_t max_bytes,
                             const char** out_text, size_t* out_length) {
  json_t* value = json_object_get(config, key);
  if (!json_is_string(value)) {
    return bad(path, key, value ? "must be a string" : "is required");
  }
  size_t length = json_string_length(value);
  const char* text = json_string_value(value);
  if (length == 0)
    return bad(path, key, "must not be empty");
  if (length > max_bytes) {
    char what[80];
    snprintf(what, sizeof(what), "is %zu bytes, longer than %zu", length,
             max_bytes);
    return bad(path, key, what);
  }
  if (strlen(text) != length)
    return bad(path, key, "must not contain NUL");
  *out_text = text;
  *out_length = length;
  return NULL;
}

static void ascii_lower(char* data, size_t length) {
  for (size_t i = 0; i < length; ++i) {
    if (data[i] >= 'A' && data[i] <= 'Z')
      data[i] = (char)(data[i] - 'A' + 'a');
  }
}

static pcp_status_t node_parse(parse_state_t* state, const json_t* config,
                               const char* path, int depth,
                               pcp_workloads_rl_reward_t** out_node);

static pcp_status_t text_node_parse(const json_t* config,
                                    pcp_workloads_rl_reward_t* node) {
  static const char* const kAllowed[] = {"type", "text", "case_insensitive",
                                         NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(config, node->key_path, kAllowed));
  PCP_RETURN_IF_ERROR_BARE(bool_get(config, node->key_path, "case_insensitive",
                                    false, &node->case_insensitive));
  const char* text = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(text_get(config, node->key_path, "text",
                                    PCP_WORKLOADS_RL_REWARD_MAX_TEXT_BYTES,
                                    &text, &length));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(node->allocator, length + 1, (void**)&node->text));
  memcpy(node->text, text, length + 1);
  node->text_length = length;
  if (node->case_insensitive)
    ascii_lower(node->text, length);
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      node->allocator, length * sizeof(uint32_t), (void**)&node->failure));
  // failure[i]: length of the longest proper border of text[0..i].
  node->failure[0] = 0;
  uint32_t k = 0;
  for (size_t i = 1; i < length; ++i) {
    while (k > 0 && node->text[i] != node->text[k]) k = node->failure[k - 1];
    if (node->text[i] == node->text[k])
      ++k;
    node->failure[i] = k;
  }
  return NULL;
}

// POSIX ERE has no \d, \w-style escapes beyond GNU's (\w \W \s \S \b \B \<
// \> \` \'), and back-references make matching time unbounded on long
// completions; both are refused rather than silently meaning something else.
static pcp_status_t pattern_check(const char* path, const char* pattern,
                                  size_t length) {
  for (size_t i = 0; i + 1 < length; ++i) {
    if (pattern[i] != '\\')
      continue;
    char next = pattern[i + 1];
    if (next >= '1' && next <= '9') {
      return bad(path, "pattern",
                 "back-references are not supported (matching time would be "
                 "unbounded)");
    }
    if (next == 'd' || next == 'D') {
      return bad(path, "pattern",
                 "POSIX regular expressions have no \\d: use [0-9] or "
                 "[[:digit:]]");
    }
    ++i;  // skip the escaped character
  }
  return NULL;
}

// Size of the automaton glibc builds, estimated in pattern atoms: a bounded
// repetition is expanded into copies, so "((a{100}){100}){100}" is a million
// states (a quarter second and hundreds of MiB to compile) and one more
// level exhausts memory after seconds. Above this, a config is refused.
#define MAX_PATTERN_STATES 100000.0

static pcp_status_t pattern_size_check(const char* path, const char* p,
                                       size_t n) {
  double group[33] = {0};  // size of each open group, outermost first
  int depth = 0;
  double last = 0;  // size of the last atom or group (what a count repeats)
  bool after_repeat = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    bool repeat = c == '*' || c == '+' || c == '?' || c == '{';
    // POSIX leaves adjacent duplication symbols undefined, and glibc's
    // compile time grows exponentially in them ("e*+++++++" stalls it).
    if (repeat && after_repeat &&
        (c != '{' || (i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '9'))) {
      return bad(path, "pattern",
                 "adjacent repetition operators (such as *+ or {2}{3}) are "
                 "undefined in POSIX: use a group");
    }
    after_repeat = false;
    if (c == '(') {
      if (depth + 1 >= (int)PCP_ARRAYSIZE(group)) {
        return bad(path, "pattern", "groups nest deeper than 32");
      }
      group[++depth] = 0;
      last = 0;
      continue;
    }
    if (c == ')' && depth > 0) {
      last = group[depth--];
      group[depth] += last;
    } else if (c == '{') {
      size_t j = i + 1;
      double low = 0, high = -1;
      while (j < n && p[j] >= '0' && p[j] <= '9')
        low = low * 10 + (p[j++] - '0');
      bool comma = j < n && p[j] == ',';
      if (comma) {
        ++j;
        if (j < n && p[j] >= '0' && p[j] <= '9')
          high = 0;
        while (j < n && p[j] >= '0' && p[j] <= '9') {
          high = high * 10 + (p[j++] - '0');
        }
      }
      if (j < n && p[j] == '}' && j > i + 1) {
        // {m}: m copies; {m,n}: n; {m,}: m + 1 (the last one starred).
        double times = high >= 0 ? high : comma ? low + 1 : low;
        if (times < 1)
          times = 1;
        group[depth] += last * (times - 1);
        last *= times;
        i = j;
        after_repeat = true;
      } else {
        last = 1;  // a literal '{' (regcomp decides whether it is valid)
        group[depth] += 1;
      }
    } else if (c == '+') {
      group[depth] += last;  // "a+" is "aa*"
      last *= 2;
      after_repeat = true;
    } else if (c == '*' || c == '?') {
      after_repeat = true;  // no copies
    } else if (c == '|' || c == '^' || c == '$') {
      // No copies.
    } else {
      if (c == '\\' && i + 1 < n) {
        ++i;
      } else if (c == '[') {
        // A bracket expression is one atom: skip to its ']' ("[]a]",
        // "[^]a]" and "[[:digit:]]" included).
        size_t j = i + 1;
        if (j < n && p[j] == '^')
          ++j;
        if (j < n && p[j] == ']')
          ++j;
        while (j < n && p[j] != ']') {
          if (p[j] == '[' && j + 1 < n &&
              (p[j + 1] == ':' || p[j + 1] == '.' || p[j + 1] == '=')) {
            char kind = p[j + 1];
            size_t k = j + 2;
            while (k + 1 < n && !(p[k] == kind && p[k + 1] == ']')) ++k;
            j = k + 2;
          } else {
            ++j;
          }
        }
        i = j < n ? j : n;
      }
      last = 1;
      group[depth] += 1;
    }
    if (group[depth] > MAX_PATTERN_STATES) {
      return bad(path, "pattern",
                 "expands to more than 100000 states (nested counted "
                 "repetitions multiply: (a{100}){100} is 10000)");
    }
  }
  return NULL;
}

static pcp_status_t regex_node_parse(const json_t* config,
                                     pcp_workloads_rl_reward_t* node) {
  static const char* const kAllowed[] = {"type", "pattern", "flags",
                                         "max_input_bytes", NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(config, node->key_path, kAllowed));
  const char* pattern = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(text_get(config, node->key_path, "pattern",
                                    PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES,
                                    &pattern, &length));
  PCP_RETURN_IF_ERROR_BARE(pattern_check(node->key_path, pattern, length));
  PCP_RETURN_IF_ERROR_BARE(pattern_size_check(node->key_path, pattern, length));
  json_t* max_input = json_object_get(config, "max_input_bytes");
  node->max_input_bytes = PCP_WORKLOADS_RL_REWARD_DEFAULT_REGEX_INPUT_BYTES;
  if (max_input) {
    if (!json_is_integer(max_input) || json_integer_value(max_input) < 1 ||
        json_integer_value(max_input) >
            PCP_WORKLOADS_RL_REWARD_MAX_REGEX_INPUT_BYTES) {
      return bad(node->key_path, "max_input_bytes",
                 "must be an integer in [1, 1048576]");
    }
    node->max_input_bytes = (size_t)json_integer_value(max_input);
  }
  int cflags = REG_EXTENDED | REG_NOSUB;
  json_t* flags = json_object_get(config, "flags");
  if (flags) {
    if (!json_is_string(flags)) {
      return bad(node->key_path, "flags", "must be a string");
    }
    const char* f = json_string_value(flags);
    if (strlen(f) != json_string_length(flags) || strlen(f) > 2) {
      return bad(node->key_path, "flags", "must be at most \"im\"");
    }
    for (const char* c = f; *c; ++c) {
      int bit = *c == 'i' ? REG_ICASE : *c == 'm' ? REG_NEWLINE : 0;
      if (!bit) {
        return bad(node->key_path, "flags",
                   "unknown flag (allowed: i = ignore case, m = multi-line)");
      }
      if (cflags & bit)
        return bad(node->key_path, "flags", "repeated flag");
      cflags |= bit;
    }
  }
  int rc = regcomp(&node->regex, pattern, cflags);
  if (rc != 0) {
    char message[128];
    regerror(rc, &node->regex, message, sizeof(message));
    regfree(&node->regex);
    char what[192];
    snprintf(what, sizeof(what), "does not compile: %s", message);
    return bad(node->key_path, "pattern", what);
  }
  node->regex_compiled = true;
  return NULL;
}

static pcp_status_t length_node_parse(const json_t* config,
                                      pcp_workloads_rl_reward_t* node) {
  static const char* const kAllowed[] = {
      "type", "min_tokens", "max_tokens", "min_chars", "max_chars", NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(config, node->key_path, kAllowed));
  const char* p = node->key_path;
  PCP_RETURN_IF_ERROR_BARE(
      bound_get(config, p, "min_tokens", &node->min_tokens));
  PCP_RETURN_IF_ERROR_BARE(
      bound_get(config, p, "max_tokens", &node->max_tokens));
  PCP_RETURN_IF_ERROR_BARE(bound_get(config, p, "min_chars", &node->min_chars));
  PCP_RETURN_IF_ERROR_BARE(bound_get(config, p, "max_chars", &node->max_chars));
  if (node->min_tokens < 0 && node->max_tokens < 0 && node->min_chars < 0 &&
      node->max_chars < 0) {
    return bad(p, NULL,
               "a length reward needs at least one of min_tokens, max_tokens, "
               "min_chars, max_chars");
  }
  if (node->max_tokens >= 0 && node->min_tokens > node->max_tokens) {
    return bad(p, "min_tokens", "is greater than max_tokens");
  }
  if (node->max_chars >= 0 && node->min_chars > node->max_chars) {
    return bad(p, "min_chars", "is greater than max_chars");
  }
  return NULL;
}

static pcp_status_t sum_node_parse(parse_state_t* state, const json_t* config,
                                   int depth, pcp_workloads_rl_reward_t* node) {
  static const char* const kAllowed[] = {"type", "terms", NULL};
  PCP_RETURN_IF_ERROR_BARE(keys_check(config, node->key_path, kAllowed));
  if (depth > PCP_WORKLOADS_RL_REWARD_MAX_DEPTH) {
    return bad(node->key_path, NULL, "sums nest deeper than 4 levels");
  }
  json_t* terms = json_object_get(config, "terms");
  if (!json_is_array(terms)) {
    return bad(node->key_path, "terms",
               terms ? "must be an array" : "is required");
  }
  size_t count = json_array_size(terms);
  if (count == 0 || count > PCP_WORKLOADS_RL_REWARD_MAX_TERMS) {
    return bad(node->key_path, "terms", "must have 1 to 16 terms");
  }
  for (size_t i = 0; i < count; ++i) {
    json_t* term = json_array_get(terms, i);
    char term_path[KEY_PATH_CAPACITY];
    int written = snprintf(term_path, sizeof(term_path), "%s.terms[%zu]",
                           node->key_path, i);
    if (written < 0 || (size_t)written >= sizeof(term_path)) {
      return bad(node->key_path, NULL, "key path too long");
    }
    if (!json_is_object(term))
      return bad(term_path, NULL, "must be an object");
    static const char* const kTermKeys[] = {"weight", "reward", NULL};
    PCP_RETURN_IF_ERROR_BARE(keys_check(term, term_path, kTermKeys));
    double weight = 1.0;
    PCP_RETURN_IF_ERROR_BARE(
        double_get(term, term_path, "weight", 1.0, -1e6, 1e6, &weight));
    json_t* reward = json_object_get(term, "reward");
    if (!reward)
      return bad(term_path, "reward", "is required");
    char reward_path[KEY_PATH_CAPACITY];
    written =
        snprintf(reward_path, sizeof(reward_path), "%s.reward", term_path);
    if (written < 0 || (size_t)written >= sizeof(reward_path)) {
      return bad(term_path, NULL, "key path too long");
    }
    // Stored before parsing so that release frees a partly built child.
    node->weights[i] = weight;
    PCP_RETURN_IF_ERROR_BARE(
        node_parse(state, reward, reward_path, depth + 1, &node->terms[i]));
    node->term_count = i + 1;
  }
  return NULL;
}

static pcp_status_t node_parse(parse_state_t* state, const json_t* config,
                               const char* path, int depth,
                               pcp_workloads_rl_reward_t** out_node) {
  *out_node = NULL;
  if (!json_is_object(config))
    return bad(path, NULL, "must be an object");
  if (++state->node_count > PCP_WORKLOADS_RL_REWARD_MAX_NODES) {
    return bad(path, NULL, "the config has more than 64 rewards");
  }
  json_t* type = json_object_get(config, "type");
  if (!json_is_string(type)) {
    return bad(path, "type", type ? "must be a string" : "is required");
  }
  static const struct {
    const char* name;
    node_kind_t kind;
  } kTypes[] = {
      {"exact_match", NODE_EXACT_MATCH},
      {"numeric", NODE_NUMERIC},
      {"regex", NODE_REGEX},
      {"contains", NODE_CONTAINS},
      {"not_contains", NODE_NOT_CONTAINS},
      {"length", NODE_LENGTH},
      {"sum", NODE_SUM},
  };
  const char* name = json_string_value(type);
  int kind = -1;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kTypes); ++i) {
    if (strcmp(kTypes[i].name, name) == 0)
      kind = (int)kTypes[i].kind;
  }
  if (kind < 0) {
    if (strcmp(name, "verifier") == 0) {
      return bad(path, "type",
                 "'verifier' is an external verifier, built by the RL "
                 "service (pcp_services_verifier_create), not a built-in "
                 "reward");
    }
    return bad(path, "type",
               "unknown reward type (allowed: exact_match, numeric, regex, "
               "contains, not_contains, length, sum)");
  }
  pcp_workloads_rl_reward_t* node = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(state->allocator, sizeof(*node), (void**)&node));
  node->allocator = state->allocator;
  node->kind = (node_kind_t)kind;
  snprintf(node->key_path, sizeof(node->key_path), "%s", path);
  node->min_tokens = node->max_tokens = node->min_chars = node->max_chars = -1;
  pcp_status_t status = NULL;
  switch (node->kind) {
    case NODE_EXACT_MATCH: {
      static const char* const kAllowed[] = {"type", "trim", "case_insensitive",
                                             NULL};
      status = keys_check(config, path, kAllowed);
      if (!status)
        status = bool_get(config, path, "trim", true, &node->trim);
      if (!status) {
        status = bool_get(config, path, "case_insensitive", false,
                          &node->case_insensitive);
      }
      break;
    }
    case NODE_NUMERIC: {
      static const char* const kAllowed[] = {"type", "tolerance",
                                             "relative_tolerance", NULL};
      status = keys_check(config, path, kAllowed);
      if (!status) {
        status = double_get(config, path, "tolerance", 1e-6, 0.0, 1e300,
                            &node->tolerance);
      }
      if (!status) {
        status = double_get(config, path, "relative_tolerance", 0.0, 0.0, 1.0,
                            &node->relative_tolerance);
      }
      break;
    }
    case NODE_REGEX:
      status = regex_node_parse(config, node);
      break;
    case NODE_CONTAINS:
    case NODE_NOT_CONTAINS:
      status = text_node_parse(config, node);
      break;
    case NODE_LENGTH:
      status = length_node_parse(config, node);
      break;
    case NODE_SUM:
      status = sum_node_parse(state, config, depth, node);
      break;
  }
  if (status) {
    pcp_workloads_rl_reward_release(node);
    return status;
  }
  *out_node = node;
  return NULL;
}

pcp_status_t pcp_workloads_rl_reward_create(
    const json_t* config, const char* key_path, pcp_allocator_t allocator,
    pcp_workloads_rl_reward_t** out_reward) {
  *out_reward = NULL;
  const char* path = key_path && *key_path ? key_path : "reward";
  if (strlen(path) > 64) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "reward key path longer than 64 bytes");
  }
  parse_state_t state = {.allocator = allocator};
  return node_parse(&state, config, path, 1, out_reward);
}

pcp_status_t pcp_workloads_rl_reward_create_from_string(
    pcp_string_view_t config_json, const char* key_path,
    pcp_allocator_t allocator, pcp_workloads_rl_reward_t** out_reward) {
  *out_reward = NULL;
  const char* path = key_path && *key_path ? key_path : "reward";
  if (config_json.size > PCP_WORKLOADS_RL_REWARD_MAX_CONFIG_BYTES) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "%s: config is %zu bytes, longer than %u",
        path, config_json.size, PCP_WORKLOADS_RL_REWARD_MAX_CONFIG_BYTES);
  }
  json_error_t error;
  json_t* config = json_loadb(config_json.data, config_json.size,
                              JSON_REJECT_DUPLICATES, &error);
  if (!config) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: not JSON (line %d, column %d: %s)", path,
                           error.line, error.column, error.text);
  }
  pcp_status_t status =
      pcp_workloads_rl_reward_create(config, path, allocator, out_reward);
  json_decref(config);
  return status;
}

void pcp_workloads_rl_reward_release(pcp_workloads_rl_reward_t* reward) {
  if (!reward)
    return;
  for (size_t i = 0; i < reward->term_count; ++i) {
    pcp_workloads_rl_reward_release(reward->terms[i]);
  }
  if (reward->regex_compiled)
    regfree(&reward->regex);
  pcp_allocator_free(reward->allocator, reward->text);
  pcp_allocator_free(reward->allocator, reward->failure);
  pcp_allocator_free(reward->allocator, reward);
}

//===----------------------------------------------------------------------===//
// Scoring
//===----------------------------------------------------------------------===//

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool is_alnum(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static pcp_string_view_t trim(pcp_string_view_t v) {
  while (v.size > 0 && is_space(v.data[0])) {
    ++v.data;
    --v.size;
  }
  while (v.size > 0 && is_space(v.data[v.size - 1])) --v.size;
  return v;
}

static bool text_equal(pcp_string_view_t a, pcp_string_view_t b,
                       bool case_insensitive) {
  if (a.size != b.size)
    return false;
  if (!case_insensitive)
    return a.size == 0 || memcmp(a.data, b.data, a.size) == 0;
  for (size_t i = 0; i < a.size; ++i) {
    if (lower(a.data[i]) != lower(b.data[i]))
      return false;
  }
  return true;
}

// Scans one number starting at |start| (a digit, '.' + digit, or a sign
// directly before one of those, not glued to a word): digits with optional
// ",ddd" thousands groups, an optional fraction, an optional exponent.
// Returns the end (exclusive) or |start| when no number starts there, and
// the value in |*out_value| (commas dropped; NaN when the number is longer
// than PCP_WORKLOADS_RL_REWARD_MAX_NUMBER_BYTES; +-inf past DBL_MAX).
static size_t number_scan(const char* s, size_t n, size_t start,
                          double* out_value) {
  size_t i = start;
  if (i < n && (s[i] == '-' || s[i] == '+')) {
    if (i > 0 && is_alnum(s[i - 1]))
      return start;
    ++i;
  }
  bool leading_digits = i < n && is_digit(s[i]);
  bool leading_point = i + 1 < n && s[i] == '.' && is_digit(s[i + 1]);
  if (!leading_digits && !leading_point)
    return start;
  char buffer[PCP_WORKLOADS_RL_REWARD_MAX_NUMBER_BYTES + 1];
  size_t used = 0;
  bool too_long = false;
  // The argument is evaluated exactly once (it advances |i|), kept or not.
#define PUT(c)                                             \
  do {                                                     \
    char put_c_ = (c);                                     \
    if (used < PCP_WORKLOADS_RL_REWARD_MAX_NUMBER_BYTES) { \
      buffer[used++] = put_c_;                             \
    } else {                                               \
      too_long = true;                                     \
    }                                                      \
  } while (0)
  if (i > start)
    PUT(s[start]);
  while (i < n && is_digit(s[i])) PUT(s[i++]);
  // Thousands groups: ",ddd" not followed by another digit ("1,234,567").
  while (leading_digits && i + 3 < n && s[i] == ',' && is_digit(s[i + 1]) &&
         is_digit(s[i + 2]) && is_digit(s[i + 3]) &&
         (i + 4 >= n || !is_digit(s[i + 4]))) {
    PUT(s[i + 1]);
    PUT(s[i + 2]);
    PUT(s[i + 3]);
    i += 4;
  }
  if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
    PUT(s[i++]);
    while (i < n && is_digit(s[i])) PUT(s[i++]);
  }
  if (i + 1 < n && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < n && (s[j] == '-' || s[j] == '+'))
      ++j;
    if (j < n && is_digit(s[j])) {
      while (i < j) PUT(s[i++]);
      while (i < n && is_digit(s[i])) PUT(s[i++]);
    }
  }
#undef PUT
  buffer[used] = '\0';
  *out_value = too_long ? NAN : strtod(buffer, NULL);
  return i;
}

// The last number of |text|; false when there is none.
static bool last_number(pcp_string_view_t text, double* out_value) {
  bool found = false;
  size_t i = 0;
  while (i < text.size) {
    double value = 0;
    size_t end = number_scan(text.data, text.size, i, &value);
    if (end > i) {
      found = true;
      *out_value = value;
      i = end;
    } else {
      ++i;
    }
  }
  return found;
}

static pcp_status_t answer_number(const pcp_workloads_rl_reward_t* node,
                                  pcp_string_view_t answer, double* out) {
  pcp_string_view_t t = trim(answer);
  double value = 0;
  size_t end = t.size ? number_scan(t.data, t.size, 0, &value) : 0;
  if (end == 0 || end != t.size || !isfinite(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: the answer '%.*s' is not a finite number",
                           node->key_path, (int)(t.size > 64 ? 64 : t.size),
                           t.data ? t.data : "");
  }
  *out = value;
  return NULL;
}

// Unicode code points of UTF-8 |text| (bytes that do not continue a
// sequence; invalid bytes count one each).
static int64_t code_points(pcp_string_view_t text) {
  int64_t count = 0;
  for (size_t i = 0; i < text.size; ++i) {
    if (((unsigned char)text.data[i] & 0xC0u) != 0x80u)
      ++count;
  }
  return count;
}

static bool contains(const pcp_workloads_rl_reward_t* node,
                     pcp_string_view_t haystack) {
  size_t k = 0;
  for (size_t i = 0; i < haystack.size; ++i) {
    char c =
        node->case_insensitive ? lower(haystack.data[i]) : haystack.data[i];
    while (k > 0 && c != node->text[k]) k = node->failure[k - 1];
    if (c == node->text[k] && ++k == node->text_length)
      return true;
  }
  return false;
}

static pcp_status_t node_score(const pcp_workloads_rl_reward_t* node,
                               const pcp_workloads_rl_sample_t* sample,
                               double* out_reward) {
  *out_reward = 0.0;
  pcp_string_view_t completion = sample->completion;
  switch (node->kind) {
    case NODE_EXACT_MATCH: {
      if (!sample->answer.data) {
        return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                               "%s: exact_match needs an answer and the "
                               "sample has none",
                               node->key_path);
      }
      pcp_string_view_t a = node->trim ? trim(sample->answer) : sample->answer;
      pcp_string_view_t c = node->trim ? trim(completion) : completion;
      *out_reward = text_equal(c, a, node->case_insensitive) ? 1.0 : 0.0;
      return NULL;
    }
    case NODE_NUMERIC: {
      if (!sample->answer.data) {
        return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                               "%s: numeric needs an answer and the sample "
                               "has none",
                               node->key_path);
      }
      double answer = 0;
      PCP_RETURN_IF_ERROR_BARE(answer_number(node, sample->answer, &answer));
      double value = 0;
      if (!last_number(completion, &value) || !isfinite(value))
        return NULL;
      double allowed =
          fmax(node->tolerance, node->relative_tolerance * fabs(answer));
      *out_reward = fabs(value - answer) <= allowed ? 1.0 : 0.0;
      return NULL;
    }
    case NODE_REGEX: {
      if (completion.size > node->max_input_bytes) {
        return pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "%s: the completion is %zu bytes, longer than max_input_bytes "
            "%zu (regex matching time grows faster than the text: raise "
            "max_input_bytes or shorten the rollouts)",
            node->key_path, completion.size, node->max_input_bytes);
      }
      // REG_STARTEND bounds the match by the view's length, so a NUL byte
      // inside a completion does not end it early. The text is still copied
      // with a terminating NUL: sanitizers' regexec interceptors read up to
      // the first NUL whatever the flags (bounded: max_input_bytes).
      char* text = NULL;
      PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
          node->allocator, completion.size + 1, (void**)&text));
      if (completion.size)
        memcpy(text, completion.data, completion.size);
      text[completion.size] = '\0';
      regmatch_t range = {.rm_so = 0, .rm_eo = (regoff_t)completion.size};
      int rc = regexec(&node->regex, text, 1, &range, REG_STARTEND);
      pcp_allocator_free(node->allocator, text);
      if (rc != 0 && rc != REG_NOMATCH) {
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "%s: regexec failed (%d)", node->key_path, rc);
      }
      *out_reward = rc == 0 ? 1.0 : 0.0;
      return NULL;
    }
    case NODE_CONTAINS:
    case NODE_NOT_CONTAINS: {
      bool found = contains(node, completion);
      *out_reward = found == (node->kind == NODE_CONTAINS) ? 1.0 : 0.0;
      return NULL;
    }
    case NODE_LENGTH: {
      bool ok = true;
      if (node->min_tokens >= 0 || node->max_tokens >= 0) {
        int64_t tokens = sample->completion_token_count;
        if (tokens < 0) {
          return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                                 "%s: a token window needs the completion's "
                                 "token count and the sample has none",
                                 node->key_path);
        }
        if (node->min_tokens >= 0 && tokens < node->min_tokens)
          ok = false;
        if (node->max_tokens >= 0 && tokens > node->max_tokens)
          ok = false;
      }
      if (node->min_chars >= 0 || node->max_chars >= 0) {
        int64_t chars = code_points(completion);
        if (node->min_chars >= 0 && chars < node->min_chars)
          ok = false;
        if (node->max_chars >= 0 && chars > node->max_chars)
          ok = false;
      }
      *out_reward = ok ? 1.0 : 0.0;
      return NULL;
    }
    case NODE_SUM: {
      double total = 0.0;
      for (size_t i = 0; i < node->term_count; ++i) {
        double term = 0.0;
        PCP_RETURN_IF_ERROR_BARE(node_score(node->terms[i], sample, &term));
        total += node->weights[i] * term;
      }
      *out_reward = total;
      return NULL;
    }
  }
  return pcp_make_status(PCP_STATUS_INTERNAL, "%s: unknown reward kind",
                         node->key_path);
}

static pcp_status_t input_check(const pcp_workloads_rl_reward_t* reward,
                                const char* name, pcp_string_view_t text) {
  if (text.size > PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: the %s is %zu bytes, longer than %u",
                           reward->key_path, name, text.size,
                           PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES);
  }
  if (text.size > 0 && !text.data) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: the %s has a length but no data",
                           reward->key_path, name);
  }
  return NULL;
}

pcp_status_t pcp_workloads_rl_reward_score(
    const pcp_workloads_rl_reward_t* reward,
    const pcp_workloads_rl_sample_t* sample, double* out_reward) {
  *out_reward = 0.0;
  PCP_RETURN_IF_ERROR_BARE(input_check(reward, "prompt", sample->prompt));
  PCP_RETURN_IF_ERROR_BARE(
      input_check(reward, "completion", sample->completion));
  PCP_RETURN_IF_ERROR_BARE(input_check(reward, "answer", sample->answer));
  double value = 0.0;
  PCP_RETURN_IF_ERROR_BARE(node_score(reward, sample, &value));
  // Leaves are 0/1 and weights bounded by 1e6 over at most 64 nodes, so a
  // non-finite total is a bug, not an input.
  if (!isfinite(value)) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "%s: non-finite reward",
                           reward->key_path);
  }
  *out_reward = value;
  return NULL;
}

//===----------------------------------------------------------------------===//
// Verifier interface
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_rl_verifier_score_batch(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_sample_t* items, size_t count, double* out_rewards) {
  return pcp_workloads_rl_verifier_score_batch_until(verifier, items, count,
                                                     NULL, out_rewards);
}

pcp_status_t pcp_workloads_rl_verifier_score_batch_until(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_sample_t* items, size_t count,
    const pcp_workloads_rl_stop_t* stop, double* out_rewards) {
  if (!verifier || !verifier->score_batch) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "no reward verifier configured");
  }
  for (size_t i = 0; i < count; ++i) out_rewards[i] = NAN;
  if (verifier->score_batch_stoppable && stop && stop->should_stop) {
    PCP_RETURN_IF_ERROR_BARE(verifier->score_batch_stoppable(
        verifier->self, items, count, stop, out_rewards));
  } else {
    PCP_RETURN_IF_ERROR_BARE(
        verifier->score_batch(verifier->self, items, count, out_rewards));
  }
  for (size_t i = 0; i < count; ++i) {
    if (!isfinite(out_rewards[i])) {
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "reward verifier left item %zu without a finite "
                             "reward",
                             i);
    }
  }
  return NULL;
}

void pcp_workloads_rl_verifier_release(pcp_workloads_rl_verifier_t* verifier) {
  if (!verifier)
    return;
  if (verifier->release)
    verifier->release(verifier->self);
  memset(verifier, 0, sizeof(*verifier));
}

static pcp_status_t builtin_score_batch(void* self,
                                        const pcp_workloads_rl_sample_t* items,
                                        size_t count, double* out_rewards) {
  const pcp_workloads_rl_reward_t* reward = self;
  for (size_t i = 0; i < count; ++i) {
    PCP_RETURN_IF_ERROR(
        pcp_workloads_rl_reward_score(reward, &items[i], &out_rewards[i]),
        "item %zu", i);
  }
  return NULL;
}

pcp_workloads_rl_verifier_t pcp_workloads_rl_reward_verifier(
    const pcp_workloads_rl_reward_t* reward) {
  pcp_workloads_rl_verifier_t verifier = {.self = (void*)reward,
                                          .score_batch = builtin_score_batch,
                                          .release = NULL};
  return verifier;
}
