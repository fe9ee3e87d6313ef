//! The Kafka side slow or gone, the PostgreSQL side unaffected: a broker outage, a full
//! in-flight window and a large backlog through a slow broker keep the replication connection
//! (the same walsender process throughout), deliver everything, and keep Siphon's memory
//! bounded by the window rather than the backlog.
//!
//! The clusters run with a short `wal_sender_timeout` (4 s), so a replication connection that
//! stopped answering keepalives while Siphon waits for Kafka would be ended by the server within
//! the test, and show up as a new walsender PID.

use anyhow::{bail, ensure, Context, Result};
use siphon_tests::http::metric;
use siphon_tests::kafka_protocol::INIT_PRODUCER_ID;
use siphon_tests::outbox::{
    current_insert_lsn, event, insert_transaction, siphon_config, siphon_config_at as config_for,
    slot_confirmed_lsn, start_streaming, wait_for_slot_past, OUTBOX_DDL,
};
use siphon_tests::proxy::{advertised_ports, Direction, ProxiedBroker};
use siphon_tests::{
    create_topic, read_topic_async, strip_ansi, wait_for, wait_until, Broker, ConsumedRecord,
    Postgres, SiphonProcess,
};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// The `wal_sender_timeout` of every cluster here.
const WAL_SENDER_TIMEOUT: Duration = Duration::from_secs(4);

/// The topic of every event written here (aggregate type `Order`).
const ORDERS: &str = "outbox.event.Order";

/// Settings of a broker of the test's own that is killed and started again: after `kill -9` a
/// node registers with its controller again only once its previous run's session has expired
/// (`broker.session.timeout.ms`, 9 s by default), so 3 s (heartbeats every 500 ms, as in the
/// three-node cluster) brings it back in a few seconds rather than a dozen.
const QUICK_REREGISTRATION: [(&str, &str); 2] = [
    ("broker.session.timeout.ms", "3000"),
    ("broker.heartbeat.interval.ms", "500"),
];

/// Creates `topic` (3 partitions, as Siphon would) directly on the broker behind `broker`'s
/// proxy, and waits until every partition has a leader. Siphon's first Produce then finds the
/// partitions ready: the broker's answer to a Produce that reaches a partition before its
/// leader is ready names the broker's own address, which would take the producer past the
/// proxy (and its throttle).
async fn create_topic_behind_proxy(broker: &ProxiedBroker, topic: &str) -> Result<()> {
    create_topic(&broker.broker().bootstrap(), topic, 3).await
}

/// Sets `wal_sender_timeout` to [`WAL_SENDER_TIMEOUT`] and waits until new sessions see it.
async fn short_wal_sender_timeout(pg: &Postgres) -> Result<()> {
    let client = pg.connect().await?;
    let secs = WAL_SENDER_TIMEOUT.as_secs();
    // ALTER SYSTEM cannot run inside a (multi-statement, implicit) transaction block.
    client
        .batch_execute(&format!("ALTER SYSTEM SET wal_sender_timeout = '{secs}s'"))
        .await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    let want = format!("{secs}s");
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let fresh = pg.connect().await?;
            let now: String = fresh
                .query_one("SHOW wal_sender_timeout", &[])
                .await?
                .get(0);
            ensure!(now == want, "wal_sender_timeout is still {now}");
            Ok(true)
        },
    )
    .await
    .context("the new wal_sender_timeout did not take effect")
}

/// The process streaming from a slot, as the server sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Walsender {
    /// `pg_replication_slots.active_pid`, the same as `pg_stat_replication.pid`.
    pid: i32,
    /// `pg_stat_replication.sent_lsn`: how far the server has written WAL to the socket.
    sent_lsn: Option<u64>,
}

async fn walsender(client: &Client, slot: &str) -> Result<Option<Walsender>> {
    let row = client
        .query_opt(
            "SELECT s.active_pid, r.pid, (r.sent_lsn - '0/0'::pg_lsn)::bigint
             FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
             WHERE s.slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let Some(pid) = row.get::<_, Option<i32>>(0) else {
        return Ok(None);
    };
    if let Some(listed) = row.get::<_, Option<i32>>(1) {
        ensure!(
            listed == pid,
            "pg_stat_replication lists {listed}, the slot {pid}"
        );
    }
    Ok(Some(Walsender {
        pid,
        sent_lsn: row.get::<_, Option<i64>>(2).map(|v| v as u64),
    }))
}

/// Server log lines saying a walsender was ended or a replication connection was lost.
fn walsender_terminations(pg: &Postgres) -> Vec<String> {
    std::fs::read_to_string(pg.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("terminating walsender")
                || l.contains("replication timeout")
                || l.contains("connection to client lost")
                || l.contains("unexpected EOF on standby connection")
        })
        .map(str::to_owned)
        .collect()
}

/// Siphon's log lines about a late status update to the server.
fn late_status_updates(siphon: &SiphonProcess) -> Vec<String> {
    siphon
        .log()
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains("status update to the server went out late"))
        .collect()
}

/// Nanoseconds the threads of process `pid` have spent runnable but waiting for a core, in
/// total (the second field of each thread's `schedstat`): what grows while the process is
/// starved of CPU, and not while it waits on its own.
fn run_queue_wait_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// `GET /metrics` from Siphon.
async fn scrape(address: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(address).await?;
    conn.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut response))
        .await
        .context("metrics request timed out")??;
    ensure!(
        response.starts_with("HTTP/1.1 200"),
        "metrics answered {:?}",
        response.lines().next()
    );
    Ok(response)
}

fn id_of(record: &ConsumedRecord) -> String {
    String::from_utf8_lossy(record.header("id").unwrap_or_default()).into_owned()
}

/// Waits until every id in `expected` is in `topic`; returns every record read.
async fn wait_for_ids(
    bootstrap: &str,
    topic: &str,
    expected: &BTreeSet<String>,
    timeout: Duration,
) -> Result<Vec<ConsumedRecord>> {
    wait_for(timeout, Duration::from_millis(500), || async {
        let records = read_topic_async(bootstrap, topic, Duration::from_secs(60)).await?;
        let ids: BTreeSet<String> = records.iter().map(id_of).collect();
        let missing = expected.difference(&ids).count();
        ensure!(
            missing == 0,
            "{missing} of {} events missing ({} records read)",
            expected.len(),
            records.len()
        );
        Ok(Some(records))
    })
    .await
}

/// Commits `count` events numbered `first..first + count` in one transaction that inserts them
/// (`INSERT .. SELECT generate_series`) and deletes them again. Ids encode the number as
/// [`event`]'s do; the aggregate type is `Order`; payloads are jsonb of about 300 bytes.
async fn commit_generated(client: &mut Client, first: i64, count: i64) -> Result<()> {
    commit_generated_with_note(client, first, count, 240).await
}

/// [`commit_generated`] with a payload whose `note` is `note_len` bytes.
async fn commit_generated_with_note(
    client: &mut Client,
    first: i64,
    count: i64,
    note_len: i32,
) -> Result<()> {
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
         SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid,
                'Order', 'order-' || (g % 17), 'OrderPlaced',
                jsonb_build_object('seq', g, 'customer', 'customer-' || (g % 1013),
                                   'note', repeat('x', $3))
         FROM generate_series($1::bigint, $2::bigint) AS g",
        &[&first, &(first + count - 1), &note_len],
    )
    .await?;
    // By id range, through the primary key: `DELETE FROM outbox` would scan every dead row
    // left by earlier transactions, and slow down as the backlog grows.
    let deleted = tx
        .execute(
            "DELETE FROM outbox WHERE id BETWEEN
             ('00000000-0000-4000-8000-' || lpad($1::bigint::text, 12, '0'))::uuid
         AND ('00000000-0000-4000-8000-' || lpad($2::bigint::text, 12, '0'))::uuid",
            &[&first, &(first + count - 1)],
        )
        .await?;
    ensure!(deleted == count as u64, "deleted {deleted} of {count} rows");
    tx.commit().await?;
    Ok(())
}

fn generated_ids(first: i64, count: i64) -> BTreeSet<String> {
    (first..first + count)
        .map(|g| format!("00000000-0000-4000-8000-{g:012}"))
        .collect()
}

/// `VmRSS` and `VmHWM` of a process, in kB.
fn memory_kb(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_reach_the_proxied_broker_only_through_the_proxy() -> Result<()> {
    let broker = ProxiedBroker::start()?;
    let proxy = broker.proxy();
    assert_ne!(proxy.port(), broker.broker_port());
    assert_eq!(
        advertised_ports(&broker.bootstrap(), Duration::from_secs(10))?,
        [proxy.port()],
        "the broker advertises the proxy"
    );
    let topic = broker.topic("through.proxy");
    create_topic(&broker.bootstrap(), &topic, 1).await?;
    let before = proxy.forwarded(Direction::ToServer);
    {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap())
            .create()?;
        let payload = vec![b'p'; 50_000];
        producer
            .send(
                FutureRecord::<str, [u8]>::to(&topic)
                    .key("k")
                    .payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    assert!(
        proxy.forwarded(Direction::ToServer) - before >= 50_000,
        "the record went through the proxy"
    );
    let records = read_topic_async(&broker.bootstrap(), &topic, Duration::from_secs(30)).await?;
    assert_eq!(records.len(), 1);

    // Paused, the proxy cuts clients off the broker: there is no way around it.
    proxy.pause();
    let blocked = advertised_ports(&broker.bootstrap(), Duration::from_secs(2));
    assert!(
        blocked.is_err(),
        "metadata answered through a paused proxy: {blocked:?}"
    );
    proxy.resume();
    advertised_ports(&broker.bootstrap(), Duration::from_secs(10))?;
    Ok(())
}

/// The broker (a Kafka node of the test's own) is killed (SIGKILL) for 11 s (almost three times
/// `wal_sender_timeout`) while the application commits 5 orders. The commits return at once,
/// the replication connection stays (same walsender PID throughout, no reconnect caused by
/// PostgreSQL), and once the broker is back (with its data: the topic and the order delivered
/// before the outage) every order arrives within 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eleven_second_broker_outage_keeps_the_replication_connection() -> Result<()> {
    const SLOT: &str = "outage11";
    const OUTAGE: Duration = Duration::from_secs(11);
    const DELIVERY_BOUND: Duration = Duration::from_secs(60);
    const COMMIT_BOUND: Duration = Duration::from_secs(2);
    let pg = Postgres::start()?;
    short_wal_sender_timeout(&pg).await?;
    let broker = Broker::start_own(&QUICK_REREGISTRATION)?;
    let orders = broker.topic(ORDERS);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    // siphon_config sets message.timeout.ms = 10000: records may time out during the outage and
    // the producer be rebuilt; that must not cost the PostgreSQL connection.
    let siphon = start_streaming(&client, &siphon_config(&pg, &broker, SLOT, ""), SLOT).await?;

    // One order delivered first: the topic exists and the producer is connected.
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let first: BTreeSet<String> = [event(1, true).id].into();
    wait_for_ids(
        &broker.bootstrap(),
        &orders,
        &first,
        Duration::from_secs(60),
    )
    .await?;
    let before = walsender(&client, SLOT)
        .await?
        .context("no walsender streaming")?;

    broker.kill()?;
    let outage_start = Instant::now();
    let mut expected = BTreeSet::new();
    for seq in [2u64, 4, 5, 7, 8] {
        let order = event(seq, true);
        assert_eq!(order.aggregatetype, "Order");
        let started = Instant::now();
        insert_transaction(&mut client, std::slice::from_ref(&order), true).await?;
        let took = started.elapsed();
        assert!(
            took < COMMIT_BOUND,
            "committing order {seq} took {took:?} with the broker down"
        );
        expected.insert(order.id);
    }
    let end_of_orders = current_insert_lsn(&client).await?;

    // Throughout the outage the same walsender streams from the slot.
    let mut samples = 0;
    while outage_start.elapsed() < OUTAGE {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = walsender(&client, SLOT).await?;
        assert_eq!(
            now.map(|w| w.pid),
            Some(before.pid),
            "the replication connection changed {:?} into the broker outage; server log: {:#?}; siphon log:\n{}",
            outage_start.elapsed(),
            walsender_terminations(&pg),
            siphon.log()
        );
        samples += 1;
    }
    assert!(samples >= 30, "only {samples} samples during the outage");

    broker.start_again()?;
    let back = Instant::now();
    let records = wait_for_ids(&broker.bootstrap(), &orders, &expected, DELIVERY_BOUND)
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let delivered_after = back.elapsed();
    let ids: BTreeSet<String> = records.iter().map(id_of).collect();
    let mut allowed = expected.clone();
    allowed.extend(first);
    assert!(
        ids.is_subset(&allowed),
        "unexpected events: {:?}",
        ids.difference(&allowed).collect::<Vec<_>>()
    );
    wait_for_slot_past(&client, SLOT, end_of_orders, Duration::from_secs(30))
        .await
        .context("the slot did not move past the orders after delivery")?;

    let after = walsender(&client, SLOT).await?;
    assert_eq!(
        after.map(|w| w.pid),
        Some(before.pid),
        "the replication connection was replaced; server log: {:#?}",
        walsender_terminations(&pg)
    );
    let log = siphon.log();
    let source_reconnects: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconnecting"))
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("postgres") || l.contains("replication") || l.contains("stalled")
        })
        .collect();
    assert!(
        source_reconnects.is_empty(),
        "reconnects caused by PostgreSQL: {source_reconnects:#?}"
    );
    let address = siphon
        .metrics_address()
        .context("no metrics address in the log")?;
    let metrics = scrape(&address).await?;
    assert_eq!(
        metric(&metrics, "siphon_reconnects_total{cause=\"source\"}"),
        Some(0.0),
        "reconnects caused by PostgreSQL, per the metrics"
    );
    eprintln!(
        "broker down {OUTAGE:?}: 5 orders committed, all delivered {delivered_after:?} after it \
         came back; walsender {} throughout; {} reconnect(s) caused by Kafka",
        before.pid,
        metric(&metrics, "siphon_reconnects_total{cause=\"sink\"}").unwrap_or(f64::NAN)
    );
    Ok(())
}

/// The most bytes the kernel may buffer on a loopback TCP connection: the receiver's
/// `tcp_rmem` maximum (autotuned up to it while the reader keeps up) and the sender's
/// `tcp_wmem` maximum.
fn socket_buffers_max() -> Result<usize> {
    let max_of = |path: &str| -> Result<usize> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        text.split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no maximum in {path}: {text:?}"))
    };
    Ok(max_of("/proc/sys/net/ipv4/tcp_rmem")? + max_of("/proc/sys/net/ipv4/tcp_wmem")?)
}

/// A broker throttled to 3 kB/s behind a window of 50 records, with a backlog of 30,000 events
/// (far more than the window, the replication client's buffer and the socket buffers hold: the
/// payloads are sized from the kernel's socket buffer maxima, which a receive buffer
/// autotuned during the first fast seconds can reach):
/// for three times `wal_sender_timeout` the window stays full, the server is held back (it has
/// not even sent the backlog), and the same walsender streams throughout. Once the throttle is
/// lifted everything arrives, and the slot follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_keeps_answering_keepalives() -> Result<()> {
    const SLOT: &str = "fullwindow";
    const WINDOW: f64 = 50.0;
    const TRANSACTIONS: i64 = 30;
    const PER_TRANSACTION: i64 = 1_000;
    const SLOW_PHASE: Duration = Duration::from_secs(12);
    let pg = Postgres::start()?;
    short_wal_sender_timeout(&pg).await?;
    let broker = ProxiedBroker::start()?;
    let orders = broker.topic(ORDERS);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    create_topic_behind_proxy(&broker, &orders).await?;
    // A long message timeout: the slow phase must fill the window, not time records out.
    let siphon = start_streaming(
        &client,
        &config_for(
            &pg,
            &broker,
            SLOT,
            "\"message.timeout.ms\" = \"300000\"",
            "max_in_flight_records = 50",
        ),
        SLOT,
    )
    .await?;
    let metrics_at = siphon
        .metrics_address()
        .context("no metrics address in the log")?;

    // One event delivered unthrottled: the topic exists and the producer is connected.
    commit_generated(&mut client, 1, 1).await?;
    wait_for_ids(
        &broker.bootstrap(),
        &orders,
        &generated_ids(1, 1),
        Duration::from_secs(60),
    )
    .await?;
    let before = walsender(&client, SLOT)
        .await?
        .context("no walsender streaming")?;

    // Twice what the socket buffers and the read-ahead (at most 4 MiB) can hold, in the
    // payloads' notes (an event is about 170 bytes besides its note).
    let backlog_bytes = 2 * (socket_buffers_max()? + 4 * 1024 * 1024);
    let note_len =
        i32::try_from(backlog_bytes / (TRANSACTIONS * PER_TRANSACTION) as usize)?.max(240);
    broker.proxy().set_rate(Direction::ToServer, Some(3_000));
    for t in 0..TRANSACTIONS {
        commit_generated_with_note(
            &mut client,
            2 + t * PER_TRANSACTION,
            PER_TRANSACTION,
            note_len,
        )
        .await?;
    }
    let end_of_backlog = current_insert_lsn(&client).await?;

    // The slow phase: sample the window and the walsender.
    let slow_start = Instant::now();
    let mut full_since: Option<Instant> = None;
    let mut longest_full = Duration::ZERO;
    let mut samples = Vec::new();
    while slow_start.elapsed() < SLOW_PHASE {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = walsender(&client, SLOT).await?;
        assert_eq!(
            now.map(|w| w.pid),
            Some(before.pid),
            "the replication connection changed {:?} into the slow phase; server log: {:#?}; siphon log:\n{}",
            slow_start.elapsed(),
            walsender_terminations(&pg),
            siphon.log()
        );
        let in_flight = metric(&scrape(&metrics_at).await?, "siphon_in_flight_records")
            .context("no siphon_in_flight_records")?;
        samples.push(in_flight);
        if in_flight >= WINDOW {
            let since = *full_since.get_or_insert_with(Instant::now);
            longest_full = longest_full.max(since.elapsed());
        } else {
            full_since = None;
        }
    }
    let held_back = walsender(&client, SLOT)
        .await?
        .and_then(|w| w.sent_lsn)
        .context("no sent_lsn")?;
    assert!(
        longest_full > 2 * WAL_SENDER_TIMEOUT,
        "the window was full for at most {longest_full:?} in a row (in-flight samples {samples:?})"
    );
    assert!(
        samples.iter().all(|&s| s <= WINDOW),
        "more records in flight than the window allows: {samples:?}"
    );
    assert!(
        held_back < end_of_backlog,
        "the server sent the whole backlog ({held_back:X} >= {end_of_backlog:X}): the \
         replication connection was never held back by the full window"
    );

    // Throttle lifted: everything arrives, on the same connection.
    broker.proxy().set_rate(Direction::ToServer, None);
    let expected = generated_ids(1, 1 + TRANSACTIONS * PER_TRANSACTION);
    let drain_start = Instant::now();
    let records = wait_for_ids(
        &broker.bootstrap(),
        &orders,
        &expected,
        Duration::from_secs(180),
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let drained_in = drain_start.elapsed();
    let ids: BTreeSet<String> = records.iter().map(id_of).collect();
    assert_eq!(ids, expected, "exactly the committed events");
    wait_for_slot_past(&client, SLOT, end_of_backlog, Duration::from_secs(60))
        .await
        .context("the slot did not follow to the end of the backlog")?;
    let after = walsender(&client, SLOT).await?;
    assert_eq!(
        after.map(|w| w.pid),
        Some(before.pid),
        "the replication connection was replaced; server log: {:#?}",
        walsender_terminations(&pg)
    );
    let log = siphon.log();
    assert!(
        !log.contains("reconnecting"),
        "a session ended during backpressure:\n{log}"
    );
    let full = samples.iter().filter(|&&s| s >= WINDOW).count();
    eprintln!(
        "window of 50 full for {longest_full:?} in a row ({full} of {} samples); the server \
         still had {:.1} MB of WAL to send; walsender {} throughout; {} events arrived \
         {drained_in:?} after the throttle was lifted ({} repeats)",
        samples.len(),
        (end_of_backlog - held_back) as f64 / 1e6,
        before.pid,
        expected.len(),
        records.len() - ids.len()
    );
    Ok(())
}

/// Most resident memory a debug build of Siphon may use while draining a backlog with the
/// default window of 10,000 records (`max_in_flight_bytes`, 32 MB, does not bind: these records
/// are about 370 bytes).
///
/// A healthy drain peaks at about 42 MB. An idle debug process is about 30 MB (code,
/// librdkafka's and Tokio's threads and buffers). The window adds 10,000 records held by
/// librdkafka, about 0.7 kB each with its copies and bookkeeping (7 MB), and the replication
/// client reads ahead at most 4,096 events (about 2 MB). 64 MB leaves 50% margin, while a
/// reader that did not stop at the window would fill librdkafka's own queue (100,000 messages)
/// instead: about 104 MB, as with a 200,000-record window.
const RSS_BOUND_MB: f64 = 64.0;

/// How much the peak RSS of the second half of the drain may exceed that of the first half:
/// allocator noise (about 1 MB). A leak of 35 bytes per record would exceed it over the
/// 150,000 records of the second half.
const RSS_GROWTH_MB: f64 = 5.0;

/// One RSS sample of the Siphon process during the drain.
#[derive(Debug, Clone, Copy)]
struct MemorySample {
    at: Duration,
    rss_kb: u64,
    /// Fraction of the drained prefix the slot has confirmed, 0 to 1.
    progress: f64,
}

/// A backlog of transactions of 1,000 events (INSERT+DELETE, ~300-byte payloads) waits behind an
/// existing slot when Siphon starts with the default window (10,000 records) in front of a broker
/// throttled to 2 MB/s. While it drains, Siphon's resident memory is sampled every 200 ms: its
/// peak stays under [`RSS_BOUND_MB`] and it does not grow with progress. The window is seen full
/// (the broker, not Siphon, sets the pace, so memory is measured at its worst), and the same
/// walsender streams throughout.
///
/// Only a prefix is drained: the test stops once the slot has confirmed the end of transaction
/// 300 (300,000 events acknowledged by the broker), which takes about a minute at that rate;
/// the rest of the backlog stays behind the slot (and in the server's socket buffers and
/// Siphon's read buffer), which is the situation the bound is about. That rest is twice what
/// the socket buffers and the read-ahead can hold (about 230 transactions with receive buffers
/// of up to 32 MiB), so the stream never runs dry; more would only take longer to write.
/// Draining everything would take several minutes in a debug build and prove nothing more.
///
/// Named to sort before the other tests here: libtest starts tests in the order of their names,
/// and this one, the longest, then runs beside the others rather than after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_backlog_drains_in_memory_bounded_by_the_window() -> Result<()> {
    const SLOT: &str = "membound";
    const PER_TRANSACTION: i64 = 1_000;
    const DRAINED_TRANSACTIONS: i64 = 300;
    const BROKER_RATE: u64 = 2_000_000;
    // Behind the prefix, twice what the socket buffers and the read-ahead can hold.
    let transactions = DRAINED_TRANSACTIONS + transactions_past_the_buffers(PER_TRANSACTION)?;
    // Slot and publication first: the backlog is behind the slot before Siphon ever runs.
    let (pg, mut client, start_lsn) = outbox_behind_a_new_slot(SLOT).await?;
    let written = Instant::now();
    let mut prefix_end = 0;
    for t in 0..transactions {
        commit_generated(&mut client, 1 + t * PER_TRANSACTION, PER_TRANSACTION).await?;
        if t + 1 == DRAINED_TRANSACTIONS {
            prefix_end = current_insert_lsn(&client).await?;
        }
    }
    let backlog_end = current_insert_lsn(&client).await?;
    let write_time = written.elapsed();

    let broker = ProxiedBroker::start()?;
    create_topic_behind_proxy(&broker, &broker.topic(ORDERS)).await?;
    broker
        .proxy()
        .set_rate(Direction::ToServer, Some(BROKER_RATE));
    // The default window; a long message timeout, so a slow broker is only slow.
    let siphon = SiphonProcess::start(&config_for(
        &pg,
        &broker,
        SLOT,
        "\"message.timeout.ms\" = \"300000\"",
        "",
    ))?;
    let pid = siphon.pid().context("siphon is not running")?;
    let metrics_at = metrics_address(&siphon).await?;
    let mut max_in_flight = 0.0f64;
    let mut streaming_pid = None;

    let drain_start = Instant::now();
    let mut samples = Vec::new();
    // The most Siphon's threads waited for a core between two samples, and when.
    let mut run_queue_wait = run_queue_wait_ns(pid);
    let mut most_starved = (Duration::ZERO, Duration::ZERO);
    loop {
        let (rss_kb, _) =
            memory_kb(pid).with_context(|| format!("siphon exited; log:\n{}", siphon.log()))?;
        let waited = run_queue_wait_ns(pid);
        let starved = Duration::from_nanos(waited.saturating_sub(run_queue_wait));
        run_queue_wait = waited;
        if starved > most_starved.0 {
            most_starved = (starved, drain_start.elapsed());
        }
        let confirmed = slot_confirmed_lsn(&client, SLOT).await?.unwrap_or(0);
        if let Some(now) = walsender(&client, SLOT).await? {
            let first = *streaming_pid.get_or_insert(now.pid);
            assert_eq!(
                now.pid,
                first,
                "the replication connection changed {:?} into the drain; server log: {:#?}; \
                 Siphon's late status updates: {:#?}; at most {:?} of its threads' time waiting \
                 for a core between two samples ({:?} into the drain)",
                drain_start.elapsed(),
                walsender_terminations(&pg),
                late_status_updates(&siphon),
                most_starved.0,
                most_starved.1,
            );
        }
        if let Ok(text) = scrape(&metrics_at).await {
            max_in_flight =
                max_in_flight.max(metric(&text, "siphon_in_flight_records").unwrap_or(0.0));
        }
        let progress =
            (confirmed.saturating_sub(start_lsn)) as f64 / (prefix_end - start_lsn) as f64;
        samples.push(MemorySample {
            at: drain_start.elapsed(),
            rss_kb,
            progress: progress.min(1.0),
        });
        if confirmed >= prefix_end {
            break;
        }
        if drain_start.elapsed() > Duration::from_secs(240) {
            bail!(
                "the slot confirmed only {:.0}% of the prefix in 240 s; siphon log:\n{}",
                progress * 100.0,
                siphon.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drain_time = drain_start.elapsed();
    let (_, hwm_kb) = memory_kb(pid)?;
    let forwarded = broker.proxy().forwarded(Direction::ToServer);

    let peak_mb = |range: std::ops::Range<f64>| {
        samples
            .iter()
            .filter(|s| range.contains(&s.progress))
            .map(|s| s.rss_kb)
            .max()
            .unwrap_or(0) as f64
            / 1024.0
    };
    let first_half = peak_mb(0.0..0.5);
    let second_half = peak_mb(0.5..1.01);
    let hwm_mb = hwm_kb as f64 / 1024.0;
    eprintln!(
        "backlog of {} events ({:.0} MB of WAL) written in {write_time:?}; {} events drained in \
         {drain_time:?} through {BROKER_RATE} B/s ({:.0} MB forwarded); RSS peak {first_half:.1} MB \
         in the first half, {second_half:.1} MB in the second, VmHWM {hwm_mb:.1} MB; {} samples; \
         at most {max_in_flight} records in flight; Siphon's threads waited for a core at most \
         {:?} between two samples",
        transactions * PER_TRANSACTION,
        (backlog_end - start_lsn) as f64 / 1e6,
        DRAINED_TRANSACTIONS * PER_TRANSACTION,
        forwarded as f64 / 1e6,
        samples.len(),
        most_starved.0,
    );
    for line in late_status_updates(&siphon) {
        eprintln!("  {line}");
    }
    for s in samples.iter().step_by(10) {
        eprintln!(
            "  {:>6.1}s  {:>6.1} MB  {:>5.1}%",
            s.at.as_secs_f64(),
            s.rss_kb as f64 / 1024.0,
            s.progress * 100.0
        );
    }

    assert!(
        max_in_flight <= 10_000.0,
        "{max_in_flight} records in flight, more than the default window of 10,000"
    );
    assert!(
        max_in_flight >= 9_000.0,
        "the window never filled (at most {max_in_flight} records in flight): the broker was \
         not the bottleneck, so memory was not measured at a full window"
    );
    let peak = first_half.max(second_half).max(hwm_mb);
    assert!(
        peak <= RSS_BOUND_MB,
        "siphon's resident memory reached {peak:.1} MB, over the {RSS_BOUND_MB} MB bound"
    );
    assert!(
        second_half <= first_half + RSS_GROWTH_MB,
        "resident memory grew with progress: peak {first_half:.1} MB in the first half of the \
         drain, {second_half:.1} MB in the second"
    );

    siphon.terminate()?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert!(status.success(), "siphon exit status {status:?}");
    Ok(())
}

/// The metrics endpoint `siphon` announces in its log, once it did (within 30 s).
async fn metrics_address(siphon: &SiphonProcess) -> Result<String> {
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { Ok(siphon.metrics_address()) },
    )
    .await
    .context("no metrics address in the log")
}

/// A cluster with the outbox table, and a publication and a slot named `slot` on it: what is
/// committed next waits behind the slot. The slot's start position with it.
async fn outbox_behind_a_new_slot(slot: &str) -> Result<(Postgres, Client, u64)> {
    let pg = Postgres::start()?;
    short_wal_sender_timeout(&pg).await?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute(&format!("CREATE PUBLICATION {slot}_pub FOR TABLE outbox"))
        .await?;
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await?;
    let start_lsn = slot_confirmed_lsn(&client, slot)
        .await?
        .context("slot not created")?;
    Ok((pg, client, start_lsn))
}

/// Transactions of `per_transaction` events that hold twice what the socket buffers and the
/// read-ahead (at most 4 MiB) can, at 370 bytes an event (what its record holds; the stream
/// carries at least that): so much that the stream never runs dry while the window is full.
fn transactions_past_the_buffers(per_transaction: i64) -> Result<i64> {
    let bytes = 2 * (socket_buffers_max()? + 4 * 1024 * 1024);
    Ok(i64::try_from(
        bytes.div_ceil(370 * usize::try_from(per_transaction)?),
    )?)
}

/// How long the broker leaves the producer's registration unanswered in
/// [`a_producer_registration_held_with_a_backlog_keeps_memory_bounded`]: librdkafka's request
/// timeout there (`socket.timeout.ms`), after which it connects again and asks again.
const REGISTRATION_HELD: Duration = Duration::from_secs(20);

/// A backlog of transactions of 1,000 events waits behind the slot when Siphon starts, and the
/// broker does not answer the idempotent producer's registration (InitProducerId, held by the
/// proxy) for [`REGISTRATION_HELD`]: librdkafka keeps every record until its producer has an
/// id, so nothing is acknowledged meanwhile. Siphon reads until the window (10,000 records) is
/// full and stops there: its resident memory stays under [`RSS_BOUND_MB`] the whole time (the
/// hold and the drain after it), nothing is confirmed before the registration is answered, and
/// then the slot is confirmed to the backlog's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_registration_held_with_a_backlog_keeps_memory_bounded() -> Result<()> {
    const SLOT: &str = "heldregistration";
    const PER_TRANSACTION: i64 = 1_000;
    // Behind the window, twice what the socket buffers and the read-ahead can hold.
    let transactions = 10 + transactions_past_the_buffers(PER_TRANSACTION)?;
    let (pg, mut client, start_lsn) = outbox_behind_a_new_slot(SLOT).await?;
    for t in 0..transactions {
        commit_generated(&mut client, 1 + t * PER_TRANSACTION, PER_TRANSACTION).await?;
    }
    let backlog_end = current_insert_lsn(&client).await?;

    let broker = ProxiedBroker::start()?;
    create_topic_behind_proxy(&broker, &broker.topic(ORDERS)).await?;
    broker.proxy().hold_next_answer(INIT_PRODUCER_ID);
    // No state topic: its writer, an idempotent producer too, would register first at times,
    // and its registration would be the one held.
    let config = config_for(
        &pg,
        &broker,
        SLOT,
        &format!(
            "\"message.timeout.ms\" = \"300000\"\n\"socket.timeout.ms\" = \"{}\"",
            REGISTRATION_HELD.as_millis()
        ),
        "",
    )
    .replacen("[kafka]\n", "[kafka]\nstate_topic = \"\"\n", 1);
    let siphon = SiphonProcess::start(&config)?;
    let pid = siphon.pid().context("siphon is not running")?;
    let metrics_at = metrics_address(&siphon).await?;

    let started = Instant::now();
    let mut peak_rss_kb = 0;
    // The most records in flight before the first confirmation, and when that came.
    let mut in_flight_while_held = 0.0f64;
    let mut first_confirmed = None;
    loop {
        let (rss_kb, _) =
            memory_kb(pid).with_context(|| format!("siphon exited; log:\n{}", siphon.log()))?;
        peak_rss_kb = peak_rss_kb.max(rss_kb);
        let confirmed = slot_confirmed_lsn(&client, SLOT).await?.unwrap_or(0);
        if confirmed > start_lsn {
            first_confirmed.get_or_insert(started.elapsed());
        } else if let Ok(text) = scrape(&metrics_at).await {
            in_flight_while_held =
                in_flight_while_held.max(metric(&text, "siphon_in_flight_records").unwrap_or(0.0));
        }
        if confirmed >= backlog_end {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(240),
            "the slot reached {confirmed:X} of {backlog_end:X} in 240 s; siphon log:\n{}",
            siphon.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, hwm_kb) = memory_kb(pid)?;
    let peak_mb = peak_rss_kb.max(hwm_kb) as f64 / 1024.0;
    eprintln!(
        "backlog of {} events ({:.0} MB of WAL); registration answers held: {}; first \
         confirmation after {first_confirmed:?}, at most {in_flight_while_held} records in \
         flight before it; drained after {:?}; RSS peak {peak_mb:.1} MB",
        transactions * PER_TRANSACTION,
        (backlog_end - start_lsn) as f64 / 1e6,
        broker.proxy().answers_held(),
        started.elapsed(),
    );
    ensure!(
        broker.proxy().answers_held() >= 1,
        "no registration answer was held: the test proved nothing"
    );
    let first_confirmed = first_confirmed.context("never confirmed")?;
    ensure!(
        first_confirmed >= REGISTRATION_HELD / 2,
        "the slot was confirmed {first_confirmed:?} after the start, before the registration \
         could be answered; siphon log:\n{}",
        siphon.log()
    );
    ensure!(
        (9_000.0..=10_000.0).contains(&in_flight_while_held),
        "{in_flight_while_held} records in flight at most while the registration was held, not \
         the full window of 10,000"
    );
    ensure!(
        peak_mb <= RSS_BOUND_MB,
        "siphon's resident memory reached {peak_mb:.1} MB, over the {RSS_BOUND_MB} MB bound"
    );
    siphon.terminate()?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    ensure!(status.success(), "siphon exit status {status:?}");
    Ok(())
}
