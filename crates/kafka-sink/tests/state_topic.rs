//! The state topic against a real Apache Kafka broker: the last record of a key wins, a missing
//! topic or key reads as nothing, and the topic Siphon creates is compacted with one partition.

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use siphon_kafka_sink::{SinkConfig, StateTopic, StateTopicError, TopicCreation};
use siphon_tests::broker::Broker;
use std::collections::BTreeMap;

fn state_topic(broker: &Broker, name: &str, creation: TopicCreation) -> StateTopic {
    let config = SinkConfig {
        bootstrap_servers: broker.bootstrap(),
        properties: BTreeMap::new(),
        topic_creation: creation.clone(),
        discard: false,
        transactional_id: None,
    };
    let properties = config.client_properties().expect("valid properties");
    StateTopic::new(&broker.topic(name), &properties, creation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_record_of_a_key_wins_and_the_topic_is_compacted() -> anyhow::Result<()> {
    let broker = Broker::start()?;
    let state = state_topic(&broker, "siphon.state", TopicCreation::default());
    assert_eq!(
        state.read(b"a").await?,
        None,
        "a topic that does not exist yet"
    );

    state.write(b"a", b"first").await?;
    state.write(b"b", b"other").await?;
    state.write(b"a", b"second").await?;
    assert_eq!(state.read(b"a").await?.as_deref(), Some(&b"second"[..]));
    assert_eq!(state.read(b"b").await?.as_deref(), Some(&b"other"[..]));
    assert_eq!(state.read(b"c").await?, None, "a key never written");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()?;
    let topic = state.topic().to_owned();
    let configs = admin
        .describe_configs([&ResourceSpecifier::Topic(&topic)], &AdminOptions::new())
        .await?;
    let resource = configs.into_iter().next().expect("one resource")?;
    let policy = resource
        .get("cleanup.policy")
        .and_then(|entry| entry.value.clone());
    assert_eq!(policy.as_deref(), Some("compact"));
    let metadata = admin
        .inner()
        .fetch_metadata(Some(&topic), std::time::Duration::from_secs(10))?;
    assert_eq!(metadata.topics()[0].partitions().len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_siphon_may_not_create_names_the_fix() -> anyhow::Result<()> {
    let broker = Broker::start()?;
    let creation = TopicCreation {
        enabled: false,
        ..TopicCreation::default()
    };
    let state = state_topic(&broker, "siphon.state", creation);
    let error = state
        .write(b"a", b"x")
        .await
        .expect_err("no topic to write to");
    assert!(
        matches!(error, StateTopicError::Missing { .. }),
        "{error:?}"
    );
    assert_eq!(error.consequence(), siphon_core::Consequence::Fix);
    assert!(
        error.to_string().contains("cleanup.policy=compact"),
        "{error}"
    );
    Ok(())
}
