//! The message kinds of the protocol: their tag bytes, names, the protocol version that
//! introduced them and where in the stream they may appear.
//!
//! # Invariants
//! - [`Kind::from_tag`] and [`Kind::tag`] are inverse for every kind.
//! - The tag table is the single place that maps tag bytes to kinds.

use crate::Message;

/// Where a message may appear relative to a Stream Start / Stream Stop block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Only outside a streamed block.
    Outside,
    /// Only inside a streamed block.
    Inside,
    /// Both; inside a block the message carries the streamed transaction's xid.
    Anywhere,
}

/// One kind of pgoutput message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Begin,
    Commit,
    Origin,
    Relation,
    Type,
    Insert,
    Update,
    Delete,
    Truncate,
    LogicalMessage,
    StreamStart,
    StreamStop,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    StreamPrepare,
}

impl Kind {
    /// The kind a tag byte names, if any.
    pub(crate) fn from_tag(tag: u8) -> Option<Kind> {
        Some(match tag {
            b'B' => Kind::Begin,
            b'C' => Kind::Commit,
            b'O' => Kind::Origin,
            b'R' => Kind::Relation,
            b'Y' => Kind::Type,
            b'I' => Kind::Insert,
            b'U' => Kind::Update,
            b'D' => Kind::Delete,
            b'T' => Kind::Truncate,
            b'M' => Kind::LogicalMessage,
            b'S' => Kind::StreamStart,
            b'E' => Kind::StreamStop,
            b'c' => Kind::StreamCommit,
            b'A' => Kind::StreamAbort,
            b'b' => Kind::BeginPrepare,
            b'P' => Kind::Prepare,
            b'K' => Kind::CommitPrepared,
            b'r' => Kind::RollbackPrepared,
            b'p' => Kind::StreamPrepare,
            _ => return None,
        })
    }

    /// The kind of a decoded message.
    pub(crate) fn of(message: &Message) -> Kind {
        match message {
            Message::Begin(_) => Kind::Begin,
            Message::Commit(_) => Kind::Commit,
            Message::Origin(_) => Kind::Origin,
            Message::Relation(_) => Kind::Relation,
            Message::Type(_) => Kind::Type,
            Message::Insert(_) => Kind::Insert,
            Message::Update(_) => Kind::Update,
            Message::Delete(_) => Kind::Delete,
            Message::Truncate(_) => Kind::Truncate,
            Message::LogicalMessage(_) => Kind::LogicalMessage,
            Message::StreamStart(_) => Kind::StreamStart,
            Message::StreamStop => Kind::StreamStop,
            Message::StreamCommit(_) => Kind::StreamCommit,
            Message::StreamAbort(_) => Kind::StreamAbort,
            Message::BeginPrepare(_) => Kind::BeginPrepare,
            Message::Prepare(_) => Kind::Prepare,
            Message::CommitPrepared(_) => Kind::CommitPrepared,
            Message::RollbackPrepared(_) => Kind::RollbackPrepared,
            Message::StreamPrepare(_) => Kind::StreamPrepare,
        }
    }

    /// The tag byte that starts messages of this kind.
    pub(crate) fn tag(self) -> u8 {
        match self {
            Kind::Begin => b'B',
            Kind::Commit => b'C',
            Kind::Origin => b'O',
            Kind::Relation => b'R',
            Kind::Type => b'Y',
            Kind::Insert => b'I',
            Kind::Update => b'U',
            Kind::Delete => b'D',
            Kind::Truncate => b'T',
            Kind::LogicalMessage => b'M',
            Kind::StreamStart => b'S',
            Kind::StreamStop => b'E',
            Kind::StreamCommit => b'c',
            Kind::StreamAbort => b'A',
            Kind::BeginPrepare => b'b',
            Kind::Prepare => b'P',
            Kind::CommitPrepared => b'K',
            Kind::RollbackPrepared => b'r',
            Kind::StreamPrepare => b'p',
        }
    }

    /// The name the PostgreSQL documentation gives the message.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Begin => "Begin",
            Kind::Commit => "Commit",
            Kind::Origin => "Origin",
            Kind::Relation => "Relation",
            Kind::Type => "Type",
            Kind::Insert => "Insert",
            Kind::Update => "Update",
            Kind::Delete => "Delete",
            Kind::Truncate => "Truncate",
            Kind::LogicalMessage => "Message",
            Kind::StreamStart => "Stream Start",
            Kind::StreamStop => "Stream Stop",
            Kind::StreamCommit => "Stream Commit",
            Kind::StreamAbort => "Stream Abort",
            Kind::BeginPrepare => "Begin Prepare",
            Kind::Prepare => "Prepare",
            Kind::CommitPrepared => "Commit Prepared",
            Kind::RollbackPrepared => "Rollback Prepared",
            Kind::StreamPrepare => "Stream Prepare",
        }
    }

    /// The first protocol version that has this message: 2 brought streaming, 3 two-phase
    /// commit.
    pub(crate) fn min_version(self) -> u32 {
        match self {
            Kind::StreamStart | Kind::StreamStop | Kind::StreamCommit | Kind::StreamAbort => 2,
            Kind::BeginPrepare
            | Kind::Prepare
            | Kind::CommitPrepared
            | Kind::RollbackPrepared
            | Kind::StreamPrepare => 3,
            _ => 1,
        }
    }

    /// Whether the message starts with the streamed transaction's xid inside a streamed block
    /// (protocol 2+). Origin may appear in a block too, but without an xid.
    pub(crate) fn carries_stream_xid(self) -> bool {
        matches!(
            self,
            Kind::Relation
                | Kind::Type
                | Kind::Insert
                | Kind::Update
                | Kind::Delete
                | Kind::Truncate
                | Kind::LogicalMessage
        )
    }

    /// Where the message may appear relative to a streamed block.
    pub(crate) fn placement(self) -> Placement {
        match self {
            Kind::Origin
            | Kind::Relation
            | Kind::Type
            | Kind::Insert
            | Kind::Update
            | Kind::Delete
            | Kind::Truncate
            | Kind::LogicalMessage => Placement::Anywhere,
            Kind::StreamStop => Placement::Inside,
            _ => Placement::Outside,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        let mut kinds = 0;
        for tag in 0..=u8::MAX {
            if let Some(kind) = Kind::from_tag(tag) {
                assert_eq!(kind.tag(), tag);
                kinds += 1;
            }
        }
        assert_eq!(kinds, 19);
    }
}
