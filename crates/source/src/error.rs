//! Source errors, sorted by consequence.
//!
//! # Invariants
//! - [`SourceError::is_transient`] is true only for errors that reconnecting from the confirmed
//!   position can cure; every other error names what the operator must fix.

/// What went wrong between Siphon and PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The configuration cannot work; the message names the key to change.
    #[error("{0}")]
    Config(String),
    /// The server is not set up for logical replication, or the slot, publication or tables are
    /// not what Siphon needs. The message names the fix.
    #[error("{0}")]
    Definite(String),
    /// The connection failed or was cut; reconnecting from the confirmed position is safe.
    #[error("connection to PostgreSQL lost: {0}")]
    Transient(String),
    /// The stream broke the protocol (a bug on one side); reconnecting replays from the confirmed
    /// position.
    #[error("replication protocol error: {0}")]
    Protocol(String),
}

impl SourceError {
    /// Whether reconnecting from the confirmed position can cure the error.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Transient(_) | SourceError::Protocol(_))
    }

    /// Classifies an error from an ordinary SQL connection.
    pub(crate) fn from_sql(context: &str, err: tokio_postgres::Error) -> Self {
        if let Some(db) = err.as_db_error() {
            let code = db.code().code();
            // Class 28: invalid authorization; 3D: invalid catalog (database); 42: syntax or access.
            if code.starts_with("28") || code.starts_with("3D") || code.starts_with("42") {
                return SourceError::Definite(format!(
                    "{context}: {} (SQLSTATE {code})",
                    db.message()
                ));
            }
            return SourceError::Transient(format!(
                "{context}: {} (SQLSTATE {code})",
                db.message()
            ));
        }
        SourceError::Transient(format!("{context}: {}", error_chain(&err)))
    }

    /// Classifies a failure to open the SQL connection: certificate problems, a server without
    /// TLS and a `pg_hba.conf` that wants TLS are definite and say what to change.
    pub(crate) fn from_connect(tls: &crate::TlsSettings, err: tokio_postgres::Error) -> Self {
        if let Some(problem) = crate::tls::rustls_error(&err) {
            if crate::tls::is_certificate_problem(problem) {
                return SourceError::Definite(format!(
                    "connecting to PostgreSQL: TLS certificate problem (sslmode={}): {problem}; {}",
                    tls.mode,
                    certificate_hint(&problem.to_string())
                ));
            }
        }
        if err.as_db_error().is_none() && error_chain(&err).contains("server does not support TLS")
        {
            return SourceError::Definite(format!(
                "connecting to PostgreSQL: the server does not accept TLS (ssl = off) but source.url has sslmode={}: turn ssl on in postgresql.conf, or use sslmode=prefer or disable on a trusted network",
                tls.mode
            ));
        }
        if let Some(db) = err.as_db_error() {
            if db.code().code().starts_with("28") && db.message().contains("client certificate") {
                return SourceError::Definite(format!(
                    "connecting to PostgreSQL: {} (SQLSTATE {}): pg_hba.conf wants a client certificate for this user: set sslcert and sslkey in source.url",
                    db.message(),
                    db.code().code()
                ));
            }
            if db.code().code().starts_with("28") && db.message().contains("no encryption") {
                return SourceError::Definite(format!(
                    "connecting to PostgreSQL: {} (SQLSTATE {}): the server accepts only TLS connections from here but source.url has sslmode={}: set sslmode=verify-full and sslrootcert=/path/to/ca.pem in source.url",
                    db.message(),
                    db.code().code(),
                    tls.mode
                ));
            }
            if db.code().code().starts_with("28") {
                return SourceError::Definite(format!(
                    "connecting to PostgreSQL: {} (SQLSTATE {}): check the user and password in source.url and that pg_hba.conf allows this user to connect from here",
                    db.message(),
                    db.code().code()
                ));
            }
        }
        SourceError::from_sql("connecting to PostgreSQL", err)
    }

    /// The user lacks the `REPLICATION` attribute; `server` is what PostgreSQL said.
    pub(crate) fn missing_replication(user: Option<&str>, server: &str) -> Self {
        let role = user.map_or_else(
            || "<the user of source.url>".to_owned(),
            crate::config::quote_ident,
        );
        SourceError::Definite(format!(
            "the PostgreSQL user has no REPLICATION attribute, which Siphon needs to create and read its replication slot: run ALTER ROLE {role} REPLICATION as a superuser (server said: {server})"
        ))
    }

    /// Classifies an error from the replication connection.
    pub(crate) fn from_replication(slot: &str, err: crate::wire::WireError) -> Self {
        Self::from_replication_as(slot, None, err)
    }

    /// [`SourceError::from_replication`], naming `user` in the fix when the login lacks
    /// `REPLICATION`.
    pub(crate) fn from_replication_as(
        slot: &str,
        user: Option<&str>,
        err: crate::wire::WireError,
    ) -> Self {
        use crate::wire::{ProtocolViolation, WireError as E};
        const LOGIN_FIX: &str = "check the user and password in source.url and that pg_hba.conf allows a replication connection for that user";
        match &err {
            // Class 28: invalid authorization.
            E::Server(server) if server.code.starts_with("28") => {
                if server.message.contains("client certificate") {
                    SourceError::Definite(format!(
                        "PostgreSQL refused the replication login: {server}: pg_hba.conf wants a client certificate for this user: set sslcert and sslkey in source.url"
                    ))
                } else if server.message.contains("no encryption") {
                    SourceError::Definite(format!(
                        "PostgreSQL refused the replication login: {server}: the server accepts only TLS connections from here: set sslmode=verify-full and sslrootcert=/path/to/ca.pem in source.url"
                    ))
                } else {
                    SourceError::Definite(format!(
                        "PostgreSQL refused the replication login: {server}; {LOGIN_FIX}"
                    ))
                }
            }
            E::UnsupportedAuthentication(_) | E::Scram(_) => SourceError::Definite(format!(
                "PostgreSQL refused the replication login: {err}; {LOGIN_FIX}"
            )),
            E::TlsUnsupported => SourceError::Definite(
                "TLS to PostgreSQL failed on the replication connection: the server does not support TLS: turn ssl on in postgresql.conf, or use sslmode=prefer or disable on a trusted network".into(),
            ),
            E::Tls(io) => match crate::tls::rustls_error(io) {
                Some(problem) if crate::tls::is_certificate_problem(problem) => {
                    SourceError::Definite(format!(
                        "TLS to PostgreSQL failed on the replication connection: certificate problem: {problem}; {}",
                        certificate_hint(&problem.to_string())
                    ))
                }
                _ => SourceError::Definite(format!(
                    "TLS to PostgreSQL failed on the replication connection: {io}"
                )),
            },
            E::Protocol(ProtocolViolation::TooLarge { .. }) => {
                SourceError::Definite(err.to_string())
            }
            E::PublicationSkipped(notice) => SourceError::Definite(format!(
                "PostgreSQL skipped changes the slot decoded because the publication did not exist when they were written (it was dropped, and maybe created again, while Siphon was not streaming): {notice}. The events committed while it was missing were not published, cannot be read from this slot and were not sent to Kafka. If the publication is still missing, restart Siphon, which creates it (or create it with CREATE PUBLICATION ... FOR TABLE <outbox tables>); then re-send the events committed while it was missing from the application and move the slot past them with {} (this skips every event not yet sent: re-send those too) and restart Siphon",
                advance_slot_hint(slot)
            )),
            E::Server(server) => classify_server_message(slot, user, &server.to_string()),
            _ => SourceError::Transient(error_chain(&err)),
        }
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

/// The command that moves slot `slot` past WAL it cannot decode, to the server's current
/// position (shown in errors).
fn advance_slot_hint(slot: &str) -> String {
    format!(
        "SELECT pg_replication_slot_advance({}, pg_current_wal_lsn())",
        crate::config::quote_literal(slot)
    )
}

/// What to check for a certificate problem, from the text of the TLS error.
fn certificate_hint(problem: &str) -> &'static str {
    let text = problem.to_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    if has(&["unknownissuer", "unknown issuer", "unknownca"]) {
        "the server's certificate is not signed by the CA in sslrootcert: name the CA certificate that signed it"
    } else if has(&["notvalidforname", "not valid for name"]) {
        "the server's certificate does not name the host of source.url: connect with a host name (or IP address) the certificate lists, or use sslmode=verify-ca"
    } else if has(&["expired", "notvalidyet", "not valid yet"]) {
        "a certificate is outside its validity period: renew it (or check the clock)"
    } else if has(&["alert", "certificaterequired"]) {
        "the server refused Siphon's client certificate: check sslcert and sslkey, and that ssl_ca_file on the server holds the CA that signed them"
    } else {
        "check sslrootcert, sslcert and sslkey in source.url"
    }
}

/// Sorts a server error on the replication connection by what cures it.
fn classify_server_message(slot: &str, user: Option<&str>, message: &str) -> SourceError {
    if message.contains("replication role")
        || message.contains("REPLICATION attribute")
        || message.contains("permission denied to start WAL sender")
    {
        return SourceError::missing_replication(user, message);
    }
    if message.contains("is active for PID") {
        return SourceError::Transient(format!(
            "standby: replication slot \"{slot}\" is in use by another process; waiting to take over ({message})"
        ));
    }
    if message.contains("does not exist") && message.contains("replication slot") {
        return SourceError::Definite(format!(
            "replication slot \"{slot}\" does not exist (it was dropped): restart Siphon to create it again; events written while it was missing were not captured: {message}"
        ));
    }
    if message.contains("publication") && message.contains("does not exist") {
        // Before PostgreSQL 18 the server decodes each change with the publications as they
        // were when it was written, and stops at a change written while one was missing: a
        // publication created again since does not get the slot past those changes.
        return SourceError::Definite(format!(
            "the publication did not exist when changes the slot still has to decode were written (it was dropped; PostgreSQL before 18 stops there): {message}. If it is still missing, restart Siphon, which creates it (or create it with CREATE PUBLICATION ... FOR TABLE <outbox tables>). If it exists again, it was dropped and created again: the events committed while it was missing were not published, cannot be read from this slot and were not sent to Kafka, and the slot cannot get past them; move it on with {} (this skips every event not yet sent, so re-send the events committed since the publication was dropped from the application) and restart Siphon",
            advance_slot_hint(slot)
        ));
    }
    if message.contains("can no longer get changes from replication slot")
        || message.contains("has been invalidated")
    {
        return SourceError::Definite(format!(
            "replication slot \"{slot}\" was invalidated (its WAL was removed, see max_slot_wal_keep_size): drop it with SELECT pg_drop_replication_slot('{slot}') and restart Siphon; events in the lost WAL cannot be recovered: {message}"
        ));
    }
    SourceError::Transient(message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_sorted_by_consequence() {
        assert!(!classify_server_message(
            "s",
            None,
            "ERROR: replication slot \"s\" does not exist"
        )
        .is_transient());
        assert!(!classify_server_message(
            "s",
            None,
            "ERROR: can no longer get changes from replication slot \"s\""
        )
        .is_transient());
        assert!(classify_server_message(
            "s",
            None,
            "ERROR: replication slot \"s\" is active for PID 42"
        )
        .is_transient());
        assert!(classify_server_message(
            "s",
            None,
            "FATAL: terminating connection due to administrator command"
        )
        .is_transient());
        let dropped = classify_server_message(
            "s",
            None,
            "publication \"p\" does not exist (SQLSTATE 42704)",
        );
        assert!(!dropped.is_transient());
        for fix in [
            "CREATE PUBLICATION",
            "SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())",
            "re-send",
        ] {
            assert!(dropped.to_string().contains(fix), "{dropped}");
        }
        for missing in [
            "FATAL: must be superuser or replication role to start walsender (SQLSTATE 42501)",
            "FATAL: permission denied to start WAL sender (SQLSTATE 42501)",
        ] {
            let err = classify_server_message("s", Some("cdc"), missing);
            assert!(!err.is_transient());
            assert!(
                err.to_string().contains(r#"ALTER ROLE "cdc" REPLICATION"#),
                "{err}"
            );
        }
    }

    #[test]
    fn certificate_problems_name_what_to_check() {
        assert!(certificate_hint("invalid peer certificate: UnknownIssuer").contains("sslrootcert"));
        assert!(certificate_hint(
            "invalid peer certificate: certificate not valid for name \"x\"; certificate is only valid for DnsName(\"y\")"
        )
        .contains("does not name the host"));
        assert!(
            certificate_hint("invalid peer certificate: NotValidForName").contains("verify-ca")
        );
    }
}
