-- What answers from the response cache saved: a hit is a request that cost nothing.
-- Rows from before read zero.

-- +goose Up
ALTER TABLE ledger_rollups ADD COLUMN cache_hits BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ledger_rollups ADD COLUMN saved_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ledger_rollups ADD COLUMN saved_output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ledger_rollups ADD COLUMN saved_micro_usd BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE ledger_rollups DROP COLUMN saved_micro_usd;
ALTER TABLE ledger_rollups DROP COLUMN saved_output_tokens;
ALTER TABLE ledger_rollups DROP COLUMN saved_input_tokens;
ALTER TABLE ledger_rollups DROP COLUMN cache_hits;
