//! The driver against a real PostgreSQL and the in-memory destination: what it confirms, sends,
//! holds and commits, with every report given when the test says.

mod memory_sink;

use memory_sink::{MemoryDestination, SinkEvent};
use siphon::error::PipelineError;
use siphon::session::{run_session_with, Carry, PipelineSettings};
use siphon::telemetry::Metrics;
use siphon_kafka_sink::RDKafkaErrorCode;
use siphon_router::RoutedRecord;
use siphon_tests::outbox::{
    event, insert_transaction, slot_active, slot_confirmed_lsn, OUTBOX_DDL,
};
use siphon_tests::{wait_until, Postgres};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// The settings of a session on `pg`'s outbox, slot `s`, with `kafka` appended to the `[kafka]`
/// section.
fn settings(pg: &Postgres, kafka: &str) -> PipelineSettings {
    let text = format!(
        r#"
[source]
url = "{url}"
slot = "s"
publication = "p"
tables = ["public.outbox"]
status_interval_ms = 100

[kafka]
bootstrap_servers = "127.0.0.1:9"
state_topic = ""
{kafka}

[metrics]
listen = "127.0.0.1:0"

[pipeline]
shutdown_timeout_secs = 2
"#,
        url = pg.url()
    );
    let table: toml::Table = toml::from_str(&text).expect("a valid TOML document");
    let config = siphon::config::Config::from_table(table).expect("a valid configuration");
    siphon::settings::build(&config).expect("settings")
}

/// A cluster with the outbox table and its publication.
async fn outbox() -> (Postgres, Client) {
    let pg = Postgres::start().expect("a PostgreSQL cluster");
    let client = pg.connect().await.expect("a connection");
    client
        .batch_execute(&format!(
            "{OUTBOX_DDL}; CREATE PUBLICATION p FOR TABLE outbox"
        ))
        .await
        .expect("the outbox");
    (pg, client)
}

/// A session running on its own task, and the switch that stops it.
struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<(Result<(), PipelineError>, Carry)>,
}

impl Running {
    fn start(destination: &MemoryDestination, settings: PipelineSettings, carry: Carry) -> Self {
        let (stop, mut shutdown) = watch::channel(false);
        let destination = destination.clone();
        let task = tokio::spawn(async move {
            let metrics = Arc::new(Metrics::new());
            let mut carry = carry;
            let outcome =
                run_session_with(&destination, &settings, &metrics, &mut carry, &mut shutdown)
                    .await;
            (outcome, carry)
        });
        Running { stop, task }
    }

    /// Starts a session and waits until it streams from the slot.
    async fn streaming(
        destination: &MemoryDestination,
        settings: PipelineSettings,
        carry: Carry,
        client: &Client,
    ) -> Self {
        let running = Self::start(destination, settings, carry);
        wait_until(WAIT, POLL, || slot_active(client, "s"))
            .await
            .expect("the session streams from the slot");
        running
    }

    /// Asks the session to stop and waits for its end.
    async fn stop(self) -> (Result<(), PipelineError>, Carry) {
        self.stop.send_replace(true);
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the session stops")
            .expect("the session's task")
    }
}

/// The event ids of `records`, in order.
fn ids(records: &[RoutedRecord]) -> Vec<u64> {
    records
        .iter()
        .filter_map(|r| {
            let id = r.headers.iter().find(|h| h.name.as_ref() == "id")?;
            let text = std::str::from_utf8(id.value.as_ref()?).ok()?;
            text.rsplit('-').next()?.parse().ok()
        })
        .collect()
}

/// Commits one transaction of the events `seqs`.
async fn commit(client: &mut Client, seqs: impl IntoIterator<Item = u64>) {
    let events: Vec<_> = seqs.into_iter().map(|seq| event(seq, true)).collect();
    insert_transaction(client, &events, true)
        .await
        .expect("a committed transaction");
}

async fn current_lsn(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await
        .expect("the current WAL position");
    u64::try_from(row.get::<_, i64>(0)).expect("a position")
}

async fn confirmed(client: &Client) -> u64 {
    slot_confirmed_lsn(client, "s")
        .await
        .expect("the slot's position")
        .unwrap_or(0)
}

/// Waits until `check` holds of the destination.
async fn wait_for(
    destination: &MemoryDestination,
    what: &str,
    check: impl Fn(&MemoryDestination) -> bool,
) {
    wait_until(WAIT, POLL, || {
        let holds = check(destination);
        async move { Ok(holds) }
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e:#}; events {:?}", destination.events()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_confirmed_only_through_what_the_sink_acknowledged() {
    let (pg, mut client) = outbox().await;
    let destination = MemoryDestination::new();
    destination.hold_reports();
    let session =
        Running::streaming(&destination, settings(&pg, ""), Carry::default(), &client).await;
    let start = confirmed(&client).await;
    commit(&mut client, 1..=2).await;
    let first_commit = current_lsn(&client).await;
    commit(&mut client, 3..=4).await;
    let second_commit = current_lsn(&client).await;
    wait_for(&destination, "four records taken", |d| d.unreported() == 4).await;
    // Several status intervals: nothing acknowledged, nothing confirmed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        confirmed(&client).await,
        start,
        "confirmed before any acknowledgement"
    );

    // The first transaction and half of the second acknowledged: only the first is confirmed.
    assert_eq!(destination.deliver(3), 3);
    wait_until(WAIT, POLL, || async {
        Ok(confirmed(&client).await >= first_commit)
    })
    .await
    .expect("the first transaction confirmed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        confirmed(&client).await < second_commit,
        "confirmed past a record the sink has not acknowledged"
    );

    assert_eq!(destination.deliver(1), 1);
    wait_until(WAIT, POLL, || async {
        Ok(confirmed(&client).await >= second_commit)
    })
    .await
    .expect("the second transaction confirmed");
    assert_eq!(ids(&destination.written()), vec![1, 2, 3, 4]);
    let (outcome, _) = session.stop().await;
    outcome.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_behind_a_topic_being_created_wait_in_order() {
    let (pg, mut client) = outbox().await;
    let destination = MemoryDestination::new();
    // `Order` exists; `Customer` (event 3) is new, and its creation is held.
    destination.with_topics(["outbox.event.Order"]);
    destination.hold_creations();
    let session =
        Running::streaming(&destination, settings(&pg, ""), Carry::default(), &client).await;
    commit(&mut client, [1]).await;
    wait_for(&destination, "event 1 written", |d| d.written().len() == 1).await;
    commit(&mut client, [3, 4, 5]).await;
    wait_for(&destination, "the Customer topic's creation", |d| {
        d.events()
            .contains(&SinkEvent::CreationStarted("outbox.event.Customer".into()))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ids(&destination.written()),
        vec![1],
        "a record for a known topic overtook one waiting for its topic"
    );
    destination.release_creations();
    wait_for(&destination, "every event written", |d| {
        d.written().len() == 4
    })
    .await;
    assert_eq!(ids(&destination.written()), vec![1, 3, 4, 5]);
    let (outcome, _) = session.stop().await;
    outcome.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_record_replaces_the_producer_and_every_record_is_sent_again_in_order() {
    let (pg, mut client) = outbox().await;
    let destination = MemoryDestination::new();
    destination.hold_reports();
    let session =
        Running::streaming(&destination, settings(&pg, ""), Carry::default(), &client).await;
    commit(&mut client, 1..=3).await;
    wait_for(&destination, "three records taken", |d| d.unreported() == 3).await;
    assert!(destination.fail_oldest(RDKafkaErrorCode::MessageTimedOut));
    wait_for(&destination, "the producer replaced", |d| {
        d.events().contains(&SinkEvent::Rebuilt)
    })
    .await;
    wait_for(&destination, "three records taken again", |d| {
        d.unreported() == 3
    })
    .await;
    assert_eq!(destination.deliver(3), 3);
    wait_for(&destination, "three records written", |d| {
        d.written().len() == 3
    })
    .await;
    assert_eq!(
        ids(&destination.written()),
        vec![1, 2, 3],
        "records sent again out of order or twice"
    );
    let end = current_lsn(&client).await;
    wait_until(WAIT, POLL, || async { Ok(confirmed(&client).await >= end) })
        .await
        .expect("the transaction confirmed");
    let (outcome, _) = session.stop().await;
    outcome.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_up_on_unacknowledged_records_and_the_next_session_sends_them() {
    let (pg, mut client) = outbox().await;
    let destination = MemoryDestination::new();
    destination.hold_reports();
    let session =
        Running::streaming(&destination, settings(&pg, ""), Carry::default(), &client).await;
    commit(&mut client, [1]).await;
    wait_for(&destination, "event 1 taken", |d| d.unreported() == 1).await;
    let before = confirmed(&client).await;
    let commit_end = current_lsn(&client).await;
    // The stop waits for the record up to the shutdown timeout, then gives up on it.
    let (outcome, carry) = session.stop().await;
    outcome.expect("a stop that gives up on a record is still a clean stop");
    assert!(
        carry.acked_through.0 < commit_end,
        "acknowledged through an unreported record"
    );
    assert_eq!(
        confirmed(&client).await,
        before,
        "confirmed an unreported record"
    );
    assert!(destination.written().is_empty());

    destination.report_at_once();
    let session = Running::streaming(&destination, settings(&pg, ""), carry, &client).await;
    wait_for(&destination, "event 1 sent again", |d| {
        d.written().len() == 1
    })
    .await;
    assert_eq!(ids(&destination.written()), vec![1]);
    wait_until(WAIT, POLL, || async {
        Ok(confirmed(&client).await >= commit_end)
    })
    .await
    .expect("the transaction confirmed");
    let (outcome, _) = session.stop().await;
    outcome.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_commits_each_event_once_with_its_progress() {
    let (pg, mut client) = outbox().await;
    let destination = MemoryDestination::new();
    let exactly_once = "delivery = \"exactly-once\"";
    let session = Running::streaming(
        &destination,
        settings(&pg, exactly_once),
        Carry::default(),
        &client,
    )
    .await;
    commit(&mut client, 1..=3).await;
    commit(&mut client, 4..=5).await;
    wait_for(&destination, "five events committed", |d| {
        ids(&d.committed()).len() == 5
    })
    .await;
    let (outcome, carry) = session.stop().await;
    outcome.expect("a clean stop");
    let events = destination.events();
    assert_eq!(
        events[0],
        SinkEvent::Opened {
            transactional: true
        }
    );
    assert_eq!(events[1], SinkEvent::InitTransactions);
    assert!(events.contains(&SinkEvent::Begin), "{events:?}");

    // The next session reads the progress committed with the events and repeats none.
    commit(&mut client, 6..=7).await;
    let session =
        Running::streaming(&destination, settings(&pg, exactly_once), carry, &client).await;
    wait_for(&destination, "seven events committed", |d| {
        ids(&d.committed()).len() >= 7
    })
    .await;
    let (outcome, _) = session.stop().await;
    outcome.expect("a clean stop");
    assert_eq!(ids(&destination.committed()), (1..=7).collect::<Vec<_>>());
    let progress = destination
        .committed()
        .iter()
        .filter(|r| r.topic.as_ref() == "siphon.progress")
        .count();
    assert!(progress >= 1, "no progress committed");
}
