//! The messages of the pgoutput protocol, versions 1 to 4.
//!
//! Field names follow the PostgreSQL documentation ("Logical Replication Message Formats").
//! Timestamps are microseconds since 2000-01-01 00:00:00 UTC, as on the wire.
//!
//! # Invariants
//! - Every `Bytes` and [`Text`] in a message is a slice of the buffer it was parsed from.

use crate::{Lsn, Text};
use bytes::Bytes;

/// A transaction id.
pub type Xid = u32;
/// A PostgreSQL object id.
pub type Oid = u32;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(Type),
    Insert(Insert),
    Update(Update),
    Delete(Delete),
    Truncate(Truncate),
    /// A message written by `pg_logical_emit_message`.
    LogicalMessage(LogicalMessage),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
    BeginPrepare(BeginPrepare),
    Prepare(Prepare),
    CommitPrepared(CommitPrepared),
    RollbackPrepared(RollbackPrepared),
    StreamPrepare(StreamPrepare),
}

/// `B`: start of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    pub commit_timestamp: i64,
    pub xid: Xid,
}

/// `C`: end of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End LSN of the commit record: the position to confirm once the transaction is handled.
    pub end_lsn: Lsn,
    pub commit_timestamp: i64,
}

/// `O`: the transaction came from another replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: Lsn,
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

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 1 set: the column is part of the key.
    pub flags: u8,
    pub name: Text,
    pub type_oid: Oid,
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
    pub id: Oid,
    /// Schema name; the empty string stands for `pg_catalog`.
    pub namespace: Text,
    pub name: Text,
    pub replica_identity: ReplicaIdentity,
    pub columns: Vec<RelationColumn>,
}

/// `Y`: describes a non-built-in data type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type {
    pub xid: Option<Xid>,
    pub id: Oid,
    pub namespace: Text,
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
    pub columns: Vec<Column>,
}

/// `I`: a row was inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub xid: Option<Xid>,
    pub relation_id: Oid,
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
    pub xid: Option<Xid>,
    pub relation_id: Oid,
    pub old: Option<OldTuple>,
    pub new: TupleData,
}

/// `D`: a row was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub xid: Option<Xid>,
    pub relation_id: Oid,
    pub old: OldTuple,
}

/// `T`: tables were truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub xid: Option<Xid>,
    /// Bit 1: `CASCADE`; bit 2: `RESTART IDENTITY`.
    pub options: u8,
    pub relation_ids: Vec<Oid>,
}

/// `M`: a message from `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage {
    pub xid: Option<Xid>,
    /// Bit 1 set: the message is transactional.
    pub flags: u8,
    pub lsn: Lsn,
    pub prefix: Text,
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
    pub xid: Xid,
    /// Whether this is the first block of that transaction.
    pub first_segment: bool,
}

/// `c`: a streamed transaction committed (protocol 2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: Xid,
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_timestamp: i64,
}

/// `A`: a streamed transaction (or subtransaction) aborted (protocol 2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: Xid,
    pub subxid: Xid,
    /// Present with protocol 4 and parallel streaming.
    pub abort_lsn: Option<Lsn>,
    /// Present with protocol 4 and parallel streaming.
    pub abort_timestamp: Option<i64>,
}

/// `b`: start of a prepared transaction (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_timestamp: i64,
    pub xid: Xid,
    pub gid: Text,
}

/// `P`: a transaction was prepared (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_timestamp: i64,
    pub xid: Xid,
    pub gid: Text,
}

/// `K`: a prepared transaction committed (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_timestamp: i64,
    pub xid: Xid,
    pub gid: Text,
}

/// `r`: a prepared transaction rolled back (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    pub flags: u8,
    pub prepare_end_lsn: Lsn,
    pub rollback_end_lsn: Lsn,
    pub prepare_timestamp: i64,
    pub rollback_timestamp: i64,
    pub xid: Xid,
    pub gid: Text,
}

/// `p`: a streamed transaction was prepared (protocol 3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPrepare {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_timestamp: i64,
    pub xid: Xid,
    pub gid: Text,
}
