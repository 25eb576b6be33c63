// tally-gate against the real daemon: each test starts `tally-load serve` (path in env
// TALLY_LOAD) over a fresh ledger, with the policy it needs, and kills it when it ends.
//
//     cargo build -p tally-load
//     TALLY_LOAD=target/debug/tally-load node --test clients/node/test/*.test.mjs

import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  AskHuman,
  Decision,
  Denied,
  Gate,
  GateUnavailable,
  Logged,
  OutcomeNotRecorded,
  RequestError,
  RetryLater,
  Run,
  RunStanding,
  StopRun,
  TallyError,
  resultDigest,
} from "tally-gate";

import { NO_ASK, serve } from "./daemon.mjs";

/** Nanodollars in a cent: the gate counts nanodollars (10^-9 USD). */
const CENT = 10_000_000;

/** A body that must not run: the gate refused the call. */
function never() {
  throw new Error("the body of a refused call ran");
}

test("a call an approver denied is StopRun, with who and the note", () => {
  const d = new Decision({
    decision: "deny", reason: "denied_by_approver", action: "stop", cause: null,
    denied_by: "dana", note: "wrong \u001b address", limits: {}, seq: 9, hash: null,
  });
  assert.deepEqual([d.deniedBy, d.note], ["dana", "wrong \u001b address"]);
  assert.throws(
    () => d.raiseIfDenied(),
    (e) => e instanceof StopRun && e.message.endsWith('(dana denied it: "wrong \\u001b address")'),
  );
});

test("an approver's note cannot reorder or forge what the denial message shows", () => {
  const d = new Decision({
    decision: "deny", reason: "denied_by_approver", action: "stop", cause: null,
    denied_by: "da\u202ena", note: 'ok") (approved by root: "yes\u2066\u2028\u0085\\', limits: {},
    seq: 9, hash: null,
  });
  assert.throws(
    () => d.raiseIfDenied(),
    (e) => e instanceof StopRun &&
      e.message.endsWith(
        '(da\\u202ena denied it: "ok\\") (approved by root: \\"yes\\u2066\\u2028\\u0085\\\\")',
      ),
  );
});

test("allow, then the outcome ok is recorded", async (t) => {
  const gate = new Gate((await serve(t)).socket);
  const run = await gate.startRun("r1", {
    goal: "triage inbox",
    budget: { attempts: 10, spend_cents: 200 },
  });
  assert.ok(run instanceof Run);
  assert.equal(run.run, "r1");
  assert.equal(run.budget.attempts, 10);
  assert.equal(run.budget.spend_nanos, 200 * CENT);
  assert.equal(typeof run.seq, "number");
  assert.match(run.hash, /^[0-9a-f]{64}$/);

  const d = await gate.check("r1", "http", {
    effect: "read",
    operation: "inbox.list",
    args: { page: 1 },
    reserveCents: 20,
    timeoutMs: 1500,
  });
  assert.ok(d instanceof Decision && d.allowed);
  assert.equal(d.decision, "allow");
  assert.equal(d.reason, null);
  assert.equal(d.action, null);
  assert.equal(d.attempt, 1);
  assert.equal(d.timeoutMs, 1500);
  assert.deepEqual(d.limits.attempts, { used: 0, limit: 10 });
  assert.ok(d.seq > run.seq);
  assert.equal((await gate.run("r1")).heldNanos, 20 * CENT);

  const logged = await gate.outcome("r1", d.attempt, "ok", { settledCents: 7 });
  assert.ok(logged instanceof Logged && logged.seq > d.seq);
  let standing = await gate.run("r1");
  assert.ok(standing instanceof RunStanding);
  assert.equal(standing.state, "running");
  assert.equal(standing.heldNanos, 0);
  assert.equal(standing.settledNanos, 7 * CENT);
  assert.equal(standing.callsAllowed, 1);
  assert.equal(standing.limits.attempts.used, 1);

  /** @type {import("tally-gate").Call | undefined} */
  let seen;
  const answer = await gate.call(
    "r1",
    "http",
    { effect: "read", operation: "inbox.get", args: { id: 3 }, reserveCents: 5 },
    async (call) => {
      seen = call;
      assert.equal(call.attempt, 2);
      assert.equal(call.timeoutMs, 60000); // the policy's call_timeout_ms
      assert.equal(call.signal.aborted, false);
      call.ok({ settledCents: 3 });
      return "the body's answer";
    },
  );
  assert.equal(answer, "the body's answer");
  assert.ok(seen?.logged && seen.logged.seq > 0);
  standing = await gate.run("r1");
  assert.equal(standing.settledNanos, 10 * CENT);
  assert.equal(standing.heldNanos, 0);
  assert.equal(standing.callsAllowed, 2);

  await gate.stop("r1", "completed");
  standing = await gate.run("r1");
  assert.equal(standing.state, "stopped");
  assert.equal(standing.stopReason, "completed");
  // A check on a stopped run: deny with the stop's reason, nothing recorded.
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 2 } }, never),
    (e) => {
      assert.ok(e instanceof StopRun);
      assert.equal(e.reason, "completed");
      assert.equal(e.action, "stop");
      assert.equal(e.decision.seq, null);
      return true;
    },
  );
});

test("a changed result is progress, not a loop; the same result four times is", async (t) => {
  const gate = new Gate((await serve(t)).socket);
  await gate.startRun("r1");
  for (let i = 0; i < 5; i++) {
    await gate.call("r1", "fs", { effect: "read", args: { path: "a.rs" } }, async (call) =>
      call.ok({ result: { content: `fn v${i}() {}` } }),
    );
  }
  assert.equal(resultDigest({ b: 1, a: [2] }), resultDigest({ a: [2], b: 1 }));
  assert.match(resultDigest(new Uint8Array([1])), /^[0-9a-f]{64}$/);
  await gate.startRun("r2");
  for (let i = 0; i < 3; i++) {
    await gate.call("r2", "fs", { effect: "read", args: { path: "a.rs" } }, async (call) =>
      call.ok({ result: "same" }),
    );
  }
  await assert.rejects(
    gate.call("r2", "fs", { effect: "read", args: { path: "a.rs" } }, never),
    (e) => e instanceof StopRun && e.reason === "loop_repeated_call",
  );
});

test("attempts exhausted asks a human under the default ask_on", async (t) => {
  const gate = new Gate((await serve(t, "[ceiling]\nattempts = 3\n")).socket);
  const run = await gate.startRun("r1", { budget: { attempts: 100 } });
  assert.equal(run.budget.attempts, 3); // never more than the policy's ceiling
  for (let i = 0; i < 3; i++) {
    await gate.call(
      "r1",
      "http",
      { effect: "read", operation: `list:${i}`, args: { page: i } },
      () => {},
    );
  }
  let ran = false;
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", operation: "list:3", args: { page: 3 } }, () => {
      ran = true;
    }),
    (e) => {
      assert.ok(e instanceof AskHuman && e instanceof Denied && e instanceof TallyError);
      assert.ok(e instanceof Error);
      assert.equal(e.name, "AskHuman");
      assert.equal(e.decision.decision, "require_approval");
      assert.deepEqual(
        [e.reason, e.action, e.cause],
        ["approval_required", "ask", "attempts_exhausted"],
      );
      assert.equal(typeof e.decision.seq, "number"); // the refusal is recorded
      assert.match(e.message, /approve/);
      return true;
    },
  );
  assert.equal(ran, false);
  const standing = await gate.run("r1");
  assert.deepEqual(standing.limits.attempts, { used: 3, limit: 3 });
  assert.equal(standing.callsAllowed, 3);
});

test("attempts exhausted stops the run without ask_on", async (t) => {
  const gate = new Gate((await serve(t, "[ceiling]\nattempts = 3\n" + NO_ASK)).socket);
  await gate.startRun("r1");
  for (let i = 0; i < 3; i++) {
    await gate.call(
      "r1",
      "http",
      { effect: "read", operation: `list:${i}`, args: { page: i } },
      () => {},
    );
  }
  let ran = false;
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", operation: "list:3", args: { page: 3 } }, () => {
      ran = true;
    }),
    (e) => {
      assert.ok(e instanceof StopRun && !(e instanceof RetryLater) && !(e instanceof AskHuman));
      assert.deepEqual([e.reason, e.action, e.cause], ["attempts_exhausted", "stop", null]);
      assert.equal(e.decision.decision, "deny");
      assert.match(e.message, /do not retry/);
      return true;
    },
  );
  assert.equal(ran, false);
  // check() resolves to the refusal as it is; raiseIfDenied() throws the same error.
  const d = await new Gate(gate.socketPath).check("r1", "http", {
    effect: "read",
    operation: "list:4",
    args: { page: 4 },
  });
  assert.equal(d.allowed, false);
  assert.equal(d.reason, "attempts_exhausted");
  assert.throws(() => d.raiseIfDenied(), StopRun);
});

test("a rate limit is RetryLater with retryAfterMs, and the call goes through after it", async (t) => {
  const gate = new Gate((await serve(t, "[rate]\nrun_per_sec = 2\nrun_burst = 3\n")).socket);
  await gate.startRun("r1");
  /** @type {RetryLater | undefined} */
  let refusal;
  let i = 0;
  for (; i < 20; i++) {
    try {
      await gate.call(
        "r1",
        "search",
        { effect: "read", operation: `q:${i}`, args: { q: i } },
        () => {},
      );
    } catch (e) {
      if (!(e instanceof RetryLater)) throw e;
      refusal = e;
      break;
    }
  }
  assert.ok(refusal, "the run bucket (burst 3, 2/s) never ran out");
  assert.ok(i >= 3, `refused after only ${i} calls with a burst of 3`);
  assert.ok(!(refusal instanceof GateUnavailable));
  assert.deepEqual([refusal.reason, refusal.action], ["rate_limit_exceeded", "retry"]);
  assert.ok(
    refusal.retryAfterMs > 0 && refusal.retryAfterMs <= 1000,
    `retryAfterMs ${refusal.retryAfterMs}`,
  );
  assert.match(refusal.message, new RegExp(`ask again after ${refusal.retryAfterMs} ms`));
  await sleep(refusal.retryAfterMs + 50);
  const attempt = await gate.call(
    "r1",
    "search",
    { effect: "read", operation: "q:again", args: { q: "again" } },
    (call) => call.attempt,
  );
  assert.equal(attempt, i + 1);
});

test("call() records ok, error, timeout and unknown", async (t) => {
  // A non-idempotent write may run once per operation until an ok: what the gate answers
  // to the same operation next shows which outcome was recorded.
  // (The breaker would open after 5 failures in a row: this test makes more than that.)
  const gate = new Gate((await serve(t, NO_ASK + "[breaker]\nfailures = 100\n")).socket);
  await gate.startRun("r1", { budget: { spend_cents: 100 } });
  /** @param {string} op @param {number} n @param {number | undefined} reserve @param {(c: any) => any} body */
  const pay = (op, n, reserve, body) =>
    gate.call(
      "r1",
      "payments",
      { effect: "non_idempotent_write", operation: op, args: { n }, reserveCents: reserve },
      body,
    );

  // ok (with its settled cost): the hold is settled; the operation may run again.
  await pay("charge:a", 1, 10, (call) => call.ok({ settledCents: 4 }));
  let standing = await gate.run("r1");
  assert.deepEqual([standing.heldNanos, standing.settledNanos], [0, 4 * CENT]);
  await pay("charge:a", 2, undefined, async () => {}); // allowed again; records ok when it resolves

  // error: the hold is released, the error is rethrown, the operation's one attempt spent.
  const boom = new Error("boom");
  await assert.rejects(
    pay("charge:b", 3, 10, async () => {
      throw boom;
    }),
    (e) => e === boom,
  );
  standing = await gate.run("r1");
  assert.deepEqual([standing.heldNanos, standing.settledNanos], [0, 4 * CENT]);
  await assert.rejects(
    pay("charge:b", 4, 10, never),
    (e) => e instanceof StopRun && e.reason === "retries_exhausted",
  );

  // timeout (a TimeoutError, as AbortSignal.timeout throws): the hold stays (the call may
  // have spent it) and the write is not repeated until its outcome is reconciled.
  await assert.rejects(
    pay("charge:c", 5, 10, async () => {
      await sleep(1000, undefined, { signal: AbortSignal.timeout(10) });
    }),
    (e) => e.name === "TimeoutError" || e.name === "AbortError",
  );
  assert.equal((await gate.run("r1")).heldNanos, 10 * CENT);
  await assert.rejects(pay("charge:c", 6, 10, never), (e) => {
    assert.ok(e instanceof AskHuman);
    assert.deepEqual([e.reason, e.action], ["outcome_unknown_non_idempotent", "ask"]);
    return true;
  });

  // An AbortError is a timeout too.
  await assert.rejects(
    pay("charge:d", 7, undefined, async () => {
      const ctl = new AbortController();
      ctl.abort();
      await sleep(1000, undefined, { signal: ctl.signal });
    }),
    { name: "AbortError" },
  );
  await assert.rejects(
    pay("charge:d", 8, undefined, never),
    (e) => e instanceof AskHuman && e.reason === "outcome_unknown_non_idempotent",
  );

  // So is the call's own timeout: call.signal fires once the allow's timeoutMs has passed.
  const started = Date.now();
  await assert.rejects(
    gate.call(
      "r1",
      "payments",
      { effect: "non_idempotent_write", operation: "charge:e", args: { n: 9 }, timeoutMs: 50 },
      async (call) => {
        assert.equal(call.timeoutMs, 50);
        await new Promise((_, reject) =>
          call.signal.addEventListener("abort", () => reject(call.signal.reason)),
        );
      },
    ),
    { name: "TimeoutError" },
  );
  assert.ok(Date.now() - started >= 45, "call.signal fired before the call's timeout");
  await assert.rejects(
    pay("charge:e", 10, undefined, never),
    (e) => e instanceof AskHuman && e.reason === "outcome_unknown_non_idempotent",
  );

  // Whatever the body throws once call.signal has fired is a timeout: a library may wrap
  // the abort in an error of its own.
  const hungUp = new Error("socket hang up");
  await assert.rejects(
    gate.call(
      "r1",
      "payments",
      { effect: "non_idempotent_write", operation: "charge:h", args: { n: 15 }, timeoutMs: 20 },
      async (call) => {
        await new Promise((resolve) => call.signal.addEventListener("abort", resolve));
        throw hungUp;
      },
    ),
    (e) => e === hungUp,
  );
  await assert.rejects(
    pay("charge:h", 16, undefined, never),
    (e) => e instanceof AskHuman && e.reason === "outcome_unknown_non_idempotent",
  );

  // unknown, as the body says, even though it resolved.
  await pay("charge:f", 11, undefined, (call) => call.unknown({ remoteRef: "ch_11" }));
  await assert.rejects(
    pay("charge:f", 12, undefined, never),
    (e) => e instanceof AskHuman && e.reason === "outcome_unknown_non_idempotent",
  );

  // What the body marks wins over a throw too: a rejected call gives its attempt back.
  const refused = new Error("card declined before anything happened");
  await assert.rejects(
    pay("charge:g", 13, undefined, (call) => {
      call.report("rejected");
      throw refused;
    }),
    (e) => e === refused,
  );
  await pay("charge:g", 14, undefined, () => {}); // allowed: the rejected attempt did nothing

  // An outcome is final: reporting the ok attempt again is a typed conflict.
  await assert.rejects(gate.outcome("r1", 1, "ok"), (e) => {
    assert.ok(e instanceof RequestError && !(e instanceof Denied));
    assert.deepEqual([e.status, e.code], [409, "attempt_settled"]);
    return true;
  });
});

test("the daemon killed (-9) is GateUnavailable and the body never runs", async (t) => {
  const daemon = await serve(t);
  const gate = new Gate(daemon.socket, { timeoutMs: 5000 });
  await gate.startRun("r1");
  await daemon.kill(); // the socket file is left behind: connection refused
  assert.ok(fs.existsSync(daemon.socket));
  let ran = false;
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 1 } }, () => {
      ran = true;
    }),
    (e) => {
      assert.ok(e instanceof GateUnavailable && e instanceof RetryLater && e instanceof Denied);
      assert.deepEqual([e.reason, e.action], ["gate_unavailable", "retry"]);
      assert.equal(e.decision.decision, "deny");
      assert.equal(e.decision.allowed, false);
      assert.match(e.message, /must not proceed/);
      assert.ok(e.message.includes(daemon.socket), e.message);
      assert.match(e.message, /ECONNREFUSED/);
      assert.equal(e.error.code, "ECONNREFUSED");
      return true;
    },
  );
  assert.equal(ran, false);
  for (const op of [
    () => gate.run("r1"),
    () => gate.startRun("r2"),
    () => gate.check("r1", "http", { effect: "read" }),
    () => gate.outcome("r1", 1, "ok"),
    () => gate.stop("r1", "completed"),
  ]) {
    await assert.rejects(op(), GateUnavailable);
  }
});

test("the socket removed is GateUnavailable", async (t) => {
  const daemon = await serve(t);
  const gate = new Gate(daemon.socket);
  await gate.startRun("r1");
  fs.unlinkSync(daemon.socket);
  let ran = false;
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 1 } }, () => {
      ran = true;
    }),
    (e) => e instanceof GateUnavailable && /ENOENT/.test(e.message),
  );
  assert.equal(ran, false);
  await assert.rejects(gate.check("r1", "http", { effect: "read" }), GateUnavailable);
});

test("an outcome that cannot be recorded is OutcomeNotRecorded", async (t) => {
  const daemon = await serve(t);
  const gate = new Gate(daemon.socket);
  await gate.startRun("r1");
  // The body succeeded, the gate went away: the call ran, so this is not a RetryLater.
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 1 } }, () => daemon.kill()),
    (e) => {
      assert.ok(e instanceof OutcomeNotRecorded && !(e instanceof Denied));
      assert.deepEqual([e.run, e.attempt, e.status], ["r1", 1, "ok"]);
      assert.ok(e.cause instanceof GateUnavailable && e.error === e.cause);
      assert.match(e.message, /do not repeat the call/);
      return true;
    },
  );
  // And the next call is refused before it runs.
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 2 } }, never),
    GateUnavailable,
  );
});

test("the body's error wins over an outcome that cannot be recorded", async (t) => {
  const daemon = await serve(t);
  const gate = new Gate(daemon.socket);
  await gate.startRun("r1");
  /** @type {Error[]} */
  const warnings = [];
  const onWarning = (/** @type {Error} */ w) => warnings.push(w);
  process.on("warning", onWarning);
  t.after(() => process.off("warning", onWarning));
  const mine = new Error("body");
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", args: { page: 1 } }, async () => {
      await daemon.kill();
      throw mine;
    }),
    (e) => e === mine,
  );
  await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
  const warning = warnings.find(
    (w) => /** @type {any} */ (w).code === "TALLY_OUTCOME_NOT_RECORDED",
  );
  assert.ok(warning, `no warning: ${warnings.map((w) => w.message)}`);
  assert.match(warning.message, /"error" of run "r1" attempt 1 was not recorded/);
});

test("malformed requests are RequestErrors", async (t) => {
  const gate = new Gate((await serve(t)).socket);
  await gate.startRun("r1");
  await assert.rejects(gate.check("r1", "http", { effect: /** @type {any} */ ("bogus") }), (e) => {
    assert.ok(e instanceof RequestError && e instanceof TallyError && !(e instanceof Denied));
    assert.deepEqual([e.status, e.code, e.field], [400, "invalid_value", "effect"]);
    assert.match(e.detail, /bogus/);
    assert.match(e.message, /^HTTP 400 invalid_value \(field `effect`\): /);
    return true;
  });
  let ran = false;
  await assert.rejects(
    gate.call("r1", "http", { effect: "read", channel: "carrier-pigeon" }, () => {
      ran = true;
    }),
    (e) => e instanceof RequestError && e.field === "channel",
  );
  assert.equal(ran, false);
  await assert.rejects(
    gate.check("r1", "http", { effect: "read", reserveCents: 1.5 }),
    (e) => e instanceof RequestError && e.field === "reserve_cents",
  );
  await assert.rejects(
    gate.outcome("r1", 1, /** @type {any} */ ("fine")),
    (e) => e instanceof RequestError && e.field === "status",
  );
  await assert.rejects(gate.check("nope", "http", { effect: "read" }), {
    status: 404,
    code: "run_not_found",
  });
  await assert.rejects(gate.startRun("r1"), { status: 409, code: "run_exists" });
  await assert.rejects(gate.outcome("r1", 99, "ok"), { status: 404, code: "no_such_attempt" });
  // A run name is a path segment: it is escaped, never a path.
  await assert.rejects(gate.run("a/../b?c"), (e) => {
    assert.ok(e instanceof RequestError);
    assert.equal(e.code, "run_not_found");
    assert.ok(e.detail.includes("a/../b?c"), e.detail);
    return true;
  });
  // body is required, and must be a function: nothing is asked without one.
  await assert.rejects(
    gate.call("r1", "http", { effect: "read" }, /** @type {any} */ (undefined)),
    TypeError,
  );
  assert.equal((await gate.run("r1")).callsAllowed, 0);
});

test("every option reaches the gate under its wire name", async (t) => {
  // The gate refuses unknown fields: a misspelt wire name would be a RequestError here.
  const gate = new Gate((await serve(t)).socket, { worker: "w1", timeoutMs: 5000 });
  await gate.startRun("parent", {
    goal: "monthly export",
    budget: { attempts: 20, spend_cents: 100, depth: 3 },
    credential: "c1",
  });
  const child = await gate.startRun("child", {
    goal: "the export itself",
    budget: { attempts: 5, spend_cents: 40 },
    parent: "parent",
    credential: "c1",
    depth: 1,
  });
  assert.deepEqual([child.budget.attempts, child.budget.spend_nanos], [5, 40 * CENT]);
  const d = await gate.check("child", "http", {
    effect: "idempotent_write",
    operation: "export.create",
    args: { q: 3 },
    argsPreview: "q=3",
    idempotencyKey: "export-q3",
    target: "api.example.com",
    channel: "http",
    depth: 1,
    reserveCents: 5,
    credential: "c1",
    timeoutMs: 2000,
  });
  assert.ok(d.allowed, `refused: ${d.reason}`);
  assert.equal(d.timeoutMs, 2000);
  await gate.outcome("child", d.attempt, "ok", {
    settledCents: 3,
    remoteRef: "ex_1",
    observed: "queued",
    retryAfterMs: 10,
  });
  const poll = await gate.check("child", "http", {
    effect: "read",
    operation: "export.status",
    remoteRef: "ex_1",
    credential: "c1",
  });
  assert.ok(poll.allowed, `refused: ${poll.reason}`);
  await gate.outcome("child", poll.attempt, "running", { observed: "still queued" });
  const standing = await gate.run("child");
  assert.equal(standing.goal, "the export itself");
  assert.deepEqual([standing.settledNanos, standing.heldNanos], [3 * CENT, 0]);
  await gate.stop("child", "completed");
  const next = await gate.startRun("child-2", { continues: "child", credential: "c1" });
  assert.equal(next.run, "child-2");
});
