//! A schema registry speaking Confluent's REST API, for the tests of the registry client and of
//! Avro records: `rivven-schema`, which `scripts/install-deps.sh` builds into the cache, serving
//! from memory.
//!
//! What it serves, as far as the tests rely on it: registering a schema
//! (`POST /subjects/{s}/versions`), a schema by id (`GET /schemas/ids/{id}`), a subject's
//! latest or numbered version (`GET /subjects/{s}/versions/{v}`), compatibility and config.
//! It does not serve `POST /subjects/{s}` (405) nor `GET /schemas/ids/{id}/schema` (404), and it
//! gives schemas back with their keys sorted.
//!
//! # Invariants
//!
//! - The registry listens on 127.0.0.1 only, on a port from [`crate::free_port`].
//! - A started registry has answered `GET /health/ready` with 200, not just accepted a TCP
//!   connection.
//! - A missing binary is an error, never a skipped test.
//! - Dropping the handle kills the process (SIGKILL), waits for it and removes its directory.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// Version of rivven-schema that `scripts/install-deps.sh` installs.
pub const RIVVEN_SCHEMA_VERSION: &str = "0.0.22";

/// How long [`RegistryServer::start`] waits for the registry to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of the rivven-schema binary: `$SIPHON_RIVVEN_SCHEMA_BIN`, else the one in
/// `${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/rivven-schema-<version>/bin`.
///
/// # Errors
/// When there is no file at that path: the error names the script that installs it.
pub fn rivven_schema_bin() -> Result<PathBuf> {
    let path = match std::env::var_os("SIPHON_RIVVEN_SCHEMA_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => crate::cache_dir()
            .join(format!("rivven-schema-{RIVVEN_SCHEMA_VERSION}"))
            .join("bin/rivven-schema"),
    };
    if !path.is_file() {
        bail!(
            "the schema registry binary is not at {}; run scripts/install-deps.sh (or set SIPHON_RIVVEN_SCHEMA_BIN)",
            path.display()
        );
    }
    Ok(path)
}

/// A rivven-schema process on 127.0.0.1, its schemas in memory.
pub struct RegistryServer {
    dir: Option<tempfile::TempDir>,
    log: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl RegistryServer {
    /// Spawns a registry on a free port and waits (up to 30 s) until it is ready.
    ///
    /// # Errors
    /// When the binary is missing, exits, or is not ready in time (with its log's tail).
    pub fn start() -> Result<RegistryServer> {
        Self::start_on(crate::free_port())
    }

    /// Like [`RegistryServer::start`], on `port` (a registry started where Siphon already
    /// looks for one).
    ///
    /// # Errors
    /// As [`RegistryServer::start`].
    pub fn start_on(port: u16) -> Result<RegistryServer> {
        let bin = rivven_schema_bin()?;
        let dir = crate::short_tempdir("siphon-registry-")?;
        let log = dir.path().join("rivven-schema.log");
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = Command::new(&bin)
            .arg("serve")
            .args(["--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--log-level", "warn"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().context("duplicating the log handle")?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let mut registry = RegistryServer {
            dir: Some(dir),
            log,
            port,
            child: Some(child),
        };
        registry.wait_ready()?;
        Ok(registry)
    }

    /// `http://127.0.0.1:PORT`, the registry's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The registry's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("no request made");
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("polling rivven-schema")? {
                    bail!(
                        "rivven-schema exited during startup ({status}); last lines of {}:\n{}",
                        self.log.display(),
                        crate::tail_file(&self.log, 20)
                    );
                }
            }
            match crate::http::get(self.port, "/health/ready") {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => last = format!("status {status}: {body}"),
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "rivven-schema on {} was not ready within {READY_TIMEOUT:?} (last: {last}); last lines of {}:\n{}",
            self.url(),
            self.log.display(),
            crate::tail_file(&self.log, 20)
        )
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only when the process was already reaped, which `wait` reports.
            let _ = child.kill();
            if let Err(e) = child.wait() {
                eprintln!("rivven-schema on {}: {e}", self.url());
            }
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "schema registry", &self.log, false);
        }
    }
}
