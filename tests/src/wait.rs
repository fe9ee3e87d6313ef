//! Waiting for eventual conditions (records arriving, a process exiting,
//! a slot advancing) with a clear message when they never hold.
//!
//! # Invariants
//!
//! - The condition is evaluated at least once, even with a zero timeout, and
//!   once more at the deadline before giving up.
//! - On timeout the error names the timeout, the number of attempts and the
//!   last error the condition returned, so the failure says what was last
//!   seen rather than just "timed out".

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

/// Polls `f` every `poll_interval` until it returns `Ok(true)`.
///
/// `Ok(false)` means "not yet". `Err(e)` also means "not yet", and `e` is
/// reported if the deadline passes: return an error that describes the
/// current state (e.g. `bail!("3 of 10 records so far")`) to get a useful
/// failure message.
///
/// ```no_run
/// # async fn demo(bootstrap: &str) -> anyhow::Result<()> {
/// use siphon_tests::{read_topic, wait_until};
/// use std::time::Duration;
/// wait_until(Duration::from_secs(30), Duration::from_millis(200), || async {
///     let n = read_topic(bootstrap, "orders", Duration::from_secs(5))?.len();
///     anyhow::ensure!(n == 10, "{n} of 10 records so far");
///     Ok(true)
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_until<F, Fut>(timeout: Duration, poll_interval: Duration, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    wait_for(timeout, poll_interval, || {
        let fut = f();
        async move { Ok(fut.await?.then_some(())) }
    })
    .await
}

/// Polls `f` every `poll_interval` until it returns `Ok(Some(value))`, and
/// returns that value. `Ok(None)` and `Err(_)` mean "not yet", as for
/// [`wait_until`].
pub async fn wait_for<T, F, Fut>(timeout: Duration, poll_interval: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last_err = match f().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        let now = Instant::now();
        if now >= deadline {
            let base = anyhow!(
                "condition not met within {timeout:?} ({attempts} attempts over {:?})",
                start.elapsed()
            );
            return Err(match last_err {
                Some(e) => e.context(base.to_string()),
                None => base.context("the last attempt returned \"not yet\""),
            });
        }
        tokio::time::sleep(poll_interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn succeeds_once_the_condition_holds() {
        let n = AtomicU32::new(0);
        wait_until(Duration::from_secs(5), Duration::from_millis(1), || async {
            Ok(n.fetch_add(1, Ordering::SeqCst) >= 3)
        })
        .await
        .unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn reports_the_last_error_on_timeout() {
        let err = wait_until(
            Duration::from_millis(30),
            Duration::from_millis(5),
            || async { anyhow::bail!("only 3 of 10 records") },
        )
        .await
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("condition not met within 30ms"), "{msg}");
        assert!(msg.contains("only 3 of 10 records"), "{msg}");
    }

    #[tokio::test]
    async fn wait_for_returns_the_value() {
        let v = wait_for(Duration::from_secs(1), Duration::from_millis(1), || async {
            Ok(Some(42))
        })
        .await
        .unwrap();
        assert_eq!(v, 42);
    }
}
