#!/usr/bin/env bash
# Install the benchmark's Kafka Connect worker with Debezium's PostgreSQL connector, from Maven
# Central (scripts/connect/pom.xml), into a cache outside the repository, keyed by versions:
#     ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/connect-<connect>-debezium-<debezium>/
#         libs/*.jar                            the worker's class path (connect-runtime,
#                                               connect-json, their dependencies, log4j2)
#         plugins/debezium-connector-postgres/  plugin.path: Debezium's own plugin archive
#                                               (the connector, the Outbox Event Router)
# `mvn dependency:copy-dependencies` fetches both; the archive is unpacked with tar. The cache
# is checked before use (a completion marker holding the POM's hash, the worker's and the
# connector's jars); a cache made from another POM is fetched again. A fresh install is also
# checked by starting ConnectStandalone from it (it prints its usage).
#
# Usage: scripts/install-connect.sh        prints the cache directory as its last line
#
# Needs Java 17+ and Maven (scripts/install-deps.sh installs Debian's when missing).
# Environment:
#   SIPHON_CACHE_DIR   cache root (default $HOME/.cache/siphon)
set -euo pipefail

CONNECT_VERSION=4.4.0
DEBEZIUM_VERSION=3.6.1.Final
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POM=$here/connect/pom.xml
LOG4J=$here/connect/log4j2.properties
CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
DEST=$CACHE_DIR/connect-$CONNECT_VERSION-debezium-${DEBEZIUM_VERSION%.Final}
PLUGIN=debezium-connector-postgres

log() { printf 'install-connect: %s\n' "$*" >&2; }
die() {
    printf 'install-connect: ERROR: %s\n' "$*" >&2
    exit 1
}

command -v java >/dev/null 2>&1 || die "java not found: install a Java 17+ runtime (apt-get install default-jdk-headless)"
command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (apt-get install maven)"
grep -q "<connect.version>$CONNECT_VERSION</connect.version>" "$POM" ||
    die "$POM does not pin Kafka Connect $CONNECT_VERSION"
grep -q "<debezium.version>$DEBEZIUM_VERSION</debezium.version>" "$POM" ||
    die "$POM does not pin Debezium $DEBEZIUM_VERSION"

pom_sum=$(sha256sum "$POM" | cut -d' ' -f1)

jars_ok() {
    [[ -f $DEST/libs/connect-runtime-$CONNECT_VERSION.jar && -f $DEST/libs/connect-json-$CONNECT_VERSION.jar ]] || return 1
    [[ -f $DEST/plugins/$PLUGIN/$PLUGIN-$DEBEZIUM_VERSION.jar ]]
}

cache_ok() {
    [[ -f $DEST/.complete && $(<"$DEST/.complete") == "$pom_sum" ]] && jars_ok
}

# The worker starts from the jars: without arguments it logs its usage.
worker_runs() {
    local out
    out=$(java -Dlog4j2.configurationFile="$LOG4J" -cp "$DEST/libs/*" \
        org.apache.kafka.connect.cli.ConnectStandalone 2>&1 || true)
    [[ $out == *"Usage: ConnectStandalone"* ]]
}

if ! cache_ok; then
    log "fetching Kafka Connect $CONNECT_VERSION and Debezium $DEBEZIUM_VERSION from Maven Central (~60 MB)"
    mkdir -p "$CACHE_DIR"
    tmp=$(mktemp -d "$CACHE_DIR/.connect-dl.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    if ! mvn -B -q -f "$POM" dependency:copy-dependencies \
        -DoutputDirectory="$tmp/libs" -DincludeScope=runtime -DexcludeTypes=tar.gz >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "mvn dependency:copy-dependencies (the worker) failed"
    fi
    if ! mvn -B -q -f "$POM" dependency:copy-dependencies \
        -DoutputDirectory="$tmp/archive" -DincludeTypes=tar.gz >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "mvn dependency:copy-dependencies (Debezium's plugin archive) failed"
    fi
    mkdir -p "$tmp/plugins"
    tar -xzf "$tmp/archive/$PLUGIN-$DEBEZIUM_VERSION-plugin.tar.gz" -C "$tmp/plugins"
    rm -rf "$DEST"
    mkdir -p "$DEST"
    mv "$tmp/libs" "$DEST/libs"
    mv "$tmp/plugins" "$DEST/plugins"
    jars_ok || die "$DEST lacks the worker's or the connector's jars"
    worker_runs || die "the jars in $DEST/libs do not start ConnectStandalone"
    printf '%s\n' "$pom_sum" >"$DEST/.complete"
    log "installed Kafka Connect $CONNECT_VERSION with Debezium $DEBEZIUM_VERSION"
fi
printf '%s\n' "$DEST"
