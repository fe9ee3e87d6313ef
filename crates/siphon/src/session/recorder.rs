//! The session core's notes turned into log lines and metrics: the one place the driver (and
//! the simulation) gives what the core noticed to the telemetry.
//!
//! # Invariants
//! - Every [`Note`] becomes exactly the log line and counter moves of its telemetry
//!   [`Event`] (or the direct per-record counter), once.
//! - The window gauges (records and bytes in flight, the oldest unacknowledged hand-over) are
//!   set from the core's state at each drain; the oldest hand-over only when it changed.

use super::core::SessionCore;
use super::note::{FailureKind, Note};
use crate::telemetry::{Event, Metrics, ProducerErrorKind, TopicMetrics};
use rustc_hash::FxHashMap;
use siphon_record::RecentTopics;
use std::sync::Arc;
use std::time::Instant;

/// Per-topic counters, taken from the metrics once per topic (no lock on the per-record path);
/// recent topics' are found again without hashing their names.
#[derive(Default)]
struct TopicCounters {
    by_topic: FxHashMap<String, TopicMetrics>,
    recent: RecentTopics<TopicMetrics>,
}

impl TopicCounters {
    /// Counts with the counters of `topic`, taken from `metrics` the first time.
    fn count(&mut self, metrics: &Metrics, topic: &Arc<str>, count: impl FnOnce(&TopicMetrics)) {
        if let Some(counters) = self.recent.get(topic) {
            count(counters);
            return;
        }
        let counters = match self.by_topic.get(&**topic) {
            Some(counters) => counters.clone(),
            None => {
                let counters = metrics.topic(topic);
                self.by_topic.insert(topic.to_string(), counters.clone());
                counters
            }
        };
        count(&counters);
        self.recent.keep(topic, counters);
    }
}

/// Gives a core's notes and window to the metrics and the log.
pub struct Recorder {
    metrics: Arc<Metrics>,
    topics: TopicCounters,
    /// The oldest unacknowledged hand-over last given to the metrics (`None`: not given yet):
    /// the gauge is set only when it changes.
    oldest_reported: Option<Option<Instant>>,
}

impl Recorder {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Recorder {
            metrics,
            topics: TopicCounters::default(),
            oldest_reported: None,
        }
    }

    /// Takes every note `core` has.
    pub fn notes(&mut self, core: &mut SessionCore<'_>) {
        while let Some(note) = core.poll_note() {
            self.record(note);
        }
    }

    /// Takes every note a transfer's engine has.
    pub fn notes_of_transfer(&mut self, transfer: &mut super::core::TransferSession<'_>) {
        while let Some(note) = transfer.poll_note() {
            self.record(note);
        }
    }

    /// Takes every note `core` has, and sets the window's gauges.
    pub fn drain(&mut self, core: &mut SessionCore<'_>) {
        self.notes(core);
        let (records, bytes) = core.in_flight();
        self.metrics.set_in_flight(records, bytes);
        let oldest = core.oldest_sent();
        if self.oldest_reported != Some(oldest) {
            self.metrics.set_oldest_unacked_since(oldest);
            self.oldest_reported = Some(oldest);
        }
    }

    fn record(&mut self, note: Note) {
        let metrics = &*self.metrics;
        match note {
            Note::EventRead => metrics.event_read(),
            Note::Transaction => metrics.transaction(),
            Note::CommitToRead(latency) => metrics.observe_commit_to_read(latency),
            Note::CommitToAck(latency) => metrics.observe_commit_to_ack(latency),
            Note::SendToAck(latency) => metrics.observe_send_to_ack(latency),
            Note::Routed { topic, produced } => self.topics.count(metrics, &topic, |counters| {
                counters.routed();
                if produced {
                    counters.produced();
                }
            }),
            Note::Produced { topic } => {
                self.topics
                    .count(metrics, &topic, |counters| counters.produced());
            }
            Note::DeleteSkipped => Event::RowSkipped {
                table: &"",
                reason: siphon_router::SkipReason::Delete,
                level: siphon_router::LogLevel::Info,
            }
            .emit(metrics),
            Note::RowSkipped {
                table,
                reason,
                level,
            } => Event::RowSkipped {
                table: &table,
                reason,
                level,
            }
            .emit(metrics),
            Note::OtherTableRow => Event::OtherTableRow.emit(metrics),
            Note::SchemaId { known } => metrics.schema_id(known),
            Note::SchemaMisfit => metrics.schema_misfit(),
            Note::NonTransactionalMessageSkipped { prefix, lsn } => {
                Event::NonTransactionalMessageSkipped {
                    prefix: &prefix,
                    lsn,
                }
                .emit(metrics)
            }
            Note::RowDeadLettered {
                table,
                lsn,
                error,
                dead_letter_topic,
            } => Event::RowDeadLettered {
                table: &table,
                lsn,
                error: &error,
                dead_letter_topic: &dead_letter_topic,
            }
            .emit(metrics),
            Note::TableUnroutable { table, error } => Event::TableUnroutable {
                table: &table,
                error: &error,
            }
            .emit(metrics),
            Note::RecordDeadLettered { topic, error } => Event::RecordDeadLettered {
                topic: &topic,
                error: &error,
            }
            .emit(metrics),
            Note::DeliveryFailed { topic, error, kind } => Event::DeliveryFailed {
                topic: &topic,
                error: &error,
                kind: match kind {
                    FailureKind::Transient => ProducerErrorKind::Transient,
                    FailureKind::Definite => ProducerErrorKind::Definite,
                },
            }
            .emit(metrics),
            Note::RecordNotTaken { topic, error } => Event::RecordNotTaken {
                topic: &topic,
                error: &error,
            }
            .emit(metrics),
            Note::DeliveryOverdue { unacked } => Event::DeliveryOverdue { unacked }.emit(metrics),
            Note::ProducerReplaced { resend, cause } => Event::ProducerReplaced {
                resend,
                cause: cause.as_deref(),
            }
            .emit(metrics),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn notes_move_the_counters_of_their_events() {
        let metrics = Arc::new(Metrics::new());
        let mut recorder = Recorder::new(Arc::clone(&metrics));
        let topic: Arc<str> = Arc::from("orders");
        for note in [
            Note::EventRead,
            Note::EventRead,
            Note::Transaction,
            Note::DeleteSkipped,
            Note::OtherTableRow,
            Note::Routed {
                topic: Arc::clone(&topic),
                produced: true,
            },
            Note::Routed {
                topic: Arc::clone(&topic),
                produced: false,
            },
            Note::CommitToRead(Duration::from_millis(7)),
            Note::DeliveryFailed {
                topic: Arc::clone(&topic),
                error: Box::new("timed out"),
                kind: FailureKind::Transient,
            },
        ] {
            recorder.record(note);
        }
        let text = metrics.encode();
        for series in [
            "siphon_events_read_total 2",
            "siphon_transactions_total 1",
            "siphon_rows_skipped_total{reason=\"delete\"} 1",
            "siphon_rows_skipped_total{reason=\"other_table\"} 1",
            "siphon_records_routed_total{topic=\"orders\"} 2",
            "siphon_records_produced_total{topic=\"orders\"} 1",
            "siphon_producer_errors_total{kind=\"transient\"} 1",
            "siphon_commit_to_read_seconds_bucket{le=\"0.01\"} 1",
        ] {
            assert!(text.lines().any(|l| l == series), "{series}:\n{text}");
        }
    }
}
