//! W3C Trace Context (`traceparent`, `tracestate`) read from outbox columns.
//!
//! An application writes the `traceparent` of its current span into a column of the outbox
//! row; the record then carries it as the `traceparent` header (and `tracestate` from a second
//! column), so a consumer continues the same trace across the outbox.
//!
//! Validation follows the W3C Trace Context Level 1 recommendation:
//! - `traceparent` is `version-traceid-parentid-flags` in lower-case hex; version `ff` is
//!   invalid; version `00` is exactly 55 characters; a higher version may carry more fields
//!   after a `-`; the trace id and parent id are not all zeros.
//! - `tracestate` is at most 32 comma-separated `key=value` members of printable ASCII, 512
//!   characters in all; empty members are allowed.
//!
//! # Invariants
//! - A value that is not valid is never written; with an invalid `traceparent` the
//!   `tracestate` is dropped too, as the recommendation requires.
//! - Reading never fails: an absent (NULL or empty) value gives [`TraceRead::Absent`], a
//!   malformed one [`TraceRead::Malformed`].

/// `[trace]`: the columns that hold the W3C trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceOptions {
    /// The column holding the `traceparent`.
    pub column: String,
    /// The column holding the `tracestate`, if any.
    pub state_column: Option<String>,
}

/// The header that carries the trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries the vendor trace state.
pub const TRACESTATE: &str = "tracestate";

/// What a row's trace columns gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceRead<'a> {
    /// No trace context: the column is NULL or empty.
    Absent,
    /// A valid context; `state` is `None` when absent or malformed (a malformed state alone
    /// is dropped without dropping the parent).
    Valid {
        parent: &'a str,
        state: Option<&'a str>,
        /// The state column held something that is not a valid `tracestate`.
        state_malformed: bool,
    },
    /// The parent is malformed: neither value is written.
    Malformed,
}

/// Classifies the values of the parent and state columns.
pub fn read<'a>(parent: Option<&'a str>, state: Option<&'a str>) -> TraceRead<'a> {
    let Some(parent) = parent.filter(|p| !p.is_empty()) else {
        return TraceRead::Absent;
    };
    if !is_valid_traceparent(parent) {
        return TraceRead::Malformed;
    }
    let state = state.filter(|s| !s.is_empty());
    let state_ok = state.is_none_or(is_valid_tracestate);
    TraceRead::Valid {
        parent,
        state: state.filter(|_| state_ok),
        state_malformed: !state_ok,
    }
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `value` is a `traceparent` a W3C-compliant tracer accepts.
pub fn is_valid_traceparent(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.len() < 55 || !value.is_ascii() {
        return false;
    }
    let (version, trace_id, parent_id, flags) =
        (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = bytes[2] == b'-' && bytes[35] == b'-' && bytes[52] == b'-';
    let fields_ok = dashes
        && is_lower_hex(version)
        && is_lower_hex(trace_id)
        && is_lower_hex(parent_id)
        && is_lower_hex(flags)
        && version != "ff"
        && trace_id.bytes().any(|b| b != b'0')
        && parent_id.bytes().any(|b| b != b'0');
    if !fields_ok {
        return false;
    }
    match version {
        "00" => bytes.len() == 55,
        // A later version may append fields, after a dash.
        _ => bytes.len() == 55 || bytes[55] == b'-',
    }
}

/// Whether `value` is a `tracestate` list a W3C-compliant tracer accepts.
pub fn is_valid_tracestate(value: &str) -> bool {
    if value.len() > 512 {
        return false;
    }
    let mut members = 0;
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        members += 1;
        let Some((key, val)) = member.split_once('=') else {
            return false;
        };
        if !is_valid_key(key) || !is_valid_member_value(val) {
            return false;
        }
    }
    members <= 32
}

/// `lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")`, optionally as
/// `tenant@system` (`system` at most 14 characters).
fn is_valid_key(key: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b);
    let part_ok = |part: &str, max: usize, first_alpha: bool| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= max
            && (!first_alpha || bytes[0].is_ascii_lowercase())
            && (first_alpha || bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
            && bytes.iter().all(|&b| allowed(b))
    };
    match key.split_once('@') {
        None => part_ok(key, 256, true),
        Some((tenant, system)) => part_ok(tenant, 241, false) && part_ok(system, 14, true),
    }
}

/// `0*255(chr) nblk-chr`: printable ASCII except `,` and `=`, not ending in a space.
fn is_valid_member_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_example_is_valid() {
        assert!(is_valid_traceparent(PARENT));
        assert!(is_valid_tracestate(
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
        ));
        assert!(is_valid_tracestate("fw529a3039@dt=abc, rojo=1"));
    }

    #[test]
    fn malformed_parents() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "not a trace parent at all, but long enough to be looked at",
        ] {
            assert!(!is_valid_traceparent(bad), "{bad}");
        }
        // A later version may carry more fields.
        assert!(is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        assert!(!is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra"
        ));
    }

    #[test]
    fn malformed_states() {
        for bad in ["novalue", "Upper=1", "k=v,=x", "k=a,b", "k=a=b"] {
            assert!(!is_valid_tracestate(bad), "{bad}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!is_valid_tracestate(&many.join(",")));
        assert!(is_valid_tracestate(&many[..32].join(",")));
    }

    #[test]
    fn reading() {
        assert_eq!(read(None, Some("a=b")), TraceRead::Absent);
        assert_eq!(read(Some(""), None), TraceRead::Absent);
        assert_eq!(read(Some("00-xyz"), Some("a=b")), TraceRead::Malformed);
        assert_eq!(
            read(Some(PARENT), Some("a=b")),
            TraceRead::Valid {
                parent: PARENT,
                state: Some("a=b"),
                state_malformed: false
            }
        );
        assert_eq!(
            read(Some(PARENT), Some("A")),
            TraceRead::Valid {
                parent: PARENT,
                state: None,
                state_malformed: true
            }
        );
    }
}
