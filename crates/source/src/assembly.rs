//! Transaction assembly for a slot: `siphon_core`'s sans-IO [`siphon_core::assembly::Assembler`]
//! with its errors turned into source errors that name the slot and the fix.
//!
//! # Invariants
//! - The state machine and its rules (framing, the relation cache) are the core's; this module
//!   only maps its [`AssemblyError`]s: a framing error is a protocol error, a message Siphon
//!   cannot use a definite error naming what to change ([`crate::unhandled`]).

use crate::SourceError;
use bytes::Bytes;
use pgoutput::{Lsn, Oid};
pub use siphon_core::assembly::{AssemblyError, RowChange, SourceEvent};

/// The assembly state machine of one session's slot.
#[derive(Debug, Default)]
pub struct SlotAssembler {
    core: siphon_core::assembly::Assembler,
    /// The slot streamed from, named in errors (`None` in tests).
    slot: Option<String>,
}

impl SlotAssembler {
    /// A fresh assembler for a session streaming from slot `slot` (named in its errors).
    pub fn for_slot(slot: &str) -> Self {
        SlotAssembler {
            core: siphon_core::assembly::Assembler::new(),
            slot: Some(slot.to_owned()),
        }
    }

    /// Whether a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.core.in_transaction()
    }

    /// See [`siphon_core::assembly::Assembler::forget`].
    pub fn forget(&mut self, relation: Oid) {
        self.core.forget(relation);
    }

    /// See [`siphon_core::assembly::Assembler::skip_deletes`].
    pub fn skip_deletes(&mut self, relation: Oid) {
        self.core.skip_deletes(relation);
    }

    /// The server reports its WAL end; yields [`SourceEvent::Idle`] outside transactions.
    pub fn keepalive(&mut self, wal_end: Lsn) -> Option<SourceEvent> {
        self.core.keepalive(wal_end)
    }

    /// One pgoutput payload, which the server sent from WAL position `lsn`.
    pub fn data(&mut self, payload: &Bytes, lsn: Lsn) -> Result<Option<SourceEvent>, SourceError> {
        self.core.data(payload, lsn).map_err(|e| self.error(e))
    }

    fn error(&self, error: AssemblyError) -> SourceError {
        match error {
            AssemblyError::Unhandled {
                payload,
                lsn,
                decode,
            } => crate::unhandled::error(self.slot.as_deref(), &payload, lsn, decode.as_ref()),
            framing => crate::error::ProtocolFault::Assembly(framing).into(),
        }
    }
}
