//! Arbitrary bytes through the pgoutput decoder.
//!
//! Input layout: a sequence of chunks, each a big-endian `u16` length followed by that many
//! bytes (a short last chunk takes what is left). Each chunk is one message. The whole input,
//! and each chunk, goes through the stateless `parse`; the chunks, in order, go through one
//! `Decoder` per protocol option set, so that Stream Start / Stream Stop change the state the
//! following chunks are decoded in.
//!
//! Besides "never panics", the target checks the documented decoder invariants:
//! - a failed decode leaves the stream state as it was;
//! - only a decoded Stream Start / Stream Stop changes the stream state;
//! - outside a streamed block, a protocol-4 decoder without parallel streaming agrees with
//!   `parse`;
//! - `decode_skimming` agrees with `decode`: skimming nothing gives the same result, skimming
//!   every relation the same except that a Delete comes as its relation and xid, and the
//!   stream state follows the same way.
//!
//! `scripts/fuzz.sh` turns the captured fixtures into seeds of this layout.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutput::{Decoded, Decoder, DecoderOptions, Message, SkimmedDelete};

/// Protocol versions to decode with: 1 to 4, plus one below and one above the known range.
const VERSIONS: [u32; 6] = [0, 1, 2, 3, 4, 5];

/// Splits the input into length-prefixed chunks.
fn chunks(data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        if rest.len() < 2 {
            out.push(Bytes::copy_from_slice(rest));
            break;
        }
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        let take = len.min(rest.len());
        out.push(Bytes::copy_from_slice(&rest[..take]));
        rest = &rest[take..];
    }
    out
}

/// Touches everything a caller would look at, so lazily checked parts are exercised too.
fn inspect(result: &Result<Message, pgoutput::DecodeError>) {
    match result {
        Ok(message) => {
            let _ = message.tag();
            let _ = message.name();
            let _ = format!("{message:?}");
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = Bytes::copy_from_slice(data);
    inspect(&pgoutput::parse(&whole));

    let messages = chunks(data);
    let mut decoders: Vec<Decoder> = VERSIONS
        .iter()
        .flat_map(|&protocol_version| {
            [false, true].map(|parallel_streaming| {
                Decoder::new(DecoderOptions {
                    protocol_version,
                    parallel_streaming,
                })
            })
        })
        .collect();

    for message in &messages {
        let parsed = pgoutput::parse(message);
        inspect(&parsed);
        for decoder in &mut decoders {
            let options = decoder.options();
            let before = decoder.state();
            let mut never = decoder.clone();
            let mut always = decoder.clone();
            let decoded = decoder.decode(message);
            assert_eq!(
                never.decode_skimming(message, |_| false),
                decoded.clone().map(Decoded::Message),
                "decode_skimming without skimming and decode disagree"
            );
            let skimmed = decoded.clone().map(|m| match m {
                Message::Delete(d) => Decoded::SkimmedDelete(SkimmedDelete {
                    xid: d.xid,
                    relation_id: d.relation_id,
                }),
                other => Decoded::Message(other),
            });
            assert_eq!(
                always.decode_skimming(message, |_| true),
                skimmed,
                "decode_skimming and decode disagree"
            );
            assert_eq!(never.state(), decoder.state());
            assert_eq!(always.state(), decoder.state());
            inspect(&decoded);
            let after = decoder.state();
            match &decoded {
                Err(_) => assert_eq!(before, after, "a failed decode changed the stream state"),
                Ok(Message::StreamStart(_)) => assert!(after.in_stream),
                Ok(Message::StreamStop) => assert!(!after.in_stream),
                Ok(_) => assert_eq!(before, after, "a non-stream message changed the state"),
            }
            if options == DecoderOptions::new(DecoderOptions::LATEST_PROTOCOL_VERSION)
                && !before.in_stream
            {
                assert_eq!(decoded, parsed, "Decoder(v4) and parse disagree");
            }
        }
    }
});
