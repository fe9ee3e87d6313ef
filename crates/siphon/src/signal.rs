//! Re-sends asked for by a row in a signal table (`source.signal_table`), as Debezium's
//! `execute-snapshot` signal asks for an incremental snapshot:
//!
//! ```sql
//! INSERT INTO siphon_signal (id, type, data) VALUES ('replay-1', 'execute-snapshot',
//!   '{"data-collections": ["public.outbox"],
//!     "additional-conditions": [{"data-collection": "public.outbox",
//!                                "filter": "created_at >= ''2026-12-01''"}]}');
//! ```
//!
//! The running Siphon looks at the table every few seconds while it streams, carries out the
//! first request (by id) as `siphon resend` would (see [`crate::resend`]: same records with the
//! `siphon.resend` header, chunked, resumable), beside the stream, and removes the row.
//!
//! # Invariants
//! - Only the process that streams (not a standby) carries out requests: one re-send per
//!   request, whatever the number of instances.
//! - A row is removed only once its request finished (every row acknowledged) or was refused for
//!   good (logged as an error naming the row): a crash in between finds it again, and the re-send
//!   resumes from its last acknowledged chunk; a re-send recorded as done for the row's id is
//!   not run again.
//! - A request is carried out once: before each, Siphon checks that its role may delete the
//!   row afterwards. A privilege missing, or any other error only the operator can cure, stops
//!   Siphon (exit status 2) naming the fix; only transient errors are tried again, at the next
//!   look.
//! - A row's condition is checked as a signal's ([`ConditionSource::Signal`]): one expression
//!   comparing columns with constants, never SQL of the row's writer's choosing.
//! - Streaming does not wait for a re-send: it runs as a task of its own with its own producer,
//!   within the transfers' share of the window ([`crate::pipeline::PipelineSettings::transfer_window`]).

use crate::resend::{self, Request};
use crate::session::PipelineSettings;
use crate::telemetry::Metrics;
use siphon_source::row_condition::{ConditionError, ConditionSource, RowCondition};
use siphon_source::signal::SignalRow;
use siphon_source::TableName;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{error, info, warn};

/// How often the signal table is read while streaming.
pub const POLL: Duration = Duration::from_secs(5);

/// A signal row whose `data` cannot be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    #[error("signal {id}: data is not JSON of Debezium's execute-snapshot shape ({reason}); expected {{\"data-collections\": [\"schema.table\"], \"additional-conditions\": [{{\"data-collection\": \"schema.table\", \"filter\": \"<SQL condition>\"}}]}}")]
    Shape { id: String, reason: String },
    #[error("signal {id}: {name:?} is not a table name")]
    Table { id: String, name: String },
    #[error("signal {id}: {source}")]
    Condition {
        id: String,
        #[source]
        source: ConditionError,
    },
}

/// The re-sends a signal row asks for: each table with its condition.
pub fn requests(row: &SignalRow) -> Result<Vec<(TableName, Option<RowCondition>)>, SignalError> {
    let shape = |reason: &str| SignalError::Shape {
        id: row.id.clone(),
        reason: reason.to_owned(),
    };
    let data: serde_json::Value = serde_json::from_str(row.data.as_deref().unwrap_or(""))
        .map_err(|e| shape(&e.to_string()))?;
    let collections = data
        .get("data-collections")
        .and_then(serde_json::Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| shape("no data-collections"))?;
    let table = |name: &str| {
        TableName::parse(name).map_err(|_| SignalError::Table {
            id: row.id.clone(),
            name: name.to_owned(),
        })
    };
    // Debezium 2.x: additional-conditions, a filter per collection; before: one
    // additional-condition for all of them.
    let mut filters = Vec::new();
    if let Some(conditions) = data
        .get("additional-conditions")
        .and_then(serde_json::Value::as_array)
    {
        for condition in conditions {
            let collection = condition
                .get("data-collection")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| shape("an additional condition without data-collection"))?;
            let filter = condition
                .get("filter")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| shape("an additional condition without filter"))?;
            filters.push((table(collection)?, filter.to_owned()));
        }
    }
    let common = data
        .get("additional-condition")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    collections
        .iter()
        .map(|name| {
            let name = name
                .as_str()
                .ok_or_else(|| shape("a data-collection that is not a string"))?;
            let table = table(name)?;
            let filter = filters
                .iter()
                .find(|(t, _)| *t == table)
                .map(|(_, f)| f.clone())
                .or_else(|| common.clone())
                .filter(|f| !f.trim().is_empty())
                .map(|f| RowCondition::parse(&f, ConditionSource::Signal))
                .transpose()
                .map_err(|source| SignalError::Condition {
                    id: row.id.clone(),
                    source,
                })?;
            Ok((table, filter))
        })
        .collect()
}

/// Carries out the requests of `signals` (see the module's docs) until `shutdown`; returns an
/// error only the operator can cure (Siphon then stops).
pub async fn watch(
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    signals: TableName,
    max_backoff: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), siphon_source::SourceError> {
    let mut interval = tokio::time::interval(POLL);
    // Kept between looks; opened again after an error.
    let mut client = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return Ok(()),
        }
        if !metrics.health().is_streaming() {
            continue;
        }
        let carried_out = tokio::select! {
            result = next(&settings, &metrics, &signals, max_backoff, &mut client) => result,
            // A re-send stopped here resumes from its progress when the row is found again.
            _ = shutdown.changed() => return Ok(()),
        };
        match carried_out {
            Ok(()) => {}
            Err(e) if e.is_transient() => {
                client = None;
                warn!(table = %signals, error = %e, "the signal table could not be read or updated; trying again at the next look");
            }
            Err(e) => return Err(e),
        }
    }
}

/// Carries out the first request of the signal table, if there is one.
async fn next(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    signals: &TableName,
    max_backoff: Duration,
    connection: &mut Option<siphon_source::locate::Located>,
) -> Result<(), siphon_source::SourceError> {
    let client = match connection {
        Some(located) => &located.client,
        None => {
            &connection
                .insert(siphon_source::locate::locate(&settings.source.url).await?)
                .client
        }
    };
    let Some(row) = siphon_source::signal::next(client, signals).await? else {
        return Ok(());
    };
    // A row that could not be removed afterwards would be carried out again at every look.
    siphon_source::signal::check_privileges(client, signals).await?;
    info!(signal = %row.id, table = %signals, "re-send requested by a signal row");
    match requests(&row) {
        Ok(list) => {
            for (table, condition) in list {
                let request = Request {
                    table: table.clone(),
                    condition,
                    signal: Some(row.id.clone()),
                    restart: false,
                    max_rows_per_second: 0,
                };
                match resend::run(settings, metrics, &request, max_backoff).await {
                    Ok(rows) => {
                        info!(signal = %row.id, %table, rows, "re-send of the signal done")
                    }
                    Err(e) => {
                        error!(signal = %row.id, %table, error = %e, "re-send of the signal refused; the signal row is removed")
                    }
                }
            }
        }
        Err(e) => error!(error = %e, "signal row not carried out; it is removed"),
    }
    siphon_source::signal::remove(client, signals, &row.id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(data: &str) -> SignalRow {
        SignalRow {
            id: "s1".into(),
            data: Some(data.into()),
        }
    }

    fn name(text: &str) -> TableName {
        TableName::parse(text).expect("valid name")
    }

    #[test]
    fn debezium_execute_snapshot_data_is_read() {
        let texts = |data: &str| -> Vec<(TableName, Option<String>)> {
            requests(&row(data))
                .expect("valid")
                .into_iter()
                .map(|(table, condition)| (table, condition.map(|c| c.sql().to_owned())))
                .collect()
        };
        let data = r#"{"data-collections": ["public.outbox", "billing.outbox"], "type": "incremental",
            "additional-conditions": [{"data-collection": "public.outbox", "filter": "created_at >= '2026-12-01'"}]}"#;
        assert_eq!(
            texts(data),
            vec![
                (
                    name("public.outbox"),
                    Some("created_at >= '2026-12-01'".into())
                ),
                (name("billing.outbox"), None),
            ]
        );
        // Debezium 1.x's single condition.
        let data = r#"{"data-collections": ["outbox"], "additional-condition": "id > 5"}"#;
        assert_eq!(
            texts(data),
            vec![(name("public.outbox"), Some("id > 5".into()))]
        );
    }

    #[test]
    fn a_signal_s_condition_cannot_carry_sql_of_its_own() {
        let data = r#"{"data-collections": ["public.outbox"], "additional-conditions": [{"data-collection": "public.outbox",
            "filter": "true); CREATE TABLE injected (x int); SELECT (true"}]}"#;
        let error = requests(&row(data)).expect_err("not one expression");
        assert!(error.to_string().contains("signal s1"), "{error}");
        assert!(
            error.to_string().contains("not one SQL expression"),
            "{error}"
        );
        let data = r#"{"data-collections": ["public.outbox"], "additional-condition": "pg_drop_replication_slot('x') IS NULL"}"#;
        let error = requests(&row(data)).expect_err("a function a signal may not call");
        assert!(
            error.to_string().contains("pg_drop_replication_slot"),
            "{error}"
        );
    }

    #[test]
    fn a_malformed_signal_is_named() {
        for data in [
            "",
            "[]",
            r#"{"data-collections": []}"#,
            r#"{"data-collections": [1]}"#,
        ] {
            let error = requests(&row(data)).expect_err("malformed");
            assert!(error.to_string().contains("signal s1"), "{error}");
        }
    }
}
