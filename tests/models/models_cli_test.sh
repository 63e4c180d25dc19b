#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `pcp model` through the real binary: good invocations print the parameter
# count and write the files; bad arguments (bounds, divisibility, unknown
# architecture, missing -o) exit 2 with one clear line; an unwritable output
# exits 1. Never a crash (exit codes >= 128 would mean a signal).
set -u
PCP=${PCP_BINARY:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# expect NAME EXIT_CODE PATTERN -- command...
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" <<<"$out"; then
    pass=$((pass + 1))
    echo "ok   $name"
  else
    fail=$((fail + 1))
    echo "FAIL $name: exit $rc (want $want), output: $out"
  fi
}

small=(--layers 2 --heads 4 --width 64 --vocab 65 --block-size 32 --batch 64)

# nanochat_small of upstream: 14 tensors, 106,624 parameters.
expect "nanochat upstream size" 0 "^nanochat: 14 tensors, 106624 parameters \(f32\)$" -- \
  "$PCP" model nanochat "${small[@]}" -o "$tmp/n.mlir" --params-json "$tmp/n.json"
expect "params json written" 0 '"name": "lm_head.weight", "shape": \[65, 64\]' -- \
  cat "$tmp/n.json"
expect "mlir written" 0 "func.func @logits" -- cat "$tmp/n.mlir"
expect "gpt bf16" 0 "^gpt: 16 tensors, [0-9]+ parameters \(bf16\)$" -- \
  "$PCP" model gpt --layers 1 --heads 2 --width 16 --vocab 11 --block-size 4 \
  --batch 2 --dtype bf16 -o "$tmp/g.mlir"
expect "qwen3 gqa tied" 0 "^qwen3: 13 tensors" -- \
  "$PCP" model qwen3 --layers 1 --heads 4 --kv-heads 2 --width 32 --vocab 11 \
  --block-size 4 --batch 2 --tie-embeddings -o "$tmp/q.mlir"
expect "stdout output" 0 "module @pcp_qwen3" -- \
  "$PCP" model qwen3 --layers 1 --heads 4 --kv-heads 2 --width 32 --vocab 11 \
  --block-size 4 --batch 2 -o -
expect "emitted module inspects" 0 "public functions: @main, @logits" -- \
  "$PCP" inspect "$tmp/q.mlir"
expect "init dir" 0 "^14 files, 000.transformer.wte.weight.npy$" -- bash -c \
  "'$PCP' model nanochat ${small[*]} -o '$tmp/n.mlir' --init-dir '$tmp/init' --seed 1 >/dev/null &&
   echo \$(ls '$tmp/init' | wc -l) files, \$(ls '$tmp/init' | head -1)"
expect "init dir bf16 raw" 0 "^13 files, 001.model.layers.0.self_attn.q_proj.weight.bin$" -- bash -c \
  "'$PCP' model qwen3 --layers 1 --heads 4 --kv-heads 2 --width 32 --vocab 11 --block-size 4 \
   --batch 2 --dtype bf16 --tie-embeddings -o '$tmp/q.mlir' --init-dir '$tmp/qinit' >/dev/null &&
   echo \$(ls '$tmp/qinit' | wc -l) files, \$(ls '$tmp/qinit' | sed -n 2p)"
expect "help" 0 "usage: pcp model gpt\|nanochat\|qwen3" -- "$PCP" model --help

expect "no architecture" 2 "missing the architecture" -- "$PCP" model -o "$tmp/x.mlir"
expect "unknown architecture" 2 "unknown model 'llama'" -- "$PCP" model llama -o "$tmp/x.mlir"
expect "two architectures" 2 "expected one architecture" -- "$PCP" model gpt qwen3 -o "$tmp/x.mlir"
expect "missing output" 2 "missing -o" -- "$PCP" model gpt
expect "width % heads" 2 "width 130 is not a multiple of heads 4" -- \
  "$PCP" model gpt --width 130 -o "$tmp/x.mlir"
expect "heads % kv-heads" 2 "heads 4 is not a multiple of kv-heads 3" -- \
  "$PCP" model qwen3 --kv-heads 3 -o "$tmp/x.mlir"
expect "gpt has no gqa" 2 "gpt has no grouped-query attention" -- \
  "$PCP" model gpt --kv-heads 2 -o "$tmp/x.mlir"
expect "odd head size" 2 "even head size" -- \
  "$PCP" model nanochat --heads 2 --width 6 -o "$tmp/x.mlir"
expect "nanochat tied" 2 "untied" -- \
  "$PCP" model nanochat --tie-embeddings -o "$tmp/x.mlir"
expect "layers 0" 2 "layers" -- "$PCP" model gpt --layers 0 -o "$tmp/x.mlir"
expect "width too large" 2 "width" -- "$PCP" model gpt --width 1000000 -o "$tmp/x.mlir"
expect "negative vocab" 2 "vocab" -- "$PCP" model gpt --vocab -5 -o "$tmp/x.mlir"
expect "not a number" 2 "batch" -- "$PCP" model gpt --batch lots -o "$tmp/x.mlir"
expect "bad dtype" 2 "dtype" -- "$PCP" model gpt --dtype f16 -o "$tmp/x.mlir"
expect "unknown flag" 2 "unknown flag '--depth'" -- "$PCP" model gpt --depth 3 -o "$tmp/x.mlir"
expect "huge activations" 2 "activation of" -- \
  "$PCP" model gpt --batch 65536 --block-size 131072 --vocab 1048576 --width 64 \
  -o "$tmp/x.mlir"
expect "negative seed" 2 "seed" -- "$PCP" model gpt --seed -1 -o "$tmp/x.mlir"
expect "unwritable output" 1 "writing /nonexistent" -- \
  "$PCP" model gpt -o /nonexistent/dir/m.mlir

echo "$pass passed, $fail failed"
[[ $fail -eq 0 && $pass -gt 0 ]]
