#!/usr/bin/env bash
# make demo: the main job on an embedded local setup. Brings the stack up,
# migrates, checks and lists the projections file testdata/demo/projections.yaml
# (books and blocks, each on an index of its own with its own strict mapping,
# and the chronicle timeline), loads a writing app's workload for the three,
# starts two replicas, which create both indexes, shows the leader draining
# the backlog with the chronicle paused, kills it with kill -9, shows the
# takeover still honouring the pause, resumes, and ends with counts by
# projection and status, the failed rows, each index's documents and its
# verify, and a book's timeline.
# Ctrl-C stops everything it started.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

started_stack=0
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$started_stack" = 1 ] && [ -z "${DEMO_KEEP_STACK:-}" ]; then scripts/stack.sh down; fi
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted"; exit 130' INT TERM

say "1. stack: Postgres + Elasticsearch on loopback"
if ! scripts/stack.sh status >/dev/null 2>&1; then scripts/stack.sh up; started_stack=1; fi
# shellcheck disable=SC1091
. .stack/env
PSQL="${STACK_PG_BINDIR:-/usr/lib/postgresql/15/bin}/psql"
command -v "$PSQL" >/dev/null || PSQL=psql
DB=wlproj_demo
"$PSQL" -q "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
export DATABASE_URL="${DATABASE_URL%/*}/$DB?sslmode=disable"
sql() { "$PSQL" -X -q "$DATABASE_URL" "$@"; }

say "2. build and migrate (guarded: --expect-db $DB)"
make -s build
bin/wlproj migrate --expect-db "$DB"

say "3. the projections file testdata/demo/projections.yaml, with this stack's engine"
# The file names the engine as http://127.0.0.1:9200; the stack's has a port
# of its own. wlproj creates each alias behind an index from its mapping
# file when it first writes: those of an earlier demo on this stack go first.
INDEXES=(demo-books demo-blocks)
export OUTBOX_PROJECTIONS_FILE=.stack/demo-projections.yaml
sed "s|http://127.0.0.1:9200|${ELASTIC_URL//,/, }|" testdata/demo/projections.yaml >"$OUTBOX_PROJECTIONS_FILE"
ES=${ELASTIC_URL%%,*}
for i in "${INDEXES[@]}"; do
  for old in $(curl -sf "$ES/_cat/indices/$i*?h=index"); do curl -sf -XDELETE "$ES/$old" >/dev/null; done
done
bin/wlproj projections check
bin/wlproj projections list

say "4. load the workload (testdata/demo_workload.sql): books and blocks, several versions each, their chronicle, a few bad payloads"
sql -v round=1 -f testdata/demo_workload.sql
sql -c "SELECT projection, entity_type, op, count(*) FROM outbox_events GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"

say "5. two replicas, a and b (logs in .stack/demo-a.log, .stack/demo-b.log)"
export OUTBOX_LEADER_NAME=demo OUTBOX_BULK_SIZE=200 OUTBOX_CONCURRENCY=1 \
  OUTBOX_BASE_BACKOFF_SECONDS=0.5 OUTBOX_MAX_BACKOFF_SECONDS=2 OUTBOX_MAX_ATTEMPTS=3 LOG_LEVEL=info \
  OUTBOX_UNKNOWN_PROJECTION_WAIT=5s
port_a=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
port_b=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
declare -A port=([a]=$port_a [b]=$port_b) pid=()
start() {
  OUTBOX_WORKER_ID=$1 OUTBOX_HTTP_PORT=${port[$1]} bin/wlproj run >>".stack/demo-$1.log" 2>&1 &
  pid[$1]=$!; pids+=($!)
}
: >.stack/demo-a.log; : >.stack/demo-b.log
start a; start b
role() { curl -s "http://127.0.0.1:${port[$1]}/healthz" | python3 -c 'import json,sys; print(json.load(sys.stdin)["role"])' 2>/dev/null || echo down; }
leader=""
for _ in $(seq 1 100); do
  for r in a b; do [ "$(role $r)" = leader ] && leader=$r; done
  [ -n "$leader" ] && break; sleep 0.1
done
[ -n "$leader" ] || { echo "no leader came up"; tail -20 .stack/demo-*.log; exit 1; }
standby=$([ "$leader" = a ] && echo b || echo a)

say "6. $leader leads, $standby stands by; the backlog drains"
echo "a: $(curl -s "http://127.0.0.1:$port_a/healthz")"
echo "b: $(curl -s "http://127.0.0.1:$port_b/healthz")"
aliases() { curl -s "$ES/_cat/aliases/$(IFS=,; echo "${INDEXES[*]}")?h=alias,index&s=alias"; }
for _ in $(seq 1 50); do [ "$(aliases | wc -l)" = "${#INDEXES[@]}" ] && break; sleep 0.1; done
echo "  $leader created each index from its mapping file, behind its alias:"
aliases | sed 's/^/    /'
backlog() { sql -At -c "SELECT string_agg(projection || ' ' || n_left || ' left', ', ' ORDER BY projection) || '; ' || sum(n_done) || ' done, ' || sum(n_failed) || ' failed'
  FROM (SELECT projection, count(*) FILTER (WHERE status IN ('pending','processing')) AS n_left,
               count(*) FILTER (WHERE status = 'done') AS n_done, count(*) FILTER (WHERE status = 'failed') AS n_failed
          FROM outbox_event_states GROUP BY 1) p"; }
projections() { bin/wlproj status | sed -n '/^projections:/,/^top failed/p' | grep -v '^top failed'; }
for _ in 1 2 3; do echo "  backlog: $(backlog)"; sleep 0.3; done
echo "  pause the chronicle, then load a second round: books and blocks drain, the chronicle waits"
bin/wlproj pause --projection chronicle --by demo --why "show a pause"
sql -v round=2 -f testdata/demo_workload.sql
for _ in 1 2 3; do echo "  backlog: $(backlog)"; sleep 0.3; done

say "7. kill -9 $leader (pid ${pid[$leader]}) mid-stream"
kill -9 "${pid[$leader]}"
t0=$(date +%s.%N)
for _ in $(seq 1 200); do [ "$(role $standby)" = leader ] && break; sleep 0.02; done
t1=$(date +%s.%N)
printf '  %s took over in %.2f s: %s\n' "$standby" "$(python3 -c "print($t1 - $t0)")" "$(curl -s "http://127.0.0.1:${port[$standby]}/healthz")"
grep -h '"became leader"' ".stack/demo-$standby.log" | tail -1
start "$leader"
echo "  $leader restarted as standby: $(sleep 0.5; role "$leader")"
for _ in $(seq 1 100); do
  [ "$(sql -At -c "SELECT count(*) FROM outbox_event_states WHERE projection IN ('books', 'blocks') AND status IN ('pending','processing')")" = 0 ] && break
  sleep 0.2
done
echo "  the new leader drained books and blocks and honours the pause: $(backlog)"
projections
echo "  /readyz of $standby: $(curl -s "http://127.0.0.1:${port[$standby]}/readyz")"
bin/wlproj resume --projection chronicle --by demo --why "pause shown"
for _ in $(seq 1 300); do
  left=$(sql -At -c "SELECT count(*) FROM outbox_event_states WHERE status IN ('pending','processing')")
  echo "  backlog: $(backlog)"
  [ "$left" = 0 ] && break; sleep 0.5
done

say "8. result"
sql -c "SELECT projection, status, count(*) FROM outbox_event_states GROUP BY 1, 2 ORDER BY 1, 2"
sql -c "SELECT id, projection, entity_type, entity_id, attempts, error_reason, left(last_error, 70) AS last_error FROM outbox_events WHERE status = 'failed' ORDER BY id"
sql -c "SELECT holder, epoch, acquired_at FROM outbox_leader"
# What each index should hold: an entity whose newest done event is an upsert.
sql -c "SELECT projection, count(*) FILTER (WHERE op = 'upsert') AS live, count(*) FILTER (WHERE op = 'delete') AS deleted
          FROM (SELECT DISTINCT ON (projection, entity_type, entity_id) projection, op FROM outbox_event_states
                 WHERE projection IN ('books', 'blocks') AND status = 'done'
                 ORDER BY projection, entity_type, entity_id, event_version DESC) newest
         GROUP BY 1 ORDER BY 1"
curl -sf -XPOST "$ES/$(IFS=,; echo "${INDEXES[*]}")/_refresh" >/dev/null
for i in "${INDEXES[@]}"; do
  echo "documents in $i: $(curl -s "$ES/$i/_count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')"
done
for p in books blocks; do
  echo; echo "\$ wlproj verify --projection $p"
  bin/wlproj verify --projection "$p"
done
echo
echo "rows in chronicle_events: $(sql -At -c "SELECT count(*) FROM chronicle_events"), one per done chronicle event; a book's timeline:"
sql -c "SELECT event_id, version, op, payload->>'event' AS event, payload->>'word_count' AS words, occurred_at
          FROM chronicle_events WHERE entity_type = 'book' AND entity_id = 'lib1-shelf1-book1' ORDER BY version, event_id"
echo
bin/wlproj failed stats
echo
bin/wlproj status
echo
echo "Next: runbook.md (DATABASE_URL=$DATABASE_URL, ELASTIC_URL=$ELASTIC_URL)."
[ "$started_stack" = 1 ] && [ -z "${DEMO_KEEP_STACK:-}" ] && echo "(the stack goes down now; DEMO_KEEP_STACK=1 keeps it up)"
exit 0
