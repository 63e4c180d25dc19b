#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `pcp run` maps only what it uses: libz3, libcurl and libmicrohttpd (with
# GnuTLS behind it) are opened with dlopen by the topology solver, the HTTP
# client and the HTTP server at first use, never at start-up
# (docs/decisions.md, "Lazy loading"). The dynamic loader's own trace
# (LD_DEBUG=files) lists every object it opens, start-up and dlopen alike.
set -u
PCP=${PCP_BINARY:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PCP_CACHE_DIR=${PCP_CACHE_DIR:-$tmp/cache}
fail=0

cat >"$tmp/add.mlir" <<'MLIR'
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
MLIR
if ! "$PCP" compile "$tmp/add.mlir" -o "$tmp/add.vmfb" >"$tmp/compile.log" 2>&1; then
  echo "FAIL pcp compile:"; cat "$tmp/compile.log"; exit 1
fi

# Not linked: no DT_NEEDED entry for either library.
needed=$(readelf -d "$PCP" | grep NEEDED)
for lib in libz3 libcurl libmicrohttpd libgnutls; do
  if grep -q "$lib" <<<"$needed"; then
    echo "FAIL $PCP is linked against $lib:"; echo "$needed"; fail=1
  else
    echo "ok   not linked: $lib"
  fi
done

# Not loaded by a real `pcp run` either (the loader's trace goes to a file).
out=$(LD_DEBUG=files LD_DEBUG_OUTPUT="$tmp/ld" "$PCP" run "$tmp/add.vmfb" \
  --input 4xf32=1,2,3,4 --input 4xf32=1 2>&1)
if ! grep -qx "4xf32=2 3 4 5" <<<"$out"; then
  echo "FAIL pcp run printed: $out"; fail=1
fi
trace=$(cat "$tmp"/ld.* 2>/dev/null)
# The trace must see what run does use, or its silence proves nothing.
if ! grep -q "file=libpython3" <<<"$trace"; then
  echo "FAIL the loader trace has no libpython (LD_DEBUG not honoured?)"; fail=1
fi
for lib in libz3 libcurl libmicrohttpd libgnutls; do
  if grep -q "file=$lib" <<<"$trace"; then
    echo "FAIL pcp run loaded $lib:"; grep "file=$lib" <<<"$trace" | head -3
    fail=1
  else
    echo "ok   pcp run does not load $lib"
  fi
done
exit $fail
