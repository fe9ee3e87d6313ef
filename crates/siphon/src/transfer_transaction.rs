//! Exactly-once delivery of the initial snapshot (`kafka.delivery = "exactly-once"`): its rows
//! are sent in Kafka transactions by a transactional producer with the stream's transactional
//! id, and each transaction ends with the snapshot's progress ([`TransferProgress`], under the
//! snapshot's key) in the progress topic. A snapshot resumed after a crash reads that progress
//! `read_committed`, so it resumes after exactly the rows committed.
//!
//! The id is the stream's own, not one derived from it: the snapshot runs before the stream of
//! the same process, never beside it, and one id means that any later registration of the
//! source (a resumed snapshot, or the stream once the snapshot is done) fences every earlier
//! producer of it, a zombie snapshot's included; operators grant Kafka's ACLs on one id.
//!
//! # Invariants
//! - The producer is registered (`init_transactions`) before the progress is read: an older
//!   producer of the source (a process killed in the snapshot, a zombie) is fenced and its
//!   open transaction aborted first, so nothing it sent after its last committed progress is
//!   ever shown to a read_committed consumer, and the progress read names the last rows
//!   committed.
//! - A transaction is committed only between chunks, once every record handed over in it (the
//!   rows' records and their dead letters) was acknowledged, with the progress naming the last
//!   key of its last chunk as its last record: a committed progress covers exactly the rows
//!   committed, which are every row before it in key order.
//! - A committed progress is used only for the snapshot that started it ([`resume_from`],
//!   [`TransferProgress::continues`], which `siphon status` asks too): a record left by an
//!   earlier slot of the same name is ignored.
//! - Nothing is committed once the transfer failed: it ends, and its open transaction is
//!   aborted (or by the next registration). A run of the snapshot ended by the broker's
//!   refusal of a record (with dead letters) is followed by another, from the last progress
//!   committed and in the same snapshot of the rows, on a producer registered anew, with the
//!   refused records as suspects ([`crate::snapshot`]).

use crate::error::PipelineError;
use crate::pipeline::{ExactlyOnce, PipelineSettings};
use crate::session::{transactional, KafkaDestination};
use crate::transfer::{Sender, TransferError, TransferProgress};
use bytes::Bytes;
use pgoutput::Lsn;
use siphon_core::exactly_once::TransactionBounds;
use siphon_kafka_sink::{KafkaSink, ProgressTopic, SinkError};
use siphon_router::RoutedRecord;
use siphon_source::ServerIdentity;
use std::sync::Arc;
use std::time::Duration;

/// Exactly-once: where a transfer's Kafka transactions stand, and where their progress goes.
pub struct Transactional {
    progress_topic: ProgressTopic,
    topic: Arc<str>,
    key: String,
    bounds: TransactionBounds,
    /// Bytes handed over in the open transaction (`None`: none open).
    open: Option<usize>,
}

impl Transactional {
    /// The transactional producer of the source of `settings` on `server`, registered
    /// (fencing older ones, aborting their open transaction), and the progress kept under
    /// `key` in the progress topic.
    pub async fn register(
        settings: &PipelineSettings,
        exactly_once: &ExactlyOnce,
        server: Option<&ServerIdentity>,
        key: String,
    ) -> Result<(Sender, Transactional), PipelineError> {
        let source = transactional::Source::new(settings, exactly_once, server)?;
        let (sink, deliveries) =
            transactional::register(&KafkaDestination, settings, exactly_once, &source, None)
                .await?;
        let sender = Sender { sink, deliveries };
        Ok((
            sender,
            Transactional {
                progress_topic: exactly_once.progress_topic.clone(),
                topic: Arc::from(exactly_once.progress_topic.topic()),
                key,
                bounds: exactly_once.bounds,
                open: None,
            },
        ))
    }

    /// The last progress committed under the key (read after the registration: see the
    /// module's invariants).
    pub async fn read(&self) -> Result<Option<TransferProgress>, TransferError> {
        match self
            .progress_topic
            .read_committed(self.key.as_bytes())
            .await?
        {
            Some(bytes) => {
                crate::transfer::parse_progress(&self.topic, &self.key, &bytes).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Before a record of `bytes` is handed to `sink`: a transaction begins unless one is open.
    pub fn before_send(&mut self, sink: &KafkaSink, bytes: usize) -> Result<(), SinkError> {
        let open = match self.open {
            Some(open) => open,
            None => {
                sink.begin_transaction()?;
                0
            }
        };
        self.open = Some(open.saturating_add(bytes));
        Ok(())
    }

    /// Whether the open transaction is to be committed at the end of this chunk, the last
    /// commit `since` ago: it is old or large enough.
    pub fn due(&self, since: Duration) -> bool {
        since >= self.bounds.max_age
            || self
                .open
                .is_some_and(|bytes| bytes >= self.bounds.max_bytes)
    }

    /// The open transaction was committed or aborted.
    pub fn ended(&mut self) {
        self.open = None;
    }

    /// Whether a transaction is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The record that commits `progress` in the open transaction.
    pub fn record(&self, progress: &TransferProgress) -> Result<RoutedRecord, TransferError> {
        let value = serde_json::to_vec(progress).map_err(|source| TransferError::Unreadable {
            topic: self.topic.to_string(),
            key: self.key.clone(),
            source,
        })?;
        Ok(RoutedRecord {
            topic: Arc::clone(&self.topic),
            key: Some(Bytes::from(self.key.clone())),
            value: Some(Bytes::from(value)),
            headers: Vec::new(),
            timestamp_ms: None,
            // Never moved by partitions added to the topic (see siphon_kafka_sink::compacted).
            partition: Some(siphon_kafka_sink::OWN_PARTITION),
        })
    }
}

/// Where an interrupted snapshot of the slot whose consistent point is `consistent_point`
/// resumes: after the progress `committed` in the progress topic when it is this snapshot's
/// ([`TransferProgress::continues`]); otherwise where the state topic's record `recorded` says
/// (no row of this snapshot was committed in a Kafka transaction).
pub fn resume_from(
    recorded: TransferProgress,
    committed: Option<TransferProgress>,
    consistent_point: Lsn,
) -> TransferProgress {
    match committed {
        Some(committed) if committed.continues(&recorded) => committed,
        _ => TransferProgress {
            id: consistent_point.to_string(),
            ..recorded
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::TransferKind;

    #[test]
    fn a_snapshot_resumes_from_its_own_committed_progress_only() {
        let point = Lsn(0x16_B374_D848);
        let recorded = TransferProgress::start(TransferKind::Snapshot, String::new(), None, "s");
        let mut committed = recorded.clone();
        committed.id = point.to_string();
        committed.table = Some("public.outbox".into());
        committed.after = Some(vec!["42".into()]);
        committed.rows_sent = 42;
        let resumed = resume_from(recorded.clone(), Some(committed.clone()), point);
        assert_eq!(resumed, committed);
        // Nothing committed yet, or only by an earlier slot of the same name: from where the
        // state topic says, for this consistent point.
        let mut stale = committed.clone();
        stale.id = Lsn(0x10).to_string();
        stale.started_ms = recorded.started_ms.saturating_sub(60_000);
        for committed in [None, Some(stale)] {
            let resumed = resume_from(recorded.clone(), committed, point);
            assert_eq!(resumed.id, point.to_string());
            assert_eq!((resumed.after, resumed.rows_sent), (None, 0));
        }
    }
}
