//! Chaos: an application commits 50,000 outbox events at a steady rate while Siphon is killed
//! with `kill -9` five times, the broker is restarted twice and PostgreSQL once. Afterwards a
//! consumer reads every topic: every committed event is there, nothing rolled back is, and the
//! first delivery of each event is in commit order per aggregate.
//!
//! The broker is a Kafka node of the test's own, killed with `kill -9` and started again on its
//! data, which it keeps across the kill.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, reconnect_and_check_ledger, record_seq, slot_active,
};
use siphon_tests::{read_topic_async, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

const TRANSACTIONS: u64 = 500;
const EVENTS_PER_TRANSACTION: u64 = 100;
/// One extra transaction in this many is rolled back (its events must never appear).
const ROLLBACK_EVERY: u64 = 25;
const AGGREGATE_TYPES: u64 = 10;
/// The writer's pace: transactions per second (1,000 events/s).
const TRANSACTIONS_PER_SECOND: u64 = 10;

fn topic(aggregate_type: u64) -> String {
    format!("outbox.event.T{aggregate_type}")
}

/// Event `seq` of transaction `txn`: id, aggregate type, aggregate id.
fn event(seq: u64) -> (String, String, String) {
    let aggregate_type = seq % AGGREGATE_TYPES;
    (
        format!("00000000-0000-4000-8000-{seq:012}"),
        format!("T{aggregate_type}"),
        format!("agg-{}", seq % 97),
    )
}

/// Commits (or rolls back) one transaction of events `first..first+count`; with a ledger row so
/// that a commit whose answer was lost in a PostgreSQL restart can be told apart from one that
/// did not happen.
async fn write_transaction(client: &Client, txn: i64, first: u64, commit: bool) -> Result<()> {
    let mut sql = String::from("BEGIN;");
    for seq in first..first + EVENTS_PER_TRANSACTION {
        let (id, aggregate_type, aggregate_id) = event(seq);
        sql.push_str(&format!(
            "INSERT INTO outbox VALUES ('{id}', '{aggregate_type}', '{aggregate_id}', 'E', '{{\"seq\": {seq}}}');"
        ));
    }
    sql.push_str(&format!(
        "DELETE FROM outbox; INSERT INTO ledger VALUES ({txn});"
    ));
    sql.push_str(if commit { "COMMIT;" } else { "ROLLBACK;" });
    client.batch_execute(&sql).await?;
    Ok(())
}

/// The writer: returns the sequence numbers of committed and rolled-back events.
async fn writer(pg: Arc<Postgres>) -> Result<(BTreeSet<u64>, BTreeSet<u64>)> {
    let mut client = pg.connect_retrying().await;
    let (mut committed, mut rolled_back) = (BTreeSet::new(), BTreeSet::new());
    let mut next_seq = 1u64;
    let mut pace = tokio::time::interval(Duration::from_millis(1000 / TRANSACTIONS_PER_SECOND));
    let mut txn = 0i64;
    for n in 0..TRANSACTIONS + TRANSACTIONS / ROLLBACK_EVERY {
        pace.tick().await;
        let commit = n % (ROLLBACK_EVERY + 1) != ROLLBACK_EVERY;
        txn += 1;
        let first = next_seq;
        next_seq += EVENTS_PER_TRANSACTION;
        loop {
            match write_transaction(&client, txn, first, commit).await {
                Ok(()) => break,
                Err(_) => {
                    // PostgreSQL restarted: reconnect, and find out whether the commit happened.
                    let done;
                    (client, done) = reconnect_and_check_ledger(&pg, txn).await;
                    if done || !commit {
                        break;
                    }
                }
            }
        }
        let seqs = first..first + EVENTS_PER_TRANSACTION;
        if commit {
            committed.extend(seqs);
        } else {
            rolled_back.extend(seqs);
        }
    }
    Ok((committed, rolled_back))
}

async fn read_everything(broker: &Broker) -> Result<Vec<ConsumedRecord>> {
    let mut all = Vec::new();
    for t in 0..AGGREGATE_TYPES {
        all.extend(
            read_topic_async(
                &broker.bootstrap(),
                &broker.topic(&topic(t)),
                Duration::from_secs(120),
            )
            .await?,
        );
    }
    Ok(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_events_through_kill_9_broker_and_postgres_restarts() -> Result<()> {
    let pg = Arc::new(Postgres::start()?);
    let broker = Broker::start_own(&[])?;
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb);
             CREATE TABLE ledger (txn bigint PRIMARY KEY);",
        )
        .await?;
    let config = siphon_tests::outbox::siphon_config(&pg, &broker, "chaos", "").replace(
        "\"message.timeout.ms\" = \"10000\"",
        "\"message.timeout.ms\" = \"30000\"",
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "chaos").await },
    )
    .await?;
    drop(client);

    let started = Instant::now();
    let writing = tokio::spawn(writer(Arc::clone(&pg)));
    let at = |secs: u64| {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + Duration::from_secs(secs),
        ))
    };
    let mut kills = 0;
    for (when, fault) in [
        (4, "kill"),
        (9, "broker"),
        (15, "kill"),
        (21, "postgres"),
        (27, "kill"),
        (33, "broker"),
        (38, "kill"),
        (44, "kill"),
    ] {
        at(when).await;
        match fault {
            "kill" => {
                siphon.kill9()?;
                kills += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                siphon.start_again()?;
            }
            "broker" => {
                broker.kill()?;
                tokio::time::sleep(Duration::from_secs(3)).await;
                broker.start_again()?;
            }
            _ => pg.restart()?,
        }
    }
    let (committed, rolled_back) = writing.await??;
    assert_eq!(
        committed.len() as u64,
        TRANSACTIONS * EVENTS_PER_TRANSACTION
    );

    // Wait until the slot has confirmed past everything, then read every topic.
    let client = pg.connect().await?;
    let end: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    wait_until(Duration::from_secs(600), Duration::from_secs(1), || async {
        let done: Option<bool> = client
            .query_one("SELECT confirmed_flush_lsn >= $1::text::pg_lsn FROM pg_replication_slots WHERE slot_name = 'chaos'", &[&end])
            .await?
            .get(0);
        Ok(done == Some(true))
    })
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let records = read_everything(&broker).await?;

    let delivered: BTreeSet<u64> = records.iter().filter_map(record_seq).collect();
    let lost = committed.difference(&delivered).count();
    let phantom = delivered.difference(&committed).count();
    let rolled_back_seen = delivered.intersection(&rolled_back).count();
    let duplicates = records.len() - delivered.len();
    eprintln!(
        "chaos: {} committed, {} records read: lost {lost}, phantom {phantom}, duplicate {duplicates} \
         ({kills} kill -9, 2 broker restarts, 1 PostgreSQL restart, {:.0} s)",
        committed.len(),
        records.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(lost, 0, "lost events");
    assert_eq!(
        phantom, 0,
        "phantom events ({rolled_back_seen} of them rolled back)"
    );

    // Per aggregate, first deliveries in commit order.
    check_first_deliveries_in_order(&records)?;
    Ok(())
}
