"""A headless Chromium driven over the Chrome DevTools Protocol, for cli/tests/observe/.

Starts Debian's `chromium` headless with a private profile, connects to its page with
websocket-client, then answers one JSON command per line on stdin with one JSON line on
stdout: {"nav": url}, {"eval": expression} (its value), {"shot": path} (a PNG).
Chromium is killed when stdin closes.
"""
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client


def main():
    profile = tempfile.mkdtemp(prefix="tally-cdp-")
    args = [
        "chromium",
        "--headless=new",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--remote-debugging-port=0",
        "--user-data-dir=" + profile,
        "--window-size=1400,900",
        "about:blank",
    ]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")
    browser = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or browser.poll() is not None:
                raise SystemExit("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port))
        page = next(t for t in targets if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        ids = iter(range(1, 1 << 30))

        def call(method, **params):
            i = next(ids)
            ws.send(json.dumps({"id": i, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == i:
                    if "error" in msg:
                        raise RuntimeError(msg["error"])
                    return msg["result"]

        call("Page.enable")
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                if "nav" in cmd:
                    call("Page.navigate", url=cmd["nav"])
                    out = {"ok": True}
                elif "eval" in cmd:
                    r = call("Runtime.evaluate", expression=cmd["eval"], returnByValue=True)
                    out = {"value": r.get("result", {}).get("value")}
                elif "shot" in cmd:
                    r = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                    with open(cmd["shot"], "wb") as f:
                        f.write(base64.b64decode(r["data"]))
                    out = {"ok": True}
                else:
                    out = {"error": "unknown command"}
            except Exception as e:  # reported to the test, which fails with it
                out = {"error": repr(e)}
            print(json.dumps(out), flush=True)
    finally:
        browser.kill()
        browser.wait()


if __name__ == "__main__":
    main()
