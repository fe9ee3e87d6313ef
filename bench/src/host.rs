//! How fast the machine is on the day of a run: a fixed piece of single-threaded work, timed
//! before the first drain and after the last phase.
//!
//! On a shared VM the speed of every process changes from day to day with the host's load (one
//! run on this machine saw the walsender take 1.7 times the CPU per event of another, for the
//! same work). Ratios within one run stay comparable; absolute figures (µs of CPU per event, ms
//! of latency) do not, and this line tells a slow day from a slower Siphon.
//!
//! # Invariants
//! - The work is the same in every run and build: a fixed number of rounds of integer mixing,
//!   with no memory beyond a few registers, no system calls and no allocation.
//! - The figure is the fastest of several repetitions (the least disturbed one).

use std::hint::black_box;
use std::time::Instant;

/// Mixing steps per repetition (about 0.1 s on the machine of docs/performance.md).
const STEPS: u64 = 100_000_000;

/// Repetitions; the fastest counts.
const REPETITIONS: usize = 5;

/// The processor's model name (`/proc/cpuinfo`), or `"unknown"`: VMs of one size land on
/// different processors from day to day.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Milliseconds the fixed work took (the fastest of [`REPETITIONS`]).
pub fn calibration_ms() -> f64 {
    (0..REPETITIONS)
        .map(|_| {
            let started = Instant::now();
            black_box(mix(black_box(STEPS)));
            started.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// A dependent chain of multiplications, rotations and additions: one step cannot start
/// before the previous one ended, so the time is the core's latency for the chain.
fn mix(steps: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..steps {
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(31) ^ i;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_is_the_same_every_time() {
        assert_eq!(mix(1_000), mix(1_000));
        assert_ne!(mix(1_000), mix(1_001));
    }
}
