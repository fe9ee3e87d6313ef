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

use crate::SourceError;

/// The first PostgreSQL version (`server_version_num`) whose pgoutput decodes prepared
/// transactions at `PREPARE TRANSACTION` (protocol 3).
pub const PGOUTPUT_TWO_PHASE_VERSION: i32 = 150_000;

/// The first version with `pg_replication_slots.two_phase`.
pub const SLOT_TWO_PHASE_COLUMN_VERSION: i32 = 140_000;

pub use crate::error::fixes::ALTER_TWO_PHASE_VERSION;

/// The definite error for slot `slot`, which decodes two-phase transactions; `version` is the
/// server's `server_version_num` when known (the fixes that apply to it are named).
pub fn refusal(slot: &str, version: Option<i32>) -> SourceError {
    crate::error::SetupProblem::TwoPhaseSlot {
        slot: slot.to_owned(),
        version,
    }
    .into()
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
}
