//! The initial snapshot under `kafka.delivery = "exactly-once"`: a polling relay's outbox
//! holds thousands of unpublished rows when Siphon first starts, and applications keep
//! writing events the outbox way (insert and delete in one transaction) throughout.
//!
//! - A snapshot killed with `kill -9` in the middle and finished at the next start: a
//!   read_committed consumer sees every unpublished row's event exactly once, in key order per
//!   aggregate, followed by the events streamed after the slot's consistent point, each once;
//!   no row the relay had published arrives.
//! - With `pipeline.on_error = "dead-letter"`, rows whose records the broker refuses (a topic
//!   whose `max.message.bytes` is below them) are dead-lettered once each, in committed
//!   transactions, the other rows arrive once each, and the snapshot finishes; the stream
//!   does the same with such rows among hundreds of others in one transaction.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, read_event_records_isolated, siphon_config,
    slot_confirmed_lsn, wait_for_all, with_exactly_once,
};
use siphon_tests::{read_topic_isolated_async, Broker, Isolation, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Client;

/// A polling relay's outbox: Debezium's columns, and `published_at`, set by the relay.
const RELAY_OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at timestamptz)";

/// The event id of `seq` (the harness's id scheme: the key order is the sequence order).
fn id(seq: i64) -> String {
    format!("00000000-0000-4000-8000-{seq:012}")
}

const INSERT_ROWS: &str =
    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, published_at) \
     SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
            CASE WHEN g % 3 = 0 THEN 'Customer' ELSE 'Order' END, \
            CASE WHEN g % 3 = 0 THEN 'customer-' ELSE 'order-' END || (g % 17), 'Event', \
            jsonb_build_object('seq', g), \
            CASE WHEN $3 THEN now() END \
     FROM generate_series($1::bigint, $2::bigint) g";

/// Inserts rows `from ..= to` in one transaction, published (as the relay left them) or not.
async fn insert_rows(client: &Client, from: i64, to: i64, published: bool) -> Result<()> {
    client
        .execute(INSERT_ROWS, &[&from, &to, &published])
        .await
        .context("inserting outbox rows")?;
    Ok(())
}

/// An application writing the outbox way from `first` on until `stop`: each transaction
/// inserts five events and deletes them again. Returns the ids committed.
fn spawn_outbox_writer(
    mut client: Client,
    first: i64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<i64>>> {
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut next = first;
        while !stop.load(Ordering::Relaxed) {
            let tx = client.transaction().await?;
            tx.execute(INSERT_ROWS, &[&next, &(next + 4), &false])
                .await
                .context("inserting outbox rows")?;
            tx.execute(
                "DELETE FROM outbox WHERE id = ANY(SELECT format('00000000-0000-4000-8000-%s', \
                 lpad(g::text, 12, '0'))::uuid FROM generate_series($1::bigint, $2::bigint) g)",
                &[&next, &(next + 4)],
            )
            .await
            .context("deleting outbox rows")?;
            tx.commit().await?;
            written.extend(next..=next + 4);
            next += 5;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(written)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_killed_with_kill_9_is_seen_once_by_a_read_committed_consumer() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    // What the relay published already: never sent. What it has not: the snapshot's rows.
    insert_rows(&client, 1, 2_000, true).await?;
    insert_rows(&client, 10_001, 30_000, false).await?;
    let config = with_exactly_once(&siphon_config(&pg, &broker, "eos_snap", ""), &broker)
        .replacen(
            "[source]\n",
            "[source]\nsnapshot = \"initial\"\nsnapshot_filter = \"published_at IS NULL\"\nsnapshot_chunk_rows = 25\n",
            1,
        );
    let siphon = SiphonProcess::start(&config)?;
    siphon
        .wait_for_log("snapshot progress", Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    // The slot exists (the snapshot runs in it): every event written from now on comes after
    // its consistent point, and is streamed once the snapshot is done.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_outbox_writer(pg.connect().await?, 100_001, Arc::clone(&stop));
    // Rows sent after the last progress, not yet covered by it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    anyhow::ensure!(
        !siphon.log().contains("snapshot finished"),
        "the snapshot finished before it could be interrupted: give it more rows\n{}",
        siphon.log()
    );
    siphon.kill9()?;
    let held = slot_confirmed_lsn(&client, "eos_snap").await?;
    siphon.start_again()?;
    siphon
        .wait_for_log(
            "the initial snapshot was interrupted",
            Duration::from_secs(90),
        )
        .await
        .with_context(|| siphon.log())?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(180))
        .await
        .with_context(|| siphon.log())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let streamed = writer.await??;
    let mut expected: BTreeSet<String> = (10_001..=30_000).map(id).collect();
    expected.extend(streamed.iter().copied().map(id));
    wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    // A last Kafka transaction may still be committing what arrived last.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let committed_view = read_event_records_isolated(&broker, Isolation::ReadCommitted).await?;
    let seen = count_by_id(&committed_view);
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "read_committed saw {} events more than once (snapshot rows are 10001..=30000), e.g. {:?}\n{}",
        repeated.len(),
        repeated.iter().take(10).collect::<Vec<_>>(),
        siphon.log()
    );
    let ids: BTreeSet<String> = seen.keys().cloned().collect();
    let unexpected: Vec<_> = ids.difference(&expected).take(10).collect();
    assert!(
        unexpected.is_empty(),
        "rows the relay published (or never written) arrived: {unexpected:?}"
    );
    assert_eq!(ids.len(), expected.len(), "every event once");
    // Once each, so every delivery is a first one: key order per aggregate, the snapshot's
    // rows before the events streamed after them.
    check_first_deliveries_in_order(&committed_view)?;
    assert!(
        slot_confirmed_lsn(&client, "eos_snap").await? >= held,
        "the slot moves on once streaming started"
    );
    let uncommitted_view = read_event_records_isolated(&broker, Isolation::ReadUncommitted).await?;
    eprintln!(
        "exactly-once snapshot across kill -9: {} events, {} records read_committed, {} read_uncommitted",
        expected.len(),
        committed_view.len(),
        uncommitted_view.len()
    );
    Ok(())
}

/// Creates `topic` (3 partitions) taking records of `max_bytes` at most.
async fn create_small_topic(broker: &Broker, topic: &str, max_bytes: usize) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .context("creating an admin client")?;
    let max_bytes = max_bytes.to_string();
    let new_topic =
        NewTopic::new(topic, 3, TopicReplication::Fixed(1)).set("max.message.bytes", &max_bytes);
    for result in admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("creating topic {name}: {code}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_broker_refuses_in_a_snapshot_are_dead_lettered_once() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    // Customer events go to a topic taking 50 kB at most: four rows of 80 kB are refused by
    // the broker (the producer takes them), two of them one after the other.
    create_small_topic(&broker, &broker.topic("outbox.event.Customer"), 50_000).await?;
    insert_rows(&client, 1, 300, false).await?;
    let large = [40i64, 41, 150, 299];
    for seq in large {
        client
            .execute(
                "UPDATE outbox SET aggregatetype = 'Customer', aggregateid = 'customer-big', \
                 payload = jsonb_build_object('big', repeat('x', 80000)) WHERE id = $1::text::uuid",
                &[&id(seq)],
            )
            .await
            .context("making a row large")?;
    }
    let dead_letter_topic = broker.topic("outbox.dlq");
    let config = with_exactly_once(
        &siphon_config(
            &pg,
            &broker,
            "eos_snap_refused",
            &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
        ),
        &broker,
    )
    .replacen(
        "[source]\n",
        "[source]\nsnapshot = \"initial\"\nsnapshot_chunk_rows = 25\n",
        1,
    );
    let siphon = SiphonProcess::start(&config)?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    let expected: BTreeSet<String> = (1..=300)
        .filter(|seq| !large.contains(seq))
        .map(id)
        .collect();
    wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    anyhow::ensure!(siphon.is_running(), "Siphon stopped:\n{}", siphon.log());

    let letters = read_topic_isolated_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(30),
        Isolation::ReadCommitted,
    )
    .await?;
    check_refusals(&broker, &siphon, &expected, &letters, &large).await?;
    for letter in &letters {
        assert_eq!(
            letter.header("siphon.error.stage").map(<[u8]>::to_vec),
            Some(b"produce".to_vec())
        );
    }
    Ok(())
}

/// The stream's side of the same rule: rows whose records the broker refuses, written in one
/// PostgreSQL transaction among many others (one Kafka transaction holds them all), are
/// dead-lettered once each; every other row arrives once; Siphon keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_broker_refuses_while_streaming_are_dead_lettered_once() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    create_small_topic(&broker, &broker.topic("outbox.event.Customer"), 50_000).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let config = with_exactly_once(
        &siphon_config(
            &pg,
            &broker,
            "eos_stream_refused",
            &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
        ),
        &broker,
    );
    let siphon = SiphonProcess::start(&config)?;
    siphon_tests::wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { siphon_tests::outbox::slot_active(&client, "eos_stream_refused").await },
    )
    .await
    .with_context(|| siphon.log())?;
    let large = [40i64, 41, 150, 299];
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
                    CASE WHEN g = ANY($2) OR g % 3 = 0 THEN 'Customer' ELSE 'Order' END, \
                    CASE WHEN g = ANY($2) THEN 'customer-big' \
                         WHEN g % 3 = 0 THEN 'customer-' || (g % 17) \
                         ELSE 'order-' || (g % 17) END, 'Event', \
                    CASE WHEN g = ANY($2) THEN jsonb_build_object('big', repeat('x', 80000)) \
                         ELSE jsonb_build_object('seq', g) END \
             FROM generate_series(1, $1::bigint) g",
            &[&300i64, &large.to_vec()],
        )
        .await
        .context("inserting the rows")?;
    let expected: BTreeSet<String> = (1..=300)
        .filter(|seq| !large.contains(seq))
        .map(id)
        .collect();
    wait_for_all(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    let letters = siphon_tests::wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let letters = read_topic_isolated_async(
                &broker.bootstrap(),
                &dead_letter_topic,
                Duration::from_secs(5),
                Isolation::ReadCommitted,
            )
            .await?;
            Ok((letters.len() >= large.len()).then_some(letters))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    anyhow::ensure!(siphon.is_running(), "Siphon stopped:\n{}", siphon.log());
    check_refusals(&broker, &siphon, &expected, &letters, &large).await?;
    Ok(())
}

/// A read_committed consumer sees each of `expected` once in its topic and nothing else there,
/// and each row of `large` once among the dead `letters`.
async fn check_refusals(
    broker: &Broker,
    siphon: &SiphonProcess,
    expected: &BTreeSet<String>,
    letters: &[siphon_tests::ConsumedRecord],
    large: &[i64],
) -> Result<()> {
    let seen = count_by_id(&read_event_records_isolated(broker, Isolation::ReadCommitted).await?);
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "read_committed saw events more than once: {repeated:?}\n{}",
        siphon.log()
    );
    assert_eq!(
        &seen.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "every other row once, no refused one"
    );
    assert_eq!(
        count_by_id(letters).into_iter().collect::<Vec<_>>(),
        large.iter().map(|seq| (id(*seq), 1)).collect::<Vec<_>>(),
        "each refused row dead-lettered once\n{}",
        siphon.log()
    );
    Ok(())
}
