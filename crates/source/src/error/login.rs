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
    /// The SQL connection met a certificate problem.
    SqlCertificate {
        mode: SslMode,
        problem: rustls::Error,
    },
    /// The server does not accept TLS, but `sslmode` requires it.
    SqlTlsUnsupported { mode: SslMode },
    /// The replication login failed (an authentication method or SCRAM exchange).
    ReplicationLogin(WireError),
    /// The server does not support TLS on the replication connection.
    ReplicationTlsUnsupported,
    /// The replication connection met a certificate problem.
    ReplicationCertificate { problem: rustls::Error },
    /// The TLS handshake of the replication connection failed.
    ReplicationTls(std::io::Error),
}

impl std::error::Error for LoginProblem {}

impl fmt::Display for LoginProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginProblem::SqlCertificate { mode, problem } => write!(
                f,
                "connecting to PostgreSQL: TLS certificate problem (sslmode={mode}): {problem}; {}",
                certificate_hint(problem)
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
            LoginProblem::ReplicationCertificate { problem } => write!(
                f,
                "TLS to PostgreSQL failed on the replication connection: certificate problem: {problem}; {}",
                certificate_hint(problem)
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

/// What to check for a certificate problem, by its kind.
fn certificate_hint(problem: &rustls::Error) -> &'static str {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match problem {
        E::InvalidCertificate(C::UnknownIssuer) => {
            "the server's certificate is not signed by the CA in sslrootcert: name the CA certificate that signed it"
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the server's certificate does not name the host of source.url: connect with a host name (or IP address) the certificate lists, or use sslmode=verify-ca"
        }
        E::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        )
        | E::AlertReceived(A::CertificateExpired) => {
            "a certificate is outside its validity period: renew it (or check the clock)"
        }
        E::AlertReceived(_) => {
            "the server refused Siphon's client certificate: check sslcert and sslkey, and that ssl_ca_file on the server holds the CA that signed them"
        }
        _ => "check sslrootcert, sslcert and sslkey in source.url",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};

    #[test]
    fn certificate_problems_name_what_to_check() {
        let hint = |problem| certificate_hint(&problem);
        assert!(hint(E::InvalidCertificate(C::UnknownIssuer)).contains("sslrootcert"));
        assert!(hint(E::InvalidCertificate(C::NotValidForName)).contains("does not name the host"));
        assert!(hint(E::InvalidCertificate(C::NotValidForName)).contains("verify-ca"));
        assert!(hint(E::InvalidCertificate(C::Expired)).contains("validity period"));
        assert!(hint(E::AlertReceived(A::CertificateRequired)).contains("client certificate"));
        assert!(hint(E::AlertReceived(A::UnknownCA)).contains("ssl_ca_file"));
        assert!(hint(E::NoCertificatesPresented).contains("check sslrootcert"));
    }
}
