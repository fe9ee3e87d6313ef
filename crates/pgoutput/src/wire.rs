//! The streaming replication protocol that carries pgoutput, as bytes: cutting backend messages
//! out of a receive buffer, the CopyData payloads of a logical stream (`XLogData`, keepalives),
//! standby status updates, and the fields of error, notice and data-row messages. Sans-IO like
//! the rest of the crate: the caller reads and writes the socket.
//!
//! # Invariants
//! - [`split`] takes a message off the buffer only when all of it is there; what remains is
//!   the start of the next one. No function here panics, whatever the input.
//! - A message's body shares the receive buffer's memory (no copy).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::fmt;

/// The largest message accepted: PostgreSQL's own limit for one field is 1 GiB.
pub const MAX_MESSAGE: usize = (1 << 30) + 4096;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// One backend message: its type byte and its body (without the length field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendMessage {
    /// The type byte.
    pub tag: u8,
    /// The body, sharing the receive buffer's memory.
    pub body: Bytes,
}

/// Cuts the next whole message off the front of `buf`; `Ok(None)` while it is incomplete.
pub fn split(buf: &mut BytesMut) -> Result<Option<BackendMessage>, ProtocolViolation> {
    let Some(total) = whole_length(buf)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let tag = buf[0];
    let mut whole = buf.split_to(total);
    whole.advance(5);
    Ok(Some(BackendMessage {
        tag,
        body: whole.freeze(),
    }))
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
        wal_start: u64,
        /// The server's WAL end when it sent the message.
        wal_end: u64,
        /// The pgoutput message.
        data: Bytes,
    },
    /// `Primary keepalive message`.
    KeepAlive {
        /// The server's WAL end.
        wal_end: u64,
        /// Whether the server asks for a status update at once.
        reply_requested: bool,
    },
}

/// Reads the payload of a CopyData message from the server.
pub fn copy_data(mut body: Bytes) -> Result<CopyData, ProtocolViolation> {
    match body.first() {
        Some(b'w') if body.len() >= 25 => {
            let wal_start = u64::from_be_bytes(array(&body[1..9]));
            let wal_end = u64::from_be_bytes(array(&body[9..17]));
            body.advance(25);
            Ok(CopyData::XLogData {
                wal_start,
                wal_end,
                data: body,
            })
        }
        Some(b'k') if body.len() >= 18 => Ok(CopyData::KeepAlive {
            wal_end: u64::from_be_bytes(array(&body[1..9])),
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

fn array(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(bytes);
    out
}

/// Appends a standby status update (as a CopyData message) reporting `lsn` as written,
/// flushed and applied, at `unix_micros`.
pub fn status_update(out: &mut BytesMut, lsn: u64, unix_micros: i64, reply_requested: bool) {
    out.reserve(39);
    out.put_u8(b'd');
    out.put_u32(38);
    out.put_u8(b'r');
    out.put_u64(lsn);
    out.put_u64(lsn);
    out.put_u64(lsn);
    out.put_i64(unix_micros - PG_EPOCH_OFFSET_MICROS);
    out.put_u8(u8::from(reply_requested));
}

/// One field of an `ErrorResponse` or `NoticeResponse` body, by its type byte (e.g. `b'F'`, the
/// server source file that raised it, which is never translated).
pub fn server_error_field(body: &[u8], field: u8) -> Option<String> {
    let mut rest = body;
    while let Some((&kind, after)) = rest.split_first() {
        if kind == 0 {
            return None;
        }
        let end = after.iter().position(|&b| b == 0).unwrap_or(after.len());
        if kind == field {
            return Some(String::from_utf8_lossy(&after[..end]).into_owned());
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    None
}

/// Reads the fields of an `ErrorResponse` or `NoticeResponse` body.
pub fn server_error(body: &[u8]) -> ServerError {
    let mut error = ServerError::default();
    let mut localized_severity = None;
    let mut rest = body;
    while let Some((&kind, after)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = after.iter().position(|&b| b == 0).unwrap_or(after.len());
        let value = String::from_utf8_lossy(&after[..end]).into_owned();
        rest = after.get(end + 1..).unwrap_or_default();
        match kind {
            b'V' => error.severity = value,
            b'S' => localized_severity = Some(value),
            b'C' => error.code = value,
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            b'H' => error.hint = Some(value),
            _ => {}
        }
    }
    if error.severity.is_empty() {
        error.severity = localized_severity.unwrap_or_else(|| "ERROR".into());
    }
    error
}

/// Reads a `DataRow` body: each column as text, `None` for NULL.
pub fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, ProtocolViolation> {
    let truncated = ProtocolViolation::Truncated { what: "DataRow" };
    let mut rest = body;
    let count = take(&mut rest, 2).ok_or(truncated.clone())?;
    let count = u16::from_be_bytes([count[0], count[1]]);
    let mut row = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let length = take(&mut rest, 4).ok_or(truncated.clone())?;
        let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
        if length < 0 {
            row.push(None);
            continue;
        }
        let value = take(&mut rest, length as usize).ok_or(truncated.clone())?;
        row.push(Some(String::from_utf8_lossy(value).into_owned()));
    }
    Ok(row)
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if rest.len() < n {
        return None;
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Some(head)
}

/// A message that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL`, `PANIC` (not localized), or for a notice `WARNING`, `NOTICE`, ...
    pub severity: String,
    /// The SQLSTATE.
    pub code: String,
    /// The primary message.
    pub message: String,
    /// The detail, if any.
    pub detail: Option<String>,
    /// The hint, if any.
    pub hint: Option<String>,
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
        if !self.code.is_empty() {
            write!(f, " (SQLSTATE {})", self.code)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn one_field_of_a_notice_is_read_by_its_type() {
        let body = b"SWARNUNG\0VWARNING\0C55000\0Mskipped\0Fpgoutput.c\0L1\0\0";
        assert_eq!(
            server_error_field(body, b'F').as_deref(),
            Some("pgoutput.c")
        );
        assert_eq!(server_error_field(body, b'C').as_deref(), Some("55000"));
        assert_eq!(server_error_field(body, b'R'), None);
        assert_eq!(server_error_field(b"Fx", b'F').as_deref(), Some("x"));
        assert_eq!(server_error_field(b"", b'F'), None);
    }
    use super::*;

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn messages_are_cut_only_when_whole() {
        let mut wire = message(b'd', b"wxyz");
        wire.extend(message(b'k', b"12"));
        for cut in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..cut]);
            let first = split(&mut buf).unwrap();
            if cut < 9 {
                assert_eq!(first, None, "cut at {cut}");
                assert_eq!(
                    missing(&buf).unwrap(),
                    if cut < 5 { 5 - cut } else { 9 - cut }
                );
            } else {
                let first = first.unwrap();
                assert_eq!((first.tag, &first.body[..]), (b'd', &b"wxyz"[..]));
                assert_eq!(split(&mut buf).unwrap(), None);
            }
        }
        let mut buf = BytesMut::from(&wire[..]);
        split(&mut buf).unwrap().unwrap();
        let second = split(&mut buf).unwrap().unwrap();
        assert_eq!((second.tag, &second.body[..]), (b'k', &b"12"[..]));
        assert!(buf.is_empty());
    }

    #[test]
    fn impossible_lengths_are_errors() {
        let mut buf = BytesMut::from(&[b'd', 0, 0, 0, 3][..]);
        assert!(matches!(
            split(&mut buf),
            Err(ProtocolViolation::BadLength { length: 3, .. })
        ));
        let mut buf = BytesMut::from(&[b'd', 0x7f, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            split(&mut buf),
            Err(ProtocolViolation::TooLarge { .. })
        ));
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
                wal_start: 0x0102,
                wal_end: 0x0304,
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
                wal_end: 0x0506,
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
        status_update(&mut out, 0xAB, PG_EPOCH_OFFSET_MICROS + 5, true);
        assert_eq!(out.len(), 39);
        assert_eq!(&out[..6], &[b'd', 0, 0, 0, 38, b'r']);
        for field in 0..3 {
            let at = 6 + field * 8;
            assert_eq!(u64::from_be_bytes(array(&out[at..at + 8])), 0xAB);
        }
        assert_eq!(i64::from_be_bytes(array(&out[30..38])), 5);
        assert_eq!(out[38], 1);
    }

    #[test]
    fn error_fields_are_read() {
        let body = b"SERROR\0VFATAL\0C42501\0Mmust be superuser\0Dmore\0Hdo this\0\0";
        let error = server_error(body);
        assert_eq!(error.severity, "FATAL");
        assert_eq!(error.code, "42501");
        assert_eq!(error.message, "must be superuser");
        assert_eq!(error.detail.as_deref(), Some("more"));
        assert_eq!(error.hint.as_deref(), Some("do this"));
        assert_eq!(
            error.to_string(),
            "FATAL: must be superuser (more) hint: do this (SQLSTATE 42501)"
        );
        let truncated = server_error(b"SERROR\0Mhalf");
        assert_eq!(
            (truncated.severity.as_str(), truncated.message.as_str()),
            ("ERROR", "half")
        );
    }

    #[test]
    fn data_rows_are_read_with_nulls() {
        let mut body = 3u16.to_be_bytes().to_vec();
        body.extend(2i32.to_be_bytes());
        body.extend(b"ab");
        body.extend((-1i32).to_be_bytes());
        body.extend(0i32.to_be_bytes());
        assert_eq!(
            data_row(&body).unwrap(),
            vec![Some("ab".to_owned()), None, Some(String::new())]
        );
        assert!(data_row(&body[..7]).is_err());
    }
}
