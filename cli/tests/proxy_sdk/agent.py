"""An agent calling a model through tally's proxy with an official SDK.

Run by cli/tests/proxy_sdk/main.rs. The SDK is configured only the way a user configures it:
`OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` point at the proxy and the run token is the API
key (`OPENAI_API_KEY` / `ANTHROPIC_API_KEY`). Each call prints one JSON line: what the
SDK returned (text, usage, tally's headers) or the exception it raised (its class, HTTP
status, message and body), so the Rust test judges the SDK's own behaviour.

Gemini (`google-genai`) reads `GEMINI_API_KEY` and `GOOGLE_GEMINI_BASE_URL`; Azure
OpenAI (`openai.AzureOpenAI`) reads `AZURE_OPENAI_API_KEY`, `AZURE_OPENAI_ENDPOINT`
and `OPENAI_API_VERSION`, the model being the deployment's name.

usage: agent.py SDK MODE [options]
  SDK   openai | anthropic | gemini | azure
  MODE  call   one call (--model, --stream, --max-tokens N or --no-max-tokens;
               --responses: openai and azure call the Responses API, not streamed)
        race   --n calls at once on threads (--models a,b,c cycled), a JSON line each
  --default-retries: the SDK's own retries (max_retries left at its default), not none
        hold   one streaming call: prints {"first": ...} after the first chunk, then
               reads to the end (the test kills the daemon meanwhile)
        count  (anthropic) one `messages.count_tokens` call: {"ok", "input_tokens"}
"""

import argparse
import concurrent.futures
import json
import sys
import uuid


def sdk_error(e):
    """The SDK's exception as data: class, status, message, body."""
    out = {"error": type(e).__name__, "message": str(e)}
    status = getattr(e, "status_code", None)
    if status is None and isinstance(getattr(e, "code", None), int):
        # google-genai's APIError: `code` (HTTP), `status` (Google's), `details`.
        status = e.code
        out["rpc_status"] = getattr(e, "status", None)
    if status is not None:
        out["status"] = status
    body = getattr(e, "body", None)
    if body is not None:
        out["body"] = body
    response = getattr(e, "response", None)
    if response is not None:
        out["headers"] = {k.lower(): v for k, v in response.headers.items()
                          if k.lower().startswith("x-tally")
                          or k.lower() in ("retry-after", "x-should-retry")}
    return out


def tally_headers(raw):
    return {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-tally")}


def prompt():
    # Each call its own words: identical calls in a row are the loop rule's business,
    # not what these tests are about.
    return [{"role": "user", "content": f"Say hello. ({uuid.uuid4()})"}]


def responses_call(client, args, model):
    """One Responses API call, not streamed (--responses)."""
    kwargs = {"model": model, "input": prompt()[0]["content"]}
    if not args.no_max_tokens:
        kwargs["max_output_tokens"] = args.max_tokens
    raw = client.responses.with_raw_response.create(**kwargs)
    parsed = raw.parse()
    return {"ok": True, "status": raw.status_code, "headers": tally_headers(raw),
            "text": parsed.output_text, "usage": parsed.usage.model_dump()}


def openai_call(client, args, model, first=None):
    if args.responses:
        return responses_call(client, args, model)
    kwargs = {"model": model, "messages": prompt()}
    if not args.no_max_tokens:
        kwargs["max_tokens"] = args.max_tokens
    if args.stream:
        kwargs["stream"] = True
        if args.include_usage:
            kwargs["stream_options"] = {"include_usage": True}
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    out = {"ok": True, "status": raw.status_code, "headers": tally_headers(raw)}
    parsed = raw.parse()
    if args.stream:
        text, usage, chunks, empty_choices = [], None, 0, 0
        for chunk in parsed:
            chunks += 1
            if chunks == 1 and first is not None:
                first()
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            if not chunk.choices:
                empty_choices += 1
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    text.append(choice.delta.content)
        out.update(text="".join(text), usage=usage, chunks=chunks,
                   empty_choices=empty_choices)
    else:
        out.update(text=parsed.choices[0].message.content,
                   usage=parsed.usage.model_dump() if parsed.usage else None)
    return out


def anthropic_call(client, args, model, first=None):
    # The Messages API requires max_tokens; the SDK refuses a call without it.
    kwargs = {"model": model, "max_tokens": args.max_tokens, "messages": prompt()}
    if args.stream:
        kwargs["stream"] = True
    raw = client.messages.with_raw_response.create(**kwargs)
    out = {"ok": True, "status": raw.status_code, "headers": tally_headers(raw)}
    parsed = raw.parse()
    if args.stream:
        text, usage, events = [], {}, 0
        for event in parsed:
            events += 1
            if events == 1 and first is not None:
                first()
            if event.type == "message_start":
                usage["input_tokens"] = event.message.usage.input_tokens
            elif event.type == "message_delta":
                usage["output_tokens"] = event.usage.output_tokens
            elif event.type == "content_block_delta" and hasattr(event.delta, "text"):
                text.append(event.delta.text)
        out.update(text="".join(text), usage=usage or None, chunks=events)
    else:
        out.update(text="".join(b.text for b in parsed.content if b.type == "text"),
                   usage=parsed.usage.model_dump())
    return out


def gemini_call(client, args, model, first=None):
    from google.genai import types

    config = None if args.no_max_tokens else types.GenerateContentConfig(
        max_output_tokens=args.max_tokens)
    contents = prompt()[0]["content"]
    if args.stream:
        text, usage, chunks, headers = [], None, 0, {}
        for chunk in client.models.generate_content_stream(
                model=model, contents=contents, config=config):
            chunks += 1
            if chunks == 1 and first is not None:
                first()
            if chunk.sdk_http_response is not None:
                headers = tally_headers(chunk.sdk_http_response)
            if chunk.text:
                text.append(chunk.text)
            if chunk.usage_metadata is not None:
                usage = chunk.usage_metadata.model_dump(exclude_none=True)
        return {"ok": True, "status": 200, "headers": headers, "text": "".join(text),
                "usage": usage, "chunks": chunks}
    r = client.models.generate_content(model=model, contents=contents, config=config)
    return {"ok": True, "status": 200, "headers": tally_headers(r.sdk_http_response),
            "text": r.text, "usage": r.usage_metadata.model_dump(exclude_none=True)}


def warm_models(sdk):
    """Build every pydantic model of the SDK now, on this thread.

    The SDKs' models are built lazily, on first use; two threads building one model at
    once can make pydantic raise `PydanticUserError` ("BaseModel cannot be instantiated
    directly") in place of the SDK's own exception. The race mode's threads must see only
    what the proxy answered, so the models are complete before the first thread starts.
    """
    import pydantic

    stack = [pydantic.BaseModel]
    while stack:
        for model in stack.pop().__subclasses__():
            stack.append(model)
            if model.__module__.startswith(sdk + ".") and not model.__pydantic_complete__:
                model.model_rebuild(raise_errors=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("sdk", choices=["openai", "anthropic", "gemini", "azure"])
    p.add_argument("mode", choices=["call", "race", "hold", "count"])
    p.add_argument("--model", default="fake-ok")
    p.add_argument("--models", default="")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--include-usage", action="store_true")
    p.add_argument("--responses", action="store_true")
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--no-max-tokens", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--default-retries", action="store_true")
    args = p.parse_args()

    # No retries unless asked: the test sees each answer as the proxy gave it (an SDK
    # left at its default retries 429s, 5xx and connection errors on its own, and obeys
    # the answer's `x-should-retry`).
    retries = {} if args.default_retries else {"max_retries": 0}
    if args.sdk == "openai":
        import openai
        client = openai.OpenAI(timeout=args.timeout, **retries)
        call = openai_call
    elif args.sdk == "azure":
        import openai
        client = openai.AzureOpenAI(timeout=args.timeout, **retries)
        call = openai_call
    elif args.sdk == "gemini":
        from google import genai
        from google.genai import types
        # google-genai retries nothing unless told to (no retry_options).
        client = genai.Client(http_options=types.HttpOptions(timeout=int(args.timeout * 1000)))
        call = gemini_call
    else:
        import anthropic
        client = anthropic.Anthropic(timeout=args.timeout, **retries)
        call = anthropic_call

    def one(model, first=None):
        try:
            return call(client, args, model, first)
        except Exception as e:  # the SDK's own exception classes, reported as data
            return sdk_error(e)

    if args.mode == "call":
        print(json.dumps(one(args.model)), flush=True)
    elif args.mode == "count":
        try:
            n = client.messages.count_tokens(model=args.model, messages=prompt())
            out = {"ok": True, "input_tokens": n.input_tokens}
        except Exception as e:
            out = sdk_error(e)
        print(json.dumps(out), flush=True)
    elif args.mode == "hold":
        def first():
            print(json.dumps({"first": True}), flush=True)
        print(json.dumps(one(args.model, first)), flush=True)
    else:
        models = [m for m in args.models.split(",") if m] or [args.model]
        warm_models(args.sdk)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.n) as pool:
            futures = [pool.submit(one, models[i % len(models)]) for i in range(args.n)]
            for f in futures:
                print(json.dumps(f.result()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
