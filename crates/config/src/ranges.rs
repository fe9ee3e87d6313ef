//! The allowed range of every integer key of `siphon.toml`.
//!
//! A value outside its range is refused when the configuration is read (`siphon check-config`
//! and every start), naming the key and the range. The maxima are far above any useful value
//! and far below what overflows: every duration stays addable to an `Instant`, and every
//! product Siphon forms with one (twice the shutdown timeout, eight transaction intervals) stays
//! representable.
//!
//! # Invariants
//! - Every integer key of [`super::Config`] has exactly one entry in [`RANGES`] (a unit test
//!   walks the keys).
//! - The document is checked before it is deserialized, so a value the key's type cannot hold
//!   (a negative number of seconds, `i64::MAX` partitions) gets the same message as one that is
//!   merely too large.

use anyhow::bail;

/// The values one key accepts: `min..=max`, and `sentinel` when it has a meaning of its own.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// `section.key`.
    pub key: &'static str,
    pub min: i64,
    pub max: i64,
    /// A value outside `min..=max` that is accepted, and what it means (`-1`: the broker's
    /// default).
    pub sentinel: Option<(i64, &'static str)>,
}

const fn range(key: &'static str, min: i64, max: i64) -> Range {
    Range {
        key,
        min,
        max,
        sentinel: None,
    }
}

const HOUR_MS: i64 = 3_600_000;
const DAY_SECS: i64 = 86_400;
const GIB: i64 = 1024 * 1024 * 1024;

/// Every integer key with its range (docs/configuration.md lists the same ranges).
pub const RANGES: &[Range] = &[
    range("source.status_interval_ms", 10, HOUR_MS),
    range("source.stall_timeout_secs", 1, DAY_SECS),
    range("source.snapshot_chunk_rows", 1, 1_000_000),
    Range {
        key: "kafka.topic_creation.partitions",
        min: 1,
        max: 100_000,
        sentinel: Some((-1, "the broker's default")),
    },
    Range {
        key: "kafka.topic_creation.replication_factor",
        min: 1,
        // The Kafka protocol's INT16.
        max: i16::MAX as i64,
        sentinel: Some((-1, "the broker's default")),
    },
    range("kafka.transaction_interval_ms", 1, HOUR_MS),
    range("kafka.transaction_max_bytes", 1, GIB),
    range("format.java_version", 8, 99),
    range("pipeline.max_in_flight_records", 1, 1_000_000),
    range("pipeline.max_in_flight_bytes", 1, 4 * GIB),
    range("pipeline.shutdown_timeout_secs", 0, DAY_SECS),
    range("pipeline.max_backoff_secs", 1, 3_600),
    range("schema_registry.request_timeout_ms", 100, HOUR_MS),
    range("schema_registry.latest_ttl_secs", 1, DAY_SECS),
];

impl Range {
    /// Whether `value` is accepted.
    pub fn accepts(&self, value: i64) -> bool {
        (self.min..=self.max).contains(&value) || self.sentinel.is_some_and(|(s, _)| s == value)
    }

    /// The accepted values, in words.
    pub fn describe(&self) -> String {
        let span = format!("{} to {}", self.min, self.max);
        match self.sentinel {
            None => span,
            Some((value, meaning)) => format!("{value} ({meaning}) or {span}"),
        }
    }
}

/// The value at `key` (`section.key` or `section.sub.key`) of `doc`, if present.
fn value_at<'d>(doc: &'d toml::Table, key: &str) -> Option<&'d toml::Value> {
    let mut parts = key.split('.').peekable();
    let mut table = doc;
    while let Some(part) = parts.next() {
        let value = table.get(part)?;
        if parts.peek().is_none() {
            return Some(value);
        }
        table = value.as_table()?;
    }
    None
}

/// Why `value` is refused for `key` (`section.key`), naming the key and its range; `None` when
/// it is accepted or the key has no range.
pub fn refusal(key: &str, value: i64) -> Option<String> {
    let range = RANGES.iter().find(|r| r.key == key)?;
    (!range.accepts(value)).then(|| {
        format!(
            "{} = {value} is out of range: it must be {}",
            range.key,
            range.describe()
        )
    })
}

/// Refuses an integer outside its key's range (other types are left to deserialization,
/// which names what it expected).
pub fn check(doc: &toml::Table) -> anyhow::Result<()> {
    for range in RANGES {
        if let Some(toml::Value::Integer(value)) = value_at(doc, range.key) {
            if let Some(why) = refusal(range.key, *value) {
                bail!(why);
            }
        }
    }
    Ok(())
}
