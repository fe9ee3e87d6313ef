//! A partitioned outbox (`PARTITION BY RANGE (created_at)`), cleaned up by detaching and dropping
//! old partitions: every event arrives once, whatever partition it was written to, and a
//! publication that would name the partitions instead of the outbox table stops Siphon with the
//! command that fixes it, before anything is skipped. Published through its root with every
//! operation and REPLICA IDENTITY FULL, its DELETEs (old rows whole, toasted payloads too) are
//! read and skipped without a record.

use anyhow::{Context, Result};
use siphon_tests::http::metric;
use siphon_tests::outbox::{
    self, event, siphon_config, slot_active, slot_confirmed_lsn, wait_for_each_once, Event,
};
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_postgres::{Client, Transaction};

/// Debezium's outbox shape, partitioned by month of `created_at`, with partitions for January
/// to March 2026.
const PARTITIONED_OUTBOX_DDL: &str = "
CREATE TABLE outbox (
    id uuid NOT NULL,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE outbox_2026_02 PARTITION OF outbox FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
CREATE TABLE outbox_2026_03 PARTITION OF outbox FOR VALUES FROM ('2026-03-01') TO ('2026-04-01');
";

/// One transaction inserting `events`, event `i` dated in month `months[i % months.len()]` of
/// 2026.
async fn insert_spread(client: &mut Client, events: &[Event], months: &[u32]) -> Result<()> {
    let tx = client.transaction().await?;
    insert_spread_in(&tx, events, months).await?;
    tx.commit().await?;
    Ok(())
}

/// Inserts `events` in the open transaction `tx`, dated as [`insert_spread`] dates them.
async fn insert_spread_in(tx: &Transaction<'_>, events: &[Event], months: &[u32]) -> Result<()> {
    let stmt = tx
        .prepare(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
             VALUES ($1::text::uuid, $2, $3, 'Event', $4::text::jsonb, $5::text::timestamptz)",
        )
        .await?;
    for (i, e) in events.iter().enumerate() {
        let month = months[i % months.len()];
        let created_at = format!("2026-{month:02}-{:02} 12:00:00+00", 1 + i % 28);
        tx.execute(
            &stmt,
            &[
                &e.id,
                &e.aggregatetype,
                &e.aggregateid,
                &e.payload,
                &created_at,
            ],
        )
        .await?;
    }
    Ok(())
}

async fn start_streaming(pg: &Postgres, broker: &Broker, slot: &str) -> Result<SiphonProcess> {
    let client = pg.connect().await?;
    outbox::start_streaming(&client, &siphon_config(pg, broker, slot, ""), slot).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_in_every_partition_arrive_once_while_partitions_come_and_go() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(PARTITIONED_OUTBOX_DDL).await?;
    let siphon = start_streaming(&pg, &broker, "part").await?;

    let mut written = Vec::new();
    // Rows spread over the three partitions.
    for txn in 0..3u64 {
        let events: Vec<Event> = (1..=30).map(|i| event(txn * 30 + i, true)).collect();
        insert_spread(&mut client, &events, &[1, 2, 3]).await?;
        written.extend(events);
    }
    // A partition attached while streaming (created outside the table, then attached).
    client
        .batch_execute(
            "CREATE TABLE outbox_2026_04 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
             ALTER TABLE outbox ATTACH PARTITION outbox_2026_04 FOR VALUES FROM ('2026-04-01') TO ('2026-05-01');",
        )
        .await?;
    let events: Vec<Event> = (91..=150).map(|s| event(s, true)).collect();
    insert_spread(&mut client, &events, &[1, 2, 3, 4]).await?;
    written.extend(events);
    // The oldest partition detached and dropped right away, whether or not its rows were read.
    client
        .batch_execute(
            "ALTER TABLE outbox DETACH PARTITION outbox_2026_01; DROP TABLE outbox_2026_01;",
        )
        .await?;
    let events: Vec<Event> = (151..=210).map(|s| event(s, true)).collect();
    insert_spread(&mut client, &events, &[2, 3, 4]).await?;
    written.extend(events);

    let expected: BTreeSet<String> = written.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert_eq!(records.len(), 210);
    assert!(siphon.is_running());
    let log = siphon.log();
    assert!(
        !log.contains("pipeline interrupted"),
        "no reconnect was needed:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_publication_naming_partitions_is_refused_with_the_fix() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(PARTITIONED_OUTBOX_DDL).await?;
    // As another tool would have created it: publish_via_partition_root is off.
    client
        .batch_execute("CREATE PUBLICATION legacy_pub FOR TABLE outbox")
        .await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "legacy", ""))?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "a definite error:\n{log}");
    assert!(
        log.contains(r#"ALTER PUBLICATION \"legacy_pub\" SET (publish_via_partition_root = true)"#)
            || log.contains(
                r#"ALTER PUBLICATION "legacy_pub" SET (publish_via_partition_root = true)"#
            ),
        "the error names the fix:\n{log}"
    );
    assert!(
        !log.contains("ADD TABLE"),
        "the table is in the publication; adding it is not the fix:\n{log}"
    );

    // After the fix, the same configuration streams.
    client
        .batch_execute("ALTER PUBLICATION legacy_pub SET (publish_via_partition_root = true)")
        .await?;
    siphon.start_again()?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "legacy").await },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_switched_to_partition_names_while_streaming_stops_and_loses_nothing(
) -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(PARTITIONED_OUTBOX_DDL).await?;
    let siphon = start_streaming(&pg, &broker, "switch").await?;
    let first: Vec<Event> = (1..=10).map(|s| event(s, true)).collect();
    insert_spread(&mut client, &first, &[1, 2]).await?;
    let expected: BTreeSet<String> = first.iter().map(|e| e.id.clone()).collect();
    wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    client
        .batch_execute("ALTER PUBLICATION switch_pub SET (publish_via_partition_root = false)")
        .await?;
    let before: u64 = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await?
        .get::<_, i64>(0) as u64;
    let second: Vec<Event> = (11..=20).map(|s| event(s, true)).collect();
    insert_spread(&mut client, &second, &[3]).await?;

    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "a definite error:\n{log}");
    assert!(
        log.contains("publish_via_partition_root = true"),
        "the error names the fix:\n{log}"
    );
    let confirmed = slot_confirmed_lsn(&client, "switch").await?.unwrap_or(0);
    assert!(
        confirmed <= before,
        "the slot did not move past the rows it could not route ({confirmed} > {before})"
    );

    // The fix, then a restart: the rows written meanwhile are still decoded under the
    // partition's name (the publication as it was when they were written); they are routed as
    // the outbox table's, not skipped.
    client
        .batch_execute("ALTER PUBLICATION switch_pub SET (publish_via_partition_root = true)")
        .await?;
    let third: Vec<Event> = (21..=30).map(|s| event(s, true)).collect();
    insert_spread(&mut client, &third, &[2, 3]).await?;
    siphon.start_again()?;
    let expected: BTreeSet<String> = first
        .iter()
        .chain(&second)
        .chain(&third)
        .map(|e| e.id.clone())
        .collect();
    wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert!(siphon.is_running());
    Ok(())
}

/// A payload of `len` bytes PostgreSQL cannot compress (a JSON string of pseudo-random hex), so
/// it is stored out of line (TOAST).
fn incompressible_payload(seed: u64, len: usize) -> String {
    let mut state = seed | 1;
    let mut hex = String::with_capacity(len + 16);
    while hex.len() < len {
        // xorshift64: a fixed sequence per seed.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        hex.push_str(&format!("{state:016x}"));
    }
    hex.truncate(len);
    format!("{{\"blob\":\"{hex}\"}}")
}

/// The outbox pattern on a partitioned outbox published through its root
/// (`publish_via_partition_root`) with every operation, REPLICA IDENTITY FULL on the table and
/// on all partitions but one (whose DELETEs carry the key only), one partition attached with
/// its columns in another order and a dropped column: every DELETE, its old row whole (a
/// toasted payload too) or the key only, is read and skipped without a record, an UPDATE is
/// skipped as one, every event arrives once and in order per aggregate, nothing reconnects
/// and the slot is confirmed to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_of_a_full_identity_outbox_published_through_its_root_are_skipped() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(PARTITIONED_OUTBOX_DDL).await?;
    client
        .batch_execute(
            "ALTER TABLE outbox REPLICA IDENTITY FULL;
             ALTER TABLE outbox_2026_01 REPLICA IDENTITY FULL;
             ALTER TABLE outbox_2026_02 REPLICA IDENTITY FULL;
             CREATE TABLE outbox_2026_04 (
                 dropped int,
                 created_at timestamptz NOT NULL,
                 payload jsonb,
                 type varchar(255) NOT NULL,
                 aggregateid varchar(255) NOT NULL,
                 aggregatetype varchar(255) NOT NULL,
                 id uuid NOT NULL
             );
             ALTER TABLE outbox_2026_04 DROP COLUMN dropped;
             ALTER TABLE outbox_2026_04 REPLICA IDENTITY FULL;
             ALTER TABLE outbox ATTACH PARTITION outbox_2026_04
                 FOR VALUES FROM ('2026-04-01') TO ('2026-05-01');
             CREATE PUBLICATION fullroot_pub FOR TABLE outbox
                 WITH (publish_via_partition_root = true);",
        )
        .await?;
    let identities: Vec<(String, String)> = client
        .query(
            "SELECT relname::text, relreplident::text FROM pg_class \
             WHERE relname LIKE 'outbox%' AND relkind IN ('r', 'p') ORDER BY relname",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        identities,
        [
            ("outbox", "f"),
            ("outbox_2026_01", "f"),
            ("outbox_2026_02", "f"),
            ("outbox_2026_03", "d"),
            ("outbox_2026_04", "f"),
        ]
        .map(|(t, i)| (t.to_owned(), i.to_owned())),
    );
    let port = siphon_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let siphon = SiphonProcess::start_with(
        &siphon_tests::siphon_bin()?,
        &siphon_config(&pg, &broker, "fullroot", ""),
        &[("SIPHON_METRICS_LISTEN", listen.as_str())],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "fullroot").await },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    let mut written = Vec::new();
    // Four transactions inserting twenty events over the four partitions and deleting them.
    for txn in 0..4u64 {
        let events: Vec<Event> = (1..=20).map(|i| event(txn * 20 + i, true)).collect();
        let tx = client.transaction().await?;
        insert_spread_in(&tx, &events, &[1, 2, 3, 4]).await?;
        let deleted = tx.execute("DELETE FROM outbox", &[]).await?;
        assert_eq!(deleted, 20);
        tx.commit().await?;
        written.extend(events);
    }
    // Eight events with payloads stored out of line, one updated, all deleted afterwards.
    let big: Vec<Event> = (81..=88)
        .map(|seq| Event {
            payload: incompressible_payload(seq, 200_000),
            ..event(seq, true)
        })
        .collect();
    insert_spread(&mut client, &big, &[1, 2, 3, 4]).await?;
    let toasted: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE pg_column_size(payload) < 100000",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(toasted, 0, "the payloads are stored uncompressed");
    client
        .execute(
            "UPDATE outbox SET type = 'Updated' WHERE id = $1::text::uuid",
            &[&big[0].id],
        )
        .await?;
    assert_eq!(client.execute("DELETE FROM outbox", &[]).await?, 8);
    written.extend(big.iter().cloned());

    let expected: BTreeSet<String> = written.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert_eq!(records.len(), 88);
    outbox::check_first_deliveries_in_order(&records)?;
    for e in &big {
        let record = records
            .iter()
            .find(|r| r.header("id") == Some(e.id.as_bytes()))
            .context("big event read")?;
        let value = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default());
        assert!(
            value.contains(&e.payload[10..1000]),
            "the payload of {} arrived whole",
            e.id
        );
    }
    outbox::wait_for_slot_caught_up(&client, "fullroot")
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let (_, body) = siphon_tests::http::get(port, "/metrics")?;
    for (series, value) in [
        ("siphon_events_read_total", 177.0),
        ("siphon_rows_skipped_total{reason=\"delete\"}", 88.0),
        ("siphon_rows_skipped_total{reason=\"update\"}", 1.0),
        ("siphon_transactions_total", 7.0),
        ("siphon_reconnects_total{cause=\"source\"}", 0.0),
    ] {
        assert_eq!(metric(&body, series), Some(value), "{series}\n{body}");
    }
    assert!(siphon.is_running());
    Ok(())
}
