//! The replication client's events, read ahead of the pipeline within a byte budget.
//!
//! pgwire-replication's network reader decodes whole messages (one row change each, held as
//! `Bytes` until consumed) into a channel sized in events, and only stops reading the socket
//! (TCP flow control then holds the server back) while that channel is full. Sized in events
//! alone, read-ahead is either unbounded in bytes (4,096 rows of 512 KB are 2 GB) or too shallow
//! for small rows (the walsender then stops decoding whenever the pipeline pauses). So a task
//! here drains the library's small channel at once and keeps what it read within a budget of
//! bytes and of events, while still passing confirmed positions to the library and stopping on
//! request.
//!
//! # Invariants
//! - Events read and not yet taken hold at most `budget_bytes` (one event larger than the budget
//!   is let through alone) and number at most `max_events`.
//! - Besides them, pgwire-replication holds at most [`LIBRARY_BUFFER_EVENTS`] + 2 messages (its
//!   channel, one waiting for room, one being read) and a 128 KiB read buffer.
//! - Every event the library hands over is passed on, in order; the last one (an error, or the
//!   end of the stream) ends the task.
//! - Confirmed positions reach the library while the task waits for room.

use pgwire_replication::{
    Lsn as WireLsn, PgWireError, ReplicationClient, ReplicationEvent, ReplicationMetrics,
};
use std::sync::Arc;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// The library's own event channel: small, since the task empties it as fast as it fills.
pub const LIBRARY_BUFFER_EVENTS: usize = 4;

/// What an event other than row data counts for (its fixed-size fields).
const SMALL_EVENT_BYTES: usize = 64;

type Event = Result<Option<ReplicationEvent>, PgWireError>;

/// An event read ahead, holding its share of the budget until it is taken.
struct Item {
    event: Event,
    _room: Option<OwnedSemaphorePermit>,
}

/// The reading side of a replication client whose events are read ahead within a budget.
pub struct ReadAhead {
    events: mpsc::UnboundedReceiver<Item>,
    applied: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    metrics: Arc<ReplicationMetrics>,
    task: JoinHandle<Result<(), PgWireError>>,
}

impl ReadAhead {
    /// Starts reading `client` ahead, within `budget_bytes` and `max_events` (both at least 1).
    pub fn spawn(client: ReplicationClient, budget_bytes: usize, max_events: usize) -> Self {
        let budget_bytes = budget_bytes.clamp(1, u32::MAX as usize);
        // Each event counts for at least budget / max_events, so at most max_events fit.
        let min_cost = (budget_bytes / max_events.max(1)).max(1);
        let (tx, events) = mpsc::unbounded_channel();
        let (applied, applied_rx) = watch::channel(0);
        let (stop, stop_rx) = watch::channel(false);
        let metrics = client.metrics();
        let budget = Arc::new(Semaphore::new(budget_bytes));
        let task = tokio::spawn(relay(
            client,
            tx,
            Room {
                budget,
                budget_bytes,
                min_cost,
            },
            applied_rx,
            stop_rx,
        ));
        ReadAhead {
            events,
            applied,
            stop,
            metrics,
            task,
        }
    }

    /// The next event: `None` when the reading task is gone without a last word (it panicked).
    /// Cancel-safe.
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await.map(|item| item.event)
    }

    /// Hands a confirmed position to the library (monotonic there).
    pub fn update_applied_lsn(&self, lsn: u64) {
        self.applied.send_replace(lsn);
    }

    /// The library's metrics (positions reported and seen).
    pub fn metrics(&self) -> &ReplicationMetrics {
        &self.metrics
    }

    /// Stops reading and ends the replication stream cleanly.
    pub async fn shutdown(self) -> Result<(), PgWireError> {
        self.stop.send_replace(true);
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(PgWireError::Task(format!("replication reader failed: {e}"))),
        }
    }
}

/// The read-ahead budget.
struct Room {
    budget: Arc<Semaphore>,
    budget_bytes: usize,
    min_cost: usize,
}

impl Room {
    /// What `event` counts for: its bytes, at least `min_cost`, at most the whole budget.
    fn cost(&self, event: &Event) -> u32 {
        let bytes = match event {
            Ok(Some(ReplicationEvent::XLogData { data, .. })) => data.len() + SMALL_EVENT_BYTES,
            _ => SMALL_EVENT_BYTES,
        };
        let cost = bytes.max(self.min_cost).min(self.budget_bytes);
        // budget_bytes is clamped to u32::MAX in `spawn`.
        u32::try_from(cost).unwrap_or(u32::MAX)
    }
}

/// What the reading task was told while waiting.
enum Told {
    Stop,
    Gone,
}

/// Passes a new confirmed position on; `Err` when the stream side is gone.
fn pass_applied(
    client: &ReplicationClient,
    applied: &mut watch::Receiver<u64>,
    changed: Result<(), watch::error::RecvError>,
) -> Result<(), Told> {
    changed.map_err(|_| Told::Gone)?;
    let lsn = *applied.borrow_and_update();
    client.update_applied_lsn(WireLsn::from_u64(lsn));
    Ok(())
}

/// What the stop and applied-position signals say without waiting: `Err` when the task must
/// end. Checked before each event, so the select below (whose wake-up registrations cost
/// more than the event itself) runs only when no event is ready.
fn poll_signals(
    client: &ReplicationClient,
    stop: &mut watch::Receiver<bool>,
    applied: &mut watch::Receiver<u64>,
    tx: &mpsc::UnboundedSender<Item>,
) -> Result<(), Told> {
    match stop.has_changed() {
        Ok(false) => {}
        Ok(true) if *stop.borrow() => return Err(Told::Stop),
        Ok(true) | Err(_) => return Err(Told::Gone),
    }
    match applied.has_changed() {
        Ok(false) => {}
        Ok(true) => pass_applied(client, applied, Ok(()))?,
        Err(_) => return Err(Told::Gone),
    }
    if tx.is_closed() {
        return Err(Told::Gone);
    }
    Ok(())
}

async fn relay(
    mut client: ReplicationClient,
    tx: mpsc::UnboundedSender<Item>,
    room: Room,
    mut applied: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), PgWireError> {
    let told = 'read: loop {
        if let Err(told) = poll_signals(&client, &mut stop, &mut applied, &tx) {
            break told;
        }
        // The signals were just checked: an event that is ready is taken first (the other
        // branches are then never polled, so they register no wake-up).
        let event = tokio::select! {
            biased;
            event = client.recv() => event,
            changed = stop.changed() => {
                break if changed.is_ok() && *stop.borrow() { Told::Stop } else { Told::Gone };
            }
            changed = applied.changed() => match pass_applied(&client, &mut applied, changed) {
                Ok(()) => continue,
                Err(told) => break told,
            },
            () = tx.closed() => break Told::Gone,
        };
        let last = !matches!(event, Ok(Some(_)));
        let cost = room.cost(&event);
        let permit = match Arc::clone(&room.budget).try_acquire_many_owned(cost) {
            Ok(permit) => Some(permit),
            // No room (or, never, a closed budget): wait for room, still passing positions on.
            Err(_) => loop {
                tokio::select! {
                    biased;
                    changed = stop.changed() => {
                        break 'read if changed.is_ok() && *stop.borrow() { Told::Stop } else { Told::Gone };
                    }
                    changed = applied.changed() => {
                        if let Err(told) = pass_applied(&client, &mut applied, changed) {
                            break 'read told;
                        }
                    }
                    () = tx.closed() => break 'read Told::Gone,
                    permit = Arc::clone(&room.budget).acquire_many_owned(cost) => break permit.ok(),
                }
            },
        };
        if tx
            .send(Item {
                event,
                _room: permit,
            })
            .is_err()
        {
            break Told::Gone;
        }
        if last {
            return Ok(());
        }
    };
    match told {
        Told::Stop => client.shutdown().await,
        // The stream was dropped: dropping the client ends the connection.
        Told::Gone => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(budget_bytes: usize, max_events: usize) -> Room {
        Room {
            budget: Arc::new(Semaphore::new(budget_bytes)),
            budget_bytes,
            min_cost: (budget_bytes / max_events).max(1),
        }
    }

    fn data(len: usize) -> Event {
        Ok(Some(ReplicationEvent::XLogData {
            wal_start: WireLsn::from_u64(1),
            wal_end: WireLsn::from_u64(2),
            server_time_micros: 0,
            data: bytes::Bytes::from(vec![0u8; len]),
        }))
    }

    #[test]
    fn events_cost_their_bytes_within_the_count_and_the_budget() {
        let r = room(32 * 1024 * 1024, 4096);
        // Small rows: the count bounds them (8 KiB each of a 32 MiB budget: 4096 fit).
        assert_eq!(r.cost(&data(200)), 8 * 1024);
        // Large rows: their bytes.
        assert_eq!(r.cost(&data(512 * 1024)), 512 * 1024 + 64);
        // Larger than the budget: the whole budget, so it passes alone.
        assert_eq!(r.cost(&data(64 * 1024 * 1024)), 32 * 1024 * 1024);
        assert_eq!(r.cost(&Ok(None)), 8 * 1024);
    }
}
