//! Siphon's core: what the session decides, with no IO.
//!
//! The source (PostgreSQL) and the sink (Kafka) map what happens to them into this crate's
//! vocabulary; the binary's driver moves values between them and the state machine.
//!
//! # Invariants
//! - No dependency on an async runtime, a database client, a Kafka client or a TLS stack
//!   (`cargo tree -p siphon-core -e normal` shows only pure crates).
//! - Time is a parameter: nothing here reads a clock.

pub mod assembly;
pub mod backoff;
pub mod engine;
pub mod exactly_once;
pub mod flow;
mod in_flight;
pub mod intervals;
pub mod ledger;
pub mod record;
pub mod topic_gate;

pub use backoff::Backoff;
pub use flow::{Flow, Now};
pub use intervals::Intervals;
pub use pgoutput::unpublished;
pub use record::Records;
pub use siphon_record::{consequence, Consequence};
