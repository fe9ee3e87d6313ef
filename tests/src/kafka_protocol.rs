//! Just enough of the Kafka wire protocol to answer Produce requests with a chosen error:
//! request framing and headers, Produce requests (v3..=v12, flexible from v9), and Produce
//! responses of the same versions; and to point clients at a proxy: the broker ports in
//! Metadata, FindCoordinator, Produce and Fetch responses.
//!
//! Produce v3 is the first version carrying record batches (message format v2), which every
//! client the tests use speaks; librdkafka sends at most v10, one partition per request, and
//! uses v10 (flexible) against Tansu 0.6 (the Kafka-mode proxy records the versions it sees:
//! `ThrottlingProxy::produce_versions`). v13 (topic ids instead of names) is not parsed.
//!
//! # Invariants
//!
//! - Parsing never panics on malformed input: it returns an error (truncated, negative
//!   lengths, unsupported versions).
//! - [`encode_produce_response`] writes every field of the version it is given (tagged fields
//!   empty), with the 4-byte size prefix, so a client can read it as the broker's answer.

use anyhow::{bail, ensure, Context as _, Result};

/// The Produce API key.
pub const PRODUCE: i16 = 0;
/// Produce versions understood here.
pub const PRODUCE_VERSIONS: std::ops::RangeInclusive<i16> = 3..=12;
/// Produce versions from which requests and responses are "flexible" (compact encodings and
/// tagged fields).
const FIRST_FLEXIBLE_PRODUCE: i16 = 9;

/// The fields of a request header every version shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

/// One partition's records in a Produce request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionData {
    pub partition: i32,
    /// The record batches as sent (empty for a null record set).
    pub records: Vec<u8>,
}

/// One topic of a Produce request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicData {
    pub name: String,
    pub partitions: Vec<PartitionData>,
}

/// A parsed Produce request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequest {
    pub header: RequestHeader,
    pub transactional_id: Option<String>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<TopicData>,
}

/// One partition's answer in a Produce response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResponse {
    pub partition: i32,
    pub error_code: i16,
    /// Sent from v8 on.
    pub error_message: Option<String>,
}

/// One topic's answers in a Produce response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicResponse {
    pub name: String,
    pub partitions: Vec<PartitionResponse>,
}

/// A cursor over a request or response body.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .with_context(|| {
                format!(
                    "truncated: {n} bytes wanted at {} of {}",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn i16(&mut self) -> Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into()?))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into()?))
    }

    fn uvarint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        bail!("unsigned varint longer than 64 bits")
    }

    /// A length: i16/i32 (-1 = null) or, flexible, uvarint N+1 (0 = null).
    fn length(&mut self, flexible: bool, wide: bool) -> Result<Option<usize>> {
        let n: i64 = if flexible {
            self.uvarint()? as i64 - 1
        } else if wide {
            i64::from(self.i32()?)
        } else {
            i64::from(self.i16()?)
        };
        match n {
            -1 => Ok(None),
            n if n < 0 => bail!("negative length {n}"),
            n => Ok(Some(usize::try_from(n)?)),
        }
    }

    fn nullable_string(&mut self, flexible: bool) -> Result<Option<String>> {
        match self.length(flexible, false)? {
            None => Ok(None),
            Some(n) => Ok(Some(String::from_utf8(self.take(n)?.to_vec())?)),
        }
    }

    fn string(&mut self, flexible: bool) -> Result<String> {
        self.nullable_string(flexible)?
            .context("null where a string is required")
    }

    fn array_len(&mut self, flexible: bool) -> Result<usize> {
        Ok(self.length(flexible, true)?.unwrap_or(0))
    }

    fn tagged_fields(&mut self) -> Result<()> {
        for _ in 0..self.uvarint()? {
            let _tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?)?;
            self.take(size)?;
        }
        Ok(())
    }
}

/// Builds a request or response body.
#[derive(Default)]
struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn i16(&mut self, v: i16) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    fn i32(&mut self, v: i32) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    fn i64(&mut self, v: i64) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    fn uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    fn length(&mut self, len: Option<usize>, flexible: bool, wide: bool) {
        match (flexible, wide) {
            (true, _) => self.uvarint(len.map_or(0, |n| n as u64 + 1)),
            (false, true) => self.i32(len.map_or(-1, |n| n as i32)),
            (false, false) => self.i16(len.map_or(-1, |n| n as i16)),
        }
    }

    fn nullable_string(&mut self, s: Option<&str>, flexible: bool) {
        self.length(s.map(str::len), flexible, false);
        if let Some(s) = s {
            self.out.extend_from_slice(s.as_bytes());
        }
    }

    fn array_len(&mut self, n: usize, flexible: bool) {
        self.length(Some(n), flexible, true);
    }

    fn bytes(&mut self, b: &[u8], flexible: bool) {
        self.length(Some(b.len()), flexible, true);
        self.out.extend_from_slice(b);
    }

    fn empty_tagged_fields(&mut self) {
        self.uvarint(0);
    }

    /// The body with its 4-byte size prefix.
    fn framed(self) -> Vec<u8> {
        let mut framed = (self.out.len() as i32).to_be_bytes().to_vec();
        framed.extend(self.out);
        framed
    }
}

fn produce_is_flexible(version: i16) -> bool {
    version >= FIRST_FLEXIBLE_PRODUCE
}

/// The header of a request `frame` (the bytes after the 4-byte size).
pub fn request_header(frame: &[u8]) -> Result<RequestHeader> {
    let mut r = Reader::new(frame);
    Ok(RequestHeader {
        api_key: r.i16()?,
        api_version: r.i16()?,
        correlation_id: r.i32()?,
    })
}

/// Parses a Produce request `frame` (the bytes after the 4-byte size).
pub fn parse_produce_request(frame: &[u8]) -> Result<ProduceRequest> {
    let header = request_header(frame)?;
    ensure!(
        header.api_key == PRODUCE,
        "API key {} is not Produce",
        header.api_key
    );
    ensure!(
        PRODUCE_VERSIONS.contains(&header.api_version),
        "Produce v{} is not supported here",
        header.api_version
    );
    let flexible = produce_is_flexible(header.api_version);
    let mut r = Reader::new(frame);
    r.take(8)?;
    // The client id is a (non-compact) nullable string in every header version.
    r.nullable_string(false)?;
    if flexible {
        r.tagged_fields()?;
    }
    let transactional_id = r.nullable_string(flexible)?;
    let acks = r.i16()?;
    let timeout_ms = r.i32()?;
    let mut topics = Vec::new();
    for _ in 0..r.array_len(flexible)? {
        let name = r.string(flexible)?;
        let mut partitions = Vec::new();
        for _ in 0..r.array_len(flexible)? {
            let partition = r.i32()?;
            let records = match r.length(flexible, true)? {
                None => Vec::new(),
                Some(n) => r.take(n)?.to_vec(),
            };
            if flexible {
                r.tagged_fields()?;
            }
            partitions.push(PartitionData { partition, records });
        }
        if flexible {
            r.tagged_fields()?;
        }
        topics.push(TopicData { name, partitions });
    }
    if flexible {
        r.tagged_fields()?;
    }
    Ok(ProduceRequest {
        header,
        transactional_id,
        acks,
        timeout_ms,
        topics,
    })
}

/// Encodes a Produce request (for tests of the parser and of the proxy), with its size prefix.
pub fn encode_produce_request(request: &ProduceRequest, client_id: Option<&str>) -> Vec<u8> {
    let version = request.header.api_version;
    let flexible = produce_is_flexible(version);
    let mut w = Writer::default();
    w.i16(request.header.api_key);
    w.i16(version);
    w.i32(request.header.correlation_id);
    w.nullable_string(client_id, false);
    if flexible {
        w.empty_tagged_fields();
    }
    w.nullable_string(request.transactional_id.as_deref(), flexible);
    w.i16(request.acks);
    w.i32(request.timeout_ms);
    w.array_len(request.topics.len(), flexible);
    for topic in &request.topics {
        w.nullable_string(Some(&topic.name), flexible);
        w.array_len(topic.partitions.len(), flexible);
        for p in &topic.partitions {
            w.i32(p.partition);
            w.bytes(&p.records, flexible);
            if flexible {
                w.empty_tagged_fields();
            }
        }
        if flexible {
            w.empty_tagged_fields();
        }
    }
    if flexible {
        w.empty_tagged_fields();
    }
    w.framed()
}

/// A Produce response of `version` to request `correlation_id`, with its size prefix: each
/// partition answered with its error code, base offset -1.
pub fn encode_produce_response(
    version: i16,
    correlation_id: i32,
    topics: &[TopicResponse],
) -> Vec<u8> {
    let flexible = produce_is_flexible(version);
    let mut w = Writer::default();
    w.i32(correlation_id);
    if flexible {
        // Response header v1.
        w.empty_tagged_fields();
    }
    w.array_len(topics.len(), flexible);
    for topic in topics {
        w.nullable_string(Some(&topic.name), flexible);
        w.array_len(topic.partitions.len(), flexible);
        for p in &topic.partitions {
            w.i32(p.partition);
            w.i16(p.error_code);
            w.i64(-1); // base_offset
            w.i64(-1); // log_append_time_ms (v2+)
            if version >= 5 {
                w.i64(-1); // log_start_offset
            }
            if version >= 8 {
                w.array_len(0, flexible); // record_errors
                w.nullable_string(p.error_message.as_deref(), flexible);
            }
            if flexible {
                w.empty_tagged_fields();
            }
        }
        if flexible {
            w.empty_tagged_fields();
        }
    }
    w.i32(0); // throttle_time_ms
    if flexible {
        w.empty_tagged_fields();
    }
    w.framed()
}

/// Parses a Produce response `frame` of `version` (the bytes after the 4-byte size): the
/// correlation id and each partition's error.
pub fn parse_produce_response(version: i16, frame: &[u8]) -> Result<(i32, Vec<TopicResponse>)> {
    ensure!(
        PRODUCE_VERSIONS.contains(&version),
        "Produce v{version} is not supported here"
    );
    let flexible = produce_is_flexible(version);
    let mut r = Reader::new(frame);
    let correlation_id = r.i32()?;
    if flexible {
        r.tagged_fields()?;
    }
    let mut topics = Vec::new();
    for _ in 0..r.array_len(flexible)? {
        let name = r.string(flexible)?;
        let mut partitions = Vec::new();
        for _ in 0..r.array_len(flexible)? {
            let partition = r.i32()?;
            let error_code = r.i16()?;
            r.i64()?;
            r.i64()?;
            if version >= 5 {
                r.i64()?;
            }
            let mut error_message = None;
            if version >= 8 {
                for _ in 0..r.array_len(flexible)? {
                    r.i32()?;
                    r.nullable_string(flexible)?;
                    if flexible {
                        r.tagged_fields()?;
                    }
                }
                error_message = r.nullable_string(flexible)?;
            }
            if flexible {
                r.tagged_fields()?;
            }
            partitions.push(PartitionResponse {
                partition,
                error_code,
                error_message,
            });
        }
        if flexible {
            r.tagged_fields()?;
        }
        topics.push(TopicResponse { name, partitions });
    }
    r.i32()?;
    if flexible {
        r.tagged_fields()?;
    }
    ensure!(
        r.at == frame.len(),
        "{} bytes left after the response",
        frame.len() - r.at
    );
    Ok((correlation_id, topics))
}

/// The Fetch API key.
pub const FETCH: i16 = 1;
/// The Metadata API key.
pub const METADATA: i16 = 3;
/// The FindCoordinator API key.
pub const FIND_COORDINATOR: i16 = 10;
/// The EndTxn API key: a transactional producer's commit or abort, answered by the
/// transaction coordinator.
pub const END_TXN: i16 = 26;
/// The SaslHandshake API key: the first request of a SASL login (and of each login again).
pub const SASL_HANDSHAKE: i16 = 17;
/// The InitProducerId API key: a transactional producer registering with its transaction
/// coordinator.
pub const INIT_PRODUCER_ID: i16 = 22;

/// Whether an EndTxn request `frame` (the bytes after the 4-byte size) commits (`true`) or
/// aborts its transaction (flexible from v3; the request header's client id is never compact).
pub fn end_txn_commits(frame: &[u8]) -> Result<bool> {
    let mut r = Reader::new(frame);
    let api_key = r.i16()?;
    ensure!(
        api_key == END_TXN,
        "not an EndTxn request: API key {api_key}"
    );
    let version = r.i16()?;
    r.i32()?; // correlation id
    r.nullable_string(false)?; // client id
    let flexible = version >= 3;
    if flexible {
        r.tagged_fields()?;
    }
    r.string(flexible)?; // transactional id
    r.i64()?; // producer id
    r.i16()?; // producer epoch
    Ok(r.take(1)?[0] != 0)
}

/// The offset, in a response `body` (after the 4-byte size), of the top-level error code of an
/// EndTxn (flexible from v3) or InitProducerId (flexible from v2) response of `api_version`,
/// both of which begin with the throttle time and the error code, or of a SaslHandshake
/// response (v0-v1, never flexible), which begins with the error code.
pub fn top_level_error_offset(api_key: i16, api_version: i16, body: &[u8]) -> Result<usize> {
    let (flexible, throttled) = match api_key {
        END_TXN => (api_version >= 3, true),
        INIT_PRODUCER_ID => (api_version >= 2, true),
        SASL_HANDSHAKE => (false, false),
        other => anyhow::bail!("no top-level error code known for API key {other}"),
    };
    let mut r = Reader::new(body);
    r.i32()?; // correlation id
    if flexible {
        r.tagged_fields()?;
    }
    if throttled {
        r.i32()?; // throttle time
    }
    let at = r.at;
    r.i16()?;
    Ok(at)
}

/// Replaces, in place, the top-level error code of an EndTxn, InitProducerId or SaslHandshake
/// response `frame`
/// (size prefix included) with `code`; returns the code the broker had written.
pub fn replace_error_code(
    api_key: i16,
    api_version: i16,
    frame: &mut [u8],
    code: i16,
) -> Result<i16> {
    ensure!(frame.len() >= 4, "frame shorter than its size prefix");
    let at = 4 + top_level_error_offset(api_key, api_version, &frame[4..])?;
    let field = &mut frame[at..at + 2];
    let was = i16::from_be_bytes([field[0], field[1]]);
    field.copy_from_slice(&code.to_be_bytes());
    Ok(was)
}

/// The offsets of the ports in a `NodeEndpoints` tagged field (KIP-951: the brokers a Produce
/// or Fetch answer names as new leaders), read from the top-level tagged fields at `r`.
fn node_endpoint_port_offsets(r: &mut Reader<'_>, offsets: &mut Vec<usize>) -> Result<()> {
    for _ in 0..r.uvarint()? {
        let tag = r.uvarint()?;
        let size = usize::try_from(r.uvarint()?)?;
        let end = r.at + size;
        if tag == 0 {
            for _ in 0..r.array_len(true)? {
                r.i32()?; // node id
                r.string(true)?;
                offsets.push(r.at);
                r.i32()?;
                r.nullable_string(true)?; // rack
                r.tagged_fields()?;
            }
            ensure!(r.at == end, "NodeEndpoints field of {size} bytes misread");
        } else {
            r.take(size)?;
        }
    }
    Ok(())
}

/// The offsets, in a response `body` (after the 4-byte size), of the broker ports a Metadata
/// (v0-v13), FindCoordinator (v0-v6), Produce (v10-v12) or Fetch (v16-v17) response names;
/// empty for any other API or version.
pub fn broker_port_offsets(api_key: i16, api_version: i16, body: &[u8]) -> Result<Vec<usize>> {
    let mut r = Reader::new(body);
    let mut offsets = Vec::new();
    match api_key {
        PRODUCE if (10..=12).contains(&api_version) => {
            r.i32()?; // correlation id
            r.tagged_fields()?;
            for _ in 0..r.array_len(true)? {
                r.string(true)?;
                for _ in 0..r.array_len(true)? {
                    r.i32()?; // partition
                    r.i16()?; // error code
                    r.i64()?; // base offset
                    r.i64()?; // log append time
                    r.i64()?; // log start offset
                    for _ in 0..r.array_len(true)? {
                        r.i32()?;
                        r.nullable_string(true)?;
                        r.tagged_fields()?;
                    }
                    r.nullable_string(true)?; // error message
                    r.tagged_fields()?;
                }
                r.tagged_fields()?;
            }
            r.i32()?; // throttle time
            node_endpoint_port_offsets(&mut r, &mut offsets)?;
        }
        FETCH if (16..=17).contains(&api_version) => {
            r.i32()?; // correlation id
            r.tagged_fields()?;
            r.i32()?; // throttle time
            r.i16()?; // error code
            r.i32()?; // session id
            for _ in 0..r.array_len(true)? {
                r.take(16)?; // topic id
                for _ in 0..r.array_len(true)? {
                    r.i32()?; // partition
                    r.i16()?; // error code
                    r.i64()?; // high watermark
                    r.i64()?; // last stable offset
                    r.i64()?; // log start offset
                    if let Some(n) = r.length(true, true)? {
                        for _ in 0..n {
                            r.i64()?;
                            r.i64()?;
                            r.tagged_fields()?;
                        }
                    }
                    r.i32()?; // preferred read replica
                    if let Some(n) = r.length(true, true)? {
                        r.take(n)?; // records
                    }
                    r.tagged_fields()?;
                }
                r.tagged_fields()?;
            }
            node_endpoint_port_offsets(&mut r, &mut offsets)?;
        }
        METADATA => {
            let flexible = api_version >= 9;
            r.i32()?; // correlation id
            if flexible {
                r.tagged_fields()?;
            }
            if api_version >= 3 {
                r.i32()?; // throttle time
            }
            for _ in 0..r.array_len(flexible)? {
                r.i32()?; // node id
                r.string(flexible)?;
                offsets.push(r.at);
                r.i32()?;
                if api_version >= 1 {
                    r.nullable_string(flexible)?; // rack
                }
                if flexible {
                    r.tagged_fields()?;
                }
            }
        }
        FIND_COORDINATOR => {
            let flexible = api_version >= 3;
            r.i32()?; // correlation id
            if flexible {
                r.tagged_fields()?;
            }
            if api_version >= 1 {
                r.i32()?; // throttle time
            }
            if api_version >= 4 {
                for _ in 0..r.array_len(flexible)? {
                    r.string(flexible)?; // key
                    r.i32()?; // node id
                    r.string(flexible)?;
                    offsets.push(r.at);
                    r.i32()?;
                    r.i16()?; // error code
                    r.nullable_string(flexible)?;
                    if flexible {
                        r.tagged_fields()?;
                    }
                }
            } else {
                r.i16()?; // error code
                if api_version >= 1 {
                    r.nullable_string(flexible)?;
                }
                r.i32()?; // node id
                r.string(flexible)?;
                offsets.push(r.at);
                r.i32()?;
            }
        }
        _ => {}
    }
    Ok(offsets)
}

/// Rewrites, in place, every broker port `from` that a Metadata, FindCoordinator, Produce or
/// Fetch response `frame` (size prefix included) names into `to`; returns how many were
/// rewritten. Ports are fixed-width, so the frame keeps its length.
pub fn rewrite_broker_ports(
    api_key: i16,
    api_version: i16,
    frame: &mut [u8],
    from: u16,
    to: u16,
) -> Result<usize> {
    rewrite_broker_port_map(api_key, api_version, frame, &[(from, to)])
}

/// Like [`rewrite_broker_ports`] for several `(from, to)` pairs at once: every broker port the
/// response names that is the `from` of a pair becomes that pair's `to`. One pass: a port
/// written is never rewritten again, so the pairs' order does not matter (with duplicate
/// `from`s, the first pair wins).
pub fn rewrite_broker_port_map(
    api_key: i16,
    api_version: i16,
    frame: &mut [u8],
    ports: &[(u16, u16)],
) -> Result<usize> {
    ensure!(frame.len() >= 4, "frame shorter than its size prefix");
    let offsets = broker_port_offsets(api_key, api_version, &frame[4..])?;
    let mut rewritten = 0;
    for at in offsets {
        let field = &mut frame[4 + at..4 + at + 4];
        let port = i32::from_be_bytes([field[0], field[1], field[2], field[3]]);
        if let Some(&(_, to)) = ports.iter().find(|&&(from, _)| i32::from(from) == port) {
            field.copy_from_slice(&i32::from(to).to_be_bytes());
            rewritten += 1;
        }
    }
    Ok(rewritten)
}

#[cfg(test)]
mod tests {

    /// A Metadata response of `version` listing brokers (id, host, port), as Kafka writes it.
    fn metadata_response(version: i16, brokers: &[(i32, &str, i32)]) -> Vec<u8> {
        let flexible = version >= 9;
        let mut w = Writer::default();
        w.i32(7); // correlation id
        if flexible {
            w.empty_tagged_fields();
        }
        if version >= 3 {
            w.i32(0);
        }
        w.array_len(brokers.len(), flexible);
        for (id, host, port) in brokers {
            w.i32(*id);
            w.nullable_string(Some(host), flexible);
            w.i32(*port);
            if version >= 1 {
                w.nullable_string(Some("rack-a"), flexible);
            }
            if flexible {
                // One tagged field, so skipping them is exercised.
                w.uvarint(1);
                w.uvarint(3);
                w.uvarint(2);
                w.out.extend_from_slice(&[9, 9]);
            }
        }
        w.i32(1); // cluster id etc. follow; nothing after the brokers is read
        w.framed()
    }

    #[test]
    fn metadata_ports_are_rewritten_in_every_version() {
        for version in 0..=13 {
            let mut frame =
                metadata_response(version, &[(1, "127.0.0.1", 9092), (2, "127.0.0.1", 9093)]);
            let before = frame.len();
            let n = rewrite_broker_ports(METADATA, version, &mut frame, 9093, 4000).unwrap();
            assert_eq!(n, 1, "v{version}");
            assert_eq!(frame.len(), before);
            assert_eq!(
                frame,
                metadata_response(version, &[(1, "127.0.0.1", 9092), (2, "127.0.0.1", 4000)]),
                "v{version}"
            );
        }
    }

    #[test]
    fn a_port_map_rewrites_every_broker_of_a_metadata_answer_in_one_pass() {
        for version in 0..=13 {
            let brokers = [
                (1, "127.0.0.1", 9092),
                (2, "127.0.0.1", 9093),
                (3, "127.0.0.1", 9094),
            ];
            let mut frame = metadata_response(version, &brokers);
            // Pair by pair, 9093 -> 9092 then 9092 -> 4000 would turn both into 4000.
            let map = [(9093, 9092), (9092, 4000), (7777, 1)];
            let n = rewrite_broker_port_map(METADATA, version, &mut frame, &map).unwrap();
            assert_eq!(n, 2, "v{version}");
            assert_eq!(
                frame,
                metadata_response(
                    version,
                    &[
                        (1, "127.0.0.1", 4000),
                        (2, "127.0.0.1", 9092),
                        (3, "127.0.0.1", 9094)
                    ]
                ),
                "v{version}"
            );
        }
    }

    #[test]
    fn find_coordinator_ports_are_rewritten() {
        for version in [0i16, 2, 3, 4, 6] {
            let flexible = version >= 3;
            let build = |port: i32| {
                let mut w = Writer::default();
                w.i32(1);
                if flexible {
                    w.empty_tagged_fields();
                }
                if version >= 1 {
                    w.i32(0);
                }
                if version >= 4 {
                    w.array_len(1, flexible);
                    w.nullable_string(Some("txn"), flexible);
                    w.i32(3);
                    w.nullable_string(Some("127.0.0.1"), flexible);
                    w.i32(port);
                    w.i16(0);
                    w.nullable_string(None, flexible);
                    if flexible {
                        w.empty_tagged_fields();
                    }
                } else {
                    w.i16(0);
                    if version >= 1 {
                        w.nullable_string(None, flexible);
                    }
                    w.i32(3);
                    w.nullable_string(Some("127.0.0.1"), flexible);
                    w.i32(port);
                }
                if flexible {
                    w.empty_tagged_fields();
                }
                w.framed()
            };
            let mut frame = build(9092);
            assert_eq!(
                rewrite_broker_ports(FIND_COORDINATOR, version, &mut frame, 9092, 5000).unwrap(),
                1
            );
            assert_eq!(frame, build(5000), "v{version}");
        }
    }

    /// A flexible response ending in a NodeEndpoints tagged field naming `port`, after `body`.
    fn with_node_endpoints(body: Writer, port: i32) -> Vec<u8> {
        let mut inner = Writer::default();
        inner.array_len(1, true);
        inner.i32(1);
        inner.nullable_string(Some("127.0.0.1"), true);
        inner.i32(port);
        inner.nullable_string(None, true);
        inner.empty_tagged_fields();
        let mut w = body;
        w.uvarint(2); // two tagged fields: an unknown one, then NodeEndpoints
        w.uvarint(5);
        w.uvarint(1);
        w.out.push(0);
        w.uvarint(0);
        w.uvarint(inner.out.len() as u64);
        w.out.extend(inner.out);
        w.framed()
    }

    #[test]
    fn produce_node_endpoints_are_rewritten() {
        let build = |port: i32| {
            let mut w = Writer::default();
            w.i32(9);
            w.empty_tagged_fields();
            w.array_len(1, true);
            w.nullable_string(Some("orders"), true);
            w.array_len(1, true);
            w.i32(0);
            w.i16(6);
            w.i64(-1);
            w.i64(-1);
            w.i64(-1);
            w.array_len(0, true);
            w.nullable_string(None, true);
            w.empty_tagged_fields();
            w.empty_tagged_fields();
            w.i32(0);
            with_node_endpoints(w, port)
        };
        let mut frame = build(9092);
        assert_eq!(
            rewrite_broker_ports(PRODUCE, 10, &mut frame, 9092, 7000).unwrap(),
            1
        );
        assert_eq!(frame, build(7000));
    }

    #[test]
    fn fetch_node_endpoints_are_rewritten() {
        let build = |port: i32| {
            let mut w = Writer::default();
            w.i32(9);
            w.empty_tagged_fields();
            w.i32(0);
            w.i16(0);
            w.i32(0);
            w.array_len(1, true);
            w.out.extend([7u8; 16]);
            w.array_len(1, true);
            w.i32(0);
            w.i16(6);
            w.i64(10);
            w.i64(10);
            w.i64(0);
            w.array_len(0, true);
            w.i32(-1);
            w.bytes(b"records", true);
            w.empty_tagged_fields();
            w.empty_tagged_fields();
            with_node_endpoints(w, port)
        };
        let mut frame = build(9092);
        assert_eq!(
            rewrite_broker_ports(FETCH, 16, &mut frame, 9092, 7000).unwrap(),
            1
        );
        assert_eq!(frame, build(7000));
    }

    #[test]
    fn a_truncated_metadata_response_is_an_error_not_a_panic() {
        let frame = metadata_response(12, &[(1, "127.0.0.1", 9092)]);
        for cut in 4..frame.len() - 4 {
            let mut short = frame[..cut].to_vec();
            let _ = rewrite_broker_ports(METADATA, 12, &mut short, 9092, 1);
        }
    }

    use super::*;

    #[test]
    fn an_end_txn_request_says_whether_it_commits_in_every_encoding() {
        for version in 0..=5 {
            for commits in [true, false] {
                let mut w = Writer::default();
                w.i16(END_TXN);
                w.i16(version);
                w.i32(42); // correlation id
                w.nullable_string(Some("rdkafka"), false); // client id
                let flexible = version >= 3;
                if flexible {
                    w.empty_tagged_fields();
                }
                w.nullable_string(Some("siphon-slot"), flexible);
                w.i64(1_000); // producer id
                w.i16(3); // producer epoch
                w.out.push(u8::from(commits));
                if flexible {
                    w.empty_tagged_fields();
                }
                let frame = w.framed();
                assert_eq!(end_txn_commits(&frame[4..]).unwrap(), commits, "v{version}");
            }
        }
        let mut w = Writer::default();
        w.i16(INIT_PRODUCER_ID);
        assert!(end_txn_commits(&w.framed()[4..]).is_err());
    }

    #[test]
    fn the_error_code_of_an_end_txn_answer_is_replaced_in_every_encoding() {
        for version in 0..=5 {
            let mut w = Writer::default();
            w.i32(42); // correlation id
            if version >= 3 {
                w.empty_tagged_fields();
            }
            w.i32(7); // throttle time
            w.i16(0); // no error
            if version >= 3 {
                w.empty_tagged_fields();
            }
            let mut frame = w.framed();
            let was = replace_error_code(END_TXN, version, &mut frame, 90).unwrap();
            assert_eq!(was, 0, "v{version}");
            let body = &frame[4..];
            let at = top_level_error_offset(END_TXN, version, body).unwrap();
            assert_eq!(
                i16::from_be_bytes([body[at], body[at + 1]]),
                90,
                "v{version}"
            );
            assert_eq!(i32::from_be_bytes(body[at - 4..at].try_into().unwrap()), 7);
        }
        // SaslHandshake: the error code first, then the broker's mechanisms.
        let mut w = Writer::default();
        w.i32(43);
        w.i16(0);
        w.array_len(1, false);
        w.nullable_string(Some("SCRAM-SHA-256"), false);
        let mut frame = w.framed();
        assert_eq!(
            replace_error_code(SASL_HANDSHAKE, 1, &mut frame, 33).unwrap(),
            0
        );
        assert_eq!(i16::from_be_bytes([frame[8], frame[9]]), 33);
        assert!(top_level_error_offset(PRODUCE, 9, &[0; 16]).is_err());
    }

    fn request(version: i16) -> ProduceRequest {
        ProduceRequest {
            header: RequestHeader {
                api_key: PRODUCE,
                api_version: version,
                correlation_id: 4242,
            },
            transactional_id: None,
            acks: -1,
            timeout_ms: 30_000,
            topics: vec![
                TopicData {
                    name: "outbox.event.Order".into(),
                    partitions: vec![
                        PartitionData {
                            partition: 2,
                            records: b"batch with POISON inside".to_vec(),
                        },
                        PartitionData {
                            partition: 0,
                            records: vec![0u8; 300],
                        },
                    ],
                },
                TopicData {
                    name: "other".into(),
                    partitions: vec![PartitionData {
                        partition: 1,
                        records: vec![7u8; 5],
                    }],
                },
            ],
        }
    }

    #[test]
    fn produce_requests_of_every_version_round_trip() {
        for version in PRODUCE_VERSIONS {
            let req = request(version);
            let framed = encode_produce_request(&req, Some("rdkafka"));
            let size = i32::from_be_bytes(framed[..4].try_into().unwrap()) as usize;
            assert_eq!(size, framed.len() - 4);
            assert_eq!(
                parse_produce_request(&framed[4..]).unwrap(),
                req,
                "v{version}"
            );
            let header = request_header(&framed[4..]).unwrap();
            assert_eq!(header.correlation_id, 4242);
        }
    }

    /// A Produce v3 request as librdkafka writes it, byte by byte: header v1, then the body.
    #[test]
    fn a_hand_written_v3_request_parses() {
        let mut frame = Vec::new();
        frame.extend_from_slice(&0i16.to_be_bytes()); // api key
        frame.extend_from_slice(&3i16.to_be_bytes()); // version
        frame.extend_from_slice(&7i32.to_be_bytes()); // correlation id
        frame.extend_from_slice(&2i16.to_be_bytes());
        frame.extend_from_slice(b"id"); // client id
        frame.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
        frame.extend_from_slice(&(-1i16).to_be_bytes()); // acks
        frame.extend_from_slice(&1000i32.to_be_bytes()); // timeout
        frame.extend_from_slice(&1i32.to_be_bytes()); // one topic
        frame.extend_from_slice(&1i16.to_be_bytes());
        frame.extend_from_slice(b"t");
        frame.extend_from_slice(&1i32.to_be_bytes()); // one partition
        frame.extend_from_slice(&5i32.to_be_bytes()); // partition 5
        frame.extend_from_slice(&3i32.to_be_bytes());
        frame.extend_from_slice(b"abc"); // records
        let req = parse_produce_request(&frame).unwrap();
        assert_eq!(req.header.correlation_id, 7);
        assert_eq!(req.acks, -1);
        assert_eq!(req.topics[0].name, "t");
        assert_eq!(req.topics[0].partitions[0].partition, 5);
        assert_eq!(req.topics[0].partitions[0].records, b"abc");
    }

    /// A flexible (v9) request: compact lengths (N+1 varints) and tagged fields.
    #[test]
    fn a_hand_written_v9_request_parses() {
        let mut frame = Vec::new();
        frame.extend_from_slice(&0i16.to_be_bytes());
        frame.extend_from_slice(&9i16.to_be_bytes());
        frame.extend_from_slice(&8i32.to_be_bytes());
        frame.extend_from_slice(&(-1i16).to_be_bytes()); // client id: null (not compact)
        frame.push(0); // header tagged fields
        frame.push(0); // transactional id: null
        frame.extend_from_slice(&(-1i16).to_be_bytes());
        frame.extend_from_slice(&1000i32.to_be_bytes());
        frame.push(2); // one topic
        frame.push(2);
        frame.extend_from_slice(b"t");
        frame.push(2); // one partition
        frame.extend_from_slice(&1i32.to_be_bytes());
        frame.push(4);
        frame.extend_from_slice(b"xyz");
        frame.push(0); // partition tagged fields
        frame.push(0); // topic tagged fields
        frame.extend_from_slice(&[1, 3, 1, 0xff]); // one unknown tagged field, skipped
        let req = parse_produce_request(&frame).unwrap();
        assert_eq!(req.header.correlation_id, 8);
        assert_eq!(req.topics[0].partitions[0].records, b"xyz");
    }

    #[test]
    fn responses_of_every_version_round_trip() {
        let topics = vec![TopicResponse {
            name: "outbox.event.Order".into(),
            partitions: vec![PartitionResponse {
                partition: 2,
                error_code: 44,
                error_message: Some("refused".into()),
            }],
        }];
        for version in PRODUCE_VERSIONS {
            let framed = encode_produce_response(version, 99, &topics);
            let (correlation_id, parsed) = parse_produce_response(version, &framed[4..]).unwrap();
            assert_eq!(correlation_id, 99);
            let mut expected = topics.clone();
            if version < 8 {
                expected[0].partitions[0].error_message = None;
            }
            assert_eq!(parsed, expected, "v{version}");
        }
    }

    #[test]
    fn a_v3_response_has_the_documented_layout() {
        let framed = encode_produce_response(
            3,
            5,
            &[TopicResponse {
                name: "t".into(),
                partitions: vec![PartitionResponse {
                    partition: 1,
                    error_code: 32,
                    error_message: None,
                }],
            }],
        );
        // size, correlation id, [topic "t" [partition, error, base offset, append time]], throttle
        let expected_len = 4 + 4 + 4 + 2 + 1 + 4 + 4 + 2 + 8 + 8 + 4;
        assert_eq!(framed.len(), expected_len);
        assert_eq!(&framed[23..25], &32i16.to_be_bytes());
    }

    #[test]
    fn malformed_requests_are_errors() {
        let framed = encode_produce_request(&request(7), None);
        for cut in [0, 3, 9, 20, framed.len() - 5] {
            assert!(parse_produce_request(&framed[4..4 + cut.min(framed.len() - 4)]).is_err());
        }
        let mut wrong = framed[4..].to_vec();
        wrong[1] = 1; // api key 1 (Fetch)
        assert!(parse_produce_request(&wrong).is_err());
        let mut old = framed[4..].to_vec();
        old[3] = 2; // Produce v2
        assert!(parse_produce_request(&old).is_err());
        let mut negative = framed[4..].to_vec();
        // The topic array count: after the 8-byte header, the null client id (2), the null
        // transactional id (2), acks (2) and timeout (4).
        negative[18..22].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(parse_produce_request(&negative).is_err());
    }
}
