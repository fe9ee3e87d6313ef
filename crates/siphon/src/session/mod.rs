//! One streaming session: replication stream -> router -> Kafka, acknowledgements -> watermark.
//!
//! - [`core`]: the pure state machine that decides (what to send, confirm, look up, when to
//!   replace the producer and when to stop), with time as a parameter: siphon-core's session
//!   engine over Siphon's errors.
//! - [`driver`]: the thin async loop that does the IO the core asks for, through a [`Sink`]
//!   that a [`Destination`] opens ([`sink`]: Kafka's; the driver's tests in
//!   `crates/siphon/tests/driver` bring an in-memory one).
//! - [`note`]: what the core noticed, as values; [`recorder`]: the driver's side, which logs
//!   and counts them.
//! - [`ledger`] (from `siphon_core`): the one per-transaction, per-record book behind the
//!   watermark, the window and the latency metrics.
//! - `siphon_core::topic_gate`: the pure queue of records waiting for their topic to be
//!   created, whose steps the driver carries out.
//!
//! # Invariants
//! - The only position ever confirmed to PostgreSQL is the ledger's watermark.
//! - Memory is bounded by the in-flight window (records and bytes), never by the backlog or the
//!   number of transactions in the stream.

pub mod core;
pub mod driver;
pub mod recorder;
pub mod sink;

pub use siphon_core::engine::note;
pub mod transactional;

pub use siphon_core::ledger;

pub use crate::pipeline::{
    ErrorPolicy, ExactlyOnce, NonTransactionalPolicy, PipelineSettings, RoutedKind, Routers,
};
pub use crate::position;
use pgoutput::Lsn;
#[cfg(test)]
use siphon_source::TableName;

pub use driver::{run_session, run_session_with};
pub use sink::{Destination, KafkaDestination, Sink};

/// Exactly-once: how the broker refused a record of a Kafka transaction.
pub type Suspect = siphon_core::engine::suspects::Suspect<crate::error::RecordFault>;

/// Exactly-once: records the broker refused, by position (commit LSN, index in the transaction).
pub type Suspects = siphon_core::engine::suspects::Suspects<crate::error::RecordFault>;

/// State carried from one session to the next.
#[derive(Debug, Default)]
pub struct Carry {
    /// Everything before this position was acknowledged by Kafka (possibly not yet confirmed to
    /// the slot): the next session resumes here if it is past the slot's position and the
    /// server is the same one.
    pub acked_through: Lsn,
    /// The server `acked_through` is a position of (`None`: unknown).
    pub server: Option<siphon_source::ServerIdentity>,
    /// Stalls declared without progress: each doubles the silence the next one needs, across
    /// the reconnects they cause.
    pub stall: siphon_source::stall::Escalation,
    /// A session of this process found (or made) the slot: a later one must not create it anew.
    pub slot_seen: bool,
    /// The publication membership the last session saw: the next one must find the same
    /// publication publishing the outbox tables through rows that were there then.
    pub publication: Option<SeenPublication>,
    /// Exactly-once: records the broker refused in a Kafka transaction.
    pub suspects: Suspects,
}

/// Which catalog rows published the outbox tables at a session's last look, and on which
/// cluster (catalog oids are only comparable within one).
#[derive(Debug, Clone)]
pub struct SeenPublication {
    /// The cluster's system identifier (`None`: the server did not tell).
    pub system_id: Option<String>,
    pub membership: siphon_source::Membership,
}

impl SeenPublication {
    /// The membership seen on the server of identity `server`.
    pub fn new(
        server: Option<&siphon_source::ServerIdentity>,
        membership: siphon_source::Membership,
    ) -> Self {
        SeenPublication {
            system_id: server.map(|s| s.system_id.clone()),
            membership,
        }
    }

    /// Whether `now`, seen by a new session, shows that the publication was created again or
    /// an outbox table added back since this look (a definite error naming the loss); a
    /// membership seen on another cluster is not compared.
    pub fn check(
        &self,
        publication: &str,
        now: &SeenPublication,
    ) -> Result<(), siphon_source::SourceError> {
        if self.system_id != now.system_id {
            return Ok(());
        }
        match siphon_source::membership::change(&self.membership, &now.membership) {
            Some(change) => Err(change.into_error(publication)),
            None => Ok(()),
        }
    }
}

impl Carry {
    /// Where the next session starts on a server of identity `server` whose slot confirmed
    /// `slot_confirmed`: past the slot's position only when the acknowledged position is one of
    /// the same server and timeline. After a failover the new primary's timeline branched off
    /// at or before that position, and a start past the branch point would skip the new
    /// timeline's transactions there; the slot's synchronized position is safe (it only repeats).
    pub fn resume_from(
        &self,
        slot_confirmed: Lsn,
        server: Option<&siphon_source::ServerIdentity>,
    ) -> Lsn {
        match (&self.server, server) {
            (Some(before), Some(now)) if before == now => slot_confirmed.max(self.acked_through),
            _ => {
                if self.acked_through > slot_confirmed {
                    tracing::info!(
                        acked_through = %self.acked_through,
                        slot = %slot_confirmed,
                        before = ?self.server,
                        now = ?server,
                        "not the server of the previous session (failover?): resuming from the slot's position; events after it are sent again"
                    );
                }
                slot_confirmed
            }
        }
    }
}

#[cfg(test)]
mod carry_tests {
    use super::*;
    use siphon_source::ServerIdentity;

    fn server(timeline: u32) -> ServerIdentity {
        ServerIdentity {
            system_id: "7714138579329324802".into(),
            timeline,
        }
    }

    #[test]
    fn a_carried_position_is_used_only_on_the_same_server_and_timeline() {
        let carry = Carry {
            acked_through: Lsn(500),
            server: Some(server(1)),
            ..Carry::default()
        };
        assert_eq!(carry.resume_from(Lsn(300), Some(&server(1))), Lsn(500));
        assert_eq!(carry.resume_from(Lsn(700), Some(&server(1))), Lsn(700));
        // A promoted standby (a new timeline): the slot's position, never past it.
        assert_eq!(carry.resume_from(Lsn(300), Some(&server(2))), Lsn(300));
        // Another cluster, or one that does not say who it is.
        let other = ServerIdentity {
            system_id: "1".into(),
            timeline: 1,
        };
        assert_eq!(carry.resume_from(Lsn(300), Some(&other)), Lsn(300));
        assert_eq!(carry.resume_from(Lsn(300), None), Lsn(300));
        assert_eq!(
            Carry::default().resume_from(Lsn(300), Some(&server(1))),
            Lsn(300)
        );
    }

    fn seen(system_id: &str, publication: u32) -> SeenPublication {
        let table = TableName::parse("outbox").expect("valid name");
        SeenPublication {
            system_id: Some(system_id.into()),
            membership: siphon_source::Membership {
                publication,
                tables: [(
                    table,
                    [siphon_source::membership::Publisher::Table(publication + 1)].into(),
                )]
                .into(),
            },
        }
    }

    #[test]
    fn a_publication_seen_before_is_compared_only_on_the_same_cluster() {
        let before = seen("1", 10);
        assert!(before.check("p", &seen("1", 10)).is_ok());
        let err = before
            .check("p", &seen("1", 20))
            .expect_err("created again on the same cluster");
        assert!(!err.is_transient());
        assert!(
            err.to_string().contains("dropped and created again"),
            "{err}"
        );
        // Another cluster's catalog oids say nothing about this one's.
        assert!(before.check("p", &seen("2", 20)).is_ok());
    }
}
