//! Plain HTTP/1.1 requests to Siphon's metrics and health endpoint, and to the schema
//! registry, from outside.
//!
//! # Invariants
//!
//! - One connection per request, to 127.0.0.1 only, closed by the server after its answer
//!   (`Connection: close`); a read waits at most 10 s.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use anyhow::{Context as _, Result};

/// One GET of `path` on 127.0.0.1:`port`: (status code, body).
pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    request(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
}

/// One PUT of the JSON `body` to `path` on 127.0.0.1:`port`, as the schema registry's API
/// takes it: (status code, body).
pub fn put_json(port: u16, path: &str, body: &str) -> Result<(u16, String)> {
    request(
        port,
        &format!(
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/vnd.schemaregistry.v1+json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Sends `raw` (a whole request) and reads the answer: (status code, body).
fn request(port: u16, raw: &str) -> Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(raw.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of the series `series` (its name with labels, exactly as exposed) in a
/// Prometheus text exposition.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
