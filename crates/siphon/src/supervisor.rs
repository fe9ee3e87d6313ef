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
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{error, info};

/// Backoff between reconnection attempts.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The next delay: the current step with up to 50% random jitter; the step doubles up to
    /// the cap. `unit` in `[0, 1)` is the jitter draw (a parameter so the schedule is testable).
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        step.mul_f64(1.0 + 0.5 * unit.clamp(0.0, 1.0)).min(self.max)
    }

    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// A session that streamed this long resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// Runs until shutdown (Ok) or a definite error (Err).
pub async fn supervise(
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    max_backoff: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut carry = Carry::default();
    let mut backoff = Backoff::new(Duration::from_millis(500), max_backoff);
    loop {
        let started = Instant::now();
        match run_session(&settings, &metrics, &mut carry, &mut shutdown).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                if started.elapsed() >= HEALTHY_SESSION {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let no_jitter: Vec<_> = (0..6).map(|_| b.next_delay(0.0)).collect();
        assert_eq!(
            no_jitter,
            [500, 1000, 2000, 4000, 4000, 4000]
                .map(Duration::from_millis)
                .to_vec()
        );
        b.reset();
        let jittered = b.next_delay(0.999);
        assert!(jittered >= Duration::from_millis(500) && jittered <= Duration::from_millis(750));
        b.reset();
        for _ in 0..10 {
            assert!(
                b.next_delay(0.99) <= Duration::from_secs(4),
                "jitter never exceeds the cap"
            );
        }
    }
}
