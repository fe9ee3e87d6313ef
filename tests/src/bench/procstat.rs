//! Peak resident memory and CPU time of a running process, from /proc.

use anyhow::{bail, Context as _, Result};

/// What a process has used since it started.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// `VmHWM`: the peak resident set size, in bytes.
    pub peak_rss_bytes: u64,
    /// User plus system CPU time, in seconds.
    pub cpu_secs: f64,
}

/// Reads `/proc/PID/status` and `/proc/PID/stat` of a live process.
pub fn sample(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    Ok(Usage {
        peak_rss_bytes: peak_rss(&status)?,
        cpu_secs: cpu_ticks(&stat)? as f64 / clock_ticks_per_sec(),
    })
}

/// `VmHWM:   12345 kB` in bytes.
fn peak_rss(status: &str) -> Result<u64> {
    let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:")) else {
        bail!("no VmHWM line in /proc/PID/status");
    };
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmHWM line has no value")?
        .parse()
        .context("VmHWM is not a number")?;
    Ok(kb * 1024)
}

/// utime + stime (fields 14 and 15 of /proc/PID/stat), in clock ticks. The command name
/// (field 2) is in parentheses and may contain spaces, so fields are counted after its `)`.
fn cpu_ticks(stat: &str) -> Result<u64> {
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("malformed /proc/PID/stat")?;
    // After ")": field 3 (state) is index 0, so utime (14) is index 11, stime (15) index 12.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .context("/proc/PID/stat has too few fields")?
            .parse::<u64>()
            .context("CPU time in /proc/PID/stat is not a number")
    };
    Ok(field(11)? + field(12)?)
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tsiphon\nVmPeak:\t  100 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(peak_rss(status).ok(), Some(2048 * 1024));
        let stat = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1 2 3";
        assert_eq!(cpu_ticks(stat).ok(), Some(300));
    }
}
