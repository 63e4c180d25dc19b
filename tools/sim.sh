#!/usr/bin/env bash
# Runs the deterministic simulation (src/sim, docs/simulation.md) over more
# seeds than `make test` does, or replays / shrinks one seed:
#   tools/sim.sh --seeds N [--first S]   N seeds from S (default 1)
#   tools/sim.sh --seed S [--trace]      one seed; its trace on stdout
#   tools/sim.sh --seed S --shrink       shrink a failing seed and print the
#                                        short schedule and its trace
# Scenario flags: --workers W --jobs J --steps K --no-faults --no-buggify.
# Exit status 0 when every seed passed, 1 when one failed, 2 for usage.
# PCP_BUILD_DIR overrides the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PCP_BUILD_DIR:-build}/pcp
[[ -x "$bin" ]] || { echo "sim: $bin not built (run make build)" >&2; exit 2; }
exec "$bin" sim "$@"
