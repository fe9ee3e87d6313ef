//! A slot being created waits for running transactions: which ones, said while it waits.
//!
//! A new logical slot needs a starting point from which every transaction can be decoded whole,
//! so PostgreSQL waits until each transaction that holds an xid when creation begins (and each
//! one running at the next snapshot it logs) has ended, prepared transactions included. A
//! session left idle in a transaction holds creation for as long as it stays open, and the
//! creating query says nothing meanwhile. While it waits, Siphon reads on a second connection
//! which backends hold it up (`pg_stat_activity`, `pg_prepared_xacts`, and `pg_locks` for the
//! xid the creation waits on at that moment), logs them every few seconds, and hands the same
//! text to [`SetupWait`], which readiness reports.
//!
//! # Invariants
//! - The creation itself is never cancelled or hurried here: the report only reads the catalog.
//! - The first report comes [`FIRST_REPORT`] after the creation began, then one every
//!   [`REPORT_INTERVAL`], each bounded by [`REPORT_TIMEOUT`]; a report that fails is logged at
//!   debug level and never fails the creation.
//! - [`SetupWait`] holds a reason only while a creation waits: it is cleared when the creation
//!   ends, whatever its outcome.

use crate::{Endpoint, SourceError};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_postgres::Client;
use tracing::{debug, warn};

/// How long a creation may take before Siphon says what it waits for.
pub const FIRST_REPORT: Duration = Duration::from_secs(2);
/// How often it says so again while the creation waits.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// The longest one report may take (connecting included).
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most blocking transactions named in one report (the rest are counted).
const MOST_NAMED: usize = 5;

/// Why setting up is held up, shared with whoever reports readiness (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct SetupWait(Arc<Mutex<Option<String>>>);

impl SetupWait {
    /// What the setup waits for now, if it waits.
    pub fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, why: Option<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = why;
    }
}

/// One transaction a slot creation waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocker {
    /// The backend running it (`None` for a prepared transaction, which no backend runs).
    pub pid: Option<i32>,
    /// A prepared transaction's identifier.
    pub gid: Option<String>,
    /// `age()` of its xid: how many transactions started since.
    pub xid_age: i64,
    /// The backend's `application_name`.
    pub application_name: Option<String>,
    /// The backend's `state` (`idle in transaction` ...).
    pub state: Option<String>,
    /// When its last query started (when it was prepared, for a prepared transaction).
    pub query_start: Option<String>,
    /// How long its transaction has been open, in seconds.
    pub open_secs: Option<f64>,
    /// Whether the creation waits on this transaction's xid right now.
    pub waited_on: bool,
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.gid, self.pid) {
            (Some(gid), _) => write!(f, "prepared transaction '{gid}' (xid age {}", self.xid_age)?,
            (None, Some(pid)) => {
                write!(f, "pid {pid} (")?;
                if let Some(app) = self.application_name.as_deref().filter(|a| !a.is_empty()) {
                    write!(f, "application \"{app}\", ")?;
                }
                if let Some(state) = &self.state {
                    write!(f, "{state}, ")?;
                }
                write!(f, "xid age {}", self.xid_age)?;
            }
            (None, None) => write!(f, "a transaction (xid age {}", self.xid_age)?,
        }
        if let Some(secs) = self.open_secs {
            write!(f, ", open for {secs:.0} s")?;
        }
        if let Some(start) = &self.query_start {
            let what = if self.gid.is_some() {
                "prepared"
            } else {
                "query started"
            };
            write!(f, ", {what} {start}")?;
        }
        if self.waited_on {
            f.write_str(", waited on now")?;
        }
        f.write_str(")")
    }
}

/// The transactions the creation running on backend `creator` waits for, the one it waits on
/// now first, then the oldest.
pub async fn blockers(client: &Client, creator: i32) -> Result<Vec<Blocker>, SourceError> {
    let rows = client
        .query(
            "WITH waited AS ( \
                 SELECT transactionid AS xid FROM pg_locks \
                  WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted), \
             holders AS ( \
                 SELECT DISTINCT h.pid, w.xid FROM pg_locks h JOIN waited w ON h.transactionid = w.xid \
                  WHERE h.locktype = 'transactionid' AND h.granted AND h.pid IS NOT NULL) \
             SELECT a.pid, NULL::text, age(coalesce(a.backend_xid, hd.xid))::int8, \
                    a.application_name::text, a.state::text, \
                    to_char(a.query_start, 'YYYY-MM-DD HH24:MI:SS TZ'), \
                    extract(epoch FROM now() - a.xact_start)::float8, hd.pid IS NOT NULL \
               FROM pg_stat_activity a LEFT JOIN holders hd ON hd.pid = a.pid \
              WHERE a.pid <> $1 AND (a.backend_xid IS NOT NULL OR hd.pid IS NOT NULL) \
             UNION ALL \
             SELECT NULL, p.gid::text, age(p.transaction)::int8, NULL, NULL, \
                    to_char(p.prepared, 'YYYY-MM-DD HH24:MI:SS TZ'), \
                    extract(epoch FROM now() - p.prepared)::float8, \
                    EXISTS (SELECT 1 FROM waited w WHERE w.xid = p.transaction) \
               FROM pg_prepared_xacts p \
             ORDER BY 8 DESC, 3 DESC",
            &[&creator],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::SlotCreationBlockers, e))?;
    Ok(rows
        .iter()
        .map(|r| Blocker {
            pid: r.get(0),
            gid: r.get(1),
            xid_age: r.get::<_, Option<i64>>(2).unwrap_or_default(),
            application_name: r.get(3),
            state: r.get(4),
            query_start: r.get(5),
            open_secs: r.get(6),
            waited_on: r.get(7),
        })
        .collect())
}

/// The report for slot `slot`, whose creation has waited `waited` (when known) for `blockers`.
pub fn summary(slot: &str, waited: Option<Duration>, blockers: &[Blocker]) -> String {
    let waiting = match waited {
        Some(waited) => format!(
            "creating replication slot \"{slot}\" has waited {} s for running transactions to end",
            waited.as_secs()
        ),
        None => format!(
            "replication slot \"{slot}\" is being created and waits for running transactions to end"
        ),
    };
    let head = format!(
        "{waiting} (PostgreSQL starts a new slot only once every transaction that held an xid when creation began has ended)"
    );
    if blockers.is_empty() {
        return format!(
            "{head}; none is visible to this user now (pg_stat_activity shows other users' sessions to members of pg_read_all_stats)"
        );
    }
    let mut named: Vec<String> = blockers
        .iter()
        .take(MOST_NAMED)
        .map(ToString::to_string)
        .collect();
    if blockers.len() > MOST_NAMED {
        named.push(format!("and {} more", blockers.len() - MOST_NAMED));
    }
    let noun = if blockers.len() == 1 {
        "transaction"
    } else {
        "transactions"
    };
    let pids: Vec<i32> = blockers.iter().filter_map(|b| b.pid).collect();
    let terminate = match pids.as_slice() {
        [pid] => format!("SELECT pg_terminate_backend({pid})"),
        _ => "SELECT pg_terminate_backend(<pid>)".to_owned(),
    };
    let mut fixes = vec![format!(
        "end them (COMMIT or ROLLBACK in their application), or end their sessions with {terminate}, which rolls their transactions back"
    )];
    if blockers.iter().any(|b| b.gid.is_some()) {
        fixes.push("finish a prepared transaction with COMMIT PREPARED '<gid>' or ROLLBACK PREPARED '<gid>'".to_owned());
    }
    format!(
        "{head}; waiting for {} {noun}: {}; {}",
        blockers.len(),
        named.join("; "),
        fixes.join("; ")
    )
}

/// Where a report reads from.
pub(crate) struct Watch<'a> {
    pub url: &'a str,
    pub endpoint: &'a Endpoint,
    pub wait: &'a SetupWait,
}

/// Runs `create`, the creation of slot `slot` on backend `creator`, reporting what it waits for
/// while it waits (see the module's invariants).
pub(crate) async fn while_waiting<F: Future>(
    create: F,
    watch: &Watch<'_>,
    slot: &str,
    creator: i32,
) -> F::Output {
    let began = tokio::time::Instant::now();
    let mut next = began + FIRST_REPORT;
    let mut observer: Option<Client> = None;
    tokio::pin!(create);
    let output = loop {
        tokio::select! {
            output = &mut create => break output,
            () = tokio::time::sleep_until(next) => {
                next += REPORT_INTERVAL;
                let report = tokio::time::timeout(
                    REPORT_TIMEOUT,
                    read_report(&mut observer, watch, slot, began.elapsed(), creator),
                )
                .await;
                match report {
                    Ok(Ok(summary)) => {
                        warn!(slot, "{summary}");
                        watch.wait.set(Some(summary));
                    }
                    Ok(Err(e)) => {
                        observer = None;
                        debug!(slot, error = %e, "could not read what slot creation waits for");
                    }
                    Err(_) => {
                        observer = None;
                        debug!(slot, "reading what slot creation waits for took too long");
                    }
                }
            }
        }
    };
    watch.wait.set(None);
    output
}

async fn read_report(
    observer: &mut Option<Client>,
    watch: &Watch<'_>,
    slot: &str,
    waited: Duration,
    creator: i32,
) -> Result<String, SourceError> {
    let client = match observer {
        Some(client) => client,
        None => observer.insert(crate::locate::connect_to(watch.url, watch.endpoint).await?),
    };
    Ok(summary(
        slot,
        Some(waited),
        &blockers(client, creator).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(pid: i32, waited_on: bool) -> Blocker {
        Blocker {
            pid: Some(pid),
            gid: None,
            xid_age: 3,
            application_name: Some("billing".into()),
            state: Some("idle in transaction".into()),
            query_start: Some("2026-12-02 03:57:31 UTC".into()),
            open_secs: Some(12.4),
            waited_on,
        }
    }

    #[test]
    fn the_report_names_each_backend_and_the_way_out() {
        let text = summary("s", Some(Duration::from_secs(7)), &[backend(4242, true)]);
        assert_eq!(
            text,
            "creating replication slot \"s\" has waited 7 s for running transactions to end (PostgreSQL starts a new slot only once every transaction that held an xid when creation began has ended); waiting for 1 transaction: pid 4242 (application \"billing\", idle in transaction, xid age 3, open for 12 s, query started 2026-12-02 03:57:31 UTC, waited on now); end them (COMMIT or ROLLBACK in their application), or end their sessions with SELECT pg_terminate_backend(4242), which rolls their transactions back"
        );
        let prepared = Blocker {
            pid: None,
            gid: Some("p1".into()),
            application_name: None,
            state: None,
            ..backend(0, false)
        };
        let many: Vec<Blocker> = (1..=6)
            .map(|pid| backend(pid, false))
            .chain([prepared])
            .collect();
        let text = summary("s", Some(Duration::from_secs(2)), &many);
        assert!(text.contains("waiting for 7 transactions"), "{text}");
        assert!(text.contains("; and 2 more;"), "{text}");
        assert!(text.contains("COMMIT PREPARED '<gid>'"), "{text}");
        let prepared = Blocker {
            pid: None,
            gid: Some("p1".into()),
            ..backend(0, true)
        };
        assert!(prepared
            .to_string()
            .starts_with("prepared transaction 'p1' (xid age 3, open for 12 s, prepared 2026"));
        assert!(summary("s", Some(Duration::ZERO), &[]).contains("none is visible"));
        assert!(summary("s", None, &[backend(1, true)])
            .starts_with("replication slot \"s\" is being created and waits"));
    }

    #[test]
    fn the_reason_is_shared_while_set() {
        let wait = SetupWait::default();
        let seen = wait.clone();
        assert_eq!(seen.get(), None);
        wait.set(Some("waiting".into()));
        assert_eq!(seen.get().as_deref(), Some("waiting"));
        wait.set(None);
        assert_eq!(seen.get(), None);
    }
}
