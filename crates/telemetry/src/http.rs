//! The HTTP endpoint: `/metrics` for Prometheus, `/health` (liveness) and `/ready` (readiness)
//! for orchestrators such as Kubernetes.
//!
//! # Invariants
//! - Only `GET` and `HEAD` are answered (else 405); unknown paths are 404.
//! - At most [`MAX_CONNECTIONS`] connections are served at once (more are closed at once), a
//!   client has [`HEADER_TIMEOUT`] to send its request headers, and a connection is closed
//!   after [`MAX_CONNECTION_AGE`]: a misbehaving client cannot hold resources indefinitely.
//! - On shutdown the listener is closed first, then open connections finish their current
//!   request (bounded by [`SHUTDOWN_GRACE`]).

use super::{Health, Metrics};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// Time a client has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection (keep-alive included) is closed after this long.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// How long open connections may take to finish once shutdown is requested.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed `accept` (for example, out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const TEXT: &str = "text/plain; charset=utf-8";

/// Binds the endpoint's listener to `listen` (`host:port`, e.g. `127.0.0.1:9187`); the error
/// names the address.
pub async fn bind(listen: &str) -> io::Result<TcpListener> {
    TcpListener::bind(listen).await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {listen} for metrics and health checks: {e}"),
        )
    })
}

/// Serves `/metrics`, `/health` and `/ready` on `listener` until `shutdown` becomes `true` (or
/// its sender is dropped). Failed `accept`s are logged and retried, never fatal.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /health and /ready");
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop_requested(&mut shutdown) => break,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            debug!("metrics endpoint: too many connections; closing a new one");
            continue;
        };
        let (metrics, health, shutdown) =
            (Arc::clone(&metrics), Arc::clone(&health), shutdown.clone());
        connections.spawn(async move {
            serve_connection(stream, metrics, health, shutdown).await;
            drop(permit);
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
    Ok(())
}

/// Resolves once shutdown is requested or can no longer be (sender dropped).
async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

async fn serve_connection(
    stream: TcpStream,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let response = respond(request.method(), request.uri().path(), &metrics, &health);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stop_requested(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        _ = tokio::time::sleep(MAX_CONNECTION_AGE) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(error = %e, "metrics endpoint: connection ended with an error");
    }
}

/// The response to `method path`.
fn respond(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    health: &Health,
) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let mut response = text(StatusCode::OK, metrics.encode());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
            response
        }
        "/health" => text(StatusCode::OK, "ok\n".into()),
        "/ready" => match health.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Server {
        addr: std::net::SocketAddr,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<io::Result<()>>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    }

    async fn start() -> Server {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let health = metrics.health();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(serve(
            listener,
            Arc::clone(&metrics),
            Arc::clone(&health),
            stop_rx,
        ));
        Server {
            addr,
            stop,
            task,
            metrics,
            health,
        }
    }

    /// Sends one request over a fresh connection; returns (status, headers, body).
    async fn request(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
    ) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
            .await
            .unwrap()
            .unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let s = start().await;
        s.metrics.event_read();

        let (status, head, body) = request(s.addr, "GET", "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(body.contains("\nsiphon_events_read_total 1\n"), "{body}");
        assert!(body.contains("siphon_up 1\n"));

        assert_eq!(request(s.addr, "GET", "/health").await.0, 200);
        assert_eq!(request(s.addr, "GET", "/health").await.2, "ok\n");

        let (status, _, body) = request(s.addr, "GET", "/ready").await;
        assert_eq!(status, 503);
        assert_eq!(
            body,
            "not ready: not streaming from PostgreSQL; Kafka broker not reachable\n"
        );
        s.health.set_streaming(true);
        let (status, _, body) = request(s.addr, "GET", "/ready").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: Kafka broker not reachable\n")
        );
        s.health.set_broker_reachable(true);
        let (status, _, body) = request(s.addr, "GET", "/ready").await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
        // /metrics reports the same flags.
        let (_, _, body) = request(s.addr, "GET", "/metrics").await;
        assert!(body.contains("\nsiphon_streaming 1\n"));
        assert!(body.contains("\nsiphon_broker_reachable 1\n"));
        s.health.set_broker_reachable(false);
        assert_eq!(request(s.addr, "GET", "/ready").await.0, 503);

        s.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), s.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn rejects_other_paths_and_methods() {
        let s = start().await;
        assert_eq!(request(s.addr, "GET", "/").await.0, 404);
        assert_eq!(request(s.addr, "GET", "/metrics/extra").await.0, 404);
        let (status, head, _) = request(s.addr, "POST", "/metrics").await;
        assert_eq!(status, 405);
        assert!(head.contains("allow: get, head"), "{head}");
        assert_eq!(request(s.addr, "DELETE", "/health").await.0, 405);
        // A query string does not change the route.
        assert_eq!(request(s.addr, "GET", "/health?verbose=1").await.0, 200);
        // HEAD: the status and headers of GET, no body.
        let (status, head, body) = request(s.addr, "HEAD", "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert_eq!(body, "");
        drop(s.stop);
        // Dropping the sender stops the server too.
        tokio::time::timeout(Duration::from_secs(5), s.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn shutdown_closes_idle_keep_alive_connections() {
        let s = start().await;
        let mut idle = TcpStream::connect(s.addr).await.unwrap();
        idle.write_all(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        s.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), s.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // The kept-alive connection was closed by the server.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        assert!(TcpStream::connect(s.addr).await.is_err(), "listener closed");
    }

    #[tokio::test]
    async fn bind_error_names_the_address() {
        let taken = bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = bind(&addr).await.unwrap_err();
        assert!(err.to_string().contains(&addr), "{err}");
    }
}
