//! The Apache Kafka a test writes to: a namespace on the broker the whole test run shares, or
//! a node of its own for a test that kills or restarts its broker.
//!
//! A JVM start costs seconds of CPU, so tests share one single-node Kafka
//! ([`crate::kafka::KafkaNode`]): the one at `$SIPHON_BROKER_BOOTSTRAP` (started once for the
//! whole test command by `scripts/test.sh`), else one started on first use in each test
//! process. Each [`Broker::start`] hands out a fresh topic namespace on it, and a test names
//! every topic through [`Broker::topic`], so tests never see each other's records.
//! [`crate::outbox::siphon_config`] routes Siphon's records into the namespace.
//!
//! # Invariants
//!
//! - Namespaces are unique across processes and calls (`t<pid>-<n>.`), so two tests never
//!   write or read the same topic on the shared broker.
//! - A shared broker is never killed or restarted by a test: [`Broker::kill`] and
//!   [`Broker::start_again`] refuse unless the broker is the test's own.
//! - The broker a test process starts for itself lives until the process exits
//!   ([`KafkaNode::start_single_for_process`]): the kernel kills the JVM when the process is
//!   gone, however it ends. Its directory is removed by the next test process that finds it
//!   stale.
//! - A started broker has answered a metadata request through rdkafka.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

use crate::kafka::KafkaNode;

/// The shared broker of this process: its bootstrap address and log, or why it cannot start.
struct Shared {
    bootstrap: String,
    log: Option<PathBuf>,
    /// The node this process started (`None`: the one at `$SIPHON_BROKER_BOOTSTRAP`), kept in
    /// the static for the life of the process.
    _node: Option<KafkaNode>,
}

fn shared() -> Result<&'static Shared> {
    static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| start_shared().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("the shared Kafka broker is not available: {e}"))
}

fn start_shared() -> Result<Shared> {
    if let Some(bootstrap) = std::env::var("SIPHON_BROKER_BOOTSTRAP")
        .ok()
        .filter(|b| !b.trim().is_empty())
    {
        broker_metadata(&bootstrap, Duration::from_secs(10))
            .with_context(|| format!("SIPHON_BROKER_BOOTSTRAP={bootstrap} does not answer"))?;
        let log = std::env::var_os("SIPHON_BROKER_LOG").map(PathBuf::from);
        return Ok(Shared {
            bootstrap,
            log,
            _node: None,
        });
    }
    let node = KafkaNode::start_single_for_process(&[])?;
    Ok(Shared {
        bootstrap: node.bootstrap(),
        log: Some(node.log_path()),
        _node: Some(node),
    })
}

/// Removes the directories of process-lifetime Kafka nodes whose test process is gone.
pub(crate) fn remove_stale_shared_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(crate::kafka::SHARED_DIR_PREFIX))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh topic namespace: `t<pid>-<n>.`.
fn new_namespace() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{}.",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The Kafka a test writes to (see the module docs).
pub struct Broker {
    bootstrap: String,
    namespace: String,
    own: Option<KafkaNode>,
    shared_log: Option<PathBuf>,
}

impl Broker {
    /// A fresh namespace on the shared broker (started first if this process has none).
    pub fn start() -> Result<Broker> {
        let shared = shared()?;
        Ok(Broker {
            bootstrap: shared.bootstrap.clone(),
            namespace: new_namespace(),
            own: None,
            shared_log: shared.log.clone(),
        })
    }

    /// A single-node Kafka of the test's own (for tests that kill or restart their broker),
    /// with Kafka's settings for one node and `extra` on top. Topic names are not namespaced.
    pub fn start_own(extra: &[(&str, &str)]) -> Result<Broker> {
        let node = KafkaNode::start_single(extra)?;
        Ok(Broker {
            bootstrap: node.bootstrap(),
            namespace: String::new(),
            own: Some(node),
            shared_log: None,
        })
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.bootstrap
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_default()
    }

    /// The prefix of every topic this test uses (empty on a broker of its own).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name topic `name` has for this test: `name` in the test's namespace.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }

    /// The broker's log (the shared broker's, when known).
    pub fn log_path(&self) -> PathBuf {
        match (&self.own, &self.shared_log) {
            (Some(node), _) => node.log_path(),
            (None, Some(log)) => log.clone(),
            (None, None) => PathBuf::from("(the shared broker's log is not known)"),
        }
    }

    /// The test's own node; an error on the shared broker.
    pub fn own_node(&self) -> Result<&KafkaNode> {
        self.own.as_ref().context(
            "this test shares its broker with others; start it with Broker::start_own to kill \
             or restart it",
        )
    }

    /// SIGKILLs the test's own broker and waits for it to exit.
    pub fn kill(&self) -> Result<()> {
        self.own_node()?.kill9()
    }

    /// Starts the test's own broker again on the same port and data, after
    /// [`Broker::kill`]; Kafka keeps every topic and record across it.
    pub fn start_again(&self) -> Result<()> {
        let node = self.own_node()?;
        if node.is_running() {
            bail!("broker on {} is still running", self.bootstrap);
        }
        node.start_again(1)
    }

    /// Whether the broker is alive (the shared one: whether it answers metadata).
    pub fn is_running(&self) -> bool {
        match &self.own {
            Some(node) => node.is_running(),
            None => self.check_metadata(Duration::from_secs(5)).is_ok(),
        }
    }

    /// One metadata request through rdkafka: Ok if the broker answered within
    /// `timeout` and listed itself.
    pub fn check_metadata(&self, timeout: Duration) -> Result<()> {
        broker_metadata(&self.bootstrap, timeout).map(|_| ())
    }
}

/// One metadata request to `bootstrap` that must list at least one broker.
pub fn broker_metadata(bootstrap: &str, timeout: Duration) -> Result<rdkafka::metadata::Metadata> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        // Fail fast instead of retrying in the background.
        .set("reconnect.backoff.max.ms", "100")
        .create()
        .context("creating an rdkafka client")?;
    let md = consumer
        .fetch_metadata(None, timeout)
        .with_context(|| format!("metadata request to {bootstrap}"))?;
    if md.brokers().is_empty() {
        bail!("metadata from {bootstrap} lists no brokers");
    }
    Ok(md)
}
