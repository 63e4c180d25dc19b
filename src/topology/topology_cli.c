// SPDX-License-Identifier: Apache-2.0
//
// `pcp topo ...`: one table of sub-subcommands. Core commands live here
// (betti, subdivide); the solving half adds its own (check, models) as one
// line each in kSubcommands.
//
// Exit codes: 0 success, 1 a negative verdict (used by check), 2 a usage or
// input error. Input files never reach an assert: every malformed shape is a
// message naming the problem.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config/config.h"
#include "topology/core_impl.h"
#include "topology/protocols_impl.h"

// Input limits for `betti`, checked before any allocation that depends on
// them. The face bound is the real one: faces grow as 2^n per facet.
#define BETTI_MAX_FILE_BYTES (16u << 20)
#define BETTI_MAX_FACETS 1000000u
#define BETTI_MAX_FACET_VERTICES 16u
#define BETTI_MAX_TOTAL_FACES (1u << 22)
#define BETTI_MAX_NAME_BYTES 1024u

// `subdivide` refuses requests whose simplex bound (facets x 2^(N+1): every
// face of every facet is listed) passes this; 8M keeps memory near 1 GB and
// time under about 12 s on one core (Ch^3 of the tetrahedron: 6.75M).
#define SUBDIVIDE_MAX_SIMPLICES 8000000u
#define SUBDIVIDE_MAX_DIM 6

typedef int (*topo_main_fn_t)(int argc, char** argv);

typedef struct topo_subcommand_t {
  const char* name;
  topo_main_fn_t main;
  const char* summary;
} topo_subcommand_t;

static int betti_main(int argc, char** argv);
static int subdivide_main(int argc, char** argv);

// One line per subcommand, sorted by name.
static const topo_subcommand_t kSubcommands[] = {
    {"betti", betti_main,
     "Betti numbers over GF(p) of a complex in a JSON file"},
    {"check", pcp_topology_cli_check_main,
     "decide a protocol model (native or Z3) and explain obstructions"},
    {"models", pcp_topology_cli_models_main, "list the protocol models"},
    {"sim", pcp_topology_cli_sim_main,
     "two-node trace simulator: seeded, exhaustive, replay, shrink"},
    {"subdivide", subdivide_main,
     "iterated barycentric or chromatic subdivision of a simplex"},
    {NULL, NULL, NULL},
};

static void print_topo_usage(FILE* out) {
  fprintf(out, "usage: pcp topo <subcommand> [args]\n\nsubcommands:\n");
  for (const topo_subcommand_t* c = kSubcommands; c->name; ++c) {
    fprintf(out, "  %-10s %s\n", c->name, c->summary);
  }
  fprintf(out, "\n'pcp topo <subcommand> --help' lists its flags.\n");
}

int pcp_topology_cli_main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    print_topo_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const topo_subcommand_t* c = kSubcommands; c->name; ++c) {
    if (strcmp(argv[1], c->name) == 0)
      return c->main(argc - 1, argv + 1);
  }
  const char* names[PCP_ARRAYSIZE(kSubcommands)];
  size_t count = 0;
  for (const topo_subcommand_t* c = kSubcommands; c->name; ++c) {
    names[count++] = c->name;
  }
  const char* suggestion = pcp_config_suggest(argv[1], names, count);
  if (suggestion) {
    fprintf(stderr, "pcp topo: unknown subcommand '%s' (did you mean '%s'?)\n",
            argv[1], suggestion);
  } else {
    fprintf(stderr, "pcp topo: unknown subcommand '%s'\n", argv[1]);
  }
  fprintf(stderr, "Try 'pcp topo --help'.\n");
  return 2;
}

// Prints "pcp topo <command>: <message>" and returns 1: the work (reading
// the complex, subdividing) failed; usage errors exit 2 before it.
static int input_error(const char* command, pcp_status_t status) {
  char buffer[1024];
  snprintf(buffer, sizeof(buffer), "topo %s", command);
  return pcp_config_cli_failure(buffer, status);
}

//===----------------------------------------------------------------------===//
// betti
//===----------------------------------------------------------------------===//

typedef struct betti_options_t {
  int64_t field;
  bool help;
} betti_options_t;

#define BETTI_OFFSET(member) offsetof(betti_options_t, member)

static const pcp_config_field_t kBettiFields[] = {
    {.name = "field",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = BETTI_OFFSET(field),
     .default_value = "2",
     .min = 0,
     .max = 4294967295.0,
     .value_name = "P",
     .help = "compute over GF(P); P must be a prime <= 65521"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = BETTI_OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kBettiTable = {
    .name = "topo betti",
    .fields = kBettiFields,
    .field_count = PCP_ARRAYSIZE(kBettiFields),
};

// Vertex names: each distinct name (a string, or an integer) becomes a
// vertex of its own colour, so a facet is chromatic exactly when it does
// not repeat a name. Strings are borrowed from the parsed JSON document.
typedef struct name_table_t {
  pcp_topology_vertex_list_t vertices;
  pcp_topology_index_table_t index;
} name_table_t;

static bool name_eq(const void* context, uint32_t value, const void* key) {
  const pcp_topology_vertex_list_t* list =
      (const pcp_topology_vertex_list_t*)context;
  const pcp_topology_vertex_t* v = &list->items[value];
  const pcp_topology_vertex_t* k = (const pcp_topology_vertex_t*)key;
  return v->label.kind == k->label.kind &&
         pcp_topology_label_compare(&v->label, &k->label) == 0;
}

static pcp_status_t name_intern(name_table_t* names, pcp_topology_label_t label,
                                pcp_topology_vertex_t* out_vertex) {
  pcp_topology_vertex_t key = {{0, 0}, label};
  uint64_t hash = pcp_topology_label_hash(&label);
  uint32_t id = 0;
  if (!pcp_topology_index_table_find(&names->index, hash, name_eq,
                                     &names->vertices, &key, &id)) {
    id = (uint32_t)names->vertices.count;
    key.color = pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, id);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_vertex_list_append(&names->vertices, &key));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_index_table_insert(&names->index, hash, id));
  }
  *out_vertex = names->vertices.items[id];
  return pcp_ok_status();
}

static void describe_name(const pcp_topology_vertex_t* vertex, char* buffer,
                          size_t capacity) {
  if (vertex->label.kind == PCP_TOPOLOGY_LABEL_SYMBOL) {
    snprintf(buffer, capacity, "\"%s\"", vertex->label.symbol);
  } else {
    snprintf(buffer, capacity, "%lld", (long long)vertex->label.value);
  }
}

// Parses {"facets": [[v, ...], ...]} into |complex|. Every problem is an
// INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for the limits) naming the path,
// the facet index and the offending value.
static pcp_status_t load_facets(const char* path, json_t* root,
                                name_table_t* names,
                                pcp_topology_complex_t* complex) {
  if (!json_is_object(root)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: expected a JSON object {\"facets\": [...]}",
                           path);
  }
  json_t* facets = json_object_get(root, "facets");
  if (!facets) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: missing the \"facets\" key", path);
  }
  if (!json_is_array(facets)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: \"facets\" must be an array of arrays", path);
  }
  size_t facet_count = json_array_size(facets);
  if (facet_count > BETTI_MAX_FACETS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%s: %zu facets (limit %u)", path, facet_count,
                           BETTI_MAX_FACETS);
  }
  uint64_t total_faces = 0;
  pcp_topology_vertex_t vertices[BETTI_MAX_FACET_VERTICES];
  for (size_t f = 0; f < facet_count; ++f) {
    json_t* facet = json_array_get(facets, f);
    if (!json_is_array(facet)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: facet %zu is not an array of vertex names",
                             path, f);
    }
    size_t n = json_array_size(facet);
    if (n == 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s: facet %zu is empty", path, f);
    }
    if (n > BETTI_MAX_FACET_VERTICES) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "%s: facet %zu has %zu vertices (limit %u)", path,
                             f, n, BETTI_MAX_FACET_VERTICES);
    }
    total_faces += (uint64_t)1 << n;
    if (total_faces > BETTI_MAX_TOTAL_FACES) {
      return pcp_make_status(
          PCP_STATUS_RESOURCE_EXHAUSTED,
          "%s: the facets up to %zu have more than %u faces in total (the "
          "limit)",
          path, f, BETTI_MAX_TOTAL_FACES);
    }
    for (size_t i = 0; i < n; ++i) {
      json_t* name = json_array_get(facet, i);
      pcp_topology_label_t label;
      if (json_is_string(name)) {
        if (json_string_length(name) > BETTI_MAX_NAME_BYTES) {
          return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                 "%s: facet %zu: a vertex name is longer than "
                                 "%u bytes",
                                 path, f, BETTI_MAX_NAME_BYTES);
        }
        if (strlen(json_string_value(name)) != json_string_length(name)) {
          return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "%s: facet %zu: a vertex name contains NUL",
                                 path, f);
        }
        label = pcp_topology_make_symbol(json_string_value(name));
      } else if (json_is_integer(name)) {
        label = pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT,
                                        (int64_t)json_integer_value(name));
      } else {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: facet %zu: vertex %zu is neither a string "
                               "nor an integer",
                               path, f, i);
      }
      PCP_RETURN_IF_ERROR_BARE(name_intern(names, label, &vertices[i]));
    }
    pcp_status_t status =
        pcp_topology_simplex_validate(pcp_topology_make_simplex(vertices, n));
    if (status) {
      pcp_status_ignore(status);
      // Colours are names here, so a shared colour is a repeated name.
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
          if (pcp_topology_vertex_equal(&vertices[i], &vertices[j])) {
            char text[BETTI_MAX_NAME_BYTES + 8];
            describe_name(&vertices[i], text, sizeof(text));
            return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR,
                                            "%s: facet %zu repeats vertex %s",
                                            path, f, text);
          }
        }
      }
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
        complex, pcp_topology_make_simplex(vertices, n), NULL));
  }
  return pcp_ok_status();
}

static pcp_status_t betti_run(const char* path, uint32_t prime,
                              pcp_allocator_t allocator,
                              pcp_topology_betti_t* out_betti) {
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(path, BETTI_MAX_FILE_BYTES, &data, &length);
  if (status) {
    const char* message = pcp_status_message(status);
    pcp_status_t named = pcp_make_status(
        pcp_status_code(status), "%s: %s", path,
        message[0] ? message : pcp_status_code_string(pcp_status_code(status)));
    pcp_status_ignore(status);
    return named;
  }
  json_error_t error;
  json_t* root = json_loadb((const char*)data, length,
                            JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &error);
  pcp_libc_free(data);  // pcp_file_read_all's buffer
  if (!root) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: invalid JSON at line %d column %d: %s", path,
                           error.line, error.column, error.text);
  }
  name_table_t names;
  pcp_topology_vertex_list_initialize(allocator, &names.vertices);
  pcp_topology_index_table_initialize(allocator, &names.index);
  pcp_topology_complex_t* complex = NULL;
  status = pcp_topology_complex_create(allocator, &complex);
  if (!status)
    status = load_facets(path, root, &names, complex);
  if (!status)
    status = pcp_topology_complex_betti(complex, prime, out_betti);
  pcp_topology_complex_release(complex);
  pcp_topology_index_table_deinitialize(&names.index);
  pcp_topology_vertex_list_deinitialize(&names.vertices);
  json_decref(root);
  return status;
}

static int betti_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  betti_options_t options;
  pcp_string_list_t positionals = {0};
  pcp_status_t status = pcp_config_initialize(&kBettiTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kBettiTable, argc - 1, argv + 1, &options,
                                   &positionals);
  }
  if (!status && options.help) {
    printf(
        "usage: pcp topo betti FILE [--field P]\n\n"
        "FILE is JSON {\"facets\": [[v, ...], ...]} with vertex names given "
        "as strings or\nintegers. Prints betti=[b0,b1,...] (unreduced: b0 "
        "counts components).\n\nflags:\n");
    pcp_config_print_help(&kBettiTable, stdout);
    pcp_string_list_deinitialize(&positionals);
    pcp_config_deinitialize(&kBettiTable, &options);
    return 0;
  }
  if (!status && positionals.count != 1) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             positionals.count
                                 ? "expected one FILE, got %zu"
                                 : "missing the FILE with {\"facets\": [...]}",
                             positionals.count);
  }
  if (!status && options.field > 0xFFFFFFFFll) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--field %lld is out of range",
                             (long long)options.field);
  }
  if (!status) {
    status = pcp_topology_field_prime_validate((uint32_t)options.field);
    if (status) {
      pcp_status_ignore(status);
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--field %lld: not a prime field (need a prime "
                               "P with 2 <= P <= %u)",
                               (long long)options.field,
                               PCP_TOPOLOGY_MAX_FIELD_PRIME);
    }
  }
  if (status) {
    pcp_string_list_deinitialize(&positionals);
    pcp_config_deinitialize(&kBettiTable, &options);
    return pcp_config_cli_usage_error("topo betti", status);
  }
  pcp_topology_betti_t betti;
  status = betti_run(positionals.items[0], (uint32_t)options.field, allocator,
                     &betti);
  pcp_string_list_deinitialize(&positionals);
  pcp_config_deinitialize(&kBettiTable, &options);
  if (status)
    return input_error("betti", status);
  printf("betti=[");
  for (uint32_t k = 0; k < betti.count; ++k) {
    printf("%s%llu", k ? "," : "", (unsigned long long)betti.values[k]);
  }
  printf("]\n");
  return 0;
}

//===----------------------------------------------------------------------===//
// subdivide
//===----------------------------------------------------------------------===//

// --kind and --dim are strings so that REQUIRED can tell "unset" apart
// (the config table only tracks presence for strings); they are parsed below.
typedef struct subdivide_options_t {
  char* kind_name;
  char* dim_text;
  int32_t kind;  // index into kKindNames, from kind_name
  int64_t dim;
  int64_t rounds;
  bool dot;
  bool help;
} subdivide_options_t;

static const char* const kKindNames[] = {"barycentric", "chromatic", NULL};

#define SUBDIVIDE_OFFSET(member) offsetof(subdivide_options_t, member)

static const pcp_config_field_t kSubdivideFields[] = {
    {.name = "kind",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = SUBDIVIDE_OFFSET(kind_name),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "KIND",
     .help = "barycentric or chromatic (standard chromatic subdivision)"},
    {.name = "dim",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = SUBDIVIDE_OFFSET(dim_text),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "N",
     .help = "subdivide the standard N-simplex (processes 0..N), N <= 6"},
    {.name = "rounds",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = SUBDIVIDE_OFFSET(rounds),
     .default_value = "1",
     .min = 0,
     .max = 16,
     .value_name = "R",
     .help = "iterate R times (0: identity)"},
    {.name = "dot",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SUBDIVIDE_OFFSET(dot),
     .default_value = "false",
     .help = "print the 1-skeleton as Graphviz DOT instead of the counts"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SUBDIVIDE_OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kSubdivideTable = {
    .name = "topo subdivide",
    .fields = kSubdivideFields,
    .field_count = PCP_ARRAYSIZE(kSubdivideFields),
};

// Facets of one round on an N-simplex: (N+1)! for barycentric, the ordered
// set partitions (Fubini numbers) for chromatic. Each round multiplies.
static uint64_t facets_per_round(int32_t kind, int64_t dim) {
  static const uint64_t kFubini[] = {1, 3, 13, 75, 541, 4683, 47293};
  if (kind == 1)
    return kFubini[dim];
  uint64_t f = 1;
  for (int64_t i = 2; i <= dim + 1; ++i) f *= (uint64_t)i;
  return f;
}

static int subdivide_main(int argc, char** argv) {
  subdivide_options_t options;
  pcp_status_t status = pcp_config_initialize(&kSubdivideTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kSubdivideTable, argc - 1, argv + 1,
                                   &options, NULL);
  }
  if (!status && options.help) {
    printf(
        "usage: pcp topo subdivide --kind barycentric|chromatic --dim N "
        "[--rounds R] [--dot]\n\nPrints vertices=V facets=F for the "
        "subdivided standard N-simplex, or its\n1-skeleton as DOT.\n\n"
        "flags:\n");
    pcp_config_print_help(&kSubdivideTable, stdout);
    pcp_config_deinitialize(&kSubdivideTable, &options);
    return 0;
  }
  if (!status)
    status = pcp_config_validate(&kSubdivideTable, &options);
  if (!status) {
    options.kind = -1;
    for (int32_t i = 0; kKindNames[i]; ++i) {
      if (strcmp(options.kind_name, kKindNames[i]) == 0)
        options.kind = i;
    }
    if (options.kind < 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--kind '%s' (allowed: barycentric, chromatic)",
                               options.kind_name);
    }
  }
  if (!status && (!pcp_string_view_parse_int64(
                      pcp_make_cstring_view(options.dim_text), &options.dim) ||
                  options.dim < 0 || options.dim > SUBDIVIDE_MAX_DIM)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--dim '%s': expected an integer in [0, %d]",
                             options.dim_text, SUBDIVIDE_MAX_DIM);
  }
  if (!status) {
    uint64_t estimate = (uint64_t)1 << (options.dim + 1);
    uint64_t per_round = facets_per_round(options.kind, options.dim);
    for (int64_t r = 0;
         r < options.rounds && estimate <= SUBDIVIDE_MAX_SIMPLICES; ++r) {
      estimate *= per_round;
    }
    if (estimate > SUBDIVIDE_MAX_SIMPLICES) {
      status = pcp_make_status(
          PCP_STATUS_RESOURCE_EXHAUSTED,
          "--dim %lld --rounds %lld would list more than %u simplices (the "
          "limit)",
          (long long)options.dim, (long long)options.rounds,
          SUBDIVIDE_MAX_SIMPLICES);
    }
  }
  if (status) {
    pcp_config_deinitialize(&kSubdivideTable, &options);
    return pcp_config_cli_usage_error("topo subdivide", status);
  }
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_topology_complex_t* simplex = NULL;
  pcp_topology_subdivision_t* sub = NULL;
  pcp_topology_vertex_t vertices[SUBDIVIDE_MAX_DIM + 1];
  for (int64_t i = 0; i <= options.dim; ++i) {
    vertices[i] = pcp_topology_make_vertex(
        pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, (uint32_t)i),
        pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, i));
  }
  status = pcp_topology_complex_create(allocator, &simplex);
  if (!status) {
    status = pcp_topology_complex_add(
        simplex, pcp_topology_make_simplex(vertices, (size_t)options.dim + 1),
        NULL);
  }
  pcp_topology_subdivision_kind_t kind =
      options.kind == 1 ? PCP_TOPOLOGY_SUBDIVISION_CHROMATIC
                        : PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC;
  if (!status) {
    status = pcp_topology_subdivision_create(
        simplex, kind, (uint32_t)options.rounds, allocator, &sub);
  }
  int exit_code = 0;
  if (!status && options.dot) {
    pcp_string_builder_t builder;
    pcp_string_builder_initialize(allocator, 0, &builder);
    char name[64];
    snprintf(name, sizeof(name), "%s-dim%lld-rounds%lld",
             kKindNames[options.kind], (long long)options.dim,
             (long long)options.rounds);
    status = pcp_topology_complex_format_dot(
        pcp_topology_subdivision_complex(sub), name, &builder);
    if (!status)
      fputs(pcp_string_builder_cstring(&builder), stdout);
    pcp_string_builder_deinitialize(&builder);
  } else if (!status) {
    size_t vertex_count = 0, facet_count = 0;
    pcp_topology_subdivision_counts(sub, &vertex_count, &facet_count);
    printf("vertices=%zu facets=%zu\n", vertex_count, facet_count);
  }
  if (status)
    exit_code = input_error("subdivide", status);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(simplex);
  pcp_config_deinitialize(&kSubdivideTable, &options);
  return exit_code;
}
