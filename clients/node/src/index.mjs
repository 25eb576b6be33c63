// A client for the tally gate (`tally serve`'s agent socket) for Node 18+, no dependencies.
//
// Ask before every external call; the gate answers allow, deny or require_approval, and a
// refusal carries exactly one action: stop, retry or ask. This module turns refusals into
// typed errors and records the call's outcome for you:
//
//     const gate = new Gate("/run/tally/agent.sock");
//     await gate.startRun("r1", { goal: "triage inbox", budget: { attempts: 10, spend_nanos: 2_000_000_000 } });
//     await gate.call("r1", "http", { effect: "read", args: { page: 1 } }, async (call) =>
//       fetch(url, { signal: call.signal }));
//
// Every request goes on a new connection. If the gate cannot be reached, or cannot record
// the decision, the answer is `GateUnavailable`: the call must not proceed (fail closed).
// The API is docs/GATE.md; the types are index.d.ts beside this file.

import { createHash } from "node:crypto";
import http from "node:http";

/** The package version. */
export const VERSION = "0.1.0";

/**
 * The digest the gate keeps of a call's result (the result itself is never sent): SHA-256
 * of its JSON with sorted keys and no whitespace (strings and bytes as they are), 64
 * lowercase hex. Only equality matters: identical calls whose results differ are
 * progress, not a loop.
 * @param {unknown} result @returns {string}
 */
export function resultDigest(result) {
  const h = createHash("sha256");
  if (typeof result === "string") h.update(result, "utf8");
  else if (result instanceof Uint8Array) h.update(result);
  else h.update(JSON.stringify(sorted(result)) ?? "null", "utf8");
  return h.digest("hex");
}

/** `value` with every object's keys in sorted order, for a stable JSON text. */
function sorted(value) {
  if (Array.isArray(value)) return value.map(sorted);
  if (value && typeof value === "object" && !(value instanceof Date)) {
    return Object.fromEntries(
      Object.keys(value)
        .sort()
        .map((k) => [k, sorted(value[k])]),
    );
  }
  return value;
}

// ------------------------------------------------------------------------------ answers

/** The gate's answer to a check (`POST /v1/check`). */
export class Decision {
  /** @param {Record<string, any>} body the answer's JSON */
  constructor(body) {
    /** `allow`, `deny` or `require_approval`. */
    this.decision = String(body.decision);
    /** The reason code of a refusal (docs/GATE.md, "Reason codes"). */
    this.reason = body.reason ?? null;
    /** What to do after a refusal: `stop`, `retry` or `ask`. */
    this.action = body.action ?? null;
    /** For `require_approval`: the limit that was reached. */
    this.cause = body.cause ?? null;
    /** For `denied_by_approver`: the approver who denied this call. */
    this.deniedBy = body.denied_by ?? null;
    /** For `denied_by_approver`: the approver's note (a human's words: escape them
     * before showing them). */
    this.note = body.note ?? null;
    /** Back off this long before asking again. */
    this.retryAfterMs = body.retry_after_ms ?? null;
    /** For an allow: the call must end within this many ms. */
    this.timeoutMs = body.timeout_ms ?? null;
    /** For an allow: the attempt to report the outcome under. */
    this.attempt = body.attempt ?? null;
    /** `{dimension: {used, limit}}` at decision time. */
    this.limits = { ...(body.limits ?? {}) };
    /** The decision's seq in the ledger (null: nothing was recorded). */
    this.seq = body.seq ?? null;
    /** Its chain hash. */
    this.hash = body.hash ?? null;
    /** The answer as the gate sent it. */
    this.body = body;
  }

  /** Whether the call may proceed. */
  get allowed() {
    return this.decision === "allow";
  }

  /** This decision if it allows the call; else throws its `Denied` subclass. */
  raiseIfDenied() {
    if (this.allowed) return this;
    throw denied(this);
  }
}

/** A started run (`POST /v1/runs`): the budget *granted*, never more than asked. */
export class Run {
  /** @param {Record<string, any>} body */
  constructor(body) {
    this.run = String(body.run);
    this.budget = { ...(body.budget ?? {}) };
    this.policy = body.policy ?? "";
    this.seq = body.seq;
    this.hash = body.hash;
    this.body = body;
  }
}

/** What an outcome or a stop recorded: `{seq, hash, limits}`. */
export class Logged {
  /** @param {Record<string, any>} body */
  constructor(body) {
    this.seq = body.seq;
    this.hash = body.hash;
    this.limits = { ...(body.limits ?? {}) };
    this.body = body;
  }
}

/** Where a run stands (`GET /v1/runs/{run}`). */
export class RunStanding {
  /** @param {Record<string, any>} body */
  constructor(body) {
    this.run = String(body.run);
    /** `running`, `paused` or `stopped`. */
    this.state = body.state;
    this.stopReason = body.stop_reason ?? null;
    this.goal = body.goal ?? null;
    this.budget = { ...(body.budget ?? {}) };
    this.limits = { ...(body.limits ?? {}) };
    /** Nanodollars (10^-9 USD) held by calls not yet settled. */
    this.heldNanos = body.held_nanos;
    /** Nanodollars settled. */
    this.settledNanos = body.settled_nanos;
    /** Attempt numbers issued, including exempt calls and polls. */
    this.callsAllowed = body.calls_allowed;
    /** The run's clock now, ms since its start. */
    this.atMs = body.at_ms;
    this.grantsUnused = body.grants_unused;
    this.ownerUid = body.owner_uid ?? null;
    this.body = body;
  }
}

// ------------------------------------------------------------------------------- errors

/** Anything this client throws. */
export class TallyError extends Error {
  /** @param {string} message @param {ErrorOptions} [options] */
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The gate refused the call: it must not be made. See the subclasses for what to do. */
export class Denied extends TallyError {
  /** @param {Decision} decision @param {string} [message] */
  constructor(decision, message) {
    super(message ?? denialMessage(decision));
    this.decision = decision;
    this.reason = decision.reason;
    this.action = decision.action;
    // Not Error's chaining `cause`: the limit a require_approval names (null otherwise).
    this.cause = decision.cause;
    this.retryAfterMs = decision.retryAfterMs;
  }
}

/** Action `stop`: the run is over for this call (budget, deadline, loop, scope). Do not
 * retry it; stop the run with this reason (`gate.stop(run, e.reason)`, so the handoff
 * says why) and hand off. */
export class StopRun extends Denied {}

/** Milliseconds to wait before asking again when the gate gave no `retryAfterMs` (a
 * paused run, whose end nobody knows; the gate down). */
export const DEFAULT_RETRY_AFTER_MS = 1000;

/** Action `retry`: ask again later (rate limit, backoff, breaker, paused run, the gate
 * down); `waitMs` is how long. */
export class RetryLater extends Denied {
  /** The gate's `retryAfterMs`, or `DEFAULT_RETRY_AFTER_MS` when it gave none. */
  get waitMs() {
    return this.retryAfterMs ?? DEFAULT_RETRY_AFTER_MS;
  }
}

/** Action `ask` (or decision `require_approval`): a human must approve before this call
 * can proceed; `cause` names the limit that was reached. */
export class AskHuman extends Denied {}

/** The gate cannot be reached or cannot record decisions (fail closed): the call must not
 * proceed. Retry later, once `tally serve` is running and healthy. `error` is what went
 * wrong underneath (a socket error, or the `RequestError` of an HTTP 503). */
export class GateUnavailable extends RetryLater {
  /** @param {Decision} decision @param {string} message @param {unknown} [error] */
  constructor(decision, message, error) {
    super(decision, message);
    this.error = error ?? null;
  }
}

/** The gate refused the request itself (HTTP 4xx/5xx with a typed error): nothing was
 * decided. `code` is e.g. `invalid_json`, `run_not_found`, `run_exists`,
 * `no_such_attempt`, `attempt_settled`, `not_owner`; `field` names the field at fault;
 * `detail` is the gate's own message. */
export class RequestError extends TallyError {
  /**
   * @param {number} status @param {string} code @param {string} detail
   * @param {string | null} [field] @param {Record<string, any> | null} [body]
   */
  constructor(status, code, detail, field = null, body = null) {
    super(`HTTP ${status} ${code}${field ? ` (field \`${field}\`)` : ""}: ${detail}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.field = field ?? null;
    this.body = body ?? {};
  }
}

/** A `gate.call(...)` body finished, but its outcome could not be recorded (`cause` and
 * `error` are why). The call DID run: do not repeat it; report the outcome with
 * `gate.outcome(run, attempt, status)` once the gate is back. */
export class OutcomeNotRecorded extends TallyError {
  /** @param {string} run @param {number} attempt @param {string} status @param {TallyError} error */
  constructor(run, attempt, status, error) {
    super(
      `run \`${run}\` attempt ${attempt} ran (status ${status}) but its outcome was not ` +
        `recorded: ${error.message}; do not repeat the call, report it with ` +
        `gate.outcome(${JSON.stringify(run)}, ${attempt}, ${JSON.stringify(status)}) once the gate is back`,
      { cause: error },
    );
    this.run = run;
    this.attempt = attempt;
    this.status = status;
    this.error = error;
  }
}

/** Characters that reorder or break what a terminal shows: bidi controls and the line
 * and paragraph separators. */
const BIDI = /[\u200e\u200f\u061c\u2028\u2029\u202a-\u202e\u2066-\u2069]/;

/** A peer's words safe to show a human: quotes, backslashes, control and bidi
 * characters escaped (`\"`, `\\`, `\uXXXX`), everything else as it is.
 * @param {string} text */
function shown(text) {
  let out = "";
  for (const c of String(text)) {
    const code = c.codePointAt(0);
    if (c === '"' || c === "\\") out += `\\${c}`;
    else if (code < 0x20 || (code >= 0x7f && code < 0xa0) || BIDI.test(c)) {
      out += `\\u${code.toString(16).padStart(4, "0")}`;
    } else out += c;
  }
  return out;
}

/** @param {Decision} d */
function denialMessage(d) {
  if (d.reason === "gate_unavailable") {
    return "the gate cannot record decisions (gate_unavailable): the call must not proceed; retry later";
  }
  const what = `the gate refused the call: ${d.reason} (action ${d.action})`;
  if (d.decision === "require_approval" || d.action === "ask") {
    const cause = d.cause ? `, cause ${d.cause}` : "";
    return `${what}${cause}: a human must approve before this call can proceed`;
  }
  if (d.action === "retry") {
    const after = d.retryAfterMs != null ? ` after ${d.retryAfterMs} ms` : " later";
    return `${what}: ask again${after}`;
  }
  if (d.action === "stop") {
    const who = d.deniedBy != null ? shown(d.deniedBy) : "an approver";
    const why = d.note != null ? ` (${who} denied it: "${shown(d.note)}")` : "";
    return `${what}: do not retry; stop the run and hand off${why}`;
  }
  return what;
}

/** @param {Decision} d @returns {Denied} */
function denied(d) {
  if (d.reason === "gate_unavailable") {
    return new GateUnavailable(d, denialMessage(d));
  }
  if (d.decision === "require_approval" || d.action === "ask") return new AskHuman(d);
  if (d.action === "stop") return new StopRun(d);
  if (d.action === "retry") return new RetryLater(d);
  return new Denied(d);
}

/** @param {string} socketPath @param {string} why @param {unknown} error @param {Decision} [d] */
function unavailable(socketPath, why, error, d) {
  d ??= new Decision({ decision: "deny", reason: "gate_unavailable", action: "retry" });
  return new GateUnavailable(
    d,
    `the tally gate at ${socketPath} is unavailable (${why}): the call must not proceed ` +
      "(fail closed); retry later, and check that `tally serve` is running",
    error,
  );
}

// ----------------------------------------------------------------------------- protocol

/** The fields that are set: the gate refuses unknown fields, and null means absent.
 * @param {Record<string, unknown>} fields */
function compact(fields) {
  /** @type {Record<string, unknown>} */
  const out = {};
  for (const [k, v] of Object.entries(fields)) if (v !== undefined && v !== null) out[k] = v;
  return out;
}

/** @param {Record<string, any>} o the check options, camelCase */
function checkFields(o) {
  return {
    operation: o.operation,
    args: o.args,
    args_preview: o.argsPreview,
    idempotency_key: o.idempotencyKey,
    target: o.target,
    channel: o.channel,
    depth: o.depth,
    reserve_cents: o.reserveCents,
    reserve_nanos: o.reserveNanos,
    remote_ref: o.remoteRef,
    credential: o.credential,
    timeout_ms: o.timeoutMs,
  };
}

/** @param {number} status @param {any} payload @param {Buffer} data */
function requestError(status, payload, data) {
  const err = payload && typeof payload === "object" ? payload.error : undefined;
  if (err && typeof err === "object") {
    return new RequestError(
      status,
      String(err.code ?? "error"),
      String(err.message ?? ""),
      err.field ?? null,
      payload,
    );
  }
  const snippet = JSON.stringify(data.subarray(0, 200).toString("utf8"));
  return new RequestError(status, "invalid_response", `unexpected reply: ${snippet}`);
}

/**
 * One request on its own connection (node's http client over the Unix socket), bounded
 * as a whole by `timeoutMs`.
 * @param {string} socketPath @param {string} method @param {string} path
 * @param {Buffer | undefined} data @param {number | null} timeoutMs
 * @returns {Promise<{status: number, data: Buffer}>}
 */
function exchange(socketPath, method, path, data, timeoutMs) {
  return new Promise((resolve, reject) => {
    /** @type {Record<string, string | number>} */
    const headers = { Accept: "application/json", Connection: "close" };
    if (data !== undefined) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = data.length;
    }
    // agent: false — a connection of its own, never a pooled keep-alive one.
    const req = http.request({ socketPath, method, path, headers, agent: false }, (res) => {
      /** @type {Buffer[]} */
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        if (timer) clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, data: Buffer.concat(chunks) });
      });
      res.on("error", fail);
      res.on("close", () => {
        if (!res.complete) fail(new Error("the connection closed before the whole answer came"));
      });
    });
    /** @param {unknown} e */
    function fail(e) {
      if (timer) clearTimeout(timer);
      reject(e);
    }
    const timer =
      timeoutMs == null
        ? null
        : setTimeout(() => {
            const e = new Error(`no answer within ${timeoutMs} ms`);
            Object.assign(e, { code: "ETIMEDOUT" });
            req.destroy(e);
          }, timeoutMs);
    req.on("error", fail);
    req.end(data);
  });
}

/**
 * @template T
 * @typedef {{method: string, path: string, body?: Record<string, unknown>, parse: (b: any) => T}} Request
 */

// ------------------------------------------------------------------------------- client

/** The client of the gate's agent socket. */
export class Gate {
  /**
   * @param {string} socketPath the agent socket (`tally serve --socket`)
   * @param {{timeoutMs?: number | null, worker?: string | null}} [options]
   *   `timeoutMs` bounds each request to the gate (default 10000; null for none);
   *   `worker` is sent with every start, check, outcome and stop.
   */
  constructor(socketPath, options = {}) {
    this.socketPath = String(socketPath);
    this.timeoutMs = options.timeoutMs === undefined ? 10000 : options.timeoutMs;
    this.worker = options.worker ?? null;
  }

  /**
   * @template T
   * @param {Request<T>} req
   * @returns {Promise<T>}
   */
  async #do(req) {
    const data = req.body === undefined ? undefined : Buffer.from(JSON.stringify(req.body), "utf8");
    let answer;
    try {
      answer = await exchange(this.socketPath, req.method, req.path, data, this.timeoutMs);
    } catch (e) {
      const err = /** @type {NodeJS.ErrnoException} */ (e);
      const why = err && err.code ? `${err.code}: ${err.message}` : String(err?.message ?? e);
      throw unavailable(this.socketPath, why, e);
    }
    const { status, data: text } = answer;
    let payload;
    try {
      payload = text.length ? JSON.parse(text.toString("utf8")) : null;
    } catch {
      payload = null;
    }
    if (status === 503) {
      // A check answers a decision-shaped body; anything else a typed error. Either way:
      // fail closed.
      const err = requestError(status, payload, text);
      const d =
        payload && typeof payload === "object" && payload.decision
          ? new Decision(payload)
          : undefined;
      throw unavailable(this.socketPath, `HTTP 503 ${err.code}: ${err.detail}`, err, d);
    }
    if (status >= 300 || !payload || typeof payload !== "object" || Array.isArray(payload)) {
      throw requestError(status, payload, text);
    }
    return req.parse(payload);
  }

  /**
   * Start a run; the answer carries the budget granted.
   * @param {string} run
   * @param {{goal?: string, budget?: Record<string, number>, parent?: string, credential?: string, continues?: string, depth?: number}} [options]
   * @returns {Promise<Run>}
   */
  startRun(run, options = {}) {
    const body = compact({
      run,
      goal: options.goal,
      budget: options.budget,
      parent: options.parent,
      credential: options.credential,
      continues: options.continues,
      depth: options.depth,
      worker: this.worker,
    });
    return this.#do({ method: "POST", path: "/v1/runs", body, parse: (b) => new Run(b) });
  }

  /**
   * Ask before one call. Resolves to the decision, allow or not (see
   * `Decision.raiseIfDenied`); rejects with `GateUnavailable` if the gate cannot decide,
   * `RequestError` if it refused the request.
   * @param {string} run @param {string} tool @param {Record<string, any>} options
   * @returns {Promise<Decision>}
   */
  check(run, tool, options) {
    const body = compact({
      run,
      tool,
      effect: options?.effect,
      worker: this.worker,
      ...checkFields(options ?? {}),
    });
    return this.#do({ method: "POST", path: "/v1/check", body, parse: (b) => new Decision(b) });
  }

  /**
   * Record what an allowed call did: `ok`, `error`, `rejected`, `timeout`, `running` or
   * `unknown`.
   * @param {string} run @param {number} attempt @param {string} status
   * `result`, if given, is sent only as its digest (`resultDigest`).
   * @param {{settledCents?: number, settledNanos?: number, remoteRef?: string, observed?: string, retryAfterMs?: number, result?: unknown}} [options]
   * @returns {Promise<Logged>}
   */
  outcome(run, attempt, status, options = {}) {
    const body = compact({
      run,
      attempt,
      status,
      settled_cents: options.settledCents,
      settled_nanos: options.settledNanos,
      remote_ref: options.remoteRef,
      observed: options.observed,
      retry_after_ms: options.retryAfterMs,
      result_digest: "result" in options ? resultDigest(options.result) : undefined,
      worker: this.worker,
    });
    return this.#do({ method: "POST", path: "/v1/outcome", body, parse: (b) => new Logged(b) });
  }

  /**
   * Stop the run, saying why: `completed` when its task is done, or the reason of the
   * refusal that ended it (`gate.stop(run, e.reason)` after a `StopRun`), which the
   * handoff reports.
   * @param {string} run @param {string} reason
   * @returns {Promise<Logged>}
   */
  stop(run, reason) {
    if (typeof reason !== "string" || reason === "") {
      throw new TypeError(
        'gate.stop(run, reason): say why the run ends: "completed", or the reason of the refusal that ended it',
      );
    }
    const body = compact({ reason, worker: this.worker });
    const path = `/v1/runs/${encodeURIComponent(run)}/stop`;
    return this.#do({ method: "POST", path, body, parse: (b) => new Logged(b) });
  }

  /**
   * Where the run stands: state, limits, held and settled nanodollars, calls allowed.
   * @param {string} run
   * @returns {Promise<RunStanding>}
   */
  run(run) {
    const path = `/v1/runs/${encodeURIComponent(run)}`;
    return this.#do({ method: "GET", path, parse: (b) => new RunStanding(b) });
  }

  /**
   * Ask, run `body` only if the gate allowed the call, and record its outcome: `ok` when
   * it resolves, `timeout` when it throws a timeout (`TimeoutError`, `AbortError`,
   * `ETIMEDOUT`, or anything once `call.signal` has fired), `error` otherwise (rethrown);
   * what the body marks with `call.ok()`, `call.unknown()` or `call.report()` wins.
   * Resolves to what `body` resolved to. A refusal rejects with its `Denied` subclass
   * before the body runs.
   * @template T
   * @param {string} run @param {string} tool @param {Record<string, any>} options
   * @param {(call: Call) => T | Promise<T>} body
   * @returns {Promise<T>}
   */
  async call(run, tool, options, body) {
    if (typeof body !== "function") {
      throw new TypeError("gate.call(run, tool, options, body): body must be a function");
    }
    const decision = (await this.check(run, tool, options)).raiseIfDenied();
    const controller = new AbortController();
    const timer =
      decision.timeoutMs == null
        ? null
        : setTimeout(() => {
            const why = `the call's ${decision.timeoutMs} ms from the gate ran out`;
            controller.abort(new DOMException(why, "TimeoutError"));
          }, decision.timeoutMs);
    timer?.unref();
    const call = new Call(run, tool, options?.effect, decision, controller.signal);
    /** @param {string} status */
    const record = async (status) => {
      call.logged = await this.outcome(run, call.attempt, status, call.details);
    };
    let result;
    try {
      result = await body(call);
    } catch (e) {
      const status = call.status ?? (isTimeout(e) || call.signal.aborted ? "timeout" : "error");
      try {
        await record(status);
      } catch (error) {
        if (!(error instanceof TallyError)) throw error;
        // Keep the body's own error; say that the outcome was not recorded.
        process.emitWarning(
          `tally: the outcome ${JSON.stringify(status)} of run ${JSON.stringify(run)} ` +
            `attempt ${call.attempt} was not recorded: ${error.message}`,
          { code: "TALLY_OUTCOME_NOT_RECORDED" },
        );
      }
      throw e;
    } finally {
      if (timer) clearTimeout(timer);
    }
    const status = call.status ?? "ok";
    try {
      await record(status);
    } catch (error) {
      if (error instanceof TallyError) {
        throw new OutcomeNotRecorded(run, call.attempt, status, error);
      }
      throw error;
    }
    return result;
  }
}

/** @param {unknown} e */
function isTimeout(e) {
  for (let err = e, depth = 0; err && typeof err === "object" && depth < 4; depth++) {
    const { name, code } = /** @type {{name?: unknown, code?: unknown}} */ (err);
    if (name === "TimeoutError" || name === "AbortError") return true;
    if (code === "ETIMEDOUT" || code === "ABORT_ERR" || code === "UND_ERR_CONNECT_TIMEOUT")
      return true;
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") return true;
    // fetch wraps what went wrong: TypeError("fetch failed", {cause}).
    err = /** @type {{cause?: unknown}} */ (err).cause;
  }
  return false;
}

/** One allowed call inside `gate.call(...)`: the decision, and the outcome to record. */
export class Call {
  /**
   * @param {string} run @param {string} tool @param {string} effect @param {Decision} decision
   * @param {AbortSignal} signal
   */
  constructor(run, tool, effect, decision, signal) {
    this.run = run;
    this.tool = tool;
    this.effect = effect;
    this.decision = decision;
    /** The attempt the gate gave this call. */
    this.attempt = /** @type {number} */ (decision.attempt);
    /** The longest the call may take, ms. */
    this.timeoutMs = decision.timeoutMs;
    /** Fires (with a `TimeoutError`) once `timeoutMs` has passed: give it to `fetch`. */
    this.signal = signal;
    /** @type {string | null} the status the body set, if any */
    this.status = null;
    /** @type {{settledCents?: number, settledNanos?: number, remoteRef?: string, observed?: string, retryAfterMs?: number}} */
    this.details = {};
    /** @type {Logged | null} the outcome's receipt, once recorded */
    this.logged = null;
  }

  /**
   * Set the outcome recorded when the body ends (`ok`, `error`, `rejected`, `timeout`,
   * `running`, `unknown`); it wins over what the body's end would imply.
   * @param {string} status
   * @param {{settledCents?: number, settledNanos?: number, remoteRef?: string, observed?: string, retryAfterMs?: number}} [details]
   */
  report(status, details = {}) {
    this.status = status;
    this.details = { ...details };
  }

  /** The call succeeded; `settledNanos` (or `settledCents`) is what it actually cost, `result` what it
   * returned (only its digest is sent: a changed result is progress, not a loop).
   * @param {{settledCents?: number, settledNanos?: number, remoteRef?: string, observed?: string, result?: unknown}} [details] */
  ok(details = {}) {
    this.report("ok", details);
  }

  /** Whether the call took effect is not known (a non-idempotent write is then not
   * repeated until a human checks).
   * @param {{remoteRef?: string, observed?: string}} [details] */
  unknown(details = {}) {
    this.report("unknown", details);
  }
}
