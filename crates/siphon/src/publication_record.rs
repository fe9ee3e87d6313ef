//! The publication's membership as Siphon last saw it, kept in the Kafka state topic so that a
//! publication gap that opened and closed while Siphon was stopped is noticed at the next start.
//!
//! PostgreSQL decodes each change with the publication as it was when the change was written:
//! an outbox table taken out of the publication and added back (or the publication dropped and
//! created again) while nothing streamed leaves the events of the gap unpublished, and a look at
//! the catalog afterwards finds everything healthy. The catalog rows behind the membership
//! ([`siphon_source::Membership`]) are new ones after such a gap: comparing them with the ones
//! recorded by the last run tells.
//!
//! # Invariants
//! - One record per server (system identifier) and slot, under [`key`]; its value is the JSON of
//!   [`Recorded`], the last one written wins.
//! - A process starts streaming only after the recorded membership was compared with the one
//!   it found and, when they differ without a gap, the new one was written; a publication check
//!   of the running session that finds other rows without a gap records them too: a later start
//!   compares with the last membership seen. (Reconnects within one process compare with the
//!   previous session's look and need no broker to start streaming.)
//! - A slot that does not exist yet or that this start created has no gap (nothing was
//!   committed in it before it existed): the membership is recorded without comparing, since
//!   the record may be that of a slot of the same name dropped since (the documented way to
//!   take a snapshot again).
//! - A gap found is a definite error; only `siphon accept-publication-change` (after the
//!   operator dealt with the gap) records the membership as it is now.
//! - Nothing is recorded or compared when the server's system identifier is unknown (a warning
//!   says so): a record keyed by slot alone could be another cluster's.
//! - Nothing is recorded or compared without a state topic (`kafka.state_topic = ""`) or for a
//!   logical-message outbox (no tables: PostgreSQL sends messages whatever the publication).

use serde::{Deserialize, Serialize};
use siphon_kafka_sink::{StateTopic, StateTopicError};
use siphon_source::membership::{self, MembershipChange, Publisher};
use siphon_source::{Membership, TableName};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The format of [`Recorded`]; a record of another version is refused, not guessed at.
const VERSION: u32 = 1;

/// The key of the record of `slot` on the server with `system_id`.
pub fn key(system_id: Option<&str>, slot: &str) -> String {
    format!(
        "siphon/publication/{}/{slot}",
        system_id.unwrap_or("unknown")
    )
}

/// What is recorded: the publication's catalog rows for each outbox table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub version: u32,
    pub system_id: Option<String>,
    pub slot: String,
    pub publication: String,
    pub publication_oid: u32,
    pub tables: Vec<RecordedTable>,
}

/// One outbox table and the catalog rows publishing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedTable {
    pub schema: String,
    pub name: String,
    /// `pg_publication_rel` oids.
    pub table_rows: Vec<u32>,
    /// `pg_publication_namespace` oids.
    pub schema_rows: Vec<u32>,
}

impl Recorded {
    /// The record of `membership`, seen on `system_id` through `slot`.
    pub fn new(
        system_id: Option<&str>,
        slot: &str,
        publication: &str,
        membership: &Membership,
    ) -> Self {
        Recorded {
            version: VERSION,
            system_id: system_id.map(str::to_owned),
            slot: slot.to_owned(),
            publication: publication.to_owned(),
            publication_oid: membership.publication,
            tables: membership
                .tables
                .iter()
                .map(|(table, rows)| {
                    let mut recorded = RecordedTable {
                        schema: table.schema.clone(),
                        name: table.name.clone(),
                        table_rows: Vec::new(),
                        schema_rows: Vec::new(),
                    };
                    for row in rows {
                        match row {
                            Publisher::Table(oid) => recorded.table_rows.push(*oid),
                            Publisher::Schema(oid) => recorded.schema_rows.push(*oid),
                        }
                    }
                    recorded
                })
                .collect(),
        }
    }

    /// The membership recorded.
    pub fn membership(&self) -> Membership {
        Membership {
            publication: self.publication_oid,
            tables: self
                .tables
                .iter()
                .map(|t| {
                    let rows: BTreeSet<Publisher> = t
                        .table_rows
                        .iter()
                        .map(|oid| Publisher::Table(*oid))
                        .chain(t.schema_rows.iter().map(|oid| Publisher::Schema(*oid)))
                        .collect();
                    (
                        TableName {
                            schema: t.schema.clone(),
                            name: t.name.clone(),
                        },
                        rows,
                    )
                })
                .collect::<BTreeMap<_, _>>(),
        }
    }
}

/// Why the recorded membership could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading or writing the state topic failed.
    #[error(transparent)]
    State(#[from] StateTopicError),
    /// The record is not one this version of Siphon wrote.
    #[error("the record {key:?} in Kafka topic {topic:?} is not one this version of Siphon can read ({problem}): delete it (a record with that key and no value), then run `siphon accept-publication-change` to record the publication as it is now")]
    Unreadable {
        topic: String,
        key: String,
        problem: Unreadable,
    },
    /// The server does not say which cluster it is, which keys the record.
    #[error("the server's system identifier is not readable (SELECT system_identifier FROM pg_control_system()), which names the record: grant EXECUTE on pg_control_system() to Siphon's user")]
    UnknownServer,
    /// A gap opened and closed while Siphon was not running.
    #[error("{}", GapMessage(self))]
    GapWhileStopped {
        change: MembershipChange,
        publication: String,
        slot: String,
        topic: String,
    },
}

/// What is wrong with an unreadable record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Not JSON of the expected shape.
    Malformed,
    /// Written by another format version.
    Version(u32),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::Malformed => f.write_str("not the JSON Siphon writes"),
            Unreadable::Version(v) => write!(f, "format version {v}, this Siphon reads {VERSION}"),
        }
    }
}

struct GapMessage<'a>(&'a RecordError);

impl fmt::Display for GapMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let RecordError::GapWhileStopped {
            change,
            publication,
            slot,
            topic,
        } = self.0
        else {
            return Ok(());
        };
        match change {
            MembershipChange::PublicationRecreated => write!(
                f,
                "publication \"{publication}\" was dropped and created again since Siphon last streamed from slot \"{slot}\""
            )?,
            MembershipChange::TableAddedBack(table) => write!(
                f,
                "outbox table {} was taken out of publication \"{publication}\" and added back since Siphon last streamed from slot \"{slot}\"",
                table.quoted()
            )?,
        }
        write!(
            f,
            " (the membership Siphon saw is recorded in Kafka topic \"{topic}\"): PostgreSQL did not publish the events committed in between, so they cannot be read from this slot and were not sent to Kafka; re-send them from the application if consumers need them (the outbox rows committed in that time), then run `siphon accept-publication-change --config <this file>` to accept the publication as it is now, and start Siphon again"
        )?;
        if matches!(change, MembershipChange::PublicationRecreated) {
            // PostgreSQL before 18 refuses to decode a change written while a publication of
            // the stream was missing; that error names the way past it.
            f.write_str(" (on PostgreSQL before 18 the server may then stop at the first change written while the publication was missing, saying it does not exist; that error names how to move the slot past it)")?;
        }
        Ok(())
    }
}

impl RecordError {
    /// What the failure means for the process.
    pub fn consequence(&self) -> siphon_core::Consequence {
        match self {
            RecordError::State(e) => e.consequence(),
            RecordError::Unreadable { .. }
            | RecordError::GapWhileStopped { .. }
            | RecordError::UnknownServer => siphon_core::Consequence::Fix,
        }
    }
}

/// The record of `slot` on `system_id`, if any.
async fn read(
    state: &StateTopic,
    system_id: Option<&str>,
    slot: &str,
) -> Result<Option<Recorded>, RecordError> {
    let key = key(system_id, slot);
    let Some(bytes) = state.read(key.as_bytes()).await? else {
        return Ok(None);
    };
    let unreadable = |problem| RecordError::Unreadable {
        topic: state.topic().to_owned(),
        key: key.clone(),
        problem,
    };
    let recorded: Recorded =
        serde_json::from_slice(&bytes).map_err(|_| unreadable(Unreadable::Malformed))?;
    if recorded.version != VERSION {
        return Err(unreadable(Unreadable::Version(recorded.version)));
    }
    Ok(Some(recorded))
}

/// Compares the membership `now` (publication `publication`, seen through `slot` on
/// `system_id`) with the recorded one: a gap is [`RecordError::GapWhileStopped`]; otherwise
/// `now` is recorded when it differs. A `new_slot` (one this start created, or will create)
/// has no gap: `now` replaces the record without a comparison.
pub async fn check_and_record(
    state: &StateTopic,
    system_id: Option<&str>,
    slot: &str,
    publication: &str,
    now: &Membership,
    new_slot: bool,
) -> Result<(), RecordError> {
    if now.tables.is_empty() {
        return Ok(());
    }
    if system_id.is_none() {
        tracing::warn!("the server's system identifier is not readable (SELECT system_identifier FROM pg_control_system()): the publication's membership is not recorded, so a publication gap while Siphon is stopped would go unnoticed; grant EXECUTE on pg_control_system() to Siphon's user");
        return Ok(());
    }
    let current = Recorded::new(system_id, slot, publication, now);
    if new_slot {
        return write(state, &current).await;
    }
    if let Some(recorded) = read(state, system_id, slot).await? {
        if recorded.publication == publication {
            if let Some(change) = membership::change(&recorded.membership(), now) {
                return Err(RecordError::GapWhileStopped {
                    change,
                    publication: publication.to_owned(),
                    slot: slot.to_owned(),
                    topic: state.topic().to_owned(),
                });
            }
        }
        if recorded == current {
            return Ok(());
        }
    }
    write(state, &current).await
}

/// Records `now` whatever was recorded before (`siphon accept-publication-change`).
pub async fn accept(
    state: &StateTopic,
    system_id: Option<&str>,
    slot: &str,
    publication: &str,
    now: &Membership,
) -> Result<(), RecordError> {
    if system_id.is_none() {
        return Err(RecordError::UnknownServer);
    }
    write(state, &Recorded::new(system_id, slot, publication, now)).await
}

async fn write(state: &StateTopic, recorded: &Recorded) -> Result<(), RecordError> {
    let value = serde_json::to_vec(recorded).map_err(|_| RecordError::Unreadable {
        topic: state.topic().to_owned(),
        key: key(recorded.system_id.as_deref(), &recorded.slot),
        problem: Unreadable::Malformed,
    })?;
    let key = key(recorded.system_id.as_deref(), &recorded.slot);
    state.write(key.as_bytes(), &value).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(publication: u32, rows: &[(&str, &[Publisher])]) -> Membership {
        Membership {
            publication,
            tables: rows
                .iter()
                .map(|(name, rows)| {
                    (
                        TableName {
                            schema: "public".into(),
                            name: (*name).into(),
                        },
                        rows.iter().copied().collect(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_record_gives_back_the_membership_it_was_made_of() {
        let seen = membership(
            16_400,
            &[
                (
                    "outbox",
                    &[Publisher::Table(16_410), Publisher::Schema(16_420)],
                ),
                ("other_outbox", &[]),
            ],
        );
        let recorded = Recorded::new(Some("7311"), "siphon", "siphon_pub", &seen);
        let json = serde_json::to_vec(&recorded).expect("serializable");
        let back: Recorded = serde_json::from_slice(&json).expect("readable");
        assert_eq!(back.membership(), seen);
        assert_eq!(back, recorded);
    }

    #[test]
    fn keys_tell_servers_and_slots_apart() {
        assert_ne!(key(Some("1"), "s"), key(Some("2"), "s"));
        assert_ne!(key(Some("1"), "s"), key(Some("1"), "t"));
    }
}
