//! Definite errors: Siphon stops with exit status 2 and a message naming the fix, instead of
//! retrying forever or skipping data. Settings that can never work are refused before anything
//! connects, by `siphon check-config` and by `siphon run` alike (exit status 1).

use anyhow::{Context, Result};
use siphon_tests::outbox::defaults_config;
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::time::Duration;

const EXIT_DEFINITE: i32 = 2;

/// A minimal configuration: Siphon's defaults, with records routed into the test's topic
/// namespace.
fn config(pg: &Postgres, broker: &Broker) -> String {
    defaults_config(&pg.url(), broker, r#""public.outbox""#)
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

/// Settings refused before connecting, each naming the key and the fix: a shutdown timeout
/// written as "forever" (`i64::MAX` seconds: it passed `check-config`, then SIGTERM panicked
/// on an `Instant` overflow), the same through its environment variable, a delivery timeout
/// beyond librdkafka's range, and a `transactional.id` property with at-least-once delivery
/// (it passed, then the producer failed without naming the property).
#[test]
fn out_of_range_and_reserved_settings_are_refused_before_connecting() -> Result<()> {
    const EXIT_CONFIG: i32 = 1;
    let base = "[source]\nurl = \"postgres://siphon@127.0.0.1:1/app\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n";
    const FOREVER: &str = "9223372036854775807";
    // (the file's extra lines, environment variables, what the refusal says)
    type Case = (
        String,
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            format!("[pipeline]\nshutdown_timeout_secs = {FOREVER}\n"),
            &[],
            "pipeline.shutdown_timeout_secs = 9223372036854775807 is out of range: it must be 0 to 86400",
        ),
        (
            String::new(),
            &[("SIPHON_PIPELINE_SHUTDOWN_TIMEOUT_SECS", FOREVER)],
            "pipeline.shutdown_timeout_secs = 9223372036854775807 is out of range",
        ),
        (
            format!("[kafka.properties]\n\"message.timeout.ms\" = {FOREVER}\n"),
            &[],
            "kafka.properties.\"message.timeout.ms\" = \"9223372036854775807\" is out of range: it must be 0 to 2147483647 milliseconds",
        ),
        (
            "[kafka.properties]\n\"transactional.id\" = \"orders\"\n".to_owned(),
            &[],
            "kafka.properties.\"transactional.id\" is set by Siphon itself: remove the property and use kafka.delivery = \"exactly-once\"",
        ),
    ];
    let bin = siphon_tests::siphon_bin()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("siphon.toml");
    for (extra, env, needle) in &cases {
        let text = format!("{base}{extra}");
        std::fs::write(&path, &text)?;
        let output = std::process::Command::new(&bin)
            .args(["check-config", "--config"])
            .arg(&path)
            .envs(env.iter().copied())
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(EXIT_CONFIG),
            "check-config {text} {env:?}: {stderr}"
        );
        assert!(
            stderr.contains(needle),
            "check-config {text} {env:?}: {stderr}"
        );
        let run = SiphonProcess::start_with(&bin, &text, env)?;
        let status = run.wait_exit(Duration::from_secs(20))?;
        assert_eq!(
            status.code(),
            Some(EXIT_CONFIG),
            "run {text} {env:?}: {}",
            run.log()
        );
        assert!(
            run.log().contains(needle),
            "run {text} {env:?}: {}",
            run.log()
        );
    }
    Ok(())
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

/// Fresh services with the tables of `ddl`, and Siphon streaming from them.
async fn streaming(ddl: &str) -> Result<(Postgres, Broker, tokio_postgres::Client, SiphonProcess)> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(ddl).await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    Ok((pg, broker, client, siphon))
}

/// Streams, runs `sql` on the database, and returns Siphon's log after it exited with the
/// definite-error status.
async fn definite_exit_after(sql: &str) -> Result<String> {
    let (_pg, _broker, client, siphon) = streaming(OUTBOX).await?;
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
    let (_pg, _broker, client, siphon) = streaming(OUTBOX).await?;
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

/// The publication `p` with the outbox table, as Siphon creates it.
const CREATE_PUBLICATION: &str = "CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert, update', publish_via_partition_root = true)";

/// Siphon and its services after a publication gap.
struct PublicationGap {
    /// Kept running until the test ends.
    _pg: Postgres,
    broker: Broker,
    client: tokio_postgres::Client,
    siphon: SiphonProcess,
    /// Siphon's exit status (`None`: still running 30 s after the gap).
    status: Option<i32>,
    /// The server's major version.
    major: u32,
}

/// Streams while a writer commits an outbox row every 20 ms, runs `remove`, and `restore` 300 ms
/// later (well within one publication check), so that every check sees a healthy publication.
async fn publication_gap(remove: &str, restore: &str) -> Result<PublicationGap> {
    let (pg, broker, client, siphon) = streaming(OUTBOX).await?;
    let writer = pg.connect().await?;
    let writing = tokio::spawn(async move {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            writer
                .batch_execute(
                    "INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'o-1', 'T', '{}')",
                )
                .await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::Ok(())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.batch_execute(remove).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.batch_execute(restore).await?;
    writing.await??;
    let status = siphon.wait_exit(Duration::from_secs(30)).ok();
    let major = pg.major_version().await?;
    Ok(PublicationGap {
        _pg: pg,
        broker,
        client,
        siphon,
        status: status.and_then(|s| s.code()),
        major,
    })
}

/// Does what the stopped Siphon's error says (accepting the publication as it is now with
/// `siphon accept-publication-change`, moving the slot on when it names that), restarts Siphon,
/// and again while a restart stops with a further fix named (before PostgreSQL 18 the server
/// refuses the changes written while a publication was missing on every start until the slot
/// moves past them), then checks that an event written afterwards reaches Kafka.
async fn follow_the_fix_and_stream_again(gap: &PublicationGap) -> Result<()> {
    let advance = "SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())";
    let accept = "siphon accept-publication-change";
    let mut read_up_to = 0;
    for _ in 0..3 {
        let log = gap.siphon.log();
        let latest = &log[read_up_to..];
        read_up_to = log.len();
        anyhow::ensure!(
            latest.contains(advance) || latest.contains(accept),
            "no fix named: {log}"
        );
        if latest.contains(advance) {
            gap.client.batch_execute(advance).await?;
        }
        if latest.contains(accept) {
            let (accepted, said) = gap.siphon.command("accept-publication-change")?;
            anyhow::ensure!(accepted, "{said}");
        }
        gap.siphon.start_again()?;
        // A refusal comes at the start, or right after the stream starts, at the first change
        // of the gap.
        wait_until(
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                Ok(
                    !gap.siphon.is_running()
                        || gap.siphon.log()[read_up_to..].contains("streaming"),
                )
            },
        )
        .await
        .with_context(|| gap.siphon.log())?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if gap.siphon.is_running() {
            break;
        }
        let status = gap.siphon.wait_exit(Duration::from_secs(10))?;
        anyhow::ensure!(
            status.code() == Some(EXIT_DEFINITE),
            "{status:?}: {}",
            gap.siphon.log()
        );
    }
    gap.client
        .batch_execute(
            "INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000001', 'Order', 'after', 'T', '{}')",
        )
        .await?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let records = siphon_tests::read_topic_async(
                &gap.broker.bootstrap(),
                &gap.broker.topic("outbox.event.Order"),
                Duration::from_secs(30),
            )
            .await?;
            Ok(records
                .iter()
                .any(|r| r.key_str().as_deref() == Some(r#""after""#)))
        },
    )
    .await
    .with_context(|| gap.siphon.log())?;
    anyhow::ensure!(gap.siphon.is_running(), "{}", gap.siphon.log());
    Ok(())
}

/// The publication dropped and created again between two checks: every check sees it healthy,
/// yet PostgreSQL published nothing for the rows committed while it was missing. From
/// PostgreSQL 18 the stream says nothing: Siphon notices the new publication and stops, saying
/// what was lost and what to do. Before 18 the server stops the stream itself at the first row
/// written while the publication was missing ("publication does not exist"; from 18 a warning
/// that it skipped them), usually before Siphon's check; either way Siphon stops with the loss
/// and the fix, and the fix works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_dropped_and_created_again_between_two_checks_stops_siphon() -> Result<()> {
    let gap = publication_gap("DROP PUBLICATION p", CREATE_PUBLICATION).await?;
    let (log, major) = (gap.siphon.log(), gap.major);
    assert_eq!(gap.status, Some(EXIT_DEFINITE), "{log}");
    let seen_by_siphon = log.contains(r#"publication "p" was dropped and created again"#)
        && log.contains("cannot be read from this slot");
    let refused_by_the_server = log.contains(r#"publication "p" does not exist"#)
        && log.contains("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())");
    // From 18 the server skips such changes with a warning on the stream, which Siphon takes
    // for the same loss.
    let skipped_by_the_server = log.contains(r#"skipped loading publication "p""#)
        && log.contains("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())");
    assert!(
        seen_by_siphon
            || (major < 18 && refused_by_the_server)
            || (major >= 18 && skipped_by_the_server),
        "PostgreSQL {major}: {log}"
    );
    follow_the_fix_and_stream_again(&gap).await
}

/// The outbox table taken out of the publication and added back between two checks: the rows
/// committed in between were never published, on every version and without an error on the
/// stream. Siphon notices the new membership and stops, saying what was lost and what to do;
/// restarted, it streams on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_removed_and_added_back_between_two_checks_stops_siphon() -> Result<()> {
    let gap = publication_gap(
        "ALTER PUBLICATION p DROP TABLE outbox",
        "ALTER PUBLICATION p ADD TABLE outbox",
    )
    .await?;
    let log = gap.siphon.log();
    assert_eq!(gap.status, Some(EXIT_DEFINITE), "{log}");
    assert!(
        log.contains(
            r#"outbox table "public"."outbox" was taken out of publication "p" and added back"#
        ),
        "{log}"
    );
    follow_the_fix_and_stream_again(&gap).await
}
/// The publication dropped and created again while Siphon reconnects (between two sessions):
/// the next session must not take the new publication for the one it streamed with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_created_again_while_reconnecting_stops_siphon() -> Result<()> {
    let (pg, _broker, client, siphon) = streaming(OUTBOX).await?;
    // Cut the replication connection; the gap fits in the first backoff (at least 500 ms).
    client
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'; \
             DROP PUBLICATION p; \
             INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'o-1', 'T', '{{}}'); \
             {CREATE_PUBLICATION}"
        ))
        .await?;
    let status = siphon.wait_exit(Duration::from_secs(30));
    let log = siphon.log();
    assert_eq!(status?.code(), Some(EXIT_DEFINITE), "{log}");
    let major = pg.major_version().await?;
    assert!(
        log.contains(r#"publication "p" was dropped and created again"#)
            || (major < 18 && log.contains(r#"publication "p" does not exist"#)),
        "PostgreSQL {major}: {log}"
    );
    Ok(())
}

/// Other tables added to and removed from the publication change nothing for the outbox:
/// Siphon goes on streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tables_added_to_and_removed_from_the_publication_do_not_stop_siphon() -> Result<()> {
    let (_pg, broker, client, siphon) = streaming(&format!(
        "{OUTBOX}; CREATE TABLE other (id int PRIMARY KEY); CREATE TABLE third (id int PRIMARY KEY)"
    ))
    .await?;
    client
        .batch_execute("ALTER PUBLICATION p ADD TABLE other, third")
        .await?;
    // Two publication checks.
    tokio::time::sleep(Duration::from_secs(11)).await;
    client
        .batch_execute(
            "ALTER PUBLICATION p DROP TABLE third; INSERT INTO other VALUES (1); \
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000001', 'Order', 'o-1', 'T', '{}')",
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(siphon.is_running(), "{}", siphon.log());
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let records = siphon_tests::read_topic_async(
                &broker.bootstrap(),
                &broker.topic("outbox.event.Order"),
                Duration::from_secs(30),
            )
            .await?;
            Ok(records.len() == 1)
        },
    )
    .await
    .with_context(|| siphon.log())?;
    Ok(())
}
