//! Peak resident memory and CPU time of a running process, from /proc.

use anyhow::{bail, Context as _, Result};

/// What a process has used since it started.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// `VmHWM`: the peak resident set size, in bytes.
    pub peak_rss_bytes: u64,
    /// User plus system CPU time, in seconds.
    pub cpu_secs: f64,
    /// The system (kernel) part of `cpu_secs`.
    pub sys_secs: f64,
    /// Voluntary context switches (a thread blocked and was woken again) over all threads.
    pub voluntary_switches: u64,
}

/// Reads `/proc/PID/status` and `/proc/PID/stat` of a live process.
pub fn sample(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let (user, sys) = cpu_ticks(&stat)?;
    Ok(Usage {
        peak_rss_bytes: peak_rss(&status)?,
        cpu_secs: (user + sys) as f64 / clock_ticks_per_sec(),
        sys_secs: sys as f64 / clock_ticks_per_sec(),
        voluntary_switches: voluntary_switches(pid),
    })
}

/// Sum of `voluntary_ctxt_switches` over the threads in /proc/PID/task (0 if unreadable).
fn voluntary_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The pid of the process whose command line contains every one of `needles`, if any.
pub fn find_process(needles: &[&str]) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.filter_map(|e| e.ok()).find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let raw = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        needles.iter().all(|n| cmdline.contains(n)).then_some(pid)
    })
}

/// CPU seconds a process has used so far, if it can be read.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (user, sys) = cpu_ticks(&stat).ok()?;
    Some((user + sys) as f64 / clock_ticks_per_sec())
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

/// (utime, stime): fields 14 and 15 of /proc/PID/stat, in clock ticks. The command name
/// (field 2) is in parentheses and may contain spaces, so fields are counted after its `)`.
fn cpu_ticks(stat: &str) -> Result<(u64, u64)> {
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
    Ok((field(11)?, field(12)?))
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
        assert_eq!(cpu_ticks(stat).ok(), Some((250, 50)));
    }
}
