//! Runs sessions, reconnecting after transient failures with capped exponential backoff and
//! jitter, and stops on shutdown or a definite error.
//!
//! # Invariants
//! - A definite error ends the process with a message naming the fix; it is never retried in a
//!   loop that would hide it.
//! - Each reconnect resumes from the position Kafka acknowledged (never past it).

use crate::error::PipelineError;
use crate::session::{run_session, Carry, PipelineSettings};
use crate::telemetry::{Event, Metrics, ReconnectCause};
use siphon_core::Backoff;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{error, info};

/// Runs until shutdown (Ok) or a definite error (Err).
pub async fn supervise(
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    max_backoff: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut carry = Carry::default();
    let intervals = settings.intervals;
    let mut backoff = Backoff::new(intervals.reconnect_backoff, max_backoff);
    loop {
        let started = Instant::now();
        match run_session(&settings, &metrics, &mut carry, &mut shutdown).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                if started.elapsed() >= intervals.healthy_session {
                    backoff.reset();
                }
                let delay = backoff.next_delay(rand::random::<f64>());
                Event::Reconnecting {
                    cause: e.cause().unwrap_or(ReconnectCause::Source),
                    error: &e,
                    delay,
                    resume_from: carry.acked_through,
                }
                .emit(&metrics);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => {
                        info!("shutdown requested while reconnecting");
                        return Ok(());
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "stopping");
                return Err(e);
            }
        }
    }
}
