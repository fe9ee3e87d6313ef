//! Finding the server to stream from among the hosts of `source.url`, and telling whether it is
//! still the server of the previous session.
//!
//! `source.url` may list several hosts (`postgres://u@db1,db2/app?target_session_attrs=read-write`
//! or `host=db1,db2 ...`), as libpq allows, so that after a failover Siphon finds the new
//! primary. [`locate`] tries the hosts in order and keeps the first that fits the target session;
//! every later connection of the session (catalog queries, the replication stream) goes to that
//! same host, so the slot that was checked is the slot that is streamed from.
//!
//! # Invariants
//! - A host is only chosen after a session on it answered the target's question
//!   (`transaction_read_only`, or `pg_is_in_recovery()` for `primary`).
//! - With one host the error of that host is returned as it is (its consequence unchanged); with
//!   several, the errors are definite only if every host failed definitely: a host that is down
//!   or is a standby can be cured by a failover, so that is waited for.
//! - [`ServerIdentity`] changes with a promotion (a new timeline) or a different cluster (a new
//!   system identifier); positions from another identity are never used to skip WAL.

use crate::config::{parse_url, Endpoint, ParsedUrl, TargetSession};
use crate::error::{Interruption, LoginProblem};
pub use crate::names::ServerIdentity;
use crate::names::SslMode;
use crate::SourceError;
use std::time::Duration;
use tokio_postgres::Client;
use tracing::{debug, info};

/// An open SQL session on the chosen host.
pub struct Located {
    pub client: Client,
    pub endpoint: Endpoint,
}

/// Connects to the first host of `url` that fits its `target_session_attrs`.
pub async fn locate(url: &str) -> Result<Located, SourceError> {
    let parsed = parse_url(url)?;
    let endpoints = crate::ConnectionParams::from_url(url)?.endpoints;
    let mut refusals = Vec::new();
    for endpoint in &endpoints {
        let attempt = match open(&parsed, endpoint).await {
            Ok(client) => check_target(&client, parsed.target, endpoint)
                .await
                .map(|()| client),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(client) => {
                if !refusals.is_empty() {
                    info!(host = %endpoint, target = %parsed.target, "connected to the next host of source.url");
                }
                return Ok(Located {
                    client,
                    endpoint: endpoint.clone(),
                });
            }
            // One host: its error as it is, consequence unchanged.
            Err(e) if endpoints.len() == 1 => return Err(e),
            Err(e) => {
                debug!(host = %endpoint, error = %e, "host of source.url not used");
                refusals.push((endpoint.clone(), e));
            }
        }
    }
    Err(SourceError::NoUsableHost {
        target: parsed.target,
        refusals,
    })
}

/// How long asking a server whether it has TLS may take when the URL sets no
/// `connect_timeout`.
const TLS_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a SQL session on `endpoint` (the host [`locate`] chose), without checking the target.
pub async fn connect_to(url: &str, endpoint: &Endpoint) -> Result<Client, SourceError> {
    open(&parse_url(url)?, endpoint).await
}

async fn open(parsed: &ParsedUrl, endpoint: &Endpoint) -> Result<Client, SourceError> {
    let connector = parsed.tls.sql_connector()?;
    let connected = parsed.for_endpoint(endpoint).connect(connector).await;
    let (client, connection) = match connected {
        Ok(connected) => connected,
        Err(e) => {
            // tokio-postgres says only in words that the server refused TLS: it is asked again.
            let mode = parsed.tls.mode;
            let needs_tls = !matches!(mode, SslMode::Disable | SslMode::Prefer);
            let timeout = parsed
                .config
                .get_connect_timeout()
                .copied()
                .unwrap_or(TLS_PROBE_TIMEOUT);
            if needs_tls
                && !endpoint.host.starts_with('/')
                && e.as_db_error().is_none()
                && crate::wire::refuses_tls(&endpoint.address(), endpoint.port, timeout).await
            {
                return Err(LoginProblem::SqlTlsUnsupported { mode }.into());
            }
            return Err(SourceError::from_connect(parsed.tls.login(), e));
        }
    };
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "SQL connection closed");
        }
    });
    Ok(client)
}

/// Whether the session on `endpoint` fits `target`: a standby (or a read-only primary, for
/// `read-write`) is a transient refusal, cured by a failover or by the next host.
async fn check_target(
    client: &Client,
    target: TargetSession,
    endpoint: &Endpoint,
) -> Result<(), SourceError> {
    let sql = match target {
        TargetSession::Any => return Ok(()),
        TargetSession::ReadWrite => "SELECT current_setting('transaction_read_only') = 'off'",
        TargetSession::Primary => "SELECT NOT pg_is_in_recovery()",
    };
    let fits: bool = client
        .query_one(sql, &[])
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::TargetSessionAttrs, e))?
        .get(0);
    if fits {
        Ok(())
    } else {
        Err(Interruption::NotTarget {
            endpoint: endpoint.clone(),
            target,
        }
        .into())
    }
}

/// Reads the identity of the server `client` is connected to. `None` on a standby (which
/// writes no WAL of its own) or when the server does not tell this user.
pub async fn identity(client: &Client) -> Option<ServerIdentity> {
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier FROM pg_control_system())::text, \
                    CASE WHEN pg_is_in_recovery() THEN NULL \
                         ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END",
            &[],
        )
        .await;
    let row = match row {
        Ok(row) => row,
        Err(e) => {
            debug!(error = %e, "server identity not readable");
            return None;
        }
    };
    let system_id: Option<String> = row.get(0);
    let timeline: Option<String> = row.get(1);
    Some(ServerIdentity {
        system_id: system_id?,
        timeline: u32::from_str_radix(&timeline?, 16).ok()?,
    })
}
