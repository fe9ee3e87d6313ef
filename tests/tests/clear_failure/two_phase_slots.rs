//! A slot with two-phase decoding (`two_phase`, made by another tool or turned on by one): it
//! sends a prepared transaction's rows at `PREPARE TRANSACTION`, before anyone knows whether it
//! commits. Siphon refuses such a slot at start, naming the slot, why and the fix for the
//! server's version, with exit status 2 and no reconnect loop. After the fix every event
//! arrives once, prepared ones at `COMMIT PREPARED` (also across a restart between `PREPARE` and
//! `COMMIT PREPARED`), and none of a transaction rolled back with `ROLLBACK PREPARED`.

use anyhow::{bail, Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::{Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

const EXIT_DEFINITE: i32 = 2;

/// `BEGIN`, event `seq`'s outbox row, `PREPARE TRANSACTION gid`.
async fn prepare_event(client: &Client, seq: u64, gid: &str) -> Result<()> {
    let e = event(seq, true);
    client.batch_execute("BEGIN").await?;
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, $3, 'Event', $4::text::jsonb)",
            &[&e.id, &e.aggregatetype, &e.aggregateid, &e.payload],
        )
        .await?;
    client
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await?;
    Ok(())
}

/// `psql` of the server the harness runs (`$SIPHON_PG_BIN`, else the newest installed).
fn psql() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SIPHON_PG_BIN").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("psql"));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin/psql")))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop().context("no psql under /usr/lib/postgresql")
}

/// Runs a replication command over a replication connection.
fn replication_command(pg: &Postgres, command: &str) -> Result<()> {
    let output = std::process::Command::new(psql()?)
        .arg(format!("{}?replication=database", pg.url()))
        .args(["-v", "ON_ERROR_STOP=1", "-c", command])
        .output()?;
    if !output.status.success() {
        bail!(
            "{command}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

async fn slot_two_phase(client: &Client, slot: &str) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT two_phase FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_phase_slot_is_refused_at_start_and_after_the_fix_prepared_events_arrive_once(
) -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let major = pg.major_version().await?;
    if major < 15 {
        return siphon_tests::prerequisite_missing(
            "a_two_phase_slot_is_refused_at_start_and_after_the_fix_prepared_events_arrive_once",
            &format!(
                "pgoutput decodes prepared transactions from PostgreSQL 15 (this is {major}; set SIPHON_PG_BIN)"
            ),
        );
    }
    {
        let client = pg.connect().await?;
        client
            .batch_execute("ALTER SYSTEM SET max_prepared_transactions = 10")
            .await?;
    }
    pg.restart()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    // The publication exists before the events, as it would for a slot another tool made.
    client
        .batch_execute(
            "CREATE PUBLICATION s_pub FOR TABLE outbox WITH (publish_via_partition_root = true)",
        )
        .await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")
        .await?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    prepare_event(&client, 2, "p2").await?;

    let config = siphon_config(&pg, &broker, "s", "");
    let siphon = SiphonProcess::start(&config)?;
    let started = Instant::now();
    let status = siphon.wait_exit(Duration::from_secs(30))?;
    let took = started.elapsed();
    let log = siphon.log();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    eprintln!("exit status 2 after {took:?}");
    for needle in [
        r#"replication slot "s""#,
        "two_phase",
        "PREPARE TRANSACTION",
        r#"pg_copy_logical_replication_slot('s', "#,
        "pg_drop_replication_slot('s')",
    ] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    let alter = r#"ALTER_REPLICATION_SLOT "s" (TWO_PHASE false)"#;
    assert_eq!(log.contains(alter), major >= 18, "{log}");
    assert!(!log.contains("reconnecting"), "a reconnect loop:\n{log}");
    assert!(
        slot_two_phase(&client, "s").await?,
        "the slot is left as it was"
    );

    // The fix the message names, which keeps the slot's position: on 18 turn two-phase
    // decoding off; before 18 copy the slot (a copy never decodes two-phase transactions), use
    // the copy and drop the original.
    let slot = if major >= 18 {
        replication_command(&pg, alter)?;
        "s"
    } else {
        client
            .batch_execute("SELECT pg_copy_logical_replication_slot('s', 's_committed')")
            .await?;
        std::fs::write(
            siphon.config_path(),
            config.replace("slot = \"s\"", "slot = \"s_committed\""),
        )?;
        client
            .batch_execute("SELECT pg_drop_replication_slot('s')")
            .await?;
        "s_committed"
    };
    assert!(!slot_two_phase(&client, slot).await?);

    siphon.start_again()?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client.batch_execute("COMMIT PREPARED 'p2'").await?;
    // A restart between PREPARE and COMMIT PREPARED sends nothing twice.
    prepare_event(&client, 3, "p3").await?;
    insert_transaction(&mut client, &[event(4, true)], true).await?;
    let mut before_restart = [1, 2, 4].map(|s| event(s, true).id).to_vec();
    before_restart.sort();
    wait_for_each_once(
        &broker,
        &before_restart.into_iter().collect(),
        Duration::from_secs(60),
    )
    .await
    .with_context(|| siphon.log())?;
    siphon.terminate()?;
    assert_eq!(siphon.wait_exit(Duration::from_secs(60))?.code(), Some(0));
    siphon.start_again()?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client.batch_execute("COMMIT PREPARED 'p3'").await?;
    // Rolled back after PREPARE: never sent.
    prepare_event(&client, 5, "p5").await?;
    client.batch_execute("ROLLBACK PREPARED 'p5'").await?;
    insert_transaction(&mut client, &[event(6, true)], true).await?;

    let expected: BTreeSet<String> = [1, 2, 3, 4, 6].map(|s| event(s, true).id).into();
    wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let log = siphon.log();
    assert!(!log.contains("reconnecting"), "{log}");
    Ok(())
}
