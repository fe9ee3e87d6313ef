#![allow(clippy::unwrap_used)]
//! Malformed input: every cut of every captured message, trailing bytes, corrupted and
//! arbitrary bytes. Decoding must fail with the right error and never panic.

mod common;

use bytes::Bytes;
use common::{Fixture, FIXTURES};
use pgoutput::{DecodeError, Decoder, DecoderOptions, StreamState};
use proptest::prelude::*;

/// Checks that a message cut short gives a coherent error and leaves the decoder unchanged.
fn check_cut(fixture: &str, index: usize, decoder: &Decoder, full: &Bytes, cut: usize) {
    let mut d = decoder.clone();
    let before = d.state();
    let result = d.decode(&full.slice(..cut));
    let ctx = format!("{fixture} message {index} cut at {cut}/{}", full.len());
    assert_eq!(d.state(), before, "{ctx}: state changed on error");
    match result {
        Err(DecodeError::Empty) => assert_eq!(cut, 0, "{ctx}"),
        Err(DecodeError::Truncated {
            field,
            offset,
            needed,
        }) => {
            assert!(!field.is_empty(), "{ctx}");
            assert!(offset <= cut, "{ctx}: offset {offset}");
            assert!(needed > 0, "{ctx}");
            // The field that did not fit ends within the full message.
            assert!(cut + needed <= full.len(), "{ctx}: needed {needed}");
        }
        Err(DecodeError::UnterminatedString { offset, .. }) => {
            // The cut fell inside a string: its NUL was cut off.
            assert!(offset <= cut, "{ctx}");
            assert!(full[cut..].contains(&0), "{ctx}");
            assert!(!full[offset..cut].contains(&0), "{ctx}");
        }
        other => panic!("{ctx}: unexpected result {other:?}"),
    }
}

#[test]
fn every_truncation_of_every_fixture_message_is_an_error() {
    let mut cuts = 0;
    for name in FIXTURES {
        let fixture = Fixture::load(name);
        for (i, (decoder, full)) in fixture
            .decoders_before_each()
            .iter()
            .zip(&fixture.messages)
            .enumerate()
        {
            for cut in 0..full.len() {
                check_cut(name, i, decoder, full, cut);
                cuts += 1;
            }
        }
    }
    assert!(cuts > 5000, "only {cuts} cuts");
}

#[test]
fn truncations_of_a_parallel_stream_abort() {
    let decoder = Decoder::new(DecoderOptions {
        protocol_version: 4,
        parallel_streaming: true,
    });
    let mut full = vec![b'A'];
    full.extend(7u32.to_be_bytes());
    full.extend(8u32.to_be_bytes());
    full.extend(0x1_0000_0000u64.to_be_bytes());
    full.extend(5i64.to_be_bytes());
    let full = Bytes::from(full);
    assert!(decoder.clone().decode(&full).is_ok());
    for cut in 0..full.len() {
        check_cut("parallel stream abort", 0, &decoder, &full, cut);
    }
}

#[test]
fn a_trailing_byte_after_any_fixture_message_is_rejected() {
    for name in FIXTURES {
        let fixture = Fixture::load(name);
        for (decoder, full) in fixture.decoders_before_each().iter().zip(&fixture.messages) {
            let expected_name = decoder.clone().decode(full).unwrap().name();
            for extra in [0u8, b'N', 0xff] {
                let mut longer = full.to_vec();
                longer.push(extra);
                let mut d = decoder.clone();
                assert_eq!(
                    d.decode(&Bytes::from(longer)),
                    Err(DecodeError::TrailingBytes {
                        message: expected_name,
                        count: 1
                    }),
                    "{name}"
                );
                assert_eq!(d.state(), decoder.state());
            }
        }
    }
}

fn decoder_configs() -> Vec<(DecoderOptions, bool)> {
    let mut out = Vec::new();
    for protocol_version in 1..=4 {
        for parallel_streaming in [false, true] {
            for in_stream in [false, true] {
                if in_stream && protocol_version < 2 {
                    continue;
                }
                out.push((
                    DecoderOptions {
                        protocol_version,
                        parallel_streaming,
                    },
                    in_stream,
                ));
            }
        }
    }
    out
}

/// A decoder with the given options, inside a streamed block if `in_stream`.
fn decoder(options: DecoderOptions, in_stream: bool) -> Decoder {
    let mut d = Decoder::new(options);
    if in_stream {
        d.decode(&Bytes::from_static(b"S\x00\x00\x00\x01\x01"))
            .unwrap();
        assert_eq!(d.state(), StreamState { in_stream: true });
    }
    d
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let buf = Bytes::from(data);
        let _ = pgoutput::parse(&buf);
        for (options, in_stream) in decoder_configs() {
            let _ = decoder(options, in_stream).decode(&buf);
        }
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_tag_never_panic(
        tag in prop::sample::select(b"BCORYIUDTMSEcAbPKrp".to_vec()),
        data in proptest::collection::vec(any::<u8>(), 0..96),
    ) {
        let mut bytes = vec![tag];
        bytes.extend(data);
        let buf = Bytes::from(bytes);
        for (options, in_stream) in decoder_configs() {
            let _ = decoder(options, in_stream).decode(&buf);
        }
    }

    #[test]
    fn corrupted_fixture_messages_never_panic(
        fixture in prop::sample::select(FIXTURES.to_vec()),
        pick in any::<prop::sample::Index>(),
        position in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let fixture = Fixture::load(fixture);
        let i = pick.index(fixture.messages.len());
        let mut bytes = fixture.messages[i].to_vec();
        let at = position.index(bytes.len());
        bytes[at] = value;
        let mut d = fixture.decoders_before_each().swap_remove(i);
        let _ = d.decode(&Bytes::from(bytes));
    }
}
