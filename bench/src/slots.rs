//! Scaling past one slot (`--slots-scaling`): pg_recvlogical's throughput with 1, 2 and 4
//! slots drained in parallel on one server, each slot behind its own outbox table and
//! publication, as a team whose outbox outgrew one slot splits it.
//!
//! For each slot count `n` the run writes `n` backlogs of the same size, one per table
//! (`siphon_bench.outbox_s<i>`, publication `siphon_bench_pub_s<i>`), interleaved in one WAL
//! as concurrent applications would, then drains the `n` slots at once, each with its own
//! pg_recvlogical to the end of the WAL written.
//!
//! # Invariants
//! - Every slot is created before its round's backlog and dropped after its drain: each round
//!   starts with no slot holding WAL back.
//! - A round's time runs from the start of the first pg_recvlogical to the exit of the last;
//!   its events/s is all the round's events (`n` backlogs) over that time.
//! - Every walsender decodes the whole WAL of the round (logical decoding reads every
//!   transaction; the publication only filters what is sent), which is what the figures show.

use super::services::Services;
use super::workload;
use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::SimpleQueryMessage;

/// The slot counts measured.
pub const SLOT_COUNTS: [usize; 3] = [1, 2, 4];

/// The outbox table of slot `i`.
pub fn table(i: usize) -> String {
    format!("{}.outbox_s{i}", workload::SCHEMA)
}

/// The publication of slot `i`.
pub fn publication(i: usize) -> String {
    format!("siphon_bench_pub_s{i}")
}

/// The slot of slot `i` in a round of `n`.
pub fn slot_name(n: usize, i: usize) -> String {
    format!("{}scale{n}_{i}", workload::SLOT_PREFIX)
}

/// One round: `slots` slots drained in parallel.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    pub slots: usize,
    /// Events behind each slot.
    pub events_per_slot: u64,
    pub wal_bytes: u64,
    pub secs: f64,
}

impl Round {
    /// All the round's events per second of its wall time.
    pub fn events_per_sec(&self) -> f64 {
        (self.slots as u64 * self.events_per_slot) as f64 / self.secs
    }

    /// Events per second per slot.
    pub fn per_slot(&self) -> f64 {
        self.events_per_sec() / self.slots as f64
    }
}

/// The scaling rounds, in order of slot count.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    pub rounds: Vec<Round>,
}

impl Scaling {
    /// Each round's events/s relative to the one-slot round.
    pub fn speedups(&self) -> Vec<f64> {
        let base = self.rounds.first().map_or(f64::NAN, Round::events_per_sec);
        self.rounds
            .iter()
            .map(|r| r.events_per_sec() / base)
            .collect()
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<8} {:>14} {:>10} {:>9} {:>12} {:>14} {:>8}\n",
            "slots", "events/slot", "WAL MB", "seconds", "events/s", "events/s/slot", "speedup"
        );
        for (r, s) in self.rounds.iter().zip(self.speedups()) {
            out += &format!(
                "{:<8} {:>14} {:>10.0} {:>9.2} {:>12.0} {:>14.0} {:>7.2}x\n",
                r.slots,
                r.events_per_slot,
                r.wal_bytes as f64 / (1024.0 * 1024.0),
                r.secs,
                r.events_per_sec(),
                r.per_slot(),
                s
            );
        }
        out
    }

    pub fn json(&self) -> Value {
        let rounds: Vec<Value> = self
            .rounds
            .iter()
            .zip(self.speedups())
            .map(|(r, s)| {
                json!({
                    "slots": r.slots,
                    "events_per_slot": r.events_per_slot,
                    "wal_bytes": r.wal_bytes,
                    "seconds": r.secs,
                    "events_per_sec": r.events_per_sec(),
                    "events_per_sec_per_slot": r.per_slot(),
                    "speedup_over_one_slot": s,
                })
            })
            .collect();
        json!({
            "drain": "pg_recvlogical per slot, all at once; one outbox table and publication per slot",
            "rounds": rounds,
        })
    }
}

/// Creates the tables and publications of the largest round (dropped by
/// [`workload::drop_objects`]).
pub async fn prepare(db: &tokio_postgres::Client) -> Result<()> {
    let max = SLOT_COUNTS.iter().copied().max().unwrap_or(1);
    for i in 0..max {
        let (t, p) = (table(i), publication(i));
        db.batch_execute(&format!(
            "CREATE TABLE {t} (LIKE {} INCLUDING ALL);
             DROP PUBLICATION IF EXISTS {p};
             CREATE PUBLICATION {p} FOR TABLE {t} WITH (publish = 'insert, update');",
            workload::TABLE
        ))
        .await
        .with_context(|| format!("creating {t} and {p}"))?;
    }
    Ok(())
}

/// Runs every round with `events` behind each slot.
pub async fn run(
    svc: &Services,
    db: &tokio_postgres::Client,
    events: u64,
    txn_events: u64,
    timeout: Duration,
) -> Result<Scaling> {
    let mut rounds = Vec::new();
    for n in SLOT_COUNTS {
        let slots: Vec<String> = (0..n).map(|i| slot_name(n, i)).collect();
        for s in &slots {
            workload::create_slot(db, s).await?;
        }
        eprintln!("bench: slots scaling: writing {n} x {events} events ...");
        let (wal_bytes, end_text) = write(svc, n, events, txn_events).await?;
        eprintln!("bench: slots scaling: draining {n} slot(s) in parallel ...");
        let outcome = drain(svc, &slots, &end_text, timeout).await;
        for s in &slots {
            workload::drop_slot(db, s).await?;
        }
        let secs = outcome?;
        let round = Round {
            slots: n,
            events_per_slot: events,
            wal_bytes,
            secs,
        };
        eprintln!(
            "bench: slots scaling: {n} slot(s): {secs:.2} s, {:.0} events/s",
            round.events_per_sec()
        );
        rounds.push(round);
    }
    Ok(Scaling { rounds })
}

/// Writes `events` events into each of the first `n` tables, transactions interleaved over
/// two connections; returns the WAL written and the end position (`X/Y`).
async fn write(svc: &Services, n: usize, events: u64, txn_events: u64) -> Result<(u64, String)> {
    let db = svc.connect().await?;
    let (_, start_lsn) = workload::current_lsn(&db).await?;
    let nonce = workload::run_nonce();
    let per_table = events.div_ceil(txn_events);
    let total = per_table * n as u64;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = svc.connect().await?;
        let (next, nonce) = (next.clone(), nonce.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= total {
                    return anyhow::Ok(());
                }
                client
                    .batch_execute(&transaction(&nonce, n, k, txn_events, events))
                    .await
                    .with_context(|| format!("scaling transaction {k}"))?;
            }
        }));
    }
    for task in tasks {
        task.await.context("a scaling writer panicked")??;
    }
    let end_text = db
        .simple_query("SELECT pg_current_wal_insert_lsn()::text")
        .await?
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .context("no position after the scaling backlog")?;
    let (_, end_lsn) = workload::current_lsn(&db).await?;
    Ok((end_lsn.saturating_sub(start_lsn), end_text))
}

/// Transaction `k` of a round of `n` tables: table `k % n`, its events from
/// `(k / n) * txn_events`.
fn transaction(nonce: &str, n: usize, k: u64, txn_events: u64, events: u64) -> String {
    let i = (k % n as u64) as usize;
    let first = (k / n as u64) * txn_events;
    workload::transaction_sql_into(
        &table(i),
        nonce,
        "'BenchOrder'",
        first,
        txn_events.min(events - first),
    )
}

/// Starts one pg_recvlogical per slot at once, each to `end` with its slot's publication;
/// returns the seconds until the last one exited.
async fn drain(svc: &Services, slots: &[String], end: &str, timeout: Duration) -> Result<f64> {
    let start = Instant::now();
    let mut children = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let child = tokio::process::Command::new(&svc.recvlogical)
            .args(["-d", &svc.pg_url, "--slot", slot, "--start", "--no-loop"])
            .args(["-o", "proto_version=1", "-o"])
            .arg(format!("publication_names={}", publication(i)))
            .args(["-f", "/dev/null", "--endpos", end])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", svc.recvlogical.display()))?;
        children.push(child);
    }
    for (slot, child) in slots.iter().zip(children) {
        let left = timeout.saturating_sub(start.elapsed());
        let out = tokio::time::timeout(left, child.wait_with_output())
            .await
            .with_context(|| {
                format!("pg_recvlogical on {slot} did not reach {end} within {timeout:?}")
            })?
            .context("waiting for pg_recvlogical")?;
        if !out.status.success() {
            bail!(
                "pg_recvlogical on {slot} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(slots: usize, secs: f64) -> Round {
        Round {
            slots,
            events_per_slot: 1000,
            wal_bytes: 1 << 20,
            secs,
        }
    }

    #[test]
    fn rates_and_speedups() {
        let s = Scaling {
            rounds: vec![round(1, 1.0), round(2, 1.0), round(4, 4.0)],
        };
        assert_eq!(s.rounds[1].events_per_sec(), 2000.0);
        assert_eq!(s.rounds[2].per_slot(), 250.0);
        assert_eq!(s.speedups(), vec![1.0, 2.0, 1.0]);
        let table = s.table();
        assert!(
            table.lines().nth(2).is_some_and(|l| l.contains("2.00x")),
            "{table}"
        );
        assert_eq!(s.json()["rounds"][1]["events_per_sec"], 2000.0);
    }

    #[test]
    fn transactions_alternate_tables_and_cover_each_backlog() {
        // Round of 2 tables, 5 events each in transactions of 2: 3 per table, 6 in all.
        let sql: Vec<String> = (0..6)
            .map(|k| transaction("0a0b0c0d", 2, k, 2, 5))
            .collect();
        assert!(
            sql[0].contains("siphon_bench.outbox_s0") && sql[0].contains("0::bigint, 1::bigint")
        );
        assert!(
            sql[1].contains("siphon_bench.outbox_s1") && sql[1].contains("0::bigint, 1::bigint")
        );
        assert!(
            sql[4].contains("siphon_bench.outbox_s0") && sql[4].contains("4::bigint, 4::bigint")
        );
        assert_eq!(slot_name(4, 3), "siphon_bench_scale4_3");
        assert_eq!(publication(1), "siphon_bench_pub_s1");
    }
}
