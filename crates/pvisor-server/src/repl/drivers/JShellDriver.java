// pvisor's Java code-context driver, run by the JDK's source launcher
// (`java JShellDriver.java`). It reads one JSON request per line
// ({"nonce", "code"}, as serde_json writes it) from stdin, splits the cell
// into snippets with JShell's own analysis, evaluates them in one JShell
// that runs in this JVM (state carries to later cells), and ends the cell
// with the markers `\x1eNONCE:PAYLOAD\x1e\n` on stdout and `\x1eNONCE\x1e\n`
// on stderr, the payload being {"count", "result", "error"} as ASCII JSON.
// Errors are named as the IJava kernel names them: a snippet that threw is
// an EvalException (its value the exception's class and message), one that
// does not compile a CompilationException. SIGINT stops the running
// snippet (the cell ends with an InterruptedException), never the driver.
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.VarSnippet;

public class JShellDriver {
    /** A cell is being evaluated. */
    static volatile boolean running;
    /**
     * This run was interrupted: the cell stops wherever it is (JShell then
     * reports no error of its own). Set by SIGINT even before the cell
     * starts; cleared once the cell's markers are written.
     */
    static volatile boolean stopped;

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        System.setOut(out);
        System.setErr(err);
        JShell shell = JShell.builder().executionEngine("local").out(out).err(err).build();
        // JShell.stop() reaches only a snippet already executing, and a
        // snippet spends its first moments compiling: it is asked again
        // until the evaluation returns.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> {
            stopped = true;
            Thread stopper = new Thread(() -> {
                while (running && stopped) {
                    shell.stop();
                    try {
                        Thread.sleep(50);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            });
            stopper.setDaemon(true);
            stopper.start();
        });
        // Warm the compiler before saying ready: the first cell is then quick.
        shell.eval("1");
        // The launcher compiled this file already: its private directory goes.
        if (args.length == 1) {
            java.io.File dir = new java.io.File(args[0]);
            new java.io.File(dir, "JShellDriver.java").delete();
            dir.delete();
        }
        // Requests come on the real stdin; a cell's System.in is empty, so a
        // cell that reads it cannot swallow the next request.
        BufferedReader requests = new BufferedReader(
            new InputStreamReader(new FileInputStream(FileDescriptor.in), StandardCharsets.UTF_8));
        System.setIn(new ByteArrayInputStream(new byte[0]));
        out.print("\u001eready\u001e\n");
        out.flush();
        int count = 0;
        String line;
        while ((line = requests.readLine()) != null) {
            String nonce = field(line, "nonce");
            String code = field(line, "code");
            if (nonce == null || code == null) continue;
            count++;
            String[] ended = runCell(shell, code);
            if (ended[0] != null && ended[0].length() > 1048576) {
                ended[0] = ended[0].substring(0, 1048576) + "... (truncated)";
            }
            out.flush();
            err.flush();
            String payload = "{\"count\":" + count + ",\"result\":" + json(ended[0]) + ",\"error\":" + (ended[1] == null ? "null" : ended[1]) + "}";
            out.print("\u001e" + nonce + ":" + payload + "\u001e\n");
            out.flush();
            err.print("\u001e" + nonce + "\u001e\n");
            err.flush();
            // An interrupt that came after the cell ended was for it.
            stopped = false;
        }
        shell.close();
        System.exit(0);
    }

    /** {result, error as JSON}: the last snippet's value when it is an expression. */
    static String[] runCell(JShell shell, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String rest = code;
        String result = null;
        running = true;
        try {
            while (!rest.isBlank()) {
                SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
                String source = info.completeness().isComplete() ? info.source() : rest;
                rest = info.completeness().isComplete() ? info.remaining() : "";
                if (source == null || source.isBlank()) break;
                if (stopped) return interrupted();
                result = null;
                List<SnippetEvent> events = shell.eval(source);
                if (stopped) return interrupted();
                for (SnippetEvent event : events) {
                    if (event.causeSnippet() != null) continue;
                    if (event.exception() != null) {
                        Exception e = event.exception();
                        String name = e instanceof EvalException ? ((EvalException) e).getExceptionClassName() : e.getClass().getName();
                        List<String> trace = new ArrayList<>();
                        trace.add(name + ": " + e.getMessage());
                        for (StackTraceElement frame : e.getStackTrace()) trace.add("\tat " + frame);
                        return new String[] {null, error(e.getClass().getSimpleName(), name + ": " + e.getMessage(), trace)};
                    }
                    if (event.status() == Snippet.Status.REJECTED) {
                        List<String> diags = shell.diagnostics(event.snippet())
                            .map(d -> d.getMessage(null))
                            .collect(Collectors.toList());
                        String value = diags.isEmpty() ? "the snippet does not compile: " + source.strip() : String.join("\n", diags);
                        return new String[] {null, error("CompilationException", value, diags)};
                    }
                    if (shows(event.snippet()) && event.value() != null) result = event.value();
                }
            }
        } finally {
            running = false;
        }
        return new String[] {result, null};
    }

    static String[] interrupted() {
        return new String[] {null, error("InterruptedException", "the cell was interrupted", List.of())};
    }

    /** An expression's value is the cell's result; a declaration's is not. */
    static boolean shows(Snippet snippet) {
        return snippet.kind() == Snippet.Kind.EXPRESSION
            || (snippet instanceof VarSnippet && snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
    }

    static String error(String name, String value, List<String> trace) {
        return "{\"ename\":" + json(name) + ",\"evalue\":" + json(value) + ",\"traceback\":["
            + trace.stream().map(JShellDriver::json).collect(Collectors.joining(",")) + "]}";
    }

    /**
     * A JSON string of ASCII only (no 0x1e can reach the markers' line); a
     * lone UTF-16 surrogate, which no JSON reader takes, becomes U+FFFD.
     */
    static String json(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            boolean paired = Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1));
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c >= 0x20 && c < 0x7f) b.append(c);
            else if (paired) b.append(String.format("\\u%04x\\u%04x", (int) c, (int) s.charAt(++i)));
            else if (Character.isSurrogate(c)) b.append("\\ufffd");
            else b.append(String.format("\\u%04x", (int) c));
        }
        return b.append('"').toString();
    }

    /** The string value of `"key":` in one request line as serde_json writes it. */
    static String field(String line, String key) {
        int at = line.indexOf("\"" + key + "\":\"");
        if (at < 0) return null;
        StringBuilder b = new StringBuilder();
        for (int i = at + key.length() + 4; i < line.length(); i++) {
            char c = line.charAt(i);
            if (c == '"') return b.toString();
            if (c != '\\') {
                b.append(c);
                continue;
            }
            char e = line.charAt(++i);
            switch (e) {
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'u': b.append((char) Integer.parseInt(line.substring(i + 1, i + 5), 16)); i += 4; break;
                default: b.append(e);
            }
        }
        return null;
    }
}
