//! Order per aggregate when a Produce request of a replaced producer reaches the broker late.
//!
//! The Kafka-mode fault proxy holds one Produce request (the batch holding a marked event) of
//! Siphon's producer: the broker does not see it and the producer gets no answer. Its records
//! (or those queued behind them) time out, so the session fences, purges and replaces the
//! producer, and the replacement sends them again, followed by newer events of the same
//! aggregates. Only then does the proxy hand
//! the held request to the broker, which writes the old batch after everything written
//! meanwhile. Per key, the first delivery of every event must still be in commit order, every
//! committed event must arrive, and the late copies must be the same records (same `id`).

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, record_id, record_seq, siphon_config_at, slot_active,
    OUTBOX_DDL,
};
use siphon_tests::proxy::{ProduceFault, ProxiedBroker};
use siphon_tests::{create_topic, SiphonProcess};
use siphon_tests::{read_topic_async, wait_for, wait_until, ConsumedRecord, Postgres};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The topic of every event (in the test's namespace: `broker.topic(ORDERS)`).
const ORDERS: &str = "outbox.event.Order";
/// The event whose batch the proxy holds.
const MARKER: &str = "LATE-WRITE-5c1e";
/// The sequence number of the marked event.
const MARKED_SEQ: u64 = 40;
/// Aggregates the events are spread over (so each key sees many events).
const AGGREGATES: u64 = 4;
/// Events per transaction.
const PER_TXN: u64 = 3;
/// The log line Siphon writes each time it replaces its producer.
const REBUILD_LINE: &str = "Kafka producer failed; replacing it";

fn id(seq: u64) -> String {
    format!("00000000-0000-4000-8000-{seq:012}")
}

/// One transaction of `PER_TXN` events starting at `first`.
async fn write_transaction(client: &tokio_postgres::Client, first: u64) -> Result<()> {
    let mut sql = String::from("BEGIN;");
    for seq in first..first + PER_TXN {
        let mark = if seq == MARKED_SEQ { MARKER } else { "" };
        sql.push_str(&format!(
            "INSERT INTO outbox VALUES ('{}', 'Order', 'order-{}', 'Event', \
             '{{\"seq\": {seq}, \"mark\": \"{mark}\"}}');",
            id(seq),
            seq % AGGREGATES
        ));
    }
    sql.push_str("DELETE FROM outbox; COMMIT;");
    client.batch_execute(&sql).await?;
    Ok(())
}

/// Writes transactions every 30 ms until `stop`; returns the highest sequence number written.
async fn stream_events(
    client: tokio_postgres::Client,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
) -> Result<()> {
    let mut next = 1;
    while !stop.load(Ordering::Relaxed) {
        write_transaction(&client, next).await?;
        next += PER_TXN;
        written.store(next - 1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    Ok(())
}

async fn read_orders(bootstrap: &str, topic: &str) -> Result<Vec<ConsumedRecord>> {
    read_topic_async(bootstrap, topic, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_a_replaced_producer_written_late_keeps_first_deliveries_in_order(
) -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let slot = "late";
    let topic = broker.topic(ORDERS);
    // A short delivery timeout: the held request's records time out after 3 s.
    let config = siphon_config_at(&pg, &broker, slot, "\"message.timeout.ms\" = \"3000\"", "");
    // The topic exists, with a leader, before Siphon's first Produce: the broker's answer to a
    // Produce that reaches a partition before its leader is ready names the broker's own
    // address, which would take the producer past the proxy.
    create_topic(&broker.broker().bootstrap(), &topic, 3).await?;
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, slot).await },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    broker
        .proxy()
        .set_produce_fault(Some(ProduceFault::hold(&topic).marker(MARKER.as_bytes())));
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn(stream_events(
        pg.connect().await?,
        Arc::clone(&stop),
        Arc::clone(&written),
    ));

    // One request held; the resend of its records must reach the broker.
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(5),
        || async { Ok(broker.proxy().held_requests() > 0) },
    )
    .await
    .with_context(|| format!("no request was held; siphon log:\n{}", siphon.log()))?;
    broker.proxy().set_produce_fault(None);
    let held_at = written.load(Ordering::Relaxed);

    // The held records time out; the producer is replaced and the replacement sends them
    // again, then newer events of the same aggregates.
    siphon
        .wait_for_log(REBUILD_LINE, Duration::from_secs(30))
        .await?;
    let bootstrap = broker.bootstrap();
    let newer = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let records = read_orders(&bootstrap, &topic).await?;
            let seqs: BTreeSet<u64> = records.iter().filter_map(record_seq).collect();
            // 30 events written after the hold are in.
            Ok((held_at + 1..=held_at + 30)
                .all(|s| seqs.contains(&s))
                .then_some(records.len()))
        },
    )
    .await
    .with_context(|| format!("the replacement did not deliver; log:\n{}", siphon.log()))?;

    // Now the broker writes the old producer's batch, after all of that.
    let answers =
        tokio::task::block_in_place(|| broker.proxy().release_held(Duration::from_secs(10)))?;
    let codes: Vec<i16> = answers
        .iter()
        .flatten()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    eprintln!("{newer} records in {topic} before the late write; broker answered {codes:?}");

    // A little more streaming after the late write, then stop and wait for everything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await??;
    let last = written.load(Ordering::Relaxed);
    let expected: BTreeSet<String> = (1..=last).map(id).collect();
    let records = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let records = read_orders(&bootstrap, &topic).await?;
            let ids: BTreeSet<String> = records.iter().map(record_id).collect();
            Ok(expected.is_subset(&ids).then_some(records))
        },
    )
    .await
    .with_context(|| format!("not every committed event arrived; log:\n{}", siphon.log()))?;

    let log = siphon.log();
    // Nothing that was never written.
    let phantom: Vec<String> = records
        .iter()
        .map(record_id)
        .filter(|id| !expected.contains(id))
        .collect();
    assert!(phantom.is_empty(), "events never written: {phantom:?}");
    // Every copy of an event is the same record.
    let mut copies: BTreeMap<String, Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in &records {
        copies.entry(record_id(r)).or_default().push(r);
    }
    for (id, same) in &copies {
        for r in &same[1..] {
            assert!(
                r.key == same[0].key && r.value == same[0].value,
                "copies of {id} differ"
            );
        }
    }
    // The late write happened: the marked event is there twice, its late copy after a newer
    // event of its key.
    assert!(
        codes.iter().all(|c| *c == 0) && !codes.is_empty(),
        "the broker did not write the released request: {codes:?}"
    );
    let marked = &copies[&id(MARKED_SEQ)];
    assert!(
        marked.len() >= 2,
        "the marked event was written once only; log:\n{log}"
    );
    let late = marked
        .iter()
        .max_by_key(|r| r.offset)
        .context("a copy of the marked event")?;
    let overtaken = records.iter().any(|r| {
        r.key == late.key
            && r.partition == late.partition
            && r.offset < late.offset
            && record_seq(r).is_some_and(|s| s > MARKED_SEQ)
    });
    assert!(
        overtaken,
        "the released request was not written after newer events of its key"
    );
    let rebuilds = log.matches(REBUILD_LINE).count();
    eprintln!(
        "{} records for {} events, {rebuilds} producer replacement(s)",
        records.len(),
        expected.len()
    );
    check_first_deliveries_in_order(&records).with_context(|| format!("siphon log:\n{log}"))?;
    assert!(siphon.is_running(), "{log}");
    Ok(())
}
