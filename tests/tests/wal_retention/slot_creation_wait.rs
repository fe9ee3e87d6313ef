//! A first start behind an open transaction: creating the slot waits, as PostgreSQL must, for
//! every transaction with an xid that runs when creation begins. Siphon says so every few
//! seconds, naming the backends it waits for (pid, xid age, query start, application name),
//! `/ready` and `siphon status` say why it is not streaming, and once the transaction ends
//! Siphon streams.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::{free_port, wait_for, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use siphon_tests::http::get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_behind_an_open_transaction_names_it_and_streams_once_it_ends() -> Result<()>
{
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client.batch_execute("CREATE TABLE ledger (id int)").await?;
    // An application's transaction that holds an xid and stays open.
    let app = pg.connect().await?;
    app.batch_execute(
        "SET application_name = 'stuck-billing'; BEGIN; INSERT INTO ledger VALUES (1)",
    )
    .await?;
    let pid: i32 = app.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let bin = siphon_tests::siphon_bin()?;
    let config = siphon_config(&pg, &broker, "s", "");
    let siphon =
        SiphonProcess::start_with(&bin, &config, &[("SIPHON_METRICS_LISTEN", listen.as_str())])?;
    let started = Instant::now();
    let named = format!("pid {pid}");
    siphon
        .wait_for_log(&named, Duration::from_secs(10))
        .await
        .context("the blocking backend named within 10 s")?;
    eprintln!("blocking backend named after {:?}", started.elapsed());
    let log = siphon.log();
    let line = log
        .lines()
        .find(|l| l.contains(&named))
        .context("the line")?
        .to_owned();
    for needle in [
        "stuck-billing",
        "xid age",
        "query started",
        "pg_terminate_backend",
    ] {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }

    // Readiness says why.
    let (status, body) = get(port, "/ready")?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("creating replication slot") && body.contains(&named),
        "{body}"
    );
    // So does `siphon status`.
    let mut status = std::process::Command::new(&bin);
    // The harness's own SIPHON_* variables (the shared broker's address) are no settings.
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("SIPHON_")) {
        status.env_remove(name);
    }
    let out = status
        .args(["status", "--config"])
        .arg(siphon.config_path())
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        report.contains("being created") && report.contains(&named),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every few seconds, not once.
    wait_for(
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok((siphon.log().matches(&named).count() >= 2).then_some(())) },
    )
    .await
    .with_context(|| siphon.log())?;

    // The transaction ends: the slot is created and Siphon streams.
    app.batch_execute("COMMIT").await?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(30))
        .await?;
    let e = event(1, true);
    insert_transaction(&mut client, std::slice::from_ref(&e), true).await?;
    let expected: BTreeSet<String> = [e.id].into();
    wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok((get(port, "/ready")?.0 == 200).then_some(())) },
    )
    .await?;
    Ok(())
}
