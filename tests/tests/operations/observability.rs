//! Metrics, readiness and status during a real run: the numbers move as they should while the
//! broker is down and after it returns. The test kills its broker, so it runs a Kafka of its
//! own.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, slot_active, wait_for_all, Event, OUTBOX_DDL,
};
use siphon_tests::{free_port, wait_for, wait_until, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;

use siphon_tests::http::get;

/// The value of a metric line `name{labels} value` (labels matched as a prefix), summed over
/// matching series.
fn metric(body: &str, series: &str) -> Option<f64> {
    let values: Vec<f64> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{', ',']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_readiness_and_status_follow_a_broker_outage() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start_own(&[])?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let bin = siphon_tests::siphon_bin()?;
    // The producer's statistics every second (10 s by default), for its latencies per broker.
    let config = siphon_config(&pg, &broker, "observed", "").replacen(
        "\"message.timeout.ms\" = \"10000\"",
        "\"message.timeout.ms\" = \"10000\"\n\"statistics.interval.ms\" = \"1000\"",
        1,
    );
    assert!(config.contains("statistics.interval.ms"), "{config}");
    let siphon =
        SiphonProcess::start_with(&bin, &config, &[("SIPHON_METRICS_LISTEN", listen.as_str())])?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "observed").await },
    )
    .await?;

    assert_eq!(get(port, "/health")?.0, 200);
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(get(port, "/ready")?.0 == 200) },
    )
    .await
    .context("ready while streaming with the broker up")?;

    // Healthy traffic moves the counters.
    let events: Vec<Event> = (1..=20).map(|s| event(s * 3 + 1, true)).collect();
    insert_transaction(&mut client, &events, true).await?;
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (_, body) = get(port, "/metrics")?;
            Ok(metric(&body, "siphon_records_acked_total") == Some(20.0))
        },
    )
    .await?;
    let (_, body) = get(port, "/metrics")?;
    assert_eq!(
        metric(&body, "siphon_events_read_total"),
        Some(20.0),
        "20 inserts; the publication Siphon creates does not carry the 20 deletes"
    );
    assert_eq!(metric(&body, "siphon_records_routed_total"), Some(20.0));
    assert!(
        metric(&body, "siphon_commit_to_ack_seconds_count").unwrap_or(0.0) >= 20.0,
        "{body}"
    );
    assert!(
        metric(&body, "siphon_send_to_ack_seconds_count").unwrap_or(0.0) >= 20.0,
        "{body}"
    );
    // One transaction read, timed from its commit to its BEGIN within the minute.
    assert_eq!(
        metric(&body, "siphon_commit_to_read_seconds_count"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        metric(&body, "siphon_commit_to_read_seconds_bucket{le=\"60\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(metric(&body, "siphon_streaming"), Some(1.0));
    // The producer's own latencies, per broker and stage, from its statistics.
    let round_trip =
        "siphon_kafka_latency_seconds{broker=\"1\",stage=\"round_trip\",quantile=\"0.99\"}";
    let body = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let (_, body) = get(port, "/metrics")?;
            Ok(metric(&body, round_trip).is_some().then_some(body))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    let rtt = metric(&body, round_trip).unwrap_or_default();
    assert!(rtt > 0.0 && rtt < 10.0, "{body}");
    assert!(
        metric(
            &body,
            "siphon_kafka_latency_seconds{broker=\"1\",stage=\"request_queue\",quantile=\"1\"}"
        )
        .is_some(),
        "{body}"
    );
    // At-least-once delivery gives librdkafka no message timeout, which it measures the
    // partition queue against: that stage is not reported rather than reported as zero.
    assert!(!body.contains("stage=\"partition_queue\""), "{body}");

    // The broker goes away: not ready, the lag and the age of the oldest record rise.
    broker.kill()?;
    let more: Vec<Event> = (100..110).map(|s| event(s * 3 + 1, true)).collect();
    insert_transaction(&mut client, &more, true).await?;
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let (status, _) = get(port, "/ready")?;
            let (_, body) = get(port, "/metrics")?;
            let lag = metric(&body, "siphon_replication_lag_bytes").unwrap_or(0.0);
            let age = metric(&body, "siphon_oldest_unacked_event_age_seconds").unwrap_or(0.0);
            anyhow::ensure!(status == 503, "ready is {status}");
            anyhow::ensure!(
                lag > 0.0 && age > 0.0,
                "lag {lag}, oldest unacked age {age}"
            );
            Ok(true)
        },
    )
    .await
    .context("during the outage")?;

    // `siphon status --json` reports the slot, held back behind the undelivered transaction.
    let out = std::process::Command::new(&bin)
        .args(["status", "--json", "--config"])
        .arg(siphon.config_path())
        .output()?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    assert_eq!(report["slot"]["active"], true, "{report}");
    assert_eq!(report["slot"]["plugin"], "pgoutput");
    assert!(
        report["slot"]["lag_bytes"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );

    // The broker returns with its data: ready again, every event delivered (those acked before
    // the outage and those written during it), the lag falls back.
    broker.start_again()?;
    let expected: BTreeSet<String> = events.iter().chain(&more).map(|e| e.id.clone()).collect();
    wait_for_all(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let (status, _) = get(port, "/ready")?;
            let (_, body) = get(port, "/metrics")?;
            let lag = metric(&body, "siphon_replication_lag_bytes").unwrap_or(f64::MAX);
            let age = metric(&body, "siphon_oldest_unacked_event_age_seconds").unwrap_or(f64::MAX);
            anyhow::ensure!(status == 200, "ready is {status}");
            anyhow::ensure!(
                lag < 64.0 * 1024.0 && age == 0.0,
                "lag {lag}, oldest unacked age {age}"
            );
            Ok(true)
        },
    )
    .await
    .context("after the broker returned")?;
    let (_, body) = get(port, "/metrics")?;
    assert!(metric(&body, "siphon_records_acked_total").unwrap_or(0.0) >= 30.0);
    assert_eq!(get(port, "/nope")?.0, 404);
    Ok(())
}
