#!/usr/bin/env bash
# Installs a CRI client's tools into a virtualenv, target/cri-venv, for the
# shim's CRI test (tests/cri/cri_flow.py): Debian 12 packages no crictl, and
# the machines have neither Go nor protoc.
#   grpcio 1.85.1        the gRPC client
#   grpcio-tools 1.85.1  protoc (bundled) and its Python plugin; cri_flow.py
#                        generates its stubs from tests/cri/api.proto with it
# Usage: scripts/cri-env.sh [VENV_DIR]; prints the venv's python. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/target/cri-venv}"
want="grpcio==1.85.1 grpcio-tools==1.85.1"
exec "$root/scripts/python-venv.sh" "$venv" "$want"
