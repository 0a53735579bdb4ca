#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, the end-to-end tests and
# the escape corpus (real namespaces and overlays, as root and as an
# unprivileged user), the vm executor's tests (real QEMU microVMs), then 60 s
# of fuzzing per target. The serve tests drive `pvisor serve` with curl and the
# unmodified OpenSandbox Python SDK.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The vm executor's guest image (kernel, busybox, agent); the vm tests boot it.
scripts/vm-image.sh
# `pvisor serve`: the built-in sandbox images (default, python and
# code-interpreter), and the published OpenSandbox SDK
# (plus the contract tests' schema tools) in target/sdk-venv.
scripts/sandbox-image.sh
scripts/sdk-env.sh >/dev/null
scripts/mcp-env.sh >/dev/null
# Claude Code and Codex, pinned, from npm: the real-agent tests run them inside pvisor.
scripts/agents-env.sh >/dev/null
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Tests that need what a host may lack (root, containerd, the vm guest image)
# are #[ignore]d, naming what they need. As root, and in CI (which runs as
# root), they are included: there they run, and fail if what they need is
# missing, rather than pass unrun.
include_ignored=()
if [ "$(id -u)" -eq 0 ] || [ -n "${CI:-}" ]; then
  include_ignored=(--include-ignored)
fi
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
# Every target but the benches, which scripts/bench.sh --quick runs below.
cargo test --workspace --lib --bins --tests --examples -- ${include_ignored[@]+"${include_ignored[@]}"} 2>&1 | tee "$test_log"
# What did not run, and why (libtest prints "... ignored, REASON").
ignored=$(grep -E '^test .* \.\.\. ignored' "$test_log" || true)
echo "test.sh: $(printf '%s' "$ignored" | grep -c .) tests ignored"
if [ -n "$ignored" ]; then
  printf '%s\n' "$ignored" | sed -E 's/^test .* \.\.\. ignored(, )?//; s/^$/(no reason given)/' | sort | uniq -c | sort -rn
fi
# Every benchmark once, small, and the table of ratios: it fails if a bench
# fails, never on a figure.
scripts/bench.sh --quick
# Bounded fuzzing of every record parser and the upper-layer reader.
scripts/fuzz.sh "${PVISOR_FUZZ_SECONDS:-60}"
