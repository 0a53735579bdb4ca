#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 60 s each) from the
# seed corpus in fuzz/corpus/<target>; new inputs go to fuzz/target/work-<target>.
#   scripts/fuzz.sh [SECONDS]
# cargo-fuzz drives libFuzzer through rustc flags that are nightly-only;
# RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them for this build only.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
for target in records upper http_inputs; do
  mkdir -p "target/work-$target"
  log="target/fuzz-$target.log"
  if ! cargo fuzz run --sanitizer none "$target" "target/work-$target" "corpus/$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $target found a failure (see fuzz/artifacts/$target)" >&2
    exit 1
  fi
  runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | grep -Eo '[0-9]+' | tail -1)
  echo "fuzz: $target ran ${runs:-?} executions in ${seconds}s without a failure"
done
