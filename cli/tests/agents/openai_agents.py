"""An OpenAI Agents SDK agent for cli/tests/agents/: its model calls go through tally's
proxy (the run token as the API key), its one function tool through the gate (the
Python client, tally_gate). Usage: openai_agents.py responses|chat [stream]. Prints one JSON
line: the final output, the SDK's usage, and what the gate said to each tool call."""

import json
import os
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from tally_gate import Denied, Gate

set_tracing_disabled(True)
gate = Gate(os.environ["TALLY_SOCKET"])
RUN = os.environ["TALLY_RUN"]
said = []


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


client = AsyncOpenAI(base_url=os.environ["PROXY_URL"], api_key=os.environ["TALLY_TOKEN"], max_retries=0)
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

async def streamed():
    run = Runner.run_streamed(agent, "Run the tests until they pass.", max_turns=20)
    async for _ in run.stream_events():
        pass
    return run


if sys.argv[2:] == ["stream"]:
    import asyncio

    result = asyncio.run(streamed())
else:
    result = Runner.run_sync(agent, "Run the tests until they pass.", max_turns=20)
usage = result.context_wrapper.usage
print(json.dumps({
    "final": result.final_output,
    "requests": usage.requests,
    "input_tokens": usage.input_tokens,
    "output_tokens": usage.output_tokens,
    "gate": said,
}))
