#!/usr/bin/env bash
# Starts and stops the local stack: a throwaway Postgres cluster and a single
# Elasticsearch node, both on loopback, both as an unprivileged user.
#   stack.sh up     start both (no-op if already up), write .stack/env
#   stack.sh down   stop both, remove their data, leave no process behind
#   stack.sh status print whether the stack is up
# Environment: WLPROJ_TEST_DATABASE_URL / WLPROJ_TEST_ELASTIC_URL reuse servers
# the user already runs; ES_VERSION picks the engine version.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STACK_DIR="$ROOT/.stack"
ENV_FILE="$STACK_DIR/env"
ES_VERSION="${ES_VERSION:-7.17.29}"
ES_ARTIFACT="org.elasticsearch.distribution.integ-test-zip:elasticsearch:${ES_VERSION}:zip"
CACHE_DIR="${WLPROJ_CACHE:-/var/cache/wlproj}"
RUN_USER="${WLPROJ_STACK_USER:-wlproj}"
ES_HEAP="${ES_HEAP:-512m}"

log() { echo "stack: $*" >&2; }
die() { echo "stack: $*" >&2; exit 1; }
# If "up" fails half way, stop whatever it already started.
cleanup_failed_up() {
  [ -n "${RUN_DIR:-}" ] || return 0
  [ -n "${PG_DATA:-}" ] && as_user "$(pg_bindir)/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
  [ -f "$RUN_DIR/es.pid" ] && kill -9 "$(cat "$RUN_DIR/es.pid")" 2>/dev/null
  rm -rf "$RUN_DIR"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
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

ensure_java() {
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null || apt_install maven
  command -v unzip >/dev/null || apt_install unzip
}

# The distribution is fetched through Maven (so ~/.m2 caches the zip) and
# unpacked once into CACHE_DIR, readable by the unprivileged user.
ensure_es() {
  ES_HOME="$CACHE_DIR/elasticsearch-$ES_VERSION"
  [ -x "$ES_HOME/bin/elasticsearch" ] && return
  ensure_java
  local dl; dl=$(mktemp -d)
  log "fetching $ES_ARTIFACT"
  mvn -B -q dependency:copy -Dartifact="$ES_ARTIFACT" -DoutputDirectory="$dl" >&2 \
    || die "could not fetch $ES_ARTIFACT from Maven"
  mkdir -p "$CACHE_DIR"
  local tmp="$CACHE_DIR/.unpack.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$tmp" && unzip -q "$dl"/elasticsearch-"$ES_VERSION".zip)
  mv "$tmp/elasticsearch-$ES_VERSION" "$ES_HOME"
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
    curl -sf "$ELASTIC_URL/_cluster/health" >/dev/null || exit 1 )
}

start_pg() {
  ensure_postgres
  local bindir; bindir=$(pg_bindir)
  PG_PORT=$(free_port)
  PG_DATA="$RUN_DIR/pg"
  as_user "$bindir/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$RUN_DIR/initdb.log" 2>&1 \
    || { cat "$RUN_DIR/initdb.log" >&2; die "initdb failed"; }
  # A throwaway cluster: durability settings are off for speed.
  as_user "$bindir/pg_ctl" -D "$PG_DATA" -l "$RUN_DIR/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $RUN_DIR -c max_connections=300 -c fsync=off -c full_page_writes=off -c synchronous_commit=off -c shared_buffers=256MB" \
    start >/dev/null || { cat "$RUN_DIR/postgres.log" >&2; die "postgres did not start"; }
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
}

start_es() {
  ensure_es
  local java_home; java_home=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
  ES_PORT=$(free_port)
  local conf="$RUN_DIR/es-config"
  cp -r "$ES_HOME/config" "$conf"
  # GC logs and heap dumps would land relative to the working directory.
  sed -i -e '/Xlog:gc/d' -e '/HeapDump/d' "$conf/jvm.options"
  chown -R "$RUN_USER" "$conf" 2>/dev/null || true
  mkdir -p "$RUN_DIR/es-tmp"; chown "$RUN_USER" "$RUN_DIR/es-tmp" 2>/dev/null || true
  as_user env ES_JAVA_HOME="$java_home" ES_PATH_CONF="$conf" ES_TMPDIR="$RUN_DIR/es-tmp" \
    ES_JAVA_OPTS="-Xms$ES_HEAP -Xmx$ES_HEAP" \
    "$ES_HOME/bin/elasticsearch" -d -p "$RUN_DIR/es.pid" \
    -Ediscovery.type=single-node -Enetwork.host=127.0.0.1 -Ehttp.port="$ES_PORT" \
    -Etransport.port="$(free_port)" -Expack.security.enabled=false \
    -Ecluster.routing.allocation.disk.threshold_enabled=false \
    -Epath.data="$RUN_DIR/es-data" -Epath.logs="$RUN_DIR/es-logs" >"$RUN_DIR/es-start.log" 2>&1 \
    || { cat "$RUN_DIR/es-start.log" >&2; die "elasticsearch did not start"; }
  ELASTIC_URL="http://127.0.0.1:$ES_PORT"
  local i
  for i in $(seq 1 240); do
    curl -sf "$ELASTIC_URL/_cluster/health?wait_for_status=yellow&timeout=1s" >/dev/null && return
    sleep 0.5
  done
  tail -50 "$RUN_DIR/es-logs/"*.log >&2 || true
  die "elasticsearch did not become healthy"
}

up() {
  command -v curl >/dev/null || apt_install curl
  command -v python3 >/dev/null || apt_install python3
  if is_up; then log "already up ($ENV_FILE)"; return; fi
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
    DATABASE_URL="$WLPROJ_TEST_DATABASE_URL"; PG_DATA=""; PG_PORT=""
  else
    start_pg
  fi
  if [ -n "${WLPROJ_TEST_ELASTIC_URL:-}" ]; then
    ELASTIC_URL="$WLPROJ_TEST_ELASTIC_URL"
  else
    start_es
  fi
  cat >"$ENV_FILE" <<ENV
export DATABASE_URL='$DATABASE_URL'
export ELASTIC_URL='$ELASTIC_URL'
export STACK_RUN_DIR='$RUN_DIR'
export STACK_PG_DATA='$PG_DATA'
export STACK_PG_PORT='$PG_PORT'
export STACK_PG_BINDIR='$(pg_bindir)'
export STACK_RUN_USER='$RUN_USER'
ENV
  trap - EXIT
  log "up in $((SECONDS - t0))s: DATABASE_URL=$DATABASE_URL ELASTIC_URL=$ELASTIC_URL"
}

down() {
  [ -f "$ENV_FILE" ] || { log "not up"; return; }
  # shellcheck disable=SC1090
  . "$ENV_FILE"
  if [ -n "${STACK_PG_DATA:-}" ] && [ -d "$STACK_PG_DATA" ]; then
    as_user "$STACK_PG_BINDIR/pg_ctl" -D "$STACK_PG_DATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ -f "$STACK_RUN_DIR/es.pid" ]; then
    local pid; pid=$(cat "$STACK_RUN_DIR/es.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  case "${STACK_RUN_DIR:-}" in /tmp/wlproj-stack.*) rm -rf "$STACK_RUN_DIR" ;; esac
  rm -f "$ENV_FILE"
  log "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if is_up; then cat "$ENV_FILE"; else echo "stack: down"; exit 1; fi ;;
  *) die "usage: $0 up|down|status" ;;
esac
