#!/usr/bin/env bash
# Installs Debian packages for pvisor's scripts and tests: the one place that
# calls `apt-get install`. Tests run in parallel and several may find the same
# package missing at once; dpkg allows one installer at a time, so callers are
# serialized on a lock and apt waits for any other holder of dpkg's own lock
# rather than failing at once. Retries after `apt-get update` when the package
# lists are stale.
# Usage: scripts/apt-install.sh PKG...   (root)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/apt-install.sh PKG..." >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then
  echo "apt-install: installing $* needs root (apt-get install $*)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
wait_for_dpkg=(-o DPkg::Lock::Timeout=600)
exec 9>/var/lock/pvisor-apt-install.lock
flock 9
apt-get "${wait_for_dpkg[@]}" install -y -q "$@" >/dev/null 2>&1 || {
  apt-get "${wait_for_dpkg[@]}" update -q >/dev/null
  apt-get "${wait_for_dpkg[@]}" install -y -q "$@" >/dev/null
}
