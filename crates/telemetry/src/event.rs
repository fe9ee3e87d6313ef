//! Telemetry events as values: each one writes its log line and moves its metrics together, so
//! a log line and its counter can never disagree on what happened or on its labels.
//!
//! Per-record counters on the hot path (events read, records routed, produced, acknowledged)
//! have no log line and stay direct calls on [`Metrics`].
//!
//! # Invariants
//! - [`Event::emit`] is the only place these log lines are written and these counters moved.
//! - Labels come from the event's own fields (the topic, the reason, the cause), never from a
//!   second copy.

use super::{Metrics, ProducerErrorKind, ReconnectCause, SkipKind, TransferKind};
use pgoutput::Lsn;
use siphon_router::{LogLevel, SkipReason};
use std::fmt::Display;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Something that happened, worth a log line and a metric.
pub enum Event<'a> {
    /// A row was deliberately not sent.
    RowSkipped {
        table: &'a dyn Display,
        reason: SkipReason,
        level: LogLevel,
    },
    /// A row of another (published, not outbox) table.
    OtherTableRow,
    /// A non-transactional logical message of an outbox prefix, skipped by configuration.
    NonTransactionalMessageSkipped { prefix: &'a str, lsn: Lsn },
    /// A row could not be routed; it went to the dead-letter topic.
    RowDeadLettered {
        table: &'a dyn Display,
        lsn: Lsn,
        error: &'a dyn Display,
        dead_letter_topic: &'a str,
    },
    /// An outbox table cannot be routed; its rows will go to the dead-letter topic.
    TableUnroutable {
        table: &'a dyn Display,
        error: &'a dyn Display,
    },
    /// Kafka refused a record for good; it went to the dead-letter topic.
    RecordDeadLettered {
        topic: &'a str,
        error: &'a dyn Display,
    },
    /// A record's delivery failed (it is sent again, or handled as refused).
    DeliveryFailed {
        topic: &'a str,
        error: &'a dyn Display,
        kind: ProducerErrorKind,
    },
    /// The producer did not take a record; it is sent again after a pause.
    RecordNotTaken {
        topic: &'a str,
        error: &'a dyn Display,
    },
    /// The producer's statistics: its latencies per broker over the last interval.
    KafkaLatencies {
        brokers: &'a [siphon_kafka_sink::BrokerLatencies],
    },
    /// A record waited longer than the delivery timeout: the producer is purged and replaced.
    DeliveryOverdue { unacked: usize },
    /// The producer is replaced; its undelivered records are sent again in their order.
    /// `cause`: the first delivery failure that called for it, or the delivery deadline.
    ProducerReplaced {
        resend: usize,
        cause: Option<&'a str>,
    },
    /// An initial snapshot or a re-send acknowledged another chunk of `rows` rows of `table`.
    TransferProgress {
        kind: TransferKind,
        table: &'a dyn Display,
        rows: u64,
        /// Rows acknowledged so far (all tables).
        sent: u64,
        /// Rows it had to send when it started (an estimate: rows come and go meanwhile).
        total: u64,
        /// Rows a second since it started (in this process).
        rate: f64,
    },
    /// An initial snapshot or a re-send finished: `sent` rows acknowledged in `elapsed`.
    TransferFinished {
        kind: TransferKind,
        sent: u64,
        elapsed: Duration,
    },
    /// A session ended by a transient error; the next one starts after `delay`.
    Reconnecting {
        cause: ReconnectCause,
        error: &'a dyn Display,
        delay: Duration,
        resume_from: Lsn,
    },
}

impl Event<'_> {
    /// Writes the log line and moves the metrics.
    pub fn emit(self, metrics: &Metrics) {
        match self {
            Event::TransferProgress {
                kind,
                table,
                rows,
                sent,
                total,
                rate,
            } => {
                let remaining = total.saturating_sub(sent);
                let eta = (rate > 0.0).then(|| Duration::from_secs_f64(remaining as f64 / rate));
                metrics.transfer_progress(kind, rows, remaining, rate, eta);
                info!(
                    kind = kind.label(),
                    %table,
                    sent,
                    total,
                    rows_per_second = format_args!("{rate:.0}"),
                    eta_seconds = eta.map_or(-1, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
                    "{} progress",
                    kind.label()
                );
            }
            Event::TransferFinished {
                kind,
                sent,
                elapsed,
            } => {
                metrics.transfer_ended(kind);
                info!(
                    kind = kind.label(),
                    sent,
                    seconds = elapsed.as_secs(),
                    "{} finished: every row acknowledged by Kafka",
                    kind.label()
                );
            }
            Event::RowSkipped {
                table,
                reason,
                level,
            } => {
                metrics.row_skipped(reason.into());
                match (reason, level) {
                    (SkipReason::Delete, _) => {}
                    (SkipReason::Update, LogLevel::Error) => error!(
                        %table,
                        "UPDATE of an outbox row skipped: outbox rows should only be inserted (table.op.invalid.behavior = error)"
                    ),
                    (SkipReason::Update, LogLevel::Warn) => warn!(
                        %table,
                        "UPDATE of an outbox row skipped: outbox rows should only be inserted (table.op.invalid.behavior = warn)"
                    ),
                    (SkipReason::Update, LogLevel::Info) => {
                        info!(%table, "UPDATE of an outbox row skipped")
                    }
                }
            }
            Event::OtherTableRow => metrics.row_skipped(SkipKind::OtherTable),
            Event::NonTransactionalMessageSkipped { prefix, lsn } => {
                metrics.row_skipped(SkipKind::NonTransactionalMessage);
                warn!(prefix, %lsn, "non-transactional logical message skipped (source.non_transactional_messages = \"skip\"): it is not atomic with the change it announces");
            }
            Event::RowDeadLettered {
                table,
                lsn,
                error,
                dead_letter_topic,
            } => {
                metrics.record_dead_lettered(dead_letter_topic);
                warn!(%table, %lsn, %error, topic = dead_letter_topic, "row dead-lettered");
            }
            Event::TableUnroutable { table, error } => error!(
                %table, %error,
                "outbox table cannot be routed; its rows go to the dead-letter topic"
            ),
            Event::RecordDeadLettered { topic, error } => {
                metrics.record_dead_lettered(topic);
                warn!(%topic, %error, "record dead-lettered");
            }
            Event::DeliveryFailed { topic, error, kind } => {
                metrics.producer_error(kind);
                debug!(%topic, %error, "record not delivered");
            }
            Event::RecordNotTaken { topic, error } => {
                metrics.producer_error(ProducerErrorKind::Transient);
                warn!(%topic, %error, "Kafka did not take a record; it is sent again after a pause");
            }
            Event::KafkaLatencies { brokers } => {
                metrics.set_kafka_latencies(brokers);
                for broker in brokers {
                    for stage in &broker.stages {
                        debug!(
                            broker = broker.node_id,
                            stage = stage.stage.label(),
                            samples = stage.samples,
                            p50 = ?stage.p50,
                            p99 = ?stage.p99,
                            max = ?stage.max,
                            "Kafka producer latency"
                        );
                    }
                }
            }
            Event::DeliveryOverdue { unacked } => {
                metrics.producer_error(ProducerErrorKind::Transient);
                warn!(
                    unacked,
                    "a record was not acknowledged within kafka.properties.\"message.timeout.ms\"; purging the producer (nothing queued after it is sent) to replace it"
                );
            }
            Event::ProducerReplaced { resend, cause } => {
                metrics.producer_rebuilt();
                metrics.reconnect(ReconnectCause::Sink);
                // A `None` cause is left out of the line.
                warn!(
                    resend,
                    cause,
                    "Kafka producer failed; replacing it and sending its undelivered records again in their order"
                );
            }
            Event::Reconnecting {
                cause,
                error,
                delay,
                resume_from,
            } => {
                metrics.reconnect(cause);
                warn!(%error, retry_in = ?delay, %resume_from, "pipeline interrupted; reconnecting");
            }
        }
    }
}
