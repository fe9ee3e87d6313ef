//! The Debezium-on-Connect rows: a standalone Kafka Connect worker
//! (`org.apache.kafka.connect.cli.ConnectStandalone`, Connect 4.4.0's jars) running Debezium's
//! PostgreSQL connector with the Outbox Event Router (Debezium's own plugin archive in its
//! `plugin.path`), both from `scripts/install-connect.sh`, drains its own slot and produces to
//! the bench's broker: what users run, against which they compare Siphon.
//!
//! The worker converts as the embedded row's `BenchDrain.java` does (`JsonConverter` with
//! `schemas.enable=false` for keys and values, the worker's default `SimpleHeaderConverter`),
//! so both Debezium rows hand their producer the same bytes. It runs once per [`Producer`]
//! setting: Connect's producer defaults, and idempotent as Siphon's producer is.
//!
//! # Invariants
//! - Timed like the embedded row: from the JVM's start to the slot's `confirmed_flush_lsn`
//!   reaching the end of the backlog, or, when the worker's offset flush (every
//!   [`OFFSET_FLUSH_MS`]) still has not confirmed it [`LAST_RECORD_GRACE`] after the routed
//!   topics held the backlog's last record, to the moment they did ([`DrainEnd::LastRecord`]).
//! - The record count is the growth of the routed topics' end offsets (summed over their
//!   partitions, read with rdkafka) since just before the worker started, so a broker that
//!   keeps earlier runs' records counts only this one's. A read that fails while the worker
//!   runs (a topic it just created has no leader yet) keeps the last count.
//! - A worker whose count has not moved for [`STALL`] (JVM start included) fails the drain;
//!   the JVM is killed when the drain is dropped, so no error path leaves it running.
//! - Each run starts from an empty offset file (`target/bench/connect/<variant>/`): the
//!   connector starts at its fresh slot's position, never at an earlier run's offsets.

use super::backlog;
use super::debezium::connection_properties;
use super::drain::{CpuWatch, Drain, DrainEnd};
use super::procstat;
use super::services::Services;
use super::workload;
use anyhow::{bail, Context as _, Result};
use siphon_tests::oracle::write_properties;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `offset.flush.interval.ms` of the worker: how often Debezium confirms a position to its
/// slot (as in the embedded row).
pub const OFFSET_FLUSH_MS: u64 = super::debezium::OFFSET_FLUSH_MS;
/// How long after the last record reached the broker the worker may take to confirm the end.
pub const LAST_RECORD_GRACE: Duration = super::debezium::LAST_RECORD_GRACE;
/// How long the record count may stand still before the drain fails.
pub const STALL: Duration = Duration::from_secs(90);
/// How often the routed topics' end offsets are read.
const POLL: Duration = Duration::from_millis(100);
/// Partitions of the routed topics the worker creates (as the bench's other topics).
pub const TOPIC_PARTITIONS: u32 = 3;

/// JVM options of the worker (`$SIPHON_BENCH_CONNECT_JVM_OPTS` replaces them): what
/// `bin/connect-standalone.sh` and `bin/kafka-run-class.sh` give a worker.
pub const CONNECT_JVM_OPTS: &str = "-Xms256M -Xmx2G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
     -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
     -XX:MaxInlineLevel=15 -Djava.awt.headless=true";

/// The worker's producer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producer {
    /// Connect's producer defaults: nothing set.
    Defaults,
    /// `producer.enable.idempotence=true` with `producer.acks=all`, Siphon's setting.
    Idempotent,
}

impl Producer {
    pub const ALL: [Producer; 2] = [Producer::Defaults, Producer::Idempotent];

    /// The row's name in the tables.
    pub fn row_name(self) -> &'static str {
        match self {
            Producer::Defaults => "Debezium on Connect (producer defaults)",
            Producer::Idempotent => "Debezium on Connect (idempotent)",
        }
    }

    /// A short name for files, slots and topics.
    pub fn slug(self) -> &'static str {
        match self {
            Producer::Defaults => "defaults",
            Producer::Idempotent => "idempotent",
        }
    }

    /// The worker properties this setting adds.
    fn worker_overrides(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Producer::Defaults => &[],
            Producer::Idempotent => &[
                ("producer.enable.idempotence", "true"),
                ("producer.acks", "all"),
            ],
        }
    }
}

/// Where `scripts/install-connect.sh` put the worker.
#[derive(Debug, Clone)]
pub struct Install {
    /// The worker's class path: every jar in it.
    pub libs: PathBuf,
    /// The worker's `plugin.path`.
    pub plugins: PathBuf,
}

impl Install {
    pub fn at(dir: &Path) -> Install {
        Install {
            libs: dir.join("libs"),
            plugins: dir.join("plugins"),
        }
    }
}

/// Installs the worker if needed (`scripts/install-connect.sh`, which checks its cache) and
/// returns where it is; `Err` holds why the rows are skipped. Blocks.
pub fn locate() -> std::result::Result<Install, String> {
    let script = siphon_tests::workspace_root().join("scripts/install-connect.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .filter(|l| !l.trim().is_empty())
        .ok_or_else(|| format!("{} printed no directory", script.display()))?;
    Ok(Install::at(Path::new(dir.trim())))
}

/// The topic prefix the router's `route.topic.replacement` writes under for one drain.
pub fn topic_prefix(producer: Producer, shape_slug: &str) -> String {
    format!("siphon_bench_connect_{}_{shape_slug}", producer.slug())
}

/// The topics the backlog's events are routed to under `prefix` (one per aggregate type).
pub fn routed_topics(prefix: &str) -> Vec<String> {
    backlog::AGGREGATE_TYPES
        .iter()
        .map(|t| format!("{prefix}.{t}"))
        .collect()
}

/// The standalone worker's properties.
pub fn worker_properties(
    bootstrap: &str,
    plugins: &Path,
    offsets: &Path,
    rest_port: u16,
    producer: Producer,
) -> BTreeMap<String, String> {
    let json = "org.apache.kafka.connect.json.JsonConverter";
    let mut p: BTreeMap<String, String> = [
        ("bootstrap.servers", bootstrap.to_owned()),
        ("plugin.path", plugins.display().to_string()),
        (
            "offset.storage.file.filename",
            offsets.display().to_string(),
        ),
        ("offset.flush.interval.ms", OFFSET_FLUSH_MS.to_string()),
        ("listeners", format!("http://127.0.0.1:{rest_port}")),
        ("key.converter", json.to_owned()),
        ("key.converter.schemas.enable", "false".to_owned()),
        ("value.converter", json.to_owned()),
        ("value.converter.schemas.enable", "false".to_owned()),
        (
            "header.converter",
            "org.apache.kafka.connect.storage.SimpleHeaderConverter".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in producer.worker_overrides() {
        p.insert((*k).to_owned(), (*v).to_owned());
    }
    p
}

/// The connector's properties: the embedded row's connector and router settings, its own
/// slot and publication, topics under `topic_prefix` created by the worker.
pub fn connector_properties(
    url: &str,
    slot: &str,
    publication: &str,
    topic_prefix: &str,
) -> Result<BTreeMap<String, String>> {
    let mut p = connection_properties(url)?;
    let partitions = TOPIC_PARTITIONS.to_string();
    let replacement = format!("{topic_prefix}.${{routedByValue}}");
    for (k, v) in [
        ("name", "siphon-bench-connect"),
        (
            "connector.class",
            "io.debezium.connector.postgresql.PostgresConnector",
        ),
        ("tasks.max", "1"),
        ("plugin.name", "pgoutput"),
        ("slot.name", slot),
        ("publication.name", publication),
        ("publication.autocreate.mode", "disabled"),
        ("snapshot.mode", "no_data"),
        ("table.include.list", workload::TABLE),
        ("topic.prefix", "siphon_bench"),
        ("transforms", "outbox"),
        (
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        ),
        ("transforms.outbox.route.topic.replacement", &replacement),
        ("topic.creation.default.partitions", &partitions),
        ("topic.creation.default.replication.factor", "-1"),
    ] {
        p.insert(k.to_owned(), v.to_owned());
    }
    Ok(p)
}

/// The records in topics whose partitions' (low, high) watermarks are `now`, minus those in
/// `before`, per partition (a partition missing from `before` had none).
pub fn records_since(
    before: &BTreeMap<(String, i32), i64>,
    now: &BTreeMap<(String, i32), i64>,
) -> u64 {
    now.iter()
        .map(|(tp, high)| {
            let base = before.get(tp).copied().unwrap_or(0);
            u64::try_from(high.saturating_sub(base)).unwrap_or(0)
        })
        .sum()
}

/// The high watermark (end offset) of every partition of `topics`; a topic that does not
/// exist yet has none. Blocks.
fn end_offsets(
    consumer: &rdkafka::consumer::BaseConsumer,
    topics: &[String],
) -> Result<BTreeMap<(String, i32), i64>> {
    use rdkafka::consumer::Consumer as _;
    let timeout = Duration::from_secs(10);
    let mut out = BTreeMap::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .with_context(|| format!("reading the metadata of {topic}"))?;
        for t in metadata.topics() {
            if t.error().is_some() {
                continue;
            }
            for p in t.partitions() {
                let (_, high) = consumer
                    .fetch_watermarks(topic, p.id(), timeout)
                    .with_context(|| format!("reading the end offset of {topic}/{}", p.id()))?;
                out.insert((topic.clone(), p.id()), high);
            }
        }
    }
    Ok(out)
}

/// [`end_offsets`], retried for up to 10 s while the broker answers with an error.
async fn final_offsets(
    consumer: &rdkafka::consumer::BaseConsumer,
    topics: &[String],
) -> Result<BTreeMap<(String, i32), i64>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::task::block_in_place(|| end_offsets(consumer, topics)) {
            Ok(offsets) => return Ok(offsets),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

fn offsets_consumer(bootstrap: &str) -> Result<rdkafka::consumer::BaseConsumer> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "siphon-bench-connect-count")
        .set("allow.auto.create.topics", "false")
        .create()
        .context("creating the end-offset reader")
}

/// The worker's JVM options.
pub fn connect_jvm_opts() -> String {
    std::env::var("SIPHON_BENCH_CONNECT_JVM_OPTS")
        .ok()
        .filter(|o| !o.trim().is_empty())
        .unwrap_or_else(|| CONNECT_JVM_OPTS.to_owned())
}

/// One Connect drain's inputs.
pub struct Plan<'a> {
    pub producer: Producer,
    /// The publication the connector reads and a short name for its shape.
    pub publication: &'a str,
    pub shape_slug: &'a str,
    pub slot: &'a str,
    pub end_lsn: u64,
    pub events: u64,
    pub timeout: Duration,
}

/// Drains `plan.slot` with a standalone worker until the end of the backlog; samples the
/// worker's usage, then stops it with SIGTERM.
pub async fn drain(
    svc: &Services,
    db: &tokio_postgres::Client,
    install: &Install,
    plan: &Plan<'_>,
) -> Result<Drain> {
    let variant = format!("{}_{}", plan.producer.slug(), plan.shape_slug);
    let dir = siphon_tests::workspace_root()
        .join("target/bench/connect")
        .join(&variant);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let worker_file = dir.join("worker.properties");
    let connector_file = dir.join("connector.properties");
    let prefix = topic_prefix(plan.producer, plan.shape_slug);
    write_properties(
        &worker_file,
        &worker_properties(
            &svc.bootstrap,
            &install.plugins,
            &dir.join("offsets"),
            siphon_tests::free_port(),
            plan.producer,
        ),
    )?;
    write_properties(
        &connector_file,
        &connector_properties(&svc.pg_url, plan.slot, plan.publication, &prefix)?,
    )?;
    let log_path = dir.join("worker.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let log_hint = format!("see {}", log_path.display());
    let log4j = siphon_tests::workspace_root().join("scripts/connect/log4j2.properties");

    let topics = routed_topics(&prefix);
    let consumer = offsets_consumer(&svc.bootstrap)?;
    let before = tokio::task::block_in_place(|| end_offsets(&consumer, &topics))?;

    let watch = CpuWatch::start(svc, plan.slot).await?;
    let start = Instant::now();
    let mut child = tokio::process::Command::new(java())
        .args(connect_jvm_opts().split_whitespace())
        .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
        .arg("-cp")
        .arg(install.libs.join("*"))
        .arg("org.apache.kafka.connect.cli.ConnectStandalone")
        .arg(&worker_file)
        .arg(&connector_file)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("sharing the worker's log file")?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting the Kafka Connect worker")?;
    let pid = child.id().context("the Connect worker has no pid")?;

    let outcome: Result<Drain> = async {
        let deadline = start + plan.timeout;
        let (mut first_record_at, mut last_record_at) = (None, None);
        let (mut count, mut count_changed_at) = (0, Duration::ZERO);
        let (elapsed, end) = loop {
            // A topic the worker just created may answer NotLeaderForPartition for a moment:
            // a failed read keeps the last count until the next poll.
            if let Ok(now) = tokio::task::block_in_place(|| end_offsets(&consumer, &topics)) {
                let n = records_since(&before, &now);
                if n != count {
                    (count, count_changed_at) = (n, start.elapsed());
                }
            }
            if first_record_at.is_none() && count > 0 {
                first_record_at = Some(start.elapsed());
            }
            if last_record_at.is_none() && count >= plan.events {
                last_record_at = Some(start.elapsed());
            }
            if let Some(status) = child.try_wait().context("polling the Connect worker")? {
                bail!("the Connect worker exited early ({status}; {log_hint})");
            }
            let slot_at_end = workload::confirmed_lsn(db, plan.slot).await? >= plan.end_lsn;
            if let Some(done) = super::debezium::drain_end(
                start.elapsed(),
                slot_at_end,
                last_record_at,
                LAST_RECORD_GRACE,
            ) {
                break done;
            }
            if Instant::now() >= deadline {
                bail!(
                    "the Connect worker did not reach the end of the backlog within {:?} ({log_hint})",
                    plan.timeout
                );
            }
            if last_record_at.is_none() && start.elapsed() >= count_changed_at + STALL {
                bail!(
                    "the Connect worker produced {count} of {} records and none for {STALL:?} ({log_hint})",
                    plan.events
                );
            }
            tokio::time::sleep(POLL).await;
        };
        let (walsender_cpu, broker_cpu) = watch.finish().await;
        let usage = procstat::sample(pid)?;
        if end == DrainEnd::LastRecord {
            let confirmed = workload::confirmed_lsn(db, plan.slot).await?;
            eprintln!(
                "bench: the Connect worker's slot stayed {} bytes of WAL short of the end of the backlog; timed to its last record",
                plan.end_lsn.saturating_sub(confirmed)
            );
        }
        // The final count, after anything still in flight arrived (a duplicate shows here).
        let records = records_since(&before, &final_offsets(&consumer, &topics).await?);
        stop(&mut child, pid, &log_hint).await?;
        Ok(Drain {
            secs: elapsed.as_secs_f64(),
            usage: Some(usage),
            records_produced: Some(records as f64),
            walsender_cpu,
            broker_cpu,
            end,
            first_record_secs: first_record_at.map(|d| d.as_secs_f64()),
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

/// SIGTERM (the worker stops its task and flushes its offsets), then waits up to 60 s.
async fn stop(child: &mut tokio::process::Child, pid: u32, log_hint: &str) -> Result<()> {
    let pid = libc::pid_t::try_from(pid).context("the worker's pid")?;
    // SAFETY: kill(2) with a pid of a child this process spawned and has not reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    match tokio::time::timeout(Duration::from_secs(60), child.wait()).await {
        Ok(status) => {
            status.context("waiting for the Connect worker")?;
            Ok(())
        }
        Err(_) => {
            let _ = child.kill().await;
            bail!("the Connect worker did not stop within 60 s of SIGTERM ({log_hint})")
        }
    }
}

/// `$JAVA_HOME/bin/java` when set, else `java` on the `PATH`.
fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join("bin/java"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_properties_per_producer_setting() {
        let p = worker_properties(
            "127.0.0.1:9092",
            Path::new("/cache/plugins"),
            Path::new("/t/offsets"),
            8099,
            Producer::Defaults,
        );
        assert_eq!(p["bootstrap.servers"], "127.0.0.1:9092");
        assert_eq!(p["plugin.path"], "/cache/plugins");
        assert_eq!(p["offset.storage.file.filename"], "/t/offsets");
        assert_eq!(p["offset.flush.interval.ms"], "1000");
        assert_eq!(p["listeners"], "http://127.0.0.1:8099");
        // The embedded row's converters.
        assert_eq!(
            p["value.converter"],
            "org.apache.kafka.connect.json.JsonConverter"
        );
        assert_eq!(p["key.converter.schemas.enable"], "false");
        assert_eq!(p["value.converter.schemas.enable"], "false");
        assert!(!p.keys().any(|k| k.starts_with("producer.")), "{p:?}");
        let p = worker_properties(
            "b:1",
            Path::new("/p"),
            Path::new("/o"),
            1,
            Producer::Idempotent,
        );
        assert_eq!(p["producer.enable.idempotence"], "true");
        assert_eq!(p["producer.acks"], "all");
    }

    #[test]
    fn connector_properties_route_under_the_prefix() -> Result<()> {
        let prefix = topic_prefix(Producer::Idempotent, "insert_only");
        assert_eq!(prefix, "siphon_bench_connect_idempotent_insert_only");
        let p = connector_properties(
            "postgres://u:p@127.0.0.1:5/d",
            "siphon_bench_connect",
            "siphon_bench_pub",
            &prefix,
        )?;
        assert_eq!(p["slot.name"], "siphon_bench_connect");
        assert_eq!(p["publication.name"], "siphon_bench_pub");
        assert_eq!(p["plugin.name"], "pgoutput");
        assert_eq!(p["database.port"], "5");
        assert_eq!(
            p["transforms.outbox.route.topic.replacement"],
            "siphon_bench_connect_idempotent_insert_only.${routedByValue}"
        );
        assert_eq!(
            routed_topics(&prefix),
            [
                "siphon_bench_connect_idempotent_insert_only.BenchCustomer",
                "siphon_bench_connect_idempotent_insert_only.BenchOrder"
            ]
        );
        Ok(())
    }

    #[test]
    fn counts_only_records_since_the_start() {
        let tp = |t: &str, p: i32| (t.to_owned(), p);
        let before = BTreeMap::from([(tp("a", 0), 10), (tp("a", 1), 5)]);
        let now = BTreeMap::from([(tp("a", 0), 15), (tp("a", 1), 5), (tp("b", 0), 7)]);
        assert_eq!(records_since(&before, &now), 12);
        assert_eq!(records_since(&BTreeMap::new(), &BTreeMap::new()), 0);
        // A topic recreated with fewer records never counts negative.
        let now = BTreeMap::from([(tp("a", 0), 3)]);
        assert_eq!(records_since(&before, &now), 0);
    }

    #[test]
    fn row_names_say_which_producer() {
        assert_eq!(
            Producer::ALL.map(Producer::row_name),
            [
                "Debezium on Connect (producer defaults)",
                "Debezium on Connect (idempotent)"
            ]
        );
    }
}
