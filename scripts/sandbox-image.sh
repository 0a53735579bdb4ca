#!/usr/bin/env bash
# Builds the default root filesystem of `pvisor serve` sandboxes (the image
# named `default`) from Debian packages, offline but for the Debian mirror:
# dash as /bin/sh, bash, coreutils, grep, sed, findutils, and the libraries
# they load; plus static busybox for ps, wget-less extras and vi.
# Usage: scripts/sandbox-image.sh [OUT_DIR]   (default: target/sandbox-image)
# The rootfs is OUT_DIR/rootfs; `pvisor serve` imports it on first start.
# Idempotent: rebuilds only when this script changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/sandbox-image}"
"$root/scripts/setup.sh"

packages=(libc6 libgcc-s1 libselinux1 libpcre2-8-0 libacl1 libattr1 libtinfo6 libgmp10 libcrypt1
  dash bash coreutils grep sed findutils busybox-static)
stamp="$(b3sum --no-names "$0")"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && [ -x "$out/rootfs/bin/sh" ]; then
  exit 0
fi

debs="$root/target/sandbox-debs"
mkdir -p "$debs"
missing=()
for pkg in "${packages[@]}"; do
  ls "$debs/${pkg}"_*.deb >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null 2>&1) || {
    apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null)
  }
fi

work="$out.partial"
rm -rf "$work"
mkdir -p "$work/rootfs"
for pkg in "${packages[@]}"; do
  dpkg -x "$(ls "$debs/${pkg}"_*.deb | head -1)" "$work/rootfs"
done
fs="$work/rootfs"
rm -rf "$fs/usr/share/doc" "$fs/usr/share/man" "$fs/usr/share/info" "$fs/usr/share/locale" "$fs/usr/share/lintian"
ln -sfn dash "$fs/bin/sh"
# Applets the Debian packages above do not provide (ps, vi, less, ...).
mkdir -p "$fs/usr/local/bin"
for applet in ps top vi less more wget tar gzip gunzip xz unxz which hostname free uptime; do
  [ -e "$fs/bin/$applet" ] || [ -e "$fs/usr/bin/$applet" ] || ln -sfn /bin/busybox "$fs/usr/local/bin/$applet"
done
mkdir -p "$fs/etc" "$fs/root" "$fs/tmp" "$fs/home" "$fs/var/tmp" "$fs/proc" "$fs/dev" "$fs/sys" "$fs/run"
chmod 1777 "$fs/tmp" "$fs/var/tmp"
chmod 700 "$fs/root"
printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$fs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"
printf 'PRETTY_NAME="pvisor default sandbox image (Debian packages)"\nID=pvisor-default\n' >"$fs/etc/os-release"
echo "$stamp" >"$work/stamp"
rm -rf "$out"
mv "$work" "$out"
echo "sandbox-image: built $out/rootfs ($(du -sh "$out/rootfs" | cut -f1))" >&2
