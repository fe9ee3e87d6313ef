#![allow(clippy::unwrap_used)]
//! A small serializer of [`Message`] back to the wire format, written from the protocol
//! documentation independently of the decoder. Optional fields (the streamed xid, the
//! parallel Stream Abort fields, the old tuple of an Update) are written when present.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Message, OldTuple, RelationColumn, Text, TupleData};

/// Serializes one message.
pub fn encode(message: &Message) -> Bytes {
    let mut out = Vec::new();
    out.push(message.tag());
    match message {
        Message::Begin(m) => {
            lsn(&mut out, m.final_lsn);
            out.extend(m.commit_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
        }
        Message::Commit(m) => {
            out.push(m.flags);
            lsn(&mut out, m.commit_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.commit_timestamp.to_be_bytes());
        }
        Message::Origin(m) => {
            lsn(&mut out, m.commit_lsn);
            cstring(&mut out, &m.name);
        }
        Message::Relation(m) => {
            xid(&mut out, m.xid);
            out.extend(m.id.to_be_bytes());
            cstring(&mut out, &m.namespace);
            cstring(&mut out, &m.name);
            out.push(m.replica_identity.as_byte());
            out.extend(u16::try_from(m.columns.len()).unwrap().to_be_bytes());
            for RelationColumn {
                flags,
                name,
                type_oid,
                type_modifier,
            } in &m.columns
            {
                out.push(*flags);
                cstring(&mut out, name);
                out.extend(type_oid.to_be_bytes());
                out.extend(type_modifier.to_be_bytes());
            }
        }
        Message::Type(m) => {
            xid(&mut out, m.xid);
            out.extend(m.id.to_be_bytes());
            cstring(&mut out, &m.namespace);
            cstring(&mut out, &m.name);
        }
        Message::Insert(m) => {
            xid(&mut out, m.xid);
            out.extend(m.relation_id.to_be_bytes());
            out.push(b'N');
            tuple(&mut out, &m.new);
        }
        Message::Update(m) => {
            xid(&mut out, m.xid);
            out.extend(m.relation_id.to_be_bytes());
            if let Some(old) = &m.old {
                old_tuple(&mut out, old);
            }
            out.push(b'N');
            tuple(&mut out, &m.new);
        }
        Message::Delete(m) => {
            xid(&mut out, m.xid);
            out.extend(m.relation_id.to_be_bytes());
            old_tuple(&mut out, &m.old);
        }
        Message::Truncate(m) => {
            xid(&mut out, m.xid);
            out.extend(i32::try_from(m.relation_ids.len()).unwrap().to_be_bytes());
            out.push(m.options);
            for id in &m.relation_ids {
                out.extend(id.to_be_bytes());
            }
        }
        Message::LogicalMessage(m) => {
            xid(&mut out, m.xid);
            out.push(m.flags);
            lsn(&mut out, m.lsn);
            cstring(&mut out, &m.prefix);
            counted(&mut out, &m.content);
        }
        Message::StreamStart(m) => {
            out.extend(m.xid.to_be_bytes());
            out.push(u8::from(m.first_segment));
        }
        Message::StreamStop => {}
        Message::StreamCommit(m) => {
            out.extend(m.xid.to_be_bytes());
            out.push(m.flags);
            lsn(&mut out, m.commit_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.commit_timestamp.to_be_bytes());
        }
        Message::StreamAbort(m) => {
            out.extend(m.xid.to_be_bytes());
            out.extend(m.subxid.to_be_bytes());
            if let Some(abort_lsn) = m.abort_lsn {
                lsn(&mut out, abort_lsn);
            }
            if let Some(ts) = m.abort_timestamp {
                out.extend(ts.to_be_bytes());
            }
        }
        Message::BeginPrepare(m) => {
            lsn(&mut out, m.prepare_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.prepare_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
            cstring(&mut out, &m.gid);
        }
        Message::Prepare(m) => {
            out.push(m.flags);
            lsn(&mut out, m.prepare_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.prepare_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
            cstring(&mut out, &m.gid);
        }
        Message::StreamPrepare(m) => {
            out.push(m.flags);
            lsn(&mut out, m.prepare_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.prepare_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
            cstring(&mut out, &m.gid);
        }
        Message::CommitPrepared(m) => {
            out.push(m.flags);
            lsn(&mut out, m.commit_lsn);
            lsn(&mut out, m.end_lsn);
            out.extend(m.commit_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
            cstring(&mut out, &m.gid);
        }
        Message::RollbackPrepared(m) => {
            out.push(m.flags);
            lsn(&mut out, m.prepare_end_lsn);
            lsn(&mut out, m.rollback_end_lsn);
            out.extend(m.prepare_timestamp.to_be_bytes());
            out.extend(m.rollback_timestamp.to_be_bytes());
            out.extend(m.xid.to_be_bytes());
            cstring(&mut out, &m.gid);
        }
    }
    Bytes::from(out)
}

fn lsn(out: &mut Vec<u8>, lsn: Lsn) {
    out.extend(lsn.0.to_be_bytes());
}

fn xid(out: &mut Vec<u8>, xid: Option<u32>) {
    if let Some(xid) = xid {
        out.extend(xid.to_be_bytes());
    }
}

fn cstring(out: &mut Vec<u8>, text: &Text) {
    out.extend_from_slice(text.as_str().as_bytes());
    out.push(0);
}

fn counted(out: &mut Vec<u8>, data: &[u8]) {
    out.extend(i32::try_from(data.len()).unwrap().to_be_bytes());
    out.extend_from_slice(data);
}

fn old_tuple(out: &mut Vec<u8>, old: &OldTuple) {
    match old {
        OldTuple::Key(t) => {
            out.push(b'K');
            tuple(out, t);
        }
        OldTuple::Full(t) => {
            out.push(b'O');
            tuple(out, t);
        }
    }
}

fn tuple(out: &mut Vec<u8>, tuple: &TupleData) {
    out.extend(u16::try_from(tuple.columns.len()).unwrap().to_be_bytes());
    for column in &tuple.columns {
        match column {
            Column::Null => out.push(b'n'),
            Column::UnchangedToast => out.push(b'u'),
            Column::Text(v) => {
                out.push(b't');
                counted(out, v);
            }
            Column::Binary(v) => {
                out.push(b'b');
                counted(out, v);
            }
        }
    }
}
