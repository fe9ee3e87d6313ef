//! The machine's stalls over a stretch of the run, from Linux's pressure stall information
//! (`/proc/pressure/cpu`, `/proc/pressure/io`): the share of the time at least one task waited
//! for a core, or for I/O (a disk flush, a writer throttled while dirty pages are written back).
//!
//! # Invariants
//! - A kernel without PSI (no `/proc/pressure`) reads as unknown, never as zero.

use std::time::Instant;

/// The cumulative `some` stall time (µs) of each resource at one moment.
pub struct Mark {
    at: Instant,
    cpu_us: Option<u64>,
    io_us: Option<u64>,
}

/// The share of a stretch's wall time during which some task stalled, per resource.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stalls {
    pub cpu: Option<f64>,
    pub io: Option<f64>,
}

/// The `total=` of the `some` line of a pressure file.
fn some_total(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

fn read(resource: &str) -> Option<u64> {
    some_total(&std::fs::read_to_string(format!("/proc/pressure/{resource}")).ok()?)
}

/// Now.
pub fn mark() -> Mark {
    Mark {
        at: Instant::now(),
        cpu_us: read("cpu"),
        io_us: read("io"),
    }
}

/// The stalls since `from`.
pub fn since(from: &Mark) -> Stalls {
    let wall_us = from.at.elapsed().as_micros() as f64;
    let share = |before: Option<u64>, now: Option<u64>| {
        let stalled = now?.checked_sub(before?)?;
        (wall_us > 0.0).then(|| stalled as f64 / wall_us)
    };
    Stalls {
        cpu: share(from.cpu_us, read("cpu")),
        io: share(from.io_us, read("io")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_some_line_total_is_read() {
        let text = "some avg10=0.00 avg60=0.29 avg300=1.25 total=622776341\n\
                    full avg10=0.00 avg60=0.22 avg300=0.95 total=229983465\n";
        assert_eq!(some_total(text), Some(622_776_341));
        assert_eq!(some_total("full avg10=0.00 total=5\n"), None);
        assert_eq!(some_total(""), None);
    }
}
