//! Sink errors, and what a failed delivery means.
//!
//! Every librdkafka error code is sorted by its consequence ([`Consequence`]):
//!
//! - the record itself is refused for good ([`Consequence::RecordRefused`]): the pipeline's
//!   `on_error` applies (stop naming the record, or dead-letter it);
//! - the record was refused only because another record of its batch was
//!   ([`Consequence::RefusedWithOthers`]): send it again as it is;
//! - the producer or its connection failed or timed out ([`Consequence::ProducerFailed`]):
//!   rebuild the producer and send again (after a backoff);
//! - the operator must change the configuration, the broker or its authorization
//!   ([`Consequence::OperatorFix`]): stop, naming the fix. Codes a produce request cannot
//!   return (consumer groups, transactions, administration) are here too: meeting one means
//!   something is wrong that retrying will not cure.
//!
//! librdkafka itself retries the broker codes it considers retriable (not leader, not enough
//! replicas, storage error, timeouts ...) for as long as the record waits (librdkafka's own
//! `message.timeout.ms` is off; the session's delivery deadline purges the producer, and the
//! purged records reach Siphon as `PurgeQueue`/`PurgeInflight`); every other broker code fails the records of the batch it answered
//! (`rd_kafka_handle_Produce_error`, `rd_kafka_err_action` in librdkafka's
//! `rdkafka_request.c`). A broker refuses a whole batch: one refused record takes the innocent
//! records sharing its batch with it (unless the broker names the record, Produce v8+
//! `record_errors`: the others then fail with `InvalidDifferentRecord`). Telling the guilty record
//! from the innocent ones means sending them again one at a time.
//!
//! # Invariants
//! - [`consequence`] names a consequence for every code librdkafka knows ([`explicit`] is
//!   `Some` for each): none falls to a default. Codes added by later librdkafka versions are
//!   [`Consequence::OperatorFix`]: stop rather than guess.
//! - A [`DeliveryError::Definite`] cannot be cured by sending the same record again; a
//!   [`DeliveryError::Transient`] can.
//! - Every error keeps the librdkafka code it came from.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Errors creating the producer, creating topics or enqueueing records.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// The configuration is rejected; the message names the property.
    #[error("{0}")]
    Config(String),
    /// The broker is unreachable or refused a request that may succeed later.
    #[error("Kafka unavailable: {0}")]
    Transient(String),
    /// The broker refused a request for good; the message names the fix.
    #[error("{0}")]
    Definite(String),
    /// [`crate::KafkaSink::rebuild`] was asked for while the producer retired by the previous
    /// rebuild still has records to report: at most one retired producer waits at a time. Await
    /// [`crate::KafkaSink::retired_reported`] (or receive its reports) and ask again.
    #[error("the Kafka producer retired at generation {generation} still has {unreported} record(s) to report; not replacing the current one yet")]
    RetiredStillReporting { generation: u64, unreported: usize },
}

impl SinkError {
    /// Whether retrying (after reconnecting) may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SinkError::Transient(_) | SinkError::RetiredStillReporting { .. }
        )
    }
}

/// What a failed delivery means for the record and for the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Consequence {
    /// The broker (or librdkafka) refuses this record for good: `on_error` applies. The refusal
    /// may have been earned by another record of the same batch.
    RecordRefused,
    /// Refused only because another record of its batch was: send it again as it is.
    RefusedWithOthers,
    /// The producer or its connection failed or timed out: rebuild it and send again.
    ProducerFailed,
    /// The configuration, the broker or an authorization must change: stop, naming the fix.
    OperatorFix,
}

/// The consequence of a failed delivery with `code`.
pub fn consequence(code: RDKafkaErrorCode) -> Consequence {
    explicit(code).unwrap_or(Consequence::OperatorFix)
}

/// The consequence named for `code`, `None` for a code this table does not know (one added by a
/// later librdkafka version).
pub fn explicit(code: RDKafkaErrorCode) -> Option<Consequence> {
    use Consequence::*;
    use RDKafkaErrorCode as C;
    let consequence = match code {
        // The record (or its batch) is refused for good.
        C::InvalidMessage // CORRUPT_MESSAGE: CRC or format check failed
        | C::InvalidMessageSize
        | C::MessageSizeTooLarge
        | C::MessageBatchTooLarge // RECORD_LIST_TOO_LARGE
        | C::InvalidTimestamp
        | C::UnsupportedForMessageFormat
        | C::PolicyViolation
        | C::InvalidRecord
        | C::InvalidTopic
        | C::UnknownTopic
        | C::UnknownPartition
        | C::BadMessage
        | C::BadCompression
        | C::KeySerialization
        | C::ValueSerialization => RecordRefused,

        C::InvalidDifferentRecord => RefusedWithOthers,

        // The producer, its connection or the partition's leadership failed or timed out.
        C::MessageTimedOut
        | C::PurgeQueue
        | C::PurgeInflight
        | C::Fatal
        | C::Inconsistent
        | C::GaplessGuarantee
        | C::Fail
        | C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::OperationTimedOut
        | C::TimedOutQueue
        | C::QueueFull
        | C::Retry
        | C::BrokerDestroy
        | C::DestroyBroker
        | C::NodeUpdate
        | C::CriticalSystemResource
        | C::FileSystem
        | C::ISRInsufficient
        | C::Interrupted
        | C::WaitCache
        | C::UnknownBroker
        | C::OffsetOutOfRange
        | C::UnknownTopicOrPartition
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::RequestTimedOut
        | C::BrokerNotAvailable
        | C::ReplicaNotAvailable
        | C::NetworkException
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::OutOfOrderSequenceNumber
        | C::DuplicateSequenceNumber
        | C::InvalidProducerEpoch
        | C::InvalidProducerIdMapping
        | C::UnknownProducerId
        | C::ProducerFenced
        | C::OperationNotAttempted
        | C::KafkaStorageError
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::PreferredLeaderNotAvailable
        | C::EligibleLeadersNotAvailable
        | C::ThrottlingQuotaExceeded
        | C::UnknownTopicId
        | C::StaleControllerEpoch
        | C::NotController
        | C::StaleBrokerEpoch
        | C::RebootstrapRequired => ProducerFailed,

        // Authorization, security and configuration: the operator must act.
        C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::DelegationTokenAuthorizationFailed
        | C::Authentication
        | C::SSL
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::SecurityDisabled
        | C::UnacceptableCredential
        | C::PrincipalDeserializationFailure
        | C::InvalidPrincipalType
        | C::DelegationTokenAuthDisabled
        | C::DelegationTokenNotFound
        | C::DelegationTokenOwnerMismatch
        | C::DelegationTokenRequestNotAllowed
        | C::DelegationTokenExpired
        | C::InvalidRequiredAcks
        | C::UnsupportedCompressionType
        | C::UnsupportedVersion
        | C::UnsupportedFeature
        | C::NotImplemented
        | C::InvalidRequest
        | C::InvalidConfig
        | C::InvalidArgument
        | C::NotConfigured
        | C::UnknownProtocol
        | C::InvalidType
        | C::ReadOnly
        | C::State
        | C::Conflict
        | C::TopicDeletionDisabled
        | C::ListenerNotFound
        | C::LogDirNotFound
        | C::Unknown // UNKNOWN_SERVER_ERROR: not retriable, cause unknown
        // Codes a produce request does not return (consumers, groups, transactions,
        // administration, internal markers): unexpected, so stop rather than guess.
        | C::Begin
        | C::End
        | C::EndAll
        | C::NoError
        | C::PartitionEOF
        | C::WaitingForCoordinator
        | C::UnknownGroup
        | C::InProgress
        | C::PreviousInProgress
        | C::ExistingSubscription
        | C::AssignPartitions
        | C::RevokePartitions
        | C::NoOffset
        | C::Outdated
        | C::KeyDeserialization
        | C::ValueDeserialization
        | C::Partial
        | C::NoEnt
        | C::Underflow
        | C::PollExceeded
        | C::Fenced
        | C::Application
        | C::AssignmentLost
        | C::Noop
        | C::AutoOffsetReset
        | C::LogTruncation
        | C::OffsetMetadataTooLarge
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::IllegalGeneration
        | C::InconsistentGroupProtocol
        | C::InvalidGroupId
        | C::UnknownMemberId
        | C::InvalidSessionTimeout
        | C::RebalanceInProgress
        | C::InvalidCommitOffsetSize
        | C::TopicAlreadyExists
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::InvalidReplicaAssignment
        | C::InvalidTransactionalState
        | C::InvalidTransactionTimeout
        | C::ConcurrentTransactions
        | C::TransactionCoordinatorFenced
        | C::ReassignmentInProgress
        | C::NonEmptyGroup
        | C::GroupIdNotFound
        | C::FetchSessionIdNotFound
        | C::InvalidFetchSessionEpoch
        | C::OffsetNotAvailable
        | C::MemberIdRequired
        | C::GroupMaxSizeReached
        | C::FencedInstanceId
        | C::ElectionNotNeeded
        | C::NoReassignmentInProgress
        | C::GroupSubscribedToTopic
        | C::UnstableOffsetCommit
        | C::ResourceNotFound
        | C::DuplicateResource
        | C::InconsistentVoterSet
        | C::InvalidUpdateVersion
        | C::FeatureUpdateFailed
        | C::FencedMemberEpoch
        | C::UnreleasedInstanceId
        | C::UnsupportedAssignor
        | C::StaleMemberEpoch
        | C::UnknownSubscriptionId
        | C::TelemetryTooLarge => OperatorFix,
        _ => return None,
    };
    Some(consequence)
}

/// What to change so that a record refused with `code` is accepted (for messages).
fn fix(code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => {
            "raise the topic's max.message.bytes (and kafka.properties.\"message.max.bytes\"), or make the payload smaller"
        }
        C::InvalidTimestamp => {
            "the record's timestamp is outside the topic's message.timestamp.before/after.max.ms (or the broker's log.message.timestamp.difference.max.ms): widen them, or check the outbox timestamp column and the database clock"
        }
        C::PolicyViolation => {
            "the broker's policy (a create-topic or produce policy, or a proxy enforcing one) refuses the record: change the policy or the record"
        }
        C::UnsupportedForMessageFormat => {
            "the topic's message.format.version is too old for record headers or timestamps: raise it (or the broker's log.message.format.version)"
        }
        C::InvalidRecord | C::InvalidMessage | C::BadMessage => {
            "the broker rejected the record's content (a record validation such as compaction needing a key, or a corrupt batch): check the topic's cleanup.policy and the record"
        }
        C::InvalidTopic | C::UnknownTopic => {
            "check route.topic.replacement and the topic name rules, or create the topic (if it was deleted while Siphon wrote to it, start Siphon again: what was not acknowledged is sent again)"
        }
        C::UnknownPartition => "the topic does not have the partition the record went to: it was deleted while Siphon wrote to it (and created again with fewer partitions), or the partition column names one it does not have. Nothing unacknowledged was confirmed: start Siphon again to send it to the topic as it is now, or add partitions, or check the partition column",
        C::BadCompression | C::UnsupportedCompressionType => {
            "check kafka.properties.\"compression.type\" against what the broker supports"
        }
        C::TopicAuthorizationFailed => "grant WRITE on the topic to Siphon's principal",
        C::ClusterAuthorizationFailed => {
            "grant IDEMPOTENT_WRITE on the cluster to Siphon's principal (needed by the idempotent producer on older brokers)"
        }
        C::TransactionalIdAuthorizationFailed | C::GroupAuthorizationFailed | C::DelegationTokenAuthorizationFailed => {
            "grant the missing ACL to Siphon's principal"
        }
        C::Authentication | C::SaslAuthenticationFailed | C::UnsupportedSASLMechanism | C::IllegalSASLState | C::UnacceptableCredential | C::PrincipalDeserializationFailure | C::InvalidPrincipalType | C::SecurityDisabled | C::DelegationTokenAuthDisabled | C::DelegationTokenNotFound | C::DelegationTokenOwnerMismatch | C::DelegationTokenRequestNotAllowed | C::DelegationTokenExpired => {
            "check the kafka.properties security settings (sasl.*, security.protocol) against the broker's listener"
        }
        C::SSL => "check the kafka.properties ssl.* settings and the broker's certificate",
        C::InvalidRequiredAcks => "Siphon sends acks=all: the broker refuses it; check the broker's configuration",
        C::UnsupportedVersion | C::UnsupportedFeature | C::NotImplemented | C::InvalidRequest => {
            "the broker does not support a request the producer needs (idempotent produce): upgrade the broker or check kafka.properties \"api.version.*\" / \"broker.version.fallback\""
        }
        _ => match consequence(code) {
            Consequence::RecordRefused => "the broker refuses the record: change the record or the topic's configuration",
            Consequence::RefusedWithOthers => "another record of the same batch was refused; this one can be sent again",
            Consequence::ProducerFailed => "the producer is rebuilt and the record sent again",
            Consequence::OperatorFix => {
                "this error is not expected for a produce request; check the broker and kafka.properties, and report it if it persists"
            }
        },
    }
}

/// A record the broker (or librdkafka) refuses for good, or refuses until the operator acts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Refusal {
    /// The record's topic.
    pub topic: String,
    /// The librdkafka error code.
    pub code: RDKafkaErrorCode,
    /// [`Consequence::RecordRefused`] or [`Consequence::OperatorFix`].
    pub consequence: Consequence,
}

impl Refusal {
    /// Whether `on_error` applies ([`Consequence::RecordRefused`]); otherwise the operator must
    /// act whatever `on_error` says.
    pub fn on_error_applies(&self) -> bool {
        self.consequence == Consequence::RecordRefused
    }

    fn describe(&self) -> String {
        let code = self.code;
        let number = code as i32;
        match self.consequence {
            Consequence::RecordRefused => format!(
                "a record for topic {} was refused with {code:?} (code {number}): {}",
                self.topic,
                fix(code)
            ),
            _ => format!(
                "writing to topic {} failed with {code:?} (code {number}): {}",
                self.topic,
                fix(code)
            ),
        }
    }
}

/// A delivery the producer failed: rebuilding the producer (for
/// [`Consequence::ProducerFailed`]) and sending the record again can succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delivery to topic {topic} failed with {code:?} (code {number}): {what}", number = *code as i32, what = fix(*code))]
pub struct ProducerFailure {
    /// The record's topic.
    pub topic: String,
    /// The librdkafka error code.
    pub code: RDKafkaErrorCode,
    /// [`Consequence::ProducerFailed`] or [`Consequence::RefusedWithOthers`].
    pub consequence: Consequence,
}

impl ProducerFailure {
    /// Whether the producer must be replaced before sending again (not for a record refused
    /// only for its batch's sake).
    pub fn needs_rebuild(&self) -> bool {
        self.consequence == Consequence::ProducerFailed
    }
}

/// Why a record was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The record can never be written as it is (too large, refused by policy ...), or not
    /// until the operator acts ([`Refusal::on_error_applies`] tells which).
    #[error(transparent)]
    Definite(Refusal),
    /// The producer failed (timeout, fatal idempotence error, purged) or the record was refused
    /// only with its batch: sending it again can succeed.
    #[error(transparent)]
    Transient(ProducerFailure),
}

impl DeliveryError {
    /// Classifies a failed delivery by its librdkafka error code.
    pub fn from_kafka(topic: &str, err: &KafkaError) -> Self {
        // A delivery report always carries a code; without one, treat it as a producer
        // failure (rebuilt and resent after a backoff) rather than refuse the record.
        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        Self::from_code(topic, code)
    }

    /// Classifies a failed delivery of a record for `topic` with `code`.
    pub fn from_code(topic: &str, code: RDKafkaErrorCode) -> Self {
        let topic = topic.to_owned();
        match consequence(code) {
            consequence @ (Consequence::RecordRefused | Consequence::OperatorFix) => {
                DeliveryError::Definite(Refusal {
                    topic,
                    code,
                    consequence,
                })
            }
            consequence @ (Consequence::ProducerFailed | Consequence::RefusedWithOthers) => {
                DeliveryError::Transient(ProducerFailure {
                    topic,
                    code,
                    consequence,
                })
            }
        }
    }

    /// The librdkafka code.
    pub fn code(&self) -> RDKafkaErrorCode {
        match self {
            DeliveryError::Definite(r) => r.code,
            DeliveryError::Transient(f) => f.code,
        }
    }

    /// What the failure means.
    pub fn consequence(&self) -> Consequence {
        match self {
            DeliveryError::Definite(r) => r.consequence,
            DeliveryError::Transient(f) => f.consequence,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaRespErr;
    use Consequence::*;

    /// Every code librdkafka can report.
    fn all_codes() -> Vec<RDKafkaErrorCode> {
        (-300..=300)
            .filter_map(|n| RDKafkaRespErr::try_from(n).ok())
            .map(RDKafkaErrorCode::from)
            .collect()
    }

    #[test]
    fn every_code_has_a_named_consequence() {
        let codes = all_codes();
        assert!(codes.len() > 150, "librdkafka knows {} codes", codes.len());
        for code in codes {
            assert!(
                explicit(code).is_some(),
                "{code:?} ({}) has no consequence",
                code as i32
            );
        }
    }

    /// Broker codes librdkafka fails a produce batch with (permanent for the record), from
    /// `rd_kafka_handle_Produce_error` and the Kafka protocol's error table.
    const TABLE: &[(i32, Consequence)] = &[
        (-1, OperatorFix),         // UNKNOWN_SERVER_ERROR
        (1, ProducerFailed),       // OFFSET_OUT_OF_RANGE (not for produce; retriable)
        (2, RecordRefused),        // CORRUPT_MESSAGE
        (3, ProducerFailed),       // UNKNOWN_TOPIC_OR_PARTITION (retriable)
        (4, RecordRefused),        // INVALID_FETCH_SIZE / invalid message size
        (5, ProducerFailed),       // LEADER_NOT_AVAILABLE
        (6, ProducerFailed),       // NOT_LEADER_OR_FOLLOWER
        (7, ProducerFailed),       // REQUEST_TIMED_OUT
        (8, ProducerFailed),       // BROKER_NOT_AVAILABLE
        (9, ProducerFailed),       // REPLICA_NOT_AVAILABLE
        (10, RecordRefused),       // MESSAGE_TOO_LARGE
        (13, ProducerFailed),      // NETWORK_EXCEPTION
        (17, RecordRefused),       // INVALID_TOPIC_EXCEPTION
        (18, RecordRefused),       // RECORD_LIST_TOO_LARGE
        (19, ProducerFailed),      // NOT_ENOUGH_REPLICAS
        (20, ProducerFailed),      // NOT_ENOUGH_REPLICAS_AFTER_APPEND
        (21, OperatorFix),         // INVALID_REQUIRED_ACKS
        (29, OperatorFix),         // TOPIC_AUTHORIZATION_FAILED
        (31, OperatorFix),         // CLUSTER_AUTHORIZATION_FAILED
        (32, RecordRefused),       // INVALID_TIMESTAMP
        (35, OperatorFix),         // UNSUPPORTED_VERSION
        (42, OperatorFix),         // INVALID_REQUEST
        (43, RecordRefused),       // UNSUPPORTED_FOR_MESSAGE_FORMAT
        (44, RecordRefused),       // POLICY_VIOLATION
        (45, ProducerFailed),      // OUT_OF_ORDER_SEQUENCE_NUMBER
        (46, ProducerFailed),      // DUPLICATE_SEQUENCE_NUMBER
        (47, ProducerFailed),      // INVALID_PRODUCER_EPOCH
        (56, ProducerFailed),      // KAFKA_STORAGE_ERROR
        (59, ProducerFailed),      // UNKNOWN_PRODUCER_ID
        (74, ProducerFailed),      // FENCED_LEADER_EPOCH
        (75, ProducerFailed),      // UNKNOWN_LEADER_EPOCH
        (76, OperatorFix),         // UNSUPPORTED_COMPRESSION_TYPE
        (87, RecordRefused),       // INVALID_RECORD
        (89, ProducerFailed),      // THROTTLING_QUOTA_EXCEEDED
        (90, ProducerFailed),      // PRODUCER_FENCED
        (100, ProducerFailed),     // UNKNOWN_TOPIC_ID
        (129, ProducerFailed),     // REBOOTSTRAP_REQUIRED
        (-138, RefusedWithOthers), // _INVALID_DIFFERENT_RECORD
        (-148, ProducerFailed),    // _GAPLESS_GUARANTEE
        (-150, ProducerFailed),    // _FATAL
        (-151, ProducerFailed),    // _PURGE_INFLIGHT
        (-152, ProducerFailed),    // _PURGE_QUEUE
        (-166, ProducerFailed),    // _TIMED_OUT_QUEUE
        (-169, OperatorFix),       // _AUTHENTICATION
        (-181, OperatorFix),       // _SSL
        (-184, ProducerFailed),    // _QUEUE_FULL
        (-185, ProducerFailed),    // _TIMED_OUT
        (-187, ProducerFailed),    // _ALL_BROKERS_DOWN
        (-188, RecordRefused),     // _UNKNOWN_TOPIC
        (-190, RecordRefused),     // _UNKNOWN_PARTITION
        (-192, ProducerFailed),    // _MSG_TIMED_OUT
        (-195, ProducerFailed),    // _TRANSPORT
        (-199, RecordRefused),     // _BAD_MSG
    ];

    fn code(n: i32) -> RDKafkaErrorCode {
        RDKafkaErrorCode::from(RDKafkaRespErr::try_from(n).expect("a librdkafka code"))
    }

    #[test]
    fn codes_have_the_consequences_librdkafka_gives_them() {
        for &(n, expected) in TABLE {
            assert_eq!(consequence(code(n)), expected, "code {n} ({:?})", code(n));
        }
    }

    #[test]
    fn refused_records_are_definite_and_name_topic_code_and_fix() {
        for &(n, expected) in TABLE {
            let error = DeliveryError::from_code("orders", code(n));
            assert_eq!(error.code(), code(n));
            assert_eq!(error.consequence(), expected);
            let text = error.to_string();
            assert!(text.contains("orders"), "{text}");
            assert!(text.contains(&format!("code {n}")), "{text}");
            match (expected, &error) {
                (RecordRefused, DeliveryError::Definite(r)) => assert!(r.on_error_applies()),
                (OperatorFix, DeliveryError::Definite(r)) => assert!(!r.on_error_applies()),
                (ProducerFailed, DeliveryError::Transient(f)) => assert!(f.needs_rebuild()),
                (RefusedWithOthers, DeliveryError::Transient(f)) => assert!(!f.needs_rebuild()),
                _ => panic!("{n}: {error:?}"),
            }
        }
        let policy = DeliveryError::from_code("orders", RDKafkaErrorCode::PolicyViolation);
        assert!(policy.to_string().contains("policy"), "{policy}");
    }

    #[test]
    fn a_report_without_a_code_is_a_producer_failure() {
        let error = DeliveryError::from_kafka("t", &KafkaError::Canceled);
        assert_eq!(error.consequence(), ProducerFailed);
    }
}
