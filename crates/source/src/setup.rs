//! Checks the server and creates or validates the slot and the publication.
//!
//! Runs over an ordinary SQL connection before streaming starts.
//!
//! # Invariants
//! - A slot that exists is never dropped or recreated here: its `confirmed_flush_lsn` is the
//!   only record of what has been delivered.
//! - Every failure names what to change (a setting, a grant, a command to run).
//! - A publication that would name a partitioned outbox table's changes by its partitions
//!   (`publish_via_partition_root` off) is refused: those changes could not be routed.
//! - Creating the slot waits for the transactions running at that moment; while it waits, the
//!   backends it waits for are logged every few seconds (see [`crate::slot_wait`]).
//! - A slot that decodes two-phase transactions is refused with the fix (see
//!   [`crate::two_phase`]); Siphon creates its own slots without two-phase decoding.
//! - Losing the race to create the publication or the slot to another process (42710
//!   duplicate_object, or 23505 on the catalog's name index) is not an error: what the other
//!   created is checked and used; a slot still being created is waited for like a busy one.
//! - While streaming, the publication is not only checked by name: a look that finds another
//!   publication, or an outbox table published only through catalog rows that the previous
//!   look did not see, is a definite error (see [`crate::membership`]), because the events of
//!   the gap were not published.

use crate::config::{quote_ident, quote_literal, Endpoint};
use crate::error::{Interruption, PublicationProblem, SetupProblem};
use crate::failover;
use crate::locate::{locate, Located, ServerIdentity};
use crate::{SourceConfig, SourceError, TableName};
use pgoutput::Lsn;
use std::collections::BTreeSet;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;
use tracing::{info, warn};

/// What [`prepare`] does when the slot does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingSlot {
    /// Create it at the server's current position (the first session of a process).
    Create,
    /// Stop with a definite error: this process streamed from the slot before, so it was dropped
    /// or the server is a promoted standby without a synchronized copy; a new slot would start
    /// after the events committed meanwhile and lose them without a word.
    Refuse,
    /// Leave it missing ([`SlotState::exists`] is false): the caller creates it with a snapshot
    /// of the outbox tables (see [`crate::snapshot`]).
    Leave,
}

/// What the slot looked like when streaming was about to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// Where streaming resumes: everything before it was delivered.
    pub confirmed_flush_lsn: Lsn,
    /// Whether this run created the slot.
    pub created: bool,
    /// Whether the slot exists (false only with [`MissingSlot::Leave`]; the position is then
    /// meaningless until the caller created it).
    pub exists: bool,
    /// The host of `source.url` that was checked: the session's other connections go there.
    pub endpoint: Endpoint,
    /// Which server that is (`None` when it does not say): positions carried over from a
    /// session on another server (before a failover) must not be used to skip WAL.
    pub identity: Option<ServerIdentity>,
    /// Which catalog rows publish the outbox tables now: a later look that finds other ones
    /// (the publication created again, a table added back) means events went unpublished.
    pub publication: crate::Membership,
    /// The slot exists without failover while `source.failover` is on: the replication
    /// connection turns failover on before it starts (`ALTER_REPLICATION_SLOT` is a replication
    /// command).
    pub enable_failover: bool,
}

/// Connects over SQL to the host of `source.url` that fits its `target_session_attrs`, checks
/// `wal_level`, the tables, the publication and the slot, creating the last two when they are
/// missing.
pub async fn prepare(
    config: &SourceConfig,
    missing: MissingSlot,
) -> Result<SlotState, SourceError> {
    prepare_with(config, missing, &crate::SetupWait::default()).await
}

/// [`prepare`], telling `wait` what creating the slot waits for while it waits (see
/// [`crate::slot_wait`]).
pub async fn prepare_with(
    config: &SourceConfig,
    missing: MissingSlot,
    wait: &crate::SetupWait,
) -> Result<SlotState, SourceError> {
    let params = crate::ConnectionParams::from_url(&config.url)?;
    let Located { client, endpoint } = locate(&config.url).await?;
    check_wal_level(&client).await?;
    let version = server_version_num(&client).await?;
    if config.failover {
        failover::check_version(version)?;
    }
    let partitioned = check_tables(&client, &config.tables).await?;
    ensure_publication(&client, &config.publication, &config.tables, &partitioned).await?;
    let slot = ensure_slot(
        &client,
        &SlotRequest {
            name: &config.slot,
            user: Some(&params.user),
            failover: config.failover,
            version,
            missing,
            watch: crate::slot_wait::Watch {
                url: &config.url,
                endpoint: &endpoint,
                wait,
            },
        },
    )
    .await?;
    let publication =
        read_membership(&client, &config.publication, &config.tables, version).await?;
    if config.failover {
        let standby_slots = failover::standby_slots(&client).await?;
        if let Some(problem) = standby_slots.problem() {
            warn!(slot = %config.slot, "{problem}");
        }
    }
    Ok(SlotState {
        confirmed_flush_lsn: slot.confirmed_flush_lsn,
        created: slot.created,
        exists: slot.exists,
        enable_failover: config.failover && !slot.failover,
        publication,
        identity: crate::locate::identity(&client).await,
        endpoint,
    })
}

async fn check_wal_level(client: &Client) -> Result<(), SourceError> {
    let row = client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::WalLevel, e))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(SetupProblem::WalLevel { level }.into());
    }
    Ok(())
}

/// Checks that every outbox table exists; returns those that are partitioned.
async fn check_tables(
    client: &Client,
    tables: &[TableName],
) -> Result<BTreeSet<TableName>, SourceError> {
    let mut partitioned = BTreeSet::new();
    for table in tables {
        let row = client
            .query_one(
                "SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))",
                &[&table.quoted()],
            )
            .await
            .map_err(|e| SourceError::from_sql(crate::error::Query::OutboxTables, e))?;
        let kind: Option<String> = row.get(0);
        match kind.as_deref() {
            None => {
                return Err(SetupProblem::MissingTable {
                    table: table.clone(),
                }
                .into())
            }
            Some("p") => {
                partitioned.insert(table.clone());
            }
            Some(_) => {}
        }
    }
    Ok(partitioned)
}

/// The first PostgreSQL version (`server_version_num`) with `publish_via_partition_root`.
const PUBLISH_VIA_ROOT_VERSION: i32 = 130_000;

/// A publication as the catalog describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PublicationFlags {
    all_tables: bool,
    via_root: bool,
    /// `pubinsert`: INSERTs are published (without them no event is ever seen).
    inserts: bool,
}

pub(crate) async fn server_version_num(client: &Client) -> Result<i32, SourceError> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::ServerVersion, e))?;
    Ok(row.get(0))
}

async fn publication_flags(
    client: &Client,
    publication: &str,
    version: i32,
) -> Result<Option<PublicationFlags>, SourceError> {
    let sql = if version >= PUBLISH_VIA_ROOT_VERSION {
        "SELECT puballtables, pubviaroot, pubinsert FROM pg_publication WHERE pubname = $1"
    } else {
        "SELECT puballtables, false, pubinsert FROM pg_publication WHERE pubname = $1"
    };
    let row = client
        .query_opt(sql, &[&publication])
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::Publication, e))?;
    Ok(row.map(|r| PublicationFlags {
        all_tables: r.get(0),
        via_root: r.get(1),
        inserts: r.get(2),
    }))
}

/// Whether a failed `CREATE` lost a race with another instance creating the same object
/// (42710 duplicate_object, or 23505 unique_violation on the catalog's name index).
fn lost_creation_race(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::DUPLICATE_OBJECT || *c == SqlState::UNIQUE_VIOLATION
    )
}

async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableName],
    partitioned: &BTreeSet<TableName>,
) -> Result<(), SourceError> {
    let version = server_version_num(client).await?;
    let flags = match publication_flags(client, publication, version).await? {
        Some(flags) => {
            info!(
                publication,
                "using the existing publication as it is (its published operations are left unchanged)"
            );
            flags
        }
        None => {
            let list: Vec<String> = tables.iter().map(TableName::quoted).collect();
            // Only INSERTs become events (UPDATEs are published to warn about them): DELETEs
            // of outbox rows would cross the wire for nothing. Partitions must be published
            // under their root's name: pgoutput would otherwise name each change by its
            // partition, which is not an outbox table. From PostgreSQL 18 stored generated
            // columns can be published: an outbox column computed by the table then reaches
            // the router (see `crate::generated`).
            let with = if version >= crate::generated::PUBLISH_GENERATED_VERSION {
                " WITH (publish = 'insert, update', publish_via_partition_root = true, publish_generated_columns = stored)"
            } else if version >= PUBLISH_VIA_ROOT_VERSION {
                " WITH (publish = 'insert, update', publish_via_partition_root = true)"
            } else {
                " WITH (publish = 'insert, update')"
            };
            // A logical-message outbox needs no table: messages are sent whatever the
            // publication holds.
            let what = if list.is_empty() {
                String::new()
            } else {
                format!(" FOR TABLE {}", list.join(", "))
            };
            let sql = format!(
                "CREATE PUBLICATION {}{what}{with}",
                quote_ident(publication)
            );
            match client.batch_execute(&sql).await {
                Ok(()) => {
                    info!(publication, tables = %list.join(", "), "created publication");
                    return Ok(());
                }
                Err(e) if lost_creation_race(&e) => {
                    info!(
                        publication,
                        "publication was created by another instance at the same time; checking it"
                    );
                    publication_flags(client, publication, version)
                        .await?
                        .ok_or_else(|| {
                            SourceError::from(Interruption::PublicationGone {
                                publication: publication.to_owned(),
                            })
                        })?
                }
                Err(e) => {
                    return Err(SourceError::from_sql(
                        crate::error::SourceOperation::CreatePublication { command: sql },
                        e,
                    ))
                }
            }
        }
    };
    publication_check(client, publication, flags, tables, partitioned).await
}

/// Checks, while streaming, that the publication still exists and still publishes every outbox
/// table's INSERTs, and that it is still the publication (and the membership) of `remembered`,
/// the previous look; returns this look's membership, for the next one.
///
/// None of these losses is reported by the stream itself: from PostgreSQL 18 a missing
/// publication is skipped with a warning the replication protocol does not surface, and a table
/// removed from a publication silently stops its changes on every version. A publication
/// dropped and created again, or a table taken out and added back, between two looks leaves
/// the events of the gap unpublished while every look by name finds all well: the catalog rows'
/// identities tell (see [`crate::membership`]).
pub async fn verify_publication(
    client: &Client,
    publication: &str,
    tables: &[TableName],
    remembered: &crate::Membership,
) -> Result<crate::Membership, SourceError> {
    let version = server_version_num(client).await?;
    let Some(flags) = publication_flags(client, publication, version).await? else {
        return Err(missing_publication(publication));
    };
    let partitioned = check_tables(client, tables).await?;
    if let Err(problem) = publication_check(client, publication, flags, tables, &partitioned).await
    {
        // The queries do not share a snapshot: a publication dropped between them looks like
        // one without the tables. Say what happened, not the ALTER that cannot work.
        if publication_flags(client, publication, version)
            .await?
            .is_none()
        {
            return Err(missing_publication(publication));
        }
        return Err(problem);
    }
    let now = read_membership(client, publication, tables, version).await?;
    match crate::membership::change(remembered, &now) {
        Some(change) => Err(change.into_error(publication)),
        None => Ok(now),
    }
}

/// The membership of the outbox tables in `publication`; a definite error when it is missing.
async fn read_membership(
    client: &Client,
    publication: &str,
    tables: &[TableName],
    version: i32,
) -> Result<crate::Membership, SourceError> {
    crate::membership::read(client, publication, tables, version)
        .await?
        .ok_or_else(|| missing_publication(publication))
}

fn missing_publication(publication: &str) -> SourceError {
    SetupProblem::PublicationDropped {
        publication: publication.to_owned(),
    }
    .into()
}

async fn publication_check(
    client: &Client,
    publication: &str,
    flags: PublicationFlags,
    tables: &[TableName],
    partitioned: &BTreeSet<TableName>,
) -> Result<(), SourceError> {
    let published = if flags.all_tables {
        None
    } else {
        let rows = client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(|e| SourceError::from_sql(crate::error::Query::PublicationTables, e))?;
        Some(
            rows.iter()
                .map(|r| TableName {
                    schema: r.get(0),
                    name: r.get(1),
                })
                .collect(),
        )
    };
    publication_problem(publication, flags, tables, partitioned, published.as_ref())
        .map_or(Ok(()), |problem| {
            Err(SetupProblem::Publication(problem).into())
        })
}

/// What is wrong with an existing publication (its message names the commands that fix it).
///
/// `published` is what `pg_publication_tables` lists (`None` for `FOR ALL TABLES`): the leaf
/// partitions of a partitioned table when `publish_via_partition_root` is off, the table itself
/// when it is on.
fn publication_problem(
    publication: &str,
    flags: PublicationFlags,
    tables: &[TableName],
    partitioned: &BTreeSet<TableName>,
    published: Option<&BTreeSet<TableName>>,
) -> Option<PublicationProblem> {
    let by_partition: Vec<TableName> = if flags.via_root {
        Vec::new()
    } else {
        partitioned.iter().cloned().collect()
    };
    // With publish_via_partition_root off the catalog lists the partitions of a partitioned
    // table, not the table: its membership is only known once the first fix is made.
    let missing: Vec<TableName> = published.map_or_else(Vec::new, |published| {
        tables
            .iter()
            .filter(|t| flags.via_root || !partitioned.contains(t))
            .filter(|t| !published.contains(t))
            .cloned()
            .collect()
    });
    if flags.inserts && by_partition.is_empty() && missing.is_empty() {
        None
    } else {
        Some(PublicationProblem {
            publication: publication.to_owned(),
            no_inserts: !flags.inserts,
            by_partition,
            missing,
        })
    }
}

async fn read_slot(
    client: &Client,
    slot: &str,
    version: i32,
) -> Result<Option<tokio_postgres::Row>, SourceError> {
    let failover = if version >= failover::FAILOVER_SLOTS_VERSION {
        "failover"
    } else {
        "false"
    };
    let two_phase = if version >= crate::two_phase::SLOT_TWO_PHASE_COLUMN_VERSION {
        "two_phase"
    } else {
        "false"
    };
    client
        .query_opt(
            &format!(
                "SELECT plugin, slot_type, database, confirmed_flush_lsn, wal_status, {failover}, {two_phase} \
                 FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::ReplicationSlot, e))
}

/// The slot Siphon needs.
struct SlotRequest<'a> {
    name: &'a str,
    user: Option<&'a str>,
    /// Create it as a failover slot (PostgreSQL 17+, checked before).
    failover: bool,
    version: i32,
    missing: MissingSlot,
    /// Where to say what creating the slot waits for.
    watch: crate::slot_wait::Watch<'a>,
}

/// The slot as found (or created).
struct FoundSlot {
    confirmed_flush_lsn: Lsn,
    created: bool,
    exists: bool,
    /// Whether the slot is a failover slot.
    failover: bool,
}

async fn ensure_slot(client: &Client, request: &SlotRequest<'_>) -> Result<FoundSlot, SourceError> {
    let slot = request.name;
    let user = request.user;
    let row = match read_slot(client, slot, request.version).await? {
        Some(row) => row,
        None if request.missing == MissingSlot::Refuse => {
            return Err(SetupProblem::SlotGone {
                slot: slot.to_owned(),
            }
            .into());
        }
        None if request.missing == MissingSlot::Leave => {
            return Ok(FoundSlot {
                confirmed_flush_lsn: Lsn::ZERO,
                created: false,
                exists: false,
                failover: request.failover,
            });
        }
        None => {
            let sql = if request.failover {
                // (slot_name, plugin, temporary, twophase, failover)
                format!(
                    "SELECT lsn FROM pg_create_logical_replication_slot({}, 'pgoutput', false, false, true)",
                    quote_literal(slot)
                )
            } else {
                format!(
                    "SELECT lsn FROM pg_create_logical_replication_slot({}, 'pgoutput')",
                    quote_literal(slot)
                )
            };
            // Creation waits for the transactions running now to end: say which while it does.
            let creator: i32 = client
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .map_err(|e| SourceError::from_sql(crate::error::Query::BackendPid, e))?
                .get(0);
            let creation = client.query_one(&sql, &[]);
            match crate::slot_wait::while_waiting(creation, &request.watch, slot, creator).await {
                Ok(created) => {
                    let position = lsn(created.get(0));
                    info!(slot, lsn = %position, failover = request.failover, "created replication slot");
                    return Ok(FoundSlot {
                        confirmed_flush_lsn: position,
                        created: true,
                        exists: true,
                        failover: request.failover,
                    });
                }
                // Another instance created it first: use it (streaming waits as a standby
                // while that instance holds it).
                Err(e) if lost_creation_race(&e) => {
                    info!(slot, "replication slot was created by another instance at the same time; using it");
                    read_slot(client, slot, request.version)
                        .await?
                        .ok_or_else(|| {
                            SourceError::from(Interruption::SlotGone {
                                slot: slot.to_owned(),
                            })
                        })?
                }
                Err(e) => {
                    let subject = crate::error::Subject {
                        slot: Some(slot),
                        user,
                        login: None,
                    };
                    return Err(SourceError::from_sql_about(
                        crate::error::SourceOperation::CreateReplicationSlot,
                        subject,
                        e,
                    ));
                }
            }
        }
    };
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let database: Option<String> = row.get(2);
    let confirmed: Option<PgLsn> = row.get(3);
    let wal_status: Option<String> = row.get(4);
    let failover: bool = row.get(5);
    let two_phase: bool = row.get(6);
    // While another process is still creating the slot, its plugin name is empty and it has no
    // confirmed position yet: wait for it like a standby rather than judge a half-made slot.
    if slot_type == "logical" && (plugin.as_deref() == Some("") || confirmed.is_none()) {
        return Err(Interruption::SlotBeingCreated {
            slot: slot.to_owned(),
        }
        .into());
    }
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(SetupProblem::SlotKind {
            slot: slot.to_owned(),
            slot_type,
            plugin,
        }
        .into());
    }
    let current_db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::CurrentDatabase, e))?
        .get(0);
    if database.as_deref() != Some(current_db.as_str()) {
        return Err(SetupProblem::SlotDatabase {
            slot: slot.to_owned(),
            database,
            current: current_db,
        }
        .into());
    }
    if wal_status.as_deref() == Some("lost") {
        return Err(SetupProblem::SlotInvalidated {
            slot: slot.to_owned(),
        }
        .into());
    }
    if two_phase && request.version >= crate::two_phase::PGOUTPUT_TWO_PHASE_VERSION {
        return Err(crate::two_phase::refusal(slot, Some(request.version)));
    }
    Ok(FoundSlot {
        confirmed_flush_lsn: confirmed.map_or(Lsn::ZERO, lsn),
        created: false,
        exists: true,
        failover,
    })
}

/// A `pg_lsn` as read with its typed conversion.
fn lsn(value: PgLsn) -> Lsn {
    Lsn(u64::from(value))
}

/// Reads the slot's `confirmed_flush_lsn` (for status reports and tests).
pub async fn confirmed_flush_lsn(client: &Client, slot: &str) -> Result<Option<Lsn>, SourceError> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::SlotPosition, e))?;
    Ok(row.and_then(|r| r.get::<_, Option<PgLsn>>(0)).map(lsn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<TableName> {
        list.iter()
            .map(|n| TableName::parse(n).expect("valid name"))
            .collect()
    }

    #[test]
    fn a_partitioned_outbox_needs_publish_via_root_not_add_table() {
        let tables: Vec<TableName> = names(&["outbox"]).into_iter().collect();
        let partitioned = names(&["outbox"]);
        let off = PublicationFlags {
            all_tables: false,
            via_root: false,
            inserts: true,
        };
        // pg_publication_tables lists the partitions when pubviaroot is off.
        let leaves = names(&["outbox_2026_01", "outbox_2026_02"]);
        let message = publication_problem("p", off, &tables, &partitioned, Some(&leaves))
            .expect("a problem")
            .to_string();
        assert!(
            message.contains(r#"ALTER PUBLICATION "p" SET (publish_via_partition_root = true)"#),
            "{message}"
        );
        assert!(!message.contains("ADD TABLE"), "{message}");
        // FOR ALL TABLES without pubviaroot names partitions too.
        let all = PublicationFlags {
            all_tables: true,
            via_root: false,
            inserts: true,
        };
        assert!(publication_problem("p", all, &tables, &partitioned, None).is_some());
        // With pubviaroot on the catalog lists the root.
        let on = PublicationFlags {
            all_tables: false,
            via_root: true,
            inserts: true,
        };
        assert_eq!(
            publication_problem("p", on, &tables, &partitioned, Some(&names(&["outbox"]))),
            None
        );
        let message = publication_problem("p", on, &tables, &partitioned, Some(&names(&["other"])))
            .expect("a problem")
            .to_string();
        assert!(
            message.contains(r#"ADD TABLE "public"."outbox""#),
            "{message}"
        );
    }

    #[test]
    fn a_publication_without_inserts_is_refused_with_the_fix() {
        let tables: Vec<TableName> = names(&["outbox"]).into_iter().collect();
        let no_inserts = PublicationFlags {
            all_tables: false,
            via_root: true,
            inserts: false,
        };
        let message = publication_problem(
            "p",
            no_inserts,
            &tables,
            &BTreeSet::new(),
            Some(&names(&["outbox"])),
        )
        .expect("a problem")
        .to_string();
        assert!(
            message.contains(r#"ALTER PUBLICATION "p" SET (publish = 'insert, update')"#),
            "{message}"
        );
    }

    #[test]
    fn a_plain_outbox_needs_only_membership() {
        let tables: Vec<TableName> = names(&["outbox"]).into_iter().collect();
        let off = PublicationFlags {
            all_tables: false,
            via_root: false,
            inserts: true,
        };
        let none = BTreeSet::new();
        assert_eq!(
            publication_problem("p", off, &tables, &none, Some(&names(&["outbox"]))),
            None
        );
        let message = publication_problem("p", off, &tables, &none, Some(&none))
            .expect("a problem")
            .to_string();
        assert!(
            message.contains(r#"run ALTER PUBLICATION "p" ADD TABLE "public"."outbox""#),
            "{message}"
        );
        assert!(!message.contains("publish_via_partition_root"), "{message}");
    }
}
