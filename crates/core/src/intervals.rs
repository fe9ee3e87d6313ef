//! The session's fixed intervals and timeouts, as one value passed in.
//!
//! # Invariants
//! - Nothing in the core or the driver uses a fixed interval of its own: each comes from
//!   [`Intervals`], whose [`Default`] is the schedule Siphon has always used.

use std::time::Duration;

/// How often things happen and how long they may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intervals {
    /// Progress log, slot metrics, publication and stall checks (each status query is bounded
    /// by it too).
    pub status_tick: Duration,
    /// How often the brokers are asked whether they answer.
    pub broker_probe: Duration,
    /// How long a broker probe may take.
    pub broker_probe_timeout: Duration,
    /// The longest a catalog query may take.
    pub sql_timeout: Duration,
    /// The first pause between two producer replacements without a delivery in between.
    pub replacement_backoff: Duration,
    /// The longest such pause.
    pub replacement_backoff_max: Duration,
    /// The first pause before reconnecting after a transient failure (the longest is the
    /// configuration's `pipeline.max_backoff_secs`).
    pub reconnect_backoff: Duration,
    /// A session that streamed this long resets the reconnection backoff.
    pub healthy_session: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        Intervals {
            status_tick: Duration::from_secs(5),
            broker_probe: Duration::from_secs(2),
            broker_probe_timeout: Duration::from_secs(2),
            sql_timeout: Duration::from_secs(30),
            replacement_backoff: Duration::from_millis(200),
            replacement_backoff_max: Duration::from_secs(30),
            reconnect_backoff: Duration::from_millis(500),
            healthy_session: Duration::from_secs(30),
        }
    }
}
