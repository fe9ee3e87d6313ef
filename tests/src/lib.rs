//! Test harness (to be implemented).
