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
# `pvisor serve`: the default sandbox image, and the published OpenSandbox SDK
# (plus the contract tests' schema tools) in target/sdk-venv.
scripts/sandbox-image.sh
scripts/sdk-env.sh >/dev/null
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --all-targets
# Bounded fuzzing of every record parser and the upper-layer reader.
scripts/fuzz.sh "${PVISOR_FUZZ_SECONDS:-60}"
