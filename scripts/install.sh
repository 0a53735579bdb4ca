#!/usr/bin/env bash
# Installs pvisor, its containerd shim and the images it ships with, where
# an installed binary finds them (see crates/pvisor-core/src/assets.rs):
#   PREFIX/bin/pvisor
#   PREFIX/bin/containerd-shim-pvisor-v1   the runtime io.containerd.pvisor.v1
#                                          (deploy/node-install.sh registers it)
#   PREFIX/share/pvisor/vm-image/          the --executor vm guest image
#   PREFIX/share/pvisor/sandbox-image/     the `pvisor serve` images `default`,
#   PREFIX/share/pvisor/sandbox-image-python/            `python`
#   PREFIX/share/pvisor/sandbox-image-code-interpreter/  and `code-interpreter`
# Usage: scripts/install.sh [PREFIX]
#   PREFIX defaults to /usr/local as root, ~/.local otherwise (then put
#   ~/.local/bin on your PATH). The images need Debian packages (QEMU,
#   busybox-static), which only root can install: as another user the ns
#   executor is installed alone, and the script says what is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" -eq 0 ]; then prefix="${1:-/usr/local}"; else prefix="${1:-$HOME/.local}"; fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install: building pvisor needs a Rust toolchain (cargo), and none is on PATH." >&2
  echo "  Install one for your user: curl https://sh.rustup.rs -sSf | sh   (then open a new shell)" >&2
  exit 127
fi
echo "install: building pvisor (release; the first build takes a few minutes)..." >&2
cargo build --release --manifest-path "$root/Cargo.toml" -p pvisor-cli -p pvisor-shim
install -d "$prefix/bin" "$prefix/share/pvisor"
for binary in pvisor containerd-shim-pvisor-v1; do
  # Copied beside, then renamed: a running containerd or pvisor never
  # starts half a binary.
  install -m 0755 "$root/target/release/$binary" "$prefix/bin/.$binary.new"
  mv -f "$prefix/bin/.$binary.new" "$prefix/bin/$binary"
  echo "install: $prefix/bin/$binary" >&2
done

# Each image is built into target/ and copied whole, then renamed into place,
# so a running pvisor never sees half an image.
built_ok=" "
for script in vm-image.sh sandbox-image.sh; do
  if "$root/scripts/$script" >&2; then
    built_ok+="$script "
  else
    echo "install: scripts/$script failed (above); pvisor works without its images except where they are needed" >&2
  fi
done
copy_image() { # NAME BUILD_SCRIPT
  local name="$1" script="$2" built="$root/target/$1"
  case "$built_ok" in *" $script "*) ;; *) return 0 ;; esac
  rm -rf "$prefix/share/pvisor/.$name.new"
  cp -a "$built" "$prefix/share/pvisor/.$name.new"
  rm -rf "$prefix/share/pvisor/$name"
  mv "$prefix/share/pvisor/.$name.new" "$prefix/share/pvisor/$name"
  echo "install: $prefix/share/pvisor/$name" >&2
}
copy_image vm-image vm-image.sh
copy_image sandbox-image sandbox-image.sh
copy_image sandbox-image-python sandbox-image.sh
copy_image sandbox-image-code-interpreter sandbox-image.sh
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install: add $prefix/bin to your PATH (e.g. in ~/.profile: PATH=\"$prefix/bin:\$PATH\")" >&2 ;;
esac
echo "install: done; try: pvisor doctor" >&2
