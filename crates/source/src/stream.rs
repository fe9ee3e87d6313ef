//! The replication connection: `START_REPLICATION` and the event stream.
//!
//! # Invariants
//! - [`ReplicationStream::confirm`] is monotonic; the server is only told positions passed to it.
//! - [`ReplicationStream::next`] and [`ReplicationStream::read_ahead`] are cancel-safe (see
//!   [`crate::wire`]), so they can sit in a `select!`.
//! - Read-ahead is bounded by bytes: `SourceConfig::read_ahead_bytes` of messages read and not
//!   yet decoded (one larger message is read alone).
//! - Starting is bounded: the login, and then the commands up to `START_REPLICATION`'s answer,
//!   each within the connect timeout (`connect_timeout` in the URL, else 30 s); an unanswered
//!   start is a lost connection, retried with the supervisor's backoff.

use crate::assembly::{SlotAssembler, SourceEvent};
use crate::error::{Interruption, LoginTls, Query, SourceOperation, Subject};
use crate::stall::{Escalation, SharedEscalation, StallWatch, Verdict};
use crate::wire::{Login, Received, Session, WireError, WireStream};
use crate::{
    ConnectionParams, DatabaseEncoding, SlotState, SourceConfig, SourceError, TargetSession,
};
use pgoutput::Lsn;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tracing::{debug, info};

/// A running logical replication stream.
pub struct ReplicationStream {
    wire: WireStream,
    last_message: Instant,
    assembler: SlotAssembler,
    slot: String,
    confirmed: Lsn,
    stall: Arc<Mutex<StallWatch>>,
    escalation: SharedEscalation,
    /// The database encoding (logical message contents are text in it).
    encoding: DatabaseEncoding,
}

/// One stall check of the stream, to run beside the session loop (see [`crate::stall`]): it
/// carries the stream's silence and position as they were when it was made.
pub struct StallCheck {
    watch: Arc<Mutex<StallWatch>>,
    slot: String,
    silence: Duration,
    received: Lsn,
}

impl StallCheck {
    /// Asks the server whether the silent stream is stalled: `Some(what was seen)` when it is,
    /// so the session reconnects. Bounded in time (a server that does not answer is a stall).
    pub async fn run(
        self,
        sql: &tokio_postgres::Client,
        timeout: Duration,
    ) -> Result<Option<crate::stall::Seen>, SourceError> {
        let mut watch = self.watch.lock().await;
        match watch
            .check(sql, &self.slot, self.silence, timeout, self.received)
            .await?
        {
            Verdict::Stalled(seen) => Ok(Some(seen)),
            Verdict::ServerBusy(seen) | Verdict::CaughtUp(seen) => {
                debug!(%seen, "replication stream silent, not stalled");
                Ok(None)
            }
            Verdict::NotSilent => Ok(None),
        }
    }
}

impl ReplicationStream {
    /// Starts streaming from `start_lsn` (at or after the slot's confirmed position) on the host
    /// [`crate::prepare`] checked (`slot`). Before `START_REPLICATION` the replication session
    /// checks that the host still fits `target_session_attrs` and is still the server `prepare`
    /// saw (a failover in between is a transient error), and turns failover on for the slot when
    /// `prepare` asked for it. `escalation`: the stalls without progress of the streams before
    /// this one (see [`crate::stall`]; [`ReplicationStream::stall_escalation`] hands it on).
    pub async fn start(
        config: &SourceConfig,
        slot: &SlotState,
        start_lsn: Lsn,
        escalation: Escalation,
    ) -> Result<Self, SourceError> {
        let params = ConnectionParams::from_url(&config.url)?;
        let endpoint = &slot.endpoint;
        let sslmode = params.tls.mode;
        let login = replication_login(config, &params, endpoint)?;
        let subject = Subject {
            slot: Some(&config.slot),
            user: Some(&params.user),
            login: Some(LoginTls {
                mode: sslmode,
                client_certificate: params.tls.client_cert.is_some(),
            }),
        };
        let failed = |operation, e| SourceError::from_replication_about(operation, subject, e);
        let start_timeout = login.timeout;
        let mut session = Session::connect(login)
            .await
            .map_err(|e| failed(SourceOperation::ReplicationLogin, e))?;
        // Reported by every server at login; UTF8 (content must then be UTF-8) if not.
        let encoding =
            DatabaseEncoding::from_server_encoding(session.server_encoding().unwrap_or("UTF8"));
        // Bounded as the login is: a path that black-holes once the server took the slot would
        // otherwise hold this session here, before any stall check runs, for good.
        let starting = async {
            before_start(&mut session, config, slot, params.target)
                .await
                .map_err(|e| match e {
                    BeforeStart::Wire(operation, e) => failed(operation, e),
                    BeforeStart::Source(e) => e,
                })?;
            session
                .start_replication(
                    &start_command(config, start_lsn),
                    start_lsn,
                    config.read_ahead_bytes,
                    config.status_interval,
                )
                .await
                .map_err(|e| failed(SourceOperation::StartReplication, e))
        };
        let wire = match tokio::time::timeout(start_timeout, starting).await {
            Ok(started) => started?,
            Err(_) => {
                return Err(failed(
                    SourceOperation::StartReplication,
                    WireError::StartTimeout {
                        seconds: start_timeout.as_secs(),
                    },
                ))
            }
        };
        info!(slot = %config.slot, from = %start_lsn, host = %endpoint, %sslmode, "streaming");
        let escalation = Arc::new(std::sync::Mutex::new(escalation));
        Ok(ReplicationStream {
            wire,
            last_message: Instant::now(),
            assembler: SlotAssembler::for_slot(&config.slot),
            slot: config.slot.clone(),
            confirmed: start_lsn,
            // A stream silent for twice the idle wakeup interval plus a status interval is
            // worth asking the server about (see `crate::stall`).
            stall: Arc::new(Mutex::new(StallWatch::new(
                2 * config.idle_wakeup_interval + config.status_interval,
                Arc::clone(&escalation),
            ))),
            escalation,
            encoding,
        })
    }

    /// The database encoding, as the server reported it (`server_encoding`): PostgreSQL
    /// converts rows and names to UTF-8 for the stream, but logical message contents are text
    /// in this encoding.
    pub fn database_encoding(&self) -> &DatabaseEncoding {
        &self.encoding
    }

    /// The next event. Cancel-safe.
    pub async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        loop {
            let received = self
                .wire
                .next(self.assembler.in_transaction())
                .await
                .map_err(|e| {
                    SourceError::from_replication(&self.slot, SourceOperation::Stream, e)
                })?;
            self.last_message = Instant::now();
            let produced = match received {
                Received::Data { wal_start, data } => self.assembler.data(&data, wal_start)?,
                Received::KeepAlive { wal_end } => self.assembler.keepalive(wal_end),
                Received::End => return Err(Interruption::StreamEnded.into()),
            };
            if let Some(event) = produced {
                return Ok(event);
            }
        }
    }

    /// The pipeline does not need relation `relation` (not an outbox table): its description
    /// is dropped, and its row changes come as [`SourceEvent::OtherTableChange`] until pgoutput
    /// describes it again (see [`crate::assembly`]).
    pub fn forget_relation(&mut self, relation: pgoutput::Oid) {
        self.assembler.forget(relation);
    }

    /// The pipeline skips every DELETE of relation `relation` (a bound outbox table): its
    /// Delete messages come as [`SourceEvent::OutboxDelete`], their old row checked but not
    /// decoded, until pgoutput describes the relation again (see [`crate::assembly`]).
    pub fn skip_deletes(&mut self, relation: pgoutput::Oid) {
        self.assembler.skip_deletes(relation);
    }

    /// What to await while the pipeline takes no events: reads ahead within the budget and
    /// keeps the status updates going. Returns only on an error. Cancel-safe.
    pub async fn read_ahead(&mut self) -> SourceError {
        let error = self.wire.read_ahead().await;
        SourceError::from_replication(&self.slot, SourceOperation::Stream, error)
    }

    /// [`ReplicationStream::next`] when `take`, [`ReplicationStream::read_ahead`] otherwise: one
    /// future for a `select!` branch. Cancel-safe.
    pub async fn next_or_read_ahead(&mut self, take: bool) -> Result<SourceEvent, SourceError> {
        if take {
            self.next().await
        } else {
            Err(self.read_ahead().await)
        }
    }

    /// Reports `lsn` as flushed: everything before it is delivered. Lower positions are ignored.
    pub fn confirm(&mut self, lsn: Lsn) {
        if lsn > self.confirmed {
            self.confirmed = lsn;
            self.wire.raise_applied(lsn);
        }
    }

    /// The highest position passed to [`ReplicationStream::confirm`] (or the start position).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The position last reported to the server in a status update.
    pub fn reported(&self) -> Lsn {
        self.wire.reported()
    }

    /// How long since the last message of any kind (keepalives included) was read.
    pub fn silent_for(&self) -> Duration {
        self.last_message.elapsed()
    }

    /// The stalls without progress so far, to hand to the next stream.
    pub fn stall_escalation(&self) -> Escalation {
        *self.escalation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stall check of the stream as it is now (call it only while ready to read).
    pub fn stall_check(&self) -> StallCheck {
        StallCheck {
            watch: Arc::clone(&self.stall),
            slot: self.slot.clone(),
            silence: self.silent_for(),
            received: self.server_wal_end(),
        }
    }

    /// The server's WAL end as last seen on the stream.
    pub fn server_wal_end(&self) -> Lsn {
        self.wire.server_wal_end()
    }

    /// Reports the confirmed position at once and ends the stream cleanly (waiting up to
    /// `timeout` for the server); returns the position reported.
    pub async fn finish(self, timeout: Duration) -> Result<Lsn, SourceError> {
        let slot = self.slot;
        self.wire
            .finish(timeout)
            .await
            .map_err(|e| SourceError::from_replication(&slot, SourceOperation::Stream, e))
    }
}

/// How long opening the replication session (TCP, TLS, authentication) may take when the URL
/// sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The login of a replication connection to `endpoint` (a host of `config.url`, whose
/// parameters are `params`).
pub(crate) fn replication_login<'a>(
    config: &'a SourceConfig,
    params: &'a ConnectionParams,
    endpoint: &'a crate::config::Endpoint,
) -> Result<Login<'a>, SourceError> {
    Ok(Login {
        host: &endpoint.host,
        hostaddr: endpoint.hostaddr,
        port: endpoint.port,
        user: &params.user,
        password: &params.password,
        database: &params.database,
        application_name: &config.application_name,
        tls: params.tls.replication_tls(&endpoint.host)?,
        timeout: params.connect_timeout.unwrap_or(CONNECT_TIMEOUT),
    })
}

/// `START_REPLICATION` for the slot and publication of `config`, from `start_lsn`.
fn start_command(config: &SourceConfig, start_lsn: Lsn) -> String {
    // publication_names is a list of identifiers inside a string literal.
    let publication = crate::config::quote_ident(&config.publication).replace('\'', "''");
    format!(
        "START_REPLICATION SLOT {} LOGICAL {start_lsn} (proto_version '1', publication_names '{publication}', messages 'true')",
        crate::config::quote_ident(&config.slot)
    )
}

/// Why the checks before `START_REPLICATION` failed.
enum BeforeStart {
    Wire(SourceOperation, WireError),
    Source(SourceError),
}

/// The replication command `operation`'s errors, for `?`.
fn during(operation: SourceOperation) -> impl FnOnce(WireError) -> BeforeStart {
    move |e| BeforeStart::Wire(operation, e)
}

/// The column `column` of the first row of a simple-query answer.
fn first_row_value(rows: &[crate::wire::QueryRow], column: usize) -> Option<&str> {
    rows.first()
        .and_then(|row| row.get(column))
        .and_then(|value| value.as_deref())
}

/// The replication session's checks before it starts: the host still fits the target session,
/// it is still the server `prepare` checked, and the slot becomes a failover slot if asked.
async fn before_start(
    session: &mut Session,
    config: &SourceConfig,
    slot: &SlotState,
    target: TargetSession,
) -> Result<(), BeforeStart> {
    let endpoint = &slot.endpoint;
    if target != TargetSession::Any {
        let rows = session
            .simple_query("SELECT pg_is_in_recovery()::text")
            .await
            .map_err(during(SourceOperation::Query(Query::InRecovery)))?;
        if first_row_value(&rows, 0) != Some("false") {
            return Err(BeforeStart::Source(
                Interruption::BecameStandby {
                    endpoint: endpoint.clone(),
                }
                .into(),
            ));
        }
    }
    if let Some(expected) = &slot.identity {
        let rows = session
            .simple_query("IDENTIFY_SYSTEM")
            .await
            .map_err(during(SourceOperation::IdentifySystem))?;
        let system_id = first_row_value(&rows, 0).unwrap_or_default();
        let timeline = first_row_value(&rows, 1).unwrap_or_default();
        if system_id != expected.system_id || timeline != expected.timeline.to_string() {
            return Err(BeforeStart::Source(
                Interruption::ServerChanged {
                    endpoint: endpoint.clone(),
                    expected: expected.clone(),
                    system_id: system_id.to_owned(),
                    timeline: timeline.to_owned(),
                }
                .into(),
            ));
        }
    }
    if slot.enable_failover {
        let command = format!(
            "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
            crate::config::quote_ident(&config.slot)
        );
        session
            .simple_query(&command)
            .await
            .map_err(during(SourceOperation::AlterReplicationSlot))?;
        info!(slot = %config.slot, "replication slot is now a failover slot");
    }
    Ok(())
}
