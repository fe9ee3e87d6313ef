//! The field layout of each message, after its tag byte.
//!
//! Each function reads exactly the fields PostgreSQL's `proto.c` writes for one message kind,
//! in order. Whether the message is allowed at all, and whether it carries a streamed
//! transaction's xid, is decided by the caller.
//!
//! # Invariants
//! - Functions read fields only through [`Reader`], so they never panic and never copy data.
//! - Vectors are pre-allocated for at most as many elements as the remaining bytes can hold.
//! - Checking that nothing follows the message is the caller's job.

use crate::reader::Reader;
use crate::tuple::{self, read_new_tuple, read_old_tuple, read_tuple, skip_old_tuple};
use crate::{
    Begin, BeginPrepare, Commit, CommitPrepared, DecodeError, Decoded, Delete, Insert,
    LogicalMessage, Message, Oid, Origin, Prepare, Relation, RelationColumn, ReplicaIdentity,
    RollbackPrepared, SkimmedDelete, StreamAbort, StreamCommit, StreamPrepare, StreamStart,
    Truncate, Type, Update, Xid,
};

/// Smallest encoding of a relation column: flags, an empty name, type oid and modifier.
const MIN_RELATION_COLUMN_LEN: usize = 1 + 1 + 4 + 4;
/// Encoding of one relation id in a Truncate message.
const RELATION_ID_LEN: usize = 4;

/// `B`
pub(crate) fn begin(r: &mut Reader<'_>) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: r.lsn("final_lsn")?,
        commit_timestamp: r.i64("commit_timestamp")?,
        xid: r.u32("xid")?,
    })
}

/// `C`
pub(crate) fn commit(r: &mut Reader<'_>) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: r.u8("flags")?,
        commit_lsn: r.lsn("commit_lsn")?,
        end_lsn: r.lsn("end_lsn")?,
        commit_timestamp: r.i64("commit_timestamp")?,
    })
}

/// `O`
pub(crate) fn origin(r: &mut Reader<'_>) -> Result<Origin, DecodeError> {
    Ok(Origin {
        commit_lsn: r.lsn("commit_lsn")?,
        name: r.cstring("origin name")?,
    })
}

/// `R`
pub(crate) fn relation(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Relation, DecodeError> {
    let id = r.u32("relation id")?;
    let namespace = r.cstring("namespace")?;
    let name = r.cstring("relation name")?;
    let identity = r.u8("replica identity")?;
    let replica_identity =
        ReplicaIdentity::from_byte(identity).ok_or(DecodeError::InvalidValue {
            field: "replica identity",
            value: u64::from(identity),
        })?;
    let count = usize::from(r.u16("relation column count")?);
    let mut columns = Vec::with_capacity(count.min(r.remaining() / MIN_RELATION_COLUMN_LEN));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8("column flags")?,
            name: r.cstring("column name")?,
            type_oid: r.u32("column type oid")?,
            type_modifier: r.i32("column type modifier")?,
        });
    }
    Ok(Relation {
        xid,
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

/// `Y`
pub(crate) fn type_(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Type, DecodeError> {
    Ok(Type {
        xid,
        id: r.u32("type oid")?,
        namespace: r.cstring("namespace")?,
        name: r.cstring("type name")?,
    })
}

/// `I`
pub(crate) fn insert(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Insert, DecodeError> {
    Ok(Insert {
        xid,
        relation_id: r.u32("relation id")?,
        new: read_new_tuple(r)?,
    })
}

/// `U`: an optional `K` or `O` old tuple, then the `N` new tuple.
pub(crate) fn update(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Update, DecodeError> {
    let relation_id = r.u32("relation id")?;
    let (old, new) = match r.u8("tuple marker")? {
        tuple::NEW => (None, read_tuple(r)?),
        marker @ (tuple::KEY | tuple::OLD) => {
            let old = read_old_tuple(r, marker)?;
            (Some(old), read_new_tuple(r)?)
        }
        other => return Err(tuple::invalid_marker(other)),
    };
    Ok(Update {
        xid,
        relation_id,
        old,
        new,
    })
}

/// `D`: a `K` or `O` old tuple.
pub(crate) fn delete(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Delete, DecodeError> {
    let relation_id = r.u32("relation id")?;
    let marker = r.u8("tuple marker")?;
    Ok(Delete {
        xid,
        relation_id,
        old: read_old_tuple(r, marker)?,
    })
}

/// `D`, read as [`delete`] reads it, except that when `skim` is true for its relation the old
/// tuple is only checked ([`skip_old_tuple`]: the same errors), not built.
pub(crate) fn delete_skimming(
    r: &mut Reader<'_>,
    xid: Option<Xid>,
    skim: impl FnOnce(Oid) -> bool,
) -> Result<Decoded, DecodeError> {
    let relation_id = r.u32("relation id")?;
    let marker = r.u8("tuple marker")?;
    if skim(relation_id) {
        skip_old_tuple(r, marker)?;
        return Ok(Decoded::SkimmedDelete(SkimmedDelete { xid, relation_id }));
    }
    Ok(Decoded::Message(Message::Delete(Delete {
        xid,
        relation_id,
        old: read_old_tuple(r, marker)?,
    })))
}

/// `T`
pub(crate) fn truncate(r: &mut Reader<'_>, xid: Option<Xid>) -> Result<Truncate, DecodeError> {
    let count = r.length("relation count")?;
    let options = r.u8("truncate options")?;
    let mut relation_ids = Vec::with_capacity(count.min(r.remaining() / RELATION_ID_LEN));
    for _ in 0..count {
        relation_ids.push(r.u32("relation id")?);
    }
    Ok(Truncate {
        xid,
        options,
        relation_ids,
    })
}

/// `M`
pub(crate) fn logical_message(
    r: &mut Reader<'_>,
    xid: Option<Xid>,
) -> Result<LogicalMessage, DecodeError> {
    Ok(LogicalMessage {
        xid,
        flags: r.u8("flags")?,
        lsn: r.lsn("message lsn")?,
        prefix: r.cstring("prefix")?,
        content: r.counted_bytes("content length", "content")?,
    })
}

/// `S`
pub(crate) fn stream_start(r: &mut Reader<'_>) -> Result<StreamStart, DecodeError> {
    let xid = r.u32("xid")?;
    let first_segment = match r.u8("first_segment")? {
        0 => false,
        1 => true,
        other => {
            return Err(DecodeError::InvalidValue {
                field: "first_segment",
                value: u64::from(other),
            })
        }
    };
    Ok(StreamStart { xid, first_segment })
}

/// `c`
pub(crate) fn stream_commit(r: &mut Reader<'_>) -> Result<StreamCommit, DecodeError> {
    Ok(StreamCommit {
        xid: r.u32("xid")?,
        flags: r.u8("flags")?,
        commit_lsn: r.lsn("commit_lsn")?,
        end_lsn: r.lsn("end_lsn")?,
        commit_timestamp: r.i64("commit_timestamp")?,
    })
}

/// `A`; `with_abort_info` is set for protocol 4 with parallel streaming.
pub(crate) fn stream_abort(
    r: &mut Reader<'_>,
    with_abort_info: bool,
) -> Result<StreamAbort, DecodeError> {
    let xid = r.u32("xid")?;
    let subxid = r.u32("subxid")?;
    let (abort_lsn, abort_timestamp) = if with_abort_info {
        (Some(r.lsn("abort_lsn")?), Some(r.i64("abort_timestamp")?))
    } else {
        (None, None)
    };
    Ok(StreamAbort {
        xid,
        subxid,
        abort_lsn,
        abort_timestamp,
    })
}

/// `b`
pub(crate) fn begin_prepare(r: &mut Reader<'_>) -> Result<BeginPrepare, DecodeError> {
    Ok(BeginPrepare {
        prepare_lsn: r.lsn("prepare_lsn")?,
        end_lsn: r.lsn("end_lsn")?,
        prepare_timestamp: r.i64("prepare_timestamp")?,
        xid: r.u32("xid")?,
        gid: r.cstring("gid")?,
    })
}

/// `P`
pub(crate) fn prepare(r: &mut Reader<'_>) -> Result<Prepare, DecodeError> {
    Ok(Prepare {
        flags: r.u8("flags")?,
        prepare_lsn: r.lsn("prepare_lsn")?,
        end_lsn: r.lsn("end_lsn")?,
        prepare_timestamp: r.i64("prepare_timestamp")?,
        xid: r.u32("xid")?,
        gid: r.cstring("gid")?,
    })
}

/// `K`
pub(crate) fn commit_prepared(r: &mut Reader<'_>) -> Result<CommitPrepared, DecodeError> {
    Ok(CommitPrepared {
        flags: r.u8("flags")?,
        commit_lsn: r.lsn("commit_lsn")?,
        end_lsn: r.lsn("end_lsn")?,
        commit_timestamp: r.i64("commit_timestamp")?,
        xid: r.u32("xid")?,
        gid: r.cstring("gid")?,
    })
}

/// `r`
pub(crate) fn rollback_prepared(r: &mut Reader<'_>) -> Result<RollbackPrepared, DecodeError> {
    Ok(RollbackPrepared {
        flags: r.u8("flags")?,
        prepare_end_lsn: r.lsn("prepare_end_lsn")?,
        rollback_end_lsn: r.lsn("rollback_end_lsn")?,
        prepare_timestamp: r.i64("prepare_timestamp")?,
        rollback_timestamp: r.i64("rollback_timestamp")?,
        xid: r.u32("xid")?,
        gid: r.cstring("gid")?,
    })
}

/// `p`: the same layout as Prepare.
pub(crate) fn stream_prepare(r: &mut Reader<'_>) -> Result<StreamPrepare, DecodeError> {
    let Prepare {
        flags,
        prepare_lsn,
        end_lsn,
        prepare_timestamp,
        xid,
        gid,
    } = prepare(r)?;
    Ok(StreamPrepare {
        flags,
        prepare_lsn,
        end_lsn,
        prepare_timestamp,
        xid,
        gid,
    })
}
