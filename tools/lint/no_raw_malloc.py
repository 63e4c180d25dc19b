#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Rejects raw malloc/calloc/realloc/free/strdup/strndup above base.

STYLE.md s.3.5: memory goes through a pcp_allocator_t (base.h), so the
counting allocator sees it and the failing allocator's out-of-memory sweeps
reach it. base/ implements the allocators and is exempt. Comments and string
literals are ignored; `x->free(` and `x.free(` (vtable members) are not calls
of libc's free.

Scope: every module above base (issue 14, Deliver 3): every file there, the
command-line tools, test drivers and fuzz harnesses included, allocates through
a pcp_allocator_t. Memory a library returns for free() (json_dumps,
pcp_file_read_all) goes back through pcp_libc_free, named at each site.

Prints one line per violation and 'N passed, M failed' (files checked).
"""
import os
import re
import sys

SCOPES = ["src/%s" % m for m in (
    "compile", "compute", "config", "data", "fabric", "http", "mlir",
    "models", "net", "obs", "proto", "roles", "sched", "services", "sim",
    "store", "tokenizer", "topology", "workloads")]

# Files exempt above base, with the reason. Empty: keep it so (a new file
# starts on pcp_allocator_t).
ALLOWED = set()
CALL = re.compile(r"(?<![\w.>])(malloc|calloc|realloc|free|strdup|strndup)\s*\(")
# Comments, then string and character literals.
STRIP = re.compile(r'//[^\n]*|/\*.*?\*/|"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'',
                   re.S)


def blank(match):
    # Keep newlines so line numbers still match.
    return re.sub(r"[^\n]", " ", match.group(0))


def violations(text):
    code = STRIP.sub(blank, text)
    for number, line in enumerate(code.split("\n"), 1):
        for call in CALL.finditer(line):
            yield number, call.group(1)


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    checked = failed = 0
    for scope in SCOPES:
        for dirpath, _, names in sorted(os.walk(os.path.join(root, scope))):
            for name in sorted(names):
                if not name.endswith((".c", ".h")) or name.endswith("_test.c"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                checked += 1
                if rel in ALLOWED:
                    continue
                with open(os.path.join(root, rel), encoding="utf-8",
                          errors="replace") as f:
                    found = list(violations(f.read()))
                for number, fn in found:
                    print("%s:%d: raw %s(); use pcp_allocator_%s (base.h)" %
                          (rel, number, fn,
                           "strdup" if fn.startswith("str") else fn))
                failed += bool(found)
    stale = sorted(p for p in ALLOWED
                   if not os.path.exists(os.path.join(root, p)))
    for p in stale:
        print("note: allow-listed %s no longer exists; drop it" % p)
    print("%d passed, %d failed" % (checked - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
