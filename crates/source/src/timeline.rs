//! The server's timeline history: which earlier timelines the current one continues, and where
//! each of them branched off.
//!
//! A promoted standby writes WAL on a new timeline. The new timeline's WAL before the point it
//! branched off (its switchpoint) is the WAL of the timeline it came from, so positions before
//! that point name the same transactions on both; positions at or after it may name others.
//! [`TimelineHistory`] is the history file PostgreSQL keeps for a timeline (`<tli>.history`),
//! read with the replication command `TIMELINE_HISTORY` ([`timeline_history`]), which every
//! replication connection accepts, logical ones included.
//!
//! # Invariants
//! - [`TimelineHistory::parse`] accepts only what PostgreSQL writes: one `<timeline>\t<switchpoint>`
//!   line per earlier timeline (the rest of a line is a reason, for people), comment and empty
//!   lines, timelines increasing and all before the current one; anything else is refused,
//!   never guessed at (a guess could skip events).
//! - Timeline 1 has no history: it is never asked for.
//! - A server without the history file (SQLSTATE 58P01, undefined file) answers
//!   `Ok(None)`: the history is unknown, and no earlier timeline's position is used.

use crate::error::{ProtocolFault, SourceOperation, Subject};
use crate::names::Endpoint;
pub use crate::names::HistoryError;
use crate::sqlstate::SqlState;
use crate::wire::{Session, WireError};
use crate::{ConnectionParams, SourceConfig, SourceError};
use pgoutput::Lsn;

/// An earlier timeline of a history, and where the next one branched off it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The earlier timeline.
    pub timeline: u32,
    /// Where its WAL stops being the current timeline's: positions before it are the same WAL
    /// on both, positions at or after it are not.
    pub switchpoint: Lsn,
}

/// The history of `timeline`: the earlier timelines it continues, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineHistory {
    timeline: u32,
    branches: Vec<Branch>,
}

impl TimelineHistory {
    /// The history of `timeline` made of `branches` (oldest first; the caller vouches for the
    /// order, as [`TimelineHistory::parse`] checks it).
    pub fn new(timeline: u32, branches: Vec<Branch>) -> Self {
        TimelineHistory { timeline, branches }
    }

    /// The history of a timeline nothing came before (timeline 1, a new cluster).
    pub fn first(timeline: u32) -> Self {
        TimelineHistory::new(timeline, Vec::new())
    }

    /// The history file `content` of `timeline`.
    pub fn parse(timeline: u32, content: &str) -> Result<Self, HistoryError> {
        let mut branches: Vec<Branch> = Vec::new();
        for (number, line) in content.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let unreadable = || HistoryError::Line {
                timeline,
                line: number + 1,
                text: line.to_owned(),
            };
            let mut fields = trimmed.split('\t');
            let listed: u32 = fields
                .next()
                .and_then(|f| f.trim().parse().ok())
                .ok_or_else(unreadable)?;
            let switchpoint: Lsn = fields
                .next()
                .and_then(|f| f.trim().parse().ok())
                .ok_or_else(unreadable)?;
            let previous = branches.last().map_or(0, |b| b.timeline);
            if listed <= previous || listed >= timeline {
                return Err(HistoryError::Order {
                    timeline,
                    listed,
                    previous,
                });
            }
            branches.push(Branch {
                timeline: listed,
                switchpoint,
            });
        }
        Ok(TimelineHistory { timeline, branches })
    }

    /// The timeline whose history this is.
    pub fn timeline(&self) -> u32 {
        self.timeline
    }

    /// The earlier timelines, oldest first.
    pub fn branches(&self) -> &[Branch] {
        &self.branches
    }

    /// How much of `timeline`'s WAL is this timeline's too: `Some(None)` all of it (it is this
    /// timeline), `Some(Some(switchpoint))` what precedes the switchpoint, `None` none (not a
    /// timeline of this history: a sibling branch, a later timeline, another cluster's).
    pub fn shared_until(&self, timeline: u32) -> Option<Option<Lsn>> {
        if timeline == self.timeline {
            return Some(None);
        }
        self.branches
            .iter()
            .find(|b| b.timeline == timeline)
            .map(|b| Some(b.switchpoint))
    }
}

/// The history of `timeline` as the server at `endpoint` keeps it, over a replication
/// connection; `Ok(None)` when the server has no history file for it.
pub async fn timeline_history(
    config: &SourceConfig,
    endpoint: &Endpoint,
    timeline: u32,
) -> Result<Option<TimelineHistory>, SourceError> {
    if timeline <= 1 {
        return Ok(Some(TimelineHistory::first(timeline)));
    }
    let params = ConnectionParams::from_url(&config.url)?;
    let login = crate::stream::replication_login(config, &params, endpoint)?;
    let subject = Subject {
        slot: Some(&config.slot),
        user: Some(&params.user),
        login: None,
    };
    let failed = |operation, e| SourceError::from_replication_about(operation, subject, e);
    let mut session = Session::connect(login)
        .await
        .map_err(|e| failed(SourceOperation::ReplicationLogin, e))?;
    let rows = match session
        .simple_query(&format!("TIMELINE_HISTORY {timeline}"))
        .await
    {
        Ok(rows) => rows,
        Err(WireError::Server(error)) if error.code == SqlState::UNDEFINED_FILE => return Ok(None),
        Err(e) => return Err(failed(SourceOperation::TimelineHistory, e)),
    };
    // One row: the file's name, then its content.
    let content = rows
        .first()
        .and_then(|row| row.get(1))
        .and_then(|value| value.as_deref())
        .unwrap_or_default();
    TimelineHistory::parse(timeline, content)
        .map(Some)
        .map_err(|e| ProtocolFault::TimelineHistory(e).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_file_reads_as_postgresql_writes_it() {
        let content = "1\t0/3000158\tno recovery target specified\n\n\
                       # a comment\n\
                       2\t0/5000000\tat restore point \"before\"\n\
                       4\t1/A0\tno recovery target specified\n";
        let history = TimelineHistory::parse(5, content).expect("parses");
        assert_eq!(history.timeline(), 5);
        assert_eq!(
            history.branches(),
            &[
                Branch {
                    timeline: 1,
                    switchpoint: Lsn(0x300_0158)
                },
                Branch {
                    timeline: 2,
                    switchpoint: Lsn(0x500_0000)
                },
                Branch {
                    timeline: 4,
                    switchpoint: Lsn(0x1_0000_00A0)
                },
            ]
        );
        assert_eq!(history.shared_until(5), Some(None));
        assert_eq!(history.shared_until(1), Some(Some(Lsn(0x300_0158))));
        assert_eq!(history.shared_until(4), Some(Some(Lsn(0x1_0000_00A0))));
        // A sibling branch (3 branched off 2 elsewhere), a later timeline.
        assert_eq!(history.shared_until(3), None);
        assert_eq!(history.shared_until(6), None);
        assert_eq!(TimelineHistory::first(1).shared_until(1), Some(None));
        assert_eq!(TimelineHistory::first(1).shared_until(2), None);
    }

    #[test]
    fn anything_else_is_refused() {
        for (content, line) in [
            ("1 0/3000158 spaces\n", 1),
            ("1\n", 1),
            ("x\t0/1\treason\n", 1),
            ("1\t0/1\tok\n1\t3000158\tno slash\n", 2),
        ] {
            let err = TimelineHistory::parse(3, content);
            assert!(
                matches!(err, Err(HistoryError::Line { line: l, .. }) if l == line),
                "{content:?}: {err:?}"
            );
        }
        assert_eq!(
            TimelineHistory::parse(3, "2\t0/1\tr\n1\t0/2\tr\n"),
            Err(HistoryError::Order {
                timeline: 3,
                listed: 1,
                previous: 2
            })
        );
        assert_eq!(
            TimelineHistory::parse(2, "2\t0/1\tr\n"),
            Err(HistoryError::Order {
                timeline: 2,
                listed: 2,
                previous: 0
            })
        );
    }
}
