//! Exactly-once delivery under chaos on a real three-node Apache Kafka cluster (KRaft,
//! replication factor 3, `min.insync.replicas=2`): a writer commits outbox transactions of 1 to 50
//! events (with a ledger row, so a commit whose answer a PostgreSQL restart lost is told apart
//! from one that did not happen; one transaction in twenty is rolled back) while the test
//! - kills Siphon with `kill -9` three times,
//! - kills each of the three brokers in turn with `kill -9` and starts it again (the leaders of the
//!   event topics' partitions and the transaction coordinator are among them),
//! - restarts PostgreSQL,
//! - and once freezes Siphon (SIGSTOP) with its Kafka transaction open, ends its replication
//!   connection, starts a second Siphon on the same slot and wakes the first: a zombie, fenced by
//!   the second one's producer.
//!
//! The exactly-once run streams through a publication of all operations (what a Debezium takeover
//! inherits): every DELETE of an outbox row crosses the wire, and one transaction in three holds
//! only DELETEs (of the rows the transaction before it left), so the progress must move and the
//! Kafka transactions commit and abort around transactions that produce nothing.
//!
//! A read_committed consumer must then see every committed event exactly once, none rolled back,
//! no record for a DELETE, first deliveries in commit order per aggregate. The same run in
//! at-least-once mode (insert-only publication; with the zombie, which then writes what it had
//! in flight) shows the repeats exactly-once saves.

use anyhow::{ensure, Context as _, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, current_insert_lsn, event, insert_events,
    read_event_records_isolated, read_event_records_settled, reconnect_and_check_ledger, record_id,
    siphon_config_at, slot_active, wait_for_slot_past, Event, KafkaTarget, Via,
};
use siphon_tests::{wait_until, Isolation, KafkaCluster, Postgres, SiphonProcess};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// What one writer transaction does to the outbox.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Inserts its events and deletes them (and anything left) before it commits.
    InsertAndDelete,
    /// Inserts its events and leaves them.
    InsertOnly,
    /// Inserts nothing and deletes what is left.
    DeleteOnly,
}

impl Rows {
    /// The shape of transaction `txn`: with `deletes_alone`, one in three holds only DELETEs
    /// (of the rows the insert-only transaction before it left).
    fn of(txn: i64, deletes_alone: bool) -> Rows {
        match txn % 3 {
            1 if deletes_alone => Rows::InsertOnly,
            2 if deletes_alone => Rows::DeleteOnly,
            _ => Rows::InsertAndDelete,
        }
    }
}

/// Commits (or rolls back) transaction `txn` of events `first..first + count` (none if
/// [`Rows::DeleteOnly`]: the writer gives it none), with its ledger row.
async fn write_transaction(
    client: &mut Client,
    txn: i64,
    (first, count): (u64, u64),
    rows: Rows,
    commit: bool,
) -> Result<()> {
    let tx = client.transaction().await?;
    let events: Vec<Event> = (first..first + count)
        .map(|seq| event(seq, commit))
        .collect();
    insert_events(&tx, &events).await?;
    if rows != Rows::InsertOnly {
        tx.execute("DELETE FROM outbox", &[]).await?;
    }
    tx.execute("INSERT INTO ledger VALUES ($1)", &[&txn])
        .await?;
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(())
}

/// Writes until `stop` (with `deletes_alone`, transactions of only DELETEs among the others):
/// returns the ids committed and rolled back.
async fn writer(
    pg: Arc<Postgres>,
    stop: Arc<AtomicBool>,
    deletes_alone: bool,
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let mut client = pg.connect_retrying().await;
    let (mut committed, mut rolled_back) = (BTreeSet::new(), BTreeSet::new());
    let mut next = 1u64;
    let mut txn = 0i64;
    while !stop.load(Ordering::Relaxed) {
        txn += 1;
        let rows = Rows::of(txn, deletes_alone);
        let count = match rows {
            Rows::DeleteOnly => 0,
            _ => 1 + (txn as u64 * 13) % 50,
        };
        let commit = txn % 20 != 0;
        loop {
            match write_transaction(&mut client, txn, (next, count), rows, commit).await {
                Ok(()) => break,
                Err(_) => {
                    let done;
                    (client, done) = reconnect_and_check_ledger(&pg, txn).await;
                    if done || !commit {
                        break;
                    }
                }
            }
        }
        let ids = (next..next + count).map(|seq| event(seq, commit).id);
        if commit {
            committed.extend(ids);
        } else {
            rolled_back.extend(ids);
        }
        next += count;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    Ok((committed, rolled_back))
}

fn signal(process: &SiphonProcess, signal: libc::c_int) -> Result<()> {
    let pid = libc::pid_t::try_from(process.pid().context("Siphon is not running")?)?;
    // SAFETY: kill(2) on the pid of a child the process handle owns and has not reaped.
    let rc = unsafe { libc::kill(pid, signal) };
    ensure!(rc == 0, "kill({pid}, {signal}) failed");
    Ok(())
}

/// What one run saw.
struct Seen {
    committed: usize,
    read_committed: usize,
    read_uncommitted: usize,
}

/// One chaos run; with `exactly_once`, through a publication of all operations that Siphon
/// finds already there.
async fn run(cluster: &KafkaCluster, name: &str, exactly_once: bool) -> Result<Seen> {
    let pg = Arc::new(Postgres::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(&format!(
            "{}; CREATE TABLE ledger (txn bigint PRIMARY KEY);",
            siphon_tests::outbox::OUTBOX_DDL
        ))
        .await?;
    if exactly_once {
        client
            .batch_execute(&format!("CREATE PUBLICATION {name}_pub FOR TABLE outbox"))
            .await?;
    }
    let target = Via {
        bootstrap: cluster.bootstrap(),
        namespace: format!("{name}."),
    };
    let mut config = siphon_config_at(
        &pg,
        &target,
        name,
        "\"message.timeout.ms\" = \"15000\"",
        "max_in_flight_records = 500",
    )
    .replace("replication_factor = 1", "replication_factor = 3");
    if exactly_once {
        let bootstrap = format!("bootstrap_servers = \"{}\"", cluster.bootstrap());
        config = config.replacen(
            &bootstrap,
            &format!(
                "{bootstrap}\ndelivery = \"exactly-once\"\nprogress_topic = \"{}\"",
                target.topic("siphon.progress")
            ),
            1,
        );
    }
    let siphon = SiphonProcess::start(&config)?;
    let active = || async { slot_active(&client, name).await };
    wait_until(Duration::from_secs(90), Duration::from_millis(100), active)
        .await
        .with_context(|| siphon.log())?;

    let stop = Arc::new(AtomicBool::new(false));
    let writing = tokio::spawn(writer(Arc::clone(&pg), Arc::clone(&stop), exactly_once));
    let started = Instant::now();
    let at = |secs: u64| {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + Duration::from_secs(secs),
        ))
    };
    let mut zombie: Option<SiphonProcess> = None;
    for (when, fault) in [
        (4, "siphon"),
        (8, "broker 1"),
        (16, "siphon"),
        (20, "postgres"),
        (26, "broker 2"),
        (34, "zombie"),
        (42, "broker 3"),
        (50, "siphon"),
    ] {
        at(when).await;
        eprintln!("{name}: {fault} at {:?}", started.elapsed());
        match fault {
            "siphon" => {
                // The live instance: the second one once the zombie scenario started it.
                let live = zombie.as_ref().unwrap_or(&siphon);
                live.kill9()?;
                tokio::time::sleep(Duration::from_millis(300)).await;
                live.start_again()?;
            }
            "postgres" => pg.restart()?,
            "zombie" => {
                // Frozen with whatever it has open, its replication connection ended by the
                // server, the slot taken by a second instance; then woken.
                signal(&siphon, libc::SIGSTOP)?;
                let admin = pg.connect_retrying().await;
                admin
                    .execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active_pid IS NOT NULL",
                        &[&name],
                    )
                    .await?;
                let second = SiphonProcess::start(&config)?;
                wait_until(
                    Duration::from_secs(60),
                    Duration::from_millis(100),
                    || async { slot_active(&admin, name).await },
                )
                .await
                .with_context(|| second.log())?;
                tokio::time::sleep(Duration::from_secs(2)).await;
                signal(&siphon, libc::SIGCONT)?;
                zombie = Some(second);
            }
            broker => {
                let id: u32 = broker.trim_start_matches("broker ").parse()?;
                cluster.node(id)?.kill9()?;
                tokio::time::sleep(Duration::from_secs(4)).await;
                cluster.restart(id)?;
            }
        }
    }
    at(56).await;
    stop.store(true, Ordering::Relaxed);
    let (committed, rolled_back) = writing.await??;

    // Everything arrives, the slot passes the end of the WAL.
    let live = zombie.as_ref().unwrap_or(&siphon);
    let client = pg.connect_retrying().await;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(180))
        .await
        .with_context(|| format!("the slot did not pass {end}; log:\n{}", live.log()))?;
    let records = read_event_records_settled(&target).await?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for record in &records {
        *counts.entry(record_id(record)).or_default() += 1;
    }
    let ids: BTreeSet<String> = counts.keys().cloned().collect();
    let missing: Vec<&String> = committed.difference(&ids).take(10).collect();
    ensure!(
        missing.is_empty(),
        "{name}: committed events missing: {missing:?}"
    );
    let phantom: Vec<&String> = ids.difference(&committed).take(10).collect();
    ensure!(
        phantom.is_empty(),
        "{name}: events never committed: {phantom:?}"
    );
    ensure!(
        rolled_back.iter().all(|id| !counts.contains_key(id)),
        "{name}: a rolled-back event reached Kafka"
    );
    check_first_deliveries_in_order(&records).with_context(|| name.to_owned())?;
    if exactly_once {
        let deletes_published: bool = client
            .query_one(
                "SELECT pubdelete FROM pg_publication WHERE pubname = $1",
                &[&format!("{name}_pub")],
            )
            .await?
            .get(0);
        ensure!(
            deletes_published,
            "{name}: the publication no longer publishes DELETEs"
        );
        let repeated: Vec<(&String, &usize)> =
            counts.iter().filter(|(_, n)| **n > 1).take(10).collect();
        ensure!(
            repeated.is_empty(),
            "{name}: read_committed saw repeats: {repeated:?}\nsiphon log:\n{}",
            live.log()
        );
    }
    let uncommitted = read_event_records_isolated(&target, Isolation::ReadUncommitted).await?;
    Ok(Seen {
        committed: committed.len(),
        read_committed: records.len(),
        read_uncommitted: uncommitted.len(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_once_for_read_committed_through_kill_9_broker_kills_postgres_restart_and_a_zombie(
) -> Result<()> {
    let cluster = KafkaCluster::start(&[])?;
    let exactly = run(&cluster, "eoschaos", true).await?;
    for node in cluster.nodes() {
        if !node.is_running() {
            node.spawn()?;
        }
        node.wait_ready(cluster.nodes().len())?;
    }
    let at_least = run(&cluster, "alochaos", false).await?;
    eprintln!(
        "exactly-once: {} events committed, read_committed {} records (repeats: {}), read_uncommitted {} records",
        exactly.committed,
        exactly.read_committed,
        exactly.read_committed - exactly.committed,
        exactly.read_uncommitted
    );
    eprintln!(
        "at-least-once: {} events committed, {} records (repeats: {})",
        at_least.committed,
        at_least.read_committed,
        at_least.read_committed - at_least.committed
    );
    Ok(())
}
