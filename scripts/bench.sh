#!/usr/bin/env bash
# Every benchmark of the project, then one table: each figure's median beside
# a yardstick measured in the same run (bwrap and unshare, cp -a + sync, a
# direct connection, the ns executor, the run without seccomp, the agent on
# the host), and their ratio. Each bench's own lines (spreads, targets, the
# figures without a yardstick) are kept in target/bench/NAME.log.
#
# Usage: scripts/bench.sh [--quick] [BENCH...]   (default: every bench)
#   scripts/bench.sh                      optimized build, full sizes: long
#   scripts/bench.sh run_overhead effects just those
#   scripts/bench.sh --quick              each bench's smoke run (tiny sizes,
#                                         one or two samples, the debug build
#                                         the tests use): proves every bench and
#                                         this table work; the figures are not
#                                         measurements. The test suite runs it.
# Exit status: 1 if a bench failed (never because of a figure).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=false
if [ "${1:-}" = --quick ]; then
  quick=true
  shift
fi
all=(run_overhead effects checkpoint seccomp network vm vm_workspace serve density agents)
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=("${all[@]}")
for b in "${benches[@]}"; do
  [[ " ${all[*]} " == *" $b "* ]] || { echo "bench: no bench named $b; the benches: ${all[*]}" >&2; exit 2; }
done
# What the benches need: the yardsticks' tools, the vm guest image, the
# serve image and SDK, the agents (each script does nothing when present).
scripts/setup.sh
scripts/vm-image.sh
scripts/sandbox-image.sh
scripts/sdk-env.sh >/dev/null
scripts/agents-env.sh >/dev/null
out=target/bench
mkdir -p "$out"
failed=()
for b in "${benches[@]}"; do
  echo "bench: $b" >&2
  if $quick; then
    run=(cargo test -q -p pvisor-cli --bench "$b")
  else
    run=(cargo bench -q -p pvisor-cli --bench "$b")
  fi
  if ! "${run[@]}" >"$out/$b.log" 2>&1; then
    failed+=("$b")
    echo "bench: $b failed; its output: $out/$b.log" >&2
    tail -n 20 "$out/$b.log" >&2
  fi
done
python3 - "$out" "$quick" "${benches[@]}" <<'PY'
import json, sys
out, quick, benches = sys.argv[1], sys.argv[2] == "true", sys.argv[3:]
rows = []
for bench in benches:
    try:
        lines = open(f"{out}/{bench}.log", encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        continue
    rows += [(bench, json.loads(l.split("\t", 1)[1])) for l in lines if l.startswith("table-row\t")]
title = "smoke run: tiny sizes, not measurements" if quick else "medians; p10-p90 where sampled"
print(f"bench table ({title}); ratio = figure / yardstick")
print(f"{'bench':<13} {'figure':<46} {'median':>20}  {'yardstick':<28} {'median':>13} {'ratio':>7}")
for bench, r in rows:
    unit = r["unit"]
    fig = f"{r['median']:.1f} {unit}"
    if r.get("p10") is not None:
        fig += f" ({r['p10']:.0f}-{r['p90']:.0f})"
    base = r["yardstick_median"]
    ratio = f"{r['median'] / base:.2f}x" if base else "-"
    yard = f"{base:.1f} {unit}"
    print(f"{bench:<13} {r['measure'][:46]:<46} {fig:>20}  {r['yardstick'][:28]:<28} {yard:>13} {ratio:>7}")
missing = [b for b in benches if not any(b == bench for bench, _ in rows)]
if missing:
    print(f"no yardstick row from: {', '.join(missing)} (their figures, or why they skipped, are in {out}/NAME.log)")
PY
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
