"""README.md's example, as a user copies it, against the real daemon.

The example's placeholders (`post_export`, `escalate`, `hand_off`) are stand-ins that
record what they were given, and `time.sleep` records how long it was asked to wait. The
socket path is the only change to the text. Between the example's start and its check the
test can act on the gate (pause the run from the operator socket, stop the daemon) through
a proxy socket that forwards every byte to the real one.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import pytest

from conftest import NO_ASK, Daemon
from tally_gate import Gate

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    """README's first ```python block."""
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md has no ```python block"
    code = block.group(1)
    assert '"/run/tally/agent.sock"' in code and "from tally_gate import" in code
    lines = len(code.rstrip().splitlines())
    assert lines <= 20, f"README's example is {lines} lines: keep it short enough to copy"
    return code


class Proxy:
    """A Unix socket that forwards each connection to `target`; before it forwards a
    `POST /v1/check`, it calls `before_check` once (which may stop the gate)."""

    def __init__(self, directory: str, target: str, before_check: Callable[[], None]) -> None:
        self.path = str(Path(directory) / "proxy.sock")
        self.target = target
        self.before_check: Optional[Callable[[], None]] = before_check
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            if head.startswith(b"POST /v1/check ") and self.before_check:
                act, self.before_check = self.before_check, None
                act()
            try:
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self.target)
            except OSError:
                return  # the gate is gone: the client's connection closes unanswered
            with upstream:
                upstream.sendall(head)
                threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
                self._pipe(upstream, conn)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()


def pause(daemon: Daemon, run: str) -> Callable[[], None]:
    def act() -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(daemon.operator_socket)
            s.sendall(
                f"POST /v1/runs/{run}/pause HTTP/1.1\r\nHost: tally\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            reply = s.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200"), reply

    return act


def run_example(
    daemon: Daemon,
    monkeypatch: pytest.MonkeyPatch,
    before_check: Optional[Callable[[], None]] = None,
) -> Dict[str, List[Any]]:
    """Run the example against `daemon` (through a proxy when `before_check` is given);
    what each stand-in was called with, and what `time.sleep` was asked."""
    calls: Dict[str, List[Any]] = {"post_export": [], "escalate": [], "hand_off": [], "sleep": []}

    def post_export(timeout: float) -> Any:
        assert timeout > 0
        calls["post_export"].append(timeout)
        return SimpleNamespace(cost_nanos=70_000_000)

    monkeypatch.setattr(time, "sleep", lambda s: calls["sleep"].append(s))
    socket_path = daemon.socket
    proxy = None
    if before_check is not None:
        proxy = Proxy(str(daemon.dir), daemon.socket, before_check)
        socket_path = proxy.path
    code = example().replace('"/run/tally/agent.sock"', repr(socket_path))
    namespace: Dict[str, Any] = {
        "post_export": post_export,
        "escalate": lambda cause: calls["escalate"].append(cause),
        "hand_off": lambda reason: calls["hand_off"].append(reason),
    }
    try:
        exec(compile(code, str(README), "exec"), namespace)
    finally:
        if proxy:
            proxy.close()
    return calls


def test_the_call_is_allowed_runs_once_and_its_cost_is_recorded(
    serve: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = serve()
    calls = run_example(daemon, monkeypatch)
    assert len(calls["post_export"]) == 1
    assert (calls["escalate"], calls["hand_off"], calls["sleep"]) == ([], [], [])
    standing = Gate(daemon.socket).run("r1")
    assert (standing["calls_allowed"], standing["settled_nanos"]) == (1, 70_000_000)
    assert (standing["state"], standing["stop_reason"]) == ("stopped", "completed"), standing


def test_a_reservation_over_budget_asks_a_human_and_never_runs(
    serve: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = serve("[ceiling]\nspend_cents = 10\n")
    calls = run_example(daemon, monkeypatch)
    assert calls["post_export"] == [] and calls["hand_off"] == []
    assert calls["escalate"] == ["reservation_insufficient"]
    # The run stays open for the approval.
    assert Gate(daemon.socket).run("r1")["state"] == "running"


def test_a_paused_run_waits_a_while_and_makes_no_call(
    serve: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = serve()
    calls = run_example(daemon, monkeypatch, before_check=pause(daemon, "r1"))
    assert calls["post_export"] == [] and calls["hand_off"] == []
    assert len(calls["sleep"]) == 1 and calls["sleep"][0] > 0, calls
    assert Gate(daemon.socket).run("r1")["state"] == "paused"


def test_with_the_gate_gone_it_waits_a_while_and_makes_no_call(
    serve: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = serve()
    calls = run_example(daemon, monkeypatch, before_check=daemon.kill)
    assert calls["post_export"] == [] and calls["hand_off"] == []
    assert len(calls["sleep"]) == 1 and calls["sleep"][0] > 0, calls


def test_a_run_the_gate_stops_is_recorded_with_the_gates_reason_not_completed(
    serve: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only tools named `search` are in scope: the export is refused, action stop.
    daemon = serve('[scope]\ntools = ["search"]\n' + NO_ASK)
    calls = run_example(daemon, monkeypatch)
    assert calls["post_export"] == [] and calls["escalate"] == []
    assert calls["hand_off"] == ["scope_violation"]
    standing = Gate(daemon.socket).run("r1")
    assert (standing["state"], standing["stop_reason"]) == ("stopped", "scope_violation"), standing
