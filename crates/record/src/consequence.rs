//! What a failure means for the process: the one vocabulary every error maps into.
//!
//! # Invariants
//! - Each error type of the source, the sink and the router says its consequence through a
//!   `consequence()` method returning [`Consequence`]; the decision to reconnect, stop or report
//!   a bug is taken from it alone, never from an error's text.

/// What a failure means for the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Consequence {
    /// Reconnecting from the confirmed position (after a backoff) can cure it.
    Retry,
    /// The operator must change something (configuration, server, broker, permissions); the
    /// error's message names the fix. Retrying would fail the same way.
    Fix,
    /// Siphon broke one of its own rules: stop, saying so.
    Bug,
}

impl Consequence {
    /// Whether reconnecting may cure the failure.
    pub fn is_retry(self) -> bool {
        self == Consequence::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_retry_is_retried() {
        assert!(Consequence::Retry.is_retry());
        assert!(!Consequence::Fix.is_retry());
        assert!(!Consequence::Bug.is_retry());
    }
}
