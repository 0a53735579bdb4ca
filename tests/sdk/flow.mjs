// The published OpenSandbox TypeScript SDK (@alibaba-group/opensandbox
// 0.1.11 from the npm registry, unchanged) against `pvisor serve`: create,
// commands (line framing as the reference execd emits it), files, renew to an
// earlier time (what the SDK's pool does), pause, resume, kill.
// Usage: PVISOR_URL=127.0.0.1:PORT PVISOR_KEY=KEY OPENSANDBOX_TS_SDK=.../dist/index.js node flow.mjs
import assert from "node:assert/strict";

const { ConnectionConfig, Sandbox, SandboxException } = await import(process.env.OPENSANDBOX_TS_SDK);

const config = new ConnectionConfig({
  domain: process.env.PVISOR_URL,
  apiKey: process.env.PVISOR_KEY,
  protocol: "http",
  requestTimeoutSeconds: 120,
});

// An unknown image is a clear 4xx with the server's message.
await assert.rejects(
  Sandbox.create({ connectionConfig: config, image: "no-such-image:1", readyTimeoutSeconds: 10 }),
  (err) => err instanceof SandboxException && /pvisor image import/.test(String(err.error?.message ?? err)),
);

const sandbox = await Sandbox.create({
  connectionConfig: config,
  image: "default",
  timeoutSeconds: 24 * 3600,
  readyTimeoutSeconds: 180,
});
try {
  // One event per line, terminators removed (components/execd/pkg/runtime/
  // command_common.go, readFromPos), so joining with "\n" gives the output.
  let ex = await sandbox.commands.run("echo hello");
  assert.equal(ex.logs.stdout[0]?.text, "hello");
  const seen = [];
  ex = await sandbox.commands.run("printf 'a\\n\\nb\\n'; echo oops >&2; exit 3", undefined, {
    onStdout: (m) => seen.push(m.text),
  });
  assert.deepEqual(seen, ["a", "\n", "b"]);
  assert.equal(ex.logs.stderr[0]?.text, "oops");
  assert.ok(ex.error, "a failing command reports its error");

  await sandbox.files.writeFiles([{ path: "/root/notes.txt", data: "kept across pause\n", mode: 644 }]);
  assert.equal(await sandbox.files.readFile("/root/notes.txt"), "kept across pause\n");
  const found = await sandbox.files.search({ path: "/root", pattern: "*.txt" });
  assert.ok(found.some((f) => f.path === "/root/notes.txt"), JSON.stringify(found));

  // The SDK's pool creates with a long timeout and renews to a shorter one.
  await sandbox.renew(600);
  const info = await sandbox.getInfo();
  assert.ok(new Date(info.expiresAt) < new Date(Date.now() + 3600 * 1000), String(info.expiresAt));

  await sandbox.commands.run("sleep 1000 &");
  await sandbox.pause();
  for (let i = 0; (await sandbox.getInfo()).status.state !== "Paused"; i++) {
    assert.ok(i < 600, "the sandbox never reached Paused");
    await new Promise((r) => setTimeout(r, 100));
  }
  const resumed = await sandbox.resume({ readyTimeoutSeconds: 180 });
  assert.equal(await resumed.files.readFile("/root/notes.txt"), "kept across pause\n");
  ex = await resumed.commands.run("ps | grep -c '[s]leep 1000'");
  assert.equal(ex.logs.stdout[0]?.text, "1");
  await resumed.kill();
  await resumed.close();
  console.log("TypeScript SDK flow OK");
} catch (err) {
  await sandbox.kill().catch(() => {});
  throw err;
} finally {
  await sandbox.close();
}
