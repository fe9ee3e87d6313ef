//! The result table, the targets and the JSON document.

use super::drain::Drain;
use super::latency::{Latency, Quantiles};
use serde_json::{json, Value};

pub struct Backlog {
    pub events: u64,
    pub transactions: u64,
    pub wal_bytes: u64,
    pub write_secs: f64,
}

pub struct Results {
    pub backlog: Backlog,
    pub recvlogical: Drain,
    pub kafka: Drain,
    pub discard: Drain,
    pub latency: Option<Latency>,
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
    fn rows(&self) -> [(&'static str, &Drain); 3] {
        [
            ("pg_recvlogical", &self.recvlogical),
            ("siphon->kafka", &self.kafka),
            ("siphon->discard", &self.discard),
        ]
    }

    fn rate(&self, d: &Drain) -> f64 {
        self.backlog.events as f64 / d.secs
    }

    fn ratio(&self, d: &Drain) -> f64 {
        self.recvlogical.secs / d.secs
    }

    fn peak_rss_mb(&self) -> Option<f64> {
        let mut all = vec![self.kafka.usage, self.discard.usage];
        all.push(self.latency.as_ref().map(|l| l.usage));
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
        let rss = self.peak_rss_mb();
        vec![
            Target {
                name: "drain to broker",
                goal: ">= 70% of pg_recvlogical",
                value: Some(kafka),
                shown: format!("{:.0}%", kafka * 100.0),
                pass: Some(kafka >= 0.70),
            },
            Target {
                name: "drain with discard",
                goal: ">= 90% of pg_recvlogical",
                value: Some(discard),
                shown: format!("{:.0}%", discard * 100.0),
                pass: Some(discard >= 0.90),
            },
            Target {
                name: "commit->ack p99 (histogram)",
                goal: "<= 50 ms",
                value: p99,
                shown: p99.map_or("not measured".into(), |v| format!("{v:.1} ms")),
                pass: p99.map(|v| v <= 50.0),
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
        let mut out = format!(
            "backlog: {} events in {} transactions, {:.0} MB of WAL (written in {:.1} s)\n\n",
            b.events,
            b.transactions,
            b.wal_bytes as f64 / MIB,
            b.write_secs
        );
        out += &format!(
            "{:<17} {:>9} {:>11} {:>7} {:>13} {:>16} | {:>18} {:>15}\n",
            "",
            "seconds",
            "events/s",
            "ratio",
            "peak RSS MB",
            "CPU s per 1M ev",
            "walsender CPU s/1M",
            "broker CPU s/1M"
        );
        for (name, d) in self.rows() {
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
            out += &format!(
                "{:<17} {:>9.2} {:>11.0} {:>7.2} {:>13} {:>16} | {:>18} {:>15}\n",
                name,
                d.secs,
                self.rate(d),
                self.ratio(d),
                rss,
                cpu,
                per_m(d.walsender_cpu),
                per_m(d.broker_cpu)
            );
        }
        out += "\n";
        match &self.latency {
            None => out += "latency: not measured (--latency-secs 0)\n",
            Some(l) => {
                out += &format!(
                    "latency: {} events written at {:.0} events/s for {:.1} s\n",
                    l.events_written,
                    l.events_written as f64 / l.write_secs,
                    l.write_secs
                );
                out += &format!(
                    "  commit->ack, Siphon histogram (estimates, linear within buckets; {} observations): {}\n",
                    l.histogram_count,
                    show_q(l.histogram, "max <=")
                );
                out += &format!(
                    "  COMMIT returned->consumer received, end to end (exact; {} of {} records): {}\n",
                    l.received,
                    l.events_written,
                    show_q(l.end_to_end, "max")
                );
                out += &format!(
                    "  siphon under this load: peak RSS {:.1} MB, {:.2} CPU s per 1M events\n",
                    l.usage.peak_rss_bytes as f64 / MIB,
                    l.usage.cpu_secs * 1e6 / l.events_written.max(1) as f64
                );
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

    /// The same as JSON.
    pub fn json(&self) -> Value {
        let b = &self.backlog;
        let rows: Vec<Value> = self
            .rows()
            .iter()
            .map(|(name, d)| {
                json!({
                    "name": name,
                    "seconds": d.secs,
                    "events_per_sec": self.rate(d),
                    "ratio_to_pg_recvlogical": self.ratio(d),
                    "peak_rss_mb": d.usage.map(|u| u.peak_rss_bytes as f64 / MIB),
                    "cpu_secs_per_million_events": d.usage.map(|u| u.cpu_secs * 1e6 / b.events as f64),
                    "system_cpu_share": d.usage.map(|u| u.sys_secs / u.cpu_secs.max(f64::MIN_POSITIVE)),
                    "voluntary_context_switches_per_event": d.usage.map(|u| u.voluntary_switches as f64 / b.events as f64),
                    "records_produced": d.records_produced,
                    "walsender_cpu_secs": d.walsender_cpu,
                    "broker_cpu_secs": d.broker_cpu,
                })
            })
            .collect();
        let latency = self.latency.as_ref().map(|l| {
            json!({
                "events_written": l.events_written,
                "write_seconds": l.write_secs,
                "events_per_sec": l.events_written as f64 / l.write_secs,
                "histogram_commit_to_ack_seconds": q_json(l.histogram),
                "histogram_observations": l.histogram_count,
                "histogram_note": "estimates by linear interpolation within buckets; max is the upper bound of the highest non-empty bucket",
                "end_to_end_seconds": q_json(l.end_to_end),
                "end_to_end_received": l.received,
                "end_to_end_per_second_p50_max": l.per_second,
                "end_to_end_note": "COMMIT returned at the writer -> record polled by an rdkafka consumer",
                "peak_rss_mb": l.usage.peak_rss_bytes as f64 / MIB,
                "cpu_secs_per_million_events": l.usage.cpu_secs * 1e6 / l.events_written.max(1) as f64,
            })
        });
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|t| json!({"name": t.name, "goal": t.goal, "value": t.value, "pass": t.pass}))
            .collect();
        json!({
            "backlog": {
                "events": b.events,
                "transactions": b.transactions,
                "wal_bytes": b.wal_bytes,
                "write_seconds": b.write_secs,
            },
            "drains": rows,
            "latency": latency,
            "targets": targets,
        })
    }
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
        |q| json!({"p50": q.p50, "p95": q.p95, "p99": q.p99, "max": q.max}),
    )
}
