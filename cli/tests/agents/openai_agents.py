"""An OpenAI Agents SDK agent for cli/tests/agents/: its model calls go through tally's
proxy (the run token as the API key, the client's retries left at their default), its
one function tool through the gate (the Python client, tally_gate). Usage:
openai_agents.py responses|chat [stream]. Prints one JSON line: the final output, or the
exception a refused model call raised out of the run (its class, HTTP status, message
and `x-should-retry`); the model usage the SDK reported call by call; and what the gate
said to each tool call."""

import asyncio
import json
import os
import sys

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunHooks,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from tally_gate import Denied, Gate

set_tracing_disabled(True)
gate = Gate(os.environ["TALLY_SOCKET"])
RUN = os.environ["TALLY_RUN"]
said = []
usage = {"requests": 0, "input_tokens": 0, "output_tokens": 0}


@function_tool
def run_tests() -> str:
    """Run the project's test suite."""
    try:
        with gate.call(RUN, "shell", effect="non_idempotent_write", args={"command": "npm test"}):
            said.append("allow")
            # The suite fails, the same way each time: the outcome is an error.
            raise RuntimeError("3 failing")
    except Denied as e:
        said.append(e.reason)
        raise


class Usage(RunHooks):
    """The SDK's own usage, each model call's as it ends (a run that raises returns no
    result to read it from)."""

    async def on_llm_end(self, context, agent, response):
        usage["requests"] += response.usage.requests
        usage["input_tokens"] += response.usage.input_tokens
        usage["output_tokens"] += response.usage.output_tokens


client = openai.AsyncOpenAI(base_url=os.environ["PROXY_URL"], api_key=os.environ["TALLY_TOKEN"])
model_id = os.environ["MODEL"]
model = (
    OpenAIResponsesModel(model=model_id, openai_client=client)
    if sys.argv[1] == "responses"
    else OpenAIChatCompletionsModel(model=model_id, openai_client=client)
)
# A streamed Chat Completion reports its usage only when asked (`include_usage`).
agent = Agent(
    name="fixer",
    instructions="Make the tests pass.",
    tools=[run_tests],
    model=model,
    model_settings=ModelSettings(include_usage=True),
)
PROMPT = "Run the tests until they pass."


async def run():
    if sys.argv[2:] == ["stream"]:
        streamed = Runner.run_streamed(agent, PROMPT, max_turns=50, hooks=Usage())
        async for _ in streamed.stream_events():
            pass
        return streamed.final_output
    return (await Runner.run(agent, PROMPT, max_turns=50, hooks=Usage())).final_output


out = {"gate": said}
try:
    out["final"] = asyncio.run(run())
except openai.APIStatusError as e:
    out["error"] = type(e).__name__
    out["status"] = e.status_code
    out["message"] = str(e)
    out["should_retry"] = e.response.headers.get("x-should-retry")
out.update(usage)
print(json.dumps(out))
