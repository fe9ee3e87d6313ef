//! Free loopback TCP ports for services started by tests.
//!
//! # Invariants
//!
//! - Only 127.0.0.1 is ever bound.
//! - Within one test process a port is handed out at most once, so parallel
//!   tests never race each other for the same port (another process may still
//!   take it between this call and the service binding it; the kernel hands
//!   out ephemeral ports in rotation, which makes that rare).

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this process
/// has not handed out before.
///
/// # Panics
///
/// If the kernel refuses to bind 127.0.0.1:0 a thousand times in a row: no
/// test can run on such a machine.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            Ok(addr) => addr.port(),
            Err(_) => continue,
        };
        // A poisoned lock only means another test panicked while holding it;
        // the set itself is still valid.
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return port;
        }
    }
    panic!("could not find a free TCP port on 127.0.0.1");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_bindable() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        TcpListener::bind((Ipv4Addr::LOCALHOST, ports[0])).unwrap();
    }
}
