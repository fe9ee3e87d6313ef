//! Creation of output topics.
//!
//! # Invariants
//! - A topic is created at most once per sink unless it goes missing; "already exists" counts
//!   as success.
//! - A topic is only remembered as present after the broker confirmed it; a topic sent to is
//!   kept among the recent ones only once it is known (or creation is disabled). A topic
//!   records failed for as missing is forgotten ([`TopicCreator::forget`]), with the recent
//!   ones, and created again before its next record.
//! - A creation refused for authorization counts as success when the brokers show the topic:
//!   topics an operator created need no CREATE ACL. The lookup never creates a topic.
//! - A creation is bounded by [`CREATE_TIMEOUT`], and can run detached from the creator
//!   ([`TopicCreator::creation`]) so that a caller's loop is not held up by unreachable brokers.

use crate::error::SinkOperation;
use crate::{SinkError, TopicCreation};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;
use rustc_hash::FxHashSet;
use siphon_record::RecentTopics;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// How long one topic creation may take (the request, and the broker's operation) before it
/// fails with a code retrying may cure ([`SinkError::consequence`] is `Retry`).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates topics the first time a record is sent to them.
pub struct TopicCreator {
    /// Shared with the creations running beside the caller ([`TopicCreator::creation`]).
    admin: Option<Arc<AdminClient<DefaultClientContext>>>,
    settings: TopicCreation,
    known: FxHashSet<String>,
    /// The topics sent to last, which need no creation: found again without hashing their
    /// names.
    ready: RecentTopics<()>,
}

/// Properties that only make sense for a producer; the admin client rejects or ignores them.
pub(crate) fn is_producer_only(key: &str) -> bool {
    matches!(
        key,
        "partitioner"
            | "message.timeout.ms"
            | "linger.ms"
            | "queue.buffering.max.ms"
            | "enable.idempotence"
            | "acks"
            | "request.required.acks"
            | "compression.type"
            | "compression.codec"
            | "batch.size"
            | "batch.num.messages"
            | "queue.buffering.max.messages"
            | "queue.buffering.max.kbytes"
            | "retries"
            | "retry.backoff.ms"
            | "max.in.flight.requests.per.connection"
            | "max.in.flight"
            | "delivery.timeout.ms"
            | "request.timeout.ms"
            | "transactional.id"
            | "transaction.timeout.ms"
            | "enable.gapless.guarantee"
            | "sticky.partitioning.linger.ms"
            // Only the producer's statistics are read (rdkafka's default context would log
            // every other client's at info).
            | "statistics.interval.ms"
    )
}

/// The connection properties (bootstrap servers, security ...) among a producer's `properties`:
/// what any other client of the same brokers needs.
pub(crate) fn connection_properties(
    properties: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    properties
        .iter()
        .filter(|(k, _)| !is_producer_only(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl TopicCreator {
    /// Builds the admin client from the producer's connection properties.
    pub fn new(
        properties: &BTreeMap<String, String>,
        settings: TopicCreation,
    ) -> Result<Self, SinkError> {
        let admin = if settings.enabled {
            let mut config = ClientConfig::new();
            for (key, value) in &connection_properties(properties) {
                config.set(key, value);
            }
            // Its lookups of a topic ([`exists`]) must not have the brokers create it.
            config.set("allow.auto.create.topics", "false");
            Some(Arc::new(config.create().map_err(|e| {
                SinkError::client(SinkOperation::CreateAdminClient, &e)
            })?))
        } else {
            None
        };
        Ok(TopicCreator {
            admin,
            settings,
            known: FxHashSet::default(),
            ready: RecentTopics::default(),
        })
    }

    /// Whether `topic` is known to exist (created, or found present, by this sink).
    pub fn knows(&self, topic: &str) -> bool {
        self.known.contains(topic)
    }

    /// Remembers `topic` as present (after a [`TopicCreator::creation`] of it succeeded).
    pub fn remember(&mut self, topic: &str) {
        self.known.insert(topic.to_owned());
    }

    /// Forgets that `topic` is present (records failed for it missing): its next record waits
    /// for a creation, which finds it there ("already exists") or creates it again.
    pub fn forget(&mut self, topic: &str) {
        self.known.remove(topic);
        // The recent ones hold only known topics.
        self.ready = RecentTopics::default();
    }

    /// The creation of `topic` as a future that borrows nothing from the creator, to be run
    /// beside the caller's loop; `None` when there is nothing to do (the topic is known, or
    /// creation is disabled). On success the caller [`TopicCreator::remember`]s the topic.
    ///
    /// The request is bounded by [`CREATE_TIMEOUT`]: with the brokers unreachable it fails
    /// with a transient [`SinkError`] once that passed.
    pub fn creation(
        &self,
        topic: &str,
    ) -> Option<impl std::future::Future<Output = Result<(), SinkError>> + Send + 'static> {
        let admin = self.admin.as_ref()?;
        if self.ready.get(topic).is_some() || self.known.contains(topic) {
            return None;
        }
        let admin = Arc::clone(admin);
        let settings = self.settings.clone();
        let topic = topic.to_owned();
        Some(async move { create(admin, &settings, &topic).await })
    }

    /// Makes sure `topic` exists (creating it if needed).
    pub async fn ensure(&mut self, topic: &Arc<str>) -> Result<(), SinkError> {
        // Known topics (every record but a topic's first) take no allocation here, and recent
        // ones no hashing either.
        if self.ready.get(topic).is_some() {
            return Ok(());
        }
        if let Some(creation) = self.creation(topic) {
            creation.await?;
            self.remember(topic);
        }
        self.ready.keep(topic, ());
        Ok(())
    }
}

/// Creates `topic` with `settings`; "already exists" is success, and so is a creation refused
/// for authorization when the topic exists ([`exists`]): brokers check the CREATE ACL before
/// they look for the topic, and topics an operator created need none.
async fn create(
    admin: Arc<AdminClient<DefaultClientContext>>,
    settings: &TopicCreation,
    topic: &str,
) -> Result<(), SinkError> {
    let new_topic = NewTopic::new(
        topic,
        settings.partitions,
        TopicReplication::Fixed(settings.replication_factor),
    );
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TIMEOUT))
        .operation_timeout(Some(CREATE_TIMEOUT));
    let results = admin
        .create_topics([&new_topic], &options)
        .await
        .map_err(|e| SinkError::topic_request(topic, &e))?;
    for result in results {
        match result {
            Ok(name) => {
                info!(topic = %name, partitions = settings.partitions, replication_factor = settings.replication_factor, "created topic")
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code))
                if refused_before_lookup(code) && exists(Arc::clone(&admin), &name).await? =>
            {
                info!(topic = %name, %code, "the topic exists; Siphon's principal may not create topics, which only a missing one needs");
            }
            // What the code means (refused for good, or worth another try) is the error's.
            Err((name, code)) => {
                return Err(SinkError::Kafka {
                    operation: SinkOperation::CreateTopic,
                    topic: name,
                    code,
                })
            }
        }
    }
    Ok(())
}

/// Whether a creation refused with `code` may be of a topic that exists: brokers check the
/// CREATE ACL before they look for the topic, so the refusal says nothing of it.
pub(crate) fn refused_before_lookup(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed
    )
}

/// Whether the brokers show `topic` with its partitions (through `admin`'s client, which
/// creates no topic by asking). `false` when they do not, or will not describe it to Siphon;
/// unreachable brokers are a transient error, as for the creation.
async fn exists(
    admin: Arc<AdminClient<DefaultClientContext>>,
    topic: &str,
) -> Result<bool, SinkError> {
    let name = topic.to_owned();
    let metadata = tokio::task::spawn_blocking(move || {
        admin.inner().fetch_metadata(Some(&name), CREATE_TIMEOUT)
    })
    .await
    .map_err(|_| SinkError::Kafka {
        operation: SinkOperation::CreateTopic,
        topic: topic.to_owned(),
        code: RDKafkaErrorCode::Fail,
    })?
    .map_err(|e| SinkError::topic_request(topic, &e))?;
    Ok(metadata
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_authorization_refusal_leaves_the_topic_to_be_looked_up() {
        use RDKafkaErrorCode as C;
        assert!(refused_before_lookup(C::TopicAuthorizationFailed));
        assert!(refused_before_lookup(C::ClusterAuthorizationFailed));
        for code in [
            C::InvalidTopic,
            C::InvalidReplicationFactor,
            C::RequestTimedOut,
        ] {
            assert!(!refused_before_lookup(code), "{code:?}");
        }
    }

    #[test]
    fn a_topic_gone_missing_is_forgotten_and_created_before_its_next_record() {
        let port = siphon_tests::free_port();
        let properties =
            BTreeMap::from([("bootstrap.servers".to_owned(), format!("127.0.0.1:{port}"))]);
        let mut creator =
            TopicCreator::new(&properties, TopicCreation::default()).expect("an admin client");
        let topic: Arc<str> = Arc::from("orders");
        assert!(creator.creation(&topic).is_some(), "new: to be created");
        creator.remember(&topic);
        creator.ready.keep(&topic, ());
        assert!(creator.creation(&topic).is_none());
        creator.forget(&topic);
        assert!(!creator.knows(&topic));
        assert!(
            creator.ready.get(&topic).is_none(),
            "not among the recent ones"
        );
        assert!(creator.creation(&topic).is_some(), "created again");
    }
}
