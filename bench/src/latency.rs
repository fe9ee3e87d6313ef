//! Commit-to-ack latency under a steady load: Siphon's own histogram, an independent
//! end-to-end measure (COMMIT returned at the writer -> record polled by a consumer), and the
//! broker's own produce latency over the same seconds (a probe producer, [`super::probe`]).
//!
//! The phase runs with either delivery mode ([`Plan::sink`]). Its consumer reads
//! `isolation.level=read_committed`: with exactly-once a record reaches it only once its Kafka
//! transaction commits (up to `kafka.transaction_interval_ms`,
//! [`drain::EOS_TRANSACTION_INTERVAL_MS`], after the transaction opened, plus the commit), and
//! the end-to-end figures include that wait by design; Siphon's histogram times each record to
//! its delivery report, inside the open transaction.

use super::drain;
use super::gc_log::{self, GcPauses};
use super::pressure::{self, Stalls};
use super::probe::{Probe, ProbeStats};
use super::procstat::{self, Usage};
use super::promhist;
use super::services::Services;
use super::workload;
use anyhow::{anyhow, bail, Context as _, Result};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Siphon's histogram of each record's commit -> acknowledgement.
const HISTOGRAM: &str = "siphon_commit_to_ack_seconds";
/// Siphon's histogram of each transaction's commit -> its BEGIN read by the session.
const READ_HISTOGRAM: &str = "siphon_commit_to_read_seconds";
/// Siphon's histogram of each record's hand-over to the producer -> acknowledgement.
const SEND_HISTOGRAM: &str = "siphon_send_to_ack_seconds";
/// The producer's latencies per broker and stage over its last statistics interval.
const KAFKA_LATENCY: &str = "siphon_kafka_latency_seconds";
/// The series of [`KAFKA_LATENCY`] sampled, in the order a record passes the stages: (stage,
/// quantile, name in the report and the JSON).
pub const PRODUCER_SERIES: [(&str, &str, &str); 4] = [
    ("partition_queue", "0.99", "partition_queue_p99"),
    ("request_queue", "0.99", "request_queue_p99"),
    ("round_trip", "0.99", "round_trip_p99"),
    ("round_trip", "1", "round_trip_max"),
];
/// Sequence numbers of warm-up events start here (never reached by measured events).
const WARMUP_BASE: u64 = 900_000_000_000;
/// Warm-up events (each with a key of its own, so they spread over the topic's partitions).
const WARMUP_EVENTS: u64 = 20;

pub struct Plan {
    pub secs: u64,
    pub rate: u64,
    pub txn_events: u64,
    pub writers: u64,
    /// [`drain::Sink::Kafka`] or [`drain::Sink::KafkaExactlyOnce`].
    pub sink: drain::Sink,
}

/// p50/p90/p95/p99/p99.9/max in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[derive(Debug, Clone)]
pub struct Latency {
    /// Where Siphon sent the records (its delivery mode).
    pub sink: drain::Sink,
    /// The planned rate (events per second).
    pub rate: u64,
    pub events_written: u64,
    pub write_secs: f64,
    /// Siphon's histogram, bucket-interpolated; `max` is the upper bound of the last bucket.
    pub histogram: Option<Quantiles>,
    pub histogram_count: f64,
    /// Siphon's histogram of each transaction's commit -> BEGIN read (PostgreSQL's share of
    /// the above, and the read-ahead's), bucket-interpolated as `histogram`.
    pub read_histogram: Option<Quantiles>,
    pub read_histogram_count: f64,
    /// Siphon's histogram of each record's hand-over to the producer -> acknowledgement (the
    /// producer's and the broker's share), bucket-interpolated as `histogram`.
    pub send_histogram: Option<Quantiles>,
    pub send_histogram_count: f64,
    /// COMMIT returned -> consumer received, exact over the received records.
    pub end_to_end: Option<Quantiles>,
    pub received: u64,
    /// End-to-end (p50, max) per second of the run, by commit time.
    pub per_second: Vec<(f64, f64)>,
    pub usage: Usage,
    /// The probe producer's send -> ack latency during the writes, or why it is missing.
    pub probe: std::result::Result<ProbeStats, String>,
    /// Each of [`PRODUCER_SERIES`] (seconds, the largest over brokers) in each statistics
    /// interval of Siphon's producer that ended during the writes.
    pub producer_windows: [Vec<f64>; 4],
    /// The bench's own broker's GC pauses during the writes (None for another broker).
    pub broker_gc: Option<GcPauses>,
    /// The machine's CPU and I/O stalls during the writes.
    pub stalls: Stalls,
}

/// Each of [`PRODUCER_SERIES`] in a scrape (the largest over brokers; 0 if none).
fn producer_p99s(metrics: &str) -> [f64; 4] {
    PRODUCER_SERIES.map(|(stage, quantile, _)| {
        let labels = format!("stage=\"{stage}\",quantile=\"{quantile}\"}}");
        metrics
            .lines()
            .filter(|l| l.starts_with(KAFKA_LATENCY) && l.contains(&labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, f64::max)
    })
}

/// Scrapes `metrics` every half second until `stop`: each of [`PRODUCER_SERIES`] in every statistics
/// interval whose figures appeared meanwhile (a change of any stage's value is a new interval).
async fn sample_producer_windows(metrics: String, stop: Arc<AtomicBool>) -> [Vec<f64>; 4] {
    let mut windows: [Vec<f64>; 4] = Default::default();
    let mut last = match promhist::scrape(&metrics).await {
        Ok(text) => producer_p99s(&text),
        Err(_) => [0.0; 4],
    };
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(text) = promhist::scrape(&metrics).await else {
            continue;
        };
        let now = producer_p99s(&text);
        if now != last {
            for (window, value) in windows.iter_mut().zip(now) {
                window.push(value);
            }
            last = now;
        }
    }
    windows
}

/// Runs the phase on fresh slot `slot`: starts Siphon (`plan.sink`), warms up, writes at the
/// planned rate for the planned time to one fresh topic, collects both measures, stops Siphon.
pub async fn run(
    svc: &Services,
    db: &tokio_postgres::Client,
    slot: &str,
    plan: &Plan,
) -> Result<Latency> {
    let nonce = workload::run_nonce();
    let aggregatetype = format!("Latency-{nonce}");
    let topic = format!("outbox.event.{aggregatetype}");
    // Start from an empty table, without the backlog's million dead rows (no slot exists at
    // this point to stream the TRUNCATE).
    db.batch_execute(&format!("TRUNCATE {}", workload::TABLE))
        .await
        .context("emptying the outbox table")?;
    workload::create_slot(db, slot).await?;
    let siphon = drain::start_siphon(svc, slot, workload::PUBLICATION, plan.sink)?;

    // Warm-up: creates the topic (Siphon's topic creation) and proves the pipeline is
    // streaming and caught up.
    let aggregatetype_sql = format!("'{aggregatetype}'");
    db.batch_execute(&workload::transaction_sql(
        &nonce,
        &aggregatetype_sql,
        WARMUP_BASE,
        WARMUP_EVENTS,
    ))
    .await
    .context("warm-up transaction")?;
    let (_, lsn) = workload::current_lsn(db).await?;
    drain::wait_confirmed(db, &siphon, slot, lsn, Duration::from_secs(120)).await?;
    let partitions = wait_for_topic(&svc.bootstrap, &topic).await?;

    let txns = plan.secs * plan.rate / plan.txn_events;
    let expected = txns * plan.txn_events;
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (bootstrap, topic, nonce, stop, ready) = (
            svc.bootstrap.clone(),
            topic.clone(),
            nonce.clone(),
            stop.clone(),
            ready.clone(),
        );
        std::thread::spawn(move || {
            consume(
                &bootstrap,
                (&topic, &partitions),
                expected,
                &nonce,
                &stop,
                &ready,
            )
        })
    };
    // The consumer is ready (connected, fetching) once it has read the warm-up records.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.load(Ordering::Relaxed) && !consumer.is_finished() {
        if Instant::now() >= deadline {
            stop.store(true, Ordering::Relaxed);
            bail!("the latency consumer did not read the warm-up records within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe = start_probe(&svc.bootstrap, &nonce).await;
    let before = promhist::scrape(&siphon.metrics).await?;
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_producer_windows(
        siphon.metrics.clone(),
        sampling.clone(),
    ));

    let gc_mark = svc.broker_gc_log.as_deref().and_then(gc_log::mark);
    let pressure_mark = pressure::mark();
    let started = Instant::now();
    let commits = write(svc, plan, txns, &nonce, &aggregatetype_sql).await;
    let write_secs = started.elapsed().as_secs_f64();
    let broker_gc = gc_mark.as_ref().and_then(gc_log::pauses_since);
    let stalls = pressure::since(&pressure_mark);
    sampling.store(true, Ordering::Relaxed);
    let producer_windows = sampler.await.unwrap_or_default();
    let probe = probe.and_then(|p| {
        tokio::task::block_in_place(|| p.finish()).map_err(|e| format!("the probe failed: {e:#}"))
    });
    let commits = match commits {
        Ok(c) => c,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let _ = consumer.join();
            return Err(e);
        }
    };

    let (_, lsn) = workload::current_lsn(db).await?;
    let confirmed = drain::wait_confirmed(db, &siphon, slot, lsn, Duration::from_secs(120)).await;
    // Give the consumer a moment past the acknowledgement, then stop it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !consumer.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let arrivals = consumer
        .join()
        .map_err(|_| anyhow!("the consumer thread panicked"))??;
    confirmed?;
    let after = promhist::scrape(&siphon.metrics).await?;
    let usage = procstat::sample(siphon.pid()?)?;
    siphon.stop()?;
    workload::drop_slot(db, slot).await?;

    let (histogram, histogram_count) = histogram_between(&before, &after, HISTOGRAM);
    let (read_histogram, read_histogram_count) = histogram_between(&before, &after, READ_HISTOGRAM);
    let (send_histogram, send_histogram_count) = histogram_between(&before, &after, SEND_HISTOGRAM);
    let first_commit = commits
        .values()
        .min()
        .copied()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let timed: Vec<(u64, f64)> = arrivals
        .iter()
        .filter_map(|(seq, arrived)| {
            let committed = commits.get(&(seq / plan.txn_events))?;
            let second = committed
                .duration_since(first_commit)
                .unwrap_or(Duration::ZERO)
                .as_secs();
            let delay = arrived
                .duration_since(*committed)
                .unwrap_or(Duration::ZERO)
                .as_secs_f64();
            Some((second, delay))
        })
        .collect();
    let mut by_second: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for &(second, delay) in &timed {
        by_second.entry(second).or_default().push(delay);
    }
    let per_second = by_second
        .into_values()
        .filter_map(|mut v| {
            v.sort_by(f64::total_cmp);
            exact_quantiles(&v).map(|q| (q.p50, q.max))
        })
        .collect();
    let mut delays: Vec<f64> = timed.into_iter().map(|(_, d)| d).collect();
    delays.sort_by(f64::total_cmp);
    Ok(Latency {
        sink: plan.sink,
        rate: plan.rate,
        events_written: expected,
        write_secs,
        histogram,
        histogram_count,
        read_histogram,
        read_histogram_count,
        send_histogram,
        send_histogram_count,
        end_to_end: exact_quantiles(&delays),
        received: delays.len() as u64,
        per_second,
        usage,
        probe,
        producer_windows,
        broker_gc,
        stalls,
    })
}

/// Quantiles of histogram `name` over the observations between two scrapes (estimates by
/// linear interpolation within buckets), and how many observations there were.
fn histogram_between(before: &str, after: &str, name: &str) -> (Option<Quantiles>, f64) {
    let hist = promhist::difference(
        &promhist::buckets(after, name),
        &promhist::buckets(before, name),
    );
    let count = hist.last().map_or(0.0, |b| b.1);
    let quantiles = (|| {
        Some(Quantiles {
            p50: promhist::quantile(&hist, 0.50)?,
            p90: promhist::quantile(&hist, 0.90)?,
            p95: promhist::quantile(&hist, 0.95)?,
            p99: promhist::quantile(&hist, 0.99)?,
            p999: promhist::quantile(&hist, 0.999)?,
            max: promhist::max_bound(&hist)?,
        })
    })();
    (quantiles, count)
}

/// Creates the probe's topic (one partition) and starts the probe; `Err` says why there is
/// no probe (the phase goes on without it).
async fn start_probe(bootstrap: &str, nonce: &str) -> std::result::Result<Probe, String> {
    let topic = format!("siphon-bench-probe-{nonce}");
    siphon_tests::create_topic(bootstrap, &topic, 1)
        .await
        .map_err(|e| format!("creating the probe topic {topic}: {e:#}"))?;
    tokio::task::block_in_place(|| Probe::start(bootstrap, &topic))
        .map_err(|e| format!("starting the probe producer: {e:#}"))
}

/// Exact p50/p90/p95/p99/p99.9/max of sorted samples (nearest rank); `None` when there are none.
pub fn exact_quantiles(sorted: &[f64]) -> Option<Quantiles> {
    let at = |q: f64| -> Option<f64> {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted.get(rank - 1).copied()
    };
    Some(Quantiles {
        p50: at(0.50)?,
        p90: at(0.90)?,
        p95: at(0.95)?,
        p99: at(0.99)?,
        p999: at(0.999)?,
        max: *sorted.last()?,
    })
}

/// `plan.writers` connections, each paced by its own interval timer (offset so that the
/// transactions are evenly spread), write `txns` transactions of aggregate type `agg_sql` (an
/// SQL expression); returns each transaction's COMMIT-returned time by transaction number.
async fn write(
    svc: &Services,
    plan: &Plan,
    txns: u64,
    nonce: &str,
    agg_sql: &str,
) -> Result<HashMap<u64, SystemTime>> {
    let txn_per_sec = plan.rate as f64 / plan.txn_events as f64;
    let period = Duration::from_secs_f64(plan.writers as f64 / txn_per_sec);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for w in 0..plan.writers {
        let client = svc.connect().await?;
        let first_tick = start + period.mul_f64(w as f64 / plan.writers as f64);
        let mine: Vec<u64> = (w..txns).step_by(plan.writers as usize).collect();
        let (nonce, agg_sql, txn_events) = (nonce.to_owned(), agg_sql.to_owned(), plan.txn_events);
        tasks.push(tokio::spawn(async move {
            let mut timer = tokio::time::interval_at(first_tick, period);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut commits = Vec::new();
            for txn in mine {
                timer.tick().await;
                let sql = workload::transaction_sql(&nonce, &agg_sql, txn * txn_events, txn_events);
                client.batch_execute(&sql).await?;
                commits.push((txn, SystemTime::now()));
            }
            anyhow::Ok(commits)
        }));
    }
    let mut all = HashMap::new();
    for task in tasks {
        all.extend(task.await.context("a writer task panicked")??);
    }
    Ok(all)
}

/// Waits until the topic exists with partitions and its warm-up records; returns the
/// partitions' ids.
async fn wait_for_topic(bootstrap: &str, topic: &str) -> Result<Vec<i32>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let records =
            siphon_tests::read_topic_async(bootstrap, topic, Duration::from_secs(20)).await?;
        if records.len() as u64 >= WARMUP_EVENTS {
            let mut parts: Vec<i32> = records.iter().map(|r| r.partition).collect();
            let all = partitions(bootstrap, topic)?;
            parts.extend(all);
            parts.sort_unstable();
            parts.dedup();
            return Ok(parts);
        }
        if Instant::now() >= deadline {
            bail!("the warm-up records did not reach {topic} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn partitions(bootstrap: &str, topic: &str) -> Result<Vec<i32>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

/// Reads every partition of the phase's topic from its beginning (the topic is fresh: it holds
/// the warm-up records, then the measured ones) and notes when each measured event arrives,
/// until all `expected` arrived or `stop` is set. Sets `ready` once it has read the warm-up
/// records.
fn consume(
    bootstrap: &str,
    (topic, partitions): (&str, &[i32]),
    expected: u64,
    nonce: &str,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> Result<Vec<(u64, SystemTime)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("siphon-bench-{nonce}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // librdkafka's default, stated: with exactly-once, only committed transactions' records.
        .set("isolation.level", "read_committed")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.error.backoff.ms", "5")
        .create()
        .context("creating the latency consumer")?;
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut seen: HashMap<u64, SystemTime> = HashMap::new();
    let mut warm_up = 0;
    while (seen.len() as u64) < expected && !stop.load(Ordering::Relaxed) {
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let now = SystemTime::now();
        let msg = msg.context("consuming the latency topic")?;
        let seq = msg
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == "id")?.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|id| workload::seq_of(nonce, id));
        match seq {
            Some(seq) if seq < WARMUP_BASE => {
                seen.entry(seq).or_insert(now);
            }
            Some(_) => {
                warm_up += 1;
                if warm_up >= WARMUP_EVENTS {
                    ready.store(true, Ordering::Relaxed);
                }
            }
            None => {}
        }
    }
    Ok(seen.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_p99s_take_each_stage_largest_over_brokers() {
        let text = "\
# HELP siphon_kafka_latency_seconds stage partition_queue quantile=\"0.99\"
siphon_kafka_latency_seconds{broker=\"1\",stage=\"partition_queue\",quantile=\"0.99\"} 0.002
siphon_kafka_latency_seconds{broker=\"2\",stage=\"partition_queue\",quantile=\"0.99\"} 0.003
siphon_kafka_latency_seconds{broker=\"1\",stage=\"partition_queue\",quantile=\"1\"} 0.9
siphon_kafka_latency_seconds{broker=\"1\",stage=\"round_trip\",quantile=\"0.99\"} 0.015
siphon_send_to_ack_seconds_count 4
";
        assert_eq!(producer_p99s(text), [0.003, 0.0, 0.015, 0.0]);
        assert_eq!(producer_p99s(""), [0.0; 4]);
    }
}
