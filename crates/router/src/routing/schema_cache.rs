//! The envelope schema Debezium reuses: its outbox router builds the value schema of an
//! envelope (`{payload, aliases…}`, when `table.fields.additional.placement` has an
//! `envelope` field) once and caches it, so the schema name — which holds the routing value
//! (`server.public.outbox.Order.Value`) — is the one of the first record that built it.
//!
//! Debezium's two caches, reproduced here:
//! - without `table.field.event.schema.version`: keyed by the payload's schema alone (not the
//!   table, not the routing value), at most 10 000 entries, least recently used evicted;
//! - with it: keyed by the row's version alone (NULL is a key too), never evicted; the cached
//!   schema includes the payload schema of the first record of that version, and later
//!   records are put into it: a string payload fits any cached string schema (so a payload
//!   whose expansion failed is written as text), an expanded one only the identical struct
//!   schema; anything else fails in Debezium.
//!
//! Debezium consults the cache before it checks for an empty payload, so a tombstone names
//! the schema too.
//!
//! Both live as long as the router (Debezium: the connector task), shared by its clones.
//!
//! # Invariants
//! - A name, once handed out for a key, is handed out for that key until it is evicted.
//! - Never panics; a poisoned lock is taken over (the map is valid after any panic, as every
//!   update is a single insert or remove).

use crate::format::connect::Schema;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Debezium's bound on the payload-schema cache (`BoundedConcurrentHashMap(10000, …, LRU)`).
pub const CAPACITY: usize = 10_000;

/// Which of Debezium's two caches a router uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKey {
    /// `table.field.event.schema.version` is not set: keyed by the payload schema.
    PayloadSchema,
    /// It is set: keyed by the row's version, NULL included.
    Version(Option<i32>),
}

#[derive(Debug, Default)]
struct Inner {
    /// Payload schema -> (envelope schema name, last use).
    by_payload: HashMap<Schema, (String, u64)>,
    /// Schema version -> (payload schema, envelope schema name).
    by_version: HashMap<Option<i32>, (Schema, String)>,
    tick: u64,
}

/// The shared caches of one router.
#[derive(Debug, Clone, Default)]
pub struct EnvelopeSchemas {
    inner: Arc<Mutex<Inner>>,
}

impl EnvelopeSchemas {
    /// The payload field schema and the envelope schema name for a record whose payload has
    /// schema `payload` (`None`: Debezium has none, a top-level `[]` expanded); `fresh` is the
    /// name this record would give a new envelope schema. `None` when Debezium cannot build
    /// the envelope schema (no payload schema and nothing cached).
    ///
    /// With [`CacheKey::Version`] the returned payload schema is the cached one, which may
    /// differ from `payload`: the caller checks that the value fits it.
    pub fn lookup(
        &self,
        payload: Option<&Schema>,
        key: CacheKey,
        fresh: impl FnOnce() -> String,
    ) -> Option<(Schema, String)> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let CacheKey::Version(v) = key {
            if let Some((cached, name)) = inner.by_version.get(&v) {
                return Some((cached.clone(), name.clone()));
            }
            let payload = payload?.clone();
            let name = fresh();
            inner.by_version.insert(v, (payload.clone(), name.clone()));
            return Some((payload, name));
        }
        let payload = payload?;
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((name, used)) = inner.by_payload.get_mut(payload) {
            *used = tick;
            return Some((payload.clone(), name.clone()));
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
        Some((payload.clone(), name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::connect::SchemaType;

    fn schema(ty: SchemaType) -> Schema {
        Schema::new(ty, true)
    }

    fn name(cache: &EnvelopeSchemas, payload: &Schema, key: CacheKey, fresh: &str) -> String {
        cache
            .lookup(Some(payload), key, || fresh.to_owned())
            .map(|(_, n)| n)
            .unwrap_or_default()
    }

    #[test]
    fn first_name_wins_per_payload_schema() {
        let cache = EnvelopeSchemas::default();
        let json = schema(SchemaType::String);
        let int = schema(SchemaType::Int32);
        let key = CacheKey::PayloadSchema;
        assert_eq!(name(&cache, &json, key, "a.Order.Value"), "a.Order.Value");
        assert_eq!(
            name(&cache, &json, key, "a.Customer.Value"),
            "a.Order.Value"
        );
        assert_eq!(
            name(&cache, &int, key, "a.Customer.Value"),
            "a.Customer.Value"
        );
        // A clone shares the cache.
        assert_eq!(name(&cache.clone(), &json, key, "x"), "a.Order.Value");
        assert_eq!(cache.lookup(None, key, || "x".into()), None);
    }

    #[test]
    fn versioned_schemas_are_keyed_by_version_alone() {
        let cache = EnvelopeSchemas::default();
        let json = schema(SchemaType::String);
        let int = schema(SchemaType::Int32);
        let v = CacheKey::Version;
        assert_eq!(name(&cache, &json, v(Some(1)), "Order"), "Order");
        assert_eq!(name(&cache, &json, v(Some(1)), "Customer"), "Order");
        assert_eq!(name(&cache, &json, v(Some(2)), "Customer"), "Customer");
        assert_eq!(name(&cache, &json, v(None), "Null"), "Null");
        // The cached payload schema comes back, whatever this record's is.
        assert_eq!(
            cache.lookup(Some(&int), v(Some(1)), || "x".into()),
            Some((json.clone(), "Order".to_owned()))
        );
        assert_eq!(
            cache.lookup(None, v(Some(2)), || "x".into()),
            Some((json, "Customer".to_owned()))
        );
        assert_eq!(cache.lookup(None, v(Some(3)), || "x".into()), None);
    }

    #[test]
    fn least_recently_used_is_evicted_at_capacity() {
        let cache = EnvelopeSchemas::default();
        let key = |i: usize| {
            let mut s = schema(SchemaType::String);
            s.name = Some(format!("s{i}"));
            s
        };
        let p = CacheKey::PayloadSchema;
        for i in 0..CAPACITY {
            name(&cache, &key(i), p, &format!("n{i}"));
        }
        // Touch the first so the second is the oldest.
        name(&cache, &key(0), p, "new");
        name(&cache, &key(CAPACITY), p, "last");
        assert_eq!(name(&cache, &key(0), p, "new"), "n0");
        assert_eq!(name(&cache, &key(1), p, "new"), "new");
    }
}
