"""A client for the tally gate (`tally serve`'s agent socket), standard library only.

Ask before every external call; the gate answers allow, deny or require_approval, and a
refusal carries exactly one action: stop, retry or ask. This module turns refusals into
typed exceptions and records the call's outcome for you::

    gate = Gate("/run/tally/agent.sock")
    gate.start_run("r1", goal="triage inbox", budget={"attempts": 10, "spend_cents": 200})
    with gate.call("r1", "http", effect="read", args={"page": 1}) as call:
        call.ok(settled_cents=fetch(timeout=call.timeout))

Every request goes on a new connection, so a `Gate` may be shared between threads. If
the gate cannot be reached, or cannot record the decision, the answer is
`GateUnavailable`: the call must not proceed (fail closed). The API is docs/GATE.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import http.client
import json
import socket
import warnings
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Callable, Dict, Generic, Mapping, Optional, Tuple, Type, TypeVar
from urllib.parse import quote

__version__ = "0.1.0"

T = TypeVar("T")

__all__ = [
    "AskHuman",
    "AsyncCall",
    "AsyncGate",
    "Call",
    "DEFAULT_RETRY_AFTER_S",
    "Decision",
    "Denied",
    "Gate",
    "GateUnavailable",
    "OutcomeNotRecorded",
    "RequestError",
    "RetryLater",
    "Run",
    "StopRun",
    "TallyError",
    "result_digest",
]

# What a call body may raise that means the call timed out (`asyncio.TimeoutError` and
# `socket.timeout` are `TimeoutError` only from Python 3.10/3.11 on).
_TIMEOUTS: Tuple[Type[BaseException], ...] = (
    TimeoutError,
    socket.timeout,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Decision:
    """The gate's answer to a check (`POST /v1/check`)."""

    decision: str
    """`allow`, `deny` or `require_approval`."""
    reason: Optional[str] = None
    """The reason code of a refusal (docs/GATE.md, "Reason codes")."""
    action: Optional[str] = None
    """What to do after a refusal: `stop`, `retry` or `ask`."""
    cause: Optional[str] = None
    """For `require_approval`: the limit that was reached."""
    denied_by: Optional[str] = None
    """For `denied_by_approver`: the approver who denied this call."""
    note: Optional[str] = None
    """For `denied_by_approver`: the approver's note (a human's words: escape them
    before showing them, as the exception's message does)."""
    retry_after_ms: Optional[int] = None
    """Back off this long before asking again."""
    timeout_ms: Optional[int] = None
    """For an allow: the call must end within this many ms."""
    attempt: Optional[int] = None
    """For an allow: the attempt to report the outcome under."""
    limits: Dict[str, Dict[str, int]] = field(default_factory=dict)
    """`{dimension: {"used": n, "limit": n}}` at decision time."""
    seq: Optional[int] = None
    """The decision's seq in the ledger (None: nothing was recorded)."""
    hash: Optional[str] = None
    """Its chain hash."""

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Decision":
        return cls(
            decision=str(body.get("decision")),
            reason=body.get("reason"),
            action=body.get("action"),
            cause=body.get("cause"),
            denied_by=body.get("denied_by"),
            note=body.get("note"),
            retry_after_ms=body.get("retry_after_ms"),
            timeout_ms=body.get("timeout_ms"),
            attempt=body.get("attempt"),
            limits=dict(body.get("limits") or {}),
            seq=body.get("seq"),
            hash=body.get("hash"),
        )

    @property
    def allowed(self) -> bool:
        """Whether the call may proceed."""
        return self.decision == "allow"

    @property
    def timeout(self) -> Optional[float]:
        """`timeout_ms` in seconds, for socket and HTTP library timeouts."""
        return None if self.timeout_ms is None else self.timeout_ms / 1000.0

    def raise_if_denied(self) -> "Decision":
        """Return this decision if it allows the call, else raise its `Denied` subclass."""
        if self.allowed:
            return self
        raise _denied(self)


@dataclass(frozen=True)
class Run:
    """A started run (`POST /v1/runs`): the budget *granted*, never more than asked."""

    run: str
    budget: Dict[str, int]
    policy: str
    seq: int
    hash: str

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Run":
        return cls(
            run=body["run"],
            budget=dict(body.get("budget") or {}),
            policy=body.get("policy", ""),
            seq=body["seq"],
            hash=body["hash"],
        )


# ------------------------------------------------------------------------ exceptions


class TallyError(Exception):
    """Anything this client raises."""


class Denied(TallyError):
    """The gate refused the call: it must not be made. See the subclasses for what to do."""

    def __init__(self, decision: Decision, message: Optional[str] = None) -> None:
        self.decision = decision
        self.reason = decision.reason
        self.action = decision.action
        self.cause = decision.cause
        self.retry_after_ms = decision.retry_after_ms
        super().__init__(message or _denial_message(decision))


class StopRun(Denied):
    """Action `stop`: the run is over for this call (budget, deadline, loop, scope). Do
    not retry it; stop the run with this reason (`gate.stop(run, e.reason)`, so the
    handoff says why) and hand off."""


#: Seconds to wait before asking again when the gate gave no `retry_after_ms` (a paused
#: run, whose end nobody knows; the gate down).
DEFAULT_RETRY_AFTER_S = 1.0


class RetryLater(Denied):
    """Action `retry`: ask again later (rate limit, backoff, breaker, paused run, the gate
    down). `wait` is how long, in seconds: the gate's `retry_after_ms`, or
    `DEFAULT_RETRY_AFTER_S` when it gave none (`retry_after_ms` is then None)."""

    @property
    def wait(self) -> float:
        """Seconds to wait before asking again (never None: `time.sleep(e.wait)`)."""
        if self.retry_after_ms is None:
            return DEFAULT_RETRY_AFTER_S
        return self.retry_after_ms / 1000.0


class AskHuman(Denied):
    """Action `ask` (or decision `require_approval`): a human must approve before this
    call can proceed; `cause` names the limit that was reached."""


class GateUnavailable(RetryLater):
    """The gate cannot be reached or cannot record decisions (fail closed): the call must
    not proceed. Retry later, once `tally serve` is running and healthy."""


class RequestError(TallyError):
    """The gate refused the request itself (HTTP 4xx/5xx with a typed error): nothing
    was decided. `code` is e.g. `invalid_json`, `run_not_found`, `run_exists`,
    `no_such_attempt`, `attempt_settled`, `not_owner`; `field` names the field at fault."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: Optional[str] = None,
        body: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.body = dict(body or {})
        where = f" (field `{field}`)" if field else ""
        super().__init__(f"HTTP {status} {code}{where}: {message}")


class OutcomeNotRecorded(TallyError):
    """A `with gate.call(...)` body finished, but its outcome could not be recorded (the
    error is `__cause__`). The call DID run: do not repeat it; report the outcome with
    `gate.outcome(run, attempt, status)` once the gate is back."""

    def __init__(self, run: str, attempt: int, status: str, error: TallyError) -> None:
        self.run = run
        self.attempt = attempt
        self.status = status
        self.error = error
        super().__init__(
            f"run `{run}` attempt {attempt} ran (status {status}) but its outcome was not "
            f"recorded: {error}; do not repeat the call, report it with "
            f"gate.outcome({run!r}, {attempt}, {status!r}) once the gate is back"
        )


def _denial_message(d: Decision) -> str:
    if d.reason == "gate_unavailable":
        return (
            "the gate cannot record decisions (gate_unavailable): "
            "the call must not proceed; retry later"
        )
    what = f"the gate refused the call: {d.reason} (action {d.action})"
    if d.decision == "require_approval" or d.action == "ask":
        cause = f", cause {d.cause}" if d.cause else ""
        return f"{what}{cause}: a human must approve before this call can proceed"
    if d.action == "retry":
        after = f" after {d.retry_after_ms} ms" if d.retry_after_ms is not None else " later"
        return f"{what}: ask again{after}"
    if d.action == "stop":
        why = ""
        if d.note is not None:
            who = _shown(d.denied_by) if d.denied_by is not None else "an approver"
            why = f" ({who} denied it: \"{_shown(d.note)}\")"
        return f"{what}: do not retry; stop the run and hand off{why}"
    return what


#: Characters that reorder or break what a terminal shows (bidi controls, line and
#: paragraph separators): escaped like control characters wherever a peer's words are
#: shown.
_BIDI = frozenset("\u200e\u200f\u061c\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
                  "\u2066\u2067\u2068\u2069")


def _shown(text: str) -> str:
    """`text` safe to show a human: quotes, backslashes, control and bidi characters
    escaped as `\\uXXXX` (or `\\"`, `\\\\`), everything else as it is."""
    out = []
    for c in str(text):
        if c in ('"', "\\"):
            out.append("\\" + c)
        elif ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in _BIDI:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def _denied(d: Decision) -> Denied:
    if d.reason == "gate_unavailable":
        return GateUnavailable(d)
    if d.decision == "require_approval" or d.action == "ask":
        return AskHuman(d)
    if d.action == "stop":
        return StopRun(d)
    if d.action == "retry":
        return RetryLater(d)
    return Denied(d)


def _unavailable(socket_path: str, why: object, d: Optional[Decision] = None) -> GateUnavailable:
    if d is None:
        d = Decision(decision="deny", reason="gate_unavailable", action="retry")
    return GateUnavailable(
        d,
        f"the tally gate at {socket_path} is unavailable ({why}): the call must not "
        "proceed (fail closed); retry later, and check that `tally serve` is running",
    )


# ------------------------------------------------------------------------- protocol


@dataclass(frozen=True)
class _Request(Generic[T]):
    method: str
    path: str
    body: Optional[Dict[str, Any]]
    parse: Callable[[Dict[str, Any]], T]


class _NoResult:
    """No result was given (`None` is a result like any other)."""


_NO_RESULT: Any = _NoResult()


def result_digest(result: Any) -> str:
    """The digest the gate keeps of a call's result (the result itself is never sent):
    SHA-256 of its JSON with sorted keys and no whitespace, as 64 lowercase hex. Only
    equality matters: identical calls whose results differ are progress, not a loop.
    Bytes and text are digested as they are."""
    if isinstance(result, bytes):
        data = result
    elif isinstance(result, str):
        data = result.encode("utf-8")
    else:
        data = json.dumps(
            result, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        ).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _compact(**fields: Any) -> Dict[str, Any]:
    """The fields that are set: the gate refuses unknown fields, and null means absent."""
    return {k: v for k, v in fields.items() if v is not None}


def _error(status: int, payload: Any, text: bytes) -> RequestError:
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        return RequestError(
            status,
            str(err.get("code", "error")),
            str(err.get("message", "")),
            err.get("field"),
            payload,
        )
    snippet = text[:200].decode("utf-8", "replace")
    return RequestError(status, "invalid_response", f"unexpected reply: {snippet!r}")


class _Base:
    """What `Gate` and `AsyncGate` share: request bodies and answer parsing."""

    def __init__(
        self, socket_path: str, timeout: Optional[float] = 10.0, worker: Optional[str] = None
    ) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout
        self.worker = worker

    def _interpret(self, req: _Request[T], status: int, data: bytes) -> T:
        try:
            payload: Any = json.loads(data) if data else None
        except ValueError:
            payload = None
        if status == 503:
            # A check answers a decision-shaped body; anything else a typed error. Either
            # way: fail closed.
            err = _error(status, payload, data)
            d = None
            if isinstance(payload, dict) and payload.get("decision"):
                d = Decision.from_json(payload)
            raise _unavailable(self.socket_path, f"HTTP 503 {err.code}: {err.message}", d)
        if status >= 300 or not isinstance(payload, dict):
            raise _error(status, payload, data)
        return req.parse(payload)

    def _start(
        self,
        run: str,
        goal: Optional[str],
        budget: Optional[Mapping[str, int]],
        parent: Optional[str],
        credential: Optional[str],
        continues: Optional[str],
        depth: Optional[int],
    ) -> _Request[Run]:
        body = _compact(
            run=run,
            goal=goal,
            budget=dict(budget) if budget is not None else None,
            parent=parent,
            credential=credential,
            continues=continues,
            depth=depth,
            worker=self.worker,
        )
        return _Request("POST", "/v1/runs", body, Run.from_json)

    def _check(
        self, run: str, tool: str, effect: str, options: Dict[str, Any]
    ) -> _Request[Decision]:
        body = _compact(run=run, tool=tool, effect=effect, worker=self.worker, **options)
        return _Request("POST", "/v1/check", body, Decision.from_json)

    def _outcome(
        self,
        run: str,
        attempt: int,
        status: str,
        settled_cents: Optional[int],
        remote_ref: Optional[str],
        observed: Optional[str],
        retry_after_ms: Optional[int],
        result: Any = _NO_RESULT,
        settled_nanos: Optional[int] = None,
    ) -> _Request[Dict[str, Any]]:
        body = _compact(
            run=run,
            attempt=attempt,
            status=status,
            settled_cents=settled_cents,
            settled_nanos=settled_nanos,
            remote_ref=remote_ref,
            observed=observed,
            retry_after_ms=retry_after_ms,
            result_digest=None if result is _NO_RESULT else result_digest(result),
            worker=self.worker,
        )
        return _Request("POST", "/v1/outcome", body, dict)

    def _stop(self, run: str, reason: str) -> _Request[Dict[str, Any]]:
        body = _compact(reason=reason, worker=self.worker)
        return _Request("POST", f"/v1/runs/{quote(run, safe='')}/stop", body, dict)

    def _run(self, run: str) -> _Request[Dict[str, Any]]:
        return _Request("GET", f"/v1/runs/{quote(run, safe='')}", None, dict)


def _encode(body: Optional[Dict[str, Any]]) -> Optional[bytes]:
    return None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")


def _check_options(
    args: Any,
    operation: Optional[str],
    idempotency_key: Optional[str],
    target: Optional[str],
    reserve_cents: Optional[int],
    reserve_nanos: Optional[int],
    remote_ref: Optional[str],
    timeout_ms: Optional[int],
    args_preview: Optional[str],
    channel: Optional[str],
    depth: Optional[int],
    credential: Optional[str],
) -> Dict[str, Any]:
    return dict(
        args=args,
        operation=operation,
        idempotency_key=idempotency_key,
        target=target,
        reserve_cents=reserve_cents,
        reserve_nanos=reserve_nanos,
        remote_ref=remote_ref,
        timeout_ms=timeout_ms,
        args_preview=args_preview,
        channel=channel,
        depth=depth,
        credential=credential,
    )


# ----------------------------------------------------------------------- sync client


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket."""

    def __init__(self, socket_path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Gate(_Base):
    """The synchronous client of the gate's agent socket.

    `timeout` bounds each request to the gate (seconds, None for none); `worker` is sent
    with every start, check, outcome and stop.
    """

    def _do(self, req: _Request[T]) -> T:
        data = _encode(req.body)
        headers = {"Accept": "application/json", "Connection": "close"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn = _UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.request(req.method, req.path, body=data, headers=headers)
            resp = conn.getresponse()
            status, text = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise _unavailable(self.socket_path, f"{type(e).__name__}: {e}") from e
        finally:
            conn.close()
        return self._interpret(req, status, text)

    def start_run(
        self,
        run: str,
        goal: Optional[str] = None,
        budget: Optional[Mapping[str, int]] = None,
        parent: Optional[str] = None,
        credential: Optional[str] = None,
        continues: Optional[str] = None,
        depth: Optional[int] = None,
    ) -> Run:
        """Start a run; the answer carries the budget granted."""
        return self._do(self._start(run, goal, budget, parent, credential, continues, depth))

    def check(
        self,
        run: str,
        tool: str,
        *,
        effect: str,
        args: Any = None,
        operation: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        target: Optional[str] = None,
        reserve_cents: Optional[int] = None,
        reserve_nanos: Optional[int] = None,
        remote_ref: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        args_preview: Optional[str] = None,
        channel: Optional[str] = None,
        depth: Optional[int] = None,
        credential: Optional[str] = None,
    ) -> Decision:
        """Ask before one call. Returns the decision, allow or not (see
        `Decision.raise_if_denied`); raises `GateUnavailable` if the gate cannot decide."""
        options = _check_options(
            args, operation, idempotency_key, target, reserve_cents, reserve_nanos, remote_ref,
            timeout_ms, args_preview, channel, depth, credential,
        )  # fmt: skip
        return self._do(self._check(run, tool, effect, options))

    def outcome(
        self,
        run: str,
        attempt: int,
        status: str,
        settled_cents: Optional[int] = None,
        remote_ref: Optional[str] = None,
        observed: Optional[str] = None,
        retry_after_ms: Optional[int] = None,
        result: Any = _NO_RESULT,
        settled_nanos: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Record what an allowed call did: `ok`, `error`, `rejected`, `timeout`,
        `running` or `unknown`. Returns `{seq, hash, limits}`."""
        req = self._outcome(
            run, attempt, status, settled_cents, remote_ref, observed, retry_after_ms, result,
            settled_nanos,
        )
        return self._do(req)

    def stop(self, run: str, reason: str) -> Dict[str, Any]:
        """Stop the run, saying why: `"completed"` when its task is done, or the reason
        of the refusal that ended it (`gate.stop(run, e.reason)` after `StopRun`), which
        the handoff reports. Returns `{seq, hash, limits}`."""
        return self._do(self._stop(run, reason))

    def run(self, run: str) -> Dict[str, Any]:
        """Where the run stands: state, limits, held_nanos, settled_nanos (nanodollars,
        10^-9 USD), calls_allowed..."""
        return self._do(self._run(run))

    def call(
        self,
        run: str,
        tool: str,
        *,
        effect: str,
        args: Any = None,
        operation: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        target: Optional[str] = None,
        reserve_cents: Optional[int] = None,
        reserve_nanos: Optional[int] = None,
        remote_ref: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        args_preview: Optional[str] = None,
        channel: Optional[str] = None,
        depth: Optional[int] = None,
        credential: Optional[str] = None,
    ) -> "Call":
        """`with gate.call(...) as call:` checks on entry (raising the `Denied` subclass,
        so the body never runs) and records the outcome on exit."""
        options = _check_options(
            args, operation, idempotency_key, target, reserve_cents, reserve_nanos, remote_ref,
            timeout_ms, args_preview, channel, depth, credential,
        )  # fmt: skip
        return Call(self, run, tool, effect, options)


# ---------------------------------------------------------------------- async client


class _ProtocolError(Exception):
    pass


async def _exchange(
    socket_path: str, method: str, path: str, data: Optional[bytes]
) -> Tuple[int, bytes]:
    """One HTTP/1.1 request and its Content-Length (or read-to-close) response."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
        head += "Connection: close\r\n"
        if data is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        writer.write(head.encode("ascii") + b"\r\n" + (data or b""))
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _ProtocolError(f"bad status line {lines[0]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise _ProtocolError(f"unexpected Transfer-Encoding {headers['transfer-encoding']!r}")
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()
        return status, body
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


class AsyncGate(_Base):
    """The asyncio client: the same API as `Gate`, with `await` (and `async with
    agate.call(...)`)."""

    async def _do(self, req: _Request[T]) -> T:
        data = _encode(req.body)
        try:
            status, text = await asyncio.wait_for(
                _exchange(self.socket_path, req.method, req.path, data), self.timeout
            )
        except asyncio.TimeoutError as e:
            raise _unavailable(self.socket_path, f"no answer within {self.timeout} s") from e
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, _ProtocolError) as e:
            raise _unavailable(self.socket_path, f"{type(e).__name__}: {e}") from e
        return self._interpret(req, status, text)

    async def start_run(
        self,
        run: str,
        goal: Optional[str] = None,
        budget: Optional[Mapping[str, int]] = None,
        parent: Optional[str] = None,
        credential: Optional[str] = None,
        continues: Optional[str] = None,
        depth: Optional[int] = None,
    ) -> Run:
        """Start a run; the answer carries the budget granted."""
        return await self._do(self._start(run, goal, budget, parent, credential, continues, depth))

    async def check(
        self,
        run: str,
        tool: str,
        *,
        effect: str,
        args: Any = None,
        operation: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        target: Optional[str] = None,
        reserve_cents: Optional[int] = None,
        reserve_nanos: Optional[int] = None,
        remote_ref: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        args_preview: Optional[str] = None,
        channel: Optional[str] = None,
        depth: Optional[int] = None,
        credential: Optional[str] = None,
    ) -> Decision:
        """Ask before one call (see `Gate.check`)."""
        options = _check_options(
            args, operation, idempotency_key, target, reserve_cents, reserve_nanos, remote_ref,
            timeout_ms, args_preview, channel, depth, credential,
        )  # fmt: skip
        return await self._do(self._check(run, tool, effect, options))

    async def outcome(
        self,
        run: str,
        attempt: int,
        status: str,
        settled_cents: Optional[int] = None,
        remote_ref: Optional[str] = None,
        observed: Optional[str] = None,
        retry_after_ms: Optional[int] = None,
        result: Any = _NO_RESULT,
        settled_nanos: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Record what an allowed call did (see `Gate.outcome`)."""
        req = self._outcome(
            run, attempt, status, settled_cents, remote_ref, observed, retry_after_ms, result,
            settled_nanos,
        )
        return await self._do(req)

    async def stop(self, run: str, reason: str) -> Dict[str, Any]:
        """Stop the run, saying why (see `Gate.stop`)."""
        return await self._do(self._stop(run, reason))

    async def run(self, run: str) -> Dict[str, Any]:
        """Where the run stands."""
        return await self._do(self._run(run))

    def call(
        self,
        run: str,
        tool: str,
        *,
        effect: str,
        args: Any = None,
        operation: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        target: Optional[str] = None,
        reserve_cents: Optional[int] = None,
        reserve_nanos: Optional[int] = None,
        remote_ref: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        args_preview: Optional[str] = None,
        channel: Optional[str] = None,
        depth: Optional[int] = None,
        credential: Optional[str] = None,
    ) -> "AsyncCall":
        """`async with agate.call(...) as call:` (see `Gate.call`)."""
        options = _check_options(
            args, operation, idempotency_key, target, reserve_cents, reserve_nanos, remote_ref,
            timeout_ms, args_preview, channel, depth, credential,
        )  # fmt: skip
        return AsyncCall(self, run, tool, effect, options)


# ------------------------------------------------------------------- context managers


class _CallState:
    """One gated call: the decision on entry, the outcome to record on exit.

    On exit the outcome is, in order: what the body marked (`ok()`, `unknown()`,
    `report()`); else `ok` if the body returned; `timeout` if it raised a timeout;
    `error` if it raised another exception; `unknown` if it was interrupted
    (KeyboardInterrupt, task cancellation: how far the call got is not known).
    """

    def __init__(self, run: str, tool: str, effect: str, options: Dict[str, Any]) -> None:
        self.run = run
        self.tool = tool
        self.effect = effect
        self._options = options
        self.decision: Optional[Decision] = None
        self.status: Optional[str] = None
        self.settled_cents: Optional[int] = None
        self.settled_nanos: Optional[int] = None
        self.remote_ref: Optional[str] = None
        self.observed: Optional[str] = None
        self.retry_after_ms: Optional[int] = None
        self.result: Any = _NO_RESULT
        self.logged: Optional[Dict[str, Any]] = None
        """The outcome's receipt `{seq, hash, limits}`, once recorded."""

    @property
    def attempt(self) -> int:
        """The attempt the gate gave this call."""
        if self.decision is None or self.decision.attempt is None:
            raise RuntimeError("the call has not been allowed yet: use it inside `with`")
        return self.decision.attempt

    @property
    def timeout_ms(self) -> Optional[int]:
        """The longest the call may take, ms."""
        return None if self.decision is None else self.decision.timeout_ms

    @property
    def timeout(self) -> Optional[float]:
        """The longest the call may take, seconds."""
        return None if self.decision is None else self.decision.timeout

    def report(
        self,
        status: str,
        *,
        settled_cents: Optional[int] = None,
        remote_ref: Optional[str] = None,
        observed: Optional[str] = None,
        retry_after_ms: Optional[int] = None,
        result: Any = _NO_RESULT,
        settled_nanos: Optional[int] = None,
    ) -> None:
        """Set the outcome recorded on exit (`ok`, `error`, `rejected`, `timeout`,
        `running`, `unknown`); it wins over what the exit would imply. `result`, if
        given, is kept only as its digest (`result_digest`)."""
        self.status = status
        self.settled_cents = settled_cents
        self.settled_nanos = settled_nanos
        self.remote_ref = remote_ref
        self.observed = observed
        self.retry_after_ms = retry_after_ms
        self.result = result

    def ok(
        self,
        settled_cents: Optional[int] = None,
        remote_ref: Optional[str] = None,
        observed: Optional[str] = None,
        result: Any = _NO_RESULT,
        *,
        settled_nanos: Optional[int] = None,
    ) -> None:
        """The call succeeded; `settled_nanos` (nanodollars, 10^-9 USD) or `settled_cents`
        is what it actually cost, `result` what it returned (only its digest is sent: a
        changed result is progress, not a loop)."""
        self.report(
            "ok", settled_cents=settled_cents, remote_ref=remote_ref, observed=observed,
            result=result, settled_nanos=settled_nanos,
        )  # fmt: skip

    def unknown(self, remote_ref: Optional[str] = None, observed: Optional[str] = None) -> None:
        """Whether the call took effect is not known (a non-idempotent write is then not
        repeated until a human checks)."""
        self.report("unknown", remote_ref=remote_ref, observed=observed)

    def _exit_status(self, exc: Optional[BaseException]) -> str:
        if self.status is not None:
            return self.status
        if exc is None:
            return "ok"
        if isinstance(exc, _TIMEOUTS):
            return "timeout"
        if isinstance(exc, Exception):
            return "error"
        return "unknown"

    def _outcome_args(self, status: str) -> Tuple[Any, ...]:
        return (
            self.run, self.attempt, status, self.settled_cents, self.remote_ref,
            self.observed, self.retry_after_ms, self.result, self.settled_nanos,
        )  # fmt: skip

    def _failed(self, status: str, error: TallyError, exc: Optional[BaseException]) -> None:
        if exc is None:
            raise OutcomeNotRecorded(self.run, self.attempt, status, error) from error
        # Keep the body's own exception; say that the outcome was not recorded.
        note = (
            f"tally: the outcome {status!r} of run {self.run!r} attempt {self.attempt} "
            f"was not recorded: {error}"
        )
        add_note = getattr(exc, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note(note)
        else:
            warnings.warn(note, RuntimeWarning, stacklevel=3)


class Call(_CallState):
    """`with gate.call(...) as call:` (see `Gate.call`)."""

    def __init__(
        self, gate: Gate, run: str, tool: str, effect: str, options: Dict[str, Any]
    ) -> None:
        super().__init__(run, tool, effect, options)
        self._gate = gate

    def __enter__(self) -> "Call":
        req = self._gate._check(self.run, self.tool, self.effect, self._options)
        self.decision = self._gate._do(req).raise_if_denied()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        status = self._exit_status(exc)
        try:
            self.logged = self._gate.outcome(*self._outcome_args(status))
        except TallyError as error:
            self._failed(status, error, exc)


class AsyncCall(_CallState):
    """`async with agate.call(...) as call:` (see `AsyncGate.call`)."""

    def __init__(
        self, gate: AsyncGate, run: str, tool: str, effect: str, options: Dict[str, Any]
    ) -> None:
        super().__init__(run, tool, effect, options)
        self._gate = gate

    async def __aenter__(self) -> "AsyncCall":
        req = self._gate._check(self.run, self.tool, self.effect, self._options)
        decision: Decision = await self._gate._do(req)
        self.decision = decision.raise_if_denied()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        status = self._exit_status(exc)
        try:
            self.logged = await self._gate.outcome(*self._outcome_args(status))
        except TallyError as error:
            self._failed(status, error, exc)
