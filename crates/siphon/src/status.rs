//! `siphon status`: the report of [`SlotStatus`] (read by [`siphon_source::status`]) as aligned
//! text or JSON.
//!
//! # Invariants
//! - Rendering only formats what was read: every problem comes from [`SlotStatus::healthy`], so
//!   text, JSON and the exit status agree.

use serde::Serialize;
pub use siphon_source::status::{
    retained_wal_bytes, slot_status, status_with, PublicationInfo, SlotInfo, SlotStatus,
    StatusError,
};
use std::fmt::Write as _;

fn yes_no(v: bool) -> &'static str {
    if v {
        "yes"
    } else {
        "no"
    }
}

fn or_none<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The two renderings of a [`SlotStatus`].
pub trait Render {
    /// Human-readable report: aligned `key: value` lines, then the verdict and its reasons.
    fn render_text(&self) -> String;
    /// The report as pretty-printed JSON (LSNs as `X/Y` strings), with `healthy` and `problems`
    /// added.
    fn render_json(&self) -> serde_json::Result<String>;
}

impl Render for SlotStatus {
    fn render_text(&self) -> String {
        let mut lines: Vec<(&str, String)> = vec![
            ("server version", self.server_version.clone()),
            ("database", self.database.clone()),
            ("current WAL LSN", self.current_wal_lsn.to_string()),
            ("slot", self.slot_name.clone()),
        ];
        match &self.slot {
            None => lines.push(("slot exists", "no".into())),
            Some(s) => lines.extend([
                ("slot exists", "yes".into()),
                ("plugin", or_none(s.plugin.as_deref())),
                ("slot type", s.slot_type.clone()),
                ("slot database", or_none(s.database.as_deref())),
                ("active", yes_no(s.active).into()),
                ("active pid", or_none(s.active_pid)),
                ("confirmed flush LSN", or_none(s.confirmed_flush_lsn)),
                ("restart LSN", or_none(s.restart_lsn)),
                ("WAL status", or_none(s.wal_status.as_deref())),
                ("retained WAL bytes", or_none(s.retained_wal_bytes)),
                ("lag bytes", or_none(s.lag_bytes)),
                (
                    "safe WAL size bytes",
                    s.safe_wal_size_bytes
                        .map_or_else(|| "unlimited".to_owned(), |v| v.to_string()),
                ),
            ]),
        }
        lines.push(("publication", self.publication_name.clone()));
        match &self.publication {
            None => lines.push(("publication exists", "no".into())),
            Some(p) => {
                lines.push(("publication exists", "yes".into()));
                let tables = if p.all_tables {
                    "all tables".to_owned()
                } else if p.tables.is_empty() {
                    "none".to_owned()
                } else {
                    p.tables.join(", ")
                };
                lines.push(("published tables", tables));
            }
        }
        let (healthy, reasons) = self.healthy();
        lines.push(("healthy", yes_no(healthy).into()));
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
        let mut out = String::new();
        for (key, value) in &lines {
            let _ = writeln!(out, "{:<width$} {value}", format!("{key}:"));
        }
        for reason in reasons {
            let _ = writeln!(out, "problem: {reason}");
        }
        out
    }

    fn render_json(&self) -> serde_json::Result<String> {
        #[derive(Serialize)]
        struct Report<'a> {
            #[serde(flatten)]
            status: &'a SlotStatus,
            healthy: bool,
            problems: Vec<String>,
        }
        let (healthy, problems) = self.healthy();
        serde_json::to_string_pretty(&Report {
            status: self,
            healthy,
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::Lsn;
    use siphon_source::{SourceConfig, TableName};
    use std::time::Duration;
    use tokio_postgres::Client;

    fn sample() -> SlotStatus {
        SlotStatus {
            server_version: "16.4".into(),
            database: "app".into(),
            current_wal_lsn: Lsn(0x1_0000_2000),
            slot_name: "siphon".into(),
            slot: Some(SlotInfo {
                plugin: Some("pgoutput".into()),
                slot_type: "logical".into(),
                database: Some("app".into()),
                active: true,
                active_pid: Some(4242),
                confirmed_flush_lsn: Some(Lsn(0x1_0000_1000)),
                restart_lsn: Some(Lsn(0x1_0000_0800)),
                wal_status: Some("reserved".into()),
                retained_wal_bytes: Some(0x1800),
                lag_bytes: Some(0x1000),
                safe_wal_size_bytes: None,
            }),
            publication_name: "siphon_outbox".into(),
            publication: Some(PublicationInfo {
                all_tables: false,
                tables: vec!["public.outbox".into()],
            }),
        }
    }

    #[test]
    fn healthy_lists_every_problem() {
        let mut s = sample();
        assert_eq!(s.healthy(), (true, vec![]));

        let slot = s.slot.as_mut().unwrap();
        slot.active = false;
        slot.active_pid = None;
        slot.wal_status = Some("unreserved".into());
        let (ok, reasons) = s.healthy();
        assert!(!ok);
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("wal_status = unreserved"));
        assert!(reasons[1].contains("is not active"));

        s.slot.as_mut().unwrap().wal_status = Some("lost".into());
        let (_, reasons) = s.healthy();
        assert_eq!(
            reasons.len(),
            1,
            "a lost slot is not also reported inactive"
        );
        assert!(reasons[0].contains("pg_drop_replication_slot('siphon')"));

        let slot = s.slot.as_mut().unwrap();
        slot.wal_status = Some("reserved".into());
        slot.active = true;
        slot.plugin = Some("wal2json".into());
        assert!(s.healthy().1[0].contains("plugin wal2json"));
        let slot = s.slot.as_mut().unwrap();
        slot.plugin = Some("pgoutput".into());
        slot.database = Some("other".into());
        assert!(s.healthy().1[0].contains("belongs to database other, not app"));

        s.slot = None;
        s.publication = None;
        let (ok, reasons) = s.healthy();
        assert!(!ok);
        assert!(reasons[0].contains("replication slot \"siphon\" does not exist"));
        assert!(reasons[1].contains("publication \"siphon_outbox\" does not exist"));
    }

    #[test]
    fn text_is_aligned_key_value_lines() {
        let text = sample().render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "server version:      16.4");
        assert!(lines.contains(&"confirmed flush LSN: 1/1000"));
        assert!(lines.contains(&"restart LSN:         1/800"));
        assert!(lines.contains(&"retained WAL bytes:  6144"));
        assert!(lines.contains(&"safe WAL size bytes: unlimited"));
        assert!(lines.contains(&"published tables:    public.outbox"));
        assert_eq!(*lines.last().unwrap(), "healthy:             yes");
        let column = lines[0].find("16.4").unwrap();
        for line in &lines {
            assert_eq!(
                line.find(": ").map(|_| line.len() >= column),
                Some(true),
                "{line}"
            );
        }

        let mut missing = sample();
        missing.slot = None;
        let text = missing.render_text();
        assert!(text.contains("slot exists:        no\n"), "{text}");
        assert!(text.contains("healthy:            no\nproblem: replication slot"));
    }

    #[test]
    fn json_has_lsns_as_text_and_the_verdict() {
        let json: serde_json::Value =
            serde_json::from_str(&sample().render_json().unwrap()).unwrap();
        assert_eq!(json["current_wal_lsn"], "1/2000");
        assert_eq!(json["slot"]["confirmed_flush_lsn"], "1/1000");
        assert_eq!(json["slot"]["active_pid"], 4242);
        assert_eq!(json["slot"]["safe_wal_size_bytes"], serde_json::Value::Null);
        assert_eq!(json["publication"]["tables"][0], "public.outbox");
        assert_eq!(json["healthy"], true);
        assert_eq!(json["problems"], serde_json::json!([]));
    }

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
        assert!(st.render_text().contains("plugin:              pgoutput\n"));

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
            buffer_events: 64,
            read_ahead_bytes: 1 << 20,
            application_name: "siphon-status-test".into(),
        };
        let stream = siphon_source::ReplicationStream::start(&config, created)
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
        let json: serde_json::Value = serde_json::from_str(&gone.render_json().unwrap()).unwrap();
        assert_eq!(json["slot"], serde_json::Value::Null);
        assert_eq!(json["healthy"], false);
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
}
