//! The replication connection on the wire: one `replication=database` session to PostgreSQL,
//! spoken with postgres-protocol's message encoders and its SCRAM-SHA-256 and MD5
//! authentication.
//!
//! [`Session`] opens and authenticates the session (TCP, libpq's `sslmode` negotiation, the
//! startup message, authentication) and runs the simple queries wanted before streaming;
//! [`Session::start_replication`] turns it into a [`WireStream`], which reads the CopyBoth
//! stream in the caller's own task: messages are cut out of one receive buffer without copying,
//! status updates are written from the same task, and nothing else (no reader task, no channel)
//! stands between the socket and the pipeline.
//!
//! The bytes of the protocol (message framing on postgres-protocol's backend parser, CopyData
//! payloads, status updates, error fields) are [`frames`]: sans-IO, tested without a server
//! and fuzzed; [`session`] and [`stream`] do the IO.
//!
//! # Invariants
//! - Every future of [`WireStream`] is cancel-safe: what was read or is still to be written
//!   lives in the stream's buffers, never in a dropped future.
//! - Bytes read and not yet handed out stay below the read-ahead budget, except for the one
//!   message being completed (a message larger than the budget is read alone).
//! - The position written in a status update is one passed to [`WireStream::raise_applied`]
//!   (or the start position); it never moves backwards.
//! - A status update is written at least every status interval while the stream runs, whether
//!   or not the pipeline reads, and at once when the server asks for a reply.

pub mod error;
pub mod frames;
mod session;
mod socket;
mod stream;

pub use error::{ProtocolViolation, ServerError, WireError};
pub use frames::QueryRow;
pub use session::{refuses_tls, Login, Session, Tls};
pub use stream::{Received, WireStream};

/// Logs a `NoticeResponse` (PostgreSQL 18's "skipped loading publication" on the replication
/// stream is an error instead, see [`WireError::PublicationSkipped`]).
fn log_notice(notice: &ServerError) {
    tracing::warn!(severity = %notice.severity, code = %notice.code, "PostgreSQL: {}", notice.message);
}
