//! Slots with two-phase decoding: refused, with a fix that keeps the slot's position.
//!
//! A logical slot with `two_phase` on (created with it, or started once by a client that asked
//! for it) makes pgoutput send a prepared transaction's rows at `PREPARE TRANSACTION`, before
//! anyone knows whether it commits, and only a marker at `COMMIT PREPARED`, whatever protocol
//! version the client asked for. Holding those rows until the commit would need either memory
//! without bound (a prepared transaction may stay open for days and hold any number of rows) or
//! a confirmed position that cannot move past the `PREPARE` while later transactions are
//! delivered. A slot without two-phase decoding sends a prepared transaction whole at
//! `COMMIT PREPARED`, in commit order, and nothing for `ROLLBACK PREPARED`: exactly what Siphon
//! needs. So Siphon refuses a two-phase slot and says how to turn it into one without it.
//!
//! # Invariants
//! - A two-phase slot is refused before streaming starts (from PostgreSQL 15, where pgoutput
//!   decodes prepared transactions; a `two_phase` slot on 14 decodes as any other), and left
//!   exactly as it was.
//! - The refusal names the slot, why, and fixes that lose nothing first: `ALTER_REPLICATION_SLOT
//!   ... (TWO_PHASE false)` from PostgreSQL 18, a copy of the slot (which never decodes two-phase
//!   transactions and keeps the position) on every version; dropping the slot last, with what
//!   it loses.

use crate::config::{quote_ident, quote_literal};
use crate::SourceError;

/// The first PostgreSQL version (`server_version_num`) whose pgoutput decodes prepared
/// transactions at `PREPARE TRANSACTION` (protocol 3).
pub const PGOUTPUT_TWO_PHASE_VERSION: i32 = 150_000;

/// The first version with `pg_replication_slots.two_phase`.
pub const SLOT_TWO_PHASE_COLUMN_VERSION: i32 = 140_000;

/// The first version whose `ALTER_REPLICATION_SLOT` can turn `TWO_PHASE` off.
pub const ALTER_TWO_PHASE_VERSION: i32 = 180_000;

/// The definite error for slot `slot`, which decodes two-phase transactions; `version` is the
/// server's `server_version_num` when known (the fixes that apply to it are named).
pub fn refusal(slot: &str, version: Option<i32>) -> SourceError {
    crate::error::SetupProblem::TwoPhaseSlot {
        slot: slot.to_owned(),
        version,
    }
    .into()
}

/// The message of [`refusal`].
pub(crate) fn describe(
    slot: &str,
    version: Option<i32>,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_slot_and_the_fixes_of_the_version() {
        let on_18 = refusal("s", Some(180_001)).to_string();
        for needle in [
            "replication slot \"s\"",
            "two_phase",
            "PREPARE TRANSACTION",
            r#"ALTER_REPLICATION_SLOT "s" (TWO_PHASE false)"#,
            "SELECT pg_copy_logical_replication_slot('s', 's_committed')",
            "source.slot = \"s_committed\"",
            "SELECT pg_drop_replication_slot('s')",
        ] {
            assert!(on_18.contains(needle), "{needle:?} missing: {on_18}");
        }
        let on_15 = refusal("s", Some(150_004)).to_string();
        assert!(!on_15.contains("ALTER_REPLICATION_SLOT"), "{on_15}");
        assert!(
            on_15.contains("pg_copy_logical_replication_slot"),
            "{on_15}"
        );
        let unknown = refusal("s", None).to_string();
        assert!(
            unknown.contains("on PostgreSQL 18 and later, stop every client"),
            "{unknown}"
        );
        assert!(!refusal("s", None).is_transient());
    }

    #[test]
    fn the_copy_name_fits_a_slot_name() {
        let long = "x".repeat(63);
        assert_eq!(copy_name(&long).len(), 63);
        assert_eq!(copy_name("siphon"), "siphon_committed");
        let wide = "é".repeat(31);
        assert!(copy_name(&wide).len() <= 63);
    }
}
