//! An HTTP proxy on 127.0.0.1 in front of a real schema registry that injects faults on
//! demand: answers delayed, error statuses (503, 500, 401…) answered in the registry's place,
//! or connections closed unanswered, as a registry that is down.
//!
//! Every request is recorded (when it came, its method and path, and what the proxy did with
//! it), so a test can count what a client asked during a fault.
//!
//! # Invariants
//!
//! - Only 127.0.0.1 is bound; the proxy's port is fixed for its lifetime.
//! - The fault is read once per request (per connection for [`RegistryFault::Down`]), when
//!   the request arrives: changing it does not touch requests already under way.
//! - A forwarded request reaches the registry with its method, path, headers and body
//!   unchanged; its answer comes back with the registry's status, headers and body.
//! - A request the proxy answers itself never reaches the registry.
//! - The proxy runs on its own thread and Tokio runtime, so it serves while the test's
//!   runtime is blocked. Dropping it stops the listener and every connection.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What the proxy does with the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryFault {
    /// Forward every request at once.
    None,
    /// Forward every request after this delay.
    Delay(Duration),
    /// Answer every request with this HTTP status and a Confluent-style error body.
    Status(u16),
    /// Close every connection without reading or answering it: a registry that is down.
    Down,
}

/// One request the proxy saw.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// When it arrived.
    pub at: Instant,
    /// `GET`, `POST`, …; empty for a connection closed unanswered.
    pub method: String,
    /// The path with its query; empty for a connection closed unanswered.
    pub path: String,
    /// The fault in force when it arrived.
    pub fault: RegistryFault,
}

struct State {
    upstream: SocketAddr,
    fault: Mutex<RegistryFault>,
    seen: Mutex<Vec<SeenRequest>>,
}

impl State {
    fn fault(&self) -> RegistryFault {
        *lock(&self.fault)
    }

    fn record(&self, method: String, path: String, fault: RegistryFault) {
        lock(&self.seen).push(SeenRequest {
            at: Instant::now(),
            method,
            path,
            fault,
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while the lock was held leaves only whole values behind.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The proxy: its port, its fault, what it saw.
pub struct RegistryProxy {
    port: u16,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RegistryProxy {
    /// A proxy on a free port of 127.0.0.1 forwarding to the registry on 127.0.0.1:`upstream`,
    /// with no fault.
    ///
    /// # Errors
    /// When the port cannot be bound or the runtime not started.
    pub fn start(upstream: u16) -> Result<RegistryProxy> {
        let state = Arc::new(State {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream)),
            fault: Mutex::new(RegistryFault::None),
            seen: Mutex::new(Vec::new()),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the registry proxy's runtime")?;
        let port = crate::free_port();
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .with_context(|| format!("binding the registry proxy to 127.0.0.1:{port}"))?;
        listener
            .set_nonblocking(true)
            .context("making the registry proxy's listener non-blocking")?;
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(format!("registry-proxy-{port}"))
            .spawn(move || runtime.block_on(serve(listener, serving, stopped)))
            .context("spawning the registry proxy's thread")?;
        Ok(RegistryProxy {
            port,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`, the URL to give the client instead of the registry's.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sets what the proxy does with the requests that arrive from now on.
    pub fn set(&self, fault: RegistryFault) {
        *lock(&self.state.fault) = fault;
    }

    /// Every request seen so far, in arrival order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        lock(&self.state.seen).clone()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        lock(&self.state.seen).len()
    }
}

impl Drop for RegistryProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // Fails only when the serving loop already ended.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                eprintln!("the registry proxy on port {} panicked", self.port);
            }
        }
    }
}

/// Accepts connections until `stopped`; dropping the runtime afterwards ends them all.
async fn serve(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("the registry proxy cannot listen: {e}");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        if state.fault() == RegistryFault::Down {
            state.record(String::new(), String::new(), RegistryFault::Down);
            drop(stream);
            continue;
        }
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(Arc::clone(&state), request));
            // A client that goes away mid-request (its own timeout) ends the connection.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to one request: the fault's, or the registry's.
async fn answer(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let fault = state.fault();
    let path = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |p| p.as_str().to_owned(),
    );
    state.record(request.method().to_string(), path, fault);
    match fault {
        RegistryFault::Status(status) => return Ok(refusal(status)),
        RegistryFault::Delay(delay) => tokio::time::sleep(delay).await,
        RegistryFault::None | RegistryFault::Down => {}
    }
    Ok(match forward(state.upstream, request).await {
        Ok(response) => response,
        Err(e) => {
            let mut response = refusal(502);
            *response.body_mut() = Full::new(Bytes::from(format!(
                "{{\"error_code\":502,\"message\":\"the test proxy could not reach the registry: {e:#}\"}}"
            )));
            response
        }
    })
}

/// An error answer as Confluent's registry writes it.
fn refusal(status: u16) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = format!(
        "{{\"error_code\":{},\"message\":\"{}\"}}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("error")
    );
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/vnd.schemaregistry.v1+json"),
    );
    response
}

/// `request` sent to the registry on a connection of its own, and its whole answer.
async fn forward(
    upstream: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .context("reading the request")?
        .to_bytes();
    let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(upstream))
        .await
        .context("connecting to the registry timed out")?
        .context("connecting to the registry")?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("the HTTP handshake with the registry")?;
    tokio::spawn(connection);
    let answer = sender
        .send_request(Request::from_parts(parts, Full::new(body)))
        .await
        .context("sending the request to the registry")?;
    let (parts, body) = answer.into_parts();
    let body = body
        .collect()
        .await
        .context("reading the answer")?
        .to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}
