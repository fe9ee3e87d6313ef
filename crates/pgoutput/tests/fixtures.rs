//! Decodes the messages captured from a real PostgreSQL 15 server
//! (scripts/capture-pgoutput-fixtures.sh) and checks their exact contents.

mod common;

use bytes::Bytes;
use common::{Fixture, FIXTURES};
use pgoutput::{Column, Commit, Lsn, Message, OldTuple, Relation, ReplicaIdentity, TupleData};

/// Extracts the payload of one message variant or fails the test.
macro_rules! expect {
    ($message:expr, $variant:ident) => {
        match &$message {
            Message::$variant(inner) => inner,
            other => panic!("expected {}, got {other:?}", stringify!($variant)),
        }
    };
}

/// 2020-01-01 00:00:00 UTC in microseconds since 2000-01-01.
const YEAR_2020: i64 = 631_152_000_000_000;

fn text(v: &str) -> Column {
    Column::Text(Bytes::copy_from_slice(v.as_bytes()))
}

fn tuple(columns: Vec<Column>) -> TupleData {
    TupleData { columns }
}

fn tags(messages: &[Message]) -> String {
    messages.iter().map(|m| char::from(m.tag())).collect()
}

fn column_names(relation: &Relation) -> Vec<&str> {
    relation.columns.iter().map(|c| c.name.as_str()).collect()
}

fn check_commit(begin_final_lsn: Lsn, begin_ts: i64, commit: &Commit) {
    assert_eq!(commit.flags, 0);
    assert_eq!(commit.commit_lsn, begin_final_lsn);
    assert!(commit.end_lsn > commit.commit_lsn);
    assert_eq!(commit.commit_timestamp, begin_ts);
}

#[test]
fn every_fixture_decodes_and_leaves_no_open_stream() {
    for name in FIXTURES {
        let fixture = Fixture::load(name);
        let decoded = fixture.decode_all();
        assert_eq!(decoded.len(), fixture.messages.len());
        let mut decoder = pgoutput::Decoder::new(fixture.options);
        for m in &fixture.messages {
            decoder.decode(m).unwrap();
        }
        assert!(!decoder.state().in_stream, "{name} ends inside a stream");
    }
}

#[test]
fn basic_insert_update_delete() {
    let m = Fixture::load("basic").decode_all();
    assert_eq!(tags(&m), "BYRICBUCBUCBDC");

    let begin = expect!(m[0], Begin);
    assert!(begin.commit_timestamp > YEAR_2020);
    let ty = expect!(m[1], Type);
    assert_eq!(ty.xid, None);
    assert_eq!(ty.namespace, "app");
    assert_eq!(ty.name, "mood");

    let rel = expect!(m[2], Relation);
    assert_eq!(rel.xid, None);
    assert_eq!(rel.namespace, "public");
    assert_eq!(rel.name, "items");
    assert_eq!(rel.replica_identity, ReplicaIdentity::Default);
    assert_eq!(column_names(rel), ["id", "name", "note", "mood", "qty"]);
    let key: Vec<bool> = rel.columns.iter().map(|c| c.is_key()).collect();
    assert_eq!(key, [true, false, false, false, false]);
    let oids: Vec<u32> = rel.columns.iter().map(|c| c.type_oid).collect();
    assert_eq!(oids, [23, 25, 25, ty.id, 20]);
    assert!(rel.columns.iter().all(|c| c.type_modifier == -1));

    let insert = expect!(m[3], Insert);
    assert_eq!(insert.xid, None);
    assert_eq!(insert.relation_id, rel.id);
    assert_eq!(
        insert.new,
        tuple(vec![
            text("1"),
            text("hello"),
            Column::Null,
            text("happy"),
            text("42")
        ])
    );
    check_commit(
        begin.final_lsn,
        begin.commit_timestamp,
        expect!(m[4], Commit),
    );

    // UPDATE that leaves the key alone: no old tuple.
    let begin2 = expect!(m[5], Begin);
    assert!(begin2.xid > begin.xid);
    assert!(begin2.final_lsn > expect!(m[4], Commit).end_lsn);
    let update = expect!(m[6], Update);
    assert_eq!(update.relation_id, rel.id);
    assert_eq!(update.old, None);
    assert_eq!(
        update.new,
        tuple(vec![
            text("1"),
            text("hello"),
            Column::Null,
            text("happy"),
            text("43")
        ])
    );
    check_commit(
        begin2.final_lsn,
        begin2.commit_timestamp,
        expect!(m[7], Commit),
    );

    // UPDATE of the key: old key tuple K with the non-key columns null.
    let begin3 = expect!(m[8], Begin);
    assert!(begin3.xid > begin2.xid);
    let update = expect!(m[9], Update);
    assert_eq!(
        update.old,
        Some(OldTuple::Key(tuple(vec![
            text("1"),
            Column::Null,
            Column::Null,
            Column::Null,
            Column::Null
        ])))
    );
    assert_eq!(update.new.columns[0], text("2"));
    check_commit(
        begin3.final_lsn,
        begin3.commit_timestamp,
        expect!(m[10], Commit),
    );

    let begin4 = expect!(m[11], Begin);
    assert!(begin4.xid > begin3.xid);
    let delete = expect!(m[12], Delete);
    assert_eq!(delete.xid, None);
    assert_eq!(delete.relation_id, rel.id);
    assert_eq!(
        delete.old,
        OldTuple::Key(tuple(vec![
            text("2"),
            Column::Null,
            Column::Null,
            Column::Null,
            Column::Null
        ]))
    );
    check_commit(
        begin4.final_lsn,
        begin4.commit_timestamp,
        expect!(m[13], Commit),
    );
}

#[test]
fn replica_identities_full_index_nothing() {
    let m = Fixture::load("identity").decode_all();
    assert_eq!(tags(&m), "BRICBUCBDCBRICBUCBRIC");

    let full = expect!(m[1], Relation);
    assert_eq!(full.name, "full_rows");
    assert_eq!(full.replica_identity, ReplicaIdentity::Full);
    // With REPLICA IDENTITY FULL every column is flagged as part of the key.
    assert!(full.columns.iter().all(|c| c.is_key()));
    let update = expect!(m[5], Update);
    assert_eq!(update.relation_id, full.id);
    assert_eq!(
        update.old,
        Some(OldTuple::Full(tuple(vec![text("1"), text("before")])))
    );
    assert_eq!(update.new, tuple(vec![text("1"), text("after")]));
    let delete = expect!(m[8], Delete);
    assert_eq!(
        delete.old,
        OldTuple::Full(tuple(vec![text("1"), text("after")]))
    );

    let by_index = expect!(m[11], Relation);
    assert_eq!(by_index.name, "by_index");
    assert_eq!(by_index.replica_identity, ReplicaIdentity::Index);
    assert_eq!(column_names(by_index), ["a", "b"]);
    assert!(by_index.columns[0].is_key() && !by_index.columns[1].is_key());
    let update = expect!(m[15], Update);
    assert_eq!(update.relation_id, by_index.id);
    assert_eq!(
        update.old,
        Some(OldTuple::Key(tuple(vec![text("10"), Column::Null])))
    );
    assert_eq!(update.new, tuple(vec![text("11"), text("ten")]));

    let nothing = expect!(m[18], Relation);
    assert_eq!(nothing.name, "log_only");
    assert_eq!(nothing.replica_identity, ReplicaIdentity::Nothing);
    assert!(!nothing.columns[0].is_key());
    assert_eq!(
        expect!(m[19], Insert).new,
        tuple(vec![text("only inserts")])
    );
}

#[test]
fn unchanged_toast_column() {
    let fixture = Fixture::load("toast");
    let m = fixture.decode_all();
    assert_eq!(tags(&m), "BRICBUC");
    let rel = expect!(m[1], Relation);
    assert_eq!(column_names(rel), ["id", "title", "body"]);
    let body = "0123456789".repeat(300);
    assert_eq!(
        expect!(m[2], Insert).new,
        tuple(vec![text("1"), text("v1"), text(&body)])
    );
    let update = expect!(m[5], Update);
    assert_eq!(update.old, None);
    assert_eq!(
        update.new,
        tuple(vec![text("1"), text("v2"), Column::UnchangedToast])
    );

    // Zero copy: the long value is a slice of the message buffer.
    let Column::Text(value) = &expect!(m[2], Insert).new.columns[2] else {
        panic!("text column expected");
    };
    let buf = &fixture.messages[2];
    let start = value.as_ptr() as usize - buf.as_ptr() as usize;
    assert!(start + value.len() <= buf.len());
}

#[test]
fn truncate_options_and_relations() {
    let m = Fixture::load("truncate").decode_all();
    assert_eq!(tags(&m), "BRRTCBRTC");
    let a = expect!(m[1], Relation);
    let b = expect!(m[2], Relation);
    assert_eq!((a.name.as_str(), b.name.as_str()), ("trunc_a", "trunc_b"));
    let t = expect!(m[3], Truncate);
    assert_eq!(t.xid, None);
    assert_eq!(t.options, 0);
    assert_eq!(t.relation_ids, [a.id, b.id]);
    let t = expect!(m[7], Truncate);
    // CASCADE (1) | RESTART IDENTITY (2)
    assert_eq!(t.options, 3);
    assert_eq!(t.relation_ids, [a.id]);
}

#[test]
fn logical_messages_transactional_and_not() {
    let m = Fixture::load("messages").decode_all();
    assert_eq!(tags(&m), "BMCM");
    let begin = expect!(m[0], Begin);
    let tx = expect!(m[1], LogicalMessage);
    assert!(tx.is_transactional());
    assert_eq!(tx.flags, 1);
    assert_eq!(tx.xid, None);
    assert_eq!(tx.prefix, "siphon");
    assert_eq!(&tx.content[..], b"hello");
    assert!(tx.lsn <= begin.final_lsn);
    check_commit(
        begin.final_lsn,
        begin.commit_timestamp,
        expect!(m[2], Commit),
    );

    let nt = expect!(m[3], LogicalMessage);
    assert!(!nt.is_transactional());
    assert_eq!(nt.flags, 0);
    assert_eq!(nt.prefix, "siphon.nt");
    assert_eq!(&nt.content[..], b"\x00\xff\x10");
    assert!(nt.lsn > expect!(m[2], Commit).end_lsn);
}

#[test]
fn origin_of_a_replayed_transaction() {
    let m = Fixture::load("origin").decode_all();
    assert_eq!(tags(&m), "BORIC");
    let begin = expect!(m[0], Begin);
    // pg_replication_origin_xact_setup('0/1234ABCD', '2024-01-02 03:04:05+00') sets the
    // commit timestamp too.
    assert_eq!(begin.commit_timestamp, 757_479_845_000_000);
    let origin = expect!(m[1], Origin);
    assert_eq!(origin.name, "siphon_origin");
    assert_eq!(origin.commit_lsn, "0/1234ABCD".parse::<Lsn>().unwrap());
    assert_eq!(expect!(m[3], Insert).new, tuple(vec![text("5")]));
    check_commit(
        begin.final_lsn,
        begin.commit_timestamp,
        expect!(m[4], Commit),
    );
}

#[test]
fn binary_columns() {
    let m = Fixture::load("binary").decode_all();
    assert_eq!(tags(&m), "BRIC");
    let rel = expect!(m[1], Relation);
    assert_eq!(column_names(rel), ["id", "label", "payload", "at", "n"]);
    let oids: Vec<u32> = rel.columns.iter().map(|c| c.type_oid).collect();
    assert_eq!(oids, [23, 25, 17, 1184, 1700]);
    let new = &expect!(m[2], Insert).new;
    assert_eq!(
        new.columns,
        [
            Column::Binary(Bytes::copy_from_slice(&7i32.to_be_bytes())),
            Column::Binary(Bytes::from_static(b"hello")),
            Column::Binary(Bytes::from_static(b"\xde\xad\xbe\xef")),
            // one second after the PostgreSQL epoch, in microseconds
            Column::Binary(Bytes::copy_from_slice(&1_000_000i64.to_be_bytes())),
            Column::Null,
        ]
    );
}

#[test]
fn streamed_transactions() {
    let fixture = Fixture::load("stream");
    assert_eq!(fixture.options.protocol_version, 2);
    let m = fixture.decode_all();
    assert_eq!(tags(&m), "SESMYRIIUDRTESESIEcSYRIIEAcSEASEA");

    // First transaction: four blocks, then Stream Commit.
    let s = expect!(m[0], StreamStart);
    let xid = s.xid;
    assert!(s.first_segment);
    for i in [2, 13, 15] {
        let s = expect!(m[i], StreamStart);
        assert_eq!(s.xid, xid);
        assert!(!s.first_segment);
    }
    let msg = expect!(m[3], LogicalMessage);
    assert_eq!(msg.xid, Some(xid));
    assert!(msg.is_transactional());
    assert_eq!(msg.prefix, "siphon");
    assert_eq!(&msg.content[..], b"in-stream");
    let ty = expect!(m[4], Type);
    assert_eq!(
        (ty.xid, ty.namespace.as_str(), ty.name.as_str()),
        (Some(xid), "app", "mood")
    );
    let rel = expect!(m[5], Relation);
    assert_eq!(rel.xid, Some(xid));
    assert_eq!(rel.name, "streamed");
    assert_eq!(rel.columns[1].type_oid, ty.id);
    let i1 = expect!(m[6], Insert);
    assert_eq!(i1.xid, Some(xid));
    assert_eq!(i1.new, tuple(vec![text("1"), text("ok"), text("one")]));
    let u = expect!(m[8], Update);
    assert_eq!(u.xid, Some(xid));
    assert_eq!(u.new, tuple(vec![text("1"), text("ok"), text("uno")]));
    let d = expect!(m[9], Delete);
    assert_eq!(d.xid, Some(xid));
    assert_eq!(
        d.old,
        OldTuple::Key(tuple(vec![text("2"), Column::Null, Column::Null]))
    );
    let trunc_rel = expect!(m[10], Relation);
    assert_eq!(trunc_rel.name, "streamed_trunc");
    let t = expect!(m[11], Truncate);
    assert_eq!(
        (t.xid, t.relation_ids.as_slice()),
        (Some(xid), &[trunc_rel.id][..])
    );
    assert_eq!(
        expect!(m[16], Insert).new,
        tuple(vec![text("3"), Column::Null, text("three")])
    );
    let commit = expect!(m[18], StreamCommit);
    assert_eq!(commit.xid, xid);
    assert_eq!(commit.flags, 0);
    assert!(commit.end_lsn > commit.commit_lsn);
    assert!(commit.commit_lsn > msg.lsn);
    assert!(commit.commit_timestamp > YEAR_2020);

    // Second transaction: its subtransaction's changes were streamed, then rolled back.
    let s2 = expect!(m[19], StreamStart);
    assert!(s2.first_segment && s2.xid > xid);
    let in_top = expect!(m[22], Insert);
    let in_sub = expect!(m[23], Insert);
    assert_eq!(in_top.xid, Some(s2.xid));
    let subxid = in_sub.xid.unwrap();
    assert!(subxid > s2.xid);
    let abort = expect!(m[25], StreamAbort);
    assert_eq!((abort.xid, abort.subxid), (s2.xid, subxid));
    assert_eq!((abort.abort_lsn, abort.abort_timestamp), (None, None));
    let commit2 = expect!(m[26], StreamCommit);
    assert_eq!(commit2.xid, s2.xid);
    assert!(commit2.commit_lsn > commit.end_lsn);

    // Third and fourth: streamed, then aborted as a whole (xid == subxid).
    for (start, abort) in [(27, 29), (30, 32)] {
        let s = expect!(m[start], StreamStart);
        assert!(s.first_segment);
        assert_eq!(m[start + 1], Message::StreamStop);
        let a = expect!(m[abort], StreamAbort);
        assert_eq!((a.xid, a.subxid), (s.xid, s.xid));
    }
}

#[test]
fn two_phase_commit_and_rollback() {
    let fixture = Fixture::load("two_phase");
    assert_eq!(fixture.options.protocol_version, 3);
    let m = fixture.decode_all();
    assert_eq!(tags(&m), "bRIPKbIPr");

    let bp = expect!(m[0], BeginPrepare);
    assert_eq!(bp.gid, "siphon-gid-1");
    assert!(bp.end_lsn > bp.prepare_lsn);
    assert_eq!(
        expect!(m[2], Insert).new,
        tuple(vec![text("1"), text("committed")])
    );
    let p = expect!(m[3], Prepare);
    assert_eq!(p.flags, 0);
    assert_eq!(
        (p.prepare_lsn, p.end_lsn, p.prepare_timestamp, p.xid, &p.gid),
        (
            bp.prepare_lsn,
            bp.end_lsn,
            bp.prepare_timestamp,
            bp.xid,
            &bp.gid
        )
    );
    let cp = expect!(m[4], CommitPrepared);
    assert_eq!((cp.xid, cp.gid.as_str()), (bp.xid, "siphon-gid-1"));
    assert!(cp.commit_lsn >= p.end_lsn);
    assert!(cp.end_lsn > cp.commit_lsn);
    assert!(cp.commit_timestamp >= p.prepare_timestamp);

    let bp2 = expect!(m[5], BeginPrepare);
    assert_eq!(bp2.gid, "siphon-gid-2");
    assert!(bp2.xid > bp.xid);
    let p2 = expect!(m[7], Prepare);
    let rp = expect!(m[8], RollbackPrepared);
    assert_eq!(rp.flags, 0);
    assert_eq!((rp.xid, rp.gid.as_str()), (bp2.xid, "siphon-gid-2"));
    assert_eq!(rp.prepare_end_lsn, p2.end_lsn);
    assert!(rp.rollback_end_lsn > rp.prepare_end_lsn);
    assert_eq!(rp.prepare_timestamp, p2.prepare_timestamp);
    assert!(rp.rollback_timestamp >= rp.prepare_timestamp);
}

#[test]
fn streamed_prepared_transaction() {
    let fixture = Fixture::load("stream_two_phase");
    assert_eq!(fixture.options.protocol_version, 3);
    let m = fixture.decode_all();
    assert_eq!(tags(&m), "SRIESEpK");
    let s = expect!(m[0], StreamStart);
    assert!(s.first_segment);
    let insert = expect!(m[2], Insert);
    assert_eq!(insert.xid, Some(s.xid));
    assert_eq!(
        insert.new,
        tuple(vec![text("3"), text("streamed and prepared")])
    );
    let sp = expect!(m[6], StreamPrepare);
    assert_eq!(
        (sp.flags, sp.xid, sp.gid.as_str()),
        (0, s.xid, "siphon-gid-3")
    );
    assert!(sp.end_lsn > sp.prepare_lsn);
    let cp = expect!(m[7], CommitPrepared);
    assert_eq!((cp.xid, cp.gid.as_str()), (s.xid, "siphon-gid-3"));
    assert!(cp.commit_lsn >= sp.end_lsn);
}

#[test]
fn names_and_text_are_slices_of_the_input() {
    let fixture = Fixture::load("basic");
    let rel_buf = &fixture.messages[2];
    let rel = match pgoutput::parse(rel_buf).unwrap() {
        Message::Relation(r) => r,
        other => panic!("{other:?}"),
    };
    let range = rel_buf.as_ptr() as usize..rel_buf.as_ptr() as usize + rel_buf.len();
    for text in [&rel.namespace, &rel.name, &rel.columns[0].name] {
        assert!(range.contains(&(text.as_bytes().as_ptr() as usize)));
    }
}
