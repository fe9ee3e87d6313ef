//! Broker faults on a real three-node Apache Kafka cluster (KRaft, replication factor 3,
//! `min.insync.replicas=2`, no unclean leader election): a partition leader killed with
//! `kill -9`, two of three brokers down (also with exactly-once delivery), a rolling restart,
//! the cluster frozen past the delivery deadline, a topic deleted and a topic given more
//! partitions while Siphon writes, and (exactly-once) the transaction coordinator's node killed
//! between recording a commit and answering it, and while a restarted Siphon registers.
//!
//! Each scenario is a test of its own (`cargo test NAME` runs one) against the same cluster (a
//! JVM start costs seconds; the scenarios take turns so that one's faults never land in
//! another's timing), with a PostgreSQL, a slot
//! and a topic namespace of its own, and a writer committing outbox transactions of 1 to 5 events
//! throughout. Every scenario then checks the promises from outside: every committed event is in
//! Kafka, nothing else is, the first delivery of each event comes in commit order per key, and
//! the slot passes the end of the WAL. A scenario leaves every node running for the next.

use anyhow::{ensure, Context as _, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use siphon_tests::kafka_protocol::{END_TXN, INIT_PRODUCER_ID};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, current_insert_lsn, event, insert_transaction, phantom_ids,
    record_id, record_seq, siphon_config_at, slot_confirmed_lsn, slot_retained_wal,
    start_streaming, wait_for_all, wait_for_slot_past, with_exactly_once, Event, KafkaTarget, Via,
    OUTBOX_DDL,
};
use siphon_tests::partition::partition_for_key;
use siphon_tests::proxy::ClusterProxies;
use siphon_tests::scenarios;
use siphon_tests::{wait_for, wait_until, ConsumedRecord, KafkaCluster, Postgres, SiphonProcess};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The delivery deadline (`kafka.properties."message.timeout.ms"`) of the scenarios that ride
/// over a fault: longer than a leader election or a controlled shutdown takes.
const DEADLINE_MS: u64 = 10_000;

/// The delivery deadline of the scenarios whose fault outlasts it (two of three down, the
/// cluster frozen): their outages are a multiple of it, so a shorter one shows as many
/// deadlines passing, with as many producer replacements, in less time.
const OUTAGE_DEADLINE_MS: u64 = 5_000;

/// How long the writer commits before a fault, with Siphon streaming: the topics exist and
/// records are in flight when it strikes.
const BEFORE_FAULT: Duration = Duration::from_secs(3);

/// How long the writer goes on after the cluster is whole again: events committed after the
/// recovery arrive too.
const AFTER_RECOVERY: Duration = Duration::from_secs(3);

/// One scenario's services: its PostgreSQL, its slot, its namespace on the cluster, Siphon.
struct Scenario {
    // Dropped first: Siphon stops before its database does.
    siphon: SiphonProcess,
    pg: Postgres,
    slot: String,
    target: Via,
    exactly_once: bool,
}

/// How a scenario's Siphon is configured.
struct Setup<'a> {
    /// More `kafka.properties` lines.
    properties: &'a str,
    /// `kafka.delivery = "exactly-once"` (the progress topic in the scenario's namespace).
    exactly_once: bool,
    /// `message.timeout.ms`.
    deadline_ms: u64,
    /// Where Siphon's clients bootstrap; the cluster itself when `None`. The checks always
    /// read from the cluster directly.
    bootstrap: Option<String>,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            properties: "",
            exactly_once: false,
            deadline_ms: DEADLINE_MS,
            bootstrap: None,
        }
    }
}

impl Scenario {
    async fn start(cluster: &KafkaCluster, name: &str, properties: &str) -> Result<Self> {
        let setup = Setup {
            properties,
            ..Setup::default()
        };
        Self::start_with(cluster, name, setup).await
    }

    /// Like [`Scenario::start`], configured by `setup`.
    async fn start_with(cluster: &KafkaCluster, name: &str, setup: Setup<'_>) -> Result<Self> {
        let pg = Postgres::start()?;
        let client = pg.connect().await?;
        client.batch_execute(OUTBOX_DDL).await?;
        let target = Via {
            bootstrap: cluster.bootstrap(),
            namespace: format!("{name}."),
        };
        let siphon_target = Via {
            bootstrap: setup.bootstrap.unwrap_or_else(|| cluster.bootstrap()),
            namespace: target.namespace.clone(),
        };
        let kafka_properties = format!(
            "\"message.timeout.ms\" = \"{}\"\n{}",
            setup.deadline_ms, setup.properties
        );
        // Topics as a production cluster has them: three replicas.
        let config = siphon_config_at(
            &pg,
            &siphon_target,
            name,
            &kafka_properties,
            "max_in_flight_records = 500",
        )
        .replace("replication_factor = 1", "replication_factor = 3");
        let exactly_once = setup.exactly_once;
        let config = if exactly_once {
            with_exactly_once(&config, &siphon_target)
        } else {
            config
        };
        let siphon = start_streaming(&client, &config, name).await?;
        Ok(Scenario {
            siphon,
            pg,
            slot: name.to_owned(),
            target,
            exactly_once,
        })
    }

    fn topic(&self, name: &str) -> String {
        self.target.topic(name)
    }

    /// Waits until every event in `committed` is in Kafka, then checks that nothing else is,
    /// that first deliveries are in commit order per key, and that the slot passes the end of
    /// the WAL. Returns every record read.
    async fn check_delivered(&self, committed: &[Event]) -> Result<Vec<ConsumedRecord>> {
        let expected: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
        let records = wait_for_all(&self.target, &expected, Duration::from_secs(180))
            .await
            .with_context(|| format!("siphon log:\n{}", self.siphon.log()))?;
        let phantom = phantom_ids(&records, &expected);
        ensure!(phantom.is_empty(), "events never committed: {phantom:?}");
        // Read with read_committed: with exactly-once delivery, each event once.
        ensure!(
            !self.exactly_once || records.len() == expected.len(),
            "exactly-once delivery, yet {} records for {} events",
            records.len(),
            expected.len()
        );
        check_first_deliveries_in_order(&records)
            .with_context(|| format!("siphon log:\n{}", self.siphon.log()))?;
        let client = self.pg.connect().await?;
        let end = current_insert_lsn(&client).await?;
        wait_for_slot_past(&client, &self.slot, end, Duration::from_secs(60))
            .await
            .with_context(|| format!("the slot did not pass {end}; log:\n{}", self.siphon.log()))?;
        eprintln!(
            "{}: {} events committed, {} records read ({} repeats)",
            self.slot,
            expected.len(),
            records.len(),
            records.len() - expected.len()
        );
        Ok(records)
    }

    /// How often the log says the producer was replaced.
    fn producer_replacements(&self) -> usize {
        self.siphon
            .log()
            .matches("Kafka producer failed; replacing it")
            .count()
    }
}

/// A writer committing transactions of 1 to 5 events (numbered from `first_seq`) every 20 ms
/// until `stop` is set; returns what it committed, in commit order.
async fn start_writer(
    pg: &Postgres,
    first_seq: u64,
    stop: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<Result<Vec<Event>>>> {
    start_writer_counting(pg, first_seq, stop, Arc::new(AtomicU64::new(0))).await
}

/// [`start_writer`], keeping the number of the last event committed in `last_seq`.
async fn start_writer_counting(
    pg: &Postgres,
    first_seq: u64,
    stop: Arc<AtomicBool>,
    last_seq: Arc<AtomicU64>,
) -> Result<tokio::task::JoinHandle<Result<Vec<Event>>>> {
    let mut client = pg.connect().await?;
    Ok(tokio::spawn(async move {
        let mut committed = Vec::new();
        let mut seq = first_seq;
        let mut txn = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let size = 1 + txn % 5;
            let events: Vec<Event> = (0..size).map(|i| event(seq + i, true)).collect();
            insert_transaction(&mut client, &events, true).await?;
            seq += size;
            last_seq.store(seq - 1, Ordering::Relaxed);
            txn += 1;
            committed.extend(events);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(committed)
    }))
}

/// Starts every node that is not running and waits until each lists all three.
fn all_nodes_up(cluster: &KafkaCluster) -> Result<()> {
    for node in cluster.nodes() {
        if !node.is_running() {
            node.spawn()?;
        }
    }
    for node in cluster.nodes() {
        node.wait_ready(cluster.nodes().len())?;
    }
    Ok(())
}

/// Sends `signal` to node `id`'s JVM.
fn signal_node(cluster: &KafkaCluster, id: u32, signal: libc::c_int) -> Result<()> {
    let pid = cluster
        .node(id)?
        .pid()
        .with_context(|| format!("Kafka node {id} is not running"))?;
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) on the pid of a child the cluster handle owns and has not reaped.
    let rc = unsafe { libc::kill(pid, signal) };
    ensure!(rc == 0, "kill({pid}, {signal}) failed");
    Ok(())
}

/// Waits until every partition of `topics` has all its replicas in sync again.
async fn wait_fully_replicated(cluster: &KafkaCluster, topics: &[String]) -> Result<()> {
    wait_until(
        Duration::from_secs(120),
        Duration::from_millis(250),
        || async {
            let md = cluster.metadata()?;
            for name in topics {
                let Some(topic) = md.topics().iter().find(|t| t.name() == name) else {
                    continue;
                };
                for p in topic.partitions() {
                    ensure!(
                        p.isr().len() == p.replicas().len() && p.leader() >= 0,
                        "{name}/{}: isr {:?} of {:?}",
                        p.id(),
                        p.isr(),
                        p.replicas()
                    );
                }
            }
            Ok(true)
        },
    )
    .await
}

/// Scenario 1: The leader of the busiest partition is killed with `kill -9` mid-stream and restarted.
async fn leader_killed_mid_stream(cluster: &KafkaCluster) -> Result<()> {
    let s = Scenario::start(cluster, "leaderkill", "").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    let topic = s.topic("outbox.event.Order");
    let leader = cluster.leader_of(&topic, 0)?;
    let leader_id = u32::try_from(leader)?;
    cluster.node(leader_id)?.kill9()?;
    // Another replica takes over while the writer goes on.
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(cluster.leader_of(&topic, 0).is_ok_and(|l| l != leader)) },
    )
    .await
    .context("no new leader was elected")?;
    // Records go to the new leader for a while before the old one comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.restart(leader_id)?;
    tokio::time::sleep(AFTER_RECOVERY).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    Ok(())
}

/// Scenario 2: Two of three brokers down for three delivery deadlines (`NOT_ENOUGH_REPLICAS`, and
/// the controller quorum lost) while events are committed: the slot does not move past them, WAL is retained, no
/// tight retry loop, and everything arrives after recovery.
async fn two_of_three_down(cluster: &KafkaCluster) -> Result<()> {
    quorum_lost(cluster, "quorumlost", false).await
}

/// Scenario 2, with exactly-once delivery: the transaction coordinator's log and the progress
/// topic lose their quorum too, so no Kafka transaction can end; Siphon waits with backoff and
/// afterwards a read_committed consumer sees each event once.
async fn two_of_three_down_exactly_once(cluster: &KafkaCluster) -> Result<()> {
    quorum_lost(cluster, "quorumlosteos", true).await
}

/// How long two of three brokers stay down: three delivery deadlines.
const QUORUM_OUTAGE: Duration = Duration::from_millis(3 * OUTAGE_DEADLINE_MS);

async fn quorum_lost(cluster: &KafkaCluster, name: &str, exactly_once: bool) -> Result<()> {
    let setup = Setup {
        exactly_once,
        deadline_ms: OUTAGE_DEADLINE_MS,
        ..Setup::default()
    };
    let s = Scenario::start_with(cluster, name, setup).await?;
    let client = s.pg.connect().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;

    let down = [2u32, 3];
    for id in down {
        cluster.node(id)?.kill9()?;
    }
    let outage_start_lsn = current_insert_lsn(&client).await?;
    let log_lines_before = s.siphon.log().lines().count();
    let replacements_before = s.producer_replacements();
    let outage = Instant::now();
    let mut highest_confirmed = 0;
    while outage.elapsed() < QUORUM_OUTAGE {
        let confirmed = slot_confirmed_lsn(&client, &s.slot).await?.unwrap_or(0);
        highest_confirmed = highest_confirmed.max(confirmed);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let retained = slot_retained_wal(&client, &s.slot).await?.unwrap_or(0);
    let written = current_insert_lsn(&client).await? - outage_start_lsn;
    let log_lines = s.siphon.log().lines().count() - log_lines_before;
    let replacements = s.producer_replacements() - replacements_before;
    all_nodes_up(cluster)?;
    eprintln!(
        "two of three brokers down for {QUORUM_OUTAGE:?}: {written} bytes of WAL written, \
         {retained} bytes retained by the slot, {replacements} producer replacements, \
         {log_lines} log lines"
    );
    ensure!(
        highest_confirmed <= outage_start_lsn,
        "the slot was confirmed at {highest_confirmed}, past {outage_start_lsn} where the \
         unacknowledged events begin; log:\n{}",
        s.siphon.log()
    );
    ensure!(
        retained >= written,
        "the slot retains {retained} bytes, less than the {written} written during the outage"
    );
    // The deadline paces replacements, with backoff: at most one per deadline.
    let bound = (QUORUM_OUTAGE.as_millis() / u128::from(OUTAGE_DEADLINE_MS)) as usize + 1;
    ensure!(
        replacements <= bound,
        "{replacements} producer replacements in {QUORUM_OUTAGE:?} (at most {bound}); log:\n{}",
        s.siphon.log()
    );
    // A retry loop without backoff writes thousands of lines; each replacement writes a few.
    ensure!(
        log_lines <= 60,
        "{log_lines} log lines in {QUORUM_OUTAGE:?}: a retry loop?\n{}",
        s.siphon.log()
    );

    tokio::time::sleep(AFTER_RECOVERY).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    Ok(())
}

/// Scenario 3: Every broker restarted in turn (controlled shutdown, restart, replicas back in sync)
/// while streaming.
async fn rolling_restart(cluster: &KafkaCluster) -> Result<()> {
    let s = Scenario::start(cluster, "rolling", "").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    let topics = vec![
        s.topic("outbox.event.Order"),
        s.topic("outbox.event.Customer"),
    ];
    for node in cluster.nodes() {
        node.stop(Duration::from_secs(60))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.restart(node.id())?;
        wait_fully_replicated(cluster, &topics).await?;
    }
    tokio::time::sleep(AFTER_RECOVERY).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    Ok(())
}

/// Scenario 4: The delivery-deadline path on a real broker: every node frozen (SIGSTOP, as in a paused
/// virtual machine or a stop-the-world pause) for twice the deadline, so the records in flight are
/// overdue inside the producer while their requests sit unanswered in the brokers' sockets. The
/// session purges and replaces the producer and, once the nodes resume, sends again in order;
/// the brokers then also write the requests the old producer had sent (repeats with the same
/// ids), and the first delivery of every event stays in commit order.
///
/// (Freezing only a partition's leader does not reach the deadline on a real cluster: the
/// controller fences the silent node within its session timeout, the producer learns the new
/// leader from metadata and sends the records there, in order, well before the deadline.)
async fn cluster_frozen_past_the_deadline(cluster: &KafkaCluster) -> Result<()> {
    let setup = Setup {
        deadline_ms: OUTAGE_DEADLINE_MS,
        ..Setup::default()
    };
    let s = Scenario::start_with(cluster, "frozen", setup).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    for node in cluster.nodes() {
        signal_node(cluster, node.id(), libc::SIGSTOP)?;
    }
    tokio::time::sleep(Duration::from_millis(2 * OUTAGE_DEADLINE_MS)).await;
    for node in cluster.nodes() {
        signal_node(cluster, node.id(), libc::SIGCONT)?;
    }
    tokio::time::sleep(AFTER_RECOVERY).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    ensure!(
        s.siphon.log().contains("purging the producer"),
        "the delivery deadline never fired, so this scenario proved nothing; log:\n{}",
        s.siphon.log()
    );
    // The replacement's warning names the deadline as its cause.
    ensure!(
        s.siphon
            .log()
            .contains("a record was not acknowledged within the delivery deadline"),
        "no replacement names the delivery deadline; log:\n{}",
        s.siphon.log()
    );
    // Nodes may have fenced each other while frozen; all back in sync before the next scenario.
    wait_fully_replicated(
        cluster,
        &[
            s.topic("outbox.event.Order"),
            s.topic("outbox.event.Customer"),
        ],
    )
    .await?;
    Ok(())
}

/// Scenario 5a: A topic deleted while Siphon writes to it. The broker creates it again on the
/// next metadata request (`auto.create.topics.enable`, Kafka's default) with its default
/// partition count (one), so the records in flight to the topic's other partitions fail: they
/// name a partition the topic no longer has. The partitioner placed them, so that is not their
/// fault: the producer is replaced, and they are placed again on the topic as it is now, in
/// commit order, before anything after them. What the deleted topic held is gone with it
/// (Debezium's task fails instead, after `delivery.timeout.ms`); every event committed after
/// the deletion, and every event of the other topic, arrives, and every record of either topic
/// is in commit order per key.
async fn topic_deleted_while_writing(cluster: &KafkaCluster) -> Result<()> {
    let log = topic_deleted(cluster, "deleted", false).await?;
    // The path this scenario is about was taken (a cluster creating topics with as many
    // partitions as before would prove nothing).
    ensure!(
        log.contains("the topic no longer has the partition the producer placed the record in"),
        "no record failed for a partition the topic lost; log:\n{log}"
    );
    Ok(())
}

/// Scenario 5a with exactly-once delivery: the failed records abort their Kafka transaction,
/// the session starts again from the last committed progress, and a read_committed consumer
/// sees each event committed after the deletion once, in commit order.
async fn topic_deleted_while_writing_exactly_once(cluster: &KafkaCluster) -> Result<()> {
    topic_deleted(cluster, "deletedeos", true).await.map(drop)
}

/// Deletes the Customer topic while a writer commits events of both topics; returns Siphon's
/// log once every event committed after the deletion, and every Order event, arrived.
async fn topic_deleted(cluster: &KafkaCluster, name: &str, exactly_once: bool) -> Result<String> {
    let setup = Setup {
        exactly_once,
        ..Setup::default()
    };
    let s = Scenario::start_with(cluster, name, setup).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let last_seq = Arc::new(AtomicU64::new(0));
    let writer = start_writer_counting(&s.pg, 1, Arc::clone(&stop), Arc::clone(&last_seq)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    let topic = s.topic("outbox.event.Customer");
    let admin = admin(cluster)?;
    for result in admin
        .delete_topics(&[topic.as_str()], &AdminOptions::new())
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("deleting {name}: {code}"))?;
    }
    // The controller answers once the deletion is in its log; each broker applies it a moment
    // later, and a record a broker acknowledged before that is gone with the topic. Every event
    // committed from a second after the answer on must arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let committed_before_deletion = last_seq.load(Ordering::Relaxed);
    // Long enough for the topic to be created again and written to.
    tokio::time::sleep(BEFORE_FAULT * 3).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    let expected: BTreeSet<String> = committed
        .iter()
        .filter(|e| e.aggregatetype == "Order" || e.seq > committed_before_deletion)
        .map(|e| e.id.clone())
        .collect();
    let records = wait_for_all(&s.target, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", s.siphon.log()))?;
    let all: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
    let phantom = phantom_ids(&records, &all);
    ensure!(phantom.is_empty(), "events never committed: {phantom:?}");
    check_first_deliveries_in_order(&records)?;
    if exactly_once {
        // Read with read_committed: each event once.
        let mut seen = BTreeSet::new();
        let repeated: Vec<String> = records
            .iter()
            .map(record_id)
            .filter(|id| !seen.insert(id.clone()))
            .collect();
        ensure!(
            repeated.is_empty(),
            "exactly-once delivery, yet events repeated: {repeated:?}"
        );
    }
    let log = s.siphon.log();
    ensure!(
        s.siphon.is_running(),
        "Siphon stopped after the deletion; log:\n{log}"
    );
    let client = s.pg.connect().await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, &s.slot, end, Duration::from_secs(60)).await?;
    Ok(log)
}

/// Scenario 5b: A topic whose partition count is raised (3 to 6) while Siphon writes: no event is lost,
/// and once the producer's metadata shows the new count (`topic.metadata.refresh.interval.ms`,
/// set to 1 s here; 5 minutes by default, like the Java client's `metadata.max.age.ms`), each key
/// goes to murmur2(key) mod 6, as the Java client (and so Debezium) places it. Each key moves
/// once: every record on its old partition comes before every record on its new one.
async fn partitions_raised_while_writing(cluster: &KafkaCluster) -> Result<()> {
    let s = Scenario::start(
        cluster,
        "repartitioned",
        "\"topic.metadata.refresh.interval.ms\" = \"1000\"",
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    let topic = s.topic("outbox.event.Order");
    let admin = admin(cluster)?;
    for result in admin
        .create_partitions(&[NewPartitions::new(&topic, 6)], &AdminOptions::new())
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("adding partitions to {name}: {code}"))?;
    }
    // Several metadata refreshes, and then events for every key on its new placement.
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    let expected: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_all(&s.target, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", s.siphon.log()))?;
    ensure!(phantom_ids(&records, &expected).is_empty());
    let mut by_key: BTreeMap<Vec<u8>, Vec<(u64, i32)>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.topic == topic) {
        let (Some(key), Some(seq)) = (r.key.clone(), record_seq(r)) else {
            continue;
        };
        by_key.entry(key).or_default().push((seq, r.partition));
    }
    let mut moved = 0;
    for (key, mut placed) in by_key {
        placed.sort_unstable();
        placed.dedup_by_key(|p| p.0);
        let (old, new) = (partition_for_key(&key, 3), partition_for_key(&key, 6));
        for (seq, partition) in &placed {
            ensure!(
                *partition == old || *partition == new,
                "key {} seq {seq} on partition {partition}, neither murmur2 mod 3 ({old}) nor mod 6 ({new})",
                String::from_utf8_lossy(&key)
            );
        }
        // One switch from the old placement to the new one, never back.
        let switches = placed.windows(2).filter(|w| w[0].1 != w[1].1).count();
        ensure!(
            switches <= 1 && placed.last().is_some_and(|p| p.1 == new),
            "key {}: placements by seq {placed:?} (old {old}, new {new})",
            String::from_utf8_lossy(&key)
        );
        moved += usize::from(old != new);
    }
    ensure!(
        moved > 0,
        "no key changed partition: the test proved nothing"
    );
    let client = s.pg.connect().await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, &s.slot, end, Duration::from_secs(60)).await?;
    Ok(())
}

/// Scenario 6: Exactly-once, the transaction coordinator's node killed (`kill -9`) after it
/// recorded a commit and before its answer reached Siphon. Every connection of Siphon's
/// clients goes through a proxy per node; the proxy of the coordinator's node keeps back the
/// answer to EndTxn, so the commit is in the coordinator's (replicated) log while Siphon has no
/// answer, and then the node is killed. Another node takes the coordinator over and completes
/// the commit; Siphon can learn the outcome only from it. A read_committed consumer sees each
/// event once, first deliveries in commit order per key.
async fn coordinator_killed_mid_commit(cluster: &KafkaCluster) -> Result<()> {
    let proxies = ClusterProxies::start(cluster)?;
    let setup = Setup {
        exactly_once: true,
        bootstrap: Some(proxies.bootstrap()),
        ..Setup::default()
    };
    let s = Scenario::start_with(cluster, "coordkill", setup).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    // Only the coordinator answers EndTxn: the proxy it passes is the coordinator's node's.
    for (_, proxy) in proxies.proxies() {
        proxy.hold_next_answer(END_TXN);
    }
    let coordinator = kill_the_node_holding_an_answer(cluster, &proxies, &s, "EndTxn").await?;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    report_the_held_answer(&proxies, &s, coordinator, "EndTxn")?;
    Ok(())
}

/// Exactly-once: Siphon killed (`kill -9`) while a writer goes on, so a backlog and its open
/// Kafka transaction wait for the next start; at that start the proxy of the transaction
/// coordinator's node keeps back the answer to the new producer's InitProducerId (which fences
/// the old producer and aborts its transaction), and the node is killed. The producer registers
/// with the node that takes the coordinator over, the stream keeps the slot meanwhile, and a
/// read_committed consumer sees each event once, first deliveries in commit order per key.
async fn coordinator_killed_while_registering(cluster: &KafkaCluster) -> Result<()> {
    let name = "coordreg";
    let proxies = ClusterProxies::start(cluster)?;
    let setup = Setup {
        exactly_once: true,
        bootstrap: Some(proxies.bootstrap()),
        ..Setup::default()
    };
    let s = Scenario::start_with(cluster, name, setup).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&s.pg, 1, Arc::clone(&stop)).await?;
    tokio::time::sleep(BEFORE_FAULT).await;
    s.siphon.kill9()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Only the coordinator answers InitProducerId for a transactional id (which names the
    // slot): the proxy it passes is the coordinator's node's.
    for (_, proxy) in proxies.proxies() {
        proxy.hold_next_answer_to(INIT_PRODUCER_ID, name.as_bytes());
    }
    s.siphon.start_again()?;
    let coordinator =
        kill_the_node_holding_an_answer(cluster, &proxies, &s, "InitProducerId").await?;
    stop.store(true, Ordering::Relaxed);
    let committed = writer.await??;
    s.check_delivered(&committed).await?;
    report_the_held_answer(&proxies, &s, coordinator, "InitProducerId")?;
    Ok(())
}

/// Once a proxy of `proxies` holds the answer to the `request` they were armed for: disarms
/// them all (no other such request is sent while this one waits for its answer), kills that
/// proxy's node (`kill -9`), lets the writer go on for 3 s while another node is the
/// coordinator, starts the node again and lets the writer go on. Returns the node's id.
async fn kill_the_node_holding_an_answer(
    cluster: &KafkaCluster,
    proxies: &ClusterProxies,
    s: &Scenario,
    request: &str,
) -> Result<u32> {
    let coordinator = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(5),
        || async {
            Ok(proxies
                .proxies()
                .find(|(_, proxy)| proxy.answers_held() > 0)
                .map(|(id, _)| id))
        },
    )
    .await
    .with_context(|| {
        format!(
            "no {request} answer reached a proxy; log:\n{}",
            s.siphon.log()
        )
    })?;
    for (_, proxy) in proxies.proxies() {
        proxy.clear_answer_hold();
    }
    cluster.node(coordinator)?.kill9()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.restart(coordinator)?;
    tokio::time::sleep(AFTER_RECOVERY).await;
    Ok(coordinator)
}

/// Checks that the proxies held exactly one answer (to `request`), and shows Siphon's warnings.
fn report_the_held_answer(
    proxies: &ClusterProxies,
    s: &Scenario,
    coordinator: u32,
    request: &str,
) -> Result<()> {
    let held: u64 = proxies.proxies().map(|(_, p)| p.answers_held()).sum();
    ensure!(held == 1, "{held} {request} answers held, not one");
    eprintln!(
        "{}: node {coordinator} killed with the {request} answer held; Siphon's warnings:\n{}",
        s.slot,
        s.siphon
            .log()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

fn admin(cluster: &KafkaCluster) -> Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .create()
        .context("creating an admin client")
}

/// The cluster this process's scenarios share.
fn cluster() -> Result<&'static KafkaCluster> {
    static CLUSTER: OnceLock<std::result::Result<KafkaCluster, String>> = OnceLock::new();
    scenarios::shared(&CLUSTER, || KafkaCluster::start_for_process(&[]))
}

/// Each scenario a test of its own, on the shared cluster, one at a time; every node runs
/// before each (one may have left one down).
macro_rules! on_the_cluster {
    ($($name:ident),* $(,)?) => {
        mod on_the_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    let _turn = siphon_tests::scenarios::TURN.lock().await;
                    let cluster = super::cluster()?;
                    super::all_nodes_up(cluster)?;
                    super::$name(cluster).await
                }
            )*
        }
    };
}

on_the_cluster!(
    leader_killed_mid_stream,
    two_of_three_down,
    two_of_three_down_exactly_once,
    rolling_restart,
    cluster_frozen_past_the_deadline,
    topic_deleted_while_writing,
    topic_deleted_while_writing_exactly_once,
    partitions_raised_while_writing,
    coordinator_killed_mid_commit,
    coordinator_killed_while_registering,
);
