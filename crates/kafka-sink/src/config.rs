//! Sink configuration.
//!
//! # Invariants
//! - The properties that Siphon's guarantees rest on (`enable.idempotence`, `acks`) cannot be
//!   weakened by user properties.

use crate::SinkError;
use std::collections::BTreeMap;

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

/// Producer defaults: Kafka Connect's source-task settings plus the Java client's partitioner.
const DEFAULTS: &[(&str, &str)] = &[
    // Same partition for the same key as the Java client.
    ("partitioner", "murmur2_random"),
    // A record not acknowledged in time fails its delivery; the pipeline then rebuilds the
    // producer and resends from the acknowledged position, so a wedged producer cannot stall
    // delivery forever. Nothing is lost either way.
    ("message.timeout.ms", "300000"),
    ("linger.ms", "5"),
    ("socket.keepalive.enable", "true"),
];

/// Properties a user may not override: they carry the no-loss and ordering promises.
/// `enable.gapless.guarantee`: a record that fails (timed out, refused) fails the producer
/// instead of leaving a gap that later records of its partition would be written after; the
/// session then resends everything unacknowledged in order on a new producer.
const REQUIRED: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
];

impl SinkConfig {
    /// The full librdkafka configuration: defaults, then user properties, then required ones.
    pub fn client_properties(&self) -> Result<BTreeMap<String, String>, SinkError> {
        let mut props: BTreeMap<String, String> = DEFAULTS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (key, value) in &self.properties {
            if let Some((_, required)) = REQUIRED.iter().find(|(k, _)| k == key) {
                let acceptable = value == required || (key == "acks" && (value == "-1"));
                if !acceptable {
                    return Err(SinkError::Config(format!(
                        "kafka.properties.\"{key}\" = \"{value}\" would allow lost or reordered records; Siphon always uses {key}={required}: remove the property"
                    )));
                }
            }
            if key == "bootstrap.servers" {
                return Err(SinkError::Config(
                    "set the brokers with kafka.bootstrap_servers, not kafka.properties.\"bootstrap.servers\"".into(),
                ));
            }
            props.insert(key.clone(), value.clone());
        }
        for (key, value) in REQUIRED {
            props.insert((*key).to_owned(), (*value).to_owned());
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
        }
    }

    #[test]
    fn defaults_and_guarantees_are_set() {
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
        assert!(err.to_string().contains("acks"), "{err}");
        assert!(config(&[("enable.idempotence", "false")])
            .client_properties()
            .is_err());
        assert!(config(&[("acks", "-1")]).client_properties().is_ok());
    }
}
