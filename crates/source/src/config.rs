//! Source configuration and connection parameters.
//!
//! # Invariants
//! - A [`TableName`] always has a schema (`public` when the user gave none).

use crate::error::{SourceConfigError, UrlSyntax};
pub use crate::names::{quote_ident, quote_literal, Endpoint, TableName, TargetSession};
use crate::tls::TlsSettings;
use crate::SourceError;
use std::fmt;
#[cfg(test)]
use std::path::Path;
use std::time::Duration;

/// What the source needs to know; the binary builds it from the `[source]` section.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// libpq-style URL, e.g. `postgres://siphon@127.0.0.1:5432/app`.
    pub url: String,
    /// Logical replication slot (created with `pgoutput` if missing).
    pub slot: String,
    /// Publication (created `FOR TABLE <tables> WITH (publish_via_partition_root = true)` if
    /// missing).
    pub publication: String,
    /// Outbox tables.
    pub tables: Vec<TableName>,
    /// How often the confirmed position is reported to the server at most.
    pub status_interval: Duration,
    /// How long a silent stream is expected to stay silent at most: the stall watch looks at a
    /// stream silent for twice this plus a status interval.
    pub idle_wakeup_interval: Duration,
    /// Most bytes of events read ahead of the pipeline (one larger event passes alone).
    pub read_ahead_bytes: usize,
    /// `application_name` of the replication connection.
    pub application_name: String,
    /// Keep the slot as a failover slot (PostgreSQL 17+), synchronized to physical standbys.
    pub failover: bool,
}

impl TargetSession {
    fn parse(value: &str) -> Result<Self, SourceError> {
        match value {
            "any" => Ok(TargetSession::Any),
            "read-write" => Ok(TargetSession::ReadWrite),
            "primary" => Ok(TargetSession::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(SourceConfigError::StandbyTarget {
                value: value.to_owned(),
            }
            .into()),
            other => Err(SourceConfigError::UnknownTarget {
                value: other.to_owned(),
            }
            .into()),
        }
    }
}

/// Hosts, user, password, database and TLS settings taken from `source.url`.
#[derive(Clone)]
pub struct ConnectionParams {
    /// The hosts, in the order they are tried (at least one).
    pub endpoints: Vec<Endpoint>,
    /// Which host to use (`target_session_attrs`).
    pub target: TargetSession,
    pub user: String,
    pub password: String,
    pub database: String,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`: used by both connections.
    pub tls: TlsSettings,
    /// `connect_timeout` (seconds; absent, or 0 and below, for none): the SQL connection's, and
    /// the bound on opening the replication connection (its default otherwise).
    pub connect_timeout: Option<Duration>,
}

impl fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password never reaches logs.
        f.debug_struct("ConnectionParams")
            .field("endpoints", &self.endpoints)
            .field("target", &self.target)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl ConnectionParams {
    /// Reads the parameters out of a libpq-style URL or key/value string.
    pub fn from_url(url: &str) -> Result<Self, SourceError> {
        let parsed = parse_url(url)?;
        let config = &parsed.config;
        let user = config
            .get_user()
            .ok_or(SourceConfigError::NoUser)?
            .to_owned();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(ConnectionParams {
            endpoints: endpoints(config),
            target: parsed.target,
            user,
            password,
            database,
            tls: parsed.tls,
            connect_timeout: config.get_connect_timeout().copied(),
        })
    }
}

/// The hosts of a parsed URL with their ports and addresses. tokio-postgres has already checked
/// that the lists line up (one port for all hosts or one each; one `hostaddr` each or none).
fn endpoints(config: &tokio_postgres::Config) -> Vec<Endpoint> {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let addrs = config.get_hostaddrs();
    let count = hosts.len().max(addrs.len()).max(1);
    let ports = config.get_ports();
    (0..count)
        .map(|i| {
            let hostaddr = addrs.get(i).copied();
            let host = hosts.get(i).cloned().unwrap_or_else(|| {
                hostaddr.map_or_else(|| "localhost".to_owned(), |ip| ip.to_string())
            });
            let port = match ports {
                [] => 5432,
                [one] => *one,
                many => many.get(i).copied().unwrap_or(5432),
            };
            Endpoint {
                host,
                hostaddr,
                port,
            }
        })
        .collect()
}

/// `source.url` read: what tokio-postgres understands (with one host or several), and the
/// parameters Siphon reads itself.
pub(crate) struct ParsedUrl {
    /// Everything tokio-postgres understands, with its `ssl_mode` set from `sslmode`.
    pub config: tokio_postgres::Config,
    pub tls: TlsSettings,
    pub target: TargetSession,
}

impl ParsedUrl {
    /// The SQL connection's configuration for one of the URL's hosts.
    pub fn for_endpoint(&self, endpoint: &Endpoint) -> tokio_postgres::Config {
        let base = &self.config;
        let mut config = tokio_postgres::Config::new();
        if endpoint.host.starts_with('/') {
            config.host_path(&endpoint.host);
        } else {
            config.host(&endpoint.host);
        }
        if let Some(ip) = endpoint.hostaddr {
            config.hostaddr(ip);
        }
        config.port(endpoint.port);
        if let Some(user) = base.get_user() {
            config.user(user);
        }
        if let Some(password) = base.get_password() {
            config.password(password);
        }
        if let Some(dbname) = base.get_dbname() {
            config.dbname(dbname);
        }
        if let Some(options) = base.get_options() {
            config.options(options);
        }
        if let Some(name) = base.get_application_name() {
            config.application_name(name);
        }
        if let Some(timeout) = base.get_connect_timeout() {
            config.connect_timeout(*timeout);
        }
        if let Some(timeout) = base.get_tcp_user_timeout() {
            config.tcp_user_timeout(*timeout);
        }
        config
            .ssl_mode(base.get_ssl_mode())
            .ssl_negotiation(base.get_ssl_negotiation())
            .channel_binding(base.get_channel_binding())
            .keepalives(base.get_keepalives())
            .keepalives_idle(base.get_keepalives_idle());
        if let Some(interval) = base.get_keepalives_interval() {
            config.keepalives_interval(interval);
        }
        if let Some(retries) = base.get_keepalives_retries() {
            config.keepalives_retries(retries);
        }
        config
    }
}

/// Parameters Siphon reads itself (tokio-postgres does not know them, or knows only some of
/// their values); they are taken out of the URL before tokio-postgres parses the rest.
const OWN_PARAMS: [&str; 7] = [
    "target_session_attrs",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslnegotiation",
];

/// Splits `source.url` into the tokio-postgres configuration (with its `ssl_mode` set), the TLS
/// settings both connections use and the target session. Errors never contain the password.
pub(crate) fn parse_url(url: &str) -> Result<ParsedUrl, SourceError> {
    let (rest, own) = take_params(url, &OWN_PARAMS).map_err(|syntax| {
        SourceError::from(SourceConfigError::UrlSyntax {
            redacted_url: redact_url(url),
            syntax,
        })
    })?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
        SourceError::from(SourceConfigError::UrlRefused {
            redacted_url: redact_url(url),
            source: e,
        })
    })?;
    let mut target = TargetSession::Any;
    for (key, value) in &own {
        if key == "target_session_attrs" {
            target = TargetSession::parse(value)?;
        }
    }
    let tls = TlsSettings::from_params(&own)?;
    if config.get_channel_binding() == tokio_postgres::config::ChannelBinding::Require {
        return Err(SourceConfigError::ChannelBindingRequired.into());
    }
    config.ssl_mode(tls.mode.for_tokio_postgres());
    Ok(ParsedUrl {
        config,
        tls,
        target,
    })
}

/// Removes the parameters named in `keys` from a URL (`postgres://...?k=v&...`) or a key/value
/// string (`host=... k=v`), returning the rest and the removed parameters (decoded), in order.
/// The error says what is malformed without quoting the input.
fn take_params(url: &str, keys: &[&str]) -> Result<(String, Vec<(String, String)>), UrlSyntax> {
    let mut taken = Vec::new();
    if let Some(query_at) = url_query_start(url) {
        let (base, query) = url.split_at(query_at);
        let mut kept = Vec::new();
        for piece in query[1..].split('&') {
            let Some((raw_key, raw_value)) = piece.split_once('=') else {
                kept.push(piece);
                continue;
            };
            let key = percent_decode(raw_key).ok_or(UrlSyntax::UndecodableName)?;
            if keys.contains(&key.as_str()) {
                let value = percent_decode(raw_value)
                    .ok_or_else(|| UrlSyntax::UndecodableValue { key: key.clone() })?;
                taken.push((key, value));
            } else {
                kept.push(piece);
            }
        }
        let mut rest = base.to_owned();
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
        return Ok((rest, taken));
    }
    if is_url(url) {
        return Ok((url.to_owned(), taken));
    }
    let mut kept = Vec::new();
    for param in key_value_params(url)? {
        if keys.contains(&param.key) {
            taken.push((param.key.to_owned(), param.value));
        } else {
            kept.push(param.raw);
        }
    }
    Ok((kept.join(" "), taken))
}

fn is_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Where the query string of a URL starts (its `?`), read the way tokio-postgres reads it: the
/// credentials run up to the first `@`, and the query starts at the first `?` after them.
fn url_query_start(url: &str) -> Option<usize> {
    let prefix = ["postgres://", "postgresql://"]
        .iter()
        .find(|p| url.starts_with(**p))?
        .len();
    let after_creds = url[prefix..].find('@').map_or(prefix, |at| prefix + at + 1);
    url[after_creds..].find('?').map(|q| after_creds + q)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
        {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
            continue;
        } else {
            out.push(bytes[i]);
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// One `key=value` of a key/value connection string.
struct KeyValue<'a> {
    key: &'a str,
    value: String,
    /// The parameter as written (quotes and escapes kept).
    raw: &'a str,
    /// Byte range of the value as written.
    value_range: std::ops::Range<usize>,
}

/// Reads a key/value connection string as tokio-postgres (and libpq) do: `key = value`, values
/// either single-quoted or up to the next blank, a backslash escaping the next character.
fn key_value_params(text: &str) -> Result<Vec<KeyValue<'_>>, UrlSyntax> {
    let bytes = text.as_bytes();
    let mut params = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && (bytes[i] as char).is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= bytes.len() {
            return Ok(params);
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !(bytes[i] as char).is_ascii_whitespace() {
            i += 1;
        }
        let key = &text[start..i];
        i = skip_ws(i);
        if bytes.get(i) != Some(&b'=') {
            return Err(UrlSyntax::MissingEquals {
                key: key.to_owned(),
            });
        }
        i = skip_ws(i + 1);
        let value_start = i;
        let mut value = Vec::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => {
                        return Err(UrlSyntax::UnterminatedQuote {
                            key: key.to_owned(),
                        })
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        if let Some(&c) = bytes.get(i + 1) {
                            value.push(c);
                        }
                        i += 2;
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while let Some(&c) = bytes.get(i) {
                if (c as char).is_ascii_whitespace() {
                    break;
                }
                if c == b'\\' {
                    if let Some(&c2) = bytes.get(i + 1) {
                        value.push(c2);
                    }
                    i += 2;
                } else {
                    value.push(c);
                    i += 1;
                }
            }
            if value.is_empty() {
                return Err(UrlSyntax::NoValue {
                    key: key.to_owned(),
                });
            }
        }
        let end = i.min(bytes.len());
        params.push(KeyValue {
            key,
            value: String::from_utf8_lossy(&value).into_owned(),
            raw: &text[start..end],
            value_range: value_start..end,
        });
        i = end;
    }
}

/// `source.url` with its secrets (the password in the URL, `password` and `sslpassword`
/// parameters) replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    const SECRET: [&str; 2] = ["password", "sslpassword"];
    if let Some(prefix) = ["postgres://", "postgresql://"]
        .iter()
        .find(|p| url.starts_with(**p))
        .map(|p| p.len())
    {
        let mut out = String::from(&url[..prefix]);
        let mut rest = &url[prefix..];
        if let Some(at) = rest.find('@') {
            let creds = &rest[..at];
            match creds.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(creds),
            }
            out.push('@');
            rest = &rest[at + 1..];
        }
        let Some(q) = rest.find('?') else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..=q]);
        let pieces: Vec<String> = rest[q + 1..]
            .split('&')
            .map(|piece| match piece.split_once('=') {
                Some((k, _))
                    if SECRET.contains(&percent_decode(k).unwrap_or_default().as_str()) =>
                {
                    format!("{k}=***")
                }
                _ => piece.to_owned(),
            })
            .collect();
        out.push_str(&pieces.join("&"));
        return out;
    }
    match key_value_params(url) {
        Ok(params) => {
            let mut out = url.to_owned();
            for p in params.iter().rev() {
                if SECRET.contains(&p.key) {
                    out.replace_range(p.value_range.clone(), "***");
                }
            }
            out
        }
        // Unreadable: show nothing that could be a secret.
        Err(_) => "(unreadable connection string)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_params_come_from_the_url_and_hide_the_password() {
        let p = ConnectionParams::from_url("postgres://alice:s3cret@127.0.0.1:5433/app").unwrap();
        assert_eq!(
            (
                p.endpoints[0].to_string(),
                p.user.as_str(),
                p.database.as_str()
            ),
            ("127.0.0.1:5433".to_owned(), "alice", "app")
        );
        assert_eq!((p.endpoints.len(), p.target), (1, TargetSession::Any));
        assert_eq!(p.password, "s3cret");
        assert!(!format!("{p:?}").contains("s3cret"));
        assert!(ConnectionParams::from_url("postgres://127.0.0.1/app").is_err());
    }

    #[test]
    fn several_hosts_are_tried_in_order_with_their_ports() {
        let listed = |url: &str| {
            let p = ConnectionParams::from_url(url).unwrap();
            (
                p.endpoints
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
                p.target,
            )
        };
        assert_eq!(
            listed("postgres://u:p@db1:5433,db2:5434/app?target_session_attrs=read-write"),
            (
                vec!["db1:5433".to_owned(), "db2:5434".to_owned()],
                TargetSession::ReadWrite
            )
        );
        assert_eq!(
            listed("host=db1,db2 port=6000 user=u dbname=app target_session_attrs=primary"),
            (
                vec!["db1:6000".to_owned(), "db2:6000".to_owned()],
                TargetSession::Primary
            )
        );
        assert_eq!(
            listed("host=a,b hostaddr=10.0.0.1,10.0.0.2 user=u").0,
            vec!["a:5432".to_owned(), "b:5432".to_owned()]
        );
        let p = ConnectionParams::from_url("host=a,b hostaddr=10.0.0.1,10.0.0.2 user=u").unwrap();
        assert_eq!(p.endpoints[1].address(), "10.0.0.2");
        assert_eq!(
            listed("postgres://u@[::1]:5/d").0,
            vec!["[::1]:5".to_owned()]
        );
        // One SQL configuration per host, keeping the rest of the URL.
        let parsed =
            parse_url("postgres://u:p@db1:1,db2:2/app?connect_timeout=3&application_name=x")
                .unwrap();
        let second = parsed.for_endpoint(
            &ConnectionParams::from_url("postgres://u@db2:2/app")
                .unwrap()
                .endpoints[0],
        );
        assert_eq!(second.get_ports(), &[2]);
        assert_eq!(second.get_hosts().len(), 1);
        assert_eq!(second.get_password(), Some(&b"p"[..]));
        assert_eq!(second.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(second.get_application_name(), Some("x"));
    }

    #[test]
    fn a_target_session_that_picks_a_standby_is_refused_with_the_fix() {
        for value in ["read-only", "standby", "prefer-standby"] {
            let err = ConnectionParams::from_url(&format!(
                "postgres://u@a,b/d?target_session_attrs={value}"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("target_session_attrs=read-write"), "{err}");
        }
        let err = ConnectionParams::from_url("postgres://u@a/d?target_session_attrs=bogus")
            .unwrap_err()
            .to_string();
        assert!(err.contains("read-write"), "{err}");
    }

    #[test]
    fn connect_timeout_is_read_for_both_connections() {
        let timeout = |url: &str| ConnectionParams::from_url(url).unwrap().connect_timeout;
        assert_eq!(
            timeout("postgres://u@db/app?connect_timeout=7"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            timeout("host=db user=u connect_timeout=4"),
            Some(Duration::from_secs(4))
        );
        assert_eq!(timeout("postgres://u@db/app"), None);
        // 0 sets no limit (tokio-postgres, like libpq); the replication login then keeps its
        // own 30 s bound rather than waiting forever.
        assert_eq!(timeout("postgres://u@db/app?connect_timeout=0"), None);
    }

    #[test]
    fn tls_parameters_are_read_and_the_rest_goes_to_tokio_postgres() {
        let url = "postgres://alice:s3cret@db.example:5433/app?connect_timeout=5&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20dir%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem&application_name=x";
        let ParsedUrl { config, tls, .. } = parse_url(url).unwrap();
        assert_eq!(tls.mode, crate::SslMode::VerifyFull);
        assert_eq!(
            tls.root_certs,
            crate::RootCerts::File("/etc/ca dir/ca.pem".into())
        );
        assert_eq!(tls.client_cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(tls.client_key.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));

        let ParsedUrl { config, tls, .. } = parse_url(
            "host=127.0.0.1 user=bob password='a b\\'c' sslmode = require sslrootcert='/x y/ca.pem' dbname=app",
        )
        .unwrap();
        assert_eq!(config.get_password(), Some(&b"a b'c"[..]));
        assert_eq!(config.get_dbname(), Some("app"));
        assert!(tls.verifies_chain() && !tls.verifies_host_name());
        assert_eq!(tls.root_certs, crate::RootCerts::File("/x y/ca.pem".into()));

        let ParsedUrl { config, tls, .. } = parse_url("postgres://u@h/d").unwrap();
        assert_eq!(tls.mode, crate::SslMode::Prefer);
        assert_eq!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        let ParsedUrl { config, .. } = parse_url("postgres://u@h/d?sslmode=disable").unwrap();
        assert_eq!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn passwords_never_appear_in_errors_or_redacted_urls() {
        assert_eq!(
            redact_url("postgres://alice:s3cret@host:5432/db?sslmode=require&password=s3cret"),
            "postgres://alice:***@host:5432/db?sslmode=require&password=***"
        );
        assert_eq!(
            redact_url("postgresql://alice@host/db"),
            "postgresql://alice@host/db"
        );
        assert_eq!(
            redact_url("host=h user=u password='s3 cret' sslpassword=s3cret dbname=d"),
            "host=h user=u password=*** sslpassword=*** dbname=d"
        );
        let bad = [
            "postgres://alice:s3cret@host:notaport/db",
            "postgres://alice:s3cret@host/db?sslmode=verify-full",
            "postgres://alice:s3cret@host/db?bogus=1",
            "postgres://alice:s3cret@host/db?sslpassword=s3cret",
            "postgres://alice:s3cret@host/db?channel_binding=require",
            "host=h user=u password=s3cret port=x",
            "host=h user=u password='s3cret",
        ];
        for url in bad {
            let err = ConnectionParams::from_url(url).unwrap_err().to_string();
            assert!(!err.contains("s3cret"), "{url}: {err}");
        }
        let err = ConnectionParams::from_url("postgres://alice:s3cret@host:notaport/db")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("postgres://alice:***@host:notaport/db"),
            "{err}"
        );
    }
}
