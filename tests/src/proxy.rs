//! A throttling TCP proxy on 127.0.0.1, and a Tansu broker that clients can
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
//! not to the bootstrap address. [`ProxiedBroker`] therefore starts Tansu
//! listening on one port and advertising the proxy's port: after bootstrap,
//! every connection still goes through the proxy.
//!
//! # Invariants
//!
//! - Only 127.0.0.1 is bound; the proxy's port is fixed for its lifetime.
//! - Bytes are forwarded unchanged and in order; an end of stream on one side
//!   is passed on as an end of stream (write shutdown) to the other.
//! - Over any interval, a direction limited to `r` bytes/s forwards at most
//!   `r` bytes per second plus one burst (1/20 s of traffic, at least 512
//!   bytes).
//! - The proxy runs on its own Tokio runtime and threads, so it keeps
//!   forwarding while the test's own runtime is blocked, and it needs no
//!   runtime from its caller. Dropping it closes the listener and every
//!   connection.

use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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

struct Shared {
    links: [Link; 2],
    paused: watch::Sender<bool>,
    accepted: AtomicU64,
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
            accepted: AtomicU64::new(0),
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
                tokio::spawn(forward_connection(client, target, Arc::clone(&shared)));
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
    }
    let _ = to.shutdown().await;
}

/// How long [`ProxiedBroker::start`] waits for the broker to answer metadata
/// through the proxy.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A Tansu broker (memory engine) that listens on a private port and
/// advertises the port of a [`ThrottlingProxy`] in front of it, so Kafka
/// clients reach it only through the proxy.
pub struct ProxiedBroker {
    proxy: ThrottlingProxy,
    broker_port: u16,
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    child: Mutex<Option<Child>>,
}

impl ProxiedBroker {
    /// Starts the proxy and the broker, and waits (up to 30 s) until the
    /// broker answers a metadata request through the proxy, listing itself at
    /// the proxy's address.
    pub fn start() -> Result<ProxiedBroker> {
        let bin = crate::tansu_bin()?;
        let dir = crate::short_tempdir("siphon-kafka-proxied-")?;
        let broker_port = crate::free_port();
        let proxy = ThrottlingProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, broker_port)))?;
        let broker = ProxiedBroker {
            proxy,
            broker_port,
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            child: Mutex::new(None),
        };
        let log_path = broker.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let child = Command::new(&bin)
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{broker_port}")])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{}", broker.proxy.port()),
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(&broker.dir_path)
            .env_remove("LISTENER_URL")
            .env_remove("ADVERTISED_LISTENER_URL")
            .env_remove("STORAGE_ENGINE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        *broker.lock() = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_err = anyhow!("no metadata request made");
        while Instant::now() < deadline {
            if !broker.is_running() {
                bail!(
                    "tansu exited during startup; last lines of {}:\n{}",
                    log_path.display(),
                    crate::tail_file(&log_path, 20)
                );
            }
            match advertised_ports(&broker.bootstrap(), Duration::from_secs(2)) {
                Ok(ports) if ports == [broker.proxy.port()] => return Ok(broker),
                Ok(ports) => bail!(
                    "the broker advertises ports {ports:?}, not the proxy's {}",
                    broker.proxy.port()
                ),
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last_err.context(format!(
            "tansu behind the proxy {} did not answer metadata within {READY_TIMEOUT:?} (log: {})",
            broker.bootstrap(),
            log_path.display()
        )))
    }

    /// The proxy's `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.proxy.address()
    }

    /// The proxy in front of the broker.
    pub fn proxy(&self) -> &ThrottlingProxy {
        &self.proxy
    }

    /// The port the broker itself listens on (clients never need it).
    pub fn broker_port(&self) -> u16 {
        self.broker_port
    }

    /// The broker's stdout/stderr log.
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join("tansu.log")
    }

    /// Whether the broker process is alive.
    pub fn is_running(&self) -> bool {
        let mut guard = self.lock();
        matches!(guard.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ProxiedBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "tansu broker (proxied)", &self.log_path(), false);
        }
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
}
