#![allow(clippy::unwrap_used)]
//! `Decoder::decode_skimming` against `Decoder::decode`: a skimmed Delete is refused exactly when
//! `decode` refuses it, with the same error, and otherwise names the same relation and xid;
//! every other message, and a Delete that is not skimmed, decodes as `decode` decodes it; the
//! stream state follows the same way.

mod common;

use bytes::Bytes;
use common::{Fixture, FIXTURES};
use pgoutput::{Decoded, Decoder, DecoderOptions, Message, SkimmedDelete};
use proptest::prelude::*;
use std::cell::Cell;

/// Checks both skimming choices of `buf` against `decode`, from `decoder`'s state.
fn check(decoder: &Decoder, buf: &Bytes) {
    let mut plain = decoder.clone();
    let decoded = plain.decode(buf);

    // Skimming nothing is decoding.
    let mut never = decoder.clone();
    let asked = Cell::new(0);
    let result = never.decode_skimming(buf, |_| {
        asked.set(asked.get() + 1);
        false
    });
    assert_eq!(result, decoded.clone().map(Decoded::Message), "{buf:?}");
    assert_eq!(never.state(), plain.state(), "{buf:?}");
    assert!(asked.get() <= 1, "{buf:?}: asked {} times", asked.get());

    // Skimming every relation changes only what a Delete decodes to.
    let mut always = decoder.clone();
    let asked = Cell::new(None);
    let result = always.decode_skimming(buf, |relation| {
        assert!(
            asked.replace(Some(relation)).is_none(),
            "{buf:?}: asked twice"
        );
        true
    });
    let expected = decoded.map(|message| match message {
        Message::Delete(delete) => Decoded::SkimmedDelete(SkimmedDelete {
            xid: delete.xid,
            relation_id: delete.relation_id,
        }),
        other => Decoded::Message(other),
    });
    if let Ok(Decoded::SkimmedDelete(delete)) = &expected {
        assert_eq!(asked.get(), Some(delete.relation_id), "{buf:?}");
    }
    if asked.get().is_some() {
        assert_eq!(
            buf.first(),
            Some(&b'D'),
            "{buf:?}: asked for a message not a Delete"
        );
    }
    assert_eq!(result, expected, "{buf:?}");
    assert_eq!(always.state(), plain.state(), "{buf:?}");
}

#[test]
fn every_fixture_message_cut_or_lengthened_skims_as_it_decodes() {
    let mut deletes = 0;
    for name in FIXTURES {
        let fixture = Fixture::load(name);
        for (decoder, full) in fixture.decoders_before_each().iter().zip(&fixture.messages) {
            if full.first() == Some(&b'D') {
                deletes += 1;
            }
            for cut in 0..=full.len() {
                check(decoder, &full.slice(..cut));
            }
            for extra in [0u8, b'n', 0xff] {
                let mut longer = full.to_vec();
                longer.push(extra);
                check(decoder, &Bytes::from(longer));
            }
        }
    }
    // Key and whole-row old images, inside and outside streamed blocks.
    assert!(
        deletes >= 3,
        "only {deletes} Delete messages in the fixtures"
    );
}

/// Decoders of every protocol version, inside a streamed block where the version has them.
fn decoders() -> Vec<Decoder> {
    let mut out = Vec::new();
    for protocol_version in 1..=4 {
        let d = Decoder::new(DecoderOptions::new(protocol_version));
        if protocol_version >= 2 {
            let mut inside = d.clone();
            inside
                .decode(&Bytes::from_static(b"S\x00\x00\x00\x01\x01"))
                .unwrap();
            out.push(inside);
        }
        out.push(d);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_deletes_skim_as_they_decode(
        marker in prop::sample::select(b"KON".to_vec()),
        columns in proptest::collection::vec(
            (prop::sample::select(b"nutbx".to_vec()), any::<i32>(), proptest::collection::vec(any::<u8>(), 0..8)),
            0..5,
        ),
        count_delta in -1i32..=1,
        tail in proptest::collection::vec(any::<u8>(), 0..3),
        cut in any::<prop::sample::Index>(),
    ) {
        // A Delete with mostly well-formed columns, then perhaps a wrong count, a wrong length,
        // trailing bytes or a cut.
        let mut bytes = vec![b'D'];
        bytes.extend(16_384u32.to_be_bytes());
        bytes.push(marker);
        let count = (columns.len() as i32 + count_delta).max(0) as u16;
        bytes.extend(count.to_be_bytes());
        for (kind, length, value) in &columns {
            bytes.push(*kind);
            if matches!(kind, b't' | b'b') {
                let length = if *length % 4 == 0 { *length } else { value.len() as i32 };
                bytes.extend(length.to_be_bytes());
                bytes.extend(value);
            }
        }
        bytes.extend(&tail);
        let whole = Bytes::from(bytes);
        let cut = whole.slice(..cut.index(whole.len() + 1));
        for decoder in decoders() {
            check(&decoder, &whole);
            check(&decoder, &cut);
        }
    }

    #[test]
    fn arbitrary_bytes_skim_as_they_decode(
        tag in prop::sample::select(b"DDDDIUBCR".to_vec()),
        data in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        let mut bytes = vec![tag];
        bytes.extend(data);
        let buf = Bytes::from(bytes);
        for decoder in decoders() {
            check(&decoder, &buf);
        }
    }

    #[test]
    fn corrupted_fixture_messages_skim_as_they_decode(
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
        let decoder = fixture.decoders_before_each().swap_remove(i);
        check(&decoder, &Bytes::from(bytes));
    }
}
