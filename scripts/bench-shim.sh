#!/usr/bin/env bash
# The shim's overhead: `ctr run --rm` of `true` through containerd-shim-pvisor-v1
# beside `pvisor run --executor vm -- true` over the same rootfs (the image's
# layer, unpacked), interleaved in one run (the order alternates each round),
# with one state directory.
# Usage: scripts/bench-shim.sh [ROUNDS]   (default 7, at least 5; needs root)
# Uses target/debug (PVISOR_BIN_DIR to change), a private containerd in
# target/bench-containerd, and the image scripts/oci-image.sh builds.
#
# Each run's wall time is split with its Job's Trace: "vm start" is the vm
# executor's own work (attempt.created to attempt.started: imaging the
# rootfs, booting, the first exec), the same for both paths and the noisiest
# part on a shared machine; "rest" is everything else (containerd and the
# shim, or the CLI; the exit, the teardown and the records). Prints the
# medians of each, the ratio of the totals, and what the shim adds beyond
# the VM start (the issue's budget: <= 150 ms). A third arm runs the same
# `ctr run --rm` with a read-write volume (shared through virtiofs, so the VM
# boots instead of cloning a template) and prints what the share costs.
# Beside them, runc does the same through the same containerd: `ctr run
# --rm` of `true`, and `ctr task exec` of `true` into a running container
# of each runtime (the exec latency), so the VM's price is a ratio.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-7}"
[ "$rounds" -ge 5 ] || { echo "bench-shim: at least 5 rounds, for medians" >&2; exit 2; }
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
last_job() { "$bin/pvisor" jobs | tail -1 | awk '{print $1}'; }
# "TOTAL_MS VM_START_MS" of the last Job, TOTAL_MS measured by the caller.
record() {
  local total="$1" job
  job="$(last_job)"
  "$bin/pvisor" events --json "$job" | python3 -c '
import json, sys
from datetime import datetime
t = {}
for line in sys.stdin:
    e = json.loads(line)["data"]
    t.setdefault(e["type"], datetime.fromisoformat(e["time"].replace("Z", "+00:00")))
start = (t["attempt.started"] - t["attempt.created"]).total_seconds() * 1000
print(sys.argv[1], round(start))' "$total"
}
mkdir -p "$dir/volume"
# run_shim ID OUT [CTR_ARGS...]
run_shim() {
  local t id="$1" out="$2"
  shift 2
  t=$(now)
  ctr -a "$sock" run --rm --runtime io.containerd.pvisor.v1 "$@" docker.io/pvisor/busybox:latest "bench-$id" true
  record $(( ($(now) - t) / 1000000 )) >>"$dir/$out"
}
run_shared() {
  run_shim "v$1" shared.txt --mount "type=bind,src=$dir/volume,dst=/data,options=rbind:rw"
}
# run_runc ID: the same container under runc; the total alone.
run_runc() {
  local t
  t=$(now)
  ctr -a "$sock" run --rm --runtime io.containerd.runc.v2 docker.io/pvisor/busybox:latest "bench-r$1" true
  echo $(( ($(now) - t) / 1000000 )) 0 >>"$dir/runc.txt"
}
# exec_into CONTAINER ID OUT: `true` exec'd into a running container.
exec_into() {
  local t
  t=$(now)
  ctr -a "$sock" task exec --exec-id "x$2" "$1" true
  echo $(( ($(now) - t) / 1000000 )) 0 >>"$dir/$3"
}
run_pvisor() {
  local t
  t=$(now)
  (cd "$ws" && "$bin/pvisor" run --executor vm -- true 2>/dev/null)
  record $(( ($(now) - t) / 1000000 )) >>"$dir/pvisor.txt"
}
: >"$dir/shim.txt"
: >"$dir/pvisor.txt"
: >"$dir/shared.txt"
: >"$dir/runc.txt"
: >"$dir/exec-pvisor.txt"
: >"$dir/exec-runc.txt"
for runtime in pvisor runc; do
  ctr -a "$sock" run -d --runtime "io.containerd.$runtime.v$([ $runtime = runc ] && echo 2 || echo 1)" \
    docker.io/pvisor/busybox:latest "bench-long-$runtime" sleep 100000 >/dev/null
done
stop_long() {
  for runtime in pvisor runc; do
    ctr -a "$sock" task kill -s SIGKILL "bench-long-$runtime" >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do
      ctr -a "$sock" task delete "bench-long-$runtime" >/dev/null 2>&1 && break
      sleep 0.2
    done
    ctr -a "$sock" container rm "bench-long-$runtime" >/dev/null 2>&1 || true
  done
  "$root/scripts/containerd-env.sh" stop "$dir"
}
trap stop_long EXIT
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then
    run_shim "$i" shim.txt; run_pvisor; run_shared "$i"; run_runc "$i"
    exec_into bench-long-pvisor "$i" exec-pvisor.txt; exec_into bench-long-runc "$i" exec-runc.txt
  else
    run_runc "$i"; run_shared "$i"; run_pvisor; run_shim "$i" shim.txt
    exec_into bench-long-runc "$i" exec-runc.txt; exec_into bench-long-pvisor "$i" exec-pvisor.txt
  fi
done
python3 - "$dir/shim.txt" "$dir/pvisor.txt" "$dir/shared.txt" "$dir/runc.txt" "$dir/exec-pvisor.txt" "$dir/exec-runc.txt" <<'PY'
import statistics, sys
def load(path):
    rows = [tuple(map(int, l.split())) for l in open(path) if l.strip()]
    total = [r[0] for r in rows]
    start = [r[1] for r in rows]
    rest = [r[0] - r[1] for r in rows]
    return total, start, rest
names = ("ctr run --rm (shim)", "pvisor run --executor vm", "ctr run --rm, shared volume")
data = [load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])]
med = [[statistics.median(col) for col in d] for d in data]
for name, d, m in zip(names, data, med):
    print(f"{name:26} total median {m[0]:6.0f} ms  vm start {m[1]:6.0f} ms  rest {m[2]:6.0f} ms")
    print(f"{'':26} totals {' '.join(map(str, d[0]))}")
print(f"ratio of the total medians (shim / pvisor run): {med[0][0] / med[1][0]:.2f}")
print(f"difference of the total medians:                {med[0][0] - med[1][0]:+.0f} ms")
print(f"shim overhead beyond the VM start (rest):       {med[0][2] - med[1][2]:+.0f} ms (budget 150 ms)")
print(f"a shared volume (boot + virtiofsd) / without:   {med[2][0] / med[0][0]:.2f} ({med[2][0] - med[0][0]:+.0f} ms)")
runc = statistics.median(load(sys.argv[4])[0])
exec_pvisor = statistics.median(load(sys.argv[5])[0])
exec_runc = statistics.median(load(sys.argv[6])[0])
print(f"ctr run --rm under runc:                        {runc:6.0f} ms; the shim / runc: {med[0][0] / runc:.2f}")
print(f"ctr task exec of true, pvisor / runc:           {exec_pvisor:.0f} / {exec_runc:.0f} ms = {exec_pvisor / exec_runc:.2f}")
PY
