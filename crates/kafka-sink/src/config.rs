//! Sink configuration.
//!
//! # Invariants
//! - The properties that Siphon's guarantees rest on (`enable.idempotence`, `acks`) cannot be
//!   weakened by user properties.
//! - The properties Siphon sets from its own settings ([`SET_BY_SIPHON`]) are refused in
//!   `kafka.properties`, naming the setting to use: a user's value would be ignored or would
//!   fail later without naming the property.
//! - A timeout property Siphon reads itself is within librdkafka's range for it
//!   ([`TIMEOUT_RANGE_MS`], [`TRANSACTION_TIMEOUT_RANGE_MS`]), so every deadline made from it
//!   fits an `Instant`.
//! - A refused property is reported with its key, its value and why ([`ConfigReason`]); the
//!   message is rendered from them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A `kafka` setting Siphon refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfigError {
    /// The property, as the user wrote it.
    pub key: String,
    /// Its value, as the user wrote it.
    pub value: String,
    /// Why it is refused.
    pub reason: ConfigReason,
}

/// Why a `kafka.properties` entry is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigReason {
    /// A delivery timeout (`message.timeout.ms` or its alias) that is not a number of
    /// milliseconds.
    NotMilliseconds,
    /// A number of milliseconds outside the range librdkafka accepts for the property.
    OutOfRange { min: u64, max: u64 },
    /// It would weaken a property Siphon's no-loss or ordering promise rests on; Siphon always
    /// uses `required`.
    Weakens { required: &'static str },
    /// Siphon sets the property itself from `setting` (e.g. `bootstrap.servers` from
    /// `kafka.bootstrap_servers`).
    SetBySiphon { setting: &'static str },
}

impl SinkConfigError {
    fn new(key: &str, value: &str, reason: ConfigReason) -> Self {
        SinkConfigError {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        }
    }
}

impl std::error::Error for SinkConfigError {}

/// The operator-facing text, naming the property and the fix.
impl fmt::Display for SinkConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SinkConfigError { key, value, reason } = self;
        match reason {
            ConfigReason::NotMilliseconds => write!(
                f,
                "kafka.properties.\"{key}\" = \"{value}\" is not a number of milliseconds"
            ),
            ConfigReason::OutOfRange { min, max } => write!(
                f,
                "kafka.properties.\"{key}\" = \"{value}\" is out of range: it must be {min} to {max} milliseconds"
            ),
            ConfigReason::Weakens { required } => write!(
                f,
                "kafka.properties.\"{key}\" = \"{value}\" would allow lost or reordered records; Siphon always uses {key}={required}: remove the property"
            ),
            ConfigReason::SetBySiphon { setting } => write!(
                f,
                "kafka.properties.\"{key}\" is set by Siphon itself: remove the property and use {setting}"
            ),
        }
    }
}

/// Settings of the Kafka producer and topic creation.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Extra librdkafka properties, passed through.
    pub properties: BTreeMap<String, String>,
    /// How missing topics are created.
    pub topic_creation: TopicCreation,
    /// Acknowledge every record at once without sending it (for measuring the rest of the
    /// pipeline; never for real use: the slot moves past records that went nowhere).
    pub discard: bool,
    /// The producer's `transactional.id` for exactly-once delivery (`None`: not transactional).
    pub transactional_id: Option<String>,
}

/// How Siphon creates output topics that do not exist yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicCreation {
    /// Create missing topics (otherwise the broker's auto-creation, if any, applies).
    pub enabled: bool,
    /// Partitions of a created topic; `-1` takes the broker's default.
    pub partitions: i32,
    /// Replication factor of a created topic; `-1` takes the broker's default.
    pub replication_factor: i32,
}

impl Default for TopicCreation {
    fn default() -> Self {
        TopicCreation {
            enabled: true,
            partitions: -1,
            replication_factor: -1,
        }
    }
}

/// Producer defaults: the Java client's partitioner and a short linger.
const DEFAULTS: &[(&str, &str)] = &[
    // Same partition for the same key as the Java client.
    ("partitioner", "murmur2_random"),
    // One request is in flight per connection: records batch while it is answered, so a longer
    // linger only delays each request's first record, at the same drain rate.
    ("linger.ms", "1"),
    ("socket.keepalive.enable", "true"),
    // Per-broker latencies for the metrics (`statistics`): one small JSON document per interval.
    ("statistics.interval.ms", "10000"),
];

/// Properties a user may not override: they carry the no-loss and ordering promises.
/// `enable.gapless.guarantee`: a record that fails (refused; timeouts are the session's) fails the producer
/// instead of leaving a gap that later records of its partition would be written after; the
/// session then resends everything unacknowledged in order on a new producer.
/// `max.in.flight.requests.per.connection = 1`: a broker accepts any first sequence number from a
/// producer it does not know on a partition, so with a second request in flight behind a first one
/// answered `NOT_LEADER_OR_FOLLOWER` (a new topic, a leader change), the broker may write the
/// second alone, and librdkafka then reports the first one's records delivered ("implicitly
/// acked"): lost. One request at a time sends a failed one again before anything after it.
const REQUIRED: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
    ("max.in.flight.requests.per.connection", "1"),
];

/// Properties Siphon sets itself, and the setting that sets each.
const SET_BY_SIPHON: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.bootstrap_servers"),
    (
        "transactional.id",
        "kafka.delivery = \"exactly-once\" for Kafka transactions (kafka.transactional_id chooses the id; at-least-once delivery has none)",
    ),
];

/// `message.timeout.ms` (and its alias): librdkafka's range (0: no deadline).
pub const TIMEOUT_RANGE_MS: (u64, u64) = (0, i32::MAX as u64);

/// `transaction.timeout.ms`: librdkafka's range.
pub const TRANSACTION_TIMEOUT_RANGE_MS: (u64, u64) = (1_000, i32::MAX as u64);

/// `value` of `key` as milliseconds within `(min, max)`.
fn milliseconds(key: &str, value: &str, (min, max): (u64, u64)) -> Result<u64, SinkConfigError> {
    let ms: u64 = value
        .trim()
        .parse()
        .map_err(|_| SinkConfigError::new(key, value, ConfigReason::NotMilliseconds))?;
    if !(min..=max).contains(&ms) {
        return Err(SinkConfigError::new(
            key,
            value,
            ConfigReason::OutOfRange { min, max },
        ));
    }
    Ok(ms)
}

/// The delivery deadline when `kafka.properties` sets none (librdkafka's own default).
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_millis(300_000);

/// `transaction.timeout.ms` when `kafka.properties` sets none (librdkafka's own default).
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// `message.timeout.ms` and its alias: the user's value becomes the session's delivery deadline,
/// and librdkafka itself is told never to time a record out.
const TIMEOUT_KEYS: [&str; 2] = ["message.timeout.ms", "delivery.timeout.ms"];

impl SinkConfig {
    /// How long a record may wait for its acknowledgement before the session gives up on the
    /// producer (`kafka.properties."message.timeout.ms"`, default 300 s; `0`: no deadline).
    ///
    /// librdkafka's own timeout is not used for this: a record that times out there makes the
    /// idempotent producer bump its epoch and go on with the records queued after it, which a
    /// broker then writes before the timed-out record is sent again (`enable.gapless.guarantee`
    /// does not cover timeouts). The session enforces the deadline itself by purging the
    /// producer, which drops everything queued after the late record, and resends in order.
    pub fn delivery_timeout(&self) -> Result<Option<Duration>, SinkConfigError> {
        let Some((key, value)) = self
            .properties
            .iter()
            .rev()
            .find(|(k, _)| TIMEOUT_KEYS.contains(&k.as_str()))
        else {
            return Ok(Some(DEFAULT_DELIVERY_TIMEOUT));
        };
        let ms = milliseconds(key, value, TIMEOUT_RANGE_MS)?;
        Ok((ms > 0).then(|| Duration::from_millis(ms)))
    }

    /// How long a Kafka transaction may stay open before the broker aborts it
    /// (`kafka.properties."transaction.timeout.ms"`, librdkafka's default 60 s).
    pub fn transaction_timeout(&self) -> Result<Duration, SinkConfigError> {
        let key = "transaction.timeout.ms";
        match self.properties.get(key) {
            None => Ok(DEFAULT_TRANSACTION_TIMEOUT),
            Some(value) => {
                milliseconds(key, value, TRANSACTION_TIMEOUT_RANGE_MS).map(Duration::from_millis)
            }
        }
    }

    /// The full librdkafka configuration: defaults, then user properties, then required ones.
    pub fn client_properties(&self) -> Result<BTreeMap<String, String>, SinkConfigError> {
        let mut props: BTreeMap<String, String> = DEFAULTS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (key, value) in &self.properties {
            // librdkafka's aliases of required properties are the same property.
            let canonical = match key.as_str() {
                "max.in.flight" => "max.in.flight.requests.per.connection",
                "request.required.acks" => "acks",
                other => other,
            };
            if let Some((_, required)) = REQUIRED.iter().find(|(k, _)| *k == canonical) {
                let acceptable = value == required || (canonical == "acks" && (value == "-1"));
                if !acceptable {
                    let reason = ConfigReason::Weakens { required };
                    return Err(SinkConfigError::new(key, value, reason));
                }
            }
            if let Some((_, setting)) = SET_BY_SIPHON.iter().find(|(k, _)| k == key) {
                let reason = ConfigReason::SetBySiphon { setting };
                return Err(SinkConfigError::new(key, value, reason));
            }
            props.insert(key.clone(), value.clone());
        }
        for (key, value) in REQUIRED {
            props.insert((*key).to_owned(), (*value).to_owned());
        }
        // Never timed out by librdkafka (0 is infinite): see `delivery_timeout`.
        let deadline = self.delivery_timeout()?;
        props.remove("delivery.timeout.ms");
        props.insert("message.timeout.ms".into(), "0".into());
        if let Some(id) = &self.transactional_id {
            // A transactional producer's records time out within the transaction's timeout
            // (librdkafka refuses more); a record that times out fails its transaction, which
            // is aborted and started again from the last committed progress.
            let transaction_timeout = self.transaction_timeout()?;
            let timeout = deadline.map_or(transaction_timeout, |d| d.min(transaction_timeout));
            props.insert("message.timeout.ms".into(), timeout.as_millis().to_string());
            props.insert("transactional.id".into(), id.clone());
            if self.topic_creation.enabled {
                // This producer writes the progress topic, which Siphon creates compacted at
                // each session's start, and Siphon creates every other topic it writes: a
                // broker's auto-creation (a metadata refresh after the progress topic was
                // deleted) would make it again as an ordinary topic, whose retention removes
                // the progress. The records fail instead, the transaction is aborted, and the
                // next session creates the topic compacted.
                props.insert("allow.auto.create.topics".into(), "false".into());
            }
        }
        props.insert("bootstrap.servers".into(), self.bootstrap_servers.clone());
        Ok(props)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(props: &[(&str, &str)]) -> SinkConfig {
        SinkConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            properties: props
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            topic_creation: TopicCreation::default(),
            discard: false,
            transactional_id: None,
        }
    }

    #[test]
    fn a_transactional_producer_times_records_out_within_its_transaction() {
        let mut eos = config(&[("message.timeout.ms", "300000")]);
        eos.transactional_id = Some("siphon-1-db-slot".into());
        let props = eos.client_properties().unwrap();
        assert_eq!(props["transactional.id"], "siphon-1-db-slot");
        assert_eq!(props["message.timeout.ms"], "60000");
        let mut short = config(&[
            ("message.timeout.ms", "5000"),
            ("transaction.timeout.ms", "20000"),
        ]);
        short.transactional_id = Some("t".into());
        assert_eq!(
            short.client_properties().unwrap()["message.timeout.ms"],
            "5000"
        );
        assert_eq!(
            short.transaction_timeout().unwrap(),
            Duration::from_secs(20)
        );
        assert!(!config(&[])
            .client_properties()
            .unwrap()
            .contains_key("transactional.id"));
        let err = config(&[("transaction.timeout.ms", "0")])
            .transaction_timeout()
            .unwrap_err();
        assert_eq!(
            err.reason,
            ConfigReason::OutOfRange {
                min: 1000,
                max: 2_147_483_647
            }
        );
    }

    /// The timeouts Siphon reads itself at their edges: 0, 1, the largest allowed, one more,
    /// `i64::MAX`.
    #[test]
    fn timeouts_are_range_checked() {
        let max = i32::MAX as u64;
        let delivery = |v: &str| config(&[("message.timeout.ms", v)]).client_properties();
        let transaction = |v: &str| config(&[("transaction.timeout.ms", v)]).transaction_timeout();
        let cases: &[(u64, bool, bool)] = &[
            // (value, delivery timeout accepted, transaction timeout accepted)
            (0, true, false),
            (1, true, false),
            (1_000, true, true),
            (max, true, true),
            (max + 1, false, false),
            (i64::MAX as u64, false, false),
        ];
        for &(value, delivery_ok, transaction_ok) in cases {
            let text = value.to_string();
            match delivery(&text) {
                Ok(_) => assert!(delivery_ok, "message.timeout.ms = {value} accepted"),
                Err(e) => {
                    assert!(!delivery_ok, "message.timeout.ms = {value}: {e}");
                    assert!(
                        e.to_string().contains("\"message.timeout.ms\"")
                            && e.to_string().contains("0 to 2147483647 milliseconds"),
                        "{e}"
                    );
                }
            }
            match transaction(&text) {
                Ok(_) => assert!(transaction_ok, "transaction.timeout.ms = {value} accepted"),
                Err(e) => {
                    assert!(!transaction_ok, "transaction.timeout.ms = {value}: {e}");
                    assert!(e.to_string().contains("1000 to 2147483647"), "{e}");
                }
            }
        }
    }

    #[test]
    fn a_transactional_id_property_is_refused_naming_exactly_once() {
        let err = config(&[("transactional.id", "my-app")])
            .client_properties()
            .unwrap_err();
        assert_eq!(err.key, "transactional.id");
        let text = err.to_string();
        assert!(
            text.contains("kafka.properties.\"transactional.id\"")
                && text.contains("remove the property")
                && text.contains("kafka.delivery = \"exactly-once\""),
            "{text}"
        );
        // Also for a transactional producer: Siphon's own id would replace it without a word.
        let mut eos = config(&[("transactional.id", "my-app")]);
        eos.transactional_id = Some("siphon-1-db-slot".into());
        assert!(eos.client_properties().is_err());
    }

    #[test]
    fn a_transactional_producer_never_has_the_brokers_create_topics_siphon_creates() {
        let mut eos = config(&[("allow.auto.create.topics", "true")]);
        eos.transactional_id = Some("t".into());
        assert_eq!(
            eos.client_properties().unwrap()["allow.auto.create.topics"],
            "false"
        );
        // With topic creation off, the brokers' auto-creation is the only one there is.
        eos.topic_creation.enabled = false;
        assert_eq!(
            eos.client_properties().unwrap()["allow.auto.create.topics"],
            "true"
        );
        assert!(!config(&[])
            .client_properties()
            .unwrap()
            .contains_key("allow.auto.create.topics"));
    }

    #[test]
    fn the_delivery_deadline_is_the_sessions_and_librdkafka_never_times_out() {
        let default = config(&[]);
        assert_eq!(
            default.delivery_timeout().unwrap(),
            Some(DEFAULT_DELIVERY_TIMEOUT)
        );
        assert_eq!(
            default.client_properties().unwrap()["message.timeout.ms"],
            "0"
        );
        let set = config(&[("message.timeout.ms", "10000")]);
        assert_eq!(
            set.delivery_timeout().unwrap(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(set.client_properties().unwrap()["message.timeout.ms"], "0");
        let alias = config(&[("delivery.timeout.ms", "2500")]);
        assert_eq!(
            alias.delivery_timeout().unwrap(),
            Some(Duration::from_millis(2500))
        );
        let props = alias.client_properties().unwrap();
        assert!(!props.contains_key("delivery.timeout.ms"));
        assert_eq!(props["message.timeout.ms"], "0");
        assert_eq!(
            config(&[("message.timeout.ms", "0")])
                .delivery_timeout()
                .unwrap(),
            None
        );
        let err = config(&[("message.timeout.ms", "soon")])
            .client_properties()
            .unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str(), err.reason),
            ("message.timeout.ms", "soon", ConfigReason::NotMilliseconds)
        );
        assert!(
            err.to_string().contains("not a number of milliseconds"),
            "{err}"
        );
    }

    #[test]
    fn defaults_and_guarantees_are_set() {
        assert_eq!(config(&[]).client_properties().unwrap()["linger.ms"], "1");
        let props = config(&[("linger.ms", "20")]).client_properties().unwrap();
        assert_eq!(props["enable.idempotence"], "true");
        assert_eq!(props["acks"], "all");
        assert_eq!(props["partitioner"], "murmur2_random");
        assert_eq!(
            props["linger.ms"], "20",
            "user properties override defaults"
        );
        assert_eq!(props["bootstrap.servers"], "127.0.0.1:9092");
    }

    #[test]
    fn guarantees_cannot_be_weakened() {
        let err = config(&[("acks", "1")]).client_properties().unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.reason),
            ("acks", ConfigReason::Weakens { required: "all" })
        );
        assert!(
            err.to_string().contains("acks=all: remove the property"),
            "{err}"
        );
        let err = config(&[("enable.idempotence", "false")])
            .client_properties()
            .unwrap_err();
        assert_eq!(err.reason, ConfigReason::Weakens { required: "true" });
        assert!(config(&[("acks", "-1")]).client_properties().is_ok());
        // One request in flight per connection, under either of librdkafka's names.
        assert_eq!(
            config(&[]).client_properties().unwrap()["max.in.flight.requests.per.connection"],
            "1"
        );
        for key in ["max.in.flight.requests.per.connection", "max.in.flight"] {
            let err = config(&[(key, "5")]).client_properties().unwrap_err();
            assert_eq!(
                (err.key.as_str(), err.value.as_str(), err.reason),
                (key, "5", ConfigReason::Weakens { required: "1" })
            );
        }
        let err = config(&[("request.required.acks", "1")])
            .client_properties()
            .unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.reason),
            (
                "request.required.acks",
                ConfigReason::Weakens { required: "all" }
            )
        );
        let err = config(&[("bootstrap.servers", "elsewhere:9092")])
            .client_properties()
            .unwrap_err();
        assert_eq!(
            err.reason,
            ConfigReason::SetBySiphon {
                setting: "kafka.bootstrap_servers"
            }
        );
        assert!(err.to_string().contains("kafka.bootstrap_servers"), "{err}");
    }
}
