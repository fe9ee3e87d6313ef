//! A bounds-checked, big-endian cursor over one message buffer.
//!
//! Every read names the protocol field it is reading so that errors say what was being
//! decoded and where.
//!
//! # Invariants
//! - The position never exceeds the buffer length; every read checks the remaining length
//!   before consuming anything, and a failed read consumes nothing.
//! - Byte strings and [`Text`] values handed out are `Bytes::slice`s of the input buffer: the
//!   data is never copied.
//! - No read allocates: lengths taken from the input are only used to slice.
//! - A skip checks exactly what the matching read checks, with the same errors.

use crate::{DecodeError, Lsn, Text};
use bytes::Bytes;

/// Cursor over the bytes of one pgoutput message.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Number of bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Consumes exactly `n` bytes and returns them as a borrowed slice.
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let start = self.pos;
        let available = self.remaining();
        let slice = start
            .checked_add(n)
            .and_then(|end| self.buf.get(start..end))
            .ok_or(DecodeError::Truncated {
                field,
                offset: start,
                needed: n.saturating_sub(available),
            })?;
        self.pos += n;
        Ok(slice)
    }

    /// Consumes `N` bytes as a fixed-size array.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let offset = self.pos;
        let slice = self.take(N, field)?;
        <[u8; N]>::try_from(slice).map_err(|_| DecodeError::Truncated {
            field,
            offset,
            needed: N,
        })
    }

    /// Reads a `Byte1` / `Int8`.
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    /// Reads an `Int16` as unsigned (PostgreSQL sends column counts as `uint16`).
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    /// Reads an `Int32` holding an unsigned value (an xid or an oid).
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    /// Reads a signed `Int32`.
    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    /// Reads a signed `Int64` (a timestamp).
    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// Reads an `Int64 (XLogRecPtr)`.
    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array(field)?)))
    }

    /// Reads `n` raw bytes as a slice of the input.
    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n, field)?;
        Ok(self.buf.slice(start..self.pos))
    }

    /// Reads an `Int32` length that must not be negative.
    pub(crate) fn length(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let length = self.i32(field)?;
        usize::try_from(length).map_err(|_| DecodeError::InvalidLength {
            field,
            length: i64::from(length),
        })
    }

    /// Reads an `Int32` length followed by that many bytes.
    pub(crate) fn counted_bytes(
        &mut self,
        length_field: &'static str,
        data_field: &'static str,
    ) -> Result<Bytes, DecodeError> {
        let n = self.length(length_field)?;
        self.bytes(n, data_field)
    }

    /// Skips an `Int32` length followed by that many bytes: [`Reader::counted_bytes`] (the same
    /// checks, the same errors) without taking a slice of the input.
    pub(crate) fn skip_counted(
        &mut self,
        length_field: &'static str,
        data_field: &'static str,
    ) -> Result<(), DecodeError> {
        let n = self.length(length_field)?;
        self.take(n, data_field).map(|_| ())
    }

    /// Reads a NUL-terminated UTF-8 `String`; the NUL is consumed but not part of the text.
    pub(crate) fn cstring(&mut self, field: &'static str) -> Result<Text, DecodeError> {
        let start = self.pos;
        let rest = self.buf.get(start..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::UnterminatedString {
                field,
                offset: start,
            })?;
        let text = Text::new(self.buf.slice(start..start + len)).map_err(|_| {
            DecodeError::InvalidUtf8 {
                field,
                offset: start,
            }
        })?;
        self.pos = start + len + 1;
        Ok(text)
    }

    /// Checks that the whole buffer was consumed.
    pub(crate) fn finish(self, message: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { message, count }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_integers_and_tracks_offsets() {
        let buf = Bytes::from_static(&[0, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xfe]);
        let mut r = Reader::new(&buf);
        assert_eq!(r.u16("a"), Ok(1));
        assert_eq!(r.u32("b"), Ok(2));
        assert_eq!(r.i32("c"), Ok(-2));
        assert_eq!(r.remaining(), 0);
        assert_eq!(
            r.u8("d"),
            Err(DecodeError::Truncated {
                field: "d",
                offset: 10,
                needed: 1
            })
        );
        assert_eq!(r.finish("M"), Ok(()));
    }

    #[test]
    fn failed_read_consumes_nothing() {
        let buf = Bytes::from_static(&[1, 2, 3]);
        let mut r = Reader::new(&buf);
        assert_eq!(
            r.u32("x"),
            Err(DecodeError::Truncated {
                field: "x",
                offset: 0,
                needed: 1
            })
        );
        assert_eq!(r.remaining(), 3);
        assert_eq!(
            r.finish("M"),
            Err(DecodeError::TrailingBytes {
                message: "M",
                count: 3
            })
        );
    }

    #[test]
    fn cstring_is_a_slice_of_the_input() {
        let buf = Bytes::from_static(b"abc\0def\0");
        let mut r = Reader::new(&buf);
        let a = r.cstring("a").unwrap();
        assert_eq!(a, "abc");
        assert_eq!(a.as_bytes().as_ptr(), buf.as_ptr());
        assert_eq!(r.cstring("b").unwrap(), "def");
        assert_eq!(
            r.cstring("c"),
            Err(DecodeError::UnterminatedString {
                field: "c",
                offset: 8
            })
        );
    }

    #[test]
    fn cstring_errors() {
        let buf = Bytes::from_static(b"ab");
        assert_eq!(
            Reader::new(&buf).cstring("s"),
            Err(DecodeError::UnterminatedString {
                field: "s",
                offset: 0
            })
        );
        let buf = Bytes::from_static(b"a\xff\0");
        assert_eq!(
            Reader::new(&buf).cstring("s"),
            Err(DecodeError::InvalidUtf8 {
                field: "s",
                offset: 0
            })
        );
    }

    #[test]
    fn counted_bytes_rejects_negative_and_cut_lengths() {
        let buf = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            Reader::new(&buf).counted_bytes("len", "data"),
            Err(DecodeError::InvalidLength {
                field: "len",
                length: -1
            })
        );
        let buf = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 1]);
        assert_eq!(
            Reader::new(&buf).counted_bytes("len", "data"),
            Err(DecodeError::Truncated {
                field: "data",
                offset: 4,
                needed: 0x7fff_ffff - 1
            })
        );
        let buf = Bytes::from_static(&[0, 0, 0, 2, 7, 8]);
        let mut r = Reader::new(&buf);
        let data = r.counted_bytes("len", "data").unwrap();
        assert_eq!(&data[..], &[7, 8]);
        assert_eq!(data.as_ptr(), buf[4..].as_ptr());
    }

    /// Skipping checks what reading checks, with the same errors and the same position after.
    #[test]
    fn skip_counted_agrees_with_counted_bytes() {
        let inputs: [&'static [u8]; 6] = [
            &[0xff, 0xff, 0xff, 0xff],
            &[0x7f, 0xff, 0xff, 0xff, 1],
            &[0, 0, 0, 2, 7, 8],
            &[0, 0, 0, 2, 7, 8, 9],
            &[0, 0, 0],
            &[0, 0, 0, 0],
        ];
        for input in inputs {
            let buf = Bytes::from_static(input);
            let mut read = Reader::new(&buf);
            let mut skipped = Reader::new(&buf);
            assert_eq!(
                read.counted_bytes("len", "data").map(|_| ()),
                skipped.skip_counted("len", "data"),
                "{input:?}"
            );
            assert_eq!(read.remaining(), skipped.remaining(), "{input:?}");
        }
    }
}
