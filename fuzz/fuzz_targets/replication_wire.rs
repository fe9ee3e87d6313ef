//! Arbitrary bytes through the replication protocol's framing (`siphon_source::wire::frames`),
//! as a server (or anything posing as one) could send them to the replication connection.
//!
//! Input layout: the first byte says how many bytes arrive per read (1 to 256), the rest is
//! the stream. The stream is fed into one receive buffer a read at a time, and every whole
//! message is cut off and read as the connection reads it: CopyData payloads, error and notice
//! fields, data rows, authentication requests and parameter statuses.
//!
//! Besides "never panics", the target checks:
//! - each message cut off takes exactly the bytes its header declares, in order, and a CopyData
//!   payload is those bytes after the header;
//! - when no whole message is there, `missing` says more bytes are needed (at least one).

#![no_main]

use fallible_iterator::FallibleIterator;
use libfuzzer_sys::fuzz_target;
use postgres_protocol::message::backend::Message;
use siphon_source::wire::frames::{self, Frame};

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step) + 1;
    let mut buf = bytes::BytesMut::new();
    let mut consumed = 0;
    let mut fed = 0;
    'reading: while fed < stream.len() {
        let end = (fed + step).min(stream.len());
        buf.extend_from_slice(&stream[fed..end]);
        fed = end;
        loop {
            let before = buf.len();
            match frames::split(&mut buf) {
                Ok(Some(frame)) => {
                    let size = before - buf.len();
                    let header = &stream[consumed..consumed + 5];
                    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                    assert_eq!(
                        size,
                        1 + declared as usize,
                        "a message took other bytes than its own"
                    );
                    match frame {
                        Frame::CopyData(body) => {
                            assert_eq!(header[0], b'd');
                            assert_eq!(&body[..], &stream[consumed + 5..consumed + size]);
                            let _ = frames::copy_data(body);
                        }
                        Frame::Message { message, .. } => read(*message),
                        Frame::Unknown { .. } => {}
                    }
                    consumed += size;
                }
                Ok(None) => {
                    let missing = frames::missing(&buf).expect("split accepted the header");
                    assert!(missing > 0, "no whole message, yet nothing missing");
                    break;
                }
                // A framing error ends the connection.
                Err(_) => break 'reading,
            }
        }
    }
});

/// Reads a parsed message's fields as the connection does.
fn read(message: Message) {
    match message {
        Message::ErrorResponse(body) => {
            let _ = frames::server_error(body.fields());
        }
        Message::NoticeResponse(body) => {
            let _ = frames::server_error(body.fields());
        }
        Message::DataRow(body) => {
            let _ = frames::data_row(&body);
        }
        Message::AuthenticationSasl(body) => {
            let _ = body.mechanisms().count();
        }
        Message::ParameterStatus(body) => {
            let _ = (body.name(), body.value());
        }
        _ => {}
    }
}
