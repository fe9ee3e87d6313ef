//! Writing the backlog behind the slots, fast: each transaction inserts its events with one
//! `INSERT ... SELECT FROM generate_series` and deletes them, on two connections at once.

use super::report::Backlog;
use super::services::Services;
use super::workload;
use anyhow::{Context as _, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const CONNECTIONS: u64 = 2;

/// Writes `events` events in transactions of `txn_events`; returns what was written and the
/// end of the backlog (`X/Y` and as a number).
pub async fn write(svc: &Services, events: u64, txn_events: u64) -> Result<(Backlog, String, u64)> {
    let db = svc.connect().await?;
    let (_, start_lsn) = workload::current_lsn(&db).await?;
    let nonce = workload::run_nonce();
    let transactions = events.div_ceil(txn_events);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let client = svc.connect().await?;
        let (next, nonce) = (next.clone(), nonce.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let txn = next.fetch_add(1, Ordering::Relaxed);
                if txn >= transactions {
                    return anyhow::Ok(());
                }
                let first = txn * txn_events;
                let count = txn_events.min(events - first);
                let sql = workload::transaction_sql(
                    &nonce,
                    "CASE WHEN n % 3 = 0 THEN 'BenchCustomer' ELSE 'BenchOrder' END",
                    first,
                    count,
                );
                client
                    .batch_execute(&sql)
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
    let write_secs = started.elapsed().as_secs_f64();
    let (end_text, end_lsn) = workload::current_lsn(&db).await?;
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
