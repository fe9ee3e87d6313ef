#!/usr/bin/env bash
# Run a scratch PostgreSQL cluster for tests and demos.
#
# Usage: scripts/postgres.sh {start|stop|kill|kill9|restart|reload|promote|status} DATADIR PORT [--tls CERTDIR]
#        scripts/postgres.sh standby DATADIR PORT PRIMARY_DATADIR PRIMARY_PORT SLOT
#
#   start    create a cluster in DATADIR if it holds none yet (a copy of a template made
#            once with initdb, under /tmp, given a system identifier of its own), then start
#            the server on 127.0.0.1:PORT and wait until it accepts connections.
#   stop     fast shutdown (waits). Succeeds if the server is not running.
#   kill     immediate shutdown (no checkpoint: the next start runs crash
#            recovery). Succeeds if the server is not running.
#   restart  fast shutdown, then start on the same PORT.
#   reload   re-read postgresql.conf and pg_hba.conf (pg_ctl reload).
#   kill9    SIGKILL to the postmaster (a crash: its backends exit when they notice), then
#            wait until it is gone. Succeeds if the server is not running.
#   promote  promote a standby to primary (pg_ctl promote, waits).
#   status   exit 0 if running, 3 if not running, 4 if DATADIR holds no cluster.
#   standby  make DATADIR a physical standby of the running cluster in PRIMARY_DATADIR
#            (pg_basebackup over its Unix socket, creating the physical slot SLOT on it) with
#            primary_slot_name = SLOT, hot_standby_feedback = on and
#            sync_replication_slots = on (PostgreSQL 17+: failover slots are synchronized),
#            then start it on 127.0.0.1:PORT.
#
#   --tls CERTDIR  (start, when it creates the cluster) turn TLS on: CERTDIR holds
#            server.crt and server.key (the server's certificate and key) and
#            ca.crt (the CA that client certificates must be signed by); they are
#            copied into DATADIR. pg_hba.conf then accepts TCP connections only
#            over TLS (`hostssl all all 127.0.0.1/32 scram-sha-256`); the Unix
#            socket keeps trust auth. Without --tls the server has ssl=off.
#
# The cluster:
#   * superuser `siphon` with password `siphon` (SCRAM-SHA-256), database `siphon`:
#       postgres://siphon:siphon@127.0.0.1:PORT/siphon
#   * TCP only on 127.0.0.1; the Unix socket lives in DATADIR (trust auth), so
#     DATADIR must be a short path (socket paths are limited to 107 bytes).
#   * wal_level=logical, 20 replication slots / WAL senders,
#     wal_sender_timeout=60s, fsync=off (scratch data only).
#   * server log: DATADIR/log/postgresql.log
#
# PostgreSQL refuses to run as root. When this script runs as root it creates
# (once) the system user `siphon-pg`, hands DATADIR to it and runs the server
# binaries as that user; otherwise it runs them as the current user.
#
# Environment: SIPHON_PG_BIN overrides the detected /usr/lib/postgresql/*/bin.
set -euo pipefail

PG_OS_USER=siphon-pg

die() {
    printf 'postgres.sh: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    echo "usage: $0 {start|stop|kill|kill9|restart|reload|promote|status} DATADIR PORT [--tls CERTDIR]" >&2
    echo "       $0 standby DATADIR PORT PRIMARY_DATADIR PRIMARY_PORT SLOT" >&2
    exit 2
}

tls_dir=
primary_dir= primary_port= standby_slot=
if [[ $# -eq 6 && $1 == standby ]]; then
    primary_dir=$(cd "$4" && pwd -P) || die "no such PRIMARY_DATADIR '$4'"
    primary_port=$5
    standby_slot=$6
    [[ $primary_port =~ ^[0-9]+$ ]] || die "invalid PRIMARY_PORT '$primary_port'"
    [[ $standby_slot =~ ^[a-z0-9_]+$ ]] || die "invalid SLOT '$standby_slot' (lower-case letters, digits, _)"
elif [[ $# -eq 5 && $4 == --tls ]]; then
    [[ $1 == start || $1 == restart ]] || usage
    tls_dir=$5
    for f in server.crt server.key ca.crt; do
        [[ -r $tls_dir/$f ]] || die "--tls: cannot read $tls_dir/$f"
    done
    tls_dir=$(cd "$tls_dir" && pwd -P)
elif [[ $# -ne 3 ]]; then
    usage
fi
cmd=$1
port=$3
if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    die "invalid port '$port'"
fi
if [[ $cmd == start || $cmd == restart || $cmd == standby ]]; then
    mkdir -p "$2" || die "cannot create DATADIR '$2'"
elif [[ ! -d $2 ]]; then
    [[ $cmd == status ]] && {
        echo "postgres.sh: no cluster in $2"
        exit 4
    }
    die "no such DATADIR '$2'"
fi
datadir=$(cd "$2" && pwd -P)
# Run the server binaries from a directory every user can enter.
cd /

# Socket file: DATADIR/.s.PGSQL.PORT (and its .lock), at most 107 bytes.
sock="$datadir/.s.PGSQL.$port.lock"
((${#sock} <= 107)) || die "DATADIR path too long for a Unix socket (${#sock} > 107 bytes): $datadir"

if [[ -n ${SIPHON_PG_BIN:-} ]]; then
    pg_bin=$SIPHON_PG_BIN
else
    pg_bin=$(for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/initdb && -x $d/pg_ctl ]] && printf '%s\n' "$d"
    done | sort -V | tail -n1)
fi
[[ -n $pg_bin && -x $pg_bin/pg_ctl ]] || die "PostgreSQL server binaries not found; run scripts/install-deps.sh"

as_pg=()
if [[ $(id -u) -eq 0 ]]; then
    if ! id -u "$PG_OS_USER" >/dev/null 2>&1; then
        # Serialize: concurrent useradd calls fail on the passwd lock.
        (
            flock 9
            id -u "$PG_OS_USER" >/dev/null 2>&1 ||
                useradd --system --user-group --no-create-home --home-dir /nonexistent \
                    --shell /usr/sbin/nologin "$PG_OS_USER"
        ) 9>/tmp/.siphon-pg-useradd.lock
    fi
    as_pg=(runuser -u "$PG_OS_USER" --)
fi

pg() { "${as_pg[@]}" "$@"; }

is_cluster() { [[ -f $datadir/PG_VERSION ]]; }

status() {
    is_cluster || return 4
    local rc=0
    pg "$pg_bin/pg_ctl" status -D "$datadir" >/dev/null 2>&1 || rc=$?
    return "$rc"
}

# The template every new cluster is copied from: what initdb makes, with the role's password
# set and the database `siphon` created. One per server build and user, under /tmp; copying it
# costs a fraction of initdb. (Every copy has the template's system identifier.)
template_dir() {
    local key
    key=$(printf '%s\n' "$pg_bin" "$PG_OS_USER" "$("$pg_bin/postgres" -V)" "initdb -U siphon --no-locale -E UTF8 scram" |
        md5sum | cut -c1-12)
    printf '/tmp/siphon-pg-template-%s' "$key"
}

# Makes the template in a directory of its own and renames it into place (the first wins).
make_template() {
    local template=$1 building out
    building="$template.building.$$"
    rm -rf "$building"
    mkdir -p "$building"
    if ((${#as_pg[@]} > 0)); then
        chown "$PG_OS_USER:" "$building"
    fi
    chmod 0700 "$building"
    if ! out=$(pg "$pg_bin/initdb" -D "$building" -U siphon --no-sync --no-locale -E UTF8 \
        --auth-host=scram-sha-256 --auth-local=trust 2>&1); then
        printf '%s\n' "$out" >&2
        rm -rf "$building"
        return 1
    fi
    # Started on its own socket only, for the set-up the clusters share.
    if ! out=$(pg "$pg_bin/pg_ctl" start -D "$building" -w -t 60 -l "$building/setup.log" \
        -o "-c listen_addresses='' -c unix_socket_directories='$building' -c port=5432 -c fsync=off" 2>&1) ||
        ! printf '%s\n' "SET password_encryption = 'scram-sha-256';" \
            "ALTER ROLE siphon PASSWORD 'siphon';" "CREATE DATABASE siphon;" |
        pg "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$building" -p 5432 -U siphon -d postgres; then
        printf '%s\n' "$out" >&2
        pg "$pg_bin/pg_ctl" stop -D "$building" -m immediate -w >/dev/null 2>&1 || true
        rm -rf "$building"
        return 1
    fi
    pg "$pg_bin/pg_ctl" stop -D "$building" -m fast -w -t 60 >/dev/null 2>&1 || {
        rm -rf "$building"
        return 1
    }
    pg rm -f "$building/setup.log"
    pg touch "$building/siphon-template-ready"
    mv -T "$building" "$template" 2>/dev/null || rm -rf "$building"
}

# Gives the copy of the template a system identifier of its own, as initdb would (the seconds
# since the epoch in the high half): Siphon tells servers apart by it, and keys what it records
# in Kafka with it. The identifier is in pg_control, under its CRC-32C, and in the header of
# every WAL page: pg_resetwal writes the WAL anew for the cleanly stopped copy.
new_system_identifier() {
    pg python3 - "$datadir/global/pg_control" <<'PY' || die "could not set a system identifier"
import os, struct, sys, time

def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

path = sys.argv[1]
control = bytearray(open(path, "rb").read())
# The CRC covers the struct up to the CRC itself; find where it is.
end = next(o for o in range(16, 1024, 4)
           if crc32c(control[:o]) == struct.unpack_from("<I", control, o)[0])
identifier = (int(time.time()) << 32) | int.from_bytes(os.urandom(4), "little")
struct.pack_into("<Q", control, 0, identifier)
struct.pack_into("<I", control, end, crc32c(control[:end]))
with open(path, "r+b") as f:
    f.write(control)
PY
    pg "$pg_bin/pg_resetwal" -D "$datadir" >/dev/null || die "pg_resetwal of the copy failed"
}

init_cluster() {
    if [[ -n $(ls -A "$datadir") ]]; then
        die "DATADIR $datadir is not empty and holds no cluster"
    fi
    if ((${#as_pg[@]} > 0)); then
        chown "$PG_OS_USER:" "$datadir"
    fi
    chmod 0700 "$datadir"
    pg test -w "$datadir" || die "user $PG_OS_USER cannot write $datadir (is a parent directory private?)"
    local out template
    template=$(template_dir)
    if [[ ! -f $template/siphon-template-ready ]]; then
        (
            flock 9
            [[ -f $template/siphon-template-ready ]] || make_template "$template" || true
        ) 9>"$template.lock"
    fi
    if [[ -f $template/siphon-template-ready && -f $template/PG_VERSION ]]; then
        pg cp -a "$template/." "$datadir/" || die "copying the cluster template $template failed"
        pg rm -f "$datadir/siphon-template-ready"
        new_system_identifier
        from_template=1
    elif ! out=$(pg "$pg_bin/initdb" -D "$datadir" -U siphon --no-sync --no-locale -E UTF8 \
        --auth-host=scram-sha-256 --auth-local=trust 2>&1); then
        printf '%s\n' "$out" >&2
        die "initdb failed"
    fi
    pg mkdir -p "$datadir/log"
    pg tee -a "$datadir/postgresql.conf" >/dev/null <<EOF

# --- scratch cluster settings (scripts/postgres.sh) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$datadir'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
wal_sender_timeout = 60s
fsync = off
full_page_writes = off
shared_buffers = 32MB
log_line_prefix = '%m [%p] %q%u@%d '
log_replication_commands = on
include_if_exists = 'siphon-port.conf'
EOF
    if [[ -n $tls_dir ]]; then
        local f
        for f in server.crt server.key ca.crt; do
            pg tee "$datadir/$f" <"$tls_dir/$f" >/dev/null
        done
        pg chmod 0600 "$datadir/server.key"
        pg tee -a "$datadir/postgresql.conf" >/dev/null <<'EOF'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.crt'
EOF
        pg tee "$datadir/pg_hba.conf" >/dev/null <<'EOF'
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
hostssl all       all   127.0.0.1/32  scram-sha-256
EOF
    fi
    # A copy of the template has its role and database already.
    first_start=$((from_template ? 0 : 1))
}

start() {
    first_start=0
    from_template=0
    is_cluster || init_cluster
    if status; then
        echo "postgres.sh: already running (DATADIR $datadir)"
        return 0
    fi
    echo "port = $port" | pg tee "$datadir/siphon-port.conf" >/dev/null
    local out
    if ! out=$(pg "$pg_bin/pg_ctl" start -D "$datadir" -w -t 60 -l "$datadir/log/postgresql.log" 2>&1); then
        printf '%s\n' "$out" >&2
        tail -n 30 "$datadir/log/postgresql.log" >&2 || true
        die "server did not start (log: $datadir/log/postgresql.log)"
    fi
    local i
    for ((i = 0; i < 300; i++)); do
        "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$port" -d siphon -U siphon -t 1 && break
        sleep 0.1
    done
    "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1 ||
        die "server started but does not accept TCP connections on 127.0.0.1:$port"
    if ((first_start)); then
        # Set the password here rather than through initdb so that it is stored
        # as SCRAM-SHA-256 on every server version.
        pg "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$datadir" -p "$port" -U siphon -d postgres <<'EOF' ||
SET password_encryption = 'scram-sha-256';
ALTER ROLE siphon PASSWORD 'siphon';
CREATE DATABASE siphon;
EOF
            die "could not create role/database"
    fi
    echo "postgres.sh: running: postgres://siphon:siphon@127.0.0.1:$port/siphon (DATADIR $datadir)"
}

shutdown() {
    local mode=$1
    is_cluster || die "DATADIR $datadir holds no cluster"
    status || return 0
    local out
    if ! out=$(pg "$pg_bin/pg_ctl" stop -D "$datadir" -m "$mode" -w -t 60 2>&1); then
        # It may have exited on its own in the meantime.
        status || return 0
        printf '%s\n' "$out" >&2
        die "pg_ctl stop -m $mode failed"
    fi
}

# standby: a base backup of the primary, set up to follow it.
make_standby() {
    [[ -z $(ls -A "$datadir") ]] || die "DATADIR $datadir is not empty"
    if ((${#as_pg[@]} > 0)); then
        chown "$PG_OS_USER:" "$datadir"
    fi
    chmod 0700 "$datadir"
    local out
    if ! out=$(pg "$pg_bin/pg_basebackup" -h "$primary_dir" -p "$primary_port" -U siphon \
        -D "$datadir" -X stream -c fast -R -C -S "$standby_slot" --no-sync 2>&1); then
        printf '%s\n' "$out" >&2
        die "pg_basebackup from $primary_dir failed"
    fi
    pg rm -f "$datadir/log/postgresql.log"
    # postgresql.auto.conf is read last, after the lines pg_basebackup -R wrote there.
    pg tee -a "$datadir/postgresql.auto.conf" >/dev/null <<EOF
unix_socket_directories = '$datadir'
primary_conninfo = 'host=$primary_dir port=$primary_port user=siphon dbname=siphon application_name=standby'
primary_slot_name = '$standby_slot'
hot_standby_feedback = on
EOF
    if (($("$pg_bin/postgres" -V | sed -E 's/.* ([0-9]+).*/\1/') >= 17)); then
        echo "sync_replication_slots = on" | pg tee -a "$datadir/postgresql.auto.conf" >/dev/null
    fi
    start
}

kill9() {
    is_cluster || die "DATADIR $datadir holds no cluster"
    status || return 0
    local pid i
    pid=$(head -n1 "$datadir/postmaster.pid")
    [[ $pid =~ ^[0-9]+$ ]] || die "no postmaster pid in $datadir/postmaster.pid"
    kill -9 "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    die "postmaster $pid still running after SIGKILL"
}

case $cmd in
start) start ;;
standby) make_standby ;;
kill9) kill9 ;;
promote)
    status || die "server not running (DATADIR $datadir)"
    pg "$pg_bin/pg_ctl" promote -D "$datadir" -w -t 60 -s || die "pg_ctl promote failed"
    ;;
reload)
    status || die "server not running (DATADIR $datadir)"
    pg "$pg_bin/pg_ctl" reload -D "$datadir" -s || die "pg_ctl reload failed"
    ;;
stop) shutdown fast ;;
kill) shutdown immediate ;;
restart)
    shutdown fast
    start
    ;;
status)
    rc=0
    status || rc=$?
    case $rc in
    0) echo "postgres.sh: running (DATADIR $datadir)" ;;
    3) echo "postgres.sh: not running (DATADIR $datadir)" ;;
    4) echo "postgres.sh: no cluster in $datadir" ;;
    esac
    exit "$rc"
    ;;
*) usage ;;
esac
