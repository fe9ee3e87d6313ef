//! Harness for Siphon's end-to-end tests: real PostgreSQL clusters, real
//! Apache Kafka (a single node shared by the tests, a node of a test's own, or a
//! three-node cluster) and the real `siphon` binary, each stopped when its
//! handle is dropped.
//!
//! Setup: `scripts/install-deps.sh` installs PostgreSQL and Kafka;
//! `cargo build -p siphon` builds the binary. `scripts/test.sh` does both and
//! then runs every test.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use siphon_tests::{read_topic, Broker, Postgres};
//! use std::time::Duration;
//!
//! let pg = Postgres::start()?;
//! let db = pg.connect().await?;
//! db.batch_execute("CREATE TABLE outbox (id bigint PRIMARY KEY)").await?;
//! let broker = Broker::start()?;
//! let records = read_topic(&broker.bootstrap(), &broker.topic("orders"), Duration::from_secs(10))?;
//! # let _ = records; Ok(()) }
//! ```
//!
//! # Invariants
//!
//! - Every service binds 127.0.0.1 only, on a port from [`free_port`], with
//!   its own fresh temporary directory: tests may run in parallel. Tests that
//!   share a Kafka broker use topics in namespaces of their own
//!   ([`Broker::topic`]).
//! - Every handle stops what it started when dropped (PostgreSQL: immediate
//!   shutdown; processes: SIGKILL) and removes its directory, unless the
//!   thread is panicking or `SIPHON_KEEP_TEST_DIRS` is set, in which case the
//!   directory is kept and its path and log tail are printed to stderr (which
//!   the test runner shows for failing tests). The tail of the siphon log is
//!   printed on every drop, so it also shows for tests that fail by
//!   returning `Err`; set `SIPHON_KEEP_TEST_DIRS=1` to keep the files.
//! - Nothing here depends on Siphon's own crates: the harness checks the
//!   system from the outside.

pub mod broker;
pub mod corpus;
pub mod differential;
pub mod http;
pub mod kafka;
pub mod kafka_protocol;
pub mod kafka_read;
pub mod oracle;
pub mod outbox;
pub mod partition;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod python;
pub mod registry_proxy;
pub mod rng;
pub mod scenarios;
pub mod schema_registry;
pub mod siphon;
pub mod tansu;
pub mod wait;

pub use broker::Broker;
pub use kafka::{KafkaCluster, KafkaNode};
pub use kafka_read::{
    create_topic, create_topic_replicated, list_topics, read_topic, read_topic_async,
    read_topic_isolated, read_topic_isolated_async, read_topic_settled, read_topic_settled_async,
    wait_for_transactions_settled, ConsumedRecord, Isolation,
};
pub use ports::free_port;
pub use postgres::Postgres;
pub use schema_registry::RegistryServer;
pub use siphon::{run_siphon, siphon_bin, strip_ansi, SiphonProcess};
pub use wait::{wait_for, wait_until};

use std::path::{Path, PathBuf};

/// Root of the Cargo workspace (the parent of this package's directory).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cache of installed test dependencies: `$SIPHON_CACHE_DIR`, else `$HOME/.cache/siphon`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("SIPHON_CACHE_DIR") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/siphon")
        }
    }
}

/// A test's prerequisite (a JDK, python3, a PostgreSQL version) is missing: under CI
/// (`CI` set and not `false`/`0`) that is the test's failure, so a run that lacks it cannot pass
/// by skipping; elsewhere the test says why and stops, passing.
pub fn prerequisite_missing(test: &str, why: &str) -> anyhow::Result<()> {
    if under_ci(std::env::var("CI").ok().as_deref()) {
        anyhow::bail!("{test} cannot run: {why} (under CI a missing prerequisite fails the test)");
    }
    eprintln!("not run: {test}: {why}");
    Ok(())
}

/// Whether the `CI` variable's value (`None`: unset) says the tests run under CI.
fn under_ci(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Whether temporary directories should be kept after a handle is dropped.
fn keep_dirs() -> bool {
    std::env::var_os("SIPHON_KEEP_TEST_DIRS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Creates a fresh directory with a short path under `/tmp` (PostgreSQL's
/// Unix socket path must stay below 108 bytes, so `$TMPDIR` is not used).
fn short_tempdir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    use anyhow::Context as _;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .with_context(|| format!("creating a temporary directory {prefix}* in /tmp"))
}

/// The last `lines` lines of a text file, or a note why it cannot be read.
fn tail_file(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Drop-time handling of a handle's directory: removed normally, kept (and
/// reported on stderr with the log's tail) on panic or when requested. With
/// `always_tail`, the log's tail is printed even when nothing failed; the
/// test runner only shows it for failing tests, including those that fail by
/// returning `Err` (no panic happens while their handles drop).
fn finish_dir(dir: tempfile::TempDir, what: &str, log: &Path, always_tail: bool) {
    let panicking = std::thread::panicking();
    let keep = panicking || keep_dirs();
    if panicking || always_tail {
        eprintln!(
            "--- {what}: last lines of {}{} ---\n{}\n--- end of {what} log ---",
            log.display(),
            if keep { " (kept)" } else { "" },
            tail_file(log, 40)
        );
    }
    if keep {
        let path = dir.keep();
        if !panicking {
            eprintln!("{what}: kept {}", path.display());
        }
    }
    // Otherwise `dir` is dropped here, which removes it.
}

#[cfg(test)]
mod ci_tests {
    use super::under_ci;

    #[test]
    fn ci_is_any_value_but_empty_false_or_0() {
        for set in ["true", "1", "yes", "TRUE"] {
            assert!(under_ci(Some(set)), "{set}");
        }
        for unset in [None, Some(""), Some("false"), Some("0")] {
            assert!(!under_ci(unset), "{unset:?}");
        }
    }
}
