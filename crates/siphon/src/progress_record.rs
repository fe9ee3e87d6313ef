//! Exactly-once delivery's progress record: what each Kafka transaction of a source commits to
//! the progress topic, and how a new session reads it back.
//!
//! # Invariants
//! - One key per source (server system identifier, database and slot, [`key`]); its value is the
//!   JSON of [`Recorded`], written by the transactional producer as the last record of each
//!   Kafka transaction, so it is committed or aborted with the records it describes.
//! - A record of another version, or one that does not parse, is refused (the operator is told
//!   which key to delete), never guessed at: guessing could skip events.
//! - A progress is used to skip records only on the server timeline it was written on: after a
//!   failover to a new timeline, positions past the branch point may name other transactions,
//!   so the session then relies on the slot's position alone (and may repeat events).

use pgoutput::Lsn;
use serde::{Deserialize, Serialize};
use siphon_core::exactly_once::{Progress, Through};
use std::fmt;

/// The format of [`Recorded`]; a record of another version is refused, not guessed at.
const VERSION: u32 = 1;

/// The key of the progress of `slot` in `database` on the server with `system_id`.
pub fn key(system_id: &str, database: &str, slot: &str) -> String {
    format!("siphon/progress/{system_id}/{database}/{slot}")
}

/// The default `transactional.id` of `slot` in `database` on the server with `system_id`: one
/// per source, so a second instance on the same slot fences the first.
pub fn transactional_id(system_id: &str, database: &str, slot: &str) -> String {
    format!("siphon-{system_id}-{database}-{slot}")
}

/// What is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub version: u32,
    /// `<system identifier>/<slot>`, as the `siphon.source` header names it.
    pub source: String,
    pub database: String,
    /// The server's timeline when the progress was committed.
    pub timeline: u32,
    /// The commit LSN of the transaction of the last committed record.
    pub commit_lsn: String,
    /// Where that transaction ended (`None`: not complete in this Kafka transaction).
    pub end_lsn: Option<String>,
    /// The index of the last committed record of that transaction (`None`: all of it).
    pub last_index: Option<u32>,
}

impl Recorded {
    /// The record of `progress` on `timeline`.
    pub fn new(source: &str, database: &str, timeline: u32, progress: &Progress) -> Self {
        Recorded {
            version: VERSION,
            source: source.to_owned(),
            database: database.to_owned(),
            timeline,
            commit_lsn: progress.commit_lsn.to_string(),
            end_lsn: progress.end_lsn.map(|lsn| lsn.to_string()),
            last_index: match progress.through {
                Through::All => None,
                Through::Record(index) => Some(index),
            },
        }
    }

    /// The JSON value written to the progress topic.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and integers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record in `value` under `key`.
    pub fn parse(key: &str, value: &[u8]) -> Result<Self, ProgressRecordError> {
        let unreadable = || ProgressRecordError::Unreadable {
            key: key.to_owned(),
        };
        let recorded: Recorded = serde_json::from_slice(value).map_err(|_| unreadable())?;
        if recorded.version != VERSION {
            return Err(ProgressRecordError::Version {
                key: key.to_owned(),
                version: recorded.version,
            });
        }
        recorded.progress().ok_or_else(unreadable)?;
        Ok(recorded)
    }

    /// The progress it records (`None` if a position does not parse).
    pub fn progress(&self) -> Option<Progress> {
        Some(Progress {
            commit_lsn: self.commit_lsn.parse::<Lsn>().ok()?,
            through: match self.last_index {
                None => Through::All,
                Some(index) => Through::Record(index),
            },
            end_lsn: match &self.end_lsn {
                None => None,
                Some(lsn) => Some(lsn.parse::<Lsn>().ok()?),
            },
        })
    }

    /// The progress to skip by on a server now on `timeline`, `None` when it was written on
    /// another timeline (see the module's invariants).
    pub fn progress_on(&self, timeline: u32) -> Option<Progress> {
        (self.timeline == timeline)
            .then(|| self.progress())
            .flatten()
    }
}

/// A progress record that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressRecordError {
    #[error("the progress record {key:?} in the progress topic is not one Siphon wrote; delete it (a tombstone for the key) only if no Siphon with kafka.delivery = \"exactly-once\" ever committed to this slot, since events may then be sent twice")]
    Unreadable { key: String },
    #[error("the progress record {key:?} in the progress topic has version {version}, which this Siphon does not know; run the Siphon version that wrote it, or a later one")]
    Version { key: String, version: u32 },
}

impl fmt::Display for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (commit {}", self.source, self.commit_lsn)?;
        match (self.last_index, &self.end_lsn) {
            (Some(index), _) => write!(f, ", through record {index})"),
            (None, Some(end)) => write!(f, ", end {end})"),
            (None, None) => f.write_str(")"),
        }
    }
}

/// What `siphon status` shows of the delivery mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveryStatus {
    /// `at-least-once` or `exactly-once`.
    pub mode: &'static str,
    pub transactional_id: Option<String>,
    pub progress_topic: Option<String>,
    /// The last committed progress (exactly-once; `None`: nothing committed yet).
    pub committed: Option<Recorded>,
}

impl DeliveryStatus {
    /// At-least-once delivery: nothing more to show.
    pub fn at_least_once() -> Self {
        DeliveryStatus {
            mode: "at-least-once",
            transactional_id: None,
            progress_topic: None,
            committed: None,
        }
    }

    /// Exactly-once delivery with the producer `transactional_id`, committing to
    /// `progress_topic`, whose last committed progress is `committed`.
    pub fn exactly_once(
        transactional_id: &str,
        progress_topic: &str,
        committed: Option<Recorded>,
    ) -> Self {
        DeliveryStatus {
            mode: "exactly-once",
            transactional_id: Some(transactional_id.to_owned()),
            progress_topic: Some(progress_topic.to_owned()),
            committed,
        }
    }

    /// `key: value` lines, as `siphon status` prints them.
    pub fn render_text(&self) -> String {
        let mut out = format!("delivery: {}\n", self.mode);
        if let Some(id) = &self.transactional_id {
            out.push_str(&format!("transactional id: {id}\n"));
        }
        if let Some(topic) = &self.progress_topic {
            out.push_str(&format!("progress topic: {topic}\n"));
            match &self.committed {
                Some(recorded) => out.push_str(&format!("committed progress: {recorded}\n")),
                None => out.push_str("committed progress: none yet\n"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_reads_back_as_written() {
        for progress in [
            Progress {
                commit_lsn: Lsn(0x16_B374_D848),
                through: Through::All,
                end_lsn: Some(Lsn(0x16_B374_D900)),
            },
            Progress {
                commit_lsn: Lsn(0x17),
                through: Through::Record(41),
                end_lsn: None,
            },
        ] {
            let recorded = Recorded::new("7311/s", "app", 3, &progress);
            let back = Recorded::parse("k", &recorded.to_json()).expect("parses");
            assert_eq!(back, recorded);
            assert_eq!(back.progress_on(3), Some(progress));
            assert_eq!(back.progress_on(4), None, "another timeline");
        }
    }

    #[test]
    fn status_shows_the_mode_and_the_committed_progress() {
        assert_eq!(
            DeliveryStatus::at_least_once().render_text(),
            "delivery: at-least-once\n"
        );
        let recorded = Recorded::new(
            "7311/s",
            "app",
            1,
            &Progress {
                commit_lsn: Lsn(0x16_B374_D848),
                through: Through::All,
                end_lsn: Some(Lsn(0x16_B374_D900)),
            },
        );
        let text =
            DeliveryStatus::exactly_once("siphon-7311-app-s", "siphon.progress", Some(recorded))
                .render_text();
        assert!(text.contains("delivery: exactly-once\n"), "{text}");
        assert!(
            text.contains("transactional id: siphon-7311-app-s\n"),
            "{text}"
        );
        assert!(
            text.contains("committed progress: 7311/s (commit 16/B374D848, end 16/B374D900)"),
            "{text}"
        );
        assert!(DeliveryStatus::exactly_once("t", "p", None)
            .render_text()
            .contains("committed progress: none yet"));
    }

    #[test]
    fn a_record_that_is_not_ours_is_refused_naming_the_key() {
        let err = Recorded::parse("siphon/progress/1/app/s", b"{}").expect_err("not ours");
        assert!(matches!(err, ProgressRecordError::Unreadable { .. }));
        assert!(err.to_string().contains("siphon/progress/1/app/s"), "{err}");
        let mut recorded = Recorded::new(
            "1/s",
            "app",
            1,
            &Progress {
                commit_lsn: Lsn(1),
                through: Through::All,
                end_lsn: None,
            },
        );
        recorded.version = 9;
        let err = Recorded::parse("k", &recorded.to_json()).expect_err("a later version");
        assert_eq!(
            err,
            ProgressRecordError::Version {
                key: "k".into(),
                version: 9
            }
        );
        recorded.version = VERSION;
        recorded.commit_lsn = "nowhere".into();
        assert!(Recorded::parse("k", &recorded.to_json()).is_err());
    }
}
