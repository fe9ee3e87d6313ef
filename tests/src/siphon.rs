//! The `siphon` binary as a child process: `siphon run --config FILE`.
//!
//! The binary is `$SIPHON_BIN` if set, else `siphon` next to the test
//! executable's target directory (`target/<profile>/siphon`, which honours
//! `CARGO_TARGET_DIR`), else `<workspace>/target/debug/siphon`. Cargo does not
//! rebuild it for `cargo test -p siphon-tests`: run `cargo build -p siphon`
//! first (`scripts/test.sh` does).
//!
//! # Invariants
//!
//! - Each [`SiphonProcess`] has its own directory holding `siphon.toml` and
//!   `siphon.log`; stdout and stderr both go to the log, which is appended to
//!   across [`SiphonProcess::start_again`].
//! - At most one process per handle is alive; dropping the handle SIGKILLs
//!   it. When the thread is panicking, the directory is kept and the log's
//!   path and tail are printed.
//! - `RUST_LOG` is inherited from the test's environment, defaulting to
//!   `info`. The harness's own variables are named `SIPHON_BROKER_*`, never
//!   `SIPHON_KAFKA_*`, which Siphon reads as its `[kafka]` settings.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// Path of the `siphon` binary (see the module docs for the lookup order).
pub fn siphon_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SIPHON_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("SIPHON_BIN={} does not exist", p.display());
        }
        return Ok(p);
    }
    let mut candidates = Vec::new();
    // Test executables live in target/<profile>/deps/.
    if let Ok(exe) = std::env::current_exe() {
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join("siphon"));
        }
    }
    let fallback = crate::workspace_root().join("target/debug/siphon");
    if !candidates.contains(&fallback) {
        candidates.push(fallback);
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    bail!(
        "siphon binary not found (looked at {}); build it with `cargo build -p siphon` \
         or set SIPHON_BIN",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Runs `siphon SUBCOMMAND --config CONFIG ARGS...` to its end: its exit status, and what it
/// printed (stdout, then stderr).
pub fn run_siphon(
    subcommand: &str,
    config: &Path,
    args: &[&str],
) -> Result<(std::process::ExitStatus, String)> {
    let output = std::process::Command::new(siphon_bin()?)
        .args([subcommand, "--config"])
        .arg(config)
        .args(args)
        .output()
        .with_context(|| format!("running siphon {subcommand}"))?;
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    Ok((output.status, said))
}

/// `VmRSS` and `VmHWM` (current and peak resident memory) of process `pid`,
/// in bytes, from `/proc/PID/status`.
pub fn process_memory(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(kb * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// A `siphon run` child process with its config file and log.
pub struct SiphonProcess {
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    bin: PathBuf,
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
}

impl SiphonProcess {
    /// Writes `config_toml` to a fresh directory and starts
    /// `siphon run --config <dir>/siphon.toml`.
    pub fn start(config_toml: &str) -> Result<SiphonProcess> {
        Self::start_with(&siphon_bin()?, config_toml, &[])
    }

    /// Like [`SiphonProcess::start`] with an explicit binary and extra
    /// environment variables.
    pub fn start_with(
        bin: &Path,
        config_toml: &str,
        env: &[(&str, &str)],
    ) -> Result<SiphonProcess> {
        let dir = crate::short_tempdir("siphon-run-")?;
        let dir_path = dir.path().to_path_buf();
        let config = dir_path.join("siphon.toml");
        std::fs::write(&config, config_toml)
            .with_context(|| format!("writing {}", config.display()))?;
        let process = SiphonProcess {
            dir: Some(dir),
            dir_path,
            bin: bin.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            child: Mutex::new(None),
        };
        process.spawn()?;
        Ok(process)
    }

    /// Starts the binary again with the same config and log (after it exited
    /// or was killed).
    pub fn start_again(&self) -> Result<()> {
        if self.is_running() {
            bail!("siphon (pid {:?}) is still running", self.pid());
        }
        self.spawn()
    }

    /// Runs `siphon SUBCOMMAND --config <this process's config>` to its end: whether it
    /// succeeded, and what it printed (stdout, then stderr).
    pub fn command(&self, subcommand: &str) -> Result<(bool, String)> {
        let (status, said) = self.command_with(subcommand, &[])?;
        Ok((status.success(), said))
    }

    /// Runs `siphon SUBCOMMAND --config <this process's config> ARGS...` to its end: its exit
    /// status, and what it printed (stdout, then stderr).
    pub fn command_with(
        &self,
        subcommand: &str,
        args: &[&str],
    ) -> Result<(std::process::ExitStatus, String)> {
        run_siphon(subcommand, &self.config_path(), args)
    }

    /// The config file passed with `--config`.
    pub fn config_path(&self) -> PathBuf {
        self.dir_path.join("siphon.toml")
    }

    /// The log file holding the process's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join("siphon.log")
    }

    /// The process's directory (config and log).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// Everything logged so far (lossy UTF-8; empty if nothing yet).
    pub fn log(&self) -> String {
        std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The address (`127.0.0.1:PORT`) of the metrics endpoint the current process announced in
    /// its log, once it did.
    pub fn metrics_address(&self) -> Option<String> {
        self.log()
            .lines()
            .rev()
            .map(strip_ansi)
            .filter(|l| l.contains("serving /metrics"))
            .find_map(|l| {
                let rest = &l[l.find("addr=")? + "addr=".len()..];
                Some(rest.split_whitespace().next()?.to_owned())
            })
    }

    /// The current process id, if a process is alive.
    pub fn pid(&self) -> Option<u32> {
        let mut guard = self.lock();
        match guard.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => guard.as_ref().map(Child::id),
            _ => None,
        }
    }

    /// Whether the process is alive.
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// SIGKILL and wait: a crash with no chance to clean up. Returns the exit
    /// status (that of the earlier exit if it had already exited).
    pub fn kill9(&self) -> Result<ExitStatus> {
        let mut guard = self.lock();
        let child = guard.as_mut().context("siphon was never started")?;
        // Fails only if the child was already reaped; `wait` then returns
        // the recorded status.
        let _ = child.kill();
        child.wait().context("waiting for siphon after SIGKILL")
    }

    /// Sends SIGTERM (graceful shutdown request); use
    /// [`SiphonProcess::wait_exit`] to wait for the exit.
    pub fn terminate(&self) -> Result<()> {
        let mut guard = self.lock();
        let child = guard.as_mut().context("siphon was never started")?;
        if child.try_wait()?.is_some() {
            bail!("siphon has already exited");
        }
        let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
        // SAFETY: kill(2) has no memory-safety preconditions. The pid belongs
        // to our unreaped child (checked just above while holding the lock),
        // so it cannot have been recycled for another process.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("sending SIGTERM to siphon");
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit and returns its status.
    /// On timeout the process is left running and an error (with the log's
    /// tail) is returned.
    pub fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut guard = self.lock();
                let child = guard.as_mut().context("siphon was never started")?;
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "siphon did not exit within {timeout:?}; last lines of {}:\n{}",
                    self.log_path().display(),
                    crate::tail_file(&self.log_path(), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the log contains `needle`. Fails after `timeout`, or as
    /// soon as the process has exited without logging it.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let running = self.is_running();
            if self.log().contains(needle) {
                return Ok(());
            }
            if !running {
                bail!(
                    "siphon exited without logging {needle:?}; last lines of {}:\n{}",
                    self.log_path().display(),
                    crate::tail_file(&self.log_path(), 30)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "siphon did not log {needle:?} within {timeout:?}; last lines of {}:\n{}",
                    self.log_path().display(),
                    crate::tail_file(&self.log_path(), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's current and peak resident memory (`VmRSS`, `VmHWM` from
    /// `/proc/PID/status`), in bytes.
    pub fn memory(&self) -> Result<(u64, u64)> {
        let pid = self.pid().context("siphon is not running")?;
        process_memory(pid)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        // A poisoned lock means a panic while holding it; the Option<Child>
        // is still consistent.
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self) -> Result<()> {
        use std::io::Write as _;
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        writeln!(
            log,
            "=== siphon-tests: starting {} run --config {} ===",
            self.bin.display(),
            self.config_path().display()
        )?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("run")
            .arg("--config")
            .arg(self.config_path())
            .current_dir(&self.dir_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log handle")?)
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        *self.lock() = Some(child);
        Ok(())
    }
}

impl Drop for SiphonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(dir, "siphon", &self.log_path(), true);
        }
    }
}

/// The text of a log without terminal colour codes (Siphon's text log may carry them).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
