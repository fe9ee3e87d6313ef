//! Checks the server and creates or validates the slot and the publication.
//!
//! Runs over an ordinary SQL connection before streaming starts.
//!
//! # Invariants
//! - A slot that exists is never dropped or recreated here: its `confirmed_flush_lsn` is the
//!   only record of what has been delivered.
//! - Every failure names what to change (a setting, a grant, a command to run).

use crate::config::{quote_ident, quote_literal};
use crate::{SourceConfig, SourceError, TableName};
use pgoutput::Lsn;
use std::collections::BTreeSet;
use tokio_postgres::Client;
use tracing::info;

/// What the slot looked like when streaming was about to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// Where streaming resumes: everything before it was delivered.
    pub confirmed_flush_lsn: Lsn,
    /// Whether this run created the slot.
    pub created: bool,
}

/// Connects over SQL, checks `wal_level`, the tables, the publication and the slot, creating the
/// last two when they are missing.
pub async fn prepare(config: &SourceConfig) -> Result<SlotState, SourceError> {
    let params = crate::ConnectionParams::from_url(&config.url)?;
    let client = connect(&config.url).await?;
    check_wal_level(&client).await?;
    check_tables(&client, &config.tables).await?;
    ensure_publication(&client, &config.publication, &config.tables).await?;
    ensure_slot(&client, &config.slot, Some(&params.user)).await
}

/// Opens an ordinary SQL connection to `url` with the TLS settings it names (`sslmode`,
/// `sslrootcert`, `sslcert`, `sslkey`); the connection task ends with the client.
pub async fn connect(url: &str) -> Result<Client, SourceError> {
    let (config, tls) = crate::config::parse_url(url)?;
    let connector = tls.sql_connector()?;
    let (client, connection) = config
        .connect(connector)
        .await
        .map_err(|e| SourceError::from_connect(&tls, e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "SQL connection closed");
        }
    });
    Ok(client)
}

async fn check_wal_level(client: &Client) -> Result<(), SourceError> {
    let row = client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .map_err(|e| SourceError::from_sql("reading wal_level", e))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(SourceError::Definite(format!(
            "PostgreSQL has wal_level = {level}; logical replication needs wal_level = logical: set it in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
        )));
    }
    Ok(())
}

async fn check_tables(client: &Client, tables: &[TableName]) -> Result<(), SourceError> {
    for table in tables {
        let row = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()])
            .await
            .map_err(|e| SourceError::from_sql("looking up the outbox tables", e))?;
        let exists: bool = row.get(0);
        if !exists {
            return Err(SourceError::Definite(format!(
                "outbox table {table} does not exist (source.tables): create it, or fix the name in source.tables"
            )));
        }
    }
    Ok(())
}

async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableName],
) -> Result<(), SourceError> {
    let exists = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| SourceError::from_sql("looking up the publication", e))?;
    match exists {
        None => {
            let list: Vec<String> = tables.iter().map(TableName::quoted).collect();
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {}",
                quote_ident(publication),
                list.join(", ")
            );
            client.batch_execute(&sql).await.map_err(|e| {
                SourceError::from_sql(
                    &format!("creating publication \"{publication}\" (run `{sql}` as a user that owns the tables, or grant that)"),
                    e,
                )
            })?;
            info!(publication, tables = %list.join(", "), "created publication");
            Ok(())
        }
        Some(row) => {
            let all_tables: bool = row.get(0);
            if all_tables {
                return Ok(());
            }
            let rows = client
                .query(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1",
                    &[&publication],
                )
                .await
                .map_err(|e| SourceError::from_sql("reading the publication's tables", e))?;
            let published: BTreeSet<TableName> = rows
                .iter()
                .map(|r| TableName {
                    schema: r.get(0),
                    name: r.get(1),
                })
                .collect();
            let missing: Vec<String> = tables
                .iter()
                .filter(|t| !published.contains(t))
                .map(TableName::quoted)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(SourceError::Definite(format!(
                    "publication \"{publication}\" does not include {}: run ALTER PUBLICATION {} ADD TABLE {}",
                    missing.join(", "),
                    quote_ident(publication),
                    missing.join(", ")
                )))
            }
        }
    }
}

async fn ensure_slot(
    client: &Client,
    slot: &str,
    user: Option<&str>,
) -> Result<SlotState, SourceError> {
    let row = client
        .query_opt(
            "SELECT plugin, slot_type, database, confirmed_flush_lsn::text, wal_status \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| SourceError::from_sql("looking up the replication slot", e))?;
    let Some(row) = row else {
        let sql = format!(
            "SELECT lsn::text FROM pg_create_logical_replication_slot({}, 'pgoutput')",
            quote_literal(slot)
        );
        let created = client.query_one(&sql, &[]).await.map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                let server = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned());
                return SourceError::missing_replication(user, &server);
            }
            SourceError::from_sql(
                &format!("creating replication slot \"{slot}\" (the user needs the REPLICATION attribute; max_replication_slots may be exhausted)"),
                e,
            )
        })?;
        let lsn = parse_lsn(created.get(0))?;
        info!(slot, %lsn, "created replication slot");
        return Ok(SlotState {
            confirmed_flush_lsn: lsn,
            created: true,
        });
    };
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let database: Option<String> = row.get(2);
    let confirmed: Option<String> = row.get(3);
    let wal_status: Option<String> = row.get(4);
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::Definite(format!(
            "replication slot \"{slot}\" is a {slot_type} slot with plugin {}; Siphon needs a logical slot using pgoutput: choose another source.slot, or drop it with SELECT pg_drop_replication_slot('{slot}') if nothing else uses it",
            plugin.as_deref().unwrap_or("none")
        )));
    }
    let current_db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .map_err(|e| SourceError::from_sql("reading the current database", e))?
        .get(0);
    if database.as_deref() != Some(current_db.as_str()) {
        return Err(SourceError::Definite(format!(
            "replication slot \"{slot}\" belongs to database {} but source.url connects to {current_db}: point source.url at that database or choose another source.slot",
            database.as_deref().unwrap_or("?")
        )));
    }
    if wal_status.as_deref() == Some("lost") {
        return Err(SourceError::Definite(format!(
            "replication slot \"{slot}\" was invalidated (its WAL was removed, see max_slot_wal_keep_size): drop it with SELECT pg_drop_replication_slot('{slot}') and restart Siphon; events in the lost WAL cannot be recovered"
        )));
    }
    let lsn = parse_lsn(confirmed.as_deref().unwrap_or("0/0"))?;
    Ok(SlotState {
        confirmed_flush_lsn: lsn,
        created: false,
    })
}

fn parse_lsn(text: &str) -> Result<Lsn, SourceError> {
    text.parse()
        .map_err(|e| SourceError::Protocol(format!("{e}")))
}

/// Reads the slot's `confirmed_flush_lsn` (for status reports and tests).
pub async fn confirmed_flush_lsn(client: &Client, slot: &str) -> Result<Option<Lsn>, SourceError> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| SourceError::from_sql("reading the replication slot", e))?;
    match row.and_then(|r| r.get::<_, Option<String>>(0)) {
        Some(text) => Ok(Some(parse_lsn(&text)?)),
        None => Ok(None),
    }
}
