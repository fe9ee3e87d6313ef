//! What the state topic and the progress topic share: a compacted topic of Siphon's own,
//! reached with the sink's connection properties, created compacted with one partition, its
//! records all in one partition, and its failures typed by operation and librdkafka code.
//!
//! # One partition for every record
//! Kafka orders records within a partition only. A partitioner that hashes the key over the
//! partitions moves a key when partitions are added (an operator's `kafka-topics --alter
//! --partitions`, or a topic auto-created with the brokers' `num.partitions`): the key's older
//! records stay in the partition it left, and nothing says which of the two is newer (record
//! timestamps come from writers' clocks, and a record's content need not grow). So Siphon writes
//! every record of its own topics to [`OWN_PARTITION`], explicitly, whatever the partition
//! count: a key never moves, and its last record there is its newest. Readers look at
//! [`OWN_PARTITION`] first and take its record of the key; the other partitions are looked at
//! only when it has none (records a partitioner placed: written by a tool, or by a Siphon that
//! let the partitioner place them).
//!
//! # Invariants
//! - Every record Siphon writes to its own topics goes to [`OWN_PARTITION`]; readers go through
//!   [`reading_order`].
//! - Clients built here carry the connection properties only (no producer settings): a
//!   transactional id never reaches a consumer or an admin client.
//! - Every failure carries the librdkafka code and the operation; a timeout code is
//!   [`StateTopicError::TimedOut`]; none is classified by its text.
//! - A connection refused for its SASL credentials is reported to the client's context (at
//!   the latest when the client is dropped), not to the request, which fails as a transport
//!   failure or a timeout. Every operation's result is settled once its clients are gone: such
//!   a failure after a definite refusal (one after which the brokers, asked again, did not
//!   answer and refused a fresh login too: see [`crate::login`]; a single refusal may be a
//!   handshake cut by a broker going away) is the refusal, a definite error naming the
//!   credentials. A reader asking for the topic's partitions asks again every
//!   [`METADATA_STEP`] while the brokers cannot be reached, serving its queued errors between
//!   steps and trying a fresh login once a refusal waits for one, so a refusal ends it within
//!   seconds.

use crate::error::{credentials_fix, is_connection_failure, is_refused_login};
use crate::login::LoginRefusals;
use crate::topics::{connection_properties, refused_before_lookup};
use crate::TopicCreation;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use siphon_core::Consequence;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The partition every record of Siphon's own topics is written to (see the module docs).
pub const OWN_PARTITION: i32 = 0;

/// `partitions` in the order a reader looks for a key: [`OWN_PARTITION`] first, whose record
/// of the key is the newest whenever it has one, then the others in order.
pub(crate) fn reading_order(mut partitions: Vec<i32>) -> Vec<i32> {
    partitions.sort_unstable_by_key(|p| (*p != OWN_PARTITION, *p));
    partitions
}

/// How long one read or write of the state topic may take.
pub const STATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one metadata request waits before the client's queued errors are looked at.
const METADATA_STEP: Duration = Duration::from_secs(1);

/// What was being done with the state topic when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOperation {
    /// Building a client from the configured properties.
    Configure,
    /// Creating the topic.
    Create,
    /// Reading the topic's partitions and their records.
    Read,
    /// Writing a record.
    Write,
}

impl fmt::Display for StateOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateOperation::Configure => "configuring a client for",
            StateOperation::Create => "creating",
            StateOperation::Read => "reading",
            StateOperation::Write => "writing to",
        })
    }
}

/// A failure to read or write the state topic.
#[derive(Debug, thiserror::Error)]
pub enum StateTopicError {
    /// Kafka (or librdkafka) answered with an error code.
    #[error("{operation} Kafka topic {topic:?}, where Siphon keeps its state across restarts: {code}{}", hint(*code))]
    Kafka {
        topic: String,
        operation: StateOperation,
        code: RDKafkaErrorCode,
    },
    /// No answer within [`STATE_TIMEOUT`].
    #[error("{operation} Kafka topic {topic:?}, where Siphon keeps its state across restarts, took more than {}s", STATE_TIMEOUT.as_secs())]
    TimedOut {
        topic: String,
        operation: StateOperation,
    },
    /// The topic is missing and Siphon may not create it.
    #[error("Kafka topic {topic:?}, where Siphon keeps its state across restarts, does not exist and kafka.topic_creation.enabled is false: create it (cleanup.policy=compact, one partition), or name another one with kafka.state_topic")]
    Missing { topic: String },
}

fn hint(code: RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::TopicAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed
        | RDKafkaErrorCode::GroupAuthorizationFailed => {
            ": grant Siphon's principal READ, WRITE and DESCRIBE on it (and CREATE, or create it yourself with cleanup.policy=compact), or name another one with kafka.state_topic"
        }
        RDKafkaErrorCode::InvalidConfig
        | RDKafkaErrorCode::InvalidReplicationFactor
        | RDKafkaErrorCode::PolicyViolation => {
            ": check kafka.topic_creation.replication_factor, or create the topic yourself (cleanup.policy=compact, one partition)"
        }
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
            concat!(
                ": the brokers refused Siphon's credentials; ",
                credentials_fix!()
            )
        }
        _ => "",
    }
}

impl StateTopicError {
    /// What the failure means: a refusal only the operator can lift is [`Consequence::Fix`];
    /// anything else may pass (a broker restarting, a leader moving).
    pub fn consequence(&self) -> Consequence {
        match self {
            StateTopicError::Missing { .. } => Consequence::Fix,
            StateTopicError::TimedOut { .. } => Consequence::Retry,
            StateTopicError::Kafka { code, .. } => match code {
                RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::InvalidConfig
                | RDKafkaErrorCode::InvalidReplicationFactor
                | RDKafkaErrorCode::PolicyViolation
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidArgument => Consequence::Fix,
                _ => Consequence::Retry,
            },
        }
    }
}

/// The context of every client of a compacted topic: client errors logged as the producer's
/// are; the end of a partition, which a reader asks to be told of, is no error; a refused
/// authentication is remembered for the topic (see the module's invariants).
pub(crate) struct TopicClientContext {
    logins: Arc<LoginRefusals>,
}

impl ClientContext for TopicClientContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if is_refused_login(&error) {
            self.logins.refused(Instant::now(), reason);
        } else if is_connection_failure(&error) {
            self.logins.connection_failed();
        }
        match error.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::PartitionEOF
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown,
            ) => tracing::debug!(%error, reason, "Kafka reader"),
            _ => tracing::warn!(%error, reason, "Kafka client error"),
        }
    }
}

impl ConsumerContext for TopicClientContext {}

/// A reader of Siphon's compacted topics.
pub(crate) type Reader = BaseConsumer<TopicClientContext>;

/// A compacted topic of Siphon's own.
#[derive(Debug, Clone)]
pub(crate) struct CompactedTopic {
    pub(crate) topic: String,
    /// Connection properties (bootstrap servers, security), without producer-only ones.
    pub(crate) connection: BTreeMap<String, String>,
    pub(crate) creation: TopicCreation,
    /// Its clients' refused logins.
    logins: Arc<LoginRefusals>,
}

impl CompactedTopic {
    /// `topic`, reached with the sink's client properties.
    pub(crate) fn new(
        topic: &str,
        client_properties: &BTreeMap<String, String>,
        creation: TopicCreation,
    ) -> Self {
        let connection = connection_properties(client_properties);
        CompactedTopic {
            topic: topic.to_owned(),
            logins: Arc::new(LoginRefusals::new(connection.clone())),
            connection,
            creation,
        }
    }

    /// Creates the topic, compacted with one partition and `configs`, unless it exists. A
    /// creation refused for authorization is success when the topic exists: brokers check
    /// CREATE before they look for the topic, and a topic an operator created needs none.
    pub(crate) async fn create(
        &self,
        configs: &[(&str, &str)],
        what: &str,
    ) -> Result<(), StateTopicError> {
        let admin: AdminClient<TopicClientContext> =
            self.client(&self.connection, StateOperation::Create)?;
        let mut topic = NewTopic::new(
            &self.topic,
            1,
            TopicReplication::Fixed(self.creation.replication_factor),
        )
        .set("cleanup.policy", "compact");
        for (key, value) in configs {
            topic = topic.set(key, value);
        }
        let options = AdminOptions::new()
            .request_timeout(Some(STATE_TIMEOUT))
            .operation_timeout(Some(STATE_TIMEOUT));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .map_err(|e| self.kafka(StateOperation::Create, &e))?;
        for result in results {
            match result {
                Ok(_) => {
                    tracing::info!(topic = %self.topic, "created the {what} topic (compacted, one partition)")
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) if refused_before_lookup(code) => {
                    if !self.exists().await? {
                        return Err(self.failed(StateOperation::Create, code));
                    }
                }
                Err((_, code)) => return Err(self.failed(StateOperation::Create, code)),
            }
        }
        Ok(())
    }

    /// Whether the topic exists, asked on a blocking thread.
    pub(crate) async fn exists(&self) -> Result<bool, StateTopicError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let consumer = this.consumer(&[])?;
            Ok(this.partitions(&consumer, STATE_TIMEOUT)?.is_some())
        })
        .await
        .unwrap_or_else(|_| Err(self.failed(StateOperation::Read, RDKafkaErrorCode::Fail)))
    }

    /// A consumer of assigned partitions only (it never joins its group nor commits, and its
    /// metadata requests never create the topic), with `extra` properties.
    pub(crate) fn consumer(&self, extra: &[(&str, &str)]) -> Result<Reader, StateTopicError> {
        let mut properties = self.connection.clone();
        properties.insert("enable.auto.commit".into(), "false".into());
        properties.insert("enable.partition.eof".into(), "false".into());
        properties.insert("allow.auto.create.topics".into(), "false".into());
        properties.insert("group.id".into(), "siphon-state-reader".into());
        for (key, value) in extra {
            properties.insert((*key).into(), (*value).into());
        }
        let mut config = ClientConfig::new();
        for (key, value) in &properties {
            config.set(key, value);
        }
        config
            .create_with_context(self.context())
            .map_err(|_| self.failed(StateOperation::Read, RDKafkaErrorCode::InvalidArgument))
    }

    /// The topic's partitions, `None` when it does not exist. Asked again in steps of
    /// [`METADATA_STEP`] while the brokers cannot be reached, serving the client's queued
    /// errors between steps: refused credentials end it at once (the refusal reaches only the
    /// context), anything else at `timeout`. `consumer` must not be assigned partitions yet.
    pub(crate) fn partitions(
        &self,
        consumer: &Reader,
        timeout: Duration,
    ) -> Result<Option<Vec<i32>>, StateTopicError> {
        let deadline = Instant::now() + timeout;
        let metadata = loop {
            let asked = Instant::now();
            let left = deadline.saturating_duration_since(asked);
            match consumer.fetch_metadata(Some(&self.topic), left.min(METADATA_STEP)) {
                Ok(metadata) => {
                    self.logins.asked(asked, true);
                    break metadata;
                }
                Err(e) => {
                    let unreachable = matches!(
                        e.rdkafka_error_code(),
                        Some(
                            RDKafkaErrorCode::BrokerTransportFailure
                                | RDKafkaErrorCode::AllBrokersDown
                                | RDKafkaErrorCode::OperationTimedOut
                        )
                    );
                    // Serves queued errors to the context (no partition is assigned, so no
                    // record can be taken here).
                    let _ = consumer.poll(Duration::ZERO);
                    if unreachable {
                        self.logins.asked(asked, false);
                        self.logins.confirm(left.min(METADATA_STEP * 2));
                    }
                    if !unreachable || self.logins.definite().is_some() || left <= METADATA_STEP {
                        return Err(self.kafka(StateOperation::Read, &e));
                    }
                }
            }
        };
        let Some(topic) = metadata.topics().iter().find(|t| t.name() == self.topic) else {
            return Ok(None);
        };
        match topic.error().map(RDKafkaErrorCode::from) {
            None => Ok(Some(topic.partitions().iter().map(|p| p.id()).collect())),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Ok(None),
            Some(code) => Err(self.failed(StateOperation::Read, code)),
        }
    }

    /// A client of the topic with `properties`, with the topic's context.
    pub(crate) fn client<C: rdkafka::config::FromClientConfigAndContext<TopicClientContext>>(
        &self,
        properties: &BTreeMap<String, String>,
        operation: StateOperation,
    ) -> Result<C, StateTopicError> {
        let mut config = ClientConfig::new();
        for (key, value) in properties {
            config.set(key, value);
        }
        // Only properties librdkafka refuses fail here.
        config
            .create_with_context(self.context())
            .map_err(|_| self.failed(operation, RDKafkaErrorCode::InvalidArgument))
    }

    fn context(&self) -> TopicClientContext {
        TopicClientContext {
            logins: Arc::clone(&self.logins),
        }
    }

    pub(crate) fn kafka(&self, operation: StateOperation, error: &KafkaError) -> StateTopicError {
        self.failed(
            operation,
            error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        )
    }

    pub(crate) fn failed(
        &self,
        operation: StateOperation,
        code: RDKafkaErrorCode,
    ) -> StateTopicError {
        if code == RDKafkaErrorCode::OperationTimedOut || code == RDKafkaErrorCode::MessageTimedOut
        {
            return self.timed_out(operation);
        }
        StateTopicError::Kafka {
            topic: self.topic.clone(),
            operation,
            code,
        }
    }

    pub(crate) fn timed_out(&self, operation: StateOperation) -> StateTopicError {
        StateTopicError::TimedOut {
            topic: self.topic.clone(),
            operation,
        }
    }

    /// `result` of an operation whose clients are gone (so their contexts were told every
    /// error librdkafka had queued): a transport failure or a timeout after the brokers refused
    /// the credentials is that refusal (see the module's invariants).
    pub(crate) fn settled<T>(
        &self,
        result: Result<T, StateTopicError>,
    ) -> Result<T, StateTopicError> {
        let operation = match &result {
            Err(StateTopicError::TimedOut { operation, .. }) => *operation,
            Err(StateTopicError::Kafka {
                operation,
                code: RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
                ..
            }) => *operation,
            _ => return result,
        };
        if self.logins.definite().is_none() {
            return result;
        }
        Err(StateTopicError::Kafka {
            topic: self.topic.clone(),
            operation,
            code: RDKafkaErrorCode::Authentication,
        })
    }

    /// The topic is missing and may not be created.
    pub(crate) fn missing(&self) -> StateTopicError {
        StateTopicError::Missing {
            topic: self.topic.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::login::FreshLogin;

    #[test]
    fn readers_look_at_the_own_partition_first() {
        assert_eq!(reading_order(vec![3, 1, 0, 2]), vec![0, 1, 2, 3]);
        assert_eq!(reading_order(vec![2, 1]), vec![1, 2]);
        assert_eq!(reading_order(Vec::new()), Vec::<i32>::new());
    }

    fn topic() -> CompactedTopic {
        CompactedTopic::new("siphon.state", &BTreeMap::new(), TopicCreation::default())
    }

    #[test]
    fn transport_failures_after_refused_credentials_are_definite_and_name_them() {
        let topic = topic();
        let settled = |failure| topic.settled::<()>(Err(failure)).unwrap_err();
        for failure in [
            topic.failed(
                StateOperation::Read,
                RDKafkaErrorCode::BrokerTransportFailure,
            ),
            topic.timed_out(StateOperation::Read),
        ] {
            let failure = settled(failure);
            assert_eq!(failure.consequence(), Consequence::Retry, "{failure}");
        }
        // The brokers refuse the credentials: librdkafka tells the client's context, each
        // time a client logs in. One refusal may be a handshake cut short; not yet definite.
        let reason =
            "SASL authentication error: Authentication failed: Invalid username or password";
        topic
            .context()
            .error(KafkaError::Global(RDKafkaErrorCode::Authentication), reason);
        let failure = settled(topic.timed_out(StateOperation::Read));
        assert_eq!(failure.consequence(), Consequence::Retry, "{failure}");
        // The brokers, asked after the refusal, do not answer.
        topic.logins.asked(Instant::now(), false);
        let failure = settled(topic.timed_out(StateOperation::Read));
        assert_eq!(
            failure.consequence(),
            Consequence::Retry,
            "brokers that hang refuse nothing: {failure}"
        );
        // A fresh login is refused too.
        topic
            .logins
            .tried(FreshLogin::Refused("refused afresh".into()));
        for failure in [
            topic.failed(
                StateOperation::Read,
                RDKafkaErrorCode::BrokerTransportFailure,
            ),
            topic.failed(StateOperation::Create, RDKafkaErrorCode::AllBrokersDown),
            topic.failed(StateOperation::Read, RDKafkaErrorCode::OperationTimedOut),
            topic.timed_out(StateOperation::Write),
        ] {
            let failure = settled(failure);
            assert_eq!(failure.consequence(), Consequence::Fix, "{failure}");
            assert!(
                failure.to_string().contains("\"sasl.password\""),
                "{failure}"
            );
        }
        // Other codes keep their own meaning.
        let leader = settled(topic.failed(
            StateOperation::Read,
            RDKafkaErrorCode::NotLeaderForPartition,
        ));
        assert_eq!(leader.consequence(), Consequence::Retry);
    }
}
