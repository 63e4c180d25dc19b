#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Baseline half of bench/topology: Betti numbers over GF(2) with GUDHI
(pip `gudhi`, pinned in tools/setup/requirements-test.txt).

Reads the complexes bench/topology wrote (one raw little-endian int32 file
per dimension, rows of dim+1 vertex numbers), and for each one times, in one
process, what pcp_topology_complex_betti does: build the complex with every
face (a gudhi.SimplexTree filled by insert_batch, which inserts the faces),
then homology (compute_persistence over GF(2) with every filtration value 0,
so persistent homology is plain homology, persistence_dim_max=True so the top
dimension is included) and betti_numbers(). Loading the files is not timed.

Usage: topology_baseline.py --runs N NAME:DIR [NAME:DIR ...]
Prints, per complex, `NAME key=value ...` lines.
"""
import argparse
import os
import statistics
import sys
import time

import gudhi
import numpy as np


def load(directory):
    batches = []
    dim = 0
    while True:
        path = os.path.join(directory, "dim%d.i32" % dim)
        if not os.path.exists(path):
            break
        data = np.fromfile(path, dtype="<i4")
        if data.size % (dim + 1):
            sys.exit("topology_baseline: %s is not rows of %d" % (path, dim + 1))
        rows = data.reshape(-1, dim + 1)
        if rows.shape[0]:
            # insert_batch takes (k+1, n), contiguous.
            batches.append(np.ascontiguousarray(rows.T))
        dim += 1
    if not batches:
        sys.exit("topology_baseline: no dim*.i32 files in %s" % directory)
    return batches


def betti_once(batches):
    start = time.perf_counter()
    tree = gudhi.SimplexTree()
    # Highest dimension first: its faces come with it, lower batches then
    # only add what is not already there.
    for vertices in reversed(batches):
        tree.insert_batch(vertices, np.zeros(vertices.shape[1]))
    built = time.perf_counter()
    tree.compute_persistence(homology_coeff_field=2, persistence_dim_max=True)
    betti = tree.betti_numbers()
    done = time.perf_counter()
    return betti, tree.num_simplices(), built - start, done - built


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("complexes", nargs="+", help="NAME:DIR")
    args = ap.parse_args()
    print("gudhi_version=%s" % gudhi.__version__)
    for spec in args.complexes:
        name, _, directory = spec.partition(":")
        batches = load(directory)
        totals, builds, homologies = [], [], []
        for _ in range(max(1, args.runs)):
            betti, simplices, build_s, homology_s = betti_once(batches)
            totals.append(build_s + homology_s)
            builds.append(build_s)
            homologies.append(homology_s)
        print("%s simplices=%d betti=%s median_s=%.6f min_s=%.6f build_s=%.6f "
              "homology_s=%.6f runs=%d" % (
                  name, simplices, ",".join(str(b) for b in betti),
                  statistics.median(totals), min(totals),
                  statistics.median(builds), statistics.median(homologies),
                  len(totals)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
