#!/usr/bin/env bash
# Starts a private containerd for the pvisor shim's tests: Debian's
# containerd package (installed if missing), its own root, state and socket
# directories under DIR, and a config that registers the runtime
# io.containerd.pvisor.v1 for ctr and for the CRI plugin (handler "pvisor";
# handler "runc" is runc, the yardstick). CRI's sandbox image is the busybox
# test image, or SANDBOX_IMAGE (a runc pod needs one whose command lasts).
# containerd finds containerd-shim-pvisor-v1 on its PATH: SHIM_DIR is put first.
# CRI pods get a CNI network: Debian's containernetworking-plugins (bridge,
# host-local, loopback) on a bridge pvisor-cri0, 10.232.0.0/24, gateway .1,
# with the IPAM state under DIR (tests/cri/cri_flow.py reaches the pod).
#
# Usage: scripts/containerd-env.sh start DIR [SHIM_DIR]   prints the socket path
#        scripts/containerd-env.sh stop DIR
#        scripts/containerd-env.sh install                 only installs containerd
# DIR/env then holds CONTAINERD_ADDRESS=... and PVISOR_HOME=... for the tests;
# the shim's Jobs live in DIR/pvisor-home (PVISOR_HOME) unless it is set.
# Needs root (containerd mounts snapshots). SNAPSHOTTER=native if this
# machine's kernel cannot mount overlayfs where DIR lies.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

install() {
  command -v containerd >/dev/null && command -v ctr >/dev/null && [ -x /usr/lib/cni/bridge ] &&
    command -v tc >/dev/null && return 0
  "$root/scripts/apt-install.sh" containerd containernetworking-plugins iproute2
}

start() {
  local dir="$1" shim_dir="${2:-$root/target/debug}"
  install
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  local sock="$dir/containerd.sock" home="${PVISOR_HOME:-$dir/pvisor-home}"
  mkdir -p "$dir/root" "$dir/state" "$home"
  # /run/netns becomes a mount point of its own the first time `ip netns
  # add` runs (a recursive bind over itself). Done while a pod's network
  # namespace is mounted there, that bind copies the pod's mount, and
  # containerd's one unmount at teardown leaves the copy: StopPodSandbox
  # fails with EBUSY. A test that adds a namespace of its own beside a CRI
  # pod did that once on a fresh machine; so make it a mount point first.
  if ! mountpoint -q /run/netns 2>/dev/null; then
    ip netns add "pvisor-env-$$" && ip netns del "pvisor-env-$$"
  fi
  if [ -f "$dir/containerd.pid" ] && kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null; then
    echo "$sock"
    return 0
  fi
  cat >"$dir/config.toml" <<TOML
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[debug]
  address = "$dir/debug.sock"
  level = "info"

[plugins."io.containerd.grpc.v1.cri"]
  # CRI gives a pod sandbox oom_score_adj -998; root without
  # CAP_SYS_RESOURCE (as on the test machines) cannot set a value below its
  # own, and runc dies of it (the shim sets none on the node).
  restrict_oom_score_adj = true
  sandbox_image = "${SANDBOX_IMAGE:-docker.io/pvisor/busybox:latest}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${SNAPSHOTTER:-overlayfs}"
    default_runtime_name = "pvisor"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.pvisor]
      runtime_type = "io.containerd.pvisor.v1"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/conf"
TOML
  mkdir -p "$dir/cni/conf" "$dir/cni/ipam"
  cat >"$dir/cni/conf/10-pvisor.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "pvisor-test",
  "plugins": [
    {"type": "bridge", "bridge": "pvisor-cri0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
              "ranges": [[{"subnet": "10.232.0.0/24", "gateway": "10.232.0.1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
JSON
  {
    echo "CONTAINERD_ADDRESS=$sock"
    echo "PVISOR_HOME=$home"
  } >"$dir/env"
  # containerd passes its environment to each shim it starts.
  PATH="$shim_dir:$PATH" PVISOR_HOME="$home" \
    setsid containerd --config "$dir/config.toml" >>"$dir/containerd.log" 2>&1 </dev/null &
  echo $! >"$dir/containerd.pid"
  for _ in $(seq 1 100); do
    if ctr -a "$sock" version >/dev/null 2>&1; then
      echo "$sock"
      return 0
    fi
    sleep 0.1
  done
  echo "containerd did not answer on $sock; see $dir/containerd.log:" >&2
  tail -5 "$dir/containerd.log" >&2
  return 1
}

stop() {
  local dir="$1"
  [ -f "$dir/containerd.pid" ] || return 0
  local pid; pid="$(cat "$dir/containerd.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$dir/containerd.pid"
}

case "${1:-}" in
  install) install ;;
  start) start "${2:?DIR}" "${3:-}" ;;
  stop) stop "${2:?DIR}" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
