//! The broker's own produce latency during the latency phase: a probe producer, independent of
//! Siphon, sends small records to a topic of its own at a steady pace and times each one from
//! `send` to its delivery report.
//!
//! Its settings are the ones Siphon's guarantees rest on (`acks=all`, idempotence) with
//! `linger.ms=0`, so its latency is the broker's (plus the loopback round trip), without any
//! batching delay of the client. Comparing it with Siphon's commit->ack histogram says how much
//! of Siphon's latency is the broker's.
//!
//! # Invariants
//! - Only records sent after the warm-up record was acknowledged (metadata known, connection
//!   open) are timed.
//! - Dropping a [`Probe`] stops its thread (it finishes its last delivery reports and exits).

use super::latency::{exact_quantiles, Quantiles};
use anyhow::{anyhow, bail, Context as _, Result};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};
use rdkafka::{ClientConfig, ClientContext};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of each probe record's value.
pub const RECORD_BYTES: usize = 100;
/// Time between two probe records.
pub const INTERVAL: Duration = Duration::from_millis(10);

/// What the probe measured.
#[derive(Debug, Clone)]
pub struct ProbeStats {
    /// Records sent after the warm-up.
    pub sent: u64,
    /// Delivery reports that failed.
    pub failed: u64,
    /// send -> acknowledged, exact over the acknowledged records.
    pub latency: Option<Quantiles>,
    pub acked: u64,
}

/// Times every delivery report.
#[derive(Default)]
struct Timing {
    /// Seconds from send to acknowledgement; `None` until the warm-up record was acknowledged.
    samples: Mutex<Option<Vec<f64>>>,
    warmed_up: AtomicBool,
    failed: AtomicU64,
}

impl ClientContext for Timing {}

impl ProducerContext for Timing {
    type DeliveryOpaque = Box<(Instant, bool)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (sent, warm_up) = *opaque;
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if warm_up {
            self.warmed_up.store(true, Ordering::Relaxed);
            return;
        }
        if let Ok(mut samples) = self.samples.lock() {
            samples
                .get_or_insert_with(Vec::new)
                .push(sent.elapsed().as_secs_f64());
        }
    }
}

/// A running probe producer.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<ProbeStats>>>,
}

impl Probe {
    /// Starts the probe on `topic` (which must exist) and returns once its warm-up record was
    /// acknowledged. Blocks.
    pub fn start(bootstrap: &str, topic: &str) -> Result<Probe> {
        let producer: ThreadedProducer<Timing> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .set("message.timeout.ms", "30000")
            .create_with_context(Timing::default())
            .context("creating the probe producer")?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (flag, topic) = (stop.clone(), topic.to_owned());
        let thread = std::thread::Builder::new()
            .name("bench-probe".into())
            .spawn(move || run(&producer, &topic, &flag, &ready_tx))
            .context("starting the probe thread")?;
        let probe = Probe {
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => Ok(probe),
            Err(_) => Err(probe.finish().err().unwrap_or_else(|| {
                anyhow!("the probe's warm-up record was not acknowledged within 60 s")
            })),
        }
    }

    /// Stops sending, waits for the outstanding delivery reports and returns the figures.
    /// Blocks (up to the producer's flush timeout).
    pub fn finish(mut self) -> Result<ProbeStats> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().context("the probe was finished twice")?;
        thread
            .join()
            .map_err(|_| anyhow!("the probe thread panicked"))?
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn run(
    producer: &ThreadedProducer<Timing>,
    topic: &str,
    stop: &AtomicBool,
    ready: &mpsc::Sender<()>,
) -> Result<ProbeStats> {
    let value = vec![b'x'; RECORD_BYTES];
    let send = |warm_up: bool| -> Result<()> {
        producer
            .send(
                BaseRecord::with_opaque_to(topic, Box::new((Instant::now(), warm_up)))
                    .key("probe")
                    .payload(&value),
            )
            .map_err(|(e, _)| anyhow!("the probe producer refused a record: {e}"))
    };
    send(true)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !producer.context().warmed_up.load(Ordering::Relaxed) {
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            bail!("the probe's warm-up record to {topic} was not acknowledged");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = ready.send(());
    let mut sent = 0u64;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        send(false)?;
        sent += 1;
        next += INTERVAL;
        // Paced by the schedule, not by the time a send took.
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing the probe producer")?;
    let mut samples = producer
        .context()
        .samples
        .lock()
        .map_err(|_| anyhow!("the probe's samples lock is poisoned"))?
        .take()
        .unwrap_or_default();
    samples.sort_by(f64::total_cmp);
    Ok(ProbeStats {
        sent,
        failed: producer.context().failed.load(Ordering::Relaxed),
        acked: samples.len() as u64,
        latency: exact_quantiles(&samples),
    })
}
