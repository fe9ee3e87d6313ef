//! Writing the backlog behind the slots, fast: each transaction inserts its events with one
//! `INSERT ... SELECT FROM generate_series` and deletes them, on two connections at once.

use super::report::Backlog;
use super::services::Services;
use super::workload;
use anyhow::{Context as _, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio_postgres::SimpleQueryMessage;

const CONNECTIONS: u64 = 2;

/// The aggregate types of the backlog's events (the router's topic names): event `n` is a
/// `BenchCustomer` when `n % 3 == 0`, a `BenchOrder` otherwise.
pub const AGGREGATE_TYPES: [&str; 2] = ["BenchCustomer", "BenchOrder"];

/// Writes `events` events in transactions of `txn_events`; returns what was written and the
/// end of the backlog (`X/Y` and as a number).
pub async fn write(svc: &Services, events: u64, txn_events: u64) -> Result<(Backlog, String, u64)> {
    let db = svc.connect().await?;
    let (_, start_lsn) = workload::current_lsn(&db).await?;
    let nonce = workload::run_nonce();
    let transactions = events.div_ceil(txn_events);
    // The last transaction runs alone, after the others, so that the position read right after
    // its COMMIT is (barring background WAL) the end of its commit record: the slot streams
    // end exactly there, with no wait for a keepalive past it.
    let parallel = transactions - 1;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let client = svc.connect().await?;
        let (next, nonce) = (next.clone(), nonce.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let txn = next.fetch_add(1, Ordering::Relaxed);
                if txn >= parallel {
                    return anyhow::Ok(());
                }
                client
                    .batch_execute(&backlog_sql(&nonce, txn, txn_events, events))
                    .await
                    .with_context(|| format!("backlog transaction {txn}"))?;
                let done = txn + 1;
                if done % (transactions / 10).max(1) == 0 {
                    eprintln!("bench: backlog {done}/{transactions} transactions");
                }
            }
        }));
    }
    for task in tasks {
        task.await.context("a backlog writer panicked")??;
    }
    let last = format!(
        "{} SELECT pg_current_wal_insert_lsn()::text",
        backlog_sql(&nonce, parallel, txn_events, events)
    );
    let end_text = db
        .simple_query(&last)
        .await
        .context("the last backlog transaction")?
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .context("no position after the last backlog transaction")?;
    let write_secs = started.elapsed().as_secs_f64();
    let end_lsn = parse_lsn(&end_text)?;
    Ok((
        Backlog {
            events,
            transactions,
            wal_bytes: end_lsn.saturating_sub(start_lsn),
            write_secs,
        },
        end_text,
        end_lsn,
    ))
}

/// Backlog transaction number `txn`: events `txn * txn_events ..`, at most `events` in all.
fn backlog_sql(nonce: &str, txn: u64, txn_events: u64, events: u64) -> String {
    let first = txn * txn_events;
    workload::transaction_sql(
        nonce,
        &format!(
            "CASE WHEN n % 3 = 0 THEN '{}' ELSE '{}' END",
            AGGREGATE_TYPES[0], AGGREGATE_TYPES[1]
        ),
        first,
        txn_events.min(events - first),
    )
}

/// `X/Y` (hex halves) as a number.
fn parse_lsn(text: &str) -> Result<u64> {
    let (hi, lo) = text.split_once('/').context("an LSN is X/Y")?;
    Ok((u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_lsns() {
        assert_eq!(super::parse_lsn("1/2A").ok(), Some((1 << 32) | 0x2a));
        assert!(super::parse_lsn("12").is_err());
    }
}
