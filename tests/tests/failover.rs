//! Primary failover with a failover slot (PostgreSQL 17+): a primary and a physical standby on
//! loopback (`pg_basebackup`, `primary_slot_name`, `hot_standby_feedback`,
//! `sync_replication_slots = on` on the standby, `synchronized_standby_slots` on the primary),
//! Siphon with `source.failover = true` and both hosts in `source.url`
//! (`target_session_attrs=read-write`), and a writer committing outbox events throughout. The
//! standby is promoted while the old primary still takes writes for a moment (as a primary that
//! has not noticed it was failed over does), then the old primary is killed with -9. Every event
//! the new primary has is delivered, in commit order per aggregate, and none comes from a
//! transaction the new primary does not have.
//!
//! With `kafka.delivery = "exactly-once"` as well: the progress committed on the old primary's
//! timeline holds on the new one up to where it branched off, so a read_committed consumer sees
//! each of those events once.
//!
//! Runs when the harness's PostgreSQL has failover slots (17+); the test command runs the
//! end-to-end suite against PostgreSQL 18 as well (`SIPHON_PG_BIN`).

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, event, phantom_ids, read_event_records,
    read_event_records_isolated, siphon_config, slot_active, wait_for_all, wait_for_slot_caught_up,
    with_exactly_once, OUTBOX_DDL,
};
use siphon_tests::{
    siphon_bin, wait_until, Broker, ConsumedRecord, Isolation, Postgres, SiphonProcess,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

const SLOT: &str = "failover";
const STANDBY_SLOT: &str = "standby1";
const EVENTS_PER_TRANSACTION: u64 = 5;

/// What the writer saw: transactions whose COMMIT returned, by number.
#[derive(Default)]
struct Written {
    committed: BTreeSet<u64>,
}

/// Both hosts, the primary first, as an application configured for failover connects.
fn multi_host(primary: &Postgres, standby: &Postgres) -> String {
    format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=siphon password=siphon dbname=siphon \
         target_session_attrs=read-write connect_timeout=2",
        primary.port(),
        standby.port()
    )
}

async fn connect(conninfo: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Transaction `txn`: its events, and its number in the ledger table, atomically.
async fn write_transaction(client: &mut Client, txn: u64) -> Result<()> {
    let tx = client.transaction().await?;
    for seq in txn * EVENTS_PER_TRANSACTION..(txn + 1) * EVENTS_PER_TRANSACTION {
        let e = event(seq, true);
        tx.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, $3, 'Event', $4::text::jsonb)",
            &[&e.id, &e.aggregatetype, &e.aggregateid, &e.payload],
        )
        .await?;
    }
    tx.execute("INSERT INTO ledger VALUES ($1)", &[&(txn as i64)])
        .await?;
    tx.execute("DELETE FROM outbox", &[]).await?;
    tx.commit().await?;
    Ok(())
}

/// Commits transactions until `stop`, reconnecting (to whichever host is read-write) after
/// any error.
async fn writer(
    conninfo: String,
    written: Arc<Mutex<Written>>,
    next: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let mut txn = 0;
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        next.store(txn, Ordering::Relaxed);
        if client.is_none() {
            client = connect(&conninfo).await.ok();
        }
        let Some(c) = client.as_mut() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match write_transaction(c, txn).await {
            Ok(()) => {
                written
                    .lock()
                    .expect("writer ledger lock")
                    .committed
                    .insert(txn);
            }
            Err(_) => client = None,
        }
        // A transaction whose commit failed may still have committed: its number is not
        // reused, and the new primary's ledger decides.
        txn += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `siphon status --json` with Siphon's own configuration.
fn status(siphon: &SiphonProcess) -> Result<serde_json::Value> {
    let out = std::process::Command::new(siphon_bin()?)
        .args(["status", "--json", "--config"])
        .arg(siphon.config_path())
        .output()?;
    serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

async fn slot_synced_on(standby: &Client) -> Result<bool> {
    let row = standby
        .query_opt(
            "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .await?;
    Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
}

/// Delivery of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    AtLeastOnce,
    ExactlyOnce,
}

/// What a failover run left behind, once every event the new primary has arrived.
struct Outcome {
    /// Kept until the end: dropping them stops the servers.
    _primary: Postgres,
    standby: Postgres,
    broker: Broker,
    siphon: SiphonProcess,
    /// The event ids of the transactions the new primary has.
    expected: BTreeSet<String>,
    /// Transactions whose commit returned on the old primary that the new one lacks.
    lost_with_old_primary: Vec<u64>,
    /// Every event record (read_committed), repeats included.
    records: Vec<ConsumedRecord>,
}

/// The scenario of the module's documentation with `delivery`: `None` when the server has no
/// failover slots (the test then says why and stops). Checks that every event the new primary
/// has arrived, none from a transaction it lacks, first deliveries in commit order per
/// aggregate, and Siphon streaming from the new primary.
async fn promote_and_kill_the_old_primary(
    test: &str,
    delivery: Delivery,
) -> Result<Option<Outcome>> {
    let primary = Postgres::start()?;
    let major = primary.major_version().await?;
    if major < 17 {
        // The test command runs it on 18 only (and skips it by name on 15).
        siphon_tests::prerequisite_missing(
            test,
            &format!(
                "failover slots need PostgreSQL 17 or later (this is {major}; set SIPHON_PG_BIN)"
            ),
        )?;
        return Ok(None);
    }
    let db = primary.connect().await?;
    db.batch_execute(&format!(
        "{OUTBOX_DDL}; CREATE TABLE ledger (txn bigint PRIMARY KEY);"
    ))
    .await?;
    let standby = Postgres::start_standby(&primary, STANDBY_SLOT)?;
    db.batch_execute(&format!(
        "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
    ))
    .await?;
    db.batch_execute("SELECT pg_reload_conf()").await?;
    let broker = Broker::start()?;

    // The standby first: before the failover Siphon must pass over it (read-only) to the
    // primary; after it, the same first host is the new primary.
    let hosts = format!(
        "postgres://siphon:siphon@127.0.0.1:{},127.0.0.1:{}/siphon?target_session_attrs=read-write&connect_timeout=2",
        standby.port(),
        primary.port()
    );
    let config = siphon_config(&primary, &broker, SLOT, "")
        .replace(
            &format!("url = \"{}\"", primary.url()),
            &format!("url = \"{hosts}\""),
        )
        .replace("[source]\n", "[source]\nfailover = true\n");
    assert!(config.contains(&hosts) && config.contains("failover = true"));
    let config = match delivery {
        Delivery::AtLeastOnce => config,
        Delivery::ExactlyOnce => with_exactly_once(&config, &broker),
    };
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&db, SLOT).await },
    )
    .await
    .with_context(|| siphon.log())?;
    let standby_db = standby.connect().await?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { slot_synced_on(&standby_db).await },
    )
    .await
    .context("the failover slot never became a synchronized copy on the standby")?;
    let before = status(&siphon)?;
    assert_eq!(
        before["host"],
        format!("127.0.0.1:{}", primary.port()),
        "{before}"
    );
    assert_eq!(before["slot"]["failover"], true, "{before}");
    assert_eq!(
        before["synchronized_standby_slots"], STANDBY_SLOT,
        "{before}"
    );
    assert_eq!(before["healthy"], true, "{before}");

    let written = Arc::new(Mutex::new(Written::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let writing = tokio::spawn(writer(
        multi_host(&primary, &standby),
        Arc::clone(&written),
        Arc::clone(&next),
        Arc::clone(&stop),
    ));
    // Events flow through the old primary first.
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(read_event_records(&broker).await?.len() >= 50) },
    )
    .await
    .with_context(|| siphon.log())?;

    // The standby is promoted; the old primary keeps taking the writer's commits for a moment,
    // then crashes.
    drop(standby_db);
    standby.promote()?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    primary.kill9()?;
    let first_after_crash = next.load(Ordering::Relaxed) + 1;
    drop(db);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writing.await?;

    // What the surviving timeline holds decides what must arrive.
    let survivor = standby.connect().await?;
    let kept: BTreeSet<u64> = survivor
        .query("SELECT txn FROM ledger", &[])
        .await?
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect();
    let committed = written
        .lock()
        .expect("writer ledger lock")
        .committed
        .clone();
    let lost_with_old_primary: Vec<u64> = committed.difference(&kept).copied().collect();
    let expected: BTreeSet<String> = kept
        .iter()
        .flat_map(|txn| txn * EVENTS_PER_TRANSACTION..(txn + 1) * EVENTS_PER_TRANSACTION)
        .map(|seq| event(seq, true).id)
        .collect();
    // The scenario happened as intended: the old primary took commits the new one never got,
    // and the writer went on on the new primary.
    assert!(
        !lost_with_old_primary.is_empty(),
        "no commit reached the old primary after the promotion"
    );
    assert!(
        kept.iter().any(|txn| *txn >= first_after_crash),
        "the writer never committed on the new primary"
    );
    let records = wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    let phantom = phantom_ids(&records, &expected);
    assert!(
        phantom.is_empty(),
        "events of transactions the new primary does not have reached Kafka: {phantom:?}\n(commits lost with the old primary: {lost_with_old_primary:?})"
    );
    check_first_deliveries_in_order(&records)?;
    assert!(slot_active(&survivor, SLOT).await?, "{}", siphon.log());
    Ok(Some(Outcome {
        _primary: primary,
        standby,
        broker,
        siphon,
        expected,
        lost_with_old_primary,
        records,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_and_kill_9_of_the_old_primary_lose_nothing_and_add_nothing() -> Result<()> {
    let Some(outcome) = promote_and_kill_the_old_primary(
        "promotion_and_kill_9_of_the_old_primary_lose_nothing_and_add_nothing",
        Delivery::AtLeastOnce,
    )
    .await?
    else {
        return Ok(());
    };
    let Outcome {
        standby,
        siphon,
        expected,
        lost_with_old_primary,
        records,
        ..
    } = &outcome;
    // The new primary has no standby of its own yet: status says what that means.
    let after = status(siphon)?;
    assert_eq!(
        after["host"],
        format!("127.0.0.1:{}", standby.port()),
        "{after}"
    );
    assert_eq!(after["slot"]["synced"], true, "{after}");
    assert_eq!(after["healthy"], false, "{after}");
    assert!(
        after["problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("synchronized_standby_slots is empty")),
        "{after}"
    );
    eprintln!(
        "failover: {} events kept, {} commits lost with the old primary, {} records ({} repeats)",
        expected.len(),
        lost_with_old_primary.len(),
        records.len(),
        records.len() - expected.len()
    );
    siphon.terminate()?;
    Ok(())
}

/// With `kafka.delivery = "exactly-once"` the progress committed on the old primary's timeline
/// still holds on the new primary's up to where the new timeline branched off: a read_committed
/// consumer sees each event once across the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_a_read_committed_consumer_sees_each_event_once_across_a_promotion(
) -> Result<()> {
    let Some(outcome) = promote_and_kill_the_old_primary(
        "with_exactly_once_a_read_committed_consumer_sees_each_event_once_across_a_promotion",
        Delivery::ExactlyOnce,
    )
    .await?
    else {
        return Ok(());
    };
    let Outcome {
        standby,
        broker,
        siphon,
        expected,
        lost_with_old_primary,
        ..
    } = &outcome;
    let after = status(siphon)?;
    assert_eq!(
        after["host"],
        format!("127.0.0.1:{}", standby.port()),
        "{after}"
    );
    // Everything the new primary has is in: whatever the session still had open is committed
    // before the records are counted once more.
    let survivor = standby.connect().await?;
    wait_for_slot_caught_up(&survivor, SLOT)
        .await
        .with_context(|| siphon.log())?;
    let records = read_event_records_isolated(broker, Isolation::ReadCommitted).await?;
    let seen = count_by_id(&records);
    let repeated: BTreeMap<&String, &usize> = seen.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "failover with exactly-once: {} events kept, {} commits lost with the old primary, {} records read_committed, {} events seen more than once ({} repeats)",
        expected.len(),
        lost_with_old_primary.len(),
        records.len(),
        repeated.len(),
        records.len() - seen.len()
    );
    assert!(
        repeated.is_empty(),
        "read_committed saw {} events more than once: {repeated:?}\n{}",
        repeated.len(),
        siphon.log()
    );
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        *expected,
        "read_committed sees exactly the new primary's events"
    );
    siphon.terminate()?;
    Ok(())
}
