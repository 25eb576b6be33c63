"""Tool calls per second through the HTTP gateway (`tally serve --mcp-listen`) beside the
gate's own check rate and the upstream called directly (docs/PERFORMANCE.md): run by
hand, not by CI.

    python3 mcp/tests/python/gateway_rate.py target/release/tally target/release/tally-load \
        [SECONDS] [SESSIONS...]

Starts the test server on Streamable HTTP and `tally serve --mcp-listen` in front of it
(`[mcp.remote]`) on a fresh ledger with the limits lifted. Then for each count of
SESSIONS (default 1 and 64), back to back in one run: that many MCP Python SDK sessions
calling the server directly, each a closed loop for SECONDS; the same through the
gateway (each session its own run token); and `tally-load bench --check` with that many
clients on the same daemon's agent socket (a check and its outcome per call: what the
gateway asks the gate per call). Sessions are spread over up to 4 client processes.
Prints calls per second of each and the ratios.
"""

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gateway_overhead import free_port, wait_port  # noqa: E402
from overhead import POLICY, UnixHTTP, post  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


async def session_loop(url, headers, tool, seconds, counts):
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60)) as http:
        async with streamable_http_client(url, http_client=http) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()
                counts.append(0)
                me = len(counts) - 1
                # The loops start together, once every session is open.
                await asyncio.sleep(max(0.0, start_at[0] - time.monotonic()))
                end = start_at[0] + seconds
                i = 0
                while time.monotonic() < end:
                    res = await s.call_tool(tool, {"key": f"k{i % 50}"})
                    assert not res.isError, res
                    counts[me] += 1
                    i += 1


start_at = [0.0]


def worker(args):
    url, tokens, tool, seconds, t0 = args
    start_at[0] = t0
    counts = []

    async def all_sessions():
        await asyncio.gather(*(
            session_loop(url, {"Authorization": f"Bearer {t}"} if t else {}, tool, seconds, counts)
            for t in tokens))

    asyncio.run(all_sessions())
    return sum(counts)


def rate(url, tokens, tool, seconds):
    """Calls per second of len(tokens) sessions, over up to 4 processes."""
    procs = min(4, len(tokens))
    parts = [tokens[i::procs] for i in range(procs)]
    # Every session opens first (imports and initialize take seconds on a loaded
    # machine); the loops start together, 8 s and more from now.
    t0 = time.monotonic() + 8.0 + len(tokens) * 0.1
    with multiprocessing.Pool(procs) as pool:
        total = sum(pool.map(worker, [(url, p, tool, seconds, t0) for p in parts]))
    return total / seconds


def gate_rate(load, sock, clients, seconds):
    """`tally-load bench --check`: its JSON report (calls: `requests`)."""
    out = subprocess.run([load, "bench", "--socket", sock, "--clients", str(clients), "--seconds",
                          str(seconds), "--check", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tally-load bench: {out.stderr}")
    # The report is the last line that is JSON.
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def main():
    tally = os.path.abspath(sys.argv[1])
    load = os.path.abspath(sys.argv[2])
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    sessions = [int(a) for a in sys.argv[4:]] or [1, 64]
    server_port, gateway_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        run = lambda *a: subprocess.run([tally, *a], check=True, capture_output=True)
        run("keygen", "--out", f"{d}/auditor.key")
        run("init", "--ledger", f"{d}/ledger", "--recipient", f"{d}/auditor.pub")
        with open(f"{d}/policy.toml", "w") as f:
            # tally-load's checks reserve spend: the ceiling's spend lifted too.
            policy = POLICY.replace("[ceiling]\n", '[ceiling]\nspend_usd = "1000000"\n')
            f.write(policy + f'\n[mcp.remote]\nurl = "http://127.0.0.1:{server_port}/mcp"\n')
        sock = f"{d}/agent.sock"
        server = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--http", str(server_port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve = subprocess.Popen([tally, "serve", "--ledger", f"{d}/ledger", "--socket", sock,
                                  "--policy", f"{d}/policy.toml", "--mcp-listen", f"127.0.0.1:{gateway_port}",
                                  "--max-connections-per-peer", "1024"],
                                 stderr=subprocess.DEVNULL)
        try:
            wait_port(server_port)
            wait_port(gateway_port)
            print("sessions | direct calls/s | gateway calls/s | gate check+outcome/s | gateway/direct | gateway/gate")
            for n in sessions:
                tokens = [post(UnixHTTP(sock), "/v1/runs", {"run": f"s{n}-{i}", "goal": "rate"})["token"]
                          for i in range(n)]
                direct = rate(f"http://127.0.0.1:{server_port}/mcp", [None] * n, "lookup", seconds)
                gated = rate(f"http://127.0.0.1:{gateway_port}/mcp", tokens, "remote__lookup", seconds)
                report = gate_rate(load, sock, n, seconds)
                checks = report["requests"] / report["seconds"]
                print(f"{n} | {direct:.0f} | {gated:.0f} | {checks:.0f} | {gated / direct:.2f} | {gated / checks:.3f}",
                      flush=True)
        finally:
            serve.terminate()
            serve.wait()
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
