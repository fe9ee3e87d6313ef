//! Whether a record the producer did not place (its topic or its partition unknown to the
//! producer's metadata) is sent again, waits for its topic, or is refused for good: decided
//! from fresh metadata, never from the producer's word alone.
//!
//! The producer forgets a topic's partitions whenever a metadata answer says the topic does not
//! exist: a broker that came back empty and has not created the topic again yet, an automatic
//! creation still under way, a broker whose metadata lags. The records queued for the topic
//! then fail with "unknown partition" (or "unknown topic"), although a moment later the topic
//! exists again with every partition. Only the topic's current metadata tells that flux from a
//! topic that really lacks the partition (created again with fewer partitions, or a partition
//! column naming one it does not have).
//!
//! # Invariants
//! - A record is refused for good only when the metadata shows the topic present with
//!   partitions, and the partition the record names is not among them.
//! - A missing topic, or one without partitions yet (being created), is waited for: never a
//!   refusal.
//! - A record without a partition (the partitioner chooses) is never refused for its
//!   partition.

/// What fresh metadata says of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicMetadata {
    /// The brokers do not know it (or report it without partitions: being created).
    Missing,
    /// It exists with `partitions` partitions.
    Present { partitions: i32 },
}

/// What becomes of a record its producer did not place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The topic has the record's partition: the producer's metadata was out of date; send it
    /// again (in its place).
    SendAgain,
    /// The topic does not exist (yet): create it or wait for it, then decide again.
    AwaitTopic,
    /// The topic exists without the record's partition: refused for good.
    Refuse,
}

/// The verdict for a record naming `partition` (`None`: the partitioner chooses) of a topic
/// whose fresh metadata is `metadata`.
pub fn verdict(partition: Option<i32>, metadata: TopicMetadata) -> Verdict {
    match metadata {
        TopicMetadata::Present { partitions } if partitions > 0 => match partition {
            Some(p) if p >= partitions || p < 0 => Verdict::Refuse,
            _ => Verdict::SendAgain,
        },
        // Without partitions the topic is still being created.
        TopicMetadata::Present { .. } | TopicMetadata::Missing => Verdict::AwaitTopic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_topic_in_flux_is_waited_for_and_a_missing_partition_refused() {
        use TopicMetadata::{Missing, Present};
        use Verdict::{AwaitTopic, Refuse, SendAgain};
        let table = [
            // The topic is gone (a broker that came back empty): wait, whatever the partition.
            (Some(2), Missing, AwaitTopic),
            (None, Missing, AwaitTopic),
            // Being created: no partitions yet.
            (Some(0), Present { partitions: 0 }, AwaitTopic),
            // Back with all its partitions: the refusal was the producer's stale metadata.
            (Some(2), Present { partitions: 3 }, SendAgain),
            (Some(0), Present { partitions: 1 }, SendAgain),
            (None, Present { partitions: 1 }, SendAgain),
            // Created again with fewer partitions, or a partition column beyond the topic.
            (Some(2), Present { partitions: 1 }, Refuse),
            (Some(3), Present { partitions: 3 }, Refuse),
        ];
        for (partition, metadata, expected) in table {
            assert_eq!(
                verdict(partition, metadata),
                expected,
                "{partition:?} {metadata:?}"
            );
        }
    }

    proptest! {
        /// Refused exactly when the topic exists with partitions and lacks the record's; a
        /// missing topic is never a refusal.
        #[test]
        fn refused_only_when_present_without_the_partition(
            partition in proptest::option::of(-1..64i32),
            partitions in proptest::option::of(0..64i32),
        ) {
            let metadata = partitions.map_or(TopicMetadata::Missing, |partitions| TopicMetadata::Present { partitions });
            let v = verdict(partition, metadata);
            let lacks = matches!((partition, partitions), (Some(p), Some(n)) if n > 0 && !(0..n).contains(&p));
            prop_assert_eq!(v == Verdict::Refuse, lacks);
            prop_assert_eq!(v == Verdict::AwaitTopic, partitions.unwrap_or(0) == 0);
        }
    }
}
