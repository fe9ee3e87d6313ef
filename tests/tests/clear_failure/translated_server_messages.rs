//! PostgreSQL speaking German (`lc_messages = 'de_DE.UTF-8'`): Siphon sorts the server's errors
//! by their SQLSTATE and the command that failed, so each has the consequence it has in English
//! (a slot in use waits as a standby; a missing publication and a login without `REPLICATION`
//! stop with the fix) and the fix is named in Siphon's words, the server's own text shown as it is.
//!
//! Needs the OS locale `de_DE.UTF-8` (scripts/install-deps.sh generates it) and a server built
//! with message translations (Debian's is; the PostgreSQL 18 of scripts/install-postgres.sh is
//! not, so the test command skips these tests in that pass).

use anyhow::{Context, Result};
use siphon_tests::outbox::defaults_config;
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::time::Duration;

const EXIT_DEFINITE: i32 = 2;

const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)";

/// Siphon's configuration: slot `s`, publication `p`, connecting with `url`.
fn config(url: &str, broker: &Broker) -> String {
    defaults_config(url, broker, r#""public.outbox""#)
}

/// Switches the server's messages to German for every new session; `Ok(false)` (after reporting
/// the missing prerequisite, which fails the test under CI) when the server cannot.
async fn speak_german(pg: &Postgres, test: &str) -> Result<bool> {
    let client = pg.connect().await?;
    // ALTER SYSTEM cannot run in the implicit transaction of a multi-statement batch.
    if let Err(e) = client
        .batch_execute("ALTER SYSTEM SET lc_messages = 'de_DE.UTF-8'")
        .await
    {
        let said = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |db| db.message().to_owned());
        siphon_tests::prerequisite_missing(
            test,
            &format!("the server refuses lc_messages = 'de_DE.UTF-8' ({said}): generate the locale (scripts/install-deps.sh)"),
        )?;
        return Ok(false);
    }
    client.batch_execute("SELECT pg_reload_conf()").await?;
    // A new session reads the reloaded setting.
    let fresh = pg.connect().await?;
    let said = match fresh.batch_execute("SELECT 1/0").await {
        Err(e) => e
            .as_db_error()
            .map(|db| db.message().to_owned())
            .unwrap_or_default(),
        Ok(()) => String::new(),
    };
    if said != "Division durch Null" {
        siphon_tests::prerequisite_missing(
            test,
            &format!("the server does not translate its messages (it said {said:?}): it needs a build with NLS and its German catalog"),
        )?;
        return Ok(false);
    }
    Ok(true)
}

/// Another process streams from the slot: PostgreSQL refuses `START_REPLICATION` with 55006
/// ("Replikations-Slot »s« ist aktiv für PID ..."); Siphon waits as a standby, as in English.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translated_slot_in_use_waits_as_a_standby() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    if !speak_german(&pg, "translated_slot_in_use_waits_as_a_standby").await? {
        return Ok(());
    }
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let active = SiphonProcess::start(&config(&pg.url(), &broker))?;
    active
        .wait_for_log("streaming", Duration::from_secs(60))
        .await
        .with_context(|| active.log())?;
    let standby = SiphonProcess::start(&config(&pg.url(), &broker))?;
    standby
        .wait_for_log("waiting to take over", Duration::from_secs(60))
        .await
        .with_context(|| standby.log())?;
    // Still retrying a while later: a transient error, not a stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = standby.log();
    anyhow::ensure!(standby.is_running(), "the standby stopped:\n{log}");
    // The server's own words are shown as they are.
    anyhow::ensure!(log.contains("aktiv"), "{log}");
    anyhow::ensure!(log.contains("SQLSTATE 55006"), "{log}");
    // And it takes over when the active instance goes.
    let before = standby.log().matches("streaming").count();
    active.kill9()?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(standby.log().matches("streaming").count() > before) },
    )
    .await
    .with_context(|| standby.log())?;
    Ok(())
}

/// The slot holds a change written before the publication existed: PostgreSQL before 18 stops
/// decoding with 42704 ("Publikation »p« existiert nicht"); Siphon stops with the fix instead of
/// reconnecting to the same error forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translated_missing_publication_stops_with_the_fix() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    if !speak_german(&pg, "translated_missing_publication_stops_with_the_fix").await? {
        return Ok(());
    }
    let major = pg.major_version().await?;
    if major >= 18 {
        // From 18 the server skips such changes with a warning (tested in setup_errors.rs).
        return siphon_tests::prerequisite_missing(
            "translated_missing_publication_stops_with_the_fix",
            &format!("PostgreSQL {major} skips changes of a missing publication instead of failing (set SIPHON_PG_BIN to a server before 18)"),
        );
    }
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute(
            "SELECT pg_create_logical_replication_slot('s', 'pgoutput'); \
             INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'o-1', 'T', '{}')",
        )
        .await?;
    // Siphon creates the publication, then the stream meets the change written before it.
    let siphon = SiphonProcess::start(&config(&pg.url(), &broker))?;
    let status = siphon.wait_exit(Duration::from_secs(60));
    let log = siphon.log();
    assert_eq!(
        status.with_context(|| log.clone())?.code(),
        Some(EXIT_DEFINITE),
        "{log}"
    );
    assert!(
        log.contains(
            "the publication did not exist when changes the slot still has to decode were written"
        ),
        "{log}"
    );
    assert!(
        log.contains("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())"),
        "{log}"
    );
    assert!(log.contains("existiert nicht"), "{log}");
    assert!(log.contains("SQLSTATE 42704"), "{log}");
    Ok(())
}

/// A login without the `REPLICATION` attribute (the slot and publication exist, so only the
/// replication connection needs it): PostgreSQL refuses it with 42501 ("nur Superuser und
/// Replikationsrollen können WAL-Sender starten"); Siphon stops naming `ALTER ROLE ... REPLICATION`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translated_missing_replication_attribute_stops_with_the_fix() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    if !speak_german(
        &pg,
        "translated_missing_replication_attribute_stops_with_the_fix",
    )
    .await?
    {
        return Ok(());
    }
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    client
        .batch_execute(
            "CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert, update', publish_via_partition_root = true); \
             SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE siphon_cdc LOGIN NOREPLICATION PASSWORD 'cdc-secret'",
        )
        .await?;
    // A slot is created outside a transaction that wrote.
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await?;
    let url = pg.url().replace("siphon:siphon@", "siphon_cdc:cdc-secret@");
    let siphon = SiphonProcess::start(&config(&url, &broker))?;
    let status = siphon.wait_exit(Duration::from_secs(60));
    let log = siphon.log();
    assert_eq!(
        status.with_context(|| log.clone())?.code(),
        Some(EXIT_DEFINITE),
        "{log}"
    );
    assert!(log.contains("no REPLICATION attribute"), "{log}");
    assert!(
        log.contains(r#"ALTER ROLE "siphon_cdc" REPLICATION"#),
        "{log}"
    );
    assert!(log.contains("SQLSTATE 42501"), "{log}");
    assert!(
        !log.contains("cdc-secret"),
        "the password was logged:\n{log}"
    );
    Ok(())
}
