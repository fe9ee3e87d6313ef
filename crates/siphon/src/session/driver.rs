//! The session driver: the IO around [`SessionCore`].
//!
//! It reads the replication stream (only while the core allows), hands records to the
//! [`Sink`] its [`Destination`] opened (Kafka's in production, an in-memory one in its tests),
//! passes delivery reports and catalog answers back, confirms positions, and runs everything
//! that talks to PostgreSQL over SQL beside the loop.
//!
//! # Invariants
//! - The loop awaits nothing unbounded besides its `select!`: catalog lookups and the periodic
//!   status probe run as spawned tasks with a timeout, and their results come back as inputs;
//!   so a black-holed SQL connection cannot freeze delivery handling or shutdown.
//! - Every action is executed in the order the core queued it (records reach the producer in
//!   the core's order). A record for a topic new to the producer waits, with every record sent
//!   after it, while the topic is created beside the loop (the [`TopicGate`] decides, the
//!   driver carries out its [`Step`]s); so unreachable brokers hold up neither delivery
//!   reports, nor the delivery deadline, nor shutdown, nor the status updates that keep the
//!   replication connection alive.
//! - Records waiting for a topic count as handed to the producer: a purge hands them back
//!   ([`Input::Purged`]), like the producer's own queue, and stops their topic's creation; so a replacement
//!   never leaves one behind. A creation that failed for now hands back the record it was for
//!   as not taken ([`Input::SendRefused`], which fails the producer) and the records after it
//!   as purged; one refused for good refuses each record of its topic, as at enqueue.
//! - What the core noticed is given to the log and the metrics ([`Recorder`]) as each action is
//!   taken, and at the end of each round of actions with the window's gauges.
//! - Delivery reports are served by this loop when librdkafka's queue wakes it
//!   ([`Sink::reports_ready`]); no other thread polls the producer.
//! - From the moment the replication stream starts, whatever the session awaits, the stream is
//!   driven beside it (reading ahead within its budget, status updates on time): also while
//!   the exactly-once producer registers with its coordinator and the progress is read, before
//!   the loop runs.

use super::core::{Action, Answer, CoreSettings, Input, Lookup, Now, SessionCore};
use super::position::PositionHeaders;
use super::recorder::Recorder;
use super::sink::{Destination, KafkaDestination, Probe, Sink};
use super::transactional::{self, PROGRESS_TOKEN};
use super::RoutedKind;
use super::{Carry, PipelineSettings, SeenPublication};
use crate::error::PipelineError;
use crate::telemetry::Metrics;
use futures::FutureExt as _;
use pgoutput::Lsn;
use siphon_core::exactly_once::Progress;
use siphon_core::topic_gate::{Creation as Outcome, Step, TopicGate};
use siphon_core::Intervals;
use siphon_kafka_sink::{DeliveryObserver, SinkError};
use siphon_router::RoutedRecord;
use siphon_source::queries::Catalog;
use siphon_source::Membership;
use siphon_source::MissingSlot;
use siphon_source::ReplicationStream;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// Source events handled per wake-up at most (between two looks at shutdown and the timers).
const SOURCE_BATCH: usize = 256;
/// Delivery reports handled per wake-up at most (the rest on the next turn, so reading and
/// shutdown are not starved).
const REPORT_BATCH: usize = 1024;

/// Keeps the readiness flag in step with whether the brokers answer (until aborted).
async fn watch_brokers(
    probe: impl Probe,
    health: Arc<crate::telemetry::Health>,
    intervals: Intervals,
) {
    let mut interval = tokio::time::interval(intervals.broker_probe);
    let mut reachable: Option<bool> = None;
    loop {
        interval.tick().await;
        let now = probe.probe(intervals.broker_probe_timeout).await;
        health.set_broker_reachable(now);
        // One line per change of state.
        match (reachable, now) {
            (Some(true) | None, false) => warn!("Kafka brokers unreachable; records wait in flight and reading pauses when the window is full"),
            (Some(false), true) => info!("Kafka brokers reachable again"),
            _ => {}
        }
        reachable = Some(now);
    }
}

/// A topic being created beside the loop; dropping it stops the creation.
struct Creation {
    /// Tells its result from a stopped creation's.
    id: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Creation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The outcome of a topic creation run beside the loop: its id, the topic, the result.
type Created = (u64, String, Result<(), SinkError>);

/// Records the core sent that wait for a topic to be created ([`TopicGate`] decides), and the
/// creation they wait for, run beside the loop.
struct Waiting {
    gate: TopicGate<RoutedKind>,
    creation: Option<Creation>,
    created_tx: mpsc::UnboundedSender<Created>,
    created: mpsc::UnboundedReceiver<Created>,
}

impl Waiting {
    fn new() -> Self {
        let (created_tx, created) = mpsc::unbounded_channel();
        Waiting {
            gate: TopicGate::default(),
            creation: None,
            created_tx,
            created,
        }
    }

    /// Runs `creation` of `topic` beside the loop; its result arrives on `created` with `id`.
    /// Without a creation (the topic is known after all) the result is success, at once.
    fn start(
        &mut self,
        id: u64,
        topic: String,
        creation: Option<impl std::future::Future<Output = Result<(), SinkError>> + Send + 'static>,
    ) {
        let created = self.created_tx.clone();
        debug!(%topic, "creating a topic; records for it and after it wait");
        self.creation = Some(Creation {
            id,
            task: tokio::spawn(async move {
                let result = match creation {
                    Some(creation) => creation.await,
                    None => Ok(()),
                };
                // The receiver is gone only when the session ended.
                let _ = created.send((id, topic, result));
            }),
        });
    }
}

/// What a session needs that takes a round trip to set up.
struct Connections<S> {
    /// The server streamed from, as `prepare` identified it.
    server: Option<siphon_source::ServerIdentity>,
    /// The publication membership as last seen (see [`Driver::publication`]).
    publication: Arc<Mutex<Membership>>,
    start: Lsn,
    sink: S,
    deliveries: mpsc::UnboundedReceiver<siphon_kafka_sink::Delivery>,
    sql: Arc<Catalog>,
    stream: ReplicationStream,
    /// Exactly-once: the Kafka transactions from the last committed progress, and the source's
    /// identity in the progress topic.
    exactly_once: Option<(
        siphon_core::exactly_once::KafkaTransactions,
        transactional::Source,
    )>,
}

/// Checks the server, opens the producer, the SQL connection and the replication stream.
async fn connect<D: Destination>(
    destination: &D,
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    carry: &mut Carry,
) -> Result<Connections<D::Sink>, PipelineError> {
    // A slot this process streamed from is never created again behind its back.
    let missing = if carry.slot_seen {
        MissingSlot::Refuse
    } else if settings.snapshot.initial {
        // Created by the initial snapshot, below, with the snapshot it reads in.
        MissingSlot::Leave
    } else {
        MissingSlot::Create
    };
    let mut slot =
        siphon_source::prepare_with(&settings.source, missing, metrics.health().setup_wait())
            .await?;
    // The publication may have been created again (or an outbox table added back) while
    // reconnecting: the events of the gap were not published.
    let publication = SeenPublication::new(slot.identity.as_ref(), slot.publication.clone());
    if let Some(seen) = &carry.publication {
        seen.check(&settings.source.publication, &publication)?;
    }
    // ... or while Siphon was stopped: the membership the last run saw is in the state topic
    // (read once per process; later sessions compare with the previous one, above, and need
    // no broker to start streaming). A slot created now (or by the snapshot, below) has no
    // gap: its membership replaces the record, which may be of a slot dropped since.
    if let (Some(state), None) = (&settings.state_topic, &carry.publication) {
        crate::publication_record::check_and_record(
            state,
            publication.system_id.as_deref(),
            &settings.source.slot,
            &settings.source.publication,
            &publication.membership,
            slot.created || !slot.exists,
        )
        .await?;
    }
    carry.publication = Some(publication);
    // -- Initial snapshot: sent and acknowledged before streaming starts (crate::snapshot).
    if !carry.slot_seen {
        crate::snapshot::before_streaming(settings, metrics, &mut slot).await?;
    }
    let start = carry.resume_from(slot.confirmed_flush_lsn, slot.identity.as_ref());
    let observer: Arc<dyn DeliveryObserver> = Arc::clone(metrics) as Arc<dyn DeliveryObserver>;
    let sql = Arc::new(Catalog::connect(&settings.source.url, &slot.endpoint).await?);
    let mut stream = ReplicationStream::start(&settings.source, &slot, start, carry.stall).await?;
    // Exactly-once: the slot is held (the stream started) before older producers are fenced
    // and the progress is read (see `transactional`).
    let (sink, deliveries, exactly_once) = match &settings.exactly_once {
        None => {
            let (sink, deliveries) = destination.open(&settings.sink, Some(observer))?;
            (sink, deliveries, None)
        }
        Some(exactly_once) => {
            let source =
                transactional::Source::new(settings, exactly_once, slot.identity.as_ref())?;
            let opening = transactional::open(
                destination,
                settings,
                exactly_once,
                source,
                &slot.endpoint,
                start,
                observer,
            );
            // The coordinator may take its time (one loading its log answers "load in
            // progress"): meanwhile the stream reads ahead within its budget and keeps its
            // status updates going, or the server would end it after wal_sender_timeout.
            let opened = tokio::select! {
                opened = opening => opened?,
                error = stream.read_ahead() => return Err(error.into()),
            };
            let started = (opened.transactions, opened.source);
            (opened.sink, opened.deliveries, Some(started))
        }
    };
    Ok(Connections {
        publication: Arc::new(Mutex::new(slot.publication)),
        server: slot.identity,
        start,
        sink,
        deliveries,
        sql,
        stream,
        exactly_once,
    })
}

/// Runs one session to Kafka until shutdown (`Ok`) or an error.
pub async fn run_session(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    carry: &mut Carry,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    run_session_with(&KafkaDestination, settings, metrics, carry, shutdown).await
}

/// Runs one session to `destination` until shutdown (`Ok`) or an error.
pub async fn run_session_with<D: Destination>(
    destination: &D,
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    carry: &mut Carry,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    if *shutdown.borrow() {
        return Ok(());
    }
    // Connecting can hang on an unreachable server: a shutdown request ends it.
    let Connections {
        server,
        publication,
        start,
        sink,
        deliveries,
        sql,
        stream,
        exactly_once,
    } = tokio::select! {
        biased;
        _ = shutdown.changed() => {
            info!("shutdown requested while connecting");
            return Ok(());
        }
        connections = connect(destination, settings, metrics, carry) => connections?,
    };
    carry.slot_seen = true;
    let database_encoding = stream.database_encoding().clone();
    if !settings.message_prefixes.is_empty() && !database_encoding.is_supported() {
        warn!(
            encoding = database_encoding.name(),
            "Siphon cannot convert the database encoding to UTF-8: a logical message with non-ASCII content stops Siphon (or goes to the dead-letter topic); write such events to an outbox table, or move to a UTF8 database"
        );
    }
    let (transactions, transactional_source) = match exactly_once {
        Some((transactions, source)) => (Some(transactions), Some(source)),
        None => (None, None),
    };
    let core = SessionCore::new(
        CoreSettings {
            router: &settings.router,
            message_prefixes: &settings.message_prefixes,
            database_encoding,
            non_transactional: settings.non_transactional,
            on_error: &settings.on_error,
            tables: settings
                .source
                .tables
                .iter()
                .cloned()
                .collect::<HashSet<_>>(),
            max_in_flight_records: settings.stream_window().records,
            max_in_flight_bytes: settings.stream_window().bytes,
            shutdown_timeout: settings.shutdown_timeout,
            delivery_timeout: settings.delivery_timeout,
            replacement_backoff: (
                settings.intervals.replacement_backoff,
                settings.intervals.replacement_backoff_max,
            ),
            position_headers: settings.position_headers.then(|| {
                PositionHeaders::new(
                    server.as_ref().map(|s| s.system_id.as_str()),
                    &settings.source.slot,
                )
            }),
            transactions,
            suspects: std::mem::take(&mut carry.suspects),
            registered_schema_ttl: settings
                .registry
                .as_ref()
                .map_or(std::time::Duration::from_secs(60), |r| r.latest_ttl()),
            subject_strategy: settings.subject_strategy,
        },
        start,
    );
    let (inputs_tx, inputs) = mpsc::unbounded_channel();
    let mut driver = Driver {
        settings,
        metrics: Arc::clone(metrics),
        probe: tokio::spawn(watch_brokers(
            sink.prober(),
            metrics.health(),
            settings.intervals,
        )),
        sink,
        deliveries,
        stream,
        sql,
        publication,
        system_id: server.as_ref().map(|s| s.system_id.clone()),
        inputs_tx,
        inputs,
        status_probe: None,
        waiting: Waiting::new(),
        transactional: transactional_source,
        pending_commit: None,
        commit: CommitStage::Idle,
        core,
        recorder: Recorder::new(Arc::clone(metrics)),
    };
    metrics.health().set_streaming(true);
    metrics.set_confirmed_lsn(start);
    let outcome = driver.run(shutdown).await;
    driver.recorder.drain(&mut driver.core);
    metrics.health().set_streaming(false);
    carry.acked_through = driver.core.watermark();
    carry.suspects = driver.core.take_suspects();
    carry.publication = Some(SeenPublication::new(
        server.as_ref(),
        lock(&driver.publication).clone(),
    ));
    carry.server = server;
    carry.stall = driver.stream.stall_escalation();
    metrics.set_oldest_unacked_since(None);
    // With its login refused the producer cannot reach the coordinator: no abort to wait for.
    let login_refused = matches!(
        &outcome,
        Err(PipelineError::Sink(SinkError::CredentialsRefused { .. }))
    );
    if outcome.is_err() && driver.transactional.is_some() && !login_refused {
        // The open transaction's records are never shown to read_committed consumers; the
        // next session's registration would abort it too, this only ends it sooner.
        if let Err(e) = driver
            .sink
            .abort_transaction(transactional::ABORT_TIMEOUT)
            .await
        {
            debug!(error = %e, "the open Kafka transaction was not aborted; the next session's producer aborts it");
        }
    }
    driver.probe.abort();
    if let Some(task) = driver.status_probe.take() {
        task.abort();
    }
    match outcome {
        Ok(()) => {
            // Bounded: on a broken connection the final status update never leaves.
            let finish = driver.stream.finish(settings.shutdown_timeout);
            match tokio::time::timeout(settings.shutdown_timeout * 2, finish).await {
                Ok(reported) => {
                    info!(confirmed = %reported?, "stopped; confirmed position reported to PostgreSQL")
                }
                Err(_) => warn!(
                    "stopped; the replication connection did not answer, the acknowledged position is reported by the next start"
                ),
            }
            Ok(())
        }
        Err(e) if reports_on_failure(&e, driver.transactional.is_some()) => {
            // The stop waited for the records in flight: confirm what they acknowledged, so a
            // start after the fix repeats none of them. Bounded, as a shutdown's.
            let finish = driver.stream.finish(settings.shutdown_timeout);
            if let Ok(Ok(confirmed)) =
                tokio::time::timeout(settings.shutdown_timeout * 2, finish).await
            {
                debug!(%confirmed, "confirmed position reported before stopping on the error");
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Whether a session ended by `error` still reports its confirmed position: at-least-once, with
/// the replication connection sound (the error is not the connection's, and Kafka
/// transactions keep their own position).
fn reports_on_failure(error: &PipelineError, transactional: bool) -> bool {
    !transactional
        && !matches!(
            error,
            PipelineError::Source(_) | PipelineError::Stalled(_) | PipelineError::StreamEnded
        )
}

/// Exactly-once: where the driver's side of a commit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitStage {
    /// No commit under way.
    Idle,
    /// The progress record is written (since then); the commit starts once every record
    /// reported.
    AwaitingReports(std::time::Instant),
    /// The commit runs beside the loop (since then).
    Running(std::time::Instant),
}

struct Driver<'a, S> {
    settings: &'a PipelineSettings,
    metrics: Arc<Metrics>,
    sink: S,
    deliveries: mpsc::UnboundedReceiver<siphon_kafka_sink::Delivery>,
    stream: ReplicationStream,
    sql: Arc<Catalog>,
    /// The publication membership as the last publication check saw it; the next check compares
    /// with it (only one check runs at a time).
    publication: Arc<Mutex<Membership>>,
    /// The server's system identifier, which keys the membership recorded in the state topic.
    system_id: Option<String>,
    /// Results of the tasks run beside the loop.
    inputs_tx: mpsc::UnboundedSender<Input>,
    inputs: mpsc::UnboundedReceiver<Input>,
    /// Keeps the readiness flag in step with the current producer's view of the brokers.
    probe: tokio::task::JoinHandle<()>,
    /// The periodic status probe, while it runs.
    status_probe: Option<tokio::task::JoinHandle<()>>,
    /// Records waiting for their topic to be created.
    waiting: Waiting,
    /// Exactly-once: the source's identity in the progress topic (`None`: at-least-once).
    transactional: Option<transactional::Source>,
    /// Exactly-once: a commit the core asked for, run once no record waits for a topic.
    pending_commit: Option<Progress>,
    /// Exactly-once: where the commit under way stands.
    commit: CommitStage,
    core: SessionCore<'a>,
    /// Gives the core's notes to the log and the metrics.
    recorder: Recorder,
}

impl<S: Sink> Driver<'_, S> {
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), PipelineError> {
        let mut tick = tokio::time::interval(self.settings.intervals.status_tick);
        let mut shutdown_seen = false;
        loop {
            if let Some(result) = self.execute().await {
                return result;
            }
            self.run_commit_once_reported();
            let timer = self.core.next_timeout();
            let input = tokio::select! {
                biased;
                changed = shutdown.changed(), if !shutdown_seen => {
                    shutdown_seen = true;
                    if changed.is_err() || *shutdown.borrow() { Some(Input::Shutdown) } else { None }
                }
                Some(input) = self.inputs.recv() => {
                    if let Input::Committed(result) = &input {
                        if let CommitStage::Running(since) = self.commit {
                            debug!(took_ms = since.elapsed().as_millis() as u64, ok = result.is_ok(), "Kafka transaction commit ended");
                        }
                        self.commit = CommitStage::Idle;
                    }
                    Some(input)
                }
                Some((id, topic, result)) = self.waiting.created.recv() => {
                    self.on_created(id, &topic, result).await;
                    None
                }
                // librdkafka has reports: served here, they are on the channel for the branch
                // below.
                () = self.sink.reports_ready() => {
                    self.sink.serve_reports();
                    None
                }
                Some(delivery) = self.deliveries.recv() => {
                    let now = Now::read();
                    self.on_delivery(now, delivery);
                    for _ in 1..REPORT_BATCH {
                        match self.deliveries.try_recv() {
                            Ok(delivery) => self.on_delivery(now, delivery),
                            Err(_) => break,
                        }
                    }
                    None
                }
                () = sleep_until(timer), if timer.is_some() => Some(Input::Tick),
                _ = tick.tick() => {
                    self.on_tick();
                    // A refused login is told only to the producer's context (its records
                    // would wait for the delivery deadline), and only the broker probe makes
                    // it definite, so it is looked at here, off the reports' path; reports are
                    // served first, so that a connection failure queued since forgets it.
                    self.sink.serve_reports();
                    self.sink.refused_login().map(|e| Input::SourceFailed(e.into()))
                }
                // While the pipeline takes no events this only reads ahead within the budget (so
                // the server keeps decoding) and keeps the status updates going.
                event = self.stream.next_or_read_ahead(self.core.can_read()) => {
                    self.core.handle(Now::read(), source_input(event));
                    // Take what is already buffered without a trip through `select!`.
                    for _ in 1..SOURCE_BATCH {
                        if let Some(result) = self.execute().await {
                            return result;
                        }
                        if !self.core.can_read() {
                            break;
                        }
                        // Cancel-safe: an event not ready yet is not lost by dropping the future.
                        match self.stream.next().now_or_never() {
                            Some(event) => self.core.handle(Now::read(), source_input(event)),
                            None => break,
                        }
                    }
                    None
                }
            };
            if let Some(input) = input {
                self.core.handle(Now::read(), input);
            }
        }
    }

    /// Executes the queued actions; returns the session's result once it finished.
    async fn execute(&mut self) -> Option<Result<(), PipelineError>> {
        while let Some(action) = self.core.poll_action() {
            self.recorder.notes(&mut self.core);
            match action {
                Action::Send { token, record } => {
                    let sink = &self.sink;
                    let is_new = |topic: &str| sink.topic_creation(topic).is_some();
                    match self.waiting.gate.offer(token, record, is_new) {
                        // The common case, without a trip through a vector.
                        Some(Step::Send { token, record }) => self.send_now(token, record).await,
                        step => self.carry_out(step.into_iter().collect()).await,
                    }
                }
                Action::Confirm(lsn) => self.stream.confirm(lsn),
                Action::Lookup(lookup) => self.spawn_lookup(lookup),
                Action::ForgetRelation(relation) => self.stream.forget_relation(relation),
                Action::SkipDeletes(relation) => self.stream.skip_deletes(relation),
                Action::PurgeProducer => {
                    self.sink.purge();
                    self.hand_back_waiting().await;
                }
                Action::ReplaceProducer => match self.sink.rebuild() {
                    Ok(_) => {
                        self.probe.abort();
                        self.probe = tokio::spawn(watch_brokers(
                            self.sink.prober(),
                            self.metrics.health(),
                            self.settings.intervals,
                        ));
                    }
                    Err(e) => self.core.handle(Now::read(), Input::SourceFailed(e.into())),
                },
                Action::BeginTransaction => {
                    if let Err(e) = self.sink.begin_transaction() {
                        self.core.handle(Now::read(), Input::Committed(Err(e)));
                    }
                }
                Action::Commit(progress) => self.pending_commit = Some(progress),
                Action::Finish(result) => return Some(result),
            }
        }
        self.start_commit().await;
        self.recorder.drain(&mut self.core);
        None
    }

    /// A delivery report: the progress record's is the commit's business (its failure fails
    /// the commit), every other goes to the core.
    fn on_delivery(&mut self, now: Now, delivery: siphon_kafka_sink::Delivery) {
        if delivery.token == PROGRESS_TOKEN {
            if let Err(failure) = &delivery.result {
                debug!(error = %failure.error, "the progress record was not delivered; the commit fails");
            }
            return;
        }
        self.core.handle(now, Input::Delivery(delivery));
    }

    /// Exactly-once: runs the commit the core asked for once no record waits for a topic (so
    /// every record sent before it is in the transaction): the progress record is written in
    /// the transaction, and the commit runs beside the loop, which keeps serving delivery
    /// reports; its outcome comes back as [`Input::Committed`].
    async fn start_commit(&mut self) {
        if !self.waiting.gate.is_empty() {
            return;
        }
        // A record handed back or not taken while the commit waited failed the session: the
        // transaction would commit without it.
        if !self.core.may_commit() {
            self.pending_commit = None;
            return;
        }
        let (Some(progress), Some(source)) = (self.pending_commit.take(), &self.transactional)
        else {
            return;
        };
        let record = source.progress_record(&progress);
        if let Err(e) = self.sink.send(PROGRESS_TOKEN, &record).await {
            self.core.handle(Now::read(), Input::Committed(Err(e)));
            return;
        }
        self.commit = CommitStage::AwaitingReports(std::time::Instant::now());
        self.run_commit_once_reported();
    }

    /// Exactly-once: starts the commit once every record handed to the producer, the progress
    /// record among them, has reported (so the commit's own flush has nothing to wait for).
    ///
    /// rdkafka's `commit_transaction` flushes first, and its flush waits for reports in steps of
    /// up to 100 ms on the producer's queue, which this loop serves: started with records still
    /// in flight, each commit took 100 ms longer (end-to-end p50 about 220 ms at a 100 ms
    /// interval in the bench); started once the queue is empty it goes straight to EndTxn.
    fn run_commit_once_reported(&mut self) {
        let CommitStage::AwaitingReports(since) = self.commit else {
            return;
        };
        if self.sink.in_flight() > 0 {
            return;
        }
        debug!(
            waited_ms = since.elapsed().as_millis() as u64,
            "every record of the Kafka transaction reported; committing"
        );
        self.commit = CommitStage::Running(std::time::Instant::now());
        let timeout = self
            .settings
            .sink
            .transaction_timeout()
            .unwrap_or(siphon_kafka_sink::config::DEFAULT_TRANSACTION_TIMEOUT);
        let commit = self.sink.commit_transaction(timeout);
        let inputs = self.inputs_tx.clone();
        tokio::spawn(async move {
            let result = commit.await;
            // The receiver is gone only when the session ended.
            let _ = inputs.send(Input::Committed(result));
        });
    }

    /// A record the producer did not take (or could not be given) goes back to the core.
    fn refused(&mut self, token: usize, record: RoutedRecord, error: SinkError) {
        self.core.handle(
            Now::read(),
            Input::SendRefused {
                token,
                record,
                error,
            },
        );
    }

    /// Hands `record` to the producer; a record it does not take goes back to the core.
    async fn send_now(&mut self, token: usize, record: RoutedRecord) {
        if let Err(error) = self.sink.send(token, &record).await {
            self.refused(token, record, error);
        }
    }

    /// A topic creation finished: the records waiting for it are sent in order, up to the next
    /// one whose topic is new; if it failed they go back to the core (see the module's
    /// invariants).
    async fn on_created(&mut self, id: u64, topic: &str, result: Result<(), SinkError>) {
        // The producer is told of a created topic only for the running creation, before the
        // gate asks which topics are new. A stopped creation's outcome changes nothing: its
        // records were handed back, and sent again they start a creation of their own.
        if result.is_ok() && self.waiting.gate.creating() == Some(id) {
            self.sink.topic_created(topic);
        }
        let sink = &self.sink;
        let is_new = |topic: &str| sink.topic_creation(topic).is_some();
        let outcome = match result {
            Ok(()) => Outcome::Created,
            Err(error) if error.is_transient() => Outcome::FailedForNow(error),
            Err(error) => Outcome::Refused(error),
        };
        let steps = self.waiting.gate.created(id, outcome, is_new);
        self.carry_out(steps).await;
    }

    /// The producer is purged: the records waiting for a topic are handed back as purged, and
    /// the creation stops (the replacement's records start it again).
    async fn hand_back_waiting(&mut self) {
        let steps = self.waiting.gate.purge();
        self.carry_out(steps).await;
    }

    /// Carries out what the topic gate decided, in order; a creation it no longer waits for
    /// is stopped.
    async fn carry_out(&mut self, steps: Vec<Step<RoutedRecord, SinkError>>) {
        let mut handed_back = 0;
        for step in steps {
            match step {
                Step::Send { token, record } => self.send_now(token, record).await,
                Step::Create { id, topic } => {
                    let creation = self.sink.topic_creation(&topic);
                    self.waiting.start(id, topic, creation);
                }
                Step::Refuse {
                    token,
                    record,
                    error,
                } => self.refused(token, record, error),
                Step::HandBack { token, record } => {
                    handed_back += 1;
                    self.core
                        .handle(Now::read(), Input::Purged { token, record });
                }
            }
        }
        if self.waiting.creation.as_ref().map(|c| c.id) != self.waiting.gate.creating() {
            self.waiting.creation = None;
        }
        // A commit the gate held starts in `execute`, once the core's actions these steps
        // caused (a dead letter of a refused record) are carried out: in its transaction.
        if handed_back > 0 {
            warn!(
                records = handed_back,
                "records waiting for a topic to be created are sent again on the replacement producer"
            );
        }
    }

    fn spawn_lookup(&self, lookup: Lookup) {
        let sql = Arc::clone(&self.sql);
        let inputs = self.inputs_tx.clone();
        let tables = self.settings.source.tables.clone();
        let publication = self.settings.source.publication.clone();
        let sql_timeout = self.settings.intervals.sql_timeout;
        let registry = self.settings.registry.clone();
        tokio::spawn(async move {
            let timed_out = || {
                siphon_source::SourceError::from(siphon_source::error::Interruption::QueryTimeout {
                    seconds: sql_timeout.as_secs(),
                })
            };
            let input = match lookup {
                Lookup::NotNullColumns(relation) => {
                    let columns = tokio::time::timeout(
                        sql_timeout,
                        sql.outbox_columns(&relation, &publication),
                    )
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
                    Input::Answer(Answer::NotNullColumns { relation, columns })
                }
                Lookup::SchemaId { subject, schema } => {
                    let id = match &registry {
                        // Asked again while the registry is down, until the session ends.
                        Some(registry) => tokio::select! {
                            id = registry.id(&subject, &schema) => id,
                            () = inputs.closed() => return,
                        },
                        // Settings give every registry format a registry.
                        None => Err(siphon_schema_registry::RegistryError::InvalidUrl {
                            url: String::new(),
                            reason: "no schema registry is configured: set schema_registry.url",
                        }),
                    };
                    Input::Answer(Answer::SchemaId {
                        subject,
                        schema,
                        id,
                    })
                }
                Lookup::LatestSchema { subject } => {
                    let schema = match &registry {
                        // Asked again while the registry is down, until the session ends.
                        Some(registry) => tokio::select! {
                            schema = registry.latest(&subject) => schema,
                            () = inputs.closed() => return,
                        },
                        // Settings give every registry format a registry.
                        None => Err(siphon_schema_registry::RegistryError::InvalidUrl {
                            url: String::new(),
                            reason: "no schema registry is configured: set schema_registry.url",
                        }),
                    };
                    Input::Answer(Answer::LatestSchema { subject, schema })
                }
                Lookup::OutboxRelation(relation) => {
                    let outbox = tokio::time::timeout(
                        sql_timeout,
                        sql.outbox_relation_for(&relation, &tables, &publication),
                    )
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
                    Input::Answer(Answer::OutboxRelation { relation, outbox })
                }
            };
            // The receiver is gone only when the session ended.
            let _ = inputs.send(input);
        });
    }

    /// Periodic: progress log, slot metrics and the stall check, run beside the loop.
    fn on_tick(&mut self) {
        let (records, bytes) = self.core.in_flight();
        debug!(
            watermark = %self.core.watermark(),
            pending_transactions = self.core.pending_transactions(),
            in_flight_records = records,
            in_flight_bytes = bytes,
            held = self.core.held(),
            server_wal_end = %self.stream.server_wal_end(),
            "progress"
        );
        self.sink.release_retired();
        self.metrics
            .set_malformed_trace_contexts(self.settings.router.malformed_trace_contexts());
        if let Some(registry) = &self.settings.registry {
            self.metrics
                .set_registry_requests(registry.registry().requests_sent());
        }
        self.metrics
            .set_retired_producer_unreported(self.sink.retired_unreported());
        self.metrics
            .set_server_wal_end(self.stream.server_wal_end());
        self.metrics.set_confirmed_lsn(self.stream.reported());
        if self
            .status_probe
            .as_ref()
            .is_some_and(|task| !task.is_finished())
        {
            return;
        }
        // A silent stream is normal on an idle server or while the server decodes WAL with no
        // output for the slot: the server is asked whether it is a stall (only while ready to
        // read; the check asks nothing before the stream has been silent long enough).
        let stall_check = self.core.can_read().then(|| self.stream.stall_check());
        let stall_timeout = self.settings.stall_timeout;
        let sql = Arc::clone(&self.sql);
        let slot = self.settings.source.slot.clone();
        let publication = self.settings.source.publication.clone();
        let tables = self.settings.source.tables.clone();
        let membership = Arc::clone(&self.publication);
        let state_topic = self.settings.state_topic.clone();
        let system_id = self.system_id.clone();
        let metrics = Arc::clone(&self.metrics);
        let inputs = self.inputs_tx.clone();
        let status_tick = self.settings.intervals.status_tick;
        self.status_probe = Some(tokio::spawn(async move {
            match tokio::time::timeout(status_tick, sql.retained_wal_bytes(&slot)).await {
                Ok(Ok(Some(bytes))) => metrics.set_slot_retained_wal_bytes(bytes),
                Ok(_) => {}
                Err(_) => warn!(
                    "the slot's retained WAL was not read within {}s; the SQL connection may be broken",
                    status_tick.as_secs()
                ),
            }
            // A dropped publication, or an outbox table taken out of it, silences the stream
            // without an error on the stream itself, and so does one created again (or a table
            // added back) since the last check: stop, naming the loss and the fix.
            let remembered = lock(&membership).clone();
            match tokio::time::timeout(
                status_tick,
                sql.verify_publication(&publication, &tables, &remembered),
            )
            .await
            {
                Ok(Ok(now)) => {
                    if now != remembered {
                        if let Some(state) = &state_topic {
                            // Recorded so that the next start compares with what was seen
                            // last; a failure only leaves the older record, which still tells
                            // a gap (at worst it takes a harmless change for one).
                            let recorded = crate::publication_record::accept(
                                state,
                                system_id.as_deref(),
                                &slot,
                                &publication,
                                &now,
                            )
                            .await;
                            if let Err(e) = recorded {
                                warn!(error = %e, "the publication's membership was not recorded in the state topic");
                            }
                        }
                    }
                    *lock(&membership) = now
                }
                Ok(Err(e)) if !e.is_transient() => {
                    let _ = inputs.send(Input::SourceFailed(e.into()));
                    return;
                }
                Ok(Err(_)) | Err(_) => {}
            }
            let Some(check) = stall_check else { return };
            // Bounded by the check itself: a server that does not answer it is a stall.
            match sql.check_stall(check, stall_timeout).await {
                Ok(Some(seen)) => {
                    let _ = inputs.send(Input::Stalled(seen));
                }
                Ok(None) => {}
                // The session's SQL connection is broken: reconnect (the error says why).
                Err(e) => {
                    let _ = inputs.send(Input::SourceFailed(e.into()));
                }
            }
        }));
    }
}

/// The remembered publication membership. A check that panicked while holding the lock left
/// either the old look or the new one, both complete values: the poison is ignored.
fn lock(membership: &Mutex<Membership>) -> MutexGuard<'_, Membership> {
    membership.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A result of the replication stream as the core's input.
fn source_input(event: Result<siphon_source::SourceEvent, siphon_source::SourceError>) -> Input {
    match event {
        Ok(event) => Input::Source(event),
        Err(e) => Input::SourceFailed(e.into()),
    }
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
