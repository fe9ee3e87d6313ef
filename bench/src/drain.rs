//! Draining a slot's backlog: with pg_recvlogical (the reference) and with Siphon.

use super::procstat::{self, Usage};
use super::promhist;
use super::services::Services;
use super::values::{self, RegistryCalls, Values};
use super::workload;
use anyhow::{bail, Context as _, Result};
use siphon_tests::{free_port, siphon_bin, SiphonProcess};
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one drain measured.
#[derive(Debug, Clone)]
pub struct Drain {
    pub secs: f64,
    /// Siphon only: peak RSS and CPU when the slot reached the end.
    pub usage: Option<Usage>,
    /// Siphon only: `siphon_records_produced_total` (handed to the sink) at the end.
    pub records_produced: Option<f64>,
    /// CPU seconds of the walsender(s) serving the slot (when the server runs on this host).
    pub walsender_cpu: Option<f64>,
    /// CPU of the broker during the drain (when its process on this host is known).
    pub broker_cpu: Option<BrokerCpu>,
    /// What ended the timing.
    pub end: DrainEnd,
    /// Seconds from the start to the first record on the broker, when the drain knows it (the
    /// Connect rows: the worker's start-up).
    pub first_record_secs: Option<f64>,
    /// Siphon with a schema registry only: its requests to the registry.
    pub registry: Option<RegistryCalls>,
}

/// CPU seconds the broker's process used during a drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BrokerCpu {
    /// All its threads.
    pub total: f64,
    /// Its JIT compiler threads (part of `total`): a JVM that still compiles the paths a drain
    /// takes is not yet in the steady state of a long-running broker.
    pub jit: f64,
}

/// What a drain's time runs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// The client exited at the end position (pg_recvlogical `--endpos`).
    ProcessExit,
    /// The slot's `confirmed_flush_lsn` reached the end position.
    SlotConfirmed,
    /// The client reported the backlog's last record; its confirmation lagged (Debezium).
    LastRecord,
}

/// Follows the CPU time of the walsender serving a slot (its `active_pid`, sampled every
/// 100 ms) and of the broker process, for the duration of a drain.
pub struct CpuWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Option<f64>>,
    broker: Option<(u32, BrokerCpu)>,
}

impl CpuWatch {
    pub async fn start(svc: &Services, slot: &str) -> Result<CpuWatch> {
        let db = svc.connect().await?;
        let stop = Arc::new(AtomicBool::new(false));
        let (slot, flag) = (slot.to_owned(), stop.clone());
        let task = tokio::spawn(async move {
            let mut per_pid: HashMap<u32, f64> = HashMap::new();
            while !flag.load(Ordering::Relaxed) {
                let pid = db
                    .query_opt(
                        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await
                    .ok()
                    .flatten()
                    .and_then(|r| r.get::<_, Option<i32>>(0))
                    .and_then(|p| u32::try_from(p).ok());
                if let Some((pid, cpu)) = pid.and_then(|p| Some((p, procstat::cpu_secs(p)?))) {
                    per_pid.insert(pid, cpu);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (!per_pid.is_empty()).then(|| per_pid.values().sum())
        });
        let broker = svc.broker_pid.and_then(|pid| Some((pid, broker_cpu(pid)?)));
        Ok(CpuWatch { stop, task, broker })
    }

    /// (walsender CPU seconds, broker CPU during the watch).
    pub async fn finish(self) -> (Option<f64>, Option<BrokerCpu>) {
        self.stop.store(true, Ordering::Relaxed);
        let walsender = self.task.await.ok().flatten();
        let broker = self.broker.and_then(|(pid, before)| {
            let now = broker_cpu(pid)?;
            Some(BrokerCpu {
                total: now.total - before.total,
                jit: now.jit - before.jit,
            })
        });
        (walsender, broker)
    }
}

/// The broker process's CPU seconds so far.
fn broker_cpu(pid: u32) -> Option<BrokerCpu> {
    Some(BrokerCpu {
        total: procstat::cpu_secs(pid)?,
        jit: procstat::jit_cpu_secs(pid)?,
    })
}

/// Streams slot `slot` with pg_recvlogical (publication `publication`) into /dev/null until
/// `end_lsn` (`X/Y`).
pub async fn recvlogical(
    svc: &Services,
    slot: &str,
    publication: &str,
    end_lsn: &str,
    timeout: Duration,
) -> Result<Drain> {
    let watch = CpuWatch::start(svc, slot).await?;
    let start = Instant::now();
    let child = tokio::process::Command::new(&svc.recvlogical)
        .args(["-d", &svc.pg_url, "--slot", slot, "--start", "--no-loop"])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={publication}"))
        .args(["-f", "/dev/null", "--endpos", end_lsn])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", svc.recvlogical.display()))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("pg_recvlogical did not reach {end_lsn} within {timeout:?}"))?
        .context("waiting for pg_recvlogical")?;
    let secs = start.elapsed().as_secs_f64();
    let (walsender_cpu, broker_cpu) = watch.finish().await;
    if !out.status.success() {
        bail!(
            "pg_recvlogical failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(Drain {
        secs,
        usage: None,
        records_produced: None,
        walsender_cpu,
        broker_cpu,
        end: DrainEnd::ProcessExit,
        first_record_secs: None,
        registry: None,
    })
}

/// `kafka.transaction_interval_ms` of the exactly-once runs: Siphon's default, stated so that
/// the report can name the wait it adds for read_committed consumers.
pub const EOS_TRANSACTION_INTERVAL_MS: u64 = 100;

/// Where a Siphon of the bench sends its records, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// To the broker, at-least-once (Siphon's default delivery).
    Kafka,
    /// To the broker, exactly-once (`kafka.delivery = "exactly-once"`: Kafka transactions with
    /// Siphon's default bounds; the slot is confirmed once the transaction covering a record
    /// commits).
    KafkaExactlyOnce,
    /// Siphon's discard sink: every record acknowledged at once, nothing sent.
    Discard,
}

impl Sink {
    /// Its lines of the `[kafka]` section.
    fn config_lines(self) -> String {
        match self {
            Sink::Kafka => "sink = \"kafka\"\n".to_owned(),
            Sink::KafkaExactlyOnce => format!(
                "sink = \"kafka\"\ndelivery = \"exactly-once\"\ntransaction_interval_ms = {EOS_TRANSACTION_INTERVAL_MS}\n"
            ),
            Sink::Discard => "sink = \"discard\"\n".to_owned(),
        }
    }
}

/// What a Siphon of the bench writes, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    pub sink: Sink,
    pub values: Values,
}

impl From<Sink> for Setup {
    /// `sink` with Siphon's default values.
    fn from(sink: Sink) -> Setup {
        Setup {
            sink,
            values: Values::Json,
        }
    }
}

/// A Siphon configuration with its defaults except the slot, the publication, the table,
/// the sink (and its delivery mode), the values' encoding and the metrics address.
///
/// # Errors
/// When the values need the schema registry and the bench has none.
pub fn siphon_config(
    svc: &Services,
    slot: &str,
    publication: &str,
    setup: Setup,
    metrics: &str,
) -> Result<String> {
    let registry_url = svc.registry.as_ref().ok().map(|r| r.url());
    let values = setup.values.config_lines(registry_url.as_deref())?;
    Ok(format!(
        r#"[source]
url = "{url}"
slot = "{slot}"
publication = "{publication}"
tables = ["{table}"]

[kafka]
bootstrap_servers = "{bootstrap}"
{sink}
[metrics]
listen = "{metrics}"

{values}"#,
        url = svc.pg_url,
        table = workload::TABLE,
        bootstrap = svc.bootstrap,
        sink = setup.sink.config_lines(),
    ))
}

/// A running Siphon with its metrics address.
pub struct Running {
    pub process: SiphonProcess,
    pub metrics: String,
}

/// Starts the Siphon binary (`$SIPHON_BIN`, see the harness) on `slot` and `publication`.
pub fn start_siphon(
    svc: &Services,
    slot: &str,
    publication: &str,
    setup: impl Into<Setup>,
) -> Result<Running> {
    let metrics = format!("127.0.0.1:{}", free_port());
    let config = siphon_config(svc, slot, publication, setup.into(), &metrics)?;
    // Siphon runs in its own directory: the binary's path must not be relative.
    let bin = siphon_bin()?;
    let bin =
        std::fs::canonicalize(&bin).with_context(|| format!("resolving {}", bin.display()))?;
    let process = SiphonProcess::start_with(&bin, &config, &[])?;
    Ok(Running { process, metrics })
}

impl Running {
    /// PID of the live process, or an error with the log's tail if it exited.
    pub fn pid(&self) -> Result<u32> {
        match self.process.pid() {
            Some(pid) => Ok(pid),
            None => bail!(
                "siphon exited early; log {}:\n{}",
                self.process.log_path().display(),
                tail(&self.process.log(), 30)
            ),
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(self) -> Result<()> {
        self.process.terminate()?;
        let status =
            tokio::task::block_in_place(|| self.process.wait_exit(Duration::from_secs(60)))?;
        if !status.success() {
            bail!("siphon exited with {status} after SIGTERM");
        }
        Ok(())
    }
}

/// Waits until `slot`'s confirmed position reaches `end_lsn`, polling every 20 ms; fails if
/// Siphon exits or `timeout` passes.
pub async fn wait_confirmed(
    db: &tokio_postgres::Client,
    siphon: &Running,
    slot: &str,
    end_lsn: u64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if workload::confirmed_lsn(db, slot).await? >= end_lsn {
            return Ok(());
        }
        siphon.pid()?;
        if Instant::now() >= deadline {
            bail!("slot {slot} did not reach the end of the backlog within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drains `slot` with Siphon on `publication` into `setup`'s sink, writing its values, until
/// its `confirmed_flush_lsn` reaches `end_lsn`, samples its usage, then stops it with SIGTERM.
/// With exactly-once the slot is confirmed only past records whose Kafka transaction
/// committed: the time runs to the commit of the backlog's last records. With a schema
/// registry, its calls are counted in all and after warm-up ([`values::RegistryCalls`]).
pub async fn siphon(
    svc: &Services,
    db: &tokio_postgres::Client,
    slot: &str,
    publication: &str,
    setup: impl Into<Setup>,
    end_lsn: u64,
    timeout: Duration,
) -> Result<Drain> {
    let setup = setup.into();
    let watch = CpuWatch::start(svc, slot).await?;
    let start = Instant::now();
    let running = start_siphon(svc, slot, publication, setup)?;
    let warm = if setup.values.uses_registry() {
        warm_scrape(db, &running, slot, end_lsn, start + timeout).await?
    } else {
        None
    };
    wait_confirmed(db, &running, slot, end_lsn, timeout).await?;
    let secs = start.elapsed().as_secs_f64();
    let (walsender_cpu, broker_cpu) = watch.finish().await;
    let usage = procstat::sample(running.pid()?)?;
    if setup.values.uses_registry() {
        // Siphon counts its registry requests on its status tick: wait for one past the end.
        tokio::time::sleep(values::STATUS_TICK).await;
    }
    let end = match promhist::scrape(&running.metrics).await {
        Ok(text) => Some(values::Counters::scraped(&text)),
        Err(e) => {
            eprintln!("bench: could not scrape {}: {e:#}", running.metrics);
            None
        }
    };
    running.stop()?;
    let records_produced = end.map(|c| c.records);
    let registry = end
        .filter(|_| setup.values.uses_registry())
        .map(|end| RegistryCalls::new(warm, end));
    Ok(Drain {
        secs,
        usage: Some(usage),
        records_produced,
        walsender_cpu,
        broker_cpu,
        end: DrainEnd::SlotConfirmed,
        first_record_secs: None,
        registry,
    })
}

/// Scrapes Siphon's metrics every 20 ms until it has handed
/// [`values::REGISTRY_WARM_UP_RECORDS`] records to its sink: its counters then. `None` when the
/// slot reached `end_lsn` first.
async fn warm_scrape(
    db: &tokio_postgres::Client,
    siphon: &Running,
    slot: &str,
    end_lsn: u64,
    deadline: Instant,
) -> Result<Option<values::Counters>> {
    loop {
        // Until its endpoint listens, a scrape fails: it is tried again.
        if let Ok(text) = promhist::scrape(&siphon.metrics).await {
            let counters = values::Counters::scraped(&text);
            if counters.records >= values::REGISTRY_WARM_UP_RECORDS {
                return Ok(Some(counters));
            }
        }
        if workload::confirmed_lsn(db, slot).await? >= end_lsn {
            return Ok(None);
        }
        siphon.pid()?;
        if Instant::now() >= deadline {
            bail!("slot {slot} did not reach the end of the backlog in time");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
