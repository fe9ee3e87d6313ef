//! How a Siphon of the bench writes record values, and what the rows with a schema registry
//! count of its requests to it.
//!
//! The backlog's drains write Siphon's default values (`format.value = "json"`: the payload as
//! a JSON string). The Avro rows write `format.value = "avro"` through the bench's
//! rivven-schema registry, with expanded payloads (a record of the schema inferred from each
//! payload, as Debezium's Event Router writes them through Confluent's `AvroConverter`) and
//! without (the payload as an Avro string); the expanded JSON row is what the expanded Avro row
//! is compared with.

use super::promhist;
use anyhow::{bail, Result};

/// Siphon's counter of HTTP requests to the schema registry. Siphon updates it on its status
/// tick ([`STATUS_TICK`]), so it is read a tick after the drain.
pub const REGISTRY_REQUESTS: &str = "siphon_schema_registry_requests_total";

/// Siphon's counter of records whose schema id the session did not know and looked up (each
/// lookup that misses the registry client's cache is a request; none is made without one).
/// Counted as they happen.
pub const SCHEMA_ID_LOOKUPS: &str = "siphon_schema_ids_looked_up_total";

/// Siphon's counter of records handed to the sink.
pub const RECORDS_PRODUCED: &str = "siphon_records_produced_total";

/// How often Siphon updates [`REGISTRY_REQUESTS`] (its default status tick), with a margin.
pub const STATUS_TICK: std::time::Duration = std::time::Duration::from_millis(5_500);

/// Records a drain with a registry hands to its sink before its registry calls are counted
/// "after warm-up": by then every topic of the backlog has had its first record (each backlog
/// transaction writes to both), so each schema has its id.
pub const REGISTRY_WARM_UP_RECORDS: f64 = 10_000.0;

/// The encoding of record values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// `format.value = "json"`, Siphon's default: the payload as a JSON string.
    Json,
    /// `format.value = "json"` with `router."table.expand.json.payload" = true`: the payload
    /// as a JSON document.
    JsonExpanded,
    /// `format.value = "avro"`: the payload as an Avro string, framed with its schema's id.
    Avro,
    /// `format.value = "avro"` with expanded payloads: an Avro record of the schema inferred
    /// from each payload, framed with its schema's id.
    AvroExpanded,
}

impl Values {
    /// Whether Siphon needs the schema registry for them.
    pub fn uses_registry(self) -> bool {
        matches!(self, Values::Avro | Values::AvroExpanded)
    }

    /// Their sections of Siphon's configuration (none for the default), with the registry at
    /// `registry_url` when they use one.
    ///
    /// # Errors
    /// When they use a registry and there is none.
    pub fn config_lines(self, registry_url: Option<&str>) -> Result<String> {
        let expand = "[router]\n\"table.expand.json.payload\" = true\n";
        let avro = |url: Option<&str>| -> Result<String> {
            let Some(url) = url else {
                bail!("format.value = \"avro\" needs the bench's schema registry, which did not start");
            };
            Ok(format!(
                "[format]\nvalue = \"avro\"\n\n[schema_registry]\nurl = \"{url}\"\n"
            ))
        };
        Ok(match self {
            Values::Json => String::new(),
            Values::JsonExpanded => expand.to_owned(),
            Values::Avro => avro(registry_url)?,
            Values::AvroExpanded => format!("{expand}\n{}", avro(registry_url)?),
        })
    }
}

/// Siphon's counters in one scrape of its metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counters {
    pub records: f64,
    pub requests: f64,
    pub lookups: f64,
}

impl Counters {
    pub fn scraped(text: &str) -> Counters {
        Counters {
            records: promhist::sum_of(text, RECORDS_PRODUCED),
            requests: promhist::sum_of(text, REGISTRY_REQUESTS),
            lookups: promhist::sum_of(text, SCHEMA_ID_LOOKUPS),
        }
    }
}

/// A drain's calls to the schema registry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegistryCalls {
    /// [`REGISTRY_REQUESTS`] in all, a status tick after the drain.
    pub requests: f64,
    /// [`SCHEMA_ID_LOOKUPS`] in all.
    pub lookups: f64,
    /// (schema-id lookups, records) from the first scrape at or past
    /// [`REGISTRY_WARM_UP_RECORDS`] records to the end; `None` when the drain ended before.
    pub after_warm_up: Option<(f64, f64)>,
}

impl RegistryCalls {
    /// The calls of a drain from its scrape after warm-up and its last one.
    pub fn new(warm: Option<Counters>, end: Counters) -> RegistryCalls {
        RegistryCalls {
            requests: end.requests,
            lookups: end.lookups,
            after_warm_up: warm.map(|w| (end.lookups - w.lookups, end.records - w.records)),
        }
    }

    /// Schema-id lookups per 1,000 records after warm-up: at least the registry calls then.
    pub fn per_1000_after_warm_up(&self) -> Option<f64> {
        self.after_warm_up
            .filter(|(_, records)| *records > 0.0)
            .map(|(lookups, records)| lookups * 1000.0 / records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_sections_follow_the_values() -> Result<()> {
        assert_eq!(Values::Json.config_lines(None)?, "");
        let expanded = Values::JsonExpanded.config_lines(None)?;
        assert!(expanded.contains("\"table.expand.json.payload\" = true"));
        assert!(Values::Avro.config_lines(None).is_err());
        let avro = Values::AvroExpanded.config_lines(Some("http://127.0.0.1:1"))?;
        assert!(avro.contains("[router]") && avro.contains("value = \"avro\""));
        assert!(avro.contains("url = \"http://127.0.0.1:1\""));
        let plain = Values::Avro.config_lines(Some("http://127.0.0.1:1"))?;
        assert!(!plain.contains("expand"));
        // Each is valid TOML with the sections Siphon reads.
        let parsed: toml::Table = avro.parse()?;
        assert!(parsed.contains_key("schema_registry") && parsed.contains_key("format"));
        assert!(Values::AvroExpanded.uses_registry() && !Values::JsonExpanded.uses_registry());
        Ok(())
    }

    #[test]
    fn calls_after_warm_up_are_counted_from_the_warm_scrape() {
        let metrics = format!(
            "# TYPE x counter\n{RECORDS_PRODUCED}{{topic=\"a\"}} 6000\n{RECORDS_PRODUCED}{{topic=\"b\"}} 6000\n{SCHEMA_ID_LOOKUPS} 2\n{REGISTRY_REQUESTS} 0\n"
        );
        let warm = Counters::scraped(&metrics);
        assert_eq!(
            warm,
            Counters {
                records: 12_000.0,
                requests: 0.0,
                lookups: 2.0
            }
        );
        let end = Counters {
            records: 212_000.0,
            requests: 2.0,
            lookups: 3.0,
        };
        let calls = RegistryCalls::new(Some(warm), end);
        assert_eq!((calls.requests, calls.lookups), (2.0, 3.0));
        assert_eq!(calls.per_1000_after_warm_up(), Some(0.005));
        assert_eq!(RegistryCalls::new(None, end).per_1000_after_warm_up(), None);
    }
}
