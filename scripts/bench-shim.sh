#!/usr/bin/env bash
# The shim's overhead: `ctr run --rm` of `true` through containerd-shim-pvisor-v1
# beside `pvisor run --executor vm -- true` over the same rootfs (the image's
# layer, unpacked), interleaved in one run, with one state directory.
# Usage: scripts/bench-shim.sh [ROUNDS]   (default 5; needs root)
# Uses target/debug (PVISOR_BIN_DIR to change), a private containerd in
# target/bench-containerd, and the image scripts/oci-image.sh builds.
# Prints each median and the difference (the issue's budget: <= 150 ms).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-5}"
bin="${PVISOR_BIN_DIR:-$root/target/debug}"
dir="$root/target/bench-containerd"
image="$("$root/scripts/oci-image.sh")"
sock="$("$root/scripts/containerd-env.sh" start "$dir" "$bin")"
trap '"$root/scripts/containerd-env.sh" stop "$dir"' EXIT
# shellcheck disable=SC1091
. "$dir/env"
export PVISOR_HOME
ctr -a "$sock" images import "$image" >/dev/null
ws="$dir/rootfs"
if [ ! -e "$ws/bin/busybox" ]; then
  mkdir -p "$ws"
  manifest="$(tar -xOf "$image" ./index.json | jq -r '.manifests[0].digest' | cut -d: -f2)"
  layer="$(tar -xOf "$image" "./blobs/sha256/$manifest" | jq -r '.layers[0].digest' | cut -d: -f2)"
  tar -xOf "$image" "./blobs/sha256/$layer" | tar -xz -C "$ws"
fi
now() { date +%s%N; }
shim=() pvisor=()
for i in $(seq 1 "$rounds"); do
  t=$(now); ctr -a "$sock" run --rm --runtime io.containerd.pvisor.v1 docker.io/pvisor/busybox:latest "bench-$i" true
  shim+=($(( ($(now) - t) / 1000000 )))
  t=$(now); (cd "$ws" && "$bin/pvisor" run --executor vm -- true 2>/dev/null)
  pvisor+=($(( ($(now) - t) / 1000000 )))
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
s="$(median "${shim[@]}")" p="$(median "${pvisor[@]}")"
echo "ctr run --rm (shim):        median ${s} ms  (${shim[*]})"
echo "pvisor run --executor vm:   median ${p} ms  (${pvisor[*]})"
echo "shim overhead:              $(( s - p )) ms"
