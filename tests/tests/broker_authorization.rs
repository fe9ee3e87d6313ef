//! A Kafka broker that authenticates and authorizes (SASL/PLAIN, Kafka's `StandardAuthorizer`,
//! nothing allowed without an ACL), as production clusters run: Siphon's principal with no
//! ACL, with a wrong password, with the ACLs for its own state but none for the outbox's
//! topics, and allowed to create those topics but not to write to them; and, the control, with
//! the ACLs the operations guide lists, everything delivered. Each is a definite error: Siphon stops with exit
//! status 2 and a message naming the fix, confirms nothing it did not deliver, and neither
//! retries in a tight loop nor skips the events.
//!
//! One node (its own: the shared one has no authorizer) serves every scenario, one after another.

use anyhow::{ensure, Context as _, Result};
use siphon_tests::outbox::{
    current_insert_lsn, event, insert_transaction, siphon_config_at, slot_confirmed_lsn,
    start_streaming, wait_for_all, wait_for_slot_past, Via, OUTBOX_DDL,
};
use siphon_tests::{KafkaNode, Postgres, SiphonProcess};
use std::time::{Duration, Instant};

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
    let pg = Postgres::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let target = Via {
        bootstrap: node
            .sasl_bootstrap()
            .context("the node has no SASL listener")?,
        namespace: format!("{name}."),
    };
    let config = siphon_config_at(&pg, &target, name, &sasl_properties(password), "");
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
    let status = siphon.wait_exit(within).with_context(|| {
        format!(
            "Siphon did not stop within {within:?}; log:\n{}",
            siphon.log()
        )
    })?;
    let log = siphon.log();
    eprintln!(
        "{name}: stopped after {:?} with {status}",
        started.elapsed()
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
    let confirmed = slot_confirmed_lsn(&client, name).await?.unwrap_or(0);
    ensure!(
        confirmed < end,
        "the slot was confirmed at {confirmed:X}, past the undelivered event ending at {end:X}"
    );
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
    node.grant(&format!("User:{USER}"), STATE_ACLS)?;
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
    node.grant(
        &format!("User:{USER}"),
        &[
            &format!("TOPIC:PREFIXED:CREATE:{name}."),
            &format!("TOPIC:PREFIXED:DESCRIBE:{name}."),
        ],
    )?;
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
    node.grant(
        &format!("User:{USER}"),
        &[
            &format!("TOPIC:PREFIXED:WRITE:{name}."),
            &format!("TOPIC:PREFIXED:DESCRIBE:{name}."),
            &format!("TOPIC:PREFIXED:CREATE:{name}."),
        ],
    )?;
    let pg = Postgres::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon_target = Via {
        bootstrap: node
            .sasl_bootstrap()
            .context("the node has no SASL listener")?,
        namespace: format!("{name}."),
    };
    let config = siphon_config_at(&pg, &siphon_target, name, &sasl_properties(PASSWORD), "");
    let siphon = start_streaming(&client, &config, name).await?;
    let events = [event(1, true)];
    insert_transaction(&mut client, &events, true).await?;
    let end = current_insert_lsn(&client).await?;
    // Read back as the tests' own (super) user.
    let target = Via {
        bootstrap: node.bootstrap(),
        namespace: format!("{name}."),
    };
    let expected = events.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&target, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_for_slot_past(&client, name, end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    Ok(())
}

/// Scenario 2: a wrong password (SASL authentication fails on every connection). librdkafka
/// tells a client's context, while the request fails as a transport failure; Siphon stops once
/// the state topic's read gives up (30 s).
async fn wrong_password(node: &KafkaNode) -> Result<()> {
    expect_definite_error(
        node,
        "badpassword",
        "not-the-password",
        Duration::from_secs(60),
        &["refused Siphon's credentials", "\"sasl.password\""],
    )
    .await?;
    Ok(())
}

/// Runs every scenario on one node, one after another, and reports each; fails if any did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_failures_stop_siphon_naming_the_fix() -> Result<()> {
    let node = KafkaNode::start_single_with_sasl(&[(USER, PASSWORD)])?;
    let mut failures = Vec::new();
    macro_rules! scenario {
        ($name:ident) => {{
            let started = Instant::now();
            match $name(&node).await {
                Ok(()) => eprintln!("PASS {} ({:?})", stringify!($name), started.elapsed()),
                Err(e) => {
                    eprintln!(
                        "FAIL {} ({:?}): {e:#}",
                        stringify!($name),
                        started.elapsed()
                    );
                    failures.push(stringify!($name));
                }
            }
        }};
    }
    scenario!(no_acls);
    scenario!(wrong_password);
    scenario!(no_acls_on_the_outbox_topics);
    scenario!(outbox_topics_not_writable);
    scenario!(the_documented_acls_suffice);
    ensure!(failures.is_empty(), "scenarios failed: {failures:?}");
    Ok(())
}
