//! Delivery reports served on the caller's own task, woken by the producer's queue.
//!
//! librdkafka puts delivery reports (and client errors) on a producer's main queue, to be
//! served by whoever polls it. Instead of a thread that polls it (a third thread per producer,
//! and a hand-off per batch of reports), the queue writes to an `eventfd` when it goes from
//! empty to non-empty; the session's task waits for that descriptor beside its other work
//! ([`ReportWakeup::ready`]) and serves the queue there ([`ReportWakeup::serve`]).
//!
//! # Invariants
//! - librdkafka writes to the descriptor only while the wake-up is enabled. It is disabled
//!   (under the queue's lock) before the descriptor is closed, so a producer that outlives this
//!   (held by a broker probe) never writes to a closed, or reused, descriptor.
//! - The queue handle is released before the producer reference taken with it.
//! - No report waits unseen: librdkafka writes once per served period (serving resets its
//!   flag), and only when the queue goes from empty to non-empty; the descriptor starts
//!   readable (for what was queued before wake-ups were enabled) and [`ReportWakeup::serve`]
//!   serves until the queue is empty, so a report queued after it writes the descriptor
//!   again; [`ReportWakeup::ready`] reads the descriptor before its caller serves, so a write
//!   after that read is seen by the next wait.
//! - The only `unsafe` is librdkafka's queue calls on a handle owned here and the `eventfd`
//!   calls on a descriptor owned here.
//! - A failure to set the wake-up up is a [`WakeupError`] naming the step and the system's
//!   error number: it is retried (the producer is created again), never read by its text.
#![allow(unsafe_code)]

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::warn;

/// The value librdkafka adds to the `eventfd` counter on each wake-up (8 bytes, as an
/// `eventfd` write must be).
const WAKE: u64 = 1;

/// Why the wake-up for a producer's delivery reports could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WakeupError {
    /// `eventfd` failed (out of descriptors or memory).
    #[error("creating an eventfd: {0}")]
    EventFd(OsError),
    /// The runtime could not watch the descriptor.
    #[error("registering the eventfd with the runtime: {0}")]
    Register(OsError),
    /// librdkafka gave no handle of the producer's main queue.
    #[error("librdkafka gave no main queue")]
    NoMainQueue,
}

/// An operating system error, by its number (`errno`) when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsError {
    pub kind: io::ErrorKind,
    pub errno: Option<i32>,
}

impl From<&io::Error> for OsError {
    fn from(error: &io::Error) -> Self {
        OsError {
            kind: error.kind(),
            errno: error.raw_os_error(),
        }
    }
}

impl std::fmt::Display for OsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.errno {
            // The system's own text for the number.
            Some(errno) => io::Error::from_raw_os_error(errno).fmt(f),
            None => self.kind.fmt(f),
        }
    }
}

/// A producer's main queue, waking a task through an `eventfd`.
pub(crate) struct ReportWakeup<C: ProducerContext + 'static> {
    queue: QueueHandle,
    eventfd: AsyncFd<OwnedFd>,
    producer: Arc<BaseProducer<C>>,
}

/// librdkafka's handle of a queue.
struct QueueHandle(NonNull<rd::rd_kafka_queue_t>);

// SAFETY: librdkafka's queues are locked internally; their handles may be used from any thread.
unsafe impl Send for QueueHandle {}
// SAFETY: as above.
unsafe impl Sync for QueueHandle {}

impl<C: ProducerContext + 'static> ReportWakeup<C> {
    /// Enables wake-ups on `producer`'s main queue. Must run inside a Tokio runtime.
    pub(crate) fn new(producer: Arc<BaseProducer<C>>) -> Result<Self, WakeupError> {
        // SAFETY: `eventfd` takes no pointers; a valid descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(WakeupError::EventFd(OsError::from(
                &io::Error::last_os_error(),
            )));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an `OwnedFd` keeps its one descriptor open until it is dropped with the
        // `AsyncFd`.
        let eventfd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| WakeupError::Register(OsError::from(&e.into_parts().1)))?;
        // SAFETY: the client pointer is valid while `producer` is, which this holds; the
        // returned handle is a new reference, released in `drop`.
        let queue = unsafe { rd::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        let queue = NonNull::new(queue)
            .map(QueueHandle)
            .ok_or(WakeupError::NoMainQueue)?;
        let payload = WAKE.to_ne_bytes();
        // SAFETY: the handle is valid; librdkafka copies `payload`, and writes to the
        // descriptor only until it is disabled in `drop`, before the descriptor closes.
        unsafe {
            rd::rd_kafka_queue_io_event_enable(
                queue.0.as_ptr(),
                eventfd.get_ref().as_raw_fd(),
                payload.as_ptr().cast(),
                payload.len(),
            );
        }
        let wakeup = ReportWakeup {
            queue,
            eventfd,
            producer,
        };
        // librdkafka writes only when the queue goes from empty to non-empty: what it queued
        // before (its log lines from creation) would keep any later report from waking anyone.
        // The first wait returns at once, and serving empties the queue.
        wakeup.wake();
        Ok(wakeup)
    }

    /// Makes the next [`ReportWakeup::ready`] return.
    fn wake(&self) {
        let counter = WAKE.to_ne_bytes();
        // SAFETY: the descriptor is open (owned here) and the buffer is 8 readable bytes. A
        // failed write (the counter at its maximum) leaves the descriptor readable anyway.
        unsafe {
            libc::write(
                self.eventfd.get_ref().as_raw_fd(),
                counter.as_ptr().cast(),
                counter.len(),
            )
        };
    }

    /// Returns once the queue may hold something to serve. Cancel-safe.
    pub(crate) async fn ready(&self) {
        loop {
            let mut guard = match self.eventfd.readable().await {
                Ok(guard) => guard,
                Err(error) => {
                    // Only when the runtime is shutting down: serve now and then.
                    warn!(%error, "waiting for Kafka delivery reports failed; polling instead");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    return;
                }
            };
            match guard.try_io(|fd| read_eventfd(fd.get_ref())) {
                Ok(_) => return,
                // Nothing was written since the last read: wait again.
                Err(_would_block) => continue,
            }
        }
    }

    /// Serves the queue until it is empty: each report reaches the producer's context.
    pub(crate) fn serve(&self) {
        loop {
            self.producer.poll(Duration::ZERO);
            // SAFETY: the handle is valid until `drop`.
            if unsafe { rd::rd_kafka_queue_length(self.queue.0.as_ptr()) } == 0 {
                return;
            }
        }
    }
}

impl<C: ProducerContext + 'static> Drop for ReportWakeup<C> {
    fn drop(&mut self) {
        // SAFETY: the handle is valid; disabling takes the queue's lock, so no write to the
        // descriptor is under way or follows; then the handle is released, once.
        unsafe {
            rd::rd_kafka_queue_io_event_enable(self.queue.0.as_ptr(), -1, std::ptr::null(), 0);
            rd::rd_kafka_queue_destroy(self.queue.0.as_ptr());
        }
        // The descriptor closes after this, and the producer reference goes with the fields.
    }
}

/// Reads (and so resets) the `eventfd` counter; `WouldBlock` when nothing was written.
fn read_eventfd(fd: &OwnedFd) -> io::Result<u64> {
    let mut counter = [0u8; 8];
    // SAFETY: the descriptor is open (borrowed) and the buffer is 8 writable bytes.
    let read = unsafe { libc::read(fd.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len()) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(counter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::DefaultProducerContext;

    /// librdkafka writes only when its queue goes from empty to non-empty: a producer whose
    /// queue already holds log lines when wake-ups are enabled must still wake the task.
    #[tokio::test(flavor = "current_thread")]
    async fn a_queue_holding_events_before_wake_ups_were_enabled_still_wakes() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let producer: BaseProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", format!("127.0.0.1:{port}"))
            .set("debug", "all")
            .create()
            .expect("a producer");
        let producer = Arc::new(producer);
        // Its broker threads log (to the main queue) while nobody serves it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let wakeup = ReportWakeup::new(Arc::clone(&producer)).expect("wake-ups");
        tokio::time::timeout(Duration::from_secs(5), wakeup.ready())
            .await
            .expect("woken for what the queue held before");
        wakeup.serve();
        // Later reports wake it again, each time after it was served empty.
        for _ in 0..3 {
            let record = rdkafka::producer::BaseRecord::<[u8], [u8]>::to("t").payload(&b"v"[..]);
            producer.send(record).map_err(|(e, _)| e).expect("queued");
            producer.purge(rdkafka::producer::PurgeConfig::default().queue());
            tokio::time::timeout(Duration::from_secs(5), wakeup.ready())
                .await
                .expect("woken for the purged record's report");
            wakeup.serve();
        }
    }
}
