//! Definite errors: Siphon stops with exit status 2 and a message naming the fix, instead of
//! retrying forever or skipping data.

use anyhow::{Context, Result};
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::time::Duration;

const EXIT_DEFINITE: i32 = 2;

fn config(pg: &Postgres, broker: &Broker) -> String {
    format!(
        r#"
[source]
url = "{}"
slot = "s"
publication = "p"
tables = ["public.outbox"]

[kafka]
bootstrap_servers = "{}"

[metrics]
listen = "127.0.0.1:0"
"#,
        pg.url(),
        broker.bootstrap()
    )
}

const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)";

/// Starts Siphon, waits for it to exit and returns its log; fails unless the exit status is 2.
fn expect_definite_error(pg: &Postgres, broker: &Broker) -> Result<String> {
    let siphon = SiphonProcess::start(&config(pg, broker))?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(
        status.code(),
        Some(EXIT_DEFINITE),
        "exit status {status:?}; log:\n{log}"
    );
    Ok(log)
}

/// `source.failover = true`: refused with the fix before PostgreSQL 17; from 17 an existing slot
/// made without failover is switched to a failover slot before streaming, and the missing
/// `synchronized_standby_slots` is warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_switches_an_existing_slot_or_names_the_version_it_needs() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await?;
    let config = config(&pg, &broker).replace("[source]\n", "[source]\nfailover = true\n");
    let siphon = SiphonProcess::start(&config)?;
    if pg.major_version().await? < 17 {
        let status = siphon.wait_exit(Duration::from_secs(60))?;
        let log = siphon.log();
        assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
        assert!(
            log.contains("needs failover slots") && log.contains("set source.failover = false"),
            "{log}"
        );
        return Ok(());
    }
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let failover: bool = client
        .query_one(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = 's'",
            &[],
        )
        .await?
        .get(0);
    let log = siphon.log();
    assert!(failover, "{log}");
    assert!(
        log.contains("replication slot is now a failover slot"),
        "{log}"
    );
    assert!(log.contains("synchronized_standby_slots is empty"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_outbox_table_is_named() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let log = expect_definite_error(&pg, &broker)?;
    assert!(
        log.contains("outbox table public.outbox does not exist"),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_without_the_table_names_the_alter_to_run() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute(
            "CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE other",
        )
        .await?;
    let log = expect_definite_error(&pg, &broker)?;
    assert!(
        log.contains(r#"ALTER PUBLICATION "p" ADD TABLE "public"."outbox""#),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_with_another_plugin_is_refused() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        .await?;
    let log = expect_definite_error(&pg, &broker)?;
    assert!(
        log.contains("plugin test_decoding") && log.contains("pgoutput"),
        "{log}"
    );
    // The slot is left alone: its position is the only record of what was delivered.
    let plugin: String = client
        .query_one(
            "SELECT plugin FROM pg_replication_slots WHERE slot_name = 's'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(plugin, "test_decoding");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_without_a_configured_column_is_named_and_the_row_is_not_skipped(
) -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute("CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, type text NOT NULL, payload jsonb)")
        .await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client
        .batch_execute(
            "INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'OrderCreated', '{}')",
        )
        .await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    assert!(
        log.contains("aggregateid") && log.contains("table.field.event.key"),
        "{log}"
    );
    // The row was not skipped: a restart stops on it again (the dead-letter policy is the way
    // past a row that can never be routed).
    siphon.start_again()?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{}", siphon.log());
    let failures = siphon.log().matches("table.field.event.key").count();
    assert!(
        failures >= 2,
        "both runs stop on the same row:\n{}",
        siphon.log()
    );
    Ok(())
}

/// Streams, runs `sql` on the database, and returns Siphon's log after it exited with the
/// definite-error status.
async fn definite_exit_after(sql: &str) -> Result<String> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client.batch_execute(sql).await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    Ok(log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_dropped_while_streaming_stops_siphon_naming_the_fix() -> Result<()> {
    let log = definite_exit_after(
        "DROP PUBLICATION p; INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'o-1', 'T', '{}')",
    )
    .await?;
    assert!(
        log.contains("publication") && log.contains("CREATE PUBLICATION"),
        "{log}"
    );
    Ok(())
}

/// Taking the outbox table out of the publication makes PostgreSQL publish nothing for it, on
/// every version, without any error on the stream: Siphon notices and stops, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_taken_out_of_the_publication_stops_siphon_naming_the_fix() -> Result<()> {
    let log = definite_exit_after("ALTER PUBLICATION p DROP TABLE outbox").await?;
    assert!(
        log.contains(r#"ALTER PUBLICATION "p" ADD TABLE "public"."outbox""#),
        "{log}"
    );
    Ok(())
}

/// The slot disappears between two sessions of one process (dropped, or a failover to a standby
/// without a synchronized copy): creating it anew would start after the events committed
/// meanwhile and lose them silently, so Siphon stops and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_between_sessions_is_not_created_again_silently() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    // Cut the replication connection and drop the slot before Siphon reconnects (its backoff).
    client
        .batch_execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'",
        )
        .await?;
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(10),
        || async {
            Ok(client
                .batch_execute("SELECT pg_drop_replication_slot('s')")
                .await
                .is_ok())
        },
    )
    .await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    assert!(
        log.contains("no longer exists on this server although Siphon streamed from it"),
        "{log}"
    );
    assert_eq!(log.matches("created replication slot").count(), 1, "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_a_definite_error_naming_the_fix() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        .await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await?;
    // WAL well past the limit while nothing reads the slot, then checkpoints remove it.
    client
        .batch_execute("CREATE TABLE filler (id int, t text); INSERT INTO filler SELECT g, repeat('x', 500) FROM generate_series(1, 200000) g;")
        .await?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            client
                .batch_execute("SELECT pg_switch_wal(); CHECKPOINT;")
                .await?;
            let status: Option<String> = client
                .query_one(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 's'",
                    &[],
                )
                .await?
                .get(0);
            Ok(status.as_deref() == Some("lost"))
        },
    )
    .await
    .context("the slot was not invalidated")?;
    let log = expect_definite_error(&pg, &broker)?;
    assert!(
        log.contains("invalidated") && log.contains("pg_drop_replication_slot('s')"),
        "{log}"
    );
    Ok(())
}
