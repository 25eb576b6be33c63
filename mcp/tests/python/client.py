"""An MCP client for tally mcp's tests, on the official Python SDK (`mcp`).

    python3 client.py SCENARIO -- COMMAND...

starts COMMAND as a stdio MCP server (the test server straight, or `tally mcp ... --
python3 server.py`), runs SCENARIO and prints one JSON object on stdout:

* `session`: initialize, every list, a read, a prompt, each annotated tool once, a tool
  that reports progress and logs; the results and the notifications received.
* `loop`: an agent retrying a failing tool with fresh arguments until told to stop.
* `retry`: an agent retrying a failing tool with the same arguments until told to stop.
* `everything`: lists and two tool calls against the MCP reference server.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def dump(result):
    return result.model_dump(mode="json", exclude_none=True)


async def session(s, notes):
    out = {}
    init = await s.initialize()
    out["initialize"] = dump(init)
    out["tools"] = dump(await s.list_tools())
    out["resources"] = dump(await s.list_resources())
    out["templates"] = dump(await s.list_resource_templates())
    out["read"] = dump(await s.read_resource("notes://readme"))
    out["read_template"] = dump(await s.read_resource("notes://todo"))
    out["prompts"] = dump(await s.list_prompts())
    out["prompt"] = dump(await s.get_prompt("review", {"path": "src/lib.rs"}))
    calls = {}
    calls["lookup"] = dump(await s.call_tool("lookup", {"key": "a"}))
    calls["put"] = dump(await s.call_tool("put", {"key": "a", "value": "1"}))
    calls["send"] = dump(await s.call_tool("send", {"to": "bob"}))
    calls["plain"] = dump(await s.call_tool("plain", {"x": 41}))
    progress = []

    async def on_progress(p, total, message):
        progress.append([p, total, message])

    calls["steps"] = dump(await s.call_tool("steps", {"count": 3}, progress_callback=on_progress))
    out["calls"] = calls
    out["progress"] = progress
    out["ping"] = dump(await s.send_ping())
    out["log"] = notes
    return out


async def loop(s, notes):
    await s.initialize()
    calls = []
    for n in range(30):
        r = await s.call_tool("flaky", {"n": n})
        text = " ".join(c.text for c in r.content if c.type == "text")
        gate = (r.meta or {}).get("tally/gate")
        calls.append({"n": n, "is_error": r.isError, "text": text, "gate": gate})
        # The agent obeys the gate: stop (or ask a human) ends the loop; retry goes on.
        if gate and gate.get("action") in ("stop", "ask"):
            break
    return {"calls": calls}


async def retry(s, notes):
    await s.initialize()
    calls = []
    for _ in range(30):
        r = await s.call_tool("flaky", {"n": 0})
        text = " ".join(c.text for c in r.content if c.type == "text")
        gate = (r.meta or {}).get("tally/gate")
        calls.append({"is_error": r.isError, "text": text, "gate": gate})
        if gate and gate.get("action") in ("stop", "ask"):
            break
    return {"calls": calls}


async def everything(s, notes):
    """The MCP reference server (`@modelcontextprotocol/server-everything`)."""
    out = {"initialize": dump(await s.initialize())}
    out["tools"] = dump(await s.list_tools())
    out["resources"] = dump(await s.list_resources())
    out["templates"] = dump(await s.list_resource_templates())
    out["prompts"] = dump(await s.list_prompts())
    out["echo"] = dump(await s.call_tool("echo", {"message": "hi"}))
    out["sum"] = dump(await s.call_tool("get-sum", {"a": 1, "b": 2}))
    out["ping"] = dump(await s.send_ping())
    return out


async def main():
    scenario = sys.argv[1]
    command = sys.argv[sys.argv.index("--") + 1 :]
    # The whole environment: the SDK passes only a safe few variables by default.
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    notes = []

    async def on_log(params):
        notes.append(dump(params))

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, logging_callback=on_log) as s:
            result = await {"session": session, "loop": loop, "retry": retry, "everything": everything}[scenario](s, notes)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    asyncio.run(main())
