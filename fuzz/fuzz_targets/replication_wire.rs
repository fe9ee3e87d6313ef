//! Arbitrary bytes through the replication protocol's framing (`pgoutput::wire`), as a server
//! (or anything posing as one) could send them to the replication connection.
//!
//! Input layout: the first byte says how many bytes arrive per read (1 to 256), the rest is
//! the stream. The stream is fed into one receive buffer a read at a time, and every whole
//! message is cut off and read as the connection reads it: CopyData payloads, error and notice
//! fields, data rows.
//!
//! Besides "never panics", the target checks:
//! - the messages cut off, put back together, are exactly the bytes consumed, in order;
//! - when no whole message is there, `missing` says more bytes are needed (at least one).

#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use pgoutput::wire;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step) + 1;
    let mut buf = BytesMut::new();
    let mut rebuilt = Vec::new();
    let mut fed = 0;
    'reading: while fed < stream.len() {
        let end = (fed + step).min(stream.len());
        buf.extend_from_slice(&stream[fed..end]);
        fed = end;
        loop {
            match wire::split(&mut buf) {
                Ok(Some(message)) => {
                    rebuilt.put_u8(message.tag);
                    rebuilt.put_u32(u32::try_from(message.body.len() + 4).expect("bounded"));
                    rebuilt.extend_from_slice(&message.body);
                    match message.tag {
                        b'd' => {
                            let _ = wire::copy_data(message.body.clone());
                        }
                        b'E' | b'N' => {
                            let _ = wire::server_error(&message.body);
                        }
                        b'D' => {
                            let _ = wire::data_row(&message.body);
                        }
                        _ => {}
                    }
                }
                Ok(None) => {
                    let missing = wire::missing(&buf).expect("split accepted the header");
                    assert!(missing > 0, "no whole message, yet nothing missing");
                    break;
                }
                // A framing error ends the connection.
                Err(_) => break 'reading,
            }
        }
    }
    assert_eq!(&rebuilt[..], &stream[..rebuilt.len()], "messages differ from the bytes read");
});
