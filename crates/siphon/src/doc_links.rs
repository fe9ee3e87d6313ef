//! Every relative link in the user documentation resolves: README.md, CONTRIBUTING.md and every
//! markdown file under docs/.
//!
//! A link is `[text](target)`, `![alt](target)` or a reference definition `[label]: target`,
//! outside fenced code blocks and code spans. A target with a scheme (`https:`, `mailto:`) is
//! external and not checked. A relative target names a file or directory that exists, relative
//! to the linking file; a `#anchor` names an ATX heading of the target markdown file (or of the
//! linking file when the path is empty), slugged as GitHub slugs headings.
//!
//! # Invariants
//! - A broken link or anchor fails the test with the file, the line and the target.
//! - Slugs follow GitHub's rule: lowercase; letters, digits, `-` and `_` kept; spaces become
//!   `-`; everything else dropped; a repeated heading gets `-1`, `-2`, ... in order.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The repository root, two levels above this crate.
fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

/// The documents whose links are checked.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// The line with its code spans blanked out (their text cannot hold a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => {
                out.push_str(&" ".repeat(ticks * 2 + end));
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the links on one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(end) = trimmed.find("]: ") {
            let target = trimmed[end + 3..].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
    }
    let mut rest = line.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link in a heading renders as its text.
    while let Some(start) = rest.find('[') {
        text.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(paren)) if close < paren => {
                text.push_str(&after[..close]);
                rest = &after[paren + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown document's ATX headings.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The broken links of one document, as `file:line: target (why)`.
fn broken_links(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let name = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let mut broken = Vec::new();
    for (number, line) in prose_lines(text) {
        for target in link_targets(line) {
            let scheme = target.split_once(':').is_some_and(|(s, _)| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            });
            if scheme || target.is_empty() {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{name}:{number}: {target} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            let target_text = std::fs::read_to_string(&resolved).unwrap();
            if !anchors(&target_text).contains(anchor) {
                broken.push(format!("{name}:{number}: {target} (no such heading)"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let root = root();
    let mut broken = Vec::new();
    for file in documents(&root) {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        broken.extend(broken_links(&root, &file, &text));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn headings_slug_as_github_does() {
    assert_eq!(
        slug("Several outbox tables: `[router.tables.\"schema.table\"]`"),
        "several-outbox-tables-routertablesschematable"
    );
    assert_eq!(
        slug("Under contention (--contention)"),
        "under-contention---contention"
    );
    assert_eq!(slug("Run 21: inside send->ack"), "run-21-inside-send-ack");
    assert_eq!(slug("See [the docs](docs/x.md) now"), "see-the-docs-now");
    let doc = "# A\n## A\n```\n# not a heading\n```\n### A\n";
    let found = anchors(doc);
    assert_eq!(
        found,
        HashSet::from(["a".into(), "a-1".into(), "a-2".into()])
    );
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let root = root();
    let file = root.join("docs/architecture.md");
    let text = "[ok](configuration.md)\n[gone](no-such-file.md)\n\
                [bad anchor](configuration.md#no-such-heading)\n\
                `[code](not-a-link.md)`\n[web](https://example.com/x)\n\
                ```\n[fenced](also-not-a-link.md)\n```\n[self](#no-heading-here)\n";
    let broken = broken_links(&root, &file, text);
    assert_eq!(
        broken,
        vec![
            "docs/architecture.md:2: no-such-file.md (no such file)".to_owned(),
            "docs/architecture.md:3: configuration.md#no-such-heading (no such heading)".to_owned(),
            "docs/architecture.md:9: #no-heading-here (no such heading)".to_owned(),
        ]
    );
}
