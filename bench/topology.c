// SPDX-License-Identifier: Apache-2.0
//
// bench/topology: Betti numbers over GF(2), pcp_topology_complex_betti
// against GUDHI (pip `gudhi`, the pinned wheel in
// tools/setup/requirements-test.txt), on the same complexes in the same run.
//
// Complexes (both sides get the same simplices, vertex for vertex):
//   ch5:           Ch^5(triangle), the fifth iterated standard chromatic
//                  subdivision (371293 triangles, ~1.1M simplices), a disk;
//   ch4-punctured: Ch^4(triangle) without every 7th listed triangle, so
//                  the first Betti number is large and both sides must
//                  count the holes, not just say "contractible".
//
// What is timed is the same work on both sides: from the listed simplices
// to the Betti numbers, face enumeration included. Ours is one
// pcp_topology_complex_betti call; GUDHI's is a SimplexTree filled by
// insert_batch (which adds every face), compute_persistence over GF(2) with
// every filtration value 0 (so persistent homology is homology) and
// betti_numbers() (bench/topology_baseline.py). File I/O and Python start-up
// are not timed. Both sides are single-threaded (the gudhi wheel has no TBB).
// The machine is shared, so the two sides alternate: each of ROUNDS rounds
// times ours (the median of the runs that fit in a short budget, at least
// one), then GUDHI once per complex in a fresh process; each side's figure
// is the median over the rounds, so a burst of load hits both alike.
//
// Fails (exit 1) when the Betti numbers differ or when ours is slower than
// GUDHI on any complex (goal: ratio >= 1). Prints
// `topology ratio=<GUDHI time / ours>` last, the smallest over the complexes.

#include "topology/topology.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#ifndef PCP_SOURCE_DIR
#define PCP_SOURCE_DIR "."
#endif

#define PRIME 2
#define ROUNDS 3
#define OUR_BUDGET_NS 500000000ll
#define MAX_RUNS 200
#define PUNCTURE_EVERY 7
#define GOAL_RATIO 1.0

static pcp_clock_t g_clock;

static double seconds_since(int64_t start_ns) {
  return (double)(pcp_clock_now_ns(g_clock) - start_ns) * 1e-9;
}

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

typedef struct bench_complex_t {
  const char* name;
  pcp_topology_complex_t* complex;
  pcp_topology_betti_t ours;
  double ours_s[ROUNDS];  // per round: median of that round's runs
  int ours_runs;          // in all rounds
  char gudhi_betti[256];  // the same in every round, or the bench fails
  double gudhi_s[ROUNDS];
  double gudhi_build_s[ROUNDS];
  double gudhi_homology_s[ROUNDS];
  long gudhi_simplices;
} bench_complex_t;

static double median_of(const double* values, int count) {
  double sorted[MAX_RUNS];
  memcpy(sorted, values, (size_t)count * sizeof(double));
  qsort(sorted, (size_t)count, sizeof(double), compare_double);
  return sorted[count / 2];
}

// Ch^|rounds| of the triangle, copied out of its subdivision (the caller
// releases the result). Every |puncture_every|-th listed triangle is left
// out when |puncture_every| > 0.
static pcp_topology_complex_t* make_complex(uint32_t rounds,
                                            uint32_t puncture_every) {
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_topology_complex_t* triangle = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(allocator, &triangle));
  pcp_topology_vertex_t vertices[3];
  for (uint32_t i = 0; i < 3; ++i) {
    vertices[i] = pcp_topology_make_vertex(
        pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, i),
        pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, i));
  }
  PCP_CHECK_OK(pcp_topology_complex_add(
      triangle, pcp_topology_make_simplex(vertices, 3), NULL));
  pcp_topology_subdivision_t* sub = NULL;
  PCP_CHECK_OK(pcp_topology_subdivision_create(
      triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, rounds, allocator, &sub));
  const pcp_topology_complex_t* source = pcp_topology_subdivision_complex(sub);
  pcp_topology_complex_t* out = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(allocator, &out));
  size_t triangles = 0;
  for (size_t i = 0; i < pcp_topology_complex_count(source); ++i) {
    pcp_topology_simplex_t s = pcp_topology_complex_simplex(source, i);
    if (s.count == 3 && puncture_every &&
        triangles++ % puncture_every == puncture_every - 1) {
      continue;
    }
    PCP_CHECK_OK(pcp_topology_complex_append(out, s));
  }
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(triangle);
  return out;
}

static int compare_vertex(const void* a, const void* b) {
  return pcp_topology_vertex_compare(a, b);
}

// Writes the listed simplices of |complex| to |dir|/dimD.i32 (rows of D+1
// little-endian int32 vertex numbers; numbers are positions among the
// sorted vertices). Returns 0 on success.
static int write_complex(const pcp_topology_complex_t* complex,
                         const char* dir) {
  if (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) {
    fprintf(stderr, "topology: cannot create %s\n", dir);
    return 1;
  }
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(pcp_allocator_system(), &vertices);
  PCP_CHECK_OK(pcp_topology_complex_vertices(complex, &vertices));
  int32_t top = pcp_topology_complex_dimension(complex);
  for (int32_t d = 0; d <= top; ++d) {
    char path[4200];
    int n = snprintf(path, sizeof(path), "%s/dim%d.i32", dir, (int)d);
    FILE* f = n > 0 && (size_t)n < sizeof(path) ? fopen(path, "wb") : NULL;
    if (!f) {
      fprintf(stderr, "topology: cannot write %s\n", path);
      return 1;
    }
    for (size_t i = 0; i < pcp_topology_complex_count(complex); ++i) {
      pcp_topology_simplex_t s = pcp_topology_complex_simplex(complex, i);
      if (s.count != (uint32_t)d + 1)
        continue;
      for (uint32_t v = 0; v < s.count; ++v) {
        const pcp_topology_vertex_t* found =
            bsearch(&s.vertices[v], vertices.items, vertices.count,
                    sizeof(vertices.items[0]), compare_vertex);
        PCP_ASSERT(found);
        int32_t number = (int32_t)(found - vertices.items);
        // x86-64 and aarch64 Linux are little-endian, as the reader says.
        fwrite(&number, sizeof(number), 1, f);
      }
    }
    if (fclose(f) != 0) {
      fprintf(stderr, "topology: cannot write %s\n", path);
      return 1;
    }
  }
  pcp_topology_vertex_list_deinitialize(&vertices);
  return 0;
}

// One round of ours on |c|: runs for OUR_BUDGET_NS (at least one run).
static void time_ours(bench_complex_t* c, int round) {
  static double times[MAX_RUNS];
  int runs = 0;
  int64_t budget_start = pcp_clock_now_ns(g_clock);
  while (
      runs < MAX_RUNS &&
      (runs < 1 || pcp_clock_now_ns(g_clock) - budget_start < OUR_BUDGET_NS)) {
    int64_t t = pcp_clock_now_ns(g_clock);
    PCP_CHECK_OK(pcp_topology_complex_betti(c->complex, PRIME, &c->ours));
    times[runs++] = seconds_since(t);
  }
  c->ours_s[round] = median_of(times, runs);
  c->ours_runs += runs;
}

static void format_betti(const pcp_topology_betti_t* betti, char* out,
                         size_t capacity) {
  size_t used = 0;
  out[0] = '\0';
  for (uint32_t k = 0; k < betti->count && used < capacity; ++k) {
    used +=
        (size_t)snprintf(out + used, capacity - used, "%s%llu", k ? "," : "",
                         (unsigned long long)betti->values[k]);
  }
}

// Reads the `NAME key=value ...` line of |c| from one baseline run into
// round |round| of |c|. False when the line is missing or malformed, or its
// Betti numbers differ from an earlier round's.
static bool parse_baseline(const char* output, bench_complex_t* c, int round) {
  size_t n = strlen(c->name);
  for (const char* p = output; p && *p;) {
    if (strncmp(p, c->name, n) == 0 && p[n] == ' ') {
      const char* betti = strstr(p, " betti=");
      const char* end = strchr(p, '\n');
      if (!betti || (end && betti > end))
        return false;
      betti += 7;
      size_t length = strcspn(betti, " \n");
      if (length >= sizeof(c->gudhi_betti))
        return false;
      if (round > 0 && (strlen(c->gudhi_betti) != length ||
                        memcmp(c->gudhi_betti, betti, length) != 0)) {
        return false;
      }
      memcpy(c->gudhi_betti, betti, length);
      c->gudhi_betti[length] = '\0';
      return sscanf(p + n,
                    " simplices=%ld betti=%*s median_s=%lf min_s=%*f "
                    "build_s=%lf homology_s=%lf",
                    &c->gudhi_simplices, &c->gudhi_s[round],
                    &c->gudhi_build_s[round], &c->gudhi_homology_s[round]) == 4;
    }
    p = strchr(p, '\n');
    if (p)
      ++p;
  }
  return false;
}

int main(int argc, char** argv) {
  g_clock = pcp_clock_system();
  const char* out_dir = argc > 1 ? argv[1] : "/tmp/pcp-bench-topology";
  if (mkdir(out_dir, 0700) != 0 && access(out_dir, W_OK) != 0) {
    fprintf(stderr, "topology: cannot create %s\n", out_dir);
    return 1;
  }
  bench_complex_t complexes[2] = {
      {.name = "ch5", .complex = make_complex(5, 0)},
      {.name = "ch4-punctured", .complex = make_complex(4, PUNCTURE_EVERY)},
  };
  char command[8192];
  int used = snprintf(command, sizeof(command),
                      "'%s/bin/python' '%s/bench/topology_baseline.py' "
                      "--runs 1",
                      pcp_venv_directory(), PCP_SOURCE_DIR);
  for (int i = 0; i < 2; ++i) {
    char dir[4096];
    int n = snprintf(dir, sizeof(dir), "%s/%s", out_dir, complexes[i].name);
    if (n < 0 || (size_t)n >= sizeof(dir)) {
      fprintf(stderr, "topology: scratch directory path too long\n");
      return 1;
    }
    if (write_complex(complexes[i].complex, dir))
      return 1;
    used += snprintf(command + used, sizeof(command) - (size_t)used, " '%s:%s'",
                     complexes[i].name, dir);
  }
  char version[64] = "?";
  for (int round = 0; round < ROUNDS; ++round) {
    for (int i = 0; i < 2; ++i) time_ours(&complexes[i], round);
    FILE* pipe = popen(command, "r");
    if (!pipe) {
      fprintf(stderr, "topology: cannot run the GUDHI baseline\n");
      return 1;
    }
    static char output[1 << 16];
    size_t length = fread(output, 1, sizeof(output) - 1, pipe);
    output[length] = '\0';
    if (pclose(pipe) != 0) {
      fprintf(stderr,
              "topology: the GUDHI baseline failed (is the gudhi wheel of "
              "tools/setup/requirements-test.txt installed? make setup):\n"
              "%s\n",
              output);
      return 1;
    }
    const char* v = strstr(output, "gudhi_version=");
    if (v)
      sscanf(v, "gudhi_version=%63s", version);
    for (int i = 0; i < 2; ++i) {
      if (!parse_baseline(output, &complexes[i], round)) {
        fprintf(stderr,
                "topology: unexpected baseline output for %s in round %d:"
                "\n%s\n",
                complexes[i].name, round + 1, output);
        return 1;
      }
    }
  }

  bool agree = true;
  double ratio = 0;
  for (int i = 0; i < 2; ++i) {
    bench_complex_t* c = &complexes[i];
    char ours[256];
    format_betti(&c->ours, ours, sizeof(ours));
    double ours_s = median_of(c->ours_s, ROUNDS);
    double gudhi_s = median_of(c->gudhi_s, ROUNDS);
    double r = gudhi_s / ours_s;
    printf(
        "%-14s listed=%zu gudhi_simplices=%ld betti ours=[%s] "
        "gudhi=[%s]\n",
        c->name, pcp_topology_complex_count(c->complex), c->gudhi_simplices,
        ours, c->gudhi_betti);
    printf(
        "%-14s ours %.4f s (%d runs in %d rounds)  GUDHI %s %.4f s (%d "
        "rounds: simplex tree %.4f s, persistence %.4f s)  ratio=%.2f\n",
        c->name, ours_s, c->ours_runs, ROUNDS, version, gudhi_s, ROUNDS,
        median_of(c->gudhi_build_s, ROUNDS),
        median_of(c->gudhi_homology_s, ROUNDS), r);
    if (strcmp(ours, c->gudhi_betti) != 0) {
      fprintf(stderr,
              "topology: %s: Betti numbers differ: ours [%s], GUDHI "
              "[%s]\n",
              c->name, ours, c->gudhi_betti);
      agree = false;
    }
    if (i == 0 || r < ratio)
      ratio = r;
    pcp_topology_complex_release(c->complex);
  }
  if (agree)
    printf("agree: yes (GF(%d), every Betti number)\n", PRIME);
  bool met = ratio >= GOAL_RATIO;
  if (!met) {
    fprintf(stderr, "topology: goal missed: ratio %.2f < %.2f\n", ratio,
            GOAL_RATIO);
  }
  printf("topology ratio=%.2f\n", ratio);
  return agree && met ? 0 : 1;
}
