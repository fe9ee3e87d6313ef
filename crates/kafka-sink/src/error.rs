//! Sink errors, and what a failed delivery means.
//!
//! A [`SinkError`] says what failed: the operation ([`SinkOperation`]), the librdkafka (or broker)
//! error code, the topic or the configuration key. What it means for the process is decided by
//! [`SinkError::consequence`] from those alone; its text (with librdkafka's own words, kept
//! only to be shown) is rendered by `Display`, for the operator.
//!
//! Every librdkafka error code a delivery can fail with is sorted by its consequence for the
//! record ([`DeliveryConsequence`]):
//!
//! - the record itself is refused for good ([`DeliveryConsequence::RecordRefused`]): the pipeline's
//!   `on_error` applies (stop naming the record, or dead-letter it);
//! - the record was refused only because another record of its batch was
//!   ([`DeliveryConsequence::RefusedWithOthers`]): send it again as it is;
//! - the producer or its connection failed or timed out ([`DeliveryConsequence::ProducerFailed`]):
//!   rebuild the producer and send again (after a backoff);
//! - the operator must change the configuration, the broker or its authorization
//!   ([`DeliveryConsequence::OperatorFix`]): stop, naming the fix. Codes a produce request cannot
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
//!   [`DeliveryConsequence::OperatorFix`]: stop rather than guess.
//! - A [`DeliveryError::Definite`] cannot be cured by sending the same record again; a
//!   [`DeliveryError::Transient`] can.
//! - Every error keeps the librdkafka code it came from; no error is classified by its text:
//!   the strings an error holds (librdkafka's reasons) are only displayed.
//! - [`SinkError::consequence`] is the only place that decides what a [`SinkError`] means.

use crate::config::SinkConfigError;
use crate::wakeup::WakeupError;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::fmt;

/// What the sink was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkOperation {
    /// Creating the producer from the configuration.
    CreateProducer,
    /// Creating the admin client that creates topics.
    CreateAdminClient,
    /// Creating a topic (the CreateTopics request, or the broker's answer for the topic).
    CreateTopic,
    /// Enqueueing a record on the producer.
    Enqueue,
    /// Setting up the wake-up for the producer's delivery reports.
    WaitForReports,
    /// Registering the transactional producer with its coordinator (fencing older instances).
    InitTransactions,
    /// Beginning a Kafka transaction.
    BeginTransaction,
    /// Committing a Kafka transaction.
    CommitTransaction,
    /// Aborting a Kafka transaction.
    AbortTransaction,
}

impl fmt::Display for SinkOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SinkOperation::CreateProducer => "creating the Kafka producer",
            SinkOperation::CreateAdminClient => "creating the Kafka admin client",
            SinkOperation::CreateTopic => "creating a topic",
            SinkOperation::Enqueue => "enqueueing a record",
            SinkOperation::WaitForReports => "waiting for Kafka delivery reports",
            SinkOperation::InitTransactions => "initialising the transactional Kafka producer",
            SinkOperation::BeginTransaction => "beginning a Kafka transaction",
            SinkOperation::CommitTransaction => "committing a Kafka transaction",
            SinkOperation::AbortTransaction => "aborting a Kafka transaction",
        })
    }
}

/// What to check when the brokers refuse Siphon's credentials (a macro, so that messages can
/// `concat!` it).
macro_rules! credentials_fix {
    () => {
        "check kafka.properties \"sasl.username\" and \"sasl.password\" (or SIPHON_KAFKA_PROPERTIES_SASL_PASSWORD), \"sasl.mechanisms\" and \"security.protocol\""
    };
}
pub(crate) use credentials_fix;

/// Whether `error` says the brokers refused a client's login (SASL).
pub(crate) fn is_refused_login(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed)
    )
}

/// Whether `error` says a connection to a broker failed (or none is up).
pub(crate) fn is_connection_failure(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)
    )
}

/// Errors creating the producer, creating topics or enqueueing records.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// A `kafka` setting Siphon refuses; the message names the property and the fix.
    #[error(transparent)]
    Config(#[from] SinkConfigError),
    /// librdkafka refused to create the client (`operation` is [`SinkOperation::CreateProducer`] or
    /// [`SinkOperation::CreateAdminClient`]) from the configuration: `error` carries librdkafka's
    /// words (a property it does not know or a value it rejects, properties that do not go
    /// together, a file it cannot read), shown to the operator and never inspected.
    #[error("invalid Kafka {} configuration: {error}", client_name(*operation))]
    Client {
        operation: SinkOperation,
        error: Box<KafkaError>,
    },
    /// librdkafka, or the broker through it, failed `operation` for a record or a topic of
    /// `topic` with `code`.
    #[error("{}", describe(*operation, topic, *code))]
    Kafka {
        operation: SinkOperation,
        topic: String,
        code: RDKafkaErrorCode,
    },
    /// A CreateTopics request failed without an error code (the admin client went away, or
    /// librdkafka could not build the request); `reason` is librdkafka's, shown only.
    #[error("Kafka unavailable: creating topic {topic}: {error}")]
    TopicRequest {
        topic: String,
        error: Box<KafkaError>,
    },
    /// A call of the transactional producer (`operation` is one of the transaction operations)
    /// failed with `code` (see [`transaction_fix`]).
    #[error("{operation} ({transactional_id:?}) failed with {code}{}", transaction_fix(*operation, *code))]
    Transaction {
        operation: SinkOperation,
        transactional_id: String,
        code: RDKafkaErrorCode,
    },
    /// The brokers refused the producer's login (SASL): the credentials are wrong, or were
    /// changed on the brokers while Siphon ran. `reason` is librdkafka's, shown only.
    #[error("the Kafka brokers refused Siphon's credentials ({reason}): {}", credentials_fix!())]
    CredentialsRefused { reason: String },
    /// The wake-up for delivery reports could not be set up.
    #[error("Kafka unavailable: waiting for Kafka delivery reports: {0}")]
    Wakeup(#[from] WakeupError),
    /// [`crate::KafkaSink::rebuild`] was asked for while the producer retired by the previous
    /// rebuild still has records to report: at most one retired producer waits at a time. Await
    /// [`crate::KafkaSink::retired_reported`] (or receive its reports) and ask again.
    #[error("the Kafka producer retired at generation {generation} still has {unreported} record(s) to report; not replacing the current one yet")]
    RetiredStillReporting { generation: u64, unreported: usize },
}

impl SinkError {
    /// librdkafka refused to create the client of `operation` with `error`.
    pub(crate) fn client(operation: SinkOperation, error: &KafkaError) -> Self {
        SinkError::Client {
            operation,
            error: Box::new(error.clone()),
        }
    }

    /// Enqueueing a record for `topic` failed with `error` (a record that comes back from
    /// `rd_kafka_produceva` always carries a code; one without, such as a topic name with a
    /// NUL byte, is treated as a producer failure, as [`DeliveryError::from_kafka`] does).
    pub fn enqueue(topic: &str, error: &KafkaError) -> Self {
        SinkError::Kafka {
            operation: SinkOperation::Enqueue,
            topic: topic.to_owned(),
            code: error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        }
    }

    /// A CreateTopics request for `topic` failed with `error` as a whole (no per-topic answer).
    pub(crate) fn topic_request(topic: &str, error: &KafkaError) -> Self {
        let topic = topic.to_owned();
        // rust-rdkafka reports the request's own error code as `AdminOp`, which
        // `rdkafka_error_code` does not return.
        match error {
            KafkaError::AdminOp(code) => SinkError::Kafka {
                operation: SinkOperation::CreateTopic,
                topic,
                code: *code,
            },
            other => match other.rdkafka_error_code() {
                Some(code) => SinkError::Kafka {
                    operation: SinkOperation::CreateTopic,
                    topic,
                    code,
                },
                None => SinkError::TopicRequest {
                    topic,
                    error: Box::new(other.clone()),
                },
            },
        }
    }

    /// What the failure means for the process.
    pub fn consequence(&self) -> siphon_core::Consequence {
        use siphon_core::Consequence::{Fix, Retry};
        match self {
            SinkError::Config(_)
            | SinkError::Client { .. }
            | SinkError::CredentialsRefused { .. } => Fix,
            SinkError::Kafka {
                operation, code, ..
            } => kafka_consequence(*operation, *code),
            SinkError::Transaction { code, .. } => transaction_consequence(*code),
            SinkError::TopicRequest { .. }
            | SinkError::Wakeup(_)
            | SinkError::RetiredStillReporting { .. } => Retry,
        }
    }

    /// Whether retrying (after reconnecting) may succeed.
    pub fn is_transient(&self) -> bool {
        self.consequence().is_retry()
    }

    /// Whether the record being sent is what Kafka refuses (its enqueueing, or the creation of
    /// its topic, failed for good): the pipeline's `on_error` applies to it, as to a record
    /// refused in its delivery report.
    ///
    /// A refusal the operator must cure (an ACL, the producer's or the topics' settings) is
    /// not the record's: it stops Siphon, naming the fix, even with dead letters on.
    pub fn refuses_record(&self) -> bool {
        match self {
            SinkError::Kafka {
                operation: SinkOperation::Enqueue,
                code,
                ..
            } => consequence(*code) == DeliveryConsequence::RecordRefused,
            // Only the topic's name is the record's (its aggregate type, routed).
            SinkError::Kafka {
                operation: SinkOperation::CreateTopic,
                code,
                ..
            } => *code == RDKafkaErrorCode::InvalidTopic,
            _ => false,
        }
    }

    /// The operation that failed (`None` for a refused setting, or a rebuild asked too early).
    pub fn operation(&self) -> Option<SinkOperation> {
        match self {
            SinkError::Client { operation, .. }
            | SinkError::Kafka { operation, .. }
            | SinkError::Transaction { operation, .. } => Some(*operation),
            SinkError::TopicRequest { .. } => Some(SinkOperation::CreateTopic),
            SinkError::Wakeup(_) => Some(SinkOperation::WaitForReports),
            SinkError::Config(_)
            | SinkError::CredentialsRefused { .. }
            | SinkError::RetiredStillReporting { .. } => None,
        }
    }

    /// The librdkafka (or broker) error code, when the failure has one.
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            SinkError::Kafka { code, .. } | SinkError::Transaction { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The consequence of `operation` failing with `code`.
fn kafka_consequence(operation: SinkOperation, code: RDKafkaErrorCode) -> siphon_core::Consequence {
    use siphon_core::Consequence::{Fix, Retry};
    match operation {
        SinkOperation::CreateTopic => match topic_fix(code) {
            Some(_) => Fix,
            // Unreachable brokers, a timeout, a controller moving ...: try again.
            None => Retry,
        },
        SinkOperation::Enqueue => consequence(code).general(),
        // A client that could not be created is refused for its configuration.
        SinkOperation::CreateProducer | SinkOperation::CreateAdminClient => Fix,
        SinkOperation::WaitForReports => Retry,
        SinkOperation::InitTransactions
        | SinkOperation::BeginTransaction
        | SinkOperation::CommitTransaction
        | SinkOperation::AbortTransaction => transaction_consequence(code),
    }
}

/// Whether a failed transaction call can only be cured by the operator: refused rights, or
/// brokers without transactions. Anything else (a coordinator moving or loading, a timeout, a
/// fenced or aborted transaction) ends the session, and the next one starts from the last
/// committed progress.
fn transaction_consequence(code: RDKafkaErrorCode) -> siphon_core::Consequence {
    use siphon_core::Consequence::{Fix, Retry};
    match code {
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed
        | RDKafkaErrorCode::UnsupportedVersion
        | RDKafkaErrorCode::UnsupportedForMessageFormat
        | RDKafkaErrorCode::InvalidTransactionTimeout
        | RDKafkaErrorCode::InvalidArgument => Fix,
        _ => Retry,
    }
}

/// The fix a failed transaction call with `code` names ("" when it passes by itself).
pub fn transaction_fix(operation: SinkOperation, code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode as C;
    match code {
        C::TransactionalIdAuthorizationFailed | C::ClusterAuthorizationFailed => {
            ": grant Siphon's principal WRITE and DESCRIBE on its transactional id (kafka.transactional_id, or the id in this message), or set kafka.delivery = \"at-least-once\""
        }
        C::UnsupportedVersion | C::UnsupportedForMessageFormat => {
            ": the brokers do not support transactions; use Apache Kafka 2.5 or later, or set kafka.delivery = \"at-least-once\""
        }
        C::InvalidTransactionTimeout => {
            ": kafka.properties.\"transaction.timeout.ms\" is above the brokers' transaction.max.timeout.ms; lower it"
        }
        C::InvalidArgument => ": check kafka.properties.\"transaction.timeout.ms\"",
        C::CoordinatorNotAvailable | C::NotCoordinator | C::OperationTimedOut | C::RequestTimedOut
            if operation == SinkOperation::InitTransactions =>
        {
            ": the transaction coordinator did not answer; if it persists, check that the brokers' transaction.state.log.replication.factor and transaction.state.log.min.isr fit the cluster (a single broker needs 1 and 1)"
        }
        // librdkafka reports its transactional producer's fencing as its own `Fenced`.
        C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch => {
            ": another producer with the same transactional id started; is a second Siphon running with the same kafka.transactional_id?"
        }
        _ => "",
    }
}

/// What to do about a topic the broker refused to create with `code`; `None` for a code that
/// retrying may cure.
fn topic_fix(code: RDKafkaErrorCode) -> Option<&'static str> {
    use RDKafkaErrorCode as C;
    match code {
        // Only for a topic the brokers do not show: one that exists needs no CREATE.
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => Some(
            "the brokers do not show it as existing; create it, or grant CREATE (and DESCRIBE) on it to Siphon's principal",
        ),
        C::InvalidTopic | C::InvalidPartitions | C::InvalidReplicationFactor | C::InvalidConfig => {
            Some("check kafka.topic_creation (partitions, replication_factor) and the topic name")
        }
        _ => None,
    }
}

/// The client an operation creates, for messages.
fn client_name(operation: SinkOperation) -> &'static str {
    match operation {
        SinkOperation::CreateAdminClient => "admin",
        _ => "producer",
    }
}

/// The message for `operation` failing for `topic` with `code`.
fn describe(operation: SinkOperation, topic: &str, code: RDKafkaErrorCode) -> String {
    match operation {
        SinkOperation::CreateTopic => match topic_fix(code) {
            Some(fix) => {
                format!("the broker refused to create topic {topic} ({code}): {fix}")
            }
            None => format!("Kafka unavailable: creating topic {topic}: {code}"),
        },
        SinkOperation::Enqueue if code == RDKafkaErrorCode::MessageSizeTooLarge => format!(
            "record for topic {topic} is larger than the producer's message.max.bytes ({code}): raise kafka.properties.\"message.max.bytes\" (and the topic's max.message.bytes), or make the payload smaller"
        ),
        SinkOperation::Enqueue => match DeliveryError::from_code(topic, code) {
            DeliveryError::Definite(refusal) => format!("enqueueing a record: {refusal}"),
            DeliveryError::Transient(_) => format!(
                "Kafka unavailable: enqueueing a record for {topic}: {}",
                KafkaError::MessageProduction(code)
            ),
        },
        other => format!("{other} for topic {topic} failed with {code}"),
    }
}

/// What a failed delivery means for the record and for the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryConsequence {
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

impl DeliveryConsequence {
    /// What it means for the process: a record refused, or a refusal only the operator can
    /// cure, is fixed by someone ([`siphon_core::Consequence::Fix`]: the record by `on_error`,
    /// or the operator); a record refused with its batch, or a failed producer, is sent again.
    pub fn general(self) -> siphon_core::Consequence {
        match self {
            DeliveryConsequence::RecordRefused | DeliveryConsequence::OperatorFix => {
                siphon_core::Consequence::Fix
            }
            DeliveryConsequence::RefusedWithOthers | DeliveryConsequence::ProducerFailed => {
                siphon_core::Consequence::Retry
            }
        }
    }
}

/// The consequence of a failed delivery with `code`.
pub fn consequence(code: RDKafkaErrorCode) -> DeliveryConsequence {
    explicit(code).unwrap_or(DeliveryConsequence::OperatorFix)
}

/// The consequence named for `code`, `None` for a code this table does not know (one added by a
/// later librdkafka version).
pub fn explicit(code: RDKafkaErrorCode) -> Option<DeliveryConsequence> {
    use DeliveryConsequence::*;
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
        | C::RebootstrapRequired
        // A transactional producer takes no record once its transaction failed (a record of
        // it refused, its report perhaps still on the way): the transaction is aborted and
        // sent again by a new producer.
        | C::State => ProducerFailed,

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

/// What a producer failure with `code` means for the record (see [`fix`] for the rest).
fn failure_fix(code: RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::UnknownPartition => "the topic no longer has the partition the producer placed the record in (the topic was deleted, or deleted and created again with fewer partitions); the record is placed again on the topic as it is now, after everything before it",
        other => fix(other),
    }
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
        C::UnknownPartition => "the topic does not have the partition the record's partition column names (or no longer has it: deleted and created again with fewer partitions). Nothing unacknowledged was confirmed: check the partition column, or add partitions",
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
        // librdkafka retries this produce error itself; a delivery fails with it only once the
        // cluster's metadata has not shown the topic for topic.metadata.propagation.max.ms.
        C::UnknownTopicOrPartition => {
            "the cluster has no such topic: create it, or let Siphon create topics (kafka.topic_creation.enabled) or the broker (auto.create.topics.enable); the producer is rebuilt and the record sent again until it exists"
        }
        C::InvalidRequiredAcks => "Siphon sends acks=all: the broker refuses it; check the broker's configuration",
        C::UnsupportedVersion | C::UnsupportedFeature | C::NotImplemented | C::InvalidRequest => {
            "the broker does not support a request the producer needs (idempotent produce): upgrade the broker or check kafka.properties \"api.version.*\" / \"broker.version.fallback\""
        }
        _ => match consequence(code) {
            DeliveryConsequence::RecordRefused => "the broker refuses the record: change the record or the topic's configuration",
            DeliveryConsequence::RefusedWithOthers => "another record of the same batch was refused; this one can be sent again",
            DeliveryConsequence::ProducerFailed => "the producer is rebuilt and the record sent again",
            DeliveryConsequence::OperatorFix => {
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
    /// [`DeliveryConsequence::RecordRefused`] or [`DeliveryConsequence::OperatorFix`].
    pub consequence: DeliveryConsequence,
}

impl Refusal {
    /// Whether `on_error` applies ([`DeliveryConsequence::RecordRefused`]); otherwise the operator must
    /// act whatever `on_error` says.
    pub fn on_error_applies(&self) -> bool {
        self.consequence == DeliveryConsequence::RecordRefused
    }

    fn describe(&self) -> String {
        let code = self.code;
        let number = code as i32;
        match self.consequence {
            DeliveryConsequence::RecordRefused => format!(
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
/// [`DeliveryConsequence::ProducerFailed`]) and sending the record again can succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delivery to topic {topic} failed with {code:?} (code {number}): {what}", number = *code as i32, what = failure_fix(*code))]
pub struct ProducerFailure {
    /// The record's topic.
    pub topic: String,
    /// The librdkafka error code.
    pub code: RDKafkaErrorCode,
    /// [`DeliveryConsequence::ProducerFailed`] or [`DeliveryConsequence::RefusedWithOthers`].
    pub consequence: DeliveryConsequence,
}

impl ProducerFailure {
    /// Whether the producer must be replaced before sending again (not for a record refused
    /// only for its batch's sake).
    pub fn needs_rebuild(&self) -> bool {
        self.consequence == DeliveryConsequence::ProducerFailed
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

impl siphon_record::Classified for DeliveryError {
    fn verdict(&self) -> siphon_record::Verdict {
        use siphon_record::Verdict;
        match self {
            DeliveryError::Definite(refusal) if refusal.on_error_applies() => {
                Verdict::RecordRefused
            }
            DeliveryError::Definite(_) => Verdict::OperatorFix,
            DeliveryError::Transient(failure) => Verdict::Transient {
                replace: failure.needs_rebuild(),
            },
        }
    }
}

impl DeliveryError {
    /// Classifies a failed delivery by its librdkafka error code.
    pub fn from_kafka(topic: &str, err: &KafkaError) -> Self {
        // A delivery report always carries a code; without one, treat it as a producer
        // failure (rebuilt and resent after a backoff) rather than refuse the record.
        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        Self::from_code(topic, code)
    }

    /// Classifies a failed delivery report of a record for `topic`, which named its partition
    /// (a partition column) or not (`named_partition`). For a record the producer placed
    /// itself, a partition the topic no longer has is not the record's fault: the topic lost
    /// partitions under the producer (deleted and created again with fewer). The producer is
    /// replaced and the record placed again, after everything before it, on the topic as it is
    /// now.
    pub fn from_report(topic: &str, err: &KafkaError, named_partition: bool) -> Self {
        match err.rdkafka_error_code() {
            Some(code @ RDKafkaErrorCode::UnknownPartition) if !named_partition => {
                DeliveryError::Transient(ProducerFailure {
                    topic: topic.to_owned(),
                    code,
                    consequence: DeliveryConsequence::ProducerFailed,
                })
            }
            _ => Self::from_kafka(topic, err),
        }
    }

    /// Whether the failure says the record's topic is missing (deleted, or brokers back
    /// without their data), rather than anything about the record: a partition the producer
    /// placed it in is gone, or the topic is unknown.
    pub fn says_topic_missing(&self) -> bool {
        use RDKafkaErrorCode as C;
        match self {
            DeliveryError::Transient(failure) => {
                matches!(
                    failure.code,
                    C::UnknownTopicOrPartition | C::UnknownPartition
                )
            }
            DeliveryError::Definite(refusal) => refusal.code == C::UnknownTopic,
        }
    }

    /// Classifies a failed delivery of a record for `topic` with `code`.
    pub fn from_code(topic: &str, code: RDKafkaErrorCode) -> Self {
        let topic = topic.to_owned();
        match consequence(code) {
            consequence @ (DeliveryConsequence::RecordRefused
            | DeliveryConsequence::OperatorFix) => DeliveryError::Definite(Refusal {
                topic,
                code,
                consequence,
            }),
            consequence @ (DeliveryConsequence::ProducerFailed
            | DeliveryConsequence::RefusedWithOthers) => {
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
    pub fn consequence(&self) -> DeliveryConsequence {
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
    use DeliveryConsequence::*;

    /// Every code librdkafka can report.
    fn all_codes() -> Vec<RDKafkaErrorCode> {
        (-300..=300)
            .filter_map(|n| RDKafkaRespErr::try_from(n).ok())
            .map(RDKafkaErrorCode::from)
            .collect()
    }

    /// The verdict the session engine reads says what the consequence says, for every code.
    #[test]
    fn the_verdict_of_a_failed_delivery_follows_its_consequence() {
        use siphon_record::{Classified, Verdict};
        for code in all_codes() {
            let error = DeliveryError::from_code("t", code);
            let expected = match consequence(code) {
                RecordRefused => Verdict::RecordRefused,
                OperatorFix => Verdict::OperatorFix,
                RefusedWithOthers => Verdict::Transient { replace: false },
                ProducerFailed => Verdict::Transient { replace: true },
            };
            assert_eq!(error.verdict(), expected, "{code:?}");
        }
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
    const TABLE: &[(i32, DeliveryConsequence)] = &[
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
    fn a_partition_gone_is_the_records_fault_only_when_it_named_it() {
        let gone = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition);
        // The partition column named it: the record is refused, naming the column.
        let named = DeliveryError::from_report("orders", &gone, true);
        assert!(!named.says_topic_missing());
        match named {
            DeliveryError::Definite(refusal) => {
                assert!(refusal.on_error_applies());
                assert!(
                    refusal.to_string().contains("partition column"),
                    "{refusal}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The partitioner chose it: the topic lost partitions under the producer.
        let placed = DeliveryError::from_report("orders", &gone, false);
        assert!(placed.says_topic_missing());
        match placed {
            DeliveryError::Transient(failure) => {
                assert!(failure.needs_rebuild());
                assert!(
                    failure
                        .to_string()
                        .contains("placed again on the topic as it is now"),
                    "{failure}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Any other code is classified as for any record.
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageTimedOut,
        ] {
            let error = KafkaError::MessageProduction(code);
            assert_eq!(
                DeliveryError::from_report("orders", &error, false),
                DeliveryError::from_kafka("orders", &error)
            );
        }
    }

    /// What a failed operation means, by operation and code, and the fix its message names.
    #[test]
    fn sink_errors_have_the_consequence_of_their_operation_and_code() {
        use siphon_core::Consequence::{Fix, Retry};
        use RDKafkaErrorCode as C;
        use SinkOperation::{CreateTopic, Enqueue};
        let table: &[(
            SinkOperation,
            RDKafkaErrorCode,
            siphon_core::Consequence,
            &str,
        )] = &[
            (
                CreateTopic,
                C::TopicAuthorizationFailed,
                Fix,
                "grant CREATE",
            ),
            (
                CreateTopic,
                C::ClusterAuthorizationFailed,
                Fix,
                "grant CREATE",
            ),
            (CreateTopic, C::InvalidTopic, Fix, "kafka.topic_creation"),
            (CreateTopic, C::InvalidPartitions, Fix, "partitions"),
            (
                CreateTopic,
                C::InvalidReplicationFactor,
                Fix,
                "replication_factor",
            ),
            (CreateTopic, C::InvalidConfig, Fix, "kafka.topic_creation"),
            (
                CreateTopic,
                C::OperationTimedOut,
                Retry,
                "Kafka unavailable",
            ),
            (CreateTopic, C::RequestTimedOut, Retry, "Kafka unavailable"),
            (CreateTopic, C::AllBrokersDown, Retry, "Kafka unavailable"),
            (
                CreateTopic,
                C::BrokerTransportFailure,
                Retry,
                "Kafka unavailable",
            ),
            (CreateTopic, C::NotController, Retry, "Kafka unavailable"),
            (CreateTopic, C::PolicyViolation, Retry, "Kafka unavailable"),
            (Enqueue, C::MessageSizeTooLarge, Fix, "message.max.bytes"),
            (Enqueue, C::UnknownPartition, Fix, "partition"),
            (Enqueue, C::InvalidTopic, Fix, "route.topic.replacement"),
            (Enqueue, C::UnknownTopic, Fix, "route.topic.replacement"),
            (Enqueue, C::TopicAuthorizationFailed, Fix, "grant WRITE"),
            (Enqueue, C::Fatal, Retry, "Kafka unavailable"),
            (Enqueue, C::QueueFull, Retry, "Kafka unavailable"),
            (Enqueue, C::Fail, Retry, "Kafka unavailable"),
            (Enqueue, C::PurgeQueue, Retry, "Kafka unavailable"),
        ];
        for &(operation, code, expected, fix) in table {
            let error = SinkError::Kafka {
                operation,
                topic: "orders".into(),
                code,
            };
            assert_eq!(error.consequence(), expected, "{operation:?} {code:?}");
            assert_eq!(
                error.is_transient(),
                expected == Retry,
                "{operation:?} {code:?}"
            );
            // What only the operator can cure is not the record's fault.
            let records_fault = matches!(
                (operation, code),
                (CreateTopic, C::InvalidTopic)
                    | (
                        Enqueue,
                        C::MessageSizeTooLarge
                            | C::UnknownPartition
                            | C::InvalidTopic
                            | C::UnknownTopic
                    )
            );
            assert_eq!(
                error.refuses_record(),
                records_fault,
                "{operation:?} {code:?}"
            );
            assert_eq!(
                (error.operation(), error.code()),
                (Some(operation), Some(code))
            );
            let text = error.to_string();
            assert!(text.contains("orders"), "{text}");
            assert!(text.contains(&format!("{code:?}")), "{text}");
            assert!(text.contains(fix), "{fix:?} missing from {text}");
        }
    }

    /// Enqueueing fails as the record's delivery would: refused for good where a delivery
    /// report with the same code refuses the record, retried where it rebuilds the producer.
    #[test]
    fn an_enqueue_failure_means_what_the_same_delivery_failure_means() {
        for code in all_codes() {
            let error = SinkError::enqueue("t", &KafkaError::MessageProduction(code));
            assert_eq!(error.consequence(), consequence(code).general(), "{code:?}");
        }
        // Without a code (a topic name librdkafka cannot take): the producer failed.
        let nul = std::ffi::CString::new("a\0b").expect_err("a NUL byte");
        let error = SinkError::enqueue("a\0b", &KafkaError::Nul(nul));
        assert_eq!(error.code(), Some(RDKafkaErrorCode::Fail));
        assert!(error.is_transient());
    }

    #[test]
    fn failures_without_a_code_have_the_consequence_of_their_kind() {
        use siphon_core::Consequence::{Fix, Retry};
        let request = SinkError::topic_request(
            "t",
            &KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut),
        );
        assert_eq!(request.code(), Some(RDKafkaErrorCode::OperationTimedOut));
        assert_eq!(request.consequence(), Retry);
        let dropped = SinkError::topic_request("t", &KafkaError::Canceled);
        assert!(
            matches!(dropped, SinkError::TopicRequest { .. }),
            "{dropped:?}"
        );
        assert_eq!(dropped.consequence(), Retry);
        assert!(
            dropped
                .to_string()
                .contains("Kafka unavailable: creating topic t"),
            "{dropped}"
        );
        let refused = KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            "No such configuration property".into(),
            "no.such".into(),
            "1".into(),
        );
        let client = SinkError::client(SinkOperation::CreateProducer, &refused);
        assert_eq!(client.consequence(), Fix);
        assert!(
            matches!(&client, SinkError::Client { error, .. } if matches!(error.as_ref(), KafkaError::ClientConfig(_, _, key, _) if key == "no.such"))
        );
        assert_eq!(
            client.to_string(),
            "invalid Kafka producer configuration: Client config error: No such configuration property no.such 1"
        );
        let admin = SinkError::client(
            SinkOperation::CreateAdminClient,
            &KafkaError::ClientCreation("no CA".into()),
        );
        assert_eq!(
            admin.to_string(),
            "invalid Kafka admin configuration: Client creation error: no CA"
        );
        let wakeup = SinkError::from(WakeupError::EventFd(crate::wakeup::OsError {
            kind: std::io::ErrorKind::Other,
            errno: Some(libc::EMFILE),
        }));
        assert_eq!(wakeup.consequence(), Retry);
        assert_eq!(wakeup.operation(), Some(SinkOperation::WaitForReports));
        let retired = SinkError::RetiredStillReporting {
            generation: 1,
            unreported: 2,
        };
        assert_eq!(retired.consequence(), Retry);
    }

    #[test]
    fn a_report_without_a_code_is_a_producer_failure() {
        let error = DeliveryError::from_kafka("t", &KafkaError::Canceled);
        assert_eq!(error.consequence(), ProducerFailed);
    }

    #[test]
    fn a_transaction_refused_for_good_names_the_fix_and_anything_else_is_retried() {
        use siphon_core::Consequence;
        let failed = |operation, code| SinkError::Transaction {
            operation,
            transactional_id: "siphon-1-db-s".into(),
            code,
        };
        let unsupported = failed(
            SinkOperation::InitTransactions,
            RDKafkaErrorCode::UnsupportedVersion,
        );
        assert_eq!(unsupported.consequence(), Consequence::Fix);
        assert!(
            unsupported
                .to_string()
                .contains("kafka.delivery = \"at-least-once\""),
            "{unsupported}"
        );
        let denied = failed(
            SinkOperation::InitTransactions,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        );
        assert_eq!(denied.consequence(), Consequence::Fix);
        assert!(
            denied.to_string().contains("WRITE and DESCRIBE"),
            "{denied}"
        );
        let coordinator = failed(
            SinkOperation::InitTransactions,
            RDKafkaErrorCode::CoordinatorNotAvailable,
        );
        assert_eq!(coordinator.consequence(), Consequence::Retry);
        assert!(
            coordinator
                .to_string()
                .contains("transaction.state.log.replication.factor"),
            "{coordinator}"
        );
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
            RDKafkaErrorCode::OperationTimedOut,
            RDKafkaErrorCode::Fenced,
        ] {
            assert_eq!(
                failed(SinkOperation::CommitTransaction, code).consequence(),
                Consequence::Retry,
                "{code:?}"
            );
        }
        let fenced = failed(SinkOperation::CommitTransaction, RDKafkaErrorCode::Fenced);
        assert!(
            fenced.to_string().contains("is a second Siphon running"),
            "{fenced}"
        );
    }
}
