#!/usr/bin/env bash
# Three `tally serve` daemons, four ways, interleaved round by round (docs/PERFORMANCE.md,
# "The leased mode"):
#   a  embedded: each daemon its own ledger and its own gate state (no --state)
#   b  central:  --state on one PostgreSQL (one transaction per decision)
#   c  leased:   --state --leases, each daemon's clients on runs started through it
#   d  leased, runs spread: client i's run started through daemon i mod 3 (an even
#      spread over the three hosts), its calls sent to its own daemon
# Each measurement starts three fresh daemons (fresh ledgers, the lifted policy below,
# leases at their defaults), runs one `tally-load bench --check` per daemon at once
# (CLIENTS clients each, SECONDS), stops them (SIGTERM: slices go back) and prints the
# fleet's calls/s (the sum) and p50 (the median of the three), then per configuration
# min/median/max and each round's ratio to (a). For b, c and d it also counts what
# PostgreSQL executed meanwhile (pg_stat_statements, reset before each measurement,
# lease ticks included) and its commits (pg_stat_database.xact_commit), per call.
# A call is a check and its outcome.
#
#   daemon/benches/fleet-leased.sh target/release/tally target/release/tally-load [ROUNDS] [SECONDS] [CLIENTS]
#   BENCH_DIR=/tmp/lbench-pg daemon/benches/fleet-leased.sh ...   # where the cluster and ledgers live (removed at exit)
set -euo pipefail
TALLY=$(realpath "$1"); LOAD=$(realpath "$2"); ROUNDS=${3:-3}; S=${4:-6}; CLIENTS=${5:-6}
W=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/fleet-leased.XXXXXX")}
mkdir -p "$W"
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$BIN/initdb" ] || BIN=$(pg_config --bindir)
PORT=$((20000 + $$ % 20000)); PG="$W/pg"; SOCK="$W/pgsock"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  as_pg "$BIN/pg_ctl" -D "$PG/data" -m fast stop > /dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT

# PostgreSQL as the tests start it (testkit/src/postgres.rs): trust on a private Unix
# socket, no TCP, fsync on; pg_stat_statements loaded to count statements.
# As root, the server runs as postgres, which must enter $W (mktemp makes it 0700 root)
# and own its data and socket dirs, as testkit does with its own.
mkdir -p "$PG" "$SOCK"
if [ "$(id -u)" = 0 ]; then chown postgres: "$W" "$PG" "$SOCK"; fi
as_pg "$BIN/initdb" -D "$PG/data" -U tally --auth=trust -E UTF8 --no-sync > /dev/null
as_pg "$BIN/pg_ctl" -D "$PG/data" -l "$PG/log" -w start \
  -o "-k $SOCK -c listen_addresses= -p $PORT -c fsync=on -c shared_preload_libraries=pg_stat_statements -c max_connections=200" > /dev/null
psql_() { psql -X -q -t -A -h "$SOCK" -p "$PORT" -U tally -v ON_ERROR_STOP=1 "$@"; }
psql_ -d postgres -c "CREATE ROLE gate LOGIN" -c "CREATE DATABASE gate OWNER gate"
psql_ -d gate -c "CREATE EXTENSION pg_stat_statements"
URL="host=$SOCK port=$PORT user=gate dbname=gate"

# No rate buckets, no loop breakers: only each run's budget (the ceiling: a lease scope
# per run in c and d) limits the load.
cat > "$W/policy.toml" <<'EOF'
[ceiling]
attempts = 100000000
spend_cents = 10000000000
side_effects = 100000000
[loops]
tool_calls = 100000000
[rate]
run_per_sec = 0
tool_per_sec = 0
tool_in_flight = 0
[approvals]
ask_on = []
EOF
"$TALLY" keygen --out "$W/auditor.key" > /dev/null

# One measurement of configuration $1 in round $2: three daemons, three load clients.
measure() {
  local c=$1 r=$2 d="$W/$1.$2" i
  local flags=()
  case $c in b) flags=(--state "$URL");; c|d) flags=(--state "$URL" --leases);; esac
  pids=()
  for i in 0 1 2; do
    mkdir -p "$d/host$i"
    "$TALLY" init --ledger "$d/host$i/ledger" --recipient "$W/auditor.pub" > /dev/null
    local holder=()
    case $c in c|d) holder=(--lease-holder "r$r-host$i");; esac
    "$TALLY" serve --ledger "$d/host$i/ledger" --socket "$d/host$i/agent.sock" \
      --operator-socket "$d/host$i/operator.sock" --policy "$W/policy.toml" "${flags[@]}" "${holder[@]}" 2> "$d/host$i/log" &
    pids+=($!)
  done
  for i in 0 1 2; do while [ ! -S "$d/host$i/agent.sock" ]; do sleep 0.05; done; done
  sleep 0.5
  local before=0
  if [ "$c" != a ]; then
    psql_ -d gate -c "SELECT pg_stat_statements_reset()" > /dev/null
    before=$(psql_ -d gate -c "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'gate'" | tail -1)
  fi
  local lp=()
  for i in 0 1 2; do
    local spread=()
    [ "$c" = d ] && spread=(--start-on "$d/host0/agent.sock,$d/host1/agent.sock,$d/host2/agent.sock")
    "$LOAD" bench --socket "$d/host$i/agent.sock" --clients "$CLIENTS" --seconds "$S" \
      --check "${spread[@]}" --json > "$d/load$i.out" &
    lp+=($!)
  done
  for p in "${lp[@]}"; do wait "$p"; done
  # The gate backend's own count of its round trips (its connection, not the lease
  # thread's), and the lease events, from each daemon's /metrics.
  local trips=0
  for i in 0 1 2; do
    curl -s --unix-socket "$d/host$i/operator.sock" http://tally/metrics > "$d/metrics$i.txt"
    local n; n=$(awk '/^tally_backend_round_trips/ {print int($2)}' "$d/metrics$i.txt" | head -1)
    trips=$((trips + ${n:-0}))
  done
  # Stopped first (SIGTERM: leased slices go back; a closed connection flushes its
  # backend's counts into pg_stat_database), then counted: the shutdown is amortised too.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  local stmts=0 commits=0
  if [ "$c" != a ]; then
    sleep 0.5
    stmts=$(psql_ -d gate -c "SELECT coalesce(sum(calls),0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'gate'")
    commits=$(( $(psql_ -d gate -c "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'gate'" | tail -1) - before ))
    psql_ -d gate -c "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 110) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'gate' ORDER BY calls DESC LIMIT 25" > "$d/statements.txt"
  fi
  python3 - "$d" "$c" "$r" "$stmts" "$commits" "$trips" <<'PY' | tee -a "$W/results"
import json, statistics, sys
d, c, r = sys.argv[1], sys.argv[2], sys.argv[3]
stmts, commits, trips = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
runs = [json.loads(open(f"{d}/load{i}.out").read().strip().splitlines()[-1]) for i in range(3)]
rate = sum(x["decisions_per_sec"] for x in runs)
calls = sum(x["requests"] for x in runs)
p50 = statistics.median(x["p50_ms"] for x in runs)
per = (stmts / calls, commits / calls, trips / calls) if calls else (0.0, 0.0, 0.0)
print(json.dumps({"config": c, "round": int(r), "calls_per_sec": rate, "p50_ms": p50,
                  "p99_ms": statistics.median(x["p99_ms"] for x in runs), "calls": calls,
                  "statements_per_call": per[0], "commits_per_call": per[1],
                  "gate_round_trips_per_call": per[2]}))
PY
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for c in a b c d; do measure "$c" "$r"; done
  echo "load average after round $r: $(cut -d' ' -f1-3 /proc/loadavg)"
done
for c in b c d; do
  echo "== top statements, $c, last round"; cat "$W/$c.$ROUNDS/statements.txt"
  echo "== lease events, $c, last round"; grep -h '^tally_lease_events_total' "$W/$c.$ROUNDS"/metrics*.txt || true
done
python3 - "$W/results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = lambda c, k: [x[k] for x in rows if x["config"] == c]
names = {"a": "embedded", "b": "PostgreSQL central", "c": "PostgreSQL leased, runs local",
         "d": "PostgreSQL leased, runs spread"}
print("config | calls/s min/median/max | p50 ms min/median/max | p99 ms median | statements/call | commits/call | gate round trips/call")
for c in "abcd":
    v, p, q = by(c, "calls_per_sec"), by(c, "p50_ms"), by(c, "p99_ms")
    s, t, u = by(c, "statements_per_call"), by(c, "commits_per_call"), by(c, "gate_round_trips_per_call")
    print(f"{c} {names[c]} | {min(v):.0f} / {statistics.median(v):.0f} / {max(v):.0f} | "
          f"{min(p):.2f} / {statistics.median(p):.2f} / {max(p):.2f} | {statistics.median(q):.2f} | "
          f"{statistics.median(s):.2f} | {statistics.median(t):.2f} | {statistics.median(u):.2f}")
print("round | (b)/(a) calls/s, p50 | (c)/(a) calls/s, p50 | (d)/(a) calls/s, p50")
for r in sorted({x["round"] for x in rows}):
    g = {x["config"]: x for x in rows if x["round"] == r}
    a = g["a"]
    print(f"{r} | " + " | ".join(
        f"{g[c]['calls_per_sec'] / a['calls_per_sec']:.2f}, {g[c]['p50_ms'] / a['p50_ms']:.2f}x" for c in "bcd"))
PY
