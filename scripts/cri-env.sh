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
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.pvisor-stamp" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
# Debian's python3 with its venv module (the distro package, not a user's pyenv).
py=/usr/bin/python3
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "cri-env: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q python3-venv >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get install -y -q python3-venv >/dev/null; }
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check $want >&2
echo "$want" >"$venv/.pvisor-stamp"
echo "$venv/bin/python"
