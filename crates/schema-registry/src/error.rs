//! The client's errors, each with what it means for the caller: try again, or have the
//! operator fix something.
//!
//! # Invariants
//! - [`RegistryError::consequence`] is `Retry` only for failures a later attempt can cure:
//!   the registry unreachable or slow, or answering 408, 429 or 5xx. Everything else (bad
//!   settings, credentials, a missing subject, an incompatible or invalid schema, an answer
//!   that is not the Confluent API's, a TLS handshake that fails on certificates) is `Fix`.
//! - No message holds a password.

use std::path::PathBuf;
use std::time::Duration;

use siphon_record::Consequence;

/// A failed registry call or setup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The registry URL cannot be used.
    #[error("schema registry URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A TLS file cannot be read.
    #[error("schema registry TLS: cannot use {setting} {}: {reason}", path.display())]
    TlsFile {
        /// The setting naming the file (`ssl.ca.location`, …).
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The TLS settings do not make a configuration.
    #[error("schema registry TLS: {reason}")]
    TlsSetup {
        /// Why.
        reason: String,
    },
    /// No connection or no answer.
    #[error("cannot reach the schema registry at {endpoint} ({call}): {reason}")]
    Unreachable {
        /// The registry.
        endpoint: String,
        /// The call.
        call: String,
        /// The IO, TLS or HTTP error.
        reason: String,
    },
    /// The TLS handshake failed on the certificates: the registry's is not trusted or does not
    /// name the host, or the registry refused the client's.
    #[error("TLS with the schema registry at {endpoint} failed: {reason}; check ssl.ca.location (the CA that signed the registry's certificate), the host name in the URL, and the client certificate the registry expects")]
    TlsHandshake {
        /// The registry.
        endpoint: String,
        /// rustls's error.
        reason: String,
    },
    /// No complete answer in time.
    #[error("the schema registry at {endpoint} did not answer {call} within {timeout:?}; if it is only slow, raise schema_registry.request_timeout_ms")]
    Timeout {
        /// The registry.
        endpoint: String,
        /// The call.
        call: String,
        /// The request timeout.
        timeout: Duration,
    },
    /// The registry answered with an error.
    #[error("the schema registry refused {call}: HTTP {status}{}: {message}{}", code.map(|c| format!(", error {c}")).unwrap_or_default(), fix_hint(*status, *code))]
    Refused {
        /// The call.
        call: String,
        /// The HTTP status.
        status: u16,
        /// The registry's `error_code`, when it gave one.
        code: Option<i64>,
        /// The registry's message, or the start of its body.
        message: String,
    },
    /// The answer is not what Confluent's API returns.
    #[error("the schema registry's answer to {call} is not the Confluent API's ({reason}); check that the URL points at the registry's API (Apicurio: …/apis/ccompat/v7)")]
    BadResponse {
        /// The call.
        call: String,
        /// What was wrong.
        reason: String,
    },
}

/// What the operator can do about a refusal.
fn fix_hint(status: u16, code: Option<i64>) -> &'static str {
    match (status, code) {
        (401, _) => "; check the basic auth user and password: schema_registry.username and schema_registry.password (or SIPHON_SCHEMA_REGISTRY_PASSWORD)",
        (403, _) => "; give the schema registry user (schema_registry.username) the right to this subject",
        (404, Some(40401)) => "; the subject does not exist: register its schema, or check the subject's name",
        (404, Some(40402)) => "; the subject has no such version: check the pinned version",
        (404, Some(40403)) => "; no schema has this id in this registry",
        (404, _) => "; check the registry URL (Apicurio: …/apis/ccompat/v7)",
        (409, _) => "; the schema is not compatible with the subject's earlier versions under its compatibility level: make the change compatible, or change the subject's compatibility",
        (422, _) => "; the registry refused the schema as invalid",
        _ => "",
    }
}

impl RegistryError {
    /// Whether the registry refused the schema itself (HTTP 409: incompatible with the
    /// subject's versions; 422: invalid) or has none for the subject (404 with error 40401 or
    /// 40402), rather than the caller (credentials, the URL).
    pub fn is_schema_refusal(&self) -> bool {
        matches!(
            self,
            RegistryError::Refused {
                status: 409 | 422,
                ..
            } | RegistryError::Refused {
                status: 404,
                code: Some(40401 | 40402),
                ..
            }
        )
    }

    /// What the error means for the caller.
    pub fn consequence(&self) -> Consequence {
        match self {
            RegistryError::Unreachable { .. } | RegistryError::Timeout { .. } => Consequence::Retry,
            RegistryError::Refused { status, .. }
                if *status == 408 || *status == 429 || *status >= 500 =>
            {
                Consequence::Retry
            }
            RegistryError::InvalidUrl { .. }
            | RegistryError::TlsFile { .. }
            | RegistryError::TlsSetup { .. }
            | RegistryError::TlsHandshake { .. }
            | RegistryError::Refused { .. }
            | RegistryError::BadResponse { .. } => Consequence::Fix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, code: Option<i64>) -> RegistryError {
        RegistryError::Refused {
            call: "register subject \"t-value\"".to_owned(),
            status,
            code,
            message: "m".to_owned(),
        }
    }

    #[test]
    fn only_passing_failures_are_retried() {
        for status in [408, 429, 500, 502, 503, 504] {
            assert_eq!(refused(status, None).consequence(), Consequence::Retry);
        }
        for status in [400, 401, 403, 404, 405, 409, 415, 422] {
            assert_eq!(refused(status, None).consequence(), Consequence::Fix);
        }
        let unreachable = RegistryError::Unreachable {
            endpoint: "http://r".to_owned(),
            call: "c".to_owned(),
            reason: "refused".to_owned(),
        };
        assert_eq!(unreachable.consequence(), Consequence::Retry);
        let bad = RegistryError::BadResponse {
            call: "c".to_owned(),
            reason: "not JSON".to_owned(),
        };
        assert_eq!(bad.consequence(), Consequence::Fix);
    }

    #[test]
    fn refusals_name_the_fix() {
        assert_eq!(
            refused(409, Some(409)).to_string(),
            "the schema registry refused register subject \"t-value\": HTTP 409, error 409: m; the schema is not compatible with the subject's earlier versions under its compatibility level: make the change compatible, or change the subject's compatibility"
        );
        assert!(refused(404, Some(40401))
            .to_string()
            .contains("the subject does not exist"));
        let unauthorized = refused(401, None).to_string();
        assert!(
            unauthorized.contains("schema_registry.username")
                && unauthorized.contains("schema_registry.password"),
            "{unauthorized}"
        );
        let slow = RegistryError::Timeout {
            endpoint: "http://r".to_owned(),
            call: "c".to_owned(),
            timeout: Duration::from_secs(1),
        };
        assert!(slow
            .to_string()
            .contains("schema_registry.request_timeout_ms"));
    }
}
