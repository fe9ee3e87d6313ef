//! Transaction assembly: the sans-IO core between the wire and the pipeline.
//!
//! Takes what the replication connection delivers (transaction boundaries, pgoutput payloads,
//! keepalives) and produces [`SourceEvent`]s, keeping the relation cache on the way.
//!
//! # Invariants
//! - A [`SourceEvent::Change`] is only produced inside an open transaction, and always carries
//!   the relation it refers to.
//! - The relation cache holds only what the pipeline still needs: a relation stays from its
//!   `Relation` message until the pipeline says it does not need it ([`Assembler::forget`]:
//!   not an outbox table, nor a partition of one). So the cache is bounded by the outbox tables
//!   and their partitions, not by every table a `FOR ALL TABLES` publication ever describes.
//!   pgoutput describes a relation before its first change in a session (and again after its
//!   definition changes), so a change of a relation not in the cache is one of a forgotten
//!   relation: a [`SourceEvent::OtherTableChange`], never a row of an outbox table.
//! - A Delete comes as a [`SourceEvent::OutboxDelete`] only for a relation the pipeline said it
//!   skips every DELETE of ([`Assembler::skip_deletes`]) since pgoutput last described it: a
//!   new description, or forgetting the relation, ends that. Its old row is checked as every
//!   message is (a malformed one is [`AssemblyError::Unhandled`] as before) but never built.
//! - [`SourceEvent::Idle`] is only produced outside a transaction: its `wal_end` is then safe to
//!   confirm once everything before it is delivered.
//! - Framing errors (a change outside a transaction, a Begin inside one) are errors, never
//!   skipped. A message Siphon cannot use (two-phase, streaming, unknown or undecodable) is an
//!   [`AssemblyError::Unhandled`] carrying the message, which the source turns into a definite
//!   error naming what to change: it would come again after a reconnect.
//! - Errors are typed values; their text is rendered only by `Display`.
//! - What is kept for the whole session (relations) owns its bytes: it never keeps the buffer
//!   its message was received into alive.

use bytes::Bytes;
use pgoutput::{
    DecodeError, Decoded, Decoder, DecoderOptions, Lsn, Message, Oid, OldTuple, Relation,
    TupleData, Xid,
};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A row change of a table in the publication.
#[derive(Debug, Clone, PartialEq)]
pub enum RowChange {
    Insert(TupleData),
    Update {
        old: Option<OldTuple>,
        new: TupleData,
    },
    Delete(OldTuple),
}

/// What the source hands to the pipeline, in WAL order.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceEvent {
    /// A transaction starts.
    Begin {
        xid: Xid,
        final_lsn: Lsn,
        commit_time_us: i64,
    },
    /// A table was described (first use in this session, or its definition changed).
    Relation(Arc<Relation>),
    /// A row changed; `lsn` is the WAL position of the change.
    Change {
        relation: Arc<Relation>,
        change: RowChange,
        lsn: Lsn,
    },
    /// A row of a relation whose description is not kept ([`Assembler::forget`]: not an outbox
    /// table) changed at `lsn`.
    OtherTableChange { relation_id: Oid, lsn: Lsn },
    /// A row of a relation whose DELETEs the pipeline skips ([`Assembler::skip_deletes`]: a
    /// bound outbox table) was deleted at `lsn`; its old row was checked, not decoded.
    OutboxDelete { relation_id: Oid, lsn: Lsn },
    /// The transaction ends; `end_lsn` is the position to confirm once it is delivered.
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time_us: i64,
    },
    /// The server has sent everything up to `wal_end` and no transaction is open.
    Idle { wal_end: Lsn },
    /// A logical decoding message (`pg_logical_emit_message`): a transactional one comes
    /// between the Begin and Commit of its transaction, in WAL order with its rows.
    Message {
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: Bytes,
    },
}

/// A relation description the pipeline still needs.
#[derive(Debug)]
struct Kept {
    relation: Arc<Relation>,
    /// The pipeline skips every DELETE of the relation: its Delete messages are skimmed.
    deletes_skipped: bool,
}

#[derive(Debug, Clone, Copy)]
struct OpenTransaction {
    xid: Xid,
    final_lsn: Lsn,
}

/// Why the stream's messages do not fit together, or cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssemblyError {
    #[error("Begin of transaction {xid} while transaction {open_xid} (final LSN {open_final_lsn}) is still open")]
    BeginInTransaction {
        xid: Xid,
        open_xid: Xid,
        open_final_lsn: Lsn,
    },
    #[error("Commit at {commit_lsn} without a transaction")]
    CommitWithoutTransaction { commit_lsn: Lsn },
    #[error("Commit at {commit_lsn} does not match the Begin of transaction {open_xid} (final LSN {open_final_lsn})")]
    CommitMismatch {
        commit_lsn: Lsn,
        open_xid: Xid,
        open_final_lsn: Lsn,
    },
    #[error("transactional logical message at {lsn} outside a transaction")]
    MessageOutsideTransaction { lsn: Lsn },
    #[error("row change of relation {relation_id} outside a transaction")]
    ChangeOutsideTransaction { relation_id: Oid },
    /// A message Siphon cannot use (two-phase, streaming, unknown), or one that does not
    /// decode (`decode`): the payload is kept for the error naming the fix.
    #[error("pgoutput message at {lsn} cannot be used")]
    Unhandled {
        payload: Bytes,
        lsn: Lsn,
        decode: Option<DecodeError>,
    },
}

/// The assembly state machine.
#[derive(Debug)]
pub struct Assembler {
    decoder: Decoder,
    /// Keyed by OID with an integer hasher: one lookup per row change. Only the relations the
    /// pipeline has not forgotten (see the module's invariants).
    relations: FxHashMap<Oid, Kept>,
    open: Option<OpenTransaction>,
}

impl Default for Assembler {
    fn default() -> Self {
        Self::new()
    }
}

impl Assembler {
    /// A fresh assembler for a session using pgoutput protocol version 1.
    pub fn new() -> Self {
        Assembler {
            decoder: Decoder::new(DecoderOptions {
                protocol_version: 1,
                parallel_streaming: false,
            }),
            relations: FxHashMap::default(),
            open: None,
        }
    }

    /// Whether a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// The pipeline does not need relation `relation` (not an outbox table): its description is
    /// dropped, and its changes come as [`SourceEvent::OtherTableChange`] until pgoutput
    /// describes it again.
    pub fn forget(&mut self, relation: Oid) {
        self.relations.remove(&relation);
    }

    /// The pipeline skips every DELETE of relation `relation` (an outbox table it bound): until
    /// pgoutput describes the relation again (or the pipeline forgets it), its Delete messages
    /// come as [`SourceEvent::OutboxDelete`], their old row checked but not decoded. A relation
    /// not kept is left as it is.
    pub fn skip_deletes(&mut self, relation: Oid) {
        if let Some(kept) = self.relations.get_mut(&relation) {
            kept.deletes_skipped = true;
        }
    }

    /// How many relation descriptions are kept.
    pub fn cached_relations(&self) -> usize {
        self.relations.len()
    }

    /// A transaction starts.
    pub fn begin(
        &mut self,
        xid: Xid,
        final_lsn: Lsn,
        commit_time_us: i64,
    ) -> Result<SourceEvent, AssemblyError> {
        if let Some(open) = self.open {
            return Err(AssemblyError::BeginInTransaction {
                xid,
                open_xid: open.xid,
                open_final_lsn: open.final_lsn,
            });
        }
        self.open = Some(OpenTransaction { xid, final_lsn });
        Ok(SourceEvent::Begin {
            xid,
            final_lsn,
            commit_time_us,
        })
    }

    /// The open transaction commits.
    pub fn commit(
        &mut self,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time_us: i64,
    ) -> Result<SourceEvent, AssemblyError> {
        let Some(open) = self.open.take() else {
            return Err(AssemblyError::CommitWithoutTransaction { commit_lsn });
        };
        if open.final_lsn != commit_lsn {
            return Err(AssemblyError::CommitMismatch {
                commit_lsn,
                open_xid: open.xid,
                open_final_lsn: open.final_lsn,
            });
        }
        Ok(SourceEvent::Commit {
            commit_lsn,
            end_lsn,
            commit_time_us,
        })
    }

    /// A logical decoding message; a transactional one must come inside its transaction.
    pub fn message(
        &mut self,
        transactional: bool,
        lsn: Lsn,
        prefix: &str,
        content: Bytes,
    ) -> Result<SourceEvent, AssemblyError> {
        if transactional && self.open.is_none() {
            return Err(AssemblyError::MessageOutsideTransaction { lsn });
        }
        Ok(SourceEvent::Message {
            transactional,
            lsn,
            prefix: prefix.to_owned(),
            content,
        })
    }

    /// The server reports its WAL end; yields [`SourceEvent::Idle`] outside transactions.
    pub fn keepalive(&mut self, wal_end: Lsn) -> Option<SourceEvent> {
        (self.open.is_none() && wal_end != Lsn::ZERO).then_some(SourceEvent::Idle { wal_end })
    }

    /// One pgoutput payload, which the server sent from WAL position `lsn`.
    pub fn data(
        &mut self,
        payload: &Bytes,
        lsn: Lsn,
    ) -> Result<Option<SourceEvent>, AssemblyError> {
        // Relations (and types) are decoded from their own copy: decoded from the payload, the
        // cached names would keep the whole receive buffer alive, one per table.
        let owned;
        let payload = if matches!(payload.first(), Some(b'R' | b'Y')) {
            owned = Bytes::copy_from_slice(payload);
            &owned
        } else {
            payload
        };
        let unhandled = |e| AssemblyError::Unhandled {
            payload: payload.clone(),
            lsn,
            decode: Some(e),
        };
        // A Delete is skimmed if the pipeline skips its relation's DELETEs; every other message
        // is decoded as it is, on the decoder's plain path.
        let message = if payload.first() == Some(&b'D') {
            let relations = &self.relations;
            let skim = |relation| {
                relations
                    .get(&relation)
                    .is_some_and(|kept| kept.deletes_skipped)
            };
            match self
                .decoder
                .decode_skimming(payload, skim)
                .map_err(unhandled)?
            {
                Decoded::Message(message) => message,
                Decoded::SkimmedDelete(delete) => {
                    return self.outbox_delete(delete.relation_id, lsn);
                }
            }
        } else {
            self.decoder.decode(payload).map_err(unhandled)?
        };
        match message {
            Message::Begin(b) => self.begin(b.xid, b.final_lsn, b.commit_timestamp).map(Some),
            Message::Commit(c) => self
                .commit(c.commit_lsn, c.end_lsn, c.commit_timestamp)
                .map(Some),
            Message::Relation(relation) => {
                let relation = Arc::new(relation);
                let kept = Kept {
                    relation: Arc::clone(&relation),
                    deletes_skipped: false,
                };
                self.relations.insert(relation.id, kept);
                Ok(Some(SourceEvent::Relation(relation)))
            }
            Message::Insert(insert) => {
                self.change(insert.relation_id, RowChange::Insert(insert.new), lsn)
            }
            Message::Update(update) => self.change(
                update.relation_id,
                RowChange::Update {
                    old: update.old,
                    new: update.new,
                },
                lsn,
            ),
            Message::Delete(delete) => {
                self.change(delete.relation_id, RowChange::Delete(delete.old), lsn)
            }
            Message::LogicalMessage(m) => self
                .message(m.is_transactional(), m.lsn, m.prefix.as_str(), m.content)
                .map(Some),
            // Types, origins and truncates carry no outbox rows.
            Message::Type(_) | Message::Origin(_) | Message::Truncate(_) => Ok(None),
            // Streaming and two-phase messages: the decoder refuses them for protocol 1.
            _ => Err(AssemblyError::Unhandled {
                payload: payload.clone(),
                lsn,
                decode: None,
            }),
        }
    }

    fn change(
        &mut self,
        relation_id: Oid,
        change: RowChange,
        lsn: Lsn,
    ) -> Result<Option<SourceEvent>, AssemblyError> {
        if self.open.is_none() {
            return Err(AssemblyError::ChangeOutsideTransaction { relation_id });
        }
        Ok(Some(match self.relations.get(&relation_id) {
            Some(kept) => SourceEvent::Change {
                relation: Arc::clone(&kept.relation),
                change,
                lsn,
            },
            None => SourceEvent::OtherTableChange { relation_id, lsn },
        }))
    }

    /// A skimmed Delete of `relation_id`, whose DELETEs the pipeline skips.
    fn outbox_delete(
        &mut self,
        relation_id: Oid,
        lsn: Lsn,
    ) -> Result<Option<SourceEvent>, AssemblyError> {
        if self.open.is_none() {
            return Err(AssemblyError::ChangeOutsideTransaction { relation_id });
        }
        Ok(Some(SourceEvent::OutboxDelete { relation_id, lsn }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_message(id: u32) -> Bytes {
        let mut b = vec![b'R'];
        b.extend(id.to_be_bytes());
        b.extend(b"public\0outbox\0");
        b.push(b'd');
        b.extend(1u16.to_be_bytes());
        b.push(1);
        b.extend(b"id\0");
        b.extend(2950u32.to_be_bytes());
        b.extend((-1i32).to_be_bytes());
        Bytes::from(b)
    }

    fn insert_message(id: u32, value: &[u8]) -> Bytes {
        let mut b = vec![b'I'];
        b.extend(id.to_be_bytes());
        b.push(b'N');
        b.extend(1u16.to_be_bytes());
        b.push(b't');
        b.extend((value.len() as u32).to_be_bytes());
        b.extend(value);
        Bytes::from(b)
    }

    fn delete_message(id: u32, key: &[u8]) -> Bytes {
        let mut b = vec![b'D'];
        b.extend(id.to_be_bytes());
        b.push(b'K');
        b.extend(1u16.to_be_bytes());
        b.push(b't');
        b.extend((key.len() as u32).to_be_bytes());
        b.extend(key);
        Bytes::from(b)
    }

    fn is_delete(event: Option<SourceEvent>, of: u32, key: &[u8]) -> bool {
        matches!(
            event,
            Some(SourceEvent::Change {
                relation,
                change: RowChange::Delete(OldTuple::Key(t)),
                ..
            }) if relation.id == of && t.columns == vec![pgoutput::Column::Text(Bytes::copy_from_slice(key))]
        )
    }

    /// The DELETEs of a relation the pipeline skips come without their old row, from
    /// `skip_deletes` until the relation is described again or forgotten; its inserts, and
    /// other relations' deletes, as before.
    #[test]
    fn deletes_of_a_relation_whose_deletes_are_skipped_come_without_their_row() {
        const OUTBOX: u32 = 16_384;
        const OTHER: u32 = 16_390;
        let mut a = Assembler::new();
        a.begin(7, Lsn(100), 1).unwrap();
        a.data(&relation_message(OUTBOX), Lsn(1)).unwrap();
        a.data(&relation_message(OTHER), Lsn(1)).unwrap();
        assert!(is_delete(
            a.data(&delete_message(OUTBOX, b"k1"), Lsn(2)).unwrap(),
            OUTBOX,
            b"k1"
        ));
        a.skip_deletes(OUTBOX);
        assert_eq!(
            a.data(&delete_message(OUTBOX, b"k2"), Lsn(3)).unwrap(),
            Some(SourceEvent::OutboxDelete {
                relation_id: OUTBOX,
                lsn: Lsn(3)
            })
        );
        assert!(matches!(
            a.data(&insert_message(OUTBOX, b"e"), Lsn(4)).unwrap(),
            Some(SourceEvent::Change {
                change: RowChange::Insert(_),
                ..
            })
        ));
        assert!(
            is_delete(
                a.data(&delete_message(OTHER, b"o"), Lsn(5)).unwrap(),
                OTHER,
                b"o"
            ),
            "another relation's deletes are decoded"
        );
        a.forget(OTHER);
        a.skip_deletes(OTHER);
        assert_eq!(
            a.data(&delete_message(OTHER, b"o"), Lsn(6)).unwrap(),
            Some(SourceEvent::OtherTableChange {
                relation_id: OTHER,
                lsn: Lsn(6)
            }),
            "a relation not kept is not marked"
        );
        // Described again: decoded until the pipeline says it skips them again.
        a.data(&relation_message(OUTBOX), Lsn(7)).unwrap();
        assert!(is_delete(
            a.data(&delete_message(OUTBOX, b"k3"), Lsn(8)).unwrap(),
            OUTBOX,
            b"k3"
        ));
        a.skip_deletes(OUTBOX);
        assert!(matches!(
            a.data(&delete_message(OUTBOX, b"k4"), Lsn(9)).unwrap(),
            Some(SourceEvent::OutboxDelete { .. })
        ));
        a.commit(Lsn(100), Lsn(108), 1).unwrap();
        assert_eq!(
            a.data(&delete_message(OUTBOX, b"k5"), Lsn(110)),
            Err(AssemblyError::ChangeOutsideTransaction {
                relation_id: OUTBOX
            }),
            "a skimmed delete is framed as any change"
        );
        // Forgotten: its deletes are another table's.
        a.begin(8, Lsn(200), 1).unwrap();
        a.forget(OUTBOX);
        assert_eq!(
            a.data(&delete_message(OUTBOX, b"k6"), Lsn(150)).unwrap(),
            Some(SourceEvent::OtherTableChange {
                relation_id: OUTBOX,
                lsn: Lsn(150)
            })
        );
    }

    /// A malformed Delete is refused with the decoder's error whether or not it is skimmed.
    #[test]
    fn a_malformed_skimmed_delete_is_refused_as_before() {
        const OUTBOX: u32 = 16_384;
        let malformed = {
            let mut trailing = delete_message(OUTBOX, b"k").to_vec();
            trailing.push(0);
            let mut kind = delete_message(OUTBOX, b"k").to_vec();
            kind[8] = b'x';
            let mut cut = delete_message(OUTBOX, b"key").to_vec();
            cut.pop();
            let mut marker = delete_message(OUTBOX, b"k").to_vec();
            marker[5] = b'N';
            [trailing, kind, cut, marker].map(Bytes::from)
        };
        for payload in malformed {
            let errors = [false, true].map(|skip| {
                let mut a = Assembler::new();
                a.begin(7, Lsn(100), 1).unwrap();
                a.data(&relation_message(OUTBOX), Lsn(1)).unwrap();
                if skip {
                    a.skip_deletes(OUTBOX);
                }
                a.data(&payload, Lsn(2))
            });
            assert!(
                matches!(
                    &errors[0],
                    Err(AssemblyError::Unhandled {
                        decode: Some(_),
                        ..
                    })
                ),
                "{payload:?}: {:?}",
                errors[0]
            );
            assert_eq!(errors[0], errors[1], "{payload:?}");
        }
    }

    /// A cached relation read from a large receive buffer keeps none of it: its names are
    /// copies, so the buffer is freed once the messages read from it are done with.
    #[test]
    fn a_cached_relation_does_not_share_the_receive_buffer() {
        let message = relation_message(42);
        let mut received = vec![0u8; 64 * 1024];
        received[1000..1000 + message.len()].copy_from_slice(&message);
        let received = Bytes::from(received);
        let payload = received.slice(1000..1000 + message.len());
        let mut a = Assembler::new();
        a.begin(7, Lsn(100), 1).unwrap();
        let Some(SourceEvent::Relation(relation)) = a.data(&payload, Lsn(1)).unwrap() else {
            panic!("a relation");
        };
        let range = received.as_ptr() as usize..received.as_ptr() as usize + received.len();
        let names = [
            &relation.namespace,
            &relation.name,
            &relation.columns[0].name,
        ];
        for name in names {
            let at = name.as_bytes().as_ptr() as usize;
            assert!(
                !range.contains(&at),
                "{name:?} is a slice of the receive buffer"
            );
        }
        assert_eq!(relation.name, "outbox");
    }

    #[test]
    fn a_transaction_yields_begin_relation_change_commit() {
        let mut a = Assembler::new();
        assert!(matches!(
            a.begin(7, Lsn(100), 1).unwrap(),
            SourceEvent::Begin { xid: 7, .. }
        ));
        assert!(matches!(
            a.data(&relation_message(42), Lsn(1)).unwrap(),
            Some(SourceEvent::Relation(_))
        ));
        match a.data(&insert_message(42, b"abc"), Lsn(2)).unwrap() {
            Some(SourceEvent::Change {
                relation,
                change: RowChange::Insert(t),
                lsn,
            }) => {
                assert_eq!(lsn, Lsn(2));
                assert_eq!(relation.name, "outbox");
                assert_eq!(
                    t.columns,
                    vec![pgoutput::Column::Text(Bytes::from_static(b"abc"))]
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            a.keepalive(Lsn(90)).is_none(),
            "no idle confirmation inside a transaction"
        );
        assert!(matches!(
            a.commit(Lsn(100), Lsn(108), 1).unwrap(),
            SourceEvent::Commit {
                end_lsn: Lsn(108),
                ..
            }
        ));
        assert_eq!(
            a.keepalive(Lsn(200)),
            Some(SourceEvent::Idle { wal_end: Lsn(200) })
        );
    }

    /// A `FOR ALL TABLES` publication describes every table written: 10,000 tables, each
    /// described and written once, leave only the outbox table's description behind once the
    /// pipeline forgets the others; their rows come as other tables' changes, the outbox's
    /// with its description.
    #[test]
    fn the_relation_cache_keeps_only_what_is_not_forgotten() {
        const OUTBOX: u32 = 16_384;
        let mut a = Assembler::new();
        a.data(&relation_message(OUTBOX), Lsn(1)).unwrap();
        for id in 20_000..30_000u32 {
            a.begin(id, Lsn(u64::from(id) * 10), 0).unwrap();
            let Some(SourceEvent::Relation(relation)) =
                a.data(&relation_message(id), Lsn(1)).unwrap()
            else {
                panic!("a relation");
            };
            assert!(matches!(
                a.data(&insert_message(id, b"x"), Lsn(2)).unwrap(),
                Some(SourceEvent::Change { .. })
            ));
            // The pipeline found it is no outbox table.
            a.forget(relation.id);
            assert_eq!(
                a.data(&insert_message(id, b"y"), Lsn(3)).unwrap(),
                Some(SourceEvent::OtherTableChange {
                    relation_id: id,
                    lsn: Lsn(3)
                })
            );
            assert!(matches!(
                a.data(&insert_message(OUTBOX, b"e"), Lsn(4)).unwrap(),
                Some(SourceEvent::Change { relation, .. }) if relation.id == OUTBOX
            ));
            a.commit(Lsn(u64::from(id) * 10), Lsn(u64::from(id) * 10 + 8), 0)
                .unwrap();
            assert!(a.cached_relations() <= 2, "{}", a.cached_relations());
        }
        assert_eq!(a.cached_relations(), 1, "the outbox table's description");
        // Described again (its definition changed), a forgotten table is kept again.
        a.begin(1, Lsn(5), 0).unwrap();
        a.data(&relation_message(20_000), Lsn(1)).unwrap();
        assert!(matches!(
            a.data(&insert_message(20_000, b"x"), Lsn(2)).unwrap(),
            Some(SourceEvent::Change { .. })
        ));
    }

    #[test]
    fn framing_errors_are_reported() {
        let mut a = Assembler::new();
        assert!(a.commit(Lsn(1), Lsn(2), 0).is_err());
        assert!(
            a.data(&relation_message(1), Lsn(1)).unwrap().is_some(),
            "relations may arrive outside transactions"
        );
        assert!(
            a.data(&insert_message(1, b"x"), Lsn(1)).is_err(),
            "change outside a transaction"
        );
        a.begin(1, Lsn(10), 0).unwrap();
        assert!(a.begin(2, Lsn(20), 0).is_err());
        assert_eq!(
            a.data(&insert_message(99, b"x"), Lsn(1)).unwrap(),
            Some(SourceEvent::OtherTableChange {
                relation_id: 99,
                lsn: Lsn(1)
            }),
            "a relation not kept"
        );
        assert!(
            a.commit(Lsn(11), Lsn(12), 0).is_err(),
            "commit LSN must match begin"
        );
    }
}
