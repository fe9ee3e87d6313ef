//! The CopyBoth stream of a started replication session, read in the caller's task.
//!
//! # Invariants
//! - Cancel-safe: [`WireStream::next`] and [`WireStream::read_ahead`] keep everything they read
//!   in `inbuf` and `ahead` and everything still to be written in `out`; dropping their futures
//!   loses nothing.
//! - Messages are handed out in the order the server sent them: those read ahead (`ahead`)
//!   before what is still in `inbuf`.
//! - Reading ahead stops once `ahead` and `inbuf` hold the byte budget or
//!   [`MAX_AHEAD_MESSAGES`]: read ahead are at most the budget plus one read's worth (or one
//!   larger message). `inbuf` itself stays within one read's worth plus one message, so the
//!   receive buffer never grows (and is never copied) with the read-ahead; a message read ahead
//!   keeps only the chunk it was read into.
//! - `reported` is the position of the last status update fully written to the socket.
//! - A status update is queued whenever the socket is driven at or past its due time, whether
//!   or not the runtime has fired the timer yet: an update is late only by the longest stretch
//!   in which nothing drove the stream.

use super::error::{ProtocolViolation, WireError};
use super::frames::{self, CopyData, Frame};
use super::log_notice;
use super::socket::Socket;
use crate::sqlstate::SqlState;
use bytes::{Buf, Bytes, BytesMut};
use pgoutput::Lsn;
use postgres_protocol::message::backend::Message;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// SQLSTATE 55000 object_not_in_prerequisite_state: a `WARNING` with it raised by the output
/// plugin (`pgoutput.c`) on the replication stream is PostgreSQL 18's "skipped loading
/// publication": the publication did not exist where the changes being decoded were written,
/// and they were skipped. The walsender raises 55000 warnings of its own too (a slot in
/// `synchronized_standby_slots` without a walsender), which are only logged.
const PUBLICATION_SKIPPED: SqlState = SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE;
/// The source file of the output plugin, as the server names it in a notice's `F` field.
const OUTPUT_PLUGIN_FILE: &str = "pgoutput.c";
use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

/// How much room a read gets at least: reads fill what is free of this, so a busy stream is
/// read in few system calls.
const READ_CHUNK: usize = 128 * 1024;

/// Inside a transaction, a read that brought less than this...
const SMALL_READ: usize = 16 * 1024;

/// ...makes the next read wait this long, so the rest of the transaction is read in a few large
/// reads instead of one system call (and one wake-up) per message or two. While a read is held
/// the socket's receive low-water mark is raised to [`HOLD_LOW_WATER`], so the kernel does not
/// wake the process for every message that arrives meanwhile.
const READ_HOLD: Duration = Duration::from_millis(1);

/// The receive low-water mark while a read is held.
const HOLD_LOW_WATER: usize = 64 * 1024;
/// A position that moved is reported this long after the previous status update at the latest
/// (or at once, when that was longer ago), not only at the next status interval: the slot
/// advances, and the server can recycle WAL, soon after the records are acknowledged, while
/// status updates stay at most this frequent.
const PROMPT_STATUS: Duration = Duration::from_millis(100);

/// A status update that goes out this much later than its interval is logged, with how long
/// the stream went unpolled meanwhile: the server ends a replication connection that sends
/// nothing for `wal_sender_timeout`, so a late update says how close that came, and why.
const LATE_STATUS: Duration = Duration::from_secs(1);

/// Most messages read ahead: small messages cost little in bytes, but a deeper read-ahead
/// than this would only keep the server from being held back.
pub const MAX_AHEAD_MESSAGES: usize = 4096;

/// What the server sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// One pgoutput message, sent from WAL position `wal_start`.
    Data { wal_start: Lsn, data: Bytes },
    /// A keepalive: the server's WAL end.
    KeepAlive { wal_end: Lsn },
    /// The server ended the stream (after [`WireStream::finish`] asked it to).
    End,
}

/// A started logical replication stream.
pub struct WireStream {
    socket: Socket,
    inbuf: BytesMut,
    /// Whole messages read ahead while the caller took none, oldest first, with their sizes.
    ahead: VecDeque<(Frame, usize)>,
    /// The bytes of the messages in `ahead`.
    ahead_bytes: usize,
    /// Bytes to write: status updates, CopyDone.
    out: BytesMut,
    /// Whether written bytes may still sit in the TLS layer.
    unflushed: bool,
    /// The position to report.
    applied: Lsn,
    /// The position of the last status update appended to `out`.
    queued: Lsn,
    reported: Lsn,
    server_wal_end: Lsn,
    budget: usize,
    status_interval: Duration,
    /// When the next status update is due: the status interval after the last one, or
    /// sooner when the position moved (see [`PROMPT_STATUS`]).
    status_timer: Pin<Box<Sleep>>,
    /// When the last status update was queued.
    last_status: Instant,
    /// When a held read may go ahead (see [`READ_HOLD`]); `holding` says whether it is set.
    hold_timer: Pin<Box<Sleep>>,
    holding: bool,
    /// What happened since the last status update, for the log of a late one.
    since_status: SinceStatus,
}

/// How the stream was driven since the last status update.
#[derive(Debug, Clone, Copy)]
struct SinceStatus {
    /// When the socket was last driven ([`WireStream::poll_io`]).
    polled_at: Instant,
    /// The longest stretch without the socket driven.
    longest_unpolled: Duration,
    /// Messages handed out.
    handed_out: u64,
}

impl SinceStatus {
    fn new(now: Instant) -> Self {
        SinceStatus {
            polled_at: now,
            longest_unpolled: Duration::ZERO,
            handed_out: 0,
        }
    }

    fn polled(&mut self, now: Instant) {
        self.longest_unpolled = self
            .longest_unpolled
            .max(now.saturating_duration_since(self.polled_at));
        self.polled_at = now;
    }
}

impl WireStream {
    pub(super) fn new(
        socket: Socket,
        inbuf: BytesMut,
        start_lsn: Lsn,
        read_ahead_bytes: usize,
        status_interval: Duration,
    ) -> Self {
        let mut stream = WireStream {
            socket,
            inbuf,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            out: BytesMut::with_capacity(256),
            unflushed: false,
            applied: start_lsn,
            queued: start_lsn,
            reported: Lsn::ZERO,
            server_wal_end: Lsn::ZERO,
            budget: read_ahead_bytes.max(1),
            status_interval,
            status_timer: Box::pin(tokio::time::sleep(status_interval)),
            last_status: Instant::now(),
            hold_timer: Box::pin(tokio::time::sleep(READ_HOLD)),
            holding: false,
            since_status: SinceStatus::new(Instant::now()),
        };
        // The first status update goes out at once (as the server's own clients do).
        stream.queue_status(false);
        stream
    }

    /// Raises the position the next status updates report (lower positions are ignored); a
    /// raised one is reported within [`PROMPT_STATUS`] of the last status update.
    pub fn raise_applied(&mut self, lsn: Lsn) {
        if lsn <= self.applied {
            return;
        }
        self.applied = lsn;
        let prompt = self.last_status + PROMPT_STATUS;
        if prompt < self.status_timer.deadline() {
            // The next poll of the stream registers the earlier wake-up.
            self.status_timer.as_mut().reset(prompt.max(Instant::now()));
        }
    }

    /// The position of the last status update written to the socket.
    pub fn reported(&self) -> Lsn {
        self.reported
    }

    /// The server's WAL end, as last seen in any message.
    pub fn server_wal_end(&self) -> Lsn {
        self.server_wal_end
    }

    /// The next message of the stream. `in_transaction`: more of a transaction is on its way,
    /// so a small read may be followed by a short wait (at most [`READ_HOLD`]) for more bytes
    /// to arrive. Cancel-safe.
    pub async fn next(&mut self, in_transaction: bool) -> Result<Received, WireError> {
        loop {
            if let Some(received) = self.take_buffered()? {
                return Ok(received);
            }
            if !in_transaction {
                self.end_hold();
            }
            poll_fn(|cx| self.poll_io(cx, Read::Coalesced)).await?;
        }
    }

    /// Reads ahead into the buffer, up to the read-ahead budget, and keeps the status updates
    /// going, without handing anything out: what the caller awaits while it cannot take
    /// messages. Returns only on an error. Cancel-safe.
    pub async fn read_ahead(&mut self) -> WireError {
        self.end_hold();
        poll_fn(|cx| loop {
            // Whole messages leave the receive buffer at once, so it stays one chunk.
            loop {
                let before = self.inbuf.len();
                match frames::split(&mut self.inbuf) {
                    Ok(Some(frame)) => {
                        let size = before - self.inbuf.len();
                        self.ahead_bytes += size;
                        self.ahead.push_back((frame, size));
                    }
                    Ok(None) => break,
                    Err(violation) => return Poll::Ready(violation.into()),
                }
            }
            let room = self.ahead_bytes + self.inbuf.len() < self.budget
                && self.ahead.len() < MAX_AHEAD_MESSAGES;
            let read = if room { Read::Now } else { Read::No };
            match self.poll_io(cx, read) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(error)) => return Poll::Ready(error),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }

    /// Reports `applied` at once, ends the stream (CopyDone) and waits, up to `timeout`, for
    /// the server to end its side. Returns the position reported.
    pub async fn finish(mut self, timeout: Duration) -> Result<Lsn, WireError> {
        self.queue_status(false);
        postgres_protocol::message::frontend::copy_done(&mut self.out);
        let ending = async {
            loop {
                match self.next(false).await? {
                    Received::End => break,
                    Received::Data { .. } | Received::KeepAlive { .. } => {}
                }
            }
            // Flush whatever is left (the server may end before it read our CopyDone).
            poll_fn(|cx| self.poll_flush_out(cx)).await?;
            Ok::<_, WireError>(())
        };
        match tokio::time::timeout(timeout, ending).await {
            Ok(ended) => ended?,
            Err(_) => tracing::debug!("the server did not end the replication stream in time"),
        }
        let mut terminate = BytesMut::with_capacity(5);
        postgres_protocol::message::frontend::terminate(&mut terminate);
        self.out.extend_from_slice(&terminate);
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            poll_fn(|cx| self.poll_flush_out(cx)),
        )
        .await;
        Ok(self.reported)
    }

    /// The next message already in the buffer, if a whole one is there.
    fn take_buffered(&mut self) -> Result<Option<Received>, WireError> {
        while let Some(frame) = self.next_message()? {
            let (tag, message) = match frame {
                Frame::CopyData(body) => {
                    return Ok(Some(match frames::copy_data(body)? {
                        CopyData::XLogData {
                            wal_start,
                            wal_end,
                            data,
                        } => {
                            self.server_wal_end = self.server_wal_end.max(wal_end);
                            self.since_status.handed_out += 1;
                            Received::Data { wal_start, data }
                        }
                        CopyData::KeepAlive {
                            wal_end,
                            reply_requested,
                        } => {
                            self.server_wal_end = self.server_wal_end.max(wal_end);
                            if reply_requested {
                                self.queue_status(false);
                            }
                            Received::KeepAlive { wal_end }
                        }
                    }))
                }
                Frame::Message { tag, message } => (tag, *message),
                Frame::Unknown { tag } => return Err(unexpected(tag)),
            };
            match message {
                Message::ErrorResponse(body) => {
                    return Err(WireError::Server(Box::new(frames::server_error(
                        body.fields(),
                    ))))
                }
                Message::NoticeResponse(body) => {
                    let notice = frames::server_error(body.fields());
                    if notice.code == PUBLICATION_SKIPPED
                        && notice.severity == "WARNING"
                        && notice.source_file.as_deref() == Some(OUTPUT_PLUGIN_FILE)
                    {
                        return Err(WireError::PublicationSkipped(Box::new(notice)));
                    }
                    log_notice(&notice);
                }
                // CopyDone, then CommandComplete and ReadyForQuery: the server ended the stream.
                Message::CopyDone | Message::CommandComplete(_) | Message::ReadyForQuery(_) => {
                    return Ok(Some(Received::End))
                }
                _ => return Err(unexpected(tag)),
            }
        }
        Ok(None)
    }

    /// Holds the next read for [`READ_HOLD`], with the low-water mark raised meanwhile.
    fn start_hold(&mut self) {
        self.holding = true;
        self.hold_timer.as_mut().reset(Instant::now() + READ_HOLD);
        if let Err(error) = self.socket.set_receive_low_water(HOLD_LOW_WATER) {
            tracing::debug!(%error, "could not raise the receive low-water mark");
        }
    }

    /// Ends a held read: the socket is reported readable at the first byte again.
    fn end_hold(&mut self) {
        if std::mem::take(&mut self.holding) {
            if let Err(error) = self.socket.set_receive_low_water(1) {
                tracing::debug!(%error, "could not reset the receive low-water mark");
            }
        }
    }

    /// The oldest whole message: one read ahead, or the next in the receive buffer.
    fn next_message(&mut self) -> Result<Option<Frame>, ProtocolViolation> {
        if let Some((frame, size)) = self.ahead.pop_front() {
            self.ahead_bytes -= size;
            return Ok(Some(frame));
        }
        frames::split(&mut self.inbuf)
    }

    /// Appends a status update reporting `applied` and restarts the status interval.
    fn queue_status(&mut self, reply_requested: bool) {
        let now_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        frames::status_update(&mut self.out, self.applied, now_micros, reply_requested);
        self.queued = self.applied;
        let now = Instant::now();
        let gap = now.saturating_duration_since(self.last_status);
        if gap > self.status_interval + LATE_STATUS {
            let mut since = self.since_status;
            since.polled(now);
            tracing::warn!(
                gap_ms = gap.as_millis() as u64,
                unpolled_ms = since.longest_unpolled.as_millis() as u64,
                handed_out = since.handed_out,
                "a status update to the server went out late: the server ends a replication \
                 connection that sends none for wal_sender_timeout; unpolled_ms is the longest \
                 stretch in which the stream was not driven (the process starved of CPU, or its \
                 loop busy elsewhere)"
            );
        }
        self.since_status = SinceStatus::new(now);
        self.last_status = now;
        let next = self.last_status + self.status_interval;
        self.status_timer.as_mut().reset(next);
    }

    /// Drives the socket once: a due status update is queued, pending bytes are written, and
    /// (unless `read` says no) what the socket has is appended to `inbuf`. Ready when something
    /// was read.
    fn poll_io(&mut self, cx: &mut Context<'_>, read: Read) -> Poll<Result<(), WireError>> {
        let now = Instant::now();
        self.since_status.polled(now);
        // The deadline is read off the clock as well: the runtime fires a timer only between
        // polls of its tasks, so under a loop that always finds work (a backlog, on a starved
        // machine) the timer's own wake-up can come seconds late.
        if now >= self.status_timer.deadline() || self.status_timer.as_mut().poll(cx).is_ready() {
            self.queue_status(false);
            // Register the restarted timer's wake-up.
            let _ = self.status_timer.as_mut().poll(cx);
        }
        if let Poll::Ready(Err(error)) = self.poll_flush_out(cx) {
            return Poll::Ready(Err(error));
        }
        match read {
            Read::No => return Poll::Pending,
            Read::Coalesced if self.holding => {
                if self.hold_timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.end_hold();
            }
            Read::Coalesced | Read::Now => {}
        }
        let missing = frames::missing(&self.inbuf)?;
        if self.inbuf.capacity() - self.inbuf.len() < missing.max(READ_CHUNK / 4) {
            self.inbuf.reserve(missing.max(READ_CHUNK));
        }
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.socket), cx, &mut self.inbuf) {
            Poll::Ready(Ok(0)) => Poll::Ready(Err(WireError::Closed)),
            Poll::Ready(Ok(bytes)) => {
                if read == Read::Coalesced && bytes < SMALL_READ {
                    self.start_hold();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Writes what is queued; Ready once all of it reached the socket.
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WireError>> {
        while !self.out.is_empty() {
            match Pin::new(&mut self.socket).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(WireError::Closed)),
                Poll::Ready(Ok(written)) => {
                    self.out.advance(written);
                    self.unflushed = true;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.unflushed {
            match Pin::new(&mut self.socket).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.reported = self.queued;
        Poll::Ready(Ok(()))
    }
}

/// A message type that does not belong in the replication stream.
fn unexpected(tag: u8) -> WireError {
    WireError::Protocol(ProtocolViolation::Unexpected {
        tag: char::from(tag),
        during: "in the replication stream",
    })
}

/// Whether [`WireStream::poll_io`] reads the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Not now (the read-ahead budget is full).
    No,
    /// Whatever the socket has.
    Now,
    /// Whatever the socket has, unless a small read inside a transaction asked to hold.
    Coalesced,
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A stream over a loopback connection, and the server's end of it.
    async fn connected(budget: usize, status_interval: Duration) -> (WireStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(address), listener.accept());
        let stream = WireStream::new(
            Socket::Plain(client.unwrap()),
            BytesMut::new(),
            Lsn(0x10),
            budget,
            status_interval,
        );
        (stream, server.unwrap().0)
    }

    /// An XLogData message carrying `payload`, as the server sends it.
    fn xlogdata(wal_start: u64, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![b'w'];
        body.extend(wal_start.to_be_bytes());
        body.extend((wal_start + 100).to_be_bytes());
        body.extend(0i64.to_be_bytes());
        body.extend(payload);
        let mut message = vec![b'd'];
        message.extend((body.len() as u32 + 4).to_be_bytes());
        message.extend(body);
        message
    }

    #[tokio::test]
    async fn messages_come_out_whole_and_in_order_however_the_bytes_arrive() {
        let (mut stream, mut server) = connected(1 << 20, Duration::from_secs(60)).await;
        let mut wire = Vec::new();
        for i in 0..50u64 {
            wire.extend(xlogdata(i, &vec![i as u8; (i * 37 % 500) as usize]));
        }
        let feeder = tokio::spawn(async move {
            for piece in wire.chunks(7) {
                server.write_all(piece).await.unwrap();
                server.flush().await.unwrap();
            }
            server
        });
        for i in 0..50u64 {
            match stream.next(false).await.unwrap() {
                Received::Data { wal_start, data } => {
                    assert_eq!(wal_start, Lsn(i));
                    assert_eq!(&data[..], &vec![i as u8; (i * 37 % 500) as usize][..]);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(stream.server_wal_end(), Lsn(49 + 100));
        drop(feeder.await.unwrap());
    }

    #[tokio::test]
    async fn a_small_read_inside_a_transaction_holds_the_next_read_and_outside_does_not() {
        let (mut stream, mut server) = connected(1 << 20, Duration::from_secs(60)).await;
        server.write_all(&xlogdata(1, b"B")).await.unwrap();
        assert!(matches!(
            stream.next(true).await.unwrap(),
            Received::Data { .. }
        ));
        assert!(
            stream.holding,
            "a small read inside a transaction holds the next one"
        );
        let held_since = Instant::now();
        server.write_all(&xlogdata(2, b"I")).await.unwrap();
        assert!(matches!(
            stream.next(true).await.unwrap(),
            Received::Data {
                wal_start: Lsn(2),
                ..
            }
        ));
        assert!(
            held_since.elapsed() >= READ_HOLD,
            "the read waited for the hold"
        );
        // Outside a transaction the hold is dropped: the next message is read as it comes.
        assert!(stream.holding);
        server.write_all(&xlogdata(3, b"C")).await.unwrap();
        // (The low-water mark of the hold is reset: a few bytes wake the reader again.)
        let read = tokio::time::timeout(Duration::from_secs(5), stream.next(false)).await;
        assert!(matches!(
            read.expect("a small message outside a transaction is read at once")
                .unwrap(),
            Received::Data {
                wal_start: Lsn(3),
                ..
            }
        ));
        let mut big = Vec::new();
        while big.len() < SMALL_READ * 2 {
            big.extend(xlogdata(4, &[7; 1000]));
        }
        server.write_all(&big).await.unwrap();
        // Let all of it arrive, so one read takes more than SMALL_READ: no hold after it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        stream.end_hold();
        assert!(matches!(
            stream.next(true).await.unwrap(),
            Received::Data { .. }
        ));
        assert!(!stream.holding, "a large read does not hold the next one");
    }

    /// Reads status updates from the server's end until one reports `lsn`; returns how many.
    async fn updates_until(server: &mut TcpStream, lsn: u64) -> usize {
        let mut buf = [0u8; 39];
        for updates in 1.. {
            server.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf[..6], &[b'd', 0, 0, 0, 38, b'r']);
            if u64::from_be_bytes(buf[6..14].try_into().unwrap()) == lsn {
                return updates;
            }
        }
        unreachable!()
    }

    #[tokio::test]
    async fn a_moved_position_is_reported_promptly_and_updates_stay_spaced() {
        let (mut stream, mut server) = connected(1 << 20, Duration::from_secs(60)).await;
        let started = Instant::now();
        for lsn in 0x20..0x40 {
            stream.raise_applied(Lsn(lsn));
        }
        let mut reader = tokio::spawn(async move {
            // The first status update goes out at once, the raised position after the gap.
            let first = updates_until(&mut server, 0x10).await;
            let raised = updates_until(&mut server, 0x3F).await;
            // The server's end is handed back, not dropped: the stream must not see it close.
            (first, raised, started.elapsed(), server)
        });
        let (first, raised, after, _server) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::select! {
                biased;
                done = &mut reader => done.unwrap(),
                received = stream.next(false) => panic!("the server sent nothing: {received:?}"),
            }
        })
        .await
        .expect("the raised position is reported long before the 60 s status interval");
        assert_eq!((first, raised), (1, 1), "one update for all the raises");
        assert!(after >= PROMPT_STATUS / 2, "reported after {after:?}");
    }

    /// A loop that keeps driving the stream without ever handing the runtime a turn (what a
    /// backlog drained on a starved machine looks like to the runtime, which fires timers only
    /// between polls of its tasks) still sends its status updates on time.
    #[tokio::test]
    async fn status_updates_go_out_on_time_while_the_runtime_gets_no_turn() {
        let interval = Duration::from_millis(20);
        let (mut stream, mut server) = connected(1 << 20, interval).await;
        let spin = Duration::from_millis(300);
        let until = std::time::Instant::now() + spin;
        while std::time::Instant::now() < until {
            // Unconstrained: the runtime's cooperative budget would otherwise make the socket
            // look busy after a few polls; this thread never yields, so no timer fires.
            let next = tokio::task::unconstrained(stream.next(false)).now_or_never();
            assert!(next.is_none(), "the server sent nothing: {next:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut buf = [0u8; 39];
        let mut updates = 0;
        while tokio::time::timeout(Duration::from_millis(50), server.read_exact(&mut buf))
            .await
            .is_ok()
        {
            assert_eq!(&buf[..6], &[b'd', 0, 0, 0, 38, b'r']);
            updates += 1;
        }
        let due = (spin.as_millis() / interval.as_millis()) as usize;
        assert!(
            updates >= due / 2,
            "{updates} status updates in {spin:?} at a {interval:?} interval (at least {} due)",
            due / 2
        );
    }

    #[tokio::test]
    async fn reading_ahead_stops_at_the_budget_and_status_updates_keep_going() {
        let budget = 64 * 1024;
        let (mut stream, server) = connected(budget, Duration::from_millis(20)).await;
        stream.raise_applied(Lsn(0x99));
        let mut wire = Vec::new();
        while wire.len() < budget * 8 {
            wire.extend(xlogdata(5, &[1; 2000]));
        }
        let total = wire.len();
        let writer = tokio::spawn(async move {
            let (mut reader, mut writer) = server.into_split();
            // The client reads only up to its budget, so this completes once it reads on.
            let sent = tokio::spawn(async move {
                writer.write_all(&wire).await.unwrap();
                writer
            });
            // Status updates arrive while the client reads nothing.
            let mut updates = 0;
            let mut buf = vec![0u8; 39];
            while updates < 5 {
                reader.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf[..6], &[b'd', 0, 0, 0, 38, b'r']);
                updates += 1;
            }
            (
                sent,
                updates,
                u64::from_be_bytes(buf[6..14].try_into().unwrap()),
            )
        });
        let _ = tokio::time::timeout(Duration::from_millis(600), stream.read_ahead()).await;
        let (sent, updates, reported) = writer.await.unwrap();
        assert_eq!((updates, reported), (5, 0x99));
        let read_ahead = stream.ahead_bytes + stream.inbuf.len();
        assert!(
            read_ahead < budget + READ_CHUNK,
            "read {read_ahead} bytes ahead with a budget of {budget}"
        );
        assert!(read_ahead >= budget, "read ahead up to the budget");
        assert!(read_ahead < total);
        assert!(
            stream.inbuf.len() < READ_CHUNK + 2100,
            "the receive buffer grew to {} bytes",
            stream.inbuf.len()
        );
        // What was read ahead comes out first, in order, then the rest.
        let expected_messages = total / xlogdata(5, &[1; 2000]).len();
        let mut seen = 0;
        while seen < expected_messages {
            match tokio::time::timeout(Duration::from_secs(5), stream.next(false)).await {
                Ok(Ok(Received::Data {
                    wal_start: Lsn(5),
                    data,
                })) => assert_eq!(data.len(), 2000),
                other => panic!("message {seen}: {other:?}"),
            }
            seen += 1;
        }
        drop(sent.await.unwrap());
        assert_eq!(stream.reported(), Lsn(0x99));
    }
}
