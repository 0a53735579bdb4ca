// pvisor's TypeScript code-context driver (node). It reads one JSON request
// per line ({"nonce", "code"}) from stdin, transpiles the cell with the
// image's TypeScript compiler (types are erased, not checked: the
// permissive setting a notebook kernel uses), runs it as a script in one
// persistent V8 context (top-level declarations carry to later cells, a
// promise the cell ends with is awaited), and ends it with the markers
// `\x1eNONCE:PAYLOAD\x1e\n` on fd 1 and `\x1eNONCE\x1e\n` on fd 2, the
// payload being {"count", "result", "error"} as JSON. SIGINT ends the
// running cell (vm's breakOnSigint), never the driver.
"use strict";
const fs = require("fs");
const vm = require("vm");
const util = require("util");
const readline = require("readline");
const { Writable } = require("stream");

function loadTypescript() {
  for (const name of ["typescript", "/usr/share/nodejs/typescript", "/usr/lib/node_modules/typescript"]) {
    try {
      return require(name);
    } catch (e) {}
  }
  return null;
}
const ts = loadTypescript();

// Written synchronously, so a cell's output always precedes its markers.
const sink = (fd) =>
  new Writable({
    write(chunk, encoding, done) {
      try {
        fs.writeSync(fd, chunk);
        done();
      } catch (e) {
        done(e);
      }
    },
  });
const cellConsole = new console.Console({ stdout: sink(1), stderr: sink(2) });
const cellModule = { exports: {} };
const context = vm.createContext({
  console: cellConsole,
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
    compilerOptions: {
      target: ts.ScriptTarget.ES2020,
      module: ts.ModuleKind.CommonJS,
      esModuleInterop: true,
      isolatedModules: false,
    },
  }).outputText;
}

function describe(e) {
  if (e instanceof Error || (e && typeof e === "object" && "stack" in e)) {
    // The cell's frames, not the driver's (which begin at node's vm).
    const stack = String(e.stack || "").split("\n");
    const driver = stack.findIndex((l) => l.includes("node:vm"));
    const traceback = driver > 0 ? stack.slice(0, driver) : stack;
    return { ename: String(e.name || "Error"), evalue: String(e.message || ""), traceback };
  }
  return { ename: "Error", evalue: util.inspect(e), traceback: [] };
}

let count = 0;
process.on("SIGINT", () => {});

async function runCell(code) {
  let value = vm.runInContext(transpile(code), context, { filename: "<cell>", breakOnSigint: true });
  if (value && typeof value.then === "function") value = await value;
  return value === undefined ? null : util.inspect(value);
}

async function serve() {
  fs.writeSync(1, "\x1eready\x1e\n");
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
      result = await runCell(String(request.code));
    } catch (e) {
      error = describe(e);
    }
    if (result !== null && result.length > 1048576) result = result.slice(0, 1048576) + "... (truncated)";
    // ASCII JSON: no 0x1e inside the payload.
    const payload = JSON.stringify({ count, result, error }).replace(/[\u007f-\uffff]/g, (c) =>
      "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")
    );
    fs.writeSync(1, "\x1e" + request.nonce + ":" + payload.replace(/\x1e/g, "\\u001e") + "\x1e\n");
    fs.writeSync(2, "\x1e" + request.nonce + "\x1e\n");
  }
  process.exit(0);
}

serve();
