#!/usr/bin/env bash
# Starts and stops a local stack: a throwaway Postgres cluster and a single
# search engine node, both on loopback, both as an unprivileged user.
#   stack.sh up          start both (no-op if already up), write the env file
#   stack.sh down        stop both, remove their data, leave no process behind
#   stack.sh status      print the env file if the stack is up
#   stack.sh exec CMD…   run CMD with the env file's variables (the stack must be up)
#   stack.sh with CMD…   the same, starting the stack first if it is down and
#                        stopping it afterwards if this call started it
#   stack.sh fetch       install ENGINE's JDK and distribution, start nothing
#   stack.sh env         print the env file's path
#   stack.sh engines     print the engines of the matrix, the default first
#   stack.sh version     print ENGINE's version
# ENGINE picks the engine (see engine_spec; default elasticsearch-7). Each
# engine's stack is separate (its own ports, data directory and Postgres), so
# several can run at once. The default engine writes .stack/env, the others
# .stack/<engine>.env; WLPROJ_STACK_ENV names another file, for a second
# stack of the same engine.
# PG_STANDBY=1 also starts a streaming standby of the Postgres cluster
# (pg_basebackup -R, synchronous commit to it); DATABASE_URL then names both
# hosts with target_session_attrs=read-write.
# Environment: WLPROJ_TEST_DATABASE_URL / WLPROJ_TEST_ELASTIC_URL reuse servers
# the user already runs; ENGINE_VERSION (or ES_VERSION) overrides the
# engine's version. ENGINE_NODES=3 starts a cluster of three nodes instead
# of one (ES_HEAP each, 384m by default), ELASTIC_URL listing their URLs;
#   stack.sh start-node N  starts node N of such a stack again (the drill
#                          kills one with kill -9, STACK_ENGINE_PID_FILES)
# ENGINE_JAVA_OPTS adds JVM options to every engine node the stack starts
# (recorded as STACK_ENGINE_JAVA_OPTS, for the nodes tests start beside it):
# `make test` runs its engines with C1 only, see the Makefile.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STACK_DIR="$ROOT/.stack"
DEFAULT_ENGINE=elasticsearch-7
# The matrix `make test` runs, the default first. projection/engines.go holds
# the same list for the daemon's start-up check; a test keeps them equal.
ENGINES="elasticsearch-7 elasticsearch-8 opensearch-2 opensearch-3"
ENGINE="${ENGINE:-$DEFAULT_ENGINE}"
CACHE_DIR="${WLPROJ_CACHE:-/var/cache/wlproj}"
RUN_USER="${WLPROJ_STACK_USER:-wlproj}"
ENGINE_NODES="${ENGINE_NODES:-1}"
ENGINE_JAVA_OPTS="${ENGINE_JAVA_OPTS:-}"
case "$ENGINE_NODES" in [1-9]) ;; *) echo "stack: ENGINE_NODES=$ENGINE_NODES: a number of nodes from 1 to 9" >&2; exit 1 ;; esac
if [ "$ENGINE_NODES" = 1 ]; then ES_HEAP="${ES_HEAP:-512m}"; else ES_HEAP="${ES_HEAP:-384m}"; fi

log() { echo "stack: $*" >&2; }
die() { echo "stack: $*" >&2; exit 1; }

# engine_spec sets DIST (the distribution), VERSION and JAVA_MIN (the oldest
# JDK the version runs on) for ENGINE. Versions are the newest of each line
# published on Maven Central as org.<dist>.distribution.integ-test-zip:<dist>
# (its maven-metadata.xml lists them).
engine_spec() {
  case "$ENGINE" in
    elasticsearch-7) DIST=elasticsearch VERSION=7.17.29 JAVA_MIN=17 ;;
    elasticsearch-8) DIST=elasticsearch VERSION=8.19.21 JAVA_MIN=17 ;;
    opensearch-2) DIST=opensearch VERSION=2.19.6 JAVA_MIN=17 ;;
    opensearch-3) DIST=opensearch VERSION=3.6.0 JAVA_MIN=21 ;;
    elasticsearch-9)
      die "elasticsearch-9: Elastic publishes no 9.x integ-test-zip on Maven Central (the newest there is 8.19.21)" ;;
    *) die "unknown ENGINE=$ENGINE (one of: $ENGINES)" ;;
  esac
  VERSION="${ENGINE_VERSION:-${ES_VERSION:-$VERSION}}"
  ARTIFACT="org.$DIST.distribution.integ-test-zip:$DIST:$VERSION:zip"
}

env_file() {
  if [ -n "${WLPROJ_STACK_ENV:-}" ]; then echo "$WLPROJ_STACK_ENV"
  elif [ "$ENGINE" = "$DEFAULT_ENGINE" ]; then echo "$STACK_DIR/env"
  else echo "$STACK_DIR/$ENGINE.env"; fi
}
[ "${1:-}" = engines ] || engine_spec
ENV_FILE=$(env_file)

# If "up" fails half way, stop whatever it already started.
cleanup_failed_up() {
  [ -n "${RUN_DIR:-}" ] || return 0
  [ -n "${PG_DATA:-}" ] && as_user "$(pg_bindir)/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
  [ -n "${PG_STANDBY_DATA:-}" ] && as_user "$(pg_bindir)/pg_ctl" -D "$PG_STANDBY_DATA" -m immediate -w stop >/dev/null 2>&1
  local pidfile
  for pidfile in "$RUN_DIR"/es.pid "$RUN_DIR"/es-[0-9].pid; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  rm -rf "$RUN_DIR"
}

# free_port prints a loopback port free a moment ago, below the kernel's
# ephemeral range: the engine binds its ports seconds later, and a port of
# that range may by then be an outgoing connection's source port (stacks
# run side by side in make test). harness.FreePort picks ports the same way.
free_port() {
  python3 - <<'PY'
import random, socket
lo = 32768
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    pass
for port in [random.randrange(10000, lo) for _ in range(100)] if lo - 10000 >= 1000 else []:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

as_user() {
  if [ "$(id -u)" = 0 ]; then
    setpriv --reuid="$RUN_USER" --regid="$RUN_USER" --init-groups -- env HOME=/tmp "$@"
  else
    "$@"
  fi
}

ensure_user() {
  [ "$(id -u)" = 0 ] || { RUN_USER=$(id -un); return; }
  id "$RUN_USER" >/dev/null 2>&1 && return
  log "creating unprivileged user $RUN_USER"
  useradd --system --no-create-home --shell /usr/sbin/nologin "$RUN_USER"
}

apt_install() {
  [ "$(id -u)" = 0 ] || die "need root to install $* (or install it yourself)"
  log "installing $* from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  command -v initdb >/dev/null && { dirname "$(readlink -f "$(command -v initdb)")"; return; }
  return 1
}

ensure_postgres() {
  pg_bindir >/dev/null || apt_install postgresql
  pg_bindir >/dev/null || die "initdb not found after installing postgresql"
}

# java_major prints the feature version of the JDK at $1 (17, 21, 25…).
java_major() {
  "$1/bin/java" -XshowSettings:properties -version 2>&1 |
    sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p'
}

# find_java_home prints the oldest installed JDK of at least JAVA_MIN: the one
# on PATH, JAVA_HOME, and those under /usr/lib/jvm and /opt.
find_java_home() {
  local best="" best_major=1000 d m candidates=()
  command -v java >/dev/null && candidates+=("$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")")
  [ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME")
  for d in /usr/lib/jvm/* /opt/* /opt/java/*; do candidates+=("$d"); done
  for d in "${candidates[@]}"; do
    [ -x "$d/bin/java" ] || continue
    m=$(java_major "$d") || continue
    [ -n "$m" ] && [ "$m" -ge "$JAVA_MIN" ] && [ "$m" -lt "$best_major" ] && { best=$d; best_major=$m; }
  done
  [ -n "$best" ] && echo "$best"
}

ensure_java() {
  if [ "$JAVA_MIN" -le 17 ] && ! command -v java >/dev/null; then apt_install openjdk-17-jre-headless; fi
  JAVA_HOME_FOUND=$(find_java_home) ||
    die "$ENGINE $VERSION needs a JDK $JAVA_MIN or newer; none found on PATH, in JAVA_HOME, /usr/lib/jvm or /opt"
}

# The distribution is fetched through Maven (so ~/.m2 caches the zip) and
# unpacked once into CACHE_DIR, readable by the unprivileged user.
ensure_engine() {
  ENGINE_HOME="$CACHE_DIR/$DIST-$VERSION"
  [ -x "$ENGINE_HOME/bin/$DIST" ] && return
  command -v mvn >/dev/null || apt_install maven
  command -v unzip >/dev/null || apt_install unzip
  local dl; dl=$(mktemp -d)
  log "fetching $ARTIFACT"
  mvn -B -q -Dstyle.color=never dependency:copy -Dartifact="$ARTIFACT" -DoutputDirectory="$dl" >&2 \
    || die "could not fetch $ARTIFACT from Maven"
  mkdir -p "$CACHE_DIR"
  local tmp="$CACHE_DIR/.unpack.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$tmp" && unzip -q "$dl/$DIST-$VERSION.zip")
  # Another stack of the same engine may have unpacked it meanwhile.
  [ -d "$ENGINE_HOME" ] || mv "$tmp/$DIST-$VERSION" "$ENGINE_HOME"
  rm -rf "$tmp" "$dl"
  chmod -R a+rX "$CACHE_DIR"
}

is_up() {
  [ -f "$ENV_FILE" ] || return 1
  # shellcheck disable=SC1090
  ( . "$ENV_FILE"
    if [ -n "${STACK_PG_DATA:-}" ]; then
      "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$STACK_PG_PORT" || exit 1
    fi
    if [ -n "${STACK_PG_STANDBY_PORT:-}" ]; then
      "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$STACK_PG_STANDBY_PORT" || exit 1
    fi
    curl -sf "${ELASTIC_URL%%,*}/_cluster/health" >/dev/null || exit 1 )
}

# want_standby fails when PG_STANDBY=1 asks for a standby the running stack
# does not have: a drill against it would fail late and less clearly.
want_standby() {
  [ "${PG_STANDBY:-}" = 1 ] || return 0
  # shellcheck disable=SC1090
  ( . "$ENV_FILE"; [ -n "${STACK_PG_STANDBY_PORT:-}" ] ) ||
    die "PG_STANDBY=1, but the stack of $ENV_FILE is up without a Postgres standby: stop it (stack.sh down) or use another WLPROJ_STACK_ENV"
}

start_pg() {
  ensure_postgres
  local bindir; bindir=$(pg_bindir)
  PG_PORT=$(free_port)
  PG_DATA="$RUN_DIR/pg"
  as_user "$bindir/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$RUN_DIR/initdb.log" 2>&1 \
    || { cat "$RUN_DIR/initdb.log" >&2; die "initdb failed"; }
  # A throwaway cluster: durability settings are off for speed, except that
  # with a standby a commit waits for it (synchronous_commit=on): for the
  # standby to flush it, which is all a promotion needs to lose no commit a
  # client saw. Not remote_apply, which would also stall every commit while
  # the standby's replay lags: wlproj does not need a standby to have applied
  # a new database or role, it tries a host that refuses them after the
  # others (internal/pgpool/refusals.go).
  # pg_stat_statements is loaded for the bench, which reads what each
  # statement cost (tools/bench/statements.go). max_prepared_transactions
  # lets the horizon tests leave a prepared transaction behind, as a
  # two-phase commit coordinator can (outbox/horizon_test.go); a standby needs
  # at least the primary's value.
  local sync=off
  [ "${PG_STANDBY:-}" = 1 ] && sync=on
  as_user "$bindir/pg_ctl" -D "$PG_DATA" -l "$RUN_DIR/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $RUN_DIR -c max_connections=300 -c fsync=off -c full_page_writes=off -c synchronous_commit=$sync -c shared_buffers=256MB -c shared_preload_libraries=pg_stat_statements -c max_prepared_transactions=8" \
    start >/dev/null || { cat "$RUN_DIR/postgres.log" >&2; die "postgres did not start"; }
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
}

# start_pg_standby copies the cluster with pg_basebackup -R (initdb's trust
# covers replication from loopback), starts the copy as a hot standby on a
# port of its own, waits until it streams, and only then makes the primary
# wait for it on every commit (synchronous_standby_names): set before, the
# primary's commits would hang until the standby exists. The standby has no
# synchronous_standby_names of its own, so once promoted it commits alone.
start_pg_standby() {
  local bindir; bindir=$(pg_bindir)
  PG_STANDBY_PORT=$(free_port)
  PG_STANDBY_DATA="$RUN_DIR/pg-standby"
  as_user "$bindir/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -D "$PG_STANDBY_DATA" -R -X stream \
    -c fast >"$RUN_DIR/basebackup.log" 2>&1 || { cat "$RUN_DIR/basebackup.log" >&2; die "pg_basebackup of the standby failed"; }
  as_user "$bindir/pg_ctl" -D "$PG_STANDBY_DATA" -l "$RUN_DIR/postgres-standby.log" -w -t 60 \
    -o "-p $PG_STANDBY_PORT -c listen_addresses=127.0.0.1 -k $RUN_DIR -c max_connections=300 -c fsync=off -c full_page_writes=off -c shared_buffers=256MB -c max_prepared_transactions=8 -c wal_retrieve_retry_interval=500ms -c cluster_name=standby" \
    start >/dev/null || { cat "$RUN_DIR/postgres-standby.log" >&2; die "the Postgres standby did not start"; }
  local psql="$bindir/psql -X -q -A -t -h 127.0.0.1 -U postgres -d postgres" i state=""
  for i in $(seq 1 120); do
    state=$($psql -p "$PG_PORT" -c "SELECT state FROM pg_stat_replication WHERE application_name = 'standby'" 2>/dev/null || true)
    [ "$state" = streaming ] && break
    sleep 0.25
  done
  [ "$state" = streaming ] || { tail -20 "$RUN_DIR/postgres-standby.log" >&2; die "the Postgres standby does not stream (state '$state')"; }
  $psql -p "$PG_PORT" -c "ALTER SYSTEM SET synchronous_standby_names = 'standby'" -c "SELECT pg_reload_conf()" >/dev/null \
    || die "could not make the standby synchronous"
  for i in $(seq 1 40); do
    state=$($psql -p "$PG_PORT" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'" 2>/dev/null || true)
    [ "$state" = sync ] && break
    sleep 0.25
  done
  [ "$state" = sync ] || die "the Postgres standby is not synchronous (sync_state '$state')"
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$PG_STANDBY_PORT/postgres?sslmode=disable&target_session_attrs=read-write"
}

# start_engine runs one node on loopback with security off: Elasticsearch's
# integ-test zips carry x-pack security (on by default from 8.0), OpenSearch's
# carry no security plugin at all.
start_engine() {
  ensure_java
  ensure_engine
  ES_PORT=$(free_port)
  local conf="$RUN_DIR/es-config" prefix=ES extra=()
  cp -r "$ENGINE_HOME/config" "$conf"
  # GC logs and heap dumps would land relative to the working directory.
  sed -i -e '/Xlog:gc/d' -e '/HeapDump/d' "$conf/jvm.options"
  chown -R "$RUN_USER" "$conf" 2>/dev/null || true
  mkdir -p "$RUN_DIR/es-tmp"; chown "$RUN_USER" "$RUN_DIR/es-tmp" 2>/dev/null || true
  if [ "$DIST" = opensearch ]; then prefix=OPENSEARCH; else extra+=(-Expack.security.enabled=false); fi
  as_user env "${prefix}_JAVA_HOME=$JAVA_HOME_FOUND" "${prefix}_PATH_CONF=$conf" "${prefix}_TMPDIR=$RUN_DIR/es-tmp" \
    "${prefix}_JAVA_OPTS=-Xms$ES_HEAP -Xmx$ES_HEAP $ENGINE_JAVA_OPTS" \
    "$ENGINE_HOME/bin/$DIST" -d -p "$RUN_DIR/es.pid" \
    -Ediscovery.type=single-node -Enetwork.host=127.0.0.1 -Ehttp.port="$ES_PORT" \
    -Etransport.port="$(free_port)" "${extra[@]}" \
    -Ecluster.routing.allocation.disk.threshold_enabled=false \
    -Epath.data="$RUN_DIR/es-data" -Epath.logs="$RUN_DIR/es-logs" >"$RUN_DIR/es-start.log" 2>&1 \
    || { cat "$RUN_DIR/es-start.log" >&2; tail -30 "$RUN_DIR/es-logs/"*.log >&2 2>/dev/null; die "$ENGINE did not start"; }
  ELASTIC_URL="http://127.0.0.1:$ES_PORT"
  local i
  for i in $(seq 1 240); do
    curl -sf "$ELASTIC_URL/_cluster/health?wait_for_status=yellow&timeout=1s" >/dev/null && return
    sleep 0.5
  done
  tail -50 "$RUN_DIR/es-logs/"*.log >&2 || true
  die "$ENGINE did not become healthy"
}

# start_cluster runs ENGINE_NODES nodes on loopback forming one cluster, with
# explicit discovery (the transport ports are fixed before the first node
# starts) and each node's own config, data, log and pid. Nodes start in the
# background; the cluster must then see all of them.
start_cluster() {
  ensure_java
  ensure_engine
  local i hosts="" names="" urls=""
  ENGINE_HTTP_PORTS=""; ENGINE_TRANSPORT_PORTS=""; ENGINE_PID_FILES=""
  for i in $(seq 1 "$ENGINE_NODES"); do
    local hp tp; hp=$(free_port); tp=$(free_port)
    ENGINE_HTTP_PORTS+="${ENGINE_HTTP_PORTS:+ }$hp"; ENGINE_TRANSPORT_PORTS+="${ENGINE_TRANSPORT_PORTS:+ }$tp"
    ENGINE_PID_FILES+="${ENGINE_PID_FILES:+ }$RUN_DIR/es-$i.pid"
    hosts+="${hosts:+,}127.0.0.1:$tp"; names+="${names:+,}node-$i"; urls+="${urls:+,}http://127.0.0.1:$hp"
  done
  ENGINE_SEED_HOSTS=$hosts; ENGINE_NODE_NAMES=$names
  for i in $(seq 1 "$ENGINE_NODES"); do
    local conf="$RUN_DIR/es-config-$i"
    cp -r "$ENGINE_HOME/config" "$conf"
    sed -i -e '/Xlog:gc/d' -e '/HeapDump/d' "$conf/jvm.options"
    chown -R "$RUN_USER" "$conf" 2>/dev/null || true
    mkdir -p "$RUN_DIR/es-tmp-$i"; chown "$RUN_USER" "$RUN_DIR/es-tmp-$i" 2>/dev/null || true
    start_node "$i"
  done
  ELASTIC_URL=$urls
  for i in $(seq 1 240); do
    curl -sf "${ELASTIC_URL%%,*}/_cluster/health?wait_for_nodes=$ENGINE_NODES&wait_for_status=green&timeout=1s" >/dev/null && return
    sleep 0.5
  done
  tail -30 "$RUN_DIR/es-logs-"*/*.log >&2 || true
  die "$ENGINE: $ENGINE_NODES nodes did not form a green cluster"
}

# start_node starts node $1 of a cluster with the ports and names in
# ENGINE_HTTP_PORTS, ENGINE_TRANSPORT_PORTS, ENGINE_SEED_HOSTS and
# ENGINE_NODE_NAMES; its data directory is kept, so a restarted node rejoins
# with its shards. cluster.initial_* only matter at the first election.
start_node() {
  local i=$1 prefix=ES extra=() hp tp
  hp=$(echo "$ENGINE_HTTP_PORTS" | cut -d' ' -f"$i"); tp=$(echo "$ENGINE_TRANSPORT_PORTS" | cut -d' ' -f"$i")
  if [ "$DIST" = opensearch ]; then
    prefix=OPENSEARCH; extra+=(-Ecluster.initial_cluster_manager_nodes="$ENGINE_NODE_NAMES")
  else
    extra+=(-Expack.security.enabled=false -Ecluster.initial_master_nodes="$ENGINE_NODE_NAMES")
  fi
  as_user env "${prefix}_JAVA_HOME=$JAVA_HOME_FOUND" "${prefix}_PATH_CONF=$RUN_DIR/es-config-$i" "${prefix}_TMPDIR=$RUN_DIR/es-tmp-$i" \
    "${prefix}_JAVA_OPTS=-Xms$ES_HEAP -Xmx$ES_HEAP $ENGINE_JAVA_OPTS" \
    "$ENGINE_HOME/bin/$DIST" -d -p "$RUN_DIR/es-$i.pid" \
    -Ecluster.name=wlproj-stack -Enode.name="node-$i" -Ediscovery.seed_hosts="$ENGINE_SEED_HOSTS" \
    -Enetwork.host=127.0.0.1 -Ehttp.port="$hp" -Etransport.port="$tp" "${extra[@]}" \
    -Ecluster.routing.allocation.disk.threshold_enabled=false \
    -Epath.data="$RUN_DIR/es-data-$i" -Epath.logs="$RUN_DIR/es-logs-$i" >"$RUN_DIR/es-start-$i.log" 2>&1 \
    || { cat "$RUN_DIR/es-start-$i.log" >&2; tail -30 "$RUN_DIR/es-logs-$i/"*.log >&2 2>/dev/null; die "$ENGINE node $i did not start"; }
}

# restart_node starts node $1 of the cluster in the env file again, after a
# kill; it returns once the node answers, not once the cluster is green.
restart_node() {
  local i=${1:-}
  [ -f "$ENV_FILE" ] || die "$ENGINE is not up"
  # shellcheck disable=SC1090
  . "$ENV_FILE"
  [ "${STACK_ENGINE_NODES:-1}" -gt 1 ] || die "start-node: the stack in $ENV_FILE has one engine node"
  case "$i" in [1-9]) [ "$i" -le "$STACK_ENGINE_NODES" ] || die "start-node $i: the stack has $STACK_ENGINE_NODES nodes" ;;
    *) die "usage: $0 start-node N (1 to $STACK_ENGINE_NODES)" ;; esac
  local pidfile="$STACK_RUN_DIR/es-$i.pid"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then die "start-node $i: node $i is running"; fi
  RUN_DIR=$STACK_RUN_DIR; ENGINE_HOME=$STACK_ENGINE_HOME; JAVA_HOME_FOUND=$STACK_JAVA_HOME; ES_HEAP=$STACK_ES_HEAP
  ENGINE_JAVA_OPTS=${STACK_ENGINE_JAVA_OPTS:-}
  ENGINE_HTTP_PORTS=$STACK_ENGINE_HTTP_PORTS; ENGINE_TRANSPORT_PORTS=$STACK_ENGINE_TRANSPORT_PORTS
  ENGINE_SEED_HOSTS=$STACK_ENGINE_SEED_HOSTS; ENGINE_NODE_NAMES=$STACK_ENGINE_NODE_NAMES
  rm -f "$pidfile"
  start_node "$i"
  local hp; hp=$(echo "$ENGINE_HTTP_PORTS" | cut -d' ' -f"$i")
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$hp/_cluster/health?local=true" >/dev/null && { log "node $i up on port $hp"; return; }
    sleep 0.5
  done
  die "$ENGINE node $i did not answer"
}

up() {
  command -v curl >/dev/null || apt_install curl
  command -v python3 >/dev/null || apt_install python3
  if is_up; then want_standby; log "$ENGINE already up ($ENV_FILE)"; return; fi
  [ -f "$ENV_FILE" ] && down
  ensure_user
  mkdir -p "$STACK_DIR"
  # Data lives outside the checkout so the unprivileged user can reach it even
  # when the checkout sits under a private home directory.
  RUN_DIR=$(mktemp -d /tmp/wlproj-stack.XXXXXX)
  trap 'rc=$?; [ $rc = 0 ] || cleanup_failed_up; exit $rc' EXIT
  chmod 755 "$RUN_DIR"; chown "$RUN_USER" "$RUN_DIR" 2>/dev/null || true
  local t0=$SECONDS
  if [ -n "${WLPROJ_TEST_DATABASE_URL:-}" ]; then
    [ "${PG_STANDBY:-}" = 1 ] && die "PG_STANDBY=1 needs the stack's own Postgres (unset WLPROJ_TEST_DATABASE_URL)"
    DATABASE_URL="$WLPROJ_TEST_DATABASE_URL"; PG_DATA=""; PG_PORT=""
  else
    start_pg
  fi
  PG_STANDBY_DATA=""; PG_STANDBY_PORT=""
  [ "${PG_STANDBY:-}" = 1 ] && start_pg_standby
  ENGINE_HOME=""; JAVA_HOME_FOUND=""
  ENGINE_HTTP_PORTS=""; ENGINE_TRANSPORT_PORTS=""; ENGINE_PID_FILES=""; ENGINE_SEED_HOSTS=""; ENGINE_NODE_NAMES=""
  if [ -n "${WLPROJ_TEST_ELASTIC_URL:-}" ]; then
    ELASTIC_URL="$WLPROJ_TEST_ELASTIC_URL"
  elif [ "$ENGINE_NODES" -gt 1 ]; then
    start_cluster
  else
    start_engine
  fi
  cat >"$ENV_FILE" <<ENV
export DATABASE_URL='$DATABASE_URL'
export ELASTIC_URL='$ELASTIC_URL'
export STACK_ENGINE='$ENGINE'
export STACK_ENGINE_HOME='$ENGINE_HOME'
export STACK_JAVA_HOME='$JAVA_HOME_FOUND'
export STACK_RUN_DIR='$RUN_DIR'
export STACK_PG_DATA='$PG_DATA'
export STACK_PG_PORT='$PG_PORT'
export STACK_PG_BINDIR='$(pg_bindir)'
export STACK_PG_STANDBY_DATA='$PG_STANDBY_DATA'
export STACK_PG_STANDBY_PORT='$PG_STANDBY_PORT'
export STACK_RUN_USER='$RUN_USER'
export STACK_ENGINE_NODES='$ENGINE_NODES'
export STACK_ES_HEAP='$ES_HEAP'
export STACK_ENGINE_JAVA_OPTS='$ENGINE_JAVA_OPTS'
export STACK_ENGINE_HTTP_PORTS='$ENGINE_HTTP_PORTS'
export STACK_ENGINE_TRANSPORT_PORTS='$ENGINE_TRANSPORT_PORTS'
export STACK_ENGINE_PID_FILES='$ENGINE_PID_FILES'
export STACK_ENGINE_SEED_HOSTS='$ENGINE_SEED_HOSTS'
export STACK_ENGINE_NODE_NAMES='$ENGINE_NODE_NAMES'
ENV
  trap - EXIT
  log "$ENGINE $VERSION up in $((SECONDS - t0))s: DATABASE_URL=$DATABASE_URL ELASTIC_URL=$ELASTIC_URL ($ENV_FILE)"
}

down() {
  [ -f "$ENV_FILE" ] || { log "$ENGINE not up"; return; }
  # shellcheck disable=SC1090
  . "$ENV_FILE"
  if [ -n "${STACK_PG_DATA:-}" ] && [ -d "$STACK_PG_DATA" ]; then
    as_user "$STACK_PG_BINDIR/pg_ctl" -D "$STACK_PG_DATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  # A primary killed by the failover drill leaves pg_ctl nothing to stop.
  if [ -n "${STACK_PG_STANDBY_DATA:-}" ] && [ -d "$STACK_PG_STANDBY_DATA" ]; then
    as_user "$STACK_PG_BINDIR/pg_ctl" -D "$STACK_PG_STANDBY_DATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  local pidfile pid
  for pidfile in "$STACK_RUN_DIR"/es.pid "$STACK_RUN_DIR"/es-[0-9].pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  done
  case "${STACK_RUN_DIR:-}" in /tmp/wlproj-stack.*) rm -rf "$STACK_RUN_DIR" ;; esac
  rm -f "$ENV_FILE"
  log "$ENGINE down"
}

# exec_with_env runs "$@" with the env file's variables, and WLPROJ_STACK_ENV
# naming the file for the test harness.
exec_with_env() {
  [ $# -gt 0 ] || die "usage: $0 exec|with COMMAND..."
  [ -f "$ENV_FILE" ] || die "$ENGINE is not up: run ENGINE=$ENGINE $0 up"
  # shellcheck disable=SC1090
  ( set -a; . "$ENV_FILE"; set +a; export WLPROJ_STACK_ENV="$ENV_FILE"; "$@" )
}

with() {
  local started=0 rc=0 t0=$SECONDS
  if ! is_up; then
    trap 'down; exit 130' INT TERM
    up; started=1
  else
    want_standby
  fi
  exec_with_env "$@" || rc=$?
  if [ $started = 1 ]; then down; fi
  log "$ENGINE: $* exited $rc after $((SECONDS - t0))s"
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if is_up; then cat "$ENV_FILE"; else echo "stack: $ENGINE down"; exit 1; fi ;;
  exec) shift; exec_with_env "$@" ;;
  with) shift; with "$@" ;;
  fetch) ensure_user; ensure_java; ensure_engine ;;
  env) echo "$ENV_FILE" ;;
  engines) echo "$ENGINES" ;;
  version) echo "$VERSION" ;;
  start-node) shift; restart_node "$@" ;;
  *) die "usage: $0 up|down|status|exec|with|fetch|env|engines|version|start-node N" ;;
esac
