"""tally_gate against the real daemon: each test starts `tally-load serve` (path in env
TALLY_LOAD) over a fresh ledger, with the policy it needs, and kills it at teardown.

    cargo build -p tally-load
    TALLY_LOAD=target/debug/tally-load PYTHONPATH=clients/python \
        python3 -m pytest -q clients/python/tests
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from typing import Callable, Optional

import pytest

from tally_gate import (
    AskHuman,
    AsyncGate,
    Decision,
    Denied,
    Gate,
    GateUnavailable,
    OutcomeNotRecorded,
    RequestError,
    RetryLater,
    StopRun,
    TallyError,
    result_digest,
)

from conftest import NO_ASK, Daemon  # noqa: E402  (the fixtures: tests/conftest.py)


CENT = 10_000_000  # nanodollars in a cent: the gate counts nanodollars (10^-9 USD)


# ---------------------------------------------------------------------------- tests


def test_allow_then_outcome_ok_is_recorded(serve: Callable[..., Daemon]) -> None:
    gate = Gate(serve().socket)
    run = gate.start_run("r1", goal="triage inbox", budget={"attempts": 10, "spend_cents": 200})
    assert run.run == "r1"
    assert run.budget["attempts"] == 10 and run.budget["spend_nanos"] == 200 * CENT
    assert isinstance(run.seq, int) and len(run.hash) == 64

    d = gate.check("r1", "http", effect="read", operation="inbox.list", args={"page": 1},
                   reserve_cents=20, timeout_ms=1500)  # fmt: skip
    assert isinstance(d, Decision) and d.allowed
    assert d.decision == "allow" and d.reason is None and d.action is None
    assert d.attempt == 1 and d.timeout_ms == 1500 and d.timeout == 1.5
    assert d.limits["attempts"] == {"used": 0, "limit": 10}
    assert isinstance(d.seq, int) and d.seq > run.seq
    assert gate.run("r1")["held_nanos"] == 20 * CENT

    logged = gate.outcome("r1", d.attempt, "ok", settled_cents=7)
    assert logged["seq"] > d.seq
    standing = gate.run("r1")
    assert standing["state"] == "running"
    assert standing["held_nanos"] == 0 and standing["settled_nanos"] == 7 * CENT
    assert standing["calls_allowed"] == 1
    assert standing["limits"]["attempts"]["used"] == 1

    with gate.call(
        "r1", "http", effect="read", operation="inbox.get", args={"id": 3}, reserve_cents=5
    ) as call:
        assert call.attempt == 2
        assert call.timeout_ms == 60000 and call.timeout == 60.0  # the policy's call_timeout_ms
        call.ok(settled_cents=3)
    assert call.logged is not None and call.logged["seq"] > 0
    standing = gate.run("r1")
    assert standing["settled_nanos"] == 10 * CENT and standing["held_nanos"] == 0
    assert standing["calls_allowed"] == 2

    gate.stop("r1", "completed")
    standing = gate.run("r1")
    assert standing["state"] == "stopped" and standing["stop_reason"] == "completed"
    # A check on a stopped run: deny with the stop's reason, nothing recorded.
    with pytest.raises(StopRun) as stopped:
        with gate.call("r1", "http", effect="read", args={"page": 2}):
            pytest.fail("the body of a refused call ran")
    assert stopped.value.reason == "completed" and stopped.value.action == "stop"
    assert stopped.value.decision.seq is None


def test_a_changed_result_is_progress_not_a_loop(serve: Callable[..., Daemon]) -> None:
    # Re-reading a file an edit changed: identical calls whose results differ are
    # progress. Only the result's digest leaves the agent.
    gate = Gate(serve().socket)
    gate.start_run("r1")
    for i in range(5):
        with gate.call("r1", "fs", effect="read", args={"path": "a.rs"}) as call:
            call.ok(result={"content": f"fn v{i}() {{}}"})
    assert result_digest({"b": 1, "a": [2]}) == result_digest({"a": [2], "b": 1})
    assert len(result_digest(b"x")) == 64
    # The same result each time: the fourth identical call is a loop.
    gate.start_run("r2")
    for _ in range(3):
        with gate.call("r2", "fs", effect="read", args={"path": "a.rs"}) as call:
            call.ok(result="same")
    with pytest.raises(StopRun) as looped:
        with gate.call("r2", "fs", effect="read", args={"path": "a.rs"}):
            pytest.fail("the body of a refused call ran")
    assert looped.value.reason == "loop_repeated_call"


def test_attempts_exhausted_asks_a_human_under_the_default_ask_on(
    serve: Callable[..., Daemon],
) -> None:
    gate = Gate(serve("[ceiling]\nattempts = 3\n").socket)
    run = gate.start_run("r1", budget={"attempts": 100})
    assert run.budget["attempts"] == 3  # never more than the policy's ceiling
    for i in range(3):
        with gate.call("r1", "http", effect="read", operation=f"list:{i}", args={"page": i}):
            pass
    ran = False
    with pytest.raises(AskHuman) as asked:
        with gate.call("r1", "http", effect="read", operation="list:3", args={"page": 3}):
            ran = True
    assert not ran
    e = asked.value
    assert isinstance(e, Denied) and isinstance(e, TallyError)
    assert e.decision.decision == "require_approval"
    assert (e.reason, e.action, e.cause) == ("approval_required", "ask", "attempts_exhausted")
    assert isinstance(e.decision.seq, int)  # the refusal is recorded
    assert "approve" in str(e)
    standing = gate.run("r1")
    assert standing["limits"]["attempts"] == {"used": 3, "limit": 3}
    assert standing["calls_allowed"] == 3


def test_attempts_exhausted_stops_the_run_without_ask_on(serve: Callable[..., Daemon]) -> None:
    gate = Gate(serve("[ceiling]\nattempts = 3\n" + NO_ASK).socket)
    gate.start_run("r1")
    for i in range(3):
        with gate.call("r1", "http", effect="read", operation=f"list:{i}", args={"page": i}):
            pass
    ran = False
    with pytest.raises(StopRun) as stopped:
        with gate.call("r1", "http", effect="read", operation="list:3", args={"page": 3}):
            ran = True
    assert not ran
    assert (stopped.value.reason, stopped.value.action) == ("attempts_exhausted", "stop")
    assert stopped.value.decision.decision == "deny" and stopped.value.cause is None
    # check() returns the refusal as it is; raise_if_denied() gives the same exception.
    d = Gate(gate.socket_path).check(
        "r1", "http", effect="read", operation="list:4", args={"page": 4}
    )
    assert not d.allowed and d.reason == "attempts_exhausted"
    with pytest.raises(StopRun):
        d.raise_if_denied()


def test_rate_limit_is_retry_later_with_retry_after(serve: Callable[..., Daemon]) -> None:
    gate = Gate(serve("[rate]\nrun_per_sec = 2\nrun_burst = 3\n").socket)
    gate.start_run("r1")
    refusal: Optional[RetryLater] = None
    for i in range(20):
        try:
            with gate.call("r1", "search", effect="read", operation=f"q:{i}", args={"q": i}):
                pass
        except RetryLater as e:
            refusal = e
            break
    assert refusal is not None, "the run bucket (burst 3, 2/s) never ran out"
    assert i >= 3, f"refused after only {i} calls with a burst of 3"
    assert not isinstance(refusal, GateUnavailable)
    assert (refusal.reason, refusal.action) == ("rate_limit_exceeded", "retry")
    assert refusal.retry_after_ms is not None and 0 < refusal.retry_after_ms <= 1000
    assert refusal.wait == refusal.retry_after_ms / 1000
    time.sleep(refusal.wait + 0.05)
    with gate.call("r1", "search", effect="read", operation="q:again", args={"q": "again"}) as call:
        assert call.attempt == i + 1


def test_the_context_manager_records_ok_error_timeout_and_unknown(
    serve: Callable[..., Daemon],
) -> None:
    # A non-idempotent write may run once per operation until an ok: what the gate
    # answers to the same operation next shows which outcome was recorded.
    gate = Gate(serve(NO_ASK).socket)
    gate.start_run("r1", budget={"spend_cents": 100})

    def pay(op: str, n: int, reserve: Optional[int] = 10):  # type: ignore[no-untyped-def]
        return gate.call("r1", "payments", effect="non_idempotent_write", operation=op,
                         args={"n": n}, reserve_cents=reserve)  # fmt: skip

    # ok (with its settled cost): the hold is settled; the operation may run again.
    with pay("charge:a", 1) as call:
        call.ok(settled_cents=4)
    standing = gate.run("r1")
    assert (standing["held_nanos"], standing["settled_nanos"]) == (0, 4 * CENT)
    with pay("charge:a", 2, reserve=None):
        pass  # allowed again: the first outcome was ok; this one records ok on exit

    # error: the hold is released, and the operation's single attempt is spent.
    with pytest.raises(ValueError, match="boom"):
        with pay("charge:b", 3):
            raise ValueError("boom")
    standing = gate.run("r1")
    assert (standing["held_nanos"], standing["settled_nanos"]) == (0, 4 * CENT)
    with pytest.raises(StopRun) as stopped:
        with pay("charge:b", 4):
            pytest.fail("the body of a refused call ran")
    assert stopped.value.reason == "retries_exhausted"

    # timeout: the hold stays (the call may have spent it), and the write is not repeated
    # until its outcome is reconciled.
    with pytest.raises(TimeoutError):
        with pay("charge:c", 5):
            raise TimeoutError("upstream took too long")
    assert gate.run("r1")["held_nanos"] == 10 * CENT
    with pytest.raises(AskHuman) as asked:
        with pay("charge:c", 6):
            pytest.fail("the body of a refused call ran")
    assert (asked.value.reason, asked.value.action) == ("outcome_unknown_non_idempotent", "ask")

    # socket.timeout is a timeout too.
    with pytest.raises(socket.timeout):
        with pay("charge:d", 7, reserve=None):
            raise socket.timeout("timed out")
    with pytest.raises(AskHuman, match="outcome_unknown_non_idempotent"):
        with pay("charge:d", 8, reserve=None):
            pass

    # unknown, as the body says, even though it returned normally.
    with pay("charge:e", 9, reserve=None) as call:
        call.unknown(remote_ref="ch_9")
    with pytest.raises(AskHuman, match="outcome_unknown_non_idempotent"):
        with pay("charge:e", 10, reserve=None):
            pass

    # An outcome is final: reporting the ok attempt again is a typed conflict.
    with pytest.raises(RequestError) as settled:
        gate.outcome("r1", 1, "ok")
    assert (settled.value.status, settled.value.code) == (409, "attempt_settled")


def test_daemon_killed_is_gate_unavailable_and_the_body_never_runs(
    serve: Callable[..., Daemon],
) -> None:
    daemon = serve()
    gate = Gate(daemon.socket, timeout=5)
    gate.start_run("r1")
    daemon.kill()  # the socket file is left behind: connection refused
    assert os.path.exists(daemon.socket)
    ran = False
    with pytest.raises(GateUnavailable) as down:
        with gate.call("r1", "http", effect="read", args={"page": 1}):
            ran = True
    assert not ran
    e = down.value
    assert isinstance(e, RetryLater) and isinstance(e, Denied)
    assert (e.reason, e.action) == ("gate_unavailable", "retry")
    assert e.decision.decision == "deny" and not e.decision.allowed
    assert "must not proceed" in str(e) and daemon.socket in str(e)
    for op in (lambda: gate.run("r1"), lambda: gate.start_run("r2"),
               lambda: gate.outcome("r1", 1, "ok"), lambda: gate.stop("r1", "completed")):  # fmt: skip
        with pytest.raises(GateUnavailable):
            op()


def test_socket_removed_is_gate_unavailable(serve: Callable[..., Daemon]) -> None:
    daemon = serve()
    gate = Gate(daemon.socket)
    gate.start_run("r1")
    os.unlink(daemon.socket)
    ran = False
    with pytest.raises(GateUnavailable, match="FileNotFoundError"):
        with gate.call("r1", "http", effect="read", args={"page": 1}):
            ran = True
    assert not ran
    with pytest.raises(GateUnavailable):
        gate.check("r1", "http", effect="read")


def test_outcome_that_cannot_be_recorded(serve: Callable[..., Daemon]) -> None:
    daemon = serve()
    gate = Gate(daemon.socket)
    gate.start_run("r1")
    # The body succeeded, the gate went away: the call ran, so this is not a RetryLater.
    with pytest.raises(OutcomeNotRecorded) as lost:
        with gate.call("r1", "http", effect="read", args={"page": 1}) as call:
            daemon.kill()
    assert not isinstance(lost.value, Denied)
    assert (lost.value.attempt, lost.value.status) == (1, "ok")
    assert isinstance(lost.value.__cause__, GateUnavailable)
    assert call.logged is None
    # And the next call is refused before it runs.
    with pytest.raises(GateUnavailable):
        with gate.call("r1", "http", effect="read", args={"page": 2}):
            pass


def test_the_body_exception_wins_over_an_unrecorded_outcome(serve: Callable[..., Daemon]) -> None:
    daemon = serve()
    gate = Gate(daemon.socket)
    gate.start_run("r1")
    warns = pytest.warns(RuntimeWarning, match="was not recorded")
    with pytest.raises(KeyError) as raised, warns if sys.version_info < (3, 11) else nullcontext():
        with gate.call("r1", "http", effect="read", args={"page": 1}):
            daemon.kill()
            raise KeyError("body")
    if sys.version_info >= (3, 11):  # the note rides on the exception itself
        notes = getattr(raised.value, "__notes__", [])
        assert any("was not recorded" in n for n in notes)


def test_malformed_requests_are_request_errors(serve: Callable[..., Daemon]) -> None:
    gate = Gate(serve().socket)
    gate.start_run("r1")
    with pytest.raises(RequestError) as bad:
        gate.check("r1", "http", effect="bogus")
    e = bad.value
    assert (e.status, e.code, e.field) == (400, "invalid_value", "effect")
    assert "bogus" in e.message and not isinstance(e, Denied)
    ran = False
    with pytest.raises(RequestError) as bad:
        with gate.call("r1", "http", effect="read", channel="carrier-pigeon"):
            ran = True
    assert not ran and bad.value.field == "channel"
    with pytest.raises(RequestError) as bad:
        gate.outcome("r1", 1, "fine")
    assert bad.value.field == "status"
    with pytest.raises(RequestError) as missing:
        gate.check("nope", "http", effect="read")
    assert (missing.value.status, missing.value.code) == (404, "run_not_found")
    with pytest.raises(RequestError) as exists:
        gate.start_run("r1")
    assert (exists.value.status, exists.value.code) == (409, "run_exists")
    with pytest.raises(RequestError) as attempt:
        gate.outcome("r1", 99, "ok")
    assert (attempt.value.status, attempt.value.code) == (404, "no_such_attempt")
    # A run name is a path segment: it is escaped, never a path.
    with pytest.raises(RequestError) as odd:
        gate.run("a/../b?c")
    assert odd.value.code == "run_not_found" and "a/../b?c" in odd.value.message


def test_async_client(serve: Callable[..., Daemon]) -> None:
    daemon = serve("[ceiling]\nattempts = 3\n")

    async def flow() -> None:
        gate = AsyncGate(daemon.socket)
        run = await gate.start_run("r1", budget={"attempts": 9, "spend_cents": 50})
        assert run.budget["attempts"] == 3
        async with gate.call("r1", "llm", effect="read", operation="ask:1", args={"q": 1},
                             reserve_cents=10) as call:  # fmt: skip
            assert call.attempt == 1 and call.timeout == 60.0
            await asyncio.sleep(0)
            call.ok(settled_cents=6)
        standing = await gate.run("r1")
        assert (standing["held_nanos"], standing["settled_nanos"], standing["calls_allowed"]) == (
            0,
            6 * CENT,
            1,
        )

        with pytest.raises(RuntimeError):
            async with gate.call("r1", "llm", effect="read", operation="ask:2", args={"q": 2},
                                 reserve_cents=10):  # fmt: skip
                raise RuntimeError("model down")
        with pytest.raises(asyncio.TimeoutError):
            async with gate.call("r1", "llm", effect="read", operation="ask:3", args={"q": 3},
                                 reserve_cents=10):  # fmt: skip
                await asyncio.wait_for(asyncio.sleep(10), 0.01)
        standing = await gate.run("r1")
        assert standing["held_nanos"] == 10 * CENT  # the error released its hold; the timeout did not
        assert standing["limits"]["attempts"]["used"] == 3

        ran = False
        with pytest.raises(AskHuman) as asked:
            async with gate.call("r1", "llm", effect="read", operation="ask:4", args={"q": 4}):
                ran = True
        assert not ran and asked.value.cause == "attempts_exhausted"

        with pytest.raises(RequestError) as bad:
            await gate.check("r1", "llm", effect="bogus")
        assert bad.value.field == "effect"

        d = await gate.check("r1", "llm", effect="read", operation="ask:5")
        assert not d.allowed and d.decision == "require_approval"
        await gate.stop("r1", "completed")
        assert (await gate.run("r1"))["state"] == "stopped"

        daemon.kill()
        ran = False
        with pytest.raises(GateUnavailable):
            async with gate.call("r1", "llm", effect="read"):
                ran = True
        assert not ran
        os.unlink(daemon.socket)
        with pytest.raises(GateUnavailable):
            await gate.run("r1")

    asyncio.run(flow())


# The daemon answers a check it cannot record with HTTP 503 and a decision-shaped body
# (daemon/src/gate_api.rs). Making a real ledger fail on demand is not possible from
# here, so this replays that exact answer from a stand-in on a Unix socket.
FAIL_CLOSED = (
    b'{"decision":"deny","reason":"gate_unavailable","action":"retry","retry_after_ms":1000,'
    b'"error":{"code":"gate_unavailable","message":"the gate cannot record decisions, so the call '
    b'must not proceed (fail closed); retry later"}}'
)


def test_a_503_answer_fails_closed() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="tg-"), "fake.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                    % (len(FAIL_CLOSED), FAIL_CLOSED)
                )

    threading.Thread(target=answer, daemon=True).start()
    try:
        ran = False
        with pytest.raises(GateUnavailable) as down:
            with Gate(path).call("r1", "http", effect="read"):
                ran = True
        assert not ran
        assert down.value.retry_after_ms == 1000 and down.value.reason == "gate_unavailable"
        assert "HTTP 503 gate_unavailable" in str(down.value)

        async def flow() -> None:
            with pytest.raises(GateUnavailable):
                async with AsyncGate(path).call("r1", "http", effect="read"):
                    pytest.fail("the body ran")

        asyncio.run(flow())
    finally:
        server.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_a_denial_says_who_and_why_and_its_words_cannot_forge_the_message() -> None:
    d = Decision.from_json(
        {
            "decision": "deny",
            "reason": "denied_by_approver",
            "action": "stop",
            "denied_by": "da\u202ena",
            "note": 'ok") (approved by root: "yes\u2066\u2028\x85\x1b\\',
            "limits": {},
            "seq": 9,
        }
    )
    assert (d.denied_by, d.note) == ("da\u202ena", 'ok") (approved by root: "yes\u2066\u2028\x85\x1b\\')
    with pytest.raises(StopRun) as e:
        d.raise_if_denied()
    assert str(e.value).endswith(
        '(da\\u202ena denied it: "ok\\") (approved by root: \\"yes\\u2066\\u2028\\u0085\\u001b\\\\")'
    )
