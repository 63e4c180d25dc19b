#!/usr/bin/env bash
# The quickstart `make run` runs: inspect a StableHLO program, compile it with
# IREE for the CPU (cached), run it through PCP's IREE backend and print the
# result. (Later issues grow this into training a model on a gateway with
# local workers and answering a chat request.)
set -euo pipefail
cd "$(dirname "$0")/.."
pcp=build/pcp
model=examples/quickstart.mlir
out=build/quickstart.vmfb
echo "== pcp --version"
"$pcp" --version
echo
echo "== pcp inspect $model"
"$pcp" inspect "$model"
echo
echo "== pcp compile $model --backend cpu -o $out"
"$pcp" compile "$model" --backend cpu -o "$out" 2>&1
echo
echo "== pcp run $out (a 2-layer perceptron with a softmax head)"
"$pcp" run "$out" \
  --input 2x4xf32=1,2,3,4,-1,0.5,0,2 \
  --input 4x8xf32=0.1,-0.2,0.3,0.05,0.2,-0.1,0.4,0.0,0.3,0.1,-0.3,0.2,0.0,0.25,-0.05,0.1,-0.1,0.2,0.1,0.3,-0.2,0.0,0.15,0.05,0.2,0.0,0.05,-0.1,0.3,0.1,0.0,0.2 \
  --input 8xf32=0.01 \
  --input 8x3xf32=0.5,-0.2,0.1,0.0,0.3,-0.1,0.2,0.2,0.2,-0.3,0.1,0.4,0.1,0.0,-0.2,0.25,-0.25,0.0,0.05,0.1,0.3,-0.1,0.2,0.0
