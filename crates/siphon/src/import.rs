//! `siphon import-debezium`: a Debezium PostgreSQL connector configuration, as Kafka Connect
//! takes it (JSON), turned into a `siphon.toml`, with a note for everything that does not carry
//! over.
//!
//! The conversion is a pure function ([`import_debezium`]); the caller prints
//! [`Import::toml`] and shows [`Import::notes`] to the user.
//!
//! # Invariants
//! - Every key of the connector configuration is either carried into the TOML or named in a
//!   note with the reason; unknown or unsupported keys never fail the import.
//! - Errors are only for input that is not a Debezium PostgreSQL connector configuration with an
//!   outbox `EventRouter` transform, or not JSON.
//! - The database password never reaches the output: it is not written into the TOML and no note
//!   repeats it (nor the value of any other key that looks secret).
//! - The TOML only uses keys and values Siphon's configuration accepts, so it parses as a
//!   [`crate::config::Config`]. Router options are copied verbatim and not checked here:
//!   `siphon check-config` names any option Siphon's router does not support.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// `connector.class` of the Debezium PostgreSQL connector.
pub const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
/// `transforms.<name>.type` of Debezium's outbox Event Router.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

const TOPIC_NAME_MATCHES: &str = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches";
const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
const BYTE_ARRAY_CONVERTER: &str = "org.apache.kafka.connect.converters.ByteArrayConverter";
const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";
const SIMPLE_HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";

/// Written when the connector configuration names no brokers (they belong to the worker).
pub const BOOTSTRAP_PLACEHOLDER: &str = "127.0.0.1:9092";

/// The result of a conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The Siphon configuration, starting with a comment saying where it came from.
    pub toml: String,
    /// What could not be carried over, each with the reason, and warnings; one entry per item.
    pub notes: Vec<String>,
}

/// Input that cannot be converted at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not JSON.
    #[error("the connector configuration is not valid JSON: {0}")]
    InvalidJson(#[from] serde_json::Error),
    /// JSON, but not an object.
    #[error("expected a JSON object: a Kafka Connect connector configuration, either the config map itself or {{\"name\": ..., \"config\": {{...}}}}")]
    NotAnObject,
    /// No `connector.class`.
    #[error("connector.class is missing: this is not a Kafka Connect connector configuration (expected connector.class = {POSTGRES_CONNECTOR})")]
    MissingConnectorClass,
    /// Another connector.
    #[error("connector.class is {found}, not {POSTGRES_CONNECTOR}: only Debezium PostgreSQL connectors can be imported")]
    NotPostgres {
        /// The `connector.class` found.
        found: String,
    },
    /// No outbox Event Router among the transforms.
    #[error("no transform of type {EVENT_ROUTER} ({found}): Siphon streams transactional-outbox events, so it can only take over a connector that applies the outbox Event Router")]
    NoEventRouter {
        /// What the configuration has instead, e.g. `transforms: unwrap (io.debezium.transforms.ExtractNewRecordState)`.
        found: String,
    },
}

/// Converts a Kafka Connect configuration of a Debezium PostgreSQL connector into a Siphon
/// configuration.
///
/// `json` is either the bare config map or `{"name": ..., "config": {...}}` (what the Connect
/// REST API takes and returns); values may be strings, numbers or booleans.
///
/// # Errors
/// [`ImportError`] when the input is not JSON, not a Debezium PostgreSQL connector
/// configuration, or has no outbox `EventRouter` transform.
pub fn import_debezium(json: &str) -> Result<Import, ImportError> {
    let document: serde_json::Value = serde_json::from_str(json)?;
    let (name, config) = connector_config(&document)?;
    let mut notes = Vec::new();
    let mut props = Props::new(config, &mut notes);
    let name = name.or_else(|| props.peek("name").map(str::to_owned));
    props.take("name");

    let class = props
        .take("connector.class")
        .ok_or(ImportError::MissingConnectorClass)?;
    if class != POSTGRES_CONNECTOR {
        return Err(ImportError::NotPostgres { found: class });
    }
    let chain = transform_chain(&mut props);
    let Some(router_index) = chain.iter().position(|t| t.kind == EVENT_ROUTER) else {
        let found = if chain.is_empty() {
            "the configuration has no transforms".to_owned()
        } else {
            let list: Vec<String> = chain
                .iter()
                .map(|t| format!("{} ({})", t.name, t.kind))
                .collect();
            format!("transforms: {}", list.join(", "))
        };
        return Err(ImportError::NoEventRouter { found });
    };

    let mut out = Output::default();
    let tables = source_section(&mut props, &mut out, &mut notes);
    kafka_section(&mut props, &mut out, &mut notes);
    router_section(
        &mut props,
        &chain,
        router_index,
        &tables,
        &mut out,
        &mut notes,
    );
    format_section(&mut props, &mut out, &mut notes);
    leftovers(&props, &mut notes);

    Ok(Import {
        toml: out.render(name.as_deref(), &notes),
        notes,
    })
}

// ---------------------------------------------------------------------------------------------
// Input

/// Picks the config map out of either accepted shape, with the connector name if given.
fn connector_config(
    document: &serde_json::Value,
) -> Result<(Option<String>, &serde_json::Map<String, serde_json::Value>), ImportError> {
    let object = document.as_object().ok_or(ImportError::NotAnObject)?;
    if !object.contains_key("connector.class") {
        if let Some(config) = object.get("config") {
            let config = config.as_object().ok_or(ImportError::NotAnObject)?;
            let name = object
                .get("name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            return Ok((name, config));
        }
    }
    Ok((None, object))
}

/// The connector configuration as Kafka Connect sees it: every value a string. Keys read by the
/// conversion are marked, so the rest can be noted at the end.
struct Props {
    values: BTreeMap<String, String>,
    used: BTreeSet<String>,
}

impl Props {
    fn new(config: &serde_json::Map<String, serde_json::Value>, notes: &mut Vec<String>) -> Props {
        let mut values = BTreeMap::new();
        for (key, value) in config {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null => {
                    notes.push(format!(
                        "`{key}` is null: treated as not set (Kafka Connect then uses its default)"
                    ));
                    continue;
                }
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                    notes.push(format!(
                        "`{key}` is a JSON {}, not a string, number or boolean: Kafka Connect would refuse it; ignored",
                        if value.is_array() { "array" } else { "object" }
                    ));
                    continue;
                }
            };
            values.insert(key.clone(), text);
        }
        Props {
            values,
            used: BTreeSet::new(),
        }
    }

    /// The value, trimmed (Kafka Connect trims configuration values), marking the key as read.
    fn take(&mut self, key: &str) -> Option<String> {
        let value = self.values.get(key)?.trim().to_owned();
        self.used.insert(key.to_owned());
        Some(value)
    }

    fn peek(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|v| v.trim())
    }

    /// Keys starting with `prefix` not read yet, in order.
    fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.values
            .keys()
            .filter(|k| k.starts_with(prefix) && !self.used.contains(*k))
            .cloned()
            .collect()
    }
}

/// Whether a value must not be repeated in a note.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "token",
        "credential",
        "api.key",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// `${provider:path:key}` or `${provider:key}`: a Kafka Connect config-provider reference,
/// resolved by the worker, never by Siphon. Returns `(provider, rest)`.
fn provider_reference(value: &str) -> Option<(&str, &str)> {
    let start = value.find("${")?;
    let inner = &value[start + 2..];
    let inner = &inner[..inner.find('}')?];
    let (provider, rest) = inner.split_once(':')?;
    let valid_name = !provider.is_empty()
        && provider
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    valid_name.then_some((provider, rest))
}

/// A `${...}` that is not a config-provider reference: a template placeholder (envsubst and
/// the like) that was meant to be filled in before the configuration reached Kafka Connect.
fn is_placeholder(value: &str) -> bool {
    value.contains("${") && provider_reference(value).is_none()
}

fn describe_reference(provider: &str, rest: &str) -> String {
    match provider {
        "file" => match rest.rsplit_once(':') {
            Some((path, key)) => {
                format!("Kafka Connect's file config provider (key `{key}` of {path})")
            }
            None => format!("Kafka Connect's file config provider ({rest})"),
        },
        "env" => format!("Kafka Connect's env config provider (environment variable {rest})"),
        "directory" => format!("Kafka Connect's directory config provider ({rest})"),
        other => format!("the Kafka Connect config provider `{other}` ({rest})"),
    }
}

/// One transform of the `transforms` chain.
struct Transform {
    name: String,
    kind: String,
    predicate: Option<String>,
    negate: bool,
}

fn transform_chain(props: &mut Props) -> Vec<Transform> {
    let Some(list) = props.take("transforms") else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| Transform {
            name: name.to_owned(),
            kind: props
                .take(&format!("transforms.{name}.type"))
                .unwrap_or_default(),
            predicate: props
                .take(&format!("transforms.{name}.predicate"))
                .filter(|p| !p.is_empty()),
            negate: props
                .take(&format!("transforms.{name}.negate"))
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Output

/// One table of the output, keys in the order they were set (a reader expects `url` first).
#[derive(Default)]
struct Section(Vec<(String, toml::Value)>);

impl Section {
    fn insert(&mut self, key: String, value: toml::Value) {
        self.0.retain(|(k, _)| *k != key);
        self.0.push((key, value));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `[header]` and one line per key, each serialized by the `toml` crate so keys and values
    /// are quoted and escaped as TOML requires.
    fn render(&self, header: &str, text: &mut String) {
        if self.is_empty() {
            return;
        }
        let _ = writeln!(text, "\n[{header}]");
        for (key, value) in &self.0 {
            let mut line = toml::Table::new();
            line.insert(key.clone(), value.clone());
            // A one-entry table of a string, integer, boolean or array always serializes.
            text.push_str(&toml::to_string(&line).unwrap_or_default());
        }
    }
}

/// The sections being built.
#[derive(Default)]
struct Output {
    source: Section,
    kafka: Section,
    properties: Section,
    topic_creation: Section,
    router: Section,
    format: Section,
}

impl Output {
    fn render(self, name: Option<&str>, notes: &[String]) -> String {
        let mut text = String::new();
        let origin = match name {
            Some(name) => format!("the Debezium connector \"{}\"", comment_text(name)),
            None => "a Debezium connector configuration".to_owned(),
        };
        let _ = writeln!(text, "# Siphon configuration imported from {origin}");
        let _ = writeln!(
            text,
            "# ({POSTGRES_CONNECTOR}) by `siphon import-debezium`."
        );
        let _ = writeln!(
            text,
            "# Check it with `siphon check-config --config FILE` before switching."
        );
        if !notes.is_empty() {
            let _ = writeln!(text, "#\n# Not carried over, and warnings:");
            for note in notes {
                let note = comment_text(note);
                let mut lines = note.lines();
                if let Some(first) = lines.next() {
                    let _ = writeln!(text, "# - {first}");
                }
                for line in lines {
                    let _ = writeln!(text, "#   {line}");
                }
            }
        }
        self.source.render("source", &mut text);
        self.kafka.render("kafka", &mut text);
        self.properties.render("kafka.properties", &mut text);
        self.topic_creation
            .render("kafka.topic_creation", &mut text);
        self.router.render("router", &mut text);
        self.format.render("format", &mut text);
        text
    }
}

/// Text safe inside a TOML comment: control characters other than newlines (which the caller
/// splits on) become spaces.
fn comment_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\n' { ' ' } else { c })
        .collect()
}

fn string(value: impl Into<String>) -> toml::Value {
    toml::Value::String(value.into())
}

// ---------------------------------------------------------------------------------------------
// [source]

/// Fills `[source]`; returns the outbox tables written (for the predicate check).
fn source_section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) -> Vec<String> {
    // Connection URL, without the password.
    let mut part = |key: &str, placeholder: &str, notes: &mut Vec<String>| -> Option<String> {
        let value = props.take(key)?;
        if let Some((provider, rest)) = provider_reference(&value) {
            notes.push(format!(
                "`{key}` comes from {}, which Siphon does not read: replace {placeholder} in source.url",
                describe_reference(provider, rest)
            ));
            return Some(placeholder.to_owned());
        }
        if is_placeholder(&value) {
            notes.push(format!(
                "`{key}` = `{value}` is a template placeholder: replace {placeholder} in source.url"
            ));
            return Some(placeholder.to_owned());
        }
        Some(value)
    };
    let host = part("database.hostname", "HOST", notes).unwrap_or_else(|| {
        notes.push("`database.hostname` is not set: replace HOST in source.url".into());
        "HOST".into()
    });
    let port = match part("database.port", "5432", notes) {
        None => 5432,
        Some(p) => p.parse::<u16>().unwrap_or_else(|_| {
            notes.push(format!(
                "`database.port` = `{p}` is not a port number: 5432 written instead"
            ));
            5432
        }),
    };
    let user = part("database.user", "USER", notes).unwrap_or_else(|| {
        notes.push("`database.user` is not set: replace USER in source.url".into());
        "USER".into()
    });
    let dbname = part("database.dbname", "DBNAME", notes).unwrap_or_else(|| {
        notes.push("`database.dbname` is not set: replace DBNAME in source.url".into());
        "DBNAME".into()
    });
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!(
        "postgres://{}@{host}:{port}/{}",
        percent_encode(&user),
        percent_encode(&dbname)
    );
    out.source.insert("url".into(), string(url.clone()));
    let with_password = url.replacen('@', ":PASSWORD@", 1);
    match props.take("database.password") {
        Some(p) => match provider_reference(&p) {
            Some((provider, rest)) => notes.push(format!(
                "The database password comes from {}, which Siphon does not read, and is not written into the file: set SIPHON_SOURCE_URL={with_password} in Siphon's environment (or put the password into source.url)",
                describe_reference(provider, rest)
            )),
            None => notes.push(format!(
                "The database password is not written into the file: set SIPHON_SOURCE_URL={with_password} in Siphon's environment (or put the password into source.url)"
            )),
        },
        None => notes.push(format!(
            "`database.password` is not set: if the server needs one, set SIPHON_SOURCE_URL={with_password}"
        )),
    }

    // Logical decoding plugin, slot and publication.
    let plugin = props.take("plugin.name");
    let slot = props.take("slot.name").unwrap_or_else(|| "debezium".into());
    match plugin.as_deref() {
        Some("pgoutput") => {
            out.source.insert("slot".into(), string(slot));
        }
        other => {
            let new_slot = if slot == "siphon" {
                "siphon_pgoutput"
            } else {
                "siphon"
            };
            let shown = match other {
                Some(p) => format!("`plugin.name` is `{p}`"),
                None => {
                    "`plugin.name` is not set, so Debezium used its default, decoderbufs".into()
                }
            };
            notes.push(format!(
                "{shown}: Siphon reads pgoutput slots only, so it cannot continue from slot `{slot}`. \
                 source.slot is set to a new slot, `{new_slot}`: create it while Debezium still runs \
                 (SELECT pg_create_logical_replication_slot('{new_slot}', 'pgoutput')), then stop Debezium \
                 and start Siphon; events between the two are sent again (same `id` header), none is lost. \
                 Drop `{slot}` afterwards"
            ));
            out.source.insert("slot".into(), string(new_slot));
        }
    }
    let publication = props
        .take("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());
    out.source
        .insert("publication".into(), string(publication.clone()));
    let autocreate = props
        .take("publication.autocreate.mode")
        .unwrap_or_else(|| "all_tables".into());
    match autocreate.as_str() {
        "filtered" => {}
        "all_tables" => notes.push(format!(
            "`publication.autocreate.mode` is `all_tables`{}: if Debezium created `{publication}`, it is FOR ALL TABLES. \
             Siphon uses the existing publication as it is and skips changes of tables not in source.tables",
            if props.peek("publication.autocreate.mode").is_none() { " (Debezium's default)" } else { "" }
        )),
        other => notes.push(format!(
            "`publication.autocreate.mode` = `{other}`: Siphon uses publication `{publication}` if it exists and otherwise creates it FOR TABLE <source.tables>"
        )),
    }

    // Tables.
    let include = props
        .take("table.include.list")
        .map(|v| ("table.include.list", v))
        .or_else(|| {
            props
                .take("table.whitelist")
                .map(|v| ("table.whitelist", v))
        });
    let mut tables = Vec::new();
    match include {
        None => notes.push(
            "Neither `table.include.list` nor `table.whitelist` is set, so Debezium captured every table of the publication: \
             source.tables is set to Siphon's default, public.outbox; list the outbox tables explicitly"
                .into(),
        ),
        Some((key, list)) => {
            for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                match plain_table(entry) {
                    Some(table) => {
                        if table.chars().any(|c| c.is_ascii_uppercase()) {
                            notes.push(format!(
                                "`{key}` entry `{entry}` has upper-case letters: Debezium matched it ignoring case, Siphon folds unquoted names to lower case; \
                                 if the table name really has upper-case letters, write it quoted in source.tables (\"\\\"Schema\\\".\\\"Table\\\"\")"
                            ));
                        }
                        tables.push(table);
                    }
                    None => notes.push(format!(
                        "`{key}` entry `{entry}` is a regular expression, not a table name: Siphon needs the outbox tables by name; add them to source.tables"
                    )),
                }
            }
            if tables.is_empty() {
                notes.push(format!(
                    "No table of `{key}` could be carried over: source.tables is set to Siphon's default, public.outbox; list the outbox tables explicitly"
                ));
            }
        }
    }
    if tables.is_empty() {
        tables.push("public.outbox".into());
    }
    out.source.insert(
        "tables".into(),
        toml::Value::Array(tables.iter().map(|t| string(t.clone())).collect()),
    );

    if let Some(ms) = props.take("status.update.interval.ms") {
        match ms.parse::<i64>() {
            Ok(ms) if ms >= 0 => {
                out.source
                    .insert("status_interval_ms".into(), toml::Value::Integer(ms));
            }
            _ => notes.push(format!(
                "`status.update.interval.ms` = `{ms}` is not a number of milliseconds: not carried over"
            )),
        }
    }

    for key in props.keys_with_prefix("database.") {
        if key == "database.server.name" {
            continue; // Debezium 1.x's topic.prefix: read with the router.
        }
        let value = props.take(&key).unwrap_or_default();
        let reason = if key.starts_with("database.ssl") {
            "TLS to PostgreSQL is not configurable in Siphon yet"
        } else if key == "database.initial.statements" {
            "Siphon runs no initial statements on its connections"
        } else {
            "no Siphon equivalent"
        };
        notes.push(keyed(&key, &value, reason));
    }
    tables
}

/// A `table.include.list` entry that names one table: `schema.table`, with the dot possibly
/// escaped (`schema\.table`) and optional `^`/`$` anchors. Returns `schema.table`.
fn plain_table(entry: &str) -> Option<String> {
    let entry = entry.strip_prefix('^').unwrap_or(entry);
    let entry = entry.strip_suffix('$').unwrap_or(entry);
    let name = entry.replace("\\.", ".");
    let (schema, table) = name.split_once('.')?;
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
            && !s.starts_with(|c: char| c.is_ascii_digit() || c == '$')
    };
    (ident(schema) && ident(table)).then_some(name)
}

/// Percent-encodes what is not unreserved in a URL component (RFC 3986).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn keyed(key: &str, value: &str, reason: &str) -> String {
    if is_secret(key) {
        format!("`{key}` (value not shown): {reason}")
    } else {
        format!("`{key}` = `{value}`: {reason}")
    }
}

// ---------------------------------------------------------------------------------------------
// [kafka]

/// How a Java producer property carries over to librdkafka.
enum ProducerProperty<'a> {
    /// The librdkafka property of that name takes the same value.
    Same(&'a str),
    /// Fixed by Siphon to this value.
    Fixed(&'static str),
    /// Cannot carry over, for this reason.
    No(&'static str),
}

fn producer_property(java: &str) -> ProducerProperty<'_> {
    use ProducerProperty::{Fixed, No, Same};
    match java {
        "compression.type"
        | "linger.ms"
        | "batch.size"
        | "client.id"
        | "retries"
        | "retry.backoff.ms"
        | "request.timeout.ms"
        | "max.in.flight.requests.per.connection"
        | "metadata.max.age.ms"
        | "connections.max.idle.ms"
        | "reconnect.backoff.ms"
        | "reconnect.backoff.max.ms"
        | "socket.connection.setup.timeout.ms"
        | "security.protocol"
        | "sasl.mechanism"
        | "sasl.kerberos.service.name"
        | "ssl.endpoint.identification.algorithm"
        | "ssl.cipher.suites"
        | "ssl.keystore.location"
        | "ssl.keystore.password"
        | "ssl.key.password" => Same(java),
        "max.request.size" => Same("message.max.bytes"),
        "delivery.timeout.ms" => Same("message.timeout.ms"),
        "send.buffer.bytes" => Same("socket.send.buffer.bytes"),
        "receive.buffer.bytes" => Same("socket.receive.buffer.bytes"),
        "acks" => Fixed("all"),
        "enable.idempotence" => Fixed("true"),
        "bootstrap.servers" => No("used as kafka.bootstrap_servers"),
        "sasl.jaas.config" => No("librdkafka takes the SASL credentials as sasl.username and sasl.password: set them in [kafka.properties], the password preferably with SIPHON_KAFKA_PROPERTIES_SASL_PASSWORD"),
        "ssl.truststore.location" | "ssl.truststore.password" | "ssl.truststore.type" => No("librdkafka reads CA certificates in PEM: convert the truststore and set ssl.ca.location"),
        "ssl.keystore.type" => No("librdkafka reads a PKCS#12 keystore (ssl.keystore.location) or PEM files (ssl.certificate.location, ssl.key.location)"),
        "buffer.memory" => No("Siphon bounds producer memory with pipeline.max_in_flight_bytes"),
        "partitioner.class" => No("Siphon always partitions by murmur2 of the key, as the Java client's default partitioner does; a custom partitioner cannot carry over"),
        "key.serializer" | "value.serializer" => No("Siphon writes the bytes the [format] section describes"),
        "transactional.id" | "transaction.timeout.ms" => No("Siphon does not use Kafka transactions; it uses the idempotent producer"),
        _ => No("no known librdkafka equivalent; add the librdkafka property to [kafka.properties] by hand if it matters"),
    }
}

fn kafka_section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) {
    let mut bootstrap = None;
    for key in props.keys_with_prefix("producer.override.") {
        let value = props.take(&key).unwrap_or_default();
        let java = &key["producer.override.".len()..];
        if java == "bootstrap.servers" {
            bootstrap = Some(value);
            continue;
        }
        match producer_property(java) {
            ProducerProperty::Same(name) => {
                out.properties.insert(name.to_owned(), string(value));
            }
            ProducerProperty::Fixed(fixed) => {
                let same = value.eq_ignore_ascii_case(fixed) || (java == "acks" && value == "-1");
                if !same {
                    notes.push(keyed(
                        &key,
                        &value,
                        &format!("Siphon always sets {java}={fixed} (with enable.idempotence and acks=all no acknowledged record is lost or reordered)"),
                    ));
                }
            }
            ProducerProperty::No(reason) => notes.push(keyed(&key, &value, reason)),
        }
    }
    match bootstrap {
        Some(servers) => {
            out.kafka
                .insert("bootstrap_servers".into(), string(servers));
            notes.push(
                "The Connect worker's own producer settings (producer.* in its properties, e.g. TLS or SASL) are not part of a connector configuration: \
                 carry what the brokers need into [kafka.properties]"
                    .into(),
            );
        }
        None => {
            out.kafka
                .insert("bootstrap_servers".into(), string(BOOTSTRAP_PLACEHOLDER));
            notes.push(format!(
                "kafka.bootstrap_servers is a placeholder ({BOOTSTRAP_PLACEHOLDER}): the brokers are the Connect worker's bootstrap.servers, \
                 not part of a connector configuration. Set them, or SIPHON_KAFKA_BOOTSTRAP_SERVERS, and carry the worker's producer \
                 settings the brokers need (producer.security.protocol, producer.sasl.*, ...) into [kafka.properties]"
            ));
        }
    }

    // topic.creation.default.* -> [kafka.topic_creation]
    let mut creation = Vec::new();
    for (key, field) in [
        ("topic.creation.default.partitions", "partitions"),
        (
            "topic.creation.default.replication.factor",
            "replication_factor",
        ),
    ] {
        if let Some(value) = props.take(key) {
            match value.parse::<i32>() {
                Ok(n) => creation.push((field, n)),
                Err(_) => notes.push(format!(
                    "`{key}` = `{value}` is not a whole number: not carried over (-1, the broker's default, applies)"
                )),
            }
        }
    }
    if !creation.is_empty() {
        out.topic_creation
            .insert("enabled".into(), toml::Value::Boolean(true));
        for (field, n) in creation {
            out.topic_creation
                .insert(field.into(), toml::Value::Integer(n.into()));
        }
    }
    for key in props.keys_with_prefix("topic.creation.") {
        let value = props.take(&key).unwrap_or_default();
        let reason = if key.starts_with("topic.creation.default.") {
            "Siphon creates topics with a partition count and replication factor only; set other topic settings as broker defaults or create the topics beforehand"
        } else {
            "Siphon has one topic-creation rule for all output topics (the default group); create topics that need other settings beforehand"
        };
        notes.push(keyed(&key, &value, reason));
    }
}

// ---------------------------------------------------------------------------------------------
// [router]

fn router_section(
    props: &mut Props,
    chain: &[Transform],
    router_index: usize,
    tables: &[String],
    out: &mut Output,
    notes: &mut Vec<String>,
) {
    let router = &chain[router_index];
    let prefix = format!("transforms.{}.", router.name);
    let mut copied = Vec::new();
    for key in props.keys_with_prefix(&prefix) {
        let option = key[prefix.len()..].to_owned();
        if matches!(option.as_str(), "type" | "predicate" | "negate") {
            continue; // Kafka Connect's own transform settings, read with the chain.
        }
        if let Some(value) = props.take(&key) {
            out.router.insert(option.clone(), string(value));
            copied.push(option);
        }
    }
    if !copied.is_empty() {
        notes.push(format!(
            "Outbox router options copied verbatim from transform `{}`: {}. `siphon check-config` names any that Siphon's router does not support yet",
            router.name,
            copied.join(", ")
        ));
    }

    // The connector's logical name: Debezium's context headers (3.2 and later) and, with
    // json-schemas, the value schema names. Also what the change-event topics start with.
    let legacy_name = props.take("database.server.name");
    let topic_prefix = props.take("topic.prefix");
    let extended = props.take("extended.headers.enabled");
    match (&topic_prefix, &legacy_name) {
        (Some(prefix), _) => {
            out.router
                .insert("topic.prefix".into(), string(prefix.clone()));
            match &extended {
                Some(e) => {
                    out.router
                        .insert("extended.headers.enabled".into(), string(e.clone()));
                }
                None => notes.push(format!(
                    "router.\"topic.prefix\" = \"{prefix}\": Siphon adds the __debezium.context.* headers Debezium 3.2 and later write. \
                     If the connector ran an older Debezium, set router.\"extended.headers.enabled\" = \"false\" to write the same headers it did"
                )),
            }
            if let Some(legacy) = &legacy_name {
                notes.push(format!(
                    "`database.server.name` = `{legacy}`: replaced by topic.prefix since Debezium 2.0; topic.prefix is used"
                ));
            }
        }
        (None, Some(legacy)) => {
            out.router
                .insert("topic.prefix".into(), string(legacy.clone()));
            out.router
                .insert("extended.headers.enabled".into(), string("false"));
            notes.push(format!(
                "`database.server.name` = `{legacy}` (Debezium 1.x) written as router.\"topic.prefix\", with router.\"extended.headers.enabled\" = \"false\": \
                 Debezium 1.x wrote no __debezium.context.* headers"
            ));
        }
        (None, None) => {
            if let Some(e) = &extended {
                notes.push(keyed(
                    "extended.headers.enabled",
                    e,
                    "the context headers need topic.prefix, which is not set; not carried over",
                ));
            }
        }
    }
    let topic_prefix = topic_prefix.or(legacy_name);
    let naming = props.take("topic.naming.strategy");
    let delimiter = props.take("topic.delimiter").unwrap_or_else(|| ".".into());
    let change_topics: Option<Vec<String>> = match (&topic_prefix, &naming) {
        (Some(prefix), None) => Some(
            tables
                .iter()
                .map(|t| format!("{prefix}{delimiter}{}", t.replacen('.', &delimiter, 1)))
                .collect(),
        ),
        _ => None,
    };
    if let Some(strategy) = &naming {
        notes.push(format!(
            "`topic.naming.strategy` = `{strategy}`: it names Debezium's change-event topics, which the outbox router replaces; not needed by Siphon"
        ));
    }

    // Predicates, on the router and on other transforms.
    let mut predicate_keys = BTreeSet::new();
    props.take("predicates");
    let mut describe_predicate = |name: &str, props: &mut Props| -> Option<Predicate> {
        let prefix = format!("predicates.{name}.");
        for key in props.keys_with_prefix(&prefix) {
            predicate_keys.insert(key);
        }
        let kind = props.take(&format!("{prefix}type"))?;
        let pattern = props.take(&format!("{prefix}pattern"));
        let header = props.take(&format!("{prefix}name"));
        Some(Predicate {
            kind,
            pattern,
            header,
        })
    };

    // The change-event topics are what a predicate sees only until a transform renames topics.
    let topics_at = |index: usize| {
        chain[..index]
            .iter()
            .all(|t| KEEPS_TOPIC.contains(&t.kind.as_str()))
            .then_some(change_topics.as_deref())
            .flatten()
    };

    if let Some(name) = &router.predicate {
        let negate = if router.negate { " (negated)" } else { "" };
        match describe_predicate(name, props) {
            None => notes.push(format!(
                "The outbox router `{}` has predicate `{name}`, which `predicates.{name}.type` does not define: Debezium would not start. \
                 Siphon applies the router to every table in source.tables",
                router.name
            )),
            Some(p) => notes.push(router_predicate_note(
                &router.name,
                name,
                negate,
                router.negate,
                &p,
                tables,
                topics_at(router_index),
            )),
        }
    }

    for (index, transform) in chain.iter().enumerate() {
        if index == router_index {
            continue;
        }
        let prefix = format!("transforms.{}.", transform.name);
        for key in props.keys_with_prefix(&prefix) {
            props.take(&key);
        }
        let place = if index < router_index {
            "before"
        } else {
            "after"
        };
        let kind = if transform.kind.is_empty() {
            "no type".to_owned()
        } else {
            transform.kind.clone()
        };
        let scope = match &transform.predicate {
            Some(name) => {
                let predicate = describe_predicate(name, props);
                let selects_outbox = predicate.as_ref().and_then(|p| {
                    p.selects_all(topics_at(index))
                        .map(|all| all != transform.negate)
                });
                match selects_outbox {
                    Some(false) => format!(
                        "; its predicate `{name}`{} does not select the outbox tables' records, so it never touched the outbox events and nothing is lost",
                        if transform.negate { " (negated)" } else { "" }
                    ),
                    _ => format!(
                        "; it applied to records selected by predicate `{name}`{}: check whether those include the outbox events",
                        if transform.negate { " (negated)" } else { "" }
                    ),
                }
            }
            None => format!(
                "; it ran {place} the outbox router on every record, so the records Siphon writes differ from Debezium's if it changed outbox events"
            ),
        };
        notes.push(format!(
            "Transform `{}` ({kind}) cannot be carried over: Siphon applies only the outbox router{scope}",
            transform.name
        ));
    }

    for key in props.keys_with_prefix("predicates.") {
        if key != "predicates" && !predicate_keys.contains(&key) {
            let value = props.take(&key).unwrap_or_default();
            notes.push(keyed(
                &key,
                &value,
                "predicate not used by any transform; ignored",
            ));
        }
    }
    for key in predicate_keys {
        props.take(&key);
    }
}

/// Transforms that never change a record's topic (so a predicate after them still sees the
/// connector's change-event topics).
const KEEPS_TOPIC: &[&str] = &[
    "io.debezium.transforms.ExtractNewRecordState",
    "org.apache.kafka.connect.transforms.Filter",
    "org.apache.kafka.connect.transforms.InsertHeader",
    "org.apache.kafka.connect.transforms.DropHeaders",
    "org.apache.kafka.connect.transforms.HeaderFrom$Key",
    "org.apache.kafka.connect.transforms.HeaderFrom$Value",
    "org.apache.kafka.connect.transforms.ReplaceField$Value",
    "org.apache.kafka.connect.transforms.MaskField$Value",
    "org.apache.kafka.connect.transforms.Cast$Value",
];

struct Predicate {
    kind: String,
    pattern: Option<String>,
    header: Option<String>,
}

impl Predicate {
    /// Whether the predicate (not negated) holds for the change-event records of every table
    /// (`Some(true)`), of none (`Some(false)`), or cannot be decided here (`None`).
    fn selects_all(&self, change_topics: Option<&[String]>) -> Option<bool> {
        if self.kind != TOPIC_NAME_MATCHES {
            return None;
        }
        let pattern = self.pattern.as_deref()?;
        let results: Vec<bool> = change_topics?
            .iter()
            .map(|t| java_full_match(pattern, t))
            .collect::<Option<_>>()?;
        if results.iter().all(|m| *m) {
            Some(true)
        } else if results.iter().all(|m| !*m) {
            Some(false)
        } else {
            None
        }
    }
}

fn router_predicate_note(
    router: &str,
    name: &str,
    negate_text: &str,
    negate: bool,
    predicate: &Predicate,
    tables: &[String],
    change_topics: Option<&[String]>,
) -> String {
    let selected = match (
        predicate.kind.as_str(),
        &predicate.pattern,
        &predicate.header,
    ) {
        (TOPIC_NAME_MATCHES, Some(pattern), _) => {
            format!("records whose topic matches `{pattern}`")
        }
        (k, _, Some(header)) if k.ends_with("HasHeaderKey") => {
            format!("records with a header `{header}`")
        }
        (k, _, _) if k.ends_with("RecordIsTombstone") => "tombstones".to_owned(),
        (k, _, _) => format!("records of predicate type {k}"),
    };
    let head = format!(
        "The outbox router `{router}` applied only to {selected} (predicate `{name}`{negate_text}); \
         Siphon applies the router to the tables in source.tables ({}) and to nothing else",
        tables.join(", ")
    );
    let topics = change_topics.map(|t| t.join(", "));
    match (predicate.selects_all(change_topics), topics) {
        (Some(all), Some(topics)) if all != negate => {
            format!("{head}. Their change-event topics ({topics}) are selected: the same records are routed")
        }
        (Some(_), Some(topics)) => format!(
            "{head}. WARNING: their change-event topics ({topics}) are not selected, so Debezium did not route them: check source.tables"
        ),
        _ => format!(
            "{head}. Check that the predicate selects exactly the change events of those tables"
        ),
    }
}

/// Whether `pattern` matches all of `text`, as Java's `Pattern.matches`, for the regular
/// expressions topic patterns usually are: literals, escapes of punctuation, `.`, `^`/`$`
/// anchors at the ends, `*`, `+` and `?` on one character, and `|` at the top level.
/// `None` when the pattern uses anything else (groups, classes, counted repetition, ...).
fn java_full_match(pattern: &str, text: &str) -> Option<bool> {
    #[derive(Clone, Copy)]
    enum Atom {
        Char(char),
        Any,
    }
    #[derive(Clone, Copy)]
    enum Repeat {
        One,
        ZeroOrMore,
        OneOrMore,
        ZeroOrOne,
    }
    fn parse(alternative: &str) -> Option<Vec<(Atom, Repeat)>> {
        let alternative = alternative.strip_prefix('^').unwrap_or(alternative);
        let alternative = match alternative.strip_suffix('$') {
            Some(a) if !a.ends_with('\\') => a,
            _ => alternative,
        };
        let mut items: Vec<(Atom, Repeat)> = Vec::new();
        let mut chars = alternative.chars().peekable();
        while let Some(c) = chars.next() {
            let atom = match c {
                '\\' => match chars.next()? {
                    e if e.is_ascii_punctuation() => Atom::Char(e),
                    _ => return None,
                },
                '.' => Atom::Any,
                '*' | '+' | '?' => {
                    let last = items.last_mut()?;
                    if !matches!(last.1, Repeat::One) {
                        // `*?` and friends: laziness does not change a full match.
                        if c == '?' {
                            continue;
                        }
                        return None;
                    }
                    last.1 = match c {
                        '*' => Repeat::ZeroOrMore,
                        '+' => Repeat::OneOrMore,
                        _ => Repeat::ZeroOrOne,
                    };
                    continue;
                }
                '(' | ')' | '[' | ']' | '{' | '}' | '^' | '$' | '|' => return None,
                other => Atom::Char(other),
            };
            items.push((atom, Repeat::One));
        }
        Some(items)
    }
    fn matches(items: &[(Atom, Repeat)], text: &[char]) -> bool {
        let Some(((atom, repeat), rest)) = items.split_first() else {
            return text.is_empty();
        };
        let one = |c: &char| match atom {
            Atom::Char(a) => a == c,
            Atom::Any => *c != '\n',
        };
        let (min, max) = match repeat {
            Repeat::One => (1, 1),
            Repeat::ZeroOrOne => (0, 1),
            Repeat::ZeroOrMore => (0, usize::MAX),
            Repeat::OneOrMore => (1, usize::MAX),
        };
        let available = text.iter().take_while(|c| one(c)).count().min(max);
        (min..=available).rev().any(|n| matches(rest, &text[n..]))
    }
    let text: Vec<char> = text.chars().collect();
    let mut any = false;
    for alternative in pattern.split('|') {
        if alternative.ends_with('\\') {
            return None;
        }
        any |= matches(&parse(alternative)?, &text);
    }
    Some(any)
}

// ---------------------------------------------------------------------------------------------
// [format]

fn format_section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) {
    for (side, key) in [("key", "key.converter"), ("value", "value.converter")] {
        let encoding = converter_encoding(props, side, key, notes);
        out.format.insert(side.into(), string(encoding));
    }
    if let Some(class) = props.take("header.converter") {
        if class != SIMPLE_HEADER_CONVERTER {
            notes.push(format!(
                "`header.converter` = `{class}`: Siphon writes headers as {SIMPLE_HEADER_CONVERTER} does (the `id` header as UTF-8 text); consumers reading headers may see different bytes"
            ));
        }
    }
    for key in props.keys_with_prefix("header.converter.") {
        let value = props.take(&key).unwrap_or_default();
        notes.push(keyed(
            &key,
            &value,
            "header converter option; not carried over",
        ));
    }
}

/// The `[format]` encoding for one converter, with notes for what Siphon cannot reproduce.
fn converter_encoding(
    props: &mut Props,
    side: &str,
    key: &str,
    notes: &mut Vec<String>,
) -> &'static str {
    let class = props.take(key);
    let schemas_key = format!("{key}.schemas.enable");
    let schemas = props.take(&schemas_key);
    let mut options = Vec::new();
    for option in props.keys_with_prefix(&format!("{key}.")) {
        let value = props.take(&option).unwrap_or_default();
        options.push((option, value));
    }
    let Some(class) = class else {
        notes.push(format!(
            "`{key}` is not set, so the Connect worker's {key} applied (Kafka's own default is {JSON_CONVERTER} with schemas.enable=true): \
             written as json (JsonConverter with schemas.enable=false); check the worker configuration and set format.{side} to match it"
        ));
        return "json";
    };
    let encoding = match class.as_str() {
        JSON_CONVERTER => {
            let with_schemas = match schemas.as_deref() {
                None => {
                    notes.push(format!(
                        "`{schemas_key}` is not set: JsonConverter's default, true, is assumed (json-schemas), since a converter set in the connector \
                         configuration does not take the worker's converter options"
                    ));
                    true
                }
                Some(v) => !v.eq_ignore_ascii_case("false"),
            };
            if with_schemas {
                "json-schemas"
            } else {
                "json"
            }
        }
        STRING_CONVERTER => "string",
        BYTE_ARRAY_CONVERTER | BINARY_DATA_CONVERTER => "binary",
        other => {
            let what = if other.contains("Avro") {
                "Avro"
            } else if other.contains("Protobuf") {
                "Protobuf"
            } else if other.contains("JsonSchema") {
                "JSON Schema"
            } else if other.contains("CloudEvents") {
                "CloudEvents"
            } else {
                "this converter's"
            };
            notes.push(format!(
                "`{key}` = `{other}`: Siphon does not support {what} encoding yet. Written as json (JsonConverter with schemas.enable=false), \
                 which produces different bytes: do not switch until the consumers accept them (or Siphon supports it)"
            ));
            "json"
        }
    };
    if class != JSON_CONVERTER {
        if let Some(v) = schemas {
            options.push((schemas_key, v));
        }
    }
    for (option, value) in options {
        let utf8 = value.eq_ignore_ascii_case("UTF-8") || value.eq_ignore_ascii_case("UTF8");
        if option.ends_with(".encoding") && utf8 {
            continue; // StringConverter's default: what Siphon writes.
        }
        notes.push(keyed(
            &option,
            &value,
            "converter option; Siphon's encodings have no options",
        ));
    }
    encoding
}

// ---------------------------------------------------------------------------------------------
// Everything else

/// Reasons for the connector options Siphon has no equivalent for, by exact key or prefix
/// (a key ending in `.` or `*` is a prefix).
const REASONS: &[(&str, &str)] = &[
    ("tasks.max", "Siphon runs one stream per slot, as the Debezium connector does with its single task"),
    ("snapshot.", "Siphon takes no snapshot: it streams from the slot's confirmed position. An outbox needs none: its rows are events, delivered when they were committed"),
    ("slot.drop.on.stop", "Siphon never drops the slot"),
    ("slot.", "Siphon manages the slot with its own settings"),
    ("heartbeat.", "Siphon writes no heartbeat records and runs no heartbeat query: while no outbox transaction is pending it confirms the server's WAL position from keepalives, so the slot advances without heartbeat writes"),
    ("topic.heartbeat.prefix", "Siphon writes no heartbeat records"),
    ("tombstones.on.delete", "no effect on outbox events: the outbox router ignores deletes (Siphon skips them too)"),
    ("signal.", "Siphon has no signalling (no ad-hoc or incremental snapshots); it reads only the outbox tables"),
    ("incremental.snapshot.", "Siphon takes no snapshots"),
    ("read.only", "Siphon takes no snapshots"),
    ("notification.", "Siphon sends no notifications"),
    ("schema.include.list", "Siphon reads the tables listed in source.tables, not whole schemas"),
    ("schema.exclude.list", "Siphon reads the tables listed in source.tables only"),
    ("schema.", "Siphon keeps no schema history and has no schema options: it learns each outbox table's columns from pgoutput's relation messages"),
    ("table.exclude.list", "Siphon reads the tables listed in source.tables only"),
    ("table.blacklist", "Siphon reads the tables listed in source.tables only"),
    ("column.", "Siphon has no column filters or masks: the outbox router reads the columns its options name"),
    ("message.key.columns", "the record key comes from the outbox router (table.field.event.key)"),
    ("decimal.handling.mode", "changes how Debezium encodes numeric columns; Siphon sends the id, key and payload columns as PostgreSQL prints them, which is what Debezium sends for text, uuid and jsonb columns"),
    ("time.precision.mode", "changes how Debezium encodes temporal columns; not used for the id, key and payload columns Siphon sends"),
    ("binary.handling.mode", "changes how Debezium encodes bytea columns; Siphon reads the outbox columns as text"),
    ("hstore.handling.mode", "changes how Debezium encodes hstore columns; not used by the outbox router's columns"),
    ("interval.handling.mode", "changes how Debezium encodes interval columns; not used by the outbox router's columns"),
    ("money.fraction.digits", "changes how Debezium encodes money columns; not used by the outbox router's columns"),
    ("include.unknown.datatypes", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("field.name.adjustment.mode", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("sanitize.field.names", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("provide.transaction.metadata", "Siphon writes no transaction metadata records"),
    ("topic.transaction", "Siphon writes no transaction metadata records"),
    ("skipped.operations", "Siphon routes inserts only, as the outbox router does; updates follow table.op.invalid.behavior and deletes are skipped"),
    ("max.batch.size", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("max.queue.size", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("max.queue.size.in.bytes", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("poll.interval.ms", "Siphon sends records as they arrive (batching is librdkafka's linger.ms)"),
    ("flush.lsn.source", "Siphon always confirms the slot position itself, after Kafka acknowledged every earlier record"),
    ("lsn.flush.", "Siphon always confirms the slot position itself, after Kafka acknowledged every earlier record"),
    ("xmin.fetch.interval.ms", "Siphon does not track xmin"),
    ("errors.", "Kafka Connect's error handling (tolerance, dead-letter queue, error logging) does not carry over"),
    ("event.processing.failure.handling.mode", "Debezium's handling of events it cannot process does not carry over"),
    ("exactly.once.support", "Siphon does not use Kafka transactions: records acknowledged but not yet confirmed to PostgreSQL are sent again after a restart, with the same id header"),
    ("transaction.boundary", "Siphon does not use Kafka transactions"),
    ("offsets.storage.topic", "Siphon keeps its position in the replication slot, not in a Kafka topic"),
    ("offset.", "Siphon keeps its position in the replication slot, not in Kafka Connect offsets"),
    ("consumer.override.", "Siphon has no Kafka consumer"),
    ("admin.override.", "Siphon's admin client (topic creation) uses [kafka.properties] too"),
    ("converters", "custom Debezium column converters are not supported"),
    ("config.action.reload", "Siphon reads its configuration at start"),
    ("custom.metric.tags", "Siphon has no JMX metrics"),
    ("retriable.restart.connector.wait.ms", "Siphon reconnects with capped exponential backoff (pipeline.max_backoff_secs)"),
    ("replica.identity.autoset.values", "Siphon never changes a table's replica identity (an outbox needs only inserts)"),
    ("unavailable.value.placeholder", "Siphon stops with an error on an unchanged TOASTed outbox column rather than writing a placeholder"),
];

fn leftovers(props: &Props, notes: &mut Vec<String>) {
    for (key, value) in &props.values {
        if props.used.contains(key) {
            continue;
        }
        if key == "slot.drop.on.stop" && value.trim().eq_ignore_ascii_case("true") {
            notes.push(format!(
                "WARNING: `slot.drop.on.stop` is true, so Debezium drops slot `{}` when it stops and Siphon cannot continue from it: \
                 set it to false and restart Debezium before switching, or events committed between Debezium's stop and Siphon's start are lost",
                props.peek("slot.name").unwrap_or("debezium")
            ));
            continue;
        }
        if key == "slot.drop.on.stop" || (key == "tasks.max" && value.trim() == "1") {
            continue;
        }
        let reason = REASONS
            .iter()
            .find(|(k, _)| {
                if k.ends_with('.') {
                    key.starts_with(k)
                } else {
                    key == k
                }
            })
            .map(|(_, r)| *r)
            .unwrap_or("not a Debezium PostgreSQL option Siphon knows; not carried over");
        notes.push(keyed(key, value, reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, EncodingName};

    const FIXTURE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/debezium/outbox-connector.json"
    ));

    /// Parses the imported TOML as Siphon does.
    fn parse(import: &Import) -> Config {
        let doc: toml::Table = import
            .toml
            .parse()
            .unwrap_or_else(|e| panic!("not TOML: {e}\n{}", import.toml));
        Config::from_table(doc)
            .unwrap_or_else(|e| panic!("not a Siphon configuration: {e:#}\n{}", import.toml))
    }

    fn router(config: &Config) -> BTreeMap<String, String> {
        crate::config::option_strings(&config.router, "router").unwrap()
    }

    fn note_with<'a>(import: &'a Import, needles: &[&str]) -> &'a str {
        import
            .notes
            .iter()
            .find(|n| needles.iter().all(|needle| n.contains(needle)))
            .unwrap_or_else(|| panic!("no note with {needles:?} in {:#?}", import.notes))
    }

    /// A minimal connector with an outbox router, plus `extra` entries.
    fn minimal(extra: &str) -> String {
        format!(
            r#"{{
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "database.hostname": "db", "database.user": "app", "database.dbname": "shop",
                "plugin.name": "pgoutput", "table.include.list": "public.outbox",
                "transforms": "outbox",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter"
                {extra}
            }}"#
        )
    }

    #[test]
    fn the_fixture_converts_into_a_valid_configuration() {
        let import = import_debezium(FIXTURE).unwrap();
        let c = parse(&import);
        assert_eq!(
            c.source.url,
            "postgres://orders_cdc@orders-db.internal:5432/orders"
        );
        assert_eq!(c.source.slot, "orders_outbox");
        assert_eq!(c.source.publication, "orders_outbox_pub");
        assert_eq!(c.source.tables, vec!["public.outbox".to_owned()]);
        assert_eq!(c.kafka.bootstrap_servers, BOOTSTRAP_PLACEHOLDER);
        let props = crate::config::option_strings(&c.kafka.properties, "p").unwrap();
        assert_eq!(props["compression.type"], "zstd");
        assert_eq!(props["linger.ms"], "20");
        assert_eq!(props["message.max.bytes"], "2097152");
        assert!(c.kafka.topic_creation.enabled);
        assert_eq!(c.kafka.topic_creation.partitions, 6);
        assert_eq!(c.kafka.topic_creation.replication_factor, 3);
        let r = router(&c);
        assert_eq!(r["route.by.field"], "aggregate_type");
        assert_eq!(r["table.field.event.key"], "aggregate_id");
        assert_eq!(r["route.topic.replacement"], "${routedByValue}.events");
        assert_eq!(
            r["table.fields.additional.placement"],
            "type:header:eventType"
        );
        assert_eq!(r["table.expand.json.payload"], "true");
        assert!(!r.contains_key("type") && !r.contains_key("predicate"));
        assert_eq!(r["topic.prefix"], "orders");
        assert_eq!(c.format.key, EncodingName::String);
        assert_eq!(c.format.value, EncodingName::Json);
        crate::settings::build(&c).unwrap_or_else(|e| panic!("{e:#}\n{}", import.toml));
        assert!(import.toml.starts_with(
            "# Siphon configuration imported from the Debezium connector \"orders-outbox\""
        ));
    }

    #[test]
    fn the_fixture_notes_explain_what_does_not_carry_over() {
        let import = import_debezium(FIXTURE).unwrap();
        let password = note_with(&import, &["password", "SIPHON_SOURCE_URL"]);
        assert!(password.contains("file config provider"), "{password}");
        assert!(password.contains("/secrets.properties"), "{password}");
        note_with(&import, &["bootstrap", BOOTSTRAP_PLACEHOLDER]);
        let predicate = note_with(&import, &["predicate `isOutbox`"]);
        assert!(predicate.contains("orders.public.outbox"), "{predicate}");
        assert!(
            predicate.contains("the same records are routed"),
            "{predicate}"
        );
        note_with(&import, &["snapshot.mode", "no snapshot"]);
        note_with(&import, &["heartbeat.interval.ms"]);
        note_with(&import, &["tombstones.on.delete", "ignores deletes"]);
        note_with(&import, &["database.sslmode", "TLS"]);
        note_with(&import, &["topic.prefix", "extended.headers.enabled"]);
        note_with(
            &import,
            &["producer.override.buffer.memory", "max_in_flight_bytes"],
        );
        note_with(
            &import,
            &["topic.creation.default.cleanup.policy", "create the topics"],
        );
    }

    #[test]
    fn the_bare_config_map_is_accepted_and_named_defaults_apply() {
        let import = import_debezium(&minimal("")).unwrap();
        let c = parse(&import);
        assert_eq!(c.source.url, "postgres://app@db:5432/shop");
        assert_eq!(c.source.slot, "debezium");
        assert_eq!(c.source.publication, "dbz_publication");
        assert!(c.router.is_empty());
        assert!(import.toml.contains("a Debezium connector configuration"));
        note_with(&import, &["all_tables", "Debezium's default"]);
        note_with(&import, &["value.converter", "not set"]);
    }

    #[test]
    fn numbers_and_booleans_are_taken_as_kafka_connect_takes_them() {
        let import = import_debezium(&minimal(
            r#", "database.port": 6543, "slot.drop.on.stop": false,
               "topic.creation.default.partitions": 12,
               "topic.creation.default.replication.factor": -1,
               "status.update.interval.ms": 500,
               "transforms.outbox.table.expand.json.payload": true,
               "producer.override.linger.ms": 10,
               "key.converter": "org.apache.kafka.connect.json.JsonConverter",
               "key.converter.schemas.enable": false"#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.source.url, "postgres://app@db:6543/shop");
        assert_eq!(c.source.status_interval_ms, 500);
        assert_eq!(c.kafka.topic_creation.partitions, 12);
        assert_eq!(c.kafka.topic_creation.replication_factor, -1);
        assert_eq!(router(&c)["table.expand.json.payload"], "true");
        assert_eq!(
            crate::config::option_strings(&c.kafka.properties, "p").unwrap()["linger.ms"],
            "10"
        );
        assert_eq!(c.format.key, EncodingName::Json);
        assert!(
            !import.notes.iter().any(|n| n.contains("slot.drop.on.stop")),
            "{:#?}",
            import.notes
        );
    }

    #[test]
    fn other_connectors_and_configurations_without_an_event_router_are_errors() {
        let mysql = r#"{"name": "m", "config": {"connector.class": "io.debezium.connector.mysql.MySqlConnector"}}"#;
        let err = import_debezium(mysql).unwrap_err();
        assert!(
            matches!(&err, ImportError::NotPostgres { found } if found.ends_with("MySqlConnector"))
        );
        assert!(err.to_string().contains(POSTGRES_CONNECTOR), "{err}");

        let err = import_debezium(r#"{"name": "x", "config": {"topic.prefix": "a"}}"#).unwrap_err();
        assert!(matches!(err, ImportError::MissingConnectorClass), "{err}");

        let unwrap_only = minimal("").replace(
            "io.debezium.transforms.outbox.EventRouter",
            "io.debezium.transforms.ExtractNewRecordState",
        );
        let err = import_debezium(&unwrap_only).unwrap_err();
        assert!(matches!(err, ImportError::NoEventRouter { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("outbox (io.debezium.transforms.ExtractNewRecordState)"),
            "{err}"
        );

        let no_transforms =
            r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector"}"#;
        let err = import_debezium(no_transforms).unwrap_err();
        assert!(err.to_string().contains("no transforms"), "{err}");

        assert!(matches!(
            import_debezium("{"),
            Err(ImportError::InvalidJson(_))
        ));
        assert!(matches!(
            import_debezium("[1]"),
            Err(ImportError::NotAnObject)
        ));
    }

    #[test]
    fn converters_map_to_encodings() {
        let import = import_debezium(&minimal(
            r#", "key.converter": "org.apache.kafka.connect.json.JsonConverter",
               "value.converter": "io.debezium.converters.BinaryDataConverter""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.key, EncodingName::JsonSchemas);
        assert_eq!(c.format.value, EncodingName::Binary);
        note_with(&import, &["key.converter.schemas.enable", "assumed"]);

        let import = import_debezium(&minimal(
            r#", "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
               "value.converter": "org.apache.kafka.connect.json.JsonConverter",
               "value.converter.schemas.enable": "true""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.key, EncodingName::Binary);
        assert_eq!(c.format.value, EncodingName::JsonSchemas);
        assert!(
            !import.notes.iter().any(|n| n.contains("converter")),
            "{:#?}",
            import.notes
        );
    }

    #[test]
    fn the_logical_name_carries_over_for_the_context_headers() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop", "extended.headers.enabled": false"#,
        ))
        .unwrap();
        let r = router(&parse(&import));
        assert_eq!(r["topic.prefix"], "shop");
        assert_eq!(r["extended.headers.enabled"], "false");

        let import = import_debezium(&minimal(r#", "database.server.name": "legacy""#)).unwrap();
        let c = parse(&import);
        let r = router(&c);
        assert_eq!(r["topic.prefix"], "legacy");
        assert_eq!(r["extended.headers.enabled"], "false");
        note_with(&import, &["database.server.name", "1.x"]);
        crate::settings::build(&c).unwrap_or_else(|e| panic!("{e:#}\n{}", import.toml));
    }

    #[test]
    fn decoderbufs_moves_to_a_new_pgoutput_slot() {
        let import =
            import_debezium(&minimal("").replace("\"plugin.name\": \"pgoutput\",", "")).unwrap();
        let c = parse(&import);
        assert_eq!(c.source.slot, "siphon");
        note_with(
            &import,
            &[
                "decoderbufs",
                "pg_create_logical_replication_slot",
                "debezium",
            ],
        );
    }

    #[test]
    fn a_slot_debezium_drops_on_stop_is_a_warning() {
        let import = import_debezium(&minimal(
            r#", "slot.name": "outbox_slot", "slot.drop.on.stop": "true""#,
        ))
        .unwrap();
        note_with(&import, &["WARNING", "outbox_slot", "lost"]);
    }

    #[test]
    fn table_regexes_and_unsupported_transforms_and_converters_are_noted() {
        let import = import_debezium(&minimal(
            r#", "table.include.list": "app\\.outbox, public.outbox_.*",
               "transforms": "unwrap,outbox,route",
               "transforms.route.type": "io.debezium.transforms.ByLogicalTableRouter",
               "transforms.route.topic.regex": "(.*)",
               "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
               "transforms.unwrap.predicate": "isOutbox",
               "transforms.unwrap.negate": "true",
               "topic.prefix": "shop",
               "predicates": "isOutbox",
               "predicates.isOutbox.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.isOutbox.pattern": "shop\\.app\\.outbox",
               "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "http://registry:8081",
               "database.password": "${env:PGPASSWORD}",
               "snapshot.mode": "never",
               "some.future.option": "x""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.source.tables, vec!["app.outbox".to_owned()]);
        assert_eq!(c.format.value, EncodingName::Json);
        note_with(&import, &["public.outbox_.*", "regular expression"]);
        note_with(&import, &["`route`", "ByLogicalTableRouter", "after"]);
        note_with(&import, &["`unwrap`", "never touched the outbox events"]);
        note_with(&import, &["AvroConverter", "Avro", "not support"]);
        note_with(&import, &["value.converter.schema.registry.url"]);
        note_with(&import, &["env config provider", "PGPASSWORD"]);
        note_with(&import, &["some.future.option", "not carried over"]);
        assert!(
            !import
                .notes
                .iter()
                .any(|n| n.contains("predicate not used")),
            "{:#?}",
            import.notes
        );
    }

    #[test]
    fn a_predicate_that_misses_the_outbox_tables_is_a_warning() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms.outbox.predicate": "p",
               "predicates": "p",
               "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.p.pattern": "other\\..*""#,
        ))
        .unwrap();
        note_with(&import, &["WARNING", "shop.public.outbox", "not selected"]);

        // After a transform that renames topics, the predicate cannot be checked here.
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms": "route,outbox",
               "transforms.route.type": "io.debezium.transforms.ByLogicalTableRouter",
               "transforms.outbox.predicate": "p",
               "predicates": "p",
               "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.p.pattern": "other\\..*""#,
        ))
        .unwrap();
        note_with(
            &import,
            &["predicate `p`", "Check that the predicate selects"],
        );
    }

    #[test]
    fn producer_overrides_map_to_librdkafka_names() {
        let import = import_debezium(&minimal(
            r#", "producer.override.bootstrap.servers": "k1:9092,k2:9092",
               "producer.override.max.request.size": "5000000",
               "producer.override.delivery.timeout.ms": "600000",
               "producer.override.acks": "all",
               "producer.override.enable.idempotence": "false",
               "producer.override.sasl.jaas.config": "PlainLoginModule required password=\"s3cr3t\";""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.kafka.bootstrap_servers, "k1:9092,k2:9092");
        let props = crate::config::option_strings(&c.kafka.properties, "p").unwrap();
        assert_eq!(props["message.max.bytes"], "5000000");
        assert_eq!(props["message.timeout.ms"], "600000");
        assert!(!props.contains_key("acks") && !props.contains_key("enable.idempotence"));
        note_with(&import, &["enable.idempotence", "always"]);
        note_with(
            &import,
            &["sasl.jaas.config", "value not shown", "sasl.username"],
        );
        assert!(!import
            .notes
            .iter()
            .any(|n| n.contains("`producer.override.acks`")));
        assert!(!import.notes.iter().any(|n| n.contains("s3cr3t")));
    }

    #[test]
    fn awkward_names_are_encoded_into_the_url() {
        let import = import_debezium(&minimal(r#", "database.hostname": "::1", "database.user": "svc@corp", "database.dbname": "my db""#))
            .unwrap();
        let c = parse(&import);
        assert_eq!(c.source.url, "postgres://svc%40corp@[::1]:5432/my%20db");
        let params = siphon_source::ConnectionParams::from_url(&c.source.url).unwrap();
        assert_eq!(params.user, "svc@corp");
        assert_eq!(params.database, "my db");
    }

    #[test]
    fn a_connector_with_supported_router_options_passes_check_config() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms.outbox.route.by.field": "kind",
               "transforms.outbox.table.op.invalid.behavior": "fatal",
               "key.converter": "org.apache.kafka.connect.storage.StringConverter",
               "value.converter": "org.apache.kafka.connect.storage.StringConverter""#,
        ))
        .unwrap();
        let c = parse(&import);
        crate::settings::build(&c).unwrap_or_else(|e| panic!("{e:#}\n{}", import.toml));
    }

    #[test]
    fn topic_patterns_match_as_java_matches_them() {
        assert_eq!(
            java_full_match("shop\\.public\\.outbox", "shop.public.outbox"),
            Some(true)
        );
        assert_eq!(
            java_full_match("shop\\.public\\.outbox", "shop.public.outbox2"),
            Some(false)
        );
        assert_eq!(
            java_full_match(".*\\.outbox", "shop.public.outbox"),
            Some(true)
        );
        assert_eq!(java_full_match("^shop\\..+$", "shop.x"), Some(true));
        assert_eq!(java_full_match("a|shop.*", "shop"), Some(true));
        assert_eq!(java_full_match("x.?y", "xy"), Some(true));
        assert_eq!(java_full_match(".*?outbox", "a.outbox"), Some(true));
        assert_eq!(java_full_match("(shop)\\..*", "shop.x"), None);
        assert_eq!(java_full_match("[a-z]+", "shop"), None);
        assert_eq!(java_full_match("\\w+", "shop"), None);
    }
}
