#!/usr/bin/env bash
# The operator's view, its cost side by side (docs/PERFORMANCE.md, "The operator's view"):
# daemons from one build over fresh ledgers under one policy, `plain` (no view) and one
# `observed` per sample ratio (metrics scraped every second on --metrics-listen, spans
# exported to a local OTLP/HTTP receiver with --otlp-sample RATIO, the live page's event
# stream held open), benched in turn with the same load, ROUNDS times; prints each round
# and each observed daemon's ratio to plain, then the means.
#
#   cargo build --release -p tally-load
#   daemon/benches/observe-vs.sh [ROUNDS] [CLIENTS] [SECONDS]
#   SAMPLES="none 1 0.1" daemon/benches/observe-vs.sh ...   # one observed daemon per ratio
#                                                        # (`none`: metrics and page, no traces)
#   NO_OTLP=1 daemon/benches/observe-vs.sh ...         # one observed daemon, no traces
set -euo pipefail
cd "$(dirname "$0")/../.."
L=${L:-target/release/tally-load}
ROUNDS=${1:-5}; CLIENTS=${2:-64}; SECONDS_EACH=${3:-4}
W=$(mktemp -d "${TMPDIR:-/tmp}/observe-vs.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

cp daemon/benches/lifted-policy.toml "$W/p.toml"

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

# NO_OTLP=1: metrics and the page only, without traces; else one observed daemon per
# ratio in SAMPLES (default: the daemon's default ratio, no --otlp-sample).
if [ "${NO_OTLP:-}" = 1 ]; then SIDES=(nootlp); else SIDES=(); for r in ${SAMPLES:-default}; do SIDES+=("s$r"); done; fi
$L init --ledger "$W/plain"
$L serve --ledger "$W/plain" --socket "$W/plain.sock" --policy "$W/p.toml" &
pids+=($!); echo $! > "$W/plain.pid"
for side in "${SIDES[@]}"; do
  $L init --ledger "$W/$side"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  echo "$port" > "$W/$side.port"
  case "$side" in
    nootlp|snone) TRACES=() ;;
    sdefault) TRACES=(--otlp-endpoint "$OTLP") ;;
    *) TRACES=(--otlp-endpoint "$OTLP" --otlp-sample "${side#s}") ;;
  esac
  $L serve --ledger "$W/$side" --socket "$W/$side.sock" --policy "$W/p.toml" \
    --metrics-listen "127.0.0.1:$port" "${TRACES[@]}" &
  pids+=($!); echo $! > "$W/$side.pid"
done
for side in plain "${SIDES[@]}"; do
  while [ ! -S "$W/$side.sock" ]; do
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a daemon did not start" >&2; exit 1; }; done
    sleep 0.05
  done
done
sleep 0.5
# Each observed daemon's page open (its event stream), and a scraper every second.
for side in "${SIDES[@]}"; do
  port=$(cat "$W/$side.port")
  curl -sN "http://127.0.0.1:$port/v1/live/events" > /dev/null &
  pids+=($!)
  ( while :; do curl -s "http://127.0.0.1:$port/metrics" > /dev/null; sleep 1; done ) &
  pids+=($!)
done

ALL=(plain "${SIDES[@]}")
N=${#ALL[@]}
echo "rounds=$ROUNDS clients=$CLIENTS seconds=$SECONDS_EACH sides=${ALL[*]}"
# A daemon's CPU time so far (user + system, all threads), in ticks of 10 ms.
ticks() { awk '{print $14 + $15}' "/proc/$(cat "$W/$1.pid")/stat"; }
# One round of one daemon: the load's JSON report, with the daemon's CPU ticks spent in it.
bench() {
  local t0 t1
  t0=$(ticks "$1")
  $L bench --socket "$W/$1.sock" --clients "$CLIENTS" --seconds "$SECONDS_EACH" --check --json | tail -1 > "$W/$1.out"
  t1=$(ticks "$1")
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["daemon_ticks"]=int(sys.argv[2]); print(json.dumps(d))' "$W/$1.out" $((t1 - t0))
}
for r in $(seq "$ROUNDS"); do
  # The order rotates each round, so no side always runs first (on a cooler machine).
  for i in $(seq 0 $((N - 1))); do
    side=${ALL[$(( (i + r) % N ))]}
    bench "$side" > "$W/$side.$r.json"
  done
  python3 - "$W" "$r" "${ALL[@]}" <<'PY'
import json, sys
w, r, sides = sys.argv[1], sys.argv[2], sys.argv[3:]
k = "decisions_per_sec"
got = {s: json.load(open(f"{w}/{s}.{r}.json")) for s in sides}
p = got["plain"][k]
print("round %s: plain %6.0f/s p99 %6.2f ms" % (r, p, got["plain"]["p99_ms"])
      + "".join(" | %s %6.0f/s p99 %6.2f ms ratio %.3f" % (s, got[s][k], got[s]["p99_ms"], got[s][k] / p)
                for s in sides[1:]))
PY
done
python3 - "$W" "$ROUNDS" "${ALL[@]}" <<'PY'
import json, sys
w, n, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
k = "decisions_per_sec"
got = {s: [json.load(open(f"{w}/{s}.{r}.json")) for r in range(1, n + 1)] for s in sides}
runs = {s: [g[k] for g in v] for s, v in got.items()}
mean = {s: sum(v) / len(v) for s, v in runs.items()}
# The daemon's CPU per decision over all rounds (each check is two decisions' worth of
# requests: check and outcome; `decisions` counts calls): microseconds per call.
cpu = {s: 1e4 * sum(g["daemon_ticks"] for g in v) / sum(g["decisions"] for g in v) for s, v in got.items()}
print("means: plain %.0f/s, daemon CPU %.1f us per call" % (mean["plain"], cpu["plain"]))
for s in sides[1:]:
    per = ", ".join("%.2f" % (o / p) for o, p in zip(runs[s], runs["plain"]))
    print("  %s %.0f/s ratio of the means %.3f; daemon CPU %.1f us per call, plain/this %.3f; per round: %s"
          % (s, mean[s], mean[s] / mean["plain"], cpu[s], cpu["plain"] / cpu[s], per))
PY
