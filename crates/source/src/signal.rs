//! The signal table (`source.signal_table`): rows that ask the running Siphon for a re-send, in
//! the shape of Debezium's signalling table (`id`, `type`, `data`).
//!
//! # Invariants
//! - Only rows of type `execute-snapshot` are read; a row is removed once its request was
//!   carried out (or refused for good), so a request interrupted by a crash is found again.
//! - Errors are classified by SQLSTATE, as every query's.

use crate::error::Query;
use crate::{SourceError, TableName};
use tokio_postgres::Client;

/// The type of the rows read.
pub const EXECUTE_SNAPSHOT: &str = "execute-snapshot";

/// One signal row: its id and its `data` (JSON text, as Debezium's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalRow {
    pub id: String,
    pub data: Option<String>,
}

/// The first `execute-snapshot` row of `table` (by id), if any.
pub async fn next(client: &Client, table: &TableName) -> Result<Option<SignalRow>, SourceError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT id::text, data::text FROM {} WHERE type = $1 ORDER BY id LIMIT 1",
                table.quoted()
            ),
            &[&EXECUTE_SNAPSHOT],
        )
        .await
        .map_err(|e| SourceError::from_sql(Query::Signals, e))?;
    Ok(row.map(|r| SignalRow {
        id: r.get(0),
        data: r.get(1),
    }))
}

/// Removes the signal row `id` of `table` (its request was carried out).
pub async fn remove(client: &Client, table: &TableName, id: &str) -> Result<(), SourceError> {
    client
        .execute(
            &format!("DELETE FROM {} WHERE id::text = $1", table.quoted()),
            &[&id],
        )
        .await
        .map_err(|e| SourceError::from_sql(Query::Signals, e))?;
    Ok(())
}
