#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks PCP's module boundaries (STYLE.md s.3.3, ARCHITECTURE.md s.3):

1. A file includes another module only through that module's public header
   "<module>/<module>.h"; "*_impl.h" headers never leave their folder.
2. A module includes only modules above it in the dependency order.
3. Python.h appears only under src/compute/backends/iree/.

Prints one line per violation and 'N passed, M failed' (files checked).
"""
import os
import re
import sys

ORDER = ["base", "config", "obs", "net", "http", "proto", "store", "mlir",
         "compile", "compute", "models", "data", "tokenizer", "sched",
         "fabric", "workloads", "roles", "topology"]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def module_of(rel):
    parts = rel.split(os.sep)
    return parts[1] if len(parts) > 2 and parts[0] == "src" else None


def check_file(root, rel):
    problems = []
    mod = module_of(rel)
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        text = f.read()
    for inc in INCLUDE.findall(text):
        if inc == "Python.h" and not rel.startswith("src/compute/backends/iree/"):
            problems.append("%s: includes Python.h outside the IREE backend" % rel)
        head = inc.split("/")[0]
        if "/" not in inc or head not in ORDER:
            continue
        if head != mod:
            if inc != "%s/%s.h" % (head, head):
                problems.append("%s: includes %s, not the public header %s/%s.h"
                                % (rel, inc, head, head))
            if mod in ORDER and ORDER.index(head) > ORDER.index(mod):
                problems.append("%s: module '%s' includes '%s', which is below it"
                                % (rel, mod, head))
    return problems


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    checked = failed = 0
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            problems = check_file(root, rel)
            checked += 1
            if problems:
                failed += 1
                for p in problems:
                    print("FAIL " + p)
    print("%d passed, %d failed" % (checked - failed, failed))
    return 1 if failed or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
