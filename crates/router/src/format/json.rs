//! JSON string literals written byte for byte as Jackson's `UTF8JsonGenerator` writes them
//! (the generator behind Kafka Connect's `JsonConverter`).
//!
//! Jackson escapes only what JSON requires:
//!
//! | input                              | output                 |
//! |------------------------------------|------------------------|
//! | `"`                                | `\"`                   |
//! | `\`                                | `\\`                   |
//! | 0x08, 0x09, 0x0A, 0x0C, 0x0D       | `\b`, `\t`, `\n`, `\f`, `\r` |
//! | other bytes below 0x20             | `\u00XX`, upper-case hex (`\u001F`) |
//! | characters above U+FFFF            | their UTF-16 surrogate pair as two escapes, upper-case hex (`😀` → `\uD83D\uDE00`) |
//! | everything else                    | unchanged: `/`, DEL (0x7F), non-ASCII UTF-8 up to U+FFFF, U+2028 |
//!
//! Jackson's generator works on Java's UTF-16 strings and, by default
//! (`JsonWriteFeature.COMBINE_UNICODE_SURROGATES_IN_UTF8` off), writes each surrogate of a pair
//! as an escape instead of combining the pair into one 4-byte UTF-8 sequence. (`serde_json`
//! writes lower-case hex and raw UTF-8, hence this module.)
//!
//! # Invariants
//! - The output is a valid JSON string literal that decodes to the input.
//! - One pass over the input, 32 and 16 bytes at a time with SSE2 on x86_64 (`sse2`), eight
//!   bytes at a time elsewhere; bytes that need no escape are copied a block at a time.
//! - Byte for byte the same output as escaping one byte at a time (property tests compare
//!   both writers with a byte-at-a-time reference).

use bytes::Bytes;
use std::cell::RefCell;

/// Upper-case hex digits, as Jackson writes them.
const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Marker in [`ESCAPES`] for the `\u00XX` form.
const UNICODE: u8 = b'u';

/// Marker in [`ESCAPES`] for the lead byte of a 4-byte UTF-8 sequence (a character above
/// U+FFFF), written as two `\uXXXX` surrogate escapes.
const SUPPLEMENTARY: u8 = b'S';

/// For each byte: 0 when written as is, otherwise the character after the backslash
/// ([`UNICODE`] for the `\u00XX` form).
const ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = UNICODE;
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0A] = b'n';
    table[0x0C] = b'f';
    table[0x0D] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    let mut lead = 0xF0;
    while lead <= 0xF4 {
        table[lead] = SUPPLEMENTARY;
        lead += 1;
    }
    table
};

/// Appends `\uXXXX` with upper-case hex, as Jackson writes escapes.
fn push_unit(out: &mut Vec<u8>, unit: u16) {
    out.extend_from_slice(&unit_escape(unit));
}

/// The stack buffer [`write_json_string`] escapes into before copying to the output.
const STAGE: usize = 256;

/// The most one step writes into the stage past its position: seven clean bytes before an
/// escape and the two surrogate escapes (12 bytes) of a character above U+FFFF.
const STEP_MAX: usize = 7 + 12;

#[cfg(target_arch = "x86_64")]
mod sse2;

/// Appends `text` to `out` as a JSON string literal, quotes included.
pub fn write_json_string(out: &mut Vec<u8>, text: &str) {
    #[cfg(target_arch = "x86_64")]
    {
        // Room for the quotes and, as most payloads are JSON documents whose quotes all need
        // escaping (a tenth to a sixth of their bytes), for that, and for the whole-block
        // stores past the end of the last block.
        out.reserve(text.len() + text.len() / 4 + 2 + 32);
        out.push(b'"');
        sse2::write_escaped(out, text);
        out.push(b'"');
    }
    #[cfg(not(target_arch = "x86_64"))]
    write_by_words(out, text);
}

/// [`write_json_string`] without SIMD (off x86_64; on it, the reference the tests compare
/// the SSE2 writer with).
///
/// Eight bytes at a time, through a small buffer on the stack: each word is stored whole and
/// the position advanced past its bytes that need no escape, up to the first one that does,
/// which is then escaped; the buffer is copied to `out` whenever it is nearly full. So `out`
/// grows only by what is written.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn write_by_words(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    // Most payloads are JSON documents whose quotes all need escaping (about a tenth of their
    // bytes): leave room for that, so the buffer is not grown while escaping.
    out.reserve(bytes.len() + bytes.len() / 4 + 2);
    out.push(b'"');
    let mut stage = [0u8; STAGE];
    let mut o = 0;
    let mut i = 0;
    while i < bytes.len() {
        if o > STAGE - STEP_MAX {
            out.extend_from_slice(&stage[..o]);
            o = 0;
        }
        let at = match bytes[i..].first_chunk::<8>() {
            Some(word) => {
                stage[o..o + 8].copy_from_slice(word);
                let found = escape_lanes(u64::from_le_bytes(*word));
                if found == 0 {
                    i += 8;
                    o += 8;
                    continue;
                }
                // Little-endian: the lowest set bit is the first byte that needs an escape.
                let clean = (found.trailing_zeros() / 8) as usize;
                o += clean;
                i + clean
            }
            // The last bytes of the text, one at a time.
            None if ESCAPES[usize::from(bytes[i])] == 0 => {
                stage[o] = bytes[i];
                o += 1;
                i += 1;
                continue;
            }
            None => i,
        };
        match ESCAPES[usize::from(bytes[at])] {
            UNICODE | SUPPLEMENTARY => (i, o) = write_long_escape(&mut stage, o, text, at),
            escape => {
                stage[o..o + 2].copy_from_slice(&[b'\\', escape]);
                o += 2;
                i = at + 1;
            }
        }
    }
    out.extend_from_slice(&stage[..o]);
    out.push(b'"');
}

/// Writes at `stage[o..]` the `\uXXXX` escape(s) of the byte `text[i]` (a control character
/// or the lead byte of a character above U+FFFF); returns the input and stage positions
/// after it.
fn write_long_escape(stage: &mut [u8], o: usize, text: &str, i: usize) -> (usize, usize) {
    let b = text.as_bytes()[i];
    if ESCAPES[usize::from(b)] == UNICODE {
        stage[o..o + 6].copy_from_slice(&unit_escape(u16::from(b)));
        return (i + 1, o + 6);
    }
    let (escape, read) = supplementary_escape(text, i);
    stage[o..o + 12].copy_from_slice(&escape);
    (i + read, o + 12)
}

/// The two `\uXXXX` surrogate escapes of the character above U+FFFF that starts at byte `i`
/// of `text`, and its length in bytes (4).
#[cold]
fn supplementary_escape(text: &str, i: usize) -> ([u8; 12], usize) {
    // `text` is valid UTF-8, so a lead byte 0xF0..=0xF4 starts a 4-byte character; Jackson
    // writes its two UTF-16 surrogates as escapes.
    let c = text
        .get(i..)
        .and_then(|rest| rest.chars().next())
        .unwrap_or(char::REPLACEMENT_CHARACTER);
    let mut units = [0u16; 2];
    let mut escape = [0u8; 12];
    for (at, &unit) in c.encode_utf16(&mut units).iter().enumerate() {
        escape[6 * at..6 * at + 6].copy_from_slice(&unit_escape(unit));
    }
    (escape, c.len_utf8())
}

/// `\uXXXX` with upper-case hex, as Jackson writes escapes.
fn unit_escape(unit: u16) -> [u8; 6] {
    [
        b'\\',
        b'u',
        HEX[usize::from(unit >> 12)],
        HEX[usize::from((unit >> 8) & 0x0F)],
        HEX[usize::from((unit >> 4) & 0x0F)],
        HEX[usize::from(unit & 0x0F)],
    ]
}

/// Eight copies of a byte in a word.
const fn lanes(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

/// A word with the top bit of each byte of `word` set where that byte needs an escape (a
/// byte below 0x20, `"`, `\`, or a 4-byte UTF-8 lead 0xF0..=0xFF), possibly also in bytes
/// *above* the lowest such byte (borrows run upwards): only the lowest set bit is exact.
fn escape_lanes(word: u64) -> u64 {
    const LOW: u64 = lanes(0x01);
    const HIGH: u64 = lanes(0x80);
    // A byte is zero after XOR with the character it equals; `x - 1` borrows only there.
    let zero = |x: u64| x.wrapping_sub(LOW) & !x & HIGH;
    let below_space = word.wrapping_sub(lanes(0x20)) & !word & HIGH;
    // 0xF0..=0xFF: the four top bits set; the shifts move bits 6..4 onto bit 7 of the same byte.
    let lead4 = word & (word << 1) & (word << 2) & (word << 3) & HIGH;
    below_space | zero(word ^ lanes(b'"')) | zero(word ^ lanes(b'\\')) | lead4
}

/// Appends a Java string given as UTF-16 code units (unpaired surrogates allowed) to `out` as
/// a JSON string literal, quotes included: every surrogate, paired or not, as a `\uXXXX`
/// escape, the other units as [`write_json_string`] writes them.
pub fn write_json_utf16(out: &mut Vec<u8>, units: &[u16]) {
    out.push(b'"');
    let mut buf = [0u8; 4];
    for &unit in units {
        if (0xD800..0xE000).contains(&unit) {
            // Jackson escapes each surrogate unit on its own (see the module docs).
            push_unit(out, unit);
            continue;
        }
        // A unit outside the surrogate range is a character of the BMP.
        let c = char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER);
        let bytes = c.encode_utf8(&mut buf).as_bytes();
        match ESCAPES[usize::from(bytes[0])] {
            0 => out.extend_from_slice(bytes),
            UNICODE => push_unit(out, unit),
            escape => out.extend_from_slice(&[b'\\', escape]),
        }
    }
    out.push(b'"');
}

/// The UTF-8 bytes Java's `String.getBytes(UTF_8)` gives for UTF-16 `units`: an unpaired
/// surrogate becomes `?`.
pub fn java_utf8(units: &[u16]) -> Vec<u8> {
    // Java's UTF-8 encoder replaces malformed input with '?'.
    let text: String = char::decode_utf16(units.iter().copied())
        .map(|r| r.unwrap_or('?'))
        .collect();
    text.into_bytes()
}

/// Jackson's default `StreamWriteConstraints.maxNestingDepth`: the JSON converters cannot
/// write a document whose objects and arrays nest deeper.
pub const MAX_WRITE_DEPTH: usize = 1000;

/// The deepest nesting of objects and arrays in a JSON document (0 for a scalar).
pub fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// `text` as a JSON string literal, quotes included.
pub fn json_string(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    write_json_string(&mut out, text);
    out
}

/// A scratch buffer larger than this is let go after use rather than kept for the next value.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    /// Where [`json_string_bytes`] escapes, reused from one value to the next.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// [`json_string`] as [`Bytes`] that own an allocation of exactly their length.
///
/// The text is escaped into a reused per-thread buffer and copied out once: one allocation of
/// the final size, instead of a vector sized by an estimate (which [`Bytes`] then keeps, with
/// a second allocation to share it).
pub fn json_string_bytes(text: &str) -> Bytes {
    SCRATCH.with_borrow_mut(|scratch| {
        scratch.clear();
        write_json_string(scratch, text);
        let out = Bytes::copy_from_slice(scratch);
        if scratch.capacity() > SCRATCH_KEPT {
            *scratch = Vec::new();
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lit(text: &str) -> String {
        match String::from_utf8(json_string(text)) {
            Ok(s) => s,
            Err(e) => panic!("escaper wrote invalid UTF-8: {e}"),
        }
    }

    #[test]
    fn empty_string() {
        assert_eq!(lit(""), r#""""#);
    }

    #[test]
    fn plain_ascii_is_unchanged() {
        assert_eq!(lit("order-1"), r#""order-1""#);
    }

    #[test]
    fn quotes_and_backslashes() {
        assert_eq!(lit(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(lit(r#"{"a": 1}"#), r#""{\"a\": 1}""#);
    }

    #[test]
    fn short_escapes() {
        assert_eq!(lit("\u{8}\t\n\u{c}\r"), r#""\b\t\n\f\r""#);
    }

    #[test]
    fn other_control_chars_use_upper_case_hex() {
        assert_eq!(lit("\u{0}"), r#""\u0000""#);
        assert_eq!(lit("\u{1}\u{b}\u{e}"), r#""\u0001\u000B\u000E""#);
        assert_eq!(lit("\u{1f}"), r#""\u001F""#);
        assert_eq!(lit("a\u{1a}b"), r#""a\u001Ab""#);
    }

    #[test]
    fn slash_del_and_non_ascii_are_raw() {
        assert_eq!(lit("a/b"), r#""a/b""#);
        assert_eq!(lit("\u{7f}").as_bytes(), b"\"\x7f\"");
        assert_eq!(lit("café ü 日本"), "\"café ü 日本\"");
        assert_eq!(lit("\u{2028}\u{2029}"), "\"\u{2028}\u{2029}\"");
        assert_eq!(lit("\u{FFFF}\u{FEFF}"), "\"\u{FFFF}\u{FEFF}\"");
    }

    // Expected bytes from Debezium 3.6.3's JsonConverter (Jackson 2.21) in the differential test.
    #[test]
    fn characters_above_the_bmp_are_surrogate_escapes() {
        assert_eq!(lit("🎉"), r#""\uD83C\uDF89""#);
        assert_eq!(lit("order-😀"), r#""order-\uD83D\uDE00""#);
        assert_eq!(lit("𠀀aZürich"), r#""\uD840\uDC00aZürich""#);
        assert_eq!(lit("東京order𝄞"), r#""東京order\uD834\uDD1E""#);
        assert_eq!(
            lit("\u{E0041}\u{E007F}\u{2028} order"),
            "\"\\uDB40\\uDC41\\uDB40\\uDC7F\u{2028} order\""
        );
        assert_eq!(lit("\u{10FFFF}"), r#""\uDBFF\uDFFF""#);
        assert_eq!(lit("a\"😀\n"), r#""a\"\uD83D\uDE00\n""#);
    }

    #[test]
    fn every_byte_below_0x20() {
        for b in 0u8..0x20 {
            let text = char::from(b).to_string();
            let expected = match b {
                0x08 => r"\b".to_owned(),
                0x09 => r"\t".to_owned(),
                0x0A => r"\n".to_owned(),
                0x0C => r"\f".to_owned(),
                0x0D => r"\r".to_owned(),
                _ => format!("\\u{:04X}", b),
            };
            assert_eq!(lit(&text), format!("\"{expected}\""), "byte {b:#04x}");
        }
    }

    #[test]
    fn nesting_depth_skips_strings() {
        assert_eq!(nesting_depth(b"1"), 0);
        assert_eq!(nesting_depth(br#"{"a":[{"b":"[{\"}"}]}"#), 3);
        assert_eq!(nesting_depth(br#"[[],[[]]]"#), 3);
    }

    #[test]
    fn exact_bytes_match_the_vector() {
        for text in [
            "",
            "a",
            "order-1",
            r#"{"a": "b\\c"}"#,
            &"x\"".repeat(40_000),
        ] {
            let bytes = json_string_bytes(text);
            assert_eq!(&bytes[..], &json_string(text)[..]);
        }
        // The large scratch buffer was let go; the next value is still right.
        assert_eq!(&json_string_bytes("y")[..], b"\"y\"");
    }

    #[test]
    fn appends_to_existing_output() {
        let mut out = b"x".to_vec();
        write_json_string(&mut out, "y\"");
        assert_eq!(out, b"x\"y\\\"\"");
    }

    // Expected bytes from Debezium 3.6.3 (differential test): JsonConverter escapes unpaired
    // surrogates; StringConverter's UTF-8 encoder turns them into '?'.
    #[test]
    fn unpaired_surrogates() {
        let units: Vec<u16> = vec![0x78, 0xDC00, 0x79];
        let mut out = Vec::new();
        write_json_utf16(&mut out, &units);
        assert_eq!(out, br#""x\uDC00y""#);
        let mut out = Vec::new();
        write_json_utf16(&mut out, &[0xDFFF, 0xD800, 0x22, 0x1, 0xE9, 0xD83D, 0xDE00]);
        assert_eq!(
            out,
            "\"\\uDFFF\\uD800\\\"\\u0001é\\uD83D\\uDE00\"".as_bytes()
        );
        assert_eq!(java_utf8(&[0x78, 0xDC00, 0x79]), b"x?y");
        assert_eq!(java_utf8(&[0xDFFF, 0xD800]), b"??");
        assert_eq!(java_utf8(&[0xD83D, 0xDE00]), "😀".as_bytes());
    }

    /// The byte-at-a-time escaper the word-at-a-time one must match exactly.
    fn reference(text: &str) -> Vec<u8> {
        let bytes = text.as_bytes();
        let mut out = vec![b'"'];
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match ESCAPES[usize::from(b)] {
                0 => {
                    out.push(b);
                    i += 1;
                }
                SUPPLEMENTARY => {
                    let c = text[i..]
                        .chars()
                        .next()
                        .expect("a char starts at a lead byte");
                    let mut units = [0u16; 2];
                    for &unit in c.encode_utf16(&mut units).iter() {
                        out.extend_from_slice(format!("\\u{unit:04X}").as_bytes());
                    }
                    i += c.len_utf8();
                }
                UNICODE => {
                    out.extend_from_slice(format!("\\u{b:04X}").as_bytes());
                    i += 1;
                }
                escape => {
                    out.extend_from_slice(&[b'\\', escape]);
                    i += 1;
                }
            }
        }
        out.push(b'"');
        out
    }

    /// Text made of clean runs of up to 40 bytes with one character of `specials` after each.
    fn runs_with(specials: &'static str) -> impl Strategy<Value = String> {
        proptest::collection::vec(
            (
                "[a-zA-Z0-9 :,{}é日]{0,40}",
                proptest::sample::select(specials.chars().collect::<Vec<_>>()),
            ),
            0..12,
        )
        .prop_map(|parts| {
            parts
                .into_iter()
                .flat_map(|(run, c)| run.chars().chain(std::iter::once(c)).collect::<Vec<_>>())
                .collect()
        })
    }

    #[test]
    fn every_single_character_class_at_every_offset() {
        let specials = [
            "\"",
            "\\",
            "\u{0}",
            "\u{8}",
            "\u{1f}",
            " ",
            "\u{7f}",
            "\u{80}",
            "é",
            "\u{FFFF}",
            "\u{10000}",
            "😀",
            "\u{10FFFF}",
        ];
        for special in specials {
            for before in 0..(2 * STAGE + 20) {
                for after in 0..10 {
                    let text = format!("{}{special}{}", "a".repeat(before), "b".repeat(after));
                    assert_eq!(both(&text), reference(&text), "{text:?}");
                }
            }
        }
    }

    /// `text` escaped by every writer: the one in use, the SSE2 one without shuffles (x86_64)
    /// and the word-at-a-time one (the only
    /// one off x86_64), which must agree.
    fn both(text: &str) -> Vec<u8> {
        let out = json_string(text);
        let mut words = Vec::new();
        write_by_words(&mut words, text);
        assert_eq!(out, words, "the two writers differ on {text:?}");
        #[cfg(target_arch = "x86_64")]
        {
            // The SSE2 writer without the shuffles, which processors without SSSE3 run.
            let mut sse2 = vec![b'"'];
            sse2::write_escaped_sse2(&mut sse2, text);
            sse2.push(b'"');
            assert_eq!(
                out, sse2,
                "the writers with and without shuffles differ on {text:?}"
            );
        }
        out
    }

    #[test]
    fn runs_of_escapes_at_every_offset_of_a_block() {
        let specials = ["\"", "\\", "\u{0}", "\n", "\u{1f}", "😀", "\"\\", "\u{1}\""];
        for special in specials {
            for before in 0..70 {
                for run in 1..20 {
                    let text = format!(
                        "{}{}{}",
                        "a".repeat(before),
                        special.repeat(run),
                        "b".repeat(7)
                    );
                    assert_eq!(both(&text), reference(&text), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn multi_byte_characters_across_block_boundaries() {
        let wide = [
            "é",
            "\u{7ff}",
            "日",
            "\u{FFFF}",
            "\u{10000}",
            "😀",
            "\u{10FFFF}",
        ];
        for c in wide {
            for before in 0..40 {
                for after in ["", "\"", "x\"", "\u{2}"] {
                    let text = format!(
                        "{}{c}{c}{after}{}",
                        "a".repeat(before),
                        "\"".repeat(before % 3)
                    );
                    assert_eq!(both(&text), reference(&text), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn every_byte_value_at_every_lane() {
        // Every character from U+0000 to U+00FF and a few wider ones, at each position of
        // two 32-byte blocks, the 16-byte one after them and the last bytes.
        let chars = (0u32..=0xFF).chain([0x7FF, 0x800, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF]);
        for c in chars.filter_map(char::from_u32) {
            for before in 0..72 {
                let text = format!("{}{c}{}", "q".repeat(before), "z".repeat(before % 17));
                assert_eq!(both(&text), reference(&text), "{text:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn serde_json_reads_back_the_input(text in any::<String>()) {
            let out = both(&text);
            let back: String = serde_json::from_slice(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, text);
        }

        #[test]
        fn matches_the_byte_at_a_time_escaper(text in any::<String>()) {
            prop_assert_eq!(both(&text), reference(&text));
        }

        #[test]
        fn matches_on_control_surrogate_and_wide_characters(text in "[\\x00-\\x21\"\\\\/\\x7f\u{80}-\u{7ff}\u{800}-\u{ffff}\u{10000}-\u{10ffff}]{0,64}") {
            prop_assert_eq!(both(&text), reference(&text));
        }

        #[test]
        fn matches_on_long_clean_runs(text in runs_with("\"\\\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}\u{2028}\u{FFFF}\u{10000}😀\u{10FFFF}")) {
            let mut out = b"prefix".to_vec();
            write_json_string(&mut out, &text);
            prop_assert_eq!(&out[..6], b"prefix");
            prop_assert_eq!(out[6..].to_vec(), reference(&text));
            let mut words = b"prefix".to_vec();
            write_by_words(&mut words, &text);
            prop_assert_eq!(words, out);
        }

        #[test]
        fn matches_on_quote_dense_text(text in "[a-z0-9\"\\\\:,{} é日😀]{0,200}") {
            // JSON documents: a quote every few bytes, the blocks the shuffles spread.
            prop_assert_eq!(both(&text), reference(&text));
        }

        #[test]
        fn control_heavy_input_round_trips(text in "[\\x00-\\x20\"\\\\/\\x7f\u{80}-\u{10ffff}]{0,64}") {
            let out = both(&text);
            let back: String = serde_json::from_slice(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, text);
            // Every `\u00XX` escape uses upper-case hex.
            for (i, _) in out.windows(4).enumerate().filter(|(_, w)| *w == b"\\u00") {
                let digits = &out[i + 4..i + 6];
                prop_assert!(digits.iter().all(|d| d.is_ascii_digit() || (b'A'..=b'F').contains(d)));
            }
        }
    }
}
