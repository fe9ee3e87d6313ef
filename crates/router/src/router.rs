//! The [`EventRouter`]: Debezium's record of a row (`crate::routing`) with the formats beyond
//! Debezium's applied to it (`crate::extension`).
//!
//! # Invariants
//! - [`EventRouter::route`] never panics; a row it cannot route is a [`RouteError`], never a
//!   silently dropped record. A deeply nested payload is expanded on a thread with a large
//!   stack.
//! - Without extensions, the record is Debezium's as `crate::routing` made it.

use crate::extension::position::SourcePosition;
use crate::extension::{EventExtensions, ExtensionConfigError, Extensions};
use crate::format::encoding::Format;
use crate::format::expand::ExpansionError;
use crate::routing::binding::TableBinding;
use crate::routing::error::{RouteError, RouterConfigError};
use crate::routing::options::{InvalidOperationBehavior, RouterOptions};
use crate::routing::own_topics::OwnTopics;
use crate::routing::route::{
    Change, Debezium, LogLevel, RegistryRecord, RegistryValue, Routed, RouterContext, SkipReason,
};
use pgoutput::{Relation, TupleData};

/// The stack of the thread that expands a deeper payload: 1000 levels of recursion in the
/// parser, the schema inference, the writers and the drop, with room to spare.
const DEEP_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Debezium's outbox `EventRouter` followed by Kafka Connect's converters, as a pure function.
#[derive(Debug, Clone)]
pub struct EventRouter {
    debezium: Debezium,
    extensions: Extensions,
}

impl EventRouter {
    /// A router with these options and encodings, without Debezium's context headers (as with
    /// `extended.headers.enabled=false`); see [`EventRouter::new_with_context`].
    pub fn new(options: RouterOptions, format: Format) -> Self {
        EventRouter {
            debezium: Debezium::new(options, format),
            extensions: Extensions::default(),
        }
    }

    /// The router with formats beyond Debezium's: protobuf values, CloudEvents, W3C trace
    /// context (see [`crate::extension`]).
    ///
    /// # Errors
    /// An [`ExtensionConfigError`] naming the fix when the combination cannot work.
    pub fn with_extensions(
        mut self,
        extensions: EventExtensions,
    ) -> Result<Self, ExtensionConfigError> {
        extensions.check(self.debezium.options())?;
        if matches!(
            self.debezium.format().value,
            crate::format::encoding::Encoding::Avro
                | crate::format::encoding::Encoding::Registered(_)
        ) && (extensions.protobuf_value || extensions.cloudevents.is_some())
        {
            return Err(ExtensionConfigError::RegistryValue);
        }
        self.extensions.config = extensions;
        Ok(self)
    }

    /// The router refusing every row routed to one of Siphon's own topics with
    /// [`RouteError::OwnTopic`] (see [`OwnTopics`]); set it before the first row is routed.
    pub fn with_own_topics(mut self, own_topics: OwnTopics) -> Self {
        self.debezium = self.debezium.with_own_topics(own_topics);
        self
    }

    /// The formats beyond Debezium's.
    pub fn extensions(&self) -> &EventExtensions {
        &self.extensions.config
    }

    /// How many rows had a malformed trace context (`trace.column` or `trace.state_column`),
    /// left out of their records, since the router was made (shared by its clones).
    pub fn malformed_trace_contexts(&self) -> u64 {
        self.extensions
            .malformed_trace
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A router that, unless `extended.headers.enabled=false`, starts every record's headers
    /// with Debezium 3.2's context headers, in Debezium's order:
    /// `__debezium.context.connectorLogicalName` (`topic.prefix`),
    /// `__debezium.context.taskId`, `__debezium.context.connectorName` and
    /// `__debezium.context.runId`.
    ///
    /// # Errors
    /// [`RouterConfigError::MissingOption`] when the headers are enabled and `topic.prefix` is not
    /// set.
    pub fn new_with_context(
        options: RouterOptions,
        format: Format,
        context: RouterContext,
    ) -> Result<Self, RouterConfigError> {
        Ok(EventRouter {
            debezium: Debezium::new(options, format).with_context(&context)?,
            extensions: Extensions::default(),
        })
    }

    /// The options.
    pub fn options(&self) -> &RouterOptions {
        self.debezium.options()
    }

    /// The key and value encodings.
    pub fn format(&self) -> Format {
        self.debezium.format()
    }

    /// The level at which Debezium logs a skipped change: `info` for a DELETE, and for an
    /// UPDATE `warn` or `error` as `table.op.invalid.behavior` says.
    pub fn log_level(&self, reason: SkipReason) -> LogLevel {
        match (reason, self.options().invalid_operation()) {
            (SkipReason::Delete, _) => LogLevel::Info,
            (SkipReason::Update, InvalidOperationBehavior::Error) => LogLevel::Error,
            (SkipReason::Update, _) => LogLevel::Warn,
        }
    }

    /// Whether [`EventRouter::route_at`] skips every DELETE whatever its row
    /// (`Routed::Skipped(SkipReason::Delete)`, logged at [`EventRouter::log_level`]): true in
    /// every configuration, as Debezium's router ignores deletes. A caller may then skip a
    /// DELETE without decoding its old row, or binding it to a row at all.
    pub fn skips_deletes(&self) -> bool {
        true
    }

    /// Resolves the configured columns in a table, once, when its `Relation` message arrives.
    ///
    /// Columns of the replica identity key are taken as NOT NULL and all others as nullable,
    /// which only shows in the `optional` flags of the json-schemas encoding; use
    /// [`EventRouter::bind_with_not_null`] to give the real constraints.
    ///
    /// # Errors
    /// [`RouteError::MissingColumn`] when a configured column is not in the table,
    /// [`RouteError::UnsupportedColumnType`] or [`RouteError::ColumnTypeMismatch`] when its
    /// type does not fit its use, [`RouteError::RoutingColumnNotText`] when the
    /// `route.by.field` column is not text-like, [`RouteError::UnsupportedEncoding`] when the
    /// encodings cannot write the key or payload column.
    pub fn bind(&self, relation: &Relation) -> Result<TableBinding, RouteError> {
        self.bind_with_not_null(relation, &|_| false)
    }

    /// [`EventRouter::bind`], with `not_null` saying which columns are declared NOT NULL
    /// (`pg_attribute.attnotnull`), as Debezium reads them from the catalog.
    ///
    /// # Errors
    /// As [`EventRouter::bind`].
    pub fn bind_with_not_null(
        &self,
        relation: &Relation,
        not_null: &dyn Fn(&str) -> bool,
    ) -> Result<TableBinding, RouteError> {
        let mut binding = self.debezium.bind(relation, not_null)?;
        binding.extensions = self.extensions.bind(relation)?;
        Ok(binding)
    }

    /// Routes one change of a row of the bound table.
    ///
    /// # Errors
    /// A [`RouteError`] naming the table (and column) when the row cannot become a record:
    /// a NULL id or routing value, a topic Kafka would refuse, a value that is not valid text,
    /// an UPDATE with `table.op.invalid.behavior=fatal`, a payload the JSON expansion cannot
    /// write, or a row that does not match the binding.
    pub fn route(&self, binding: &TableBinding, change: Change<'_>) -> Result<Routed, RouteError> {
        self.route_at(binding, change, &SourcePosition::default())
    }

    /// [`EventRouter::route`] for a change read at `position`, which protobuf values and
    /// CloudEvents carry (with [`EventRouter::route`] they carry zeros and no commit time).
    ///
    /// # Errors
    /// As [`EventRouter::route`].
    pub fn route_at(
        &self,
        binding: &TableBinding,
        change: Change<'_>,
        position: &SourcePosition,
    ) -> Result<Routed, RouteError> {
        match change {
            Change::Insert(row) if self.debezium.needs_deep_stack(binding, row) => {
                self.route_insert_on_deep_stack(binding, row, position)
            }
            Change::Insert(row) => self.route_insert(binding, row, position),
            // Whatever the configuration: `skips_deletes` says so to callers.
            Change::Delete(_) => Ok(Routed::Skipped(SkipReason::Delete)),
            Change::Update { .. } => match self.options().invalid_operation() {
                InvalidOperationBehavior::Warn | InvalidOperationBehavior::Error => {
                    Ok(Routed::Skipped(SkipReason::Update))
                }
                behavior @ InvalidOperationBehavior::Fatal => Err(RouteError::InvalidOperation {
                    table: binding.table().to_owned(),
                    behavior,
                }),
            },
        }
    }

    /// The record of an inserted row: Debezium's, then the extensions applied to it.
    fn route_insert(
        &self,
        binding: &TableBinding,
        row: &TupleData,
        position: &SourcePosition,
    ) -> Result<Routed, RouteError> {
        let config = &self.extensions.config;
        let (mut routed, routed_value) =
            self.debezium.record(binding, row, !config.protobuf_value)?;
        // The router refuses extensions that rewrite the value of a registry format; those
        // that add headers apply to it as to the others.
        if config.is_active() {
            routed.record = self.extensions.finish(
                self.debezium.format(),
                self.debezium.options(),
                binding,
                row,
                position,
                routed_value,
                routed.record,
            )?;
        }
        if config.registry_record_names && routed.value != RegistryValue::AsIs {
            routed.record_name = Extensions::event_type(binding, row)?.map(std::sync::Arc::from);
        }
        Ok(match routed {
            RegistryRecord {
                record,
                key: None,
                value: RegistryValue::AsIs,
                ..
            } => Routed::Record(record),
            registry => Routed::Registry(registry),
        })
    }

    /// [`EventRouter::route_insert`] on a scoped thread with a stack sized for
    /// [`crate::format::expand::MAX_DEPTH`] levels.
    fn route_insert_on_deep_stack(
        &self,
        binding: &TableBinding,
        row: &TupleData,
        position: &SourcePosition,
    ) -> Result<Routed, RouteError> {
        let failed = |reason: ExpansionError| RouteError::JsonExpansion {
            table: binding.table().to_owned(),
            column: binding.payload.name.to_string(),
            reason,
        };
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("siphon-deep-json".to_owned())
                .stack_size(DEEP_STACK_BYTES)
                .spawn_scoped(scope, || self.route_insert(binding, row, position))
                .map_err(|e| failed(ExpansionError::no_deep_thread(&e)))?;
            worker
                .join()
                .map_err(|_| failed(ExpansionError::DeepThreadFailed))?
        })
    }
}
