//! Opening the replication session: TCP, the `sslmode` negotiation, the startup message,
//! authentication (cleartext, MD5, SCRAM-SHA-256), simple queries, and `START_REPLICATION`.
//!
//! # Invariants
//! - Opening the session (connect, TLS, authentication) is bounded by the login's timeout.
//! - With `sslmode` `require`, `verify-ca` or `verify-full` nothing but the SSL request is sent
//!   unencrypted; with `prefer` a server that answers "no" gets a plain session.
//! - Bytes the server sent after `CopyBothResponse` stay in the buffer handed to the stream.

use super::error::{AuthMethod, ProtocolViolation, WireError};
use super::frames::{self, Frame, QueryRow};
use super::log_notice;
use super::socket::Socket;
use super::stream::WireStream;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use pgoutput::Lsn;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::{Message, ParameterStatusBody};
use postgres_protocol::message::frontend;
use rustls::pki_types::ServerName;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// TLS as the session uses it.
pub struct Tls {
    pub connector: tokio_rustls::TlsConnector,
    pub server_name: ServerName<'static>,
    /// Whether a server without TLS is refused (`require` and stricter) or used in plain.
    pub required: bool,
}

/// Where and as whom to log in.
pub struct Login<'a> {
    /// The host name (for messages and, without `hostaddr`, to resolve).
    pub host: &'a str,
    pub hostaddr: Option<std::net::IpAddr>,
    pub port: u16,
    pub user: &'a str,
    pub password: &'a str,
    pub database: &'a str,
    pub application_name: &'a str,
    /// `None` for `sslmode=disable`.
    pub tls: Option<Tls>,
    /// The longest opening the session may take.
    pub timeout: Duration,
}

impl Login<'_> {
    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// An authenticated replication session, before streaming.
pub struct Session {
    socket: Socket,
    inbuf: BytesMut,
    out: BytesMut,
    /// The database encoding, as the server reported it at login (`server_encoding`).
    server_encoding: Option<String>,
}

impl Session {
    /// Connects, negotiates TLS and logs in.
    pub async fn connect(login: Login<'_>) -> Result<Self, WireError> {
        let timeout = login.timeout;
        match tokio::time::timeout(timeout, Self::open(&login)).await {
            Ok(opened) => opened,
            Err(_) => Err(WireError::ConnectTimeout {
                address: login.address(),
                seconds: timeout.as_secs(),
            }),
        }
    }

    async fn open(login: &Login<'_>) -> Result<Self, WireError> {
        let connected = match login.hostaddr {
            Some(ip) => TcpStream::connect((ip, login.port)).await,
            None => TcpStream::connect((login.host, login.port)).await,
        };
        let tcp = connected.map_err(|source| WireError::Connect {
            address: login.address(),
            source,
        })?;
        tcp.set_nodelay(true)?;
        let socket = negotiate_tls(tcp, login.tls.as_ref()).await?;
        let mut session = Session {
            socket,
            inbuf: BytesMut::with_capacity(8192),
            out: BytesMut::with_capacity(256),
            server_encoding: None,
        };
        session.log_in(login).await?;
        Ok(session)
    }

    async fn log_in(&mut self, login: &Login<'_>) -> Result<(), WireError> {
        let params = [
            ("user", login.user),
            ("database", login.database),
            ("replication", "database"),
            ("client_encoding", "UTF8"),
            ("application_name", login.application_name),
        ];
        frontend::startup_message(params, &mut self.out)?;
        self.flush().await?;
        let mut scram = None;
        loop {
            let (tag, message) = match self.read_message().await? {
                Frame::Message { tag, message } => (tag, *message),
                // NegotiateProtocolVersion: the server speaks an older minor version; nothing
                // Siphon sends depends on it.
                Frame::Unknown { tag: b'v' } => continue,
                Frame::Unknown { tag } => return Err(unexpected(tag, "while logging in")),
                Frame::CopyData(_) => return Err(unexpected(b'd', "while logging in")),
            };
            match message {
                Message::ErrorResponse(body) => {
                    return Err(WireError::Server(Box::new(frames::server_error(
                        body.fields(),
                    ))))
                }
                Message::NoticeResponse(body) => log_notice(&frames::server_error(body.fields())),
                Message::ParameterStatus(body) => {
                    if let Some(("server_encoding", value)) = parameter_status(&body) {
                        self.server_encoding = Some(value.to_owned());
                    }
                }
                Message::BackendKeyData(_) => {}
                Message::ReadyForQuery(_) => return Ok(()),
                request => self.authenticate(tag, request, login, &mut scram).await?,
            }
        }
    }

    /// Answers one authentication request (`message`, of type `tag`).
    async fn authenticate(
        &mut self,
        tag: u8,
        message: Message,
        login: &Login<'_>,
        scram: &mut Option<ScramSha256>,
    ) -> Result<(), WireError> {
        let unsupported = |method| Err(WireError::UnsupportedAuthentication(method));
        match message {
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(login.password.as_bytes(), &mut self.out)?
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(
                    login.user.as_bytes(),
                    login.password.as_bytes(),
                    body.salt(),
                );
                frontend::password_message(hash.as_bytes(), &mut self.out)?;
            }
            Message::AuthenticationSasl(body) => {
                let mechanisms: Vec<String> = body
                    .mechanisms()
                    .map(|name| Ok(name.to_owned()))
                    .collect()
                    .map_err(|source| ProtocolViolation::Malformed {
                        tag: char::from(tag),
                        source,
                    })?;
                if !mechanisms.iter().any(|m| m == SCRAM_SHA_256) {
                    return unsupported(AuthMethod::SaslMechanisms(mechanisms));
                }
                // Without channel binding: always valid, also when the server offers the
                // -PLUS variant over TLS.
                let client =
                    ScramSha256::new(login.password.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, client.message(), &mut self.out)?;
                *scram = Some(client);
            }
            Message::AuthenticationSaslContinue(body) => {
                let client = scram.as_mut().ok_or(unexpected(tag, "SASL continue"))?;
                client.update(body.data()).map_err(WireError::Scram)?;
                frontend::sasl_response(client.message(), &mut self.out)?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let client = scram.as_mut().ok_or(unexpected(tag, "SASL final"))?;
                client.finish(body.data()).map_err(WireError::Scram)?;
                return Ok(());
            }
            Message::AuthenticationKerberosV5 => return unsupported(AuthMethod::KerberosV5),
            Message::AuthenticationScmCredential => return unsupported(AuthMethod::ScmCredential),
            Message::AuthenticationGss | Message::AuthenticationGssContinue(_) => {
                return unsupported(AuthMethod::Gss)
            }
            Message::AuthenticationSspi => return unsupported(AuthMethod::Sspi),
            _ => return Err(unexpected(tag, "while logging in")),
        }
        self.flush().await
    }

    /// Runs one simple query (SQL or a replication command) and returns its rows.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<QueryRow>, WireError> {
        Ok(self.simple_query_within(sql, usize::MAX).await?.0)
    }

    /// Runs one simple query and keeps its first rows while their values add up to at most
    /// `max_bytes` (the first row always, whatever its size); the rows after are read and
    /// dropped. Returns the rows kept and whether any were dropped. Memory holds the rows kept
    /// and one row more.
    pub async fn simple_query_within(
        &mut self,
        sql: &str,
        max_bytes: usize,
    ) -> Result<(Vec<QueryRow>, bool), WireError> {
        frontend::query(sql, &mut self.out)?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut kept_bytes = 0usize;
        let mut dropped = false;
        let mut failed = None;
        loop {
            let (tag, message) = match self.read_message().await? {
                Frame::Message { tag, message } => (tag, *message),
                Frame::Unknown { tag } => return Err(unexpected(tag, "answering a query")),
                Frame::CopyData(_) => return Err(unexpected(b'd', "answering a query")),
            };
            match message {
                Message::DataRow(body) => {
                    if dropped {
                        continue;
                    }
                    let row = frames::data_row(&body)?;
                    let bytes: usize = row.iter().flatten().map(String::len).sum();
                    if rows.is_empty() || kept_bytes.saturating_add(bytes) <= max_bytes {
                        kept_bytes = kept_bytes.saturating_add(bytes);
                        rows.push(row);
                    } else {
                        dropped = true;
                    }
                }
                Message::ErrorResponse(body) => failed = Some(frames::server_error(body.fields())),
                Message::NoticeResponse(body) => log_notice(&frames::server_error(body.fields())),
                Message::RowDescription(_)
                | Message::CommandComplete(_)
                | Message::EmptyQueryResponse
                | Message::ParameterStatus(_) => {}
                Message::ReadyForQuery(_) => {
                    return match failed {
                        Some(error) => Err(WireError::Server(Box::new(error))),
                        None => Ok((rows, dropped)),
                    }
                }
                _ => return Err(unexpected(tag, "answering a query")),
            }
        }
    }

    /// Sends `START_REPLICATION` (the whole command, `sql`) and, once the server accepted it,
    /// hands the session to a [`WireStream`] reporting `start_lsn` until told otherwise.
    pub async fn start_replication(
        mut self,
        sql: &str,
        start_lsn: Lsn,
        read_ahead_bytes: usize,
        status_interval: Duration,
    ) -> Result<WireStream, WireError> {
        frontend::query(sql, &mut self.out)?;
        self.flush().await?;
        loop {
            let (tag, message) = match self.read_message().await? {
                Frame::Message { tag, message } => (tag, *message),
                // CopyBothResponse, which postgres-protocol does not parse.
                Frame::Unknown { tag: b'W' } => break,
                Frame::Unknown { tag } => return Err(unexpected(tag, "starting replication")),
                Frame::CopyData(_) => return Err(unexpected(b'd', "starting replication")),
            };
            match message {
                Message::ErrorResponse(body) => {
                    return Err(WireError::Server(Box::new(frames::server_error(
                        body.fields(),
                    ))))
                }
                Message::NoticeResponse(body) => log_notice(&frames::server_error(body.fields())),
                Message::ParameterStatus(_) | Message::BackendKeyData(_) => {}
                _ => return Err(unexpected(tag, "starting replication")),
            }
        }
        Ok(WireStream::new(
            self.socket,
            self.inbuf,
            start_lsn,
            read_ahead_bytes,
            status_interval,
        ))
    }

    /// The database encoding the server reported at login (`server_encoding`), if it did.
    pub fn server_encoding(&self) -> Option<&str> {
        self.server_encoding.as_deref()
    }

    async fn read_message(&mut self) -> Result<Frame, WireError> {
        loop {
            if let Some(message) = frames::split(&mut self.inbuf)? {
                return Ok(message);
            }
            let missing = frames::missing(&self.inbuf)?;
            self.inbuf.reserve(missing.max(8192));
            if self.socket.read_buf(&mut self.inbuf).await? == 0 {
                return Err(WireError::Closed);
            }
        }
    }

    async fn flush(&mut self) -> Result<(), WireError> {
        self.socket.write_all(&self.out).await?;
        self.out.clear();
        self.socket.flush().await?;
        Ok(())
    }
}

/// Asks for TLS when `tls` is given and starts it if the server agrees.
async fn negotiate_tls(mut tcp: TcpStream, tls: Option<&Tls>) -> Result<Socket, WireError> {
    let Some(tls) = tls else {
        return Ok(Socket::Plain(tcp));
    };
    let mut request = BytesMut::with_capacity(8);
    frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    let mut answer = [0u8; 1];
    if tcp.read(&mut answer).await? == 0 {
        return Err(WireError::Closed);
    }
    match answer[0] {
        b'S' => {
            let stream = tls
                .connector
                .connect(tls.server_name.clone(), tcp)
                .await
                .map_err(WireError::Tls)?;
            Ok(Socket::Tls(Box::new(stream)))
        }
        b'N' if !tls.required => Ok(Socket::Plain(tcp)),
        b'N' => Err(WireError::TlsUnsupported),
        other => Err(unexpected(other, "answering the SSL request")),
    }
}

/// Whether the server at `address`:`port` answers an SSL request with "no" (it runs with
/// `ssl = off`), asked on a connection of its own within `timeout`. `false` when it says yes or
/// cannot be asked.
pub async fn refuses_tls(address: &str, port: u16, timeout: Duration) -> bool {
    let ask = async {
        let mut tcp = TcpStream::connect((address, port)).await?;
        let mut request = BytesMut::with_capacity(8);
        frontend::ssl_request(&mut request);
        tcp.write_all(&request).await?;
        let mut answer = [0u8; 1];
        let read = tcp.read(&mut answer).await?;
        Ok::<_, std::io::Error>(read == 1 && answer[0] == b'N')
    };
    matches!(tokio::time::timeout(timeout, ask).await, Ok(Ok(true)))
}

/// A ParameterStatus message's parameter name and value (`None` when either is not UTF-8).
fn parameter_status(body: &ParameterStatusBody) -> Option<(&str, &str)> {
    Some((body.name().ok()?, body.value().ok()?))
}

fn unexpected(tag: u8, during: &'static str) -> WireError {
    WireError::Protocol(ProtocolViolation::Unexpected {
        tag: char::from(tag),
        during,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_parameter_status_gives_its_name_and_value() {
        let status = |body: &[u8]| {
            let mut wire = BytesMut::from(&b"S"[..]);
            wire.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            wire.extend_from_slice(body);
            match frames::split(&mut wire) {
                Ok(Some(Frame::Message { message, .. })) => match *message {
                    Message::ParameterStatus(body) => {
                        parameter_status(&body).map(|(n, v)| (n.to_owned(), v.to_owned()))
                    }
                    _ => None,
                },
                _ => None,
            }
        };
        assert_eq!(
            status(b"server_encoding\0LATIN1\0"),
            Some(("server_encoding".to_owned(), "LATIN1".to_owned()))
        );
        assert_eq!(status(b"server_encoding\0\xff\0"), None);
        assert_eq!(status(b"truncated"), None);
    }

    #[tokio::test]
    async fn a_server_without_tls_is_told_from_one_that_has_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            for answer in [b'N', b'S'] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 8];
                socket.read_exact(&mut request).await.unwrap();
                assert_eq!(&request[4..], &[0x04, 0xd2, 0x16, 0x2f], "SSLRequest");
                socket.write_all(&[answer]).await.unwrap();
            }
        });
        let timeout = Duration::from_secs(5);
        assert!(refuses_tls("127.0.0.1", port, timeout).await);
        assert!(!refuses_tls("127.0.0.1", port, timeout).await);
        server.await.unwrap();
        assert!(
            !refuses_tls("127.0.0.1", port, timeout).await,
            "nobody listens"
        );
    }

    #[tokio::test]
    async fn a_server_that_accepts_and_never_answers_fails_the_login_at_its_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts the connection and reads the startup message, answers nothing.
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            while socket.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        let started = Instant::now();
        let login = Login {
            host: "127.0.0.1",
            hostaddr: None,
            port,
            user: "u",
            password: "p",
            database: "d",
            application_name: "siphon",
            tls: None,
            timeout: Duration::from_secs(1),
        };
        let error = Session::connect(login).await.err().expect("no session");
        assert!(
            matches!(error, WireError::ConnectTimeout { seconds: 1, .. }),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        server.abort();
    }
}
