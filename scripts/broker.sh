#!/usr/bin/env bash
# Run a Tansu Kafka-protocol broker in the background, for demos and manual use.
# (The Rust test harness spawns the binary itself.)
#
# Usage: scripts/broker.sh {start|kill|status} DATADIR PORT
#
#   start   start the broker on 127.0.0.1:PORT, working directory DATADIR,
#           pid file DATADIR/tansu.pid, log DATADIR/tansu.log; waits until the
#           port accepts TCP connections. Succeeds if it is already running.
#   kill    SIGKILL the broker named in the pid file and wait for it to exit.
#           (SIGTERM leaves Tansu answering errors, so it is never used.)
#   status  exit 0 if the broker is running and accepting TCP, 3 otherwise.
#
# Environment:
#   SIPHON_TANSU_VARIANT  memory (default) or durable: picks the cached binary
#                         and the storage engine (memory://tansu/ or
#                         sqlite://tansu.db inside DATADIR).
#   SIPHON_TANSU_BIN      use this binary instead of the cached one.
#   SIPHON_CACHE_DIR      cache root used by scripts/install-deps.sh.
#   SIPHON_TANSU_LOG      Tansu's log level (RUST_LOG syntax; default warn).
#
# The memory engine keeps nothing across restarts and auto-creates unknown
# topics (4 partitions); the durable engine keeps data but does not
# auto-create topics.
set -euo pipefail

TANSU_VERSION=0.6.0

die() {
    printf 'broker.sh: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    echo "usage: $0 {start|kill|status} DATADIR PORT" >&2
    exit 2
}

[[ $# -eq 3 ]] || usage
cmd=$1
port=$3
if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    die "invalid port '$port'"
fi
if [[ $cmd == start ]]; then
    mkdir -p "$2" || die "cannot create DATADIR '$2'"
fi
datadir=$(cd "$2" 2>/dev/null && pwd -P) || {
    [[ $cmd == status ]] && exit 3
    die "no such DATADIR '$2'"
}
pidfile=$datadir/tansu.pid
logfile=$datadir/tansu.log

variant=${SIPHON_TANSU_VARIANT:-memory}
case $variant in
memory) engine=memory://tansu/ ;;
durable) engine=sqlite://tansu.db ;;
*) die "unknown SIPHON_TANSU_VARIANT '$variant' (memory or durable)" ;;
esac
cache_dir=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
bin=${SIPHON_TANSU_BIN:-$cache_dir/tansu-$TANSU_VERSION-$variant/bin/tansu}

pid_alive() {
    local pid
    [[ -f $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    proc_running "$pid" || return 1
    # Guard against a recycled pid.
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == *tansu* ]]
}

# Running and not a zombie (a killed child of init may linger until reaped).
proc_running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

start() {
    if pid_alive; then
        echo "broker.sh: already running (pid $(<"$pidfile"), 127.0.0.1:$port)"
        return 0
    fi
    [[ -x $bin ]] || die "tansu binary not found at $bin; run scripts/install-deps.sh"
    if port_open; then
        die "127.0.0.1:$port is already in use"
    fi
    local url=tcp://127.0.0.1:$port
    (
        cd "$datadir"
        # Tansu reads RUST_LOG as well; a verbose level slows every request.
        RUST_LOG=${SIPHON_TANSU_LOG:-warn} exec setsid "$bin" broker \
            --listener-url "$url" \
            --advertised-listener-url "$url" \
            --storage-engine "$engine" \
            </dev/null >>"$logfile" 2>&1
    ) &
    local pid=$!
    echo "$pid" >"$pidfile"
    local i
    for ((i = 0; i < 300; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$logfile" >&2 || true
            rm -f "$pidfile"
            die "tansu exited during startup (log: $logfile)"
        fi
        if port_open; then
            echo "broker.sh: running: 127.0.0.1:$port (pid $pid, $variant engine, log $logfile)"
            return 0
        fi
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
    die "tansu did not accept connections on 127.0.0.1:$port within 30 s (log: $logfile)"
}

kill_broker() {
    if ! pid_alive; then
        rm -f "$pidfile"
        echo "broker.sh: not running"
        return 0
    fi
    local pid i
    pid=$(<"$pidfile")
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        proc_running "$pid" || break
        sleep 0.05
    done
    proc_running "$pid" && die "pid $pid survived SIGKILL"
    rm -f "$pidfile"
    echo "broker.sh: killed pid $pid"
}

case $cmd in
start) start ;;
kill) kill_broker ;;
status)
    if pid_alive && port_open; then
        echo "broker.sh: running (pid $(<"$pidfile"), 127.0.0.1:$port)"
        exit 0
    fi
    echo "broker.sh: not running"
    exit 3
    ;;
*) usage ;;
esac
