//! Exactly-once delivery across a long silent decode inside one PostgreSQL transaction.
//!
//! The transaction inserts an outbox row (event A), then millions of rows into a table outside
//! the publication, then another outbox row (event B), and commits. pgoutput sends a
//! transaction only once its commit is decoded (Siphon asks for no streaming of transactions in
//! progress), so Siphon receives BEGIN and A, then nothing for seconds while the walsender reads
//! the other table's spilled changes back, then B and COMMIT. A opens a Kafka transaction, and
//! the broker aborts a transaction left open past `transaction.timeout.ms` (4 s here). Siphon
//! commits a Kafka transaction inside a PostgreSQL transaction once it has been open
//! 4 x `kafka.transaction_interval_ms` (2 s here), whether or not anything arrives, so nothing
//! is left open for the broker to abort.
//!
//! - Without a restart, on a broker of its own that looks for timed-out transactions every
//!   200 ms (Kafka's default of 10 s would need a silence three times as long): A and B reach
//!   the broker once each, in order, read_committed and read_uncommitted alike (nothing
//!   aborted, nothing sent again), and the session is never interrupted. The silence is
//!   measured between the two records' timestamps (when Siphon sent each) and must exceed the
//!   transaction timeout plus that scan, with a margin, so that a Kafka transaction left open
//!   across it would have been aborted: the test cannot pass for want of a long silence.
//! - With `kill -9` during the silence, once A is committed and before B is sent: the next
//!   session (which waits for the old walsender to let go of the slot: it notices the dead
//!   connection only when it sends B) decodes the transaction again, skips A and sends B; each
//!   once.
//!
//! The rows are written with one `COPY ... FROM PROGRAM` (the harness's user is a superuser),
//! in a fraction of the silence they make; `INSERT ... SELECT` takes twice as long as it.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, event, exactly_once_config, insert_events,
    insert_transaction, read_event_records_isolated, read_event_records_settled, record_id,
    slot_active, wait_for_all, Event, OUTBOX_DDL,
};
use siphon_tests::{
    read_topic_isolated_async, siphon_bin, strip_ansi, wait_for, wait_until, Broker,
    ConsumedRecord, Isolation, Postgres, SiphonProcess,
};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Rows written to the table outside the publication between A and B, without a restart: 8 to
/// 16 s of silence on a 2-core machine (about 1 µs a row idle, twice that when busy).
const ROWS: i64 = 8_000_000;

/// The same with the kill: the silence only has to outlast A's commit and the test's look.
const ROWS_KILLED: i64 = 5_000_000;

/// `kafka.properties."transaction.timeout.ms"`: how long the broker lets a Kafka transaction
/// stay open.
const TRANSACTION_TIMEOUT: Duration = Duration::from_millis(4_000);

/// `kafka.transaction_interval_ms`: the longest Siphon accepts with that timeout (8 x 500 ms).
const TRANSACTION_INTERVAL_MS: u64 = 500;

/// How often the broker of the first test looks for timed-out transactions
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`).
const BROKER_ABORT_SCAN: Duration = Duration::from_millis(200);

/// A (before the rows) and B (after them): the same aggregate (`order-15`), so the same key and
/// partition.
const A: u64 = 100;
const B: u64 = 151;

/// Siphon's configuration for slot `slot`: exactly-once, the short transaction timeout and the
/// interval that goes with it.
fn config(pg: &Postgres, broker: &Broker, slot: &str) -> Result<String> {
    let config = exactly_once_config(pg, broker, slot)
        .replacen(
            "delivery = \"exactly-once\"",
            &format!(
                "delivery = \"exactly-once\"\ntransaction_interval_ms = {TRANSACTION_INTERVAL_MS}"
            ),
            1,
        )
        .replacen(
            "\"message.timeout.ms\" = \"10000\"",
            &format!(
                "\"message.timeout.ms\" = \"10000\"\n\"transaction.timeout.ms\" = \"{}\"",
                TRANSACTION_TIMEOUT.as_millis()
            ),
            1,
        );
    anyhow::ensure!(
        config.contains("transaction_interval_ms") && config.contains("transaction.timeout.ms"),
        "{config}"
    );
    Ok(config)
}

/// Starts the database, its tables and Siphon (its commits logged), and waits until a first
/// ordinary transaction (events 1-3) arrived, so that the topics exist.
async fn start(
    broker: &Broker,
    slot: &str,
) -> Result<(Postgres, Client, SiphonProcess, Vec<Event>)> {
    let pg = Postgres::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE TABLE busy (id bigint)")
        .await?;
    let siphon = SiphonProcess::start_with(
        &siphon_bin()?,
        &config(&pg, broker, slot)?,
        &[("RUST_LOG", "info,siphon::session=debug")],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, slot).await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;
    let first: Vec<Event> = (1..=3).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &first, true).await?;
    wait_for_all(broker, &ids(&first), Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    Ok((pg, client, siphon, first))
}

fn ids(events: &[Event]) -> BTreeSet<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// One transaction: A, `rows` rows into `busy` (one `COPY`: written in a fraction of the time
/// the walsender takes to decode them), B; the outbox emptied; committed. Returns how long it
/// took.
async fn write_around_rows(client: &mut Client, rows: i64) -> Result<Duration> {
    let started = Instant::now();
    let tx = client.transaction().await?;
    insert_events(&tx, &[event(A, true)]).await?;
    tx.batch_execute(&format!("COPY busy FROM PROGRAM 'seq 1 {rows}'"))
        .await?;
    insert_events(&tx, &[event(B, true)]).await?;
    tx.execute("DELETE FROM outbox", &[]).await?;
    tx.commit().await?;
    Ok(started.elapsed())
}

/// The records of event `seq` among `records`.
fn of(records: &[ConsumedRecord], seq: u64) -> Vec<&ConsumedRecord> {
    let id = event(seq, true).id;
    records.iter().filter(|r| record_id(r) == id).collect()
}

/// Checks what reached the broker: read_committed, once every transaction settled, each event
/// of `expected` once and nothing else, first deliveries in commit order per aggregate, B after
/// A on their partition and in position; read_uncommitted, each once too (no aborted copy).
/// Returns A's and B's records.
async fn check_each_once(
    broker: &Broker,
    expected: &BTreeSet<String>,
) -> Result<(ConsumedRecord, ConsumedRecord)> {
    let committed = read_event_records_settled(broker).await?;
    let seen = count_by_id(&committed);
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    anyhow::ensure!(
        repeated.is_empty(),
        "read_committed saw repeats: {repeated:?}"
    );
    let ids: BTreeSet<String> = seen.keys().cloned().collect();
    anyhow::ensure!(
        &ids == expected,
        "read_committed saw {ids:?}, expected {expected:?}"
    );
    check_first_deliveries_in_order(&committed)?;
    let (a, b) = (of(&committed, A)[0].clone(), of(&committed, B)[0].clone());
    anyhow::ensure!(
        a.topic == b.topic && a.partition == b.partition && a.offset < b.offset,
        "A and B out of order: {a:?} {b:?}"
    );
    let position = |r: &ConsumedRecord| r.header("siphon.position").map(<[u8]>::to_vec);
    anyhow::ensure!(
        position(&a).is_some() && position(&a) < position(&b),
        "positions out of order: {a:?} {b:?}"
    );
    let all = count_by_id(&read_event_records_isolated(broker, Isolation::ReadUncommitted).await?);
    anyhow::ensure!(
        all.values().all(|n| *n == 1),
        "records in aborted transactions: {all:?}"
    );
    Ok((a, b))
}

/// Every record of the topic A and B go to, read with `isolation`.
async fn read_order_topic(broker: &Broker, isolation: Isolation) -> Result<Vec<ConsumedRecord>> {
    let topic = broker.topic("outbox.event.Order");
    read_topic_isolated_async(
        &broker.bootstrap(),
        &topic,
        Duration::from_secs(30),
        isolation,
    )
    .await
}

/// Waits until every event of `expected` is read_committed; fails at once when Siphon's log
/// shows an interrupted session (a broker that aborted the open transaction fails the next
/// request of the producer, and every session after it would meet the same silence).
async fn wait_for_all_uninterrupted(
    broker: &Broker,
    siphon: &SiphonProcess,
    expected: &BTreeSet<String>,
) -> Result<()> {
    let outcome = wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let log = strip_ansi(&siphon.log());
            let interrupted = interruptions(&log);
            if !interrupted.is_empty() {
                return Ok(Some(Err(anyhow::anyhow!(
                    "the session was interrupted: {interrupted:#?}"
                ))));
            }
            wait_for_all(broker, expected, Duration::ZERO).await?;
            Ok(Some(Ok(())))
        },
    )
    .await
    .and_then(|outcome| outcome);
    outcome.with_context(|| siphon.log())
}

/// Lines of `log` that contain `needle`.
fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// Lines of `log` that say a session ended or a producer was fenced, but for a start that waits
/// for the slot (after a `kill -9`, the old walsender holds it until it next writes to the dead
/// connection: here, once it has decoded its way to B).
fn interruptions(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("pipeline interrupted") || l.contains("fenced") || l.contains(" ERROR ")
        })
        .filter(|l| !l.contains("is in use by another process; waiting to take over"))
        .collect()
}

/// A and B once each across a silence longer than the transaction timeout plus the broker's
/// scan, with no session interrupted: the Kafka transaction A opened was committed inside the
/// PostgreSQL transaction, before the broker could abort it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_transaction_is_not_left_open_while_one_postgres_transaction_decodes_in_silence(
) -> Result<()> {
    let test_started = Instant::now();
    let scan = BROKER_ABORT_SCAN.as_millis().to_string();
    let broker = Broker::start_own(&[(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        &scan,
    )])?;
    let (_pg, mut client, siphon, first) = start(&broker, "eossilent").await?;

    let written_in = write_around_rows(&mut client, ROWS).await?;
    let after: Vec<Event> = (200..=204).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &after, true).await?;
    let mut expected = ids(&first);
    expected.extend([event(A, true).id, event(B, true).id]);
    expected.extend(ids(&after));
    wait_for_all_uninterrupted(&broker, &siphon, &expected).await?;

    let (a, b) = check_each_once(&broker, &expected)
        .await
        .with_context(|| siphon.log())?;
    let sent_apart = b.timestamp.unwrap_or(0) - a.timestamp.unwrap_or(0);
    let silence = Duration::from_millis(u64::try_from(sent_apart).unwrap_or(0));
    let log = strip_ansi(&siphon.log());
    let commits = lines_with(&log, "Kafka transaction commit ended").len();
    let sessions = lines_with(&log, "exactly-once delivery: ").len();
    eprintln!(
        "{ROWS} rows written in {written_in:?} between A and B; B sent {silence:?} after A; \
         {commits} Kafka transaction commits; the test took {:?}",
        test_started.elapsed()
    );
    let interrupted = interruptions(&log);
    assert!(
        interrupted.is_empty(),
        "the session was interrupted: {interrupted:#?}\n{log}"
    );
    assert_eq!(sessions, 1, "one session throughout:\n{log}");
    // A transaction opened with A and left open would have been aborted by the first scan after
    // its timeout, before B was even sent (and its commit comes an interval after that).
    let needed = TRANSACTION_TIMEOUT + BROKER_ABORT_SCAN + Duration::from_millis(500);
    assert!(
        silence >= needed,
        "B was sent only {silence:?} after A: a Kafka transaction left open that long need not \
         have been aborted by the broker, so this run shows nothing (more ROWS are needed)"
    );
    assert!(siphon.is_running());
    Ok(())
}

/// `kill -9` once A is committed and before B is sent: the next session resumes inside the
/// PostgreSQL transaction, after A; A and B once each, and no aborted copy of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_the_silence_after_a_committed_the_next_session_sends_b_alone() -> Result<()> {
    let test_started = Instant::now();
    let broker = Broker::start()?;
    let (_pg, mut client, siphon, first) = start(&broker, "eossilentkill").await?;

    let written_in = write_around_rows(&mut client, ROWS_KILLED).await?;
    let (a_id, b_id) = (event(A, true).id, event(B, true).id);
    // A is committed by the split of its PostgreSQL transaction: read_committed sees it.
    let a_seen = wait_for(
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async {
            let records = read_order_topic(&broker, Isolation::ReadCommitted).await?;
            Ok(records
                .iter()
                .any(|r| record_id(r) == a_id)
                .then(Instant::now))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    siphon.kill9()?;
    let killed_after = a_seen.elapsed();
    // Nothing more can come from the killed process: B was not sent yet, so the kill fell into
    // the silence.
    let sent = read_order_topic(&broker, Isolation::ReadUncommitted).await?;
    assert!(
        !sent.iter().any(|r| record_id(r) == b_id),
        "B was sent before the kill ({killed_after:?} after A was seen): the kill missed the \
         silence, so this run shows nothing (more ROWS_KILLED are needed)\n{}",
        siphon.log()
    );

    let restarted = Instant::now();
    siphon.start_again()?;
    let after: Vec<Event> = (200..=204).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &after, true).await?;
    let mut expected = ids(&first);
    expected.extend([a_id, b_id]);
    expected.extend(ids(&after));
    wait_for_all_uninterrupted(&broker, &siphon, &expected).await?;
    let delivered_in = restarted.elapsed();
    check_each_once(&broker, &expected)
        .await
        .with_context(|| siphon.log())?;
    let log = strip_ansi(&siphon.log());
    let resumed = lines_with(&log, "resuming after the last committed progress");
    let slot_waits = lines_with(&log, "waiting to take over").len();
    eprintln!(
        "{ROWS_KILLED} rows written in {written_in:?} between A and B; killed {killed_after:?} \
         after A was seen committed, before B was sent; restarted, {slot_waits} waits for the \
         old walsender to free the slot, everything read_committed {delivered_in:?} after the \
         restart; the test took {:?}; {resumed:?}",
        test_started.elapsed()
    );
    assert!(
        resumed.len() == 1 && resumed[0].contains("through record 0"),
        "the second session resumed after A, inside its PostgreSQL transaction:\n{log}"
    );
    let interrupted = interruptions(&log);
    assert!(
        interrupted.is_empty(),
        "a session was interrupted: {interrupted:#?}\n{log}"
    );
    assert!(siphon.is_running());
    Ok(())
}
