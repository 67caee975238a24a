-- Old idempotency keys are pruned by the time their batch was applied: an index
-- keeps the prune from reading the whole table.

-- +goose Up
CREATE INDEX ledger_batches_applied_at ON ledger_batches (applied_at);

-- +goose Down
DROP INDEX ledger_batches_applied_at;
