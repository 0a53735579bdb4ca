#!/usr/bin/env bash
# Makes (or reuses) a virtualenv of Debian's python3 holding exactly the
# pinned packages given, for the test clients (sdk-env.sh, cri-env.sh).
# Usage: scripts/python-venv.sh VENV_DIR "PKG==VER ..."; prints the venv's
# python. Idempotent: a stamp file records what the venv holds.
set -euo pipefail
venv="$1"
want="$2"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.pvisor-stamp" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
# Debian's python3 with its venv module (the distro package, not a user's pyenv).
py=/usr/bin/python3
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "python-venv: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
  "$(dirname "$0")/apt-install.sh" python3-venv
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check $want >&2
echo "$want" >"$venv/.pvisor-stamp"
echo "$venv/bin/python"
