//! The Avro schemas of the Connect schemas a router has met, as Confluent's `AvroData` caches
//! them (`fromConnectSchemaCache`, `schemas.cache.config`, 1000 entries by default): an
//! expanded payload's schema is inferred per record, and deriving and parsing its Avro schema
//! costs more than looking it up.
//!
//! # Invariants
//! - At most [`CAPACITY`] schemas are kept; the least recently used goes first.
//! - A schema Avro cannot name is not kept: each record asking for it gets the error again.
//! - Never panics; a poisoned lock is taken over (every update is one insert or remove).

use crate::format::avro::{AvroError, AvroSchema};
use crate::format::connect::Schema;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// `AvroData`'s default cache size (`schemas.cache.config`).
pub const CAPACITY: usize = 1000;

#[derive(Debug, Default)]
struct Inner {
    /// Connect schema -> (its Avro schema, last use).
    schemas: HashMap<Schema, (Arc<AvroSchema>, u64)>,
    tick: u64,
}

/// The cache, shared by clones.
#[derive(Debug, Clone, Default)]
pub struct AvroSchemas {
    inner: Arc<Mutex<Inner>>,
}

impl AvroSchemas {
    /// The Avro schema of `connect`, derived once while it stays in the cache.
    ///
    /// # Errors
    /// As [`AvroSchema::from_connect`].
    pub fn get(&self, connect: &Schema) -> Result<Arc<AvroSchema>, AvroError> {
        {
            let mut inner = self.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some((avro, used)) = inner.schemas.get_mut(connect) {
                *used = tick;
                return Ok(avro.clone());
            }
        }
        // Derived outside the lock: clones routing in parallel do not wait on each other.
        let avro = Arc::new(AvroSchema::from_connect(connect)?);
        let mut inner = self.lock();
        if inner.schemas.len() >= CAPACITY && !inner.schemas.contains_key(connect) {
            let oldest = inner
                .schemas
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.schemas.remove(&k);
            }
        }
        let tick = inner.tick;
        inner.schemas.insert(connect.clone(), (avro.clone(), tick));
        Ok(avro)
    }

    /// How many schemas are kept.
    pub fn len(&self) -> usize {
        self.lock().schemas.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::connect::SchemaType;

    fn record(field: &str) -> Schema {
        let mut schema = Schema::new(
            SchemaType::Struct(vec![(
                field.to_owned(),
                Schema::new(SchemaType::Int32, true),
            )]),
            true,
        );
        schema.name = Some("payload".to_owned());
        schema
    }

    #[test]
    fn a_schema_is_derived_once_and_shared_by_clones() {
        let cache = AvroSchemas::default();
        let first = cache.get(&record("a")).unwrap();
        let again = cache.clone().get(&record("a")).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(cache.len(), 1);
        assert!(first.json().contains(r#""name":"a""#));
    }

    #[test]
    fn names_avro_refuses_are_not_kept() {
        let cache = AvroSchemas::default();
        assert!(matches!(
            cache.get(&record("a-b")),
            Err(AvroError::InvalidName { .. })
        ));
        assert!(cache.is_empty());
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let cache = AvroSchemas::default();
        let keep = cache.get(&record("keep")).unwrap();
        for i in 0..CAPACITY {
            // The kept schema stays the most recently used but one.
            assert!(Arc::ptr_eq(&cache.get(&record("keep")).unwrap(), &keep));
            cache.get(&record(&format!("f{i}"))).unwrap();
        }
        assert_eq!(cache.len(), CAPACITY);
        assert!(Arc::ptr_eq(&cache.get(&record("keep")).unwrap(), &keep));
    }
}
