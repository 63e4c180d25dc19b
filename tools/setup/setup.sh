#!/usr/bin/env bash
# PCP set-up: installs what is missing and nothing else.
#   1. Debian packages from tools/setup/apt-packages.txt (apt, only the missing ones)
#   2. .venv with the pinned wheels of tools/setup/requirements*.txt
# A second run with nothing missing does no network work: the venv is stamped
# with a hash of the requirement files and skipped when the stamp matches.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
log() { printf 'setup: %s\n' "$*" >&2; }

want=$(grep -vE '^\s*(#|$)' tools/setup/apt-packages.txt)
missing=()
for p in $want; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { log "need root or sudo to install: ${missing[*]}"; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv="$root/.venv"
stamp="$venv/.pcp-requirements.sha256"
hash=$(cat tools/setup/requirements.txt tools/setup/requirements-test.txt | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$hash" && -x "$venv/bin/python" ]]; then
  exit 0
fi
# The venv is made from Debian's python3.11 so that the libpython the worker
# embeds is the same interpreter whose site-packages hold the wheels.
if [[ ! -x "$venv/bin/python" ]]; then
  log "creating $venv"
  /usr/bin/python3.11 -m venv "$venv"
fi
log "installing pinned wheels (IREE compiler and runtime, numpy, test references)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -r tools/setup/requirements.txt -r tools/setup/requirements-test.txt
echo "$hash" >"$stamp"
log "done"
