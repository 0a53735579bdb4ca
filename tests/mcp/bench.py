"""Benchmarks `pvisor mcp` against the command line, in one run:

1. the MCP round trip of `run` for `true` (one server, N calls through the
   official Python SDK) beside `pvisor run -q -- true` (N processes);
2. `review` of a 20-run session beside `review` of a single run.

Usage: bench.py PVISOR_BINARY [ROUNDS]; prints medians, spreads and ratios.
Runs in a fresh temporary workspace and state directory.
"""

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

PVISOR = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 20


def spread(samples):
    ms = sorted(s * 1000 for s in samples)
    return statistics.median(ms), ms[0], ms[-1]


def row(name, samples, base=None):
    med, lo, hi = spread(samples)
    ratio = f"{med / spread(base)[0]:.2f}x" if base else "1.00x (baseline)"
    print(f"{name:<44} median {med:8.1f} ms  [{lo:.1f} .. {hi:.1f}]  {ratio}", flush=True)


def cli(ws, env, *args):
    start = time.perf_counter()
    subprocess.run([PVISOR, *args], cwd=ws, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


async def mcp_runs(ws, env, rounds):
    params = StdioServerParameters(command=PVISOR, args=["mcp", "-w", ws], env=env)
    samples = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await s.call_tool("run", {"argv": ["true"]})  # warm
            for _ in range(rounds):
                start = time.perf_counter()
                result = await s.call_tool("run", {"argv": ["true"]})
                samples.append(time.perf_counter() - start)
                assert not result.is_error, result
    return samples


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ws = os.path.join(tmp, "ws")
        os.mkdir(ws)
        env = dict(os.environ, PVISOR_HOME=os.path.join(tmp, "state"))
        cli(ws, env, "run", "-q", "--", "true")  # warm
        runs_cli, runs_mcp = [], []
        # Interleaved, so a busy moment of the host weighs on both alike.
        for _ in range(2):
            runs_cli += [cli(ws, env, "run", "-q", "--", "true") for _ in range(ROUNDS // 2)]
            runs_mcp += asyncio.run(mcp_runs(ws, env, ROUNDS // 2))
        row("pvisor run -q -- true (process)", runs_cli)
        row("MCP run {argv: [true]} (round trip)", runs_mcp, runs_cli)
        print(f"MCP added per run: {spread(runs_mcp)[0] - spread(runs_cli)[0]:+.1f} ms (median difference)")

        for i in range(20):
            cli(ws, env, "run", "-q", "--session", "bench", "--", "sh", "-c", f"echo {i} > file-{i}")
        cli(ws, env, "run", "-q", "--", "sh", "-c", "echo one > single")
        single = [cli(ws, env, "review") for _ in range(ROUNDS)]
        session = [cli(ws, env, "review", "--session", "bench") for _ in range(ROUNDS)]
        row("review of a single run", single)
        row("review --session of a 20-run session", session, single)


main()
