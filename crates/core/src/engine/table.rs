//! The name of a table: schema-qualified, as the catalog stores it (not quoted). The session
//! engine keys its routers and its outbox tables by it; the source reads and quotes it.
//!
//! # Invariants
//! - A [`TableName`] always has a schema (`public` when the user gave none).
//! - [`quote_ident`] doubles the quote it is delimited by, so any text becomes one identifier.

use std::fmt;

/// A schema-qualified table name, as stored in the catalog (not quoted).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

/// A text that is not `schema.table` or `table`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {text:?}: expected schema.table")]
pub struct InvalidTableName {
    pub text: String,
}

impl TableName {
    /// Parses `schema.table` or `table` (schema `public`). Double quotes keep dots and case.
    pub fn parse(text: &str) -> Result<Self, InvalidTableName> {
        let invalid = || InvalidTableName {
            text: text.to_owned(),
        };
        let parts = split_identifiers(text).ok_or_else(invalid)?;
        match parts.as_slice() {
            [name] => Ok(TableName {
                schema: "public".into(),
                name: name.clone(),
            }),
            [schema, name] => Ok(TableName {
                schema: schema.clone(),
                name: name.clone(),
            }),
            _ => Err(invalid()),
        }
    }

    /// The name quoted for SQL: `"schema"."name"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Quotes an identifier for SQL.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Splits `a.b` into identifiers; unquoted ones are folded to lower case as PostgreSQL does.
fn split_identifiers(text: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut ident = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        ident.push('"');
                    }
                    '"' => break,
                    c => ident.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                ident.extend(c.to_lowercase());
                chars.next();
            }
        }
        if ident.is_empty() {
            return None;
        }
        parts.push(ident);
        match chars.next() {
            None => return Some(parts),
            Some('.') => continue,
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_default_to_public_and_fold_case() {
        assert_eq!(
            TableName::parse("outbox").unwrap().to_string(),
            "public.outbox"
        );
        assert_eq!(
            TableName::parse("App.Outbox").unwrap().to_string(),
            "app.outbox"
        );
        let quoted = TableName::parse("\"My.Schema\".\"Out\"\"box\"").unwrap();
        assert_eq!(quoted.schema, "My.Schema");
        assert_eq!(quoted.name, "Out\"box");
        assert_eq!(quoted.quoted(), "\"My.Schema\".\"Out\"\"box\"");
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse("").is_err());
        assert!(TableName::parse("a.").is_err());
        assert_eq!(
            TableName::parse("a.b.c").unwrap_err().to_string(),
            "invalid table name \"a.b.c\": expected schema.table"
        );
    }
}
