//! The run's picture: an SVG of each row's drain rate relative to pg_recvlogical (one group
//! of bars per publication shape) and of the latency distribution (p50, p90, p99, p99.9 per
//! series), written next to result.json. Hand-written SVG text: no plotting dependency.
//!
//! # Invariants
//! - Every text is XML-escaped, so any row name yields a well-formed document.
//! - Bars are scaled to the largest value of their section (at least 1.0 for the ratios, so
//!   pg_recvlogical's line is always inside the plot); a value that is not finite or not
//!   positive draws no bar, only its label.

use std::fmt::Write as _;

/// One bar of a drain group.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    /// Drain rate relative to pg_recvlogical (1.0 = as fast).
    pub ratio: f64,
    pub events_per_sec: f64,
}

/// The drains of one publication shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub title: String,
    pub bars: Vec<Bar>,
}

/// One latency series: its quantiles in milliseconds, named.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// (quantile name, milliseconds), e.g. ("p99", 12.5).
    pub points: Vec<(&'static str, f64)>,
}

/// Everything the picture shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub groups: Vec<Group>,
    pub latency: Vec<Series>,
}

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 330.0;
const PLOT_X: f64 = LABEL_W + 10.0;
const PLOT_W: f64 = 400.0;
const BAR_H: f64 = 18.0;
const ROW_H: f64 = 24.0;
const COLORS: [&str; 4] = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"];

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn bar_width(value: f64, max: f64) -> f64 {
    if value.is_finite() && value > 0.0 && max > 0.0 {
        (value / max * PLOT_W).max(1.0)
    } else {
        0.0
    }
}

/// The SVG document.
pub fn svg(chart: &Chart) -> String {
    let mut body = String::new();
    let mut y = 30.0;
    let _ = writeln!(
        body,
        r#"<text x="10" y="{y}" font-size="16" font-weight="bold">{}</text>"#,
        escape(&chart.title)
    );
    y += 30.0;
    let _ = writeln!(
        body,
        r#"<text x="10" y="{y}" font-size="14" font-weight="bold">Drain rate relative to pg_recvlogical (1.0 = pg_recvlogical; higher is faster)</text>"#
    );
    y += 10.0;
    let max_ratio = chart
        .groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.ratio))
        .filter(|r| r.is_finite())
        .fold(1.0_f64, f64::max);
    for group in &chart.groups {
        y += 22.0;
        let _ = writeln!(
            body,
            r#"<text x="10" y="{y}" font-size="13" font-style="italic">{}</text>"#,
            escape(&group.title)
        );
        y += 8.0;
        let top = y;
        for (i, bar) in group.bars.iter().enumerate() {
            let w = bar_width(bar.ratio, max_ratio);
            let _ = writeln!(
                body,
                r#"<text x="{lx}" y="{ty}" text-anchor="end">{}</text>"#,
                escape(&bar.label),
                lx = LABEL_W,
                ty = y + BAR_H - 4.0
            );
            let _ = writeln!(
                body,
                r#"<rect x="{PLOT_X}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{}"/>"#,
                COLORS[i % COLORS.len()]
            );
            let _ = writeln!(
                body,
                r#"<text x="{tx:.1}" y="{ty}">{}</text>"#,
                escape(&format!(
                    "{:.2}x ({:.0} events/s)",
                    bar.ratio, bar.events_per_sec
                )),
                tx = PLOT_X + w + 6.0,
                ty = y + BAR_H - 4.0
            );
            y += ROW_H;
        }
        // pg_recvlogical's rate.
        let x1 = PLOT_X + bar_width(1.0, max_ratio);
        let _ = writeln!(
            body,
            r##"<line x1="{x1:.1}" y1="{y1}" x2="{x1:.1}" y2="{y2}" stroke="#333" stroke-dasharray="4 3"/>"##,
            y1 = top - 4.0,
            y2 = y
        );
    }
    if !chart.latency.is_empty() {
        y += 40.0;
        let _ = writeln!(
            body,
            r#"<text x="10" y="{y}" font-size="14" font-weight="bold">Latency distribution in the latency phase (milliseconds; lower is better)</text>"#
        );
        y += 10.0;
        let max_ms = chart
            .latency
            .iter()
            .flat_map(|s| s.points.iter().map(|(_, v)| *v))
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        for series in &chart.latency {
            y += 22.0;
            let _ = writeln!(
                body,
                r#"<text x="10" y="{y}" font-size="13" font-style="italic">{}</text>"#,
                escape(&series.label)
            );
            y += 8.0;
            for (i, (name, ms)) in series.points.iter().enumerate() {
                let w = bar_width(*ms, max_ms);
                let _ = writeln!(
                    body,
                    r#"<text x="{lx}" y="{ty}" text-anchor="end">{}</text>"#,
                    escape(name),
                    lx = LABEL_W,
                    ty = y + BAR_H - 4.0
                );
                let _ = writeln!(
                    body,
                    r#"<rect x="{PLOT_X}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{}"/>"#,
                    COLORS[i % COLORS.len()]
                );
                let _ = writeln!(
                    body,
                    r#"<text x="{tx:.1}" y="{ty}">{:.1} ms</text>"#,
                    ms,
                    tx = PLOT_X + w + 6.0,
                    ty = y + BAR_H - 4.0
                );
                y += ROW_H;
            }
        }
    }
    let height = y + 20.0;
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>\n\
         {body}</svg>\n"
    )
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A small well-formedness check: every tag closes in order, attributes are quoted, and
    /// every `&` starts an entity.
    pub fn well_formed(doc: &str) -> Result<(), String> {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = doc;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open])?;
            let close = rest[open..].find('>').ok_or("a tag does not end")? + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if tag.starts_with('?') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(top) if top == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name = tag.split_whitespace().next().ok_or("an empty tag")?;
            if !tag.matches('"').count().is_multiple_of(2) {
                return Err(format!("unbalanced quotes in <{tag}>"));
            }
            check_text(tag)?;
            if !self_closing {
                stack.push(name.to_owned());
            }
        }
        check_text(rest)?;
        if stack.is_empty() {
            Ok(())
        } else {
            Err(format!("unclosed: {stack:?}"))
        }
    }

    fn check_text(text: &str) -> Result<(), String> {
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..];
            if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| entity.starts_with(e))
            {
                return Err(format!("a bare & in {text:?}"));
            }
        }
        Ok(())
    }

    fn chart() -> Chart {
        let bar = |label: &str, ratio| Bar {
            label: label.into(),
            ratio,
            events_per_sec: ratio * 100_000.0,
        };
        Chart {
            title: "Siphon <bench> & friends".into(),
            groups: vec![
                Group {
                    title: "insert-only publication".into(),
                    bars: vec![
                        bar("pg_recvlogical", 1.0),
                        bar("siphon->kafka", 0.8),
                        bar("Debezium on Connect (idempotent)", 0.2),
                        bar("broken", f64::NAN),
                    ],
                },
                Group {
                    title: "all-operations publication".into(),
                    bars: vec![bar("pg_recvlogical", 1.0), bar("siphon->kafka", 1.3)],
                },
            ],
            latency: vec![Series {
                label: "commit->consumer (end to end)".into(),
                points: vec![("p50", 3.0), ("p90", 5.0), ("p99", 9.5), ("p99.9", 20.0)],
            }],
        }
    }

    #[test]
    fn the_chart_is_well_formed_and_names_every_row() {
        let doc = svg(&chart());
        well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert!(doc.starts_with("<?xml"), "{doc}");
        for name in [
            "pg_recvlogical",
            "siphon-&gt;kafka",
            "Debezium on Connect (idempotent)",
            "insert-only publication",
            "all-operations publication",
            "commit-&gt;consumer (end to end)",
            "p99.9",
            "20.0 ms",
            "0.80x (80000 events/s)",
            "Siphon &lt;bench&gt; &amp; friends",
        ] {
            assert!(doc.contains(name), "{name} missing:\n{doc}");
        }
        // A ratio above 1 stretches the scale: the fastest bar is the full plot width.
        assert!(doc.contains(r#"width="400.0""#), "{doc}");
    }

    #[test]
    fn the_check_catches_broken_documents() {
        assert!(well_formed("<a><b/></a>").is_ok());
        assert!(well_formed("<a><b></a>").is_err());
        assert!(well_formed("<a>x & y</a>").is_err());
        assert!(well_formed("<a x=\"1></a>").is_err());
        assert!(well_formed("<a>").is_err());
    }

    #[test]
    fn an_empty_chart_is_still_a_document() {
        let doc = svg(&Chart {
            title: String::new(),
            groups: Vec::new(),
            latency: Vec::new(),
        });
        well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
    }
}
