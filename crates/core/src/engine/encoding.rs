//! The database encoding, and text in it turned into UTF-8.
//!
//! PostgreSQL converts what it sends of table rows and object names to the replication
//! connection's `client_encoding` (Siphon asks for UTF8), but not the content of a logical
//! decoding message (`pg_logical_emit_message`): that is sent as the bytes it was emitted with,
//! text in the database encoding (the `server_encoding` the server reports at login). A
//! [`DatabaseEncoding`] turns such bytes into UTF-8 with the mappings of the Encoding Standard
//! (encoding_rs), corrected where PostgreSQL's mapping differs.
//!
//! # Invariants
//! - A conversion gives PostgreSQL's own result (`convert_from(content, '<encoding>')`) or an
//!   error naming the encoding: never a replacement character, never another character, and
//!   an error wherever PostgreSQL refuses the bytes. Checked against a real server for every
//!   byte of each single-byte encoding and every two-byte sequence of EUC_KR
//!   (`crates/source/tests/encoding.rs`); the one difference is an error where PostgreSQL has
//!   a character the Encoding Standard lacks (EUC_KR 0xA2E8). LATIN1 is ISO 8859-1 (bytes
//!   0x80-0x9F are the C1 controls, not windows-1252's punctuation), and so are LATIN5
//!   (ISO 8859-9, not windows-1254) and KOI8U (RFC 2319, not the Encoding Standard's KOI8-RU).
//! - Encodings where the Encoding Standard gives other characters than PostgreSQL (EUC_JP,
//!   EUC_CN) or has none (EUC_JIS_2004, EUC_TW, MULE_INTERNAL) have no mapping. ASCII is the
//!   same bytes in every server encoding, so ASCII content converts under every encoding.
//! - UTF8 content must be valid UTF-8; so must SQL_ASCII content, which declares no encoding
//!   (PostgreSQL passes it on unconverted, as it does SQL_ASCII rows).

use encoding_rs::{DecoderResult, Encoding};
use std::borrow::Cow;

/// The encoding of a PostgreSQL database, as its `server_encoding` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseEncoding {
    name: String,
    mapping: Mapping,
}

/// How bytes in the encoding become UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mapping {
    /// UTF8, and SQL_ASCII read as UTF-8.
    Utf8,
    /// ISO 8859-1: each byte is the code point of its value.
    Latin1,
    /// A single-byte encoding of the Encoding Standard, with what PostgreSQL maps otherwise.
    SingleByte {
        encoding: &'static Encoding,
        fix: Fix,
    },
    /// EUC_KR: KS X 1001 in EUC form, both bytes of a character in 0xA1-0xFE (the Encoding
    /// Standard's EUC-KR is Windows-949, which adds sequences PostgreSQL refuses).
    EucKr,
    /// No mapping: only ASCII converts.
    Unsupported,
}

/// Where PostgreSQL's mapping of a single-byte encoding differs from the Encoding Standard's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    None,
    /// ISO 8859-9 read as windows-1254: bytes 0x80-0x9F are the C1 controls U+0080-U+009F.
    IsoC1,
    /// KOI8-U (RFC 2319) read as the Encoding Standard's KOI8-U (KOI8-RU): 0xAE and 0xBE are
    /// box-drawing characters, not Belarusian letters.
    Koi8uBoxDrawing,
    /// windows-125x, windows-874: the bytes Microsoft leaves undefined (which the Encoding
    /// Standard reads as C1 controls, and `also`) have no character; PostgreSQL refuses them.
    Undefined {
        also: Option<u8>,
    },
}

/// Why content could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodingError {
    /// Bytes that are not text in the database encoding.
    #[error("it is not valid text in the database encoding {encoding} (byte 0x{byte:02X} at offset {offset})")]
    Invalid {
        encoding: String,
        offset: usize,
        byte: u8,
    },
    /// Non-ASCII text in an encoding Siphon has no mapping for.
    #[error("it holds non-ASCII text in the database encoding {encoding}, which Siphon cannot convert to UTF-8 (byte 0x{byte:02X} at offset {offset})")]
    Unsupported {
        encoding: String,
        offset: usize,
        byte: u8,
    },
}

impl Default for DatabaseEncoding {
    fn default() -> Self {
        DatabaseEncoding::from_server_encoding("UTF8")
    }
}

impl DatabaseEncoding {
    /// The encoding PostgreSQL names `name` (`server_encoding`: `UTF8`, `LATIN1`, `WIN1252`,
    /// `EUC_JP` ...). An unknown name is an encoding without a mapping.
    pub fn from_server_encoding(name: &str) -> Self {
        let mapping = mapping(&name.to_ascii_uppercase());
        DatabaseEncoding {
            name: name.to_owned(),
            mapping,
        }
    }

    /// The encoding's name, as the server reported it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether text beyond ASCII converts (UTF-8 itself included).
    pub fn is_supported(&self) -> bool {
        self.mapping != Mapping::Unsupported
    }

    /// `bytes`, text in this encoding, as UTF-8 (borrowed when it already is).
    pub fn decode<'a>(&self, bytes: &'a [u8]) -> Result<Cow<'a, str>, EncodingError> {
        if let Mapping::Utf8 = self.mapping {
            return std::str::from_utf8(bytes).map(Cow::Borrowed).map_err(|e| {
                let offset = e.valid_up_to();
                self.invalid(offset, bytes[offset])
            });
        }
        // ASCII is the same in every server encoding (and valid UTF-8).
        let ascii = bytes.iter().position(|b| !b.is_ascii());
        let Some(first) = ascii else {
            return std::str::from_utf8(bytes)
                .map(Cow::Borrowed)
                .map_err(|e| self.invalid(e.valid_up_to(), 0));
        };
        match self.mapping {
            Mapping::Latin1 => Ok(encoding_rs::mem::decode_latin1(bytes)),
            Mapping::SingleByte { encoding, fix } => {
                let decoded = self.decode_with(encoding, bytes)?;
                if fix == Fix::None {
                    return Ok(Cow::Owned(decoded));
                }
                // A single-byte encoding gives one character per byte.
                let mut fixed = String::with_capacity(decoded.len());
                for (offset, (&byte, c)) in bytes.iter().zip(decoded.chars()).enumerate() {
                    fixed.push(match (fix, byte) {
                        (Fix::IsoC1, 0x80..=0x9F) => char::from(byte),
                        (Fix::Koi8uBoxDrawing, 0xAE) => '\u{255D}',
                        (Fix::Koi8uBoxDrawing, 0xBE) => '\u{256C}',
                        (Fix::Undefined { .. }, 0x80..=0x9F) if c == char::from(byte) => {
                            return Err(self.invalid(offset, byte))
                        }
                        (
                            Fix::Undefined {
                                also: Some(undefined),
                            },
                            _,
                        ) if byte == undefined => return Err(self.invalid(offset, byte)),
                        _ => c,
                    });
                }
                Ok(Cow::Owned(fixed))
            }
            Mapping::EucKr => {
                let euc = |b: Option<&u8>| b.is_some_and(|b| (0xA1..=0xFE).contains(b));
                let mut at = first;
                while at < bytes.len() {
                    if bytes[at].is_ascii() {
                        at += 1;
                    } else if euc(bytes.get(at)) && euc(bytes.get(at + 1)) {
                        at += 2;
                    } else {
                        return Err(self.invalid(at, bytes[at]));
                    }
                }
                self.decode_with(encoding_rs::EUC_KR, bytes).map(Cow::Owned)
            }
            Mapping::Utf8 | Mapping::Unsupported => Err(EncodingError::Unsupported {
                encoding: self.name.clone(),
                offset: first,
                byte: bytes[first],
            }),
        }
    }

    /// `bytes` as UTF-8, what does not convert replaced by U+FFFD (for a dead letter).
    pub fn decode_lossy<'a>(&self, bytes: &'a [u8]) -> Cow<'a, str> {
        if let Ok(text) = self.decode(bytes) {
            return text;
        }
        match self.mapping {
            Mapping::Utf8 => String::from_utf8_lossy(bytes),
            Mapping::Latin1 => encoding_rs::mem::decode_latin1(bytes),
            Mapping::SingleByte { encoding, .. } => encoding.decode_without_bom_handling(bytes).0,
            Mapping::EucKr => encoding_rs::EUC_KR.decode_without_bom_handling(bytes).0,
            // Only ASCII is known.
            Mapping::Unsupported => Cow::Owned(
                bytes
                    .iter()
                    .map(|&b| {
                        if b.is_ascii() {
                            char::from(b)
                        } else {
                            '\u{FFFD}'
                        }
                    })
                    .collect(),
            ),
        }
    }

    fn decode_with(
        &self,
        encoding: &'static Encoding,
        bytes: &[u8],
    ) -> Result<String, EncodingError> {
        let mut decoder = encoding.new_decoder_without_bom_handling();
        let mut out = String::with_capacity(
            decoder
                .max_utf8_buffer_length_without_replacement(bytes.len())
                .unwrap_or(bytes.len()),
        );
        let mut at = 0;
        loop {
            let (result, read) =
                decoder.decode_to_string_without_replacement(&bytes[at..], &mut out, true);
            at += read;
            match result {
                DecoderResult::InputEmpty => return Ok(out),
                DecoderResult::OutputFull => out.reserve(bytes.len() - at + 16),
                DecoderResult::Malformed(length, after) => {
                    let offset = at.saturating_sub(usize::from(length) + usize::from(after));
                    return Err(self.invalid(offset, bytes.get(offset).copied().unwrap_or(0)));
                }
            }
        }
    }

    fn invalid(&self, offset: usize, byte: u8) -> EncodingError {
        EncodingError::Invalid {
            encoding: self.name.clone(),
            offset,
            byte,
        }
    }
}

/// The mapping of the server encoding `name` (upper case).
fn mapping(name: &str) -> Mapping {
    let single = |encoding, fix| Mapping::SingleByte { encoding, fix };
    match name {
        "UTF8" | "SQL_ASCII" => Mapping::Utf8,
        "LATIN1" => Mapping::Latin1,
        "LATIN2" => single(encoding_rs::ISO_8859_2, Fix::None),
        "LATIN3" => single(encoding_rs::ISO_8859_3, Fix::None),
        "LATIN4" => single(encoding_rs::ISO_8859_4, Fix::None),
        "LATIN5" => single(encoding_rs::WINDOWS_1254, Fix::IsoC1),
        "LATIN6" => single(encoding_rs::ISO_8859_10, Fix::None),
        "LATIN7" => single(encoding_rs::ISO_8859_13, Fix::None),
        "LATIN8" => single(encoding_rs::ISO_8859_14, Fix::None),
        "LATIN9" => single(encoding_rs::ISO_8859_15, Fix::None),
        "LATIN10" => single(encoding_rs::ISO_8859_16, Fix::None),
        "ISO_8859_5" => single(encoding_rs::ISO_8859_5, Fix::None),
        "ISO_8859_6" => single(encoding_rs::ISO_8859_6, Fix::None),
        "ISO_8859_7" => single(encoding_rs::ISO_8859_7, Fix::None),
        "ISO_8859_8" => single(encoding_rs::ISO_8859_8, Fix::None),
        "KOI8R" => single(encoding_rs::KOI8_R, Fix::None),
        "KOI8U" => single(encoding_rs::KOI8_U, Fix::Koi8uBoxDrawing),
        "WIN866" => single(encoding_rs::IBM866, Fix::None),
        "WIN874" => single(encoding_rs::WINDOWS_874, Fix::Undefined { also: None }),
        "WIN1250" => single(encoding_rs::WINDOWS_1250, Fix::Undefined { also: None }),
        "WIN1251" => single(encoding_rs::WINDOWS_1251, Fix::Undefined { also: None }),
        "WIN1252" => single(encoding_rs::WINDOWS_1252, Fix::Undefined { also: None }),
        "WIN1253" => single(encoding_rs::WINDOWS_1253, Fix::Undefined { also: None }),
        "WIN1254" => single(encoding_rs::WINDOWS_1254, Fix::Undefined { also: None }),
        "WIN1255" => single(
            encoding_rs::WINDOWS_1255,
            Fix::Undefined { also: Some(0xCA) },
        ),
        "WIN1256" => single(encoding_rs::WINDOWS_1256, Fix::Undefined { also: None }),
        "WIN1257" => single(encoding_rs::WINDOWS_1257, Fix::Undefined { also: None }),
        "WIN1258" => single(encoding_rs::WINDOWS_1258, Fix::Undefined { also: None }),
        "EUC_KR" => Mapping::EucKr,
        // EUC_JP and EUC_CN: the Encoding Standard's EUC-JP and GBK give other characters
        // than PostgreSQL for some sequences. EUC_JIS_2004, EUC_TW, MULE_INTERNAL: none.
        _ => Mapping::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_is_iso_8859_1() {
        let latin1 = DatabaseEncoding::from_server_encoding("LATIN1");
        assert_eq!(
            latin1.decode(b"caf\xe9 \xfcber \x85").unwrap(),
            "café über \u{85}",
            "0x85 is NEL, not windows-1252's ellipsis"
        );
        assert!(matches!(
            latin1.decode(b"plain"),
            Ok(Cow::Borrowed("plain"))
        ));
    }

    #[test]
    fn utf8_content_must_be_valid() {
        let utf8 = DatabaseEncoding::default();
        assert_eq!(utf8.decode("zürich".as_bytes()).unwrap(), "zürich");
        let err = utf8.decode(b"{\"a\":\"\xff\"}").unwrap_err();
        assert_eq!(
            err,
            EncodingError::Invalid {
                encoding: "UTF8".into(),
                offset: 6,
                byte: 0xFF
            }
        );
        assert!(
            err.to_string()
                .contains("not valid text in the database encoding UTF8"),
            "{err}"
        );
        let sql_ascii = DatabaseEncoding::from_server_encoding("SQL_ASCII");
        assert_eq!(sql_ascii.decode("zürich".as_bytes()).unwrap(), "zürich");
        assert!(sql_ascii.decode(b"\xe9").is_err());
    }

    #[test]
    fn corrected_mappings() {
        let latin5 = DatabaseEncoding::from_server_encoding("LATIN5");
        assert_eq!(latin5.decode(b"\x80\xd0\xfd").unwrap(), "\u{80}Ğı");
        let koi8u = DatabaseEncoding::from_server_encoding("KOI8U");
        assert_eq!(koi8u.decode(b"\xa4\xae\xbe").unwrap(), "є╝╬");
        let win1252 = DatabaseEncoding::from_server_encoding("WIN1252");
        assert_eq!(win1252.decode(b"\x80\x85").unwrap(), "€…");
        assert_eq!(
            win1252.decode(b"a\x81").unwrap_err(),
            EncodingError::Invalid {
                encoding: "WIN1252".into(),
                offset: 1,
                byte: 0x81
            },
            "undefined in windows-1252"
        );
    }

    #[test]
    fn multi_byte_sequences_are_checked() {
        let euc_kr = DatabaseEncoding::from_server_encoding("EUC_KR");
        assert_eq!(euc_kr.decode(b"\xc7\xd1\xb1\xb9").unwrap(), "한국");
        assert_eq!(
            euc_kr.decode(b"ab\xc7").unwrap_err(),
            EncodingError::Invalid {
                encoding: "EUC_KR".into(),
                offset: 2,
                byte: 0xC7
            }
        );
        // Windows-949's extension, which PostgreSQL's EUC_KR refuses.
        assert!(euc_kr.decode(b"\x81\x41").is_err());
        assert_eq!(euc_kr.decode_lossy(b"ab\xc7"), "ab\u{FFFD}");
    }

    #[test]
    fn an_encoding_without_mapping_converts_ascii_only() {
        let euc_tw = DatabaseEncoding::from_server_encoding("EUC_TW");
        assert!(!euc_tw.is_supported());
        assert_eq!(euc_tw.decode(b"{\"id\":1}").unwrap(), "{\"id\":1}");
        let err = euc_tw.decode(b"ab\xc4\xa1").unwrap_err();
        assert_eq!(
            err,
            EncodingError::Unsupported {
                encoding: "EUC_TW".into(),
                offset: 2,
                byte: 0xC4
            }
        );
        assert!(err.to_string().contains("EUC_TW"), "{err}");
    }
}
