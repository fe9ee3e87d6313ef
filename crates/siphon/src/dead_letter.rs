//! Dead-letter records: a row that cannot be routed, or a record the broker will never accept,
//! written to the dead-letter topic with why and where it came from.
//!
//! # Invariants
//! - A dead-letter record always names the error, the stage and the source transaction; a row's
//!   record also names the table and the change's LSN.
//! - Its value stays under the limit it was built with (at most [`MAX_VALUE_BYTES`], and below
//!   the producer's `message.max.bytes`): longer column values (or an oversized original value)
//!   are left out and the header `siphon.error.omitted` says which.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, TupleData};
use siphon_router::{Header, RoutedRecord};
use std::sync::Arc;

/// The largest value a dead-letter record carries by default (below Kafka's default 1 MB
/// message limit).
pub const MAX_VALUE_BYTES: usize = 900 * 1024;
/// Room left for the key, the headers and the protocol overhead below the producer's limit.
const HEADROOM_BYTES: usize = 16 * 1024;
/// Column values longer than this are left out of a dead-lettered row.
const MAX_COLUMN_BYTES: usize = 64 * 1024;

/// Where in the pipeline the failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Turning the row into a record (bad payload, missing column, NULL key ...).
    Route,
    /// Writing the record to Kafka (too large, topic refused ...).
    Produce,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Route => "route",
            Stage::Produce => "produce",
        }
    }
}

/// Builds dead-letter records for one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetters {
    topic: String,
    max_value_bytes: usize,
}

/// `{"name":value,...}` in the given order.
fn json_object(fields: &[(String, serde_json::Value)]) -> Vec<u8> {
    let mut out = b"{".to_vec();
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Serializing a string or a JSON value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, name);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, value);
    }
    out.push(b'}');
    out
}

fn header(name: &str, value: impl Into<Bytes>) -> Header {
    Header {
        name: Arc::from(name),
        value: Some(value.into()),
    }
}

fn common_headers(error: &str, stage: Stage, commit_lsn: Option<Lsn>) -> Vec<Header> {
    let mut headers = vec![
        header("siphon.error.message", error.to_owned()),
        header("siphon.error.stage", stage.as_str()),
    ];
    if let Some(lsn) = commit_lsn {
        headers.push(header("siphon.source.commit.lsn", lsn.to_string()));
    }
    headers
}

impl DeadLetters {
    /// Dead letters for `topic`, for a producer whose `message.max.bytes` is
    /// `producer_max_bytes`.
    pub fn new(topic: String, producer_max_bytes: usize) -> Self {
        let max_value_bytes = producer_max_bytes
            .saturating_sub(HEADROOM_BYTES)
            .min(MAX_VALUE_BYTES);
        DeadLetters {
            topic,
            max_value_bytes,
        }
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// A row that could not be routed: its columns as a JSON object of PostgreSQL text values.
    pub fn for_row(
        &self,
        relation: &Relation,
        tuple: &TupleData,
        error: &str,
        lsn: Lsn,
        commit_lsn: Option<Lsn>,
    ) -> RoutedRecord {
        // Columns in table order (a JSON object written by hand: serde_json's map sorts keys).
        let mut row: Vec<(String, serde_json::Value)> = Vec::with_capacity(relation.columns.len());
        let mut omitted = Vec::new();
        for (i, column) in relation.columns.iter().enumerate() {
            let name = column.name.to_string();
            let value = match tuple.columns.get(i) {
                None | Some(Column::Null) => serde_json::Value::Null,
                Some(Column::UnchangedToast) => {
                    omitted.push(format!(
                        "{name} (unchanged TOAST value, not sent by the server)"
                    ));
                    serde_json::Value::Null
                }
                Some(Column::Text(bytes)) | Some(Column::Binary(bytes))
                    if bytes.len() > MAX_COLUMN_BYTES.min(self.max_value_bytes / 2) =>
                {
                    omitted.push(format!("{name} ({} bytes)", bytes.len()));
                    serde_json::Value::Null
                }
                Some(Column::Text(bytes)) => {
                    serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned())
                }
                Some(Column::Binary(bytes)) => {
                    serde_json::Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect())
                }
            };
            row.push((name, value));
        }
        let value = json_object(&row);
        let mut headers = common_headers(error, Stage::Route, commit_lsn);
        headers.push(header(
            "siphon.source.table",
            format!("{}.{}", relation.namespace, relation.name),
        ));
        headers.push(header("siphon.source.lsn", lsn.to_string()));
        if !omitted.is_empty() {
            headers.push(header("siphon.error.omitted", omitted.join(", ")));
        }
        RoutedRecord {
            topic: self.topic.clone(),
            key: None,
            value: Some(Bytes::from(value)),
            headers,
            timestamp_ms: None,
            partition: None,
        }
    }

    /// A routed record the broker refused: the original key, headers and (if not too large)
    /// value, plus the error and the original topic.
    pub fn for_record(
        &self,
        original: RoutedRecord,
        error: &str,
        stage: Stage,
        commit_lsn: Option<Lsn>,
    ) -> RoutedRecord {
        let mut headers = common_headers(error, stage, commit_lsn);
        headers.push(header("siphon.original.topic", original.topic.clone()));
        let value = match original.value {
            Some(v) if v.len() > self.max_value_bytes => {
                headers.push(header(
                    "siphon.error.omitted",
                    format!("value ({} bytes)", v.len()),
                ));
                None
            }
            other => other,
        };
        headers.extend(original.headers);
        RoutedRecord {
            topic: self.topic.clone(),
            key: original.key,
            value,
            headers,
            timestamp_ms: original.timestamp_ms,
            partition: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::{RelationColumn, ReplicaIdentity, Text};

    fn relation() -> Relation {
        let column = |name: &'static str| RelationColumn {
            flags: 0,
            name: Text::from_static(name),
            type_oid: 25,
            type_modifier: -1,
        };
        Relation {
            xid: None,
            id: 1,
            namespace: Text::from_static("public"),
            name: Text::from_static("outbox"),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![column("id"), column("payload"), column("big")],
        }
    }

    fn header_value<'a>(r: &'a RoutedRecord, name: &str) -> Option<&'a [u8]> {
        r.headers
            .iter()
            .find(|h| &*h.name == name)
            .and_then(|h| h.value.as_deref())
    }

    #[test]
    fn a_row_keeps_its_columns_and_says_where_it_came_from() {
        let tuple = TupleData {
            columns: vec![
                Column::Text(Bytes::from_static(b"e-1")),
                Column::Text(Bytes::from_static(b"not json \"x\"")),
                Column::Text(Bytes::from(vec![b'a'; MAX_COLUMN_BYTES + 1])),
            ],
        };
        let r = DeadLetters::new("dlq".into(), 1_000_000).for_row(
            &relation(),
            &tuple,
            "payload is not JSON",
            Lsn(0x1_0000_0010),
            Some(Lsn(0x20)),
        );
        assert_eq!(r.topic, "dlq");
        assert_eq!(
            r.value.as_deref(),
            Some(&br#"{"id":"e-1","payload":"not json \"x\"","big":null}"#[..])
        );
        assert_eq!(
            header_value(&r, "siphon.error.message"),
            Some(&b"payload is not JSON"[..])
        );
        assert_eq!(header_value(&r, "siphon.error.stage"), Some(&b"route"[..]));
        assert_eq!(
            header_value(&r, "siphon.source.table"),
            Some(&b"public.outbox"[..])
        );
        assert_eq!(header_value(&r, "siphon.source.lsn"), Some(&b"1/10"[..]));
        assert_eq!(
            header_value(&r, "siphon.source.commit.lsn"),
            Some(&b"0/20"[..])
        );
        assert!(
            std::str::from_utf8(header_value(&r, "siphon.error.omitted").unwrap())
                .unwrap()
                .starts_with("big (")
        );
    }

    #[test]
    fn a_refused_record_keeps_key_and_headers_and_drops_an_oversized_value() {
        let original = RoutedRecord {
            topic: "outbox.event.Order".into(),
            key: Some(Bytes::from_static(b"\"k\"")),
            value: Some(Bytes::from(vec![b'x'; MAX_VALUE_BYTES + 1])),
            headers: vec![header("id", "e-9")],
            timestamp_ms: Some(5),
            partition: None,
        };
        let r = DeadLetters::new("dlq".into(), 1_000_000).for_record(
            original,
            "too large",
            Stage::Produce,
            None,
        );
        assert_eq!(r.key.as_deref(), Some(&b"\"k\""[..]));
        assert_eq!(r.value, None);
        assert_eq!(header_value(&r, "id"), Some(&b"e-9"[..]));
        assert_eq!(
            header_value(&r, "siphon.original.topic"),
            Some(&b"outbox.event.Order"[..])
        );
        assert_eq!(
            header_value(&r, "siphon.error.stage"),
            Some(&b"produce"[..])
        );
        assert!(header_value(&r, "siphon.error.omitted").is_some());
    }

    #[test]
    fn the_value_limit_follows_the_producer_limit() {
        let small = RoutedRecord {
            topic: "t".into(),
            key: None,
            value: Some(Bytes::from(vec![b'x'; 20_000])),
            headers: vec![],
            timestamp_ms: None,
            partition: None,
        };
        let kept = DeadLetters::new("dlq".into(), 1_000_000).for_record(
            small.clone(),
            "e",
            Stage::Produce,
            None,
        );
        assert!(kept.value.is_some());
        let dropped =
            DeadLetters::new("dlq".into(), 30_000).for_record(small, "e", Stage::Produce, None);
        assert_eq!(
            dropped.value, None,
            "20 kB does not fit 30 kB minus headroom"
        );
    }
}
