//! The initial snapshot (`source.snapshot = "initial"`): switching from a polling relay whose
//! outbox still holds unpublished rows, with writers committing throughout the switch. Every
//! unpublished row and every new row arrives once (repeats only after a crash), no row that was
//! already published arrives, and a snapshot record is byte for byte the record streaming makes
//! of the same row.

use anyhow::{Context, Result};
use siphon_tests::http::get;
use siphon_tests::outbox::{
    insert_small_then_large_rows, read_event_records, record_id, siphon_config, slot_confirmed_lsn,
    wait_for_all, wait_for_each_once,
};
use siphon_tests::{
    free_port, siphon_bin, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Client;

/// A polling relay's outbox: Debezium's columns, and `published_at`, set by the relay.
const RELAY_OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at timestamptz)";

/// The event id of `seq` (the harness's id scheme).
fn id(seq: i64) -> String {
    format!("00000000-0000-4000-8000-{seq:012}")
}

/// Inserts rows `from ..= to` in one transaction, published (as the relay left them) or not.
async fn insert_rows(client: &Client, from: i64, to: i64, published: bool) -> Result<()> {
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, published_at) \
             SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
                    CASE WHEN g % 3 = 0 THEN 'Customer' ELSE 'Order' END, \
                    CASE WHEN g % 3 = 0 THEN 'customer-' ELSE 'order-' END || (g % 17), 'Event', \
                    jsonb_build_object('seq', g, 'note', 'quote \" backslash \\ zürich 東京 🚀', 'items', jsonb_build_array(1, 2.5, null, true)), \
                    CASE WHEN $3 THEN now() END \
             FROM generate_series($1::bigint, $2::bigint) g",
            &[&from, &to, &published],
        )
        .await
        .context("inserting outbox rows")?;
    Ok(())
}

/// Writers committing small transactions of unpublished rows from `first` on until `stop`:
/// the ids written.
fn spawn_writer(
    client: Client,
    first: i64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<i64>>> {
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut next = first;
        while !stop.load(Ordering::Relaxed) {
            insert_rows(&client, next, next + 4, false).await?;
            written.extend(next..=next + 4);
            next += 5;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        Ok(written)
    })
}

/// The configuration with an initial snapshot of the unpublished rows, `chunk` rows a chunk.
fn snapshot_config(pg: &Postgres, broker: &Broker, slot: &str, chunk: usize) -> String {
    siphon_config(pg, broker, slot, "").replacen(
        "[source]\n",
        &format!(
            "[source]\nsnapshot = \"initial\"\nsnapshot_filter = \"published_at IS NULL\"\nsnapshot_chunk_rows = {chunk}\n"
        ),
        1,
    )
}

async fn setup(pg: &Postgres) -> Result<Client> {
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    // What the relay published already: never sent again.
    insert_rows(&client, 1, 2_000, true).await?;
    // What it has not published yet.
    insert_rows(&client, 10_001, 20_000, false).await?;
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublished_rows_and_new_rows_arrive_once_across_the_switch() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = setup(&pg).await?;
    // Writers commit before, while and after the slot is created and the snapshot is read.
    let stop = Arc::new(AtomicBool::new(false));
    let writers = [
        spawn_writer(pg.connect().await?, 100_000, Arc::clone(&stop)),
        spawn_writer(pg.connect().await?, 200_000, Arc::clone(&stop)),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let siphon = SiphonProcess::start_with(
        &siphon_bin()?,
        &snapshot_config(&pg, &broker, "switch", 500),
        &[("SIPHON_METRICS_LISTEN", listen.as_str())],
    )?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    // Progress in the metrics and in `siphon status`: the unpublished rows and the writers'
    // rows committed before the slot's consistent point.
    let (_, metrics) = get(port, "/metrics")?;
    let sent: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("siphon_transfer_rows_sent_total{kind=\"snapshot\"} "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| metrics.clone())?;
    assert!(sent >= 10_000, "{metrics}");
    assert!(
        metrics.contains("siphon_transfer_active{kind=\"snapshot\"} 0"),
        "{metrics}"
    );
    let (_, status) = siphon.command("status")?;
    assert!(
        status.contains("transfer: snapshot (consistent point")
            && status.contains(&format!("done, {sent} of {sent} rows sent")),
        "{status}"
    );
    // And after streaming started.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut expected: BTreeSet<String> = (10_001..=20_000).map(id).collect();
    for writer in writers {
        expected.extend(writer.await??.into_iter().map(id));
    }
    let records = wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    let published: Vec<String> = records
        .iter()
        .map(record_id)
        .filter(|id| (1..=2_000).map(self::id).any(|p| &p == id))
        .collect();
    assert!(published.is_empty(), "published rows sent: {published:?}");
    let log = siphon.log();
    assert!(
        log.contains("initial snapshot: sending the outbox rows before streaming"),
        "{log}"
    );
    assert!(
        log.contains("snapshot progress"),
        "progress is logged:\n{log}"
    );
    eprintln!(
        "switch: {} unpublished rows and {} new rows, each once",
        10_000,
        expected.len() - 10_000
    );
    // The slot moves on once streaming runs.
    let before = slot_confirmed_lsn(&client, "switch").await?.unwrap_or(0);
    insert_rows(&client, 900_001, 900_010, false).await?;
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(slot_confirmed_lsn(&client, "switch").await?.unwrap_or(0) > before) },
    )
    .await?;
    Ok(())
}

/// The records of `ids`, by id.
fn by_id(
    records: &[ConsumedRecord],
    ids: &BTreeSet<String>,
) -> BTreeMap<String, Vec<ConsumedRecord>> {
    let mut out: BTreeMap<String, Vec<ConsumedRecord>> = BTreeMap::new();
    for r in records {
        let id = record_id(r);
        if ids.contains(&id) {
            out.entry(id).or_default().push(r.clone());
        }
    }
    for list in out.values_mut() {
        list.sort_by_key(|r| (r.partition, r.offset));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_record_is_the_record_streaming_makes_of_the_row() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    insert_rows(&client, 1, 300, false).await?;
    let config = snapshot_config(&pg, &broker, "same_bytes", 64).replace(
        "[pipeline]\n",
        "[format]\nposition_headers = false\n\n[pipeline]\n",
    );
    let siphon = SiphonProcess::start(&config)?;
    let ids: BTreeSet<String> = (1..=300).map(id).collect();
    wait_for_all(&broker, &ids, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    // The same rows again, now through the stream: deleted and inserted as they were.
    client
        .batch_execute(
            "BEGIN; CREATE TEMP TABLE again AS SELECT * FROM outbox; DELETE FROM outbox; \
             INSERT INTO outbox SELECT * FROM again; COMMIT;",
        )
        .await?;
    let records = wait_for_two(&broker, &ids)
        .await
        .with_context(|| siphon.log())?;
    for (id, pair) in by_id(&records, &ids) {
        let (snapshot, streamed) = (&pair[0], &pair[1]);
        assert_eq!(snapshot.topic, streamed.topic, "{id}");
        assert_eq!(snapshot.partition, streamed.partition, "{id}");
        assert_eq!(snapshot.key, streamed.key, "{id}");
        assert_eq!(snapshot.value, streamed.value, "{id}");
        assert_eq!(snapshot.headers, streamed.headers, "{id}");
    }
    Ok(())
}

/// Waits until every id in `ids` arrived twice; returns every record.
async fn wait_for_two(broker: &Broker, ids: &BTreeSet<String>) -> Result<Vec<ConsumedRecord>> {
    siphon_tests::wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let records = read_event_records(broker).await?;
            let twice = by_id(&records, ids)
                .values()
                .filter(|list| list.len() >= 2)
                .count();
            anyhow::ensure!(
                twice == ids.len(),
                "{twice} of {} ids arrived twice",
                ids.len()
            );
            Ok(Some(records))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_interrupted_by_kill_9_is_finished_at_the_next_start() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = setup(&pg).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pg.connect().await?, 100_000, Arc::clone(&stop));
    let siphon = SiphonProcess::start(&snapshot_config(&pg, &broker, "interrupted", 25))?;
    siphon
        .wait_for_log("snapshot progress", Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    siphon.kill9()?;
    // Streaming never started: the slot is still at its consistent point.
    let held = slot_confirmed_lsn(&client, "interrupted").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        slot_confirmed_lsn(&client, "interrupted").await?,
        held,
        "the slot is not confirmed past its consistent point before the snapshot is done"
    );
    siphon.start_again()?;
    siphon
        .wait_for_log(
            "the initial snapshot was interrupted",
            Duration::from_secs(60),
        )
        .await
        .with_context(|| siphon.log())?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut expected: BTreeSet<String> = (10_001..=20_000).map(id).collect();
    expected.extend(writer.await??.into_iter().map(id));
    let records = wait_for_all(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| siphon.log())?;
    let unexpected: BTreeSet<String> = records
        .iter()
        .map(record_id)
        .filter(|id| !expected.contains(id))
        .collect();
    assert!(
        unexpected.is_empty(),
        "rows that were published (or never written) arrived: {unexpected:?}"
    );
    eprintln!(
        "interrupted snapshot: {} rows expected, {} records ({} repeats after the kill)",
        expected.len(),
        records.len(),
        records.len() - expected.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_small_then_large_rows_holds_one_window_in_memory() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    // 16 rows of a few bytes, then 300 of 400 kB (120 MB): the first chunk's row size says
    // nothing of the next chunk's.
    insert_small_then_large_rows(&client, 16, 300, 400_000).await?;
    let config = snapshot_config(&pg, &broker, "large_rows", 1000).replace(
        "[pipeline]\n",
        "[pipeline]\nmax_in_flight_bytes = 8388608\n",
    );
    let siphon = SiphonProcess::start(&config)?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(120))
        .await
        .with_context(|| siphon.log())?;
    let (_, peak) = siphon.memory()?;
    let ids: BTreeSet<String> = (1..=316).map(id).collect();
    wait_for_all(&broker, &ids, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    eprintln!(
        "snapshot of 16 small rows and 300 of 400 kB (chunk_rows 1000, an 8 MiB window): peak RSS {:.1} MB",
        peak as f64 / 1e6
    );
    // A chunk of the window's bytes and the window in flight; the 120 MB would not fit.
    assert!(
        peak < 80_000_000,
        "peak RSS {:.1} MB: the snapshot held more than a window of rows",
        peak as f64 / 1e6
    );
    Ok(())
}

/// Inserts unpublished `Order` rows `from ..= to`, the even ones of event type `Internal`.
async fn insert_with_internal(client: &Client, from: i64, to: i64) -> Result<()> {
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT format('00000000-0000-4000-8000-%s', lpad(g::text, 12, '0'))::uuid, \
                    'Order', 'order-' || g, CASE WHEN g % 2 = 0 THEN 'Internal' ELSE 'Event' END, \
                    jsonb_build_object('seq', g) \
             FROM generate_series($1::bigint, $2::bigint) g",
            &[&from, &to],
        )
        .await
        .context("inserting outbox rows")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_and_a_resend_send_only_what_the_publication_publishes() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(RELAY_OUTBOX_DDL).await?;
    // A row filter (PostgreSQL 15 on): the stream never carries the Internal rows.
    client
        .batch_execute(
            "CREATE PUBLICATION row_filter_pub FOR TABLE outbox \
             WHERE (type <> 'Internal') WITH (publish = 'insert')",
        )
        .await?;
    insert_with_internal(&client, 1, 10).await?;
    let siphon = SiphonProcess::start(&snapshot_config(&pg, &broker, "row_filter", 3))?;
    siphon
        .wait_for_log("snapshot finished", Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    insert_with_internal(&client, 11, 20).await?;
    let published: BTreeSet<String> = (1..=20).filter(|g| g % 2 == 1).map(id).collect();
    wait_for_all(&broker, &published, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    // A re-send of every row of the table.
    let (status, said) = siphon.command_with("resend", &["--table", "public.outbox"])?;
    assert!(status.success(), "{said}");
    let records = wait_until_resent(&broker, &published).await?;
    let sent: BTreeSet<String> = records.iter().map(record_id).collect();
    assert_eq!(
        sent, published,
        "the snapshot, the stream and the re-send sent exactly the published rows"
    );
    Ok(())
}

/// Waits until every id of `ids` was re-sent; returns every record.
async fn wait_until_resent(broker: &Broker, ids: &BTreeSet<String>) -> Result<Vec<ConsumedRecord>> {
    siphon_tests::wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let records = read_event_records(broker).await?;
            let resent: BTreeSet<String> = records
                .iter()
                .filter(|r| r.header("siphon.resend").is_some())
                .map(record_id)
                .collect();
            anyhow::ensure!(ids.is_subset(&resent), "not every row re-sent yet");
            Ok(Some(records))
        },
    )
    .await
}
