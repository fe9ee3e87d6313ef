//! A record the broker refuses for its timestamp (`INVALID_TIMESTAMP`: an event time older
//! than the topic's `message.timestamp.before.max.ms`) on a real Kafka topic, with
//! `on_error = "dead-letter"`: each refused record goes to the dead-letter topic stamped when
//! dead-lettered, with the event's time in a header (stamped with the event's time, the letter
//! would be deleted by the dead-letter topic's retention at the broker's next check), the
//! accepted records keep their event time (never the time of a resend: librdkafka reports a
//! failed message without its timestamp), the records around it reach their topic in commit
//! order, the slot moves past them all, and the producer is replaced at most twice per
//! refused record (a refusal fails the producer so that nothing after it is written first),
//! never in a loop.

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, route_replacement, siphon_config_at};
use siphon_tests::outbox::{slot_active, wait_for_slot_past};
use siphon_tests::{read_topic_async, read_topic_settled_async, wait_for, wait_until};
use siphon_tests::{Broker, Postgres, SiphonProcess};
use std::time::Duration;

const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, occurred timestamptz NOT NULL)";

/// Creates `topic` refusing records whose timestamp is more than an hour old.
async fn create_recent_only_topic(bootstrap: &str, topic: &str) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let new_topic = NewTopic::new(topic, 3, TopicReplication::Fixed(1))
        .set("message.timestamp.type", "CreateTime")
        .set("message.timestamp.before.max.ms", "3600000");
    for result in admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
    }
    read_topic_async(bootstrap, topic, Duration::from_secs(30)).await?;
    Ok(())
}

/// The time now, in milliseconds since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A dead letter is stamped when it is dead-lettered, not with the refused event's time (which
/// the dead-letter topic's retention would have the broker delete at its next check), and
/// keeps that time in a header.
fn assert_letter_times(letter: &siphon_tests::ConsumedRecord, started_ms: i64) {
    assert!(
        letter.timestamp.is_some_and(|t| t >= started_ms),
        "the dead letter is stamped when dead-lettered (after {started_ms}): {:?}",
        letter.timestamp
    );
    assert_eq!(
        letter.header("siphon.original.timestamp"),
        Some(&b"978307200000"[..]),
        "the dead letter keeps the event's time in a header"
    );
}

fn row(n: u32, key: &str, occurred: &str) -> String {
    format!(
        "INSERT INTO outbox VALUES ('00000000-0000-4000-8000-{n:012}', 'Order', '{key}', 'T', '{{\"n\": {n}}}', {occurred});"
    )
}

/// The services of one test: a topic refusing old records, Siphon routing with the event time
/// and dead letters (exactly-once delivery if asked), and the rows written: refused records
/// among accepted ones of the same aggregate, in one transaction and in the next.
struct Refusing {
    // Dropped first: Siphon stops before its database does.
    siphon: SiphonProcess,
    client: tokio_postgres::Client,
    pg: Postgres,
    broker: Broker,
    events: String,
    dead_letter_topic: String,
    /// The end of the WAL once the rows were written.
    end: u64,
}

async fn refusing(slot: &str, exactly_once: bool) -> Result<Refusing> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let events = broker.topic("outbox.event.Order");
    create_recent_only_topic(&broker.bootstrap(), &events).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let pipeline = format!(
        "on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\"\n\n[router]\n{}\n\"table.field.event.timestamp\" = \"occurred\"",
        route_replacement(&broker)
    );
    let mut config = siphon_config_at(
        &pg,
        &broker,
        slot,
        "\"message.timeout.ms\" = \"10000\"",
        &pipeline,
    );
    if exactly_once {
        let bootstrap = format!("bootstrap_servers = \"{}\"", broker.bootstrap());
        config = config.replacen(
            &bootstrap,
            &format!(
                "{bootstrap}\ndelivery = \"exactly-once\"\nprogress_topic = \"{}\"",
                broker.topic("siphon.progress")
            ),
            1,
        );
    }
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, slot).await },
    )
    .await
    .with_context(|| siphon.log())?;
    let old = "'2001-01-01 00:00:00+00'";
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} {} COMMIT; BEGIN; {} {} COMMIT; DELETE FROM outbox;",
            row(1, "order-1", "now()"),
            row(2, "order-1", old),
            row(3, "order-1", "now()"),
            row(4, "order-2", old),
            row(5, "order-1", "now()"),
            row(6, "order-2", old),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    Ok(Refusing {
        siphon,
        client,
        pg,
        broker,
        events,
        dead_letter_topic,
        end,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_refused_for_their_timestamp_are_dead_lettered_with_their_time_in_a_header_and_no_loop(
) -> Result<()> {
    let started_ms = now_ms();
    let Refusing {
        siphon,
        client,
        pg: _pg,
        broker,
        events,
        dead_letter_topic,
        end,
    } = refusing("ts", false).await?;

    let dead = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let records = read_topic_async(
                &broker.bootstrap(),
                &dead_letter_topic,
                Duration::from_secs(30),
            )
            .await?;
            Ok((records.len() >= 3).then_some(records))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    wait_for_slot_past(&client, "ts", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    // Time for a loop to show.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut dead_ids: Vec<String> = read_topic_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(30),
    )
    .await?
    .iter()
    .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
    .collect();
    dead_ids.sort();
    let letters = dead_ids.len();
    // A letter delivered just before a producer replacement may be written twice (at least
    // once, as every record): a loop would write many more.
    assert!(
        letters <= 6,
        "{letters} dead letters for 3 refused records: {dead_ids:?}"
    );
    dead_ids.dedup();
    assert_eq!(
        dead_ids,
        [2, 4, 6]
            .map(|n| format!("00000000-0000-4000-8000-{n:012}"))
            .to_vec(),
        "every refused record dead-lettered, nothing else: {}",
        siphon.log()
    );
    for letter in &dead {
        let message =
            String::from_utf8_lossy(letter.header("siphon.error.message").unwrap_or_default())
                .into_owned();
        assert!(
            message.contains("InvalidTimestamp") && message.contains("message.timestamp"),
            "the dead letter names the refusal and the topic setting: {message}"
        );
        assert_letter_times(letter, started_ms);
    }

    let delivered = read_topic_async(&broker.bootstrap(), &events, Duration::from_secs(30)).await?;
    let mut order_1: Vec<(i32, i64, String)> = delivered
        .iter()
        .filter(|r| r.key_str().as_deref() == Some("\"order-1\""))
        .map(|r| {
            (
                r.partition,
                r.offset,
                String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned(),
            )
        })
        .collect();
    order_1.sort();
    let mut firsts: Vec<String> = Vec::new();
    for (_, _, id) in order_1 {
        if !firsts.contains(&id) {
            firsts.push(id);
        }
    }
    assert_eq!(
        firsts,
        [1, 3, 5]
            .map(|n| format!("00000000-0000-4000-8000-{n:012}"))
            .to_vec(),
        "accepted records of order-1 in commit order: {}",
        siphon.log()
    );

    let log = siphon.log();
    let replacements = log.matches("Kafka producer failed; replacing it").count();
    // At most two per refused record: one for the batch it was refused in, one when it is
    // refused again alone (which tells it from the records refused only for sharing its batch).
    assert!(
        replacements <= 6,
        "{replacements} producer replacements for 3 refused records: {log}"
    );
    assert!(siphon.is_running(), "{log}");
    Ok(())
}

/// The same refusals with `kafka.delivery = "exactly-once"`: each refused batch aborts its
/// Kafka transaction; its records are sent alone next, each in a transaction of its own, and
/// one refused alone is dead-lettered. A read_committed consumer sees every accepted event once
/// in its topic and every refused one once in the dead-letter topic, and the session restarts
/// a bounded number of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_refused_records_are_dead_lettered_once_and_the_rest_delivered_once(
) -> Result<()> {
    let started_ms = now_ms();
    let Refusing {
        siphon,
        client,
        pg: _pg,
        broker,
        events,
        dead_letter_topic,
        end,
    } = refusing("tseos", true).await?;
    wait_for_slot_past(&client, "tseos", end, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    let ids = |records: &[siphon_tests::ConsumedRecord]| {
        let mut ids: Vec<String> = records
            .iter()
            .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
            .collect();
        ids.sort();
        ids
    };
    let id = |n: u32| format!("00000000-0000-4000-8000-{n:012}");
    // Read once the last commit's markers are written: the slot moves at the commit.
    let dead = read_topic_settled_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(30),
    )
    .await?;
    for letter in &dead {
        assert_letter_times(letter, started_ms);
    }
    let (dead, want) = (ids(&dead), [2, 4, 6].map(id).to_vec());
    assert!(
        dead == want,
        "dead letters {dead:?}, expected {want:?}; log:\n{}",
        siphon.log()
    );
    let delivered =
        read_topic_settled_async(&broker.bootstrap(), &events, Duration::from_secs(30)).await?;
    let (delivered, want) = (ids(&delivered), [1, 3, 5].map(id).to_vec());
    assert!(
        delivered == want,
        "delivered {delivered:?}, expected {want:?}; log:\n{}",
        siphon.log()
    );
    let restarts = siphon.log().matches("pipeline interrupted").count();
    eprintln!("{restarts} session restarts");
    // At most: one abort per refused batch, one per record refused alone.
    assert!(restarts <= 8, "{restarts} restarts:\n{}", siphon.log());
    Ok(())
}
