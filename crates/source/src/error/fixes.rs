//! The fixes errors name: SQL and commands rendered from names, for the messages of
//! [`super::SetupProblem`] and [`super::UnusableMessage`] and for the modules that raise them.
//!
//! # Invariants
//! - Every name put into SQL is quoted ([`quote_ident`], [`quote_literal`]).

use crate::names::{quote_ident, quote_literal, MembershipChange};
use std::fmt;

/// The first version whose `ALTER_REPLICATION_SLOT` can turn `TWO_PHASE` off.
pub const ALTER_TWO_PHASE_VERSION: i32 = 180_000;

/// The command that makes a publication name the partitioned table instead of its partitions.
pub fn publish_via_root_fix(publication: &str) -> String {
    format!(
        "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
        quote_ident(publication)
    )
}

/// The message of [`crate::two_phase::refusal`].
pub(crate) fn two_phase_slot(
    slot: &str,
    version: Option<i32>,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let copy = copy_name(slot);
    let mut fixes = Vec::new();
    let alter = format!(
        "stop every client of the slot and run ALTER_REPLICATION_SLOT {} (TWO_PHASE false) on a replication connection (psql \"dbname=<database> replication=database\" -c '...')",
        quote_ident(slot)
    );
    match version {
        Some(v) if v >= ALTER_TWO_PHASE_VERSION => fixes.push(alter),
        Some(_) => {}
        None => fixes.push(format!("on PostgreSQL 18 and later, {alter}")),
    }
    fixes.push(format!(
        "copy the slot, which keeps its position (a copy never decodes two-phase transactions): SELECT pg_copy_logical_replication_slot({}, {}); then set source.slot = \"{copy}\", and drop the original with SELECT pg_drop_replication_slot({}) once nothing else reads it",
        quote_literal(slot),
        quote_literal(&copy),
        quote_literal(slot)
    ));
    write!(
        f,
        "replication slot \"{slot}\" decodes two-phase transactions (two_phase is on: it was created with two-phase decoding, or a client turned it on): PostgreSQL then sends a prepared transaction's rows at PREPARE TRANSACTION, before it is known whether it commits, and only a marker at COMMIT PREPARED, so Siphon does not read such a slot. Nothing was read from it. Fix, keeping the slot's position: {}. Or, if the events committed since the slot's position may be lost, drop it with SELECT pg_drop_replication_slot({}) and start Siphon, which creates its own slot without two-phase decoding (prepared transactions are then sent when they are committed with COMMIT PREPARED)",
        fixes.join("; or "),
        quote_literal(slot)
    )
}

/// The name suggested for the copy of `slot` (slot names have at most 63 bytes).
fn copy_name(slot: &str) -> String {
    const SUFFIX: &str = "_committed";
    let mut keep = slot.len().min(63 - SUFFIX.len());
    while !slot.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{SUFFIX}", &slot[..keep])
}

/// The message of [`crate::membership::MembershipChange::into_error`].
pub(crate) fn publication_change(
    change: &MembershipChange,
    publication: &str,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let (what, restart) = match change {
        MembershipChange::PublicationRecreated => (
            format!(
                "publication \"{publication}\" was dropped and created again while Siphon streamed (it is another publication now)"
            ),
            // PostgreSQL before 18 refuses to decode a change written while a publication
            // of the stream was missing; that error names the way past it.
            " (on PostgreSQL before 18 the server may then stop at the first change written while the publication was missing, saying it does not exist; that error names how to move the slot past it)",
        ),
        MembershipChange::TableAddedBack(table) => (
            format!(
                "outbox table {} was taken out of publication \"{publication}\" and added back while Siphon streamed",
                table.quoted()
            ),
            "",
        ),
    };
    write!(
        f,
        "{what}: PostgreSQL did not publish the events committed in between, so they cannot be read from this slot and were not sent to Kafka; re-send them from the application if consumers need them (the outbox rows committed around that time), then run `siphon accept-publication-change --config <this file>` and start Siphon again, which continues with the publication as it is now{restart}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_name_fits_a_slot_name() {
        let long = "x".repeat(63);
        assert_eq!(copy_name(&long).len(), 63);
        assert_eq!(copy_name("siphon"), "siphon_committed");
        let wide = "é".repeat(31);
        assert!(copy_name(&wide).len() <= 63);
    }
}
