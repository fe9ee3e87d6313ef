//! A throttling TCP proxy on 127.0.0.1, and a Kafka broker that clients can
//! only reach through one: a slow or stalled broker on demand.
//!
//! [`ThrottlingProxy`] forwards every connection it accepts to one target
//! address. Each direction has its own bandwidth limit (a token bucket shared
//! by all connections, adjustable at run time), and forwarding can be paused
//! and resumed as a whole. Paused or throttled bytes stay in the kernel's
//! socket buffers, so TCP flow control holds back the sender, as a slow
//! network or broker would.
//!
//! Kafka clients learn broker addresses from metadata and connect to those,
//! not to the bootstrap address. [`ProxiedBroker`] therefore puts a Kafka-mode
//! proxy in front of the shared Kafka broker that rewrites the broker's port
//! into its own in every Metadata and FindCoordinator answer, and in the new
//! leaders that Produce and Fetch answers name (KIP-951): after bootstrap,
//! every connection of the test's clients still goes through the proxy, while
//! other tests reach the broker directly. [`ClusterProxies`] does the same for
//! a cluster: one proxy per node, each rewriting every node's port into that
//! node's proxy's port.
//!
//! A proxy started with [`ThrottlingProxy::start_kafka`] also understands the
//! Kafka protocol's framing: while a [`ProduceFault`] is set, it answers the
//! Produce requests that match it itself, with the fault's error code, instead
//! of forwarding them (the broker never sees those records); every other
//! request is forwarded unchanged. Answers go back in request order, as Kafka
//! clients expect. A fault made with [`ProduceFault::hold`] answers nothing
//! instead: the matching request is kept aside (the client waits for an answer
//! that never comes, until it times out), and
//! [`ThrottlingProxy::release_held`] later hands it to the broker on a
//! connection of its own, so the broker writes those records after whatever
//! was written meanwhile: a request delivered late.
//!
//! [`ThrottlingProxy::hold_next_answer`] stalls the other direction: the
//! broker's first answer to a request of a given API key (EndTxn, say) is read
//! but never passed on, and neither is anything after it on that connection,
//! while the client's requests still reach the broker: a broker that did the
//! work but whose answer is lost. The connection stays open until the broker
//! or the client closes it.
//!
//! # Invariants
//!
//! - Only 127.0.0.1 is bound; the proxy's port is fixed for its lifetime.
//! - Bytes are forwarded unchanged and in order; an end of stream on one side
//!   is passed on as an end of stream (write shutdown) to the other. In Kafka
//!   mode, a Produce request matching the fault is not forwarded: the client
//!   gets an answer built by the proxy in its place, in order; or, for a
//!   holding fault, no answer at all (the answers of the requests after it
//!   still come in their order).
//! - In Kafka mode, a broker answer held by [`ThrottlingProxy::hold_next_answer`]
//!   never reaches the client, nor does anything after it on that connection;
//!   requests are still forwarded. At most one answer is held per arming, over
//!   all connections. The broker's side of a held connection is still read
//!   (and dropped), so its end of stream closes the client's side at once.
//! - An advertising proxy rewrites, in every Metadata, FindCoordinator,
//!   Produce and Fetch answer, each broker port of its map into that port's
//!   proxy port, in one pass (a rewritten port is not rewritten again); the
//!   map's broker ports are distinct.
//! - A held request reaches the broker only through
//!   [`ThrottlingProxy::release_held`], unchanged, once, in the order the
//!   requests were held; held requests outlive the client's connection.
//! - In Kafka mode a frame larger than [`MAX_FRAME`] closes the connection,
//!   so memory per connection stays bounded.
//! - Over any interval, a direction limited to `r` bytes/s forwards at most
//!   `r` bytes per second plus one burst (1/20 s of traffic, at least 512
//!   bytes).
//! - The proxy runs on its own Tokio runtime and threads, so it keeps
//!   forwarding while the test's own runtime is blocked, and it needs no
//!   runtime from its caller. Dropping it closes the listener and every
//!   connection.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::kafka_protocol::{
    encode_produce_response, parse_produce_request, parse_produce_response, replace_error_code,
    request_header, rewrite_broker_port_map, PartitionResponse, TopicResponse, PRODUCE,
};

/// Bytes read from a socket at once.
const CHUNK: usize = 64 * 1024;

/// Longest sleep while waiting for tokens, so rate changes and pauses take
/// effect promptly.
const MAX_WAIT: Duration = Duration::from_millis(50);

/// A direction of traffic through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the connecting client to the target (requests, for Kafka).
    ToServer,
    /// From the target back to the client (responses).
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToServer => 0,
            Direction::ToClient => 1,
        }
    }
}

/// A token bucket: the bandwidth limit of one direction.
struct Link {
    /// Bytes per second; 0 means unlimited.
    rate: AtomicU64,
    bucket: Mutex<Bucket>,
    forwarded: AtomicU64,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The most tokens a bucket holds: 1/20 s of traffic, at least 512 bytes.
fn burst_of(rate: u64) -> f64 {
    (rate as f64 / 20.0).max(512.0)
}

impl Link {
    fn new() -> Link {
        Link {
            rate: AtomicU64::new(0),
            bucket: Mutex::new(Bucket {
                tokens: 0.0,
                last: Instant::now(),
            }),
            forwarded: AtomicU64::new(0),
        }
    }

    fn bucket(&self) -> MutexGuard<'_, Bucket> {
        // A poisoned lock only means a panic elsewhere; the bucket is two numbers.
        self.bucket.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until some of `want` bytes may be forwarded (and the proxy is
    /// not paused); returns how many, between 1 and `want`.
    async fn acquire(&self, want: usize, paused: &mut watch::Receiver<bool>) -> usize {
        loop {
            if *paused.borrow_and_update() {
                // Err: the proxy is being dropped; nothing will be forwarded.
                if paused.wait_for(|p| !*p).await.is_err() {
                    std::future::pending::<()>().await;
                }
                continue;
            }
            let rate = self.rate.load(Ordering::Relaxed);
            if rate == 0 {
                return want;
            }
            let wait = {
                let mut bucket = self.bucket();
                let now = Instant::now();
                let burst = burst_of(rate);
                bucket.tokens = (bucket.tokens
                    + now.duration_since(bucket.last).as_secs_f64() * rate as f64)
                    .min(burst);
                bucket.last = now;
                // Wait for a reasonable piece rather than trickling single bytes.
                let need = (want as f64).min(burst).clamp(1.0, 4096.0);
                if bucket.tokens >= need {
                    let granted = (bucket.tokens.floor() as usize).min(want);
                    bucket.tokens -= granted as f64;
                    return granted;
                }
                Duration::from_secs_f64((need - bucket.tokens) / rate as f64)
            };
            tokio::select! {
                _ = tokio::time::sleep(wait.min(MAX_WAIT)) => {}
                _ = paused.changed() => {}
            }
        }
    }
}

/// The largest Kafka frame the proxy reads in Kafka mode (librdkafka's default
/// `message.max.bytes` is 1 MB; the broker's default request limit is 100 MB).
pub const MAX_FRAME: usize = 100 * 1024 * 1024;

/// `NOT_LEADER_OR_FOLLOWER`: the answer for the partitions of an answered
/// Produce request that the fault does not match (the client retries them).
const NOT_LEADER_OR_FOLLOWER: i16 = 6;

/// Which Produce requests a Kafka-mode proxy answers itself, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceFault {
    /// Only records for this topic.
    pub topic: String,
    /// Only this partition (any when `None`).
    pub partition: Option<i32>,
    /// Only record batches whose bytes contain this (any batch when `None`):
    /// the batch's other records fail with it, as with a real broker.
    pub marker: Option<Vec<u8>>,
    /// What the proxy does with a matching request.
    pub action: FaultAction,
    /// The fault is cleared after the first request it matched.
    pub once: bool,
    /// How long the proxy's answer waits before it is sent (answers still go back in request
    /// order, so later requests are forwarded meanwhile and their answers wait behind it).
    pub answer_delay: Option<Duration>,
}

/// What a Kafka-mode proxy does with a Produce request its fault matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer it with this Kafka error code, e.g. 44 (POLICY_VIOLATION).
    Answer(i16),
    /// Keep it, unanswered, until [`ThrottlingProxy::release_held`].
    Hold,
}

impl ProduceFault {
    /// Every Produce to `topic` is answered with `error_code`.
    pub fn new(topic: &str, error_code: i16) -> Self {
        ProduceFault {
            topic: topic.to_owned(),
            partition: None,
            marker: None,
            action: FaultAction::Answer(error_code),
            once: false,
            answer_delay: None,
        }
    }

    /// Every Produce to `topic` is held: not forwarded, not answered, until
    /// [`ThrottlingProxy::release_held`].
    pub fn hold(topic: &str) -> Self {
        ProduceFault {
            topic: topic.to_owned(),
            partition: None,
            marker: None,
            action: FaultAction::Hold,
            once: false,
            answer_delay: None,
        }
    }

    /// Only partition `partition`.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Only batches containing `marker`.
    pub fn marker(mut self, marker: &[u8]) -> Self {
        self.marker = Some(marker.to_vec());
        self
    }

    /// Only the first matching request; the fault is cleared then.
    pub fn once(mut self) -> Self {
        self.once = true;
        self
    }

    /// The proxy's answer is sent `delay` after the request (see [`ProduceFault::answer_delay`]).
    pub fn answer_after(mut self, delay: Duration) -> Self {
        self.answer_delay = Some(delay);
        self
    }

    /// Whether the batch `records` for `topic`/`partition` is answered.
    pub fn matches(&self, topic: &str, partition: i32, records: &[u8]) -> bool {
        topic == self.topic
            && self.partition.is_none_or(|p| p == partition)
            && self.marker.as_ref().is_none_or(|m| {
                !m.is_empty() && records.windows(m.len()).any(|w| w == m.as_slice())
            })
    }
}

/// What the proxy does with one request in place of forwarding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intercept {
    /// Answer it with these bytes (a whole frame, size prefix included).
    Answer(Vec<u8>),
    /// Keep it aside, unanswered.
    Hold,
}

/// What the proxy does with the request `frame` (after the size prefix) in
/// place of forwarding it, if the fault matches one of its batches.
pub fn intercept(fault: &ProduceFault, frame: &[u8]) -> Option<Intercept> {
    let header = request_header(frame).ok()?;
    if header.api_key != PRODUCE {
        return None;
    }
    // A request the parser does not know is forwarded as it is.
    let request = parse_produce_request(frame).ok()?;
    let hit = request.topics.iter().any(|t| {
        t.partitions
            .iter()
            .any(|p| fault.matches(&t.name, p.partition, &p.records))
    });
    if !hit || request.acks == 0 {
        return None;
    }
    let error_code = match fault.action {
        FaultAction::Hold => return Some(Intercept::Hold),
        FaultAction::Answer(code) => code,
    };
    let topics: Vec<TopicResponse> = request
        .topics
        .iter()
        .map(|t| TopicResponse {
            name: t.name.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| PartitionResponse {
                    partition: p.partition,
                    error_code: if fault.matches(&t.name, p.partition, &p.records) {
                        error_code
                    } else {
                        NOT_LEADER_OR_FOLLOWER
                    },
                    error_message: None,
                })
                .collect(),
        })
        .collect();
    Some(Intercept::Answer(encode_produce_response(
        header.api_version,
        header.correlation_id,
        &topics,
    )))
}

struct Shared {
    links: [Link; 2],
    paused: watch::Sender<bool>,
    /// Pauses the proxy once a client sent bytes containing this (after passing them on).
    pause_after: Mutex<Option<Vec<u8>>>,
    accepted: AtomicU64,
    /// Whether connections are forwarded frame by frame (Kafka mode).
    kafka: bool,
    fault: Mutex<Option<ProduceFault>>,
    injected: AtomicU64,
    /// Requests held by a holding fault (whole frames), oldest first.
    held: Mutex<Vec<Vec<u8>>>,
    /// Bit `v` set once a Produce request of version `v` (< 64) was seen.
    produce_versions: AtomicU64,
    /// In Kafka mode, (a broker's port, its proxy's port) pairs: each broker port that
    /// Metadata, FindCoordinator, Produce or Fetch answers name is replaced with its proxy's
    /// (empty: answers are not rewritten).
    advertise: Vec<(u16, u16)>,
    /// Which request's answer is held or failed next (see [`ThrottlingProxy::hold_next_answer`]
    /// and [`ThrottlingProxy::fail_next_answer_to`]).
    answer_hold: Mutex<Option<AnswerHold>>,
    /// Broker answers held so far.
    answers_held: AtomicU64,
    /// Broker answers passed on with another error code so far.
    answers_failed: AtomicU64,
}

impl Shared {
    fn fault(&self) -> Option<ProduceFault> {
        self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn held(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        // A poisoned lock only means a panic elsewhere; the list stays whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn answer_hold(&self) -> MutexGuard<'_, Option<AnswerHold>> {
        // A poisoned lock only means a panic elsewhere; the value is replaced whole.
        self.answer_hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What becomes of the broker's answer to the request `frame` (after its size prefix) of
    /// `api_key`; `Some` at most once per arming, as the rule is disarmed here.
    fn take_answer_hold(&self, api_key: i16, frame: &[u8]) -> Option<AnswerAction> {
        let mut hold = self.answer_hold();
        if !hold.as_ref().is_some_and(|h| h.matches(api_key, frame)) {
            return None;
        }
        hold.take().map(|h| h.action)
    }
}

/// What a proxy does with the broker's answer to a request it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerAction {
    /// Keeps it (and everything after it on the connection) from the client.
    Hold,
    /// Passes it on with this top-level error code instead of the broker's.
    Fail(i16),
}

/// Which request's answer a proxy holds or fails next.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AnswerHold {
    api_key: i16,
    /// Only a request whose bytes contain this (any request of the key when `None`).
    marker: Option<Vec<u8>>,
    /// Only an EndTxn request that aborts its transaction.
    aborts_only: bool,
    action: AnswerAction,
}

impl AnswerHold {
    fn matches(&self, api_key: i16, frame: &[u8]) -> bool {
        api_key == self.api_key
            && self
                .marker
                .as_ref()
                .is_none_or(|m| !m.is_empty() && frame.windows(m.len()).any(|w| w == m.as_slice()))
            && (!self.aborts_only
                || crate::kafka_protocol::end_txn_commits(frame).is_ok_and(|commits| !commits))
    }
}

/// A TCP proxy from 127.0.0.1:`port` to a target address, with a bandwidth
/// limit per direction and pause/resume.
pub struct ThrottlingProxy {
    port: u16,
    target: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl ThrottlingProxy {
    /// Starts a proxy on a free port of 127.0.0.1, forwarding to `target`.
    pub fn start(target: SocketAddr) -> Result<ThrottlingProxy> {
        Self::start_on(crate::free_port(), target)
    }

    /// Starts a proxy on 127.0.0.1:`port`, forwarding to `target`. Nothing
    /// needs to listen on `target` yet: a connection that cannot reach it is
    /// closed.
    pub fn start_on(port: u16, target: SocketAddr) -> Result<ThrottlingProxy> {
        Self::start_mode(port, target, false, Vec::new())
    }

    /// Starts a Kafka-mode proxy on a free port of 127.0.0.1, forwarding to
    /// the broker at `target`: see [`ThrottlingProxy::set_produce_fault`].
    pub fn start_kafka(target: SocketAddr) -> Result<ThrottlingProxy> {
        Self::start_mode(crate::free_port(), target, true, Vec::new())
    }

    /// Like [`ThrottlingProxy::start_kafka`], also advertising itself: every Metadata,
    /// FindCoordinator, Produce or Fetch answer naming the target's port names the proxy's port
    /// instead, so a client that bootstraps through the proxy keeps every connection on it.
    pub fn start_kafka_advertised(target: SocketAddr) -> Result<ThrottlingProxy> {
        let port = crate::free_port();
        Self::start_mode(port, target, true, vec![(target.port(), port)])
    }

    /// Starts a Kafka-mode proxy on 127.0.0.1:`port`, forwarding to the broker at `target`,
    /// that rewrites ports by the map `ports` of (broker port, proxy port) pairs: in every
    /// Metadata, FindCoordinator, Produce or Fetch answer, each broker port of the map becomes
    /// its proxy port (see [`ClusterProxies`], which starts one such proxy per node of a
    /// cluster). The map's broker ports must be distinct; it need not name `target`'s port.
    pub fn start_kafka_advertising_on(
        port: u16,
        target: SocketAddr,
        ports: &[(u16, u16)],
    ) -> Result<ThrottlingProxy> {
        for (i, (broker_port, _)) in ports.iter().enumerate() {
            if ports[..i].iter().any(|(earlier, _)| earlier == broker_port) {
                bail!("proxy port map {ports:?}: broker port {broker_port} is mapped twice");
            }
        }
        Self::start_mode(port, target, true, ports.to_vec())
    }

    fn start_mode(
        port: u16,
        target: SocketAddr,
        kafka: bool,
        advertise: Vec<(u16, u16)>,
    ) -> Result<ThrottlingProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("throttling-proxy")
            .enable_all()
            .build()
            .context("building the proxy's runtime")?;
        // Bound here, outside any runtime, so that a taken port is reported to the caller.
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .with_context(|| format!("proxy: binding 127.0.0.1:{port}"))?;
        listener
            .set_nonblocking(true)
            .context("proxy: making the listener non-blocking")?;
        let shared = Arc::new(Shared {
            links: [Link::new(), Link::new()],
            paused: watch::channel(false).0,
            pause_after: Mutex::new(None),
            accepted: AtomicU64::new(0),
            kafka,
            fault: Mutex::new(None),
            injected: AtomicU64::new(0),
            held: Mutex::new(Vec::new()),
            produce_versions: AtomicU64::new(0),
            advertise,
            answer_hold: Mutex::new(None),
            answers_held: AtomicU64::new(0),
            answers_failed: AtomicU64::new(0),
        });
        runtime.spawn(accept_loop(listener, target, Arc::clone(&shared)));
        Ok(ThrottlingProxy {
            port,
            target,
            shared,
            runtime: Some(runtime),
        })
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where connections are forwarded.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Limits `direction` to `bytes_per_sec` (`None`: unlimited). Takes
    /// effect within 50 ms, on open connections too. A limit of 0 is taken
    /// as 1 byte/s; use [`ThrottlingProxy::pause`] to stop traffic.
    pub fn set_rate(&self, direction: Direction, bytes_per_sec: Option<u64>) {
        let rate = bytes_per_sec.map_or(0, |r| r.max(1));
        self.shared.links[direction.index()]
            .rate
            .store(rate, Ordering::Relaxed);
    }

    /// The limit of `direction` (`None`: unlimited).
    pub fn rate(&self, direction: Direction) -> Option<u64> {
        match self.shared.links[direction.index()]
            .rate
            .load(Ordering::Relaxed)
        {
            0 => None,
            r => Some(r),
        }
    }

    /// Stops forwarding in both directions; connections stay open and new
    /// ones are still accepted (their bytes wait too).
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Forwards again after [`ThrottlingProxy::pause`].
    /// Pauses the proxy, both ways and for every connection, right after a client's bytes
    /// containing `marker` were passed on (once): the server gets the request, its answer is
    /// held.
    pub fn pause_after_client_sends(&self, marker: &[u8]) {
        *self
            .shared
            .pause_after
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(marker.to_vec());
    }

    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Bytes forwarded in `direction` so far.
    pub fn forwarded(&self, direction: Direction) -> u64 {
        self.shared.links[direction.index()]
            .forwarded
            .load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// From now on (on open connections too), answers the Produce requests
    /// `fault` matches with its error code (`None`: forward everything).
    /// Only a proxy started with [`ThrottlingProxy::start_kafka`] looks.
    pub fn set_produce_fault(&self, fault: Option<ProduceFault>) {
        *self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// Produce requests answered by the proxy so far.
    pub fn faults_injected(&self) -> u64 {
        self.shared.injected.load(Ordering::Relaxed)
    }

    /// Produce requests held (by a [`ProduceFault::hold`]) and not released yet.
    pub fn held_requests(&self) -> usize {
        self.shared.held().len()
    }

    /// Sends every held request to the broker, oldest first, each unchanged on
    /// one new connection, and returns the broker's answers (per topic and
    /// partition, with its error codes). Blocks until answered (at most
    /// `timeout` per request); needs no runtime.
    pub fn release_held(&self, timeout: Duration) -> Result<Vec<Vec<TopicResponse>>> {
        let held = std::mem::take(&mut *self.shared.held());
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let mut broker = std::net::TcpStream::connect_timeout(&self.target, timeout)
            .with_context(|| format!("releasing held requests: connecting to {}", self.target))?;
        broker.set_read_timeout(Some(timeout))?;
        broker.set_write_timeout(Some(timeout))?;
        let mut answers = Vec::with_capacity(held.len());
        for frame in held {
            use std::io::{Read as _, Write as _};
            let header = request_header(&frame[4..])?;
            broker
                .write_all(&frame)
                .context("releasing a held request")?;
            let mut size = [0u8; 4];
            broker
                .read_exact(&mut size)
                .context("reading the answer to a released request")?;
            let mut answer = vec![0u8; usize::try_from(i32::from_be_bytes(size))?];
            broker
                .read_exact(&mut answer)
                .context("reading the answer to a released request")?;
            let (correlation_id, topics) = parse_produce_response(header.api_version, &answer)?;
            anyhow::ensure!(
                correlation_id == header.correlation_id,
                "the broker answered correlation id {correlation_id}, not {}",
                header.correlation_id
            );
            answers.push(topics);
        }
        Ok(answers)
    }

    /// The Produce versions clients used through this (Kafka-mode) proxy.
    pub fn produce_versions(&self) -> Vec<i16> {
        let seen = self.shared.produce_versions.load(Ordering::Relaxed);
        (0..64).filter(|v| seen & (1 << v) != 0).collect()
    }

    /// Arms a hold (replacing any armed one): the broker's answer to the first request of API
    /// key `api_key` (e.g. [`crate::kafka_protocol::END_TXN`]) sent from now on, on any
    /// connection, is read but not passed on to the client, and from then on nothing more
    /// reaches the client on that connection (answers go in request order), while the client's
    /// requests are still forwarded; the connection stays open until the broker or the client
    /// closes it. The hold is disarmed by that request. Only a Kafka-mode proxy looks.
    pub fn hold_next_answer(&self, api_key: i16) {
        *self.shared.answer_hold() = Some(AnswerHold {
            api_key,
            marker: None,
            aborts_only: false,
            action: AnswerAction::Hold,
        });
    }

    /// [`ThrottlingProxy::hold_next_answer`], only for a request whose bytes contain `marker`
    /// (e.g. a transactional id, which tells one producer's InitProducerId from another's).
    pub fn hold_next_answer_to(&self, api_key: i16, marker: &[u8]) {
        *self.shared.answer_hold() = Some(AnswerHold {
            api_key,
            marker: Some(marker.to_vec()),
            aborts_only: false,
            action: AnswerAction::Hold,
        });
    }

    /// [`ThrottlingProxy::hold_next_answer_to`] for EndTxn, only for a request that aborts its
    /// transaction (the coordinator aborts it; the producer never hears).
    pub fn hold_next_abort_answer_to(&self, marker: &[u8]) {
        *self.shared.answer_hold() = Some(AnswerHold {
            api_key: crate::kafka_protocol::END_TXN,
            marker: Some(marker.to_vec()),
            aborts_only: true,
            action: AnswerAction::Hold,
        });
    }

    /// Arms a failure (replacing any armed hold or failure): the first request of API key
    /// `api_key` (EndTxn, InitProducerId or SaslHandshake) sent from now on whose bytes contain `marker` is
    /// forwarded, so the broker acts on it, and the broker's answer reaches the client with
    /// `error_code` in place of its own top-level error code: e.g. a commit the coordinator
    /// completed, answered to the client as failed. Only a Kafka-mode proxy looks.
    pub fn fail_next_answer_to(&self, api_key: i16, marker: &[u8], error_code: i16) {
        *self.shared.answer_hold() = Some(AnswerHold {
            api_key,
            marker: Some(marker.to_vec()),
            aborts_only: false,
            action: AnswerAction::Fail(error_code),
        });
    }

    /// Broker answers passed on with another error code (by
    /// [`ThrottlingProxy::fail_next_answer_to`]) so far.
    pub fn answers_failed(&self) -> u64 {
        self.shared.answers_failed.load(Ordering::Relaxed)
    }

    /// Disarms a hold armed by [`ThrottlingProxy::hold_next_answer`] that nothing hit yet;
    /// connections already holding an answer stay as they are.
    pub fn clear_answer_hold(&self) {
        *self.shared.answer_hold() = None;
    }

    /// Broker answers held (by [`ThrottlingProxy::hold_next_answer`]) so far: counted when the
    /// answer arrives from the broker.
    pub fn answers_held(&self) -> u64 {
        self.shared.answers_held.load(Ordering::Relaxed)
    }
}

impl Drop for ThrottlingProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Does not block, so the proxy may be dropped inside async code.
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(listener: std::net::TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                if shared.kafka {
                    tokio::spawn(forward_kafka_connection(
                        client,
                        target,
                        Arc::clone(&shared),
                    ));
                } else {
                    tokio::spawn(forward_connection(client, target, Arc::clone(&shared)));
                }
            }
            // Out of file descriptors and the like: try again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn forward_connection(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(target).await else {
        // The target is down: closing the client's connection says so.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, &shared, Direction::ToServer),
        pump(server_read, client_write, &shared, Direction::ToClient),
    );
}

/// Copies one direction until end of stream or an error, then shuts down the
/// writing side.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    direction: Direction,
) {
    let link = &shared.links[direction.index()];
    let mut paused = shared.paused.subscribe();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut sent = 0;
        while sent < n {
            let granted = link.acquire(n - sent, &mut paused).await;
            if to.write_all(&buf[sent..sent + granted]).await.is_err() {
                return;
            }
            sent += granted;
            link.forwarded.fetch_add(granted as u64, Ordering::Relaxed);
        }
        if direction == Direction::ToServer {
            let mut pause_after = shared
                .pause_after
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let seen = pause_after.as_ref().is_some_and(|m| {
                !m.is_empty() && buf[..n].windows(m.len()).any(|w| w == m.as_slice())
            });
            if seen {
                *pause_after = None;
                shared.paused.send_replace(true);
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Who answers one request of a Kafka-mode connection.
enum Answer {
    /// The broker: its next response frame, answering a request of this API key and version;
    /// held (not passed on, nor anything after it) or failed as `action` says.
    Broker {
        api_key: i16,
        api_version: i16,
        action: Option<AnswerAction>,
    },
    /// The proxy, with these bytes, after this delay.
    Proxy(Vec<u8>, Option<Duration>),
}

/// Forwards a Kafka connection frame by frame, answering the Produce requests
/// the fault matches, and keeping answers in request order.
async fn forward_kafka_connection(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (answers, answers_rx) = mpsc::unbounded_channel();
    tokio::join!(
        kafka_requests(client_read, server_write, &shared, answers),
        kafka_responses(server_read, client_write, &shared, answers_rx),
    );
}

/// Reads one size-prefixed frame (prefix included); `None` at end of stream,
/// on an error or for a frame over [`MAX_FRAME`].
async fn read_frame(from: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    from.read_exact(&mut size).await.ok()?;
    let len = usize::try_from(i32::from_be_bytes(size)).ok()?;
    if len > MAX_FRAME {
        return None;
    }
    let mut frame = vec![0u8; 4 + len];
    frame[..4].copy_from_slice(&size);
    from.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// Writes `bytes` within `direction`'s rate limit; false when the peer is gone.
async fn write_limited(
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    bytes: &[u8],
    shared: &Shared,
    direction: Direction,
    paused: &mut watch::Receiver<bool>,
) -> bool {
    let link = &shared.links[direction.index()];
    let mut sent = 0;
    while sent < bytes.len() {
        let granted = link.acquire(bytes.len() - sent, paused).await;
        if to.write_all(&bytes[sent..sent + granted]).await.is_err() {
            return false;
        }
        sent += granted;
        link.forwarded.fetch_add(granted as u64, Ordering::Relaxed);
    }
    true
}

async fn kafka_requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    answers: mpsc::UnboundedSender<Answer>,
) {
    let mut paused = shared.paused.subscribe();
    while let Some(frame) = read_frame(&mut from).await {
        if let Ok(header) = request_header(&frame[4..]) {
            if header.api_key == PRODUCE && (0..64).contains(&header.api_version) {
                shared
                    .produce_versions
                    .fetch_or(1 << header.api_version, Ordering::Relaxed);
            }
        }
        let fault = shared.fault();
        let intercepted = fault
            .as_ref()
            .and_then(|fault| intercept(fault, &frame[4..]));
        if let (Some(fault), Some(_)) = (&fault, &intercepted) {
            if fault.once {
                let mut current = shared.fault.lock().unwrap_or_else(|e| e.into_inner());
                if current.as_ref() == Some(fault) {
                    *current = None;
                }
            }
        }
        match intercepted {
            Some(Intercept::Answer(answer)) => {
                shared.injected.fetch_add(1, Ordering::Relaxed);
                let delay = fault.and_then(|f| f.answer_delay);
                if answers.send(Answer::Proxy(answer, delay)).is_err() {
                    break;
                }
                continue;
            }
            Some(Intercept::Hold) => {
                shared.held().push(frame);
                continue;
            }
            None => {}
        }
        // A Produce with acks=0 gets no answer from the broker.
        let answered = match crate::kafka_protocol::parse_produce_request(&frame[4..]) {
            Ok(produce) => produce.acks != 0,
            Err(_) => true,
        };
        let (api_key, api_version) =
            request_header(&frame[4..]).map_or((-1, -1), |h| (h.api_key, h.api_version));
        let answer = Answer::Broker {
            api_key,
            api_version,
            action: answered
                .then(|| shared.take_answer_hold(api_key, &frame[4..]))
                .flatten(),
        };
        if answered && answers.send(answer).is_err() {
            break;
        }
        if !write_limited(&mut to, &frame, shared, Direction::ToServer, &mut paused).await {
            break;
        }
    }
    let _ = to.shutdown().await;
}

async fn kafka_responses(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    mut answers: mpsc::UnboundedReceiver<Answer>,
) {
    let mut paused = shared.paused.subscribe();
    while let Some(answer) = answers.recv().await {
        let frame = match answer {
            Answer::Proxy(frame, delay) => {
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                frame
            }
            Answer::Broker {
                api_key,
                api_version,
                action,
            } => match read_frame(&mut from).await {
                Some(_) if action == Some(AnswerAction::Hold) => {
                    shared.answers_held.fetch_add(1, Ordering::Relaxed);
                    drop_answers(&mut from, &mut answers).await;
                    break;
                }
                Some(mut frame) => {
                    if let Some(AnswerAction::Fail(code)) = action {
                        // An answer the parser cannot read is passed on as it is, uncounted.
                        if replace_error_code(api_key, api_version, &mut frame, code).is_ok() {
                            shared.answers_failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if !shared.advertise.is_empty() {
                        // An answer the parser cannot read is passed on as it is.
                        let _ = rewrite_broker_port_map(
                            api_key,
                            api_version,
                            &mut frame,
                            &shared.advertise,
                        );
                    }
                    frame
                }
                None => break,
            },
        };
        if !write_limited(&mut to, &frame, shared, Direction::ToClient, &mut paused).await {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// After an answer was held: reads and drops whatever the broker sends and the answers still
/// expected, until the broker's side ends or the request side has stopped (the client's
/// side ended, or the broker's). Waits on both, so neither busy-loops nor misses the broker
/// going away while no answer is due.
async fn drop_answers(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    answers: &mut mpsc::UnboundedReceiver<Answer>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        // Both are cancel-safe: a byte read is dropped either way, and so is an answer.
        tokio::select! {
            read = from.read(&mut buf) => {
                if matches!(read, Ok(0) | Err(_)) {
                    return;
                }
            }
            answer = answers.recv() => {
                if answer.is_none() {
                    return;
                }
            }
        }
    }
}

/// How long [`ProxiedBroker::start`] waits for the broker to answer metadata
/// through the proxy.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A namespace on the shared Kafka broker (see [`crate::Broker`]) that the test's clients
/// reach only through a Kafka-mode [`ThrottlingProxy`] advertising itself: a slow, stalled or
/// faulty broker for this test alone.
pub struct ProxiedBroker {
    proxy: ThrottlingProxy,
    broker: crate::Broker,
}

impl ProxiedBroker {
    /// Starts the proxy in front of the shared broker, and waits (up to 30 s) until a
    /// metadata request through the proxy lists the broker at the proxy's address.
    pub fn start() -> Result<ProxiedBroker> {
        let broker = crate::Broker::start()?;
        let proxy = ThrottlingProxy::start_kafka_advertised(SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            broker.port(),
        )))?;
        let proxied = ProxiedBroker { proxy, broker };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_err = anyhow!("no metadata request made");
        while Instant::now() < deadline {
            match advertised_ports(&proxied.bootstrap(), Duration::from_secs(2)) {
                Ok(ports) if ports == [proxied.proxy.port()] => return Ok(proxied),
                Ok(ports) => bail!(
                    "through the proxy the broker is listed at ports {ports:?}, not the proxy's {}",
                    proxied.proxy.port()
                ),
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last_err.context(format!(
            "the broker behind the proxy {} did not answer metadata within {READY_TIMEOUT:?}",
            proxied.bootstrap(),
        )))
    }

    /// The same as [`ProxiedBroker::start`]: the proxy always understands Kafka's framing
    /// (see [`ThrottlingProxy::set_produce_fault`]).
    pub fn start_kafka_aware() -> Result<ProxiedBroker> {
        Self::start()
    }

    /// The proxy's `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.proxy.address()
    }

    /// The name topic `name` has for this test (see [`crate::Broker::topic`]).
    pub fn topic(&self, name: &str) -> String {
        self.broker.topic(name)
    }

    /// The namespace on the shared broker (see [`crate::Broker`]).
    pub fn broker(&self) -> &crate::Broker {
        &self.broker
    }

    /// The proxy in front of the broker.
    pub fn proxy(&self) -> &ThrottlingProxy {
        &self.proxy
    }

    /// The port the broker itself listens on (the test's clients never use it).
    pub fn broker_port(&self) -> u16 {
        self.broker.port()
    }

    /// The broker's log.
    pub fn log_path(&self) -> PathBuf {
        self.broker.log_path()
    }

    /// Whether the broker answers metadata (directly, not through the proxy).
    pub fn is_running(&self) -> bool {
        self.broker.is_running()
    }
}

/// One Kafka-mode proxy per node of a cluster, each advertising every node's proxy in place
/// of the node: a client bootstrapped through [`ClusterProxies::bootstrap`] reaches every
/// node only through that node's proxy. A restarted node keeps its port, so the proxies
/// outlive node restarts (a connection whose node went away is closed).
pub struct ClusterProxies {
    /// (node id, the node's proxy), in the nodes' order.
    proxies: Vec<(u32, ThrottlingProxy)>,
}

impl ClusterProxies {
    /// Starts one proxy per node of `cluster`, in front of the node's client port.
    pub fn start(cluster: &crate::KafkaCluster) -> Result<ClusterProxies> {
        let nodes: Vec<(u32, SocketAddr)> = cluster
            .nodes()
            .iter()
            .map(|node| {
                (
                    node.id(),
                    SocketAddr::from((Ipv4Addr::LOCALHOST, node.port())),
                )
            })
            .collect();
        Self::start_for(&nodes)
    }

    /// Starts one proxy per (node id, client address) of `nodes`, on a free port each, every
    /// one rewriting each node's port into that node's proxy's port. Node ids and node ports
    /// must be distinct.
    pub fn start_for(nodes: &[(u32, SocketAddr)]) -> Result<ClusterProxies> {
        for (i, (id, _)) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|(earlier, _)| earlier == id) {
                bail!("cluster proxies: node {id} is listed twice in {nodes:?}");
            }
        }
        let ports: Vec<(u16, u16)> = nodes
            .iter()
            .map(|(_, address)| (address.port(), crate::free_port()))
            .collect();
        let proxies = nodes
            .iter()
            .zip(&ports)
            .map(|(&(id, address), &(_, proxy_port))| {
                let proxy =
                    ThrottlingProxy::start_kafka_advertising_on(proxy_port, address, &ports)
                        .with_context(|| format!("starting the proxy of node {id} ({address})"))?;
                Ok((id, proxy))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ClusterProxies { proxies })
    }

    /// Every proxy's `127.0.0.1:PORT`, comma-separated, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.proxies
            .iter()
            .map(|(_, proxy)| proxy.address())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The proxy in front of node `node_id`.
    pub fn proxy(&self, node_id: u32) -> Result<&ThrottlingProxy> {
        self.proxies
            .iter()
            .find(|(id, _)| *id == node_id)
            .map(|(_, proxy)| proxy)
            .with_context(|| format!("no proxy for Kafka node {node_id}"))
    }

    /// (node id, its proxy) for every node, in the nodes' order.
    pub fn proxies(&self) -> impl Iterator<Item = (u32, &ThrottlingProxy)> {
        self.proxies.iter().map(|(id, proxy)| (*id, proxy))
    }
}

/// The ports of the brokers listed in a metadata answer from `bootstrap`.
pub fn advertised_ports(bootstrap: &str, timeout: Duration) -> Result<Vec<u16>> {
    let md = crate::broker::broker_metadata(bootstrap, timeout)?;
    md.brokers()
        .iter()
        .map(|b| {
            u16::try_from(b.port())
                .with_context(|| format!("broker port {} out of range", b.port()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a free port that echoes every connection back.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        addr
    }

    /// A server that reads every connection to its end and reports, per
    /// connection, the bytes and the time the last byte arrived.
    async fn sink_server() -> (
        SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<(usize, Instant)>,
    ) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut total = 0;
                    while let Ok(n @ 1..) = socket.read(&mut buf).await {
                        total += n;
                    }
                    let _ = tx.send((total, Instant::now()));
                });
            }
        });
        (addr, rx)
    }

    fn pattern(len: usize) -> Vec<u8> {
        // Every byte value, in an order that does not repeat with a short period.
        (0..len)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_pass_through_unchanged_in_both_directions() {
        let proxy = ThrottlingProxy::start(echo_server().await).unwrap();
        let data = pattern(3 * 1024 * 1024 + 17);
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        let (mut r, mut w) = conn.split();
        let write = async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut back = Vec::new();
        let read = r.read_to_end(&mut back);
        let (_, read) = tokio::join!(write, read);
        read.unwrap();
        assert!(back == data, "echoed bytes differ from the bytes sent");
        assert_eq!(proxy.forwarded(Direction::ToServer), data.len() as u64);
        assert_eq!(proxy.forwarded(Direction::ToClient), data.len() as u64);
        assert_eq!(proxy.connections(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_rate_limit_is_roughly_honoured_and_can_be_changed() {
        let (addr, mut done) = sink_server().await;
        let proxy = ThrottlingProxy::start(addr).unwrap();
        let rate = 200_000u64;
        proxy.set_rate(Direction::ToServer, Some(rate));
        assert_eq!(proxy.rate(Direction::ToServer), Some(rate));
        assert_eq!(proxy.rate(Direction::ToClient), None);

        // 400 kB at 200 kB/s: about 2 s (at most one burst faster).
        let data = pattern(400_000);
        let start = Instant::now();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        conn.write_all(&data).await.unwrap();
        conn.shutdown().await.unwrap();
        let (received, at) = done.recv().await.unwrap();
        let elapsed = at - start;
        assert_eq!(received, data.len());
        let fastest = Duration::from_secs_f64((data.len() as f64 - burst_of(rate)) / rate as f64);
        assert!(
            elapsed >= fastest.mul_f64(0.95),
            "400 kB at 200 kB/s took only {elapsed:?}"
        );
        assert!(
            elapsed <= Duration::from_secs(4),
            "400 kB at 200 kB/s took {elapsed:?}"
        );

        // Lifting the limit mid-transfer takes effect at once: 4 MB in well under the 20 s
        // the old limit would need.
        proxy.set_rate(Direction::ToServer, Some(rate));
        let data = pattern(4_000_000);
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        let lift = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.set_rate(Direction::ToServer, None);
        };
        let start = Instant::now();
        let send = async {
            conn.write_all(&data).await.unwrap();
            conn.shutdown().await.unwrap();
        };
        tokio::join!(lift, send);
        let (received, at) = done.recv().await.unwrap();
        assert_eq!(received, data.len());
        assert!(at - start < Duration::from_secs(5), "took {:?}", at - start);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_proxy_holds_bytes_until_resumed() {
        let proxy = ThrottlingProxy::start(echo_server().await).unwrap();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        conn.write_all(b"before").await.unwrap();
        let mut buf = [0u8; 6];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"before");

        proxy.pause();
        conn.write_all(b"during").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(500), conn.read(&mut buf)).await;
        assert!(held.is_err(), "bytes passed a paused proxy: {held:?}");
        assert_eq!(proxy.forwarded(Direction::ToServer), 6);

        proxy.resume();
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut buf))
            .await
            .expect("bytes pass again after resume")
            .unwrap();
        assert_eq!(&buf, b"during");
    }

    #[tokio::test]
    async fn a_connection_to_a_missing_target_is_closed() {
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, crate::free_port()));
        let proxy = ThrottlingProxy::start(target).unwrap();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("the proxy closes the connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    /// A Kafka-ish server: answers every framed Produce request with error 0,
    /// after `delay` (so an injected answer could overtake it if order were
    /// not kept), and reports the correlation ids it saw.
    async fn produce_server(
        delay: Duration,
    ) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<i32>) {
        use crate::kafka_protocol::parse_produce_request;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let mut size = [0u8; 4];
                        if socket.read_exact(&mut size).await.is_err() {
                            return;
                        }
                        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
                        socket.read_exact(&mut frame).await.unwrap();
                        let request = parse_produce_request(&frame).unwrap();
                        let _ = tx.send(request.header.correlation_id);
                        tokio::time::sleep(delay).await;
                        let topics: Vec<TopicResponse> = request
                            .topics
                            .iter()
                            .map(|t| TopicResponse {
                                name: t.name.clone(),
                                partitions: t
                                    .partitions
                                    .iter()
                                    .map(|p| PartitionResponse {
                                        partition: p.partition,
                                        error_code: 0,
                                        error_message: None,
                                    })
                                    .collect(),
                            })
                            .collect();
                        let answer = encode_produce_response(
                            request.header.api_version,
                            request.header.correlation_id,
                            &topics,
                        );
                        socket.write_all(&answer).await.unwrap();
                    }
                });
            }
        });
        (addr, rx)
    }

    fn produce(version: i16, correlation_id: i32, topic: &str, records: &[u8]) -> Vec<u8> {
        use crate::kafka_protocol::*;
        encode_produce_request(
            &ProduceRequest {
                header: RequestHeader {
                    api_key: PRODUCE,
                    api_version: version,
                    correlation_id,
                },
                transactional_id: None,
                acks: -1,
                timeout_ms: 1000,
                topics: vec![TopicData {
                    name: topic.into(),
                    partitions: vec![PartitionData {
                        partition: 0,
                        records: records.to_vec(),
                    }],
                }],
            },
            Some("test"),
        )
    }

    #[test]
    fn a_fault_matches_topic_partition_and_marker() {
        let fault = ProduceFault::new("orders", 44);
        assert!(fault.matches("orders", 3, b"anything"));
        assert!(!fault.matches("other", 3, b"anything"));
        let fault = fault.partition(1).marker(b"POISON");
        assert!(fault.matches("orders", 1, b"..POISON.."));
        assert!(!fault.matches("orders", 1, b"..POIS0N.."));
        assert!(!fault.matches("orders", 2, b"..POISON.."));
        // Other API keys are never answered.
        let mut fetch = produce(7, 1, "orders", b"POISON")[4..].to_vec();
        fetch[1] = 1;
        assert_eq!(intercept(&fault, &fetch), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_request_reaches_the_broker_only_when_released() {
        use crate::kafka_protocol::parse_produce_response;
        let version = 9i16;
        let (addr, mut seen) = produce_server(Duration::from_millis(50)).await;
        let proxy = ThrottlingProxy::start_kafka(addr).unwrap();
        proxy.set_produce_fault(Some(ProduceFault::hold("orders").marker(b"LATE")));
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        conn.write_all(&produce(version, 1, "orders", b"first"))
            .await
            .unwrap();
        conn.write_all(&produce(version, 2, "orders", b"a LATE b"))
            .await
            .unwrap();
        conn.write_all(&produce(version, 3, "orders", b"third"))
            .await
            .unwrap();
        // The held request gets no answer; the ones around it are answered in order.
        let mut answered = Vec::new();
        for _ in 0..2 {
            let mut size = [0u8; 4];
            conn.read_exact(&mut size).await.unwrap();
            let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
            conn.read_exact(&mut frame).await.unwrap();
            answered.push(parse_produce_response(version, &frame).unwrap().0);
        }
        assert_eq!(answered, [1, 3]);
        let mut size = [0u8; 4];
        let more =
            tokio::time::timeout(Duration::from_millis(300), conn.read_exact(&mut size)).await;
        assert!(more.is_err(), "the held request was answered: {more:?}");
        assert_eq!(seen.recv().await, Some(1));
        assert_eq!(
            seen.recv().await,
            Some(3),
            "the held request is not forwarded"
        );
        assert_eq!(proxy.held_requests(), 1);
        assert_eq!(proxy.faults_injected(), 0);

        // The client gives up on it; the held request outlives its connection.
        drop(conn);
        proxy.set_produce_fault(None);
        let answers =
            tokio::task::block_in_place(|| proxy.release_held(Duration::from_secs(5))).unwrap();
        assert_eq!(seen.recv().await, Some(2), "released to the broker");
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0][0].name, "orders");
        assert_eq!(answers[0][0].partitions[0].error_code, 0);
        assert_eq!(proxy.held_requests(), 0);
        // Released once only.
        let again =
            tokio::task::block_in_place(|| proxy.release_held(Duration::from_secs(5))).unwrap();
        assert!(again.is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), seen.recv())
                .await
                .is_err(),
            "released twice"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn matching_produce_requests_are_answered_by_the_proxy_in_order() {
        use crate::kafka_protocol::parse_produce_response;
        for version in [3i16, 7, 9, 10] {
            let (addr, mut seen) = produce_server(Duration::from_millis(200)).await;
            let proxy = ThrottlingProxy::start_kafka(addr).unwrap();
            proxy.set_produce_fault(Some(ProduceFault::new("orders", 44).marker(b"POISON")));
            let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
                .await
                .unwrap();
            // Pipelined: innocent, poison, other topic's poison.
            conn.write_all(&produce(version, 1, "orders", b"innocent"))
                .await
                .unwrap();
            conn.write_all(&produce(version, 2, "orders", b"a POISON b"))
                .await
                .unwrap();
            conn.write_all(&produce(version, 3, "payments", b"POISON"))
                .await
                .unwrap();
            let mut answers = Vec::new();
            for _ in 0..3 {
                let mut size = [0u8; 4];
                conn.read_exact(&mut size).await.unwrap();
                let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
                conn.read_exact(&mut frame).await.unwrap();
                let (id, topics) = parse_produce_response(version, &frame).unwrap();
                answers.push((id, topics[0].partitions[0].error_code));
            }
            assert_eq!(answers, [(1, 0), (2, 44), (3, 0)], "v{version}");
            assert_eq!(proxy.faults_injected(), 1);
            assert_eq!(seen.recv().await, Some(1));
            assert_eq!(
                seen.recv().await,
                Some(3),
                "the poison never reaches the broker"
            );

            // Lifted: forwarded again.
            proxy.set_produce_fault(None);
            conn.write_all(&produce(version, 4, "orders", b"POISON"))
                .await
                .unwrap();
            assert_eq!(seen.recv().await, Some(4));
        }
    }

    /// A fake Kafka broker on `listener`: answers every request with a frame carrying its
    /// correlation id and then `body(api_key)`, reports the (API key, correlation id) of every
    /// request it reads, and closes every connection (as a killed broker would) once the
    /// returned sender sends `true`.
    fn fake_broker(
        listener: TcpListener,
        body: impl Fn(i16) -> Vec<u8> + Send + Sync + 'static,
    ) -> (
        tokio::sync::mpsc::UnboundedReceiver<(i16, i32)>,
        watch::Sender<bool>,
    ) {
        let (seen, seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let (kill, _) = watch::channel(false);
        let killed = kill.subscribe();
        let body = Arc::new(body);
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let seen = seen.clone();
                let mut killed = killed.clone();
                let body = Arc::clone(&body);
                tokio::spawn(async move {
                    let (mut from, mut to) = socket.into_split();
                    loop {
                        let frame = tokio::select! {
                            frame = read_frame(&mut from) => frame,
                            _ = killed.wait_for(|k| *k) => None,
                        };
                        let Some(frame) = frame else { return };
                        let header = request_header(&frame[4..]).unwrap();
                        let _ = seen.send((header.api_key, header.correlation_id));
                        let mut answer = header.correlation_id.to_be_bytes().to_vec();
                        answer.extend(body(header.api_key));
                        let mut framed = (answer.len() as i32).to_be_bytes().to_vec();
                        framed.extend(answer);
                        to.write_all(&framed).await.unwrap();
                    }
                });
            }
        });
        (seen_rx, kill)
    }

    /// A request frame (size prefix included) of `api_key` v0 with no body.
    fn request(api_key: i16, correlation_id: i32) -> Vec<u8> {
        let mut frame = 10i32.to_be_bytes().to_vec();
        frame.extend(api_key.to_be_bytes());
        frame.extend(0i16.to_be_bytes());
        frame.extend(correlation_id.to_be_bytes());
        frame.extend((-1i16).to_be_bytes()); // no client id
        frame
    }

    /// The answer to one Metadata request sent through the proxy on `port`.
    async fn metadata_through(port: u16) -> Vec<u8> {
        use crate::kafka_protocol::METADATA;
        let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        conn.write_all(&request(METADATA, 1)).await.unwrap();
        next_answer(&mut conn, Duration::from_secs(5))
            .await
            .expect("a Metadata answer")
    }

    /// The next answer on `conn` (after its size prefix), or `None` if none comes within
    /// `wait`. Panics if the connection ends.
    async fn next_answer(conn: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        let mut size = [0u8; 4];
        match tokio::time::timeout(wait, conn.read_exact(&mut size)).await {
            Err(_) => return None,
            Ok(read) => read.expect("the connection stays open"),
        };
        let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
        conn.read_exact(&mut answer).await.unwrap();
        Some(answer)
    }

    fn correlation_id(answer: &[u8]) -> i32 {
        i32::from_be_bytes([answer[0], answer[1], answer[2], answer[3]])
    }

    const API_VERSIONS: i16 = 18;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_answer_and_those_behind_it_never_reach_the_client() {
        use crate::kafka_protocol::{END_TXN, METADATA};
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut seen, kill) = fake_broker(listener, |_| Vec::new());
        let proxy = ThrottlingProxy::start_kafka(addr).unwrap();
        let wait = Duration::from_secs(5);
        let quiet = Duration::from_millis(300);

        // Armed, then cleared: nothing is held.
        proxy.hold_next_answer(END_TXN);
        proxy.clear_answer_hold();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        conn.write_all(&request(END_TXN, 1)).await.unwrap();
        let answer = next_answer(&mut conn, wait).await.expect("not held");
        assert_eq!(correlation_id(&answer), 1);

        // Pipelined: another API's answer before the EndTxn passes; the EndTxn's and the
        // one behind it do not.
        proxy.hold_next_answer(END_TXN);
        for (api_key, id) in [(METADATA, 2), (END_TXN, 3), (API_VERSIONS, 4)] {
            conn.write_all(&request(api_key, id)).await.unwrap();
        }
        let answer = next_answer(&mut conn, wait).await.expect("answered");
        assert_eq!(correlation_id(&answer), 2);
        let more = next_answer(&mut conn, quiet).await;
        assert_eq!(more, None, "an answer passed the hold");
        // Requests still reach the broker after the hold; their answers do not come back.
        conn.write_all(&request(METADATA, 5)).await.unwrap();
        for expected in [(END_TXN, 1), (METADATA, 2), (END_TXN, 3), (API_VERSIONS, 4)] {
            assert_eq!(seen.recv().await, Some(expected));
        }
        assert_eq!(
            seen.recv().await,
            Some((METADATA, 5)),
            "forwarded after the hold"
        );
        assert_eq!(next_answer(&mut conn, quiet).await, None);
        assert_eq!(proxy.answers_held(), 1);

        // The hold was once: another connection's EndTxn is answered.
        let mut other = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        other.write_all(&request(END_TXN, 6)).await.unwrap();
        let answer = next_answer(&mut other, wait)
            .await
            .expect("the hold was once");
        assert_eq!(correlation_id(&answer), 6);
        assert_eq!(proxy.answers_held(), 1);

        // The broker goes away with no answer due: the held client's side closes at once.
        kill.send_replace(true);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(wait, conn.read(&mut byte))
            .await
            .expect("the held connection is closed when the broker's is");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_on_several_proxies_hold_only_where_the_answer_passes() {
        use crate::kafka_protocol::END_TXN;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_seen, _kill) = fake_broker(listener, |_| Vec::new());
        let proxies = [
            ThrottlingProxy::start_kafka(addr).unwrap(),
            ThrottlingProxy::start_kafka(addr).unwrap(),
        ];
        for proxy in &proxies {
            proxy.hold_next_answer(END_TXN);
        }
        let mut conn = TcpStream::connect(("127.0.0.1", proxies[1].port()))
            .await
            .unwrap();
        conn.write_all(&request(END_TXN, 1)).await.unwrap();
        assert_eq!(
            next_answer(&mut conn, Duration::from_millis(300)).await,
            None
        );
        let held: Vec<u64> = proxies.iter().map(ThrottlingProxy::answers_held).collect();
        assert_eq!(held, [0, 1]);
        // The other proxy is still armed until cleared.
        proxies[0].clear_answer_hold();
        let mut conn = TcpStream::connect(("127.0.0.1", proxies[0].port()))
            .await
            .unwrap();
        conn.write_all(&request(END_TXN, 2)).await.unwrap();
        let answer = next_answer(&mut conn, Duration::from_secs(5)).await;
        assert_eq!(answer.as_deref().map(correlation_id), Some(2));
    }

    /// A port no node of [`metadata_v0_body`] is mapped from (below the ports tests bind).
    const UNMAPPED_PORT: u16 = 9094;

    /// Answers as a Metadata v0 body (after the correlation id) listing nodes 1 and 2 at
    /// `node_ports` and node 3 at [`UNMAPPED_PORT`]; no topics.
    fn metadata_v0_body(node_ports: [u16; 2]) -> impl Fn(i16) -> Vec<u8> + Send + Sync {
        move |_api_key| {
            let mut body = 3i32.to_be_bytes().to_vec();
            for (id, port) in [
                (1i32, node_ports[0]),
                (2, node_ports[1]),
                (3, UNMAPPED_PORT),
            ] {
                body.extend(id.to_be_bytes());
                body.extend(9i16.to_be_bytes());
                body.extend(b"127.0.0.1");
                body.extend(i32::from(port).to_be_bytes());
            }
            body.extend(0i32.to_be_bytes()); // topics
            body
        }
    }

    /// The (node id, port) pairs of a [`metadata_v0_body`] answer (after its size prefix).
    fn metadata_v0_nodes(answer: &[u8]) -> Vec<(i32, u16)> {
        let be32 = |at: usize| {
            i32::from_be_bytes([answer[at], answer[at + 1], answer[at + 2], answer[at + 3]])
        };
        // Correlation id, node count, then 19 bytes per node: id, host (2 + 9), port.
        (0..3)
            .map(|i| {
                let node = 8 + i * 19;
                (be32(node), u16::try_from(be32(node + 15)).unwrap())
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_port_map_rewrites_every_node_of_one_metadata_answer() {
        // The answers name 9092 and 9093, as a cluster listening there would.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_seen, _kill) = fake_broker(listener, metadata_v0_body([9092, 9093]));
        let port = crate::free_port();
        let map = [(9092, 4001), (9093, 4002)];
        let proxy = ThrottlingProxy::start_kafka_advertising_on(port, addr, &map).unwrap();
        assert_eq!(proxy.port(), port);
        let answer = metadata_through(port).await;
        assert_eq!(
            metadata_v0_nodes(&answer),
            [(1, 4001), (2, 4002), (3, UNMAPPED_PORT)]
        );

        let twice = [(9092, 4001), (9092, 4002)];
        let started = ThrottlingProxy::start_kafka_advertising_on(crate::free_port(), addr, &twice);
        assert!(started.is_err(), "a broker port mapped twice is refused");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_proxies_advertise_each_node_at_its_proxy() {
        let mut listeners = Vec::new();
        for _ in 0..2 {
            listeners.push(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap());
        }
        let nodes: Vec<(u32, SocketAddr)> = (1..)
            .zip(&listeners)
            .map(|(id, l)| (id, l.local_addr().unwrap()))
            .collect();
        let node_ports = [nodes[0].1.port(), nodes[1].1.port()];
        let _brokers: Vec<_> = listeners
            .into_iter()
            .map(|l| fake_broker(l, metadata_v0_body(node_ports)))
            .collect();

        let proxies = ClusterProxies::start_for(&nodes).unwrap();
        let ports: Vec<u16> = proxies.proxies().map(|(_, p)| p.port()).collect();
        assert_eq!(
            proxies.bootstrap(),
            format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1])
        );
        assert!(proxies.proxy(3).is_err());
        for ((id, proxy), (node_id, node)) in proxies.proxies().zip(&nodes) {
            assert_eq!(id, *node_id);
            assert_eq!(proxy.target(), *node);
            assert_eq!(proxies.proxy(id).unwrap().port(), proxy.port());
            let answer = metadata_through(proxy.port()).await;
            assert_eq!(
                metadata_v0_nodes(&answer),
                [(1, ports[0]), (2, ports[1]), (3, UNMAPPED_PORT)],
                "through node {id}'s proxy"
            );
        }
        assert!(ClusterProxies::start_for(&[nodes[0], nodes[0]]).is_err());
    }
}
