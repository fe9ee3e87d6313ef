//! Names and identities: the value types that the errors and the modules raising them share.
//!
//! The bottom of the crate's module graph: this module imports nothing of the crate, and
//! [`crate::error`] names configuration, servers and tables through it only, so no two modules
//! import each other. Parsing them (which can fail with a [`crate::SourceError`]) stays with the
//! module that reads them ([`crate::config`], [`crate::tls`]); [`TableName`] and [`quote_ident`]
//! are siphon-core's (the session engine keys its routers by table), its parse error converts
//! into a [`crate::SourceError`].
//!
//! # Invariants
//! - A [`TableName`] always has a schema (`public` when the user gave none).
//! - [`quote_ident`] and [`quote_literal`] double the quote they are delimited by, so any text
//!   becomes one identifier or one literal.

use std::fmt;

pub use siphon_core::engine::table::{quote_ident, TableName};

/// Quotes a string literal for SQL, as PostgreSQL's `quote_literal` does: a text with a
/// backslash is written `E'...'` with the backslashes doubled, so it reads the same whatever
/// `standard_conforming_strings` is.
pub fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if quoted.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// One host of `source.url`: tried in the order the URL lists them, as libpq does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The host name: what is connected to, and the name a `verify-full` certificate must carry
    /// (a path for a Unix socket directory).
    pub host: String,
    /// `hostaddr`: when given, the address connected to instead of resolving `host` (which still
    /// names the server for certificate checks), as in libpq.
    pub hostaddr: Option<std::net::IpAddr>,
    pub port: u16,
}

impl Endpoint {
    /// What to open a socket to: `hostaddr` when given, else `host`.
    pub fn address(&self) -> String {
        self.hostaddr
            .map_or_else(|| self.host.clone(), |ip| ip.to_string())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// libpq's `target_session_attrs`: which of the hosts a session may use. Siphon's slot lives on
/// the primary, so only the values that find it are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSession {
    /// The first host that accepts the connection (libpq's default).
    #[default]
    Any,
    /// The first host whose sessions are writable (`transaction_read_only = off`).
    ReadWrite,
    /// The first host not in recovery (`pg_is_in_recovery()` is false).
    Primary,
}

impl fmt::Display for TargetSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetSession::Any => "any",
            TargetSession::ReadWrite => "read-write",
            TargetSession::Primary => "primary",
        })
    }
}

/// libpq's `sslmode`, as Siphon applies it to both connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS if the server offers it, plain otherwise; the server is not authenticated. The default
    /// (as in libpq).
    Prefer,
    /// TLS or no connection. The certificate chain is verified only when `sslrootcert` is given
    /// (as libpq does when a root certificate file is present).
    Require,
    /// TLS; the chain is verified against `sslrootcert`, the host name is not.
    VerifyCa,
    /// TLS; the chain is verified against `sslrootcert` and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    /// The name used in `source.url`.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres should do about the SSLRequest; the verification itself is done by the
    /// connector.
    pub(crate) fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Tp;
        match self {
            SslMode::Disable => Tp::Disable,
            SslMode::Prefer => Tp::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Tp::Require,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which server (cluster and timeline) a session talked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    /// The cluster's system identifier (decimal, as IDENTIFY_SYSTEM prints it).
    pub system_id: String,
    /// The timeline the server writes WAL on; a promoted standby starts a new one.
    pub timeline: u32,
}

impl fmt::Display for ServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "system {} timeline {}", self.system_id, self.timeline)
    }
}

/// A timeline history file that is not one PostgreSQL writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("the history of timeline {timeline} has an unreadable line {line}: {text:?}")]
    Line {
        timeline: u32,
        line: usize,
        text: String,
    },
    #[error("the history of timeline {timeline} lists timeline {listed} out of order (after {previous}, or not before {timeline})")]
    Order {
        timeline: u32,
        listed: u32,
        previous: u32,
    },
}

/// How the outbox's publication membership changed between two looks, in a way that leaves
/// events unpublished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipChange {
    /// The publication is another one with the same name: it was dropped and created again.
    PublicationRecreated,
    /// Every row that published `table` is gone, and other rows publish it now: it was taken
    /// out of the publication and added back.
    TableAddedBack(TableName),
}

/// Why rows of a table cannot be read in a stable order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderProblem {
    /// No primary key, and no `order_by` that could stand for one.
    NoPrimaryKey,
    /// An `order_by` column the table does not have.
    MissingColumn { column: String },
    /// An `order_by` column that may be NULL (keyset reads skip NULLs).
    NullableColumn { column: String },
}

impl fmt::Display for OrderProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderProblem::NoPrimaryKey => f.write_str(
                "has no primary key to read its rows in a stable order: add one, or name unique NOT NULL columns in order_by",
            ),
            OrderProblem::MissingColumn { column } => {
                write!(f, "has no column {column:?} (order_by): fix the name")
            }
            OrderProblem::NullableColumn { column } => write!(
                f,
                "has a column {column:?} in order_by that may be NULL, and rows with NULL there would never be read: make it NOT NULL, or order by other columns"
            ),
        }
    }
}

#[cfg(test)]
mod quoting_tests {
    use super::*;

    #[test]
    fn a_literal_reads_the_same_whatever_standard_conforming_strings_is() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        // Without E'', a server with standard_conforming_strings off would read \' as a quote.
        assert_eq!(quote_literal(r"x\'); DROP"), r"E'x\\''); DROP'");
        assert_eq!(quote_ident(r#"a"b"#), r#""a""b""#);
    }
}
