// Faults the real daemon cannot be made to show on demand: a ledger that cannot record
// (HTTP 503), a gate that never answers, an answer that is not the gate's. A stand-in
// HTTP server (node's own) on a Unix socket replays them.

import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";

import { Denied, Gate, GateUnavailable, RequestError } from "tally-gate";

// What the daemon answers to a check it cannot record (daemon/src/gate_api.rs).
const FAIL_CLOSED = JSON.stringify({
  decision: "deny",
  reason: "gate_unavailable",
  action: "retry",
  cause: null,
  retry_after_ms: 1000,
  timeout_ms: null,
  attempt: null,
  limits: {},
  seq: null,
  hash: null,
  error: {
    code: "gate_unavailable",
    message:
      "the gate cannot record decisions, so the call must not proceed (fail closed); retry later",
  },
});

/**
 * A stand-in on a fresh Unix socket, closed when the test ends.
 * @param {import("node:test").TestContext} t
 * @param {http.RequestListener} handler
 */
async function standIn(t, handler) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tgn-"));
  const socket = path.join(dir, "fake.sock");
  /** @type {http.IncomingMessage[]} */
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(req);
    handler(req, res);
  });
  await new Promise((resolve) => server.listen(socket, () => resolve(undefined)));
  t.after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { socket, seen };
}

test("a 503 answer fails closed with the gate's retryAfterMs", async (t) => {
  /** @type {unknown[]} */
  const bodies = [];
  const { socket, seen } = await standIn(t, (req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      bodies.push(text ? JSON.parse(text) : null);
      res.writeHead(503, { "content-type": "application/json" });
      res.end(FAIL_CLOSED);
    });
  });
  let ran = false;
  await assert.rejects(
    new Gate(socket, { worker: "w1" }).call(
      "r1",
      "http",
      { effect: "read", operation: undefined, target: null },
      () => {
        ran = true;
      },
    ),
    (e) => {
      assert.ok(e instanceof GateUnavailable);
      assert.equal(e.retryAfterMs, 1000);
      assert.equal(e.reason, "gate_unavailable");
      assert.match(e.message, /HTTP 503 gate_unavailable/);
      assert.ok(e.error instanceof RequestError && e.error.status === 503);
      return true;
    },
  );
  assert.equal(ran, false);
  // What the client sent: a JSON POST on a connection of its own.
  assert.equal(seen.length, 1);
  assert.equal(seen[0].method, "POST");
  assert.equal(seen[0].url, "/v1/check");
  assert.equal(seen[0].headers["content-type"], "application/json");
  assert.equal(seen[0].headers.connection, "close");
  // The fields that are set, and the worker; an unset (or null) option is not sent.
  assert.deepEqual(bodies[0], { run: "r1", tool: "http", effect: "read", worker: "w1" });
  // A 503 on any other route is GateUnavailable too.
  await assert.rejects(new Gate(socket).run("r1"), GateUnavailable);
});

// A bound of its own: without the client's timeout this test would hang, not fail.
test(
  "a gate that never answers is GateUnavailable within timeoutMs",
  { timeout: 5000 },
  async (t) => {
    const { socket } = await standIn(t, () => {}); // reads the request, never answers
    const gate = new Gate(socket, { timeoutMs: 200 });
    const started = Date.now();
    let ran = false;
    await assert.rejects(
      gate.call("r1", "http", { effect: "read" }, () => {
        ran = true;
      }),
      (e) => e instanceof GateUnavailable && /no answer within 200 ms/.test(e.message),
    );
    const took = Date.now() - started;
    assert.ok(took >= 190 && took < 5000, `took ${took} ms`);
    assert.equal(ran, false);
  },
);

test("an answer that is not the gate's is a RequestError, never an allow", async (t) => {
  const { socket } = await standIn(t, (req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("hello");
  });
  let ran = false;
  await assert.rejects(
    new Gate(socket).call("r1", "http", { effect: "read" }, () => {
      ran = true;
    }),
    (e) =>
      e instanceof RequestError &&
      !(e instanceof Denied) &&
      e.code === "invalid_response" &&
      /hello/.test(e.message),
  );
  assert.equal(ran, false);
});

test("a connection cut mid-answer is GateUnavailable", { timeout: 5000 }, async (t) => {
  const { socket } = await standIn(t, (req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "application/json", "content-length": "100" });
    res.write('{"decision":"al');
    setTimeout(() => res.socket?.destroy(), 10);
  });
  let ran = false;
  await assert.rejects(
    new Gate(socket).call("r1", "http", { effect: "read" }, () => {
      ran = true;
    }),
    GateUnavailable,
  );
  assert.equal(ran, false);
});
