"""A small CRI client: one pod through containerd's CRI plugin (runtime.v1),
as the kubelet would drive it, for crates/pvisor-shim/tests/containerd.rs.

Usage: python cri_flow.py SOCKET IMAGE LOG_DIR PVISOR_HOME PROBE
  (the venv's python from scripts/cri-env.sh: grpcio and grpcio-tools)

Generates its stubs from tests/cri/api.proto (vendored from
kubernetes/cri-api) with grpcio-tools' bundled protoc, then:
RunPodSandbox with the runtime handler `pvisor` and the pod network (CNI's
bridge, scripts/containerd-env.sh); an init container that copies a program
and a bootstrap script into an emptyDir-like volume (LOG_DIR/../empty-dir),
as OpenSandbox's execd injection does, run to its end; CreateContainer and
StartContainer from IMAGE through that bootstrap (a server on the pod's port
8080), with the same volume; a connection to the pod's IP from
here and one from the pod to a server here on the CNI gateway, ExecSync of
a command that succeeds and of one that fails; PROBE (pvisor-guest-probe)
copied into the volume and run as `escape` in the container; a second container in the
pod (its start timed, the VMs under PVISOR_HOME counted while both run)
that reaches the first on localhost, has a root of its own, and exits
with its own code while the first runs on; a third over its memory limit,
OOM-killed alone, a fourth whose command the image lacks and a fifth
asking for more memory than the VM has, each refused with the reason; StopContainer,
RemoveContainer, StopPodSandbox, RemovePodSandbox. It asserts nothing: it
prints one JSON object of what it saw, which the Rust test asserts. The pod is stopped and
removed even when a step fails (the error is in the JSON's "error").
"""

import json
import os
import shutil
import subprocess
import socket
import sys
import threading
import tempfile
import time

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
# A VM boot under TCG takes seconds, more on a loaded machine.
SLOW = 180


def stubs():
    out = tempfile.mkdtemp(prefix="cri-stubs-")
    # grpc_tools' own include dir is not needed: api.proto imports nothing.
    code = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}", "api.proto"])
    if code != 0:
        raise SystemExit(f"protoc failed on {HERE}/api.proto ({code})")
    sys.path.insert(0, out)
    import api_pb2  # noqa: E402
    import api_pb2_grpc  # noqa: E402

    return api_pb2, api_pb2_grpc


def read_from(host, port):
    """What a connection to host:port reads until EOF (the server may take
    a moment to listen: a VM under TCG)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((host, port), timeout=10) as conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                return data.decode()
        except OSError as e:
            if time.monotonic() > deadline:
                return f"error: {e}"
            time.sleep(0.5)


class serve_once(threading.Thread):
    """A server on host:0 that answers one connection with `reply` and
    keeps what it read."""

    def __init__(self, host, reply):
        super().__init__(daemon=True)
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(60)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.got = ""
        self.start()

    def run(self):
        try:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(30)
                self.got = conn.recv(4096).decode()
                conn.sendall(self.reply)
        except OSError as e:
            self.got = f"error: {e}"


def vms_under(home):
    """How many QEMU processes run VMs of the pvisor state directory `home`."""
    count = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "qemu-system" in cmdline and home in cmdline:
            count += 1
    return count


def wait_exited(cri, pb, container):
    deadline = time.monotonic() + SLOW
    while True:
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=container), timeout=30).status
        if state.state == pb.CONTAINER_EXITED or time.monotonic() > deadline:
            return {"state": pb.ContainerState.Name(state.state), "code": state.exit_code}
        time.sleep(0.2)


def exec_sync(cri, pb, container, cmd):
    out = cri.ExecSync(pb.ExecSyncRequest(container_id=container, cmd=cmd, timeout=60), timeout=90)
    return {"stdout": out.stdout.decode(), "stderr": out.stderr.decode(), "code": out.exit_code}


def container_config(pb, name, image, command, mounts=(), resources=None):
    """A container of the pod as the kubelet configures one: the pod's
    network, a pid namespace of its own, its log at NAME.log."""
    namespaces = pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER)
    linux = pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(namespace_options=namespaces)
    )
    if resources is not None:
        linux.resources.CopyFrom(resources)
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=0),
        image=pb.ImageSpec(image=image),
        command=command,
        mounts=list(mounts),
        log_path=f"{name}.log",
        linux=linux,
    )


def exec_on_a_terminal(sock, container, command):
    """What `ctr task exec -t` prints, run on a pseudo-terminal of its own
    (util-linux's `script`), as `kubectl exec -it` asks for one."""
    ctr = f"ctr -a {sock} -n k8s.io task exec -t --exec-id tty-{os.getpid()} {container} {command}"
    out = subprocess.run(
        ["script", "-qec", ctr, "/dev/null"], capture_output=True, stdin=subprocess.DEVNULL, timeout=120
    )
    return out.stdout.decode(errors="replace")


def second_container(cri, pb, pod, pod_config, image, first, home, seen, sock):
    """A second container in the running pod: it shares the pod's VM and
    localhost, not the first's files, and exits with its own code."""
    started = time.monotonic()
    config = container_config(
        pb,
        "c2",
        image,
        ["sh", "-c", "echo c2-started; while [ ! -e /tmp/stop ]; do sleep 0.2; done; exit 5"],
        # Half a CPU: its cgroup in the pod's VM gets cpu.max.
        resources=pb.LinuxContainerResources(cpu_quota=50000, cpu_period=100000),
    )
    c2 = cri.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config), timeout=SLOW
    ).container_id
    try:
        cri.StartContainer(pb.StartContainerRequest(container_id=c2), timeout=SLOW)
        seen["second_start_s"] = round(time.monotonic() - started, 2)
        seen["vms_with_two_containers"] = vms_under(home)
        seen["c2_localhost"] = exec_sync(cri, pb, c2, ["sh", "-c", "echo from-c2 | nc -w 10 127.0.0.1 8080"])
        seen["c2_own_file"] = exec_sync(cri, pb, c2, ["sh", "-c", "echo c2 > /tmp/mark && cat /tmp/mark"])
        seen["c1_sees_c2_file"] = exec_sync(cri, pb, first, ["test", "-e", "/tmp/mark"])["code"]
        # Its own process tree (its init is PID 1, nothing of c1's), and a
        # /dev without the guest's disks.
        seen["c2_pid1"] = exec_sync(cri, pb, c2, ["cat", "/proc/1/cmdline"])["stdout"].replace("\0", " ")
        seen["c2_sees_c1"] = exec_sync(cri, pb, c2, ["sh", "-c", "grep -l '[s]erved-by-pod' /proc/[0-9]*/cmdline"])[
            "stdout"
        ]
        seen["c2_dev"] = exec_sync(cri, pb, c2, ["ls", "/dev"])["stdout"].split()
        seen["c2_tty"] = exec_on_a_terminal(sock, c2, "tty")
        cgroup = exec_sync(cri, pb, c2, ["cat", "/proc/self/cgroup"])["stdout"]
        seen["c2_in_its_cgroup"] = cgroup == f"0::/pod-{c2}\n" or cgroup
        exec_sync(cri, pb, c2, ["touch", "/tmp/stop"])
        seen["c2_exit"] = wait_exited(cri, pb, c2)
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=first), timeout=30).status
        seen["c1_after_c2"] = pb.ContainerState.Name(state.state)
        seen["c1_after_c2_exec"] = exec_sync(cri, pb, first, ["echo", "still-here"])
    finally:
        cri.RemoveContainer(pb.RemoveContainerRequest(container_id=c2), timeout=SLOW)


def start_refused(cri, pb, pod, pod_config, config):
    """The error of a container's StartContainer ("started" if none), the
    container then removed. CreateContainer only records it; the task, and
    so the shim's answer, comes at StartContainer."""
    cid = cri.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config), timeout=SLOW
    ).container_id
    try:
        cri.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=SLOW)
        return "started"
    except grpc.RpcError as e:
        return e.details()
    finally:
        cri.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=SLOW)


def oom_container(cri, pb, pod, pod_config, image, first, seen):
    """A container of the pod over its own memory limit: the OOM killer
    ends it (137, OOMKilled) and nothing else of the pod."""
    config = container_config(
        pb,
        "hog",
        image,
        # dd's 128 MiB buffer, filled from /dev/zero, outgrows the 48 MiB limit.
        ["sh", "-c", "echo hog-started; dd if=/dev/zero of=/dev/null bs=128M count=4; echo survived"],
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=48 << 20),
    )
    hog = cri.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config), timeout=SLOW
    ).container_id
    try:
        cri.StartContainer(pb.StartContainerRequest(container_id=hog), timeout=SLOW)
        seen["hog_exit"] = wait_exited(cri, pb, hog)
        status = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=hog), timeout=30).status
        seen["hog_reason"] = status.reason
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=first), timeout=30).status
        seen["c1_after_hog"] = pb.ContainerState.Name(state.state)
        seen["c1_after_hog_exec"] = exec_sync(cri, pb, first, ["echo", "alive"])
        # A command the image lacks: StartContainer fails, naming it.
        config.metadata.name = "missing"
        config.command[:] = ["/no/such/program"]
        config.linux.resources.memory_limit_in_bytes = 0
        seen["missing_command"] = start_refused(cri, pb, pod, pod_config, config)
        # More than the pod's VM has: refused, with the reason.
        config.metadata.name = "too-big"
        config.linux.resources.memory_limit_in_bytes = 64 << 30
        seen["too_big"] = start_refused(cri, pb, pod, pod_config, config)
    finally:
        cri.RemoveContainer(pb.RemoveContainerRequest(container_id=hog), timeout=SLOW)


def main():
    sock, image, log_dir, home, probe = sys.argv[1:6]
    pb, rpc = stubs()
    channel = grpc.insecure_channel(f"unix://{sock}")
    cri = rpc.RuntimeServiceStub(channel)
    seen = {}
    # The kubelet's default: the pod's network, each container its own pids
    # (shareProcessNamespace would be pid=POD, which the shim refuses).
    pod_network = pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER)
    pod_config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="cri-pod", uid="cri-pod-uid", namespace="pvisor-test", attempt=0),
        hostname="cri-pod",
        log_directory=log_dir,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pod_network)
        ),
    )
    pod = None
    container = None
    try:
        version = cri.Version(pb.VersionRequest(), timeout=30)
        seen["runtime"] = f"{version.runtime_name} {version.runtime_version} {version.runtime_api_version}"

        pod = cri.RunPodSandbox(
            pb.RunPodSandboxRequest(config=pod_config, runtime_handler="pvisor"), timeout=SLOW
        ).pod_sandbox_id
        status = cri.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod, verbose=True), timeout=30)
        seen["pod_state"] = pb.PodSandboxState.Name(status.status.state)
        info = json.loads(status.info.get("info", "{}"))
        seen["pod_handler"] = info.get("runtimeHandler", "")
        seen["pod_runtime_type"] = info.get("runtimeType", "")

        # The execd injection of OpenSandbox's Kubernetes deployment: an
        # init container copies a program into an emptyDir, and the
        # sandbox's container starts through it. The kubelet makes the
        # emptyDir on the node and hands CRI its path.
        empty_dir = os.path.join(os.path.dirname(os.path.abspath(log_dir)), "empty-dir")
        os.makedirs(empty_dir, exist_ok=True)
        volume = [pb.Mount(container_path="/opt/opensandbox/bin", host_path=empty_dir)]
        inject = (
            "cp /bin/busybox /opt/opensandbox/bin/echo && "
            "printf '#!/bin/sh\\n/opt/opensandbox/bin/echo injected-started\\nexec \"$@\"\\n' "
            "> /opt/opensandbox/bin/bootstrap.sh && chmod +x /opt/opensandbox/bin/bootstrap.sh"
        )
        init = cri.CreateContainer(
            pb.CreateContainerRequest(
                pod_sandbox_id=pod,
                config=container_config(pb, "inject", image, ["sh", "-c", inject], mounts=volume),
                sandbox_config=pod_config,
            ),
            timeout=SLOW,
        ).container_id
        cri.StartContainer(pb.StartContainerRequest(container_id=init), timeout=SLOW)
        seen["init"] = wait_exited(cri, pb, init)
        cri.RemoveContainer(pb.RemoveContainerRequest(container_id=init), timeout=SLOW)
        seen["volume_after_init"] = sorted(os.listdir(empty_dir))

        config = container_config(
            pb,
            "c1",
            image,
            [
                "/opt/opensandbox/bin/bootstrap.sh",
                "sh",
                "-c",
                # PID 1 of its pid namespace: SIGTERM needs a handler, as under runc.
                "trap 'exit 143' TERM; echo started; while :; do echo served-by-pod | nc -l -p 8080; done",
            ],
            mounts=volume,
        )
        container = cri.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config),
            timeout=SLOW,
        ).container_id
        cri.StartContainer(pb.StartContainerRequest(container_id=container), timeout=SLOW)
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=container), timeout=30)
        seen["container_state"] = pb.ContainerState.Name(state.status.state)

        # The pod's network: its IP is the VM's, both ways.
        pod_ip = status.status.network.ip
        seen["pod_ip"] = pod_ip
        seen["inbound"] = read_from(pod_ip, 8080)
        gateway = pod_ip.rsplit(".", 1)[0] + ".1"
        server = serve_once(gateway, b"served-by-node\n")
        outbound = cri.ExecSync(
            pb.ExecSyncRequest(
                container_id=container, cmd=["sh", "-c", f"echo hi | nc -w 10 {gateway} {server.port}"], timeout=60
            ),
            timeout=90,
        )
        server.join(30)
        seen["outbound"] = {"stdout": outbound.stdout.decode(), "code": outbound.exit_code, "got": server.got}
        addr = cri.ExecSync(pb.ExecSyncRequest(container_id=container, cmd=["ip", "-4", "addr"], timeout=60), timeout=90)
        seen["guest_addresses"] = addr.stdout.decode()

        echo = cri.ExecSync(
            pb.ExecSyncRequest(container_id=container, cmd=["echo", "hello from cri"], timeout=60), timeout=90
        )
        seen["echo"] = {"stdout": echo.stdout.decode(), "stderr": echo.stderr.decode(), "code": echo.exit_code}
        fail = cri.ExecSync(
            pb.ExecSyncRequest(container_id=container, cmd=["sh", "-c", "echo oops >&2; exit 7"], timeout=60),
            timeout=90,
        )
        seen["fail"] = {"stdout": fail.stdout.decode(), "stderr": fail.stderr.decode(), "code": fail.exit_code}
        wrote = cri.ExecSync(
            pb.ExecSyncRequest(
                container_id=container, cmd=["sh", "-c", "echo from-c1 > /opt/opensandbox/bin/from-c1"], timeout=60
            ),
            timeout=90,
        )
        host_copy = os.path.join(empty_dir, "from-c1")
        seen["volume_from_c1"] = {
            "code": wrote.exit_code,
            "host": open(host_copy).read() if os.path.exists(host_copy) else None,
        }
        # A root container's way out of its chroot, and what it reaches.
        shutil.copy(probe, os.path.join(empty_dir, "probe"))
        seen["escape"] = exec_sync(cri, pb, container, ["/opt/opensandbox/bin/probe", "escape"])

        second_container(cri, pb, pod, pod_config, image, container, home, seen, sock)
        oom_container(cri, pb, pod, pod_config, image, container, seen)

        cri.StopContainer(pb.StopContainerRequest(container_id=container, timeout=10), timeout=SLOW)
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=container), timeout=30)
        seen["stopped_state"] = pb.ContainerState.Name(state.status.state)
        seen["stopped_code"] = state.status.exit_code
        log = os.path.join(log_dir, "c1.log")
        seen["log"] = open(log).read() if os.path.exists(log) else ""
        cri.RemoveContainer(pb.RemoveContainerRequest(container_id=container), timeout=SLOW)
        container = None
        left = cri.ListContainers(pb.ListContainersRequest(), timeout=30).containers
        seen["containers_left"] = len(left)

        cri.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=SLOW)
        status = cri.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod), timeout=30)
        seen["stopped_pod_state"] = pb.PodSandboxState.Name(status.status.state)
        cri.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=SLOW)
        pod = None
        seen["pods_left"] = len(cri.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items)
    except grpc.RpcError as e:
        seen["error"] = f"{e.code()}: {e.details()}"
    finally:
        # A failed step must not leave the pod's VMs running.
        for call, request in (
            (cri.RemoveContainer, container and pb.RemoveContainerRequest(container_id=container)),
            (cri.StopPodSandbox, pod and pb.StopPodSandboxRequest(pod_sandbox_id=pod)),
            (cri.RemovePodSandbox, pod and pb.RemovePodSandboxRequest(pod_sandbox_id=pod)),
        ):
            if request:
                try:
                    call(request, timeout=SLOW)
                except grpc.RpcError as e:
                    seen.setdefault("cleanup_errors", []).append(f"{e.code()}: {e.details()}")
    print(json.dumps(seen))


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"cri_flow.py took {time.monotonic() - started:.1f} s", file=sys.stderr)
