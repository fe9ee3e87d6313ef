//! A PostgreSQL connection that swallows packets while TCP stays up (a black hole: a dead
//! NAT entry, a hung load balancer) must not freeze Siphon: SQL queries run beside the session
//! loop with a bound, so delivery reports keep being handled and SIGTERM stops it in time.

use anyhow::{Context, Result};
use siphon_tests::outbox::{event, insert_transaction, siphon_config, slot_active, OUTBOX_DDL};
use siphon_tests::proxy::ThrottlingProxy;
use siphon_tests::{read_topic_async, wait_for, wait_until, Broker, Postgres, SiphonProcess};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_database_connection_does_not_freeze_shutdown() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let proxy = ThrottlingProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, pg.port())))?;
    // Every connection of Siphon's goes through the proxy; no stall reconnect during the test.
    let config = siphon_config(&pg, &broker, "hole", "")
        .replace("shutdown_timeout_secs = 20", "shutdown_timeout_secs = 5")
        .replace(
            &format!("127.0.0.1:{}/", pg.port()),
            &format!("127.0.0.1:{}/", proxy.port()),
        )
        .replace("[source]\n", "[source]\nstall_timeout_secs = 3600\n");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "hole").await },
    )
    .await?;
    let events: Vec<_> = (1..=5).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &events, true).await?;
    let bootstrap = broker.bootstrap();
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let mut delivered = 0;
            for topic in ["outbox.event.Order", "outbox.event.Customer"] {
                delivered +=
                    read_topic_async(&bootstrap, &broker.topic(topic), Duration::from_secs(10))
                        .await
                        .unwrap_or_default()
                        .len();
            }
            Ok((delivered >= 5).then_some(()))
        },
    )
    .await
    .with_context(|| format!("delivered before the black hole\n{}", siphon.log()))?;

    // Black hole: bytes stay in the kernel's buffers, nothing is answered. Let two status ticks
    // (every 5 s) send their queries into it.
    proxy.pause();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(siphon.is_running(), "{}", siphon.log());
    let asked = Instant::now();
    siphon.terminate()?;
    // The shutdown timeout (5 s) bounds the wait for in-flight records and for the final
    // status update; a margin for the process to end.
    let status = siphon
        .wait_exit(Duration::from_secs(25))
        .with_context(|| format!("Siphon did not stop on SIGTERM\n{}", siphon.log()))?;
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "stopped after {:?}",
        asked.elapsed()
    );
    assert!(status.success(), "exit status {status:?}\n{}", siphon.log());
    proxy.resume();
    Ok(())
}
