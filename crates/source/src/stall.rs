//! Telling a stalled replication connection from a server that is busy decoding, by asking the
//! server what the slot's walsender is doing.
//!
//! A silent stream alone proves nothing. The walsender sends nothing while it decodes WAL that
//! has no output for the slot: a large transaction on another table while it is written, and
//! again, for as long as it takes, when its commit is decoded (its changes are read back from
//! the spill files and filtered out); its keepalives only come when the client has not replied
//! for `wal_sender_timeout / 2`, which regular status updates prevent. What PostgreSQL 15 shows
//! for 5 million rows (845 MB) written into a table outside the publication:
//!
//! | phase | `sent_lsn` | `reply_time` | walsender wait event |
//! |---|---|---|---|
//! | transaction being written | moves every second | follows the client's updates | none (on CPU), `IO/ReorderBufferWrite`, `Client/WalSenderWaitForWAL` |
//! | its commit being decoded | stands still | stands still (replies are not read) | none (on CPU), `IO/ReorderBufferRead` |
//! | caught up | at the server's WAL end | follows the client's updates | `Client/WalSenderWaitForWAL` |
//! | client stopped (not reading, not replying), rows to send | stands still | stands still | `Client/WalSenderWriteData` |
//!
//! A broken connection looks different: no walsender at all (it ended, or the slot is free), or
//! a walsender waiting on the client (`Client/*`) while the client's status updates stop
//! arriving, or one waiting to write (`Client/WalSenderWriteData`) with nothing moving.
//! `pg_stat_replication_slots` (spill and total bytes) moves only with `sent_lsn` or after the
//! commit is decoded, so it adds nothing to these signs.
//!
//! # Invariants
//! - [`judge`] is pure: the same observations give the same verdict.
//! - A walsender that is reading WAL (`sent_lsn` moved) or working (not waiting on the client) is
//!   never taken for a stall, however long the stream is silent.
//! - Each stall declared without progress since the previous one doubles the silence needed for
//!   the next (up to [`MAX_ESCALATION`] doublings): stall-caused reconnects cannot repeat at a
//!   fixed interval. Progress past the position of the last stall resets it.

use crate::SourceError;
use pgoutput::Lsn;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

/// What the server showed of the slot's walsender at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotActivity {
    /// When it was observed (local clock).
    pub at: Instant,
    /// The server's flushed WAL position.
    pub server_flush_lsn: Lsn,
    /// The walsender streaming from the slot, if any.
    pub walsender: Option<WalSenderActivity>,
}

/// The slot's walsender as `pg_stat_replication` and `pg_stat_activity` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalSenderActivity {
    pub pid: i32,
    /// How far the walsender has read (and decoded) WAL.
    pub sent_lsn: Option<Lsn>,
    /// The send time the client put in its last status update that the walsender read
    /// (microseconds since the Unix epoch, client clock): only compared with itself.
    pub reply_time_us: Option<i64>,
    /// `wait_event_type` and `wait_event`: both `None` while it works on the CPU.
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
}

impl WalSenderActivity {
    /// Whether it waits on the client (for WAL to send, or for the socket to take data).
    fn waits_on_client(&self) -> bool {
        self.wait_event_type.as_deref() == Some("Client")
    }

    fn wait(&self) -> String {
        match (&self.wait_event_type, &self.wait_event) {
            (Some(t), Some(e)) => format!("{t}/{e}"),
            _ => "none (working)".to_owned(),
        }
    }
}

/// Reads the slot's walsender activity.
pub async fn observe(client: &Client, slot: &str) -> Result<SlotActivity, SourceError> {
    let row = client
        .query_one(
            "SELECT pg_current_wal_flush_lsn(), sl.active_pid, r.sent_lsn, \
                    (extract(epoch FROM r.reply_time) * 1000000)::bigint, \
                    a.wait_event_type::text, a.wait_event::text \
             FROM (SELECT 1) one \
             LEFT JOIN pg_replication_slots sl ON sl.slot_name = $1 \
             LEFT JOIN pg_stat_replication r ON r.pid = sl.active_pid \
             LEFT JOIN pg_stat_activity a ON a.pid = sl.active_pid",
            &[&slot],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::WalsenderActivity, e))?;
    let flush: PgLsn = row.get(0);
    let pid: Option<i32> = row.get(1);
    Ok(SlotActivity {
        at: Instant::now(),
        server_flush_lsn: Lsn(u64::from(flush)),
        walsender: pid.map(|pid| WalSenderActivity {
            pid,
            sent_lsn: row.get::<_, Option<PgLsn>>(2).map(|l| Lsn(u64::from(l))),
            reply_time_us: row.get(3),
            wait_event_type: row.get(4),
            wait_event: row.get(5),
        }),
    })
}

/// Why the stream is silent, as far as the server shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The stream has not been silent long enough to ask.
    NotSilent,
    /// The walsender is reading WAL or working on it: wait.
    ServerBusy(Seen),
    /// The walsender waits for new WAL and hears from us: nothing is due.
    CaughtUp(Seen),
    /// Nothing is moving for this slot, or our connection is broken: reconnect.
    Stalled(Seen),
}

/// What was seen, for the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub what: String,
    pub silence: Duration,
    /// The server's flushed WAL position (`None` when the server did not answer).
    pub server_flush_lsn: Option<Lsn>,
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nothing received for {}s; {}",
            self.silence.as_secs(),
            self.what
        )?;
        match self.server_flush_lsn {
            Some(lsn) => write!(f, " (server WAL flushed to {lsn})"),
            None => Ok(()),
        }
    }
}

/// How long the check of the walsender may take at least before the server counts as
/// unreachable.
pub const OBSERVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How old the previous observation may be to be compared with the current one (checks come
/// every few seconds while the stream is silent and Siphon is ready to read).
pub const PREVIOUS_VALID: Duration = Duration::from_secs(15);

/// The most times the silence needed for a stall doubles after stalls without progress.
pub const MAX_ESCALATION: u32 = 4;

/// The silence that makes a stall after `consecutive_stalls` stalls without progress.
pub fn required_silence(timeout: Duration, consecutive_stalls: u32) -> Duration {
    timeout * 2u32.pow(consecutive_stalls.min(MAX_ESCALATION))
}

/// Judges the stream from two observations of its walsender.
///
/// - `previous`: the observation just before `current` during the same silence, if any (the
///   signs of a broken connection other than a missing walsender need two looks in a row);
/// - `silence`: how long nothing was read from the stream;
/// - `required`: the silence that may be a stall (see [`required_silence`]);
/// - `replies_unseen_for`: how long the walsender's `reply_time` has not changed;
/// - `reply_grace`: how long our status updates may legitimately be apart.
pub fn judge(
    previous: Option<&SlotActivity>,
    current: &SlotActivity,
    silence: Duration,
    required: Duration,
    replies_unseen_for: Duration,
    reply_grace: Duration,
) -> Verdict {
    if silence < required {
        return Verdict::NotSilent;
    }
    let seen = |what: String| Seen {
        what,
        silence,
        server_flush_lsn: Some(current.server_flush_lsn),
    };
    let Some(now) = &current.walsender else {
        return Verdict::Stalled(seen(
            "no walsender is streaming from the slot: the replication connection is gone on the server's side".into(),
        ));
    };
    let before = previous
        .and_then(|p| p.walsender.as_ref())
        .filter(|b| b.pid == now.pid);
    let sent = now
        .sent_lsn
        .map_or_else(|| "?".to_owned(), |l| l.to_string());
    if let Some(before) = before {
        if now.sent_lsn > before.sent_lsn {
            return Verdict::ServerBusy(seen(format!(
                "walsender {} is decoding WAL with no output for the slot (sent_lsn moved from {} to {sent})",
                now.pid,
                before
                    .sent_lsn
                    .map_or_else(|| "?".to_owned(), |l| l.to_string()),
            )));
        }
    }
    if !now.waits_on_client() {
        return Verdict::ServerBusy(seen(format!(
            "walsender {} is working (wait event {}, sent_lsn {sent})",
            now.pid,
            now.wait()
        )));
    }
    // Two looks in a row at a walsender in its loop (where it reads every status update that
    // has arrived) without a new one: they are not arriving.
    let waited_before = before.is_some_and(WalSenderActivity::waits_on_client);
    if waited_before && replies_unseen_for >= reply_grace.max(required) {
        return Verdict::Stalled(seen(format!(
            "walsender {} waits on the client ({}) but has read none of our status updates for {}s: the connection is broken",
            now.pid,
            now.wait(),
            replies_unseen_for.as_secs()
        )));
    }
    if now.wait_event.as_deref() == Some("WalSenderWriteData") && before.is_some() {
        return Verdict::Stalled(seen(format!(
            "walsender {} cannot send to us (Client/WalSenderWriteData, sent_lsn {sent} not moving) while we are ready to read",
            now.pid
        )));
    }
    Verdict::CaughtUp(seen(format!(
        "walsender {} is caught up and waiting for WAL ({}, sent_lsn {sent})",
        now.pid,
        now.wait()
    )))
}

/// Stalls declared without progress since, and where the last one was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Escalation {
    consecutive: u32,
    last_stall_at: Lsn,
}

impl Escalation {
    /// The silence that makes a stall now.
    pub fn required(&self, timeout: Duration) -> Duration {
        required_silence(timeout, self.consecutive)
    }

    /// The stream has received up to `received`: past the last stall's position, that is
    /// progress, and the next stall needs only the timeout again.
    pub fn received(&mut self, received: Lsn) {
        if received > self.last_stall_at {
            self.consecutive = 0;
        }
    }

    /// A stall was declared with the stream at `received`.
    pub fn stalled(&mut self, received: Lsn) {
        self.consecutive = self.consecutive.saturating_add(1);
        self.last_stall_at = self.last_stall_at.max(received);
    }
}

/// The escalation shared by a stream and its checks. It is carried from one session to the next
/// by the caller ([`crate::ReplicationStream::stall_escalation`]): a stall-caused reconnect makes
/// a new stream, and the escalation must outlive it.
pub type SharedEscalation = Arc<StdMutex<Escalation>>;

/// Runs `f` on an escalation (a poisoned lock still holds a consistent value: it is two plain
/// numbers).
fn with_escalation<T>(shared: &SharedEscalation, f: impl FnOnce(&mut Escalation) -> T) -> T {
    let mut guard = shared.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard)
}

/// The stall state of one stream: the previous observation during the current silence and when
/// the walsender last showed a new status update from us.
#[derive(Debug)]
pub struct StallWatch {
    previous: Option<SlotActivity>,
    reply_seen: Option<(i64, Instant)>,
    reply_grace: Duration,
    escalation: SharedEscalation,
}

impl StallWatch {
    /// `reply_grace`: how long our status updates may legitimately be apart; `escalation`: the
    /// stalls without progress so far (also before this stream).
    pub fn new(reply_grace: Duration, escalation: SharedEscalation) -> Self {
        StallWatch {
            previous: None,
            reply_seen: None,
            reply_grace,
            escalation,
        }
    }

    /// Checks a stream silent for `silence` (nothing is asked of the server before the stream has
    /// been silent for the stall timeout); `received` is the last WAL position the stream saw.
    pub async fn check(
        &mut self,
        client: &Client,
        slot: &str,
        silence: Duration,
        timeout: Duration,
        received: Lsn,
    ) -> Result<Verdict, SourceError> {
        let required = with_escalation(&self.escalation, |e| {
            e.received(received);
            e.required(timeout)
        });
        if silence < required {
            self.previous = None;
            return Ok(Verdict::NotSilent);
        }
        // Both connections go to the same server: one that does not answer the check within
        // the timeout (at least OBSERVE_TIMEOUT) is unreachable, and so is the stream.
        let wait = timeout.max(OBSERVE_TIMEOUT);
        // An observation from before a pause in checking (the window was full) says nothing
        // about now.
        if self
            .previous
            .as_ref()
            .is_some_and(|p| p.at.elapsed() > PREVIOUS_VALID)
        {
            self.previous = None;
        }
        let current = match tokio::time::timeout(wait, observe(client, slot)).await {
            Ok(observed) => observed?,
            Err(_) => {
                with_escalation(&self.escalation, |e| e.stalled(received));
                return Ok(Verdict::Stalled(Seen {
                    what: format!(
                        "the server did not answer the check of the slot's walsender within {}s",
                        wait.as_secs()
                    ),
                    silence,
                    server_flush_lsn: None,
                }));
            }
        };
        let reply = current.walsender.as_ref().and_then(|w| w.reply_time_us);
        let replies_unseen_for = match (reply, self.reply_seen) {
            (Some(r), Some((seen, since))) if r == seen => current.at.duration_since(since),
            (Some(r), _) => {
                self.reply_seen = Some((r, current.at));
                Duration::ZERO
            }
            (None, Some((_, since))) => current.at.duration_since(since),
            (None, None) => {
                // No reply known yet: count from this observation.
                self.reply_seen = Some((i64::MIN, current.at));
                Duration::ZERO
            }
        };
        let verdict = judge(
            self.previous.as_ref(),
            &current,
            silence,
            required,
            replies_unseen_for,
            self.reply_grace,
        );
        if matches!(verdict, Verdict::Stalled(_)) {
            with_escalation(&self.escalation, |e| e.stalled(received));
        }
        self.previous = Some(current);
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn activity(at: Instant, sent: u64, wait: Option<(&str, &str)>) -> SlotActivity {
        SlotActivity {
            at,
            server_flush_lsn: Lsn(0x1E0D_9D80),
            walsender: Some(WalSenderActivity {
                pid: 42,
                sent_lsn: Some(Lsn(sent)),
                reply_time_us: Some(1),
                wait_event_type: wait.map(|w| w.0.to_owned()),
                wait_event: wait.map(|w| w.1.to_owned()),
            }),
        }
    }

    const WAIT_FOR_WAL: Option<(&str, &str)> = Some(("Client", "WalSenderWaitForWAL"));
    const WRITE_DATA: Option<(&str, &str)> = Some(("Client", "WalSenderWriteData"));

    #[test]
    fn a_short_silence_is_not_judged() {
        let t = Instant::now();
        let now = activity(t, 100, WAIT_FOR_WAL);
        assert_eq!(
            judge(None, &now, SECOND, 2 * SECOND, Duration::ZERO, 20 * SECOND),
            Verdict::NotSilent
        );
    }

    #[test]
    fn a_big_transaction_being_written_is_decoding_not_a_stall() {
        let t = Instant::now();
        let before = activity(t, 0x0200_0000, WAIT_FOR_WAL);
        let now = activity(t + 5 * SECOND, 0x0900_0000, WAIT_FOR_WAL);
        let verdict = judge(
            Some(&before),
            &now,
            60 * SECOND,
            SECOND,
            SECOND,
            20 * SECOND,
        );
        assert!(matches!(verdict, Verdict::ServerBusy(_)), "{verdict:?}");
    }

    #[test]
    fn a_commit_being_decoded_is_work_even_with_replies_unread() {
        let t = Instant::now();
        for wait in [None, Some(("IO", "ReorderBufferRead"))] {
            let before = activity(t, 0x1E0D_9C38, wait);
            let now = activity(t + 5 * SECOND, 0x1E0D_9C38, wait);
            // The walsender reads no replies while it decodes the commit.
            let verdict = judge(
                Some(&before),
                &now,
                600 * SECOND,
                SECOND,
                600 * SECOND,
                20 * SECOND,
            );
            assert!(matches!(verdict, Verdict::ServerBusy(_)), "{verdict:?}");
        }
    }

    #[test]
    fn no_walsender_is_a_stall() {
        let t = Instant::now();
        let now = SlotActivity {
            at: t,
            server_flush_lsn: Lsn(7),
            walsender: None,
        };
        let verdict = judge(None, &now, 2 * SECOND, SECOND, Duration::ZERO, 20 * SECOND);
        let Verdict::Stalled(seen) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(seen.to_string().contains("no walsender"), "{seen}");
    }

    #[test]
    fn a_walsender_that_hears_nothing_from_us_is_a_stall() {
        let t = Instant::now();
        let before = activity(t, 100, WAIT_FOR_WAL);
        let now = activity(t + 5 * SECOND, 100, WAIT_FOR_WAL);
        let fresh = judge(
            Some(&before),
            &now,
            30 * SECOND,
            SECOND,
            5 * SECOND,
            20 * SECOND,
        );
        assert!(matches!(fresh, Verdict::CaughtUp(_)), "{fresh:?}");
        let stale = judge(
            Some(&before),
            &now,
            30 * SECOND,
            SECOND,
            25 * SECOND,
            20 * SECOND,
        );
        assert!(matches!(stale, Verdict::Stalled(_)), "{stale:?}");
    }

    #[test]
    fn a_walsender_that_cannot_write_to_us_is_a_stall() {
        let t = Instant::now();
        let before = activity(t, 100, WRITE_DATA);
        let now = activity(t + 5 * SECOND, 100, WRITE_DATA);
        let first = judge(None, &now, 30 * SECOND, SECOND, Duration::ZERO, 20 * SECOND);
        assert!(
            matches!(first, Verdict::CaughtUp(_)),
            "one look is not enough: {first:?}"
        );
        let verdict = judge(
            Some(&before),
            &now,
            30 * SECOND,
            SECOND,
            SECOND,
            20 * SECOND,
        );
        assert!(matches!(verdict, Verdict::Stalled(_)), "{verdict:?}");
    }

    #[test]
    fn a_new_walsender_is_not_compared_with_the_old_one() {
        let t = Instant::now();
        let mut before = activity(t, 50, WAIT_FOR_WAL);
        if let Some(w) = before.walsender.as_mut() {
            w.pid = 7;
        }
        let now = activity(t + 5 * SECOND, 100, WAIT_FOR_WAL);
        let verdict = judge(
            Some(&before),
            &now,
            30 * SECOND,
            SECOND,
            SECOND,
            20 * SECOND,
        );
        assert!(matches!(verdict, Verdict::CaughtUp(_)), "{verdict:?}");
    }

    #[test]
    fn escalation_grows_without_progress_and_resets_with_it() {
        let timeout = 10 * SECOND;
        let mut e = Escalation::default();
        let mut intervals = Vec::new();
        for _ in 0..6 {
            e.received(Lsn(100));
            intervals.push(e.required(timeout).as_secs());
            e.stalled(Lsn(100));
        }
        assert_eq!(intervals, [10, 20, 40, 80, 160, 160]);
        // Nothing new received after the reconnect: still escalated.
        e.received(Lsn(100));
        assert_eq!(e.required(timeout), 160 * SECOND);
        // Progress past the stall: back to the timeout.
        e.received(Lsn(101));
        assert_eq!(e.required(timeout), timeout);
    }

    #[test]
    fn stalls_without_progress_need_ever_longer_silence() {
        let timeout = 10 * SECOND;
        let needed: Vec<u64> = (0..7)
            .map(|n| required_silence(timeout, n).as_secs())
            .collect();
        assert_eq!(needed, [10, 20, 40, 80, 160, 160, 160]);
    }
}
