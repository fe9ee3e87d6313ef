//! Parsing of pgoutput messages (to be implemented).

use crate::{DecodeError, Message};
use bytes::Bytes;

/// Protocol options the stream was started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderOptions {
    /// `proto_version` (1 to 4).
    pub protocol_version: u32,
    /// `streaming 'parallel'` (protocol 4): Stream Abort carries its LSN and timestamp.
    pub parallel_streaming: bool,
}

/// Whether the decoder is inside a streamed-transaction block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamState {
    pub in_stream: bool,
}

/// Stateful decoder that knows the protocol options and the stream state.
#[derive(Debug, Clone)]
pub struct Decoder {
    options: DecoderOptions,
    state: StreamState,
}

impl Decoder {
    pub fn new(options: DecoderOptions) -> Self {
        Decoder { options, state: StreamState::default() }
    }

    pub fn decode(&mut self, _buf: &Bytes) -> Result<Message, DecodeError> {
        let _ = (&self.options, &self.state);
        Err(DecodeError::Empty)
    }
}

/// Parses one message outside a streamed block.
pub fn parse(buf: &Bytes) -> Result<Message, DecodeError> {
    Decoder::new(DecoderOptions { protocol_version: 1, parallel_streaming: false }).decode(buf)
}
