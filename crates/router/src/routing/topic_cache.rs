//! The topic of each routing value, rendered and checked once per router.
//!
//! A router's topic is a function of the routing value alone (its `route.topic.regex` and
//! `route.topic.replacement` are fixed when it is built), and outbox tables carry few distinct
//! aggregate types: rendering the template and checking the name for every record repeats the
//! same work. The cache keeps each value's topic once it passed the name check.
//!
//! Like the envelope schema cache, it lives as long as the router and is shared by its clones
//! (which have the same options). A topic is kept as an [`Arc<str>`] that every record routed
//! to it shares: a record's topic costs no allocation and no copy.
//!
//! # Invariants
//! - Holds only topics that passed [`crate::routing::topic::check_topic_name`] and are none of
//!   Siphon's own ([`crate::routing::own_topics`]), each under the routing value it was
//!   rendered from; a value whose topic fails either check is never cached, so its error is
//!   reported again for every record.
//! - At most [`CAPACITY`] entries: a full cache is emptied before the next insert.
//! - Never panics; a poisoned lock is taken over (the map is valid after any panic, as every
//!   update is a single insert or a clear).

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The most routing values kept.
pub const CAPACITY: usize = 1024;

/// The topics of the routing values seen, shared by a router's clones.
#[derive(Debug, Clone, Default)]
pub struct TopicCache {
    topics: Arc<Mutex<FxHashMap<Box<str>, Arc<str>>>>,
}

impl TopicCache {
    /// The topic of `value`: the cached one, or `route(value)`, cached when it is `Ok`.
    ///
    /// # Errors
    /// `route`'s error, not cached.
    pub fn topic<E>(
        &self,
        value: &str,
        route: impl FnOnce(&str) -> Result<String, E>,
    ) -> Result<Arc<str>, E> {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(topic) = topics.get(value) {
            return Ok(Arc::clone(topic));
        }
        let topic: Arc<str> = Arc::from(route(value)?);
        if topics.len() >= CAPACITY {
            topics.clear();
        }
        topics.insert(value.into(), Arc::clone(&topic));
        Ok(topic)
    }

    /// Routing values cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn routes_each_value_once() {
        let cache = TopicCache::default();
        let calls = Cell::new(0);
        let route = |value: &str| -> Result<String, ()> {
            calls.set(calls.get() + 1);
            Ok(format!("outbox.event.{value}"))
        };
        for _ in 0..3 {
            assert_eq!(
                cache.topic("Order", route).as_deref(),
                Ok("outbox.event.Order")
            );
            assert_eq!(
                cache.topic("Customer", route).as_deref(),
                Ok("outbox.event.Customer")
            );
        }
        assert_eq!(calls.get(), 2);
        // Clones share it.
        assert_eq!(
            cache.clone().topic("Order", route).as_deref(),
            Ok("outbox.event.Order")
        );
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn errors_are_not_cached() {
        let cache = TopicCache::default();
        let calls = Cell::new(0);
        let refuse = |_: &str| -> Result<String, &str> {
            calls.set(calls.get() + 1);
            Err("illegal")
        };
        assert_eq!(cache.topic("bad topic", refuse), Err("illegal"));
        assert_eq!(cache.topic("bad topic", refuse), Err("illegal"));
        assert_eq!(calls.get(), 2);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_within_its_capacity() {
        let cache = TopicCache::default();
        for i in 0..CAPACITY * 3 + 7 {
            let value = i.to_string();
            let topic = cache.topic(&value, |v| Ok::<_, ()>(format!("t.{v}")));
            assert_eq!(topic.as_deref(), Ok(format!("t.{i}").as_str()));
            assert!(cache.len() <= CAPACITY);
        }
    }
}
