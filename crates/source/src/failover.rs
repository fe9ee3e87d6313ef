//! Failover slots (PostgreSQL 17+): what `source.failover = true` needs from the primary.
//!
//! A failover slot is copied to a physical standby that runs with `sync_replication_slots = on`,
//! so after a promotion the new primary has the slot and Siphon resumes from it. The copy is only
//! safe to resume from if the logical stream never runs ahead of the standby: the primary's
//! `synchronized_standby_slots` names the standby's physical slot, and the walsender then holds
//! back every change the standby has not flushed. Without it, Kafka can receive events of
//! transactions the new primary never had.
//!
//! # Invariants
//! - `source.failover = true` on a server older than 17 is refused with the fix, never ignored.
//! - A missing or dangling `synchronized_standby_slots` is reported (at start and by
//!   `siphon status`) with the setting to change; it is a warning, not an error, because a
//!   primary without a standby yet is a legitimate state.

use crate::config::quote_literal;
use crate::SourceError;
use tokio_postgres::Client;

/// The first PostgreSQL version (`server_version_num`) with failover slots.
pub const FAILOVER_SLOTS_VERSION: i32 = 170_000;

/// Refuses `source.failover = true` on a server without failover slots.
pub fn check_version(version: i32) -> Result<(), SourceError> {
    if version >= FAILOVER_SLOTS_VERSION {
        return Ok(());
    }
    Err(crate::error::SetupProblem::FailoverUnsupported { version }.into())
}

/// The primary's `synchronized_standby_slots` and the named slots that are not physical slots
/// on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlots {
    /// The setting as the server shows it (empty when unset).
    pub setting: String,
    /// Named slots that do not exist as physical slots.
    pub missing: Vec<String>,
}

impl StandbySlots {
    /// What is wrong, naming the fix; `None` when the setting guards the stream.
    pub fn problem(&self) -> Option<String> {
        if self.setting.trim().is_empty() {
            return Some(
                "synchronized_standby_slots is empty on the primary: the logical stream can run ahead of the standby, and after a failover Kafka may hold events of transactions the new primary never had; set it to the standby's physical slot (ALTER SYSTEM SET synchronized_standby_slots = '<standby slot>'; SELECT pg_reload_conf()) and run the standby with sync_replication_slots = on".to_owned(),
            );
        }
        if self.setting.trim() == "*" {
            return None;
        }
        if self.missing.is_empty() {
            return None;
        }
        Some(format!(
            "synchronized_standby_slots names {} that the primary does not have as physical slots: the stream waits for them forever; create them (SELECT pg_create_physical_replication_slot('<name>')) or fix the setting",
            self.missing
                .iter()
                .map(|s| quote_literal(s))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Reads `synchronized_standby_slots` and checks the slots it names.
pub async fn standby_slots(client: &Client) -> Result<StandbySlots, SourceError> {
    let row = client
        .query_one(
            "SELECT coalesce(current_setting('synchronized_standby_slots', true), '')",
            &[],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::SynchronizedStandbySlots, e))?;
    let setting: String = row.get(0);
    let named = slot_names(&setting);
    let mut missing = Vec::new();
    if setting.trim() != "*" {
        for name in named {
            let exists: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_replication_slots \
                      WHERE slot_name = $1 AND slot_type = 'physical')",
                    &[&name],
                )
                .await
                .map_err(|e| SourceError::from_sql(crate::error::Query::StandbySlots, e))?
                .get(0);
            if !exists {
                missing.push(name);
            }
        }
    }
    Ok(StandbySlots { setting, missing })
}

/// The slot names of a `synchronized_standby_slots` value (a comma-separated list, names
/// possibly double-quoted).
fn slot_names(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(|name| name.trim().trim_matches('"').to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_before_17_is_refused_with_the_fix() {
        let err = check_version(160_004).unwrap_err().to_string();
        assert!(err.contains("this server is 16.0"), "{err}");
        assert!(err.contains("set source.failover = false"), "{err}");
        assert!(check_version(170_000).is_ok());
        assert!(check_version(180_001).is_ok());
    }

    #[test]
    fn the_standby_slots_setting_is_judged_with_the_fix() {
        let unset = StandbySlots {
            setting: String::new(),
            missing: vec![],
        };
        let problem = unset.problem().expect("a problem");
        assert!(
            problem.contains("ALTER SYSTEM SET synchronized_standby_slots"),
            "{problem}"
        );
        let dangling = StandbySlots {
            setting: "sb1, sb2".into(),
            missing: vec!["sb2".into()],
        };
        let problem = dangling.problem().expect("a problem");
        assert!(problem.contains("'sb2'"), "{problem}");
        let good = StandbySlots {
            setting: "sb1".into(),
            missing: vec![],
        };
        assert_eq!(good.problem(), None);
        assert_eq!(slot_names(r#"sb1, "Sb 2",,"#), vec!["sb1", "Sb 2"]);
    }
}
