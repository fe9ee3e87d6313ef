//! The schema registry client against a real registry (rivven-schema, serving Confluent's REST
//! API) and, for what a registry does not show (headers, failures to retry), against a
//! scripted HTTP server on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use siphon_router::{
    expand_json_payload, AvroSchema, Expansion, JsonEmptyArrayBehavior, JsonNullBehavior,
};
use siphon_schema_registry::{
    value_subject, BasicAuth, Consequence, RegistryConfig, RegistryError, RetryPolicy, SchemaKind,
    SchemaRegistry,
};
use siphon_tests::{free_port, RegistryServer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The Avro schema Siphon derives for an expanded payload.
fn payload_schema(payload: &str) -> AvroSchema {
    match expand_json_payload(
        "payload",
        payload,
        JsonNullBehavior::Ignore,
        JsonEmptyArrayBehavior::Ignore,
    ) {
        Expansion::Expanded { schema, .. } => {
            AvroSchema::from_connect(&schema).expect("an Avro schema")
        }
        other => panic!("{payload} did not expand: {other:?}"),
    }
}

fn quick_retries(config: &mut RegistryConfig, attempts: u32) {
    config.retry = RetryPolicy {
        attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

#[tokio::test]
async fn registers_once_and_answers_from_the_cache() -> Result<()> {
    let rivven = RegistryServer::start()?;
    let registry = SchemaRegistry::new(&RegistryConfig::new(rivven.url()))?;
    let avro = payload_schema(r#"{"id":1,"name":"a","lines":[{"sku":"s"}]}"#);

    let id = registry
        .register("orders-value", SchemaKind::Avro, avro.json())
        .await?;
    assert_eq!(registry.requests_sent(), 1);
    assert_eq!(
        registry
            .register("orders-value", SchemaKind::Avro, avro.json())
            .await?,
        id
    );
    assert_eq!(registry.requests_sent(), 1, "the second register is cached");

    let latest = registry.latest("orders-value").await?;
    assert_eq!((latest.id, latest.version), (id, 1));
    assert_eq!(latest.kind, SchemaKind::Avro);
    // The registry may give the schema back laid out otherwise (rivven sorts keys).
    assert_eq!(json(&latest.schema), json(avro.json()));
    assert_eq!(registry.requests_sent(), 2);
    assert_eq!(registry.latest("orders-value").await?, latest);
    assert_eq!(registry.version("orders-value", 1).await?, latest);
    assert_eq!(registry.schema(id).await?.0, SchemaKind::Avro);
    assert_eq!(
        registry.requests_sent(),
        2,
        "latest, version and id are cached"
    );

    // Another client finds the same id for the same schema.
    let other = SchemaRegistry::new(&RegistryConfig::new(rivven.url()))?;
    assert_eq!(
        other
            .register("orders-value", SchemaKind::Avro, avro.json())
            .await?,
        id
    );
    let (kind, text) = other.schema(id).await?;
    assert_eq!((kind, json(&text)), (SchemaKind::Avro, json(avro.json())));
    Ok(())
}

#[tokio::test]
async fn a_compatible_change_is_a_new_version() -> Result<()> {
    let rivven = RegistryServer::start()?;
    let registry = SchemaRegistry::new(&RegistryConfig::new(rivven.url()))?;
    let first = payload_schema(r#"{"id":1}"#);
    let second = payload_schema(r#"{"id":1,"note":"n"}"#);
    let id1 = registry
        .register("t-value", SchemaKind::Avro, first.json())
        .await?;
    assert_eq!(registry.latest("t-value").await?.id, id1);
    let id2 = registry
        .register("t-value", SchemaKind::Avro, second.json())
        .await?;
    assert_ne!(id1, id2);
    assert_eq!(
        registry.latest("t-value").await?.id,
        id1,
        "kept until forgotten"
    );
    registry.forget_latest("t-value");
    let latest = registry.latest("t-value").await?;
    assert_eq!((latest.id, latest.version), (id2, 2));
    assert_eq!(registry.version("t-value", 1).await?.id, id1);

    // With a time to live, the latest version is asked for again once it has passed.
    let mut config = RegistryConfig::new(rivven.url());
    config.latest_ttl = Some(Duration::ZERO);
    let fresh = SchemaRegistry::new(&config)?;
    assert_eq!(fresh.latest("t-value").await?.id, id2);
    assert_eq!(fresh.latest("t-value").await?.id, id2);
    assert_eq!(fresh.requests_sent(), 2);
    Ok(())
}

#[tokio::test]
async fn refusals_are_for_the_operator_to_fix() -> Result<()> {
    let rivven = RegistryServer::start()?;
    let registry = SchemaRegistry::new(&RegistryConfig::new(rivven.url()))?;
    registry
        .register(
            "t-value",
            SchemaKind::Avro,
            payload_schema(r#"{"id":1}"#).json(),
        )
        .await?;

    let incompatible = registry
        .register("t-value", SchemaKind::Avro, r#""int""#)
        .await
        .unwrap_err();
    assert!(
        matches!(incompatible, RegistryError::Refused { status: 409, .. }),
        "{incompatible}"
    );
    let invalid = registry
        .register("u-value", SchemaKind::Avro, "{nonsense")
        .await
        .unwrap_err();
    assert!(
        matches!(invalid, RegistryError::Refused { status: 422, .. }),
        "{invalid}"
    );
    let no_subject = registry.latest("nope").await.unwrap_err();
    assert!(
        matches!(
            no_subject,
            RegistryError::Refused {
                status: 404,
                code: Some(40401),
                ..
            }
        ),
        "{no_subject}"
    );
    let no_version = registry.version("t-value", 7).await.unwrap_err();
    assert!(
        matches!(
            no_version,
            RegistryError::Refused {
                status: 404,
                code: Some(40402),
                ..
            }
        ),
        "{no_version}"
    );
    for error in [incompatible, invalid, no_subject, no_version] {
        assert_eq!(error.consequence(), Consequence::Fix, "{error}");
    }
    assert_eq!(registry.requests_sent(), 5, "refusals are not retried");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_registry_is_retried_then_left_to_the_caller() -> Result<()> {
    // Nothing listens on a port just handed out.
    let mut config = RegistryConfig::new(format!("http://127.0.0.1:{}", free_port()));
    quick_retries(&mut config, 3);
    let registry = SchemaRegistry::new(&config)?;
    let error = registry.latest("t-value").await.unwrap_err();
    assert!(
        matches!(error, RegistryError::Unreachable { .. }),
        "{error}"
    );
    assert_eq!(error.consequence(), Consequence::Retry);
    assert_eq!(registry.requests_sent(), 3);
    Ok(())
}

/// A request as the scripted server saw it.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    body: String,
}

/// Serves the `answers` (status, body) in turn, one connection each, recording each request.
async fn scripted(answers: Vec<(u16, &'static str)>) -> Result<(u16, Arc<Mutex<Vec<Seen>>>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        for (status, body) in answers {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head, rest) = loop {
                let Ok(n) = socket.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (
                        String::from_utf8_lossy(&buf[..i]).into_owned(),
                        buf[i + 4..].to_vec(),
                    );
                }
            };
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let mut body_in = rest;
            while body_in.len() < length {
                let Ok(n) = socket.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    break;
                }
                body_in.extend_from_slice(&chunk[..n]);
            }
            record.lock().unwrap().push(Seen {
                head,
                body: String::from_utf8_lossy(&body_in).into_owned(),
            });
            let response = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    Ok((port, seen))
}

#[tokio::test]
async fn requests_carry_auth_content_type_and_the_base_path() -> Result<()> {
    let (port, seen) = scripted(vec![(200, r#"{"id":5}"#)]).await?;
    let mut config = RegistryConfig::new(format!("http://127.0.0.1:{port}/apis/ccompat/v7/"));
    config.basic_auth = Some(BasicAuth {
        username: "siphon".to_owned(),
        password: "s3cret".to_owned(),
    });
    let registry = SchemaRegistry::new(&config)?;
    let id = registry
        .register("my topic-value", SchemaKind::Json, r#"{"type":"object"}"#)
        .await?;
    assert_eq!(id, 5);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let head = &seen[0].head;
    assert!(
        head.starts_with("POST /apis/ccompat/v7/subjects/my%20topic-value/versions HTTP/1.1\r\n"),
        "{head}"
    );
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    // base64("siphon:s3cret")
    assert_eq!(header("authorization"), "Basic c2lwaG9uOnMzY3JldA==");
    assert_eq!(
        header("content-type"),
        "application/vnd.schemaregistry.v1+json"
    );
    assert_eq!(header("host"), format!("127.0.0.1:{port}"));
    assert_eq!(
        json(&seen[0].body),
        json(r#"{"schema":"{\"type\":\"object\"}","schemaType":"JSON"}"#)
    );
    Ok(())
}

#[tokio::test]
async fn passing_refusals_are_retried_with_backoff() -> Result<()> {
    let (port, seen) = scripted(vec![
        (
            503,
            r#"{"error_code":50003,"message":"forwarding to the leader failed"}"#,
        ),
        (429, "slow down"),
        (
            200,
            r#"{"subject":"t-value","version":3,"id":12,"schema":"\"string\""}"#,
        ),
    ])
    .await?;
    let mut config = RegistryConfig::new(format!("http://127.0.0.1:{port}"));
    quick_retries(&mut config, 5);
    let registry = SchemaRegistry::new(&config)?;
    let latest = registry.latest("t-value").await?;
    assert_eq!((latest.id, latest.version), (12, 3));
    assert_eq!(latest.kind, SchemaKind::Avro, "no schemaType means Avro");
    assert_eq!(registry.requests_sent(), 3);
    assert_eq!(seen.lock().unwrap().len(), 3);
    Ok(())
}

#[tokio::test]
async fn an_answer_that_is_not_the_api_is_for_the_operator_to_fix() -> Result<()> {
    let (port, _seen) = scripted(vec![(200, "<html>a web page</html>")]).await?;
    let registry = SchemaRegistry::new(&RegistryConfig::new(format!("http://127.0.0.1:{port}")))?;
    let error = registry.schema(1).await.unwrap_err();
    assert!(
        matches!(error, RegistryError::BadResponse { .. }),
        "{error}"
    );
    assert_eq!(error.consequence(), Consequence::Fix);
    Ok(())
}

/// The encoding end to end, without Siphon: the schema Siphon derives for an expanded payload,
/// registered in a real registry under `<topic>-value`, a framed record produced to Kafka and
/// read back, decoded by Confluent's Python `AvroDeserializer` with its own registry client.
#[tokio::test]
async fn avro_records_decode_with_confluents_deserializer() -> Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let Some(python) = siphon_tests::python::python()? else {
        return siphon_tests::prerequisite_missing(
            "avro records",
            "python3 is not installed; Confluent's deserializer needs it",
        );
    };
    let rivven = RegistryServer::start()?;
    let broker = siphon_tests::Broker::start()?;
    let topic = broker.topic("orders");
    siphon_tests::create_topic(&broker.bootstrap(), &topic, 1).await?;

    let documents = [
        r#"{"id":1,"name":"Ünïcode ✓","price":9.5,"big":5000000000,"ok":true,"tags":["a","b"],"order":{"lines":[{"sku":"s1","qty":2}],"note":"n"},"gone":null}"#,
        r#"{"id":-7,"name":"","price":-0.25,"big":-5000000000,"ok":false,"tags":[],"order":{"lines":[{"sku":"s2","qty":1},{"sku":"s3","qty":3}],"note":"m"}}"#,
    ];
    let registry = SchemaRegistry::new(&RegistryConfig::new(rivven.url()))?;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("message.timeout.ms", "10000")
        .create()?;
    let mut ids = Vec::new();
    for document in documents {
        let (schema, value) = match expand_json_payload(
            "payload",
            document,
            JsonNullBehavior::Ignore,
            JsonEmptyArrayBehavior::Ignore,
        ) {
            Expansion::Expanded { schema, value } => (schema, value),
            other => panic!("{document} did not expand: {other:?}"),
        };
        let avro = AvroSchema::from_connect(&schema)?;
        let id = registry
            .register(&value_subject(&topic), SchemaKind::Avro, avro.json())
            .await?;
        ids.push(id);
        let framed = avro.encode(&value, id)?;
        producer
            .send(
                FutureRecord::<[u8], [u8]>::to(&topic).payload(&framed),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }

    let records = siphon_tests::read_topic(&broker.bootstrap(), &topic, Duration::from_secs(20))?;
    assert_eq!(records.len(), documents.len());
    let decoded =
        siphon_tests::python::decode_avro(&python, &rivven.url(), &topic, &records, false)?;
    for ((document, id), decoded) in documents.iter().zip(&ids).zip(&decoded) {
        let mut expected = json(document);
        // Members whose schema is unknown (null, []) are left out, as Debezium leaves them out.
        if let Some(members) = expected.as_object_mut() {
            members.retain(|_, v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
        }
        assert_eq!(decoded["value"], expected, "{document}");
        assert_eq!(decoded["schema_id"], serde_json::json!(id));
    }
    Ok(())
}

/// Test certificates made with the `openssl` command: a CA, a server certificate for
/// `localhost` only, a client certificate.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Result<Pki> {
        let pki = Pki {
            dir: tempfile::tempdir()?,
        };
        pki.key_and_csr("ca", "Siphon test CA")?;
        std::fs::write(
            pki.path("ca.ext"),
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash\n",
        )?;
        pki.openssl(&[
            "x509", "-req", "-in", "ca.csr", "-signkey", "ca.key", "-days", "2", "-extfile",
            "ca.ext", "-out", "ca.crt",
        ])?;
        pki.leaf(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )?;
        pki.leaf("client", "siphon", "extendedKeyUsage=clientAuth\n")?;
        Ok(pki)
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn key_and_csr(&self, name: &str, cn: &str) -> Result<()> {
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

    fn leaf(&self, name: &str, cn: &str, extensions: &str) -> Result<()> {
        self.key_and_csr(name, cn)?;
        std::fs::write(
            self.path(&format!("{name}.ext")),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ])
    }
}

/// A TLS front for the registry on `backend`: it requires a client certificate signed by the
/// test CA and forwards the decrypted bytes. Its port.
async fn tls_front(pki: &Pki, backend: u16) -> Result<u16> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.path("ca.crt"))? {
        roots.add(cert?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let certs =
        CertificateDer::pem_file_iter(pki.path("server.crt"))?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.path("server.key"))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut registry) = tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut registry).await;
            });
        }
    });
    Ok(port)
}

#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() -> Result<()> {
    let rivven = RegistryServer::start()?;
    let pki = Pki::new()?;
    let port = tls_front(&pki, rivven.port()).await?;
    let with_client_cert = |url: String| {
        let mut config = RegistryConfig::new(url);
        config.tls.ca_location = Some(pki.path("ca.crt"));
        config.tls.certificate_location = Some(pki.path("client.crt"));
        config.tls.key_location = Some(pki.path("client.key"));
        config
    };

    let registry = SchemaRegistry::new(&with_client_cert(format!("https://localhost:{port}")))?;
    let avro = payload_schema(r#"{"id":1}"#);
    let id = registry
        .register("t-value", SchemaKind::Avro, avro.json())
        .await?;
    assert_eq!(registry.latest("t-value").await?.id, id);

    // The certificate names localhost, not 127.0.0.1: refused unless host names go unchecked.
    let mut by_address = with_client_cert(format!("https://127.0.0.1:{port}"));
    let error = SchemaRegistry::new(&by_address)?
        .latest("t-value")
        .await
        .unwrap_err();
    assert!(
        matches!(error, RegistryError::TlsHandshake { .. }),
        "{error}"
    );
    by_address.tls.verify_host_name = false;
    assert_eq!(
        SchemaRegistry::new(&by_address)?
            .latest("t-value")
            .await?
            .id,
        id
    );

    // Without the client certificate, or without the CA: for the operator to fix, not retried.
    let mut no_client_cert = with_client_cert(format!("https://localhost:{port}"));
    no_client_cert.tls.certificate_location = None;
    no_client_cert.tls.key_location = None;
    let mut public_cas_only = with_client_cert(format!("https://localhost:{port}"));
    public_cas_only.tls.ca_location = None;
    for config in [no_client_cert, public_cas_only] {
        let registry = SchemaRegistry::new(&config)?;
        let error = registry.latest("t-value").await.unwrap_err();
        assert!(
            matches!(error, RegistryError::TlsHandshake { .. }),
            "{error}"
        );
        assert_eq!(error.consequence(), Consequence::Fix, "{error}");
        assert_eq!(registry.requests_sent(), 1);
    }
    Ok(())
}

#[test]
fn the_registry_process_stops_when_dropped() -> Result<()> {
    let server = RegistryServer::start()?;
    let port = server.port();
    assert_eq!(siphon_tests::http::get(port, "/health/ready")?.0, 200);
    drop(server);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    Ok(())
}
