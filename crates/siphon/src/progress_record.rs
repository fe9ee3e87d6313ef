//! Exactly-once delivery's progress record: what each Kafka transaction of a source commits to
//! the progress topic, and how a new session reads it back.
//!
//! # Invariants
//! - One key per source (server system identifier, database and slot, [`key`]); its value is the
//!   JSON of [`Recorded`], written by the transactional producer as the last record of each
//!   Kafka transaction, so it is committed or aborted with the records it describes.
//! - A record of another version, or one that does not parse, is refused (the operator is told
//!   which key to delete), never guessed at: guessing could skip events.
//! - A progress is used to skip records only where its positions name the same transactions
//!   ([`usable_on`]): on the server timeline it was written on as it is; on a later timeline
//!   whose history continues it (a promoted standby's) only up to where the later one branched
//!   off, since positions past that switchpoint name other transactions; on any other timeline
//!   (a sibling branch, or a history that cannot be read) not at all, the session then relying
//!   on the slot's position alone (and possibly repeating events).

use pgoutput::Lsn;
use serde::{Deserialize, Serialize};
use siphon_core::exactly_once::{Progress, Through};
use siphon_source::timeline::TimelineHistory;
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

    /// The progress to skip by on a server now on `timeline`, whose history is `history`
    /// (`None`: unknown); see [`usable_on`].
    pub fn progress_on(&self, timeline: u32, history: Option<&TimelineHistory>) -> OnTimeline {
        match self.progress() {
            Some(progress) => usable_on(progress, self.timeline, timeline, history),
            None => OnTimeline::Unrelated,
        }
    }
}

/// How a progress recorded on one timeline may be used on the server's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeline {
    /// Recorded on the current timeline: as it is.
    Same(Progress),
    /// Recorded on an earlier timeline the current one continues, which branched off at
    /// `switchpoint`: what it covers before the switchpoint (`capped`: it went past it, so only
    /// the transactions before it are skipped).
    Earlier {
        progress: Progress,
        switchpoint: Lsn,
        capped: bool,
    },
    /// Recorded on a timeline the current one does not continue (a sibling branch, a later
    /// one), or the current one's history is unknown: not usable.
    Unrelated,
}

impl OnTimeline {
    /// The progress to skip by, if any.
    pub fn progress(&self) -> Option<Progress> {
        match self {
            OnTimeline::Same(progress) | OnTimeline::Earlier { progress, .. } => Some(*progress),
            OnTimeline::Unrelated => None,
        }
    }
}

/// What of `progress`, recorded on timeline `recorded_on`, may be skipped by on timeline
/// `current`, whose history is `history` (`None`: unknown; a history of another timeline is
/// unknown too). A record is covered by the result if and only if `progress` covers it and
/// its transaction committed before the switchpoint where `recorded_on` stopped being part of
/// `current` (WAL before it is the same on both timelines, WAL at or after it is not).
pub fn usable_on(
    progress: Progress,
    recorded_on: u32,
    current: u32,
    history: Option<&TimelineHistory>,
) -> OnTimeline {
    if recorded_on == current {
        return OnTimeline::Same(progress);
    }
    let switchpoint = match history
        .filter(|h| h.timeline() == current)
        .and_then(|h| h.shared_until(recorded_on))
    {
        Some(Some(switchpoint)) => switchpoint,
        // `Some(None)` is the current timeline, handled above.
        Some(None) | None => return OnTimeline::Unrelated,
    };
    if progress.commit_lsn < switchpoint {
        // A commit record that starts before the switchpoint ends at or before it.
        OnTimeline::Earlier {
            progress,
            switchpoint,
            capped: false,
        }
    } else {
        OnTimeline::Earlier {
            progress: Progress::everything_before(switchpoint),
            switchpoint,
            capped: true,
        }
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
    use siphon_source::timeline::Branch;

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
            assert_eq!(back.progress_on(3, None), OnTimeline::Same(progress));
            assert_eq!(
                back.progress_on(4, None),
                OnTimeline::Unrelated,
                "another timeline, no history"
            );
        }
    }

    fn history(timeline: u32, branches: &[(u32, u64)]) -> TimelineHistory {
        TimelineHistory::new(
            timeline,
            branches
                .iter()
                .map(|&(timeline, switchpoint)| Branch {
                    timeline,
                    switchpoint: Lsn(switchpoint),
                })
                .collect(),
        )
    }

    fn at(commit: u64, through: Through) -> Progress {
        Progress {
            commit_lsn: Lsn(commit),
            through,
            end_lsn: None,
        }
    }

    #[test]
    fn a_progress_of_an_earlier_timeline_holds_up_to_its_switchpoint() {
        // Timeline 1 ended at 1000 (2 began there), 2 at 2000 (3 began there).
        let three = history(3, &[(1, 1000), (2, 2000)]);
        let before = at(900, Through::Record(4));
        assert_eq!(
            usable_on(before, 1, 3, Some(&three)),
            OnTimeline::Earlier {
                progress: before,
                switchpoint: Lsn(1000),
                capped: false
            }
        );
        // Past the switchpoint (the old primary went on alone): only what precedes it.
        let past = usable_on(at(1500, Through::All), 1, 3, Some(&three));
        assert_eq!(
            past,
            OnTimeline::Earlier {
                progress: Progress::everything_before(Lsn(1000)),
                switchpoint: Lsn(1000),
                capped: true
            }
        );
        let past = past.progress().expect("usable");
        assert!(past.covers(Lsn(992), 0) && !past.covers(Lsn(1000), 0));
        assert!(usable_on(at(1500, Through::All), 2, 3, Some(&three))
            .progress()
            .is_some_and(|p| p.covers_all_of(Lsn(1500))));
        // The current timeline: as it is, history or not.
        let late = at(5000, Through::All);
        assert_eq!(usable_on(late, 3, 3, None), OnTimeline::Same(late));
        // A sibling (4 branched off 2 elsewhere), a later timeline, an unknown history, the
        // history of another timeline.
        assert_eq!(usable_on(before, 4, 3, Some(&three)), OnTimeline::Unrelated);
        assert_eq!(usable_on(before, 5, 3, Some(&three)), OnTimeline::Unrelated);
        assert_eq!(usable_on(before, 1, 3, None), OnTimeline::Unrelated);
        assert_eq!(usable_on(before, 1, 4, Some(&three)), OnTimeline::Unrelated);
    }

    proptest::proptest! {
        /// A record is skipped on the current timeline exactly when the recorded progress
        /// covers it and its transaction precedes the recorded timeline's switchpoint; a
        /// timeline outside the history skips nothing.
        #[test]
        fn the_usable_progress_covers_what_the_recorded_one_covers_before_the_switchpoint(
            steps in proptest::collection::vec((1u32..3, 1u64..400), 0..6),
            current_gap in 1u32..3,
            recorded_on in 1u32..20,
            commit in 0u64..3000,
            through in proptest::option::of(0u32..5),
            probes in proptest::collection::vec((0u64..3000, 0u32..6), 1..40),
        ) {
            // A history of increasing timelines and switchpoints (records end at least 24
            // bytes apart, as WAL records do).
            let (mut timeline, mut lsn, mut branches) = (0u32, 0u64, Vec::new());
            for (gap, length) in steps {
                timeline += gap;
                lsn += 24 + length;
                branches.push((timeline, lsn));
            }
            let current = timeline + current_gap;
            let history = history(current, &branches);
            let recorded = at(commit, through.map_or(Through::All, Through::Record));
            let usable = usable_on(recorded, recorded_on, current, Some(&history));
            let shared_until = if recorded_on == current {
                Some(u64::MAX)
            } else {
                branches.iter().find(|(t, _)| *t == recorded_on).map(|(_, sp)| *sp)
            };
            match shared_until {
                None => proptest::prop_assert_eq!(usable, OnTimeline::Unrelated),
                Some(switchpoint) => {
                    let progress = usable.progress();
                    proptest::prop_assert!(progress.is_some());
                    let progress = progress.unwrap_or(recorded);
                    for (probe, index) in probes {
                        proptest::prop_assert_eq!(
                            progress.covers(Lsn(probe), index),
                            recorded.covers(Lsn(probe), index) && probe < switchpoint,
                            "probe {} index {}", probe, index
                        );
                    }
                }
            }
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
