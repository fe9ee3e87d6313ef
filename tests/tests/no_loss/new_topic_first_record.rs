//! A producer's first request to a partition that fails with a retriable error is never taken
//! for written because a later request succeeded.
//!
//! A broker that knows nothing of a producer on a partition accepts any first sequence number.
//! So when a new producer's first request to a partition is answered `NOT_LEADER_OR_FOLLOWER`
//! (a partition whose leader has been assigned but has not taken up the leadership yet: every
//! new topic for a moment, every leader change) while its second request is already in flight,
//! the broker can write the second one alone. librdkafka then takes the first request's records
//! as written ("implicitly acked by subsequent batch success") and reports them delivered,
//! although Kafka never wrote them: with the slot confirmed past them, they are lost. This was
//! seen on a freshly started Kafka, on the first records of a topic Siphon had just created.
//!
//! Siphon keeps one request in flight per broker connection, so a later request is only sent
//! once the earlier one is answered, and a failed one is sent again first. The test makes the
//! race certain with the Kafka-mode proxy: it answers the first request
//! `NOT_LEADER_OR_FOLLOWER`, half a second late, while it forwards whatever comes after.

use anyhow::{Context as _, Result};
use siphon_tests::outbox::{
    current_insert_lsn, siphon_config, start_streaming, wait_for_slot_past, OUTBOX_DDL,
};
use siphon_tests::proxy::{ProduceFault, ProxiedBroker};
use siphon_tests::{create_topic, read_topic_async, Postgres};
use std::collections::BTreeSet;
use std::time::Duration;

/// `NOT_LEADER_OR_FOLLOWER`.
const NOT_LEADER: i16 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_request_is_not_taken_for_written_by_a_later_success() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start()?;
    let topic = broker.topic("outbox.event.Order");
    // The topic exists with its leaders in place: only the proxy's answer fails.
    create_topic(&broker.broker().bootstrap(), &topic, 3).await?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = start_streaming(
        &client,
        &siphon_config(&pg, &broker, "firstreq", ""),
        "firstreq",
    )
    .await?;

    let first = "00000000-0000-4000-8000-000000000001";
    let second = "00000000-0000-4000-8000-000000000002";
    broker.proxy().set_produce_fault(Some(
        ProduceFault::new(&topic, NOT_LEADER)
            .marker(first.as_bytes())
            .once()
            .answer_after(Duration::from_millis(500)),
    ));
    for (id, step) in [(first, 1), (second, 2)] {
        client
            .batch_execute(&format!(
                "BEGIN;
                 INSERT INTO outbox VALUES ('{id}', 'Order', 'order-1', 'Step', '{{\"step\": {step}}}');
                 DELETE FROM outbox;
                 COMMIT;"
            ))
            .await?;
        // The second transaction is read while the first request waits for its answer.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, "firstreq", end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    anyhow::ensure!(
        broker.proxy().faults_injected() == 1,
        "the proxy answered {} requests itself, not one: the test proved nothing",
        broker.proxy().faults_injected()
    );

    // The slot passed both events: both must be in Kafka (read from the broker directly).
    let records = read_topic_async(
        &broker.broker().bootstrap(),
        &topic,
        Duration::from_secs(30),
    )
    .await?;
    let ids: BTreeSet<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect();
    let missing: Vec<&str> = [first, second]
        .into_iter()
        .filter(|id| !ids.contains(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "confirmed to PostgreSQL but not in Kafka: {missing:?}\nsiphon log:\n{}",
        siphon.log()
    );
    Ok(())
}
