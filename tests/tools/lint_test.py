#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The two lint scripts on small trees built here: each rule of
tools/lint/check_includes.py (the layer graph, public headers, private
headers outside src/, a module with no line, a graph edge pointing down) and
tools/lint/check_format.py (a non-conforming file is named; --fix fixes it).

Usage: lint_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
INCLUDES = os.path.join(SOURCE, "tools", "lint", "check_includes.py")
FORMAT = os.path.join(SOURCE, "tools", "lint", "check_format.py")
failures = []

LAYERS = """# test graph
base:
compute: base
models: base
workloads: base compute models
"""


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def expect(name, ok, output):
    if not ok:
        failures.append(name)
        print("FAIL %s\n%s" % (name, output))
    else:
        print("ok   %s" % name)


def tree(files, layers=LAYERS):
    root = tempfile.mkdtemp(prefix="pcp_lint_test_")
    write(root, "layers.txt", layers)
    base = {
        "src/base/base.h": "int pcp_base(void);\n",
        "src/compute/compute.h": '#include "base/base.h"\n',
        "src/models/models.h": '#include "base/base.h"\n',
        "src/models/models_impl.h": '#include "models/models.h"\n',
        "src/workloads/workloads.h": ('#include "compute/compute.h"\n'
                                      '#include "models/models.h"\n'),
    }
    base.update(files)
    for rel, text in base.items():
        write(root, rel, text)
    return root


def includes(root):
    return run([sys.executable, INCLUDES, "--root", root,
                "--layers", os.path.join(root, "layers.txt")])


def check_includes():
    root = tree({})
    rc, out = includes(root)
    expect("a clean tree passes", rc == 0 and "0 failed" in out, out)
    shutil.rmtree(root)

    root = tree({"src/models/run.c": '#include "compute/compute.h"\n'})
    rc, out = includes(root)
    expect("models -> compute (no edge) fails",
           rc == 1 and "module 'models' includes 'compute'" in out, out)
    shutil.rmtree(root)

    root = tree({"src/workloads/w.c": '#include "models/models_impl.h"\n'})
    rc, out = includes(root)
    expect("another module's private header fails",
           rc == 1 and "not the public header models/models.h" in out, out)
    shutil.rmtree(root)

    root = tree({"src/models/m.c": '#include "models/models_impl.h"\n'})
    rc, out = includes(root)
    expect("a module's own private header passes", rc == 0, out)
    shutil.rmtree(root)

    root = tree({"tests/t.c": '#include "models/models_impl.h"\n',
                 "bench/b.c": '#include "models/models.h"\n'})
    rc, out = includes(root)
    expect("a private header outside src/ fails",
           rc == 1 and "tests/t.c: includes models/models_impl.h" in out
           and "bench/b.c" not in out, out)
    shutil.rmtree(root)

    root = tree({"src/sched/sched.h": '#include "base/base.h"\n'})
    rc, out = includes(root)
    expect("a module with no line in layers.txt fails",
           rc == 1 and "src/sched: module has no line" in out, out)
    shutil.rmtree(root)

    root = tree({}, layers="base: compute\ncompute: base\n")
    rc, out = includes(root)
    expect("an edge to a later line (a cycle) fails",
           rc == 1 and "not on an earlier line" in out, out)
    shutil.rmtree(root)

    # A header granted by name: that include passes, another header of the
    # same module still fails, and a grant of a private header is refused.
    granted = LAYERS.replace("workloads: base compute models",
                             "workloads: base compute models/pure.h")
    alone = {"src/workloads/workloads.h": '#include "compute/compute.h"\n'}
    root = tree(dict(alone, **{"src/models/pure.h": '#include "base/base.h"\n',
                               "src/workloads/w.c": '#include "models/pure.h"\n'}),
                layers=granted)
    rc, out = includes(root)
    expect("a header granted by name passes", rc == 0, out)
    shutil.rmtree(root)
    root = tree(dict(alone, **{"src/workloads/w.c":
                               '#include "models/models.h"\n'}),
                layers=granted)
    rc, out = includes(root)
    expect("a grant of one header is not the module",
           rc == 1 and "module 'workloads' includes 'models'" in out, out)
    shutil.rmtree(root)
    root = tree({}, layers=LAYERS.replace("workloads: base compute models",
                                          "workloads: base models/models_impl.h"))
    rc, out = includes(root)
    expect("a grant of a private header fails",
           rc == 1 and "public .h only" in out, out)
    shutil.rmtree(root)

    root = tree({"src/base/b.c": '#include "models/models.h"\n'})
    rc, out = includes(root)
    expect("base includes nothing of ours",
           rc == 1 and "'base' may include: nothing" in out, out)
    shutil.rmtree(root)


def check_format():
    good = "int pcp_good(int x) {\n  return x + 1;\n}\n"
    bad = "int  pcp_bad( int x ){return x+1;}\n"
    root = tree({"src/base/good.c": good, "src/base/bad.c": bad})
    shutil.copy(os.path.join(SOURCE, ".clang-format"), root)
    # The fixture headers above are not formatted either; format them first
    # so that only bad.c is left.
    rc, out = run([sys.executable, FORMAT, "--root", root, "--fix"])
    write(root, "src/base/bad.c", bad)
    rc, out = run([sys.executable, FORMAT, "--root", root])
    expect("a non-conforming file is named with the fix",
           rc == 1 and "FAIL src/base/bad.c" in out and "good.c" not in out
           and "make format" in out, out)
    rc, out = run([sys.executable, FORMAT, "--root", root, "--fix"])
    rc, out = run([sys.executable, FORMAT, "--root", root])
    with open(os.path.join(root, "src/base/bad.c")) as f:
        fixed = f.read()
    expect("--fix formats it", rc == 0 and fixed != bad, out)
    shutil.rmtree(root)


check_includes()
check_format()
print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
