//! librdkafka's per-broker latencies, read from its statistics (`statistics.interval.ms`).
//!
//! Where the time between handing a record to the producer and its acknowledgement goes, per
//! broker: waiting in its partition's queue for a request (`int_latency`), the request waiting
//! to be written to the socket (`outbuf_latency`), and the request's round trip (`rtt`).
//! librdkafka measures each over the interval since its previous statistics.
//!
//! # Invariants
//! - The partition queue is reported only when the producer has a message timeout:
//!   librdkafka measures it as the timeout's deadline less the time left, which says nothing
//!   when `message.timeout.ms = 0` (Siphon's at-least-once producer, whose deadline Siphon keeps).
//! - Only brokers of the cluster are reported (librdkafka's bootstrap and internal entries have
//!   no node id), and only stages with at least one sample in the interval: a quiet interval
//!   leaves the last figures as they were.
//! - Only the `brokers` object is decoded; the rest of the statistics (per topic and
//!   partition, the larger part) is skipped without being built.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where a record's time goes inside the producer, as librdkafka measures it per broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProducerStage {
    /// In its partition's queue until a produce request takes it (`int_latency`).
    PartitionQueue,
    /// The request, until it is written to the socket (`outbuf_latency`).
    RequestQueue,
    /// The request's round trip to the broker and back (`rtt`).
    RoundTrip,
}

impl ProducerStage {
    /// Every stage.
    pub const ALL: [ProducerStage; 3] = [
        ProducerStage::PartitionQueue,
        ProducerStage::RequestQueue,
        ProducerStage::RoundTrip,
    ];

    /// The stage's name in metrics.
    pub fn label(self) -> &'static str {
        match self {
            ProducerStage::PartitionQueue => "partition_queue",
            ProducerStage::RequestQueue => "request_queue",
            ProducerStage::RoundTrip => "round_trip",
        }
    }
}

/// One stage's figures over a statistics interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLatency {
    pub stage: ProducerStage,
    /// How many values were measured.
    pub samples: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// One broker's stages over a statistics interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerLatencies {
    /// The broker's node id.
    pub node_id: i32,
    /// Stages with at least one sample.
    pub stages: Vec<StageLatency>,
}

/// A statistics window as librdkafka writes it (microseconds).
#[derive(Debug, Default, Deserialize)]
struct Window {
    #[serde(default)]
    cnt: i64,
    #[serde(default)]
    p50: i64,
    #[serde(default)]
    p99: i64,
    #[serde(default)]
    max: i64,
}

#[derive(Debug, Deserialize)]
struct Broker {
    #[serde(default = "no_node")]
    nodeid: i32,
    #[serde(default)]
    int_latency: Window,
    #[serde(default)]
    outbuf_latency: Window,
    #[serde(default)]
    rtt: Window,
}

fn no_node() -> i32 {
    -1
}

#[derive(Debug, Deserialize)]
struct Statistics {
    #[serde(default)]
    brokers: BTreeMap<String, Broker>,
}

fn micros(value: i64) -> Duration {
    Duration::from_micros(u64::try_from(value).unwrap_or(0))
}

/// The brokers' latencies in librdkafka's statistics JSON, by node id; the partition queue's
/// only if `partition_queue_measured` (the producer has a message timeout).
pub fn broker_latencies(
    json: &[u8],
    partition_queue_measured: bool,
) -> Result<Vec<BrokerLatencies>, serde_json::Error> {
    let statistics: Statistics = serde_json::from_slice(json)?;
    let mut brokers: Vec<BrokerLatencies> = statistics
        .brokers
        .into_values()
        .filter(|broker| broker.nodeid >= 0)
        .map(|broker| {
            let stages = [
                (ProducerStage::PartitionQueue, broker.int_latency),
                (ProducerStage::RequestQueue, broker.outbuf_latency),
                (ProducerStage::RoundTrip, broker.rtt),
            ]
            .into_iter()
            .filter(|(stage, _)| {
                partition_queue_measured || *stage != ProducerStage::PartitionQueue
            })
            .filter(|(_, window)| window.cnt > 0)
            .map(|(stage, window)| StageLatency {
                stage,
                samples: u64::try_from(window.cnt).unwrap_or(0),
                p50: micros(window.p50),
                p99: micros(window.p99),
                max: micros(window.max),
            })
            .collect();
            BrokerLatencies {
                node_id: broker.nodeid,
                stages,
            }
        })
        .collect();
    brokers.sort_by_key(|broker| broker.node_id);
    Ok(brokers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape librdkafka writes (abridged: the fields read, and some that are not).
    const SAMPLE: &str = r#"{
      "name": "rdkafka#producer-1", "type": "producer", "ts": 1, "msg_cnt": 3,
      "brokers": {
        "127.0.0.1:9092/bootstrap": {"name": "127.0.0.1:9092/bootstrap", "nodeid": -1,
          "rtt": {"min": 1, "max": 9, "avg": 3, "cnt": 4, "p50": 2, "p99": 9}},
        ":0/internal": {"name": ":0/internal", "nodeid": -1, "source": "internal"},
        "127.0.0.1:9094/3": {"name": "127.0.0.1:9094/3", "nodeid": 3, "state": "UP",
          "int_latency": {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0, "p50": 0, "p99": 0},
          "outbuf_latency": {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0, "p50": 0, "p99": 0},
          "rtt": {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0, "p50": 0, "p99": 0}},
        "127.0.0.1:9092/1": {"name": "127.0.0.1:9092/1", "nodeid": 1, "state": "UP",
          "int_latency": {"min": 5, "max": 2500, "avg": 700, "sum": 7000, "cnt": 10,
                          "stddev": 3, "hdrsize": 11376, "p50": 600, "p75": 800, "p90": 900,
                          "p95": 1000, "p99": 2400, "p99_99": 2500, "outofrange": 0},
          "outbuf_latency": {"min": 10, "max": 40, "cnt": 2, "p50": 12, "p99": 40},
          "rtt": {"min": 300, "max": 19000, "cnt": 2, "p50": 450, "p99": 18000}}
      },
      "topics": {"orders": {"partitions": {"0": {"msgq_cnt": 1}}}}
    }"#;

    #[test]
    fn cluster_brokers_with_samples_are_read_in_node_order() {
        let brokers = broker_latencies(SAMPLE.as_bytes(), true).unwrap();
        assert_eq!(
            brokers,
            vec![
                BrokerLatencies {
                    node_id: 1,
                    stages: vec![
                        StageLatency {
                            stage: ProducerStage::PartitionQueue,
                            samples: 10,
                            p50: Duration::from_micros(600),
                            p99: Duration::from_micros(2400),
                            max: Duration::from_micros(2500),
                        },
                        StageLatency {
                            stage: ProducerStage::RequestQueue,
                            samples: 2,
                            p50: Duration::from_micros(12),
                            p99: Duration::from_micros(40),
                            max: Duration::from_micros(40),
                        },
                        StageLatency {
                            stage: ProducerStage::RoundTrip,
                            samples: 2,
                            p50: Duration::from_micros(450),
                            p99: Duration::from_micros(18_000),
                            max: Duration::from_micros(19_000),
                        },
                    ],
                },
                BrokerLatencies {
                    node_id: 3,
                    stages: vec![],
                },
            ]
        );
    }

    #[test]
    fn without_a_message_timeout_the_partition_queue_is_left_out() {
        let brokers = broker_latencies(SAMPLE.as_bytes(), false).unwrap();
        let stages: Vec<ProducerStage> = brokers[0].stages.iter().map(|s| s.stage).collect();
        assert_eq!(
            stages,
            [ProducerStage::RequestQueue, ProducerStage::RoundTrip]
        );
    }

    #[test]
    fn statistics_without_brokers_have_none_and_garbage_is_an_error() {
        assert_eq!(broker_latencies(br#"{"name": "p"}"#, true).unwrap(), vec![]);
        assert!(broker_latencies(b"{\"brokers\": 3}", true).is_err());
        assert!(broker_latencies(b"not json", true).is_err());
    }
}
