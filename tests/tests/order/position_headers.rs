//! `format.position_headers` on a real broker, across `kill -9`: every event record carries
//! `siphon.source` (`<system identifier>/<slot>`) and `siphon.position`; the records of one
//! transaction share its commit LSN and are numbered 0, 1, ... in commit order; on each
//! partition first deliveries carry increasing positions and a repeat the position of its first
//! delivery, so a consumer drops repeats with one comparison per partition. Without the option
//! no record carries either header.

use anyhow::Result;
use siphon_tests::outbox::{
    event, insert_transaction, read_event_records, record_id, siphon_config, slot_active,
    wait_for_all, Event, OUTBOX_DDL,
};
use siphon_tests::{wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

fn header(record: &ConsumedRecord, name: &str) -> Option<String> {
    record
        .header(name)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_number_each_transaction_and_tell_repeats_across_kill_9() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "pos", "\n[format]\nposition_headers = true");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "pos").await },
    )
    .await?;
    let system_id: String = client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await?
        .get(0);

    // Transactions of 1 to 12 events while Siphon is killed twice, so that records repeat.
    let writer_pg = pg.connect().await?;
    let writer = tokio::spawn(async move {
        let mut client = writer_pg;
        let mut transactions: Vec<Vec<Event>> = Vec::new();
        let mut seq = 0;
        for txn in 0..40u64 {
            let events: Vec<Event> = (0..1 + txn % 12)
                .map(|_| {
                    seq += 1;
                    event(seq, true)
                })
                .collect();
            insert_transaction(&mut client, &events, true).await?;
            transactions.push(events);
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        anyhow::Ok(transactions)
    });
    for pause in [500u64, 900] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        siphon.kill9()?;
        siphon.start_again()?;
    }
    let transactions = writer.await??;
    let expected: BTreeSet<String> = transactions
        .iter()
        .flatten()
        .map(|e| e.id.clone())
        .collect();
    let records = wait_for_all(&broker, &expected, Duration::from_secs(90)).await?;

    // Every record names the source; positions by event id, one per event.
    let mut position_of: HashMap<String, String> = HashMap::new();
    for record in &records {
        assert_eq!(
            header(record, "siphon.source").as_deref(),
            Some(format!("{system_id}/pos").as_str()),
            "{record:?}"
        );
        let position = header(record, "siphon.position").expect("a position");
        let first = position_of
            .entry(record_id(record))
            .or_insert_with(|| position.clone());
        assert_eq!(*first, position, "a repeat carries its first position");
    }
    // One commit LSN per transaction, indexes 0.. in commit order, LSNs growing.
    let mut previous_lsn = String::new();
    for events in &transactions {
        let positions: Vec<&String> = events.iter().map(|e| &position_of[&e.id]).collect();
        let lsn = positions[0]
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(lsn.len(), 16, "{positions:?}");
        assert!(lsn > previous_lsn, "{lsn} after {previous_lsn}");
        for (index, position) in positions.iter().enumerate() {
            assert_eq!(**position, format!("{lsn}:{index:010}"), "{positions:?}");
        }
        previous_lsn = lsn;
    }
    // Per partition: a record is kept when its position is above the last one kept; what is
    // kept is every event once, in commit order.
    let mut by_partition: BTreeMap<(String, i32), Vec<&ConsumedRecord>> = BTreeMap::new();
    for record in &records {
        by_partition
            .entry((record.topic.clone(), record.partition))
            .or_default()
            .push(record);
    }
    let mut kept = BTreeSet::new();
    let mut repeats = 0;
    for ((topic, partition), mut log) in by_partition {
        log.sort_by_key(|r| r.offset);
        let mut last = String::new();
        for record in log {
            let position = header(record, "siphon.position").unwrap_or_default();
            if position > last {
                assert!(
                    kept.insert(record_id(record)),
                    "{topic}/{partition}: {} kept twice",
                    record_id(record)
                );
                last = position;
            } else {
                assert!(
                    kept.contains(&record_id(record)),
                    "{topic}/{partition}: {} dropped but never kept",
                    record_id(record)
                );
                repeats += 1;
            }
        }
    }
    assert_eq!(kept, expected);
    eprintln!(
        "{} events, {} records, {repeats} repeats dropped by position",
        expected.len(),
        records.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_records_carry_no_position() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "plain", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "plain").await },
    )
    .await?;
    let events: Vec<Event> = (1..=5).map(|seq| event(seq, true)).collect();
    insert_transaction(&mut client, &events, true).await?;
    let expected: BTreeSet<String> = events.iter().map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(60)).await?;
    for record in read_event_records(&broker).await? {
        assert!(
            record.header("siphon.source").is_none() && record.header("siphon.position").is_none(),
            "{record:?}"
        );
    }
    drop(siphon);
    Ok(())
}
