#!/usr/bin/env bash
# Differential test: rows through a real Debezium (embedded engine, PostgreSQL connector,
# outbox Event Router, Kafka Connect converters) and through Siphon, compared byte for byte.
#
# Usage: scripts/differential.sh [--java17] [ROWS]
#   ROWS      corpus size (default 5000; the test run by `cargo test` uses 300)
#   --java17  run the oracle on the system's Java 17 and Siphon with format.java_version = 17
# Environment: SIPHON_DIFFERENTIAL_SEED picks another corpus (default 20240501).
#
# Installs what the oracle needs (scripts/install-deps.sh), builds the siphon binary, then
# runs tests/tests/debezium_bytes/differential.rs and prints its summary (differences grouped by kind).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

java17=0
rows=5000
for arg in "$@"; do
    case $arg in
    --java17) java17=1 ;;
    *[!0-9]* | '') echo "usage: $0 [--java17] [ROWS]" >&2 && exit 2 ;;
    *) rows=$arg ;;
    esac
done

scripts/install-deps.sh >/dev/null
cargo build -p siphon
if ((java17)); then
    java17_bin=$(find /usr/lib/jvm -path '*17*' -name java -type f -perm -u+x 2>/dev/null | head -n1)
    [[ -n $java17_bin ]] || {
        echo "differential: no Java 17 under /usr/lib/jvm (apt-get install openjdk-17-jre-headless)" >&2
        exit 1
    }
    export SIPHON_ORACLE_JAVA=$java17_bin SIPHON_ORACLE_JAVA_VERSION=17
fi
SIPHON_DIFFERENTIAL_ROWS=$rows exec cargo test -p siphon-tests --test differential -- --nocapture
