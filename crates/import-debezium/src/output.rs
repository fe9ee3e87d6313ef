//! The Siphon configuration being built: one [`Section`] per TOML table, rendered as text
//! with the notes as a leading comment.
//!
//! # Invariants
//! - Every key and value is serialized by the `toml` crate, so the text is valid TOML whatever
//!   the connector configuration contained; a key set twice keeps its last value.
//! - Keys keep the order they were set in (a reader expects `url` first); empty sections are
//!   not written.
//! - Notes become comment lines only: control characters are replaced, so no note can end the
//!   comment and inject TOML.

use std::fmt::Write as _;

use super::POSTGRES_CONNECTOR;

/// One table of the output, keys in the order they were set (a reader expects `url` first).
#[derive(Default)]
pub(super) struct Section(Vec<(String, toml::Value)>);

impl Section {
    pub(super) fn insert(&mut self, key: String, value: toml::Value) {
        self.0.retain(|(k, _)| *k != key);
        self.0.push((key, value));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    pub(super) fn get(&self, key: &str) -> Option<&toml::Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `[header]` and one line per key, each serialized by the `toml` crate so keys and values
    /// are quoted and escaped as TOML requires.
    fn render(&self, header: &str, text: &mut String) {
        if self.is_empty() {
            return;
        }
        let _ = writeln!(text, "\n[{header}]");
        for (key, value) in &self.0 {
            let mut line = toml::Table::new();
            line.insert(key.clone(), value.clone());
            // A one-entry table of a string, integer, boolean or array always serializes.
            text.push_str(&toml::to_string(&line).unwrap_or_default());
        }
    }
}

/// The sections being built.
#[derive(Default)]
pub(super) struct Output {
    pub(super) source: Section,
    pub(super) kafka: Section,
    pub(super) properties: Section,
    pub(super) topic_creation: Section,
    pub(super) router: Section,
    pub(super) format: Section,
    pub(super) schema_registry: Section,
}

impl Output {
    /// The TOML text: a comment naming the origin and listing the notes, then the sections.
    pub(super) fn render(self, name: Option<&str>, notes: &[String]) -> String {
        let mut text = String::new();
        let origin = match name {
            Some(name) => format!("the Debezium connector \"{}\"", comment_text(name)),
            None => "a Debezium connector configuration".to_owned(),
        };
        let _ = writeln!(text, "# Siphon configuration imported from {origin}");
        let _ = writeln!(
            text,
            "# ({POSTGRES_CONNECTOR}) by `siphon import-debezium`."
        );
        let _ = writeln!(
            text,
            "# Check it with `siphon check-config --config FILE` before switching."
        );
        if !notes.is_empty() {
            let _ = writeln!(text, "#\n# Not carried over, and warnings:");
            for note in notes {
                let note = comment_text(note);
                let mut lines = note.lines();
                if let Some(first) = lines.next() {
                    let _ = writeln!(text, "# - {first}");
                }
                for line in lines {
                    let _ = writeln!(text, "#   {line}");
                }
            }
        }
        self.source.render("source", &mut text);
        self.kafka.render("kafka", &mut text);
        self.properties.render("kafka.properties", &mut text);
        self.topic_creation
            .render("kafka.topic_creation", &mut text);
        self.router.render("router", &mut text);
        self.format.render("format", &mut text);
        self.schema_registry.render("schema_registry", &mut text);
        text
    }
}

/// Text safe inside a TOML comment: control characters other than newlines (which the caller
/// splits on) become spaces.
fn comment_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\n' { ' ' } else { c })
        .collect()
}

/// A TOML string value.
pub(super) fn string(value: impl Into<String>) -> toml::Value {
    toml::Value::String(value.into())
}
