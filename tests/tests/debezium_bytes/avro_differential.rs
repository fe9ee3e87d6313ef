//! Siphon's Avro of expanded payloads against the Java that writes it for Debezium: Debezium's
//! `JsonSchemaData` (the inference behind `table.expand.json.payload`) and Confluent's
//! `AvroData` (the converter's conversion), run by `tests/debezium/AvroOracle.java` on the
//! oracle's jars. The Avro schema text and the datum bytes must be equal; where Java refuses
//! (a name Avro does not take, a payload too deep), Siphon must refuse too. The one known
//! difference: Siphon refuses names with non-ASCII letters, which Avro's Java library takes.

use anyhow::Result;
use siphon_router::{
    expand_json_payload, AvroError, AvroSchema, Expansion, JsonEmptyArrayBehavior, JsonNullBehavior,
};
use siphon_tests::oracle::{plain_hex, run_avro_oracle, JavaAvro as Java, Oracle};
use siphon_tests::rng::SplitMix64;

/// An Avro name.
fn name(rng: &mut SplitMix64) -> String {
    let first = *rng.pick(&["a", "b", "_", "Z", "id", "order", "x_1"]);
    let rest = *rng.pick(&["", "2", "_x", "Name", "9"]);
    format!("{first}{rest}")
}

/// A JSON string literal, hostile inside.
fn string(rng: &mut SplitMix64) -> String {
    let pieces = [
        "plain",
        "Zürich",
        "東京",
        "😀",
        "𝄞",
        "\\\"",
        "\\\\",
        "\\n",
        "\\u0001",
        "\\ud83d\\ude00",
        "\\ud800",
        "\\udc00x",
        "\\u2028",
        "",
        " ",
    ];
    let n = rng.below(4);
    let text: String = (0..n).map(|_| *rng.pick(&pieces)).collect();
    format!("\"{text}\"")
}

fn number(rng: &mut SplitMix64) -> String {
    (*rng.pick(&[
        "0",
        "-1",
        "2147483647",
        "-2147483648",
        "2147483648",
        "-2147483649",
        "9223372036854775807",
        "-9223372036854775808",
        "0.1",
        "-0.0",
        "1e300",
        "4.9e-324",
        "1.7976931348623157E308",
        "3.14159",
        "12345678901234567890.5",
    ]))
    .to_owned()
}

/// A JSON object with Avro names, `depth` levels deep at most. Arrays hold one kind of
/// scalar, or objects whose members extend one another (Debezium merges other shapes in an
/// order that varies between JVM runs).
fn object(rng: &mut SplitMix64, depth: usize) -> String {
    let mut members = Vec::new();
    for _ in 0..rng.below(6) {
        let value = match rng.below(if depth == 0 { 4 } else { 7 }) {
            0 => string(rng),
            1 => number(rng),
            2 => (*rng.pick(&["true", "false"])).to_owned(),
            3 => (*rng.pick(&["null", "[]"])).to_owned(),
            4 => object(rng, depth - 1),
            5 => {
                let kind = rng.below(3);
                let items: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| match kind {
                        0 => string(rng),
                        1 => (*rng.pick(&["1", "-7", "2147483647"])).to_owned(),
                        _ => "true".to_owned(),
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let keys = ["a", "b", "c"];
                let items: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| {
                        let n = 1 + rng.below(keys.len());
                        let fields: Vec<String> = keys[..n]
                            .iter()
                            .map(|k| format!("\"{k}\":{}", (*rng.pick(&["1", "-3"]))))
                            .collect();
                        format!("{{{}}}", fields.join(","))
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
        };
        members.push(format!("\"{}\":{value}", name(rng)));
    }
    format!("{{{}}}", members.join(","))
}

#[test]
fn avro_of_expanded_payloads_matches_confluents_avro_data() -> Result<()> {
    // The corpus nests payloads 1000 levels deep: expand them on a stack as large as the
    // router's deep-payload thread.
    std::thread::Builder::new()
        .stack_size(64 * 1024 * 1024)
        .spawn(compare)?
        .join()
        .map_err(|_| anyhow::anyhow!("the comparison panicked"))?
}

fn compare() -> Result<()> {
    let Some(oracle) = Oracle::locate()? else {
        return siphon_tests::prerequisite_missing("avro differential", "no JDK is installed");
    };
    let mut rng = SplitMix64(0x5eed_a7c0);
    let mut payloads: Vec<String> = (0..400).map(|_| object(&mut rng, 3)).collect();
    payloads.extend(
        siphon_tests::corpus::generate(7, 300, true)
            .into_iter()
            .filter_map(|row| row.payload),
    );
    payloads.extend(
        [
            r#"{"order-id":1}"#,
            r#"{"1st":{"a":1}}"#,
            r#"{"a":{"b":{"c":{"d":{"e":"deep"}}}}}"#,
        ]
        .map(str::to_owned),
    );
    // Past serde_json's default depth, and up to where the schema nests as deep as Jackson
    // writes.
    payloads.extend([40, 100, 200, 240, 249, 250].map(|depth| {
        format!(
            "{}{{\"x\":1}}{}",
            "{\"n\":".repeat(depth),
            "}".repeat(depth)
        )
    }));
    // Only what Siphon expands is compared: the rest is not Avro of a struct.
    let mut siphon = Vec::new();
    let mut compared = Vec::new();
    for payload in &payloads {
        if let Expansion::Expanded { schema, value } = expand_json_payload(
            "payload",
            payload,
            JsonNullBehavior::Ignore,
            JsonEmptyArrayBehavior::Ignore,
        ) {
            siphon.push(AvroSchema::from_connect(&schema).and_then(|avro| {
                let datum = avro.datum(&value)?;
                Ok((avro.json().to_owned(), datum))
            }));
            compared.push(payload.clone());
        }
    }
    let java = run_avro_oracle(&oracle, &compared)?;

    let (mut same, mut both_refused, mut non_ascii_names) = (0, 0, 0);
    let mut differences = Vec::new();
    for ((payload, ours), theirs) in compared.iter().zip(&siphon).zip(&java) {
        let payload: String = payload.chars().take(300).collect();
        match (ours, theirs) {
            (
                Ok((schema, datum)),
                Java::Avro {
                    schema: s,
                    datum: d,
                },
            ) => {
                if schema == s && datum == d {
                    same += 1;
                } else {
                    differences.push(format!(
                        "{payload}\n  siphon: {schema}\n          {}\n  java:   {s}\n          {}",
                        plain_hex(datum),
                        plain_hex(d)
                    ));
                }
            }
            // Java refuses a payload too deep for its default thread stack, Siphon one whose
            // schema nests deeper than Jackson writes.
            (
                Err(
                    AvroError::InvalidName { .. }
                    | AvroError::Redefined { .. }
                    | AvroError::TooDeep { .. },
                ),
                Java::Refused(_),
            ) => both_refused += 1,
            // Avro's Java library takes any letters and digits in names; the specification
            // and Siphon only ASCII ones (docs/schema-registry.md).
            (Err(AvroError::InvalidName { name }), Java::Avro { .. }) if !name.is_ascii() => {
                non_ascii_names += 1
            }
            (Err(e), Java::Avro { schema, .. }) => differences.push(format!(
                "{payload}\n  siphon refused: {e}\n  java: {schema}"
            )),
            (Ok((schema, _)), Java::Refused(e)) => differences.push(format!(
                "{payload}\n  siphon: {schema}\n  java refused: {e}"
            )),
            (Err(e), Java::Refused(j)) => differences.push(format!(
                "{payload}\n  siphon refused: {e}\n  java refused: {j}"
            )),
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} payloads differ ({same} equal, {both_refused} refused by both, {non_ascii_names} with non-ASCII names); the first:\n{}",
        differences.len(),
        compared.len(),
        differences[..differences.len().min(5)].join("\n")
    );
    assert!(same >= 300, "only {same} payloads compared equal");
    assert!(both_refused >= 3, "only {both_refused} refused by both");
    Ok(())
}
