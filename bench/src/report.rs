//! The result table, the targets and the JSON document.

use super::avro::{self, AvroRows};
use super::chart::{Bar, Chart, Group, Series};
use super::drain::{self, Drain, DrainEnd, Sink};
use super::latency::{Latency, Quantiles, PRODUCER_SERIES};
use super::probe::{self, ProbeStats};
use super::warm_up::WarmUpDrains;
use serde_json::{json, Value};

pub struct Backlog {
    pub events: u64,
    pub transactions: u64,
    pub wal_bytes: u64,
    pub write_secs: f64,
}

/// The broker the run wrote to.
pub struct BrokerInfo {
    /// What the tables call it (name and version).
    pub name: String,
    /// Its peak resident set size (`VmHWM`) at the end of the run, when its process is known.
    pub peak_rss_bytes: Option<u64>,
    /// Records written to it before the drains to warm its JIT up (the bench's own broker).
    pub warm_up_records: Option<u64>,
    /// Siphon's drains to it before the measured ones (the bench's own broker).
    pub warm_up_drains: Option<WarmUpDrains>,
}

/// How fast the machine ran a fixed piece of work before the first drain and after the last
/// phase (`host.rs`): absolute figures are comparable between runs only when these are.
#[derive(Debug, Clone)]
pub struct HostSpeed {
    /// The processor's model name.
    pub cpu: String,
    pub calibration_ms_before: f64,
    pub calibration_ms_after: f64,
}

pub struct Results {
    pub broker: BrokerInfo,
    pub host: HostSpeed,
    pub backlog: Backlog,
    pub recvlogical: Drain,
    pub kafka: Drain,
    /// Siphon to the broker with `kafka.delivery = "exactly-once"`, or why it was skipped or
    /// failed.
    pub exactly_once: Result<Drain, String>,
    pub discard: Drain,
    /// The Debezium row, or why it was skipped.
    pub debezium: Result<Drain, String>,
    /// The Debezium-on-Connect rows (name, drain or why it was skipped or failed).
    pub connect: Vec<(&'static str, Result<Drain, String>)>,
    /// The Avro rows and the expanded JSON row, or why they were skipped or failed.
    pub avro: Result<AvroRows, String>,
    /// The same backlog through the all-operations publication (`--no-all-operations` skips).
    pub all_operations: Option<ShapeRows>,
    /// pg_recvlogical at 1, 2 and 4 parallel slots (`--slots-scaling`).
    pub scaling: Option<super::slots::Scaling>,
    /// The drains under a CPU hog (`--contention`).
    pub contention: Option<Contention>,
    pub latency: Option<Latency>,
    /// The latency phase in exactly-once mode (`None` with `--latency-secs 0`), or why it was
    /// skipped or failed.
    pub latency_exactly_once: Option<Result<Latency, String>>,
    /// A measurement that failed without stopping the run (the exactly-once rows, the Debezium
    /// drain): the run reports it and exits non-zero.
    pub failure: Option<String>,
}

/// The drains of the backlog through another publication shape.
pub struct ShapeRows {
    pub recvlogical: Drain,
    pub kafka: Drain,
    /// The Debezium-on-Connect rows (name, drain or why it was skipped or failed).
    pub connect: Vec<(&'static str, Result<Drain, String>)>,
}

impl ShapeRows {
    fn rows(&self) -> Vec<(&'static str, &Drain)> {
        let mut rows = vec![
            ("pg_recvlogical", &self.recvlogical),
            ("siphon->kafka", &self.kafka),
        ];
        rows.extend(
            self.connect
                .iter()
                .filter_map(|(name, row)| row.as_ref().ok().map(|d| (*name, d))),
        );
        rows
    }
}

/// Lines for Connect rows that were skipped, failed or timed to their last record.
fn connect_notes(connect: &[(&'static str, Result<Drain, String>)]) -> String {
    let mut out = String::new();
    for (name, row) in connect {
        match row {
            Ok(d) if d.end == DrainEnd::LastRecord => {
                out += &format!(
                    "  * {name} timed to its last record on the broker: its offset flush had not confirmed the end {:.0} s later\n",
                    super::connect::LAST_RECORD_GRACE.as_secs_f64()
                );
            }
            Ok(_) => {}
            Err(why) => out += &format!("{name} {why}\n"),
        }
        if let Ok(Drain {
            first_record_secs: Some(first),
            ..
        }) = row
        {
            out += &format!(
                "  {name}: first record on the broker {first:.1} s after the JVM started (worker and connector start-up, in its seconds)\n"
            );
        }
    }
    out
}

/// The same backlog drained again while busy threads compete for the CPU.
pub struct Contention {
    /// Busy threads of the hog.
    pub threads: usize,
    /// Whether they ran in the bench process (`--hog-in-process`) rather than a program of
    /// their own.
    pub in_process: bool,
    pub recvlogical: Drain,
    pub kafka: Drain,
    pub discard: Drain,
    /// Through the all-operations publication under the same hog (unless
    /// `--no-all-operations`): pg_recvlogical and Siphon to the broker.
    pub all_operations: Option<ContendedShape>,
}

/// Drains of one publication shape under the hog.
pub struct ContendedShape {
    pub recvlogical: Drain,
    pub kafka: Drain,
}

impl ContendedShape {
    fn rows(&self) -> Vec<(&'static str, &Drain)> {
        vec![
            ("pg_recvlogical", &self.recvlogical),
            ("siphon->kafka", &self.kafka),
        ]
    }

    fn ratio(&self) -> f64 {
        ratio(self.recvlogical.secs, self.kafka.secs)
    }
}

/// A target on a drain's rate relative to pg_recvlogical's (`None`: not measured).
fn ratio_target(
    name: &'static str,
    goal: &'static str,
    at_least: f64,
    value: Option<f64>,
) -> Target {
    Target {
        name,
        goal,
        value,
        shown: value.map_or("not measured".into(), |v| format!("{:.0}%", v * 100.0)),
        pass: value.map(|v| v >= at_least),
    }
}

/// What the exactly-once drain's row is called.
pub const EXACTLY_ONCE_ROW: &str = "siphon->kafka (exactly-once)";

/// The exactly-once drain's rate relative to the at-least-once drain's: the target is 0.8.
pub const EXACTLY_ONCE_MIN_SHARE: f64 = 0.8;

/// `reference_secs / secs`: above 1 is faster than the reference.
pub fn ratio(reference_secs: f64, secs: f64) -> f64 {
    reference_secs / secs
}

/// How much of Siphon's commit->ack latency the broker's own produce latency is, per quantile
/// (p50, p99), as fractions.
pub fn broker_share(broker: &Quantiles, siphon: &Quantiles) -> (f64, f64) {
    (broker.p50 / siphon.p50, broker.p99 / siphon.p99)
}

/// Compares each row's record count with the backlog's events; the text of the check and
/// whether every count matched.
pub fn records_check(events: u64, counts: &[(&str, Option<f64>)]) -> (String, bool) {
    let known: Vec<(&str, f64)> = counts
        .iter()
        .filter_map(|(name, c)| c.map(|c| (*name, c)))
        .collect();
    let ok = known.iter().all(|(_, c)| *c == events as f64);
    let list: Vec<String> = known
        .iter()
        .map(|(name, c)| format!("{name} {c:.0}"))
        .collect();
    let verdict = if ok {
        "equal to the backlog"
    } else {
        "MISMATCH with the backlog"
    };
    (
        format!(
            "records handed to the sink: {} ({verdict}: {events} events)",
            list.join(", ")
        ),
        ok,
    )
}

const MIB: f64 = 1024.0 * 1024.0;

struct Target {
    name: &'static str,
    goal: &'static str,
    value: Option<f64>,
    shown: String,
    pass: Option<bool>,
}

impl Results {
    /// The quiet rows: name and drain (Debezium's when it ran).
    fn rows(&self) -> Vec<(&'static str, &Drain)> {
        let mut rows = vec![
            ("pg_recvlogical", &self.recvlogical),
            ("siphon->kafka", &self.kafka),
        ];
        if let Ok(d) = &self.exactly_once {
            rows.push((EXACTLY_ONCE_ROW, d));
        }
        rows.push(("siphon->discard", &self.discard));
        if let Ok(a) = &self.avro {
            rows.extend(a.rows());
        }
        if let Ok(d) = &self.debezium {
            rows.push(("debezium", d));
        }
        for (name, row) in &self.connect {
            if let Ok(d) = row {
                rows.push((*name, d));
            }
        }
        rows
    }

    /// The record count of every row that reports one.
    fn counts(&self) -> Vec<(String, Option<f64>)> {
        let mut counts: Vec<_> = self
            .rows()
            .into_iter()
            .filter(|(name, _)| *name != "pg_recvlogical")
            .map(|(name, d)| (name.to_owned(), d.records_produced))
            .collect();
        if let Some(all) = &self.all_operations {
            counts.extend(
                all.rows()
                    .into_iter()
                    .filter(|(name, _)| *name != "pg_recvlogical")
                    .map(|(name, d)| (format!("{name} (all operations)"), d.records_produced)),
            );
        }
        if let Some(c) = &self.contention {
            counts.push(("siphon->kafka (hog)".into(), c.kafka.records_produced));
            counts.push(("siphon->discard (hog)".into(), c.discard.records_produced));
            if let Some(all) = &c.all_operations {
                counts.push((
                    "siphon->kafka (hog, all operations)".into(),
                    all.kafka.records_produced,
                ));
            }
        }
        counts
    }

    /// [`records_check`] over [`Results::counts`].
    fn check_counts(&self) -> (String, bool) {
        let counts = self.counts();
        let named: Vec<(&str, Option<f64>)> =
            counts.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        records_check(self.backlog.events, &named)
    }

    /// Whether every reported record count equals the backlog's events.
    pub fn records_match(&self) -> bool {
        self.check_counts().1
    }

    /// The rows under contention, whose reference is the contended pg_recvlogical.
    fn contended_rows(c: &Contention) -> Vec<(&'static str, &Drain)> {
        vec![
            ("pg_recvlogical", &c.recvlogical),
            ("siphon->kafka", &c.kafka),
            ("siphon->discard", &c.discard),
        ]
    }

    fn rate(&self, d: &Drain) -> f64 {
        self.backlog.events as f64 / d.secs
    }

    fn ratio(&self, d: &Drain) -> f64 {
        ratio(self.recvlogical.secs, d.secs)
    }

    /// The exactly-once drain's rate over the at-least-once drain's, when it ran.
    fn exactly_once_share(&self) -> Option<f64> {
        self.exactly_once
            .as_ref()
            .ok()
            .map(|eos| self.kafka.secs / eos.secs)
    }

    fn latency_exactly_once(&self) -> Option<&Latency> {
        self.latency_exactly_once.as_ref()?.as_ref().ok()
    }

    fn peak_rss_mb(&self) -> Option<f64> {
        let mut all = vec![self.kafka.usage, self.discard.usage];
        all.push(self.exactly_once.as_ref().ok().and_then(|d| d.usage));
        if let Ok(a) = &self.avro {
            all.extend(a.rows().map(|(_, d)| d.usage));
        }
        if let Some(c) = &self.contention {
            all.extend([c.kafka.usage, c.discard.usage]);
            all.push(c.all_operations.as_ref().and_then(|a| a.kafka.usage));
        }
        all.push(self.latency.as_ref().map(|l| l.usage));
        all.push(self.latency_exactly_once().map(|l| l.usage));
        all.into_iter()
            .flatten()
            .map(|u| u.peak_rss_bytes as f64 / MIB)
            .reduce(f64::max)
    }

    fn targets(&self) -> Vec<Target> {
        let kafka = self.ratio(&self.kafka);
        let discard = self.ratio(&self.discard);
        let p99 = self
            .latency
            .as_ref()
            .and_then(|l| l.histogram)
            .map(|q| q.p99 * 1000.0);
        let e2e_p99 = self
            .latency
            .as_ref()
            .and_then(|l| l.end_to_end)
            .map(|q| q.p99 * 1000.0);
        // utime + stime of Siphon's process per backlog event, in microseconds.
        let per_event_us = |d: &Drain| {
            d.usage
                .map(|u| u.cpu_secs * 1e6 / self.backlog.events.max(1) as f64)
        };
        let kafka_cpu = per_event_us(&self.kafka);
        let discard_cpu = per_event_us(&self.discard);
        let rss = self.peak_rss_mb();
        let connect = self
            .connect
            .iter()
            .find(|(name, _)| name.contains("idempotent"))
            .and_then(|(_, row)| row.as_ref().ok());
        let connect_speedup = connect.map(|c| c.secs / self.kafka.secs);
        let eos_share = self.exactly_once_share();
        let eos_p99 = self
            .latency_exactly_once()
            .and_then(|l| Some((l.histogram?.p99 * 1000.0, l.rate)));
        let connect_cpu_share = connect
            .and_then(per_event_us)
            .zip(kafka_cpu)
            .map(|(theirs, ours)| ours / theirs);
        let avro = self.avro.as_ref().ok();
        let avro_cpu = avro.and_then(|a| per_event_us(&a.avro_expanded));
        let registry_calls = avro.and_then(AvroRows::calls_per_1000_after_warm_up);
        vec![
            Target {
                name: "drain to broker",
                goal: ">= 100% of pg_recvlogical",
                value: Some(kafka),
                shown: format!("{:.0}%", kafka * 100.0),
                pass: Some(kafka >= 1.0),
            },
            ratio_target(
                "drain to broker, all operations",
                ">= 100% of pg_recvlogical",
                1.0,
                self.all_operations
                    .as_ref()
                    .map(|all| ratio(all.recvlogical.secs, all.kafka.secs)),
            ),
            Target {
                name: "drain with discard",
                goal: ">= 90% of pg_recvlogical",
                value: Some(discard),
                shown: format!("{:.0}%", discard * 100.0),
                pass: Some(discard >= 0.90),
            },
            Target {
                name: "exactly-once drain",
                goal: ">= 80% of siphon->kafka",
                value: eos_share,
                shown: eos_share.map_or("not measured".into(), |v| format!("{:.0}%", v * 100.0)),
                pass: eos_share.map(|v| v >= EXACTLY_ONCE_MIN_SHARE),
            },
            self.contention.as_ref().map_or(
                Target {
                    name: "drain to broker, contended",
                    goal: ">= 80% of pg_recvlogical",
                    value: None,
                    shown: "not measured".into(),
                    pass: None,
                },
                |c| {
                    let r = ratio(c.recvlogical.secs, c.kafka.secs);
                    Target {
                        name: "drain to broker, contended",
                        goal: ">= 80% of pg_recvlogical",
                        value: Some(r),
                        shown: format!("{:.0}%", r * 100.0),
                        pass: Some(r >= 0.80),
                    }
                },
            ),
            ratio_target(
                "drain to broker, contended, all operations",
                ">= 80% of pg_recvlogical",
                0.8,
                self.contention
                    .as_ref()
                    .and_then(|c| c.all_operations.as_ref())
                    .map(ContendedShape::ratio),
            ),
            Target {
                name: "CPU per event, to broker",
                goal: "<= 2 us",
                value: kafka_cpu,
                shown: kafka_cpu.map_or("not measured".into(), |v| format!("{v:.2} us")),
                pass: kafka_cpu.map(|v| v <= 2.0),
            },
            Target {
                name: "CPU per event, discard",
                goal: "<= 3 us",
                value: discard_cpu,
                shown: discard_cpu.map_or("not measured".into(), |v| format!("{v:.2} us")),
                pass: discard_cpu.map(|v| v <= 3.0),
            },
            ratio_target(
                "avro drain, expanded",
                ">= 90% of json, expanded",
                avro::MIN_SHARE,
                avro.map(AvroRows::expanded_share),
            ),
            Target {
                name: "CPU per event, avro expanded",
                goal: "stated",
                value: avro_cpu,
                shown: avro_cpu.map_or("not measured".into(), |v| format!("{v:.2} us")),
                pass: None,
            },
            Target {
                name: "registry calls per 1k events",
                goal: "~0 after warm-up",
                value: registry_calls,
                shown: registry_calls.map_or("not measured".into(), |v| format!("{v:.3}")),
                pass: registry_calls.map(|v| v <= avro::MAX_CALLS_PER_1000),
            },
            Target {
                name: "commit->ack p99 (histogram)",
                goal: "<= 10 ms",
                value: p99,
                shown: p99.map_or("not measured".into(), |v| format!("{v:.1} ms")),
                pass: p99.map(|v| v <= 10.0),
            },
            Target {
                name: "commit->consumer p99 (end to end)",
                goal: "<= 15 ms",
                value: e2e_p99,
                shown: e2e_p99.map_or("not measured".into(), |v| format!("{v:.1} ms")),
                pass: e2e_p99.map(|v| v <= 15.0),
            },
            Target {
                name: "exactly-once commit->ack p99",
                goal: "stated (histogram)",
                value: eos_p99.map(|(v, _)| v),
                shown: eos_p99.map_or("not measured".into(), |(v, rate)| {
                    format!("{v:.1} ms at {rate}/s")
                }),
                pass: None,
            },
            Target {
                name: "drain vs Debezium on Connect (idempotent)",
                goal: ">= 5x",
                value: connect_speedup,
                shown: connect_speedup.map_or("not measured".into(), |v| format!("{v:.1}x")),
                pass: connect_speedup.map(|v| v >= 5.0),
            },
            Target {
                name: "CPU vs Debezium on Connect (idempotent)",
                goal: "<= 1/10",
                value: connect_cpu_share,
                shown: connect_cpu_share
                    .map_or("not measured".into(), |v| format!("1/{:.1}", 1.0 / v)),
                pass: connect_cpu_share.map(|v| v <= 0.1),
            },
            Target {
                name: "peak RSS (any siphon run)",
                goal: "<= 64 MB",
                value: rss,
                shown: rss.map_or("not measured".into(), |v| format!("{v:.1} MB")),
                pass: rss.map(|v| v <= 64.0),
            },
        ]
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let b = &self.backlog;
        let mut out = format!("broker: {}", self.broker.name);
        if let Some(n) = self.broker.warm_up_records {
            out += &format!(", warmed up with {n} records");
        }
        if let Some(d) = &self.broker.warm_up_drains {
            out += &format!(
                " and {} Siphon drains of {} events in {:.0} s (JIT {} of the broker's CPU per drain{})",
                d.rounds.len(),
                d.events,
                d.secs,
                percentages(&d.jit_shares()),
                if d.steady() { "" } else { ": not yet steady" }
            );
            if let Some(shares) = d.exactly_once_jit_shares() {
                out += &format!(
                    " alternating with {} exactly-once drains (JIT {})",
                    shares.len(),
                    percentages(&shares)
                );
            }
        }
        if let Some(rss) = self.broker.peak_rss_bytes {
            out += &format!(", peak RSS {:.0} MB", rss as f64 / MIB);
        }
        out += &format!(
            "\nhost: {}; a fixed loop took {:.0} ms before the drains and {:.0} ms after the last phase; the walsender took {:.2} s of CPU per million events feeding pg_recvlogical",
            self.host.cpu,
            self.host.calibration_ms_before,
            self.host.calibration_ms_after,
            self.recvlogical
                .walsender_cpu
                .map_or(f64::NAN, |s| s * 1e6 / b.events.max(1) as f64),
        );
        out += &format!(
            "\nbacklog: {} events in {} transactions, {:.0} MB of WAL (written in {:.1} s)\n\n",
            b.events,
            b.transactions,
            b.wal_bytes as f64 / MIB,
            b.write_secs
        );
        out += &self.drain_table(&self.rows(), self.recvlogical.secs);
        match (&self.exactly_once, self.exactly_once_share()) {
            (Err(why), _) => out += &format!("{EXACTLY_ONCE_ROW} {why}\n"),
            (Ok(_), Some(share)) => {
                out += &format!(
                    "  {EXACTLY_ONCE_ROW} / siphon->kafka: {share:.2}x (target >= {EXACTLY_ONCE_MIN_SHARE}x; timed to the slot's confirmation, which follows the Kafka transaction's commit)\n"
                );
            }
            (Ok(_), None) => {}
        }
        match &self.avro {
            Ok(a) => out += &a.lines(&self.kafka, b.events),
            Err(why) => {
                out += &format!(
                    "{} {why}
",
                    avro::AVRO_ROW
                )
            }
        }
        match &self.debezium {
            Ok(d) if d.end == DrainEnd::LastRecord => {
                out += &format!(
                    "  * debezium timed to its last record: its offset flush had not confirmed the end {:.0} s later\n",
                    super::debezium::LAST_RECORD_GRACE.as_secs_f64()
                );
            }
            Ok(_) => {}
            Err(why) => out += &format!("{:<17} {why}\n", "debezium"),
        }
        out += &connect_notes(&self.connect);
        if let Some(all) = &self.all_operations {
            out += &format!(
                "\n{} (ratio to pg_recvlogical on it):\n",
                super::workload::Shape::AllOperations.title()
            );
            out += &self.drain_table(&all.rows(), all.recvlogical.secs);
            out += &connect_notes(&all.connect);
        }
        out += &self.check_counts().0;
        out += "\n";
        if let Some(c) = &self.contention {
            out += &format!(
                "\nunder contention ({} busy threads {}; ratio to pg_recvlogical under the same hog):\n",
                c.threads,
                if c.in_process {
                    "in the bench process"
                } else {
                    "in a program of their own"
                }
            );
            out += &self.drain_table(&Self::contended_rows(c), c.recvlogical.secs);
            out += &format!(
                "  siphon->kafka / pg_recvlogical under the hog: {:.2}x (target >= 0.8x)\n",
                ratio(c.recvlogical.secs, c.kafka.secs)
            );
            if let Some(all) = &c.all_operations {
                out += "\nunder contention, all-operations publication:\n";
                out += &self.drain_table(&all.rows(), all.recvlogical.secs);
                out += &format!(
                    "  siphon->kafka / pg_recvlogical under the hog (all operations): {:.2}x (target >= 0.8x)\n",
                    all.ratio()
                );
            }
        }
        if let Some(s) = &self.scaling {
            out += "\nscaling past one slot: pg_recvlogical on 1, 2 and 4 slots in parallel, one outbox table and publication per slot:\n";
            out += &s.table();
        }
        out += "\n";
        match &self.latency {
            None => out += "latency: not measured (--latency-secs 0)\n",
            Some(l) => out += &latency_lines(l),
        }
        if let Some(eos) = &self.latency_exactly_once {
            out += "\n";
            match eos {
                Ok(l) => out += &latency_lines(l),
                Err(why) => out += &format!("latency, exactly-once: {why}\n"),
            }
        }
        out += "\ntargets (informational):\n";
        for t in self.targets() {
            let verdict = match t.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None => "-",
            };
            out += &format!(
                "  {:<28} {:<26} {:>14}  {verdict}\n",
                t.name, t.goal, t.shown
            );
        }
        out
    }

    /// The header and one line per drain; ratios against `reference_secs`.
    fn drain_table(&self, rows: &[(&str, &Drain)], reference_secs: f64) -> String {
        let b = &self.backlog;
        let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(17);
        let mut out = format!(
            "{:<w$} {:>9} {:>11} {:>7} {:>13} {:>16} | {:>18} {:>22}\n",
            "",
            "seconds",
            "events/s",
            "ratio",
            "peak RSS MB",
            "CPU s per 1M ev",
            "walsender CPU s/1M",
            "broker CPU s/1M (JIT)"
        );
        for (name, d) in rows {
            let (rss, cpu) = match d.usage {
                Some(u) => (
                    format!("{:.1}", u.peak_rss_bytes as f64 / MIB),
                    format!("{:.2}", u.cpu_secs * 1e6 / b.events as f64),
                ),
                None => ("-".into(), "-".into()),
            };
            let per_m = |v: Option<f64>| {
                v.map_or("-".to_owned(), |c| {
                    format!("{:.2}", c * 1e6 / b.events as f64)
                })
            };
            let mark = if d.end == DrainEnd::LastRecord {
                "*"
            } else {
                ""
            };
            let broker = d.broker_cpu.map_or("-".to_owned(), |c| {
                format!("{} ({})", per_m(Some(c.total)), per_m(Some(c.jit)))
            });
            out += &format!(
                "{:<w$} {:>9} {:>11.0} {:>7.2} {:>13} {:>16} | {:>18} {:>22}\n",
                name,
                format!("{:.2}{mark}", d.secs),
                self.rate(d),
                ratio(reference_secs, d.secs),
                rss,
                cpu,
                per_m(d.walsender_cpu),
                broker
            );
        }
        out
    }

    /// [`Results::drain_json`] of each row, against a reference drain of `reference_secs`.
    fn drains_json(&self, rows: &[(&str, &Drain)], reference_secs: f64) -> Vec<Value> {
        rows.iter()
            .map(|(name, d)| self.drain_json(name, d, reference_secs))
            .collect()
    }

    fn drain_json(&self, name: &str, d: &Drain, reference_secs: f64) -> Value {
        let b = &self.backlog;
        json!({
            "name": name,
            "seconds": d.secs,
            "timed_to": match d.end {
                DrainEnd::ProcessExit => "process_exit",
                DrainEnd::SlotConfirmed => "slot_confirmed",
                DrainEnd::LastRecord => "last_record",
            },
            "events_per_sec": self.rate(d),
            "ratio_to_pg_recvlogical": ratio(reference_secs, d.secs),
            "peak_rss_mb": d.usage.map(|u| u.peak_rss_bytes as f64 / MIB),
            "cpu_secs_per_million_events": d.usage.map(|u| u.cpu_secs * 1e6 / b.events as f64),
            "system_cpu_share": d.usage.map(|u| u.sys_secs / u.cpu_secs.max(f64::MIN_POSITIVE)),
            "voluntary_context_switches_per_event": d.usage.map(|u| u.voluntary_switches as f64 / b.events as f64),
            "minor_page_faults_per_event": d.usage.map(|u| u.minor_faults as f64 / b.events as f64),
            "records_produced": d.records_produced,
            "first_record_seconds": d.first_record_secs,
            "walsender_cpu_secs": d.walsender_cpu,
            "broker_cpu_secs": d.broker_cpu.map(|c| c.total),
            "broker_jit_cpu_secs": d.broker_cpu.map(|c| c.jit),
            "schema_registry_requests": d.registry.map(|r| r.requests),
            "schema_id_lookups_per_1000_events_after_warm_up": d.registry.and_then(|r| r.per_1000_after_warm_up()),
        })
    }

    /// The picture: drain rates relative to pg_recvlogical per publication shape, and the
    /// latency phase's quantiles.
    pub fn chart(&self) -> Chart {
        let label = |name: &str| match name {
            "debezium" => "debezium (embedded engine, discarding)".to_owned(),
            other => other.to_owned(),
        };
        let group = |title: &str, rows: &[(&str, &Drain)], reference_secs: f64| Group {
            title: title.to_owned(),
            bars: rows
                .iter()
                .map(|(name, d)| Bar {
                    label: label(name),
                    ratio: ratio(reference_secs, d.secs),
                    events_per_sec: self.rate(d),
                })
                .collect(),
        };
        let mut groups = vec![group(
            super::workload::Shape::InsertOnly.title(),
            &self.rows(),
            self.recvlogical.secs,
        )];
        if let Some(all) = &self.all_operations {
            groups.push(group(
                super::workload::Shape::AllOperations.title(),
                &all.rows(),
                all.recvlogical.secs,
            ));
        }
        let mut latency = Vec::new();
        if let Some(l) = &self.latency {
            let points = |q: &Quantiles| {
                vec![
                    ("p50", q.p50 * 1e3),
                    ("p90", q.p90 * 1e3),
                    ("p99", q.p99 * 1e3),
                    ("p99.9", q.p999 * 1e3),
                ]
            };
            if let Some(q) = &l.end_to_end {
                latency.push(Series {
                    label: "COMMIT returned -> consumer received, end to end (exact)".into(),
                    points: points(q),
                });
            }
            if let Some(q) = &l.histogram {
                latency.push(Series {
                    label: "commit -> ack, Siphon's histogram (estimates within buckets)".into(),
                    points: points(q),
                });
            }
            if let Ok(ProbeStats {
                latency: Some(q), ..
            }) = &l.probe
            {
                latency.push(Series {
                    label: "broker produce -> ack, probe producer".into(),
                    points: points(q),
                });
            }
        }
        Chart {
            // The broker's name without its parenthesised details (JVM options): one line.
            title: format!(
                "Siphon benchmark: {} events; broker {}",
                self.backlog.events,
                self.broker.name.split(" (").next().unwrap_or_default()
            ),
            groups,
            latency,
        }
    }

    /// The same as JSON.
    pub fn json(&self) -> Value {
        let b = &self.backlog;
        let rows = self.drains_json(&self.rows(), self.recvlogical.secs);
        let contention = self.contention.as_ref().map(|c| {
            let rows = self.drains_json(&Self::contended_rows(c), c.recvlogical.secs);
            let all_operations = c.all_operations.as_ref().map(|all| {
                json!({
                    "drains": self.drains_json(&all.rows(), all.recvlogical.secs),
                    "kafka_ratio_to_pg_recvlogical": all.ratio(),
                })
            });
            json!({
                "hog_threads": c.threads,
                "hog_in_process": c.in_process,
                "drains": rows,
                "kafka_ratio_to_pg_recvlogical": ratio(c.recvlogical.secs, c.kafka.secs),
                "all_operations": all_operations,
            })
        });
        let all_operations = self.all_operations.as_ref().map(|all| {
            let rows = self.drains_json(&all.rows(), all.recvlogical.secs);
            json!({
                "publication": super::workload::PUBLICATION_ALL,
                "publish": "insert, update, delete",
                "drains": rows,
                "connect_skipped": skipped_json(&all.connect),
            })
        });
        let records_match = self.records_match();
        let latency = self.latency.as_ref().map(latency_json);
        let latency_exactly_once = self.latency_exactly_once.as_ref().map(|l| match l {
            Ok(l) => latency_json(l),
            Err(why) => json!({"skipped": why}),
        });
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|t| json!({"name": t.name, "goal": t.goal, "value": t.value, "pass": t.pass}))
            .collect();
        json!({
            "broker": {
                "name": self.broker.name,
                "peak_rss_mb": self.broker.peak_rss_bytes.map(|b| b as f64 / MIB),
                "warm_up_records": self.broker.warm_up_records,
                "warm_up_drains": self.broker.warm_up_drains.as_ref().map(|d| json!({
                    "events_each": d.events,
                    "seconds": d.secs,
                    "broker_cpu_secs": d.rounds.iter().map(|r| r.map(|c| c.total)).collect::<Vec<_>>(),
                    "broker_jit_cpu_secs": d.rounds.iter().map(|r| r.map(|c| c.jit)).collect::<Vec<_>>(),
                    "exactly_once_broker_cpu_secs": d.exactly_once_rounds.as_ref().map(|rs| rs.iter().map(|r| r.map(|c| c.total)).collect::<Vec<_>>()),
                    "exactly_once_broker_jit_cpu_secs": d.exactly_once_rounds.as_ref().map(|rs| rs.iter().map(|r| r.map(|c| c.jit)).collect::<Vec<_>>()),
                    "steady": d.steady(),
                })),
            },
            "host": {
                "cpu": self.host.cpu,
                "calibration_ms_before": self.host.calibration_ms_before,
                "calibration_ms_after": self.host.calibration_ms_after,
                "walsender_cpu_secs_per_million_events_for_pg_recvlogical": self
                    .recvlogical
                    .walsender_cpu
                    .map(|s| s * 1e6 / b.events.max(1) as f64),
            },
            "backlog": {
                "events": b.events,
                "transactions": b.transactions,
                "wal_bytes": b.wal_bytes,
                "write_seconds": b.write_secs,
            },
            "drains": rows,
            "exactly_once_skipped": self.exactly_once.as_ref().err(),
            "exactly_once_share_of_kafka": self.exactly_once_share(),
            "avro": match &self.avro {
                Ok(a) => a.json(&self.kafka, b.events),
                Err(why) => json!({"skipped": why}),
            },
            "debezium_skipped": self.debezium.as_ref().err(),
            "connect_skipped": skipped_json(&self.connect),
            "all_operations": all_operations,
            "slots_scaling": self.scaling.as_ref().map(super::slots::Scaling::json),
            "records_match_backlog": records_match,
            "contention": contention,
            "latency": latency,
            "latency_exactly_once": latency_exactly_once,
            "targets": targets,
        })
    }
}

/// The latency phase's lines of the report.
/// Shares as whole percentages, `?` for an unknown one: "36 %, 9 %, ?".
fn percentages(shares: &[Option<f64>]) -> String {
    shares
        .iter()
        .map(|s| s.map_or("?".to_owned(), |s| format!("{:.0} %", s * 100.0)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn latency_lines(l: &Latency) -> String {
    let mut out = match l.sink {
        Sink::KafkaExactlyOnce => format!(
            "latency, exactly-once (kafka.delivery = \"exactly-once\", planned {} events/s): {} events written at {:.0} events/s for {:.1} s\n",
            l.rate,
            l.events_written,
            l.events_written as f64 / l.write_secs,
            l.write_secs
        ),
        _ => format!(
            "latency: {} events written at {:.0} events/s for {:.1} s\n",
            l.events_written,
            l.events_written as f64 / l.write_secs,
            l.write_secs
        ),
    };
    out += &format!(
        "  commit->ack, Siphon histogram (estimates, linear within buckets; {} observations): {}\n",
        l.histogram_count,
        show_q(l.histogram, "max <=")
    );
    out += &format!(
        "  commit->BEGIN read, Siphon histogram (the commit's WAL flush, the server's decoding and sending, the read-ahead; per transaction, estimates; {} observations): {}\n",
        l.read_histogram_count,
        show_q(l.read_histogram, "max <=")
    );
    out += &format!(
        "  send->ack, Siphon histogram (the producer and the broker; estimates; {} observations): {}\n",
        l.send_histogram_count,
        show_q(l.send_histogram, "max <=")
    );
    out += &producer_windows_line(&l.producer_windows);
    let share = |s: Option<f64>| s.map_or("unknown".to_owned(), |s| format!("{:.1}%", s * 100.0));
    out += &format!(
        "  the machine during the writes (pressure stall information, some task waiting): for a core {}, for I/O {}\n",
        share(l.stalls.cpu),
        share(l.stalls.io)
    );
    if let Some(gc) = l.broker_gc {
        out += &format!(
            "  the broker's GC during the writes: {} pauses, the longest {:.1} ms, {:.1} ms in all\n",
            gc.count, gc.longest_ms, gc.total_ms
        );
    }
    out += &format!(
        "  COMMIT returned->consumer received, end to end (exact; {} of {} records): {}\n",
        l.received,
        l.events_written,
        show_q(l.end_to_end, "max")
    );
    if l.sink == Sink::KafkaExactlyOnce {
        out += &format!(
            "  the consumer reads read_committed: end to end includes the wait for the Kafka transaction's commit (kafka.transaction_interval_ms = {} ms, plus the commit), by design; the histogram times each record to its acknowledgement inside the open transaction\n",
            drain::EOS_TRANSACTION_INTERVAL_MS
        );
    }
    out += &probe_lines(&l.probe, l.histogram.as_ref());
    out += &format!(
        "  siphon under this load: peak RSS {:.1} MB, {:.2} CPU s per 1M events\n",
        l.usage.peak_rss_bytes as f64 / MIB,
        l.usage.cpu_secs * 1e6 / l.events_written.max(1) as f64
    );
    out
}

/// The median and the largest of `values` (0 when empty).
fn median_and_max(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    (median, sorted.last().copied().unwrap_or(0.0))
}

/// The producer's stages inside send->ack, from its statistics intervals.
fn producer_windows_line(windows: &[Vec<f64>; 4]) -> String {
    let intervals = windows[0].len();
    if intervals == 0 {
        return "  inside send->ack, the producer's statistics: no interval ended during the writes\n"
            .to_owned();
    }
    let stages: Vec<String> = PRODUCER_SERIES
        .iter()
        .zip(windows)
        .map(|((_, _, name), values)| {
            let name = name.replace('_', " ");
            let (median, max) = median_and_max(values);
            if max == 0.0 {
                return format!("{name} not reported");
            }
            format!("{name} {:.1} / {:.1} ms", median * 1e3, max * 1e3)
        })
        .collect();
    format!(
        "  inside send->ack, the producer's statistics (per interval, median / largest of {intervals}): {}\n",
        stages.join(", ")
    )
}

/// The latency phase as JSON.
fn latency_json(l: &Latency) -> Value {
    let exactly_once = l.sink == Sink::KafkaExactlyOnce;
    json!({
                "delivery": if exactly_once { "exactly-once" } else { "at-least-once" },
                "planned_events_per_sec": l.rate,
                "transaction_interval_ms": exactly_once.then_some(drain::EOS_TRANSACTION_INTERVAL_MS),
                "consumer_isolation_level": "read_committed",
                "events_written": l.events_written,
                "write_seconds": l.write_secs,
                "events_per_sec": l.events_written as f64 / l.write_secs,
                "histogram_commit_to_ack_seconds": q_json(l.histogram),
                "histogram_observations": l.histogram_count,
                "histogram_commit_to_read_seconds": q_json(l.read_histogram),
                "histogram_read_observations": l.read_histogram_count,
                "histogram_send_to_ack_seconds": q_json(l.send_histogram),
                "histogram_send_observations": l.send_histogram_count,
                "stall_share_cpu": l.stalls.cpu,
                "stall_share_io": l.stalls.io,
                "broker_gc_pauses": l.broker_gc.map(|gc| json!({
                    "count": gc.count,
                    "longest_ms": gc.longest_ms,
                    "total_ms": gc.total_ms,
                })),
                "producer_seconds_per_statistics_interval": PRODUCER_SERIES
                    .iter()
                    .zip(&l.producer_windows)
                    .map(|((_, _, name), values)| ((*name).to_owned(), json!(values)))
                    .collect::<serde_json::Map<String, Value>>(),
                "histogram_note": "estimates by linear interpolation within buckets; max is the upper bound of the highest non-empty bucket",
                "end_to_end_seconds": q_json(l.end_to_end),
                "end_to_end_received": l.received,
                "end_to_end_per_second_p50_max": l.per_second,
                "end_to_end_note": if exactly_once {
                    "COMMIT returned at the writer -> record polled by an rdkafka consumer (read_committed): includes the wait for the Kafka transaction's commit"
                } else {
                    "COMMIT returned at the writer -> record polled by an rdkafka consumer (read_committed)"
                },
                "peak_rss_mb": l.usage.peak_rss_bytes as f64 / MIB,
                "cpu_secs_per_million_events": l.usage.cpu_secs * 1e6 / l.events_written.max(1) as f64,
                "broker_probe": match &l.probe {
                    Ok(p) => json!({
                        "send_to_ack_seconds": q_json(p.latency),
                        "sent": p.sent,
                        "acknowledged": p.acked,
                        "failed": p.failed,
                        "record_bytes": probe::RECORD_BYTES,
                        "interval_ms": probe::INTERVAL.as_millis() as u64,
                        "note": "a separate producer (acks=all, idempotent, linger.ms=0) to a topic of its own during the writes",
                        "share_of_histogram_p50_p99": l.histogram.as_ref().zip(p.latency.as_ref()).map(|(s, b)| broker_share(b, s)),
                    }),
                    Err(why) => json!({"error": why}),
                },
    })
}

/// The Connect rows that did not run, and why.
fn skipped_json(connect: &[(&'static str, Result<Drain, String>)]) -> Value {
    connect
        .iter()
        .filter_map(|(name, row)| {
            row.as_ref()
                .err()
                .map(|why| json!({"name": name, "why": why}))
        })
        .collect()
}

/// The latency report's lines about the probe producer.
fn probe_lines(probe: &Result<ProbeStats, String>, siphon: Option<&Quantiles>) -> String {
    let p = match probe {
        Err(why) => {
            return format!("  broker produce->ack, probe producer: not measured ({why})\n")
        }
        Ok(p) => p,
    };
    let mut out = format!(
        "  broker produce->ack, probe producer (acks=all, linger.ms=0; {} of {} records of {} B, every {} ms{}): {}\n",
        p.acked,
        p.sent,
        probe::RECORD_BYTES,
        probe::INTERVAL.as_millis(),
        if p.failed > 0 {
            format!(", {} FAILED", p.failed)
        } else {
            String::new()
        },
        show_q(p.latency, "max")
    );
    if let (Some(b), Some(s)) = (p.latency.as_ref(), siphon) {
        let (p50, p99) = broker_share(b, s);
        out += &format!(
            "  the broker's own produce latency is {:.0}% of Siphon's commit->ack p50 and {:.0}% of its p99\n",
            p50 * 100.0,
            p99 * 100.0
        );
    }
    out
}

fn show_q(q: Option<Quantiles>, max_label: &str) -> String {
    match q {
        None => "no data".into(),
        Some(q) => format!(
            "p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, {max_label} {:.1} ms",
            q.p50 * 1e3,
            q.p95 * 1e3,
            q.p99 * 1e3,
            q.max * 1e3
        ),
    }
}

fn q_json(q: Option<Quantiles>) -> Value {
    q.map_or(
        Value::Null,
        |q| json!({"p50": q.p50, "p90": q.p90, "p95": q.p95, "p99": q.p99, "p99.9": q.p999, "max": q.max}),
    )
}

#[cfg(test)]
mod tests {
    use super::super::procstat::Usage;
    use super::*;

    fn drain(secs: f64, records: Option<f64>, end: DrainEnd) -> Drain {
        Drain {
            secs,
            usage: records.map(|_| Usage {
                peak_rss_bytes: 20 * 1024 * 1024,
                cpu_secs: 1.0,
                sys_secs: 0.25,
                voluntary_switches: 10,
                minor_faults: 100,
            }),
            records_produced: records,
            walsender_cpu: None,
            broker_cpu: None,
            end,
            first_record_secs: None,
            registry: None,
        }
    }

    fn results(debezium: Result<Drain, String>, contention: Option<Contention>) -> Results {
        Results {
            broker: BrokerInfo {
                name: "Apache Kafka 4.4.0 (test)".into(),
                peak_rss_bytes: Some(512 * 1024 * 1024),
                warm_up_records: None,
                warm_up_drains: None,
            },
            host: HostSpeed {
                cpu: "Test CPU".into(),
                calibration_ms_before: 100.0,
                calibration_ms_after: 110.0,
            },
            backlog: Backlog {
                events: 1000,
                transactions: 1,
                wal_bytes: 1 << 20,
                write_secs: 1.0,
            },
            recvlogical: drain(2.0, None, DrainEnd::ProcessExit),
            kafka: drain(4.0, Some(1000.0), DrainEnd::SlotConfirmed),
            exactly_once: Err("skipped: --no-exactly-once".into()),
            discard: drain(2.5, Some(1000.0), DrainEnd::SlotConfirmed),
            debezium,
            connect: Vec::new(),
            avro: Err("skipped: --no-avro".into()),
            all_operations: None,
            scaling: None,
            contention,
            latency: None,
            latency_exactly_once: None,
            failure: None,
        }
    }

    fn latency(sink: Sink, rate: u64, p99: f64) -> Latency {
        let q = Quantiles {
            p50: p99 / 2.0,
            p90: p99,
            p95: p99,
            p99,
            p999: p99,
            max: p99,
        };
        Latency {
            sink,
            rate,
            events_written: rate,
            write_secs: 1.0,
            histogram: Some(q),
            histogram_count: rate as f64,
            read_histogram: Some(q),
            read_histogram_count: rate as f64 / 100.0,
            send_histogram: Some(q),
            send_histogram_count: rate as f64,
            producer_windows: [vec![0.001], vec![0.0001], vec![0.004], vec![0.009]],
            broker_gc: Some(crate::gc_log::GcPauses {
                count: 2,
                longest_ms: 30.0,
                total_ms: 41.5,
            }),
            stalls: crate::pressure::Stalls {
                cpu: Some(0.125),
                io: None,
            },
            end_to_end: Some(q),
            received: rate,
            per_second: Vec::new(),
            usage: Usage {
                peak_rss_bytes: 30 * 1024 * 1024,
                cpu_secs: 0.5,
                sys_secs: 0.1,
                voluntary_switches: 10,
                minor_faults: 100,
            },
            probe: Err("no probe".into()),
        }
    }

    fn target(r: &Results, name: &str) -> Option<(Option<f64>, String, Option<bool>)> {
        r.targets()
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| (t.value, t.shown, t.pass))
    }

    #[test]
    fn the_exactly_once_drain_is_a_row_with_its_target() {
        let mut r = results(Err("skipped: no JDK".into()), None);
        // 5 s against the at-least-once drain's 4 s: 80%, the target exactly.
        r.exactly_once = Ok(drain(5.0, Some(1000.0), DrainEnd::SlotConfirmed));
        let table = r.table();
        let row = table
            .lines()
            .find(|l| l.starts_with(EXACTLY_ONCE_ROW))
            .unwrap_or_default();
        assert!(row.contains("5.00") && row.contains("0.40"), "{table}");
        assert!(
            table.contains("siphon->kafka (exactly-once) / siphon->kafka: 0.80x (target >= 0.8x"),
            "{table}"
        );
        assert_eq!(
            target(&r, "exactly-once drain"),
            Some((Some(0.8), "80%".into(), Some(true)))
        );
        assert!(r.records_match(), "{table}");
        let json = r.json();
        assert_eq!(json["drains"][2]["name"], EXACTLY_ONCE_ROW);
        assert_eq!(json["drains"][2]["timed_to"], "slot_confirmed");
        assert_eq!(json["exactly_once_share_of_kafka"], 0.8);
        assert_eq!(json["exactly_once_skipped"], Value::Null);
        let bars = &r.chart().groups[0].bars;
        assert_eq!(bars[2].label, EXACTLY_ONCE_ROW);
        assert_eq!(bars[2].ratio, 0.4);

        // Slower than 0.8x is a miss; a wrong record count is a mismatch.
        r.exactly_once = Ok(drain(5.5, Some(999.0), DrainEnd::SlotConfirmed));
        assert_eq!(
            target(&r, "exactly-once drain").and_then(|t| t.2),
            Some(false)
        );
        assert!(r.table().contains("siphon->kafka (exactly-once) 999, "));
        assert!(!r.records_match());
    }

    #[test]
    fn a_skipped_or_failed_exactly_once_drain_says_why() {
        let mut r = results(Err("skipped: no JDK".into()), None);
        let table = r.table();
        assert!(
            table.contains("siphon->kafka (exactly-once) skipped: --no-exactly-once"),
            "{table}"
        );
        assert_eq!(
            target(&r, "exactly-once drain"),
            Some((None, "not measured".into(), None))
        );
        assert_eq!(
            r.json()["exactly_once_skipped"],
            "skipped: --no-exactly-once"
        );
        r.exactly_once = Err("FAILED: timed out".into());
        assert!(r
            .table()
            .contains("siphon->kafka (exactly-once) FAILED: timed out"));
    }

    #[test]
    fn the_exactly_once_latency_phase_is_stated_with_its_rate() {
        let mut r = results(Err("skipped: no JDK".into()), None);
        r.latency = Some(latency(Sink::Kafka, 10_000, 0.008));
        r.latency_exactly_once = Some(Ok(latency(Sink::KafkaExactlyOnce, 5_000, 0.012)));
        let table = r.table();
        assert!(
            table.contains("latency: 10000 events written at 10000 events/s"),
            "{table}"
        );
        assert!(
            table.contains(
                "latency, exactly-once (kafka.delivery = \"exactly-once\", planned 5000 events/s)"
            ),
            "{table}"
        );
        assert!(
            table.contains("end to end includes the wait for the Kafka transaction's commit (kafka.transaction_interval_ms = 100 ms"),
            "{table}"
        );
        // The stated figure has no bound; the at-least-once targets keep their phase's figures.
        let (value, shown, pass) = target(&r, "exactly-once commit->ack p99").unwrap_or_default();
        assert!(value.is_some_and(|v| (v - 12.0).abs() < 1e-9), "{value:?}");
        assert_eq!((shown.as_str(), pass), ("12.0 ms at 5000/s", None));
        let p99 = target(&r, "commit->ack p99 (histogram)").and_then(|t| t.0);
        assert!(p99.is_some_and(|v| (v - 8.0).abs() < 1e-9), "{p99:?}");
        assert!(
            table.contains("inside send->ack, the producer's statistics (per interval, median / largest of 1): partition queue p99 1.0 / 1.0 ms, request queue p99 0.1 / 0.1 ms, round trip p99 4.0 / 4.0 ms, round trip max 9.0 / 9.0 ms"),
            "{table}"
        );
        assert!(
            table.contains(
                "the broker's GC during the writes: 2 pauses, the longest 30.0 ms, 41.5 ms in all"
            ),
            "{table}"
        );
        assert!(
            table.contains("(pressure stall information, some task waiting): for a core 12.5%, for I/O unknown"),
            "{table}"
        );
        let json = r.json();
        assert_eq!(json["latency"]["broker_gc_pauses"]["longest_ms"], 30.0);
        assert_eq!(
            json["latency"]["producer_seconds_per_statistics_interval"]["round_trip_p99"][0],
            0.004
        );
        assert_eq!(json["latency"]["delivery"], "at-least-once");
        assert_eq!(json["latency_exactly_once"]["delivery"], "exactly-once");
        assert_eq!(json["latency_exactly_once"]["planned_events_per_sec"], 5000);
        assert_eq!(json["latency_exactly_once"]["transaction_interval_ms"], 100);
        assert_eq!(
            json["latency_exactly_once"]["consumer_isolation_level"],
            "read_committed"
        );
        r.latency_exactly_once = Some(Err("skipped: --no-exactly-once".into()));
        assert!(r
            .table()
            .contains("latency, exactly-once: skipped: --no-exactly-once"));
        assert_eq!(
            r.json()["latency_exactly_once"]["skipped"],
            "skipped: --no-exactly-once"
        );
    }

    #[test]
    fn ratios_and_shares() {
        assert_eq!(ratio(2.0, 4.0), 0.5);
        let q = |p50, p99| Quantiles {
            p50,
            p90: p99,
            p95: p99,
            p99,
            p999: p99,
            max: p99,
        };
        assert_eq!(
            broker_share(&q(0.002, 0.010), &q(0.008, 0.040)),
            (0.25, 0.25)
        );
    }

    #[test]
    fn record_counts_are_checked_against_the_backlog() {
        let (text, ok) = records_check(10, &[("a", Some(10.0)), ("b", None)]);
        assert!(ok);
        assert_eq!(
            text,
            "records handed to the sink: a 10 (equal to the backlog: 10 events)"
        );
        let (text, ok) = records_check(10, &[("a", Some(10.0)), ("debezium", Some(9.0))]);
        assert!(!ok);
        assert!(text.contains("debezium 9 (MISMATCH"), "{text}");
    }

    #[test]
    fn a_skipped_debezium_row_says_why() {
        let r = results(Err("skipped: no JDK".into()), None);
        let table = r.table();
        assert!(
            table.starts_with("broker: Apache Kafka 4.4.0 (test), peak RSS 512 MB\n"),
            "{table}"
        );
        assert_eq!(r.json()["broker"]["name"], "Apache Kafka 4.4.0 (test)");
        assert!(
            table.contains("debezium          skipped: no JDK"),
            "{table}"
        );
        assert!(
            table.contains("(equal to the backlog: 1000 events)"),
            "{table}"
        );
        assert!(r.records_match());
        assert_eq!(r.json()["debezium_skipped"], "skipped: no JDK");
        assert_eq!(r.json()["drains"].as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn a_debezium_row_timed_to_its_last_record_is_marked() {
        let r = results(Ok(drain(8.0, Some(999.0), DrainEnd::LastRecord)), None);
        let table = r.table();
        let row = table
            .lines()
            .find(|l| l.starts_with("debezium"))
            .unwrap_or_default();
        // 8 s against pg_recvlogical's 2 s: ratio 0.25; the time carries the mark.
        assert!(row.contains("8.00*") && row.contains("0.25"), "{row}");
        assert!(
            table.contains("* debezium timed to its last record"),
            "{table}"
        );
        assert!(table.contains("debezium 999 (MISMATCH"), "{table}");
        assert_eq!(r.json()["drains"][3]["timed_to"], "last_record");
        assert_eq!(r.json()["records_match_backlog"], false);
        assert!(!r.records_match());
    }

    #[test]
    fn contended_rows_use_the_contended_reference() {
        let c = Contention {
            threads: 2,
            in_process: false,
            recvlogical: drain(3.0, None, DrainEnd::ProcessExit),
            kafka: drain(6.0, Some(1000.0), DrainEnd::SlotConfirmed),
            discard: drain(3.0, Some(1000.0), DrainEnd::SlotConfirmed),
            all_operations: Some(ContendedShape {
                recvlogical: drain(4.0, None, DrainEnd::ProcessExit),
                kafka: drain(4.4, Some(1000.0), DrainEnd::SlotConfirmed),
            }),
        };
        let r = results(Err("skipped: --no-debezium".into()), Some(c));
        let table = r.table();
        assert!(
            table.contains("siphon->kafka / pg_recvlogical under the hog: 0.50x (target >= 0.8x)"),
            "{table}"
        );
        let target = r
            .targets()
            .into_iter()
            .find(|t| t.name == "drain to broker, contended");
        assert_eq!(target.and_then(|t| t.pass), Some(false));
        assert_eq!(r.json()["contention"]["kafka_ratio_to_pg_recvlogical"], 0.5);
        assert!(
            table.contains(
                "siphon->kafka / pg_recvlogical under the hog (all operations): 0.91x (target >= 0.8x)"
            ),
            "{table}"
        );
        let all = r
            .targets()
            .into_iter()
            .find(|t| t.name == "drain to broker, contended, all operations");
        assert_eq!(all.and_then(|t| t.pass), Some(true));
        assert_eq!(
            r.json()["contention"]["drains"][2]["ratio_to_pg_recvlogical"],
            1.0
        );
    }

    #[test]
    fn all_operations_and_connect_rows_are_reported_and_charted() {
        let mut r = results(Err("skipped: no JDK".into()), None);
        r.connect = vec![
            (
                "Debezium on Connect (producer defaults)",
                Ok(Drain {
                    first_record_secs: Some(6.5),
                    ..drain(10.0, Some(1000.0), DrainEnd::SlotConfirmed)
                }),
            ),
            (
                "Debezium on Connect (idempotent)",
                Ok(drain(8.0, Some(1000.0), DrainEnd::LastRecord)),
            ),
        ];
        r.all_operations = Some(ShapeRows {
            recvlogical: drain(4.0, None, DrainEnd::ProcessExit),
            kafka: drain(5.0, Some(1000.0), DrainEnd::SlotConfirmed),
            connect: vec![(
                "Debezium on Connect (idempotent)",
                Err("FAILED: stalled".into()),
            )],
        });
        let table = r.table();
        let row = table
            .lines()
            .find(|l| l.starts_with("Debezium on Connect (producer defaults)"))
            .unwrap_or_default();
        assert!(row.contains("10.00") && row.contains("0.20"), "{table}");
        assert!(
            table.contains("* Debezium on Connect (idempotent) timed to its last record"),
            "{table}"
        );
        assert!(table.contains("all-operations publication"), "{table}");
        assert!(
            table.contains(
                "Debezium on Connect (producer defaults): first record on the broker 6.5 s"
            ),
            "{table}"
        );
        assert_eq!(r.json()["drains"][3]["first_record_seconds"], 6.5);
        // Against the idempotent Connect row: its drain time over Siphon's, and Siphon's CPU
        // per event over its (both rows used 1 CPU second here).
        let target = |name: &str| {
            r.targets()
                .into_iter()
                .find(|t| t.name == name)
                .and_then(|t| t.value)
        };
        let speedup = target("drain vs Debezium on Connect (idempotent)").expect("measured");
        assert!((speedup - 8.0 / r.kafka.secs).abs() < 1e-9, "{speedup}");
        assert_eq!(target("CPU vs Debezium on Connect (idempotent)"), Some(1.0));
        assert!(
            table.contains("Debezium on Connect (idempotent) FAILED: stalled"),
            "{table}"
        );
        // siphon->kafka on the all-operations publication: 4 s against its own 5 s.
        let section = table
            .split("all-operations publication")
            .nth(1)
            .unwrap_or_default();
        assert!(section.contains(" 0.80 "), "{section}");
        assert!(r.records_match(), "{table}");
        let json = r.json();
        assert_eq!(json["drains"].as_array().map(Vec::len), Some(5));
        assert_eq!(
            json["all_operations"]["drains"][1]["ratio_to_pg_recvlogical"],
            0.8
        );
        assert_eq!(
            json["all_operations"]["connect_skipped"][0]["why"],
            "FAILED: stalled"
        );
        let chart = r.chart();
        assert_eq!(
            chart.title,
            "Siphon benchmark: 1000 events; broker Apache Kafka 4.4.0"
        );
        assert_eq!(chart.groups.len(), 2);
        assert_eq!(chart.groups[0].bars.len(), 5);
        assert_eq!(
            chart.groups[0].bars[4].label,
            "Debezium on Connect (idempotent)"
        );
        assert_eq!(chart.groups[1].bars[1].ratio, 0.8);
        let svg = super::super::chart::svg(&chart);
        super::super::chart::tests::well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
        for (name, _) in r.rows() {
            let shown = super::super::chart::escape(name);
            assert!(svg.contains(&shown), "{name} not in the chart");
        }
    }

    #[test]
    fn avro_rows_are_reported_with_their_ratio_cpu_and_registry_calls() {
        let mut r = results(Err("skipped: --no-debezium".into()), None);
        assert!(r
            .table()
            .contains("siphon->kafka (avro) skipped: --no-avro"));
        let with_calls = |secs, total, warm: Option<(f64, f64)>| Drain {
            registry: Some(super::super::values::RegistryCalls {
                requests: total,
                lookups: total,
                after_warm_up: warm,
            }),
            ..drain(secs, Some(1000.0), DrainEnd::SlotConfirmed)
        };
        r.avro = Ok(AvroRows {
            json_expanded: drain(4.5, Some(1000.0), DrainEnd::SlotConfirmed),
            avro_expanded: with_calls(5.0, 2.0, Some((0.0, 900.0))),
            avro: with_calls(4.0, 2.0, None),
        });
        let table = r.table();
        assert!(
            table.contains(
                "siphon->kafka (avro, expanded) / siphon->kafka (json, expanded): 0.90x (target >= 0.9x)"
            ),
            "{table}"
        );
        assert!(table.contains("siphon->kafka (avro) / siphon->kafka (json): 1.00x"));
        assert!(
            table.contains("siphon->kafka (avro, expanded) 2 requests in all (2.000 per 1,000 events), 0 schema-id lookups in 900 records (0.000 per 1,000 events)"),
            "{table}"
        );
        assert!(table.contains(
            "siphon->kafka (avro) 2 requests in all (2.000 per 1,000 events), not measured"
        ));
        // 1 CPU second over 1,000 events.
        assert!(table.contains("avro expanded 1000.00 us"), "{table}");
        assert!(
            table.contains(
                "the broker per event (the drains share the cores): json expanded not measured"
            ),
            "{table}"
        );
        let target = |name: &str| {
            r.targets()
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| (t.value, t.pass))
        };
        let (share, pass) = target("avro drain, expanded").expect("a target");
        assert!((share.unwrap_or_default() - 0.9).abs() < 1e-9 && pass == Some(true));
        assert_eq!(
            target("registry calls per 1k events"),
            Some((Some(0.0), Some(true)))
        );
        assert_eq!(
            target("CPU per event, avro expanded"),
            Some((Some(1000.0), None))
        );
        let json = r.json();
        assert_eq!(json["drains"][3]["name"], "siphon->kafka (json, expanded)");
        assert_eq!(json["drains"][4]["schema_registry_requests"], 2.0);
        assert_eq!(json["avro"]["avro_share_of_json"], 1.0);
        assert!(r.records_match());
        let bars = &r.chart().groups[0].bars;
        assert_eq!(bars.len(), 6);
        assert_eq!(bars[5].label, "siphon->kafka (avro)");
    }

    #[test]
    fn probe_lines_report_the_share() {
        let q = |p50, p99| Quantiles {
            p50,
            p90: p99,
            p95: p99,
            p99,
            p999: p99,
            max: p99,
        };
        let stats = ProbeStats {
            sent: 500,
            failed: 0,
            latency: Some(q(0.002, 0.010)),
            acked: 500,
        };
        let text = probe_lines(&Ok(stats), Some(&q(0.008, 0.020)));
        assert!(text.contains("500 of 500 records"), "{text}");
        assert!(text.contains("p50 2.0 ms"), "{text}");
        assert!(
            text.contains("25% of Siphon's commit->ack p50 and 50% of its p99"),
            "{text}"
        );
        let text = probe_lines(&Err("no broker".into()), None);
        assert!(text.contains("not measured (no broker)"), "{text}");
    }
}
