"""An agent calling Amazon Bedrock's Converse API through tally's proxy with boto3.

Run by cli/tests/proxy_sdk/bedrock.rs. boto3 is configured as docs/PROXY.md says: a
`bedrock-runtime` client whose `endpoint_url` is the proxy's upstream, the run token as
the Bedrock API key (`AWS_BEARER_TOKEN_BEDROCK`, which botocore sends as
`Authorization: Bearer`), no AWS credential at all. Each call prints one JSON line:
what boto3 returned (text, usage, tally's headers) or what it raised.

usage: bedrock.py ENDPOINT_URL MODEL [--stream] [--max-tokens N | --no-max-tokens]
"""

import argparse
import json
import uuid

import boto3
import botocore.exceptions
from botocore.config import Config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("model")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--no-max-tokens", action="store_true")
    args = p.parse_args()
    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=args.endpoint,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    kwargs = {
        "modelId": args.model,
        "messages": [{"role": "user", "content": [{"text": f"Say hello. ({uuid.uuid4()})"}]}],
    }
    if not args.no_max_tokens:
        kwargs["inferenceConfig"] = {"maxTokens": args.max_tokens}
    out = {}
    try:
        if args.stream:
            r = client.converse_stream(**kwargs)
            out["headers"] = tally(r)
            text, usage, events = [], None, []
            try:
                for event in r["stream"]:
                    events.extend(event.keys())
                    if "contentBlockDelta" in event:
                        text.append(event["contentBlockDelta"]["delta"].get("text", ""))
                    if "metadata" in event:
                        usage = event["metadata"]["usage"]
            except Exception as e:  # the stream cut: what boto3 raised reading it
                out.update(error=type(e).__name__, message=str(e), events=events)
                print(json.dumps(out))
                return
            out.update(ok=True, text="".join(text), usage=usage, events=events)
        else:
            r = client.converse(**kwargs)
            out.update(ok=True, headers=tally(r),
                       text=r["output"]["message"]["content"][0]["text"], usage=r["usage"])
    except botocore.exceptions.ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        out.update(error="ClientError", code=e.response["Error"].get("Code"),
                   message=e.response["Error"].get("Message", ""),
                   status=meta.get("HTTPStatusCode"),
                   headers={k: v for k, v in meta.get("HTTPHeaders", {}).items()
                            if k.startswith("x-tally")})
    print(json.dumps(out))


def tally(r):
    h = r["ResponseMetadata"]["HTTPHeaders"]
    return {k: v for k, v in h.items() if k.startswith("x-tally")}


main()
