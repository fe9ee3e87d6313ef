//! Records that wait for their topic to be created, in the core's order: pure, the driver
//! carries out what it decides.
//!
//! A record whose topic is new to the producer waits while the topic is created beside the
//! session loop, and so does every record the core sends after it, whatever its topic: records
//! reach the producer in the order the core sent them.
//!
//! # Invariants
//! - Records are released ([`Step::Send`]) in the order they were offered, and only while no
//!   record offered before them still waits.
//! - A record is released only once its topic is known to the producer (`is_new` says no).
//! - A creation runs exactly while a record waits, for the first waiting record's topic; at
//!   most one at a time.
//! - Only the running creation's outcome counts: one stopped by a purge (or already finished)
//!   changes nothing.
//! - Every offered record leaves exactly once, unless it still waits: sent; refused (its
//!   topic's creation was refused for good, or it is the record a creation that failed for
//!   now was for); or handed back (a purge, or behind a creation that failed for now).
//! - Waiting records count as handed to the producer: a purge hands them all back and stops
//!   the creation, as a purge of the producer's own queue does.

use crate::record::Records;
use std::collections::VecDeque;

/// How a topic creation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Creation<E> {
    /// The topic exists now.
    Created,
    /// It failed for now (the brokers did not answer in time ...): `error`.
    FailedForNow(E),
    /// It was refused for good: `error`.
    Refused(E),
}

/// What the driver does next.
#[derive(Debug)]
pub enum Step<R, E> {
    /// Hand the record to the producer.
    Send { token: usize, record: R },
    /// Create `topic` beside the loop; its outcome comes back to [`TopicGate::created`] with
    /// `id`.
    Create { id: u64, topic: String },
    /// The record is not taken: its topic's creation failed with `error`.
    Refuse { token: usize, record: R, error: E },
    /// The record goes back to the core as purged, to be sent again.
    HandBack { token: usize, record: R },
}

/// The records waiting for a topic, and the creation they wait for.
#[derive(Debug)]
pub struct TopicGate<K: Records> {
    waiting: VecDeque<(usize, K::Record)>,
    /// The running creation's id and topic.
    creating: Option<(u64, String)>,
    next_id: u64,
}

impl<K: Records> Default for TopicGate<K> {
    fn default() -> Self {
        TopicGate {
            waiting: VecDeque::new(),
            creating: None,
            next_id: 0,
        }
    }
}

impl<K: Records> TopicGate<K> {
    /// The running creation's id, if one runs.
    pub fn creating(&self) -> Option<u64> {
        self.creating.as_ref().map(|(id, _)| *id)
    }

    /// Whether no record waits for a topic.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Records waiting.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The core sends `record`; `is_new` tells whether a topic must be created first.
    pub fn offer<E>(
        &mut self,
        token: usize,
        record: K::Record,
        is_new: impl Fn(&str) -> bool,
    ) -> Option<Step<K::Record, E>> {
        if !self.waiting.is_empty() {
            self.waiting.push_back((token, record));
            return None;
        }
        if !is_new(K::topic(&record)) {
            return Some(Step::Send { token, record });
        }
        let step = self.start(K::topic(&record));
        self.waiting.push_back((token, record));
        Some(step)
    }

    /// The creation `id` finished with `outcome` (the caller has told the producer of a
    /// created topic, so `is_new` says no for it). A stopped creation's outcome is ignored.
    pub fn created<E: Clone>(
        &mut self,
        id: u64,
        outcome: Creation<E>,
        is_new: impl Fn(&str) -> bool,
    ) -> Vec<Step<K::Record, E>> {
        let topic = match self.creating.take() {
            Some((running, topic)) if running == id => topic,
            other => {
                self.creating = other;
                return Vec::new();
            }
        };
        let mut steps = Vec::new();
        match outcome {
            Creation::Created => {}
            Creation::FailedForNow(error) => {
                // The first waiting record is the one the creation was for: it is not taken
                // (which fails the producer), and the records after it come back as purged.
                if let Some((token, record)) = self.waiting.pop_front() {
                    steps.push(Step::Refuse {
                        token,
                        record,
                        error,
                    });
                }
                steps.extend(self.purge());
                return steps;
            }
            Creation::Refused(error) => {
                // Refused for good: each record of the topic is refused, as at enqueue; the
                // others go on.
                let (refused, others): (VecDeque<_>, VecDeque<_>) =
                    std::mem::take(&mut self.waiting)
                        .into_iter()
                        .partition(|(_, record)| K::topic(record) == topic);
                self.waiting = others;
                steps.extend(refused.into_iter().map(|(token, record)| Step::Refuse {
                    token,
                    record,
                    error: error.clone(),
                }));
            }
        }
        while let Some((token, record)) = self.waiting.pop_front() {
            if is_new(K::topic(&record)) {
                steps.push(self.start(K::topic(&record)));
                self.waiting.push_front((token, record));
                break;
            }
            steps.push(Step::Send { token, record });
        }
        steps
    }

    /// The producer is purged: every waiting record comes back as purged and the creation
    /// stops (the records sent again start it again).
    pub fn purge<E>(&mut self) -> Vec<Step<K::Record, E>> {
        self.creating = None;
        std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|(token, record)| Step::HandBack { token, record })
            .collect()
    }

    fn start<E>(&mut self, topic: &str) -> Step<K::Record, E> {
        self.next_id += 1;
        self.creating = Some((self.next_id, topic.to_owned()));
        Step::Create {
            id: self.next_id,
            topic: topic.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    const TOPICS: [&str; 4] = ["known", "a", "b", "c"];

    /// A record of the tests: its topic.
    struct Named;

    impl Records for Named {
        type Record = String;
        fn topic(record: &String) -> &str {
            record
        }
        fn size(_: &String) -> usize {
            0
        }
    }

    type Gate = TopicGate<Named>;
    type TestStep = Step<String, &'static str>;

    fn record(topic: &str) -> String {
        topic.to_owned()
    }

    #[derive(Debug, Clone)]
    enum Op {
        Offer(usize),
        /// The running creation finishes: created, failed for now, refused for good.
        Finish(u8),
        /// An outcome of a creation that is no longer running.
        Stale,
        Purge,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..TOPICS.len()).prop_map(Op::Offer),
            3 => (0..3u8).prop_map(Op::Finish),
            1 => Just(Op::Stale),
            1 => Just(Op::Purge),
        ]
    }

    #[derive(Debug, PartialEq)]
    enum Fate {
        Sent,
        Refused,
        HandedBack,
    }

    /// The model: which topics the producer knows, each record's fate, the creation running.
    struct Model {
        known: HashSet<String>,
        fates: BTreeMap<usize, Fate>,
        topics: BTreeMap<usize, String>,
        creating: Option<(u64, String)>,
        offered: usize,
    }

    impl Model {
        fn apply(&mut self, steps: Vec<TestStep>) -> Result<(), TestCaseError> {
            for step in steps {
                match step {
                    Step::Send { token, record } => {
                        prop_assert!(
                            self.known.contains(&record),
                            "{token} sent before its topic exists"
                        );
                        let earlier_waiting = (0..token).find(|t| !self.fates.contains_key(t));
                        prop_assert_eq!(
                            earlier_waiting,
                            None,
                            "{} sent while an earlier record waits",
                            token
                        );
                        self.settle(token, Fate::Sent)?;
                    }
                    Step::Create { id, topic } => {
                        prop_assert!(!self.known.contains(&topic), "{topic} created twice");
                        self.creating = Some((id, topic));
                    }
                    Step::Refuse { token, .. } => self.settle(token, Fate::Refused)?,
                    Step::HandBack { token, .. } => self.settle(token, Fate::HandedBack)?,
                }
            }
            Ok(())
        }

        /// The records that have not left, in the order they were offered.
        fn waiting(&self) -> Vec<usize> {
            (0..self.offered)
                .filter(|t| !self.fates.contains_key(t))
                .collect()
        }

        fn settle(&mut self, token: usize, fate: Fate) -> Result<(), TestCaseError> {
            prop_assert!(token < self.offered, "{token} was never offered");
            let previous = self.fates.insert(token, fate);
            prop_assert_eq!(previous, None, "{} left twice", token);
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever the order of offers, creation outcomes (stale ones included) and purges:
        /// records are released in order, only once their topic exists, and each leaves once.
        #[test]
        fn records_leave_once_in_order_and_only_to_existing_topics(ops in proptest::collection::vec(op(), 1..60)) {
            let mut gate = Gate::default();
            let mut model = Model {
                known: HashSet::from(["known".to_owned()]),
                fates: BTreeMap::new(),
                topics: BTreeMap::new(),
                creating: None,
                offered: 0,
            };
            let mut stale_ids = Vec::new();
            for op in ops {
                match op {
                    Op::Offer(t) => {
                        let token = model.offered;
                        model.offered += 1;
                        model.topics.insert(token, TOPICS[t].to_owned());
                        let known = model.known.clone();
                        let step: Option<TestStep> = gate.offer(token, record(TOPICS[t]), |topic| !known.contains(topic));
                        model.apply(step.into_iter().collect())?;
                    }
                    Op::Finish(outcome) => {
                        let Some((id, topic)) = model.creating.take() else { continue };
                        prop_assert_eq!(gate.creating(), Some(id));
                        let waited = model.waiting();
                        let result = match outcome {
                            0 => {
                                model.known.insert(topic.clone());
                                Creation::Created
                            }
                            1 => Creation::FailedForNow("unreachable"),
                            _ => Creation::Refused("refused"),
                        };
                        stale_ids.push(id);
                        let known = model.known.clone();
                        let steps: Vec<TestStep> = gate.created(id, result, |topic| !known.contains(topic));
                        model.apply(steps)?;
                        // What the outcome does to the records that waited for it.
                        for (i, token) in waited.into_iter().enumerate() {
                            let fate = model.fates.get(&token);
                            match outcome {
                                // Failed for now: the first is refused, the others come back.
                                1 if i == 0 => prop_assert_eq!(fate, Some(&Fate::Refused)),
                                1 => prop_assert_eq!(fate, Some(&Fate::HandedBack)),
                                // Refused for good: the topic's records are refused.
                                2 if model.topics[&token] == topic => {
                                    prop_assert_eq!(fate, Some(&Fate::Refused))
                                }
                                // The others are sent, or wait still.
                                _ => prop_assert!(
                                    matches!(fate, None | Some(Fate::Sent)),
                                    "{token} left as {fate:?} after outcome {outcome}"
                                ),
                            }
                        }
                    }
                    Op::Stale => {
                        if let Some(&id) = stale_ids.last() {
                            let known = model.known.clone();
                            let steps: Vec<TestStep> = gate.created(id, Creation::Created, |topic| !known.contains(topic));
                            prop_assert!(steps.is_empty(), "a stopped creation's outcome changed something");
                        }
                    }
                    Op::Purge => {
                        if let Some((id, _)) = model.creating.take() {
                            stale_ids.push(id);
                        }
                        let waited = model.waiting();
                        let steps: Vec<TestStep> = gate.purge();
                        model.apply(steps)?;
                        for token in waited {
                            prop_assert_eq!(model.fates.get(&token), Some(&Fate::HandedBack));
                        }
                        prop_assert_eq!(gate.waiting(), 0);
                        prop_assert_eq!(gate.creating(), None);
                    }
                }
                // Whatever has not left waits, and a creation runs exactly when something waits.
                let unsettled = model.offered - model.fates.len();
                prop_assert_eq!(gate.waiting(), unsettled);
                prop_assert_eq!(gate.creating().is_some(), unsettled > 0);
                prop_assert_eq!(gate.creating(), model.creating.as_ref().map(|(id, _)| *id));
                // The first waiting record's topic is the one being created.
                if let Some((_, topic)) = &model.creating {
                    let first = (0..model.offered).find(|t| !model.fates.contains_key(t));
                    prop_assert_eq!(first.map(|t| &model.topics[&t]), Some(topic));
                }
            }
        }
    }
}
