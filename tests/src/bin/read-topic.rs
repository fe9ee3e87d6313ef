//! Prints every record of Kafka topics, one line each, for the demo and for people.
//!
//! Usage: `read-topic BOOTSTRAP TOPIC [TOPIC...]`
//!
//! Reads each partition from the beginning to its end (no consumer group), then exits.

use anyhow::{bail, Result};
use std::io::Write;
use std::time::Duration;

fn show(bytes: Option<&[u8]>) -> String {
    match bytes {
        None => "null".to_owned(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => s.to_owned(),
            Err(_) => format!(
                "0x{}",
                b.iter().map(|x| format!("{x:02x}")).collect::<String>()
            ),
        },
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, topics @ ..] = args.as_slice() else {
        bail!("usage: read-topic BOOTSTRAP TOPIC [TOPIC...]");
    };
    if topics.is_empty() {
        bail!("usage: read-topic BOOTSTRAP TOPIC [TOPIC...]");
    }
    let mut out = std::io::stdout().lock();
    for topic in topics {
        let records = siphon_tests::read_topic(bootstrap, topic, Duration::from_secs(30))?;
        writeln!(out, "== {topic}: {} record(s)", records.len())?;
        for r in records {
            let headers: Vec<String> = r
                .headers
                .iter()
                .map(|(k, v)| format!("{k}={}", show(v.as_deref())))
                .collect();
            writeln!(
                out,
                "partition={} offset={} key={} headers=[{}] value={}",
                r.partition,
                r.offset,
                show(r.key.as_deref()),
                headers.join(", "),
                show(r.value.as_deref())
            )?;
        }
    }
    Ok(())
}
