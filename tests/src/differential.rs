//! The differential harness: the same outbox rows through Debezium (the [`oracle`]) and
//! through the `siphon` binary, against one PostgreSQL and one broker, compared record by
//! record and byte for byte.
//!
//! Each [`Suite`] is a table of rows and the variants that read it; each [`Variant`] is one
//! router option set and pair of encodings. Every variant gets two slots (one per system)
//! created before the rows are inserted, so both read the same WAL; its topics are named
//! `<namespace><variant>.<aggregate type>` by `route.topic.replacement` (the namespace is the
//! test's on the shared broker), so variants never share a topic. Siphon runs with
//! `pipeline.on_error = "dead-letter"`, so a row it refuses shows up (on `<variant>.dead`)
//! rather than stopping it.
//!
//! Records are paired by their `id` header (the row's primary key). Compared: topic,
//! partition, key, value and headers (names, order, values), and the record timestamp when
//! `table.field.event.timestamp` is set. Masked: the value of `__debezium.context.runId`
//! (random per connector start).
//!
//! # Invariants
//! - A row Debezium's converters refuse (a Connect task would fail on it) may be refused by
//!   Siphon (dead-lettered); every other row must give the same bytes. Anything else is a
//!   [`Difference`].
//!
//! [`oracle`]: crate::oracle

use crate::corpus::{self, Row};
use crate::oracle::{Converter, Oracle, OracleOutput, OracleRecord, OracleRun};
use crate::{list_topics, read_topic, Broker, ConsumedRecord, Postgres, SiphonProcess};
use anyhow::{Context as _, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Partitions of every topic.
pub const PARTITIONS: i32 = 3;

/// The header whose value differs per connector start.
const MASKED_HEADER: &str = "__debezium.context.runId";

/// The Java version the oracle runs on, which Siphon is told to print numbers for:
/// `SIPHON_ORACLE_JAVA_VERSION` (set it with `SIPHON_ORACLE_JAVA`), default 21.
pub fn oracle_java_version() -> u32 {
    std::env::var("SIPHON_ORACLE_JAVA_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(21)
}

/// A table of rows and the variants that read it (only they: each table has a publication of
/// its own).
#[derive(Debug, Clone)]
pub struct Suite<'a> {
    /// The table, in `public`: `outbox` (made by [`corpus::TABLE_DDL`]) or another made like it.
    pub table: &'static str,
    pub rows: &'a [Row],
    pub variants: Vec<Variant>,
    /// For records larger than Kafka's default limit (1 MB): the variants' topics are created
    /// first with `max.message.bytes` of this many bytes, and Siphon's producer takes records
    /// this large.
    pub max_record_bytes: Option<usize>,
    /// Whether `payload_b` and `payload_bin` hold the payload too (as `jsonb` and `bytea`),
    /// for variants that read them; else they are NULL.
    pub payload_copies: bool,
}

impl Suite<'_> {
    fn publication(&self) -> String {
        format!("diff_{}", self.table)
    }
}

/// One router configuration and pair of encodings.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Short name: slot, topic and file prefix (lower-case letters and digits).
    pub name: &'static str,
    pub key: Converter,
    pub value: Converter,
    /// Router options besides the topic replacement and `topic.prefix`.
    pub router: Vec<(&'static str, &'static str)>,
}

impl Variant {
    fn router_options(&self, namespace: &str) -> BTreeMap<String, String> {
        let mut options: BTreeMap<String, String> = self
            .router
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        options.insert(
            "route.topic.replacement".to_owned(),
            format!("{namespace}{}.${{routedByValue}}", self.name),
        );
        options.insert("topic.prefix".to_owned(), "dbz".to_owned());
        options
    }

    /// Whether the record timestamp comes from the rows. Then its topics are created first
    /// (`<variant>.<aggregate type>` for the rows' aggregate types, and `<variant>.dead`), so
    /// it has no `route.topic.regex`; so do variants of a suite with `max_record_bytes`.
    fn compares_timestamps(&self) -> bool {
        self.router
            .iter()
            .any(|(k, _)| *k == "table.field.event.timestamp")
    }

    /// The configuration of the variant's topics when Kafka's defaults do not fit (then the
    /// topics are created first): record timestamps from the rows, which Kafka (4.0 and
    /// later) refuses more than an hour ahead and deletes once older than the retention time;
    /// records larger than 1 MB.
    fn topic_configs(&self, max_record_bytes: Option<usize>) -> Vec<(&'static str, String)> {
        let mut configs = Vec::new();
        if self.compares_timestamps() {
            configs.push(("message.timestamp.after.max.ms", i64::MAX.to_string()));
            configs.push(("retention.ms", "-1".to_owned()));
        }
        if let Some(max) = max_record_bytes {
            configs.push(("max.message.bytes", max.to_string()));
            // A record batch must fit in a log segment.
            configs.push(("segment.bytes", (2 * max).max(16 << 20).to_string()));
        }
        configs
    }

    fn siphon_config(&self, suite: &Suite, pg: &Postgres, broker: &Broker) -> String {
        let mut router = String::new();
        for (k, v) in self.router_options(broker.namespace()) {
            // JSON strings of ASCII text are TOML basic strings.
            let _ = writeln!(
                router,
                "{} = {}",
                serde_json::Value::from(k),
                serde_json::Value::from(v)
            );
        }
        format!(
            r#"
[source]
url = "{url}"
slot = "{name}_s"
publication = "{publication}"
tables = ["public.{table}"]
status_interval_ms = 200

[kafka]
bootstrap_servers = "{bootstrap}"

[kafka.properties]
"message.timeout.ms" = "30000"
{max_bytes}

[kafka.topic_creation]
partitions = {PARTITIONS}
replication_factor = 1

[metrics]
listen = "127.0.0.1:0"

[pipeline]
shutdown_timeout_secs = 20
max_backoff_secs = 2
on_error = "dead-letter"
dead_letter_topic = "{dead}"

[format]
key = "{key}"
value = "{value}"
java_version = {java_version}

[router]
{router}"#,
            url = pg.url(),
            name = self.name,
            publication = suite.publication(),
            table = suite.table,
            max_bytes = suite
                .max_record_bytes
                .map(|b| format!("\"message.max.bytes\" = \"{b}\""))
                .unwrap_or_default(),
            dead = broker.topic(&format!("{}.dead", self.name)),
            bootstrap = broker.bootstrap(),
            key = self.key.siphon_name(),
            value = self.value.siphon_name(),
            java_version = oracle_java_version(),
        )
    }
}

/// One difference between Debezium's record and Siphon's for the same row.
#[derive(Debug, Clone)]
pub struct Difference {
    pub variant: &'static str,
    pub id: String,
    /// What differs (`value`, `key`, `headers`, …).
    pub what: String,
    pub debezium: String,
    pub siphon: String,
}

/// What one differential run found.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: usize,
    pub records_compared: usize,
    /// Rows Debezium's converters refuse, per variant (Siphon refused them too).
    pub refused_by_both: usize,
    pub differences: Vec<Difference>,
}

impl Report {
    /// A readable summary: counts, then the differences grouped by variant and kind (up to
    /// `per_group` examples each).
    pub fn summary(&self, per_group: usize) -> String {
        let mut out = format!(
            "{} rows, {} records compared, {} refused by both, {} differences\n",
            self.rows,
            self.records_compared,
            self.refused_by_both,
            self.differences.len()
        );
        let mut groups: BTreeMap<(&str, &str), Vec<&Difference>> = BTreeMap::new();
        for d in &self.differences {
            groups.entry((d.variant, &d.what)).or_default().push(d);
        }
        for ((variant, what), diffs) in groups {
            let _ = writeln!(out, "== {variant}: {what} ({} rows)", diffs.len());
            for d in diffs.iter().take(per_group) {
                let _ = writeln!(
                    out,
                    "  row {}\n    debezium: {}\n    siphon:   {}",
                    d.id, d.debezium, d.siphon
                );
            }
        }
        out
    }
}

fn show(bytes: &Option<Vec<u8>>) -> String {
    match bytes {
        None => "<null>".to_owned(),
        Some(b) => {
            let text = String::from_utf8_lossy(b);
            let mut s: String = text.chars().take(600).collect();
            if text.chars().count() > 600 {
                s.push('…');
            }
            format!("{s:?}")
        }
    }
}

fn show_headers(headers: &[(String, Option<Vec<u8>>)]) -> String {
    headers
        .iter()
        .map(|(k, v)| format!("{k}={}", show(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn masked(headers: &[(String, Option<Vec<u8>>)]) -> Vec<(String, Option<Vec<u8>>)> {
    headers
        .iter()
        .map(|(k, v)| {
            if k == MASKED_HEADER {
                (k.clone(), v.as_ref().map(|_| b"<masked>".to_vec()))
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect()
}

/// Pairs and compares one variant's records.
fn compare(
    variant: &Variant,
    rows: &[Row],
    oracle: &OracleOutput,
    siphon: &[ConsumedRecord],
    report: &mut Report,
) {
    let mut diff = |id: &str, what: &str, debezium: String, siphon: String| {
        report.differences.push(Difference {
            variant: variant.name,
            id: id.to_owned(),
            what: what.to_owned(),
            debezium,
            siphon,
        });
    };
    let mut by_id: BTreeMap<String, &ConsumedRecord> = BTreeMap::new();
    let mut dead: BTreeMap<String, &ConsumedRecord> = BTreeMap::new();
    for r in siphon {
        if r.topic.ends_with(".dead") {
            // A refused row carries its columns in the value; a record the broker refused
            // keeps its headers, `id` included.
            let id = r
                .value
                .as_deref()
                .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
                .or_else(|| {
                    r.header("id")
                        .map(|id| String::from_utf8_lossy(id).into_owned())
                });
            if let Some(id) = id {
                dead.insert(id, r);
            }
        } else if let Some(id) = r.header("id") {
            by_id.insert(String::from_utf8_lossy(id).into_owned(), r);
        }
    }
    // Every row gives Debezium one record or refusal; a refused UPDATE adds one for its id.
    let mut seen = std::collections::BTreeSet::new();
    for record in &oracle.records {
        let Some(id) = record.id() else {
            diff(
                "?",
                "oracle record without id",
                format!("{record:?}"),
                String::new(),
            );
            continue;
        };
        seen.insert(id.clone());
        match record {
            OracleRecord::Refused { error, .. } => match (dead.get(&id), by_id.get(&id)) {
                (Some(_), _) => report.refused_by_both += 1,
                (None, Some(r)) => diff(
                    &id,
                    "Debezium's converters refuse the record, Siphon wrote one",
                    error.clone(),
                    show(&r.value),
                ),
                (None, None) => diff(&id, "missing in Siphon", error.clone(), String::new()),
            },
            OracleRecord::Produced {
                topic,
                partition,
                timestamp,
                key,
                value,
                headers,
            } => {
                let Some(got) = by_id.get(&id) else {
                    let why = dead
                        .get(&id)
                        .and_then(|d| d.header("siphon.error.message"))
                        .map(|m| String::from_utf8_lossy(m).into_owned())
                        .unwrap_or_else(|| "no record".to_owned());
                    diff(&id, "refused by Siphon only", show(value), why);
                    continue;
                };
                report.records_compared += 1;
                if *topic != got.topic {
                    diff(&id, "topic", topic.clone(), got.topic.clone());
                }
                if *key != got.key {
                    diff(&id, "key", show(key), show(&got.key));
                }
                if *value != got.value {
                    diff(&id, "value", show(value), show(&got.value));
                }
                if masked(headers) != masked(&got.headers) {
                    diff(
                        &id,
                        "headers",
                        show_headers(headers),
                        show_headers(&got.headers),
                    );
                }
                if let Some(p) = partition {
                    if *p != got.partition {
                        diff(&id, "partition", p.to_string(), got.partition.to_string());
                    }
                }
                if variant.compares_timestamps() && *timestamp != got.timestamp {
                    diff(
                        &id,
                        "timestamp",
                        format!("{timestamp:?}"),
                        format!("{:?}", got.timestamp),
                    );
                }
            }
        }
    }
    if seen.len() != rows.len() {
        diff(
            "*",
            "record count",
            format!("{} event ids for {} rows", seen.len(), rows.len()),
            format!("{} records, {} dead letters", by_id.len(), dead.len()),
        );
    }
    for id in by_id.keys().chain(dead.keys()) {
        if !seen.contains(id) {
            diff(id, "extra in Siphon", String::new(), "a record".to_owned());
        }
    }
}

/// Reads every topic of `variant` until `rows` records (dead letters included) are there.
fn read_variant(
    broker: &Broker,
    variant: &Variant,
    rows: usize,
    siphon: &SiphonProcess,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    let deadline = Instant::now() + timeout;
    let prefix = broker.topic(&format!("{}.", variant.name));
    loop {
        let mut all = Vec::new();
        for topic in list_topics(&broker.bootstrap())?
            .into_iter()
            .filter(|t| t.starts_with(&prefix))
        {
            all.extend(read_topic(
                &broker.bootstrap(),
                &topic,
                Duration::from_secs(60),
            )?);
        }
        if all.len() >= rows {
            return Ok(all);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "variant {}: {} of {rows} records after {timeout:?}; siphon log:\n{}",
                variant.name,
                all.len(),
                siphon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Creates `topics` with topic configuration `configs`.
async fn create_topics(
    broker: &Broker,
    topics: &[String],
    configs: &[(&str, String)],
) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .context("creating an admin client")?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| {
            configs.iter().fold(
                NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)),
                |topic, (k, v)| topic.set(k, v),
            )
        })
        .collect();
    for result in admin.create_topics(&new, &AdminOptions::new()).await? {
        if let Err((name, code)) = result {
            anyhow::bail!("creating topic {name}: {code}");
        }
    }
    Ok(())
}

/// Runs each suite's rows through Debezium and Siphon for each of its variants and compares
/// the records. `Ok(None)` when no JDK is installed.
pub async fn run(suites: &[Suite<'_>]) -> Result<Option<Report>> {
    let Some(oracle) = Oracle::locate()? else {
        return Ok(None);
    };
    let variant_count: usize = suites.iter().map(|s| s.variants.len()).sum();
    let pg = Postgres::start()?;
    // Two slots and up to two WAL senders per variant.
    let senders = 2 * variant_count + 10;
    {
        let client = pg.connect().await?;
        for setting in ["max_replication_slots", "max_wal_senders"] {
            client
                .batch_execute(&format!("ALTER SYSTEM SET {setting} = {senders}"))
                .await?;
        }
    }
    pg.restart()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(corpus::TABLE_DDL).await?;
    for suite in suites {
        if suite.table != "outbox" {
            client
                .batch_execute(&format!(
                    "CREATE TABLE {} (LIKE outbox INCLUDING ALL)",
                    suite.table
                ))
                .await?;
        }
        client
            .batch_execute(&format!(
                "CREATE PUBLICATION {} FOR TABLE {}",
                suite.publication(),
                suite.table
            ))
            .await?;
    }
    // Slots after every publication: a slot created while others exist starts from their
    // catalog position, which would be older than a publication created in between.
    for suite in suites {
        for v in &suite.variants {
            for suffix in ["s", "d"] {
                client
                    .execute(
                        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                        &[&format!("{}_{suffix}", v.name)],
                    )
                    .await?;
            }
            let configs = v.topic_configs(suite.max_record_bytes);
            if !configs.is_empty() {
                let aggregates: std::collections::BTreeSet<&str> = suite
                    .rows
                    .iter()
                    .map(|r| r.aggregatetype.as_str())
                    .collect();
                let topics: Vec<String> = aggregates
                    .into_iter()
                    .chain(["dead"])
                    .map(|a| broker.topic(&format!("{}.{a}", v.name)))
                    .collect();
                create_topics(&broker, &topics, &configs).await?;
            }
        }
    }
    let mut change_events = Vec::new();
    for suite in suites {
        let rows = suite.rows;
        corpus::insert_into(&mut client, suite.table, rows, suite.payload_copies).await?;
        // Some UPDATEs and DELETEs of outbox rows: both systems skip them (the UPDATEs with a
        // warning); Debezium's connector also sends a tombstone after each DELETE.
        let changed = rows.len() / 20;
        let updated: Vec<String> = rows.iter().take(changed).map(|r| r.id.clone()).collect();
        let deleted: Vec<String> = rows
            .iter()
            .skip(changed)
            .take(changed)
            .map(|r| r.id.clone())
            .collect();
        client
            .execute(
                &format!(
                    "UPDATE {} SET tenant = 'updated' WHERE id = ANY($1::text[]::uuid[])",
                    suite.table
                ),
                &[&updated],
            )
            .await?;
        client
            .execute(
                &format!(
                    "DELETE FROM {} WHERE id = ANY($1::text[]::uuid[])",
                    suite.table
                ),
                &[&deleted],
            )
            .await?;
        change_events.push(rows.len() + updated.len() + 2 * deleted.len());
    }

    let siphons = suites
        .iter()
        .flat_map(|suite| suite.variants.iter().map(move |v| (suite, v)))
        .map(|(suite, v)| SiphonProcess::start(&v.siphon_config(suite, &pg, &broker)))
        .collect::<Result<Vec<_>>>()?;

    let work = crate::short_tempdir("siphon-diff-")?;
    let runs: Vec<OracleRun> = suites
        .iter()
        .zip(&change_events)
        .flat_map(|(suite, &expected)| {
            let broker = &broker;
            let pg = &pg;
            suite.variants.iter().map(move |v| OracleRun {
                name: v.name.to_owned(),
                pg_port: pg.port(),
                slot: format!("{}_d", v.name),
                publication: suite.publication(),
                table: format!("public.{}", suite.table),
                router: v.router_options(broker.namespace()),
                key: v.key,
                value: v.value,
                expected,
                partitions: PARTITIONS,
            })
        })
        .collect();
    let work_dir = work.path().to_path_buf();
    let outputs = tokio::task::spawn_blocking(move || oracle.run(&work_dir, &runs))
        .await
        .context("oracle task")??;

    let variants: Vec<(&Suite, &Variant)> = suites
        .iter()
        .flat_map(|suite| suite.variants.iter().map(move |v| (suite, v)))
        .collect();
    let mut report = Report {
        rows: suites.iter().map(|s| s.rows.len()).sum(),
        ..Report::default()
    };
    for ((_, variant), output) in variants.iter().zip(&outputs) {
        if let Some(e) = &output.error {
            anyhow::bail!("Debezium run {} failed: {e}", variant.name);
        }
    }
    // Read the variants' topics concurrently: each read waits for its partitions' ends.
    let read: Vec<Result<Vec<ConsumedRecord>>> = std::thread::scope(|scope| {
        let readers: Vec<_> = variants
            .iter()
            .zip(&siphons)
            .map(|((suite, variant), siphon)| {
                let broker = &broker;
                scope.spawn(move || {
                    read_variant(
                        broker,
                        variant,
                        suite.rows.len(),
                        siphon,
                        Duration::from_secs(120),
                    )
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a reader thread panicked")))
            })
            .collect()
    });
    for (((suite, variant), output), records) in variants.iter().zip(&outputs).zip(read) {
        compare(variant, suite.rows, output, &records?, &mut report);
    }
    if crate::keep_dirs() {
        eprintln!(
            "differential: oracle files kept in {}",
            work.keep().display()
        );
    }
    Ok(Some(report))
}
