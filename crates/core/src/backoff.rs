//! Capped exponential backoff with jitter, the jitter drawn by the caller.
//!
//! # Invariants
//! - A delay is never above the cap, and never below the current step.
//! - The schedule is a function of the draws passed in: no randomness or clock is read here.

use std::time::Duration;

/// Delays between attempts (reconnections, producer replacements).
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
