//! The registry client: register a schema under a subject, look up a subject's latest or a
//! pinned version, or a schema by id, with a cache in front of each.
//!
//! The calls, all served alike by Confluent's registry, Apicurio's compatibility API
//! (`/apis/ccompat/v7`) and rivven-schema:
//!
//! | method | call |
//! |---|---|
//! | [`SchemaRegistry::register`] | `POST /subjects/{subject}/versions` with `{"schema": …}` (and `"schemaType"` when not Avro) → `{"id": …}` |
//! | [`SchemaRegistry::latest`] | `GET /subjects/{subject}/versions/latest` |
//! | [`SchemaRegistry::version`] | `GET /subjects/{subject}/versions/{version}` |
//! | [`SchemaRegistry::schema`] | `GET /schemas/ids/{id}` |
//!
//! Registering an already registered schema returns its id without a new version, which is
//! how the id of a schema is found: `POST /subjects/{subject}` (lookup without registering)
//! is not served everywhere.
//!
//! # Invariants
//! - In the steady state nothing reaches the registry: an id registered, a version or a schema
//!   fetched is kept for the client's life (ids and versions never change meaning), a subject's
//!   latest version until [`SchemaRegistry::forget_latest`] or the configured time to live.
//! - A failure whose consequence is `Retry` is retried with capped exponential backoff and
//!   jitter, up to the policy's attempts; the last error is returned. Anything else is returned
//!   at once.
//! - The cache's lock is never held across an await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use hyper::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use siphon_core::Backoff;

use crate::config::{RegistryConfig, RetryPolicy};
use crate::error::RegistryError;
use crate::transport::Transport;

/// Characters of a subject escaped in a path: all but RFC 3986's unreserved ones.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub use siphon_record::registered::{key_subject, value_subject};

/// The kind of a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaKind {
    /// Avro (the registries' default, sent without `schemaType`).
    Avro,
    /// JSON Schema (`"schemaType": "JSON"`).
    Json,
    /// Protobuf (`"schemaType": "PROTOBUF"`).
    Protobuf,
}

impl SchemaKind {
    fn from_wire(value: Option<&str>) -> Option<SchemaKind> {
        match value {
            None | Some("AVRO") => Some(SchemaKind::Avro),
            Some("JSON") => Some(SchemaKind::Json),
            Some("PROTOBUF") => Some(SchemaKind::Protobuf),
            Some(_) => None,
        }
    }

    fn wire(self) -> Option<&'static str> {
        match self {
            SchemaKind::Avro => None,
            SchemaKind::Json => Some("JSON"),
            SchemaKind::Protobuf => Some("PROTOBUF"),
        }
    }
}

/// A version of a subject, as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    /// The subject.
    pub subject: String,
    /// The version in the subject.
    pub version: i32,
    /// The schema's id, which framed records carry.
    pub id: u32,
    /// The schema's text as the registry gives it back (which may differ in layout from what
    /// was registered: rivven-schema sorts the keys).
    pub schema: Arc<str>,
    /// The schema's kind.
    pub kind: SchemaKind,
}

/// How many registered ids the cache keeps before it forgets them all (each is asked for again
/// when next needed): memory stays bounded whatever the number of schemas met.
pub const CACHED_IDS: usize = 10_000;

#[derive(Default)]
struct Cache {
    /// kind → subject → schema text → id (looked up by reference: no allocation per call).
    ids: HashMap<SchemaKind, HashMap<String, HashMap<String, u32>>>,
    /// How many ids `ids` holds.
    id_count: usize,
    /// id → (kind, text).
    schemas: HashMap<u32, (SchemaKind, Arc<str>)>,
    /// (subject, version) → the version.
    versions: HashMap<(String, i32), RegisteredSchema>,
    /// subject → its latest version and when it was fetched.
    latest: HashMap<String, (RegisteredSchema, Instant)>,
}

/// A client of one registry, shared by clones.
#[derive(Clone)]
pub struct SchemaRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    retry: RetryPolicy,
    latest_ttl: Option<std::time::Duration>,
    cache: Mutex<Cache>,
    requests: AtomicU64,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: i64,
}

#[derive(Deserialize)]
struct VersionAnswer {
    subject: String,
    version: i32,
    id: i64,
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error_code: Option<i64>,
    message: Option<String>,
}

impl SchemaRegistry {
    /// A client of the registry `config` describes. Nothing is sent yet.
    ///
    /// # Errors
    /// When the URL or the TLS settings cannot be used (consequence `Fix`).
    pub fn new(config: &RegistryConfig) -> Result<SchemaRegistry, RegistryError> {
        Ok(SchemaRegistry {
            inner: Arc::new(Inner {
                transport: Transport::new(config)?,
                retry: config.retry.clone(),
                latest_ttl: config.latest_ttl,
                cache: Mutex::new(Cache::default()),
                requests: AtomicU64::new(0),
            }),
        })
    }

    /// The number of requests sent so far, retries included.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The id of `schema` under `subject`, registering it when it is new to the subject.
    ///
    /// # Errors
    /// The registry's refusal (incompatible, invalid, unauthorized: `Fix`), or it could not be
    /// reached after the retries (`Retry`).
    pub async fn register(
        &self,
        subject: &str,
        kind: SchemaKind,
        schema: &str,
    ) -> Result<u32, RegistryError> {
        let cached = self
            .cache()
            .ids
            .get(&kind)
            .and_then(|subjects| subjects.get(subject))
            .and_then(|schemas| schemas.get(schema))
            .copied();
        if let Some(id) = cached {
            return Ok(id);
        }
        let call = format!("register a schema under subject {subject:?}");
        let mut body = serde_json::Map::new();
        body.insert("schema".to_owned(), schema.into());
        if let Some(kind) = kind.wire() {
            body.insert("schemaType".to_owned(), kind.into());
        }
        let body = serde_json::Value::Object(body).to_string().into_bytes();
        let path = format!("/subjects/{}/versions", segment(subject));
        let answer: IdAnswer = self.call(&call, Method::POST, &path, Some(body)).await?;
        let id = schema_id(&call, answer.id)?;
        let mut cache = self.cache();
        if cache.id_count >= CACHED_IDS {
            cache.ids.clear();
            cache.id_count = 0;
        }
        cache.id_count += 1;
        cache
            .ids
            .entry(kind)
            .or_default()
            .entry(subject.to_owned())
            .or_default()
            .insert(schema.to_owned(), id);
        Ok(id)
    }

    /// The latest version of `subject`, from the cache when fetched before (within the time to
    /// live).
    ///
    /// # Errors
    /// As [`SchemaRegistry::register`]; an unknown subject is `Fix`.
    pub async fn latest(&self, subject: &str) -> Result<RegisteredSchema, RegistryError> {
        if let Some((found, at)) = self.cache().latest.get(subject) {
            if self.inner.latest_ttl.is_none_or(|ttl| at.elapsed() < ttl) {
                return Ok(found.clone());
            }
        }
        let found = self.fetch_version(subject, "latest").await?;
        let mut cache = self.cache();
        cache
            .latest
            .insert(subject.to_owned(), (found.clone(), Instant::now()));
        cache
            .versions
            .insert((subject.to_owned(), found.version), found.clone());
        Ok(found)
    }

    /// Drops the cached latest version of `subject`: the next [`SchemaRegistry::latest`] asks.
    pub fn forget_latest(&self, subject: &str) {
        self.cache().latest.remove(subject);
    }

    /// Version `version` of `subject`, cached for good once fetched.
    ///
    /// # Errors
    /// As [`SchemaRegistry::register`]; an unknown subject or version is `Fix`.
    pub async fn version(
        &self,
        subject: &str,
        version: i32,
    ) -> Result<RegisteredSchema, RegistryError> {
        if let Some(found) = self.cache().versions.get(&(subject.to_owned(), version)) {
            return Ok(found.clone());
        }
        let found = self.fetch_version(subject, &version.to_string()).await?;
        self.cache()
            .versions
            .insert((subject.to_owned(), version), found.clone());
        Ok(found)
    }

    /// The registry's global compatibility level (`GET /config`): also a check that the URL
    /// and the credentials work.
    ///
    /// # Errors
    /// As [`SchemaRegistry::register`].
    pub async fn compatibility(&self) -> Result<String, RegistryError> {
        #[derive(Deserialize)]
        struct ConfigAnswer {
            #[serde(rename = "compatibilityLevel", alias = "compatibility")]
            level: String,
        }
        let answer: ConfigAnswer = self
            .call(
                "read the global configuration",
                Method::GET,
                "/config",
                None,
            )
            .await?;
        Ok(answer.level)
    }

    /// The schema with id `id` and its kind, cached for good once fetched.
    ///
    /// # Errors
    /// As [`SchemaRegistry::register`]; an unknown id is `Fix`.
    pub async fn schema(&self, id: u32) -> Result<(SchemaKind, Arc<str>), RegistryError> {
        if let Some(found) = self.cache().schemas.get(&id) {
            return Ok(found.clone());
        }
        let call = format!("fetch the schema with id {id}");
        let answer: SchemaAnswer = self
            .call(&call, Method::GET, &format!("/schemas/ids/{id}"), None)
            .await?;
        let kind = kind(&call, answer.schema_type.as_deref())?;
        let found = (kind, Arc::<str>::from(answer.schema));
        self.cache().schemas.insert(id, found.clone());
        Ok(found)
    }

    async fn fetch_version(
        &self,
        subject: &str,
        version: &str,
    ) -> Result<RegisteredSchema, RegistryError> {
        let call = format!("fetch version {version} of subject {subject:?}");
        let path = format!("/subjects/{}/versions/{version}", segment(subject));
        let answer: VersionAnswer = self.call(&call, Method::GET, &path, None).await?;
        let found = RegisteredSchema {
            kind: kind(&call, answer.schema_type.as_deref())?,
            subject: answer.subject,
            version: answer.version,
            id: schema_id(&call, answer.id)?,
            schema: Arc::from(answer.schema),
        };
        self.cache()
            .schemas
            .insert(found.id, (found.kind, found.schema.clone()));
        Ok(found)
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        // A panic while the lock was held leaves only fully inserted entries behind.
        self.inner.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One call, retried while its failure is a passing one, its answer parsed as `T`.
    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, RegistryError> {
        let policy = &self.inner.retry;
        let mut backoff = Backoff::new(policy.initial_backoff, policy.max_backoff);
        let mut attempt = 1;
        loop {
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            let result = self
                .inner
                .transport
                .send(call, method.clone(), path, body.clone())
                .await
                .and_then(|answer| answered(call, answer));
            let error = match result {
                Ok(bytes) => {
                    return serde_json::from_slice(&bytes).map_err(|e| RegistryError::BadResponse {
                        call: call.to_owned(),
                        reason: e.to_string(),
                    })
                }
                Err(error) => error,
            };
            if !error.consequence().is_retry() || attempt >= policy.attempts.max(1) {
                return Err(error);
            }
            let delay = backoff.next_delay(rand::random::<f64>());
            tracing::warn!(
                registry = %self.inner.transport.endpoint(),
                attempt,
                retry_in_ms = delay.as_millis() as u64,
                "{error}"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

/// The body of a 2xx answer, or the registry's refusal.
fn answered(call: &str, answer: crate::transport::Answer) -> Result<bytes::Bytes, RegistryError> {
    if (200..300).contains(&answer.status) {
        return Ok(answer.body);
    }
    let (code, message) = match serde_json::from_slice::<ErrorAnswer>(&answer.body) {
        Ok(error) => (
            error.error_code,
            error.message.unwrap_or_else(|| "(no message)".to_owned()),
        ),
        Err(_) => {
            let text = String::from_utf8_lossy(&answer.body);
            let mut text: String = text.chars().take(200).collect();
            if text.is_empty() {
                text = "(empty body)".to_owned();
            }
            (None, text)
        }
    };
    Err(RegistryError::Refused {
        call: call.to_owned(),
        status: answer.status,
        code,
        message,
    })
}

fn segment(subject: &str) -> String {
    utf8_percent_encode(subject, PATH_SEGMENT).to_string()
}

fn schema_id(call: &str, id: i64) -> Result<u32, RegistryError> {
    u32::try_from(id).map_err(|_| RegistryError::BadResponse {
        call: call.to_owned(),
        reason: format!("the schema id {id} does not fit the 4 bytes of a framed record"),
    })
}

fn kind(call: &str, wire: Option<&str>) -> Result<SchemaKind, RegistryError> {
    SchemaKind::from_wire(wire).ok_or_else(|| RegistryError::BadResponse {
        call: call.to_owned(),
        reason: format!("unknown schemaType {wire:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_subjects_follow_the_topic_name_strategy() {
        assert_eq!(
            value_subject("outbox.event.Order"),
            "outbox.event.Order-value"
        );
    }

    #[test]
    fn subjects_are_escaped_in_paths() {
        assert_eq!(segment("orders-value"), "orders-value");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
        assert_eq!(segment("ünï.x_y~"), "%C3%BCn%C3%AF.x_y~");
    }

    #[test]
    fn refusals_carry_the_registry_error_code() {
        let answer = crate::transport::Answer {
            status: 404,
            body: bytes::Bytes::from_static(
                br#"{"error_code":40401,"message":"Subject not found: x"}"#,
            ),
        };
        assert_eq!(
            answered("c", answer),
            Err(RegistryError::Refused {
                call: "c".to_owned(),
                status: 404,
                code: Some(40401),
                message: "Subject not found: x".to_owned()
            })
        );
        let html = crate::transport::Answer {
            status: 502,
            body: bytes::Bytes::from_static(b"<html>bad gateway</html>"),
        };
        let err = answered("c", html).unwrap_err();
        assert!(err.consequence().is_retry());
        assert!(err.to_string().contains("bad gateway"));
    }

    #[test]
    fn kinds() {
        assert_eq!(SchemaKind::from_wire(None), Some(SchemaKind::Avro));
        assert_eq!(SchemaKind::from_wire(Some("JSON")), Some(SchemaKind::Json));
        assert_eq!(SchemaKind::from_wire(Some("XML")), None);
        assert_eq!(SchemaKind::Avro.wire(), None);
    }
}
