//! End to end against a real PostgreSQL and a real Kafka: outbox rows in, the exact records
//! out, the slot confirmed only after the broker acknowledged them.
//!
//! The tests that kill the broker run a Kafka node of their own. Kafka keeps its data across
//! `kill -9`; a broker that comes back empty is one whose data directory was wiped and
//! formatted again with the same cluster and node id (disks replaced) before it starts again.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    current_insert_lsn, event, insert_transaction, siphon_config, siphon_config_at, slot_active,
    slot_confirmed_lsn, start_streaming, wait_for_slot_past, Event, OUTBOX_DDL,
};
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
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

/// Every record of `topics` (names in the test's namespace).
async fn read_all(broker: &Broker, topics: &[&str]) -> Result<Vec<ConsumedRecord>> {
    let mut all = Vec::new();
    for topic in topics {
        all.extend(
            read_topic_async(
                &broker.bootstrap(),
                &broker.topic(topic),
                Duration::from_secs(60),
            )
            .await?,
        );
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

/// Settings of a broker of the test's own that is killed and started again: after `kill -9` a
/// node registers with its controller again only once its previous run's session has expired
/// (`broker.session.timeout.ms`, 9 s by default), so 3 s (heartbeats every 500 ms, as in the
/// three-node cluster) brings it back in a few seconds rather than a dozen.
const QUICK_REREGISTRATION: [(&str, &str); 2] = [
    ("broker.session.timeout.ms", "3000"),
    ("broker.heartbeat.interval.ms", "500"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_arrive_exactly_and_in_order_and_the_slot_follows() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon =
        start_streaming(&client, &siphon_config(&pg, &broker, "spine", ""), "spine").await?;

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
            broker.topic(&format!("outbox.event.{}", event.aggregatetype))
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

/// An acknowledged transaction reaches the slot's `confirmed_flush_lsn` within a fraction of a
/// second, not at the next status interval (here 30 s, half of `wal_sender_timeout`, so the
/// server's own requests for a reply do not come sooner either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_transaction_reaches_the_slot_long_before_the_status_interval() -> Result<()>
{
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "prompt", "")
        .replace("status_interval_ms = 200", "status_interval_ms = 30000");
    assert!(config.contains("status_interval_ms = 30000"));
    let siphon = start_streaming(&client, &config, "prompt").await?;
    for round in 0..3u64 {
        let events: Vec<Event> = (0..10).map(|i| event(round * 10 + i + 1, true)).collect();
        insert_transaction(&mut client, &events, true).await?;
        let end = current_insert_lsn(&client).await?;
        let committed = std::time::Instant::now();
        wait_for_slot_past(&client, "prompt", end, Duration::from_secs(5))
            .await
            .with_context(|| format!("round {round}; siphon log:\n{}", siphon.log()))?;
        assert!(
            committed.elapsed() < Duration::from_secs(5),
            "round {round}: confirmed after {:?}",
            committed.elapsed()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_waits_for_the_broker_and_nothing_is_lost() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start_own(&QUICK_REREGISTRATION)?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = start_streaming(
        &client,
        &siphon_config(&pg, &broker, "outage", ""),
        "outage",
    )
    .await?;

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
    // 3 s, 15 status intervals: a slot confirmed on reading rather than on the broker's
    // acknowledgement would be past the transactions within one.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let confirmed = slot_confirmed_lsn(&client, "outage").await?.unwrap_or(0);
        assert!(
            confirmed < end_of_first_undelivered,
            "slot confirmed {confirmed:X} past an undelivered transaction ending at {end_of_first_undelivered:X}"
        );
    }

    // The broker returns with its data: every undelivered event still arrives.
    broker.start_again()?;
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

/// How a killed broker comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comeback {
    /// With its data: Kafka keeps every topic, record and producer state across `kill -9`.
    WithItsData,
    /// With empty disks ([`siphon_tests::KafkaNode::wipe_data`]): no topic, no record, no
    /// producer state.
    Empty,
}

/// A broker outage longer than the delivery deadline, with a window smaller than what is
/// committed meanwhile: the deadline replaces the producer while the broker is away, and once the
/// broker is back every event still arrives, the slot never confirmed past one undelivered.
///
/// `before` numbers the events delivered before the outage, `outage` those committed during it
/// (see [`event`] for their topics).
async fn outage_past_the_delivery_deadline(
    comeback: Comeback,
    slot: &str,
    before: &[u64],
    outage: &[u64],
) -> Result<()> {
    outage_with_deadline(comeback, slot, before, outage, None).await?;
    Ok(())
}

/// Like [`outage_past_the_delivery_deadline`] (whose delivery deadline is 5 s: it fires a few
/// seconds into the outage); with `long: Some((deadline, bound))` the delivery deadline is
/// `deadline`, the broker is started again 2 s after Siphon's broker probe found it unreachable
/// (before the deadline), and every event must arrive within `bound` of its return. Returns
/// Siphon's log.
async fn outage_with_deadline(
    comeback: Comeback,
    slot: &str,
    before: &[u64],
    outage: &[u64],
    long: Option<(Duration, Duration)>,
) -> Result<String> {
    let timeout_ms = long.map_or(5_000, |(d, _)| d.as_millis());
    let bound = long.map_or(Duration::from_secs(60), |(_, b)| b);
    let pg = Postgres::start()?;
    // A topic the broker creates itself (auto.create.topics.enable, on a producer's metadata
    // request) gets the partitions Siphon created it with: so does one an empty broker creates
    // again (with Kafka's default of one, records already given a partition it no longer has
    // would be refused, and Siphon stops).
    let broker =
        Broker::start_own(&[QUICK_REREGISTRATION.as_slice(), &[("num.partitions", "3")]].concat())?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config_at(
        &pg,
        &broker,
        slot,
        // librdkafka drops a topic's partitions (failing its queued records) when a metadata
        // answer says the topic does not exist more than topic.metadata.propagation.max.ms
        // after the topic last changed for the producer: an empty broker that has not created
        // the topic again yet, on a slow machine. That is the deleted-topic path
        // (broker_faults.rs `topic_deleted_while_writing`), not what these outages test.
        // Reconnection attempts at most 1 s apart (librdkafka backs off up to 10 s by default):
        // the producer finds the returned broker within a second, whenever its last attempt was.
        &format!(
            "\"message.timeout.ms\" = \"{timeout_ms}\"\n\
             \"topic.metadata.propagation.max.ms\" = \"180000\"\n\
             \"reconnect.backoff.max.ms\" = \"1000\""
        ),
        "max_in_flight_records = 5",
    );
    let siphon = start_streaming(&client, &config, slot).await?;
    for &seq in before {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
    }
    let topics = if before.iter().any(|s| s % 3 == 0) {
        &TOPICS[..]
    } else {
        &TOPICS[..1]
    };
    wait_for_records(&broker, topics, before.len(), Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    // The broker goes away; more transactions than the window are committed meanwhile. Each
    // event's transaction ends at or before the position recorded after it.
    broker.kill()?;
    if comeback == Comeback::Empty {
        // Its disks are replaced while it is down.
        broker.own_node()?.wipe_data()?;
    }
    let mut ends: Vec<(String, u64)> = Vec::new();
    for &seq in outage {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
        ends.push((event(seq, true).id, current_insert_lsn(&client).await?));
    }
    let first_undelivered = ends[0].1;
    if long.is_none() {
        // The delivery deadline fires while the broker is away and the producer is replaced.
        siphon
            .wait_for_log(REPLACED_LINE, Duration::from_secs(40))
            .await
            .with_context(|| format!("no producer replacement; siphon log:\n{}", siphon.log()))?;
    } else {
        // Siphon sees the broker gone (its probe runs every 2 s), as it would a long outage.
        wait_until(
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async { brokers_unreachable(&siphon) },
        )
        .await
        .with_context(|| format!("the outage went unnoticed; siphon log:\n{}", siphon.log()))?;
    }
    // The replacement producer (or the first one) has taken the records and failed to reach
    // the broker too: a refused connection fails at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let confirmed = slot_confirmed_lsn(&client, slot).await?.unwrap_or(0);
    assert!(
        confirmed < first_undelivered,
        "slot confirmed {confirmed:X} past an undelivered transaction ending at {first_undelivered:X}"
    );

    // An empty broker has lost the topics written before: the producer's first metadata
    // request has the broker create them again, as they were.
    broker.start_again()?;
    let back = std::time::Instant::now();
    // The events delivered before the outage: an empty broker lost them, one with its data
    // keeps them; a repeat is allowed.
    let mut expected: BTreeSet<String> = outage.iter().map(|&s| event(s, true).id).collect();
    if comeback == Comeback::WithItsData {
        expected.extend(before.iter().map(|&s| event(s, true).id));
    }
    let ids = wait_for(bound, Duration::from_secs(1), || async {
        // The slot is read first: whatever it confirmed was acknowledged before the read below.
        let confirmed = slot_confirmed_lsn(&client, slot).await?.unwrap_or(0);
        let records = read_all(&broker, &TOPICS).await?;
        let ids: BTreeSet<String> = records
            .iter()
            .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
            .collect();
        for (id, end) in &ends {
            assert!(
                *end > confirmed || ids.contains(id),
                "slot confirmed {confirmed:X} past event {id} (ending at {end:X}) which is not in the topic"
            );
        }
        Ok(expected.is_subset(&ids).then_some(ids))
    })
    .await
    .with_context(|| {
        format!(
            "not every event arrived within {bound:?} of the broker's return; siphon log:\n{}",
            siphon.log()
        )
    })?;
    let mut allowed = expected.clone();
    allowed.extend(before.iter().map(|&s| event(s, true).id));
    assert!(
        ids.is_subset(&allowed),
        "unexpected events: {:?}",
        ids.difference(&allowed).collect::<Vec<_>>()
    );
    eprintln!(
        "every event arrived {:?} after the broker's return",
        back.elapsed()
    );
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, slot, end, Duration::from_secs(30))
        .await
        .context("the slot did not move on after delivery")?;
    Ok(siphon.log())
}

/// The log line Siphon writes each time it replaces its producer.
const REPLACED_LINE: &str = "Kafka producer failed; replacing it";

/// Whether Siphon's broker probe last found the brokers unreachable (its
/// `siphon_broker_reachable` metric is 0).
fn brokers_unreachable(siphon: &SiphonProcess) -> Result<bool> {
    let port: u16 = siphon
        .metrics_address()
        .and_then(|address| address.rsplit_once(':')?.1.parse().ok())
        .context("no metrics address in the log")?;
    let (_, body) = siphon_tests::http::get(port, "/metrics")?;
    Ok(siphon_tests::http::metric(&body, "siphon_broker_reachable") == Some(0.0))
}

/// 26 events of one topic, which Siphon created before the outage.
fn known_topic_events() -> Vec<u64> {
    (1..=26).map(|n| n * 3 + 1).collect()
}

/// 26 events of two topics, one of them new to Siphon during the outage.
fn new_topic_events() -> Vec<u64> {
    (2..=27).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_replaced_during_an_outage_delivers_once_the_broker_is_back() -> Result<()> {
    outage_past_the_delivery_deadline(
        Comeback::WithItsData,
        "replaced_kept",
        &[1],
        &known_topic_events(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_replaced_during_an_outage_delivers_once_an_empty_broker_is_back() -> Result<()>
{
    outage_past_the_delivery_deadline(
        Comeback::Empty,
        "replaced_empty",
        &[1],
        &known_topic_events(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_new_during_an_outage_holds_up_nothing_and_is_created_once_the_broker_is_back(
) -> Result<()> {
    outage_past_the_delivery_deadline(
        Comeback::WithItsData,
        "new_topic_kept",
        &[1],
        &new_topic_events(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_new_during_an_outage_is_created_once_an_empty_broker_is_back() -> Result<()> {
    outage_past_the_delivery_deadline(
        Comeback::Empty,
        "new_topic_empty",
        &[1],
        &new_topic_events(),
    )
    .await
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
    let outbox_topics = broker.topic("outbox.");
    assert!(siphon_tests::list_topics(&broker.bootstrap())?
        .iter()
        .all(|t| !t.starts_with(&outbox_topics)));
    Ok(())
}

/// The delivery deadline of [`an_outage_shorter_than_the_delivery_deadline`].
const LONG_DEADLINE: Duration = Duration::from_secs(90);

/// An outage shorter than the delivery deadline (the broker is started again 2 s after Siphon
/// found it unreachable, the deadline is 90 s, room for a slow machine's broker start):
/// everything arrives well before the deadline, without replacing the producer, whether the
/// broker comes back with its data (it kept the producer's id and sequence numbers) or empty.
/// An empty broker has forgotten the producer, but Kafka takes the sequence numbers of a
/// producer it has no state for as they come (the state of a producer whose records were all
/// deleted is gone the same way), so the records the producer had queued are written as soon
/// as it reconnects; the topic it writes to is created again by the broker.
async fn an_outage_shorter_than_the_delivery_deadline(
    comeback: Comeback,
    slot: &str,
) -> Result<()> {
    let log = outage_with_deadline(
        comeback,
        slot,
        &[1],
        &known_topic_events(),
        Some((LONG_DEADLINE, LONG_DEADLINE - Duration::from_secs(20))),
    )
    .await?;
    assert!(
        !log.contains(REPLACED_LINE),
        "the producer was replaced; log:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_shorter_than_the_delivery_deadline_needs_no_replacement() -> Result<()> {
    an_outage_shorter_than_the_delivery_deadline(Comeback::WithItsData, "short_kept").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_forgot_the_producer_is_written_to_without_a_replacement() -> Result<()> {
    an_outage_shorter_than_the_delivery_deadline(Comeback::Empty, "short_empty").await
}

/// A record waits for its topic to be created while the brokers are gone: the creation runs
/// beside the session loop, so SIGTERM stops Siphon within its shutdown timeout (not once the
/// creation gave up), and the slot is not confirmed past the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_topic_waits_to_be_created_stops_within_the_shutdown_timeout() -> Result<()>
{
    let pg = Postgres::start()?;
    let broker = Broker::start_own(&[])?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "creating", "")
        .replace("shutdown_timeout_secs = 20", "shutdown_timeout_secs = 3");
    let siphon = start_streaming(&client, &config, "creating").await?;
    broker.kill()?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    // Read and waiting for its topic by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = std::time::Instant::now();
    siphon.terminate()?;
    siphon
        .wait_exit(Duration::from_secs(15))
        .context("siphon did not stop within its shutdown timeout")?;
    eprintln!("stopped {:?} after SIGTERM", asked.elapsed());
    let confirmed = slot_confirmed_lsn(&client, "creating").await?.unwrap_or(0);
    assert!(
        confirmed < end,
        "slot confirmed {confirmed:X} past the undelivered transaction ending at {end:X}"
    );
    Ok(())
}
