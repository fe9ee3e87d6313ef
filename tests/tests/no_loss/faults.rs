//! Real faults: `kill -9` of Siphon, a PostgreSQL restart, a busy database with a quiet outbox,
//! and a server that does not take writes. Every committed event arrives, repeats carry the same
//! id, nothing else arrives.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, event, exactly_once_config, insert_transaction, phantom_ids,
    siphon_config, slot_active, slot_retained_wal, wait_for_all, Event, OUTBOX_DDL,
};
use siphon_tests::{wait_for, wait_until, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;

/// Waits until every committed event arrived, then checks: nothing else arrived, and per
/// aggregate the first delivery of each event is in commit order. Returns the duplicate count.
async fn check_delivery(
    broker: &Broker,
    committed: &[Event],
    siphon: &SiphonProcess,
) -> Result<usize> {
    let expected: BTreeSet<String> = committed.iter().map(|e| e.id.clone()).collect();
    let records = wait_for_all(broker, &expected, Duration::from_secs(180))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let phantom = phantom_ids(&records, &expected);
    assert!(
        phantom.is_empty(),
        "events that were never committed: {phantom:?}"
    );
    check_first_deliveries_in_order(&records)?;
    Ok(records.len() - expected.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_loses_nothing() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "crash", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "crash").await },
    )
    .await?;

    // A writer commits 60 transactions of 25 events while Siphon is killed four times.
    let writer_pg = pg.connect().await?;
    let writer = tokio::spawn(async move {
        let mut client = writer_pg;
        let mut committed = Vec::new();
        for txn in 0..60u64 {
            let events: Vec<Event> = (0..25).map(|i| event(txn * 25 + i + 1, true)).collect();
            insert_transaction(&mut client, &events, true).await?;
            committed.extend(events);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok(committed)
    });
    let pauses = [700u64, 1300, 400, 1900];
    for pause in pauses {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        siphon.kill9()?;
        siphon.start_again()?;
    }
    let committed = writer.await??;
    let duplicates = check_delivery(&broker, &committed, &siphon).await?;
    eprintln!(
        "kill -9 x{}: {} events, 0 lost, 0 phantom, {duplicates} repeated",
        pauses.len(),
        committed.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_stream_is_survived() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "restart", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "restart").await },
    )
    .await?;
    let mut committed = Vec::new();
    for txn in 0..10u64 {
        let events: Vec<Event> = (0..20).map(|i| event(txn * 20 + i + 1, true)).collect();
        insert_transaction(&mut client, &events, true).await?;
        committed.extend(events);
    }
    pg.restart()?;
    let mut client = pg.connect().await?;
    for txn in 10..20u64 {
        let events: Vec<Event> = (0..20).map(|i| event(txn * 20 + i + 1, true)).collect();
        insert_transaction(&mut client, &events, true).await?;
        committed.extend(events);
    }
    check_delivery(&broker, &committed, &siphon).await?;
    let log = siphon.log();
    assert!(
        log.contains("pipeline interrupted; reconnecting"),
        "one line per outage:\n{log}"
    );
    assert!(
        siphon.is_running(),
        "a restart of PostgreSQL is transient: Siphon keeps running"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_outbox_does_not_hold_back_wal_of_a_busy_database() -> Result<()> {
    quiet_outbox_beside_a_busy_database(Delivery::AtLeastOnce).await
}

/// The same with exactly-once delivery: no Kafka transaction is open while the outbox is
/// quiet, and the slot still follows the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_outbox_does_not_hold_back_wal_with_exactly_once_delivery() -> Result<()> {
    quiet_outbox_beside_a_busy_database(Delivery::ExactlyOnce).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    AtLeastOnce,
    ExactlyOnce,
}

/// About 200 MB of WAL from another table while the outbox stays idle: the slot follows the
/// server. Then one outbox event still arrives.
async fn quiet_outbox_beside_a_busy_database(delivery: Delivery) -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE TABLE busy (id bigint PRIMARY KEY, filler text)")
        .await?;
    let config = match delivery {
        Delivery::AtLeastOnce => siphon_config(&pg, &broker, "quiet", ""),
        Delivery::ExactlyOnce => exactly_once_config(&pg, &broker, "quiet"),
    };
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "quiet").await },
    )
    .await?;

    // About 200 MB of WAL from another table while the outbox stays idle.
    let start: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    for batch in 0..4i64 {
        client
            .execute(
                "INSERT INTO busy SELECT g, repeat(md5(g::text), 6) FROM generate_series($1::bigint, $2::bigint) g",
                &[&(batch * 250_000 + 1), &((batch + 1) * 250_000)],
            )
            .await?;
    }
    let written: i64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
            &[&start],
        )
        .await?
        .get(0);
    assert!(
        written > 200_000_000,
        "the load wrote only {written} bytes of WAL"
    );

    // The slot follows the server: what it retains ends up small, not the 200 MB.
    let retained = wait_for(Duration::from_secs(90), Duration::from_secs(1), || async {
        client.batch_execute("CHECKPOINT").await?;
        let retained = slot_retained_wal(&client, "quiet")
            .await?
            .unwrap_or(u64::MAX);
        anyhow::ensure!(
            retained < 32 * 1024 * 1024,
            "slot still retains {retained} bytes"
        );
        Ok(Some(retained))
    })
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    eprintln!("wrote {written} bytes of WAL; the slot retains {retained} ({delivery:?})");

    // Streaming goes on: an event after the quiet stretch arrives.
    let after = event(1, true);
    insert_transaction(&mut client, std::slice::from_ref(&after), true).await?;
    let expected: BTreeSet<String> = [after.id.clone()].into();
    wait_for_all(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_waits_as_a_standby_and_takes_over() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "standby", "");
    let active = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "standby").await },
    )
    .await?;
    let standby = SiphonProcess::start(&config)?;
    standby
        .wait_for_log("waiting to take over", Duration::from_secs(30))
        .await
        .with_context(|| standby.log())?;
    let first: Vec<Event> = (1..=20).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &first, true).await?;
    active.kill9()?;
    let second: Vec<Event> = (21..=40).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &second, true).await?;
    let committed: Vec<Event> = first.into_iter().chain(second).collect();
    check_delivery(&broker, &committed, &standby).await?;
    assert!(standby.is_running());
    Ok(())
}

/// `line` without its terminal colour codes.
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        match (in_code, c) {
            (false, '\u{1b}') => in_code = true,
            (false, c) => plain.push(c),
            (true, 'm') => in_code = false,
            (true, _) => {}
        }
    }
    plain
}

/// When each line of Siphon's log that contains `needle` was written, in seconds of the day
/// (colour codes ignored; the tests run for minutes, so a day boundary is unwrapped).
/// The durations (in seconds) the log lines holding `needle` announce after `field` (as
/// `retry_in=711.78ms` or `retry_in=1.004s`, colour codes left out).
fn log_delays(log: &str, needle: &str, field: &str) -> Result<Vec<f64>> {
    log.lines()
        .filter(|l| l.contains(needle))
        .map(|line| {
            let plain = without_colours(line);
            let value = plain
                .split_once(field)
                .and_then(|(_, rest)| rest.split_ascii_whitespace().next())
                .with_context(|| format!("no {field} in {line:?}"))?;
            let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
                (ms, 1e-3)
            } else if let Some(us) = value.strip_suffix("µs") {
                (us, 1e-6)
            } else if let Some(s) = value.strip_suffix('s') {
                (s, 1.0)
            } else {
                anyhow::bail!("no unit in {value:?}");
            };
            Ok(number
                .parse::<f64>()
                .with_context(|| format!("{value:?}"))?
                * scale)
        })
        .collect()
}

fn log_times(log: &str, needle: &str) -> Result<Vec<f64>> {
    let mut times = Vec::new();
    for line in log.lines().filter(|l| l.contains(needle)) {
        // `2026-12-01T04:06:41.522904Z` first, once colour codes (ESC [ ... m) are left out.
        let plain = without_colours(line);
        let clock = plain
            .split_ascii_whitespace()
            .next()
            .filter(|stamp| stamp.len() == 27 && stamp.ends_with('Z'))
            .and_then(|stamp| stamp.get(11..26))
            .with_context(|| format!("no timestamp in {line:?}"))?;
        let parts: Vec<f64> = clock
            .split(':')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("no timestamp in {line:?}"))?;
        let [h, m, s] = parts[..] else {
            anyhow::bail!("no timestamp in {line:?}");
        };
        let mut seconds = h * 3600.0 + m * 60.0 + s;
        if times.last().is_some_and(|last| seconds < *last) {
            seconds += 86_400.0;
        }
        times.push(seconds);
    }
    Ok(times)
}

/// The only host of `source.url` is read-only (`default_transaction_read_only = on`) and the URL
/// wants a read-write one: Siphon waits, retrying with a backoff that grows, and names the
/// reason each time; once the host takes writes it streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_host_is_retried_with_a_growing_backoff_until_it_takes_writes() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    // This session stays writable to write the outbox and to turn the setting off again.
    // (ALTER SYSTEM runs alone: not in the implicit transaction of several statements.)
    for sql in [
        "SET default_transaction_read_only = off",
        OUTBOX_DDL,
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        client.batch_execute(sql).await?;
    }
    let config = siphon_config(&pg, &broker, "ro", "")
        .replace(
            &pg.url(),
            &format!("{}?target_session_attrs=read-write", pg.url()),
        )
        .replace("max_backoff_secs = 2", "max_backoff_secs = 30");
    let siphon = SiphonProcess::start(&config)?;
    let retry = "pipeline interrupted; reconnecting";
    // Five attempts: the delays 0.5, 1, 2 and 4 s (each up to 50% longer) lie between them.
    wait_until(
        Duration::from_secs(40),
        Duration::from_millis(200),
        || async { Ok(siphon.log().matches(retry).count() >= 5) },
    )
    .await
    .with_context(|| siphon.log())?;
    let log = siphon.log();
    for line in log.lines().filter(|l| l.contains(retry)) {
        assert!(
            line.contains("is not read-write") && line.contains("default_transaction_read_only"),
            "the reason is named on every attempt: {line}"
        );
    }
    let times = log_times(&log, retry)?;
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // Each delay is at least twice the one before less its jitter (at most 50% more), so the
    // announced delays grow; the gaps between attempts also hold the attempts themselves, which
    // a loaded machine stretches, so each is only checked to hold the delay announced before it.
    let delays = log_delays(&log, retry, "retry_in=")?;
    assert!(
        delays.windows(2).all(|d| d[1] > d[0]),
        "the announced delays grow: {delays:?}\n{log}"
    );
    assert!(
        gaps.iter()
            .zip(&delays)
            .all(|(gap, delay)| gap + 0.05 >= *delay),
        "an attempt came before its announced delay: gaps {gaps:?}, delays {delays:?}\n{log}"
    );
    assert!(
        gaps[0] >= 0.4 && gaps[3] >= 3.5,
        "the backoff starts at 0.5 s and doubles: {gaps:?}\n{log}"
    );
    assert!(siphon.is_running(), "{log}");
    assert!(
        !log.contains("streaming"),
        "nothing streamed from a read-only host: {log}"
    );

    client
        .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    // The next attempt comes after a delay of 8 s (up to 12 s), or the one after that.
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let events = [event(1, true)];
    insert_transaction(&mut client, &events, true).await?;
    check_delivery(&broker, &events, &siphon).await?;
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
