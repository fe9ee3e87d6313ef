//! Scraping Siphon's Prometheus endpoint and estimating quantiles from histogram buckets.

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The body of `GET /metrics` from `addr` (`host:port`).
pub async fn scrape(addr: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the metrics endpoint {addr}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("malformed HTTP response from {addr}");
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "GET /metrics on {addr}: {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_owned())
}

/// Sum of every sample of metric `name` (all label sets), e.g. a counter per topic.
pub fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Cumulative bucket counts of histogram `name`: (upper bound, count), ascending, with
/// `+Inf` as `f64::INFINITY`.
pub fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let le = rest.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = rest.rsplit(' ').next()?.parse().ok()?;
            Some((bound, count))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `after - before`, bucket by bucket (both cumulative, same bounds).
pub fn difference(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(le, n)| {
            let prior = before
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, m)| *m);
            (le, (n - prior).max(0.0))
        })
        .collect()
}

/// The `q` quantile (0..=1) of a cumulative histogram by linear interpolation within the
/// bucket that holds it (the first bucket starts at 0). `None` if empty; an observation in
/// the `+Inf` bucket yields the largest finite bound (a lower bound of the truth).
pub fn quantile(cumulative: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for &(le, count) in cumulative {
        if count >= rank && count > lower_count {
            if le.is_infinite() {
                return Some(lower_bound);
            }
            let fraction = (rank - lower_count) / (count - lower_count);
            return Some(lower_bound + (le - lower_bound) * fraction);
        }
        if le.is_finite() {
            lower_bound = le;
        }
        lower_count = count;
    }
    Some(lower_bound)
}

/// Upper bound of the highest non-empty bucket: the histogram's bound on the maximum.
pub fn max_bound(cumulative: &[(f64, f64)]) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total <= 0.0 {
        return None;
    }
    cumulative
        .iter()
        .find(|(_, count)| *count >= total)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_seconds x\n# TYPE x_seconds histogram\n\
        x_seconds_sum 1.0\nx_seconds_count 10\n\
        x_seconds_bucket{le=\"0.001\"} 0\nx_seconds_bucket{le=\"0.01\"} 8\n\
        x_seconds_bucket{le=\"0.1\"} 10\nx_seconds_bucket{le=\"+Inf\"} 10\n\
        acked_total{topic=\"a\"} 3\nacked_total{topic=\"b\"} 4\nacked_total_x 100\n";

    #[test]
    fn parses_and_interpolates() {
        let b = buckets(TEXT, "x_seconds");
        assert_eq!(b.len(), 4);
        let p50 = quantile(&b, 0.5).unwrap_or(f64::NAN);
        // rank 5 of 8 in (0.001, 0.01]
        assert!((p50 - (0.001 + 0.009 * 5.0 / 8.0)).abs() < 1e-12, "{p50}");
        let p95 = quantile(&b, 0.95).unwrap_or(f64::NAN);
        assert!((p95 - (0.01 + 0.09 * 1.5 / 2.0)).abs() < 1e-12, "{p95}");
        assert_eq!(max_bound(&b), Some(0.1));
        assert_eq!(sum_of(TEXT, "acked_total"), 7.0);
    }

    #[test]
    fn differences_and_overflow() {
        let before = vec![(0.01, 2.0), (f64::INFINITY, 2.0)];
        let after = vec![(0.01, 2.0), (f64::INFINITY, 5.0)];
        let d = difference(&after, &before);
        assert_eq!(d, vec![(0.01, 0.0), (f64::INFINITY, 3.0)]);
        assert_eq!(quantile(&d, 0.5), Some(0.01));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
