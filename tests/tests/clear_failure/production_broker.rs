//! A Kafka broker set up as production clusters often are: it authenticates and authorizes
//! (SASL/PLAIN, Kafka's `StandardAuthorizer`, nothing allowed without an ACL) and creates no
//! topic on its own (`auto.create.topics.enable = false`). Siphon's principal with no ACL, with
//! a wrong password, with the ACLs for its own state but none for the outbox's topics, and
//! allowed to create those topics but not to write to them; the control, with the ACLs the
//! operations guide lists, everything delivered; and an event for a topic nobody created while
//! Siphon may not create topics (warned about with the fix, delivered once the topic exists);
//! exactly-once delivery without, then with, the transactional id's ACL, and with a topic nobody
//! created; dead letters without, then with, their topic's ACLs; a password rotated on the
//! brokers while Siphon runs (SCRAM-SHA-256, logins renewed every few seconds; also with
//! exactly-once delivery), and the controls, a login refused once (a handshake answered with an
//! error), then accepted or followed by a broker that hangs, which change nothing; an outbox
//! topic deleted while Siphon writes, on brokers that create no topic, when Siphon may create it
//! again (it does) and when it may not (it stops, naming CREATE, with nothing dead-lettered);
//! and every topic created by an operator while Siphon may create none (it needs no CREATE).
//! Each refusal is a definite error: Siphon stops with exit status 2 and a message naming the
//! fix, confirms nothing it did not deliver, and neither retries in a tight loop nor skips the
//! events.
//!
//! One node (its own: the shared one has no authorizer) serves every scenario, one after another:
//! each is a test of its own (`cargo test NAME` runs one), and starts with no ACL for Siphon's
//! principal.

use anyhow::{ensure, Context as _, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use siphon_tests::kafka_protocol::SASL_HANDSHAKE;
use siphon_tests::outbox::{
    check_first_deliveries_in_order, current_insert_lsn, event, insert_transaction,
    read_event_records_isolated, record_id, siphon_config_at, slot_confirmed_lsn, start_streaming,
    wait_for_all, wait_for_slot_past, with_exactly_once, KafkaTarget as _, Via, OUTBOX_DDL,
};
use siphon_tests::proxy::ThrottlingProxy;
use siphon_tests::scenarios;
use siphon_tests::{
    create_topic, read_topic_async, strip_ansi, wait_until, Isolation, KafkaNode, Postgres,
    SiphonProcess,
};
use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Siphon's exit status for an error the operator must fix.
const EXIT_DEFINITE: i32 = 2;

/// Siphon's principal and its password on the node.
const USER: &str = "siphon";
const PASSWORD: &str = "siphon-secret";

/// The ACLs Siphon needs for its own state (docs/operations.md lists them): the state topic,
/// its reader's group name, and idempotent writes; everything but the outbox's topics.
const STATE_ACLS: &[&str] = &[
    "TOPIC:LITERAL:READ:siphon.state",
    "TOPIC:LITERAL:WRITE:siphon.state",
    "TOPIC:LITERAL:DESCRIBE:siphon.state",
    "TOPIC:LITERAL:CREATE:siphon.state",
    "GROUP:LITERAL:READ:siphon-state-reader",
    "GROUP:LITERAL:DESCRIBE:siphon-state-reader",
    "CLUSTER:LITERAL:IDEMPOTENT_WRITE:kafka-cluster",
];

/// `kafka.properties` lines that log in as `User:siphon` with `password`.
fn sasl_properties(password: &str) -> String {
    format!(
        "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\
         \"sasl.username\" = \"{USER}\"\n\"sasl.password\" = \"{password}\""
    )
}

/// One scenario's PostgreSQL, and Siphon's configuration logging in as `User:siphon` on the
/// node's SASL listener, its topics in the namespace `<name>.`.
struct Setup {
    pg: Postgres,
    client: Client,
    config: String,
    /// The namespace, read through the PLAINTEXT listener (as a super user).
    target: Via,
}

/// [`Setup`] for scenario `name` (its slot), logging in with `password`; exactly-once when
/// `exactly_once`; `edit` may change the configuration text.
async fn setup(
    node: &KafkaNode,
    name: &str,
    password: &str,
    exactly_once: bool,
    edit: impl FnOnce(String) -> String,
) -> Result<Setup> {
    let pg = Postgres::start()?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let namespace = format!("{name}.");
    let siphon_target = Via {
        bootstrap: node
            .sasl_bootstrap()
            .context("the node has no SASL listener")?,
        namespace: namespace.clone(),
    };
    let config = siphon_config_at(&pg, &siphon_target, name, &sasl_properties(password), "");
    let config = if exactly_once {
        with_exactly_once(&config, &siphon_target)
    } else {
        config
    };
    Ok(Setup {
        pg,
        client,
        config: edit(config),
        target: Via {
            bootstrap: node.bootstrap(),
            namespace,
        },
    })
}

/// Siphon started on scenario `name`'s `setup`, and the scenario's first event committed and
/// delivered through it.
async fn event_1_delivered(setup: &mut Setup, name: &str) -> Result<SiphonProcess> {
    let siphon = start_streaming(&setup.client, &setup.config, name).await?;
    insert_transaction(&mut setup.client, &[event(1, true)], true).await?;
    let first: BTreeSet<String> = [event(1, true).id].into();
    wait_for_all(&setup.target, &first, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(siphon)
}

/// Grants `User:siphon` each of `acls` (see [`KafkaNode::grant`]).
fn grant<S: AsRef<str>>(node: &KafkaNode, acls: &[S]) -> Result<()> {
    let acls: Vec<&str> = acls.iter().map(AsRef::as_ref).collect();
    node.grant(&format!("User:{USER}"), &acls)
}

/// Grants `User:siphon` the ACLs for its own state ([`STATE_ACLS`]) and each of `acls`, in one
/// run of the admin client.
fn grant_with_state<S: AsRef<str>>(node: &KafkaNode, acls: &[S]) -> Result<()> {
    let all: Vec<&str> = STATE_ACLS
        .iter()
        .copied()
        .chain(acls.iter().map(AsRef::as_ref))
        .collect();
    grant(node, &all)
}

/// `TOPIC:PREFIXED:<operation>:<name>.` for each of `operations`.
fn namespace_acls(name: &str, operations: &[&str]) -> Vec<String> {
    operations
        .iter()
        .map(|operation| format!("TOPIC:PREFIXED:{operation}:{name}."))
        .collect()
}

/// Starts Siphon as `User:siphon` with `password` on the node's SASL listener, with an outbox
/// event committed before it starts; waits for it to stop and checks that it stopped with exit
/// status 2 within `within`, that nothing was confirmed past the event, and that the log names
/// each of `fix`. Returns the log.
async fn expect_definite_error(
    node: &KafkaNode,
    name: &str,
    password: &str,
    within: Duration,
    fix: &[&str],
) -> Result<String> {
    expect_definite_error_with(node, name, password, false, within, fix).await
}

/// [`expect_definite_error`], with exactly-once delivery when `exactly_once`.
async fn expect_definite_error_with(
    node: &KafkaNode,
    name: &str,
    password: &str,
    exactly_once: bool,
    within: Duration,
    fix: &[&str],
) -> Result<String> {
    let Setup {
        pg: _pg,
        mut client,
        config,
        ..
    } = setup(node, name, password, exactly_once, |c| c).await?;
    // The publication and the slot exist before the event, so the event is Siphon's to
    // deliver.
    client
        .batch_execute(&format!("CREATE PUBLICATION {name}_pub FOR TABLE outbox"))
        .await?;
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&name],
        )
        .await?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    let started = Instant::now();
    let siphon = SiphonProcess::start(&config)?;
    let log = expect_stopped_naming(&siphon, name, started, within, fix)?;
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < end,
        "the slot was confirmed at {confirmed:X}, past the undelivered event ending at {end:X}"
    );
    Ok(log)
}

/// Waits up to `within` for `siphon` to stop, and checks that it stopped with exit status 2 and a
/// log naming each of `fix`; reports how long after `since` (the fault: a start without an ACL,
/// a rotated password) it stopped. Returns the log.
fn expect_stopped_naming(
    siphon: &SiphonProcess,
    name: &str,
    since: Instant,
    within: Duration,
    fix: &[&str],
) -> Result<String> {
    let status = siphon.wait_exit(within).with_context(|| {
        format!(
            "Siphon did not stop within {within:?}; log:\n{}",
            siphon.log()
        )
    })?;
    let log = siphon.log();
    eprintln!(
        "{name}: stopped {:?} after the fault with {status}",
        since.elapsed()
    );
    ensure!(
        status.code() == Some(EXIT_DEFINITE),
        "exit status {status:?}; log:\n{log}"
    );
    for needle in fix {
        ensure!(
            log.contains(needle),
            "the log does not say {needle:?}:\n{log}"
        );
    }
    Ok(log)
}

/// Scenario 1: the principal has no ACL at all (authenticated, authorized for nothing).
async fn no_acls(node: &KafkaNode) -> Result<()> {
    expect_definite_error(
        node,
        "noacls",
        PASSWORD,
        Duration::from_secs(60),
        &[
            "TopicAuthorizationFailed",
            "grant Siphon's principal READ, WRITE and DESCRIBE",
        ],
    )
    .await?;
    Ok(())
}

/// Scenario 3: the principal may keep its state but has no ACL on the outbox's topics (the
/// grant forgotten): Siphon cannot create them.
async fn no_acls_on_the_outbox_topics(node: &KafkaNode) -> Result<()> {
    grant(node, STATE_ACLS)?;
    expect_definite_error(
        node,
        "nooutboxacls",
        PASSWORD,
        Duration::from_secs(60),
        &["refused to create topic", "grant CREATE"],
    )
    .await?;
    Ok(())
}

/// Scenario 4: the outbox's topics may be created and described but not written to.
async fn outbox_topics_not_writable(node: &KafkaNode) -> Result<()> {
    let name = "notwritable";
    grant_with_state(node, &namespace_acls(name, &["CREATE", "DESCRIBE"]))?;
    expect_definite_error(
        node,
        name,
        PASSWORD,
        Duration::from_secs(60),
        &["grant WRITE on the topic"],
    )
    .await?;
    Ok(())
}

/// Scenario 5, the control: with the ACLs docs/operations.md lists, Siphon delivers the event
/// and confirms it.
async fn the_documented_acls_suffice(node: &KafkaNode) -> Result<()> {
    let name = "granted";
    grant_with_state(
        node,
        &namespace_acls(name, &["WRITE", "DESCRIBE", "CREATE"]),
    )?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, false, |c| c).await?;
    let siphon = start_streaming(&client, &config, name).await?;
    let events = [event(1, true)];
    insert_transaction(&mut client, &events, true).await?;
    let end = current_insert_lsn(&client).await?;
    let expected = events.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&target, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

/// Creates each of `topics` compacted with one partition, as an operator creates Siphon's own
/// topics (one that exists already is left as it is).
async fn create_compacted_topics(node: &KafkaNode, topics: &[&str]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", node.bootstrap())
        .create()?;
    let topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|topic| {
            NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact")
        })
        .collect();
    for result in admin
        .create_topics(topics.iter(), &AdminOptions::new())
        .await?
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("creating {topic}: {code}"),
        }
    }
    Ok(())
}

/// `config` with topic creation off, and a shorter wait for a topic's metadata than
/// librdkafka's 30 s.
fn without_topic_creation(config: String) -> String {
    config
        .replace(
            "[kafka.topic_creation]\n",
            "[kafka.topic_creation]\nenabled = false\n",
        )
        .replace(
            "[kafka.properties]\n",
            "[kafka.properties]\n\"topic.metadata.propagation.max.ms\" = \"5000\"\n",
        )
}

/// Scenario 6: topics managed outside Siphon (`kafka.topic_creation.enabled = false`, and the
/// broker creates none): an event routed to a topic nobody created. The events before it are
/// delivered; Siphon keeps trying, with the producer replaced at most once per wait for the
/// topic (`topic.metadata.propagation.max.ms`, 5 s here) and each replacement's warning naming
/// the topic and the fix; it confirms nothing past the event; and once an operator creates the
/// topic, that event and those after it arrive, without a restart.
async fn a_topic_nobody_created(node: &KafkaNode) -> Result<()> {
    let name = "unmanaged";
    grant_with_state(node, &namespace_acls(name, &["WRITE", "DESCRIBE"]))?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, false, without_topic_creation).await?;
    // The topics an operator manages: Siphon's state topic and one of the two.
    create_compacted_topics(node, &["siphon.state"]).await?;
    create_topic(&node.bootstrap(), &target.topic("outbox.event.Order"), 3).await?;
    let siphon = start_streaming(&client, &config, name).await?;
    // Events 1 and 2 go to the Order topic, 3 to the missing Customer topic, 4 to Order.
    let before = [event(1, true), event(2, true)];
    insert_transaction(&mut client, &before, true).await?;
    insert_transaction(&mut client, &[event(3, true)], true).await?;
    let missing_end = current_insert_lsn(&client).await?;
    insert_transaction(&mut client, &[event(4, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    let expected: BTreeSet<String> = before.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&target, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let missing = target.topic("outbox.event.Customer");
    let warning = format!("delivery to topic {missing} failed with UnknownTopicOrPartition");
    siphon
        .wait_for_log(&warning, Duration::from_secs(60))
        .await
        .with_context(|| format!("no warning names {missing}; log:\n{}", siphon.log()))?;
    let log = siphon.log();
    ensure!(
        log.contains("the cluster has no such topic: create it"),
        "the warning does not name the fix:\n{log}"
    );
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < missing_end,
        "the slot was confirmed at {confirmed:X}, past event 3 (ending at {missing_end:X})"
    );
    // The operator creates the topic: Siphon, still running, delivers the rest.
    create_topic(&node.bootstrap(), &missing, 3).await?;
    let all: BTreeSet<String> = (1..=4).map(|seq| event(seq, true).id).collect();
    wait_for_all(&target, &all, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    ensure!(
        siphon.is_running(),
        "Siphon stopped; log:\n{}",
        siphon.log()
    );
    let replacements = siphon
        .log()
        .matches("Kafka producer failed; replacing it")
        .count();
    eprintln!("{name}: {replacements} producer replacements until the topic existed");
    Ok(())
}

/// What the topics of an exactly-once namespace need (the outbox's and the progress topic).
const EXACTLY_ONCE_TOPICS: &[&str] = &["READ", "WRITE", "DESCRIBE", "CREATE"];

/// Scenario 7: exactly-once delivery, every topic ACL granted but none on the transactional id.
async fn exactly_once_without_the_transactional_id_acl(node: &KafkaNode) -> Result<()> {
    let name = "eosnotxn";
    grant_with_state(node, &namespace_acls(name, EXACTLY_ONCE_TOPICS))?;
    expect_definite_error_with(
        node,
        name,
        PASSWORD,
        true,
        Duration::from_secs(90),
        &["TransactionalIdAuthorizationFailed", "transactional id"],
    )
    .await?;
    Ok(())
}

/// Scenario 8, the control of 7: with WRITE and DESCRIBE on the transactional id too, an
/// exactly-once Siphon delivers the event once, read_committed.
async fn exactly_once_with_the_documented_acls(node: &KafkaNode) -> Result<()> {
    let name = "eosgranted";
    let mut acls = namespace_acls(name, EXACTLY_ONCE_TOPICS);
    acls.extend(TRANSACTIONAL_ID_ACLS.iter().map(|acl| acl.to_string()));
    grant_with_state(node, &acls)?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, true, |c| c).await?;
    let siphon = start_streaming(&client, &config, name).await?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let read = read_event_records_isolated(&target, Isolation::ReadCommitted).await?;
    ensure!(
        read.len() == 1,
        "{} records read_committed for one event; log:\n{}",
        read.len(),
        siphon.log()
    );
    Ok(())
}

/// Scenario 2: a wrong password (SASL authentication fails on every connection). librdkafka
/// tells a client's context, while the request fails as a transport failure; Siphon stops as
/// soon as its state topic's reader hears of the refusal, well before the read's 30 s.
async fn wrong_password(node: &KafkaNode) -> Result<()> {
    expect_definite_error(
        node,
        "badpassword",
        "not-the-password",
        Duration::from_secs(20),
        &["refused Siphon's credentials", "\"sasl.password\""],
    )
    .await?;
    Ok(())
}

/// The transactional id's ACLs, as docs/operations.md lists them.
const TRANSACTIONAL_ID_ACLS: &[&str] = &[
    "TRANSACTIONAL_ID:PREFIXED:WRITE:siphon-",
    "TRANSACTIONAL_ID:PREFIXED:DESCRIBE:siphon-",
];

/// Scenario 10: scenario 6 with exactly-once delivery. The record for the missing topic fails
/// its Kafka transaction, which is aborted with everything in it; each session ends and the
/// next starts after a growing delay, from the last committed progress. Nothing is confirmed
/// past the event, nothing is visible twice to read_committed consumers, and once the topic
/// exists the events arrive once, without a restart.
async fn a_topic_nobody_created_with_exactly_once(node: &KafkaNode) -> Result<()> {
    let name = "eosunmanaged";
    let mut acls = namespace_acls(name, EXACTLY_ONCE_TOPICS);
    acls.extend(TRANSACTIONAL_ID_ACLS.iter().map(|acl| acl.to_string()));
    grant_with_state(node, &acls)?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, true, without_topic_creation).await?;
    create_compacted_topics(node, &["siphon.state", &target.topic("siphon.progress")]).await?;
    create_topic(&node.bootstrap(), &target.topic("outbox.event.Order"), 3).await?;
    let siphon = start_streaming(&client, &config, name).await?;
    // Events 1 and 2 go to the Order topic, 3 to the missing Customer topic, 4 to Order.
    let before = [event(1, true), event(2, true)];
    insert_transaction(&mut client, &before, true).await?;
    let before_end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, name, before_end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    insert_transaction(&mut client, &[event(3, true)], true).await?;
    let missing_end = current_insert_lsn(&client).await?;
    insert_transaction(&mut client, &[event(4, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    let missing = target.topic("outbox.event.Customer");
    let interruption = "pipeline interrupted; reconnecting";
    wait_until(
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async { Ok(siphon.log().matches(interruption).count() >= 2) },
    )
    .await
    .with_context(|| format!("no two sessions ended; log:\n{}", siphon.log()))?;
    let log = siphon.log();
    for needle in [
        missing.as_str(),
        "UnknownTopicOrPartition",
        "the cluster has no such topic: create it",
    ] {
        ensure!(
            log.contains(needle),
            "the log does not say {needle:?}:\n{log}"
        );
    }
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < missing_end,
        "the slot was confirmed at {confirmed:X}, past event 3 (ending at {missing_end:X})"
    );
    // The operator creates the topic: Siphon, still running, delivers the rest.
    create_topic(&node.bootstrap(), &missing, 3).await?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let read = read_event_records_isolated(&target, Isolation::ReadCommitted).await?;
    let ids: Vec<String> = read
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    ensure!(
        ids.len() == 4 && distinct.len() == 4,
        "read_committed: {ids:?} for four events; log:\n{}",
        siphon.log()
    );
    ensure!(
        siphon.is_running(),
        "Siphon stopped; log:\n{}",
        siphon.log()
    );
    eprintln!(
        "{name}: {} sessions ended until the topic existed",
        siphon.log().matches(interruption).count()
    );
    Ok(())
}

/// The dead-letter topic of scenario 11: outside its namespace, so the namespace's PREFIXED ACLs
/// do not cover it.
const DEAD_LETTER_TOPIC: &str = "deadletters-of-siphon";

/// Scenario 11: dead letters (`pipeline.on_error = "dead-letter"`) to a topic Siphon's principal
/// has no ACL on. A row that cannot be routed (its aggregatetype NULL) cannot be dead-lettered,
/// and it is not skipped: Siphon stops with exit status 2 naming the ACL to grant, confirming
/// nothing past it. Started again once the operations guide's ACLs on that topic are granted
/// (WRITE, DESCRIBE, CREATE), it dead-letters the row and delivers the events around it.
async fn dead_letters_without_then_with_their_topics_acls(node: &KafkaNode) -> Result<()> {
    let name = "deadletter";
    grant_with_state(
        node,
        &namespace_acls(name, &["WRITE", "DESCRIBE", "CREATE"]),
    )?;
    let dead_letters = |config: String| {
        config.replace(
            "[pipeline]\n",
            &format!(
                "[pipeline]\non_error = \"dead-letter\"\ndead_letter_topic = \"{DEAD_LETTER_TOPIC}\"\n"
            ),
        )
    };
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, false, dead_letters).await?;
    client
        .batch_execute("ALTER TABLE outbox ALTER COLUMN aggregatetype DROP NOT NULL")
        .await?;
    let siphon = start_streaming(&client, &config, name).await?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let poison = "00000000-0000-4000-8000-999999999999";
    client
        .batch_execute(&format!(
            "INSERT INTO outbox VALUES ('{poison}', NULL, 'order-x', 'Created', '{{}}')"
        ))
        .await?;
    let poison_end = current_insert_lsn(&client).await?;
    insert_transaction(&mut client, &[event(2, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    let written = Instant::now();
    expect_stopped_naming(
        &siphon,
        name,
        written,
        Duration::from_secs(60),
        &[DEAD_LETTER_TOPIC, "grant CREATE"],
    )?;
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < poison_end,
        "the slot was confirmed at {confirmed:X}, past the row not dead-lettered (ending at {poison_end:X})"
    );

    let topic_acls: Vec<String> = ["WRITE", "DESCRIBE", "CREATE"]
        .iter()
        .map(|operation| format!("TOPIC:LITERAL:{operation}:{DEAD_LETTER_TOPIC}"))
        .collect();
    grant(node, &topic_acls)?;
    siphon.start_again()?;
    let both: BTreeSet<String> = (1..=2).map(|seq| event(seq, true).id).collect();
    wait_for_all(&target, &both, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let dead = read_topic_async(
        &node.bootstrap(),
        DEAD_LETTER_TOPIC,
        Duration::from_secs(20),
    )
    .await?;
    let ids: Vec<String> = dead
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect();
    ensure!(
        !dead.is_empty()
            && dead.iter().all(|r| {
                let row: serde_json::Value =
                    serde_json::from_slice(r.value.as_deref().unwrap_or_default())
                        .unwrap_or_default();
                row["id"] == poison
            }),
        "dead letters: {ids:?}, values {:?}; log:\n{}",
        dead.iter().map(|r| r.value.clone()).collect::<Vec<_>>(),
        siphon.log()
    );
    Ok(())
}

/// `config` logging in with SCRAM-SHA-256 instead of PLAIN.
fn scram_sha_256(config: String) -> String {
    config.replace(
        "\"sasl.mechanisms\" = \"PLAIN\"",
        "\"sasl.mechanisms\" = \"SCRAM-SHA-256\"",
    )
}

/// How long a SCRAM login lasts on the node before the broker asks for a new one
/// (`connections.max.reauth.ms` for that mechanism): a rotated password reaches connections
/// already open within it.
const SCRAM_SESSION: Duration = Duration::from_secs(3);

/// Scenario 9: the password is rotated on the brokers while Siphon runs (its SCRAM credential
/// replaced; the brokers end each login within [`SCRAM_SESSION`]), and Siphon's configuration
/// still has the old one. Siphon stops with exit status 2 naming the credentials, promptly
/// rather than at the delivery deadline, confirming nothing it did not deliver; started again
/// with the new password it delivers the rest.
async fn password_rotated_while_running(node: &KafkaNode) -> Result<()> {
    password_rotated(node, "rotated", false).await
}

/// Scenario 16: scenario 9 with exactly-once delivery. The transactional producer's session ends
/// on the refusal with its Kafka transaction open; the transaction is never committed, and
/// started again with the new password Siphon delivers the rest: a read_committed consumer
/// sees each event once, in commit order.
async fn password_rotated_while_running_exactly_once(node: &KafkaNode) -> Result<()> {
    password_rotated(node, "rotatedeos", true).await
}

/// Scenario 9 (and 16 when `exactly_once`) for the namespace and slot `name`.
async fn password_rotated(node: &KafkaNode, name: &str, exactly_once: bool) -> Result<()> {
    let (old, new) = (format!("{name}-secret-1"), format!("{name}-secret-2"));
    let (old, new) = (old.as_str(), new.as_str());
    let acls = if exactly_once {
        let mut acls = namespace_acls(name, EXACTLY_ONCE_TOPICS);
        acls.extend(TRANSACTIONAL_ID_ACLS.iter().map(|acl| acl.to_string()));
        acls
    } else {
        namespace_acls(name, &["WRITE", "DESCRIBE", "CREATE"])
    };
    grant_with_state(node, &acls)?;
    node.set_scram_password(USER, old)?;
    let mut setup = setup(node, name, old, exactly_once, scram_sha_256).await?;
    let siphon = event_1_delivered(&mut setup, name).await?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup;

    node.set_scram_password(USER, new)?;
    let rotated = Instant::now();
    insert_transaction(&mut client, &[event(2, true)], true).await?;
    let end = current_insert_lsn(&client).await?;
    // The delivery deadline is librdkafka's 5 minutes: a stop within this bound is the refusal's
    // (5-8 s: the refusal, the broker probe asked after it unanswered, the status tick).
    expect_stopped_naming(
        &siphon,
        name,
        rotated,
        Duration::from_secs(60),
        &["refused Siphon's credentials", "\"sasl.password\""],
    )?;
    // Event 2 may have gone out on a connection logged in before the rotation; if the slot
    // passed it, it must be in the topic.
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    if confirmed >= end {
        let both: BTreeSet<String> = (1..=2).map(|seq| event(seq, true).id).collect();
        wait_for_all(&target, &both, Duration::from_secs(5))
            .await
            .with_context(|| format!("the slot was confirmed at {confirmed:X}, past event 2 (ending at {end:X}), which is not in the topic"))?;
    }

    // Started again with the new password, it delivers the rest.
    let siphon = start_streaming(&client, &config.replace(old, new), name).await?;
    let both: BTreeSet<String> = (1..=2).map(|seq| event(seq, true).id).collect();
    wait_for_all(&target, &both, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    if exactly_once {
        events_once_read_committed(&target, 2, &siphon).await?;
    }
    Ok(())
}

/// Checks that a read_committed consumer of `target` sees events 1 to `last` each once (each
/// with a key of its own: no order to check), and nothing else.
async fn events_once_read_committed(target: &Via, last: u64, siphon: &SiphonProcess) -> Result<()> {
    let read = read_event_records_isolated(target, Isolation::ReadCommitted).await?;
    let mut ids: Vec<String> = read.iter().map(record_id).collect();
    ids.sort_unstable();
    let expected: Vec<String> = (1..=last).map(|seq| event(seq, true).id).collect();
    ensure!(
        ids == expected,
        "read_committed: {ids:?}, not events 1 to {last} once each; log:\n{}",
        siphon.log()
    );
    Ok(())
}

/// Siphon logging in through a proxy (SCRAM-SHA-256, again every [`SCRAM_SESSION`]), event 1
/// delivered, then the next login refused once: the proxy answers a SaslHandshake with an
/// error, as a broker restarting with another listener configuration may; librdkafka reports a
/// handshake cut short by a broker going away the same way, as an authentication failure.
/// What scenarios 12 and 13 start from.
struct RefusedOnce {
    setup: Setup,
    proxy: ThrottlingProxy,
    siphon: SiphonProcess,
}

async fn a_login_refused_once(node: &KafkaNode, name: &str) -> Result<RefusedOnce> {
    let password = format!("{name}-secret");
    grant_with_state(
        node,
        &namespace_acls(name, &["WRITE", "DESCRIBE", "CREATE"]),
    )?;
    node.set_scram_password(USER, &password)?;
    let sasl = node
        .sasl_bootstrap()
        .context("the node has no SASL listener")?;
    let proxy = ThrottlingProxy::start_kafka_advertised(sasl.parse()?)?;
    let through_the_proxy = |config: String| scram_sha_256(config).replace(&sasl, &proxy.address());
    let mut setup = setup(node, name, &password, false, through_the_proxy).await?;
    let siphon = event_1_delivered(&mut setup, name).await?;

    // Kafka's UNSUPPORTED_SASL_MECHANISM, for the next login of any of Siphon's clients; armed
    // again while the refusal has not reached a context that tells of it (the clients that
    // create the outbox's topics log through librdkafka's own).
    let refusal_told = "Kafka client error error=Global error: Authentication";
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            if strip_ansi(&siphon.log()).contains(refusal_told) {
                return Ok(true);
            }
            proxy.fail_next_answer_to(SASL_HANDSHAKE, b"SCRAM-SHA-256", 33);
            Ok(false)
        },
    )
    .await
    .with_context(|| {
        format!(
            "no login was refused ({} answers failed): the test proved nothing; log:\n{}",
            proxy.answers_failed(),
            siphon.log()
        )
    })?;
    proxy.clear_answer_hold();
    Ok(RefusedOnce {
        setup,
        proxy,
        siphon,
    })
}

/// After [`a_login_refused_once`]: event 2 reaches the topic and the slot passes it, and
/// Siphon is still running past the time a refusal that stands is told in.
async fn delivers_event_2_and_runs_on(name: &str, refused: &mut RefusedOnce) -> Result<()> {
    let RefusedOnce {
        setup: Setup { client, target, .. },
        siphon,
        ..
    } = refused;
    insert_transaction(client, &[event(2, true)], true).await?;
    let end = current_insert_lsn(client).await?;
    let both: BTreeSet<String> = (1..=2).map(|seq| event(seq, true).id).collect();
    wait_for_all(target, &both, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    // Past the time refusals must go on for, and a login again.
    tokio::time::sleep(SCRAM_SESSION * 2).await;
    ensure!(
        siphon.is_running() && !siphon.log().contains("refused Siphon's credentials"),
        "a login refused once stopped Siphon; log:\n{}",
        siphon.log()
    );
    Ok(())
}

/// Scenario 12: a login refused once, then accepted: Siphon goes on and delivers.
async fn a_login_refused_once_is_not_a_refusal(node: &KafkaNode) -> Result<()> {
    let name = "refusedonce";
    let mut refused = a_login_refused_once(node, name).await?;
    delivers_event_2_and_runs_on(name, &mut refused).await
}

/// How long the broker hangs in scenario 13: several broker probes, each unanswered, and less
/// than librdkafka's connection set-up timeout (30 s), so no connection failure is reported
/// meanwhile.
const HUNG_FOR: Duration = Duration::from_secs(15);

/// Scenario 13: a login refused once, then the broker hangs: it accepts connections and
/// answers nothing (a process stopped, a network partitioned), so no request is answered and
/// no connection fails. That is not a refusal: Siphon waits for the broker, and delivers once
/// it answers again.
async fn a_login_refused_once_then_a_hung_broker_is_not_a_refusal(node: &KafkaNode) -> Result<()> {
    let name = "refusedhung";
    let mut refused = a_login_refused_once(node, name).await?;
    refused.proxy.pause();
    let hung = Instant::now();
    while hung.elapsed() < HUNG_FOR {
        if !refused.siphon.is_running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let running = refused.siphon.is_running();
    refused.proxy.resume();
    ensure!(
        running
            && !refused
                .siphon
                .log()
                .contains("refused Siphon's credentials"),
        "a broker hanging after a refused login stopped Siphon after {:?}; log:\n{}",
        hung.elapsed(),
        refused.siphon.log()
    );
    delivers_event_2_and_runs_on(name, &mut refused).await
}

/// Scenario 14: the outbox topic deleted while Siphon writes to it, on brokers that create no
/// topic themselves (`auto.create.topics.enable = false`, as on this node), with dead letters
/// on. The records sent after the deletion fail for their topic missing, which is not their
/// fault: none is dead-lettered; the producer is replaced, Siphon creates the topic again and
/// they arrive, in commit order, beside those of another topic. What the deleted topic held is
/// gone with it. (librdkafka gives a topic that stops existing
/// `topic.metadata.propagation.max.ms` to come back: 3 s here, 30 s by default.)
async fn a_topic_deleted_on_brokers_that_create_none(node: &KafkaNode) -> Result<()> {
    let name = "deletednone";
    let mut setup = deletion_setup(node, name, &["WRITE", "DESCRIBE", "CREATE"]).await?;
    let siphon = event_1_delivered(&mut setup, name).await?;
    let Setup {
        pg: _pg,
        mut client,
        target,
        ..
    } = setup;

    // Event 1's topic deleted; events 2 to 8 of it and of another topic committed after.
    delete_topic(node, &target.topic("outbox.event.Order")).await?;
    for seq in 2..=8 {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
    }
    let end = current_insert_lsn(&client).await?;
    let after: BTreeSet<String> = (2..=8).map(|seq| event(seq, true).id).collect();
    let records = wait_for_all(&target, &after, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    check_first_deliveries_in_order(&records)?;
    let dead_ids = dead_lettered_among(node, &after).await?;
    ensure!(
        dead_ids.is_empty(),
        "records dead-lettered for their topic missing: {dead_ids:?}; log:\n{}",
        siphon.log()
    );
    ensure!(siphon.is_running(), "log:\n{}", siphon.log());
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

/// `pipeline.on_error = "dead-letter"` to [`DEAD_LETTER_TOPIC`], and librdkafka's wait for a
/// topic that stops existing (`topic.metadata.propagation.max.ms`) at 3 s instead of 30 s.
fn dead_letters_and_a_short_topic_wait(config: String) -> String {
    config
        .replace(
            "[pipeline]\n",
            &format!(
                "[pipeline]\non_error = \"dead-letter\"\ndead_letter_topic = \"{DEAD_LETTER_TOPIC}\"\n"
            ),
        )
        .replace(
            "[kafka.properties]\n",
            "[kafka.properties]\n\"topic.metadata.propagation.max.ms\" = \"3000\"\n",
        )
}

/// [`namespace_acls`] for `operations`, and every ACL the dead-letter topic needs.
fn namespace_and_dead_letter_acls(name: &str, operations: &[&str]) -> Vec<String> {
    let dead_letter_acls = ["WRITE", "DESCRIBE", "CREATE"]
        .iter()
        .map(|operation| format!("TOPIC:LITERAL:{operation}:{DEAD_LETTER_TOPIC}"));
    namespace_acls(name, operations)
        .into_iter()
        .chain(dead_letter_acls)
        .collect()
}

/// [`Setup`] of a deletion scenario: `operations` on the namespace, every ACL on the dead-letter
/// topic, and [`dead_letters_and_a_short_topic_wait`].
async fn deletion_setup(node: &KafkaNode, name: &str, operations: &[&str]) -> Result<Setup> {
    grant_with_state(node, &namespace_and_dead_letter_acls(name, operations))?;
    setup(
        node,
        name,
        PASSWORD,
        false,
        dead_letters_and_a_short_topic_wait,
    )
    .await
}

/// Deletes `topic` on the node (as its super user).
async fn delete_topic(node: &KafkaNode, topic: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", node.bootstrap())
        .create()?;
    for result in admin.delete_topics(&[topic], &AdminOptions::new()).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("deleting {name}: {code}"))?;
    }
    Ok(())
}

/// The ids of the dead letters on the node that are among `ids`.
async fn dead_lettered_among(node: &KafkaNode, ids: &BTreeSet<String>) -> Result<Vec<String>> {
    let dead = read_topic_async(
        &node.bootstrap(),
        DEAD_LETTER_TOPIC,
        Duration::from_secs(30),
    )
    .await?;
    Ok(dead
        .iter()
        .filter_map(|r| r.header("id"))
        .map(|id| String::from_utf8_lossy(id).into_owned())
        .filter(|id| ids.contains(id))
        .collect())
}

/// Scenario 15: scenario 14 where the topics are an operator's: created before Siphon starts,
/// and Siphon's principal may write to and describe them but not create them (topic creation
/// is on; Siphon never needed CREATE for topics that exist). The outbox topic is deleted while
/// Siphon writes, with dead letters on. Siphon cannot create it again, and the records for it
/// are not at fault: none is dead-lettered and none is confirmed; Siphon stops with exit status
/// 2 naming the topic and the ACL (or creating the topic) as the fix. Started again once the
/// operator creates the topic, it delivers them.
async fn a_topic_deleted_that_siphon_may_not_create(node: &KafkaNode) -> Result<()> {
    let name = "deletednocreate";
    let mut setup = deletion_setup(node, name, &["WRITE", "DESCRIBE"]).await?;
    let order = setup.target.topic("outbox.event.Order");
    let customer = setup.target.topic("outbox.event.Customer");
    create_topic(&node.bootstrap(), &order, 3).await?;
    create_topic(&node.bootstrap(), &customer, 3).await?;
    let siphon = event_1_delivered(&mut setup, name).await?;
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup;

    delete_topic(node, &order).await?;
    let deleted = Instant::now();
    insert_transaction(&mut client, &[event(2, true)], true).await?;
    let event_2_end = current_insert_lsn(&client).await?;
    for seq in 3..=8 {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
    }
    let end = current_insert_lsn(&client).await?;
    let after: BTreeSet<String> = (2..=8).map(|seq| event(seq, true).id).collect();
    expect_stopped_naming(
        &siphon,
        name,
        deleted,
        Duration::from_secs(60),
        &[&order, "CREATE"],
    )?;
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < event_2_end,
        "the slot was confirmed at {confirmed:X}, past event 2 (ending at {event_2_end:X}), whose topic is gone"
    );
    let dead = dead_lettered_among(node, &after).await?;
    ensure!(
        dead.is_empty(),
        "records dead-lettered for their topic missing: {dead:?}; log:\n{}",
        siphon.log()
    );

    // The operator creates the topic again: started again, Siphon delivers the rest in order.
    create_topic(&node.bootstrap(), &order, 3).await?;
    let siphon = start_streaming(&client, &config, name).await?;
    let records = wait_for_all(&target, &after, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    check_first_deliveries_in_order(&records)?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

/// Scenario 17: every topic Siphon writes created by an operator beforehand (the state topic,
/// exactly-once's progress topic, the outbox's topics), and Siphon's principal allowed to read,
/// write and describe them but to create none, with topic creation on (the default). Brokers
/// check CREATE before they look for a topic, so each creation Siphon asks for is refused; the
/// topics exist, so Siphon goes on: exactly-once, read_committed sees each event once.
async fn topics_an_operator_created_need_no_create_acl(node: &KafkaNode) -> Result<()> {
    let name = "nocreate";
    // A state topic of its own in the namespace: the other scenarios' ACLs on `siphon.state`
    // include CREATE.
    let state_topic = format!("{name}.state");
    let mut acls: Vec<String> = STATE_ACLS
        .iter()
        .filter(|acl| acl.starts_with("GROUP:") || acl.starts_with("CLUSTER:"))
        .map(|acl| acl.to_string())
        .collect();
    acls.extend(namespace_acls(name, &["READ", "WRITE", "DESCRIBE"]));
    acls.extend(TRANSACTIONAL_ID_ACLS.iter().map(|acl| acl.to_string()));
    grant(node, &acls)?;
    let own_state_topic = |config: String| {
        config.replacen(
            "[kafka]\n",
            &format!("[kafka]\nstate_topic = \"{state_topic}\"\n"),
            1,
        )
    };
    let Setup {
        pg: _pg,
        mut client,
        config,
        target,
    } = setup(node, name, PASSWORD, true, own_state_topic).await?;
    ensure!(
        config.contains(&state_topic),
        "no [kafka] table in:\n{config}"
    );
    create_compacted_topics(node, &[&state_topic, &target.topic("siphon.progress")]).await?;
    for aggregate in ["Order", "Customer"] {
        create_topic(
            &node.bootstrap(),
            &target.topic(&format!("outbox.event.{aggregate}")),
            3,
        )
        .await?;
    }
    let siphon = start_streaming(&client, &config, name).await?;
    for seq in 1..=3 {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
    }
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    events_once_read_committed(&target, 3, &siphon).await
}

/// The locked-down node this process's scenarios share.
fn node() -> Result<&'static KafkaNode> {
    static NODE: OnceLock<std::result::Result<KafkaNode, String>> = OnceLock::new();
    scenarios::shared(&NODE, || {
        KafkaNode::start_single_with_sasl_for_process(
            &[(USER, PASSWORD)],
            &[
                ("auto.create.topics.enable", "false"),
                (
                    "listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms",
                    &SCRAM_SESSION.as_millis().to_string(),
                ),
            ],
        )
    })
}

/// Each scenario a test of its own, on the shared node, one at a time, starting with no ACL
/// for Siphon's principal (whatever the scenario before granted).
macro_rules! on_the_node {
    ($($name:ident),* $(,)?) => {
        mod on_the_node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    let _turn = siphon_tests::scenarios::TURN.lock().await;
                    let node = super::node()?;
                    node.revoke_all(&format!("User:{}", super::USER))?;
                    super::$name(node).await
                }
            )*
        }
    };
}

on_the_node!(
    no_acls,
    wrong_password,
    no_acls_on_the_outbox_topics,
    outbox_topics_not_writable,
    the_documented_acls_suffice,
    a_topic_nobody_created,
    exactly_once_without_the_transactional_id_acl,
    exactly_once_with_the_documented_acls,
    password_rotated_while_running,
    password_rotated_while_running_exactly_once,
    a_topic_nobody_created_with_exactly_once,
    dead_letters_without_then_with_their_topics_acls,
    a_login_refused_once_is_not_a_refusal,
    a_login_refused_once_then_a_hung_broker_is_not_a_refusal,
    a_topic_deleted_on_brokers_that_create_none,
    a_topic_deleted_that_siphon_may_not_create,
    topics_an_operator_created_need_no_create_acl,
);
