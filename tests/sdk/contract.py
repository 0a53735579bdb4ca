"""Contract tests: every lifecycle and execd route of `pvisor serve`, each
response checked against the OpenSandbox OpenAPI documents: the status must
be one the operation documents, and a JSON body must match its schema.

Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY SPECS=DIR python contract.py
"""
import json
import os
import sys
import time

import httpx
import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPECS = os.environ["SPECS"]
BASE = "http://" + os.environ["PVISOR_URL"]
KEY = os.environ.get("PVISOR_KEY", "")


def load(name):
    with open(os.path.join(SPECS, name)) as f:
        doc = yaml.safe_load(f)

    # OpenAPI 3.0's `nullable` (execd) as JSON Schema 2020-12 types.
    def fix(node):
        if isinstance(node, dict):
            if node.get("nullable") is True and isinstance(node.get("type"), str):
                node["type"] = [node["type"], "null"]
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(doc)
    return doc


LIFECYCLE = load("sandbox-lifecycle.yml")
EXECD = load("execd-api.yaml")
checked = []


def check(spec, uri, method, template, resp, want=None):
    op = spec["paths"][template][method.lower()]
    status = str(resp.status_code)
    assert status in op["responses"], f"{method} {template}: {status} is not documented ({list(op['responses'])}): {resp.text[:300]}"
    if want is not None:
        assert resp.status_code == want, f"{method} {template}: want {want}, got {status}: {resp.text[:300]}"
    assert resp.headers.get("x-request-id"), f"{method} {template}: no X-Request-ID"
    escape = lambda part: part.replace("~", "~0").replace("/", "~1")
    pointer = f"/paths/{escape(template)}/{method.lower()}/responses/{status}"
    answer = op["responses"][status]
    if "$ref" in answer:
        pointer = answer["$ref"][1:]
        answer = spec["components"]["responses"][answer["$ref"].split("/")[-1]]
    # An empty body has no JSON to check (replace without verbose: the spec
    # documents the body only for ?verbose=true).
    if resp.content and "schema" in answer.get("content", {}).get("application/json", {}):
        registry = Registry().with_resource(uri, Resource.from_contents(spec, default_specification=DRAFT202012))
        ref = {"$ref": f"{uri}#{pointer}/content/application~1json/schema"}
        jsonschema.Draft202012Validator(ref, registry=registry).validate(resp.json())
    checked.append(f"{method} {template} {status}")
    return resp


def life(method, template, path, want=None, **kw):
    headers = kw.pop("headers", {"OPEN-SANDBOX-API-KEY": KEY})
    resp = httpx.request(method, BASE + "/v1" + path, headers=headers, timeout=120, **kw)
    return check(LIFECYCLE, "urn:lifecycle", method, template, resp, want)


# --- lifecycle ---------------------------------------------------------------
health = httpx.get(BASE + "/health")
assert health.status_code == 200 and health.json()["status"] == "healthy"

r = life("GET", "/sandboxes", "/sandboxes", 401, headers={"OPEN-SANDBOX-API-KEY": "wrong"})
assert r.json()["code"] == "UNAUTHORIZED"
# Unknown fields are refused exactly where the spec says additionalProperties: false.
r = life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "default", "bogus": 1}, "entrypoint": ["true"]})
assert "bogus" in r.json()["message"]
r = life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "default"}, "entrypoint": ["true"], "platform": {"os": "linux", "arch": "amd64", "x": 1}})
assert "unknown field" in r.json()["message"]
life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "default"}, "entrypoint": ["true"], "platform": {"os": "linux", "arch": "arm64"}})
life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "nope:1"}, "entrypoint": ["true"]})
life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "default"}, "entrypoint": ["true"], "timeout": 5})
life("GET", "/sandboxes/{sandboxId}", "/sandboxes/sb-missing", 404)

body = {"image": {"uri": "default"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600,
        "resourceLimits": {"cpu": "500m", "memory": "512Mi"}, "metadata": {"team": "ml", "note": "a b&c"}, "env": {"GREETING": "hi"},
        "someFutureField": {"ignored": True}}
created = life("POST", "/sandboxes", "/sandboxes", 202, json=body, headers={"OPEN-SANDBOX-API-KEY": KEY, "X-Request-ID": "req-123"})
assert created.headers["x-request-id"] == "req-123"
sid = created.json()["id"]
assert sid.startswith("sb-") and created.json()["status"]["state"] == "Pending"
deadline = time.time() + 180
while True:
    got = life("GET", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 200).json()
    if got["status"]["state"] == "Running":
        break
    assert got["status"]["state"] == "Pending" and time.time() < deadline, got
    time.sleep(0.2)
# The `/` alias of the reference server.
assert httpx.get(f"{BASE}/sandboxes/{sid}", headers={"OPEN-SANDBOX-API-KEY": KEY}).json()["id"] == sid

listing = life("GET", "/sandboxes", "/sandboxes", 200, params=[("state", "Running"), ("state", "Paused"), ("metadata", "team=ml&note=a%20b%26c"), ("pageSize", "1")]).json()
assert [s["id"] for s in listing["items"]] == [sid], listing
assert listing["pagination"]["totalItems"] == 1
none = life("GET", "/sandboxes", "/sandboxes", 200, params={"metadata": "team=other"}).json()
assert none["items"] == [] and none["pagination"]["hasNextPage"] is False
# States are free strings matched ignoring case; one pvisor never uses
# matches nothing (reference: matches_filter, server/opensandbox_server/
# services/helpers.py at OpenSandbox 4db3a99).
assert life("GET", "/sandboxes", "/sandboxes", 200, params={"state": "Allocated"}).json()["items"] == []
assert [s["id"] for s in life("GET", "/sandboxes", "/sandboxes", 200, params={"state": "running"}).json()["items"]] == [sid]

patched = life("PATCH", "/sandboxes/{sandboxId}/metadata", f"/sandboxes/{sid}/metadata", 200, json={"team": None, "env": "prod"}).json()
assert patched["metadata"] == {"note": "a b&c", "env": "prod"}, patched
life("PATCH", "/sandboxes/{sandboxId}/metadata", f"/sandboxes/{sid}/metadata", 400, json={"opensandbox.io/x": "1"})

renewed = life("POST", "/sandboxes/{sandboxId}/renew-expiration", f"/sandboxes/{sid}/renew-expiration", 200,
               json={"expiresAt": time.strftime("%Y-%m-%dT%H:%M:%S.123456+00:00", time.gmtime(time.time() + 1200))}).json()
assert renewed["expiresAt"].endswith("Z")
# Earlier than the current expiry is fine while it is in the future: the
# reference checks only that (ensure_future_expiration, server/
# opensandbox_server/services/validators.py at 4db3a99); SandboxPool needs it.
earlier = life("POST", "/sandboxes/{sandboxId}/renew-expiration", f"/sandboxes/{sid}/renew-expiration", 200,
               json={"expiresAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 900))}).json()
assert earlier["expiresAt"] < renewed["expiresAt"], (earlier, renewed)
assert life("GET", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 200).json()["expiresAt"] == earlier["expiresAt"]
r = life("POST", "/sandboxes/{sandboxId}/renew-expiration", f"/sandboxes/{sid}/renew-expiration", 400, json={"expiresAt": "2000-01-01T00:00:00Z"})
assert "must be in the future" in r.json()["message"], r.text
life("POST", "/sandboxes/{sandboxId}/renew-expiration", f"/sandboxes/{sid}/renew-expiration", 400, json={"expiresAt": "2999-01-01T00:00:00Z", "extra": 1})

ep = life("GET", "/sandboxes/{sandboxId}/endpoints/{port}", f"/sandboxes/{sid}/endpoints/44772", 200).json()
assert "://" not in ep["endpoint"] and ep["headers"]["X-EXECD-ACCESS-TOKEN"]
life("GET", "/sandboxes/{sandboxId}/endpoints/{port}", f"/sandboxes/{sid}/endpoints/0", 400)
other = life("GET", "/sandboxes/{sandboxId}/endpoints/{port}", f"/sandboxes/{sid}/endpoints/8000", 200).json()
# Nothing listens yet: a clear 502 (the service is started below, after execd is checked).
proxied = httpx.get("http://" + other["endpoint"] + "/", headers=other["headers"])
assert proxied.status_code == 502 and proxied.json()["code"] == "PORT_NOT_REACHABLE", proxied.text
life("POST", "/sandboxes/{sandboxId}/resume", f"/sandboxes/{sid}/resume", 409)

# --- execd -------------------------------------------------------------------
E = "http://" + ep["endpoint"]
T = ep["headers"]


def ex(method, template, path, want=None, **kw):
    headers = kw.pop("headers", T)
    resp = httpx.request(method, E + path, headers=headers, timeout=120, **kw)
    return check(EXECD, "urn:execd", method, template, resp, want)


assert httpx.get(E + "/ping").status_code == 401
ex("GET", "/ping", "/ping", 200)


def sse(resp):
    events = [json.loads(chunk[len("data: "):]) for chunk in resp.text.split("\n\n") if chunk.startswith("data: ")]
    schema = {"$ref": "urn:execd#/components/schemas/ServerStreamEvent"}
    registry = Registry().with_resource("urn:execd", Resource.from_contents(EXECD, default_specification=DRAFT202012))
    for e in events:
        jsonschema.Draft202012Validator(schema, registry=registry).validate(e)
        assert isinstance(e["timestamp"], int)
    return events


r = ex("POST", "/command", "/command", 200, json={"command": "echo $GREETING; echo err >&2; pwd", "cwd": "/tmp"})
assert r.headers["content-type"].startswith("text/event-stream")
events = sse(r)
assert [e["type"] for e in events] == ["init", "stdout", "stderr", "stdout", "execution_complete"], events
# One event per line, without its terminator (reference: Controller.readFromPos,
# components/execd/pkg/runtime/command_common.go at 4db3a99, and its tests
# TestReadFromPos_*): \r ends a line too, a blank line is "\n", the tail flushes.
assert events[1]["text"] == "hi" and events[3]["text"] == "/tmp"
events = sse(ex("POST", "/command", "/command", 200, json={"command": "printf 'a\\n\\nb\\r\\nprog 10%%\\rprog 20%%\\rtail'"}))
assert [e["text"] for e in events if e["type"] == "stdout"] == ["a", "\n", "b", "prog 10%", "prog 20%", "tail"], events
events = sse(ex("POST", "/command", "/command", 200, json={"command": "exit 4"}))
assert events[-1]["type"] == "error" and events[-1]["error"]["evalue"] == "4"
events = sse(ex("POST", "/command", "/command", 200, json={"command": "sleep 30", "timeout": 500}))
assert events[-1]["type"] == "error", events
ex("POST", "/command", "/command", 400, json={"cmd": "x"})

bg = sse(ex("POST", "/command", "/command", 200, json={"command": "for i in 1 2 3; do echo line $i; done; sleep 300", "background": True}))
cid = bg[0]["text"]
assert [e["type"] for e in bg] == ["init", "execution_complete"]
time.sleep(1)
st = ex("GET", "/command/status/{id}", f"/command/status/{cid}", 200).json()
assert st["running"] is True and st["exit_code"] is None, st
logs = ex("GET", "/command/{id}/logs", f"/command/{cid}/logs", 200)
# The cursor is a byte offset (reference: GetBackgroundCommandOutput and
# SeekBackgroundCommandOutput, components/execd/pkg/runtime/command_status.go
# at 4db3a99, not the spec's "line cursor").
assert logs.text == "line 1\nline 2\nline 3\n" and logs.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "21", (logs.text, logs.headers)
tail = ex("GET", "/command/{id}/logs", f"/command/{cid}/logs", 200, params={"cursor": 14})
assert tail.text == "line 3\n" and tail.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "21", (tail.text, tail.headers)
past = ex("GET", "/command/{id}/logs", f"/command/{cid}/logs", 200, params={"cursor": 500})
assert past.text == "" and past.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "500"
ex("GET", "/command/{id}/logs", "/command/cmd-missing/logs", 404)
ex("DELETE", "/command", "/command", 200, params={"id": cid})
deadline = time.time() + 10
while ex("GET", "/command/status/{id}", f"/command/status/{cid}", 200).json()["running"]:
    assert time.time() < deadline
    time.sleep(0.2)

# An upload larger than one 8 MiB agent page arrives whole.
import hashlib
big = os.urandom(20 << 20)
ex("POST", "/files/upload", "/files/upload", 200, files={
    "metadata": (None, json.dumps({"path": "/work/big.bin", "mode": 600}), "application/json"),
    "file": ("big.bin", big, "application/octet-stream")})
digest = sse(ex("POST", "/command", "/command", 200, json={"command": "sha256sum < /work/big.bin; stat -c %s /work/big.bin"}))
assert [e["text"] for e in digest if e["type"] == "stdout"] == [hashlib.sha256(big).hexdigest() + "  -", f"{len(big)}"], digest
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/work/big.bin"}).content == big
part = ex("GET", "/files/download", "/files/download", 206, params={"path": "/work/big.bin"}, headers={**T, "Range": "bytes=9000000-9000009"})
assert part.content == big[9000000:9000010]

files = {"metadata": (None, json.dumps({"path": "/work/dir/a.txt", "mode": 640}), "application/json"),
         "file": ("a.txt", b"0123456789", "application/octet-stream")}
ex("POST", "/files/upload", "/files/upload", 200, files=files)
info = ex("GET", "/files/info", "/files/info", 200, params=[("path", "/work/dir/a.txt"), ("path", "/etc/passwd")]).json()
assert info["/work/dir/a.txt"]["size"] == 10 and info["/work/dir/a.txt"]["mode"] == 640 and info["/work/dir/a.txt"]["type"] == "file", info
ex("GET", "/files/info", "/files/info", 404, params={"path": "/nope"})
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/work/dir/a.txt"}).content == b"0123456789"
part = ex("GET", "/files/download", "/files/download", 206, params={"path": "/work/dir/a.txt"}, headers={**T, "Range": "bytes=2-4"})
assert part.content == b"234" and part.headers["content-range"] == "bytes 2-4/10"
ex("GET", "/files/download", "/files/download", 416, params={"path": "/work/dir/a.txt"}, headers={**T, "Range": "bytes=50-60"})
# execd's own error codes (components/execd/pkg/web/model/error.go at 4db3a99).
r = ex("GET", "/files/download", "/files/download", 404, params={"path": "/nope"})
assert r.json()["code"] == "FILE_NOT_FOUND", r.text
r = ex("GET", "/files/download", "/files/download", 400, params={})
assert r.json() == {"code": "MISSING_QUERY", "message": "missing query parameter 'path'"}, r.text
assert ex("POST", "/command", "/command", 400, json={"cmd": "x"}).json()["code"] == "INVALID_REQUEST_BODY"
# Line-based reads: offset (1-based) and limit, as text/plain (execd-api.yaml downloadFile).
sse(ex("POST", "/command", "/command", 200, json={"command": "printf 'one\\ntwo\\nthree\\nfour' > /tmp/lines.txt"}))
r = ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/lines.txt", "offset": 2, "limit": 2})
assert r.text == "two\nthree\n" and r.headers["content-type"].startswith("text/plain"), (r.text, r.headers)
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/lines.txt", "offset": 4}).text == "four"
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/lines.txt", "limit": 1}).text == "one\n"
r = ex("GET", "/files/download", "/files/download", 400, params={"path": "/tmp/lines.txt", "offset": 9})
assert "has 4 line" in r.json()["message"], r.text
ex("GET", "/files/download", "/files/download", 400, params={"path": "/tmp/lines.txt", "offset": 1}, headers={**T, "Range": "bytes=0-1"})
# /files/replace: every literal occurrence, mode kept, counts with verbose, 0 is
# not an error (reference: FilesystemController.ReplaceContent,
# components/execd/pkg/web/controller/filesystem.go at 4db3a99).
sse(ex("POST", "/command", "/command", 200, json={"command": "printf 'host=localhost:8080\\nport=localhost:8080\\n' > /tmp/cfg && chmod 640 /tmp/cfg"}))
r = ex("POST", "/files/replace", "/files/replace", 200, params={"verbose": "true"}, json={"/tmp/cfg": {"old": "localhost:8080", "new": "0.0.0.0:9090"}})
assert r.json() == {"/tmp/cfg": {"replacedCount": 2}}, r.text
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/cfg"}).text == "host=0.0.0.0:9090\nport=0.0.0.0:9090\n"
assert ex("GET", "/files/info", "/files/info", 200, params={"path": "/tmp/cfg"}).json()["/tmp/cfg"]["mode"] == 640
assert ex("POST", "/files/replace", "/files/replace", 200, json={"/tmp/cfg": {"old": "absent", "new": "x"}}).text == ""
r = ex("POST", "/files/replace", "/files/replace", 400, json={"/tmp/cfg": {"old": "", "new": "x"}})
assert r.json()["code"] == "INVALID_REQUEST_BODY", r.text
# A missing file is the reference's 404 (the spec lists only 400 and 500), and
# one bad path among several changes none of them.
r = httpx.post(E + "/files/replace", headers=T, json={"/tmp/cfg": {"old": "0.0.0.0", "new": "X"}, "/nope": {"old": "a", "new": "b"}})
assert r.status_code == 404 and r.json()["code"] == "FILE_NOT_FOUND", r.text
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/cfg"}).text == "host=0.0.0.0:9090\nport=0.0.0.0:9090\n"
ex("POST", "/files/permissions", "/files/permissions", 200, json={"/work/dir/a.txt": {"mode": 600, "owner": "root", "group": "root"}})
ex("POST", "/directories", "/directories", 200, json={"/work/dir/sub/deeper": {"mode": 700}})
ex("POST", "/files/mv", "/files/mv", 200, json=[{"src": "/work/dir/a.txt", "dest": "/work/dir/sub/b.txt"}])
listing = ex("GET", "/directories/list", "/directories/list", 200, params={"path": "/work/dir", "depth": 3}).json()
assert [(e["path"], e["type"], e["mode"]) for e in listing] == [
    ("/work/dir/sub", "directory", 755), ("/work/dir/sub/b.txt", "file", 600), ("/work/dir/sub/deeper", "directory", 700)], listing
found = ex("GET", "/files/search", "/files/search", 200, params={"path": "/work", "pattern": "*.txt"}).json()
assert [e["path"] for e in found] == ["/work/dir/sub/b.txt"], found
ex("DELETE", "/files", "/files", 200, params={"path": "/work/dir/sub/b.txt"})
ex("DELETE", "/directories", "/directories", 200, params={"path": "/work"})
ex("GET", "/files/info", "/files/info", 404, params={"path": "/work"})
# Escapes stay in the sandbox root: `..` and absolute symlinks resolve beneath it.
sse(ex("POST", "/command", "/command", 200, json={"command": "ln -s / /tmp/up; ln -s /../../.. /tmp/up2"}))
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/../../../etc/os-release"}).content.startswith(b"PRETTY_NAME=\"pvisor default")
assert ex("GET", "/files/download", "/files/download", 200, params={"path": "/tmp/up2/etc/os-release"}).content.startswith(b"PRETTY_NAME=\"pvisor default")
# A search over the whole root (with /proc, /sys and /dev mounted inside)
# is bounded and leaves the sandbox working.
found = ex("GET", "/files/search", "/files/search", 200, params={"path": "/", "pattern": "*.so*"}).json()
assert any(e["path"].startswith("/lib/") or e["path"].startswith("/usr/lib/") for e in found), found[:3]
assert not any(e["path"].startswith(("/proc/", "/sys/")) for e in found)
big = ex("GET", "/directories/list", "/directories/list", 200, params={"path": "/", "depth": 64}).json()
assert len(big) > 300 and not any(e["path"].startswith("/proc/") for e in big), len(big)
# A FIFO or a device is not a file to download; the agent does not hang on it.
sse(ex("POST", "/command", "/command", 200, json={"command": "mkfifo /tmp/fifo"}))
r = ex("GET", "/files/download", "/files/download", 400, params={"path": "/tmp/fifo"})
assert "not a regular file" in r.json()["message"], r.text
ex("GET", "/files/download", "/files/download", 400, params={"path": "/dev/zero"})
assert ex("GET", "/files/info", "/files/info", 200, params={"path": "/tmp/fifo"}).json()["/tmp/fifo"]["type"] == "other"
ex("POST", "/command", "/command", 400, json={"command": "x" * (300 << 10)})
# A background command's timeout ends it.
bg = sse(ex("POST", "/command", "/command", 200, json={"command": "sleep 300", "background": True, "timeout": 300}))[0]["text"]
deadline = time.time() + 15
while ex("GET", "/command/status/{id}", f"/command/status/{bg}", 200).json()["running"]:
    assert time.time() < deadline, "the background timeout did not end the command"
    time.sleep(0.2)
# A service in the sandbox, reached through its endpoint (relayed over the agent channel).
sse(ex("POST", "/command", "/command", 200, json={"command": "mkdir -p /srv/www/d && echo served > /srv/www/d/page.html && head -c 3000000 /dev/urandom > /srv/www/blob && busybox httpd -p 127.0.0.1:8000 -h /srv/www"}))
blob = sse(ex("POST", "/command", "/command", 200, json={"command": "sha256sum < /srv/www/blob"}))[1]["text"].split()[0]
page = httpx.get("http://" + other["endpoint"] + "/d/page.html", headers=other["headers"])
assert page.status_code == 200 and page.text == "served\n", (page.status_code, page.text)
# use_server_proxy=true: the reference's /proxy/ path (get_sandbox_endpoint,
# server/opensandbox_server/api/lifecycle.py at 4db3a99) reaches the same service.
sp = life("GET", "/sandboxes/{sandboxId}/endpoints/{port}", f"/sandboxes/{sid}/endpoints/8000", 200, params={"use_server_proxy": "true"}).json()
assert sp["endpoint"].endswith(f"/sandboxes/{sid}/proxy/8000"), sp
assert httpx.get("http://" + sp["endpoint"] + "/d/page.html", headers=sp["headers"]).text == "served\n"
r = life("GET", "/sandboxes/{sandboxId}/endpoints/{port}", f"/sandboxes/{sid}/endpoints/8000", 400, params={"use_server_proxy": "true", "expires": "1999999999"})
assert "use_server_proxy" in r.json()["message"], r.text
import hashlib
assert hashlib.sha256(httpx.get("http://" + other["endpoint"] + "/blob", headers=other["headers"]).content).hexdigest() == blob
assert httpx.get("http://" + other["endpoint"] + "/d/page.html").status_code == 401
assert httpx.get("http://" + other["endpoint"] + "/missing", headers=other["headers"]).status_code == 404
m = ex("GET", "/metrics", "/metrics", 200).json()
assert m["cpu_count"] >= 1 and m["mem_total_mib"] > 100
# Code contexts, in the reference execd's shapes
# (components/execd/pkg/web/controller/codeinterpreting.go and
# pkg/runtime/jupyter.go, dispatchExecutionResultHooks, at 4db3a99); Python
# ones are driven by the code-interpreter SDK in code.py (this image has no
# python3, which is the first bad input).
r = ex("POST", "/code/context", "/code/context", 400, json={"language": "python"})
assert "no python3" in r.json()["message"] and '"python"' in r.json()["message"], r.text
# java, go and typescript need their interpreters: the 400 names the one
# missing and the built-in image that has them all.
for language, needs in [("java", "java"), ("go", "go"), ("typescript", "node")]:
    r = ex("POST", "/code/context", "/code/context", 400, json={"language": language})
    message = r.json()["message"]
    assert f"no {needs};" in message and '"code-interpreter"' in message, r.text
r = ex("POST", "/code/context", "/code/context", 400, json={"language": "cobol"})
assert "cobol" in r.json()["message"], r.text
ctx = ex("POST", "/code/context", "/code/context", 200, json={"language": "bash"}).json()
assert ctx["language"] == "bash" and len(ctx["id"]) == 32, ctx
code = lambda body: sse(ex("POST", "/code", "/code", 200, json=body))
events = code({"context": ctx, "code": "Y=7; cd /etc; echo $Y"})
assert [e["type"] for e in events] == ["init", "stdout", "execution_complete"], events
assert events[0]["text"] == ctx["id"] and events[1]["text"] == "7\n", events
events = code({"context": ctx, "code": "echo $Y $(pwd); false"})
assert events[1]["text"] == "7 /etc\n" and events[-1]["type"] == "error" and events[-1]["error"]["evalue"] == "1", events
default = code({"context": {"language": "bash"}, "code": "echo default"})
assert default[0]["text"] != ctx["id"] and default[-1]["type"] == "execution_complete", default
assert code({"context": {"language": "bash"}, "code": "true"})[0]["text"] == default[0]["text"]
listed = ex("GET", "/code/contexts", "/code/contexts", 200, params={"language": "bash"}).json()
assert sorted(c["id"] for c in listed) == sorted([ctx["id"], default[0]["text"]]), listed
assert ex("GET", "/code/contexts", "/code/contexts", 200, params={"language": "java"}).json() == []
assert ex("GET", "/code/contexts/{context_id}", f"/code/contexts/{ctx['id']}", 200).json() == ctx
r = ex("POST", "/code", "/code", 400, json={"context": {"id": "f" * 32, "language": "bash"}, "code": "true"})
assert r.json()["code"] == "CONTEXT_NOT_FOUND", r.text
r = ex("POST", "/code", "/code", 400, json={"context": {"id": ctx["id"], "language": "python"}, "code": "1"})
assert "runs bash" in r.json()["message"], r.text
assert ex("POST", "/code", "/code", 400, json={"context": ctx}).json()["code"] == "INVALID_REQUEST_BODY"
assert ex("DELETE", "/code", "/code", 400).json()["code"] == "MISSING_QUERY"
ex("DELETE", "/code", "/code", 200, params={"id": ctx["id"]})
assert ex("DELETE", "/code/contexts", "/code/contexts", 400).json()["code"] == "MISSING_QUERY"
ex("DELETE", "/code/contexts/{context_id}", f"/code/contexts/{ctx['id']}", 200)
r = ex("DELETE", "/code/contexts/{context_id}", f"/code/contexts/{ctx['id']}", 404)
assert r.json()["code"] == "CONTEXT_NOT_FOUND", r.text
ex("GET", "/code/contexts/{context_id}", f"/code/contexts/{ctx['id']}", 404)
ex("DELETE", "/code/contexts", "/code/contexts", 200, params={"language": "bash"})
assert ex("GET", "/code/contexts", "/code/contexts", 200, params={"language": "bash"}).json() == []

# Bash sessions keep shell state between runs.
session = ex("POST", "/session", "/session", 200, json={"cwd": "/tmp"}).json()["session_id"]
run = lambda cmd, **kw: sse(ex("POST", "/session/{sessionId}/run", f"/session/{session}/run", 200, json={"command": cmd, **kw}))
events = run("pwd; X=42; cd /etc; f() { echo in-f; }")
assert [e["type"] for e in events] == ["init", "stdout", "execution_complete"] and events[1]["text"] == "/tmp", events
events = run("echo $X $(pwd); f; echo oops >&2; false")
assert [e.get("text") for e in events if e["type"] == "stdout"] == ["42 /etc", "in-f"], events
assert any(e["type"] == "stderr" and e["text"] == "oops" for e in events), events
assert events[-1]["type"] == "error" and events[-1]["error"]["evalue"] == "1", events
events = run("echo -n no-newline")
assert [e["text"] for e in events if e["type"] == "stdout"] == ["no-newline"], events
events = run("if then fi")  # a syntax error does not wedge the shell
assert events[-1]["type"] == "error" and events[-1]["error"]["evalue"] == "2", events
assert [e["text"] for e in run("echo still-here") if e["type"] == "stdout"] == ["still-here"]
# A timeout ends the answer at once and interrupts the command line; the
# shell lives on, and the next run sees none of the old output.
started = time.time()
events = run("sleep 30; echo not-reached", timeout=1000)
assert time.time() - started < 15 and events[-1]["type"] == "error", events
assert "timeout" in events[-1]["error"]["traceback"][0], events
for attempt in range(10):
    events = run("echo $X after-timeout")
    if events[-1]["type"] == "execution_complete":
        break
    time.sleep(0.5)  # still draining the interrupted run
assert [e["text"] for e in events if e["type"] == "stdout"] == ["42 after-timeout"], events
ex("DELETE", "/session/{sessionId}", f"/session/{session}", 200)
ex("DELETE", "/session/{sessionId}", f"/session/{session}", 404)
r = ex("POST", "/session/{sessionId}/run", f"/session/{session}/run", 400, json={"command": "true"})
assert r.json()["code"] == "SESSION_NOT_FOUND", r.text

# --- snapshots (the filesystem, as the reference's docker commit) -------------
r = life("POST", "/sandboxes/{sandboxId}/snapshots", f"/sandboxes/{sid}/snapshots", 202, json={"name": "contract"})
snap = r.json()["id"]
assert r.json()["status"]["state"] == "Creating" and r.headers["location"] == f"/v1/snapshots/{snap}", r.text
life("POST", "/sandboxes/{sandboxId}/snapshots", f"/sandboxes/{sid}/snapshots", 400, json={"bogus": 1})
deadline = time.time() + 300
while life("GET", "/snapshots/{snapshotId}", f"/snapshots/{snap}", 200).json()["status"]["state"] == "Creating":
    assert time.time() < deadline
    time.sleep(0.2)
assert life("GET", "/snapshots/{snapshotId}", f"/snapshots/{snap}", 200).json()["status"]["state"] == "Ready"
listed = life("GET", "/snapshots", f"/snapshots?sandboxId={sid}&pageSize=5", 200).json()
assert [i["id"] for i in listed["items"]] == [snap], listed
life("GET", "/snapshots/{snapshotId}", "/snapshots/nosuch", 404)
life("POST", "/sandboxes", "/sandboxes", 400, json={"image": {"uri": "default"}, "snapshotId": snap, "entrypoint": ["true"]})

# --- pause, resume, delete ----------------------------------------------------
life("POST", "/sandboxes/{sandboxId}/pause", f"/sandboxes/{sid}/pause", 202)
life("POST", "/sandboxes/{sandboxId}/pause", f"/sandboxes/{sid}/pause", 409)
deadline = time.time() + 120
while life("GET", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 200).json()["status"]["state"] != "Paused":
    assert time.time() < deadline
    time.sleep(0.1)
assert httpx.get(E + "/ping", headers=T).status_code == 409
life("POST", "/sandboxes/{sandboxId}/resume", f"/sandboxes/{sid}/resume", 202)
deadline = time.time() + 120
while life("GET", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 200).json()["status"]["state"] != "Running":
    assert time.time() < deadline
    time.sleep(0.1)
life("DELETE", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 204)
# Gone from the API at once, as the reference's removed container is
# (DockerSandboxService.delete_sandbox, then _get_container_by_sandbox_id:
# 404 SANDBOX_NOT_FOUND, server/opensandbox_server/services/docker/
# docker_service.py at 4db3a99): GET, a second DELETE, the list.
life("DELETE", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 404)
life("GET", "/sandboxes/{sandboxId}", f"/sandboxes/{sid}", 404)
assert sid not in [s["id"] for s in life("GET", "/sandboxes", "/sandboxes", 200).json()["items"]]
assert httpx.get(E + "/ping", headers=T).status_code == 404
life("POST", "/sandboxes/{sandboxId}/snapshots", f"/sandboxes/{sid}/snapshots", 404, json={})
# The snapshot outlives its sandbox until deleted.
assert life("GET", "/snapshots/{snapshotId}", f"/snapshots/{snap}", 200).json()["status"]["state"] == "Ready"
life("DELETE", "/snapshots/{snapshotId}", f"/snapshots/{snap}", 204)
life("DELETE", "/snapshots/{snapshotId}", f"/snapshots/{snap}", 404)
print(f"contract OK: {len(checked)} responses checked against the spec")
