//! The in-flight window: what bounds memory.
//!
//! # Invariants
//! - Records are only read from the replication stream while [`InFlightWindow::has_room`]; so
//!   at most `max_records` records (and `max_bytes` bytes, plus one record) are held between
//!   the stream and Kafka's acknowledgement, whatever the backlog.

/// Counts records and bytes handed to Kafka and not yet acknowledged.
#[derive(Debug, Clone)]
pub struct InFlightWindow {
    max_records: usize,
    max_bytes: usize,
    records: usize,
    bytes: usize,
}

impl InFlightWindow {
    /// A window of at most `max_records` records and `max_bytes` bytes (both at least 1).
    pub fn new(max_records: usize, max_bytes: usize) -> Self {
        InFlightWindow {
            max_records: max_records.max(1),
            max_bytes: max_bytes.max(1),
            records: 0,
            bytes: 0,
        }
    }

    /// Whether another record may be read.
    pub fn has_room(&self) -> bool {
        self.records < self.max_records && self.bytes < self.max_bytes
    }

    /// A record of `bytes` bytes was handed to Kafka.
    pub fn add(&mut self, bytes: usize) {
        self.records += 1;
        self.bytes += bytes;
    }

    /// A record of `bytes` bytes was acknowledged (or failed).
    pub fn release(&mut self, bytes: usize) {
        self.records = self.records.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// Records in flight.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Bytes in flight.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_closes_on_records_or_bytes() {
        let mut w = InFlightWindow::new(2, 100);
        assert!(w.has_room());
        w.add(10);
        w.add(10);
        assert!(!w.has_room(), "record limit");
        w.release(10);
        assert!(w.has_room());
        w.add(200);
        assert!(!w.has_room(), "byte limit");
        w.release(200);
        w.release(10);
        assert_eq!((w.records(), w.bytes()), (0, 0));
    }
}
