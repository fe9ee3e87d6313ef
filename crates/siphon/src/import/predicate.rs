//! Kafka Connect predicates, and whether one selects the outbox tables' change events: a
//! `TopicNameMatches` pattern is matched against their topics as Java matches it.
//!
//! # Invariants
//! - A predicate is judged only when that is certain: a `TopicNameMatches` pattern that
//!   matches all or none of the known change-event topics. Anything else (another predicate
//!   type, unknown topics, a pattern that cannot be matched here) is `None`, and the note asks
//!   the user to check rather than guessing.

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
        let pattern = self.pattern.as_deref()?;
        let results: Vec<bool> = change_topics?
            .iter()
            .map(|t| java_full_match(pattern, t))
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

/// Whether `pattern` matches all of `text`, as Java's `Pattern.matches`, for the regular
/// expressions topic patterns usually are: literals, escapes of punctuation, `.`, `^`/`$`
/// anchors at the ends, `*`, `+` and `?` on one character, and `|` at the top level.
/// `None` when the pattern uses anything else (groups, classes, counted repetition, ...).
fn java_full_match(pattern: &str, text: &str) -> Option<bool> {
    #[derive(Clone, Copy)]
    enum Atom {
        Char(char),
        Any,
    }
    #[derive(Clone, Copy)]
    enum Repeat {
        One,
        ZeroOrMore,
        OneOrMore,
        ZeroOrOne,
    }
    fn parse(alternative: &str) -> Option<Vec<(Atom, Repeat)>> {
        let alternative = alternative.strip_prefix('^').unwrap_or(alternative);
        let alternative = match alternative.strip_suffix('$') {
            Some(a) if !a.ends_with('\\') => a,
            _ => alternative,
        };
        let mut items: Vec<(Atom, Repeat)> = Vec::new();
        let mut chars = alternative.chars().peekable();
        while let Some(c) = chars.next() {
            let atom = match c {
                '\\' => match chars.next()? {
                    e if e.is_ascii_punctuation() => Atom::Char(e),
                    _ => return None,
                },
                '.' => Atom::Any,
                '*' | '+' | '?' => {
                    let last = items.last_mut()?;
                    if !matches!(last.1, Repeat::One) {
                        // `*?` and friends: laziness does not change a full match.
                        if c == '?' {
                            continue;
                        }
                        return None;
                    }
                    last.1 = match c {
                        '*' => Repeat::ZeroOrMore,
                        '+' => Repeat::OneOrMore,
                        _ => Repeat::ZeroOrOne,
                    };
                    continue;
                }
                '(' | ')' | '[' | ']' | '{' | '}' | '^' | '$' | '|' => return None,
                other => Atom::Char(other),
            };
            items.push((atom, Repeat::One));
        }
        Some(items)
    }
    fn matches(items: &[(Atom, Repeat)], text: &[char]) -> bool {
        let Some(((atom, repeat), rest)) = items.split_first() else {
            return text.is_empty();
        };
        let one = |c: &char| match atom {
            Atom::Char(a) => a == c,
            Atom::Any => *c != '\n',
        };
        let (min, max) = match repeat {
            Repeat::One => (1, 1),
            Repeat::ZeroOrOne => (0, 1),
            Repeat::ZeroOrMore => (0, usize::MAX),
            Repeat::OneOrMore => (1, usize::MAX),
        };
        let available = text.iter().take_while(|c| one(c)).count().min(max);
        (min..=available).rev().any(|n| matches(rest, &text[n..]))
    }
    let text: Vec<char> = text.chars().collect();
    let mut any = false;
    for alternative in pattern.split('|') {
        if alternative.ends_with('\\') {
            return None;
        }
        any |= matches(&parse(alternative)?, &text);
    }
    Some(any)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(java_full_match("(shop)\\..*", "shop.x"), None);
        assert_eq!(java_full_match("[a-z]+", "shop"), None);
        assert_eq!(java_full_match("\\w+", "shop"), None);
    }
}
