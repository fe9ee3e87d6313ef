//! Scenarios that share a server a test process starts once (a three-node cluster, a
//! locked-down broker): a JVM starts once per process, each scenario is a test of its own
//! (`cargo test NAME` runs one), and they take turns, so one scenario's faults never land in
//! another's timing.
//!
//! # Invariants
//! - At most one scenario holds the server at a time: each runs holding [`TURN`].
//! - The server lives as long as the test process and no longer: its JVMs are spawned by
//!   [`crate::kafka`]'s process-lifetime spawner, which the kernel ends with the process.
//! - A server that failed to start fails every scenario that asks for it, naming why.

use anyhow::{anyhow, Result};
use std::sync::OnceLock;

/// The turn to use the shared server: held for a whole scenario.
pub static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server in `cell`, started by `start` on first use.
pub fn shared<T>(
    cell: &'static OnceLock<std::result::Result<T, String>>,
    start: impl FnOnce() -> Result<T>,
) -> Result<&'static T> {
    cell.get_or_init(|| start().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("the shared server did not start: {e}"))
}
