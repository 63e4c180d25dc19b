#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every VJP rule of `pcp compile --program grad` against central finite
differences in f64.

One forward-loss module holds one small term per rule,
loss = sum_r sum(w_r * f_r(p_r)), with its own parameter p_r and random
weights w_r (data arguments), so one compile covers every rule and each
parameter's gradient checks exactly one rule. The derived module (forward
@main and @compute_gradients) is compiled by `pcp compile` and run on IREE's
CPU driver; the finite differences call @main at p +- h e_i.
Prints one line per rule with its max relative error and closes with
'N passed, M failed'.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import iree.compiler as ireec
import iree.runtime as ireert

PCP = os.environ["PCP_BINARY"]
rng = np.random.default_rng(7)
TOL = 1e-6

# (rule name, param shapes, result shape, body). The body uses %a, %b (the
# params) and defines %r; names are made unique per term.
T = "tensor<{}xf64>"


def t(shape):
    return "tensor<" + "".join(f"{d}x" for d in shape) + "f64>"


TERMS = []


def term(name, params, result, body):
    TERMS.append((name, params, result, body))


def unary(op, shape=(3, 4)):
    term(op, [shape], shape,
         f'%r = "stablehlo.{op}"(%a) : ({t(shape)}) -> {t(shape)}')


def binary(op, shape=(2, 5)):
    term(op, [shape, shape], shape,
         f'%r = "stablehlo.{op}"(%a, %b) : ({t(shape)}, {t(shape)}) -> {t(shape)}')


for op in ["add", "subtract", "multiply", "divide", "power", "maximum",
           "minimum", "atan2"]:
    binary(op)
for op in ["negate", "exponential", "exponential_minus_one", "log",
           "log_plus_one", "tanh", "logistic", "rsqrt", "sqrt", "abs", "sine",
           "cosine", "tan"]:
    unary(op)
term("erf", [(3, 4)], (3, 4),
     f'%r = "chlo.erf"(%a) : ({t((3,4))}) -> {t((3,4))}')
term("clamp", [(3, 4), ()], (3, 4), f'''%k = "stablehlo.constant"() {{value = dense<0.5> : {t((3,4))}}} : () -> {t((3,4))}
    %r = "stablehlo.clamp"(%b, %a, %k) : (tensor<f64>, {t((3,4))}, {t((3,4))}) -> {t((3,4))}''')
term("transpose", [(2, 3, 4)], (4, 2, 3),
     f'%r = "stablehlo.transpose"(%a) {{permutation = array<i64: 2, 0, 1>}} : ({t((2,3,4))}) -> {t((4,2,3))}')
term("reshape", [(2, 6)], (3, 4),
     f'%r = "stablehlo.reshape"(%a) : ({t((2,6))}) -> {t((3,4))}')
term("convert", [(5,)], (5,),
     f'%r = "stablehlo.convert"(%a) : ({t((5,))}) -> {t((5,))}')
term("broadcast_in_dim", [(3, 1)], (2, 4, 3),
     f'%r = "stablehlo.broadcast_in_dim"(%a) {{broadcast_dimensions = array<i64: 2, 1>}} : ({t((3,1))}) -> {t((2,4,3))}')
term("broadcast_in_dim_transposing", [(3, 4)], (4, 2, 3),
     f'%r = "stablehlo.broadcast_in_dim"(%a) {{broadcast_dimensions = array<i64: 2, 0>}} : ({t((3,4))}) -> {t((4,2,3))}')
REDUCE = '''%z = "stablehlo.constant"() {{value = dense<{init}> : tensor<f64>}} : () -> tensor<f64>
    %r = "stablehlo.reduce"(%a, %z) ({{
    ^bb0(%x: tensor<f64>, %y: tensor<f64>):
      %s = "stablehlo.{op}"(%x, %y) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      "stablehlo.return"(%s) : (tensor<f64>) -> ()
    }}) {{dimensions = array<i64: {dims}>}} : ({tin}, tensor<f64>) -> {tout}'''
term("reduce_add", [(3, 4, 2)], (4,), REDUCE.format(
    init="0.0", op="add", dims="0, 2", tin=t((3, 4, 2)), tout=t((4,))))
term("reduce_max", [(3, 5)], (3,), REDUCE.format(
    init="0xFFF0000000000000", op="maximum", dims="1", tin=t((3, 5)), tout=t((3,))))
term("reduce_min", [(3, 5)], (5,), REDUCE.format(
    init="0x7FF0000000000000", op="minimum", dims="0", tin=t((3, 5)), tout=t((5,))))
term("dot_general", [(3, 2, 4), (4, 5, 3)], (3, 2, 5),
     f'%r = "stablehlo.dot_general"(%a, %b) {{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [2], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [0]>}} : ({t((3,2,4))}, {t((4,5,3))}) -> {t((3,2,5))}')
term("dot_general_matmul", [(3, 4), (4, 2)], (3, 2),
     f'%r = "stablehlo.dot_general"(%a, %b) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : ({t((3,4))}, {t((4,2))}) -> {t((3,2))}')
term("select", [(4, 3), (4, 3)], (4, 3), f'''%c = "stablehlo.compare"(%a, %b) {{comparison_direction = #stablehlo<comparison_direction GT>}} : ({t((4,3))}, {t((4,3))}) -> tensor<4x3xi1>
    %r = "stablehlo.select"(%c, %a, %b) : (tensor<4x3xi1>, {t((4,3))}, {t((4,3))}) -> {t((4,3))}''')
term("slice", [(7, 5)], (3, 2),
     f'%r = "stablehlo.slice"(%a) {{start_indices = array<i64: 1, 0>, limit_indices = array<i64: 6, 4>, strides = array<i64: 2, 3>}} : ({t((7,5))}) -> {t((3,2))}')
term("pad", [(3, 2), ()], (8, 5), f'''%r = "stablehlo.pad"(%a, %b) {{edge_padding_low = array<i64: 1, 0>, edge_padding_high = array<i64: 2, 2>, interior_padding = array<i64: 1, 1>}} : ({t((3,2))}, tensor<f64>) -> {t((8,5))}''')
term("concatenate", [(2, 3), (4, 3)], (6, 3),
     f'%r = "stablehlo.concatenate"(%a, %b) {{dimension = 0 : i64}} : ({t((2,3))}, {t((4,3))}) -> {t((6,3))}')
term("gather", [(6, 3)], (4, 3), f'''%i = "stablehlo.constant"() {{value = dense<[[4], [0], [4], [2]]> : tensor<4x1xi64>}} : () -> tensor<4x1xi64>
    %r = "stablehlo.gather"(%a, %i) {{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 3>}} : ({t((6,3))}, tensor<4x1xi64>) -> {t((4,3))}''')
term("dynamic_slice", [(5, 4)], (2, 3), f'''%i = "stablehlo.constant"() {{value = dense<2> : tensor<i64>}} : () -> tensor<i64>
    %j = "stablehlo.constant"() {{value = dense<1> : tensor<i64>}} : () -> tensor<i64>
    %r = "stablehlo.dynamic_slice"(%a, %i, %j) {{slice_sizes = array<i64: 2, 3>}} : ({t((5,4))}, tensor<i64>, tensor<i64>) -> {t((2,3))}''')
term("dynamic_update_slice", [(5, 4), (2, 2)], (5, 4), f'''%i = "stablehlo.constant"() {{value = dense<1> : tensor<i64>}} : () -> tensor<i64>
    %j = "stablehlo.constant"() {{value = dense<2> : tensor<i64>}} : () -> tensor<i64>
    %r = "stablehlo.dynamic_update_slice"(%a, %b, %i, %j) : ({t((5,4))}, {t((2,2))}, tensor<i64>, tensor<i64>) -> {t((5,4))}''')
# Reuse: one value feeding two ops (gradient accumulation) and iota/constant
# operands that get no gradient.
term("fan_out_iota", [(4,)], (4,), f'''%k = "stablehlo.iota"() {{iota_dimension = 0 : i64}} : () -> {t((4,))}
    %e = "stablehlo.multiply"(%a, %k) : ({t((4,))}, {t((4,))}) -> {t((4,))}
    %q = "stablehlo.multiply"(%a, %a) : ({t((4,))}, {t((4,))}) -> {t((4,))}
    %r = "stablehlo.add"(%e, %q) : ({t((4,))}, {t((4,))}) -> {t((4,))}''')


def build_module():
    params, weights, lines, term_values = [], [], [], []
    for n, (name, pshapes, rshape, body) in enumerate(TERMS):
        names = []
        for k, shape in enumerate(pshapes):
            names.append(f"%p{n}_{k}")
            params.append((f"%p{n}_{k}", shape, name))
        size = int(np.prod(rshape)) if rshape else 1
        weights.append((f"%w{n}", (size,)))
        text = body
        # Rename the body's local names to unique ones.
        for local in ["%r", "%z", "%x", "%y", "%s", "%c", "%i", "%j", "%k",
                      "%e", "%q"]:
            text = text.replace(local + " ", f"{local}{n}_ ")
            text = text.replace(local + ")", f"{local}{n}_)")
            text = text.replace(local + ",", f"{local}{n}_,")
            text = text.replace(local + ":", f"{local}{n}_:")
        text = text.replace("%a", names[0])
        if len(names) > 1:
            text = text.replace("%b", names[1])
        lines.append("    " + text)
        # Flattened before the weighted sum: a full reduce over a fused
        # rank-3 transpose hits an llvm-cpu codegen bug (vector.contract).
        rt = t((size,))
        lines.append(f'    %f{n} = "stablehlo.reshape"(%r{n}_) : ({t(rshape)}) -> {rt}')
        lines.append(f'    %m{n} = "stablehlo.multiply"(%f{n}, %w{n}) : ({rt}, {rt}) -> {rt}')
        dims = "0"
        lines.append(REDUCE.format(init="0.0", op="add", dims=dims, tin=rt,
                                   tout="tensor<f64>")
                     .replace("%z", f"%zs{n}").replace("%r ", f"%l{n} ")
                     .replace("%a", f"%m{n}").replace("%x", f"%xs{n}")
                     .replace("%y", f"%ys{n}").replace("%s ", f"%ss{n} ")
                     .replace("%s)", f"%ss{n})"))
        term_values.append(f"%l{n}")
    acc = term_values[0]
    for n, v in enumerate(term_values[1:]):
        lines.append(f'    %acc{n} = "stablehlo.add"({acc}, {v}) : (tensor<f64>, tensor<f64>) -> tensor<f64>')
        acc = f"%acc{n}"
    args = [f"{p}: {t(s)}" for p, s, _ in params] + [f"{w}: {t(s)}" for w, s in weights]
    text = ("func.func @main(" + ", ".join(args) + ") -> tensor<f64> {\n" +
            "\n".join(lines) + f"\n    return {acc} : tensor<f64>\n}}\n")
    return text, params, weights


def run(args, **kw):
    result = subprocess.run(args, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"command failed: {' '.join(args)}")
    return result


def compile_f64(text):
    # `pcp compile`'s flag table lets IREE demote f64 to f32 (its default);
    # finite differences need real f64, so this test compiles the derived
    # text itself with demotion off.
    vmfb = ireec.compile_str(
        text, target_backends=["llvm-cpu"],
        extra_args=["--iree-input-demote-f64-to-f32=false",
                    "--iree-llvmcpu-target-cpu=host",
                    "--iree-llvmcpu-link-embedded=false"])
    return ireert.load_vm_flatbuffer(vmfb, driver="local-task")


def main():
    text, params, weights = build_module()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "terms.mlir")
        with open(src, "w") as f:
            f.write(text)
        derived = os.path.join(tmp, "terms.grad.mlir")
        run([PCP, "compile", "--program", "grad", "--data-args",
             str(len(weights)), src, "--emit-mlir", derived])
        with open(derived) as f:
            derived_text = f.read()
    module = compile_f64(derived_text)
    p_values = []
    for _, shape, name in params:
        if name == "clamp" and not shape:
            p_values.append(np.array(-0.3))
        elif name == "tan":
            p_values.append(rng.uniform(-1, 1, shape))
        elif name in ("log", "sqrt", "rsqrt", "power", "log_plus_one"):
            p_values.append(rng.uniform(0.5, 1.5, shape))
        elif name == "abs":
            p_values.append(rng.choice([-1, 1], shape) * rng.uniform(0.2, 1, shape))
        else:
            p_values.append(rng.standard_normal(shape))
    w_values = [rng.standard_normal(s) for _, s in weights]

    def loss(ps):
        return float(np.asarray(module.main(*ps, *w_values)))

    out = module.compute_gradients(*p_values, *w_values)
    got_loss = float(np.asarray(out[0]))
    grads = [np.asarray(g) for g in out[1:]]
    failures = 0
    by_rule = {}
    assert abs(got_loss - loss(p_values)) <= 1e-12 * max(1, abs(got_loss))
    for k, (_, shape, name) in enumerate(params):
        fd = np.zeros(shape)
        h = 1e-5
        for index in np.ndindex(*shape) if shape else [()]:
            plus = [p.copy() for p in p_values]
            minus = [p.copy() for p in p_values]
            plus[k][index] += h
            minus[k][index] -= h
            fd[index] = (loss(plus) - loss(minus)) / (2 * h)
        scale = max(1.0, float(np.max(np.abs(fd))))
        err = float(np.max(np.abs(grads[k] - fd))) / scale
        by_rule[name] = max(by_rule.get(name, 0.0), err)
    for name, err in by_rule.items():
        ok = err <= TOL
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:32s} max rel err {err:.2e}")
    print(f"{len(by_rule) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
