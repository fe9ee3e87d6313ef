#!/usr/bin/env bash
# Install the Apache Kafka broker the tests, the demo and the benchmark run: Kafka's jars from
# Maven Central (org.apache.kafka:kafka_2.13 and its runtime dependencies, plus log4j2's SLF4J
# binding), fetched with `mvn dependency:copy-dependencies` from scripts/kafka/pom.xml into a
# cache outside the repository, keyed by version:
#     ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/kafka-<version>/libs/*.jar
# The cache is checked before use (a completion marker holding the POM's hash, the broker jar,
# and `kafka.tools.StorageTool random-uuid` run from it); a cache made from another POM is
# fetched again. No tarball and no download outside the registries.
#
# Usage: scripts/install-kafka.sh        prints the jar directory as its last line
#
# Needs Java 17+ and Maven (scripts/install-deps.sh installs Debian's when missing).
# Environment:
#   SIPHON_CACHE_DIR   cache root (default $HOME/.cache/siphon)
set -euo pipefail

KAFKA_VERSION=4.4.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POM=$here/kafka/pom.xml
CACHE_DIR=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
DEST=$CACHE_DIR/kafka-$KAFKA_VERSION

log() { printf 'install-kafka: %s\n' "$*" >&2; }
die() {
    printf 'install-kafka: ERROR: %s\n' "$*" >&2
    exit 1
}

command -v java >/dev/null 2>&1 || die "java not found: install a Java 17+ runtime (apt-get install default-jdk-headless)"
command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (apt-get install maven)"
grep -q "<kafka.version>$KAFKA_VERSION</kafka.version>" "$POM" ||
    die "$POM does not pin Kafka $KAFKA_VERSION"

pom_sum=$(sha256sum "$POM" | cut -d' ' -f1)

cache_ok() {
    [[ -f $DEST/.complete && $(<"$DEST/.complete") == "$pom_sum" ]] || return 1
    [[ -f $DEST/libs/kafka_2.13-$KAFKA_VERSION.jar && -f $DEST/libs/kafka-clients-$KAFKA_VERSION.jar ]] || return 1
    # The jars load and run: the formatter makes a cluster id.
    [[ $(java -cp "$DEST/libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null) =~ ^[A-Za-z0-9_-]{22}$ ]]
}

if ! cache_ok; then
    log "fetching Apache Kafka $KAFKA_VERSION from Maven Central (~45 MB)"
    mkdir -p "$CACHE_DIR"
    tmp=$(mktemp -d "$CACHE_DIR/.kafka-dl.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    if ! mvn -B -q -f "$POM" dependency:copy-dependencies \
        -DoutputDirectory="$tmp/libs" -DincludeScope=runtime >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "mvn dependency:copy-dependencies failed"
    fi
    rm -rf "$DEST"
    mkdir -p "$DEST"
    mv "$tmp/libs" "$DEST/libs"
    printf '%s\n' "$pom_sum" >"$DEST/.complete"
    cache_ok || die "the jars in $DEST/libs do not run kafka.tools.StorageTool $KAFKA_VERSION"
    log "installed Apache Kafka $KAFKA_VERSION"
fi
printf '%s\n' "$DEST/libs"
