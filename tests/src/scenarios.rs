//! Tests that run several scenarios one after another on servers they share (a cluster, a
//! locked-down broker): one scenario's faults never land in another's timing, and a JVM starts
//! once.
//!
//! # Invariants
//! - Every scenario runs, unless `SIPHON_FAULT_SCENARIOS` (names, comma-separated) is set and
//!   leaves it out; each prints PASS or FAIL with its time, and a failed one's name is kept, so
//!   the test fails naming every failed scenario.

/// Whether the scenario `name` runs: `SIPHON_FAULT_SCENARIOS` is unset or empty, or names it.
pub fn selected(name: &str) -> bool {
    let only = std::env::var("SIPHON_FAULT_SCENARIOS").unwrap_or_default();
    only.trim().is_empty() || only.split(',').any(|n| n.trim() == name)
}

/// Runs the scenario `$name` by awaiting `$run` (a future of `anyhow::Result<()>`) unless
/// [`selected`] leaves it out; prints PASS or FAIL with its time and pushes a failed
/// scenario's name onto `$failures` (a `Vec<&str>`).
#[macro_export]
macro_rules! run_scenario {
    ($failures:expr, $name:ident, $run:expr) => {{
        let name = stringify!($name);
        if $crate::scenarios::selected(name) {
            let started = std::time::Instant::now();
            let outcome: anyhow::Result<()> = $run.await;
            match outcome {
                Ok(()) => eprintln!("PASS {name} ({:?})", started.elapsed()),
                Err(e) => {
                    eprintln!("FAIL {name} ({:?}): {e:#}", started.elapsed());
                    $failures.push(name);
                }
            }
        } else {
            eprintln!("not run (SIPHON_FAULT_SCENARIOS): {name}");
        }
    }};
}
