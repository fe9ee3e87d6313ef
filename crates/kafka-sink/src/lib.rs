//! Kafka sink (to be implemented).
