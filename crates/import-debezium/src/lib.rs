//! A Debezium PostgreSQL connector configuration, as Kafka Connect takes it (JSON), turned into
//! a `siphon.toml`, with a note for everything that does not carry over: the crate's one job.
//!
//! The conversion is a pure function ([`import_debezium`]); the caller (the binary's
//! `siphon import-debezium`) prints [`Import::toml`] and shows [`Import::notes`] to the user.
//!
//! # Invariants
//! - Every key of the connector configuration is either carried into the TOML or named in a
//!   note with the reason; unknown or unsupported keys never fail the import.
//! - Errors are only for input that is not a Debezium PostgreSQL connector configuration with an
//!   outbox `EventRouter` transform, or not JSON.
//! - The database password never reaches the output: it is not written into the TOML and no note
//!   repeats it (nor the value of any other key that looks secret).
//! - The TOML only uses keys and values Siphon's configuration accepts, so it parses as a
//!   [`siphon_config::Config`]. Router options are copied verbatim and not checked here:
//!   `siphon check-config` names any option Siphon's router does not support.
//!
//! # Layout
//! [`import_debezium`] reads the connector configuration once (`props`), finds the outbox
//! router in the transform chain (`chain`), then lets each section of the output take the
//! keys it understands, in this order:
//! - `source`: `[source]`, the connection, slot, publication and outbox tables;
//! - `kafka`: `[kafka]`, producer overrides and topic creation;
//! - `router`: `[router]`, the outbox router's options and the connector's logical name;
//!   the other transforms and the predicates are judged by `chain` and `predicate`;
//! - `format`: `[format]`, the key and value converters;
//! - `leftovers`: a note for every key no section took.
//!
//! `output` keeps the sections and renders them as TOML.

mod chain;
mod format;
mod kafka;
mod leftovers;
mod output;
mod predicate;
mod props;
mod router;
mod source;
#[cfg(test)]
mod tests;

use chain::transform_chain;
use output::Output;
use props::{connector_config, Props};

/// `connector.class` of the Debezium PostgreSQL connector.
pub const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
/// `transforms.<name>.type` of Debezium's outbox Event Router.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

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
    let tables = source::section(&mut props, &mut out, &mut notes);
    kafka::section(&mut props, &mut out, &mut notes);
    router::section(
        &mut props,
        &chain,
        router_index,
        &tables,
        &mut out,
        &mut notes,
    );
    format::section(&mut props, &mut out, &mut notes);
    leftovers::note_unread(&props, &mut notes);

    Ok(Import {
        toml: out.render(name.as_deref(), &notes),
        notes,
    })
}
