//! Outbox routing (to be implemented).
