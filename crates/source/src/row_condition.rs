//! Conditions on outbox rows written by people (`resend --where`, `source.snapshot_filter`, a
//! signal row's `filter`), checked before they reach SQL.
//!
//! A condition is parsed as one SQL expression with a PostgreSQL grammar (sqlparser), and the SQL
//! Siphon sends is printed back from the parsed expression, not pasted from the text. A condition
//! that is not exactly one expression (a second statement after `;`, a parenthesis closed early
//! to add `UNION ...`, a comment hiding the rest) is refused, naming what was found.
//!
//! Who wrote it decides what it may contain ([`ConditionSource`]):
//! - the operator (the configuration, the `resend` command line) may use any expression;
//! - a signal row is written by whoever may insert into the signal table, usually the
//!   application: its condition may only compare the table's columns with constants, using
//!   operators, casts, `IS [NOT] NULL`, `[NOT] IN (...)`, `BETWEEN`, `LIKE` and a short list of
//!   functions without side effects ([`SIGNAL_FUNCTIONS`]). No subquery and no other function
//!   call, so such a row cannot make Siphon's role do anything but read the rows asked for.
//!
//! # Invariants
//! - [`RowCondition::sql`] is one expression, printed from the parse tree: whatever the text
//!   held, the SQL built around it is one statement with this expression where the condition goes.
//! - Transfers run their reads in read-only transactions (see [`crate::snapshot`]), so even
//!   the operator's expressions cannot write.

use sqlparser::ast::{Expr, FunctionArguments, InTarget, ObjectNamePart};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;
use std::fmt;
use std::ops::ControlFlow;

/// Who wrote a condition, which decides what it may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionSource {
    /// The operator: the configuration or the command line.
    Operator,
    /// A row of the signal table.
    Signal,
}

/// The functions a signal row's condition may call: they read their arguments and the clock
/// only.
pub const SIGNAL_FUNCTIONS: &[&str] = &[
    "abs",
    "char_length",
    "coalesce",
    "current_date",
    "current_timestamp",
    "date_trunc",
    "greatest",
    "jsonb_extract_path_text",
    "json_extract_path_text",
    "least",
    "length",
    "localtimestamp",
    "lower",
    "now",
    "nullif",
    "to_date",
    "to_timestamp",
    "trim",
    "upper",
];

/// Nesting deeper than this is refused (the parser recurses once a level).
const MAX_DEPTH: usize = 64;

/// A condition refused before it reached SQL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("the condition {text:?} is not one SQL expression ({reason}): write one boolean expression on the table's columns, e.g. created_at >= '2026-12-01'")]
    NotAnExpression { text: String, reason: String },
    #[error("the condition {text:?} of a signal row uses {what}, which a signal row may not: its condition may only compare the table's columns with constants (operators, casts, IS NULL, IN, BETWEEN, LIKE and the functions {functions}); run `siphon resend --where` for anything else", functions = SIGNAL_FUNCTIONS.join(", "))]
    NotAllowedInSignal { text: String, what: String },
}

/// A condition on a table's rows, checked: one expression, printed back as SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCondition {
    text: String,
    sql: String,
}

impl RowCondition {
    /// Checks `text` as a condition written by `source`.
    ///
    /// # Errors
    /// [`ConditionError::NotAnExpression`] unless `text` is exactly one expression;
    /// [`ConditionError::NotAllowedInSignal`] for a signal's condition that does more than
    /// compare columns with constants.
    pub fn parse(text: &str, source: ConditionSource) -> Result<Self, ConditionError> {
        let not_expression = |reason: String| ConditionError::NotAnExpression {
            text: text.to_owned(),
            reason,
        };
        let dialect = PostgreSqlDialect {};
        let mut parser = Parser::new(&dialect)
            .with_recursion_limit(MAX_DEPTH)
            .try_with_sql(text)
            .map_err(|e| not_expression(e.to_string()))?;
        let expr = parser
            .parse_expr()
            .map_err(|e| not_expression(e.to_string()))?;
        let rest = parser.peek_token();
        if rest.token != Token::EOF {
            return Err(not_expression(format!(
                "it goes on after the expression, at {}",
                rest.token
            )));
        }
        if source == ConditionSource::Signal {
            if let ControlFlow::Break(what) = sqlparser::ast::visit_expressions(&expr, signal_check)
            {
                return Err(ConditionError::NotAllowedInSignal {
                    text: text.to_owned(),
                    what,
                });
            }
        }
        Ok(RowCondition {
            text: text.to_owned(),
            sql: expr.to_string(),
        })
    }

    /// The text as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The SQL of the expression, printed from its parse tree.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

impl fmt::Display for RowCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What of `expr` a signal's condition may not use, if anything: only the forms listed here
/// are allowed, so a form the grammar learns later is refused until it is looked at.
fn signal_check(expr: &Expr) -> ControlFlow<String> {
    match expr {
        Expr::Identifier(_)
        | Expr::CompoundIdentifier(_)
        | Expr::JsonAccess { .. }
        | Expr::IsFalse(_)
        | Expr::IsNotFalse(_)
        | Expr::IsTrue(_)
        | Expr::IsNotTrue(_)
        | Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotUnknown(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..)
        | Expr::Between { .. }
        | Expr::BinaryOp { .. }
        | Expr::Like { .. }
        | Expr::ILike { .. }
        | Expr::UnaryOp { .. }
        | Expr::Cast { .. }
        | Expr::AtTimeZone { .. }
        | Expr::Extract { .. }
        | Expr::Collate { .. }
        | Expr::Nested(_)
        | Expr::Value(_)
        | Expr::TypedString(_)
        | Expr::Case { .. }
        | Expr::Tuple(_)
        | Expr::Interval(_) => ControlFlow::Continue(()),
        Expr::In {
            target: InTarget::List(_),
            ..
        } => ControlFlow::Continue(()),
        Expr::In {
            target: InTarget::Subquery(_),
            ..
        }
        | Expr::Subquery(_)
        | Expr::Exists { .. } => ControlFlow::Break("a subquery".to_owned()),
        Expr::Function(function) => {
            let allowed = match function.name.0.as_slice() {
                [ObjectNamePart::Identifier(name)] => {
                    SIGNAL_FUNCTIONS.contains(&name.value.to_lowercase().as_str())
                }
                _ => false,
            };
            if !allowed {
                return ControlFlow::Break(format!("the function {}", function.name));
            }
            if matches!(function.args, FunctionArguments::Subquery(_)) {
                return ControlFlow::Break("a subquery".to_owned());
            }
            ControlFlow::Continue(())
        }
        other => ControlFlow::Break(format!("the expression {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(text: &str) -> Result<RowCondition, ConditionError> {
        RowCondition::parse(text, ConditionSource::Operator)
    }

    fn signal(text: &str) -> Result<RowCondition, ConditionError> {
        RowCondition::parse(text, ConditionSource::Signal)
    }

    #[test]
    fn one_expression_is_printed_back_from_its_parse_tree() {
        let condition =
            operator("(payload->>'seq')::bigint BETWEEN 101 AND 600").expect("an expression");
        assert_eq!(
            condition.sql(),
            "(payload ->> 'seq')::BIGINT BETWEEN 101 AND 600"
        );
        assert_eq!(
            condition.text(),
            "(payload->>'seq')::bigint BETWEEN 101 AND 600"
        );
        for text in [
            "created_at >= '2026-12-01'",
            "published_at IS NULL",
            "NOT processed",
            "aggregatetype IN ('Order', 'Customer') AND type LIKE 'Order%'",
            "created_at >= now() - interval '1 day'",
            "note = 'it''s'",
            "note = E'a\\'b'",
            "id = $$x$$",
        ] {
            let condition = signal(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            // Printed SQL parses back to the same expression.
            assert_eq!(
                operator(condition.sql()).expect("reparses").sql(),
                condition.sql()
            );
        }
    }

    #[test]
    fn anything_but_one_expression_is_refused() {
        for text in [
            "true); CREATE TABLE injected (x int); SELECT (true",
            "true; DROP TABLE outbox",
            "true) UNION SELECT pg_drop_replication_slot('other') WHERE (true",
            "1 = 1 /* open",
            "x) OR (y",
            "",
            "   ",
            "SELECT 1",
            ")",
        ] {
            let error = operator(text).expect_err(text);
            assert!(
                matches!(error, ConditionError::NotAnExpression { .. }),
                "{text}: {error}"
            );
            assert!(error.to_string().contains("one SQL expression"), "{error}");
        }
        let deep = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(operator(&deep).is_err());
    }

    #[test]
    fn a_comment_inside_is_dropped_from_the_sql() {
        let condition = operator("a = 1 /* note */ AND b = 2").expect("an expression");
        assert_eq!(condition.sql(), "a = 1 AND b = 2");
        let condition = operator("a = 1 -- ; DROP TABLE outbox").expect("an expression");
        assert_eq!(condition.sql(), "a = 1");
    }

    #[test]
    fn a_signal_may_only_compare_columns_with_constants() {
        for (text, what) in [
            (
                "pg_drop_replication_slot('other') IS NOT NULL",
                "pg_drop_replication_slot",
            ),
            ("(SELECT count(*) FROM pg_authid) > 0", "a subquery"),
            ("EXISTS (SELECT 1)", "a subquery"),
            ("id IN (SELECT id FROM other)", "a subquery"),
            ("pg_catalog.now() > created_at", "pg_catalog.now"),
            ("lower(pg_read_file('/etc/passwd')) = ''", "pg_read_file"),
            ("set_config('a', 'b', false) = 'b'", "set_config"),
        ] {
            let error = signal(text).expect_err(text);
            let message = error.to_string();
            assert!(
                matches!(error, ConditionError::NotAllowedInSignal { .. }),
                "{text}: {message}"
            );
            assert!(message.contains(what), "{text}: {message}");
            assert!(message.contains("siphon resend --where"), "{message}");
            // The operator may.
            operator(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        signal("lower(aggregatetype) = 'order' AND created_at < now()").expect("allowed");
    }
}
