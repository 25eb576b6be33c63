#!/usr/bin/env bash
# The operator's view, its cost side by side (docs/PERFORMANCE.md, "The operator's view"):
# two daemons from one build over two fresh ledgers under one policy, `plain` (no view)
# and `observed` (metrics scraped every second on --metrics-listen, a span per check
# exported to a local OTLP/HTTP receiver, the live page's event stream held open), benched
# in turn with the same load, ROUNDS times; prints each pair and its ratio.
#
#   cargo build --release -p tally-load
#   daemon/benches/observe-vs.sh [ROUNDS] [CLIENTS] [SECONDS]
#   NO_OTLP=1 daemon/benches/observe-vs.sh ...   # the same without traces
set -euo pipefail
cd "$(dirname "$0")/../.."
L=${L:-target/release/tally-load}
ROUNDS=${1:-5}; CLIENTS=${2:-64}; SECONDS_EACH=${3:-4}
W=$(mktemp -d /tmp/observe-vs.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

# The gate's limits lifted, as in "The gate (issue 10)": every call is allowed.
printf '[ceiling]\nattempts = 1000000000\nspend_cents = 100000000000\nside_effects = 1000000000\n[loops]\ntool_calls = 1000000000\n[rate]\nrun_per_sec = 0\ntool_per_sec = 0\ntool_in_flight = 0\n[breaker]\nfailures = 1000000\n' > "$W/p.toml"

# An OTLP/HTTP receiver that accepts and drops every export.
python3 - "$W/otlp.port" <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(s.server_address[1]))
s.serve_forever()
PY
pids+=($!)
while [ ! -s "$W/otlp.port" ]; do sleep 0.05; done
OTLP="http://127.0.0.1:$(cat "$W/otlp.port")"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

for side in plain observed; do
  $L init --ledger "$W/$side"
done
$L serve --ledger "$W/plain" --socket "$W/plain.sock" --policy "$W/p.toml" &
pids+=($!)
# NO_OTLP=1: metrics and the page only, without traces.
if [ "${NO_OTLP:-}" = 1 ]; then TRACES=(); else TRACES=(--otlp-endpoint "$OTLP"); fi
$L serve --ledger "$W/observed" --socket "$W/observed.sock" --policy "$W/p.toml" \
  --metrics-listen "127.0.0.1:$PORT" "${TRACES[@]}" &
pids+=($!)
while [ ! -S "$W/plain.sock" ] || [ ! -S "$W/observed.sock" ]; do
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a daemon did not start" >&2; exit 1; }; done
  sleep 0.05
done
sleep 0.5
# The page open (its event stream), and a scraper every second.
curl -sN "http://127.0.0.1:$PORT/v1/live/events" > /dev/null &
pids+=($!)
( while :; do curl -s "http://127.0.0.1:$PORT/metrics" > /dev/null; sleep 1; done ) &
pids+=($!)

echo "rounds=$ROUNDS clients=$CLIENTS seconds=$SECONDS_EACH"
for r in $(seq "$ROUNDS"); do
  bench() { $L bench --socket "$W/$1.sock" --clients "$CLIENTS" --seconds "$SECONDS_EACH" --check --json | tail -1; }
  # Which goes first alternates, so neither always runs on a warmer machine.
  if [ $((r % 2)) -eq 1 ]; then p=$(bench plain); o=$(bench observed); else o=$(bench observed); p=$(bench plain); fi
  python3 - "$p" "$o" <<'PY'
import json, sys
p, o = json.loads(sys.argv[1]), json.loads(sys.argv[2])
k = "decisions_per_sec"
print("plain %8.0f decisions/s p99 %6.2f ms | observed %8.0f decisions/s p99 %6.2f ms | ratio %.3f"
      % (p[k], p["p99_ms"], o[k], o["p99_ms"], o[k] / p[k]))
PY
done
