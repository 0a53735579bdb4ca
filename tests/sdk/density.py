"""How many idle `pvisor serve` sandboxes this host holds: the density
benchmark's fill (crates/pvisor-cli/benches/density.rs runs this).

Creates sandboxes one at a time through the published SDK, each until a
command ran in it, and keeps them all. Every STEP sandboxes it samples the
host: MemAvailable, and how busy the CPUs were over SAMPLE_S seconds with
nothing but the idle sandboxes (and the host's own work) running. It stops
at the first of:
- memory: MemAvailable below RESERVE_MIB (the host's other work needs it);
- cpu: the CPUs BUSY_LIMIT percent busy with the sandboxes idle, the point
  past which this host's creates slow and its wakeups queue;
- slow: one create until its command ran took over SLOW_S seconds;
- failed: a create failed (the error is kept);
- max: MAX sandboxes.
Then a command runs in every sandbox (each still answers), and all are
killed and waited for. Prints one JSON object.
"""
import json
import os
import resource
import time
from datetime import timedelta

from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
# Every sandbox's client keeps its sockets for the whole fill: the soft
# descriptor limit (often 1024) must not be what stops it.
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
env = os.environ
limit_max = int(env.get("MAX", "1000"))
reserve_kib = int(env.get("RESERVE_MIB", "2048")) * 1024
busy_limit = float(env.get("BUSY_LIMIT", "85"))
slow_s = float(env.get("SLOW_S", "30"))
step = int(env.get("STEP", "10"))
sample_s = float(env.get("SAMPLE_S", "5"))
cfg = ConnectionConfigSync(domain=env["PVISOR_URL"], protocol="http", api_key=env.get("PVISOR_KEY"),
                           request_timeout=timedelta(seconds=300))


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def cpu_ticks():
    with open("/proc/stat") as f:
        # user nice system idle iowait irq softirq steal; guest time is
        # already counted in user and nice.
        fields = [int(v) for v in f.readline().split()[1:9]]
    return sum(fields), fields[3] + fields[4]  # all, idle + iowait


def busy_pct(seconds):
    """How busy the CPUs were over the next `seconds`, in percent."""
    total0, idle0 = cpu_ticks()
    time.sleep(seconds)
    total1, idle1 = cpu_ticks()
    return 100.0 * (1 - (idle1 - idle0) / max(total1 - total0, 1))


def sample(n, create_ms, seconds=sample_s):
    return {"n": n, "mem_available_mib": mem_available_kib() // 1024, "busy_pct": round(busy_pct(seconds), 1),
            "create_ms": create_ms}


# The host before the fill, over a longer window: its own work comes in bursts.
out = {"baseline": sample(0, None, 3 * sample_s), "samples": [], "create_ms": [], "stop": "max", "error": None}
held, failed = [], []
while True:
    if len(held) >= limit_max:
        break
    if mem_available_kib() < reserve_kib:
        out["stop"] = "memory"
        break
    start = time.monotonic()
    s = None
    try:
        s = SandboxSync.create("default", connection_config=cfg, ready_timeout=timedelta(seconds=300))
        s.commands.run("true")
    except Exception as e:  # the host refused one more: that is the figure
        out["stop"], out["error"] = "failed", f"{type(e).__name__}: {e}"[:500]
        if s is not None:  # created, but its command failed: not held
            failed.append(s)
        break
    held.append(s)
    took = round((time.monotonic() - start) * 1000, 1)
    out["create_ms"].append(took)
    if took > slow_s * 1000:
        out["stop"] = "slow"
        break
    if len(held) % step == 0:
        row = sample(len(held), took)
        out["samples"].append(row)
        if row["busy_pct"] >= busy_limit:
            out["stop"] = "cpu"
            break
out["held"] = len(held)
out["final"] = sample(len(held), None, 3 * sample_s)
# Each one still answers, all alive at once.
out["ping_ms"] = []
for s in held:
    start = time.monotonic()
    try:
        s.commands.run("true")
        out["ping_ms"].append(round((time.monotonic() - start) * 1000, 1))
    except Exception as e:
        out["ping_ms"].append(None)
        out["error"] = out["error"] or f"ping: {type(e).__name__}: {e}"[:500]
for s in held + failed:
    try:
        s.kill()
    except Exception:
        pass
deadline = time.monotonic() + 600
for s in held + failed:
    while time.monotonic() < deadline:
        try:
            if s.get_info().status.state in ("Terminated", "Failed"):
                break
        except Exception:
            break  # gone from the API
        time.sleep(0.1)
    s.close()
print(json.dumps(out))
