//! CloudEvents 1.0 in the Kafka protocol binding: attributes as `ce_*` headers (binary mode)
//! or the whole event as an `application/cloudevents+json` value (structured mode).
//!
//! The attributes of an outbox row:
//! - `specversion` `1.0`; `id` the event id; `source` the configured URI-reference; `type`
//!   the event type column; `subject` the aggregate id (left out when NULL); `time` the event
//!   time in RFC 3339 (left out when unknown);
//! - `datacontenttype` the media type of the record value as the value format writes it;
//! - `traceparent` / `tracestate` (the distributed tracing extension) when the row carries a
//!   valid trace context.
//!
//! In structured mode the value becomes `data` when it is JSON, `data` as a JSON string when
//! it is text, and `data_base64` when it is binary (the binary and protobuf formats); a NULL
//! value leaves both out.
//!
//! # Invariants
//! - Binary mode leaves the record value as the value format wrote it and only adds headers.
//! - Structured mode writes one JSON object, UTF-8, with the attributes in a fixed order, and
//!   the `content-type` header `application/cloudevents+json; charset=UTF-8`.

use crate::format::json::write_json_string;
use bytes::Bytes;
use siphon_record::Header;
use std::sync::Arc;

/// `cloudevents.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudEventsMode {
    /// Attributes in `ce_*` headers, the data as the record value.
    Binary,
    /// The whole event as a JSON value.
    Structured,
}

/// `[cloudevents]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEventsOptions {
    /// Binary or structured content mode.
    pub mode: CloudEventsMode,
    /// The `source` attribute: a non-empty URI-reference.
    pub source: String,
}

/// The content type of a structured-mode record.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";

/// How the record value goes into a structured event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataForm {
    /// The value is a JSON document: embedded as `data`.
    Json,
    /// The value is UTF-8 text: `data` as a JSON string.
    Text,
    /// The value is binary: `data_base64`.
    Binary,
}

/// The attributes of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub id: &'a str,
    pub source: &'a str,
    pub event_type: &'a str,
    pub subject: Option<&'a str>,
    /// RFC 3339.
    pub time: Option<String>,
    pub data_content_type: &'a str,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

impl Attributes<'_> {
    /// The context attributes, in the order they are written, `datacontenttype` excluded.
    fn context(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("specversion", "1.0"),
            ("id", self.id),
            ("source", self.source),
            ("type", self.event_type),
        ];
        if let Some(subject) = self.subject {
            out.push(("subject", subject));
        }
        if let Some(time) = &self.time {
            out.push(("time", time.as_str()));
        }
        if let Some(parent) = self.traceparent {
            out.push(("traceparent", parent));
        }
        if let Some(state) = self.tracestate {
            out.push(("tracestate", state));
        }
        out
    }
}

fn header(name: &str, value: &str) -> Header {
    Header {
        name: Arc::from(name),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
    }
}

/// Binary mode: the `ce_*` headers and `content-type`.
pub fn binary_headers(attributes: &Attributes<'_>) -> Vec<Header> {
    let mut headers: Vec<Header> = attributes
        .context()
        .into_iter()
        .map(|(name, value)| header(&format!("ce_{name}"), value))
        .collect();
    headers.push(header("content-type", attributes.data_content_type));
    headers
}

/// Structured mode: the event as a JSON object, and its `content-type` header.
pub fn structured(
    attributes: &Attributes<'_>,
    data: Option<&[u8]>,
    form: DataForm,
) -> (Bytes, Header) {
    let mut out = Vec::with_capacity(256 + data.map_or(0, |d| d.len() * 4 / 3));
    out.push(b'{');
    let mut first = true;
    let mut member = |out: &mut Vec<u8>, name: &str| {
        if !first {
            out.push(b',');
        }
        first = false;
        write_json_string(out, name);
        out.push(b':');
    };
    for (name, value) in attributes.context() {
        member(&mut out, name);
        write_json_string(&mut out, value);
    }
    if let Some(data) = data {
        member(&mut out, "datacontenttype");
        write_json_string(&mut out, attributes.data_content_type);
        match form {
            DataForm::Json => {
                member(&mut out, "data");
                out.extend_from_slice(data);
            }
            DataForm::Text => {
                member(&mut out, "data");
                // Text values come from columns routing has checked to be UTF-8, so the
                // lossy conversion never replaces anything.
                write_json_string(&mut out, &String::from_utf8_lossy(data));
            }
            DataForm::Binary => {
                member(&mut out, "data_base64");
                write_base64_string(&mut out, data);
            }
        }
    }
    out.push(b'}');
    (
        Bytes::from(out),
        header("content-type", STRUCTURED_CONTENT_TYPE),
    )
}

fn write_base64_string(out: &mut Vec<u8>, data: &[u8]) {
    out.push(b'"');
    crate::format::connect::base64(out, data);
    out.push(b'"');
}

/// Whether `source` is usable as the `source` attribute: a non-empty URI-reference (RFC 3986
/// characters only, `%` followed by two hex digits).
pub fn is_uri_reference(source: &str) -> bool {
    const OTHER: &[u8] = b"-._~:/?#[]@!$&'()*+,;=";
    let bytes = source.as_bytes();
    if bytes.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        if !(b.is_ascii_alphanumeric() || OTHER.contains(&b)) {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes() -> Attributes<'static> {
        Attributes {
            id: "e1",
            source: "/siphon/app/slot",
            event_type: "OrderCreated",
            subject: Some("order-1"),
            time: Some("2024-05-01T12:34:56.123Z".to_owned()),
            data_content_type: "application/json",
            traceparent: None,
            tracestate: None,
        }
    }

    fn shown(headers: &[Header]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8_lossy(h.value.as_deref().unwrap_or_default()).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn binary_mode_headers() {
        let mut a = attributes();
        a.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        a.tracestate = Some("rojo=1");
        let expected: Vec<(String, String)> = [
            ("ce_specversion", "1.0"),
            ("ce_id", "e1"),
            ("ce_source", "/siphon/app/slot"),
            ("ce_type", "OrderCreated"),
            ("ce_subject", "order-1"),
            ("ce_time", "2024-05-01T12:34:56.123Z"),
            (
                "ce_traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("ce_tracestate", "rojo=1"),
            ("content-type", "application/json"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(shown(&binary_headers(&a)), expected);
    }

    #[test]
    fn structured_json_data_is_embedded() {
        let (value, content_type) = structured(&attributes(), Some(br#"{"a":1}"#), DataForm::Json);
        assert_eq!(
            value.as_ref(),
            br#"{"specversion":"1.0","id":"e1","source":"/siphon/app/slot","type":"OrderCreated","subject":"order-1","time":"2024-05-01T12:34:56.123Z","datacontenttype":"application/json","data":{"a":1}}"#
        );
        assert_eq!(
            content_type.value.as_deref(),
            Some(STRUCTURED_CONTENT_TYPE.as_bytes())
        );
    }

    #[test]
    fn structured_text_and_binary_data() {
        let mut a = attributes();
        a.subject = None;
        a.time = None;
        a.data_content_type = "text/plain; charset=utf-8";
        let (value, _) = structured(&a, Some(b"say \"hi\""), DataForm::Text);
        assert_eq!(
            value.as_ref(),
            br#"{"specversion":"1.0","id":"e1","source":"/siphon/app/slot","type":"OrderCreated","datacontenttype":"text/plain; charset=utf-8","data":"say \"hi\""}"#
        );
        a.data_content_type = "application/protobuf";
        let (value, _) = structured(&a, Some(&[0, 1, 2, 255]), DataForm::Binary);
        assert_eq!(
            value.as_ref(),
            br#"{"specversion":"1.0","id":"e1","source":"/siphon/app/slot","type":"OrderCreated","datacontenttype":"application/protobuf","data_base64":"AAEC/w=="}"#
        );
        let (value, _) = structured(&a, None, DataForm::Binary);
        assert_eq!(
            value.as_ref(),
            br#"{"specversion":"1.0","id":"e1","source":"/siphon/app/slot","type":"OrderCreated"}"#
        );
    }

    #[test]
    fn uri_references() {
        for good in [
            "/siphon/app/siphon",
            "urn:event:from:orders",
            "https://example.com/orders?x=1#f",
            "a%20b",
        ] {
            assert!(is_uri_reference(good), "{good}");
        }
        for bad in ["", "with space", "a%2", "a%zz", "é", "tab\there"] {
            assert!(!is_uri_reference(bad), "{bad}");
        }
    }
}
