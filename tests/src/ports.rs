//! Free loopback TCP ports for services started by tests.
//!
//! Ports come from 10000..32768, below Linux's ephemeral range (32768 and up
//! by default), so an outgoing connection of any process never takes a port
//! between the moment it is handed out and the moment the service binds it.
//!
//! # Invariants
//!
//! - Only 127.0.0.1 is ever bound, and every port handed out is in
//!   [`PORT_RANGE`].
//! - Within one test process a port is handed out at most once, so parallel
//!   tests never race each other for the same port. Processes start at
//!   different points of the range (seeded by pid and time) and skip ports
//!   that are bound, so another test process rarely picks the same one.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

/// The ports handed out: below the kernel's ephemeral range.
pub const PORT_RANGE: std::ops::Range<u16> = 10000..32768;

/// The ports handed out so far, and where the next search starts.
struct State {
    seen: HashSet<u16>,
    next: u32,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut seed = crate::rng::SplitMix64(u64::from(std::process::id()) ^ u64::from(nanos));
        Mutex::new(State {
            seen: HashSet::new(),
            next: (seed.next_u64() % u64::from(PORT_RANGE.end - PORT_RANGE.start)) as u32,
        })
    })
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this process
/// has not handed out before.
///
/// # Panics
///
/// If the kernel refuses to bind 127.0.0.1:0 a thousand times in a row: no
/// test can run on such a machine.
pub fn free_port() -> u16 {
    // A poisoned lock only means another test panicked while holding it; the
    // state itself is still valid.
    let mut state = state().lock().unwrap_or_else(|e| e.into_inner());
    let span = u32::from(PORT_RANGE.end - PORT_RANGE.start);
    for _ in 0..span {
        let offset = state.next % span;
        state.next = state.next.wrapping_add(1);
        // In range by construction: offset < span.
        let port = PORT_RANGE.start + offset as u16;
        if state.seen.contains(&port) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            state.seen.insert(port);
            return port;
        }
    }
    panic!("could not find a free TCP port on 127.0.0.1 in {PORT_RANGE:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        assert!(ports.iter().all(|p| PORT_RANGE.contains(p)), "{ports:?}");
        TcpListener::bind((Ipv4Addr::LOCALHOST, ports[0])).unwrap();
    }
}
