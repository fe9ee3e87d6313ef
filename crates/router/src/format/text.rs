//! Column text checked as UTF-8, with the common all-ASCII case first.
//!
//! Every text column the router reads is checked once per row (`route::cell`). Most are
//! short ASCII identifiers (aggregate types and ids, UUIDs), for which the standard library's
//! check is a byte loop with alignment handling; an ASCII test is a few word-wide operations.
//! Longer text (the payload) and short non-ASCII text are checked by simdutf8 (64 bytes at a
//! time with AVX2 or SSE4.2, chosen at run time; the standard library's check below 64
//! bytes).
//!
//! # Invariants
//! - [`utf8`] returns the text exactly when `std::str::from_utf8` does (a property test
//!   compares them).

// The one `unsafe` here: ASCII bytes taken as `str` without a second check.
#![allow(unsafe_code)]

/// Below this length the ASCII test comes first; from it on simdutf8 alone is faster.
const SHORT: usize = 64;

/// `bytes` as `str`, or `None` when they are not valid UTF-8.
#[inline]
pub fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.len() < SHORT && bytes.is_ascii() {
        // SAFETY: every byte is below 0x80, and a sequence of ASCII bytes is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    simdutf8::basic::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ascii_other_text_and_invalid_bytes() {
        assert_eq!(utf8(b""), Some(""));
        assert_eq!(utf8(b"BenchOrder"), Some("BenchOrder"));
        assert_eq!(utf8("Zürich 日本 😀".as_bytes()), Some("Zürich 日本 😀"));
        let long = "é".repeat(100);
        assert_eq!(utf8(long.as_bytes()), Some(long.as_str()));
        for bad in [&b"\xff"[..], b"a\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"] {
            assert_eq!(utf8(bad), None, "{bad:?}");
        }
        let mut cut = "x".repeat(70).into_bytes();
        cut.push(0xE2);
        assert_eq!(utf8(&cut), None);
    }

    proptest! {
        #[test]
        fn agrees_with_the_standard_library(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            prop_assert_eq!(utf8(&bytes), std::str::from_utf8(&bytes).ok());
        }

        #[test]
        fn agrees_on_text(text in any::<String>(), cut in 0usize..64) {
            let bytes = text.as_bytes();
            let cut = &bytes[..bytes.len().saturating_sub(cut)];
            prop_assert_eq!(utf8(cut), std::str::from_utf8(cut).ok());
        }
    }
}
