//! `kafka.delivery = "exactly-once"` on a real broker: Kafka transactions around whole
//! PostgreSQL transactions, each ending with a progress record, and a new session that skips
//! what the last committed progress covers.
//!
//! - Across `kill -9`: a read_committed consumer sees every committed event exactly once (and
//!   none rolled back), first deliveries in commit order per aggregate; a read_uncommitted
//!   consumer sees the repeats that aborted transactions left in the log (what at-least-once
//!   delivery would have shown to everyone).
//! - One PostgreSQL transaction split over hundreds of Kafka transactions, killed inside it:
//!   each event once, memory bounded by the window, not by the transaction.
//! - A zombie: a Siphon frozen with an open transaction while a second one takes the slot is
//!   fenced when it wakes: nothing it wrote after the second one started becomes visible.
//! - A transaction coordinator slow to register the producer: the stream, already holding the
//!   slot, keeps its status updates going, and the server keeps the connection.
//! - A commit the coordinator completed, answered to the producer as failed (retriable, fatal,
//!   abortable): each event once, nothing sent again after the session that failed.
//! - The progress topic given more partitions (the source's key then hashes to another one):
//!   `siphon status` and the next session read the newest progress.
//! - The progress topic and the state topic deleted while Siphon streams: created again
//!   compacted, nothing lost.

use anyhow::{Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use siphon_tests::kafka_protocol::{END_TXN, INIT_PRODUCER_ID};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, event, exactly_once_config, insert_transaction,
    read_event_records_isolated, siphon_config_at, slot_active, start_streaming, wait_for_all,
    wait_for_slot_caught_up, with_exactly_once, Event, OUTBOX_DDL,
};
use siphon_tests::partition::partition_for_key;
use siphon_tests::proxy::ProxiedBroker;
use siphon_tests::{
    list_topics, read_topic_isolated, wait_until, Broker, Isolation, Postgres, SiphonProcess,
};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_postgres::Client;

/// Commits `transactions` transactions of 1 to 20 events (and one rolled back in ten) from
/// event `first` on, pausing `pause` between them; returns the committed and the rolled-back
/// events.
async fn write(
    mut client: Client,
    first: u64,
    transactions: u64,
    pause: Duration,
) -> Result<(Vec<Event>, Vec<Event>)> {
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    let mut seq = first;
    for txn in 0..transactions {
        let events: Vec<Event> = (0..1 + (txn * 7) % 20)
            .map(|_| {
                seq += 1;
                event(seq, txn % 10 != 9)
            })
            .collect();
        let commit = txn % 10 != 9;
        insert_transaction(&mut client, &events, commit).await?;
        if commit {
            committed.extend(events);
        } else {
            rolled_back.extend(events);
        }
        tokio::time::sleep(pause).await;
    }
    Ok((committed, rolled_back))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_committed_consumer_sees_every_event_once_across_kill_9() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&exactly_once_config(&pg, &broker, "eos"))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "eos").await },
    )
    .await
    .with_context(|| siphon.log())?;

    let writer = tokio::spawn(write(
        pg.connect().await?,
        0,
        120,
        Duration::from_millis(25),
    ));
    for pause in [700u64, 900, 1_100, 600] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        siphon.kill9()?;
        siphon.start_again()?;
    }
    let (committed, rolled_back) = writer.await??;
    let expected: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    // Once more after everything arrived: a restart that finds it all committed sends nothing.
    wait_for_slot_caught_up(&client, "eos").await?;
    siphon.kill9()?;
    siphon.start_again()?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "eos").await },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let committed_view = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    let seen = count_by_id(&committed_view);
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "read_committed saw repeats: {repeated:?}"
    );
    let ids: BTreeSet<String> = seen.keys().cloned().collect();
    assert_eq!(
        ids, expected,
        "read_committed sees exactly the committed events"
    );
    for event in &rolled_back {
        assert!(
            !seen.contains_key(&event.id),
            "rolled back {} seen",
            event.id
        );
    }
    check_first_deliveries_in_order(&committed_view)?;
    for record in &committed_view {
        assert!(
            record.header("siphon.position").is_some(),
            "exactly-once records carry their position: {record:?}"
        );
    }
    let uncommitted_view = read_event_records_isolated(&broker, Isolation::ReadUncommitted).await?;
    eprintln!(
        "{} events; read_committed {} records; read_uncommitted {} records (repeats in aborted transactions: {})",
        expected.len(),
        committed_view.len(),
        uncommitted_view.len(),
        uncommitted_view.len() - committed_view.len()
    );
    assert!(uncommitted_view.len() >= committed_view.len());
    assert!(
        siphon
            .log()
            .contains("resuming after the last committed progress"),
        "{}",
        siphon.log()
    );

    // After a graceful stop `siphon status` shows the mode and the committed progress.
    let (more, _) = write(pg.connect().await?, 10_000, 5, Duration::from_millis(10)).await?;
    let more: BTreeSet<String> = more.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &more, Duration::from_secs(60)).await?;
    siphon.terminate()?;
    siphon.wait_exit(Duration::from_secs(30))?;
    // (Unhealthy, with nothing streaming: the exit status says so.)
    let (_, said) = siphon.command("status")?;
    assert!(said.contains("delivery: exactly-once"), "{said}");
    assert!(said.contains("committed progress: "), "{said}");
    assert!(!said.contains("committed progress: none"), "{said}");
    let seen = count_by_id(&read_event_records_isolated(&broker, Isolation::ReadCommitted).await?);
    assert!(seen.values().all(|n| *n == 1), "repeats after the stop");
    Ok(())
}

/// Exactly-once with `on_error = "dead-letter"`: a record too large for the producer is refused
/// at enqueue and its dead letter joins the open Kafka transaction; across `kill -9`, a
/// read_committed consumer sees each small event once in its topic and each large one once in
/// the dead-letter topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_committed_with_their_transaction_once() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let config = exactly_once_config(&pg, &broker, "eosdlq")
        .replace(
            "\"message.timeout.ms\" = \"10000\"",
            "\"message.timeout.ms\" = \"10000\"\n\"message.max.bytes\" = \"20000\"",
        )
        .replace(
            "max_in_flight_records = 500",
            &format!(
                "max_in_flight_records = 500\non_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""
            ),
        );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "eosdlq").await },
    )
    .await
    .with_context(|| siphon.log())?;

    // Each transaction: three small events around one of 30 kB.
    let mut writer_client = pg.connect().await?;
    let writer = tokio::spawn(async move {
        let (mut small, mut large) = (BTreeSet::new(), BTreeSet::new());
        for txn in 0..40u64 {
            let mut events: Vec<Event> = (0..4).map(|i| event(txn * 4 + i + 1, true)).collect();
            events[1].payload = format!(r#"{{"big": "{}"}}"#, "x".repeat(30_000));
            for (i, e) in events.iter().enumerate() {
                if i == 1 {
                    large.insert(e.id.clone());
                } else {
                    small.insert(e.id.clone());
                }
            }
            insert_transaction(&mut writer_client, &events, true).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok((small, large))
    });
    for pause in [600u64, 700] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        siphon.kill9()?;
        siphon.start_again()?;
    }
    let (small, large) = writer.await??;
    wait_for_all(&broker, &small, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    wait_for_slot_caught_up(&client, "eosdlq").await?;
    let events =
        count_by_id(&read_event_records_isolated(&broker, Isolation::ReadCommitted).await?);
    assert!(events.values().all(|n| *n == 1), "repeats: {events:?}");
    assert_eq!(events.keys().cloned().collect::<BTreeSet<_>>(), small);
    let dead = siphon_tests::read_topic_settled_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(60),
    )
    .await?;
    let dead = count_by_id(&dead);
    assert!(
        dead.values().all(|n| *n == 1),
        "dead letters repeated: {dead:?}"
    );
    assert_eq!(
        dead.keys().cloned().collect::<BTreeSet<_>>(),
        large,
        "{}",
        siphon.log()
    );
    Ok(())
}

/// Events of the transaction [`insert_one_large_transaction`] commits.
const LARGE_TRANSACTION_EVENTS: u64 = 40_000;

/// Commits one transaction of [`LARGE_TRANSACTION_EVENTS`] events (ids as [`event`] numbers
/// them, 1 ..= N; 17 aggregates of each type) whose payloads carry 1,000 bytes each: about
/// 45 MB of records, written with one statement.
async fn insert_one_large_transaction(client: &Client) -> Result<()> {
    client
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             SELECT ('00000000-0000-4000-8000-' || lpad(s::text, 12, '0'))::uuid,
                    CASE WHEN s % 3 = 0 THEN 'Customer' ELSE 'Order' END,
                    CASE WHEN s % 3 = 0 THEN 'customer-' ELSE 'order-' END || (s % 17),
                    'Event',
                    jsonb_build_object('seq', s, 'pad', repeat('x', 1000))
             FROM generate_series(1, {LARGE_TRANSACTION_EVENTS}) AS s;
             DELETE FROM outbox;
             COMMIT;"
        ))
        .await
        .context("inserting one large transaction")
}

/// One PostgreSQL transaction far larger than the in-flight window and than a Kafka
/// transaction's byte bound is split over hundreds of Kafka transactions. Killed with -9 once
/// some of them committed, the next session resumes inside the PostgreSQL transaction: a
/// read_committed consumer sees each event once, first deliveries in commit order per
/// aggregate; and Siphon's memory grows by a bounded amount, not by the transaction's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_split_over_kafka_transactions_is_seen_once_across_kill_9() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = exactly_once_config(&pg, &broker, "eossplit")
        .replacen(
            "delivery = \"exactly-once\"",
            "delivery = \"exactly-once\"\ntransaction_max_bytes = 32768",
            1,
        )
        .replacen(
            "max_in_flight_records = 500",
            "max_in_flight_records = 500\nmax_in_flight_bytes = 131072",
            1,
        );
    // The commit of each Kafka transaction is logged at debug.
    let siphon = SiphonProcess::start_with(
        &siphon_tests::siphon_bin()?,
        &config,
        &[("RUST_LOG", "siphon=debug,info")],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "eossplit").await },
    )
    .await
    .with_context(|| siphon.log())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (idle_rss, _) = siphon.memory()?;

    insert_one_large_transaction(&client).await?;
    siphon
        .wait_for_log("Kafka transaction commit ended", Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    // A few more commits, then the kill.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, peak_rss) = siphon.memory()?;
    siphon.kill9()?;
    let before_kill = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    assert!(
        !before_kill.is_empty() && (before_kill.len() as u64) < LARGE_TRANSACTION_EVENTS,
        "the kill did not fall inside the transaction ({} of {LARGE_TRANSACTION_EVENTS} committed), so the test shows nothing",
        before_kill.len()
    );
    let growth = peak_rss.saturating_sub(idle_rss);
    eprintln!(
        "{} of {LARGE_TRANSACTION_EVENTS} events committed before the kill; RSS idle {:.1} MB, peak {:.1} MB",
        before_kill.len(),
        idle_rss as f64 / 1e6,
        peak_rss as f64 / 1e6
    );
    // The transaction's records are ~45 MB; the window is 128 KiB.
    assert!(
        growth < 16_000_000,
        "memory grew by {:.1} MB while one large transaction streamed",
        growth as f64 / 1e6
    );

    siphon.start_again()?;
    let expected: BTreeSet<String> = (1..=LARGE_TRANSACTION_EVENTS)
        .map(|s| event(s, true).id)
        .collect();
    wait_for_all(&broker, &expected, Duration::from_secs(180))
        .await
        .with_context(|| siphon.log())?;
    wait_for_slot_caught_up(&client, "eossplit").await?;
    let committed_view = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    let seen = count_by_id(&committed_view);
    let repeated = seen.values().filter(|n| **n > 1).count();
    assert_eq!(repeated, 0, "read_committed saw {repeated} events repeated");
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    check_first_deliveries_in_order(&committed_view)?;
    assert!(
        siphon
            .log()
            .contains("resuming after the last committed progress"),
        "{}",
        siphon.log()
    );
    Ok(())
}

/// The walsender's pid streaming from `slot`, if one is.
async fn walsender_pid(client: &Client, slot: &str) -> Result<Option<i32>> {
    let row = client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.and_then(|r| r.get(0)))
}

/// The session holds the slot (its stream started) before the producer registers with its
/// transaction coordinator, and a coordinator can take long to answer (one loading its log
/// answers "load in progress" for as long as that takes). Meanwhile the stream's status updates
/// go on, so the server does not end the replication connection for `wal_sender_timeout`.
///
/// The proxy holds the broker's answer to InitProducerId until the producer gives up on it
/// (`socket.timeout.ms`, 6 s) and asks again, three times the server's `wal_sender_timeout`
/// (2 s). One walsender streams throughout, and the event written meanwhile arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_keeps_the_slot_while_the_producer_waits_for_its_coordinator() -> Result<()> {
    let pg = Postgres::start()?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
        .await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    // Only the transactional producer's request names the slot (in its transactional id).
    broker
        .proxy()
        .hold_next_answer_to(INIT_PRODUCER_ID, b"slowcoordinator");
    let config = with_exactly_once(
        &siphon_config_at(
            &pg,
            &broker,
            "slowcoordinator",
            "\"socket.timeout.ms\" = \"6000\"",
            "",
        ),
        &broker,
    );
    let siphon = start_streaming(&client, &config, "slowcoordinator").await?;
    let walsender = walsender_pid(&client, "slowcoordinator").await?;
    let events = vec![event(1, true)];
    let mut writer = pg.connect().await?;
    insert_transaction(&mut writer, &events, true).await?;
    let expected: BTreeSet<String> = events.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    anyhow::ensure!(
        broker.proxy().answers_held() == 1,
        "the proxy held no InitProducerId answer: the test proved nothing"
    );
    let now = walsender_pid(&client, "slowcoordinator").await?;
    anyhow::ensure!(
        walsender.is_some() && now == walsender,
        "the walsender changed from {walsender:?} to {now:?} while the producer registered; \
         log:\n{}",
        siphon.log()
    );
    let read = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    anyhow::ensure!(
        read.len() == 1 && records.len() == 1,
        "{} records read_committed, {} in the log, for one event",
        read.len(),
        records.len()
    );
    Ok(())
}

/// A read_committed consumer of `broker` sees each of the `expected` events once, and their
/// first deliveries in commit order.
async fn each_event_once_in_order(
    broker: &ProxiedBroker,
    expected: &BTreeSet<String>,
    siphon: &SiphonProcess,
) -> Result<()> {
    let read = read_event_records_isolated(broker, Isolation::ReadCommitted).await?;
    let counts = count_by_id(&read);
    let repeated: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    anyhow::ensure!(
        repeated.is_empty() && counts.len() == expected.len(),
        "read_committed: {} of {} events, repeated: {repeated:?}; log:\n{}",
        counts.len(),
        expected.len(),
        siphon.log()
    );
    check_first_deliveries_in_order(&read)
}

/// How the coordinator's answer to a commit it completed reaches the producer, as Kafka's error
/// code, and what librdkafka makes of it.
const FAILED_COMMIT_ANSWERS: &[(&str, i16)] = &[
    // Retried by librdkafka on a coordinator it looks up again, which answers the retry of a
    // completed commit with success: no error reaches Siphon.
    ("NOT_COORDINATOR", 16),
    // Fatal: the producer is unusable, the session ends.
    ("PRODUCER_FENCED", 90),
    // Abortable, needing a new epoch: the commit fails, the session ends.
    ("UNKNOWN_PRODUCER_ID", 59),
];

/// A commit whose outcome Siphon does not know: the coordinator completes it (the request
/// reaches the broker), but its answer reaches the producer as an error
/// ([`FAILED_COMMIT_ANSWERS`], one per transaction). Whatever librdkafka makes of it, a failed
/// commit ends the session and the next one reads the last committed progress, which the
/// completed commit moved past the transaction's events: a read_committed consumer sees each
/// event once, none sent again in a second Kafka transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_completed_but_answered_as_failed_is_not_sent_again() -> Result<()> {
    let slot = "failedcommit";
    let pg = Postgres::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    let config = with_exactly_once(&siphon_config_at(&pg, &broker, slot, "", ""), &broker);
    let siphon = start_streaming(&client, &config, slot).await?;
    let mut expected = BTreeSet::new();
    let mut next = 1;
    for (failed, (name, code)) in
        (0u64..).zip([("none", 0)].iter().chain(FAILED_COMMIT_ANSWERS).copied())
    {
        if code != 0 {
            // Only the transactional producer's requests name the slot (in its transactional id).
            broker
                .proxy()
                .fail_next_answer_to(END_TXN, slot.as_bytes(), code);
        }
        let events: Vec<Event> = (next..next + 5).map(|seq| event(seq, true)).collect();
        next += 5;
        insert_transaction(&mut client, &events, true).await?;
        expected.extend(events.iter().map(|e| e.id.clone()));
        wait_for_all(&broker, &expected, Duration::from_secs(60))
            .await
            .with_context(|| format!("after {name}; siphon log:\n{}", siphon.log()))?;
        wait_for_slot_caught_up(&client, slot)
            .await
            .with_context(|| format!("after {name}; siphon log:\n{}", siphon.log()))?;
        anyhow::ensure!(
            broker.proxy().answers_failed() == failed,
            "{} commit answers failed after {name}, not {failed}: the test proved nothing",
            broker.proxy().answers_failed()
        );
    }
    each_event_once_in_order(&broker, &expected, &siphon).await?;
    Ok(())
}

/// How long a Kafka transaction stays open in [`an_abort_whose_answer_is_lost_loses_and_repeats_nothing`]:
/// `kafka.transaction_interval_ms`, long enough to end the session inside it.
const LONG_TRANSACTION: Duration = Duration::from_secs(10);

/// A session ends with a Kafka transaction open (its replication connection terminated by the
/// server), so Siphon aborts it, and the coordinator's answer to the abort never reaches the
/// producer (the proxy holds it; the abort itself is carried out). Siphon does not know the
/// abort's outcome: the next session registers again and sends the aborted events again from
/// the last committed progress. A read_committed consumer sees each event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_whose_answer_is_lost_loses_and_repeats_nothing() -> Result<()> {
    let slot = "lostabort";
    let pg = Postgres::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    let config = with_exactly_once(
        &siphon_config_at(
            &pg,
            &broker,
            slot,
            // At least 8 times the interval.
            "\"transaction.timeout.ms\" = \"120000\"",
            "",
        ),
        &broker,
    )
    .replacen(
        "delivery = \"exactly-once\"",
        &format!(
            "delivery = \"exactly-once\"\ntransaction_interval_ms = {}",
            LONG_TRANSACTION.as_millis()
        ),
        1,
    );
    let siphon = start_streaming(&client, &config, slot).await?;

    // The first events, sent in a Kafka transaction that stays open.
    let first: Vec<Event> = (1..=5).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &first, true).await?;
    let sent: BTreeSet<String> = first.iter().map(|e| e.id.clone()).collect();
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let uncommitted =
                read_event_records_isolated(&broker, Isolation::ReadUncommitted).await?;
            Ok(sent.is_subset(&count_by_id(&uncommitted).into_keys().collect()))
        },
    )
    .await
    .with_context(|| format!("the events were not sent; log:\n{}", siphon.log()))?;
    let read = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    anyhow::ensure!(
        read.is_empty(),
        "the transaction was committed before the session ended: the test proves nothing"
    );

    // The session ends with the transaction open; the abort's answer is held.
    broker.proxy().hold_next_abort_answer_to(slot.as_bytes());
    let terminated: bool = client
        .query_one(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0);
    anyhow::ensure!(terminated, "no walsender to terminate");
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(broker.proxy().answers_held() >= 1) },
    )
    .await
    .with_context(|| {
        format!(
            "no abort's answer was held: the test proved nothing; log:\n{}",
            siphon.log()
        )
    })?;

    // The next session sends the aborted events again, and later ones after them.
    let second: Vec<Event> = (6..=10).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &second, true).await?;
    let expected: BTreeSet<String> = first.iter().chain(&second).map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_caught_up(&client, slot)
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    each_event_once_in_order(&broker, &expected, &siphon).await?;
    anyhow::ensure!(siphon.is_running(), "log:\n{}", siphon.log());
    Ok(())
}

fn admin(broker: &Broker) -> Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .context("creating an admin client")
}

/// Waits until Siphon streams on `slot` (after a start).
async fn wait_streaming(client: &Client, siphon: &SiphonProcess, slot: &str) -> Result<()> {
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(client, slot).await },
    )
    .await
    .with_context(|| siphon.log())
}

/// Stops Siphon with SIGTERM and waits for it to exit.
fn stop(siphon: &SiphonProcess) -> Result<()> {
    siphon.terminate()?;
    siphon.wait_exit(Duration::from_secs(60))?;
    Ok(())
}

/// An LSN as PostgreSQL prints it (`16/B374D848`), as a number.
fn lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

/// A progress topic given more partitions after Siphon committed progress to it, so many that
/// the source's key hashes to a partition other than the first: after more events, `siphon
/// status` and the session after a restart name the newest progress, not the first one found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_topic_given_more_partitions_resumes_from_the_newest_progress() -> Result<()> {
    let slot = "eosgrown";
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let progress_topic = broker.topic("siphon.progress");
    let siphon = SiphonProcess::start(&exactly_once_config(&pg, &broker, slot))?;
    wait_streaming(&client, &siphon, slot).await?;
    let first: Vec<Event> = (1..=5).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &first, true).await?;
    let mut expected: BTreeSet<String> = first.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    stop(&siphon)?;

    // The source's key (the server's system identifier, the database, the slot).
    let row = client
        .query_one(
            "SELECT system_identifier::text, current_database()::text FROM pg_control_system()",
            &[],
        )
        .await?;
    let key = format!(
        "siphon/progress/{}/{}/{slot}",
        row.get::<_, String>(0),
        row.get::<_, String>(1)
    );
    let partitions = (2..=16)
        .find(|n| partition_for_key(key.as_bytes(), *n) != 0)
        .context("no partition count moves the key")?;
    for result in admin(&broker)?
        .create_partitions(
            &[NewPartitions::new(&progress_topic, partitions as usize)],
            &AdminOptions::new(),
        )
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("adding partitions to {name}: {code}"))?;
    }

    siphon.start_again()?;
    wait_streaming(&client, &siphon, slot).await?;
    let second: Vec<Event> = (6..=10).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &second, true).await?;
    expected.extend(second.iter().map(|e| e.id.clone()));
    wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    stop(&siphon)?;

    // The newest committed progress of the key, wherever it is.
    let bootstrap = broker.bootstrap();
    let records = tokio::task::spawn_blocking(move || {
        read_topic_isolated(
            &bootstrap,
            &progress_topic,
            Duration::from_secs(20),
            Isolation::ReadCommitted,
        )
    })
    .await??;
    let newest = records
        .iter()
        .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
        .filter_map(|r| {
            let value: serde_json::Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
            value["commit_lsn"].as_str().map(str::to_owned)
        })
        .max_by_key(|commit| lsn(commit))
        .context("no progress committed")?;
    let (_, status) = siphon.command("status")?;
    anyhow::ensure!(
        status.contains("committed progress: ") && status.contains(&format!("(commit {newest}")),
        "siphon status does not name the newest progress (commit {newest}):\n{status}"
    );
    siphon.start_again()?;
    wait_streaming(&client, &siphon, slot).await?;
    // The second session resumed from the first one's progress; the third one's follows.
    let resuming = "resuming after the last committed progress";
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { Ok(siphon.log().matches(resuming).count() >= 2) },
    )
    .await
    .with_context(|| siphon.log())?;
    let log = siphon.log();
    let resumed = log
        .lines()
        .rfind(|l| l.contains(resuming))
        .context("no session resumed")?;
    anyhow::ensure!(
        resumed.contains(&format!("(commit {newest}")),
        "the session did not resume from the newest progress (commit {newest}): {resumed}"
    );
    Ok(())
}

/// The topic's `cleanup.policy`, `None` while the topic does not exist.
async fn cleanup_policy(broker: &Broker, topic: &str) -> Result<Option<String>> {
    if !list_topics(&broker.bootstrap())?.iter().any(|t| t == topic) {
        return Ok(None);
    }
    let described = admin(broker)?
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await?;
    let Some(Ok(resource)) = described.into_iter().next() else {
        return Ok(None);
    };
    Ok(resource
        .get("cleanup.policy")
        .and_then(|entry| entry.value.clone()))
}

/// The progress topic and the state topic deleted while Siphon streams with exactly-once
/// delivery (between transactions, after events were delivered), and events committed after
/// the deletion: the progress topic is created again compacted while Siphon runs, the state
/// topic compacted at the next start, and every committed event arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siphons_own_topics_deleted_while_streaming_come_back_compacted() -> Result<()> {
    let slot = "eosdeleted";
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let (progress_topic, state_topic) = (
        broker.topic("siphon.progress"),
        broker.topic("siphon.state"),
    );
    // The producer refreshes its metadata every second, as a long-running one does every
    // five minutes: the refresh finds the topics gone.
    let config = exactly_once_config(&pg, &broker, slot)
        .replacen(
            "[kafka]\n",
            &format!("[kafka]\nstate_topic = \"{state_topic}\"\n"),
            1,
        )
        .replacen(
            "[kafka.properties]\n",
            "[kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n",
            1,
        );
    let siphon = SiphonProcess::start(&config)?;
    wait_streaming(&client, &siphon, slot).await?;
    for topic in [&progress_topic, &state_topic] {
        wait_until(
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async { Ok(cleanup_policy(&broker, topic).await?.as_deref() == Some("compact")) },
        )
        .await
        .with_context(|| format!("{topic} is not compacted at the start"))?;
    }
    // Events before the deletion, the deletion while Siphon is idle, and events after it.
    let (before, _) = write(pg.connect().await?, 0, 20, Duration::from_millis(20)).await?;
    let mut expected: BTreeSet<String> = before.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    for result in admin(&broker)?
        .delete_topics(
            &[progress_topic.as_str(), state_topic.as_str()],
            &AdminOptions::new(),
        )
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("deleting {name}: {code}"))?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, _) = write(pg.connect().await?, 1000, 40, Duration::from_millis(50)).await?;
    expected.extend(after.iter().map(|e| e.id.clone()));
    wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    wait_for_slot_caught_up(&client, slot)
        .await
        .with_context(|| siphon.log())?;
    let policy = cleanup_policy(&broker, &progress_topic).await?;
    anyhow::ensure!(
        policy.as_deref() == Some("compact"),
        "the progress topic came back with cleanup.policy {policy:?}; log:\n{}",
        siphon.log()
    );
    // The state topic is written at the next start.
    stop(&siphon)?;
    siphon.start_again()?;
    wait_streaming(&client, &siphon, slot).await?;
    let policy = cleanup_policy(&broker, &state_topic).await?;
    anyhow::ensure!(
        policy.as_deref() == Some("compact"),
        "the state topic came back with cleanup.policy {policy:?}; log:\n{}",
        siphon.log()
    );
    Ok(())
}
