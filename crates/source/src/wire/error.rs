//! Errors of the replication connection, typed so the source can sort them by consequence
//! (see [`crate::SourceError::from_replication`]).

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
    Server(ServerError),
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
    /// An `AuthenticationXXX` code other than cleartext, MD5 and SASL.
    Code(i32),
    /// SASL without a mechanism Siphon speaks (it speaks SCRAM-SHA-256).
    SaslMechanisms(Vec<String>),
}

impl fmt::Display for AuthMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthMethod::Code(2) => f.write_str("Kerberos V5"),
            AuthMethod::Code(7 | 8) => f.write_str("GSSAPI"),
            AuthMethod::Code(9) => f.write_str("SSPI"),
            AuthMethod::Code(code) => write!(f, "authentication request {code}"),
            AuthMethod::SaslMechanisms(names) => write!(f, "SASL {}", names.join(", ")),
        }
    }
}

/// A message that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    /// A message length below the length field's own four bytes.
    #[error("message of type {tag:?} with length {length}")]
    BadLength { tag: char, length: u32 },
    /// A message longer than Siphon accepts.
    #[error("message of type {tag:?} is {length} bytes, more than the {limit} accepted")]
    TooLarge {
        tag: char,
        length: usize,
        limit: usize,
    },
    /// A message too short for its fields.
    #[error("truncated {what}")]
    Truncated { what: &'static str },
    /// A message type that does not belong at this point.
    #[error("unexpected message of type {tag:?} {during}")]
    Unexpected { tag: char, during: &'static str },
}

/// An `ErrorResponse` (or `NoticeResponse`): the fields Siphon reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL`, `PANIC` (not localized), or for a notice `WARNING`, `NOTICE`, ...
    pub severity: String,
    /// The SQLSTATE.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.severity, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " hint: {hint}")?;
        }
        if !self.code.is_empty() {
            write!(f, " (SQLSTATE {})", self.code)?;
        }
        Ok(())
    }
}
