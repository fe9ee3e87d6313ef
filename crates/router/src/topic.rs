//! Topic names: the `route.topic.replacement` template and Kafka's topic name rules.
//!
//! Debezium routes with Kafka Connect's `RegexRouter`, using the regex `(?<routedByValue>.*)`
//! and `route.topic.replacement` as a `java.util.regex` replacement string. With that regex,
//! `${routedByValue}`, `$1` and `$0` all stand for the whole routing value, `\x` is a literal
//! `x`, and any other `$` reference is an error. [`TopicTemplate`] parses the replacement once
//! with those rules, so routing a row is a plain concatenation.
//!
//! # Invariants
//! - A parsed template renders without failing; only the resulting name may be illegal,
//!   which [`check_topic_name`] reports.

/// The group name Debezium's default `route.topic.regex` defines.
pub const ROUTED_BY_VALUE: &str = "routedByValue";

/// Kafka's longest legal topic name.
pub const MAX_TOPIC_LEN: usize = 249;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    RoutedValue,
}

/// A parsed `route.topic.replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
    literal_len: usize,
}

impl TopicTemplate {
    /// Parses a replacement string with `java.util.regex.Matcher` rules for a regex whose only
    /// group is `routedByValue` (group 1) and always matches the whole value.
    ///
    /// Returns the reason when the string is not valid.
    pub fn parse(replacement: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = replacement.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(escaped) => literal.push(escaped),
                    None => return Err("it ends with a lone \\".to_owned()),
                },
                '$' => {
                    match chars.next() {
                        Some('{') => {
                            let mut name = String::new();
                            loop {
                                match chars.next() {
                                    Some('}') => break,
                                    Some(n) if n.is_ascii_alphanumeric() => name.push(n),
                                    _ => {
                                        return Err(
                                            "a ${ group reference is not closed by }".to_owned()
                                        )
                                    }
                                }
                            }
                            if name != ROUTED_BY_VALUE {
                                return Err(format!(
                                    "${{{name}}} names no group; the only group is {ROUTED_BY_VALUE}"
                                ));
                            }
                        }
                        Some(d) if d.is_ascii_digit() => {
                            // Java reads further digits only while the number stays a group.
                            let mut group = d.to_digit(10).unwrap_or(0);
                            if group > 1 {
                                return Err(format!(
                                    "${group} names no group; use $1 or ${{{ROUTED_BY_VALUE}}}"
                                ));
                            }
                            while let Some(next) = chars.peek().and_then(|n| n.to_digit(10)) {
                                let extended = group * 10 + next;
                                if extended > 1 {
                                    break;
                                }
                                group = extended;
                                chars.next();
                            }
                        }
                        _ => {
                            return Err(
                                "a $ is not followed by a group reference such as ${routedByValue}"
                                    .to_owned(),
                            )
                        }
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::RoutedValue);
                }
                _ => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let literal_len = parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.len(),
                Part::RoutedValue => 0,
            })
            .sum();
        Ok(TopicTemplate { parts, literal_len })
    }

    /// `prefix` followed by the routing value.
    pub fn prefixed(prefix: &str) -> Self {
        TopicTemplate {
            parts: vec![Part::Literal(prefix.to_owned()), Part::RoutedValue],
            literal_len: prefix.len(),
        }
    }

    /// The topic for a routing value.
    ///
    /// Like `RegexRouter`, a value containing a line terminator (which `.` does not match in
    /// Java) is not substituted: the topic is then the value itself.
    pub fn render(&self, routed_value: &str) -> String {
        if routed_value.contains(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']) {
            return routed_value.to_owned();
        }
        let mut topic = String::with_capacity(self.literal_len + routed_value.len());
        for part in &self.parts {
            match part {
                Part::Literal(s) => topic.push_str(s),
                Part::RoutedValue => topic.push_str(routed_value),
            }
        }
        topic
    }
}

/// Checks a topic name against Kafka's rules (`org.apache.kafka.common.internals.Topic`);
/// returns the broken rule.
pub fn check_topic_name(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        return Err("a topic name cannot be empty");
    }
    if topic == "." || topic == ".." {
        return Err("a topic name cannot be \".\" or \"..\"");
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err("a topic name can have at most 249 characters");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("a topic name may only contain ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, value: &str) -> String {
        match TopicTemplate::parse(template) {
            Ok(t) => t.render(value),
            Err(e) => panic!("{template}: {e}"),
        }
    }

    #[test]
    fn default_replacement_keeps_case() {
        assert_eq!(
            render("outbox.event.${routedByValue}", "Order"),
            "outbox.event.Order"
        );
        assert_eq!(
            render("outbox.event.${routedByValue}", "customers"),
            "outbox.event.customers"
        );
    }

    #[test]
    fn value_only_and_repeated_references() {
        assert_eq!(render("${routedByValue}", "orders"), "orders");
        assert_eq!(render("${routedByValue}.${routedByValue}", "a"), "a.a");
        assert_eq!(render("fixed", "a"), "fixed");
    }

    #[test]
    fn numbered_group_references() {
        assert_eq!(render("x.$1", "a"), "x.a");
        assert_eq!(render("x.$0", "a"), "x.a");
        // Java reads `$10` as group 1 followed by a literal 0.
        assert_eq!(render("x.$10", "a"), "x.a0");
        assert_eq!(render("x.$01", "a"), "x.a");
    }

    #[test]
    fn backslash_escapes() {
        assert_eq!(render(r"a\$b\\c\x", "v"), r"a$b\cx");
    }

    #[test]
    fn invalid_replacements() {
        for bad in [
            "a\\",
            "a$",
            "a$x",
            "${other}",
            "${routedByValue",
            "$2",
            "${}",
            "${a-b}",
        ] {
            assert!(
                TopicTemplate::parse(bad).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn line_terminators_leave_the_value_unrouted() {
        assert_eq!(render("outbox.event.${routedByValue}", "a\nb"), "a\nb");
    }

    #[test]
    fn topic_name_rules() {
        assert!(check_topic_name("outbox.event.Order_1-x").is_ok());
        assert!(check_topic_name("").is_err());
        assert!(check_topic_name(".").is_err());
        assert!(check_topic_name("..").is_err());
        assert!(check_topic_name("a b").is_err());
        assert!(check_topic_name("café").is_err());
        assert!(check_topic_name(&"a".repeat(249)).is_ok());
        assert!(check_topic_name(&"a".repeat(250)).is_err());
    }
}
