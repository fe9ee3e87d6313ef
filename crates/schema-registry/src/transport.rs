//! One HTTP/1.1 request to the registry on a connection of its own: TCP, TLS for `https`,
//! hyper's client, the whole bounded by the request timeout.
//!
//! Registry calls are rare once the client's cache holds a topic's schema, so connections are
//! not pooled.
//!
//! # Invariants
//! - Every request carries the `Host` header, Confluent's content types and, when configured,
//!   the basic auth header; nothing else identifies the caller.
//! - A request never outlives the timeout: connecting, the TLS handshake, sending and reading
//!   the whole body count together.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;

use crate::config::{Endpoint, RegistryConfig, Scheme, TlsOptions};
use crate::error::RegistryError;

/// Confluent's content type, which Apicurio's compatibility API takes too.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// What the client accepts.
pub const ACCEPT: &str =
    "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json";

/// An answer: the status and the whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

/// What sends requests to one registry.
#[derive(Clone)]
pub struct Transport {
    endpoint: Endpoint,
    authorization: Option<String>,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    timeout: Duration,
}

impl Transport {
    /// The transport `config` describes.
    ///
    /// # Errors
    /// [`RegistryError::InvalidUrl`], or a TLS error naming the setting.
    pub fn new(config: &RegistryConfig) -> Result<Transport, RegistryError> {
        let endpoint = Endpoint::parse(&config.url)?;
        let authorization = config.basic_auth.as_ref().map(|auth| {
            let pair = format!("{}:{}", auth.username, auth.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        let tls = match endpoint.scheme {
            Scheme::Http => None,
            Scheme::Https => {
                let name = ServerName::try_from(endpoint.host.clone()).map_err(|_| {
                    RegistryError::InvalidUrl {
                        url: config.url.clone(),
                        reason: "the host is not a valid TLS server name",
                    }
                })?;
                let connector =
                    tokio_rustls::TlsConnector::from(Arc::new(client_config(&config.tls)?));
                Some((connector, name))
            }
        };
        Ok(Transport {
            endpoint,
            authorization,
            tls,
            timeout: config.request_timeout,
        })
    }

    /// The registry's base URL.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends `method path` (the path below the base path) with an optional JSON body.
    ///
    /// # Errors
    /// [`RegistryError::Unreachable`] or [`RegistryError::Timeout`]; an answer of any status
    /// is `Ok`.
    pub async fn send(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, RegistryError> {
        match tokio::time::timeout(self.timeout, self.exchange(call, method, path, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(RegistryError::Timeout {
                endpoint: self.endpoint.to_string(),
                call: call.to_owned(),
                timeout: self.timeout,
            }),
        }
    }

    async fn exchange(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, RegistryError> {
        let unreachable = |reason: String| RegistryError::Unreachable {
            endpoint: self.endpoint.to_string(),
            call: call.to_owned(),
            reason,
        };
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint.base_path))
            .header(hyper::header::HOST, self.endpoint.host_header())
            .header(hyper::header::ACCEPT, ACCEPT);
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, CONTENT_TYPE);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| unreachable(format!("the request cannot be built: {e}")))?;

        let tcp = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // Requests are small and answered at once: send without waiting to fill a segment.
        let _ = tcp.set_nodelay(true);
        // rustls's own errors (certificates, alerts: the handshake's, or a client certificate
        // refused right after it under TLS 1.3) are the setup's to fix; a connection cut may
        // pass.
        let failed = |e: &(dyn std::error::Error + 'static)| match tls_cause(e) {
            Some(tls) => RegistryError::TlsHandshake {
                endpoint: self.endpoint.to_string(),
                reason: tls.to_string(),
            },
            None => unreachable(e.to_string()),
        };
        match &self.tls {
            None => send_on(TokioIo::new(tcp), request)
                .await
                .map_err(|e| failed(&e)),
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| failed(&e))?;
                send_on(TokioIo::new(stream), request)
                    .await
                    .map_err(|e| failed(&e))
            }
        }
    }
}

/// The rustls error behind `error`, through its sources and the IO errors that wrap one.
fn tls_cause<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        current = e.source();
    }
    None
}

async fn send_on<S>(io: TokioIo<S>, request: Request<Full<Bytes>>) -> Result<Answer, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let driver = tokio::spawn(async move {
        // The connection ends with the exchange; its error shows in the response's.
        let _ = connection.await;
    });
    let result = async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer { status, body })
    }
    .await;
    driver.abort();
    result
}

/// The rustls configuration `tls` describes.
fn client_config(tls: &TlsOptions) -> Result<ClientConfig, RegistryError> {
    let setup = |e: &dyn std::fmt::Display| RegistryError::TlsSetup {
        reason: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(&e))?;
    let builder = if tls.verify_certificate {
        let mut roots = RootCertStore::empty();
        match &tls.ca_location {
            Some(path) => {
                let (added, _) =
                    roots.add_parsable_certificates(load_certs("ssl.ca.location", path)?);
                if added == 0 {
                    return Err(RegistryError::TlsFile {
                        setting: "ssl.ca.location",
                        path: path.clone(),
                        reason: "no usable CA certificate in it".to_owned(),
                    });
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let roots = Arc::new(roots);
        if tls.verify_host_name {
            builder.with_root_certificates(roots)
        } else {
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| setup(&e))?;
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
    match (&tls.certificate_location, &tls.key_location) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(
                load_certs("ssl.certificate.location", cert)?,
                load_key(key)?,
            )
            .map_err(|e| setup(&format!("the client certificate and key do not fit: {e}"))),
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(RegistryError::TlsSetup {
            reason:
                "ssl.certificate.location and ssl.key.location go together: set both or neither"
                    .to_owned(),
        }),
    }
}

fn load_certs(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, RegistryError> {
    let file_error = |reason: String| RegistryError::TlsFile {
        setting,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no PEM certificate in it".to_owned()));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, RegistryError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| RegistryError::TlsFile {
        setting: "ssl.key.location",
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// `ssl.endpoint.identification.algorithm = none`: the chain must lead to a trusted CA; the
/// names in the certificate are not compared with the host.
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

/// `enable.ssl.certificate.verification = false`: any certificate is accepted (the handshake
/// signatures are still checked).
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

    #[test]
    fn tls_settings_errors_name_the_setting() {
        let missing = TlsOptions {
            ca_location: Some("/nonexistent/ca.pem".into()),
            ..TlsOptions::default()
        };
        let err = client_config(&missing).unwrap_err();
        assert!(
            matches!(
                err,
                RegistryError::TlsFile {
                    setting: "ssl.ca.location",
                    ..
                }
            ),
            "{err}"
        );
        let half = TlsOptions {
            key_location: Some("/k.pem".into()),
            ..TlsOptions::default()
        };
        assert!(matches!(
            client_config(&half),
            Err(RegistryError::TlsSetup { .. })
        ));
        assert!(client_config(&TlsOptions::default()).is_ok());
    }
}
