"""The credential vault, driven by the published OpenSandbox Python SDK.

Follows the reference's own e2e test (tests/python/tests/test_credential_vault_e2e.py
in the OpenSandbox repository): a sandbox created with a networkPolicy that
allows TARGET_HOST and credentialProxy.enabled; a vault with one binding per
auth type (bearer, basic, apiKey, customHeaders); `curl` inside the sandbox
reaches an echo server on the host that answers 401 unless the injected
headers are right; then the runtime mutations (add, replace, delete) with
their revisions. Beyond it: the sandbox never sees a value (the command
line, its output, a response header echoing the value), a request no
binding matches leaves untouched, and bad requests are refused as the
reference refuses them.

Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY TARGET_HOST=name TARGET_IP=addr python vault.py
TARGET_HOST must resolve to TARGET_IP on the daemon's host (pvisor's proxy
resolves names there; `curl --resolve` inside the sandbox does not steer it).
The echo server listens on TARGET_IP:80, and with TLS_CERT/TLS_KEY on :443.
"""
import json
import os
import ssl
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.models.sandboxes import (
    Credential,
    CredentialBinding,
    CredentialProxyConfig,
    NetworkPolicy,
    NetworkRule,
    SandboxImageSpec,
)

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
TARGET_HOST = os.environ["TARGET_HOST"]
TARGET_IP = os.environ["TARGET_IP"]
TLS = bool(os.environ.get("TLS_CERT"))
cfg = ConnectionConfigSync(
    domain=os.environ["PVISOR_URL"],
    protocol="http",
    api_key=os.environ.get("PVISOR_KEY"),
    request_timeout=timedelta(seconds=120),
)

SECRETS = {
    "bearer-token": "vault-bearer-token-1f3a",
    "basic-token": "dXNlcjpwYXNzLTdjOWU=",
    "api-key-token": "vault-api-key-token-55d0",
    "client-id": "vault-client-id-a871",
    "client-secret": "vault-client-secret-0b62",
    "runtime-token": "vault-runtime-token-9e14",
    "runtime-token-replaced": "vault-runtime-token-replaced-c3d7",
}
EXPECTED = {
    "/bearer": {"authorization": "Bearer " + SECRETS["bearer-token"]},
    "/basic": {"authorization": "Basic " + SECRETS["basic-token"]},
    "/api-key": {"x-api-key": SECRETS["api-key-token"]},
    "/custom-headers": {"x-client-id": SECRETS["client-id"], "x-client-secret": SECRETS["client-secret"]},
    "/runtime-added": {"x-runtime-token": SECRETS["runtime-token"]},
    "/runtime-replaced": {"x-runtime-token": SECRETS["runtime-token-replaced"]},
    "/echo": {"authorization": "Bearer " + SECRETS["bearer-token"]},
    "/unbound": {},
}
seen = []


class Echo(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the http.server API)
        path = self.path.split("?")[0]
        received = {k.lower(): v for k, v in self.headers.items()}
        seen.append((path, received))
        expected = EXPECTED.get(path, {})
        bad = sorted(name for name, value in expected.items() if received.get(name) != value)
        body = json.dumps({"ok": not bad, "case": path.lstrip("/"), "missingOrInvalid": bad,
                           "scheme": "https" if TLS and self.server.server_port == 443 else "http"}).encode()
        self.send_response(401 if bad else 200)
        # A server that echoes what it got (a debugging endpoint): the
        # sandbox must see it redacted.
        if path == "/echo":
            self.send_header("x-echo-authorization", received.get("authorization", ""))
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def serve(port, tls):
    server = ThreadingHTTPServer((TARGET_IP, port), Echo)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.environ["TLS_CERT"], os.environ["TLS_KEY"])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


serve(80, False)
if TLS:
    serve(443, True)


def binding(name, path, auth, scheme="http"):
    port = 80 if scheme == "http" else 443
    return CredentialBinding(
        name=name,
        match={"schemes": [scheme], "ports": [port], "hosts": [TARGET_HOST], "methods": ["GET"], "paths": [path]},
        auth=auth,
    )


def create_sandbox(credential_proxy=True):
    return SandboxSync.create(
        image=SandboxImageSpec("python"),
        connection_config=cfg,
        timeout=timedelta(minutes=10),
        ready_timeout=timedelta(seconds=180),
        # TARGET_IP too: pvisor refuses an internal address unless a rule names it.
        network_policy=NetworkPolicy(
            defaultAction="deny",
            egress=[NetworkRule(action="allow", target=TARGET_HOST), NetworkRule(action="allow", target=TARGET_IP)],
        ),
        credential_proxy=CredentialProxyConfig(enabled=True) if credential_proxy else None,
    )


def curl(sandbox, path, scheme="http", headers=""):
    command = (f"curl --silent --show-error --connect-timeout 5 --max-time 20 {headers} "
               f"--resolve {TARGET_HOST}:80:{TARGET_IP} {scheme}://{TARGET_HOST}{path}")
    for secret in SECRETS.values():
        assert secret not in command
    result = sandbox.commands.run(command)
    assert result.error is None, result.error
    out = "".join(part.text for part in result.logs.stdout)
    err = "".join(part.text for part in result.logs.stderr)
    for secret in SECRETS.values():
        assert secret not in out + err, f"the sandbox saw a value: {out}{err}"
    return out, err


def curl_json(sandbox, path, scheme="http"):
    out, err = curl(sandbox, path, scheme)
    assert out, f"no answer from {path}: {err}"
    return json.loads(out)


def refused(fn, status, says):
    try:
        fn()
    except Exception as e:  # the SDK's exception types vary by route
        # The SDK's exception names the status; the body's message is ours.
        text = f"{e} {getattr(e, '__cause__', '')}"
        assert str(status) in text, f"expected {status} ({says}), got {text}"
        return
    sys.exit(f"expected {status} ({says}), but it was accepted")


def all_auth_types():
    sandbox = create_sandbox()
    try:
        state = sandbox.credential_vault.create(
            credentials=[Credential(name=n, source={"value": v}) for n, v in SECRETS.items()],
            bindings=[
                binding("bearer", "/bearer", {"type": "bearer", "credential": "bearer-token"}),
                binding("basic", "/basic", {"type": "basic", "credential": "basic-token"}),
                binding("api-key", "/api-key", {"type": "apiKey", "name": "X-Api-Key", "credential": "api-key-token"}),
                binding("custom-headers", "/custom-headers", {"type": "customHeaders", "headers": [
                    {"name": "X-Client-Id", "credential": "client-id"},
                    {"name": "X-Client-Secret", "credential": "client-secret"}]}),
                binding("echo", "/echo", {"type": "bearer", "credential": "bearer-token"}),
                binding("prefix", "/open/*", {"type": "bearer", "credential": "bearer-token"}),
            ],
        )
        payload = state.model_dump_json(by_alias=True)
        assert state.revision == 1 and all(s not in payload for s in SECRETS.values()), payload
        assert {b.auth.type for b in state.bindings} == {"bearer", "basic", "apiKey", "customHeaders"}
        for path in ["/bearer", "/basic", "/api-key", "/custom-headers"]:
            got = curl_json(sandbox, path)
            assert got == {"ok": True, "case": path[1:], "missingOrInvalid": [], "scheme": "http"}, got
        # The sandbox's own Authorization is replaced, not sent alongside.
        out, _ = curl(sandbox, "/bearer", headers="-H 'Authorization: Bearer sandbox-guess'")
        assert json.loads(out)["ok"], out
        # A response header echoing the value reaches the sandbox redacted.
        out, _ = curl(sandbox, "/echo", headers="--include")
        assert "x-echo-authorization: [redacted]" in out.lower(), out
        # A request without Host (HTTP/1.0) reaches the server naming the
        # destination, so no front end routes it, credential and all, elsewhere.
        seen.clear()
        out, _ = curl(sandbox, "/bearer", headers="--http1.0 -H 'Host:'")
        assert json.loads(out)["ok"] and seen[-1][1].get("host") == TARGET_HOST, (out, seen)
        # A Host naming another host through userinfo is refused before any connection.
        seen.clear()
        out, _ = curl(sandbox, "/bearer", headers=f"-H 'Host: evil.example.com@{TARGET_HOST}'")
        assert "refused" in out and not seen, (out, seen)
        # A path that climbs out of a binding's prefix gets no credential.
        curl(sandbox, "/open/x")
        assert seen[-1][1].get("authorization") == "Bearer " + SECRETS["bearer-token"], seen
        for escape in ["/open/../admin", "/open/..%2Fadmin", "/open/%2e%2e/admin"]:
            curl(sandbox, escape, headers="--path-as-is")
            assert seen[-1][0] == escape.split("?")[0] and "authorization" not in seen[-1][1], seen
        # A request no binding matches leaves without credentials.
        seen.clear()
        assert curl_json(sandbox, "/unbound")["ok"]
        assert "authorization" not in seen[-1][1], seen
        if TLS:
            https(sandbox)
        revision = sandbox.credential_vault.get().revision
        # Bad requests: a second create, a stale revision, an uncovered host.
        refused(lambda: sandbox.credential_vault.create(credentials=[], bindings=[]), 409, "already exists")
        refused(lambda: sandbox.credential_vault.patch(expected_revision=7, bindings={"delete": ["echo"]}),
                409, "expectedRevision")
        refused(lambda: sandbox.credential_vault.patch(bindings={"add": [CredentialBinding(
            name="elsewhere", match={"hosts": ["api.example.com"]},
            auth={"type": "bearer", "credential": "bearer-token"})]}), 400, "not covered")
        assert sandbox.credential_vault.get().revision == revision, "a refused patch changed nothing"
    finally:
        sandbox.kill()


def https(sandbox):
    """HTTPS: the proxy terminates TLS with the sandbox's vault CA, which
    the sandbox's commands trust (SSL_CERT_FILE and friends)."""
    state = sandbox.credential_vault.patch(bindings={"add": [
        binding("tls-bearer", "/bearer", {"type": "bearer", "credential": "bearer-token"}, scheme="https")]})
    assert state.revision == 2, state
    got = curl_json(sandbox, "/bearer", scheme="https")
    assert got == {"ok": True, "case": "bearer", "missingOrInvalid": [], "scheme": "https"}, got
    # The leaf the sandbox saw chains to the vault's CA alone.
    out, err = curl(sandbox, "/bearer", scheme="https", headers="--cacert /opt/opensandbox/mitmproxy-ca-cert.pem")
    assert json.loads(out)["ok"], out + err
    # Python's ssl and requests trust it through the environment too.
    code = ("import urllib.request,json;"
            f"print(urllib.request.urlopen('https://{TARGET_HOST}/bearer').read().decode())")
    result = sandbox.commands.run(f'python3 -c "{code}"')
    out = "".join(p.text for p in result.logs.stdout)
    assert json.loads(out)["ok"], out + "".join(p.text for p in result.logs.stderr)
    # TLS to a host no binding names is tunnelled untouched: the sandbox sees
    # the server's own certificate (its CA alone verifies it), and no value.
    state = sandbox.credential_vault.patch(bindings={"delete": ["tls-bearer"]})
    assert state.revision == 3, state
    with open(os.environ["UPSTREAM_CA"]) as f:
        sandbox.files.write_file("/tmp/upstream-ca.pem", f.read())
    seen.clear()
    out, err = curl(sandbox, "/bearer", scheme="https", headers="--cacert /tmp/upstream-ca.pem")
    got = json.loads(out)
    assert not got["ok"] and got["scheme"] == "https", got
    assert "authorization" not in seen[-1][1], seen
    print("https OK")


def runtime_mutations():
    sandbox = create_sandbox()
    try:
        state = sandbox.credential_vault.create(credentials=[], bindings=[])
        assert (state.revision, state.credentials, state.bindings) == (1, [], []), state
        state = sandbox.credential_vault.patch(
            expected_revision=1,
            credentials={"add": [{"name": "runtime-token", "source": {"value": SECRETS["runtime-token"]}}]},
            bindings={"add": [binding("runtime-added", "/runtime-added",
                                      {"type": "apiKey", "name": "X-Runtime-Token", "credential": "runtime-token"})]},
        )
        assert state.revision == 2 and [b.name for b in state.bindings] == ["runtime-added"], state
        assert curl_json(sandbox, "/runtime-added")["ok"]
        state = sandbox.credential_vault.patch(expected_revision=2, bindings={"delete": ["runtime-added"]})
        assert state.revision == 3 and state.bindings == [], state
        state = sandbox.credential_vault.patch(
            expected_revision=3,
            credentials={"replace": [{"name": "runtime-token", "source": {"value": SECRETS["runtime-token-replaced"]}}]},
            bindings={"add": [binding("runtime-replaced", "/runtime-replaced",
                                      {"type": "apiKey", "name": "X-Runtime-Token", "credential": "runtime-token"})]},
        )
        assert state.revision == 4, state
        assert curl_json(sandbox, "/runtime-replaced")["ok"]
        got = curl_json(sandbox, "/runtime-added")
        assert got == {"ok": False, "case": "runtime-added", "missingOrInvalid": ["x-runtime-token"],
                       "scheme": "http"}, got
        # The vault survives a pause and resume (the daemon puts it in force again).
        sandbox.pause()
        deadline = time.time() + 120
        while sandbox.get_info().status.state != "Paused":
            assert time.time() < deadline, sandbox.get_info().status
            time.sleep(0.1)
        sandbox = SandboxSync.resume(sandbox.id, connection_config=cfg, resume_timeout=timedelta(seconds=180))
        assert curl_json(sandbox, "/runtime-replaced")["ok"], "the vault was lost in the resume"
        state = sandbox.credential_vault.patch(expected_revision=4, bindings={"delete": ["runtime-replaced"]})
        assert state.revision == 5 and state.bindings == [], state
        state = sandbox.credential_vault.patch(expected_revision=5, credentials={"delete": ["runtime-token"]})
        assert state.revision == 6 and state.credentials == [], state
        sandbox.credential_vault.delete()
        refused(lambda: sandbox.credential_vault.get(), 404, "not found")
    finally:
        sandbox.kill()


def without_credential_proxy():
    sandbox = create_sandbox(credential_proxy=False)
    try:
        refused(lambda: sandbox.credential_vault.create(credentials=[], bindings=[]), 412, "credentialProxy")
    finally:
        sandbox.kill()


all_auth_types()
runtime_mutations()
without_credential_proxy()
# For the caller to look for them where they must not be (records, Traces, logs).
print(json.dumps({"secrets": sorted(SECRETS.values())}))
print("credential vault OK")
