#!/usr/bin/env bash
# Builds the guest image of the `vm` executor from Debian packages, offline
# but for the Debian mirror:
#   vmlinux          the uncompressed kernel of linux-image-cloud-amd64 (PVH entry;
#                    boots in ~3 s under TCG where the compressed bzImage takes ~8 s)
#   initramfs.cpio   busybox (static), the virtio/overlay modules in load order,
#                    and pvisor-agent (statically linked) as /init
#   manifest.json    BLAKE3 digests; pvisor copies the image under its state
#                    directory by digest, so resume and fork boot the same bytes
# Usage: scripts/vm-image.sh [OUT_DIR]   (default: target/vm-image)
# Idempotent: rebuilds only when the agent or this script changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/vm-image}"
"$root/scripts/setup.sh"

# The agent: static glibc, so the initramfs needs no loader or libraries. Its
# own target dir keeps these RUSTFLAGS from invalidating the main build. The
# same build leaves pvisor-guest-probe beside it: the hostile guest the vm
# tests copy into a workspace (never into the image).
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet \
  --manifest-path "$root/Cargo.toml" -p pvisor-agent \
  --target x86_64-unknown-linux-gnu --target-dir "$root/target/agent"
agent="$root/target/agent/x86_64-unknown-linux-gnu/release/pvisor-agent"

stamp="$(cat "$agent" "$0" | b3sum --no-names)"
if [ -f "$out/manifest.json" ] && grep -q "\"inputs\": \"$stamp\"" "$out/manifest.json"; then
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# The kernel: whatever linux-image-cloud-amd64 depends on in this mirror.
pkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
[ -n "$pkg" ] || { echo "vm-image: no linux-image-cloud-amd64 in the apt sources (run apt-get update)" >&2; exit 1; }
debs="$root/target/vm-debs"
mkdir -p "$debs"
if ! ls "$debs/${pkg}"_*.deb >/dev/null 2>&1; then
  (cd "$debs" && apt-get download -q "$pkg" >/dev/null 2>&1) || {
    apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "$pkg" >/dev/null)
  }
fi
dpkg -x "$(ls "$debs/${pkg}"_*.deb | head -1)" "$work/deb"
version="$(ls "$work/deb/lib/modules")"
/sbin/depmod -b "$work/deb" "$version"

# vmlinux: decompress the LZ4 (or xz/zstd/gzip) payload of the bzImage.
vmlinuz="$work/deb/boot/vmlinuz-$version"
python3 - "$vmlinuz" "$work/vmlinux" <<'PY'
import subprocess, sys
data = open(sys.argv[1], 'rb').read()
for magic, cmd in [(b'\x02\x21\x4c\x18', ['lz4', '-dc']), (b'\xfd7zXZ\x00', ['xz', '-dc']),
                   (b'\x28\xb5\x2f\xfd', ['zstd', '-dcq']), (b'\x1f\x8b\x08', ['gzip', '-dc'])]:
    pos = data.find(magic)
    while pos >= 0:
        out = subprocess.run(cmd, input=data[pos:], capture_output=True).stdout
        if out[:4] == b'\x7fELF':
            open(sys.argv[2], 'wb').write(out)
            sys.exit(0)
        pos = data.find(magic, pos + 1)
sys.exit('vm-image: no ELF kernel found inside ' + sys.argv[1])
PY

# The initramfs tree.
tree="$work/tree"
mkdir -p "$tree"/{bin,sbin,usr/bin,usr/sbin,etc/pvisor,proc,sys,dev,tmp,run,mnt,root}
cp /bin/busybox "$tree/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$tree/bin/$applet"
done
for d in sbin usr/bin usr/sbin; do
  for applet in $(/bin/busybox --list); do ln -sf /bin/busybox "$tree/$d/$applet"; done
done
install -m 0755 "$agent" "$tree/init"
: > "$tree/etc/pvisor/modules"
for m in virtio_mmio virtio_pci virtio_blk virtio_console virtio_net virtio-rng overlay virtiofs; do
  /sbin/modprobe -d "$work/deb" -S "$version" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  rel="${ko#"$work/deb"}"
  mkdir -p "$tree$(dirname "$rel")"
  cp "$ko" "$tree$rel"
  echo "$rel" >> "$tree/etc/pvisor/modules"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$tree/etc/passwd"
echo "root:x:0:" > "$tree/etc/group"
# Uncompressed: under TCG, unpacking is cheaper than decompressing.
(cd "$tree" && find . | sort | /bin/busybox cpio -o -H newc 2>/dev/null) > "$work/initramfs.cpio"

# Same-filesystem renames: installed images hard-link the previous inodes.
for f in vmlinux initramfs.cpio; do
  cp "$work/$f" "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"
done
# Every file is replaced by rename: installed copies hard-link the old inodes.
cat > "$out/manifest.json.tmp" <<JSON
{
  "format": 1,
  "kernel_package": "$pkg",
  "kernel_version": "$version",
  "kernel": {"file": "vmlinux", "blake3": "$(b3sum --no-names "$out/vmlinux")"},
  "initramfs": {"file": "initramfs.cpio", "blake3": "$(b3sum --no-names "$out/initramfs.cpio")"},
  "cmdline": "console=ttyS0 reboot=t panic=-1 quiet rdinit=/init",
  "inputs": "$stamp"
}
JSON
mv "$out/manifest.json.tmp" "$out/manifest.json"
echo "vm-image: built $out ($pkg)" >&2
