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
//! - One pass over the input; bytes that need no escape are copied in runs.

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
    out.extend_from_slice(&[
        b'\\',
        b'u',
        HEX[usize::from(unit >> 12)],
        HEX[usize::from((unit >> 8) & 0x0F)],
        HEX[usize::from((unit >> 4) & 0x0F)],
        HEX[usize::from(unit & 0x0F)],
    ]);
}

/// Appends `text` to `out` as a JSON string literal, quotes included.
pub fn write_json_string(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    // Most payloads are JSON documents whose quotes all need escaping (about a tenth of their
    // bytes): leave room for that, so the buffer is not grown while escaping.
    out.reserve(bytes.len() + bytes.len() / 4 + 2);
    out.push(b'"');
    let mut run_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let escape = ESCAPES[usize::from(b)];
        if escape == 0 {
            i += 1;
            continue;
        }
        out.extend_from_slice(&bytes[run_start..i]);
        if escape == SUPPLEMENTARY {
            // `text` is valid UTF-8, so a lead byte 0xF0..=0xF4 starts a 4-byte character;
            // Jackson writes its two UTF-16 surrogates as escapes.
            let c = text[i..]
                .chars()
                .next()
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            let mut units = [0u16; 2];
            for &unit in c.encode_utf16(&mut units).iter() {
                push_unit(out, unit);
            }
            i += c.len_utf8();
            run_start = i;
            continue;
        }
        if escape == UNICODE {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0x0F)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
        i += 1;
        run_start = i;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
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

    proptest! {
        #[test]
        fn serde_json_reads_back_the_input(text in any::<String>()) {
            let out = json_string(&text);
            let back: String = serde_json::from_slice(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, text);
        }

        #[test]
        fn control_heavy_input_round_trips(text in "[\\x00-\\x20\"\\\\/\\x7f\u{80}-\u{10ffff}]{0,64}") {
            let out = json_string(&text);
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
