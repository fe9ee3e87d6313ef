//! What a session runs with: the settings built once from the configuration (the routers,
//! the error policy, the sink and source settings, exactly-once delivery), shared by the
//! session and by the transfers that read outside the stream (initial snapshot, re-sends).
//!
//! # Invariants
//! - Plain values: nothing here does IO, and nothing here imports the session or the
//!   transfers (both import it).

use siphon_kafka_sink::SinkConfig;
use siphon_source::SourceConfig;
use std::collections::HashSet;
use std::time::Duration;

pub use siphon_core::engine::policy::{ErrorPolicy, NonTransactionalPolicy, RoutedKind};
pub use siphon_core::engine::routers::Routers;

/// Everything a session needs, built once from the configuration.
pub struct PipelineSettings {
    pub source: SourceConfig,
    pub sink: SinkConfig,
    pub router: Routers,
    /// Prefixes of logical messages that carry outbox events.
    pub message_prefixes: HashSet<String>,
    pub non_transactional: NonTransactionalPolicy,
    pub on_error: ErrorPolicy,
    pub max_in_flight_records: usize,
    pub max_in_flight_bytes: usize,
    pub shutdown_timeout: Duration,
    /// A record unacknowledged this long gives up its producer (see
    /// [`siphon_kafka_sink::SinkConfig::delivery_timeout`]).
    pub delivery_timeout: Option<Duration>,
    /// A stream silent this long while the server has newer WAL is reconnected.
    pub stall_timeout: Duration,
    /// Every routed record carries its source position as headers (`format.position_headers`).
    pub position_headers: bool,
    /// Where the publication's membership is kept across restarts (`None`: not kept).
    pub state_topic: Option<siphon_kafka_sink::StateTopic>,
    /// The fixed intervals and timeouts of the session and the supervisor.
    pub intervals: siphon_core::Intervals,
    /// Exactly-once delivery (`kafka.delivery = "exactly-once"`; `None`: at-least-once).
    pub exactly_once: Option<ExactlyOnce>,
    /// The initial snapshot and how re-sends read the outbox tables (`source.snapshot*`).
    pub snapshot: crate::snapshot_plan::Plan,
    /// The schema ids of the registry formats (`None`: no format uses a registry).
    pub registry: Option<crate::registry::SchemaIds>,
    /// How value subjects are named (`schema_registry.subject_name_strategy`).
    pub subject_strategy: siphon_record::registered::SubjectStrategy,
}

/// What exactly-once delivery needs (`kafka.delivery = "exactly-once"`).
#[derive(Debug, Clone)]
pub struct ExactlyOnce {
    /// `kafka.transactional_id`; `None`: derived from the server, the database and the slot.
    pub transactional_id: Option<String>,
    /// Where each Kafka transaction's progress is committed.
    pub progress_topic: siphon_kafka_sink::ProgressTopic,
    /// When a Kafka transaction is committed.
    pub bounds: siphon_core::exactly_once::TransactionBounds,
}

/// Records and bytes in flight at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub records: usize,
    pub bytes: usize,
}

/// A re-send beside the stream (asked for by a signal row) takes one part in this many of
/// `pipeline.max_in_flight_records` and `max_in_flight_bytes`, for its records in flight and
/// for its chunks of rows; the stream keeps the rest.
pub const TRANSFER_SHARE: usize = 4;

impl PipelineSettings {
    /// The transfers' share of the window: at least one record and one byte.
    fn transfer_share(&self) -> Window {
        Window {
            records: (self.max_in_flight_records / TRANSFER_SHARE).max(1),
            bytes: (self.max_in_flight_bytes / TRANSFER_SHARE).max(1),
        }
    }

    /// The stream's window: all of it, less the transfers' share when signal rows may start
    /// re-sends beside the stream, so that the process holds no more than the configured
    /// window (or one record more) in flight.
    pub fn stream_window(&self) -> Window {
        if self.snapshot.signal_table.is_none() {
            return Window {
                records: self.max_in_flight_records,
                bytes: self.max_in_flight_bytes,
            };
        }
        let share = self.transfer_share();
        Window {
            records: self
                .max_in_flight_records
                .saturating_sub(share.records)
                .max(1),
            bytes: self.max_in_flight_bytes.saturating_sub(share.bytes).max(1),
        }
    }

    /// A transfer's window: the share when it runs beside the stream, all of it otherwise (an
    /// initial snapshot runs before the stream starts, `siphon resend` in a process of its
    /// own).
    pub fn transfer_window(&self, beside_stream: bool) -> Window {
        if beside_stream {
            self.transfer_share()
        } else {
            Window {
                records: self.max_in_flight_records,
                bytes: self.max_in_flight_bytes,
            }
        }
    }
}
