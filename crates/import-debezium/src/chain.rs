//! The connector's `transforms` chain and `predicates`: where the outbox router sits, and a
//! note for every other transform, saying whether it could have touched the outbox events.
//!
//! # Invariants
//! - Every `transforms.*` and `predicates.*` key is read here (or by [`super::router`] for the
//!   outbox router's own options), so none reaches the leftovers.
//! - A transform other than the outbox router is always a note: it is never carried over.
//! - A predicate is judged against the change-event topics only where the record still has
//!   them: before any transform that may rename topics ([`KEEPS_TOPIC`]).

use std::collections::BTreeSet;

use super::predicate::{router_predicate_note, Predicate};
use super::props::{keyed, Props};

/// One transform of the `transforms` chain.
pub(super) struct Transform {
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) predicate: Option<String>,
    pub(super) negate: bool,
}

/// The `transforms` list, in order, with each transform's type and predicate.
pub(super) fn transform_chain(props: &mut Props) -> Vec<Transform> {
    let Some(list) = props.take("transforms") else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| Transform {
            name: name.to_owned(),
            kind: props
                .take(&format!("transforms.{name}.type"))
                .unwrap_or_default(),
            predicate: props
                .take(&format!("transforms.{name}.predicate"))
                .filter(|p| !p.is_empty()),
            negate: props
                .take(&format!("transforms.{name}.negate"))
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        })
        .collect()
}

/// Notes for the predicates (on the outbox router and on the other transforms) and for every
/// transform other than the outbox router, which Siphon cannot apply.
///
/// `change_topics` are the topics of the outbox tables' change events, if known.
pub(super) fn note_transforms(
    props: &mut Props,
    chain: &[Transform],
    router_index: usize,
    tables: &[String],
    change_topics: Option<&[String]>,
    notes: &mut Vec<String>,
) {
    let router = &chain[router_index];
    let mut predicate_keys = BTreeSet::new();
    props.take("predicates");
    let mut describe_predicate = |name: &str, props: &mut Props| -> Option<Predicate> {
        let prefix = format!("predicates.{name}.");
        for key in props.keys_with_prefix(&prefix) {
            predicate_keys.insert(key);
        }
        let kind = props.take(&format!("{prefix}type"))?;
        let pattern = props.take(&format!("{prefix}pattern"));
        let header = props.take(&format!("{prefix}name"));
        Some(Predicate {
            kind,
            pattern,
            header,
        })
    };

    // The change-event topics are what a predicate sees only until a transform renames topics.
    let topics_at = |index: usize| {
        chain[..index]
            .iter()
            .all(|t| KEEPS_TOPIC.contains(&t.kind.as_str()))
            .then_some(change_topics)
            .flatten()
    };

    if let Some(name) = &router.predicate {
        let negate = if router.negate { " (negated)" } else { "" };
        match describe_predicate(name, props) {
            None => notes.push(format!(
                "The outbox router `{}` has predicate `{name}`, which `predicates.{name}.type` does not define: Debezium would not start. \
                 Siphon applies the router to every table in source.tables",
                router.name
            )),
            Some(p) => notes.push(router_predicate_note(
                &router.name,
                name,
                negate,
                router.negate,
                &p,
                tables,
                topics_at(router_index),
            )),
        }
    }

    for (index, transform) in chain.iter().enumerate() {
        if index == router_index {
            continue;
        }
        let prefix = format!("transforms.{}.", transform.name);
        for key in props.keys_with_prefix(&prefix) {
            props.take(&key);
        }
        let place = if index < router_index {
            "before"
        } else {
            "after"
        };
        let kind = if transform.kind.is_empty() {
            "no type".to_owned()
        } else {
            transform.kind.clone()
        };
        let scope = match &transform.predicate {
            Some(name) => {
                let predicate = describe_predicate(name, props);
                let selects_outbox = predicate.as_ref().and_then(|p| {
                    p.selects_all(topics_at(index))
                        .map(|all| all != transform.negate)
                });
                match selects_outbox {
                    Some(false) => format!(
                        "; its predicate `{name}`{} does not select the outbox tables' records, so it never touched the outbox events and nothing is lost",
                        if transform.negate { " (negated)" } else { "" }
                    ),
                    _ => format!(
                        "; it applied to records selected by predicate `{name}`{}: check whether those include the outbox events",
                        if transform.negate { " (negated)" } else { "" }
                    ),
                }
            }
            None => format!(
                "; it ran {place} the outbox router on every record, so the records Siphon writes differ from Debezium's if it changed outbox events"
            ),
        };
        notes.push(format!(
            "Transform `{}` ({kind}) cannot be carried over: Siphon applies only the outbox router{scope}",
            transform.name
        ));
    }

    for key in props.keys_with_prefix("predicates.") {
        if key != "predicates" && !predicate_keys.contains(&key) {
            let value = props.take(&key).unwrap_or_default();
            notes.push(keyed(
                &key,
                &value,
                "predicate not used by any transform; ignored",
            ));
        }
    }
    for key in predicate_keys {
        props.take(&key);
    }
}

/// Transforms that never change a record's topic (so a predicate after them still sees the
/// connector's change-event topics).
const KEEPS_TOPIC: &[&str] = &[
    "io.debezium.transforms.ExtractNewRecordState",
    "org.apache.kafka.connect.transforms.Filter",
    "org.apache.kafka.connect.transforms.InsertHeader",
    "org.apache.kafka.connect.transforms.DropHeaders",
    "org.apache.kafka.connect.transforms.HeaderFrom$Key",
    "org.apache.kafka.connect.transforms.HeaderFrom$Value",
    "org.apache.kafka.connect.transforms.ReplaceField$Value",
    "org.apache.kafka.connect.transforms.MaskField$Value",
    "org.apache.kafka.connect.transforms.Cast$Value",
];

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with};

    #[test]
    fn a_predicate_that_misses_the_outbox_tables_is_a_warning() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms.outbox.predicate": "p",
               "predicates": "p",
               "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.p.pattern": "other\\..*""#,
        ))
        .unwrap();
        note_with(&import, &["WARNING", "shop.public.outbox", "not selected"]);

        // After a transform that renames topics, the predicate cannot be checked here.
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms": "route,outbox",
               "transforms.route.type": "io.debezium.transforms.ByLogicalTableRouter",
               "transforms.outbox.predicate": "p",
               "predicates": "p",
               "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.p.pattern": "other\\..*""#,
        ))
        .unwrap();
        note_with(
            &import,
            &["predicate `p`", "Check that the predicate selects"],
        );
    }

    #[test]
    fn a_predicate_with_groups_and_classes_is_judged() {
        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "table.include.list": "public.outbox,app.outbox",
               "transforms.outbox.predicate": "p",
               "predicates": "p",
               "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.p.pattern": "shop\\.(public|app)\\.[a-z]+""#,
        ))
        .unwrap();
        note_with(
            &import,
            &[
                "predicate `p`",
                "shop.public.outbox, shop.app.outbox",
                "the same records are routed",
            ],
        );

        let import = import_debezium(&minimal(
            r#", "topic.prefix": "shop",
               "transforms": "unwrap,outbox",
               "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
               "transforms.unwrap.predicate": "notOutbox",
               "predicates": "notOutbox",
               "predicates.notOutbox.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
               "predicates.notOutbox.pattern": "shop\\.[a-z]+\\.(orders|customers){1}""#,
        ))
        .unwrap();
        note_with(&import, &["`unwrap`", "never touched the outbox events"]);
    }
}
