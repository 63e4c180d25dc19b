#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds tests/fuzz/frame_decoder_fuzz.c with clang + libFuzzer + ASan/UBSan
# in its own build tree and runs it for a bounded time over the seed corpus.
# Usage: run_frame_decoder_fuzz.sh CLANG SOURCE_DIR BUILD_DIR SECONDS
set -euo pipefail
clang="$1"; src="$2"; build="$3"; seconds="$4"
command -v "$clang" >/dev/null 2>&1 || {
  echo "FAIL: clang not found ($clang): install clang and libclang-rt-14-dev" \
    "(make setup does)" >&2
  exit 1
}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_C_COMPILER="$clang" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPCP_FUZZ=ON -DPCP_ASAN=ON \
  -DPCP_WERROR=ON >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target frame_decoder_fuzz -j2
work="$build/frame_decoder_corpus"
mkdir -p "$work"
# New inputs go to the work directory; the committed seeds stay untouched.
ASAN_OPTIONS=detect_leaks=1 "$build/src/proto/frame_decoder_fuzz" \
  -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
  -dict="$src/tests/fuzz/frame_decoder.dict" \
  "$work" "$src/tests/fuzz/corpus/frame_decoder"
