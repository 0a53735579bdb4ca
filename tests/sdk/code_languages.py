"""The published OpenSandbox code-interpreter SDK, unchanged, against
`pvisor serve`: java, go and typescript contexts in a sandbox of the
built-in `code-interpreter` image, started with that image's entrypoint and
created with the SDK's strict health check (no skip_health_check).

The cells and assertions are the reference's own e2e suite's
(OpenSandbox tests/python/tests/test_code_interpreter_e2e_sync.py at
4db3a99: test_02_java_code_execution, test_04_go_code_execution,
test_05_typescript_code_execution), plus interrupts and state that carries.
Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY python code_languages.py
"""
import os
import threading
import time
from datetime import timedelta

from code_interpreter import CodeInterpreterSync
from code_interpreter.models.code import SupportedLanguage
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
cfg = ConnectionConfigSync(
    domain=os.environ["PVISOR_URL"],
    protocol="http",
    api_key=os.environ.get("PVISOR_KEY"),
    request_timeout=timedelta(seconds=600),
)


def out(r):
    return "".join(m.text for m in r.logs.stdout)


def interrupted(codes, context, cell):
    """Runs `cell` (which never ends on its own), interrupting it after 5 s."""
    thread = threading.Thread(target=lambda: (time.sleep(5), codes.interrupt(context.id)), daemon=True)
    thread.start()
    started = time.monotonic()
    r = codes.run(cell, context=context)
    thread.join()
    assert time.monotonic() - started < 120, "the interrupt did not end the cell"
    return r


sb = SandboxSync.create(
    "code-interpreter",
    entrypoint=["/opt/code-interpreter/code-interpreter.sh"],
    connection_config=cfg,
    resource={"cpu": "1", "memory": "2Gi"},
    timeout=timedelta(minutes=20),
    ready_timeout=timedelta(seconds=180),
)
try:
    # The strict health check: it probes the interpreter runtime's port.
    ci = CodeInterpreterSync.create(sb, ready_timeout=timedelta(seconds=120))
    codes = ci.codes

    # Java (test_02): the value of a final expression, output, state, and an
    # exception named as IJava names it.
    java = codes.create_context(SupportedLanguage.JAVA)
    assert java.id and java.language == "java", java
    r = codes.run(
        'System.out.println("Hello from Java!");\nint result = 2 + 2;\n'
        'System.out.println("2 + 2 = " + result);\nresult',
        context=java,
    )
    assert r.error is None and r.result[0].text == "4" and r.exit_code is None, r
    assert "Hello from Java!" in out(r) and "2+2=4" in out(r).replace(" ", ""), r
    assert r.complete is not None and all(m.is_error is False for m in r.logs.stdout), r
    r = codes.run(
        "import java.util.*;\nList<Integer> numbers = Arrays.asList(1, 2, 3, 4, 5);\n"
        "int sum = numbers.stream().mapToInt(Integer::intValue).sum();\n"
        'System.out.println("Sum: " + sum);\nresult',
        context=java,
    )
    assert r.result[0].text == "4" and "Sum: 15" in out(r) and r.complete is not None, r
    r = codes.run("int x = 10 / 0; // This will cause ArithmeticException", context=java)
    assert r.error is not None and r.error.name == "EvalException" and r.exit_code is None, r
    assert "ArithmeticException" in r.error.value and r.complete is None, r.error
    r = codes.run("int y = ;", context=java)
    assert r.error is not None and r.error.name == "CompilationException", r
    # A cell that reads stdin reads end-of-file, not the next request.
    assert codes.run("int n = System.in.read();\nn", context=java).result[0].text == "-1"
    r = interrupted(codes, java, "while (true) { Thread.onSpinWait(); }")
    assert r.error is not None, r
    assert codes.run("sum * 2", context=java).result[0].text == "30"

    # Go (test_04): each cell a whole program; a compile error is an error
    # (or stderr), and the context goes on.
    go = codes.create_context(SupportedLanguage.GO)
    assert go.id and go.language == "go", go
    r = codes.run(
        'package main\nimport "fmt"\nfunc main() {\n    fmt.Print("Hello from Go!")\n'
        '    result := 2 + 2\n    fmt.Print("2 + 2 =", result)\n}',
        context=go,
    )
    assert r.error is None and r.complete is not None and "Hello from Go!" in out(r), r
    r = codes.run(
        'package main\nfunc main() {\n    undeclaredVariable++  // This will cause compilation error\n}',
        context=go,
    )
    assert r.error is not None and r.error.name == "CompilationError", r
    assert "undeclaredVariable" in "".join(m.text for m in r.logs.stderr), r
    r = codes.run('package main\nimport "os"\nfunc main() { os.Exit(3) }', context=go)
    assert r.error is not None and r.error.value == "exit status 3", r
    r = interrupted(codes, go, "package main\nfunc main() { for {} }")
    assert r.error is not None, r
    r = codes.run('package main\nimport "fmt"\nfunc main() { fmt.Println(6 * 7) }', context=go)
    assert out(r).strip() == "42" and r.error is None, r

    # TypeScript (test_05): types erased, console output, a thrown error;
    # declarations carry to later cells.
    ts = codes.create_context(SupportedLanguage.TYPESCRIPT)
    assert ts.id and ts.language == "typescript", ts
    r = codes.run(
        "console.log('Hello from TypeScript!');\nconst result: number = 2 + 2;\n"
        "console.log(`2 + 2 = ${result}`);",
        context=ts,
    )
    assert r.error is None and r.complete is not None and "Hello from TypeScript!" in out(r), r
    r = codes.run(
        "interface Person {\n  name: string;\n  age: number;\n}\n"
        "const person: Person = { name: 'John', age: 30 };\n"
        "const numbers: number[] = [1, 2, 3, 4, 5];\n"
        "const sum: number = numbers.reduce((a, b) => a + b, 0);\n"
        "console.log(`Person: ${person.name}, Age: ${person.age}`);\nsum * result",
        context=ts,
    )
    assert "Person: John, Age: 30" in out(r) and r.result[0].text == "60", r
    r = codes.run("throw new Error('ts-runtime-error');", context=ts)
    assert r.error is not None and r.error.name == "Error" and r.error.value == "ts-runtime-error", r
    r = interrupted(codes, ts, "while (true) {}")
    assert r.error is not None and "interrupted" in r.error.value, r
    r = interrupted(codes, ts, "new Promise(() => {})")
    assert r.error is not None and "interrupted" in r.error.value, r
    # An error a timer throws after its cell ended does not end the context.
    assert codes.run("setTimeout(() => { throw new Error('later'); }, 10); 1", context=ts).error is None
    time.sleep(1)
    assert codes.run("person.age + 1", context=ts).result[0].text == "31"

    listed = {c.language for c in codes.list_contexts(SupportedLanguage.JAVA)}
    assert listed == {"java"}, listed
    print("code interpreter languages OK")
finally:
    sb.kill()
