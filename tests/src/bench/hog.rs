//! A CPU hog for the `--contention` drains: busy threads inside the bench process that compete
//! for the cores with the database, the broker and the client being measured, the way other
//! work on a shared host does.
//!
//! # Invariants
//! - The threads run from [`CpuHog::start`] until the hog is stopped or dropped; dropping it
//!   (an error path, an interrupted run) stops and joins them, and the threads die with the
//!   process in any case, so a hog never outlives its phase.
//! - Each thread does integer work and never blocks or sleeps: it is always runnable.

use anyhow::{Context as _, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

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
