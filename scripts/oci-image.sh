#!/usr/bin/env bash
# Builds a small OCI image archive from Debian packages, offline but for the
# Debian mirror, for the containerd shim's tests (no container registry is
# reachable from the test machines):
#   one layer: static busybox as /bin/busybox, /bin/sh and its applets,
#   /etc/passwd and /etc/group for root, and the usual mount points.
# Usage: scripts/oci-image.sh [OUT_DIR] [IMAGE_NAME] [CMD_JSON]
#   (defaults: target, docker.io/pvisor/busybox:latest, ["/bin/sh"]; a
#   pause image for runc's pods: ... docker.io/pvisor/pause:latest
#   '["/bin/sleep","2147483647"]' in another OUT_DIR)
# Writes OUT_DIR/oci-image/busybox.tar (an OCI image layout in a tar) that
# `ctr -a SOCK images import OUT_DIR/oci-image/busybox.tar` accepts; the
# image is named IMAGE_NAME. Idempotent: rebuilds only when this script changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target}"
name="${2:-docker.io/pvisor/busybox:latest}"
cmd="${3:-[\"/bin/sh\"]}"
dir="$out/oci-image"
archive="$dir/busybox.tar"
stamp="$(sha256sum "$0" | cut -d' ' -f1) $name $cmd"
# The containerd tests run in parallel and each asks for the image: one
# builds, the others wait and then find it built.
mkdir -p "$out"
exec 9>"$out/.oci-image.lock"
flock 9
if [ -f "$archive" ] && [ "$(cat "$dir/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$archive"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/rootfs" "$dir/layout/blobs/sha256"
debs="$dir/debs"
# The sandbox image's download may already hold the package.
cached="$(ls "$root"/target/sandbox-debs/busybox-static_*.deb 2>/dev/null | head -1 || true)"
if [ -n "$cached" ]; then
  cp "$cached" "$debs/"
else
  (cd "$debs" && apt-get download -q busybox-static >/dev/null 2>&1) || {
    apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q busybox-static >/dev/null)
  }
fi
fs="$dir/rootfs"
dpkg-deb -x "$debs"/busybox-static_*.deb "$fs"
mkdir -p "$fs"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,root,run,var/tmp}
chmod 1777 "$fs/tmp" "$fs/var/tmp"
# Every applet as a link in /bin, as busybox's own installer lays them out.
for applet in $("$fs/bin/busybox" --list); do
  [ -e "$fs/bin/$applet" ] || ln -s busybox "$fs/bin/$applet"
done
rm -rf "$fs/usr/share"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$fs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"

blob() { # blob FILE: moves FILE into the layout by digest; prints "DIGEST SIZE"
  local digest size
  digest="$(sha256sum "$1" | cut -d' ' -f1)"
  size="$(stat -c %s "$1")"
  mv "$1" "$dir/layout/blobs/sha256/$digest"
  echo "$digest $size"
}
# A reproducible layer: sorted, owned by root, fixed mtimes.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$fs" -cf "$dir/layer.tar" .
diff_id="$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
gzip -n -9 "$dir/layer.tar"
read -r layer layer_size < <(blob "$dir/layer.tar.gz")
cat >"$dir/config.json" <<JSON
{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":$cmd,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},"history":[{"created_by":"scripts/oci-image.sh (busybox-static from Debian)"}]}
JSON
read -r config config_size < <(blob "$dir/config.json")
cat >"$dir/manifest.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$layer","size":$layer_size}]}
JSON
read -r manifest manifest_size < <(blob "$dir/manifest.json")
tag="${name##*:}"
cat >"$dir/layout/index.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"$tag"}}]}
JSON
echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/layout/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir/layout" -cf "$archive" .
rm -rf "$dir/layout" "$fs"
echo "$stamp" >"$dir/stamp"
echo "$archive"
