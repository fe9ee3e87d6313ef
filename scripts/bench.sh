#!/usr/bin/env bash
# Siphon's benchmark: builds the release binary and the bench, then runs it.
#
# Usage: scripts/bench.sh [N] [BENCH OPTIONS...]
#   N                 outbox events in the backlog (default 1000000)
#   --latency-secs S  seconds of steady load in the latency phase (default 60; 0 skips it)
#   --pg-url URL      use this PostgreSQL instead of a scratch cluster
#   --bootstrap H:P   use this Kafka instead of a single Apache Kafka node of the bench's own
#   --broker-name S   what the tables call a --bootstrap broker (e.g. its version)
#   --json PATH       also write the JSON result there
#   --contention      also drain under a CPU hog of two busy threads and compare
#   --no-exactly-once skip the exactly-once rows (drain and latency phase)
#   --eos-latency-rate R  events/s of the exactly-once latency phase (default 5000)
#   --no-avro         skip the Avro rows and the expanded JSON row they compare with
#   --no-debezium     skip the Debezium row (embedded engine)
#   --no-connect      skip the Debezium-on-Connect rows
#   --no-all-operations  skip the all-operations publication's drains
#   --slots-scaling   also measure pg_recvlogical on 1, 2 and 4 slots at once
#   --help            every option
#
# One run drains the same backlog with pg_recvlogical (the reference), with Siphon to the broker
# (at-least-once, then exactly-once), with Siphon's discard sink, with Siphon writing expanded
# JSON, expanded Avro and Avro values (through a rivven-schema registry it starts), with
# Debezium's embedded engine and with Debezium on a standalone Kafka Connect worker producing to
# the broker, once with Connect's producer defaults and once idempotent (each skipped, with the
# reason in the table, when Java or the jars are missing); then the same backlog through an all-operations publication
# (publish = 'insert, update, delete') with pg_recvlogical, Siphon to the broker and the Connect
# rows; optionally again under a CPU hog (--contention) and pg_recvlogical on several slots
# (--slots-scaling); then measures commit->ack latency at a steady 10,000 events/s next to the
# broker's own produce latency (a probe producer), and again with exactly-once delivery at 5,000
# events/s. It prints a table, naming the broker and its version, and writes
# target/bench/result.json and the chart target/bench/result.svg. See docs/performance.md for
# what each figure means.
#
# The broker is Apache Kafka 4.4.0, one KRaft node (the test harness's single-node settings)
# whose JVM runs with the options of Kafka's own start scripts: a 1 GiB heap, G1, full JIT
# (SIPHON_BENCH_KAFKA_JVM_OPTS replaces them), warmed up by 200,000 records from a producer
# and one committed Kafka transaction before anything is measured. It keeps every record for the whole run. Its CPU time per drain
# and its peak RSS are read from /proc by its pid (for --bootstrap: the process listening on
# the first address's port, when that is this host's loopback).
#
# Needs what scripts/install-deps.sh installs (PostgreSQL, Apache Kafka's jars and Java,
# rivven-schema, the Debezium jars and Java runtime, the Kafka Connect worker with Debezium's connector plugin, the
# build dependencies); it runs that script first. It stops
# everything it starts.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if ! command -v cargo >/dev/null 2>&1 && [[ -f ${HOME:-/root}/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi

args=()
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    args+=(--events "$1")
    shift
fi
args+=("$@")

if [[ " ${args[*]-} " != *" --help "* && " ${args[*]-} " != *" -h "* ]]; then
    bash scripts/install-deps.sh >&2
fi
echo "==> building target/release/siphon and target/release/bench" >&2
cargo build --release -p siphon --bin siphon >&2
cargo build --release -p siphon-bench --bin bench >&2

export SIPHON_BIN=${SIPHON_BIN:-$root/target/release/siphon}
# Siphon's log level inside the benchmark (its log goes to a file per run).
export RUST_LOG=${RUST_LOG:-info}
exec "$root/target/release/bench" "${args[@]}"
