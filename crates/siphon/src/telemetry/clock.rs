//! Per-session timing of records between the producer and Kafka's acknowledgement.
//!
//! Delivery reports carry only the producer token of a record's transaction, so the commit
//! time and hand-over time are kept here, per transaction, in token order.
//!
//! # Invariants
//! - Entries are ordered by token and the front entry, if any, has a record awaiting its
//!   delivery report; so the front's first hand-over is the oldest one still unacknowledged
//!   (exact, except that a record re-sent for an older, already settled transaction starts a
//!   fresh entry with its own hand-over time).
//! - Memory is one small entry per transaction between the oldest unacknowledged record and the
//!   newest one handed over: the same span the acknowledgement tracker keeps.
//! - The clock moves nothing but metrics; a report for an unknown token is ignored.

use super::Metrics;
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// The wall-clock time of a PostgreSQL timestamp in microseconds since 2000-01-01 UTC (as
/// pgoutput's Begin and Commit carry it).
pub fn pg_timestamp(micros: i64) -> SystemTime {
    let base = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    let offset = Duration::from_micros(micros.unsigned_abs());
    let time = if micros >= 0 {
        base.checked_add(offset)
    } else {
        base.checked_sub(offset)
    };
    time.unwrap_or(base)
}

#[derive(Debug, Clone, Copy)]
struct TxnTimes {
    token: usize,
    committed: SystemTime,
    first_sent: Instant,
    outstanding: u64,
}

/// Times records from hand-over to delivery report, feeding `siphon_commit_to_ack_seconds` and
/// `siphon_oldest_unacked_event_age_seconds`. Owned by one session (not shared).
#[derive(Debug, Default)]
pub struct DeliveryClock {
    pending: VecDeque<TxnTimes>,
}

impl DeliveryClock {
    /// An empty clock.
    pub fn new() -> Self {
        DeliveryClock::default()
    }

    /// A record of the transaction with producer token `token`, committed at `commit_time_us`
    /// (pgoutput's Begin timestamp), was handed to the producer.
    pub fn sent(&mut self, metrics: &Metrics, token: usize, commit_time_us: i64) {
        self.sent_at(metrics, token, pg_timestamp(commit_time_us), Instant::now());
    }

    /// The delivery report of a record of `token` arrived; `delivered` says whether Kafka
    /// acknowledged it (only acknowledged records are observed in the latency histogram).
    pub fn settled(&mut self, metrics: &Metrics, token: usize, delivered: bool) {
        self.settled_at(metrics, token, delivered, SystemTime::now());
    }

    /// Forgets every record (the session ended); the oldest-unacknowledged age returns to 0.
    pub fn clear(&mut self, metrics: &Metrics) {
        self.pending.clear();
        metrics.set_oldest_unacked_since(None);
    }

    /// Records handed over whose delivery report has not arrived.
    pub fn outstanding(&self) -> u64 {
        self.pending.iter().map(|t| t.outstanding).sum()
    }

    fn sent_at(&mut self, metrics: &Metrics, token: usize, committed: SystemTime, now: Instant) {
        match self.pending.back_mut() {
            Some(back) if back.token == token => back.outstanding += 1,
            Some(back) if back.token > token => {
                match self.pending.binary_search_by_key(&token, |t| t.token) {
                    Ok(i) => {
                        if let Some(t) = self.pending.get_mut(i) {
                            t.outstanding += 1;
                        }
                    }
                    Err(i) => self.pending.insert(
                        i,
                        TxnTimes {
                            token,
                            committed,
                            first_sent: now,
                            outstanding: 1,
                        },
                    ),
                }
            }
            _ => self.pending.push_back(TxnTimes {
                token,
                committed,
                first_sent: now,
                outstanding: 1,
            }),
        }
        self.publish(metrics);
    }

    fn settled_at(&mut self, metrics: &Metrics, token: usize, delivered: bool, now: SystemTime) {
        let Ok(i) = self.pending.binary_search_by_key(&token, |t| t.token) else {
            return;
        };
        let Some(entry) = self.pending.get_mut(i) else {
            return;
        };
        if entry.outstanding == 0 {
            return;
        }
        entry.outstanding -= 1;
        if delivered {
            // A commit time ahead of this host's clock (clock skew) counts as zero latency.
            let latency = now
                .duration_since(entry.committed)
                .unwrap_or(Duration::ZERO);
            metrics.observe_commit_to_ack(latency);
        }
        while self.pending.front().is_some_and(|t| t.outstanding == 0) {
            self.pending.pop_front();
        }
        self.publish(metrics);
    }

    fn publish(&self, metrics: &Metrics) {
        metrics.set_oldest_unacked_since(self.pending.front().map(|t| t.first_sent));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(m: &Metrics) -> f64 {
        let text = m.encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("siphon_commit_to_ack_seconds_count "))
            .unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn pg_epoch_conversion() {
        assert_eq!(
            pg_timestamp(0),
            UNIX_EPOCH + Duration::from_secs(946_684_800)
        );
        assert_eq!(
            pg_timestamp(1_500_000),
            UNIX_EPOCH + Duration::from_millis(946_684_801_500)
        );
        assert_eq!(
            pg_timestamp(-1_000_000),
            UNIX_EPOCH + Duration::from_secs(946_684_799)
        );
    }

    #[test]
    fn oldest_follows_the_front_transaction() {
        let m = Metrics::new();
        let mut c = DeliveryClock::new();
        let t0 = Instant::now();
        let committed = SystemTime::now();
        c.sent_at(&m, 1, committed, t0);
        c.sent_at(&m, 1, committed, t0 + Duration::from_millis(1));
        c.sent_at(&m, 2, committed, t0 + Duration::from_millis(5));
        assert_eq!(c.outstanding(), 3);
        assert_eq!(
            m.oldest_unacked_age(t0 + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        // Out of order across partitions: transaction 2 settles first; 1 is still the oldest.
        c.settled_at(&m, 2, true, SystemTime::now());
        c.settled_at(&m, 1, true, SystemTime::now());
        assert_eq!(
            m.oldest_unacked_age(t0 + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        c.settled_at(&m, 1, true, SystemTime::now());
        assert_eq!(c.outstanding(), 0);
        assert_eq!(
            m.oldest_unacked_age(t0 + Duration::from_secs(1)),
            Duration::ZERO
        );
        assert_eq!(count(&m), 3.0);
    }

    #[test]
    fn failures_are_not_latencies_and_unknown_tokens_are_ignored() {
        let m = Metrics::new();
        let mut c = DeliveryClock::new();
        let t0 = Instant::now();
        c.sent_at(&m, 7, SystemTime::now(), t0);
        c.settled_at(&m, 7, false, SystemTime::now());
        c.settled_at(&m, 7, true, SystemTime::now());
        c.settled_at(&m, 99, true, SystemTime::now());
        assert_eq!(count(&m), 0.0);
        // A record re-sent for a settled transaction (a dead-letter copy) is timed again.
        c.sent_at(&m, 9, SystemTime::now(), t0);
        c.sent_at(&m, 7, SystemTime::now(), t0 + Duration::from_millis(3));
        assert_eq!(c.outstanding(), 2);
        c.settled_at(&m, 7, true, SystemTime::now());
        assert_eq!(count(&m), 1.0);
        c.clear(&m);
        assert_eq!(c.outstanding(), 0);
        assert_eq!(
            m.oldest_unacked_age(t0 + Duration::from_secs(9)),
            Duration::ZERO
        );
    }

    #[test]
    fn latency_is_measured_from_the_commit() {
        let m = Metrics::new();
        let mut c = DeliveryClock::new();
        let committed = UNIX_EPOCH + Duration::from_secs(1_000_000);
        c.sent_at(&m, 1, committed, Instant::now());
        c.sent_at(&m, 1, committed, Instant::now());
        c.settled_at(&m, 1, true, committed + Duration::from_millis(40));
        // Clock skew: a commit "in the future" is counted as zero latency.
        c.settled_at(&m, 1, true, committed - Duration::from_secs(1));
        let text = m.encode();
        assert!(text.contains("siphon_commit_to_ack_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(text.contains("siphon_commit_to_ack_seconds_bucket{le=\"0.05\"} 2\n"));
    }
}
