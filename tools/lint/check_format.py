#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that PCP's C sources follow .clang-format (STYLE.md s.3.12).

  check_format.py          dry run: names every file clang-format would
                           change and exits 1 if there is one (ctest
                           lint_format, label lint)
  check_format.py --fix    rewrites those files in place (make format)
  check_format.py --list   prints only the non-conforming paths

Files: *.c and *.h under src/, tests/, bench/ and tools/ (tracked or not;
build trees and virtual environments are skipped). The formatter is
clang-format 14, the one Debian 12 ships (tools/setup/apt-packages.txt):
another major version formats differently, so it is refused rather than
trusted. $PCP_CLANG_FORMAT names another binary of version 14. --root DIR
checks another tree (its own test, tests/tools/lint_test.py).
"""
import os
import re
import subprocess
import sys

ROOTS = ("src", "tests", "bench", "tools")
SKIP_DIRS = {".venv", ".cache", "build", "__pycache__", "node_modules"}
REQUIRED_MAJOR = 14
# Files per clang-format process: keeps each command line far below ARG_MAX.
BATCH = 200
DIAGNOSTIC = re.compile(r"^(.+?):\d+:\d+: (?:warning|error): ", re.M)


def find_sources(root):
    files = []
    for top in ROOTS:
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames
                                 if d not in SKIP_DIRS
                                 and not d.startswith("build"))
            files += [os.path.relpath(os.path.join(dirpath, n), root)
                      for n in sorted(names) if n.endswith((".c", ".h"))]
    return files


def clang_format_binary():
    binary = os.environ.get("PCP_CLANG_FORMAT", "clang-format")
    try:
        out = subprocess.run([binary, "--version"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("check_format: cannot run %s (%s); install the "
                         "Debian 12 package clang-format (make setup)"
                         % (binary, e))
    m = re.search(r"version (\d+)\.", out)
    if not m or int(m.group(1)) != REQUIRED_MAJOR:
        raise SystemExit("check_format: %s is '%s', need clang-format %d "
                         "(Debian 12); set PCP_CLANG_FORMAT to one"
                         % (binary, out.strip(), REQUIRED_MAJOR))
    return binary


def nonconforming(binary, root, files):
    bad = []
    for i in range(0, len(files), BATCH):
        batch = files[i:i + BATCH]
        proc = subprocess.run([binary, "--dry-run", "--Werror", "--style=file"]
                              + batch, cwd=root, capture_output=True,
                              text=True)
        named = set(DIAGNOSTIC.findall(proc.stderr))
        if proc.returncode != 0 and not named:
            raise SystemExit("check_format: clang-format failed:\n"
                             + proc.stderr[-2000:])
        bad += [f for f in batch if f in named]
    return bad


def main(argv):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    if "--root" in argv[:-1]:
        root = argv[argv.index("--root") + 1]
    binary = clang_format_binary()
    files = find_sources(root)
    if not files:
        print("check_format: no C files found under %s" % ", ".join(ROOTS))
        return 1
    bad = nonconforming(binary, root, files)
    if "--fix" in argv:
        for i in range(0, len(bad), BATCH):
            subprocess.run([binary, "-i", "--style=file"] + bad[i:i + BATCH],
                           cwd=root, check=True)
        print("formatted %d of %d files" % (len(bad), len(files)))
        return 0
    if "--list" in argv:
        print("\n".join(bad))
        return 1 if bad else 0
    for f in bad:
        print("FAIL %s: not clang-formatted" % f)
    print("%d passed, %d failed" % (len(files) - len(bad), len(bad)))
    if bad:
        print("Fix: make format (runs tools/lint/check_format.py --fix), or "
              "clang-format -i FILE; see the changes with "
              "clang-format --dry-run FILE.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
