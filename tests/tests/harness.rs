//! Proves the harness itself against the real services: PostgreSQL through
//! scripts/postgres.sh, the Tansu broker, and child-process handling.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use siphon_tests::{list_topics, read_topic, wait_until, Broker, Postgres, SiphonProcess};

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
    let topic = "harness.roundtrip";
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
        assert_eq!(r.topic, topic);
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
        "harness.never-written",
        Duration::from_secs(10),
    )?;
    assert!(records.is_empty(), "{records:#?}");
    Ok(())
}

#[tokio::test]
async fn broker_kill_and_start_again() -> Result<()> {
    let broker = Broker::start()?;
    let bootstrap = broker.bootstrap();
    broker.check_metadata(Duration::from_secs(5))?;

    broker.kill()?;
    assert!(!broker.is_running());
    assert!(broker.check_metadata(Duration::from_secs(2)).is_err());

    broker.start_again()?;
    assert!(broker.is_running());
    assert_eq!(broker.bootstrap(), bootstrap);
    broker.check_metadata(Duration::from_secs(5))?;

    // The restarted broker accepts writes again.
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
