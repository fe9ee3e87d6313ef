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
            ("host", self.host.clone()),
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
                ("failover slot", or_none(s.failover.map(yes_no))),
                ("synced", or_none(s.synced.map(yes_no))),
            ]),
        }
        if let Some(setting) = &self.synchronized_standby_slots {
            let shown = if setting.is_empty() {
                "(empty)"
            } else {
                setting
            };
            lines.push(("standby slots", shown.to_owned()));
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

    fn sample() -> SlotStatus {
        SlotStatus {
            server_version: "16.4".into(),
            database: "app".into(),
            host: "db1:5432".into(),
            synchronized_standby_slots: None,
            standby_slots_problem: None,
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
                failover: None,
                synced: None,
            }),
            being_created: None,
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

        let slot = s.slot.as_mut().unwrap();
        slot.database = Some("app".into());
        slot.failover = Some(true);
        s.synchronized_standby_slots = Some(String::new());
        s.standby_slots_problem = Some("synchronized_standby_slots is empty".into());
        assert_eq!(
            s.healthy().1,
            vec!["replication slot \"siphon\" is a failover slot but synchronized_standby_slots is empty".to_owned()]
        );
        assert!(s.render_text().contains("standby slots:       (empty)\n"));
        s.slot.as_mut().unwrap().failover = Some(false);
        assert!(s.healthy().0, "only a failover slot needs the setting");

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
}
