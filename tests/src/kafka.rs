//! Apache Kafka for the end-to-end tests: KRaft nodes started from the jars that
//! `scripts/install-kafka.sh` caches, on their own or as a three-node cluster.
//!
//! A [`KafkaNode`] is one JVM in combined mode (`process.roles=broker,controller`), formatted
//! with `kafka.tools.StorageTool` and started with `kafka.Kafka`. A [`KafkaCluster`] is three of
//! them voting in one static controller quorum, with replication factor 3,
//! `min.insync.replicas=2`, no unclean leader election and short session timeouts, so a killed
//! node is noticed in seconds.
//!
//! # Invariants
//!
//! - Every listener binds 127.0.0.1 on a port from [`free_port`](crate::free_port) (below
//!   32768 on Linux's default ephemeral range); a node keeps its ports and its data directory
//!   for the life of its handle, so [`KafkaNode::kill9`] then [`KafkaNode::start_again`] brings
//!   back the same broker with its data.
//! - A node is ready only once a metadata round trip through it lists every broker expected
//!   (never after a sleep); a node that exits while starting fails with its log's tail.
//! - A node started again is ready only once, besides, every partition its data directory
//!   holds is listed with a leader: a broker recovering its logs after `kill -9` answers
//!   metadata before its topics can be read.
//! - Every JVM carries `-Dsiphon.test.kafka=<dir>`, so a test command can find and kill what a
//!   crashed test process left behind.
//! - Dropping a handle SIGKILLs its JVMs and removes their directories, unless the thread is
//!   panicking or `SIPHON_KEEP_TEST_DIRS` is set (the log's tail is printed then).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

/// The Apache Kafka version `scripts/install-kafka.sh` installs.
pub const KAFKA_VERSION: &str = "4.4.0";

/// Directory prefix (under `/tmp`) of the broker a test process starts for itself; the pid
/// follows.
pub(crate) const SHARED_DIR_PREFIX: &str = "siphon-kafka-shared-";

/// How long a node or cluster may take to answer metadata after its JVMs start.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Directory of the Kafka jars: `$SIPHON_BROKER_LIBS`, else
/// `${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/kafka-<version>/libs`.
pub fn kafka_libs() -> Result<PathBuf> {
    let path = match std::env::var_os("SIPHON_BROKER_LIBS") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => crate::cache_dir()
            .join(format!("kafka-{KAFKA_VERSION}"))
            .join("libs"),
    };
    let broker_jar = path.join(format!("kafka_2.13-{KAFKA_VERSION}.jar"));
    if !broker_jar.is_file() {
        bail!(
            "Apache Kafka {KAFKA_VERSION} not found ({} is missing); run scripts/install-kafka.sh \
             (or scripts/install-deps.sh), or set SIPHON_BROKER_LIBS",
            broker_jar.display()
        );
    }
    Ok(path)
}

/// The logging configuration the nodes run with (`scripts/kafka/log4j2.yaml`).
fn log4j_config() -> PathBuf {
    crate::workspace_root().join("scripts/kafka/log4j2.yaml")
}

/// The `java` that runs the broker: `$SIPHON_BROKER_JAVA`, else `java` on the `PATH`.
fn java() -> PathBuf {
    std::env::var_os("SIPHON_BROKER_JAVA")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("java"), PathBuf::from)
}

/// JVM options of a test node: a small heap, and the client compiler only, which starts a
/// broker in about half the CPU time (`$SIPHON_BROKER_JVM_OPTS` replaces them).
fn jvm_options() -> Vec<String> {
    match std::env::var("SIPHON_BROKER_JVM_OPTS") {
        Ok(opts) if !opts.trim().is_empty() => opts.split_whitespace().map(str::to_owned).collect(),
        _ => [
            "-Xms128m",
            "-Xmx768m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
        ]
        .map(str::to_owned)
        .to_vec(),
    }
}

/// Whether a node runs in a session of its own (`$SIPHON_BROKER_OWN_SESSION` = `1`), as a
/// service does: Linux's scheduler then gives it its own share of the cores (autogroup), apart
/// from the process that started it. The bench sets it.
fn own_session() -> bool {
    std::env::var("SIPHON_BROKER_OWN_SESSION").is_ok_and(|v| v == "1")
}

/// Where a node listens and how it takes part in its quorum.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `node.id`, from 1.
    pub id: u32,
    /// The client (PLAINTEXT) listener's port.
    pub port: u16,
    /// The controller listener's port.
    pub controller_port: u16,
    /// The port the node advertises to clients (its own port unless a proxy sits in front).
    pub advertised_port: u16,
    /// A SASL_PLAINTEXT listener's port too, when set (see [`KafkaNode::start_single_with_sasl`]).
    pub sasl_port: Option<u16>,
    /// `controller.quorum.voters`: `id@127.0.0.1:port` of every voter.
    pub voters: String,
    /// Extra `server.properties` lines.
    pub extra: Vec<(String, String)>,
}

/// Broker settings shared by every test node: Kafka's defaults except where a test needs a
/// quicker answer (no initial rebalance delay, few internal partitions).
const COMMON_SETTINGS: &[(&str, &str)] = &[
    ("process.roles", "broker,controller"),
    ("controller.listener.names", "CONTROLLER"),
    (
        "listener.security.protocol.map",
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    ),
    ("inter.broker.listener.name", "PLAINTEXT"),
    ("group.initial.rebalance.delay.ms", "0"),
    ("offsets.topic.num.partitions", "5"),
    ("transaction.state.log.num.partitions", "5"),
    // Topics are created by Siphon (3 partitions in the tests' configuration) or by a test;
    // one auto-created by a metadata request gets Kafka's default of one partition.
    ("num.partitions", "1"),
    ("auto.create.topics.enable", "true"),
    ("log.segment.bytes", "16777216"),
];

/// Settings of a single node: every internal topic at replication factor 1.
pub const SINGLE_NODE_SETTINGS: &[(&str, &str)] = &[
    ("offsets.topic.replication.factor", "1"),
    ("transaction.state.log.replication.factor", "1"),
    ("transaction.state.log.min.isr", "1"),
    ("share.coordinator.state.topic.replication.factor", "1"),
    ("share.coordinator.state.topic.min.isr", "1"),
];

/// Settings of the three-node cluster: replication factor 3, two replicas in sync for a write,
/// never an out-of-sync leader, and a dead node noticed within seconds.
pub const CLUSTER_SETTINGS: &[(&str, &str)] = &[
    ("default.replication.factor", "3"),
    ("min.insync.replicas", "2"),
    ("unclean.leader.election.enable", "false"),
    ("offsets.topic.replication.factor", "3"),
    ("transaction.state.log.replication.factor", "3"),
    ("transaction.state.log.min.isr", "2"),
    ("share.coordinator.state.topic.replication.factor", "3"),
    ("share.coordinator.state.topic.min.isr", "2"),
    ("broker.session.timeout.ms", "3000"),
    ("broker.heartbeat.interval.ms", "500"),
    ("replica.lag.time.max.ms", "4000"),
    ("controller.quorum.election.timeout.ms", "1000"),
    ("controller.quorum.fetch.timeout.ms", "2000"),
];

impl NodeSpec {
    fn server_properties(&self, data_dir: &Path) -> String {
        let sasl = self
            .sasl_port
            .map(|port| format!(",SASL_PLAINTEXT://127.0.0.1:{port}"))
            .unwrap_or_default();
        let mut lines = vec![
            format!("node.id={}", self.id),
            format!("controller.quorum.voters={}", self.voters),
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}{sasl}",
                self.port, self.controller_port
            ),
            format!(
                "advertised.listeners=PLAINTEXT://127.0.0.1:{}{sasl}",
                self.advertised_port
            ),
            format!("log.dirs={}", data_dir.display()),
        ];
        for (k, v) in COMMON_SETTINGS {
            lines.push(format!("{k}={v}"));
        }
        if self.sasl_port.is_some() {
            // A later line overrides an earlier one of the same key.
            lines.push(
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,\
                 SASL_PLAINTEXT:SASL_PLAINTEXT"
                    .to_owned(),
            );
        }
        for (k, v) in &self.extra {
            lines.push(format!("{k}={v}"));
        }
        lines.join("\n") + "\n"
    }
}

/// One Kafka JVM in combined mode.
pub struct KafkaNode {
    spec: NodeSpec,
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    libs: PathBuf,
    child: Mutex<Option<Child>>,
    /// Whether the node lives as long as the test process: its JVM is spawned by
    /// [`spawn_for_process`], so the kernel kills it when the process is gone.
    for_process: bool,
}

impl KafkaNode {
    /// A single node on free ports, its own quorum of one, with `extra` settings on top of
    /// [`SINGLE_NODE_SETTINGS`]; waits until it answers metadata.
    pub fn start_single(extra: &[(&str, &str)]) -> Result<KafkaNode> {
        let node = Self::prepare_single(None, extra, None, None)?;
        node.format(&new_cluster_id(&node.libs)?)?;
        node.spawn()?;
        node.wait_ready(1)?;
        Ok(node)
    }

    /// A single node (as [`KafkaNode::start_single`]) that also listens for SASL_PLAINTEXT
    /// clients ([`KafkaNode::sasl_bootstrap`]; mechanism PLAIN with the `users` given as (name,
    /// password), and SCRAM-SHA-256 with the credentials [`KafkaNode::set_scram_password`]
    /// sets) and authorizes with Kafka's `StandardAuthorizer`: a SASL client, `User:<name>`,
    /// may do only what ACLs grant it (none at first), while the PLAINTEXT listener's clients
    /// (the tests' own, `User:ANONYMOUS`) are super users. `extra` settings go on top.
    pub fn start_single_with_sasl(
        users: &[(&str, &str)],
        extra: &[(&str, &str)],
    ) -> Result<KafkaNode> {
        Self::sasl_node(users, extra, false)
    }

    /// Like [`KafkaNode::start_single_with_sasl`], for a node the tests of one process share:
    /// it lives as long as the process ([`KafkaNode::start_single_for_process`]).
    pub fn start_single_with_sasl_for_process(
        users: &[(&str, &str)],
        extra: &[(&str, &str)],
    ) -> Result<KafkaNode> {
        Self::sasl_node(users, extra, true)
    }

    fn sasl_node(
        users: &[(&str, &str)],
        extra: &[(&str, &str)],
        for_process: bool,
    ) -> Result<KafkaNode> {
        let logins: String = users
            .iter()
            .map(|(name, password)| format!(" user_{name}=\"{password}\""))
            .collect();
        let jaas =
            format!("org.apache.kafka.common.security.plain.PlainLoginModule required{logins};");
        let mut settings = vec![
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256"),
            ("listener.name.sasl_plaintext.plain.sasl.jaas.config", &jaas),
            (
                "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config",
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            ),
            (
                "authorizer.class.name",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            ),
            ("super.users", "User:ANONYMOUS"),
            ("allow.everyone.if.no.acl.found", "false"),
        ];
        settings.extend_from_slice(extra);
        let prefix = for_process.then(process_dir_prefix);
        let mut node =
            Self::prepare_single(None, &settings, prefix.as_deref(), Some(crate::free_port()))?;
        node.for_process = for_process;
        node.format(&new_cluster_id(&node.libs)?)?;
        node.spawn()?;
        node.wait_ready(1)?;
        Ok(node)
    }

    /// Grants `principal` (e.g. `User:siphon`) each of `acls`, written
    /// `RESOURCE:PATTERN:OPERATION:NAME` (e.g. `TOPIC:PREFIXED:WRITE:orders.`), through the
    /// PLAINTEXT listener with Kafka's own admin client (`tests/kafka/Acls.java`).
    pub fn grant(&self, principal: &str, acls: &[&str]) -> Result<()> {
        let mut args = vec![principal];
        args.extend_from_slice(acls);
        self.run_admin_program("Acls.java", &args)
            .with_context(|| format!("granting {principal} {acls:?}"))
    }

    /// Deletes every ACL of `principal`, on any resource (`tests/kafka/Acls.java`).
    pub fn revoke_all(&self, principal: &str) -> Result<()> {
        self.run_admin_program("Acls.java", &[principal, "--revoke-all"])
            .with_context(|| format!("revoking every ACL of {principal}"))
    }

    /// Sets `user`'s SCRAM-SHA-256 password (creating the credential, or replacing the password
    /// as an operator rotating it does), through the PLAINTEXT listener with Kafka's own admin
    /// client (`tests/kafka/ScramCredential.java`). Connections already logged in stay so until
    /// they log in again.
    pub fn set_scram_password(&self, user: &str, password: &str) -> Result<()> {
        self.run_admin_program("ScramCredential.java", &[user, "SCRAM-SHA-256", password])
            .with_context(|| format!("setting the SCRAM credential of {user}"))
    }

    /// Runs the Java program `tests/kafka/<program>` with the broker's jars, its bootstrap
    /// address and `args`; fails with its stderr if it does. The programs are compiled once
    /// ([`admin_classes`]); without `javac` each runs from its source.
    fn run_admin_program(&self, program: &str, args: &[&str]) -> Result<()> {
        let program = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("kafka")
            .join(program);
        let mut command = Command::new(java());
        match admin_classes(&self.libs) {
            Some(classes) => command
                .args([
                    "-cp",
                    &format!("{}/*:{}", self.libs.display(), classes.display()),
                ])
                .arg(program.file_stem().unwrap_or_default()),
            None => command
                .args(["-cp", &format!("{}/*", self.libs.display())])
                .arg(&program),
        };
        let output = command
            .arg(self.bootstrap())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        ensure!(
            output.status.success(),
            "{} failed ({}): {}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// `127.0.0.1:PORT` of the SASL_PLAINTEXT listener, if the node has one.
    pub fn sasl_bootstrap(&self) -> Option<String> {
        self.spec.sasl_port.map(|port| format!("127.0.0.1:{port}"))
    }

    /// Like [`KafkaNode::start_single`], advertising `advertised_port` (a proxy's) instead of
    /// its own port; readiness is then checked on its own port directly.
    pub fn start_single_advertising(
        advertised_port: u16,
        extra: &[(&str, &str)],
    ) -> Result<KafkaNode> {
        let node = Self::prepare_single(Some(advertised_port), extra, None, None)?;
        node.format(&new_cluster_id(&node.libs)?)?;
        node.spawn()?;
        node.wait_ready(1)?;
        Ok(node)
    }

    /// Like [`KafkaNode::start_single`], for a node that lives as long as the test process: the
    /// JVM is killed by the kernel when the process is gone ([`spawn_for_process`]), and its
    /// directory is named after the process (see [`crate::broker`]). The handle must never be
    /// dropped while the process runs.
    pub(crate) fn start_single_for_process(extra: &[(&str, &str)]) -> Result<KafkaNode> {
        let mut node = Self::prepare_single(None, extra, Some(&process_dir_prefix()), None)?;
        node.for_process = true;
        node.format(&new_cluster_id(&node.libs)?)?;
        node.spawn()?;
        node.wait_ready(1)?;
        Ok(node)
    }

    fn prepare_single(
        advertised: Option<u16>,
        extra: &[(&str, &str)],
        dir_prefix: Option<&str>,
        sasl_port: Option<u16>,
    ) -> Result<KafkaNode> {
        let port = crate::free_port();
        let controller_port = crate::free_port();
        let mut settings: Vec<(String, String)> = SINGLE_NODE_SETTINGS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        KafkaNode::new_in(
            NodeSpec {
                id: 1,
                port,
                controller_port,
                advertised_port: advertised.unwrap_or(port),
                sasl_port,
                voters: format!("1@127.0.0.1:{controller_port}"),
                extra: settings,
            },
            dir_prefix,
        )
    }

    /// A node for `spec`, with a fresh directory; not formatted, not started.
    pub fn new(spec: NodeSpec) -> Result<KafkaNode> {
        Self::new_in(spec, None)
    }

    fn new_in(spec: NodeSpec, dir_prefix: Option<&str>) -> Result<KafkaNode> {
        let libs = kafka_libs()?;
        let dir = match dir_prefix {
            Some(prefix) => crate::short_tempdir(prefix)?,
            None => crate::short_tempdir(&format!("siphon-kafka{}-", spec.id))?,
        };
        let node = KafkaNode {
            spec,
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            libs,
            child: Mutex::new(None),
            for_process: false,
        };
        std::fs::write(
            node.properties_path(),
            node.spec.server_properties(&node.data_dir()),
        )
        .context("writing server.properties")?;
        Ok(node)
    }

    /// `node.id`.
    pub fn id(&self) -> u32 {
        self.spec.id
    }

    /// The client listener's port.
    pub fn port(&self) -> u16 {
        self.spec.port
    }

    /// `127.0.0.1:PORT` of the client listener, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.spec.port)
    }

    /// The node's stdout/stderr log (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join("kafka.log")
    }

    /// The node's directory (configuration, data, log).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    fn data_dir(&self) -> PathBuf {
        self.dir_path.join("data")
    }

    fn properties_path(&self) -> PathBuf {
        self.dir_path.join("server.properties")
    }

    fn java_command(&self, main_class: &str) -> Command {
        let mut cmd = Command::new(java());
        cmd.args(jvm_options())
            .arg(format!("-Dsiphon.test.kafka={}", self.dir_path.display()))
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                log4j_config().display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display()))
            .arg(main_class)
            .current_dir(&self.dir_path)
            .env_remove("KAFKA_HEAP_OPTS")
            .env_remove("KAFKA_OPTS")
            .stdin(Stdio::null());
        cmd
    }

    /// Formats the data directory for cluster `cluster_id` (`kafka.tools.StorageTool format`).
    pub fn format(&self, cluster_id: &str) -> Result<()> {
        let output = self
            .java_command("kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", cluster_id, "-c"])
            .arg(self.properties_path())
            .output()
            .context("running kafka.tools.StorageTool format")?;
        ensure!(
            output.status.success(),
            "formatting Kafka node {} failed ({}):\n{}{}",
            self.spec.id,
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// Starts the JVM (`kafka.Kafka server.properties`) without waiting for it.
    pub fn spawn(&self) -> Result<()> {
        if self.is_running() {
            bail!("Kafka node {} is still running", self.spec.id);
        }
        let log_path = self.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut command = self.java_command("kafka.Kafka");
        command
            .arg(self.properties_path())
            .stdout(log.try_clone().context("duplicating the log handle")?)
            .stderr(log);
        if own_session() {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setsid(2) is async-signal-safe, and nothing else runs in the child
            // between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = if self.for_process {
            spawn_for_process(command)
        } else {
            command.spawn()
        }
        .with_context(|| format!("spawning {} for Kafka", java().display()))?;
        *self.lock() = Some(child);
        Ok(())
    }

    /// Waits until a metadata request to this node lists `brokers` brokers.
    pub fn wait_ready(&self, brokers: usize) -> Result<()> {
        self.wait_for_metadata(brokers, &[])
    }

    /// Waits until a metadata request to this node lists `brokers` brokers and every partition
    /// of `held` with a leader; fails with the log's tail if the node exits meanwhile.
    fn wait_for_metadata(&self, brokers: usize, held: &[(String, i32)]) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_err = anyhow!("no metadata request made");
        while Instant::now() < deadline {
            if !self.is_running() {
                bail!(
                    "Kafka node {} exited while starting; last lines of {}:\n{}",
                    self.spec.id,
                    self.log_path().display(),
                    crate::tail_file(&self.log_path(), 30)
                );
            }
            match crate::broker::broker_metadata(&self.bootstrap(), Duration::from_secs(2)) {
                Ok(md) if md.brokers().len() < brokers => {
                    last_err = anyhow!("{} of {brokers} brokers listed", md.brokers().len())
                }
                Ok(md) => {
                    let leaderless = held.iter().filter(|(topic, partition)| {
                        !md.topics().iter().any(|t| {
                            t.name() == topic
                                && t.error().is_none()
                                && t.partitions().iter().any(|p| {
                                    p.id() == *partition && p.error().is_none() && p.leader() >= 0
                                })
                        })
                    });
                    match leaderless.clone().next() {
                        None => return Ok(()),
                        Some(first) => {
                            last_err = anyhow!(
                                "{} of the {} partitions on disk not listed with a leader, e.g. {first:?}",
                                leaderless.count(),
                                held.len()
                            )
                        }
                    }
                }
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last_err.context(format!(
            "Kafka node {} on {} not ready within {READY_TIMEOUT:?} (log: {})",
            self.spec.id,
            self.bootstrap(),
            self.log_path().display()
        )))
    }

    /// SIGKILLs the JVM and waits for it to exit; a no-op if it is not running.
    pub fn kill9(&self) -> Result<()> {
        if let Some(mut child) = self.lock().take() {
            // Fails only if the process was reaped already, which `wait` reports.
            let _ = child.kill();
            child.wait().context("waiting for the killed Kafka node")?;
        }
        Ok(())
    }

    /// Stops the JVM with SIGTERM (a controlled shutdown: leadership moves first) and waits
    /// up to `timeout` for it, then SIGKILLs it.
    pub fn stop(&self, timeout: Duration) -> Result<()> {
        let mut guard = self.lock();
        let Some(child) = guard.as_mut() else {
            return Ok(());
        };
        let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
        // SAFETY: kill(2) on the pid of a child this handle owns and has not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                guard.take();
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(guard);
        self.kill9()
    }

    /// Starts the node again on the same ports and data, after [`KafkaNode::kill9`] or
    /// [`KafkaNode::stop`], and waits until it answers metadata listing `brokers` brokers.
    /// Also waits until every partition the node's data directory holds is listed with a
    /// leader.
    pub fn start_again(&self, brokers: usize) -> Result<()> {
        let held = self.partitions_on_disk()?;
        self.spawn()?;
        self.wait_for_metadata(brokers, &held)
    }

    /// The `(topic, partition)` logs in the data directory ([`partition_log`]).
    fn partitions_on_disk(&self) -> Result<Vec<(String, i32)>> {
        let data = self.data_dir();
        let mut held = Vec::new();
        for entry in
            std::fs::read_dir(&data).with_context(|| format!("listing {}", data.display()))?
        {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                held.extend(partition_log(&entry.file_name().to_string_lossy()));
            }
        }
        Ok(held)
    }

    /// Whether the JVM is alive.
    pub fn is_running(&self) -> bool {
        let mut guard = self.lock();
        match guard.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                *guard = None;
                false
            }
            None => false,
        }
    }

    /// The JVM's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        // A poisoned lock means a panic while holding it; the Option<Child> is still whole.
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for KafkaNode {
    fn drop(&mut self) {
        if let Err(e) = self.kill9() {
            eprintln!("Kafka node {}: {e:#}", self.spec.id);
        }
        if let Some(dir) = self.dir.take() {
            crate::finish_dir(
                dir,
                &format!("kafka node {}", self.spec.id),
                &self.log_path(),
                false,
            );
        }
    }
}

/// A new cluster id from `kafka.tools.StorageTool random-uuid`.
fn new_cluster_id(libs: &Path) -> Result<String> {
    let output = Command::new(java())
        .args(["-cp", &format!("{}/*", libs.display())])
        .args(["kafka.tools.StorageTool", "random-uuid"])
        .stdin(Stdio::null())
        .output()
        .context("running kafka.tools.StorageTool random-uuid")?;
    let id = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    ensure!(
        output.status.success() && id.len() == 22,
        "kafka.tools.StorageTool random-uuid failed ({}): {id}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(id)
}

/// The admin programs of `tests/kafka` compiled against the broker's jars in `libs`, once for
/// every test process: in `target/tmp/kafka-admin-<hash of the sources>`, each process
/// compiling into a directory of its own and renaming it into place (the first wins). `None`
/// when they cannot be compiled (no `javac` beside `java`).
fn admin_classes(libs: &Path) -> Option<&'static Path> {
    static CLASSES: OnceLock<Option<PathBuf>> = OnceLock::new();
    CLASSES
        .get_or_init(|| {
            use std::hash::{Hash as _, Hasher as _};
            let sources_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka");
            let mut sources: Vec<PathBuf> = std::fs::read_dir(&sources_dir)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "java"))
                .collect();
            sources.sort();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for source in &sources {
                std::fs::read(source).ok()?.hash(&mut hasher);
            }
            libs.hash(&mut hasher);
            let tmp = crate::workspace_root().join("target/tmp");
            let dir = tmp.join(format!("kafka-admin-{:016x}", hasher.finish()));
            if dir.is_dir() {
                return Some(dir);
            }
            std::fs::create_dir_all(&tmp).ok()?;
            let building = tmp.join(format!("kafka-admin-building-{}", std::process::id()));
            let javac = java().with_file_name("javac");
            let compiled = Command::new(&javac)
                .args(["-cp", &format!("{}/*", libs.display())])
                .arg("-d")
                .arg(&building)
                .args(&sources)
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success());
            if !compiled || std::fs::rename(&building, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&building);
            }
            dir.is_dir().then_some(dir)
        })
        .as_deref()
}

/// The directory prefix of a node that lives as long as this process: a later process that
/// finds it with this process gone removes it, the first time it asks for a prefix.
fn process_dir_prefix() -> String {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(crate::broker::remove_stale_shared_dirs);
    format!("{SHARED_DIR_PREFIX}{}-", std::process::id())
}

/// Spawns `command` from a thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG`: the kernel kills the child when that thread, so the process, is gone,
/// however the process ends. (The signal follows the thread that spawned the child, so a
/// node spawned again by a test's own thread would die with that test.)
pub(crate) fn spawn_for_process(mut command: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt as _;
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    // SAFETY: prctl(2) is async-signal-safe, and nothing else runs in the child between fork
    // and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        // Never joined: it ends with the process, which is when its children must end.
        let _ = std::thread::Builder::new()
            .name("process-children".into())
            .spawn(move || {
                for (mut command, answer) in rx {
                    let _ = answer.send(command.spawn());
                }
                loop {
                    std::thread::park();
                }
            });
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, tx))
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?
}

/// Three Kafka nodes in one KRaft quorum, every one a broker and a controller.
pub struct KafkaCluster {
    nodes: Vec<KafkaNode>,
}

impl KafkaCluster {
    /// Formats and starts three nodes with [`CLUSTER_SETTINGS`] (and `extra` on top) and
    /// waits until every node answers metadata listing all three.
    pub fn start(extra: &[(&str, &str)]) -> Result<KafkaCluster> {
        Self::start_with(extra, false)
    }

    /// Like [`KafkaCluster::start`], for a cluster the tests of one process share: its nodes
    /// live as long as the process ([`KafkaNode::start_single_for_process`]), whoever starts
    /// them again.
    pub fn start_for_process(extra: &[(&str, &str)]) -> Result<KafkaCluster> {
        Self::start_with(extra, true)
    }

    fn start_with(extra: &[(&str, &str)], for_process: bool) -> Result<KafkaCluster> {
        const NODES: u32 = 3;
        let ports: Vec<(u16, u16)> = (0..NODES)
            .map(|_| (crate::free_port(), crate::free_port()))
            .collect();
        let voters = ports
            .iter()
            .zip(1..)
            .map(|((_, controller), id)| format!("{id}@127.0.0.1:{controller}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut settings: Vec<(String, String)> = CLUSTER_SETTINGS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let nodes = ports
            .iter()
            .zip(1..)
            .map(|(&(port, controller_port), id)| {
                let spec = NodeSpec {
                    id,
                    port,
                    controller_port,
                    advertised_port: port,
                    sasl_port: None,
                    voters: voters.clone(),
                    extra: settings.clone(),
                };
                let prefix = for_process.then(process_dir_prefix);
                let mut node = KafkaNode::new_in(spec, prefix.as_deref())?;
                node.for_process = for_process;
                Ok(node)
            })
            .collect::<Result<Vec<_>>>()?;
        let cluster_id = new_cluster_id(&nodes[0].libs)?;
        std::thread::scope(|s| {
            let formats: Vec<_> = nodes
                .iter()
                .map(|n| s.spawn(|| n.format(&cluster_id)))
                .collect();
            formats
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow!("formatting panicked"))?)
                .collect::<Result<Vec<()>>>()
        })?;
        for node in &nodes {
            node.spawn()?;
        }
        let cluster = KafkaCluster { nodes };
        for node in &cluster.nodes {
            node.wait_ready(cluster.nodes.len())?;
        }
        Ok(cluster)
    }

    /// Every node's client address, comma-separated, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(KafkaNode::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, by position (node id = position + 1).
    pub fn nodes(&self) -> &[KafkaNode] {
        &self.nodes
    }

    /// The node with `node.id` `id`.
    pub fn node(&self, id: u32) -> Result<&KafkaNode> {
        self.nodes
            .iter()
            .find(|n| n.id() == id)
            .with_context(|| format!("no Kafka node {id}"))
    }

    /// The node id leading `topic`'s `partition`, by a metadata request to any running node.
    pub fn leader_of(&self, topic: &str, partition: i32) -> Result<i32> {
        let md = self.metadata()?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .with_context(|| format!("topic {topic} not in metadata"))?;
        let p = t
            .partitions()
            .iter()
            .find(|p| p.id() == partition)
            .with_context(|| format!("{topic}/{partition} not in metadata"))?;
        ensure!(p.leader() >= 0, "{topic}/{partition} has no leader");
        Ok(p.leader())
    }

    /// One metadata answer from the first running node that gives one.
    pub fn metadata(&self) -> Result<rdkafka::metadata::Metadata> {
        let mut last = anyhow!("no Kafka node is running");
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            match crate::broker::broker_metadata(&node.bootstrap(), Duration::from_secs(5)) {
                Ok(md) => return Ok(md),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Restarts node `id` after it was killed or stopped, and waits until it answers
    /// metadata listing all three brokers.
    pub fn restart(&self, id: u32) -> Result<()> {
        let n = self.nodes.len();
        self.node(id)?.start_again(n)
    }
}

/// The `(topic, partition)` a log directory named `name` holds (`<topic>-<partition>`), or
/// `None` for the cluster's metadata log and for logs marked for deletion, stray or future
/// (`<topic>-<partition>.<id>-delete`).
fn partition_log(name: &str) -> Option<(String, i32)> {
    let (topic, partition) = name.rsplit_once('-')?;
    let partition = partition.parse::<i32>().ok()?;
    (topic != "__cluster_metadata").then(|| (topic.to_owned(), partition))
}

impl KafkaNode {
    /// The cluster id the node's data directory was formatted with (its `meta.properties`).
    pub fn cluster_id(&self) -> Result<String> {
        let path = self.data_dir().join("meta.properties");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.lines()
            .find_map(|line| line.trim().strip_prefix("cluster.id="))
            .map(|id| id.trim().to_owned())
            .with_context(|| format!("no cluster.id in {}", path.display()))
    }

    /// Empties the data directory of a node that is not running and formats it again with the
    /// same cluster id and node id, as a broker whose disks were replaced: started again
    /// ([`KafkaNode::start_again`]) it has no topics, no records and no producer state.
    pub fn wipe_data(&self) -> Result<()> {
        ensure!(
            !self.is_running(),
            "Kafka node {} is running; kill or stop it before wiping its data",
            self.spec.id
        );
        let cluster_id = self.cluster_id()?;
        let data = self.data_dir();
        std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
        self.format(&cluster_id)?;
        ensure!(
            self.cluster_id()? == cluster_id,
            "Kafka node {} was formatted with another cluster id",
            self.spec.id
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::partition_log;

    #[test]
    fn log_directories_name_their_partitions() {
        for (name, held) in [
            ("orders-0", Some(("orders", 0))),
            ("outbox.event.Order-12", Some(("outbox.event.Order", 12))),
            ("with-dashes-in-it-3", Some(("with-dashes-in-it", 3))),
            ("__consumer_offsets-49", Some(("__consumer_offsets", 49))),
            ("__cluster_metadata-0", None),
            ("orders-0.9f3c2b1a4d5e6f708192a3b4c5d6e7f8-delete", None),
            ("orders-1.9f3c2b1a4d5e6f708192a3b4c5d6e7f8-stray", None),
            ("meta.properties", None),
        ] {
            assert_eq!(
                partition_log(name),
                held.map(|(t, p)| (t.to_owned(), p)),
                "{name}"
            );
        }
    }
}
