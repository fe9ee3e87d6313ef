//! Siphon: transactional-outbox events from a PostgreSQL logical replication slot to Kafka,
//! Debezium-compatible, with the slot confirmed only after Kafka acknowledged every record
//! before it.
//!
//! The binary (`src/main.rs`) is a thin command line over these modules:
//! - [`config`] (the `siphon-config` crate) and [`settings`]: `siphon.toml`, environment
//!   overrides, validation, and the pipeline's settings built from them.
//! - [`session`] and [`supervisor`]: one streaming session (a pure core, its ledger and a thin
//!   async driver), and reconnection between sessions.
//! - [`dead_letter`]: records for rows and records that can never be delivered as they are.
//! - [`telemetry`] (the `siphon-telemetry` crate) and [`status`]: metrics, health endpoints,
//!   the slot's status.
//! - [`signal`]: re-sends asked for by rows of a signal table, carried out while streaming.
//! - [`resend`]: `siphon resend`, rows still in an outbox table sent again on demand.
//! - [`snapshot`]: the initial snapshot of the outbox tables when Siphon creates its slot.
//! - [`transfer`]: outbox rows read outside the stream (initial snapshots, re-sends), read
//!   chunk by chunk and carried through the core's transfer engine, their progress kept in the
//!   state topic.
//! - [`error`], [`transfer_error`], [`row_fault`], [`record_fault`]: why a session or a
//!   transfer ends; why a row or a record was not delivered, said once for both.
//! - [`alloc`]: the C library allocator's set-up for large records.
//!
//! `siphon import-debezium` calls the `siphon-import-debezium` crate, which converts a Debezium
//! connector configuration.
//!
//! # Invariants
//! - The position confirmed to PostgreSQL is only ever the [`session::ledger::Ledger`] watermark.

pub mod alloc;
pub use siphon_config as config;
#[cfg(test)]
mod doc_links;
pub mod error;
pub mod pipeline;
pub use siphon_core::engine::{dead_letter, message, position};
pub mod progress_record;
pub mod publication_record;
pub mod record_fault;
pub mod registry;
pub mod resend;
pub mod row_fault;
pub mod session;
pub mod settings;
pub mod signal;
pub mod snapshot;
pub mod snapshot_plan;
pub mod status;
pub mod supervisor;
pub use siphon_telemetry as telemetry;
pub mod transfer;
pub mod transfer_error;
pub mod transfer_transaction;
