//! `siphon status`: the replication slot and publication as PostgreSQL sees them, over an
//! ordinary SQL connection, plus the sampling query behind `siphon_slot_retained_wal_bytes`.
//!
//! # Invariants
//! - Read-only: nothing here creates, alters, drops or advances anything, so it is safe to run
//!   against a slot another Siphon is streaming from.
//! - Positions are read as text and parsed into [`Lsn`]; byte counts are computed by the server
//!   (`pg_wal_lsn_diff`) against its current WAL position (the replay position on a standby)
//!   and floored at 0.
//! - [`SlotStatus::healthy`] gives one reason per problem, each naming the fix.

use pgoutput::Lsn;
use serde::{Serialize, Serializer};
use siphon_source::SourceError;
use std::fmt::Write as _;
use tokio_postgres::Client;

/// The server's current WAL position: the insert position on a primary, the replay position on a
/// standby (where `pg_current_wal_lsn()` is an error).
const CURRENT_LSN: &str =
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END";

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The connection could not be opened; the message says why.
    #[error("{0}")]
    Connect(#[from] SourceError),
    /// A query failed.
    #[error("{0}")]
    Query(String),
    /// The server returned a position that is not `X/Y`.
    #[error("PostgreSQL returned an unreadable WAL position: {0}")]
    Lsn(#[from] pgoutput::ParseLsnError),
}

impl StatusError {
    fn query(what: &str, err: tokio_postgres::Error) -> Self {
        match err.as_db_error() {
            Some(db) => StatusError::Query(format!(
                "{what}: {} (SQLSTATE {})",
                db.message(),
                db.code().code()
            )),
            None => StatusError::Query(format!("{what}: {err}")),
        }
    }
}

/// The replication slot, as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotInfo {
    /// Output plugin (`pgoutput` for Siphon's slot; none for a physical slot).
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    /// The database a logical slot belongs to.
    pub database: Option<String>,
    /// Whether a client is streaming from the slot.
    pub active: bool,
    /// The server process of that client.
    pub active_pid: Option<i32>,
    /// Everything before this position is delivered (what Siphon resumes from).
    #[serde(serialize_with = "lsn_text")]
    pub confirmed_flush_lsn: Option<Lsn>,
    /// The oldest WAL the slot still needs; the server keeps WAL from here on.
    #[serde(serialize_with = "lsn_text")]
    pub restart_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` (WAL about to be removed) or `lost` (invalidated).
    pub wal_status: Option<String>,
    /// WAL the server keeps for this slot: current position minus `restart_lsn`.
    pub retained_wal_bytes: Option<u64>,
    /// WAL not yet confirmed as delivered: current position minus `confirmed_flush_lsn`.
    pub lag_bytes: Option<u64>,
    /// WAL that can still be written before the slot is in danger of losing WAL (none when
    /// `max_slot_wal_keep_size` is unlimited).
    pub safe_wal_size_bytes: Option<i64>,
}

/// The publication, as `pg_publication` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicationInfo {
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// The published tables, `schema.table`, sorted.
    pub tables: Vec<String>,
}

/// Everything `siphon status` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotStatus {
    /// `server_version` of the PostgreSQL server.
    pub server_version: String,
    /// The database the URL connects to.
    pub database: String,
    /// The server's current WAL position (replay position on a standby).
    #[serde(serialize_with = "lsn_text_one")]
    pub current_wal_lsn: Lsn,
    /// The slot's name.
    pub slot_name: String,
    /// The slot, if it exists.
    pub slot: Option<SlotInfo>,
    /// The publication's name.
    pub publication_name: String,
    /// The publication, if it exists.
    pub publication: Option<PublicationInfo>,
}

fn lsn_text<S: Serializer>(lsn: &Option<Lsn>, s: S) -> Result<S::Ok, S::Error> {
    match lsn {
        Some(lsn) => s.collect_str(lsn),
        None => s.serialize_none(),
    }
}

fn lsn_text_one<S: Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(lsn)
}

fn parse_lsn(text: Option<String>) -> Result<Option<Lsn>, StatusError> {
    Ok(text.map(|t| t.parse()).transpose()?)
}

fn bytes(v: Option<i64>) -> Option<u64> {
    v.map(|b| u64::try_from(b).unwrap_or(0))
}

/// Reads the slot `slot` and the publication `publication` on the server at `url`.
pub async fn slot_status(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<SlotStatus, StatusError> {
    let client = siphon_source::setup::connect(url).await?;
    status_with(&client, slot, publication).await
}

/// [`slot_status`] over an open connection.
pub async fn status_with(
    client: &Client,
    slot: &str,
    publication: &str,
) -> Result<SlotStatus, StatusError> {
    let server = client
        .query_one(
            &format!(
                "SELECT current_setting('server_version'), current_database(), ({CURRENT_LSN})::text"
            ),
            &[],
        )
        .await
        .map_err(|e| StatusError::query("reading the server version and WAL position", e))?;
    let current: Option<String> = server.get(2);
    let slot_row = client
        .query_opt(
            &format!(
                "WITH cur AS (SELECT {CURRENT_LSN} AS lsn) \
                 SELECT plugin, slot_type, database, active, active_pid, \
                        confirmed_flush_lsn::text, restart_lsn::text, wal_status, \
                        pg_wal_lsn_diff(cur.lsn, restart_lsn)::int8, \
                        pg_wal_lsn_diff(cur.lsn, confirmed_flush_lsn)::int8, \
                        safe_wal_size \
                   FROM pg_replication_slots, cur WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await
        .map_err(|e| StatusError::query("reading pg_replication_slots", e))?;
    let slot_info = match slot_row {
        None => None,
        Some(row) => Some(SlotInfo {
            plugin: row.get(0),
            slot_type: row.get(1),
            database: row.get(2),
            active: row.get(3),
            active_pid: row.get(4),
            confirmed_flush_lsn: parse_lsn(row.get(5))?,
            restart_lsn: parse_lsn(row.get(6))?,
            wal_status: row.get(7),
            retained_wal_bytes: bytes(row.get(8)),
            lag_bytes: bytes(row.get(9)),
            safe_wal_size_bytes: row.get(10),
        }),
    };
    let publication_row = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| StatusError::query("reading pg_publication", e))?;
    let publication_info = match publication_row {
        None => None,
        Some(row) => {
            let tables = client
                .query(
                    "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
                      WHERE pubname = $1 ORDER BY 1, 2",
                    &[&publication],
                )
                .await
                .map_err(|e| StatusError::query("reading pg_publication_tables", e))?
                .iter()
                .map(|r| format!("{}.{}", r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect();
            Some(PublicationInfo {
                all_tables: row.get(0),
                tables,
            })
        }
    };
    Ok(SlotStatus {
        server_version: server.get(0),
        database: server.get(1),
        current_wal_lsn: parse_lsn(current)?.unwrap_or(Lsn::ZERO),
        slot_name: slot.to_owned(),
        slot: slot_info,
        publication_name: publication.to_owned(),
        publication: publication_info,
    })
}

/// WAL retained on the server by `slot` (current position minus `restart_lsn`), for the
/// `siphon_slot_retained_wal_bytes` gauge; `None` if the slot does not exist or retains nothing
/// yet (no `restart_lsn`).
pub async fn retained_wal_bytes(client: &Client, slot: &str) -> Result<Option<u64>, StatusError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT pg_wal_lsn_diff({CURRENT_LSN}, restart_lsn)::int8 \
                   FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await
        .map_err(|e| StatusError::query("reading the slot's retained WAL", e))?;
    Ok(row.and_then(|r| bytes(r.get(0))))
}

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

impl SlotStatus {
    /// Whether Siphon's slot and publication are in working order, with one reason (naming the
    /// fix) per problem.
    pub fn healthy(&self) -> (bool, Vec<String>) {
        let mut reasons = Vec::new();
        let slot = &self.slot_name;
        match &self.slot {
            None => reasons.push(format!(
                "replication slot \"{slot}\" does not exist: `siphon run` creates it (events written before that are not captured)"
            )),
            Some(s) => {
                if s.slot_type != "logical" || s.plugin.as_deref() != Some("pgoutput") {
                    reasons.push(format!(
                        "replication slot \"{slot}\" is a {} slot with plugin {}, not a logical pgoutput slot: choose another source.slot",
                        s.slot_type,
                        s.plugin.as_deref().unwrap_or("none")
                    ));
                } else if s.database.as_deref() != Some(self.database.as_str()) {
                    reasons.push(format!(
                        "replication slot \"{slot}\" belongs to database {}, not {}: fix source.url or source.slot",
                        s.database.as_deref().unwrap_or("?"),
                        self.database
                    ));
                }
                match s.wal_status.as_deref() {
                    Some("lost") => reasons.push(format!(
                        "replication slot \"{slot}\" was invalidated (wal_status = lost): drop it with SELECT pg_drop_replication_slot('{slot}') and restart Siphon; events in the removed WAL are lost"
                    )),
                    Some("unreserved") => reasons.push(format!(
                        "replication slot \"{slot}\" is about to lose WAL (wal_status = unreserved, past max_slot_wal_keep_size): get Siphon streaming and caught up now"
                    )),
                    _ => {}
                }
                if !s.active && s.wal_status.as_deref() != Some("lost") {
                    reasons.push(format!(
                        "replication slot \"{slot}\" is not active: no client is streaming from it (is Siphon running?)"
                    ));
                }
            }
        }
        if self.publication.is_none() {
            reasons.push(format!(
                "publication \"{}\" does not exist: `siphon run` creates it, or run CREATE PUBLICATION ... FOR TABLE <outbox tables>",
                self.publication_name
            ));
        }
        (reasons.is_empty(), reasons)
    }

    /// Human-readable report: aligned `key: value` lines, then the verdict and its reasons.
    pub fn render_text(&self) -> String {
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

    /// The report as pretty-printed JSON (LSNs as `X/Y` strings), with `healthy` and `problems`
    /// added.
    pub fn render_json(&self) -> serde_json::Result<String> {
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
    use siphon_source::{SourceConfig, TableName};
    use std::time::Duration;

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
