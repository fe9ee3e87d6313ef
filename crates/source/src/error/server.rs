//! Errors PostgreSQL reported, sorted by their SQLSTATE and the command that failed, never by
//! their text: the text is in the server's `lc_messages` language and shown as it is.
//!
//! # Invariants
//! - [`consequence_of`] is the one table that says what a server error means for the process;
//!   it reads the SQLSTATE (code, else class) and the [`SourceOperation`], nothing else.
//! - [`ServerFailure::server_message`] is only ever displayed.
//! - A class the table does not name is [`Consequence::Fix`]: an error nobody classified stops
//!   Siphon with the server's message and SQLSTATE instead of reconnecting forever.

use super::{SourceOperation, SqlState};
use crate::names::SslMode;
use siphon_core::Consequence;
use std::fmt;

/// What a server error means for the process, from its SQLSTATE and the command that failed.
///
/// | SQLSTATE | meaning | consequence |
/// |---|---|---|
/// | 55006 object in use | the slot is active for another process (a standby waits for it) | Retry |
/// | 55P03 lock not available | a lock held by another session | Retry |
/// | 25006 read-only transaction, reading outbox rows | the transfer's condition writes (transfers read in read-only transactions) | Fix |
/// | 25006 read-only transaction | the server became a standby (a failover is under way) | Retry |
/// | 53400 configuration limit, creating the slot | `max_replication_slots` are all used | Fix |
/// | 57P04 database dropped | | Fix |
/// | XX001, XX002 data or index corrupted | | Fix |
/// | class 08 connection exception | | Retry |
/// | class 25 invalid transaction state (timeouts) | | Retry |
/// | class 40 transaction rollback (serialization, deadlock) | | Retry |
/// | class 53 insufficient resources (disk, memory, connections, `max_wal_senders`) | | Retry |
/// | class 57 operator intervention (shutdown, crash, cancel, starting up) | | Retry |
/// | class 58 system error (IO) | | Retry |
/// | class XX internal error (`elog`: a state a new session does not inherit; a lost slot is then found by the checks before streaming) | | Retry |
/// | class 28 invalid authorization, 3D invalid catalog (database), 3F invalid schema | | Fix |
/// | class 42 syntax or access rule (undefined object: slot or publication; privilege) | | Fix |
/// | class 55 object not in prerequisite state (an invalidated slot, a slot of another database) | | Fix |
/// | class 0A feature not supported, 22 data exception, 23 integrity, 54 program limit, F0 configuration file | | Fix |
/// | any other class | not classified: stop with the server's message | Fix |
pub fn consequence_of(code: SqlState, operation: &SourceOperation) -> Consequence {
    use Consequence::{Fix, Retry};
    match code {
        SqlState::OBJECT_IN_USE | SqlState::LOCK_NOT_AVAILABLE => Retry,
        SqlState::READ_ONLY_SQL_TRANSACTION
            if *operation == SourceOperation::Query(super::Query::OutboxRows) =>
        {
            Fix
        }
        SqlState::READ_ONLY_SQL_TRANSACTION => Retry,
        SqlState::CONFIGURATION_LIMIT_EXCEEDED
            if *operation == SourceOperation::CreateReplicationSlot =>
        {
            Fix
        }
        SqlState::DATABASE_DROPPED => Fix,
        SqlState::DATA_CORRUPTED | SqlState::INDEX_CORRUPTED => Fix,
        _ => match code.class() {
            "08" | "25" | "40" | "53" | "57" | "58" | "XX" => Retry,
            "28" | "3D" | "3F" | "42" | "55" | "0A" | "22" | "23" | "54" | "F0" => Fix,
            _ => Fix,
        },
    }
}

/// How the failed connection used TLS: what a refused login's fix depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginTls {
    /// `sslmode` of `source.url`.
    pub mode: SslMode,
    /// Whether `sslcert` names a client certificate.
    pub client_certificate: bool,
}

/// An error PostgreSQL reported, with the command that failed and what its fix names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFailure {
    /// What Siphon was doing.
    pub operation: SourceOperation,
    /// The SQLSTATE: what the error is.
    pub code: SqlState,
    /// What the server said (severity, message, detail, hint), in its `lc_messages` language:
    /// for display only, never inspected.
    pub server_message: String,
    /// The replication slot, named in slot fixes.
    pub slot: Option<String>,
    /// The user of `source.url`, named in privilege fixes.
    pub user: Option<String>,
    /// The connection's TLS, for a refused login.
    pub login: Option<LoginTls>,
}

/// What a server error is, as its fix names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnosis {
    /// The user lacks the `REPLICATION` attribute.
    MissingReplication,
    /// The slot is active for another process.
    SlotInUse,
    /// The slot does not exist.
    SlotMissing,
    /// A publication the slot decodes with did not exist where the changes were written.
    PublicationMissing,
    /// The slot cannot be decoded (invalidated, or not for this database).
    SlotUnusable,
    /// Every replication slot the server allows is used.
    SlotLimit,
    /// The login was refused on a connection without TLS.
    LoginWithoutTls,
    /// The login was refused on a TLS connection without a client certificate.
    LoginWithoutClientCertificate,
    /// The password or the `pg_hba.conf` entry.
    LoginRefused,
    /// Creating the publication failed; the statement is the fix.
    PublicationNotCreated,
    /// Creating the slot failed otherwise.
    SlotNotCreated,
    /// Every connection the server allows is used (`max_wal_senders` for a replication
    /// connection, `max_connections`): Siphon waits for one to be free.
    NoConnectionFree,
    /// Nothing more specific: the server's message and SQLSTATE.
    Other,
}

impl ServerFailure {
    /// What the error means for the process (see [`consequence_of`]).
    pub fn consequence(&self) -> Consequence {
        consequence_of(self.code, &self.operation)
    }

    /// What the error is, from its SQLSTATE and the command that failed.
    pub fn diagnosis(&self) -> Diagnosis {
        use SourceOperation as O;
        let code = self.code;
        match &self.operation {
            O::ReplicationLogin
            | O::IdentifySystem
            | O::TimelineHistory
            | O::AlterReplicationSlot
            | O::CreateReplicationSlot
            | O::StartReplication
                if code == SqlState::INSUFFICIENT_PRIVILEGE =>
            {
                Diagnosis::MissingReplication
            }
            O::StartReplication | O::AlterReplicationSlot | O::Stream
                if code == SqlState::OBJECT_IN_USE =>
            {
                Diagnosis::SlotInUse
            }
            O::StartReplication | O::AlterReplicationSlot if code == SqlState::UNDEFINED_OBJECT => {
                Diagnosis::SlotMissing
            }
            // The slot is acquired before streaming; publications are looked up while decoding.
            O::Stream if code == SqlState::UNDEFINED_OBJECT => Diagnosis::PublicationMissing,
            O::StartReplication | O::Stream
                if code == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE =>
            {
                Diagnosis::SlotUnusable
            }
            O::CreateReplicationSlot if code == SqlState::CONFIGURATION_LIMIT_EXCEEDED => {
                Diagnosis::SlotLimit
            }
            O::CreateReplicationSlot => Diagnosis::SlotNotCreated,
            O::Connect | O::ReplicationLogin if code == SqlState::TOO_MANY_CONNECTIONS => {
                Diagnosis::NoConnectionFree
            }
            O::CreatePublication { .. } => Diagnosis::PublicationNotCreated,
            O::Connect | O::ReplicationLogin if code.class() == "28" => match self.login {
                Some(LoginTls {
                    mode: SslMode::Disable,
                    ..
                }) if code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
                    Diagnosis::LoginWithoutTls
                }
                Some(LoginTls {
                    client_certificate: false,
                    ..
                }) if code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
                    Diagnosis::LoginWithoutClientCertificate
                }
                _ => Diagnosis::LoginRefused,
            },
            _ => Diagnosis::Other,
        }
    }

    fn slot(&self) -> &str {
        self.slot.as_deref().unwrap_or("<source.slot>")
    }
}

/// The command that moves slot `slot` past WAL it cannot decode, to the server's current
/// position (shown in errors).
pub(crate) fn advance_slot_hint(slot: &str) -> String {
    format!(
        "SELECT pg_replication_slot_advance({}, pg_current_wal_lsn())",
        crate::names::quote_literal(slot)
    )
}

/// The fix for a user without `REPLICATION`.
pub(crate) fn missing_replication_fix(user: Option<&str>) -> String {
    let role = user.map_or_else(
        || "<the user of source.url>".to_owned(),
        crate::names::quote_ident,
    );
    format!("the PostgreSQL user has no REPLICATION attribute, which Siphon needs to create and read its replication slot: run ALTER ROLE {role} REPLICATION as a superuser")
}

const LOGIN_FIX: &str = "check the user and password in source.url and that pg_hba.conf allows this user to connect from here";

impl fmt::Display for ServerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = &self.server_message;
        let code = self.code;
        let slot = self.slot();
        let login = match self.operation {
            SourceOperation::ReplicationLogin => "PostgreSQL refused the replication login",
            _ => "connecting to PostgreSQL",
        };
        match self.diagnosis() {
            Diagnosis::MissingReplication => write!(
                f,
                "{} (server said: {server}, SQLSTATE {code})",
                missing_replication_fix(self.user.as_deref())
            ),
            Diagnosis::SlotInUse => write!(
                f,
                "standby: replication slot \"{slot}\" is in use by another process; waiting to take over ({server}, SQLSTATE {code})"
            ),
            Diagnosis::SlotMissing => write!(
                f,
                "replication slot \"{slot}\" does not exist (it was dropped): restart Siphon to create it again; events written while it was missing were not captured: {server} (SQLSTATE {code})"
            ),
            // Before PostgreSQL 18 the server decodes each change with the publications as they
            // were when it was written, and stops at a change written while one was missing: a
            // publication created again since does not get the slot past those changes.
            Diagnosis::PublicationMissing => write!(
                f,
                "the publication did not exist when changes the slot still has to decode were written (it was dropped; PostgreSQL before 18 stops there): {server} (SQLSTATE {code}). If it is still missing, restart Siphon, which creates it (or create it with CREATE PUBLICATION ... FOR TABLE <outbox tables>). If it exists again, it was dropped and created again: the events committed while it was missing were not published, cannot be read from this slot and were not sent to Kafka, and the slot cannot get past them; move it on with {} (this skips every event not yet sent, so re-send the events committed since the publication was dropped from the application) and restart Siphon",
                advance_slot_hint(slot)
            ),
            Diagnosis::SlotUnusable => write!(
                f,
                "replication slot \"{slot}\" cannot be decoded: {server} (SQLSTATE {code}); if it was invalidated (its WAL was removed, see max_slot_wal_keep_size), drop it with SELECT pg_drop_replication_slot({}) and restart Siphon; events in the lost WAL cannot be recovered",
                crate::names::quote_literal(slot)
            ),
            Diagnosis::SlotLimit => write!(
                f,
                "creating replication slot \"{slot}\": {server} (SQLSTATE {code}): every replication slot the server allows is in use: drop one that is no longer used (SELECT pg_drop_replication_slot(...)) or raise max_replication_slots and restart PostgreSQL"
            ),
            Diagnosis::NoConnectionFree => {
                let limit = match self.operation {
                    SourceOperation::ReplicationLogin => "max_wal_senders (replication connections: the stream and each snapshot or re-send use one)",
                    _ => "max_connections",
                };
                write!(
                    f,
                    "PostgreSQL has no free connection: every one {limit} allows is in use ({server}, SQLSTATE {code}); Siphon tries again with backoff until one is free: raise {} and restart PostgreSQL, or stop another client",
                    limit.split(' ').next().unwrap_or(limit)
                )
            }
            Diagnosis::SlotNotCreated => write!(
                f,
                "creating replication slot \"{slot}\" (the user needs the REPLICATION attribute; max_replication_slots may be exhausted): {server} (SQLSTATE {code})"
            ),
            Diagnosis::PublicationNotCreated => {
                let command = match &self.operation {
                    SourceOperation::CreatePublication { command } => command.as_str(),
                    _ => "CREATE PUBLICATION ...",
                };
                write!(
                    f,
                    "creating the publication (run `{command}` as a user that owns the tables, or grant that): {server} (SQLSTATE {code})"
                )
            }
            Diagnosis::LoginWithoutTls => write!(
                f,
                "{login}: {server} (SQLSTATE {code}): sslmode=disable, and pg_hba.conf has no entry for this user without TLS: if the server accepts only TLS connections from here, set sslmode=verify-full and sslrootcert=/path/to/ca.pem in source.url; otherwise {LOGIN_FIX}"
            ),
            Diagnosis::LoginWithoutClientCertificate => write!(
                f,
                "{login}: {server} (SQLSTATE {code}): if pg_hba.conf wants a client certificate for this user, set sslcert and sslkey in source.url; otherwise {LOGIN_FIX}"
            ),
            Diagnosis::LoginRefused => {
                write!(f, "{login}: {server} (SQLSTATE {code}); {LOGIN_FIX}")
            }
            Diagnosis::Other => {
                write!(f, "{}: {server} (SQLSTATE {code})", self.operation)?;
                if self.consequence() == Consequence::Fix && !known_class(code) {
                    write!(
                        f,
                        "; Siphon does not retry errors of SQLSTATE class {}: fix what PostgreSQL names and restart Siphon",
                        code.class()
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Whether [`consequence_of`] names the class of `code`.
fn known_class(code: SqlState) -> bool {
    matches!(
        code.class(),
        "08" | "25"
            | "40"
            | "53"
            | "57"
            | "58"
            | "XX"
            | "28"
            | "3D"
            | "3F"
            | "42"
            | "55"
            | "0A"
            | "22"
            | "23"
            | "54"
            | "F0"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Query;
    use Consequence::{Fix, Retry};

    fn failure(code: &str, operation: SourceOperation) -> ServerFailure {
        ServerFailure {
            operation,
            code: SqlState::parse(code),
            // Deliberately not English: nothing may depend on it.
            server_message: "FEHLER: etwas ging schief".into(),
            slot: Some("s".into()),
            user: Some("cdc".into()),
            login: None,
        }
    }

    #[test]
    fn the_table_sorts_sqlstates_by_consequence() {
        use SourceOperation as O;
        let publication = O::CreatePublication {
            command: "CREATE PUBLICATION p".into(),
        };
        let rows: &[(&str, SourceOperation, Consequence)] = &[
            // The slot is active for another process: a standby waits to take over.
            ("55006", O::StartReplication, Retry),
            ("55006", O::AlterReplicationSlot, Retry),
            ("55P03", O::Query(Query::ReplicationSlot), Retry),
            // The slot (before streaming) or the publication (while streaming) is missing.
            ("42704", O::StartReplication, Fix),
            ("42704", O::Stream, Fix),
            // An invalidated slot, a slot of another database.
            ("55000", O::StartReplication, Fix),
            ("55000", O::Stream, Fix),
            // Privileges: no REPLICATION, not the owner of the tables.
            ("42501", O::ReplicationLogin, Fix),
            ("42501", O::CreateReplicationSlot, Fix),
            ("42501", publication.clone(), Fix),
            ("42601", O::StartReplication, Fix),
            // Authentication and the database.
            ("28000", O::ReplicationLogin, Fix),
            ("28P01", O::Connect, Fix),
            ("3D000", O::Connect, Fix),
            ("57P04", O::Stream, Fix),
            // The connection, the server's state, its resources.
            ("08006", O::Stream, Retry),
            ("08P01", O::ReplicationLogin, Retry),
            ("57P01", O::Stream, Retry),
            ("57P02", O::Stream, Retry),
            ("57P03", O::ReplicationLogin, Retry),
            ("57014", O::Query(Query::OutboxColumns), Retry),
            ("53300", O::ReplicationLogin, Retry),
            ("53100", O::Stream, Retry),
            ("53200", O::Stream, Retry),
            ("53400", O::Stream, Retry),
            // Every slot the server allows is used: only the operator frees one.
            ("53400", O::CreateReplicationSlot, Fix),
            ("40001", O::Query(Query::Publication), Retry),
            ("40P01", publication, Retry),
            ("25006", O::CreateReplicationSlot, Retry),
            ("25006", O::Query(Query::OutboxRows), Fix),
            ("58030", O::Stream, Retry),
            ("XX000", O::Stream, Retry),
            ("XX001", O::Stream, Fix),
            ("XX002", O::Query(Query::Publication), Fix),
            ("0A000", O::StartReplication, Fix),
            ("22021", O::Stream, Fix),
            ("54000", O::Stream, Fix),
            ("F0000", O::Connect, Fix),
            // Classes the table does not name stop instead of looping.
            ("P0001", O::Stream, Fix),
            ("HV000", O::Stream, Fix),
            ("ZZ999", O::Stream, Fix),
            ("", O::Stream, Fix),
        ];
        for (code, operation, expected) in rows {
            let failure = failure(code, operation.clone());
            assert_eq!(
                failure.consequence(),
                *expected,
                "SQLSTATE {code:?} during {operation:?}"
            );
            assert_eq!(consequence_of(failure.code, operation), *expected);
        }
    }

    #[test]
    fn the_diagnosis_comes_from_the_code_and_the_command() {
        use SourceOperation as O;
        let rows: &[(&str, SourceOperation, Diagnosis)] = &[
            ("55006", O::StartReplication, Diagnosis::SlotInUse),
            ("42704", O::StartReplication, Diagnosis::SlotMissing),
            ("42704", O::Stream, Diagnosis::PublicationMissing),
            ("55000", O::StartReplication, Diagnosis::SlotUnusable),
            ("42501", O::ReplicationLogin, Diagnosis::MissingReplication),
            (
                "42501",
                O::CreateReplicationSlot,
                Diagnosis::MissingReplication,
            ),
            ("53400", O::CreateReplicationSlot, Diagnosis::SlotLimit),
            ("53300", O::ReplicationLogin, Diagnosis::NoConnectionFree),
            ("53300", O::Connect, Diagnosis::NoConnectionFree),
            ("28P01", O::ReplicationLogin, Diagnosis::LoginRefused),
            ("42704", O::Query(Query::Publication), Diagnosis::Other),
            ("57P01", O::Stream, Diagnosis::Other),
        ];
        for (code, operation, expected) in rows {
            assert_eq!(
                failure(code, operation.clone()).diagnosis(),
                *expected,
                "SQLSTATE {code:?} during {operation:?}"
            );
        }
    }

    #[test]
    fn a_refused_login_is_told_apart_by_the_connection_s_tls() {
        let login = |mode, client_certificate| ServerFailure {
            login: Some(LoginTls {
                mode,
                client_certificate,
            }),
            ..failure("28000", SourceOperation::ReplicationLogin)
        };
        assert_eq!(
            login(SslMode::Disable, false).diagnosis(),
            Diagnosis::LoginWithoutTls
        );
        assert_eq!(
            login(SslMode::VerifyFull, false).diagnosis(),
            Diagnosis::LoginWithoutClientCertificate
        );
        assert_eq!(
            login(SslMode::VerifyFull, true).diagnosis(),
            Diagnosis::LoginRefused
        );
        let text = login(SslMode::Disable, false).to_string();
        assert!(
            text.contains("set sslmode=verify-full and sslrootcert"),
            "{text}"
        );
        let text = login(SslMode::VerifyFull, false).to_string();
        assert!(text.contains("set sslcert and sslkey"), "{text}");
    }

    #[test]
    fn messages_name_the_fix_whatever_the_server_s_language() {
        let text = failure("42704", SourceOperation::Stream).to_string();
        for fix in [
            "CREATE PUBLICATION",
            "SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())",
            "re-send",
            "FEHLER: etwas ging schief",
            "SQLSTATE 42704",
        ] {
            assert!(text.contains(fix), "{text}");
        }
        let text = failure("42501", SourceOperation::ReplicationLogin).to_string();
        assert!(text.contains(r#"ALTER ROLE "cdc" REPLICATION"#), "{text}");
        assert!(text.contains("no REPLICATION attribute"), "{text}");
        let text = failure("55006", SourceOperation::StartReplication).to_string();
        assert!(text.contains("waiting to take over"), "{text}");
        let text = failure("55000", SourceOperation::StartReplication).to_string();
        assert!(text.contains("invalidated") && text.contains("pg_drop_replication_slot('s')"));
        let text = failure("P0001", SourceOperation::Stream).to_string();
        assert!(
            text.contains("does not retry errors of SQLSTATE class P0"),
            "{text}"
        );
    }
}
