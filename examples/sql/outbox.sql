-- The outbox table Siphon reads (the shape Debezium's Outbox Event Router expects).
CREATE TABLE IF NOT EXISTS outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
);
