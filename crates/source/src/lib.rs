//! Replication source (to be implemented).
