// README's example, as a user copies it, against the real daemon: its placeholders
// (postExport, escalate, handOff) are stand-ins that record what they were given, and
// node:timers/promises' setTimeout records how long it was asked to wait. The import and
// the socket path are the only changes to the text. Between the example's start and its
// check the test can act on the gate (pause the run from the operator socket, kill the
// daemon) through a proxy socket that forwards every byte to the real one.

import assert from "node:assert/strict";
import fs from "node:fs";
import { createRequire, syncBuiltinESMExports } from "node:module";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { Gate } from "tally-gate";

import { NO_ASK, serve } from "./daemon.mjs";

const require = createRequire(import.meta.url);
const readme = fs.readFileSync(new URL("../README.md", import.meta.url), "utf8");
const pkg = JSON.parse(fs.readFileSync(new URL("../package.json", import.meta.url), "utf8"));
const entry = new URL(`../${pkg.exports["."].default}`, import.meta.url).href;

/**
 * A Unix socket in `dir` that forwards each connection to `target`; before it forwards a
 * `POST /v1/check` it awaits `beforeCheck` once (which may stop the gate).
 * @param {string} dir @param {string} target @param {() => Promise<void>} beforeCheck
 */
async function proxy(dir, target, beforeCheck) {
  /** @type {(() => Promise<void>) | null} */
  let pending = beforeCheck;
  const server = net.createServer((client) => {
    let head = Buffer.alloc(0);
    const onData = async (/** @type {Buffer} */ chunk) => {
      head = Buffer.concat([head, chunk]);
      if (!head.includes("\r\n")) return;
      client.off("data", onData);
      client.pause();
      if (head.toString("latin1").startsWith("POST /v1/check ") && pending) {
        const act = pending;
        pending = null;
        await act();
      }
      const upstream = net.connect(target);
      upstream.once("error", () => client.destroy());
      upstream.once("connect", () => {
        upstream.write(head);
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    client.on("data", onData);
    client.on("error", () => {});
  });
  const socket = path.join(dir, "proxy.sock");
  await new Promise((resolve) => server.listen(socket, () => resolve(undefined)));
  return { socket, close: () => server.close() };
}

/** POST on the operator socket, to act as the operator does. @param {string} socket @param {string} p */
function operatorPost(socket, p) {
  return new Promise((resolve, reject) => {
    const s = net.connect(socket, () =>
      s.write(`POST ${p} HTTP/1.1\r\nHost: tally\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`),
    );
    let reply = "";
    s.on("data", (d) => (reply += d));
    s.on("end", () =>
      reply.startsWith("HTTP/1.1 200") ? resolve(undefined) : reject(new Error(reply)),
    );
    s.on("error", reject);
  });
}

/**
 * Run README's first js block against `daemon` (through a proxy when `beforeCheck` is
 * given): what each stand-in was called with, and how long it was asked to sleep.
 * @param {import("node:test").TestContext} t
 * @param {import("./daemon.mjs").Daemon} daemon
 * @param {() => Promise<void>} [beforeCheck]
 */
async function runExample(t, daemon, beforeCheck) {
  const block = readme.match(/```js\n([\s\S]*?)```/);
  assert.ok(block, "README.md has no ```js block");
  const code = block[1];
  assert.ok(code.includes('from "tally-gate"') && code.includes('"/run/tally/agent.sock"'));
  const lines = code.trimEnd().split("\n").length;
  assert.ok(lines <= 20, `README's example is ${lines} lines: keep it short enough to copy`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tgn-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  let socket = daemon.socket;
  if (beforeCheck) {
    const p = await proxy(dir, daemon.socket, beforeCheck);
    t.after(p.close);
    socket = p.socket;
  }
  const file = path.join(dir, "example.mjs");
  fs.writeFileSync(
    file,
    code
      .replace('from "tally-gate"', `from ${JSON.stringify(entry)}`)
      .replace('"/run/tally/agent.sock"', JSON.stringify(socket)),
  );
  /** @type {{postExport: unknown[], escalate: unknown[], handOff: unknown[], sleep: unknown[]}} */
  const calls = { postExport: [], escalate: [], handOff: [], sleep: [] };
  const g = /** @type {any} */ (globalThis);
  g.postExport = async (/** @type {{signal: AbortSignal}} */ options) => {
    assert.ok(options.signal instanceof AbortSignal);
    calls.postExport.push(options);
    return { costNanos: 70_000_000 };
  };
  g.escalate = (/** @type {unknown} */ cause) => calls.escalate.push(cause);
  g.handOff = (/** @type {unknown} */ reason) => calls.handOff.push(reason);
  // The example's `import { setTimeout as sleep } from "node:timers/promises"`.
  const timers = require("node:timers/promises");
  const realSleep = timers.setTimeout;
  timers.setTimeout = async (/** @type {unknown} */ ms) => {
    calls.sleep.push(ms);
  };
  syncBuiltinESMExports();
  try {
    await import(pathToFileURL(file).href);
  } finally {
    timers.setTimeout = realSleep;
    syncBuiltinESMExports();
    delete g.postExport;
    delete g.escalate;
    delete g.handOff;
  }
  return calls;
}

test("README's example: the call is allowed, runs once, its cost is recorded, the run completes", async (t) => {
  const daemon = await serve(t);
  const calls = await runExample(t, daemon);
  assert.equal(calls.postExport.length, 1);
  assert.deepEqual([calls.escalate, calls.handOff, calls.sleep], [[], [], []]);
  const standing = await new Gate(daemon.socket).run("r1");
  assert.equal(standing.goal, "export Q3 report");
  assert.deepEqual([standing.callsAllowed, standing.heldNanos, standing.settledNanos], [1, 0, 70_000_000]);
  assert.deepEqual([standing.state, standing.stopReason], ["stopped", "completed"]);
});

test("README's example: a reservation over budget asks a human and never runs", async (t) => {
  const daemon = await serve(t, "[ceiling]\nspend_cents = 10\n");
  const calls = await runExample(t, daemon);
  assert.equal(calls.postExport.length, 0);
  assert.deepEqual(calls.escalate, ["reservation_insufficient"]);
  assert.deepEqual(calls.handOff, []);
  // The run stays open for the approval.
  assert.equal((await new Gate(daemon.socket).run("r1")).state, "running");
});

test("README's example: a paused run waits a while and makes no call", async (t) => {
  const daemon = await serve(t);
  const pause = () => operatorPost(daemon.operatorSocket, "/v1/runs/r1/pause");
  const calls = await runExample(t, daemon, /** @type {any} */ (pause));
  assert.equal(calls.postExport.length, 0);
  assert.equal(calls.sleep.length, 1);
  assert.ok(typeof calls.sleep[0] === "number" && calls.sleep[0] > 0, `slept ${calls.sleep[0]}`);
  assert.equal((await new Gate(daemon.socket).run("r1")).state, "paused");
});

test("README's example: with the gate gone it waits a while and makes no call", async (t) => {
  const daemon = await serve(t);
  const calls = await runExample(t, daemon, () => daemon.kill());
  assert.equal(calls.postExport.length, 0);
  assert.equal(calls.sleep.length, 1);
  assert.ok(typeof calls.sleep[0] === "number" && calls.sleep[0] > 0, `slept ${calls.sleep[0]}`);
});

test("README's example: a run the gate stops is recorded with the gate's reason, not completed", async (t) => {
  // Only tools named `search` are in scope: the export is refused, action stop.
  const daemon = await serve(t, `[scope]\ntools = ["search"]\n${NO_ASK}`);
  const calls = await runExample(t, daemon);
  assert.deepEqual([calls.postExport, calls.escalate], [[], []]);
  assert.deepEqual(calls.handOff, ["scope_violation"]);
  const standing = await new Gate(daemon.socket).run("r1");
  assert.deepEqual([standing.state, standing.stopReason], ["stopped", "scope_violation"]);
});
