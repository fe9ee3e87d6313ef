#![allow(clippy::unwrap_used)]
//! `siphon_source::status` against a real PostgreSQL: every field of a fresh slot, an active
//! slot, then a dropped slot and a missing publication.

use pgoutput::Lsn;
use siphon_source::status::{retained_wal_bytes, slot_status, PublicationInfo, StatusError};
use siphon_source::{SourceConfig, TableName};
use std::time::Duration;
use tokio_postgres::Client;

async fn wait_active(client: &Client, slot: &str, active: bool) {
    for _ in 0..200 {
        let row = client
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .unwrap();
        if row.get::<_, bool>(0) == active {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("slot {slot} never became active = {active}");
}

/// Against a real PostgreSQL: every field of a fresh slot, an active slot, then a dropped
/// slot and a missing publication.
#[tokio::test]
async fn reads_a_real_slot_and_publication() {
    let pg = siphon_tests::Postgres::start().unwrap();
    let db = pg.connect().await.unwrap();
    db.batch_execute(
        "CREATE TABLE outbox (id bigint PRIMARY KEY, payload text);
         CREATE PUBLICATION status_pub FOR TABLE outbox;",
    )
    .await
    .unwrap();
    let created: String = db
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot('status_slot', 'pgoutput')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let created: Lsn = created.parse().unwrap();
    let version: String = db
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);

    let st = slot_status(&pg.url(), "status_slot", "status_pub")
        .await
        .unwrap();
    assert_eq!(st.server_version, version);
    assert_eq!(st.database, "siphon");
    assert_eq!(st.slot_name, "status_slot");
    assert!(st.current_wal_lsn >= created);
    let slot = st.slot.clone().expect("slot exists");
    assert_eq!(slot.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(slot.slot_type, "logical");
    assert_eq!(slot.database.as_deref(), Some("siphon"));
    assert!(!slot.active);
    assert_eq!(slot.active_pid, None);
    assert_eq!(slot.confirmed_flush_lsn, Some(created));
    let restart = slot.restart_lsn.expect("restart_lsn");
    assert!(restart <= created);
    assert_eq!(slot.wal_status.as_deref(), Some("reserved"));
    assert_eq!(
        slot.safe_wal_size_bytes, None,
        "max_slot_wal_keep_size = -1"
    );
    let lag = slot.lag_bytes.unwrap();
    assert_eq!(lag, st.current_wal_lsn.0 - created.0);
    assert_eq!(
        slot.retained_wal_bytes,
        Some(st.current_wal_lsn.0 - restart.0)
    );
    assert_eq!(
        st.publication,
        Some(PublicationInfo {
            all_tables: false,
            tables: vec!["public.outbox".into()],
        })
    );
    let (ok, reasons) = st.healthy();
    assert!(!ok);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("is not active"), "{reasons:?}");

    // Writes move the server's position; the unconsumed slot lags by at least that much.
    db.batch_execute(
        "INSERT INTO outbox SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g",
    )
    .await
    .unwrap();
    let st2 = slot_status(&pg.url(), "status_slot", "status_pub")
        .await
        .unwrap();
    let slot2 = st2.slot.clone().unwrap();
    assert!(slot2.lag_bytes.unwrap() > lag + 100_000, "{slot2:?}");
    let sampled = retained_wal_bytes(&db, "status_slot")
        .await
        .unwrap()
        .unwrap();
    assert!(sampled >= slot2.retained_wal_bytes.unwrap());

    // A streaming client makes the slot active and the status healthy.
    let config = SourceConfig {
        url: pg.url(),
        slot: "status_slot".into(),
        publication: "status_pub".into(),
        tables: vec![TableName::parse("outbox").unwrap()],
        status_interval: Duration::from_millis(100),
        idle_wakeup_interval: Duration::from_secs(1),
        read_ahead_bytes: 1 << 20,
        application_name: "siphon-status-test".into(),
        failover: false,
    };
    let slot = siphon_source::prepare(&config, siphon_source::MissingSlot::Refuse)
        .await
        .unwrap();
    assert_eq!(slot.confirmed_flush_lsn, created);
    assert!(!slot.created && !slot.enable_failover);
    let stream =
        siphon_source::ReplicationStream::start(&config, &slot, created, Default::default())
            .await
            .unwrap();
    wait_active(&db, "status_slot", true).await;
    let st3 = slot_status(&pg.url(), "status_slot", "status_pub")
        .await
        .unwrap();
    let slot3 = st3.slot.clone().unwrap();
    assert!(slot3.active);
    assert!(slot3.active_pid.is_some_and(|pid| pid > 0));
    assert_eq!(st3.healthy(), (true, vec![]));
    drop(stream);
    wait_active(&db, "status_slot", false).await;

    // Dropped slot, missing publication: both reported, with the fix.
    db.batch_execute("SELECT pg_drop_replication_slot('status_slot')")
        .await
        .unwrap();
    assert_eq!(retained_wal_bytes(&db, "status_slot").await.unwrap(), None);
    let gone = slot_status(&pg.url(), "status_slot", "no_such_pub")
        .await
        .unwrap();
    assert_eq!(gone.slot, None);
    assert_eq!(gone.publication, None);
    let (ok, reasons) = gone.healthy();
    assert!(!ok);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("\"status_slot\" does not exist"));
    assert!(reasons[1].contains("\"no_such_pub\" does not exist"));
}

#[tokio::test]
async fn connection_failure_is_an_error() {
    let port = siphon_tests::free_port();
    let err = slot_status(
        &format!("postgres://siphon:siphon@127.0.0.1:{port}/siphon"),
        "s",
        "p",
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StatusError::Connect(_)), "{err}");
}
