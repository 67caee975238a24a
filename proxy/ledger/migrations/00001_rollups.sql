-- The ledger's first schema: per-minute rollups and the idempotency keys of the
-- batches applied. It is written in the SQL that PostgreSQL and SQLite share.

-- +goose Up
CREATE TABLE ledger_rollups (
    minute         BIGINT NOT NULL, -- the minute's start, Unix seconds (UTC)
    fleet          TEXT   NOT NULL,
    tenant         TEXT   NOT NULL,
    api_key        TEXT   NOT NULL, -- the key's name, never its secret
    user_name      TEXT   NOT NULL,
    team           TEXT   NOT NULL,
    model          TEXT   NOT NULL,
    upstream       TEXT   NOT NULL,
    requests       BIGINT NOT NULL,
    input_tokens   BIGINT NOT NULL,
    output_tokens  BIGINT NOT NULL,
    cached_tokens  BIGINT NOT NULL,
    cost_micro_usd BIGINT NOT NULL,
    PRIMARY KEY (minute, fleet, tenant, api_key, user_name, team, model, upstream)
);

-- A batch's key is inserted in the transaction of its rows: a batch applied before
-- (a retry, a replay) inserts nothing and adds nothing.
CREATE TABLE ledger_batches (
    replica    TEXT    NOT NULL, -- pod name @ start epoch (ms)
    seq        BIGINT  NOT NULL,
    rows       INTEGER NOT NULL,
    applied_at BIGINT  NOT NULL, -- Unix seconds
    PRIMARY KEY (replica, seq)
);

-- +goose Down
DROP TABLE ledger_batches;
DROP TABLE ledger_rollups;
