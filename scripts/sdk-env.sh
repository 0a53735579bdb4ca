#!/usr/bin/env bash
# Installs the published OpenSandbox Python SDK (unchanged, from PyPI) and the
# contract tests' schema tools into a virtualenv: target/sdk-venv.
#   opensandbox 1.1.1   the SDK tests/sdk/flow.py drives against `pvisor serve`
#   opensandbox-code-interpreter 1.1.1
#                       its code-interpreter SDK, driven by tests/sdk/code.py
#   pyyaml, jsonschema  tests/sdk/contract.py validates responses against the
#                       OpenSandbox OpenAPI documents
# And the published TypeScript SDK (@alibaba-group/opensandbox 0.1.11, from
# the npm registry) in target/ts-sdk, driven by tests/sdk/flow.mjs with node
# (Debian's nodejs and npm are installed where the machine has no npm).
# Usage: scripts/sdk-env.sh [VENV_DIR]; prints the venv's python. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

ts="$root/target/ts-sdk"
ts_want="@alibaba-group/opensandbox@0.1.11"
if [ "$(cat "$ts/.pvisor-stamp" 2>/dev/null)" != "$ts_want" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || { echo "sdk-env: install node and npm (apt-get install nodejs npm)" >&2; exit 1; }
    "$root/scripts/apt-install.sh" nodejs npm
  fi
  rm -rf "$ts"
  mkdir -p "$ts"
  npm install --prefix "$ts" --no-audit --no-fund --silent "$ts_want" >&2
  echo "$ts_want" >"$ts/.pvisor-stamp"
fi
venv="${1:-$root/target/sdk-venv}"
want="opensandbox==1.1.1 opensandbox-code-interpreter==1.1.1 pyyaml==6.0.2 jsonschema==4.23.0"
exec "$root/scripts/python-venv.sh" "$venv" "$want"
