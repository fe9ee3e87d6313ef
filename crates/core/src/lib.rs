//! Siphon's core: what the session decides, with no IO.
//!
//! The source (PostgreSQL) and the sink (Kafka) map what happens to them into this crate's
//! vocabulary; the binary's driver moves values between them and the session engine
//! ([`engine::session`], over the delivery [`flow`]), and carries out the engine's actions.
//!
//! # Invariants
//! - No dependency on an async runtime, a database client, a Kafka client or a TLS stack
//!   (`cargo tree -p siphon-core -e normal,dev` shows only pure crates): the session
//!   simulation runs with `cargo test -p siphon-core`.
//! - Time is a parameter: nothing here reads a clock.
//! - No metrics registry: what the engine notices leaves it as values.

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
