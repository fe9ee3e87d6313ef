//! The time between two instants, computed once for a run of equal pairs.
//!
//! The session times every acknowledged record twice (from its transaction's commit, from its
//! hand-over to the producer). Subtracting two `Instant`s or `SystemTime`s is not free in std,
//! while consecutive records mostly share both ends: the records of one transaction share
//! its commit time, the records sent in one batch their send time, and the reports taken in
//! one batch their arrival time. So the last difference is kept and reused while its ends
//! repeat.
//!
//! # Invariants
//! - [`LastElapsed::get`] returns what `elapsed` returns for its ends: a kept value only for
//!   ends equal to those it was computed from.

use std::time::Duration;

/// The last `(ends, elapsed)` computed.
#[derive(Debug)]
pub struct LastElapsed<E> {
    last: Option<(E, Option<Duration>)>,
}

impl<E> Default for LastElapsed<E> {
    fn default() -> Self {
        LastElapsed { last: None }
    }
}

impl<E: Copy + PartialEq> LastElapsed<E> {
    /// The time between `ends`, `elapsed(ends)` unless the last call had the same ends.
    pub fn get(
        &mut self,
        ends: E,
        elapsed: impl FnOnce(E) -> Option<Duration>,
    ) -> Option<Duration> {
        match self.last {
            Some((last, value)) if last == ends => value,
            _ => {
                let value = elapsed(ends);
                self.last = Some((ends, value));
                value
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LastElapsed;
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    #[test]
    fn equal_ends_reuse_the_value_and_other_ends_compute_it() {
        let computed = Cell::new(0);
        let mut last = LastElapsed::default();
        let start = Instant::now();
        let mut get = |from: Instant, to: Instant| {
            last.get((from, to), |(from, to)| {
                computed.set(computed.get() + 1);
                to.checked_duration_since(from)
            })
        };
        let ms = Duration::from_millis;
        assert_eq!(get(start, start + ms(5)), Some(ms(5)));
        assert_eq!(get(start, start + ms(5)), Some(ms(5)));
        assert_eq!(computed.get(), 1);
        assert_eq!(get(start + ms(1), start + ms(5)), Some(ms(4)));
        assert_eq!(get(start + ms(1), start + ms(9)), Some(ms(8)));
        assert_eq!(get(start + ms(9), start), None);
        assert_eq!(get(start + ms(9), start), None);
        assert_eq!(computed.get(), 4);
    }
}
