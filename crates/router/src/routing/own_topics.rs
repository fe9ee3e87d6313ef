//! Siphon's own topics, which no outbox record may be routed to.
//!
//! Siphon writes to Kafka topics of its own besides the outbox topics: the progress topic of
//! exactly-once delivery (`kafka.progress_topic`, which several sources may share), the state
//! topic (`kafka.state_topic`) and the dead-letter topic (`pipeline.dead_letter_topic`). An
//! outbox record routed into one of them would be read back as Siphon's own: a record keyed
//! like another source's progress forges that progress (the source then skips events), one in
//! the state topic overwrites what Siphon keeps across restarts, one in the dead-letter topic
//! passes for a dead letter.
//!
//! # Invariants
//! - [`OwnTopics::check`] is the one place the rule lives: the router applies it to every
//!   topic it renders, before the topic is cached, so every path that routes a row (the
//!   stream, the initial snapshot, `siphon resend`) refuses such a row with
//!   [`crate::RouteError::OwnTopic`], which then follows `pipeline.on_error` like any other
//!   unroutable row.
//! - Names are compared exactly, as Kafka compares topic names.

use std::fmt;
use std::sync::Arc;

/// What one of Siphon's own topics is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnTopicRole {
    /// `kafka.progress_topic`: exactly-once delivery's progress, one key per source.
    Progress,
    /// `kafka.state_topic`: what Siphon keeps across restarts.
    State,
    /// `pipeline.dead_letter_topic`: rows and records that could not be delivered.
    DeadLetter,
}

impl OwnTopicRole {
    /// The configuration key that names the topic.
    pub fn option(self) -> &'static str {
        match self {
            OwnTopicRole::Progress => "kafka.progress_topic",
            OwnTopicRole::State => "kafka.state_topic",
            OwnTopicRole::DeadLetter => "pipeline.dead_letter_topic",
        }
    }

    /// What an outbox record there would do.
    fn harm(self) -> &'static str {
        match self {
            OwnTopicRole::Progress => {
                "could forge the committed progress of a source and make it skip events"
            }
            OwnTopicRole::State => "could overwrite what Siphon keeps across restarts",
            OwnTopicRole::DeadLetter => "would pass for a dead letter",
        }
    }
}

impl fmt::Display for OwnTopicRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            OwnTopicRole::Progress => "progress topic",
            OwnTopicRole::State => "state topic",
            OwnTopicRole::DeadLetter => "dead-letter topic",
        };
        write!(
            f,
            "{what} ({}), where an outbox record {}",
            self.option(),
            self.harm()
        )
    }
}

/// The topics of Siphon's own that outbox records may not be routed to; shared by a
/// router's clones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnTopics {
    topics: Arc<[(String, OwnTopicRole)]>,
}

impl OwnTopics {
    /// The topics named, with what each is for; empty names (a topic not kept) are left out.
    pub fn new(topics: impl IntoIterator<Item = (String, OwnTopicRole)>) -> Self {
        OwnTopics {
            topics: topics
                .into_iter()
                .filter(|(name, _)| !name.is_empty())
                .collect(),
        }
    }

    /// What `topic` is for, when it is one of Siphon's own.
    pub fn check(&self, topic: &str) -> Option<OwnTopicRole> {
        self.topics
            .iter()
            .find(|(name, _)| name == topic)
            .map(|(_, role)| *role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_names_are_refused() {
        let own = OwnTopics::new([
            ("siphon.progress".to_owned(), OwnTopicRole::Progress),
            (String::new(), OwnTopicRole::State),
            ("siphon.dead-letter".to_owned(), OwnTopicRole::DeadLetter),
        ]);
        assert_eq!(own.check("siphon.progress"), Some(OwnTopicRole::Progress));
        assert_eq!(
            own.check("siphon.dead-letter"),
            Some(OwnTopicRole::DeadLetter)
        );
        for other in [
            "",
            "Siphon.progress",
            "siphon.progress.x",
            "siphon_progress",
        ] {
            assert_eq!(own.check(other), None, "{other:?}");
        }
    }
}
