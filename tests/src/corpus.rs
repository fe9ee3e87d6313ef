//! A seeded, reproducible corpus of hostile outbox rows for the differential tests.
//!
//! Every row is inserted once into one table and read by Debezium and by Siphon through
//! their own slots. The rows aim at the classes of input where a re-implementation of
//! Debezium's bytes goes wrong:
//! - characters outside the Basic Multilingual Plane (emoji, musical symbols, CJK extension
//!   B, tag characters, U+10FFFF) in keys, payload strings, header and envelope columns and
//!   JSON member names, raw or as `\uD83D\uDE00`-style escapes (upper and lower case);
//! - lone surrogates as `\uD800` / `\uDC00` escapes inside JSON text (the payload column is
//!   `json`, which keeps its text as written);
//! - control characters, quotes, backslashes, DEL, U+2028, long values, NULLs, deep nesting;
//! - numbers whose Java text differs from the shortest decimal on some JDKs, integers at and
//!   beyond the 32- and 64-bit limits, numbers beyond the range of a double or that underflow;
//! - payloads `table.expand.json.payload` leaves as strings: an empty member name, mixed
//!   arrays, top-level arrays and scalars, blank text;
//! - fixed rows at and just past the read limits of the Jackson version Debezium expands
//!   payloads with: numbers and member names ([`read_limit_rows`]), 20 MB strings
//!   ([`string_limit_rows`], for a table of their own).
//!
//! Left out on purpose: arrays of objects whose shapes do not extend one another, where
//! Debezium's merged schema depends on the JVM run (see `docs/migrating-from-debezium.md`).
//!
//! # Invariants
//! - [`generate`] is a pure function of its seed and size: the same arguments give the same
//!   rows on every machine.
//! - Row ids are unique (`id` is the table's primary key and pairs records across systems):
//!   generated rows are `...-8000-<n>`, fixed rows `...-9000-<n>`.
//! - No text holds U+0000 (PostgreSQL text cannot) and every aggregate type is a valid part of
//!   a Kafka topic name.

use std::fmt::Write as _;

/// The outbox table of the differential tests: Debezium's outbox shape plus a header column,
/// an envelope column, an event timestamp, a partition and a schema version, and the payload
/// three ways: as `json` (kept as written), as `jsonb` (PostgreSQL's normalized text, NULL
/// where jsonb refuses the text) and as `bytea` (the UTF-8 bytes of the text).
pub const TABLE_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload json,
    tenant text,
    created_at timestamp(6) NOT NULL,
    part integer,
    ver integer,
    payload_b jsonb,
    payload_bin bytea,
    score double precision,
    ratio real);
CREATE FUNCTION try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$";

/// One outbox row, as text for each column (`None`: NULL).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub aggregatetype: String,
    pub aggregateid: String,
    pub event_type: String,
    pub payload: Option<String>,
    pub tenant: Option<String>,
    pub created_at: String,
    pub part: Option<i32>,
    pub ver: Option<i32>,
    pub score: Option<f64>,
    pub ratio: Option<f32>,
}

use crate::rng::SplitMix64 as Rng;

/// Pieces hostile strings are made of.
const PIECES: &[&str] = &[
    "order",
    "a",
    "Zürich",
    "東京",
    "😀",
    "🎉",
    "𝄞",
    "𠀀",
    "\u{E0041}\u{E007F}",
    "\u{10FFFF}",
    "\u{FEFF}",
    "\u{FFFD}",
    "\u{2028}",
    "\"",
    "\\",
    "/",
    "\u{7F}",
    "\u{1}",
    "\u{8}",
    "\t",
    "\n",
    "\r",
    "\u{C}",
    "\u{1F}",
    " ",
    "{}",
    "$",
    "%s",
];

fn hostile_string(rng: &mut Rng, max_pieces: usize) -> String {
    let mut s = String::new();
    if rng.chance(3) {
        // Long values: thousands of characters, some outside the BMP.
        for i in 0..(500 + rng.below(3000)) {
            s.push_str(if i % 7 == 0 { "😀" } else { "x" });
        }
        return s;
    }
    for _ in 0..=rng.below(max_pieces) {
        let piece: &&str = rng.pick(PIECES);
        s.push_str(piece);
    }
    s
}

/// Numbers as JSON text, chosen where Java, Jackson and Rust disagree most easily.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2147483647",
    "2147483648",
    "-2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "0.1",
    "-0.0",
    "1.0",
    "1e7",
    "1E7",
    "1.0e-4",
    "0.001",
    "1e-3",
    "2e-3",
    "2e22",
    "1e23",
    "1.0E23",
    "9.999999999999999E22",
    "9007199254740993",
    "5e-324",
    "4.9e-324",
    "1e-400",
    "1e400",
    "-1e400",
    "1.7976931348623157e308",
    "2.2250738585072014E-308",
    "100.0",
    "1234567.0",
    "12345678.9",
    "0.30000000000000004",
    "3.0E10",
    "1.0E-5",
    "2.0E-3",
    "1.0E21",
    "8.41E21",
    "5.0E-324",
    "1.1234567890123457",
];

fn number(rng: &mut Rng) -> String {
    if rng.chance(40) {
        // A random finite double, written shortest or with 17 digits.
        loop {
            let v = f64::from_bits(rng.next_u64());
            if v.is_finite() {
                return if rng.chance(50) {
                    format!("{v:e}")
                } else {
                    format!("{v:.16e}")
                };
            }
        }
    }
    (*rng.pick(NUMBERS)).to_owned()
}

/// `text` as a JSON string literal; non-ASCII characters are written raw or as `\u`
/// escapes (surrogate pairs outside the BMP), in either case of hex digits.
/// A `double precision` value: tricky decimals, random bit patterns, non-finite values.
fn column_double(rng: &mut Rng) -> f64 {
    match rng.below(4) {
        0 => *rng.pick(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            8.41e21,
            1.0e23,
            5e-324,
        ]),
        1 => number(rng)
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .unwrap_or(0.5),
        _ => loop {
            let v = f64::from_bits(rng.next_u64());
            if v.is_finite() {
                break v;
            }
        },
    }
}

fn json_string(rng: &mut Rng, text: &str) -> String {
    let escape_mode = rng.below(3);
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if !c.is_ascii() && escape_mode > 0 => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if escape_mode == 1 {
                        let _ = write!(out, "\\u{unit:04x}");
                    } else {
                        let _ = write!(out, "\\u{unit:04X}");
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Lone surrogates, as JSON escapes (only the `json` type keeps them).
const LONE_SURROGATES: &[&str] = &[
    "\"\\ud800\"",
    "\"x\\uDC00y\"",
    "\"\\udbff\\u0041\"",
    "\"\\uDFFF\\uD800\"",
];

fn json_value(rng: &mut Rng, depth: usize, lone_surrogates: bool) -> String {
    let kind = if depth > 6 {
        rng.below(4)
    } else {
        rng.below(8)
    };
    match kind {
        0 => {
            if lone_surrogates && rng.chance(15) {
                (*rng.pick(LONE_SURROGATES)).to_owned()
            } else {
                let s = hostile_string(rng, 4);
                json_string(rng, &s)
            }
        }
        1 => number(rng),
        2 => (*rng.pick(&["true", "false", "null"])).to_owned(),
        3 => number(rng),
        4 | 5 => json_object(rng, depth + 1, lone_surrogates),
        _ => {
            // Arrays: homogeneous most of the time.
            let n = rng.below(4);
            let same = rng.chance(80);
            let first = rng.below(3);
            let items: Vec<String> = (0..n)
                .map(|_| match if same { first } else { rng.below(3) } {
                    0 => json_string(rng, "e😀"),
                    1 => (*rng.pick(&["1", "2", "-7"])).to_owned(),
                    _ => array_element_object(rng),
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
    }
}

/// An object for an array of objects. Debezium merges the schemas of differing elements in
/// an order that changes from one JVM to the next (a hash set of schemas whose hash codes
/// include an enum's identity hash), so the shapes here only ever extend one another
/// (`{"a"}`, `{"a", "bb"}`), where every merge order gives the same schema; the names sort
/// the same way in jsonb (shorter first), which keeps that true for jsonb payloads.
fn array_element_object(rng: &mut Rng) -> String {
    let a = rng.below(100);
    match rng.below(4) {
        0 => format!("{{\"a\": {a}}}"),
        1 => "{}".to_owned(),
        2 => format!("{{\"a\": {a}, \"bb\": null}}"),
        _ => {
            let bb = hostile_string(rng, 2);
            format!("{{\"a\": {a}, \"bb\": {}}}", json_string(rng, &bb))
        }
    }
}

fn json_object(rng: &mut Rng, depth: usize, lone_surrogates: bool) -> String {
    let n = rng.below(5);
    let mut members = Vec::new();
    for i in 0..n {
        let name = match rng.below(10) {
            0 => hostile_string(rng, 2),
            1 if rng.chance(20) => String::new(),
            _ => format!("f{i}"),
        };
        let name = json_string(rng, &name);
        members.push(format!(
            "{name}: {}",
            json_value(rng, depth, lone_surrogates)
        ));
    }
    format!("{{{}}}", members.join(", "))
}

fn deep(rng: &mut Rng) -> String {
    // Mostly moderate nesting; sometimes right at Jackson's limit of 1000 levels when reading,
    // or where the written schema passes its limit of 1000 levels when writing.
    let levels = match rng.below(10) {
        0..=1 => 998 + rng.below(4),
        2..=3 => 497 + rng.below(6),
        _ => 20 + rng.below(60),
    };
    let mut s = String::new();
    for _ in 0..levels {
        s.push_str("{\"n\": ");
    }
    s.push_str(&number(rng));
    for _ in 0..levels {
        s.push('}');
    }
    s
}

fn payload(rng: &mut Rng, lone_surrogates: bool) -> Option<String> {
    Some(match rng.below(20) {
        0 => return None,
        1 => deep(rng),
        2 => format!("[{}]", number(rng)),
        3 => {
            let s = hostile_string(rng, 3);
            json_string(rng, &s)
        }
        4 => number(rng),
        5 => "{\"\": 1}".to_owned(),
        6 => "  {\"a\": 1}".to_owned(),
        7 => format!("{{\"n\": {}}}", number(rng)),
        8 => format!("{{\"n\": {}, \"m\": [{}]}}", number(rng), number(rng)),
        _ => json_object(rng, 0, lone_surrogates),
    })
}

/// `count` rows from `seed`. With `lone_surrogates`, some JSON strings hold unpaired
/// surrogate escapes.
pub fn generate(seed: u64, count: usize, lone_surrogates: bool) -> Vec<Row> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|i| {
            let aggregatetype = (*rng.pick(&["Order", "Customer", "A_b-c.1"])).to_owned();
            let aggregateid = if rng.chance(30) {
                format!("{}-{}", aggregatetype.to_lowercase(), rng.below(20))
            } else {
                hostile_string(&mut rng, 4)
            };
            let event_type = hostile_string(&mut rng, 3);
            let tenant = (!rng.chance(20)).then(|| hostile_string(&mut rng, 3));
            let micros = rng.below(1_000_000);
            Row {
                id: format!("00000000-0000-4000-8000-{:012x}", i + 1),
                aggregatetype,
                aggregateid,
                event_type,
                payload: payload(&mut rng, lone_surrogates),
                tenant,
                part: (!rng.chance(10)).then(|| rng.below(3) as i32),
                ver: (!rng.chance(10)).then(|| 1 + rng.below(3) as i32),
                score: (!rng.chance(10)).then(|| column_double(&mut rng)),
                ratio: (!rng.chance(10)).then(|| column_double(&mut rng) as f32),
                created_at: format!(
                    "20{:02}-{:02}-{:02} {:02}:{:02}:{:02}.{micros:06}",
                    rng.below(40),
                    1 + rng.below(12),
                    1 + rng.below(28),
                    rng.below(24),
                    rng.below(60),
                    rng.below(60)
                ),
            }
        })
        .collect()
}

/// Jackson's default `StreamReadConstraints` in the version Debezium 3.6.3 ships (2.21.2):
/// a number's digits, a member name's length and a string's length, in Java characters
/// (UTF-16 code units, escapes decoded). The nesting limit (1000) is in [`deep`]; documents
/// and token counts are not limited.
pub const JACKSON_MAX_NUMBER_DIGITS: usize = 1000;
/// See [`JACKSON_MAX_NUMBER_DIGITS`].
pub const JACKSON_MAX_NAME_LENGTH: usize = 50_000;
/// See [`JACKSON_MAX_NUMBER_DIGITS`].
pub const JACKSON_MAX_STRING_LENGTH: usize = 20_000_000;

/// A row of fixed columns around `payload`, numbered `n` among the fixed rows (its id never
/// meets a generated row's).
fn fixed_row(n: usize, payload: String) -> Row {
    Row {
        id: format!("00000000-0000-4000-9000-{n:012x}"),
        aggregatetype: "Order".to_owned(),
        aggregateid: format!("limit-{n}"),
        event_type: "Limit".to_owned(),
        payload: Some(payload),
        tenant: Some("t".to_owned()),
        created_at: "2024-05-01 12:00:00.000001".to_owned(),
        part: Some(0),
        ver: Some(1),
        score: Some(0.5),
        ratio: Some(0.25),
    }
}

/// Payloads at and just past Jackson's number and name limits, for the corpus table (each
/// at most 100 kB). A number's length is its digits (sign, point, `e` and exponent sign not
/// counted) as Jackson 2.21 counts them: a number starting with `0` takes its slower reading,
/// where an absent fraction or exponent counts -1.
pub fn read_limit_rows() -> Vec<Row> {
    let max = JACKSON_MAX_NUMBER_DIGITS;
    let digits = |n: usize| "1".repeat(n);
    let numbers = [
        // Integers: digits, sign not counted.
        digits(max),
        digits(max + 1),
        format!("-{}", digits(max)),
        format!("-{}", digits(max + 1)),
        // Fractions: integer and fraction digits.
        format!("1.{}", digits(max - 1)),
        format!("1.{}", digits(max)),
        // Exponents: mantissa and exponent digits, the exponent's sign not counted.
        format!("{}E-990", digits(max - 3)),
        format!("{}E-990", digits(max - 2)),
        // A leading zero: its absent exponent counts -1.
        format!("0.{}", digits(max)),
        format!("0.{}", digits(max + 1)),
        format!("-0.{}", digits(max)),
        format!("0.{}e-5", digits(max - 2)),
        format!("0.{}e-5", digits(max - 1)),
        // ... and its absent fraction.
        format!("0e{}1", "0".repeat(max - 1)),
        format!("0e{}1", "0".repeat(max)),
    ];
    let name = JACKSON_MAX_NAME_LENGTH;
    let names = [
        "n".repeat(name),
        "n".repeat(name + 1),
        // Java characters, not UTF-8 bytes: 50,000 and 50,001 UTF-16 code units.
        "😀".repeat(name / 2),
        format!("n{}", "😀".repeat(name / 2)),
        // Escapes count decoded.
        format!("\\n{}", "n".repeat(name - 1)),
    ];
    numbers
        .into_iter()
        .map(|number| format!("{{\"n\": {number}}}"))
        .chain(names.into_iter().map(|n| format!("{{\"{n}\": 1}}")))
        .enumerate()
        .map(|(i, payload)| fixed_row(i + 1, payload))
        .collect()
}

/// Payloads at and just past Jackson's string limit (20 MB each): for a table and variant
/// of their own, since every variant reading them writes records of that size.
pub fn string_limit_rows() -> Vec<Row> {
    let max = JACKSON_MAX_STRING_LENGTH;
    [
        // At the limit in Java characters, not in UTF-8 bytes: 20,000,000 UTF-16 code units
        // in 20,000,002 bytes.
        format!("{}😀", "x".repeat(max - 2)),
        "x".repeat(max + 1),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, s)| fixed_row(0x1000 + i, format!("{{\"s\": \"{s}\"}}")))
    .collect()
}

/// Inserts `rows` into `outbox` in transactions of up to 50 rows.
pub async fn insert(client: &mut tokio_postgres::Client, rows: &[Row]) -> anyhow::Result<()> {
    insert_into(client, "outbox", rows, true).await
}

/// Inserts `rows` into `table` (made like `outbox`) in transactions of up to 50 rows; without
/// `copies`, `payload_b` and `payload_bin` (the payload as `jsonb` and `bytea`) are NULL.
pub async fn insert_into(
    client: &mut tokio_postgres::Client,
    table: &str,
    rows: &[Row],
    copies: bool,
) -> anyhow::Result<()> {
    let copies = if copies {
        "try_jsonb($5), convert_to($5, 'UTF8')"
    } else {
        "NULL, NULL"
    };
    for chunk in rows.chunks(50) {
        let tx = client.transaction().await?;
        let stmt = tx
            .prepare(&format!(
                "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload, tenant, created_at, \
                                     part, ver, payload_b, payload_bin, score, ratio) \
                 VALUES ($1::text::uuid, $2, $3, $4, $5::text::json, $6, $7::text::timestamp, \
                         $8, $9, {copies}, $10, $11)",
            ))
            .await?;
        for r in chunk {
            tx.execute(
                &stmt,
                &[
                    &r.id,
                    &r.aggregatetype,
                    &r.aggregateid,
                    &r.event_type,
                    &r.payload,
                    &r.tenant,
                    &r.created_at,
                    &r.part,
                    &r.ver,
                    &r.score,
                    &r.ratio,
                ],
            )
            .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_rows() {
        // Debug text, since NaN is not equal to itself.
        let text = |seed| format!("{:?}", generate(seed, 50, true));
        assert_eq!(text(7), text(7));
        assert_ne!(text(7), text(8));
    }

    #[test]
    fn rows_are_valid_json_or_null() {
        for row in generate(1, 300, false) {
            if let Some(p) = &row.payload {
                // serde_json stops at 128 levels; the deep payloads are nested objects.
                let deep = p.starts_with(r#"{"n": {"n": "#);
                assert!(
                    deep || serde_json::from_str::<serde_json::Value>(p).is_ok()
                        || p.contains("e400"),
                    "{p}"
                );
            }
            assert!(!row.aggregateid.contains('\0'));
        }
    }
}
