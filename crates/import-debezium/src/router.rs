//! `[router]`: the outbox router's options, copied from the connector's `EventRouter`
//! transform, and the connector's logical name (`topic.prefix`, or Debezium 1.x's
//! `database.server.name`), which Siphon needs for Debezium's context headers.
//!
//! # Invariants
//! - The router's options are copied verbatim, never checked or rewritten here: one note lists
//!   them, and `siphon check-config` names any Siphon's router does not support.
//! - `topic.prefix` wins over `database.server.name`; a 1.x name also turns the context headers
//!   off, as Debezium 1.x wrote none.
//! - The change-event topics passed on to judge predicates are only those Debezium's default
//!   naming gives (`<prefix>.<schema>.<table>`); with another naming strategy there are none,
//!   and predicates are not judged.

use super::chain::{self, Transform};
use super::output::{string, Output};
use super::props::{keyed, Props};

/// Fills `[router]` from the outbox router transform (`chain[router_index]`) and the
/// logical name, then notes the rest of the chain and its predicates.
pub(super) fn section(
    props: &mut Props,
    chain: &[Transform],
    router_index: usize,
    tables: &[String],
    out: &mut Output,
    notes: &mut Vec<String>,
) {
    let router = &chain[router_index];
    let prefix = format!("transforms.{}.", router.name);
    let mut copied = Vec::new();
    for key in props.keys_with_prefix(&prefix) {
        let option = key[prefix.len()..].to_owned();
        if matches!(option.as_str(), "type" | "predicate" | "negate") {
            continue; // Kafka Connect's own transform settings, read with the chain.
        }
        if let Some(value) = props.take(&key) {
            out.router.insert(option.clone(), string(value));
            copied.push(option);
        }
    }
    if !copied.is_empty() {
        notes.push(format!(
            "Outbox router options copied verbatim from transform `{}`: {}. `siphon check-config` names any that Siphon's router does not support yet",
            router.name,
            copied.join(", ")
        ));
    }

    // The connector's logical name: Debezium's context headers (3.2 and later) and, with
    // json-schemas, the value schema names. Also what the change-event topics start with.
    let legacy_name = props.take("database.server.name");
    let topic_prefix = props.take("topic.prefix");
    let extended = props.take("extended.headers.enabled");
    match (&topic_prefix, &legacy_name) {
        (Some(prefix), _) => {
            out.router
                .insert("topic.prefix".into(), string(prefix.clone()));
            match &extended {
                Some(e) => {
                    out.router
                        .insert("extended.headers.enabled".into(), string(e.clone()));
                }
                None => notes.push(format!(
                    "router.\"topic.prefix\" = \"{prefix}\": Siphon adds the __debezium.context.* headers Debezium 3.2 and later write. \
                     If the connector ran an older Debezium, set router.\"extended.headers.enabled\" = \"false\" to write the same headers it did"
                )),
            }
            if let Some(legacy) = &legacy_name {
                notes.push(format!(
                    "`database.server.name` = `{legacy}`: replaced by topic.prefix since Debezium 2.0; topic.prefix is used"
                ));
            }
        }
        (None, Some(legacy)) => {
            out.router
                .insert("topic.prefix".into(), string(legacy.clone()));
            out.router
                .insert("extended.headers.enabled".into(), string("false"));
            notes.push(format!(
                "`database.server.name` = `{legacy}` (Debezium 1.x) written as router.\"topic.prefix\", with router.\"extended.headers.enabled\" = \"false\": \
                 Debezium 1.x wrote no __debezium.context.* headers"
            ));
        }
        (None, None) => {
            if let Some(e) = &extended {
                notes.push(keyed(
                    "extended.headers.enabled",
                    e,
                    "the context headers need topic.prefix, which is not set; not carried over",
                ));
            }
        }
    }
    let topic_prefix = topic_prefix.or(legacy_name);
    let naming = props.take("topic.naming.strategy");
    let delimiter = props.take("topic.delimiter").unwrap_or_else(|| ".".into());
    let change_topics: Option<Vec<String>> = match (&topic_prefix, &naming) {
        (Some(prefix), None) => Some(
            tables
                .iter()
                .map(|t| format!("{prefix}{delimiter}{}", t.replacen('.', &delimiter, 1)))
                .collect(),
        ),
        _ => None,
    };
    if let Some(strategy) = &naming {
        notes.push(format!(
            "`topic.naming.strategy` = `{strategy}`: it names Debezium's change-event topics, which the outbox router replaces; not needed by Siphon"
        ));
    }

    chain::note_transforms(
        props,
        chain,
        router_index,
        tables,
        change_topics.as_deref(),
        notes,
    );
}

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with, parse, router};

    #[test]
    fn the_logical_name_carries_over_for_the_context_headers() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop", "extended.headers.enabled": false"#,
        ))
        .unwrap();
        let r = router(&parse(&import));
        assert_eq!(r["topic.prefix"], "shop");
        assert_eq!(r["extended.headers.enabled"], "false");

        let import = import_debezium(&minimal(r#", "database.server.name": "legacy""#)).unwrap();
        let c = parse(&import);
        let r = router(&c);
        assert_eq!(r["topic.prefix"], "legacy");
        assert_eq!(r["extended.headers.enabled"], "false");
        note_with(&import, &["database.server.name", "1.x"]);
    }
}
