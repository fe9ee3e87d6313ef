//! An outbox column that is a generated column (`aggregateid ... GENERATED ALWAYS AS (...)
//! STORED`): PostgreSQL leaves it out of the replication stream (before 18 always; on 18 unless
//! the publication has `publish_generated_columns = stored`). Siphon says so, with the fix for
//! the server's version, instead of "has no column ... add it"; after the fix, the rows written
//! before it (still without the column in the slot) go to the dead-letter topic when asked and
//! the rows written after it arrive.

use anyhow::{Context, Result};
use siphon_tests::outbox::{siphon_config, slot_active};
use siphon_tests::{read_topic_async, wait_for, wait_until, Broker, Postgres, SiphonProcess};
use std::time::Duration;

const EXIT_DEFINITE: i32 = 2;

/// Debezium's outbox shape, the aggregate id computed from the payload.
const GENERATED_OUTBOX: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) GENERATED ALWAYS AS ('order-' || (payload ->> 'n')) STORED,
    type varchar(255) NOT NULL,
    payload jsonb)";

fn row_id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_outbox_column_is_named_with_the_fix_for_the_version() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let major = pg.major_version().await?;
    let client = pg.connect().await?;
    client.batch_execute(GENERATED_OUTBOX).await?;
    // An existing publication, made as PostgreSQL makes it by default.
    client
        .batch_execute(
            "CREATE PUBLICATION s_pub FOR TABLE outbox WITH (publish_via_partition_root = true)",
        )
        .await?;
    let config = siphon_config(&pg, &broker, "s", "");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "s").await },
    )
    .await?;
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, type, payload) \
             VALUES ($1::text::uuid, 'Order', 'Created', '{\"n\": 1}')",
            &[&row_id(1)],
        )
        .await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    assert!(!log.contains("add it"), "a wrong fix:\n{log}");
    let mut needles = vec![
        r#"column "aggregateid" of table public.outbox"#,
        "generated column",
        "table.field.event.key",
        "dead-letter",
    ];
    if major >= 18 {
        needles.push(r#"ALTER PUBLICATION "s_pub" SET (publish_generated_columns = stored)"#);
    } else {
        needles.extend([
            "before 18",
            r#"ALTER TABLE "public"."outbox" ALTER COLUMN "aggregateid" DROP EXPRESSION"#,
            "publish_generated_columns = stored",
        ]);
    }
    for needle in needles {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }

    // The fix for the version, then the rows written before it to the dead-letter topic.
    if major >= 18 {
        client
            .batch_execute("ALTER PUBLICATION s_pub SET (publish_generated_columns = stored)")
            .await?;
        client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, type, payload) \
                 VALUES ($1::text::uuid, 'Order', 'Created', '{\"n\": 2}')",
                &[&row_id(2)],
            )
            .await?;
    } else {
        client
            .batch_execute("ALTER TABLE outbox ALTER COLUMN aggregateid DROP EXPRESSION")
            .await?;
        client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, 'Order', 'order-2', 'Created', '{\"n\": 2}')",
                &[&row_id(2)],
            )
            .await?;
    }
    let dead_letter_topic = broker.topic("outbox.dlq");
    std::fs::write(
        siphon.config_path(),
        siphon_config(
            &pg,
            &broker,
            "s",
            &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
        ),
    )?;
    siphon.start_again()?;
    let routed = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(
                &broker.bootstrap(),
                &broker.topic("outbox.event.Order"),
                Duration::from_secs(5),
            )
            .await?;
            Ok((!r.is_empty()).then_some(r))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    assert_eq!(routed.len(), 1, "{}", siphon.log());
    assert_eq!(routed[0].header("id"), Some(row_id(2).as_bytes()));
    let key = String::from_utf8_lossy(routed[0].key.as_deref().unwrap_or_default()).into_owned();
    assert!(key.contains("order-2"), "key {key}");
    let dead = read_topic_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(20),
    )
    .await?;
    assert_eq!(dead.len(), 1, "{}", siphon.log());
    let message =
        String::from_utf8_lossy(dead[0].header("siphon.error.message").unwrap_or_default())
            .into_owned();
    assert!(message.contains("generated column"), "{message}");
    Ok(())
}

/// On PostgreSQL 18 the publication Siphon creates publishes stored generated columns, so a
/// generated outbox column needs nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_18_the_publication_siphon_creates_publishes_generated_columns() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let major = pg.major_version().await?;
    if major < 18 {
        // The test command runs it on 18 only (and skips it by name on 15).
        return siphon_tests::prerequisite_missing(
            "on_18_the_publication_siphon_creates_publishes_generated_columns",
            &format!("generated columns are published from PostgreSQL 18 (this is {major})"),
        );
    }
    let client = pg.connect().await?;
    client.batch_execute(GENERATED_OUTBOX).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "s", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "s").await },
    )
    .await?;
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, type, payload) \
             VALUES ($1::text::uuid, 'Order', 'Created', '{\"n\": 7}')",
            &[&row_id(7)],
        )
        .await?;
    let routed = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(
                &broker.bootstrap(),
                &broker.topic("outbox.event.Order"),
                Duration::from_secs(5),
            )
            .await?;
            Ok((!r.is_empty()).then_some(r))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    let key = routed[0].key_str().unwrap_or_default();
    assert!(key.contains("order-7"), "key {key}");
    Ok(())
}
