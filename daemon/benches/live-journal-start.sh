#!/usr/bin/env bash
# What reading the live view's trajectories back costs at start (docs/PERFORMANCE.md,
# "The operator's view: trajectories at start"): `tally serve` started over one ledger
# with no live.ndjson, and with the largest one it reads (20,000 runs x 60 points, one
# line per check with attempts, spend and depth, plus the 200,000 lines appended before a
# rewrite), in turn, ROUNDS times; each time from the exec to the operator socket's first
# answer (`GET /v1/health`), and with the file, to its rewrite (the file renamed into
# place: the trajectories read back, merged and written again by the daemon's own thread,
# while it already serves). Prints each round.
#
#   cargo build --release -p tally-cli --bin tally
#   daemon/benches/live-journal-start.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${T:-target/release/tally}
ROUNDS=${1:-5}
W=$(mktemp -d /tmp/live-journal.XXXXXX)
trap 'rm -rf "$W"' EXIT
"$T" keygen --out "$W/auditor.key" >/dev/null
"$T" init --ledger "$W/ledger" --recipient "$W/auditor.pub" >/dev/null
python3 - "$W/full.ndjson" <<'PY'
import json, sys
t0 = 1764662400000
with open(sys.argv[1], "w") as f:
    for r in range(20000):
        for p in range(60):
            f.write(json.dumps({"run": f"run-{r:05}", "at_ms": t0 + r * 60 + p,
                "points": [[0, p + 1, 100], [1, (p + 1) * 150000000, 10000000000], [3, 1, 4]]},
                separators=(",", ":")) + "\n")
    for i in range(200000):
        r = i % 20000
        f.write(json.dumps({"run": f"run-{r:05}", "at_ms": t0 + 2000000 + i,
            "points": [[0, 61 + i // 20000, 100]]}, separators=(",", ":")) + "\n")
PY
ls -l "$W/full.ndjson" | awk '{print "live.ndjson:", $5, "bytes"}'
start() { # prints "ms to the first answer, ms to the file's rewrite"
  rm -f "$W/a.sock" "$W/o.sock"
  local ino; ino=$(stat -c %i "$W/ledger/live.ndjson" 2>/dev/null || echo none)
  local t0; t0=$(date +%s%N)
  "$T" serve --ledger "$W/ledger" --socket "$W/a.sock" --operator-socket "$W/o.sock" 2>"$W/serve.log" &
  local pid=$!
  until curl -sf --unix-socket "$W/o.sock" http://localhost/v1/health >/dev/null 2>&1; do sleep 0.005; done
  local t1; t1=$(date +%s%N)
  until [ -e "$W/ledger/live.ndjson" ] && [ "$(stat -c %i "$W/ledger/live.ndjson")" != "$ino" ] && [ ! -e "$W/ledger/live.ndjson.tmp" ]; do sleep 0.01; done
  local t2; t2=$(date +%s%N)
  kill -TERM $pid; wait $pid || true
  echo "$(( (t1 - t0) / 1000000 )) $(( (t2 - t0) / 1000000 ))"
}
for i in $(seq "$ROUNDS"); do
  rm -f "$W/ledger/live.ndjson"
  read -r empty _ < <(start)
  cp "$W/full.ndjson" "$W/ledger/live.ndjson"
  read -r full loaded < <(start)
  echo "round $i: first answer: no file ${empty} ms, full file ${full} ms; full file read back and rewritten after ${loaded} ms"
done
