#!/usr/bin/env bash
# Two builds of the gate side by side (docs/PERFORMANCE.md): a plain `tally serve` from
# each (A's tally-load, B's tally-load) over fresh ledgers under the lifted policy of
# "The gate", benched in turn with B's load client (64 clients, --check), ROUNDS rounds
# of SECONDS, the order alternating; prints each round's B/A and the means.
#
#   daemon/benches/gate-vs.sh OLD/tally-load NEW/tally-load [ROUNDS] [SECONDS]
#   TMPDIR=/dev/shm daemon/benches/gate-vs.sh ...   # ledgers on tmpfs (no fsync noise)
set -euo pipefail
A=$1; B=$2; ROUNDS=${3:-10}; S=${4:-3}
W=$(mktemp -d "${TMPDIR:-/tmp}/gate-vs.XXXXXX"); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
cp "$(dirname "$0")/lifted-policy.toml" "$W/p.toml"
for s in a b; do
  if [ $s = a ]; then L=$A; else L=$B; fi
  $L init --ledger "$W/$s" > /dev/null
  $L serve --ledger "$W/$s" --socket "$W/$s.sock" --policy "$W/p.toml" 2>/dev/null &
  pids+=($!)
done
for s in a b; do while [ ! -S "$W/$s.sock" ]; do sleep 0.05; done; done
sleep 0.5
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for s in $order; do
    $B bench --socket "$W/$s.sock" --clients 64 --seconds "$S" --check --json | tail -1 > "$W/$s.$r.json"
  done
  python3 -c "
import json,sys
a=json.load(open('$W/a.$r.json'))['decisions_per_sec']; b=json.load(open('$W/b.$r.json'))['decisions_per_sec']
print('round $r: a %.0f b %.0f b/a %.3f' % (a,b,b/a))"
done
python3 - "$W" "$ROUNDS" <<'PY'
import json,sys,statistics
w,n=sys.argv[1],int(sys.argv[2])
a=[json.load(open(f"{w}/a.{r}.json"))["decisions_per_sec"] for r in range(1,n+1)]
b=[json.load(open(f"{w}/b.{r}.json"))["decisions_per_sec"] for r in range(1,n+1)]
rat=[y/x for x,y in zip(a,b)]
print("means: a %.0f b %.0f ratio of the means %.3f; median per-round ratio %.3f" % (statistics.mean(a),statistics.mean(b),statistics.mean(b)/statistics.mean(a),statistics.median(rat)))
PY
