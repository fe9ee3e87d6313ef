//! Whether the brokers refuse a client's login for good.
//!
//! librdkafka tells a client's context of a refused login (SASL), not the requests: they fail
//! as transport failures or time out, and a producer's records wait for the delivery deadline
//! while it logs in again and again. A refusal that stands is a definite error (wrong
//! credentials, or credentials changed on the brokers). But librdkafka also reports a
//! connection closed during the SASL handshake (a broker going away in a rolling restart) as an
//! authentication failure, and identical errors are reported once in a while only, so neither
//! one report nor their count tells the two apart. What does: whether the brokers, asked after
//! the refusal, answer.
//!
//! # Invariants
//! - A refusal is definite ([`LoginRefusals::definite`]) once a request asked after it went
//!   unanswered (the brokers unreachable, to this client) with nothing since saying otherwise.
//! - Anything that shows a login worked or that the brokers are merely away forgets the refusal:
//!   a request asked after it answered, an acknowledged record, or a connection failure
//!   reported after it (a broker that does not accept connections refuses no login).
//! - An acknowledged record takes no lock while no refusal is remembered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The refused logins of one client (or of the clients of one topic).
#[derive(Debug, Default)]
pub(crate) struct LoginRefusals {
    /// Whether `refusal` holds one (read per acknowledged record without the lock).
    any: AtomicBool,
    refusal: Mutex<Option<Refusal>>,
}

#[derive(Debug)]
struct Refusal {
    /// When the first refusal not forgotten since was reported.
    since: Instant,
    /// librdkafka's words for it.
    reason: String,
    /// Whether a request asked after it went unanswered.
    unanswered: bool,
}

impl LoginRefusals {
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

    /// The refusal's words, once it is definite (see the module's invariants).
    pub(crate) fn definite(&self) -> Option<String> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.lock()
            .as_ref()
            .filter(|r| r.unanswered)
            .map(|r| r.reason.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_refusal_is_definite_once_a_request_asked_after_it_goes_unanswered() {
        let logins = LoginRefusals::default();
        let start = Instant::now();
        assert_eq!(logins.definite(), None);
        logins.asked(start, false);
        assert_eq!(logins.definite(), None, "unreachable, nothing refused");
        logins.refused(at(start, 100), "refused");
        assert_eq!(logins.definite(), None, "one report alone");
        logins.asked(at(start, 50), false);
        assert_eq!(logins.definite(), None, "asked before the refusal");
        logins.refused(at(start, 150), "refused again");
        logins.asked(at(start, 200), false);
        assert_eq!(logins.definite().as_deref(), Some("refused"));
    }

    #[test]
    fn a_handshake_cut_then_a_login_that_works_is_forgotten() {
        let start = Instant::now();
        // The next request is answered.
        let logins = LoginRefusals::default();
        logins.refused(start, "handshake cut");
        logins.asked(at(start, 10), true);
        logins.asked(at(start, 20), false);
        assert_eq!(logins.definite(), None);
        // A record is acknowledged.
        let logins = LoginRefusals::default();
        logins.refused(start, "handshake cut");
        logins.acknowledged();
        logins.asked(at(start, 20), false);
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
        assert_eq!(logins.definite(), None);
        // It comes back and refuses the login: definite once the brokers do not answer.
        logins.refused(at(start, 5_000), "refused");
        logins.asked(at(start, 5_010), false);
        assert_eq!(logins.definite().as_deref(), Some("refused"));
        // Until a connection fails after all.
        logins.connection_failed();
        assert_eq!(logins.definite(), None);
    }
}
