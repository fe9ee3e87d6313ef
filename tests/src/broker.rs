//! A Tansu Kafka-protocol broker per test, spawned directly from the binary
//! that `scripts/install-deps.sh` caches.
//!
//! Tansu runs with the in-memory storage engine: it auto-creates unknown
//! topics (4 partitions) and keeps nothing across a restart. Its
//! ListOffsets("latest") answers are wrong, and transactions and consumer
//! groups are unreliable, so read topics back with
//! [`read_topic`](crate::read_topic), which assigns partitions explicitly and
//! reads to partition EOF.
//!
//! # Invariants
//!
//! - The broker listens and advertises `127.0.0.1:PORT`; the port is fixed
//!   for the life of the handle, so [`Broker::bootstrap`] stays valid across
//!   [`Broker::kill`] / [`Broker::start_again`].
//! - A started broker has answered a metadata request through rdkafka, not
//!   just accepted a TCP connection.
//! - It is only ever stopped with SIGKILL (SIGTERM can leave Tansu answering
//!   errors), and dropping the handle kills it and removes its directory.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

/// Version of Tansu that `scripts/install-deps.sh` installs.
pub const TANSU_VERSION: &str = "0.6.0";

/// How long [`Broker::start`] waits for the broker to answer metadata.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Which Tansu build and storage engine a broker uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `memory://`: fast, auto-creates topics, keeps nothing across a restart.
    Memory,
    /// `sqlite://` (the cargo-installed build): keeps its data across `kill -9`, does not
    /// auto-create topics; reading a long partition from offset 0 is slow.
    Durable,
}

impl Storage {
    fn variant(self) -> &'static str {
        match self {
            Storage::Memory => "memory",
            Storage::Durable => "durable",
        }
    }

    fn engine(self) -> &'static str {
        match self {
            Storage::Memory => "memory://tansu/",
            // Relative to the broker's working directory.
            Storage::Durable => "sqlite://tansu.db",
        }
    }
}

/// Path of the Tansu binary: `$SIPHON_TANSU_BIN`, else the memory-engine
/// build in `${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}`.
pub fn tansu_bin() -> Result<PathBuf> {
    tansu_bin_for(Storage::Memory)
}

/// Path of the Tansu build for `storage` (`$SIPHON_TANSU_BIN` applies to the memory build).
pub fn tansu_bin_for(storage: Storage) -> Result<PathBuf> {
    let path = match std::env::var_os("SIPHON_TANSU_BIN") {
        Some(p) if !p.is_empty() && storage == Storage::Memory => PathBuf::from(p),
        _ => {
            let cache = match std::env::var_os("SIPHON_CACHE_DIR") {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ => {
                    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
                    PathBuf::from(home).join(".cache/siphon")
                }
            };
            cache
                .join(format!("tansu-{TANSU_VERSION}-{}", storage.variant()))
                .join("bin/tansu")
        }
    };
    if !path.is_file() {
        bail!(
            "Tansu broker binary not found at {}; run scripts/install-deps.sh \
             (SIPHON_TANSU_VARIANTS=\"memory durable\" for the durable build, or set SIPHON_TANSU_BIN)",
            path.display()
        );
    }
    Ok(path)
}

/// A Tansu broker process on 127.0.0.1.
pub struct Broker {
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    bin: PathBuf,
    storage: Storage,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl Broker {
    /// Spawns a broker on a free port and waits (up to 30 s) until it answers
    /// a metadata request.
    pub fn start() -> Result<Broker> {
        Broker::start_with(Storage::Memory)
    }

    /// Like [`Broker::start`] with the given storage engine.
    pub fn start_with(storage: Storage) -> Result<Broker> {
        let bin = tansu_bin_for(storage)?;
        let dir = crate::short_tempdir("siphon-kafka-")?;
        let broker = Broker {
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            bin,
            storage,
            port: crate::free_port(),
            child: Mutex::new(None),
        };
        broker.spawn()?;
        Ok(broker)
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's stdout/stderr log (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join("tansu.log")
    }

    /// The broker's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// SIGKILLs the broker and waits for it to exit. A no-op if it is not
    /// running.
    pub fn kill(&self) -> Result<()> {
        let mut guard = self.lock();
        if let Some(mut child) = guard.take() {
            // `Child::kill` sends SIGKILL; it fails only if the process has
            // already been reaped, which `wait` below reports.
            let _ = child.kill();
            child.wait().context("waiting for the killed broker")?;
        }
        Ok(())
    }

    /// Starts a new broker process on the same port, after [`Broker::kill`].
    /// With the memory engine the new broker starts empty: every topic and
    /// record from before is gone.
    pub fn start_again(&self) -> Result<()> {
        if self.is_running() {
            bail!("broker on {} is still running", self.bootstrap());
        }
        self.spawn()
    }

    /// Whether the broker process is alive.
    pub fn is_running(&self) -> bool {
        let mut guard = self.lock();
        match guard.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                *guard = None;
                false
            }
            None => false,
        }
    }

    /// One metadata request through rdkafka: Ok if the broker answered within
    /// `timeout` and listed itself.
    pub fn check_metadata(&self, timeout: Duration) -> Result<()> {
        metadata_ok(&self.bootstrap(), timeout)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        // A poisoned lock means a panic while holding it; the Option<Child>
        // is still consistent.
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self) -> Result<()> {
        let log_path = self.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(&self.bin)
            .arg("broker")
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", self.storage.engine()])
            .current_dir(&self.dir_path)
            // Tansu also reads these from the environment; make the flags win.
            .env_remove("LISTENER_URL")
            .env_remove("ADVERTISED_LISTENER_URL")
            .env_remove("STORAGE_ENGINE")
            // Tansu reads RUST_LOG too: a level meant for Siphon (the bench exports `info`)
            // makes it log every request, which slows its produce path a hundredfold.
            .env(
                "RUST_LOG",
                std::env::var("SIPHON_TANSU_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        *self.lock() = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_err = anyhow!("no metadata request made");
        while Instant::now() < deadline {
            if !self.is_running() {
                bail!(
                    "tansu exited during startup; last lines of {}:\n{}",
                    log_path.display(),
                    crate::tail_file(&log_path, 20)
                );
            }
            match metadata_ok(&self.bootstrap(), Duration::from_secs(2)) {
                Ok(()) => return Ok(()),
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.kill();
        Err(last_err.context(format!(
            "tansu on {} did not answer metadata within {READY_TIMEOUT:?} (log: {})",
            self.bootstrap(),
            log_path.display()
        )))
    }
}

fn metadata_ok(bootstrap: &str, timeout: Duration) -> Result<()> {
    broker_metadata(bootstrap, timeout).map(|_| ())
}

/// One metadata request to `bootstrap` that must list at least one broker.
pub fn broker_metadata(bootstrap: &str, timeout: Duration) -> Result<rdkafka::metadata::Metadata> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        // Fail fast instead of retrying in the background.
        .set("reconnect.backoff.max.ms", "100")
        .create()
        .context("creating an rdkafka client")?;
    let md = consumer
        .fetch_metadata(None, timeout)
        .with_context(|| format!("metadata request to {bootstrap}"))?;
    if md.brokers().is_empty() {
        bail!("metadata from {bootstrap} lists no brokers");
    }
    Ok(md)
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("broker on {}: {e:#}", self.bootstrap());
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "tansu broker", &self.log_path(), false);
        }
    }
}
