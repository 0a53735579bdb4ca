"""The published OpenSandbox code-interpreter SDK, unchanged, against
`pvisor serve`: Python and bash contexts in a sandbox of the built-in
`python` image.

The assertions follow the reference's own e2e suite
(OpenSandbox tests/python/tests/test_code_interpreter_e2e_sync.py,
test_03_python_code_execution, at 4db3a99): an ephemeral run by language,
a context whose variables persist, a NameError as the terminal error event.
The SDK's strict health check probes a Jupyter port inside the sandbox;
pvisor runs no Jupyter (docs/serve.md), so the check is skipped.
Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY python code.py
"""
import os
import threading
import time
from datetime import timedelta

from code_interpreter import CodeInterpreterSync
from code_interpreter.models.code import SupportedLanguage
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
cfg = ConnectionConfigSync(
    domain=os.environ["PVISOR_URL"],
    protocol="http",
    api_key=os.environ.get("PVISOR_KEY"),
    request_timeout=timedelta(seconds=120),
)

def interrupt_later(codes, context, times=1):
    """Interrupts `context` `times` times, 3 s from now (while a run is under way).

    Returns the thread: join it before the next run, or an interrupt still on
    its way (the second of two, on a loaded machine) lands on that run, as it
    would in Jupyter.
    """

    def later():
        time.sleep(3)
        for _ in range(times):
            codes.interrupt(context.id)

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


sb = SandboxSync.create("python", connection_config=cfg, timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=180))
try:
    ci = CodeInterpreterSync.create(sb, skip_health_check=True)
    codes = ci.codes

    # An ephemeral run by language: the value of the last expression.
    r = codes.run("result = 2 + 2\nresult", language=SupportedLanguage.PYTHON)
    assert r.id and r.error is None and r.result[0].text == "4", r

    # A context keeps its globals; output streams; the count goes up.
    ctx = codes.create_context(SupportedLanguage.PYTHON)
    assert ctx.id and ctx.language == "python", ctx
    r = codes.run("print('Hello from Python!')\nx = 42\nprint(f'x = {x}')", context=ctx)
    out = "".join(m.text for m in r.logs.stdout)
    assert "Hello from Python!" in out and "x = 42" in out and r.error is None, r
    assert r.complete is not None and r.id == ctx.id, r
    r = codes.run("import sys\nprint('to stderr', file=sys.stderr)\nx + 1", context=ctx)
    assert r.result[0].text == "43" and "to stderr" in "".join(m.text for m in r.logs.stderr), r
    assert r.execution_count == 2, r

    # An exception is the terminal error event, with name, value, traceback.
    r = codes.run("print(undefined_variable)", context=ctx)
    assert r.error is not None and r.error.name == "NameError", r
    assert "undefined_variable" in r.error.value and r.complete is None, r
    assert any("NameError" in line for line in r.error.traceback), r.error

    # An interrupt the moment a context exists ends nothing (the driver is
    # ready before the context is returned; an idle interrupt is dropped).
    early = codes.create_context(SupportedLanguage.PYTHON)
    codes.interrupt(early.id)
    assert codes.run("1 + 1", context=early).result[0].text == "2"
    codes.delete_context(early.id)

    # Two contexts never share state.
    other = codes.create_context(SupportedLanguage.PYTHON)
    r = codes.run("print('x' in globals())", context=other)
    assert "".join(m.text for m in r.logs.stdout).strip() == "False", r

    # Interrupt: a long cell ends with KeyboardInterrupt; the context lives.
    interrupt_later(codes, ctx)
    started = time.monotonic()
    r = codes.run("import time\nfor _ in range(600): time.sleep(0.1)", context=ctx)
    assert r.error is not None and r.error.name == "KeyboardInterrupt", r
    assert time.monotonic() - started < 50, "the interrupt did not end the cell"
    r = codes.run("x", context=ctx)
    assert r.result[0].text == "42", r

    # input() in a cell reads nothing (it cannot eat the context's requests).
    r = codes.run("input()", context=ctx)
    assert r.error is not None and r.error.name == "EOFError", r
    assert codes.run("x * 2", context=ctx).result[0].text == "84"

    # Two interrupts in quick succession end the cell, never the driver.
    interrupts = interrupt_later(codes, ctx, times=2)
    r = codes.run("import time\nfor _ in range(600): time.sleep(0.1)", context=ctx)
    assert r.error is not None and r.error.name == "KeyboardInterrupt", r
    interrupts.join()
    r = codes.run("x + 2", context=ctx)
    assert r.result and r.result[0].text == "44", r

    # Output without newlines streams through whole; a cell that sends its
    # stdout elsewhere still ends with its value.
    r = codes.run("import sys\nsys.stderr.write('e' * 3000000)\nsys.stdout.write('o' * 3000000)\n0", context=ctx)
    assert sum(len(m.text) for m in r.logs.stderr) == 3000000, len(r.logs.stderr)
    assert sum(len(m.text) for m in r.logs.stdout) == 3000000 and r.result[0].text == "0"
    quiet = codes.create_context(SupportedLanguage.PYTHON)
    r = codes.run("import os\nos.dup2(os.open(os.devnull, os.O_WRONLY), 1)\nos.dup2(1, 2)\nprint('gone')\n7", context=quiet)
    assert r.result[0].text == "7" and r.error is None, r
    assert codes.run("8", context=quiet).result[0].text == "8"
    codes.delete_context(quiet.id)

    # An answer over the end marker's 4 MiB (a value whose escaping makes it
    # larger) ends its run with an error; the run is not left hanging, and
    # the context goes on.
    # The next run, sent the moment an error ends the answer, finds the
    # context free (a few times: the window is narrow).
    for _ in range(4):
        r = codes.run("'\\u00e9' * 1100000", context=ctx)
        assert r.error is not None and "over 4 MiB" in r.error.value, r
        r = codes.run("x + 3", context=ctx)
        assert r.result and r.result[0].text == "45", r

    # A cell that kills its interpreter: an error, then the context is gone.
    r = codes.run("import os\nos._exit(3)", context=ctx)
    assert r.error is not None, r
    try:
        codes.run("1", context=ctx)
        raise SystemExit("a dead context still ran code")
    except SandboxApiException as e:
        assert e.status_code == 400 and "has ended" in str(e) and "exited" in str(e), e

    # bash contexts keep shell state.
    sh = codes.create_context(SupportedLanguage.BASH)
    codes.run("cd /tmp; GREETING=hi", context=sh)
    r = codes.run("echo $GREETING from $(pwd)", context=sh)
    assert "".join(m.text for m in r.logs.stdout).strip() == "hi from /tmp", r

    # An interrupt ends the command, not the shell; a command that reads
    # stdin reads nothing (it cannot swallow the run's end).
    interrupt_later(codes, sh)
    r = codes.run("sleep 100; echo not-reached", context=sh)
    assert r.error is not None and "not-reached" not in "".join(m.text for m in r.logs.stdout), r
    assert "".join(m.text for m in codes.run("echo $GREETING", context=sh).logs.stdout).strip() == "hi"
    r = codes.run('read x; echo "got:$x"; exec >/dev/null; echo hidden', context=sh)
    assert "".join(m.text for m in r.logs.stdout).strip() == "got:" and r.error is None, r

    # Two first runs at once share one default context.
    firsts = []
    runners = [threading.Thread(target=lambda: firsts.append(codes.run("echo $$", language=SupportedLanguage.BASH))) for _ in range(2)]
    for t in runners:
        t.start()
    for t in runners:
        t.join()
    assert len({r.id for r in firsts}) == 1, [r.id for r in firsts]
    # (the later of two runs at once may be refused as busy, as the reference's is)
    shells = {"".join(m.text for m in r.logs.stdout) for r in firsts} - {""}
    assert len(shells) == 1, f"two shells answered: {shells}"

    # Listing and deleting.
    listed = {c.id for c in codes.list_contexts(SupportedLanguage.PYTHON)}
    assert other.id in listed and sh.id not in listed, listed
    assert len(codes.list_contexts(SupportedLanguage.BASH)) == 2  # sh and the default
    codes.delete_context(other.id)
    assert other.id not in {c.id for c in codes.list_contexts(SupportedLanguage.PYTHON)}
    codes.delete_contexts(SupportedLanguage.BASH)
    assert codes.list_contexts(SupportedLanguage.BASH) == []
    print("code interpreter OK")
finally:
    sb.kill()
