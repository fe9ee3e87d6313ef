//! The messages of the pgoutput protocol, versions 1 to 4.
//!
//! Field names follow the PostgreSQL documentation ("Logical Replication Message Formats").
//! Timestamps are microseconds since 2000-01-01 00:00:00 UTC, as on the wire.
//!
//! # Invariants
//! - Every `Bytes` and [`Text`] in a message is a slice of the buffer it was parsed from.

use crate::kind::Kind;
use crate::{Lsn, Text};
use bytes::Bytes;

/// A transaction id.
pub type Xid = u32;
/// A PostgreSQL object id.
pub type Oid = u32;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// `B`: see [`Begin`].
    Begin(Begin),
    /// `C`: see [`Commit`].
    Commit(Commit),
    /// `O`: see [`Origin`].
    Origin(Origin),
    /// `R`: see [`Relation`].
    Relation(Relation),
    /// `Y`: see [`Type`].
    Type(Type),
    /// `I`: see [`Insert`].
    Insert(Insert),
    /// `U`: see [`Update`].
    Update(Update),
    /// `D`: see [`Delete`].
    Delete(Delete),
    /// `T`: see [`Truncate`].
    Truncate(Truncate),
    /// `M`: a message written by `pg_logical_emit_message`.
    LogicalMessage(LogicalMessage),
    /// `S`: see [`StreamStart`].
    StreamStart(StreamStart),
    /// `E`: the current block of a streamed transaction ends (protocol 2+).
    StreamStop,
    /// `c`: see [`StreamCommit`].
    StreamCommit(StreamCommit),
    /// `A`: see [`StreamAbort`].
    StreamAbort(StreamAbort),
    /// `b`: see [`BeginPrepare`].
    BeginPrepare(BeginPrepare),
    /// `P`: see [`Prepare`].
    Prepare(Prepare),
    /// `K`: see [`CommitPrepared`].
    CommitPrepared(CommitPrepared),
    /// `r`: see [`RollbackPrepared`].
    RollbackPrepared(RollbackPrepared),
    /// `p`: see [`StreamPrepare`].
    StreamPrepare(StreamPrepare),
}

impl Message {
    /// The tag byte the message starts with on the wire.
    pub fn tag(&self) -> u8 {
        Kind::of(self).tag()
    }

    /// The message's name in the PostgreSQL documentation, e.g. `"Stream Abort"`.
    pub fn name(&self) -> &'static str {
        Kind::of(self).name()
    }
}

/// `B`: start of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit timestamp of the transaction.
    pub commit_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
}

/// `C`: end of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End LSN of the commit record: the position to confirm once the transaction is handled.
    pub end_lsn: Lsn,
    /// Commit timestamp of the transaction.
    pub commit_timestamp: i64,
}

/// `O`: the transaction came from another replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// LSN of the commit on the origin server (`0/0` when sent inside a streamed block).
    pub commit_lsn: Lsn,
    /// Name of the origin.
    pub name: Text,
}

/// Replica identity setting of a relation (`pg_class.relreplident`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    /// `d`: primary key.
    Default,
    /// `n`: nothing.
    Nothing,
    /// `f`: all columns.
    Full,
    /// `i`: a chosen index.
    Index,
}

impl ReplicaIdentity {
    /// The setting a `relreplident` byte stands for, if any.
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            b'd' => Some(ReplicaIdentity::Default),
            b'n' => Some(ReplicaIdentity::Nothing),
            b'f' => Some(ReplicaIdentity::Full),
            b'i' => Some(ReplicaIdentity::Index),
            _ => None,
        }
    }

    /// The `relreplident` byte of the setting.
    pub fn as_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 1 set: the column is part of the key.
    pub flags: u8,
    /// Column name.
    pub name: Text,
    /// Oid of the column's data type.
    pub type_oid: Oid,
    /// Type modifier (`atttypmod`), -1 when none.
    pub type_modifier: i32,
}

impl RelationColumn {
    /// Whether the column is part of the replica identity key.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `R`: describes a table before the first change to it in a session (and after it changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the relation.
    pub id: Oid,
    /// Schema name; the empty string stands for `pg_catalog`.
    pub namespace: Text,
    /// Relation name.
    pub name: Text,
    /// Replica identity setting.
    pub replica_identity: ReplicaIdentity,
    /// The columns, excluding dropped and generated ones, in attribute order.
    pub columns: Vec<RelationColumn>,
}

/// `Y`: describes a non-built-in data type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the data type.
    pub id: Oid,
    /// Schema name; the empty string stands for `pg_catalog`.
    pub namespace: Text,
    /// Name of the data type.
    pub name: Text,
}

/// The value of one column in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Column {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value that the server did not send.
    UnchangedToast,
    /// `t`: the value in PostgreSQL's text format (not validated as UTF-8).
    Text(Bytes),
    /// `b`: the value in PostgreSQL's binary format.
    Binary(Bytes),
}

/// The columns of one row, in the order of the relation's columns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    /// One value per column.
    pub columns: Vec<Column>,
}

/// `I`: a row was inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the relation, as in the [`Relation`] message sent before.
    pub relation_id: Oid,
    /// The inserted row.
    pub new: TupleData,
}

/// Which old row image an [`Update`] or [`Delete`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: the replica identity key columns (others are null).
    Key(TupleData),
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(TupleData),
}

impl OldTuple {
    /// The tuple, whichever kind it is.
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// `U`: a row was updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the relation, as in the [`Relation`] message sent before.
    pub relation_id: Oid,
    /// The old key (when it changed) or the whole old row (`REPLICA IDENTITY FULL`).
    pub old: Option<OldTuple>,
    /// The new row.
    pub new: TupleData,
}

/// `D`: a row was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the relation, as in the [`Relation`] message sent before.
    pub relation_id: Oid,
    /// The old key or the whole old row.
    pub old: OldTuple,
}

/// A `D` message read without its old row: see [`crate::Decoder::decode_skimming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkimmedDelete {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Oid of the relation, as in the [`Relation`] message sent before.
    pub relation_id: Oid,
}

/// What [`crate::Decoder::decode_skimming`] made of one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// The message, as [`crate::Decoder::decode`] decodes it.
    Message(Message),
    /// A Delete of a relation the caller skims: its old row was checked, not built.
    SkimmedDelete(SkimmedDelete),
}

/// `T`: tables were truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Bit 1: `CASCADE`; bit 2: `RESTART IDENTITY`.
    pub options: u8,
    /// Oids of the truncated relations.
    pub relation_ids: Vec<Oid>,
}

/// `M`: a message from `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage {
    /// Transaction id, present only inside a streamed transaction (protocol 2+).
    pub xid: Option<Xid>,
    /// Bit 1 set: the message is transactional.
    pub flags: u8,
    /// LSN of the message.
    pub lsn: Lsn,
    /// The prefix given to `pg_logical_emit_message`.
    pub prefix: Text,
    /// The content, raw.
    pub content: Bytes,
}

impl LogicalMessage {
    /// Whether the message was emitted inside a transaction.
    pub fn is_transactional(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `S`: a block of a streamed (in-progress) transaction starts (protocol 2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    /// Xid of the streamed transaction.
    pub xid: Xid,
    /// Whether this is the first block of that transaction.
    pub first_segment: bool,
}

/// `c`: a streamed transaction committed (protocol 2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCommit {
    /// Xid of the transaction.
    pub xid: Xid,
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End LSN of the commit record.
    pub end_lsn: Lsn,
    /// Commit timestamp of the transaction.
    pub commit_timestamp: i64,
}

/// `A`: a streamed transaction (or subtransaction) aborted (protocol 2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAbort {
    /// Xid of the top-level transaction.
    pub xid: Xid,
    /// Xid of the aborted subtransaction; equal to `xid` when the whole transaction aborted.
    pub subxid: Xid,
    /// Present with protocol 4 and parallel streaming.
    pub abort_lsn: Option<Lsn>,
    /// Present with protocol 4 and parallel streaming.
    pub abort_timestamp: Option<i64>,
}

/// `b`: start of a prepared transaction (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare timestamp of the transaction.
    pub prepare_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
    /// User-defined GID of the prepared transaction.
    pub gid: Text,
}

/// `P`: a transaction was prepared (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare timestamp of the transaction.
    pub prepare_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
    /// User-defined GID of the prepared transaction.
    pub gid: Text,
}

/// `K`: a prepared transaction committed (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the commit of the prepared transaction.
    pub commit_lsn: Lsn,
    /// End LSN of the commit of the prepared transaction.
    pub end_lsn: Lsn,
    /// Commit timestamp of the transaction.
    pub commit_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
    /// User-defined GID of the prepared transaction.
    pub gid: Text,
}

/// `r`: a prepared transaction rolled back (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// End LSN of the prepared transaction.
    pub prepare_end_lsn: Lsn,
    /// End LSN of the rollback of the prepared transaction.
    pub rollback_end_lsn: Lsn,
    /// Prepare timestamp of the transaction.
    pub prepare_timestamp: i64,
    /// Rollback timestamp of the transaction.
    pub rollback_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
    /// User-defined GID of the prepared transaction.
    pub gid: Text,
}

/// `p`: a streamed transaction was prepared (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPrepare {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare timestamp of the transaction.
    pub prepare_timestamp: i64,
    /// Xid of the transaction.
    pub xid: Xid,
    /// User-defined GID of the prepared transaction.
    pub gid: Text,
}
