//! The source position as record headers (`format.position_headers`), for consumers that drop
//! repeats: `siphon.source` names the server and the slot, `siphon.position` the commit LSN of
//! the record's transaction and the record's index among the records of that transaction
//! (routed records and dead letters of rows, in routing order), as text that sorts as the
//! positions do.
//!
//! # Invariants
//! - `siphon.position` is 16 upper-case hex digits of the commit LSN, a colon and 10 decimal
//!   digits of the index (from 0): comparing two values as strings compares the positions.
//! - Within one source, the records of one partition carry strictly increasing positions in
//!   commit order (commit LSNs grow in commit order, indexes within a transaction), and a
//!   record sent again after a failure or a restart carries the position it had the first time
//!   (the same transaction routes to the same records in the same order): a consumer drops a
//!   repeat with one comparison per partition, a position not above the last one it kept.

use bytes::Bytes;
use pgoutput::Lsn;
use siphon_router::{Header, RoutedRecord};
use std::sync::Arc;

/// The name of the header naming the source.
pub const SOURCE_HEADER: &str = "siphon.source";
/// The name of the header carrying the position.
pub const POSITION_HEADER: &str = "siphon.position";

/// Stamps routed records with their source position.
#[derive(Debug, Clone)]
pub struct PositionHeaders {
    source: Bytes,
    source_name: Arc<str>,
    position_name: Arc<str>,
}

impl PositionHeaders {
    /// Headers naming the server `system_id` (unknown: `unknown`) and `slot`:
    /// `siphon.source` = `<system identifier>/<slot>`.
    pub fn new(system_id: Option<&str>, slot: &str) -> Self {
        PositionHeaders {
            source: Bytes::from(format!("{}/{slot}", system_id.unwrap_or("unknown"))),
            source_name: Arc::from(SOURCE_HEADER),
            position_name: Arc::from(POSITION_HEADER),
        }
    }

    /// Appends the two headers to `record`, the record `index` (from 0) of the transaction
    /// committed at `commit_lsn`.
    pub fn stamp(&self, commit_lsn: Lsn, index: u32, record: &mut RoutedRecord) {
        let position = position_text(commit_lsn, index);
        record.headers.push(Header {
            name: Arc::clone(&self.source_name),
            value: Some(self.source.clone()),
        });
        record.headers.push(Header {
            name: Arc::clone(&self.position_name),
            value: Some(Bytes::from(position)),
        });
    }
}

/// `siphon.position` of the record with `index` in the transaction committed at `commit_lsn`.
pub fn position_text(commit_lsn: Lsn, index: u32) -> String {
    format!("{:016X}:{index:010}", commit_lsn.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> RoutedRecord {
        RoutedRecord {
            topic: "t".into(),
            key: None,
            value: None,
            headers: vec![Header {
                name: Arc::from("id"),
                value: Some(Bytes::from_static(b"1")),
            }],
            timestamp_ms: None,
            partition: None,
        }
    }

    #[test]
    fn records_are_numbered_within_their_transaction() {
        let headers = PositionHeaders::new(Some("7311"), "s");
        let stamped: Vec<RoutedRecord> = [
            (Lsn(0x16_B374_D848), 0),
            (Lsn(0x16_B374_D848), 1),
            (Lsn(0x17), 0),
        ]
        .iter()
        .map(|(lsn, index)| {
            let mut r = record();
            headers.stamp(*lsn, *index, &mut r);
            r
        })
        .collect();
        let value = |r: &RoutedRecord, name: &str| {
            r.headers
                .iter()
                .find(|h| &*h.name == name)
                .and_then(|h| h.value.clone())
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        assert_eq!(stamped[0].headers[0].name.as_ref(), "id", "appended after");
        assert_eq!(value(&stamped[0], SOURCE_HEADER).as_deref(), Some("7311/s"));
        assert_eq!(
            value(&stamped[0], POSITION_HEADER).as_deref(),
            Some("00000016B374D848:0000000000")
        );
        assert_eq!(
            value(&stamped[1], POSITION_HEADER).as_deref(),
            Some("00000016B374D848:0000000001")
        );
        assert_eq!(
            value(&stamped[2], POSITION_HEADER).as_deref(),
            Some("0000000000000017:0000000000")
        );
    }

    proptest! {
        /// Comparing the texts compares the positions.
        #[test]
        fn text_order_is_position_order(a in any::<u64>(), i in any::<u32>(), b in any::<u64>(), j in any::<u32>()) {
            let texts = position_text(Lsn(a), i).cmp(&position_text(Lsn(b), j));
            prop_assert_eq!(texts, (a, i).cmp(&(b, j)));
        }
    }
}
