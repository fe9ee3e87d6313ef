//! Changes under Siphon that reconnecting cures: the server ended the stream, became a standby
//! or another server, or another process is creating the slot or publication Siphon wants.
//!
//! # Invariants
//! - Every [`Interruption`] is [`siphon_core::Consequence::Retry`]; its message is rendered
//!   from its fields.

use crate::names::{Endpoint, ServerIdentity, TargetSession};

/// What changed under Siphon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Interruption {
    /// The server ended the replication stream.
    #[error("the server ended the replication stream")]
    StreamEnded,
    /// The host became a standby between the checks and `START_REPLICATION`.
    #[error("{endpoint} became a standby before streaming started; looking for the primary again")]
    BecameStandby { endpoint: Endpoint },
    /// The host is another server than the one checked (a failover).
    #[error("{endpoint} is no longer the server that was checked ({expected}; now system {system_id} timeline {timeline}): a failover happened; checking again")]
    ServerChanged {
        endpoint: Endpoint,
        expected: ServerIdentity,
        system_id: String,
        timeline: String,
    },
    /// The host does not fit `target_session_attrs` (now).
    #[error("{endpoint} is not {} (a standby, or default_transaction_read_only is on); waiting for a {target} server", match target { TargetSession::Primary => "a primary", _ => "read-write" })]
    NotTarget {
        endpoint: Endpoint,
        target: TargetSession,
    },
    /// Another process created the publication at the same time, and it is gone again.
    #[error(
        "publication \"{publication}\" was being created by another process and is gone again"
    )]
    PublicationGone { publication: String },
    /// Another process created the slot at the same time, and it is gone again.
    #[error("replication slot \"{slot}\" was being created by another process and is gone again")]
    SlotGone { slot: String },
    /// Another process is still creating the slot.
    #[error("standby: replication slot \"{slot}\" is being created by another process; waiting to take over")]
    SlotBeingCreated { slot: String },
    /// A catalog query did not answer in time.
    #[error("a catalog query took more than {seconds}s")]
    QueryTimeout { seconds: u64 },
}
