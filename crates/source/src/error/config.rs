//! What is wrong with the source's configuration (`source.url`, `source.tables`) or the files it
//! names, kept as the names and values the fix needs; the message is rendered in `Display`.
//!
//! # Invariants
//! - Every variant is a [`siphon_core::Consequence::Fix`]: retrying cannot change the settings.
//! - The password of `source.url` is never held: a URL is kept only redacted.

use std::path::PathBuf;

use crate::names::SslMode;

/// A problem of the configuration; each message names the key to change.
#[derive(Debug, thiserror::Error)]
pub enum SourceConfigError {
    #[error("invalid table name {text:?}: expected schema.table")]
    InvalidTableName { text: String },
    #[error("source.url: target_session_attrs={value} would pick a standby, but Siphon's replication slot lives on the primary: use target_session_attrs=read-write")]
    StandbyTarget { value: String },
    #[error("source.url: target_session_attrs={value:?} is not a libpq value Siphon knows: use read-write (or primary, or any)")]
    UnknownTarget { value: String },
    #[error("source.url names no user: add one, e.g. postgres://siphon@host/db")]
    NoUser,
    /// `redacted_url` is `source.url` without its password.
    #[error("source.url ({redacted_url}) is not a valid PostgreSQL URL: {syntax}")]
    UrlSyntax {
        redacted_url: String,
        syntax: UrlSyntax,
    },
    /// tokio-postgres refused the URL.
    #[error("source.url ({redacted_url}) is not a valid PostgreSQL URL: {}", crate::error::error_chain(.source))]
    UrlRefused {
        redacted_url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("source.url: channel_binding=require is not supported (the replication connection authenticates with SCRAM-SHA-256 without channel binding); remove it and use sslmode=verify-full, which authenticates the server by its certificate")]
    ChannelBindingRequired,
    #[error("source.url: sslmode=allow is not supported (it falls back to TLS only after a plain connection fails); use disable, prefer, require, verify-ca or verify-full")]
    SslModeAllow,
    #[error("source.url: sslmode={value:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    UnknownSslMode { value: String },
    #[error("source.url: sslpassword is not supported (encrypted client keys are not): decrypt the key once, e.g. `openssl pkey -in client.key -out client-plain.key`, keep that file readable by Siphon only, and name it in sslkey")]
    SslPassword,
    #[error("source.url: sslnegotiation={value:?} is not supported; only the standard negotiation (postgres) is")]
    SslNegotiation { value: String },
    #[error("source.url: sslrootcert=system needs sslmode=verify-full (public CAs sign certificates for anyone's host names), not sslmode={mode}")]
    SystemRootsNeedVerifyFull { mode: SslMode },
    #[error("source.url: sslmode={mode} needs sslrootcert=/path/to/ca.pem, the CA certificate that signed the server's certificate (or sslrootcert=system for a publicly trusted one)")]
    VerifyNeedsRootCert { mode: SslMode },
    #[error(
        "source.url: sslcert and sslkey go together: give both the client certificate and its key"
    )]
    CertWithoutKey,
    #[error("source.url: sslmode=disable contradicts sslrootcert/sslcert/sslkey: remove them or choose sslmode=verify-full")]
    DisableWithCertificates,
    #[error("source.url: the host {host:?} cannot be used as a TLS server name: {source}")]
    ServerName {
        host: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("source.url: {key} is empty; give a file path or leave it out")]
    EmptyPath { key: String },
    /// rustls could not build the TLS configuration.
    #[error("TLS set-up failed: {source}")]
    TlsSetup { source: rustls::Error },
    /// rustls could not build the certificate verifier of `verify-ca`.
    #[error("TLS set-up failed: {source}")]
    TlsVerifierSetup {
        source: rustls::client::VerifierBuilderError,
    },
    /// rustls refused the pair.
    #[error("source.url: the client certificate ({}) and key ({}) cannot be used together: {source}", .cert.display(), .key.display())]
    CertKeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("source.url: sslrootcert {} holds no usable CA certificate", .path.display())]
    NoUsableCa { path: PathBuf },
    #[error("source.url: cannot read {key} {}: {source}", .path.display())]
    UnreadableCertificate {
        key: String,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("source.url: {key} {} holds no PEM certificate", .path.display())]
    NoPemCertificate { key: String, path: PathBuf },
    #[error("source.url: cannot read sslkey {} (an unencrypted PEM key: PKCS#8, PKCS#1 or SEC1): {source}", .path.display())]
    UnreadableKey {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
}

/// Why the parameters of `source.url` cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlSyntax {
    #[error("a parameter name is not valid percent-encoded UTF-8")]
    UndecodableName,
    #[error("the value of {key} is not valid percent-encoded UTF-8")]
    UndecodableValue { key: String },
    #[error("expected = after {key}")]
    MissingEquals { key: String },
    #[error("{key} has no value")]
    NoValue { key: String },
    #[error("the quoted value of {key} is not terminated")]
    UnterminatedQuote { key: String },
}
