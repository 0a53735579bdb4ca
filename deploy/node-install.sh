#!/usr/bin/env bash
# Installs pvisor on a Kubernetes node and registers its shim with
# containerd, as Kata's kata-deploy does: run on the node itself, or from
# the DaemonSet in deploy/kubernetes/ with the node's root mounted at /host.
#
# Usage: deploy/node-install.sh install   [options]
#        deploy/node-install.sh uninstall [options]
# Options:
#   --from DIR     a pvisor install prefix to copy from (bin/pvisor,
#                  bin/containerd-shim-pvisor-v1, share/pvisor/vm-image);
#                  default: the prefix this script was installed under, else
#                  /usr/local (what scripts/install.sh made)
#   --root DIR     the node's root filesystem (default /; /host in the DaemonSet)
#   --prefix DIR   where on the node the files go (default /usr/local, whose
#                  bin/ is on containerd's PATH under systemd)
#   --config PATH  containerd's config on the node (default /etc/containerd/config.toml)
#   --restart      restart containerd afterwards (systemctl; through the
#                  node's pid 1 namespaces when --root is not /)
#
# The runtime entry goes into containerd's config between two marker
# comments, so a second install changes nothing and uninstall removes
# exactly it: for config version 2 (containerd 1.6/1.7) under
# plugins."io.containerd.grpc.v1.cri", for version 3 (containerd 2.x) under
# plugins."io.containerd.cri.v1.runtime"; the CRI handler is "pvisor". The
# first change keeps the original config beside it (CONFIG.pvisor-backup).
# A runtimes.pvisor entry the operator wrote is left as it is.
set -euo pipefail

action="${1:-}"
[ $# -gt 0 ] && shift
here="$(cd "$(dirname "$0")" && pwd)"
from="" root="/" prefix="/usr/local" config="/etc/containerd/config.toml" restart=0
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="${2:?--from needs a directory}"; shift 2 ;;
    --root) root="${2:?--root needs a directory}"; shift 2 ;;
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --config) config="${2:?--config needs a path}"; shift 2 ;;
    --restart) restart=1; shift ;;
    *) echo "node-install: unknown option $1; see the usage at the top of $0" >&2; exit 2 ;;
  esac
done
case "$action" in
  install | uninstall) ;;
  *) sed -n '2,26p' "$0" >&2; exit 2 ;;
esac
[ -d "$root" ] || { echo "node-install: --root $root is not a directory" >&2; exit 2; }
if [ -z "$from" ]; then
  if [ -x "$here/../bin/containerd-shim-pvisor-v1" ]; then from="$(cd "$here/.." && pwd)"; else from=/usr/local; fi
fi

begin="# BEGIN pvisor (node-install.sh): runtime io.containerd.pvisor.v1, CRI handler \"pvisor\""
end="# END pvisor"
host_config="${root%/}$config"
host_prefix="${root%/}$prefix"
binaries=(pvisor containerd-shim-pvisor-v1)

say() { echo "node-install: $*" >&2; }

# The version of containerd's config (2 when absent: containerd 1.x's reading).
config_version() {
  local v
  v="$(sed -n -E 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' "$host_config" 2>/dev/null | head -1)"
  echo "${v:-2}"
}

runtime_table() { # VERSION
  case "$1" in
    2) echo 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.pvisor' ;;
    3) echo 'plugins."io.containerd.cri.v1.runtime".containerd.runtimes.pvisor' ;;
    *)
      say "$host_config is config version $1; only versions 2 (containerd 1.6/1.7) and 3 (containerd 2.x) are known. Migrate it (containerd config migrate) and run again."
      exit 2
      ;;
  esac
}

# Writes the config through a temporary file renamed over it: containerd
# never reads half a config.
replace_config() { # CONTENT-FILE
  local tmp="$host_config.pvisor-new"
  cp "$1" "$tmp"
  chmod --reference="$host_config" "$tmp" 2>/dev/null || chmod 0644 "$tmp"
  mv -f "$tmp" "$host_config"
}

without_block() { # prints the config without pvisor's marked block
  awk -v b="$begin" -v e="$end" '$0 == b { skip = 1; next } skip && $0 == e { skip = 0; next } !skip' "$host_config"
}

# Runs a command of the node's (its containerd) on the node's filesystem.
on_node() {
  if [ "$root" = "/" ]; then "$@"; else chroot "$root" "$@"; fi
}

# Makes the config name containerd's runtimes. A config that leaves them to
# containerd's defaults (Debian's does) would lose runc to a runtimes table
# of ours (containerd 1.x reads the map whole), so the config containerd
# runs with (`config dump`, or `config default` when there is none) is
# written out first; it means the same to containerd.
spell_out_runtimes() {
  if [ -f "$host_config" ] && without_block | grep -q 'containerd\.runtimes\.'; then return 0; fi
  local effective; effective="$(mktemp)"
  local read=(containerd config default)
  [ -f "$host_config" ] && read=(containerd --config "$config" config dump)
  if ! on_node "${read[@]}" >"$effective" 2>/dev/null || ! grep -q 'containerd\.runtimes\.' "$effective"; then
    rm -f "$effective"
    say "cannot read the runtimes containerd runs with (${read[*]} on the node failed); add [$(runtime_table "$(config_version)")] with runtime_type = \"io.containerd.pvisor.v1\" to $config by hand"
    exit 1
  fi
  mkdir -p "$(dirname "$host_config")"
  if [ -f "$host_config" ]; then
    [ -f "$host_config.pvisor-backup" ] || cp -p "$host_config" "$host_config.pvisor-backup"
  else
    : >"$host_config"
  fi
  replace_config "$effective"
  rm -f "$effective"
  say "$host_config: written out as containerd reads it (${read[*]}), so that runc stays"
}

register() {
  spell_out_runtimes
  local version table
  version="$(config_version)"
  table="$(runtime_table "$version")"
  if without_block | grep -qF "[$table]"; then
    say "$host_config already has [$table], written by hand; it is left as it is"
    return 0
  fi
  [ -f "$host_config.pvisor-backup" ] || cp -p "$host_config" "$host_config.pvisor-backup"
  local next; next="$(mktemp)"
  {
    without_block
    echo "$begin"
    echo "[$table]"
    echo "  runtime_type = \"io.containerd.pvisor.v1\""
    echo "$end"
  } >"$next"
  if cmp -s "$next" "$host_config"; then
    say "$host_config already registers the runtime"
  else
    replace_config "$next"
    say "$host_config: [$table] (config version $version)"
  fi
  rm -f "$next"
}

unregister() {
  [ -f "$host_config" ] || return 0
  local next; next="$(mktemp)"
  without_block >"$next"
  if ! cmp -s "$next" "$host_config"; then
    replace_config "$next"
    say "$host_config: the pvisor runtime removed"
  fi
  rm -f "$next"
}

copy_files() {
  for binary in "${binaries[@]}"; do
    [ -x "$from/bin/$binary" ] || { say "$from/bin/$binary is missing: build and install pvisor first (scripts/install.sh)"; exit 1; }
  done
  [ -d "$from/share/pvisor/vm-image" ] || say "warning: $from/share/pvisor/vm-image is missing; containers cannot boot without the guest image (scripts/install.sh builds it)"
  install -d "$host_prefix/bin" "$host_prefix/share/pvisor"
  if [ "$(cd "$from" && pwd -P)" = "$(cd "$host_prefix" && pwd -P)" ]; then
    say "the files are already in $host_prefix"
    return 0
  fi
  for binary in "${binaries[@]}"; do
    install -m 0755 "$from/bin/$binary" "$host_prefix/bin/.$binary.new"
    mv -f "$host_prefix/bin/.$binary.new" "$host_prefix/bin/$binary"
  done
  if [ -d "$from/share/pvisor/vm-image" ]; then
    rm -rf "$host_prefix/share/pvisor/.vm-image.new"
    cp -a "$from/share/pvisor/vm-image" "$host_prefix/share/pvisor/.vm-image.new"
    rm -rf "$host_prefix/share/pvisor/vm-image"
    mv "$host_prefix/share/pvisor/.vm-image.new" "$host_prefix/share/pvisor/vm-image"
  fi
  say "installed ${binaries[*]} and the guest image under $host_prefix"
}

remove_files() {
  for binary in "${binaries[@]}"; do rm -f "$host_prefix/bin/$binary"; done
  rm -rf "$host_prefix/share/pvisor/vm-image"
  say "removed ${binaries[*]} and the guest image from $host_prefix"
}

restart_containerd() {
  [ "$restart" = 1 ] || { say "restart containerd to use it: systemctl restart containerd"; return 0; }
  if [ "$root" = "/" ]; then
    systemctl restart containerd
  else
    nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd
  fi
  say "containerd restarted"
}

case "$action" in
  install)
    copy_files
    register
    restart_containerd
    say "done; check the node: ctr run --rm --runtime io.containerd.pvisor.v1 IMAGE c1 true"
    ;;
  uninstall)
    unregister
    remove_files
    restart_containerd
    ;;
esac
