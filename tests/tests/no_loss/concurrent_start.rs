//! Two instances started at the same moment on a database without the slot (and, in most
//! rounds, without the publication): whichever loses the race to create them becomes the
//! standby. Both keep running, one streams, every event arrives once.
//!
//! To make the race certain rather than likely, the test holds a lock on the catalog the
//! instances read just before creating: both wait on it, and both go on at the same moment when
//! it is released.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, slot_active, wait_for_each_once, Event, OUTBOX_DDL,
};
use siphon_tests::{wait_until, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;

const ROUNDS: u64 = 6;
const EVENTS_PER_ROUND: u64 = 20;

/// How a round lines the two instances up.
#[derive(Debug, Clone, Copy)]
enum Race {
    /// Both read `pg_publication` at the same moment, find nothing and create the publication,
    /// then the slot.
    Publication,
    /// The publication exists; both read its tables at the same moment, then find no slot and
    /// create it.
    Slot,
    /// As `Publication`, with a transaction open meanwhile, as on a busy database: creating the
    /// slot waits for it, so the slot stays half made for a while.
    BusySlot,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_started_together_end_up_streaming_and_standing_by() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE TABLE busy (id bigint)")
        .await?;
    let mut expected = BTreeSet::new();
    for round in 0..ROUNDS {
        let race = [Race::Publication, Race::Slot, Race::BusySlot][(round % 3) as usize];
        let slot = format!("race{round}");
        let config = siphon_config(&pg, &broker, &slot, "");
        let gate = match race {
            Race::Publication | Race::BusySlot => "pg_catalog.pg_publication",
            Race::Slot => {
                client
                    .batch_execute(&format!(
                        "CREATE PUBLICATION {slot}_pub FOR TABLE outbox WITH (publish_via_partition_root = true)"
                    ))
                    .await?;
                "pg_catalog.pg_publication_rel"
            }
        };
        let holder = pg.connect().await?;
        holder
            .batch_execute(&format!(
                "BEGIN; LOCK TABLE {gate} IN ACCESS EXCLUSIVE MODE"
            ))
            .await?;
        let busy = pg.connect().await?;
        if matches!(race, Race::BusySlot) {
            busy.batch_execute("BEGIN; INSERT INTO busy VALUES (1)")
                .await?;
        }
        let first = SiphonProcess::start(&config)?;
        let second = SiphonProcess::start(&config)?;
        let logs = || {
            format!(
                "round {round} ({race:?}):\nfirst:\n{}\nsecond:\n{}",
                first.log(),
                second.log()
            )
        };
        // Both wait on the lock; then both go on together.
        wait_until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            || async {
                let waiting: i64 = client
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE relation = $1::text::regclass AND NOT granted",
                        &[&gate],
                    )
                    .await?
                    .get(0);
                Ok(waiting >= 2)
            },
        )
        .await
        .with_context(logs)?;
        holder.batch_execute("COMMIT").await?;
        if matches!(race, Race::BusySlot) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            busy.batch_execute("ROLLBACK").await?;
        }
        wait_until(
            Duration::from_secs(60),
            Duration::from_millis(50),
            || async {
                anyhow::ensure!(
                    first.is_running() && second.is_running(),
                    "an instance exited"
                );
                slot_active(&client, &slot).await
            },
        )
        .await
        .with_context(logs)?;

        let events: Vec<Event> = (1..=EVENTS_PER_ROUND)
            .map(|i| event(round * EVENTS_PER_ROUND + i, true))
            .collect();
        insert_transaction(&mut client, &events, true).await?;
        expected.extend(events.iter().map(|e| e.id.clone()));
        wait_for_each_once(&broker, &expected, Duration::from_secs(60))
            .await
            .with_context(logs)?;
        // A moment for a late loser to fail, then both must still be up.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            first.is_running() && second.is_running(),
            "both instances keep running; {}",
            logs()
        );
        let standbys = [&first, &second]
            .iter()
            .filter(|p| p.log().contains("waiting to take over"))
            .count();
        assert!(
            standbys >= 1,
            "one instance waits as the standby; {}",
            logs()
        );
        // Dropping the handles stops both before the next round.
    }
    Ok(())
}
