//! Errors of the replication connection, typed so the source can sort them by consequence
//! (see [`crate::SourceError::from_replication`]).

pub use super::frames::{ProtocolViolation, ServerError};
use std::fmt;

/// What went wrong on the replication connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The TCP connection could not be opened.
    #[error("connecting to {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    /// Opening the session took longer than the connect timeout.
    #[error("connecting to {address}: no answer within {seconds} s")]
    ConnectTimeout { address: String, seconds: u64 },
    /// The server did not answer the commands that start replication (`IDENTIFY_SYSTEM`,
    /// `START_REPLICATION`, …) within the connect timeout: the path to it may be a black hole.
    #[error("the server did not answer the start of replication within {seconds} s")]
    StartTimeout { seconds: u64 },
    /// `sslmode` requires TLS and the server answered the SSL request with "no".
    #[error("the server does not support TLS (ssl = off)")]
    TlsUnsupported,
    /// The TLS handshake failed.
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// The server asked for an authentication method Siphon does not speak.
    #[error("the server asks for an authentication method Siphon does not support ({0})")]
    UnsupportedAuthentication(AuthMethod),
    /// The SCRAM exchange failed on Siphon's side (a bad server message or signature).
    #[error("SCRAM-SHA-256 authentication failed: {0}")]
    Scram(#[source] std::io::Error),
    /// The server reported an error.
    #[error("{0}")]
    Server(Box<ServerError>),
    /// A warning on the replication stream that a publication did not exist where the changes
    /// being decoded were written (a `WARNING` with SQLSTATE 55000, PostgreSQL 18+): the server skipped
    /// it, so those changes were not published.
    #[error("{0}")]
    PublicationSkipped(Box<ServerError>),
    /// Reading or writing the socket failed.
    #[error("replication connection: {0}")]
    Io(#[from] std::io::Error),
    /// The server closed the connection.
    #[error("the server closed the replication connection")]
    Closed,
    /// The server sent something the protocol does not allow here.
    #[error("replication protocol: {0}")]
    Protocol(#[from] ProtocolViolation),
}

/// An authentication request Siphon cannot answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    /// `AuthenticationKerberosV5`.
    KerberosV5,
    /// `AuthenticationSCMCredential` (Unix-domain sockets only).
    ScmCredential,
    /// `AuthenticationGSS` or `AuthenticationGSSContinue`.
    Gss,
    /// `AuthenticationSSPI`.
    Sspi,
    /// SASL without a mechanism Siphon speaks (it speaks SCRAM-SHA-256).
    SaslMechanisms(Vec<String>),
}

impl fmt::Display for AuthMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthMethod::KerberosV5 => f.write_str("Kerberos V5"),
            AuthMethod::ScmCredential => f.write_str("SCM credentials"),
            AuthMethod::Gss => f.write_str("GSSAPI"),
            AuthMethod::Sspi => f.write_str("SSPI"),
            AuthMethod::SaslMechanisms(names) => write!(f, "SASL {}", names.join(", ")),
        }
    }
}
