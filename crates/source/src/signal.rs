//! The signal table (`source.signal_table`): rows that ask the running Siphon for a re-send, in
//! the shape of Debezium's signalling table (`id`, `type`, `data`).
//!
//! # Invariants
//! - Only rows of type `execute-snapshot` are read; a row is removed once its request was
//!   carried out (or refused for good), so a request interrupted by a crash is found again.
//! - Errors are classified by SQLSTATE, as every query's.
//! - A request is carried out only once [`check_privileges`] found that its row can be removed
//!   afterwards: a row Siphon may read but not delete would be carried out again and again.

use crate::error::{Query, SetupProblem};
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

/// Checks that Siphon's role may read and delete the rows of `table`.
///
/// # Errors
/// [`SetupProblem::SignalTablePrivileges`] naming the privileges missing and the `GRANT`.
pub async fn check_privileges(client: &Client, table: &TableName) -> Result<(), SourceError> {
    let row = client
        .query_one(
            "SELECT current_user::text, has_table_privilege($1::text, 'SELECT'), \
                    has_table_privilege($1::text, 'DELETE')",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| SourceError::from_sql(Query::Signals, e))?;
    let (user, select, delete): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    let missing: Vec<&'static str> = [(select, "SELECT"), (delete, "DELETE")]
        .into_iter()
        .filter(|(granted, _)| !granted)
        .map(|(_, name)| name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SetupProblem::SignalTablePrivileges {
        table: table.clone(),
        user,
        missing,
    }
    .into())
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
