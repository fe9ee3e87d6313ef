//! Why PostgreSQL's login or TLS refused Siphon for good: the `sslmode`, and the TLS or
//! authentication error the libraries reported; the message naming what to change is rendered
//! in `Display`.
//!
//! # Invariants
//! - Every variant is a [`siphon_core::Consequence::Fix`]: the same settings meet the same
//!   refusal on every reconnect.

use std::fmt;

use crate::names::SslMode;
use crate::wire::WireError;

/// What to check when the replication login is refused.
const LOGIN_FIX: &str = "check the user and password in source.url and that pg_hba.conf allows a replication connection for that user";

/// A login or TLS set-up PostgreSQL or the TLS library refused.
#[derive(Debug)]
pub enum LoginProblem {
    /// The SQL connection met a certificate problem; `detail` is rustls's error.
    SqlCertificate { mode: SslMode, detail: String },
    /// The server does not accept TLS, but `sslmode` requires it.
    SqlTlsUnsupported { mode: SslMode },
    /// The replication login failed (an authentication method or SCRAM exchange).
    ReplicationLogin(WireError),
    /// The server does not support TLS on the replication connection.
    ReplicationTlsUnsupported,
    /// The replication connection met a certificate problem; `detail` is rustls's error.
    ReplicationCertificate { detail: String },
    /// The TLS handshake of the replication connection failed.
    ReplicationTls(std::io::Error),
}

impl std::error::Error for LoginProblem {}

impl fmt::Display for LoginProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginProblem::SqlCertificate { mode, detail } => write!(
                f,
                "connecting to PostgreSQL: TLS certificate problem (sslmode={mode}): {detail}; {}",
                super::certificate_hint(detail)
            ),
            LoginProblem::SqlTlsUnsupported { mode } => write!(
                f,
                "connecting to PostgreSQL: the server does not accept TLS (ssl = off) but source.url has sslmode={mode}: turn ssl on in postgresql.conf, or use sslmode=prefer or disable on a trusted network"
            ),
            LoginProblem::ReplicationLogin(err) => write!(
                f,
                "PostgreSQL refused the replication login: {err}; {LOGIN_FIX}"
            ),
            LoginProblem::ReplicationTlsUnsupported => f.write_str(
                "TLS to PostgreSQL failed on the replication connection: the server does not support TLS: turn ssl on in postgresql.conf, or use sslmode=prefer or disable on a trusted network",
            ),
            LoginProblem::ReplicationCertificate { detail } => write!(
                f,
                "TLS to PostgreSQL failed on the replication connection: certificate problem: {detail}; {}",
                super::certificate_hint(detail)
            ),
            LoginProblem::ReplicationTls(io) => write!(
                f,
                "TLS to PostgreSQL failed on the replication connection: {io}"
            ),
        }
    }
}

/// The rustls error somewhere in an error's source chain, if any.
pub(crate) fn rustls_error<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                if let Some(found) = inner.downcast_ref::<rustls::Error>() {
                    return Some(found);
                }
            }
        }
        current = e.source();
    }
    None
}

/// Whether a TLS failure is about certificates (the server's or ours), which reconnecting
/// cannot cure.
pub(crate) fn is_certificate_problem(err: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match err {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::UnsupportedNameType => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::CertificateRequired
                | A::AccessDenied
        ),
        _ => false,
    }
}
