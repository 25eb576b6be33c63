// README's example, as a user copies it, against the real daemon: its placeholders
// (postExport, escalate, handOff) are stand-ins that record what they were given.

import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { Gate } from "tally-gate";

import { serve } from "./daemon.mjs";

const readme = fs.readFileSync(new URL("../README.md", import.meta.url), "utf8");
const pkg = JSON.parse(fs.readFileSync(new URL("../package.json", import.meta.url), "utf8"));
const entry = new URL(`../${pkg.exports["."].default}`, import.meta.url).href;

/**
 * Run README's first js block against the gate at `socket`.
 * @param {import("node:test").TestContext} t @param {string} socket
 */
async function runExample(t, socket) {
  const block = readme.match(/```js\n([\s\S]*?)```/);
  assert.ok(block, "README.md has no ```js block");
  const code = block[1];
  assert.ok(code.includes('from "tally-gate"') && code.includes('"/run/tally/agent.sock"'));
  const lines = code.trimEnd().split("\n").length;
  assert.ok(lines <= 20, `README's example is ${lines} lines: keep it short enough to copy`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tgn-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, "example.mjs");
  fs.writeFileSync(
    file,
    code
      .replace('from "tally-gate"', `from ${JSON.stringify(entry)}`)
      .replace('"/run/tally/agent.sock"', JSON.stringify(socket)),
  );
  /** @type {{postExport: unknown[], escalate: unknown[], handOff: unknown[]}} */
  const calls = { postExport: [], escalate: [], handOff: [] };
  const g = /** @type {any} */ (globalThis);
  g.postExport = async (/** @type {{signal: AbortSignal}} */ options) => {
    assert.ok(options.signal instanceof AbortSignal);
    calls.postExport.push(options);
    return { costCents: 7 };
  };
  g.escalate = (/** @type {unknown} */ cause) => calls.escalate.push(cause);
  g.handOff = (/** @type {unknown} */ reason) => calls.handOff.push(reason);
  t.after(() => {
    delete g.postExport;
    delete g.escalate;
    delete g.handOff;
  });
  await import(pathToFileURL(file).href);
  return calls;
}

test("README's example: the call is allowed, runs once and its cost is recorded", async (t) => {
  const daemon = await serve(t);
  const calls = await runExample(t, daemon.socket);
  assert.equal(calls.postExport.length, 1);
  assert.deepEqual([calls.escalate, calls.handOff], [[], []]);
  const standing = await new Gate(daemon.socket).run("r1");
  assert.equal(standing.goal, "export Q3 report");
  assert.deepEqual([standing.callsAllowed, standing.heldCents, standing.settledCents], [1, 0, 7]);
});

test("README's example: a reservation over budget asks a human and never runs", async (t) => {
  const daemon = await serve(t, "[ceiling]\nspend_cents = 10\n");
  const calls = await runExample(t, daemon.socket);
  assert.equal(calls.postExport.length, 0);
  assert.deepEqual(calls.escalate, ["reservation_insufficient"]);
  assert.deepEqual(calls.handOff, []);
});
