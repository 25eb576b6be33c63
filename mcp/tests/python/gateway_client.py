"""An MCP client for the HTTP gateway's tests, on the official Python SDK (`mcp`) and its
Streamable HTTP client.

    python3 gateway_client.py SCENARIO URL TOKEN

connects to URL with `Authorization: Bearer TOKEN`, runs SCENARIO and prints one JSON
object on stdout:

* `session`: initialize, the tool list, calls of tools of both servers (a read, an
  idempotent write, a non-idempotent write, a failing tool), the session's id.
* `refused`: initialize only; the error the client got, if any.
"""

import asyncio
import json
import sys

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def dump(result):
    return result.model_dump(mode="json", exclude_none=True)


async def main():
    scenario, url, token = sys.argv[1], sys.argv[2], sys.argv[3]
    headers = {"Authorization": f"Bearer {token}"}
    out = {}
    try:
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)) as http:
            async with streamable_http_client(url, http_client=http) as (read, write, session_id):
                async with ClientSession(read, write) as s:
                    init = await s.initialize()
                    out["server"] = init.serverInfo.name
                    out["session_id"] = session_id()
                    if scenario == "session":
                        tools = (await s.list_tools()).tools
                        out["tools"] = sorted(t.name for t in tools)
                        calls = {}
                        for name, args in [
                            ("local__lookup", {"key": "a"}),
                            ("remote__lookup", {"key": "b"}),
                            ("remote__put", {"key": "a", "value": "1"}),
                            ("local__send", {"to": "bob"}),
                            ("remote__flaky", {"n": 1}),
                        ]:
                            r = await s.call_tool(name, args)
                            calls[name] = {
                                "is_error": bool(r.isError),
                                "text": r.content[0].text if r.content else "",
                            }
                        out["calls"] = calls
    except BaseException as e:  # the SDK raises an exception group on a refused connection
        out["error"] = repr(e)
    print(json.dumps(out))


asyncio.run(main())
