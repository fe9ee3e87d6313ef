//! TLS to PostgreSQL, configured the libpq way: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`
//! in `source.url`.
//!
//! Both connections use rustls (with the *ring* provider): the SQL one through
//! `tokio-postgres-rustls`, the replication one through `tokio-rustls` ([`crate::wire`]).
//!
//! # Invariants
//! - Both connections get the same guarantees from the same settings: [`TlsSettings::sql_connector`]
//!   and [`TlsSettings::replication_tls`] are built by one function from one [`TlsSettings`].
//! - `verify-full` checks the certificate chain against `sslrootcert` and that the certificate
//!   names the host of the URL (a DNS name or an IP address); `verify-ca` (and `require` with an
//!   `sslrootcert`) checks the chain only; `prefer` and `require` without `sslrootcert` encrypt
//!   but do not authenticate the server.
//! - Certificate and key files are read on every connection attempt, so rotated files are used on
//!   the next reconnection.

use crate::error::SourceConfigError;
pub use crate::names::SslMode;
use crate::SourceError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl SslMode {
    fn parse(text: &str) -> Result<Self, SourceError> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => return Err(SourceConfigError::SslModeAllow.into()),
            other => {
                return Err(SourceConfigError::UnknownSslMode {
                    value: other.to_owned(),
                }
                .into())
            }
        })
    }
}

/// Where the certificates that may sign the server's certificate come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// No `sslrootcert`: the server's certificate is not verified.
    None,
    /// A PEM file with one or more CA certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the Mozilla root set (public CAs), for servers with a publicly
    /// trusted certificate.
    System,
}

/// TLS settings read from `source.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_certs: RootCerts,
    /// `sslcert`: the client certificate (PEM), for `cert` authentication.
    pub client_cert: Option<PathBuf>,
    /// `sslkey`: its private key (PEM: PKCS#8, PKCS#1 or SEC1, not encrypted).
    pub client_key: Option<PathBuf>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: SslMode::Prefer,
            root_certs: RootCerts::None,
            client_cert: None,
            client_key: None,
        }
    }
}

impl TlsSettings {
    /// The TLS of a login, as errors name it.
    pub(crate) fn login(&self) -> crate::error::LoginTls {
        crate::error::LoginTls {
            mode: self.mode,
            client_certificate: self.client_cert.is_some(),
        }
    }

    /// Builds the settings from the `ssl*` parameters of the URL (decoded, in order; a later one
    /// wins, as in libpq).
    pub(crate) fn from_params(params: &[(String, String)]) -> Result<Self, SourceError> {
        let mut mode = None;
        let mut root_certs = RootCerts::None;
        let mut client_cert = None;
        let mut client_key = None;
        for (key, value) in params {
            match key.as_str() {
                "sslmode" => mode = Some(SslMode::parse(value)?),
                "sslrootcert" if value == "system" => root_certs = RootCerts::System,
                "sslrootcert" => {
                    root_certs = non_empty(key, value)?.map_or(RootCerts::None, RootCerts::File)
                }
                "sslcert" => client_cert = non_empty(key, value)?,
                "sslkey" => client_key = non_empty(key, value)?,
                "sslpassword" => return Err(SourceConfigError::SslPassword.into()),
                "sslnegotiation" if value == "postgres" => {}
                "sslnegotiation" => {
                    return Err(SourceConfigError::SslNegotiation {
                        value: value.clone(),
                    }
                    .into())
                }
                _ => {}
            }
        }
        let mode = match (mode, &root_certs) {
            (Some(mode), _) => mode,
            // libpq: sslrootcert=system makes verify-full the default.
            (None, RootCerts::System) => SslMode::VerifyFull,
            (None, _) => SslMode::Prefer,
        };
        if root_certs == RootCerts::System && mode != SslMode::VerifyFull {
            return Err(SourceConfigError::SystemRootsNeedVerifyFull { mode }.into());
        }
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_certs == RootCerts::None
        {
            return Err(SourceConfigError::VerifyNeedsRootCert { mode }.into());
        }
        if client_cert.is_some() != client_key.is_some() {
            return Err(SourceConfigError::CertWithoutKey.into());
        }
        if mode == SslMode::Disable && (client_cert.is_some() || root_certs != RootCerts::None) {
            return Err(SourceConfigError::DisableWithCertificates.into());
        }
        Ok(TlsSettings {
            mode,
            root_certs,
            client_cert,
            client_key,
        })
    }

    /// Whether the server's certificate chain is checked.
    pub fn verifies_chain(&self) -> bool {
        match self.mode {
            SslMode::Disable | SslMode::Prefer => false,
            SslMode::Require => self.root_certs != RootCerts::None,
            SslMode::VerifyCa | SslMode::VerifyFull => true,
        }
    }

    /// Whether the server's certificate must name the host.
    pub fn verifies_host_name(&self) -> bool {
        self.mode == SslMode::VerifyFull
    }

    /// The connector for the ordinary SQL connection (tokio-postgres).
    pub fn sql_connector(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect, SourceError> {
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(
            self.client_config()?,
        ))
    }

    /// The TLS set-up of the replication connection to `host`: `None` for `sslmode=disable`.
    pub(crate) fn replication_tls(
        &self,
        host: &str,
    ) -> Result<Option<crate::wire::Tls>, SourceError> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        // The name the certificate must carry is the URL's host; an IP address is checked
        // against the certificate's IP address entries.
        let server_name = ServerName::try_from(host.to_owned()).map_err(|e| {
            SourceError::from(SourceConfigError::ServerName {
                host: host.to_owned(),
                source: e,
            })
        })?;
        Ok(Some(crate::wire::Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(self.client_config()?)),
            server_name,
            required: self.mode != SslMode::Prefer,
        }))
    }

    /// The rustls configuration both connections use.
    fn client_config(&self) -> Result<ClientConfig, SourceError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| SourceError::from(SourceConfigError::TlsSetup { source }))?;
        let builder = if self.verifies_chain() {
            let roots = Arc::new(self.root_store()?);
            if self.verifies_host_name() {
                builder.with_root_certificates(roots)
            } else {
                let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|source| {
                        SourceError::from(SourceConfigError::TlsVerifierSetup { source })
                    })?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
            }
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(
                    provider.signature_verification_algorithms,
                )))
        };
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(load_certs("sslcert", cert)?, load_key(key)?)
                .map_err(|source| {
                    SourceError::from(SourceConfigError::CertKeyMismatch {
                        cert: cert.clone(),
                        key: key.clone(),
                        source,
                    })
                })?,
            _ => builder.with_no_client_auth(),
        };
        Ok(config)
    }

    fn root_store(&self) -> Result<RootCertStore, SourceError> {
        let mut roots = RootCertStore::empty();
        match &self.root_certs {
            RootCerts::File(path) => {
                let (added, _) = roots.add_parsable_certificates(load_certs("sslrootcert", path)?);
                if added == 0 {
                    return Err(SourceConfigError::NoUsableCa { path: path.clone() }.into());
                }
            }
            RootCerts::System => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            RootCerts::None => {}
        }
        Ok(roots)
    }
}

fn non_empty(key: &str, value: &str) -> Result<Option<PathBuf>, SourceError> {
    if value.is_empty() {
        return Err(SourceConfigError::EmptyPath {
            key: key.to_owned(),
        }
        .into());
    }
    Ok(Some(PathBuf::from(value)))
}

fn load_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SourceError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| {
            SourceError::from(SourceConfigError::UnreadableCertificate {
                key: key.to_owned(),
                path: path.to_owned(),
                source,
            })
        })?;
    if certs.is_empty() {
        return Err(SourceConfigError::NoPemCertificate {
            key: key.to_owned(),
            path: path.to_owned(),
        }
        .into());
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, SourceError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| {
        SourceError::from(SourceConfigError::UnreadableKey {
            path: path.to_owned(),
            source,
        })
    })
}

/// `verify-ca`: the chain must lead to `sslrootcert`; the names in the certificate are not
/// compared with the host.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without `sslrootcert`: any certificate is accepted (the handshake
/// signatures are still checked, so the session is encrypted to whoever holds that
/// certificate's key).
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_default_is_prefer_as_in_libpq() {
        let tls = TlsSettings::from_params(&[]).unwrap();
        assert_eq!(tls, TlsSettings::default());
        assert!(!tls.verifies_chain());
        let wire = tls.replication_tls("db").unwrap().unwrap();
        assert!(!wire.required, "prefer falls back to a plain session");
        let disabled = TlsSettings::from_params(&params(&[("sslmode", "disable")])).unwrap();
        assert!(disabled.replication_tls("db").unwrap().is_none());
    }

    #[test]
    fn verify_modes_need_a_root_certificate() {
        for mode in ["verify-ca", "verify-full"] {
            let err = TlsSettings::from_params(&params(&[("sslmode", mode)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("needs sslrootcert"), "{err}");
        }
        let full = TlsSettings::from_params(&params(&[
            ("sslmode", "verify-full"),
            ("sslrootcert", "/ca.pem"),
        ]))
        .unwrap();
        assert!(full.verifies_chain() && full.verifies_host_name());
        // The replication connection reads the same root certificate file.
        let err = full.replication_tls("127.0.0.1").err().unwrap().to_string();
        assert!(err.contains("sslrootcert /ca.pem"), "{err}");
    }

    #[test]
    fn require_with_a_root_certificate_verifies_the_chain_as_libpq_does() {
        let plain = TlsSettings::from_params(&params(&[("sslmode", "require")])).unwrap();
        assert!(!plain.verifies_chain());
        assert!(plain.replication_tls("h").unwrap().unwrap().required);
        let with_ca = TlsSettings::from_params(&params(&[
            ("sslmode", "require"),
            ("sslrootcert", "/ca.pem"),
        ]))
        .unwrap();
        assert!(with_ca.verifies_chain() && !with_ca.verifies_host_name());
    }

    #[test]
    fn system_roots_imply_verify_full() {
        let tls = TlsSettings::from_params(&params(&[("sslrootcert", "system")])).unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert!(TlsSettings::from_params(&params(&[
            ("sslrootcert", "system"),
            ("sslmode", "verify-ca")
        ]))
        .is_err());
    }

    #[test]
    fn unsupported_or_contradictory_settings_are_refused_with_the_fix() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("sslmode", "allow")], "sslmode=allow is not supported"),
            (&[("sslmode", "bogus")], "is not one of"),
            (&[("sslpassword", "pw")], "openssl pkey"),
            (&[("sslcert", "/c.pem")], "sslcert and sslkey go together"),
            (&[("sslnegotiation", "direct")], "sslnegotiation"),
            (
                &[("sslmode", "disable"), ("sslrootcert", "/ca.pem")],
                "contradicts",
            ),
        ];
        for (given, expected) in cases {
            let err = TlsSettings::from_params(&params(given))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{given:?}: {err}");
            assert!(!err.contains("pw\""), "{err}");
        }
    }

    #[test]
    fn client_certificates_reach_the_replication_connection() {
        let tls = TlsSettings::from_params(&params(&[
            ("sslmode", "require"),
            ("sslcert", "/nonexistent/c.pem"),
            ("sslkey", "/nonexistent/k.pem"),
        ]))
        .unwrap();
        let err = tls.replication_tls("db.example").err().unwrap().to_string();
        assert!(err.contains("/nonexistent/c.pem"), "{err}");
    }

    #[test]
    fn missing_files_are_named() {
        let tls = TlsSettings::from_params(&params(&[
            ("sslmode", "verify-full"),
            ("sslrootcert", "/nonexistent/ca.pem"),
        ]))
        .unwrap();
        let err = tls.sql_connector().err().unwrap().to_string();
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
    }
}
