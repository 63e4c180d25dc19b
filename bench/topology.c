// SPDX-License-Identifier: Apache-2.0
//
// bench/topology: Betti numbers of an iterated standard chromatic
// subdivision, pcp's sparse elimination against a dense Gaussian
// elimination baseline, in the same run, on the same complex.
//
// First, the sparse elimination alone on Ch^5 of the triangle (371293
// triangles, 1.1M simplices): one pcp_topology_complex_betti call takes
// about a second there. A dense matrix for it would need ~26 GB even
// bit-packed, so the comparison runs one size down.
//
// The compared complex is Ch^4 of the triangle (28561 triangles, 42k edges,
// 14k vertices), over GF(2): about the largest a dense elimination can still
// hold (d2 has 42912 x 28561 entries, 153 MB bit-packed). The dense baseline
// is the strongest textbook form: rows packed 64 entries to a word, row
// echelon by XOR, zero entries skipped. The sparse side is the library call
// pcp_topology_complex_betti (face enumeration included), repeated for about
// a second, median used. Both results must agree, or the bench fails.
//
// Prints its timings, then `topology ratio=<dense_time/sparse_time>` last.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "topology/topology.h"

#define ROUNDS 4
#define PRIME 2
#define SPARSE_BUDGET_NS 1000000000ll
#define SPARSE_MAX_RUNS 200

static pcp_clock_t g_clock;

static double seconds_since(int64_t start_ns) {
  return (double)(pcp_clock_now_ns(g_clock) - start_ns) * 1e-9;
}

//===----------------------------------------------------------------------===//
// Dense baseline over GF(2)
//===----------------------------------------------------------------------===//

// Rank of a rows x cols GF(2) matrix, rows packed into 64-bit words.
// Destroys the matrix.
static uint64_t dense_rank_gf2(uint64_t** rows, size_t row_count,
                               size_t col_count, size_t words) {
  uint64_t rank = 0;
  for (size_t c = 0; c < col_count && rank < row_count; ++c) {
    size_t w = c / 64;
    uint64_t bit = (uint64_t)1 << (c % 64);
    size_t pivot = row_count;
    for (size_t r = rank; r < row_count; ++r) {
      if (rows[r][w] & bit) {
        pivot = r;
        break;
      }
    }
    if (pivot == row_count) continue;
    uint64_t* t = rows[pivot];
    rows[pivot] = rows[rank];
    rows[rank] = t;
    const uint64_t* p = rows[rank];
    for (size_t r = rank + 1; r < row_count; ++r) {
      uint64_t* row = rows[r];
      if (!(row[w] & bit)) continue;
      for (size_t k = w; k < words; ++k) row[k] ^= p[k];
    }
    ++rank;
  }
  return rank;
}

// Betti numbers over GF(2) from the faces of |complex| with dense boundary
// matrices, using only the public API (faces order, exact lookups).
static int dense_betti(const pcp_topology_complex_t* complex,
                       pcp_topology_betti_t* out_betti, double* out_build_s,
                       double* out_eliminate_s) {
  int64_t start = pcp_clock_now_ns(g_clock);
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_topology_complex_t* faces = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(allocator, &faces));
  PCP_CHECK_OK(pcp_topology_complex_faces(complex, faces));
  size_t face_count = pcp_topology_complex_count(faces);
  int32_t top = pcp_topology_complex_dimension(complex);
  // Index of each face among the faces of its dimension.
  size_t* index_in_dim = calloc(face_count, sizeof(size_t));
  size_t counts[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2] = {0};
  if (!index_in_dim) return 1;
  for (size_t i = 0; i < face_count; ++i) {
    uint32_t n = pcp_topology_complex_simplex(faces, i).count;
    if (n == 0) continue;
    index_in_dim[i] = counts[n - 1]++;
  }
  uint64_t ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2] = {0};
  double eliminate = 0;
  for (int32_t k = 1; k <= top; ++k) {
    size_t row_count = counts[k - 1];
    size_t col_count = counts[k];
    size_t words = (col_count + 63) / 64;
    uint64_t* storage = calloc(row_count * words + 1, sizeof(uint64_t));
    uint64_t** rows = malloc((row_count + 1) * sizeof(uint64_t*));
    if (!storage || !rows) {
      fprintf(stderr, "topology: dense d%d needs %zu MB\n", (int)k,
              row_count * words * 8 >> 20);
      return 1;
    }
    for (size_t r = 0; r < row_count; ++r) rows[r] = storage + r * words;
    pcp_topology_vertex_t face[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
    for (size_t i = 0; i < face_count; ++i) {
      pcp_topology_simplex_t s = pcp_topology_complex_simplex(faces, i);
      if (s.count != (uint32_t)k + 1) continue;
      size_t col = index_in_dim[i];
      for (uint32_t omit = 0; omit < s.count; ++omit) {
        uint32_t n = 0;
        for (uint32_t v = 0; v < s.count; ++v) {
          if (v != omit) face[n++] = s.vertices[v];
        }
        size_t found = 0;
        PCP_ASSERT(pcp_topology_complex_find(
            faces, pcp_topology_make_simplex(face, n), &found));
        // Over GF(2) both signs are 1.
        rows[index_in_dim[found]][col / 64] |= (uint64_t)1 << (col % 64);
      }
    }
    int64_t t = pcp_clock_now_ns(g_clock);
    ranks[k] = dense_rank_gf2(rows, row_count, col_count, words);
    eliminate += seconds_since(t);
    free(rows);
    free(storage);
  }
  memset(out_betti, 0, sizeof(*out_betti));
  out_betti->count = (uint32_t)top + 1;
  for (int32_t k = 0; k <= top; ++k) {
    out_betti->values[k] =
        counts[k] - ranks[k] - (k + 1 <= top ? ranks[k + 1] : 0);
  }
  free(index_in_dim);
  pcp_topology_complex_release(faces);
  *out_eliminate_s = eliminate;
  *out_build_s = seconds_since(start) - eliminate;
  return 0;
}

//===----------------------------------------------------------------------===//
// Main
//===----------------------------------------------------------------------===//

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

static void print_betti(const char* name, const pcp_topology_betti_t* betti) {
  printf("%s betti=[", name);
  for (uint32_t k = 0; k < betti->count; ++k) {
    printf("%s%llu", k ? "," : "", (unsigned long long)betti->values[k]);
  }
  printf("]\n");
}

// Ch^|rounds| of |triangle| (caller releases).
static pcp_topology_subdivision_t* subdivide(
    const pcp_topology_complex_t* triangle, uint32_t rounds) {
  int64_t start = pcp_clock_now_ns(g_clock);
  pcp_topology_subdivision_t* sub = NULL;
  PCP_CHECK_OK(pcp_topology_subdivision_create(
      triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, rounds,
      pcp_allocator_system(), &sub));
  size_t vertex_count = 0, facet_count = 0;
  pcp_topology_subdivision_counts(sub, &vertex_count, &facet_count);
  printf("complex: Ch^%u(triangle) vertices=%zu facets=%zu simplices=%zu "
         "(built in %.3f s)\n",
         rounds, vertex_count, facet_count,
         pcp_topology_complex_count(pcp_topology_subdivision_complex(sub)),
         seconds_since(start));
  return sub;
}

int main(void) {
  g_clock = pcp_clock_system();
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
  // The large complex: sparse only.
  {
    pcp_topology_subdivision_t* large = subdivide(triangle, ROUNDS + 1);
    pcp_topology_betti_t betti;
    int64_t t = pcp_clock_now_ns(g_clock);
    PCP_CHECK_OK(pcp_topology_complex_betti(
        pcp_topology_subdivision_complex(large), PRIME, &betti));
    printf("sparse (large, one run): %.3f s\n", seconds_since(t));
    print_betti("sparse (large)", &betti);
    pcp_topology_subdivision_release(large);
  }

  pcp_topology_subdivision_t* sub = subdivide(triangle, ROUNDS);
  const pcp_topology_complex_t* complex = pcp_topology_subdivision_complex(sub);

  // Sparse: repeat for about a second, report the median.
  double times[SPARSE_MAX_RUNS];
  int runs = 0;
  pcp_topology_betti_t sparse;
  int64_t budget_start = pcp_clock_now_ns(g_clock);
  while (runs < SPARSE_MAX_RUNS &&
         (runs < 3 ||
          pcp_clock_now_ns(g_clock) - budget_start < SPARSE_BUDGET_NS)) {
    int64_t t = pcp_clock_now_ns(g_clock);
    PCP_CHECK_OK(pcp_topology_complex_betti(complex, PRIME, &sparse));
    times[runs++] = seconds_since(t);
  }
  qsort(times, (size_t)runs, sizeof(double), compare_double);
  double sparse_s = times[runs / 2];
  printf("sparse: %d runs in %.3f s, median %.4f s (min %.4f, max %.4f)\n",
         runs, seconds_since(budget_start), sparse_s, times[0],
         times[runs - 1]);
  print_betti("sparse", &sparse);

  // Dense: once (it takes seconds).
  pcp_topology_betti_t dense;
  double build_s = 0, eliminate_s = 0;
  if (dense_betti(complex, &dense, &build_s, &eliminate_s)) return 1;
  double dense_s = build_s + eliminate_s;
  printf("dense: %.3f s (matrices %.3f s, elimination %.3f s)\n", dense_s,
         build_s, eliminate_s);
  print_betti("dense", &dense);

  bool agree = sparse.count == dense.count;
  for (uint32_t k = 0; agree && k < sparse.count; ++k) {
    agree = sparse.values[k] == dense.values[k];
  }
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(triangle);
  if (!agree) {
    fprintf(stderr, "topology: sparse and dense Betti numbers disagree\n");
    return 1;
  }
  printf("agree: yes (GF(%d))\n", PRIME);
  printf("topology ratio=%.2f\n", dense_s / sparse_s);
  return 0;
}
