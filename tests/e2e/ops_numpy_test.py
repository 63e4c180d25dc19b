#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""StableHLO ops compiled by `pcp compile` and run by `pcp run` (real IREE on
CPU), each output checked against NumPy computing the same thing.

Run by ctest with the project's .venv python; PCP_BINARY names the binary.
Prints one line per case and closes with 'N passed, M failed'.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

PCP = os.environ["PCP_BINARY"]
rng = np.random.default_rng(1234)

CASES = []


def case(name, mlir, inputs, reference, rtol=1e-5, atol=1e-6):
    CASES.append((name, mlir, inputs, reference, rtol, atol))


x = rng.standard_normal((3, 4)).astype(np.float32)
w = rng.standard_normal((4, 5)).astype(np.float32)
case("dot_general", """
func.func @main(%x: tensor<3x4xf32>, %w: tensor<4x5xf32>) -> tensor<3x5xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}""", [x, w], lambda x, w: x @ w)

bq = rng.standard_normal((2, 3, 4)).astype(np.float32)
bk = rng.standard_normal((2, 4, 6)).astype(np.float32)
case("dot_general_batched", """
func.func @main(%q: tensor<2x3x4xf32>, %k: tensor<2x4x6xf32>) -> tensor<2x3x6xf32> {
  %0 = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x6xf32>) -> tensor<2x3x6xf32>
  return %0 : tensor<2x3x6xf32>
}""", [bq, bk], lambda q, k: np.einsum("bij,bjk->bik", q, k))

b = rng.standard_normal((5,)).astype(np.float32)
case("broadcast_in_dim", """
func.func @main(%b: tensor<5xf32>) -> tensor<3x5xf32> {
  %0 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<5xf32>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}""", [b], lambda b: np.broadcast_to(b, (3, 5)))

r = rng.standard_normal((4, 6)).astype(np.float32)
case("reduce_sum_and_max", """
func.func @main(%x: tensor<4x6xf32>) -> (tensor<4xf32>, tensor<6xf32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x6xf32>, tensor<f32>) -> tensor<4xf32>
  %1 = stablehlo.reduce(%x init: %m) applies stablehlo.maximum across dimensions = [0] : (tensor<4x6xf32>, tensor<f32>) -> tensor<6xf32>
  return %0, %1 : tensor<4xf32>, tensor<6xf32>
}""", [r], lambda x: (x.sum(axis=1), x.max(axis=0)))

table = rng.standard_normal((10, 3)).astype(np.float32)
idx = np.array([[7], [0], [3], [3]], dtype=np.int32)
case("gather_rows", """
func.func @main(%t: tensor<10x3xf32>, %i: tensor<4x1xi32>) -> tensor<4x3xf32> {
  %0 = "stablehlo.gather"(%t, %i) {
    dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>,
    slice_sizes = array<i64: 1, 3>, indices_are_sorted = false
  } : (tensor<10x3xf32>, tensor<4x1xi32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}""", [table, idx], lambda t, i: t[i[:, 0]])

c = (rng.standard_normal((6,)) * 10).astype(np.float32)
case("convert_f32_to_i32_and_bf16", """
func.func @main(%x: tensor<6xf32>) -> (tensor<6xi32>, tensor<6xf32>) {
  %0 = stablehlo.convert %x : (tensor<6xf32>) -> tensor<6xi32>
  %1 = stablehlo.convert %x : (tensor<6xf32>) -> tensor<6xbf16>
  %2 = stablehlo.convert %1 : (tensor<6xbf16>) -> tensor<6xf32>
  return %0, %2 : tensor<6xi32>, tensor<6xf32>
}""", [c], lambda x: (x.astype(np.int32), _bf16_round(x)), rtol=0, atol=0)

p = rng.standard_normal((2, 5)).astype(np.float32)
q = rng.standard_normal((2, 5)).astype(np.float32)
case("compare_and_select", """
func.func @main(%a: tensor<2x5xf32>, %b: tensor<2x5xf32>) -> (tensor<2x5xf32>, tensor<2x5xi1>) {
  %0 = stablehlo.compare GT, %a, %b : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xi1>
  %1 = stablehlo.select %0, %a, %b : tensor<2x5xi1>, tensor<2x5xf32>
  return %1, %0 : tensor<2x5xf32>, tensor<2x5xi1>
}""", [p, q], lambda a, b: (np.where(a > b, a, b), a > b), rtol=0, atol=0)

s = rng.standard_normal((2, 3, 4)).astype(np.float32)
case("reshape_and_transpose", """
func.func @main(%x: tensor<2x3x4xf32>) -> (tensor<6x4xf32>, tensor<4x2x3xf32>) {
  %0 = stablehlo.reshape %x : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %1 = stablehlo.transpose %x, dims = [2, 0, 1] : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
  return %0, %1 : tensor<6x4xf32>, tensor<4x2x3xf32>
}""", [s], lambda x: (x.reshape(6, 4), x.transpose(2, 0, 1)), rtol=0, atol=0)

h = rng.standard_normal((4, 8)).astype(np.float32)
hw = rng.standard_normal((8, 3)).astype(np.float32)
case("mlp_layer_with_softmax", """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  %m0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %mx = stablehlo.reduce(%0 init: %m0) applies stablehlo.maximum across dimensions = [1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<4xf32>
  %mb = stablehlo.broadcast_in_dim %mx, dims = [0] : (tensor<4xf32>) -> tensor<4x3xf32>
  %d = stablehlo.subtract %0, %mb : tensor<4x3xf32>
  %e = stablehlo.exponential %d : tensor<4x3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<4xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x3xf32>
  %r = stablehlo.divide %e, %sb : tensor<4x3xf32>
  return %r : tensor<4x3xf32>
}""", [h, hw], lambda x, w: _softmax(x @ w))


def _bf16_round(x):
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def run_case(tmp, name, mlir, inputs, reference, rtol, atol):
    path = os.path.join(tmp, name + ".mlir")
    with open(path, "w") as f:
        f.write(mlir)
    args = [PCP, "run", path]
    for i, a in enumerate(inputs):
        npy = os.path.join(tmp, "%s_in%d.npy" % (name, i))
        np.save(npy, a)
        args += ["--input", "@" + npy]
    expected = reference(*inputs)
    if not isinstance(expected, tuple):
        expected = (expected,)
    outs = [os.path.join(tmp, "%s_out%d.npy" % (name, i)) for i in range(len(expected))]
    for o in outs:
        args += ["--output", "@" + o]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return "pcp run failed (%d): %s" % (proc.returncode, proc.stderr.strip())
    for o, e in zip(outs, expected):
        got = np.load(o)
        e = np.asarray(e)
        if got.shape != e.shape:
            return "shape %s, expected %s" % (got.shape, e.shape)
        if got.dtype != e.dtype:
            return "dtype %s, expected %s" % (got.dtype, e.dtype)
        if not np.allclose(got, e, rtol=rtol, atol=atol):
            return "values differ by up to %g" % np.max(np.abs(got.astype(np.float64) - e))
    return None


def main():
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PCP_CACHE_DIR", os.path.join(tmp, "cache"))
        for name, mlir, inputs, reference, rtol, atol in CASES:
            error = run_case(tmp, name, mlir, inputs, reference, rtol, atol)
            if error:
                failed += 1
                print("FAIL %s: %s" % (name, error))
            else:
                passed += 1
                print("ok   %s" % name)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
