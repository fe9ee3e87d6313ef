//! Topic names: the `route.topic.replacement` template and Kafka's topic name rules.
//!
//! Debezium routes with Kafka Connect's `RegexRouter`, using `route.topic.regex` (default
//! `(?<routedByValue>.*)`) and `route.topic.replacement` as a `java.util.regex` replacement
//! string. With the default regex, `${routedByValue}`, `$1` and `$0` all stand for the whole
//! routing value, `\x` is a literal `x`, and any other `$` reference is an error.
//! [`TopicTemplate`] parses the replacement once with those rules, so routing a row with the
//! default regex is a plain concatenation; [`TopicRouter`] runs any other regex.
//!
//! # Invariants
//! - A parsed template renders without failing; only the resulting name may be illegal,
//!   which [`check_topic_name`] reports.

pub use crate::routing::error::JavaRegexError;
use crate::routing::error::{ReplacementError, RouterConfigError};
use regex::Regex;

/// The default `route.topic.regex`, which matches any value whole.
pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";

/// The group name Debezium's default `route.topic.regex` defines.
pub const ROUTED_BY_VALUE: &str = "routedByValue";

/// Kafka's longest legal topic name.
pub const MAX_TOPIC_LEN: usize = 249;

/// The characters Java's `.` does not match (without the DOTALL flag).
const JAVA_LINE_TERMINATORS: [char; 5] = ['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'];

/// Whether `text` holds one of [`JAVA_LINE_TERMINATORS`].
fn has_java_line_terminator(text: &str) -> bool {
    // Their UTF-8 starts with 0x0A, 0x0D, 0xC2 (U+0085) or 0xE2 (U+2028, U+2029): a byte scan
    // rules most values out without decoding characters.
    text.bytes()
        .any(|b| matches!(b, b'\n' | b'\r' | 0xC2 | 0xE2))
        && text.contains(JAVA_LINE_TERMINATORS)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Group(usize),
}

/// A parsed `route.topic.replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
    literal_len: usize,
}

impl TopicTemplate {
    /// Parses a replacement string with `java.util.regex.Matcher` rules for Debezium's default
    /// regex, whose only group is `routedByValue` (group 1) and always matches the whole value.
    ///
    /// Returns the reason when the string is not valid.
    pub fn parse(replacement: &str) -> Result<Self, ReplacementError> {
        Self::parse_for(replacement, 1, &[(ROUTED_BY_VALUE.to_owned(), 1)])
    }

    /// Parses a replacement string with `java.util.regex.Matcher` rules for a regex with
    /// `group_count` groups, of which `names` are named.
    pub fn parse_for(
        replacement: &str,
        group_count: usize,
        names: &[(String, usize)],
    ) -> Result<Self, ReplacementError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = replacement.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(escaped) => literal.push(escaped),
                    None => return Err(ReplacementError::LoneBackslash),
                },
                '$' => {
                    let group = match chars.next() {
                        Some('{') => {
                            let mut name = String::new();
                            loop {
                                match chars.next() {
                                    Some('}') => break,
                                    Some(n) if n.is_ascii_alphanumeric() => name.push(n),
                                    _ => return Err(ReplacementError::UnclosedName),
                                }
                            }
                            match names.iter().find(|(n, _)| *n == name) {
                                Some((_, index)) => *index,
                                None => {
                                    return Err(ReplacementError::UnknownName {
                                        name,
                                        known: names.iter().map(|(n, _)| n.clone()).collect(),
                                    });
                                }
                            }
                        }
                        Some(d) if d.is_ascii_digit() => {
                            // Java reads further digits only while the number stays a group.
                            let mut group = d.to_digit(10).unwrap_or(0) as usize;
                            if group > group_count {
                                return Err(ReplacementError::NoSuchGroup { group, group_count });
                            }
                            while let Some(next) = chars.peek().and_then(|n| n.to_digit(10)) {
                                let extended = group * 10 + next as usize;
                                if extended > group_count {
                                    break;
                                }
                                group = extended;
                                chars.next();
                            }
                            group
                        }
                        _ => return Err(ReplacementError::NoGroupReference),
                    };
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Group(group));
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
                Part::Group(_) => 0,
            })
            .sum();
        Ok(TopicTemplate { parts, literal_len })
    }

    /// `prefix` followed by the routing value.
    pub fn prefixed(prefix: &str) -> Self {
        TopicTemplate {
            parts: vec![Part::Literal(prefix.to_owned()), Part::Group(1)],
            literal_len: prefix.len(),
        }
    }

    /// The topic for a routing value with Debezium's default regex, where every group is the
    /// whole value.
    ///
    /// Like `RegexRouter`, a value containing a line terminator (which `.` does not match in
    /// Java) is not substituted: the topic is then the value itself.
    pub fn render(&self, routed_value: &str) -> String {
        if has_java_line_terminator(routed_value) {
            return routed_value.to_owned();
        }
        self.render_with(|_| Some(routed_value))
    }

    fn render_with<'a>(&self, group: impl Fn(usize) -> Option<&'a str>) -> String {
        let mut topic = String::with_capacity(self.literal_len + 16);
        for part in &self.parts {
            match part {
                Part::Literal(s) => topic.push_str(s),
                // Java appends nothing for a group that took no part in the match.
                Part::Group(g) => topic.push_str(group(*g).unwrap_or("")),
            }
        }
        topic
    }
}

/// `route.topic.regex` and `route.topic.replacement`, as Kafka Connect's `RegexRouter` applies
/// them: when the regex matches the whole routing value (`Matcher.matches()`), the topic is the
/// replacement with its group references filled in; otherwise the topic is the routing value
/// itself.
#[derive(Debug, Clone)]
pub struct TopicRouter {
    /// `None` for Debezium's default regex, which needs no regex engine.
    regex: Option<Regex>,
    template: TopicTemplate,
}

impl Default for TopicRouter {
    fn default() -> Self {
        TopicRouter {
            regex: None,
            template: TopicTemplate::prefixed("outbox.event."),
        }
    }
}

impl TopicRouter {
    /// Compiles a Java regex and its replacement.
    ///
    /// # Errors
    /// [`RouterConfigError::InvalidTopicRegex`] when the regex cannot be compiled (lookaround and
    /// backreferences are not supported), [`RouterConfigError::InvalidTopicReplacement`] when the
    /// replacement refers to a group the regex lacks or is malformed.
    pub fn new(regex: &str, replacement: &str) -> Result<Self, RouterConfigError> {
        let bad_replacement =
            |reason: ReplacementError| RouterConfigError::InvalidTopicReplacement {
                value: replacement.to_owned(),
                reason,
            };
        if regex == DEFAULT_TOPIC_REGEX {
            let template = TopicTemplate::parse(replacement).map_err(bad_replacement)?;
            return Ok(TopicRouter {
                regex: None,
                template,
            });
        }
        let compiled = java_regex(regex).map_err(|e| RouterConfigError::InvalidTopicRegex {
            value: regex.to_owned(),
            reason: e,
        })?;
        let group_count = compiled.captures_len() - 1;
        let names: Vec<(String, usize)> = compiled
            .capture_names()
            .enumerate()
            .filter_map(|(i, n)| n.map(|n| (n.to_owned(), i)))
            .collect();
        let template =
            TopicTemplate::parse_for(replacement, group_count, &names).map_err(bad_replacement)?;
        Ok(TopicRouter {
            regex: Some(compiled),
            template,
        })
    }

    /// The topic for a routing value (not yet checked against Kafka's rules).
    pub fn route(&self, routed_value: &str) -> String {
        match &self.regex {
            None => self.template.render(routed_value),
            Some(regex) => match regex.captures(routed_value) {
                Some(caps) => self
                    .template
                    .render_with(|g| caps.get(g).map(|m| m.as_str())),
                None => routed_value.to_owned(),
            },
        }
    }
}

/// Compiles a Java regular expression (`java.util.regex.Pattern` syntax) into a [`Regex`] that
/// matches only whole texts, as Java's `Pattern.matches` and `Matcher.matches()` do.
///
/// `(?<name>...)` groups and Java's `.` (which excludes all of Java's line terminators) are
/// translated; everything else is taken as the `regex` crate reads it, which for the ASCII
/// texts of topic names agrees with Java.
///
/// # Errors
/// [`JavaRegexError`] when the pattern uses what the `regex` crate lacks (lookaround,
/// backreferences, atomic groups, possessive quantifiers, `\Q...\E` quoting, ...) or is not a
/// well-formed pattern on its own, e.g. `a)|(b`, which would otherwise change meaning inside
/// the anchoring group.
pub fn java_regex(pattern: &str) -> Result<Regex, JavaRegexError> {
    let translated = translate_java_regex(pattern)?;
    // Checked alone first: wrapped, an unbalanced `)` could close the anchoring group.
    Regex::new(&translated)?;
    Ok(Regex::new(&format!(r"\A(?:{translated})\z"))?)
}

/// Java regex syntax to the `regex` crate's: `(?<name>` becomes `(?P<name>`, and `.` outside
/// character classes excludes all of Java's line terminators, not only `\n`. Possessive
/// quantifiers, which the `regex` crate would misread, are refused.
fn translate_java_regex(java: &str) -> Result<String, JavaRegexError> {
    let mut out = String::with_capacity(java.len() + 16);
    let mut chars = java.chars().peekable();
    let mut class_depth = 0usize;
    // What the last token read was, outside character classes: a quantifier (so a `+` now makes
    // it possessive), an unescaped `(` (so a `?` now opens a group), or inside `{n,m}`.
    let mut after_quantifier = false;
    let mut after_open = false;
    let mut counted = false;
    while let Some(c) = chars.next() {
        let outside = class_depth == 0;
        if outside && c == '+' && after_quantifier {
            return Err(JavaRegexError::Possessive);
        }
        // `??` and `*?` are lazy quantifiers, not a quantifier of a quantifier.
        after_quantifier = outside
            && match c {
                '*' | '+' => true,
                '?' => !after_quantifier && !after_open,
                '}' => std::mem::take(&mut counted),
                _ => false,
            };
        after_open = outside && c == '(';
        if outside && c == '{' {
            counted = true;
        }
        match c {
            '\\' => {
                out.push(c);
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '[' => {
                class_depth += 1;
                out.push(c);
                // A `]` right after `[` or `[^` is a literal.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            ']' if class_depth > 0 => {
                class_depth -= 1;
                out.push(c);
            }
            '.' if class_depth == 0 => out.push_str("[^\\n\\r\\x{85}\\x{2028}\\x{2029}]"),
            '(' if class_depth == 0 => {
                out.push(c);
                let mut look = chars.clone();
                if look.next() == Some('?')
                    && look.next() == Some('<')
                    && look.next().is_some_and(|n| n.is_ascii_alphabetic())
                {
                    chars.next();
                    chars.next();
                    out.push_str("?P<");
                }
            }
            _ => out.push(c),
        }
    }
    Ok(out)
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

    #[test]
    fn regex_errors_show_their_last_line() {
        let Err(error) = java_regex("(a") else {
            panic!("an unclosed group compiles");
        };
        let last = error
            .to_string()
            .lines()
            .last()
            .map(|l| l.trim().to_owned());
        let message = RouterConfigError::InvalidTopicRegex {
            value: "(a".to_owned(),
            reason: error,
        }
        .to_string();
        assert_eq!(
            message,
            format!("outbox router option route.topic.regex has the value \"(a\", which is not a supported regular expression: {}; Java syntax is accepted except lookaround, backreferences and possessive quantifiers", last.unwrap_or_default())
        );
    }

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

    fn java_matches(pattern: &str, text: &str) -> bool {
        match java_regex(pattern) {
            Ok(regex) => regex.is_match(text),
            Err(e) => panic!("{pattern}: {e}"),
        }
    }

    #[test]
    fn java_regex_matches_whole_texts_only() {
        assert!(java_matches(r"shop\.public\.outbox", "shop.public.outbox"));
        assert!(!java_matches(
            r"shop\.public\.outbox",
            "shop.public.outbox2"
        ));
        assert!(!java_matches(r"public\.outbox", "shop.public.outbox"));
        assert!(java_matches("^shop\\..+$", "shop.x"));
        // Every alternative must match the whole text, the first one included.
        assert!(java_matches("a|ab", "ab"));
        assert!(!java_matches("a|shop", "shopx"));
    }

    #[test]
    fn java_regex_takes_groups_classes_and_counted_repetition() {
        assert!(java_matches(r"(shop)\..*", "shop.x"));
        assert!(java_matches(
            r"(?<prefix>shop)\.(public|app)\.outbox",
            "shop.app.outbox"
        ));
        assert!(!java_matches(
            r"(?<prefix>shop)\.(public|app)\.outbox",
            "shop.other.outbox"
        ));
        assert!(java_matches("[a-z]+", "shop"));
        assert!(!java_matches("[a-z]+", "Shop"));
        assert!(java_matches("[^.]+\\.[^.]+", "a.b"));
        assert!(java_matches("[]a]+", "]a]"));
        assert!(java_matches(r"\w+\.outbox_\d{2,3}", "shop.outbox_12"));
        assert!(!java_matches(r"\w+\.outbox_\d{2,3}", "shop.outbox_1234"));
        assert!(java_matches("(?i)SHOP\\..*", "shop.x"));
        // Lazy quantifiers and literal plus signs are not possessive ones.
        assert!(java_matches("a+?b*?c??", "aab"));
        assert!(java_matches(r"a\++", "a++"));
        assert!(java_matches("[*+]+", "*+"));
        assert!(java_matches("(?:a)+", "aa"));
    }

    #[test]
    fn line_terminators_are_found_among_look_alikes() {
        for terminator in JAVA_LINE_TERMINATORS {
            assert!(has_java_line_terminator(&format!("Order{terminator}")));
            assert!(has_java_line_terminator(&format!("{terminator}é")));
        }
        // Same lead bytes, other characters: U+0080, U+00E9, U+2027, U+202A, U+20AC.
        for other in [
            "Order",
            "",
            "\u{80}",
            "é\u{a0}",
            "\u{2027}\u{202a}€",
            "\t\u{b}\u{c}",
        ] {
            assert!(!has_java_line_terminator(other), "{other:?}");
        }
    }

    #[test]
    fn java_dot_excludes_java_line_terminators() {
        assert!(java_matches("a.b", "a-b"));
        for terminator in JAVA_LINE_TERMINATORS {
            assert!(!java_matches("a.b", &format!("a{terminator}b")));
        }
        assert!(java_matches("a[.]b", "a.b"));
    }

    #[test]
    fn java_regex_refuses_what_it_cannot_match_as_java_does() {
        for unsupported in [
            "(?=shop)shop", // lookahead
            "(a)\\1",       // backreference
            "(?>a*)a",      // atomic group
            r"\Qa.b\E",     // quoting
            "a)|(b",        // unbalanced: must not escape the anchoring group
            "a\\",          // trailing backslash
            "a*+a",         // possessive: never matches in Java
            "a++",          // possessive
            "a?+",          // possessive
            "a{1,2}+",      // possessive
            r"\*?+",        // possessive, of an escaped character
        ] {
            assert!(
                java_regex(unsupported).is_err(),
                "{unsupported} was accepted"
            );
        }
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
