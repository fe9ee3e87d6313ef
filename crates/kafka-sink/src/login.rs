//! Whether the brokers refuse a client's login for good.
//!
//! librdkafka tells a client's context of a refused login (SASL), not the requests: they fail
//! as transport failures or time out, and a producer's records wait for the delivery deadline
//! while it logs in again and again. A refusal that stands is a definite error (wrong
//! credentials, or credentials changed on the brokers). But librdkafka also reports a
//! connection closed during the SASL handshake (a broker going away in a rolling restart) as an
//! authentication failure, and a client reports an error identical to its last one once in
//! 30 s only, so neither one report nor their count tells the two apart. What does: whether the
//! brokers, asked after the refusal, answer, and if they do not, whether a login tried afresh
//! is refused too. Only a client of its own tries afresh: the running client's next refusal
//! may be one it keeps to itself, and a broker that hangs (accepting connections, answering
//! nothing) leaves its requests unanswered without refusing anything.
//!
//! # Invariants
//! - A refusal is definite ([`LoginRefusals::definite`]) once a request asked after it went
//!   unanswered and a fresh login ([`fresh_login`]), tried after that, was refused too, with
//!   nothing since saying otherwise.
//! - Anything that shows a login worked or that the brokers are merely away forgets the refusal:
//!   a request asked after it answered, a fresh login accepted, an acknowledged record, or a
//!   connection failure reported after it (a broker that does not accept connections refuses
//!   no login). A fresh login left unanswered changes nothing.
//! - A fresh login's client carries the connection properties only and lives for one try.
//! - An acknowledged record takes no lock while no refusal is remembered.

use crate::error::is_refused_login;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::debug;

/// How long a fresh login's client waits for metadata before its reported errors are looked at.
const FRESH_LOGIN_STEP: Duration = Duration::from_millis(250);

/// What a login tried by a client of its own came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FreshLogin {
    /// The brokers answered: the login works.
    Accepted,
    /// The brokers refused it, in librdkafka's words.
    Refused(String),
    /// No answer and no refusal: the brokers are away or hang, which says nothing of the
    /// credentials.
    Unanswered,
}

/// The refused logins of one client (or of the clients of one topic).
#[derive(Debug, Default)]
pub(crate) struct LoginRefusals {
    /// Whether `refusal` holds one (read per acknowledged record without the lock).
    any: AtomicBool,
    refusal: Mutex<Option<Refusal>>,
    /// The clients' connection properties, for a fresh login.
    connection: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Refusal {
    /// When the first refusal not forgotten since was reported.
    since: Instant,
    /// librdkafka's words for it.
    reason: String,
    /// Whether a request asked after it went unanswered.
    unanswered: bool,
    /// Whether a fresh login, tried after that, was refused too.
    confirmed: bool,
}

impl LoginRefusals {
    /// The refused logins of clients with the `connection` properties (no producer-only ones).
    pub(crate) fn new(connection: BTreeMap<String, String>) -> Self {
        LoginRefusals {
            connection,
            ..LoginRefusals::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Refusal>> {
        // A poisoned lock only means a panic elsewhere; the value is replaced whole.
        self.refusal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn forget(&self) {
        // Under the lock, so that a refusal recorded meanwhile is never hidden.
        let mut refusal = self.lock();
        *refusal = None;
        self.any.store(false, Ordering::Relaxed);
    }

    /// A login was refused, reported at `now` with librdkafka's `reason`.
    pub(crate) fn refused(&self, now: Instant, reason: &str) {
        let mut refusal = self.lock();
        if refusal.is_none() {
            *refusal = Some(Refusal {
                since: now,
                reason: reason.to_owned(),
                unanswered: false,
                confirmed: false,
            });
        }
        self.any.store(true, Ordering::Relaxed);
    }

    /// A connection failed (the broker does not accept connections, or closed one): the
    /// brokers are away, which says nothing of the credentials.
    pub(crate) fn connection_failed(&self) {
        if self.any.load(Ordering::Relaxed) {
            self.forget();
        }
    }

    /// A record was acknowledged: a login works.
    pub(crate) fn acknowledged(&self) {
        if self.any.load(Ordering::Relaxed) {
            self.forget();
        }
    }

    /// A request asked at `asked` was answered (`answered`) or not, as the brokers' being
    /// unreachable fails it.
    pub(crate) fn asked(&self, asked: Instant, answered: bool) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut refusal = self.lock();
        let Some(r) = refusal.as_mut() else {
            return;
        };
        if asked < r.since {
            // Asked before the refusal: it says nothing of it.
            return;
        }
        if answered {
            *refusal = None;
            self.any.store(false, Ordering::Relaxed);
        } else {
            r.unanswered = true;
        }
    }

    /// Whether a refusal waits for a fresh login to tell (a request asked after it went
    /// unanswered).
    fn awaits_fresh_login(&self) -> bool {
        self.any.load(Ordering::Relaxed)
            && self
                .lock()
                .as_ref()
                .is_some_and(|r| r.unanswered && !r.confirmed)
    }

    /// When a refusal waits for it, tries a fresh login for at most `timeout` (blocking) and
    /// takes its outcome.
    pub(crate) fn confirm(&self, timeout: Duration) {
        if self.awaits_fresh_login() {
            self.tried(fresh_login(&self.connection, timeout));
        }
    }

    /// A fresh login, tried after a request went unanswered, came to `outcome`.
    pub(crate) fn tried(&self, outcome: FreshLogin) {
        let mut refusal = self.lock();
        match outcome {
            FreshLogin::Accepted => {
                *refusal = None;
                self.any.store(false, Ordering::Relaxed);
            }
            FreshLogin::Refused(_) => {
                if let Some(r) = refusal.as_mut().filter(|r| r.unanswered) {
                    r.confirmed = true;
                }
            }
            FreshLogin::Unanswered => {}
        }
    }

    /// The refusal's words, once it is definite (see the module's invariants).
    pub(crate) fn definite(&self) -> Option<String> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.lock()
            .as_ref()
            .filter(|r| r.confirmed)
            .map(|r| r.reason.clone())
    }
}

/// Tries a login with a client of its own, built from the `connection` properties, asking the
/// brokers for metadata for at most `timeout` (blocking).
pub(crate) fn fresh_login(connection: &BTreeMap<String, String>, timeout: Duration) -> FreshLogin {
    let told = Arc::new(Mutex::new(None));
    let mut config = ClientConfig::new();
    for (key, value) in connection {
        config.set(key, value);
    }
    let client: BaseProducer<FreshLoginContext> =
        match config.create_with_context(FreshLoginContext(Arc::clone(&told))) {
            Ok(client) => client,
            Err(error) => {
                // The running clients were built from the same properties.
                debug!(%error, "no client for a fresh login");
                return FreshLogin::Unanswered;
            }
        };
    let refused = || {
        told.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if client
            .client()
            .fetch_metadata(None, left.min(FRESH_LOGIN_STEP))
            .is_ok()
        {
            return FreshLogin::Accepted;
        }
        // Serves the client's queued errors to its context.
        client.poll(Duration::ZERO);
        if let Some(reason) = refused() {
            return FreshLogin::Refused(reason);
        }
        if left <= FRESH_LOGIN_STEP {
            break;
        }
    }
    // Errors still queued are told to the context as the client goes.
    drop(client);
    refused().map_or(FreshLogin::Unanswered, FreshLogin::Refused)
}

/// A fresh login's client's context: keeps the first refusal it is told of.
struct FreshLoginContext(Arc<Mutex<Option<String>>>);

impl ClientContext for FreshLoginContext {
    fn error(&self, error: KafkaError, reason: &str) {
        debug!(%error, reason, "fresh login");
        if is_refused_login(&error) {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert_with(|| reason.to_owned());
        }
    }

    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        debug!(fac, "librdkafka (fresh login): {log_message}");
    }
}

impl ProducerContext for FreshLoginContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    fn refused_afresh() -> FreshLogin {
        FreshLogin::Refused("refused afresh".into())
    }

    #[test]
    fn a_refusal_is_definite_once_unanswered_and_refused_afresh() {
        let logins = LoginRefusals::default();
        let start = Instant::now();
        assert_eq!(logins.definite(), None);
        logins.asked(start, false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None, "unreachable, nothing refused");
        logins.refused(at(start, 100), "refused");
        assert_eq!(logins.definite(), None, "one report alone");
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None, "no request went unanswered yet");
        logins.asked(at(start, 50), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None, "asked before the refusal");
        logins.refused(at(start, 150), "refused again");
        logins.asked(at(start, 200), false);
        assert!(logins.awaits_fresh_login());
        assert_eq!(
            logins.definite(),
            None,
            "unanswered, not yet refused afresh"
        );
        logins.tried(refused_afresh());
        assert!(!logins.awaits_fresh_login());
        assert_eq!(logins.definite().as_deref(), Some("refused"));
    }

    #[test]
    fn a_refusal_then_brokers_that_hang_is_not_definite() {
        let logins = LoginRefusals::default();
        let start = Instant::now();
        logins.refused(start, "handshake cut");
        // Nothing answers, neither the running client nor a fresh one, however long.
        for step in 1..10 {
            logins.asked(at(start, step * 2_000), false);
            logins.tried(FreshLogin::Unanswered);
            assert_eq!(logins.definite(), None);
            assert!(logins.awaits_fresh_login());
        }
        // The brokers answer a fresh login: forgotten.
        logins.tried(FreshLogin::Accepted);
        assert!(!logins.awaits_fresh_login());
        logins.asked(at(start, 30_000), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None);
    }

    #[test]
    fn a_handshake_cut_then_a_login_that_works_is_forgotten() {
        let start = Instant::now();
        // The next request is answered.
        let logins = LoginRefusals::default();
        logins.refused(start, "handshake cut");
        logins.asked(at(start, 10), true);
        logins.asked(at(start, 20), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None);
        // A record is acknowledged.
        let logins = LoginRefusals::default();
        logins.refused(start, "handshake cut");
        logins.acknowledged();
        logins.asked(at(start, 20), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None);
    }

    #[test]
    fn a_handshake_cut_by_a_broker_going_away_is_forgotten() {
        let logins = LoginRefusals::default();
        let start = Instant::now();
        logins.refused(start, "handshake cut");
        // The broker no longer accepts connections: the requests go unanswered.
        logins.connection_failed();
        logins.asked(at(start, 10), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite(), None);
        // It comes back and refuses the login: definite once the brokers do not answer and
        // refuse a fresh login.
        logins.refused(at(start, 5_000), "refused");
        logins.asked(at(start, 5_010), false);
        logins.tried(refused_afresh());
        assert_eq!(logins.definite().as_deref(), Some("refused"));
        // Until a connection fails after all.
        logins.connection_failed();
        assert_eq!(logins.definite(), None);
    }

    #[test]
    fn a_fresh_login_where_nothing_listens_is_unanswered() {
        let port = siphon_tests::free_port();
        let connection =
            BTreeMap::from([("bootstrap.servers".to_owned(), format!("127.0.0.1:{port}"))]);
        let started = Instant::now();
        let outcome = fresh_login(&connection, Duration::from_millis(600));
        assert_eq!(outcome, FreshLogin::Unanswered);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
