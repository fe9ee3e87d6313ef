//! Outbox helpers shared by the end-to-end tests: the table, events, transactions that insert
//! and delete them, slot positions, and a Siphon configuration for the scratch services.
//!
//! # Invariants
//! - [`event`] is a pure function of its arguments, so a test can recompute what it wrote.
//! - [`siphon_config`] routes every record into the test's topic namespace
//!   ([`KafkaTarget::topic`]), and the helpers that read records back read the same names.

use crate::{Broker, ConsumedRecord, KafkaCluster, Postgres, SiphonProcess};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio_postgres::{Client, Transaction};

/// The outbox table users create (Debezium's outbox shape).
pub const OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb)";

/// One event as the application writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    pub aggregatetype: &'static str,
    pub aggregateid: String,
    pub seq: u64,
    pub payload: String,
}

/// The event numbered `seq`: aggregate type `Customer` for multiples of 3, else `Order`; 17
/// aggregates per type; payloads with quotes, escapes, control characters and non-ASCII text.
pub fn event(seq: u64, committed: bool) -> Event {
    let aggregatetype = if seq.is_multiple_of(3) {
        "Customer"
    } else {
        "Order"
    };
    let note = match seq % 5 {
        0 => "plain".to_owned(),
        1 => "quote \" and backslash \\ and slash /".to_owned(),
        2 => "tab\tnewline\nreturn\r".to_owned(),
        3 => "non-ASCII: zürich, 東京, emoji 🚀".to_owned(),
        _ => String::new(),
    };
    let payload = format!(
        r#"{{"seq": {seq}, "note": {}, "committed": {committed}, "items": [1, 2.5, null, true]}}"#,
        json_quote(&note)
    );
    Event {
        id: format!("00000000-0000-4000-8000-{seq:012}"),
        aggregatetype,
        aggregateid: format!("{}-{}", aggregatetype.to_lowercase(), seq % 17),
        seq,
        payload,
    }
}

fn json_quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The sequence number an event id encodes.
pub fn seq_of(id: &str) -> Option<u64> {
    id.rsplit('-').next()?.parse().ok()
}

/// Inserts `events` into the outbox within `tx` (type `Event`), in order.
pub async fn insert_events(tx: &Transaction<'_>, events: &[Event]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let stmt = tx
        .prepare(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, $3, 'Event', $4::text::jsonb)",
        )
        .await?;
    for e in events {
        tx.execute(
            &stmt,
            &[&e.id, &e.aggregatetype, &e.aggregateid, &e.payload],
        )
        .await?;
    }
    Ok(())
}

/// One transaction that inserts `events` into the outbox and deletes them again, then commits
/// or rolls back.
pub async fn insert_transaction(client: &mut Client, events: &[Event], commit: bool) -> Result<()> {
    let tx = client.transaction().await?;
    insert_events(&tx, events).await?;
    tx.execute("DELETE FROM outbox", &[]).await?;
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(())
}

/// Commits `transactions` transactions of 10 `Order` rows each whose payload carries
/// `row_bytes` bytes (ids 1 ..= 10 x `transactions`, 17 aggregates). The payload compresses in
/// the table (TOAST), but pgoutput sends each row whole: a large-record workload.
pub async fn insert_large_rows(client: &Client, transactions: i64, row_bytes: i32) -> Result<()> {
    for txn in 0..transactions {
        insert_order_rows(client, txn * 10 + 1, txn * 10 + 10, row_bytes).await?;
    }
    Ok(())
}

/// Commits `small` rows with a payload of a few bytes (ids 1 ..= `small`), then `large` rows
/// whose payload carries `row_bytes` bytes (the ids after): a mix of sizes that a row count
/// estimated from the first rows does not bound.
pub async fn insert_small_then_large_rows(
    client: &Client,
    small: i64,
    large: i64,
    row_bytes: i32,
) -> Result<()> {
    insert_order_rows(client, 1, small, 1).await?;
    insert_order_rows(client, small + 1, small + large, row_bytes).await
}

/// Commits `Order` rows `from ..= to` in one transaction, each payload carrying `row_bytes`
/// bytes.
async fn insert_order_rows(client: &Client, from: i64, to: i64, row_bytes: i32) -> Result<()> {
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
                    'Order', 'order-' || (g % 17), 'Event', \
                    jsonb_build_object('seq', g, 'data', repeat('x', $3::int)) \
             FROM generate_series($1::bigint, $2::bigint) g",
            &[&from, &to, &row_bytes],
        )
        .await?;
    Ok(())
}

/// The slot's `confirmed_flush_lsn` as a number, if the slot exists.
pub async fn slot_confirmed_lsn(client: &Client, slot: &str) -> Result<Option<u64>> {
    let row = client
        .query_opt(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .map(|v| v as u64))
}

/// Starts Siphon with `config` and waits (up to 60 s) until it streams from `slot`; the error
/// carries Siphon's log.
pub async fn start_streaming(client: &Client, config: &str, slot: &str) -> Result<SiphonProcess> {
    let siphon = SiphonProcess::start(config)?;
    crate::wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(client, slot).await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;
    Ok(siphon)
}

/// Whether a walsender is streaming from the slot. A slot is also `active` while an ordinary
/// backend is still creating it (waiting for running transactions to end); transactions that
/// commit then are before the slot's consistent point and never decoded, so that does not count.
pub async fn slot_active(client: &Client, slot: &str) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s \
                 JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)",
            &[&slot],
        )
        .await?;
    Ok(row.get(0))
}

/// WAL the slot keeps from being removed, in bytes.
pub async fn slot_retained_wal(client: &Client, slot: &str) -> Result<Option<u64>> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .map(|v| v as u64))
}

/// The current WAL insert position as a number.
pub async fn current_insert_lsn(client: &Client) -> Result<u64> {
    let row = client
        .query_one(
            "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// A Kafka a test writes to and reads from: where to connect, and what its topics are named.
pub trait KafkaTarget {
    /// `bootstrap.servers`.
    fn bootstrap(&self) -> String;
    /// The name topic `name` has for this test (see [`Broker::topic`]).
    fn topic(&self, name: &str) -> String;
    /// The prefix [`KafkaTarget::topic`] adds.
    fn namespace(&self) -> String {
        self.topic("")
    }
}

impl KafkaTarget for Broker {
    fn bootstrap(&self) -> String {
        Broker::bootstrap(self)
    }
    fn topic(&self, name: &str) -> String {
        Broker::topic(self, name)
    }
}

impl KafkaTarget for crate::proxy::ProxiedBroker {
    fn bootstrap(&self) -> String {
        crate::proxy::ProxiedBroker::bootstrap(self)
    }
    fn topic(&self, name: &str) -> String {
        crate::proxy::ProxiedBroker::topic(self, name)
    }
}

/// A cluster of a test's own: topic names as they are.
impl KafkaTarget for KafkaCluster {
    fn bootstrap(&self) -> String {
        KafkaCluster::bootstrap(self)
    }
    fn topic(&self, name: &str) -> String {
        name.to_owned()
    }
}

/// A namespace reached at another address (through a proxy of the test's, say).
pub struct Via {
    pub bootstrap: String,
    pub namespace: String,
}

impl Via {
    /// `target`'s topics, reached at `bootstrap`.
    pub fn new(target: &impl KafkaTarget, bootstrap: &str) -> Via {
        Via {
            bootstrap: bootstrap.to_owned(),
            namespace: target.namespace(),
        }
    }
}

impl KafkaTarget for Via {
    fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }
    fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }
}

/// Waits until the slot is confirmed up to the server's current position.
pub async fn wait_for_slot_caught_up(client: &Client, slot: &str) -> Result<()> {
    let target = current_insert_lsn(client).await?;
    crate::wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(slot_confirmed_lsn(client, slot).await?.unwrap_or(0) >= target) },
    )
    .await
    .context("the slot did not catch up")
}

/// A Siphon configuration for the scratch services: slot `slot`, publication `<slot>_pub`,
/// topics created with 3 partitions, a short status interval, a 10 s delivery timeout, a
/// 500-record window, records routed into the test's topic namespace
/// (`outbox.event.<aggregatetype>` there), and `extra` TOML appended (in the `[pipeline]`
/// section unless it opens another; a test that opens `[router]` itself sets
/// `route.topic.replacement` there, with [`route_replacement`]).
pub fn siphon_config(pg: &Postgres, broker: &impl KafkaTarget, slot: &str, extra: &str) -> String {
    siphon_config_at(
        pg,
        broker,
        slot,
        "\"message.timeout.ms\" = \"10000\"",
        &format!("max_in_flight_records = 500\n{extra}"),
    )
}

/// [`siphon_config`] with exactly-once delivery, the progress topic in `broker`'s namespace.
pub fn exactly_once_config(pg: &Postgres, broker: &Broker, slot: &str) -> String {
    with_exactly_once(&siphon_config(pg, broker, slot, ""), broker)
}

/// `config` (a [`siphon_config`]) with `kafka.delivery = "exactly-once"`, the progress topic in
/// `broker`'s namespace.
pub fn with_exactly_once(config: &str, broker: &impl KafkaTarget) -> String {
    let bootstrap = format!("bootstrap_servers = \"{}\"", broker.bootstrap());
    assert!(config.contains(&bootstrap), "not a siphon_config: {config}");
    config.replacen(
        &bootstrap,
        &format!(
            "{bootstrap}\ndelivery = \"exactly-once\"\nprogress_topic = \"{}\"",
            broker.topic("siphon.progress")
        ),
        1,
    )
}

/// Siphon's defaults around slot `s`, publication `p` and `tables` (TOML strings, e.g.
/// `"\"public.outbox\""`), connecting with `url`, records routed into `broker`'s namespace.
pub fn defaults_config(url: &str, broker: &impl KafkaTarget, tables: &str) -> String {
    format!(
        r#"
[router]
{}

[source]
url = "{url}"
slot = "s"
publication = "p"
tables = [{tables}]

[kafka]
bootstrap_servers = "{}"

[metrics]
listen = "127.0.0.1:0"
"#,
        route_replacement(broker),
        broker.bootstrap()
    )
}

/// The default `route.topic.replacement` in `broker`'s namespace, as a TOML line.
pub fn route_replacement(broker: &impl KafkaTarget) -> String {
    format!(
        "\"route.topic.replacement\" = \"{}outbox.event.${{routedByValue}}\"",
        broker.namespace()
    )
}

/// Like [`siphon_config`], with `kafka_properties` as the whole `[kafka.properties]` section
/// and `pipeline` appended to the `[pipeline]` section.
pub fn siphon_config_at(
    pg: &Postgres,
    broker: &impl KafkaTarget,
    slot: &str,
    kafka_properties: &str,
    pipeline: &str,
) -> String {
    let bootstrap = broker.bootstrap();
    // The router section only when the namespace needs one, and only if the test does not
    // open its own.
    let router = if broker.namespace().is_empty() || pipeline.contains("[router]") {
        String::new()
    } else {
        format!("[router]\n{}\n", route_replacement(broker))
    };
    format!(
        r#"
{router}
[source]
url = "{url}"
slot = "{slot}"
publication = "{slot}_pub"
tables = ["public.outbox"]
status_interval_ms = 200

[kafka]
bootstrap_servers = "{bootstrap}"

[kafka.properties]
{kafka_properties}

[kafka.topic_creation]
partitions = 3
replication_factor = 1

[metrics]
listen = "127.0.0.1:0"

[pipeline]
shutdown_timeout_secs = 20
max_backoff_secs = 2
{pipeline}
"#,
        url = pg.url()
    )
}

/// The sequence number of a record's event, from its `id` header.
pub fn record_seq(record: &ConsumedRecord) -> Option<u64> {
    seq_of(std::str::from_utf8(record.header("id")?).ok()?)
}

/// Checks that, per topic and key, the first delivery of each event comes in commit order
/// (repeats after a failure may come later). Names the first aggregate out of order.
pub fn check_first_deliveries_in_order(records: &[ConsumedRecord]) -> Result<()> {
    let mut by_key: BTreeMap<(&str, &[u8]), Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in records {
        by_key
            .entry((r.topic.as_str(), r.key.as_deref().unwrap_or_default()))
            .or_default()
            .push(r);
    }
    for ((topic, key), mut group) in by_key {
        group.sort_by_key(|r| (r.partition, r.offset));
        let mut seen = BTreeSet::new();
        let firsts: Vec<u64> = group
            .iter()
            .filter_map(|r| record_seq(r))
            .filter(|s| seen.insert(*s))
            .collect();
        anyhow::ensure!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{topic} {}: first deliveries out of commit order: {firsts:?}",
            String::from_utf8_lossy(key)
        );
    }
    Ok(())
}

/// Waits (up to `timeout`) until the slot's `confirmed_flush_lsn` is at or past `lsn`.
pub async fn wait_for_slot_past(
    client: &Client,
    slot: &str,
    lsn: u64,
    timeout: Duration,
) -> Result<()> {
    crate::wait_until(timeout, std::time::Duration::from_millis(200), || async {
        Ok(slot_confirmed_lsn(client, slot).await?.unwrap_or(0) >= lsn)
    })
    .await
}

/// The topics the records of [`event`]s go to (in a test's namespace: [`KafkaTarget::topic`]).
pub const EVENT_TOPICS: [&str; 2] = ["outbox.event.Order", "outbox.event.Customer"];

/// Every record in [`EVENT_TOPICS`] of `broker`.
pub async fn read_event_records(broker: &impl KafkaTarget) -> Result<Vec<ConsumedRecord>> {
    read_event_records_isolated(broker, crate::Isolation::ReadCommitted).await
}

/// Every record in [`EVENT_TOPICS`] of `broker`, read with `isolation`.
pub async fn read_event_records_isolated(
    broker: &impl KafkaTarget,
    isolation: crate::Isolation,
) -> Result<Vec<ConsumedRecord>> {
    let mut all = Vec::new();
    for topic in EVENT_TOPICS {
        let (bootstrap, topic) = (broker.bootstrap(), broker.topic(topic));
        all.extend(
            crate::read_topic_isolated_async(
                &bootstrap,
                &topic,
                Duration::from_secs(120),
                isolation,
            )
            .await?,
        );
    }
    Ok(all)
}

/// Every record in [`EVENT_TOPICS`] of `broker`, read_committed once every Kafka transaction
/// written to them is decided and its markers are written ([`crate::wait_for_transactions_settled`]):
/// for a read after the writer has stopped, when what is missing must count as lost.
pub async fn read_event_records_settled(broker: &impl KafkaTarget) -> Result<Vec<ConsumedRecord>> {
    for topic in EVENT_TOPICS {
        let (bootstrap, topic) = (broker.bootstrap(), broker.topic(topic));
        tokio::task::spawn_blocking(move || {
            crate::wait_for_transactions_settled(&bootstrap, &topic, Duration::from_secs(120))
        })
        .await
        .context("settling task failed")??;
    }
    read_event_records_isolated(broker, crate::Isolation::ReadCommitted).await
}

/// After a write of ledger transaction `txn` failed (PostgreSQL restarted under it): a new
/// connection, and whether the transaction committed (its ledger row is there).
pub async fn reconnect_and_check_ledger(pg: &Postgres, txn: i64) -> (Client, bool) {
    let client = pg.connect_retrying().await;
    let done = client
        .query_opt("SELECT 1 FROM ledger WHERE txn = $1", &[&txn])
        .await
        .map(|r| r.is_some())
        .unwrap_or(false);
    (client, done)
}

/// The `id` header of a record (lossy UTF-8; empty when missing).
pub fn record_id(record: &ConsumedRecord) -> String {
    String::from_utf8_lossy(record.header("id").unwrap_or_default()).into_owned()
}

/// How many of `records` carry each `id` header.
pub fn count_by_id(records: &[ConsumedRecord]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        *counts.entry(record_id(record)).or_default() += 1;
    }
    counts
}

/// Waits (up to `timeout`) until every id in `expected` is in [`EVENT_TOPICS`] of `broker`;
/// returns every record there (repeats and others included).
pub async fn wait_for_all(
    broker: &impl KafkaTarget,
    expected: &BTreeSet<String>,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    crate::wait_for(timeout, std::time::Duration::from_millis(500), || async {
        let records = read_event_records(broker).await?;
        let ids: BTreeSet<String> = records.iter().map(record_id).collect();
        let missing = expected.difference(&ids).count();
        anyhow::ensure!(
            missing == 0,
            "{missing} of {} events missing",
            expected.len()
        );
        Ok(Some(records))
    })
    .await
}

/// The ids of `records` that are not in `expected`, in record order.
pub fn phantom_ids(records: &[ConsumedRecord], expected: &BTreeSet<String>) -> Vec<String> {
    records
        .iter()
        .map(record_id)
        .filter(|id| !expected.contains(id))
        .collect()
}

/// Waits (up to `timeout`) until every id in `expected` is in [`EVENT_TOPICS`] of `broker`,
/// then checks that each arrived exactly once and that nothing else arrived.
pub async fn wait_for_each_once(
    broker: &impl KafkaTarget,
    expected: &BTreeSet<String>,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    let records = wait_for_all(broker, expected, timeout).await?;
    let counts = count_by_id(&records);
    let repeated: Vec<&String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    let phantom: Vec<&String> = counts.keys().filter(|id| !expected.contains(*id)).collect();
    anyhow::ensure!(
        repeated.is_empty(),
        "events delivered more than once: {repeated:?}"
    );
    anyhow::ensure!(phantom.is_empty(), "events never written: {phantom:?}");
    Ok(records)
}
