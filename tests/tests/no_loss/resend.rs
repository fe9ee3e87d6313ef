//! `siphon resend`: the rows of a range still in the outbox are sent again (with the
//! `siphon.resend` header) while Siphon streams and writers commit; live events keep flowing
//! (their commit-to-produce p99 during the re-send is printed and bounded), and a re-send
//! killed with `kill -9` finishes when run again.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    read_event_records, record_id, siphon_config, slot_active, wait_for_all,
};
use siphon_tests::{
    siphon_bin, strip_ansi, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Client;

/// An outbox whose rows are kept for a retention period.
const RETAINED_OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp())";

fn id(seq: i64) -> String {
    format!("00000000-0000-4000-8000-{seq:012}")
}

fn seq(record: &ConsumedRecord) -> Option<i64> {
    record_id(record).rsplit('-').next()?.parse().ok()
}

/// Inserts rows `from ..= to` in one transaction; the payload carries `seq` and the insert time
/// in milliseconds (`ts`).
async fn insert_rows(client: &Client, from: i64, to: i64) -> Result<()> {
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
                    CASE WHEN g % 3 = 0 THEN 'Customer' ELSE 'Order' END, \
                    CASE WHEN g % 3 = 0 THEN 'customer-' ELSE 'order-' END || (g % 17), 'Event', \
                    jsonb_build_object('seq', g, 'ts', (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'note', 'zürich \" \\\\ 東京') \
             FROM generate_series($1::bigint, $2::bigint) g",
            &[&from, &to],
        )
        .await
        .context("inserting outbox rows")?;
    Ok(())
}

/// Starts `siphon resend` for the rows with `seq` in `from ..= to`, its output in `log`.
fn start_resend(config: &Path, from: i64, to: i64, rate: u64, log: &Path) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(siphon_bin()?)
        .args(["resend", "--config"])
        .arg(config)
        .args([
            "--table",
            "public.outbox",
            "--where",
            &format!("(payload->>'seq')::bigint BETWEEN {from} AND {to}"),
            "--max-rows-per-second",
            &rate.to_string(),
        ])
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .context("starting siphon resend")
}

/// Waits for `child` to exit (up to `timeout`): whether it succeeded.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "siphon resend still runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_resent(record: &ConsumedRecord) -> bool {
    record.header("siphon.resend").is_some()
}

/// Starts Siphon streaming and commits `history` rows (1 ..= history), waits for them.
async fn streaming_with_history(
    pg: &Postgres,
    broker: &Broker,
    slot: &str,
    history: i64,
) -> Result<(Client, SiphonProcess)> {
    streaming_with(pg, broker, slot, history, "").await
}

/// [`streaming_with_history`] with `source` lines added to `[source]`.
async fn streaming_with(
    pg: &Postgres,
    broker: &Broker,
    slot: &str,
    history: i64,
    source: &str,
) -> Result<(Client, SiphonProcess)> {
    let client = pg.connect().await?;
    client.batch_execute(RETAINED_OUTBOX_DDL).await?;
    let config = siphon_config(pg, broker, slot, "").replacen(
        "[source]\n",
        &format!("[source]\nsnapshot_chunk_rows = 200\n{source}"),
        1,
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, slot).await },
    )
    .await
    .with_context(|| siphon.log())?;
    for start in (1..=history).step_by(1000) {
        insert_rows(&client, start, (start + 999).min(history)).await?;
    }
    let expected: BTreeSet<String> = (1..=history).map(id).collect();
    wait_for_all(broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    Ok((client, siphon))
}

/// The records re-sent, by seq.
fn resent_by_seq(records: &[ConsumedRecord]) -> BTreeMap<i64, usize> {
    let mut out = BTreeMap::new();
    for r in records.iter().filter(|r| is_resent(r)) {
        if let Some(s) = seq(r) {
            *out.entry(s).or_default() += 1;
        }
    }
    out
}

/// Waits until every seq in `range` was re-sent; returns every record.
async fn wait_for_resent(
    broker: &Broker,
    range: std::ops::RangeInclusive<i64>,
) -> Result<Vec<ConsumedRecord>> {
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let records = read_event_records(broker).await?;
            let resent = resent_by_seq(&records);
            let missing = range.clone().filter(|s| !resent.contains_key(s)).count();
            anyhow::ensure!(missing == 0, "{missing} rows of the range not re-sent");
            Ok(Some(records))
        },
    )
    .await
}

/// A writer committing live events (3 rows every 20 ms, from seq 100,000) until `stop`: the
/// seqs written.
fn spawn_writer(
    client: Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<i64>>> {
    tokio::spawn(async move {
        let mut next = 100_000i64;
        let mut written = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            insert_rows(&client, next, next + 2).await?;
            written.extend(next..=next + 2);
            next += 3;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(written)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_while_writers_run_sends_the_range_and_live_events_keep_flowing() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let (_client, siphon) = streaming_with_history(&pg, &broker, "resend_live", 10_000).await?;
    // Live writers during the re-send.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pg.connect().await?, Arc::clone(&stop));
    let log = siphon.dir().join("resend.log");
    let started = std::time::Instant::now();
    let mut resend = start_resend(&siphon.config_path(), 2_001, 8_000, 1_500, &log)?;
    let finished = wait_exit(&mut resend, Duration::from_secs(90)).await;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(finished?, "siphon resend failed:\n{said}");
    assert!(said.contains("re-sent 6000 rows"), "{said}");
    assert!(
        said.contains("resend progress"),
        "progress is logged:\n{said}"
    );
    let live: BTreeSet<String> = writer.await??.into_iter().map(id).collect();
    wait_for_all(&broker, &live, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let records = wait_for_resent(&broker, 2_001..=8_000).await?;
    // Only the range, each once (no crash), with the record streaming made.
    let resent = resent_by_seq(&records);
    assert_eq!(resent.len(), 6_000);
    assert!(resent.keys().all(|s| (2_001..=8_000).contains(s)));
    assert!(resent.values().all(|n| *n == 1), "a row was re-sent twice");
    let originals: BTreeMap<String, &ConsumedRecord> = records
        .iter()
        .filter(|r| !is_resent(r))
        .map(|r| (record_id(r), r))
        .collect();
    for again in records.iter().filter(|r| is_resent(r)) {
        let original = originals[&record_id(again)];
        assert_eq!(again.topic, original.topic);
        assert_eq!(again.key, original.key);
        assert_eq!(again.value, original.value);
        let headers: Vec<_> = again
            .headers
            .iter()
            .filter(|(name, _)| name != "siphon.resend")
            .cloned()
            .collect();
        assert_eq!(headers, original.headers);
    }
    // Live events: each once, and their commit-to-produce latency while the re-send ran.
    let mut latencies: Vec<i64> = records
        .iter()
        .filter(|r| !is_resent(r) && live.contains(&record_id(r)))
        .filter_map(|r| {
            let value: serde_json::Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
            let payload: serde_json::Value = match value {
                serde_json::Value::String(text) => serde_json::from_str(&text).ok()?,
                other => other,
            };
            Some(r.timestamp? - payload.get("ts")?.as_i64()?)
        })
        .collect();
    assert_eq!(latencies.len(), live.len(), "each live event once");
    latencies.sort_unstable();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    let p50 = latencies[latencies.len() / 2];
    eprintln!(
        "re-send of 6000 rows in {took:?} while {} live events were written: live commit-to-produce p50 {p50} ms, p99 {p99} ms",
        live.len()
    );
    assert!(p99 < 2_000, "live events held up: p99 {p99} ms");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_killed_with_kill_9_finishes_when_run_again() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let (client, siphon) = streaming_with_history(&pg, &broker, "resend_kill", 10_000).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pg.connect().await?, Arc::clone(&stop));
    let log = siphon.dir().join("resend.log");
    let mut resend = start_resend(&siphon.config_path(), 1, 10_000, 1_500, &log)?;
    // Killed once it recorded progress: a progress line is logged as its write starts, and
    // the next one waits for that write.
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            anyhow::ensure!(
                said.matches("resend progress").count() >= 2,
                "no progress recorded yet"
            );
            Ok(Some(()))
        },
    )
    .await?;
    resend.kill()?;
    resend.wait()?;
    // Writers keep going meanwhile.
    insert_rows(&client, 50_001, 50_100).await?;
    let mut again = start_resend(&siphon.config_path(), 1, 10_000, 0, &log)?;
    let finished = wait_exit(&mut again, Duration::from_secs(90)).await;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(finished?, "siphon resend failed:\n{said}");
    assert!(
        said.contains("resuming the unfinished re-send"),
        "resumed, not started over:\n{said}"
    );
    // The second run sent only what the first had not recorded as acknowledged.
    let second: u64 = said
        .split("re-sent ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .context("the second run says how many rows it sent")?;
    assert!(
        second > 0 && second < 10_000,
        "resumed after the last acknowledged chunk, not from the start: the second run sent {second} rows"
    );
    stop.store(true, Ordering::Relaxed);
    let live: BTreeSet<String> = writer.await??.into_iter().map(id).collect();
    wait_for_all(&broker, &live, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let records = wait_for_resent(&broker, 1..=10_000).await?;
    // The live events, streamed by the running Siphon meanwhile: each once, none re-sent.
    let mut live_counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| live.contains(&record_id(r))) {
        assert!(!is_resent(r), "a live event was re-sent");
        *live_counts.entry(record_id(r)).or_default() += 1;
    }
    assert!(
        live_counts.values().all(|n| *n == 1),
        "a live event arrived twice"
    );
    let resent = resent_by_seq(&records);
    let repeats: usize = resent.values().map(|n| n - 1).sum();
    assert!(resent.keys().all(|s| (1..=10_000).contains(s)));
    eprintln!(
        "re-send killed with kill -9 and run again while {} live events were written: 10000 rows, {second} sent by the second run, {repeats} sent twice",
        live.len()
    );
    // `siphon status` shows it done.
    let (_, status) = siphon.command("status")?;
    assert!(
        status.contains("transfer: resend public.outbox") && status.contains("done, "),
        "{status}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_row_asks_the_running_siphon_for_a_resend() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    // Debezium's signalling table.
    pg.connect()
        .await?
        .batch_execute(
            "CREATE TABLE siphon_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
        )
        .await?;
    let (client, siphon) = streaming_with(
        &pg,
        &broker,
        "resend_signal",
        1_000,
        "signal_table = \"public.siphon_signal\"\n",
    )
    .await?;
    client
        .execute(
            "INSERT INTO siphon_signal (id, type, data) VALUES ('replay-1', 'execute-snapshot', $1)",
            &[&r#"{"data-collections": ["public.outbox"], "type": "incremental",
                  "additional-conditions": [{"data-collection": "public.outbox",
                    "filter": "(payload->>'seq')::bigint BETWEEN 101 AND 600"}]}"#],
        )
        .await?;
    let records = wait_for_resent(&broker, 101..=600)
        .await
        .with_context(|| siphon.log())?;
    let resent = resent_by_seq(&records);
    assert!(
        resent.keys().all(|s| (101..=600).contains(s)),
        "only the range"
    );
    // The row is removed once done.
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            Ok(client
                .query_opt("SELECT 1 FROM siphon_signal WHERE id = 'replay-1'", &[])
                .await?
                .is_none())
        },
    )
    .await
    .with_context(|| siphon.log())?;
    let log = siphon.log();
    assert!(log.contains("re-send requested by a signal row"), "{log}");
    assert!(log.contains("re-send of the signal done"), "{log}");
    Ok(())
}

/// Creates Debezium's signalling table.
async fn create_signal_table(client: &Client) -> Result<()> {
    client
        .batch_execute(
            "CREATE TABLE siphon_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
        )
        .await?;
    Ok(())
}

/// Inserts an `execute-snapshot` signal row `id` for `public.outbox` with `filter`.
async fn insert_signal(client: &Client, id: &str, filter: &str) -> Result<()> {
    let data = serde_json::json!({
        "data-collections": ["public.outbox"],
        "additional-conditions": [{"data-collection": "public.outbox", "filter": filter}],
    })
    .to_string();
    client
        .execute(
            "INSERT INTO siphon_signal (id, type, data) VALUES ($1, 'execute-snapshot', $2)",
            &[&id, &data],
        )
        .await?;
    Ok(())
}

/// Waits until signal row `id` is gone.
async fn wait_signal_removed(client: &Client, siphon: &SiphonProcess, id: &str) -> Result<()> {
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            Ok(client
                .query_opt("SELECT 1 FROM siphon_signal WHERE id = $1", &[&id])
                .await?
                .is_none())
        },
    )
    .await
    .with_context(|| siphon.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_row_or_a_where_cannot_run_sql_of_its_own() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let admin = pg.connect().await?;
    create_signal_table(&admin).await?;
    // A slot of another consumer, which the injected SQL would drop.
    admin
        .batch_execute(
            "SELECT pg_create_logical_replication_slot('other_consumer', 'pgoutput'); \
             CREATE SEQUENCE side_effects",
        )
        .await?;
    let (client, siphon) = streaming_with(
        &pg,
        &broker,
        "resend_injection",
        20,
        "signal_table = \"public.siphon_signal\"\n",
    )
    .await?;
    // Closing the parenthesis to run statements of the writer's choosing.
    insert_signal(
        &client,
        "inject-1",
        "true); CREATE TABLE injected (x int); SELECT pg_drop_replication_slot('other_consumer'); SELECT (true",
    )
    .await?;
    // One expression, but a call a signal row may not make.
    insert_signal(
        &client,
        "inject-2",
        "pg_drop_replication_slot('other_consumer') IS NULL",
    )
    .await?;
    // A request that is allowed, after them: the watcher went on.
    insert_signal(
        &client,
        "inject-3",
        "(payload->>'seq')::bigint BETWEEN 5 AND 7",
    )
    .await?;
    wait_signal_removed(&client, &siphon, "inject-3").await?;
    let records = wait_for_resent(&broker, 5..=7).await?;
    let resent = resent_by_seq(&records);
    assert!(resent.keys().all(|s| (5..=7).contains(s)), "{resent:?}");
    let injected: Option<String> = admin
        .query_one("SELECT to_regclass('public.injected')::text", &[])
        .await?
        .get(0);
    assert_eq!(injected, None, "the signal row's SQL created a table");
    let other = admin
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'other_consumer'",
            &[],
        )
        .await?;
    assert!(other.is_some(), "the signal row's SQL dropped a slot");
    let log = siphon.log();
    assert!(
        log.contains("signal inject-1") && log.contains("not one SQL expression"),
        "{log}"
    );
    assert!(
        log.contains("signal inject-2") && log.contains("pg_drop_replication_slot"),
        "{log}"
    );
    assert!(siphon.is_running(), "{log}");

    // The command line: the same check, and transfers only read (nextval writes).
    for (condition, says) in [
        (
            "true); CREATE TABLE injected (x int); SELECT (true",
            "not one SQL expression",
        ),
        ("nextval('side_effects') > 0", "read-only transaction"),
    ] {
        let (status, said) = siphon.command_with(
            "resend",
            &["--table", "public.outbox", "--where", condition],
        )?;
        assert_eq!(status.code(), Some(2), "{condition}: {said}");
        assert!(said.contains(says), "{condition}: {said}");
    }
    let injected: Option<String> = admin
        .query_one("SELECT to_regclass('public.injected')::text", &[])
        .await?
        .get(0);
    assert_eq!(injected, None, "--where's SQL created a table");
    let used: bool = admin
        .query_one("SELECT is_called FROM side_effects", &[])
        .await?
        .get(0);
    assert!(!used, "a re-send wrote (nextval ran)");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_resend_of_small_then_large_rows_holds_one_window_in_memory() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(RETAINED_OUTBOX_DDL).await?;
    create_signal_table(&client).await?;
    // Written before Siphon's slot exists: only the re-send sends them.
    siphon_tests::outbox::insert_small_then_large_rows(&client, 16, 300, 400_000).await?;
    let config = siphon_config(&pg, &broker, "resend_memory", "").replacen(
        "[source]\n",
        "[source]\nsignal_table = \"public.siphon_signal\"\n",
        1,
    );
    let config = config.replace(
        "[pipeline]\n",
        "[pipeline]\nmax_in_flight_bytes = 8388608\n",
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "resend_memory").await },
    )
    .await
    .with_context(|| siphon.log())?;
    insert_signal(&client, "all", "aggregatetype = 'Order'").await?;
    wait_signal_removed(&client, &siphon, "all").await?;
    let (_, peak) = siphon.memory()?;
    let records = wait_for_resent(&broker, 1..=316).await?;
    assert_eq!(resent_by_seq(&records).len(), 316);
    eprintln!(
        "re-send of 16 small rows and 300 of 400 kB (an 8 MiB window): peak RSS {:.1} MB",
        peak as f64 / 1e6
    );
    assert!(
        peak < 80_000_000,
        "peak RSS {:.1} MB: the re-send held more than a window of rows",
        peak as f64 / 1e6
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_at_a_rate_sends_no_more_rows_in_any_second() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    // Chunks of 200 rows: a chunk sent at once would put 200 rows in one second.
    let (_client, siphon) = streaming_with_history(&pg, &broker, "resend_rate", 300).await?;
    let log = siphon.dir().join("resend.log");
    let mut resend = start_resend(&siphon.config_path(), 1, 300, 100, &log)?;
    let finished = wait_exit(&mut resend, Duration::from_secs(60)).await;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(finished?, "siphon resend failed:\n{said}");
    let records = wait_for_resent(&broker, 1..=300).await?;
    let mut handed: Vec<i64> = records
        .iter()
        .filter(|r| is_resent(r))
        .filter_map(|r| r.timestamp)
        .collect();
    handed.sort_unstable();
    assert_eq!(handed.len(), 300, "each row re-sent once, with its time");
    let busiest = (0..handed.len())
        .map(|i| {
            handed[i..]
                .iter()
                .take_while(|t| **t < handed[i] + 1_000)
                .count()
        })
        .max()
        .unwrap_or(0);
    let spread = handed[handed.len() - 1] - handed[0];
    eprintln!("re-send of 300 rows at 100 rows/s: {busiest} rows in the busiest second, {spread} ms from first to last");
    assert!(busiest <= 110, "{busiest} rows in one second at 100 rows/s");
    assert!(spread >= 2_500, "300 rows at 100 rows/s took {spread} ms");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_without_a_free_replication_connection_says_so_and_waits() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    // One replication connection: the stream's.
    pg.connect()
        .await?
        .batch_execute("ALTER SYSTEM SET max_wal_senders = 1")
        .await?;
    pg.restart()?;
    let (_client, siphon) = streaming_with_history(&pg, &broker, "resend_senders", 30).await?;
    let log = siphon.dir().join("resend.log");
    let mut resend = start_resend(&siphon.config_path(), 1, 30, 0, &log)?;
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let said = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
            anyhow::ensure!(
                said.matches("PostgreSQL has no free connection").count() >= 2,
                "not said twice yet"
            );
            Ok(Some(said))
        },
    )
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())
    .and_then(|said| {
        anyhow::ensure!(said.contains("raise max_wal_senders"), "{said}");
        Ok(())
    })?;
    assert!(resend.try_wait()?.is_none(), "the re-send gave up");
    // The stream's connection freed: the re-send goes on by itself.
    siphon.terminate()?;
    let finished = wait_exit(&mut resend, Duration::from_secs(90)).await;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(finished?, "siphon resend failed:\n{said}");
    wait_for_resent(&broker, 1..=30).await?;
    Ok(())
}
