//! Hand-built messages: protocol version and stream-state rules, the protocol 4 Stream Abort,
//! and invalid field values.

mod common;

use bytes::Bytes;
use common::encode::encode;
use pgoutput::{
    parse, DecodeError, Decoder, DecoderOptions, Insert, Lsn, Message, StreamAbort, StreamStart,
    StreamState, TupleData,
};

fn decoder(protocol_version: u32, parallel_streaming: bool) -> Decoder {
    Decoder::new(DecoderOptions {
        protocol_version,
        parallel_streaming,
    })
}

/// Builds a message from a tag and the concatenated field bytes.
fn msg(tag: u8, fields: &[&[u8]]) -> Bytes {
    let mut out = vec![tag];
    for f in fields {
        out.extend_from_slice(f);
    }
    Bytes::from(out)
}

const STREAM_START: &[u8] = b"S\x00\x00\x01\x00\x01";
const STREAM_STOP: &[u8] = b"E";

fn parallel_abort_bytes() -> Bytes {
    msg(
        b'A',
        &[
            &10u32.to_be_bytes(),
            &11u32.to_be_bytes(),
            &0x16_B374_D848u64.to_be_bytes(),
            &(-42i64).to_be_bytes(),
        ],
    )
}

#[test]
fn protocol_4_parallel_stream_abort_carries_lsn_and_timestamp() {
    let mut d = decoder(4, true);
    assert_eq!(
        d.decode(&parallel_abort_bytes()),
        Ok(Message::StreamAbort(StreamAbort {
            xid: 10,
            subxid: 11,
            abort_lsn: Some("16/B374D848".parse::<Lsn>().unwrap()),
            abort_timestamp: Some(-42),
        }))
    );
}

#[test]
fn stream_abort_without_parallel_streaming_is_short() {
    let short = msg(b'A', &[&10u32.to_be_bytes(), &10u32.to_be_bytes()]);
    let expected = Message::StreamAbort(StreamAbort {
        xid: 10,
        subxid: 10,
        abort_lsn: None,
        abort_timestamp: None,
    });
    for (version, parallel) in [(2, false), (3, false), (4, false), (2, true), (3, true)] {
        let mut d = decoder(version, parallel);
        assert_eq!(d.decode(&short), Ok(expected.clone()));
        assert_eq!(
            d.decode(&parallel_abort_bytes()),
            Err(DecodeError::TrailingBytes {
                message: "Stream Abort",
                count: 16
            }),
            "version {version} parallel {parallel}"
        );
    }
    assert_eq!(parse(&short), Ok(expected));
    // With protocol 4 and parallel streaming the short form is cut.
    assert_eq!(
        decoder(4, true).decode(&short),
        Err(DecodeError::Truncated {
            field: "abort_lsn",
            offset: 9,
            needed: 8
        })
    );
}

#[test]
fn streaming_messages_need_protocol_2() {
    let mut d = decoder(1, false);
    for (bytes, name) in [
        (Bytes::from_static(STREAM_START), "Stream Start"),
        (Bytes::from_static(STREAM_STOP), "Stream Stop"),
        (msg(b'A', &[&[0; 8]]), "Stream Abort"),
        (msg(b'c', &[&[0; 29]]), "Stream Commit"),
    ] {
        assert_eq!(
            d.decode(&bytes),
            Err(DecodeError::Unexpected {
                message: name,
                reason: "requires protocol version 2 (streaming) or later"
            })
        );
    }
    assert_eq!(d.state(), StreamState::default());
}

#[test]
fn two_phase_messages_need_protocol_3() {
    let begin_prepare = msg(b'b', &[&[0; 28], b"gid\0"]);
    let stream_prepare = msg(b'p', &[&[0; 29], b"gid\0"]);
    for version in [1, 2] {
        for (bytes, name) in [
            (&begin_prepare, "Begin Prepare"),
            (&stream_prepare, "Stream Prepare"),
        ] {
            assert_eq!(
                decoder(version, false).decode(bytes),
                Err(DecodeError::Unexpected {
                    message: name,
                    reason: "requires protocol version 3 (two-phase commit) or later"
                })
            );
        }
    }
    assert!(matches!(
        decoder(3, false).decode(&begin_prepare),
        Ok(Message::BeginPrepare(_))
    ));
    assert!(matches!(
        decoder(4, false).decode(&stream_prepare),
        Ok(Message::StreamPrepare(_))
    ));
}

#[test]
fn stream_state_is_tracked() {
    let mut d = decoder(2, false);
    assert_eq!(
        d.decode(&Bytes::from_static(STREAM_STOP)),
        Err(DecodeError::Unexpected {
            message: "Stream Stop",
            reason: "only allowed inside a streamed block"
        })
    );
    let insert_in_stream = msg(
        b'I',
        &[&256u32.to_be_bytes(), &16384u32.to_be_bytes(), b"N\x00\x00"],
    );
    let insert_outside = msg(b'I', &[&16384u32.to_be_bytes(), b"N\x00\x00"]);
    assert_eq!(
        d.decode(&insert_outside),
        Ok(Message::Insert(Insert {
            xid: None,
            relation_id: 16384,
            new: TupleData::default()
        }))
    );

    assert_eq!(
        d.decode(&Bytes::from_static(STREAM_START)),
        Ok(Message::StreamStart(StreamStart {
            xid: 256,
            first_segment: true
        }))
    );
    assert!(d.state().in_stream);
    assert_eq!(
        d.decode(&insert_in_stream),
        Ok(Message::Insert(Insert {
            xid: Some(256),
            relation_id: 16384,
            new: TupleData::default()
        }))
    );
    // The same bytes without the xid do not decode inside a block.
    assert!(d.decode(&insert_outside).is_err());
    for (bytes, name) in [
        (Bytes::from_static(STREAM_START), "Stream Start"),
        (msg(b'B', &[&[0; 20]]), "Begin"),
        (msg(b'C', &[&[0; 25]]), "Commit"),
        (msg(b'c', &[&[0; 29]]), "Stream Commit"),
        (msg(b'A', &[&[0; 8]]), "Stream Abort"),
    ] {
        assert_eq!(
            d.decode(&bytes),
            Err(DecodeError::Unexpected {
                message: name,
                reason: "not allowed inside a streamed block"
            })
        );
        assert!(d.state().in_stream, "a failed decode changed the state");
    }
    // Origin may appear inside a block, without an xid.
    let origin = msg(b'O', &[&[0; 8], b"o\0"]);
    assert!(matches!(d.decode(&origin), Ok(Message::Origin(_))));
    assert_eq!(
        d.decode(&Bytes::from_static(STREAM_STOP)),
        Ok(Message::StreamStop)
    );
    assert_eq!(d.state(), StreamState { in_stream: false });
    assert!(d.decode(&insert_outside).is_ok());
}

#[test]
fn a_bad_stream_start_does_not_open_a_block() {
    let mut d = decoder(2, false);
    assert_eq!(
        d.decode(&Bytes::from_static(b"S\x00\x00\x00\x01\x02")),
        Err(DecodeError::InvalidValue {
            field: "first_segment",
            value: 2
        })
    );
    assert!(!d.state().in_stream);
    assert!(d.decode(&Bytes::from_static(b"S\x00\x00\x00\x01")).is_err());
    assert!(!d.state().in_stream);
}

#[test]
fn parse_accepts_every_kind_outside_a_block() {
    assert!(matches!(
        parse(&Bytes::from_static(STREAM_START)),
        Ok(Message::StreamStart(_))
    ));
    assert!(matches!(
        parse(&msg(b'K', &[&[0; 29], b"g\0"])),
        Ok(Message::CommitPrepared(_))
    ));
    assert!(matches!(
        parse(&msg(b'r', &[&[0; 37], b"g\0"])),
        Ok(Message::RollbackPrepared(_))
    ));
    assert_eq!(
        parse(&Bytes::from_static(STREAM_STOP)),
        Err(DecodeError::Unexpected {
            message: "Stream Stop",
            reason: "only allowed inside a streamed block"
        })
    );
}

#[test]
fn empty_and_unknown_tags() {
    assert_eq!(parse(&Bytes::new()), Err(DecodeError::Empty));
    for tag in [b'Z', b'a', 0, 0xff, b'k', b'w'] {
        assert_eq!(
            parse(&Bytes::from(vec![tag, 0, 0])),
            Err(DecodeError::UnknownTag { tag })
        );
    }
}

fn relation(identity: u8, name: &[u8]) -> Bytes {
    msg(
        b'R',
        &[
            &16384u32.to_be_bytes(),
            b"public\0",
            name,
            &[identity],
            &1u16.to_be_bytes(),
            b"\x01id\0",
            &23u32.to_be_bytes(),
            &(-1i32).to_be_bytes(),
        ],
    )
}

#[test]
fn relation_field_errors() {
    assert!(matches!(
        parse(&relation(b'd', b"t\0")),
        Ok(Message::Relation(_))
    ));
    assert_eq!(
        parse(&relation(b'x', b"t\0")),
        Err(DecodeError::InvalidValue {
            field: "replica identity",
            value: u64::from(b'x')
        })
    );
    assert_eq!(
        parse(&relation(b'd', b"\xc3\x28\0")),
        Err(DecodeError::InvalidUtf8 {
            field: "relation name",
            offset: 12
        })
    );
    // A column count far beyond the data: a Truncated error, no huge allocation.
    let many = msg(b'R', &[&[0; 4], b"\0\0d", &u16::MAX.to_be_bytes()]);
    assert_eq!(
        parse(&many),
        Err(DecodeError::Truncated {
            field: "column flags",
            offset: 10,
            needed: 1
        })
    );
    let unterminated = msg(b'R', &[&[0; 4], b"public"]);
    assert_eq!(
        parse(&unterminated),
        Err(DecodeError::UnterminatedString {
            field: "namespace",
            offset: 5
        })
    );
}

#[test]
fn tuple_field_errors() {
    let rel = 16384u32.to_be_bytes();
    assert_eq!(
        parse(&msg(b'I', &[&rel, b"N\x00\x01x"])),
        Err(DecodeError::InvalidValue {
            field: "tuple column kind",
            value: u64::from(b'x')
        })
    );
    assert_eq!(
        parse(&msg(b'I', &[&rel, b"N\x00\x01t\xff\xff\xff\xfe"])),
        Err(DecodeError::InvalidLength {
            field: "column value length",
            length: -2
        })
    );
    assert_eq!(
        parse(&msg(b'I', &[&rel, b"N\x00\x01b\x00\x00\x00\x05abc"])),
        Err(DecodeError::Truncated {
            field: "column value",
            offset: 13,
            needed: 2
        })
    );
    for (tag, marker) in [
        (b'I', b'K'),
        (b'I', b'O'),
        (b'D', b'N'),
        (b'U', b'X'),
        (b'D', b'x'),
    ] {
        assert_eq!(
            parse(&msg(tag, &[&rel, &[marker], b"\x00\x00"])),
            Err(DecodeError::InvalidValue {
                field: "tuple marker",
                value: u64::from(marker)
            }),
            "{} with {}",
            tag as char,
            marker as char
        );
    }
    // Update: old tuple then something other than N.
    assert_eq!(
        parse(&msg(b'U', &[&rel, b"K\x00\x00K\x00\x00"])),
        Err(DecodeError::InvalidValue {
            field: "tuple marker",
            value: u64::from(b'K')
        })
    );
    // Update: N then another tuple is trailing data.
    assert_eq!(
        parse(&msg(b'U', &[&rel, b"N\x00\x00N\x00\x00"])),
        Err(DecodeError::TrailingBytes {
            message: "Update",
            count: 3
        })
    );
}

#[test]
fn negative_lengths_and_counts() {
    assert_eq!(
        parse(&msg(b'T', &[&(-1i32).to_be_bytes(), &[0]])),
        Err(DecodeError::InvalidLength {
            field: "relation count",
            length: -1
        })
    );
    assert_eq!(
        parse(&msg(b'T', &[&i32::MAX.to_be_bytes(), &[0], &[0; 4]])),
        Err(DecodeError::Truncated {
            field: "relation id",
            offset: 10,
            needed: 4
        })
    );
    assert_eq!(
        parse(&msg(
            b'M',
            &[&[1], &[0; 8], b"p\0", &i32::MIN.to_be_bytes()]
        )),
        Err(DecodeError::InvalidLength {
            field: "content length",
            length: i64::from(i32::MIN)
        })
    );
}

#[test]
fn non_zero_flags_are_passed_through() {
    // PostgreSQL sends 0 today; the decoder hands flags over rather than guessing.
    let commit = msg(b'C', &[&[4], &[0; 24]]);
    match parse(&commit) {
        Ok(Message::Commit(c)) => assert_eq!(c.flags, 4),
        other => panic!("{other:?}"),
    }
}

#[test]
fn message_names_and_tags() {
    let m = Message::StreamAbort(StreamAbort {
        xid: 1,
        subxid: 1,
        abort_lsn: None,
        abort_timestamp: None,
    });
    assert_eq!((m.tag(), m.name()), (b'A', "Stream Abort"));
    assert_eq!(Message::StreamStop.tag(), b'E');
    assert_eq!(encode(&Message::StreamStop), Bytes::from_static(b"E"));
}
