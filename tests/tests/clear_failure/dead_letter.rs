//! Poison rows and records go to the dead-letter topic with headers naming the error, and the
//! pipeline goes on; with the default policy they stop Siphon instead (never a silent skip).
//! A row routed to one of Siphon's own topics (progress, state, dead-letter) is such a row, in
//! the stream and in `siphon resend` alike.

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config, slot_active, wait_for_slot_past};
use siphon_tests::{
    list_topics, read_topic_async, run_siphon, siphon_bin, wait_for, wait_until, Broker,
    ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;

/// An outbox whose routing column may be NULL (so a row can be unroutable).
const LENIENT_OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)";

fn header(record: &ConsumedRecord, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}

async fn write_rows(client: &tokio_postgres::Client) -> Result<()> {
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(30_000));
    client
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000001', 'Order', 'order-1', 'Created', '{{\"n\": 1}}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000002', NULL, 'order-2', 'Created', '{{\"n\": 2}}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000003', 'Order', 'order-3', 'Created', '{big}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000004', 'Order', 'order-1', 'Shipped', '{{\"n\": 4}}');
             DELETE FROM outbox;
             COMMIT;"
        ))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_and_records_are_dead_lettered_and_the_pipeline_goes_on() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let extra = format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\"");
    let config = siphon_config(&pg, &broker, "dlq", &extra).replace(
        "\"message.timeout.ms\" = \"10000\"",
        "\"message.timeout.ms\" = \"10000\"\n\"message.max.bytes\" = \"20000\"",
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "dlq").await },
    )
    .await?;
    write_rows(&client).await?;
    let end = current_insert_lsn(&client).await?;

    let dead = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(
                &broker.bootstrap(),
                &dead_letter_topic,
                Duration::from_secs(20),
            )
            .await?;
            Ok((r.len() >= 2).then_some(r))
        },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert_eq!(dead.len(), 2);
    let routed = read_topic_async(
        &broker.bootstrap(),
        &broker.topic("outbox.event.Order"),
        Duration::from_secs(20),
    )
    .await?;
    let ids: Vec<String> = routed.iter().map(|r| header(r, "id")).collect();
    assert_eq!(ids.len(), 2, "the good rows arrive: {ids:?}");

    let unroutable = dead
        .iter()
        .find(|r| header(r, "siphon.error.stage") == "route")
        .context("route-stage dead letter")?;
    assert!(
        header(unroutable, "siphon.error.message").contains("aggregatetype"),
        "{}",
        header(unroutable, "siphon.error.message")
    );
    assert_eq!(header(unroutable, "siphon.source.table"), "public.outbox");
    assert!(header(unroutable, "siphon.source.lsn").contains('/'));
    let row: serde_json::Value =
        serde_json::from_slice(unroutable.value.as_deref().unwrap_or_default())?;
    assert_eq!(row["id"], "00000000-0000-4000-8000-000000000002");
    assert_eq!(row["aggregatetype"], serde_json::Value::Null);
    assert_eq!(row["payload"], "{\"n\": 2}");

    let refused = dead
        .iter()
        .find(|r| header(r, "siphon.error.stage") == "produce")
        .context("produce-stage dead letter")?;
    assert_eq!(
        header(refused, "siphon.original.topic"),
        broker.topic("outbox.event.Order")
    );
    assert_eq!(
        header(refused, "id"),
        "00000000-0000-4000-8000-000000000003"
    );
    assert_eq!(refused.key.as_deref(), Some(&b"\"order-3\""[..]));
    assert!(header(refused, "siphon.error.message").contains("message.max.bytes"));
    assert_eq!(refused.value, None, "the oversized value is left out");
    assert!(!header(refused, "siphon.error.omitted").is_empty());

    // The transaction is confirmed once its dead letters are acknowledged.
    wait_for_slot_past(&client, "dlq", end, Duration::from_secs(30)).await?;
    assert!(siphon.is_running());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_poison_row_stops_siphon_naming_the_fix() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "strict", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "strict").await },
    )
    .await?;
    write_rows(&client).await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("aggregatetype") && log.contains("on_error = \"dead-letter\""),
        "{log}"
    );
    Ok(())
}

/// Siphon's own topics in `broker`'s namespace, as `[kafka]` and `[pipeline]` lines, with every
/// row routed to the topic its `aggregatetype` names; returns the config and the progress,
/// state and dead-letter topics.
fn routed_by_value_config(
    pg: &Postgres,
    broker: &Broker,
    slot: &str,
    pipeline: &str,
) -> (String, [String; 3]) {
    let own = [
        broker.topic("siphon.progress"),
        broker.topic("siphon.state"),
        broker.topic("siphon.dead-letter"),
    ];
    let extra = format!(
        "dead_letter_topic = \"{}\"\n{pipeline}\n[router]\n\"route.topic.replacement\" = \"${{routedByValue}}\"",
        own[2]
    );
    let config = siphon_config(pg, broker, slot, &extra).replacen(
        "[kafka]\n",
        &format!(
            "[kafka]\nprogress_topic = \"{}\"\nstate_topic = \"{}\"\n",
            own[0], own[1]
        ),
        1,
    );
    (config, own)
}

/// Inserts one row routed to each topic of `topics`, numbered from `first`.
async fn insert_routed_to(
    client: &tokio_postgres::Client,
    first: u32,
    topics: &[&str],
) -> Result<()> {
    for (n, topic) in topics.iter().enumerate() {
        client
            .execute(
                "INSERT INTO outbox VALUES ($1::text::uuid, $2, 'order-1', 'Created', '{}')",
                &[
                    &format!("00000000-0000-4000-8000-{:012}", first as usize + n),
                    topic,
                ],
            )
            .await?;
    }
    Ok(())
}

/// With `route.topic.replacement = "${routedByValue}"`, rows whose routing value names the
/// progress, state or dead-letter topic are refused, in the stream and in `siphon resend`
/// alike: each is dead-lettered with a reason naming its topic, the topics themselves get no
/// outbox record, and the row routed elsewhere arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_routed_to_siphons_own_topics_are_dead_lettered_by_the_stream_and_resend() -> Result<()>
{
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let (config, own) =
        routed_by_value_config(&pg, &broker, "owntopics", "on_error = \"dead-letter\"");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "owntopics").await },
    )
    .await?;
    let order = broker.topic("outbox.event.Order");
    insert_routed_to(&client, 1, &[&own[0], &own[1], &own[2], &order]).await?;
    let bootstrap = broker.bootstrap();
    let dead_letters = |count: usize| {
        let (bootstrap, topic) = (bootstrap.clone(), own[2].clone());
        wait_for(
            Duration::from_secs(60),
            Duration::from_millis(300),
            move || {
                let (bootstrap, topic) = (bootstrap.clone(), topic.clone());
                async move {
                    let r = read_topic_async(&bootstrap, &topic, Duration::from_secs(20)).await?;
                    Ok((r.len() >= count).then_some(r))
                }
            },
        )
    };
    let dead = dead_letters(3)
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    // Each row routed to one of Siphon's own topics is dead-lettered `times` times, each
    // dead letter naming the topic and what it is.
    let check = |dead: &[ConsumedRecord], times: usize| -> Result<()> {
        for (topic, role) in own
            .iter()
            .zip(["progress topic", "state topic", "dead-letter topic"])
        {
            let named = format!("\"{topic}\", which is Siphon's {role}");
            let letters: Vec<&ConsumedRecord> = dead
                .iter()
                .filter(|r| header(r, "siphon.error.message").contains(&named))
                .collect();
            anyhow::ensure!(
                letters.len() == times
                    && letters
                        .iter()
                        .all(|r| header(r, "siphon.error.stage") == "route"),
                "not {times} route-stage dead letters naming {topic} as the {role}: {:?}",
                dead.iter()
                    .map(|r| header(r, "siphon.error.message"))
                    .collect::<Vec<_>>()
            );
        }
        Ok(())
    };
    check(&dead, 1)?;
    assert_eq!(dead.len(), 3, "only the three rows are dead-lettered");
    let routed = read_topic_async(&bootstrap, &order, Duration::from_secs(20)).await?;
    assert_eq!(routed.len(), 1, "the row routed elsewhere arrives");

    // `siphon resend` routes the same rows the same way.
    let resend = std::process::Command::new(siphon_bin()?)
        .args(["resend", "--config"])
        .arg(siphon.config_path())
        .args(["--table", "public.outbox"])
        .output()?;
    let said = String::from_utf8_lossy(&resend.stdout).into_owned()
        + &String::from_utf8_lossy(&resend.stderr);
    assert!(resend.status.success(), "{said}");
    let dead = dead_letters(6).await.with_context(|| said.clone())?;
    assert_eq!(dead.len(), 6, "{said}");
    check(&dead, 2)?;
    let routed = read_topic_async(&bootstrap, &order, Duration::from_secs(20)).await?;
    assert_eq!(routed.len(), 2, "the re-sent row arrives");

    // No outbox record reached Siphon's own topics (the state topic holds Siphon's records
    // only, which carry no `id` header; the progress topic is not used at all).
    let state = read_topic_async(&bootstrap, &own[1], Duration::from_secs(20)).await?;
    assert!(
        state.iter().all(|r| r.header("id").is_none()),
        "an outbox record in the state topic: {state:?}"
    );
    assert!(
        !list_topics(&bootstrap)?.contains(&own[0]),
        "the progress topic was written to"
    );
    assert!(siphon.is_running());
    Ok(())
}

/// With the default `on_error`, a row routed to the progress topic stops Siphon with exit
/// status 2, naming the routing value, the topic and the fix; nothing reaches the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_row_routed_to_the_progress_topic_stops_siphon_naming_it() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let (config, own) = routed_by_value_config(&pg, &broker, "ownprogress", "");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "ownprogress").await },
    )
    .await?;
    insert_routed_to(&client, 1, &[&own[0]]).await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains(&format!(
            "the value \"{}\" of column \"aggregatetype\"",
            own[0]
        )) && log.contains("Siphon's progress topic (kafka.progress_topic)")
            && log.contains("on_error = \"dead-letter\""),
        "{log}"
    );
    assert!(
        !list_topics(&broker.bootstrap())?.contains(&own[0]),
        "the progress topic was written to"
    );
    Ok(())
}

/// Reads `topic` until it holds at least `n` records.
async fn wait_for_records(broker: &Broker, topic: &str, n: usize) -> Result<Vec<ConsumedRecord>> {
    siphon_tests::kafka_read::wait_for_topic_records(
        &broker.bootstrap(),
        topic,
        n,
        Duration::from_secs(60),
        Duration::from_secs(20),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kafka_refuses_follows_on_error_in_a_snapshot_and_a_resend() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    // Row 3's record is larger than the producer takes (message.max.bytes 20000).
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(30_000));
    client
        .batch_execute(&format!(
            "INSERT INTO outbox VALUES
               ('00000000-0000-4000-8000-000000000001', 'Order', 'order-1', 'Created', '{{\"n\": 1}}'),
               ('00000000-0000-4000-8000-000000000003', 'Order', 'order-3', 'Created', '{big}'),
               ('00000000-0000-4000-8000-000000000004', 'Order', 'order-1', 'Shipped', '{{\"n\": 4}}')"
        ))
        .await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let order_topic = broker.topic("outbox.event.Order");
    let config = |extra: &str| {
        siphon_config(&pg, &broker, "refused_transfer", extra)
            .replace(
                "\"message.timeout.ms\" = \"10000\"",
                "\"message.timeout.ms\" = \"10000\"\n\"message.max.bytes\" = \"20000\"",
            )
            .replacen("[source]\n", "[source]\nsnapshot = \"initial\"\n", 1)
    };
    let siphon = SiphonProcess::start(&config(&format!(
        "on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""
    )))?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let ids = |records: &[ConsumedRecord]| -> Vec<String> {
        records.iter().map(|r| header(r, "id")).collect()
    };
    // The snapshot dead-lettered row 3, as the stream would, and sent the others.
    let letters = wait_for_records(&broker, &dead_letter_topic, 1)
        .await
        .with_context(|| siphon.log())?;
    assert_eq!(ids(&letters), ["00000000-0000-4000-8000-000000000003"]);
    assert_eq!(header(&letters[0], "siphon.error.stage"), "produce");
    assert!(header(&letters[0], "siphon.error.message").contains("message.max.bytes"));
    let sent = wait_for_records(&broker, &order_topic, 2).await?;
    assert_eq!(
        ids(&sent),
        [
            "00000000-0000-4000-8000-000000000001",
            "00000000-0000-4000-8000-000000000004"
        ]
    );
    // A re-send: the same rule.
    let resend =
        |config: &std::path::Path| run_siphon("resend", config, &["--table", "public.outbox"]);
    let (status, said) = resend(&siphon.config_path())?;
    assert!(status.success(), "{said}");
    let letters = wait_for_records(&broker, &dead_letter_topic, 2).await?;
    assert_eq!(ids(&letters)[1], "00000000-0000-4000-8000-000000000003");
    let sent = wait_for_records(&broker, &order_topic, 4).await?;
    assert_eq!(
        sent.iter()
            .filter(|r| r.header("siphon.resend").is_some())
            .count(),
        2
    );
    // With the default policy the re-send stops, naming the record's fault and the fix.
    let failing = siphon.dir().join("fail.toml");
    std::fs::write(&failing, config(""))?;
    let (status, said) = resend(&failing)?;
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(
        said.contains("message.max.bytes") && said.contains("pipeline.on_error"),
        "{said}"
    );
    assert_eq!(
        read_topic_async(
            &broker.bootstrap(),
            &dead_letter_topic,
            Duration::from_secs(10)
        )
        .await?
        .len(),
        2,
        "nothing dead-lettered under on_error = \"fail\""
    );
    Ok(())
}
