CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_orphans
    ON samekey_receipts (lease_until) WHERE state = 'PROCESSING';
CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_created
    ON samekey_receipts (created, key);
CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_scope_created
    ON samekey_receipts (scope, created, key)
