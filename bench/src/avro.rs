//! The Avro rows: the backlog drained to the broker with `format.value = "avro"` through the
//! bench's schema registry, with expanded payloads and without, beside the expanded JSON row
//! they are compared with (`--no-avro` skips the three).
//!
//! The plain `siphon->kafka` row writes each payload as a JSON string. Debezium's Avro rows
//! expand the payload into a record of the schema inferred from it; expanding is optional
//! (`router."table.expand.json.payload"`) and costs the same inference with either encoding.
//! So the expanded Avro row is compared with the expanded JSON row (the target: at least 0.9x
//! its events/s), and the plain Avro row (the payload as an Avro string) with the plain JSON
//! row.

use super::drain::{self, Drain, Setup, Sink};
use super::report::ratio;
use super::services::Services;
use super::values::{self, Values};
use super::workload;
use anyhow::Result;
use serde_json::{json, Value};
use std::time::Duration;

pub const JSON_EXPANDED_ROW: &str = "siphon->kafka (json, expanded)";
pub const AVRO_EXPANDED_ROW: &str = "siphon->kafka (avro, expanded)";
pub const AVRO_ROW: &str = "siphon->kafka (avro)";

/// The expanded Avro drain's rate relative to the expanded JSON drain's: the target.
pub const MIN_SHARE: f64 = 0.9;

/// Registry calls per 1,000 events after warm-up that still count as "about 0".
pub const MAX_CALLS_PER_1000: f64 = 0.01;

/// The rows, in the order they drain.
const ROWS: [(&str, Values, &str); 3] = [
    (JSON_EXPANDED_ROW, Values::JsonExpanded, "json_expanded"),
    (AVRO_EXPANDED_ROW, Values::AvroExpanded, "avro_expanded"),
    (AVRO_ROW, Values::Avro, "avro"),
];

/// The slots of the rows, named after `slot` (the bench's slot namer).
pub fn slots(slot: impl Fn(&str) -> String) -> [String; 3] {
    ROWS.map(|(_, _, suffix)| slot(suffix))
}

/// The three drains.
pub struct AvroRows {
    pub json_expanded: Drain,
    pub avro_expanded: Drain,
    pub avro: Drain,
}

/// Drains the backlog on each of `slots` ([`slots`]) in turn, each slot dropped after its
/// drain.
pub async fn drains(
    svc: &Services,
    db: &tokio_postgres::Client,
    slots: &[String; 3],
    end_lsn: u64,
    timeout: Duration,
) -> Result<AvroRows> {
    let row = |i: usize| {
        let (name, values, _) = ROWS[i];
        one(svc, db, &slots[i], name, values, (end_lsn, timeout))
    };
    Ok(AvroRows {
        json_expanded: row(0).await?,
        avro_expanded: row(1).await?,
        avro: row(2).await?,
    })
}

/// One row's drain to the broker, at-least-once, writing `values`.
async fn one(
    svc: &Services,
    db: &tokio_postgres::Client,
    slot: &str,
    name: &str,
    values: Values,
    (end_lsn, timeout): (u64, Duration),
) -> Result<Drain> {
    eprintln!("bench: draining {slot} with {name} ...");
    let setup = Setup {
        sink: Sink::Kafka,
        values,
    };
    let outcome = drain::siphon(
        svc,
        db,
        slot,
        workload::PUBLICATION,
        setup,
        end_lsn,
        timeout,
    )
    .await;
    workload::drop_slot(db, slot).await?;
    let d = outcome?;
    eprintln!("bench: {name}: {:.2} s", d.secs);
    Ok(d)
}

impl AvroRows {
    pub fn rows(&self) -> [(&'static str, &Drain); 3] {
        [
            (JSON_EXPANDED_ROW, &self.json_expanded),
            (AVRO_EXPANDED_ROW, &self.avro_expanded),
            (AVRO_ROW, &self.avro),
        ]
    }

    /// The expanded Avro drain's events/s over the expanded JSON drain's: the target's ratio.
    pub fn expanded_share(&self) -> f64 {
        ratio(self.json_expanded.secs, self.avro_expanded.secs)
    }

    /// The plain Avro drain's events/s over the plain JSON drain's (`json` of `siphon->kafka`).
    pub fn plain_share(&self, json: &Drain) -> f64 {
        ratio(json.secs, self.avro.secs)
    }

    /// The expanded Avro drain's schema-id lookups per 1,000 events after warm-up: at least
    /// its registry calls then.
    pub fn calls_per_1000_after_warm_up(&self) -> Option<f64> {
        self.avro_expanded
            .registry
            .and_then(|r| r.per_1000_after_warm_up())
    }

    /// The report's lines under the drain table; `json` is the plain JSON drain.
    pub fn lines(&self, json: &Drain, events: u64) -> String {
        let us = |d: &Drain| cpu_us(d, events).map_or("-".to_owned(), |v| format!("{v:.2} us"));
        let mut out = format!(
            "  {AVRO_EXPANDED_ROW} / {JSON_EXPANDED_ROW}: {:.2}x (target >= {MIN_SHARE}x); {AVRO_ROW} / siphon->kafka (json): {:.2}x\n",
            self.expanded_share(),
            self.plain_share(json)
        );
        out += &format!(
            "  Siphon's CPU per event: json {}, json expanded {}, avro expanded {}, avro {}\n",
            us(json),
            us(&self.json_expanded),
            us(&self.avro_expanded),
            us(&self.avro)
        );
        let all = |d: &Drain| {
            all_cpu_us(d, events).map_or("not measured".to_owned(), |v| format!("{v:.2} us"))
        };
        out += &format!(
            "  CPU of Siphon, the walsender and the broker per event (the drains share the cores): json expanded {}, avro expanded {}\n",
            all(&self.json_expanded),
            all(&self.avro_expanded)
        );
        let calls: Vec<String> = [
            (AVRO_EXPANDED_ROW, &self.avro_expanded),
            (AVRO_ROW, &self.avro),
        ]
        .iter()
        .map(|(name, d)| match d.registry {
            None => format!("{name} not scraped"),
            Some(r) => format!(
                "{name} {:.0} requests in all ({:.3} per 1,000 events), {} after its first {:.0} records",
                r.requests,
                r.requests * 1000.0 / events.max(1) as f64,
                match r.after_warm_up {
                    Some((lookups, records)) => format!(
                        "{lookups:.0} schema-id lookups in {records:.0} records ({:.3} per 1,000 events)",
                        lookups * 1000.0 / records.max(1.0)
                    ),
                    None => "not measured".to_owned(),
                },
                values::REGISTRY_WARM_UP_RECORDS
            ),
        })
        .collect();
        out += &format!(
            "  schema registry calls ({}, {}; every request follows a lookup): {}\n",
            values::REGISTRY_REQUESTS,
            values::SCHEMA_ID_LOOKUPS,
            calls.join("; ")
        );
        out
    }

    /// The rows' figures beyond the drain rows, as JSON.
    pub fn json(&self, json: &Drain, events: u64) -> Value {
        let calls = |d: &Drain| {
            d.registry.map(|r| {
                json!({
                    "requests": r.requests,
                    "requests_per_1000_events": r.requests * 1000.0 / events.max(1) as f64,
                    "schema_id_lookups": r.lookups,
                    "warm_up_records": values::REGISTRY_WARM_UP_RECORDS,
                    "schema_id_lookups_after_warm_up": r.after_warm_up.map(|(l, _)| l),
                    "records_after_warm_up": r.after_warm_up.map(|(_, n)| n),
                    "schema_id_lookups_per_1000_events_after_warm_up": r.per_1000_after_warm_up(),
                })
            })
        };
        json!({
            "avro_expanded_share_of_json_expanded": self.expanded_share(),
            "avro_share_of_json": self.plain_share(json),
            "siphon_walsender_broker_cpu_us_per_event": {
                "json_expanded": all_cpu_us(&self.json_expanded, events),
                "avro_expanded": all_cpu_us(&self.avro_expanded, events),
            },
            "cpu_us_per_event": {
                "json": cpu_us(json, events),
                "json_expanded": cpu_us(&self.json_expanded, events),
                "avro_expanded": cpu_us(&self.avro_expanded, events),
                "avro": cpu_us(&self.avro, events),
            },
            "schema_registry_calls": {
                "avro_expanded": calls(&self.avro_expanded),
                "avro": calls(&self.avro),
            },
        })
    }
}

/// Siphon's CPU time (user and system) per backlog event, in microseconds.
pub fn cpu_us(d: &Drain, events: u64) -> Option<f64> {
    d.usage.map(|u| u.cpu_secs * 1e6 / events.max(1) as f64)
}

/// The CPU time of Siphon, the walsender and the broker per backlog event, in microseconds,
/// when all three are known.
pub fn all_cpu_us(d: &Drain, events: u64) -> Option<f64> {
    let secs = d.usage?.cpu_secs + d.walsender_cpu? + d.broker_cpu?.total;
    Some(secs * 1e6 / events.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_named_after_the_rows() {
        let slots = slots(|s| format!("siphon_bench_{s}"));
        assert_eq!(
            slots,
            [
                "siphon_bench_json_expanded",
                "siphon_bench_avro_expanded",
                "siphon_bench_avro"
            ]
        );
    }
}
