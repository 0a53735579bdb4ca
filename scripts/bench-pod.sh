#!/usr/bin/env bash
# A Kubernetes pod on pvisor beside the same pod on runc, through the same
# containerd's CRI plugin (tests/cri/pod_bench.py, as the kubelet drives
# it), interleaved, the order alternating each round:
#   pod start       RunPodSandbox to the first container's first output line
#   second start    CreateContainer of a second container to its first line
#   exec            ExecSync of `true` into the first container (median of 7)
#   memory          the idle two-container pod: the PSS of its shim and all
#                   the shim started (pvisor: the pod's QEMU and virtiofsd;
#                   runc: the pause and container processes)
# Prints the medians of each and the ratios pvisor / runc.
# Usage: scripts/bench-pod.sh [ROUNDS]   (default 5, at least 3; needs root)
# Uses target/debug (PVISOR_BIN_DIR to change), a private containerd in
# target/bench-pod, the busybox image scripts/oci-image.sh builds and a
# pause image from it (runc's pod sandbox needs a command that lasts).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-5}"
[ "$rounds" -ge 3 ] || { echo "bench-pod: at least 3 rounds, for medians" >&2; exit 2; }
bin="${PVISOR_BIN_DIR:-$root/target/debug}"
dir="$root/target/bench-pod"
python="$("$root/scripts/cri-env.sh")"
image="$("$root/scripts/oci-image.sh")"
pause="$("$root/scripts/oci-image.sh" "$root/target/pause-image" docker.io/pvisor/pause:latest \
  '["/bin/sleep","2147483647"]')"
export SANDBOX_IMAGE=docker.io/pvisor/pause:latest
sock="$("$root/scripts/containerd-env.sh" start "$dir" "$bin")"
trap '"$root/scripts/containerd-env.sh" stop "$dir"' EXIT
for archive in "$image" "$pause"; do
  ctr -a "$sock" -n k8s.io images import "$archive" >/dev/null
done
: >"$dir/rounds.jsonl"
one() {
  local logs="$dir/logs/$1-$2"
  rm -rf "$logs" && mkdir -p "$logs"
  "$python" "$root/tests/cri/pod_bench.py" "$sock" docker.io/pvisor/busybox:latest "$logs" "$1" >>"$dir/rounds.jsonl"
}
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then one pvisor "$i"; one runc "$i"; else one runc "$i"; one pvisor "$i"; fi
  echo "bench-pod: round $i of $rounds" >&2
done
python3 - "$dir/rounds.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
errors = [r for r in rows if "error" in r]
if errors:
    sys.exit(f"bench-pod: {len(errors)} round(s) failed: {errors[0]}")
figures = [("pod start", "pod_start_ms", "ms"), ("second container start", "second_start_ms", "ms"),
           ("exec of true", "exec_ms", "ms"), ("idle two-container pod", "memory_kib", "KiB")]
print(f"{'figure':24} {'pvisor':>10} {'runc':>10} {'ratio':>7}   pvisor's samples")
for name, key, unit in figures:
    of = lambda h: [r[key] for r in rows if r["handler"] == h]
    p, r = statistics.median(of("pvisor")), statistics.median(of("runc"))
    print(f"{name:24} {p:>7.0f} {unit:<2} {r:>7.0f} {unit:<2} {p / r:>6.2f}×   {' '.join(str(v) for v in of('pvisor'))}")
PY
