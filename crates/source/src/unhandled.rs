//! pgoutput messages Siphon cannot use: what each means and what to change.
//!
//! Siphon starts the stream with protocol version 1 and neither streaming nor two-phase
//! decoding, so the server sends whole committed transactions. A message outside that (a
//! two-phase or streaming message, a kind this build does not know, bytes that do not decode)
//! comes again, the same, after every reconnect: the slot cannot get past it. So each is a
//! definite error naming what to change, never a reason to reconnect.
//!
//! # Invariants
//! - Every error made here is definite ([`SourceError::is_transient`] is false).
//! - Messages are told apart by their tag byte (the protocol's), never by error text.

use crate::error::UnusableMessage;
use crate::SourceError;
use pgoutput::{DecodeError, Lsn};

/// The two-phase messages (protocol 3) and their names.
const TWO_PHASE: [(u8, &str); 5] = [
    (b'b', "Begin Prepare"),
    (b'P', "Prepare"),
    (b'K', "Commit Prepared"),
    (b'r', "Rollback Prepared"),
    (b'p', "Stream Prepare"),
];

/// The messages of streamed in-progress transactions (protocol 2) and their names.
const STREAMING: [(u8, &str); 4] = [
    (b'S', "Stream Start"),
    (b'E', "Stream Stop"),
    (b'c', "Stream Commit"),
    (b'A', "Stream Abort"),
];

fn name_in(table: &[(u8, &'static str)], tag: u8) -> Option<&'static str> {
    table.iter().find(|(t, _)| *t == tag).map(|(_, name)| *name)
}

/// The error for `payload`, sent at `lsn` on slot `slot`, which Siphon cannot use: `decode` is
/// why it did not decode (`None`: it decoded, but Siphon does not handle its kind).
pub(crate) fn error(
    slot: Option<&str>,
    payload: &[u8],
    lsn: Lsn,
    decode: Option<&DecodeError>,
) -> SourceError {
    let tag = payload.first().copied().unwrap_or_default();
    let message = if let Some(name) = name_in(&TWO_PHASE, tag) {
        UnusableMessage::TwoPhase {
            name,
            lsn,
            slot: slot.map(str::to_owned),
        }
    } else if let Some(name) = name_in(&STREAMING, tag) {
        UnusableMessage::Streaming { name, lsn }
    } else {
        match decode {
            Some(e @ DecodeError::UnknownTag { .. }) => UnusableMessage::UnknownKind {
                lsn,
                decode: e.clone(),
            },
            Some(e @ DecodeError::InvalidUtf8 { .. }) => UnusableMessage::NotUtf8 {
                lsn,
                decode: e.clone(),
            },
            Some(e) => UnusableMessage::Undecodable {
                lsn,
                decode: e.clone(),
            },
            None => UnusableMessage::Unhandled { lsn, tag },
        }
    };
    message.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_siphon_cannot_use_is_definite_and_names_a_fix() {
        let cases: [(&[u8], Option<DecodeError>, &str); 6] = [
            (
                b"b\0\0\0\0\0\0\0\x01",
                Some(DecodeError::Unexpected {
                    message: "Begin Prepare",
                    reason: "requires protocol version 3 (two-phase commit) or later",
                }),
                "pg_copy_logical_replication_slot('s', 's_committed')",
            ),
            (b"K", None, "Commit Prepared message"),
            (b"S", None, "point source.url at PostgreSQL itself"),
            (
                b"z",
                Some(DecodeError::UnknownTag { tag: b'z' }),
                "upgrade Siphon",
            ),
            (
                b"R\0",
                Some(DecodeError::InvalidUtf8 {
                    field: "relation name",
                    offset: 9,
                }),
                "must be UTF-8",
            ),
            (
                b"I\0",
                Some(DecodeError::Truncated {
                    field: "relation id",
                    offset: 1,
                    needed: 3,
                }),
                "report it as a bug",
            ),
        ];
        for (payload, decode, fix) in cases {
            let e = error(Some("s"), payload, Lsn(0x1_0000_0010), decode.as_ref());
            assert!(!e.is_transient(), "{e}");
            let text = e.to_string();
            assert!(text.contains(fix), "{fix:?} missing: {text}");
            assert!(text.contains("1/10"), "{text}");
        }
    }

    /// What a two-phase slot sends for a prepared transaction (Begin Prepare, a Relation, an
    /// Insert, Prepare) stops the assembler at its first message, naming the slot.
    #[test]
    fn the_assembler_stops_at_a_begin_prepare_naming_the_slot() {
        let mut begin_prepare = vec![b'b'];
        begin_prepare.extend(0x100u64.to_be_bytes()); // prepare LSN
        begin_prepare.extend(0x108u64.to_be_bytes()); // end LSN
        begin_prepare.extend(0i64.to_be_bytes()); // prepare time
        begin_prepare.extend(7u32.to_be_bytes()); // xid
        begin_prepare.extend(b"gid\0");
        let mut a = crate::assembly::SlotAssembler::for_slot("orders");
        let e = a
            .data(&bytes::Bytes::from(begin_prepare), Lsn(0x100))
            .expect_err("refused");
        assert!(!e.is_transient(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("Begin Prepare message at 0/100")
                && text.contains("replication slot \"orders\"")
                && text.contains("pg_copy_logical_replication_slot('orders', 'orders_committed')"),
            "{text}"
        );
    }
}
