//! Commit-to-ack latency under a steady load: Siphon's own histogram, an independent
//! end-to-end measure (COMMIT returned at the writer -> record polled by a consumer), and the
//! broker's own produce latency over the same seconds (a probe producer, [`super::probe`]).

use super::drain;
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

/// Histogram name Siphon exports.
const HISTOGRAM: &str = "siphon_commit_to_ack_seconds";
/// Sequence numbers of warm-up events start here (never reached by measured events).
const WARMUP_BASE: u64 = 900_000_000_000;
/// Warm-up events per topic.
const WARMUP_PER_TOPIC: u64 = 2;
/// Seconds of writes that go to one topic before the writers move on to the next.
///
/// Tansu's memory engine lists every batch a partition holds on every fetch, so one topic
/// written for the whole phase costs the broker more CPU with each second (the end-to-end
/// consumer fetches every few milliseconds): the measure would grow with the phase's length,
/// not with the pipeline. Each slice of the writes goes to a topic of its own, created during
/// the warm-up, and the consumer lets go of a topic once it has all of that slice's records.
const SECS_PER_TOPIC: u64 = 5;

pub struct Plan {
    pub secs: u64,
    pub rate: u64,
    pub txn_events: u64,
    pub writers: u64,
}

/// p50/p95/p99/max in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone)]
pub struct Latency {
    pub events_written: u64,
    pub write_secs: f64,
    /// Siphon's histogram, bucket-interpolated; `max` is the upper bound of the last bucket.
    pub histogram: Option<Quantiles>,
    pub histogram_count: f64,
    /// COMMIT returned -> consumer received, exact over the received records.
    pub end_to_end: Option<Quantiles>,
    pub received: u64,
    /// End-to-end (p50, max) per second of the run, by commit time.
    pub per_second: Vec<(f64, f64)>,
    pub usage: Usage,
    /// The probe producer's send -> ack latency during the writes, or why it is missing.
    pub probe: std::result::Result<ProbeStats, String>,
}

/// Runs the phase on fresh slot `slot`: starts Siphon (kafka sink), warms up, writes at the
/// planned rate for the planned time, collects both measures, stops Siphon.
pub async fn run(
    svc: &Services,
    db: &tokio_postgres::Client,
    slot: &str,
    plan: &Plan,
) -> Result<Latency> {
    let nonce = workload::run_nonce();
    let slices = plan.secs.div_ceil(SECS_PER_TOPIC).max(1);
    let aggregatetype = |slice: u64| format!("Latency-{nonce}-{slice}");
    let topics: Vec<String> = (0..slices)
        .map(|slice| format!("outbox.event.{}", aggregatetype(slice)))
        .collect();
    // Start from an empty table, without the backlog's million dead rows (no slot exists at
    // this point to stream the TRUNCATE).
    db.batch_execute(&format!("TRUNCATE {}", workload::TABLE))
        .await
        .context("emptying the outbox table")?;
    workload::create_slot(db, slot).await?;
    let siphon = drain::start_siphon(svc, slot, "kafka")?;

    // Warm-up: creates every topic and proves the pipeline is streaming and caught up.
    let warm_up_sql = format!("'Latency-{nonce}-' || (n % {slices})");
    db.batch_execute(&workload::transaction_sql(
        &nonce,
        &warm_up_sql,
        WARMUP_BASE,
        WARMUP_PER_TOPIC * slices,
    ))
    .await
    .context("warm-up transaction")?;
    let (_, lsn) = workload::current_lsn(db).await?;
    drain::wait_confirmed(db, &siphon, slot, lsn, Duration::from_secs(120)).await?;
    let mut partitions = Vec::new();
    for topic in &topics {
        partitions.push((topic.clone(), wait_for_topic(&svc.bootstrap, topic).await?));
    }

    let txns = plan.secs * plan.rate / plan.txn_events;
    let expected = txns * plan.txn_events;
    // Transaction `txn` writes to the topic of its slice of the phase.
    let txns_per_slice = (SECS_PER_TOPIC * plan.rate / plan.txn_events).max(1);
    let txn_events = plan.txn_events;
    let slice_of_seq = move |seq: u64| seq / txn_events / txns_per_slice;
    let slice_sizes: Vec<u64> = (0..slices)
        .map(|slice| {
            let first = slice * txns_per_slice;
            let last = ((slice + 1) * txns_per_slice).min(txns);
            last.saturating_sub(first) * plan.txn_events
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (bootstrap, nonce, stop, ready) = (
            svc.bootstrap.clone(),
            nonce.clone(),
            stop.clone(),
            ready.clone(),
        );
        let slices = Slices {
            partitions,
            sizes: slice_sizes,
            of_seq: Box::new(slice_of_seq),
        };
        std::thread::spawn(move || consume(&bootstrap, &slices, &nonce, &stop, &ready))
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

    let started = Instant::now();
    let agg_sql = |txn: u64| format!("'{}'", aggregatetype(txn / txns_per_slice));
    let commits = write(svc, plan, txns, &nonce, &agg_sql).await;
    let write_secs = started.elapsed().as_secs_f64();
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

    let hist = promhist::difference(
        &promhist::buckets(&after, HISTOGRAM),
        &promhist::buckets(&before, HISTOGRAM),
    );
    let histogram_count = hist.last().map_or(0.0, |b| b.1);
    let histogram = (|| {
        Some(Quantiles {
            p50: promhist::quantile(&hist, 0.50)?,
            p95: promhist::quantile(&hist, 0.95)?,
            p99: promhist::quantile(&hist, 0.99)?,
            max: promhist::max_bound(&hist)?,
        })
    })();
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
        events_written: expected,
        write_secs,
        histogram,
        histogram_count,
        end_to_end: exact_quantiles(&delays),
        received: delays.len() as u64,
        per_second,
        usage,
        probe,
    })
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

/// Exact p50/p95/p99/max of sorted samples (nearest rank); `None` when there are none.
pub fn exact_quantiles(sorted: &[f64]) -> Option<Quantiles> {
    let at = |q: f64| -> Option<f64> {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted.get(rank - 1).copied()
    };
    Some(Quantiles {
        p50: at(0.50)?,
        p95: at(0.95)?,
        p99: at(0.99)?,
        max: *sorted.last()?,
    })
}

/// `plan.writers` connections, each paced by its own interval timer (offset so that the
/// transactions are evenly spread), write `txns` transactions; returns each transaction's
/// COMMIT-returned time by transaction number.
async fn write(
    svc: &Services,
    plan: &Plan,
    txns: u64,
    nonce: &str,
    agg_sql: &dyn Fn(u64) -> String,
) -> Result<HashMap<u64, SystemTime>> {
    let txn_per_sec = plan.rate as f64 / plan.txn_events as f64;
    let period = Duration::from_secs_f64(plan.writers as f64 / txn_per_sec);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for w in 0..plan.writers {
        let client = svc.connect().await?;
        let first_tick = start + period.mul_f64(w as f64 / plan.writers as f64);
        // Each writer's transactions and the SQL of their aggregate type, worked out here.
        let mine: Vec<(u64, String)> = (w..txns)
            .step_by(plan.writers as usize)
            .map(|txn| (txn, agg_sql(txn)))
            .collect();
        let (nonce, txn_events) = (nonce.to_owned(), plan.txn_events);
        tasks.push(tokio::spawn(async move {
            let mut timer = tokio::time::interval_at(first_tick, period);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut commits = Vec::new();
            for (txn, agg_sql) in mine {
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
        if records.len() as u64 >= WARMUP_PER_TOPIC {
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

/// The phase's topics, one per slice of the writes.
struct Slices {
    /// Each slice's topic and its partitions.
    partitions: Vec<(String, Vec<i32>)>,
    /// Measured events per slice.
    sizes: Vec<u64>,
    /// The slice an event's sequence number belongs to.
    of_seq: Box<dyn Fn(u64) -> u64 + Send>,
}

/// Reads every partition of every slice's topic from its beginning (Tansu's "latest" offsets
/// are unreliable; the topics are fresh, holding only the warm-up records) and notes when each
/// measured event arrives, until all arrived or `stop` is set. A slice's topic is let go once
/// all its events arrived. Sets `ready` once it has read the warm-up records.
fn consume(
    bootstrap: &str,
    slices: &Slices,
    nonce: &str,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> Result<Vec<(u64, SystemTime)>> {
    let expected: u64 = slices.sizes.iter().sum();
    let warm_up_events = WARMUP_PER_TOPIC * slices.partitions.len() as u64;
    let mut missing = slices.sizes.clone();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("siphon-bench-{nonce}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.error.backoff.ms", "5")
        .create()
        .context("creating the latency consumer")?;
    let topic_partitions = |slice: usize| -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        if let Some((topic, partitions)) = slices.partitions.get(slice) {
            for &p in partitions {
                tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            }
        }
        Ok(tpl)
    };
    let mut tpl = TopicPartitionList::new();
    for slice in 0..slices.partitions.len() {
        for element in topic_partitions(slice)?.elements() {
            tpl.add_partition_offset(element.topic(), element.partition(), element.offset())?;
        }
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
                if seen.insert(seq, now).is_some() {
                    continue;
                }
                let slice = (slices.of_seq)(seq) as usize;
                if let Some(left) = missing.get_mut(slice) {
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        consumer.incremental_unassign(&topic_partitions(slice)?)?;
                    }
                }
            }
            Some(_) => {
                warm_up += 1;
                if warm_up >= warm_up_events {
                    ready.store(true, Ordering::Relaxed);
                }
            }
            None => {}
        }
    }
    Ok(seen.into_iter().collect())
}
