#!/usr/bin/env bash
# Regenerate the pgoutput test fixtures (crates/pgoutput/tests/fixtures/*.hex) from a real
# PostgreSQL server.
#
# Usage: scripts/capture-pgoutput-fixtures.sh
#
# Starts a throw-away PostgreSQL cluster in a scratch directory under /tmp, listening on
# 127.0.0.1 only, runs one SQL workload per scenario against a fresh logical replication slot
# using the pgoutput plugin, and writes every message that
# pg_logical_slot_peek_binary_changes returns, hex-encoded, one per line. Lines starting with
# '#' describe the scenario: the protocol version and plugin options used, and the SQL that
# produced the messages. The cluster is stopped and removed on exit.
#
# Environment:
#   PGBIN    PostgreSQL binaries (default /usr/lib/postgresql/15/bin)
#   PGPORT   port to listen on (default 55415)
#   OUT      output directory (default crates/pgoutput/tests/fixtures)
#
# PostgreSQL refuses to run as root; when run as root the server and psql run as the
# `postgres` OS user.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/crates/pgoutput/tests/fixtures}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PORT=${PGPORT:-55415}
SCRATCH=$(mktemp -d /tmp/pgoutput-fixtures.XXXXXX)

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [ "$(id -u)" = 0 ]; then
    chown postgres: "$SCRATCH"
fi

cleanup() {
    as_pg "$PGBIN/pg_ctl" -D "$SCRATCH/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

as_pg "$PGBIN/initdb" -D "$SCRATCH/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
cat >>"$SCRATCH/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SCRATCH'
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
max_prepared_transactions = 10
logical_decoding_work_mem = '64kB'
fsync = off
timezone = 'UTC'
EOF
as_pg "$PGBIN/pg_ctl" -D "$SCRATCH/data" -l "$SCRATCH/server.log" -w start >/dev/null

psql_run() {
    as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres "$@"
}

mkdir -p "$OUT"

# capture NAME PROTO TWO_PHASE_SLOT OPTIONS DESCRIPTION SETUP_SQL WORKLOAD_SQL
#   OPTIONS is the SQL list of extra plugin options after proto_version.
capture() {
    local name=$1 proto=$2 two_phase=$3 opts=$4 desc=$5 setup=$6 workload=$7
    psql_run <<<"$setup" >/dev/null
    psql_run -c "SELECT pg_create_logical_replication_slot('fixture', 'pgoutput', false, $two_phase)" >/dev/null
    psql_run <<<"$workload" >/dev/null
    # Aborts and non-transactional messages do not flush WAL, and decoding stops at the
    # flushed position: commit a transaction that writes WAL (catalog only, so it decodes to
    # nothing) to flush everything the workload wrote.
    psql_run -c "CREATE TEMP TABLE flush_marker ()" >/dev/null
    {
        echo "# $desc"
        echo "# proto_version: $proto"
        echo "# options: $opts"
        echo "# setup:"
        sed 's/^/#   /' <<<"$setup"
        echo "# workload (each statement in autocommit mode unless inside BEGIN/COMMIT):"
        sed 's/^/#   /' <<<"$workload"
        psql_run -At -c "SELECT encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes('fixture', NULL, NULL, 'proto_version', '$proto', $opts)"
    } >"$OUT/$name.hex.tmp"
    mv "$OUT/$name.hex.tmp" "$OUT/$name.hex"
    psql_run -c "SELECT pg_drop_replication_slot('fixture')" >/dev/null
    echo "captured $name: $(grep -vc '^#' "$OUT/$name.hex") message(s)"
}

psql_run -c "CREATE PUBLICATION pub FOR ALL TABLES"

# Each scenario runs in order on the same database; later ones reuse earlier objects.

capture basic 1 false "'publication_names', 'pub'" \
    "Insert, updates (key unchanged and key changed) and delete on a table with a primary key, with a user-defined enum type" \
    "CREATE SCHEMA app;
CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, note text, mood app.mood, qty bigint);" \
    "INSERT INTO items VALUES (1, 'hello', NULL, 'happy', 42);
UPDATE items SET qty = 43 WHERE id = 1;
UPDATE items SET id = 2 WHERE id = 1;
DELETE FROM items WHERE id = 2;"

capture identity 1 false "'publication_names', 'pub'" \
    "Replica identity FULL (old tuple O), USING INDEX (old key K) and NOTHING" \
    "CREATE TABLE full_rows (id int, val text);
ALTER TABLE full_rows REPLICA IDENTITY FULL;
CREATE TABLE by_index (a int NOT NULL, b text);
CREATE UNIQUE INDEX by_index_a ON by_index (a);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_a;
CREATE TABLE log_only (msg text);
ALTER TABLE log_only REPLICA IDENTITY NOTHING;" \
    "INSERT INTO full_rows VALUES (1, 'before');
UPDATE full_rows SET val = 'after' WHERE id = 1;
DELETE FROM full_rows WHERE id = 1;
INSERT INTO by_index VALUES (10, 'ten');
UPDATE by_index SET a = 11 WHERE a = 10;
INSERT INTO log_only VALUES ('only inserts');"

capture toast 1 false "'publication_names', 'pub'" \
    "An out-of-line TOASTed value that an UPDATE leaves unchanged is sent as u" \
    "CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;" \
    "INSERT INTO docs VALUES (1, 'v1', repeat('0123456789', 300));
UPDATE docs SET title = 'v2' WHERE id = 1;"

capture truncate 1 false "'publication_names', 'pub'" \
    "TRUNCATE of two tables, then TRUNCATE ... RESTART IDENTITY CASCADE" \
    "CREATE TABLE trunc_a (id serial PRIMARY KEY);
CREATE TABLE trunc_b (id int PRIMARY KEY);" \
    "TRUNCATE trunc_a, trunc_b;
TRUNCATE trunc_a RESTART IDENTITY CASCADE;"

capture messages 1 false "'publication_names', 'pub', 'messages', 'true'" \
    "pg_logical_emit_message, transactional and not" \
    "-- none" \
    "BEGIN;
SELECT pg_logical_emit_message(true, 'siphon', 'hello');
COMMIT;
SELECT pg_logical_emit_message(false, 'siphon.nt', '\\x00ff10'::bytea);"

capture origin 1 false "'publication_names', 'pub'" \
    "A transaction replayed from replication origin siphon_origin" \
    "CREATE TABLE from_origin (id int PRIMARY KEY);
SELECT pg_replication_origin_create('siphon_origin');" \
    "SELECT pg_replication_origin_session_setup('siphon_origin');
BEGIN;
SELECT pg_replication_origin_xact_setup('0/1234ABCD', '2024-01-02 03:04:05+00');
INSERT INTO from_origin VALUES (5);
COMMIT;
SELECT pg_replication_origin_session_reset();"

capture binary 1 false "'publication_names', 'pub', 'binary', 'true'" \
    "Columns in binary format (b) and a NULL" \
    "CREATE TABLE bin (id int PRIMARY KEY, label text, payload bytea, at timestamptz, n numeric);" \
    "INSERT INTO bin VALUES (7, 'hello', '\\xdeadbeef', '2000-01-01 00:00:01+00', NULL);"

# Changes to ballast count towards logical_decoding_work_mem (so they force the transaction to
# be streamed) but are not in pub_stream or pub_tp, which keeps those fixtures small.
capture stream 2 false "'publication_names', 'pub_stream', 'messages', 'true', 'streaming', 'true'" \
    "Streamed in-progress transactions (protocol 2, logical_decoding_work_mem = 64kB): one committed, one with an aborted subtransaction, two aborted as a whole" \
    "CREATE TABLE ballast (id int, pad text);
CREATE TABLE streamed (id int PRIMARY KEY, mood app.mood, val text);
CREATE TABLE streamed_trunc (id int);
CREATE PUBLICATION pub_stream FOR TABLE streamed, streamed_trunc;" \
    "BEGIN;
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
SELECT pg_logical_emit_message(true, 'siphon', 'in-stream');
INSERT INTO streamed VALUES (1, 'ok', 'one'), (2, 'sad', 'two');
UPDATE streamed SET val = 'uno' WHERE id = 1;
DELETE FROM streamed WHERE id = 2;
TRUNCATE streamed_trunc;
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
INSERT INTO streamed VALUES (3, NULL, 'three');
COMMIT;
BEGIN;
INSERT INTO streamed VALUES (4, 'happy', 'four');
SAVEPOINT sp;
INSERT INTO streamed VALUES (5, 'happy', 'five');
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
ROLLBACK TO SAVEPOINT sp;
COMMIT;
BEGIN;
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
ROLLBACK;
BEGIN;
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
INSERT INTO streamed VALUES (6, 'sad', 'six');
ROLLBACK;"

capture two_phase 3 true "'publication_names', 'pub_tp', 'two_phase', 'true'" \
    "Two-phase commit (protocol 3, slot created with two_phase): PREPARE + COMMIT PREPARED, PREPARE + ROLLBACK PREPARED" \
    "CREATE TABLE tp (id int PRIMARY KEY, val text);
CREATE PUBLICATION pub_tp FOR TABLE tp;" \
    "BEGIN;
INSERT INTO tp VALUES (1, 'committed');
PREPARE TRANSACTION 'siphon-gid-1';
COMMIT PREPARED 'siphon-gid-1';
BEGIN;
INSERT INTO tp VALUES (2, 'rolled back');
PREPARE TRANSACTION 'siphon-gid-2';
ROLLBACK PREPARED 'siphon-gid-2';"

capture stream_two_phase 3 true "'publication_names', 'pub_tp', 'two_phase', 'true', 'streaming', 'true'" \
    "A streamed transaction that is prepared (Stream Prepare) and then committed (protocol 3)" \
    "-- none (tp, pub_tp and ballast exist already)" \
    "BEGIN;
INSERT INTO tp VALUES (3, 'streamed and prepared');
INSERT INTO ballast SELECT g, repeat('x', 1000) FROM generate_series(1, 100) g;
PREPARE TRANSACTION 'siphon-gid-3';
COMMIT PREPARED 'siphon-gid-3';"
