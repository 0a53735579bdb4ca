"""`pvisor serve` through the published SDK: the figures the serve benchmark
reports (crates/pvisor-cli/benches/serve.rs runs this and adds baselines).

Prints one JSON object: lists of milliseconds per measure, plus the ids of
idle sandboxes left running for the memory measurement (the caller kills them).
"""
import json
import os
import time
from datetime import timedelta

import httpx
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
iters = int(os.environ.get("ITERS", "5"))
idle = int(os.environ.get("IDLE", "3"))
url = os.environ["PVISOR_URL"]
cfg = ConnectionConfigSync(domain=url, protocol="http", api_key=os.environ.get("PVISOR_KEY"),
                           request_timeout=timedelta(seconds=120))
out = {"create_ms": [], "create_run_ms": [], "idle_ping_ms": [], "run_true_ms": [], "health_ms": [], "pause_ms": [], "resume_ms": [], "idle": []}


def ms(start):
    return round((time.monotonic() - start) * 1000, 1)


client = httpx.Client()
for _ in range(iters):
    start = time.monotonic()
    client.get(f"http://{url}/health")
    out["health_ms"].append(ms(start))

for _ in range(iters):
    start = time.monotonic()
    sb = SandboxSync.create("default", connection_config=cfg, ready_timeout=timedelta(seconds=180))
    out["create_ms"].append(ms(start))
    sb.commands.run("true")
    out["create_run_ms"].append(ms(start))
    sb.kill()
    sb.close()

sb = SandboxSync.create("default", connection_config=cfg, ready_timeout=timedelta(seconds=180))
sb.commands.run("true")
for _ in range(iters * 4):
    start = time.monotonic()
    sb.commands.run("true")
    out["run_true_ms"].append(ms(start))
for _ in range(iters):
    start = time.monotonic()
    sb.pause()
    while sb.get_info().status.state != "Paused":
        time.sleep(0.01)
    out["pause_ms"].append(ms(start))
    start = time.monotonic()
    sb2 = SandboxSync.resume(sb.id, connection_config=cfg, resume_timeout=timedelta(seconds=180))
    sb2.commands.run("true")
    out["resume_ms"].append(ms(start))
    sb.close()
    sb = sb2
sb.kill()
sb.close()

# Concurrent creates: CONCURRENT clients each create a sandbox and run
# `true` in it, all at once; the wall time until the last one ran, and each
# client's own time. They are gone before the idle sandboxes are measured.
concurrent = int(os.environ.get("CONCURRENT", "0"))
if concurrent:
    from concurrent.futures import ThreadPoolExecutor

    def create_and_run(_):
        start = time.monotonic()
        s = SandboxSync.create("default", connection_config=cfg, ready_timeout=timedelta(seconds=600))
        s.commands.run("true")
        return s, ms(start)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrent) as pool:
        done = list(pool.map(create_and_run, range(concurrent)))
    out["concurrent_wall_ms"] = [ms(start)]
    out["concurrent_each_ms"] = [each for _, each in done]
    for s, _ in done:
        s.kill()
    deadline = time.monotonic() + 300
    for s, _ in done:
        while True:
            try:
                if s.get_info().status.state in ("Terminated", "Failed"):
                    break
            except Exception:
                break  # gone from the API
            assert time.monotonic() < deadline, f"{s.id} did not stop"
            time.sleep(0.1)
        s.close()

idlers = []
for _ in range(idle):
    s = SandboxSync.create("default", connection_config=cfg, ready_timeout=timedelta(seconds=180))
    out["idle"].append(s.id)
    idlers.append(s)
# Every idle sandbox still answers: a command round trip to each, all alive at once.
for s in idlers:
    start = time.monotonic()
    s.commands.run("true")
    out["idle_ping_ms"].append(ms(start))
    s.close()
# Egress through networkPolicy: a download and small requests from a sandbox
# through the policy path (the agent's relay, then the Job's proxy) to a
# host server on EGRESS_PORT; the caller measures the same from the host.
egress_port = os.environ.get("EGRESS_PORT")
if egress_port:
    from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

    policy = NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="localhost")])
    s = SandboxSync.create("python", connection_config=cfg, ready_timeout=timedelta(seconds=180), network_policy=policy)
    # localhost is the guest itself unless the proxy is asked for it.
    curl = f"curl -s --noproxy '' -o /dev/null -w '%{{time_total}} %{{size_download}}\\n' http://localhost:{egress_port}"
    out["egress_big_s"], out["egress_small_s"] = [], []
    for _ in range(iters):
        line = s.commands.run(f"{curl}/big").text.split()
        assert int(line[1]) == int(os.environ["EGRESS_BYTES"]), line
        out["egress_big_s"].append(float(line[0]))
    for t in s.commands.run(f"for i in $(seq {iters * 4}); do {curl}/small; done").text.splitlines():
        out["egress_small_s"].append(float(t.split()[0]))
    s.kill()
    s.close()
# The credential vault's cost: small requests from one sandbox to VAULT_HOST
# (which the daemon resolves to VAULT_IP, port 80) through the policy path,
# first with a vault that binds nothing, then with a binding that injects a
# bearer token into each.
vault_host = os.environ.get("VAULT_HOST")
if vault_host:
    from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

    rules = [NetworkRule(action="allow", target=vault_host), NetworkRule(action="allow", target=os.environ["VAULT_IP"])]
    s = SandboxSync.create("python", connection_config=cfg, ready_timeout=timedelta(seconds=180),
                           network_policy=NetworkPolicy(default_action="deny", egress=rules),
                           credential_proxy=CredentialProxyConfig(enabled=True))
    curl = f"curl -s -o /dev/null -w '%{{time_total}}\\n' http://{vault_host}/small"
    loop = f"for i in $(seq {iters * 4}); do {curl}; done"
    s.credential_vault.create(credentials=[{"name": "t", "source": {"value": "bench-token"}}], bindings=[])
    out["vault_plain_s"] = [float(t) for t in s.commands.run(loop).text.split()]
    s.credential_vault.patch(bindings={"add": [{"name": "b", "match": {
        "schemes": ["http"], "ports": [80], "hosts": [vault_host], "paths": ["/small"]},
        "auth": {"type": "bearer", "credential": "t"}}]})
    out["vault_injected_s"] = [float(t) for t in s.commands.run(loop).text.split()]
    s.kill()
    s.close()
print(json.dumps(out))
