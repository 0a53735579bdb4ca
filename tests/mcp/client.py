"""Drives `pvisor mcp` with the official MCP Python SDK, as an agent's
client would: list the tools, run in a session, review, diff, apply one
path, drop the rest, read the resources, and try bad input.

Usage: client.py WORKSPACE SERVER_COMMAND...   (PVISOR_HOME in the environment;
the server command is `pvisor mcp -w WORKSPACE`, perhaps run as another user)
Prints one line per check and "mcp client: N checks passed"; exits 1 on
the first failed check.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

WORKSPACE, SERVER = sys.argv[1], sys.argv[2:]
checks = 0


def check(cond, what, detail=""):
    global checks
    if not cond:
        print(f"FAILED: {what} {detail}", flush=True)
        sys.exit(1)
    checks += 1
    print(f"ok: {what}", flush=True)


async def call(session, tool, args):
    result = await session.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    return result, result.structured_content, text


async def main():
    params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            check(set(tools) == {"run", "review", "diff", "apply", "drop", "status", "jobs"}, "the tool list", sorted(tools))
            check(all(t.input_schema.get("type") == "object" and t.output_schema for t in tools.values()),
                  "every tool has input and output schemas")

            r, run1, _ = await call(s, "run", {
                "command": "echo one > a.txt; printf 'out\\n'; printf 'err\\033[2J\\n' >&2; exit 3",
                "session": "agent"})
            check(not r.is_error and run1["exit_code"] == 3 and run1["state"] == "failed", "run: exit status", run1)
            check(run1["stdout"]["tail"] == "out\n", "run: stdout tail", run1["stdout"])
            check("\x1b" not in run1["stderr"]["tail"] and "err" in run1["stderr"]["tail"],
                  "run: stderr tail without terminal escapes", run1["stderr"])
            check(run1["receipt"] == "valid" and len(run1["bundle_blake3"]) == 64, "run: receipt", run1)
            check(run1["changes"]["total"] == 1 and run1["session"] == {"name": "agent", "run": 1}, "run: staged", run1)
            check(not os.path.exists(os.path.join(WORKSPACE, "a.txt")), "run: the workspace is untouched")

            _, run2, _ = await call(s, "run", {"argv": ["sh", "-c", "cat a.txt; echo two > b.txt"], "session": "agent"})
            check(run2["stdout"]["tail"] == "one\n" and run2["session"]["run"] == 2, "a session's runs stack", run2)

            _, review, _ = await call(s, "review", {"session": "agent"})
            by_path = {c["path"]: c for c in review["changes"]}
            check(set(by_path) == {"a.txt", "b.txt"}, "review: the session's changes", review)
            check(by_path["a.txt"]["job"] == run1["job"] and by_path["b.txt"]["job"] == run2["job"],
                  "review: each change attributed to its run", by_path)

            _, diff, _ = await call(s, "diff", {"session": "agent", "paths": ["b.txt"]})
            check(len(diff["diffs"]) == 1 and "+two" in diff["diffs"][0]["diff"], "diff: a unified diff", diff)

            _, applied, _ = await call(s, "apply", {"session": "agent", "paths": ["a.txt"]})
            check([p["path"] for p in applied["applied"]] == ["a.txt"] and not applied["session_ended"], "apply: one path", applied)
            check(open(os.path.join(WORKSPACE, "a.txt")).read() == "one\n", "apply: the file landed")
            check(not os.path.exists(os.path.join(WORKSPACE, "b.txt")), "apply: nothing else landed")

            _, dropped, _ = await call(s, "drop", {"session": "agent"})
            check([p["path"] for p in dropped["dropped"]] == ["b.txt"] and dropped["session_ended"], "drop: the rest, ending the session", dropped)

            # Sensitive paths need the consent argument, even named exactly.
            os.makedirs(os.path.join(WORKSPACE, ".git", "hooks"), exist_ok=True)
            owner = os.stat(WORKSPACE)
            for d in [".git", ".git/hooks"]:
                os.chown(os.path.join(WORKSPACE, d), owner.st_uid, owner.st_gid)
            _, run3, text = await call(s, "run", {"command": "printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/post-checkout"})
            check(run3 and run3["exit_code"] == 0 and run3["changes"]["total"] == 1, "run: writes a git hook", text)
            hook = os.path.join(WORKSPACE, ".git", "hooks", "post-checkout")
            _, refused, _ = await call(s, "apply", {"job": run3["job"], "paths": [".git/hooks/post-checkout"]})
            check(refused["applied"] == [] and refused["skipped"] and not os.path.exists(hook),
                  "apply: a sensitive path is skipped without include_sensitive", refused)
            _, consented, _ = await call(s, "apply", {"job": run3["job"], "paths": [".git/hooks/post-checkout"], "include_sensitive": True})
            check(os.path.exists(hook) and consented["applied"], "apply: with include_sensitive it lands", consented)

            # Megabytes of output: the tail and the count, not a flood.
            _, big, _ = await call(s, "run", {"command": "head -c 3000000 /dev/zero | tr '\\000' x", "tail_bytes": 100})
            check(big["stdout"]["bytes"] == 3000000 and big["stdout"]["tail"] == "x" * 100, "run: megabytes of output", big["stdout"]["bytes"])

            # A timeout cancels the command; it still ends with a receipt.
            _, slow, _ = await call(s, "run", {"command": "sleep 60", "timeout": 1})
            check(slow["state"] == "cancelled" and slow["receipt"] == "valid", "run: a timeout cancels", slow)

            # Bad input: error results, and the server keeps serving.
            for args, words in [
                ({"command": "true", "workspace": "/no/such/dir"}, "workspace"),
                ({"command": "true", "workspace": os.environ["PVISOR_HOME"]}, "state directory"),
                ({"command": "true", "argv": ["true"]}, "not both"),
                ({}, "command"),
                ({"command": "true", "session": "a/b"}, "session name"),
                ({"command": "true", "network": {"allow": ["bad host name!"]}}, ""),
            ]:
                r, _, text = await call(s, "run", args)
                check(r.is_error and words in text, f"run refuses {json.dumps(args)}", text)
            r, _, text = await call(s, "review", {"session": "never-started"})
            check(r.is_error and "no open session" in text, "review of a missing session", text)
            r, _, text = await call(s, "apply", {"session": "never-started"})
            check(r.is_error, "apply of nothing", text)

            resources = (await s.list_resources()).resources
            uris = {str(res.uri) for res in resources}
            check(f"pvisor://jobs/{run1['job']}/trace" in uris and f"pvisor://jobs/{run1['job']}/receipt" in uris,
                  "resources: each Job's trace and receipt", sorted(uris)[:4])
            receipt = await s.read_resource(f"pvisor://jobs/{run1['job']}/receipt")
            body = json.loads(receipt.contents[0].text)
            check(body["receipt"]["job"] == run1["job"] and body["receipt"]["result"]["exit_code"] == 3, "resources: the receipt", body)
            trace = json.loads((await s.read_resource(f"pvisor://jobs/{run1['job']}/trace")).contents[0].text)
            check(any(e.get("type") == "run.started" or e.get("kind") == "run.started" for e in trace["events"]) or len(trace["events"]) > 3,
                  "resources: the trace", len(trace["events"]))

            if os.environ.get("PVISOR_VM_IMAGE"):
                _, vm, text = await call(s, "run", {"command": "echo out; echo err >&2; echo f > f; exit 4", "executor": "vm"})
                check(vm and vm["exit_code"] == 4 and vm["stdout"]["tail"] == "out\n" and vm["stderr"]["tail"] == "err\n"
                      and vm["changes"]["total"] == 1, "run: the vm executor's output is captured too", vm or text)

            _, status, _ = await call(s, "status", {"job": run1["job"]})
            check(status["status"]["exit_code"] == 3, "status", status)
            _, jobs, _ = await call(s, "jobs", {"limit": 2})
            check(len(jobs["jobs"]) == 2, "jobs", jobs)


def raw_protocol():
    """A line that is not JSON-RPC, and a call of an unknown method: the
    server answers what it can and keeps serving."""
    import subprocess
    lines = [
        "this is not json",
        '{"jsonrpc":"2.0","id":7,"method":"bogus/method"}',
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        '"capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}',
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        '{"jsonrpc":"2.0","id":2,"method":"tools/list"}',
    ]
    server = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server.stdin.write("\n".join(lines) + "\n")
    server.stdin.flush()
    answers = {}
    while 2 not in answers:
        line = server.stdout.readline()
        if not line:
            break
        message = json.loads(line)
        answers[message.get("id")] = message
    server.stdin.close()
    server.wait(timeout=30)
    check("error" in answers.get(7, {}), "raw: an unknown method gets an error", answers.get(7))
    check(answers.get(1, {}).get("result", {}).get("serverInfo", {}).get("name") == "pvisor", "raw: initialize after garbage", answers.get(1))
    check(len(answers.get(2, {}).get("result", {}).get("tools", [])) == 7, "raw: the server kept serving")


asyncio.run(main())
raw_protocol()
print(f"mcp client: {checks} checks passed", flush=True)
