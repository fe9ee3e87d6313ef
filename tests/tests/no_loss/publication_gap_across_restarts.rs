//! A publication gap that opens and closes while Siphon is stopped: the events committed in it
//! were not published, so Siphon must not stream on past them as if nothing happened. The
//! publication dropped and created again is caught on the stream (PostgreSQL refuses, or from 18
//! warns about, changes written while it was missing), and before that at the start, as the
//! next case is. A normal restart, a restart with an
//! outbox table added to the configuration after it was added to the publication, and a
//! publication and slot made just before the first start, start cleanly. An outbox table taken
//! out of the publication and added back while Siphon is stopped is caught at the next start:
//! the membership the last run saw, recorded in the Kafka state topic, names other catalog rows.
//! The slot and the publication dropped while Siphon is stopped (to take a snapshot again, or
//! after a roll-back) leave no gap: the new slot starts after the drop, so the start records
//! the publication it finds instead of comparing.

use anyhow::{Context, Result};
use siphon_tests::outbox::{defaults_config, slot_confirmed_lsn};
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::time::{Duration, Instant};

const EXIT_DEFINITE: i32 = 2;

const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)";

/// The publication `p` with the outbox table, as Siphon creates it.
const CREATE_PUBLICATION: &str = "CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert, update', publish_via_partition_root = true)";

fn config(pg: &Postgres, broker: &Broker, tables: &str) -> String {
    defaults_config(&pg.url(), broker, tables)
}

fn insert(table: &str, key: &str) -> String {
    format!("INSERT INTO {table} VALUES (gen_random_uuid(), 'Order', '{key}', 'T', '{{}}')")
}

/// Waits until a record with key `key` is in the test's `outbox.event.Order` topic.
async fn wait_for_key(broker: &Broker, siphon: &SiphonProcess, key: &str) -> Result<()> {
    let quoted = format!("\"{key}\"");
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let records = siphon_tests::read_topic_async(
                &broker.bootstrap(),
                &broker.topic("outbox.event.Order"),
                Duration::from_secs(30),
            )
            .await?;
            Ok(records
                .iter()
                .any(|r| r.key_str().as_deref() == Some(quoted.as_str())))
        },
    )
    .await
    .with_context(|| siphon.log())
}

/// Siphon streaming the outbox of a fresh database, one event delivered, then stopped with
/// SIGTERM.
struct Stopped {
    pg: Postgres,
    broker: Broker,
    client: tokio_postgres::Client,
    siphon: SiphonProcess,
}

async fn streamed_and_stopped(ddl: &str) -> Result<Stopped> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(ddl).await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker, r#""public.outbox""#))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client.batch_execute(&insert("outbox", "before")).await?;
    wait_for_key(&broker, &siphon, "before").await?;
    siphon.terminate()?;
    let status = siphon.wait_exit(Duration::from_secs(30))?;
    anyhow::ensure!(status.success(), "{status:?}: {}", siphon.log());
    Ok(Stopped {
        pg,
        broker,
        client,
        siphon,
    })
}

/// The server's current WAL position, as a number.
async fn current_lsn(client: &tokio_postgres::Client) -> Result<u64> {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0))?)
}

/// Runs `remove`, commits an event, runs `restore`, commits another, and starts Siphon again:
/// it must exit with the definite status (the log is returned), and the slot must not have
/// moved past the start of the gap.
async fn gap_while_stopped(stopped: &Stopped, remove: &str, restore: &str) -> Result<String> {
    let client = &stopped.client;
    let gap_start = current_lsn(client).await?;
    client.batch_execute(remove).await?;
    client.batch_execute(&insert("outbox", "in-gap")).await?;
    client.batch_execute(restore).await?;
    client.batch_execute(&insert("outbox", "after-gap")).await?;
    stopped.siphon.start_again()?;
    let status = stopped.siphon.wait_exit(Duration::from_secs(60));
    let log = stopped.siphon.log();
    assert_eq!(status?.code(), Some(EXIT_DEFINITE), "{log}");
    let confirmed = slot_confirmed_lsn(client, "s").await?.unwrap_or(0);
    assert!(
        confirmed <= gap_start,
        "the slot moved past the gap ({confirmed} > {gap_start}): {log}"
    );
    Ok(log)
}

/// Runs `siphon accept-publication-change` with the configuration of `stopped`.
fn accept(stopped: &Stopped) -> Result<()> {
    let (accepted, said) = stopped.siphon.command("accept-publication-change")?;
    anyhow::ensure!(accepted, "{said}");
    anyhow::ensure!(said.contains("recorded publication p"), "{said}");
    Ok(())
}

/// The publication dropped and created again while Siphon was stopped: the start finds another
/// publication than the one recorded and stops, naming the gap and the command that accepts
/// it. Accepted, the next start streams until the first change written while the publication
/// was missing, where the server refuses (before 18) or skips it with a warning (from 18):
/// Siphon stops there too, naming how to move the slot past it. The log of that start is
/// returned.
async fn recreated_publication_refused_twice(stopped: &Stopped, create: &str) -> Result<String> {
    let major = stopped.pg.major_version().await?;
    let log = gap_while_stopped(stopped, "DROP PUBLICATION p", create).await?;
    assert!(
        log.contains(r#"publication "p" was dropped and created again since Siphon last streamed from slot "s""#)
            && log.contains("siphon accept-publication-change")
            && log.contains("re-send"),
        "PostgreSQL {major}: {log}"
    );
    accept(stopped)?;
    let confirmed_before = slot_confirmed_lsn(&stopped.client, "s").await?.unwrap_or(0);
    stopped.siphon.start_again()?;
    let status = stopped.siphon.wait_exit(Duration::from_secs(60));
    let log = stopped.siphon.log();
    assert_eq!(status?.code(), Some(EXIT_DEFINITE), "{log}");
    let confirmed = slot_confirmed_lsn(&stopped.client, "s").await?.unwrap_or(0);
    assert_eq!(confirmed, confirmed_before, "the slot moved: {log}");
    assert!(
        log.contains("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())")
            && log.contains("re-send"),
        "PostgreSQL {major}: {log}"
    );
    Ok(log)
}

/// A `FOR ALL TABLES` publication (no catalog row per table) dropped and created again while
/// Siphon is stopped: caught at the start (the recorded publication is another one), then,
/// once accepted, on the stream: from PostgreSQL 18 the server skips the changes written while
/// it was missing with only a warning, before 18 it refuses them with an error. Either way
/// Siphon stops with the definite status, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_for_all_tables_dropped_and_created_again_while_stopped_stops_siphon(
) -> Result<()> {
    let all_tables = "CREATE PUBLICATION p FOR ALL TABLES WITH (publish = 'insert, update', publish_via_partition_root = true)";
    let stopped = streamed_and_stopped(&format!("{OUTBOX}; {all_tables}")).await?;
    let major = stopped.pg.major_version().await?;
    let log = recreated_publication_refused_twice(&stopped, all_tables).await?;
    let expected = if major >= 18 {
        r#"skipped loading publication "p""#
    } else {
        r#"publication "p" does not exist"#
    };
    assert!(log.contains(expected), "PostgreSQL {major}: {log}");
    Ok(())
}

/// The publication of the outbox table dropped and created again while Siphon is stopped:
/// caught at the start, then (accepted) on the stream at the first change written while it
/// was missing (an error before PostgreSQL 18, a warning made an error from 18), naming the
/// fix each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_dropped_and_created_again_while_stopped_stops_siphon() -> Result<()> {
    let stopped = streamed_and_stopped(OUTBOX).await?;
    recreated_publication_refused_twice(&stopped, CREATE_PUBLICATION).await?;
    Ok(())
}

/// An outbox table taken out of the publication and added back while Siphon is stopped (on any
/// PostgreSQL the stream says nothing: the server just did not publish the gap's events): the
/// next start finds other catalog rows than the ones the last run recorded in the state topic,
/// and stops with the definite status, naming the gap and `siphon accept-publication-change`.
/// Once that command ran, Siphon streams again, from where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_taken_out_and_added_back_while_stopped_stops_siphon_until_accepted(
) -> Result<()> {
    let stopped = streamed_and_stopped(OUTBOX).await?;
    let log = gap_while_stopped(
        &stopped,
        "ALTER PUBLICATION p DROP TABLE outbox",
        "ALTER PUBLICATION p ADD TABLE outbox",
    )
    .await?;
    assert!(
        log.contains(r#"outbox table "public"."outbox" was taken out of publication "p" and added back since Siphon last streamed from slot "s""#)
            && log.contains("siphon accept-publication-change"),
        "{log}"
    );

    // A second start without accepting refuses the same way: the record is unchanged.
    stopped.siphon.start_again()?;
    let status = stopped.siphon.wait_exit(Duration::from_secs(60))?;
    assert_eq!(
        status.code(),
        Some(EXIT_DEFINITE),
        "{}",
        stopped.siphon.log()
    );

    accept(&stopped)?;
    stopped.siphon.start_again()?;
    stopped
        .client
        .batch_execute(&insert("outbox", "after-accept"))
        .await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "after-gap").await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "after-accept").await?;
    anyhow::ensure!(stopped.siphon.is_running(), "{}", stopped.siphon.log());
    Ok(())
}

/// The rows that publish the outbox table replaced one at a time while Siphon streams (its
/// schema added to the publication, then the table's own row dropped: it stays published
/// throughout): each look that finds other rows records them in the state topic, so the next
/// start compares with the last ones seen and streams on (compared with the rows of the last
/// start it would take the table for one taken out and added back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_rows_replaced_while_streaming_then_a_restart_streams_on() -> Result<()> {
    let stopped = streamed_and_stopped(OUTBOX).await?;
    stopped.siphon.start_again()?;
    let client = &stopped.client;
    // Streaming again (its start has read and recorded the rows publishing the table).
    client.batch_execute(&insert("outbox", "restarted")).await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "restarted").await?;
    client
        .batch_execute("ALTER PUBLICATION p ADD TABLES IN SCHEMA public")
        .await?;
    // Two publication checks each time.
    tokio::time::sleep(Duration::from_secs(11)).await;
    client
        .batch_execute("ALTER PUBLICATION p DROP TABLE outbox")
        .await?;
    tokio::time::sleep(Duration::from_secs(11)).await;
    client
        .batch_execute(&insert("outbox", "while-running"))
        .await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "while-running").await?;
    stopped.siphon.terminate()?;
    let status = stopped.siphon.wait_exit(Duration::from_secs(30))?;
    anyhow::ensure!(status.success(), "{status:?}: {}", stopped.siphon.log());

    stopped.siphon.start_again()?;
    client
        .batch_execute(&insert("outbox", "after-restart"))
        .await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "after-restart").await?;
    anyhow::ensure!(stopped.siphon.is_running(), "{}", stopped.siphon.log());
    Ok(())
}

/// Waits until slot `s` exists (Siphon's start created it).
async fn wait_for_slot(stopped: &Stopped) -> Result<()> {
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { Ok(slot_confirmed_lsn(&stopped.client, "s").await?.is_some()) },
    )
    .await
    .with_context(|| stopped.siphon.log())
}

/// The slot and the publication dropped while Siphon is stopped, as docs/operations.md says to
/// take a snapshot again (and as a roll-back to a polling relay leaves them), twice: the state
/// topic still holds the publication the last run saw, but a slot that does not exist yet has
/// no gap. The first start (no snapshot) creates slot and publication, records the new
/// publication and streams; after the second drop `siphon accept-publication-change` succeeds
/// without a slot, saying the next start creates it, and a start with `source.snapshot =
/// "initial"` sends the row committed while the slot was missing, then streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_and_publication_dropped_while_stopped_start_afresh() -> Result<()> {
    let stopped = streamed_and_stopped(OUTBOX).await?;
    let client = &stopped.client;
    let drop_both = "SELECT pg_drop_replication_slot('s'); DROP PUBLICATION p";

    client.batch_execute(drop_both).await?;
    stopped.siphon.start_again()?;
    wait_for_slot(&stopped).await?;
    client.batch_execute(&insert("outbox", "new-slot")).await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "new-slot").await?;
    anyhow::ensure!(stopped.siphon.is_running(), "{}", stopped.siphon.log());
    stopped.siphon.terminate()?;
    let status = stopped.siphon.wait_exit(Duration::from_secs(30))?;
    anyhow::ensure!(status.success(), "{status:?}: {}", stopped.siphon.log());

    client.batch_execute(drop_both).await?;
    client.batch_execute(&insert("outbox", "no-slot")).await?;
    let (accepted, said) = stopped.siphon.command("accept-publication-change")?;
    anyhow::ensure!(
        accepted && said.contains(r#"slot s does not exist: Siphon's next start creates it"#),
        "{said}"
    );
    let with_snapshot = config(&stopped.pg, &stopped.broker, r#""public.outbox""#)
        .replace("tables = [", "snapshot = \"initial\"\ntables = [");
    std::fs::write(stopped.siphon.config_path(), with_snapshot)?;
    stopped.siphon.start_again()?;
    wait_for_key(&stopped.broker, &stopped.siphon, "no-slot").await?;
    client
        .batch_execute(&insert("outbox", "snapshot-taken"))
        .await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "snapshot-taken").await?;
    anyhow::ensure!(stopped.siphon.is_running(), "{}", stopped.siphon.log());
    Ok(())
}

/// Stopped and started again with nothing changed: Siphon streams on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_nothing_changed_streams_on() -> Result<()> {
    let stopped = streamed_and_stopped(OUTBOX).await?;
    stopped
        .client
        .batch_execute(&insert("outbox", "while-stopped"))
        .await?;
    stopped.siphon.start_again()?;
    stopped
        .client
        .batch_execute(&insert("outbox", "after-restart"))
        .await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "while-stopped").await?;
    wait_for_key(&stopped.broker, &stopped.siphon, "after-restart").await?;
    anyhow::ensure!(stopped.siphon.is_running(), "{}", stopped.siphon.log());
    Ok(())
}

/// A second outbox table added to the publication while Siphon streams (with a configuration
/// that does not name it yet), then named in the configuration and Siphon restarted: no gap,
/// Siphon streams both tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_added_to_the_publication_then_to_the_configuration_streams() -> Result<()>
{
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(&format!(
            "{OUTBOX}; {}",
            OUTBOX.replace("TABLE outbox", "TABLE outbox2")
        ))
        .await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker, r#""public.outbox""#))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client
        .batch_execute("ALTER PUBLICATION p ADD TABLE outbox2")
        .await?;
    let xid: String = client
        .query_one(
            "SELECT xmin::text FROM pg_publication_rel WHERE prrelid = 'outbox2'::regclass",
            &[],
        )
        .await?
        .get(0);
    client.batch_execute(&insert("outbox", "streaming")).await?;
    wait_for_key(&broker, &siphon, "streaming").await?;
    // The slot's catalog horizon passes the ALTER once the server has logged its running
    // transactions (at most every 15 s with activity) and Siphon confirmed past that.
    let since = Instant::now();
    wait_until(
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let passed: bool = client
                .query_one(
                    "SELECT age(catalog_xmin) < age($1::text::xid) FROM pg_replication_slots WHERE slot_name = 's'",
                    &[&xid],
                )
                .await?
                .get(0);
            Ok(passed)
        },
    )
    .await
    .with_context(|| siphon.log())?;
    eprintln!(
        "the slot's catalog_xmin passed the ALTER PUBLICATION after {:?}",
        since.elapsed()
    );
    siphon.terminate()?;
    siphon.wait_exit(Duration::from_secs(30))?;
    std::fs::write(
        siphon.config_path(),
        config(&pg, &broker, r#""public.outbox", "public.outbox2""#),
    )?;
    siphon.start_again()?;
    client
        .batch_execute(&format!(
            "{}; {}",
            insert("outbox", "first"),
            insert("outbox2", "second")
        ))
        .await?;
    wait_for_key(&broker, &siphon, "first").await?;
    wait_for_key(&broker, &siphon, "second").await?;
    anyhow::ensure!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}

/// The publication and the slot made by a provisioning script just before the first start,
/// while another slot holds the database's catalog horizon back (so the new slot's
/// `catalog_xmin` is older than the publication's transaction): no gap, Siphon streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_and_slot_made_just_before_the_first_start_stream() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('other', 'pgoutput')")
        .await?;
    // Something of the other slot's to keep its catalog_xmin behind.
    client
        .batch_execute(&insert("outbox", "unpublished"))
        .await?;
    client.batch_execute(CREATE_PUBLICATION).await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await?;
    let siphon = SiphonProcess::start(&config(&pg, &broker, r#""public.outbox""#))?;
    client.batch_execute(&insert("outbox", "first")).await?;
    wait_for_key(&broker, &siphon, "first").await?;
    anyhow::ensure!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
