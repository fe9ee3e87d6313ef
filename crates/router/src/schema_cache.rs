//! The envelope schema Debezium reuses: its outbox router builds the value schema of an
//! envelope (`{payload, aliases…}`, when `table.fields.additional.placement` has an
//! `envelope` field) once and caches it, so the schema name — which holds the routing value
//! (`server.public.outbox.Order.Value`) — is the one of the first record that built it.
//!
//! Debezium's two caches, reproduced here:
//! - without `table.field.event.schema.version`: keyed by the payload's schema alone (not the
//!   table, not the routing value), at most 10 000 entries, least recently used evicted;
//! - with it: keyed by the version number alone, never evicted; the cached schema includes
//!   the payload schema of the first record, so a later record of that version whose payload
//!   schema differs does not fit it (Debezium fails on it: [`CachedEnvelope::Mismatch`]).
//!
//! Both live as long as the router (Debezium: the connector task), shared by its clones.
//!
//! # Invariants
//! - A name, once handed out for a key, is handed out for that key until it is evicted.
//! - Never panics; a poisoned lock is taken over (the map is valid after any panic, as every
//!   update is a single insert or remove).

use crate::connect::Schema;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Debezium's bound on the payload-schema cache (`BoundedConcurrentHashMap(10000, …, LRU)`).
pub const CAPACITY: usize = 10_000;

/// What the cache gives for an envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CachedEnvelope {
    /// The envelope schema name to use.
    Name(String),
    /// The version's cached schema was built for another payload schema.
    Mismatch,
}

#[derive(Debug, Default)]
struct Inner {
    /// Payload schema -> (envelope schema name, last use).
    by_payload: HashMap<Schema, (String, u64)>,
    /// Schema version -> (payload schema, envelope schema name).
    by_version: HashMap<i32, (Schema, String)>,
    tick: u64,
}

/// The shared caches of one router.
#[derive(Debug, Clone, Default)]
pub struct EnvelopeSchemas {
    inner: Arc<Mutex<Inner>>,
}

impl EnvelopeSchemas {
    /// The envelope schema name for a record whose payload has `payload` as schema, with
    /// schema version `version`; `fresh` is the name this record would give it.
    pub fn name(
        &self,
        payload: &Schema,
        version: Option<i32>,
        fresh: impl FnOnce() -> String,
    ) -> CachedEnvelope {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(v) = version {
            return match inner.by_version.get(&v) {
                Some((cached, name)) if cached == payload => CachedEnvelope::Name(name.clone()),
                Some(_) => CachedEnvelope::Mismatch,
                None => {
                    let name = fresh();
                    inner.by_version.insert(v, (payload.clone(), name.clone()));
                    CachedEnvelope::Name(name)
                }
            };
        }
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((name, used)) = inner.by_payload.get_mut(payload) {
            *used = tick;
            return CachedEnvelope::Name(name.clone());
        }
        if inner.by_payload.len() >= CAPACITY {
            let oldest = inner
                .by_payload
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.by_payload.remove(&k);
            }
        }
        let name = fresh();
        inner
            .by_payload
            .insert(payload.clone(), (name.clone(), tick));
        CachedEnvelope::Name(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::SchemaType;

    fn schema(ty: SchemaType) -> Schema {
        Schema::new(ty, true)
    }

    #[test]
    fn first_name_wins_per_payload_schema() {
        let cache = EnvelopeSchemas::default();
        let json = schema(SchemaType::String);
        let int = schema(SchemaType::Int32);
        let name = |n: &str| CachedEnvelope::Name(n.to_owned());
        assert_eq!(
            cache.name(&json, None, || "a.Order.Value".into()),
            name("a.Order.Value")
        );
        assert_eq!(
            cache.name(&json, None, || "a.Customer.Value".into()),
            name("a.Order.Value")
        );
        assert_eq!(
            cache.name(&int, None, || "a.Customer.Value".into()),
            name("a.Customer.Value")
        );
        // A clone shares the cache.
        let clone = cache.clone();
        assert_eq!(
            clone.name(&json, None, || "x".into()),
            name("a.Order.Value")
        );
    }

    #[test]
    fn versioned_schemas_are_keyed_by_version_alone() {
        let cache = EnvelopeSchemas::default();
        let json = schema(SchemaType::String);
        let int = schema(SchemaType::Int32);
        let name = |n: &str| CachedEnvelope::Name(n.to_owned());
        assert_eq!(cache.name(&json, Some(1), || "Order".into()), name("Order"));
        assert_eq!(
            cache.name(&json, Some(1), || "Customer".into()),
            name("Order")
        );
        assert_eq!(
            cache.name(&json, Some(2), || "Customer".into()),
            name("Customer")
        );
        assert_eq!(
            cache.name(&int, Some(1), || "Customer".into()),
            CachedEnvelope::Mismatch
        );
    }

    #[test]
    fn least_recently_used_is_evicted_at_capacity() {
        let cache = EnvelopeSchemas::default();
        let key = |i: usize| {
            let mut s = schema(SchemaType::String);
            s.name = Some(format!("s{i}"));
            s
        };
        for i in 0..CAPACITY {
            cache.name(&key(i), None, || format!("n{i}"));
        }
        // Touch the first so the second is the oldest.
        cache.name(&key(0), None, || "new".into());
        cache.name(&key(CAPACITY), None, || "last".into());
        assert_eq!(
            cache.name(&key(0), None, || "new".into()),
            CachedEnvelope::Name("n0".into())
        );
        assert_eq!(
            cache.name(&key(1), None, || "new".into()),
            CachedEnvelope::Name("new".into())
        );
    }
}
