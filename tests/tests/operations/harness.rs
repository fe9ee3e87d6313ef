//! Proves the harness itself against the real services: PostgreSQL through
//! scripts/postgres.sh, Apache Kafka (the shared broker with its namespaces, a node of a
//! test's own, the three-node cluster, the advertising proxy), and child-process handling.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use siphon_tests::proxy::ProxiedBroker;
use siphon_tests::{
    list_topics, read_topic, wait_until, Broker, KafkaCluster, Postgres, SiphonProcess,
};

/// The test command runs the end-to-end suite once per PostgreSQL major it supports, naming the
/// major in `SIPHON_PG_EXPECT_MAJOR`: a run that silently fell back to another server fails here.
#[tokio::test]
async fn postgres_is_the_major_the_run_asked_for() -> Result<()> {
    let pg = Postgres::start()?;
    let major = pg.major_version().await?;
    assert!(
        major >= 13,
        "PostgreSQL {major} is older than Siphon supports"
    );
    if let Some(expected) = std::env::var("SIPHON_PG_EXPECT_MAJOR")
        .ok()
        .filter(|v| !v.is_empty())
    {
        assert_eq!(
            major.to_string(),
            expected,
            "SIPHON_PG_EXPECT_MAJOR={expected} but the harness started PostgreSQL {major} (SIPHON_PG_BIN={:?})",
            std::env::var("SIPHON_PG_BIN").ok()
        );
    }
    Ok(())
}

#[tokio::test]
async fn postgres_is_logical_and_survives_kill_and_restart() -> Result<()> {
    let pg = Postgres::start()?;
    assert!(pg
        .url()
        .ends_with(&format!("127.0.0.1:{}/siphon", pg.port())));
    let db = pg.connect().await?;

    let wal_level: String = db.query_one("SHOW wal_level", &[]).await?.get(0);
    assert_eq!(wal_level, "logical");
    let slots: String = db
        .query_one("SHOW max_replication_slots", &[])
        .await?
        .get(0);
    assert_eq!(slots, "20");

    db.batch_execute(
        "CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL);
         INSERT INTO outbox VALUES (1, 'one'), (2, 'two');
         CREATE PUBLICATION siphon_pub FOR TABLE outbox;",
    )
    .await?;
    // A logical slot with pgoutput can be created: wal_level and slots work.
    db.execute(
        "SELECT pg_create_logical_replication_slot('harness_slot', 'pgoutput')",
        &[],
    )
    .await?;

    // Immediate shutdown: committed rows and the slot survive crash recovery.
    pg.kill()?;
    assert!(!pg.is_running());
    assert!(db.query_one("SELECT 1", &[]).await.is_err());
    pg.start_again()?;
    let db = pg.connect().await?;
    let n: i64 = db
        .query_one("SELECT count(*) FROM outbox", &[])
        .await?
        .get(0);
    assert_eq!(n, 2);
    let slot: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'harness_slot'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(slot, 1);

    // Fast restart on the same port.
    db.execute("INSERT INTO outbox VALUES (3, 'three')", &[])
        .await?;
    pg.restart()?;
    let db = pg.connect().await?;
    let n: i64 = db
        .query_one("SELECT count(*) FROM outbox", &[])
        .await?
        .get(0);
    assert_eq!(n, 3);

    // A clean stop, then start again.
    pg.stop()?;
    assert!(!pg.is_running());
    pg.start_again()?;
    assert!(pg.is_running());
    Ok(())
}

#[tokio::test]
async fn postgres_rejects_a_wrong_password() -> Result<()> {
    let pg = Postgres::start()?;
    let url = format!("postgres://siphon:wrong@127.0.0.1:{}/siphon", pg.port());
    let err = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .err()
        .expect("a wrong password must be rejected");
    assert!(format!("{err:?}").contains("password"), "{err:?}");
    Ok(())
}

fn producer(bootstrap: &str) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .create()?)
}

#[tokio::test]
async fn broker_round_trip_with_keys_and_headers() -> Result<()> {
    let broker = Broker::start()?;
    let bootstrap = broker.bootstrap();
    let topic = &broker.topic("harness.roundtrip");
    let producer = producer(&bootstrap)?;

    let mut sent = BTreeMap::new();
    for i in 0..10 {
        let key = format!("key-{i}");
        let value = format!("{{\"n\":{i}}}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "seq",
                value: Some(i.to_string().as_bytes()),
            })
            .insert(Header::<&[u8]> {
                key: "nothing",
                value: None,
            });
        producer
            .send(
                FutureRecord::to(topic)
                    .key(&key)
                    .payload(&value)
                    .headers(headers),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)?;
        sent.insert(key, (value, i));
    }

    let records = read_topic(&bootstrap, topic, Duration::from_secs(30))?;
    assert_eq!(records.len(), 10, "{records:#?}");
    for r in &records {
        assert_eq!(&r.topic, topic);
        let key = r.key_str().expect("every record has a key");
        let (value, i) = sent.remove(&key).expect("each key exactly once");
        assert_eq!(r.value_str().as_deref(), Some(value.as_str()));
        assert_eq!(
            r.headers,
            vec![
                ("seq".to_owned(), Some(i.to_string().into_bytes())),
                ("nothing".to_owned(), None),
            ]
        );
        assert_eq!(r.header("seq"), Some(i.to_string().as_bytes()));
        assert!(r.timestamp.is_some());
        let _: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
    }
    assert!(sent.is_empty(), "not read back: {sent:?}");
    // Same key, same partition; records come back sorted by (partition, offset).
    let mut sorted = records.clone();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    assert_eq!(sorted, records);

    assert!(list_topics(&bootstrap)?.iter().any(|t| t == topic));
    // Another test's namespace on the same broker does not see the topic.
    let other = Broker::start()?;
    assert_eq!(other.bootstrap(), bootstrap);
    assert_ne!(other.topic("harness.roundtrip"), *topic);
    assert!(read_topic(
        &bootstrap,
        &other.topic("harness.roundtrip"),
        Duration::from_secs(10)
    )?
    .is_empty());
    // Reading is repeatable and does not consume anything.
    assert_eq!(
        read_topic(&bootstrap, topic, Duration::from_secs(30))?,
        records
    );
    Ok(())
}

#[test]
fn reading_a_missing_topic_yields_nothing() -> Result<()> {
    let broker = Broker::start()?;
    let records = read_topic(
        &broker.bootstrap(),
        &broker.topic("harness.never-written"),
        Duration::from_secs(10),
    )?;
    assert!(records.is_empty(), "{records:#?}");
    Ok(())
}

/// A read "once settled" waits for a transaction's decision: while one is open its records
/// are past the last stable offset, the wait fails naming the partition; once committed, the
/// wait returns and a read_committed read has them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_read_waits_until_every_transaction_is_decided() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    let broker = Broker::start()?;
    let bootstrap = broker.bootstrap();
    let topic = broker.topic("harness.settled");
    siphon_tests::create_topic(&bootstrap, &topic, 2).await?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", &topic)
        .create()?;
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout)?;
    producer.begin_transaction()?;
    for n in 0..4 {
        let value = n.to_string();
        producer
            .send(BaseRecord::<str, str>::to(&topic).key("k").payload(&value))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(timeout)?;

    let open =
        siphon_tests::wait_for_transactions_settled(&bootstrap, &topic, Duration::from_secs(2))
            .expect_err("a transaction is open");
    assert!(open.to_string().contains("last stable offset"), "{open:#}");
    assert!(read_topic(&bootstrap, &topic, timeout)?.is_empty());

    producer.commit_transaction(timeout)?;
    let records = siphon_tests::read_topic_settled(&bootstrap, &topic, timeout)?;
    let values: Vec<_> = records.iter().filter_map(|r| r.value_str()).collect();
    assert_eq!(values, ["0", "1", "2", "3"]);
    Ok(())
}

#[tokio::test]
async fn broker_kill_and_start_again() -> Result<()> {
    // The shared broker refuses to be killed.
    assert!(Broker::start()?.kill().is_err());

    let broker = Broker::start_own(&[])?;
    let bootstrap = broker.bootstrap();
    broker.check_metadata(Duration::from_secs(5))?;
    let first = producer(&bootstrap)?;
    first
        .send(
            FutureRecord::to("harness.before-kill")
                .key("k")
                .payload("v"),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)?;
    drop(first);

    broker.kill()?;
    assert!(!broker.is_running());
    assert!(broker.check_metadata(Duration::from_secs(2)).is_err());

    broker.start_again()?;
    assert!(broker.is_running());
    assert_eq!(broker.bootstrap(), bootstrap);
    broker.check_metadata(Duration::from_secs(5))?;

    // Kafka keeps what it acknowledged across kill -9, and accepts writes again.
    assert_eq!(
        read_topic(&bootstrap, "harness.before-kill", Duration::from_secs(30))?.len(),
        1
    );
    let producer = producer(&bootstrap)?;
    producer
        .send(
            FutureRecord::to("harness.after-restart")
                .key("k")
                .payload("v"),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)?;
    let records = read_topic(&bootstrap, "harness.after-restart", Duration::from_secs(30))?;
    assert_eq!(records.len(), 1);
    Ok(())
}

/// The three-node cluster: every node lists all three, a topic is replicated three times, a
/// killed partition leader is replaced by another node and rejoins after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_of_three_survives_its_leader_killed() -> Result<()> {
    let cluster = KafkaCluster::start(&[])?;
    let bootstrap = cluster.bootstrap();
    siphon_tests::create_topic_replicated(&bootstrap, "harness.replicated", 1, 3).await?;
    let producer = producer(&bootstrap)?;
    let send = |value: &'static str| {
        producer.send(
            FutureRecord::to("harness.replicated")
                .key("k")
                .payload(value),
            Duration::from_secs(60),
        )
    };
    send("one").await.map_err(|(e, _)| e)?;
    let md = cluster.metadata()?;
    assert_eq!(md.brokers().len(), 3);
    let topic = md
        .topics()
        .iter()
        .find(|t| t.name() == "harness.replicated")
        .expect("topic listed");
    assert_eq!(topic.partitions()[0].replicas().len(), 3);
    let leader = cluster.leader_of("harness.replicated", 0)?;
    cluster.node(u32::try_from(leader)?)?.kill9()?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            Ok(cluster
                .leader_of("harness.replicated", 0)
                .is_ok_and(|l| l != leader))
        },
    )
    .await?;
    send("two").await.map_err(|(e, _)| e)?;
    cluster.restart(u32::try_from(leader)?)?;
    let values: Vec<String> =
        read_topic(&bootstrap, "harness.replicated", Duration::from_secs(30))?
            .iter()
            .filter_map(|r| r.value_str())
            .collect();
    assert_eq!(values, ["one", "two"]);
    Ok(())
}

/// A proxied namespace: clients that bootstrap through the proxy are told the broker is at
/// the proxy's port, and a paused proxy holds their writes back while the broker is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_broker_keeps_clients_on_the_proxy() -> Result<()> {
    let broker = ProxiedBroker::start()?;
    let ports =
        siphon_tests::proxy::advertised_ports(&broker.bootstrap(), Duration::from_secs(10))?;
    assert_eq!(ports, [broker.proxy().port()]);
    let topic = broker.topic("harness.proxied");
    let producer = producer(&broker.bootstrap())?;
    producer
        .send(
            FutureRecord::to(&topic).key("k").payload("v"),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)?;
    let connections = broker.proxy().connections();
    assert!(connections >= 1);
    broker.proxy().pause();
    let paused_send = producer.send(
        FutureRecord::to(&topic).key("k").payload("w"),
        Duration::from_secs(30),
    );
    let outcome = tokio::time::timeout(Duration::from_secs(3), paused_send).await;
    assert!(outcome.is_err(), "a write went past the paused proxy");
    broker.proxy().resume();
    // Read directly from the broker: both the first write and the held one arrive.
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            Ok(read_topic(
                &broker.broker().bootstrap(),
                &topic,
                Duration::from_secs(10),
            )?
            .len()
                == 2)
        },
    )
    .await?;
    Ok(())
}

/// Exercises `SiphonProcess` with a stand-in script, independent of the real
/// binary's state.
#[tokio::test]
async fn child_process_handling() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fake = dir.path().join("fake-siphon");
    std::fs::write(
        &fake,
        "#!/bin/sh\n\
         echo \"args: $*\"\n\
         echo \"config: $(cat \"$3\")\"\n\
         echo \"to stderr\" >&2\n\
         trap 'echo got TERM; exit 7' TERM\n\
         echo ready\n\
         while true; do sleep 0.05; done\n",
    )?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

    let p = SiphonProcess::start_with(&fake, "answer = 42\n", &[])?;
    p.wait_for_log("ready", Duration::from_secs(10)).await?;
    assert!(p.is_running());
    let log = p.log();
    assert!(
        log.contains(&format!("args: run --config {}", p.config_path().display())),
        "{log}"
    );
    assert!(log.contains("config: answer = 42"), "{log}");
    assert!(log.contains("to stderr"), "{log}");

    p.terminate()?;
    let status = p.wait_exit(Duration::from_secs(10))?;
    assert_eq!(status.code(), Some(7));
    assert!(!p.is_running());
    wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async { Ok(p.log().contains("got TERM")) },
    )
    .await?;

    p.start_again()?;
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { Ok(p.log().matches("ready").count() == 2) },
    )
    .await?;
    assert!(p.is_running());
    let status = p.kill9()?;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(!p.is_running());
    assert!(p.wait_exit(Duration::from_millis(100)).is_ok());
    Ok(())
}
