//! Siphon with a Kafka-protocol broker other than Apache Kafka.
//!
//! Every other end-to-end test runs on Apache Kafka. Siphon talks to its broker only through the
//! Kafka protocol (librdkafka's producer and admin client), and brokers that implement the
//! protocol without being Apache Kafka answer some requests differently (topic creation, the
//! idempotent producer's state, metadata). This smoke test keeps one such broker working end to
//! end: Tansu ([`siphon_tests::tansu::TansuBroker`], its in-memory engine). Siphon creates its
//! topics there, streams a few outbox transactions (one rolled back among them), every committed
//! event arrives exactly once with the right topic, key, value and headers, and the slot follows
//! the broker's acknowledgements.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, current_insert_lsn, event, insert_transaction, record_id,
    siphon_config, start_streaming, wait_for_each_once, wait_for_slot_past, Event, Via, OUTBOX_DDL,
};
use siphon_tests::tansu::TansuBroker;
use siphon_tests::Postgres;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siphon_streams_outbox_events_to_tansu() -> Result<()> {
    let pg = Postgres::start()?;
    let tansu = TansuBroker::start()?;
    let target = Via {
        bootstrap: tansu.bootstrap(),
        namespace: String::new(),
    };
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = start_streaming(&client, &siphon_config(&pg, &target, "tansu", ""), "tansu")
        .await
        .with_context(|| format!("tansu log: {}", tansu.log_path().display()))?;

    // Three committed transactions of both aggregate types, and a rolled-back one.
    let mut committed: Vec<Event> = Vec::new();
    for (seqs, commit) in [
        (1..=5, true),
        (6..=9, false),
        (10..=16, true),
        (17..=24, true),
    ] {
        let events: Vec<Event> = seqs.map(|s| event(s, commit)).collect();
        insert_transaction(&mut client, &events, commit).await?;
        if commit {
            committed.extend(events);
        }
    }
    let end_of_last_commit = current_insert_lsn(&client).await?;
    let expected: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_each_once(&target, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    // Each record is its event: topic, key, value (PostgreSQL's jsonb text as a JSON string)
    // and the id header alone.
    let payloads: Vec<String> = committed.iter().map(|e| e.payload.clone()).collect();
    let canonical: Vec<String> = client
        .query(
            "SELECT p::jsonb::text FROM unnest($1::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n",
            &[&payloads],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let by_id: BTreeMap<&str, (&Event, &String)> = committed
        .iter()
        .zip(&canonical)
        .map(|(e, c)| (e.id.as_str(), (e, c)))
        .collect();
    for record in &records {
        let id = record_id(record);
        let (event, value) = by_id[id.as_str()];
        assert_eq!(
            record.topic,
            format!("outbox.event.{}", event.aggregatetype),
            "topic of {id}"
        );
        assert_eq!(
            record.key.as_deref(),
            Some(siphon_router::json_string(&event.aggregateid).as_slice()),
            "key of {id}"
        );
        assert_eq!(
            record.value.as_deref(),
            Some(siphon_router::json_string(value).as_slice()),
            "value of {id}"
        );
        assert_eq!(
            record.headers,
            vec![("id".to_owned(), Some(id.clone().into_bytes()))],
            "headers of {id}"
        );
    }
    check_first_deliveries_in_order(&records)?;

    // The broker's acknowledgements move the slot to the end of the last transaction.
    wait_for_slot_past(
        &client,
        "tansu",
        end_of_last_commit,
        Duration::from_secs(30),
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
