#!/usr/bin/env bash
# Installs the system packages pvisor's build, tests and benchmarks use, on
# Debian/Ubuntu. Idempotent: does nothing when everything is present.
#   b3sum            independent BLAKE3 check of completion receipts (tests)
#   util-linux       unshare, setpriv (tests, benchmark), script (TTY test, via bsdutils)
#   bsdutils         script(1)
#   curl, python3    clients the network-policy tests drive through the proxy
#   xfsprogs         the checkpoint benchmark's reflink figure (a loop-mounted XFS)
#   bubblewrap       the run-overhead benchmark's comparison
#   qemu-system-x86  the vm executor's hypervisor
#   containerd, containernetworking-plugins, iproute2
#                    the containerd shim's tests (a private instance and CRI pods'
#                    network, scripts/containerd-env.sh)
#   vim              the end-to-end test that editor start-up files are not applied
#   busybox-static, kmod, lz4, e2fsprogs
#                    the vm guest image (scripts/vm-image.sh) and its workspace disks
set -euo pipefail

need=()
command -v b3sum >/dev/null 2>&1 || need+=(b3sum)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v script >/dev/null 2>&1 || need+=(bsdutils)
[ -x /usr/bin/curl ] || need+=(curl)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v mkfs.xfs >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.xfs ] || need+=(xfsprogs)
[ -x /usr/bin/qemu-system-x86_64 ] || need+=(qemu-system-x86)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
[ -x /sbin/depmod ] || need+=(kmod)
[ -x /usr/bin/lz4 ] || need+=(lz4)
[ -x /sbin/mkfs.ext4 ] || need+=(e2fsprogs)
command -v containerd >/dev/null 2>&1 || need+=(containerd)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v vim >/dev/null 2>&1 || need+=(vim)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "setup: installing ${need[*]}" >&2
"$(dirname "$0")/apt-install.sh" "${need[@]}"
