#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and the end-to-end tests
# (real namespaces and overlays, as root and as an unprivileged user).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --all-targets
