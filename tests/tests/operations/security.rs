//! Security against a real PostgreSQL: TLS on both connections (`sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey` in `source.url`), SCRAM-SHA-256 passwords, client certificates, and a
//! least-privilege role.
//!
//! Certificates are made per test with the `openssl` command: a test CA, a server certificate for
//! `127.0.0.1` and `localhost`, a client certificate for the role `siphon_cert`, and an unrelated
//! CA.

use anyhow::{ensure, Context, Result};
use siphon_tests::outbox::{event, insert_transaction, siphon_config, OUTBOX_DDL};
use siphon_tests::postgres::PostgresOptions;
use siphon_tests::{
    read_topic_async, strip_ansi, wait_for, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tokio_postgres::Client;

const EXIT_DEFINITE: i32 = 2;
const TOPICS: [&str; 2] = ["outbox.event.Order", "outbox.event.Customer"];
/// The password of the role Siphon logs in as; it must never show in Siphon's log.
const PASSWORD: &str = "Pw-7f3e2a-never-logged";

/// Test certificates in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Result<Pki> {
        let dir = tempfile::Builder::new()
            .prefix("siphon-pki-")
            .tempdir_in("/tmp")?;
        let pki = Pki { dir };
        pki.ca("ca", "Siphon test CA")?;
        pki.ca("other-ca", "Unrelated CA")?;
        pki.leaf(
            "server",
            "127.0.0.1",
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )?;
        pki.leaf("client", "siphon_cert", "extendedKeyUsage=clientAuth\n")?;
        Ok(pki)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The server's files as `scripts/postgres.sh --tls` wants them.
    fn server_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .context("running openssl (apt-get install openssl)")?;
        ensure!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn new_key_and_csr(&self, name: &str, cn: &str) -> Result<()> {
        self.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ])
    }

    fn ca(&self, name: &str, cn: &str) -> Result<()> {
        self.new_key_and_csr(name, cn)?;
        std::fs::write(
            self.path(&format!("{name}.ext")),
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash\n",
        )?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-signkey",
            &format!("{name}.key"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ])
    }

    fn leaf(&self, name: &str, cn: &str, extensions: &str) -> Result<()> {
        self.new_key_and_csr(name, cn)?;
        std::fs::write(
            self.path(&format!("{name}.ext")),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )?;
        let serial = format!("0x{:x}", rand_serial());
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ])
    }
}

fn rand_serial() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    (nanos ^ u64::from(std::process::id())) | 1
}

fn start_tls_cluster(pki: &Pki) -> Result<Postgres> {
    Postgres::start_with(&PostgresOptions {
        tls: Some(pki.server_dir()),
    })
}

/// `postgres://USER[:PASSWORD]@HOST:PORT/siphon?PARAMS`
fn url(pg: &Postgres, user: &str, password: Option<&str>, host: &str, params: &str) -> String {
    let creds = match password {
        Some(p) => format!("{user}:{p}"),
        None => user.to_owned(),
    };
    format!(
        "postgres://{creds}@{host}:{}/siphon{}{params}",
        pg.port(),
        if params.is_empty() { "" } else { "?" }
    )
}

/// Siphon's configuration for the scratch services, connecting with `url`.
fn config_with_url(pg: &Postgres, broker: &Broker, slot: &str, url: &str) -> String {
    siphon_config(pg, broker, slot, "").replace(&pg.url(), url)
}

/// Creates the outbox (owned by the superuser `siphon`) and sets `siphon`'s password to
/// [`PASSWORD`], stored as SCRAM-SHA-256.
async fn prepare_outbox(db: &Client) -> Result<()> {
    db.batch_execute(OUTBOX_DDL).await?;
    db.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256'; ALTER ROLE siphon PASSWORD '{PASSWORD}'"
    ))
    .await?;
    Ok(())
}

/// Inserts events `1..=n` in one transaction.
async fn write_events(db: &mut Client, n: u64) -> Result<BTreeSet<String>> {
    let events: Vec<_> = (1..=n).map(|seq| event(seq, true)).collect();
    insert_transaction(db, &events, true).await?;
    Ok(events.into_iter().map(|e| e.id).collect())
}

/// Waits until the outbox topics hold exactly the events `ids` (by their `id` header).
async fn wait_for_events(broker: &Broker, ids: &BTreeSet<String>) -> Result<Vec<ConsumedRecord>> {
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let mut all = Vec::new();
            for topic in TOPICS {
                all.extend(
                    read_topic_async(
                        &broker.bootstrap(),
                        &broker.topic(topic),
                        Duration::from_secs(10),
                    )
                    .await?,
                );
            }
            let got: BTreeSet<String> = all
                .iter()
                .filter_map(|r| r.header("id"))
                .map(|id| String::from_utf8_lossy(id).into_owned())
                .collect();
            ensure!(
                all.len() <= ids.len(),
                "{} records, more than {}",
                all.len(),
                ids.len()
            );
            Ok((got == *ids && all.len() == ids.len()).then_some(all))
        },
    )
    .await
}

/// Siphon's TCP connections as the server sees them: (backend type, TLS on, TLS version,
/// client certificate DN).
async fn siphon_connections(
    db: &Client,
    user: &str,
) -> Result<Vec<(String, bool, Option<String>, Option<String>)>> {
    let rows = db
        .query(
            "SELECT a.backend_type, s.ssl, s.version, s.client_dn \
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
              WHERE a.client_addr IS NOT NULL AND a.usename = $1 ORDER BY 1",
            &[&user],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
}

/// Waits until Siphon holds both its connections (the SQL one and the walsender) and returns
/// them.
async fn wait_for_both_connections(
    db: &Client,
    user: &str,
) -> Result<Vec<(String, bool, Option<String>, Option<String>)>> {
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let conns = siphon_connections(db, user).await?;
            let kinds: BTreeSet<&str> = conns.iter().map(|c| c.0.as_str()).collect();
            Ok((kinds.contains("walsender") && kinds.contains("client backend")).then_some(conns))
        },
    )
    .await
}

/// Starts Siphon, waits for it to exit and returns its log; fails unless it exits with status 2.
fn expect_definite_error(config: &str) -> Result<String> {
    let siphon = SiphonProcess::start(config)?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    ensure!(
        status.code() == Some(EXIT_DEFINITE),
        "exit status {status:?}, expected {EXIT_DEFINITE}; log:\n{log}"
    );
    Ok(log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_refuses_sslmode_disable_and_siphon_says_what_to_set() -> Result<()> {
    let pki = Pki::new()?;
    let pg = start_tls_cluster(&pki)?;
    let broker = Broker::start()?;
    let db = pg.connect().await?;
    prepare_outbox(&db).await?;
    let plain = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "127.0.0.1",
        "sslmode=disable",
    );
    let log = expect_definite_error(&config_with_url(&pg, &broker, "plain", &plain))?;
    assert!(log.contains("no pg_hba.conf entry"), "{log}");
    assert!(log.contains("no encryption"), "{log}");
    assert!(
        log.contains("set sslmode=verify-full and sslrootcert"),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "the password was logged:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_against_a_server_without_tls_stops_and_says_so() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let db = pg.connect().await?;
    prepare_outbox(&db).await?;
    let require = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "127.0.0.1",
        "sslmode=require",
    );
    let log = expect_definite_error(&config_with_url(&pg, &broker, "req", &require))?;
    assert!(log.contains("the server does not accept TLS"), "{log}");
    assert!(log.contains("sslmode=require"), "{log}");
    assert!(!log.contains(PASSWORD), "the password was logged:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_streams_events_over_tls_on_both_connections_with_scram() -> Result<()> {
    let pki = Pki::new()?;
    let pg = start_tls_cluster(&pki)?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    prepare_outbox(&db).await?;
    // Passwords are SCRAM-SHA-256 and TCP logins only over TLS with scram-sha-256.
    let stored: String = db
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'siphon'",
            &[],
        )
        .await?
        .get(0);
    assert!(stored.starts_with("SCRAM-SHA-256$"), "{stored}");
    let rules: Vec<(String, String)> = db
        .query(
            "SELECT type, auth_method FROM pg_hba_file_rules WHERE type <> 'local'",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        rules,
        [("hostssl".to_owned(), "scram-sha-256".to_owned())],
        "pg_hba.conf"
    );

    let tls_url = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("ca.crt").display()
        ),
    );
    let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, "tls", &tls_url))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 30).await?;
    let records = wait_for_events(&broker, &ids).await?;
    assert_eq!(records.len(), 30);

    let conns = wait_for_both_connections(&db, "siphon").await?;
    for (kind, ssl, version, _) in &conns {
        assert!(ssl, "{kind} connection without TLS: {conns:?}");
        assert!(
            matches!(version.as_deref(), Some("TLSv1.2" | "TLSv1.3")),
            "{conns:?}"
        );
    }
    let log = strip_ansi(&siphon.log());
    assert!(log.contains("sslmode=verify-full"), "{log}");
    assert!(!log.contains(PASSWORD), "the password was logged:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_wrong_ca_names_the_certificate_problem() -> Result<()> {
    let pki = Pki::new()?;
    let pg = start_tls_cluster(&pki)?;
    let broker = Broker::start()?;
    let db = pg.connect().await?;
    prepare_outbox(&db).await?;
    let wrong = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("other-ca.crt").display()
        ),
    );
    let log = expect_definite_error(&config_with_url(&pg, &broker, "wrongca", &wrong))?;
    assert!(log.contains("TLS certificate problem"), "{log}");
    assert!(log.contains("UnknownIssuer"), "{log}");
    assert!(log.contains("not signed by the CA in sslrootcert"), "{log}");
    assert!(!log.contains(PASSWORD), "the password was logged:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name_and_verify_ca_does_not() -> Result<()> {
    let pki = Pki::new()?;
    let pg = start_tls_cluster(&pki)?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    prepare_outbox(&db).await?;
    // The certificate names 127.0.0.1 and localhost, not this name; hostaddr keeps the
    // connection on 127.0.0.1 without any name lookup.
    let params = |mode: &str| {
        format!(
            "hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            pki.path("ca.crt").display()
        )
    };
    let full = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "db.siphon.test",
        &params("verify-full"),
    );
    let log = expect_definite_error(&config_with_url(&pg, &broker, "name", &full))?;
    assert!(
        log.contains(r#"not valid for name "db.siphon.test""#),
        "{log}"
    );
    assert!(log.contains("does not name the host"), "{log}");

    let ca = url(
        &pg,
        "siphon",
        Some(PASSWORD),
        "db.siphon.test",
        &params("verify-ca"),
    );
    let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, "name", &ca))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 5).await?;
    wait_for_events(&broker, &ids).await?;
    for (kind, ssl, ..) in wait_for_both_connections(&db, "siphon").await? {
        assert!(ssl, "{kind} connection without TLS");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_authenticates_a_second_user() -> Result<()> {
    let pki = Pki::new()?;
    let pg = start_tls_cluster(&pki)?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    prepare_outbox(&db).await?;
    // `siphon_cert` logs in with its certificate only (CN = role name), no password.
    let hba = std::fs::read_to_string(pg.hba_path())?;
    let cert_line = "hostssl all siphon_cert 127.0.0.1/32 cert\n";
    let (head, rules) = hba.split_at(hba.find("hostssl").context("no hostssl line")?);
    std::fs::write(pg.hba_path(), format!("{head}{cert_line}{rules}"))?;
    pg.reload()?;
    db.batch_execute(
        "CREATE ROLE siphon_cert LOGIN REPLICATION; \
         CREATE PUBLICATION cert_pub FOR TABLE outbox",
    )
    .await?;

    let ca = pki.path("ca.crt");
    let without_cert = url(
        &pg,
        "siphon_cert",
        None,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    let log = expect_definite_error(&config_with_url(&pg, &broker, "cert", &without_cert))?;
    assert!(log.contains("requires a valid client certificate"), "{log}");
    assert!(log.contains("set sslcert and sslkey"), "{log}");

    let with_cert = format!(
        "{without_cert}&sslcert={}&sslkey={}",
        pki.path("client.crt").display(),
        pki.path("client.key").display()
    );
    let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, "cert", &with_cert))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 12).await?;
    wait_for_events(&broker, &ids).await?;
    let conns = wait_for_both_connections(&db, "siphon_cert").await?;
    for (kind, ssl, _, dn) in &conns {
        assert!(ssl, "{kind} connection without TLS: {conns:?}");
        assert_eq!(dn.as_deref(), Some("/CN=siphon_cert"), "{conns:?}");
    }
    Ok(())
}

/// Creates `siphon_cdc`: a login with a SCRAM password and the given attributes, owning
/// nothing, with `grants` applied.
async fn create_cdc_role(db: &Client, attributes: &str, grants: &str) -> Result<()> {
    db.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE siphon_cdc LOGIN {attributes} PASSWORD '{PASSWORD}'; {grants}"
    ))
    .await?;
    Ok(())
}

/// The role is no superuser and owns no relation, publication, schema or database.
async fn assert_owns_nothing(db: &Client) -> Result<()> {
    let row = db
        .query_one(
            "SELECT r.rolsuper, r.rolreplication, \
                    (SELECT count(*) FROM pg_class WHERE relowner = r.oid) \
                  + (SELECT count(*) FROM pg_publication WHERE pubowner = r.oid) \
                  + (SELECT count(*) FROM pg_namespace WHERE nspowner = r.oid) \
                  + (SELECT count(*) FROM pg_database WHERE datdba = r.oid) \
               FROM pg_roles r WHERE r.rolname = 'siphon_cdc'",
            &[],
        )
        .await?;
    let (superuser, _replication, owned): (bool, bool, i64) = (row.get(0), row.get(1), row.get(2));
    ensure!(
        !superuser && owned == 0,
        "siphon_cdc is superuser or owns {owned} objects"
    );
    Ok(())
}

fn cdc_url(pg: &Postgres) -> String {
    url(pg, "siphon_cdc", Some(PASSWORD), "127.0.0.1", "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_role_streams_when_the_owner_created_the_publication() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    db.batch_execute(OUTBOX_DDL).await?;
    // What the table owner runs once; Siphon then only needs REPLICATION: it reads no table
    // with SQL, and the walsender streams published tables without checking SELECT.
    db.batch_execute("CREATE PUBLICATION least_pub FOR TABLE outbox")
        .await?;
    create_cdc_role(&db, "REPLICATION", "").await?;
    assert_owns_nothing(&db).await?;
    let can_select: bool = db
        .query_one(
            "SELECT has_table_privilege('siphon_cdc', 'public.outbox', 'SELECT')",
            &[],
        )
        .await?
        .get(0);
    assert!(!can_select);

    let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, "least", &cdc_url(&pg)))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 20).await?;
    wait_for_events(&broker, &ids).await?;
    // Siphon created the slot as siphon_cdc.
    let slot: Option<String> = db
        .query_opt(
            "SELECT plugin FROM pg_replication_slots WHERE slot_name = 'least'",
            &[],
        )
        .await?
        .map(|r| r.get(0));
    assert_eq!(slot.as_deref(), Some("pgoutput"));
    assert!(!siphon.log().contains(PASSWORD));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_row_siphon_may_not_delete_stops_siphon_naming_the_grant() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    db.batch_execute(OUTBOX_DDL).await?;
    db.batch_execute(
        "CREATE PUBLICATION signal_grant_pub FOR TABLE outbox; \
         CREATE TABLE siphon_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
    )
    .await?;
    // Reading the signal table and the outbox is granted; removing a signal row is forgotten.
    create_cdc_role(
        &db,
        "REPLICATION",
        "GRANT SELECT ON outbox, siphon_signal TO siphon_cdc",
    )
    .await?;
    let config = config_with_url(&pg, &broker, "signal_grant", &cdc_url(&pg)).replacen(
        "[source]\n",
        "[source]\nsignal_table = \"public.siphon_signal\"\n",
        1,
    );
    let siphon = SiphonProcess::start(&config)?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 5).await?;
    wait_for_events(&broker, &ids).await?;
    db.execute(
        "INSERT INTO siphon_signal (id, type, data) VALUES ('replay-1', 'execute-snapshot', $1)",
        &[&r#"{"data-collections": ["public.outbox"]}"#],
    )
    .await?;
    // Acting on it would repeat the re-send at every look: Siphon stops at once instead.
    let status = siphon
        .wait_exit(Duration::from_secs(30))
        .with_context(|| siphon.log())?;
    let log = strip_ansi(&siphon.log());
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{log}");
    assert!(
        log.contains(r#"GRANT SELECT, DELETE ON "public"."siphon_signal" TO "siphon_cdc""#),
        "{log}"
    );
    assert!(!log.contains("re-send started"), "{log}");
    let records = wait_for_events(&broker, &ids).await?;
    assert!(
        records.iter().all(|r| r.header("siphon.resend").is_none()),
        "a re-send ran"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_owns_the_outbox_creates_the_publication_itself() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    create_cdc_role(
        &db,
        "REPLICATION",
        "GRANT CREATE ON DATABASE siphon TO siphon_cdc",
    )
    .await?;
    db.batch_execute(OUTBOX_DDL).await?;
    db.batch_execute("ALTER TABLE outbox OWNER TO siphon_cdc")
        .await?;
    let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, "owner", &cdc_url(&pg)))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    let ids = write_events(&mut db, 7).await?;
    wait_for_events(&broker, &ids).await?;
    let owner: String = db
        .query_one(
            "SELECT pubowner::regrole::text FROM pg_publication WHERE pubname = 'owner_pub'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(owner, "siphon_cdc");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replication_siphon_names_the_missing_attribute_and_the_fix() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let db = pg.connect().await?;
    db.batch_execute(OUTBOX_DDL).await?;
    db.batch_execute("CREATE PUBLICATION norepl_pub FOR TABLE outbox")
        .await?;
    create_cdc_role(&db, "NOREPLICATION", "").await?;
    let log = expect_definite_error(&config_with_url(&pg, &broker, "norepl", &cdc_url(&pg)))?;
    assert!(log.contains("no REPLICATION attribute"), "{log}");
    assert!(
        log.contains(r#"ALTER ROLE "siphon_cdc" REPLICATION"#),
        "{log}"
    );
    // What the server said is kept.
    assert!(log.contains("replication"), "{log}");
    assert!(!log.contains(PASSWORD));

    // A slot that already exists: the replication connection itself is refused.
    db.batch_execute("SELECT pg_create_logical_replication_slot('norepl', 'pgoutput')")
        .await?;
    let log = expect_definite_error(&config_with_url(&pg, &broker, "norepl", &cdc_url(&pg)))?;
    assert!(log.contains("no REPLICATION attribute"), "{log}");
    assert!(
        log.contains(r#"ALTER ROLE "siphon_cdc" REPLICATION"#),
        "{log}"
    );
    assert!(
        log.contains("start walsender") || log.contains("WAL sender"),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_does_not_own_the_outbox_is_told_to_have_the_publication_created() -> Result<()>
{
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let db = pg.connect().await?;
    db.batch_execute(OUTBOX_DDL).await?;
    create_cdc_role(
        &db,
        "REPLICATION",
        "GRANT CREATE ON DATABASE siphon TO siphon_cdc",
    )
    .await?;
    let log = expect_definite_error(&config_with_url(&pg, &broker, "nopub", &cdc_url(&pg)))?;
    assert!(
        log.contains(r#"CREATE PUBLICATION "nopub_pub" FOR TABLE "public"."outbox""#),
        "{log}"
    );
    assert!(log.contains("must be owner"), "{log}");
    Ok(())
}

/// The password methods besides SCRAM: `md5` (a role whose password is stored as MD5) and
/// `password` (cleartext), on both connections; a wrong password is a definite error naming
/// the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_and_cleartext_password_logins_stream() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut db = pg.connect().await?;
    prepare_outbox(&db).await?;
    db.batch_execute(&format!(
        "SET password_encryption = 'md5'; \
         CREATE ROLE siphon_md5 SUPERUSER LOGIN REPLICATION PASSWORD '{PASSWORD}'; \
         SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE siphon_plain SUPERUSER LOGIN REPLICATION PASSWORD '{PASSWORD}'"
    ))
    .await?;
    let hba = std::fs::read_to_string(pg.hba_path())?;
    std::fs::write(
        pg.hba_path(),
        format!(
            "host all siphon_md5 127.0.0.1/32 md5\nhost all siphon_plain 127.0.0.1/32 password\n{hba}"
        ),
    )?;
    pg.reload()?;

    let mut expected = BTreeSet::new();
    for (seq, user) in [(1u64, "siphon_md5"), (2, "siphon_plain")] {
        let wrong = url(&pg, user, Some("not-the-password"), "127.0.0.1", "");
        let log = expect_definite_error(&config_with_url(&pg, &broker, user, &wrong))?;
        assert!(log.contains("password authentication failed"), "{log}");
        assert!(log.contains("check the user and password"), "{log}");

        let right = url(&pg, user, Some(PASSWORD), "127.0.0.1", "");
        let siphon = SiphonProcess::start(&config_with_url(&pg, &broker, user, &right))?;
        siphon
            .wait_for_log("streaming", Duration::from_secs(60))
            .await?;
        let events = [event(seq, true)];
        insert_transaction(&mut db, &events, true).await?;
        expected.insert(events[0].id.clone());
        wait_for_events(&broker, &expected)
            .await
            .with_context(|| format!("{user}; siphon log:\n{}", siphon.log()))?;
        let methods: Vec<String> = db
            .query(
                "SELECT DISTINCT backend_type FROM pg_stat_activity WHERE usename = $1",
                &[&user],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert!(
            methods.iter().any(|kind| kind == "walsender"),
            "{user}: no replication connection logged in: {methods:?}"
        );
    }
    Ok(())
}
