//! Debezium's outbox `EventRouter`: its options ([`options`], with the values that choose a
//! behaviour in [`policy`]), the configured columns found in a table ([`binding`]), topic
//! names ([`topic`], cached per routing value in [`topic_cache`], never one of Siphon's own:
//! [`own_topics`]), the envelope schema
//! Debezium caches ([`schema_cache`]), the Debezium record of a row ([`route`]) and the
//! errors naming the fix ([`error`]); the Avro schemas of the Connect schemas met, as the
//! Avro converter caches them ([`avro_schemas`]).
//!
//! # Invariants
//! - Uses `crate::format` for every byte it writes, and nothing of `crate::extension`: the
//!   Debezium record is complete without the extensions (`tests/layers.rs` checks it).

pub(crate) mod avro_schemas;
pub(crate) mod binding;
pub(crate) mod error;
pub(crate) mod options;
pub(crate) mod own_topics;
pub(crate) mod policy;
pub(crate) mod route;
pub(crate) mod schema_cache;
pub(crate) mod topic;
pub(crate) mod topic_cache;
