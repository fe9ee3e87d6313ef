//! A Tansu Kafka-protocol broker, for the smoke test that shows Siphon works with a broker
//! other than Apache Kafka (`tests/tests/operations/other_brokers.rs`); every other end-to-end test runs
//! on Apache Kafka ([`crate::broker`]). Spawned from the binary that
//! `scripts/install-deps.sh` caches.
//!
//! Tansu runs with the in-memory storage engine: it auto-creates unknown topics (4 partitions)
//! and keeps nothing across a restart.
//!
//! # Invariants
//!
//! - The broker listens and advertises `127.0.0.1:PORT`.
//! - A started broker has answered a metadata request through rdkafka, not just accepted a
//!   TCP connection.
//! - It is only ever stopped with SIGKILL (SIGTERM can leave Tansu answering errors), and
//!   dropping the handle kills it and removes its directory.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// Version of Tansu that `scripts/install-deps.sh` installs.
pub const TANSU_VERSION: &str = "0.6.0";

/// How long [`TansuBroker::start`] waits for the broker to answer metadata.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of the Tansu binary: `$SIPHON_TANSU_BIN`, else the memory-engine build in
/// `${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}`.
pub fn tansu_bin() -> Result<PathBuf> {
    let path = match std::env::var_os("SIPHON_TANSU_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => crate::cache_dir()
            .join(format!("tansu-{TANSU_VERSION}-memory"))
            .join("bin/tansu"),
    };
    if !path.is_file() {
        bail!(
            "Tansu broker binary not found at {}; run scripts/install-deps.sh (or set SIPHON_TANSU_BIN)",
            path.display()
        );
    }
    Ok(path)
}

/// A Tansu broker process on 127.0.0.1.
pub struct TansuBroker {
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    bin: PathBuf,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl TansuBroker {
    /// Spawns a broker on a free port and waits (up to 30 s) until it answers
    /// a metadata request.
    pub fn start() -> Result<TansuBroker> {
        let bin = tansu_bin()?;
        let dir = crate::short_tempdir("siphon-kafka-")?;
        let broker = TansuBroker {
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            bin,
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

    /// Starts a new broker process on the same port, after [`TansuBroker::kill`].
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
            .args(["--storage-engine", "memory://tansu/"])
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
    crate::broker::broker_metadata(bootstrap, timeout).map(|_| ())
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("broker on {}: {e:#}", self.bootstrap());
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "tansu broker", &self.log_path(), false);
        }
    }
}
