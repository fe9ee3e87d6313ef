//! A client of Confluent-compatible schema registries: Confluent's Schema Registry, Apicurio
//! Registry through its compatibility API (`…/apis/ccompat/v7`) and others that serve the same
//! REST calls.
//!
//! ```no_run
//! # async fn demo() -> Result<(), siphon_schema_registry::RegistryError> {
//! use siphon_schema_registry::{RegistryConfig, SchemaKind, SchemaRegistry};
//!
//! let registry = SchemaRegistry::new(&RegistryConfig::new("http://registry:8081"))?;
//! let id = registry.register("orders-value", SchemaKind::Avro, r#""string""#).await?;
//! let latest = registry.latest("orders-value").await?;
//! assert_eq!(latest.id, id);
//! # Ok(()) }
//! ```
//!
//! Modules: `config` (the URL, basic auth, TLS in librdkafka's terms, the retry policy),
//! `transport` (one HTTP/1.1 request over hyper and rustls), `client` (the calls, their cache
//! and retries), `error` (the errors and what each means: retry, or fix).
//!
//! # Invariants
//! - Only the calls listed in [`SchemaRegistry`]'s module are made, and only through the cache:
//!   in the steady state no request is sent.
//! - Every error says whether trying again can help ([`RegistryError::consequence`]).

mod client;
mod config;
mod error;
mod transport;

pub use client::{key_subject, value_subject, RegisteredSchema, SchemaKind, SchemaRegistry};
pub use config::{BasicAuth, Endpoint, RegistryConfig, RetryPolicy, Scheme, TlsOptions};
pub use error::RegistryError;
pub use siphon_record::Consequence;
