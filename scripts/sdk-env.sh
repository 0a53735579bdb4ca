#!/usr/bin/env bash
# Installs the published OpenSandbox Python SDK (unchanged, from PyPI) and the
# contract tests' schema tools into a virtualenv: target/sdk-venv.
#   opensandbox 1.1.1   the SDK tests/sdk/flow.py drives against `pvisor serve`
#   opensandbox-code-interpreter 1.1.1
#                       its code-interpreter SDK, driven by tests/sdk/code.py
#   pyyaml, jsonschema  tests/sdk/contract.py validates responses against the
#                       OpenSandbox OpenAPI documents
# Usage: scripts/sdk-env.sh [VENV_DIR]; prints the venv's python. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/target/sdk-venv}"
want="opensandbox==1.1.1 opensandbox-code-interpreter==1.1.1 pyyaml==6.0.2 jsonschema==4.23.0"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.pvisor-stamp" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
# Debian's python3 with its venv module (the distro package, not a user's pyenv).
py=/usr/bin/python3
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "sdk-env: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q python3-venv >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get install -y -q python3-venv >/dev/null; }
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check $want >&2
echo "$want" >"$venv/.pvisor-stamp"
echo "$venv/bin/python"
