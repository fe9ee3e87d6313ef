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
//! Without `synchronized_standby_slots` (exactly-once): the standby's WAL receiver is stopped
//! (`primary_conninfo = ''`) a second before the promotion, so the old primary sends Siphon WAL
//! the standby never gets, and Siphon's position on the old primary is past the point the new
//! timeline branches off (asserted). Events of transactions only the old primary had reach Kafka
//! (phantoms, inherent to an asynchronous standby); the progress committed past the branch point
//! is used only up to it, so a read_committed consumer sees each event the new primary has once,
//! in commit order per aggregate, and each phantom at most once.
//!
//! Runs when the harness's PostgreSQL has failover slots (17+); the test command runs the
//! end-to-end suite against PostgreSQL 18 as well (`SIPHON_PG_BIN`).

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, count_by_id, current_insert_lsn, event, phantom_ids,
    read_event_records, read_event_records_settled, siphon_config, slot_active, slot_confirmed_lsn,
    wait_for_all, wait_for_slot_caught_up, wait_for_slot_past, with_exactly_once, OUTBOX_DDL,
};
use siphon_tests::schema_registry::RegistryServer;
use siphon_tests::{
    siphon_bin, strip_ansi, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
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

/// How the standby follows the primary in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standby {
    /// Named in the primary's `synchronized_standby_slots`: Siphon gets no WAL the standby has
    /// not flushed.
    Synchronized,
    /// Not named there (the setting is empty), and cut off from the primary before the
    /// promotion: Siphon gets (and publishes, and confirms) WAL the standby never receives.
    Lagging,
}

/// Delivery of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    AtLeastOnce,
    ExactlyOnce,
    /// Exactly-once, the values Avro through a schema registry.
    ExactlyOnceAvro,
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
    /// The schema registry of Avro values.
    registry: Option<RegistryServer>,
}

/// `primary_conninfo = ''` on `standby`: its WAL receiver stops (and its slot synchronization
/// with it); returns the end of the WAL it received, once the receiver is gone.
async fn cut_off(standby: &Client) -> Result<u64> {
    standby
        .batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
        .await?;
    standby.batch_execute("SELECT pg_reload_conf()").await?;
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            Ok(standby
                .query_opt("SELECT 1 FROM pg_stat_wal_receiver", &[])
                .await?
                .is_none())
        },
    )
    .await
    .context("the standby's WAL receiver did not stop")?;
    received_lsn(standby).await
}

/// `pg_last_wal_receive_lsn()` of a standby, as a number.
async fn received_lsn(standby: &Client) -> Result<u64> {
    let lsn: Option<i64> = standby
        .query_one(
            "SELECT (pg_last_wal_receive_lsn() - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await?
        .get(0);
    Ok(lsn.context("the standby never received WAL")? as u64)
}

/// Where the promoted `server`'s timeline 2 branched off timeline 1 (its history file).
async fn switchpoint(server: &Client) -> Result<u64> {
    let row = server
        .query_one(
            "SELECT (split_part(split_part(pg_read_file('pg_wal/00000002.history'), E'\n', 1), E'\t', 2)::pg_lsn - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// The scenario of the module's documentation with `delivery` and the standby `following` the
/// primary: `None` when the server has no failover slots (the test then says why and stops).
/// Checks that every event the new primary has arrived, first deliveries in commit order per
/// aggregate, and Siphon streaming from the new primary; with a synchronized standby none from
/// a transaction the new primary lacks, with a lagging one some (Siphon's position on the old
/// primary past the switchpoint).
async fn promote_and_kill_the_old_primary(
    test: &str,
    delivery: Delivery,
    following: Standby,
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
    if following == Standby::Synchronized {
        db.batch_execute(&format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
        ))
        .await?;
        db.batch_execute("SELECT pg_reload_conf()").await?;
    }
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
    let registry = match delivery {
        Delivery::ExactlyOnceAvro => Some(RegistryServer::start()?),
        _ => None,
    };
    let config = match (delivery, &registry) {
        (Delivery::AtLeastOnce, _) => config,
        (Delivery::ExactlyOnceAvro, Some(registry)) => format!(
            "{}\n[format]\nvalue = \"avro\"\n\n[schema_registry]\nurl = \"{}\"\n",
            with_exactly_once(&config, &broker),
            registry.url()
        ),
        _ => with_exactly_once(&config, &broker),
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
    match following {
        Standby::Synchronized => {
            assert_eq!(
                before["synchronized_standby_slots"], STANDBY_SLOT,
                "{before}"
            );
            assert_eq!(before["healthy"], true, "{before}");
        }
        Standby::Lagging => {
            assert_eq!(before["synchronized_standby_slots"], "", "{before}");
            assert!(
                before["problems"][0]
                    .as_str()
                    .is_some_and(|p| p.contains("synchronized_standby_slots is empty")),
                "{before}"
            );
        }
    }

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

    // Lagging: the standby stops receiving WAL; Siphon goes on with the primary's, past it.
    let received = match following {
        Standby::Synchronized => None,
        Standby::Lagging => {
            let received = cut_off(&standby_db).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let written_since = current_insert_lsn(&db).await?;
            wait_for_slot_past(&db, SLOT, written_since, Duration::from_secs(60))
                .await
                .with_context(|| siphon.log())?;
            Some(received)
        }
    };

    // The standby is promoted; the old primary keeps taking the writer's commits for a moment,
    // then crashes.
    if let Some(received) = received {
        assert_eq!(
            received_lsn(&standby_db).await?,
            received,
            "the standby received WAL after it was cut off"
        );
    }
    drop(standby_db);
    standby.promote()?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let confirmed_on_old_primary = slot_confirmed_lsn(&db, SLOT).await?.unwrap_or(0);
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
    if let Some(received) = received {
        // The path under test: Siphon confirmed, on the old primary, WAL past the point the new
        // timeline branched off (the end of what the standby had received).
        let branched = switchpoint(&survivor).await?;
        assert!(
            received < confirmed_on_old_primary && branched < confirmed_on_old_primary,
            "Siphon's position on the old primary ({confirmed_on_old_primary:#x}) is not past the switchpoint ({branched:#x}; the standby received {received:#x})"
        );
    }
    let records = wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    let phantom = phantom_ids(&records, &expected);
    match following {
        Standby::Synchronized => assert!(
            phantom.is_empty(),
            "events of transactions the new primary does not have reached Kafka: {phantom:?}\n(commits lost with the old primary: {lost_with_old_primary:?})"
        ),
        // Inherent to an asynchronous standby: Siphon published events of transactions that
        // went down with the old primary.
        Standby::Lagging => assert!(
            !phantom.is_empty(),
            "no event of a transaction the new primary lacks reached Kafka: the old primary sent Siphon nothing past the standby"
        ),
    }
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
        registry,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_and_kill_9_of_the_old_primary_lose_nothing_and_add_nothing() -> Result<()> {
    let Some(outcome) = promote_and_kill_the_old_primary(
        "promotion_and_kill_9_of_the_old_primary_lose_nothing_and_add_nothing",
        Delivery::AtLeastOnce,
        Standby::Synchronized,
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

/// What a read_committed consumer sees once Siphon, on the new primary, has caught up with it.
struct ReadCommitted {
    records: Vec<ConsumedRecord>,
    /// How many times each event id was seen.
    seen: BTreeMap<String, usize>,
}

/// Checks that Siphon streams from the promoted standby, waits until its slot there has caught
/// up (whatever the session still had open is committed), reads every event record
/// read_committed and checks that none was seen twice.
async fn read_committed_once_after_catch_up(
    outcome: &Outcome,
    what: &str,
) -> Result<ReadCommitted> {
    let after = status(&outcome.siphon)?;
    assert_eq!(
        after["host"],
        format!("127.0.0.1:{}", outcome.standby.port()),
        "{after}"
    );
    let survivor = outcome.standby.connect().await?;
    wait_for_slot_caught_up(&survivor, SLOT)
        .await
        .with_context(|| outcome.siphon.log())?;
    let records = read_event_records_settled(&outcome.broker).await?;
    let seen = count_by_id(&records);
    let repeated: BTreeMap<&String, &usize> = seen.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "{what}: {} events kept, {} commits lost with the old primary, {} records read_committed, {} events seen more than once",
        outcome.expected.len(),
        outcome.lost_with_old_primary.len(),
        records.len(),
        repeated.len(),
    );
    assert!(
        repeated.is_empty(),
        "read_committed saw {} events more than once: {repeated:?}\n{}",
        repeated.len(),
        outcome.siphon.log()
    );
    Ok(ReadCommitted { records, seen })
}

/// With `kafka.delivery = "exactly-once"` the progress committed on the old primary's timeline
/// still holds on the new primary's up to where the new timeline branched off: a read_committed
/// consumer sees each event once across the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_and_avro_values_a_read_committed_consumer_decodes_each_event_once_across_a_promotion(
) -> Result<()> {
    let Some(outcome) = promote_and_kill_the_old_primary(
        "with_exactly_once_and_avro_values_a_read_committed_consumer_decodes_each_event_once_across_a_promotion",
        Delivery::ExactlyOnceAvro,
        Standby::Synchronized,
    )
    .await?
    else {
        return Ok(());
    };
    let ReadCommitted { seen, records } =
        read_committed_once_after_catch_up(&outcome, "failover with exactly-once").await?;
    let Outcome {
        siphon,
        expected,
        registry,
        ..
    } = &outcome;
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        *expected,
        "read_committed sees exactly the new primary's events"
    );
    // Confluent's deserializer reads each value back: the payload, as an Avro string.
    let python = siphon_tests::python::python()?.context("python3 with confluent-kafka")?;
    let registry = registry.as_ref().context("a registry")?;
    let decoded = tokio::task::block_in_place(|| {
        siphon_tests::python::decode_avro(&python, &registry.url(), "outbox", &records, false)
    })?;
    for (record, decoded) in records.iter().zip(&decoded) {
        let id = String::from_utf8_lossy(record.header("id").unwrap_or_default()).into_owned();
        let seq: u64 = id.rsplit('-').next().unwrap_or_default().parse()?;
        let payload: serde_json::Value = serde_json::from_str(&event(seq, true).payload)?;
        let value: serde_json::Value =
            serde_json::from_str(decoded["value"].as_str().context("an Avro string")?)?;
        assert_eq!(value, payload, "event {seq}");
    }
    siphon.terminate()?;
    Ok(())
}

/// Without `synchronized_standby_slots` the old primary sends Siphon WAL the standby never
/// received: Siphon publishes (once) events of transactions the new primary lacks, and its
/// progress on the old timeline goes past where the new one branched off. That progress is
/// used only up to the switchpoint: a read_committed consumer sees each event the new primary
/// has once, in commit order per aggregate, and each event it lacks at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_and_a_lagging_standby_progress_past_the_branch_point_is_capped(
) -> Result<()> {
    let Some(outcome) = promote_and_kill_the_old_primary(
        "with_exactly_once_and_a_lagging_standby_progress_past_the_branch_point_is_capped",
        Delivery::ExactlyOnce,
        Standby::Lagging,
    )
    .await?
    else {
        return Ok(());
    };
    let ReadCommitted { records, seen } = read_committed_once_after_catch_up(
        &outcome,
        "failover with exactly-once and a lagging standby",
    )
    .await?;
    let Outcome {
        siphon, expected, ..
    } = &outcome;
    let phantom = seen.keys().filter(|id| !expected.contains(*id)).count();
    eprintln!("{phantom} phantom events, each seen once");
    let missing: Vec<&String> = expected
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "read_committed lacks {missing:?}");
    check_first_deliveries_in_order(&records)?;
    // The session on the new primary resumed from the progress capped at the switchpoint.
    let log = strip_ansi(&siphon.log());
    assert!(
        log.lines()
            .any(|l| l.contains("written on an earlier timeline") && l.contains("capped=true")),
        "{log}"
    );
    siphon.terminate()?;
    Ok(())
}
