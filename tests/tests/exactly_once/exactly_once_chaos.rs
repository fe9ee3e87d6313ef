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
//! no record for a DELETE, first deliveries in commit order per aggregate. An at-least-once run
//! beside it, on the same cluster and through the same faults at the same moments (insert-only
//! publication; with the zombie, which then writes what it had in flight), shows the repeats
//! exactly-once saves.

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
use tokio::task::JoinHandle;
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

/// When each fault strikes, in seconds after the writers started; the writers stop at
/// [`WRITING_SECS`]. Each fault strikes once the cluster and Siphon are back from the one
/// before (a broker is down 4 s and takes a few more to rejoin).
const FAULTS: [(u64, &str); 8] = [
    (4, "siphon"),
    (8, "broker 1"),
    (16, "siphon"),
    (20, "postgres"),
    (26, "broker 2"),
    (34, "zombie"),
    (42, "broker 3"),
    (50, "siphon"),
];

/// How long the writers commit.
const WRITING_SECS: u64 = 56;

/// One chaos run under way: its PostgreSQL, its Siphon (and the second one the zombie fault
/// starts on the same slot) and its writer.
struct Run {
    name: &'static str,
    exactly_once: bool,
    pg: Arc<Postgres>,
    target: Via,
    config: String,
    siphon: SiphonProcess,
    zombie: Option<SiphonProcess>,
    stop: Arc<AtomicBool>,
    writing: JoinHandle<Result<(BTreeSet<String>, BTreeSet<String>)>>,
}

impl Run {
    /// Starts a run's PostgreSQL, Siphon and writer; with `exactly_once`, through a publication
    /// of all operations that Siphon finds already there.
    async fn start(cluster: &KafkaCluster, name: &'static str, exactly_once: bool) -> Result<Run> {
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
        Ok(Run {
            name,
            exactly_once,
            pg,
            target,
            config,
            siphon,
            zombie: None,
            stop,
            writing,
        })
    }

    /// The instance streaming: the second one once the zombie fault started it.
    fn live(&self) -> &SiphonProcess {
        self.zombie.as_ref().unwrap_or(&self.siphon)
    }

    /// `kill -9` of the live instance, started again 300 ms later.
    async fn kill_siphon(&self) -> Result<()> {
        self.live().kill9()?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.live().start_again()
    }

    /// Freezes Siphon with whatever it has open, has the server end its replication
    /// connection, lets a second instance take the slot, then wakes the first.
    async fn make_zombie(&mut self) -> Result<()> {
        let name = self.name;
        signal(&self.siphon, libc::SIGSTOP)?;
        let admin = self.pg.connect_retrying().await;
        admin
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&name],
            )
            .await?;
        let second = SiphonProcess::start(&self.config)?;
        wait_until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { slot_active(&admin, name).await },
        )
        .await
        .with_context(|| second.log())?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(&self.siphon, libc::SIGCONT)?;
        self.zombie = Some(second);
        Ok(())
    }

    /// Once the writer stopped: everything arrives, the slot passes the end of the WAL, and
    /// the records are checked.
    async fn finish(mut self) -> Result<Seen> {
        let name = self.name;
        let (committed, rolled_back) = (&mut self.writing).await??;
        let live = self.live();
        let client = self.pg.connect_retrying().await;
        let end = current_insert_lsn(&client).await?;
        wait_for_slot_past(&client, name, end, Duration::from_secs(180))
            .await
            .with_context(|| format!("the slot did not pass {end}; log:\n{}", live.log()))?;
        let records = read_event_records_settled(&self.target).await?;
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
        if self.exactly_once {
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
        let uncommitted =
            read_event_records_isolated(&self.target, Isolation::ReadUncommitted).await?;
        Ok(Seen {
            committed: committed.len(),
            read_committed: records.len(),
            read_uncommitted: uncommitted.len(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_once_for_read_committed_through_kill_9_broker_kills_postgres_restart_and_a_zombie(
) -> Result<()> {
    let cluster = KafkaCluster::start(&[])?;
    // Both runs at once, on the one cluster: each broker kill is a fault for both.
    let mut runs = [
        Run::start(&cluster, "eoschaos", true).await?,
        Run::start(&cluster, "alochaos", false).await?,
    ];
    let started = Instant::now();
    let at = |secs: u64| {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + Duration::from_secs(secs),
        ))
    };
    for (when, fault) in FAULTS {
        at(when).await;
        eprintln!("{fault} at {:?}", started.elapsed());
        match fault {
            "siphon" => {
                for run in &runs {
                    run.kill_siphon().await?;
                }
            }
            "postgres" => {
                for run in &runs {
                    run.pg.restart()?;
                }
            }
            "zombie" => {
                let [exactly_once, at_least_once] = &mut runs;
                tokio::try_join!(exactly_once.make_zombie(), at_least_once.make_zombie())?;
            }
            broker => {
                let id: u32 = broker.trim_start_matches("broker ").parse()?;
                cluster.node(id)?.kill9()?;
                tokio::time::sleep(Duration::from_secs(4)).await;
                cluster.restart(id)?;
            }
        }
    }
    at(WRITING_SECS).await;
    for run in &runs {
        run.stop.store(true, Ordering::Relaxed);
    }
    let [exactly_once, at_least_once] = runs;
    let (exactly, at_least) = tokio::try_join!(exactly_once.finish(), at_least_once.finish())?;
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
