//! Several outbox tables with different columns and their own routing: rows of both, interleaved
//! in one transaction, each reach their topics with their own key and id columns, in commit
//! order.

use anyhow::{Context, Result};
use siphon_tests::outbox::{siphon_config, slot_active, OUTBOX_DDL};
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;

const BILLING_DDL: &str = "CREATE SCHEMA billing;
    CREATE TABLE billing.outbox (
        event_id uuid PRIMARY KEY,
        kind text NOT NULL,
        invoice_id text NOT NULL,
        body jsonb)";

fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

fn ids(records: &[ConsumedRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_with_their_own_columns_and_routing_interleaved_in_one_transaction(
) -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client.batch_execute(BILLING_DDL).await?;
    let config = siphon_config(&pg, &broker, "multi", "")
        .replace(
            "tables = [\"public.outbox\"]",
            "tables = [\"public.outbox\", \"billing.outbox\"]",
        )
        .replace(
            "[kafka]\n",
            &format!(
                "[router.tables.\"billing.outbox\"]\n\"table.field.event.id\" = \"event_id\"\n\"table.field.event.key\" = \"invoice_id\"\n\"table.field.event.payload\" = \"body\"\n\"route.by.field\" = \"kind\"\n\"route.topic.replacement\" = \"{}\"\n\n[kafka]\n",
                broker.topic("billing.${routedByValue}")
            ),
        );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "multi").await },
    )
    .await?;
    let mut sql = String::from("BEGIN;");
    for n in 1..=6u32 {
        if n % 2 == 1 {
            sql.push_str(&format!(
                "INSERT INTO outbox VALUES ('{}', 'Order', 'o-1', 'Created', '{{\"n\": {n}}}');",
                id(n)
            ));
        } else {
            sql.push_str(&format!(
                "INSERT INTO billing.outbox VALUES ('{}', 'Invoice', 'inv-7', '{{\"n\": {n}}}');",
                id(n)
            ));
        }
    }
    sql.push_str("DELETE FROM outbox; DELETE FROM billing.outbox; COMMIT;");
    client.batch_execute(&sql).await?;

    let bootstrap = broker.bootstrap();
    let read = |topic: &'static str| {
        let bootstrap = bootstrap.clone();
        let topic = broker.topic(topic);
        async move { read_topic_async(&bootstrap, &topic, Duration::from_secs(10)).await }
    };
    let (orders, invoices) = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let orders = read("outbox.event.Order").await.unwrap_or_default();
            let invoices = read("billing.Invoice").await.unwrap_or_default();
            Ok((orders.len() >= 3 && invoices.len() >= 3).then_some((orders, invoices)))
        },
    )
    .await
    .with_context(|| siphon.log())?;
    assert_eq!(ids(&orders), [id(1), id(3), id(5)]);
    assert_eq!(
        ids(&invoices),
        [id(2), id(4), id(6)],
        "billing's id column, in commit order"
    );
    for invoice in &invoices {
        assert_eq!(
            invoice.key_str().as_deref(),
            Some("\"inv-7\""),
            "billing's key column"
        );
        assert!(invoice
            .value_str()
            .unwrap_or_default()
            .contains("\\\"n\\\""));
    }
    for order in &orders {
        assert_eq!(order.key_str().as_deref(), Some("\"o-1\""));
    }
    Ok(())
}
