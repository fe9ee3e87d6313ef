//! The session engine ([`session`]: a pure state machine from the replication stream and the
//! producer's reports to actions, over the flow) and its parts: what the session stamps on records
//! ([`position`]), what it writes for a row or record that cannot be delivered
//! ([`dead_letter`]), the policies it applies ([`policy`]), the routers it routes with
//! ([`routers`]), the latencies it times
//! ([`elapsed`]) and what it tells the driver's log and metrics ([`note`]); logical messages
//! of outbox prefixes as rows ([`message`]), their content read in the database's encoding
//! ([`encoding`]); what it asks and learns from the catalog ([`catalog`]); what a record in a registry
//! format still needs from the schema registry ([`registry_write`]); exactly-once, the
//! records the broker refused ([`suspects`]); the tables it routes, by name ([`table`]); the
//! errors around it, as it reads them ([`vocabulary`]).
//!
//! # Invariants
//! - No IO, no clock, no metrics registry: values in, values out.

pub mod catalog;
pub mod dead_letter;
pub mod elapsed;
pub mod encoding;
pub mod message;
pub mod note;
pub mod policy;
pub mod position;
pub mod registry_write;
pub mod routers;
pub mod session;
#[cfg(test)]
mod simulation;
pub mod suspects;
pub mod table;
pub mod transfer;
pub mod vocabulary;
