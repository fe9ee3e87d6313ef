//! Independent decoders in Python: the protobuf runtime (with the .proto compiled by
//! grpcio-tools), the CloudEvents SDK and Confluent's Avro deserializer with its registry
//! client, in an environment `scripts/python-env.sh` creates
//! once under `~/.cache/siphon/`.
//!
//! # Invariants
//! - Only a missing `python3` makes the decoders unavailable ([`python`] returns `None`, and
//!   the tests skip saying so); an environment that cannot be built is an error.
//! - Records go to the decoder byte for byte (hex-encoded), headers in wire order.

use crate::{workspace_root, ConsumedRecord};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The interpreter of the decoder environment, or `None` when python3 is not installed.
pub fn python() -> Result<Option<PathBuf>> {
    let script = workspace_root().join("scripts/python-env.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    match output.status.code() {
        Some(0) => Ok(Some(PathBuf::from(
            String::from_utf8(output.stdout)?.trim().to_owned(),
        ))),
        Some(3) => Ok(None),
        _ => bail!(
            "{} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes `records` with `tests/python/decode_records.py` and these arguments (after the
/// proto root), one JSON value per record.
pub fn decode_records(
    python: &PathBuf,
    records: &[ConsumedRecord],
    args: &[&str],
) -> Result<Vec<serde_json::Value>> {
    let proto = workspace_root().join("proto");
    let mut all = vec![proto.to_string_lossy().into_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    run_decoder(python, "decode_records.py", records, &all)
}

/// Decodes the Avro values of `records` of `topic` with `tests/python/decode_avro.py`:
/// Confluent's `AvroDeserializer` with its own client of the registry at `registry_url`. One
/// `{"value": …, "schema_id": …}` per record; with `keys`, the Avro keys too (`"key"`,
/// `"key_schema_id"`), which every record then needs.
pub fn decode_avro(
    python: &PathBuf,
    registry_url: &str,
    topic: &str,
    records: &[ConsumedRecord],
    keys: bool,
) -> Result<Vec<serde_json::Value>> {
    let mut args = vec![registry_url.to_owned(), topic.to_owned()];
    if keys {
        args.push("--keys".to_owned());
    }
    run_decoder(python, "decode_avro.py", records, &args)
}

fn run_decoder(
    python: &PathBuf,
    script: &str,
    records: &[ConsumedRecord],
    args: &[String],
) -> Result<Vec<serde_json::Value>> {
    let root = workspace_root();
    let mut child = Command::new(python)
        .arg(root.join("tests/python").join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the Python decoder")?;
    let mut input = String::new();
    for r in records {
        let line = serde_json::json!({
            "key": r.key.as_deref().map(hex),
            "value": r.value.as_deref().map(hex),
            "headers": r.headers.iter().map(|(n, v)| serde_json::json!([n, v.as_deref().map(hex)])).collect::<Vec<_>>(),
        });
        input.push_str(&line.to_string());
        input.push('\n');
    }
    // Written beside the reading: the decoder's answers would fill its stdout pipe (and stop
    // it) before it read the whole input.
    let mut stdin = child.stdin.take().context("decoder stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the decoder's input writer panicked"))??;
    if !output.status.success() {
        bail!(
            "the Python decoder failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8(output.stdout)?
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("decoder output {l:?}")))
        .collect()
}
