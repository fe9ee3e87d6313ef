//! The bytes of the streaming replication protocol, sans-IO: cutting backend messages out of a
//! receive buffer (parsed by postgres-protocol's backend parser), the CopyData payloads of a
//! logical stream (`XLogData`, keepalives), standby status updates, and the fields of error,
//! notice and data-row messages. Tested without a server and fuzzed
//! (`fuzz/fuzz_targets/replication_wire.rs`); the IO is [`super::session`] and
//! [`super::stream`].
//!
//! # Invariants
//! - [`split`] takes a message off the buffer only when all of it is there, and exactly its
//!   bytes; what remains is the start of the next one. A message longer than [`MAX_MESSAGE`] is
//!   an error as soon as its header is in, so nothing reserves room for it.
//! - No function here panics, whatever the input.
//! - A CopyData payload shares the receive buffer's memory (no copy).

use crate::sqlstate::SqlState;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use pgoutput::Lsn;
use postgres_protocol::message::backend::{self, DataRowBody, ErrorFields, Message};
use std::fmt;

/// The largest message accepted: PostgreSQL's own limit for one field is 1 GiB.
pub const MAX_MESSAGE: usize = (1 << 30) + 4096;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// The message types postgres-protocol's [`Message::parse`] knows.
const PARSED_TAGS: &[u8] = &[
    backend::PARSE_COMPLETE_TAG,
    backend::BIND_COMPLETE_TAG,
    backend::CLOSE_COMPLETE_TAG,
    backend::NOTIFICATION_RESPONSE_TAG,
    backend::COPY_DONE_TAG,
    backend::COMMAND_COMPLETE_TAG,
    backend::COPY_DATA_TAG,
    backend::DATA_ROW_TAG,
    backend::ERROR_RESPONSE_TAG,
    backend::COPY_IN_RESPONSE_TAG,
    backend::COPY_OUT_RESPONSE_TAG,
    backend::EMPTY_QUERY_RESPONSE_TAG,
    backend::BACKEND_KEY_DATA_TAG,
    backend::NO_DATA_TAG,
    backend::NOTICE_RESPONSE_TAG,
    backend::AUTHENTICATION_TAG,
    backend::PORTAL_SUSPENDED_TAG,
    backend::PARAMETER_STATUS_TAG,
    backend::PARAMETER_DESCRIPTION_TAG,
    backend::ROW_DESCRIPTION_TAG,
    backend::READY_FOR_QUERY_TAG,
];

/// One backend message, cut off the receive buffer.
pub enum Frame {
    /// A CopyData message's payload, sharing the receive buffer's memory.
    CopyData(Bytes),
    /// Any other message postgres-protocol knows, parsed by it (boxed: these are rare, and a
    /// frame read ahead stays the size of a CopyData one).
    Message {
        /// The type byte.
        tag: u8,
        /// The message.
        message: Box<Message>,
    },
    /// A message of a type postgres-protocol does not know (NegotiateProtocolVersion, `v`, or
    /// none at all), skipped whole: the caller says whether it belongs.
    Unknown {
        /// The type byte.
        tag: u8,
    },
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frame::CopyData(data) => write!(f, "CopyData({} bytes)", data.len()),
            Frame::Message { tag, .. } => write!(f, "Message({:?})", char::from(*tag)),
            Frame::Unknown { tag } => write!(f, "Unknown({:?})", char::from(*tag)),
        }
    }
}

/// Cuts the next whole message off the front of `buf`; `Ok(None)` while it is incomplete.
pub fn split(buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolViolation> {
    let Some(total) = whole_length(buf)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let tag = buf[0];
    if tag == backend::COPY_DATA_TAG {
        // Cut by hand, the hot path: Message::parse took 29 ns per 60-byte XLogData frame, this 16 ns.
        let mut whole = buf.split_to(total);
        whole.advance(5);
        return Ok(Some(Frame::CopyData(whole.freeze())));
    }
    if !PARSED_TAGS.contains(&tag) {
        buf.advance(total);
        return Ok(Some(Frame::Unknown { tag }));
    }
    // The message is whole, so the parser takes exactly its bytes and reserves nothing.
    match Message::parse(buf) {
        Ok(Some(message)) => Ok(Some(Frame::Message {
            tag,
            message: Box::new(message),
        })),
        Ok(None) => Err(ProtocolViolation::Truncated { what: "message" }),
        Err(source) => Err(ProtocolViolation::Malformed {
            tag: char::from(tag),
            source,
        }),
    }
}

/// How many more bytes the message at the front of `buf` needs (0 when it is whole; at least
/// the five bytes of a header when not even that is there).
pub fn missing(buf: &BytesMut) -> Result<usize, ProtocolViolation> {
    Ok(match whole_length(buf)? {
        Some(total) => total.saturating_sub(buf.len()),
        None => 5 - buf.len(),
    })
}

/// The length of the message at the front of `buf`, type byte included, once its header is in.
fn whole_length(buf: &BytesMut) -> Result<Option<usize>, ProtocolViolation> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = char::from(buf[0]);
    let length = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if length < 4 {
        return Err(ProtocolViolation::BadLength { tag, length });
    }
    let total = 1 + length as usize;
    if total > MAX_MESSAGE {
        return Err(ProtocolViolation::TooLarge {
            tag,
            length: total,
            limit: MAX_MESSAGE,
        });
    }
    Ok(Some(total))
}

/// What a CopyData message of a logical replication stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyData {
    /// `XLogData`: one pgoutput message sent from WAL position `wal_start`.
    XLogData {
        /// Where the message starts in the WAL.
        wal_start: Lsn,
        /// The server's WAL end when it sent the message.
        wal_end: Lsn,
        /// The pgoutput message.
        data: Bytes,
    },
    /// `Primary keepalive message`.
    KeepAlive {
        /// The server's WAL end.
        wal_end: Lsn,
        /// Whether the server asks for a status update at once.
        reply_requested: bool,
    },
}

/// Reads the payload of a CopyData message from the server.
pub fn copy_data(mut body: Bytes) -> Result<CopyData, ProtocolViolation> {
    match body.first() {
        Some(b'w') if body.len() >= 25 => {
            let wal_start = lsn_at(&body, 1);
            let wal_end = lsn_at(&body, 9);
            body.advance(25);
            Ok(CopyData::XLogData {
                wal_start,
                wal_end,
                data: body,
            })
        }
        Some(b'k') if body.len() >= 18 => Ok(CopyData::KeepAlive {
            wal_end: lsn_at(&body, 1),
            reply_requested: body[17] != 0,
        }),
        Some(b'w') => Err(ProtocolViolation::Truncated { what: "XLogData" }),
        Some(b'k') => Err(ProtocolViolation::Truncated {
            what: "keepalive message",
        }),
        Some(&other) => Err(ProtocolViolation::Unexpected {
            tag: char::from(other),
            during: "inside CopyData of a logical replication stream",
        }),
        None => Err(ProtocolViolation::Truncated { what: "CopyData" }),
    }
}

/// The big-endian position at `at` (the caller checked the eight bytes are there).
fn lsn_at(body: &[u8], at: usize) -> Lsn {
    let mut out = [0; 8];
    out.copy_from_slice(&body[at..at + 8]);
    Lsn(u64::from_be_bytes(out))
}

/// Appends a standby status update (as a CopyData message) reporting `lsn` as written,
/// flushed and applied, at `unix_micros`.
pub fn status_update(out: &mut BytesMut, lsn: Lsn, unix_micros: i64, reply_requested: bool) {
    out.reserve(39);
    out.put_u8(b'd');
    out.put_u32(38);
    out.put_u8(b'r');
    out.put_u64(lsn.0);
    out.put_u64(lsn.0);
    out.put_u64(lsn.0);
    out.put_i64(unix_micros - PG_EPOCH_OFFSET_MICROS);
    out.put_u8(u8::from(reply_requested));
}

/// Reads the fields of an `ErrorResponse` or `NoticeResponse` (their `fields()`). A malformed
/// field ends the reading: what came before it is kept.
pub fn server_error(mut fields: ErrorFields<'_>) -> ServerError {
    let mut error = ServerError::default();
    let mut localized_severity = None;
    while let Ok(Some(field)) = fields.next() {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'V' => error.severity = value,
            b'S' => localized_severity = Some(value),
            b'C' => error.code = SqlState::parse(&value),
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            b'H' => error.hint = Some(value),
            b'F' => error.source_file = Some(value),
            _ => {}
        }
    }
    if error.severity.is_empty() {
        error.severity = localized_severity.unwrap_or_else(|| "ERROR".into());
    }
    error
}

/// One row of a simple query's answer: each column as text, `None` for NULL.
pub type QueryRow = Vec<Option<String>>;

/// Reads a `DataRow`: each column as text, `None` for NULL.
pub fn data_row(body: &DataRowBody) -> Result<QueryRow, ProtocolViolation> {
    let malformed = |source| ProtocolViolation::Malformed {
        tag: char::from(backend::DATA_ROW_TAG),
        source,
    };
    let buffer = body.buffer();
    body.ranges()
        .map(|range| {
            Ok(range.map(|range| {
                String::from_utf8_lossy(buffer.get(range).unwrap_or_default()).into_owned()
            }))
        })
        .collect()
        .map_err(malformed)
}

/// A message that breaks the protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolViolation {
    /// A message length below the length field's own four bytes.
    #[error("message of type {tag:?} with length {length}")]
    BadLength {
        /// The message's type byte.
        tag: char,
        /// Its length field.
        length: u32,
    },
    /// A message longer than accepted.
    #[error("message of type {tag:?} is {length} bytes, more than the {limit} accepted")]
    TooLarge {
        /// The message's type byte.
        tag: char,
        /// Its whole length.
        length: usize,
        /// The most accepted ([`MAX_MESSAGE`]).
        limit: usize,
    },
    /// A message too short for its fields.
    #[error("truncated {what}")]
    Truncated {
        /// Which message.
        what: &'static str,
    },
    /// A message whose fields postgres-protocol could not read.
    #[error("malformed message of type {tag:?}: {source}")]
    Malformed {
        /// The message's type byte.
        tag: char,
        /// What the parser reported.
        #[source]
        source: std::io::Error,
    },
    /// A message type that does not belong at this point.
    #[error("unexpected message of type {tag:?} {during}")]
    Unexpected {
        /// The message's type byte.
        tag: char,
        /// Where it came.
        during: &'static str,
    },
}

/// An `ErrorResponse` (or `NoticeResponse`): the fields Siphon reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL`, `PANIC` (not localized), or for a notice `WARNING`, `NOTICE`, ...
    pub severity: String,
    /// The SQLSTATE ([`SqlState::MALFORMED`] when the server sent none).
    pub code: SqlState,
    /// The primary message.
    pub message: String,
    /// The detail, if any.
    pub detail: Option<String>,
    /// The hint, if any.
    pub hint: Option<String>,
    /// The server's source file that raised it (`F`, e.g. `pgoutput.c`; never translated).
    pub source_file: Option<String>,
}

impl Default for ServerError {
    fn default() -> Self {
        ServerError {
            severity: String::new(),
            code: SqlState::MALFORMED,
            message: String::new(),
            detail: None,
            hint: None,
            source_file: None,
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.severity, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " hint: {hint}")?;
        }
        if self.code != SqlState::MALFORMED {
            write!(f, " (SQLSTATE {})", self.code)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// The one message of `wire`, parsed.
    fn parsed(wire: &[u8]) -> Message {
        match split(&mut BytesMut::from(wire)).unwrap().unwrap() {
            Frame::Message { message, .. } => *message,
            other => panic!("{other:?}"),
        }
    }

    fn error_fields(body: &[u8]) -> ServerError {
        match parsed(&message(b'E', body)) {
            Message::ErrorResponse(body) => server_error(body.fields()),
            _ => panic!("not an ErrorResponse"),
        }
    }

    #[test]
    fn messages_are_cut_only_when_whole() {
        let mut wire = message(b'd', b"wxyz");
        wire.extend(message(b'Z', b"I"));
        for cut in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..cut]);
            let first = split(&mut buf).unwrap();
            if cut < 9 {
                assert!(first.is_none(), "cut at {cut}");
                assert_eq!(
                    missing(&buf).unwrap(),
                    if cut < 5 { 5 - cut } else { 9 - cut }
                );
            } else {
                match first.unwrap() {
                    Frame::CopyData(body) => assert_eq!(&body[..], b"wxyz"),
                    other => panic!("{other:?}"),
                }
                assert!(split(&mut buf).unwrap().is_none());
            }
        }
        let mut buf = BytesMut::from(&wire[..]);
        split(&mut buf).unwrap().unwrap();
        let second = split(&mut buf).unwrap().unwrap();
        assert!(matches!(
            second,
            Frame::Message { tag: b'Z', ref message } if matches!(**message, Message::ReadyForQuery(_))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_frame_read_ahead_is_hardly_larger_than_its_payload_handle() {
        assert!(std::mem::size_of::<Frame>() <= std::mem::size_of::<Bytes>() + 8);
    }

    #[test]
    fn unknown_types_are_skipped_whole_and_malformed_ones_are_errors() {
        let mut wire = message(b'v', b"\0\0\0\x02\0\0\0\0");
        wire.extend(message(b'Z', b"I"));
        let mut buf = BytesMut::from(&wire[..]);
        assert!(matches!(
            split(&mut buf).unwrap(),
            Some(Frame::Unknown { tag: b'v' })
        ));
        assert!(matches!(
            split(&mut buf).unwrap(),
            Some(Frame::Message { tag: b'Z', .. })
        ));
        // ReadyForQuery with two status bytes instead of one.
        let mut buf = BytesMut::from(&message(b'Z', b"II")[..]);
        assert!(matches!(
            split(&mut buf),
            Err(ProtocolViolation::Malformed { tag: 'Z', .. })
        ));
        assert!(buf.is_empty(), "the malformed message is taken off whole");
    }

    #[test]
    fn impossible_lengths_are_errors() {
        let mut buf = BytesMut::from(&[b'd', 0, 0, 0, 3][..]);
        assert!(matches!(
            split(&mut buf),
            Err(ProtocolViolation::BadLength { length: 3, .. })
        ));
        let mut buf = BytesMut::from(&[b'E', 0x7f, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            split(&mut buf),
            Err(ProtocolViolation::TooLarge { .. })
        ));
        assert!(buf.capacity() < 1 << 20, "no room reserved for it");
    }

    #[test]
    fn xlogdata_and_keepalives_are_read() {
        let mut body = vec![b'w'];
        body.extend(0x0102u64.to_be_bytes());
        body.extend(0x0304u64.to_be_bytes());
        body.extend(7i64.to_be_bytes());
        body.extend(b"Ipayload");
        assert_eq!(
            copy_data(Bytes::from(body)).unwrap(),
            CopyData::XLogData {
                wal_start: Lsn(0x0102),
                wal_end: Lsn(0x0304),
                data: Bytes::from_static(b"Ipayload")
            }
        );
        let mut body = vec![b'k'];
        body.extend(0x0506u64.to_be_bytes());
        body.extend(9i64.to_be_bytes());
        body.push(1);
        assert_eq!(
            copy_data(Bytes::from(body)).unwrap(),
            CopyData::KeepAlive {
                wal_end: Lsn(0x0506),
                reply_requested: true
            }
        );
        assert!(copy_data(Bytes::from_static(b"w123")).is_err());
        assert!(copy_data(Bytes::from_static(b"k1")).is_err());
        assert!(copy_data(Bytes::from_static(b"x")).is_err());
        assert!(copy_data(Bytes::new()).is_err());
    }

    #[test]
    fn status_updates_report_one_position_in_postgres_time() {
        let mut out = BytesMut::new();
        status_update(&mut out, Lsn(0xAB), PG_EPOCH_OFFSET_MICROS + 5, true);
        assert_eq!(out.len(), 39);
        assert_eq!(&out[..6], &[b'd', 0, 0, 0, 38, b'r']);
        for field in 0..3 {
            let at = 6 + field * 8;
            assert_eq!(lsn_at(&out, at), Lsn(0xAB));
        }
        assert_eq!(i64::from_be_bytes(out[30..38].try_into().unwrap()), 5);
        assert_eq!(out[38], 1);
    }

    #[test]
    fn error_fields_are_read() {
        let error = error_fields(
            b"SERROR\0VFATAL\0C42501\0Mmust be superuser\0Dmore\0Hdo this\0Fpgoutput.c\0L1\0\0",
        );
        assert_eq!(error.severity, "FATAL");
        assert_eq!(error.code, SqlState::INSUFFICIENT_PRIVILEGE);
        assert_eq!(error.message, "must be superuser");
        assert_eq!(error.detail.as_deref(), Some("more"));
        assert_eq!(error.hint.as_deref(), Some("do this"));
        assert_eq!(error.source_file.as_deref(), Some("pgoutput.c"));
        assert_eq!(
            error.to_string(),
            "FATAL: must be superuser (more) hint: do this (SQLSTATE 42501)"
        );
        // A field without its terminator: the fields before it are kept.
        let truncated = error_fields(b"SERROR\0C08P01\0Mhalf");
        assert_eq!(
            (truncated.severity.as_str(), truncated.code.as_str()),
            ("ERROR", "08P01")
        );
        assert_eq!(truncated.message, "");
    }

    #[test]
    fn data_rows_are_read_with_nulls() {
        let mut body = 3u16.to_be_bytes().to_vec();
        body.extend(2i32.to_be_bytes());
        body.extend(b"ab");
        body.extend((-1i32).to_be_bytes());
        body.extend(0i32.to_be_bytes());
        let row = |body: &[u8]| match parsed(&message(b'D', body)) {
            Message::DataRow(row) => data_row(&row),
            _ => panic!("not a DataRow"),
        };
        assert_eq!(
            row(&body).unwrap(),
            vec![Some("ab".to_owned()), None, Some(String::new())]
        );
        assert!(row(&body[..7]).is_err());
    }
}
