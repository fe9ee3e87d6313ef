//! Kafka Connect predicates, and whether one selects the outbox tables' change events: a
//! `TopicNameMatches` pattern is matched against their topics as Java matches it.
//!
//! # Invariants
//! - A predicate is judged only when that is certain: a `TopicNameMatches` pattern that
//!   matches all or none of the known change-event topics. Anything else (another predicate
//!   type, unknown topics, a pattern that cannot be matched here) is `None`, and the note asks
//!   the user to check rather than guessing.
//! - Patterns are read by the router's translation of Java regular expressions
//!   ([`siphon_router::java_regex`]), the same one `route.topic.regex` uses; a pattern it
//!   refuses is never approximated.

use siphon_router::{check_topic_name, java_regex};

const TOPIC_NAME_MATCHES: &str = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches";

/// A Kafka Connect predicate: its type and the options the notes use.
pub(super) struct Predicate {
    pub(super) kind: String,
    pub(super) pattern: Option<String>,
    pub(super) header: Option<String>,
}

impl Predicate {
    /// Whether the predicate (not negated) holds for the change-event records of every table
    /// (`Some(true)`), of none (`Some(false)`), or cannot be decided here (`None`).
    pub(super) fn selects_all(&self, change_topics: Option<&[String]>) -> Option<bool> {
        if self.kind != TOPIC_NAME_MATCHES {
            return None;
        }
        let matches = topic_matcher(self.pattern.as_deref()?)?;
        let results: Vec<bool> = change_topics?
            .iter()
            .map(|t| matches(t))
            .collect::<Option<_>>()?;
        if results.iter().all(|m| *m) {
            Some(true)
        } else if results.iter().all(|m| !*m) {
            Some(false)
        } else {
            None
        }
    }
}

/// The note for a predicate on the outbox router: Siphon routes every row of
/// `source.tables`, so whether that is what the predicate selected.
pub(super) fn router_predicate_note(
    router: &str,
    name: &str,
    negate_text: &str,
    negate: bool,
    predicate: &Predicate,
    tables: &[String],
    change_topics: Option<&[String]>,
) -> String {
    let selected = match (
        predicate.kind.as_str(),
        &predicate.pattern,
        &predicate.header,
    ) {
        (TOPIC_NAME_MATCHES, Some(pattern), _) => {
            format!("records whose topic matches `{pattern}`")
        }
        (k, _, Some(header)) if k.ends_with("HasHeaderKey") => {
            format!("records with a header `{header}`")
        }
        (k, _, _) if k.ends_with("RecordIsTombstone") => "tombstones".to_owned(),
        (k, _, _) => format!("records of predicate type {k}"),
    };
    let head = format!(
        "The outbox router `{router}` applied only to {selected} (predicate `{name}`{negate_text}); \
         Siphon applies the router to the tables in source.tables ({}) and to nothing else",
        tables.join(", ")
    );
    let topics = change_topics.map(|t| t.join(", "));
    match (predicate.selects_all(change_topics), topics) {
        (Some(all), Some(topics)) if all != negate => {
            format!("{head}. Their change-event topics ({topics}) are selected: the same records are routed")
        }
        (Some(_), Some(topics)) => format!(
            "{head}. WARNING: their change-event topics ({topics}) are not selected, so Debezium did not route them: check source.tables"
        ),
        _ => format!(
            "{head}. Check that the predicate selects exactly the change events of those tables"
        ),
    }
}

/// A matcher for topic names with `pattern` as Java's `Pattern.matches` reads it, by the
/// router's translation of Java regular expressions; `None` when that translation refuses the
/// pattern (lookaround, backreferences, possessive quantifiers, ...).
///
/// The matcher answers `None` for a text that is not a legal Kafka topic name: only on those
/// ASCII names is it certain that the `regex` crate's Unicode classes (`\w`, `\d`, `(?i)`)
/// agree with Java's ASCII ones.
fn topic_matcher(pattern: &str) -> Option<impl Fn(&str) -> Option<bool>> {
    let regex = java_regex(pattern).ok()?;
    Some(move |topic: &str| {
        check_topic_name(topic)
            .is_ok()
            .then(|| regex.is_match(topic))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pattern` matches all of `text`, as Java's `Pattern.matches`; `None` when that
    /// cannot be decided here.
    fn java_full_match(pattern: &str, text: &str) -> Option<bool> {
        topic_matcher(pattern)?(text)
    }

    #[test]
    fn topic_patterns_match_as_java_matches_them() {
        assert_eq!(
            java_full_match("shop\\.public\\.outbox", "shop.public.outbox"),
            Some(true)
        );
        assert_eq!(
            java_full_match("shop\\.public\\.outbox", "shop.public.outbox2"),
            Some(false)
        );
        assert_eq!(
            java_full_match(".*\\.outbox", "shop.public.outbox"),
            Some(true)
        );
        assert_eq!(java_full_match("^shop\\..+$", "shop.x"), Some(true));
        assert_eq!(java_full_match("a|shop.*", "shop"), Some(true));
        assert_eq!(java_full_match("x.?y", "xy"), Some(true));
        assert_eq!(java_full_match(".*?outbox", "a.outbox"), Some(true));
    }

    #[test]
    fn groups_classes_and_counted_repetition_match_as_java_matches_them() {
        assert_eq!(java_full_match("(shop)\\..*", "shop.x"), Some(true));
        assert_eq!(java_full_match("[a-z]+", "shop"), Some(true));
        assert_eq!(java_full_match("\\w+", "shop"), Some(true));
        assert_eq!(
            java_full_match("shop\\.(public|app)\\.outbox", "shop.app.outbox"),
            Some(true)
        );
        assert_eq!(
            java_full_match("shop\\.(public|app)\\.outbox", "shop.other.outbox"),
            Some(false)
        );
        assert_eq!(java_full_match("[a-z]+", "shop.x"), Some(false));
        assert_eq!(
            java_full_match("[^.]+\\.public\\.outbox_[0-9]{2}", "shop.public.outbox_07"),
            Some(true)
        );
        assert_eq!(
            java_full_match("[^.]+\\.public\\.outbox_[0-9]{2}", "shop.public.outbox_7"),
            Some(false)
        );
        assert_eq!(
            java_full_match("(?<db>shop)\\.\\w+\\.outbox", "shop.public.outbox"),
            Some(true)
        );
    }

    #[test]
    fn patterns_that_cannot_be_matched_as_java_does_are_not_judged() {
        // Lookaround, backreferences and possessive quantifiers: the `regex` crate lacks them.
        assert_eq!(java_full_match("(?!other).*", "shop.x"), None);
        assert_eq!(java_full_match("(shop)\\.\\1", "shop.shop"), None);
        assert_eq!(java_full_match("shop.*+x", "shop.x"), None);
        // Not a Java regular expression at all (Debezium would not start).
        assert_eq!(java_full_match("shop(", "shop"), None);
        // Only Kafka topic names are judged: on them, Unicode classes agree with Java's.
        assert_eq!(java_full_match("\\w+", "caf\u{e9}"), None);
    }
}
