//! Decoding of `TupleData` and of the old/new tuple markers of Insert, Update and Delete.
//!
//! # Invariants
//! - Column values are `Bytes::slice`s of the input, never copies.
//! - The column vector is pre-allocated for at most as many columns as the remaining bytes can
//!   hold (each column takes at least one byte), whatever the count field claims.
//! - The number of columns is not checked against the relation: this layer does not know it.
//! - Skipping a tuple ([`skip_tuple`], [`skip_old_tuple`]) accepts and refuses exactly what
//!   reading it accepts and refuses, with the same errors, and leaves the reader at the same
//!   place.

use crate::reader::Reader;
use crate::{Column, DecodeError, OldTuple, TupleData};

/// `N`: a new tuple follows.
pub(crate) const NEW: u8 = b'N';
/// `K`: the old key follows.
pub(crate) const KEY: u8 = b'K';
/// `O`: the whole old tuple follows.
pub(crate) const OLD: u8 = b'O';

/// Reads one `TupleData`: an `Int16` column count, then per column its kind byte (`n`, `u`,
/// `t` or `b`) and, for `t` and `b`, an `Int32` length and the value.
pub(crate) fn read_tuple(r: &mut Reader<'_>) -> Result<TupleData, DecodeError> {
    let count = usize::from(r.u16("tuple column count")?);
    let mut columns = Vec::with_capacity(count.min(r.remaining()));
    for _ in 0..count {
        let column = match r.u8("tuple column kind")? {
            b'n' => Column::Null,
            b'u' => Column::UnchangedToast,
            b't' => Column::Text(r.counted_bytes("column value length", "column value")?),
            b'b' => Column::Binary(r.counted_bytes("column value length", "column value")?),
            other => {
                return Err(DecodeError::InvalidValue {
                    field: "tuple column kind",
                    value: u64::from(other),
                })
            }
        };
        columns.push(column);
    }
    Ok(TupleData { columns })
}

/// Checks one `TupleData` as [`read_tuple`] does (the same reads, the same errors) without
/// building it: nothing is allocated and no value is sliced.
pub(crate) fn skip_tuple(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    let count = r.u16("tuple column count")?;
    for _ in 0..count {
        match r.u8("tuple column kind")? {
            b'n' | b'u' => {}
            b't' | b'b' => r.skip_counted("column value length", "column value")?,
            other => {
                return Err(DecodeError::InvalidValue {
                    field: "tuple column kind",
                    value: u64::from(other),
                })
            }
        }
    }
    Ok(())
}

/// Reads the marker byte that must be `N`, then the new tuple.
pub(crate) fn read_new_tuple(r: &mut Reader<'_>) -> Result<TupleData, DecodeError> {
    match r.u8("tuple marker")? {
        NEW => read_tuple(r),
        other => Err(invalid_marker(other)),
    }
}

/// Reads an old tuple whose marker (`K` or `O`) has already been read.
pub(crate) fn read_old_tuple(r: &mut Reader<'_>, marker: u8) -> Result<OldTuple, DecodeError> {
    match marker {
        KEY => Ok(OldTuple::Key(read_tuple(r)?)),
        OLD => Ok(OldTuple::Full(read_tuple(r)?)),
        other => Err(invalid_marker(other)),
    }
}

/// Checks an old tuple whose marker has already been read as [`read_old_tuple`] does, without
/// building it (see [`skip_tuple`]).
pub(crate) fn skip_old_tuple(r: &mut Reader<'_>, marker: u8) -> Result<(), DecodeError> {
    match marker {
        KEY | OLD => skip_tuple(r),
        other => Err(invalid_marker(other)),
    }
}

/// The error for a tuple marker byte that is not allowed where it was found.
pub(crate) fn invalid_marker(marker: u8) -> DecodeError {
    DecodeError::InvalidValue {
        field: "tuple marker",
        value: u64::from(marker),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn reads_every_column_kind() {
        let buf = Bytes::from_static(b"\x00\x04nut\x00\x00\x00\x02hib\x00\x00\x00\x01\xff");
        let mut r = Reader::new(&buf);
        let tuple = read_tuple(&mut r).unwrap();
        assert_eq!(
            tuple.columns,
            vec![
                Column::Null,
                Column::UnchangedToast,
                Column::Text(Bytes::from_static(b"hi")),
                Column::Binary(Bytes::from_static(b"\xff")),
            ]
        );
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn rejects_unknown_column_kind() {
        let buf = Bytes::from_static(b"\x00\x01x");
        assert_eq!(
            read_tuple(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue {
                field: "tuple column kind",
                value: u64::from(b'x')
            })
        );
    }

    #[test]
    fn huge_column_count_does_not_preallocate() {
        let buf = Bytes::from_static(b"\xff\xffn");
        assert_eq!(
            read_tuple(&mut Reader::new(&buf)),
            Err(DecodeError::Truncated {
                field: "tuple column kind",
                offset: 3,
                needed: 1
            })
        );
    }

    /// Skipping and reading agree on every input: the same error, or success at the same
    /// position.
    #[test]
    fn skipping_a_tuple_agrees_with_reading_it() {
        let inputs: [&'static [u8]; 9] = [
            b"\x00\x04nut\x00\x00\x00\x02hib\x00\x00\x00\x01\xff",
            b"\x00\x04nut\x00\x00\x00\x02hib\x00\x00\x00\x01\xffrest",
            b"\x00\x01x",
            b"\xff\xffn",
            b"\x00\x01t\xff\xff\xff\xff",
            b"\x00\x01t\x00\x00\x00\x05ab",
            b"\x00\x00",
            b"\x00",
            b"",
        ];
        for input in inputs {
            let buf = Bytes::from_static(input);
            for cut in 0..=buf.len() {
                let buf = buf.slice(..cut);
                let mut read = Reader::new(&buf);
                let mut skipped = Reader::new(&buf);
                assert_eq!(
                    read_tuple(&mut read).map(|_| ()),
                    skip_tuple(&mut skipped),
                    "{buf:?}"
                );
                assert_eq!(read.remaining(), skipped.remaining(), "{buf:?}");
                for marker in [KEY, OLD, NEW] {
                    let mut read = Reader::new(&buf);
                    let mut skipped = Reader::new(&buf);
                    assert_eq!(
                        read_old_tuple(&mut read, marker).map(|_| ()),
                        skip_old_tuple(&mut skipped, marker),
                        "{buf:?}"
                    );
                    assert_eq!(read.remaining(), skipped.remaining(), "{buf:?}");
                }
            }
        }
    }

    #[test]
    fn markers() {
        let buf = Bytes::from_static(b"O\x00\x00");
        assert_eq!(
            read_new_tuple(&mut Reader::new(&buf)),
            Err(invalid_marker(b'O'))
        );
        let buf = Bytes::from_static(b"\x00\x00");
        assert_eq!(
            read_old_tuple(&mut Reader::new(&buf), b'N'),
            Err(invalid_marker(b'N'))
        );
        assert_eq!(
            read_old_tuple(&mut Reader::new(&buf), KEY),
            Ok(OldTuple::Key(TupleData::default()))
        );
    }
}
