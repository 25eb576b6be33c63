"""An MCP server for tally mcp's tests, on the official Python SDK (`mcp`, FastMCP):
one tool of each annotation kind, a failing tool, a slow one, one that reports
progress and logs, a resource, a resource template and a prompt. Deterministic, so a
session straight to it and one through the proxy can be compared byte for byte."""

import asyncio
import os

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

def seen(tool, detail=None):
    """Append the tool's name to $TALLY_MCP_TEST_CALLS: what reached the server (and,
    with $TALLY_MCP_TEST_ARGS set, a detail of its arguments after it). On HTTP, with
    $TALLY_MCP_TEST_HEADER set to NAME=FILE, the value of the call's request header NAME
    is appended to FILE (what a gateway sent this server as its credential)."""
    path = os.environ.get("TALLY_MCP_TEST_CALLS")
    if path:
        if detail is not None and os.environ.get("TALLY_MCP_TEST_ARGS"):
            tool = f"{tool} {detail}"
        with open(path, "a") as f:
            f.write(tool + "\n")
    header = os.environ.get("TALLY_MCP_TEST_HEADER")
    if header:
        name, file = header.split("=", 1)
        request = server.get_context().request_context.request
        with open(file, "a") as f:
            f.write(f"{request.headers.get(name)}\n")


server = FastMCP("files", instructions="A test server for tally mcp.", log_level="ERROR")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(key: str) -> str:
    """Read a value (read-only)."""
    seen("lookup")
    return f"value of {key}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=False))
def put(key: str, value: str) -> str:
    """Set a value (idempotent)."""
    seen("put")
    return f"{key} = {value}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def send(to: str) -> str:
    """Send a message (not idempotent)."""
    seen("send", to)
    return f"sent to {to}"


@server.tool()
def plain(x: int) -> int:
    """No annotations at all."""
    seen("plain")
    return x + 1


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def flaky(n: int) -> str:
    """Always fails: an agent that retries it loops."""
    seen("flaky")
    raise RuntimeError(f"upstream unavailable (try {n})")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def slow(seconds: float) -> str:
    """Sleeps, for timeouts and cancellation."""
    seen("slow")
    await asyncio.sleep(seconds)
    return "done"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def steps(count: int, ctx: Context) -> str:
    """Reports progress and logs as it goes."""
    seen("steps")
    for i in range(count):
        await ctx.report_progress(i + 1, count, f"step {i + 1}")
        await ctx.info(f"step {i + 1} of {count}")
    return f"{count} steps"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def crash(code: int) -> str:
    """Exits the server mid-call, before answering."""
    seen("crash")
    os._exit(code)


@server.resource("notes://readme", mime_type="text/plain")
def readme() -> str:
    """A fixed note."""
    return "read me"


@server.resource("notes://{name}")
def note(name: str) -> str:
    """A note by name."""
    return f"note {name}"


@server.prompt()
def review(path: str) -> str:
    """Ask for a review."""
    return f"Please review {path}."


# $TALLY_MCP_TEST_HANG_LIST=FILE: the first process started with it (FILE does not exist
# yet; it is made) never answers tools/list (it does answer initialize): a server that
# hangs on its listing, once.
_hang = os.environ.get("TALLY_MCP_TEST_HANG_LIST")
if _hang and not os.path.exists(_hang):
    open(_hang, "w").close()

    async def _never_listed():
        await asyncio.sleep(3600)
        return []

    server._mcp_server.list_tools()(_never_listed)


def redirecting(app):
    """The ASGI `app`, except that a request to /moved is answered 308 to /mcp, and with
    $TALLY_MCP_TEST_REDIRECT=URL every request to /mcp is answered 307 to URL."""
    elsewhere = os.environ.get("TALLY_MCP_TEST_REDIRECT")

    async def wrapped(scope, receive, send):
        if scope["type"] == "http":
            status, location = {
                "/moved": (308, "/mcp"),
                "/mcp": (307, elsewhere),
            }.get(scope["path"], (None, None))
            if location:
                await send({
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"location", location.encode()), (b"content-length", b"0")],
                })
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return wrapped


if __name__ == "__main__":
    import sys

    # $TALLY_MCP_TEST_PID: append this process's id, for tests that check it was killed.
    if os.environ.get("TALLY_MCP_TEST_PID"):
        with open(os.environ["TALLY_MCP_TEST_PID"], "a") as f:
            f.write(f"{os.getpid()}\n")

    # `server.py --http PORT`: the same server on Streamable HTTP (http://127.0.0.1:PORT/mcp),
    # for the HTTP gateway's tests; `server.py --https PORT CERT KEY`: the same over TLS
    # (https://127.0.0.1:PORT/mcp) with the certificate and key of PEM files; else on
    # stdio.
    # On HTTP, a request to /moved is answered 308 to /mcp (a same-origin redirect);
    # with $TALLY_MCP_TEST_REDIRECT=URL, every request to /mcp is answered 307 to URL (a
    # redirect elsewhere).
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(
            redirecting(server.streamable_http_app()),
            host="127.0.0.1",
            port=int(sys.argv[2]),
            log_level="error",
        )
    elif len(sys.argv) == 5 and sys.argv[1] == "--https":
        import uvicorn

        uvicorn.run(
            redirecting(server.streamable_http_app()),
            host="127.0.0.1",
            port=int(sys.argv[2]),
            ssl_certfile=sys.argv[3],
            ssl_keyfile=sys.argv[4],
            log_level="error",
        )
    else:
        server.run("stdio")
