//! A scratch PostgreSQL cluster per test, managed through
//! `scripts/postgres.sh`.
//!
//! The cluster has superuser `siphon` / password `siphon` (SCRAM-SHA-256),
//! database `siphon`, `wal_level=logical`, 20 replication slots and WAL
//! senders, `fsync=off`, and listens on 127.0.0.1 only. Its server log is
//! `<data_dir>/log/postgresql.log`.
//!
//! # Invariants
//!
//! - Each [`Postgres`] owns a fresh directory under `/tmp` and a port from
//!   [`free_port`](crate::free_port); the port never changes, so
//!   [`Postgres::url`] stays valid across `kill`/`start_again`/`restart`.
//! - Dropping the handle shuts the server down immediately and removes the
//!   directory (kept and reported when the thread is panicking).
//! - All methods block the calling thread while the script runs (about a
//!   second for a start); none needs a Tokio runtime except
//!   [`Postgres::connect`].
//! - A cluster started with [`PostgresOptions::tls`] accepts TCP connections
//!   only over TLS (`hostssl ... scram-sha-256`); [`Postgres::connect`] then
//!   goes through the Unix socket in the data directory (trust auth), so the
//!   tests' own connections never show up as TCP clients.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

/// A running (or deliberately stopped) scratch PostgreSQL cluster.
pub struct Postgres {
    dir: Option<tempfile::TempDir>,
    data_dir: PathBuf,
    port: u16,
    tls: bool,
}

/// How [`Postgres::start_with`] sets up a cluster.
#[derive(Debug, Clone, Default)]
pub struct PostgresOptions {
    /// Turn TLS on: a directory holding `server.crt`, `server.key` (the
    /// server's certificate and key) and `ca.crt` (the CA client certificates
    /// must be signed by). TCP connections are then accepted only over TLS.
    pub tls: Option<PathBuf>,
}

impl Postgres {
    /// Initializes a fresh cluster in a new directory, starts it on a free
    /// port and waits until it accepts connections.
    pub fn start() -> Result<Postgres> {
        Self::start_with(&PostgresOptions::default())
    }

    /// Like [`Postgres::start`], with the given options.
    pub fn start_with(options: &PostgresOptions) -> Result<Postgres> {
        let dir = crate::short_tempdir("siphon-pg-")?;
        let data_dir = dir.path().to_path_buf();
        let pg = Postgres {
            dir: Some(dir),
            data_dir,
            port: crate::free_port(),
            tls: options.tls.is_some(),
        };
        match &options.tls {
            None => pg.script("start")?,
            Some(certs) => pg.script_args("start", &[OsStr::new("--tls"), certs.as_os_str()])?,
        }
        Ok(pg)
    }

    /// Makes a physical standby of `primary` (a running cluster without TLS) in a new directory
    /// and starts it: `pg_basebackup` creates the physical slot `slot` on the primary, and the
    /// standby runs with `primary_slot_name = slot`, `hot_standby_feedback = on` and, on
    /// PostgreSQL 17+, `sync_replication_slots = on`.
    pub fn start_standby(primary: &Postgres, slot: &str) -> Result<Postgres> {
        let dir = crate::short_tempdir("siphon-sb-")?;
        let data_dir = dir.path().to_path_buf();
        let standby = Postgres {
            dir: Some(dir),
            data_dir,
            port: crate::free_port(),
            tls: false,
        };
        let primary_port = primary.port.to_string();
        standby.script_args(
            "standby",
            &[
                primary.data_dir.as_os_str(),
                OsStr::new(&primary_port),
                OsStr::new(slot),
            ],
        )?;
        Ok(standby)
    }

    /// Promotes a standby to primary (waits until it accepts writes).
    pub fn promote(&self) -> Result<()> {
        self.script("promote")
    }

    /// `kill -9` of the postmaster: a crash, without any shutdown.
    pub fn kill9(&self) -> Result<()> {
        self.script("kill9")
    }

    /// The server's major version (`server_version_num / 10000`).
    pub async fn major_version(&self) -> Result<u32> {
        let client = self.connect().await?;
        let num: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await?
            .get(0);
        Ok(u32::try_from(num / 10_000)?)
    }

    /// Whether the cluster was started with TLS on (TCP only over TLS).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The cluster's `pg_hba.conf`; after changing it, call
    /// [`Postgres::reload`].
    pub fn hba_path(&self) -> PathBuf {
        self.data_dir.join("pg_hba.conf")
    }

    /// Makes the server re-read its configuration files.
    pub fn reload(&self) -> Result<()> {
        self.script("reload")
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://siphon:siphon@127.0.0.1:PORT/siphon`
    pub fn url(&self) -> String {
        format!("postgres://siphon:siphon@127.0.0.1:{}/siphon", self.port)
    }

    /// The cluster's data directory (also holds the Unix socket).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log file.
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join("log").join("postgresql.log")
    }

    /// Connects as `siphon` to database `siphon` (over TCP, or through the
    /// Unix socket on a TLS cluster); the connection is driven by a task
    /// spawned on the current Tokio runtime.
    /// [`Postgres::connect`], tried again every 200 ms until it succeeds (across a restart).
    pub async fn connect_retrying(&self) -> tokio_postgres::Client {
        loop {
            if let Ok(client) = self.connect().await {
                return client;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let (client, connection) = if self.tls {
            tokio_postgres::Config::new()
                .host_path(&self.data_dir)
                .port(self.port)
                .user("siphon")
                .dbname("siphon")
                .connect(tokio_postgres::NoTls)
                .await
                .with_context(|| {
                    format!(
                        "connecting through the socket in {}",
                        self.data_dir.display()
                    )
                })?
        } else {
            tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
                .await
                .with_context(|| format!("connecting to {}", self.url()))?
        };
        tokio::spawn(async move {
            // The connection ends with an error whenever a test stops the
            // server; that is expected and the client reports it anyway.
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Fast shutdown, then start again on the same port.
    pub fn restart(&self) -> Result<()> {
        self.script("restart")
    }

    /// Fast shutdown (waits for it). A no-op if the server is not running.
    pub fn stop(&self) -> Result<()> {
        self.script("stop")
    }

    /// Immediate shutdown: no checkpoint, clients are cut off; the next start
    /// runs crash recovery. A no-op if the server is not running.
    pub fn kill(&self) -> Result<()> {
        self.script("kill")
    }

    /// Starts the existing cluster again on the same port.
    pub fn start_again(&self) -> Result<()> {
        self.script("start")
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        self.command("status")
            .output()
            .is_ok_and(|out| out.status.success())
    }

    fn command(&self, action: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(crate::workspace_root().join("scripts/postgres.sh"))
            .arg(action)
            .arg(&self.data_dir)
            .arg(self.port.to_string())
            .stdin(std::process::Stdio::null());
        cmd
    }

    fn script(&self, action: &str) -> Result<()> {
        self.script_args(action, &[])
    }

    fn script_args(&self, action: &str, args: &[&OsStr]) -> Result<()> {
        let out = self
            .command(action)
            .args(args)
            .output()
            .with_context(|| format!("running scripts/postgres.sh {action}"))?;
        if !out.status.success() {
            bail!(
                "scripts/postgres.sh {action} {} {} failed ({}):\n{}{}\n(server log: {})",
                self.data_dir.display(),
                self.port,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_path().display()
            );
        }
        Ok(())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("postgres on port {}: {e:#}", self.port);
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "postgres", &self.log_path(), false);
        }
    }
}
