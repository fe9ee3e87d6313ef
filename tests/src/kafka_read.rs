//! Reading what is in a topic, in a way that works on Tansu: explicit
//! partition assignment (no consumer-group protocol) and reading until every
//! partition reports EOF (no reliance on ListOffsets "latest").
//!
//! # Invariants
//!
//! - [`read_topic`] returns every record that was in the topic's partitions
//!   when each partition reached EOF, ordered by (partition, offset).
//! - It never commits offsets and uses a fresh group id per call, so reads
//!   are independent of each other and of anything the system under test
//!   does.
//! - It never creates topics: a topic that does not exist reads as empty.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long a single metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// One record as read back from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Headers in wire order; duplicates are kept.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the epoch (create or log-append time), if any.
    pub timestamp: Option<i64>,
}

impl ConsumedRecord {
    /// The key as UTF-8 (lossy), for assertions and messages.
    pub fn key_str(&self) -> Option<String> {
        self.key
            .as_deref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }

    /// The value as UTF-8 (lossy), for assertions and messages.
    pub fn value_str(&self) -> Option<String> {
        self.value
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The value of the first header named `name`, if present and non-null.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// Which records a reader sees of topics written in Kafka transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only committed records (librdkafka's default; Java's consumers must ask for it).
    ReadCommitted,
    /// Every record written, aborted transactions' included (Java's consumers' default).
    ReadUncommitted,
}

fn consumer(bootstrap: &str) -> Result<BaseConsumer> {
    consumer_isolated(bootstrap, Isolation::ReadCommitted)
}

fn consumer_isolated(bootstrap: &str, isolation: Isolation) -> Result<BaseConsumer> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let group = format!(
        "siphon-tests-read-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "100")
        .set(
            "isolation.level",
            match isolation {
                Isolation::ReadCommitted => "read_committed",
                Isolation::ReadUncommitted => "read_uncommitted",
            },
        )
        .create()
        .context("creating an rdkafka consumer")
}

/// Reads every record of `topic` from the beginning of each partition until
/// every partition has reported EOF. Fails if that takes longer than
/// `timeout`. A topic that does not exist yields an empty list.
///
/// Blocks the calling thread; from async code use [`read_topic_async`] when
/// other tasks must keep running meanwhile.
pub fn read_topic(bootstrap: &str, topic: &str, timeout: Duration) -> Result<Vec<ConsumedRecord>> {
    read_topic_isolated(bootstrap, topic, timeout, Isolation::ReadCommitted)
}

/// [`read_topic`] with the given isolation level.
pub fn read_topic_isolated(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
    isolation: Isolation,
) -> Result<Vec<ConsumedRecord>> {
    let deadline = Instant::now() + timeout;
    let consumer = consumer_isolated(bootstrap, isolation)?;
    let partitions = led_partitions(&consumer, bootstrap, topic, deadline, timeout)?;
    if partitions.is_empty() {
        return Ok(Vec::new());
    }

    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .with_context(|| format!("assigning {topic}/{p}"))?;
    }
    consumer
        .assign(&tpl)
        .with_context(|| format!("assigning partitions of {topic:?}"))?;

    let mut pending: BTreeSet<i32> = partitions.iter().copied().collect();
    let mut records = Vec::new();
    while !pending.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "reading topic {topic:?} from {bootstrap}: partitions {pending:?} of {partitions:?} \
                 did not reach EOF within {timeout:?} ({} records read so far)",
                records.len()
            );
        }
        let wait = (deadline - now).min(Duration::from_millis(200));
        match consumer.poll(wait) {
            None => {}
            Some(Ok(msg)) => {
                let headers = msg
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default();
                records.push(ConsumedRecord {
                    topic: msg.topic().to_owned(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().map(<[u8]>::to_vec),
                    headers,
                    timestamp: msg.timestamp().to_millis(),
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => {
                return Err(anyhow!(e).context(format!("reading topic {topic:?} from {bootstrap}")))
            }
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}

/// The partitions of `topic`, once each has a leader (a topic just created, or a partition whose
/// leader just moved, has none for a moment); empty for a topic that does not exist.
fn led_partitions(
    consumer: &BaseConsumer,
    bootstrap: &str,
    topic: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<i32>> {
    loop {
        let md = consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT.min(timeout))
            .with_context(|| format!("metadata for topic {topic:?} from {bootstrap}"))?;
        let Some(md_topic) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Vec::new());
        };
        let leaderless = match md_topic.error().map(RDKafkaErrorCode::from) {
            None => md_topic.partitions().iter().any(|p| p.leader() < 0),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(Vec::new()),
            Some(RDKafkaErrorCode::LeaderNotAvailable) => true,
            Some(code) => bail!("metadata for topic {topic:?} from {bootstrap}: {code}"),
        };
        if !leaderless {
            return Ok(md_topic.partitions().iter().map(|p| p.id()).collect());
        }
        if Instant::now() >= deadline {
            bail!(
                "topic {topic:?} on {bootstrap} has partitions without a leader after {timeout:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every Kafka transaction written to `topic` is decided and its markers are
/// written: each partition's last stable offset (what a read_committed reader reads up to) has
/// reached its end. A producer's commit returns once the coordinator has recorded the decision,
/// before the markers reach the partitions, so a read_committed read just after a commit can
/// stop short of records already committed. A topic that does not exist is settled.
pub fn wait_for_transactions_settled(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let committed = consumer_isolated(bootstrap, Isolation::ReadCommitted)?;
    let uncommitted = consumer_isolated(bootstrap, Isolation::ReadUncommitted)?;
    let partitions = led_partitions(&committed, bootstrap, topic, deadline, timeout)?;
    loop {
        let mut unsettled = Vec::new();
        for &p in &partitions {
            // The end first: a marker written between the two reads then counts as settled.
            let (_, end) = uncommitted
                .fetch_watermarks(topic, p, METADATA_TIMEOUT)
                .with_context(|| format!("the end of {topic}/{p}"))?;
            let (_, stable) = committed
                .fetch_watermarks(topic, p, METADATA_TIMEOUT)
                .with_context(|| format!("the last stable offset of {topic}/{p}"))?;
            if stable < end {
                unsettled.push((p, stable, end));
            }
        }
        if unsettled.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{topic:?} on {bootstrap}: transactions still open or their markers unwritten after {timeout:?} \
                 (partition, last stable offset, end): {unsettled:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`wait_for_transactions_settled`], then [`read_topic`] (read_committed): every record of
/// every transaction committed before the call.
pub fn read_topic_settled(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    wait_for_transactions_settled(bootstrap, topic, timeout)?;
    read_topic(bootstrap, topic, timeout)
}

/// [`read_topic`] on Tokio's blocking thread pool.
pub async fn read_topic_async(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    read_topic_isolated_async(bootstrap, topic, timeout, Isolation::ReadCommitted).await
}

/// Waits up to `timeout` until `topic` holds at least `count` committed records, and returns
/// them (each read waits at most `read_timeout` for the partitions' ends).
pub async fn wait_for_topic_records(
    bootstrap: &str,
    topic: &str,
    count: usize,
    timeout: Duration,
    read_timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    crate::wait_for(timeout, Duration::from_millis(300), || async {
        let records = read_topic_async(bootstrap, topic, read_timeout).await?;
        Ok((records.len() >= count).then_some(records))
    })
    .await
}

/// [`read_topic_isolated`] on Tokio's blocking thread pool.
pub async fn read_topic_isolated_async(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
    isolation: Isolation,
) -> Result<Vec<ConsumedRecord>> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic_isolated(&bootstrap, &topic, timeout, isolation))
        .await
        .context("read_topic task failed")?
}

/// [`read_topic_settled`] on Tokio's blocking thread pool.
pub async fn read_topic_settled_async(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic_settled(&bootstrap, &topic, timeout))
        .await
        .context("read_topic_settled task failed")?
}

/// Names of all topics the broker reports, sorted.
pub fn list_topics(bootstrap: &str) -> Result<Vec<String>> {
    let consumer = consumer(bootstrap)?;
    let md = consumer
        .fetch_metadata(None, METADATA_TIMEOUT)
        .with_context(|| format!("metadata from {bootstrap}"))?;
    let mut names: Vec<String> = md.topics().iter().map(|t| t.name().to_owned()).collect();
    names.sort();
    Ok(names)
}

/// Creates `topic` with `partitions` partitions (replication factor 1). "Already exists" is
/// success.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    create_topic_replicated(bootstrap, topic, partitions, 1).await
}

/// Creates `topic` with `partitions` partitions, each on `replicas` brokers, and waits until
/// the broker reports it. "Already exists" is success.
pub async fn create_topic_replicated(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    replicas: i32,
) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an admin client")?;
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(replicas));
    for result in admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await?
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("creating topic {name}: {code}"),
        }
    }
    // Reading it back waits until every partition has a leader.
    read_topic_async(bootstrap, topic, Duration::from_secs(30)).await?;
    Ok(())
}
