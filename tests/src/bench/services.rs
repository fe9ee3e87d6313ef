//! The PostgreSQL server and Kafka broker the benchmark runs against: given by URL, or started
//! through the test harness (and stopped when [`Services`] is dropped).

use anyhow::{bail, Context as _, Result};
use siphon_tests::{Broker, Postgres};
use std::path::PathBuf;

pub struct Services {
    /// Kept only to be stopped on drop.
    _pg: Option<Postgres>,
    broker: Option<Broker>,
    pub pg_url: String,
    pub bootstrap: String,
    pub recvlogical: PathBuf,
}

impl Services {
    /// Starts what was not given. Blocks while the services start.
    pub fn start(
        pg_url: Option<String>,
        bootstrap: Option<String>,
        recvlogical: Option<PathBuf>,
    ) -> Result<Services> {
        let recvlogical = match recvlogical {
            Some(p) => p,
            None => find_recvlogical()?,
        };
        let (pg, pg_url) = match pg_url {
            Some(url) => (None, url),
            None => {
                let pg = Postgres::start().context("starting a scratch PostgreSQL")?;
                let url = pg.url();
                (Some(pg), url)
            }
        };
        let (broker, bootstrap) = match bootstrap {
            Some(b) => (None, b),
            None => {
                let broker = Broker::start().context("starting a Tansu broker")?;
                let b = broker.bootstrap();
                (Some(broker), b)
            }
        };
        Ok(Services {
            _pg: pg,
            broker,
            pg_url,
            bootstrap,
            recvlogical,
        })
    }

    /// Restarts the broker this run started, which (memory engine) comes back empty. Returns
    /// false for a broker given with `--bootstrap`, which is left alone. Blocks.
    pub fn restart_broker(&self) -> Result<bool> {
        let Some(broker) = &self.broker else {
            return Ok(false);
        };
        broker.kill()?;
        broker.start_again()?;
        Ok(true)
    }

    /// Connects to the database; the connection runs on a spawned task.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.pg_url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {}", self.pg_url))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// `$SIPHON_PG_BIN/pg_recvlogical`, else the newest `/usr/lib/postgresql/*/bin/pg_recvlogical`.
fn find_recvlogical() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SIPHON_PG_BIN").filter(|d| !d.is_empty()) {
        let p = PathBuf::from(dir).join("pg_recvlogical");
        if p.is_file() {
            return Ok(p);
        }
        bail!("{} does not exist", p.display());
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("listing /usr/lib/postgresql (is PostgreSQL installed? scripts/install-deps.sh)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let p = e.path().join("bin/pg_recvlogical");
            p.is_file().then_some((version, p))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => Ok(p),
        None => bail!("no /usr/lib/postgresql/*/bin/pg_recvlogical; pass --pg-recvlogical"),
    }
}
