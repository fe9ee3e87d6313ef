//! A latency histogram of fixed buckets that records without a lock.
//!
//! `siphon_commit_to_ack_seconds` and `siphon_send_to_ack_seconds` are observed once for
//! every acknowledged record (and `siphon_commit_to_read_seconds` once for every transaction
//! read), on the session's task. prometheus-client's `Histogram` takes a mutex and adds a float for each
//! observation, on the path of every record; this one adds to two atomic integers. It is exported exactly as a
//! classic Prometheus histogram (`_bucket{le}`, `_sum`, `_count`).
//!
//! # Invariants
//! - Bucket `i` counts the observations above bound `i - 1` and at most bound `i`; the last
//!   bucket (`le="+Inf"`) counts those above every bound.
//! - The sum is kept in whole nanoseconds and exported in seconds.
//! - An export's `_count` is the sum of the bucket counts it exports, so the `+Inf` bucket
//!   always equals `_count` even while observations are being made.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Buckets of the histogram: the finite upper bounds, then `+Inf`.
const MAX_BOUNDS: usize = 32;

/// A histogram of durations; cloning shares the counts.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Finite upper bounds in seconds, ascending.
    bounds_secs: Vec<f64>,
    /// The same bounds in nanoseconds (compared with each observation).
    bounds_nanos: Vec<u64>,
    /// One count per bound, then the `+Inf` bucket.
    buckets: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    /// A histogram with these upper bounds (seconds, ascending, finite; at most 32).
    pub fn new(bounds_secs: &[f64]) -> Self {
        let bounds_secs: Vec<f64> = bounds_secs
            .iter()
            .copied()
            .filter(|b| b.is_finite() && *b >= 0.0)
            .take(MAX_BOUNDS)
            .collect();
        let bounds_nanos = bounds_secs
            .iter()
            .map(|b| {
                Duration::from_secs_f64(*b)
                    .as_nanos()
                    .min(u128::from(u64::MAX)) as u64
            })
            .collect();
        let buckets = (0..=bounds_secs.len()).map(|_| AtomicU64::new(0)).collect();
        LatencyHistogram {
            inner: Arc::new(Inner {
                bounds_secs,
                bounds_nanos,
                buckets,
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// Records one observation.
    #[inline]
    pub fn observe(&self, value: Duration) {
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.inner;
        let bucket = inner
            .bounds_nanos
            .iter()
            .position(|bound| nanos <= *bound)
            .unwrap_or(inner.bounds_nanos.len());
        if let Some(count) = inner.buckets.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let mut count = 0u64;
        let buckets: Vec<(f64, u64)> = inner
            .bounds_secs
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&inner.buckets)
            .map(|(bound, bucket)| {
                let n = bucket.load(Ordering::Relaxed);
                count += n;
                (bound, n)
            })
            .collect();
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;
    use proptest::prelude::*;

    fn exported(metric: impl prometheus_client::registry::Metric) -> String {
        let mut registry = Registry::default();
        registry.register("latency_seconds", "help", metric);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket() {
        let h = LatencyHistogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_micros(1001));
        h.observe(Duration::from_secs(5));
        let text = exported(h);
        assert!(
            text.contains("latency_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("latency_seconds_bucket{le=\"0.01\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("latency_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("latency_seconds_count 3\n"), "{text}");
    }

    proptest! {
        /// Exported exactly as prometheus-client's own histogram with the same bounds, for
        /// observations of whole microseconds (whose sum both keep exactly).
        #[test]
        fn exports_as_prometheus_clients_histogram(
            micros in proptest::collection::vec(0u64..120_000_000, 0..200)
        ) {
            let bounds = crate::metrics::COMMIT_TO_ACK_BUCKETS;
            let ours = LatencyHistogram::new(&bounds);
            let theirs = Histogram::new(bounds);
            for m in &micros {
                ours.observe(Duration::from_micros(*m));
                theirs.observe(Duration::from_micros(*m).as_secs_f64());
            }
            let (ours, theirs) = (exported(ours), exported(theirs));
            let without_sum = |t: &str| -> String {
                t.lines().filter(|l| !l.contains("_sum")).collect::<Vec<_>>().join("\n")
            };
            prop_assert_eq!(without_sum(&ours), without_sum(&theirs));
            let sum = |t: &str| -> f64 {
                t.lines()
                    .find_map(|l| l.strip_prefix("latency_seconds_sum "))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN)
            };
            prop_assert!((sum(&ours) - sum(&theirs)).abs() < 1e-6);
        }
    }
}
