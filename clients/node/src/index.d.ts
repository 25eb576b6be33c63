// Types of tally-gate (src/index.mjs), the Node client of the tally gate's agent socket.
// test/types.test.mjs checks that every value declared here is exported by the module,
// and the reverse, and that the declared methods exist.

/** The package version. */
export declare const VERSION: string;

/** `{dimension: {used, limit}}`, e.g. `{attempts: {used: 1, limit: 10}}`. */
export type Limits = Record<string, { used: number; limit: number }>;

/** A budget by dimension: `attempts`, `deadline_ms`, `spend_nanos` (or `spend_cents`), `side_effects`, `polls`, `depth`. */
export type Budget = Partial<
  Record<"attempts" | "deadline_ms" | "spend_nanos" | "spend_cents" | "side_effects" | "polls" | "depth", number>
>;

/** The effect class of a call. */
export type Effect = "read" | "idempotent_write" | "non_idempotent_write";

/** What an allowed call did. */
export type OutcomeStatus = "ok" | "error" | "rejected" | "timeout" | "running" | "unknown";

/** What to do after a refusal. */
export type Action = "stop" | "retry" | "ask";

/** The gate's reason codes (docs/GATE.md, "Reason codes"). */
export type Reason =
  | "attempts_exhausted"
  | "retries_exhausted"
  | "principal_budget_exceeded"
  | "budget_exceeded"
  | "reservation_insufficient"
  | "run_deadline_exhausted"
  | "rate_limit_exceeded"
  | "upstream_backoff"
  | "loop_repeated_call"
  | "poll_allowance_exhausted"
  | "chain_depth_exceeded"
  | "side_effect_limit_exceeded"
  | "circuit_open"
  | "tool_blocked"
  | "scope_violation"
  | "approval_required"
  | "approval_expired"
  | "approval_mismatch"
  | "outcome_unknown_non_idempotent"
  | "killed_by_operator"
  | "run_paused"
  | "gate_unavailable"
  | "request_refused"
  | "refill_without_approval"
  | "completed"
  | "denied_by_approver";

/** Why a run ends, as an agent says it: `completed`, or the reason of the refusal that
 * ended it (only the operator kills). */
export type StopReason = Exclude<Reason, "killed_by_operator">;

/** Milliseconds `RetryLater.waitMs` gives when the gate gave no `retryAfterMs`. */
export declare const DEFAULT_RETRY_AFTER_MS: number;

export interface GateOptions {
  /** Bounds each request to the gate, ms (default 10000; null for none). */
  timeoutMs?: number | null;
  /** Sent with every start, check, outcome and stop. */
  worker?: string | null;
}

export interface StartOptions {
  goal?: string;
  budget?: Budget;
  parent?: string;
  credential?: string;
  continues?: string;
  depth?: number;
}

export interface CheckOptions {
  effect: Effect;
  operation?: string;
  args?: unknown;
  argsPreview?: string;
  idempotencyKey?: string;
  target?: string;
  channel?: string;
  depth?: number;
  reserveCents?: number;
  /** Nanodollars (10^-9 USD) to reserve; give this or `reserveCents`. */
  reserveNanos?: number;
  remoteRef?: string;
  credential?: string;
  timeoutMs?: number;
}

export interface OutcomeDetails {
  settledCents?: number;
  /** What the call cost, nanodollars; give this or `settledCents`. */
  settledNanos?: number;
  remoteRef?: string;
  observed?: string;
  retryAfterMs?: number;
  /** What the call returned: sent only as its digest (a changed result is progress). */
  result?: unknown;
}

/** SHA-256 of the result's sorted-key JSON (strings and bytes as they are), 64 hex. */
export declare function resultDigest(result: unknown): string;

/** The gate's answer to a check (`POST /v1/check`). */
export declare class Decision {
  constructor(body: Record<string, unknown>);
  /** `allow`, `deny` or `require_approval`. */
  readonly decision: "allow" | "deny" | "require_approval" | string;
  /** The reason code of a refusal (docs/GATE.md, "Reason codes"). */
  readonly reason: string | null;
  readonly action: Action | null;
  /** For `require_approval`: the limit that was reached. */
  readonly cause: string | null;
  /** For `denied_by_approver`: the approver who denied this call. */
  readonly deniedBy: string | null;
  /** For `denied_by_approver`: the approver's note (escape it before showing it). */
  readonly note: string | null;
  readonly retryAfterMs: number | null;
  /** For an allow: the call must end within this many ms. */
  readonly timeoutMs: number | null;
  /** For an allow: the attempt to report the outcome under. */
  readonly attempt: number | null;
  readonly limits: Limits;
  /** The decision's seq in the ledger (null: nothing was recorded). */
  readonly seq: number | null;
  readonly hash: string | null;
  /** The answer as the gate sent it. */
  readonly body: Record<string, unknown>;
  /** Whether the call may proceed. */
  readonly allowed: boolean;
  /** This decision if it allows the call; else throws its `Denied` subclass. */
  raiseIfDenied(): this;
}

/** A started run: the budget *granted*, never more than asked. */
export declare class Run {
  constructor(body: Record<string, unknown>);
  readonly run: string;
  readonly budget: Budget;
  readonly policy: string;
  readonly seq: number;
  readonly hash: string;
  readonly body: Record<string, unknown>;
}

/** What an outcome or a stop recorded. */
export declare class Logged {
  constructor(body: Record<string, unknown>);
  readonly seq: number;
  readonly hash: string;
  readonly limits: Limits;
  readonly body: Record<string, unknown>;
}

/** Where a run stands (`GET /v1/runs/{run}`). */
export declare class RunStanding {
  constructor(body: Record<string, unknown>);
  readonly run: string;
  readonly state: "running" | "paused" | "stopped";
  readonly stopReason: string | null;
  readonly goal: string | null;
  readonly budget: Budget;
  readonly limits: Limits;
  /** Nanodollars (10^-9 USD) held by calls not yet settled. */
  readonly heldNanos: number;
  /** Nanodollars settled. */
  readonly settledNanos: number;
  readonly callsAllowed: number;
  readonly atMs: number;
  readonly grantsUnused: number;
  readonly ownerUid: number | null;
  readonly body: Record<string, unknown>;
}

/** One allowed call inside `gate.call(...)`. */
export declare class Call {
  constructor(run: string, tool: string, effect: Effect, decision: Decision, signal: AbortSignal);
  readonly run: string;
  readonly tool: string;
  readonly effect: Effect;
  readonly decision: Decision;
  /** The attempt the gate gave this call. */
  readonly attempt: number;
  /** The longest the call may take, ms. */
  readonly timeoutMs: number | null;
  /** Fires (with a `TimeoutError`) once `timeoutMs` has passed: give it to `fetch`. */
  readonly signal: AbortSignal;
  /** The status the body set, if any. */
  readonly status: OutcomeStatus | null;
  readonly details: OutcomeDetails;
  /** The outcome's receipt, once recorded. */
  readonly logged: Logged | null;
  /** Set the outcome recorded when the body ends; it wins over what the end implies. */
  report(status: OutcomeStatus, details?: OutcomeDetails): void;
  /** The call succeeded; `settledNanos` (or `settledCents`) is what it actually cost. */
  ok(details?: { settledCents?: number; settledNanos?: number; remoteRef?: string; observed?: string; result?: unknown }): void;
  /** Whether the call took effect is not known. */
  unknown(details?: { remoteRef?: string; observed?: string }): void;
}

/** The client of the gate's agent socket; each request on a connection of its own. */
export declare class Gate {
  constructor(socketPath: string, options?: GateOptions);
  readonly socketPath: string;
  readonly timeoutMs: number | null;
  readonly worker: string | null;
  /** Start a run; the answer carries the budget granted. */
  startRun(run: string, options?: StartOptions): Promise<Run>;
  /** Ask before one call: the decision, allow or not (never throws a `Denied`, except `GateUnavailable`). */
  check(run: string, tool: string, options: CheckOptions): Promise<Decision>;
  /** Record what an allowed call did. */
  outcome(
    run: string,
    attempt: number,
    status: OutcomeStatus,
    options?: OutcomeDetails,
  ): Promise<Logged>;
  /** Stop the run, saying why: `completed` when its task is done, or the reason of the
   * refusal that ended it (`gate.stop(run, e.reason)` after a `StopRun`), which the
   * handoff reports. */
  stop(run: string, reason: StopReason): Promise<Logged>;
  /** Where the run stands. */
  run(run: string): Promise<RunStanding>;
  /** Ask; run `body` only if allowed; record `ok`, `timeout` or `error` (rethrown) as it ends. */
  call<T>(
    run: string,
    tool: string,
    options: CheckOptions,
    body: (call: Call) => T | Promise<T>,
  ): Promise<T>;
}

/** Anything this client throws. */
export declare class TallyError extends Error {
  constructor(message: string, options?: ErrorOptions);
}

/** The gate refused the call: it must not be made. */
export declare class Denied extends TallyError {
  constructor(decision: Decision, message?: string);
  readonly decision: Decision;
  readonly reason: Reason | null;
  readonly action: Action | null;
  /** The limit a `require_approval` names (not Error's chaining cause). */
  readonly cause: string | null;
  readonly retryAfterMs: number | null;
}

/** Action `stop`: never retry the call; stop the run with `reason` and hand off. */
export declare class StopRun extends Denied {
  readonly reason: StopReason;
}

/** Action `retry`: ask again after `waitMs`. */
export declare class RetryLater extends Denied {
  /** How long to wait before asking again: the gate's `retryAfterMs`, or
   * `DEFAULT_RETRY_AFTER_MS` when it gave none (a paused run, the gate down). Never null. */
  readonly waitMs: number;
}

/** Action `ask` (or `require_approval`): a human must approve first. */
export declare class AskHuman extends Denied {}

/** The gate is down or cannot record (HTTP 503): fail closed, retry later. */
export declare class GateUnavailable extends RetryLater {
  constructor(decision: Decision, message: string, error?: unknown);
  /** What went wrong underneath: a socket error, or the `RequestError` of an HTTP 503. */
  readonly error: unknown;
}

/** The gate refused the request itself: nothing was decided. */
export declare class RequestError extends TallyError {
  constructor(
    status: number,
    code: string,
    detail: string,
    field?: string | null,
    body?: Record<string, unknown> | null,
  );
  readonly status: number;
  /** `invalid_json`, `run_not_found`, `run_exists`, `no_such_attempt`, `attempt_settled`, `not_owner`, ... */
  readonly code: string;
  /** The gate's own message (`message` is `HTTP {status} {code} (field ...): {detail}`). */
  readonly detail: string;
  /** The request field at fault. */
  readonly field: string | null;
  readonly body: Record<string, unknown>;
}

/** The body ran, but its outcome could not be recorded: do not repeat the call. */
export declare class OutcomeNotRecorded extends TallyError {
  constructor(run: string, attempt: number, status: string, error: TallyError);
  readonly run: string;
  readonly attempt: number;
  readonly status: string;
  readonly error: TallyError;
}
