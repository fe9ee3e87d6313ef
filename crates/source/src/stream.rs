//! The replication connection: `START_REPLICATION` and the event stream.
//!
//! # Invariants
//! - [`ReplicationStream::confirm`] is monotonic; the server is only told positions passed to it.
//! - [`ReplicationStream::next`] is cancel-safe: its only await point is the receive from the
//!   network reader's channel, so it can sit in a `select!`.
//! - Read-ahead is bounded by bytes and by events ([`crate::read_ahead`]):
//!   `SourceConfig::read_ahead_bytes` and `SourceConfig::buffer_events`, plus a few messages
//!   inside pgwire-replication.

use crate::assembly::{Assembler, SourceEvent};
use crate::read_ahead::{ReadAhead, LIBRARY_BUFFER_EVENTS};
use crate::stall::{Escalation, SharedEscalation, StallWatch, Verdict};
use crate::{ConnectionParams, SlotState, SourceConfig, SourceError, TargetSession};
use pgoutput::Lsn;
use pgwire_replication::{Lsn as WireLsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tracing::{debug, info};

/// A running logical replication stream.
pub struct ReplicationStream {
    client: ReadAhead,
    last_message: Instant,
    assembler: Assembler,
    slot: String,
    confirmed: Lsn,
    stall: Arc<Mutex<StallWatch>>,
    escalation: SharedEscalation,
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
    ) -> Result<Option<String>, SourceError> {
        let mut watch = self.watch.lock().await;
        match watch
            .check(sql, &self.slot, self.silence, timeout, self.received)
            .await?
        {
            Verdict::Stalled(seen) => Ok(Some(seen.to_string())),
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
        let tls = params.tls.replication_config(&endpoint.host);
        let sslmode = params.tls.mode;
        let user = params.user.clone();
        let wire = ReplicationConfig::new(
            endpoint.address(),
            params.user,
            params.password,
            params.database,
            config.slot.clone(),
            config.publication.clone(),
        )
        .with_port(endpoint.port)
        .with_tls(tls)
        .with_start_lsn(WireLsn::from_u64(start_lsn.0))
        .with_ack_lsn(WireLsn::from_u64(start_lsn.0))
        .with_status_interval(config.status_interval)
        .with_wakeup_interval(config.idle_wakeup_interval)
        .with_buffer_size(LIBRARY_BUFFER_EVENTS)
        .with_application_name(config.application_name.clone());
        let failed = |e| SourceError::from_replication_as(&config.slot, Some(&user), e);
        let mut client = ReplicationClient::connect_gated(wire)
            .await
            .map_err(failed)?;
        before_start(&mut client, config, slot, params.target)
            .await
            .map_err(|e| match e {
                BeforeStart::Wire(e) => failed(e),
                BeforeStart::Source(e) => e,
            })?;
        client.start().await.map_err(failed)?;
        client.wait_started().await.map_err(failed)?;
        info!(slot = %config.slot, from = %start_lsn, host = %endpoint, %sslmode, "streaming");
        let escalation = Arc::new(std::sync::Mutex::new(escalation));
        Ok(ReplicationStream {
            client: ReadAhead::spawn(client, config.read_ahead_bytes, config.buffer_events),
            last_message: Instant::now(),
            assembler: Assembler::new(),
            slot: config.slot.clone(),
            confirmed: start_lsn,
            // Status updates go out at least every idle wakeup (and within a status interval of
            // a new position); twice that without one reaching the server is not chance.
            stall: Arc::new(Mutex::new(StallWatch::new(
                2 * config.idle_wakeup_interval + config.status_interval,
                Arc::clone(&escalation),
            ))),
            escalation,
        })
    }

    /// The next event. `Ok(None)` when the stream ended after [`ReplicationStream::stop`].
    pub async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        loop {
            let event = self
                .client
                .recv()
                .await
                .ok_or_else(|| SourceError::Transient("the replication reader stopped".into()))?
                .map_err(|e| SourceError::from_replication(&self.slot, e))?;
            let Some(event) = event else { return Ok(None) };
            self.last_message = Instant::now();
            let produced = match event {
                ReplicationEvent::Begin {
                    final_lsn,
                    xid,
                    commit_time_micros,
                } => Some(self.assembler.begin(
                    xid,
                    Lsn(final_lsn.as_u64()),
                    commit_time_micros,
                )?),
                ReplicationEvent::Commit {
                    lsn,
                    end_lsn,
                    commit_time_micros,
                } => Some(self.assembler.commit(
                    Lsn(lsn.as_u64()),
                    Lsn(end_lsn.as_u64()),
                    commit_time_micros,
                )?),
                ReplicationEvent::XLogData {
                    data, wal_start, ..
                } => self.assembler.data(&data, Lsn(wal_start.as_u64()))?,
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    self.assembler.keepalive(Lsn(wal_end.as_u64()))
                }
                ReplicationEvent::Message {
                    transactional,
                    lsn,
                    prefix,
                    content,
                } => Some(self.assembler.message(
                    transactional,
                    Lsn(lsn.as_u64()),
                    &prefix,
                    content,
                )?),
                ReplicationEvent::StoppedAt { .. } => None,
            };
            if let Some(event) = produced {
                return Ok(Some(event));
            }
        }
    }

    /// Reports `lsn` as flushed: everything before it is delivered. Lower positions are ignored.
    pub fn confirm(&mut self, lsn: Lsn) {
        if lsn > self.confirmed {
            self.confirmed = lsn;
            self.client.update_applied_lsn(lsn.0);
        }
    }

    /// The highest position passed to [`ReplicationStream::confirm`] (or the start position).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The position last reported to the server in a status update.
    pub fn reported(&self) -> Lsn {
        Lsn(self.client.metrics().last_applied_lsn().as_u64())
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
        Lsn(self.client.metrics().last_wal_end().as_u64())
    }

    /// Waits (up to `timeout`) until the confirmed position has been reported to the server, then
    /// ends the stream cleanly.
    pub async fn finish(self, timeout: Duration) -> Result<Lsn, SourceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.reported() < self.confirmed && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reported = self.reported();
        let slot = self.slot;
        self.client
            .shutdown()
            .await
            .map_err(|e| SourceError::from_replication(&slot, e))?;
        Ok(reported)
    }
}

/// Why the checks before `START_REPLICATION` failed.
enum BeforeStart {
    Wire(pgwire_replication::PgWireError),
    Source(SourceError),
}

impl From<pgwire_replication::PgWireError> for BeforeStart {
    fn from(e: pgwire_replication::PgWireError) -> Self {
        BeforeStart::Wire(e)
    }
}

/// The first column of the first row of a simple-query answer, as text.
fn first_value(rows: &[pgwire_replication::QueryRow]) -> Option<String> {
    rows.first()
        .and_then(|row| row.first())
        .and_then(|value| value.as_ref())
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
}

/// The replication session's checks before it starts: the host still fits the target session,
/// it is still the server `prepare` checked, and the slot becomes a failover slot if asked.
async fn before_start(
    client: &mut ReplicationClient,
    config: &SourceConfig,
    slot: &SlotState,
    target: TargetSession,
) -> Result<(), BeforeStart> {
    let endpoint = &slot.endpoint;
    if target != TargetSession::Any {
        let rows = client
            .simple_query("SELECT pg_is_in_recovery()::text")
            .await?;
        if first_value(&rows).as_deref() != Some("false") {
            return Err(BeforeStart::Source(SourceError::Transient(format!(
                "{endpoint} became a standby before streaming started; looking for the primary again"
            ))));
        }
    }
    if let Some(expected) = &slot.identity {
        let seen = client.identify_system().await?;
        if seen.system_id != expected.system_id || seen.timeline != expected.timeline {
            return Err(BeforeStart::Source(SourceError::Transient(format!(
                "{endpoint} is no longer the server that was checked ({expected}; now system {} timeline {}): a failover happened; checking again",
                seen.system_id, seen.timeline
            ))));
        }
    }
    if slot.enable_failover {
        let command = format!(
            "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
            crate::config::quote_ident(&config.slot)
        );
        client.simple_query(&command).await?;
        info!(slot = %config.slot, "replication slot is now a failover slot");
    }
    Ok(())
}
