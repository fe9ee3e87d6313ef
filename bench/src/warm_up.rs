//! Bringing the bench's own broker to the steady state of a long-running one before anything
//! is measured.
//!
//! A JVM runs a code path interpreted, then compiled by C1, then by C2 once the path has been
//! taken often enough: HotSpot's thresholds count calls and loop iterations. A path taken once
//! per produce request (`KafkaApis.handleProduceRequest`, the network selector, the
//! purgatory's completion) is compiled by C2 after thousands of requests, so a producer that
//! writes its records in a few hundred full batches leaves it interpreted or in C1's profiled
//! code, and Siphon's first drains, which send one small request per partition leader per
//! millisecond, pay for the compilation and for the slower code meanwhile. Two steps:
//!
//! 1. [`records`]: records written by a producer with Siphon's settings, and one committed
//!    Kafka transaction (the transaction state log is created then, not during the
//!    exactly-once drain).
//! 2. [`siphon_drains`]: Siphon drains backlogs of its own into the bench's topics, round
//!    after round, until the broker's JIT compiler threads took at most [`STEADY_JIT_SHARE`]
//!    of the broker's CPU in each of [`STEADY_ROUNDS`] rounds in a row, or `max_rounds` ran:
//!    the requests, partitions, records and rate of the measured drains. One quiet round is
//!    not enough: HotSpot compiles in bursts, and a quiet round can be followed by a busy
//!    one. When the bench measures exactly-once delivery too, the rounds
//!    alternate an at-least-once and an exactly-once drain until both kinds are steady: the
//!    transactional produce path is another path taken once per request, and warmed one kind
//!    after the other, the kind warmed first pays for the JIT again in its measured drain, the
//!    other kind's requests having changed what the compiled code had seen.
//!
//! # Invariants
//! - [`siphon_drains`] runs before the measured drains' slots are created: none of them
//!   decodes the warm-up's WAL.
//! - Each round's slot is dropped before the next round starts.

use super::backlog;
use super::drain::{self, BrokerCpu};
use super::services::Services;
use super::workload;
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

/// The JIT compiler threads' share of the broker's CPU in a round at or below which the
/// broker counts as warmed up. A broker that has served Siphon for minutes stays near 5-10 %:
/// HotSpot keeps compiling now and then.
pub const STEADY_JIT_SHARE: f64 = 0.10;
/// Rounds in a row at or below [`STEADY_JIT_SHARE`] that end the warm-up.
pub const STEADY_ROUNDS: usize = 2;
/// Events behind each warm-up drain unless `--warm-up-drain-events` says otherwise.
pub const DRAIN_EVENTS: u64 = 300_000;
/// The most warm-up drains unless `--warm-up-drains` says otherwise.
pub const MAX_DRAINS: u32 = 12;
/// The slot of the warm-up drains (one at a time, dropped after each).
const SLOT: &str = "siphon_bench_warm_up";

/// What the warm-up drains did.
#[derive(Debug, Clone)]
pub struct WarmUpDrains {
    /// Events behind each drain.
    pub events: u64,
    /// Each at-least-once round's broker CPU (when the broker's process is known).
    pub rounds: Vec<Option<BrokerCpu>>,
    /// Each exactly-once round's broker CPU; `None` when exactly-once was not warmed up.
    pub exactly_once_rounds: Option<Vec<Option<BrokerCpu>>>,
    /// Seconds the rounds took, the backlogs' writing included.
    pub secs: f64,
}

impl WarmUpDrains {
    /// The JIT compiler threads' share of the broker's CPU in each at-least-once round.
    pub fn jit_shares(&self) -> Vec<Option<f64>> {
        jit_shares(&self.rounds)
    }

    /// The same for each exactly-once round.
    pub fn exactly_once_jit_shares(&self) -> Option<Vec<Option<f64>>> {
        self.exactly_once_rounds.as_deref().map(jit_shares)
    }

    /// Whether the last [`STEADY_ROUNDS`] rounds of each kind run each met
    /// [`STEADY_JIT_SHARE`].
    pub fn steady(&self) -> bool {
        steady(&self.rounds) && self.exactly_once_rounds.as_deref().is_none_or(steady)
    }
}

fn jit_shares(rounds: &[Option<BrokerCpu>]) -> Vec<Option<f64>> {
    rounds.iter().map(|r| r.map(|c| jit_share(&c))).collect()
}

/// Whether the last [`STEADY_ROUNDS`] of `rounds` each met [`STEADY_JIT_SHARE`] (never when
/// fewer rounds ran or a round's broker CPU is unknown).
fn steady(rounds: &[Option<BrokerCpu>]) -> bool {
    rounds.len() >= STEADY_ROUNDS
        && rounds[rounds.len() - STEADY_ROUNDS..]
            .iter()
            .all(|r| r.is_some_and(|c| jit_share(&c) <= STEADY_JIT_SHARE))
}

/// The JIT compiler threads' share of `cpu` (0 for a broker that used no CPU).
fn jit_share(cpu: &BrokerCpu) -> f64 {
    if cpu.total > 0.0 {
        cpu.jit / cpu.total
    } else {
        0.0
    }
}

/// The first step: creates [`WARM_UP_TOPIC`] (three partitions, as Siphon's topics in the bench) and
/// writes `records` records of the backlog's size to it with Siphon's producer
/// settings, then commits one Kafka transaction to it, so that the broker's transaction
/// state log exists (it is created on the first transactional producer's registration)
/// before the exactly-once drain. Returns the seconds it took. Blocks its worker thread
/// while it writes.
pub async fn records(svc: &Services, records: u64) -> Result<f64> {
    let started = std::time::Instant::now();
    siphon_tests::create_topic(&svc.bootstrap, WARM_UP_TOPIC, 3)
        .await
        .with_context(|| format!("creating {WARM_UP_TOPIC}"))?;
    tokio::task::block_in_place(|| produce_warm_up(&svc.bootstrap, records))?;
    tokio::task::block_in_place(|| commit_warm_up_transaction(&svc.bootstrap))?;
    Ok(started.elapsed().as_secs_f64())
}

/// The topic [`records`] writes to.
pub const WARM_UP_TOPIC: &str = "siphon-bench-warm-up";
/// Records [`records`] writes unless `--warm-up-records` says otherwise.
pub const WARM_UP_RECORDS: u64 = 200_000;

/// Registers a transactional producer and commits one transaction of a few records to
/// [`WARM_UP_TOPIC`].
fn commit_warm_up_transaction(bootstrap: &str) -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    use rdkafka::ClientConfig;
    use std::time::Duration;

    let timeout = Duration::from_secs(60);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", "siphon-bench-warm-up")
        .create()
        .context("creating the transactional warm-up producer")?;
    producer
        .init_transactions(timeout)
        .context("registering the transactional warm-up producer")?;
    producer
        .begin_transaction()
        .context("beginning the warm-up transaction")?;
    for n in 0..10 {
        let key = format!("agg-{n}");
        producer
            .send(
                BaseRecord::to(WARM_UP_TOPIC)
                    .key(&key)
                    .payload("{\"warmUp\": \"transactional\"}"),
            )
            .map_err(|(e, _)| e)
            .context("sending a transactional warm-up record")?;
    }
    producer
        .commit_transaction(timeout)
        .context("committing the warm-up transaction")
}

/// Writes the warm-up records: ~300-byte values with an `id` header and 1,000 keys, sent with
/// Siphon's producer settings (idempotent, `acks=all`, one request in flight, `linger.ms=1`,
/// the Java client's partitioner), then waits until every one was acknowledged.
fn produce_warm_up(bootstrap: &str, records: u64) -> Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    use rdkafka::ClientConfig;
    use std::time::Duration;

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("max.in.flight.requests.per.connection", "1")
        .set("partitioner", "murmur2_random")
        .create()
        .context("creating the warm-up producer")?;
    let value = format!("{{\"warmUp\": true, \"padding\": \"{}\"}}", "x".repeat(260));
    for n in 0..records {
        let key = format!("agg-{}", n % 1000);
        let id = n.to_string();
        loop {
            let record = BaseRecord::to(WARM_UP_TOPIC)
                .key(&key)
                .payload(&value)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "id",
                    value: Some(&id),
                }));
            match producer.send(record) {
                Ok(()) => break,
                Err((e, _))
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
                {
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e).context("sending a warm-up record"),
            }
        }
        if n % 1000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("the warm-up records were not all acknowledged within 120 s")
}

/// The second step: up to `max_rounds` rounds of Siphon draining `events` events of its own
/// (transactions of `txn_events`) to the broker through the insert-only publication, until
/// [`STEADY_ROUNDS`] rounds in a row had at most [`STEADY_JIT_SHARE`] of JIT compilation in the
/// broker's CPU; with `exactly_once`, each round is an at-least-once and an exactly-once drain,
/// until both kinds are steady.
pub async fn siphon_drains(
    svc: &Services,
    db: &tokio_postgres::Client,
    events: u64,
    txn_events: u64,
    max_rounds: u32,
    exactly_once: bool,
    timeout: Duration,
) -> Result<WarmUpDrains> {
    let started = Instant::now();
    let drains = Drains {
        svc,
        db,
        events,
        txn_events,
        max_rounds,
        timeout,
    };
    let sinks: &[drain::Sink] = if exactly_once {
        &[drain::Sink::Kafka, drain::Sink::KafkaExactlyOnce]
    } else {
        &[drain::Sink::Kafka]
    };
    let mut per_sink = drains.until_steady(sinks).await?.into_iter();
    let rounds = per_sink.next().unwrap_or_default();
    let exactly_once_rounds = per_sink.next();
    Ok(WarmUpDrains {
        events,
        rounds,
        exactly_once_rounds,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// What every warm-up round drains, and where.
struct Drains<'a> {
    svc: &'a Services,
    db: &'a tokio_postgres::Client,
    events: u64,
    txn_events: u64,
    max_rounds: u32,
    timeout: Duration,
}

impl Drains<'_> {
    /// Rounds of one drain into each of `sinks` in turn until the rounds of every sink are
    /// [`steady`], or `max_rounds` ran; each sink's rounds' broker CPU, in the order of
    /// `sinks`.
    async fn until_steady(&self, sinks: &[drain::Sink]) -> Result<Vec<Vec<Option<BrokerCpu>>>> {
        let mut rounds = vec![Vec::new(); sinks.len()];
        for round in 1..=self.max_rounds {
            for (sink, rounds) in sinks.iter().zip(&mut rounds) {
                rounds.push(self.drain(*sink, round).await?);
            }
            if rounds.iter().all(|r| steady(r)) {
                break;
            }
        }
        Ok(rounds)
    }

    /// One warm-up drain, round `round`, into `sink`: the broker's CPU meanwhile.
    async fn drain(&self, sink: drain::Sink, round: u32) -> Result<Option<BrokerCpu>> {
        workload::create_slot(self.db, SLOT).await?;
        let (_, _, end_lsn) = backlog::write(self.svc, self.events, self.txn_events)
            .await
            .context("writing a warm-up backlog")?;
        let drained = drain::siphon(
            self.svc,
            self.db,
            SLOT,
            workload::PUBLICATION,
            sink,
            end_lsn,
            self.timeout,
        )
        .await
        .context("a warm-up drain")?;
        workload::drop_slot(self.db, SLOT).await?;
        let delivery = if sink == drain::Sink::KafkaExactlyOnce {
            "exactly-once"
        } else {
            "at-least-once"
        };
        eprintln!(
            "bench: warm-up drain {round} ({delivery}): {:.2} s, {}",
            drained.secs,
            drained
                .broker_cpu
                .map_or("broker CPU unknown".to_owned(), |c| format!(
                    "broker CPU {:.2} s, of which JIT {:.2} s ({:.0} %)",
                    c.total,
                    c.jit,
                    jit_share(&c) * 100.0
                ))
        );
        Ok(drained.broker_cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(total: f64, jit: f64) -> Option<BrokerCpu> {
        Some(BrokerCpu { total, jit })
    }

    #[test]
    fn steady_when_the_last_two_rounds_compiled_little() {
        let drains = |rounds| WarmUpDrains {
            events: 1,
            rounds,
            exactly_once_rounds: None,
            secs: 1.0,
        };
        assert!(drains(vec![cpu(3.0, 1.5), cpu(1.0, 0.05), cpu(1.0, 0.1)]).steady());
        assert!(!drains(vec![cpu(3.0, 1.5), cpu(1.0, 0.05)]).steady());
        assert!(!drains(vec![cpu(1.0, 0.05), cpu(3.0, 1.5)]).steady());
        assert!(!drains(vec![cpu(1.0, 0.05)]).steady());
        assert!(!drains(vec![None, cpu(1.0, 0.05)]).steady());
        assert!(!drains(vec![None]).steady());
        assert!(!drains(vec![]).steady());
        assert_eq!(
            drains(vec![cpu(2.0, 0.5), None, cpu(0.0, 0.0)]).jit_shares(),
            vec![Some(0.25), None, Some(0.0)]
        );
    }

    #[test]
    fn steady_only_when_the_exactly_once_rounds_are_too() {
        let quiet = vec![cpu(1.0, 0.05), cpu(1.0, 0.05)];
        let drains = |exactly_once_rounds| WarmUpDrains {
            events: 1,
            rounds: quiet.clone(),
            exactly_once_rounds,
            secs: 1.0,
        };
        assert!(drains(None).steady());
        assert!(drains(Some(quiet.clone())).steady());
        assert!(!drains(Some(vec![cpu(2.0, 1.0), cpu(1.0, 0.05)])).steady());
        assert!(!drains(Some(vec![])).steady());
        assert_eq!(
            drains(Some(vec![cpu(2.0, 1.0)])).exactly_once_jit_shares(),
            Some(vec![Some(0.5)])
        );
        assert_eq!(drains(None).exactly_once_jit_shares(), None);
    }
}
