"""The published OpenSandbox Python SDK, unchanged, against `pvisor serve`.

create -> commands.run("echo hello") -> write a file, read it back -> renew
-> pause -> resume (a file and a background process survive) -> kill.
Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY python flow.py
Prints one JSON line of timings at the end (used by the benchmark).
"""
import json
import os
import sys
import time
from datetime import timedelta

from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import RunCommandOpts

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
cfg = ConnectionConfigSync(
    domain=os.environ["PVISOR_URL"],
    protocol="http",
    api_key=os.environ.get("PVISOR_KEY"),
    request_timeout=timedelta(seconds=120),
)
times = {}


def timed(name, fn):
    start = time.monotonic()
    out = fn()
    times[name] = round((time.monotonic() - start) * 1000, 1)
    return out


# An unknown image is a clear 4xx, not a hang.
try:
    SandboxSync.create("no-such-image:1", connection_config=cfg, ready_timeout=timedelta(seconds=10))
    sys.exit("an unknown image was accepted")
except SandboxApiException as e:
    assert e.status_code == 400 and "pvisor image import" in str(e), e

sb = timed("create_ms", lambda: SandboxSync.create(
    "default", connection_config=cfg, timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=120)))
try:
    ex = timed("echo_ms", lambda: sb.commands.run("echo hello"))
    assert ex.exit_code == 0 and ex.text == "hello", (ex.exit_code, ex.text, ex.error)
    timed("true_ms", lambda: sb.commands.run("true"))
    fail = sb.commands.run("echo oops >&2; exit 7")
    assert fail.exit_code == 7 and fail.logs.stderr[0].text == "oops", (fail.exit_code, fail.logs)

    session = sb.commands.create_session()
    sb.commands.run_in_session(session, "cd /tmp; GREETING=hi")
    ex = sb.commands.run_in_session(session, "echo $GREETING from $(pwd)")
    assert ex.text == "hi from /tmp", (ex.text, ex.error)
    sb.commands.delete_session(session)

    sb.files.write_file("/root/notes.txt", "kept across pause\n")
    assert sb.files.read_file("/root/notes.txt") == "kept across pause\n"

    bg = sb.commands.run(
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; echo tick $i; sleep 0.2; done",
        opts=RunCommandOpts(background=True))
    assert bg.id, "no command id"
    time.sleep(1.5)
    assert sb.commands.get_command_status(bg.id).running

    renewed = sb.renew(timedelta(minutes=30))
    assert renewed.expires_at.timestamp() > time.time() + 25 * 60, renewed

    def pause_until_paused():
        # pause() returns at 202; the state reaches Paused once the VM is saved.
        sb.pause()
        deadline = time.time() + 120
        while sb.get_info().status.state != "Paused":
            assert time.time() < deadline, sb.get_info().status
            time.sleep(0.05)

    timed("pause_ms", pause_until_paused)
    sb2 = timed("resume_ms", lambda: SandboxSync.resume(sb.id, connection_config=cfg, resume_timeout=timedelta(seconds=120)))
    sb.close()
    sb = sb2
    assert sb.files.read_file("/root/notes.txt") == "kept across pause\n"
    first = int(sb.files.read_file("/tmp/counter"))
    time.sleep(1.0)
    second = int(sb.files.read_file("/tmp/counter"))
    assert second > first, (first, second)  # the background loop kept counting after resume
    status = sb.commands.get_command_status(bg.id)
    assert status.running, status
    logs = sb.commands.get_background_command_logs(bg.id)
    assert "tick 1\n" in logs.content, logs
finally:
    sb.kill()
    sb.close()
print(json.dumps(times))
print("SDK flow OK")
