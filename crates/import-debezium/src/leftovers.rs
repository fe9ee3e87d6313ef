//! Everything no section read: a note for each remaining key, with the reason Siphon has no
//! equivalent.
//!
//! # Invariants
//! - Runs last, and notes every key not read before, except `slot.drop.on.stop = false` and
//!   `tasks.max = 1`, which need no action.
//! - `slot.drop.on.stop = true` is a WARNING: Debezium would drop the slot Siphon continues
//!   from.
//! - A key without a known reason is still noted, as an option Siphon does not know.

use super::props::{keyed, Props};

/// Reasons for the connector options Siphon has no equivalent for, by exact key or prefix
/// (a key ending in `.` or `*` is a prefix).
const REASONS: &[(&str, &str)] = &[
    ("tasks.max", "Siphon runs one stream per slot, as the Debezium connector does with its single task"),
    ("snapshot.", "Siphon takes no snapshot: it streams from the slot's confirmed position. An outbox needs none: its rows are events, delivered when they were committed"),
    ("slot.drop.on.stop", "Siphon never drops the slot"),
    ("slot.", "Siphon manages the slot with its own settings"),
    ("heartbeat.", "Siphon writes no heartbeat records and runs no heartbeat query: while no outbox transaction is pending it confirms the server's WAL position from keepalives, so the slot advances without heartbeat writes"),
    ("topic.heartbeat.prefix", "Siphon writes no heartbeat records"),
    ("tombstones.on.delete", "no effect on outbox events: the outbox router ignores deletes (Siphon skips them too)"),
    ("signal.", "Siphon has no signalling (no ad-hoc or incremental snapshots); it reads only the outbox tables"),
    ("incremental.snapshot.", "Siphon takes no snapshots"),
    ("read.only", "Siphon takes no snapshots"),
    ("notification.", "Siphon sends no notifications"),
    ("schema.include.list", "Siphon reads the tables listed in source.tables, not whole schemas"),
    ("schema.exclude.list", "Siphon reads the tables listed in source.tables only"),
    ("schema.", "Siphon keeps no schema history and has no schema options: it learns each outbox table's columns from pgoutput's relation messages"),
    ("table.exclude.list", "Siphon reads the tables listed in source.tables only"),
    ("table.blacklist", "Siphon reads the tables listed in source.tables only"),
    ("column.", "Siphon has no column filters or masks: the outbox router reads the columns its options name"),
    ("message.key.columns", "the record key comes from the outbox router (table.field.event.key)"),
    ("decimal.handling.mode", "changes how Debezium encodes numeric columns; Siphon sends the id, key and payload columns as PostgreSQL prints them, which is what Debezium sends for text, uuid and jsonb columns"),
    ("time.precision.mode", "changes how Debezium encodes temporal columns; not used for the id, key and payload columns Siphon sends"),
    ("binary.handling.mode", "changes how Debezium encodes bytea columns; Siphon reads the outbox columns as text"),
    ("hstore.handling.mode", "changes how Debezium encodes hstore columns; not used by the outbox router's columns"),
    ("interval.handling.mode", "changes how Debezium encodes interval columns; not used by the outbox router's columns"),
    ("money.fraction.digits", "changes how Debezium encodes money columns; not used by the outbox router's columns"),
    ("include.unknown.datatypes", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("field.name.adjustment.mode", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("sanitize.field.names", "changes Debezium's change-event envelope, which the outbox router replaces"),
    ("provide.transaction.metadata", "Siphon writes no transaction metadata records"),
    ("topic.transaction", "Siphon writes no transaction metadata records"),
    ("skipped.operations", "Siphon routes inserts only, as the outbox router does; updates follow table.op.invalid.behavior and deletes are skipped"),
    ("max.batch.size", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("max.queue.size", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("max.queue.size.in.bytes", "Siphon's flow control is pipeline.max_in_flight_records and pipeline.max_in_flight_bytes"),
    ("poll.interval.ms", "Siphon sends records as they arrive (batching is librdkafka's linger.ms)"),
    ("flush.lsn.source", "Siphon always confirms the slot position itself, after Kafka acknowledged every earlier record"),
    ("lsn.flush.", "Siphon always confirms the slot position itself, after Kafka acknowledged every earlier record"),
    ("xmin.fetch.interval.ms", "Siphon does not track xmin"),
    ("errors.", "Kafka Connect's error handling (tolerance, dead-letter queue, error logging) does not carry over"),
    ("event.processing.failure.handling.mode", "Debezium's handling of events it cannot process does not carry over"),
    ("exactly.once.support", "Siphon does not use Kafka transactions: records acknowledged but not yet confirmed to PostgreSQL are sent again after a restart, with the same id header"),
    ("transaction.boundary", "Siphon does not use Kafka transactions"),
    ("offsets.storage.topic", "Siphon keeps its position in the replication slot, not in a Kafka topic"),
    ("offset.", "Siphon keeps its position in the replication slot, not in Kafka Connect offsets"),
    ("consumer.override.", "Siphon has no Kafka consumer"),
    ("admin.override.", "Siphon's admin client (topic creation) uses [kafka.properties] too"),
    ("converters", "custom Debezium column converters are not supported"),
    ("config.action.reload", "Siphon reads its configuration at start"),
    ("custom.metric.tags", "Siphon has no JMX metrics"),
    ("retriable.restart.connector.wait.ms", "Siphon reconnects with capped exponential backoff (pipeline.max_backoff_secs)"),
    ("replica.identity.autoset.values", "Siphon never changes a table's replica identity (an outbox needs only inserts)"),
    ("unavailable.value.placeholder", "Siphon stops with an error on an unchanged TOASTed outbox column rather than writing a placeholder"),
];

/// A note for every key no section read (nothing for the few whose value needs none).
pub(super) fn note_unread(props: &Props, notes: &mut Vec<String>) {
    for (key, value) in props.unread() {
        if key == "slot.drop.on.stop" && value.trim().eq_ignore_ascii_case("true") {
            notes.push(format!(
                "WARNING: `slot.drop.on.stop` is true, so Debezium drops slot `{}` when it stops and Siphon cannot continue from it: \
                 set it to false and restart Debezium before switching, or events committed between Debezium's stop and Siphon's start are lost",
                props.peek("slot.name").unwrap_or("debezium")
            ));
            continue;
        }
        if key == "slot.drop.on.stop" || (key == "tasks.max" && value.trim() == "1") {
            continue;
        }
        let reason = REASONS
            .iter()
            .find(|(k, _)| {
                if k.ends_with('.') {
                    key.starts_with(k)
                } else {
                    key == *k
                }
            })
            .map(|(_, r)| *r)
            .unwrap_or("not a Debezium PostgreSQL option Siphon knows; not carried over");
        notes.push(keyed(key, value, reason));
    }
}

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with};

    #[test]
    fn a_slot_debezium_drops_on_stop_is_a_warning() {
        let import = import_debezium(&minimal(
            r#", "slot.name": "outbox_slot", "slot.drop.on.stop": "true""#,
        ))
        .unwrap();
        note_with(&import, &["WARNING", "outbox_slot", "lost"]);
    }
}
