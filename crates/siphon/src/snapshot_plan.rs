//! `source.snapshot*`, checked: how the initial snapshot and re-sends read each outbox table.
//!
//! # Invariants
//! - Built once from the configuration; plain values (the session's settings hold one, the
//!   snapshot and the re-sends read it), so nothing here imports either.

use crate::config::{Config, SnapshotMode};
use anyhow::Context;
use siphon_source::row_condition::{ConditionSource, RowCondition};
use siphon_source::TableName;

pub use crate::config::DEFAULT_SNAPSHOT_CHUNK_ROWS as DEFAULT_CHUNK_ROWS;

/// How each outbox table is read by a snapshot or a re-send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlan {
    pub table: TableName,
    /// The condition rows are read with (`None`: every row).
    pub filter: Option<RowCondition>,
    /// Columns read in order before the primary key's (`order_by`).
    pub order_by: Vec<String>,
}

/// `source.snapshot*`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `source.snapshot = "initial"`.
    pub initial: bool,
    pub chunk_rows: usize,
    pub tables: Vec<TablePlan>,
    /// `source.signal_table`: where re-sends are asked for (see [`crate::signal`]).
    pub signal_table: Option<TableName>,
}

impl Plan {
    /// The plan of `config` for the outbox tables `tables`.
    pub fn from_config(config: &Config, tables: &[TableName]) -> anyhow::Result<Plan> {
        let source = &config.source;
        let mut overrides = std::collections::HashMap::new();
        for (name, section) in &source.snapshot_tables {
            let table = TableName::parse(name)
                .with_context(|| format!("[source.snapshot_tables.\"{name}\"]"))?;
            if !tables.contains(&table) {
                anyhow::bail!("[source.snapshot_tables.\"{name}\"] names a table that is not in source.tables; add it there or remove the section");
            }
            overrides.insert(table, section.clone());
        }
        let global = condition(&source.snapshot_filter).context("source.snapshot_filter")?;
        let plans = tables
            .iter()
            .map(|table| {
                let section = overrides.get(table);
                Ok(TablePlan {
                    table: table.clone(),
                    filter: match section.and_then(|s| s.filter.as_deref()) {
                        Some(filter) => condition(filter).with_context(|| {
                            format!("[source.snapshot_tables.\"{table}\"] filter")
                        })?,
                        None => global.clone(),
                    },
                    order_by: section.map(|s| s.order_by.clone()).unwrap_or_default(),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let initial = source.snapshot == SnapshotMode::Initial;
        if initial
            && (config.kafka.state_topic.trim().is_empty()
                || config.kafka.sink == crate::config::SinkKind::Discard)
        {
            anyhow::bail!("source.snapshot = \"initial\" keeps the snapshot's progress in the state topic: set kafka.state_topic (and kafka.sink = \"kafka\")");
        }
        let signal_table = match non_empty(&source.signal_table) {
            Some(name) => Some(TableName::parse(&name).context("source.signal_table")?),
            None => None,
        };
        if signal_table.is_some()
            && (config.kafka.state_topic.trim().is_empty()
                || config.kafka.sink == crate::config::SinkKind::Discard)
        {
            anyhow::bail!("source.signal_table: re-sends keep their progress in the state topic: set kafka.state_topic (and kafka.sink = \"kafka\")");
        }
        Ok(Plan {
            initial,
            chunk_rows: source.snapshot_chunk_rows,
            tables: plans,
            signal_table,
        })
    }
}

/// The operator's condition `text` (`None` when empty), checked as one expression.
fn condition(text: &str) -> anyhow::Result<Option<RowCondition>> {
    match non_empty(text) {
        Some(text) => Ok(Some(RowCondition::parse(&text, ConditionSource::Operator)?)),
        None => Ok(None),
    }
}

fn non_empty(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> anyhow::Result<Config> {
        let text = format!(
            "[source]\nurl = \"postgres://u@h/d\"\ntables = [\"public.outbox\", \"billing.outbox\"]\n{extra}\n[kafka]\nbootstrap_servers = \"k:9092\"\n"
        );
        Config::from_table(text.parse()?)
    }

    fn tables() -> Vec<TableName> {
        ["public.outbox", "billing.outbox"]
            .iter()
            .map(|t| TableName::parse(t).expect("valid name"))
            .collect()
    }

    #[test]
    fn the_default_is_no_snapshot_and_every_row() {
        let plan = Plan::from_config(&config("").expect("valid"), &tables()).expect("a plan");
        assert!(!plan.initial);
        assert_eq!(plan.chunk_rows, DEFAULT_CHUNK_ROWS);
        assert!(plan
            .tables
            .iter()
            .all(|t| t.filter.is_none() && t.order_by.is_empty()));
    }

    #[test]
    fn a_table_s_filter_overrides_the_global_one() {
        let config = config(
            "snapshot = \"initial\"\nsnapshot_filter = \"published_at IS NULL\"\nsnapshot_chunk_rows = 50\n\
             [source.snapshot_tables.\"billing.outbox\"]\nfilter = \"NOT processed\"\norder_by = [\"created_at\"]\n",
        )
        .expect("valid");
        let plan = Plan::from_config(&config, &tables()).expect("a plan");
        assert!(plan.initial);
        assert_eq!(plan.chunk_rows, 50);
        let sql = |i: usize| plan.tables[i].filter.as_ref().map(RowCondition::sql);
        assert_eq!(sql(0), Some("published_at IS NULL"));
        assert_eq!(sql(1), Some("NOT processed"));
        assert_eq!(plan.tables[1].order_by, ["created_at"]);
        // An empty per-table filter reads every row of that table.
        let config = self::config(
            "snapshot_filter = \"published_at IS NULL\"\n[source.snapshot_tables.\"public.outbox\"]\nfilter = \"\"\n",
        )
        .expect("valid");
        let plan = Plan::from_config(&config, &tables()).expect("a plan");
        assert_eq!(plan.tables[0].filter, None);
    }

    #[test]
    fn a_filter_is_one_expression() {
        for (extra, key) in [
            (
                "snapshot_filter = \"true; DROP TABLE outbox\"\n",
                "source.snapshot_filter",
            ),
            (
                "[source.snapshot_tables.\"public.outbox\"]\nfilter = \"x) OR (true\"\n",
                "[source.snapshot_tables.\"public.outbox\"] filter",
            ),
        ] {
            let error = Plan::from_config(&config(extra).expect("parses"), &tables())
                .expect_err("not one expression");
            let message = format!("{error:#}");
            assert!(message.contains(key), "{message}");
            assert!(message.contains("not one SQL expression"), "{message}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        let bad_mode = config("snapshot = \"always\"").expect_err("unknown mode");
        assert!(
            format!("{bad_mode:#}").contains("`initial`"),
            "{bad_mode:#}"
        );
        let unknown = config("[source.snapshot_tables.\"public.outbox\"]\nfiltre = \"x\"\n")
            .expect_err("unknown key");
        assert!(format!("{unknown:#}").contains("filtre"), "{unknown:#}");
        let other =
            config("[source.snapshot_tables.\"public.other\"]\nfilter = \"x\"\n").expect("parses");
        let error = Plan::from_config(&other, &tables()).expect_err("not an outbox table");
        assert!(
            error.to_string().contains("not in source.tables"),
            "{error}"
        );
        let mut no_state = config("snapshot = \"initial\"").expect("parses");
        no_state.kafka.state_topic = String::new();
        let error = Plan::from_config(&no_state, &tables()).expect_err("no state topic");
        assert!(error.to_string().contains("kafka.state_topic"), "{error}");
        // A chunk of no rows is refused with the other ranges (crate::config::ranges).
        assert!(config("snapshot_chunk_rows = 0").is_err());
    }
}
