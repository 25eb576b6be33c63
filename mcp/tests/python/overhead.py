"""What `tally mcp` adds to a tool call (docs/PERFORMANCE.md): run by hand, not by CI.

    python3 mcp/tests/python/overhead.py target/release/tally [CALLS] [ROUNDS]

Starts `tally serve` on a fresh ledger with the limits lifted, then in each round, back
to back: CALLS tool calls from the MCP Python SDK client straight to the test server and
CALLS through `tally mcp` in front of the same server; then CALLS check + outcome pairs
sent to the gate directly over its socket (what the proxy asks per call). The direct and
proxied sessions are open together and their calls alternate. Prints the
p50 and p90 of each, per round, in ms.
"""

import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = os.path.dirname(os.path.abspath(__file__))
POLICY = """[ceiling]
attempts = 1000000000
side_effects = 1000000000
[loops]
tool_calls = 1000000000
identical_in_window = 1000000000
[rate]
run_per_sec = 0
tool_per_sec = 0
tool_in_flight = 0
[breaker]
failures = 1000000
"""


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise RuntimeError(f"{path}: {r.status} {data!r}")
    return json.loads(data)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def stdio(command):
    return stdio_client(StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ)))


async def calls(direct_cmd, proxied_cmd, n, tag):
    """Both sessions open at once, calls alternating, so load drift hits both alike."""
    direct, proxied = [], []
    async with stdio(direct_cmd) as (r1, w1), stdio(proxied_cmd) as (r2, w2):
        async with ClientSession(r1, w1) as a, ClientSession(r2, w2) as b:
            for s in (a, b):
                await s.initialize()
                await s.list_tools()
            for i in range(n):
                for s, times in ((a, direct), (b, proxied)):
                    t = time.perf_counter()
                    r = await s.call_tool("lookup", {"key": f"{tag}-{i}"})
                    times.append((time.perf_counter() - t) * 1000)
                    assert not r.isError, r
    return direct, proxied


def gate_pairs(sock, run, n):
    conn = UnixHTTP(sock)
    post(conn, "/v1/runs", {"run": run, "goal": "overhead"})
    checks, outcomes = [], []
    for i in range(n):
        t = time.perf_counter()
        a = post(conn, "/v1/check", {"run": run, "tool": "files/lookup", "effect": "read",
                                     "args": {"key": f"{run}-{i}"}, "channel": "tool"})
        t2 = time.perf_counter()
        post(conn, "/v1/outcome", {"run": run, "attempt": a["attempt"], "status": "ok"})
        t3 = time.perf_counter()
        checks.append((t2 - t) * 1000)
        outcomes.append((t3 - t2) * 1000)
    return checks, outcomes


def main():
    tally = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    server = [sys.executable, os.path.join(HERE, "server.py")]
    with tempfile.TemporaryDirectory() as d:
        run = lambda *a: subprocess.run([tally, *a], check=True, capture_output=True)
        run("keygen", "--out", f"{d}/auditor.key")
        run("init", "--ledger", f"{d}/ledger", "--recipient", f"{d}/auditor.pub")
        with open(f"{d}/policy.toml", "w") as f:
            f.write(POLICY)
        sock = f"{d}/agent.sock"
        serve = subprocess.Popen([tally, "serve", "--ledger", f"{d}/ledger", "--socket", sock,
                                  "--policy", f"{d}/policy.toml"], stderr=subprocess.DEVNULL)
        try:
            while not os.path.exists(sock):
                time.sleep(0.02)
            print("round | direct p50/p90 | proxied p50/p90 | check p50/p90 | outcome p50/p90 | added p50 | added p50 - check p50")
            for r in range(rounds):
                direct, proxied = asyncio.run(calls(
                    server, [tally, "mcp", "--socket", sock, "--run", f"p{r}", "--", *server], n, f"p{r}"))
                checks, outcomes = gate_pairs(sock, f"g{r}", n)
                added = statistics.median(proxied) - statistics.median(direct)
                print(f"{r + 1} | {pct(direct, .5):.2f}/{pct(direct, .9):.2f} | {pct(proxied, .5):.2f}/{pct(proxied, .9):.2f}"
                      f" | {pct(checks, .5):.2f}/{pct(checks, .9):.2f} | {pct(outcomes, .5):.2f}/{pct(outcomes, .9):.2f}"
                      f" | {added:.2f} | {added - statistics.median(checks):.2f}")
        finally:
            serve.terminate()
            serve.wait()


if __name__ == "__main__":
    main()
