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

changed=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Refuses a path on the node with a symlink in it (below --root): seen from
# the DaemonSet, an absolute link would point into the installer's own
# filesystem, and a rename would replace the operator's link with a file.
refuse_symlinks() { # PATH-ON-THE-NODE
  local at="${root%/}" part
  local IFS=/
  for part in $1; do
    [ -n "$part" ] || continue
    at="$at/$part"
    if [ -L "$at" ]; then
      say "${at#"${root%/}"} on the node is a symlink; pass the real path (--config or --prefix) and run again"
      exit 2
    fi
  done
}

# The config without pvisor's marked block; fails (3) when a block is
# opened and never closed, rather than dropping the rest of the config.
without_block() {
  awk -v b="$begin" -v e="$end" '
    $0 == b { skip = 1; next }
    skip && $0 == e { skip = 0; next }
    !skip
    END { if (skip) exit 3 }' "$host_config"
}

# Saves the config without pvisor's block in $work/rest, or stops.
read_rest() {
  if ! without_block >"$work/rest"; then
    say "$host_config has \"$begin\" without \"$end\" after it; mend the config by hand and run again"
    exit 2
  fi
}

# Whether $work/rest has an uncommented table matching the regex.
rest_has_table() { # ERE
  grep -v -E '^[[:space:]]*#' "$work/rest" | grep -E "^[[:space:]]*\[$1\][[:space:]]*(#.*)?$" >/dev/null
}

# The version of containerd's config (1 when it names none: containerd's
# own reading).
config_version() {
  local v
  v="$(sed -n -E 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' "$host_config" 2>/dev/null | head -1)"
  echo "${v:-1}"
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

# The runtimes.pvisor table of either version, in any quoting TOML allows.
any_pvisor_table() {
  local q="[\"']?"
  echo "plugins\.${q}io\.containerd\.(grpc\.v1\.cri|cri\.v1\.runtime)${q}\.${q}containerd${q}\.${q}runtimes${q}\.${q}pvisor${q}"
}

# Runs a command of the node's (its containerd) on the node's filesystem.
on_node() {
  if [ "$root" = "/" ]; then "$@"; else chroot "$root" "$@"; fi
}

# containerd's major version on the node, or nothing.
containerd_major() {
  on_node containerd --version 2>/dev/null | sed -n -E 's/.* v?([0-9]+)\.[0-9]+\.[0-9]+.*/\1/p' | head -1
}

# Writes CONTENT-FILE as the config: beside it first, read back by the
# node's containerd where it reads that config version, then renamed over
# it, so containerd never reads half a config or one it cannot parse.
replace_config() { # CONTENT-FILE
  local tmp="$host_config.pvisor-new" major
  cp "$1" "$tmp"
  chmod --reference="$host_config" "$tmp" 2>/dev/null || chmod 0644 "$tmp"
  major="$(containerd_major)"
  case "$(config_version)/$major" in
    2/1 | 3/2 | 3/3)
      if ! on_node containerd --config "$config.pvisor-new" config dump >/dev/null 2>"$work/err"; then
        rm -f "$tmp"
        say "containerd cannot read the config this would write ($(head -c 400 "$work/err")); $config is unchanged"
        exit 1
      fi
      ;;
  esac
  mv -f "$tmp" "$host_config"
  changed=1
}

# Makes the config name containerd's runtimes. A config that leaves them to
# containerd's defaults (Debian's does) would lose runc to a runtimes table
# of ours (containerd 1.x reads the map whole), so the config containerd
# runs with (`config dump`, or `config default` when there is none) is
# written out first; it means the same to containerd.
spell_out_runtimes() {
  if [ -f "$host_config" ]; then
    read_rest
    if grep -v -E '^[[:space:]]*#' "$work/rest" | grep -E 'containerd.?\.runtimes\.' >/dev/null; then return 0; fi
  fi
  local read=(containerd config default)
  [ -f "$host_config" ] && read=(containerd --config "$config" config dump)
  if ! on_node "${read[@]}" >"$work/effective" 2>/dev/null || ! grep -E 'containerd.?\.runtimes\.' "$work/effective" >/dev/null; then
    say "cannot read the runtimes containerd runs with (${read[*]} on the node failed); add a runtimes.pvisor table with runtime_type = \"io.containerd.pvisor.v1\" to $config by hand (docs/kubernetes.md)"
    exit 1
  fi
  mkdir -p "$(dirname "$host_config")"
  if [ -f "$host_config" ]; then
    [ -f "$host_config.pvisor-backup" ] || cp -p "$host_config" "$host_config.pvisor-backup"
  else
    : >"$host_config"
  fi
  replace_config "$work/effective"
  say "$host_config: written out as containerd reads it (${read[*]}), so that runc stays"
}

register() {
  refuse_symlinks "$config"
  spell_out_runtimes
  read_rest
  if rest_has_table "$(any_pvisor_table)"; then
    say "$host_config already has a runtimes.pvisor table, written by hand; it is left as it is"
    return 0
  fi
  local version table
  version="$(config_version)"
  table="$(runtime_table "$version")" || exit 2
  [ -f "$host_config.pvisor-backup" ] || cp -p "$host_config" "$host_config.pvisor-backup"
  {
    cat "$work/rest"
    echo "$begin"
    echo "[$table]"
    echo "  runtime_type = \"io.containerd.pvisor.v1\""
    echo "$end"
  } >"$work/next"
  if cmp -s "$work/next" "$host_config"; then
    say "$host_config already registers the runtime"
  else
    replace_config "$work/next"
    say "$host_config: [$table] (config version $version)"
  fi
}

unregister() {
  refuse_symlinks "$config"
  [ -f "$host_config" ] || return 0
  read_rest
  if ! cmp -s "$work/rest" "$host_config"; then
    replace_config "$work/rest"
    say "$host_config: the pvisor runtime removed"
  fi
}

copy_files() {
  refuse_symlinks "$prefix/bin"
  refuse_symlinks "$prefix/share/pvisor"
  for binary in "${binaries[@]}"; do
    [ -x "$from/bin/$binary" ] || { say "$from/bin/$binary is missing: build and install pvisor first (scripts/install.sh)"; exit 1; }
  done
  if [ ! -f "$from/share/pvisor/vm-image/manifest.json" ]; then
    say "$from/share/pvisor/vm-image is missing: no container could boot without the guest image (scripts/install.sh builds it; its build needs QEMU and busybox-static)"
    exit 1
  fi
  install -d "$host_prefix/bin" "$host_prefix/share/pvisor"
  if [ "$(cd "$from" && pwd -P)" = "$(cd "$host_prefix" && pwd -P)" ]; then
    say "the files are already in $host_prefix"
    return 0
  fi
  for binary in "${binaries[@]}"; do
    cmp -s "$from/bin/$binary" "$host_prefix/bin/$binary" && continue
    install -m 0755 "$from/bin/$binary" "$host_prefix/bin/.$binary.new"
    mv -f "$host_prefix/bin/.$binary.new" "$host_prefix/bin/$binary"
    changed=1
  done
  if ! diff -r -q "$from/share/pvisor/vm-image" "$host_prefix/share/pvisor/vm-image" >/dev/null 2>&1; then
    rm -rf "$host_prefix/share/pvisor/.vm-image.new"
    cp -a "$from/share/pvisor/vm-image" "$host_prefix/share/pvisor/.vm-image.new"
    rm -rf "$host_prefix/share/pvisor/vm-image"
    mv "$host_prefix/share/pvisor/.vm-image.new" "$host_prefix/share/pvisor/vm-image"
    changed=1
  fi
  say "${binaries[*]} and the guest image are in $host_prefix"
}

remove_files() {
  refuse_symlinks "$prefix/bin"
  refuse_symlinks "$prefix/share/pvisor"
  for binary in "${binaries[@]}"; do
    [ -e "$host_prefix/bin/$binary" ] && changed=1
    rm -f "$host_prefix/bin/$binary"
  done
  rm -rf "$host_prefix/share/pvisor/vm-image"
  say "removed ${binaries[*]} and the guest image from $host_prefix"
}

restart_containerd() {
  [ "$changed" = 1 ] || { say "nothing changed; containerd is not restarted"; return 0; }
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
