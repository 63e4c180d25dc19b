#!/usr/bin/env bash
# `make image`: the PCP runtime image, built without any registry.
#   1. a Debian bookworm minbase root with the runtime packages of
#      deploy/image/packages.txt, bootstrapped by mmdebstrap from the mirrors
#      in the host's apt sources and cached as a tarball under
#      ~/.cache/pcp/image/ (key: the package list, suite and mirrors);
#   2. that root imported as the base image localhost/pcp-base:<key>;
#   3. the pinned wheels of tools/setup/requirements.txt (downloaded once
#      into ~/.cache/pcp/image/wheels-<hash>/, then used offline);
#   4. `podman build --pull=never` (deploy/image/Containerfile) adds the venv,
#      the user pcp and build/pcp, tagged localhost/pcp:<version> and
#      localhost/pcp:latest;
#   5. `podman save --format oci-archive` to build/pcp-image.tar.
# Environment: PCP_BINARY (default build/pcp), PCP_IMAGE_CACHE (default
# ~/.cache/pcp/image), PCP_IMAGE_SAVE=0 skips step 5 (the test and the bench
# only need the image in the store).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
log() { printf 'image: %s\n' "$*" >&2; }
die() { printf 'image: error: %s\n' "$*" >&2; exit 1; }

pcp=${PCP_BINARY:-build/pcp}
[[ -x $pcp ]] || die "$pcp is missing: run 'make build' first"
for tool in podman mmdebstrap runc; do
  command -v "$tool" >/dev/null ||
    die "'$tool' is not installed (Debian package $tool; 'make setup' installs it)"
done
version=$("$pcp" version | head -n 1)
version=${version#pcp }
[[ $version =~ ^[0-9A-Za-z._+-]+$ ]] || die "cannot read the version from '$pcp version'"

cache=${PCP_IMAGE_CACHE:-$HOME/.cache/pcp/image}
mkdir -p "$cache"
suite=bookworm

# The host's apt mirrors for $suite (one-line sources.list and deb822
# .sources files), as "deb URI SUITE COMPONENTS" lines for mmdebstrap.
mirrors=$(python3 - "$suite" <<'EOF'
import glob, re, sys
suite = sys.argv[1]
lines = []
def add(uri, s, components):
    if s == suite or s.startswith(suite + "-"):
        lines.append("deb %s %s %s" % (uri, s, " ".join(components or ["main"])))
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        text = open(path).read()
    except OSError:
        continue
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            add(words[1], words[2], words[3:])
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for para in open(path).read().split("\n\n"):
        fields = {}
        for line in para.splitlines():
            m = re.match(r"([A-Za-z-]+):\s*(.*)", line)
            if m and not line.startswith("#"):
                fields[m.group(1).lower()] = m.group(2).split()
        if "deb" not in fields.get("types", []):
            continue
        if fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        for uri in fields.get("uris", []):
            for s in fields.get("suites", []):
                add(uri, s, fields.get("components"))
print("\n".join(dict.fromkeys(lines)))
EOF
)
[[ -n $mirrors ]] || die "no '$suite' mirror in the host's apt sources (/etc/apt/sources.list*)"
mapfile -t mirror_lines <<<"$mirrors"
packages=$(grep -vE '^\s*(#|$)' deploy/image/packages.txt | sort -u | paste -sd, -)

# Docs, man pages and locales are not needed at run time.
mmdebstrap_options=(
  --variant=minbase
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --include="$packages"
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
)
key=$(printf '%s\n' "$suite" "${mmdebstrap_options[@]}" "${mirror_lines[@]}" |
  sha256sum | cut -c1-16)
rootfs=$cache/rootfs-$key.tar
base=localhost/pcp-base:$key

start=$SECONDS
if [[ ! -f $rootfs || ! -s $rootfs ]]; then
  log "bootstrapping Debian $suite (minbase + $(tr ',' ' ' <<<"$packages")) from: ${mirror_lines[*]}"
  tmp=$cache/rootfs-$key.$$.partial.tar  # the suffix tells mmdebstrap the format
  rm -rf "$tmp"
  if ! mmdebstrap --quiet "${mmdebstrap_options[@]}" "$suite" "$tmp" \
    "${mirror_lines[@]}" >"$cache/mmdebstrap-$key.log" 2>&1; then
    tail -n 30 "$cache/mmdebstrap-$key.log" >&2
    rm -rf "$tmp"
    die "mmdebstrap failed (log: $cache/mmdebstrap-$key.log)"
  fi
  mv "$tmp" "$rootfs"
  rm -f "$cache/mmdebstrap-$key.log"
  log "root filesystem: $rootfs ($(du -m "$rootfs" | cut -f1) MB, $((SECONDS - start)) s)"
else
  log "root filesystem cached: $rootfs"
fi
if ! podman image exists "$base"; then
  podman import --quiet "$rootfs" "$base" >/dev/null || die "podman import $rootfs failed"
  log "imported $base"
fi

# The wheels: downloaded once for the pinned set, then installed offline.
requirements=tools/setup/requirements.txt
# pip itself comes from Debian's python3-pip-whl (python3.11-venv needs it).
pip_wheel=$(find /usr/share/python-wheels -maxdepth 1 -name "pip-*.whl" 2>/dev/null | sort | tail -n 1)
[[ -n $pip_wheel ]] || die "no pip wheel in /usr/share/python-wheels (Debian package python3-pip-whl)"
wheel_key=$(sha256sum <"$requirements" | cut -c1-16)
wheels=$cache/wheels-$wheel_key
if [[ ! -f $wheels/.complete ]]; then
  venv_python=${PCP_VENV:-$root/.venv}/bin/python
  [[ -x $venv_python ]] || venv_python=python3
  log "downloading the pinned wheels of $requirements into $wheels"
  rm -rf "$wheels"
  mkdir -p "$wheels"
  "$venv_python" -m pip download --quiet --disable-pip-version-check \
    --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --dest "$wheels" -r "$requirements" ||
    die "downloading the wheels failed (an offline machine needs $wheels filled by a connected one)"
  touch "$wheels/.complete"
fi

# The build context: the binary and the wheels (hard links), nothing else;
# its own directory, so that two builds at once do not share one.
context=$(mktemp -d "$cache/context.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/wheels"
cp "$pcp" "$context/pcp"
strip --strip-unneeded "$context/pcp" 2>/dev/null || true
cp -l "$wheels"/*.whl "$context/wheels/" 2>/dev/null || cp "$wheels"/*.whl "$context/wheels/"
cp "$pip_wheel" "$context/wheels/"
grep -vE '^\s*(#|$)' "$requirements" >"$context/wheels/requirements.txt"

log "podman build localhost/pcp:$version"
build_start=$SECONDS
podman build --quiet --pull=never --runtime runc --network=none \
  --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  --build-arg BASE="$base" --build-arg PCP_VERSION="$version" \
  --file deploy/image/Containerfile \
  --tag "localhost/pcp:$version" --tag localhost/pcp:latest \
  "$context" >/dev/null || die "podman build failed"
# The images this replaced (same tags, older binary) are dangling now.
podman image prune -f --filter label=org.opencontainers.image.title=pcp >/dev/null 2>&1 || true
log "built localhost/pcp:$version and localhost/pcp:latest ($((SECONDS - build_start)) s; $(podman image inspect --format '{{.Size}}' "localhost/pcp:$version" | awk '{printf "%.0f MB", $1/1e6}'))"

if [[ ${PCP_IMAGE_SAVE:-1} != 0 ]]; then
  rm -f build/pcp-image.tar
  podman save --quiet --format oci-archive -o build/pcp-image.tar \
    "localhost/pcp:$version" || die "podman save failed"
  log "saved build/pcp-image.tar ($(du -m build/pcp-image.tar | cut -f1) MB)"
fi
log "done in $((SECONDS - start)) s"
