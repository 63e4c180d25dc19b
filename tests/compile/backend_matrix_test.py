#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The backend matrix (docs/backends.md): every program PCP derives, for every
built-in model in f32 and bf16, cross-compiled by the wheel's iree-compile for
cpu, cuda sm_80 / sm_90a, rocm gfx942 / gfx1101, vulkan (IREE's default
target) and metal, on this CPU-only machine.

One cell is (model, dtype, backend/target) and costs ONE iree-compile: the
cell's programs (PROGRAMS below, each its own module as PCP emits it) are
merged into one module, every function renamed <program>__<name>, so IREE
compiles the shared forward and backward once. A cell passes when the
compiler accepts it; a cell listed in EXPECTED_FAILURES must fail with the
listed fragment of IREE's error, and the test fails when such a cell starts
passing (the table in docs/backends.md must stay true).

usage: backend_matrix_test.py PCP STREAMING_FRAGMENT_TOOL WORK_DIR
  PCP_MATRIX_JOBS   parallel compiles (default 2)
  PCP_MATRIX_ONLY   comma-separated substrings; only cells whose name
                    (model/dtype/backend:target) contains one of them
Artifacts go to WORK_DIR/cache (a re-run is cache hits); the table and the
per-cell compile times to WORK_DIR/matrix.md.
"""

import concurrent.futures
import os
import re
import subprocess
import sys
import time

# The built-ins at their smallest: one layer, two heads, width 32, the
# character vocabulary (65, odd on purpose: real vocabularies are not powers
# of two), 16 tokens, batch 2.
MODELS = {
    "gpt": ["--layers", "1", "--heads", "2", "--width", "32"],
    "nanochat": ["--layers", "1", "--heads", "2", "--width", "32"],
    "qwen3": ["--layers", "1", "--heads", "2", "--kv-heads", "1",
              "--width", "32"],
}
SHAPE = {"vocab": 65, "block": 16, "batch": 2}
DTYPES = ["f32", "bf16"]
INNER_STEPS = "2"

# The programs of a cell. Each entry: (name, kind, arguments).
#   derive:   `pcp compile --program ... --emit-mlir` of the model's @main
#   generate: `pcp model --generate` (@load, @prefill, @decode)
#   fragment: streaming DiLoCo's @init/@delta/@mix/@copy (one fragment
#             holding every tensor; streaming_fragment_tool)
#   forward_i64: the model's @main and @logits with i64 token ids, as
#             torch-mlir exports hold them (vulkan's default target has no
#             64-bit integers; docs/backends.md)
# "diloco" holds @main, @compute_gradients (--program grad), @apply_optimizer
# and @train_steps (--program train) and @diloco_round; "diloco_accumulate_keep"
# adds @compute_gradients_accumulated and the [K, A, ...] @train_steps and
# @diloco_round of --accumulate. A new variant is one more line, e.g.
#   ("diloco_keep", "derive", ["--program", "diloco", "--inner-steps",
#                              INNER_STEPS, "--inner-state", "keep"]),
PROGRAMS = [
    ("diloco", "derive", ["--program", "diloco", "--inner-steps", INNER_STEPS]),
    # The accumulated round is the kept-state one (`--inner-state keep`, the
    # service's default): both @diloco_round forms and both @train_steps
    # data layouts are covered without a fourth derived program per cell.
    ("diloco_accumulate_keep", "derive",
     ["--program", "diloco", "--inner-steps", INNER_STEPS, "--accumulate",
      "2", "--inner-state", "keep"]),
    ("generate", "generate", ["--max-length", "16", "--prefill-length", "8"]),
    ("stream", "fragment", ["1", "f32"]),
    ("forward_i64", "forward_i64", []),
]

# (backend, target); "" is the backend's default. sm_90a is compiled as
# sm_80 PTX by PCP (IREE 3.13 has no sm_90 target): the same artifact key,
# so it runs after the others as a cache hit and checks the substitution.
TARGETS = [
    ("cpu", "host"),
    ("cuda", "sm_80"),
    ("rocm", "gfx942"),
    ("rocm", "gfx1101"),
    ("vulkan", ""),
    ("metal", "macos"),
    ("cuda", "sm_90a"),
]
ALIASES = {("cuda", "sm_90a"): "IREE has no sm_90a target; compiling sm_80"}

# Cells IREE 3.13 cannot compile: (model, dtype, backend, target) with "*"
# for any, -> a fragment of IREE's error. docs/backends.md says why.
EXPECTED_FAILURES = {
    # IREE 3.13's SPIR-V pipelines have no bf16: the default vulkan target
    # has neither bf16 nor f16 arithmetic, and the bf16 loads IREE emulates
    # through 32-bit words fail to lower on vulkan and metal alike.
    ("*", "bf16", "vulkan", ""):
        "failed to legalize operation 'vector.bitcast'",
    ("*", "bf16", "metal", "macos"):
        "failed to legalize operation 'vector.bitcast'",
}


def expected_failure(model, dtype, backend, target):
    for (m, d, b, t), fragment in EXPECTED_FAILURES.items():
        if (m in ("*", model) and d in ("*", dtype) and b == backend and
                t == target):
            return fragment
    return None


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


def rename_module(text, prefix):
    """The functions of one module with every symbol renamed
    <prefix>__<name>, without the module wrapper and comment lines."""
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("//")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not re.match(r"^module\b.*\{$", lines[0]) or lines[-1] != "}":
        raise RuntimeError("unexpected module wrapper: %r ... %r" %
                           (lines[0], lines[-1]))
    body = "\n".join(lines[1:-1])
    names = set(re.findall(r"func\.func\s+(?:\w+\s+)?@(\w+)", body))
    if not names:
        raise RuntimeError("no functions in a %s module" % prefix)
    return re.sub(r"@(\w+)\b",
                  lambda m: "@%s__%s" % (prefix, m.group(1))
                  if m.group(1) in names else m.group(0), body)


def emit_cell_module(pcp, tool, work, model, dtype):
    """Writes WORK/<model>-<dtype>.mlir: every program of PROGRAMS."""
    base = os.path.join(work, "%s-%s" % (model, dtype))
    spec = MODELS[model] + ["--vocab", str(SHAPE["vocab"]), "--block-size",
                            str(SHAPE["block"]), "--batch", str(SHAPE["batch"]),
                            "--dtype", dtype]
    forward = base + ".forward.mlir"
    r = run([pcp, "model", model] + spec + ["-o", forward])
    if r.returncode:
        raise RuntimeError("pcp model %s: %s" % (model, r.stderr))
    parts = []
    for name, kind, args in PROGRAMS:
        path = "%s.%s.mlir" % (base, name)
        if kind == "derive":
            argv = [pcp, "compile", forward, "--emit-mlir", path] + args
        elif kind == "generate":
            argv = [pcp, "model", model] + spec + ["--generate"] + args + [
                "-o", path]
        elif kind == "fragment":
            flags = MODELS[model]
            get = lambda flag: (flags[flags.index(flag) + 1]
                                if flag in flags else "0")
            out_dir = base + ".fragments"
            os.makedirs(out_dir, exist_ok=True)
            argv = [tool, model, dtype, get("--layers"), get("--heads"),
                    get("--kv-heads"),
                    get("--width"), str(SHAPE["vocab"]), str(SHAPE["block"]),
                    str(SHAPE["batch"])] + args + [out_dir]
            path = os.path.join(out_dir, "fragment-0.mlir")
        elif kind == "forward_i64":
            with open(forward) as f:
                text = f.read()
            # Every integer in the built-ins is an id, a position or a
            # mask index: all of them i64, as an exporter writes them.
            text = re.sub(r"xi32>", "xi64>", text).replace("tensor<i32>",
                                                           "tensor<i64>")
            if "i32" in text:
                raise RuntimeError("i32 left in the i64 forward of " + model)
            with open(path, "w") as f:
                f.write(text)
            parts.append(rename_module(text, name))
            continue
        else:
            raise RuntimeError("unknown program kind " + kind)
        r = run(argv)
        if r.returncode:
            raise RuntimeError("%s: %s" % (" ".join(argv), r.stderr))
        with open(path) as f:
            parts.append(rename_module(f.read(), name))
    merged = base + ".mlir"
    with open(merged, "w") as f:
        f.write("module @pcp_backend_matrix {\n%s\n}\n" % "\n".join(parts))
    return merged


def compile_cell(pcp, work, module, cell):
    model, dtype, backend, target = cell
    out = os.path.join(work, "%s-%s-%s%s.vmfb" % (model, dtype, backend,
                                                  target))
    argv = [pcp, "compile", module, "--backend", backend, "--cache-dir",
            os.path.join(work, "cache"), "--timeout-s", "900", "-o", out]
    if target:
        argv += ["--target", target]
    # CPU seconds (user + system of pcp and its iree-compile, from wait4)
    # besides wall seconds: on a shared machine the wall time measures the
    # neighbours too.
    log = out + ".log"
    start = time.monotonic()
    with open(log, "w+") as f:
        child = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        f.seek(0)
        text = f.read()
    r = subprocess.CompletedProcess(argv, child.returncode, "", text)
    if os.path.exists(out):
        os.unlink(out)  # the cache keeps it; no need for a second copy
    return cell, r, seconds, usage.ru_utime + usage.ru_stime


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    pcp, tool, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    jobs = int(os.environ.get("PCP_MATRIX_JOBS", "2"))
    only = [s for s in os.environ.get("PCP_MATRIX_ONLY", "").split(",") if s]

    def cell_name(cell):
        return "%s/%s/%s:%s" % cell

    cells = [(m, d, b, t) for m in MODELS for d in DTYPES for b, t in TARGETS]
    if only:
        cells = [c for c in cells if any(s in cell_name(c) for s in only)]
        if not cells:
            print("PCP_MATRIX_ONLY=%s matches no cell" % ",".join(only))
            return 1
    modules = {}
    for m, d in sorted({(c[0], c[1]) for c in cells}):
        modules[(m, d)] = emit_cell_module(pcp, tool, work, m, d)

    results = {}
    phases = [[c for c in cells if (c[2], c[3]) not in ALIASES],
              [c for c in cells if (c[2], c[3]) in ALIASES]]
    total_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for phase in phases:
            futures = [pool.submit(compile_cell, pcp, work,
                                   modules[(c[0], c[1])], c) for c in phase]
            for future in concurrent.futures.as_completed(futures):
                cell, r, seconds, cpu = future.result()
                results[cell] = (r, seconds, cpu)
                state = "ok" if r.returncode == 0 else "FAIL"
                hit = " (cache hit)" if "cache hit" in r.stderr else ""
                print("%-34s %-4s %6.1f s wall %6.1f s cpu%s" %
                      (cell_name(cell), state, seconds, cpu, hit), flush=True)
    total = time.monotonic() - total_start

    problems = []
    for cell in cells:
        r = results[cell][0]
        fragment = expected_failure(*cell)
        if fragment is None and r.returncode != 0:
            errors = re.findall(r"error: .*", r.stderr) or [r.stderr[-2000:]]
            problems.append("%s: regressed, iree-compile failed: %s" %
                            (cell_name(cell), errors[0][:400]))
        elif fragment is not None and r.returncode == 0:
            problems.append(
                "%s: listed as an expected failure (%r) but now compiles: "
                "update EXPECTED_FAILURES and docs/backends.md" %
                (cell_name(cell), fragment))
        elif fragment is not None and fragment not in r.stderr:
            errors = re.findall(r"error: .*", r.stderr) or [r.stderr[-2000:]]
            problems.append("%s: fails, but not with %r: %s" %
                            (cell_name(cell), fragment, errors[0][:400]))
        alias = ALIASES.get((cell[2], cell[3]))
        if alias and r.returncode == 0 and alias not in r.stderr:
            problems.append("%s: expected the note %r" % (cell_name(cell),
                                                          alias))

    # The table (docs/backends.md) with each cell's compile CPU seconds.
    columns = [b + (":" + t if t else "") for b, t in TARGETS]
    table = ["| model | dtype | " + " | ".join(columns) + " |",
             "|" + "---|" * (len(columns) + 2)]
    for m in MODELS:
        for d in DTYPES:
            row = []
            for b, t in TARGETS:
                cell = (m, d, b, t)
                if cell not in results:
                    row.append("")
                    continue
                r, _, cpu = results[cell]
                mark = "ok" if r.returncode == 0 else "IREE error"
                row.append("%s %.0fs" % (mark, cpu))
            table.append("| %s | %s | %s |" % (m, d, " | ".join(row)))
    with open(os.path.join(work, "matrix.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))
    cpu_total = sum(v[2] for v in results.values())
    print("%d cells in %.1f s wall (%.1f s cpu) with %d parallel compiles" %
          (len(cells), total, cpu_total, jobs))
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
