// SPDX-License-Identifier: Apache-2.0
// Table-driven config: one code path turns text (CLI, defaults) or JSON
// values into struct fields, so bounds, enums and messages are identical
// whichever way a value arrives.

#include "config/config.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

static void* field_ptr(void* config, const pcp_config_field_t* field) {
  return (char*)config + field->offset;
}

static const void* field_cptr(const void* config,
                              const pcp_config_field_t* field) {
  return (const char*)config + field->offset;
}

// Dashes and underscores are the same character in names, so `--device_id`,
// `--device-id` and JSON `device_id` all reach one field.
static bool name_char_equal(char a, char b) {
  if (a == '_') {
    a = '-';
  }
  if (b == '_') {
    b = '-';
  }
  return a == b;
}

static bool name_equal(const char* field_name, const char* name,
                       size_t name_length) {
  size_t i = 0;
  for (; i < name_length; ++i) {
    if (field_name[i] == 0 || !name_char_equal(field_name[i], name[i])) {
      return false;
    }
  }
  return field_name[i] == 0;
}

typedef enum lookup_mode_e {
  LOOKUP_CLI = 0,
  LOOKUP_JSON = 1,
  LOOKUP_ANY = 2,
} lookup_mode_t;

static const pcp_config_field_t* find_field(const pcp_config_table_t* table,
                                            const char* name,
                                            size_t name_length,
                                            lookup_mode_t mode) {
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* field = &table->fields[i];
    if (!name_equal(field->name, name, name_length)) {
      continue;
    }
    if (mode == LOOKUP_CLI && ((field->flags & PCP_CONFIG_FLAG_JSON_ONLY) ||
                               field->type == PCP_CONFIG_TYPE_OBJECT)) {
      continue;
    }
    if (mode == LOOKUP_JSON && (field->flags & PCP_CONFIG_FLAG_CLI_ONLY)) {
      continue;
    }
    return field;
  }
  return NULL;
}

// JSON spelling of a field name: dashes become underscores.
static void json_key_of(const char* name, char* buffer, size_t capacity) {
  size_t i = 0;
  for (; name[i] && i + 1 < capacity; ++i) {
    char c = name[i];
    if (c == '-') {
      c = '_';
    }
    buffer[i] = c;
  }
  buffer[i] = 0;
}

// Prints a bound as an integer when it is one, so messages read
// "[1, 65535]" rather than "[1.000000, 65535.000000]".
static void format_number(double value, char* buffer, size_t capacity) {
  if (value == floor(value) && fabs(value) < 9e15) {
    snprintf(buffer, capacity, "%lld", (long long)value);
  } else {
    snprintf(buffer, capacity, "%g", value);
  }
}

// ALIAS and RENAMED entries name a member declared earlier; they own
// nothing and have no default.
static bool is_alias(const pcp_config_field_t* field) {
  return (field->flags & (PCP_CONFIG_FLAG_ALIAS | PCP_CONFIG_FLAG_RENAMED)) !=
         0;
}

static bool has_bounds(const pcp_config_field_t* field) {
  return field->min < field->max;
}

static pcp_status_t check_bounds(const pcp_config_field_t* field, double value,
                                 const char* text, const char* what) {
  if (!has_bounds(field)) {
    return pcp_ok_status();
  }
  if (value >= field->min && value <= field->max) {
    return pcp_ok_status();
  }
  char lo[32], hi[32];
  format_number(field->min, lo, sizeof(lo));
  format_number(field->max, hi, sizeof(hi));
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "%s: %s is out of range [%s, %s]", what, text, lo, hi);
}

// "a, b, c" for messages; "a|b|c" for --help value names.
static void join_enum_values(const pcp_config_field_t* field,
                             const char* separator, char* buffer,
                             size_t capacity) {
  size_t at = 0;
  buffer[0] = 0;
  if (!field->enum_values) {
    return;
  }
  for (size_t i = 0; field->enum_values[i]; ++i) {
    int n = snprintf(buffer + at, capacity - at, "%s%s", i ? separator : "",
                     field->enum_values[i]);
    if (n < 0 || (size_t)n >= capacity - at) {
      break;
    }
    at += (size_t)n;
  }
}

// Returns the field an ALIAS writes to (the first non-alias field at the
// same offset), or |field| itself.
static const pcp_config_field_t* alias_target(const pcp_config_table_t* table,
                                              const pcp_config_field_t* field) {
  if (!is_alias(field)) {
    return field;
  }
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* other = &table->fields[i];
    if (other->offset == field->offset && !is_alias(other)) {
      return other;
    }
  }
  return field;
}

//===----------------------------------------------------------------------===//
// String lists
//===----------------------------------------------------------------------===//

// Unset ({NULL, NULL}): the system allocator, so a zeroed list works.
static pcp_allocator_t list_allocator(const pcp_string_list_t* list) {
  return list->allocator.ctl ? list->allocator : pcp_allocator_system();
}

// An empty list that names no allocator takes the config's, so the items a
// parse appends come from the allocator the parse was given.
static void list_adopt(pcp_string_list_t* list, pcp_allocator_t allocator) {
  if (!list->items && !list->allocator.ctl) {
    list->allocator = allocator;
  }
}

pcp_status_t pcp_string_list_append(pcp_string_list_t* list,
                                    const char* value) {
  if (list->count >= PCP_CONFIG_MAX_LIST_ITEMS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "list holds more than %u items",
                           (unsigned)PCP_CONFIG_MAX_LIST_ITEMS);
  }
  pcp_allocator_t allocator = list_allocator(list);
  char* copy = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_strdup(allocator, value, &copy),
                      "out of memory");
  void* items = list->items;
  pcp_status_t status = pcp_allocator_realloc(
      allocator, (list->count + 1) * sizeof(char*), &items);
  if (status) {
    pcp_allocator_free(allocator, copy);
    return pcp_status_annotate_f(status, "out of memory");
  }
  list->items = items;
  list->items[list->count++] = copy;
  return pcp_ok_status();
}

void pcp_string_list_deinitialize(pcp_string_list_t* list) {
  pcp_allocator_t allocator = list_allocator(list);
  for (size_t i = 0; i < list->count; ++i) {
    pcp_allocator_free(allocator, list->items[i]);
  }
  pcp_allocator_free(allocator, list->items);
  list->items = NULL;
  list->count = 0;
}

//===----------------------------------------------------------------------===//
// Setting values
//===----------------------------------------------------------------------===//

static pcp_status_t set_string(pcp_allocator_t allocator, void* slot,
                               const char* value, const char* what) {
  if (strlen(value) > PCP_CONFIG_MAX_STRING_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: value is longer than %u bytes", what,
                           (unsigned)PCP_CONFIG_MAX_STRING_BYTES);
  }
  char* copy = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_strdup(allocator, value, &copy), "%s",
                      what);
  char** target = (char**)slot;
  pcp_allocator_free(allocator, *target);
  *target = copy;
  return pcp_ok_status();
}

static pcp_status_t list_append(pcp_allocator_t allocator,
                                pcp_string_list_t* list, const char* value,
                                const char* what) {
  if (strlen(value) > PCP_CONFIG_MAX_STRING_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: value is longer than %u bytes", what,
                           (unsigned)PCP_CONFIG_MAX_STRING_BYTES);
  }
  list_adopt(list, allocator);
  PCP_RETURN_IF_ERROR(pcp_string_list_append(list, value), "%s", what);
  return pcp_ok_status();
}

static pcp_status_t set_enum(const pcp_config_field_t* field, void* slot,
                             const char* value, const char* what) {
  for (int32_t i = 0; field->enum_values && field->enum_values[i]; ++i) {
    if (strcmp(field->enum_values[i], value) == 0) {
      *(int32_t*)slot = i;
      return pcp_ok_status();
    }
  }
  char allowed[512];
  join_enum_values(field, ", ", allowed, sizeof(allowed));
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "%s: invalid value '%s' (allowed: %s)", what, value,
                         allowed);
}

static bool parse_bool_text(const char* text, bool* out_value) {
  static const char* const kTrue[] = {"true", "1", "yes", "on"};
  static const char* const kFalse[] = {"false", "0", "no", "off"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kTrue); ++i) {
    if (strcasecmp(text, kTrue[i]) == 0) {
      *out_value = true;
      return true;
    }
    if (strcasecmp(text, kFalse[i]) == 0) {
      *out_value = false;
      return true;
    }
  }
  return false;
}

// strtoll and strtod skip leading blanks and accept '+'; a config value with
// either is more likely a quoting mistake than intent, so refuse both.
static bool number_text_ok(const char* text) {
  return text[0] == '-' || text[0] == '.' || (text[0] >= '0' && text[0] <= '9');
}

// Parses |text| into the field as the CLI, defaults and pcp_config_set do.
// STRING_LIST appends one item.
static pcp_status_t set_from_text(pcp_allocator_t allocator,
                                  const pcp_config_field_t* field, void* config,
                                  const char* text, const char* what) {
  void* slot = field_ptr(config, field);
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL: {
      bool value = false;
      if (!parse_bool_text(text, &value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: expected true or false, got '%s'", what,
                               text);
      }
      *(bool*)slot = value;
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_INT64: {
      int64_t value = 0;
      if (!number_text_ok(text) ||
          !pcp_string_view_parse_int64(pcp_make_cstring_view(text), &value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: expected an integer, got '%s'", what, text);
      }
      PCP_RETURN_IF_ERROR_BARE(check_bounds(field, (double)value, text, what));
      *(int64_t*)slot = value;
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_DOUBLE: {
      double value = 0;
      if (!number_text_ok(text) ||
          !pcp_string_view_parse_double(pcp_make_cstring_view(text), &value) ||
          !isfinite(value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: expected a number, got '%s'", what, text);
      }
      PCP_RETURN_IF_ERROR_BARE(check_bounds(field, value, text, what));
      *(double*)slot = value;
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_STRING:
      return set_string(allocator, slot, text, what);
    case PCP_CONFIG_TYPE_ENUM:
      return set_enum(field, slot, text, what);
    case PCP_CONFIG_TYPE_STRING_LIST:
      return list_append(allocator, (pcp_string_list_t*)slot, text, what);
    case PCP_CONFIG_TYPE_OBJECT:
      break;
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "%s: cannot be set from text", what);
}

//===----------------------------------------------------------------------===//
// Initialize / deinitialize
//===----------------------------------------------------------------------===//

static void clear_field(const pcp_config_field_t* field, void* config) {
  void* slot = field_ptr(config, field);
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL:
      *(bool*)slot = false;
      break;
    case PCP_CONFIG_TYPE_INT64:
      *(int64_t*)slot = 0;
      break;
    case PCP_CONFIG_TYPE_DOUBLE:
      *(double*)slot = 0;
      break;
    case PCP_CONFIG_TYPE_STRING:
      *(char**)slot = NULL;
      break;
    case PCP_CONFIG_TYPE_ENUM:
      *(int32_t*)slot = 0;
      break;
    case PCP_CONFIG_TYPE_STRING_LIST:
      memset(slot, 0, sizeof(pcp_string_list_t));
      break;
    case PCP_CONFIG_TYPE_OBJECT:
      *(bool*)slot = false;
      break;
  }
}

// Sets one field to its default. The struct's size is unknown here, so
// "zeroed first" means every field the table describes.
static pcp_status_t initialize_field(const pcp_config_table_t* table,
                                     pcp_allocator_t allocator,
                                     const pcp_config_field_t* field,
                                     void* config) {
  if (is_alias(field)) {
    return pcp_ok_status();
  }
  clear_field(field, config);
  if (field->type == PCP_CONFIG_TYPE_OBJECT) {
    PCP_ASSERT(field->object_table != NULL);
    return pcp_config_initialize_with_allocator(field->object_table, allocator,
                                                field_ptr(config, field));
  }
  if (!field->default_value) {
    return pcp_ok_status();
  }
  char what[160];
  snprintf(what, sizeof(what), "%s: default of '%s'", table->name, field->name);
  if (field->type != PCP_CONFIG_TYPE_STRING_LIST) {
    return set_from_text(allocator, field, config, field->default_value, what);
  }
  // List defaults are comma-separated ("" is the empty list).
  const char* start = field->default_value;
  while (*start) {
    const char* comma = strchr(start, ',');
    size_t length = comma ? (size_t)(comma - start) : strlen(start);
    char* item = NULL;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(allocator, length + 1, (void**)&item), "%s", what);
    memcpy(item, start, length);
    item[length] = 0;
    pcp_status_t status = set_from_text(allocator, field, config, item, what);
    pcp_allocator_free(allocator, item);
    PCP_RETURN_IF_ERROR_BARE(status);
    if (!comma) {
      break;
    }
    start = comma + 1;
  }
  return pcp_ok_status();
}

pcp_status_t pcp_config_initialize(const pcp_config_table_t* table,
                                   void* config) {
  return pcp_config_initialize_with_allocator(table, pcp_allocator_system(),
                                              config);
}

pcp_status_t pcp_config_initialize_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator, void* config) {
  for (size_t i = 0; i < table->field_count; ++i) {
    if (is_alias(&table->fields[i])) {
      continue;
    }
    clear_field(&table->fields[i], config);
  }
  for (size_t i = 0; i < table->field_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        initialize_field(table, allocator, &table->fields[i], config));
  }
  return pcp_ok_status();
}

static void deinitialize_field(pcp_allocator_t allocator,
                               const pcp_config_field_t* field, void* config) {
  // The aliased field owns the member; freeing it twice would be a bug.
  if (is_alias(field)) {
    return;
  }
  void* slot = field_ptr(config, field);
  switch (field->type) {
    case PCP_CONFIG_TYPE_STRING:
      pcp_allocator_free(allocator, *(char**)slot);
      *(char**)slot = NULL;
      break;
    case PCP_CONFIG_TYPE_STRING_LIST:
      pcp_string_list_deinitialize((pcp_string_list_t*)slot);
      break;
    case PCP_CONFIG_TYPE_OBJECT:
      pcp_config_deinitialize_with_allocator(field->object_table, allocator,
                                             slot);
      *(bool*)slot = false;
      break;
    default:
      break;
  }
}

void pcp_config_deinitialize(const pcp_config_table_t* table, void* config) {
  pcp_config_deinitialize_with_allocator(table, pcp_allocator_system(), config);
}

void pcp_config_deinitialize_with_allocator(const pcp_config_table_t* table,
                                            pcp_allocator_t allocator,
                                            void* config) {
  for (size_t i = 0; i < table->field_count; ++i) {
    deinitialize_field(allocator, &table->fields[i], config);
  }
}

//===----------------------------------------------------------------------===//
// Suggestions
//===----------------------------------------------------------------------===//

// Edit distance with adjacent transpositions (optimal string alignment):
// `--verison` is one edit from `--version`, as a typist would count it.
// Dashes and underscores are the same character, as in names. Words are
// capped at 64 bytes; a longer one is never "close".
static size_t edit_distance(const char* a, size_t a_length, const char* b,
                            size_t b_length) {
  enum { kMax = 64 };
  if (a_length > kMax || b_length > kMax) {
    return SIZE_MAX;
  }
  size_t d[kMax + 1][kMax + 1];
  for (size_t i = 0; i <= a_length; ++i) {
    d[i][0] = i;
  }
  for (size_t j = 0; j <= b_length; ++j) {
    d[0][j] = j;
  }
  for (size_t i = 1; i <= a_length; ++i) {
    for (size_t j = 1; j <= b_length; ++j) {
      size_t cost = name_char_equal(a[i - 1], b[j - 1]) ? 0 : 1;
      size_t best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) {
        best = d[i][j - 1] + 1;
      }
      if (d[i - 1][j - 1] + cost < best) {
        best = d[i - 1][j - 1] + cost;
      }
      if (i > 1 && j > 1 && name_char_equal(a[i - 1], b[j - 2]) &&
          name_char_equal(a[i - 2], b[j - 1]) && d[i - 2][j - 2] + 1 < best) {
        best = d[i - 2][j - 2] + 1;
      }
      d[i][j] = best;
    }
  }
  return d[a_length][b_length];
}

// How many edits still read as a typo: 1 for short words, up to 3 for long
// ones (`--learning-rat` but not `--seed` for `--step`).
static size_t typo_budget(size_t length) {
  return length <= 4 ? 1 : length <= 9 ? 2 : 3;
}

size_t pcp_config_edit_distance(const char* a, const char* b) {
  return edit_distance(a, strlen(a), b, strlen(b));
}

// Keeps |candidate| in |inout_best| when it is closer to |word| than the
// best so far (|inout_best_distance| starts at the typo budget + 1).
static void consider_candidate(const char* word, size_t length,
                               const char* candidate, const char** inout_best,
                               size_t* inout_best_distance) {
  size_t distance = edit_distance(word, length, candidate, strlen(candidate));
  if (distance < *inout_best_distance) {
    *inout_best = candidate;
    *inout_best_distance = distance;
  }
}

const char* pcp_config_suggest(const char* word, const char* const* candidates,
                               size_t candidate_count) {
  size_t length = strlen(word);
  const char* best = NULL;
  size_t best_distance = typo_budget(length) + 1;
  for (size_t i = 0; i < candidate_count; ++i) {
    consider_candidate(word, length, candidates[i], &best, &best_distance);
  }
  return best;
}

static bool suggestable(const pcp_config_field_t* field) {
  return !(field->flags & (PCP_CONFIG_FLAG_HIDDEN | PCP_CONFIG_FLAG_JSON_ONLY |
                           PCP_CONFIG_FLAG_RENAMED)) &&
         field->type != PCP_CONFIG_TYPE_OBJECT;
}

const char* pcp_config_suggest_flag(const pcp_config_table_t* table,
                                    const char* name) {
  size_t length = strlen(name);
  const char* best = NULL;
  size_t best_distance = typo_budget(length) + 1;
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* field = &table->fields[i];
    if (suggestable(field)) {
      consider_candidate(name, length, field->name, &best, &best_distance);
    }
  }
  return best;
}

bool pcp_config_has_flag(const pcp_config_table_t* table, const char* name) {
  return find_field(table, name, strlen(name), LOOKUP_CLI) != NULL;
}

// "unknown flag '--verison' (did you mean '--version'?)".
static pcp_status_t unknown_flag_status(const pcp_config_table_t* table,
                                        const char* name, size_t name_length) {
  char copy[128];
  snprintf(copy, sizeof(copy), "%.*s", (int)name_length, name);
  const char* suggestion =
      name_length < sizeof(copy) ? pcp_config_suggest_flag(table, copy) : NULL;
  if (suggestion) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unknown flag '--%.*s' (did you mean '--%s'?)",
                           (int)name_length, name, suggestion);
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--%.*s'",
                         (int)name_length, name);
}

// "flag '--token-env' was renamed to '--api-token-env'".
static pcp_status_t renamed_flag_status(const pcp_config_table_t* table,
                                        const pcp_config_field_t* field) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "flag '--%s' was renamed to '--%s'", field->name,
                         alias_target(table, field)->name);
}

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

pcp_status_t pcp_config_set(const pcp_config_table_t* table, void* config,
                            const char* name, const char* value) {
  return pcp_config_set_with_allocator(table, pcp_allocator_system(), config,
                                       name, value);
}

pcp_status_t pcp_config_set_with_allocator(const pcp_config_table_t* table,
                                           pcp_allocator_t allocator,
                                           void* config, const char* name,
                                           const char* value) {
  const pcp_config_field_t* field =
      find_field(table, name, strlen(name), LOOKUP_ANY);
  if (!field || field->type == PCP_CONFIG_TYPE_OBJECT) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "%s: no field '%s'",
                           table->name, name);
  }
  if (field->flags & PCP_CONFIG_FLAG_RENAMED) {
    return renamed_flag_status(table, field);
  }
  char what[160];
  snprintf(what, sizeof(what), "flag '--%s'", field->name);
  return set_from_text(allocator, field, config, value, what);
}

static pcp_status_t parse_argv_impl(const pcp_config_table_t* table,
                                    pcp_allocator_t allocator, int argc,
                                    char** argv, void* config,
                                    pcp_string_list_t* out_positionals,
                                    bool* list_seen) {
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    const char* arg = argv[i];
    if (flags_done || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (!out_positionals) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "unexpected argument '%s'", arg);
      }
      list_adopt(out_positionals, allocator);
      PCP_RETURN_IF_ERROR_BARE(pcp_string_list_append(out_positionals, arg));
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      flags_done = true;
      continue;
    }
    if (arg[1] != '-') {
      // No short options: `-p 80` would be a second spelling to document.
      if (strcmp(arg, "-h") == 0 &&
          find_field(table, "help", 4, LOOKUP_CLI) != NULL) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "unknown flag '-h' (did you mean '--help'?)");
      }
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "unknown flag '%s'",
                             arg);
    }
    const char* name = arg + 2;
    const char* equals = strchr(name, '=');
    size_t name_length = equals ? (size_t)(equals - name) : strlen(name);
    const pcp_config_field_t* field =
        find_field(table, name, name_length, LOOKUP_CLI);
    if (!field) {
      return unknown_flag_status(table, name, name_length);
    }
    if (field->flags & PCP_CONFIG_FLAG_RENAMED) {
      return renamed_flag_status(table, field);
    }
    char what[160];
    snprintf(what, sizeof(what), "flag '--%s'", field->name);
    const char* value = NULL;
    if (equals) {
      value = equals + 1;
    } else if (field->type == PCP_CONFIG_TYPE_BOOL) {
      value = "true";
    } else {
      // A following flag is not taken as the value: `--port --host x` is
      // far more often a forgotten value than a port named "--host".
      if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "flag '--%s' needs a value", field->name);
      }
      value = argv[++i];
    }
    if (field->type == PCP_CONFIG_TYPE_STRING_LIST) {
      // The command line replaces a default or JSON list; repeats append.
      size_t index = (size_t)(field - table->fields);
      if (!list_seen[index]) {
        pcp_string_list_deinitialize(
            (pcp_string_list_t*)field_ptr(config, field));
        list_seen[index] = true;
      }
    }
    PCP_RETURN_IF_ERROR_BARE(
        set_from_text(allocator, field, config, value, what));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_config_parse_argv(const pcp_config_table_t* table, int argc,
                                   char** argv, void* config,
                                   pcp_string_list_t* out_positionals) {
  return pcp_config_parse_argv_with_allocator(
      table, pcp_allocator_system(), argc, argv, config, out_positionals);
}

pcp_status_t pcp_config_parse_argv_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator, int argc,
    char** argv, void* config, pcp_string_list_t* out_positionals) {
  bool* list_seen = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, (table->field_count + 1) * sizeof(bool),
                           (void**)&list_seen),
      "out of memory");
  pcp_status_t status = parse_argv_impl(table, allocator, argc, argv, config,
                                        out_positionals, list_seen);
  pcp_allocator_free(allocator, list_seen);
  return status;
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

// Returns the nesting depth of |value| (scalars 0, {} 1), stopping early
// once |limit| is passed so a hostile file costs no more than the limit.
static size_t json_depth(json_t* value, size_t limit) {
  if (!json_is_object(value) && !json_is_array(value)) {
    return 0;
  }
  if (limit == 0) {
    return 1;
  }
  size_t deepest = 0;
  if (json_is_object(value)) {
    const char* key;
    json_t* child;
    json_object_foreach(value, key, child) {
      size_t d = json_depth(child, limit - 1);
      if (d > deepest) {
        deepest = d;
      }
      if (deepest >= limit) {
        break;
      }
    }
  } else {
    size_t index;
    json_t* child;
    json_array_foreach(value, index, child) {
      size_t d = json_depth(child, limit - 1);
      if (d > deepest) {
        deepest = d;
      }
      if (deepest >= limit) {
        break;
      }
    }
  }
  return deepest + 1;
}

static const char* json_type_name(json_t* value) {
  switch (json_typeof(value)) {
    case JSON_OBJECT:
      return "an object";
    case JSON_ARRAY:
      return "an array";
    case JSON_STRING:
      return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
      return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
      return "a boolean";
    case JSON_NULL:
      return "null";
  }
  return "a value";
}

static pcp_status_t apply_json_object(const pcp_config_table_t* table,
                                      pcp_allocator_t allocator,
                                      const char* table_name, json_t* object,
                                      void* config, const char* prefix,
                                      pcp_string_list_t* out_unknown_keys);

static pcp_status_t expected(const char* what, const char* type,
                             json_t* value) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: expected %s, got %s",
                         what, type, json_type_name(value));
}

static pcp_status_t apply_json_value(
    const pcp_config_table_t* table, pcp_allocator_t allocator,
    const char* table_name, const pcp_config_field_t* field, json_t* value,
    void* config, const char* path, pcp_string_list_t* out_unknown_keys) {
  char what[384];
  snprintf(what, sizeof(what), "%s: key '%s'", table_name, path);
  void* slot = field_ptr(config, field);
  // null means "not given": the field returns to its default (upstream's
  // optional fields are written as null in real configs).
  if (json_is_null(value)) {
    const pcp_config_field_t* target = alias_target(table, field);
    deinitialize_field(allocator, target, config);
    return initialize_field(table, allocator, target, config);
  }
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL:
      if (!json_is_boolean(value)) {
        return expected(what, "true or false", value);
      }
      *(bool*)slot = json_is_true(value);
      return pcp_ok_status();
    case PCP_CONFIG_TYPE_INT64: {
      if (!json_is_integer(value)) {
        return expected(what, "an integer", value);
      }
      json_int_t v = json_integer_value(value);
      char text[32];
      snprintf(text, sizeof(text), "%lld", (long long)v);
      PCP_RETURN_IF_ERROR_BARE(check_bounds(field, (double)v, text, what));
      *(int64_t*)slot = (int64_t)v;
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_DOUBLE: {
      if (!json_is_number(value)) {
        return expected(what, "a number", value);
      }
      double v = json_number_value(value);
      char text[32];
      format_number(v, text, sizeof(text));
      PCP_RETURN_IF_ERROR_BARE(check_bounds(field, v, text, what));
      *(double*)slot = v;
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_STRING:
      if (!json_is_string(value)) {
        return expected(what, "a string", value);
      }
      return set_string(allocator, slot, json_string_value(value), what);
    case PCP_CONFIG_TYPE_ENUM:
      if (!json_is_string(value)) {
        return expected(what, "a string", value);
      }
      return set_enum(field, slot, json_string_value(value), what);
    case PCP_CONFIG_TYPE_STRING_LIST: {
      if (!json_is_array(value)) {
        return expected(what, "an array of strings", value);
      }
      pcp_string_list_t* list = (pcp_string_list_t*)slot;
      pcp_string_list_deinitialize(list);
      size_t index;
      json_t* item;
      json_array_foreach(value, index, item) {
        if (!json_is_string(item)) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "%s[%zu]: expected a string, got %s", what,
                                 index, json_type_name(item));
        }
        PCP_RETURN_IF_ERROR_BARE(
            list_append(allocator, list, json_string_value(item), what));
      }
      return pcp_ok_status();
    }
    case PCP_CONFIG_TYPE_OBJECT:
      if (!json_is_object(value)) {
        return expected(what, "an object", value);
      }
      *(bool*)slot = true;
      return apply_json_object(field->object_table, allocator, table_name,
                               value, slot, path, out_unknown_keys);
  }
  return pcp_make_status(PCP_STATUS_INTERNAL, "%s: bad field type", what);
}

static pcp_status_t apply_json_object(const pcp_config_table_t* table,
                                      pcp_allocator_t allocator,
                                      const char* table_name, json_t* object,
                                      void* config, const char* prefix,
                                      pcp_string_list_t* out_unknown_keys) {
  const char* key;
  json_t* value;
  json_object_foreach(object, key, value) {
    char path[256];
    if (prefix && prefix[0]) {
      snprintf(path, sizeof(path), "%s.%s", prefix, key);
    } else {
      snprintf(path, sizeof(path), "%s", key);
    }
    const pcp_config_field_t* field =
        find_field(table, key, strlen(key), LOOKUP_JSON);
    if (!field) {
      if (out_unknown_keys) {
        list_adopt(out_unknown_keys, allocator);
        PCP_RETURN_IF_ERROR_BARE(
            pcp_string_list_append(out_unknown_keys, path));
      }
      continue;
    }
    if (field->flags & PCP_CONFIG_FLAG_RENAMED) {
      char renamed[128];
      json_key_of(alias_target(table, field)->name, renamed, sizeof(renamed));
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: key '%s' was renamed to '%s'", table_name,
                             path, renamed);
    }
    PCP_RETURN_IF_ERROR_BARE(apply_json_value(table, allocator, table_name,
                                              field, value, config, path,
                                              out_unknown_keys));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_config_parse_json(const pcp_config_table_t* table,
                                   const char* text, size_t byte_length,
                                   void* config,
                                   pcp_string_list_t* out_unknown_keys) {
  return pcp_config_parse_json_with_allocator(table, pcp_allocator_system(),
                                              text, byte_length, config,
                                              out_unknown_keys);
}

pcp_status_t pcp_config_parse_json_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator,
    const char* text, size_t byte_length, void* config,
    pcp_string_list_t* out_unknown_keys) {
  if (byte_length > PCP_CONFIG_MAX_FILE_BYTES) {
    return pcp_make_status(
        PCP_STATUS_RESOURCE_EXHAUSTED, "%s: JSON is %zu bytes; the limit is %u",
        table->name, byte_length, (unsigned)PCP_CONFIG_MAX_FILE_BYTES);
  }
  json_error_t error;
  // Duplicate keys are refused: with two values for one key, which one wins
  // is a silent surprise.
  json_t* root = json_loadb(text, byte_length, JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: invalid JSON at line %d column %d: %s",
                           table->name, error.line, error.column, error.text);
  }
  pcp_status_t status = pcp_ok_status();
  if (!json_is_object(root)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: expected a JSON object at the top level, "
                             "got %s",
                             table->name, json_type_name(root));
  } else if (json_depth(root, PCP_CONFIG_MAX_JSON_DEPTH) >
             PCP_CONFIG_MAX_JSON_DEPTH) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: JSON nests deeper than %d levels",
                             table->name, PCP_CONFIG_MAX_JSON_DEPTH);
  } else {
    status = apply_json_object(table, allocator, table->name, root, config, "",
                               out_unknown_keys);
  }
  json_decref(root);
  return status;
}

pcp_status_t pcp_config_load_json_file(const pcp_config_table_t* table,
                                       const char* path, void* config,
                                       pcp_string_list_t* out_unknown_keys) {
  return pcp_config_load_json_file_with_allocator(
      table, pcp_allocator_system(), path, config, out_unknown_keys);
}

pcp_status_t pcp_config_load_json_file_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator,
    const char* path, void* config, pcp_string_list_t* out_unknown_keys) {
  void* data = NULL;
  size_t byte_length = 0;
  PCP_RETURN_IF_ERROR(
      pcp_file_read_all(path, PCP_CONFIG_MAX_FILE_BYTES, &data, &byte_length),
      "loading %s", table->name);
  pcp_status_t status = pcp_config_parse_json_with_allocator(
      table, allocator, (const char*)data, byte_length, config,
      out_unknown_keys);
  pcp_libc_free(data);  // pcp_file_read_all's buffer: posix_memalign
  return status;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

static pcp_status_t validate_impl(const pcp_config_table_t* table,
                                  const char* table_name, const void* config,
                                  const char* prefix) {
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* field = &table->fields[i];
    if (is_alias(field)) {
      continue;
    }
    const void* slot = field_cptr(config, field);
    char key[128];
    json_key_of(field->name, key, sizeof(key));
    char path[256];
    snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "", key);
    if (field->flags & PCP_CONFIG_FLAG_REQUIRED) {
      bool missing = false;
      switch (field->type) {
        case PCP_CONFIG_TYPE_STRING:
          missing =
              *(char* const*)slot == NULL || (*(char* const*)slot)[0] == 0;
          break;
        case PCP_CONFIG_TYPE_STRING_LIST:
          missing = ((const pcp_string_list_t*)slot)->count == 0;
          break;
        case PCP_CONFIG_TYPE_OBJECT:
          missing = !*(const bool*)slot;
          break;
        default:
          // Numbers, bools and enums always hold a value (their default).
          break;
      }
      if (missing) {
        if ((field->flags & PCP_CONFIG_FLAG_JSON_ONLY) ||
            field->type == PCP_CONFIG_TYPE_OBJECT || prefix[0]) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "%s: missing required key '%s'", table_name,
                                 path);
        }
        // The flag names itself; a table prefix would only repeat the
        // command ("pcp --gateway: gateway: ...").
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "missing required flag '--%s'", field->name);
      }
    }
    if (field->type == PCP_CONFIG_TYPE_OBJECT && *(const bool*)slot) {
      PCP_RETURN_IF_ERROR_BARE(
          validate_impl(field->object_table, table_name, slot, path));
    }
    if (field->validate) {
      PCP_RETURN_IF_ERROR_BARE(field->validate(config, field));
    }
  }
  if (table->validate) {
    PCP_RETURN_IF_ERROR_BARE(table->validate(config));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_config_validate(const pcp_config_table_t* table,
                                 const void* config) {
  return validate_impl(table, table->name, config, "");
}

//===----------------------------------------------------------------------===//
// Help and dump
//===----------------------------------------------------------------------===//

static const char* value_name_of(const pcp_config_field_t* field, char* buffer,
                                 size_t capacity) {
  if (field->value_name) {
    return field->value_name;
  }
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL:
      return "";
    case PCP_CONFIG_TYPE_INT64:
      return "N";
    case PCP_CONFIG_TYPE_DOUBLE:
      return "X";
    case PCP_CONFIG_TYPE_ENUM:
      join_enum_values(field, "|", buffer, capacity);
      return buffer;
    case PCP_CONFIG_TYPE_STRING:
    case PCP_CONFIG_TYPE_STRING_LIST:
      return (field->flags & PCP_CONFIG_FLAG_ENV_NAME) ? "ENV" : "VALUE";
    case PCP_CONFIG_TYPE_OBJECT:
      return "{...}";
  }
  return "VALUE";
}

static const char* default_text_of(const pcp_config_field_t* field) {
  if (field->default_value) {
    if (field->default_value[0] == 0 &&
        (field->type == PCP_CONFIG_TYPE_STRING ||
         field->type == PCP_CONFIG_TYPE_STRING_LIST)) {
      return "\"\"";
    }
    return field->default_value;
  }
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL:
      return "false";
    case PCP_CONFIG_TYPE_INT64:
    case PCP_CONFIG_TYPE_DOUBLE:
      return "0";
    case PCP_CONFIG_TYPE_ENUM:
      return field->enum_values && field->enum_values[0] ? field->enum_values[0]
                                                         : "none";
    default:
      return "none";
  }
}

void pcp_config_print_help(const pcp_config_table_t* table, FILE* out) {
  enum { HELP_COLUMN = 30 };
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* field = &table->fields[i];
    if (field->flags & (PCP_CONFIG_FLAG_HIDDEN | PCP_CONFIG_FLAG_JSON_ONLY |
                        PCP_CONFIG_FLAG_RENAMED)) {
      continue;
    }
    if (field->type == PCP_CONFIG_TYPE_OBJECT) {
      continue;
    }
    char buffer[256];
    const char* value_name = value_name_of(field, buffer, sizeof(buffer));
    char left[320];
    int n = snprintf(left, sizeof(left), "  --%s%s%s", field->name,
                     value_name[0] ? " " : "", value_name);
    if (n < 0) {
      continue;
    }
    fputs(left, out);
    if (n < HELP_COLUMN) {
      fprintf(out, "%*s", HELP_COLUMN - n, "");
    } else {
      fprintf(out, "\n%*s", HELP_COLUMN, "");
    }
    fprintf(out, "%s", field->help ? field->help : "");
    if (is_alias(field)) {
      fprintf(out, " (alias of --%s)\n", alias_target(table, field)->name);
    } else if (field->flags & PCP_CONFIG_FLAG_REQUIRED) {
      fprintf(out, " (required)\n");
    } else {
      fprintf(out, " (default: %s)\n", default_text_of(field));
    }
  }
}

static json_t* dump_object(const pcp_config_table_t* table, const void* config);

static json_t* dump_field(const pcp_config_field_t* field, const void* config) {
  const void* slot = field_cptr(config, field);
  switch (field->type) {
    case PCP_CONFIG_TYPE_BOOL:
      return json_boolean(*(const bool*)slot);
    case PCP_CONFIG_TYPE_INT64:
      return json_integer((json_int_t) * (const int64_t*)slot);
    case PCP_CONFIG_TYPE_DOUBLE:
      return json_real(*(const double*)slot);
    case PCP_CONFIG_TYPE_STRING: {
      // ENV_NAME fields hold the variable's name, so printing the field
      // never reveals the secret itself.
      const char* value = *(char* const*)slot;
      return value ? json_string(value) : json_null();
    }
    case PCP_CONFIG_TYPE_ENUM: {
      int32_t index = *(const int32_t*)slot;
      if (!field->enum_values || index < 0) {
        return json_null();
      }
      for (int32_t i = 0; field->enum_values[i]; ++i) {
        if (i == index) {
          return json_string(field->enum_values[i]);
        }
      }
      return json_null();
    }
    case PCP_CONFIG_TYPE_STRING_LIST: {
      const pcp_string_list_t* list = (const pcp_string_list_t*)slot;
      json_t* array = json_array();
      for (size_t i = 0; array && i < list->count; ++i) {
        json_array_append_new(array, json_string(list->items[i]));
      }
      return array;
    }
    case PCP_CONFIG_TYPE_OBJECT:
      if (!*(const bool*)slot) {
        return json_null();
      }
      return dump_object(field->object_table, slot);
  }
  return json_null();
}

static json_t* dump_object(const pcp_config_table_t* table,
                           const void* config) {
  json_t* object = json_object();
  if (!object) {
    return NULL;
  }
  for (size_t i = 0; i < table->field_count; ++i) {
    const pcp_config_field_t* field = &table->fields[i];
    if (is_alias(field)) {
      continue;
    }
    char key[128];
    json_key_of(field->name, key, sizeof(key));
    json_object_set_new(object, key, dump_field(field, config));
  }
  return object;
}

void pcp_config_dump_json_sections(const pcp_config_section_t* sections,
                                   size_t section_count, FILE* out) {
  json_t* root = json_object();
  if (!root) {
    return;
  }
  for (size_t i = 0; i < section_count; ++i) {
    json_t* part = dump_object(sections[i].table, sections[i].config);
    json_object_set_new(root, sections[i].name, part ? part : json_null());
  }
  json_dumpf(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', out);
  json_decref(root);
}

void pcp_config_dump_json(const pcp_config_table_t* table, const void* config,
                          FILE* out) {
  json_t* object = dump_object(table, config);
  if (!object) {
    return;
  }
  json_dumpf(object, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', out);
  json_decref(object);
}

//===----------------------------------------------------------------------===//
// CLI errors
//===----------------------------------------------------------------------===//

// Both go through pcp_status_format_for_user: users read the message, not
// the code name or our source layout (PCP_LOG_LEVEL=debug shows those).
static void print_cli_status(const char* command, pcp_status_t status) {
  // Sized to the message: a compiler's diagnostics run to many kilobytes,
  // and their last lines (where the derived module's lines are traced back
  // to the user's ops) matter most.
  // A CLI's last words before exiting: the system allocator (no caller's
  // allocator is in reach, and failure falls back to the fixed buffer).
  pcp_allocator_t allocator = pcp_allocator_system();
  char fixed[2048];
  size_t length = pcp_status_format_for_user(status, NULL, 0);
  char* message = fixed;
  if (length >= sizeof(fixed)) {
    pcp_status_t oom =
        pcp_allocator_malloc(allocator, length + 1, (void**)&message);
    if (oom) {
      pcp_status_ignore(oom);
      message = fixed;
      length = sizeof(fixed) - 1;
    }
  }
  pcp_status_format_for_user(status, message, length + 1);
  fprintf(stderr, "pcp %s: %s\n", command, message);
  if (message != fixed)
    pcp_allocator_free(allocator, message);
}

int pcp_config_cli_usage_error(const char* command, pcp_status_t status) {
  print_cli_status(command, status);
  fprintf(stderr, "Try 'pcp %s --help'.\n", command);
  pcp_status_ignore(status);
  return 2;
}

int pcp_config_cli_failure(const char* command, pcp_status_t status) {
  print_cli_status(command, status);
  pcp_status_ignore(status);
  return 1;
}
