#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks PCP's module boundaries (STYLE.md s.3.3, ARCHITECTURE.md s.3):

1. A module includes another only through its public header
   "<module>/<module>.h"; its own folder's headers (private "*_impl.h"
   included) are its own business. Outside src/ (tests, bench, tools) no file
   includes a "*_impl.h" of a module.
2. A module includes only the modules the layer graph in tools/lint/layers.txt
   allows it (each module on one line, top layer first, listing the modules
   it may include; a module may list only modules on earlier lines, so the
   graph has no cycle). Every folder under src/ must have a line. An entry
   "module/path.h" grants that one header (not the module): exactly that
   include passes, any other header of the module still fails.
3. Python.h appears only under src/compute/backends/iree/.

Prints one line per violation and 'N passed, M failed' (files checked).
Usage: check_includes.py [--graph] [--root DIR] [--layers FILE]
(--graph prints the graph it read; --root and --layers point it at another
tree, for its own test tests/tools/lint_test.py).
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
LAYERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers.txt")
# Bound on the graph file: it is a few dozen short lines.
MAX_LAYERS_BYTES = 64 * 1024


def read_layers(path):
    """Returns (order, allowed) or raises ValueError naming the line."""
    if os.path.getsize(path) > MAX_LAYERS_BYTES:
        raise ValueError("%s: larger than %d bytes" % (path, MAX_LAYERS_BYTES))
    order, allowed = [], {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if ":" not in line:
                raise ValueError("%s:%d: expected 'module: deps...'"
                                 % (path, number))
            name, deps = line.split(":", 1)
            name = name.strip()
            if not re.fullmatch(r"[a-z_]+|main\.c", name):
                raise ValueError("%s:%d: bad module name '%s'"
                                 % (path, number, name))
            if name in allowed:
                raise ValueError("%s:%d: module '%s' listed twice"
                                 % (path, number, name))
            deps = deps.split()
            for dep in deps:
                # A dep "module/path.h" grants that one header of an earlier
                # module, not the module: a sans-I/O header whose code links
                # without the rest of its module (layers.txt says which).
                head = dep.split("/", 1)[0]
                if "/" in dep and (not dep.endswith(".h")
                                   or dep.endswith("_impl.h")):
                    raise ValueError("%s:%d: '%s' may name a public .h only, "
                                     "not '%s'" % (path, number, name, dep))
                if head not in allowed:
                    raise ValueError(
                        "%s:%d: '%s' may include '%s', which is not on an "
                        "earlier line (layers point up only)"
                        % (path, number, name, dep))
            if len(set(deps)) != len(deps):
                raise ValueError("%s:%d: '%s' lists a module twice"
                                 % (path, number, name))
            order.append(name)
            allowed[name] = set(deps)
    return order, allowed


def module_of(rel):
    parts = rel.split(os.sep)
    # src/<module>/..., or src/main.c, which is its own line in layers.txt.
    return parts[1] if parts[0] == "src" and len(parts) > 1 else None


def check_file(root, rel, modules, allowed):
    problems = []
    mod = module_of(rel)
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        text = f.read()
    for inc in INCLUDE.findall(text):
        if inc == "Python.h" and not rel.startswith("src/compute/backends/iree/"):
            problems.append("%s: includes Python.h outside the IREE backend" % rel)
        head = inc.split("/")[0]
        if "/" not in inc or head not in modules or head == mod:
            continue
        if mod is None:
            if inc.endswith("_impl.h"):
                problems.append("%s: includes %s, a private header of '%s'"
                                % (rel, inc, head))
            continue
        if inc in allowed.get(mod, ()):
            continue  # a header layers.txt grants by name
        if inc != "%s/%s.h" % (head, head):
            problems.append("%s: includes %s, not the public header %s/%s.h"
                            % (rel, inc, head, head))
        if head not in allowed.get(mod, ()):
            problems.append(
                "%s: module '%s' includes '%s', which tools/lint/layers.txt "
                "does not allow ('%s' may include: %s)"
                % (rel, mod, head, mod,
                   " ".join(sorted(allowed.get(mod, ()))) or "nothing"))
    return problems


def option(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def main(argv):
    root = option(argv, "--root", os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "..")))
    layers = option(argv, "--layers", LAYERS)
    try:
        order, allowed = read_layers(layers)
    except (OSError, ValueError) as e:
        print("FAIL %s" % e)
        print("0 passed, 1 failed")
        return 1
    if "--graph" in argv:
        for name in order:
            print("%s: %s" % (name, " ".join(
                [m for m in order if m in allowed[name]] +
                sorted(d for d in allowed[name] if "/" in d))))
        return 0
    src = os.path.join(root, "src")
    folders = sorted(d for d in os.listdir(src)
                     if os.path.isdir(os.path.join(src, d)))
    missing = [d for d in folders if d not in allowed]
    # A folder of src/ is a module whether or not layers.txt knows it, so an
    # include of a new module is checked (and fails) rather than skipped.
    modules = set(folders) | (set(order) - {"main.c"})
    checked = failed = 0
    for d in missing:
        checked += 1
        failed += 1
        print("FAIL src/%s: module has no line in tools/lint/layers.txt" % d)
    files = []
    for top in ("src", "tests", "bench", "tools"):
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames.sort()
            files += [os.path.relpath(os.path.join(dirpath, n), root)
                      for n in sorted(names) if n.endswith((".c", ".h"))]
    for rel in files:
        problems = check_file(root, rel, modules, allowed)
        checked += 1
        if problems:
            failed += 1
            for p in problems:
                print("FAIL " + p)
    print("%d passed, %d failed" % (checked - failed, failed))
    if failed:
        print("An edge a design needs goes into tools/lint/layers.txt (check "
              "it against ARCHITECTURE.md s.3 first); otherwise include the "
              "public header or move the code down a layer.")
    return 1 if failed or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
