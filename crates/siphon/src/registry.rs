//! The registry ids of record values' schemas (the `avro` value format): one resolver for the
//! stream's lookups and the transfers' rows.
//!
//! # Invariants
//! - A registry that cannot be reached (or answers 408, 429, 5xx) is asked again with capped
//!   exponential backoff, for as long as it takes, with a warning each time: the record waits
//!   (and reading waits with it), it is never sent without its id nor skipped.
//! - Only a refusal comes back as an error: of the schema itself
//!   ([`RegistryError::is_schema_refusal`], to which `pipeline.on_error` applies) or of Siphon
//!   (credentials, the URL), which stops Siphon naming the fix.

use siphon_core::Backoff;
use siphon_record::{RegistrySchema, RegistrySchemaKind};
use siphon_schema_registry::{RegistryConfig, RegistryError, SchemaKind, SchemaRegistry};
use std::time::Duration;
use tracing::warn;

/// The first wait before asking an unreachable registry again.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Schema ids from the registry (the client's cache answers the schemas seen before).
#[derive(Clone)]
pub struct SchemaIds {
    registry: SchemaRegistry,
}

impl SchemaIds {
    /// A resolver for the registry of `config`.
    ///
    /// # Errors
    /// The URL or the TLS files are not usable.
    pub fn new(config: &RegistryConfig) -> Result<Self, RegistryError> {
        Ok(SchemaIds {
            registry: SchemaRegistry::new(config)?,
        })
    }

    /// The client, for calls of its own (`check-config`).
    pub fn registry(&self) -> &SchemaRegistry {
        &self.registry
    }

    /// The id of `schema` under `subject`, registered when new; asked again while the registry
    /// cannot answer.
    ///
    /// # Errors
    /// The registry's refusal.
    pub async fn id(&self, subject: &str, schema: &RegistrySchema) -> Result<u32, RegistryError> {
        let kind = match schema.kind() {
            RegistrySchemaKind::Avro => SchemaKind::Avro,
        };
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            match self.registry.register(subject, kind, schema.text()).await {
                Err(error) if error.consequence().is_retry() => {
                    let wait = backoff.next_delay(rand::random::<f64>());
                    warn!(
                        %error,
                        subject,
                        retry_in_ms = wait.as_millis() as u64,
                        "the schema registry did not answer; records wait for their schema id"
                    );
                    tokio::time::sleep(wait).await;
                }
                answer => return answer,
            }
        }
    }
}
