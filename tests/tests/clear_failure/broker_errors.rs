//! A broker that refuses records for good (POLICY_VIOLATION, INVALID_TIMESTAMP ...), played by
//! the Kafka-mode fault proxy in front of the Kafka broker: Siphon stops naming the record's
//! topic, the code and a fix, or dead-letters the refused record, and never retries it in a
//! tight loop of producer rebuilds.

use anyhow::{Context, Result};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use siphon_tests::outbox::{
    current_insert_lsn, siphon_config_at, slot_active, wait_for_slot_past, OUTBOX_DDL,
};
use siphon_tests::proxy::{ProduceFault, ProxiedBroker};
use siphon_tests::{
    create_topic, read_topic_async, wait_for, wait_until, ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;

const POLICY_VIOLATION: i16 = 44;
const INVALID_TIMESTAMP: i16 = 32;
/// Marks the one record the broker refuses.
const POISON: &str = "POISON-7f3a";
/// The topics, in each test's namespace (`broker.topic(..)`).
const ORDERS: &str = "outbox.event.Order";
const CUSTOMERS: &str = "outbox.event.Customer";
const DEAD_LETTERS: &str = "outbox.dlq";
/// The log line Siphon writes each time it replaces its producer.
const REBUILD_LINE: &str = "Kafka producer failed; replacing it";

fn header(record: &ConsumedRecord, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}

fn ids(records: &[ConsumedRecord]) -> Vec<String> {
    let mut ids: Vec<String> = records.iter().map(|r| header(r, "id")).collect();
    ids.sort();
    ids
}

fn config(pg: &Postgres, broker: &ProxiedBroker, slot: &str, pipeline: &str) -> String {
    siphon_config_at(
        pg,
        broker,
        slot,
        "\"message.timeout.ms\" = \"10000\"",
        pipeline,
    )
}

async fn start(
    pg: &Postgres,
    broker: &ProxiedBroker,
    slot: &str,
    pipeline: &str,
) -> Result<(tokio_postgres::Client, SiphonProcess)> {
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    // Every topic Siphon writes exists, with a leader, before its first Produce: the broker's
    // answer to a Produce that reaches a partition before its leader is ready names the
    // broker's own address, which would take the producer past the fault proxy.
    for topic in [ORDERS, CUSTOMERS, DEAD_LETTERS] {
        create_topic(&broker.broker().bootstrap(), &broker.topic(topic), 3).await?;
    }
    let siphon = SiphonProcess::start(&config(pg, broker, slot, pipeline))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, slot).await },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok((client, siphon))
}

fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// One transaction: three events of aggregate `order-1` (one partition, sent together, so one
/// batch), the middle one poisoned when `poison`, and one Customer event (another topic).
async fn write_batch(client: &tokio_postgres::Client, first: u32, poison: bool) -> Result<()> {
    let middle = if poison {
        format!("{{\"n\": {}, \"mark\": \"{POISON}\"}}", first + 1)
    } else {
        format!("{{\"n\": {}}}", first + 1)
    };
    client
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox VALUES ('{}', 'Order', 'order-1', 'Created', '{{\"n\": {first}}}');
             INSERT INTO outbox VALUES ('{}', 'Order', 'order-1', 'Paid', '{middle}');
             INSERT INTO outbox VALUES ('{}', 'Order', 'order-1', 'Shipped', '{{\"n\": {}}}');
             INSERT INTO outbox VALUES ('{}', 'Customer', 'customer-1', 'Joined', '{{\"n\": {}}}');
             DELETE FROM outbox;
             COMMIT;",
            id(first),
            id(first + 1),
            id(first + 2),
            first + 2,
            id(first + 3),
            first + 3,
        ))
        .await?;
    Ok(())
}

/// The proxy itself, seen by librdkafka: the chosen topic's produce fails with the chosen code,
/// another topic's succeeds, and the same producer goes on writing after the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_refuses_one_topic_with_the_chosen_code() -> Result<()> {
    let broker = ProxiedBroker::start_kafka_aware()?;
    let (fine_topic, refused_topic) = (broker.topic("fine"), broker.topic("refused"));
    // Created (with a leader) directly on the broker first: see `start`.
    for topic in [&fine_topic, &refused_topic] {
        create_topic(&broker.broker().bootstrap(), topic, 1).await?;
    }
    broker
        .proxy()
        .set_produce_fault(Some(ProduceFault::new(&refused_topic, POLICY_VIOLATION)));
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "10000")
        .create()?;
    let fine = producer
        .send(
            FutureRecord::<str, str>::to(&fine_topic).payload("ok"),
            Duration::from_secs(10),
        )
        .await;
    assert!(fine.is_ok(), "{fine:?}");
    let refused = producer
        .send(
            FutureRecord::<str, str>::to(&refused_topic).payload("no"),
            Duration::from_secs(10),
        )
        .await;
    match refused {
        Err((KafkaError::MessageProduction(code), _)) => {
            assert_eq!(code, RDKafkaErrorCode::PolicyViolation)
        }
        other => panic!("expected a policy violation, got {other:?}"),
    }
    assert!(broker.proxy().faults_injected() >= 1);
    let versions = broker.proxy().produce_versions();
    eprintln!("Produce versions used against Kafka: {versions:?}");
    assert!(
        !versions.is_empty()
            && versions
                .iter()
                .all(|v| siphon_tests::kafka_protocol::PRODUCE_VERSIONS.contains(v)),
        "{versions:?}"
    );
    // After a refused batch librdkafka bumps the idempotent producer's epoch (KIP-360), which
    // Kafka accepts: the same producer writes on, and the broker holds what it accepted and
    // nothing of the refused topic.
    let again = producer
        .send(
            FutureRecord::<str, str>::to(&fine_topic).payload("ok again"),
            Duration::from_secs(10),
        )
        .await;
    assert!(again.is_ok(), "{again:?}");
    let direct = broker.broker().bootstrap();
    let written: Vec<String> = read_topic_async(&direct, &fine_topic, Duration::from_secs(20))
        .await?
        .iter()
        .filter_map(ConsumedRecord::value_str)
        .collect();
    assert_eq!(written, ["ok", "ok again"]);
    let refused = read_topic_async(&direct, &refused_topic, Duration::from_secs(10)).await?;
    assert!(
        refused.is_empty(),
        "the refused record reached the broker: {refused:?}"
    );
    Ok(())
}

/// `on_error = "fail"`: a record the broker refuses for good stops Siphon with exit status 2,
/// naming the topic, the code and a fix, after no more than one producer rebuild.
async fn a_refused_record_stops_siphon(code: i16, code_name: &str, fix_word: &str) -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    broker
        .proxy()
        .set_produce_fault(Some(ProduceFault::new(&broker.topic(ORDERS), code)));
    let slot = format!("refused{code}");
    let (client, siphon) = start(&pg, &broker, &slot, "").await?;
    write_batch(&client, 1, false).await?;
    let end = current_insert_lsn(&client).await?;
    let status = siphon
        .wait_exit(Duration::from_secs(60))
        .with_context(|| format!("siphon kept running; log:\n{}", siphon.log()))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains(&broker.topic(ORDERS)),
        "names the topic: {log}"
    );
    assert!(log.contains(code_name), "names the code: {log}");
    assert!(log.contains(&format!("code {code}")), "{log}");
    assert!(log.contains(fix_word), "names a fix: {log}");
    let rebuilds = log.matches(REBUILD_LINE).count();
    assert!(rebuilds <= 1, "{rebuilds} producer rebuilds: {log}");
    // The refused transaction was not confirmed.
    let confirmed = siphon_tests::outbox::slot_confirmed_lsn(&client, &slot)
        .await?
        .unwrap_or(0);
    assert!(confirmed < end, "the slot passed a refused transaction");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_violation_stops_siphon_naming_topic_code_and_fix() -> Result<()> {
    a_refused_record_stops_siphon(POLICY_VIOLATION, "PolicyViolation", "policy").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_timestamp_stops_siphon_naming_topic_code_and_fix() -> Result<()> {
    a_refused_record_stops_siphon(INVALID_TIMESTAMP, "InvalidTimestamp", "timestamp").await
}

/// Starts Siphon with `on_error = "dead-letter"` behind a proxy that refuses (POLICY_VIOLATION)
/// every `outbox.event.Order` batch holding the poison marker, writes one poisoned transaction
/// and one clean one, and waits for the slot to pass both.
struct PoisonRun {
    _pg: Postgres,
    broker: ProxiedBroker,
    siphon: SiphonProcess,
}

async fn poison_run(slot: &str) -> Result<PoisonRun> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    broker.proxy().set_produce_fault(Some(
        ProduceFault::new(&broker.topic(ORDERS), POLICY_VIOLATION).marker(POISON.as_bytes()),
    ));
    let pipeline = format!(
        "on_error = \"dead-letter\"\ndead_letter_topic = \"{}\"",
        broker.topic(DEAD_LETTERS)
    );
    let (client, siphon) = start(&pg, &broker, slot, &pipeline).await?;
    write_batch(&client, 1, true).await?;
    let poisoned = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, slot, poisoned, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    // Written once the poisoned one is settled, so that its records cannot share a batch with it.
    write_batch(&client, 11, false).await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, slot, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(PoisonRun {
        _pg: pg,
        broker,
        siphon,
    })
}

/// What does not depend on finding the guilty record: it is dead-lettered with its error
/// headers, the other topic is unaffected, later clean records flow, the slot moves on, and the
/// producer is not rebuilt in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_is_dead_lettered_and_the_slot_moves_on() -> Result<()> {
    let run = poison_run("poison").await?;
    let bootstrap = run.broker.bootstrap();
    let dead = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(
                &bootstrap,
                &run.broker.topic(DEAD_LETTERS),
                Duration::from_secs(20),
            )
            .await?;
            Ok((!r.is_empty()).then_some(r))
        },
    )
    .await?;
    let log = run.siphon.log();
    let poison = dead
        .iter()
        .find(|r| header(r, "id") == id(2))
        .with_context(|| {
            format!(
                "the poisoned record is dead-lettered: {:?}\n{log}",
                ids(&dead)
            )
        })?;
    assert_eq!(
        header(poison, "siphon.original.topic"),
        run.broker.topic(ORDERS)
    );
    assert_eq!(header(poison, "siphon.error.stage"), "produce");
    let message = header(poison, "siphon.error.message");
    assert!(
        message.contains("PolicyViolation") && message.contains("code 44"),
        "{message}"
    );
    assert!(poison.value_str().unwrap_or_default().contains(POISON));
    assert!(!header(poison, "siphon.source.commit.lsn").is_empty());

    let customers = read_topic_async(
        &bootstrap,
        &run.broker.topic(CUSTOMERS),
        Duration::from_secs(20),
    )
    .await?;
    // The refusal fails the producer (gap-less idempotence): a record of the other topic still
    // in flight then is purged with it and sent again by the replacement, a repeat with its id
    // (docs/reliability.md, "after a Kafka-side failure"). Its events all arrive, and none
    // is dead-lettered.
    let mut distinct = ids(&customers);
    distinct.dedup();
    assert_eq!(
        distinct,
        [id(4), id(14)],
        "the other topic's events arrive: {:?}\n{log}",
        ids(&customers)
    );
    assert!(
        dead.iter()
            .all(|r| header(r, "siphon.original.topic") != run.broker.topic(CUSTOMERS)),
        "no record of the other topic is dead-lettered: {:?}",
        ids(&dead)
    );
    let orders = read_topic_async(
        &bootstrap,
        &run.broker.topic(ORDERS),
        Duration::from_secs(20),
    )
    .await?;
    for clean in [id(11), id(12), id(13)] {
        assert!(
            ids(&orders).contains(&clean),
            "a later clean record {clean} arrives: {:?}",
            ids(&orders)
        );
    }
    assert!(
        !ids(&orders).contains(&id(2)),
        "the poison is not in its topic"
    );
    // Gap-less idempotence: the refused batch fails the producer, and the record refused again
    // when sent alone fails its replacement; two replacements, not a loop.
    let rebuilds = log.matches(REBUILD_LINE).count();
    assert!(rebuilds <= 2, "{rebuilds} producer rebuilds:\n{log}");
    assert!(run.siphon.is_running(), "{log}");
    Ok(())
}

/// The broker refuses the whole batch, so the innocent records that shared it are sent again
/// (each refused one alone, until the guilty one is known), and only the guilty one is
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_guilty_record_of_a_refused_batch_is_dead_lettered() -> Result<()> {
    let run = poison_run("guilty").await?;
    let bootstrap = run.broker.bootstrap();
    let log = run.siphon.log();
    let dead = read_topic_async(
        &bootstrap,
        &run.broker.topic(DEAD_LETTERS),
        Duration::from_secs(20),
    )
    .await?;
    assert_eq!(
        ids(&dead),
        [id(2)],
        "only the poisoned record is dead-lettered\n{log}"
    );
    let orders = read_topic_async(
        &bootstrap,
        &run.broker.topic(ORDERS),
        Duration::from_secs(20),
    )
    .await?;
    let order_ids = ids(&orders);
    for innocent in [id(1), id(3)] {
        assert!(
            order_ids.contains(&innocent),
            "the innocent record {innocent} of the refused batch is delivered: {order_ids:?}\n{log}"
        );
    }
    Ok(())
}
