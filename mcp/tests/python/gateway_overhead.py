"""What the HTTP gateway (`tally serve --mcp-listen`) adds to a tool call
(docs/PERFORMANCE.md): run by hand, not by CI.

    python3 mcp/tests/python/gateway_overhead.py target/release/tally [CALLS] [ROUNDS]

Starts the test server on Streamable HTTP and `tally serve --mcp-listen` in front of it
(`[mcp.remote]`) on a fresh ledger with the limits lifted; then in each round, back to
back: CALLS tool calls from the MCP Python SDK's Streamable HTTP client straight to the
server and CALLS through the gateway, the two sessions open together and their calls
alternating; then CALLS check + outcome pairs sent to the gate directly over its socket
(what the gateway asks per call). Prints the p50 and p90 of each, per round, in ms.
"""

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import POLICY, UnixHTTP, gate_pairs, pct, post  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


async def calls(direct_url, gateway_url, token, n, tag):
    """Both sessions open at once, calls alternating, so load drift hits both alike."""
    direct, gated = [], []
    async with httpx.AsyncClient() as h1, httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as h2:
        async with streamable_http_client(direct_url, http_client=h1) as (r1, w1, _), \
                streamable_http_client(gateway_url, http_client=h2) as (r2, w2, _):
            async with ClientSession(r1, w1) as a, ClientSession(r2, w2) as b:
                for s in (a, b):
                    await s.initialize()
                    await s.list_tools()
                for i in range(n):
                    for s, name, times in ((a, "lookup", direct), (b, "remote__lookup", gated)):
                        t = time.perf_counter()
                        r = await s.call_tool(name, {"key": f"{tag}-{i}"})
                        times.append((time.perf_counter() - t) * 1000)
                        assert not r.isError, r
    return direct, gated


def main():
    tally = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    server_port, gateway_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        run = lambda *a: subprocess.run([tally, *a], check=True, capture_output=True)
        run("keygen", "--out", f"{d}/auditor.key")
        run("init", "--ledger", f"{d}/ledger", "--recipient", f"{d}/auditor.pub")
        with open(f"{d}/policy.toml", "w") as f:
            f.write(POLICY + f'\n[mcp.remote]\nurl = "http://127.0.0.1:{server_port}/mcp"\n')
        sock = f"{d}/agent.sock"
        server = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--http", str(server_port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve = subprocess.Popen([tally, "serve", "--ledger", f"{d}/ledger", "--socket", sock,
                                  "--policy", f"{d}/policy.toml", "--mcp-listen", f"127.0.0.1:{gateway_port}"],
                                 stderr=subprocess.DEVNULL)
        try:
            wait_port(server_port)
            wait_port(gateway_port)
            print("round | direct p50/p90 | gateway p50/p90 | check p50/p90 | outcome p50/p90 | added p50 | added p50 - check p50")
            for r in range(rounds):
                token = post(UnixHTTP(sock), "/v1/runs", {"run": f"p{r}", "goal": "overhead"})["token"]
                direct, gated = asyncio.run(calls(f"http://127.0.0.1:{server_port}/mcp",
                                                  f"http://127.0.0.1:{gateway_port}/mcp", token, n, f"p{r}"))
                checks, outcomes = gate_pairs(sock, f"g{r}", n)
                added = statistics.median(gated) - statistics.median(direct)
                print(f"{r + 1} | {pct(direct, .5):.2f}/{pct(direct, .9):.2f} | {pct(gated, .5):.2f}/{pct(gated, .9):.2f}"
                      f" | {pct(checks, .5):.2f}/{pct(checks, .9):.2f} | {pct(outcomes, .5):.2f}/{pct(outcomes, .9):.2f}"
                      f" | {added:.2f} | {added - statistics.median(checks):.2f}", flush=True)
        finally:
            serve.terminate()
            serve.wait()
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
