#!/usr/bin/env bash
# Builds the built-in root filesystems of `pvisor serve` sandboxes from
# Debian packages, offline but for the Debian mirror:
#   default  dash as /bin/sh, bash, coreutils, grep, sed, findutils, setpriv
#            (util-linux; commands with uid/gid need it), the libraries they
#            load, and static busybox for ps, vi and other extras
#   python   all of default, plus python3, pip, venv, git, curl, procps and
#            CA certificates, with their whole dependency closure (apt
#            resolves it against an empty package database)
# Usage: scripts/sandbox-image.sh [OUT_DIR]   (default: target)
# Writes OUT_DIR/sandbox-image/rootfs and OUT_DIR/sandbox-image-python/rootfs;
# `pvisor serve` imports `default` when it starts and `python` when a
# sandbox first asks for it. Idempotent: rebuilds only when this script changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target}"
"$root/scripts/setup.sh"
stamp="$(b3sum --no-names "$0")"

base=(libc6 libgcc-s1 libselinux1 libpcre2-8-0 libacl1 libattr1 libtinfo6 libgmp10 libcrypt1
  dash bash coreutils grep sed findutils busybox-static util-linux libcap-ng0)
extra=(python3 python3-pip python3-venv git curl ca-certificates procps less)

# download DIR PKG...: the packages themselves (no dependencies).
download() {
  local debs="$1"; shift
  local missing=()
  for pkg in "$@"; do
    ls "$debs/${pkg}"_*.deb >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null 2>&1) || {
    apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null)
  }
}

# download_closure DIR PKG...: the packages and everything they depend on,
# as if nothing were installed (an empty dpkg status), without recommends.
download_closure() {
  local debs="$1"; shift
  local status; status="$(mktemp)"
  local args=(-q -y --no-install-recommends --download-only -o "Dir::State::status=$status"
    -o "Dir::Cache::archives=$debs" -o Debug::NoLocking=1)
  mkdir -p "$debs/partial"
  apt-get "${args[@]}" install "$@" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get "${args[@]}" install "$@" >/dev/null
  }
  rm -f "$status"
}

# finish ROOTFS NAME PRETTY: the files every image has (users, mount points).
finish() {
  local fs="$1" id="$2" pretty="$3"
  rm -rf "$fs/usr/share/doc" "$fs/usr/share/man" "$fs/usr/share/info" "$fs/usr/share/locale" "$fs/usr/share/lintian"
  ln -sfn dash "$fs/bin/sh"
  # Applets the Debian packages do not provide (ps, vi, less, ...).
  mkdir -p "$fs/usr/local/bin"
  for applet in ps top vi less more wget tar gzip gunzip xz unxz which hostname free uptime; do
    [ -e "$fs/bin/$applet" ] || [ -e "$fs/usr/bin/$applet" ] || ln -sfn /bin/busybox "$fs/usr/local/bin/$applet"
  done
  mkdir -p "$fs/etc" "$fs/root" "$fs/tmp" "$fs/home" "$fs/var/tmp" "$fs/proc" "$fs/dev" "$fs/sys" "$fs/run"
  chmod 1777 "$fs/tmp" "$fs/var/tmp"
  chmod 700 "$fs/root"
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$fs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"
  printf 'PRETTY_NAME="%s"\nID=%s\n' "$pretty" "$id" >"$fs/etc/os-release"
}

# default: the listed packages only, kept small.
debs="$out/sandbox-debs"
mkdir -p "$debs"
download "$debs" "${base[@]}"
dir="$out/sandbox-image"
if ! { [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -x "$dir/rootfs/bin/sh" ]; }; then
  work="$dir.partial"
  rm -rf "$work"
  mkdir -p "$work/rootfs"
  for pkg in "${base[@]}"; do
    dpkg -x "$(ls "$debs/${pkg}"_*.deb | head -1)" "$work/rootfs"
  done
  finish "$work/rootfs" pvisor-default "pvisor default sandbox image (Debian packages)"
  echo "$stamp" >"$work/stamp"
  rm -rf "$dir"
  mv "$work" "$dir"
  echo "sandbox-image: built $dir/rootfs ($(du -sh "$dir/rootfs" | cut -f1))" >&2
fi

# python: the whole dependency closure of base + extra.
dir="$out/sandbox-image-python"
if ! { [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -x "$dir/rootfs/bin/sh" ]; }; then
  pydebs="$out/sandbox-debs-python"
  download_closure "$pydebs" "${base[@]}" "${extra[@]}"
  work="$dir.partial"
  rm -rf "$work"
  mkdir -p "$work/rootfs"
  for deb in "$pydebs"/*.deb; do
    dpkg -x "$deb" "$work/rootfs"
  done
  fs="$work/rootfs"
  finish "$fs" pvisor-python "pvisor python sandbox image (Debian packages)"
  # What ca-certificates' maintainer script would generate: the bundle
  # curl, git, pip and Python's ssl module read.
  mkdir -p "$fs/etc/ssl/certs"
  cat "$fs"/usr/share/ca-certificates/mozilla/*.crt >"$fs/etc/ssl/certs/ca-certificates.crt"
  echo "$stamp" >"$work/stamp"
  rm -rf "$dir"
  mv "$work" "$dir"
  echo "sandbox-image: built $dir/rootfs ($(du -sh "$dir/rootfs" | cut -f1))" >&2
fi
