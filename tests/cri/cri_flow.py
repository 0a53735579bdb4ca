"""A small CRI client: one pod through containerd's CRI plugin (runtime.v1),
as the kubelet would drive it, for crates/pvisor-shim/tests/containerd.rs.

Usage: python cri_flow.py SOCKET IMAGE LOG_DIR
  (the venv's python from scripts/cri-env.sh: grpcio and grpcio-tools)

Generates its stubs from tests/cri/api.proto (vendored from
kubernetes/cri-api) with grpcio-tools' bundled protoc, then:
RunPodSandbox with the runtime handler `pvisor` and the node's network (no
CNI), CreateContainer and StartContainer from IMAGE, ExecSync of a command
that succeeds and of one that fails, StopContainer, RemoveContainer,
StopPodSandbox, RemovePodSandbox. It asserts nothing: it prints one JSON
object of what it saw, which the Rust test asserts. The pod is stopped and
removed even when a step fails (the error is in the JSON's "error").
"""

import json
import os
import sys
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


def main():
    sock, image, log_dir = sys.argv[1:4]
    pb, rpc = stubs()
    channel = grpc.insecure_channel(f"unix://{sock}")
    cri = rpc.RuntimeServiceStub(channel)
    seen = {}
    node_network = pb.NamespaceOption(network=pb.NODE)
    pod_config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="cri-pod", uid="cri-pod-uid", namespace="pvisor-test", attempt=0),
        hostname="cri-pod",
        log_directory=log_dir,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=node_network)
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

        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="c1", attempt=0),
            image=pb.ImageSpec(image=image),
            command=["sh", "-c", "echo started; while :; do sleep 1; done"],
            log_path="c1.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(namespace_options=node_network)
            ),
        )
        container = cri.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config),
            timeout=SLOW,
        ).container_id
        cri.StartContainer(pb.StartContainerRequest(container_id=container), timeout=SLOW)
        state = cri.ContainerStatus(pb.ContainerStatusRequest(container_id=container), timeout=30)
        seen["container_state"] = pb.ContainerState.Name(state.status.state)

        echo = cri.ExecSync(
            pb.ExecSyncRequest(container_id=container, cmd=["echo", "hello from cri"], timeout=60), timeout=90
        )
        seen["echo"] = {"stdout": echo.stdout.decode(), "stderr": echo.stderr.decode(), "code": echo.exit_code}
        fail = cri.ExecSync(
            pb.ExecSyncRequest(container_id=container, cmd=["sh", "-c", "echo oops >&2; exit 7"], timeout=60),
            timeout=90,
        )
        seen["fail"] = {"stdout": fail.stdout.decode(), "stderr": fail.stderr.decode(), "code": fail.exit_code}

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
