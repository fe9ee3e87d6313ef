//! Dead-letter records: a row that cannot be routed, or a record the broker will never accept,
//! written to the dead-letter topic with why and where it came from.
//!
//! # Invariants
//! - A dead-letter record always names the error, the stage and the source transaction; a row's
//!   record also names the table and the change's LSN.
//! - The whole record (key, value, header names and values, as counted by
//!   [`record_bytes`](siphon_record::record_bytes)) stays under the limit it was built with
//!   (at most [`MAX_VALUE_BYTES`], and [`HEADROOM_BYTES`] below the producer's
//!   `message.max.bytes`), however many large columns or headers the original has: what does
//!   not fit (column values, the original value, key or headers) is left out and the header
//!   `siphon.error.omitted` says what; a long error message or omission list is cut, ending
//!   with [`TRUNCATED_MARKER`].
//! - A dead letter carries no timestamp of its own: the producer stamps it when it is sent, so
//!   the dead-letter topic's retention counts from the refusal. The refused record's event time
//!   is kept in the header `siphon.original.timestamp` (milliseconds since the epoch).

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, TupleData};
use siphon_router::{Header, RoutedRecord};
use std::fmt::Display;
use std::sync::Arc;

/// The largest dead-letter record (key, value and headers) by default (below Kafka's default
/// 1 MB message limit).
pub const MAX_VALUE_BYTES: usize = 900 * 1024;
/// Room left for the protocol overhead (record framing, header counts) below the producer's
/// limit.
pub const HEADROOM_BYTES: usize = 16 * 1024;
/// Column values longer than this are left out of a dead-lettered row.
const MAX_COLUMN_BYTES: usize = 64 * 1024;
/// The error message header is cut to this many bytes (and to a quarter of the record limit).
const MAX_ERROR_BYTES: usize = 4 * 1024;
/// Room kept for the `siphon.error.omitted` header, cut to fit (and at most an eighth of the
/// record limit).
const OMITTED_ROOM_BYTES: usize = 4 * 1024;
/// Ends a header value that was cut.
pub const TRUNCATED_MARKER: &str = "... [truncated by Siphon]";

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
    topic: Arc<str>,
    /// The largest record built (key, value and headers).
    max_record_bytes: usize,
}

/// `text`, cut to at most `max` bytes (on a character boundary) ending with
/// [`TRUNCATED_MARKER`] when it is longer.
fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(TRUNCATED_MARKER.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{TRUNCATED_MARKER}", &text[..end])
}

/// Bytes a header holds in a record.
fn header_bytes(header: &Header) -> usize {
    header.name.len() + header.value.as_ref().map_or(0, |v| v.len())
}

/// Adds `siphon.error.omitted` listing what was left out, cut to its reserved room.
fn push_omitted(headers: &mut Vec<Header>, omitted: &[String], room: usize) {
    if !omitted.is_empty() {
        let name = "siphon.error.omitted";
        headers.push(header(
            name,
            truncated(&omitted.join(", "), room.saturating_sub(name.len())),
        ));
    }
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

fn common_headers(
    error: &(impl Display + ?Sized),
    max_error_bytes: usize,
    stage: Stage,
    commit_lsn: Option<Lsn>,
) -> Vec<Header> {
    let mut headers = vec![
        header(
            "siphon.error.message",
            truncated(&error.to_string(), max_error_bytes),
        ),
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
        let max_record_bytes = producer_max_bytes
            .saturating_sub(HEADROOM_BYTES)
            .min(MAX_VALUE_BYTES);
        DeadLetters {
            topic: Arc::from(topic),
            max_record_bytes,
        }
    }

    /// The largest record (key, value and headers) these dead letters are built under.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    fn max_error_bytes(&self) -> usize {
        MAX_ERROR_BYTES.min(self.max_record_bytes / 4)
    }

    fn omitted_room(&self) -> usize {
        OMITTED_ROOM_BYTES.min(self.max_record_bytes / 8)
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// A row that could not be routed: its columns as a JSON object of PostgreSQL text values,
    /// in table order, as many as fit under the record limit.
    pub fn for_row(
        &self,
        relation: &Relation,
        tuple: &TupleData,
        error: &(impl Display + ?Sized),
        lsn: Lsn,
        commit_lsn: Option<Lsn>,
    ) -> RoutedRecord {
        let mut headers = common_headers(error, self.max_error_bytes(), Stage::Route, commit_lsn);
        headers.push(header(
            "siphon.source.table",
            format!("{}.{}", relation.namespace, relation.name),
        ));
        headers.push(header("siphon.source.lsn", lsn.to_string()));
        // Room for the value: the limit less the headers and the omission list.
        let headers_size: usize = headers.iter().map(header_bytes).sum();
        let mut room = self
            .max_record_bytes
            .saturating_sub(headers_size + self.omitted_room());
        // Every column takes at least `"name":null,`; the room for values is what is left.
        let skeleton: usize = 2 + relation
            .columns
            .iter()
            .map(|c| json_string_len(c.name.as_str()) + ",:null".len())
            .sum::<usize>();
        room = room.saturating_sub(skeleton);
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
                    if bytes.len() > MAX_COLUMN_BYTES.min(room) =>
                {
                    omitted.push(format!("{name} ({} bytes)", bytes.len()));
                    serde_json::Value::Null
                }
                Some(column @ (Column::Text(bytes) | Column::Binary(bytes))) => {
                    let text = match column {
                        Column::Binary(_) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
                        _ => String::from_utf8_lossy(bytes).into_owned(),
                    };
                    // Its encoded size, escapes included, less the `null` counted already.
                    let size = json_string_len(&text).saturating_sub("null".len());
                    if size > room {
                        omitted.push(format!("{name} ({} bytes)", bytes.len()));
                        serde_json::Value::Null
                    } else {
                        room -= size;
                        serde_json::Value::String(text)
                    }
                }
            };
            row.push((name, value));
        }
        let value = json_object(&row);
        push_omitted(&mut headers, &omitted, self.omitted_room());
        RoutedRecord {
            topic: Arc::clone(&self.topic),
            key: None,
            value: Some(Bytes::from(value)),
            headers,
            timestamp_ms: None,
            partition: None,
        }
    }

    /// A routed record the broker refused: the original key, headers and value, as much of
    /// them as fits under the record limit (in that order of preference: headers, key, value),
    /// plus the error and the original topic.
    pub fn for_record(
        &self,
        original: RoutedRecord,
        error: &(impl Display + ?Sized),
        stage: Stage,
        commit_lsn: Option<Lsn>,
    ) -> RoutedRecord {
        let mut headers = common_headers(error, self.max_error_bytes(), stage, commit_lsn);
        headers.push(header(
            "siphon.original.topic",
            Bytes::copy_from_slice(original.topic.as_bytes()),
        ));
        if let Some(ms) = original.timestamp_ms {
            headers.push(header("siphon.original.timestamp", ms.to_string()));
        }
        let headers_size: usize = headers.iter().map(header_bytes).sum();
        let mut room = self
            .max_record_bytes
            .saturating_sub(headers_size + self.omitted_room());
        let mut omitted = Vec::new();
        let mut kept_headers = Vec::with_capacity(original.headers.len());
        for h in original.headers {
            let size = header_bytes(&h);
            if size > room {
                omitted.push(format!("header {} ({size} bytes)", h.name));
            } else {
                room -= size;
                kept_headers.push(h);
            }
        }
        let mut fit = |part: Option<Bytes>, what: &str, omitted: &mut Vec<String>| match part {
            Some(bytes) if bytes.len() > room => {
                omitted.push(format!("{what} ({} bytes)", bytes.len()));
                None
            }
            Some(bytes) => {
                room -= bytes.len();
                Some(bytes)
            }
            None => None,
        };
        let key = fit(original.key, "key", &mut omitted);
        let value = fit(original.value, "value", &mut omitted);
        push_omitted(&mut headers, &omitted, self.omitted_room());
        headers.extend(kept_headers);
        RoutedRecord {
            topic: Arc::clone(&self.topic),
            key,
            value,
            headers,
            // Stamped by the producer when sent: the dead-letter topic's retention counts from
            // the refusal, not from an event time it may already have passed.
            timestamp_ms: None,
            partition: None,
        }
    }
}

/// Bytes of `text` written as a JSON string (quotes and escapes included).
fn json_string_len(text: &str) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a string to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, text);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::{RelationColumn, ReplicaIdentity, Text};
    use siphon_record::record_bytes;

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
        assert_eq!(&*r.topic, "dlq");
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
    fn a_refused_record_is_stamped_when_dead_lettered_with_its_event_time_in_a_header() {
        // An event time older than the dead-letter topic's retention would have the broker
        // delete the letter at its next retention check.
        let original = RoutedRecord {
            topic: "outbox.event.Order".into(),
            key: None,
            value: Some(Bytes::from_static(b"{}")),
            headers: vec![],
            timestamp_ms: Some(978_307_200_000),
            partition: None,
        };
        let r = DeadLetters::new("dlq".into(), 1_000_000).for_record(
            original.clone(),
            "InvalidTimestamp",
            Stage::Produce,
            None,
        );
        assert_eq!(r.timestamp_ms, None, "stamped by the producer when sent");
        assert_eq!(
            header_value(&r, "siphon.original.timestamp"),
            Some(&b"978307200000"[..])
        );
        let untimed = RoutedRecord {
            timestamp_ms: None,
            ..original
        };
        let r = DeadLetters::new("dlq".into(), 1_000_000).for_record(
            untimed,
            "e",
            Stage::Produce,
            None,
        );
        assert_eq!(header_value(&r, "siphon.original.timestamp"), None);
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

    fn wide_relation(columns: usize) -> Relation {
        Relation {
            columns: (0..columns)
                .map(|i| RelationColumn {
                    flags: 0,
                    name: Text::new(Bytes::from(format!("column_{i}"))).unwrap(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
            ..relation()
        }
    }

    #[test]
    fn a_row_with_many_large_columns_stays_under_the_record_limit() {
        let columns = 40;
        // Each column is under the per-column cap, together they are 2.4 MB.
        let tuple = TupleData {
            columns: (0..columns)
                .map(|_| Column::Text(Bytes::from(vec![b'"'; 30_000])))
                .collect(),
        };
        let dead_letters = DeadLetters::new("dlq".into(), 1_000_000);
        let error = "e".repeat(100_000);
        let r = dead_letters.for_row(&wide_relation(columns), &tuple, &error, Lsn(1), None);
        let size = record_bytes(&r);
        assert!(
            size <= dead_letters.max_record_bytes(),
            "{size} bytes > {}",
            dead_letters.max_record_bytes()
        );
        assert!(
            size > dead_letters.max_record_bytes() / 2,
            "fills the room: {size}"
        );
        let omitted = std::str::from_utf8(header_value(&r, "siphon.error.omitted").unwrap())
            .unwrap()
            .to_owned();
        assert!(omitted.contains("column_39 (30000 bytes)"), "{omitted}");
        assert!(!omitted.contains("column_0 "), "{omitted}");
        let message = header_value(&r, "siphon.error.message").unwrap();
        assert!(message.len() <= MAX_ERROR_BYTES);
        assert!(message.ends_with(TRUNCATED_MARKER.as_bytes()));
        let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            value.as_object().unwrap().len(),
            columns,
            "every column is named"
        );
        assert_eq!(value["column_39"], serde_json::Value::Null);
        assert_eq!(value["column_0"].as_str().unwrap().len(), 30_000);
    }

    #[test]
    fn a_refused_record_with_large_headers_stays_under_the_record_limit() {
        let original = RoutedRecord {
            topic: "outbox.event.Order".into(),
            key: Some(Bytes::from(vec![b'k'; 200_000])),
            value: Some(Bytes::from(vec![b'v'; 300_000])),
            headers: (0..10)
                .map(|i| header(&format!("h{i}"), vec![b'x'; 100_000]))
                .collect(),
            timestamp_ms: None,
            partition: None,
        };
        let dead_letters = DeadLetters::new("dlq".into(), 1_000_000);
        let r = dead_letters.for_record(original, "refused", Stage::Produce, None);
        assert!(record_bytes(&r) <= dead_letters.max_record_bytes());
        assert_eq!(header_value(&r, "h0").map(<[u8]>::len), Some(100_000));
        let omitted = std::str::from_utf8(header_value(&r, "siphon.error.omitted").unwrap())
            .unwrap()
            .to_owned();
        assert!(omitted.contains("header h9 (100002 bytes)"), "{omitted}");
        assert!(omitted.contains("value (300000 bytes)"), "{omitted}");
    }

    #[test]
    fn under_a_small_limit_the_key_and_headers_are_kept_before_the_value() {
        let original = RoutedRecord {
            topic: "outbox.event.Order".into(),
            key: Some(Bytes::from_static(b"\"order-3\"")),
            value: Some(Bytes::from(vec![b'x'; 30_000])),
            headers: vec![header("id", "00000000-0000-4000-8000-000000000003")],
            timestamp_ms: None,
            partition: None,
        };
        let dead_letters = DeadLetters::new("dlq".into(), 20_000);
        let error = "a record for topic outbox.event.Order was refused with MessageSizeTooLarge (code 10): raise the topic's max.message.bytes (and kafka.properties.\"message.max.bytes\"), or make the payload smaller";
        let r = dead_letters.for_record(original, error, Stage::Produce, Some(Lsn(9)));
        assert!(record_bytes(&r) <= dead_letters.max_record_bytes());
        assert_eq!(r.key.as_deref(), Some(&b"\"order-3\""[..]));
        assert!(header_value(&r, "id").is_some());
        assert_eq!(r.value, None);
        assert_eq!(
            header_value(&r, "siphon.error.message"),
            Some(error.as_bytes())
        );
    }

    #[test]
    fn cutting_keeps_characters_whole() {
        let cut = truncated(&"é".repeat(100), 40);
        assert!(cut.len() <= 40);
        assert!(cut.ends_with(TRUNCATED_MARKER));
        assert_eq!(truncated("short", 40), "short");
    }
}
