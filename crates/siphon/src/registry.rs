//! The registry's answers for the registry formats (schema ids, subjects' latest schemas): one
//! resolver for the stream's lookups and the transfers' rows, which put the questions of the
//! core's `registry_write` to it.
//!
//! # Invariants
//! - A registry that cannot be reached (or answers 408, 429, 5xx) is asked again with capped
//!   exponential backoff, for as long as it takes, with a warning each time: the record waits
//!   (and reading waits with it), it is never sent without its id nor skipped.
//! - That backoff is the only one: the client makes one attempt per call, so each attempt is
//!   one request and one warning, and the delays between requests are those of
//!   `FIRST_BACKOFF` doubling to `MAX_BACKOFF`.
//! - Only a refusal comes back as an error: of the schema itself
//!   ([`RegistryError::is_schema_refusal`], to which `pipeline.on_error` applies) or of Siphon
//!   (credentials, the URL), which stops Siphon naming the fix.

use siphon_core::Backoff;
use siphon_record::{RegistrySchema, RegistrySchemaKind};
use siphon_schema_registry::{RegistryConfig, RegistryError, SchemaKind, SchemaRegistry};
use std::collections::HashMap;
use std::sync::Arc;
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
    /// How long a subject's latest schema is used before the registry is asked again.
    latest_ttl: Duration,
    /// Whether values are written with the schemas registered for them (not derived).
    registered: bool,
    /// The subjects whose values are written with a version of their own, not the latest.
    pinned: Arc<HashMap<String, i32>>,
}

impl SchemaIds {
    /// A resolver for the registry of `config`, whose retry policy it replaces with one
    /// attempt per call: the resolver's own backoff asks again.
    ///
    /// # Errors
    /// The URL or the TLS files are not usable.
    pub fn new(config: &RegistryConfig, registered: bool) -> Result<Self, RegistryError> {
        let mut config = config.clone();
        config.retry.attempts = 1;
        Ok(SchemaIds {
            registry: SchemaRegistry::new(&config)?,
            latest_ttl: config.latest_ttl.unwrap_or(Duration::from_secs(60)),
            registered,
            pinned: Arc::default(),
        })
    }

    /// The resolver writing the values of the subjects of `pinned` with the version given
    /// for each (`schema_registry.versions`), not with the subject's latest.
    #[must_use]
    pub fn with_pinned(mut self, pinned: HashMap<String, i32>) -> Self {
        self.pinned = Arc::new(pinned);
        self
    }

    /// The pinned versions, by subject.
    pub fn pinned(&self) -> &HashMap<String, i32> {
        &self.pinned
    }

    /// How long a subject's latest schema is used before the registry is asked again.
    pub fn latest_ttl(&self) -> Duration {
        self.latest_ttl
    }

    /// Whether values are written with the schemas registered for them.
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// The schema values of `subject` are written with, with its id: its pinned version, else
    /// its latest (a pinned version is fetched once, the latest again after its time to
    /// live); asked again while the registry cannot answer.
    ///
    /// # Errors
    /// The registry's refusal (a subject or version that does not exist among them).
    pub async fn latest(
        &self,
        subject: &str,
    ) -> Result<(u32, RegistrySchemaKind, Arc<str>), RegistryError> {
        let found = match self.pinned.get(subject) {
            Some(&version) => {
                until_answered(subject, || self.registry.version(subject, version)).await?
            }
            None => until_answered(subject, || self.registry.latest(subject)).await?,
        };
        let kind = match found.kind {
            SchemaKind::Avro => RegistrySchemaKind::Avro,
            SchemaKind::Json => RegistrySchemaKind::Json,
            other => {
                return Err(RegistryError::BadResponse {
                    call: format!("fetch the latest version of subject {subject:?}"),
                    reason: format!(
                        "its schema is {other:?}, and Siphon writes with Avro and JSON Schemas"
                    ),
                })
            }
        };
        Ok((found.id, kind, found.schema))
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
            RegistrySchemaKind::Json => SchemaKind::Json,
        };
        until_answered(subject, || {
            self.registry.register(subject, kind, schema.text())
        })
        .await
    }
}

/// `call`'s answer, asked again with backoff while the registry cannot answer (a warning
/// each time): an answer or a refusal.
async fn until_answered<T, F, Fut>(subject: &str, mut call: F) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RegistryError>>,
{
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    loop {
        match call().await {
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
