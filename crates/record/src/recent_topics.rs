//! [`RecentTopics`]: what lookups by topic name found for the last few topics, kept beside the
//! map they came from.
//!
//! Records carry their topic as an [`Arc<str>`] that every record of the topic shares (the
//! router's topic cache hands out one per topic), and outbox tables carry few aggregate types:
//! a lookup per record by topic name mostly asks again for a topic asked for just before.
//! Finding it among a few recent ones by the address of its name costs a fraction of hashing
//! the name.
//!
//! # Invariants
//! - [`RecentTopics::get`] gives the value kept for the very name given (the same allocation,
//!   which the kept [`Arc`] keeps alive, so it cannot be another topic's); another allocation
//!   of an equal name is not found (the caller's map answers it).
//! - At most [`SLOTS`] topics are kept, the oldest kept replaced first.
//! - A caller keeps a value only while the map it came from holds that value for the topic
//!   (maps whose entries are never replaced, in this workspace, and whose removals empty the
//!   cache with them).

use std::sync::Arc;

/// Topics kept.
pub const SLOTS: usize = 4;

/// The values found for the last topics looked up (see the module).
#[derive(Debug, Clone)]
pub struct RecentTopics<V> {
    slots: [Option<(Arc<str>, V)>; SLOTS],
    /// The slot the next [`RecentTopics::keep`] fills.
    next: usize,
}

impl<V> Default for RecentTopics<V> {
    fn default() -> Self {
        RecentTopics {
            slots: [const { None }; SLOTS],
            next: 0,
        }
    }
}

impl<V> RecentTopics<V> {
    /// The value kept for `topic`, if `topic` is the name of a topic kept (not a copy of it).
    #[inline]
    pub fn get(&self, topic: &str) -> Option<&V> {
        self.slots
            .iter()
            .flatten()
            .find(|(name, _)| std::ptr::eq::<str>(&**name, topic))
            .map(|(_, value)| value)
    }

    /// Keeps `value` for `topic`, in place of the oldest topic kept.
    pub fn keep(&mut self, topic: &Arc<str>, value: V) {
        self.slots[self.next] = Some((Arc::clone(topic), value));
        self.next = (self.next + 1) % SLOTS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_topics_kept_by_their_name() {
        let mut recent = RecentTopics::default();
        let orders: Arc<str> = Arc::from("orders");
        assert_eq!(recent.get(&orders), None);
        recent.keep(&orders, 1);
        assert_eq!(recent.get(&orders), Some(&1));
        assert_eq!(recent.get(&Arc::clone(&orders)), Some(&1));
        // An equal name elsewhere, or a part of the name, is not the topic kept.
        assert_eq!(recent.get(&String::from("orders")), None);
        assert_eq!(recent.get(&orders[..5]), None);
        let customers: Arc<str> = Arc::from("customers");
        recent.keep(&customers, 2);
        assert_eq!(recent.get(&orders), Some(&1));
        assert_eq!(recent.get(&customers), Some(&2));
    }

    #[test]
    fn replaces_the_oldest_topic() {
        let mut recent = RecentTopics::default();
        let topics: Vec<Arc<str>> = (0..=SLOTS).map(|i| Arc::from(format!("t{i}"))).collect();
        for (i, topic) in topics.iter().enumerate() {
            recent.keep(topic, i);
        }
        assert_eq!(recent.get(&topics[0]), None);
        for (i, topic) in topics.iter().enumerate().skip(1) {
            assert_eq!(recent.get(topic), Some(&i));
        }
    }
}
