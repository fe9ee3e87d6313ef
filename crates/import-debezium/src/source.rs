//! `[source]`: the PostgreSQL connection URL, the slot, the publication and the outbox tables,
//! from the connector's `database.*`, `plugin.name`, `slot.name`, `publication.*` and
//! `table.include.list` keys.
//!
//! # Invariants
//! - `source.url` never holds the password; a note says how to supply it
//!   (`SIPHON_SOURCE_URL`). The user and database names are percent-encoded, so any name
//!   round-trips through the URL.
//! - A value Siphon cannot read (a config-provider reference or a template placeholder)
//!   becomes a visible placeholder in the URL (`HOST`, `USER`, ...) and a note.
//! - `source.slot` is the connector's slot only if it is a pgoutput slot; otherwise a new slot
//!   name, with a note on how to switch without losing events.
//! - `source.tables` lists only plain `schema.table` names; a regular expression in the
//!   include list is a note, never a guess, and an empty result falls back to Siphon's
//!   default with a note.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::output::{string, Output};
use super::props::{describe_reference, is_placeholder, keyed, provider_reference, Props};

/// Fills `[source]`; returns the outbox tables written (for the predicate check).
pub(super) fn section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) -> Vec<String> {
    // Connection URL, without the password.
    let mut part = |key: &str, placeholder: &str, notes: &mut Vec<String>| -> Option<String> {
        let value = props.take(key)?;
        if let Some((provider, rest)) = provider_reference(&value) {
            notes.push(format!(
                "`{key}` comes from {}, which Siphon does not read: replace {placeholder} in source.url",
                describe_reference(provider, rest)
            ));
            return Some(placeholder.to_owned());
        }
        if is_placeholder(&value) {
            notes.push(format!(
                "`{key}` = `{value}` is a template placeholder: replace {placeholder} in source.url"
            ));
            return Some(placeholder.to_owned());
        }
        Some(value)
    };
    let host = part("database.hostname", "HOST", notes).unwrap_or_else(|| {
        notes.push("`database.hostname` is not set: replace HOST in source.url".into());
        "HOST".into()
    });
    let port = match part("database.port", "5432", notes) {
        None => 5432,
        Some(p) => p.parse::<u16>().unwrap_or_else(|_| {
            notes.push(format!(
                "`database.port` = `{p}` is not a port number: 5432 written instead"
            ));
            5432
        }),
    };
    let user = part("database.user", "USER", notes).unwrap_or_else(|| {
        notes.push("`database.user` is not set: replace USER in source.url".into());
        "USER".into()
    });
    let dbname = part("database.dbname", "DBNAME", notes).unwrap_or_else(|| {
        notes.push("`database.dbname` is not set: replace DBNAME in source.url".into());
        "DBNAME".into()
    });
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!(
        "postgres://{}@{host}:{port}/{}",
        percent_encode(&user),
        percent_encode(&dbname)
    );
    out.source.insert("url".into(), string(url.clone()));
    let with_password = url.replacen('@', ":PASSWORD@", 1);
    match props.take("database.password") {
        Some(p) => match provider_reference(&p) {
            Some((provider, rest)) => notes.push(format!(
                "The database password comes from {}, which Siphon does not read, and is not written into the file: set SIPHON_SOURCE_URL={with_password} in Siphon's environment (or put the password into source.url)",
                describe_reference(provider, rest)
            )),
            None => notes.push(format!(
                "The database password is not written into the file: set SIPHON_SOURCE_URL={with_password} in Siphon's environment (or put the password into source.url)"
            )),
        },
        None => notes.push(format!(
            "`database.password` is not set: if the server needs one, set SIPHON_SOURCE_URL={with_password}"
        )),
    }

    // Logical decoding plugin, slot and publication.
    let plugin = props.take("plugin.name");
    let slot = props.take("slot.name").unwrap_or_else(|| "debezium".into());
    match plugin.as_deref() {
        Some("pgoutput") => {
            out.source.insert("slot".into(), string(slot));
        }
        other => {
            let new_slot = if slot == "siphon" {
                "siphon_pgoutput"
            } else {
                "siphon"
            };
            let shown = match other {
                Some(p) => format!("`plugin.name` is `{p}`"),
                None => {
                    "`plugin.name` is not set, so Debezium used its default, decoderbufs".into()
                }
            };
            notes.push(format!(
                "{shown}: Siphon reads pgoutput slots only, so it cannot continue from slot `{slot}`. \
                 source.slot is set to a new slot, `{new_slot}`: create it while Debezium still runs \
                 (SELECT pg_create_logical_replication_slot('{new_slot}', 'pgoutput')), then stop Debezium \
                 and start Siphon; events between the two are sent again (same `id` header), none is lost. \
                 Drop `{slot}` afterwards"
            ));
            out.source.insert("slot".into(), string(new_slot));
        }
    }
    let publication = props
        .take("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());
    out.source
        .insert("publication".into(), string(publication.clone()));
    let autocreate = props
        .take("publication.autocreate.mode")
        .unwrap_or_else(|| "all_tables".into());
    match autocreate.as_str() {
        "filtered" => {}
        "all_tables" => notes.push(format!(
            "`publication.autocreate.mode` is `all_tables`{}: if Debezium created `{publication}`, it is FOR ALL TABLES. \
             Siphon uses the existing publication as it is and skips changes of tables not in source.tables",
            if props.peek("publication.autocreate.mode").is_none() { " (Debezium's default)" } else { "" }
        )),
        other => notes.push(format!(
            "`publication.autocreate.mode` = `{other}`: Siphon uses publication `{publication}` if it exists and otherwise creates it FOR TABLE <source.tables>"
        )),
    }

    // Tables.
    let include = props
        .take("table.include.list")
        .map(|v| ("table.include.list", v))
        .or_else(|| {
            props
                .take("table.whitelist")
                .map(|v| ("table.whitelist", v))
        });
    let mut tables = Vec::new();
    match include {
        None => notes.push(
            "Neither `table.include.list` nor `table.whitelist` is set, so Debezium captured every table of the publication: \
             source.tables is set to Siphon's default, public.outbox; list the outbox tables explicitly"
                .into(),
        ),
        Some((key, list)) => {
            for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                match plain_table(entry) {
                    Some(table) => {
                        if table.chars().any(|c| c.is_ascii_uppercase()) {
                            notes.push(format!(
                                "`{key}` entry `{entry}` has upper-case letters: Debezium matched it ignoring case, Siphon folds unquoted names to lower case; \
                                 if the table name really has upper-case letters, write it quoted in source.tables (\"\\\"Schema\\\".\\\"Table\\\"\")"
                            ));
                        }
                        tables.push(table);
                    }
                    None => notes.push(format!(
                        "`{key}` entry `{entry}` is a regular expression, not a table name: Siphon needs the outbox tables by name; add them to source.tables"
                    )),
                }
            }
            if tables.is_empty() {
                notes.push(format!(
                    "No table of `{key}` could be carried over: source.tables is set to Siphon's default, public.outbox; list the outbox tables explicitly"
                ));
            }
        }
    }
    if tables.is_empty() {
        tables.push("public.outbox".into());
    }
    out.source.insert(
        "tables".into(),
        toml::Value::Array(tables.iter().map(|t| string(t.clone())).collect()),
    );

    if let Some(ms) = props.take("status.update.interval.ms") {
        match ms.parse::<i64>() {
            Ok(ms) => match siphon_config::ranges::refusal("source.status_interval_ms", ms) {
                None => {
                    out.source
                        .insert("status_interval_ms".into(), toml::Value::Integer(ms));
                }
                Some(why) => notes.push(format!(
                    "`status.update.interval.ms` = `{ms}` is not carried over: {why}"
                )),
            },
            Err(_) => notes.push(format!(
                "`status.update.interval.ms` = `{ms}` is not a number of milliseconds: not carried over"
            )),
        }
    }

    for key in props.keys_with_prefix("database.") {
        if key == "database.server.name" {
            continue; // Debezium 1.x's topic.prefix: read with the router.
        }
        let value = props.take(&key).unwrap_or_default();
        let reason = if key.starts_with("database.ssl") {
            "TLS to PostgreSQL is not configurable in Siphon yet"
        } else if key == "database.initial.statements" {
            "Siphon runs no initial statements on its connections"
        } else {
            "no Siphon equivalent"
        };
        notes.push(keyed(&key, &value, reason));
    }
    tables
}

/// A `table.include.list` entry that names one table: `schema.table`, with the dot possibly
/// escaped (`schema\.table`) and optional `^`/`$` anchors. Returns `schema.table`.
fn plain_table(entry: &str) -> Option<String> {
    let entry = entry.strip_prefix('^').unwrap_or(entry);
    let entry = entry.strip_suffix('$').unwrap_or(entry);
    let name = entry.replace("\\.", ".");
    let (schema, table) = name.split_once('.')?;
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
            && !s.starts_with(|c: char| c.is_ascii_digit() || c == '$')
    };
    (ident(schema) && ident(table)).then_some(name)
}

/// What stays as it is in a URL component: RFC 3986's unreserved characters (letters, digits,
/// `-`, `.`, `_`, `~`). Every other byte is percent-encoded, so any user or database name
/// reads back unchanged.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes what is not unreserved in a URL component (RFC 3986), in upper-case hex.
fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with, parse};

    #[test]
    fn decoderbufs_moves_to_a_new_pgoutput_slot() {
        let import =
            import_debezium(&minimal("").replace("\"plugin.name\": \"pgoutput\",", "")).unwrap();
        let c = parse(&import);
        assert_eq!(c.source.slot, "siphon");
        note_with(
            &import,
            &[
                "decoderbufs",
                "pg_create_logical_replication_slot",
                "debezium",
            ],
        );
    }

    #[test]
    fn awkward_names_are_encoded_into_the_url() {
        let import = import_debezium(&minimal(r#", "database.hostname": "::1", "database.user": "svc@corp", "database.dbname": "my db""#))
            .unwrap();
        let c = parse(&import);
        assert_eq!(c.source.url, "postgres://svc%40corp@[::1]:5432/my%20db");
        let params = siphon_source::ConnectionParams::from_url(&c.source.url).unwrap();
        assert_eq!(params.user, "svc@corp");
        assert_eq!(params.database, "my db");
    }

    #[test]
    fn names_with_reserved_characters_round_trip_through_the_url() {
        let user = "svc:a/b?c#d[e]f@g!$&'()*+,;=%h \u{fc}~-._Z9";
        let dbname = "db/1?x=y&z#w %2F";
        let import = import_debezium(&minimal(&format!(
            r#", "database.user": {}, "database.dbname": {}"#,
            serde_json::Value::from(user),
            serde_json::Value::from(dbname)
        )))
        .unwrap();
        let c = parse(&import);
        // Everything but RFC 3986's unreserved characters is encoded, in upper-case hex.
        assert_eq!(
            c.source.url,
            "postgres://svc%3Aa%2Fb%3Fc%23d%5Be%5Df%40g%21%24%26%27%28%29%2A%2B%2C%3B%3D%25h%20%C3%BC~-._Z9\
             @db:5432/db%2F1%3Fx%3Dy%26z%23w%20%252F"
        );
        let params = siphon_source::ConnectionParams::from_url(&c.source.url).unwrap();
        assert_eq!(params.user, user);
        assert_eq!(params.database, dbname);
        // The password goes after the encoded user, which has no `@` left.
        note_with(
            &import,
            &[
                "SIPHON_SOURCE_URL=postgres://svc%3Aa",
                "%C3%BC~-._Z9:PASSWORD@db:5432/",
            ],
        );
    }
}
