//! How to reach a registry: its URL, basic auth, TLS and the retry policy.
//!
//! The TLS options carry librdkafka's names, as the Kafka connection's `kafka.properties` do:
//! `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`,
//! `enable.ssl.certificate.verification` and `ssl.endpoint.identification.algorithm`
//! (`https` or `none`). Basic auth is Confluent's `basic.auth.user.info` split in two.
//!
//! # Invariants
//! - A parsed [`Endpoint`] has a scheme of `http` or `https`, a host, a port, and a base path
//!   that is empty or starts with `/` and does not end with one.
//! - The password never appears in `Debug` output.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::RegistryError;

/// Where and how to reach one registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The base URL: `http(s)://host[:port][/path]`. The path is kept, so Apicurio's
    /// compatibility API (`…/apis/ccompat/v7`) works as the base.
    pub url: String,
    /// HTTP basic auth, sent with every request.
    pub basic_auth: Option<BasicAuth>,
    /// TLS, for an `https` URL.
    pub tls: TlsOptions,
    /// How long one request may take: connecting, TLS, the answer.
    pub request_timeout: Duration,
    /// How requests that failed for a passing reason are retried.
    pub retry: RetryPolicy,
    /// How long [`crate::SchemaRegistry::latest`] keeps a subject's latest version before asking
    /// again; `None`: until [`crate::SchemaRegistry::forget_latest`].
    pub latest_ttl: Option<Duration>,
}

impl RegistryConfig {
    /// The defaults for `url`: no auth, TLS verifying chain and host name against the public
    /// CAs, 30 s per request, the default retries, the latest version kept until forgotten.
    pub fn new(url: impl Into<String>) -> Self {
        RegistryConfig {
            url: url.into(),
            basic_auth: None,
            tls: TlsOptions::default(),
            request_timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            latest_ttl: None,
        }
    }
}

/// HTTP basic auth (`basic.auth.user.info = user:password`).
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// The user.
    pub username: String,
    /// The password.
    pub password: String,
}

impl fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS for an `https` registry, in librdkafka's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// `ssl.ca.location`: PEM file of the CA certificates to trust; `None`: the public CAs.
    pub ca_location: Option<PathBuf>,
    /// `ssl.certificate.location`: the client certificate (PEM), with `key_location`.
    pub certificate_location: Option<PathBuf>,
    /// `ssl.key.location`: the client certificate's unencrypted key (PEM).
    pub key_location: Option<PathBuf>,
    /// `enable.ssl.certificate.verification`: whether the server's chain is checked.
    pub verify_certificate: bool,
    /// `ssl.endpoint.identification.algorithm = https`: whether the certificate must name the
    /// host.
    pub verify_host_name: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            ca_location: None,
            certificate_location: None,
            key_location: None,
            verify_certificate: true,
            verify_host_name: true,
        }
    }
}

/// How failed requests whose error is a passing one ([`RegistryError::consequence`] is
/// `Retry`) are tried again: capped exponential backoff with jitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1.
    pub attempts: u32,
    /// The first delay.
    pub initial_backoff: Duration,
    /// The longest delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

/// A parsed base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The scheme.
    pub scheme: Scheme,
    /// The host name or address, IPv6 addresses without brackets.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The base path: empty, or `/…` without a trailing `/`.
    pub base_path: String,
}

impl Endpoint {
    /// Parses `http(s)://host[:port][/path]`.
    ///
    /// # Errors
    /// [`RegistryError::InvalidUrl`] naming what is wrong.
    pub fn parse(url: &str) -> Result<Endpoint, RegistryError> {
        let invalid = |reason: &'static str| RegistryError::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else {
            return Err(invalid("it must start with http:// or https://"));
        };
        if rest.contains(['?', '#']) {
            return Err(invalid("it must not have a query or a fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(invalid(
                "credentials go in the basic auth settings, not in the URL",
            ));
        }
        let default_port = match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("an IPv6 address lacks its closing ]"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| invalid("only :port may follow an IPv6 address"))?,
                ),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(invalid("it has no host"));
        }
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| invalid("the port must be a number from 1 to 65535"))?,
        };
        Ok(Endpoint {
            scheme,
            host: host.to_owned(),
            port,
            base_path: path.trim_end_matches('/').to_owned(),
        })
    }

    /// The `Host` header's value.
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match (self.scheme, self.port) {
            (Scheme::Http, 80) | (Scheme::Https, 443) => host,
            (_, port) => format!("{host}:{port}"),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.host_header(), self.base_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let e = Endpoint::parse("http://registry:8081").unwrap();
        assert_eq!(
            (e.scheme, e.host.as_str(), e.port, e.base_path.as_str()),
            (Scheme::Http, "registry", 8081, "")
        );
        let e = Endpoint::parse("https://apicurio.example/apis/ccompat/v7/").unwrap();
        assert_eq!(
            (e.scheme, e.host.as_str(), e.port, e.base_path.as_str()),
            (Scheme::Https, "apicurio.example", 443, "/apis/ccompat/v7")
        );
        assert_eq!(e.to_string(), "https://apicurio.example/apis/ccompat/v7");
        let e = Endpoint::parse("http://[::1]:8081").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 8081));
        assert_eq!(e.host_header(), "[::1]:8081");
        for bad in [
            "registry:8081",
            "http://",
            "http://:8081",
            "http://h:0",
            "http://h:x",
            "http://u:p@h",
            "http://h/?q",
            "http://[::1",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(RegistryError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_password_is_not_printed() {
        let auth = BasicAuth {
            username: "u".to_owned(),
            password: "secret".to_owned(),
        };
        assert!(!format!("{auth:?}").contains("secret"));
    }
}
