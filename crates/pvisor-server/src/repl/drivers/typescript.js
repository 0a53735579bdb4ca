// pvisor's TypeScript code-context driver (node). It reads one JSON request
// per line ({"nonce", "code"}) from stdin, transpiles the cell with the
// image's TypeScript compiler (types are erased, not checked: the
// permissive setting a notebook kernel uses), runs it as a script in one
// persistent V8 context (top-level declarations carry to later cells, a
// promise the cell ends with is awaited), and ends it with the markers
// `\x1eNONCE:PAYLOAD\x1e\n` on stdout and `\x1eNONCE\x1e\n` on stderr, the
// payload being {"count", "result", "error"} as ASCII JSON. Everything goes
// through process.stdout and process.stderr, so a marker is queued after
// the cell's output and never overtakes it. SIGINT ends the running cell
// (vm's breakOnSigint while it runs synchronously; the awaited promise is
// abandoned; one that comes before the cell starts ends it as it starts),
// never the driver.
"use strict";
const vm = require("vm");
const util = require("util");
const readline = require("readline");

function loadTypescript() {
  for (const name of ["typescript", "/usr/share/nodejs/typescript", "/usr/lib/node_modules/typescript"]) {
    try {
      return require(name);
    } catch (e) {}
  }
  return null;
}
const ts = loadTypescript();

const cellModule = { exports: {} };
const context = vm.createContext({
  console,
  require,
  module: cellModule,
  exports: cellModule.exports,
  process,
  Buffer,
  setTimeout,
  clearTimeout,
  setInterval,
  clearInterval,
  setImmediate,
  clearImmediate,
  URL,
  TextEncoder,
  TextDecoder,
});

function transpile(code) {
  if (!ts) return code;
  return ts.transpileModule(code, {
    compilerOptions: { target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS, esModuleInterop: true },
  }).outputText;
}

// A lone UTF-16 surrogate cannot be written as JSON the host reads.
const wellFormed = (s) =>
  String(s).replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd");

function describe(e) {
  if (e instanceof Error || (e && typeof e === "object" && "stack" in e)) {
    // The cell's frames, not the driver's (which begin at node's vm).
    const stack = String(e.stack || "").split("\n");
    const driver = stack.findIndex((l) => l.includes("node:vm"));
    const traceback = (driver > 0 ? stack.slice(0, driver) : stack).map(wellFormed);
    return { ename: wellFormed(e.name || "Error"), evalue: wellFormed(e.message || ""), traceback };
  }
  return { ename: "Error", evalue: wellFormed(util.inspect(e)), traceback: [] };
}

// An interrupt of the current run: it ends the cell wherever it is.
let interrupted = false;
let abandon = null;
const interruption = () => {
  const e = new Error("Script execution was interrupted by `SIGINT`");
  e.stack = `Error: ${e.message}`;
  return e;
};
process.on("SIGINT", () => {
  interrupted = true;
  if (abandon) abandon(interruption());
});
// A cell's timer or promise that fails later is reported, not fatal.
process.on("uncaughtException", (e) => process.stderr.write(`${describe(e).traceback.join("\n")}\n`));
process.on("unhandledRejection", (e) => process.stderr.write(`unhandled rejection: ${util.inspect(e)}\n`));

async function runCell(code) {
  const script = transpile(code);
  if (interrupted) throw interruption();
  let value = vm.runInContext(script, context, { filename: "<cell>", breakOnSigint: true });
  if (value && typeof value.then === "function") {
    const stop = new Promise((_, reject) => {
      abandon = reject;
      if (interrupted) reject(interruption());
    });
    try {
      value = await Promise.race([value, stop]);
    } finally {
      abandon = null;
    }
  }
  return value === undefined ? null : util.inspect(value);
}

function cut(text) {
  if (text === null || text.length <= 1048576) return text;
  let end = 1048576;
  if (/[\ud800-\udbff]/.test(text[end - 1])) end -= 1;
  return text.slice(0, end) + "... (truncated)";
}

async function serve() {
  process.stdout.write("\x1eready\x1e\n");
  let count = 0;
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  for await (const line of lines) {
    let request;
    try {
      request = JSON.parse(line);
    } catch (e) {
      continue;
    }
    count += 1;
    let result = null;
    let error = null;
    try {
      result = cut(await runCell(String(request.code)));
    } catch (e) {
      error = describe(e);
    }
    const payload = JSON.stringify({ count, result: result === null ? null : wellFormed(result), error }).replace(
      /[\u007f-\uffff]/g,
      (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")
    );
    process.stdout.write("\x1e" + request.nonce + ":" + payload + "\x1e\n");
    process.stderr.write("\x1e" + request.nonce + "\x1e\n");
    // An interrupt that came after the cell ended was for it, not the next.
    interrupted = false;
  }
  process.exitCode = 0;
}

serve();
