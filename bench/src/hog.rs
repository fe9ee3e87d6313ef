//! A CPU hog for the `--contention` drains: busy threads that compete for the cores with the
//! database, the broker and the client being measured, the way other work on a shared host does.
//!
//! By default the threads run in a program of their own ([`Hog::program`]: the bench binary
//! started again in a new session), as other work on a host does: Linux's scheduler shares the
//! cores between sessions first (autogroup) and then between the threads of each, so a hog
//! inside the bench's own process would compete with the bench's other children (the broker
//! it started, the client it measures) inside one share, and not with PostgreSQL, which runs
//! in its own session. `--hog-in-process` keeps the threads in the bench process.
//!
//! # Invariants
//! - The threads run from the start until the hog is stopped or dropped; dropping it (an
//!   error path, an interrupted run) stops and joins the threads or kills the program, and
//!   both die with the bench in any case (the program by `PR_SET_PDEATHSIG`), so a hog never
//!   outlives its phase.
//! - Each thread does integer work and never blocks or sleeps: it is always runnable.

use anyhow::{Context as _, Result};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The environment variable that makes the bench binary a hog program of this many threads.
pub const PROGRAM_ENV: &str = "SIPHON_BENCH_HOG_THREADS";

/// A running hog: threads in this process, or a program of its own.
pub enum Hog {
    /// Busy threads of the bench process (`--hog-in-process`).
    InProcess(CpuHog),
    /// The bench binary running [`run_program`] in a session of its own.
    Program(HogProgram),
}

/// The hog program's process, killed and reaped on drop.
pub struct HogProgram(Child);

impl Drop for HogProgram {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Hog {
    /// Starts `threads` busy threads in a program of their own, in a new session.
    pub fn program(threads: usize) -> Result<Hog> {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe().context("finding the bench binary")?;
        let mut command = Command::new(exe);
        command.env(PROGRAM_ENV, threads.to_string());
        // SAFETY: setsid(2) and prctl(2) are async-signal-safe, and nothing else runs in the
        // child between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().context("starting the hog program")?;
        Ok(Hog::Program(HogProgram(child)))
    }

    /// Starts `threads` busy threads in this process.
    pub fn in_process(threads: usize) -> Result<Hog> {
        Ok(Hog::InProcess(CpuHog::start(threads)?))
    }

    /// Stops the threads (or the program; dropping the hog does the same).
    pub fn stop(self) {
        match self {
            Hog::InProcess(hog) => {
                hog.stop();
            }
            Hog::Program(program) => drop(program),
        }
    }
}

/// The hog program's threads, when this process was started as one ([`PROGRAM_ENV`]).
pub fn program_threads() -> Option<usize> {
    std::env::var(PROGRAM_ENV).ok()?.parse().ok()
}

/// Runs `threads` busy threads until the process is killed.
pub fn run_program(threads: usize) -> ! {
    static NEVER: AtomicBool = AtomicBool::new(false);
    for _ in 1..threads {
        std::thread::spawn(|| spin(&NEVER));
    }
    loop {
        spin(&NEVER);
    }
}

/// Busy threads of the hog in `--contention` mode.
pub const THREADS: usize = 2;

/// Running busy threads; stopped by [`CpuHog::stop`] or on drop.
pub struct CpuHog {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl CpuHog {
    /// Starts `threads` busy threads.
    pub fn start(threads: usize) -> Result<CpuHog> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut hog = CpuHog {
            stop: stop.clone(),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let stop = stop.clone();
            // On failure `hog` is dropped, which stops the threads already started.
            let handle = std::thread::Builder::new()
                .name(format!("bench-hog-{i}"))
                .spawn(move || spin(&stop))
                .context("starting a CPU hog thread")?;
            hog.threads.push(handle);
        }
        Ok(hog)
    }

    /// Stops and joins the threads; returns the rounds of work they did (all together).
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).map(|t| t.join().unwrap_or(0)).sum()
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Integer work (an xorshift generator) until `stop`; returns the rounds done.
fn spin(stop: &AtomicBool) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rounds = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
        rounds += 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn works_until_stopped() -> Result<()> {
        let hog = CpuHog::start(THREADS)?;
        assert_eq!(hog.threads.len(), THREADS);
        std::thread::sleep(Duration::from_millis(50));
        assert!(hog.stop() > 0, "the threads did no work");
        Ok(())
    }

    #[test]
    fn dropping_stops_the_threads() -> Result<()> {
        let hog = CpuHog::start(THREADS)?;
        let flag = hog.stop.clone();
        let started = Instant::now();
        drop(hog);
        assert!(flag.load(Ordering::Relaxed));
        // Drop joined the threads: it returned, quickly.
        assert!(started.elapsed() < Duration::from_secs(5));
        Ok(())
    }

    #[test]
    fn stops_on_an_error_path() {
        fn phase(flag: &mut Option<Arc<AtomicBool>>) -> Result<()> {
            let hog = CpuHog::start(1)?;
            *flag = Some(hog.stop.clone());
            anyhow::bail!("a drain failed");
        }
        let mut flag = None;
        assert!(phase(&mut flag).is_err());
        assert!(flag.is_some_and(|f| f.load(Ordering::Relaxed)));
    }
}
