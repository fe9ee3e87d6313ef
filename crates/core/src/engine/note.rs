//! What the session engine noticed, as plain values: the driver writes the log lines and moves
//! the metrics; the engine holds no metrics registry and writes no telemetry itself.
//!
//! # Invariants
//! - A note says what happened, not how it is shown: every label and log field comes from its
//!   own fields.
//! - Per-record notes carry no formatted text: a topic is the record's shared name, an error
//!   the typed value, rendered only where (and if) it is logged.

use pgoutput::Lsn;
use siphon_router::{LogLevel, SkipReason};
use std::fmt::{self, Display};
use std::sync::Arc;
use std::time::Duration;

/// An error or a reason kept for a log line, rendered only if the line is written.
pub type Shown = Box<dyn Display + Send + Sync>;

/// How a failed delivery is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Retrying (sending again, reconnecting) can cure it.
    Transient,
    /// The record can never be delivered as it is.
    Definite,
}

/// Something the core noticed, for the log and the metrics.
pub enum Note {
    /// A change or logical message of the stream was read (and handled).
    EventRead,
    /// A registry-format record's schema id was known already (`true`) or is looked up.
    SchemaId { known: bool },
    /// A payload did not fit the schema registered for it.
    SchemaMisfit,
    /// A PostgreSQL transaction was read to its commit.
    Transaction,
    /// The time from a transaction's commit to its Begin being read.
    CommitToRead(Duration),
    /// The time from a transaction's commit to the acknowledgement of one of its records.
    CommitToAck(Duration),
    /// The time from a record's hand-over to its acknowledgement.
    SendToAck(Duration),
    /// A row became a record for `topic`; `produced`: it was handed to the producer.
    Routed { topic: Arc<str>, produced: bool },
    /// A record for `topic` (a dead letter) was handed to the producer.
    Produced { topic: Arc<str> },
    /// A DELETE of an outbox row was deliberately not sent.
    DeleteSkipped,
    /// A row was deliberately not sent for another reason than a DELETE.
    RowSkipped {
        table: String,
        reason: SkipReason,
        level: LogLevel,
    },
    /// A row of another (published, not outbox) table.
    OtherTableRow,
    /// A non-transactional logical message of an outbox prefix, skipped by configuration.
    NonTransactionalMessageSkipped { prefix: String, lsn: Lsn },
    /// A row could not be routed; it went to the dead-letter topic.
    RowDeadLettered {
        table: String,
        lsn: Lsn,
        error: Shown,
        dead_letter_topic: String,
    },
    /// An outbox table cannot be routed; its rows will go to the dead-letter topic.
    TableUnroutable { table: String, error: Shown },
    /// Kafka refused a record for good; it went to the dead-letter topic.
    RecordDeadLettered { topic: Arc<str>, error: Shown },
    /// A record's delivery failed (it is sent again, or handled as refused).
    DeliveryFailed {
        topic: Arc<str>,
        error: Shown,
        kind: FailureKind,
    },
    /// The producer did not take a record; it is sent again after a pause.
    RecordNotTaken { topic: Arc<str>, error: Shown },
    /// A record waited longer than the delivery timeout: the producer is purged and replaced.
    DeliveryOverdue { unacked: usize },
    /// The producer is replaced; its undelivered records are sent again in their order.
    /// `cause`: the first delivery failure that called for it, or the delivery deadline.
    ProducerReplaced {
        resend: usize,
        cause: Option<String>,
    },
}

impl Note {
    /// A row skipped for `reason`: a DELETE is only counted, so its table is not named.
    pub fn skipped(table: impl Display, reason: SkipReason, level: LogLevel) -> Note {
        match reason {
            SkipReason::Delete => Note::DeleteSkipped,
            reason => Note::RowSkipped {
                table: table.to_string(),
                reason,
                level,
            },
        }
    }
}

impl fmt::Debug for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::EventRead => f.write_str("EventRead"),
            Note::SchemaId { known } => write!(f, "SchemaId({known})"),
            Note::SchemaMisfit => f.write_str("SchemaMisfit"),
            Note::Transaction => f.write_str("Transaction"),
            Note::CommitToRead(d) => write!(f, "CommitToRead({d:?})"),
            Note::CommitToAck(d) => write!(f, "CommitToAck({d:?})"),
            Note::SendToAck(d) => write!(f, "SendToAck({d:?})"),
            Note::Routed { topic, produced } => write!(f, "Routed({topic}, {produced})"),
            Note::Produced { topic } => write!(f, "Produced({topic})"),
            Note::DeleteSkipped => f.write_str("DeleteSkipped"),
            Note::RowSkipped { table, reason, .. } => write!(f, "RowSkipped({table}, {reason:?})"),
            Note::OtherTableRow => f.write_str("OtherTableRow"),
            Note::NonTransactionalMessageSkipped { prefix, lsn } => {
                write!(f, "NonTransactionalMessageSkipped({prefix}, {lsn})")
            }
            Note::RowDeadLettered {
                table, lsn, error, ..
            } => write!(f, "RowDeadLettered({table}, {lsn}, {error})"),
            Note::TableUnroutable { table, error } => {
                write!(f, "TableUnroutable({table}, {error})")
            }
            Note::RecordDeadLettered { topic, error } => {
                write!(f, "RecordDeadLettered({topic}, {error})")
            }
            Note::DeliveryFailed { topic, error, kind } => {
                write!(f, "DeliveryFailed({topic}, {error}, {kind:?})")
            }
            Note::RecordNotTaken { topic, error } => write!(f, "RecordNotTaken({topic}, {error})"),
            Note::DeliveryOverdue { unacked } => write!(f, "DeliveryOverdue({unacked})"),
            Note::ProducerReplaced { resend, cause } => {
                write!(f, "ProducerReplaced({resend}, {cause:?})")
            }
        }
    }
}
