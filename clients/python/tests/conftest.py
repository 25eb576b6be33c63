"""What the client's tests share: the real daemon, `tally-load serve` (path in env
TALLY_LOAD), over a fresh ledger with the policy a test needs, killed at teardown."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

NO_ASK = "[approvals]\nask_on = []\n"


class Daemon:
    """One `tally-load serve` over its own ledger, in a short temporary directory (a Unix
    socket path must stay under ~100 bytes)."""

    def __init__(self, binary: str, policy: Optional[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tg-"))
        self.ledger = self.dir / "ledger"
        self.socket = str(self.dir / "agent.sock")
        self.operator_socket = str(self.dir / "operator.sock")
        self.log = self.dir / "serve.log"
        subprocess.run(
            [binary, "init", "--ledger", str(self.ledger)], check=True, capture_output=True
        )
        cmd = [
            binary, "serve", "--ledger", str(self.ledger), "--socket", self.socket,
            "--operator-socket", self.operator_socket,
        ]  # fmt: skip
        if policy is not None:
            path = self.dir / "policy.toml"
            path.write_text(policy)
            cmd += ["--policy", str(path)]
        self._log = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tally-load serve exited {self.proc.returncode}: {self.log.read_text()}"
                )
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(
            f"tally-load serve did not listen on {self.socket} within 15 s: {self.log.read_text()}"
        )

    def kill(self) -> None:
        """kill -9: the socket file stays behind, nothing listens on it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def serve() -> Iterator[Callable[..., Daemon]]:
    binary = os.environ.get("TALLY_LOAD")
    if not binary:
        pytest.fail(
            "env TALLY_LOAD is not set: build the daemon with `cargo build -p tally-load` "
            "and run TALLY_LOAD=target/debug/tally-load PYTHONPATH=clients/python "
            "python3 -m pytest clients/python/tests",
            pytrace=False,
        )
    if not os.access(binary, os.X_OK):
        pytest.fail(f"TALLY_LOAD={binary} is not an executable file", pytrace=False)
    started: List[Daemon] = []

    def start(policy: Optional[str] = None) -> Daemon:
        d = Daemon(binary, policy)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()
