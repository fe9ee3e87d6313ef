//! Shared test support: fixture loading and a test-only encoder of messages back to bytes.

#![allow(dead_code)]

pub mod encode;

use bytes::Bytes;
use pgoutput::{Decoder, DecoderOptions, Message};
use std::path::PathBuf;

/// Every fixture file, by scenario name.
pub const FIXTURES: &[&str] = &[
    "basic",
    "binary",
    "identity",
    "messages",
    "origin",
    "stream",
    "stream_two_phase",
    "toast",
    "truncate",
    "two_phase",
];

/// One captured scenario: the options it was captured with and its messages in order.
pub struct Fixture {
    pub name: String,
    pub options: DecoderOptions,
    pub messages: Vec<Bytes>,
}

impl Fixture {
    /// Loads `tests/fixtures/<name>.hex`.
    pub fn load(name: &str) -> Fixture {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(format!("{name}.hex"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut protocol_version = None;
        let mut messages = Vec::new();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix('#') {
                if let Some(v) = comment.trim().strip_prefix("proto_version:") {
                    protocol_version = Some(v.trim().parse().expect("proto_version"));
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            messages.push(Bytes::from(hex_decode(line.trim())));
        }
        assert!(!messages.is_empty(), "{name} has no messages");
        Fixture {
            name: name.to_owned(),
            options: DecoderOptions {
                protocol_version: protocol_version.expect("fixture names its proto_version"),
                parallel_streaming: false,
            },
            messages,
        }
    }

    /// Decodes every message in order with one decoder, panicking on the first error.
    pub fn decode_all(&self) -> Vec<Message> {
        let mut decoder = Decoder::new(self.options);
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                decoder
                    .decode(m)
                    .unwrap_or_else(|e| panic!("{} message {i}: {e}", self.name))
            })
            .collect()
    }

    /// For each message, the decoder state just before it (so that a single message can be
    /// decoded again on its own).
    pub fn decoders_before_each(&self) -> Vec<Decoder> {
        let mut decoder = Decoder::new(self.options);
        let mut out = Vec::new();
        for m in &self.messages {
            out.push(decoder.clone());
            decoder.decode(m).expect("fixture decodes");
        }
        out
    }
}

/// Decodes lower- or upper-case hex.
pub fn hex_decode(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}
