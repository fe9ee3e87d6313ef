//! The Debezium row: Debezium's embedded engine with the PostgreSQL connector and the outbox
//! Event Router (`tests/debezium/BenchDrain.java`, found, compiled and started through the
//! differential oracle's Java set-up, [`siphon_tests::oracle::Oracle`]) drains its own slot
//! into a sink that converts each record as a Connect worker would and discards it.
//!
//! # Invariants
//! - The row is timed like Siphon's: from the JVM's start to the slot's `confirmed_flush_lsn`
//!   reaching the end of the backlog. Debezium confirms positions only when it flushes offsets
//!   (every [`OFFSET_FLUSH_MS`]) and may never confirm the last commit's end; when the slot is
//!   still short of the end [`LAST_RECORD_GRACE`] after Debezium reported the backlog's last
//!   record, the drain ends at that report instead ([`DrainEnd::LastRecord`]).
//! - The JVM is killed when the drain is dropped, so an error path leaves no process behind.
//! - A drain whose record count has not moved for [`STALL`] (JVM start included) fails
//!   instead of waiting for the drain timeout: Debezium never confirms the end by itself.
//! - The record count is what the engine delivered after the router (one per outbox INSERT;
//!   DELETEs and tombstones are dropped by the router), read after the JVM stopped.

use super::drain::{CpuWatch, Drain, DrainEnd};
use super::procstat;
use super::services::Services;
use super::workload;
use anyhow::{bail, Context as _, Result};
use siphon_tests::oracle::{write_properties, Oracle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr as _;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt as _;

/// `offset.flush.interval.ms` of the engine: how often Debezium confirms a position to the
/// slot (Siphon's default status interval is the same second).
pub const OFFSET_FLUSH_MS: u64 = 1_000;
/// How long after its last record Debezium may take to confirm the end before the drain is
/// timed to that record.
pub const LAST_RECORD_GRACE: Duration = Duration::from_millis(3 * OFFSET_FLUSH_MS);
/// How long the record count may stand still before the drain fails.
pub const STALL: Duration = Duration::from_secs(60);

/// Finds Java and the Debezium jars (installing the jars if needed, as the differential test
/// does) and compiles the programs. `Err` holds why the row is skipped.
pub fn locate() -> std::result::Result<Oracle, String> {
    match Oracle::locate() {
        Ok(Some(oracle)) => Ok(oracle),
        Ok(None) => Err("no JDK (java and javac) on PATH or in JAVA_HOME".into()),
        Err(e) => Err(format!("Debezium is not usable: {e:#}")),
    }
}

/// The engine's connection settings from a PostgreSQL URL or key-value string.
pub fn connection_properties(url: &str) -> Result<BTreeMap<String, String>> {
    let config = tokio_postgres::Config::from_str(url)
        .with_context(|| format!("parsing the PostgreSQL URL {url}"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(other) => bail!("Debezium needs a TCP host, not {other:?}"),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .context("the PostgreSQL URL names no user")?;
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    Ok([
        ("database.hostname", host),
        ("database.port", port.to_string()),
        ("database.user", user.to_owned()),
        ("database.password", password),
        ("database.dbname", dbname.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect())
}

/// The whole run file of `BenchDrain.java`: engine, connector, router, and the expected count.
pub fn run_properties(url: &str, slot: &str, expected: u64) -> Result<BTreeMap<String, String>> {
    let mut p = connection_properties(url)?;
    let table = workload::TABLE;
    for (k, v) in [
        ("name", "siphon-bench-debezium"),
        (
            "connector.class",
            "io.debezium.connector.postgresql.PostgresConnector",
        ),
        (
            "offset.storage",
            "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        ),
        ("offset.flush.interval.ms", &OFFSET_FLUSH_MS.to_string()),
        ("plugin.name", "pgoutput"),
        ("slot.name", slot),
        ("publication.name", workload::PUBLICATION),
        ("publication.autocreate.mode", "disabled"),
        ("snapshot.mode", "no_data"),
        ("table.include.list", table),
        ("topic.prefix", "siphon_bench"),
        ("transforms", "outbox"),
        (
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        ),
        ("bench.expected", &expected.to_string()),
    ] {
        p.insert(k.to_owned(), v.to_owned());
    }
    Ok(p)
}

/// When a Debezium drain is over, decided at `now` (time since the JVM started).
pub fn drain_end(
    now: Duration,
    slot_at_end: bool,
    last_record_at: Option<Duration>,
    grace: Duration,
) -> Option<(Duration, DrainEnd)> {
    if slot_at_end {
        return Some((now, DrainEnd::SlotConfirmed));
    }
    let last = last_record_at?;
    (now >= last + grace).then_some((last, DrainEnd::LastRecord))
}

/// A control line of `BenchDrain.java`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Progress(u64),
    LastRecord,
    Error(String),
    Count { records: u64, bytes: u64 },
}

/// Parses a line of the JVM's standard output; `None` for anything that is not a control line.
pub fn parse_control(line: &str) -> Option<Control> {
    let mut fields = line.strip_prefix("BENCH\t")?.split('\t');
    match fields.next()? {
        "PROGRESS" => Some(Control::Progress(fields.next()?.parse().ok()?)),
        "LAST" => Some(Control::LastRecord),
        "ERROR" => Some(Control::Error(fields.collect::<Vec<_>>().join(" "))),
        "COUNT" => Some(Control::Count {
            records: fields.next()?.parse().ok()?,
            bytes: fields.next()?.parse().ok()?,
        }),
        _ => None,
    }
}

fn work_dir() -> Result<PathBuf> {
    let dir = siphon_tests::workspace_root().join("target/bench/debezium");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Drains `slot` with Debezium until the end of the backlog (`end_lsn`), expecting `events`
/// records; samples the JVM's usage, then stops it by closing its standard input.
pub async fn drain(
    svc: &Services,
    db: &tokio_postgres::Client,
    oracle: &Oracle,
    slot: &str,
    end_lsn: u64,
    events: u64,
    timeout: Duration,
) -> Result<Drain> {
    let dir = work_dir()?;
    let props_file = dir.join("run.properties");
    write_properties(&props_file, &run_properties(&svc.pg_url, slot, events)?)?;
    let log_path = dir.join("debezium.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let log_hint = format!("see {}", log_path.display());

    let watch = CpuWatch::start(svc, slot).await?;
    let start = Instant::now();
    let mut command = tokio::process::Command::from(oracle.java_command("BenchDrain"));
    let mut child = command
        .arg(&props_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting the Debezium JVM")?;
    let pid = child.id().context("the Debezium JVM has no pid")?;
    let stdout = child.stdout.take().context("the JVM's stdout")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(c) = parse_control(&line) {
                if tx.send((start.elapsed(), c)).is_err() {
                    break;
                }
            }
        }
    });

    let outcome: Result<Drain> = async {
        let deadline = start + timeout;
        let mut last_record_at = None;
        let (mut count, mut count_changed_at) = (0, Duration::ZERO);
        let (elapsed, end) = loop {
            while let Ok((at, control)) = rx.try_recv() {
                match control {
                    Control::Progress(n) if n != count => (count, count_changed_at) = (n, at),
                    Control::Progress(_) => {}
                    Control::LastRecord => last_record_at = Some(at),
                    Control::Error(e) => bail!("Debezium stopped: {e} ({log_hint})"),
                    Control::Count { .. } => {}
                }
            }
            if let Some(status) = child.try_wait().context("polling the Debezium JVM")? {
                bail!("the Debezium JVM exited early ({status}; {log_hint})");
            }
            let slot_at_end = workload::confirmed_lsn(db, slot).await? >= end_lsn;
            if let Some(done) = drain_end(
                start.elapsed(),
                slot_at_end,
                last_record_at,
                LAST_RECORD_GRACE,
            ) {
                break done;
            }
            if Instant::now() >= deadline {
                bail!("Debezium did not reach the end of the backlog within {timeout:?} ({log_hint})");
            }
            if last_record_at.is_none() && start.elapsed() >= count_changed_at + STALL {
                bail!(
                    "Debezium delivered {count} of {events} records and none for {STALL:?} ({log_hint})"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (walsender_cpu, broker_cpu) = watch.finish().await;
        let usage = procstat::sample(pid)?;
        if end == DrainEnd::LastRecord {
            let confirmed = workload::confirmed_lsn(db, slot).await?;
            eprintln!(
                "bench: debezium's slot stayed {} bytes of WAL short of the end of the backlog; timed to its last record",
                end_lsn.saturating_sub(confirmed)
            );
        }

        // Closing stdin stops the engine; the JVM then reports its count and exits.
        drop(child.stdin.take());
        let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .with_context(|| format!("the Debezium JVM did not stop within 60 s ({log_hint})"))?
            .context("waiting for the Debezium JVM")?;
        let _ = reader.await;
        let mut records = None;
        while let Ok((_, control)) = rx.try_recv() {
            match control {
                Control::Count { records: r, .. } => records = Some(r),
                Control::Error(e) => eprintln!("bench: debezium reported at stop: {e}"),
                Control::LastRecord | Control::Progress(_) => {}
            }
        }
        if !exit.success() {
            bail!("the Debezium JVM exited with {exit} ({log_hint})");
        }
        let records =
            records.with_context(|| format!("the Debezium JVM reported no count ({log_hint})"))?;
        Ok(Drain {
            secs: elapsed.as_secs_f64(),
            usage: Some(usage),
            records_produced: Some(records as f64),
            walsender_cpu,
            broker_cpu,
            end,
            first_record_secs: None,
            registry: None,
        })
    }
    .await;
    if outcome.is_err() {
        // Release the slot before the caller drops it: kill the JVM and wait for it.
        let _ = child.kill().await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_from_url_and_key_value() -> Result<()> {
        let p = connection_properties("postgres://siphon:s%3Dcret@127.0.0.1:5433/db")?;
        assert_eq!(p["database.hostname"], "127.0.0.1");
        assert_eq!(p["database.port"], "5433");
        assert_eq!(p["database.user"], "siphon");
        assert_eq!(p["database.password"], "s=cret");
        assert_eq!(p["database.dbname"], "db");
        let p = connection_properties("host=db.local user=u")?;
        assert_eq!(p["database.hostname"], "db.local");
        assert_eq!(p["database.port"], "5432");
        assert_eq!(p["database.dbname"], "u");
        assert_eq!(p["database.password"], "");
        assert!(connection_properties("host=/run/postgresql user=u").is_err());
        Ok(())
    }

    #[test]
    fn run_file_names_the_slot_router_and_count() -> Result<()> {
        let p = run_properties("postgres://u:p@127.0.0.1:1/d", "siphon_bench_debezium", 7)?;
        assert_eq!(p["slot.name"], "siphon_bench_debezium");
        assert_eq!(p["publication.name"], workload::PUBLICATION);
        assert_eq!(
            p["transforms.outbox.type"],
            "io.debezium.transforms.outbox.EventRouter"
        );
        assert_eq!(p["bench.expected"], "7");
        assert_eq!(p["offset.flush.interval.ms"], "1000");
        Ok(())
    }

    #[test]
    fn drain_ends_at_the_slot_or_at_the_last_record_after_the_grace() {
        let s = Duration::from_secs;
        let grace = s(3);
        // Not at the end and no last record yet: keep waiting.
        assert_eq!(drain_end(s(5), false, None, grace), None);
        // The slot confirmed the end: timed to now.
        assert_eq!(
            drain_end(s(5), true, Some(s(4)), grace),
            Some((s(5), DrainEnd::SlotConfirmed))
        );
        // Last record seen, the flush may still come.
        assert_eq!(drain_end(s(6), false, Some(s(4)), grace), None);
        // The flush lags past the grace: timed to the last record.
        assert_eq!(
            drain_end(s(7), false, Some(s(4)), grace),
            Some((s(4), DrainEnd::LastRecord))
        );
    }

    #[test]
    fn control_lines() {
        assert_eq!(parse_control("BENCH\tLAST\t10"), Some(Control::LastRecord));
        assert_eq!(
            parse_control("BENCH\tPROGRESS\t7"),
            Some(Control::Progress(7))
        );
        assert_eq!(
            parse_control("BENCH\tCOUNT\t10\t4096"),
            Some(Control::Count {
                records: 10,
                bytes: 4096
            })
        );
        assert_eq!(
            parse_control("BENCH\tERROR\tconnection refused"),
            Some(Control::Error("connection refused".into()))
        );
        assert_eq!(parse_control("12:00:01 INFO Starting"), None);
        assert_eq!(parse_control("BENCH\tCOUNT\tx\t1"), None);
    }
}
