//! `kafka.delivery = "exactly-once"` on a real broker: Kafka transactions around whole
//! PostgreSQL transactions, each ending with a progress record, and a new session that skips
//! what the last committed progress covers.
//!
//! - Across `kill -9`: a read_committed consumer sees every committed event exactly once (and
//!   none rolled back), first deliveries in commit order per aggregate; a read_uncommitted
//!   consumer sees the repeats that aborted transactions left in the log (what at-least-once
//!   delivery would have shown to everyone).
//! - A zombie: a Siphon frozen with an open transaction while a second one takes the slot is
//!   fenced when it wakes: nothing it wrote after the second one started becomes visible.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, event, insert_transaction,
    read_event_records_isolated, siphon_config, slot_active, wait_for_all, wait_for_slot_caught_up,
    with_exactly_once, Event, OUTBOX_DDL,
};
use siphon_tests::{wait_until, Broker, Isolation, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_postgres::Client;

/// [`siphon_config`] with exactly-once delivery, the progress topic in the test's namespace.
fn exactly_once_config(pg: &Postgres, broker: &Broker, slot: &str) -> String {
    with_exactly_once(&siphon_config(pg, broker, slot, ""), broker)
}

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
    let bootstrap = broker.bootstrap();
    let topic = dead_letter_topic.clone();
    let dead = tokio::task::spawn_blocking(move || {
        siphon_tests::read_topic_isolated(
            &bootstrap,
            &topic,
            Duration::from_secs(60),
            Isolation::ReadCommitted,
        )
    })
    .await??;
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
