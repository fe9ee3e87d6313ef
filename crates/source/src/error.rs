//! Source errors, sorted by consequence.
//!
//! Errors PostgreSQL reports are kept as their SQLSTATE and the command that failed
//! ([`ServerFailure`]) and sorted by [`server::consequence_of`], never by their text, which is
//! in the server's `lc_messages` language; messages are rendered from typed data in `Display`.
//! Siphon's own findings are typed too: [`SourceConfigError`] (the configuration), [`SetupProblem`]
//! (the server, slot, publication and tables), [`LoginProblem`] (login and TLS refusals),
//! [`UnusableMessage`] (pgoutput messages Siphon cannot use) and [`ProtocolFault`].
//!
//! # Invariants
//! - [`SourceError::consequence`] is [`Consequence::Retry`] only for errors that reconnecting
//!   from the confirmed position can cure; every other error names what the operator must fix.
//! - No server error is classified by its message text.
//! - No variant holds a rendered message: only names, values and the text servers and
//!   libraries reported (`server_message`, `detail`).

mod config;
pub(crate) mod fixes;
mod interruption;
mod login;
mod operation;
mod protocol;
pub mod server;
mod setup;
mod unusable;

pub use crate::sqlstate::SqlState;
pub use config::{SourceConfigError, UrlSyntax};
pub use interruption::Interruption;
pub use login::LoginProblem;
pub use operation::{Query, SourceOperation};
pub use protocol::ProtocolFault;
pub use server::{Diagnosis, LoginTls, ServerFailure};
pub use setup::{PublicationProblem, SetupProblem};
use siphon_core::Consequence;
pub use unusable::UnusableMessage;

/// What went wrong between Siphon and PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The configuration cannot work; the message names the key to change.
    #[error(transparent)]
    Config(Box<SourceConfigError>),
    /// PostgreSQL or the TLS library refused the login for good; the message names what to
    /// change.
    #[error(transparent)]
    Login(Box<LoginProblem>),
    /// The server, slot, publication or tables are not what Siphon needs; the message names
    /// the fix.
    #[error(transparent)]
    Setup(Box<SetupProblem>),
    /// The server sent a pgoutput message Siphon cannot use; it comes again after every
    /// reconnect, so the message names what to change.
    #[error(transparent)]
    Unusable(Box<UnusableMessage>),
    /// Something changed under Siphon; reconnecting from the confirmed position is safe.
    #[error("connection to PostgreSQL lost: {0}")]
    Interrupted(Box<Interruption>),
    /// No host of `source.url` could be used; each host's error says why.
    #[error("no host of source.url is usable (target_session_attrs={target}): {}", refusal_list(.refusals))]
    NoUsableHost {
        target: crate::names::TargetSession,
        refusals: Vec<(crate::names::Endpoint, SourceError)>,
    },
    /// The stream broke the protocol (a bug on one side); reconnecting replays from the confirmed
    /// position.
    #[error("replication protocol error: {0}")]
    Protocol(Box<ProtocolFault>),
    /// PostgreSQL answered a command with an error: its SQLSTATE says what it means.
    #[error("{0}")]
    Server(Box<ServerFailure>),
    /// The SQL connection failed without a server error (cut, closed, timed out).
    #[error(transparent)]
    SqlConnection(Box<SqlConnectionLost>),
    /// The replication connection failed without a server error (cut, closed, timed out).
    #[error(transparent)]
    ReplicationConnection(Box<ReplicationConnectionLost>),
}

/// The SQL connection failed during `operation` without a server error.
#[derive(Debug, thiserror::Error)]
#[error("connection to PostgreSQL lost: {operation}: {}", error_chain(.source))]
pub struct SqlConnectionLost {
    pub operation: SourceOperation,
    #[source]
    pub source: tokio_postgres::Error,
}

/// The replication connection failed during `operation` without a server error.
#[derive(Debug, thiserror::Error)]
#[error("connection to PostgreSQL lost: {}", error_chain(.source))]
pub struct ReplicationConnectionLost {
    pub operation: SourceOperation,
    #[source]
    pub source: crate::wire::WireError,
}

/// The names a server error's fix needs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Subject<'a> {
    pub slot: Option<&'a str>,
    pub user: Option<&'a str>,
    pub login: Option<LoginTls>,
}

impl SourceError {
    /// What the error means for the process.
    pub fn consequence(&self) -> Consequence {
        match self {
            SourceError::Server(failure) => failure.consequence(),
            SourceError::Interrupted(_)
            | SourceError::Protocol(_)
            | SourceError::SqlConnection(_)
            | SourceError::ReplicationConnection(_) => Consequence::Retry,
            SourceError::Config(_)
            | SourceError::Login(_)
            | SourceError::Setup(_)
            | SourceError::Unusable(_) => Consequence::Fix,
            // Retried while one host's error may pass.
            SourceError::NoUsableHost { refusals, .. } => {
                if refusals.iter().any(|(_, e)| e.is_transient()) {
                    Consequence::Retry
                } else {
                    Consequence::Fix
                }
            }
        }
    }

    /// Whether reconnecting from the confirmed position can cure the error.
    pub fn is_transient(&self) -> bool {
        self.consequence().is_retry()
    }

    /// The server error, if PostgreSQL reported one.
    pub fn server_failure(&self) -> Option<&ServerFailure> {
        match self {
            SourceError::Server(failure) => Some(failure),
            _ => None,
        }
    }

    /// Classifies an error from an ordinary SQL connection by its SQLSTATE.
    pub(crate) fn from_sql(
        operation: impl Into<SourceOperation>,
        err: tokio_postgres::Error,
    ) -> Self {
        Self::from_sql_about(operation, Subject::default(), err)
    }

    /// [`SourceError::from_sql`], with the names the fix needs.
    pub(crate) fn from_sql_about(
        operation: impl Into<SourceOperation>,
        subject: Subject<'_>,
        err: tokio_postgres::Error,
    ) -> Self {
        let operation = operation.into();
        match err.as_db_error() {
            Some(db) => {
                let mut server_message = db.message().to_owned();
                if let Some(detail) = db.detail() {
                    server_message.push_str(&format!(" ({detail})"));
                }
                if let Some(hint) = db.hint() {
                    server_message.push_str(&format!(" hint: {hint}"));
                }
                Self::server(
                    operation,
                    SqlState::from(db.code()),
                    server_message,
                    subject,
                )
            }
            None => SourceError::SqlConnection(Box::new(SqlConnectionLost {
                operation,
                source: err,
            })),
        }
    }

    fn server(
        operation: SourceOperation,
        code: SqlState,
        server_message: String,
        subject: Subject<'_>,
    ) -> Self {
        SourceError::Server(Box::new(ServerFailure {
            operation,
            code,
            server_message,
            slot: subject.slot.map(str::to_owned),
            user: subject.user.map(str::to_owned),
            login: subject.login,
        }))
    }

    /// Classifies a failure to open the SQL connection: certificate problems and a `pg_hba.conf`
    /// that wants TLS are definite and say what to change (a server without TLS is told by
    /// asking it, see [`crate::wire::refuses_tls`]).
    pub(crate) fn from_connect(tls: LoginTls, err: tokio_postgres::Error) -> Self {
        if let Some(problem) = login::rustls_error(&err) {
            if login::is_certificate_problem(problem) {
                return LoginProblem::SqlCertificate {
                    mode: tls.mode,
                    problem: problem.clone(),
                }
                .into();
            }
        }
        let subject = Subject {
            login: Some(tls),
            ..Subject::default()
        };
        SourceError::from_sql_about(SourceOperation::Connect, subject, err)
    }

    /// Classifies an error of `operation` on the replication connection of `slot`.
    pub(crate) fn from_replication(
        slot: &str,
        operation: SourceOperation,
        err: crate::wire::WireError,
    ) -> Self {
        let subject = Subject {
            slot: Some(slot),
            ..Subject::default()
        };
        Self::from_replication_about(operation, subject, err)
    }

    /// [`SourceError::from_replication`], with the names the fix needs (the user, named when the
    /// login lacks `REPLICATION`; the TLS of the login).
    pub(crate) fn from_replication_about(
        operation: SourceOperation,
        subject: Subject<'_>,
        err: crate::wire::WireError,
    ) -> Self {
        use crate::wire::{ProtocolViolation, WireError as E};
        let slot = subject.slot.unwrap_or("<source.slot>");
        match err {
            E::Server(server) => {
                let code = server.code;
                Self::server(operation, code, server_text(&server), subject)
            }
            E::UnsupportedAuthentication(_) | E::Scram(_) => {
                LoginProblem::ReplicationLogin(err).into()
            }
            E::TlsUnsupported => LoginProblem::ReplicationTlsUnsupported.into(),
            E::Tls(io) => match login::rustls_error(&io) {
                Some(problem) if login::is_certificate_problem(problem) => {
                    LoginProblem::ReplicationCertificate {
                        problem: problem.clone(),
                    }
                    .into()
                }
                _ => LoginProblem::ReplicationTls(io).into(),
            },
            E::Protocol(ProtocolViolation::TooLarge { .. }) => {
                UnusableMessage::TooLarge(err).into()
            }
            E::PublicationSkipped(notice) => SetupProblem::PublicationSkipped {
                slot: slot.to_owned(),
                notice,
            }
            .into(),
            source => SourceError::ReplicationConnection(Box::new(ReplicationConnectionLost {
                operation,
                source,
            })),
        }
    }
}

/// What the server said, for display: severity, message, detail and hint (the SQLSTATE is
/// shown by [`ServerFailure`]).
fn server_text(server: &crate::wire::ServerError) -> String {
    let mut text = format!("{}: {}", server.severity, server.message);
    if let Some(detail) = &server.detail {
        text.push_str(&format!(" ({detail})"));
    }
    if let Some(hint) = &server.hint {
        text.push_str(&format!(" hint: {hint}"));
    }
    text
}

impl From<ProtocolFault> for SourceError {
    fn from(fault: ProtocolFault) -> Self {
        SourceError::Protocol(Box::new(fault))
    }
}

impl From<LoginProblem> for SourceError {
    fn from(problem: LoginProblem) -> Self {
        SourceError::Login(Box::new(problem))
    }
}

impl From<UnusableMessage> for SourceError {
    fn from(message: UnusableMessage) -> Self {
        SourceError::Unusable(Box::new(message))
    }
}

impl From<SetupProblem> for SourceError {
    fn from(problem: SetupProblem) -> Self {
        SourceError::Setup(Box::new(problem))
    }
}

impl From<siphon_core::engine::table::InvalidTableName> for SourceError {
    fn from(invalid: siphon_core::engine::table::InvalidTableName) -> Self {
        SourceConfigError::InvalidTableName { text: invalid.text }.into()
    }
}

impl From<SourceConfigError> for SourceError {
    fn from(problem: SourceConfigError) -> Self {
        SourceError::Config(Box::new(problem))
    }
}

impl From<Interruption> for SourceError {
    fn from(interruption: Interruption) -> Self {
        SourceError::Interrupted(Box::new(interruption))
    }
}

/// `host: error; host: error`.
fn refusal_list(refusals: &[(crate::names::Endpoint, SourceError)]) -> String {
    let listed: Vec<String> = refusals
        .iter()
        .map(|(endpoint, error)| format!("{endpoint}: {error}"))
        .collect();
    listed.join("; ")
}

impl From<Query> for SourceOperation {
    fn from(query: Query) -> Self {
        SourceOperation::Query(query)
    }
}

/// An error and its sources, `outer: inner: ...` (tokio-postgres shows only the outermost).
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_usable_host_is_retried_while_one_host_may_come_back() {
        let host = |name: &str| crate::names::Endpoint {
            host: name.into(),
            hostaddr: None,
            port: 5432,
        };
        let refused = |code: &str| {
            SourceError::server(
                SourceOperation::Connect,
                SqlState::parse(code),
                "FATAL: ...".into(),
                Subject::default(),
            )
        };
        let all_refused = SourceError::NoUsableHost {
            target: crate::names::TargetSession::ReadWrite,
            refusals: vec![(host("a"), refused("28P01")), (host("b"), refused("3D000"))],
        };
        assert_eq!(all_refused.consequence(), Consequence::Fix);
        let one_standby = SourceError::NoUsableHost {
            target: crate::names::TargetSession::ReadWrite,
            refusals: vec![
                (host("a"), refused("28P01")),
                (
                    host("b"),
                    Interruption::NotTarget {
                        endpoint: host("b"),
                        target: crate::names::TargetSession::ReadWrite,
                    }
                    .into(),
                ),
            ],
        };
        assert_eq!(one_standby.consequence(), Consequence::Retry);
        assert!(one_standby.to_string().contains("b:5432"), "{one_standby}");
        assert_eq!(refused("57P03").consequence(), Consequence::Retry);
    }
}
