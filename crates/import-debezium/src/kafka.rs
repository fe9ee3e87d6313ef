//! `[kafka]`, `[kafka.properties]` and `[kafka.topic_creation]`: the connector's
//! `producer.override.*` keys in librdkafka's names, and `topic.creation.*`.
//!
//! # Invariants
//! - A Java producer property reaches `[kafka.properties]` only under the librdkafka name that
//!   means the same thing ([`producer_property`]); the rest are notes.
//! - `acks` and `enable.idempotence` are never written: Siphon fixes them (all, true), and a
//!   note says so when the connector asked for something weaker.
//! - `kafka.bootstrap_servers` is always written: the override if there is one, otherwise
//!   [`BOOTSTRAP_PLACEHOLDER`] with a note.

use super::output::{string, Output};
use super::props::{keyed, Props};
use super::BOOTSTRAP_PLACEHOLDER;

/// How a Java producer property carries over to librdkafka.
enum ProducerProperty<'a> {
    /// The librdkafka property of that name takes the same value.
    Same(&'a str),
    /// Fixed by Siphon to this value.
    Fixed(&'static str),
    /// Cannot carry over, for this reason.
    No(&'static str),
}

fn producer_property(java: &str) -> ProducerProperty<'_> {
    use ProducerProperty::{Fixed, No, Same};
    match java {
        "compression.type"
        | "linger.ms"
        | "batch.size"
        | "client.id"
        | "retries"
        | "retry.backoff.ms"
        | "request.timeout.ms"
        | "max.in.flight.requests.per.connection"
        | "metadata.max.age.ms"
        | "connections.max.idle.ms"
        | "reconnect.backoff.ms"
        | "reconnect.backoff.max.ms"
        | "socket.connection.setup.timeout.ms"
        | "security.protocol"
        | "sasl.mechanism"
        | "sasl.kerberos.service.name"
        | "ssl.endpoint.identification.algorithm"
        | "ssl.cipher.suites"
        | "ssl.keystore.location"
        | "ssl.keystore.password"
        | "ssl.key.password" => Same(java),
        "max.request.size" => Same("message.max.bytes"),
        "delivery.timeout.ms" => Same("message.timeout.ms"),
        "send.buffer.bytes" => Same("socket.send.buffer.bytes"),
        "receive.buffer.bytes" => Same("socket.receive.buffer.bytes"),
        "acks" => Fixed("all"),
        "enable.idempotence" => Fixed("true"),
        "bootstrap.servers" => No("used as kafka.bootstrap_servers"),
        "sasl.jaas.config" => No("librdkafka takes the SASL credentials as sasl.username and sasl.password: set them in [kafka.properties], the password preferably with SIPHON_KAFKA_PROPERTIES_SASL_PASSWORD"),
        "ssl.truststore.location" | "ssl.truststore.password" | "ssl.truststore.type" => No("librdkafka reads CA certificates in PEM: convert the truststore and set ssl.ca.location"),
        "ssl.keystore.type" => No("librdkafka reads a PKCS#12 keystore (ssl.keystore.location) or PEM files (ssl.certificate.location, ssl.key.location)"),
        "buffer.memory" => No("Siphon bounds producer memory with pipeline.max_in_flight_bytes"),
        "partitioner.class" => No("Siphon always partitions by murmur2 of the key, as the Java client's default partitioner does; a custom partitioner cannot carry over"),
        "key.serializer" | "value.serializer" => No("Siphon writes the bytes the [format] section describes"),
        "transactional.id" | "transaction.timeout.ms" => No("Siphon does not use Kafka transactions; it uses the idempotent producer"),
        _ => No("no known librdkafka equivalent; add the librdkafka property to [kafka.properties] by hand if it matters"),
    }
}

/// Fills `[kafka]`, `[kafka.properties]` and `[kafka.topic_creation]`.
pub(super) fn section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) {
    let mut bootstrap = None;
    for key in props.keys_with_prefix("producer.override.") {
        let value = props.take(&key).unwrap_or_default();
        let java = &key["producer.override.".len()..];
        if java == "bootstrap.servers" {
            bootstrap = Some(value);
            continue;
        }
        match producer_property(java) {
            ProducerProperty::Same(name) => {
                out.properties.insert(name.to_owned(), string(value));
            }
            ProducerProperty::Fixed(fixed) => {
                let same = value.eq_ignore_ascii_case(fixed) || (java == "acks" && value == "-1");
                if !same {
                    notes.push(keyed(
                        &key,
                        &value,
                        &format!("Siphon always sets {java}={fixed} (with enable.idempotence and acks=all no acknowledged record is lost or reordered)"),
                    ));
                }
            }
            ProducerProperty::No(reason) => notes.push(keyed(&key, &value, reason)),
        }
    }
    match bootstrap {
        Some(servers) => {
            out.kafka
                .insert("bootstrap_servers".into(), string(servers));
            notes.push(
                "The Connect worker's own producer settings (producer.* in its properties, e.g. TLS or SASL) are not part of a connector configuration: \
                 carry what the brokers need into [kafka.properties]"
                    .into(),
            );
        }
        None => {
            out.kafka
                .insert("bootstrap_servers".into(), string(BOOTSTRAP_PLACEHOLDER));
            notes.push(format!(
                "kafka.bootstrap_servers is a placeholder ({BOOTSTRAP_PLACEHOLDER}): the brokers are the Connect worker's bootstrap.servers, \
                 not part of a connector configuration. Set them, or SIPHON_KAFKA_BOOTSTRAP_SERVERS, and carry the worker's producer \
                 settings the brokers need (producer.security.protocol, producer.sasl.*, ...) into [kafka.properties]"
            ));
        }
    }

    // topic.creation.default.* -> [kafka.topic_creation]
    let mut creation = Vec::new();
    for (key, field) in [
        ("topic.creation.default.partitions", "partitions"),
        (
            "topic.creation.default.replication.factor",
            "replication_factor",
        ),
    ] {
        if let Some(value) = props.take(key) {
            match value.parse::<i32>() {
                Ok(n) => {
                    let setting = format!("kafka.topic_creation.{field}");
                    match siphon_config::ranges::refusal(&setting, n.into()) {
                        None => creation.push((field, n)),
                        Some(why) => notes.push(format!(
                            "`{key}` = `{value}` is not carried over (-1, the broker's default, applies): {why}"
                        )),
                    }
                }
                Err(_) => notes.push(format!(
                    "`{key}` = `{value}` is not a whole number: not carried over (-1, the broker's default, applies)"
                )),
            }
        }
    }
    if !creation.is_empty() {
        out.topic_creation
            .insert("enabled".into(), toml::Value::Boolean(true));
        for (field, n) in creation {
            out.topic_creation
                .insert(field.into(), toml::Value::Integer(n.into()));
        }
    }
    for key in props.keys_with_prefix("topic.creation.") {
        let value = props.take(&key).unwrap_or_default();
        let reason = if key.starts_with("topic.creation.default.") {
            "Siphon creates topics with a partition count and replication factor only; set other topic settings as broker defaults or create the topics beforehand"
        } else {
            "Siphon has one topic-creation rule for all output topics (the default group); create topics that need other settings beforehand"
        };
        notes.push(keyed(&key, &value, reason));
    }
}

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with, parse};

    #[test]
    fn producer_overrides_map_to_librdkafka_names() {
        let import = import_debezium(&minimal(
            r#", "producer.override.bootstrap.servers": "k1:9092,k2:9092",
               "producer.override.max.request.size": "5000000",
               "producer.override.delivery.timeout.ms": "600000",
               "producer.override.acks": "all",
               "producer.override.enable.idempotence": "false",
               "producer.override.sasl.jaas.config": "PlainLoginModule required password=\"s3cr3t\";""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.kafka.bootstrap_servers, "k1:9092,k2:9092");
        let props = siphon_config::option_strings(&c.kafka.properties, "p").unwrap();
        assert_eq!(props["message.max.bytes"], "5000000");
        assert_eq!(props["message.timeout.ms"], "600000");
        assert!(!props.contains_key("acks") && !props.contains_key("enable.idempotence"));
        note_with(&import, &["enable.idempotence", "always"]);
        note_with(
            &import,
            &["sasl.jaas.config", "value not shown", "sasl.username"],
        );
        assert!(!import
            .notes
            .iter()
            .any(|n| n.contains("`producer.override.acks`")));
        assert!(!import.notes.iter().any(|n| n.contains("s3cr3t")));
    }
}
