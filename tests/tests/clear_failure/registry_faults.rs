//! Schema-registry faults end to end: real PostgreSQL, real Kafka, the real rivven-schema
//! registry behind an HTTP proxy that injects the faults ([`RegistryProxy`]), and Siphon
//! writing `format.value = "avro"`. What reached Kafka is decoded by Confluent's Python
//! deserializer with its own client of the registry (not through the proxy).
//!
//! - A slow registry (every answer 2 s late) loses nothing, and once a topic's schemas are
//!   known a thousand events cost no request.
//! - A registry that cannot answer for 30 s mid-stream (answers slower than
//!   `schema_registry.request_timeout_ms`, connections closed, then 503 and 500 for 20 s)
//!   holds back the event of a new schema and everything after it: nothing is sent without
//!   its id, the slot does not pass it, the retries are spaced by backoff; then every event
//!   arrives once, in order per aggregate.
//! - With exactly-once delivery, a registry that cannot answer for longer than the Kafka
//!   transaction timeout while a PostgreSQL transaction waits for a new schema's id (its
//!   earlier event already in the open Kafka transaction): that Kafka transaction is committed
//!   inside the PostgreSQL transaction (split by age), so the broker aborts nothing; a
//!   read_committed consumer sees nothing that waits for its id, then each event once, in
//!   order.
//! - A registry refusing Siphon's credentials (401), at start and mid-stream, stops Siphon
//!   (exit status 2) after one request, naming the settings to fix, the slot not past the
//!   unsent event; `check-config` names them too. Started again after the fix, Siphon
//!   delivers every event.
//!
//! The cases share one PostgreSQL, the broker and one registry, and run side by side: each
//! has its own outbox table, slot, topic, subject and proxy.

use anyhow::{ensure, Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config_at, slot_active};
use siphon_tests::outbox::{slot_confirmed_lsn, wait_for_slot_past};
use siphon_tests::registry_proxy::{RegistryFault, RegistryProxy};
use siphon_tests::{read_topic_async, wait_for, wait_until, ConsumedRecord};
use siphon_tests::{Broker, Postgres, RegistryServer, SiphonProcess};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the cases share.
struct Servers {
    pg: Postgres,
    broker: Broker,
    registry: RegistryServer,
    python: PathBuf,
}

/// One case's outbox table, aggregate type and slot, all named after it.
struct Case {
    servers: Arc<Servers>,
    client: tokio_postgres::Client,
    /// The table, slot and (capitalised) aggregate type's stem.
    name: &'static str,
}

/// The first of the two payload shapes (each shape is a schema).
fn shape_a(n: u64) -> serde_json::Value {
    serde_json::json!({"n": n, "a": "x"})
}

/// The second payload shape.
fn shape_b(n: u64) -> serde_json::Value {
    serde_json::json!({"n": n, "b": [n]})
}

impl Case {
    async fn new(servers: &Arc<Servers>, name: &'static str) -> Result<Case> {
        let client = servers.pg.connect().await?;
        client
            .batch_execute(&format!(
                "CREATE TABLE outbox_{name} (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)"
            ))
            .await?;
        Ok(Case {
            servers: Arc::clone(servers),
            client,
            name,
        })
    }

    fn aggregate(&self) -> String {
        let mut chars = self.name.chars();
        chars
            .next()
            .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
            .unwrap_or_default()
    }

    fn topic(&self) -> String {
        self.servers
            .broker
            .topic(&format!("outbox.event.{}", self.aggregate()))
    }

    /// Siphon's configuration: Avro values of expanded payloads, registered through `url`,
    /// `registry` added to `[schema_registry]`.
    fn config(&self, url: &str, registry: &str) -> String {
        let Servers { pg, broker, .. } = &*self.servers;
        let pipeline = format!(
            "[router]\n{}\n\"table.expand.json.payload\" = true\n\n[format]\nvalue = \"avro\"\n\n[schema_registry]\nurl = \"{url}\"\n{registry}\n",
            siphon_tests::outbox::route_replacement(broker)
        );
        siphon_config_at(pg, broker, self.name, "", &pipeline).replacen(
            "tables = [\"public.outbox\"]",
            &format!("tables = [\"public.outbox_{}\"]", self.name),
            1,
        )
    }

    /// Siphon started with `config`, once it streams from the case's slot.
    async fn start(&self, config: &str) -> Result<SiphonProcess> {
        let siphon = SiphonProcess::start(config)?;
        self.streaming(&siphon).await?;
        Ok(siphon)
    }

    /// Waits until `siphon` streams from the case's slot.
    async fn streaming(&self, siphon: &SiphonProcess) -> Result<()> {
        wait_until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { slot_active(&self.client, self.name).await },
        )
        .await
        .with_context(|| siphon.log())
    }

    /// Commits one transaction per payload (event `n` under aggregate id `k<n % 3>`), and
    /// returns the WAL position after each commit.
    async fn commit_each(&self, events: &[(u64, serde_json::Value)]) -> Result<Vec<u64>> {
        let mut ends = Vec::with_capacity(events.len());
        for (n, payload) in events {
            self.client
                .execute(
                    &format!(
                        "INSERT INTO outbox_{} VALUES ($1::text::uuid, $2, $3, 'T', $4::text::jsonb)",
                        self.name
                    ),
                    &[
                        &event_id(*n),
                        &self.aggregate(),
                        &format!("k{}", n % 3),
                        &payload.to_string(),
                    ],
                )
                .await?;
            ends.push(current_insert_lsn(&self.client).await?);
        }
        Ok(ends)
    }

    /// What the topic holds now.
    async fn sent(&self) -> Result<Vec<ConsumedRecord>> {
        read_topic_async(
            &self.servers.broker.bootstrap(),
            &self.topic(),
            Duration::from_secs(30),
        )
        .await
    }

    /// Waits until the topic holds `count` records, and returns them.
    async fn records(&self, count: usize, siphon: &SiphonProcess) -> Result<Vec<ConsumedRecord>> {
        wait_for(
            Duration::from_secs(90),
            Duration::from_millis(300),
            || async { Ok(Some(self.sent().await?).filter(|r| r.len() >= count)) },
        )
        .await
        .with_context(|| siphon.log())
    }

    /// The slot's confirmed position.
    async fn confirmed(&self) -> Result<u64> {
        Ok(slot_confirmed_lsn(&self.client, self.name)
            .await?
            .unwrap_or(0))
    }

    /// Checks that `records` are exactly the events `expected` (by number), each once, in
    /// commit order per aggregate, and that Confluent's deserializer decodes each to its
    /// payload.
    fn check_delivered(
        &self,
        records: &[ConsumedRecord],
        expected: &BTreeMap<u64, serde_json::Value>,
    ) -> Result<()> {
        let numbers: Vec<u64> = records.iter().map(number).collect::<Result<_>>()?;
        let mut times: BTreeMap<u64, usize> = BTreeMap::new();
        for n in &numbers {
            *times.entry(*n).or_default() += 1;
        }
        ensure!(
            times.keys().eq(expected.keys()),
            "the events delivered are not those committed: {numbers:?}"
        );
        for (n, count) in &times {
            ensure!(
                *count == 1,
                "event {n} was delivered {count} times: {numbers:?}"
            );
        }
        // `records` are in offset order per partition, and an aggregate has one partition.
        let mut first: BTreeMap<&[u8], u64> = BTreeMap::new();
        let mut delivered = std::collections::BTreeSet::new();
        for (record, n) in records.iter().zip(&numbers) {
            if !delivered.insert(*n) {
                continue;
            }
            let key = record.key.as_deref().unwrap_or_default();
            if let Some(before) = first.insert(key, *n) {
                ensure!(
                    before < *n,
                    "event {n} arrived after {before} of its aggregate"
                );
            }
        }
        let decoded = tokio::task::block_in_place(|| {
            siphon_tests::python::decode_avro(
                &self.servers.python,
                &self.servers.registry.url(),
                &self.topic(),
                records,
                false,
            )
        })?;
        for (d, n) in decoded.iter().zip(&numbers) {
            ensure!(
                d["value"] == expected[n],
                "event {n} decodes to {}, not {}",
                d["value"],
                expected[n]
            );
        }
        Ok(())
    }
}

fn event_id(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// The event number of a record, from its `id` header.
fn number(record: &ConsumedRecord) -> Result<u64> {
    let id = record
        .header("id")
        .context("a record without an id header")?;
    let id = std::str::from_utf8(id)?;
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("id {id:?}"))
}

/// Waits until `siphon` has exited, and returns its status.
async fn exited(siphon: &SiphonProcess) -> Result<std::process::ExitStatus> {
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { Ok(!siphon.is_running()) },
    )
    .await
    .with_context(|| siphon.log())?;
    siphon.wait_exit(Duration::from_secs(1))
}

/// Every answer 2 s late: nothing is lost, and the steady state asks the registry nothing.
async fn slow_registry(servers: Arc<Servers>) -> Result<()> {
    let case = Case::new(&servers, "slow").await?;
    let proxy = RegistryProxy::start(servers.registry.port())?;
    proxy.set(RegistryFault::Delay(Duration::from_secs(2)));
    // The default request timeout (30 s) waits for a slow answer.
    let siphon = case.start(&case.config(&proxy.url(), "")).await?;
    let mut expected: BTreeMap<u64, serde_json::Value> =
        [(1, shape_a(1)), (2, shape_b(2))].into_iter().collect();
    case.commit_each(&[(1, shape_a(1)), (2, shape_b(2))])
        .await?;
    case.records(2, &siphon).await?;
    let warm_up = proxy.count();
    ensure!(
        warm_up == 2,
        "one registration per schema: {:?}",
        proxy.seen()
    );

    // A thousand events of the two known schemas, in one transaction.
    case.client
        .batch_execute(
            "INSERT INTO outbox_slow SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'Slow', 'k' || (g % 3), 'T', \
             CASE WHEN g % 2 = 1 THEN jsonb_build_object('n', g, 'a', 'x') ELSE jsonb_build_object('n', g, 'b', jsonb_build_array(g)) END \
             FROM generate_series(3, 1002) g",
        )
        .await?;
    let end = current_insert_lsn(&case.client).await?;
    for n in 3..=1002 {
        expected.insert(n, if n % 2 == 1 { shape_a(n) } else { shape_b(n) });
    }
    let records = case.records(1002, &siphon).await?;
    wait_for_slot_past(&case.client, "slow", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    ensure!(
        proxy.count() == warm_up,
        "1,000 events of known schemas asked the registry {} times",
        proxy.count() - warm_up
    );
    // Siphon's own count, which it refreshes periodically.
    let metrics = siphon.metrics_address().context("no metrics address")?;
    let port: u16 = metrics.rsplit(':').next().unwrap_or_default().parse()?;
    let requests = |body: &str| {
        siphon_tests::http::metric(body, "siphon_schema_registry_requests_total").unwrap_or(0.0)
    };
    let body = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (_, body) = siphon_tests::http::get(port, "/metrics")?;
            Ok((requests(&body) >= warm_up as f64).then_some(body))
        },
    )
    .await?;
    ensure!(requests(&body) == warm_up as f64, "{body}");
    case.check_delivered(&records, &expected)?;
    ensure!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}

/// How the registry misbehaves during the outage, from its start: answers slower than the
/// request timeout, connections closed, 503, then 500.
const OUTAGE: [(Duration, RegistryFault); 4] = [
    (
        Duration::from_secs(5),
        RegistryFault::Delay(Duration::from_secs(2)),
    ),
    (Duration::from_secs(5), RegistryFault::Down),
    (Duration::from_secs(10), RegistryFault::Status(503)),
    (Duration::from_secs(10), RegistryFault::Status(500)),
];

/// 30 s without an answer mid-stream: the event of a new schema and those after it wait, the
/// slot does not pass them, retries are spaced; then all arrive once, in order.
async fn registry_outage(servers: Arc<Servers>) -> Result<()> {
    let case = Case::new(&servers, "outage").await?;
    let proxy = RegistryProxy::start(servers.registry.port())?;
    let siphon = case
        .start(&case.config(&proxy.url(), "request_timeout_ms = 1000"))
        .await?;
    let expected: BTreeMap<u64, serde_json::Value> = [
        (1, shape_a(1)),
        (2, shape_a(2)),
        (3, shape_b(3)),
        (4, shape_a(4)),
    ]
    .into_iter()
    .collect();
    let case = &case;
    let commit = |numbers: &[u64]| {
        let events: Vec<(u64, serde_json::Value)> =
            numbers.iter().map(|n| (*n, expected[n].clone())).collect();
        async move { case.commit_each(&events).await }
    };
    commit(&[1]).await?;
    case.records(1, &siphon).await?;

    let start = Instant::now();
    proxy.set(OUTAGE[0].1);
    let mut phase = 0;
    let mut next_phase = start + OUTAGE[0].0;
    // A known schema goes on; a new one waits, and so does what follows it.
    commit(&[2]).await?;
    case.records(2, &siphon).await?;
    let held_end = commit(&[3, 4]).await?[0];
    let mut checks = 0;
    loop {
        let now = Instant::now();
        if now >= next_phase {
            phase += 1;
            let Some((length, fault)) = OUTAGE.get(phase) else {
                break;
            };
            proxy.set(*fault);
            next_phase += *length;
        }
        let sent = case.sent().await?;
        ensure!(
            sent.len() == 2,
            "{} records sent during the outage: nothing goes without its schema id",
            sent.len()
        );
        let confirmed = case.confirmed().await?;
        ensure!(
            confirmed < held_end,
            "the slot passed the held event ({confirmed} >= {held_end})"
        );
        checks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    proxy.set(RegistryFault::None);
    let outage = start.elapsed();
    let during: Vec<_> = proxy
        .seen()
        .into_iter()
        .filter(|r| r.at >= start && r.at < start + outage)
        .collect();
    let by_fault = during.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(format!("{:?}", r.fault)).or_insert(0) += 1;
        m
    });
    ensure!(checks >= 20, "only {checks} checks in {outage:?}");
    // Backoff from 0.5 s doubling to 30 s: about seven requests in 30 s.
    ensure!(
        (3..=20).contains(&during.len()),
        "{} requests in {outage:?} ({by_fault:?}): retries are spaced by backoff",
        during.len()
    );
    ensure!(
        by_fault.contains_key("Delay(2s)")
            && (by_fault.contains_key("Status(503)") || by_fault.contains_key("Status(500)")),
        "the retries met the slow registry and the 5xx answers: {by_fault:?}"
    );
    let end = current_insert_lsn(&case.client).await?;
    let records = case.records(4, &siphon).await?;
    wait_for_slot_past(&case.client, "outage", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let recovered = start.elapsed();
    case.check_delivered(&records, &expected)?;
    let log = siphon.log();
    ensure!(
        log.contains("records wait for their schema id") && log.contains("request_timeout_ms"),
        "the warnings say what waits and name the timeout setting: {log}"
    );
    ensure!(siphon.is_running(), "{log}");
    eprintln!("outage {outage:?}, delivered after {recovered:?}, requests {by_fault:?}");
    Ok(())
}

/// The Kafka transaction timeout (`transaction.timeout.ms`) of the exactly-once case, and how
/// long its registry stays down: past the timeout, so the broker would abort a transaction
/// held open for the schema id.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
const EXACTLY_ONCE_OUTAGE: Duration = Duration::from_secs(25);

/// Exactly-once, the registry down past the transaction timeout while a PostgreSQL
/// transaction waits for a new schema's id: the Kafka transaction holding its first event is
/// committed by age, none is aborted, and a read_committed consumer sees each event once.
async fn outage_past_the_transaction_timeout(servers: Arc<Servers>) -> Result<()> {
    let case = Case::new(&servers, "eosoutage").await?;
    let proxy = RegistryProxy::start(servers.registry.port())?;
    let timeout_ms = TRANSACTION_TIMEOUT.as_millis().to_string();
    let config = siphon_tests::outbox::with_exactly_once(
        &case.config(&proxy.url(), "request_timeout_ms = 1000"),
        &servers.broker,
    )
    .replacen(
        "[kafka.properties]\n",
        &format!(
            "[kafka.properties]\n\"message.timeout.ms\" = \"{timeout_ms}\"\n\"transaction.timeout.ms\" = \"{timeout_ms}\"\n"
        ),
        1,
    );
    ensure!(config.contains("transaction.timeout.ms"), "{config}");
    let siphon = case.start(&config).await?;
    let expected: BTreeMap<u64, serde_json::Value> = [
        (1, shape_a(1)),
        (2, shape_a(2)),
        (3, shape_b(3)),
        (4, shape_a(4)),
    ]
    .into_iter()
    .collect();
    case.commit_each(&[(1, expected[&1].clone())]).await?;
    case.records(1, &siphon).await?;

    proxy.set(RegistryFault::Status(503));
    let start = Instant::now();
    // One PostgreSQL transaction: event 2's schema is known, event 3's is new and waits, 4
    // follows it.
    let mut client = servers.pg.connect().await?;
    let txn = client.transaction().await?;
    for n in [2, 3, 4] {
        txn.execute(
            "INSERT INTO outbox_eosoutage VALUES ($1::text::uuid, 'Eosoutage', $2, 'T', $3::text::jsonb)",
            &[&event_id(n), &format!("k{}", n % 3), &expected[&n].to_string()],
        )
        .await?;
    }
    txn.commit().await?;
    let end = current_insert_lsn(&case.client).await?;
    let mut split = false;
    while start.elapsed() < EXACTLY_ONCE_OUTAGE {
        let seen: Vec<u64> = case
            .sent()
            .await?
            .iter()
            .map(number)
            .collect::<Result<_>>()?;
        ensure!(
            seen.iter().all(|n| *n <= 2),
            "a read_committed consumer saw {seen:?} during the outage: events 3 and 4 wait for \
             their schema id"
        );
        split |= seen.contains(&2);
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    // The Kafka transaction holding event 2 was committed inside the PostgreSQL transaction
    // (split by age), so none stayed open for the broker to abort.
    ensure!(
        split,
        "event 2 was not committed during the outage: {}",
        siphon.log()
    );
    proxy.set(RegistryFault::None);
    let records = case.records(4, &siphon).await?;
    wait_for_slot_past(&case.client, "eosoutage", end, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    // Settled: nothing more arrives.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = if case.sent().await?.len() > records.len() {
        case.sent().await?
    } else {
        records
    };
    case.check_delivered(&records, &expected)?;
    let log = siphon.log();
    ensure!(siphon.is_running(), "{log}");
    ensure!(
        !log.contains("Kafka transaction is aborted") && !log.contains("fenced"),
        "no Kafka transaction was aborted: {log}"
    );
    eprintln!(
        "exactly-once outage {EXACTLY_ONCE_OUTAGE:?}, delivered after {:?}",
        start.elapsed()
    );
    Ok(())
}

/// A 401 at start and mid-stream stops Siphon once, naming the credentials' settings; after
/// the fix every event arrives.
async fn refused_credentials(servers: Arc<Servers>) -> Result<()> {
    let case = Case::new(&servers, "auth").await?;
    let proxy = RegistryProxy::start(servers.registry.port())?;
    proxy.set(RegistryFault::Status(401));
    let siphon = case.start(&case.config(&proxy.url(), "")).await?;
    let fix = ["schema_registry.username", "schema_registry.password"];

    // check-config asks the registry, and says what to fix.
    let (ok, said) = tokio::task::block_in_place(|| siphon.command("check-config"))?;
    ensure!(!ok, "check-config passes a 401: {said}");
    ensure!(
        fix.iter().all(|s| said.contains(s)) && said.contains("401"),
        "check-config names the settings: {said}"
    );

    // At start: the first event's schema is refused.
    let before = proxy.count();
    let ends = case.commit_each(&[(1, shape_a(1))]).await?;
    let status = exited(&siphon).await?;
    ensure!(status.code() == Some(2), "{status}: {}", siphon.log());
    let log = siphon.log();
    ensure!(
        fix.iter().all(|s| log.contains(s)),
        "the error names the settings: {log}"
    );
    ensure!(
        proxy.count() - before == 1,
        "a refusal is not retried: {:?}",
        proxy.seen()
    );
    ensure!(case.confirmed().await? < ends[0], "the slot passed event 1");
    ensure!(case.sent().await?.is_empty(), "event 1 was sent");

    // Fixed: event 1 goes, and so does event 2.
    proxy.set(RegistryFault::None);
    siphon.start_again()?;
    case.streaming(&siphon).await?;
    let ends = case.commit_each(&[(2, shape_a(2))]).await?;
    case.records(2, &siphon).await?;
    wait_for_slot_past(&case.client, "auth", ends[0], Duration::from_secs(30))
        .await
        .with_context(|| siphon.log())?;

    // Mid-stream: the known schema goes on; the new one stops Siphon.
    proxy.set(RegistryFault::Status(401));
    let before = proxy.count();
    let ends = case
        .commit_each(&[(3, shape_a(3)), (4, shape_b(4)), (5, shape_a(5))])
        .await?;
    let status = exited(&siphon).await?;
    ensure!(status.code() == Some(2), "{status}: {}", siphon.log());
    ensure!(
        proxy.count() - before == 1,
        "a refusal is not retried: {:?}",
        proxy.seen()
    );
    ensure!(case.confirmed().await? < ends[1], "the slot passed event 4");
    let sent = case.sent().await?;
    ensure!(sent.len() == 3, "events 1 to 3 only: {} sent", sent.len());

    proxy.set(RegistryFault::None);
    siphon.start_again()?;
    wait_for_slot_past(&case.client, "auth", ends[2], Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let records = case.sent().await?;
    let expected = [
        (1, shape_a(1)),
        (2, shape_a(2)),
        (3, shape_a(3)),
        (4, shape_b(4)),
        (5, shape_a(5)),
    ]
    .into_iter()
    .collect();
    // Event 3 was acknowledged before Siphon stopped, and the stop confirmed it: it is not
    // sent again.
    case.check_delivered(&records, &expected)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registry_faults_hold_records_back_or_stop_siphon_and_lose_nothing() -> Result<()> {
    let python = siphon_tests::python::python()?.context(
        "python3 with confluent-kafka is needed to decode Avro (scripts/install-deps.sh installs it)",
    )?;
    let servers = Arc::new(Servers {
        pg: Postgres::start()?,
        broker: Broker::start()?,
        registry: RegistryServer::start()?,
        python,
    });
    let cases = [
        (
            "slow registry",
            tokio::spawn(slow_registry(Arc::clone(&servers))),
        ),
        (
            "outage",
            tokio::spawn(registry_outage(Arc::clone(&servers))),
        ),
        (
            "refused credentials",
            tokio::spawn(refused_credentials(Arc::clone(&servers))),
        ),
        (
            "exactly-once outage past the transaction timeout",
            tokio::spawn(outage_past_the_transaction_timeout(Arc::clone(&servers))),
        ),
    ];
    let mut failures = Vec::new();
    for (name, case) in cases {
        match case.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{name}: {e:#}")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}
