"""One CRI pod's figures, for scripts/bench-pod.sh: the pod's start
(RunPodSandbox to the first container's first line of output), its second
container's start (CreateContainer to that container's first line), the
median latency of ExecSync of `true` into the first container, and the
memory of the idle two-container pod (the proportional set size of its
shim and everything the shim started: for pvisor the QEMU and virtiofsd
of the pod's VM, for runc the pause and container processes).

Usage: python pod_bench.py SOCKET IMAGE LOG_DIR HANDLER
Prints one JSON object. The pod is removed even when a step fails.
"""

import json
import os
import statistics
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cri_flow import container_config, stubs  # noqa: E402

SLOW = 180
EXECS = 7


def wait_for_line(path, deadline):
    while time.monotonic() < deadline:
        if os.path.exists(path) and " F ready" in open(path).read():
            return
        time.sleep(0.005)
    raise TimeoutError(f"no output in {path}")


def descendants(root):
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def shim_of(pod):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and pod.encode() in argv:
            return int(pid)
    raise LookupError(f"no shim names pod {pod}")


def pss_kib(pids):
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def main():
    sock, image, log_dir, handler = sys.argv[1:5]
    pb, rpc = stubs()
    cri = rpc.RuntimeServiceStub(grpc.insecure_channel(f"unix://{sock}"))
    namespaces = pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER)
    name = f"bench-{handler}-{os.getpid()}"
    pod_config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=name, namespace="pvisor-bench", attempt=0),
        hostname=name,
        log_directory=log_dir,
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(namespace_options=namespaces)),
    )

    def container(label):
        config = container_config(pb, label, image, ["sh", "-c", "echo ready; exec sleep 2147483647"])
        started = time.monotonic()
        cid = cri.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config), timeout=SLOW
        ).container_id
        cri.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=SLOW)
        wait_for_line(os.path.join(log_dir, f"{label}.log"), started + SLOW)
        return cid, (time.monotonic() - started) * 1000

    seen = {"handler": handler}
    pod = None
    try:
        started = time.monotonic()
        pod = cri.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config, runtime_handler=handler), timeout=SLOW)
        pod = pod.pod_sandbox_id
        first, _ = container("c1")
        seen["pod_start_ms"] = round((time.monotonic() - started) * 1000)
        _, second_ms = container("c2")
        seen["second_start_ms"] = round(second_ms)
        latencies = []
        for _ in range(EXECS):
            t = time.monotonic()
            cri.ExecSync(pb.ExecSyncRequest(container_id=first, cmd=["true"], timeout=60), timeout=90)
            latencies.append((time.monotonic() - t) * 1000)
        seen["exec_ms"] = round(statistics.median(latencies), 1)
        time.sleep(1)
        seen["memory_kib"] = pss_kib(descendants(shim_of(pod)))
    except (grpc.RpcError, TimeoutError, LookupError) as e:
        seen["error"] = str(e)
    finally:
        if pod:
            cri.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=SLOW)
            cri.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=SLOW)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
