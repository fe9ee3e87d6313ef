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
    /// Minor page faults (a page mapped on first touch, zeroed by the kernel) over all threads.
    pub minor_faults: u64,
}

/// Reads `/proc/PID/status` and `/proc/PID/stat` of a live process.
pub fn sample(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let (user, sys) = cpu_ticks(&stat)?;
    let minor_faults = stat_field(&stat, 7)?;
    Ok(Usage {
        peak_rss_bytes: peak_rss(&status)?,
        cpu_secs: (user + sys) as f64 / clock_ticks_per_sec(),
        sys_secs: sys as f64 / clock_ticks_per_sec(),
        voluntary_switches: voluntary_switches(pid),
        minor_faults,
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

/// The pid of the process listening on TCP port `port` (any local address, IPv4 or IPv6), if
/// this host has one and its file descriptors can be read.
pub fn listener_pid(port: u16) -> Option<u32> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.filter_map(|e| e.ok()).find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let fds = std::fs::read_dir(e.path().join("fd")).ok()?;
        fds.filter_map(|fd| fd.ok())
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|link| wanted.iter().any(|w| link.as_os_str() == w.as_str()))
            .then_some(pid)
    })
}

/// Socket inodes of the LISTEN entries (state `0A`) on `port` in a /proc/net/tcp{,6} table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    let port_hex = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            (local.ends_with(&port_hex) && *state == "0A" && *inode != "0")
                .then(|| (*inode).to_owned())
        })
        .collect()
}

/// CPU seconds a process has used so far, if it can be read.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (user, sys) = cpu_ticks(&stat).ok()?;
    Some((user + sys) as f64 / clock_ticks_per_sec())
}

/// CPU seconds a JVM's JIT compiler threads have used so far (HotSpot names them
/// `C1 CompilerThreadN` and `C2 CompilerThreadN`; /proc keeps the first 15 bytes), if the
/// process can be read. 0 for a process without such threads.
pub fn jit_cpu_secs(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ticks: u64 = tasks
        .filter_map(|t| t.ok())
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|comm| is_jit_compiler_thread(comm.trim_end()))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| cpu_ticks(&stat).ok())
        .map(|(user, sys)| user + sys)
        .sum();
    Some(ticks as f64 / clock_ticks_per_sec())
}

/// Whether a thread's `comm` is one of HotSpot's JIT compiler threads.
fn is_jit_compiler_thread(comm: &str) -> bool {
    ["C1 CompilerThre", "C2 CompilerThre"]
        .iter()
        .any(|prefix| comm.starts_with(prefix))
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
    // After ")": field 3 (state) is index 0, so utime (14) is index 11, stime (15) index 12.
    Ok((stat_field(stat, 11)?, stat_field(stat, 12)?))
}

/// A numeric field of /proc/PID/stat by its index after the command name's `)` (field 3,
/// the state, is index 0; minflt, field 10, index 7).
fn stat_field(stat: &str, index: usize) -> Result<u64> {
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("malformed /proc/PID/stat")?;
    after
        .split_whitespace()
        .nth(index)
        .context("/proc/PID/stat has too few fields")?
        .parse::<u64>()
        .context("a field of /proc/PID/stat is not a number")
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
    fn knows_hotspot_compiler_threads_by_their_truncated_names() {
        assert!(is_jit_compiler_thread("C2 CompilerThre"));
        assert!(is_jit_compiler_thread("C1 CompilerThre"));
        assert!(!is_jit_compiler_thread("data-plane-kafk"));
        assert!(!is_jit_compiler_thread("GC Thread#0"));
        assert!(!is_jit_compiler_thread("C2"));
    }

    #[test]
    fn a_process_without_compiler_threads_used_no_jit_time() {
        assert_eq!(jit_cpu_secs(std::process::id()), Some(0.0));
        assert_eq!(jit_cpu_secs(u32::MAX), None);
    }

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tsiphon\nVmPeak:\t  100 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(peak_rss(status).ok(), Some(2048 * 1024));
        let stat = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1 2 3";
        assert_eq!(cpu_ticks(stat).ok(), Some((250, 50)));
        // minflt, field 10.
        assert_eq!(stat_field(stat, 7).ok(), Some(100));
    }

    #[test]
    fn finds_the_listening_socket_of_a_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4A9C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 0100007F:4A9C 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0
";
        // 0x4A9C = 19100: the listener, not the established connection on the same port.
        assert_eq!(listening_inodes(table, 19100), ["111"]);
        assert_eq!(listening_inodes(table, 8080), ["333"]);
        assert!(listening_inodes(table, 8081).is_empty());
        let own = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a listener");
        let port = own.local_addr().expect("local address").port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
    }
}
