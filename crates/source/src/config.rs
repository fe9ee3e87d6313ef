//! Source configuration and connection parameters.
//!
//! # Invariants
//! - A [`TableName`] always has a schema (`public` when the user gave none).

use crate::SourceError;
use std::fmt;
use std::time::Duration;

/// What the source needs to know; the binary builds it from the `[source]` section.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// libpq-style URL, e.g. `postgres://siphon@127.0.0.1:5432/app`.
    pub url: String,
    /// Logical replication slot (created with `pgoutput` if missing).
    pub slot: String,
    /// Publication (created `FOR TABLE <tables>` if missing).
    pub publication: String,
    /// Outbox tables.
    pub tables: Vec<TableName>,
    /// How often the confirmed position is reported to the server at most.
    pub status_interval: Duration,
    /// How long the stream may stay silent before a status update is sent anyway.
    pub idle_wakeup_interval: Duration,
    /// Events buffered between the network reader and the pipeline.
    pub buffer_events: usize,
    /// `application_name` of the replication connection.
    pub application_name: String,
}

/// A schema-qualified table name, as stored in the catalog (not quoted).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    /// Parses `schema.table` or `table` (schema `public`). Double quotes keep dots and case.
    pub fn parse(text: &str) -> Result<Self, SourceError> {
        let parts = split_identifiers(text).ok_or_else(|| {
            SourceError::Config(format!(
                "invalid table name {text:?}: expected schema.table"
            ))
        })?;
        match parts.as_slice() {
            [name] => Ok(TableName {
                schema: "public".into(),
                name: name.clone(),
            }),
            [schema, name] => Ok(TableName {
                schema: schema.clone(),
                name: name.clone(),
            }),
            _ => Err(SourceError::Config(format!(
                "invalid table name {text:?}: expected schema.table"
            ))),
        }
    }

    /// The name quoted for SQL: `"schema"."name"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Splits `a.b` into identifiers; unquoted ones are folded to lower case as PostgreSQL does.
fn split_identifiers(text: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut ident = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        ident.push('"');
                    }
                    '"' => break,
                    c => ident.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                ident.extend(c.to_lowercase());
                chars.next();
            }
        }
        if ident.is_empty() {
            return None;
        }
        parts.push(ident);
        match chars.next() {
            None => return Some(parts),
            Some('.') => continue,
            Some(_) => return None,
        }
    }
}

/// Quotes an identifier for SQL.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Quotes a string literal for SQL.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Host, port, user, password and database taken from the URL, for the replication connection.
#[derive(Clone)]
pub struct ConnectionParams {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
}

impl fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password never reaches logs.
        f.debug_struct("ConnectionParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl ConnectionParams {
    /// Reads the parameters out of a libpq-style URL or key/value string.
    pub fn from_url(url: &str) -> Result<Self, SourceError> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| {
            SourceError::Config(format!("source.url is not a valid PostgreSQL URL: {e}"))
        })?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config
            .get_user()
            .ok_or_else(|| {
                SourceError::Config(
                    "source.url names no user: add one, e.g. postgres://siphon@host/db".into(),
                )
            })?
            .to_owned();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(ConnectionParams {
            host,
            port,
            user,
            password,
            database,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_default_to_public_and_fold_case() {
        assert_eq!(
            TableName::parse("outbox").unwrap().to_string(),
            "public.outbox"
        );
        assert_eq!(
            TableName::parse("App.Outbox").unwrap().to_string(),
            "app.outbox"
        );
        let quoted = TableName::parse("\"My.Schema\".\"Out\"\"box\"").unwrap();
        assert_eq!(quoted.schema, "My.Schema");
        assert_eq!(quoted.name, "Out\"box");
        assert_eq!(quoted.quoted(), "\"My.Schema\".\"Out\"\"box\"");
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse("").is_err());
        assert!(TableName::parse("a.").is_err());
    }

    #[test]
    fn connection_params_come_from_the_url_and_hide_the_password() {
        let p = ConnectionParams::from_url("postgres://alice:s3cret@127.0.0.1:5433/app").unwrap();
        assert_eq!(
            (
                p.host.as_str(),
                p.port,
                p.user.as_str(),
                p.database.as_str()
            ),
            ("127.0.0.1", 5433, "alice", "app")
        );
        assert_eq!(p.password, "s3cret");
        assert!(!format!("{p:?}").contains("s3cret"));
        assert!(ConnectionParams::from_url("postgres://127.0.0.1/app").is_err());
    }
}
