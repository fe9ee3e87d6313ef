//! Why a row was not delivered as its record, and the fix: said once, for the stream's rows
//! and a snapshot's or re-send's alike (the errors of each add where the row was).
//!
//! # Invariants
//! - Every variant names what the operator can change, and `pipeline.on_error` where dead
//!   letters would take the row.
//! - Below the pipeline's and the transfers' errors (which carry it): it imports neither.

use siphon_core::Consequence;
use siphon_router::RouteError;
use siphon_schema_registry::RegistryError;

/// Why a row was not delivered as its record.
#[derive(Debug, thiserror::Error)]
pub enum RowFault {
    /// The router cannot route it (with `on_error = "fail"`).
    #[error("{0} (fix it, or set pipeline.on_error = \"dead-letter\" to send such rows to a dead-letter topic)")]
    Route(Box<RouteError>),
    /// The schema registry refused the record's schema (with `on_error = "fail"`), or refused
    /// Siphon (credentials, the URL): the error names the fix.
    #[error("{error} (subject {subject:?}{})", if error.is_schema_refusal() { "; set pipeline.on_error = \"dead-letter\" to send rows whose schema is refused to a dead-letter topic" } else { "" })]
    Registry {
        subject: String,
        error: Box<RegistryError>,
    },
    /// The payload does not fit the schema registered for it (with `on_error = "fail"`), or
    /// that schema cannot be read.
    #[error("{error} (subject {subject:?}; fix the payload or register a schema it fits, or set pipeline.on_error = \"dead-letter\" to send such rows to a dead-letter topic)")]
    Misfit {
        subject: String,
        error: Box<siphon_router::Misfit>,
    },
}

impl RowFault {
    /// What the fault means for the process: the registry's own, else the operator's to fix.
    pub fn consequence(&self) -> Consequence {
        match self {
            RowFault::Registry { error, .. } => error.consequence(),
            RowFault::Route(_) | RowFault::Misfit { .. } => Consequence::Fix,
        }
    }
}

impl From<siphon_core::engine::registry_write::Refusal<RegistryError>> for RowFault {
    fn from(refusal: siphon_core::engine::registry_write::Refusal<RegistryError>) -> Self {
        use siphon_core::engine::registry_write::Refusal;
        match refusal {
            Refusal::Registry { subject, error, .. } => RowFault::Registry {
                subject,
                error: Box::new(error),
            },
            Refusal::Misfit { subject, error } | Refusal::Unreadable { subject, error } => {
                RowFault::Misfit {
                    subject,
                    error: Box::new(error),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PipelineError;
    use crate::transfer_error::TransferError;

    fn misfit() -> RowFault {
        RowFault::Misfit {
            subject: "orders-value".into(),
            error: Box::new(siphon_router::Misfit {
                id: 7,
                reason: "field n is not an int".into(),
            }),
        }
    }

    #[test]
    fn the_stream_and_the_transfers_name_the_same_fix() {
        let streamed = PipelineError::Row {
            fault: misfit(),
            lsn: pgoutput::Lsn(0x100),
        }
        .to_string();
        let transferred = TransferError::Row {
            table: siphon_source::TableName::parse("public.outbox").expect("name"),
            key: vec!["1".into()],
            fault: misfit(),
        }
        .to_string();
        for said in [&streamed, &transferred] {
            assert!(
                said.contains("orders-value")
                    && said.contains("register a schema it fits")
                    && said.contains("pipeline.on_error = \"dead-letter\""),
                "{said}"
            );
        }
        assert!(
            streamed.ends_with("the row at 0/100 was not delivered"),
            "{streamed}"
        );
        assert!(
            transferred.ends_with("a row of public.outbox with key [\"1\"] was not sent"),
            "{transferred}"
        );
    }
}
