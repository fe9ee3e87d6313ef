//! Catalog and status queries the streaming session asks while it runs, over its own ordinary
//! SQL connection ([`Catalog`]), each returning a typed value.
//!
//! # Invariants
//! - Every error is classified by [`SourceError::from_sql`] (SQLSTATE), so the caller knows
//!   whether reconnecting can cure it.

use crate::SourceError;
use pgoutput::Oid;
use std::collections::HashSet;
use tokio_postgres::Client;

/// The session's SQL connection, for the queries below. Cheap to share (`Arc`): queries run
/// concurrently on one connection.
pub struct Catalog {
    client: Client,
}

impl Catalog {
    /// Opens the connection to `endpoint`, one of the hosts of `url` (TLS as `url` says).
    pub async fn connect(url: &str, endpoint: &crate::Endpoint) -> Result<Self, SourceError> {
        Ok(Catalog {
            client: crate::locate::connect_to(url, endpoint).await?,
        })
    }

    /// What the catalog says about the columns of outbox table `relation` (as the stream
    /// describes it) that the router needs to know: see [`OutboxColumns`].
    pub async fn outbox_columns(
        &self,
        relation: &pgoutput::Relation,
        publication: &str,
    ) -> Result<OutboxColumns, SourceError> {
        Ok(OutboxColumns {
            not_null: not_null_columns(&self.client, relation.id).await?,
            unpublished: crate::generated::unpublished(&self.client, relation, publication).await?,
        })
    }

    /// Runs a stall check of the replication stream (see [`crate::stream::StallCheck`]).
    pub async fn check_stall(
        &self,
        check: crate::stream::StallCheck,
        timeout: std::time::Duration,
    ) -> Result<Option<crate::stall::Seen>, SourceError> {
        check.run(&self.client, timeout).await
    }

    /// See [`crate::catalog::outbox_relation_for`].
    pub async fn outbox_relation_for(
        &self,
        relation: &pgoutput::Relation,
        outbox_tables: &[crate::TableName],
        publication: &str,
    ) -> Result<Option<pgoutput::Relation>, SourceError> {
        crate::catalog::outbox_relation_for(&self.client, relation, outbox_tables, publication)
            .await
    }

    /// See [`crate::setup::verify_publication`].
    pub async fn verify_publication(
        &self,
        publication: &str,
        tables: &[crate::TableName],
        remembered: &crate::Membership,
    ) -> Result<crate::Membership, SourceError> {
        crate::setup::verify_publication(&self.client, publication, tables, remembered).await
    }

    /// WAL the slot retains (see [`crate::status::retained_wal_bytes`]).
    pub async fn retained_wal_bytes(&self, slot: &str) -> Result<Option<u64>, SourceError> {
        crate::status::retained_wal_bytes(&self.client, slot)
            .await
            .map_err(|e| match e {
                crate::status::StatusError::Connect(e) | crate::status::StatusError::Query(e) => e,
            })
    }
}

pub use siphon_core::engine::catalog::OutboxColumns;

/// The columns of table `relation_id` declared NOT NULL.
pub async fn not_null_columns(
    client: &Client,
    relation_id: Oid,
) -> Result<HashSet<String>, SourceError> {
    let rows = client
        .query(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attnotnull",
            &[&relation_id],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::OutboxColumns, e))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
