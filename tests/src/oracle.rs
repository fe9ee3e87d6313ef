//! Debezium as the oracle of the differential tests: `tests/debezium/Oracle.java` compiled with
//! the system's `javac` (with `BenchDrain.java`, the benchmark's Debezium drain, and
//! `AvroOracle.java`, Confluent's AvroData on Debezium's expanded payloads, which run
//! through [`Oracle::java_command`]) and run on the Debezium jars and the Java 21 runtime that
//! `scripts/install-debezium.sh` caches (Debezium's official 3.x images run Java 21; set
//! `SIPHON_ORACLE_JAVA` to another `java` binary to see what another JDK prints).
//!
//! The oracle runs Debezium's embedded engine with its PostgreSQL connector and the outbox
//! Event Router on a slot of its own, then applies Kafka Connect's converters and the Java
//! producer's default partitioner to each record, as a Connect worker does, and writes what a
//! Kafka broker would have received.
//!
//! # Invariants
//! - [`Oracle::locate`] returns `Ok(None)` only when no JDK (`java` and `javac`) is found; a
//!   missing jar cache is installed, and any other failure is an error.
//! - Runs execute in one JVM, a few at a time; each run reads its own slot, so runs never
//!   see each other's progress.
//! - Byte strings cross the process boundary in hex, so no byte is reinterpreted.

use anyhow::{bail, ensure, Context as _, Result};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A Kafka Connect converter, named by what Siphon calls its encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// `JsonConverter`, `schemas.enable=false` (Siphon's `json`).
    Json,
    /// `JsonConverter`, `schemas.enable=true` (Siphon's `json-schemas`).
    JsonSchemas,
    /// `StringConverter` (Siphon's `string`).
    String,
    /// `ByteArrayConverter` (Siphon's `binary`).
    Binary,
}

impl Converter {
    /// Siphon's name of the encoding.
    pub fn siphon_name(self) -> &'static str {
        match self {
            Converter::Json => "json",
            Converter::JsonSchemas => "json-schemas",
            Converter::String => "string",
            Converter::Binary => "binary",
        }
    }

    fn properties(self, prefix: &str, out: &mut BTreeMap<String, String>) {
        let (class, schemas) = match self {
            Converter::Json => ("org.apache.kafka.connect.json.JsonConverter", Some("false")),
            Converter::JsonSchemas => ("org.apache.kafka.connect.json.JsonConverter", Some("true")),
            Converter::String => ("org.apache.kafka.connect.storage.StringConverter", None),
            Converter::Binary => (
                "org.apache.kafka.connect.converters.ByteArrayConverter",
                None,
            ),
        };
        out.insert(prefix.to_owned(), class.to_owned());
        if let Some(s) = schemas {
            out.insert(format!("{prefix}.schemas.enable"), s.to_owned());
        }
    }
}

/// One connector run: a slot, the router options and the converters.
#[derive(Debug, Clone)]
pub struct OracleRun {
    /// Connector name; also the file name of the output.
    pub name: String,
    /// PostgreSQL port on 127.0.0.1 (user/password/database `siphon`).
    pub pg_port: u16,
    /// A pgoutput slot that exists already.
    pub slot: String,
    /// A publication that exists already.
    pub publication: String,
    /// `schema.table` to capture.
    pub table: String,
    /// The Event Router's options (without the `transforms.outbox.` prefix), with the
    /// connector options Siphon keeps beside them (`topic.prefix`, `extended.headers.enabled`).
    pub router: BTreeMap<String, String>,
    pub key: Converter,
    pub value: Converter,
    /// How many change events to wait for (each INSERT, UPDATE, DELETE and tombstone).
    pub expected: usize,
    /// Partitions of every topic (for the default partitioner).
    pub partitions: i32,
}

/// What the oracle wrote for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OracleRecord {
    /// A record as a Connect worker would produce it.
    Produced {
        topic: String,
        /// `None`: a null key with no partition set (the sticky partitioner picks one).
        partition: Option<i32>,
        timestamp: Option<i64>,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(String, Option<Vec<u8>>)>,
    },
    /// A record the converters refused: a Connect worker's task fails on it.
    Refused {
        topic: String,
        /// The event id (the `id` header's text), if the router set one.
        id: Option<String>,
        error: String,
    },
}

impl OracleRecord {
    /// The text of the `id` header (or the refused record's id).
    pub fn id(&self) -> Option<String> {
        match self {
            OracleRecord::Produced { headers, .. } => headers
                .iter()
                .find(|(k, _)| k == "id")
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned()),
            OracleRecord::Refused { id, .. } => id.clone(),
        }
    }
}

/// A run's output: the records in the order the engine delivered them, and an error if the
/// engine stopped or too few records came.
#[derive(Debug, Clone, Default)]
pub struct OracleOutput {
    pub records: Vec<OracleRecord>,
    pub error: Option<String>,
}

/// The Java programs in `tests/debezium` (class names), compiled by [`Oracle::locate`].
const PROGRAMS: [&str; 3] = ["Oracle", "BenchDrain", "AvroOracle"];

/// A compiled oracle, ready to run.
pub struct Oracle {
    java: PathBuf,
    classpath: String,
}

/// The directory of a JDK binary (`java`, `javac`), from `JAVA_HOME` or `PATH`.
fn jdk_tool(name: &str) -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("JAVA_HOME").filter(|h| !h.is_empty()) {
        let p = Path::new(&home).join("bin").join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn hex(text: &str) -> Result<Option<Vec<u8>>> {
    if text == "-" {
        return Ok(None);
    }
    let digits = text
        .strip_prefix('x')
        .with_context(|| format!("bad hex field {text:?}"))?;
    ensure!(digits.len() % 2 == 0, "odd hex field {text:?}");
    // Byte by byte without parsing helpers: records reach tens of MB, in an unoptimized build.
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for pair in digits.as_bytes().chunks_exact(2) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(high), Some(low)) => out.push(high << 4 | low),
            _ => bail!("bad hex in {:?}", text.get(..80).unwrap_or(text)),
        }
    }
    Ok(Some(out))
}

fn hex_text(text: &str) -> Result<String> {
    Ok(String::from_utf8_lossy(&hex(text)?.unwrap_or_default()).into_owned())
}

/// Parses one output file of `Oracle.java`.
pub fn parse_output(text: &str) -> Result<OracleOutput> {
    let mut out = OracleOutput::default();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields[0] {
            "R" => {
                ensure!(fields.len() >= 7, "short record line {line:?}");
                let count: usize = fields[6].parse()?;
                ensure!(
                    fields.len() == 7 + 2 * count,
                    "bad header count in {line:?}"
                );
                let mut headers = Vec::with_capacity(count);
                for h in 0..count {
                    headers.push((hex_text(fields[7 + 2 * h])?, hex(fields[8 + 2 * h])?));
                }
                out.records.push(OracleRecord::Produced {
                    topic: hex_text(fields[1])?,
                    partition: (fields[2] != "-").then(|| fields[2].parse()).transpose()?,
                    timestamp: (fields[3] != "-").then(|| fields[3].parse()).transpose()?,
                    key: hex(fields[4])?,
                    value: hex(fields[5])?,
                    headers,
                });
            }
            "X" => {
                ensure!(fields.len() == 4, "bad refused line {line:?}");
                out.records.push(OracleRecord::Refused {
                    topic: hex_text(fields[1])?,
                    id: hex(fields[2])?.map(|b| String::from_utf8_lossy(&b).into_owned()),
                    error: hex_text(fields[3])?,
                });
            }
            "E" => out.error = Some(hex_text(fields.get(1).copied().unwrap_or("-"))?),
            other => bail!("unknown oracle line kind {other:?}"),
        }
    }
    Ok(out)
}

/// A `.properties` value or key, escaped so that `Properties.load` reads it back exactly.
fn properties_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.chars().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '=' | ':' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == 0 => out.push_str("\\ "),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

/// Writes `props` as a `.properties` file that `Properties.load` reads back exactly.
pub fn write_properties(file: &Path, props: &BTreeMap<String, String>) -> Result<()> {
    let text: String = props
        .iter()
        .map(|(k, v)| format!("{}={}\n", properties_escape(k), properties_escape(v)))
        .collect();
    std::fs::write(file, text).with_context(|| format!("writing {}", file.display()))
}

impl Oracle {
    /// Finds the JDK, installs the Debezium jars and Java 21 runtime if needed and compiles
    /// the oracle into `target/debezium-oracle`. `Ok(None)` when no JDK is installed.
    pub fn locate() -> Result<Option<Oracle>> {
        let (Some(_), Some(javac)) = (jdk_tool("java"), jdk_tool("javac")) else {
            return Ok(None);
        };
        let root = crate::workspace_root();
        let install = Command::new(root.join("scripts/install-debezium.sh"))
            .output()
            .context("running scripts/install-debezium.sh")?;
        ensure!(
            install.status.success(),
            "scripts/install-debezium.sh failed:\n{}",
            String::from_utf8_lossy(&install.stderr)
        );
        let stdout = String::from_utf8(install.stdout)?;
        let lines: Vec<&str> = stdout.lines().collect();
        let [.., jars, runtime] = lines[..] else {
            bail!("install-debezium.sh did not print the jar directory and the java binary");
        };
        let java = std::env::var_os("SIPHON_ORACLE_JAVA")
            .filter(|j| !j.is_empty())
            .map_or_else(|| PathBuf::from(runtime), PathBuf::from);
        let classes = root.join("target/debezium-oracle");
        std::fs::create_dir_all(&classes)?;
        let jar_glob = format!("{jars}/*");
        // Every program in tests/debezium is compiled together: the oracle and the
        // benchmark's Debezium drain (bench/src/debezium.rs).
        let mut stale = false;
        let mut sources = Vec::new();
        for program in PROGRAMS {
            let source = root.join(format!("tests/debezium/{program}.java"));
            let compiled = classes.join(format!("{program}.class"));
            stale |= match (std::fs::metadata(&source), std::fs::metadata(&compiled)) {
                (Ok(s), Ok(c)) => s.modified()? > c.modified()?,
                _ => true,
            };
            sources.push(source);
        }
        if stale {
            let out = Command::new(&javac)
                .args(["--release", "17", "-d"])
                .arg(&classes)
                .arg("-cp")
                .arg(&jar_glob)
                .args(&sources)
                .output()
                .context("running javac")?;
            ensure!(
                out.status.success(),
                "javac {} failed:\n{}",
                PROGRAMS.map(|p| format!("{p}.java")).join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Some(Oracle {
            java,
            classpath: format!("{jar_glob}:{}", classes.display()),
        }))
    }

    /// A command running Java class `class` (one of `tests/debezium/*.java`) on the Debezium
    /// jars and the runtime the oracle uses.
    pub fn java_command(&self, class: &str) -> Command {
        let mut command = Command::new(&self.java);
        command.arg("-cp").arg(&self.classpath).arg(class);
        command
    }

    /// Runs `runs` in one JVM (four at a time); `dir` receives the run files, outputs and the
    /// JVM's log (`oracle.log`).
    pub fn run(&self, dir: &Path, runs: &[OracleRun]) -> Result<Vec<OracleOutput>> {
        let mut files = Vec::new();
        for run in runs {
            let mut p = BTreeMap::new();
            let mut set = |k: &str, v: &str| {
                p.insert(k.to_owned(), v.to_owned());
            };
            set("name", &run.name);
            set(
                "connector.class",
                "io.debezium.connector.postgresql.PostgresConnector",
            );
            set(
                "offset.storage",
                "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            );
            set("offset.flush.interval.ms", "60000");
            set("database.hostname", "127.0.0.1");
            set("database.port", &run.pg_port.to_string());
            set("database.user", "siphon");
            set("database.password", "siphon");
            set("database.dbname", "siphon");
            set("plugin.name", "pgoutput");
            set("slot.name", &run.slot);
            set("publication.name", &run.publication);
            set("publication.autocreate.mode", "disabled");
            set("snapshot.mode", "no_data");
            set("table.include.list", &run.table);
            let output = dir.join(format!("{}.out", run.name));
            set("oracle.output", &output.display().to_string());
            set("oracle.expected", &run.expected.to_string());
            set("oracle.partitions", &run.partitions.to_string());
            for (k, v) in &run.router {
                // Connector options Siphon reads from its router section.
                if k == "topic.prefix" || k == "extended.headers.enabled" {
                    p.insert(k.clone(), v.clone());
                } else {
                    p.insert(format!("transforms.outbox.{k}"), v.clone());
                }
            }
            run.key.properties("oracle.key.converter", &mut p);
            run.value.properties("oracle.value.converter", &mut p);
            let file = dir.join(format!("{}.properties", run.name));
            write_properties(&file, &p)?;
            files.push((file, output));
        }
        let log = dir.join("oracle.log");
        let status = self
            .java_command("Oracle")
            .args(files.iter().map(|(f, _)| f))
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(dir.join("oracle.err"))?)
            .status()
            .context("running the oracle JVM")?;
        ensure!(
            status.success(),
            "the oracle failed ({status}); see {}",
            dir.display()
        );
        files
            .iter()
            .map(|(_, output)| {
                let text = std::fs::read_to_string(output)
                    .with_context(|| format!("reading {}", output.display()))?;
                parse_output(&text).with_context(|| format!("parsing {}", output.display()))
            })
            .collect()
    }
}

/// `bytes` as plain lower-case hex digits (`AvroOracle`'s input).
pub fn plain_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Plain hex digits as bytes (`AvroOracle`'s output).
fn from_plain_hex(text: &str) -> Result<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).context("hex"))
        .collect()
}

/// What `AvroOracle` (Debezium's expansion, then Confluent's `AvroData`) made of a payload.
pub enum JavaAvro {
    Avro { schema: String, datum: Vec<u8> },
    Refused(String),
}

/// Runs `AvroOracle` on `payloads` (JSON texts), one answer per payload in order: the Avro
/// schema text and datum Debezium's Avro path writes for the expanded payload, or Java's
/// refusal.
pub fn run_avro_oracle(oracle: &Oracle, payloads: &[String]) -> Result<Vec<JavaAvro>> {
    let mut child = oracle
        .java_command("AvroOracle")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting AvroOracle")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input: String = payloads
        .iter()
        .map(|p| format!("{}\n", plain_hex(p.as_bytes())))
        .collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let stdout = child.stdout.take().context("stdout")?;
    let mut out = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let fields: Vec<&str> = line.split('\t').collect();
        out.push(match fields.as_slice() {
            ["S", schema, datum] => JavaAvro::Avro {
                schema: String::from_utf8(from_plain_hex(schema)?)?,
                datum: from_plain_hex(datum)?,
            },
            ["E", error] => JavaAvro::Refused(String::from_utf8(from_plain_hex(error)?)?),
            _ => bail!("AvroOracle printed {line:?}"),
        });
    }
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success() && out.len() == payloads.len(),
        "AvroOracle: {} ({} of {} answers): {}",
        output.status,
        out.len(),
        payloads.len(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_escaping() {
        assert_eq!(properties_escape("a=b:c"), "a\\=b\\:c");
        assert_eq!(properties_escape(" x\\"), "\\ x\\\\");
        assert_eq!(properties_escape("é😀"), "\\u00e9\\ud83d\\ude00");
    }

    #[test]
    fn parses_lines() -> Result<()> {
        let out =
            parse_output("R\tx61\t1\t5\t-\tx7b7d\t1\tx6964\tx31\nX\tx61\tx31\tx65\nE\tx6f\n")?;
        assert_eq!(out.records.len(), 2);
        assert_eq!(out.records[0].id().as_deref(), Some("1"));
        assert_eq!(out.records[1].id().as_deref(), Some("1"));
        assert_eq!(out.error.as_deref(), Some("o"));
        Ok(())
    }
}
