#!/usr/bin/env bash
# The demo, end to end on this machine: starts a scratch PostgreSQL and a single-node Apache Kafka
# (KRaft, through scripts/broker.sh) on 127.0.0.1, runs Siphon, commits a few orders through an
# outbox (INSERT then DELETE in the same transaction), prints what reached Kafka, and stops
# everything it started.
#
# It installs only what it uses: the build's packages, PostgreSQL, a JDK and Apache Kafka's jars
# (scripts/install-deps.sh with the test-only parts switched off). It prints how long each step
# took (install, build, starting PostgreSQL, Kafka and Siphon), so a first run shows where the
# time goes: on a fresh machine, the first build of the Kafka client library takes most of it.
#
# Usage: scripts/demo.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"

say() { printf '\n==> %s\n' "$*"; }

# timed LABEL CMD...: runs CMD, prints how long it took and keeps it for the summary.
timings=()
quiet() { "$@" >/dev/null; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
timed() {
    local label=$1 t0 ms
    shift
    t0=$(now_ms)
    "$@"
    ms=$(($(now_ms) - t0))
    timings+=("$(printf '%-22s %4d.%d s' "$label" $((ms / 1000)) $((ms % 1000 / 100)))")
    printf '    %s: %d.%d s\n' "$label" $((ms / 1000)) $((ms % 1000 / 100))
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}


say "installing what is missing (build packages, PostgreSQL, a JDK, Apache Kafka's jars)"
# The test-only dependencies (Tansu, PostgreSQL 18, the Debezium oracle and Kafka Connect, the
# tests' Python decoders, a German locale, the schema registry) are left out: the demo starts
# none of them.
timed install env SIPHON_TANSU_VARIANTS= SIPHON_PG18=0 SIPHON_DEBEZIUM_ORACLE=0 \
    SIPHON_PYTHON_DECODERS=0 SIPHON_GERMAN_LOCALE=0 SIPHON_SCHEMA_REGISTRY=0 scripts/install-deps.sh

say "building siphon and the demo's topic reader (the first build compiles librdkafka: minutes)"
timed build cargo build --quiet -p siphon -p siphon-tests --bin siphon --bin read-topic

work=$(mktemp -d /tmp/siphon-demo-XXXXXX)
chmod 755 "$work" # the PostgreSQL OS user must reach its data directory
pg_port=$(free_port)
kafka_port=$(scripts/broker.sh free-port)
siphon_pid=""

cleanup() {
    if [[ -n $siphon_pid ]] && kill -0 "$siphon_pid" 2>/dev/null; then
        kill -TERM "$siphon_pid" 2>/dev/null || true
        wait "$siphon_pid" 2>/dev/null || true
    fi
    scripts/broker.sh kill "$work/kafka" "$kafka_port" >/dev/null 2>&1 || true
    scripts/postgres.sh kill "$work/pg" "$pg_port" >/dev/null 2>&1 || true
    rm -rf "$work"
    if ((${#timings[@]} > 0)); then
        printf '\n==> where the time went\n'
        printf '    %s\n' "${timings[@]}"
    fi
}
trap cleanup EXIT

say "starting PostgreSQL on 127.0.0.1:$pg_port and Apache Kafka on 127.0.0.1:$kafka_port"
timed "start PostgreSQL" quiet scripts/postgres.sh start "$work/pg" "$pg_port"
# Formats a KRaft node and waits until it answers a Metadata request (a JVM start: seconds).
timed "start Apache Kafka" scripts/broker.sh start "$work/kafka" "$kafka_port"
url="postgres://siphon:siphon@127.0.0.1:$pg_port/siphon"
psql -q "$url" -f examples/sql/outbox.sql

cat >"$work/siphon.toml" <<TOML
[source]
url = "$url"
tables = ["public.outbox"]

[kafka]
bootstrap_servers = "127.0.0.1:$kafka_port"

[kafka.topic_creation]
partitions = 3
replication_factor = 1
TOML

say "starting siphon (log: $work/siphon.log)"
target/debug/siphon run --config "$work/siphon.toml" >"$work/siphon.log" 2>&1 &
siphon_pid=$!
# Siphon is started when its slot is active: it created the slot and publication and streams.
wait_streaming() {
    local active
    for _ in $(seq 100); do
        active=$(psql -qtA "$url" -c "SELECT active FROM pg_replication_slots WHERE slot_name = 'siphon'")
        [[ $active == t ]] && return 0
        kill -0 "$siphon_pid" 2>/dev/null || { cat "$work/siphon.log"; exit 1; }
        sleep 0.2
    done
}
timed "start Siphon" wait_streaming

say "committing three orders and a customer through the outbox, and one rolled-back order"
psql -q "$url" <<'SQL'
BEGIN;
INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'order-1', 'OrderCreated', '{"id": 1, "total": 42.5, "items": ["book"]}');
DELETE FROM outbox;
COMMIT;
BEGIN;
INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'order-2', 'OrderCreated', '{"id": 2, "note": "gift \"wrapped\""}');
INSERT INTO outbox VALUES (gen_random_uuid(), 'Customer', 'customer-7', 'CustomerUpdated', '{"name": "Zoë"}');
DELETE FROM outbox;
COMMIT;
BEGIN;
INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'order-3', 'OrderCreated', '{"id": 3}');
DELETE FROM outbox;
ROLLBACK;
BEGIN;
INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'order-1', 'OrderShipped', '{"id": 1, "carrier": "post"}');
DELETE FROM outbox;
COMMIT;
SQL

say "waiting until the slot has confirmed everything"
target_lsn=$(psql -qtA "$url" -c "SELECT pg_current_wal_insert_lsn()")
for _ in $(seq 150); do
    done_yet=$(psql -qtA "$url" -c "SELECT confirmed_flush_lsn >= '$target_lsn' FROM pg_replication_slots WHERE slot_name = 'siphon'")
    [[ $done_yet == t ]] && break
    sleep 0.2
done
psql -q "$url" -c "SELECT slot_name, confirmed_flush_lsn, active FROM pg_replication_slots"

say "what reached Kafka"
target/debug/read-topic "127.0.0.1:$kafka_port" outbox.event.Order outbox.event.Customer

say "stopping siphon"
kill -TERM "$siphon_pid"
wait "$siphon_pid" && echo "siphon exited cleanly"
siphon_pid=""
