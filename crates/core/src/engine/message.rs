//! Logical decoding messages as outbox rows.
//!
//! An application can write its outbox events with `pg_logical_emit_message(true, prefix,
//! content)` instead of inserting and deleting rows. The content is a JSON object with the
//! outbox fields (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`, plus any placement
//! fields); each message becomes a row of a table that exists only here, whose columns are the
//! object's members, so the same router, with the same options, turns it into the same record a
//! table row would give.
//!
//! # Invariants
//! - Each member keeps the exact text the application wrote: a string member is its decoded
//!   text (`text`), an object or array is its JSON text (`jsonb`), a number its literal
//!   (`numeric`), `true`/`false` a `bool`, `null` a NULL.
//! - One synthetic relation per distinct prefix and set of members (names and kinds), so a
//!   binding is made once per shape, not once per message; relation ids never repeat within a
//!   session and are far above the OIDs PostgreSQL hands out first.
//! - Content that is not a JSON object is a [`MessageError`] naming the prefix and the fix.
//! - Content is text in the database encoding (PostgreSQL converts rows to the stream's UTF-8,
//!   not message contents): it is read through [`DatabaseEncoding`], and content that does not
//!   convert is a [`MessageError`] naming the encoding and the fix, never read with replacement
//!   characters.

use super::encoding::{DatabaseEncoding, EncodingError};
use bytes::Bytes;
use pgoutput::{Column, Oid, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// PostgreSQL type OIDs the members map to.
const BOOL: Oid = 16;
const TEXT: Oid = 25;
const NUMERIC: Oid = 1700;
const JSONB: Oid = 3802;

/// The schema name the synthetic tables are shown under (in logs and dead letters).
pub const MESSAGE_SCHEMA: &str = "pg_logical_emit_message";

/// Why a message's content cannot be an outbox row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("logical message with prefix {prefix:?} is not a JSON object ({reason}): write the outbox fields as one JSON object, e.g. pg_logical_emit_message(true, '{prefix}', json_build_object('id', ..., 'aggregatetype', ..., 'aggregateid', ..., 'type', ..., 'payload', ...)::text)")]
    NotAnObject { prefix: String, reason: JsonFault },
    /// Bytes that are not text in the database encoding (content passed as `bytea`).
    #[error("logical message with prefix {prefix:?} cannot be read: {error}: emit the content as text, e.g. pg_logical_emit_message(true, '{prefix}', json_build_object(...)::text), which PostgreSQL holds in the database encoding")]
    NotInDatabaseEncoding {
        prefix: String,
        error: EncodingError,
    },
    /// Non-ASCII text in a database encoding Siphon cannot convert.
    #[error("logical message with prefix {prefix:?} cannot be read: {error}: write these events to an outbox table instead (PostgreSQL converts rows to UTF-8 for Siphon), or move to a database in UTF8")]
    UnsupportedEncoding {
        prefix: String,
        error: EncodingError,
    },
}

/// Why content is not a JSON object: the parser's error (where, and what it expected).
#[derive(Debug, Clone)]
pub struct JsonFault(Arc<serde_json::Error>);

impl PartialEq for JsonFault {
    fn eq(&self, other: &Self) -> bool {
        (self.0.classify(), self.0.line(), self.0.column())
            == (other.0.classify(), other.0.line(), other.0.column())
    }
}

impl Eq for JsonFault {}

impl std::fmt::Display for JsonFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl MessageError {
    fn encoding(prefix: &str, error: EncodingError) -> Self {
        let prefix = prefix.to_owned();
        match error {
            EncodingError::Invalid { .. } => MessageError::NotInDatabaseEncoding { prefix, error },
            EncodingError::Unsupported { .. } => {
                MessageError::UnsupportedEncoding { prefix, error }
            }
        }
    }
}

/// A prefix and its members' names and column types.
type Shape = (String, Vec<(String, Oid)>);

/// Turns message contents into rows of synthetic relations, one per shape.
#[derive(Debug)]
pub struct MessageRows {
    shapes: HashMap<Shape, Arc<Relation>>,
    next_id: Oid,
    /// What the contents are text in.
    encoding: DatabaseEncoding,
}

impl Default for MessageRows {
    /// Contents in UTF-8.
    fn default() -> Self {
        MessageRows::new(DatabaseEncoding::default())
    }
}

impl MessageRows {
    /// Rows of contents that are text in `encoding` (the database encoding).
    pub fn new(encoding: DatabaseEncoding) -> Self {
        MessageRows {
            shapes: HashMap::new(),
            next_id: Oid::MAX,
            encoding,
        }
    }

    /// The row for `content`, and its relation (new: not seen before in this session).
    pub fn row(
        &mut self,
        prefix: &str,
        content: &[u8],
    ) -> Result<(Arc<Relation>, TupleData, bool), MessageError> {
        let text = self
            .encoding
            .decode(content)
            .map_err(|error| MessageError::encoding(prefix, error))?;
        let members: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(&text).map_err(|e| MessageError::NotAnObject {
                prefix: prefix.to_owned(),
                reason: JsonFault(Arc::new(e)),
            })?;
        let mut shape = Vec::with_capacity(members.len());
        let mut columns = Vec::with_capacity(members.len());
        for (name, raw) in &members {
            let (type_oid, column) = column_of(raw.get());
            shape.push((name.clone(), type_oid));
            columns.push(column);
        }
        let key = (prefix.to_owned(), shape);
        let (relation, new) = match self.shapes.get(&key) {
            Some(relation) => (Arc::clone(relation), false),
            None => {
                let relation = Arc::new(Relation {
                    xid: None,
                    id: self.next_id,
                    namespace: Text::from_static(MESSAGE_SCHEMA),
                    name: Text::new(Bytes::copy_from_slice(prefix.as_bytes()))
                        .unwrap_or_else(|_| Text::from_static("")),
                    replica_identity: ReplicaIdentity::Nothing,
                    columns: key
                        .1
                        .iter()
                        .map(|(name, type_oid)| RelationColumn {
                            flags: 0,
                            name: Text::new(Bytes::copy_from_slice(name.as_bytes()))
                                .unwrap_or_else(|_| Text::from_static("")),
                            type_oid: *type_oid,
                            type_modifier: -1,
                        })
                        .collect(),
                });
                self.next_id = self.next_id.saturating_sub(1);
                self.shapes.insert(key, Arc::clone(&relation));
                (relation, true)
            }
        };
        Ok((relation, TupleData { columns }, new))
    }
}

impl MessageRows {
    /// A message whose content cannot be read as an object, as a one-column row (`content`,
    /// its text, what does not convert from the database encoding replaced), for its dead
    /// letter.
    pub fn unreadable(&self, prefix: &str, content: &[u8]) -> (Relation, TupleData) {
        let relation = Relation {
            xid: None,
            id: 0,
            namespace: Text::from_static(MESSAGE_SCHEMA),
            name: Text::new(Bytes::copy_from_slice(prefix.as_bytes()))
                .unwrap_or_else(|_| Text::from_static("")),
            replica_identity: ReplicaIdentity::Nothing,
            columns: vec![RelationColumn {
                flags: 0,
                name: Text::from_static("content"),
                type_oid: TEXT,
                type_modifier: -1,
            }],
        };
        let text = self.encoding.decode_lossy(content).into_owned();
        let row = TupleData {
            columns: vec![Column::Text(Bytes::from(text))],
        };
        (relation, row)
    }
}

/// The column type and value of one member, from its JSON text.
fn column_of(raw: &str) -> (Oid, Column) {
    let raw = raw.trim();
    match raw.as_bytes().first() {
        Some(b'"') => match serde_json::from_str::<String>(raw) {
            Ok(text) => (TEXT, Column::Text(Bytes::from(text))),
            // A string with an unpaired surrogate escape: kept as its JSON text.
            Err(_) => (JSONB, Column::Text(Bytes::copy_from_slice(raw.as_bytes()))),
        },
        Some(b'{' | b'[') => (JSONB, Column::Text(Bytes::copy_from_slice(raw.as_bytes()))),
        Some(b't') => (BOOL, Column::Text(Bytes::from_static(b"t"))),
        Some(b'f') => (BOOL, Column::Text(Bytes::from_static(b"f"))),
        Some(b'n') => (TEXT, Column::Null),
        _ => (
            NUMERIC,
            Column::Text(Bytes::copy_from_slice(raw.as_bytes())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(column: &Column) -> Option<&str> {
        match column {
            Column::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    #[test]
    fn members_become_typed_columns_with_their_exact_text() {
        let mut rows = MessageRows::default();
        let content = br#"{"id":"e1","aggregatetype":"Order","aggregateid":"o-1","type":"Created",
            "payload":{"total": 1.10, "items":[1,2]},"n":12,"ok":true,"gone":null}"#;
        let (relation, row, new) = rows.row("outbox", content).unwrap();
        assert!(new);
        assert_eq!(relation.namespace.as_str(), MESSAGE_SCHEMA);
        assert_eq!(relation.name.as_str(), "outbox");
        let by_name: HashMap<&str, (Oid, &Column)> = relation
            .columns
            .iter()
            .zip(&row.columns)
            .map(|(c, v)| (c.name.as_str(), (c.type_oid, v)))
            .collect();
        assert_eq!(by_name["id"].0, TEXT);
        assert_eq!(text(by_name["id"].1), Some("e1"));
        assert_eq!(by_name["payload"].0, JSONB);
        assert_eq!(
            text(by_name["payload"].1),
            Some(r#"{"total": 1.10, "items":[1,2]}"#),
            "the payload's text as written"
        );
        assert_eq!(
            (by_name["n"].0, text(by_name["n"].1)),
            (NUMERIC, Some("12"))
        );
        assert_eq!((by_name["ok"].0, text(by_name["ok"].1)), (BOOL, Some("t")));
        assert_eq!(by_name["gone"].1, &Column::Null);
    }

    #[test]
    fn one_relation_per_shape() {
        let mut rows = MessageRows::default();
        let (a, _, new_a) = rows.row("outbox", br#"{"id":"1","payload":{}}"#).unwrap();
        let (b, _, new_b) = rows
            .row("outbox", br#"{"payload":{"x":1},"id":"2"}"#)
            .unwrap();
        let (c, _, new_c) = rows
            .row("outbox", br#"{"id":"3","payload":"text"}"#)
            .unwrap();
        let (d, _, new_d) = rows.row("other", br#"{"id":"4","payload":{}}"#).unwrap();
        assert!(new_a && !new_b && new_c && new_d);
        assert_eq!(a.id, b.id, "same members and kinds, in any order");
        assert_ne!(a.id, c.id, "payload is text now");
        assert_ne!(a.id, d.id, "another prefix");
    }

    #[test]
    fn content_that_is_not_an_object_names_the_fix() {
        let mut rows = MessageRows::default();
        for content in [&b"[1,2]"[..], b"\"x\"", b"{oops", b""] {
            let err = rows.row("outbox", content).unwrap_err();
            assert!(err.to_string().contains("json_build_object"), "{err}");
        }
        let err = rows.row("outbox", &[0xff, 0xfe]).unwrap_err();
        assert!(
            matches!(err, MessageError::NotInDatabaseEncoding { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("not valid text in the database encoding UTF8"),
            "{text}"
        );
        assert!(text.contains("::text"), "{text}");
    }

    #[test]
    fn content_is_read_in_the_database_encoding() {
        let mut rows = MessageRows::new(DatabaseEncoding::from_server_encoding("LATIN1"));
        let (relation, row, _) = rows
            .row(
                "outbox",
                b"{\"id\":\"caf\xe9\",\"payload\":{\"n\":\"\xfc\x85\"}}",
            )
            .unwrap();
        let by_name: HashMap<&str, &Column> = relation
            .columns
            .iter()
            .zip(&row.columns)
            .map(|(c, v)| (c.name.as_str(), v))
            .collect();
        assert_eq!(text(by_name["id"]), Some("café"));
        assert_eq!(text(by_name["payload"]), Some("{\"n\":\"ü\u{85}\"}"));

        let mut rows = MessageRows::new(DatabaseEncoding::from_server_encoding("EUC_TW"));
        assert!(
            rows.row("outbox", b"{\"id\":\"1\"}").is_ok(),
            "ASCII converts"
        );
        let err = rows.row("outbox", b"{\"id\":\"\xc4\xa1\"}").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("EUC_TW") && text.contains("outbox table"),
            "{text}"
        );
        let (_, row) = rows.unreadable("outbox", b"{\"id\":\"\xc4\xa1\"}");
        assert_eq!(
            row.columns,
            vec![Column::Text(Bytes::from_static(
                "{\"id\":\"\u{FFFD}\u{FFFD}\"}".as_bytes()
            ))]
        );
    }
}
