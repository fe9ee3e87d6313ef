//! End to end against a real PostgreSQL and a real Kafka-protocol broker: outbox rows in, the
//! exact records out, the slot confirmed only after the broker acknowledged them.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    current_insert_lsn, event, insert_transaction, siphon_config, slot_active, slot_confirmed_lsn,
    wait_for_slot_past, Event, OUTBOX_DDL,
};
use siphon_tests::{
    create_topic, read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres,
    SiphonProcess,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tokio_postgres::Client;

/// PostgreSQL's canonical text of each payload as jsonb (what pgoutput sends).
async fn canonical_jsonb(client: &Client, payloads: &[String]) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT p::jsonb::text FROM unnest($1::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n",
            &[&payloads],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Kafka Connect's JsonConverter (schemas.enable=false) writes a string as a JSON string literal,
/// escaped as Jackson escapes it (a character above U+FFFF as two `\uXXXX` surrogate escapes);
/// the router's escaper is checked against Debezium by the differential test.
fn json_string(text: &str) -> Vec<u8> {
    siphon_router::json_string(text)
}

async fn read_all(broker: &Broker, topics: &[&str]) -> Result<Vec<ConsumedRecord>> {
    let mut all = Vec::new();
    for topic in topics {
        all.extend(read_topic_async(&broker.bootstrap(), topic, Duration::from_secs(60)).await?);
    }
    Ok(all)
}

async fn wait_for_records(
    broker: &Broker,
    topics: &[&str],
    expected: usize,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    wait_for(timeout, Duration::from_millis(500), || async {
        let records = read_all(broker, topics).await?;
        anyhow::ensure!(
            records.len() <= expected,
            "{} records, more than the {expected} expected",
            records.len()
        );
        Ok((records.len() == expected).then_some(records))
    })
    .await
}

const TOPICS: [&str; 2] = ["outbox.event.Order", "outbox.event.Customer"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_arrive_exactly_and_in_order_and_the_slot_follows() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "spine", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { slot_active(&client, "spine").await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;

    // 100 committed transactions of 100 events, with 10 rolled-back ones in between.
    let mut committed = Vec::new();
    let mut seq = 0u64;
    for txn in 0..110u64 {
        let commit = txn % 11 != 5;
        let events: Vec<Event> = (0..100)
            .map(|_| {
                seq += 1;
                event(seq, commit)
            })
            .collect();
        insert_transaction(&mut client, &events, commit).await?;
        if commit {
            committed.extend(events);
        }
    }
    assert_eq!(committed.len(), 10_000);
    let end_of_last_commit = current_insert_lsn(&client).await?;

    let records = wait_for_records(&broker, &TOPICS, 10_000, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    // Exactly the committed events, each byte for byte.
    let payloads: Vec<String> = committed.iter().map(|e| e.payload.clone()).collect();
    let canonical = canonical_jsonb(&client, &payloads).await?;
    let expected: HashMap<&str, (&Event, &String)> = committed
        .iter()
        .zip(&canonical)
        .map(|(e, c)| (e.id.as_str(), (e, c)))
        .collect();
    let mut seen = BTreeSet::new();
    for record in &records {
        let id = String::from_utf8(
            record
                .header("id")
                .context("record without id header")?
                .to_vec(),
        )?;
        let (event, canonical) = expected
            .get(id.as_str())
            .with_context(|| format!("unexpected event {id} (rolled back?)"))?;
        assert!(seen.insert(id.clone()), "event {id} delivered twice");
        assert_eq!(
            record.topic,
            format!("outbox.event.{}", event.aggregatetype)
        );
        assert_eq!(
            record.key.as_deref(),
            Some(json_string(&event.aggregateid).as_slice()),
            "key of {id}"
        );
        assert_eq!(
            record.value.as_deref(),
            Some(json_string(canonical).as_slice()),
            "value of {id}"
        );
        assert_eq!(
            record.headers.len(),
            1,
            "only the id header: {:?}",
            record.headers
        );
    }
    assert_eq!(seen.len(), 10_000);

    // Per aggregate: one partition, and commit order.
    let mut by_aggregate: BTreeMap<(String, Vec<u8>), Vec<&ConsumedRecord>> = BTreeMap::new();
    for record in &records {
        by_aggregate
            .entry((record.topic.clone(), record.key.clone().unwrap_or_default()))
            .or_default()
            .push(record);
    }
    for ((topic, key), mut group) in by_aggregate {
        let partitions: BTreeSet<i32> = group.iter().map(|r| r.partition).collect();
        assert_eq!(
            partitions.len(),
            1,
            "{topic} key {:?} spread over {partitions:?}",
            String::from_utf8_lossy(&key)
        );
        group.sort_by_key(|r| r.offset);
        let seqs: Vec<u64> = group
            .iter()
            .map(|r| {
                expected
                    [std::str::from_utf8(r.header("id").unwrap_or_default()).unwrap_or_default()]
                .0
                .seq
            })
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{topic} key {:?} out of commit order: {seqs:?}",
            String::from_utf8_lossy(&key)
        );
    }

    // The slot follows the acknowledgements to the end of the last transaction.
    wait_for_slot_past(
        &client,
        "spine",
        end_of_last_commit,
        Duration::from_secs(30),
    )
    .await
    .context("confirmed_flush_lsn did not reach the end of the last transaction")?;

    // A graceful stop, then a restart: nothing is sent again.
    siphon.terminate()?;
    let status = siphon.wait_exit(Duration::from_secs(30))?;
    assert!(
        status.success(),
        "siphon exit status {status:?}; log:\n{}",
        siphon.log()
    );
    siphon.start_again()?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { slot_active(&client, "spine").await },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = read_all(&broker, &TOPICS).await?;
    assert_eq!(
        again.len(),
        10_000,
        "a restart after the acknowledgements must not repeat records"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_waits_for_the_broker_and_nothing_is_lost() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "outage", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { slot_active(&client, "outage").await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;

    // One delivered transaction first.
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    wait_for_records(&broker, &["outbox.event.Order"], 1, Duration::from_secs(60)).await?;

    // The broker goes away before the next transactions can be delivered.
    broker.kill()?;
    insert_transaction(&mut client, &[event(2, true)], true).await?;
    let end_of_first_undelivered = current_insert_lsn(&client).await?;
    for seq in 3..=6 {
        insert_transaction(&mut client, &[event(seq * 3 + 1, true)], true).await?;
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let confirmed = slot_confirmed_lsn(&client, "outage").await?.unwrap_or(0);
        assert!(
            confirmed < end_of_first_undelivered,
            "slot confirmed {confirmed:X} past an undelivered transaction ending at {end_of_first_undelivered:X}"
        );
    }

    // The broker returns empty (in-memory storage): every undelivered event still arrives.
    broker.start_again()?;
    // A real broker keeps its topics across a restart; this one starts empty, so the topic is
    // created again as it was (otherwise the producer waits for it to appear).
    create_topic(&broker.bootstrap(), "outbox.event.Order", 3).await?;
    let expected: BTreeSet<String> = [2u64, 10, 13, 16, 19]
        .iter()
        .map(|&s| event(s, true).id)
        .collect();
    let ids = wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let records = read_all(&broker, &["outbox.event.Order"]).await?;
            let ids: BTreeSet<String> = records
                .iter()
                .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
                .collect();
            Ok(expected.is_subset(&ids).then_some(ids))
        },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    // The first event was delivered before the outage; a repeat of it is allowed, nothing else.
    let mut allowed = expected.clone();
    allowed.insert(event(1, true).id);
    assert!(
        ids.is_subset(&allowed),
        "unexpected events: {:?}",
        ids.difference(&allowed).collect::<Vec<_>>()
    );
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, "outage", end, Duration::from_secs(30))
        .await
        .context("the slot did not move on after delivery")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discard_sink_acknowledges_without_sending() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "discard", "").replace(
        "[kafka.properties]",
        "sink = \"discard\"\n\n[kafka.properties]",
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "discard").await },
    )
    .await?;
    let events: Vec<Event> = (1..=50).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &events, true).await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, "discard", end, Duration::from_secs(30)).await?;
    assert!(
        siphon.log().contains("discard"),
        "the mode is announced in the log"
    );
    assert!(siphon_tests::list_topics(&broker.bootstrap())?
        .iter()
        .all(|t| !t.starts_with("outbox.")));
    Ok(())
}
