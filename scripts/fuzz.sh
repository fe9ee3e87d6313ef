#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz / libFuzzer) of the pgoutput decoder, the replication
# protocol's framing (siphon-source's wire::frames) and the outbox
# router. The targets live in fuzz/, a package of its own outside the workspace.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  how long each target runs (default 30; 0 skips fuzzing)
#   TARGET              pgoutput_decode, router_route, replication_wire (default: all)
#
# scripts/test.sh runs a short pass (20 s per target). For a real campaign, run longer, e.g.
#   scripts/fuzz.sh 3600                     # an hour per target
#   scripts/fuzz.sh 28800 pgoutput_decode    # a night on the decoder
# The corpus grows across runs in target/fuzz/corpus/<target>, so later runs start from
# what earlier ones found.
#
# Steps:
#   1. Installs cargo-fuzz $CARGO_FUZZ_VERSION with `cargo install --locked`, once, into
#      ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/cargo-fuzz-<version> (about 1-2 minutes on
#      2 cores); later runs reuse it.
#   2. Builds the targets. cargo-fuzz passes nightly-only flags (-Zsanitizer, sancov
#      passes); RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
#   3. Writes the seeds (fuzz/make_seeds.py): the captured pgoutput fixtures
#      (crates/pgoutput/tests/fixtures/*.hex) as message sequences, and a few router inputs.
#   4. Runs the targets all at once, each with -max_total_time = SECONDS_PER_TARGET x targets
#      / cores (at least SECONDS_PER_TARGET: about SECONDS_PER_TARGET of a core each),
#      -rss_limit_mb=512 and -malloc_limit_mb=256 (an input that makes the code allocate more
#      than that is a failure).
#
# Exits non-zero if any target finds a failing input (panic, crash, timeout, out of
# memory); the input's path and how to replay it are printed. Everything it writes is
# under target/fuzz/ (ignored by git).
#
# Environment:
#   SIPHON_CACHE_DIR       cache root (default $HOME/.cache/siphon)
#   SIPHON_FUZZ_SANITIZER  address (default) or none (about twice as many runs per second;
#                          the crates fuzzed have no unsafe code of their own)
#   SIPHON_FUZZ_VERBOSE    1 to print libFuzzer's whole output (default: only a summary
#                          per target, and the end of the log when a target fails)
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(pgoutput_decode router_route replication_wire)

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if ! command -v cargo >/dev/null 2>&1 && [[ -f ${HOME:-/root}/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi

log() { printf 'fuzz: %s\n' "$*"; }
die() {
    printf 'fuzz: ERROR: %s\n' "$*" >&2
    exit 2
}

seconds=${1:-30}
[[ $seconds =~ ^[0-9]+$ ]] || die "SECONDS_PER_TARGET must be a whole number, not '$seconds'"
shift || true
targets=("$@")
((${#targets[@]} > 0)) || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
    [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || die "unknown target '$t' (known: ${ALL_TARGETS[*]})"
done
if ((seconds == 0)); then
    log "SECONDS_PER_TARGET is 0: skipped"
    exit 0
fi

sanitizer=${SIPHON_FUZZ_SANITIZER:-address}
case $sanitizer in
address | none) ;;
*) die "SIPHON_FUZZ_SANITIZER must be address or none, not '$sanitizer'" ;;
esac
command -v cargo >/dev/null 2>&1 || die "cargo not found"
command -v python3 >/dev/null 2>&1 || die "python3 not found (it writes the seed corpora)"

# ------------------------------------------------------------ cargo-fuzz ----

cache=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
fuzz_root=$cache/cargo-fuzz-$CARGO_FUZZ_VERSION
cargo_fuzz=$fuzz_root/bin/cargo-fuzz

cargo_fuzz_ok() {
    [[ -x $cargo_fuzz ]] && [[ $("$cargo_fuzz" --version 2>/dev/null) == "cargo-fuzz $CARGO_FUZZ_VERSION" ]]
}

if ! cargo_fuzz_ok; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $fuzz_root (once; a minute or two)"
    t0=$SECONDS
    mkdir -p "$cache"
    out=$(mktemp)
    if ! cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --force \
        --root "$fuzz_root" >"$out" 2>&1; then
        cat "$out" >&2
        rm -f "$out"
        die "cargo install cargo-fuzz failed"
    fi
    rm -f "$out"
    cargo_fuzz_ok || die "installed $cargo_fuzz but it does not report version $CARGO_FUZZ_VERSION"
    log "installed cargo-fuzz in $((SECONDS - t0))s"
fi
export PATH=$fuzz_root/bin:$PATH
# cargo-fuzz passes -Z flags to rustc and cargo; let the stable toolchain take them.
export RUSTC_BOOTSTRAP=1
# A smaller quarantine than ASan's 256 MB, so that -rss_limit_mb measures the code fuzzed
# (the crates are safe Rust: use-after-free detection is not what ASan is here for; its
# malloc hooks are what make -malloc_limit_mb work). Settings given in ASAN_OPTIONS win.
export ASAN_OPTIONS=quarantine_size_mb=32${ASAN_OPTIONS:+:$ASAN_OPTIONS}

# ----------------------------------------------------------------- build ----

work=$root/target/fuzz
build_dir=$work/build
fuzz_args=(--fuzz-dir "$root/fuzz" --target-dir "$build_dir" --sanitizer "$sanitizer")

log "building ${targets[*]} (sanitizer: $sanitizer)"
t0=$SECONDS
out=$(mktemp)
for t in "${targets[@]}"; do
    if ! cargo fuzz build "${fuzz_args[@]}" "$t" >"$out" 2>&1; then
        cat "$out" >&2
        rm -f "$out"
        die "cargo fuzz build $t failed"
    fi
done
rm -f "$out"
log "built in $((SECONDS - t0))s"

# ----------------------------------------------------------------- seeds ----

python3 "$root/fuzz/make_seeds.py" "$root/crates/pgoutput/tests/fixtures" \
    "$work/seeds/pgoutput_decode" "$work/seeds/router_route" | sed 's/^/fuzz: /'

# ------------------------------------------------------------------- run ----

# The targets run all at once, each for SECONDS_PER_TARGET x targets / cores of wall time (not
# less than SECONDS_PER_TARGET): each still gets about SECONDS_PER_TARGET of a core, in less
# wall time than one after another.
cores=$(nproc 2>/dev/null || echo 1)
side_by_side=$((${#targets[@]} < cores ? ${#targets[@]} : cores))
wall=$(((seconds * ${#targets[@]} + side_by_side - 1) / side_by_side))

# libFuzzer flags shared by every target.
libfuzzer_flags=(
    -max_total_time="$wall"
    -rss_limit_mb=512
    -malloc_limit_mb=256
    -timeout=10
    -print_final_stats=1
)

# Runs target $1; its summary lines go to $work/logs/$1.summary, its status to $1.status.
run_target() {
    local t=$1
    local corpus=$work/corpus/$t
    # Targets without captured fixtures start from an empty seed directory.
    mkdir -p "$work/seeds/$t"
    local artifacts=$work/artifacts/$t
    local logfile=$work/logs/$t.log
    local summary=$work/logs/$t.summary
    mkdir -p "$corpus" "$artifacts" "$(dirname "$logfile")"
    : >"$summary"
    local before
    before=$(find "$artifacts" -type f | sort)
    local rc=0
    # New inputs go to the first corpus directory; the seeds are read only.
    local cmd=(cargo fuzz run "${fuzz_args[@]}" "$t" "$corpus" "$work/seeds/$t" --
        "${libfuzzer_flags[@]}" -artifact_prefix="$artifacts/")
    if [[ ${SIPHON_FUZZ_VERBOSE:-0} == 1 ]]; then
        "${cmd[@]}" 2>&1 | tee "$logfile" || rc=${PIPESTATUS[0]}
    else
        "${cmd[@]}" >"$logfile" 2>&1 || rc=$?
    fi
    {
        # libFuzzer's first and last status lines: coverage (cov), features (ft), corpus size.
        grep -E '^#[0-9]+[[:space:]]+INITED' "$logfile" | head -n1 | sed "s/^/fuzz: $t: /" || true
        grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "$logfile" | tail -n1 |
            sed "s/^/fuzz: $t: /" || true
        grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$logfile" |
            sed "s/^/fuzz: $t: /" || true
        local new
        new=$(comm -13 <(printf '%s\n' "$before") <(find "$artifacts" -type f | sort) | sed '/^$/d')
        if ((rc != 0)) || [[ -n $new ]]; then
            # The panic message or sanitizer report, then the end of the log.
            grep -E -A2 'panicked at|ERROR: (libFuzzer|AddressSanitizer)|^SUMMARY' "$logfile" |
                head -n 20 | sed "s/^/fuzz: $t: | /" || true
            printf 'fuzz: %s: | ...\n' "$t"
            tail -n 25 "$logfile" | sed "s/^/fuzz: $t: | /"
            if [[ -n $new ]]; then
                while IFS= read -r input; do
                    log "$t FAILED: failing input: ${input#"$root"/}"
                    log "  replay:   RUSTC_BOOTSTRAP=1 PATH=$fuzz_root/bin:\$PATH cargo fuzz run --fuzz-dir fuzz --target-dir target/fuzz/build --sanitizer $sanitizer $t ${input#"$root"/}"
                    [[ $t == router_route ]] &&
                        log "  as Rust:  RUSTC_BOOTSTRAP=1 PATH=$fuzz_root/bin:\$PATH cargo fuzz fmt --fuzz-dir fuzz --target-dir target/fuzz/build --sanitizer $sanitizer $t ${input#"$root"/}"
                done <<<"$new"
            else
                log "$t FAILED (exit $rc) without writing an input; see ${logfile#"$root"/}"
            fi
            echo failed >"$work/logs/$t.status"
        else
            log "$t: ok, no failing input in ${wall}s (beside the other targets)"
            echo ok >"$work/logs/$t.status"
        fi
    } >>"$summary"
}

log "running ${targets[*]} side by side for ${wall}s each on ${cores} cores (corpora in target/fuzz/corpus, logs in target/fuzz/logs)"
mkdir -p "$work/logs"
running=()
for t in "${targets[@]}"; do
    rm -f "$work/logs/$t.status"
    run_target "$t" &
    running+=($!)
done
for pid in "${running[@]}"; do
    wait "$pid" || true
done

failed=()
for t in "${targets[@]}"; do
    cat "$work/logs/$t.summary"
    [[ $(cat "$work/logs/$t.status" 2>/dev/null) == ok ]] || failed+=("$t")
done

if ((${#failed[@]} > 0)); then
    log "FAILED: ${failed[*]}"
    exit 1
fi
log "ok: ${targets[*]}"
