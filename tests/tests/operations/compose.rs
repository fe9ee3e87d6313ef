//! The docker-compose stack and its Siphon configuration are well-formed (no container engine runs
//! here, so this checks by reading).

use std::path::PathBuf;
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    siphon_tests::workspace_root()
}

fn compose() -> Yaml {
    let text = std::fs::read_to_string(root().join("docker-compose.yml"))
        .expect("docker-compose.yml exists");
    let mut docs = YamlLoader::load_from_str(&text).expect("docker-compose.yml is valid YAML");
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

#[test]
fn compose_stack_has_postgres_with_logical_wal_kafka_in_kraft_mode_and_siphon() {
    let doc = compose();
    let services = &doc["services"];
    let postgres = &services["postgres"];
    assert_eq!(postgres["image"].as_str(), Some("postgres:17"));
    let command: Vec<&str> = postgres["command"]
        .as_vec()
        .expect("postgres command")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert!(command.contains(&"wal_level=logical"), "{command:?}");

    let kafka = &services["kafka"];
    assert!(kafka["image"]
        .as_str()
        .is_some_and(|i| i.starts_with("apache/kafka")));
    assert!(
        kafka["environment"]["KAFKA_PROCESS_ROLES"]
            .as_str()
            .is_some_and(|r| r.contains("controller")),
        "KRaft mode"
    );

    let siphon = &services["siphon"];
    assert_eq!(siphon["build"].as_str(), Some("."));
    assert!(root().join("Dockerfile").exists());
    let depends: Vec<&str> = siphon["depends_on"]
        .as_hash()
        .expect("depends_on")
        .keys()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(depends, ["postgres", "kafka"]);
}

#[test]
fn mounted_files_exist_and_the_siphon_config_points_at_the_stack() {
    let doc = compose();
    for service in ["postgres", "siphon"] {
        for volume in doc["services"][service]["volumes"]
            .as_vec()
            .expect("volumes")
        {
            let spec = volume.as_str().expect("short volume syntax");
            let host = spec.split(':').next().unwrap_or_default();
            assert!(
                root().join(host).exists(),
                "{service} mounts missing {host}"
            );
        }
    }
    let config: toml::Table = std::fs::read_to_string(root().join("examples/docker-siphon.toml"))
        .unwrap()
        .parse()
        .expect("valid TOML");
    assert!(config["source"]["url"]
        .as_str()
        .unwrap()
        .contains("@postgres:5432/"));
    assert_eq!(
        config["kafka"]["bootstrap_servers"].as_str(),
        Some("kafka:9092")
    );
}
