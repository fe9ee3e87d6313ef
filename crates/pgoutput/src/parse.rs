//! Entry points: the stateful [`Decoder`] and the stateless [`parse`].
//!
//! A message's layout depends on the protocol options the stream was started with and on
//! whether it is inside a streamed-transaction block (between Stream Start and Stream Stop),
//! where Relation, Type, Insert, Update, Delete, Truncate and Message carry the xid of the
//! streamed transaction. The decoder tracks that block from the messages it decodes.
//!
//! # Invariants
//! - Decoding never panics, whatever the input.
//! - A message is accepted only if its kind exists in the configured protocol version and is
//!   allowed in the current stream state; otherwise the error is [`DecodeError::Unexpected`].
//! - The whole buffer must be consumed: trailing bytes are [`DecodeError::TrailingBytes`].
//! - The stream state changes only when a Stream Start or Stream Stop decodes successfully;
//!   a failed decode leaves the decoder as it was.
//! - [`Decoder::decode_skimming`] reads what [`Decoder::decode`] reads, in the same order: a
//!   skimmed Delete differs from the decoded one only in that its old row is not built.

use crate::body;
use crate::kind::{Kind, Placement};
use crate::reader::Reader;
use crate::{DecodeError, Decoded, Message, Oid, Xid};
use bytes::Bytes;

/// Protocol options the stream was started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderOptions {
    /// `proto_version` (1 to 4). Version 2 adds streamed transactions, 3 two-phase commit and
    /// 4 parallel streaming; a higher number decodes as version 4.
    pub protocol_version: u32,
    /// `streaming 'parallel'` (protocol 4): Stream Abort carries its LSN and timestamp.
    /// Ignored below protocol 4, where PostgreSQL refuses parallel streaming.
    pub parallel_streaming: bool,
}

impl DecoderOptions {
    /// The newest protocol version this crate knows.
    pub const LATEST_PROTOCOL_VERSION: u32 = 4;

    /// Options for `protocol_version` without parallel streaming.
    pub const fn new(protocol_version: u32) -> Self {
        DecoderOptions {
            protocol_version,
            parallel_streaming: false,
        }
    }

    /// Whether Stream Abort carries the abort LSN and timestamp.
    pub const fn stream_abort_has_abort_info(&self) -> bool {
        self.protocol_version >= 4 && self.parallel_streaming
    }
}

/// Whether the decoder is inside a streamed-transaction block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamState {
    /// A Stream Start was decoded and its Stream Stop was not yet.
    pub in_stream: bool,
}

/// Stateful decoder that knows the protocol options and the stream state.
///
/// Feed it every message of a replication stream, in order.
#[derive(Debug, Clone)]
pub struct Decoder {
    options: DecoderOptions,
    state: StreamState,
}

impl Decoder {
    /// A decoder outside any streamed block.
    pub fn new(options: DecoderOptions) -> Self {
        Decoder {
            options,
            state: StreamState::default(),
        }
    }

    /// The options the decoder was built with.
    pub fn options(&self) -> DecoderOptions {
        self.options
    }

    /// Whether the decoder is inside a streamed block.
    pub fn state(&self) -> StreamState {
        self.state
    }

    /// Decodes one message (the payload of one `XLogData`, or one row's `data` from
    /// `pg_logical_slot_get_binary_changes`) and updates the stream state.
    pub fn decode(&mut self, buf: &Bytes) -> Result<Message, DecodeError> {
        let message = decode_message(buf, self.options, self.state)?;
        match message {
            Message::StreamStart(_) => self.state.in_stream = true,
            Message::StreamStop => self.state.in_stream = false,
            _ => {}
        }
        Ok(message)
    }

    /// [`Decoder::decode`], except that a Delete of a relation for which `skim` is true comes
    /// as [`Decoded::SkimmedDelete`]: its old row is checked as `decode` checks it (a message
    /// `decode` refuses is refused with the same error) but not built, so nothing is allocated
    /// and nothing of `buf` is kept. `skim` is asked at most once, only for a Delete, with the
    /// relation id read from it.
    pub fn decode_skimming(
        &mut self,
        buf: &Bytes,
        skim: impl FnOnce(Oid) -> bool,
    ) -> Result<Decoded, DecodeError> {
        if buf.first() != Some(&Kind::Delete.tag()) {
            return self.decode(buf).map(Decoded::Message);
        }
        let mut r = Reader::new(buf);
        r.u8("message tag")?;
        let xid = stream_xid(&mut r, Kind::Delete, self.options, self.state)?;
        let decoded = body::delete_skimming(&mut r, xid, skim)?;
        r.finish(Kind::Delete.name())?;
        // A Delete leaves the stream state as it is.
        Ok(decoded)
    }
}

/// Parses one message outside a streamed block, accepting every message kind of the latest
/// protocol version. Stream Abort is read without the parallel-streaming fields; use a
/// [`Decoder`] for those and for messages inside a streamed block.
pub fn parse(buf: &Bytes) -> Result<Message, DecodeError> {
    decode_message(
        buf,
        DecoderOptions::new(DecoderOptions::LATEST_PROTOCOL_VERSION),
        StreamState::default(),
    )
}

/// Decodes one message without changing any state.
fn decode_message(
    buf: &Bytes,
    options: DecoderOptions,
    state: StreamState,
) -> Result<Message, DecodeError> {
    let mut r = Reader::new(buf);
    let tag = r.u8("message tag").map_err(|_| DecodeError::Empty)?;
    let kind = Kind::from_tag(tag).ok_or(DecodeError::UnknownTag { tag })?;
    let xid = stream_xid(&mut r, kind, options, state)?;
    let message = match kind {
        Kind::Begin => Message::Begin(body::begin(&mut r)?),
        Kind::Commit => Message::Commit(body::commit(&mut r)?),
        Kind::Origin => Message::Origin(body::origin(&mut r)?),
        Kind::Relation => Message::Relation(body::relation(&mut r, xid)?),
        Kind::Type => Message::Type(body::type_(&mut r, xid)?),
        Kind::Insert => Message::Insert(body::insert(&mut r, xid)?),
        Kind::Update => Message::Update(body::update(&mut r, xid)?),
        Kind::Delete => Message::Delete(body::delete(&mut r, xid)?),
        Kind::Truncate => Message::Truncate(body::truncate(&mut r, xid)?),
        Kind::LogicalMessage => Message::LogicalMessage(body::logical_message(&mut r, xid)?),
        Kind::StreamStart => Message::StreamStart(body::stream_start(&mut r)?),
        Kind::StreamStop => Message::StreamStop,
        Kind::StreamCommit => Message::StreamCommit(body::stream_commit(&mut r)?),
        Kind::StreamAbort => Message::StreamAbort(body::stream_abort(
            &mut r,
            options.stream_abort_has_abort_info(),
        )?),
        Kind::BeginPrepare => Message::BeginPrepare(body::begin_prepare(&mut r)?),
        Kind::Prepare => Message::Prepare(body::prepare(&mut r)?),
        Kind::CommitPrepared => Message::CommitPrepared(body::commit_prepared(&mut r)?),
        Kind::RollbackPrepared => Message::RollbackPrepared(body::rollback_prepared(&mut r)?),
        Kind::StreamPrepare => Message::StreamPrepare(body::stream_prepare(&mut r)?),
    };
    r.finish(kind.name())?;
    Ok(message)
}

/// After the tag of a message of `kind`: checks that the kind is allowed, and reads the
/// streamed transaction's xid where the message has one.
#[inline(always)]
fn stream_xid(
    r: &mut Reader<'_>,
    kind: Kind,
    options: DecoderOptions,
    state: StreamState,
) -> Result<Option<Xid>, DecodeError> {
    check_allowed(kind, options, state)?;
    Ok(if state.in_stream && kind.carries_stream_xid() {
        Some(r.u32("xid")?)
    } else {
        None
    })
}

/// Rejects a message kind the protocol version or the stream state does not allow.
fn check_allowed(
    kind: Kind,
    options: DecoderOptions,
    state: StreamState,
) -> Result<(), DecodeError> {
    let unexpected = |reason| DecodeError::Unexpected {
        message: kind.name(),
        reason,
    };
    if options.protocol_version < kind.min_version() {
        return Err(unexpected(match kind.min_version() {
            2 => "requires protocol version 2 (streaming) or later",
            3 => "requires protocol version 3 (two-phase commit) or later",
            _ => "requires protocol version 1 or later",
        }));
    }
    match (kind.placement(), state.in_stream) {
        (Placement::Outside, true) => Err(unexpected("not allowed inside a streamed block")),
        (Placement::Inside, false) => Err(unexpected("only allowed inside a streamed block")),
        _ => Ok(()),
    }
}
