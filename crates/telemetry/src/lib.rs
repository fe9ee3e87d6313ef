//! Siphon's observability, the crate's one job: Prometheus metrics, liveness and readiness, and
//! the HTTP endpoint serving them.
//!
//! The binary's pipeline only drives them: it moves the metrics, emits [`Event`]s, sets
//! [`Health`] and spawns [`serve`]. The Kafka sink reports acknowledgements and broker latencies
//! into [`Metrics`] as its [`siphon_kafka_sink::DeliveryObserver`].
//!
//! - [`Metrics`] holds every series Siphon exports; the pipeline moves them through cheap
//!   methods on a shared `Arc<Metrics>`.
//! - [`pg_timestamp`] reads pgoutput's commit times, for the commit-to-acknowledgement latency
//!   (the session's ledger keeps the times themselves).
//! - [`Event`] is one telemetry event as a value: it writes its log line and moves its metrics
//!   together.
//! - [`Health`] holds the two facts readiness depends on (streaming, broker reachable).
//! - [`serve`] answers `GET /metrics`, `GET /health` and `GET /ready` on a listener from [`bind`].
//!
//! # Invariants
//! - Every label has a bounded set of values: `topic` is bounded by the outbox's aggregate types
//!   and capped at [`MAX_TOPIC_LABELS`] (later topics are counted under [`OVERFLOW_TOPIC`]);
//!   `reason`, `kind` and `cause` are fixed enumerations. Nothing is labelled per event.
//! - The hot-path methods never allocate once a topic has been seen, and never block on I/O.
//! - [`Health`] is the single source of truth for readiness: `siphon_streaming` and
//!   `siphon_broker_reachable` are read from it at scrape time, so `/ready` and `/metrics` agree.
//! - Serving metrics never affects the pipeline: the endpoint only reads atomics and takes the
//!   registry's short-lived locks.

mod event;
mod http;
mod latency_histogram;
mod metrics;

pub use event::Event;
pub use http::{bind, serve};
pub use metrics::{
    Metrics, ProducerErrorKind, ReconnectCause, SkipKind, TopicMetrics, TransferKind,
    COMMIT_TO_ACK_BUCKETS, MAX_TOPIC_LABELS, OVERFLOW_TOPIC,
};
pub use pgoutput::pg_timestamp;

use std::sync::atomic::{AtomicBool, Ordering};

/// What readiness depends on, set by the pipeline and read by `/ready` and `/metrics`.
///
/// Both flags start `false`: a process that has not streamed yet is alive but not ready.
#[derive(Debug, Default)]
pub struct Health {
    streaming: AtomicBool,
    broker_reachable: AtomicBool,
    /// What setting up the slot waits for, while it waits (why it is not streaming yet).
    setup: siphon_source::SetupWait,
}

impl Health {
    /// Neither streaming nor known to reach the broker.
    pub fn new() -> Self {
        Health::default()
    }

    /// Whether the replication stream is open and being read.
    pub fn set_streaming(&self, streaming: bool) {
        self.streaming.store(streaming, Ordering::Relaxed);
    }

    /// Whether the Kafka cluster answered recently (a delivery succeeded, metadata was fetched).
    pub fn set_broker_reachable(&self, reachable: bool) {
        self.broker_reachable.store(reachable, Ordering::Relaxed);
    }

    /// Where setting up the slot says what it waits for (see [`siphon_source::slot_wait`]).
    pub fn setup_wait(&self) -> &siphon_source::SetupWait {
        &self.setup
    }

    /// See [`Health::set_streaming`].
    pub fn is_streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    /// See [`Health::set_broker_reachable`].
    pub fn is_broker_reachable(&self) -> bool {
        self.broker_reachable.load(Ordering::Relaxed)
    }

    /// `Ok` when ready to serve traffic (streaming and the broker reachable), else one line
    /// saying why not (with what setting up the slot waits for, while it waits).
    pub fn readiness(&self) -> Result<(), String> {
        let not_streaming = || match self.setup.get() {
            Some(why) => format!("not streaming from PostgreSQL: {why}"),
            None => "not streaming from PostgreSQL".to_owned(),
        };
        match (self.is_streaming(), self.is_broker_reachable()) {
            (true, true) => Ok(()),
            (false, true) => Err(not_streaming()),
            (true, false) => Err("Kafka broker not reachable".to_owned()),
            (false, false) => Err(format!("{}; Kafka broker not reachable", not_streaming())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_both_flags() {
        let h = Health::new();
        let reason = |h: &Health| h.readiness().err();
        assert_eq!(
            reason(&h).as_deref(),
            Some("not streaming from PostgreSQL; Kafka broker not reachable")
        );
        h.set_streaming(true);
        assert_eq!(reason(&h).as_deref(), Some("Kafka broker not reachable"));
        h.set_broker_reachable(true);
        assert_eq!(h.readiness(), Ok(()));
        h.set_streaming(false);
        assert_eq!(reason(&h).as_deref(), Some("not streaming from PostgreSQL"));
    }
}
