#![allow(clippy::unwrap_used)]
//! Property tests: generated messages encoded by the test-only encoder decode back to the
//! same value, outside and inside streamed blocks, for every protocol version that has them.

mod common;

use bytes::Bytes;
use common::encode::encode;
use pgoutput::{
    parse, Begin, BeginPrepare, Column, Commit, CommitPrepared, Decoder, DecoderOptions, Delete,
    Insert, LogicalMessage, Lsn, Message, OldTuple, Origin, Prepare, Relation, RelationColumn,
    ReplicaIdentity, RollbackPrepared, StreamAbort, StreamCommit, StreamPrepare, StreamStart, Text,
    Truncate, TupleData, Type, Update,
};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = Text> {
    "[^\\x00]{0,12}".prop_map(|s| Text::new(Bytes::from(s)).unwrap())
}

fn raw() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn column() -> impl Strategy<Value = Column> {
    prop_oneof![
        Just(Column::Null),
        Just(Column::UnchangedToast),
        raw().prop_map(Column::Text),
        raw().prop_map(Column::Binary),
    ]
}

fn tuple() -> impl Strategy<Value = TupleData> {
    vec(column(), 0..6).prop_map(|columns| TupleData { columns })
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn replica_identity() -> impl Strategy<Value = ReplicaIdentity> {
    prop_oneof![
        Just(ReplicaIdentity::Default),
        Just(ReplicaIdentity::Nothing),
        Just(ReplicaIdentity::Full),
        Just(ReplicaIdentity::Index),
    ]
}

fn relation_column() -> impl Strategy<Value = RelationColumn> {
    (any::<u8>(), text(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| RelationColumn {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

/// Messages that may appear inside a streamed block too; `xid` is the streamed transaction's
/// xid inside a block and `None` outside.
fn change(xid: Option<u32>) -> BoxedStrategy<Message> {
    prop_oneof![
        (lsn(), text()).prop_map(|(commit_lsn, name)| Message::Origin(Origin { commit_lsn, name })),
        (
            any::<u32>(),
            text(),
            text(),
            replica_identity(),
            vec(relation_column(), 0..5)
        )
            .prop_map(move |(id, namespace, name, replica_identity, columns)| {
                Message::Relation(Relation {
                    xid,
                    id,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (any::<u32>(), text(), text()).prop_map(move |(id, namespace, name)| Message::Type(Type {
            xid,
            id,
            namespace,
            name
        })),
        (any::<u32>(), tuple()).prop_map(move |(relation_id, new)| Message::Insert(Insert {
            xid,
            relation_id,
            new
        })),
        (any::<u32>(), option::of(old_tuple()), tuple()).prop_map(
            move |(relation_id, old, new)| {
                Message::Update(Update {
                    xid,
                    relation_id,
                    old,
                    new,
                })
            }
        ),
        (any::<u32>(), old_tuple()).prop_map(move |(relation_id, old)| Message::Delete(Delete {
            xid,
            relation_id,
            old
        })),
        (any::<u8>(), vec(any::<u32>(), 0..6)).prop_map(move |(options, relation_ids)| {
            Message::Truncate(Truncate {
                xid,
                options,
                relation_ids,
            })
        }),
        (any::<u8>(), lsn(), text(), raw()).prop_map(move |(flags, lsn, prefix, content)| {
            Message::LogicalMessage(LogicalMessage {
                xid,
                flags,
                lsn,
                prefix,
                content,
            })
        }),
    ]
    .boxed()
}

/// Messages that only appear outside a streamed block (Stream Abort in its short form).
fn control() -> BoxedStrategy<Message> {
    prop_oneof![
        (lsn(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_timestamp, xid)| {
            Message::Begin(Begin {
                final_lsn,
                commit_timestamp,
                xid,
            })
        }),
        (any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_timestamp)| Message::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_timestamp
            })
        ),
        (any::<u32>(), any::<bool>()).prop_map(|(xid, first_segment)| Message::StreamStart(
            StreamStart { xid, first_segment }
        )),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(
            |(xid, flags, commit_lsn, end_lsn, commit_timestamp)| Message::StreamCommit(
                StreamCommit {
                    xid,
                    flags,
                    commit_lsn,
                    end_lsn,
                    commit_timestamp
                }
            )
        ),
        (any::<u32>(), any::<u32>()).prop_map(|(xid, subxid)| Message::StreamAbort(StreamAbort {
            xid,
            subxid,
            abort_lsn: None,
            abort_timestamp: None
        })),
        (lsn(), lsn(), any::<i64>(), any::<u32>(), text()).prop_map(
            |(prepare_lsn, end_lsn, prepare_timestamp, xid, gid)| Message::BeginPrepare(
                BeginPrepare {
                    prepare_lsn,
                    end_lsn,
                    prepare_timestamp,
                    xid,
                    gid
                }
            )
        ),
        (
            any::<u8>(),
            lsn(),
            lsn(),
            any::<i64>(),
            any::<u32>(),
            text()
        )
            .prop_map(
                |(flags, prepare_lsn, end_lsn, prepare_timestamp, xid, gid)| Message::Prepare(
                    Prepare {
                        flags,
                        prepare_lsn,
                        end_lsn,
                        prepare_timestamp,
                        xid,
                        gid
                    }
                )
            ),
        (
            any::<u8>(),
            lsn(),
            lsn(),
            any::<i64>(),
            any::<u32>(),
            text()
        )
            .prop_map(|(flags, commit_lsn, end_lsn, commit_timestamp, xid, gid)| {
                Message::CommitPrepared(CommitPrepared {
                    flags,
                    commit_lsn,
                    end_lsn,
                    commit_timestamp,
                    xid,
                    gid,
                })
            }),
        (
            any::<u8>(),
            lsn(),
            lsn(),
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
            text()
        )
            .prop_map(
                |(
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_timestamp,
                    rollback_timestamp,
                    xid,
                    gid,
                )| Message::RollbackPrepared(RollbackPrepared {
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_timestamp,
                    rollback_timestamp,
                    xid,
                    gid
                })
            ),
        (
            any::<u8>(),
            lsn(),
            lsn(),
            any::<i64>(),
            any::<u32>(),
            text()
        )
            .prop_map(
                |(flags, prepare_lsn, end_lsn, prepare_timestamp, xid, gid)| Message::StreamPrepare(
                    StreamPrepare {
                        flags,
                        prepare_lsn,
                        end_lsn,
                        prepare_timestamp,
                        xid,
                        gid
                    }
                )
            ),
    ]
    .boxed()
}

/// The lowest protocol version that has the message.
fn min_version(m: &Message) -> u32 {
    match m {
        Message::StreamStart(_)
        | Message::StreamStop
        | Message::StreamCommit(_)
        | Message::StreamAbort(_) => 2,
        Message::BeginPrepare(_)
        | Message::Prepare(_)
        | Message::CommitPrepared(_)
        | Message::RollbackPrepared(_)
        | Message::StreamPrepare(_) => 3,
        _ => 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn outside_a_block_parse_inverts_encode(m in prop_oneof![change(None), control()]) {
        let bytes = encode(&m);
        prop_assert_eq!(parse(&bytes), Ok(m.clone()));
        // A decoder of any protocol version that has the message agrees; older ones refuse it.
        for protocol_version in 1..=4 {
            let mut d = Decoder::new(DecoderOptions { protocol_version, parallel_streaming: false });
            let decoded = d.decode(&bytes);
            if protocol_version >= min_version(&m) {
                prop_assert_eq!(decoded, Ok(m.clone()));
            } else {
                let is_unexpected = matches!(decoded, Err(pgoutput::DecodeError::Unexpected { .. }));
                prop_assert!(is_unexpected);
            }
        }
    }

    #[test]
    fn inside_a_block_decode_inverts_encode(
        protocol_version in 2u32..=4,
        parallel_streaming in any::<bool>(),
        (xid, changes) in any::<u32>().prop_flat_map(|xid| (Just(xid), vec(change(Some(xid)), 0..8))),
        first_segment in any::<bool>(),
        subxid in any::<u32>(),
        abort_lsn in lsn(),
        abort_timestamp in any::<i64>(),
    ) {
        let options = DecoderOptions { protocol_version, parallel_streaming };
        let mut d = Decoder::new(options);
        let start = Message::StreamStart(StreamStart { xid, first_segment });
        prop_assert_eq!(d.decode(&encode(&start)), Ok(start));
        prop_assert!(d.state().in_stream);
        for m in &changes {
            prop_assert_eq!(d.decode(&encode(m)), Ok(m.clone()));
            prop_assert!(d.state().in_stream);
        }
        prop_assert_eq!(d.decode(&encode(&Message::StreamStop)), Ok(Message::StreamStop));
        prop_assert!(!d.state().in_stream);

        let with_info = protocol_version >= 4 && parallel_streaming;
        let abort = Message::StreamAbort(StreamAbort {
            xid,
            subxid,
            abort_lsn: with_info.then_some(abort_lsn),
            abort_timestamp: with_info.then_some(abort_timestamp),
        });
        prop_assert_eq!(d.decode(&encode(&abort)), Ok(abort));
    }

    #[test]
    fn re_encoding_a_decoded_message_gives_the_same_bytes(m in prop_oneof![change(None), control()]) {
        let bytes = encode(&m);
        let decoded = parse(&bytes).unwrap();
        prop_assert_eq!(encode(&decoded), bytes);
    }
}

#[test]
fn fixture_messages_re_encode_to_the_captured_bytes() {
    for name in common::FIXTURES {
        let fixture = common::Fixture::load(name);
        for (m, bytes) in fixture.decode_all().iter().zip(&fixture.messages) {
            assert_eq!(&encode(m), bytes, "{name}: {m:?}");
        }
    }
}
