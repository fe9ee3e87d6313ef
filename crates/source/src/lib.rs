//! The replication source: everything between a PostgreSQL logical replication slot and the
//! pipeline.
//!
//! - [`setup`] checks the server and creates (or validates) the slot and the publication over an
//!   ordinary SQL connection (tokio-postgres).
//! - [`stream`] runs `START_REPLICATION` over [`wire`] (Siphon's own replication client on
//!   postgres-protocol's messages), decodes pgoutput with the [`pgoutput`] crate and hands out
//!   [`SourceEvent`]s.
//! - [`assembly`] is the sans-IO state machine in between: it keeps the relation cache and checks
//!   transaction framing (Begin .. Commit), so it is tested without a server.
//! - [`catalog`] answers the pipeline's catalog questions while streaming (is this relation a
//!   partition of an outbox table?).
//! - [`stall`] tells a stalled replication connection from a server busy decoding, from what
//!   the server shows of the slot's walsender.
//! - [`locate`] finds the host of `source.url` to use (several hosts with
//!   `target_session_attrs=read-write` find the primary after a failover) and tells servers
//!   apart; [`failover`] checks what failover slots need from the primary; [`timeline`] reads
//!   the server's timeline history (which earlier timelines its WAL continues, and up to where).
//! - [`membership`] records which catalog rows publish the outbox tables, so a publication
//!   dropped and created again (or a table taken out and added back) between two looks is seen.
//! - [`slot_wait`] says which transactions a slot being created waits for, while it waits.
//! - [`generated`] says why a generated outbox column is not in the stream, and the fix for the
//!   server's version.
//! - [`two_phase`] refuses a slot that decodes prepared transactions at `PREPARE TRANSACTION`,
//!   naming the fix; `unhandled` turns any pgoutput message Siphon cannot use into a definite
//!   error naming what to change.
//! - [`encoding`] turns text in the database encoding (logical message contents, which
//!   PostgreSQL does not convert) into UTF-8.
//! - [`names`] holds the value types (table names, hosts, `sslmode`, server identities) that
//!   the errors and the modules raising them share, and [`sqlstate`] the SQLSTATE both
//!   connections' errors are keyed by. They import nothing of the crate and [`error`] imports
//!   only them (and [`wire`]'s errors), so no two modules import each other.
//! - [`row_condition`] checks conditions written by people (`resend --where`, filters, signal
//!   rows) as one SQL expression before they reach SQL.
//! - [`signal`] reads and removes the rows of the signal table that ask for a re-send.
//! - [`snapshot`] reads outbox rows outside the stream, over a replication connection: in the
//!   snapshot of a slot it creates (the initial snapshot), or as they are now (re-sends).
//! - [`tls`] turns the libpq TLS parameters of `source.url` (`sslmode`, `sslrootcert`, `sslcert`,
//!   `sslkey`) into the TLS set-up of both connections.
//!
//! # Invariants
//! - The position reported to the server as flushed is only ever one the caller passed to
//!   [`ReplicationStream::confirm`]; it never moves backwards.
//! - No error or log line carries the password of `source.url` (see [`redact_url`]).
//! - Row changes are only emitted between a [`SourceEvent::Begin`] and its [`SourceEvent::Commit`].

pub mod assembly;
pub mod catalog;
pub mod config;
pub use siphon_core::engine::encoding;
pub mod error;
pub mod failover;
pub mod generated;
pub mod locate;
pub mod membership;
pub mod names;
pub mod queries;
pub mod row_condition;
pub mod setup;
pub mod signal;
pub mod slot_wait;
pub mod snapshot;
pub mod sqlstate;
pub mod stall;
pub mod status;
pub mod stream;
pub mod timeline;
pub mod tls;
pub mod two_phase;
mod unhandled;
pub mod wire;

pub use assembly::{RowChange, SourceEvent};
pub use config::{redact_url, ConnectionParams, SourceConfig};
pub use encoding::DatabaseEncoding;
pub use error::SourceError;
pub use membership::Membership;
pub use names::{Endpoint, ServerIdentity, SslMode, TableName, TargetSession};
pub use setup::{prepare, prepare_with, MissingSlot, SlotState};
pub use slot_wait::SetupWait;
pub use stream::ReplicationStream;
pub use tls::{RootCerts, TlsSettings};
