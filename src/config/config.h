// SPDX-License-Identifier: Apache-2.0
//
// config: one table per config struct drives CLI parsing, JSON parsing,
// defaults, bounds, validation, --help and --dump-config (Redis's
// static_configs[] shape; no constructor-time registration).
//
// A table lists fields of a plain C struct by offset. The same field is
// `--device-id 3` / `--device-id=3` on the command line and `"device_id": 3`
// in JSON (dashes and underscores are interchangeable in names). Defaults are
// written as text and parsed exactly like user input, so --help shows what
// the parser will accept.
//
// Limits: JSON config files are capped at 1 MiB (as upstream), JSON nesting
// at 64 levels, a string value at 64 KiB, a string list at 4096 items.
// Unknown JSON keys are ignored (upstream semantics) but reported through
// |out_unknown_keys| so a caller can warn; unknown CLI flags are an error.
//
// Ownership: STRING and STRING_LIST fields are heap-owned by the struct once
// parsed; release them with pcp_config_deinitialize. The entry points below
// allocate from pcp_allocator_system(); their _with_allocator forms take the
// allocator (STYLE.md s.3.5) and the struct is then released with the same
// allocator. Thread-compatible.

#ifndef PCP_CONFIG_CONFIG_H_
#define PCP_CONFIG_CONFIG_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PCP_CONFIG_MAX_FILE_BYTES (1u << 20)
#define PCP_CONFIG_MAX_JSON_DEPTH 64
#define PCP_CONFIG_MAX_STRING_BYTES (64u << 10)
#define PCP_CONFIG_MAX_LIST_ITEMS 4096

typedef enum pcp_config_type_e {
  PCP_CONFIG_TYPE_BOOL = 0,         // bool; a bare --flag means true
  PCP_CONFIG_TYPE_INT64 = 1,        // int64_t, bounded by [min, max]
  PCP_CONFIG_TYPE_DOUBLE = 2,       // double, bounded by [min, max]
  PCP_CONFIG_TYPE_STRING = 3,       // char* (owned), NULL when unset
  PCP_CONFIG_TYPE_ENUM = 4,         // int32_t index into |enum_values|
  PCP_CONFIG_TYPE_STRING_LIST = 5,  // pcp_string_list_t; each flag appends
  // A nested JSON object (JSON only) described by |object_table|; |offset|
  // is the nested struct, whose first member must be `bool present` (set
  // when the key holds an object, cleared by null). Nested REQUIRED fields
  // and validate hooks apply only while it is present.
  PCP_CONFIG_TYPE_OBJECT = 6,
} pcp_config_type_t;

// Repeated flags (`--input a --input b`) collect here, in order.
typedef struct pcp_string_list_t {
  char** items;  // owned
  size_t count;
  // Where items come from. Unset ({NULL, NULL}): the system allocator, so a
  // zeroed list works; an empty unset list that a config parse appends to
  // takes the parse's allocator. Kept across pcp_string_list_deinitialize.
  pcp_allocator_t allocator;
} pcp_string_list_t;

typedef uint32_t pcp_config_flags_t;
enum pcp_config_flag_bits_e {
  PCP_CONFIG_FLAG_NONE = 0,
  // Must be given (on the CLI or in JSON); validation names it otherwise.
  // Checked for STRING (NULL or ""), STRING_LIST (empty) and OBJECT (absent);
  // numbers, bools and enums always hold a value, so give them a default.
  PCP_CONFIG_FLAG_REQUIRED = 1u << 0,
  // Only on the command line (mode switches, --help-like flags).
  PCP_CONFIG_FLAG_CLI_ONLY = 1u << 1,
  // Only in JSON files.
  PCP_CONFIG_FLAG_JSON_ONLY = 1u << 2,
  // The value names an environment variable holding a secret; --dump-config
  // prints the variable name, never its contents.
  PCP_CONFIG_FLAG_ENV_NAME = 1u << 3,
  // Hidden from --help (internal flags such as --supervisor-id).
  PCP_CONFIG_FLAG_HIDDEN = 1u << 4,
  // A second name for the field declared earlier in the table at the same
  // |offset| (upstream's --gateway-port for --api-port): it writes that
  // member, last one given wins. Aliases have no default of their own, are
  // skipped by initialize, deinitialize and dump, and --help shows
  // "alias of --<name>".
  PCP_CONFIG_FLAG_ALIAS = 1u << 5,
  // A former name of the field declared earlier at the same |offset|: giving
  // it (CLI, JSON or pcp_config_set) is INVALID_ARGUMENT "flag '--old' was
  // renamed to '--new'". Not shown in --help, never suggested.
  PCP_CONFIG_FLAG_RENAMED = 1u << 6,
};

struct pcp_config_field_t;
// |config| is the struct that holds the field (the nested struct for fields
// of an OBJECT). Returns INVALID_ARGUMENT naming the field on failure.
typedef pcp_status_t (*pcp_config_field_validate_fn_t)(
    const void* config, const struct pcp_config_field_t* field);

typedef struct pcp_config_field_t {
  const char* name;  // "device-id" (CLI --device-id, JSON device_id)
  pcp_config_type_t type;
  size_t offset;              // offsetof(struct, member)
  const char* default_value;  // text, parsed like input; NULL: zero/unset
  double min;                 // numeric bounds; ignored when min >= max
  double max;
  const char* const* enum_values;  // NULL-terminated names for ENUM
  pcp_config_flags_t flags;
  const char* value_name;  // "PATH", "N" for --help; NULL: from the type
  const char* help;        // one line
  pcp_config_field_validate_fn_t validate;  // optional extra check
  // OBJECT only: the table of the nested struct (offsets relative to it).
  const struct pcp_config_table_t* object_table;
} pcp_config_field_t;

typedef struct pcp_config_table_t {
  const char* name;  // "worker", "gateway config"; used in messages
  const pcp_config_field_t* fields;
  size_t field_count;
  // Optional whole-struct check after fields are set (cross-field rules).
  pcp_status_t (*validate)(const void* config);
} pcp_config_table_t;

// Sets every field to its default (parsed from text). Every field the table
// describes is zeroed first (the table does not know the struct's size, so
// members outside it are left alone; callers zero the struct when it holds
// any). Fails only when a default does not parse (a bug in the table).
PCP_MUST_USE_RESULT pcp_status_t
pcp_config_initialize(const pcp_config_table_t* table, void* config);

// Frees owned strings and lists; the struct may be initialized again.
void pcp_config_deinitialize(const pcp_config_table_t* table, void* config);

// Sets one field from text as if given on the CLI (`name` without dashes).
// INVALID_ARGUMENT names the field and the problem; NOT_FOUND when |name| is
// not in the table.
PCP_MUST_USE_RESULT pcp_status_t pcp_config_set(const pcp_config_table_t* table,
                                                void* config, const char* name,
                                                const char* value);

// Parses argv[0..argc) (argv[0] is NOT the program name: pass what follows
// the subcommand). Accepts `--name value`, `--name=value`, bare `--flag` for
// BOOL, and `--` (everything after it is positional). Non-flag arguments are
// appended to |out_positionals| (may be NULL: positionals are then an error).
// Unknown flags and missing values are INVALID_ARGUMENT with a one-line
// message ("unknown flag '--foo'").
PCP_MUST_USE_RESULT pcp_status_t
pcp_config_parse_argv(const pcp_config_table_t* table, int argc, char** argv,
                      void* config, pcp_string_list_t* out_positionals);

// Applies a JSON object (text of |byte_length| bytes) on top of |config|.
// Keys not in the table are ignored and, when |out_unknown_keys| is not NULL,
// appended to it (nested ones as "parent.key"). `null` returns a field to its
// default; duplicate keys are INVALID_ARGUMENT. Wrong types and out-of-range
// values are INVALID_ARGUMENT naming the key ("gateway config: key 'api_port':
// expected an integer").
PCP_MUST_USE_RESULT pcp_status_t pcp_config_parse_json(
    const pcp_config_table_t* table, const char* text, size_t byte_length,
    void* config, pcp_string_list_t* out_unknown_keys);

// Reads |path| (capped at PCP_CONFIG_MAX_FILE_BYTES) and parses it as above.
PCP_MUST_USE_RESULT pcp_status_t
pcp_config_load_json_file(const pcp_config_table_t* table, const char* path,
                          void* config, pcp_string_list_t* out_unknown_keys);

// Checks REQUIRED fields, per-field validate hooks, then table->validate,
// recursing into present OBJECT fields. Returns the first failure.
PCP_MUST_USE_RESULT pcp_status_t
pcp_config_validate(const pcp_config_table_t* table, const void* config);

// Prints "  --name VALUE   help (default: x)" for every visible field.
void pcp_config_print_help(const pcp_config_table_t* table, FILE* out);

// Prints the effective config as a JSON object (keys with underscores).
void pcp_config_dump_json(const pcp_config_table_t* table, const void* config,
                          FILE* out);

// One named part of a combined dump.
typedef struct pcp_config_section_t {
  const char* name;  // JSON key of this part
  const pcp_config_table_t* table;
  const void* config;
} pcp_config_section_t;

// Prints {"<name>": {...}, ...}: several tables as one JSON object (a role's
// CLI flags next to the config file it loaded).
void pcp_config_dump_json_sections(const pcp_config_section_t* sections,
                                   size_t section_count, FILE* out);

// The entry points above with the allocator of every string and list item
// the struct (and the positional or unknown-key list) owns; they use
// pcp_allocator_system(). Out of memory is RESOURCE_EXHAUSTED, and what was
// set before the failure stays owned by the struct.
PCP_MUST_USE_RESULT pcp_status_t pcp_config_initialize_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator, void* config);
void pcp_config_deinitialize_with_allocator(const pcp_config_table_t* table,
                                            pcp_allocator_t allocator,
                                            void* config);
PCP_MUST_USE_RESULT pcp_status_t pcp_config_set_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator, void* config,
    const char* name, const char* value);
PCP_MUST_USE_RESULT pcp_status_t pcp_config_parse_argv_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator, int argc,
    char** argv, void* config, pcp_string_list_t* out_positionals);
PCP_MUST_USE_RESULT pcp_status_t pcp_config_parse_json_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator,
    const char* text, size_t byte_length, void* config,
    pcp_string_list_t* out_unknown_keys);
PCP_MUST_USE_RESULT pcp_status_t pcp_config_load_json_file_with_allocator(
    const pcp_config_table_t* table, pcp_allocator_t allocator,
    const char* path, void* config, pcp_string_list_t* out_unknown_keys);

// String lists: items come from the list's allocator (see above).
PCP_MUST_USE_RESULT pcp_status_t pcp_string_list_append(pcp_string_list_t* list,
                                                        const char* value);
void pcp_string_list_deinitialize(pcp_string_list_t* list);

// "Did you mean": the candidate closest to |word| by edit distance
// (transpositions count once; '-' and '_' are equal), or NULL when none is
// within a typo's reach (1 edit for words up to 4 bytes, 2 up to 9, else 3).
const char* pcp_config_suggest(const char* word, const char* const* candidates,
                               size_t candidate_count);

// The visible CLI flag of |table| (name without dashes) closest to |name|,
// or NULL; hidden, JSON-only and renamed fields are never suggested.
const char* pcp_config_suggest_flag(const pcp_config_table_t* table,
                                    const char* name);

// True when |name| (without dashes) is a flag of |table| on the CLI.
bool pcp_config_has_flag(const pcp_config_table_t* table, const char* name);

// The edit distance pcp_config_suggest uses (exposed for tests).
size_t pcp_config_edit_distance(const char* a, const char* b);

// CLI exit codes, the same for every command: 0 done, 1 the work failed
// (a file, the network, the program), 2 usage (unknown flag, bad or
// missing value).
//
// Prints "pcp <command>: <message>" and "Try 'pcp <command> --help'." to
// stderr, consumes |status|, and returns 2. The message is
// pcp_status_format_for_user's: no code name, no source location unless
// PCP_LOG_LEVEL=debug.
int pcp_config_cli_usage_error(const char* command, pcp_status_t status);

// Prints "pcp <command>: <message>" (as above), consumes |status|, returns
// 1: the work failed.
int pcp_config_cli_failure(const char* command, pcp_status_t status);

#ifdef __cplusplus
}
#endif

#endif  // PCP_CONFIG_CONFIG_H_
